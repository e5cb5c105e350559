/*
 * ddptrain.h — what the trainer's files share: the trainer (the handles one run wires
 * together) and the task functions. Private to tools/ddptrain; like every tool it uses only the
 * public API, include/ddp/.
 *
 *   main.c        setting up the group, model, optimizer and reducer; running the task
 *   config.c      the keys (the schema), loading them, and a checkpoint's stored configuration
 *   data.c        opening the data a task needs, with its checks; a language model's batches
 *   train.c       the training loop: data, forward/backward, the optimizer step, logs
 *   eval.c        evaluation (test set, or a language model's validation windows; exact, all
 *                 ranks) and predictions to CSV
 *   generate.c    text generation from a language model (rank 0)
 *   checkpoint.c  saving (rank 0, atomically) and resuming (rank 0 reads, all get it)
 *   metrics.c     the progress line and what goes with it: per-rank step times gathered to rank
 *                 0, MFU, metrics.jsonl, TensorBoard, the straggler warning (straggler.c's rule)
 *   report.c      --task report: metrics.jsonl into one HTML page (plot.c draws the SVG charts)
 *   busfault.c    a data file or checkpoint that shrank under the job: its SIGBUS named
 */
#ifndef DDPTRAIN_H
#define DDPTRAIN_H

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>

#include "ddp/ddp.h"
#include "straggler.h"

typedef struct trainer {
    ddp_config *cfg;
    ddp_world world;    /* the environment, read once: who runs, and the DDP_* settings */
    int local_rank_arg; /* --local_rank N (torch.distributed.launch), -1 when not given */
    ddp_group *g;
    int W, R;    /* world size and rank */
    int B;       /* batch_size: samples per rank per micro-step (the model's max_batch) */
    int side;    /* mlp/cnn: the images are side × side, one channel */
    int classes; /* mlp/cnn: the model's outputs */
    /* A language model (model.type gpt): samples are windows of T tokens of a token file. */
    bool lm;
    int T;       /* model.block_size: tokens per sample */
    int vocab;   /* model.vocab_size */
    bool random; /* data.sampling random: nanoGPT's random windows; else epochs of fixed ones */
    char train_path[4096], val_path[4096]; /* the token files read (made from data.text?) */
    ddp_device_choice dev;                 /* the device this rank computes on (device) */
    ddp_precision prec;                    /* precision */
    double peak_flops; /* per rank, given (mfu_peak_tflops) or a GPU's from the table; 0: none
                          (metrics.c measures a CPU's) */
    ddp_model *m;
    ddp_param *rparams, *rbuffers; /* the reducer's view of the model's parameters and buffers */
    /* train only: test and predict make no reducer (its gradient buckets, 4 bytes a parameter
     * on the GPU, would go unused): NULL there, the views broadcast by trainer_share_views */
    ddp_reducer *red;
    ddp_optim *opt;
    bool opt_shard;    /* opt keeps this rank's shard of the state only (ZeRO-1's memory split;
                          the same on every rank): checkpoints gather it on rank 0 */
    ddp_optim_opts oo; /* the optimizer's settings (the device's optimizer takes them too) */
    /* device cuda: training is device-resident (ddp_model_resident; docs/gpu.md): the
     * parameters, their gradients and the optimizer's state stay on the GPU, and the gradients
     * are reduced over gg, a GPU group (nccl, or cuda-staged where ranks share a GPU); g stays
     * the host group for everything else (metrics, checkpoints, evaluation). opt's arrays then
     * hold the state only for checkpoints. */
    bool resident;
    bool state_pending; /* resident: a loaded optimizer state still to go up to the GPU, after
                           keep_shard narrowed it (so the GPU never holds all of it) */
    ddp_group *gg;
    /* precision fp16: dynamic loss scaling (ddp/amp.h, torch's GradScaler); optim_step counts the
     * optimizer steps taken (a step skipped for an inf is not), which AdamW's bias correction
     * uses; it equals step without fp16. */
    bool amp;
    ddp_grad_scaler scaler;
    uint64_t optim_step;
    uint64_t skipped; /* steps skipped for inf/NaN gradients, this run */
    uint64_t step;    /* optimizer steps done */
    uint64_t epoch;
    ddp_loader_state pos; /* where the training data resume */
    FILE *log, *jsonl;    /* rank 0: out_dir/train.log, out_dir/metrics.jsonl */
    /* rank 0: log is, until out_dir is opened (after the model and its checkpoint have loaded,
     * so that a refused resume creates nothing), a memory stream into early_buf, which then
     * goes at the head of train.log */
    char *early_buf;
    size_t early_len;
    /* rank 0: a write to train.log / metrics.jsonl failed (warned once: trainer_flush_logs) */
    bool log_failed, jsonl_failed;
    bool say_to_stderr; /* trainer_say writes to stderr (stdout carries generated text) */
    char dir[1024];     /* out_dir */
    /* train, rank 0: the checkpoint resume_from resolved to before out_dir was written ("":
     * a start at step 0), and whether it was 'latest'/'auto' (a damaged one gets the HINT
     * naming the one before it). */
    char resume[2048];
    bool resume_latest;
    /* rank 0: the per-rank batch_size of the run that saved the loaded checkpoint (its stored
     * configuration; 0 when it has none): the data position is in its batches */
    int64_t resume_batch;
    /* rank 0: the optimizer key of that stored configuration ("" when it has none) */
    char resume_optimizer[16];
    /* rank 0, train: the loaded checkpoint's progress windows (metadata ddptrain.loss_window:
     * each saving rank's loss sum and steps since its last progress line; NULL: none), and
     * every rank: its own, where the world is the saving one's (else 0, 0) */
    double *resume_windows;
    size_t resume_windows_n; /* pairs in resume_windows */
    double resume_win_sum;
    int resume_win_n;
    const struct progress *prog; /* the training loop's, while it runs (saved with checkpoints) */
    /* test, predict: the classes of the checkpoint's classifier (its last fcN.bias; 0: none,
     * a GPT), known on every rank before the data open: the model is built with them, not
     * with what the test set's labels happen to reach */
    int ckpt_classes;
    /* test, predict: the checkpoint holds no stored configuration (a program built on the
     * library saved it, examples/train_mlp): the model comes from the defaults and the command
     * line alone, which must give the keys it was built with */
    bool ckpt_no_config;
    bool ckpt_latest; /* test, predict: the checkpoint is out_dir's newest ('latest') */
    /* overwrite: another run's checkpoints were deleted; metrics.jsonl starts anew (and its
     * TensorBoard files go). Not with overwrite_keep. */
    bool overwrote;
    /* overwrite: trainer_resolve_resume found checkpoints newer than overwrite_from, which
     * trainer_overwrite deletes once the run is known to start */
    bool overwrite_pending;
    /* overwrite with a resume from a checkpoint of out_dir's own (at overwrite_from > 0): what
     * was logged up to it is this run's history, kept; trainer_overwrite cuts metrics.jsonl
     * after it, and TensorBoard purges the later steps as on a plain resume */
    bool overwrite_keep;
    uint64_t overwrite_from;
    bool dir_locked; /* rank 0, training: out_dir's lock is held (dir_lock_fd) */
    int dir_lock_fd;
    /* What the progress line reports beside the loss (metrics.c). */
    ddp_tb *tb;              /* rank 0: out_dir/tb/ (NULL: tensorboard false, or it failed) */
    bool tb_failed;          /* a TensorBoard write failed: warned once */
    double peak;             /* float32 matmul FLOP/s per rank, measured at start (mean) */
    bool peak_measured;      /* measured here (not given, not a GPU's datasheet figure) */
    bool peak_rechecked;     /* rank 0 measured it again once (an MFU above 100%) */
    double flops_per_sample; /* training FLOPs of one sample (a language model: T tokens) */
    straggler strag;
    bool save_now; /* some rank got SIGUSR1/SIGUSR2: a checkpoint at this step (metrics.c) */
} trainer;

/* Set by ddptrain's SIGUSR1/SIGUSR2 handler while it trains (ddprun passes them on; Slurm's
 * --signal=USR1@T): the ranks agree at the next progress line (every step with log_every 0) to
 * write a checkpoint, and training goes on. Lock-free: the signal may land on any thread. */
extern atomic_int trainer_save_signal;
void trainer_catch_save_signals(void);
/* With log_every 0: one small allreduce a step tells every rank whether one asked. */
int trainer_poll_save(trainer *t, uint64_t total);

/* A progress line's interval, as this rank saw it: the training loop adds each step. */
typedef struct progress {
    double t0, last_t; /* start of training, the last progress line (ddp_now_seconds) */
    double win_sum;    /* this rank's losses since the last line */
    int win_n;
    double step_s, wait_s; /* this rank's step times and reducer waits since then, summed */
    /* Seconds since then spent evaluating and saving checkpoints: left out of the rate and MFU
     * of the next progress line, which count training alone (the ETA keeps them). */
    double paused_s;
    uint64_t first_step, last_step;
    /* The largest rank's memory at the last progress line (rank 0; −1: none yet, no GPU, or
     * no rank's device answered): host peak RSS, and the bytes in use on its GPU (every
     * process's, nvidia-smi's figure); and which rank each is (they may differ). */
    double rss_mib, gpu_mib;
    int rss_rank, gpu_rank;
    bool gpu_unknown_said; /* rank 0 said that another rank's GPU memory is not known */
} progress;

/* Once a process, on this rank's stderr: a loader that got fewer threads than asked
 * (ddp_loader_threads), and what it does instead. */
void trainer_note_loader(const trainer *t, const ddp_loader *l, int asked);

/* Rank 0: a line to the console and train.log; trainer_log: to train.log only. */
void trainer_say(trainer *t, const char *fmt, ...) DDP_PRINTF(2, 3);
void trainer_log(trainer *t, const char *fmt, ...) DDP_PRINTF(2, 3);
/* Rank 0: flushes train.log and metrics.jsonl; the first write to either that fails (a full
 * disk) gets one warning line on stderr, naming the file, the step and the error: training goes
 * on, but without it the figures from there on would be lost unnoticed. */
void trainer_flush_logs(trainer *t);
/* Prints "ddptrain: rank R: what: msg" to stderr; returns 1, the exit code — or, when the group
 * failed because of another rank (ddp_group_peer_failed), what trainer_die_peer returns. */
int trainer_die(trainer *t, const char *what, const char *msg);
/* errfile.c: stderr keeps the last error it printed (from the start of main); on a non-zero
 * exit that error goes to TORCHELASTIC_ERROR_FILE when the launcher set it. */
void trainer_errfile_start(void);
void trainer_errfile_finish(int rc);
/* The same for a rank that stops only because another rank reported a failure (rank 0 could
 * not save, load, write out_dir): returns DDP_EXIT_PEER_FAILED, so that ddprun reports that
 * other rank as the cause, not this one, which usually exits first. */
int trainer_die_peer(trainer *t, const char *what, const char *msg);
/* busfault.c: a SIGBUS in one of the library's file mappings (a data file or a checkpoint that
 * shrank while read) writes one line naming the file, and the same into TORCHELASTIC_ERROR_FILE
 * (read here, at catch), then the rank dies of SIGBUS as before. catch: from the start of run
 * (SIGBUS left alone when started ignored); rank: for the line, once the world is read (until
 * then the line names no rank). */
void trainer_catch_bus_errors(void);
void trainer_bus_errors_rank(int rank);

/* ---- metrics.c ---- */

/* At the start of training, every rank: measures the matmul peak (all ranks at once, 50 ms),
 * computes the model's FLOPs per sample, sets up the straggler rule, and on rank 0 opens the
 * TensorBoard writer (purge_step = t->step + 1 when resumed). Returns 0 or an exit code. */
int trainer_metrics_open(trainer *t);
void trainer_metrics_close(trainer *t);
/* The progress line at a log step: gathers every rank's interval (a collective: every rank
 * calls it at the same steps), prints, writes metrics.jsonl and TensorBoard, checks for a
 * straggler; resets p's interval. *mean: the loss over the interval and the ranks. grad_norm < 0:
 * none. Returns 0 or an exit code. */
int trainer_log_progress(trainer *t, progress *p, uint64_t total, double lr, double grad_norm,
                         double *mean);
/* Rank 0: one scalar at the current step to TensorBoard (nothing without a writer); flush
 * writes what is buffered (at evaluations and checkpoints). A failure is a warning, once. */
void trainer_tb(trainer *t, const char *tag, double value);
void trainer_tb_flush(trainer *t);
/* Rank 0, before metrics.jsonl is opened: rewrites it (atomically: ddp_file_write_atomic) with
 * the lines whose step is ≤ step, dropping those after it and any line that is not a JSON object
 * with a step (a line cut short by a kill or a full disk). No file: nothing to do. 0, or 2
 * after printing why it failed (the file is then as it was). */
int trainer_metrics_cut(trainer *t, uint64_t step);
/* v as a JSON number for metrics.jsonl, with `digits` significant digits, into buf (40 bytes
 * suffice); null when v is NaN or ±inf, which JSON cannot write ("-nan" would make the line
 * unreadable to json.loads, jq, pandas and --task report). Returns buf. */
const char *trainer_json_num(char *buf, size_t cap, double v, int digits);

/* ---- report.c ---- */

/* --task report: out_dir/metrics.jsonl into out_dir/report.html. No group, model or data. */
int trainer_report(trainer *t);

/* ---- config.c ---- */

/* Loads the configuration (defaults < yaml_path < argv) into t->cfg and checks what needs no
 * data. Prints the message; returns 0 or the exit code (2). */
int trainer_config_load(trainer *t, const char *yaml_path, int argc, char **argv);
/* test and predict: the configuration the checkpoint was trained with becomes the base, with
 * what the user gave (a --config file, the command line) on top, and "checkpoint" set to the
 * file found. Rank 0 reads the checkpoint and broadcasts; every rank must call it, after the
 * group exists. Returns 0 or the exit code. */
int trainer_config_from_checkpoint(trainer *t);
/* Rank 0, before loading the checkpoint at path: the model keys of t's configuration against
 * those stored in it (model.type and what shapes that model: n_head too, which changes no
 * array's shape but the computation). 0, or 2 after one line naming the first that differs.
 * A checkpoint without a stored configuration (or one that does not load) passes. */
int trainer_config_check_model(trainer *t, const char *path);
/* Rank 0, training, before loading the checkpoint at path: whether it holds the optimizer state
 * of t's optimizer (its first parameter's). 0 when it does (or holds no optimizer state at all:
 * the load says what is missing), else 2 after one line naming the checkpoint's optimizer (from
 * its stored configuration, else the state it holds) and the run's, and what to do. */
int trainer_check_optimizer(trainer *t, const char *path);
void trainer_print_help(FILE *out);
/* AdamW's betas from the text of key 'betas': two numbers as 0.9,0.95 (YAML's list [0.9, 0.95]
 * arrives so), or in brackets as on the command line (--betas "[0.9, 0.95]"), blanks allowed
 * around each. false for anything else, with *b1 and *b2 untouched. */
bool trainer_parse_betas(const char *text, float *b1, float *b2);

/* ---- data.c ---- */

/* Opens the data the task needs (IDX files for mlp/cnn; token files, made from text when
 * data.text is given, for gpt) into *tr (train only) and *te (the test set or validation
 * file), and checks them against the model (vocabulary, block size). Prints the message;
 * returns 0 or the exit code (2). */
int trainer_open_data(trainer *t, ddp_dataset **tr, ddp_dataset **te);

/* The tasks; each returns the exit code. */
int trainer_train(trainer *t, ddp_dataset *train_set, ddp_dataset *test_set);
int trainer_predict(trainer *t, ddp_dataset *test_set);

/* Without a reducer (test, predict): rank 0's values of the views, the parameters too when
 * params, broadcast over the group that holds them (the GPU group when resident). Every rank
 * must call it. */
ddp_status trainer_share_views(trainer *t, bool params, ddp_error *err);
/* Exact: every sample of ds once across the ranks (no padding), sums all-reduced: the same loss
 * and accuracy for any world size. Every rank must call it. */
ddp_status trainer_evaluate(trainer *t, ddp_dataset *ds, double *loss, double *acc, ddp_error *err);
/* A language model's validation loss (mean cross-entropy per token) over a fixed set of
 * windows of val: all of them, or eval_windows spread evenly over the file; split over the
 * ranks with no padding, so the same windows for any world size. *windows receives their
 * number. Every rank must call it. */
ddp_status trainer_evaluate_lm(trainer *t, ddp_dataset *val, double *loss, size_t *windows,
                               ddp_error *err);

/* Every rank calls it; rank 0 generates max_new_tokens tokens after the prompt (prompt /
 * prompt_tokens), temperature, top_k and seed from the config, streaming the prompt and each
 * token to out as it is sampled — a byte for a vocabulary of 256, else its id — and, with
 * to_log, to train.log too; the others wait for it in broadcasts rank 0 renews every few
 * seconds, and learn whether it failed. out NULL on rank 0: it failed before (the others are
 * told). Returns 0 or an exit code. */
int trainer_generate(trainer *t, FILE *out, bool to_log);

/* Checkpoints. trainer_save: completes sharded optimizer state, rank 0 writes
 * out_dir/checkpoints/step<N>.safetensors and prunes to checkpoint.keep (never one above this
 * step), the others learn whether it worked; every rank must call it. trainer_load (before the
 * reducer exists): rank 0 reads the checkpoint — training: t->resume, as trainer_resolve_resume
 * found it; test and predict: `checkpoint` — into the model and optimizer, and every rank learns
 * *loaded; the reducer's creation then broadcasts the weights. trainer_share_loaded (after it):
 * the optimizer state and position from rank 0 to all (on the GPU the state goes up to the
 * device when training only). Return 0 or an exit code
 * (DDP_EXIT_PEER_FAILED on the ranks that learn that rank 0 failed). trainer_save returns
 * DDP_ERR_CLOSED on the ranks other than 0 when rank 0 reported that it could not save: the
 * failure is rank 0's, this rank only stops with it (trainer_die_peer). */
ddp_status trainer_save(trainer *t, double loss, ddp_error *err);
int trainer_load(trainer *t, bool train, bool *loaded, ddp_ckpt_train_pos *pos);
int trainer_share_loaded(trainer *t, bool train, ddp_ckpt_train_pos *pos);
/* Training, rank 0, before anything in out_dir is created or written: resolves resume_from
 * into t->resume (none with 'latest', a damaged or foreign file: refused now) and refuses an
 * out_dir/checkpoints that holds a checkpoint newer than the step this run starts from
 * (another run's: this run's pruning would delete its own checkpoints in their favour), unless
 * overwrite is true: then they are marked for trainer_overwrite.
 * Returns 0, or 2 after printing what is wrong and what to do; nothing is created or deleted. */
int trainer_resolve_resume(trainer *t);
/* Training, rank 0, once the model is built and its checkpoint read (the run will start): with
 * overwrite, deletes the checkpoints newer than the start that trainer_resolve_resume found,
 * newest first, and sets t->overwrote — or, resuming from out_dir's own checkpoint
 * (overwrite_keep), keeps the history: then metrics.jsonl is cut after the checkpoint's step
 * (trainer_metrics_cut; after the deletions, so that a failed cut leaves the file whole).
 * 0, or 2 after printing what could not be deleted or cut. */
int trainer_overwrite(trainer *t);
/* Training, rank 0: an exclusive lock on out_dir (flock of the folder, held for the process's
 * life), so that a second run into it is refused; 0 when taken or when out_dir is not there
 * yet, else 2 after printing why. */
int trainer_lock_out_dir(trainer *t);
/* The checkpoint `spec` names: a path as it is, or "latest": the newest in out_dir. */
ddp_status trainer_find_checkpoint(trainer *t, const char *spec, char *path, size_t cap,
                                   ddp_error *err);
/* Rank 0, after the checkpoint at path, found as 'latest', failed to load: when the file itself
 * is damaged (it does not open as a safetensors file: truncated, a bad header) and out_dir holds
 * an earlier one, prints the HINT naming it — how to resume from it (train) or --checkpoint it
 * (test, predict). A file that opens (a model or optimizer mismatch, which the earlier
 * checkpoint shares) gets no hint. */
void trainer_hint_damaged(const trainer *t, const char *path, bool train);

#endif /* DDPTRAIN_H */
