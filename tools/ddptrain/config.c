/*
 * config.c — ddptrain's keys, and where their values come from. Training: the defaults, the
 * --config file, the command line (ddp/config.h). test and predict start from the configuration
 * stored in the checkpoint instead of the defaults, so the model is rebuilt as it was trained
 * (its type, sizes, optimizer — whatever the weights and state need) without repeating the
 * training run's flags; a --config file and the command line still win over it.
 * What the keys mean is decided where they are used (main.c, data.c, train.c, …).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddptrain.h"

static const ddp_cfg_key schema[] = {
    {"task", DDP_CFG_CHOICE, "train", "train|test|predict|report",
     "what to do (test and predict rebuild the model from the checkpoint's stored config; "
     "report: out_dir/metrics.jsonl into out_dir/report.html)"},
    {"seed", DDP_CFG_INT, "42", NULL,
     "seed of weights, data order, dropout and (predict) generation"},
    {"out_dir", DDP_CFG_STRING, "runs/default", NULL,
     "train.log, metrics.jsonl, checkpoints/ (a new run is refused where checkpoints/ holds "
     "newer ones: resume them, or choose another)"},
    {"data.dir", DDP_CFG_STRING, "/usr/share/datasets/fashion-mnist", NULL,
     "mlp/cnn: directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"},
    {"data.train", DDP_CFG_STRING, "", NULL,
     "gpt: training token file (nanoGPT raw uint16, or an llm.c shard)"},
    {"data.val", DDP_CFG_STRING, "", NULL, "gpt: validation token file"},
    {"data.text", DDP_CFG_STRING, "", NULL,
     "gpt, when data.train is empty: text files or folders (comma-separated) made into "
     "byte-level token files once per host (vocab 256)"},
    {"data.doc_sep", DDP_CFG_STRING, "", NULL,
     "data.text: a line that ends a document (fortune files: %); empty: one per file"},
    {"data.val_every", DDP_CFG_INT, "10", NULL,
     "data.text: every Nth document goes to the validation file"},
    {"data.sampling", DDP_CFG_CHOICE, "random", "random|epoch",
     "gpt: random windows each step (nanoGPT), or epochs of fixed windows (DistributedSampler)"},
    {"data.threads", DDP_CFG_INT, "-1", NULL,
     "loader threads per rank; 0: load on the training thread; -1: 1 if the host has a core to "
     "spare for each rank, else 0"},
    {"model.type", DDP_CFG_CHOICE, "mlp", "mlp|cnn|gpt", "the model"},
    {"model.hidden", DDP_CFG_INT_LIST, "256,128", NULL, "mlp/cnn: fully connected hidden sizes"},
    {"model.channels", DDP_CFG_INT_LIST, "32,64", NULL, "cnn: conv stage channels"},
    {"model.dropout", DDP_CFG_FLOAT, "0", NULL,
     "mlp/cnn: after each hidden layer; gpt: embeddings, attention, residual branches"},
    {"model.activation", DDP_CFG_CHOICE, "relu", "relu|gelu",
     "mlp/cnn: after each hidden layer (gelu: exact, as torch.nn.GELU())"},
    {"model.n_layer", DDP_CFG_INT, "4", NULL, "gpt: transformer blocks"},
    {"model.n_head", DDP_CFG_INT, "4", NULL, "gpt: attention heads (divides n_embd)"},
    {"model.n_embd", DDP_CFG_INT, "128", NULL, "gpt: channels"},
    {"model.block_size", DDP_CFG_INT, "128", NULL, "gpt: context length, tokens per sample"},
    {"model.vocab_size", DDP_CFG_INT, "256", NULL,
     "gpt: token ids are below it (256: bytes; GPT-2 BPE: 50304, 50257 padded)"},
    {"model.bias", DDP_CFG_BOOL, "true", NULL, "gpt: biases in linear layers and layernorms"},
    {"device", DDP_CFG_CHOICE, "cpu", "cpu|cuda|auto",
     "where to compute: cuda uses GPU LOCAL_RANK mod visible GPUs (every model; docs/gpu.md), "
     "auto the GPU if there is one, else the CPU"},
    {"precision", DDP_CFG_CHOICE, "fp32", "fp32|tf32|bf16|fp16",
     "matrix arithmetic: tf32 and fp16 need device cuda, bf16 cuda or a CPU with bf16 units"},
    {"mfu_peak_tflops", DDP_CFG_FLOAT, "0", NULL,
     "the per-rank peak MFU is measured against (0: a GPU's dense peak from the table, a "
     "CPU's measured at start)"},
    {"augment.hflip", DDP_CFG_BOOL, "false", NULL, "train: flip images left-right, p = 1/2"},
    {"augment.shift", DDP_CFG_INT, "0", NULL,
     "train: shift images by up to N pixels, zero fill (RandomCrop padding=N)"},
    {"batch_size", DDP_CFG_INT, "64", NULL, "samples (gpt: windows) per rank per micro-step"},
    {"grad_accum", DDP_CFG_INT, "1", NULL, "micro-steps per optimizer step (no_sync between)"},
    {"epochs", DDP_CFG_INT, "10", NULL,
     "epochs to train (unless total_steps > 0); gpt random: passes over the file's tokens"},
    {"total_steps", DDP_CFG_INT, "0", NULL, "optimizer steps to train; 0: use epochs"},
    {"optimizer", DDP_CFG_CHOICE, "sgd", "sgd|adamw", "the optimizer"},
    {"lr", DDP_CFG_FLOAT, "0.1", NULL, "learning rate for one process"},
    {"lr_scaling", DDP_CFG_CHOICE, "none", "none|linear|sqrt", "scale lr by the world size"},
    {"schedule", DDP_CFG_CHOICE, "cosine", "cosine|linear|constant|step",
     "after warmup (step: torch's StepLR, lr × lr_gamma every lr_step_epochs)"},
    {"lr_step_epochs", DDP_CFG_INT, "0", NULL,
     "schedule step: epochs between two decays (torch's StepLR step_size, stepped per epoch)"},
    {"lr_gamma", DDP_CFG_FLOAT, "0.1", NULL, "schedule step: the factor of each decay"},
    {"warmup_steps", DDP_CFG_INT, "0", NULL, "linear warmup from 0"},
    {"momentum", DDP_CFG_FLOAT, "0.9", NULL, "sgd momentum"},
    {"weight_decay", DDP_CFG_FLOAT, "0", NULL,
     "sgd: L2 in the gradient; adamw: decoupled (gpt: 2-D weights only)"},
    {"betas", DDP_CFG_STRING, "0.9,0.999", NULL, "adamw beta1,beta2 (or [beta1, beta2])"},
    {"eps", DDP_CFG_FLOAT, "1e-8", NULL, "adamw epsilon"},
    {"grad_clip", DDP_CFG_FLOAT, "0", NULL, "clip the global gradient norm (0: off)"},
    {"eval_every", DDP_CFG_INT, "0", NULL, "evaluate every N steps (0: at each epoch end)"},
    {"eval_windows", DDP_CFG_INT, "0", NULL,
     "gpt: validation windows per evaluation, spread evenly over the file (0: all)"},
    {"log_every", DDP_CFG_INT, "50", NULL,
     "progress line every N steps (0: at the last step only)"},
    {"tensorboard", DDP_CFG_BOOL, "true", NULL,
     "train: rank 0 writes TensorBoard event files into out_dir/tb/"},
    {"straggler.ratio", DDP_CFG_FLOAT, "1.3", NULL,
     "warn when a rank's work per step exceeds the other ranks' median by this factor (and "
     "0.5 ms) in most progress lines for straggler.after seconds (≤ 1: off)"},
    {"straggler.after", DDP_CFG_FLOAT, "5", NULL,
     "seconds a rank must stay slow (and 3 progress lines) before the warning"},
    {"straggler.every", DDP_CFG_FLOAT, "60", NULL,
     "seconds between two warnings while the same rank stays slow"},
    {"checkpoint.every", DDP_CFG_INT, "0", NULL, "checkpoint every N steps (and at the end)"},
    {"checkpoint.keep", DDP_CFG_INT, "3", NULL, "keep the last K checkpoints (≥ 1)"},
    {"resume_from", DDP_CFG_STRING, "", NULL,
     "a checkpoint path, 'latest' (in out_dir), or 'auto': latest if there is one, else start "
     "at step 0 (for ddprun --max_restarts)"},
    {"overwrite", DDP_CFG_BOOL, "false", NULL,
     "train: delete out_dir's checkpoints newer than where this run starts (another run's) and "
     "start metrics.jsonl and TensorBoard anew, instead of refusing; with --resume_from one of "
     "out_dir's checkpoints, keep what was logged up to its step and drop what came after"},
    {"checkpoint", DDP_CFG_STRING, "latest", NULL, "test/predict: checkpoint path or 'latest'"},
    {"predict_out", DDP_CFG_STRING, "", NULL,
     "predict: the file to write: mlp/cnn a CSV (empty: predictions.csv in out_dir), gpt the "
     "generated text (empty: stdout)"},
    {"prompt", DDP_CFG_STRING, "", NULL,
     "gpt predict: text to continue (vocab 256; empty: a newline)"},
    {"prompt_tokens", DDP_CFG_INT_LIST, "", NULL,
     "gpt predict: token ids to continue (any vocabulary), e.g. 1,2,3"},
    {"max_new_tokens", DDP_CFG_INT, "200", NULL,
     "gpt: tokens to generate (predict: ≥ 1; a sample after training: 0 for none)"},
    {"temperature", DDP_CFG_FLOAT, "0.8", NULL, "gpt generation: logits / temperature (0: argmax)"},
    {"top_k", DDP_CFG_INT, "200", NULL, "gpt generation: sample among the k likeliest (0: all)"},
    {"kv_cache", DDP_CFG_BOOL, "true", NULL,
     "gpt generation: keep each block's keys and values, so that a new token costs one "
     "position's work until the context fills block_size (false: every token recomputes the "
     "whole context, as nanoGPT's sample.py)"},
    {"backend", DDP_CFG_STRING, "", NULL,
     "the group's backend: auto, shm, tcp, shm+tcp, mpi, shm+mpi (empty: DDP_BACKEND, else "
     "auto; docs/group.md)"},
    {"gpu_backend", DDP_CFG_CHOICE, "auto", "auto|nccl|cuda-ipc|cuda-staged",
     "device cuda: the backend reducing the gradients in GPU memory (auto: nccl when every rank "
     "of a host has a GPU of its own, else cuda-ipc when all share one GPU of one host, else "
     "cuda-staged; docs/group.md)"},
    {"resident", DDP_CFG_CHOICE, "auto", "auto|false",
     "device cuda: keep parameters, gradients, optimizer state (and batchnorm statistics) on "
     "the GPU, reduced over a GPU group (auto), or run host-driven (false: uploads each forward, "
     "the reducer and optimizer on the host; docs/gpu.md)"},
    {"overlap", DDP_CFG_CHOICE, "auto", "auto|async|inline", "how gradient buckets are reduced"},
    {"compress_bf16", DDP_CFG_BOOL, "false", NULL, "send gradients as bfloat16"},
    {"bucket_kb", DDP_CFG_INT, "0", NULL,
     "gradient bucket cap in KiB (0: 25 MiB, first 1 MiB; 4 MiB with shard_gradients)"},
    {"rebuild_buckets", DDP_CFG_BOOL, "true", NULL,
     "re-cut the gradient buckets after the first step along backward's order (async overlap, "
     "unsharded, CPU; docs/ddp.md)"},
    {"shard_optimizer", DDP_CFG_CHOICE, "auto", "auto|true|false",
     "ZeRO-1: each rank steps 1/world of the parameters, then they are gathered, and keeps "
     "1/world of the optimizer state on the CPU (auto: on, except over shm+tcp and shm+mpi, "
     "whose reduce_scatter is a whole allreduce)"},
    {"shard_gradients", DDP_CFG_CHOICE, "false", "auto|true|false",
     "ZeRO-2: each rank keeps 1/world of the gradient too (a bounded pool of bucket buffers "
     "instead of whole gradients); true needs shard_optimizer on and device cpu (auto: off for "
     "now)"},
};
#define NKEYS (sizeof schema / sizeof schema[0])

void trainer_print_help(FILE *out)
{
    fprintf(out, "usage: [ddprun …] ddptrain [--config FILE.yaml] [--key value …]\n"
                 "Every key below can be set in the YAML file (nested maps for dotted keys)\n"
                 "and overridden on the command line: --key value or --key=value, dashes or\n"
                 "underscores (--out-dir), a bool alone (--overwrite) meaning true. test and\n"
                 "predict start from the configuration stored in the checkpoint. --local_rank\n"
                 "N (or --local-rank=N), as torch.distributed.launch passes it, is accepted\n"
                 "and checked against the launcher's LOCAL_RANK (docs/launchers.md).\n");
    ddp_config_print_help(schema, NKEYS, out);
}

/* The schema's default of key (a key of the schema). */
static const char *default_of(const char *key)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(schema[i].name, key))
            return schema[i].def;
    return "";
}

bool trainer_parse_betas(const char *text, float *b1, float *b2)
{
    const char *p = text;
    char *end;
    float v[2];
    while (*p == ' ')
        p++;
    const bool bracket = *p == '[';
    p += bracket;
    for (int i = 0; i < 2; i++) {
        if (i == 1) {
            while (*p == ' ')
                p++;
            if (*p++ != ',')
                return false;
        }
        errno = 0;
        v[i] = strtof(p, &end); /* skips the blanks before the number */
        if (end == p || errno)
            return false;
        p = end;
    }
    while (*p == ' ')
        p++;
    if (bracket && *p++ != ']')
        return false;
    while (*p == ' ')
        p++;
    if (*p)
        return false;
    *b1 = v[0];
    *b2 = v[1];
    return true;
}

/* The checks a configuration needs before any data: exit code 2 with the message. model_known:
 * model.type is the run's (test and predict take it from the checkpoint, later). */
/* model_known: the model keys are final (training, or test/predict's rebuilt configuration);
 * rank0: this process writes predict_out. */
static int check_values(const ddp_config *c, bool model_known, bool rank0)
{
    /* Paths that cannot be empty: out_dir "" would write into / (out_dir/checkpoints is
     * "/checkpoints"), data.dir "" would read /train-images-…, checkpoint "" names no file. */
    static const char *const paths[] = {"out_dir", "checkpoint", "data.dir"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        bool images = model_known && strcmp(ddp_config_str(c, "model.type"), "gpt") != 0;
        if (!strcmp(paths[i], "data.dir") && !images) /* a gpt model reads data.train/text */
            continue;
        if (!*ddp_config_str(c, paths[i])) {
            fprintf(stderr,
                    "ddptrain: key '%s' is empty (%s); give it a path, or leave it out for its "
                    "default '%s'\n",
                    paths[i], ddp_config_origin(c, paths[i]), default_of(paths[i]));
            return 2;
        }
    }
    /* predict_out names the file to write: a folder there was found after the predictions, and
     * blamed on the free space */
    struct stat ps;
    const char *po = ddp_config_str(c, "predict_out");
    if (model_known && rank0 && !strcmp(ddp_config_str(c, "task"), "predict") && *po &&
        stat(po, &ps) == 0 && S_ISDIR(ps.st_mode)) {
        fprintf(stderr,
                "ddptrain: predict_out '%s' (%s) is a folder; give the file to write, e.g. "
                "'%s/predictions.%s'\n",
                po, ddp_config_origin(c, "predict_out"), po,
                !strcmp(ddp_config_str(c, "model.type"), "gpt") ? "txt" : "csv");
        return 2;
    }
    /* Each bound names its own key and the value given, so the user sees which one is wrong.
     * Those the trainer holds in an int end at INT_MAX (a larger value was cut to 32 bits until
     * 2026-11-26: batch_size 4294967360 trained with 64). */
    static const struct {
        const char *key;
        int64_t min, max;
    } int_range[] = {
        {"batch_size", 1, INT_MAX},         {"grad_accum", 1, INT_MAX},
        {"epochs", 0, INT64_MAX},           {"total_steps", 0, INT64_MAX},
        {"data.threads", -1, INT_MAX},      {"warmup_steps", 0, INT64_MAX},
        {"log_every", 0, INT64_MAX},        {"eval_every", 0, INT64_MAX},
        {"checkpoint.every", 0, INT64_MAX}, {"checkpoint.keep", 1, INT_MAX},
        {"bucket_kb", 0, INT_MAX},          {"lr_step_epochs", 0, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof int_range / sizeof int_range[0]; i++) {
        int64_t v = ddp_config_int(c, int_range[i].key);
        if (v < int_range[i].min || v > int_range[i].max) {
            char hi[40] = "";
            if (int_range[i].max != INT64_MAX)
                snprintf(hi, sizeof hi, " and ≤ %" PRId64, int_range[i].max);
            fprintf(stderr, "ddptrain: key '%s' is %" PRId64 "; it must be ≥ %" PRId64 "%s\n",
                    int_range[i].key, v, int_range[i].min, hi);
            return 2;
        }
    }
    static const char *const nonneg[] = {"momentum", "weight_decay", "grad_clip", "model.dropout"};
    if (ddp_config_float(c, "lr") <= 0) {
        fprintf(stderr, "ddptrain: key 'lr' is %g; it must be > 0\n", ddp_config_float(c, "lr"));
        return 2;
    }
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; i++)
        if (ddp_config_float(c, nonneg[i]) < 0) {
            fprintf(stderr, "ddptrain: key '%s' is %g; it must be ≥ 0\n", nonneg[i],
                    ddp_config_float(c, nonneg[i]));
            return 2;
        }
    if (ddp_config_float(c, "model.dropout") >= 1) {
        fprintf(stderr, "ddptrain: key 'model.dropout' is %g; it must be below 1\n",
                ddp_config_float(c, "model.dropout"));
        return 2;
    }
    float b1, b2;
    if (!trainer_parse_betas(ddp_config_str(c, "betas"), &b1, &b2)) {
        fprintf(stderr,
                "ddptrain: betas '%s' is not two numbers like 0.9,0.95 or [0.9, 0.95] (%s)\n",
                ddp_config_str(c, "betas"), ddp_config_origin(c, "betas"));
        return 2;
    }
    if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1)) { /* torch.optim.AdamW's bounds */
        fprintf(stderr,
                "ddptrain: key 'betas' is %s (%s); each of the two must be from 0 to below 1, "
                "like 0.9,0.999\n",
                ddp_config_str(c, "betas"), ddp_config_origin(c, "betas"));
        return 2;
    }
    if (!strcmp(ddp_config_str(c, "schedule"), "step") && ddp_config_int(c, "lr_step_epochs") < 1) {
        fprintf(stderr, "ddptrain: schedule step needs lr_step_epochs ≥ 1 (epochs between two "
                        "decays by lr_gamma, torch's StepLR step_size)\n");
        return 2;
    }
    if (!(ddp_config_float(c, "lr_gamma") > 0) || !isfinite(ddp_config_float(c, "lr_gamma"))) {
        fprintf(stderr, "ddptrain: key 'lr_gamma' is %g; it must be > 0\n",
                ddp_config_float(c, "lr_gamma"));
        return 2;
    }
    if (ddp_config_float(c, "eps") < 0) {
        fprintf(stderr, "ddptrain: key 'eps' is %g; it must be ≥ 0\n", ddp_config_float(c, "eps"));
        return 2;
    }
    /* A classifier's layer sizes, each named with the key rather than by the model later. */
    static const char *const sizes[] = {"model.hidden", "model.channels"};
    for (size_t i = 0; model_known && strcmp(ddp_config_str(c, "model.type"), "gpt") != 0 &&
                       i < sizeof sizes / sizeof sizes[0];
         i++) {
        size_t n;
        const int64_t *v = ddp_config_ints(c, sizes[i], &n);
        for (size_t k = 0; k < n; k++)
            if (v[k] < 1 || v[k] > (1 << 24)) {
                fprintf(stderr,
                        "ddptrain: key '%s' has %" PRId64 " (entry %zu, %s); every size must be "
                        "from 1 to 16777216\n",
                        sizes[i], v[k], k + 1, ddp_config_origin(c, sizes[i]));
                return 2;
            }
    }
    /* Generation's keys on a model that does not generate: say so rather than ignore them. */
    if (model_known && strcmp(ddp_config_str(c, "model.type"), "gpt") != 0) {
        static const char *const gen[] = {"prompt", "prompt_tokens"};
        for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++)
            if (*ddp_config_str(c, gen[i])) {
                fprintf(stderr,
                        "ddptrain: key '%s' (%s) is for a gpt model's generation, but model.type "
                        "is %s; leave it out (--task predict writes this model's predictions "
                        "to predict_out)\n",
                        gen[i], ddp_config_origin(c, gen[i]), ddp_config_str(c, "model.type"));
                return 2;
            }
    }
    if (!strcmp(ddp_config_str(c, "shard_gradients"), "true")) {
        const char *why = !strcmp(ddp_config_str(c, "shard_optimizer"), "false")
                              ? "needs shard_optimizer on (ZeRO-2 shards ZeRO-1's step): set "
                                "shard_optimizer true"
                          : !strcmp(ddp_config_str(c, "device"), "cuda")
                              ? "is CPU-only for now: set device cpu, or leave shard_gradients "
                                "off on the GPU"
                          : ddp_config_bool(c, "compress_bf16")
                              ? "does not take compress_bf16 yet: set compress_bf16 false"
                              : NULL;
        if (why) {
            fprintf(stderr, "ddptrain: key 'shard_gradients' is true (%s); it %s\n",
                    ddp_config_origin(c, "shard_gradients"), why);
            return 2;
        }
    }
    /* fp32 and bf16 are the CPU's precisions: say so before any work when the device is cpu,
     * and bf16 on a CPU without bf16 units too (with auto it depends on the machine, and is
     * checked once the device is chosen). */
    if (!strcmp(ddp_config_str(c, "device"), "cpu") &&
        strcmp(ddp_config_str(c, "precision"), "fp32") != 0 &&
        strcmp(ddp_config_str(c, "precision"), "bf16") != 0) {
        fprintf(stderr,
                "ddptrain: precision '%s' needs a GPU: the CPU path computes in fp32 or bf16; "
                "HINT: set --precision fp32 (or bf16), or --device cuda on a machine with an "
                "NVIDIA GPU\n",
                ddp_config_str(c, "precision"));
        return 2;
    }
    if (!strcmp(ddp_config_str(c, "device"), "cpu") &&
        !strcmp(ddp_config_str(c, "precision"), "bf16")) { /* this CPU's bf16 units, now */
        ddp_error err = {0};
        if (ddp_precision_check(DDP_DEVICE_CPU, DDP_PRECISION_BF16, &err) != DDP_OK) {
            fprintf(stderr, "ddptrain: %s\n", err.msg);
            return 2;
        }
    }
    if (ddp_config_float(c, "mfu_peak_tflops") < 0) {
        fprintf(stderr,
                "ddptrain: mfu_peak_tflops must be ≥ 0 (0: the table's or the measured peak)\n");
        return 2;
    }
    if (strcmp(ddp_config_str(c, "model.type"), "gpt") != 0)
        return 0;
    static const struct {
        const char *key, *why;
        int64_t max;
    } gpt_range[] = {
        {"model.n_layer", "", 4096},
        {"model.n_head", "", 1 << 20},
        {"model.n_embd", "", 1 << 20},
        {"model.block_size", "", 1 << 20},
        {"model.vocab_size", " (token files hold uint16 ids)", 65536},
    };
    for (size_t i = 0; i < sizeof gpt_range / sizeof gpt_range[0]; i++) {
        int64_t v = ddp_config_int(c, gpt_range[i].key);
        if (v < 1 || v > gpt_range[i].max) {
            fprintf(stderr,
                    "ddptrain: key '%s' is %" PRId64 "; it must be from 1 to %" PRId64 "%s\n",
                    gpt_range[i].key, v, gpt_range[i].max, gpt_range[i].why);
            return 2;
        }
    }
    int64_t H = ddp_config_int(c, "model.n_head"), C = ddp_config_int(c, "model.n_embd");
    if (C % H != 0) {
        fprintf(stderr,
                "ddptrain: model.n_embd %" PRId64 " is not divisible by model.n_head %" PRId64
                ": each head takes n_embd / n_head channels; choose n_head among the divisors "
                "of n_embd\n",
                C, H);
        return 2;
    }
    size_t npt;
    const int64_t *pt = ddp_config_ints(c, "prompt_tokens", &npt);
    if (npt && *ddp_config_str(c, "prompt")) {
        fprintf(stderr,
                "ddptrain: prompt (%s) and prompt_tokens (%s) are both given; the prompt is one "
                "or the other: text (vocab 256) or token ids\n",
                ddp_config_origin(c, "prompt"), ddp_config_origin(c, "prompt_tokens"));
        return 2;
    }
    /* The prompt against the model's vocabulary, before any work (for predict, before
     * predict_out is opened: a bad prompt emptied an earlier file, and exited 1), where it is
     * used: predict, and training that ends with a sample */
    int64_t V = ddp_config_int(c, "model.vocab_size");
    const char *task = ddp_config_str(c, "task");
    bool prompted =
        model_known && (!strcmp(task, "predict") ||
                        (!strcmp(task, "train") && ddp_config_int(c, "max_new_tokens") > 0));
    for (size_t i = 0; prompted && i < npt; i++)
        if (pt[i] < 0 || pt[i] >= V) {
            fprintf(stderr,
                    "ddptrain: prompt_tokens (%s) has %" PRId64 " (entry %zu), not a token id of "
                    "this model (0 … %" PRId64 ")\n",
                    ddp_config_origin(c, "prompt_tokens"), pt[i], i + 1, V - 1);
            return 2;
        }
    if (prompted && !npt && *ddp_config_str(c, "prompt") && V != 256) {
        fprintf(stderr,
                "ddptrain: prompt (%s) is text, and this model's vocabulary (%" PRId64 ") is not "
                "bytes; give the prompt's token ids: --prompt_tokens 1,2,3\n",
                ddp_config_origin(c, "prompt"), V);
        return 2;
    }
    static const char *const gpt_nonneg[] = {"eval_windows", "max_new_tokens", "top_k"};
    for (size_t i = 0; i < sizeof gpt_nonneg / sizeof gpt_nonneg[0]; i++)
        if (ddp_config_int(c, gpt_nonneg[i]) < 0) {
            fprintf(stderr, "ddptrain: key '%s' is %" PRId64 "; it must be ≥ 0\n", gpt_nonneg[i],
                    ddp_config_int(c, gpt_nonneg[i]));
            return 2;
        }
    /* predict with 0 new tokens wrote the prompt alone, a file that looks like a generation
     * (transformers' generate refuses max_new_tokens 0 too). After training 0 means no sample,
     * and a checkpoint's stored configuration carries that 0 into predict: say where it is from. */
    if (!strcmp(ddp_config_str(c, "task"), "predict") && ddp_config_int(c, "max_new_tokens") == 0) {
        const char *o = ddp_config_origin(c, "max_new_tokens");
        fprintf(stderr,
                "ddptrain: key 'max_new_tokens' is 0 (%s): --task predict would write the prompt "
                "alone; give --max_new_tokens N, the tokens to generate (default 200)\n",
                !strcmp(o, "the command line") || !strcmp(o, "default")
                    ? o
                    : "the configuration stored in the checkpoint, where 0 skipped the sample "
                      "after training");
        return 2;
    }
    if (ddp_config_float(c, "temperature") < 0) {
        fprintf(stderr, "ddptrain: key 'temperature' is %g; it must be ≥ 0\n",
                ddp_config_float(c, "temperature"));
        return 2;
    }
    return 0;
}

/* Names PyTorch training scripts and the Hugging Face Trainer use for ddptrain's keys, too far
 * from them for "did you mean" to find. */
static const char *const foreign_names[][2] = {
    {"learning_rate", "lr"},
    {"num_epochs", "epochs"},
    {"num_train_epochs", "epochs"},
    {"n_epochs", "epochs"},
    {"max_steps", "total_steps"},
    {"max_iters", "total_steps"},
    {"gradient_accumulation_steps", "grad_accum"},
    {"per_device_train_batch_size", "batch_size"},
    {"train_batch_size", "batch_size"},
    {"output_dir", "out_dir"},
    {"resume_from_checkpoint", "resume_from"},
    {"resume", "resume_from"},
    {"max_grad_norm", "grad_clip"},
    {"clip_grad_norm", "grad_clip"},
    {"lr_scheduler_type", "schedule"},
    {"lr_scheduler", "schedule"},
    {"warmup", "warmup_steps"},
    {"step_size", "lr_step_epochs"},
    {"gamma", "lr_gamma"},
    {"logging_steps", "log_every"},
    {"eval_steps", "eval_every"},
    {"save_steps", "checkpoint.every"},
    {"overwrite_output_dir", "overwrite"},
    {"save_total_limit", "checkpoint.keep"},
    {"data_dir", "data.dir"},
    {"dataset", "data.dir"},
    {"optim", "optimizer"},
    {"model", "model.type"},
    {"arch", "model.type"},
    {"num_workers", "data.threads"},
    /* nanoGPT's train.py and sample.py */
    {"eval_interval", "eval_every"},
    {"eval_iters", "eval_windows"},
    {"log_interval", "log_every"},
    {"warmup_iters", "warmup_steps"},
    {"init_from", "resume_from"},
    {"start", "prompt"},
    {"dtype", "precision"},
};

/* ddprun's (and torchrun's) own flags: given after the program's name, they reach ddptrain,
 * as everything after it does ("ddprun ddptrain --nproc_per_node=2"). */
static const char *const launcher_flags[] = {
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "standalone",
    "max_restarts",
    "rdzv_endpoint",
    "rdzv_backend",
    "rdzv_id",
    "rdzv_conf",
    "rdzv_timeout",
    "monitor_interval",
    "grace_period",
    "agent_timeout",
    "redirects",
    "tee",
    "log_dir",
    "run_id",
    "role",
    "no_prefix",
    "bind_to",
    "isolate_gpus",
    "local_addr",
    "start_method",
    "no_python",
    "run_path",
    "use_env",
    "pass_local_rank",
    "local_ranks_filter",
    "log_line_prefix_template",
};

/* The unknown key named by message m ("unknown key 'k'"), matched against the names of list. */
static bool unknown_key_in(const char *m, const char *const *list, size_t n)
{
    const char *k = strstr(m, "unknown key '");
    if (!k)
        return false;
    k += strlen("unknown key '");
    size_t l = strcspn(k, "'");
    for (size_t i = 0; i < n; i++)
        if (strlen(list[i]) == l && !strncmp(k, list[i], l))
            return true;
    return false;
}

int trainer_config_load(trainer *t, const char *yaml_path, int argc, char **argv)
{
    ddp_error err = {0};
    if (ddp_config_load(schema, NKEYS, yaml_path, argc, argv, &t->cfg, &err) != DDP_OK) {
        /* Another trainer's name: its ddptrain key, in place of a "did you mean" by spelling
         * (which named eval_every for nanoGPT's eval_iters). */
        const char *k = strstr(err.msg, "unknown key '"), *to = NULL;
        if (k) {
            k += strlen("unknown key '");
            size_t n = strcspn(k, "'");
            for (size_t i = 0; i < sizeof foreign_names / sizeof foreign_names[0]; i++)
                if (strlen(foreign_names[i][0]) == n && !strncmp(k, foreign_names[i][0], n)) {
                    to = foreign_names[i][1];
                    break;
                }
        }
        bool launcher = !to && unknown_key_in(err.msg, launcher_flags,
                                              sizeof launcher_flags / sizeof launcher_flags[0]);
        const char *dym = to || launcher ? strstr(err.msg, "; did you mean") : NULL;
        if (dym)
            fprintf(stderr, "ddptrain: %.*s; --help lists every key\n", (int)(dym - err.msg),
                    err.msg);
        else
            fprintf(stderr, "ddptrain: %s\n", err.msg);
        if (to)
            fprintf(stderr, "ddptrain: HINT: ddptrain's key for '%.*s' is '%s' (--%s)\n",
                    (int)strcspn(k, "'"), k, to, to);
        else if (launcher)
            fprintf(stderr,
                    "ddptrain: HINT: --%.*s is a flag of the launcher (ddprun's, as torchrun's): "
                    "put it before the program's name, 'ddprun --%.*s … ddptrain …'; what "
                    "follows the name goes to the program\n",
                    (int)strcspn(k, "'"), k, (int)strcspn(k, "'"), k);
        return 2;
    }
    return check_values(t->cfg, !strcmp(ddp_config_str(t->cfg, "task"), "train"), true);
}

/* ---- the configuration stored in a checkpoint ------------------------------------------------
 */

/* "--name=value" for key k of c, as text the config parses back to the same value. */
static char *key_arg(const ddp_config *c, const ddp_cfg_key *k)
{
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f)
        return NULL;
    fprintf(f, "--%s=", k->name);
    switch (k->type) {
    case DDP_CFG_INT: fprintf(f, "%" PRId64, ddp_config_int(c, k->name)); break;
    case DDP_CFG_FLOAT: fprintf(f, "%.17g", ddp_config_float(c, k->name)); break;
    case DDP_CFG_BOOL: fputs(ddp_config_bool(c, k->name) ? "true" : "false", f); break;
    case DDP_CFG_STRING:
    case DDP_CFG_CHOICE: fputs(ddp_config_str(c, k->name), f); break;
    case DDP_CFG_INT_LIST: {
        size_t n;
        const int64_t *v = ddp_config_ints(c, k->name, &n);
        for (size_t i = 0; i < n; i++)
            fprintf(f, "%s%" PRId64, i ? "," : "", v[i]);
        break;
    }
    }
    if (fclose(f) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* Rank 0: the checkpoint the config names, and its stored configuration, into *blob as
 * "PATH\0YAML\0" (*len bytes; the caller frees). Prints the message and returns false when
 * there is no such checkpoint. */
static bool read_stored(trainer *t, char **blob, size_t *len)
{
    ddp_error err = {0};
    char path[2048];
    ddp_ckpt *ck = NULL;
    t->ckpt_latest = !strcmp(ddp_config_str(t->cfg, "checkpoint"), "latest");
    if (trainer_find_checkpoint(t, ddp_config_str(t->cfg, "checkpoint"), path, sizeof path, &err) !=
        DDP_OK) {
        /* No checkpoint in out_dir: most often the wrong --out_dir, or no training yet. */
        fprintf(stderr,
                "ddptrain: %s\nddptrain: HINT: --task %s reads the checkpoint of a training run: "
                "give that run's --out_dir (now '%s') or --checkpoint PATH\n",
                err.msg, ddp_config_str(t->cfg, "task"), t->dir);
        return false;
    }
    if (ddp_ckpt_open(path, &ck, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        if (t->ckpt_latest)
            trainer_hint_damaged(t, path, false);
        return false;
    }
    const char *yaml = ddp_ckpt_meta(ck, "config");
    if (!yaml)
        yaml = "";
    /* A classifier's classes: the size of its output layer's bias, the highest fcN.bias. */
    int top = 0;
    for (size_t i = 0; i < ddp_ckpt_count(ck); i++) {
        const ddp_ckpt_tensor *x = ddp_ckpt_tensor_at(ck, i);
        int k = 0, used = 0;
        if (sscanf(x->name, "fc%d.bias%n", &k, &used) == 1 && x->name[used] == '\0' && k > top &&
            x->ndim == 1 && x->shape[0] > 0 && x->shape[0] <= INT32_MAX) {
            top = k;
            t->ckpt_classes = (int)x->shape[0];
        }
    }
    size_t lp = strlen(path) + 1, ly = strlen(yaml) + 1;
    *blob = malloc(lp + ly);
    if (*blob) {
        memcpy(*blob, path, lp);
        memcpy(*blob + lp, yaml, ly);
        *len = lp + ly;
    } else {
        fprintf(stderr, "ddptrain: out of memory reading '%s'\n", path);
    }
    ddp_ckpt_close(ck);
    return *blob != NULL;
}

static int check_model_yaml(trainer *t, const ddp_config *here_cfg, const char *path,
                            const char *yaml, bool say);

/* The new configuration: defaults < yaml (the stored one, through a temporary file, so that
 * libyaml reads what ddp_config_to_yaml wrote) < every key the user set, and the checkpoint
 * path. */
static int rebuild(trainer *t, const char *path, const char *yaml)
{
    char **args = calloc(NKEYS + 2, sizeof *args);
    int n = 0, rc = 2;
    char tmp[4200];
    const char *tmpdir = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/ddptrain-config.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = -1;
    if (!args)
        goto out_free;
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(ddp_config_origin(t->cfg, schema[i].name), "default") != 0 &&
            strcmp(schema[i].name, "checkpoint") != 0 && !(args[n++] = key_arg(t->cfg, &schema[i])))
            goto out_free;
    /* A prompt the user gives replaces the stored one of the other kind (text, token ids). */
    bool user_text = strcmp(ddp_config_origin(t->cfg, "prompt"), "default") != 0;
    bool user_ids = strcmp(ddp_config_origin(t->cfg, "prompt_tokens"), "default") != 0;
    if (user_text != user_ids &&
        !(args[n++] = strdup(user_text ? "--prompt_tokens=" : "--prompt=")))
        goto out_free;
    if (asprintf(&args[n++], "--checkpoint=%s", path) < 0) {
        args[--n] = NULL;
        goto out_free;
    }
    /* A checkpoint that stores no configuration names no out_dir of its own: its results
     * (train.log, metrics.jsonl, predictions.csv) go to its own folder, not into the default
     * runs/default of another run, unless --out_dir says where. */
    if (!*yaml && !strcmp(ddp_config_origin(t->cfg, "out_dir"), "default") &&
        strcmp(ddp_config_str(t->cfg, "checkpoint"), "latest") != 0) { /* (latest: out_dir's) */
        const char *slash = strrchr(path, '/');
        int dl = slash ? (slash == path ? 1 : (int)(slash - path)) : 1;
        if (asprintf(&args[n++], "--out_dir=%.*s", dl, slash ? path : ".") < 0) {
            args[--n] = NULL;
            goto out_free;
        }
    }
    if (*yaml) {
        if ((fd = mkstemp(tmp)) < 0) {
            fprintf(stderr,
                    "ddptrain: cannot create '%s' for the stored configuration: %s; set TMPDIR "
                    "to a folder that can be written\n",
                    tmp, strerror(errno));
            goto out_free;
        }
        size_t len = strlen(yaml), off = 0;
        while (off < len) {
            ssize_t w = write(fd, yaml + off, len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                fprintf(stderr,
                        "ddptrain: writing '%s': %s; set TMPDIR to a folder with space (a "
                        "temporary copy of the checkpoint's configuration)\n",
                        tmp, w < 0 ? strerror(errno) : "nothing written");
                goto out_free;
            }
            off += (size_t)w;
        }
    }
    ddp_error err = {0};
    ddp_config *c;
    if (ddp_config_load(schema, NKEYS, *yaml ? tmp : NULL, n, args, &c, &err) != DDP_OK) {
        fprintf(stderr,
                "ddptrain: the configuration stored in '%s' does not load: %s; give the run's "
                "--config and flags instead\n",
                path, err.msg);
        goto out_free;
    }
    ddp_config_free(t->cfg);
    t->cfg = c;
    /* The model asked for against the one the checkpoint holds first: the checks of the values
     * and the data would otherwise speak of the wrong model (a classifier's checkpoint with
     * --model.type gpt: "needs token files"). Every rank decides alike, from the configuration
     * rank 0 broadcast and the same command line; rank 0 says why. */
    rc = check_model_yaml(t, c, path, yaml, t->R == 0);
    if (!rc)
        rc = check_values(c, true, t->R == 0);
    if (rc && t->R != 0) /* rank 0's line is the cause, the one ddprun's summary should name */
        rc = trainer_die_peer(t, "configuration",
                              "rank 0 refused the configuration stored in the checkpoint");
out_free:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    for (int i = 0; args && i < n; i++)
        free(args[i]);
    free(args);
    return rc;
}

int trainer_config_from_checkpoint(trainer *t)
{
    char *blob = NULL;
    size_t len = 0;
    /* bytes of "PATH\0YAML\0", or −1: rank 0 found no checkpoint; the classifier's classes */
    int64_t info[2] = {-1, 0};
    snprintf(t->dir, sizeof t->dir, "%s", ddp_config_str(t->cfg, "out_dir"));
    if (t->R == 0 && read_stored(t, &blob, &len))
        info[0] = (int64_t)len;
    info[1] = t->ckpt_classes;
    if (ddp_broadcast(t->g, info, 2, DDP_INT64, 0) != DDP_OK) {
        free(blob);
        return trainer_die(t, "configuration", ddp_group_last_error(t->g));
    }
    int64_t n = info[0];
    t->ckpt_classes = (int)info[1];
    if (n < 0) /* rank 0 printed why */
        return t->R == 0 ? 2
                         : trainer_die_peer(t, "configuration",
                                            "rank 0 could not read the checkpoint's configuration");
    if (t->R != 0 && !(blob = malloc((size_t)n)))
        return trainer_die(t, "configuration", "out of memory");
    if (ddp_broadcast(t->g, blob, (size_t)n, DDP_UINT8, 0) != DDP_OK) {
        free(blob);
        return trainer_die(t, "configuration", ddp_group_last_error(t->g));
    }
    const char *path = blob, *yaml = blob + strlen(blob) + 1;
    t->ckpt_no_config = !*yaml;
    int rc = rebuild(t, path, yaml);
    free(blob);
    snprintf(t->dir, sizeof t->dir, "%s", t->cfg ? ddp_config_str(t->cfg, "out_dir") : "");
    return rc;
}

/* The keys that make a model's computation (not only its shapes: n_head changes none), per
 * model type; model.type first. */
static bool shapes_model(const char *type, const char *key)
{
    static const char *const all[] = {"model.type"};
    static const char *const mlp[] = {"model.hidden", "model.activation"};
    static const char *const cnn[] = {"model.hidden", "model.channels", "model.activation"};
    static const char *const gpt[] = {"model.n_layer",    "model.n_head",     "model.n_embd",
                                      "model.block_size", "model.vocab_size", "model.bias"};
    const char *const *k = !strcmp(type, "gpt") ? gpt : !strcmp(type, "cnn") ? cnn : mlp;
    size_t n = !strcmp(type, "gpt") ? 6 : !strcmp(type, "cnn") ? 3 : 2;
    if (!strcmp(key, all[0]))
        return true;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, k[i]))
            return true;
    return false;
}

int trainer_config_check_model(trainer *t, const char *path)
{
    ddp_ckpt *ck = NULL;
    t->resume_optimizer[0] = '\0';
    if (ddp_ckpt_open(path, &ck, NULL) != DDP_OK)
        return 0; /* the load says why */
    int rc = check_model_yaml(t, t->cfg, path, ddp_ckpt_meta(ck, "config"), true);
    ddp_ckpt_close(ck);
    return rc;
}

/* The model keys of here_cfg against those of the configuration stored in checkpoint path
 * (yaml, which may be NULL or empty: nothing to check): 0 when they agree, 2 when here_cfg names
 * another model, said on stderr when say. Also sets t->resume_batch and t->resume_optimizer. */
static int check_model_yaml(trainer *t, const ddp_config *here_cfg, const char *path,
                            const char *yaml, bool say)
{
    char tmp[4200];
    const char *tmpdir = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/ddptrain-config.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = yaml && *yaml ? mkstemp(tmp) : -1;
    ddp_config *stored = NULL;
    if (fd >= 0) {
        size_t len = strlen(yaml), off = 0;
        while (off < len) {
            ssize_t w = write(fd, yaml + off, len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        /* A configuration of another version that does not load is not checked: the load
         * finds a mismatch of shapes. */
        if (off == len && ddp_config_load(schema, NKEYS, tmp, 0, NULL, &stored, NULL) != DDP_OK)
            stored = NULL;
        close(fd);
        unlink(tmp);
    }
    if (!stored)
        return 0;
    t->resume_batch = ddp_config_int(stored, "batch_size");
    snprintf(t->resume_optimizer, sizeof t->resume_optimizer, "%s",
             ddp_config_str(stored, "optimizer"));
    /* Every model key that differs, named in one line: one at a time, a CNN resumed with none
     * of its keys took three tries (model.type, then model.hidden, then model.channels). */
    int rc = 0;
    const char *type = ddp_config_str(stored, "model.type");
    const bool train = !strcmp(ddp_config_str(here_cfg, "task"), "train");
    char first[600] = "", fix[1200] = "", want[300] = "";
    size_t flen = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        if (!shapes_model(type, schema[i].name))
            continue;
        char *here = key_arg(here_cfg, &schema[i]), *there = key_arg(stored, &schema[i]);
        if (here && there && strcmp(here, there) != 0) {
            const char *h = strchr(here, '=') + 1, *st = strchr(there, '=') + 1;
            if (!rc) {
                snprintf(first, sizeof first, "%s is %s here (%s) but %s in the checkpoint '%s'",
                         schema[i].name, h, ddp_config_origin(here_cfg, schema[i].name), st, path);
                snprintf(want, sizeof want, "%s %s", schema[i].name, h);
            }
            int n = train ? snprintf(fix + flen, sizeof fix - flen, "%s--%s %s", rc ? " " : "",
                                     schema[i].name, st)
                          : snprintf(fix + flen, sizeof fix - flen, "%s--%s", rc ? ", " : "",
                                     schema[i].name);
            if (n > 0 && (size_t)n < sizeof fix - flen)
                flen += (size_t)n;
            rc = 2;
        }
        free(here);
        free(there);
    }
    if (rc && train && say)
        fprintf(stderr,
                "ddptrain: %s: it was saved with another model; give %s to resume it (and the "
                "rest of the command line that trained it: a resume takes its other keys from "
                "this one, not from the checkpoint), or another --out_dir for a new model\n",
                first, fix);
    else if (rc && say)
        fprintf(stderr,
                "ddptrain: %s: it was saved with another model; leave out %s (the checkpoint's "
                "stored configuration has the model's), or give --checkpoint one saved with %s\n",
                first, fix, want);
    ddp_config_free(stored);
    return rc;
}
