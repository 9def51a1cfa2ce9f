// Everything qkv offers, for callers who prefer one include: the engine, the teaching kit and the
// platform helpers (docs/cpp.md lists each group's headers). Each header is one concept; including
// only the ones used compiles faster. Ring attention over MPI is apart: qkv/distributed.h.
#pragma once

#include "qkv/engine.h"
#include "qkv/platform.h"
#include "qkv/teaching.h"
