/*
 * trainstate.c — a trainer's state as one safetensors file (ddp_ckpt_save_train and
 * ddp_ckpt_load_train in ddp/ckpt.h): a model's parameter list and buffers, the optimizer's
 * state per parameter, and where the run stands, assembled into the tensors and metadata of
 * ddp_ckpt_save and read back with a check per tensor.
 *
 * It works over plain views (ddp_model_param, float arrays), so any model and optimizer save and
 * resume alike; it does not know which model or optimizer it holds (the config metadata does,
 * for people), and it does not synchronise ranks: the trainer has rank 0 save and load, and
 * broadcasts. The layout — each parameter followed by its state, then the buffers, metadata in
 * a fixed order — is what ddptrain has always written, so old files load and new files are the
 * same bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <float.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ckpt.h"
#include "util/util.h"

/* "optim.<param>.<state>", malloc'ed (NULL when out of memory). */
static char *state_name(const char *param, const char *state)
{
    char *s;
    return asprintf(&s, "optim.%s.%s", param, state) < 0 ? NULL : s;
}

/* Every parameter's count is the product of its shape, which the file records (a mismatch in a
 * ddp_model_param filled by hand read past data, or left part of it out). Buffers are saved 1-D
 * by count, their shapes unused. */
static ddp_status check_counts(const char *path, const ddp_ckpt_train_state *s, ddp_error *err)
{
    for (size_t i = 0; i < s->n_params; i++) {
        const ddp_model_param *p = &s->params[i];
        uint64_t prod = 1;
        bool over = false, bad_shape = p->ndim < 1 || p->ndim > DDP_MODEL_MAX_DIMS;
        char dims[96] = "";
        size_t at = 0;
        for (int d = 0; d < p->ndim && !bad_shape; d++) {
            int64_t x = p->shape[d];
            bad_shape = x < 0;
            if (x > 0 && prod > UINT64_MAX / (uint64_t)x)
                over = true;
            else if (x >= 0)
                prod *= (uint64_t)x;
            int k = snprintf(dims + at, sizeof dims - at, "%s%lld", d ? ", " : "", (long long)x);
            at = k > 0 && (size_t)k < sizeof dims - at ? at + (size_t)k : at;
        }
        if (bad_shape) /* the save refuses the shape itself, naming it */
            continue;
        if (over || prod != p->count) {
            char elems[32];
            if (over)
                snprintf(elems, sizeof elems, "more than 2^64");
            else
                snprintf(elems, sizeof elems, "%llu", (unsigned long long)prod);
            return ddp__err(err, DDP_ERR_INVALID,
                            "trainer state for '%s': parameter '%s' has count %zu but shape [%s] "
                            "(%s elements); count must be the product of the shape",
                            path, p->name ? p->name : "?", p->count, dims, elems);
        }
    }
    return DDP_OK;
}

/* The views of s are usable: the state count in range, and every array present where its count
 * is not 0 (a NULL one is the caller's mistake, reported rather than dereferenced). */
static ddp_status check_state(const char *path, const ddp_ckpt_train_state *s, bool whole,
                              ddp_error *err)
{
    if (s->n_optim < 0 || s->n_optim > DDP_CKPT_MAX_OPTIM_STATES)
        return ddp__err(err, DDP_ERR_INVALID,
                        "trainer state for '%s': %d optimizer states (0 … %d)", path, s->n_optim,
                        DDP_CKPT_MAX_OPTIM_STATES);
    const char *missing = NULL;
    int o = 0;
    if (s->n_params > 0 && !s->params)
        missing = "params";
    else if (s->n_buffers > 0 && !s->buffers)
        missing = "buffers";
    for (; !missing && s->n_params > 0 && o < s->n_optim; o++) {
        if (!s->optim_names[o])
            missing = "optim_names";
        else if (!s->optim[o] && whole)
            missing = "optim";
        if (missing)
            break;
    }
    if (!missing)
        return DDP_OK;
    char what[32];
    if (!strcmp(missing, "params") || !strcmp(missing, "buffers"))
        snprintf(what, sizeof what, "%s", missing);
    else
        snprintf(what, sizeof what, "%s[%d]", missing, o);
    return ddp__err(err, DDP_ERR_INVALID,
                    "trainer state for '%s': '%s' is NULL but %zu parameters (%zu buffers) need "
                    "it; give every array the counts describe",
                    path, what, s->n_params, s->n_buffers);
}

/* save_train's body: the tensors of s into a writer (w NULL: saved at once; else opened, the
 * optimizer states whose arrays are NULL left for ddp_ckpt_writer_put). */
static ddp_status save_train(const char *path, const ddp_ckpt_train_state *s, ddp_ckpt_writer **w,
                             ddp_error *err)
{
    if (!path || !s)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_save_train: path and state are required");
    ddp_status st0 = check_state(path, s, !w, err);
    if (st0 == DDP_OK)
        st0 = check_counts(path, s, err);
    if (st0 != DDP_OK)
        return st0;
    if (s->pos.world_size == 0) /* ddp_ckpt_load_train refuses it */
        return ddp__err(err, DDP_ERR_INVALID,
                        "trainer state for '%s': world_size 0; give the ranks of the saving run",
                        path);
    size_t per = 1 + (size_t)s->n_optim, n = s->n_params * per + s->n_buffers;
    ddp_ckpt_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    char **names = calloc(n ? n : 1, sizeof *names); /* the optimizer states' names */
    ddp_status st = DDP_OK;
    if (!ts || !names) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving '%s'", path);
        goto out_free;
    }
    size_t k = 0;
    for (size_t i = 0; i < s->n_params; i++) {
        const ddp_model_param *p = &s->params[i];
        ts[k] = (ddp_ckpt_tensor){
            .name = p->name, .dtype = DDP_FLOAT32, .ndim = p->ndim, .data = p->data};
        for (int d = 0; d < p->ndim && d < DDP_CKPT_MAX_DIMS; d++)
            ts[k].shape[d] = p->shape[d];
        k++;
        for (int o = 0; o < s->n_optim; o++) {
            if (!(names[k] = state_name(p->name, s->optim_names[o]))) {
                st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving '%s'", path);
                goto out_free;
            }
            ts[k] = (ddp_ckpt_tensor){.name = names[k],
                                      .dtype = DDP_FLOAT32,
                                      .ndim = 1,
                                      .shape = {(int64_t)p->count},
                                      .data = s->optim[o] ? s->optim[o][i] : NULL};
            k++;
        }
    }
    for (size_t i = 0; i < s->n_buffers; i++, k++)
        ts[k] = (ddp_ckpt_tensor){.name = s->buffers[i].name,
                                  .dtype = DDP_FLOAT32,
                                  .ndim = 1,
                                  .shape = {(int64_t)s->buffers[i].count},
                                  .data = s->buffers[i].data};
    char step[32], epoch[32], nb[32], ws[32], loss[64];
    snprintf(step, sizeof step, "%llu", (unsigned long long)s->pos.step);
    snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)s->pos.epoch);
    snprintf(nb, sizeof nb, "%llu", (unsigned long long)s->pos.next_batch);
    snprintf(ws, sizeof ws, "%llu", (unsigned long long)s->pos.world_size);
    snprintf(loss, sizeof loss, "%.9g", s->loss);
    char ost[32], scale[48], growth[32];
    snprintf(ost, sizeof ost, "%llu", (unsigned long long)s->pos.optim_step);
    snprintf(scale, sizeof scale, "%.9g", (double)s->pos.loss_scale);
    snprintf(growth, sizeof growth, "%d", (int)s->pos.loss_scale_growth);
    const char *own_keys[] = {"format", "step",   "epoch",      "next_batch", "world_size",
                              "loss",   "config", "optim_step", "loss_scale", "loss_scale_growth"};
    const char *own_vals[] = {DDP_CKPT_TRAIN_FORMAT,      step, epoch, nb,    ws, loss,
                              s->config ? s->config : "", ost,  scale, growth};
    size_t nk = s->pos.loss_scale > 0 ? 10 : 7; /* the scaler's keys only with fp16 */
    const char **keys = calloc(nk + s->n_extra, sizeof *keys);
    const char **vals = calloc(nk + s->n_extra, sizeof *vals);
    if (!keys || !vals) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving '%s'", path);
        goto out_meta;
    }
    memcpy(keys, own_keys, nk * sizeof *keys);
    memcpy(vals, own_vals, nk * sizeof *vals);
    if (s->n_extra && (!s->extra_keys || !s->extra_vals)) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "trainer state for '%s': n_extra %zu but extra_keys or extra_vals is NULL; "
                      "give both arrays",
                      path, s->n_extra);
        goto out_meta;
    }
    for (size_t e = 0; e < s->n_extra; e++) {
        const char *key = s->extra_keys[e];
        bool taken = false;
        for (size_t j = 0; key && j < sizeof own_keys / sizeof *own_keys; j++)
            taken = taken || !strcmp(key, own_keys[j]);
        if (!key || !*key || taken || !s->extra_vals[e]) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "trainer state for '%s': extra metadata %zu ('%s') %s; give another "
                          "key",
                          path, e, key ? key : "(null)",
                          taken ? "is one of the format's own keys" : "has no key or no value");
            goto out_meta;
        }
        keys[nk + e] = key;
        vals[nk + e] = s->extra_vals[e];
    }
    st = w ? ddp_ckpt_writer_open(path, ts, k, keys, vals, nk + s->n_extra, w, err)
           : ddp_ckpt_save(path, ts, k, keys, vals, nk + s->n_extra, err);
out_meta:
    free(keys);
    free(vals);
out_free:
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    free(ts);
    return st;
}

ddp_status ddp_ckpt_save_train(const char *path, const ddp_ckpt_train_state *s, ddp_error *err)
{
    return save_train(path, s, NULL, err);
}

ddp_status ddp_ckpt_open_train(const char *path, const ddp_ckpt_train_state *s,
                               ddp_ckpt_writer **out, ddp_error *err)
{
    if (!out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_open_train: no writer to return");
    return save_train(path, s, out, err);
}

size_t ddp_ckpt_train_tensor(const ddp_ckpt_train_state *s, size_t i, int o)
{
    return i * (1 + (size_t)s->n_optim) + 1 + (size_t)o;
}

/* Copies the F32 tensor `name` of count elements from c into dst; DDP_ERR_INVALID if the file has
 * none of that size. */
static ddp_status load_tensor(const ddp_ckpt *c, const char *path, const char *name, size_t count,
                              float *dst, bool optim, ddp_error *err)
{
    const ddp_ckpt_tensor *x = ddp_ckpt_find(c, name);
    size_t cnt = 1;
    for (int d = 0; x && d < x->ndim; d++)
        cnt *= (size_t)x->shape[d];
    if (x && x->dtype == DDP_FLOAT32 && cnt == count) {
        if (count)
            memcpy(dst, x->data, count * sizeof(float));
        return DDP_OK;
    }
    /* the advice points at the 'config' metadata only where the file has one (a program on the
     * library may save none: then the model it was built with is the caller's to know) */
    bool cfg = ddp_ckpt_meta(c, "config") != NULL;
    if (optim)
        return ddp__err(err, DDP_ERR_INVALID,
                        "checkpoint '%s' lacks '%s' (float32, %zu values): saved with another "
                        "optimizer? %s",
                        path, name, count,
                        cfg ? "Set optimizer as in its 'config' metadata"
                            : "Use the optimizer it was saved with");
    return ddp__err(err, DDP_ERR_INVALID,
                    "checkpoint '%s' has no float32 '%s' of %zu values: it was saved with another "
                    "model; %s",
                    path, name, count,
                    cfg ? "check the model's settings against its 'config' metadata"
                        : "build the model it was saved with (the file stores no 'config' "
                          "metadata saying which)");
}

/* A metadata value that is an unsigned decimal number, digits only (strtoull alone would take
 * "-1" as 2^64 − 1, and leading blanks or a '+'). */
static bool decimal(const char *txt, uint64_t *out)
{
    if (!txt || *txt < '0' || *txt > '9')
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(txt, &end, 10);
    if (*end || errno == ERANGE)
        return false;
    *out = v;
    return true;
}

ddp_status ddp_ckpt_load_train(const char *path, const ddp_ckpt_train_state *s,
                               ddp_ckpt_train_pos *pos, ddp_error *err)
{
    if (!path || !s)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_load_train: path and state are required");
    ddp_status st = check_state(path, s, true, err);
    if (st != DDP_OK)
        return st;
    ddp_ckpt *c;
    st = ddp_ckpt_open(path, &c, err);
    if (st != DDP_OK)
        return st;
    const char *fmt = ddp_ckpt_meta(c, "format");
    if (!fmt || strcmp(fmt, DDP_CKPT_TRAIN_FORMAT) != 0) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' is not a ddptrain checkpoint (its metadata 'format' is not '%s')", path,
                      DDP_CKPT_TRAIN_FORMAT);
        goto out_close;
    }
    if ((st = ddp_ckpt_verify(c, err)) != DDP_OK)
        goto out_close;
    for (size_t i = 0; i < s->n_params && !st; i++) {
        const ddp_model_param *p = &s->params[i];
        st = load_tensor(c, path, p->name, p->count, p->data, false, err);
        for (int o = 0; o < s->n_optim && !st; o++) {
            char *name = state_name(p->name, s->optim_names[o]);
            st = name ? load_tensor(c, path, name, p->count, s->optim[o][i], true, err)
                      : ddp__err(err, DDP_ERR_NOMEM, "out of memory reading '%s'", path);
            free(name);
        }
    }
    for (size_t i = 0; i < s->n_buffers && !st; i++)
        st = load_tensor(c, path, s->buffers[i].name, s->buffers[i].count, s->buffers[i].data,
                         false, err);
    const char *keys[] = {"step", "epoch", "next_batch", "world_size"};
    uint64_t v[4] = {0};
    for (int k = 0; k < 4 && !st; k++) {
        const char *txt = ddp_ckpt_meta(c, keys[k]);
        if (!decimal(txt, &v[k]))
            st = ddp__err(err, DDP_ERR_INVALID,
                          "checkpoint '%s': metadata '%s' is missing or not a number", path,
                          keys[k]);
    }
    /* The trainer continues after next_batch × world_size samples of the epoch. */
    if (!st && (v[3] == 0 || v[2] > UINT64_MAX / v[3]))
        st = ddp__err(err, DDP_ERR_INVALID,
                      "checkpoint '%s': metadata world_size '%llu' with next_batch '%llu' is not "
                      "a position in an epoch (world_size ≥ 1, their product below 2^64)",
                      path, (unsigned long long)v[3], (unsigned long long)v[2]);
    ddp_ckpt_train_pos p = {v[0], v[1], v[2], v[3], v[0], 0.0f, 0};
    const char *ost = ddp_ckpt_meta(c, "optim_step"), *sc = ddp_ckpt_meta(c, "loss_scale"),
               *gr = ddp_ckpt_meta(c, "loss_scale_growth");
    if (!st && ost && sc && gr) { /* fp16 loss scaling */
        char *e2 = NULL, *e3 = NULL;
        uint64_t o = 0;
        bool ok_o = decimal(ost, &o);
        double sv = strtod(sc, &e2);
        long g = strtol(gr, &e3, 10);
        /* the scale as the float it becomes: 1e39 would be inf */
        if (!ok_o || !*sc || *e2 || !*gr || *e3 || o > v[0] || !(sv > 0) || !(sv <= FLT_MAX) ||
            g < 0 || g > INT32_MAX)
            st = ddp__err(err, DDP_ERR_INVALID,
                          "checkpoint '%s': metadata optim_step '%s', loss_scale '%s', "
                          "loss_scale_growth '%s' are not a step count ≤ step, a finite scale > 0 "
                          "and a count ≥ 0",
                          path, ost, sc, gr);
        p.optim_step = o;
        p.loss_scale = (float)(sv <= FLT_MAX ? sv : 0);
        p.loss_scale_growth = (int32_t)(g >= 0 && g <= INT32_MAX ? g : 0);
    }
    if (st == DDP_OK && pos)
        *pos = p;
out_close:
    ddp_ckpt_close(c);
    return st;
}
