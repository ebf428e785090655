/* graph.cu — the runtime pieces a model forward needs beyond the kernels:
 * stream capture into a replayable graph (CUDA graphs / HIP graphs), timing
 * events, and an asynchronous host-to-device copy for the few bytes (token,
 * position) a captured decode step reads from device memory. */
#include "gpu.h"

extern "C" nstf_status nstf_gpu_memcpy_h2d_async(void *d_dst, const void *src, size_t bytes, void *stream) {
    if (!d_dst || (!src && bytes))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_memcpy_h2d_async: NULL pointer");
    if (!bytes) return NSTF_OK;
    GPU_CHECK(gpuMemcpyAsync(d_dst, src, bytes, gpuMemcpyHostToDevice, (gpuStream_t)stream));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_capture_begin(void *stream) {
    if (!stream) return nstf_set_error(NSTF_ERR_INVALID_ARG, "graph capture needs a created stream, not NULL");
    GPU_CHECK(gpuStreamBeginCapture((gpuStream_t)stream, gpuStreamCaptureModeThreadLocal));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_capture_end(void *stream, void **graph_exec) {
    *graph_exec = NULL;
    gpuGraph_t g = NULL;
    /* Ending the capture also ends it after a failed launch inside it (the
     * stream leaves capture mode either way). */
    gpuError_t e = gpuStreamEndCapture((gpuStream_t)stream, &g);
    if (e != gpuSuccess) {
        if (g) (void)gpuGraphDestroy(g);
        return nstf_gpu_fail("gpuStreamEndCapture", __FILE__, __LINE__, (int)e, gpuGetErrorString(e));
    }
    gpuGraphExec_t x = NULL;
    e = gpuGraphInstantiateWithFlags(&x, g, 0);
    (void)gpuGraphDestroy(g);
    if (e != gpuSuccess) return nstf_gpu_fail("gpuGraphInstantiate", __FILE__, __LINE__, (int)e, gpuGetErrorString(e));
    *graph_exec = (void *)x;
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_graph_launch(void *graph_exec, void *stream) {
    GPU_CHECK(gpuGraphLaunch((gpuGraphExec_t)graph_exec, (gpuStream_t)stream));
    return NSTF_OK;
}

extern "C" void nstf_gpu_graph_destroy(void *graph_exec) {
    if (graph_exec) (void)gpuGraphExecDestroy((gpuGraphExec_t)graph_exec);
}

extern "C" nstf_status nstf_gpu_event_create(void **ev) {
    gpuEvent_t e;
    GPU_CHECK(gpuEventCreate(&e));
    *ev = (void *)e;
    return NSTF_OK;
}

extern "C" void nstf_gpu_event_destroy(void *ev) {
    if (ev) (void)gpuEventDestroy((gpuEvent_t)ev);
}

extern "C" nstf_status nstf_gpu_event_record(void *ev, void *stream) {
    GPU_CHECK(gpuEventRecord((gpuEvent_t)ev, (gpuStream_t)stream));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_event_ms(void *start, void *stop, float *ms) {
    GPU_CHECK(gpuEventSynchronize((gpuEvent_t)stop));
    GPU_CHECK(gpuEventElapsedTime(ms, (gpuEvent_t)start, (gpuEvent_t)stop));
    return NSTF_OK;
}
