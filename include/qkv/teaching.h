// The teaching kit built on the engine: word embeddings, the learnable layer and positional
// encodings, explanations and their HTML pictures, and training (tasks, optimizers, checkpoints).
// One of the three groups of qkv/qkv.h (docs/cpp.md).
#pragma once

#include "qkv/checkpoint.h"
#include "qkv/embeddings.h"
#include "qkv/explain.h"
#include "qkv/layer.h"
#include "qkv/lookup.h"
#include "qkv/masked_word.h"
#include "qkv/optim.h"
#include "qkv/positions.h"
#include "qkv/render.h"
#include "qkv/train_progress.h"
