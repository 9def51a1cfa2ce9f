// io is below attention: the public attention header is not in io's include view.
#include "qkv/attention.h"
