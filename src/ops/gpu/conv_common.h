/* conv_common.h — what the conv2d ladder's kernel files share (conv.cu: the
 * launcher and levels 0-1; conv_tiled.cu: levels 2-3; conv_igemm.cu: level
 * 4): the descriptor as a kernel argument with its derived sizes, the index
 * maps of both layouts, the output store, and the launch entries of each
 * file. Included after gpu.h. Layouts are nstf_tools.h's nstf_conv2d_desc:
 *   NCHW: x [n][c][h][w], w [k][cg][r][s], y [n][k][p][q]
 *   NHWC: x [n][h][w][c], w [k][r][s][cg], y [n][p][q][k]
 * In both, a filter row (one output channel) is Kdim = cg * r * s
 * contiguous elements, which is what the implicit GEMM reads as its B. */
#ifndef NSTF_GPU_CONV_COMMON_H
#define NSTF_GPU_CONV_COMMON_H

#include "gpu.h"

typedef unsigned short u16;

/* The descriptor by value, with the output size and per-group counts. */
struct conv_params {
    int64_t n, c, h, w, k, r, s;
    int64_t p, q;   /* output height, width */
    int64_t cg, kg; /* channels in and out per group */
    int sh, sw, ph, pw, dh, dw;
    int groups;
};

static __device__ __forceinline__ float conv_bf(u16 b) { return __uint_as_float((unsigned)b << 16); }

static __device__ __forceinline__ int64_t conv_x_at(const conv_params &cp, bool nhwc, int64_t n, int64_t c, int64_t h,
                                                    int64_t w) {
    return nhwc ? ((n * cp.h + h) * cp.w + w) * cp.c + c : ((n * cp.c + c) * cp.h + h) * cp.w + w;
}
static __device__ __forceinline__ int64_t conv_w_at(const conv_params &cp, bool nhwc, int64_t k, int64_t cg, int64_t r,
                                                    int64_t s) {
    return nhwc ? ((k * cp.r + r) * cp.s + s) * cp.cg + cg : ((k * cp.cg + cg) * cp.r + r) * cp.s + s;
}
static __device__ __forceinline__ int64_t conv_y_at(const conv_params &cp, bool nhwc, int64_t n, int64_t k, int64_t p,
                                                    int64_t q) {
    return nhwc ? ((n * cp.p + p) * cp.q + q) * cp.k + k : ((n * cp.k + k) * cp.p + p) * cp.q + q;
}

/* y[o] = v (+ bias[k]), as bf16 (round to nearest even) or fp32. */
static __device__ __forceinline__ void conv_store(void *y, int64_t o, float v, const float *bias, int64_t k,
                                                  bool y_bf16) {
    if (bias) v += bias[k];
    if (y_bf16)
        ((nstf_bf16 *)y)[o] = nstf_float_to_bf16(v);
    else
        ((float *)y)[o] = v;
}

/* ---- the launch entries of each level's file (arguments checked by
 * nstf_gpu_conv2d; each returns NSTF_ERR_UNSUPPORTED, saying why, for a
 * shape its kernel does not take) ---- */

/* levels 2 (tiled) and 3 (tiled + vectorized loads): conv_tiled.cu */
nstf_status conv_tiled_plan(const conv_params &cp, int vec, int *cc_max, size_t *smem);
nstf_status conv_tiled_launch(const conv_params &cp, bool nhwc, int vec, const u16 *x, const u16 *w,
                              const float *bias, void *y, bool y_bf16, gpuStream_t stream);
/* level 4 (implicit GEMM on the matrix units): conv_igemm.cu */
nstf_status conv_igemm_check(const conv_params &cp);
nstf_status conv_igemm_launch(const conv_params &cp, bool nhwc, const u16 *x, const u16 *w, const float *bias,
                              void *y, bool y_bf16, gpuStream_t stream);

#endif
