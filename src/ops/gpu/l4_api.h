/* l4_api.h — the C interface of level 4, the decode step as one
 * persistent kernel (decode_l4.cu): its program and launcher. Apart from
 * gpu_api.h so that a change here rebuilds decode_l4.cu and the backend,
 * not every kernel. */
#ifndef NSTF_GPU_L4_API_H
#define NSTF_GPU_L4_API_H

#include "ops/gpu/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================
 * Level 4: the decode step as one persistent kernel (decode_l4.cu). The
 * backend records the step's ops once as a program of instructions
 * (backend/gpu_l4.c); one launch of a grid that fills the device runs them
 * all, the blocks meeting at a grid barrier (a counter in global memory)
 * after each instruction instead of at kernel boundaries.
 * ========================================================================== */

/* Most splits of the context per kv head in the attention. */
#define NSTF_L4_SPLITS 64

typedef enum nstf_l4_op {
    NSTF_L4_EMBED = 1, /* x [n_in] f32 = row dio[0] of table w [n_out, n_in] (BF16/F16/F32) */
    NSTF_L4_GEMV,      /* y = W x with the fusions of nstf_gemv_fusion (epi, norm); W BF16 or F16 */
    NSTF_L4_ATTN,      /* one token's attention over the cache rows 0..pos (k, v of pos already there),
                          as split partials that the next GEMV merges (its n_heads > 0) */
} nstf_l4_op;

typedef struct nstf_l4_ins {
    int32_t op;           /* nstf_l4_op */
    int32_t epi;          /* GEMV: nstf_gemv_epi */
    int32_t n_in, n_out;  /* GEMV: W [n_out, n_in]; EMBED: dim, table rows */
    int32_t wtype;        /* nstf_type of w: BF16, F16 (F32: EMBED only) */
    int32_t y_bf16;       /* GEMV STORE: y bf16 (else f32) */
    const void *w;
    const uint16_t *x;    /* GEMV input [n_in] bf16, unless nx */
    const float *nx, *nw; /* GEMV norm prologue: x = bf16(nx * rsqrt(mean(nx^2) + eps) * nw) */
    float eps;
    float scale;          /* ATTN: the scores' scale */
    void *y;              /* GEMV / EMBED output (ACCUM: f32 += ; SWIGLU: [n_out / 2] bf16) */
    int32_t *argmax;      /* GEMV STORE f32: also the greedy row index into argmax[0], or NULL */
    /* ROPE (GEMV): rows [0, q_rows) q heads, [q_rows, rope_rows) k heads, the rest v */
    int32_t rope_rows, q_rows, head_dim, neox;
    const float *freqs, *factors; /* nstf_gpu_rope_freqs' table; [head_dim / 2] or NULL */
    uint16_t *kc, *vc;    /* ROPE: k and v rows also into the cache row at pos ([n_ctx, kv_dim]); ATTN: the cache */
    int32_t kv_dim;       /* n_kv_heads * head_dim */
    /* ATTN */
    const uint16_t *q;    /* [n_heads * head_dim] bf16 */
    uint16_t *out;        /* [n_heads * head_dim] bf16 */
    int32_t n_heads, n_kv_heads, window, layer; /* also on the GEMV after an ATTN: its input is that
                                                   attention's output, merged from the partials */
} nstf_l4_ins;

/* Scratch and control words of the persistent kernel (device memory of
 * nstf_gpu_l4_scratch_bytes; zero it once, and again after a failed step).
 * max_heads: the most query heads of an attention; max_head_dim: the
 * largest head_dim. */
size_t nstf_gpu_l4_scratch_bytes(int grid, int max_heads, int max_head_dim);
/* The grid (blocks: one per SM) and the dynamic shared memory of a
 * program whose widest GEMV input is max_n_in and whose attention groups
 * hold at most max_q query values (heads per kv head x head_dim). */
nstf_status nstf_gpu_l4_shape(int max_n_in, int max_q, int *grid, size_t *smem);
/* Whether the kernel takes this GEMV / attention (types, alignment, sizes). */
int nstf_gpu_l4_gemv_ok(nstf_type wtype, const void *w, int64_t n_in, int64_t n_out);
int nstf_gpu_l4_attn_ok(int n_heads, int n_kv_heads, int head_dim);

/* One step: prog [n_ins] (device), dio {token, position} (device).
 * status: device int32[4], written on a stall: {1, instruction, blocks that
 * arrived, grid}; stall_block >= 0 (a test hook) makes that block leave
 * without arriving at the barrier after instruction stall_ins. A barrier
 * not complete within timeout_ms fails the step (the blocks leave).
 * trace: NULL, or device memory of 1 + 2 n_ins zeroed words: the step's
 * timeline in ns of the device's global timer (the start; for each
 * instruction the time the last block finished its work, and the time
 * block 0 left the barrier after it). */
nstf_status nstf_gpu_l4_launch(const nstf_l4_ins *prog, int n_ins, const int32_t *dio, void *scratch, int grid,
                               size_t smem, int max_heads, int max_head_dim, int max_n_in, int max_q,
                               int32_t *status, int stall_block, int stall_ins, int timeout_ms,
                               unsigned long long *trace, void *stream);

#ifdef __cplusplus
}
#endif
#endif
