/*
 * fuzz_ckpt.c — safetensors checkpoints (ddp_ckpt_open): the 8-byte header length, the JSON
 * header (jansson), dtypes, shapes and offsets; then every tensor's bytes and every metadata
 * pair read back through the public getters, so ASan sees any view that points outside the
 * file.
 *
 * Input: the file.
 */
#include "fuzz.h"

#include <string.h>

#include "ddp/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_mem_file(data, size, path, sizeof path);
    ddp_ckpt *c = NULL;
    ddp_error err = {0};
    if (ddp_ckpt_open(path, &c, &err) == DDP_OK) {
        uint64_t sum = 0;
        for (size_t i = 0; i < ddp_ckpt_count(c); i++) {
            const ddp_ckpt_tensor *t = ddp_ckpt_tensor_at(c, i);
            if (!t || t->ndim < 0 || t->ndim > DDP_CKPT_MAX_DIMS)
                abort();
            uint64_t n = ddp_dtype_size(t->dtype);
            for (int d = 0; d < t->ndim; d++)
                n *= (uint64_t)t->shape[d];
            const unsigned char *p = t->data;
            for (uint64_t k = 0; k < n; k++)
                sum += p[k];
            if (ddp_ckpt_find(c, t->name) != t)
                abort();
            sum += strlen(ddp_dtype_name(t->dtype));
        }
        if (ddp_ckpt_tensor_at(c, ddp_ckpt_count(c)) != NULL)
            abort();
        const char *k, *v;
        for (size_t i = 0; ddp_ckpt_meta_at(c, i, &k, &v); i++) {
            sum += strlen(k) + strlen(v);
            if (ddp_ckpt_meta(c, k) == NULL)
                abort();
        }
        volatile uint64_t keep = sum;
        (void)keep;
        ddp_ckpt_close(c);
    }
    close(fd);
    return 0;
}
