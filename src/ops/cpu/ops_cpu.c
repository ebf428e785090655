/* ops_cpu.c — the fast CPU paths of every op except matmul (matmul.c):
 * get_rows, rmsnorm, add, rope, attention, swiglu, argmax.
 *
 * Each op splits its work over the thread pool (cpu->pool; NULL means one
 * thread) with nstf_pool_run + nstf_split_range, and uses AVX2/FMA
 * intrinsics where they pay, with a portable scalar fallback when the
 * build target lacks them. No op allocates: scratch is small fixed-size
 * stack arrays, and longer extents are walked in chunks of that size
 * (attention uses an online softmax, flash-attention style, so any context
 * length runs without allocation). Ops with little work run inline on the
 * calling thread: waking the pool costs more than they do. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "ops/backward.h"
#include "ops/cpu/cpu_internal.h"
#include "ops/ops.h"

/* ---- get_rows ------------------------------------------------------------- */

typedef struct {
    nstf_type type;
    const unsigned char *table; /* [n_rows, row_bytes] */
    uint64_t row_bytes;
    const int32_t *ids;         /* [n_tok] */
    float *out;                 /* [n_tok, dim] */
    int64_t n_tok, dim;
} get_rows_ctx;

static void get_rows_fn(void *p, int ith, int nth) {
    const get_rows_ctx *c = p;
    int64_t t0, t1;
    nstf_split_range(c->n_tok, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++)
        nstf_dequantize_row(c->type, c->table + (uint64_t)c->ids[t] * c->row_bytes,
                            c->out + t * c->dim, c->dim);
}

/* Results are bit-identical to nstf_dequantize_row (it is what runs). */
void nstf_cpu_get_rows(nstf_cpu *cpu, nstf_type type, const void *table, const int32_t *ids,
                       float *out, int64_t n_tok, int64_t dim) {
    get_rows_ctx c = {type, table, 0, ids, out, n_tok, dim};
    if (!nstf_type_row_bytes(type, dim, &c.row_bytes)) return;
    cpu_run(cpu, get_rows_fn, &c, n_tok * dim, n_tok);
}

/* ---- rmsnorm -------------------------------------------------------------- */

typedef struct {
    const float *x, *w; /* [n_tok, dim], [dim] */
    float *y;           /* [n_tok, dim] */
    int64_t n_tok, dim;
    float eps;
} rmsnorm_ctx;

static void rmsnorm_fn(void *p, int ith, int nth) {
    const rmsnorm_ctx *c = p;
    const int64_t dim = c->dim;
    int64_t t0, t1;
    nstf_split_range(c->n_tok, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const float *x = c->x + t * dim;
        float *y = c->y + t * dim;
        int64_t i = 0;
        float ss = 0;
#if NSTF_CPU_AVX2
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; i + 16 <= dim; i += 16) {
            __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
            a1 = _mm256_fmadd_ps(v1, v1, a1);
        }
        ss = hsum256(_mm256_add_ps(a0, a1));
#endif
        for (; i < dim; i++) ss += x[i] * x[i];
        float inv = (float)(1.0 / sqrt((double)ss / (double)dim + (double)c->eps));
        i = 0;
#if NSTF_CPU_AVX2
        __m256 vinv = _mm256_set1_ps(inv);
        for (; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv),
                                                  _mm256_loadu_ps(c->w + i)));
#endif
        for (; i < dim; i++) y[i] = x[i] * inv * c->w[i];
    }
}

void nstf_cpu_rmsnorm(nstf_cpu *cpu, const float *x, const float *w, float *y, int64_t n_tok,
                      int64_t dim, float eps) {
    rmsnorm_ctx c = {x, w, y, n_tok, dim, eps};
    cpu_run(cpu, rmsnorm_fn, &c, n_tok * dim, n_tok);
}

/* ---- add, swiglu (elementwise) -------------------------------------------- */

typedef struct {
    const float *a, *b; /* [n] each */
    float *y;           /* [n]; may alias a or b */
    int64_t n;
} ew_ctx;

static void add_fn(void *p, int ith, int nth) {
    const ew_ctx *c = p;
    int64_t i, i1;
    nstf_split_range(c->n, 64, ith, nth, &i, &i1); /* 64 floats: whole cache lines */
#if NSTF_CPU_AVX2
    for (; i + 8 <= i1; i += 8)
        _mm256_storeu_ps(c->y + i, _mm256_add_ps(_mm256_loadu_ps(c->a + i), _mm256_loadu_ps(c->b + i)));
#endif
    for (; i < i1; i++) c->y[i] = c->a[i] + c->b[i];
}

void nstf_cpu_add(nstf_cpu *cpu, const float *a, const float *b, float *y, int64_t n) {
    ew_ctx c = {a, b, y, n};
    cpu_run(cpu, add_fn, &c, n, n / 64);
}

/* y = gate * up / (1 + e^-gate); a = gate, b = up */
static void swiglu_fn(void *p, int ith, int nth) {
    const ew_ctx *c = p;
    int64_t i, i1;
    nstf_split_range(c->n, 64, ith, nth, &i, &i1);
#if NSTF_CPU_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= i1; i += 8) {
        __m256 g = _mm256_loadu_ps(c->a + i), u = _mm256_loadu_ps(c->b + i);
        __m256 e = exp256(_mm256_sub_ps(zero, g));
        _mm256_storeu_ps(c->y + i, _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(one, e)));
    }
#endif
    for (; i < i1; i++) {
        float g = c->a[i];
        c->y[i] = g * c->b[i] / (1.0f + expf(-g));
    }
}

void nstf_cpu_swiglu(nstf_cpu *cpu, const float *gate, const float *up, float *y, int64_t n) {
    ew_ctx c = {gate, up, y, n};
    cpu_run(cpu, swiglu_fn, &c, 8 * n, n / 64); /* an exp and a divide per element */
}

/* ---- rope ----------------------------------------------------------------- */

/* Pairs per sin/cos table chunk (the table lives on the stack). */
#define ROPE_CHUNK 64

typedef struct {
    float *x;          /* [n_tok, n_heads, head_dim] */
    const int32_t *pos; /* [n_tok] */
    int64_t n_tok;
    int n_heads, head_dim;
    double freq_ratio; /* base^(-2/head_dim): inv_freq[i] = freq_ratio^i */
    const float *factors; /* [head_dim/2] theta_i divisors, or NULL */
    nstf_rope_mode mode;
    float sign;        /* 1: rotate by theta; -1: by -theta (the backward) */
} rope_ctx;

static void rope_fn(void *p, int ith, int nth) {
    const rope_ctx *c = p;
    const int half = c->head_dim / 2;
    const double two_pi = 6.283185307179586476925;
    int64_t t0, t1;
    nstf_split_range(c->n_tok, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float *xt = c->x + t * c->n_heads * c->head_dim;
        double inv_freq = 1.0; /* freq_ratio^i, carried across chunks */
        for (int i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
            int n = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
            /* cos/sin of theta_i = pos * inv_freq_i. theta is formed and
             * reduced mod 2 pi in double so that float sin/cos see an
             * argument accurate to ~1e-7 absolute even at large positions. */
            float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
            for (int i = 0; i < n; i++) {
                double th = (double)c->pos[t] * inv_freq;
                if (c->factors) th /= c->factors[i0 + i];
                th -= two_pi * floor(th / two_pi + 0.5);
                cs[i] = cosf((float)th);
                sn[i] = c->sign * sinf((float)th);
                inv_freq *= c->freq_ratio;
            }
            if (c->mode == NSTF_ROPE_NEOX) {
                for (int h = 0; h < c->n_heads; h++) {
                    float *a = xt + h * c->head_dim + i0, *b = a + half;
                    int i = 0;
#if NSTF_CPU_AVX2
                    for (; i + 8 <= n; i += 8) {
                        __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
                        __m256 vc = _mm256_loadu_ps(cs + i), vs = _mm256_loadu_ps(sn + i);
                        _mm256_storeu_ps(a + i, _mm256_fmsub_ps(va, vc, _mm256_mul_ps(vb, vs)));
                        _mm256_storeu_ps(b + i, _mm256_fmadd_ps(va, vs, _mm256_mul_ps(vb, vc)));
                    }
#endif
                    for (; i < n; i++) {
                        float va = a[i], vb = b[i];
                        a[i] = va * cs[i] - vb * sn[i];
                        b[i] = va * sn[i] + vb * cs[i];
                    }
                }
            } else {
#if NSTF_CPU_AVX2
                /* interleaved tables: cc = (c0,c0,c1,c1,..), ss = (-s0,s0,-s1,s1,..)
                 * so y = x * cc + swap_pairs(x) * ss */
                float cc[2 * ROPE_CHUNK], ss[2 * ROPE_CHUNK];
                for (int i = 0; i < n; i++) {
                    cc[2 * i] = cc[2 * i + 1] = cs[i];
                    ss[2 * i] = -sn[i];
                    ss[2 * i + 1] = sn[i];
                }
#endif
                for (int h = 0; h < c->n_heads; h++) {
                    float *xh = xt + h * c->head_dim + 2 * i0;
                    int i = 0;
#if NSTF_CPU_AVX2
                    for (; 2 * i + 8 <= 2 * n; i += 4) {
                        __m256 v = _mm256_loadu_ps(xh + 2 * i);
                        __m256 sw = _mm256_permute_ps(v, 0xB1); /* swap each pair */
                        __m256 r = _mm256_fmadd_ps(v, _mm256_loadu_ps(cc + 2 * i),
                                                   _mm256_mul_ps(sw, _mm256_loadu_ps(ss + 2 * i)));
                        _mm256_storeu_ps(xh + 2 * i, r);
                    }
#endif
                    for (; i < n; i++) {
                        float va = xh[2 * i], vb = xh[2 * i + 1];
                        xh[2 * i] = va * cs[i] - vb * sn[i];
                        xh[2 * i + 1] = va * sn[i] + vb * cs[i];
                    }
                }
            }
        }
    }
}

void nstf_cpu_rope_ff(nstf_cpu *cpu, float *x, const int32_t *pos, int64_t n_tok, int n_heads,
                      int head_dim, float base, const float *factors, nstf_rope_mode mode) {
    rope_ctx c = {x, pos, n_tok, n_heads, head_dim, pow((double)base, -2.0 / head_dim), factors, mode, 1.0f};
    cpu_run(cpu, rope_fn, &c, 4 * n_tok * n_heads * head_dim, n_tok);
}

void nstf_cpu_rope(nstf_cpu *cpu, float *x, const int32_t *pos, int64_t n_tok, int n_heads,
                   int head_dim, float base, nstf_rope_mode mode) {
    nstf_cpu_rope_ff(cpu, x, pos, n_tok, n_heads, head_dim, base, NULL, mode);
}

/* The transpose of the rotation: the same pairs rotated by -theta
 * (nstf_ref_rope_bwd), on a gradient in place. */
void nstf_cpu_rope_bwd(nstf_cpu *cpu, float *dx, const int32_t *pos, int64_t n_tok, int n_heads,
                       int head_dim, float base, nstf_rope_mode mode) {
    rope_ctx c = {dx, pos, n_tok, n_heads, head_dim, pow((double)base, -2.0 / head_dim), NULL, mode, -1.0f};
    cpu_run(cpu, rope_fn, &c, 4 * n_tok * n_heads * head_dim, n_tok);
}

/* ---- attention ------------------------------------------------------------ */

#define ATTN_KCHUNK 64     /* keys scored per step (stack score buffer) */
#define ATTN_MAX_D 256     /* output dims accumulated per pass (stack) */
#define ATTN_MAX_G 8       /* query heads sharing one pass over K/V */
#define ATTN_SPLIT_MIN 256 /* fewest keys per split-KV segment */
#define ATTN_PART_FLOATS 16384 /* split-KV partials buffer: 64 KiB of stack */

/* Rows ahead to prefetch. K/V rows of one kv head are strided by
 * n_kv_heads * head_dim floats, a gap pattern the hardware prefetcher
 * follows poorly: this made an 8192-position decode ~2x faster on the
 * development machine (AMD EPYC). Only rows inside the span are fetched. */
#define ATTN_PREFETCH 8

static inline void attn_prefetch(const float *row, int n) {
#if NSTF_CPU_AVX2
    for (int i = 0; i < n; i += 16) _mm_prefetch((const char *)(row + i), _MM_HINT_T0);
#else
    (void)row;
    (void)n;
#endif
}

/* Row j of one kv head's keys or values: contiguous (tbl NULL), or row
 * j % bs of cache block tbl[j / bs] (the paged cache). */
static inline const float *attn_row(const float *base, const int32_t *tbl, int bs, int64_t j, int64_t stride) {
    return tbl ? base + ((int64_t)tbl[j / bs] * bs + j % bs) * stride : base + j * stride;
}

#if NSTF_CPU_AVX2
/* Lane i of the result: the sum of the eight lanes of v[i] (the fp32 form
 * of q32_simd.h's nstf_q32_reduce8_i32 tree). */
static inline __attribute__((always_inline)) __m256 reduce8_ps(const __m256 v[8]) {
    /* per 128-bit half: rows (2r, 2r+1) x 2 */
    const __m256 a[4] = {_mm256_add_ps(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1])),
                         _mm256_add_ps(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3])),
                         _mm256_add_ps(_mm256_unpacklo_ps(v[4], v[5]), _mm256_unpackhi_ps(v[4], v[5])),
                         _mm256_add_ps(_mm256_unpacklo_ps(v[6], v[7]), _mm256_unpackhi_ps(v[6], v[7]))};
    const __m256 b0 = _mm256_add_ps(_mm256_shuffle_ps(a[0], a[1], 0x44), _mm256_shuffle_ps(a[0], a[1], 0xEE));
    const __m256 b1 = _mm256_add_ps(_mm256_shuffle_ps(a[2], a[3], 0x44), _mm256_shuffle_ps(a[2], a[3], 0xEE));
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}
#endif

/* Scratch of one attn_span call: scores, running max / sum, accumulators
 * for up to ATTN_MAX_G heads (~12 KiB, on the worker's stack). */
typedef struct {
    float sc[ATTN_MAX_G][ATTN_KCHUNK];
    float m[ATTN_MAX_G], l[ATTN_MAX_G];
    float acc[ATTN_MAX_G][ATTN_MAX_D];
} attn_scratch;

/* n_g query heads (contiguous in q, all on one kv head) against keys
 * [j0, j1) with an online softmax (running max m, running sum l):
 * acc[g][0..nd) = sum_j e^(s_gj - m_g) v_j[d0..d0+nd), unnormalised.
 * K and V rows are walked once for all n_g heads (the GQA reuse: the
 * second head onward reads them from L1, not memory). Scores go through
 * the stack ATTN_KCHUNK keys at a time; when a chunk raises a head's max,
 * its acc and l are rescaled by e^(m_old - m_new). Keys are addressed
 * through attn_row, so a paged cache (tbl, bs) runs the same sums in the
 * same order as the contiguous one. */
static void attn_span(const float *qg /* [n_g, head_dim] */,
                      const float *kh /* [n_ctx, kv_stride] from this kv head */,
                      const float *vh /* [n_ctx, kv_stride] from this kv head */,
                      const int32_t *tbl, int bs, int64_t kv_stride, int head_dim, int n_g, float scale,
                      int64_t j0, int64_t j1, int d0, int nd, attn_scratch *w) {
    for (int g = 0; g < n_g; g++) {
        w->m[g] = -INFINITY;
        w->l[g] = 0;
        for (int d = 0; d < nd; d++) w->acc[g][d] = 0;
    }
    for (int64_t jc = j0; jc < j1; jc += ATTN_KCHUNK) {
        int n = j1 - jc < ATTN_KCHUNK ? (int)(j1 - jc) : ATTN_KCHUNK;
        int j = 0;
#if NSTF_CPU_AVX2
        /* eight keys at a time: one accumulator per key over the head's
         * dims, the eight sums reduced together into one vector of scores */
        if (head_dim % 8 == 0)
            for (; j + 8 <= n; j += 8) {
                const float *kj[8];
                for (int i = 0; i < 8; i++) {
                    kj[i] = attn_row(kh, tbl, bs, jc + j + i, kv_stride);
                    if (jc + j + i + ATTN_PREFETCH < j1)
                        attn_prefetch(attn_row(kh, tbl, bs, jc + j + i + ATTN_PREFETCH, kv_stride), head_dim);
                }
                const float *k0 = kj[0], *k1 = kj[1], *k2 = kj[2], *k3 = kj[3], *k4 = kj[4], *k5 = kj[5],
                            *k6 = kj[6], *k7 = kj[7];
                for (int g = 0; g < n_g; g++) {
                    const float *qh = qg + g * head_dim;
                    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
                    for (int d = 0; d < head_dim; d += 8) {
                        const __m256 qd = _mm256_loadu_ps(qh + d);
                        a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + d), a0);
                        a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k1 + d), a1);
                        a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k2 + d), a2);
                        a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k3 + d), a3);
                        a4 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k4 + d), a4);
                        a5 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k5 + d), a5);
                        a6 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k6 + d), a6);
                        a7 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k7 + d), a7);
                    }
                    const __m256 a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
                    _mm256_storeu_ps(w->sc[g] + j, _mm256_mul_ps(_mm256_set1_ps(scale), reduce8_ps(a)));
                }
            }
#endif
        for (; j < n; j++) {
            const float *kj = attn_row(kh, tbl, bs, jc + j, kv_stride);
            if (jc + j + ATTN_PREFETCH < j1)
                attn_prefetch(attn_row(kh, tbl, bs, jc + j + ATTN_PREFETCH, kv_stride), head_dim);
            for (int g = 0; g < n_g; g++)
                w->sc[g][j] = scale * simd_dot(qg + g * head_dim, kj, head_dim);
        }
        for (int g = 0; g < n_g; g++) {
            float *sc = w->sc[g], cmax = -INFINITY;
            int i0 = 0;
#if NSTF_CPU_AVX2
            if (n >= 8) { /* max_ps(s, m) keeps m where s is NaN, as the scalar test does */
                __m256 vmax = _mm256_set1_ps(-INFINITY);
                for (; i0 + 8 <= n; i0 += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(sc + i0), vmax);
                __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
                m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                cmax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            }
#endif
            for (int i = i0; i < n; i++) cmax = sc[i] > cmax ? sc[i] : cmax;
            if (cmax > w->m[g]) {
                float corr = expf(w->m[g] - cmax); /* 0 on the first chunk (m = -inf) */
                w->l[g] *= corr;
                for (int d = 0; d < nd; d++) w->acc[g][d] *= corr;
                w->m[g] = cmax;
            }
            float l = 0;
            int i = 0;
#if NSTF_CPU_AVX2
            __m256 vm = _mm256_set1_ps(w->m[g]), vl = _mm256_setzero_ps();
            for (; i + 8 <= n; i += 8) {
                __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + i), vm));
                _mm256_storeu_ps(sc + i, e);
                vl = _mm256_add_ps(vl, e);
            }
            l = hsum256(vl);
#endif
            for (; i < n; i++) {
                sc[i] = expf(sc[i] - w->m[g]);
                l += sc[i];
            }
            w->l[g] += l;
        }
        j = 0;
#if NSTF_CPU_AVX2
        if (nd % 64 == 0) { /* acc in registers, 64 dims at a time, over the chunk's keys */
            for (int jj = 0; jj < n && jc + jj + ATTN_PREFETCH < j1; jj++)
                attn_prefetch(attn_row(vh, tbl, bs, jc + jj + ATTN_PREFETCH, kv_stride) + d0, nd);
            for (int g = 0; g < n_g; g++)
                for (int d = 0; d < nd; d += 64) {
                    float *acc = w->acc[g] + d;
                    __m256 o0 = _mm256_loadu_ps(acc), o1 = _mm256_loadu_ps(acc + 8), o2 = _mm256_loadu_ps(acc + 16),
                           o3 = _mm256_loadu_ps(acc + 24), o4 = _mm256_loadu_ps(acc + 32),
                           o5 = _mm256_loadu_ps(acc + 40), o6 = _mm256_loadu_ps(acc + 48),
                           o7 = _mm256_loadu_ps(acc + 56);
                    for (int jj = 0; jj < n; jj++) {
                        const float *vj = attn_row(vh, tbl, bs, jc + jj, kv_stride) + d0 + d;
                        const __m256 p = _mm256_set1_ps(w->sc[g][jj]);
                        o0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj), o0);
                        o1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8), o1);
                        o2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 16), o2);
                        o3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 24), o3);
                        o4 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 32), o4);
                        o5 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 40), o5);
                        o6 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 48), o6);
                        o7 = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 56), o7);
                    }
                    _mm256_storeu_ps(acc, o0);
                    _mm256_storeu_ps(acc + 8, o1);
                    _mm256_storeu_ps(acc + 16, o2);
                    _mm256_storeu_ps(acc + 24, o3);
                    _mm256_storeu_ps(acc + 32, o4);
                    _mm256_storeu_ps(acc + 40, o5);
                    _mm256_storeu_ps(acc + 48, o6);
                    _mm256_storeu_ps(acc + 56, o7);
                }
            j = n;
        }
        /* four keys per pass over acc: a quarter of the acc loads/stores */
        for (; j + 4 <= n; j += 4) {
            const float *v0 = attn_row(vh, tbl, bs, jc + j, kv_stride) + d0,
                        *v1 = attn_row(vh, tbl, bs, jc + j + 1, kv_stride) + d0,
                        *v2 = attn_row(vh, tbl, bs, jc + j + 2, kv_stride) + d0,
                        *v3 = attn_row(vh, tbl, bs, jc + j + 3, kv_stride) + d0;
            for (int jj = 0; jj < 4 && jc + j + ATTN_PREFETCH + jj < j1; jj++)
                attn_prefetch(attn_row(vh, tbl, bs, jc + j + ATTN_PREFETCH + jj, kv_stride) + d0, nd);
            for (int g = 0; g < n_g; g++) {
                const float *sc = w->sc[g] + j;
                float *acc = w->acc[g];
                __m256 p0 = _mm256_set1_ps(sc[0]), p1 = _mm256_set1_ps(sc[1]),
                       p2 = _mm256_set1_ps(sc[2]), p3 = _mm256_set1_ps(sc[3]);
                int d = 0;
                for (; d + 8 <= nd; d += 8) {
                    __m256 a = _mm256_loadu_ps(acc + d);
                    a = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + d), a);
                    a = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v1 + d), a);
                    a = _mm256_fmadd_ps(p2, _mm256_loadu_ps(v2 + d), a);
                    a = _mm256_fmadd_ps(p3, _mm256_loadu_ps(v3 + d), a);
                    _mm256_storeu_ps(acc + d, a);
                }
                for (; d < nd; d++)
                    acc[d] += sc[0] * v0[d] + sc[1] * v1[d] + sc[2] * v2[d] + sc[3] * v3[d];
            }
        }
#endif
        for (; j < n; j++) {
            const float *vj = attn_row(vh, tbl, bs, jc + j, kv_stride) + d0;
            for (int g = 0; g < n_g; g++) {
                float p = w->sc[g][j], *acc = w->acc[g];
                for (int d = 0; d < nd; d++) acc[d] += p * vj[d];
            }
        }
    }
}

typedef struct {
    const float *q, *k, *v; /* [n_tok, n_heads, hd], [n_ctx, n_kv, hd] x2 (paged: the block pool) */
    const int32_t *tbl;     /* block table of the sequence, or NULL: contiguous */
    int64_t tbl_stride;     /* kv head g reads the table at tbl + g * tbl_stride (0: one table) */
    int bs;                 /* positions per block */
    float *out;             /* [n_tok, n_heads, hd] */
    float *lse;             /* [n_tok, n_heads] or NULL: m + log l of each row */
    int64_t n_tok, pos0;
    int n_heads, n_kv_heads, head_dim;
    float scale;
    int window;             /* sliding window (0: none) */
    int n_gb;               /* head batches per kv head: ceil(group / ATTN_MAX_G) */
    int n_seg;              /* split-KV segments per batch; 1 = no split */
    float *part;            /* [n_tok * n_heads * n_seg, head_dim + 2] when n_seg > 1 */
    int64_t n_items;
    atomic_llong next;      /* next item to take (dynamic schedule) */
} attn_ctx;

/* Items are (t, kv head, head batch[, seg]), handed out by an atomic
 * counter because rows differ in cost (token t sees pos0 + t + 1 keys).
 * The latest tokens, the costliest, go first. */
static void attn_fn(void *p, int ith, int nth) {
    attn_ctx *c = p;
    const int group = c->n_heads / c->n_kv_heads, hd = c->head_dim;
    const int64_t kv_stride = (int64_t)c->n_kv_heads * hd;
    attn_scratch w;
    for (;;) {
        int64_t it = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (it >= c->n_items) break;
        int seg = (int)(it % c->n_seg);
        int64_t r = it / c->n_seg;
        int gb = (int)(r % c->n_gb);
        r /= c->n_gb;
        int kvh = (int)(r % c->n_kv_heads);
        int64_t t = c->n_tok - 1 - r / c->n_kv_heads;
        int h0 = kvh * group + gb * ATTN_MAX_G;
        int n_g = group - gb * ATTN_MAX_G < ATTN_MAX_G ? group - gb * ATTN_MAX_G : ATTN_MAX_G;
        int64_t n_keys = c->pos0 + t + 1;
        const int64_t j_lo = c->window > 0 && n_keys > c->window ? n_keys - c->window : 0; /* first key seen */
        const float *qg = c->q + (t * c->n_heads + h0) * hd;
        const float *kh = c->k + (int64_t)kvh * hd, *vh = c->v + (int64_t)kvh * hd;
        const int32_t *tbl = c->tbl ? c->tbl + kvh * c->tbl_stride : NULL;
        if (c->n_seg > 1) { /* hd <= ATTN_MAX_D here */
            int64_t j0, j1;
            nstf_split_range(n_keys - j_lo, 64, seg, c->n_seg, &j0, &j1);
            attn_span(qg, kh, vh, tbl, c->bs, kv_stride, hd, n_g, c->scale, j_lo + j0, j_lo + j1, 0, hd, &w);
            for (int g = 0; g < n_g; g++) {
                float *dst = c->part + ((t * c->n_heads + h0 + g) * c->n_seg + seg) * (hd + 2);
                dst[0] = w.m[g];
                dst[1] = w.l[g];
                memcpy(dst + 2, w.acc[g], (size_t)hd * 4);
            }
            continue;
        }
        for (int d0 = 0; d0 < hd; d0 += ATTN_MAX_D) {
            int nd = hd - d0 < ATTN_MAX_D ? hd - d0 : ATTN_MAX_D;
            attn_span(qg, kh, vh, tbl, c->bs, kv_stride, hd, n_g, c->scale, j_lo, n_keys, d0, nd, &w);
            for (int g = 0; g < n_g; g++) {
                float *oh = c->out + (t * c->n_heads + h0 + g) * hd + d0, inv = 1.0f / w.l[g];
                for (int d = 0; d < nd; d++) oh[d] = w.acc[g][d] * inv;
                if (c->lse && d0 == 0) c->lse[t * c->n_heads + h0 + g] = w.m[g] + logf(w.l[g]);
            }
        }
    }
    (void)ith;
    (void)nth;
}

/* Parallel over (token, kv head, batch of its query heads). When there are
 * too few such items to keep the pool busy (decode: n_tok = 1) and the
 * context is long, each item's keys are also split into segments
 * (flash-decoding); every segment leaves (m, l, acc) per head in a stack
 * buffer and the caller merges them. */
static void attention(nstf_cpu *cpu, const float *q, const float *k, const float *v, const int32_t *tbl,
                      int64_t tbl_stride, int bs, float *out, float *lse, int64_t n_tok, int64_t pos0, int n_heads,
                      int n_kv_heads, int head_dim, float scale, int window) {
    float part[ATTN_PART_FLOATS]; /* used only when splitting */
    const int nth = cpu_threads(cpu);
    const int group = n_heads / n_kv_heads, n_gb = (group + ATTN_MAX_G - 1) / ATTN_MAX_G;
    const int64_t n_base = n_tok * n_kv_heads * n_gb, n_pairs = n_tok * n_heads;
    const int64_t min_keys = window > 0 && pos0 + 1 > window ? window : pos0 + 1;
    int n_seg = 1;
    /* the split's segment count depends on the thread count, and with it the
     * order of the softmax merge: off in deterministic mode */
    if (nth > 1 && !lse && !(cpu && cpu->deterministic) && n_base < 4 * (int64_t)nth && head_dim <= ATTN_MAX_D) {
        int64_t want = (4 * (int64_t)nth + n_base - 1) / n_base;
        int64_t by_keys = min_keys / ATTN_SPLIT_MIN;
        int64_t by_buf = ATTN_PART_FLOATS / (n_pairs * (head_dim + 2));
        int64_t s = want < by_keys ? want : by_keys;
        s = s < by_buf ? s : by_buf;
        n_seg = s > 1 ? (int)s : 1;
    }
    attn_ctx c = {q, k, v, tbl, tbl_stride, bs, out, lse, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, window,
                  n_gb, n_seg, part, n_base * n_seg, 0};
    atomic_init(&c.next, 0);
    /* work ~ keys x head_dim x 2 per (token, head) */
    cpu_run(cpu, attn_fn, &c, n_pairs * (pos0 + (n_tok + 1) / 2) * head_dim * 2, c.n_items);
    if (n_seg == 1) return;
    for (int64_t pr = 0; pr < n_pairs; pr++) {
        const float *ps = part + pr * n_seg * (head_dim + 2);
        float m = -INFINITY, l = 0;
        for (int s = 0; s < n_seg; s++) m = ps[s * (head_dim + 2)] > m ? ps[s * (head_dim + 2)] : m;
        float *oh = out + pr * head_dim;
        for (int d = 0; d < head_dim; d++) oh[d] = 0;
        for (int s = 0; s < n_seg; s++) {
            const float *e = ps + s * (head_dim + 2);
            float w = expf(e[0] - m);
            l += w * e[1];
            for (int d = 0; d < head_dim; d++) oh[d] += w * e[2 + d];
        }
        float inv = 1.0f / l;
        for (int d = 0; d < head_dim; d++) oh[d] *= inv;
    }
}

void nstf_cpu_attention(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out,
                        int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim,
                        float scale) {
    attention(cpu, q, k, v, NULL, 0, 1, out, NULL, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, 0);
}

void nstf_cpu_attention_sw(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out,
                           int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim,
                           float scale, int window) {
    attention(cpu, q, k, v, NULL, 0, 1, out, NULL, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, window);
}

void nstf_cpu_attention_paged(nstf_cpu *cpu, const float *q, const float *k, const float *v,
                              const int32_t *blocks, int block_size, float *out, int64_t n_tok,
                              int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale,
                              int window) {
    attention(cpu, q, k, v, blocks, 0, block_size, out, NULL, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, window);
}

void nstf_cpu_attention_tbl(nstf_cpu *cpu, const float *q, const float *k, const float *v, const int32_t *tbl,
                            int64_t tbl_stride, int bs, float *out, int64_t n_keys, int n_heads, int n_kv_heads,
                            int head_dim, float scale) {
    attention(cpu, q, k, v, tbl, tbl_stride, bs, out, NULL, 1, n_keys - 1, n_heads, n_kv_heads, head_dim, scale, 0);
}

void nstf_cpu_attention_lse(nstf_cpu *cpu, const float *q, const float *k, const float *v,
                            float *out, float *lse, int64_t n_tok, int64_t pos0, int n_heads,
                            int n_kv_heads, int head_dim, float scale) {
    attention(cpu, q, k, v, NULL, 0, 1, out, lse, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, 0);
}

/* ---- argmax --------------------------------------------------------------- */

typedef struct {
    const float *x; /* [n_rows, n] */
    int32_t *out;   /* [n_rows] */
    int64_t n_rows, n;
} argmax_ctx;

/* Same answer as the reference (first index of the maximum): each SIMD
 * lane keeps the first index of its own maximum (strict >), and the lanes
 * are merged by value, then by lowest index. */
static int64_t argmax_row(const float *x, int64_t n) {
    int64_t best = 0, j = 1;
#if NSTF_CPU_AVX2
    if (n >= 16) {
        __m256 bv = _mm256_loadu_ps(x);
        __m256i bi = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), ji = bi;
        const __m256i step = _mm256_set1_epi32(8);
        for (j = 8; j + 8 <= n && j + 8 <= INT32_MAX; j += 8) {
            ji = _mm256_add_epi32(ji, step);
            __m256 v = _mm256_loadu_ps(x + j);
            __m256 gt = _mm256_cmp_ps(v, bv, _CMP_GT_OQ);
            bv = _mm256_blendv_ps(bv, v, gt);
            bi = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(ji), gt));
        }
        float vals[8];
        int32_t idx[8];
        _mm256_storeu_ps(vals, bv);
        _mm256_storeu_si256((__m256i *)idx, bi);
        best = idx[0];
        float bval = vals[0];
        for (int l = 1; l < 8; l++)
            if (vals[l] > bval || (vals[l] == bval && idx[l] < best)) {
                bval = vals[l];
                best = idx[l];
            }
    }
#endif
    for (; j < n; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

static void argmax_fn(void *p, int ith, int nth) {
    const argmax_ctx *c = p;
    int64_t r0, r1;
    nstf_split_range(c->n_rows, 1, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) c->out[r] = (int32_t)argmax_row(c->x + r * c->n, c->n);
}

void nstf_cpu_argmax(nstf_cpu *cpu, const float *x, int32_t *out, int64_t n_rows, int64_t n) {
    argmax_ctx c = {x, out, n_rows, n};
    cpu_run(cpu, argmax_fn, &c, n_rows * n, n_rows);
}

/* ---- bias, per-head norm ---------------------------------------------------- */

/* x[t, :] += b: a few thousand adds per token, not worth the pool */
void nstf_cpu_bias(nstf_cpu *cpu, float *x, const float *b, int64_t n_tok, int64_t width) {
    (void)cpu;
    for (int64_t t = 0; t < n_tok; t++) {
        float *xt = x + t * width;
        for (int64_t i = 0; i < width; i++) xt[i] += b[i];
    }
}

/* Every head_dim row normalised in place: the RMSNorm of rows of head_dim */
void nstf_cpu_head_norm(nstf_cpu *cpu, float *x, const float *w, int64_t n_rows, int head_dim, float eps) {
    nstf_cpu_rmsnorm(cpu, x, w, x, n_rows, head_dim, eps);
}
