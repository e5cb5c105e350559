/*
 * kernels/gpu.c — libddp's side of the GPU module (kernels/gpu_module.h): kernels.h's
 * ddp__cuda_* entry points, which load libddp_gpu.so with dlopen on their first call and forward
 * through its table (group/nccl/proxy.c does the same for the GPU backends). libddp links no CUDA
 * library; a program that never asks for a GPU (device cpu, no GPU count, no GPU group) never
 * calls these, so never maps libcudart, libcublas, libcublasLt or libnccl.
 *
 * Where the module is looked for, first found wins (docs/gpu.md):
 *   1. DDP_GPU_MODULE (ddp_settings.gpu_module): that file, and nothing else;
 *   2. next to the code of libddp (dladdr: the executable for the static libddp, else the shared
 *      library), and in ../lib from there;
 *   3. next to the executable (/proc/self/exe), and in ../lib from there;
 *   4. the build tree's lib/ (DDP_GPU_MODULE_BUILD_DIR), then the install lib dir
 *      (DDP_GPU_MODULE_INSTALL_DIR);
 *   5. the dynamic linker's own search for "libddp_gpu.so" (LD_LIBRARY_PATH, ld.so.cache).
 * A file that exists but does not load (libcublas.so.13 not found, a stale ABI) is an error
 * naming it and dlerror(); the search does not go on past it. Without DDP_CUDA only 1 is tried:
 * otherwise these say the build has no CUDA. The outcome is kept for the process's life.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ddp/tensor.h"
#include "ddp/world.h"
#include "group/group_int.h"
#include "group/nccl/nccl_int.h"
#include "kernels/gpu_module.h"
#include "util/util.h"

/* What the module borrows from libddp (gpu_module.h): its GPU backends' helpers. */
static const ddp__gpu_host host = {
    .error_set = ddp_error_set,
    .fmt = ddp__fmt,
    .fmt_duration = ddp__fmt_duration,
    .now_ms = ddp__now_ms,
    .dtype_size = ddp_dtype_size,
    .gpu_fail_msg = ddp__gpu_fail_msg,
    .nccl_uid_exchange = ddp__nccl_uid_exchange,
    .mpi_boot_bcast = ddp__mpi_boot_bcast,
    .watchdog_start = ddp__watchdog_start,
    .watchdog_stop = ddp__watchdog_stop,
    .watchdog_track = ddp__watchdog_track,
    .watchdog_untrack = ddp__watchdog_untrack,
    .watchdog_step = ddp__watchdog_step,
    .watchdog_fail = ddp__watchdog_fail,
    .watchdog_error = ddp__watchdog_error,
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool tried;                 /* under mu */
static const ddp__gpu_api *loaded; /* under mu; non-NULL once loaded */
static ddp_status load_st;         /* under mu: the failure, when tried and !loaded */
static char load_msg[DDP_ERRMSG_MAX];
static char loaded_path[PATH_MAX];

static void fail(ddp_status st, const char *fmt, ...) DDP_PRINTF(2, 3);
static void fail(ddp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(load_msg, sizeof load_msg, fmt, ap);
    va_end(ap);
    load_st = st;
}

/* dlopen's last message, never NULL, without its leading "path: " when it names path. */
static const char *dl_why(const char *path)
{
    const char *e = dlerror();
    if (!e)
        return "unknown dlopen error";
    size_t n = strlen(path);
    return strncmp(e, path, n) == 0 && strncmp(e + n, ": ", 2) == 0 ? e + n + 2 : e;
}

/* Loads path (a file, or a bare name for the dynamic linker's search) and checks its table. */
static bool open_module(const char *path)
{
    (void)dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fail(DDP_ERR_NOT_FOUND,
             "cuda: cannot load the GPU module %s: %s; HINT: it needs the CUDA libraries it was "
             "built with (libcublas.so.13, libcublasLt.so.13, libcudnn.so.9) on the library "
             "path (LD_LIBRARY_PATH or CUDA's lib64)",
             path, dl_why(path));
        return false;
    }
    void *sym = dlsym(h, DDP_GPU_MODULE_ENTRY);
    if (!sym) {
        fail(DDP_ERR_NOT_FOUND,
             "cuda: %s is not a ddpc GPU module (%s); HINT: point DDP_GPU_MODULE at the "
             "libddp_gpu.so built with this libddp",
             path, dl_why(path));
        dlclose(h);
        return false;
    }
    ddp__gpu_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry); /* dlsym's object pointer to a function pointer */
    const ddp__gpu_api *t = entry();
    if (!t || t->abi != DDP_GPU_MODULE_ABI || t->size != sizeof(ddp__gpu_api)) {
        fail(DDP_ERR_NOT_FOUND,
             "cuda: the GPU module %s has ABI %u (a %u-byte table) but this libddp needs ABI %d "
             "(%zu bytes): a stale module from another build; HINT: rebuild and install "
             "libddp_gpu.so together with libddp",
             path, t ? t->abi : 0u, t ? t->size : 0u, DDP_GPU_MODULE_ABI, sizeof(ddp__gpu_api));
        dlclose(h);
        return false;
    }
    if (!t->set_host || !t->device_count || !t->device_name || !t->gpt_create || !t->gpt_free ||
        !t->gpt_set_params || !t->gpt_forward || !t->gpt_backward || !t->cuda_devops) {
        fail(DDP_ERR_NOT_FOUND, "cuda: the GPU module %s has an incomplete table (a NULL entry)",
             path);
        dlclose(h);
        return false;
    }
    t->set_host(&host);
    ddp__fmt(loaded_path, sizeof loaded_path, "%s", path);
    loaded = t; /* the handle stays open for the process's life */
    return true;
}

#ifdef DDP_GPU_MODULE_BUILD_DIR
/* Adds dir/DDP_GPU_MODULE_FILE and dir/../lib/DDP_GPU_MODULE_FILE for the directory of file. */
static int add_beside(char (*cand)[PATH_MAX], int n, const char *file)
{
    const char *slash = strrchr(file, '/');
    if (!slash)
        return n;
    int len = (int)(slash - file);
    ddp__fmt(cand[n++], PATH_MAX, "%.*s/%s", len, file, DDP_GPU_MODULE_FILE);
    ddp__fmt(cand[n++], PATH_MAX, "%.*s/../lib/%s", len, file, DDP_GPU_MODULE_FILE);
    return n;
}
#endif

static void load(void)
{
    ddp_settings s;
    memset(&s, 0, sizeof s);
    ddp_error e = {0};
    if (ddp__settings_from_env(&s, &e) != DDP_OK) {
        fail(DDP_ERR_INVALID, "cuda: %s", e.msg);
        return;
    }
    if (s.gpu_module[0]) { /* the override: that file and nothing else */
        (void)open_module(s.gpu_module);
        return;
    }
#ifndef DDP_GPU_MODULE_BUILD_DIR
    fail(DDP_ERR_NOT_FOUND,
         "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); HINT: reconfigure with nvcc "
         "on the PATH (or -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc) and -DDDP_CUDA=ON, or "
         "set DDP_GPU_MODULE to a libddp_gpu.so");
#else
    static char cand[6][PATH_MAX];
    int n = 0;
    Dl_info info;
    if (dladdr(&tried, &info) && info.dli_fname && info.dli_fname[0] == '/') /* not argv[0] */
        n = add_beside(cand, n, info.dli_fname);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        n = add_beside(cand, n, exe);
    }
    ddp__fmt(cand[n++], PATH_MAX, "%s/%s", DDP_GPU_MODULE_BUILD_DIR, DDP_GPU_MODULE_FILE);
    ddp__fmt(cand[n++], PATH_MAX, "%s/%s", DDP_GPU_MODULE_INSTALL_DIR, DDP_GPU_MODULE_FILE);
    for (int i = 0; i < n; i++)
        if (access(cand[i], F_OK) == 0) {
            (void)open_module(cand[i]);
            return;
        }
    if (open_module(DDP_GPU_MODULE_FILE))
        return;
    /* Found by the dynamic linker but it did not load (its libcublas missing, a stale ABI):
     * open_module's message stands. */
    if (!strstr(load_msg, DDP_GPU_MODULE_FILE ": cannot open shared object file"))
        return;
    fail(DDP_ERR_NOT_FOUND,
         "cuda: the GPU module %s was not found (not beside the program or in its ../lib, not "
         "in %s or %s, not on the library path); HINT: build it (DDP_CUDA=ON) and keep it "
         "beside libddp, or set DDP_GPU_MODULE=/path/to/%s",
         DDP_GPU_MODULE_FILE, DDP_GPU_MODULE_BUILD_DIR, DDP_GPU_MODULE_INSTALL_DIR,
         DDP_GPU_MODULE_FILE);
#endif
}

ddp_status ddp__gpu_module(const ddp__gpu_api **out, ddp_error *err)
{
    pthread_mutex_lock(&mu);
    if (!tried) {
        tried = true;
        load();
    }
    const ddp__gpu_api *t = loaded;
    ddp_status st = t ? DDP_OK : load_st;
    if (!t)
        (void)ddp__err(err, st, "%s", load_msg);
    pthread_mutex_unlock(&mu);
    *out = t;
    return st;
}

const char *ddp__gpu_module_path(void)
{
    pthread_mutex_lock(&mu);
    const char *p = loaded ? loaded_path : "";
    pthread_mutex_unlock(&mu);
    return p;
}

/* ---- kernels.h's entry points ---------------------------------------------------------------- */

ddp_status ddp__cuda_device_count(int *n, ddp_error *err)
{
    if (!n)
        return ddp__err(err, DDP_ERR_INVALID, "cuda device count: the output n is NULL");
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st : t->device_count(n, err);
}

ddp_status ddp__cuda_device_name(int idx, char *name, size_t cap, ddp_error *err)
{
    if (!name || cap == 0)
        return ddp__err(err, DDP_ERR_INVALID, "cuda device name: no output buffer");
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st : t->device_name(idx, name, cap, err);
}

ddp_status ddp__cuda_gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                                ddp__cuda_gpt **out, ddp_error *err)
{
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st : t->gpt_create(cfg, counts, n, out, err);
}

void ddp__cuda_gpt_free(ddp__cuda_gpt *g)
{
    const ddp__gpu_api *t;
    if (g && ddp__gpu_module(&t, NULL) == DDP_OK) /* g exists: the module is loaded */
        t->gpt_free(g);
}

ddp_status ddp__cuda_gpt_set_params(ddp__cuda_gpt *g, const float *const *data_host, ddp_error *err)
{
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st : t->gpt_set_params(g, data_host, err);
}

ddp_status ddp__cuda_gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                                 int n, int T, bool train, bool last_logits, float grad_scale,
                                 uint64_t step, uint64_t sample_offset, double *loss_sum,
                                 int *count, int64_t *correct, float *logits_host, ddp_error *err)
{
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st
              : t->gpt_forward(g, tokens, targets, n, T, train, last_logits, grad_scale, step,
                               sample_offset, loss_sum, count, correct, logits_host, err);
}

ddp_status ddp__cuda_gpt_backward(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err)
{
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st : t->gpt_backward(g, grads_host, err);
}

/* An entry point the module may lack (why: a string saying what is missing and what to do):
 * a module without it (built without cuDNN, the tests' fakes) says so. */
#define DDP__GPU_CALL_OR(why, member, ...)                                                         \
    do {                                                                                           \
        const ddp__gpu_api *t;                                                                     \
        ddp_status st_ = ddp__gpu_module(&t, err);                                                 \
        if (st_)                                                                                   \
            return st_;                                                                            \
        if (!t->member)                                                                            \
            return ddp__err(err, DDP_ERR_NOT_FOUND, "the GPU module %s has " why,                  \
                            ddp__gpu_module_path());                                               \
        return t->member(__VA_ARGS__);                                                             \
    } while (0)
#define DDP__GPU_CALL(member, ...)                                                                 \
    DDP__GPU_CALL_OR("no device-resident training (" #member "); HINT: use the libddp_gpu.so "     \
                     "built with this libddp",                                                     \
                     member, __VA_ARGS__)

ddp_status ddp__cuda_mem_info(int idx, size_t *used, size_t *total, ddp_error *err)
{
    if (!used || !total)
        return ddp__err(err, DDP_ERR_INVALID, "cuda memory: no output");
    DDP__GPU_CALL_OR("no memory query (mem_info); HINT: use the libddp_gpu.so built with this "
                     "libddp",
                     mem_info, idx, used, total, err);
}

ddp_status ddp__cuda_gpt_dev_info(ddp__cuda_gpt *g, float **params_dev, void **stream,
                                  ddp_error *err)
{
    DDP__GPU_CALL(gpt_dev_info, g, params_dev, stream, err);
}

ddp_status ddp__cuda_gpt_get_params(ddp__cuda_gpt *g, float *const *data_host, ddp_error *err)
{
    DDP__GPU_CALL(gpt_get_params, g, data_host, err);
}

ddp_status ddp__cuda_gpt_backward_dev(ddp__cuda_gpt *g, float *const *grads_dev,
                                      ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                      ddp_error *err)
{
    DDP__GPU_CALL(gpt_backward_dev, g, grads_dev, ready, ctx, err);
}

ddp_status ddp__cuda_gpt_optim_init(ddp__cuda_gpt *g, int nstates, ddp_error *err)
{
    DDP__GPU_CALL(gpt_optim_init, g, nstates, err);
}

ddp_status ddp__cuda_gpt_optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a, ddp_error *err)
{
    DDP__GPU_CALL(gpt_optim_step, g, a, err);
}

ddp_status ddp__cuda_gpt_optim_state(ddp__cuda_gpt *g, int s, float *const *arrays, bool to_host,
                                     ddp_error *err)
{
    DDP__GPU_CALL(gpt_optim_state, g, s, arrays, to_host, err);
}

ddp_status ddp__cuda_gpt_bind_params(ddp__cuda_gpt *g, float *const *params_dev, ddp_error *err)
{
    DDP__GPU_CALL(gpt_bind_params, g, params_dev, err);
}

ddp_status ddp__cuda_gpt_state_dev(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err)
{
    DDP__GPU_CALL(gpt_state_dev, g, s, dev, err);
}

ddp_status ddp__cuda_gpt_forward_cached(ddp__cuda_gpt *g, const int32_t *tokens, int T, int past,
                                        float *logits_host, ddp_error *err)
{
    DDP__GPU_CALL_OR("no key/value cache (gpt_forward_cached); HINT: use the libddp_gpu.so built "
                     "with this libddp",
                     gpt_forward_cached, g, tokens, T, past, logits_host, err);
}

ddp_status ddp__cuda_gpt_optim_keep(ddp__cuda_gpt *g, const size_t *lo, const size_t *hi,
                                    ddp_error *err)
{
    DDP__GPU_CALL(gpt_optim_keep, g, lo, hi, err);
}

#define DDP__GPU_CLS_CALL(member, ...)                                                             \
    DDP__GPU_CALL_OR("no MLP/CNN (" #member                                                        \
                     "): it was built without cuDNN; HINT: install cuDNN 9 "                       \
                     "where nvcc is and rebuild, or use device cpu for mlp and cnn",               \
                     member, __VA_ARGS__)

ddp_status ddp__cuda_cls_create(const ddp__cuda_cls_cfg *cfg, const size_t *counts, size_t np,
                                const size_t *bcounts, size_t nb, ddp__cuda_cls **out,
                                ddp_error *err)
{
    DDP__GPU_CLS_CALL(cls_create, cfg, counts, np, bcounts, nb, out, err);
}

void ddp__cuda_cls_free(ddp__cuda_cls *g)
{
    const ddp__gpu_api *t;
    if (g && ddp__gpu_module(&t, NULL) == DDP_OK && t->cls_free) /* g exists: it is loaded */
        t->cls_free(g);
}

ddp_status ddp__cuda_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                                const float *const *buffers_host, ddp_error *err)
{
    DDP__GPU_CLS_CALL(cls_upload, g, params_host, buffers_host, err);
}

ddp_status ddp__cuda_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *loss_sum,
                                 int64_t *correct, float *logits_host, ddp_error *err)
{
    DDP__GPU_CLS_CALL(cls_forward, g, b, loss_sum, correct, logits_host, err);
}

ddp_status ddp__cuda_cls_get_buffers(ddp__cuda_cls *g, float *const *buffers_host, ddp_error *err)
{
    DDP__GPU_CLS_CALL(cls_get_buffers, g, buffers_host, err);
}

ddp_status ddp__cuda_cls_backward(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err)
{
    DDP__GPU_CLS_CALL(cls_backward, g, grads_host, err);
}

/* The classifier's device-resident training: a module without it says so. */
#define DDP__GPU_CLS_RES_CALL(member, ...)                                                         \
    DDP__GPU_CALL_OR("no device-resident MLP/CNN (" #member "); HINT: use the libddp_gpu.so "      \
                     "built with this libddp",                                                     \
                     member, __VA_ARGS__)

ddp_status ddp__cuda_cls_dev_info(ddp__cuda_cls *g, float **params_dev, float **buffers_dev,
                                  void **stream, ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_dev_info, g, params_dev, buffers_dev, stream, err);
}

ddp_status ddp__cuda_cls_get_params(ddp__cuda_cls *g, float *const *params_host, ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_get_params, g, params_host, err);
}

ddp_status ddp__cuda_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                      ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                      ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_backward_dev, g, grads_dev, ready, ctx, err);
}

ddp_status ddp__cuda_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_optim_init, g, nstates, err);
}

ddp_status ddp__cuda_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_optim_step, g, a, err);
}

ddp_status ddp__cuda_cls_optim_state(ddp__cuda_cls *g, int s, float *const *arrays, bool to_host,
                                     ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_optim_state, g, s, arrays, to_host, err);
}

ddp_status ddp__cuda_cls_bind_params(ddp__cuda_cls *g, float *const *params_dev, ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_bind_params, g, params_dev, err);
}

ddp_status ddp__cuda_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_state_dev, g, s, dev, err);
}

ddp_status ddp__cuda_cls_optim_keep(ddp__cuda_cls *g, const size_t *lo, const size_t *hi,
                                    ddp_error *err)
{
    DDP__GPU_CLS_RES_CALL(cls_optim_keep, g, lo, hi, err);
}
