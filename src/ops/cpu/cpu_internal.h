/* cpu_internal.h — what the fast CPU paths (forward ops_cpu.c, backward
 * backward_cpu.c) share: dispatch over the thread pool with an inline path
 * for small work, and the small AVX2 helpers (horizontal sum, vector e^x,
 * dot product, axpy), each with a portable scalar fallback; NSTF_CPU_AVX2
 * says which one the build uses. Header-only (static inline), internal to
 * src/ops/cpu. */
#ifndef NSTF_OPS_CPU_INTERNAL_H
#define NSTF_OPS_CPU_INTERNAL_H

#include <stdint.h>

#include "ops/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NSTF_CPU_AVX2 1
#else
#define NSTF_CPU_AVX2 0
#endif

/* Below this many scalar operations an op runs inline: a pool wake-up
 * costs ~1-3 us, about what 16k fp32 adds cost one core. */
#define PAR_MIN_WORK 16384

static inline int cpu_threads(const nstf_cpu *cpu) {
    return cpu && cpu->pool ? nstf_pool_size(cpu->pool) : 1;
}

/* Runs fn over the pool when there is enough work and more than one unit
 * to split (ops split over rows: a single row runs inline). */
static inline void cpu_run(const nstf_cpu *cpu, nstf_pool_fn fn, void *ctx, int64_t work,
                           int64_t units) {
    if (cpu_threads(cpu) > 1 && work >= PAR_MIN_WORK && units > 1)
        nstf_pool_run(cpu->pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

/* One token's attention (ops_cpu.c) over n_keys keys addressed through a
 * block table per kv head: key j of kv head g is row j % bs of cache block
 * tbl[g * tbl_stride + j / bs]. With the identity table it is
 * nstf_cpu_attention at pos0 = n_keys - 1, bitwise (the same sums in the
 * same order): the sparse attention's path. */
void nstf_cpu_attention_tbl(nstf_cpu *cpu, const float *q, const float *k, const float *v, const int32_t *tbl,
                            int64_t tbl_stride, int bs, float *out, int64_t n_keys, int n_heads, int n_kv_heads,
                            int head_dim, float scale);

#if NSTF_CPU_AVX2
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x, Cephes expf polynomial (~2 ulp on [-87.3, 88.3]); inputs are clamped
 * to that range so the 2^n scale stays a normal float: below it returns
 * ~1e-38 instead of 0, above it ~2e38 instead of inf, harmless for softmax
 * weights and silu. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, with ln2 split in two so r is exact enough */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* dot(a, b) of length n: two 8-wide FMA accumulators, then the tail */
static inline float simd_dot(const float *a, const float *b, int n) {
    int d = 0;
    float s = 0;
#if NSTF_CPU_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; d + 16 <= n; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), a1);
    }
    for (; d + 8 <= n; d += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), a0);
    s = hsum256(_mm256_add_ps(a0, a1));
#endif
    for (; d < n; d++) s += a[d] * b[d];
    return s;
}

/* y[0..n) += alpha * x[0..n) */
static inline void simd_axpy(float *y, float alpha, const float *x, int n) {
    int d = 0;
#if NSTF_CPU_AVX2
    __m256 va = _mm256_set1_ps(alpha);
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
#endif
    for (; d < n; d++) y[d] += alpha * x[d];
}

#endif
