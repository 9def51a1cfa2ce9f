// Everything qkv offers, for callers who prefer one include. Each header below is one concept
// (ARCHITECTURE.md lists them by layer); including only the ones used compiles faster.
#pragma once

#include "qkv/attention.h"
#include "qkv/attention_options.h"
#include "qkv/backward.h"
#include "qkv/embeddings.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "qkv/lookup.h"
#include "qkv/mask.h"
#include "qkv/masked_word.h"
#include "qkv/optim.h"
#include "qkv/positions.h"
#include "qkv/reference.h"
#include "qkv/render.h"
#include "qkv/tensor.h"
#include "qkv/tensor_map.h"
#include "qkv/train_progress.h"
#include "qkv/weights.h"
