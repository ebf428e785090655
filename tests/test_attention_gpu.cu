/* test_attention_gpu.cu — nstf_gpu_flash_attn (prefill) and
 * nstf_gpu_flash_decode (split-KV) against an fp64 host reference of causal
 * GQA attention over a KV cache, on the same bf16-rounded inputs: head_dim
 * 64 and 128, GQA ratios 1, 3, 4, 8, sequence lengths 1..4096, pos0 > 0
 * (earlier tokens already in the cache), padded token strides.
 * Metric: RMS error of the bf16 output vs fp64 must be <= 2x the RMS error
 * of a naive host implementation (bf16 inputs, fp32 scores / softmax /
 * accumulation in sequential order, bf16 output). Also checked exactly: the
 * fused cache write (rows [pos0, pos0+n_tok) = k, v; rows before unchanged;
 * rows after untouched), guard regions, NaN/Inf. Long sequences check a
 * sample of query tokens (first, last and random ones). Exit 77 = no GPU. */
#include "gpu_mm_test.h"

#include <vector>

struct attn_case {
    int64_t n_tok, pos0;
    int n_kv, group, hd;
    bool decode;
};

static void run_case(const attn_case &tc, uint64_t seed) {
    const int64_t T = tc.n_tok, P0 = tc.pos0, n_ctx = P0 + T + 3;
    const int n_kv = tc.n_kv, H = n_kv * tc.group, D = tc.hd;
    const int64_t kvd = (int64_t)n_kv * D;
    const int64_t q_stride = (int64_t)H * D + 8, kv_stride = kvd + 16, out_stride = (int64_t)H * D + 24;
    const float scale = 1.0f / sqrtf((float)D);
    test_rng rng = {seed};

    std::vector<uint16_t> q(T * q_stride, 0), k(T * kv_stride, 0), v(T * kv_stride, 0);
    std::vector<uint16_t> kc(n_ctx * kvd, 0xffff), vc(n_ctx * kvd, 0xffff);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < (int64_t)H * D; i++) q[t * q_stride + i] = f2bf(3.0f * rng_uniform(&rng));
        for (int64_t i = 0; i < kvd; i++) {
            k[t * kv_stride + i] = f2bf(rng_uniform(&rng));
            v[t * kv_stride + i] = f2bf(rng_uniform(&rng));
        }
    }
    for (int64_t i = 0; i < P0 * kvd; i++) {
        kc[i] = f2bf(rng_uniform(&rng));
        vc[i] = f2bf(rng_uniform(&rng));
    }
    /* the full logical K, V over positions [0, P0 + T) */
    auto key = [&](int64_t p, int hk) -> const uint16_t * {
        return p < P0 ? &kc[(p * n_kv + hk) * D] : &k[(p - P0) * kv_stride + (int64_t)hk * D];
    };
    auto val = [&](int64_t p, int hk) -> const uint16_t * {
        return p < P0 ? &vc[(p * n_kv + hk) * D] : &v[(p - P0) * kv_stride + (int64_t)hk * D];
    };

    /* device */
    const size_t q_b = T * q_stride * 2, kv_b = T * kv_stride * 2, c_b = n_ctx * kvd * 2, o_b = T * out_stride * 2;
    uint16_t *dq = (uint16_t *)dev_alloc_poisoned(q_b), *dk = (uint16_t *)dev_alloc_poisoned(kv_b),
             *dv = (uint16_t *)dev_alloc_poisoned(kv_b), *dkc = (uint16_t *)dev_alloc_poisoned(c_b),
             *dvc = (uint16_t *)dev_alloc_poisoned(c_b), *dout = (uint16_t *)dev_alloc_poisoned(o_b);
    DEV_CHECK(gpuMemcpy(dq, q.data(), q_b, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dk, k.data(), kv_b, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dv, v.data(), kv_b, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dkc, kc.data(), c_b, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dvc, vc.data(), c_b, gpuMemcpyHostToDevice));
    nstf_status st;
    void *scratch = NULL;
    if (tc.decode) {
        size_t sb = nstf_gpu_flash_decode_scratch_bytes(T, P0, H, n_kv, D);
        CHECK(sb > 0, "decode scratch size");
        scratch = dev_alloc_poisoned(sb);
        st = nstf_gpu_flash_decode(dq, q_stride, dk, kv_stride, dv, kv_stride, dkc, dvc, dout, out_stride, T, P0,
                                   n_ctx, H, n_kv, D, scale, scratch, sb, NULL);
    } else {
        st = nstf_gpu_flash_attn(dq, q_stride, dk, kv_stride, dv, kv_stride, dkc, dvc, dout, out_stride, T, P0, n_ctx,
                                 H, n_kv, D, scale, NULL);
    }
    CHECK(st == NSTF_OK, "launch status %d: %s", (int)st, nstf_last_error());
    DEV_CHECK(gpuDeviceSynchronize());
    std::vector<uint16_t> out(T * out_stride), kc2(n_ctx * kvd), vc2(n_ctx * kvd);
    int guard = dev_fetch_guarded(out.data(), dout, o_b);
    guard &= dev_fetch_guarded(kc2.data(), dkc, c_b);
    guard &= dev_fetch_guarded(vc2.data(), dvc, c_b);

    /* cache: exact */
    int64_t cache_bad = 0;
    for (int64_t p = 0; p < n_ctx; p++)
        for (int64_t i = 0; i < kvd; i++) {
            uint16_t ek = p < P0 + T ? key(p, 0)[i] : 0xffff, ev = p < P0 + T ? val(p, 0)[i] : 0xffff;
            cache_bad += kc2[p * kvd + i] != ek || vc2[p * kvd + i] != ev;
        }

    /* query tokens to check */
    std::vector<int64_t> toks;
    const int64_t full_cost = T * (P0 + T) * H;
    if (full_cost <= 4000000) {
        for (int64_t t = 0; t < T; t++) toks.push_back(t);
    } else {
        for (int64_t t = 0; t < 8; t++) toks.push_back(t);
        for (int64_t t = T - 8; t < T; t++) toks.push_back(t);
        for (int i = 0; i < 24; i++) toks.push_back(8 + (int64_t)(rng_next(&rng) % (uint64_t)(T - 16)));
    }
    const int64_t n_val = (int64_t)toks.size() * H * D;
    std::vector<double> ref(n_val);
    std::vector<float> got(n_val), naive(n_val);
    std::vector<double> sd(P0 + T);
    std::vector<float> sf(P0 + T);
    int64_t vi = 0;
    for (int64_t t : toks)
        for (int h = 0; h < H; h++) {
            const int hk = h / tc.group;
            const int64_t n_keys = P0 + t + 1;
            const uint16_t *qr = &q[t * q_stride + (int64_t)h * D];
            double md = -1e300;
            float mf = -INFINITY;
            for (int64_t p = 0; p < n_keys; p++) {
                const uint16_t *kr = key(p, hk);
                double a = 0;
                float b = 0;
                for (int d = 0; d < D; d++) {
                    a += (double)bf2f(qr[d]) * bf2f(kr[d]);
                    b += bf2f(qr[d]) * bf2f(kr[d]);
                }
                sd[p] = a * (1.0 / sqrt((double)D));
                sf[p] = b * scale;
                md = sd[p] > md ? sd[p] : md;
                mf = fmaxf(mf, sf[p]);
            }
            double ld = 0;
            float lf = 0;
            for (int64_t p = 0; p < n_keys; p++) {
                sd[p] = exp(sd[p] - md);
                sf[p] = expf(sf[p] - mf);
                ld += sd[p];
                lf += sf[p];
            }
            for (int d = 0; d < D; d++) {
                double od = 0;
                float of = 0;
                for (int64_t p = 0; p < n_keys; p++) {
                    float x = bf2f(val(p, hk)[d]);
                    od += sd[p] * x;
                    of += sf[p] * x;
                }
                ref[vi] = od / ld;
                naive[vi] = round_bf(of / lf);
                got[vi] = bf2f(out[t * out_stride + (int64_t)h * D + d]);
                vi++;
            }
        }
    int64_t bad = 0, bad_n = 0;
    double ek = rms_err(got.data(), ref.data(), n_val, &bad), en = rms_err(naive.data(), ref.data(), n_val, &bad_n);
    double rr = rms(ref.data(), n_val);
    int ok = guard && bad == 0 && cache_bad == 0 && within_2x_naive(ek, en, rr);
    printf("  %-7s n_tok=%-5lld pos0=%-5lld heads=%2d/%d hd=%-3d checked=%-5zu err %.3e naive %.3e%s\n",
           tc.decode ? "decode" : "prefill", (long long)T, (long long)P0, H, n_kv, D, toks.size(), ek, en,
           ok ? "" : "  FAIL");
    CHECK(guard, "guard region overwritten");
    CHECK(bad == 0, "%lld non-finite outputs", (long long)bad);
    CHECK(cache_bad == 0, "%lld KV-cache values wrong", (long long)cache_bad);
    CHECK(within_2x_naive(ek, en, rr), "error %.3e > 2x naive %.3e", ek, en);
    DEV_CHECK(gpuFree(dq)); DEV_CHECK(gpuFree(dk)); DEV_CHECK(gpuFree(dv));
    DEV_CHECK(gpuFree(dkc)); DEV_CHECK(gpuFree(dvc)); DEV_CHECK(gpuFree(dout));
    if (scratch) DEV_CHECK(gpuFree(scratch));
}

int main(void) {
    int n_dev = 0;
    if (gpuGetDeviceCount(&n_dev) != gpuSuccess || n_dev == 0) {
        printf("test_attention_gpu: no GPU, skipped\n");
        return 77;
    }
    uint64_t seed = 100;
    const int groups[] = {1, 3, 4, 8}, hds[] = {64, 128};
    for (int hd : hds)
        for (int g : groups) {
            /* prefill: tile tails, pos0 > 0, long sequences */
            const int64_t pf[][2] = {{1, 0}, {37, 0}, {100, 29}, {300, 700}, {129, 64}};
            for (const auto &c : pf) run_case({c[0], c[1], 2, g, hd, false}, seed++);
            /* decode: n_tok 1 and the largest n_tok that fits 16 rows */
            const int64_t dc[][2] = {{1, 0}, {1, 1}, {1, 63}, {1, 1000}, {1, 4095}, {16 / g, 517}, {2, 40}};
            for (const auto &c : dc)
                if (c[0] * g <= 16) run_case({c[0], c[1], 2, g, hd, true}, seed++);
        }
    /* long prefill: 4096 tokens, and 2048 tokens after 2048 cached */
    run_case({4096, 0, 8, 4, 64, false}, seed++);
    run_case({2048, 2048, 8, 4, 128, false}, seed++);
    run_case({4096, 0, 1, 8, 128, false}, seed++);
    run_case({1, 8191, 8, 4, 128, true}, seed++);
    /* argument validation */
    {
        uint16_t *d = (uint16_t *)dev_alloc_poisoned(1 << 16);
        CHECK(nstf_gpu_flash_attn(d, 96, d, 96, d, 96, d, d, d, 96, 4, 0, 8, 1, 1, 96, 0.1f, NULL) ==
                  NSTF_ERR_UNSUPPORTED, "head_dim 96 must be refused");
        CHECK(nstf_gpu_flash_attn(d, 192, d, 128, d, 128, d, d, d, 192, 4, 6, 8, 3, 2, 64, 0.1f, NULL) !=
                  NSTF_OK, "n_heads %% n_kv != 0 and pos0 + n_tok > n_ctx must be refused");
        CHECK(nstf_gpu_flash_decode(d, 64 * 8, d, 64, d, 64, d, d, d, 64 * 8, 3, 0, 8, 8, 1, 64, 0.1f, d, 1 << 16,
                                    NULL) == NSTF_ERR_UNSUPPORTED, "decode with > 16 rows per kv head must be refused");
        DEV_CHECK(gpuFree(d));
    }
    return test_finish("test_attention_gpu");
}
