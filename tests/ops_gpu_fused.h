/* ops_gpu_fused.h — the fused decode GEMV cases of test_ops_gpu.cu,
 * included after its helpers (weights, rng, harness): the Llama fusions
 * (norm prologue; RoPE, SwiGLU, residual epilogues) and Qwen's QKV extras
 * (bias, per-head q/k norm), each bitwise against the unfused kernels it
 * replaces; the Qwen chain also against the fp64 references. */
#ifndef NSTF_TESTS_OPS_GPU_FUSED_H
#define NSTF_TESTS_OPS_GPU_FUSED_H

/* The request of a fused GEMV: norm prologue (none without norm_x), the
 * epilogue and the RoPE arguments; the rest zero. */
static nstf_gemv_fusion fusion(const float *norm_x, const float *norm_w, float eps, nstf_gemv_epi epi, int rope_rows,
                               int hd, nstf_rope_mode mode, const int32_t *pos, const float *freqs,
                               const float *factors) {
    nstf_gemv_fusion f = {};
    f.norm_x = norm_x;
    f.norm_w = norm_w;
    f.norm_eps = eps;
    f.epi = epi;
    f.rope_rows = rope_rows;
    f.head_dim = hd;
    f.rope_mode = mode;
    f.pos = pos;
    f.rope_freqs = freqs;
    f.rope_factors = factors;
    return f;
}

/* nstf_gpu_gemv_fused with programmatic dependent launch on or off. */
static void fused_run(nstf_type wt, const void *w, const uint16_t *x, void *y, int64_t n_in, int64_t n_out,
                      const nstf_gemv_fusion &f, bool pdl) {
    const int prev = nstf_gpu_set_pdl(pdl);
    const nstf_status st = nstf_gpu_gemv_fused(wt, w, x, y, n_in, n_out, &f, nullptr);
    nstf_gpu_set_pdl(prev);
    gh_launched(st, "gemv_fused");
}

/* ---- fused decode GEMV ---------------------------------------------------------------------- *
 * nstf_gpu_gemv_fused against the unfused kernels it replaces, run on the
 * same inputs: rmsnorm -> gemv -> (rope | swiglu | add). The claim is bitwise
 * equality (same sums in the same order, same roundings), so the metric is
 * the count of outputs whose bits differ: 0 allowed. Each unfused
 * kernel is itself checked against the CPU reference above, so equality
 * carries their accuracy over. */
static void test_gemv_fused(nstf_type wt, nstf_gemv_epi epi, bool norm, int64_t n_in, int64_t n_out, int hd,
                            int rope_rows, nstf_rope_mode mode, bool pdl, bool factors = false) {
    const float eps = 1e-5f, base = 100000.0f;
    const int32_t pos = 517;
    std::vector<unsigned char> w = make_weights(wt, n_out, n_in);
    std::vector<float> xr(n_in), nw(n_in), xin_f(n_in);
    for (auto &v : xr) v = normal() * 3.0f;
    for (auto &v : nw) v = 1.0f + 0.2f * normal();
    for (auto &v : xin_f) v = bf(normal());
    std::vector<uint16_t> xin = gh_to_bf16(xin_f);
    const int64_t n_y = epi == NSTF_GEMV_SWIGLU ? n_out / 2 : n_out;
    const bool yf32 = epi == NSTF_GEMV_STORE || epi == NSTF_GEMV_ACCUM;
    std::vector<float> y0(n_y);
    for (auto &v : y0) v = normal();
    std::vector<float> fr(256), ff(128);
    if (hd) nstf_gpu_rope_freqs(base, hd, fr.data());
    for (int i = 0; i < 128; i++) ff[i] = 1.0f + 7.0f * (float)i / 127.0f; /* Llama 3.1-like: 1 .. 8 */

    static const char *en[] = {"store", "accum", "rope", "swiglu"};
    gh_begin("gemv_fused %s %s%s%s%s %lldx%lld%s", nstf_type_name(wt), norm ? "norm+" : "", en[epi],
             epi == NSTF_GEMV_ROPE ? (mode == NSTF_ROPE_NEOX ? "/neox" : "/norm") : "", factors ? "+factors" : "",
             (long long)n_in, (long long)n_out, pdl ? " pdl" : "");
    gh_buf dw = gh_alloc_weights(wt, n_in, n_out, w.data()), dxr = gh_alloc(n_in * 4, xr.data());
    gh_buf dnw = gh_alloc(n_in * 4, nw.data());
    gh_buf dxin = gh_alloc(n_in * 2, xin.data()), dxb = gh_alloc(n_in * 2, nullptr), dp = gh_alloc(4, &pos);
    gh_buf dfr = gh_alloc(256 * 4, fr.data()), dtmp = gh_alloc(n_out * 4, nullptr), dff = gh_alloc(128 * 4, ff.data());
    gh_buf dya = gh_alloc(n_y * (yf32 ? 4 : 2), yf32 ? y0.data() : nullptr);
    gh_buf dyb = gh_alloc(n_y * (yf32 ? 4 : 2), yf32 ? y0.data() : nullptr);
    /* unfused */
    const uint16_t *in = dxin.as<const uint16_t>();
    if (norm) {
        gh_launched(nstf_gpu_rmsnorm(dxr.as<float>(), nullptr, NSTF_TYPE_F32, dnw.as<const float>(), dxb.as<uint16_t>(),
                                     1, n_in, eps, nullptr),
                    "rmsnorm");
        in = dxb.as<const uint16_t>();
    }
    switch (epi) {
    case NSTF_GEMV_STORE:
        gh_launched(nstf_gpu_gemv(wt, dw.p(), in, dya.p(), NSTF_TYPE_F32, 1, n_in, n_out, nullptr), "gemv");
        break;
    case NSTF_GEMV_ACCUM:
        gh_launched(nstf_gpu_gemv(wt, dw.p(), in, dtmp.p(), NSTF_TYPE_F32, 1, n_in, n_out, nullptr), "gemv");
        gh_launched(nstf_gpu_add(dya.as<float>(), dtmp.as<const float>(), n_out, nullptr), "add");
        break;
    case NSTF_GEMV_ROPE:
        gh_launched(nstf_gpu_gemv(wt, dw.p(), in, dya.p(), NSTF_TYPE_BF16, 1, n_in, n_out, nullptr), "gemv");
        gh_launched(nstf_gpu_rope_strided(dya.as<uint16_t>(), rope_rows, nullptr, 0, dp.as<const int32_t>(), 1,
                                          rope_rows / hd, 0, hd, base, factors ? dff.as<const float>() : nullptr, mode,
                                          nullptr),
                    "rope");
        break;
    case NSTF_GEMV_SWIGLU:
        gh_launched(nstf_gpu_gemv(wt, dw.p(), in, dtmp.p(), NSTF_TYPE_BF16, 1, n_in, n_out, nullptr), "gemv");
        gh_launched(nstf_gpu_swiglu(dtmp.as<const uint16_t>(), dtmp.as<const uint16_t>() + n_y, dya.as<uint16_t>(), n_y,
                                    nullptr),
                    "swiglu");
        break;
    }
    /* fused */
    const nstf_gemv_fusion f = fusion(norm ? dxr.as<const float>() : nullptr, dnw.as<const float>(), eps, epi,
                                      rope_rows, hd, mode, dp.as<const int32_t>(), dfr.as<const float>(),
                                      factors ? dff.as<const float>() : nullptr);
    fused_run(wt, dw.p(), norm ? nullptr : dxin.as<const uint16_t>(), dyb.p(), n_in, n_out, f, pdl);
    const size_t el = yf32 ? 4 : 2;
    std::vector<unsigned char> a(n_y * el), b(n_y * el);
    gh_fetch(dya, a.data());
    gh_fetch(dyb, b.data());
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
        diff += memcmp(&a[i * el], &b[i * el], el) != 0;
        bad += !isfinite(vb);
    }
    CHECK(diff == 0, "gemv_fused: %zu of %lld outputs differ from the unfused kernels' (bitwise)", diff, (long long)n_y);
    CHECK(bad == 0, "gemv_fused: %zu NaN/Inf outputs", bad);
    gh_note("outputs differing from the unfused kernels %zu of %lld (0 allowed), nonfinite=%zu", diff, (long long)n_y,
            bad);
    gh_free(dw); gh_free(dxr); gh_free(dnw); gh_free(dxin); gh_free(dxb); gh_free(dp); gh_free(dfr); gh_free(dtmp);
    gh_free(dya); gh_free(dyb); gh_free(dff);
    gh_end();
}

/* The naive bf16 chain's per-head RMSNorm of n_heads rows of hd in place
 * (fp32 sum of squares, bf16 out), as nstf_gpu_head_norm's naive twin. */
static void naive_head_norm(float *x, const float *w, int n_heads, int hd, float eps) {
    for (int h = 0; h < n_heads; h++) {
        float *r = &x[(int64_t)h * hd];
        float s2 = 0;
        for (int i = 0; i < hd; i++) s2 += r[i] * r[i];
        const float rn = 1.0f / sqrtf(s2 / (float)hd + eps);
        for (int i = 0; i < hd; i++) r[i] = bf(r[i] * rn * w[i]);
    }
}

/* ... and its RoPE (powf/sinf/cosf angles, bf16 out), in place. */
static void naive_rope(float *x, int n_heads, int hd, int32_t pos, float base, const float *fac,
                       nstf_rope_mode mode) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd / 2; i++) {
            float *r = &x[(int64_t)h * hd];
            const float th = (float)pos * powf(base, -2.0f * (float)i / (float)hd) / (fac ? fac[i] : 1.0f);
            const float c = cosf(th), sn = sinf(th);
            const int ia = mode == NSTF_ROPE_NEOX ? i : 2 * i, ib = mode == NSTF_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
            const float x0 = r[ia], x1 = r[ib];
            r[ia] = bf(x0 * c - x1 * sn);
            r[ib] = bf(x0 * sn + x1 * c);
        }
}

/* The QKV matmul of Qwen (one token): rmsnorm -> GEMV of q | k | v -> the
 * bias of each matrix (Qwen2) -> the per-head q/k norm (Qwen3) -> RoPE of
 * q and k, fused (nstf_gpu_gemv_fused: one kernel, two with the norm)
 * against the unfused kernels on the same inputs: bitwise, 0 differing
 * outputs allowed. And against the fp64 chain of the scalar references
 * (nstf_ref_rmsnorm, _matmul, _bias, _head_norm, _rope_ff) under the bf16
 * rule: NMSE at most 2x that of a naive host chain with the same bf16
 * roundings between the steps (fp32 sums, powf/sinf/cosf angles). */
static void test_gemv_fused_qkv(nstf_type wt, int64_t n_in, int nh, int nkv, int hd, nstf_rope_mode mode,
                                bool bias, bool qk_norm, bool pdl, bool factors = false, bool zero_x = false) {
    const float eps = 1e-6f, base = 1000000.0f;
    const int32_t pos = 1029;
    const int q_rows = nh * hd, rope_rows = (nh + nkv) * hd;
    const int64_t n_out = rope_rows + (int64_t)nkv * hd;
    std::vector<unsigned char> w = make_weights(wt, n_out, n_in);
    std::vector<float> xr(n_in), nw(n_in), b(n_out), wq(hd), wk(hd), fr(256), ff(128);
    for (auto &v : xr) v = zero_x ? 0.0f : normal() * 3.0f; /* x = 0: the GEMV gives 0, the output is the bias */
    for (auto &v : nw) v = 1.0f + 0.2f * normal();
    for (auto &v : b) v = 0.5f * normal(); /* of the size of the outputs */
    for (auto &v : wq) v = 1.0f + 0.3f * normal();
    for (auto &v : wk) v = 1.0f + 0.3f * normal();
    nstf_gpu_rope_freqs(base, hd, fr.data());
    for (int i = 0; i < 128; i++) ff[i] = 1.0f + 7.0f * (float)i / 127.0f;

    /* fp64 chain (float between the steps) and the naive bf16 chain */
    std::vector<float> xn(n_in), ref(n_out), naive(n_out), xnb(n_in), wr(n_in);
    nstf_ref_rmsnorm(xr.data(), nw.data(), xn.data(), 1, n_in, eps);
    nstf_ref_matmul(wt, w.data(), xn.data(), ref.data(), 1, n_in, n_out);
    float ss = 0;
    for (int64_t i = 0; i < n_in; i++) ss += xr[i] * xr[i];
    const float rn = 1.0f / sqrtf(ss / (float)n_in + eps);
    for (int64_t i = 0; i < n_in; i++) xnb[i] = bf(xr[i] * rn * nw[i]);
    uint64_t rb = 0;
    nstf_type_row_bytes(wt, n_in, &rb);
    for (int64_t o = 0; o < n_out; o++) {
        nstf_dequantize_row(wt, &w[o * rb], wr.data(), n_in);
        float sum = 0;
        for (int64_t i = 0; i < n_in; i++) sum += wr[i] * xnb[i];
        naive[o] = bf(sum);
    }
    if (bias) {
        nstf_ref_bias(ref.data(), b.data(), 1, n_out); /* the three biases side by side */
        for (int64_t o = 0; o < n_out; o++) naive[o] = bf(naive[o] + b[o]);
    }
    if (qk_norm) {
        nstf_ref_head_norm(ref.data(), wq.data(), nh, hd, eps);
        nstf_ref_head_norm(ref.data() + q_rows, wk.data(), nkv, hd, eps);
        naive_head_norm(naive.data(), wq.data(), nh, hd, eps);
        naive_head_norm(naive.data() + q_rows, wk.data(), nkv, hd, eps);
    }
    const float *fac = factors ? ff.data() : nullptr;
    nstf_ref_rope_ff(ref.data(), &pos, 1, nh, hd, base, fac, mode);
    nstf_ref_rope_ff(ref.data() + q_rows, &pos, 1, nkv, hd, base, fac, mode);
    naive_rope(naive.data(), nh + nkv, hd, pos, base, fac, mode);

    gh_begin("gemv_fused qkv %s%s%s %s%s%s %lld -> %d/%d heads of %d%s", nstf_type_name(wt), bias ? " +bias" : "",
             qk_norm ? " +qk_norm" : "", mode == NSTF_ROPE_NEOX ? "neox" : "norm", factors ? " +factors" : "",
             zero_x ? " x=0" : "", (long long)n_in, nh, nkv, hd, pdl ? " pdl" : "");
    gh_buf dw = gh_alloc_weights(wt, n_in, n_out, w.data()), dxr = gh_alloc(n_in * 4, xr.data());
    gh_buf dnw = gh_alloc(n_in * 4, nw.data());
    gh_buf db = gh_alloc(n_out * 4, b.data()), dwq = gh_alloc(hd * 4, wq.data()), dwk = gh_alloc(hd * 4, wk.data());
    gh_buf dfr = gh_alloc(256 * 4, fr.data()), dff = gh_alloc(128 * 4, ff.data()), dp = gh_alloc(4, &pos);
    gh_buf dxb = gh_alloc(n_in * 2, nullptr), dya = gh_alloc(n_out * 2, nullptr), dyb = gh_alloc(n_out * 2, nullptr);
    const float *dbq = db.as<const float>(), *dbk = dbq + q_rows, *dbv = dbq + rope_rows;
    /* unfused, as the forward runs it (ops in src/model/forward.c) */
    uint16_t *ya = dya.as<uint16_t>();
    gh_launched(nstf_gpu_rmsnorm(dxr.as<float>(), nullptr, NSTF_TYPE_F32, dnw.as<const float>(), dxb.as<uint16_t>(), 1,
                                 n_in, eps, nullptr),
                "rmsnorm");
    gh_launched(nstf_gpu_gemv(wt, dw.p(), dxb.as<const uint16_t>(), ya, NSTF_TYPE_BF16, 1, n_in, n_out, nullptr),
                "gemv");
    if (bias) {
        gh_launched(nstf_gpu_bias(ya, n_out, dbq, 1, q_rows, nullptr), "bias q");
        gh_launched(nstf_gpu_bias(ya + q_rows, n_out, dbk, 1, rope_rows - q_rows, nullptr), "bias k");
        gh_launched(nstf_gpu_bias(ya + rope_rows, n_out, dbv, 1, n_out - rope_rows, nullptr), "bias v");
    }
    if (qk_norm)
        gh_launched(nstf_gpu_head_norm(ya, n_out, ya + q_rows, n_out, dwq.as<const float>(), dwk.as<const float>(), 1,
                                       nh, nkv, hd, eps, nullptr),
                    "head_norm");
    gh_launched(nstf_gpu_rope_strided(ya, n_out, ya + q_rows, n_out, dp.as<const int32_t>(), 1, nh, nkv, hd, base,
                                      factors ? dff.as<const float>() : nullptr, mode, nullptr),
                "rope");
    /* fused */
    nstf_gemv_fusion f = fusion(dxr.as<const float>(), dnw.as<const float>(), eps, NSTF_GEMV_ROPE, rope_rows, hd, mode,
                                dp.as<const int32_t>(), dfr.as<const float>(),
                                factors ? dff.as<const float>() : nullptr);
    f.q_rows = q_rows;
    f.bias_q = bias ? dbq : nullptr;
    f.bias_k = bias ? dbk : nullptr;
    f.bias_v = bias ? dbv : nullptr;
    f.q_norm = qk_norm ? dwq.as<const float>() : nullptr;
    f.k_norm = qk_norm ? dwk.as<const float>() : nullptr;
    f.qk_eps = eps;
    fused_run(wt, dw.p(), nullptr, dyb.p(), n_in, n_out, f, pdl);
    std::vector<uint16_t> a(n_out), o(n_out);
    gh_fetch(dya, a.data());
    gh_fetch(dyb, o.data());
    size_t diff = 0;
    for (int64_t i = 0; i < n_out; i++) diff += a[i] != o[i];
    CHECK(diff == 0, "gemv_fused qkv: %zu of %lld outputs differ from the unfused kernels' (bitwise)", diff,
          (long long)n_out);
    gh_note("differing from the unfused kernels %zu of %lld (0 allowed)", diff, (long long)n_out);
    std::vector<float> y = gh_from_bf16(o);
    if (zero_x && bias) { /* v's rows are the bias alone: bitwise bf16(b), whatever the q/k steps do */
        int64_t same = 0, none = 0;
        for (int64_t i = rope_rows; i < n_out; i++) {
            same += o[i] == nstf_f32_to_bf16(b[i]);
            none += y[i] == 0.0f;
        }
        CHECK(same == n_out - rope_rows, "v rows: %lld of %lld hold bf16(bias), %lld hold 0 (bias dropped)",
              (long long)same, (long long)(n_out - rope_rows), (long long)none);
        gh_note("v rows holding bf16(bias) %lld of %lld", (long long)same, (long long)(n_out - rope_rows));
    }
    gh_compare("q,k,v", y.data(), ref.data(), n_out, gh_tol_naive(naive.data()));
    gh_free(dw); gh_free(dxr); gh_free(dnw); gh_free(db); gh_free(dwq); gh_free(dwk); gh_free(dfr); gh_free(dff);
    gh_free(dp); gh_free(dxb); gh_free(dya); gh_free(dyb);
    gh_end();
}

/* nstf_gpu_head_norm_rope (one token's q and k heads normalized and
 * rotated in one kernel) against nstf_gpu_head_norm then
 * nstf_gpu_rope_strided on the same rows: bitwise, 0 differing values
 * allowed; and against the fp64 references under the bf16 rule (NMSE at
 * most 2x a naive host chain's). The rows start 2 bytes past a 16-byte
 * boundary and k begins k_gap elements after q's rows (odd: k's heads are
 * only 2-byte aligned), as no head row is promised more alignment than its
 * element's. */
static void test_head_norm_rope(int nh, int nkv, int hd, nstf_rope_mode mode, bool factors, bool pdl, int k_gap) {
    const float eps = 1e-6f, base = 1000000.0f;
    const int32_t pos = 4099;
    const int64_t q_rows = (int64_t)nh * hd, k_at = q_rows + k_gap, n = k_at + (int64_t)nkv * hd;
    std::vector<float> x(n), wq(hd), wk(hd), fr(256), ff(128);
    for (auto &v : x) v = bf(2.0f * normal());
    for (auto &v : wq) v = 1.0f + 0.3f * normal();
    for (auto &v : wk) v = 1.0f + 0.3f * normal();
    nstf_gpu_rope_freqs(base, hd, fr.data());
    for (int i = 0; i < 128; i++) ff[i] = 1.0f + 7.0f * (float)i / 127.0f;
    const float *fac = factors ? ff.data() : nullptr;
    std::vector<float> ref(x), naive(x);
    nstf_ref_head_norm(ref.data(), wq.data(), nh, hd, eps);
    nstf_ref_head_norm(ref.data() + k_at, wk.data(), nkv, hd, eps);
    nstf_ref_rope_ff(ref.data(), &pos, 1, nh, hd, base, fac, mode);
    nstf_ref_rope_ff(ref.data() + k_at, &pos, 1, nkv, hd, base, fac, mode);
    naive_head_norm(naive.data(), wq.data(), nh, hd, eps);
    naive_head_norm(naive.data() + k_at, wk.data(), nkv, hd, eps);
    naive_rope(naive.data(), nh, hd, pos, base, fac, mode);
    naive_rope(naive.data() + k_at, nkv, hd, pos, base, fac, mode);

    gh_begin("head_norm_rope %d/%d heads of %d %s%s k+%d%s", nh, nkv, hd, mode == NSTF_ROPE_NEOX ? "neox" : "norm",
             factors ? " +factors" : "", k_gap, pdl ? " pdl" : "");
    const std::vector<uint16_t> xb = gh_to_bf16(x);
    gh_buf da = gh_alloc(n * 2, xb.data(), 2), db = gh_alloc(n * 2, xb.data(), 2);
    gh_buf dwq = gh_alloc(hd * 4, wq.data()), dwk = gh_alloc(hd * 4, wk.data()), dfr = gh_alloc(256 * 4, fr.data());
    gh_buf dff = gh_alloc(128 * 4, ff.data()), dp = gh_alloc(4, &pos);
    const float *dfac = factors ? dff.as<const float>() : nullptr;
    uint16_t *qa = da.as<uint16_t>(), *qb = db.as<uint16_t>();
    gh_launched(nstf_gpu_head_norm(qa, q_rows, qa + k_at, (int64_t)nkv * hd, dwq.as<const float>(),
                                   dwk.as<const float>(), 1, nh, nkv, hd, eps, nullptr),
                "head_norm");
    gh_launched(nstf_gpu_rope_strided(qa, q_rows, qa + k_at, (int64_t)nkv * hd, dp.as<const int32_t>(), 1, nh, nkv, hd,
                                      base, dfac, mode, nullptr),
                "rope");
    const int prev = nstf_gpu_set_pdl(pdl);
    const nstf_status st = nstf_gpu_head_norm_rope(qb, qb + k_at, dwq.as<const float>(), dwk.as<const float>(), nh, nkv,
                                                   hd, eps, dp.as<const int32_t>(), dfr.as<const float>(), dfac, mode,
                                                   nullptr);
    nstf_gpu_set_pdl(prev);
    gh_launched(st, "head_norm_rope");
    std::vector<uint16_t> a(n), o(n);
    gh_fetch(da, a.data());
    gh_fetch(db, o.data());
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += a[i] != o[i];
    CHECK(diff == 0, "head_norm_rope: %lld of %lld values differ from head_norm + rope (bitwise)", (long long)diff,
          (long long)n);
    gh_note("differing from head_norm + rope %lld of %lld (0 allowed)", (long long)diff, (long long)n);
    const std::vector<float> y = gh_from_bf16(o);
    gh_compare("q,k", y.data(), ref.data(), n, gh_tol_naive(naive.data()));
    gh_free(da); gh_free(db); gh_free(dwq); gh_free(dwk); gh_free(dfr); gh_free(dff); gh_free(dp);
    gh_end();
}

/* Qwen shapes (Qwen2.5-0.5B: 14/2 heads of 64 on 896; Qwen3-0.6B: 16/8
 * heads of 128 on 1024; Qwen2.5-7B's GQA 28/4 of 128 on 3584), every
 * weight type with fused instances, both RoPE layouts, with and without
 * PDL; a malformed request is refused. */
static void gemv_fused_qkv_cases(void) {
    for (nstf_type wt : {NSTF_TYPE_BF16, NSTF_TYPE_F16, NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1,
                         NSTF_TYPE_Q5_0, NSTF_TYPE_Q5_1, NSTF_TYPE_Q4_K, NSTF_TYPE_Q5_K, NSTF_TYPE_Q6_K,
                         NSTF_TYPE_IQ4_XS}) {
        if (!want(wt)) continue;
        const bool sb = is_super(wt);
        const int64_t w05 = sb ? 768 : 896; /* rows of whole super-blocks */
        for (int pdl = 0; pdl < 2; pdl++) {
            test_gemv_fused_qkv(wt, w05, 14, 2, 64, NSTF_ROPE_NEOX, true, false, pdl);   /* Qwen2 */
            test_gemv_fused_qkv(wt, 1024, 16, 8, 128, NSTF_ROPE_NEOX, false, true, pdl); /* Qwen3 */
        }
        test_gemv_fused_qkv(wt, w05, 14, 2, 64, NSTF_ROPE_NORM, true, false, true);
        test_gemv_fused_qkv(wt, 1024, 16, 8, 128, NSTF_ROPE_NORM, false, true, false);
        test_gemv_fused_qkv(wt, 1024, 4, 2, 64, NSTF_ROPE_NEOX, true, true, true, true); /* both, RoPE factors */
        test_gemv_fused_qkv(wt, 3584, 28, 4, 128, NSTF_ROPE_NEOX, true, false, true);
        /* x = 0: the outputs are the biases alone (v's rows checked as bf16(b)) */
        test_gemv_fused_qkv(wt, w05, 14, 2, 64, NSTF_ROPE_NEOX, true, false, false, false, true);
        test_gemv_fused_qkv(wt, 1024, 7, 1, 128, NSTF_ROPE_NORM, true, true, true, false, true);
        /* odd head counts, head_dim 256 */
        test_gemv_fused_qkv(wt, 1024, 7, 1, 128, NSTF_ROPE_NEOX, true, true, false);
        test_gemv_fused_qkv(wt, 1024, 3, 1, 256, NSTF_ROPE_NEOX, false, true, true);
        test_gemv_fused_qkv(wt, w05, 9, 3, 64, NSTF_ROPE_NORM, true, false, false);
    }
    /* the q/k norm's second kernel alone: Qwen3-0.6B, Qwen2.5-0.5B-like and
     * odd head counts, head_dim 6..256, k right after q or 2-byte aligned */
    for (int pdl = 0; pdl < 2; pdl++) {
        test_head_norm_rope(16, 8, 128, NSTF_ROPE_NEOX, false, pdl, 0);
        test_head_norm_rope(14, 2, 64, NSTF_ROPE_NEOX, false, pdl, 1);
    }
    test_head_norm_rope(16, 8, 128, NSTF_ROPE_NORM, true, true, 3);
    test_head_norm_rope(7, 1, 128, NSTF_ROPE_NORM, false, false, 1);
    test_head_norm_rope(9, 3, 64, NSTF_ROPE_NEOX, true, true, 0);
    test_head_norm_rope(3, 3, 256, NSTF_ROPE_NEOX, false, false, 5);
    test_head_norm_rope(5, 0, 96, NSTF_ROPE_NORM, false, true, 0); /* no k heads */
    test_head_norm_rope(3, 1, 6, NSTF_ROPE_NEOX, false, false, 1);
    test_head_norm_rope(40, 8, 128, NSTF_ROPE_NEOX, false, true, 1); /* 6 blocks */
    gh_buf dummy = gh_alloc(4096, nullptr);
    nstf_gemv_fusion f = {};
    f.epi = NSTF_GEMV_SWIGLU;
    f.bias_q = dummy.as<const float>();
    f.q_rows = 64;
    gh_begin("gemv_fused: a QKV bias outside the RoPE epilogue refused");
    nstf_status st = nstf_gpu_gemv_fused(NSTF_TYPE_BF16, dummy.p(), dummy.as<const uint16_t>(), dummy.p(), 64, 8, &f,
                                         nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG, "status %d: %s", (int)st, nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    gh_begin("gemv_fused: q/k norm with q_rows not a multiple of head_dim refused");
    f = {};
    f.epi = NSTF_GEMV_ROPE;
    f.rope_rows = 256;
    f.head_dim = 64;
    f.rope_mode = NSTF_ROPE_NEOX;
    f.pos = dummy.as<const int32_t>();
    f.rope_freqs = dummy.as<const float>();
    f.q_norm = f.k_norm = dummy.as<const float>();
    f.q_rows = 100;
    st = nstf_gpu_gemv_fused(NSTF_TYPE_BF16, dummy.p(), dummy.as<const uint16_t>(), dummy.p(), 64, 384, &f, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG, "status %d: %s", (int)st, nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_end();
    gh_free(dummy);
}

static void gemv_fused_cases(void) {
    for (nstf_type wt : {NSTF_TYPE_BF16, NSTF_TYPE_F16, NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1,
                         NSTF_TYPE_Q5_0, NSTF_TYPE_Q5_1, NSTF_TYPE_IQ4_NL}) {
        if (!want(wt)) continue;
        for (int pdl = 0; pdl < 2; pdl++) {
            /* SmolLM2 shapes: q 9 heads, k/v 3 heads of 64 */
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 576, 960, 64, 768, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 576, 960, 64, 768, NSTF_ROPE_NEOX, pdl);
            test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 576, 3072, 0, 0, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_ACCUM, false, 1536, 576, 0, 0, NSTF_ROPE_NORM, pdl);
            test_gemv_fused(wt, NSTF_GEMV_STORE, true, 576, 1000, 0, 0, NSTF_ROPE_NORM, pdl);
        }
        /* Llama 3.x RoPE frequency factors (rope_freqs.weight) */
        test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 576, 960, 64, 768, NSTF_ROPE_NORM, true, true);
        test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 2048, 3072, 128, 2560, NSTF_ROPE_NEOX, false, true);
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
    /* every block height of the float kernel with every epilogue (the
     * default picks 16 rows for some Q|K|V shapes, 8 or 16 elsewhere): the
     * 8B Q|K|V, both RoPE layouts, and a ragged last block */
    for (const char *rows : {"8", "16", "32"}) {
        CHECK(nstf_switch_set(NSTF_SW_GEMV_ROWS, rows) == NSTF_OK, "%s", nstf_last_error());
        for (nstf_type wt : {NSTF_TYPE_BF16, NSTF_TYPE_F16}) {
            if (!want(wt)) continue;
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 4096, 6144, 128, 5120, NSTF_ROPE_NORM, true);
            test_gemv_fused(wt, NSTF_GEMV_ROPE, true, 2048, 3072, 64, 2560, NSTF_ROPE_NEOX, false);
            test_gemv_fused(wt, NSTF_GEMV_SWIGLU, true, 576, 2 * 1000, 0, 0, NSTF_ROPE_NORM, true);
            test_gemv_fused(wt, NSTF_GEMV_ACCUM, false, 1536, 1000, 0, 0, NSTF_ROPE_NORM, true);
            test_gemv_fused(wt, NSTF_GEMV_STORE, true, 576, 1000, 0, 0, NSTF_ROPE_NORM, false);
        }
    }
    CHECK(nstf_switch_set(NSTF_SW_GEMV_ROWS, "auto") == NSTF_OK, "%s", nstf_last_error());
    /* the super-block types with fused instances: Llama shapes (rows of
     * whole super-blocks), head_dim 64 and 128, both RoPE layouts */
    for (nstf_type wt : {NSTF_TYPE_Q4_K, NSTF_TYPE_Q5_K, NSTF_TYPE_Q6_K, NSTF_TYPE_IQ4_XS}) {
        if (!want(wt)) continue;
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
    gh_buf dummy = gh_alloc(4096, nullptr);
    nstf_gemv_fusion f = {};
    f.epi = NSTF_GEMV_ACCUM;
    gh_begin("gemv_fused: F32 weights refused");
    nstf_status st = nstf_gpu_gemv_fused(NSTF_TYPE_F32, dummy.p(), dummy.as<const uint16_t>(), dummy.p(), 64, 4, &f,
                                         nullptr);
    CHECK(st == NSTF_ERR_UNSUPPORTED, "status %d: %s", (int)st, nstf_last_error());
    CHECK(!nstf_gpu_gemv_fusable(NSTF_TYPE_F32, dummy.p(), 64, 0), "nstf_gpu_gemv_fusable says yes");
    gh_note("%s", nstf_last_error());
    gh_begin("gemv_fused: SwiGLU with odd rows refused");
    f.epi = NSTF_GEMV_SWIGLU;
    st = nstf_gpu_gemv_fused(NSTF_TYPE_BF16, dummy.p(), dummy.as<const uint16_t>(), dummy.p(), 64, 5, &f, nullptr);
    CHECK(st == NSTF_ERR_INVALID_ARG, "status %d: %s", (int)st, nstf_last_error());
    gh_note("%s", nstf_last_error());
    gh_begin("gemv_fused: norm prologue wider than staging refused");
    CHECK(!nstf_gpu_gemv_fusable(NSTF_TYPE_BF16, dummy.p(), 40000, 1), "n_in 40000 said fusable");
    gh_note("n_in 40000");
    gh_end();
    gh_begin("gemv_fused: types without fused instances (Q2_K, Q3_K) refused");
    CHECK(!nstf_gpu_gemv_fusable(NSTF_TYPE_Q2_K, dummy.p(), 256, 0), "Q2_K said fusable");
    CHECK(!nstf_gpu_gemv_fusable(NSTF_TYPE_Q3_K, dummy.p(), 256, 0), "Q3_K said fusable");
    gh_end();
    gh_begin("gemv_fused: Q4_K weights less aligned than their blocks refused");
    CHECK(!nstf_gpu_gemv_fusable(NSTF_TYPE_Q4_K, (const unsigned char *)dummy.p() + 2, 256, 0), "said fusable");
    gh_end();
    gh_free(dummy);
}

#endif
