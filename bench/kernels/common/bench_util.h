/* bench_util.h — what the kernel benchmarks (bench/kernels/<op>/) share
 * besides the timer: the vendor runtime (gpu.h) and the launchers, a
 * DEV_CHECK that stops the benchmark on a runtime error, bf16 <-> f32 (the
 * project's one definition, core/dtype.h) and a seeded xorshift64* for the
 * random operands. Benchmarks use no test code (tests/test_hygiene.sh
 * checks it). */
#ifndef NSTF_BENCH_UTIL_H
#define NSTF_BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/gpu/gpu.h"
#include "core/dtype.h"

#define DEV_CHECK(call)                                                                           \
    do {                                                                                          \
        gpuError_t e_ = (call);                                                                   \
        if (e_ != gpuSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpuGetErrorString(e_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

static inline float bf2f(uint16_t b) { return nstf_bf16_to_f32(b); }
static inline uint16_t f2bf(float f) { return nstf_f32_to_bf16(f); }

/* Uniform in [-1, 1) from a xorshift64* state (a fixed seed per benchmark,
 * so every run times the same operands). */
static inline float bench_uniform(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)(((*s * 2685821657736338717ull) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

#endif
