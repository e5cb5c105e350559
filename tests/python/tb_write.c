/*
 * tb_write.c — writes TensorBoard event files through ddp/tb.h for tests/python/test_tb.py, and
 * prints what it wrote, one line per scalar:
 *   <file path> TAB <tag> TAB <step> TAB <float32 bits, hex> TAB <wall_time, C99 hex float>
 * Usage: tb_write DIR. Two writers: "main" (default options: buffered, written at close) with
 * the trainer's tags, and one with suffix ".extra" writing every record at once, with edge
 * cases (special values, extreme steps, a long and a non-ASCII tag).
 * tb_write DIR resumed: a run and its resumption with purge_step (see resumed_run).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "tb_write: %s: %s\n", what, msg);
    exit(1);
}

static void put(ddp_tb *tb, const char *tag, int64_t step, double v, double wall)
{
    if (ddp_tb_scalar(tb, tag, step, v, wall) != DDP_OK)
        die(tag, ddp_tb_last_error(tb));
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    printf("%s\t%s\t%lld\t%08x\t%a\n", ddp_tb_path(tb), tag, (long long)step, bits, wall);
}

/* A run that logs "p/x" at steps 1..10 and dies; resumed from its checkpoint at step 6 it logs
 * steps 6..8 again (other values) into a second file opened with purge_step 6. */
static int resumed_run(const char *dir)
{
    ddp_error err = {0};
    ddp_tb *tb = NULL;
    if (ddp_tb_open(dir, NULL, &tb, &err) != DDP_OK)
        die("open", err.msg);
    for (int s = 1; s <= 10; s++)
        put(tb, "p/x", s, s, 1.6e9 + s);
    ddp_tb_close(tb);
    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.purge_step = 6;
    if (ddp_tb_open(dir, &o, &tb, &err) != DDP_OK)
        die("open", err.msg);
    for (int s = 6; s <= 8; s++)
        put(tb, "p/x", s, 100 + s, 1.6e9 + 100 + s);
    ddp_tb_close(tb);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[2], "resumed") == 0)
        return resumed_run(argv[1]);
    if (argc != 2) {
        fprintf(stderr, "usage: tb_write DIR [resumed]\n");
        return 2;
    }
    ddp_error err = {0};
    ddp_tb *tb = NULL;
    if (ddp_tb_open(argv[1], NULL, &tb, &err) != DDP_OK)
        die("open", err.msg);
    /* What a trainer logs; step s of tag k holds a value that names both. */
    static const char *const tags[] = {"train/loss", "train/lr",        "train/tokens_per_s",
                                       "train/mfu",  "train/grad_norm", "train/loss_scale",
                                       "val/loss",   "val/accuracy"};
    for (int64_t s = 1; s <= 200; s++)
        for (int k = 0; k < 8; k++)
            if (k < 6 || s % 50 == 0)
                put(tb, tags[k], s, (k + 1) * 1000.0 + (double)s / 7.0,
                    1.7e9 + (double)s * 0.125 + k * 1e-3);
    ddp_tb_close(tb);

    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.suffix = ".extra";
    o.flush_ms = 0;
    if (ddp_tb_open(argv[1], &o, &tb, &err) != DDP_OK)
        die("open", err.msg);
    static const double special[] = {0.0,    -0.0,  NAN, INFINITY, -INFINITY, 1e-45,
                                     3.4e38, 1e300, 0.1, -2.5,     1.0 / 3.0, 16777217.0};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        put(tb, "edge/value", (int64_t)i, special[i], 1.5e9 + (double)i);
    static const int64_t steps[] = {0, -1, 127, 128, INT64_MAX, INT64_MIN, 1LL << 40};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        put(tb, "edge/step", steps[i], (double)i, 1.5e9 + 100 + (double)i);
    char longtag[DDP_TB_MAX_TAG + 1];
    memset(longtag, 'L', DDP_TB_MAX_TAG);
    longtag[DDP_TB_MAX_TAG] = '\0';
    put(tb, longtag, 1, 1.0, 1.5e9 + 200);
    put(tb, "ünïcödé/✓ 损失", 2, 2.0, 1.5e9 + 201);
    ddp_tb_close(tb);
    return 0;
}
