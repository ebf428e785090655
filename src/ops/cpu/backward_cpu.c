/* backward_cpu.c — the fast CPU paths of the heavy backward ops
 * (backward.h): both matmul gradients, attention backward and the fused,
 * vocabulary-chunked cross-entropy. The light ones (embedding, RMSNorm,
 * RoPE, SwiGLU) are O(n) and run their reference.
 *
 * Determinism: every output element is computed by one thread, in an order
 * fixed by the shape alone (tile grids and work items do not depend on the
 * thread count), so results are bitwise identical for any pool size.
 * Nothing here allocates: scratch lives in fixed-size stack arrays, and the
 * cross-entropy's logits chunk in a workspace the caller plans once. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "ops/backward.h"
#include "ops/cpu/cpu_internal.h"

/* ---- fp32 GEMM: C (+)= op(A) B ---------------------------------------------
 *
 * B is row-major [K, N]; A is read through strides, A[m, k] = a[m*sam + k*sak],
 * so one kernel serves dx = dy W (A = dy as stored) and dW = dy^T x
 * (A = dy transposed). C [M, N] is cut into GEMM_MC x GEMM_NC tiles, one
 * thread per tile; inside a tile K is walked in GEMM_KC slices and the
 * GEMM_MR x GEMM_NR register block (8 AVX2 accumulators) keeps its B panel
 * (GEMM_KC x 16 floats = 16 KiB) in L1 while it walks the tile's rows. Edges
 * use masked loads and stores, so every element sees the same FMA sequence
 * (C, then k = 0, 1, ... in order) wherever it sits. */

#define GEMM_MR 4
#define GEMM_NR 16
#define GEMM_MC 64
#define GEMM_NC 128
#define GEMM_KC 256

typedef struct {
    const float *a;
    int64_t sam, sak; /* A[m, k] = a[m * sam + k * sak] */
    const float *b;   /* [K, ldb] */
    int64_t ldb;
    float *c;         /* [M, ldc] */
    int64_t ldc;
    int64_t m, n, k;
    bool acc;         /* C += op(A) B, else C = op(A) B */
    int64_t n_nt, n_tiles;
} gemm_ctx;

#if NSTF_CPU_AVX2
static inline __m256i lane_mask(int n) { /* lanes [0, n) set, n in [0, 8] */
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* C[0..mr, 0..nr) (+)= A[0..mr, 0..kc) B[0..kc, 0..nr). Rows of A past mr
 * re-read row 0 (their results are not stored). */
static inline __attribute__((always_inline)) void
gemm_micro(const float *a, int64_t sam, int64_t sak, const float *b, int64_t ldb, float *c,
           int64_t ldc, int mr, int nr, int64_t kc, bool load_c, const bool full) {
    const float *a0 = a, *a1 = a + (mr > 1 ? sam : 0), *a2 = a + (mr > 2 ? 2 * sam : 0),
                *a3 = a + (mr > 3 ? 3 * sam : 0);
    const __m256i k0 = lane_mask(nr < 8 ? nr : 8), k1 = lane_mask(nr > 8 ? nr - 8 : 0);
    __m256 c0[GEMM_MR], c1[GEMM_MR];
    for (int i = 0; i < GEMM_MR; i++) {
        c0[i] = c1[i] = _mm256_setzero_ps();
        if (load_c && i < mr) {
            c0[i] = full ? _mm256_loadu_ps(c + i * ldc) : _mm256_maskload_ps(c + i * ldc, k0);
            c1[i] = full ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_maskload_ps(c + i * ldc + 8, k1);
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        const float *bk = b + k * ldb;
        __m256 b0 = full ? _mm256_loadu_ps(bk) : _mm256_maskload_ps(bk, k0);
        __m256 b1 = full ? _mm256_loadu_ps(bk + 8) : _mm256_maskload_ps(bk + 8, k1);
        int64_t ak = k * sak;
        __m256 x = _mm256_broadcast_ss(a0 + ak);
        c0[0] = _mm256_fmadd_ps(x, b0, c0[0]);
        c1[0] = _mm256_fmadd_ps(x, b1, c1[0]);
        x = _mm256_broadcast_ss(a1 + ak);
        c0[1] = _mm256_fmadd_ps(x, b0, c0[1]);
        c1[1] = _mm256_fmadd_ps(x, b1, c1[1]);
        x = _mm256_broadcast_ss(a2 + ak);
        c0[2] = _mm256_fmadd_ps(x, b0, c0[2]);
        c1[2] = _mm256_fmadd_ps(x, b1, c1[2]);
        x = _mm256_broadcast_ss(a3 + ak);
        c0[3] = _mm256_fmadd_ps(x, b0, c0[3]);
        c1[3] = _mm256_fmadd_ps(x, b1, c1[3]);
    }
    for (int i = 0; i < mr; i++) {
        if (full) {
            _mm256_storeu_ps(c + i * ldc, c0[i]);
            _mm256_storeu_ps(c + i * ldc + 8, c1[i]);
        } else {
            _mm256_maskstore_ps(c + i * ldc, k0, c0[i]);
            _mm256_maskstore_ps(c + i * ldc + 8, k1, c1[i]);
        }
    }
}
#endif

/* One GEMM_MC x GEMM_NC tile of C. */
static void gemm_tile(const gemm_ctx *g, int64_t tile) {
    int64_t m0 = tile / g->n_nt * GEMM_MC, n0 = tile % g->n_nt * GEMM_NC;
    int64_t m1 = m0 + GEMM_MC < g->m ? m0 + GEMM_MC : g->m;
    int64_t n1 = n0 + GEMM_NC < g->n ? n0 + GEMM_NC : g->n;
    if (g->k == 0 && !g->acc)
        for (int64_t m = m0; m < m1; m++) memset(g->c + m * g->ldc + n0, 0, (size_t)(n1 - n0) * 4);
    for (int64_t k0 = 0; k0 < g->k; k0 += GEMM_KC) {
        int64_t kc = g->k - k0 < GEMM_KC ? g->k - k0 : GEMM_KC;
        bool load_c = k0 > 0 || g->acc;
        for (int64_t n = n0; n < n1; n += GEMM_NR) {
            int nr = n1 - n < GEMM_NR ? (int)(n1 - n) : GEMM_NR;
            const float *b = g->b + k0 * g->ldb + n;
            for (int64_t m = m0; m < m1; m += GEMM_MR) {
                int mr = m1 - m < GEMM_MR ? (int)(m1 - m) : GEMM_MR;
                const float *a = g->a + m * g->sam + k0 * g->sak;
                float *c = g->c + m * g->ldc + n;
#if NSTF_CPU_AVX2
                if (nr == GEMM_NR)
                    gemm_micro(a, g->sam, g->sak, b, g->ldb, c, g->ldc, mr, nr, kc, load_c, true);
                else
                    gemm_micro(a, g->sam, g->sak, b, g->ldb, c, g->ldc, mr, nr, kc, load_c, false);
#else
                for (int i = 0; i < mr; i++)
                    for (int j = 0; j < nr; j++) {
                        float s = load_c ? c[i * g->ldc + j] : 0.0f;
                        for (int64_t k = 0; k < kc; k++)
                            s += a[i * g->sam + k * g->sak] * b[k * g->ldb + j];
                        c[i * g->ldc + j] = s;
                    }
#endif
            }
        }
    }
}

static void gemm_fn(void *p, int ith, int nth) {
    const gemm_ctx *g = p;
    int64_t t0, t1;
    nstf_split_range(g->n_tiles, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) gemm_tile(g, t);
}

static void gemm_run(nstf_cpu *cpu, gemm_ctx g) {
    if (g.m <= 0 || g.n <= 0) return;
    g.n_nt = (g.n + GEMM_NC - 1) / GEMM_NC;
    g.n_tiles = (g.m + GEMM_MC - 1) / GEMM_MC * g.n_nt;
    cpu_run(cpu, gemm_fn, &g, g.m * g.n * (g.k > 0 ? g.k : 1), g.n_tiles);
}

/* dx[n_tok, n_in] (+)= dy[n_tok, n_out] @ W[n_out, n_in] */
void nstf_cpu_matmul_bwd_x(nstf_cpu *cpu, const float *w, const float *dy, float *dx,
                           int64_t n_tok, int64_t n_in, int64_t n_out, bool acc) {
    gemm_ctx g = {.a = dy, .sam = n_out, .sak = 1, .b = w, .ldb = n_in, .c = dx, .ldc = n_in,
                  .m = n_tok, .n = n_in, .k = n_out, .acc = acc};
    gemm_run(cpu, g);
}

/* dW[n_out, n_in] += dy[n_tok, n_out]^T @ x[n_tok, n_in] */
void nstf_cpu_matmul_bwd_w(nstf_cpu *cpu, const float *x, const float *dy, float *dw,
                           int64_t n_tok, int64_t n_in, int64_t n_out) {
    gemm_ctx g = {.a = dy, .sam = 1, .sak = n_out, .b = x, .ldb = n_in, .c = dw, .ldc = n_in,
                  .m = n_out, .n = n_in, .k = n_tok, .acc = true};
    gemm_run(cpu, g);
}

/* ---- attention backward -----------------------------------------------------
 *
 * Pass 1 (dq): items (token, kv head, batch of up to ABW_G of its query
 * heads); each walks the token's keys once for the batch, ABW_KCH keys at a
 * time: scores, p = e^(s - lse) (vector exp), dp = dout.v, dS = p (dp - D),
 * dq += dS k. Pass 2 (dk, dv): items (kv head, block of ABW_KB keys); each
 * walks every query row and head that sees the block, recomputing p and dS,
 * and sums dv += p dout, dk += dS q into stack accumulators. D = dout.out is
 * recomputed where needed (one head_dim dot per row, per key block in pass
 * 2: 1/(4 ABW_KB) of the work), so no per-row scratch is needed. Items go
 * through an atomic counter, costliest first (late tokens in pass 1, early
 * key blocks in pass 2). */

#define ABW_G 8     /* query heads per pass-1 item */
#define ABW_KCH 32  /* keys per pass-1 score chunk */
#define ABW_KB 16   /* keys per pass-2 item */
#define ABW_D NSTF_ATTN_BWD_MAX_D

typedef struct {
    const float *q, *k, *v, *out, *dout, *lse;
    float *dq, *dk, *dv;
    int64_t n_tok, pos0, kv_stride;
    int n_heads, n_kv_heads, head_dim, group, n_gb;
    float scale;
    int64_t n_items, n_kb;
    atomic_llong next;
} abw_ctx;

/* p[j] = e^(s[j] - l) for j < n, in place */
static void exp_shift(float *s, int n, float l) {
    int j = 0;
#if NSTF_CPU_AVX2
    __m256 vl = _mm256_set1_ps(l);
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vl)));
#endif
    for (; j < n; j++) s[j] = expf(s[j] - l);
}

static void abw_dq_fn(void *p, int ith, int nth) {
    abw_ctx *c = p;
    const int hd = c->head_dim;
    float acc[ABW_G][ABW_D], sc[ABW_G][ABW_KCH], dd[ABW_G];
    for (;;) {
        int64_t it = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (it >= c->n_items) break;
        int gb = (int)(it % c->n_gb);
        int kvh = (int)(it / c->n_gb % c->n_kv_heads);
        int64_t t = c->n_tok - 1 - it / c->n_gb / c->n_kv_heads;
        int h0 = kvh * c->group + gb * ABW_G;
        int n_g = c->group - gb * ABW_G < ABW_G ? c->group - gb * ABW_G : ABW_G;
        int64_t row0 = (t * c->n_heads + h0) * hd, n_keys = c->pos0 + t + 1;
        const float *kh = c->k + (int64_t)kvh * hd, *vh = c->v + (int64_t)kvh * hd;
        for (int g = 0; g < n_g; g++) {
            dd[g] = simd_dot(c->dout + row0 + g * hd, c->out + row0 + g * hd, hd);
            memset(acc[g], 0, (size_t)hd * 4);
        }
        for (int64_t j0 = 0; j0 < n_keys; j0 += ABW_KCH) {
            int n = n_keys - j0 < ABW_KCH ? (int)(n_keys - j0) : ABW_KCH;
            for (int g = 0; g < n_g; g++) {
                for (int j = 0; j < n; j++)
                    sc[g][j] = c->scale * simd_dot(c->q + row0 + g * hd, kh + (j0 + j) * c->kv_stride, hd);
                exp_shift(sc[g], n, c->lse[t * c->n_heads + h0 + g]);
            }
            for (int j = 0; j < n; j++) {
                const float *kj = kh + (j0 + j) * c->kv_stride, *vj = vh + (j0 + j) * c->kv_stride;
                for (int g = 0; g < n_g; g++) {
                    float ds = sc[g][j] * (simd_dot(c->dout + row0 + g * hd, vj, hd) - dd[g]);
                    simd_axpy(acc[g], ds, kj, hd);
                }
            }
        }
        for (int g = 0; g < n_g; g++)
            for (int d = 0; d < hd; d++) c->dq[row0 + g * hd + d] = c->scale * acc[g][d];
    }
    (void)ith;
    (void)nth;
}

static void abw_dkv_fn(void *p, int ith, int nth) {
    abw_ctx *c = p;
    const int hd = c->head_dim;
    float dk[ABW_KB][ABW_D], dv[ABW_KB][ABW_D], pr[ABW_KB];
    for (;;) {
        int64_t it = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (it >= c->n_items) break;
        int kvh = (int)(it % c->n_kv_heads);
        int64_t j0 = it / c->n_kv_heads * ABW_KB, n_keys = c->pos0 + c->n_tok;
        int nb = n_keys - j0 < ABW_KB ? (int)(n_keys - j0) : ABW_KB;
        const float *kb = c->k + j0 * c->kv_stride + (int64_t)kvh * hd;
        const float *vb = c->v + j0 * c->kv_stride + (int64_t)kvh * hd;
        for (int j = 0; j < nb; j++) {
            memset(dk[j], 0, (size_t)hd * 4);
            memset(dv[j], 0, (size_t)hd * 4);
        }
        /* the query rows that see key j0: positions pos0 + t >= j0 */
        for (int64_t t = j0 > c->pos0 ? j0 - c->pos0 : 0; t < c->n_tok; t++) {
            int64_t jt = c->pos0 + t + 1 - j0; /* keys of the block this row sees */
            int n = jt < nb ? (int)jt : nb;
            for (int h = kvh * c->group; h < (kvh + 1) * c->group; h++) {
                int64_t row = (t * c->n_heads + h) * hd;
                const float *qh = c->q + row, *doh = c->dout + row;
                float dd = simd_dot(doh, c->out + row, hd);
                for (int j = 0; j < n; j++) pr[j] = c->scale * simd_dot(qh, kb + j * c->kv_stride, hd);
                exp_shift(pr, n, c->lse[t * c->n_heads + h]);
                for (int j = 0; j < n; j++) {
                    float ds = pr[j] * (simd_dot(doh, vb + j * c->kv_stride, hd) - dd);
                    simd_axpy(dv[j], pr[j], doh, hd);
                    simd_axpy(dk[j], ds, qh, hd);
                }
            }
        }
        for (int j = 0; j < nb; j++) {
            float *dkr = c->dk + (j0 + j) * c->kv_stride + (int64_t)kvh * hd;
            float *dvr = c->dv + (j0 + j) * c->kv_stride + (int64_t)kvh * hd;
            for (int d = 0; d < hd; d++) dkr[d] = c->scale * dk[j][d];
            memcpy(dvr, dv[j], (size_t)hd * 4);
        }
    }
    (void)ith;
    (void)nth;
}

void nstf_cpu_attention_bwd(nstf_cpu *cpu, const float *q, const float *k, const float *v,
                            const float *out, const float *dout, const float *lse, float *dq,
                            float *dk, float *dv, int64_t n_tok, int64_t pos0, int n_heads,
                            int n_kv_heads, int head_dim, float scale) {
    if (head_dim > ABW_D) {
        nstf_ref_attention_bwd(q, k, v, out, dout, lse, dq, dk, dv, n_tok, pos0, n_heads,
                               n_kv_heads, head_dim, scale);
        return;
    }
    const int group = n_heads / n_kv_heads;
    abw_ctx c = {q, k, v, out, dout, lse, dq, dk, dv, n_tok, pos0, (int64_t)n_kv_heads * head_dim,
                 n_heads, n_kv_heads, head_dim, group, (group + ABW_G - 1) / ABW_G, scale, 0, 0, 0};
    /* work ~ (key, query head) pairs x head_dim x 3 (pass 1) or 4 (pass 2) */
    int64_t pairs = n_tok * n_heads * (pos0 + (n_tok + 1) / 2);
    c.n_items = n_tok * n_kv_heads * c.n_gb;
    atomic_init(&c.next, 0);
    cpu_run(cpu, abw_dq_fn, &c, pairs * head_dim * 3, c.n_items);
    c.n_kb = (pos0 + n_tok + ABW_KB - 1) / ABW_KB;
    c.n_items = c.n_kb * n_kv_heads;
    atomic_store(&c.next, 0);
    cpu_run(cpu, abw_dkv_fn, &c, pairs * head_dim * 4, c.n_items);
}

/* ---- cross-entropy ------------------------------------------------------------
 *
 * Per block of up to NSTF_CE_TOK non-ignored tokens (their h rows gathered
 * into the workspace):
 *   pass 1, per vocabulary chunk: z = h W_c^T (nstf_cpu_matmul, fp32 W), and
 *     per row an online max m and sum l = sum e^(z - m) (double), the
 *     target's logit when it falls in the chunk; lse = m + log l;
 *   pass 2, per chunk: z recomputed (the same call: the same bits), turned
 *     in place into g = (e^(z - m) / l - onehot) / n_norm; dh_b (+)= g W_c;
 *     dW_c += g^T h_b.
 * Workspace: h_b [NSTF_CE_TOK, dim], dh_b [NSTF_CE_TOK, dim], z
 * [NSTF_CE_TOK, NSTF_CE_VOCAB]. */

typedef struct {
    float *z;        /* [nb, nv] logits of the chunk */
    int64_t nb, nv, v0;
    const int32_t *tgt; /* [nb] target of each row */
    double *m, *l;   /* [nb] running max and sum of e^(z - m) */
    float *zt;       /* [nb] target logit */
    double inv;      /* 1 / n_norm */
} ce_ctx;

static void ce_lse_fn(void *p, int ith, int nth) {
    const ce_ctx *c = p;
    int64_t r0, r1;
    nstf_split_range(c->nb, 1, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->z + r * c->nv;
        float cm = -INFINITY;
        for (int64_t j = 0; j < c->nv; j++) cm = z[j] > cm ? z[j] : cm;
        if (cm > c->m[r]) {
            c->l[r] *= exp(c->m[r] - cm); /* 0 on the first chunk (m = -inf) */
            c->m[r] = cm;
        }
        float mr = (float)c->m[r], s = 0;
        int64_t j = 0;
#if NSTF_CPU_AVX2
        __m256 vm = _mm256_set1_ps(mr), vs = _mm256_setzero_ps();
        for (; j + 8 <= c->nv; j += 8) vs = _mm256_add_ps(vs, exp256(_mm256_sub_ps(_mm256_loadu_ps(z + j), vm)));
        s = hsum256(vs);
#endif
        for (; j < c->nv; j++) s += expf(z[j] - mr);
        c->l[r] += s;
        int64_t tj = c->tgt[r] - c->v0;
        if (tj >= 0 && tj < c->nv) c->zt[r] = z[tj];
    }
}

static void ce_grad_fn(void *p, int ith, int nth) {
    const ce_ctx *c = p;
    int64_t r0, r1;
    nstf_split_range(c->nb, 1, ith, nth, &r0, &r1);
    const float inv = (float)c->inv;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->z + r * c->nv;
        /* softmax = e^(z - m) / l: m is a logit (exact), l a double sum, so
         * no rounded lse enters the exponent */
        exp_shift(z, (int)c->nv, (float)c->m[r]);
        const float sc = (float)(c->inv / c->l[r]);
        for (int64_t j = 0; j < c->nv; j++) z[j] *= sc;
        int64_t tj = c->tgt[r] - c->v0;
        if (tj >= 0 && tj < c->nv) z[tj] -= inv;
    }
}

int64_t nstf_cpu_cross_entropy_work(int64_t n_tok, int64_t dim, int64_t n_vocab) {
    int64_t tc = n_tok < NSTF_CE_TOK ? n_tok : NSTF_CE_TOK;
    int64_t vc = n_vocab < NSTF_CE_VOCAB ? n_vocab : NSTF_CE_VOCAB;
    return tc * (2 * dim + vc);
}

double nstf_cpu_cross_entropy(nstf_cpu *cpu, const float *h, const float *w,
                              const int32_t *targets, int32_t ignore_index, double n_norm,
                              float *lse, float *dh, float *dw, int64_t n_tok, int64_t dim,
                              int64_t n_vocab, float *work) {
    if (nstf_ce_prepare(targets, n_tok, dim, ignore_index, &n_norm, lse, dh) == 0) return 0.0;
    const int64_t tc = n_tok < NSTF_CE_TOK ? n_tok : NSTF_CE_TOK;
    const int64_t vc = n_vocab < NSTF_CE_VOCAB ? n_vocab : NSTF_CE_VOCAB;
    float *hb = work, *dhb = hb + tc * dim, *z = dhb + tc * dim; /* [tc, dim] x2, [tc, vc] */
    int64_t idx[NSTF_CE_TOK];
    int32_t tgt[NSTF_CE_TOK];
    double m[NSTF_CE_TOK], l[NSTF_CE_TOK];
    float zt[NSTF_CE_TOK];
    ce_ctx c = {.z = z, .tgt = tgt, .m = m, .l = l, .zt = zt, .inv = 1.0 / n_norm};
    double loss = 0;
    for (int64_t t = 0; t < n_tok;) {
        int64_t nb = 0;
        for (; t < n_tok && nb < tc; t++) {
            if (targets[t] == ignore_index) continue;
            idx[nb] = t;
            tgt[nb] = targets[t];
            memcpy(hb + nb * dim, h + t * dim, (size_t)dim * 4);
            m[nb] = -INFINITY;
            l[nb] = 0;
            nb++;
        }
        if (nb == 0) break;
        c.nb = nb;
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t v0 = 0; v0 < n_vocab; v0 += vc) {
                c.v0 = v0;
                c.nv = n_vocab - v0 < vc ? n_vocab - v0 : vc;
                nstf_cpu_matmul(cpu, NSTF_TYPE_F32, w + v0 * dim, hb, z, nb, dim, c.nv);
                if (pass == 0) {
                    cpu_run(cpu, ce_lse_fn, &c, 8 * nb * c.nv, nb);
                    continue;
                }
                cpu_run(cpu, ce_grad_fn, &c, 8 * nb * c.nv, nb);
                gemm_ctx gh = {.a = z, .sam = c.nv, .sak = 1, .b = w + v0 * dim, .ldb = dim,
                               .c = dhb, .ldc = dim, .m = nb, .n = dim, .k = c.nv, .acc = v0 > 0};
                gemm_run(cpu, gh);
                if (!dw) continue; /* a frozen output matrix */
                gemm_ctx gw = {.a = z, .sam = 1, .sak = c.nv, .b = hb, .ldb = dim,
                               .c = dw + v0 * dim, .ldc = dim, .m = c.nv, .n = dim, .k = nb,
                               .acc = true};
                gemm_run(cpu, gw);
            }
            if (pass == 0)
                for (int64_t r = 0; r < nb; r++) {
                    double lr = m[r] + log(l[r]);
                    loss += (lr - zt[r]) * c.inv;
                    if (lse) lse[idx[r]] = (float)lr;
                }
        }
        for (int64_t r = 0; r < nb; r++) memcpy(dh + idx[r] * dim, dhb + r * dim, (size_t)dim * 4);
    }
    return loss;
}

/* ---- the light ones: embedding, RMSNorm, SwiGLU --------------------------------
 *
 * O(n) each; threaded so that a training step on many tokens does not wait
 * on one core. Each output element is owned by one thread and summed in
 * token order, as everywhere in this file. */

typedef struct {
    const int32_t *ids;
    const float *dout; /* [n_tok, dim] */
    float *dtable;     /* [n_rows, dim] += */
    int64_t n_tok, dim;
} gr_bwd_ctx;

/* Threads own column ranges of the table, so repeated ids never race and
 * every element sums its tokens in order. */
static void gr_bwd_fn(void *p, int ith, int nth) {
    const gr_bwd_ctx *c = p;
    int64_t i0, i1;
    nstf_split_range(c->dim, 16, ith, nth, &i0, &i1);
    for (int64_t t = 0; t < c->n_tok; t++) {
        float *row = c->dtable + (int64_t)c->ids[t] * c->dim;
        const float *d = c->dout + t * c->dim;
        for (int64_t i = i0; i < i1; i++) row[i] += d[i];
    }
}

void nstf_cpu_get_rows_bwd(nstf_cpu *cpu, const int32_t *ids, const float *dout, float *dtable,
                           int64_t n_tok, int64_t dim) {
    gr_bwd_ctx c = {ids, dout, dtable, n_tok, dim};
    cpu_run(cpu, gr_bwd_fn, &c, n_tok * dim, dim / 16);
}

typedef struct {
    const float *x, *w, *dy; /* [n, dim], [dim], [n, dim] */
    float *dx, *dw;          /* [n, dim] +=, [dim] += */
    float *r;                /* [n] rsqrt(mean(x^2) + eps) of each row */
    int64_t n, dim;
    float eps;
} rms_bwd_ctx;

/* per row: r, c = sum dy w x (double), dx += r dy w - x r^3 c / dim */
static void rms_bwd_dx_fn(void *p, int ith, int nth) {
    const rms_bwd_ctx *c = p;
    const int64_t dim = c->dim;
    int64_t t0, t1;
    nstf_split_range(c->n, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const float *x = c->x + t * dim, *dy = c->dy + t * dim;
        double ss = 0, cs = 0;
        for (int64_t i = 0; i < dim; i++) {
            ss += (double)x[i] * x[i];
            cs += (double)dy[i] * c->w[i] * x[i];
        }
        const double r = 1.0 / sqrt(ss / (double)dim + (double)c->eps);
        const float rf = (float)r, k = (float)(r * r * r * cs / (double)dim);
        float *dx = c->dx + t * dim;
        for (int64_t i = 0; i < dim; i++) dx[i] += rf * dy[i] * c->w[i] - x[i] * k;
        c->r[t] = rf;
    }
}

/* per column: dw += sum over rows of dy x r, in double, rows in order */
static void rms_bwd_dw_fn(void *p, int ith, int nth) {
    const rms_bwd_ctx *c = p;
    int64_t i0, i1;
    nstf_split_range(c->dim, 16, ith, nth, &i0, &i1);
    enum { COLS = 256 };
    double acc[COLS];
    for (int64_t a = i0; a < i1; a += COLS) {
        const int64_t nc = i1 - a < COLS ? i1 - a : COLS;
        for (int64_t i = 0; i < nc; i++) acc[i] = 0;
        for (int64_t t = 0; t < c->n; t++) {
            const float *x = c->x + t * c->dim + a, *dy = c->dy + t * c->dim + a;
            const double r = c->r[t];
            for (int64_t i = 0; i < nc; i++) acc[i] += (double)dy[i] * x[i] * r;
        }
        for (int64_t i = 0; i < nc; i++) c->dw[a + i] += (float)acc[i];
    }
}

void nstf_cpu_rmsnorm_bwd(nstf_cpu *cpu, const float *x, const float *w, const float *dy, float *dx,
                          float *dw, int64_t n, int64_t dim, float eps, float *work) {
    rms_bwd_ctx c = {x, w, dy, dx, dw, work, n, dim, eps};
    cpu_run(cpu, rms_bwd_dx_fn, &c, 6 * n * dim, n);
    if (dw) cpu_run(cpu, rms_bwd_dw_fn, &c, 3 * n * dim, dim / 16);
}

typedef struct {
    const float *gate, *up, *dy;
    float *dgate, *dup;
    int64_t n;
} swiglu_bwd_ctx;

static void swiglu_bwd_fn(void *p, int ith, int nth) {
    const swiglu_bwd_ctx *c = p;
    int64_t i0, i1;
    nstf_split_range(c->n, 64, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        const float g = c->gate[i], u = c->up[i], d = c->dy[i];
        const float sg = 1.0f / (1.0f + expf(-g));
        c->dgate[i] = d * u * sg * (1.0f + g * (1.0f - sg));
        c->dup[i] = d * g * sg;
    }
}

void nstf_cpu_swiglu_bwd(nstf_cpu *cpu, const float *gate, const float *up, const float *dy,
                         float *dgate, float *dup, int64_t n) {
    swiglu_bwd_ctx c = {gate, up, dy, dgate, dup, n};
    cpu_run(cpu, swiglu_bwd_fn, &c, 12 * n, n / 64);
}
