/*
 * model_int.h — private to src/nn: what a model type implements (a table of operations) and the
 * helpers it builds its parameter list with. model.c does everything common (the list, binding,
 * gradients, argument checks, errors); a type does only its layers.
 *
 * Adding a type: write its ops (build, free, forward, backward, logits, flops) in its own file,
 * name the table ddp__<type>_ops, and add it to the table in model.c. A type with a device model
 * embeds a ddp__resident (below), points m->res at it and takes ddp__resident_ops (resident.c).
 */
#ifndef DDP_NN_MODEL_INT_H
#define DDP_NN_MODEL_INT_H

#include "ddp/model.h"
#include "ddp/optim.h"
#include "kernels/kernels.h"
#include "util/util.h"

typedef struct ddp_model_ops {
    const char *name; /* the spec's type */
    /* Checks spec and builds: parameters and buffers through ddp__model_add_param/_buffer (in
     * forward order), its own state in m->impl. On failure it returns with a message in err and
     * leaves whatever it allocated reachable from m, for free() to release. */
    ddp_status (*build)(ddp_model *m, const ddp_model_spec *spec, ddp_error *err);
    void (*free)(ddp_model *m); /* its impl; also after a failed build */
    /* b->n is checked already. Records errors with ddp__errmsg(m->err, …). */
    ddp_status (*forward)(ddp_model *m, const ddp_model_batch *b, bool train, ddp_model_out *out);
    /* Called only after a training forward with labels; every params[i].grad is set. */
    ddp_status (*backward)(ddp_model *m, ddp_grad_ready_fn ready, void *ctx);
    const float *(*logits)(const ddp_model *m, size_t *rows, size_t *cols);
    /* Training FLOPs (forward + backward) of one sample; seq_len as ddp_model_flops_per_sample. */
    double (*flops)(const ddp_model *m, int seq_len);
    /* Device-resident training (ddp/model.h), NULL for types without it. Arguments are checked
     * by model.c (m is resident, i in range) except for resident itself. Errors go to m->err. */
    const struct ddp_model_resident_ops *resident;
} ddp_model_ops;

typedef struct ddp_model_resident_ops {
    ddp_status (*start)(ddp_model *m, const struct ddp_optim_opts *opts, ddp_error *err);
    float *(*param)(const ddp_model *m, size_t i);
    float *(*buffer)(const ddp_model *m, size_t j); /* NULL: a type without buffers */
    void *(*stream)(const ddp_model *m);
    void (*bind_grad)(ddp_model *m, size_t i, float *grad_dev);
    ddp_status (*step)(ddp_model *m, size_t i, size_t lo, size_t hi, uint64_t step, float lr,
                       float grad_scale);
    ddp_status (*bind_params)(ddp_model *m, float *const *params_dev); /* NULL: unbind */
    ddp_status (*state)(ddp_model *m, int s, float **dev);
    ddp_status (*keep)(ddp_model *m, const size_t *lo, const size_t *hi);
    /* to_host: device → host; opt may be NULL (parameters only). */
    ddp_status (*sync)(ddp_model *m, struct ddp_optim *opt, bool to_host);
} ddp_model_resident_ops;

struct ddp_model {
    const ddp_model_ops *ops;
    void *impl;              /* the type's state */
    int max_batch;           /* spec.max_batch */
    ddp__gemm_kind gemm;     /* the products' arithmetic on the CPU: bf16 for precision bf16 */
    ddp_model_param *params; /* (n_params,), grown during build, fixed after */
    size_t n_params, cap_params;
    float **own_data; /* (n_params,) the model's allocation of each parameter's values, or NULL */
    float **own_grad; /* (n_params,) the same for gradients */
    ddp_model_param *buffers;
    size_t n_buffers, cap_buffers;
    bool can_backward;           /* a training forward with labels, not yet backward */
    bool resident;               /* ddp_model_resident: training state on the device */
    ddp_grad_acquire_fn acquire; /* during ddp_model_backward_pooled: where gradients go (the
                                    type calls ddp__model_acquire), else NULL */
    void *acquire_ctx;
    bool loss_kept; /* set by a type's forward when it kept the loss's gradient although no
                       item counted (gpt: every target −1), so that backward may run (and add
                       zeros); cleared before each forward */
    char err[DDP_ERRMSG_MAX];

    struct ddp__resident *res; /* the type's device-model state (resident.c), or NULL */
};

/* Appends a parameter called name (copied) of shape (ndim dims), values zeroed in memory the
 * model owns; its index is the n_params before the call. */
ddp_status ddp__model_add_param(ddp_model *m, const char *name, int ndim, const int64_t *shape,
                                bool decay, ddp_error *err);
/* Backward is about to write the gradients of the n parameters idx[] (−1 skipped): in a pooled
 * backward, each one's grad pointer is set from m->acquire (a failure recorded on m); else a
 * no-op. */
ddp_status ddp__model_acquire(ddp_model *m, int n, const int *idx);
/* Appends a 1-D buffer of count values, all fill. */
ddp_status ddp__model_add_buffer(ddp_model *m, const char *name, size_t count, float fill,
                                 ddp_error *err);

/* The host side of a type's device model (device cuda), shared by the types that have one
 * (resident.c): embedded in the type's impl, pointed at by m->res from build on. Exactly one of
 * cls and gpt is set once the device model is made (neither on the CPU); which one picks the
 * kernels.h entry points that resident.c calls. The arrays are the type's to fill before each
 * call into the device model; ddp__resident_free releases them (not the device model). */
typedef struct ddp__resident {
    ddp__cuda_cls *cls;           /* the MLP's or CNN's device model, owned by the type */
    ddp__cuda_gpt *gpt;           /* the GPT's, owned by the type */
    const float **pdata, **bdata; /* (n_params,), (n_buffers,) host arrays for an upload */
    float **pgrad, **bout;        /* (n_params,), (n_buffers,) host arrays for a download */
    /* device-resident training (m->resident): the parameters' and buffers' device arrays, the
     * device gradients backward adds into (bound by the caller), the optimizer's settings */
    float **dparam, **dbuf, **dgrad;
    void *stream; /* the device model's cudaStream_t */
    ddp_optim_opts oo;
    size_t *klo, *khi; /* (n_params,) the device optimizer's kept elements (keep), or NULL: all */
} ddp__resident;

/* After the device model is made: m->res's device arrays (allocated) and the stream, as the
 * module has them. Errors in err; what was allocated is left for ddp__resident_free. */
ddp_status ddp__resident_init(ddp_model *m, ddp_error *err);
/* The host arrays of r (NULL: no-op); the device model stays the type's to free. */
void ddp__resident_free(ddp__resident *r);
/* A resident model's backward: the device model adds the gradients into the bound device
 * gradients and reports each as soon as its kernels are queued; anything it did not report is
 * reported after, so that every parameter is reported once whatever the module does. */
ddp_status ddp__resident_backward(ddp_model *m, ddp_grad_ready_fn ready, void *ctx);

/* The resident operations of every type with a device model (through m->res). */
extern const ddp_model_resident_ops ddp__resident_ops;

extern const ddp_model_ops ddp__mlp_ops, ddp__cnn_ops, ddp__gpt_ops;

#endif /* DDP_NN_MODEL_INT_H */
