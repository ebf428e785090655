/* gemm_bwd.cu — the matmul gradients on the matrix units: C (+)= A B with
 * bf16 operands in any orientation and fp32 accumulation (mma.h), for
 *   dX  = dY W        (A = dY [n, out] as stored, B = W [out, in] k-major)
 *   dW += dY^T X      (A = dY read transposed, B = X [n, in] k-major)
 * and the cross-entropy's two gradient GEMMs per vocabulary chunk.
 *
 * Block tile 64 x 128 x 32, 8 waves each owning a 32 x 32 patch (2 x 2 mma
 * tiles). An operand tile sits in shared memory in its stored orientation
 * (rows of the contiguous extent, padded by 8 elements: 80, 144 or 272
 * bytes, an odd number of 16-byte units, so ldmatrix rows fall in distinct
 * bank groups) and its fragments are read with the matching loader
 * (load_a / load_a_km, load_b / load_b_kn). Two stages: cp.async on sm_80+,
 * plain 16-byte loads elsewhere. Rows and k past the edges are zero-filled,
 * so M, N and K are free; only the contiguous extent of each operand moves
 * in 16-byte pieces (see nstf_gpu_gemm_ex in gpu_api.h).
 *
 * The portable path is all this file has. On Hopper the backend instead
 * transposes the operand that is not k-major (nstf_gpu_transpose_bf16,
 * below) and runs the forward's wgmma GEMM (gemm.cu): a copy of 2 bytes
 * per element buys the wgmma rate (backend/gpu_ops.c, bwd_wgmma). */
#include "mma.h"

typedef unsigned short u16;

#define GB_BM 64
#define GB_BN 128
#define GB_BK 32
#define GB_WM 32
#define GB_WN 32
#define GB_NW ((GB_BM / GB_WM) * (GB_BN / GB_WN)) /* 8 waves */
#define GB_PAD 8

/* Rows [r0, r0 + ROWS) x columns [c0, c0 + COLS) of a row-major matrix
 * (rows_total x cols_total, row stride ld) into s [ROWS][COLS + PAD];
 * 16-byte pieces along the columns (cols_total % 8 == 0), zeros outside. */
template <int ROWS, int COLS>
static __device__ __forceinline__ void gb_load(u16 *s, const u16 *g, int64_t ld, int64_t r0, int64_t rows_total,
                                               int64_t c0, int64_t cols_total, int tid, int nt) {
    constexpr int CH = COLS / 8;
    for (int c = tid; c < ROWS * CH; c += nt) {
        const int row = c / CH, ch = c % CH;
        const int64_t gr = r0 + row, gc = c0 + ch * 8;
        const bool valid = gr < rows_total && gc < cols_total;
        nstf_cp16(s + row * (COLS + GB_PAD) + ch * 8, g + (valid ? gr * ld + gc : 0), valid);
    }
}

/* A tile [BM x BK] and B tile [BK x BN] of k-slice k0 into one stage. */
template <int AKM, int BKN>
static __device__ __forceinline__ void gb_load_stage(u16 *sa, u16 *sb, const u16 *A, int64_t lda, const u16 *B,
                                                     int64_t ldb, int64_t m0, int64_t n0, int64_t k0, int64_t M,
                                                     int64_t N, int64_t K, int tid, int nt) {
    if (AKM)
        gb_load<GB_BK, GB_BM>(sa, A, lda, k0, K, m0, M, tid, nt); /* A^T [K, M] */
    else
        gb_load<GB_BM, GB_BK>(sa, A, lda, m0, M, k0, K, tid, nt); /* A [M, K] */
    if (BKN)
        gb_load<GB_BK, GB_BN>(sb, B, ldb, k0, K, n0, N, tid, nt); /* B [K, N] */
    else
        gb_load<GB_BN, GB_BK>(sb, B, ldb, n0, N, k0, K, tid, nt); /* B^T [N, K] */
}

template <int AKM, int BKN>
__global__ void __launch_bounds__(GB_NW *NSTF_WAVE)
    gemm_bwd_kernel(const u16 *__restrict__ A, int64_t lda, const u16 *__restrict__ B, int64_t ldb, void *C,
                    int64_t ldc, int64_t M, int64_t N, int64_t K, int c_bf16, int acc) {
    constexpr int A_ELEMS = GB_BM * (GB_BK + GB_PAD) > GB_BK * (GB_BM + GB_PAD) ? GB_BM * (GB_BK + GB_PAD)
                                                                                 : GB_BK * (GB_BM + GB_PAD);
    constexpr int B_ELEMS = GB_BN * (GB_BK + GB_PAD) > GB_BK * (GB_BN + GB_PAD) ? GB_BN * (GB_BK + GB_PAD)
                                                                                 : GB_BK * (GB_BN + GB_PAD);
    constexpr int LDA = AKM ? GB_BM + GB_PAD : GB_BK + GB_PAD, LDB = BKN ? GB_BN + GB_PAD : GB_BK + GB_PAD;
    constexpr int TM = GB_WM / 16, TN = GB_WN / 16, NWN = GB_BN / GB_WN;
    __shared__ __align__(16) u16 sa[2][A_ELEMS];
    __shared__ __align__(16) u16 sb[2][B_ELEMS];

    const int tid = threadIdx.x, nt = GB_NW * NSTF_WAVE, wave = tid / NSTF_WAVE;
    const int wm = wave / NWN, wn = wave % NWN;
    const int64_t m0 = (int64_t)blockIdx.y * GB_BM, n0 = (int64_t)blockIdx.x * GB_BN;
    const int64_t ktiles = (K + GB_BK - 1) / GB_BK;

    nstf_mma_c c[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) nstf_mma_zero(c[i][j]);

    gb_load_stage<AKM, BKN>(sa[0], sb[0], A, lda, B, ldb, m0, n0, 0, M, N, K, tid, nt);
    nstf_cp_commit();
    for (int64_t kt = 0; kt < ktiles; kt++) {
        const int cur = (int)(kt & 1);
        if (kt + 1 < ktiles)
            gb_load_stage<AKM, BKN>(sa[cur ^ 1], sb[cur ^ 1], A, lda, B, ldb, m0, n0, (kt + 1) * GB_BK, M, N, K,
                                    tid, nt);
        nstf_cp_commit();
        nstf_cp_wait<1>(); /* the slice of kt has landed; kt + 1 may be in flight */
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GB_BK; kk += 16) {
            nstf_mma_a fa[TM];
            nstf_mma_b fb[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) {
                const int mr = wm * GB_WM + i * 16;
                if (AKM)
                    nstf_mma_load_a_km(fa[i], sa[cur] + kk * LDA + mr, LDA);
                else
                    nstf_mma_load_a(fa[i], sa[cur] + mr * LDA + kk, LDA);
            }
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int nc = wn * GB_WN + j * 16;
                if (BKN)
                    nstf_mma_load_b_kn(fb[j], sb[cur] + kk * LDB + nc, LDB);
                else
                    nstf_mma_load_b(fb[j], sb[cur] + nc * LDB + kk, LDB);
            }
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) nstf_mma(c[i][j], fa[i], fb[j]);
        }
        __syncthreads(); /* the next iteration loads into this stage */
    }
    nstf_cp_wait<0>();

#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++)
#pragma unroll
            for (int e = 0; e < NSTF_MMA_C_N; e++) {
                const int64_t row = m0 + wm * GB_WM + i * 16 + nstf_mma_c_row(e);
                const int64_t col = n0 + wn * GB_WN + j * 16 + nstf_mma_c_col(e);
                if (row >= M || col >= N) continue;
                const int64_t o = row * ldc + col;
                float v = c[i][j].x[e];
                if (c_bf16) {
                    if (acc) v += nstf_mma_bf2f(((const u16 *)C)[o]);
                    ((u16 *)C)[o] = nstf_mma_f2bf(v);
                } else {
                    if (acc) v += ((const float *)C)[o];
                    ((float *)C)[o] = v;
                }
            }
}

/* ---------------------------------------------------------------- host ---- */

template <int AKM, int BKN>
static nstf_status gemm_bwd_launch(const u16 *a, int64_t lda, const u16 *b, int64_t ldb, void *c, int64_t ldc,
                                   int64_t m, int64_t n, int64_t k, int c_bf16, int acc, gpuStream_t s) {
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    dim3 grid((unsigned)((n + GB_BN - 1) / GB_BN), (unsigned)((m + GB_BM - 1) / GB_BM));
    gemm_bwd_kernel<AKM, BKN><<<grid, GB_NW * wave, 0, s>>>(a, lda, b, ldb, c, ldc, m, n, k, c_bf16, acc);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_gemm_ex(const uint16_t *a, int64_t lda, int a_km, const uint16_t *b, int64_t ldb,
                                        int b_kn, void *c, nstf_type c_type, int64_t ldc, int64_t m, int64_t n,
                                        int64_t k, int acc, void *stream) {
    if (!a || !b || !c) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm_ex: NULL operand");
    if (m <= 0 || n <= 0 || k <= 0 || (m + GB_BM - 1) / GB_BM > 65535 || (n + GB_BN - 1) / GB_BN > 0x7fffffff)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm_ex: bad shape M=%lld N=%lld K=%lld", (long long)m,
                              (long long)n, (long long)k);
    if (c_type != NSTF_TYPE_F32 && c_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "gemm_ex: output type %s (want F32 or BF16)",
                              nstf_type_name(c_type));
    /* the contiguous extent of each operand moves in 16-byte pieces */
    const int64_t a_cont = a_km ? m : k, b_cont = b_kn ? n : k;
    if (a_cont % 8 || b_cont % 8 || lda % 8 || ldb % 8 || lda < a_cont || ldb < b_cont || ldc < n)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "gemm_ex: contiguous extents (%lld, %lld) and strides (%lld, %lld) must be "
                              "multiples of 8 and cover the rows (ldc %lld >= N %lld)",
                              (long long)a_cont, (long long)b_cont, (long long)lda, (long long)ldb, (long long)ldc,
                              (long long)n);
    if (((uintptr_t)a | (uintptr_t)b) % 16 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm_ex: A and B must be 16-byte aligned");
    const int cb = c_type == NSTF_TYPE_BF16;
    gpuStream_t s = (gpuStream_t)stream;
    const u16 *a16 = (const u16 *)a, *b16 = (const u16 *)b;
    if (!a_km && !b_kn) return gemm_bwd_launch<0, 0>(a16, lda, b16, ldb, c, ldc, m, n, k, cb, acc, s);
    if (!a_km && b_kn) return gemm_bwd_launch<0, 1>(a16, lda, b16, ldb, c, ldc, m, n, k, cb, acc, s);
    if (a_km && !b_kn) return gemm_bwd_launch<1, 0>(a16, lda, b16, ldb, c, ldc, m, n, k, cb, acc, s);
    return gemm_bwd_launch<1, 1>(a16, lda, b16, ldb, c, ldc, m, n, k, cb, acc, s);
}

extern "C" nstf_status nstf_gpu_matmul_bwd_x(const uint16_t *w, const uint16_t *dy, int64_t dy_stride, void *dx,
                                             nstf_type dx_type, int64_t dx_stride, int64_t n_tok, int64_t n_in,
                                             int64_t n_out, int acc, void *stream) {
    /* dX [n, in] = dY [n, out] W [out, in]: W is B in k-major order */
    return nstf_gpu_gemm_ex(dy, dy_stride, 0, w, n_in, 1, dx, dx_type, dx_stride, n_tok, n_in, n_out, acc, stream);
}

extern "C" nstf_status nstf_gpu_matmul_bwd_w(const uint16_t *x, int64_t x_stride, const uint16_t *dy,
                                             int64_t dy_stride, float *dw, int64_t n_tok, int64_t n_in,
                                             int64_t n_out, void *stream) {
    /* dW [out, in] += dY^T [out, n] X [n, in]: dY read transposed, X k-major */
    return nstf_gpu_gemm_ex(dy, dy_stride, 1, x, x_stride, 1, dw, NSTF_TYPE_F32, n_in, n_out, n_in, n_tok, 1,
                            stream);
}

/* y [cols, rows] = x^T for x [rows, cols] bf16 with row stride ldx: 32 x 32
 * tiles through shared memory (33 columns: the transposed reads fall in
 * distinct banks), 8 rows per pass of the 256 threads. */
__global__ void __launch_bounds__(256) transpose_bf16_kernel(const u16 *__restrict__ x, int64_t ldx,
                                                             u16 *__restrict__ y, int64_t rows, int64_t cols) {
    __shared__ u16 t[32][33];
    const int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (int i = ty; i < 32; i += 8) {
        const int64_t r = r0 + i, c = c0 + tx;
        if (r < rows && c < cols) t[i][tx] = x[r * ldx + c];
    }
    __syncthreads();
    for (int i = ty; i < 32; i += 8) {
        const int64_t c = c0 + i, r = r0 + tx;
        if (c < cols && r < rows) y[c * rows + r] = t[tx][i];
    }
}

extern "C" nstf_status nstf_gpu_transpose_bf16(const uint16_t *x, int64_t ldx, uint16_t *y, int64_t rows,
                                               int64_t cols, void *stream) {
    if (!x || !y || rows <= 0 || cols <= 0 || ldx < cols || (rows + 31) / 32 > 65535 ||
        (cols + 31) / 32 > 0x7fffffff)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "transpose: bad arguments (%lld x %lld, stride %lld)",
                              (long long)rows, (long long)cols, (long long)ldx);
    gpuStream_t s = (gpuStream_t)stream;
    transpose_bf16_kernel<<<dim3((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32)), 256, 0, s>>>(
        (const u16 *)x, ldx, (u16 *)y, rows, cols);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
