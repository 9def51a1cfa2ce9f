// Platform helpers the engine and its tools rely on, usable alone: memory limits, files written
// atomically, interruption of long calls, the machine's measured ceilings, name suggestions and
// UTF-8 validity. One of the three groups of qkv/qkv.h (docs/cpp.md).
#pragma once

#include "qkv/address_space.h"
#include "qkv/atomic_file.h"
#include "qkv/interrupt.h"
#include "qkv/machine.h"
#include "qkv/machine_info.h"
#include "qkv/out_of_memory.h"
#include "qkv/output_file.h"
#include "qkv/suggest.h"
#include "qkv/utf8.h"
