// The control: layer may use every layer below it, public and private headers alike, so the
// failures of the other cases come from the layering and nothing else.
#include "core/half.h"
#include "io/mapped_file.h"
#include "kernels/dispatch.h"
#include "qkv/attention.h"
#include "qkv/npy.h"

int layering_control() { return static_cast<int>(qkv::kernels::resolve_simd(qkv::Simd::scalar)); }
