/* matmul_lr.cu — the GPU entry of the MATMUL_LR op: a matrix stored as
 * low-rank factors, y = (x A^T) B^T, as two launches of the existing
 * matmul kernels through a bf16 intermediate tmp [n, rank]: the GEMV with
 * fused dequantization for a few tokens, else the tile GEMM on bf16
 * factors (dequantized into the caller's workspace unless they are bf16;
 * a rank that is not a multiple of 8 padded there with zero columns).
 * Not fused: the intermediate makes one round trip through memory, which
 * for decode is n * rank * 2 bytes against the factors' r (n_in + n_out)
 * weights. A fused kernel (tmp kept in shared memory) is the next step. */
#include "gpu.h"

/* dst [rows, ld] = src [rows, cols] (bf16) with zeros in columns cols ..
 * ld - 1: a factor's rows and the intermediate's padded to a K the GEMM
 * takes. */
__global__ void __launch_bounds__(256) lr_pad_kernel(const uint16_t *__restrict__ src, uint16_t *__restrict__ dst,
                                                     int64_t rows, int64_t cols, int64_t ld) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    const int64_t total = rows * ld;
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < total; i += (int64_t)gridDim.x * 256) {
        const int64_t r = i / ld, c = i % ld;
        dst[i] = c < cols ? src[r * cols + c] : (uint16_t)0;
    }
}

static nstf_status lr_pad(const uint16_t *src, uint16_t *dst, int64_t rows, int64_t cols, int64_t ld, void *stream) {
    const int64_t blocks = (rows * ld + 255) / 256;
    lr_pad_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, (gpuStream_t)stream>>>(src, dst, rows, cols,
                                                                                                 ld);
    GPU_LAUNCH_CHECK((gpuStream_t)stream);
    return NSTF_OK;
}

extern "C" uint64_t nstf_gpu_matmul_lr_ws_elems(nstf_type wt, int64_t n, int64_t n_in, int64_t n_out) {
    const int64_t k8 = (n_in + 7) / 8 * 8, deq = wt == NSTF_TYPE_BF16 ? 0 : n_out * n_in;
    return (uint64_t)(n_in % 8 ? n * k8 + n_out * k8 + deq : deq);
}

/* The workspace elements lr_stage needs for the GEMM (0: none; -1: the
 * GEMV instead). */
static int64_t lr_ws_elems(nstf_type wt, int64_t n, int64_t n_in, int64_t n_out, const nstf_gpu_lr_ws *ws) {
    if (n <= ws->gemv_max_tok) return -1;
    const uint64_t need = nstf_gpu_matmul_lr_ws_elems(wt, n, n_in, n_out);
    return need > 0 && (!ws->wtmp || need > ws->wtmp_elems) ? -1 : (int64_t)need;
}

/* One factor: y [n, n_out] = x [n, n_in] W^T. The GEMM reads rows in
 * 16-byte pieces, so a K (n_in: the rank, for B) that is not a multiple of
 * 8 is padded with zero columns in the workspace, x and W both (the
 * products of the zeros add nothing); the GEMV where the workspace is
 * short or the tokens few. */
static nstf_status lr_stage(nstf_type wt, const void *w, const uint16_t *x, void *y, nstf_type yt, int64_t n,
                            int64_t n_in, int64_t n_out, const nstf_gpu_lr_ws *ws, void *stream) {
    if (lr_ws_elems(wt, n, n_in, n_out, ws) < 0) return nstf_gpu_gemv(wt, w, x, y, yt, n, n_in, n_out, stream);
    const int64_t k8 = (n_in + 7) / 8 * 8;
    uint16_t *xp = ws->wtmp, *wp = xp + (n_in % 8 ? n * k8 : 0), *wd = wp + (n_in % 8 ? n_out * k8 : 0);
    const uint16_t *wb = (const uint16_t *)w;
    if (wt != NSTF_TYPE_BF16) {
        NSTF_TRY(nstf_gpu_get_rows(wt, w, n_out, NULL, wd, NSTF_TYPE_BF16, n_out, n_in, stream));
        wb = wd;
    }
    if (n_in % 8) {
        NSTF_TRY(lr_pad(x, xp, n, n_in, k8, stream));
        NSTF_TRY(lr_pad(wb, wp, n_out, n_in, k8, stream));
        x = xp, wb = wp;
    }
    return nstf_gpu_gemm_bf16(x, wb, y, yt, NULL, NSTF_TYPE_F32, n, n_out, k8, NSTF_GEMM_EPI_NONE, stream);
}

extern "C" int nstf_gpu_matmul_lr_kernels(nstf_type wt, int64_t n, int64_t n_in, int64_t n_out,
                                          const nstf_gpu_lr_ws *ws) {
    if (lr_ws_elems(wt, n, n_in, n_out, ws) < 0) return 1;
    return 1 + (wt != NSTF_TYPE_BF16) + (n_in % 8 ? 2 : 0);
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
