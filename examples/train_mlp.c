/*
 * train_mlp — the library's own model, optimizer and schedule in a data-parallel training loop
 * of about a hundred lines: what ddptrain does, without its configuration, logs and evaluation.
 *
 *   ./build/bin/train_mlp [DATA_DIR [STEPS [CHECKPOINT]]]
 *   ./build/bin/ddprun --nproc_per_node=2 ./build/bin/train_mlp /usr/share/datasets/fashion-mnist
 *
 * Trains an MLP (784 → 128 → 10) with AdamW and a cosine schedule on Fashion-MNIST
 * (DATA_DIR/train-{images-idx3,labels-idx1}-ubyte.gz), prints the loss every 50 steps and, with
 * CHECKPOINT, has rank 0 save the trainer state there at the end (loadable by ddptrain's
 * checkpoint code and by PyTorch). Where examples/ddp_mlp.c writes its model by hand, this one
 * takes ddp/model.h's: see docs/nn.md.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

/* Backward marks each parameter's gradient ready with the reducer, which may start its
 * bucket's allreduce while backward goes on. */
static ddp_status mark_ready(void *red, size_t i)
{
    return ddp_reducer_mark_ready(red, i);
}

/* A checkpoint's optimizer state arriving in pieces on rank 0 (ddp_reducer_gather_state_sink):
 * elements [first, first + count) of parameter i's state k, written where they belong. */
typedef struct sink_ctx {
    ddp_ckpt_writer *w;
    const ddp_ckpt_train_state *st;
    int k;
    ddp_error *err;
    ddp_status failed; /* the first write that failed (a full disk): rank 0 alone knows it */
} sink_ctx;

/* A failed write is kept and the later pieces dropped, but the sink never refuses one: the other
 * ranks would not learn of it, and they go on with the next state's gather, which rank 0 must
 * make with them. Rank 0 tells them after the last one. */
static ddp_status put_piece(void *ctx, size_t i, size_t first, const void *data, size_t count)
{
    sink_ctx *c = ctx;
    if (!c->failed)
        c->failed = ddp_ckpt_writer_put(c->w, ddp_ckpt_train_tensor(c->st, i, c->k),
                                        first * sizeof(float), data, count * sizeof(float), c->err);
    return DDP_OK;
}

/* The next batch, starting the next epoch when this one is used up. */
static ddp_status next_batch(ddp_loader *l, uint64_t *epoch, ddp_batch *b)
{
    ddp_status st = ddp_loader_next(l, b);
    if (st == DDP_OK && b->n == 0) {
        ddp_loader_set_epoch(l, ++*epoch);
        st = ddp_loader_next(l, b);
    }
    return st;
}

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "train_mlp: %s: %s\n", what, msg);
    return 1;
}

int main(int argc, char **argv)
{
    /* A file-size limit (ulimit -f) then fails the checkpoint's write with EFBIG, which the
     * library's message names with the file, removing its temporary file, as in ddptrain; by
     * default SIGXFSZ ended the program with no word and left that file behind. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc > 1 && argv[1][0] == '-') { /* --help, or a flag this program does not take */
        bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        fprintf(help ? stdout : stderr,
                "%susage: train_mlp [DATA_DIR [STEPS [CHECKPOINT]]]\n"
                "  DATA_DIR    Fashion-MNIST's train-{images-idx3,labels-idx1}-ubyte.gz "
                "(default /usr/share/datasets/fashion-mnist)\n"
                "  STEPS       training steps (default 300)\n"
                "  CHECKPOINT  where rank 0 saves the trainer state at the end\n"
                "  data-parallel: ddprun --nproc_per_node=2 train_mlp [ARGS]\n",
                help ? "" : "train_mlp: takes no flags\n");
        return help ? 0 : 2;
    }
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    uint64_t steps = 300;
    if (argc > 2) { /* "-5" would wrap to 2^64 − 5 steps, "abc" be 0: refuse both */
        char *end;
        steps = strtoull(argv[2], &end, 10);
        if (argv[2][0] < '0' || argv[2][0] > '9' || *end || steps < 1 || steps > 1000000000) {
            fprintf(stderr, "train_mlp: STEPS '%s' is not a number of steps from 1 to 10^9\n",
                    argv[2]);
            return 2;
        }
    }
    const char *ckpt = argc > 3 ? argv[3] : NULL;
    enum { B = 64 };
    ddp_error err = {0};
    ddp_group *g = NULL;
    ddp_dataset *ds = NULL;
    ddp_sampler *s = NULL;
    ddp_loader *l = NULL;
    ddp_model *m = NULL;
    ddp_optim *opt = NULL;
    ddp_reducer *red = NULL;
    size_t *keep_lo = NULL, *keep_hi = NULL;
    ddp_param *rp = NULL;
    int rc = 1;
    char im[1024], lb[1024];
    snprintf(im, sizeof im, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte.gz", dir);
    if (ddp_group_init(NULL, &g, &err) ||
        ddp_dataset_open_idx(im, lb, ddp_group_world(g)->settings.data_cache, &ds, &err)) {
        rc = fail("setup", err.msg);
        goto out;
    }
    /* Each rank its share of the data (torch's DistributedSampler), prefetched. */
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(ds);
    so.num_replicas = ddp_group_size(g);
    so.rank = ddp_group_rank(g);
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = B;
    if (ddp_sampler_create(&so, &s, &err) || ddp_loader_create(ds, s, &lo, &l, &err)) {
        rc = fail("data", err.msg);
        goto out;
    }
    /* The model and its optimizer, over the model's parameter list. */
    ddp_model_spec ms = DDP_MODEL_SPEC_INIT; /* mlp for 1 × 28 × 28 images, 10 classes */
    ms.hidden = (const int64_t[]){128};
    ms.n_hidden = 1;
    ms.max_batch = B;
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    oo.weight_decay = 0.01f;
    if (ddp_model_build(&ms, &m, &err)) {
        rc = fail("model", err.msg);
        goto out;
    }
    size_t np;
    const ddp_model_param *p = ddp_model_params(m, &np);
    if (ddp_optim_create(&oo, p, np, &opt, &err)) {
        rc = fail("optimizer", err.msg);
        goto out;
    }
    /* DDP: the reducer checks every rank has this model and broadcasts rank 0's weights; the
     * model's gradients (and, with a sharded step, its weights) then live in its buckets. */
    if (!(rp = calloc(np, sizeof *rp)) || !(keep_lo = calloc(np, sizeof(size_t))) ||
        !(keep_hi = calloc(np, sizeof(size_t))))
        goto out;
    for (size_t i = 0; i < np; i++)
        rp[i] = (ddp_param){p[i].name, p[i].count, DDP_FLOAT32, p[i].data, DDP_DEVICE_CPU};
    /* ZeRO-1: each rank steps its shard of every parameter and keeps the optimizer state of
     * that shard only (1/world of it); with one rank the shard is everything. */
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    ro.shard_optimizer = true;
    if (ddp_reducer_create(g, rp, np, NULL, 0, &ro, &red, &err)) {
        rc = fail("reducer", err.msg);
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        ddp_model_bind(m, i, ddp_reducer_param(red, i), ddp_reducer_grad(red, i));
        ddp_reducer_shard(red, i, &keep_lo[i], &keep_hi[i]);
    }
    if (ddp_optim_keep(opt, keep_lo, keep_hi)) {
        rc = fail("optimizer", ddp_optim_last_error(opt));
        goto out;
    }
    ddp_lr_schedule ls = DDP_LR_SCHEDULE_INIT;
    ls.lr = 1e-3;
    ls.warmup_steps = 20;
    ls.total_steps = steps;
    uint64_t epoch = 0;
    for (uint64_t step = 0; step < steps; step++) {
        ddp_batch b;
        if (next_batch(l, &epoch, &b)) {
            rc = fail("data", ddp_loader_last_error(l));
            goto out;
        }
        ddp_reducer_zero_grad(red);
        ddp_model_batch mb = {.n = (int)b.n, .x = b.x, .labels = b.y, .step = step};
        ddp_model_out out;
        if (ddp_model_forward(m, &mb, true, &out) || ddp_model_backward(m, mark_ready, red)) {
            rc = fail("step", ddp_model_last_error(m));
            goto out;
        }
        if (ddp_reducer_finish(red)) { /* gradients are now the mean over ranks */
            rc = fail("allreduce", ddp_reducer_last_error(red));
            goto out;
        }
        float lr = (float)ddp_lr_at(&ls, step);
        for (size_t i = 0; i < np; i++) { /* this rank's shard: all of it unless sharded */
            size_t lo_i, hi_i;
            ddp_reducer_shard(red, i, &lo_i, &hi_i);
            if (ddp_optim_step_range(opt, i, lo_i, hi_i, step + 1, lr, 1.0f)) {
                rc = fail("optimizer", ddp_optim_last_error(opt));
                goto out;
            }
        }
        if (ddp_reducer_gather_params(red)) {
            rc = fail("gather", ddp_reducer_last_error(red));
            goto out;
        }
        if (ddp_group_rank(g) == 0 && ((step + 1) % 50 == 0 || step + 1 == steps))
            printf("step %llu: loss %.4f (rank 0's batch), lr %.3g\n", (unsigned long long)step + 1,
                   out.loss, lr);
    }
    /* Rank 0 saves: every rank holds the same weights; the optimizer's state, one shard per
     * rank, goes from every rank into rank 0's file piece by piece (put_piece), so no rank
     * ever holds all of it. Every rank must take part in the gathers. */
    bool root = ddp_group_rank(g) == 0;
    ddp_ckpt_train_state st = {.params = p, .n_params = np};
    st.n_optim = ckpt ? ddp_optim_num_states(opt) : 0;
    for (int k = 0; k < st.n_optim; k++)
        st.optim_names[k] = ddp_optim_state_name(opt, k); /* optim[k] NULL: put later */
    st.pos = (ddp_ckpt_train_pos){steps, 0, 0, (uint64_t)ddp_group_size(g), steps, 0.0f, 0};
    sink_ctx sc = {NULL, &st, 0, &err, DDP_OK};
    int32_t opened = ckpt && (!root || ddp_ckpt_open_train(ckpt, &st, &sc.w, &err) == DDP_OK);
    if (ckpt && ddp_broadcast(g, &opened, 1, DDP_INT32, 0) == DDP_OK && !opened)
        rc = fail("checkpoint", root ? err.msg : "rank 0 could not open the file");
    for (int k = 0; ckpt && opened && k < st.n_optim; k++) {
        sc.k = k;
        if (ddp_reducer_gather_state_sink(red, 0, (const void *const *)ddp_optim_state(opt, k),
                                          root ? put_piece : NULL, &sc)) {
            rc = fail("checkpoint", ddp_reducer_last_error(red));
            ddp_ckpt_writer_abort(sc.w);
            goto out;
        }
    }
    if (ckpt && opened) { /* rank 0 commits (or removes the file) and tells the others */
        int32_t saved = 1;
        if (root && sc.failed) {
            ddp_ckpt_writer_abort(sc.w);
            saved = 0;
        } else if (root)
            saved = ddp_ckpt_writer_commit(sc.w, &err) == DDP_OK;
        if (root && saved)
            printf("saved %s\n", ckpt);
        if (ddp_broadcast(g, &saved, 1, DDP_INT32, 0)) {
            rc = fail("checkpoint", ddp_group_last_error(g));
            goto out;
        }
        if (!saved) {
            rc = fail("checkpoint", root ? err.msg : "rank 0 could not save the file");
            goto out;
        }
    }
    if (ckpt && !opened)
        goto out;
    rc = ddp_barrier(g) ? fail("barrier", ddp_group_last_error(g)) : 0;
out:
    free(keep_lo);
    free(keep_hi);
    ddp_reducer_destroy(red);
    free(rp);
    ddp_optim_destroy(opt);
    ddp_model_free(m);
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    ddp_dataset_close(ds);
    /* Stopped by another rank's failure: say so with the exit code, so that ddprun names the
     * rank that failed first-hand (docs/ddprun.md, "Failures"). */
    if (rc && g && ddp_group_peer_failed(g))
        rc = DDP_EXIT_PEER_FAILED;
    ddp_group_destroy(g);
    return rc;
}
