// Every tensor file format qkv reads and writes, for callers that want them all.
#pragma once

#include "qkv/atomic_file.h"
#include "qkv/checkpoint.h"
#include "qkv/npy.h"
#include "qkv/output_file.h"
#include "qkv/safetensors.h"
