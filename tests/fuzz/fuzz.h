/*
 * fuzz.h — what the libFuzzer harnesses in tests/fuzz share: the entry point every harness
 * defines, and a way to hand fuzz bytes to library calls that take a file path.
 *
 * Each harness is built twice: with clang and -fsanitize=fuzzer,address,undefined as a fuzzer
 * (cmake -DDDP_FUZZ=ON, scripts/fuzz.sh), and in every ordinary build with replay.c as its main,
 * which runs the seed corpus (tests/fuzz/corpus/<target>/, crash regressions included) as a CTest
 * test — under make asan too.
 */
#ifndef DDP_FUZZ_H
#define DDP_FUZZ_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Puts n bytes into an anonymous in-memory file (memfd: no disk, nothing left behind) and
 * writes a path that opens it, "/proc/self/fd/N", into path (cap bytes). Returns the fd, which
 * the caller closes; a harness cannot go on without it, so failure exits. */
static inline int fuzz_mem_file(const void *data, size_t n, char *path, size_t cap)
{
    int fd = memfd_create("ddp-fuzz", MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        exit(2);
    }
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) {
            perror("write to a memfd");
            exit(2);
        }
        p += k;
        n -= (size_t)k;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif /* DDP_FUZZ_H */
