/* test_ops_cpu.c — every CPU op except the fast matmul: the fast path
 * (nstf_cpu_*) and the scalar reference (nstf_ref_*) are each compared with
 * an fp64 computation written here; the matmul reference is checked the
 * same way for every weight type (the fast matmul has its own test).
 *
 * Metrics and tolerances:
 *   fp32 ops (rmsnorm, add, matmul ref, rope, attention, swiglu):
 *     NMSE = sum (y - y64)^2 / sum y64^2 <= 1e-7 against the fp64 result;
 *   get_rows: bit-exact against nstf_dequantize_row of the gathered row;
 *   argmax:   exact index (first index of the maximum).
 * Every output is poisoned (NaN bytes) before each run, followed by a guard
 * region that is checked afterwards, and must be free of NaN/Inf. Fast
 * paths run with no pool and with pools of 1, 2, 3 and 4 threads; shapes
 * are not multiples of the SIMD width and are large enough to cross the
 * threshold above which ops go parallel. */
#include "core/dtype.h"
#include "core/threadpool.h"
#include "ops/ops.h"
#include "test_util.h"

#define TOL_F32 1e-7
#define N_CFG 5 /* no pool, then pools of 1..4 threads */

static nstf_cpu g_cpu[N_CFG];

static void poison(void *p, size_t bytes) { memset(p, 0xff, bytes); }

static void fill_normal(test_rng *r, float *x, int64_t n, float sigma) {
    for (int64_t i = 0; i < n; i++) x[i] = sigma * rng_normal(r);
}

/* worst NMSE seen per op (first word of the check's name), printed at the end */
static struct { char op[16]; double worst; } g_worst[16];

static void note_worst(const char *what, double e) {
    char op[16];
    int i = 0;
    while (what[i] && what[i] != ' ' && i < 15) { op[i] = what[i]; i++; }
    op[i] = 0;
    if (!strcmp(op, "ref") && !strncmp(what, "ref matmul", 10)) strcpy(op, "ref_matmul");
    for (i = 0; i < 16; i++) {
        if (!g_worst[i].op[0]) strcpy(g_worst[i].op, op);
        if (!strcmp(g_worst[i].op, op)) {
            if (e > g_worst[i].worst) g_worst[i].worst = e;
            return;
        }
    }
}

/* NMSE vs fp64, no NaN/Inf, guard intact */
static void check_f32(const char *what, const float *got, int64_t n, const double *want) {
    int64_t bad = count_nonfinite(got, n);
    CHECK(bad == 0, "%s: %lld non-finite outputs", what, (long long)bad);
    double e = nmse(got, want, n);
    note_worst(what, e);
    CHECK(e <= TOL_F32, "%s: NMSE %.3g > %.3g", what, e, TOL_F32);
    CHECK(guard_ok(got, (size_t)n * 4), "%s: guard overwritten", what);
}

static const int64_t k_dims[] = {1, 7, 33, 576, 1000};
static const int64_t k_ntoks[] = {1, 3, 17, 64};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- get_rows ------------------------------------------------------------- */

static void test_get_rows(test_rng *r) {
    const nstf_type types[] = {NSTF_TYPE_F32, NSTF_TYPE_F16, NSTF_TYPE_BF16,
                               NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1};
    const int64_t fdims[] = {1, 7, 33, 576, 1000}, qdims[] = {32, 96, 576, 1024};
    const int64_t n_rows = 50;
    for (int ti = 0; ti < COUNT(types); ti++) {
        nstf_type type = types[ti];
        bool quant = nstf_type_block_elems(type) > 1;
        int n_dims = quant ? COUNT(qdims) : COUNT(fdims);
        for (int di = 0; di < n_dims; di++) {
            int64_t dim = quant ? qdims[di] : fdims[di];
            uint64_t rb;
            CHECK(nstf_type_row_bytes(type, dim, &rb), "row bytes");
            unsigned char *table = malloc(rb * n_rows);
            float *src = malloc(dim * 4);
            for (int64_t row = 0; row < n_rows; row++) {
                fill_normal(r, src, dim, 1.0f);
                nstf_quantize_row(type, src, table + row * rb, dim);
            }
            for (int ni = 0; ni < COUNT(k_ntoks); ni++) {
                int64_t n_tok = k_ntoks[ni];
                int32_t *ids = malloc(n_tok * 4);
                for (int64_t t = 0; t < n_tok; t++) ids[t] = (int32_t)(rng_next(r) % n_rows);
                ids[0] = (int32_t)(n_rows - 1); /* the last row too */
                float *want = malloc(n_tok * dim * 4);
                for (int64_t t = 0; t < n_tok; t++)
                    nstf_dequantize_row(type, table + ids[t] * rb, want + t * dim, dim);
                size_t bytes = (size_t)(n_tok * dim * 4);
                float *out = guarded_alloc(bytes);
                for (int cfg = -1; cfg < N_CFG; cfg++) { /* -1 = reference */
                    poison(out, bytes);
                    if (cfg < 0)
                        nstf_ref_get_rows(type, table, ids, out, n_tok, dim);
                    else
                        nstf_cpu_get_rows(&g_cpu[cfg], type, table, ids, out, n_tok, dim);
                    CHECK(memcmp(out, want, bytes) == 0 && guard_ok(out, bytes),
                          "get_rows %s dim %lld n_tok %lld cfg %d: not exact or guard",
                          nstf_type_name(type), (long long)dim, (long long)n_tok, cfg);
                    CHECK(count_nonfinite(out, n_tok * dim) == 0, "get_rows non-finite");
                }
                free(out); free(want); free(ids);
            }
            free(table); free(src);
        }
    }
}

/* ---- rmsnorm, add, swiglu ------------------------------------------------- */

static void test_rowwise(test_rng *r) {
    char what[160];
    for (int di = 0; di < COUNT(k_dims); di++) {
        for (int ni = 0; ni < COUNT(k_ntoks); ni++) {
            int64_t dim = k_dims[di], n_tok = k_ntoks[ni], n = dim * n_tok;
            size_t bytes = (size_t)n * 4;
            float *a = malloc(bytes), *b = malloc(bytes), *w = malloc(dim * 4);
            float *y = guarded_alloc(bytes);
            double *want = malloc(n * 8);
            fill_normal(r, a, n, 2.0f);
            fill_normal(r, b, n, 1.0f);
            fill_normal(r, w, dim, 1.0f);
            a[0] = 30.0f; a[n - 1] = -30.0f; /* saturating silu on both sides */

            /* rmsnorm, eps 1e-5 */
            const float eps = 1e-5f;
            for (int64_t t = 0; t < n_tok; t++) {
                double ss = 0;
                for (int64_t i = 0; i < dim; i++) ss += (double)a[t * dim + i] * a[t * dim + i];
                double inv = 1.0 / sqrt(ss / dim + eps);
                for (int64_t i = 0; i < dim; i++) want[t * dim + i] = a[t * dim + i] * inv * w[i];
            }
            for (int cfg = -1; cfg < N_CFG; cfg++) {
                poison(y, bytes);
                if (cfg < 0) nstf_ref_rmsnorm(a, w, y, n_tok, dim, eps);
                else nstf_cpu_rmsnorm(&g_cpu[cfg], a, w, y, n_tok, dim, eps);
                snprintf(what, sizeof what, "rmsnorm dim %lld n_tok %lld cfg %d", (long long)dim, (long long)n_tok, cfg);
                check_f32(what, y, n, want);
            }

            /* add, also in place (y aliasing a, then b) */
            for (int64_t i = 0; i < n; i++) want[i] = (double)a[i] + b[i];
            for (int cfg = -1; cfg < N_CFG; cfg++) {
                for (int alias = 0; alias < 3; alias++) {
                    poison(y, bytes);
                    const float *pa = a, *pb = b;
                    if (alias == 1) { memcpy(y, a, bytes); pa = y; }
                    if (alias == 2) { memcpy(y, b, bytes); pb = y; }
                    if (cfg < 0) nstf_ref_add(pa, pb, y, n);
                    else nstf_cpu_add(&g_cpu[cfg], pa, pb, y, n);
                    snprintf(what, sizeof what, "add n %lld alias %d cfg %d", (long long)n, alias, cfg);
                    check_f32(what, y, n, want);
                }
            }

            /* swiglu */
            for (int64_t i = 0; i < n; i++) {
                double g = a[i];
                want[i] = g / (1.0 + exp(-g)) * b[i];
            }
            for (int cfg = -1; cfg < N_CFG; cfg++) {
                poison(y, bytes);
                if (cfg < 0) nstf_ref_swiglu(a, b, y, n);
                else nstf_cpu_swiglu(&g_cpu[cfg], a, b, y, n);
                snprintf(what, sizeof what, "swiglu n %lld cfg %d", (long long)n, cfg);
                check_f32(what, y, n, want);
            }
            free(a); free(b); free(w); free(y); free(want);
        }
    }
}

/* ---- rope ----------------------------------------------------------------- */

static void rope64(const float *x, double *y, const int32_t *pos, int64_t n_tok, int n_heads,
                   int head_dim, double base, nstf_rope_mode mode) {
    int half = head_dim / 2;
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *xh = x + (t * n_heads + h) * head_dim;
            double *yh = y + (t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double th = pos[t] * pow(base, -2.0 * i / head_dim);
                int ia = mode == NSTF_ROPE_NEOX ? i : 2 * i;
                int ib = mode == NSTF_ROPE_NEOX ? i + half : 2 * i + 1;
                yh[ia] = xh[ia] * cos(th) - xh[ib] * sin(th);
                yh[ib] = xh[ia] * sin(th) + xh[ib] * cos(th);
            }
        }
}

static void test_rope(test_rng *r) {
    const int heads[] = {1, 3, 9}, hdims[] = {20, 64, 128, 320};
    const int32_t pos0s[] = {0, 5, 2000, 100000};
    const nstf_rope_mode modes[] = {NSTF_ROPE_NORM, NSTF_ROPE_NEOX};
    char what[200];
    for (int mi = 0; mi < 2; mi++)
        for (int hi = 0; hi < COUNT(heads); hi++)
            for (int di = 0; di < COUNT(hdims); di++)
                for (int ni = 0; ni < COUNT(k_ntoks); ni++)
                    for (int pi = 0; pi < COUNT(pos0s); pi++) {
                        int nh = heads[hi], hd = hdims[di];
                        int64_t n_tok = k_ntoks[ni], n = n_tok * nh * hd;
                        float base = (pi & 1) ? 100000.0f : 10000.0f;
                        int32_t *pos = malloc(n_tok * 4);
                        for (int64_t t = 0; t < n_tok; t++)
                            pos[t] = pi == 3 ? (int32_t)(rng_next(r) % 100000) : pos0s[pi] + (int32_t)t;
                        float *x = malloc(n * 4), *y = guarded_alloc(n * 4);
                        double *want = malloc(n * 8);
                        fill_normal(r, x, n, 1.0f);
                        rope64(x, want, pos, n_tok, nh, hd, base, modes[mi]);
                        for (int cfg = -1; cfg < N_CFG; cfg++) {
                            poison(y, n * 4);
                            memcpy(y, x, n * 4);
                            if (cfg < 0) nstf_ref_rope(y, pos, n_tok, nh, hd, base, modes[mi]);
                            else nstf_cpu_rope(&g_cpu[cfg], y, pos, n_tok, nh, hd, base, modes[mi]);
                            snprintf(what, sizeof what, "rope %s heads %d hd %d n_tok %lld pos %d cfg %d",
                                     mi ? "neox" : "norm", nh, hd, (long long)n_tok, pos[0], cfg);
                            check_f32(what, y, n, want);
                        }
                        free(pos); free(x); free(y); free(want);
                    }
}

/* ---- attention ------------------------------------------------------------ */

static void attention64(const float *q, const float *k, const float *v, double *out,
                        int64_t n_tok, int64_t pos0, int nh, int nkv, int hd, double scale) {
    double *s = malloc((pos0 + n_tok) * 8);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) {
            int kvh = h / (nh / nkv);
            int64_t n_keys = pos0 + t + 1;
            double m = -INFINITY, den = 0;
            for (int64_t j = 0; j < n_keys; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[(t * nh + h) * hd + i] * k[(j * nkv + kvh) * hd + i];
                s[j] = d * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int64_t j = 0; j < n_keys; j++) den += (s[j] = exp(s[j] - m));
            double *o = out + (t * nh + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int64_t j = 0; j < n_keys; j++)
                for (int i = 0; i < hd; i++) o[i] += s[j] / den * v[(j * nkv + kvh) * hd + i];
        }
    free(s);
}

static void test_attention(test_rng *r) {
    /* n_tok, pos0, n_heads, n_kv_heads, head_dim: GQA ratios 1, 3, 4, 8;
     * decode rows with long contexts take the split-KV path at 2-4 threads;
     * head_dim 20 and 320 cover SIMD tails and the >256-dim output chunks,
     * 72 the eight-key scores without the 64-dim register accumulators */
    static const struct { int64_t n_tok, pos0; int nh, nkv, hd; } cases[] = {
        {1, 0, 4, 4, 64},      {1, 2047, 9, 3, 64},   {1, 1500, 8, 1, 128},
        {1, 2047, 2, 1, 64},   {1, 777, 3, 3, 128},   {3, 7, 8, 2, 64},
        {3, 1200, 4, 1, 128},  {17, 100, 9, 3, 128},  {17, 33, 6, 2, 20},
        {64, 0, 4, 4, 64},     {64, 1984, 8, 2, 128}, {2, 600, 2, 1, 320},
        {64, 300, 32, 4, 64},  {5, 90, 4, 2, 72},
        /* ratio 16: more query heads than one pass over K/V takes (8) */
        {3, 50, 16, 1, 64},    {1, 1100, 16, 1, 64},
    };
    char what[200];
    for (int ci = 0; ci < COUNT(cases); ci++) {
        int64_t n_tok = cases[ci].n_tok, pos0 = cases[ci].pos0, n_ctx = pos0 + n_tok;
        int nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
        int64_t nq = n_tok * nh * hd, nk = n_ctx * nkv * hd;
        float scale = 1.0f / sqrtf((float)hd);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
        float *out = guarded_alloc(nq * 4);
        double *want = malloc(nq * 8);
        fill_normal(r, q, nq, 2.0f); /* peaky enough that the max matters */
        fill_normal(r, k, nk, 1.0f);
        fill_normal(r, v, nk, 1.0f);
        attention64(q, k, v, want, n_tok, pos0, nh, nkv, hd, scale);
        for (int cfg = -1; cfg < N_CFG; cfg++) {
            poison(out, nq * 4);
            if (cfg < 0) nstf_ref_attention(q, k, v, out, n_tok, pos0, nh, nkv, hd, scale);
            else nstf_cpu_attention(&g_cpu[cfg], q, k, v, out, n_tok, pos0, nh, nkv, hd, scale);
            snprintf(what, sizeof what, "attention n_tok %lld pos0 %lld heads %d/%d hd %d cfg %d",
                     (long long)n_tok, (long long)pos0, nh, nkv, hd, cfg);
            check_f32(what, out, nq, want);
        }
        free(q); free(k); free(v); free(out); free(want);
    }
}

/* The paged cache: the same keys scattered over a pool of blocks in a
 * shuffled order (a sequence's blocks are not adjacent, and the pool holds
 * others' blocks between them, filled with NaN so a wrong row shows). The
 * result must be bitwise that of the contiguous fast path for the same
 * pool size (same sums, same order) and within the fp32 tolerance of the
 * fp64 reference; block sizes 1, 5 (not a power of two), 16, 64 and 80
 * (more than the 64-key chunk). */
static void test_attention_paged(test_rng *r) {
    static const struct { int64_t n_tok, pos0; int nh, nkv, hd, bs; } cases[] = {
        {1, 0, 4, 4, 64, 16},   {1, 1500, 9, 3, 64, 16}, {1, 777, 8, 2, 128, 5},
        {17, 100, 9, 3, 64, 1}, {64, 300, 6, 2, 64, 64}, {3, 1200, 4, 1, 128, 80},
        {1, 2047, 2, 1, 64, 16}, {5, 61, 16, 1, 64, 64},
    };
    char what[200];
    for (int ci = 0; ci < COUNT(cases); ci++) {
        const int64_t n_tok = cases[ci].n_tok, pos0 = cases[ci].pos0, n_keys = pos0 + n_tok;
        const int nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd, bs = cases[ci].bs;
        const int64_t kvd = (int64_t)nkv * hd, nq = n_tok * nh * hd, n_blk = (n_keys + bs - 1) / bs;
        const int64_t pool = 2 * n_blk + 3; /* blocks in the pool: others' between ours */
        const float scale = 1.0f / sqrtf((float)hd);
        float *q = malloc(nq * 4), *k = malloc(n_keys * kvd * 4), *v = malloc(n_keys * kvd * 4);
        float *pk = malloc(pool * bs * kvd * 4), *pv = malloc(pool * bs * kvd * 4);
        float *out = guarded_alloc(nq * 4), *flat = malloc(nq * 4);
        double *want = malloc(nq * 8);
        int32_t *tbl = malloc(n_blk * 4), *perm = malloc(pool * 4);
        fill_normal(r, q, nq, 2.0f);
        fill_normal(r, k, n_keys * kvd, 1.0f);
        fill_normal(r, v, n_keys * kvd, 1.0f);
        poison(pk, pool * bs * kvd * 4);
        poison(pv, pool * bs * kvd * 4);
        for (int64_t i = 0; i < pool; i++) perm[i] = (int32_t)i;
        for (int64_t i = pool - 1; i > 0; i--) { /* Fisher-Yates */
            int64_t j = (int64_t)(rng_next(r) % (uint64_t)(i + 1));
            int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        for (int64_t b = 0; b < n_blk; b++) tbl[b] = perm[b];
        for (int64_t j = 0; j < n_keys; j++) {
            const int64_t row = (int64_t)tbl[j / bs] * bs + j % bs;
            memcpy(pk + row * kvd, k + j * kvd, kvd * 4);
            memcpy(pv + row * kvd, v + j * kvd, kvd * 4);
        }
        attention64(q, k, v, want, n_tok, pos0, nh, nkv, hd, scale);
        for (int cfg = 0; cfg < N_CFG; cfg++) {
            nstf_cpu_attention(&g_cpu[cfg], q, k, v, flat, n_tok, pos0, nh, nkv, hd, scale);
            poison(out, nq * 4);
            nstf_cpu_attention_paged(&g_cpu[cfg], q, pk, pv, tbl, bs, out, n_tok, pos0, nh, nkv, hd, scale, 0);
            snprintf(what, sizeof what, "paged attention n_tok %lld pos0 %lld heads %d/%d hd %d block %d cfg %d",
                     (long long)n_tok, (long long)pos0, nh, nkv, hd, bs, cfg);
            check_f32(what, out, nq, want);
            CHECK(memcmp(out, flat, nq * 4) == 0, "%s: not bitwise the contiguous result", what);
            /* a sliding window of 9 positions: bitwise the contiguous windowed result */
            nstf_cpu_attention_sw(&g_cpu[cfg], q, k, v, flat, n_tok, pos0, nh, nkv, hd, scale, 9);
            poison(out, nq * 4);
            nstf_cpu_attention_paged(&g_cpu[cfg], q, pk, pv, tbl, bs, out, n_tok, pos0, nh, nkv, hd, scale, 9);
            CHECK(memcmp(out, flat, nq * 4) == 0, "%s window 9: not bitwise the contiguous result", what);
        }
        free(q); free(k); free(v); free(pk); free(pv); free(out); free(flat); free(want); free(tbl); free(perm);
    }
}

/* ---- argmax --------------------------------------------------------------- */

static void test_argmax(test_rng *r) {
    const int64_t ns[] = {1, 7, 33, 576, 1000, 49152};
    for (int ni = 0; ni < COUNT(ns); ni++)
        for (int ri = 0; ri < COUNT(k_ntoks); ri++)
            for (int kind = 0; kind < 3; kind++) {
                int64_t n = ns[ni], n_rows = k_ntoks[ri];
                float *x = malloc(n_rows * n * 4);
                for (int64_t i = 0; i < n_rows * n; i++) {
                    float u = rng_uniform(r);
                    /* 0: distinct values; 1: four levels, many ties; 2: all
                     * equal but a few -inf (first index wins) */
                    x[i] = kind == 0 ? u : kind == 1 ? floorf(u * 2.0f) : (u > 0.9f ? -INFINITY : -1.0f);
                }
                int32_t want[64];
                for (int64_t row = 0; row < n_rows; row++) {
                    const float *xr = x + row * n;
                    double best = -INFINITY;
                    int32_t bi = -1;
                    for (int64_t j = 0; j < n; j++)
                        if (bi < 0 || xr[j] > best) { best = xr[j]; bi = (int32_t)j; }
                    want[row] = bi;
                }
                int32_t *out = guarded_alloc(n_rows * 4);
                for (int cfg = -1; cfg < N_CFG; cfg++) {
                    poison(out, n_rows * 4);
                    if (cfg < 0) nstf_ref_argmax(x, out, n_rows, n);
                    else nstf_cpu_argmax(&g_cpu[cfg], x, out, n_rows, n);
                    CHECK(memcmp(out, want, n_rows * 4) == 0 && guard_ok(out, n_rows * 4),
                          "argmax n %lld rows %lld kind %d cfg %d: got %d want %d", (long long)n,
                          (long long)n_rows, kind, cfg, out[0], want[0]);
                }
                free(out); free(x);
            }
}

/* ---- matmul reference ----------------------------------------------------- */

static void test_ref_matmul(test_rng *r) {
    const nstf_type types[] = {NSTF_TYPE_F32, NSTF_TYPE_F16, NSTF_TYPE_BF16,
                               NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1};
    /* 288 and 576 cross the reference's 256-element dequantization chunk */
    const int64_t fin[] = {1, 33, 257, 576}, qin[] = {32, 96, 288, 576};
    const int64_t outs[] = {1, 7, 33}, toks[] = {1, 3, 17};
    char what[160];
    for (int ti = 0; ti < COUNT(types); ti++) {
        bool quant = nstf_type_block_elems(types[ti]) > 1;
        for (int ii = 0; ii < 4; ii++)
            for (int oi = 0; oi < COUNT(outs); oi++)
                for (int ki = 0; ki < COUNT(toks); ki++) {
                    int64_t n_in = quant ? qin[ii] : fin[ii], n_out = outs[oi], n_tok = toks[ki];
                    uint64_t rb;
                    nstf_type_row_bytes(types[ti], n_in, &rb);
                    unsigned char *w = malloc(rb * n_out);
                    float *wf = malloc(n_out * n_in * 4), *x = malloc(n_tok * n_in * 4);
                    float *y = guarded_alloc(n_tok * n_out * 4);
                    double *want = malloc(n_tok * n_out * 8);
                    fill_normal(r, wf, n_out * n_in, 1.0f);
                    fill_normal(r, x, n_tok * n_in, 1.0f);
                    for (int64_t o = 0; o < n_out; o++) {
                        nstf_quantize_row(types[ti], wf + o * n_in, w + o * rb, n_in);
                        /* the weights are what the file holds: compare against them */
                        nstf_dequantize_row(types[ti], w + o * rb, wf + o * n_in, n_in);
                    }
                    for (int64_t t = 0; t < n_tok; t++)
                        for (int64_t o = 0; o < n_out; o++) {
                            double acc = 0;
                            for (int64_t i = 0; i < n_in; i++)
                                acc += (double)wf[o * n_in + i] * x[t * n_in + i];
                            want[t * n_out + o] = acc;
                        }
                    nstf_ref_matmul(types[ti], w, x, y, n_tok, n_in, n_out);
                    snprintf(what, sizeof what, "ref matmul %s n_in %lld n_out %lld n_tok %lld",
                             nstf_type_name(types[ti]), (long long)n_in, (long long)n_out, (long long)n_tok);
                    check_f32(what, y, n_tok * n_out, want);
                    free(w); free(wf); free(x); free(y); free(want);
                }
    }
}

int main(void) {
    nstf_pool *pools[N_CFG] = {0};
    for (int i = 1; i < N_CFG; i++) {
        if (nstf_pool_create(i, &pools[i]) != NSTF_OK) {
            fprintf(stderr, "test_ops_cpu: cannot create a pool of %d threads\n", i);
            return 1;
        }
        g_cpu[i].pool = pools[i];
    }
    test_rng r = {0x9e3779b97f4a7c15ull};
    test_get_rows(&r);
    test_rowwise(&r);
    test_rope(&r);
    test_attention(&r);
    test_attention_paged(&r);
    test_argmax(&r);
    test_ref_matmul(&r);
    for (int i = 1; i < N_CFG; i++) nstf_pool_free(pools[i]);
    for (int i = 0; i < 16 && g_worst[i].op[0]; i++)
        printf("  worst NMSE %-10s %.3g\n", g_worst[i].op, g_worst[i].worst);
    return test_finish("test_ops_cpu");
}
