/* tests/emu/include/cuda_fp16.h — __half is cuda_emu.h's (its 16 bits). */
#include "cuda_runtime_api.h"
