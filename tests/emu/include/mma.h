/* tests/emu/include/mma.h — nvcuda::wmma is cuda_emu.h's (whole tiles, documented semantics). */
#include "cuda_runtime_api.h"
