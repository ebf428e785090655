/* gemv_common.h — what the decode GEMV files share: gemv.cu (the float
 * kernel and nstf_gpu_gemv), gemvq.cu (the quantized kernel of the
 * 32-element block types), gemvk.cu (the super-block kernel of the
 * 256-element types), gemv_fused.h and gemv_fused.cu (the fusions: device
 * side and nstf_gpu_gemv_fused).
 * Block shape constants, the weight kinds, the launch options every kernel
 * takes (gemv_fz), the launch plan, and the kernel instances each kernel
 * file hands out. Split as ggml splits mmv (float) and mmvq (quantized). */
#ifndef NSTF_GEMV_COMMON_H
#define NSTF_GEMV_COMMON_H

#include "quant.h"

#define GEMV_THREADS 256
#define GEMV_ROWS 8
#define GEMV_SMEM_BYTES 32768 /* x staging: 7 blocks of 256 threads per SM on H100 */
#define GEMV_MAX_NT 8
/* rows per block of the quantized kernel (gemvq.cu) */
#define GEMVQ_ROWS 16
#define GEMVQ_ROWS_BIG 32   /* one token, n_out >= GEMVQ_BIG_OUT: more x reuse, still enough blocks */
#define GEMVQ_BIG_OUT 8192
#define GEMVQ_ROWS_SMALL 8  /* one token of a 32-element type on gemvk_i8, long rows, few outputs: more blocks */

/* Weight kinds: the float types (vector and scalar paths), the 32-element
 * block types (gemvq.cu; Q4_1 also gemv.cu's when only 2-byte aligned) and
 * the 256-element super-block types (gemvk.cu). */
enum {
    GW_F32, GW_F16, GW_BF16, GW_Q8_0, GW_Q4_0, GW_Q4_1, GW_F32_S, GW_F16_S, GW_BF16_S,
    GW_Q5_0, GW_Q5_1, GW_IQ4_NL,
    GW_Q2_K, GW_Q3_K, GW_Q4_K, GW_Q5_K, GW_Q6_K, GW_IQ4_XS,
    GW_Q4_0S, GW_IQ4_NLS, GW_Q8_0S, GW_Q6_KS, /* Q4_0, IQ4_NL, Q8_0, Q6_K rows in the GPU's split layout (quant.h) */
    GW_N
};
#define GW_SUPER(wt) (((wt) >= GW_Q2_K && (wt) <= GW_IQ4_XS) || (wt) == GW_Q6_KS) /* gemvk.cu */
#define GW_HALF(wt)                                                                                                  \
    ((wt) == GW_Q8_0 || (wt) == GW_Q4_0 || (wt) == GW_Q4_1 || ((wt) >= GW_Q5_0 && (wt) <= GW_IQ4_NL) ||              \
     ((wt) >= GW_Q4_0S && (wt) <= GW_Q8_0S))
#define GW_SPLIT(wt) ((wt) >= GW_Q4_0S && (wt) <= GW_Q8_0S) /* quant.h's split rows of the 32-element types */

/* ---- launch options: the fusions (nstf_gpu_gemv_fused) and the prefetch -- *
 * FZ = norm bit | epilogue << 1. FZ 0 is the plain GEMV. A fused kernel is
 * one token (NT 1). The epilogues ROPE and SWIGLU combine two rows: a block
 * of R row slots then computes R/2 pairs, slot s < R/2 the first row of
 * pair s and slot R/2 + s the second, and after the reduction the pairs
 * meet in shared memory. Pairs: SWIGLU (j, n_out/2 + j); ROPE, in the
 * rotated rows, (head h, dim 2i | 2i+1) or (i | i + head_dim/2) for NEOX,
 * past them (2p, 2p + 1) stored plainly. ROPE adds the QKV bias (Qwen2)
 * to both rows of a pair before the rotation; with Qwen3's per-head norm
 * the host passes rope_rows 0 (every pair stored plainly, biased) and a
 * second kernel normalizes and rotates (gemv_fused.cu says why). */
#define FZ_NORM 1
#define FZ_EPI(fz) ((fz) >> 1)

struct gemv_fz {
    const float *nx, *nw; /* norm prologue: f32 x and weights */
    float eps;
    int rope_rows, hd, neox;
    const int32_t *pos;
    const float *freqs; /* [hd/2] hi, [hd/2] lo */
    const float *factors; /* [hd/2] RoPE frequency factors, or NULL */
    const float *bq, *bk, *bv; /* ROPE: QKV biases of rows [0, q_end), [q_end, k_end), [k_end, n_out), or NULL */
    int q_end, k_end;
    int prefetch;       /* bytes per row to L2-prefetch before the PDL wait (0: none)... */
    int pf_blocks;      /* ...in blocks below this index (the first wave) */
    int no_pre;         /* 1: no early weight loads (the switch NSTF_GEMV_PRE=0, measurement) */
};

#define FZ_PAIR(fz) (FZ_EPI(fz) == NSTF_GEMV_ROPE || FZ_EPI(fz) == NSTF_GEMV_SWIGLU)

/* ---- launch plan --------------------------------------------------------- */

struct gemv_plan {
    int wt;        /* GW_*, or -1: a type no kernel takes, or a matrix less aligned than its blocks */
    int chunk;     /* x elements staged per pass */
    int n_chunks;
    int x_vec;
    int quant;     /* a quantized kernel: gemvq_kernel (the 32-element types but 2-byte aligned Q4_1) or gemvk_kernel */
    int super;     /* gemvk_kernel (the 256-element types) */
    int i8;        /* gemvk8_kernel (gemvk_i8.cu): one token of Q4_K, Q5_K, Q6_K, IQ4_XS and the 32-element types; x as two int8 planes */
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
    case NSTF_TYPE_Q5_0: return GW_Q5_0;
    case NSTF_TYPE_Q5_1: return GW_Q5_1;
    case NSTF_TYPE_IQ4_NL: return GW_IQ4_NL;
    case NSTF_TYPE_Q2_K: return GW_Q2_K;
    case NSTF_TYPE_Q3_K: return GW_Q3_K;
    case NSTF_TYPE_Q4_K: return GW_Q4_K;
    case NSTF_TYPE_Q5_K: return GW_Q5_K;
    case NSTF_TYPE_Q6_K: return GW_Q6_K;
    case NSTF_TYPE_IQ4_XS: return GW_IQ4_XS;
    default: return -1; /* no GEMV for the type: the launcher refuses it */
    }
}

static inline gemv_plan gemv_make_plan(nstf_type wtype, const void *w, const uint16_t *x, int nt,
                                       int64_t n_in) {
    gemv_plan p;
    const bool x_al = ((uintptr_t)x % 16) == 0 && n_in % 8 == 0;
    const bool w_al = ((uintptr_t)w % 16) == 0 && n_in % 8 == 0;
    p.wt = gemv_wt(wtype, w_al && x_al);
    /* the GPU's split rows: 16-byte aligned or refused */
    if (nstf_gpu_split_rows((int)wtype, n_in))
        p.wt = (uintptr_t)w % 16 != 0                ? -1
               : wtype == NSTF_TYPE_Q4_0   ? GW_Q4_0S
               : wtype == NSTF_TYPE_IQ4_NL ? GW_IQ4_NLS
               : wtype == NSTF_TYPE_Q8_0   ? GW_Q8_0S
                                           : GW_Q6_KS;
    p.x_vec = x_al;
    p.super = GW_SUPER(p.wt);
    p.quant = p.super || (GW_HALF(p.wt) && (p.wt != GW_Q4_1 || (uintptr_t)w % 4 == 0));
    /* the new block types are read with loads as wide as their blocks keep
     * aligned (quant.h); a matrix that is not so aligned is refused (the
     * backend's are 256-byte aligned) */
    if (p.wt >= GW_Q5_0 && (uintptr_t)w % (uintptr_t)nstf_q_align((int)wtype) != 0) p.wt = -1;
    /* chunk: a multiple of the block (32 elements; 256 for the super-block
     * kernel), as large as the staging budget allows for nt token rows */
    p.i8 = nt == 1 && p.quant &&
           (p.wt == GW_Q4_K || p.wt == GW_Q5_K || p.wt == GW_Q6_K || p.wt == GW_Q6_KS || p.wt == GW_IQ4_XS ||
            GW_HALF(p.wt));
    const int blk = p.super || p.i8 ? 256 : 32; /* gemvk8 stages groups of 256 */
    /* staging bytes per 32 elements: two int8 planes and (dx, sum) for
     * gemvk8; fp32 for gemvq at one token and gemvk always; else bf16 */
    const int xbytes32 = p.i8 ? 72 : ((p.quant && nt == 1) || p.super) ? 128 : 64;
    int64_t cap = (GEMV_SMEM_BYTES * 32 / (xbytes32 * nt)) / blk * blk;
    int64_t need = (n_in + blk - 1) / blk * blk;
    p.chunk = (int)(need < cap ? need : cap);
    p.n_chunks = (int)((n_in + p.chunk - 1) / p.chunk);
    p.smem = (size_t)nt * (size_t)p.chunk / 32 * (size_t)xbytes32;
    if (p.quant && !p.i8 && p.wt != GW_Q8_0 && p.wt != GW_Q8_0S) p.smem += (size_t)nt * (size_t)(p.chunk / 16) * 4; /* x sums */
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

/* The plain instances of a quantized kernel family (gemvq.cu, gemvk.cu):
 * K::fn<WT, NT, Y_BF16, ROWS, FZ>() names one kernel, K::pick<Y_BF16,
 * ROWS>(wt, nt) chooses by weight kind; these two choose by token count
 * (1..8) and by rows per block and output type. */
template <class K, int WT, bool YB, int R> static inline gemv_fn gemv_pick_nt(int nt) {
    /* blocks of GEMVQ_ROWS_BIG rows are one token's (nstf_gpu_gemv picks
     * them only then): the multi-token instances exist once, at GEMVQ_ROWS */
    if constexpr (R == GEMVQ_ROWS_BIG) {
        return nt == 1 ? K::template fn<WT, 1, YB, R, 0>() : nullptr;
    } else {
        switch (nt) {
        case 1: return K::template fn<WT, 1, YB, R, 0>();
        case 2: return K::template fn<WT, 2, YB, R, 0>();
        case 3: return K::template fn<WT, 3, YB, R, 0>();
        case 4: return K::template fn<WT, 4, YB, R, 0>();
        case 5: return K::template fn<WT, 5, YB, R, 0>();
        case 6: return K::template fn<WT, 6, YB, R, 0>();
        case 7: return K::template fn<WT, 7, YB, R, 0>();
        default: return K::template fn<WT, 8, YB, R, 0>();
        }
    }
}
template <class K> static inline gemv_fn gemv_pick_plain(int wt, int nt, int rows, bool y_bf16) {
    if (rows == GEMVQ_ROWS_BIG)
        return y_bf16 ? K::template pick<true, GEMVQ_ROWS_BIG>(wt, nt) : K::template pick<false, GEMVQ_ROWS_BIG>(wt, nt);
    return y_bf16 ? K::template pick<true, GEMVQ_ROWS>(wt, nt) : K::template pick<false, GEMVQ_ROWS>(wt, nt);
}

/* sizeof(gemv_fz) as each kernel file was compiled (one per file below):
 * nstf_gpu_gemv_fused launches nothing unless all equal its own. The
 * struct goes by value from gemv_fused.cu into kernels compiled in three
 * other files; a build that recompiled only some of them after gemv_fz
 * changed (a lost header dependency) would run kernels that read the new
 * fields at the old offsets: Qwen2's QKV bias dropped, and no error. */
int nstf_gemv_fz_bytes(void);
int nstf_gemvq_fz_bytes(void);
int nstf_gemvk_fz_bytes(void);
int nstf_gemvk8_fz_bytes(void);

/* gemv.cu */
gemv_fn nstf_gemv_float_fused_pick(int wt, int fz, int rows); /* fused BF16/F16 instance, blocks of 8, 16 or 32 rows */
void nstf_gemv_prefetch_plan(gemv_fz *f, uint64_t matrix_bytes); /* the PDL prefetch of a decode GEMV */
/* gemvq.cu */
gemv_fn nstf_gemvq_pick(int wt, int nt, int rows, bool y_bf16); /* plain instance, nt tokens */
/* gemvk.cu */
gemv_fn nstf_gemvk_pick(int wt, int nt, int rows, bool y_bf16); /* plain instance, nt tokens */
/* gemvk_i8.cu: one token of Q4_K, Q5_K, Q6_K, IQ4_XS and the 32-element types, Q4_1 4-byte aligned (plan.i8) */
int nstf_gemvk8_rows(int wt, int64_t n_in, int64_t n_out, int rope); /* rows per block of gemvk8 (one token) */
gemv_fn nstf_gemvk8_pick(int wt, int rows, bool y_bf16);        /* plain instance, GEMVQ_ROWS, _BIG or _SMALL */
gemv_fn nstf_gemvk8_fused_pick(int wt, int fz, int rows);       /* fused instance, as the plain; NULL: none */

#endif
