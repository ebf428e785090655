/* gpu_mm_test.h — the small harness shared by test_gemm_gpu.cu and
 * test_attention_gpu.cu, on top of tests/test_util.h (counted checks, the
 * seeded RNG): bf16 rounding, device buffers that are
 * poisoned (0xff bytes: NaN in f32 and bf16) with a guard region after the
 * payload, and the "at most 2x the naive error" rule. */
#ifndef NSTF_GPU_MM_TEST_H
#define NSTF_GPU_MM_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gpu/gpu.h"
#include "core/dtype.h"
#include "test_util.h" /* CHECK, test_finish, test_rng */

#define DEV_CHECK(call)                                                                           \
    do {                                                                                          \
        gpuError_t e_ = (call);                                                                   \
        if (e_ != gpuSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpuGetErrorString(e_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

/* bf16 on the host: the project's one definition (core/dtype.h). */
static inline float bf2f(uint16_t b) { return nstf_bf16_to_f32(b); }
static inline uint16_t f2bf(float f) { return nstf_f32_to_bf16(f); }
static inline float round_bf(float f) { return bf2f(f2bf(f)); }

/* Device buffer of `bytes` + guard, all bytes 0xff (poison and guard alike). */
#define DEV_GUARD 256
static inline void *dev_alloc_poisoned(size_t bytes) {
    void *p = NULL;
    DEV_CHECK(gpuMalloc(&p, bytes + DEV_GUARD));
    DEV_CHECK(gpuMemset(p, 0xff, bytes + DEV_GUARD));
    return p;
}
/* Copies the payload back and checks the guard is still 0xff. */
static inline int dev_fetch_guarded(void *host, const void *dev, size_t bytes) {
    unsigned char *tmp = (unsigned char *)malloc(bytes + DEV_GUARD);
    DEV_CHECK(gpuMemcpy(tmp, dev, bytes + DEV_GUARD, gpuMemcpyDeviceToHost));
    memcpy(host, tmp, bytes);
    int ok = 1;
    for (size_t i = 0; i < DEV_GUARD; i++) ok &= tmp[bytes + i] == 0xff;
    free(tmp);
    return ok;
}

/* RMS error of got (float) vs ref (double) over n values; counts non-finite. */
static inline double rms_err(const float *got, const double *ref, int64_t n, int64_t *n_bad) {
    double s = 0;
    *n_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) { (*n_bad)++; continue; }
        double d = got[i] - ref[i];
        s += d * d;
    }
    return sqrt(s / (double)(n > 0 ? n : 1));
}
static inline double rms(const double *ref, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ref[i] * ref[i];
    return sqrt(s / (double)(n > 0 ? n : 1));
}
/* The bf16 rule: kernel error <= 2x the naive same-precision error. The
 * 1e-12 relative floor only matters when both are exactly 0. */
static inline int within_2x_naive(double err_k, double err_naive, double ref_rms) {
    return err_k <= 2.0 * err_naive + 1e-12 * ref_rms;
}

#endif
