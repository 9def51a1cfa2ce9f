// io sits beside kernels, not above: a private kernels header is not on io's include path.
#include "kernels/dispatch.h"
