/* test_util.h — the tests' tiny harness: checks that count, error metrics
 * (NMSE against an fp64 reference), poisoned buffers with guard regions,
 * and a seeded RNG. C and C++ (the GPU tests include it too). Each test program returns 0 when every check passed,
 * 1 otherwise, 77 when skipped. */
#ifndef NSTF_TEST_UTIL_H
#define NSTF_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_fails;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        g_checks++;                                                        \
        if (!(cond)) {                                                     \
            g_fails++;                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static inline int test_finish(const char *name) {
    printf("%s: %d checks, %d passed, %d failed\n", name, g_checks, g_checks - g_fails, g_fails);
    return g_fails ? 1 : 0;
}

/* xorshift64* — deterministic across platforms */
typedef struct { uint64_t s; } test_rng;
static inline uint64_t rng_next(test_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}
/* uniform in [-1, 1) */
static inline float rng_uniform(test_rng *r) {
    return (float)((rng_next(r) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static inline float rng_normal(test_rng *r) {
    float u1 = (rng_uniform(r) + 1.0f) * 0.5f + 1e-7f, u2 = (rng_uniform(r) + 1.0f) * 0.5f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* Normalized mean squared error sum((a-b)^2) / sum(b^2) of a float result
 * against an fp64 reference. */
static inline double nmse(const float *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}
static inline double nmse_f(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? num / den : num;
}
/* NMSE of one logit row a against a reference row b after subtracting each
 * row's own mean: logits are defined up to a constant, and a mean far from 0
 * would otherwise inflate the denominator and hide errors. */
static inline double centred_nmse_f(const float *a, const float *b, int64_t n) {
    double ma = 0, mb = 0, num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { ma += a[i]; mb += b[i]; }
    ma /= (double)n;
    mb /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = ((double)a[i] - ma) - ((double)b[i] - mb), r = (double)b[i] - mb;
        num += d * d;
        den += r * r;
    }
    return den > 0 ? num / den : num;
}
/* log-sum-exp of a row, in double */
static inline double lse_f(const float *a, int64_t n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++) if (a[i] > m) m = a[i];
    for (int64_t i = 0; i < n; i++) s += exp((double)a[i] - m);
    return m + log(s);
}
/* KL(softmax(p) || softmax(q)) in nats, of two logit rows */
static inline double kl_softmax_f(const float *p, const float *q, int64_t n) {
    const double lp = lse_f(p, n), lq = lse_f(q, n);
    double kl = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = p[i] - lp, b = q[i] - lq;
        kl += exp(a) * (a - b);
    }
    return kl;
}
/* index of the first maximum */
static inline int64_t argmax_f(const float *a, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) if (a[i] > a[b]) b = i;
    return b;
}
static inline int64_t count_nonfinite(const float *a, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += !isfinite(a[i]);
    return c;
}

/* Guarded buffers: TEST_GUARD bytes of a canary after the payload; the
 * payload is poisoned with NaN-pattern bytes so an unwritten output is
 * caught. The two bytes are the GPU harness's too (gpu_harness.h). */
#define TEST_GUARD 64
#define TEST_POISON_BYTE 0xff /* 0xffffffff is a NaN as f32, 0xffff as bf16 */
#define TEST_GUARD_BYTE 0xa5  /* not the poison: poison copied past the end shows */
static inline void *guarded_alloc(size_t bytes) {
    unsigned char *p = (unsigned char *)malloc(bytes + TEST_GUARD); /* cast: also C++ */
    if (!p) { fprintf(stderr, "test: out of memory\n"); exit(2); }
    memset(p, TEST_POISON_BYTE, bytes);
    memset(p + bytes, TEST_GUARD_BYTE, TEST_GUARD);
    return p;
}
static inline int guard_ok(const void *p, size_t bytes) {
    const unsigned char *q = (const unsigned char *)p + bytes;
    for (int i = 0; i < TEST_GUARD; i++)
        if (q[i] != TEST_GUARD_BYTE) return 0;
    return 1;
}

#define TEST_SKIP 77

#endif
