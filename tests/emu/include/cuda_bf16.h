/* tests/emu/include/cuda_bf16.h — __nv_bfloat16 is cuda_emu.h's (its 16 bits). */
#include "cuda_runtime_api.h"
