/*
 * fuzz_tokens.c — token files (ddp_dataset_open_tokens): nanoGPT's raw uint16 and llm.c's
 * shards with a 256-int header, then samples and random windows read back.
 *
 * Input: one byte for the sequence length (1 + byte % 64), then the file.
 */
#include "fuzz.h"

#include <string.h>

#include "ddp/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t T = 1 + data[0] % 64;
    char path[64];
    int fd = fuzz_mem_file(data + 1, size - 1, path, sizeof path);
    ddp_dataset *ds = NULL;
    ddp_error err = {0};
    if (ddp_dataset_open_tokens(path, T, &ds, &err) == DDP_OK) {
        size_t len = ddp_dataset_len(ds), ntok = ddp_dataset_num_tokens(ds);
        if (ddp_dataset_x_is_float(ds) || ddp_dataset_x_elems(ds) != T ||
            ddp_dataset_y_elems(ds) != T || ntok < T + 1 || len != (ntok - 1) / T)
            abort();
        int32_t *x = malloc(8 * T * sizeof *x), *y = malloc(8 * T * sizeof *y);
        if (!x || !y)
            abort();
        int vocab = ddp_dataset_classes(ds);
        for (size_t i = 0; i < len; i++) {
            if (ddp_dataset_get(ds, i, x, y) != DDP_OK)
                abort();
            for (size_t k = 0; k < T; k++)
                if (x[k] < 0 || x[k] >= vocab || y[k] < 0 || y[k] >= vocab)
                    abort();
        }
        /* nanoGPT's random windows, the last possible one, and one past it. */
        uint64_t starts[8];
        ddp_lm_window_starts(data[0], 7, 3, 8, ntok, T, starts);
        if (ddp_dataset_get_windows(ds, starts, 8, x, y, &err) != DDP_OK)
            abort();
        uint64_t edge[2] = {ntok - T - 1, ntok - T};
        if (ddp_dataset_get_windows(ds, edge, 1, x, y, &err) != DDP_OK ||
            ddp_dataset_get_windows(ds, edge, 2, x, y, &err) != DDP_ERR_INVALID)
            abort();
        uint64_t idx[2] = {len - 1, len};
        size_t bad = 0;
        if (ddp_dataset_get_many(ds, idx, 2, x, y, &bad) != DDP_ERR_INVALID || bad != 1)
            abort();
        free(x);
        free(y);
        ddp_dataset_close(ds);
    }
    close(fd);
    return 0;
}
