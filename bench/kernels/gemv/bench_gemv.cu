/* bench_gemv.cu — GB/s of the decode GEMV (src/ops/gpu/gemv.cu through its
 * launcher) for the SmolLM2-135M, Llama-3.2-1B and Llama-3-8B projection
 * shapes in BF16, Q8_0, Q4_0 and Q4_1, beside two peers measured in the
 * same run on the same card: a device-to-device copy (the bandwidth
 * ceiling, counted as read + write bytes) and cuBLAS's bf16 GEMV
 * (cublasGemmEx with n = n_tok, fp32 compute).
 *
 * Timing: CUDA events around BATCH launches, after warm-up, median of REPS.
 * Weight copies are rotated so that every launch reads its matrix from
 * HBM, not from the 50 MB L2. GB/s counts the bytes a launch must move:
 * W + x + y. Usage: bench_gemv [n_tok [TYPES]] (default 1 token; TYPES a
 * comma list of weight types, default BF16,Q8_0,Q4_0,Q4_1). */
#include "ops/gpu/gpu_api.h"
#include "../common/gpu_time.h" /* time_batch_ms */

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

extern "C" bool nstf_type_from_name(const char *name, nstf_type *out); /* core/dtype.h (C11 only) */

#define BATCH 20
#define REPS 7
#define ROTATE_BYTES (256ull << 20)

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define NK(call)                                                                          \
    do {                                                                                  \
        if ((call) != NSTF_OK) { fprintf(stderr, "%s: %s\n", #call, nstf_last_error()); exit(1); } \
    } while (0)


struct shape {
    const char *model, *name;
    int64_t n_in, n_out;
};

int main(int argc, char **argv) {
    const int n_tok = argc > 1 ? atoi(argv[1]) : 1;
    if (nstf_gpu_device_count() < 1) { printf("bench_gemv: no GPU\n"); return 77; }
    nstf_gpu_info info;
    NK(nstf_gpu_query(0, &info));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    const double copy_gbs = copy_rate_gbs(s, REPS); /* the ceiling */
    printf("device: %s (%s), %d SMs, L2 %.0f MiB\n", info.name, info.arch, info.n_sm, info.l2_bytes / 1048576.0);
    printf("ceiling: device-to-device copy %.0f GB/s (read+write of 1 GiB)\n", copy_gbs);
    printf("n_tok = %d; GB/s = (W + x + y bytes) / median time; %% of copy bandwidth\n\n", n_tok);

    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    cublasSetStream(cb, s);

    const shape shapes[] = {
        {"SmolLM2-135M", "qkv/o 576->576", 576, 576},   {"SmolLM2-135M", "gate/up 576->1536", 576, 1536},
        {"SmolLM2-135M", "down 1536->576", 1536, 576},  {"SmolLM2-135M", "lm_head 576->49152", 576, 49152},
        {"Llama-3.2-1B", "q/o 2048->2048", 2048, 2048}, {"Llama-3.2-1B", "gate/up 2048->8192", 2048, 8192},
        {"Llama-3.2-1B", "down 8192->2048", 8192, 2048}, {"Llama-3.2-1B", "lm_head 2048->128256", 2048, 128256},
        {"Llama-3-8B", "q/o 4096->4096", 4096, 4096},    {"Llama-3-8B", "gate/up 4096->14336", 4096, 14336},
        {"Llama-3-8B", "down 14336->4096", 14336, 4096},
    };
    std::vector<nstf_type> types = {NSTF_TYPE_BF16, NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1};
    if (argc > 2) {
        types.clear();
        char buf[256];
        snprintf(buf, sizeof buf, "%s", argv[2]);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            nstf_type t;
            if (!nstf_type_from_name(tok, &t)) { fprintf(stderr, "bench_gemv: unknown type %s\n", tok); return 2; }
            types.push_back(t);
        }
    }

    printf("%-13s %-22s %-5s %9s %9s %7s %11s %7s  %s\n", "model", "matrix", "type", "MiB", "us", "GB/s",
           "%copy", "cuBLAS", "config");
    for (const shape &sh : shapes) {
        for (nstf_type t : types) {
            uint64_t row_bytes = 0;
            if (!nstf_type_row_bytes(t, sh.n_in, &row_bytes)) continue; /* n_in not whole blocks of t */
            const size_t wbytes = row_bytes * sh.n_out;
            const int n_copies = (int)std::max<uint64_t>(1, (ROTATE_BYTES + wbytes - 1) / wbytes);
            /* one allocation, n_copies matrices; contents: random bytes with
             * sane fp16 scales are not needed for timing, zeros are not
             * special-cased by the kernel either */
            void *w;
            CK(cudaMalloc(&w, wbytes * n_copies));
            CK(cudaMemset(w, 0x11, wbytes * n_copies));
            uint16_t *x, *y;
            CK(cudaMalloc(&x, (size_t)n_tok * sh.n_in * 2));
            CK(cudaMalloc(&y, (size_t)n_tok * sh.n_out * 2));
            CK(cudaMemset(x, 0x3f, (size_t)n_tok * sh.n_in * 2));
            const double bytes = (double)wbytes + n_tok * (sh.n_in + sh.n_out) * 2.0;
            double ms = time_batch_ms(s, 3, BATCH, REPS, [&](int i) {
                NK(nstf_gpu_gemv(t, (char *)w + (size_t)(i % n_copies) * wbytes, x, y, NSTF_TYPE_BF16,
                                 n_tok, sh.n_in, sh.n_out, s));
            });
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            char peer[32] = "-";
            if (t == NSTF_TYPE_BF16) {
                const float one = 1.0f, zero = 0.0f;
                double pms = time_batch_ms(s, 3, BATCH, REPS, [&](int i) {
                    /* column-major view: W^T is [n_in, n_out], so C[n_out, n_tok] = (W^T)^T x */
                    cublasStatus_t st = cublasGemmEx(
                        cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)sh.n_out, n_tok, (int)sh.n_in, &one,
                        (char *)w + (size_t)(i % n_copies) * wbytes, CUDA_R_16BF, (int)sh.n_in, x,
                        CUDA_R_16BF, (int)sh.n_in, &zero, y, CUDA_R_16BF, (int)sh.n_out,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    if (st != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasGemmEx: %d\n", (int)st); exit(1); }
                });
                snprintf(peer, sizeof peer, "%.0f", bytes / (pms * 1e-3) / 1e9);
            }
            printf("%-13s %-22s %-5s %9.2f %9.2f %7.0f %10.1f%% %7s  %s\n", sh.model, sh.name, nstf_type_name(t),
                   wbytes / 1048576.0, ms * 1e3, gbs, 100.0 * gbs / copy_gbs, peer,
                   nstf_gpu_gemv_config(t, w, x, n_tok, sh.n_in));
            CK(cudaFree(w));
            CK(cudaFree(x));
            CK(cudaFree(y));
        }
    }
    cublasDestroy(cb);
    CK(cudaStreamDestroy(s));
    return 0;
}
