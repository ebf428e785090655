/* test_ops_gpu.cu — the GPU op-comparison harness: every kernel of
 * src/ops/gpu against a CPU reference, one line per case, then
 * "N passed, N failed"; exit 1 on any failure, 77 when there is no GPU.
 *
 * References: the scalar nstf_ref_* (double accumulation, the fp64 oracle)
 * where they cover the op, fp64 loops here otherwise. Metrics:
 *  - fp32 outputs: NMSE <= 1e-7 against the fp64 reference;
 *  - bf16 outputs: NMSE against the fp64 reference at most 2x that of a
 *    naive same-precision implementation computed here (bf16 inputs, fp32
 *    math, bf16 output);
 *  - exact ops (gather to F32, argmax, KV write): bitwise equality.
 * Every output is poisoned (0xFF bytes: NaN in f32 and bf16) before the
 * kernel runs, every device buffer carries a guard region that must come
 * back intact, and any NaN/Inf in an output fails the case. Shapes are not
 * multiples of the tile/vector widths, and the cases reach every launch
 * configuration the launchers choose (GEMV: each weight type's vector and
 * scalar paths, n_tok 1..8 and a split batch, one and several x chunks,
 * vector and scalar x staging, F32 and BF16 output). */
#include "ops/gpu/gpu_api.h"
#include "test_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static int g_pass, g_fail;

static void report(bool ok, const char *what, const char *detail) {
    printf("%s %-58s %s\n", ok ? "PASS" : "FAIL", what, detail);
    if (ok) g_pass++;
    else g_fail++;
}

/* ---- host helpers ----------------------------------------------------------- */

struct rng {
    uint64_t s;
    uint64_t next() {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        return s * 2685821657736338717ull;
    }
    float uniform() { return (float)((next() >> 40) * (1.0 / 8388608.0)) - 1.0f; }
    float normal() {
        float u1 = (uniform() + 1.0f) * 0.5f + 1e-7f, u2 = (uniform() + 1.0f) * 0.5f;
        return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    }
    int below(int n) { return (int)(next() % (uint64_t)n); }
};
static rng R = {0x9E3779B97F4A7C15ull};

static float bf(float f) { return nstf_bf16_to_f32(nstf_f32_to_bf16(f)); } /* round to bf16 */

static std::vector<uint16_t> to_bf16(const std::vector<float> &v) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = nstf_f32_to_bf16(v[i]);
    return o;
}
static std::vector<float> from_bf16(const std::vector<uint16_t> &v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = nstf_bf16_to_f32(v[i]);
    return o;
}
static double nmse_vs(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}
static size_t nonfinite(const float *a, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += !isfinite(a[i]);
    return c;
}

/* ---- device buffers with guard regions ------------------------------------ */

#define GUARD 256
#define GUARD_BYTE 0xa5

struct dbuf {
    unsigned char *base = nullptr; /* allocation: [pad][payload][guard] */
    size_t bytes = 0, pad = 0;
    void *p() const { return base + pad; }
};

static bool must(nstf_status s, const char *what) {
    if (s == NSTF_OK) return true;
    fprintf(stderr, "%s: %s\n", what, nstf_last_error());
    exit(1); /* the harness itself cannot go on (not a kernel failure) */
}

/* `pad` shifts the payload off 256-byte alignment to reach the unaligned
 * paths. The payload is filled from `src`, or poisoned (0xFF) if NULL. */
static dbuf dalloc(size_t bytes, const void *src, size_t pad = 0) {
    dbuf b;
    b.bytes = bytes;
    b.pad = pad;
    must(nstf_gpu_malloc((void **)&b.base, pad + bytes + GUARD), "gpu malloc");
    must(nstf_gpu_memset(b.base, 0xff, pad + bytes, nullptr), "memset");
    must(nstf_gpu_memset(b.base + pad + bytes, GUARD_BYTE, GUARD, nullptr), "memset");
    if (src && bytes) must(nstf_gpu_memcpy_h2d(b.p(), src, bytes, nullptr), "h2d");
    must(nstf_gpu_stream_sync(nullptr), "sync");
    return b;
}
/* Copies the payload back and says whether the guard is intact. */
static bool dfetch(const dbuf &b, void *dst) {
    std::vector<unsigned char> g(GUARD);
    if (b.bytes) must(nstf_gpu_memcpy_d2h(dst, b.p(), b.bytes, nullptr), "d2h");
    must(nstf_gpu_memcpy_d2h(g.data(), (unsigned char *)b.p() + b.bytes, GUARD, nullptr), "d2h");
    for (int i = 0; i < GUARD; i++)
        if (g[i] != GUARD_BYTE) return false;
    return true;
}
static void dfree(dbuf &b) {
    nstf_gpu_free(b.base);
    b.base = nullptr;
}

/* bf16 rule: kernel NMSE <= 2 * naive NMSE (tiny floor for exact cases). */
static bool bf16_rule(double e_kernel, double e_naive) { return e_kernel <= 2.0 * e_naive + 1e-12; }

/* ---- GEMV -------------------------------------------------------------------- */

static const nstf_type k_wtypes[] = {NSTF_TYPE_F32,    NSTF_TYPE_F16,  NSTF_TYPE_BF16, NSTF_TYPE_Q8_0,
                                     NSTF_TYPE_Q4_0,   NSTF_TYPE_Q4_1, NSTF_TYPE_Q5_0, NSTF_TYPE_Q5_1,
                                     NSTF_TYPE_IQ4_NL, NSTF_TYPE_Q2_K, NSTF_TYPE_Q3_K, NSTF_TYPE_Q4_K,
                                     NSTF_TYPE_Q5_K,   NSTF_TYPE_Q6_K, NSTF_TYPE_IQ4_XS};

static bool is_quant(nstf_type t) { return nstf_type_is_quantized(t); }
static bool is_super(nstf_type t) { return nstf_type_block_elems(t) == 256; }

/* Random weights of type `t`: the reference quantizer where there is one,
 * random codes under sane scales for the other types (test_quant.h). */
static std::vector<unsigned char> make_weights(nstf_type t, int64_t rows, int64_t cols) {
    uint64_t rb = 0;
    nstf_type_row_bytes(t, cols, &rb);
    std::vector<unsigned char> w(rows * rb);
    std::vector<float> f(cols);
    test_rng tr = {R.next() | 1};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) f[i] = R.normal() * 0.05f;
        test_quantize_row(t, f.data(), &w[r * rb], cols, &tr);
    }
    return w;
}

static void test_gemv(nstf_type wt, int64_t n_tok, int64_t n_in, int64_t n_out, nstf_type yt,
                      size_t w_pad, size_t x_pad) {
    std::vector<unsigned char> w = make_weights(wt, n_out, n_in);
    std::vector<float> xf(n_tok * n_in);
    for (auto &v : xf) v = bf(R.normal());
    std::vector<uint16_t> xb = to_bf16(xf);

    /* fp64 reference (x exactly representable: it is bf16) */
    std::vector<float> ref(n_tok * n_out);
    nstf_ref_matmul(wt, w.data(), xf.data(), ref.data(), n_tok, n_in, n_out);

    dbuf dw = dalloc(w.size(), w.data(), w_pad), dx = dalloc(xb.size() * 2, xb.data(), x_pad);
    const size_t ysz = yt == NSTF_TYPE_BF16 ? 2 : 4;
    dbuf dy = dalloc(n_tok * n_out * ysz, nullptr);
    char cfg[160];
    snprintf(cfg, sizeof cfg, "%s", nstf_gpu_gemv_config(wt, dw.p(), (const uint16_t *)dx.p(), n_tok, n_in));
    nstf_status st = nstf_gpu_gemv(wt, dw.p(), (const uint16_t *)dx.p(), dy.p(), yt, n_tok, n_in,
                                   n_out, nullptr);
    bool ok = st == NSTF_OK;
    if (ok) ok = nstf_gpu_stream_sync(nullptr) == NSTF_OK;
    std::vector<float> y(n_tok * n_out);
    bool guards = true;
    if (ok) {
        if (yt == NSTF_TYPE_BF16) {
            std::vector<uint16_t> yb(y.size());
            guards = dfetch(dy, yb.data());
            y = from_bf16(yb);
        } else {
            guards = dfetch(dy, y.data());
        }
        guards = guards && dfetch(dw, w.data()) && dfetch(dx, xb.data());
    }
    char what[128], detail[300];
    snprintf(what, sizeof what, "gemv %s nt=%lld %lldx%lld y=%s%s%s", nstf_type_name(wt),
             (long long)n_tok, (long long)n_in, (long long)n_out, nstf_type_name(yt),
             w_pad ? " w+pad" : "", x_pad ? " x+pad" : "");
    if (!ok) {
        snprintf(detail, sizeof detail, "[%s] error: %s", cfg, nstf_last_error());
        report(false, what, detail);
    } else {
        size_t bad = nonfinite(y.data(), y.size());
        double e = nmse_vs(y.data(), ref.data(), y.size());
        bool pass;
        if (yt == NSTF_TYPE_BF16) {
            /* naive: dequantized weights, bf16 x, sequential fp32 sum, bf16 out */
            uint64_t rb = 0;
            nstf_type_row_bytes(wt, n_in, &rb);
            std::vector<float> wr(n_in), naive(y.size());
            for (int64_t o = 0; o < n_out; o++) {
                nstf_dequantize_row(wt, &w[o * rb], wr.data(), n_in);
                for (int64_t t = 0; t < n_tok; t++) {
                    float s = 0;
                    for (int64_t i = 0; i < n_in; i++) s += wr[i] * xf[t * n_in + i];
                    naive[t * n_out + o] = bf(s);
                }
            }
            double en = nmse_vs(naive.data(), ref.data(), y.size());
            pass = bf16_rule(e, en);
            snprintf(detail, sizeof detail, "[%s] nmse=%.3g naive=%.3g nonfinite=%zu guard=%s", cfg,
                     e, en, bad, guards ? "ok" : "BROKEN");
        } else {
            pass = e <= 1e-7;
            snprintf(detail, sizeof detail, "[%s] nmse=%.3g (<=1e-7) nonfinite=%zu guard=%s", cfg,
                     e, bad, guards ? "ok" : "BROKEN");
        }
        report(pass && bad == 0 && guards, what, detail);
    }
    dfree(dw); dfree(dx); dfree(dy);
}

static void gemv_cases(void) {
    for (nstf_type wt : k_wtypes) {
        const bool q = is_quant(wt), sb = is_super(wt);
        /* (n_in, n_out): tiny, odd row count, several chunks at nt = 8 (cap
         * 2048 elements for the 32-element types' bf16 staging, 1024 for the
         * super-block kernel's fp32), a model shape. Float types add rows that
         * are not 16-byte multiples (scalar path). */
        const int64_t shapes_q[][2] = {{32, 1}, {96, 37}, {2080, 45}, {576, 1536}};
        const int64_t shapes_k[][2] = {{256, 1}, {512, 37}, {2304, 45}, {1536, 1536}};
        const int64_t shapes_f[][2] = {{8, 5}, {100, 37}, {96, 37}, {2056, 45}, {578, 257}};
        const int n_shapes = q ? 4 : 5;
        for (int s = 0; s < n_shapes; s++) {
            const int64_t n_in = sb ? shapes_k[s][0] : q ? shapes_q[s][0] : shapes_f[s][0];
            const int64_t n_out = sb ? shapes_k[s][1] : q ? shapes_q[s][1] : shapes_f[s][1];
            for (int nt = 1; nt <= 8; nt++)
                test_gemv(wt, nt, n_in, n_out, (nt + s) % 2 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 11, n_in, n_out, NSTF_TYPE_BF16, 0, 0); /* 8 + 3 */
        }
        /* unaligned x (scalar staging) and, for float types, unaligned W */
        for (int nt : {1, 3, 8}) {
            test_gemv(wt, nt, sb ? 2304 : 2080, 33, NSTF_TYPE_BF16, 0, 2);
            if (!q) test_gemv(wt, nt, 1024, 33, NSTF_TYPE_BF16, wt == NSTF_TYPE_F32 ? 4 : 2, 0);
        }
        /* several x chunks at nt = 1 (cap 8192 elements of fp32 staging) */
        test_gemv(wt, 1, sb ? 16640 : 16416, 9, NSTF_TYPE_F32, 0, 0);
        test_gemv(wt, 2, sb ? 16640 : 16416, 9, NSTF_TYPE_BF16, 0, 0);
        /* a Llama-3-8B shape */
        test_gemv(wt, 1, 4096, 512, NSTF_TYPE_BF16, 0, 0);
        /* wide outputs: the quantized kernels' 32-row blocks (n_out >= 8192) */
        if (q) {
            test_gemv(wt, 1, 256, 8200, NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 3, 256, 8200, NSTF_TYPE_BF16, 0, 0);
        }
    }
}

/* ---- get_rows ------------------------------------------------------------------- */

static void test_get_rows(nstf_type t, int64_t n_rows, int64_t dim, int64_t n_tok, nstf_type ot) {
    std::vector<unsigned char> table = make_weights(t, n_rows, dim);
    std::vector<int32_t> ids(n_tok);
    for (auto &id : ids) id = R.below((int)n_rows);
    const bool bad_id = n_tok >= 3;
    if (bad_id) { ids[1] = -1; ids[2] = (int32_t)n_rows; } /* rows of NaN, no OOB read */
    std::vector<float> ref(n_tok * dim);
    for (int64_t k = 0; k < n_tok; k++) {
        if (ids[k] < 0 || ids[k] >= n_rows) {
            for (int64_t i = 0; i < dim; i++) ref[k * dim + i] = NAN;
        } else {
            nstf_ref_get_rows(t, table.data(), &ids[k], &ref[k * dim], 1, dim);
        }
    }
    dbuf dt = dalloc(table.size(), table.data()), di = dalloc(n_tok * 4, ids.data());
    const size_t osz = ot == NSTF_TYPE_BF16 ? 2 : 4;
    dbuf dout = dalloc(n_tok * dim * osz, nullptr);
    nstf_status st = nstf_gpu_get_rows(t, dt.p(), n_rows, (const int32_t *)di.p(), dout.p(), ot,
                                       n_tok, dim, nullptr);
    std::vector<float> out(n_tok * dim);
    bool guards = false;
    if (st == NSTF_OK) {
        if (ot == NSTF_TYPE_BF16) {
            std::vector<uint16_t> ob(out.size());
            guards = dfetch(dout, ob.data());
            out = from_bf16(ob);
        } else {
            guards = dfetch(dout, out.data());
        }
    }
    /* exact: F32 equals the reference dequantization; BF16 equals its
     * rounding (which is the naive implementation, so 2x-naive holds). */
    size_t mismatch = 0, unexpected_nan = 0;
    for (size_t i = 0; i < out.size(); i++) {
        const float want = ot == NSTF_TYPE_BF16 ? bf(ref[i]) : ref[i];
        if (isnan(want)) { mismatch += !isnan(out[i]); continue; }
        unexpected_nan += !isfinite(out[i]);
        mismatch += memcmp(&out[i], &want, 4) != 0;
    }
    char what[128], detail[200];
    snprintf(what, sizeof what, "get_rows %s rows=%lld dim=%lld nt=%lld out=%s%s", nstf_type_name(t),
             (long long)n_rows, (long long)dim, (long long)n_tok, nstf_type_name(ot),
             bad_id ? " +bad ids" : "");
    snprintf(detail, sizeof detail, "%s mismatches=%zu (exact) nonfinite=%zu guard=%s",
             st == NSTF_OK ? "" : nstf_last_error(), mismatch, unexpected_nan, guards ? "ok" : "BROKEN");
    report(st == NSTF_OK && mismatch == 0 && unexpected_nan == 0 && guards, what, detail);
    dfree(dt); dfree(di); dfree(dout);
}

/* ---- rmsnorm ---------------------------------------------------------------------- */

static void test_rmsnorm(int64_t n_tok, int64_t dim, int res_kind /* 0 none, 1 F32, 2 BF16 */) {
    const float eps = 1e-5f;
    std::vector<float> x(n_tok * dim), res(n_tok * dim), w(dim);
    for (auto &v : x) v = R.normal() * 3.0f;
    for (auto &v : res) v = R.normal();
    for (auto &v : w) v = 1.0f + 0.2f * R.normal();
    if (res_kind == 2) for (auto &v : res) v = bf(v);
    std::vector<uint16_t> resb = to_bf16(res);
    /* fp64 reference of x += res, then nstf_ref_rmsnorm (double inside) */
    std::vector<float> xref(x.size()), yref(x.size());
    for (size_t i = 0; i < x.size(); i++) xref[i] = (float)((double)x[i] + (res_kind ? res[i] : 0.0));
    nstf_ref_rmsnorm(xref.data(), w.data(), yref.data(), n_tok, dim, eps);
    /* naive bf16-out: fp32 sum of squares, fp32 scale */
    std::vector<float> naive(x.size());
    for (int64_t t = 0; t < n_tok; t++) {
        float ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += xref[t * dim + i] * xref[t * dim + i];
        const float r = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) naive[t * dim + i] = bf(xref[t * dim + i] * r * w[i]);
    }
    dbuf dx = dalloc(x.size() * 4, x.data()), dw = dalloc(dim * 4, w.data());
    dbuf dr = res_kind == 2 ? dalloc(resb.size() * 2, resb.data()) : dalloc(res.size() * 4, res.data());
    dbuf dy = dalloc(x.size() * 2, nullptr);
    nstf_status st = nstf_gpu_rmsnorm((float *)dx.p(), res_kind ? dr.p() : nullptr,
                                      res_kind == 2 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32,
                                      (const float *)dw.p(), (uint16_t *)dy.p(), n_tok, dim, eps, nullptr);
    std::vector<float> xo(x.size());
    std::vector<uint16_t> yb(x.size());
    bool guards = st == NSTF_OK && dfetch(dx, xo.data()) && dfetch(dy, yb.data()) && dfetch(dr, res.data());
    std::vector<float> y = from_bf16(yb);
    const double ex = nmse_vs(xo.data(), xref.data(), x.size());
    const double ey = nmse_vs(y.data(), yref.data(), y.size()), en = nmse_vs(naive.data(), yref.data(), y.size());
    const size_t bad = nonfinite(y.data(), y.size()) + nonfinite(xo.data(), xo.size());
    char what[128], detail[200];
    snprintf(what, sizeof what, "rmsnorm nt=%lld dim=%lld res=%s", (long long)n_tok, (long long)dim,
             res_kind == 0 ? "none" : res_kind == 1 ? "F32" : "BF16");
    snprintf(detail, sizeof detail, "x nmse=%.3g (<=1e-7) y nmse=%.3g naive=%.3g nonfinite=%zu guard=%s",
             ex, ey, en, bad, guards ? "ok" : "BROKEN");
    report(st == NSTF_OK && ex <= 1e-7 && bf16_rule(ey, en) && bad == 0 && guards, what, detail);
    dfree(dx); dfree(dw); dfree(dr); dfree(dy);
}

/* ---- rope ---------------------------------------------------------------------------- */

static void test_rope(int64_t n_tok, int n_heads, int n_kv, int hd, float base, nstf_rope_mode mode,
                      int max_pos) {
    std::vector<float> q(n_tok * n_heads * hd), k(n_tok * n_kv * hd);
    for (auto &v : q) v = bf(R.normal());
    for (auto &v : k) v = bf(R.normal());
    std::vector<int32_t> pos(n_tok);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = t == 0 ? 0 : R.below(max_pos + 1);
    std::vector<uint16_t> qb = to_bf16(q), kb = to_bf16(k);
    std::vector<float> qref = q, kref = k;
    nstf_ref_rope(qref.data(), pos.data(), n_tok, n_heads, hd, base, mode);
    if (n_kv) nstf_ref_rope(kref.data(), pos.data(), n_tok, n_kv, hd, base, mode);
    /* naive: fp32 angle from powf, fp32 sinf/cosf, bf16 out */
    auto naive_rope = [&](std::vector<float> &v, int nh) {
        const int half = hd / 2;
        for (int64_t t = 0; t < n_tok; t++)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < half; i++) {
                    float *xh = &v[(t * nh + h) * hd];
                    const float th = (float)pos[t] * powf(base, -2.0f * (float)i / (float)hd);
                    const float c = cosf(th), s = sinf(th);
                    const int ia = mode == NSTF_ROPE_NEOX ? i : 2 * i, ib = mode == NSTF_ROPE_NEOX ? i + half : 2 * i + 1;
                    const float a = xh[ia], b = xh[ib];
                    xh[ia] = bf(a * c - b * s);
                    xh[ib] = bf(a * s + b * c);
                }
    };
    std::vector<float> qn = q, kn = k;
    naive_rope(qn, n_heads);
    naive_rope(kn, n_kv);
    dbuf dq = dalloc(qb.size() * 2, qb.data()), dk = dalloc(kb.size() * 2, kb.data());
    dbuf dp = dalloc(n_tok * 4, pos.data());
    nstf_status st = nstf_gpu_rope((uint16_t *)dq.p(), n_kv ? (uint16_t *)dk.p() : nullptr,
                                   (const int32_t *)dp.p(), n_tok, n_heads, n_kv, hd, base, mode, nullptr);
    bool guards = st == NSTF_OK && dfetch(dq, qb.data()) && dfetch(dk, kb.data());
    std::vector<float> qo = from_bf16(qb), ko = from_bf16(kb);
    /* q and k together */
    std::vector<float> o = qo, ref = qref, nv = qn;
    o.insert(o.end(), ko.begin(), ko.end());
    ref.insert(ref.end(), kref.begin(), kref.end());
    nv.insert(nv.end(), kn.begin(), kn.end());
    const double e = nmse_vs(o.data(), ref.data(), o.size()), en = nmse_vs(nv.data(), ref.data(), o.size());
    const size_t bad = nonfinite(o.data(), o.size());
    char what[128], detail[200];
    snprintf(what, sizeof what, "rope %s nt=%lld heads=%d/%d hd=%d base=%g pos<=%d",
             mode == NSTF_ROPE_NEOX ? "neox" : "norm", (long long)n_tok, n_heads, n_kv, hd, (double)base, max_pos);
    snprintf(detail, sizeof detail, "nmse=%.3g naive=%.3g nonfinite=%zu guard=%s", e, en, bad,
             guards ? "ok" : "BROKEN");
    report(st == NSTF_OK && bf16_rule(e, en) && bad == 0 && guards, what, detail);
    dfree(dq); dfree(dk); dfree(dp);
}

/* ---- swiglu ------------------------------------------------------------------------------ */

static void test_swiglu(int64_t n, size_t pad) {
    std::vector<float> g(n), u(n);
    for (auto &v : g) v = bf(R.normal() * 4.0f);
    for (auto &v : u) v = bf(R.normal());
    if (n > 4) { g[1] = -100.0f; g[2] = 100.0f; g[3] = -88.5f; } /* exp overflow side */
    std::vector<float> ref(n), naive(n);
    nstf_ref_swiglu(g.data(), u.data(), ref.data(), n);
    for (int64_t i = 0; i < n; i++) naive[i] = bf(g[i] / (1.0f + expf(-g[i])) * u[i]);
    std::vector<uint16_t> gb = to_bf16(g), ub = to_bf16(u), yb(n);
    dbuf dg = dalloc(n * 2, gb.data(), pad), du = dalloc(n * 2, ub.data(), pad), dy = dalloc(n * 2, nullptr, pad);
    nstf_status st = nstf_gpu_swiglu((const uint16_t *)dg.p(), (const uint16_t *)du.p(), (uint16_t *)dy.p(), n, nullptr);
    bool guards = st == NSTF_OK && dfetch(dy, yb.data()) && dfetch(dg, gb.data());
    std::vector<float> y = from_bf16(yb);
    const double e = nmse_vs(y.data(), ref.data(), n), en = nmse_vs(naive.data(), ref.data(), n);
    const size_t bad = nonfinite(y.data(), n);
    char what[128], detail[200];
    snprintf(what, sizeof what, "swiglu n=%lld%s", (long long)n, pad ? " unaligned" : "");
    snprintf(detail, sizeof detail, "nmse=%.3g naive=%.3g nonfinite=%zu guard=%s", e, en, bad, guards ? "ok" : "BROKEN");
    report(st == NSTF_OK && bf16_rule(e, en) && bad == 0 && guards, what, detail);
    dfree(dg); dfree(du); dfree(dy);
}

/* ---- fused decode GEMV ---------------------------------------------------------------------- *
 * nstf_gpu_gemv_fused against the unfused kernels it replaces, run on the
 * same inputs: rmsnorm -> gemv -> (rope | swiglu | add). The claim is bitwise
 * equality (same sums in the same order, same roundings), so the metric is
 * the count of outputs whose bits differ: 0 allowed. Each unfused
 * kernel is itself checked against the CPU reference above, so equality
 * carries their accuracy over. */
static void test_gemv_fused(nstf_type wt, nstf_gemv_epi epi, bool norm, int64_t n_in, int64_t n_out, int hd,
                            int rope_rows, nstf_rope_mode mode, bool pdl) {
    const float eps = 1e-5f, base = 100000.0f;
    const int32_t pos = 517;
    std::vector<unsigned char> w = make_weights(wt, n_out, n_in);
    std::vector<float> xr(n_in), nw(n_in), xin_f(n_in);
    for (auto &v : xr) v = R.normal() * 3.0f;
    for (auto &v : nw) v = 1.0f + 0.2f * R.normal();
    for (auto &v : xin_f) v = bf(R.normal());
    std::vector<uint16_t> xin = to_bf16(xin_f);
    const int64_t n_y = epi == NSTF_GEMV_SWIGLU ? n_out / 2 : n_out;
    const bool yf32 = epi == NSTF_GEMV_STORE || epi == NSTF_GEMV_ACCUM;
    std::vector<float> y0(n_y);
    for (auto &v : y0) v = R.normal();
    std::vector<float> fr(256);
    if (hd) nstf_gpu_rope_freqs(base, hd, fr.data());

    dbuf dw = dalloc(w.size(), w.data()), dxr = dalloc(n_in * 4, xr.data()), dnw = dalloc(n_in * 4, nw.data());
    dbuf dxin = dalloc(n_in * 2, xin.data()), dxb = dalloc(n_in * 2, nullptr), dp = dalloc(4, &pos);
    dbuf dfr = dalloc(256 * 4, fr.data()), dtmp = dalloc(n_out * 4, nullptr);
    dbuf dya = dalloc(n_y * (yf32 ? 4 : 2), yf32 ? y0.data() : nullptr);
    dbuf dyb = dalloc(n_y * (yf32 ? 4 : 2), yf32 ? y0.data() : nullptr);
    /* unfused */
    bool ok = true;
    const uint16_t *in = (const uint16_t *)dxin.p();
    if (norm) {
        ok = ok && nstf_gpu_rmsnorm((float *)dxr.p(), nullptr, NSTF_TYPE_F32, (const float *)dnw.p(),
                                    (uint16_t *)dxb.p(), 1, n_in, eps, nullptr) == NSTF_OK;
        in = (const uint16_t *)dxb.p();
    }
    switch (epi) {
    case NSTF_GEMV_STORE: ok = ok && nstf_gpu_gemv(wt, dw.p(), in, dya.p(), NSTF_TYPE_F32, 1, n_in, n_out, nullptr) == NSTF_OK; break;
    case NSTF_GEMV_ACCUM:
        ok = ok && nstf_gpu_gemv(wt, dw.p(), in, dtmp.p(), NSTF_TYPE_F32, 1, n_in, n_out, nullptr) == NSTF_OK &&
             nstf_gpu_add((float *)dya.p(), (const float *)dtmp.p(), n_out, nullptr) == NSTF_OK;
        break;
    case NSTF_GEMV_ROPE:
        ok = ok && nstf_gpu_gemv(wt, dw.p(), in, dya.p(), NSTF_TYPE_BF16, 1, n_in, n_out, nullptr) == NSTF_OK &&
             nstf_gpu_rope((uint16_t *)dya.p(), nullptr, (const int32_t *)dp.p(), 1, rope_rows / hd, 0, hd, base,
                           mode, nullptr) == NSTF_OK;
        break;
    case NSTF_GEMV_SWIGLU:
        ok = ok && nstf_gpu_gemv(wt, dw.p(), in, dtmp.p(), NSTF_TYPE_BF16, 1, n_in, n_out, nullptr) == NSTF_OK &&
             nstf_gpu_swiglu((const uint16_t *)dtmp.p(), (const uint16_t *)dtmp.p() + n_y, (uint16_t *)dya.p(), n_y,
                             nullptr) == NSTF_OK;
        break;
    }
    /* fused */
    nstf_gemv_fusion f = {};
    f.norm_x = norm ? (const float *)dxr.p() : nullptr;
    f.norm_w = (const float *)dnw.p();
    f.norm_eps = eps;
    f.epi = epi;
    f.rope_rows = rope_rows;
    f.head_dim = hd;
    f.rope_mode = mode;
    f.pos = (const int32_t *)dp.p();
    f.rope_freqs = (const float *)dfr.p();
    const int prev = nstf_gpu_set_pdl(pdl);
    nstf_status st = nstf_gpu_gemv_fused(wt, dw.p(), norm ? nullptr : (const uint16_t *)dxin.p(), dyb.p(), n_in,
                                         n_out, &f, nullptr);
    nstf_gpu_set_pdl(prev);
    ok = ok && st == NSTF_OK && nstf_gpu_stream_sync(nullptr) == NSTF_OK;
    const size_t yb = n_y * (yf32 ? 4 : 2);
    std::vector<unsigned char> a(yb), b(yb);
    const bool guards = ok && dfetch(dya, a.data()) && dfetch(dyb, b.data());
    size_t diff = 0, bad = 0;
    for (int64_t i = 0; i < n_y; i++) {
        float vb;
        if (yf32) {
            memcpy(&vb, &b[i * 4], 4);
        } else {
            uint16_t hb;
            memcpy(&hb, &b[i * 2], 2);
            vb = nstf_bf16_to_f32(hb);
        }
        diff += memcmp(&a[i * (yf32 ? 4 : 2)], &b[i * (yf32 ? 4 : 2)], yf32 ? 4 : 2) != 0;
        bad += !isfinite(vb);
    }
    static const char *en[] = {"store", "accum", "rope", "swiglu"};
    char what[160], detail[200];
    snprintf(what, sizeof what, "gemv_fused %s %s%s%s %lldx%lld%s", nstf_type_name(wt), norm ? "norm+" : "",
             en[epi], epi == NSTF_GEMV_ROPE ? (mode == NSTF_ROPE_NEOX ? "/neox" : "/norm") : "", (long long)n_in,
             (long long)n_out, pdl ? " pdl" : "");
    snprintf(detail, sizeof detail, "%s; outputs differing from the unfused kernels %zu of %lld (0 allowed), "
             "nonfinite=%zu guard=%s", ok ? "ran" : nstf_last_error(), diff, (long long)n_y, bad, guards ? "ok" : "BROKEN");
    report(ok && diff == 0 && bad == 0 && guards, what, detail);
    dfree(dw); dfree(dxr); dfree(dnw); dfree(dxin); dfree(dxb); dfree(dp); dfree(dfr); dfree(dtmp); dfree(dya);
    dfree(dyb);
}

static void gemv_fused_cases(void) {
    for (nstf_type wt : {NSTF_TYPE_BF16, NSTF_TYPE_F16, NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1,
                         NSTF_TYPE_Q5_0, NSTF_TYPE_Q5_1}) {
        for (int pdl = 0; pdl < 2; pdl++) {
            /* SmolLM2 shapes: q 9 heads, k/v 3 heads of 64 */
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 576, 960, 64, 768, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 576, 960, 64, 768, NSTF_ROPE_NEOX, pdl);
            test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 576, 3072, 0, 0, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_ACCUM, false, 1536, 576, 0, 0, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_STORE, true, 576, 1000, 0, 0, NSTF_ROPE_NORM, pdl);
        }
        /* head_dim 128, Llama-3 8B width; pairs that do not fill the last block */
        test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 4096, 1024, 128, 768, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_ROPE, false, 2048, 1024, 128, 768, NSTF_ROPE_NEOX, false);
        test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 4096, 2 * 100, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_SWIGLU, false, 2048, 2 * 37, 0, 0, NSTF_ROPE_NORM, false);
        test_gemv_fused(wt, NSTF_GEMV_ACCUM, false, 14336, 33, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_ACCUM, true, 4096, 4096, 0, 0, NSTF_ROPE_NORM, true);
        /* wide outputs: the bf16 kernel's 16-row blocks */
        test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 2048, 2 * 8200, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_STORE, true, 576, 20001, 0, 0, NSTF_ROPE_NORM, false);
    }
    /* the super-block types with fused instances: Llama shapes (rows of
     * whole super-blocks), head_dim 64 and 128, both RoPE layouts */
    for (nstf_type wt : {NSTF_TYPE_Q4_K, NSTF_TYPE_Q5_K, NSTF_TYPE_Q6_K}) {
        for (int pdl = 0; pdl < 2; pdl++) {
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 512, 960, 64, 768, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 512, 960, 64, 768, NSTF_ROPE_NEOX, pdl);
            test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 512, 3072, 0, 0, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_ACCUM, false, 1536, 576, 0, 0, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_STORE, true, 512, 1000, 0, 0, NSTF_ROPE_NORM, pdl);
        }
        test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 4096, 1024, 128, 768, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_ROPE, false, 2048, 1024, 128, 768, NSTF_ROPE_NEOX, false);
        test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 4096, 2 * 100, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_ACCUM, false, 14336, 33, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_ACCUM, true, 4096, 4096, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 2048, 2 * 8200, 0, 0, NSTF_ROPE_NORM, true);
        test_gemv_fused(wt, NSTF_GEMV_STORE, true, 4096, 20001, 0, 0, NSTF_ROPE_NORM, false);
    }
    /* types and shapes it does not take are refused, not run */
    unsigned char *dummy = nullptr;
    must(nstf_gpu_malloc((void **)&dummy, 4096), "gpu malloc");
    nstf_gemv_fusion f = {};
    f.epi = NSTF_GEMV_ACCUM;
    nstf_status st = nstf_gpu_gemv_fused(NSTF_TYPE_F32, dummy, (const uint16_t *)dummy, dummy, 64, 4, &f, nullptr);
    report(st == NSTF_ERR_UNSUPPORTED && !nstf_gpu_gemv_fusable(NSTF_TYPE_F32, dummy, 64, 0),
           "gemv_fused: F32 weights refused", nstf_last_error());
    f.epi = NSTF_GEMV_SWIGLU;
    st = nstf_gpu_gemv_fused(NSTF_TYPE_BF16, dummy, (const uint16_t *)dummy, dummy, 64, 5, &f, nullptr);
    report(st == NSTF_ERR_INVALID_ARG, "gemv_fused: SwiGLU with odd rows refused", nstf_last_error());
    report(!nstf_gpu_gemv_fusable(NSTF_TYPE_BF16, dummy, 40000, 1), "gemv_fused: norm prologue wider than staging refused",
           "n_in 40000");
    report(!nstf_gpu_gemv_fusable(NSTF_TYPE_Q2_K, dummy, 256, 0) && !nstf_gpu_gemv_fusable(NSTF_TYPE_IQ4_NL, dummy, 256, 0),
           "gemv_fused: types without fused instances (Q2_K, IQ4_NL) refused", "");
    report(!nstf_gpu_gemv_fusable(NSTF_TYPE_Q4_K, dummy + 2, 256, 0),
           "gemv_fused: Q4_K weights less aligned than their blocks refused", "");
    nstf_gpu_free(dummy);
}

/* ---- argmax --------------------------------------------------------------------------------- */

static void test_argmax(int64_t n_rows, int64_t n, nstf_type xt, bool nans) {
    std::vector<float> x(n_rows * n);
    for (auto &v : x) v = R.normal();
    if (xt == NSTF_TYPE_BF16) for (auto &v : x) v = bf(v);
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = &x[r * n];
        if (n >= 3) { /* planted tie: two equal maxima, the first must win */
            const int64_t a = R.below((int)n), b = R.below((int)n);
            xr[a] = xr[b] = 1000.0f + (float)r;
            xr[R.below((int)n)] = -INFINITY;
        }
        if (nans && n >= 2) { xr[0] = NAN; xr[n / 2] = NAN; }
    }
    std::vector<int32_t> want(n_rows);
    if (!nans) nstf_ref_argmax(x.data(), want.data(), n_rows, n);
    else /* NaN never wins: first maximal non-NaN */
        for (int64_t r = 0; r < n_rows; r++) {
            int64_t best = -1;
            for (int64_t j = 0; j < n; j++) {
                const float v = x[r * n + j];
                if (!isnan(v) && (best < 0 || v > x[r * n + best])) best = j;
            }
            want[r] = best < 0 ? 0 : (int32_t)best;
        }
    dbuf dx;
    if (xt == NSTF_TYPE_BF16) { std::vector<uint16_t> xb = to_bf16(x); dx = dalloc(xb.size() * 2, xb.data()); }
    else dx = dalloc(x.size() * 4, x.data());
    dbuf ds = dalloc(nstf_gpu_argmax_scratch_bytes(n_rows, n), nullptr), dout = dalloc(n_rows * 4, nullptr);
    nstf_status st = nstf_gpu_argmax(dx.p(), xt, (int32_t *)dout.p(), n_rows, n, ds.p(), nullptr);
    std::vector<int32_t> got(n_rows, -7);
    bool guards = st == NSTF_OK && dfetch(dout, got.data()) && dfetch(ds, std::vector<char>(ds.bytes + 1).data());
    int wrong = 0;
    for (int64_t r = 0; r < n_rows; r++) wrong += got[r] != want[r];
    char what[128], detail[200];
    snprintf(what, sizeof what, "argmax %s rows=%lld n=%lld%s", nstf_type_name(xt), (long long)n_rows,
             (long long)n, nans ? " +NaN" : "");
    snprintf(detail, sizeof detail, "wrong=%d (exact; got %d want %d) guard=%s", wrong, got[0], want[0],
             guards ? "ok" : "BROKEN");
    report(st == NSTF_OK && wrong == 0 && guards, what, detail);
    dfree(dx); dfree(ds); dfree(dout);
}

/* ---- kv write ---------------------------------------------------------------------------------- */

static void test_kv_write(int64_t n_tok, int64_t kv_dim, int64_t n_ctx) {
    std::vector<uint16_t> k(n_tok * kv_dim), v(n_tok * kv_dim), kc(n_ctx * kv_dim), vc(n_ctx * kv_dim);
    for (auto &e : k) e = (uint16_t)R.next();
    for (auto &e : v) e = (uint16_t)R.next();
    for (auto &e : kc) e = (uint16_t)R.next();
    for (auto &e : vc) e = (uint16_t)R.next();
    std::vector<int32_t> pos(n_tok);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)((t * 5 + 2) % n_ctx);
    if (n_tok >= 3) { pos[n_tok - 1] = -1; pos[n_tok - 2] = (int32_t)n_ctx; } /* skipped */
    std::vector<uint16_t> kwant = kc, vwant = vc;
    for (int64_t t = 0; t < n_tok; t++)
        if (pos[t] >= 0 && pos[t] < n_ctx) {
            memcpy(&kwant[pos[t] * kv_dim], &k[t * kv_dim], kv_dim * 2);
            memcpy(&vwant[pos[t] * kv_dim], &v[t * kv_dim], kv_dim * 2);
        }
    dbuf dk = dalloc(k.size() * 2, k.data()), dv = dalloc(v.size() * 2, v.data());
    dbuf dkc = dalloc(kc.size() * 2, kc.data()), dvc = dalloc(vc.size() * 2, vc.data()), dp = dalloc(n_tok * 4, pos.data());
    nstf_status st = nstf_gpu_kv_write((const uint16_t *)dk.p(), (const uint16_t *)dv.p(), (uint16_t *)dkc.p(),
                                       (uint16_t *)dvc.p(), (const int32_t *)dp.p(), n_tok, kv_dim, n_ctx, nullptr);
    bool guards = st == NSTF_OK && dfetch(dkc, kc.data()) && dfetch(dvc, vc.data());
    const bool same = kc == kwant && vc == vwant;
    char what[128], detail[160];
    snprintf(what, sizeof what, "kv_write nt=%lld kv_dim=%lld n_ctx=%lld", (long long)n_tok, (long long)kv_dim, (long long)n_ctx);
    snprintf(detail, sizeof detail, "%s (bitwise, untouched rows kept, bad positions skipped) guard=%s",
             same ? "equal" : "DIFFERENT", guards ? "ok" : "BROKEN");
    report(st == NSTF_OK && same && guards, what, detail);
    dfree(dk); dfree(dv); dfree(dkc); dfree(dvc); dfree(dp);
}

/* ---- errors -------------------------------------------------------------------------------------- */

static void test_errors(void) {
    uint16_t dummy[8];
    nstf_status st = nstf_gpu_gemv(NSTF_TYPE_Q4_0, dummy, dummy, dummy, NSTF_TYPE_F32, 1, 33, 4, nullptr);
    report(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "n_in 33"),
           "error: gemv n_in not a block multiple", nstf_last_error());
    /* the new block types are read as wide as their blocks stay aligned:
     * a less aligned matrix or table is refused before any launch */
    unsigned char *dev = nullptr;
    must(nstf_gpu_malloc((void **)&dev, 4096), "gpu malloc");
    st = nstf_gpu_gemv(NSTF_TYPE_Q4_K, dev + 8, (const uint16_t *)dev, dev, NSTF_TYPE_F32, 1, 256, 4, nullptr);
    report(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "16-byte aligned"),
           "error: gemv Q4_K weights not 16-byte aligned", nstf_last_error());
    st = nstf_gpu_get_rows(NSTF_TYPE_IQ4_XS, dev + 4, 2, (const int32_t *)dev, dev, NSTF_TYPE_F32, 1, 256, nullptr);
    report(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "8-byte aligned"),
           "error: get_rows IQ4_XS table not 8-byte aligned", nstf_last_error());
    nstf_gpu_free(dev);
    char host[16];
    st = nstf_gpu_memcpy_d2h(host, (void *)(uintptr_t)0x10, sizeof host, nullptr);
    report(st == NSTF_ERR_GPU && strstr(nstf_last_error(), "failed at") && strstr(nstf_last_error(), "device"),
           "error: GPU_CHECK records statement, file:line, device", nstf_last_error());
}

int main(void) {
    if (nstf_gpu_device_count() < 1) {
        printf("test_ops_gpu: no GPU, skipped\n");
        return 77;
    }
    nstf_gpu_info info;
    must(nstf_gpu_query(0, &info), "query");
    printf("device 0: %s (%s), %d SMs/CUs, wave %d, %.1f GiB (%.1f free), L2 %.0f MiB\n", info.name,
           info.arch, info.n_sm, info.wave_size, info.total_mem / 1073741824.0,
           info.free_mem / 1073741824.0, info.l2_bytes / 1048576.0);

    test_errors();
    gemv_cases();
    gemv_fused_cases();
    for (nstf_type t : k_wtypes) {
        const bool q = is_quant(t), sb = is_super(t);
        for (nstf_type ot : {NSTF_TYPE_F32, NSTF_TYPE_BF16}) {
            test_get_rows(t, 50, sb ? 256 : 32, 1, ot);
            test_get_rows(t, 50, sb ? 512 : q ? 96 : 100, 5, ot);
            test_get_rows(t, 1000, sb ? 768 : 576, 9, ot);
            /* prefill-sized: 300 rows of a 300-row table */
            test_get_rows(t, 300, sb ? 1024 : 1056, 300, ot);
        }
        if (!q) test_get_rows(t, 10, 7, 4, NSTF_TYPE_F32);
    }
    for (int rk = 0; rk < 3; rk++) {
        test_rmsnorm(1, 1, rk);
        test_rmsnorm(3, 7, rk);
        test_rmsnorm(2, 576, rk);
        test_rmsnorm(5, 4096, rk);
        test_rmsnorm(1, 5000, rk);
    }
    for (nstf_rope_mode m : {NSTF_ROPE_NORM, NSTF_ROPE_NEOX}) {
        test_rope(1, 9, 3, 64, 100000.0f, m, 8192);
        test_rope(4, 32, 8, 128, 500000.0f, m, 131071);
        test_rope(3, 4, 0, 6, 10000.0f, m, 100);
        test_rope(2, 5, 5, 256, 10000.0f, m, 1 << 20);
    }
    for (int64_t n : {1, 2, 7, 1536, 43009}) {
        test_swiglu(n, 0);
        if (n > 1) test_swiglu(n, 2);
    }
    for (nstf_type xt : {NSTF_TYPE_F32, NSTF_TYPE_BF16}) {
        test_argmax(1, 1, xt, false);
        test_argmax(2, 7, xt, false);
        test_argmax(1, 8192, xt, false);
        test_argmax(3, 8193, xt, false);
        test_argmax(1, 49152, xt, false);
        test_argmax(2, 128256, xt, false);
        test_argmax(2, 1000, xt, true);
    }
    test_kv_write(1, 192, 16);
    test_kv_write(5, 192, 16);
    test_kv_write(4, 7, 9);
    test_kv_write(8, 1024, 64);

    printf("test_ops_gpu: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
