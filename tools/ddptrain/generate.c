/*
 * generate.c — text from a trained language model, as nanoGPT's sample.py makes it: the context
 * cropped to the last block_size tokens, one forward, the last position's logits divided by the
 * temperature, all but the top_k set aside, one token drawn from the softmax; repeated
 * max_new_tokens times, each token written out as soon as it is drawn. Rank 0 alone generates:
 * one sequence has nothing to share. Draws come from an MT19937 seeded with `seed`, so a seed
 * gives the same text every time. It recomputes the whole window for each token (no key/value
 * cache): simple, and quick enough for the small models ddptrain trains on a CPU.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddptrain.h"

/* A uniform double in [0, 1) with 53 random bits. */
static double uniform(ddp_mt19937 *g)
{
    uint32_t a = ddp_mt19937_next(g) >> 5, b = ddp_mt19937_next(g) >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The next token from logits (V,): argmax at temperature 0, else a draw from
 * softmax(logits / temperature) over the top_k largest (0: all). scratch: (V,) floats. */
static int32_t pick(const float *logits, size_t V, double temperature, size_t top_k, float *scratch,
                    ddp_mt19937 *g)
{
    size_t best = 0;
    for (size_t j = 1; j < V; j++)
        if (logits[j] > logits[best])
            best = j;
    if (temperature <= 0)
        return (int32_t)best;
    /* nanoGPT keeps the logits ≥ the k-th largest (ties with it included) */
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        memcpy(scratch, logits, V * sizeof *scratch);
        qsort(scratch, V, sizeof *scratch, cmp_desc);
        cut = scratch[top_k - 1];
    }
    double top = logits[best] / temperature, sum = 0;
    if (!isfinite(top)) /* a temperature so small (1e-320) that this overflows: argmax, its limit */
        return (int32_t)best;
    for (size_t j = 0; j < V; j++) {
        double p = logits[j] >= cut ? exp(logits[j] / temperature - top) : 0;
        scratch[j] = (float)p;
        sum += p;
    }
    double u = uniform(g) * sum, acc = 0;
    for (size_t j = 0; j < V; j++) {
        acc += scratch[j];
        if (scratch[j] > 0 && u < acc)
            return (int32_t)j;
    }
    return (int32_t)best; /* u landed on the rounding at the end */
}

/* Writes token v to out, at once, and to log (may be NULL): its byte for a byte vocabulary,
 * else its id after a space. 0, or errno when out could not take it (a full disk, a closed
 * pipe): the text would be lost, so generation stops there. */
static int emit(FILE *out, FILE *log, int vocab, int32_t v, bool first)
{
    for (FILE *f = out; f; f = f == out ? log : NULL) {
        if (vocab == 256)
            fputc(v, f);
        else
            fprintf(f, first ? "%d" : " %d", v);
    }
    errno = 0;
    if (fflush(out) != 0 || ferror(out))
        return errno ? errno : EIO;
    return 0;
}

/* Says that the text could not be written (errno e), rank 0's line. */
static int lost(int e)
{
    fprintf(stderr,
            "ddptrain: writing the generated text failed: %s (a full disk or a closed pipe); "
            "generation stopped\n",
            strerror(e));
    return 1;
}

/* The prompt's tokens: prompt_tokens, else the prompt's bytes (a byte vocabulary only), else a
 * newline (bytes) or token 0, into a new array (*ctx, *n tokens). The
 * caller frees it. Returns 0, or 1 after printing the message. */
static int prompt_of(trainer *t, int32_t **ctx, size_t *n)
{
    size_t ni;
    const int64_t *ids = ddp_config_ints(t->cfg, "prompt_tokens", &ni);
    const char *text = ddp_config_str(t->cfg, "prompt");
    if (!ni && *text && t->vocab != 256) {
        fprintf(stderr,
                "ddptrain: --prompt is text, and this model's vocabulary (%d) is not bytes; give "
                "the prompt's token ids: --prompt_tokens 1,2,3\n",
                t->vocab);
        return 1;
    }
    *n = ni ? ni : *text ? strlen(text) : 1;
    if (!(*ctx = malloc(*n * sizeof **ctx))) {
        fprintf(stderr, "ddptrain: out of memory for a prompt of %zu tokens\n", *n);
        return 1;
    }
    for (size_t i = 0; i < ni; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab) {
            fprintf(stderr,
                    "ddptrain: prompt_tokens: %lld is not a token id of this model (0 … %d)\n",
                    (long long)ids[i], t->vocab - 1);
            return 1;
        }
        (*ctx)[i] = (int32_t)ids[i];
    }
    if (!ni && *text)
        for (size_t i = 0; i < *n; i++)
            (*ctx)[i] = (unsigned char)text[i];
    else if (!ni)
        (*ctx)[0] = t->vocab == 256 ? '\n' : 0;
    return 0;
}

static int beat(trainer *t, bool final, int64_t flag);

static int generate_rank0(trainer *t, FILE *out, bool to_log)
{
    size_t max_new = (size_t)ddp_config_int(t->cfg, "max_new_tokens");
    size_t top_k = (size_t)ddp_config_int(t->cfg, "top_k");
    double temperature = ddp_config_float(t->cfg, "temperature");
    /* the key/value cache (the model's, on the CPU or the GPU) */
    bool kv = ddp_config_bool(t->cfg, "kv_cache");
    uint64_t seed = (uint64_t)ddp_config_int(t->cfg, "seed");
    size_t T = (size_t)t->T, V = (size_t)t->vocab, len = 0;
    int32_t *prompt = NULL, last = 0;
    /* The model sees the last T tokens only, so the context is a window of 2T tokens, slid
     * back when full: max_new_tokens costs no memory (it was a buffer of prompt +
     * max_new_tokens tokens, whose size overflowed for a huge max_new_tokens). */
    int32_t *win = malloc(2 * T * sizeof *win);
    float *scratch = malloc(V * sizeof *scratch);
    int rc = 1;
    if (!scratch || !win) {
        rc = trainer_die(t, "generate", "out of memory");
        goto out_free;
    }
    if (prompt_of(t, &prompt, &len))
        goto out_free;
    FILE *log = to_log ? t->log : NULL;
    ddp_mt19937 g;
    ddp_mt19937_seed(&g, (uint32_t)(seed ^ (seed >> 32)));
    int e = 0;
    for (size_t i = 0; i < len && !e; i++)
        e = emit(out, log, t->vocab, prompt[i], i == 0);
    if (e) {
        rc = lost(e);
        goto out_free;
    }
    size_t wl = len < T ? len : T; /* tokens in win: the prompt's last T */
    memcpy(win, prompt + len - wl, wl * sizeof *win);
    last = prompt[len - 1];
    double t0 = ddp_now_seconds();
    for (size_t k = 0; k < max_new; k++) {
        size_t n = wl < T ? wl : T; /* the context, cropped to block_size */
        ddp_model_batch mb = {
            .n = 1, .tokens = win + wl - n, .seq_len = (int)n, .last_logits = true, .kv_cache = kv};
        if (ddp_model_forward(t->m, &mb, false, NULL) != DDP_OK) {
            rc = trainer_die(t, "generate", ddp_model_last_error(t->m));
            goto out_free;
        }
        size_t rows, cols;
        const float *lg = ddp_model_logits(t->m, &rows, &cols);
        last = pick(lg + (rows - 1) * cols, cols, temperature, top_k, scratch, &g);
        if ((e = emit(out, log, t->vocab, last, false)) != 0) {
            rc = lost(e);
            goto out_free;
        }
        if (beat(t, false, 0) != 0) {
            rc = 1;
            goto out_free;
        }
        if (wl == 2 * T) { /* full: keep the last T − 1, the new token makes T */
            memmove(win, win + wl - (T - 1), (T - 1) * sizeof *win);
            wl = T - 1;
        }
        win[wl++] = last;
    }
    if (t->vocab != 256 || last != '\n')
        for (FILE *f = out; f; f = f == out ? log : NULL)
            fputc('\n', f);
    errno = 0;
    if (fflush(out) != 0 || ferror(out)) {
        rc = lost(errno ? errno : EIO);
        goto out_free;
    }
    if (log)
        fflush(log);
    double dt = ddp_now_seconds() - t0;
    trainer_say(t, "generated %zu tokens in %.2f s (%.0f tokens/s; key/value cache %s)", max_new,
                dt, dt > 0 ? (double)max_new / dt : 0.0, kv ? "on" : "off");
    rc = 0;
out_free:
    free(prompt);
    free(win);
    free(scratch);
    return rc;
}

/* The other ranks wait for rank 0's text in broadcasts of a flag rather than in one barrier:
 * rank 0 sends GEN_GOING every few seconds while it generates, then GEN_DONE or GEN_FAILED. A
 * generation longer than a collective's deadline (DDP_TIMEOUT) no longer times them out, and a
 * failure on rank 0 reaches them at once instead of at that deadline. */
enum { GEN_GOING = 0, GEN_DONE = 1, GEN_FAILED = 2 };

static struct {
    double last; /* when rank 0 last sent the flag (0: not yet) */
    bool broken; /* a broadcast failed: no more are tried */
} hb;

/* Rank 0: the flag to the others, when final or when the last was sent long enough ago (a
 * quarter of the collective deadline, at most 10 s). Returns 0, or 1 after saying why. */
static int beat(trainer *t, bool final, int64_t flag)
{
    if (t->W == 1 || hb.broken)
        return hb.broken;
    double now = ddp_now_seconds();
    double every = t->world.settings.timeout_ms > 0 ? t->world.settings.timeout_ms / 4000.0 : 10;
    if (!final && now - hb.last < (every < 10 ? every : 10))
        return 0;
    hb.last = now;
    if (ddp_broadcast(t->g, &flag, 1, DDP_INT64, 0) != DDP_OK) {
        hb.broken = true;
        return trainer_die(t, "generate", ddp_group_last_error(t->g));
    }
    return 0;
}

int trainer_generate(trainer *t, FILE *out, bool to_log)
{
    if (t->R != 0) {
        for (;;) {
            int64_t flag = GEN_FAILED;
            if (ddp_broadcast(t->g, &flag, 1, DDP_INT64, 0) != DDP_OK)
                return trainer_die(t, "generate", ddp_group_last_error(t->g));
            if (flag == GEN_DONE)
                return 0;
            if (flag != GEN_GOING)
                return trainer_die_peer(t, "generate", "rank 0 could not generate");
        }
    }
    hb.last = ddp_now_seconds();
    hb.broken = false;
    int rc = out ? generate_rank0(t, out, to_log) : 1; /* NULL: rank 0 failed before */
    if (beat(t, true, rc ? GEN_FAILED : GEN_DONE) != 0)
        return 1;
    return rc;
}
