/* gemv_common.h — what the decode GEMV files share: gemv.cu (the float
 * kernel and nstf_gpu_gemv), gemvq.cu (the quantized kernel), gemv_fused.h
 * and gemv_fused.cu (the fusions: device side and nstf_gpu_gemv_fused).
 * Block shape constants, the weight kinds, the launch options every kernel
 * takes (gemv_fz), the launch plan, and the kernel instances each kernel
 * file hands out. Split as ggml splits mmv (float) and mmvq (quantized). */
#ifndef NSTF_GEMV_COMMON_H
#define NSTF_GEMV_COMMON_H

#include "gpu.h"

#define GEMV_THREADS 256
#define GEMV_ROWS 8
#define GEMV_SMEM_BYTES 32768 /* x staging: 7 blocks of 256 threads per SM on H100 */
#define GEMV_MAX_NT 8
/* rows per block of the quantized kernel (gemvq.cu) */
#define GEMVQ_ROWS 16
#define GEMVQ_ROWS_BIG 32   /* n_out >= GEMVQ_BIG_OUT: more x reuse, still enough blocks */
#define GEMVQ_BIG_OUT 8192

enum { GW_F32, GW_F16, GW_BF16, GW_Q8_0, GW_Q4_0, GW_Q4_1, GW_F32_S, GW_F16_S, GW_BF16_S };

/* 2 bytes at p (2-byte aligned) */
static __device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    return *(const uint16_t *)p;
}

/* ---- launch options: the fusions (nstf_gpu_gemv_fused) and the prefetch -- *
 * FZ = norm bit | epilogue << 1. FZ 0 is the plain GEMV. A fused kernel is
 * one token (NT 1). The epilogues ROPE and SWIGLU combine two rows: a block
 * of R row slots then computes R/2 pairs, slot s < R/2 the first row of
 * pair s and slot R/2 + s the second, and after the reduction the pairs
 * meet in shared memory. Pairs: SWIGLU (j, n_out/2 + j); ROPE, in the
 * rotated rows, (head h, dim 2i | 2i+1) or (i | i + head_dim/2) for NEOX,
 * past them (2p, 2p + 1) stored plainly. */
#define FZ_NORM 1
#define FZ_EPI(fz) ((fz) >> 1)

struct gemv_fz {
    const float *nx, *nw; /* norm prologue: f32 x and weights */
    float eps;
    int rope_rows, hd, neox;
    const int32_t *pos;
    const float *freqs; /* [hd/2] hi, [hd/2] lo */
    int prefetch;       /* bytes per row to L2-prefetch before the PDL wait (0: none)... */
    int pf_blocks;      /* ...in blocks below this index (the first wave) */
    int no_pre;         /* 1: no early weight loads (the switch NSTF_GEMV_PRE=0, measurement) */
};

#define FZ_PAIR(fz) (FZ_EPI(fz) == NSTF_GEMV_ROPE || FZ_EPI(fz) == NSTF_GEMV_SWIGLU)

/* ---- launch plan --------------------------------------------------------- */

struct gemv_plan {
    int wt;        /* GW_* */
    int chunk;     /* x elements staged per pass */
    int n_chunks;
    int x_vec;
    int quant;     /* gemvq_kernel (Q8_0, Q4_0, 4-byte aligned Q4_1) */
    size_t smem;
};

static inline int gemv_wt(nstf_type t, bool vec) {
    switch (t) {
    case NSTF_TYPE_F32: return vec ? GW_F32 : GW_F32_S;
    case NSTF_TYPE_F16: return vec ? GW_F16 : GW_F16_S;
    case NSTF_TYPE_BF16: return vec ? GW_BF16 : GW_BF16_S;
    case NSTF_TYPE_Q8_0: return GW_Q8_0;
    case NSTF_TYPE_Q4_0: return GW_Q4_0;
    case NSTF_TYPE_Q4_1: return GW_Q4_1;
    default: return -1; /* no GEMV for the type: the launcher refuses it */
    }
}

static inline gemv_plan gemv_make_plan(nstf_type wtype, const void *w, const uint16_t *x, int nt,
                                       int64_t n_in) {
    gemv_plan p;
    const bool x_al = ((uintptr_t)x % 16) == 0 && n_in % 8 == 0;
    const bool w_al = ((uintptr_t)w % 16) == 0 && n_in % 8 == 0;
    p.wt = gemv_wt(wtype, w_al && x_al);
    p.x_vec = x_al;
    p.quant = p.wt == GW_Q8_0 || p.wt == GW_Q4_0 || (p.wt == GW_Q4_1 && (uintptr_t)w % 4 == 0);
    /* chunk: a multiple of 32 elements (a quantized block; 16 bytes of bf16
     * x), as large as the staging budget allows for nt token rows. */
    const int xbytes = (p.quant && nt == 1) ? 4 : 2; /* gemvq stages fp32 x for one token */
    int64_t cap = (GEMV_SMEM_BYTES / (xbytes * nt)) / 32 * 32;
    int64_t need = (n_in + 31) / 32 * 32;
    p.chunk = (int)(need < cap ? need : cap);
    p.n_chunks = (int)((n_in + p.chunk - 1) / p.chunk);
    p.smem = (size_t)nt * (size_t)p.chunk * (size_t)xbytes;
    if (p.quant && p.wt != GW_Q8_0) p.smem += (size_t)nt * (size_t)(p.chunk / 16) * 4; /* x sums */
    return p;
}

/* A kernel instance, as the launchers take it. */
typedef void (*gemv_fn)(const uint8_t *, size_t, const uint16_t *, void *, int, int, int, int, const gemv_fz);

/* The fused instance of one kernel family for FZ = fz (1..7): the pair
 * epilogues (ROPE, SWIGLU) write bf16, STORE and ACCUM fp32. P::get<FZ,
 * Y_BF16>() names the instance; NULL for fz 0 (the plain GEMV). */
template <class P> static inline gemv_fn gemv_fz_dispatch(int fz, const P &p) {
    switch (fz) {
    case 0 * 2 + 1: return p.template get<0 * 2 + 1, false>();
    case 1 * 2 + 0: return p.template get<1 * 2 + 0, false>();
    case 1 * 2 + 1: return p.template get<1 * 2 + 1, false>();
    case 2 * 2 + 0: return p.template get<2 * 2 + 0, true>();
    case 2 * 2 + 1: return p.template get<2 * 2 + 1, true>();
    case 3 * 2 + 0: return p.template get<3 * 2 + 0, true>();
    case 3 * 2 + 1: return p.template get<3 * 2 + 1, true>();
    }
    return nullptr;
}

/* gemv.cu */
gemv_fn nstf_gemv_bf16_fused_pick(int fz, int rows); /* fused bf16 instance, blocks of 8, 16 or 32 rows */
void nstf_gemv_prefetch_plan(gemv_fz *f, uint64_t matrix_bytes); /* the PDL prefetch of a decode GEMV */
/* gemvq.cu */
gemv_fn nstf_gemvq_pick(int wt, int nt, int rows, bool y_bf16); /* plain instance, nt tokens */
gemv_fn nstf_gemvq_fused_pick(int wt, int fz);                  /* fused instance, GEMVQ_ROWS */

#endif
