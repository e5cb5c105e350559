/*
 * fake_gpu_resident.h — what the fake GPU module's two models (fake_gpu_gpt.c's GPT,
 * fake_gpu_cls.c's MLP and CNN) share (test-only): the CPU model bound to two flat "device" buffers
 * laid out as the real module lays its own, the device-resident optimizer on state buffers laid out
 * like them (ddp_optim_step_range's arithmetic), the parameters bound to the caller's arrays for
 * the sharded step, and the injected fp16 overflow. The host-memory twin of src/kernels/cuda's
 * resident.cu; the contracts are kernels.h's ddp__cuda_gpt_optim_init … ddp__cuda_gpt_state_dev.
 */
#ifndef DDP_TEST_FAKE_GPU_RESIDENT_H
#define DDP_TEST_FAKE_GPU_RESIDENT_H

#include "ddp/model.h"
#include "kernels/kernels.h"

typedef struct fake_res {
    const char *name;         /* "fake gpu gpt", "fake gpu classifier": the messages' prefix */
    ddp_model *m;             /* the CPU model (the caller's), bound to params and grads */
    size_t np, total;         /* tensors; floats in the flat buffers */
    size_t *counts, *offsets; /* (np,) */
    float *params, *grads;    /* (total + 1,) the "device" flat buffers */
    float *state[2];          /* (total + 1,) the optimizer's, laid out like params; after keep
                               * each parameter's kept elements one after the other */
    int nstates;
    size_t *klo, *khi, *koff; /* keep's ranges and where they start in state, or NULL: all */
    float *tmp;               /* (largest count,) a scaled gradient */
    float **bound;            /* bind_params's arrays, or NULL: the flat buffer's */
} fake_res;

/* Records "NAME: msg" and st in err (may be NULL); returns st. */
ddp_status fake_res_fail(ddp_error *err, ddp_status st, const char *name, const char *msg);

/* Lays out m's np parameters (their counts checked against m's) in r's flat buffers, moves their
 * values there and binds m to them. r is zeroed but for name; r->m is set to m, which stays the
 * caller's. On error r holds what fake_res_free releases. */
ddp_status fake_res_init(fake_res *r, ddp_model *m, const size_t *counts, size_t np,
                         ddp_error *err);
/* Frees what r owns (not r->m); a zeroed r is a no-op. */
void fake_res_free(fake_res *r);

/* Parameter i's values: in the flat buffer, or where bind_params put them. */
float *fake_res_param(const fake_res *r, size_t i);

ddp_status fake_res_optim_init(fake_res *r, int nstates, ddp_error *err);
ddp_status fake_res_optim_step(fake_res *r, const ddp__cuda_optim_args *a, ddp_error *err);
ddp_status fake_res_optim_state(fake_res *r, int s, float *const *host, bool to_host,
                                ddp_error *err);
/* The CPU model's values move to the given arrays (or, pd NULL, back into the flat buffer). */
ddp_status fake_res_bind_params(fake_res *r, float *const *pd, ddp_error *err);
ddp_status fake_res_state_dev(const fake_res *r, int s, float **dev, ddp_error *err);
ddp_status fake_res_optim_keep(fake_res *r, const size_t *lo, const size_t *hi, ddp_error *err);

/* Whether this backward, the *calls-th of the process (incremented here), is the one to add an
 * inf: DDP_TEST_FAKE_GPU_INF_AT=k on the rank DDP_TEST_FAKE_GPU_INF_RANK (default 0). */
bool fake_res_inject_inf(int *calls);

/* A resident backward's ready callback, passed on by fake_res_pass_ready (ctx: a fake_marks),
 * which first adds an inf into first[0] when parameter 0 is reported and inf is set. */
typedef struct fake_marks {
    ddp_status (*ready)(void *ctx, size_t i);
    void *ctx;
    float *first; /* parameter 0's gradient, where an injected inf goes */
    bool inf;
} fake_marks;
ddp_status fake_res_pass_ready(void *ctx, size_t i);

#endif /* DDP_TEST_FAKE_GPU_RESIDENT_H */
