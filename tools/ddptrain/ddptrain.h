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
 */
#ifndef DDPTRAIN_H
#define DDPTRAIN_H

#include <stdio.h>

#include "ddp/ddp.h"

typedef struct trainer {
    ddp_config *cfg;
    ddp_world world; /* the environment, read once: who runs, and the DDP_* settings */
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
    ddp_model *m;
    ddp_param *rparams, *rbuffers; /* the reducer's view of the model's parameters and buffers */
    ddp_reducer *red;
    ddp_optim *opt;
    uint64_t step; /* optimizer steps done */
    uint64_t epoch;
    ddp_loader_state pos; /* where the training data resume */
    FILE *log, *jsonl;    /* rank 0: out_dir/train.log, out_dir/metrics.jsonl */
    bool say_to_stderr;   /* trainer_say writes to stderr (stdout carries generated text) */
    char dir[1024];       /* out_dir */
} trainer;

/* Rank 0: a line to the console and train.log; trainer_log: to train.log only. */
void trainer_say(trainer *t, const char *fmt, ...) DDP_PRINTF(2, 3);
void trainer_log(trainer *t, const char *fmt, ...) DDP_PRINTF(2, 3);
/* Prints "ddptrain: rank R: what: msg" to stderr; returns 1, the exit code. */
int trainer_die(trainer *t, const char *what, const char *msg);

/* ---- config.c ---- */

/* Loads the configuration (defaults < yaml_path < argv) into t->cfg and checks what needs no
 * data. Prints the message; returns 0 or the exit code (2). */
int trainer_config_load(trainer *t, const char *yaml_path, int argc, char **argv);
/* test and predict: the configuration the checkpoint was trained with becomes the base, with
 * what the user gave (a --config file, the command line) on top, and "checkpoint" set to the
 * file found. Rank 0 reads the checkpoint and broadcasts; every rank must call it, after the
 * group exists. Returns 0 or the exit code. */
int trainer_config_from_checkpoint(trainer *t);
void trainer_print_help(FILE *out);

/* ---- data.c ---- */

/* Opens the data the task needs (IDX files for mlp/cnn; token files, made from text when
 * data.text is given, for gpt) into *tr (train only) and *te (the test set or validation
 * file), and checks them against the model (vocabulary, block size). Prints the message;
 * returns 0 or the exit code (2). */
int trainer_open_data(trainer *t, ddp_dataset **tr, ddp_dataset **te);

/* The tasks; each returns the exit code. */
int trainer_train(trainer *t, ddp_dataset *train_set, ddp_dataset *test_set);
int trainer_predict(trainer *t, ddp_dataset *test_set);

/* Exact: every sample of ds once across the ranks (no padding), sums all-reduced: the same loss
 * and accuracy for any world size. Every rank must call it. */
ddp_status trainer_evaluate(trainer *t, ddp_dataset *ds, double *loss, double *acc, ddp_error *err);
/* A language model's validation loss (mean cross-entropy per token) over a fixed set of
 * windows of val: all of them, or eval_windows spread evenly over the file; split over the
 * ranks with no padding, so the same windows for any world size. *windows receives their
 * number. Every rank must call it. */
ddp_status trainer_evaluate_lm(trainer *t, ddp_dataset *val, double *loss, size_t *windows,
                               ddp_error *err);

/* Rank 0 (others return 0 at once): generates max_new_tokens tokens after the prompt
 * (prompt / prompt_tokens), temperature, top_k and seed from the config, streaming the prompt
 * and each token to out as it is sampled — a byte for a vocabulary of 256, else its id — and,
 * with to_log, to train.log too. Returns 0 or an exit code. */
int trainer_generate(trainer *t, FILE *out, bool to_log);

/* Checkpoints. trainer_save: completes sharded optimizer state, rank 0 writes
 * out_dir/checkpoints/step<N>.safetensors and prunes to checkpoint.keep, the others learn
 * whether it worked; every rank must call it. trainer_load (before the reducer exists): rank 0
 * reads `spec` (a path, or "latest" in out_dir) into the model and optimizer, and every rank
 * learns *loaded; the reducer's creation then broadcasts the weights. trainer_share_loaded
 * (after it): the optimizer state and position from rank 0 to all. Return 0 or an exit code. */
ddp_status trainer_save(trainer *t, double loss, ddp_error *err);
int trainer_load(trainer *t, const char *spec, bool *loaded, ddp_ckpt_train_pos *pos);
int trainer_share_loaded(trainer *t, ddp_ckpt_train_pos *pos);
/* The checkpoint `spec` names: a path as it is, or "latest": the newest in out_dir. */
ddp_status trainer_find_checkpoint(trainer *t, const char *spec, char *path, size_t cap,
                                   ddp_error *err);

#endif /* DDPTRAIN_H */
