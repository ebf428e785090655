/* test_backend_ops.c — every row of the op table on every backend of this
 * build, through the backend table (be->vt->ops), against a double-
 * precision reference written here (the op-table analogue of ggml's
 * test-backend-ops).
 *
 * One case generator per row (case_<op>, tied to the table by the
 * X-macro, so a new row without a case does not compile). Each case draws
 * inputs, uploads them to backend memory behind a guard region, poisons
 * the outputs (NaN bytes), runs the op inside a begin/end bracket, checks
 * the guards and compares with the reference.
 *
 * Backends and tolerances:
 *  - CPU, precise (fp32 activations): NMSE <= 1e-7 against the fp64
 *    reference for every op; adds and argmax exact, gathers within 1e-12
 *    (a dequantization may round once more on one side).
 *  - CPU, default (16-bit activations in matmuls of quantized weights: an
 *    8-bit block plus its 8-bit rounding residual): as precise, the fp32
 *    bound included.
 *  - CPU, 8-bit activations (one int8 block): as precise, except the
 *    matmuls of quantized weights: NMSE <= 1e-4 (test_matmul_cpu.c derives
 *    that bound).
 *  - GPU (test_backend_ops_gpu: this file built with TEST_BACKEND_GPU in a
 *    GPU build; skipped, exit 77, without a device), at
 *    every execution level: inputs the op reads as bf16 are bf16 numbers,
 *    the reference runs on them in double, and an output stored as bf16
 *    may differ from it by at most 2x the error of the naive same-precision
 *    result, plus 1e-9: the reference rounded to bf16 once, and for a
 *    matmul the product of bf16 operands (x and W rounded to bf16, as the
 *    GEMM takes them) rounded once; fp32 outputs NMSE <= 1e-7.
 * Shapes are not multiples of the kernels' tiles; matmuls run for 3 tokens
 * (GEMV) and 20 (GEMM after dequantization), alone and as a group. RoPE
 * runs with and without frequency factors, attention with and without
 * sliding windows; BIAS and HEAD_NORM on rows with a gap after them on a
 * GPU (the q / k / v of one row of the group) and dense on the CPU.
 *
 * Gradient mode: the training rows (backward ops, the fused cross-entropy,
 * AdamW, the gradient norm) have their cases in backend_ops_grad.h, which
 * states their tolerances; the GPU variant compares its gradients with the
 * same references the CPU is held to. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/switches.h"
#include "ops/backward.h"
#include "ops/optim.h"
#include "test_quant.h"
#include "test_util.h"

#define GUARD 256
#define FILL 0xa5

/* ---- backend buffers ------------------------------------------------------------ */

typedef struct dbuf {
    void *d;      /* backend memory: bytes + GUARD */
    size_t bytes;
} dbuf;

static nstf_backend *g_be;
static const char *g_name;
static bool g_precise; /* CPU activations of 16 bits or more: matmuls held to the fp32 bound */

static dbuf up(const void *host, size_t bytes) {
    dbuf b = {NULL, bytes};
    unsigned char *tmp = malloc(bytes + GUARD);
    if (!tmp || g_be->vt->alloc(g_be, bytes + GUARD, &b.d) != NSTF_OK) {
        CHECK(0, "%s: alloc %zu: %s", g_name, bytes, nstf_last_error());
        free(tmp);
        b.d = NULL;
        return b;
    }
    if (host) memcpy(tmp, host, bytes);
    else memset(tmp, 0xff, bytes); /* poison: NaN patterns */
    memset(tmp + bytes, FILL, GUARD);
    CHECK(g_be->vt->upload(g_be, b.d, tmp, bytes + GUARD) == NSTF_OK, "%s", nstf_last_error());
    free(tmp);
    return b;
}

/* Download the payload into host (may be NULL) and check the guard. */
static void down(dbuf b, void *host, const char *what) {
    if (!b.d) return;
    unsigned char *tmp = malloc(b.bytes + GUARD);
    CHECK(tmp && g_be->vt->download(g_be, tmp, b.d, b.bytes + GUARD) == NSTF_OK, "%s", nstf_last_error());
    int bad = 0;
    for (int i = 0; tmp && i < GUARD; i++) bad += tmp[b.bytes + i] != FILL;
    CHECK(bad == 0, "%s: %s: %d guard bytes overwritten", g_name, what, bad);
    if (tmp && host) memcpy(host, tmp, b.bytes);
    free(tmp);
}

static void drop(dbuf b) {
    if (b.d) g_be->vt->free(g_be, b.d);
}

/* ---- values ---------------------------------------------------------------------- */

static bool act_bf16(void) { return g_be->act_type == NSTF_TYPE_BF16; }
static float act_round(float x) { return act_bf16() ? nstf_bf16_to_f32(nstf_f32_to_bf16(x)) : x; }

/* Activations [n] as the backend stores them, and their float values. */
static void *act_make(test_rng *r, float *vals, int64_t n, float scale) {
    uint16_t *h16 = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        vals[i] = act_round(scale * rng_normal(r));
        h16[i] = nstf_f32_to_bf16(vals[i]);
    }
    if (act_bf16()) return h16;
    free(h16);
    float *h = malloc((size_t)n * 4);
    memcpy(h, vals, (size_t)n * 4);
    return h;
}
static size_t act_bytes(int64_t n) { return (size_t)n * (act_bf16() ? 2 : 4); }

static void act_read(const void *h, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = act_bf16() ? nstf_bf16_to_f32(((const uint16_t *)h)[i]) : ((const float *)h)[i];
}

/* Compare a backend output (values as float) with the fp64 reference.
 * naive (may be NULL): a naive same-precision result; when given, the
 * tolerance is twice its NMSE (+ 1e-9), else f32_tol. */
static void judge_naive(const char *what, const float *got, const double *ref, const float *naive, int64_t n,
                        double f32_tol) {
    int64_t nonfin = count_nonfinite(got, n);
    double e = nmse(got, ref, n), tol = naive ? 2 * nmse(naive, ref, n) + 1e-9 : f32_tol;
    CHECK(nonfin == 0 && e <= tol, "%s: %s: NMSE %.3g (tolerance %.3g), %lld non-finite", g_name, what, e, tol,
          (long long)nonfin);
}

/* stored_bf16: the naive result is the reference rounded to bf16 once. */
static void judge(const char *what, const float *got, const double *ref, int64_t n, bool stored_bf16, double f32_tol) {
    float *naive = NULL;
    if (stored_bf16) {
        naive = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) naive[i] = nstf_bf16_to_f32(nstf_f32_to_bf16((float)ref[i]));
    }
    judge_naive(what, got, ref, naive, n, f32_tol);
    free(naive);
}

/* A batch of n tokens at pos0.. in a begin/end bracket (graphs are off:
 * the ops must run). */
static nstf_batch_io g_io;
static int32_t g_tok[64], g_pos[64];
static bool open_batch(int n, int pos0) {
    for (int i = 0; i < n; i++) g_tok[i] = 0, g_pos[i] = pos0 + i;
    nstf_batch b = {.tokens = g_tok, .pos = g_pos, .n = n};
    bool replayed = false;
    nstf_status st = g_be->vt->begin(g_be, &b, &g_io, &replayed);
    CHECK(st == NSTF_OK && !replayed, "%s: begin: %s", g_name, nstf_last_error());
    return st == NSTF_OK;
}
static void close_batch(int n, nstf_status st) {
    nstf_batch b = {.tokens = g_tok, .pos = g_pos, .n = n};
    nstf_fwd_out o = {0};
    bool retry = false;
    CHECK(st == NSTF_OK, "%s: op: %s", g_name, nstf_last_error());
    CHECK(g_be->vt->end(g_be, &b, st, &o, &retry) == st && !retry, "%s: end: %s", g_name, nstf_last_error());
}

/* Ends the batch of an op the backend refused (the refusal checked by the
 * caller). */
static void end_refused(int n, nstf_status st) {
    nstf_batch b = {.tokens = g_tok, .pos = g_pos, .n = n};
    nstf_fwd_out o = {0};
    bool retry = false;
    (void)g_be->vt->end(g_be, &b, st, &o, &retry);
}

static nstf_status run_op(const nstf_op_args *a, int n, int pos0) {
    if (!open_batch(n, pos0)) return NSTF_ERR_INTERNAL;
    nstf_status st = nstf_backend_op(g_be, a);
    close_batch(n, st);
    return st;
}

/* ---- the cases, one per row of the op table --------------------------------------------- */

typedef void (*case_fn)(test_rng *r);
#define NSTF_X(U, l, ref, cpu, gpu, d) static void case_##l(test_rng *r);
NSTF_OPS(NSTF_X)
#undef NSTF_X
static const case_fn k_cases[NSTF_OP_N] = {
#define NSTF_X(U, l, ref, cpu, gpu, d) [NSTF_OP_##U] = case_##l,
    NSTF_OPS(NSTF_X)
#undef NSTF_X
};

static const nstf_type k_wtypes[] = {NSTF_TYPE_F32,  NSTF_TYPE_F16,  NSTF_TYPE_BF16,   NSTF_TYPE_Q8_0,
                                     NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1, NSTF_TYPE_Q5_0,   NSTF_TYPE_Q5_1,
                                     NSTF_TYPE_IQ4_NL, NSTF_TYPE_Q2_K, NSTF_TYPE_Q3_K, NSTF_TYPE_Q4_K,
                                     NSTF_TYPE_Q5_K, NSTF_TYPE_Q6_K, NSTF_TYPE_IQ4_XS};
#define N_WTYPES (int)(sizeof k_wtypes / sizeof k_wtypes[0])

/* Row length of the matmul and gather cases: 256-element types need whole
 * super-blocks; Q4_0 takes 256 too, where the GPU keeps its rows in its
 * own layout (nstf_gpu_weights_relayout), so that layout is what runs. */
static int64_t row_len(nstf_type t, int64_t n) {
    return nstf_type_block_elems(t) == 256 || t == NSTF_TYPE_Q4_0 ? 256 : n;
}

/* An uploaded weight matrix into the backend's own layout, as the model
 * loader leaves it (backend.h: relayout). */
static void relayout(const nstf_matrix *m) {
    if (g_be->vt->relayout) CHECK(g_be->vt->relayout(g_be, m) == NSTF_OK, "%s: relayout: %s", g_name, nstf_last_error());
}

/* A matrix [n_out, n_in] of type t and its dequantized values (types
 * without a quantizer get random codes, tests/test_quant.h). */
static void *matrix_make(test_rng *r, nstf_type t, int64_t n_in, int64_t n_out, float *deq, size_t *bytes) {
    uint64_t rb = 0;
    (void)nstf_type_row_bytes(t, n_in, &rb);
    *bytes = (size_t)rb * (size_t)n_out;
    unsigned char *w = malloc(*bytes);
    float *row = malloc((size_t)n_in * 4);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++) row[i] = 0.1f * rng_normal(r);
        test_quantize_row(t, row, w + o * rb, n_in, r);
        nstf_dequantize_row(t, w + o * rb, deq + o * n_in, n_in);
    }
    free(row);
    return w;
}

static void case_get_rows(test_rng *r) {
    const int64_t rows = 37, n = 11;
    for (int ti = 0; ti < N_WTYPES; ti++) {
        nstf_type t = k_wtypes[ti];
        const int64_t dim = row_len(t, 96);
        size_t wb;
        float *deq = malloc((size_t)(rows * dim) * 4), *got = malloc((size_t)(n * dim) * 4);
        double *ref = malloc((size_t)(n * dim) * 8);
        void *w = matrix_make(r, t, dim, rows, deq, &wb);
        int32_t ids[11];
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(r) % rows);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < dim; j++) ref[i * dim + j] = deq[ids[i] * dim + j];
        dbuf dw = up(w, wb), di = up(ids, sizeof ids), dout = up(NULL, (size_t)(n * dim) * 4);
        nstf_matrix m = {dw.d, t, dim, rows, NULL};
        relayout(&m);
        nstf_op_args a = {.op = NSTF_OP_GET_ROWS, .label = "get_rows"};
        a.get_rows.table = &m;
        a.get_rows.ids = di.d;
        a.get_rows.out = (nstf_view){dout.d, NSTF_TYPE_F32, dim};
        a.get_rows.n = n;
        run_op(&a, 1, 0);
        down(dout, got, "get_rows out");
        char what[64];
        snprintf(what, sizeof what, "get_rows %s", nstf_type_name(t));
        judge(what, got, ref, n * dim, false, 1e-12);
        drop(dw), drop(di), drop(dout);
        free(w), free(deq), free(got), free(ref);
    }
}

static void case_rmsnorm(test_rng *r) {
    const int64_t n = 5, dim = 200;
    for (int with_res = 0; with_res < 2; with_res++) {
        float *x = malloc((size_t)(n * dim) * 4), *res = malloc((size_t)(n * dim) * 4), *w = malloc((size_t)dim * 4);
        float *gx = malloc((size_t)(n * dim) * 4), *gy = malloc((size_t)(n * dim) * 4);
        double *rx = malloc((size_t)(n * dim) * 8), *ry = malloc((size_t)(n * dim) * 8);
        for (int64_t i = 0; i < n * dim; i++) x[i] = 3 * rng_normal(r), res[i] = rng_normal(r);
        for (int64_t i = 0; i < dim; i++) w[i] = 1 + 0.5f * rng_normal(r);
        const float eps = 1e-5f;
        for (int64_t t = 0; t < n; t++) {
            double ss = 0;
            for (int64_t i = 0; i < dim; i++) {
                rx[t * dim + i] = (double)(float)(x[t * dim + i] + (with_res ? res[t * dim + i] : 0.0f));
                ss += rx[t * dim + i] * rx[t * dim + i];
            }
            double inv = 1.0 / sqrt(ss / dim + eps);
            for (int64_t i = 0; i < dim; i++) ry[t * dim + i] = rx[t * dim + i] * inv * w[i];
        }
        dbuf dx = up(x, (size_t)(n * dim) * 4), dr = up(res, (size_t)(n * dim) * 4), dw = up(w, (size_t)dim * 4),
             dy = up(NULL, act_bytes(n * dim));
        nstf_op_args a = {.op = NSTF_OP_RMSNORM, .label = "rmsnorm"};
        a.rmsnorm.x = dx.d;
        a.rmsnorm.res = with_res ? dr.d : NULL;
        a.rmsnorm.w = dw.d;
        a.rmsnorm.y = (nstf_view){dy.d, g_be->act_type, dim};
        a.rmsnorm.n = n;
        a.rmsnorm.dim = dim;
        a.rmsnorm.eps = eps;
        run_op(&a, 1, 0);
        void *hy = malloc(act_bytes(n * dim));
        down(dx, gx, "rmsnorm x"), down(dy, hy, "rmsnorm y");
        act_read(hy, gy, n * dim);
        judge(with_res ? "rmsnorm x += res" : "rmsnorm x", gx, rx, n * dim, false, 0.0);
        judge(with_res ? "rmsnorm y (with res)" : "rmsnorm y", gy, ry, n * dim, act_bf16(), 1e-7);
        drop(dx), drop(dr), drop(dw), drop(dy);
        free(x), free(res), free(w), free(gx), free(gy), free(rx), free(ry), free(hy);
    }
}

static void case_add(test_rng *r) {
    const int64_t n = 1037;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    double *ref = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal(r), y[i] = rng_normal(r), ref[i] = (double)(x[i] + y[i]);
    dbuf dx = up(x, (size_t)n * 4), dy = up(y, (size_t)n * 4);
    nstf_op_args a = {.op = NSTF_OP_ADD, .label = "add"};
    a.add.x = dx.d;
    a.add.y = dy.d;
    a.add.n = n;
    run_op(&a, 1, 0);
    down(dx, g, "add x");
    judge("add", g, ref, n, false, 0.0);
    drop(dx), drop(dy);
    free(x), free(y), free(g), free(ref);
}

/* A group of 1 or 3 matrices of one type over x [n, n_in], outputs where
 * the backend places them. */
static void matmul_group(test_rng *r, nstf_type t, int n_w, int64_t n) {
    const int64_t n_in = row_len(t, 128), n_out[3] = {72, 40, 40};
    int64_t total = 0;
    for (int i = 0; i < n_w; i++) total += n_out[i];
    float *xv = malloc((size_t)(n * n_in) * 4), *deq = malloc((size_t)(total * n_in) * 4);
    void *hx = act_make(r, xv, n * n_in, 1.0f);
    size_t wb[3], all = 0;
    void *w[3];
    for (int i = 0; i < n_w; i++) {
        int64_t off = 0;
        for (int j = 0; j < i; j++) off += n_out[j];
        w[i] = matrix_make(r, t, n_in, n_out[i], deq + off * n_in, &wb[i]);
        all += wb[i];
    }
    unsigned char *wall = malloc(all);
    for (int i = 0, o = 0; i < n_w; o += (int)wb[i], i++) memcpy(wall + o, w[i], wb[i]);
    dbuf dw = up(wall, all), dx = up(hx, act_bytes(n * n_in)), dy = up(NULL, act_bytes(64 * total));
    nstf_matrix m[3];
    const nstf_matrix *mp[3];
    for (int i = 0, o = 0; i < n_w; o += (int)wb[i], i++) {
        m[i] = (nstf_matrix){(char *)dw.d + o, t, n_in, n_out[i], NULL};
        relayout(&m[i]);
        mp[i] = &m[i];
    }
    nstf_op_args a = {.op = NSTF_OP_MATMUL, .label = "matmul"};
    a.matmul.n_w = n_w;
    for (int i = 0; i < n_w; i++) a.matmul.w[i] = mp[i];
    a.matmul.n = n;
    a.matmul.x = (nstf_view){dx.d, g_be->act_type, n_in};
    g_be->vt->place(g_be, mp, n_w, n, dy.d, a.matmul.out);
    run_op(&a, (int)n, 0);
    void *hy = malloc(act_bytes(64 * total));
    down(dy, hy, "matmul out");
    for (int i = 0; i < n_w; i++) {
        int64_t off = 0;
        for (int j = 0; j < i; j++) off += n_out[j];
        float *got = malloc((size_t)(n * n_out[i]) * 4), *naive = malloc((size_t)(n * n_out[i]) * 4);
        double *ref = malloc((size_t)(n * n_out[i]) * 8);
        const int64_t es = act_bf16() ? 2 : 4, base = ((char *)a.matmul.out[i].data - (char *)dy.d) / es;
        for (int64_t tk = 0; tk < n; tk++)
            for (int64_t o = 0; o < n_out[i]; o++) {
                float v[1];
                act_read((char *)hy + (base + tk * a.matmul.out[i].stride + o) * es, v, 1);
                got[tk * n_out[i] + o] = v[0];
                double s = 0, sn = 0;
                for (int64_t k = 0; k < n_in; k++) {
                    const float wk = deq[(off + o) * n_in + k];
                    s += (double)wk * xv[tk * n_in + k];
                    sn += (double)nstf_bf16_to_f32(nstf_f32_to_bf16(wk)) * xv[tk * n_in + k];
                }
                ref[tk * n_out[i] + o] = s;
                naive[tk * n_out[i] + o] = nstf_bf16_to_f32(nstf_f32_to_bf16((float)sn));
            }
        char what[96];
        snprintf(what, sizeof what, "matmul %s, group of %d (matrix %d), %lld tokens", nstf_type_name(t), n_w, i,
                 (long long)n);
        const bool int8 = !g_precise && g_be->int8_act && nstf_type_block_elems(t) > 1;
        /* bf16: the naive matmul has bf16 operands (x and W), accumulates
         * exactly and rounds its output once */
        judge_naive(what, got, ref, act_bf16() ? naive : NULL, n * n_out[i], int8 ? 1e-4 : 1e-7);
        free(got), free(naive), free(ref);
    }
    drop(dw), drop(dx), drop(dy);
    for (int i = 0; i < n_w; i++) free(w[i]);
    free(wall), free(xv), free(deq), free(hx), free(hy);
}

/* The residual-input epilogue (NSTF_MM_ADD: out = x W^T + res, fp32),
 * where the backend says it fuses it (training's o_proj and down): against
 * the fp64 product plus res (fp32 NMSE <= 1e-7), res unchanged. A backend
 * that declines is left to the caller's matmul + add (nothing to check). */
static void matmul_add_case(test_rng *r, int64_t n) {
    const int64_t n_in = 136, n_out = 72;
    float *xv = malloc((size_t)(n * n_in) * 4), *deq = malloc((size_t)(n_out * n_in) * 4);
    float *res = malloc((size_t)(n * n_out) * 4), *got = malloc((size_t)(n * n_out) * 4);
    float *res2 = malloc((size_t)(n * n_out) * 4);
    double *ref = malloc((size_t)(n * n_out) * 8);
    void *hx = act_make(r, xv, n * n_in, 1.0f);
    size_t wb;
    void *w = matrix_make(r, NSTF_TYPE_BF16, n_in, n_out, deq, &wb);
    for (int64_t i = 0; i < n * n_out; i++) res[i] = rng_normal(r);
    dbuf dw = up(w, wb), dx = up(hx, act_bytes(n * n_in)), dres = up(res, (size_t)(n * n_out) * 4),
         dy = up(NULL, (size_t)(n * n_out) * 4);
    nstf_matrix m = {dw.d, NSTF_TYPE_BF16, n_in, n_out, NULL};
    nstf_op_args a = {.op = NSTF_OP_MATMUL, .label = "matmul_add"};
    a.matmul.n_w = 1;
    a.matmul.w[0] = &m;
    a.matmul.n = n;
    a.matmul.x = (nstf_view){dx.d, g_be->act_type, n_in};
    a.matmul.out[0] = (nstf_view){dy.d, NSTF_TYPE_F32, n_out};
    a.matmul.epi = NSTF_MM_ADD;
    a.matmul.res = dres.d;
    if (g_be->vt->can_fuse(g_be, &a)) {
        run_op(&a, (int)n, 0);
        down(dy, got, "matmul_add out");
        down(dres, res2, "matmul_add res");
        for (int64_t tk = 0; tk < n; tk++)
            for (int64_t o = 0; o < n_out; o++) {
                double s = res[tk * n_out + o];
                for (int64_t k = 0; k < n_in; k++) s += (double)deq[o * n_in + k] * xv[tk * n_in + k];
                ref[tk * n_out + o] = s;
            }
        char what[80];
        snprintf(what, sizeof what, "matmul with a residual input, %lld tokens", (long long)n);
        judge(what, got, ref, n * n_out, false, 1e-7);
        CHECK(memcmp(res, res2, (size_t)(n * n_out) * 4) == 0, "%s: %s: res changed", g_name, what);
    }
    drop(dw), drop(dx), drop(dres), drop(dy);
    free(xv), free(deq), free(res), free(res2), free(got), free(ref), free(hx), free(w);
}

static void case_matmul(test_rng *r) {
    for (int ti = 0; ti < N_WTYPES; ti++)
        for (int n_w = 1; n_w <= 3; n_w += 2) {
            matmul_group(r, k_wtypes[ti], n_w, 3);
            matmul_group(r, k_wtypes[ti], n_w, 20);
        }
    matmul_add_case(r, 3);
    matmul_add_case(r, 40);
}

/* RoPE, or its backward (the rotation by -theta), on q and k in place. */
static void rope_case(test_rng *r, bool bwd) {
    const int nh = 3, nkv = 1, hd = 64;
    const int64_t n = 7, qd = nh * hd, kvd = nkv * hd;
    /* frequency factors as Llama 3.1's (1 for short wavelengths, 8 for long
     * ones, smooth between), here with a few more shapes of values */
    float ff[32];
    for (int i = 0; i < hd / 2; i++) ff[i] = i < 8 ? 1.0f : i > 24 ? 8.0f : 1.0f + 7.0f * (float)(i - 8) / 16.0f + 0.01f * i;
    /* the backward takes no frequency factors (training refuses models that have them) */
    for (int variant = 0; variant < (bwd ? 2 : 4); variant++) {
        const int mode = variant % 2 ? NSTF_ROPE_NEOX : NSTF_ROPE_NORM;
        const bool with_ff = variant >= 2;
        float *qv = malloc((size_t)(n * qd) * 4), *kv = malloc((size_t)(n * kvd) * 4);
        void *hq = act_make(r, qv, n * qd, 1.0f), *hk = act_make(r, kv, n * kvd, 1.0f);
        dbuf dq = up(hq, act_bytes(n * qd)), dk = up(hk, act_bytes(n * kvd)), df = up(ff, sizeof ff);
        const int pos0 = 1000;
        if (!open_batch((int)n, pos0)) return;
        nstf_op_args a = {.op = bwd ? NSTF_OP_ROPE_BWD : NSTF_OP_ROPE, .label = bwd ? "rope_bwd" : "rope"};
        const nstf_view vq = {dq.d, g_be->act_type, qd}, vk = {dk.d, g_be->act_type, kvd};
        const nstf_rope_args ra = {g_io.pos, nh, nkv, hd, 10000.0f, (nstf_rope_mode)mode, with_ff ? df.d : NULL};
        if (bwd) a.rope_bwd.q = vq, a.rope_bwd.k = vk, a.rope_bwd.n = n, a.rope_bwd.r = ra;
        else a.rope.q = vq, a.rope.k = vk, a.rope.n = n, a.rope.r = ra;
        close_batch((int)n, nstf_backend_op(g_be, &a));
        for (int which = 0; which < 2; which++) {
            const int64_t rowlen = which ? kvd : qd, heads = which ? nkv : nh;
            const float *src = which ? kv : qv;
            void *h = malloc(act_bytes(n * rowlen));
            float *got = malloc((size_t)(n * rowlen) * 4);
            double *ref = malloc((size_t)(n * rowlen) * 8);
            down(which ? dk : dq, h, "rope out");
            act_read(h, got, n * rowlen);
            for (int64_t t = 0; t < n; t++)
                for (int64_t hh = 0; hh < heads; hh++)
                    for (int i = 0; i < hd / 2; i++) {
                        double th = (bwd ? -1.0 : 1.0) * (pos0 + t) * pow(10000.0, -2.0 * i / hd) /
                                    (with_ff ? ff[i] : 1.0),
                               c = cos(th),
                               s = sin(th);
                        int64_t i0 = mode ? i : 2 * i, i1 = mode ? i + hd / 2 : 2 * i + 1, b = t * rowlen + hh * hd;
                        ref[b + i0] = src[b + i0] * c - src[b + i1] * s;
                        ref[b + i1] = src[b + i0] * s + src[b + i1] * c;
                    }
            char what[64];
            snprintf(what, sizeof what, "%s %s %s%s", bwd ? "rope_bwd" : "rope", which ? "k" : "q",
                     mode ? "neox" : "norm", with_ff ? " with factors" : "");
            judge(what, got, ref, n * rowlen, act_bf16(), 1e-7);
            free(h), free(got), free(ref);
        }
        drop(dq), drop(dk), drop(df);
        free(qv), free(kv), free(hq), free(hk);
    }
}

/* The attention op over backend buffers, heads 6 / 2 of 64. */
static nstf_op_args attention_args(dbuf q, dbuf k, dbuf v, dbuf ck, dbuf cv, dbuf out, const int32_t *pos, int64_t n,
                                   int64_t n_ctx) {
    nstf_op_args a = {.op = NSTF_OP_ATTENTION, .label = "attention"};
    a.attention.q = (nstf_view){q.d, g_be->act_type, 6 * 64};
    a.attention.k = (nstf_view){k.d, g_be->act_type, 2 * 64};
    a.attention.v = (nstf_view){v.d, g_be->act_type, 2 * 64};
    a.attention.k_cache = ck.d;
    a.attention.v_cache = cv.d;
    a.attention.out = (nstf_view){out.d, g_be->act_type, 6 * 64};
    a.attention.pos = pos;
    a.attention.n = n;
    a.attention.n_ctx = n_ctx;
    a.attention.pos0 = -1;
    a.attention.n_heads = 6;
    a.attention.n_kv_heads = 2;
    a.attention.head_dim = 64;
    a.attention.scale = 0.125f;
    return a;
}

static void case_rope(test_rng *r) { rope_case(r, false); }

/* The fp64 reference of n tokens at pos0 attending causally (within the
 * last `window` positions when window > 0) to the rows of k, v [keys,
 * nkv * hd]: ref [n, nh * hd]. */
static void ref_attention(const float *q, const float *k, const float *v, double *ref, int64_t n, int64_t pos0,
                          int window, int nh, int nkv, int hd, double scale) {
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
    double *p = malloc((size_t)(pos0 + n) * 8);
    for (int64_t t = 0; p && t < n; t++)
        for (int h = 0; h < nh; h++) {
            const int g = h / (nh / nkv);
            const int64_t n_keys = pos0 + t + 1, j0 = window > 0 && n_keys > window ? n_keys - window : 0;
            double m = -1e300, s = 0;
            for (int64_t j = j0; j < n_keys; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[t * qd + h * hd + i] * k[j * kvd + g * hd + i];
                p[j] = d * scale;
                m = fmax(m, p[j]);
            }
            for (int64_t j = j0; j < n_keys; j++) s += p[j] = exp(p[j] - m);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int64_t j = j0; j < n_keys; j++) o += p[j] * v[j * kvd + g * hd + i];
                ref[t * qd + h * hd + i] = o / s;
            }
        }
    free(p);
}

/* n tokens at pos0 over a cache whose positions [0, pos0) hold earlier
 * tokens: causal GQA, the batch's k and v written into the cache; with a
 * sliding window (window > 0) token t sees the last `window` positions. */
static void attention_case(test_rng *r, int64_t n, int64_t pos0, int window) {
    const int nh = 6, nkv = 2, hd = 64, n_ctx = 320; /* the plan's context (whole blocks of 16) */
    const int64_t qd = nh * hd, kvd = nkv * hd, kv_es = g_be->kv_type == NSTF_TYPE_BF16 ? 2 : 4;
    float *qv = malloc((size_t)(n * qd) * 4), *kv = malloc((size_t)(n * kvd) * 4), *vv = malloc((size_t)(n * kvd) * 4);
    float *cache_k = malloc((size_t)(n_ctx * kvd) * 4), *cache_v = malloc((size_t)(n_ctx * kvd) * 4);
    void *hq = act_make(r, qv, n * qd, 1.0f), *hk = act_make(r, kv, n * kvd, 1.0f), *hv = act_make(r, vv, n * kvd, 1.0f);
    void *hck = act_make(r, cache_k, n_ctx * kvd, 1.0f), *hcv = act_make(r, cache_v, n_ctx * kvd, 1.0f);
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < kvd; i++)
            cache_k[(pos0 + t) * kvd + i] = kv[t * kvd + i], cache_v[(pos0 + t) * kvd + i] = vv[t * kvd + i];
    (void)kv_es; /* the caches are kv_type, which is act_type on both backends */
    dbuf dq = up(hq, act_bytes(n * qd)), dk = up(hk, act_bytes(n * kvd)), dv = up(hv, act_bytes(n * kvd));
    dbuf dck = up(hck, act_bytes(n_ctx * kvd)), dcv = up(hcv, act_bytes(n_ctx * kvd)), dout = up(NULL, act_bytes(n * qd));
    const float scale = 0.125f;
    if (!open_batch((int)n, (int)pos0)) return;
    nstf_op_args a = attention_args(dq, dk, dv, dck, dcv, dout, g_io.pos, n, n_ctx);
    a.attention.pos0 = pos0;
    a.attention.window = window;
    close_batch((int)n, nstf_backend_op(g_be, &a));
    void *ho = malloc(act_bytes(n * qd));
    float *got = malloc((size_t)(n * qd) * 4);
    double *ref = malloc((size_t)(n * qd) * 8);
    down(dout, ho, "attention out");
    down(dck, NULL, "k cache"), down(dcv, NULL, "v cache");
    act_read(ho, got, n * qd);
    ref_attention(qv, cache_k, cache_v, ref, n, pos0, window, nh, nkv, hd, scale);
    char what[64];
    snprintf(what, sizeof what, "attention %lld tokens at %lld, window %d", (long long)n, (long long)pos0, window);
    judge(what, got, ref, n * qd, act_bf16(), 1e-7);
    drop(dq), drop(dk), drop(dv), drop(dck), drop(dcv), drop(dout);
    free(qv), free(kv), free(vv), free(cache_k), free(cache_v), free(hq), free(hk), free(hv), free(hck), free(hcv);
    free(ho), free(got), free(ref);
}

/* Two sequences in one batch over a paged KV cache (a server's continuous
 * batch): a decode token of sequence 1 and a 3-token prefill chunk of
 * sequence 0, each attending to its own earlier positions through its
 * block table (blocks shuffled over a pool, the tables disjoint). The
 * batch's K and V must land in the rows the tables name (bitwise) and
 * the output match the fp64 reference. The plan of run_all is paged
 * (blocks of BS positions, a pool of POOL, 2 sequences of CTX): the GPU
 * backend sizes its table upload from it. */
static void attention_paged_case(test_rng *r) {
    enum { NH = 6, NKV = 2, HD = 64, BS = 16, CTX = 320, BPS = CTX / BS, POOL = 48, N = 4 };
    const int64_t qd = NH * HD, kvd = NKV * HD;
    const int32_t seq[N] = {1, 0, 0, 0}, pos[N] = {37, 150, 151, 152};
    int32_t tok[N] = {0}, tbl[2 * BPS], perm[POOL];
    for (int i = 0; i < POOL; i++) perm[i] = i;
    for (int i = POOL - 1; i > 0; i--) {
        int j = (int)(rng_next(r) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(tbl, perm, sizeof tbl);
    const nstf_batch b = {.tokens = tok, .pos = pos, .seq = seq, .n = N, .blocks = tbl};
    nstf_batch_io io;
    bool replayed = false;
    nstf_status st = g_be->vt->begin(g_be, &b, &io, &replayed);
    CHECK(st == NSTF_OK, "%s: begin: %s", g_name, nstf_last_error());
    float *qv = malloc(N * qd * 4), *kv = malloc(N * kvd * 4), *vv = malloc(N * kvd * 4);
    float *ck = malloc(POOL * BS * kvd * 4), *cv = malloc(POOL * BS * kvd * 4), *got = malloc(N * qd * 4);
    void *hq = act_make(r, qv, N * qd, 1.0f), *hk = act_make(r, kv, N * kvd, 1.0f), *hv = act_make(r, vv, N * kvd, 1.0f);
    void *hck = act_make(r, ck, POOL * BS * kvd, 1.0f), *hcv = act_make(r, cv, POOL * BS * kvd, 1.0f);
    dbuf dq = up(hq, act_bytes(N * qd)), dk = up(hk, act_bytes(N * kvd)), dv = up(hv, act_bytes(N * kvd));
    dbuf dck = up(hck, act_bytes(POOL * BS * kvd)), dcv = up(hcv, act_bytes(POOL * BS * kvd));
    dbuf dout = up(NULL, act_bytes(N * qd));
    nstf_op_args a = attention_args(dq, dk, dv, dck, dcv, dout, io.pos, N, CTX);
    a.attention.seq = io.seq;
    a.attention.blocks = io.blocks;
    a.attention.block_size = BS;
    st = nstf_backend_op(g_be, &a);
    nstf_fwd_out o = {0};
    bool retry = false;
    CHECK(st == NSTF_OK, "%s: paged attention: %s", g_name, nstf_last_error());
    CHECK(g_be->vt->end(g_be, &b, st, &o, &retry) == st && !retry, "%s: end: %s", g_name, nstf_last_error());
    float *after_k = malloc(POOL * BS * kvd * 4), *after_v = malloc(POOL * BS * kvd * 4);
    void *ho = malloc(act_bytes(N * qd)), *hak = malloc(act_bytes(POOL * BS * kvd)), *hav = malloc(act_bytes(POOL * BS * kvd));
    down(dout, ho, "paged attention out");
    down(dck, hak, "paged k cache"), down(dcv, hav, "paged v cache");
    act_read(ho, got, N * qd);
    act_read(hak, after_k, POOL * BS * kvd);
    act_read(hav, after_v, POOL * BS * kvd);
    /* the batch's rows where the tables say; then the cache as each sequence sees it */
    int64_t misplaced = 0;
    for (int t = 0; t < N; t++) {
        const int64_t row = (int64_t)tbl[seq[t] * BPS + pos[t] / BS] * BS + pos[t] % BS;
        misplaced += memcmp(after_k + row * kvd, kv + t * kvd, kvd * 4) != 0;
        misplaced += memcmp(after_v + row * kvd, vv + t * kvd, kvd * 4) != 0;
        memcpy(ck + row * kvd, kv + t * kvd, kvd * 4);
        memcpy(cv + row * kvd, vv + t * kvd, kvd * 4);
    }
    CHECK(misplaced == 0, "%s: paged attention: %lld K/V rows not where the block table says", g_name,
          (long long)misplaced);
    double *ref = malloc(N * qd * 8), p[CTX];
    for (int t = 0; t < N; t++)
        for (int h = 0; h < NH; h++) {
            const int g = h / (NH / NKV);
            double m = -1e300, sum = 0;
            for (int j = 0; j <= pos[t]; j++) {
                const float *kr = ck + ((int64_t)tbl[seq[t] * BPS + j / BS] * BS + j % BS) * kvd + g * HD;
                double d = 0;
                for (int i = 0; i < HD; i++) d += (double)qv[t * qd + h * HD + i] * kr[i];
                p[j] = d * 0.125;
                m = fmax(m, p[j]);
            }
            for (int j = 0; j <= pos[t]; j++) sum += p[j] = exp(p[j] - m);
            for (int i = 0; i < HD; i++) {
                double acc = 0;
                for (int j = 0; j <= pos[t]; j++)
                    acc += p[j] * cv[((int64_t)tbl[seq[t] * BPS + j / BS] * BS + j % BS) * kvd + g * HD + i];
                ref[t * qd + h * HD + i] = acc / sum;
            }
        }
    judge("paged attention, 2 sequences", got, ref, N * qd, act_bf16(), 1e-7);
    drop(dq), drop(dk), drop(dv), drop(dck), drop(dcv), drop(dout);
    free(qv), free(kv), free(vv), free(ck), free(cv), free(got), free(hq), free(hk), free(hv), free(hck), free(hcv);
    free(after_k), free(after_v), free(ho), free(hak), free(hav), free(ref);
}

/* The training forward (lse saved): S sequences of n rows each, one after
 * another, each attending to its own k, v rows at positions 0..n-1:
 * without a cache (the trainer's one op over its batch) or, for one
 * sequence, through a cache. Against nstf_ref_attention_lse per sequence:
 * out as the other attention cases (bf16: 2x the NMSE of the reference
 * rounded once), lse (fp32) NMSE <= 1e-7. */
static void attention_lse_case(test_rng *r, int64_t n, int64_t S, bool cached) {
    const int nh = 6, nkv = 2, hd = 64;
    const int64_t qd = nh * hd, kvd = nkv * hd, N = S * n, n_ctx = 320;
    const float scale = 0.125f;
    float *qv = malloc((size_t)(N * qd) * 4), *kv = malloc((size_t)(N * kvd) * 4), *vv = malloc((size_t)(N * kvd) * 4);
    void *hq = act_make(r, qv, N * qd, 1.0f), *hk = act_make(r, kv, N * kvd, 1.0f), *hv = act_make(r, vv, N * kvd, 1.0f);
    float *ro = malloc((size_t)(N * qd) * 4), *rl = malloc((size_t)(N * nh) * 4);
    for (int64_t b = 0; b < S; b++)
        nstf_ref_attention_lse(qv + b * n * qd, kv + b * n * kvd, vv + b * n * kvd, ro + b * n * qd, rl + b * n * nh, n,
                               0, nh, nkv, hd, scale);
    dbuf dq = up(hq, act_bytes(N * qd)), dk = up(hk, act_bytes(N * kvd)), dv = up(hv, act_bytes(N * kvd));
    dbuf dout = up(NULL, act_bytes(N * qd)), dl = up(NULL, (size_t)(N * nh) * 4), dck = {NULL, 0}, dcv = {NULL, 0};
    if (cached) dck = up(NULL, act_bytes(n_ctx * kvd)), dcv = up(NULL, act_bytes(n_ctx * kvd));
    nstf_op_args a;
    if (cached) { /* one sequence through a cache, at the batch's positions 0..n-1 */
        if (!open_batch((int)n, 0)) return;
        a = attention_args(dq, dk, dv, dck, dcv, dout, g_io.pos, n, n_ctx);
        a.attention.pos0 = 0;
        a.attention.lse = dl.d;
        close_batch((int)n, nstf_backend_op(g_be, &a));
    } else {
        a = attention_args(dq, dk, dv, dck, dcv, dout, NULL, n, n);
        a.attention.pos0 = 0;
        a.attention.n_seq = S;
        a.attention.lse = dl.d;
        run_op(&a, 1, 0);
    }
    void *ho = malloc(act_bytes(N * qd));
    float *got = malloc((size_t)(N * qd) * 4), *gl = malloc((size_t)(N * nh) * 4);
    down(dout, ho, "attention (lse) out"), down(dl, gl, "attention lse");
    act_read(ho, got, N * qd);
    double *rd = malloc((size_t)(N * qd) * 8), *rld = malloc((size_t)(N * nh) * 8);
    for (int64_t i = 0; i < N * qd; i++) rd[i] = ro[i];
    for (int64_t i = 0; i < N * nh; i++) rld[i] = rl[i];
    char what[96];
    snprintf(what, sizeof what, "attention with lse, %lld x %lld tokens%s", (long long)S, (long long)n,
             cached ? ", cached" : "");
    judge(what, got, rd, N * qd, act_bf16(), 1e-7);
    snprintf(what, sizeof what, "attention lse, %lld x %lld tokens%s", (long long)S, (long long)n,
             cached ? ", cached" : "");
    judge(what, gl, rld, N * nh, false, 1e-7);
    drop(dq), drop(dk), drop(dv), drop(dout), drop(dl), drop(dck), drop(dcv);
    free(qv), free(kv), free(vv), free(hq), free(hk), free(hv), free(ro), free(rl), free(ho), free(got), free(gl);
    free(rd), free(rld);
}

/* attention_case over a Q8_0 cache (ops.h): positions [0, pos0) hold
 * quantized random rows, read back as d * code by the reference (rounded
 * to bf16 on a bf16 backend, as its kernels widen them); the
 * batch's k and v attend as given and land in the cache quantized: each
 * block's scale within fp16 rounding of amax / 127, each value within 0.6
 * of a step (half a step, plus the scale's rounding over 127 codes). */
static void attention_q8_case(test_rng *r, int64_t n, int64_t pos0, int window) {
    const int nh = 6, nkv = 2, hd = 64, n_ctx = 320;
    const int64_t qd = nh * hd, kvd = nkv * hd;
    uint64_t rb = 0;
    CHECK(nstf_kv_row_bytes(true, 0, kvd, &rb) && rb % 16 == 0 && rb >= (uint64_t)(kvd + kvd / 16),
          "Q8_0 cache row of %lld values: %llu bytes", (long long)kvd, (unsigned long long)rb);
    float *qv = malloc((size_t)(n * qd) * 4), *kv = malloc((size_t)(n * kvd) * 4), *vv = malloc((size_t)(n * kvd) * 4);
    float *kf = malloc((size_t)(n_ctx * kvd) * 4), *vf = malloc((size_t)(n_ctx * kvd) * 4), *tmp = malloc((size_t)kvd * 4);
    uint8_t *ck = calloc((size_t)n_ctx, rb), *cv = calloc((size_t)n_ctx, rb);
    void *hq = act_make(r, qv, n * qd, 1.0f), *hk = act_make(r, kv, n * kvd, 1.0f), *hv = act_make(r, vv, n * kvd, 1.0f);
    for (int64_t p = 0; p < pos0; p++) { /* earlier tokens, quantized; the reference reads them back */
        for (int64_t i = 0; i < kvd; i++) tmp[i] = (float)rng_normal(r) * (i % 32 == 5 ? 4.0f : 1.0f);
        nstf_kv_q8_store(tmp, kvd, ck + p * rb);
        for (int64_t i = 0; i < kvd; i++) tmp[i] = (float)rng_normal(r);
        nstf_kv_q8_store(tmp, kvd, cv + p * rb);
        nstf_kv_q8_load(ck + p * rb, kvd, kf + p * kvd);
        nstf_kv_q8_load(cv + p * rb, kvd, vf + p * kvd);
        for (int64_t i = 0; i < kvd; i++) /* a bf16 backend widens d * code to bf16 for its matrix units */
            kf[p * kvd + i] = act_round(kf[p * kvd + i]), vf[p * kvd + i] = act_round(vf[p * kvd + i]);
    }
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < kvd; i++) kf[(pos0 + t) * kvd + i] = kv[t * kvd + i], vf[(pos0 + t) * kvd + i] = vv[t * kvd + i];
    dbuf dq = up(hq, act_bytes(n * qd)), dk = up(hk, act_bytes(n * kvd)), dv = up(hv, act_bytes(n * kvd));
    dbuf dck = up(ck, (size_t)n_ctx * rb), dcv = up(cv, (size_t)n_ctx * rb), dout = up(NULL, act_bytes(n * qd));
    if (!open_batch((int)n, (int)pos0)) return;
    nstf_op_args a = attention_args(dq, dk, dv, dck, dcv, dout, g_io.pos, n, n_ctx);
    a.attention.pos0 = pos0;
    a.attention.window = window;
    a.attention.kv_q8 = true;
    char what[80];
    snprintf(what, sizeof what, "attention, Q8_0 cache, %lld tokens at %lld, window %d", (long long)n, (long long)pos0,
             window);
    if (!g_be->host_memory && g_be->vt->get_opt(g_be, NSTF_OPT_LEVEL) < 2) {
        /* a GPU's materialized attention (levels 0, 1) reads bf16 caches only: a clear refusal */
        const nstf_status st = nstf_backend_op(g_be, &a);
        CHECK(st == NSTF_ERR_UNSUPPORTED && strstr(nstf_last_error(), "Q8_0"), "%s: %s below level 2: %s", g_name, what,
              st == NSTF_OK ? "ran" : nstf_last_error());
        end_refused((int)n, st);
        drop(dq), drop(dk), drop(dv), drop(dck), drop(dcv), drop(dout);
        free(qv), free(kv), free(vv), free(kf), free(vf), free(tmp), free(ck), free(cv), free(hq), free(hk), free(hv);
        return;
    }
    close_batch((int)n, nstf_backend_op(g_be, &a));
    void *ho = malloc(act_bytes(n * qd));
    float *got = malloc((size_t)(n * qd) * 4);
    double *ref = malloc((size_t)(n * qd) * 8);
    down(dout, ho, "attention out (Q8_0 cache)");
    down(dck, ck, "k cache (Q8_0)"), down(dcv, cv, "v cache (Q8_0)");
    act_read(ho, got, n * qd);
    ref_attention(qv, kf, vf, ref, n, pos0, window, nh, nkv, hd, 0.125);
    judge(what, got, ref, n * qd, act_bf16(), 1e-7);
    int bad = 0;
    for (int64_t t = 0; t < n; t++)
        for (int which = 0; which < 2; which++) {
            const uint8_t *row = (which ? cv : ck) + (pos0 + t) * rb;
            const float *x = (which ? vv : kv) + t * kvd;
            nstf_kv_q8_load(row, kvd, tmp);
            for (int64_t b = 0; b < kvd / 32; b++) {
                double amax = 0;
                for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(x[32 * b + i]));
                const double d = nstf_fp16_to_f32(nstf_load_u16(row + kvd + 2 * b));
                bad += fabs(d - amax / 127) > 1e-3 * amax / 127;
                for (int i = 0; i < 32; i++) bad += fabs(tmp[32 * b + i] - x[32 * b + i]) > 0.6 * d;
            }
        }
    CHECK(bad == 0, "%s: %s: %d values of the batch's rows not in the cache as Q8_0", g_name, what, bad);
    drop(dq), drop(dk), drop(dv), drop(dck), drop(dcv), drop(dout);
    free(qv), free(kv), free(vv), free(kf), free(vf), free(tmp), free(ck), free(cv), free(hq), free(hk), free(hv);
    free(ho), free(got), free(ref);
}

static void case_attention(test_rng *r) {
    attention_q8_case(r, 1, 0, 0);
    attention_q8_case(r, 1, 261, 0);
    attention_q8_case(r, 13, 0, 0);
    attention_q8_case(r, 19, 150, 0);
    attention_q8_case(r, 1, 261, 100);
    attention_q8_case(r, 19, 150, 40);
    attention_case(r, 1, 0, 0);
    attention_case(r, 1, 261, 0);
    attention_case(r, 13, 0, 0);
    attention_case(r, 19, 150, 0);
    /* sliding windows: shorter than the batch, than the cache, and one
     * that covers everything (the same as none) */
    attention_case(r, 1, 261, 100);
    attention_case(r, 1, 261, 7);
    attention_case(r, 13, 0, 5);
    attention_case(r, 19, 150, 40);
    attention_case(r, 19, 150, 1000);
    attention_paged_case(r);
    /* the training forward: through a cache, without one, and a batch of
     * sequences in one op (45 rows: a partial 64-row tile; 70: two tiles) */
    attention_lse_case(r, 37, 1, true);
    attention_lse_case(r, 37, 1, false);
    attention_lse_case(r, 45, 3, false);
    attention_lse_case(r, 70, 4, false);
}

static void case_swiglu(test_rng *r) {
    const int64_t f = 333;
    for (int rows = 0; rows < 2; rows++)
        for (int64_t n = 1; n <= 4; n += 3) {
            /* rows: each token's gate | up in one row of 2f; else planes */
            float *hv = malloc((size_t)(n * 2 * f) * 4);
            void *hh = act_make(r, hv, n * 2 * f, 2.0f);
            dbuf dh = up(hh, act_bytes(n * 2 * f)), dy = up(NULL, act_bytes(n * f));
            const int64_t es = act_bf16() ? 2 : 4;
            nstf_op_args a = {.op = NSTF_OP_SWIGLU, .label = "swiglu"};
            a.swiglu.gate = (nstf_view){dh.d, g_be->act_type, rows ? 2 * f : f};
            a.swiglu.up = (nstf_view){(char *)dh.d + (rows ? f : n * f) * es, g_be->act_type, rows ? 2 * f : f};
            a.swiglu.y = (nstf_view){dy.d, g_be->act_type, f};
            a.swiglu.n = n;
            a.swiglu.n_ff = f;
            if (rows && g_be->host_memory) { /* the CPU backend's groups are planes */
                drop(dh), drop(dy);
                free(hv), free(hh);
                continue;
            }
            run_op(&a, 1, 0);
            void *hy = malloc(act_bytes(n * f));
            float *got = malloc((size_t)(n * f) * 4);
            double *ref = malloc((size_t)(n * f) * 8);
            down(dy, hy, "swiglu y");
            act_read(hy, got, n * f);
            for (int64_t t = 0; t < n; t++)
                for (int64_t c = 0; c < f; c++) {
                    double g = rows ? hv[t * 2 * f + c] : hv[t * f + c], u = rows ? hv[t * 2 * f + f + c] : hv[n * f + t * f + c];
                    ref[t * f + c] = g / (1 + exp(-g)) * u;
                }
            judge(rows ? "swiglu rows" : "swiglu planes", got, ref, n * f, act_bf16(), 1e-7);
            drop(dh), drop(dy);
            free(hv), free(hh), free(hy), free(got), free(ref);
        }
}

static void case_argmax(test_rng *r) {
    const int64_t rows = 3, n = 49157;
    float *x = malloc((size_t)(rows * n) * 4);
    for (int64_t i = 0; i < rows * n; i++) x[i] = rng_normal(r);
    x[n + 17] = x[n + 4000] = 9.0f; /* a tie: the first index wins */
    int32_t got[3] = {-1, -1, -1};
    dbuf dx = up(x, (size_t)(rows * n) * 4), dout = up(NULL, sizeof got);
    nstf_op_args a = {.op = NSTF_OP_ARGMAX, .label = "argmax"};
    a.argmax.x = (nstf_view){dx.d, NSTF_TYPE_F32, n};
    a.argmax.out = dout.d;
    a.argmax.n_rows = rows;
    a.argmax.n = n;
    run_op(&a, 1, 0);
    down(dout, got, "argmax out");
    for (int64_t rr = 0; rr < rows; rr++) {
        int64_t b = 0;
        for (int64_t i = 1; i < n; i++)
            if (x[rr * n + i] > x[rr * n + b]) b = i;
        CHECK(got[rr] == b, "%s: argmax row %lld: %d, want %lld", g_name, (long long)rr, got[rr], (long long)b);
    }
    drop(dx), drop(dout);
    free(x);
}

/* Rows of `width` values at a token stride: dense on the CPU backend, with
 * a gap on a GPU's (the q / k / v of a row of the group). */
static int64_t row_stride(int64_t width) { return g_be->host_memory ? width : width + 40; }

static void case_bias(test_rng *r) {
    const int64_t width = 200;
    for (int64_t n = 1; n <= 9; n += 8) {
        const int64_t st = row_stride(width), all = n * st;
        float *xv = malloc((size_t)all * 4), *b = malloc((size_t)width * 4), *got = malloc((size_t)(n * width) * 4);
        double *ref = malloc((size_t)(n * width) * 8);
        void *hx = act_make(r, xv, all, 1.0f);
        for (int64_t i = 0; i < width; i++) b[i] = 0.5f * rng_normal(r);
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < width; i++) ref[t * width + i] = (double)xv[t * st + i] + b[i];
        dbuf dx = up(hx, act_bytes(all)), db = up(b, (size_t)width * 4);
        nstf_op_args a = {.op = NSTF_OP_BIAS, .label = "bias"};
        a.bias.x = (nstf_view){dx.d, g_be->act_type, st};
        a.bias.b = db.d;
        a.bias.n = n;
        a.bias.width = width;
        run_op(&a, 1, 0);
        void *hy = malloc(act_bytes(all));
        float *yv = malloc((size_t)all * 4);
        down(dx, hy, "bias x");
        act_read(hy, yv, all);
        int gap_changed = 0;
        for (int64_t t = 0; t < n; t++) {
            for (int64_t i = 0; i < width; i++) got[t * width + i] = yv[t * st + i];
            for (int64_t i = width; i < st; i++) gap_changed += memcmp(&yv[t * st + i], &xv[t * st + i], 4) != 0;
        }
        CHECK(gap_changed == 0, "%s: bias wrote %d values between the rows", g_name, gap_changed);
        judge(n == 1 ? "bias 1 token" : "bias 9 tokens", got, ref, n * width, act_bf16(), 1e-7);
        drop(dx), drop(db);
        free(xv), free(b), free(got), free(ref), free(hx), free(hy), free(yv);
    }
}

static void case_head_norm(test_rng *r) {
    const int nh = 4, nkv = 2;
    for (int hd = 64; hd <= 128; hd += 64)
        for (int64_t n = 1; n <= 6; n += 5) {
            const int64_t qst = row_stride((int64_t)nh * hd), kst = row_stride((int64_t)nkv * hd);
            float *qv = malloc((size_t)(n * qst) * 4), *kv = malloc((size_t)(n * kst) * 4);
            float *wq = malloc((size_t)hd * 4), *wk = malloc((size_t)hd * 4);
            void *hq = act_make(r, qv, n * qst, 3.0f), *hk = act_make(r, kv, n * kst, 0.5f);
            for (int i = 0; i < hd; i++) wq[i] = 1 + 0.3f * rng_normal(r), wk[i] = 1 + 0.3f * rng_normal(r);
            dbuf dq = up(hq, act_bytes(n * qst)), dk = up(hk, act_bytes(n * kst)), dwq = up(wq, (size_t)hd * 4),
                 dwk = up(wk, (size_t)hd * 4);
            const float eps = 1e-6f;
            nstf_op_args a = {.op = NSTF_OP_HEAD_NORM, .label = "head_norm"};
            a.head_norm.q = (nstf_view){dq.d, g_be->act_type, qst};
            a.head_norm.k = (nstf_view){dk.d, g_be->act_type, kst};
            a.head_norm.wq = dwq.d;
            a.head_norm.wk = dwk.d;
            a.head_norm.n = n;
            a.head_norm.n_heads = nh;
            a.head_norm.n_kv_heads = nkv;
            a.head_norm.head_dim = hd;
            a.head_norm.eps = eps;
            run_op(&a, 1, 0);
            for (int which = 0; which < 2; which++) {
                const int heads = which ? nkv : nh;
                const int64_t st = which ? kst : qst, len = n * heads * hd;
                const float *src = which ? kv : qv, *w = which ? wk : wq;
                void *h = malloc(act_bytes(n * st));
                float *all = malloc((size_t)(n * st) * 4), *got = malloc((size_t)len * 4);
                double *ref = malloc((size_t)len * 8);
                down(which ? dk : dq, h, "head_norm out");
                act_read(h, all, n * st);
                for (int64_t t = 0; t < n; t++)
                    for (int hh = 0; hh < heads; hh++) {
                        const float *x = src + t * st + hh * hd;
                        double ss = 0;
                        for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
                        const double inv = 1.0 / sqrt(ss / hd + eps);
                        for (int i = 0; i < hd; i++) {
                            ref[(t * heads + hh) * hd + i] = x[i] * inv * w[i];
                            got[(t * heads + hh) * hd + i] = all[t * st + hh * hd + i];
                        }
                    }
                char what[64];
                snprintf(what, sizeof what, "head_norm %s, head %d, %lld tokens", which ? "k" : "q", hd, (long long)n);
                judge(what, got, ref, len, act_bf16(), 1e-7);
                free(h), free(all), free(got), free(ref);
            }
            drop(dq), drop(dk), drop(dwq), drop(dwk);
            free(qv), free(kv), free(wq), free(wk), free(hq), free(hk);
        }
}

/* the training rows: the gradient mode */
#include "backend_ops_grad.h"

/* Low-rank factors A [rank, n_in], B [n_out, rank] of one type over x
 * [n, n_in]; the fp64 reference is (x A^T) B^T without rounding between.
 * Tolerances: fp32 paths as a matmul (1e-7); the int8 path runs two int8
 * matmuls of 1e-4 each, the second on an intermediate that already holds
 * the first one's error: 2e-4. bf16: the naive result rounds x A^T to
 * bf16 (as the kernel's intermediate is stored) and both products as the
 * matmul case does. */
static void matmul_lr_case(test_rng *r, nstf_type t, int64_t n, int64_t rank) {
    const int64_t n_in = 160, n_out = 72;
    float *xv = malloc((size_t)(n * n_in) * 4), *da = malloc((size_t)(rank * n_in) * 4),
          *db = malloc((size_t)(n_out * rank) * 4);
    void *hx = act_make(r, xv, n * n_in, 1.0f);
    size_t ab, bb;
    void *wa = matrix_make(r, t, n_in, rank, da, &ab), *wb = matrix_make(r, t, rank, n_out, db, &bb);
    dbuf dwa = up(wa, ab), dwb = up(wb, bb), dx = up(hx, act_bytes(n * n_in)), dt = up(NULL, act_bytes(n * rank)),
         dy = up(NULL, act_bytes(n * n_out));
    const nstf_matrix ma = {dwa.d, t, n_in, rank, NULL}, mb = {dwb.d, t, rank, n_out, NULL};
    relayout(&ma);
    relayout(&mb);
    nstf_op_args a = {.op = NSTF_OP_MATMUL_LR, .label = "matmul_lr"};
    a.matmul_lr.a = &ma;
    a.matmul_lr.b = &mb;
    a.matmul_lr.x = (nstf_view){dx.d, g_be->act_type, n_in};
    a.matmul_lr.tmp = (nstf_view){dt.d, g_be->act_type, rank};
    a.matmul_lr.out = (nstf_view){dy.d, g_be->act_type, n_out};
    a.matmul_lr.n = n;
    run_op(&a, (int)n, 0);
    void *hy = malloc(act_bytes(n * n_out));
    float *got = malloc((size_t)(n * n_out) * 4), *naive = malloc((size_t)(n * n_out) * 4),
          *tn = malloc((size_t)rank * 4);
    double *ref = malloc((size_t)(n * n_out) * 8), *tr = malloc((size_t)rank * 8);
    down(dy, hy, "matmul_lr out");
    down(dt, NULL, "matmul_lr tmp");
    act_read(hy, got, n * n_out);
    for (int64_t tk = 0; tk < n; tk++) {
        for (int64_t k = 0; k < rank; k++) {
            double s = 0, sn = 0;
            for (int64_t i = 0; i < n_in; i++) {
                s += (double)da[k * n_in + i] * xv[tk * n_in + i];
                sn += (double)nstf_bf16_to_f32(nstf_f32_to_bf16(da[k * n_in + i])) * xv[tk * n_in + i];
            }
            tr[k] = s;
            tn[k] = nstf_bf16_to_f32(nstf_f32_to_bf16((float)sn));
        }
        for (int64_t o = 0; o < n_out; o++) {
            double s = 0, sn = 0;
            for (int64_t k = 0; k < rank; k++) {
                s += (double)db[o * rank + k] * tr[k];
                sn += (double)nstf_bf16_to_f32(nstf_f32_to_bf16(db[o * rank + k])) * tn[k];
            }
            ref[tk * n_out + o] = s;
            naive[tk * n_out + o] = nstf_bf16_to_f32(nstf_f32_to_bf16((float)sn));
        }
    }
    char what[96];
    snprintf(what, sizeof what, "matmul_lr %s, rank %lld, %lld tokens", nstf_type_name(t), (long long)rank,
             (long long)n);
    const bool int8 = !g_precise && g_be->int8_act && nstf_type_block_elems(t) > 1;
    judge_naive(what, got, ref, act_bf16() ? naive : NULL, n * n_out, int8 ? 2e-4 : 1e-7);
    drop(dwa), drop(dwb), drop(dx), drop(dt), drop(dy);
    free(xv), free(da), free(db), free(hx), free(wa), free(wb), free(hy), free(got), free(naive), free(tn), free(ref);
    free(tr);
}

static void case_matmul_lr(test_rng *r) {
    static const nstf_type types[] = {NSTF_TYPE_F32, NSTF_TYPE_F16, NSTF_TYPE_BF16, NSTF_TYPE_Q8_0};
    for (int ti = 0; ti < 4; ti++) {
        /* rank: a multiple of 32 for a quantized B's rows, else ragged */
        const int64_t rank = nstf_type_block_elems(types[ti]) > 1 ? 64 : 37;
        matmul_lr_case(r, types[ti], 3, rank);
        matmul_lr_case(r, types[ti], 20, rank);
    }
}

/* the sparse decode attention */
#include "backend_ops_sparse.h"

/* ---- the backends --------------------------------------------------------------------- */

static void run_all(const char *name) {
    g_name = name;
    /* a plan that sizes the backend's workspace for these cases */
    nstf_matrix big = {NULL, NSTF_TYPE_Q4_1, 256, 152, NULL}; /* the largest matmul case: 256 x (72 + 40 + 40) */
    nstf_backend_plan p = {.n_layers = 1, .dim = 200, .n_heads = 6, .n_kv_heads = 2, .head_dim = 64, .ffn_dim = 333,
                           .n_vocab = 49157, .n_ctx = 320, .n_batch = 64, .n_seq = 2, .rope_base = 10000.0f,
                           .rope_mode = NSTF_ROPE_NORM, .mats = &big, .n_mats = 1, .embed_type = NSTF_TYPE_F32,
                           .output_type = NSTF_TYPE_F32, .kv_block = 16, .kv_blocks = 48, /* attention_paged_case's */
                           .kv_q8 = true}; /* attention_q8_case's prefill buffer */
    uint64_t ws = 0;
    CHECK(g_be->vt->plan(g_be, &p, &ws) == NSTF_OK && g_be->vt->prepare(g_be, &p) == NSTF_OK, "%s: prepare: %s", name,
          nstf_last_error());
    (void)g_be->vt->set_opt(g_be, NSTF_OPT_GRAPHS, 0);
    for (int level = g_be->vt->n_levels - 1; level >= 0; level--) {
        CHECK(g_be->vt->set_opt(g_be, NSTF_OPT_LEVEL, level) == NSTF_OK, "%s: level %d: %s", name, level,
              nstf_last_error());
        for (int op = 0; op < NSTF_OP_N; op++) {
            test_rng r = {0x9e3779b9u + (uint64_t)op * 7919u};
            const int before = g_fails;
            k_cases[op](&r);
            printf("  %-6s L%d %-10s %s\n", name, level, nstf_op_name((nstf_op)op), g_fails == before ? "ok" : "FAIL");
        }
    }
}

int main(void) {
    for (int op = 0; op < NSTF_OP_N; op++) CHECK(k_cases[op] != NULL, "op %s has no case", nstf_op_name((nstf_op)op));
#if defined(TEST_BACKEND_GPU)
    if (nstf_backend_gpu_count() < 1) {
        printf("test_backend_ops_gpu: no GPU; skipped\n");
        return 77;
    }
    CHECK(nstf_backend_gpu_create(0, &g_be) == NSTF_OK, "%s", nstf_last_error());
    g_precise = false;
    if (g_be) run_all(nstf_backend_gpu_runtime());
    nstf_backend_free(g_be);
    return test_finish("test_backend_ops_gpu");
#else
    /* fp32 activations (precise), the default (16-bit: two 8-bit blocks, held
     * to the fp32 bound), one 8-bit block */
    static const int bits[3] = {32, 16, 8};
    static const char *const names[3] = {"cpu-precise", "cpu", "cpu-act8"};
    for (int m = 0; m < 3; m++) {
        const nstf_cpu_params cp = {2, false, false, bits[m]};
        CHECK(nstf_backend_cpu_create(&cp, &g_be) == NSTF_OK, "%s", nstf_last_error());
        g_precise = bits[m] > 8;
        if (g_be) run_all(names[m]);
        nstf_backend_free(g_be);
    }
    return test_finish("test_backend_ops");
#endif
}
