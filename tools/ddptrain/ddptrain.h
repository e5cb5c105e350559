/*
 * ddptrain.h — what the trainer's files share: the trainer (the handles one run wires
 * together) and the task functions. Private to tools/ddptrain; like every tool it uses only the
 * public API, include/ddp/.
 *
 *   main.c        the configuration, setting up the group, model, optimizer and reducer; tasks
 *   train.c       the training loop: data, forward/backward, the optimizer step, logs
 *   eval.c        evaluation over the test set (exact, all ranks) and predictions to CSV
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
    int side;    /* the images are side × side, one channel */
    int classes; /* the model's outputs */
    ddp_model *m;
    ddp_param *rparams, *rbuffers; /* the reducer's view of the model's parameters and buffers */
    ddp_reducer *red;
    ddp_optim *opt;
    uint64_t step; /* optimizer steps done */
    uint64_t epoch;
    ddp_loader_state pos; /* where the training data resume */
    FILE *log, *jsonl;    /* rank 0: out_dir/train.log, out_dir/metrics.jsonl */
    char dir[1024];       /* out_dir */
} trainer;

/* Rank 0: a line to the console and train.log. */
void trainer_say(trainer *t, const char *fmt, ...) DDP_PRINTF(2, 3);
/* Prints "ddptrain: rank R: what: msg" to stderr; returns 1, the exit code. */
int trainer_die(trainer *t, const char *what, const char *msg);

/* The tasks; each returns the exit code. */
int trainer_train(trainer *t, ddp_dataset *train_set, ddp_dataset *test_set);
int trainer_predict(trainer *t, ddp_dataset *test_set);

/* Exact: every sample of ds once across the ranks (no padding), sums all-reduced: the same loss
 * and accuracy for any world size. Every rank must call it. */
ddp_status trainer_evaluate(trainer *t, ddp_dataset *ds, double *loss, double *acc, ddp_error *err);

/* Checkpoints. trainer_save: completes sharded optimizer state, rank 0 writes
 * out_dir/checkpoints/step<N>.safetensors and prunes to checkpoint.keep, the others learn
 * whether it worked; every rank must call it. trainer_load (before the reducer exists): rank 0
 * reads `spec` (a path, or "latest" in out_dir) into the model and optimizer, and every rank
 * learns *loaded; the reducer's creation then broadcasts the weights. trainer_share_loaded
 * (after it): the optimizer state and position from rank 0 to all. Return 0 or an exit code. */
ddp_status trainer_save(trainer *t, double loss, ddp_error *err);
int trainer_load(trainer *t, const char *spec, bool *loaded, ddp_ckpt_train_pos *pos);
int trainer_share_loaded(trainer *t, ddp_ckpt_train_pos *pos);

#endif /* DDPTRAIN_H */
