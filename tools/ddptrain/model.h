/*
 * model.h — ddptrain's models: a list of layers built from the config (an MLP, or conv stages
 * followed by fully connected layers), with forward, and backward that tells the DDP reducer
 * as each layer's gradients are done. Private to tools/ddptrain; uses only include/ddp/.
 */
#ifndef DDPTRAIN_MODEL_H
#define DDPTRAIN_MODEL_H

#include "ddp/ddp.h"

typedef enum { L_LINEAR, L_RELU, L_GELU, L_DROPOUT, L_CONV, L_BN, L_POOL } lkind;

typedef struct layer {
    lkind kind;
    size_t in_n, out_n; /* floats per sample in and out */
    int p0, np;         /* its parameters: indices p0 … p0+np−1 in model.params */
    int fan_in, out;    /* linear: in, out */
    ddp_nn_conv2d conv;
    ddp_nn_pool2d pool;
    int C, hw;       /* batchnorm: channels and pixels per channel */
    float p;         /* dropout */
    float *y;        /* (B, out_n) output */
    float *aux;      /* batchnorm: save_mean (C), save_invstd (C) */
    int32_t *argmax; /* maxpool (B, out_n) */
    uint8_t *mask;   /* dropout (B, out_n) */
} layer;

typedef struct model {
    layer *L;
    int nl;
    int B;       /* largest batch the buffers hold */
    size_t in_n; /* floats per input sample */
    int classes;
    ddp_param *params; /* registration order: each layer's weight then bias, forward order; data
                          may move to the reducer (ddp_reducer_param) */
    float *own[64];    /* the parameters' own allocations */
    int nparams;
    ddp_param *buffers; /* batchnorm running statistics */
    int nbuffers;
    float *scratch; /* conv im2col */
    float *g0, *g1; /* (B, widest) gradient ping-pong */
    char names[64][48];
    char bnames[32][48];
} model;

/* Records st and a formatted one-line message in err (NULL allowed); returns st. */
ddp_status train_err(ddp_error *err, ddp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What the config describes. type "mlp": hidden sizes from hidden[]; "cnn": conv stages of
 * channels[] (3×3, pad 1, batchnorm, activation, maxpool 2), then hidden[]. activation: "relu"
 * or "gelu" (exact, with erf: torch.nn.GELU()), after every hidden layer. */
typedef struct model_spec {
    const char *type;
    const int64_t *hidden;
    size_t nh;
    const int64_t *channels;
    size_t nc;
    float dropout;
    const char *activation;
} model_spec;

/* Builds the model for inputs of (ch, h, w) and `classes` outputs. Weights are initialised from
 * seed, identical on every rank. */
ddp_status model_build(model *m, const model_spec *spec, int ch, int h, int w, int classes, int B,
                       uint64_t seed, ddp_error *err);
void model_free(model *m);

/* Forward of a batch of n ≤ B samples; returns the logits (n, classes), owned by m. step and
 * sample_offset seed dropout (the same on every world size for the same global sample). */
const float *model_forward(model *m, const float *x, int n, bool train, uint64_t seed,
                           uint64_t step, uint64_t sample_offset, ddp_error *err);

/* Backward from dlogits (n, classes), accumulating into the reducer's gradients; marks each
 * layer's parameters ready as soon as they are final (when red is not NULL). */
ddp_status model_backward(model *m, const float *x, const float *dlogits, int n, bool train,
                          ddp_reducer *red);

#endif /* DDPTRAIN_MODEL_H */
