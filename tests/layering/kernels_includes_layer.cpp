// kernels are below the layer.
#include "qkv/layer.h"
