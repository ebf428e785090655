/* bench_attention.cu — nstf_gpu_flash_attn (prefill, causal, pos0 = 0) and
 * nstf_gpu_flash_decode (one token after ctx - 1 cached) on the Llama-3.2-1B
 * (32 q / 8 kv heads, head_dim 64) and Llama-3.1-8B (32 / 8, head_dim 128)
 * configurations. GPU events, 5 warm-ups, median of 20. Prefill prints
 * TFLOP/s counting the causal work (4 * D per query-key pair), for the
 * default kernel (wgmma on sm_90a) and the portable one (NSTF_FLASH=mma,
 * set with nstf_switch_set); also with a 4096-token sliding window, and
 * without a cache (the training forward, keys from the new rows), at 8192
 * tokens; the backward (dO = Q's values) at 2048-8192 tokens, both
 * kernels, counting 2.5x the forward's work; the training step's shape
 * (16 sequences of 1024 tokens, 9 / 3 heads of 64), forward with the lse
 * and backward; decode prints
 * microseconds and the KV bytes read per second. The PyTorch SDPA figures
 * come from sdpa_ref.py run in the same device call. */
#include <algorithm>
#include <vector>

#include "../common/bench_util.h"
#include "../common/gpu_time.h"
#include "core/switches.h"


int main(void) {
    const int H = 32, HKV = 8;
    const int hds[] = {64, 128};
    const int64_t max_ctx = 16384;
    uint16_t *q, *k, *v, *kc, *vc, *o;
    void *scratch;
    const size_t qb = (size_t)max_ctx * H * 128 * 2, kvb = (size_t)max_ctx * HKV * 128 * 2;
    DEV_CHECK(gpuMalloc((void **)&q, qb));
    DEV_CHECK(gpuMalloc((void **)&o, qb));
    uint16_t *dqb;
    DEV_CHECK(gpuMalloc((void **)&dqb, qb));
    DEV_CHECK(gpuMalloc((void **)&k, kvb));
    DEV_CHECK(gpuMalloc((void **)&v, kvb));
    DEV_CHECK(gpuMalloc((void **)&kc, kvb));
    DEV_CHECK(gpuMalloc((void **)&vc, kvb));
    DEV_CHECK(gpuMalloc(&scratch, 64 << 20));
    {
        std::vector<uint16_t> hb((qb > kvb ? qb : kvb) / 2);
        uint64_t rng = 3;
        for (auto &x : hb) x = f2bf(bench_uniform(&rng));
        DEV_CHECK(gpuMemcpy(k, hb.data(), kvb, gpuMemcpyHostToDevice));
        DEV_CHECK(gpuMemcpy(v, hb.data(), kvb, gpuMemcpyHostToDevice));
        DEV_CHECK(gpuMemcpy(kc, hb.data(), kvb, gpuMemcpyHostToDevice));
        DEV_CHECK(gpuMemcpy(vc, hb.data(), kvb, gpuMemcpyHostToDevice));
        DEV_CHECK(gpuMemcpy(q, hb.data(), qb, gpuMemcpyHostToDevice));
    }
    printf("| kernel | head_dim | tokens / ctx | ours | metric |\n|---|---|---|---|---|\n");
    for (int D : hds) {
        const float sc = 1.0f / sqrtf((float)D);
        for (int64_t T : {512, 1024, 2048, 4096, 8192, 16384})
            for (const char *kern : {(const char *)NULL, "mma"}) {
                (void)nstf_switch_set(NSTF_SW_FLASH, kern);
                float ms = time_ms([&] {
                    nstf_gpu_flash_attn(q, H * D, k, HKV * D, v, HKV * D, kc, vc, o, H * D, T, 0, max_ctx, H, HKV, D,
                                        sc, NULL);
                });
                double fl = 4.0 * D * H * (double)T * (T + 1) / 2;
                printf("| prefill %s | %d | %lld | %.1f us | %.1f TFLOP/s |\n", kern ? kern : "default", D,
                       (long long)T, ms * 1e3, fl / ms / 1e9);
            }
        for (const char *kern : {(const char *)NULL, "mma"}) { /* a 4096-token sliding window (Mistral) */
            (void)nstf_switch_set(NSTF_SW_FLASH, kern);
            const int64_t T = 8192, W = 4096;
            float ms = time_ms([&] {
                nstf_gpu_flash_attn_sw(q, H * D, k, HKV * D, v, HKV * D, kc, vc, o, H * D, T, 0, max_ctx, H, HKV, D,
                                       sc, (int)W, NULL);
            });
            /* query-key pairs within the window: sum over t of min(t + 1, W) */
            double fl = 4.0 * D * H * ((double)W * (W + 1) / 2 + (double)(T - W) * W);
            printf("| prefill window %lld %s | %d | %lld | %.1f us | %.1f TFLOP/s |\n", (long long)W,
                   kern ? kern : "default", D, (long long)T, ms * 1e3, fl / ms / 1e9);
        }
        (void)nstf_switch_set(NSTF_SW_FLASH, NULL);
        { /* no cache (the training forward's shape, log-sum-exp saved) */
            const int64_t T = 8192;
            float *lse = (float *)scratch;
            float ms = time_ms([&] {
                nstf_gpu_flash_attn_lse_batch(q, H * D, k, HKV * D, v, HKV * D, o, H * D, lse, T, 1, H, HKV, D, sc,
                                              NULL);
            });
            double fl = 4.0 * D * H * (double)T * (T + 1) / 2;
            printf("| train fwd (lse) | %d | %lld | %.1f us | %.1f TFLOP/s |\n", D, (long long)T, ms * 1e3,
                   fl / ms / 1e9);
        }
        for (int64_t T : {2048, 4096, 8192}) { /* backward (training), from a forward's lse */
            float *lse = (float *)scratch, *bws = lse + T * H;
            uint16_t *dq = dqb, *dk = vc, *dv = vc + T * HKV * D; /* the value cache is free here */
            nstf_gpu_flash_attn_lse_batch(q, H * D, k, HKV * D, v, HKV * D, o, H * D, lse, T, 1, H, HKV, D, sc, NULL);
            const size_t bsb = nstf_gpu_flash_attn_bwd_scratch_bytes(T, H);
            for (const char *kern : {(const char *)NULL, "mma"}) {
                (void)nstf_switch_set(NSTF_SW_FLASH, kern);
                float ms = time_ms([&] {
                    nstf_gpu_flash_attn_bwd(q, H * D, k, HKV * D, v, HKV * D, o, H * D, q, H * D, lse, dq, H * D, dk,
                                            HKV * D, dv, HKV * D, T, 0, H, HKV, D, sc, bws, bsb, NULL);
                });
                /* 2.5x the forward's work (five products to its two), the usual count */
                double fl = 2.5 * 4.0 * D * H * (double)T * (T + 1) / 2;
                printf("| backward %s | %d | %lld | %.1f us | %.1f TFLOP/s |\n", kern ? kern : "default", D,
                       (long long)T, ms * 1e3, fl / ms / 1e9);
            }
            (void)nstf_switch_set(NSTF_SW_FLASH, NULL);
        }
        if (D == 64) { /* the training step's shape: SmolLM2-135M, 16 sequences x 1024 tokens, 9 / 3 heads */
            const int h = 9, hkv = 3;
            const int64_t T = 1024, S = 16, nt = T * S;
            float *lse = (float *)scratch, *bws = lse + nt * h;
            uint16_t *dk = vc, *dv = vc + nt * hkv * D;
            const size_t bsb = nstf_gpu_flash_attn_bwd_scratch_bytes(nt, h);
            for (const char *kern : {(const char *)NULL, "mma"}) {
                (void)nstf_switch_set(NSTF_SW_FLASH, kern);
                float fms = time_ms([&] {
                    nstf_gpu_flash_attn_lse_batch(q, h * D, k, hkv * D, v, hkv * D, o, h * D, lse, T, S, h, hkv, D, sc,
                                                  NULL);
                });
                float bms = time_ms([&] {
                    nstf_gpu_flash_attn_bwd_batch(q, h * D, k, hkv * D, v, hkv * D, o, h * D, q, h * D, lse, dqb,
                                                  h * D, dk, hkv * D, dv, hkv * D, T, S, 0, h, hkv, D, sc, bws, bsb,
                                                  NULL);
                });
                const double fl = 4.0 * D * h * (double)T * (T + 1) / 2 * S;
                printf("| train fwd 16x1024, 9/3 heads %s | %d | %lld | %.1f us | %.1f TFLOP/s |\n",
                       kern ? kern : "default", D, (long long)nt, fms * 1e3, fl / fms / 1e9);
                printf("| backward 16x1024, 9/3 heads %s | %d | %lld | %.1f us | %.1f TFLOP/s |\n",
                       kern ? kern : "default", D, (long long)nt, bms * 1e3, 2.5 * fl / bms / 1e9);
            }
            (void)nstf_switch_set(NSTF_SW_FLASH, NULL);
        }
        for (int64_t ctx : {1024, 4096, 8192}) {
            size_t sb = nstf_gpu_flash_decode_scratch_bytes(1, ctx - 1, H, HKV, D);
            float ms = time_ms([&] {
                nstf_gpu_flash_decode(q, H * D, k, HKV * D, v, HKV * D, kc, vc, o, H * D, 1, ctx - 1, max_ctx, H, HKV,
                                      D, sc, scratch, sb, NULL);
            });
            double bytes = 2.0 * ctx * HKV * D * 2;
            printf("| decode | %d | %lld | %.1f us | %.0f GB/s (KV) |\n", D, (long long)ctx, ms * 1e3,
                   bytes / ms / 1e6);
        }
    }
    DEV_CHECK(gpuDeviceSynchronize());
    printf("last error: %s\n", nstf_last_error());
    return 0;
}
