/* ccl.cu — collectives over NCCL (RCCL on HIP) and the peer links between
 * devices (gpu_api.h, "collectives and peers").
 *
 * The library is loaded with dlopen at first use (NSTF_CCL_LIBRARY, found
 * through the loader's path, or the file NSTF_NCCL_LIBRARY names): a
 * program that never runs tensor-parallel needs none, and one that does
 * gets a clear error where it is missing. The API is NCCL's; RCCL keeps
 * its names, so only the vendor header's include and library name differ.
 * One process creates every rank's communicator at once (ncclCommInitAll,
 * blocking): no peer can fail to join. Blocking communicators because the
 * non-blocking ones (config.blocking = 0) hand every collective to NCCL's
 * own thread and return ncclInProgress until it is queued: on two H200s
 * that cost 87-105 us per 16 KB all-reduce. A stalled peer still becomes
 * an error: the group's watchdog (dist/comm.c) calls ncclCommAbort from
 * its own thread, which ends the other ranks' waits. Calls that return
 * ncclInProgress anyway are polled with a deadline. NVLink multicast
 * (NVLS) stays off: NCCL_NVLS_ENABLE=0 unless the environment sets it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/switches.h"
#include "core/threadpool.h" /* nstf_signals_held */
#include "gpu.h"

#if defined(NSTF_HAVE_NCCL)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The entry points we use, resolved from the library. */
static struct {
    bool tried, ok;
    char err[256];
    decltype(&ncclGetVersion) get_version;
    decltype(&ncclCommInitAll) init_all;
    decltype(&ncclGetUniqueId) unique_id;
    decltype(&ncclCommInitRank) init_rank;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclReduceScatter) reduce_scatter;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclCommGetAsyncError) async_error;
    decltype(&ncclCommAbort) comm_abort;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclGetErrorString) error_string;
} ccl;

static pthread_mutex_t ccl_mu = PTHREAD_MUTEX_INITIALIZER;

static nstf_status ccl_load(void) {
    pthread_mutex_lock(&ccl_mu);
    if (!ccl.tried) {
        ccl.tried = true;
        setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast stays off unless set */
        const char *path = nstf_switch_str(NSTF_SW_NCCL_LIBRARY);
        void *h = dlopen(path && *path ? path : NSTF_CCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(ccl.err, sizeof ccl.err, "%s", dlerror());
        } else {
            bool all = true;
#define CCL_SYM(field, name) all = all && (*(void **)&ccl.field = dlsym(h, name)) != NULL
            CCL_SYM(get_version, "ncclGetVersion");
            CCL_SYM(init_all, "ncclCommInitAll");
            CCL_SYM(unique_id, "ncclGetUniqueId");
            CCL_SYM(init_rank, "ncclCommInitRank");
            CCL_SYM(all_reduce, "ncclAllReduce");
            CCL_SYM(reduce_scatter, "ncclReduceScatter");
            CCL_SYM(all_gather, "ncclAllGather");
            CCL_SYM(async_error, "ncclCommGetAsyncError");
            CCL_SYM(comm_abort, "ncclCommAbort");
            CCL_SYM(destroy, "ncclCommDestroy");
            CCL_SYM(error_string, "ncclGetErrorString");
#undef CCL_SYM
            if (all) ccl.ok = true;
            else snprintf(ccl.err, sizeof ccl.err, "%s lacks an entry point this build uses (too old?)", NSTF_CCL_LIBRARY);
        }
    }
    const bool ok = ccl.ok;
    pthread_mutex_unlock(&ccl_mu);
    if (!ok)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s is not available (%s): put its directory on LD_LIBRARY_PATH or name the file in "
                              "NSTF_NCCL_LIBRARY",
                              NSTF_CCL_NAME, ccl.err);
    return NSTF_OK;
}

static nstf_status ccl_fail(const char *what, ncclResult_t r) {
    return nstf_set_error(NSTF_ERR_GPU, "%s: %s (%d)", what, ccl.error_string(r), (int)r);
}

/* Wait until the communicator's pending call is done (not ncclInProgress).
 * It spins for the first 2 ms: a decode step's collective is queued within
 * microseconds, and every sleep costs the kernel's timer slack (a 20 us
 * nanosleep took the 16 KB all-reduce to 105 us on two H200s); after that
 * it polls every 20 us until the deadline. */
static ncclResult_t ccl_wait(ncclComm_t c, double deadline) {
    ncclResult_t r = ncclInProgress;
    const double spin_until = now_ms() + 2.0;
    while (ccl.async_error(c, &r) == ncclSuccess && r == ncclInProgress) {
        const double t = now_ms();
        if (t >= deadline) break;
        if (t >= spin_until) {
            const struct timespec ts = {0, 20000L};
            nanosleep(&ts, NULL);
        }
    }
    return r;
}

extern "C" nstf_status nstf_gpu_ccl_init(const int *devs, int n, void **comms, int timeout_ms, char *desc, size_t cap) {
    NSTF_TRY(ccl_load());
    int v = 0;
    (void)ccl.get_version(&v);
    snprintf(desc, cap, "%s %d.%d.%d", NSTF_CCL_NAME, v / 10000, v / 100 % 100, v % 100);
    ncclComm_t c[64] = {0};
    if (n < 1 || n > 64) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%d ranks", n);
    (void)timeout_ms; /* one process makes every rank's communicator: none waits for a peer */
    ncclResult_t r;
    {
        const nstf_signals_held held; /* NCCL's proxy threads leave signals to the program */
        r = ccl.init_all(c, n, devs);
    }
    if (r != ncclSuccess) {
        for (int i = 0; i < n; i++)
            if (c[i]) (void)ccl.comm_abort(c[i]);
        return ccl_fail("ncclCommInitAll", r);
    }
    for (int i = 0; i < n; i++) comms[i] = c[i];
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_ccl_unique_id(unsigned char *id) {
    NSTF_TRY(ccl_load());
    static_assert(sizeof(ncclUniqueId) == NSTF_CCL_ID_BYTES, "NCCL's unique id is 128 bytes");
    ncclUniqueId u;
    const ncclResult_t r = ccl.unique_id(&u);
    if (r != ncclSuccess) return ccl_fail("ncclGetUniqueId", r);
    memcpy(id, &u, sizeof u);
    return NSTF_OK;
}

/* ncclCommInitRank blocks until every rank has joined; it runs on a
 * thread of its own so that a peer that never comes is an error after
 * timeout_ms (the thread is then left waiting: the caller ends the
 * launch). */
typedef struct init_rank_job {
    int dev, rank, n;
    ncclUniqueId id;
    ncclComm_t comm;
    ncclResult_t r;
    int cuda_err;
    bool done, abandoned;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} init_rank_job;

static void *init_rank_main(void *p) {
    init_rank_job *j = (init_rank_job *)p;
    const gpuError_t e = gpuSetDevice(j->dev);
    ncclComm_t c = NULL;
    ncclResult_t r = ncclSystemError;
    if (e == gpuSuccess) {
        const nstf_signals_held held; /* NCCL's proxy threads leave signals to the program */
        r = ccl.init_rank(&c, j->n, j->id, j->rank);
    }
    pthread_mutex_lock(&j->mu);
    j->comm = c, j->r = r, j->cuda_err = (int)e, j->done = true;
    const bool abandoned = j->abandoned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned) { /* the caller gave up: the job is this thread's to free */
        if (c) (void)ccl.comm_abort(c);
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
    }
    return NULL;
}

extern "C" nstf_status nstf_gpu_ccl_init_rank(int dev, int rank, int n, const unsigned char *id, void **comm,
                                              int timeout_ms, char *desc, size_t cap) {
    *comm = NULL;
    NSTF_TRY(ccl_load());
    if (n < 1 || rank < 0 || rank >= n) return nstf_set_error(NSTF_ERR_INVALID_ARG, "rank %d of %d", rank, n);
    int v = 0;
    (void)ccl.get_version(&v);
    snprintf(desc, cap, "%s %d.%d.%d", NSTF_CCL_NAME, v / 10000, v / 100 % 100, v % 100);
    init_rank_job *j = (init_rank_job *)calloc(1, sizeof *j);
    if (!j) return nstf_set_error(NSTF_ERR_OOM, "out of memory");
    j->dev = dev, j->rank = rank, j->n = n;
    memcpy(&j->id, id, sizeof j->id);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_t th;
    if (nstf_thread_start(&th, init_rank_main, j) != 0) {
        free(j);
        return nstf_set_error(NSTF_ERR_OOM, "cannot start a thread for ncclCommInitRank");
    }
    const double deadline = now_ms() + timeout_ms;
    pthread_mutex_lock(&j->mu);
    while (!j->done && now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    if (!j->done) {
        j->abandoned = true;
        pthread_mutex_unlock(&j->mu);
        pthread_detach(th);
        return nstf_set_error(NSTF_ERR_GPU,
                              "rank %d: ncclCommInitRank: not every one of the %d ranks joined within %d ms", rank, n,
                              timeout_ms);
    }
    pthread_mutex_unlock(&j->mu);
    pthread_join(th, NULL);
    nstf_status st = NSTF_OK;
    if (j->cuda_err != 0) st = nstf_set_error(NSTF_ERR_GPU, "rank %d: cannot make GPU %d current (error %d)", rank, dev, j->cuda_err);
    else if (j->r != ncclSuccess) st = ccl_fail("ncclCommInitRank", j->r);
    else *comm = j->comm;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    return st;
}

/* A collective's result r: waited for while NCCL returns ncclInProgress
 * (at most timeout_ms), an error named after the call otherwise. */
static nstf_status ccl_queued(ncclComm_t c, ncclResult_t r, const char *what, int timeout_ms) {
    if (r == ncclInProgress) r = ccl_wait(c, now_ms() + timeout_ms);
    if (r == ncclInProgress)
        return nstf_set_error(NSTF_ERR_GPU, "%s %s not queued within %d ms", NSTF_CCL_NAME, what, timeout_ms);
    if (r != ncclSuccess) return ccl_fail(what, r);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_ccl_allreduce_f32(void *comm, float *buf, int64_t n, void *stream, int timeout_ms) {
    ncclComm_t c = (ncclComm_t)comm;
    const ncclResult_t r = ccl.all_reduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, c, (gpuStream_t)stream);
    return ccl_queued(c, r, "ncclAllReduce", timeout_ms);
}

/* In place: rank r's slot of buf is its receive buffer (NCCL's in-place
 * form, recvbuff == sendbuff + rank * recvcount). */
extern "C" nstf_status nstf_gpu_ccl_reduce_scatter_f32(void *comm, int rank, float *buf, int64_t shard, void *stream,
                                                       int timeout_ms) {
    ncclComm_t c = (ncclComm_t)comm;
    const ncclResult_t r = ccl.reduce_scatter(buf, buf + (size_t)rank * (size_t)shard, (size_t)shard, ncclFloat32,
                                              ncclSum, c, (gpuStream_t)stream);
    return ccl_queued(c, r, "ncclReduceScatter", timeout_ms);
}

/* In place (sendbuff == recvbuff + rank * sendcount); bytes, since an
 * all-gather only copies: fp32 and bf16 slots alike. */
extern "C" nstf_status nstf_gpu_ccl_allgather(void *comm, int rank, void *buf, int64_t slot_bytes, void *stream,
                                              int timeout_ms) {
    ncclComm_t c = (ncclComm_t)comm;
    char *b = (char *)buf;
    const ncclResult_t r = ccl.all_gather(b + (size_t)rank * (size_t)slot_bytes, b, (size_t)slot_bytes, ncclUint8, c,
                                          (gpuStream_t)stream);
    return ccl_queued(c, r, "ncclAllGather", timeout_ms);
}

extern "C" void nstf_gpu_ccl_abort(void *comm) {
    if (comm && ccl.ok) (void)ccl.comm_abort((ncclComm_t)comm);
}

extern "C" void nstf_gpu_ccl_destroy(void *comm) {
    if (comm && ccl.ok) (void)ccl.destroy((ncclComm_t)comm);
}

#else /* no NCCL in this build */

extern "C" nstf_status nstf_gpu_ccl_init(const int *devs, int n, void **comms, int timeout_ms, char *desc, size_t cap) {
    (void)devs, (void)n, (void)comms, (void)timeout_ms;
    snprintf(desc, cap, "none");
    return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                          "this build has no NCCL/RCCL (configure with -DNSTF_NCCL=ON where its header is installed)");
}
extern "C" nstf_status nstf_gpu_ccl_allreduce_f32(void *comm, float *buf, int64_t n, void *stream, int timeout_ms) {
    (void)comm, (void)buf, (void)n, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no NCCL/RCCL");
}
extern "C" nstf_status nstf_gpu_ccl_unique_id(unsigned char *id) {
    (void)id;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no NCCL/RCCL");
}
extern "C" nstf_status nstf_gpu_ccl_init_rank(int dev, int rank, int n, const unsigned char *id, void **comm,
                                              int timeout_ms, char *desc, size_t cap) {
    (void)dev, (void)rank, (void)n, (void)id, (void)timeout_ms;
    *comm = NULL;
    snprintf(desc, cap, "none");
    return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                          "this build has no NCCL/RCCL (configure with -DNSTF_NCCL=ON where its header is installed)");
}
extern "C" nstf_status nstf_gpu_ccl_reduce_scatter_f32(void *comm, int rank, float *buf, int64_t shard, void *stream,
                                                       int timeout_ms) {
    (void)comm, (void)rank, (void)buf, (void)shard, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no NCCL/RCCL");
}
extern "C" nstf_status nstf_gpu_ccl_allgather(void *comm, int rank, void *buf, int64_t slot_bytes, void *stream,
                                              int timeout_ms) {
    (void)comm, (void)rank, (void)buf, (void)slot_bytes, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no NCCL/RCCL");
}
extern "C" void nstf_gpu_ccl_abort(void *comm) { (void)comm; }
extern "C" void nstf_gpu_ccl_destroy(void *comm) { (void)comm; }

#endif

/* ---- peer links ------------------------------------------------------------------------- */

extern "C" nstf_status nstf_gpu_link_query(int a, int b, nstf_gpu_link *out) {
    memset(out, 0, sizeof *out);
    GPU_CHECK(gpuDeviceCanAccessPeer(&out->access, a, b));
    if (out->access) {
        GPU_CHECK(gpuDeviceGetP2PAttribute(&out->perf_rank, gpuDevP2PAttrPerformanceRank, a, b));
        GPU_CHECK(gpuDeviceGetP2PAttribute(&out->atomics, gpuDevP2PAttrNativeAtomicSupported, a, b));
    }
#if defined(NSTF_GPU_HIP)
    uint32_t type = 0, hops = 0;
    if (hipExtGetLinkTypeAndHopCount(a, b, &type, &hops) == hipSuccess) {
        out->hops = (int)hops;
        /* hsa_amd_link_info_type_t: 0 HyperTransport, 1 QPI, 2 PCIe, 3 InfiniBand, 4 xGMI */
        snprintf(out->link, sizeof out->link, "%s", type == 4 ? "xGMI" : type == 2 ? "PCIe" : "other");
    } else {
        snprintf(out->link, sizeof out->link, "%s", out->access ? "peer" : "none");
    }
#else
    /* PCIe peer access has no native atomics on NVIDIA GPUs; NVLink has them */
    snprintf(out->link, sizeof out->link, "%s", !out->access ? "none (host)" : out->atomics ? "NVLink" : "PCIe");
#endif
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_enable_peer(int a, int b) {
    const nstf_signals_held held; /* may make the devices' contexts (gpu_common.cu) */
    GPU_CHECK(gpuSetDevice(a));
    gpuError_t e = gpuDeviceEnablePeerAccess(b, 0);
    if (e == gpuErrorPeerAccessAlreadyEnabled) (void)gpuGetLastError();
    else GPU_CHECK(e);
    return NSTF_OK;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

extern "C" nstf_status nstf_gpu_p2p_measure(int a, int b, size_t bytes, double *gbs, double *lat_us) {
    const nstf_signals_held held; /* may make the devices' contexts (gpu_common.cu) */
    *gbs = *lat_us = 0;
    int access = 0;
    GPU_CHECK(gpuDeviceCanAccessPeer(&access, a, b));
    if (access) {
        NSTF_TRY(nstf_gpu_enable_peer(a, b));
        NSTF_TRY(nstf_gpu_enable_peer(b, a));
    }
    void *src = NULL, *dst = NULL, *stream = NULL, *e0 = NULL, *e1 = NULL;
    GPU_CHECK(gpuSetDevice(b));
    nstf_status st = nstf_gpu_malloc(&dst, bytes);
    if (st == NSTF_OK) st = nstf_gpu_set_device(a);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&src, bytes);
    if (st == NSTF_OK) st = nstf_gpu_memset(src, 0, bytes, NULL);
    if (st == NSTF_OK) st = nstf_gpu_stream_create(&stream);
    if (st == NSTF_OK) st = nstf_gpu_event_create(&e0);
    if (st == NSTF_OK) st = nstf_gpu_event_create(&e1);
    double best = 1e30, lat[21];
    for (int i = 0; st == NSTF_OK && i < 6; i++) {
        float ms = 0;
        st = nstf_gpu_event_record(e0, stream);
        if (st == NSTF_OK && gpuMemcpyPeerAsync(dst, b, src, a, bytes, (gpuStream_t)stream) != gpuSuccess)
            st = nstf_set_error(NSTF_ERR_GPU, "peer copy GPU %d -> GPU %d failed", a, b);
        if (st == NSTF_OK) st = nstf_gpu_event_record(e1, stream);
        if (st == NSTF_OK) st = nstf_gpu_event_ms(e0, e1, &ms);
        if (st == NSTF_OK && i > 0 && ms < best) best = ms; /* the first warms the link up */
    }
    for (int i = 0; st == NSTF_OK && i < 21; i++) {
        float ms = 0;
        st = nstf_gpu_event_record(e0, stream);
        if (st == NSTF_OK && gpuMemcpyPeerAsync(dst, b, src, a, 4, (gpuStream_t)stream) != gpuSuccess)
            st = nstf_set_error(NSTF_ERR_GPU, "peer copy GPU %d -> GPU %d failed", a, b);
        if (st == NSTF_OK) st = nstf_gpu_event_record(e1, stream);
        if (st == NSTF_OK) st = nstf_gpu_event_ms(e0, e1, &ms);
        lat[i] = ms * 1e3;
    }
    if (st == NSTF_OK) {
        qsort(lat, 21, sizeof lat[0], cmp_double);
        *gbs = (double)bytes / (best * 1e-3) / 1e9;
        *lat_us = lat[10];
    }
    nstf_gpu_event_destroy(e0);
    nstf_gpu_event_destroy(e1);
    if (stream) (void)nstf_gpu_stream_destroy(stream);
    (void)nstf_gpu_free(src);
    (void)nstf_gpu_free(dst);
    return st;
}
