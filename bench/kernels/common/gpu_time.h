/* gpu_time.h — the kernel benchmarks' timer: 5 warm-up calls, then the
 * median of 20 runs timed with GPU events on the default stream. */
#ifndef NSTF_BENCH_GPU_TIME_H
#define NSTF_BENCH_GPU_TIME_H

#include <algorithm>
#include <vector>

#include "bench_util.h" /* DEV_CHECK */

static float median_ms(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <typename F> static float time_ms(F f) {
    gpuEvent_t a, b;
    DEV_CHECK(gpuEventCreate(&a));
    DEV_CHECK(gpuEventCreate(&b));
    for (int i = 0; i < 5; i++) f();
    std::vector<float> t;
    for (int i = 0; i < 20; i++) {
        DEV_CHECK(gpuEventRecord(a, 0));
        f();
        DEV_CHECK(gpuEventRecord(b, 0));
        DEV_CHECK(gpuEventSynchronize(b));
        float ms = 0;
        DEV_CHECK(gpuEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    DEV_CHECK(gpuEventDestroy(a));
    DEV_CHECK(gpuEventDestroy(b));
    return median_ms(t);
}

#endif
