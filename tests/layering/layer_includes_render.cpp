// render is above layer.
#include "qkv/render.h"
