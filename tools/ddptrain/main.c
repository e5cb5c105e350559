/*
 * ddptrain — the trainer: `ddprun --nproc_per_node=2 ddptrain [--config X.yaml] [--key value …]`.
 *
 * Tasks: train (with evaluation and checkpoints), test (evaluate a checkpoint), predict (write a
 * checkpoint's predictions to CSV). Data: Fashion-MNIST / MNIST IDX files. Models: an MLP or a
 * small CNN (model.h). Everything distributed goes through the public API: the group, the
 * reducer (gradient buckets during backward), the sampler and loader, the checkpoint module.
 * Rank 0 alone logs and writes checkpoints; the others wait at a barrier.
 * Checkpoints are safetensors files: every weight under its own name (no "module." prefix),
 * the optimizer state under "optim.<name>.<state>", the trainer state in the metadata. They do
 * not depend on the world size: every rank holds the same model and optimizer state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddp/ddp.h"
#include "model.h"

static const ddp_cfg_key schema[] = {
    {"task", DDP_CFG_CHOICE, "train", "train|test|predict", "what to do"},
    {"seed", DDP_CFG_INT, "42", NULL, "seed of weights, data order and dropout"},
    {"out_dir", DDP_CFG_STRING, "runs/default", NULL, "train.log, metrics.jsonl, checkpoints/"},
    {"data.dir", DDP_CFG_STRING, "/usr/share/datasets/fashion-mnist", NULL,
     "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"},
    {"data.threads", DDP_CFG_INT, "-1", NULL,
     "loader threads per rank; 0: load on the training thread; -1: 1 if the host has a core to "
     "spare for each rank, else 0"},
    {"model.type", DDP_CFG_CHOICE, "mlp", "mlp|cnn", "the model"},
    {"model.hidden", DDP_CFG_INT_LIST, "256,128", NULL, "fully connected hidden sizes"},
    {"model.channels", DDP_CFG_INT_LIST, "32,64", NULL, "cnn: conv stage channels"},
    {"model.dropout", DDP_CFG_FLOAT, "0", NULL, "dropout after each hidden layer"},
    {"model.activation", DDP_CFG_CHOICE, "relu", "relu|gelu",
     "after each hidden layer (gelu: exact, as torch.nn.GELU())"},
    {"augment.hflip", DDP_CFG_BOOL, "false", NULL, "train: flip images left-right, p = 1/2"},
    {"augment.shift", DDP_CFG_INT, "0", NULL,
     "train: shift images by up to N pixels, zero fill (RandomCrop padding=N)"},
    {"batch_size", DDP_CFG_INT, "64", NULL, "samples per rank per micro-step"},
    {"grad_accum", DDP_CFG_INT, "1", NULL, "micro-steps per optimizer step (no_sync between)"},
    {"epochs", DDP_CFG_INT, "10", NULL, "epochs to train (unless total_steps > 0)"},
    {"total_steps", DDP_CFG_INT, "0", NULL, "optimizer steps to train; 0: use epochs"},
    {"optimizer", DDP_CFG_CHOICE, "sgd", "sgd|adamw", "the optimizer"},
    {"lr", DDP_CFG_FLOAT, "0.1", NULL, "learning rate for one process"},
    {"lr_scaling", DDP_CFG_CHOICE, "none", "none|linear|sqrt", "scale lr by the world size"},
    {"schedule", DDP_CFG_CHOICE, "cosine", "cosine|linear|constant", "after warmup"},
    {"warmup_steps", DDP_CFG_INT, "0", NULL, "linear warmup from 0"},
    {"momentum", DDP_CFG_FLOAT, "0.9", NULL, "sgd momentum"},
    {"weight_decay", DDP_CFG_FLOAT, "0", NULL, "sgd: L2 in the gradient; adamw: decoupled"},
    {"betas", DDP_CFG_STRING, "0.9,0.999", NULL, "adamw beta1,beta2"},
    {"grad_clip", DDP_CFG_FLOAT, "0", NULL, "clip the global gradient norm (0: off)"},
    {"eval_every", DDP_CFG_INT, "0", NULL, "evaluate every N steps (0: at each epoch end)"},
    {"log_every", DDP_CFG_INT, "50", NULL, "progress line every N steps"},
    {"checkpoint.every", DDP_CFG_INT, "0", NULL, "checkpoint every N steps (and at the end)"},
    {"checkpoint.keep", DDP_CFG_INT, "3", NULL, "keep the last K checkpoints"},
    {"resume_from", DDP_CFG_STRING, "", NULL, "a checkpoint path, or 'latest' (in out_dir)"},
    {"checkpoint", DDP_CFG_STRING, "latest", NULL, "test/predict: checkpoint path or 'latest'"},
    {"predict_out", DDP_CFG_STRING, "predictions.csv", NULL, "predict: the CSV to write"},
    {"overlap", DDP_CFG_CHOICE, "auto", "auto|async|inline", "how gradient buckets are reduced"},
    {"compress_bf16", DDP_CFG_BOOL, "false", NULL, "send gradients as bfloat16"},
    {"bucket_kb", DDP_CFG_INT, "0", NULL, "gradient bucket cap in KiB (0: 25 MiB, first 1 MiB)"},
    {"shard_optimizer", DDP_CFG_CHOICE, "auto", "auto|true|false",
     "ZeRO-1: each rank steps 1/world of the parameters, then they are gathered (auto: on, "
     "except over shm+tcp, whose reduce_scatter is a whole allreduce)"},
};
#define NKEYS (sizeof schema / sizeof schema[0])

typedef struct trainer {
    ddp_config *cfg;
    ddp_group *g;
    int W, R;
    model m;
    ddp_reducer *red;
    float **opt_a, **opt_b; /* per parameter: sgd momentum / adamw m, v */
    uint64_t step;          /* optimizer steps done */
    uint64_t epoch;
    ddp_loader_state pos; /* where the training data resume */
    FILE *log, *jsonl;
    char dir[1024];
} trainer;

/* ---- messages ------------------------------------------------------------------------------ */

static void say(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(trainer *t, const char *fmt, ...)
{
    if (t->R != 0)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("%s\n", line);
    fflush(stdout);
    if (t->log) {
        fprintf(t->log, "%s\n", line);
        fflush(t->log);
    }
}

static int die(trainer *t, const char *what, const char *msg)
{
    fprintf(stderr, "ddptrain: rank %d: %s: %s\n", t->R, what, msg);
    return 1;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* cache: where a gzip file is decompressed to (the data_cache setting, DDP_DATA_CACHE). */
static ddp_status open_split(const char *dir, const char *split, const char *cache,
                             ddp_dataset **out, ddp_error *err)
{
    char im[2048], lb[2048];
    snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    if (access(im, R_OK) != 0) {
        snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte", dir, split);
        snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte", dir, split);
    }
    return ddp_dataset_open_idx(im, lb, cache, out, err);
}

/* ---- learning rate --------------------------------------------------------------------------- */

static double lr_at(const trainer *t, uint64_t step, uint64_t total)
{
    double lr = ddp_config_float(t->cfg, "lr");
    const char *sc = ddp_config_str(t->cfg, "lr_scaling");
    if (!strcmp(sc, "linear"))
        lr *= t->W;
    else if (!strcmp(sc, "sqrt"))
        lr *= sqrt((double)t->W);
    uint64_t warm = (uint64_t)ddp_config_int(t->cfg, "warmup_steps");
    if (step < warm)
        return lr * (double)(step + 1) / (double)warm;
    double frac = total > warm ? (double)(step - warm) / (double)(total - warm) : 0;
    const char *s = ddp_config_str(t->cfg, "schedule");
    if (!strcmp(s, "cosine"))
        return lr * 0.5 * (1 + cos(M_PI * frac));
    if (!strcmp(s, "linear"))
        return lr * (1 - frac);
    return lr;
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

/* The shape of parameter i as PyTorch would have it. */
static int param_shape(const model *m, int i, int64_t *shape)
{
    for (int k = 0; k < m->nl; k++) {
        const layer *l = &m->L[k];
        if (l->p0 != i)
            continue;
        if (l->kind == L_LINEAR) {
            shape[0] = l->out;
            shape[1] = l->fan_in;
            return 2;
        }
        if (l->kind == L_CONV) {
            shape[0] = l->conv.out_ch;
            shape[1] = l->conv.in_ch;
            shape[2] = l->conv.kh;
            shape[3] = l->conv.kw;
            return 4;
        }
    }
    shape[0] = (int64_t)m->params[i].count;
    return 1;
}

static bool adamw(const trainer *t)
{
    return !strcmp(ddp_config_str(t->cfg, "optimizer"), "adamw");
}

static ddp_status save_checkpoint(trainer *t, double loss, ddp_error *err)
{
    ddp_status st = DDP_OK;
    /* Sharded, each rank's optimizer state is current only in its shard: complete it first. */
    ddp_status gs = ddp_reducer_gather_state(t->red, (void *const *)t->opt_a);
    if (!gs && adamw(t))
        gs = ddp_reducer_gather_state(t->red, (void *const *)t->opt_b);
    if (gs)
        return train_err(err, gs, "%s", ddp_reducer_last_error(t->red));
    if (t->R == 0) {
        model *m = &t->m;
        int n = m->nparams * 3 + m->nbuffers;
        ddp_ckpt_tensor *ts = calloc((size_t)n, sizeof *ts);
        char(*names)[96] = calloc((size_t)n, sizeof *names);
        if (!ts || !names) {
            free(ts);
            free(names);
            return train_err(err, DDP_ERR_NOMEM, "out of memory saving a checkpoint");
        }
        int k = 0;
        for (int i = 0; i < m->nparams; i++) {
            ts[k] = (ddp_ckpt_tensor){
                .name = m->params[i].name, .dtype = DDP_CKPT_F32, .data = m->params[i].data};
            ts[k].ndim = param_shape(m, i, ts[k].shape);
            k++;
            int nstate = adamw(t) ? 2 : 1;
            for (int s = 0; s < nstate; s++) {
                snprintf(names[k], sizeof names[k], "optim.%s.%s", m->params[i].name,
                         adamw(t) ? (s ? "exp_avg_sq" : "exp_avg") : "momentum_buffer");
                ts[k] = (ddp_ckpt_tensor){.name = names[k],
                                          .dtype = DDP_CKPT_F32,
                                          .ndim = 1,
                                          .data = s ? t->opt_b[i] : t->opt_a[i]};
                ts[k].shape[0] = (int64_t)m->params[i].count;
                k++;
            }
        }
        for (int i = 0; i < m->nbuffers; i++) {
            ts[k] = (ddp_ckpt_tensor){.name = m->buffers[i].name,
                                      .dtype = DDP_CKPT_F32,
                                      .ndim = 1,
                                      .data = m->buffers[i].data};
            ts[k].shape[0] = (int64_t)m->buffers[i].count;
            k++;
        }
        char step[32], epoch[32], nb[32], ws[32], ls[64];
        snprintf(step, sizeof step, "%llu", (unsigned long long)t->step);
        snprintf(epoch, sizeof epoch, "%llu", (unsigned long long)t->pos.epoch);
        snprintf(nb, sizeof nb, "%llu", (unsigned long long)t->pos.next_batch);
        snprintf(ws, sizeof ws, "%d", t->W);
        snprintf(ls, sizeof ls, "%.9g", loss);
        char *yaml = ddp_config_to_yaml(t->cfg);
        const char *keys[] = {"format",     "step", "epoch", "next_batch",
                              "world_size", "loss", "config"};
        const char *vals[] = {"ddptrain-1", step, epoch, nb, ws, ls, yaml ? yaml : ""};
        char dir[1100], path[1300];
        snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
        mkdir(dir, 0755);
        snprintf(path, sizeof path, "%s/step%llu.safetensors", dir, (unsigned long long)t->step);
        st = ddp_ckpt_save(path, ts, (size_t)k, keys, vals, 7, err);
        if (st == DDP_OK) {
            say(t, "checkpoint %s", path);
            ddp_ckpt_prune(dir, "step", (size_t)ddp_config_int(t->cfg, "checkpoint.keep"), NULL);
        }
        free(yaml);
        free(ts);
        free(names);
    }
    /* The others wait for rank 0 (and learn whether the save worked). */
    int64_t ok = st == DDP_OK;
    if (ddp_broadcast(t->g, &ok, 1, DDP_INT64, 0) != DDP_OK)
        return train_err(err, DDP_ERR_NETWORK, "%s", ddp_group_last_error(t->g));
    if (!ok && t->R != 0)
        return train_err(err, DDP_ERR_SYSTEM, "rank 0 could not save the checkpoint");
    return st;
}

static ddp_status find_checkpoint(trainer *t, const char *spec, char *path, size_t cap,
                                  ddp_error *err)
{
    if (strcmp(spec, "latest") != 0) {
        snprintf(path, cap, "%s", spec);
        return DDP_OK;
    }
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    return ddp_ckpt_latest(dir, "step", path, cap, err);
}

/* Rank 0 reads the checkpoint into the model and optimizer state; the caller broadcasts. */
static ddp_status load_checkpoint(trainer *t, const char *path, uint64_t *meta, ddp_error *err)
{
    ddp_ckpt *c;
    ddp_status st = ddp_ckpt_open(path, &c, err);
    if (st)
        return st;
    model *m = &t->m;
    const char *fmt = ddp_ckpt_meta(c, "format");
    if (!fmt || strcmp(fmt, "ddptrain-1") != 0) {
        ddp_ckpt_close(c);
        return train_err(err, DDP_ERR_INVALID, "'%s' is not a ddptrain checkpoint", path);
    }
    for (int i = 0; i < m->nparams + m->nbuffers && !st; i++) {
        const ddp_param *p = i < m->nparams ? &m->params[i] : &m->buffers[i - m->nparams];
        const ddp_ckpt_tensor *x = ddp_ckpt_find(c, p->name);
        size_t cnt = 1;
        for (int d = 0; x && d < x->ndim; d++)
            cnt *= (size_t)x->shape[d];
        if (!x || x->dtype != DDP_CKPT_F32 || cnt != p->count) {
            st = train_err(err, DDP_ERR_INVALID,
                           "checkpoint '%s' has no float32 '%s' of %zu values: it was saved "
                           "with another model; check model.* against its config",
                           path, p->name, p->count);
            break;
        }
        memcpy(p->data, x->data, p->count * sizeof(float));
        if (i >= m->nparams)
            continue;
        int nstate = adamw(t) ? 2 : 1;
        for (int s = 0; s < nstate; s++) {
            char name[128];
            snprintf(name, sizeof name, "optim.%s.%s", p->name,
                     adamw(t) ? (s ? "exp_avg_sq" : "exp_avg") : "momentum_buffer");
            const ddp_ckpt_tensor *o = ddp_ckpt_find(c, name);
            if (!o || o->ndim != 1 || (size_t)o->shape[0] != p->count) {
                st = train_err(err, DDP_ERR_INVALID,
                               "checkpoint '%s' lacks '%s': saved with another optimizer?", path,
                               name);
                break;
            }
            memcpy(s ? t->opt_b[i] : t->opt_a[i], o->data, p->count * sizeof(float));
        }
    }
    const char *keys[] = {"step", "epoch", "next_batch", "world_size"};
    for (int k = 0; k < 4 && !st; k++) {
        const char *v = ddp_ckpt_meta(c, keys[k]);
        char *end;
        meta[k] = v ? strtoull(v, &end, 10) : 0;
        if (!v || *end)
            st = train_err(err, DDP_ERR_INVALID,
                           "checkpoint '%s': metadata '%s' is "
                           "missing or not a number",
                           path, keys[k]);
    }
    ddp_ckpt_close(c);
    return st;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

/* Exact: every test sample once across ranks (no padding), sums all-reduced. */
static ddp_status evaluate(trainer *t, ddp_dataset *ds, double *loss, double *acc, ddp_error *err)
{
    ddp_status st;
    if ((st = ddp_reducer_sync_buffers(t->red)))
        return train_err(err, st, "%s", ddp_reducer_last_error(t->red));
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(ds);
    so.num_replicas = t->W;
    so.rank = t->R;
    so.shuffle = false;
    so.mode = DDP_SAMPLER_EXACT;
    ddp_sampler *s;
    if ((st = ddp_sampler_create(&so, &s, err)))
        return st;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = (size_t)t->m.B;
    lo.drop_last = false;
    ddp_loader *l;
    if ((st = ddp_loader_create(ds, s, &lo, &l, err))) {
        ddp_sampler_destroy(s);
        return st;
    }
    double sums[3] = {0, 0, 0}; /* loss sum, correct, count */
    float *dl = malloc(sizeof(float) * (size_t)t->m.B * (size_t)t->m.classes);
    ddp_batch b;
    while (st == DDP_OK && (st = ddp_loader_next(l, &b)) == DDP_OK && b.n > 0) {
        const float *logits = model_forward(&t->m, b.x, (int)b.n, false, 0, 0, 0, err);
        double bl;
        int correct;
        if (!logits) {
            st = err->status;
            break;
        }
        st = ddp_nn_softmax_xent(logits, b.y, (int)b.n, t->m.classes, 1.0f, &bl, dl, &correct, err);
        sums[0] += bl * (double)b.n;
        sums[1] += correct;
        sums[2] += (double)b.n;
    }
    free(dl);
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    if (st)
        return st;
    double all[3];
    if ((st = ddp_allreduce(t->g, sums, all, 3, DDP_FLOAT64, DDP_SUM)))
        return train_err(err, st, "%s", ddp_group_last_error(t->g));
    *loss = all[0] / all[2];
    *acc = all[1] / all[2];
    return DDP_OK;
}

/* ---- training ---------------------------------------------------------------------------------
 */

static int train(trainer *t, ddp_dataset *tr, ddp_dataset *te)
{
    ddp_error err = {0};
    ddp_config *c = t->cfg;
    int B = (int)ddp_config_int(c, "batch_size"), A = (int)ddp_config_int(c, "grad_accum");
    uint64_t seed = (uint64_t)ddp_config_int(c, "seed");
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(tr);
    so.num_replicas = t->W;
    so.rank = t->R;
    so.seed = seed;
    ddp_sampler *s;
    ddp_loader *l;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = (size_t)B;
    lo.threads = (int)ddp_config_int(c, "data.threads");
    if (lo.threads < 0) /* a prefetch thread only pays when it has a core of its own */
        lo.threads = ddp_group_core_to_spare(t->g) ? 1 : 0;
    if (ddp_sampler_create(&so, &s, &err) != DDP_OK)
        return die(t, "data", err.msg);
    if (ddp_loader_create(tr, s, &lo, &l, &err) != DDP_OK) {
        ddp_sampler_destroy(s);
        return die(t, "data", err.msg);
    }
    uint64_t per_epoch = ddp_loader_batches_per_epoch(l) / (uint64_t)A;
    uint64_t total = (uint64_t)ddp_config_int(c, "total_steps");
    if (total == 0)
        total = per_epoch * (uint64_t)ddp_config_int(c, "epochs");
    float *dl = NULL;
    int rc = 0;
    if (ddp_loader_restore(l, &t->pos) != DDP_OK) {
        rc = die(t, "resume", ddp_loader_last_error(l));
        goto out;
    }
    t->epoch = t->pos.epoch;
    /* Augmentation draws are keyed by each sample's dataset index, not by seed + rank: every
     * rank still draws differently (its samples differ), and the draws do not depend on the
     * world size or on a resume. */
    ddp_augment aug = {.hflip = ddp_config_bool(c, "augment.hflip"),
                       .shift = (int)ddp_config_int(c, "augment.shift"),
                       .seed = seed ^ 0x61756731u};
    int side = (int)lround(sqrt((double)t->m.in_n));
    float b1 = 0.9f, b2 = 0.999f;
    sscanf(ddp_config_str(c, "betas"), "%f,%f", &b1, &b2);
    int64_t eval_every = ddp_config_int(c, "eval_every");
    int64_t log_every = ddp_config_int(c, "log_every");
    int64_t ck_every = ddp_config_int(c, "checkpoint.every");
    double clip = ddp_config_float(c, "grad_clip");
    float momentum = (float)ddp_config_float(c, "momentum");
    float wd = (float)ddp_config_float(c, "weight_decay");
    dl = malloc(sizeof(float) * (size_t)B * (size_t)t->m.classes);
    double t0 = ddp_now_seconds(), last_t = t0, win_sum = 0;
    int win_n = 0; /* the progress line shows the mean loss since the last one: a resumed run
                      prints what an uninterrupted one does */
    uint64_t first_step = t->step, last_step = t->step;
    while (t->step < total && !rc) {
        ddp_reducer_zero_grad(t->red);
        double loss = 0;
        bool epoch_end = false;
        for (int micro = 0; micro < A && !rc; micro++) {
            ddp_batch b;
            if (ddp_loader_next(l, &b) != DDP_OK) {
                rc = die(t, "data", ddp_loader_last_error(l));
                goto out;
            }
            if (b.n == 0) { /* next epoch */
                t->epoch++;
                ddp_loader_set_epoch(l, t->epoch);
                if (ddp_loader_next(l, &b) != DDP_OK || b.n == 0) {
                    rc = die(t, "data", "an epoch has no batch: batch_size too large?");
                    goto out;
                }
            }
            if ((aug.hflip || aug.shift) &&
                ddp_augment_images(&aug, b.x, b.n, 1, side, side,
                                   ddp_sampler_indices(s) + b.index * (uint64_t)B, b.epoch,
                                   &err) != DDP_OK) {
                rc = die(t, "augment", err.msg);
                goto out;
            }
            ddp_reducer_set_sync(t->red, micro == A - 1);
            uint64_t offset =
                ((t->step * (uint64_t)A + (uint64_t)micro) * (uint64_t)t->W + (uint64_t)t->R) *
                (uint64_t)B;
            const float *logits =
                model_forward(&t->m, b.x, (int)b.n, true, seed, t->step, offset, &err);
            double bl;
            int correct;
            if (!logits || ddp_nn_softmax_xent(logits, b.y, (int)b.n, t->m.classes, 1.0f / (float)A,
                                               &bl, dl, &correct, &err)) {
                rc = die(t, "forward", err.msg);
                goto out;
            }
            loss += bl / A;
            if (model_backward(&t->m, b.x, dl, (int)b.n, true, t->red) != DDP_OK) {
                rc = die(t, "backward", ddp_reducer_last_error(t->red));
                goto out;
            }
        }
        if (ddp_reducer_finish(t->red) != DDP_OK) {
            rc = die(t, "gradient allreduce", ddp_reducer_last_error(t->red));
            goto out;
        }
        /* The optimizer steps the elements whose mean gradient this rank holds: all of them, or
         * with shard_optimizer its 1/world shard, which gather_params then shares. */
        model *m = &t->m;
        float coef = 1.0f;
        if (clip > 0) {
            double norm;
            if (ddp_reducer_grad_norm(t->red, &norm) != DDP_OK) {
                rc = die(t, "gradient norm", ddp_reducer_last_error(t->red));
                goto out;
            }
            coef = ddp_nn_clip_coef(norm, clip);
        }
        double lr = lr_at(t, t->step, total);
        for (int i = 0; i < m->nparams; i++) {
            size_t from, to;
            ddp_reducer_shard(t->red, (size_t)i, &from, &to);
            float *p = (float *)m->params[i].data + from;
            float *g = (float *)ddp_reducer_grad(t->red, (size_t)i) + from;
            if (coef != 1.0f)
                for (size_t k = 0; k < to - from; k++)
                    g[k] *= coef;
            if (adamw(t))
                ddp_nn_adamw_step(p, g, t->opt_a[i] + from, t->opt_b[i] + from, to - from,
                                  (float)lr, b1, b2, 1e-8f, wd, t->step + 1);
            else
                ddp_nn_sgd_step(p, g, t->opt_a[i] + from, to - from, (float)lr, momentum, wd,
                                t->step + 1);
        }
        if (ddp_reducer_gather_params(t->red) != DDP_OK) {
            rc = die(t, "gathering parameters", ddp_reducer_last_error(t->red));
            goto out;
        }
        t->step++;
        ddp_loader_save(l, &t->pos);
        t->epoch = t->pos.epoch;
        /* The epoch ends when the next step would need a batch it does not have. */
        epoch_end = t->pos.next_batch + (uint64_t)A > ddp_loader_batches_per_epoch(l);
        /* The logged loss is all-reduced once per log window, not every step: a collective per
         * step would be one more point where every rank waits for the slowest. */
        win_sum += loss;
        win_n++;
        bool log_now = (log_every > 0 && (t->step % (uint64_t)log_every == 0)) || t->step == total;
        double mean = loss;
        if (log_now) {
            double local[2] = {win_sum, (double)win_n}, all[2];
            if (ddp_allreduce(t->g, local, all, 2, DDP_FLOAT64, DDP_SUM) != DDP_OK) {
                rc = die(t, "allreduce", ddp_group_last_error(t->g));
                goto out;
            }
            mean = all[0] / all[1];
            double now = ddp_now_seconds();
            double sps = (double)(t->step - last_step) * B * A * t->W / (now - last_t);
            double eta = (double)(total - t->step) * (now - t0) / (double)(t->step - first_step);
            if (t->R == 0 && t->jsonl)
                fprintf(t->jsonl,
                        "{\"step\": %llu, \"epoch\": %llu, \"loss\": %.6f, \"lr\": "
                        "%.6g, \"samples_per_s\": %.1f}\n",
                        (unsigned long long)t->step, (unsigned long long)t->epoch, mean, lr, sps);
            say(t,
                "step %llu/%llu | epoch %llu | loss %.4f | lr %.4g | %.0f samples/s | "
                "ETA %.1fs",
                (unsigned long long)t->step, (unsigned long long)total,
                (unsigned long long)t->epoch, mean, lr, sps, eta);
            last_t = now;
            last_step = t->step;
            win_sum = 0;
            win_n = 0;
        }
        bool do_eval = eval_every > 0 ? t->step % (uint64_t)eval_every == 0 : epoch_end;
        if (do_eval || t->step == total) {
            double el, ea;
            if (evaluate(t, te, &el, &ea, &err) != DDP_OK) {
                rc = die(t, "evaluation", err.msg);
                goto out;
            }
            say(t, "eval at step %llu: test loss %.4f, test accuracy %.4f (%zu images)",
                (unsigned long long)t->step, el, ea, ddp_dataset_len(te));
            if (t->R == 0 && t->jsonl)
                fprintf(t->jsonl,
                        "{\"step\": %llu, \"test_loss\": %.6f, \"test_accuracy\": "
                        "%.6f}\n",
                        (unsigned long long)t->step, el, ea);
            if (t->step == total)
                say(t, "test accuracy %.4f", ea);
        }
        if ((ck_every > 0 && t->step % (uint64_t)ck_every == 0) || t->step == total) {
            if (save_checkpoint(t, mean, &err) != DDP_OK) {
                rc = die(t, "checkpoint", err.msg);
                goto out;
            }
        }
        if (t->R == 0 && t->jsonl)
            fflush(t->jsonl);
    }
    say(t, "trained %llu steps in %.1f s", (unsigned long long)(t->step - first_step),
        ddp_now_seconds() - t0);
out:
    free(dl);
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    return rc;
}

static int predict(trainer *t, ddp_dataset *te)
{
    ddp_error err = {0};
    if (t->R == 0) {
        const char *out = ddp_config_str(t->cfg, "predict_out");
        FILE *f = fopen(out, "w");
        if (!f)
            return die(t, "predict", strerror(errno));
        fprintf(f, "index,label,prediction\n");
        float *x = malloc(sizeof(float) * t->m.in_n * (size_t)t->m.B);
        int32_t *y = malloc(sizeof(int32_t) * (size_t)t->m.B);
        size_t n = ddp_dataset_len(te);
        for (size_t i0 = 0; i0 < n; i0 += (size_t)t->m.B) {
            int nb = (int)(n - i0 < (size_t)t->m.B ? n - i0 : (size_t)t->m.B);
            for (int k = 0; k < nb; k++)
                ddp_dataset_get(te, i0 + (size_t)k, x + (size_t)k * t->m.in_n, y + k);
            const float *lg = model_forward(&t->m, x, nb, false, 0, 0, 0, &err);
            if (!lg) {
                free(x);
                free(y);
                fclose(f);
                return die(t, "predict", err.msg);
            }
            for (int k = 0; k < nb; k++) {
                int best = 0;
                for (int j = 1; j < t->m.classes; j++)
                    if (lg[k * t->m.classes + j] > lg[k * t->m.classes + best])
                        best = j;
                fprintf(f, "%zu,%d,%d\n", i0 + (size_t)k, y[k], best);
            }
        }
        free(x);
        free(y);
        if (fclose(f) != 0)
            return die(t, "predict", strerror(errno));
        say(t, "wrote %zu predictions to %s", n, out);
    }
    return ddp_barrier(t->g) == DDP_OK ? 0 : die(t, "predict", ddp_group_last_error(t->g));
}

int main(int argc, char **argv)
{
    trainer t;
    memset(&t, 0, sizeof t);
    const char *cfg_path = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: [ddprun …] ddptrain [--config FILE.yaml] [--key value …]\n"
                   "Every key below can be set in the YAML file (nested maps for dotted keys)\n"
                   "and overridden on the command line.\n");
            ddp_config_print_help(schema, NKEYS, stdout);
            free(rest);
            return 0;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            cfg_path = argv[++i];
        else if (!strncmp(argv[i], "--config=", 9))
            cfg_path = argv[i] + 9;
        else
            rest[nrest++] = argv[i];
    }
    ddp_error err = {0};
    int rc = 2;
    ddp_dataset *tr = NULL, *te = NULL;
    /* Everything about the configuration is checked before any work starts. */
    if (ddp_config_load(schema, NKEYS, cfg_path, nrest, rest, &t.cfg, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        goto out;
    }
    ddp_config *c = t.cfg;
    int B = (int)ddp_config_int(c, "batch_size");
    if (B < 1 || ddp_config_int(c, "grad_accum") < 1 || ddp_config_float(c, "lr") <= 0 ||
        ddp_config_int(c, "epochs") < 0 || ddp_config_int(c, "data.threads") < -1) {
        fprintf(stderr, "ddptrain: batch_size and grad_accum must be ≥ 1, lr > 0, epochs ≥ 0, "
                        "data.threads ≥ -1\n");
        goto out;
    }
    /* The environment, read once: who runs, and the DDP_* settings of the group, the reducer and
     * the data cache. */
    ddp_world world;
    if (ddp_world_from_env(&world, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    const char *task = ddp_config_str(c, "task"), *dir = ddp_config_str(c, "data.dir");
    const char *cache = world.settings.data_cache;
    if ((!strcmp(task, "train") && open_split(dir, "train", cache, &tr, &err)) ||
        open_split(dir, "t10k", cache, &te, &err)) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        goto out;
    }
    size_t pix = ddp_dataset_x_elems(te);
    int side = (int)lround(sqrt((double)pix));
    if (ddp_config_int(c, "augment.shift") < 0 || ddp_config_int(c, "augment.shift") >= side) {
        fprintf(stderr,
                "ddptrain: augment.shift %lld must be from 0 to %d (the images are %d × %d)\n",
                (long long)ddp_config_int(c, "augment.shift"), side - 1, side, side);
        goto out; /* exit 2: a configuration error */
    }
    rc = 1;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.world = &world;
    if (ddp_group_init(&go, &t.g, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        goto out;
    }
    t.W = ddp_group_size(t.g);
    t.R = ddp_group_rank(t.g);
    snprintf(t.dir, sizeof t.dir, "%s", ddp_config_str(c, "out_dir"));
    if (t.R == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "%s", t.dir);
        for (char *p = cmd + 1; *p; p++)
            if (*p == '/') {
                *p = '\0';
                mkdir(cmd, 0755);
                *p = '/';
            }
        mkdir(cmd, 0755);
        char path[1300];
        snprintf(path, sizeof path, "%s/train.log", t.dir);
        t.log = fopen(path, "a");
        snprintf(path, sizeof path, "%s/metrics.jsonl", t.dir);
        t.jsonl = fopen(path, "a");
    }
    size_t nh, nc;
    const int64_t *hidden = ddp_config_ints(c, "model.hidden", &nh);
    const int64_t *chans = ddp_config_ints(c, "model.channels", &nc);
    int classes = ddp_dataset_classes(te) > 0 ? ddp_dataset_classes(te) : 10;
    model_spec ms = {.type = ddp_config_str(c, "model.type"),
                     .hidden = hidden,
                     .nh = nh,
                     .channels = chans,
                     .nc = nc,
                     .dropout = (float)ddp_config_float(c, "model.dropout"),
                     .activation = ddp_config_str(c, "model.activation")};
    if (model_build(&t.m, &ms, 1, side, side, classes, B, (uint64_t)ddp_config_int(c, "seed"),
                    &err) != DDP_OK) {
        rc = die(&t, "model", err.msg);
        goto out;
    }
    t.opt_a = calloc((size_t)t.m.nparams, sizeof *t.opt_a);
    t.opt_b = calloc((size_t)t.m.nparams, sizeof *t.opt_b);
    for (int i = 0; i < t.m.nparams; i++) {
        t.opt_a[i] = calloc(t.m.params[i].count, sizeof(float));
        t.opt_b[i] = calloc(t.m.params[i].count, sizeof(float));
    }
    /* Resume (train) or load (test, predict): rank 0 reads, everyone gets it by broadcast. */
    const char *spec =
        !strcmp(task, "train") ? ddp_config_str(c, "resume_from") : ddp_config_str(c, "checkpoint");
    uint64_t meta[4] = {0, 0, 0, (uint64_t)t.W}; /* step, epoch, next_batch, world_size */
    int64_t loaded = 0;
    if (*spec && t.R == 0) {
        char path[2048];
        if (find_checkpoint(&t, spec, path, sizeof path, &err) != DDP_OK ||
            load_checkpoint(&t, path, meta, &err) != DDP_OK) {
            fprintf(stderr, "ddptrain: %s\n", err.msg);
            loaded = -1;
        } else {
            loaded = 1;
            say(&t, "resumed from %s at step %llu (saved by %llu ranks)", path,
                (unsigned long long)meta[0], (unsigned long long)meta[3]);
        }
    }
    if (ddp_broadcast(t.g, &loaded, 1, DDP_INT64, 0) != DDP_OK || loaded < 0)
        goto out;
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    const char *ov = ddp_config_str(c, "overlap");
    ro.overlap = !strcmp(ov, "async")    ? DDP_OVERLAP_ASYNC
                 : !strcmp(ov, "inline") ? DDP_OVERLAP_INLINE
                                         : DDP_OVERLAP_AUTO;
    ro.compress_bf16 = ddp_config_bool(c, "compress_bf16");
    const char *shard = ddp_config_str(c, "shard_optimizer");
    ro.shard_optimizer = !strcmp(shard, "true") ||
                         (!strcmp(shard, "auto") && strcmp(ddp_group_backend(t.g), "shm+tcp") != 0);
    if (ddp_config_int(c, "bucket_kb") > 0)
        ro.bucket_cap = ro.first_bucket = (size_t)ddp_config_int(c, "bucket_kb") << 10;
    if (ddp_reducer_create(t.g, t.m.params, (size_t)t.m.nparams, t.m.buffers, (size_t)t.m.nbuffers,
                           &ro, &t.red, &err) != DDP_OK) {
        rc = die(&t, "reducer", err.msg);
        goto out;
    }
    for (int i = 0; i < t.m.nparams; i++) { /* sharded, the parameters live in the reducer */
        t.m.params[i].data = ddp_reducer_param(t.red, (size_t)i);
        if (t.m.params[i].data != t.m.own[i]) {
            free(t.m.own[i]);
            t.m.own[i] = NULL;
        }
    }
    if (loaded) { /* optimizer state and position, from rank 0 */
        for (int i = 0; i < t.m.nparams; i++)
            if (ddp_broadcast(t.g, t.opt_a[i], t.m.params[i].count, DDP_FLOAT32, 0) ||
                ddp_broadcast(t.g, t.opt_b[i], t.m.params[i].count, DDP_FLOAT32, 0)) {
                rc = die(&t, "resume", ddp_group_last_error(t.g));
                goto out;
            }
        if (ddp_broadcast(t.g, meta, 4, DDP_INT64, 0)) {
            rc = die(&t, "resume", ddp_group_last_error(t.g));
            goto out;
        }
        t.step = meta[0];
        t.pos.epoch = meta[1];
        /* Another world size: continue after the same number of samples in the epoch. */
        t.pos.next_batch = meta[2] * meta[3] / (uint64_t)t.W;
    }
    int A = (int)ddp_config_int(c, "grad_accum");
    say(&t,
        "DDP: %d process%s (%s), device cpu, per-rank batch %d, grad accumulation %d, "
        "effective batch %d",
        t.W, t.W == 1 ? "" : "es", ddp_group_backend(t.g), B, A, B * t.W * A);
    if (!strcmp(task, "train")) {
        rc = train(&t, tr, te);
    } else if (!strcmp(task, "test")) {
        double el, ea;
        rc = evaluate(&t, te, &el, &ea, &err) != DDP_OK ? die(&t, "test", err.msg) : 0;
        if (!rc)
            say(&t, "test loss %.4f, test accuracy %.4f (%zu images)", el, ea, ddp_dataset_len(te));
    } else {
        rc = predict(&t, te);
    }
out:
    for (int i = 0; t.opt_a && i < t.m.nparams; i++) {
        free(t.opt_a[i]);
        free(t.opt_b[i]);
    }
    free(t.opt_a);
    free(t.opt_b);
    ddp_reducer_destroy(t.red);
    model_free(&t.m);
    ddp_group_destroy(t.g);
    ddp_dataset_close(tr);
    ddp_dataset_close(te);
    ddp_config_free(t.cfg);
    free(rest);
    if (t.log)
        fclose(t.log);
    if (t.jsonl)
        fclose(t.jsonl);
    return rc;
}
