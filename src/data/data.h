/*
 * data.h — what other modules may use of src/data: recording a read-only file mapping, so that
 * ddp_data_mapping_at (ddp/data.h) can name the file when a read of it faults.
 */
#ifndef DDP_DATA_MODULE_H
#define DDP_DATA_MODULE_H

#include <stdbool.h>
#include <stddef.h>

#include "ddp/data.h"

/* The longest path kept per mapping (with its NUL); a longer one keeps its last bytes. */
#define DDP__MAPPING_PATH_MAX 4096

/* Records the read-only mapping [base, base + len) of path (copied) as kind, for
 * ddp_data_mapping_at. false, and nothing recorded, when base is NULL, len 0 or the table already
 * holds DDP_DATA_MAPPINGS_MAX mappings: the mapping is then simply not named. Thread-safe and
 * lock-free; call it after mmap succeeded. */
bool ddp__mapping_add(const void *base, size_t len, const char *path, ddp_mapping_kind kind);

/* Forgets the mapping recorded at base: call it before munmap (a later mapping may reuse the
 * address). A base not recorded (NULL, or a mapping the full table refused) is a no-op.
 * Thread-safe and lock-free. */
void ddp__mapping_remove(const void *base);

#endif /* DDP_DATA_MODULE_H */
