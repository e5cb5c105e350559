/*
 * ckpt_tool — the C side of test_ckpt_torch.py.
 *   ckpt_tool write PATH   saves the reference tensors and metadata below (test_ckpt_torch.py
 *                          builds the same ones in torch)
 *   ckpt_tool dump PATH    opens PATH and prints what it holds, exactly:
 *                            T <name hex> <dtype> <ndim> <dims…> <values…>   one line a tensor
 *                          (dtype: ddp_dtype_name's, "float32" … "uint8")
 *                            M <key hex> <value hex>                       one line a pair
 *                          floats (bfloat16 and float16 widened) as C99 hex floats, integers in
 * decimal. Exit status 1 with the library's message on stderr when a call fails.
 */
#include <stdio.h>
#include <string.h>

#include "ddp/ckpt.h"

static void hex(const char *s)
{
    if (!*s)
        printf("-"); /* keep the field count fixed for the empty string */
    for (; *s; s++)
        printf("%02x", (unsigned char)*s);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double f16_to_f64(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = m * 0x1p-24; /* subnormal */
    else if (e == 31)
        v = m ? __builtin_nan("") : __builtin_inf();
    else
        v = (1024 + m) * 0x1p-10 * (e >= 15 ? (double)(1u << (e - 15)) : 1.0 / (1u << (15 - e)));
    return sign ? -v : v;
}

static int dump(const char *path)
{
    ddp_ckpt *c;
    ddp_error err = {0};
    if (ddp_ckpt_open(path, &c, &err) != DDP_OK) {
        fprintf(stderr, "ckpt_tool: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < ddp_ckpt_count(c); i++) {
        const ddp_ckpt_tensor *t = ddp_ckpt_tensor_at(c, i);
        size_t n = 1;
        printf("T ");
        hex(t->name);
        printf(" %s %d", ddp_dtype_name(t->dtype), t->ndim);
        for (int d = 0; d < t->ndim; d++) {
            printf(" %lld", (long long)t->shape[d]);
            n *= (size_t)t->shape[d];
        }
        /* The data of a foreign file need not be aligned: copy each element out. */
        const unsigned char *p = t->data;
        size_t es = ddp_dtype_size(t->dtype);
        for (size_t k = 0; k < n; k++, p += es) {
            union {
                float f32;
                double f64;
                uint16_t u16;
                int32_t i32;
                int64_t i64;
                uint8_t u8;
            } v;
            memcpy(&v, p, es);
            switch (t->dtype) {
            case DDP_FLOAT32: printf(" %a", (double)v.f32); break;
            case DDP_FLOAT64: printf(" %a", v.f64); break;
            case DDP_BFLOAT16: printf(" %a", (double)bf16_to_f32(v.u16)); break;
            case DDP_FLOAT16: printf(" %a", f16_to_f64(v.u16)); break;
            case DDP_INT32: printf(" %d", (int)v.i32); break;
            case DDP_INT64: printf(" %lld", (long long)v.i64); break;
            case DDP_UINT8: printf(" %u", (unsigned)v.u8); break;
            default: break;
            }
        }
        printf("\n");
    }
    for (size_t i = 0; i < ddp_ckpt_meta_count(c); i++) {
        const char *k, *v;
        ddp_ckpt_meta_at(c, i, &k, &v);
        printf("M ");
        hex(k);
        printf(" ");
        hex(v);
        printf("\n");
    }
    ddp_ckpt_close(c);
    return 0;
}

static int write_reference(const char *path)
{
    float w[12], b[4];
    uint16_t emb[6], half[3] = {0x3c00, 0xc000, 0x3800}; /* 1, -2, 0.5 */
    int64_t pos[5];
    int32_t ids[4];
    uint8_t mask[5];
    double scale = 0.1;
    for (int k = 0; k < 12; k++)
        w[k] = (float)(k - 5) * 0.375f;
    for (int k = 0; k < 4; k++)
        b[k] = 1.0f / (float)(k + 1);
    for (int k = 0; k < 6; k++) {
        float f = (float)(k - 2) * 1.5f;
        uint32_t u;
        memcpy(&u, &f, 4);
        emb[k] = (uint16_t)(u >> 16); /* exact: these values need few mantissa bits */
    }
    for (int k = 0; k < 5; k++)
        pos[k] = ((int64_t)1 << 40) * k - 7;
    for (int k = 0; k < 4; k++)
        ids[k] = -100000 * k;
    for (int k = 0; k < 5; k++)
        mask[k] = (uint8_t)(50 * k);
    const ddp_ckpt_tensor t[] = {
        {"fc1.weight", DDP_FLOAT32, 2, {3, 4}, w}, {"fc1.bias", DDP_FLOAT32, 1, {4}, b},
        {"emb", DDP_BFLOAT16, 2, {2, 3}, emb},     {"pos", DDP_INT64, 1, {5}, pos},
        {"scale", DDP_FLOAT64, 0, {0}, &scale},    {"empty", DDP_FLOAT32, 2, {0, 3}, NULL},
        {"ids", DDP_INT32, 1, {4}, ids},           {"half", DDP_FLOAT16, 1, {3}, half},
        {"mask", DDP_UINT8, 1, {5}, mask},
    };
    const char *keys[] = {"step", "epoch", "config", "note"};
    const char *vals[] = {"1234", "3", "{\"lr\": 0.001, \"model\": \"mlp\"}", "ünïcode ✓"};
    ddp_error err = {0};
    if (ddp_ckpt_save(path, t, sizeof t / sizeof t[0], keys, vals, 4, &err) != DDP_OK) {
        fprintf(stderr, "ckpt_tool: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "write") == 0)
        return write_reference(argv[2]);
    if (argc == 3 && strcmp(argv[1], "dump") == 0)
        return dump(argv[2]);
    fprintf(stderr, "usage: ckpt_tool write|dump PATH\n");
    return 2;
}
