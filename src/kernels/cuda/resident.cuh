/*
 * kernels/cuda/resident.cuh — the device-resident optimizer that the GPT (gpt.cu) and the MLP/CNN
 * (classifier.cu) share: the optimizer's state as one or two flat buffers laid out like the
 * model's parameters, stepped on the model's stream by optim.cu's AdamW and devmath.cu's SGD, and
 * the parameters' values bound to the caller's device arrays for the sharded step (kernels.h's
 * ddp__cuda_gpt_optim_init … ddp__cuda_gpt_state_dev; the classifier's have the same contracts).
 * Each model keeps one ddp__cuda_resident beside its own layout and its kernel entries call these
 * functions; what differs between the models (the classifier's resident flag, the GPT's 16-bit
 * copy zeroed at bind) stays in the model. Private to src/kernels/cuda.
 */
#ifndef DDP_KERNELS_CUDA_RESIDENT_CUH
#define DDP_KERNELS_CUDA_RESIDENT_CUH

#include "common.cuh"

/* Zeroed (as in the model's calloc) until ddp__cuda_resident_init; the layout fields borrow the
 * model's arrays, which outlive it. Used from the model's thread only. */
struct ddp__cuda_resident {
    const char *name;               /* "cuda gpt", "cuda classifier": the messages' prefix */
    ddp__cuda_ctx *ctx;             /* the model's (its device and stream) */
    size_t np, total;               /* tensors; floats in the flat buffers */
    const size_t *counts, *offsets; /* (np,) each parameter's length and flat-buffer offset */
    float *params;                  /* (total,) the model's flat parameter buffer */
    float *ost[2]; /* the optimizer's state: (total,) laid out like params, or after keep the
                    * kept elements of each parameter one after the other, (kept_total,) */
    int nstates;   /* how many states optim_init asked for (0: none yet); each of ost is made,
                    * zeroed, at its first use (NULL until then) */
    /* keep's narrowing (ZeRO-1's memory split), NULL until keep: parameter i's state holds its
     * elements [klo[i], khi[i]) only, at ost[s] + koff[i]. */
    size_t *klo, *khi, *koff;
    size_t kept_total;
    float **bound; /* (np,) bind_params's arrays for the parameters' values, or NULL */
};

/* Points r at the model's layout, once at the end of the model's create; name is static. */
void ddp__cuda_resident_init(ddp__cuda_resident *r, const char *name, ddp__cuda_ctx *ctx, size_t np,
                             size_t total, const size_t *counts, const size_t *offsets,
                             float *params);
/* Frees the state buffers and the bound list (the caller's arrays stay the caller's). A zeroed r
 * is a no-op; the model has synchronised its stream first. */
void ddp__cuda_resident_free(ddp__cuda_resident *r);

/* Parameter i's values: the flat buffer's, or where bind_params put them. */
static inline float *ddp__cuda_resident_param(const ddp__cuda_resident *r, size_t i)
{
    return r->bound ? r->bound[i] : r->params + r->offsets[i];
}

/* Parameter i's kept elements [*lo, *hi) and where they start in the state buffers. */
static inline size_t ddp__cuda_resident_kept(const ddp__cuda_resident *r, size_t i, size_t *lo,
                                             size_t *hi)
{
    *lo = r->klo ? r->klo[i] : 0;
    *hi = r->khi ? r->khi[i] : r->counts[i];
    return r->koff ? r->koff[i] : r->offsets[i];
}

/* The contracts of kernels.h's ddp__cuda_gpt_optim_init, _optim_step, _optim_state, _bind_params,
 * _state_dev and _optim_keep, on r; errors name r->name. Each makes the model's device current
 * first; step, state and state_dev make the state buffers at their first use. */
ddp_status ddp__cuda_resident_optim_init(ddp__cuda_resident *r, int nstates, ddp_error *err);
ddp_status ddp__cuda_resident_optim_step(ddp__cuda_resident *r, const ddp__cuda_optim_args *a,
                                         ddp_error *err);
ddp_status ddp__cuda_resident_optim_state(ddp__cuda_resident *r, int s, float *const *host,
                                          bool to_host, ddp_error *err);
ddp_status ddp__cuda_resident_bind_params(ddp__cuda_resident *r, float *const *params_dev,
                                          ddp_error *err);
ddp_status ddp__cuda_resident_state_dev(ddp__cuda_resident *r, int s, float **dev, ddp_error *err);
ddp_status ddp__cuda_resident_optim_keep(ddp__cuda_resident *r, const size_t *lo, const size_t *hi,
                                         ddp_error *err);

#endif /* DDP_KERNELS_CUDA_RESIDENT_CUH */
