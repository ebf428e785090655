/* llama_gpu.h — the Llama forward on a GPU (CUDA or HIP through
 * ops/gpu/gpu_api.h): weights uploaded once into one device allocation,
 * activations and the bf16 KV cache in a second one planned at creation,
 * decode replayed from a captured graph. Implemented in llama_gpu.c, which
 * is compiled only when the build has a GPU backend (NSTF_HAVE_CUDA or
 * NSTF_HAVE_HIP); callers guard their calls the same way. */
#ifndef NSTF_MODEL_LLAMA_GPU_H
#define NSTF_MODEL_LLAMA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/llama.h"

typedef struct nstf_llama_gpu nstf_llama_gpu;

/* One line describing device `dev` ("GPU 0: NVIDIA H100 80GB HBM3, sm_90,
 * 132 SMs, 79.2 GiB (78.7 free), wave 32, L2 50 MiB"). */
nstf_status nstf_gpu_device_line(int dev, char *buf, size_t cap);

/* Upload m's weights to device `dev` and plan activations and a KV cache of
 * n_ctx positions for forwards of up to n_batch tokens. Checks the free
 * device memory before allocating: NSTF_ERR_OOM names what was needed and
 * what is free. m must outlive nothing here (the weights are copied). */
nstf_status nstf_llama_gpu_create(const nstf_llama *m, int dev, int n_ctx, int n_batch,
                                  nstf_llama_gpu **out);
void nstf_llama_gpu_free(nstf_llama_gpu *g);

/* Run n tokens at positions pos0.. (n <= n_batch, pos0 + n <= n_ctx).
 * logits (host, may be NULL): the last token's fp32 logits [n_vocab], or
 * every token's [n, n_vocab] with all_logits. argmax (host, may be NULL):
 * the greedy token of the last position, computed on the device. n == 1
 * runs the decode step, replayed from a graph when graphs are on. */
nstf_status nstf_llama_gpu_forward(nstf_llama_gpu *g, const int32_t *tokens, int n, int pos0,
                                   bool all_logits, float *logits, int32_t *argmax);

/* Graph replay of the decode step (default on; off = plain launches). */
void nstf_llama_gpu_set_graphs(nstf_llama_gpu *g, bool on);
/* Whether the last decode step ran from a graph. */
bool nstf_llama_gpu_graph_used(const nstf_llama_gpu *g);
/* L3 decode on the fused GEMVs (the default where every matrix takes
 * them): on = true asks for it, false falls back to the unfused kernels in
 * the graph (for comparisons). Returns whether the fused step is now used. */
bool nstf_llama_gpu_set_fused(nstf_llama_gpu *g, bool on);
/* Device bytes held (weights + activations + KV cache). */
uint64_t nstf_llama_gpu_bytes(const nstf_llama_gpu *g);
/* The stream every forward runs on (for timing events). */
void *nstf_llama_gpu_stream(const nstf_llama_gpu *g);

/* ---- execution levels ------------------------------------------------------ *
 * L0 baseline: one op per kernel, separate Q/K/V projections, attention
 *    through a materialized fp32 score matrix (QK^T, scale + mask, softmax,
 *    PV), separate residual add and RMSNorm, separate gate/up + SwiGLU.
 * L1 fused: one QKV GEMV (decode), residual fused into RMSNorm, scale +
 *    mask + softmax in one kernel (scores still materialized).
 * L2 tiled: flash attention (prefill) / split-KV flash decoding, one GEMV
 *    or GEMM over the adjacent Q|K|V and gate|up matrices, SwiGLU over its
 *    rows.
 * L3 ultra: L2, with the decode step on fused GEMVs (norm prologue; RoPE,
 *    SwiGLU or residual-add epilogue: 6 kernels per layer, where the weight
 *    types allow), programmatic
 *    dependent launch on sm_90, and replayed as one graph launch (default).
 * Levels 0 and 1 allocate the score matrix [n_heads, n_batch, n_ctx] fp32
 * on first selection (workspace; kept until free). */
#define NSTF_GPU_N_LEVELS 4
nstf_status nstf_llama_gpu_set_level(nstf_llama_gpu *g, int level);
int nstf_llama_gpu_level(const nstf_llama_gpu *g);
/* Kernels launched by the last forward (a graph replay counts 1) and the
 * kernel nodes of the captured decode graph. */
int64_t nstf_llama_gpu_kernels(const nstf_llama_gpu *g);
int64_t nstf_llama_gpu_graph_nodes(const nstf_llama_gpu *g);

/* ---- profiling ----------------------------------------------------------------- */

typedef enum nstf_gpu_cat {
    NSTF_GPU_CAT_ATTN = 0, /* Q/K/V/O projections, RoPE, KV write, attention */
    NSTF_GPU_CAT_FFN,      /* gate/up/down projections, SwiGLU */
    NSTF_GPU_CAT_NORM,     /* RMSNorm (with the residual add when fused) */
    NSTF_GPU_CAT_RESID,    /* standalone residual adds (L0) */
    NSTF_GPU_CAT_OTHER,    /* embedding, logits, argmax */
    NSTF_GPU_N_CAT
} nstf_gpu_cat;

/* One op of a profiled forward: times in ms from the forward's first event. */
typedef struct nstf_gpu_op {
    const char *label; /* static string */
    int cat, layer, n_kernels;
    double flops, bytes;
    double t0_ms, t1_ms;
} nstf_gpu_op;

/* Profiling on: every op of the following forwards is bracketed by a pair of
 * events (max_ops per forward, 0 = 4096; more are counted as dropped), and
 * the decode step runs without its graph. The records of the last forward
 * are valid until the next forward. */
nstf_status nstf_llama_gpu_set_prof(nstf_llama_gpu *g, bool on, int max_ops);
const nstf_gpu_op *nstf_llama_gpu_prof_ops(const nstf_llama_gpu *g, int *n, int64_t *dropped);

typedef struct nstf_gpu_mem {
    uint64_t weights, kv_cache, activations, workspace; /* bytes on the device */
} nstf_gpu_mem;
void nstf_llama_gpu_mem(const nstf_llama_gpu *g, nstf_gpu_mem *out);

#endif
