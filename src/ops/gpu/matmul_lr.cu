/* matmul_lr.cu — the GPU entry of the MATMUL_LR op: a matrix stored as
 * low-rank factors, y = (x A^T) B^T, as two launches of the existing
 * matmul kernels through a bf16 intermediate tmp [n, rank]: the GEMV with
 * fused dequantization for a few tokens, else the tile GEMM on bf16
 * factors (dequantized into the caller's workspace unless they are bf16).
 * Not fused: the intermediate makes one round trip through memory, which
 * for decode is n * rank * 2 bytes against the factors' r (n_in + n_out)
 * weights. A fused kernel (tmp kept in shared memory) is the next step. */
#include "gpu.h"

/* One factor: y [n, n_out] = x [n, n_in] W^T. */
static nstf_status lr_stage(nstf_type wt, const void *w, const uint16_t *x, void *y, nstf_type yt, int64_t n,
                            int64_t n_in, int64_t n_out, const nstf_gpu_lr_ws *ws, void *stream) {
    /* the GEMM moves rows in 16-byte pieces: a rank that is not a multiple
     * of 8 (either factor's row) goes through the GEMV, 8 tokens at a time */
    if (n <= ws->gemv_max_tok || n_in % 8 || n_out % 8) return nstf_gpu_gemv(wt, w, x, y, yt, n, n_in, n_out, stream);
    const uint16_t *wb = (const uint16_t *)w;
    if (wt != NSTF_TYPE_BF16) {
        if (!ws->wtmp || (uint64_t)n_in * (uint64_t)n_out > ws->wtmp_elems)
            return nstf_gpu_gemv(wt, w, x, y, yt, n, n_in, n_out, stream);
        nstf_status st = nstf_gpu_get_rows(wt, w, n_out, NULL, ws->wtmp, NSTF_TYPE_BF16, n_out, n_in, stream);
        if (st != NSTF_OK) return st;
        wb = ws->wtmp;
    }
    return nstf_gpu_gemm_bf16(x, wb, y, yt, NULL, NSTF_TYPE_F32, n, n_out, n_in, NSTF_GEMM_EPI_NONE, stream);
}

extern "C" int nstf_gpu_matmul_lr_kernels(nstf_type wt, int64_t n, int64_t n_in, int64_t n_out,
                                          const nstf_gpu_lr_ws *ws) {
    if (n <= ws->gemv_max_tok || n_in % 8 || n_out % 8 || wt == NSTF_TYPE_BF16) return 1;
    return (!ws->wtmp || (uint64_t)n_in * (uint64_t)n_out > ws->wtmp_elems) ? 1 : 2;
}

extern "C" nstf_status nstf_gpu_matmul_lr(nstf_type ta, const void *a, nstf_type tb, const void *b,
                                          const uint16_t *x, uint16_t *tmp, void *y, nstf_type y_type, int64_t n,
                                          int64_t n_in, int64_t rank, int64_t n_out, const nstf_gpu_lr_ws *ws,
                                          void *stream) {
    if (n < 1 || n_in < 1 || rank < 1 || n_out < 1 || !tmp)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "matmul_lr: %lld tokens, n_in %lld, rank %lld, n_out %lld",
                              (long long)n, (long long)n_in, (long long)rank, (long long)n_out);
    nstf_status st = lr_stage(ta, a, x, tmp, NSTF_TYPE_BF16, n, n_in, rank, ws, stream);
    if (st != NSTF_OK) return st;
    return lr_stage(tb, b, tmp, y, y_type, n, rank, n_out, ws, stream);
}
