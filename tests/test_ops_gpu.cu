/* test_ops_gpu.cu — the GPU op-comparison test: every kernel of
 * src/ops/gpu against a CPU reference, one line per case, then the count of
 * cases and checks; exit 1 on any failure, 77 when there is no GPU. The
 * harness (buffers, guards, poison, metrics, the bf16 rule) is
 * tests/gpu_harness.h; the fused decode GEMV cases are ops_gpu_fused.h.
 *
 * References: the scalar nstf_ref_* (double accumulation, the fp64 oracle)
 * where they cover the op, fp64 loops here otherwise. Metrics:
 *  - fp32 outputs: NMSE <= 1e-7 against the fp64 reference;
 *  - bf16 outputs: the bf16 rule of gpu_harness.h, NMSE against the fp64
 *    reference at most 2x that of a naive same-precision implementation
 *    computed here (bf16 inputs, fp32 math, bf16 output);
 *  - exact ops (gather, argmax, KV write, fused vs unfused GEMV): bitwise
 *    equality.
 * Every output is poisoned (0xFF bytes: NaN in f32 and bf16) before the
 * kernel runs, every device buffer carries guard regions that must come
 * back intact after every launch, and any NaN/Inf in an output fails the
 * case. Shapes are not multiples of the tile/vector widths, and the cases
 * reach every launch configuration the launchers choose (GEMV: each weight
 * type's vector and scalar paths, n_tok 1..8 and a split batch, one and
 * several x chunks, vector and scalar x staging, F32 and BF16 output).
 *
 * Usage: test_ops_gpu [TYPE...] — with weight type names (q6_k, q8_0, ...),
 * only the cases of those types (GEMV, fused GEMV, gather), for a quick
 * run on a device after a change to one type's kernels; the full run
 * (no argument) is the test. */
#include "core/switches.h"
#include "gpu_harness.h"
#include "test_quant.h"

static test_rng R = {0x9E3779B97F4A7C15ull};
static float normal(void) { return rng_normal(&R); }
static int below(int n) { return (int)(rng_next(&R) % (uint64_t)n); }

static float bf(float f) { return gh_bf(f); }

/* ---- GEMV -------------------------------------------------------------------- */

static const nstf_type k_wtypes[] = {NSTF_TYPE_F32,    NSTF_TYPE_F16,  NSTF_TYPE_BF16, NSTF_TYPE_Q8_0,
                                     NSTF_TYPE_Q4_0,   NSTF_TYPE_Q4_1, NSTF_TYPE_Q5_0, NSTF_TYPE_Q5_1,
                                     NSTF_TYPE_IQ4_NL, NSTF_TYPE_Q2_K, NSTF_TYPE_Q3_K, NSTF_TYPE_Q4_K,
                                     NSTF_TYPE_Q5_K,   NSTF_TYPE_Q6_K, NSTF_TYPE_IQ4_XS};

/* The weight types named on the command line (empty: every case runs). */
static std::vector<nstf_type> g_only;
static bool want(nstf_type t) {
    if (g_only.empty()) return true;
    for (nstf_type o : g_only)
        if (o == t) return true;
    return false;
}

static bool is_quant(nstf_type t) { return nstf_type_is_quantized(t); }
static bool is_super(nstf_type t) { return nstf_type_block_elems(t) == 256; }

/* Random weights of type `t`: the reference quantizer where there is one,
 * random codes under sane scales for the other types (test_quant.h). */
static std::vector<unsigned char> make_weights(nstf_type t, int64_t rows, int64_t cols) {
    uint64_t rb = 0;
    nstf_type_row_bytes(t, cols, &rb);
    std::vector<unsigned char> w(rows * rb);
    std::vector<float> f(cols);
    test_rng tr = {rng_next(&R) | 1};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) f[i] = normal() * 0.05f;
        test_quantize_row(t, f.data(), &w[r * rb], cols, &tr);
    }
    return w;
}

static void test_gemv(nstf_type wt, int64_t n_tok, int64_t n_in, int64_t n_out, nstf_type yt,
                      size_t w_pad, size_t x_pad) {
    std::vector<unsigned char> w = make_weights(wt, n_out, n_in);
    std::vector<float> xf(n_tok * n_in);
    for (auto &v : xf) v = bf(normal());
    std::vector<uint16_t> xb = gh_to_bf16(xf);

    /* fp64 reference (x exactly representable: it is bf16) */
    std::vector<float> ref(n_tok * n_out);
    nstf_ref_matmul(wt, w.data(), xf.data(), ref.data(), n_tok, n_in, n_out);

    gh_begin("gemv %s nt=%lld %lldx%lld y=%s%s%s", nstf_type_name(wt), (long long)n_tok, (long long)n_in,
             (long long)n_out, nstf_type_name(yt), w_pad ? " w+pad" : "", x_pad ? " x+pad" : "");
    gh_buf dw = gh_alloc_weights(wt, n_in, n_out, w.data(), w_pad), dx = gh_alloc(xb.size() * 2, xb.data(), x_pad);
    const size_t ysz = yt == NSTF_TYPE_BF16 ? 2 : 4;
    gh_buf dy = gh_alloc(n_tok * n_out * ysz, nullptr);
    gh_note("[%s]", nstf_gpu_gemv_config(wt, dw.p(), dx.as<const uint16_t>(), n_tok, n_in));
    gh_launched(nstf_gpu_gemv(wt, dw.p(), dx.as<const uint16_t>(), dy.p(), yt, n_tok, n_in, n_out, nullptr), "gemv");
    std::vector<float> y = gh_fetch_floats(dy, yt, n_tok * n_out);
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
        gh_compare("y", y.data(), ref.data(), y.size(), gh_tol_naive(naive.data()));
    } else {
        gh_compare("y", y.data(), ref.data(), y.size(), gh_tol_fp32());
    }
    gh_free(dw); gh_free(dx); gh_free(dy);
    gh_end();
}

static void gemv_cases(void) {
    for (nstf_type wt : k_wtypes) {
        if (!want(wt)) continue;
        const bool q = is_quant(wt), sb = is_super(wt);
        /* (n_in, n_out): tiny, odd row count, several chunks at nt = 8 (cap
         * 2048 elements for the 32-element types' bf16 staging, 1024 for the
         * super-block kernel's fp32), a model shape. Float types add rows that
         * are not 16-byte multiples (scalar path). */
        const int64_t shapes_q[][2] = {{32, 1}, {96, 37}, {2080, 45}, {576, 1536}};
        /* fp32 outputs keep NMSE <= 1e-7: Q3_K 256x1 at nt = 2 draws two
         * dot products ~150x below the typical (cancelling sums), where the
         * super-block kernel's 1 + u / 128 codes gave 1.6e-7 (a plain fp32
         * sum 4e-10); its codes now sit at the byte's top bits (gemvk.cu) */
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
        /* Q4_0, IQ4_NL and Q8_0 rows of a multiple of 256 (the GPU's split
         * layout) at every token count, and in several x chunks at 8 tokens;
         * Q8_0 rows at the split layout's length bound (34,560 elements)
         * and just past it (the file's layout) */
        if (wt == NSTF_TYPE_Q4_0 || wt == NSTF_TYPE_IQ4_NL || wt == NSTF_TYPE_Q8_0) {
            for (int nt = 1; nt <= 8; nt++) test_gemv(wt, nt, 512, 37, nt % 2 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 8, 4096, 45, NSTF_TYPE_BF16, 0, 0);
            test_gemv(wt, 1, 14336, 40, NSTF_TYPE_BF16, 0, 0);
        }
        /* Q6_K rows of a multiple of 2048 (its split layout) likewise, and
         * at the layout's length bound (43,008) and past it */
        if (wt == NSTF_TYPE_Q6_K) {
            for (int nt = 1; nt <= 8; nt++) test_gemv(wt, nt, 2048, 37, nt % 2 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 8, 4096, 45, NSTF_TYPE_BF16, 0, 0);
            test_gemv(wt, 1, 14336, 40, NSTF_TYPE_BF16, 0, 0);
            test_gemv(wt, 1, 43008, 9, NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 1, 45056, 9, NSTF_TYPE_F32, 0, 0);
        }
        if (wt == NSTF_TYPE_Q8_0) {
            test_gemv(wt, 1, 34560, 9, NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 1, 34816, 9, NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 2, 34560, 9, NSTF_TYPE_BF16, 0, 0);
        }
        /* wide outputs: the quantized kernels' 32-row blocks (n_out >= 8192) */
        if (q) {
            test_gemv(wt, 1, 256, 8200, NSTF_TYPE_F32, 0, 0);
            test_gemv(wt, 3, 256, 8200, NSTF_TYPE_BF16, 0, 0);
        }
    }
}

/* ---- get_rows ------------------------------------------------------------------- */

/* whole: ids NULL, every row in order (the prefill's dequantization of a
 * matrix; n_tok = n_rows) */
static void test_get_rows(nstf_type t, int64_t n_rows, int64_t dim, int64_t n_tok, nstf_type ot, bool whole = false) {
    std::vector<unsigned char> table = make_weights(t, n_rows, dim);
    std::vector<int32_t> ids(n_tok);
    for (size_t k = 0; k < ids.size(); k++) ids[k] = whole ? (int32_t)k : below((int)n_rows);
    const bool bad_id = n_tok >= 3 && !whole;
    if (bad_id) { ids[1] = -1; ids[2] = (int32_t)n_rows; } /* rows of NaN, no OOB read */
    std::vector<float> ref(n_tok * dim);
    for (int64_t k = 0; k < n_tok; k++) {
        if (ids[k] < 0 || ids[k] >= n_rows) {
            for (int64_t i = 0; i < dim; i++) ref[k * dim + i] = NAN;
        } else {
            nstf_ref_get_rows(t, table.data(), &ids[k], &ref[k * dim], 1, dim);
        }
    }
    gh_begin("get_rows %s rows=%lld dim=%lld nt=%lld out=%s%s", nstf_type_name(t), (long long)n_rows,
             (long long)dim, (long long)n_tok, nstf_type_name(ot), bad_id ? " +bad ids" : whole ? " whole (ids NULL)" : "");
    gh_buf dt = gh_alloc_weights(t, dim, n_rows, table.data()), di = gh_alloc(n_tok * 4, ids.data());
    const size_t osz = ot == NSTF_TYPE_BF16 ? 2 : 4;
    gh_buf dout = gh_alloc(n_tok * dim * osz, nullptr);
    gh_launched(nstf_gpu_get_rows(t, dt.p(), n_rows, whole ? nullptr : di.as<const int32_t>(), dout.p(), ot, n_tok, dim,
                                  nullptr),
                "get_rows");
    std::vector<float> out = gh_fetch_floats(dout, ot, n_tok * dim);
    /* exact: F32 equals the reference dequantization; BF16 equals its
     * rounding (which is the naive implementation, so 2x-naive holds). A bad
     * id's row must be NaN; every other value finite. */
    size_t mismatch = 0, unexpected_nan = 0;
    for (size_t i = 0; i < out.size(); i++) {
        const float want = ot == NSTF_TYPE_BF16 ? bf(ref[i]) : ref[i];
        if (isnan(want)) { mismatch += !isnan(out[i]); continue; }
        unexpected_nan += !isfinite(out[i]);
        mismatch += memcmp(&out[i], &want, 4) != 0;
    }
    CHECK(mismatch == 0, "get_rows: %zu values differ from the reference (exact)", mismatch);
    CHECK(unexpected_nan == 0, "get_rows: %zu NaN/Inf outside the bad-id rows", unexpected_nan);
    gh_note("mismatches=%zu (exact) nonfinite=%zu", mismatch, unexpected_nan);
    gh_free(dt); gh_free(di); gh_free(dout);
    gh_end();
}

/* ---- rmsnorm ---------------------------------------------------------------------- */

static void test_rmsnorm(int64_t n_tok, int64_t dim, int res_kind /* 0 none, 1 F32, 2 BF16 */) {
    const float eps = 1e-5f;
    std::vector<float> x(n_tok * dim), res(n_tok * dim), w(dim);
    for (auto &v : x) v = normal() * 3.0f;
    for (auto &v : res) v = normal();
    for (auto &v : w) v = 1.0f + 0.2f * normal();
    if (res_kind == 2) for (auto &v : res) v = bf(v);
    std::vector<uint16_t> resb = gh_to_bf16(res);
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
    gh_begin("rmsnorm nt=%lld dim=%lld res=%s", (long long)n_tok, (long long)dim,
             res_kind == 0 ? "none" : res_kind == 1 ? "F32" : "BF16");
    gh_buf dx = gh_alloc(x.size() * 4, x.data()), dw = gh_alloc(dim * 4, w.data());
    gh_buf dr = res_kind == 2 ? gh_alloc(resb.size() * 2, resb.data()) : gh_alloc(res.size() * 4, res.data());
    gh_buf dy = gh_alloc(x.size() * 2, nullptr);
    gh_launched(nstf_gpu_rmsnorm(dx.as<float>(), res_kind ? dr.p() : nullptr,
                                 res_kind == 2 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32, dw.as<const float>(),
                                 dy.as<uint16_t>(), n_tok, dim, eps, nullptr),
                "rmsnorm");
    std::vector<float> xo = gh_fetch_floats(dx, NSTF_TYPE_F32, x.size());
    std::vector<float> y = gh_fetch_floats(dy, NSTF_TYPE_BF16, x.size());
    gh_compare("x", xo.data(), xref.data(), x.size(), gh_tol_fp32());
    gh_compare("y", y.data(), yref.data(), y.size(), gh_tol_naive(naive.data()));
    gh_free(dx); gh_free(dw); gh_free(dr); gh_free(dy);
    gh_end();
}

/* ---- rope ---------------------------------------------------------------------------- */

static void test_rope(int64_t n_tok, int n_heads, int n_kv, int hd, float base, nstf_rope_mode mode,
                      int max_pos) {
    std::vector<float> q(n_tok * n_heads * hd), k(n_tok * n_kv * hd);
    for (auto &v : q) v = bf(normal());
    for (auto &v : k) v = bf(normal());
    std::vector<int32_t> pos(n_tok);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = t == 0 ? 0 : below(max_pos + 1);
    std::vector<uint16_t> qb = gh_to_bf16(q), kb = gh_to_bf16(k);
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
    gh_begin("rope %s nt=%lld heads=%d/%d hd=%d base=%g pos<=%d", mode == NSTF_ROPE_NEOX ? "neox" : "norm",
             (long long)n_tok, n_heads, n_kv, hd, (double)base, max_pos);
    gh_buf dq = gh_alloc(qb.size() * 2, qb.data()), dk = gh_alloc(kb.size() * 2, kb.data());
    gh_buf dp = gh_alloc(n_tok * 4, pos.data());
    gh_launched(nstf_gpu_rope(dq.as<uint16_t>(), n_kv ? dk.as<uint16_t>() : nullptr, dp.as<const int32_t>(), n_tok,
                              n_heads, n_kv, hd, base, mode, nullptr),
                "rope");
    std::vector<float> o = gh_fetch_floats(dq, NSTF_TYPE_BF16, q.size());
    std::vector<float> ko = gh_fetch_floats(dk, NSTF_TYPE_BF16, k.size());
    /* q and k together */
    std::vector<float> ref = qref, nv = qn;
    o.insert(o.end(), ko.begin(), ko.end());
    ref.insert(ref.end(), kref.begin(), kref.end());
    nv.insert(nv.end(), kn.begin(), kn.end());
    gh_compare("q,k", o.data(), ref.data(), o.size(), gh_tol_naive(nv.data()));
    gh_free(dq); gh_free(dk); gh_free(dp);
    gh_end();
}

/* ---- swiglu ------------------------------------------------------------------------------ */

static void test_swiglu(int64_t n, size_t pad) {
    std::vector<float> g(n), u(n);
    for (auto &v : g) v = bf(normal() * 4.0f);
    for (auto &v : u) v = bf(normal());
    if (n > 4) { g[1] = -100.0f; g[2] = 100.0f; g[3] = -88.5f; } /* exp overflow side */
    std::vector<float> ref(n), naive(n);
    nstf_ref_swiglu(g.data(), u.data(), ref.data(), n);
    for (int64_t i = 0; i < n; i++) naive[i] = bf(g[i] / (1.0f + expf(-g[i])) * u[i]);
    std::vector<uint16_t> gb = gh_to_bf16(g), ub = gh_to_bf16(u);
    gh_begin("swiglu n=%lld%s", (long long)n, pad ? " unaligned" : "");
    gh_buf dg = gh_alloc(n * 2, gb.data(), pad), du = gh_alloc(n * 2, ub.data(), pad), dy = gh_alloc(n * 2, nullptr, pad);
    gh_launched(nstf_gpu_swiglu(dg.as<const uint16_t>(), du.as<const uint16_t>(), dy.as<uint16_t>(), n, nullptr),
                "swiglu");
    std::vector<float> y = gh_fetch_floats(dy, NSTF_TYPE_BF16, n);
    gh_compare("y", y.data(), ref.data(), n, gh_tol_naive(naive.data()));
    gh_free(dg); gh_free(du); gh_free(dy);
    gh_end();
}

#include "ops_gpu_fused.h"

/* ---- argmax --------------------------------------------------------------------------------- */

static void test_argmax(int64_t n_rows, int64_t n, nstf_type xt, bool nans) {
    std::vector<float> x(n_rows * n);
    for (auto &v : x) v = normal();
    if (xt == NSTF_TYPE_BF16) for (auto &v : x) v = bf(v);
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = &x[r * n];
        if (n >= 3) { /* planted tie: two equal maxima, the first must win */
            const int64_t a = below((int)n), b = below((int)n);
            xr[a] = xr[b] = 1000.0f + (float)r;
            xr[below((int)n)] = -INFINITY;
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
    gh_begin("argmax %s rows=%lld n=%lld%s", nstf_type_name(xt), (long long)n_rows, (long long)n, nans ? " +NaN" : "");
    gh_buf dx;
    if (xt == NSTF_TYPE_BF16) { std::vector<uint16_t> xb = gh_to_bf16(x); dx = gh_alloc(xb.size() * 2, xb.data()); }
    else dx = gh_alloc(x.size() * 4, x.data());
    gh_buf ds = gh_alloc(nstf_gpu_argmax_scratch_bytes(n_rows, n), nullptr), dout = gh_alloc(n_rows * 4, nullptr);
    gh_launched(nstf_gpu_argmax(dx.p(), xt, dout.as<int32_t>(), n_rows, n, ds.p(), nullptr), "argmax");
    std::vector<int32_t> got(n_rows, -7);
    gh_fetch(dout, got.data());
    int wrong = 0;
    for (int64_t r = 0; r < n_rows; r++) wrong += got[r] != want[r];
    CHECK(wrong == 0, "argmax: %d of %lld rows wrong (row 0: got %d, want %d)", wrong, (long long)n_rows, got[0],
          want[0]);
    gh_note("wrong=%d (exact; got %d want %d)", wrong, got[0], want[0]);
    gh_free(dx); gh_free(ds); gh_free(dout);
    gh_end();
}

/* ---- kv write ---------------------------------------------------------------------------------- */

static void test_kv_write(int64_t n_tok, int64_t kv_dim, int64_t n_ctx) {
    std::vector<uint16_t> k(n_tok * kv_dim), v(n_tok * kv_dim), kc(n_ctx * kv_dim), vc(n_ctx * kv_dim);
    for (auto &e : k) e = (uint16_t)rng_next(&R);
    for (auto &e : v) e = (uint16_t)rng_next(&R);
    for (auto &e : kc) e = (uint16_t)rng_next(&R);
    for (auto &e : vc) e = (uint16_t)rng_next(&R);
    std::vector<int32_t> pos(n_tok);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)((t * 5 + 2) % n_ctx);
    if (n_tok >= 3) { pos[n_tok - 1] = -1; pos[n_tok - 2] = (int32_t)n_ctx; } /* skipped */
    std::vector<uint16_t> kwant = kc, vwant = vc;
    for (int64_t t = 0; t < n_tok; t++)
        if (pos[t] >= 0 && pos[t] < n_ctx) {
            memcpy(&kwant[pos[t] * kv_dim], &k[t * kv_dim], kv_dim * 2);
            memcpy(&vwant[pos[t] * kv_dim], &v[t * kv_dim], kv_dim * 2);
        }
    gh_begin("kv_write nt=%lld kv_dim=%lld n_ctx=%lld", (long long)n_tok, (long long)kv_dim, (long long)n_ctx);
    gh_buf dk = gh_alloc(k.size() * 2, k.data()), dv = gh_alloc(v.size() * 2, v.data());
    gh_buf dkc = gh_alloc(kc.size() * 2, kc.data()), dvc = gh_alloc(vc.size() * 2, vc.data());
    gh_buf dp = gh_alloc(n_tok * 4, pos.data());
    gh_launched(nstf_gpu_kv_write(dk.as<const uint16_t>(), dv.as<const uint16_t>(), dkc.as<uint16_t>(),
                                  dvc.as<uint16_t>(), dp.as<const int32_t>(), n_tok, kv_dim, n_ctx, nullptr),
                "kv_write");
    gh_fetch(dkc, kc.data());
    gh_fetch(dvc, vc.data());
    const bool same = kc == kwant && vc == vwant;
    CHECK(same, "kv_write: cache differs (written rows, kept rows or skipped positions)");
    gh_note("%s (bitwise, untouched rows kept, bad positions skipped)", same ? "equal" : "DIFFERENT");
    gh_free(dk); gh_free(dv); gh_free(dkc); gh_free(dvc); gh_free(dp);
    gh_end();
}

/* ---- errors -------------------------------------------------------------------------------------- */

static void test_errors(void) {
    uint16_t dummy[8];
    gh_begin("error: gemv n_in not a block multiple");
    nstf_status st = nstf_gpu_gemv(NSTF_TYPE_Q4_0, dummy, dummy, dummy, NSTF_TYPE_F32, 1, 33, 4, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "n_in 33"), "status %d: %s", (int)st,
          nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    /* the new block types are read as wide as their blocks stay aligned:
     * a less aligned matrix or table is refused before any launch */
    gh_buf dev = gh_alloc(4096, nullptr);
    unsigned char *d8 = dev.as<unsigned char>();
    gh_begin("error: gemv Q4_K weights not 16-byte aligned");
    st = nstf_gpu_gemv(NSTF_TYPE_Q4_K, d8 + 8, dev.as<const uint16_t>(), d8, NSTF_TYPE_F32, 1, 256, 4, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "16-byte aligned"), "status %d: %s", (int)st,
          nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    gh_begin("error: get_rows IQ4_XS table not 8-byte aligned");
    st = nstf_gpu_get_rows(NSTF_TYPE_IQ4_XS, d8 + 4, 2, dev.as<const int32_t>(), d8, NSTF_TYPE_F32, 1, 256, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "8-byte aligned"), "status %d: %s", (int)st,
          nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    gh_begin("error: gemv Q4_0 rows of 512 (split layout) not 16-byte aligned");
    st = nstf_gpu_gemv(NSTF_TYPE_Q4_0, d8 + 2, dev.as<const uint16_t>(), d8, NSTF_TYPE_F32, 1, 512, 2, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "16-byte aligned"), "status %d: %s", (int)st,
          nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    gh_begin("error: get_rows without ids past the table's rows");
    st = nstf_gpu_get_rows(NSTF_TYPE_F32, dev.p(), 2, nullptr, d8, NSTF_TYPE_F32, 3, 8, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG, "status %d: %s", (int)st, nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    gh_begin("error: gemv Q8_0 rows of 512 (split layout) not 16-byte aligned");
    st = nstf_gpu_gemv(NSTF_TYPE_Q8_0, d8 + 2, dev.as<const uint16_t>(), d8, NSTF_TYPE_F32, 1, 512, 2, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "16-byte aligned"), "status %d: %s", (int)st,
          nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    for (nstf_type t : {NSTF_TYPE_Q4_0, NSTF_TYPE_IQ4_NL, NSTF_TYPE_Q8_0, NSTF_TYPE_Q6_K}) {
        const int64_t n = t == NSTF_TYPE_Q6_K ? 2048 : 256;
        gh_begin("error: relayout of %s rows of %lld not 16-byte aligned", nstf_type_name(t), (long long)n);
        st = nstf_gpu_weights_relayout(t, d8 + 2, n, 1, nullptr);
        CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "16-byte aligned"), "status %d: %s", (int)st,
              nstf_last_error());
        gh_note("%s", nstf_last_error());
        gh_end();
    }
    gh_free(dev);
    gh_begin("error: GPU_CHECK records statement, file:line, device");
    char host[16];
    st = nstf_gpu_memcpy_d2h(host, (void *)(uintptr_t)0x10, sizeof host, nullptr);
    CHECK(st == NSTF_ERR_GPU && strstr(nstf_last_error(), "failed at") && strstr(nstf_last_error(), "device"),
          "status %d: %s", (int)st, nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        nstf_type t;
        if (!nstf_type_from_name(argv[i], &t)) {
            fprintf(stderr, "test_ops_gpu: unknown weight type '%s'\nusage: test_ops_gpu [TYPE...]\n", argv[i]);
            return 2;
        }
        g_only.push_back(t);
    }
    if (!gh_init("test_ops_gpu")) return TEST_SKIP;

    if (g_only.empty()) test_errors();
    gemv_cases();
    gemv_fused_cases();
    gemv_fused_qkv_cases();
    for (nstf_type t : k_wtypes) {
        if (!want(t)) continue;
        const bool q = is_quant(t), sb = is_super(t);
        for (nstf_type ot : {NSTF_TYPE_F32, NSTF_TYPE_BF16}) {
            test_get_rows(t, 50, sb ? 256 : 32, 1, ot);
            test_get_rows(t, 50, sb ? 512 : q ? 96 : 100, 5, ot);
            test_get_rows(t, 1000, sb ? 768 : 576, 9, ot);
            /* prefill-sized: 300 rows of a 300-row table, by ids and whole */
            test_get_rows(t, 300, sb ? 1024 : 1056, 300, ot);
            test_get_rows(t, 300, sb ? 1024 : 1056, 300, ot, true);
        }
        if (!q) test_get_rows(t, 10, 7, 4, NSTF_TYPE_F32);
    }
    /* Q4_0, IQ4_NL and Q8_0 rows of a multiple of 256, Q6_K of 2048: the
     * GPU's split layout (quant.h) */
    for (nstf_type t : {NSTF_TYPE_Q4_0, NSTF_TYPE_IQ4_NL, NSTF_TYPE_Q8_0, NSTF_TYPE_Q6_K})
        for (nstf_type ot : {NSTF_TYPE_F32, NSTF_TYPE_BF16}) {
            if (!want(t)) continue;
            if (t != NSTF_TYPE_Q6_K) test_get_rows(t, 50, 256, 3, ot);
            test_get_rows(t, 300, 2048, 300, ot);
            test_get_rows(t, 300, 2048, 300, ot, true);
        }
    if (!g_only.empty()) return gh_finish("test_ops_gpu");
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
        test_argmax(64, 128256, xt, false); /* a serving step's 64 greedy rows */
        test_argmax(2, 1000, xt, true);
    }
    test_kv_write(1, 192, 16);
    test_kv_write(5, 192, 16);
    test_kv_write(4, 7, 9);
    test_kv_write(8, 1024, 64);

    return gh_finish("test_ops_gpu");
}
