/*
 * failing_onednn.c — for tests only: a oneDNN that loads, passes ddpc's probe (it is the real
 * libdnnl.so.2, which this library needs: every other dnnl_ symbol that dlsym looks up through
 * this library's handle is found there) and then fails every product it is asked to run, as
 * oneDNN out of memory would. Loaded by ddptrain through DDP_ONEDNN_LIB, it makes each bf16
 * product fall back to float32 (src/kernels/cpu/onednn.c), so that the tests can see that the
 * fallback is reported (integration.device).
 */
#include <oneapi/dnnl/dnnl.h>

dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream,
                                     int nargs, const dnnl_exec_arg_t *args)
{
    (void)primitive, (void)stream, (void)nargs, (void)args;
    return dnnl_out_of_memory;
}
