/* gpu_time.h — the kernel benchmarks' timers: time_ms (5 warm-up calls,
 * then the median of 20 runs timed with GPU events on the default stream)
 * and time_batch_ms (batches of back-to-back launches on a stream, for
 * kernels shorter than an event pair's resolution). */
#ifndef NSTF_BENCH_GPU_TIME_H
#define NSTF_BENCH_GPU_TIME_H

#include <algorithm>
#include <vector>

#include "bench_util.h" /* DEV_CHECK */

static float median_ms(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}


/* Median ms per launch of `batch` launches back to back on `stream`, over
 * `reps` repetitions after `warm` warm-up launches; launch(i) gets the
 * launch's index (to rotate operands through more memory than the L2 holds). */
template <typename F> static double time_batch_ms(gpuStream_t stream, int warm, int batch, int reps, F &&launch) {
    gpuEvent_t a, b;
    DEV_CHECK(gpuEventCreate(&a));
    DEV_CHECK(gpuEventCreate(&b));
    for (int i = 0; i < warm; i++) launch(i);
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        DEV_CHECK(gpuEventRecord(a, stream));
        for (int i = 0; i < batch; i++) launch(i);
        DEV_CHECK(gpuEventRecord(b, stream));
        DEV_CHECK(gpuEventSynchronize(b));
        float ms = 0;
        DEV_CHECK(gpuEventElapsedTime(&ms, a, b));
        t.push_back(ms / batch);
    }
    DEV_CHECK(gpuEventDestroy(a));
    DEV_CHECK(gpuEventDestroy(b));
    return median_ms(t);
}

/* 5 warm-up calls of f, then the median of 20 single calls on the default stream. */
template <typename F> static float time_ms(F f) {
    return (float)time_batch_ms(0, 5, 1, 20, [&](int) { f(); });
}

/* The bandwidth ceiling: GB/s of a device-to-device copy of 1 GiB, read
 * plus write bytes, median of `reps` batches of 20. */
static inline double copy_rate_gbs(gpuStream_t stream, int reps) {
    const size_t bytes = 1ull << 30;
    void *c0, *c1;
    DEV_CHECK(gpuMalloc(&c0, bytes));
    DEV_CHECK(gpuMalloc(&c1, bytes));
    DEV_CHECK(gpuMemset(c0, 1, bytes));
    const double ms = time_batch_ms(stream, 3, 20, reps, [&](int) {
        DEV_CHECK(gpuMemcpyAsync(c1, c0, bytes, gpuMemcpyDeviceToDevice, stream));
    });
    DEV_CHECK(gpuFree(c0));
    DEV_CHECK(gpuFree(c1));
    return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

/* A kernel study's start (gpu_api.h through bench_util.h): false,
 * after saying so, without a GPU; else GPU 0's info, a non-blocking
 * stream and the copy rate, and the line that names them. */
static inline bool study_open(const char *name, int reps, nstf_gpu_info *info, gpuStream_t *s, double *copy_gbs) {
    if (nstf_gpu_device_count() < 1) {
        printf("%s: no GPU\n", name);
        return false;
    }
    if (nstf_gpu_query(0, info) != NSTF_OK) {
        fprintf(stderr, "%s: %s\n", name, nstf_last_error());
        exit(1);
    }
    DEV_CHECK(gpuStreamCreateWithFlags(s, gpuStreamNonBlocking));
    *copy_gbs = copy_rate_gbs(*s, reps); /* the ceiling */
    printf("device: %s (%s), %d SMs; copy %.0f GB/s (read+write of 1 GiB)\n", info->name, info->arch, info->n_sm,
           *copy_gbs);
    return true;
}

#endif
