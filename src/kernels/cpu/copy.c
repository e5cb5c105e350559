/*
 * kernels/cpu/copy.c — copies whose kind of store is chosen by the caller, not by the C library.
 *
 * glibc's memcpy switches to non-temporal (streaming) stores above a threshold it derives from
 * the cache sizes CPUID reports (x86_non_temporal_threshold: 3/4 of the shared cache per
 * thread). That figure differs wildly from machine to machine — 240 MiB on this project's
 * EPYC VM, whose CPUID claims a 320 MiB L3, a few MiB on a typical Xeon — so the same
 * allreduce streams its result out of the caches on one machine and keeps it there on another.
 * The shm backend chooses per machine and size instead (src/group/shm/choice.c), and these two
 * copies are what it chooses between:
 *   ddp__copy_cached  ordinary stores, never streaming: the destination stays in cache for
 *                     whoever reads it next (a peer, or the caller's next step);
 *   ddp__copy_stream  non-temporal stores for whole aligned 64-byte lines, then a store fence:
 *                     the destination goes to memory without first being read into the cache
 *                     (no read-for-ownership), which is what a copy larger than the caches wants.
 * Off x86-64 both are memcpy. Neither allows overlap. Not here: threads (callers split work).
 */
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

void ddp__copy_cached(void *dst, const void *src, size_t bytes)
{
    char *d = dst;
    const char *s = src;
    /* 64 bytes per step through four 16-byte registers: SSE2 is the x86-64 baseline, and a
     * memory-bound copy gains nothing from wider ones. Written with intrinsics so that GCC cannot
     * turn the loop back into a call to memcpy. */
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_storeu_si128((__m128i *)(d + i), a);
        _mm_storeu_si128((__m128i *)(d + i + 16), b);
        _mm_storeu_si128((__m128i *)(d + i + 32), c);
        _mm_storeu_si128((__m128i *)(d + i + 48), e);
    }
    if (i < bytes)
        memcpy(d + i, s + i, bytes - i);
}

void ddp__copy_stream(void *dst, const void *src, size_t bytes)
{
    char *d = dst;
    const char *s = src;
    /* Ordinary stores up to dst's first line boundary and after its last one: a partial line
     * streamed would be written twice over the bus. */
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    if (i < bytes)
        memcpy(d + i, s + i, bytes - i);
    /* Streaming stores are weakly ordered: fence them so that a release store after this call
     * (the barrier) publishes them like ordinary ones. */
    _mm_sfence();
}
#else
void ddp__copy_cached(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

void ddp__copy_stream(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}
#endif
