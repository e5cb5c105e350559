/* tests/emu/include/cuda_runtime.h — the emulation's runtime (cuda_runtime_api.h). */
#include "cuda_runtime_api.h"
