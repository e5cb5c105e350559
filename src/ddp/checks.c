/*
 * checks.c — what is checked before a reducer exists (reducer_int.h): the arguments on this rank,
 * then across ranks the parameter and buffer lists and the options that shape the buckets and
 * their collectives. Each check fails naming the first difference, so that a rank-dependent model
 * or option does not surface later as "collectives differ".
 * Not here: the broadcast of rank 0's values (reducer.c) and the agreement on memory (buckets.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"

static bool float_dtype(ddp_dtype t)
{
    return t == DDP_FLOAT32 || t == DDP_FLOAT64 || t == DDP_BFLOAT16 || t == DDP_FLOAT16;
}

static int cmp_param_name(const void *a, const void *b)
{
    const ddp_param *x = *(const ddp_param *const *)a, *y = *(const ddp_param *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

/* The first name that two of the parameters and buffers share, or NULL; *nomem set when the
 * sort's array could not be allocated. Names key the cross-rank check and checkpoints
 * (safetensors keys), so they must be unique. */
static const char *duplicate_name(const ddp_param *params, size_t np, const ddp_param *buffers,
                                  size_t nb, bool *nomem)
{
    *nomem = false;
    if (np + nb < 2)
        return NULL;
    const ddp_param **all = malloc((np + nb) * sizeof *all);
    if (!all) {
        *nomem = true;
        return NULL;
    }
    for (size_t i = 0; i < np + nb; i++)
        all[i] = i < np ? &params[i] : &buffers[i - np];
    qsort(all, np + nb, sizeof *all, cmp_param_name);
    const char *dup = NULL;
    for (size_t i = 1; i < np + nb && !dup; i++)
        if (strcmp(all[i - 1]->name, all[i]->name) == 0)
            dup = all[i]->name;
    free(all);
    return dup;
}

ddp_status ddp__reducer_check_args(ddp_group *g, const ddp__devops *dev, const ddp_param *params,
                                   size_t nparams, const ddp_param *buffers, size_t nbuffers,
                                   const ddp_reducer_opts *opts, ddp_error *err)
{
    /* data may be NULL for an empty parameter or buffer (count 0: what malloc(0) may give) */
    for (size_t i = 0; i < nparams + nbuffers; i++) {
        bool buf = i >= nparams;
        const ddp_param *p = buf ? &buffers[i - nparams] : &params[i];
        const char *kind = buf ? "buffer" : "parameter";
        size_t k = buf ? i - nparams : i;
        if (!p->name)
            return ddp__err(err, DDP_ERR_INVALID, "%s %zu has no name: give each a unique one",
                            kind, k);
        if (!p->data && p->count)
            return ddp__err(err, DDP_ERR_INVALID,
                            "%s %zu ('%s'): data is NULL for %zu elements (only an empty one, "
                            "count 0, may have none)",
                            kind, k, p->name, p->count);
        if (ddp_dtype_size(p->dtype) == 0)
            return ddp__err(err, DDP_ERR_INVALID, "%s %zu ('%s'): dtype %d is not a dtype", kind, k,
                            p->name, (int)p->dtype);
        if (!buf && !float_dtype(p->dtype))
            return ddp__err(err, DDP_ERR_INVALID,
                            "parameter %zu ('%s'): dtype %s is not a floating-point type "
                            "(float32, float64, bfloat16 or float16)",
                            k, p->name, ddp_dtype_name(p->dtype));
    }
    if (opts->overlap != DDP_OVERLAP_AUTO && opts->overlap != DDP_OVERLAP_ASYNC &&
        opts->overlap != DDP_OVERLAP_INLINE)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_reducer_create: overlap %d is not DDP_OVERLAP_AUTO, _ASYNC or _INLINE",
                        (int)opts->overlap);
    if (opts->shard_gradients && !opts->shard_optimizer)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_reducer_create: shard_gradients (ZeRO-2) needs shard_optimizer "
                        "(ZeRO-1): each rank steps the shard of the gradient it keeps");
    if (opts->shard_gradients && dev)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_reducer_create: shard_gradients (ZeRO-2) is CPU-only for now; on a "
                        "GPU group (backend '%s') use shard_optimizer alone",
                        ddp_group_backend(g));
    if (opts->shard_gradients && opts->compress_bf16)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_reducer_create: shard_gradients (ZeRO-2) does not take "
                        "compress_bf16 yet (its wire copies would be whole buckets again)");
    bool nomem;
    const char *dup = duplicate_name(params, nparams, buffers, nbuffers, &nomem);
    if (nomem)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory checking the parameters' names");
    if (dup)
        return ddp__err(err, DDP_ERR_INVALID,
                        "the name '%s' is given to two parameters or buffers: each needs a name of "
                        "its own (it identifies them across ranks and in checkpoints)",
                        dup);
    for (size_t i = 0; i < nparams + nbuffers; i++) {
        const ddp_param *p = i < nparams ? &params[i] : &buffers[i - nparams];
        if (p->device != (dev ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU))
            return ddp__err(err, DDP_ERR_INVALID,
                            "%s '%s': its data is on device '%s', but the group's collectives "
                            "take %s memory (backend '%s'); %s",
                            i < nparams ? "parameter" : "buffer", p->name,
                            ddp_device_name(p->device), dev ? "GPU" : "host", ddp_group_backend(g),
                            dev ? "put it on the group's GPU (ddp_group_cuda_device) or use a CPU "
                                  "group"
                                : "create the group with device DDP_DEVICE_CUDA "
                                  "(ddp_group_opts.device) or copy it to the host");
        if (dev && p->device == DDP_DEVICE_CUDA && !dev->memset0)
            return ddp__err(err, DDP_ERR_INVALID,
                            "the GPU backend '%s' has no device arithmetic for the reducer; "
                            "HINT: use the libddp_gpu.so built with this libddp",
                            ddp_group_backend(g));
    }
    return DDP_OK;
}

/* FNV-1a over a parameter's name, count and dtype: what ranks must agree on. */
static uint64_t param_hash(const ddp_param *p)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = p->name; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h = (h ^ p->count) * 1099511628211ull;
    return (h ^ (uint64_t)p->dtype) * 1099511628211ull;
}

/* The parameter count of a rank that refused its own arguments (ddp__reducer_refuse_on_peers). */
#define REFUSED UINT64_MAX

void ddp__reducer_refuse_on_peers(ddp_group *g)
{
    int W = ddp_group_size(g);
    uint64_t mark[1] = {REFUSED}, *all = malloc(sizeof(uint64_t) * (size_t)(W > 0 ? W : 1));
    if (all && W > 1) /* its failure is the peers' to report; this rank has its own message */
        (void)ddp__group_host_collective(g, true, mark, all, 1, DDP_INT64, DDP_SUM);
    free(all);
}

/* Checks that all ranks registered the same list; names the first difference. */
static ddp_status check_same(ddp_reducer *r, const ddp_param *ps, size_t n, const char *what,
                             ddp_error *err)
{
    int W = ddp_group_size(r->g);
    /* Per entry: its hash; plus the count of entries up front. */
    size_t m = n + 1;
    uint64_t *mine = malloc(sizeof(uint64_t) * m);
    uint64_t *all = malloc(sizeof(uint64_t) * m * (size_t)W);
    uint64_t cnt[1] = {n}, *cnts = malloc(sizeof(uint64_t) * (size_t)W);
    ddp_status st = DDP_ERR_NOMEM;
    if (!mine || !all || !cnts) {
        ddp__err(err, st, "out of memory checking %s", what);
        goto out;
    }
    if ((st = ddp__reducer_ctl(r, true, cnt, cnts, 1, DDP_INT64, DDP_SUM))) {
        ddp__err(err, st, "checking %s across ranks: %s", what, r->err);
        goto out;
    }
    for (int k = 0; k < W; k++) {
        if (cnts[k] == REFUSED) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "rank %d refused its own arguments to ddp_reducer_create (its message "
                          "says which); fix them there: every rank must create the reducer",
                          k);
            goto out;
        }
        if (cnts[k] != n) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "rank %d registered %llu %s but rank %d registered %zu: every rank must "
                          "build the same model",
                          k, (unsigned long long)cnts[k], what, ddp_group_rank(r->g), n);
            goto out;
        }
    }
    mine[0] = n;
    for (size_t i = 0; i < n; i++)
        mine[i + 1] = param_hash(&ps[i]);
    if ((st = ddp__reducer_ctl(r, true, mine, all, m, DDP_INT64, DDP_SUM))) {
        ddp__err(err, st, "checking %s across ranks: %s", what, r->err);
        goto out;
    }
    for (int k = 0; k < W; k++) {
        for (size_t i = 0; i < n; i++) {
            if (all[(size_t)k * m + i + 1] != mine[i + 1]) {
                st = ddp__err(err, DDP_ERR_INVALID,
                              "%.*s %zu ('%s', %s × %zu on rank %d) differs on rank %d (another "
                              "name, size or dtype): every rank must register the same %s in "
                              "the same order",
                              (int)strlen(what) - 1, what, i, ps[i].name,
                              ddp_dtype_name(ps[i].dtype), ps[i].count, ddp_group_rank(r->g), k,
                              what);
                goto out;
            }
        }
    }
    st = DDP_OK;
out:
    free(mine);
    free(all);
    free(cnts);
    return st;
}

/* Checks that all ranks chose the options that shape the buckets and their collectives (the
 * defaults resolved); names the first difference. Without it, a rank-dependent bucket_cap or
 * compress_bf16 surfaced later as "collectives differ" with counts that did not say why. */
static ddp_status check_opts(ddp_reducer *r, ddp_error *err)
{
    enum { N_OPTS = 8 };
    static const char *const names[N_OPTS] = {
        "bucket_cap",       "first_bucket",    "compress_bf16",   "shard_optimizer",
        "broadcast_params", "rebuild_buckets", "shard_gradients", "grad_pool"};
    uint64_t mine[N_OPTS] = {r->o.bucket_cap,      r->o.first_bucket,     r->o.compress_bf16,
                             r->o.shard_optimizer, r->o.broadcast_params, r->o.rebuild_buckets,
                             r->o.shard_gradients, r->o.grad_pool};
    int W = ddp_group_size(r->g);
    uint64_t *all = malloc(sizeof(uint64_t) * N_OPTS * (size_t)W);
    if (!all)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory checking the reducer's options");
    ddp_status st = ddp__reducer_ctl(r, true, mine, all, N_OPTS, DDP_INT64, DDP_SUM);
    if (st) {
        ddp__err(err, st, "checking the reducer's options across ranks: %s", r->err);
        goto out;
    }
    for (int k = 0; k < W && !st; k++)
        for (int i = 0; i < N_OPTS && !st; i++)
            if (all[(size_t)k * N_OPTS + (size_t)i] != mine[i])
                st = ddp__err(err, DDP_ERR_INVALID,
                              "the reducer's option %s is %llu on rank %d but %llu on rank %d: "
                              "every rank must pass the same ddp_reducer_opts (bucket_cap, "
                              "first_bucket, compress_bf16, shard_optimizer, broadcast_params, "
                              "rebuild_buckets, shard_gradients, grad_pool)",
                              names[i], (unsigned long long)mine[i], ddp_group_rank(r->g),
                              (unsigned long long)all[(size_t)k * N_OPTS + (size_t)i], k);
out:
    free(all);
    return st;
}

ddp_status ddp__reducer_check_ranks(ddp_reducer *r, ddp_error *err)
{
    ddp_status st;
    if ((st = check_same(r, r->params, r->nparams, "parameters", err)) ||
        (st = check_same(r, r->buffers, r->nbuffers, "buffers", err)) || (st = check_opts(r, err)))
        return st;
    return DDP_OK;
}
