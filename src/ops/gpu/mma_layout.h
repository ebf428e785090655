/* mma_layout.h — the register layouts of the matrix-unit tiles of mma.h as
 * index math: which elements of a 16x16 tile a lane holds, for each of the
 * three targets, as plain functions of (lane, element). mma.h picks its
 * target's set (nstf_mma_c_row, its loads); tests/test_wave_emu.c (C11,
 * host) calls all three sets to check the layouts on the CPU. Plain C that
 * also compiles as CUDA/HIP host and device code, like wave_algo.h.
 *
 * Per target, with l the lane:
 *  - C tile (fp32 accumulator), element i of NSTF_MMA_<T>_C_N per lane:
 *    c_row(l, i), c_col(l, i); the element lies in the lane's row slot
 *    c_slot(i) (of NSTF_MMA_<T>_C_ROWS), whose tile row is slot_row(l, r);
 *    NSTF_MMA_<T>_ROW_LANES lanes share a row.
 *  - loads from shared memory (row-major, row stride ld): the lane's first
 *    element is at row *_row(l), column *_col(l) of the stored tile:
 *      a    A[m][k]                  (nstf_mma_load_a)
 *      b    B stored n-major, B[n][k] (nstf_mma_load_b): row n, column k
 *      bkn  B stored k-major, B[k][n] (nstf_mma_load_b_kn): row k, column n
 *    NVIDIA: the address lane l gives ldmatrix.x4 (lanes 8m..8m+7 address
 *    the rows of 8x8 matrix m, 8 elements each). AMD: the lane's own
 *    elements, the next ones along the row (a, b) or down the column (bkn).
 * The layouts themselves are documented at the top of mma.h. */
#ifndef NSTF_GPU_MMA_LAYOUT_H
#define NSTF_GPU_MMA_LAYOUT_H

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define NSTF_ML_FN static __host__ __device__ __forceinline__
#else
#define NSTF_ML_FN static inline
#endif

/* ---- NVIDIA: two mma.sync m16n8k16 per 16x16x16 step, wave 32 ---- */
#define NSTF_MMA_NV_WAVE 32
#define NSTF_MMA_NV_C_N 8
#define NSTF_MMA_NV_C_ROWS 2
#define NSTF_MMA_NV_ROW_LANES 4 /* xor 1, 2 */
NSTF_ML_FN int nstf_mma_nv_c_row(int l, int i) { return (l >> 2) + 8 * ((i & 3) >> 1); }
NSTF_ML_FN int nstf_mma_nv_c_col(int l, int i) { return 8 * (i >> 2) + 2 * (l & 3) + (i & 1); }
NSTF_ML_FN int nstf_mma_nv_c_slot(int i) { return (i & 3) >> 1; }
NSTF_ML_FN int nstf_mma_nv_slot_row(int l, int r) { return (l >> 2) + 8 * r; }
NSTF_ML_FN int nstf_mma_nv_a_row(int l) { return (l & 7) + 8 * ((l >> 3) & 1); }
NSTF_ML_FN int nstf_mma_nv_a_col(int l) { return 8 * (l >> 4); }
NSTF_ML_FN int nstf_mma_nv_b_row(int l) { return (l & 7) + 8 * ((l >> 3) >> 1); }
NSTF_ML_FN int nstf_mma_nv_b_col(int l) { return 8 * ((l >> 3) & 1); }
NSTF_ML_FN int nstf_mma_nv_bkn_row(int l) { return (l & 7) + 8 * ((l >> 3) & 1); }
NSTF_ML_FN int nstf_mma_nv_bkn_col(int l) { return 8 * ((l >> 3) >> 1); }

/* ---- CDNA gfx90a/gfx942: mfma_f32_16x16x16bf16_1k, wave 64, 4 elements a lane ---- */
#define NSTF_MMA_MFMA_WAVE 64
#define NSTF_MMA_MFMA_C_N 4
#define NSTF_MMA_MFMA_C_ROWS 4
#define NSTF_MMA_MFMA_ROW_LANES 16
NSTF_ML_FN int nstf_mma_mfma_c_row(int l, int i) { return 4 * (l >> 4) + i; }
NSTF_ML_FN int nstf_mma_mfma_c_col(int l, int i) { return l & 15; }
NSTF_ML_FN int nstf_mma_mfma_c_slot(int i) { return i; }
NSTF_ML_FN int nstf_mma_mfma_slot_row(int l, int r) { return 4 * (l >> 4) + r; }
NSTF_ML_FN int nstf_mma_mfma_a_row(int l) { return l & 15; }
NSTF_ML_FN int nstf_mma_mfma_a_col(int l) { return 4 * (l >> 4); }
NSTF_ML_FN int nstf_mma_mfma_b_row(int l) { return l & 15; }
NSTF_ML_FN int nstf_mma_mfma_b_col(int l) { return 4 * (l >> 4); }
NSTF_ML_FN int nstf_mma_mfma_bkn_row(int l) { return 4 * (l >> 4); }
NSTF_ML_FN int nstf_mma_mfma_bkn_col(int l) { return l & 15; }

/* ---- RDNA3 gfx11: wmma_f32_16x16x16_bf16_w32, wave 32, whole rows of A and B ---- */
#define NSTF_MMA_WMMA_WAVE 32
#define NSTF_MMA_WMMA_C_N 8
#define NSTF_MMA_WMMA_C_ROWS 8
#define NSTF_MMA_WMMA_ROW_LANES 16
NSTF_ML_FN int nstf_mma_wmma_c_row(int l, int i) { return 2 * i + (l >> 4); }
NSTF_ML_FN int nstf_mma_wmma_c_col(int l, int i) { return l & 15; }
NSTF_ML_FN int nstf_mma_wmma_c_slot(int i) { return i; }
NSTF_ML_FN int nstf_mma_wmma_slot_row(int l, int r) { return 2 * r + (l >> 4); }
NSTF_ML_FN int nstf_mma_wmma_a_row(int l) { return l & 15; } /* lanes 16..31 repeat 0..15 */
NSTF_ML_FN int nstf_mma_wmma_a_col(int l) { return 0; }
NSTF_ML_FN int nstf_mma_wmma_b_row(int l) { return l & 15; }
NSTF_ML_FN int nstf_mma_wmma_b_col(int l) { return 0; }
NSTF_ML_FN int nstf_mma_wmma_bkn_row(int l) { return 0; }
NSTF_ML_FN int nstf_mma_wmma_bkn_col(int l) { return l & 15; }

#endif
