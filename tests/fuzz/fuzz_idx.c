/*
 * fuzz_idx.c — IDX image and label files (ddp_dataset_open_idx), then every sample read back.
 *
 * Input: u16 little-endian n, then n bytes of the image file, then the label file (the rest).
 * The files are plain (not gzip: decompression is zlib's, and it writes a per-host cache).
 */
#include "fuzz.h"

#include <string.h>

#include "ddp/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (n > size)
        n = size;
    char pi[64], pl[64];
    int fi = fuzz_mem_file(data, n, pi, sizeof pi);
    int fl = fuzz_mem_file(data + n, size - n, pl, sizeof pl);
    ddp_dataset *ds = NULL;
    ddp_error err = {0};
    if (ddp_dataset_open_idx(pi, pl, NULL, &ds, &err) == DDP_OK) {
        size_t len = ddp_dataset_len(ds), xe = ddp_dataset_x_elems(ds);
        size_t ye = ddp_dataset_y_elems(ds);
        if (!ddp_dataset_x_is_float(ds) || ye != 1 || ddp_dataset_num_tokens(ds) != 0)
            abort();
        /* Room for 4 samples. An empty file may claim any image size (up to 65536²), and then
         * nothing is read: one float will do. */
        float *x = malloc(len ? xe * 4 * sizeof *x : sizeof *x);
        int32_t y[4];
        if (!x)
            abort();
        int classes = ddp_dataset_classes(ds);
        for (size_t i = 0; i < len; i++) {
            if (ddp_dataset_get(ds, i, x, y) != DDP_OK || y[0] < 0 || y[0] >= classes)
                abort();
        }
        /* Four at a time, the last index past the end: refused, with its position. */
        uint64_t idx[4] = {0, len / 2, len ? len - 1 : 0, len};
        size_t bad = 99;
        if (ddp_dataset_get_many(ds, idx, 4, x, y, &bad) != DDP_ERR_INVALID || bad != (len ? 3 : 0))
            abort();
        if (ddp_dataset_get(ds, len, x, y) != DDP_ERR_INVALID)
            abort();
        free(x);
        ddp_dataset_close(ds);
    }
    close(fi);
    close(fl);
    return 0;
}
