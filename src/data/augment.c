/*
 * augment.c — random flips and shifts of training images (include/ddp/data.h).
 *
 * Each sample's draw is a hash of (seed, epoch, key): counter-based, so there is no generator
 * state to carry across ranks, threads or a resume. One 64-bit draw per image: bit 0 flips,
 * bits 8… and 32… pick the shifts (the modulo bias of 2·shift+1 ≤ 2^24 outcomes is below 1e-5).
 * The shifted image is out[y][x] = in[y + dy][x' + dx] with x' mirrored when flipping and zero
 * outside: a crop of the zero-padded image at offset (shift + dy, shift + dx).
 */
#include <stdlib.h>
#include <string.h>

#include "ddp/data.h"
#include "util/rng.h"
#include "util/util.h"

ddp_status ddp_augment_images(const ddp_augment *a, float *x, size_t n, int ch, int h, int w,
                              const uint64_t *keys, uint64_t epoch, ddp_error *err)
{
    if (!a || (n && (!x || !keys)) || ch < 1 || h < 1 || w < 1)
        return ddp__err(err, DDP_ERR_INVALID,
                        "augment: options, images, keys and a shape of at least 1×1×1 are "
                        "required");
    if (a->shift < 0 || a->shift >= h || a->shift >= w)
        return ddp__err(err, DDP_ERR_INVALID,
                        "augment: shift %d must be from 0 to %d (less than the image side)",
                        a->shift, (h < w ? h : w) - 1);
    if (!a->hflip && a->shift == 0)
        return DDP_OK;
    size_t plane = (size_t)h * (size_t)w;
    float *tmp = malloc(sizeof(float) * plane);
    if (!tmp)
        return ddp__err(err, DDP_ERR_NOMEM, "augment: out of memory for a %d × %d image", h, w);
    int span = 2 * a->shift + 1;
    for (size_t k = 0; k < n; k++) {
        uint64_t r = ddp__rand_u64(a->seed, epoch, keys[k]);
        bool flip = a->hflip && (r & 1);
        int dy = a->shift ? (int)((r >> 8) % (uint64_t)span) - a->shift : 0;
        int dx = a->shift ? (int)((r >> 32) % (uint64_t)span) - a->shift : 0;
        if (!flip && dx == 0 && dy == 0)
            continue;
        for (int c = 0; c < ch; c++) {
            float *img = x + (k * (size_t)ch + (size_t)c) * plane;
            memcpy(tmp, img, sizeof(float) * plane);
            for (int yy = 0; yy < h; yy++) {
                int sy = yy + dy;
                float *row = img + (size_t)yy * (size_t)w;
                if (sy < 0 || sy >= h) {
                    memset(row, 0, sizeof(float) * (size_t)w);
                    continue;
                }
                const float *src = tmp + (size_t)sy * (size_t)w;
                for (int xx = 0; xx < w; xx++) {
                    int sx = (flip ? w - 1 - xx : xx) + dx;
                    row[xx] = sx >= 0 && sx < w ? src[sx] : 0.0f;
                }
            }
        }
    }
    free(tmp);
    return DDP_OK;
}
