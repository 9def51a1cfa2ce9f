#include "qkv/kv_dtype.h"

namespace qkv {

const char* kv_dtype_name(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::f32:
      return "f32";
    case KVDtype::bf16:
      return "bf16";
    case KVDtype::f16:
      return "f16";
    case KVDtype::i8:
      return "i8";
  }
  return "unknown";
}

int64_t kv_dtype_bytes(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::f32:
      return 4;
    case KVDtype::bf16:
    case KVDtype::f16:
      return 2;
    case KVDtype::i8:
      return 1;
  }
  return 0;
}

}  // namespace qkv
