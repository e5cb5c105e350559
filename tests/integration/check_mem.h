/*
 * check_mem.h — memory the reducer check programs (reducercheck.c, joincheck.c) give the reducer:
 * host memory, or device memory on a GPU group, and copies to and from it through the group.
 * The including file defines `static ddp_group *G;` (the group), `static bool on_gpu;` (a GPU
 * group) and CHECK_PROG (its name, for messages) before including it. Failures end the program:
 * a test has nothing to go on without its memory.
 */
#ifndef DDP_TESTS_CHECK_MEM_H
#define DDP_TESTS_CHECK_MEM_H

#include <stdio.h>
#include <stdlib.h>

#include "ddp/ddp.h"

static void *dalloc(size_t bytes)
{
    void *p = on_gpu ? ddp_group_alloc(G, bytes) : calloc(1, bytes);
    if (!p) {
        fprintf(stderr, "%s: out of %s memory\n", CHECK_PROG, on_gpu ? "GPU" : "host");
        exit(1);
    }
    return p;
}

static void dfree(void *p)
{
    if (on_gpu)
        ddp_group_free(G, p);
    else
        free(p);
}

/* Copies between host memory and the reducer's memory (either direction). */
static void xfer(void *dst, const void *src, size_t bytes)
{
    if (ddp_group_memcpy(G, dst, src, bytes) != DDP_OK) {
        fprintf(stderr, "%s: ddp_group_memcpy: %s\n", CHECK_PROG, ddp_group_last_error(G));
        exit(1);
    }
}

#endif /* DDP_TESTS_CHECK_MEM_H */
