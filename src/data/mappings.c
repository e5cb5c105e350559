/*
 * mappings.c — the library's read-only file mappings (a dataset's files, a checkpoint), in a table
 * a signal handler can read: when a mapped file shrinks under a running job (truncated, or a
 * script rewriting it in place), the first read past its new end raises SIGBUS, and the
 * handler (ddptrain's) asks ddp_data_mapping_at which file that address belongs to, so that the
 * rank's death names the file instead of saying "bus error" alone.
 *
 * The table is process-wide static state, against the rule that everything hangs off a handle:
 * a signal handler is given only the faulting address, so there is no handle to reach it by. It
 * is a fixed array (no allocation, so no failure and nothing to free), and each slot is a
 * sequence lock over atomics: writers (map and unmap, on any thread) claim a slot with a
 * compare-and-swap and make its sequence odd while they fill or clear it; the reader takes a slot
 * only when its sequence is even and the same before and after it read the slot's range. The
 * reader neither blocks nor allocates, so it is async-signal-safe. A mapping made while the
 * table is full is not recorded: it reads as usual, and a fault in it is not named.
 *
 * It does not catch any signal itself, or decide what a fault means: that is the program's.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "data/data.h"
#include "ddp/data.h"

#if ATOMIC_POINTER_LOCK_FREE != 2 || ATOMIC_INT_LOCK_FREE != 2 || ATOMIC_LONG_LOCK_FREE != 2
#error "the mapping table needs lock-free atomics to be read from a signal handler"
#endif

typedef struct mapping_slot {
    atomic_int used;       /* 0: free; 1: a writer owns it (claimed by compare-and-swap) */
    atomic_uint seq;       /* odd while its owner writes the fields below */
    atomic_uintptr_t base; /* the mapping's first byte; 0: no mapping */
    atomic_size_t len;     /* bytes */
    atomic_int kind;       /* ddp_mapping_kind */
    char path[DDP__MAPPING_PATH_MAX]; /* written only while seq is odd */
} mapping_slot;

static mapping_slot table[DDP_DATA_MAPPINGS_MAX];

bool ddp__mapping_add(const void *base, size_t len, const char *path, ddp_mapping_kind kind)
{
    if (!base || !len || !path)
        return false;
    for (size_t i = 0; i < DDP_DATA_MAPPINGS_MAX; i++) {
        mapping_slot *s = &table[i];
        int free_ = 0;
        if (!atomic_compare_exchange_strong(&s->used, &free_, 1))
            continue;
        atomic_fetch_add_explicit(&s->seq, 1, memory_order_relaxed); /* odd: being written */
        atomic_thread_fence(memory_order_release); /* a reader sees odd before any new field */
        size_t n = strlen(path);
        if (n >= sizeof s->path) /* the end of a very long path is kept: the file's name */
            path += n - (sizeof s->path - 1), n = sizeof s->path - 1;
        memcpy(s->path, path, n + 1);
        atomic_store_explicit(&s->len, len, memory_order_relaxed);
        atomic_store_explicit(&s->kind, (int)kind, memory_order_relaxed);
        atomic_store_explicit(&s->base, (uintptr_t)base, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->seq, 1, memory_order_release); /* even: published */
        return true;
    }
    return false;
}

void ddp__mapping_remove(const void *base)
{
    if (!base)
        return;
    for (size_t i = 0; i < DDP_DATA_MAPPINGS_MAX; i++) {
        mapping_slot *s = &table[i];
        /* Only the slot's owner stores base, and two live mappings never share an address:
         * the one slot with this base is the caller's. */
        if (atomic_load_explicit(&s->used, memory_order_acquire) != 1 ||
            atomic_load_explicit(&s->base, memory_order_relaxed) != (uintptr_t)base)
            continue;
        atomic_fetch_add_explicit(&s->seq, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_release);
        atomic_store_explicit(&s->base, 0, memory_order_relaxed);
        atomic_store_explicit(&s->len, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->seq, 1, memory_order_release);
        atomic_store_explicit(&s->used, 0, memory_order_release); /* free for the next */
        return;
    }
}

bool ddp_data_mapping_at(const void *addr, ddp_mapping_info *out)
{
    uintptr_t a = (uintptr_t)addr;
    if (!a || !out)
        return false;
    for (size_t i = 0; i < DDP_DATA_MAPPINGS_MAX; i++) {
        mapping_slot *s = &table[i];
        unsigned seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (seq & 1)
            continue; /* being written: not the mapping of an address being read */
        uintptr_t base = atomic_load_explicit(&s->base, memory_order_relaxed);
        size_t len = atomic_load_explicit(&s->len, memory_order_relaxed);
        int kind = atomic_load_explicit(&s->kind, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->seq, memory_order_relaxed) != seq)
            continue; /* changed while read: a slot reused, not the one holding addr */
        if (!base || a < base || a - base >= len)
            continue;
        out->path = s->path;
        out->offset = a - base;
        out->length = len;
        out->kind = (ddp_mapping_kind)kind;
        return true;
    }
    return false;
}
