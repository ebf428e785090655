/* bench_gemm.cu — TFLOP/s of nstf_gpu_gemm_bf16 beside cuBLAS (cublasGemmEx,
 * bf16 in/out, fp32 compute; linked here only) on the Llama prefill shapes,
 * same card, same run. GPU events, 5 warm-ups, median of 20. "ours" is the
 * default kernel choice (wgmma on Hopper; its tile in the path column),
 * "mma.sync" the portable kernel forced with the switch NSTF_GEMM=mma
 * (nstf_switch_set). Also prints the
 * fused epilogues' cost (default kernel) and the largest relative
 * difference of each of our kernels to cuBLAS; then the training step's
 * shapes (forward, input and weight gradients, fp32 outputs where the step
 * has them) beside cuBLAS (only these with the argument "train"). */
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cublas_v2.h>

#include "core/switches.h"
#include "../common/bench_util.h"
#include "../common/gpu_time.h"


int main(int argc, char **argv) {
    /* "train": only the training step's shapes */
    const bool train_only = argc > 1 && strcmp(argv[1], "train") == 0;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    const int64_t kn[][2] = {{2048, 2048}, {2048, 8192}, {8192, 2048}, {4096, 4096}, {4096, 14336}, {14336, 4096}};
    const int64_t ms[] = {512, 2048};
    const int64_t maxel = 2048 * 14336;
    uint16_t *a, *w, *c, *c2;
    float *r;
    DEV_CHECK(gpuMalloc((void **)&a, maxel * 2));
    DEV_CHECK(gpuMalloc((void **)&w, 14336 * 4096 * 2));
    DEV_CHECK(gpuMalloc((void **)&c, maxel * 2));
    DEV_CHECK(gpuMalloc((void **)&c2, maxel * 2));
    DEV_CHECK(gpuMalloc((void **)&r, maxel * 4));
    {
        std::vector<uint16_t> hbuf(14336 * 4096);
        uint64_t rng = 7;
        for (auto &x : hbuf) x = f2bf(bench_uniform(&rng) * 0.05f);
        DEV_CHECK(gpuMemcpy(w, hbuf.data(), hbuf.size() * 2, gpuMemcpyHostToDevice));
        DEV_CHECK(gpuMemcpy(a, hbuf.data(), maxel * 2, gpuMemcpyHostToDevice));
        DEV_CHECK(gpuMemset(r, 0, maxel * 4));
    }
    if (!train_only) {
        printf("| M | K | N | path | ours TFLOP/s | mma.sync TFLOP/s | cuBLAS TFLOP/s | ours/cuBLAS | mma.sync/cuBLAS "
               "| +residual(f32) | SwiGLU | max rel diff ours / mma.sync |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        std::vector<uint16_t> x(maxel), y(maxel);
        for (int64_t M : ms)
            for (const auto &s : kn) {
                const int64_t K = s[0], N = s[1];
                const double fl = 2.0 * M * N * K;
                (void)nstf_switch_set(NSTF_SW_GEMM, NULL);
                const char *path = nstf_gpu_gemm_path(M, N, K);
                float t_ours = time_ms([&] {
                    nstf_gpu_gemm_bf16(a, w, c, NSTF_TYPE_BF16, NULL, NSTF_TYPE_F32, M, N, K, NSTF_GEMM_EPI_NONE, NULL);
                });
                float t_res = time_ms([&] {
                    nstf_gpu_gemm_bf16(a, w, r, NSTF_TYPE_F32, r, NSTF_TYPE_F32, M, N, K, NSTF_GEMM_EPI_RESIDUAL, NULL);
                });
                float t_swi = time_ms([&] {
                    nstf_gpu_gemm_bf16(a, w, c, NSTF_TYPE_BF16, NULL, NSTF_TYPE_F32, M, N, K, NSTF_GEMM_EPI_SWIGLU,
                                       NULL);
                });
                (void)nstf_switch_set(NSTF_SW_GEMM, "mma");
                float t_mma = time_ms([&] {
                    nstf_gpu_gemm_bf16(a, w, c, NSTF_TYPE_BF16, NULL, NSTF_TYPE_F32, M, N, K, NSTF_GEMM_EPI_NONE, NULL);
                });
                (void)nstf_switch_set(NSTF_SW_GEMM, NULL);
                const float one = 1.0f, zero = 0.0f;
                float t_cub = time_ms([&] {
                    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, w, CUDA_R_16BF, (int)K, a,
                                 CUDA_R_16BF, (int)K, &zero, c2, CUDA_R_16BF, (int)N, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT);
                });
                /* same product from each of our kernels, compared with cuBLAS */
                double diff[2];
                DEV_CHECK(gpuDeviceSynchronize());
                DEV_CHECK(gpuMemcpy(y.data(), c2, M * N * 2, gpuMemcpyDeviceToHost));
                for (int pass = 0; pass < 2; pass++) {
                    if (pass == 1) (void)nstf_switch_set(NSTF_SW_GEMM, "mma");
                    DEV_CHECK(gpuMemset(c, 0xff, M * N * 2));
                    nstf_gpu_gemm_bf16(a, w, c, NSTF_TYPE_BF16, NULL, NSTF_TYPE_F32, M, N, K, NSTF_GEMM_EPI_NONE, NULL);
                    DEV_CHECK(gpuDeviceSynchronize());
                    DEV_CHECK(gpuMemcpy(x.data(), c, M * N * 2, gpuMemcpyDeviceToHost));
                    double md = 0, my = 0;
                    for (int64_t i = 0; i < M * N; i++) {
                        double d = fabs((double)bf2f(x[i]) - (double)bf2f(y[i]));
                        md = std::max(md, d != d ? INFINITY : d); /* NaN (poison left) counts as infinite */
                        my = std::max(my, (double)fabsf(bf2f(y[i])));
                    }
                    diff[pass] = md / (my > 0 ? my : 1);
                }
                (void)nstf_switch_set(NSTF_SW_GEMM, NULL);
                printf("| %lld | %lld | %lld | %s | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.1f | %.1f "
                       "| %.1e / %.1e |\n",
                       (long long)M, (long long)K, (long long)N, path, fl / t_ours / 1e9, fl / t_mma / 1e9,
                       fl / t_cub / 1e9, 100.0 * t_cub / t_ours, 100.0 * t_cub / t_mma, fl / t_res / 1e9,
                       fl / t_swi / 1e9, diff[0], diff[1]);
                fflush(stdout);
            }
        /* the wgmma tile widths one by one (NSTF_GEMM=wgmma256/128/64), for the
         * choice in gemm_wgmma_bn(); only where the wgmma path exists */
        if (strncmp(nstf_gpu_gemm_path(2048, 2048, 2048), "wgmma", 5) == 0) {
            printf("\nwgmma tile sweep, bf16 out, no epilogue (TFLOP/s):\n\n");
            printf("| M | K | N | default | 128x256 | 128x128 | 128x64 |\n|---|---|---|---|---|---|---|\n");
            static const char *const env[] = {"wgmma256", "wgmma128", "wgmma64"};
            for (int64_t M : ms)
                for (const auto &s : kn) {
                    const int64_t K = s[0], N = s[1];
                    const double fl = 2.0 * M * N * K;
                    float t[3];
                    for (int i = 0; i < 3; i++) {
                        (void)nstf_switch_set(NSTF_SW_GEMM, env[i]);
                        t[i] = time_ms([&] {
                            nstf_gpu_gemm_bf16(a, w, c, NSTF_TYPE_BF16, NULL, NSTF_TYPE_F32, M, N, K,
                                               NSTF_GEMM_EPI_NONE, NULL);
                        });
                    }
                    (void)nstf_switch_set(NSTF_SW_GEMM, NULL);
                    printf("| %lld | %lld | %lld | %s | %.1f | %.1f | %.1f |\n", (long long)M, (long long)K,
                           (long long)N,
                           nstf_gpu_gemm_path(M, N, K), fl / t[0] / 1e9, fl / t[1] / 1e9, fl / t[2] / 1e9);
                }
        }
    }
    /* the training step's GEMMs (SmolLM2-135M, 16 x 1024 tokens): the
     * forward and input-gradient products (output fp32 where the step keeps
     * it so) and the weight gradients dW [out, in] += dY^T X over the 16384
     * tokens, each beside cuBLAS with the same output type */
    {
        const int64_t T = 16384;
        const size_t big = (size_t)T * 3072;
        uint16_t *ta, *tw, *tc;
        float *tf, *tdw;
        void *tscr;
        const size_t tscr_bytes = (size_t)256 << 20;
        DEV_CHECK(gpuMalloc((void **)&ta, big * 2));
        DEV_CHECK(gpuMalloc((void **)&tw, big * 2));
        DEV_CHECK(gpuMalloc((void **)&tc, big * 2));
        DEV_CHECK(gpuMalloc((void **)&tf, big * 4));
        DEV_CHECK(gpuMalloc((void **)&tdw, (size_t)3072 * 1536 * 4));
        DEV_CHECK(gpuMalloc(&tscr, tscr_bytes));
        {
            std::vector<uint16_t> hbuf(big);
            uint64_t rng = 11;
            for (auto &x : hbuf) x = f2bf(bench_uniform(&rng) * 0.05f);
            DEV_CHECK(gpuMemcpy(ta, hbuf.data(), big * 2, gpuMemcpyHostToDevice));
            DEV_CHECK(gpuMemcpy(tw, hbuf.data(), big * 2, gpuMemcpyHostToDevice));
            DEV_CHECK(gpuMemset(tdw, 0, (size_t)3072 * 1536 * 4));
        }
        printf("\ntraining shapes, M = %lld tokens (TFLOP/s):\n\n", (long long)T);
        printf("| product | K | N | out | path | ours | cuBLAS | ours/cuBLAS |\n|---|---|---|---|---|---|---|---|\n");
        struct { const char *what; int64_t k, n; bool f32; } fw[] = {
            {"qkv", 576, 960, false},         {"o", 576, 576, true},         {"gate|up", 576, 3072, false},
            {"down", 1536, 576, true},        {"dX down", 576, 1536, false}, {"dX gate|up", 3072, 576, true},
            {"dX o", 576, 576, false},        {"dX qkv", 960, 576, true}};
        for (const auto &f : fw) {
            const double fl = 2.0 * T * f.n * f.k;
            void *out = f.f32 ? (void *)tf : (void *)tc;
            const nstf_type ot = f.f32 ? NSTF_TYPE_F32 : NSTF_TYPE_BF16;
            float t_ours = time_ms([&] {
                nstf_gpu_gemm_bf16(ta, tw, out, ot, NULL, NSTF_TYPE_F32, T, f.n, f.k, NSTF_GEMM_EPI_NONE, NULL);
            });
            const float one = 1.0f, zero = 0.0f;
            float t_cub = time_ms([&] {
                cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)f.n, (int)T, (int)f.k, &one, tw, CUDA_R_16BF, (int)f.k,
                             ta, CUDA_R_16BF, (int)f.k, &zero, out, f.f32 ? CUDA_R_32F : CUDA_R_16BF, (int)f.n,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            });
            printf("| %s | %lld | %lld | %s | %s | %.1f | %.1f | %.0f%% |\n", f.what, (long long)f.k, (long long)f.n,
                   f.f32 ? "f32" : "bf16", nstf_gpu_gemm_path(T, f.n, f.k), fl / t_ours / 1e9, fl / t_cub / 1e9,
                   100.0 * t_cub / t_ours);
        }
        const int64_t dws[][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}}; /* out, in */
        for (const auto &d : dws) {
            const int64_t no = d[0], ni = d[1];
            const double fl = 2.0 * T * no * ni;
            size_t sb = 0;
            const int fast = nstf_gpu_gemm_dw_fast(ta, no, tw, ni, no, ni, T, &sb);
            float t_ours = fast && sb <= tscr_bytes ? time_ms([&] {
                nstf_gpu_gemm_dw(ta, no, tw, ni, tdw, no, ni, T, tscr, tscr_bytes, NULL);
            }) : 0.0f;
            const float one = 1.0f;
            float t_cub = time_ms([&] {
                cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)ni, (int)no, (int)T, &one, tw, CUDA_R_16BF, (int)ni,
                             ta, CUDA_R_16BF, (int)no, &one, tdw, CUDA_R_32F, (int)ni, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT);
            });
            printf("| dW %lldx%lld (+=) | %lld | %lld | f32 | %s | %.1f | %.1f | %.0f%% |\n", (long long)no,
                   (long long)ni, (long long)T, (long long)ni, fast ? "wgmma MN, k split" : "none",
                   t_ours > 0 ? fl / t_ours / 1e9 : 0.0, fl / t_cub / 1e9, t_ours > 0 ? 100.0 * t_cub / t_ours : 0.0);
        }
        gpuFree(ta), gpuFree(tw), gpuFree(tc), gpuFree(tf), gpuFree(tdw), gpuFree(tscr);
    }
    cublasDestroy(h);
    return 0;
}
