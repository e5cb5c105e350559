/*
 * hostdev.h — DDP_HOSTDEV marks a static inline helper that both C (.c) and CUDA (.cu, device
 * code included) may call: under nvcc it is __host__ __device__, elsewhere nothing. Headers that
 * use it (util/half.h, util/rng.h) hold only arithmetic: no libc beyond memcpy, no globals.
 */
#ifndef DDP_HOSTDEV_H
#define DDP_HOSTDEV_H

#ifdef __CUDACC__
#define DDP_HOSTDEV __host__ __device__
#else
#define DDP_HOSTDEV
#endif

#endif /* DDP_HOSTDEV_H */
