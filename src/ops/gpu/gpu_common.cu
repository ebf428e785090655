/* gpu_common.cu — device query, memory, streams and the error recorder of
 * the GPU backend (everything in gpu_api.h that is not a kernel). */
#include "gpu.h"
#include "core/switches.h"
#include "core/threadpool.h" /* nstf_signals_held */

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

extern "C" nstf_status nstf_gpu_fail(const char *stmt, const char *file, int line, int err,
                                     const char *err_str) {
    int dev = -1;
    (void)gpuGetDevice(&dev);
    /* A failed runtime call also leaves its code as the "last error"; clear
     * it so the next launch check does not report this failure again. */
    (void)gpuGetLastError();
    const char *base = strrchr(file, '/');
    return nstf_set_error(NSTF_ERR_GPU, "%s call `%s` failed at %s:%d on device %d: %s (%d)",
                          NSTF_GPU_VENDOR, stmt, base ? base + 1 : file, line, dev,
                          err_str ? err_str : "?", err);
}

/* The runtime starts threads of its own when it initializes (the device
 * count) and when it makes a device's context (setting or querying a
 * device): those calls run with the asynchronous signals blocked, which
 * the runtime's threads inherit, as the library's own threads do
 * (core/threadpool.h). */
extern "C" int nstf_gpu_device_count(void) {
    const nstf_signals_held held;
    int n = 0;
    if (gpuGetDeviceCount(&n) != gpuSuccess) {
        (void)gpuGetLastError(); /* "no device" is an answer, not a sticky error */
        return 0;
    }
    return n;
}

/* The gfx targets this HIP build carries code objects for, as a string like
 * "gfx90a,gfx942" (CMake and scripts/build_hip.sh define it from GPU_TARGETS;
 * the host pass of hipcc cannot see the --offload-arch list by itself). */
#if defined(NSTF_GPU_HIP) && defined(NSTF_HIP_TARGETS)
static bool nstf_hip_target_built(const char *arch) {
    const char *p = NSTF_HIP_TARGETS;
    const size_t n = strlen(arch);
    while (*p) {
        size_t len = strcspn(p, ",;");
        if (len == n && strncmp(p, arch, n) == 0) return true;
        p += len;
        if (*p) p++;
    }
    return false;
}
#endif

extern "C" nstf_status nstf_gpu_check_device(int dev) {
#if defined(NSTF_GPU_HIP) && defined(NSTF_HIP_TARGETS)
    gpuDeviceProp_t p;
    GPU_CHECK(gpuGetDeviceProperties(&p, dev));
    char arch[sizeof p.gcnArchName];
    snprintf(arch, sizeof arch, "%s", p.gcnArchName); /* "gfx90a:sramecc+:xnack-" -> "gfx90a" */
    char *colon = strchr(arch, ':');
    if (colon) *colon = 0;
    if (!nstf_hip_target_built(arch))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "HIP device %d (%s) is %s, but this build has code for %s only: rebuild with "
                              "-DGPU_TARGETS=%s, or choose another device with HIP_VISIBLE_DEVICES",
                              dev, p.name, arch, NSTF_HIP_TARGETS, arch);
#else
    (void)dev; /* CUDA: the sm_80 code object and PTX cover later cards */
#endif
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_set_device(int dev) {
    const nstf_signals_held held;
    GPU_CHECK(gpuSetDevice(dev));
    return nstf_gpu_check_device(dev);
}

/* Programmatic dependent launch: per host thread, off until a caller turns
 * it on; the switch NSTF_PDL=0 keeps it off (for A/B timing). */
static thread_local int pdl_on = 0;

extern "C" int nstf_gpu_set_pdl(int on) {
    const int prev = pdl_on;
    pdl_on = on && nstf_switch_int(NSTF_SW_PDL);
    return prev;
}

extern "C" int nstf_gpu_pdl(void) { return pdl_on; }

extern "C" int nstf_gpu_n_sm(void) {
    static thread_local int n_sm = 0, dev_cached = -1;
    int dev = 0;
    if (gpuGetDevice(&dev) != gpuSuccess) return -1;
    if (dev != dev_cached) {
        gpuDeviceProp_t pr;
        n_sm = gpuGetDeviceProperties(&pr, dev) == gpuSuccess ? pr.multiProcessorCount : 0;
        dev_cached = dev;
    }
    return n_sm;
}

extern "C" nstf_status nstf_gpu_query(int dev, nstf_gpu_info *info) {
    if (!info) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_query: info is NULL");
    const nstf_signals_held held;
    int n = nstf_gpu_device_count();
    if (dev < 0 || dev >= n)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_query: device %d of %d", dev, n);
    gpuDeviceProp_t p;
    GPU_CHECK(gpuGetDeviceProperties(&p, dev));
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", p.name);
#if defined(NSTF_GPU_HIP)
    /* "gfx90a:sramecc+:xnack-" -> "gfx90a" */
    snprintf(info->arch, sizeof info->arch, "%s", p.gcnArchName);
    char *colon = strchr(info->arch, ':');
    if (colon) *colon = 0;
    info->smem_per_block = p.sharedMemPerBlock;
#else
    snprintf(info->arch, sizeof info->arch, "sm_%d%d", p.major, p.minor);
    info->smem_per_block = p.sharedMemPerBlockOptin;
#endif
    info->n_sm = p.multiProcessorCount;
    info->wave_size = p.warpSize;
    info->l2_bytes = (uint64_t)p.l2CacheSize;
    int clock = 0;
#if defined(NSTF_GPU_HIP)
    clock = p.clockRate;
#else
    (void)cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, dev);
#endif
    info->clock_khz = clock;
    int cur = 0;
    GPU_CHECK(gpuGetDevice(&cur));
    GPU_CHECK(gpuSetDevice(dev));
    size_t free_b = 0, total_b = 0;
    gpuError_t e = gpuMemGetInfo(&free_b, &total_b);
    GPU_CHECK(gpuSetDevice(cur));
    GPU_CHECK(e);
    info->free_mem = free_b;
    info->total_mem = total_b;
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_malloc(void **d_ptr, size_t bytes) {
    if (!d_ptr) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_malloc: d_ptr is NULL");
    *d_ptr = NULL;
    gpuError_t e = gpuMalloc(d_ptr, bytes ? bytes : 1);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        int dev = -1;
        (void)gpuGetDevice(&dev);
        return nstf_set_error(NSTF_ERR_OOM,
                              "GPU allocation of %zu bytes failed on device %d: %s", bytes, dev,
                              gpuGetErrorString(e));
    }
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_free(void *d_ptr) {
    if (d_ptr) GPU_CHECK(gpuFree(d_ptr));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_memcpy_h2d(void *d_dst, const void *src, size_t bytes,
                                           void *stream) {
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(gpuMemcpyAsync(d_dst, src, bytes, gpuMemcpyHostToDevice, s));
    GPU_CHECK(gpuStreamSynchronize(s));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_memcpy_d2h(void *dst, const void *d_src, size_t bytes,
                                           void *stream) {
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(gpuMemcpyAsync(dst, d_src, bytes, gpuMemcpyDeviceToHost, s));
    GPU_CHECK(gpuStreamSynchronize(s));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_memcpy_d2d(void *d_dst, const void *d_src, size_t bytes,
                                           void *stream) {
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(gpuMemcpyAsync(d_dst, d_src, bytes, gpuMemcpyDeviceToDevice, s));
    GPU_CHECK(gpuStreamSynchronize(s));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_memset(void *d_ptr, int byte, size_t bytes, void *stream) {
    GPU_CHECK(gpuMemsetAsync(d_ptr, byte, bytes, (gpuStream_t)stream));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_stream_create(void **stream) {
    if (!stream) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_stream_create: NULL");
    gpuStream_t s;
    GPU_CHECK(gpuStreamCreateWithFlags(&s, gpuStreamNonBlocking));
    *stream = (void *)s;
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_stream_destroy(void *stream) {
    if (stream) GPU_CHECK(gpuStreamDestroy((gpuStream_t)stream));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_stream_sync(void *stream) {
    GPU_CHECK(gpuStreamSynchronize((gpuStream_t)stream));
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_host_alloc(void **p, size_t bytes) {
    *p = NULL;
    GPU_CHECK(gpuMallocHost(p, bytes));
    return NSTF_OK;
}

extern "C" void nstf_gpu_host_free(void *p) {
    if (p) (void)gpuFreeHost(p);
}

extern "C" nstf_status nstf_gpu_memcpy_d2h_async(void *dst, const void *d_src, size_t bytes, void *stream) {
    GPU_CHECK(gpuMemcpyAsync(dst, d_src, bytes, gpuMemcpyDeviceToHost, (gpuStream_t)stream));
    return NSTF_OK;
}
