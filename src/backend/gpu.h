/* gpu.h — the GPU backend's state, shared by its two files: gpu.c (device,
 * memory, workspace, the forward bracket with graph capture, options,
 * marks) and gpu_ops.c (the ops of the table on the kernels of
 * ops/gpu/gpu_api.h). Compiled only with a GPU backend (NSTF_HAVE_CUDA or
 * NSTF_HAVE_HIP).
 *
 * Execution levels (set_opt NSTF_OPT_LEVEL):
 * L0 baseline: one op per kernel, separate Q/K/V projections, attention
 *    through a materialized fp32 score matrix (QK^T, scale + mask, softmax,
 *    PV), separate residual add and RMSNorm, separate gate/up + SwiGLU.
 * L1 fused: one QKV GEMV (decode), residual fused into RMSNorm, scale +
 *    mask + softmax in one kernel (scores still materialized).
 * L2 tiled: flash attention (prefill) / split-KV flash decoding, one GEMV
 *    or GEMM over the adjacent Q|K|V and gate|up matrices, SwiGLU over its
 *    rows.
 * L3 ultra (default): L2, with the decode step on fused GEMVs (norm
 *    prologue; RoPE, SwiGLU or residual-add epilogue: 6 kernels per layer,
 *    where the weight types allow; can_fuse), programmatic dependent launch
 *    on sm_90, and replayed as one graph launch.
 * L4 persistent: the decode step recorded once as a program of one
 *    persistent kernel (gpu_l4.c, ops/gpu/decode_l4.cu): one launch per
 *    token, grid barriers in place of kernel boundaries; a step the
 *    kernel does not take (weight types, Qwen's extras, sparse or
 *    low-rank layers) runs as L3, and so does every step with graphs off
 *    or while profiling.
 * Levels 0 and 1 allocate the score matrix [n_heads, n_batch, n_ctx] fp32
 * on first selection (workspace; kept until the backend is freed). */
#ifndef NSTF_BACKEND_GPU_H
#define NSTF_BACKEND_GPU_H

#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include "backend/backend.h"
#include "ops/gpu/gpu_api.h"
#include "ops/gpu/l4_api.h"

#define GPU_N_LEVELS 5
#define GPU_DEFAULT_LEVEL 3 /* L4 is not yet faster on the models measured (docs/levels.md) */
#define GEMV_MAX_TOK 8 /* at most this many tokens use the GEMV (weights as stored) */

typedef struct gpu_l4 gpu_l4;

typedef struct gpu_backend {
    nstf_backend base;
    int dev;
    void *stream;
    nstf_gpu_info info;
    /* the model's shape (plan) */
    int dim, n_heads, n_kv_heads, head_dim, n_vocab, n_ctx, n_batch;
    int n_seq, kv_block, kv_blocks; /* paged KV cache: sequences, positions per block, blocks (0: contiguous) */
    float rope_base;
    /* workspace: one allocation carved by a size table (prepare) */
    void *ws;
    uint64_t ws_bytes;
    int32_t *ids, *pos; /* [n_batch] the batch of a prefill */
    int32_t *dio;       /* the decode step's {token, position} */
    int32_t *seq, *rows; /* [n_batch] a continuous batch's sequence slots, the rows whose logits it wants */
    int32_t *blocks;    /* [n_seq, n_ctx / kv_block] the block tables of a paged cache */
    uint16_t *wtmp;     /* bf16 copy of one dequantized matrix (NULL: every layer matrix is bf16) */
    uint64_t wtmp_elems;
    void *am_scratch, *fd_scratch;
    /* the Q8_0 cache's prefill: one layer's cached rows widened to bf16,
     * K then V, [n_ctx, kv_dim] each (nstf_gpu_kv_q8_prepare; NULL without) */
    bool kv_q8;
    uint16_t *kv_bf;
    size_t am_bytes, fd_bytes;
    float *rope_freqs;  /* [head_dim] RoPE frequencies for the fused QKV GEMV */
    float *scores;      /* L0/L1: [n_heads, n_batch, n_ctx] */
    uint64_t scores_bytes;
    /* the current forward */
    bool decode_step;   /* one token at level >= 2: positions read on the device (dio) */
    bool row_invariant; /* the batch's rows must not depend on their count: matmuls skip the GEMV */
    int64_t pos0, bound;
    int64_t unfused;    /* matmuls of this decode step that can_fuse declined */
    /* graph of the decode step */
    void *graph;
    int64_t graph_bound, graph_nodes, k0;
    bool graph_argmax, graphs_on, graph_used, decoded_once, capturing;
    /* level 4 (gpu_l4.c) */
    gpu_l4 *l4;
    bool l4_rec, l4_used; /* this step: recording the program; ran the persistent kernel */
    /* options */
    int level;
    bool fused_on, prof_on, model_fusable;
    int pdl_prev;
    bool pdl_set;
    int64_t n_kernels;
    /* time marks */
    void **evs;
    int n_evs;
    /* the training ops' scratch (gpu_ops.c), grown on first need */
    void *tscratch;
    size_t tscratch_bytes;
} gpu_backend;

static inline gpu_backend *gpu_of(nstf_backend *be) { return (gpu_backend *)be; }

/* gpu_ops.c: one function per row of the op table, place and can_fuse. */
#define NSTF_X(U, l, ref, cpu, gpu, d) nstf_status nstf_gpu_op_##l(nstf_backend *be, const nstf_op_args *a);
NSTF_OPS(NSTF_X)
#undef NSTF_X
void nstf_gpu_place(nstf_backend *be, const nstf_matrix *const *w, int n_w, int64_t n, void *buf, nstf_view *out);
bool nstf_gpu_can_fuse(nstf_backend *be, const nstf_op_args *a);

/* A device buffer *p of *have bytes grown to at least `want` (the stream
 * drained before the old, smaller one is freed; kept when big enough). */
nstf_status gpu_grow(gpu_backend *g, void **p, size_t *have, size_t want);

/* gpu_l4.c: level 4 (the bracket calls begin/end/check; ops go to record
 * while g->l4_rec). */
nstf_status gpu_l4_begin(gpu_backend *g, const nstf_batch *b, bool *replayed);
nstf_status gpu_l4_record(gpu_backend *g, const nstf_op_args *a);
nstf_status gpu_l4_end(gpu_backend *g, const nstf_batch *b, nstf_status st, bool *retry);
nstf_status gpu_l4_check(gpu_backend *g);
void gpu_l4_drop(gpu_backend *g);
void gpu_l4_free(gpu_backend *g);
const char *gpu_l4_reason(const gpu_backend *g);
nstf_status gpu_l4_set_stall(gpu_backend *g, int block, int ins, int timeout_ms);
int64_t gpu_l4_instructions(const gpu_backend *g);
nstf_status gpu_l4_trace(gpu_backend *g, bool on);
nstf_status gpu_l4_trace_get(gpu_backend *g, nstf_l4_profile *out);

#endif
#endif
