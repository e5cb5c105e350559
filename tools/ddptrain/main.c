/*
 * ddptrain — the trainer: `ddprun --nproc_per_node=2 ddptrain [--config X.yaml] [--key value …]`.
 *
 * Tasks: train (with evaluation and checkpoints), test (evaluate a checkpoint), predict (write a
 * checkpoint's predictions to CSV). Data: Fashion-MNIST / MNIST IDX files. Models: the library's
 * (ddp/model.h: an MLP or a small CNN), optimizer and schedule (ddp/optim.h). Everything
 * distributed goes through the public API: the group, the reducer (gradient buckets during
 * backward), the sampler and loader, the checkpoint module. Rank 0 alone logs and writes
 * checkpoints; the others wait at a barrier.
 *
 * This file holds the configuration and the wiring: it checks the config before any work, joins
 * the group, builds the model and optimizer, resumes, wraps the model in the reducer and runs
 * the task (train.c, eval.c; checkpoints in checkpoint.c).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddptrain.h"

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

/* ---- messages ------------------------------------------------------------------------------ */

void trainer_say(trainer *t, const char *fmt, ...)
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

int trainer_die(trainer *t, const char *what, const char *msg)
{
    fprintf(stderr, "ddptrain: rank %d: %s: %s\n", t->R, what, msg);
    return 1;
}

/* ---- setting up ------------------------------------------------------------------------------ */

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

/* Rank 0: out_dir (with its parents), train.log and metrics.jsonl, appended to. */
static void open_logs(trainer *t)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", t->dir);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    mkdir(dir, 0755);
    char path[1300];
    snprintf(path, sizeof path, "%s/train.log", t->dir);
    t->log = fopen(path, "a");
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->dir);
    t->jsonl = fopen(path, "a");
}

/* The model of model.*, for side × side images, and its optimizer. */
static int build_model(trainer *t)
{
    ddp_config *c = t->cfg;
    ddp_error err = {0};
    ddp_model_spec ms = DDP_MODEL_SPEC_INIT;
    ms.type = ddp_config_str(c, "model.type");
    ms.max_batch = t->B;
    ms.seed = (uint64_t)ddp_config_int(c, "seed");
    ms.in_ch = 1;
    ms.in_h = ms.in_w = t->side;
    ms.classes = t->classes;
    ms.hidden = ddp_config_ints(c, "model.hidden", &ms.n_hidden);
    ms.channels = ddp_config_ints(c, "model.channels", &ms.n_channels);
    ms.dropout = (float)ddp_config_float(c, "model.dropout");
    ms.activation = ddp_config_str(c, "model.activation");
    if (ddp_model_build(&ms, &t->m, &err) != DDP_OK)
        return trainer_die(t, "model", err.msg);
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = !strcmp(ddp_config_str(c, "optimizer"), "adamw") ? DDP_OPTIM_ADAMW : DDP_OPTIM_SGD;
    oo.momentum = (float)ddp_config_float(c, "momentum");
    oo.weight_decay = (float)ddp_config_float(c, "weight_decay");
    sscanf(ddp_config_str(c, "betas"), "%f,%f", &oo.beta1, &oo.beta2);
    size_t np;
    const ddp_model_param *p = ddp_model_params(t->m, &np);
    if (ddp_optim_create(&oo, p, np, &t->opt, &err) != DDP_OK)
        return trainer_die(t, "optimizer", err.msg);
    return 0;
}

/* The reducer's view of a parameter list: the same names, counts and values. */
static ddp_param *reducer_view(const ddp_model_param *p, size_t n)
{
    ddp_param *v = calloc(n ? n : 1, sizeof *v);
    for (size_t i = 0; v && i < n; i++)
        v[i] = (ddp_param){p[i].name, p[i].count, DDP_FLOAT32, p[i].data, DDP_DEVICE_CPU};
    return v;
}

/* Wraps the model in the reducer (which broadcasts rank 0's values), then moves the model's
 * gradients into the reducer's buckets, and its parameters too when the optimizer is sharded. */
static int wrap_model(trainer *t)
{
    ddp_config *c = t->cfg;
    ddp_error err = {0};
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    const char *ov = ddp_config_str(c, "overlap");
    ro.overlap = !strcmp(ov, "async")    ? DDP_OVERLAP_ASYNC
                 : !strcmp(ov, "inline") ? DDP_OVERLAP_INLINE
                                         : DDP_OVERLAP_AUTO;
    ro.compress_bf16 = ddp_config_bool(c, "compress_bf16");
    const char *shard = ddp_config_str(c, "shard_optimizer");
    ro.shard_optimizer =
        !strcmp(shard, "true") ||
        (!strcmp(shard, "auto") && strcmp(ddp_group_backend(t->g), "shm+tcp") != 0);
    if (ddp_config_int(c, "bucket_kb") > 0)
        ro.bucket_cap = ro.first_bucket = (size_t)ddp_config_int(c, "bucket_kb") << 10;
    size_t np, nb;
    const ddp_model_param *p = ddp_model_params(t->m, &np);
    const ddp_model_param *b = ddp_model_buffers(t->m, &nb);
    if (!(t->rparams = reducer_view(p, np)) || !(t->rbuffers = reducer_view(b, nb)))
        return trainer_die(t, "reducer", "out of memory");
    if (ddp_reducer_create(t->g, t->rparams, np, t->rbuffers, nb, &ro, &t->red, &err) != DDP_OK)
        return trainer_die(t, "reducer", err.msg);
    for (size_t i = 0; i < np; i++)
        ddp_model_bind(t->m, i, ddp_reducer_param(t->red, i), ddp_reducer_grad(t->red, i));
    return 0;
}

/* ---- the program ------------------------------------------------------------------------------
 */

/* Everything about the configuration is checked before any work starts: exit code 2 (1 when
 * the environment is wrong). */
static int configure(trainer *t, const char *cfg_path, int nrest, char **rest, ddp_dataset **tr,
                     ddp_dataset **te)
{
    ddp_error err = {0};
    if (ddp_config_load(schema, NKEYS, cfg_path, nrest, rest, &t->cfg, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        return 2;
    }
    ddp_config *c = t->cfg;
    t->B = (int)ddp_config_int(c, "batch_size");
    if (t->B < 1 || ddp_config_int(c, "grad_accum") < 1 || ddp_config_float(c, "lr") <= 0 ||
        ddp_config_int(c, "epochs") < 0 || ddp_config_int(c, "data.threads") < -1) {
        fprintf(stderr, "ddptrain: batch_size and grad_accum must be ≥ 1, lr > 0, epochs ≥ 0, "
                        "data.threads ≥ -1\n");
        return 2;
    }
    /* The environment, read once: who runs, and the DDP_* settings of the group, the reducer and
     * the data cache. */
    if (ddp_world_from_env(&t->world, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        return 1;
    }
    const char *task = ddp_config_str(c, "task"), *dir = ddp_config_str(c, "data.dir");
    const char *cache = t->world.settings.data_cache;
    if ((!strcmp(task, "train") && open_split(dir, "train", cache, tr, &err)) ||
        open_split(dir, "t10k", cache, te, &err)) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        return 2;
    }
    t->side = (int)lround(sqrt((double)ddp_dataset_x_elems(*te)));
    t->classes = ddp_dataset_classes(*te) > 0 ? ddp_dataset_classes(*te) : 10;
    int64_t shift = ddp_config_int(c, "augment.shift");
    if (shift < 0 || shift >= t->side) {
        fprintf(stderr,
                "ddptrain: augment.shift %lld must be from 0 to %d (the images are %d × %d)\n",
                (long long)shift, t->side - 1, t->side, t->side);
        return 2;
    }
    return 0;
}

static int run_task(trainer *t, ddp_dataset *tr, ddp_dataset *te)
{
    const char *task = ddp_config_str(t->cfg, "task");
    if (!strcmp(task, "train"))
        return trainer_train(t, tr, te);
    if (!strcmp(task, "predict"))
        return trainer_predict(t, te);
    ddp_error err = {0};
    double el, ea;
    if (trainer_evaluate(t, te, &el, &ea, &err) != DDP_OK)
        return trainer_die(t, "test", err.msg);
    trainer_say(t, "test loss %.4f, test accuracy %.4f (%zu images)", el, ea, ddp_dataset_len(te));
    return 0;
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
    ddp_dataset *tr = NULL, *te = NULL;
    int rc = configure(&t, cfg_path, nrest, rest, &tr, &te);
    if (rc)
        goto out;
    rc = 1;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.world = &t.world;
    if (ddp_group_init(&go, &t.g, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        goto out;
    }
    t.W = ddp_group_size(t.g);
    t.R = ddp_group_rank(t.g);
    snprintf(t.dir, sizeof t.dir, "%s", ddp_config_str(t.cfg, "out_dir"));
    if (t.R == 0)
        open_logs(&t);
    if ((rc = build_model(&t)))
        goto out;
    /* Resume (train) or load (test, predict): rank 0 reads, everyone gets it by broadcast. */
    const char *task = ddp_config_str(t.cfg, "task");
    const char *spec = !strcmp(task, "train") ? ddp_config_str(t.cfg, "resume_from")
                                              : ddp_config_str(t.cfg, "checkpoint");
    bool loaded = false;
    ddp_ckpt_train_pos pos = {0, 0, 0, (uint64_t)t.W};
    if ((rc = trainer_load(&t, spec, &loaded, &pos)) || (rc = wrap_model(&t)) ||
        (loaded && (rc = trainer_share_loaded(&t, &pos))))
        goto out;
    int A = (int)ddp_config_int(t.cfg, "grad_accum");
    trainer_say(&t,
                "DDP: %d process%s (%s), device cpu, per-rank batch %d, grad accumulation %d, "
                "effective batch %d",
                t.W, t.W == 1 ? "" : "es", ddp_group_backend(t.g), t.B, A, t.B * t.W * A);
    rc = run_task(&t, tr, te);
out:
    ddp_reducer_destroy(t.red);
    free(t.rparams);
    free(t.rbuffers);
    ddp_optim_destroy(t.opt);
    ddp_model_free(t.m);
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
