// The attention engine: tensors, options and masks, forward, backward, exact weights, varlen,
// the paged KV cache and decode, rotary embeddings, the float64 oracles and the tensor files.
// One of the three groups of qkv/qkv.h (docs/cpp.md); ring attention over MPI is apart
// (qkv/distributed.h, in its own library).
#pragma once

#include "qkv/attention.h"
#include "qkv/attention_options.h"
#include "qkv/backward.h"
#include "qkv/decode.h"
#include "qkv/dropout.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/kv_dtype.h"
#include "qkv/mask.h"
#include "qkv/options_parse.h"
#include "qkv/reference.h"
#include "qkv/rotary.h"
#include "qkv/tensor.h"
#include "qkv/tensor_map.h"
#include "qkv/varlen.h"
#include "qkv/weights.h"
