/*
 * sampler.c — DistributedSampler with torch's exact index order (FACTS.md describes it), and
 * the exact evaluation mode. The permutation is torch.randperm's CPU algorithm for n below
 * about 2^32 / 20: a forward Fisher–Yates drawing z = next32() % (n − i), modulo bias and all,
 * from MT19937 seeded with the low 32 bits of seed + epoch. Checked against torch itself in
 * tests/python/test_sampler.py.
 */
#include <stdlib.h>
#include <string.h>

#include "data_int.h"
#include "ddp/sampler.h"
#include "util/util.h"

void ddp_mt19937_seed(ddp_mt19937 *g, uint32_t seed)
{
    g->state[0] = seed;
    for (int i = 1; i < 624; i++)
        g->state[i] = 1812433253u * (g->state[i - 1] ^ (g->state[i - 1] >> 30)) + (uint32_t)i;
    g->index = 624;
}

uint32_t ddp_mt19937_next(ddp_mt19937 *g)
{
    if (g->index >= 624) {
        for (int i = 0; i < 624; i++) {
            uint32_t y = (g->state[i] & 0x80000000u) | (g->state[(i + 1) % 624] & 0x7fffffffu);
            g->state[i] = g->state[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        g->index = 0;
    }
    uint32_t y = g->state[g->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

void ddp_randperm(uint64_t n, uint64_t seed, uint64_t *perm)
{
    ddp_mt19937 g;
    ddp_mt19937_seed(&g, (uint32_t)seed);
    for (uint64_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint64_t i = 0; n > 1 && i < n - 1; i++) {
        uint64_t z = ddp_mt19937_next(&g) % (n - i);
        uint64_t t = perm[i];
        perm[i] = perm[i + z];
        perm[i + z] = t;
    }
}

struct ddp_sampler {
    ddp_sampler_opts o;
    uint64_t *order; /* scratch: the whole epoch's order, (n,) */
    uint64_t *mine;  /* this rank's indices, (len,) */
    size_t len;
    uint64_t epoch;      /* of mine */
    ddp__data_dep *deps; /* loaders over s: released first in destroy */
};

void ddp__data_dep_add(ddp__data_dep **head, ddp__data_dep *n)
{
    n->next = *head;
    *head = n;
}

void ddp__data_dep_remove(ddp__data_dep **head, ddp__data_dep *n)
{
    for (ddp__data_dep **p = head; *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            n->next = NULL;
            return;
        }
}

void ddp__data_dep_release_all(ddp__data_dep **head, const char *what)
{
    while (*head) {
        ddp__data_dep *n = *head;
        *head = n->next;
        n->next = NULL;
        n->release(n->ctx, what);
    }
}

void ddp__sampler_add_dep(ddp_sampler *s, ddp__data_dep *n)
{
    ddp__data_dep_add(&s->deps, n);
}

void ddp__sampler_remove_dep(ddp_sampler *s, ddp__data_dep *n)
{
    ddp__data_dep_remove(&s->deps, n);
}

/* torch: num_samples = ceil(N / W), or with drop_last and N % W ≠ 0, ceil((N − W) / W). */
static size_t per_rank(const ddp_sampler_opts *o)
{
    uint64_t N = o->dataset_size, W = (uint64_t)o->num_replicas;
    if (o->mode == DDP_SAMPLER_EXACT)
        return (size_t)(N / W + ((uint64_t)o->rank < N % W ? 1 : 0));
    if (o->drop_last && N % W != 0)
        return N < W ? 0 : (size_t)((N - W + W - 1) / W);
    return (size_t)((N + W - 1) / W);
}

ddp_status ddp_sampler_create(const ddp_sampler_opts *opts, ddp_sampler **out, ddp_error *err)
{
    if (!opts || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_sampler_create: opts and out are required");
    if (opts->num_replicas < 1)
        return ddp__err(
            err, DDP_ERR_INVALID,
            "sampler: num_replicas is %d; it must be at least 1 (pass the world's size)",
            opts->num_replicas);
    if (opts->rank < 0 || opts->rank >= opts->num_replicas)
        return ddp__err(err, DDP_ERR_INVALID,
                        "sampler: rank %d is not in [0, num_replicas %d); pass the world's rank "
                        "and size",
                        opts->rank, opts->num_replicas);
    if (opts->mode != DDP_SAMPLER_PAD && opts->mode != DDP_SAMPLER_EXACT)
        return ddp__err(err, DDP_ERR_INVALID,
                        "sampler: mode %d is not DDP_SAMPLER_PAD or DDP_SAMPLER_EXACT",
                        (int)opts->mode);
    if (opts->mode == DDP_SAMPLER_EXACT && opts->drop_last)
        return ddp__err(err, DDP_ERR_INVALID,
                        "sampler: drop_last with DDP_SAMPLER_EXACT: exact mode gives every sample "
                        "once and drops none; set drop_last false (or use DDP_SAMPLER_PAD)");
    if (opts->dataset_size > ((uint64_t)1 << 40))
        return ddp__err(err, DDP_ERR_INVALID, "sampler: dataset of %llu samples is too large",
                        (unsigned long long)opts->dataset_size);
    ddp_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a sampler");
    s->o = *opts;
    s->len = per_rank(opts);
    s->order = malloc(sizeof(uint64_t) * (size_t)(opts->dataset_size ? opts->dataset_size : 1));
    s->mine = malloc(sizeof(uint64_t) * (s->len ? s->len : 1));
    if (!s->order || !s->mine) {
        ddp_sampler_destroy(s);
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory for a sampler of %llu samples",
                        (unsigned long long)opts->dataset_size);
    }
    ddp_sampler_set_epoch(s, 0);
    *out = s;
    return DDP_OK;
}

void ddp_sampler_destroy(ddp_sampler *s)
{
    if (!s)
        return;
    ddp__data_dep_release_all(&s->deps, "sampler"); /* loaders still over s stop first */
    free(s->order);
    free(s->mine);
    free(s);
}

ddp_status ddp_sampler_set_epoch(ddp_sampler *s, uint64_t epoch)
{
    if (!s)
        return DDP_ERR_INVALID;
    uint64_t N = s->o.dataset_size;
    uint64_t W = (uint64_t)s->o.num_replicas, r = (uint64_t)s->o.rank;
    s->epoch = epoch;
    if (s->o.shuffle)
        ddp_randperm(N, s->o.seed + epoch, s->order);
    else
        for (uint64_t i = 0; i < N; i++)
            s->order[i] = i;
    /* Position p of the padded (or cut) list is order[p % N]; rank r takes p = r + k·W. */
    for (size_t k = 0; k < s->len; k++) {
        uint64_t p = r + (uint64_t)k * W;
        s->mine[k] = s->order[N ? p % N : 0];
    }
    return DDP_OK;
}

uint64_t ddp__sampler_dataset_size(const ddp_sampler *s)
{
    return s ? s->o.dataset_size : 0;
}

uint64_t ddp__sampler_epoch(const ddp_sampler *s)
{
    return s ? s->epoch : 0;
}

size_t ddp_sampler_len(const ddp_sampler *s)
{
    return s ? s->len : 0;
}

const uint64_t *ddp_sampler_indices(const ddp_sampler *s)
{
    return s ? s->mine : NULL;
}
