/* backend.h — the one interface between the model and a device.
 *
 * A backend is a table of function pointers (nstf_backend_vt) and a little
 * state every backend shares (nstf_backend). The model's forward
 * (src/model/forward.c) is written once against it; the CPU backend
 * (backend/cpu.c) and the GPU backend (backend/gpu*.c, CUDA or HIP through
 * ops/gpu/gpu_api.h) implement it. What is particular to a device stays
 * behind the table: the GPU's execution levels, graph capture, fused
 * kernels and programmatic dependent launch, the CPU's thread pool and
 * int8 activation blocks.
 *
 * The table has four parts:
 *  - memory: alloc / free / upload / download / zero / sync of the
 *    backend's memory (host memory on the CPU backend: `host_memory`);
 *  - planning: the workspace a model of a given shape needs (plan), its
 *    allocation (prepare), where a group's matmul outputs go (place);
 *  - the forward bracket: begin (the batch into backend memory; a GPU may
 *    replay a captured step instead, `replayed`) and end (finish, copy the
 *    logits / greedy token to the host);
 *  - the ops: one entry per row of the op table (ops/ops.h), each taking
 *    nstf_op_args, plus can_fuse: whether the backend runs a matmul with
 *    its fusion flags (norm prologue, RoPE / SwiGLU / residual epilogue) as
 *    one op. When it says no, the forward runs the separate ops.
 *
 * Batches may hold several sequences (seq slots of the KV cache), one
 * token each or more: the interface is the same for prefill, decode and
 * batched decode, and for a continuous batch mixing prefill chunks of some
 * sequences with the decode of others (rows: the logits wanted; blocks: a
 * paged KV cache). A backend that cannot run a batch says so (error).
 *
 * Profiling: the forward dispatches every op through nstf_backend_op(),
 * which calls the hooks a profiler installed (prof/ never reaches into a
 * backend: it reads time marks through mark / mark_ns). */
#ifndef NSTF_BACKEND_BACKEND_H
#define NSTF_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "nstf_tools.h"
#include "ops/ops.h"

typedef struct nstf_backend nstf_backend;

/* One forward's batch, on the host: token t of sequence seq[t] sits at
 * position pos[t]. The last two members are optional (zero: unused):
 *  - rows: the logits wanted are those of these rows, in this order (one
 *    per sequence that samples, in a batch mixing prefill and decode);
 *  - blocks: the block table of a paged KV cache (a run made with
 *    nstf_llama_run_create_paged needs one, no other run takes one). */
typedef struct nstf_batch {
    const int32_t *tokens; /* [n] */
    const int32_t *pos;    /* [n] */
    const int32_t *seq;    /* [n] sequence slots, or NULL: all 0 */
    int n;
    bool all_logits;       /* logits of every token (else of the last one) */
    bool argmax;           /* also compute the greedy token of the last row (of rows) */
    const int32_t *rows;   /* [n_rows] rows whose logits are wanted, or NULL */
    int n_rows;
    const int32_t *blocks; /* [n_seq, n_ctx / kv_block] cache block of each sequence's positions */
    /* with rows: the greedy token of every selected row (argmax[n_rows]),
     * and the logits of only the first host_rows of them (0..n_rows) copied
     * to the host; the others' logits stay in the run (a server's greedy
     * rows need one id each, not a vocabulary of floats) */
    bool argmax_rows;
    int host_rows;
    /* every row's result must not depend on how many rows the batch has:
     * a backend whose matmul path changes with the row count (GEMV for a
     * few rows, GEMM for more) takes the one that handles any count. Set
     * for batches with prompt rows, whose count a prefix taken from a cache
     * changes: a repeated request then computes the same numbers */
    bool row_invariant;
} nstf_batch;

/* The batch in backend memory, for the ops (begin fills it). */
typedef struct nstf_batch_io {
    const int32_t *ids, *pos, *seq;
    const int32_t *rows, *blocks; /* NULL when the batch has none */
} nstf_batch_io;

/* What end() copies to the host. */
typedef struct nstf_fwd_out {
    const float *logits;   /* backend memory [rows, n_vocab] */
    int64_t rows, n_vocab;
    const int32_t *argmax; /* backend memory [n_argmax], or NULL */
    int64_t n_argmax;
    float *logits_host;    /* NULL: not copied */
    int32_t *argmax_host;  /* NULL: not copied */
} nstf_fwd_out;

/* A model's shape as a backend plans its own workspace from it. */
typedef struct nstf_backend_plan {
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, n_vocab;
    int n_ctx, n_batch, n_seq;
    float rope_base;
    nstf_rope_mode rope_mode;
    /* every matmul of the layers the forward will issue, a group of
     * adjacent matrices counted as one (nstf_matrix_group_span); the
     * output matrix is not among them */
    const nstf_matrix *mats;
    int n_mats;
    nstf_type embed_type, output_type; /* of the embedding table and the output matrix
                                          (F32 for a stage without them) */
    /* a paged KV cache: kv_blocks blocks of kv_block positions shared by
     * the sequences through block tables (0: each sequence has n_ctx
     * contiguous positions) */
    int kv_block, kv_blocks;
    bool kv_q8; /* the KV cache is Q8_0 (ops.h; contiguous) */
} nstf_backend_plan;

typedef struct nstf_backend_mem {
    uint64_t total, free; /* the device's memory (host: MemTotal / MemAvailable) */
    uint64_t workspace;   /* what the backend holds beyond weights and run state */
    uint64_t reserve;     /* what it keeps free for its runtime when planning */
} nstf_backend_mem;

/* Options a backend may have; setting one it lacks is NSTF_ERR_UNSUPPORTED. */
typedef enum nstf_backend_opt {
    NSTF_OPT_LEVEL = 0, /* execution level, 0 .. n_levels - 1 (default: the backend's fastest) */
    NSTF_OPT_GRAPHS,    /* replay the decode step from a captured graph (default 1) */
    NSTF_OPT_FUSED,     /* fused ops where the weights allow (default 1) */
    NSTF_OPT_PROFILE,   /* per-op marks wanted: no graphs, no overlapped launches */
    NSTF_OPT_GRAPH_USED, /* read only: whether the last forward ran from a graph */
    NSTF_OPT_N
} nstf_backend_opt;

/* Profiling hooks: called around every op the forward dispatches. */
typedef struct nstf_backend_hooks {
    void (*op_begin)(void *user, nstf_backend *be, const nstf_op_args *a);
    void (*op_end)(void *user, nstf_backend *be, const nstf_op_args *a, nstf_status st);
    void *user;
} nstf_backend_hooks;

typedef nstf_status (*nstf_backend_op_fn)(nstf_backend *be, const nstf_op_args *a);

typedef struct nstf_backend_vt {
    const char *name; /* "CPU", "CUDA", "HIP" (llama-bench's backend names) */
    void (*destroy)(nstf_backend *be);

    /* memory */
    nstf_status (*alloc)(nstf_backend *be, uint64_t bytes, void **out);
    void (*free)(nstf_backend *be, void *p);
    nstf_status (*upload)(nstf_backend *be, void *dst, const void *src, uint64_t bytes);
    nstf_status (*download)(nstf_backend *be, void *dst, const void *src, uint64_t bytes);
    /* After a weight matrix's bytes are uploaded as the file stores them
     * (m->data: the backend's copy): rewrite them in place into the
     * backend's own layout, which its ops then expect (the GPU's split
     * Q4_0, IQ4_NL, Q8_0 and Q6_K rows). NULL: the file's layout is the backend's. */
    nstf_status (*relayout)(nstf_backend *be, const nstf_matrix *m);
    nstf_status (*zero)(nstf_backend *be, void *p, uint64_t bytes);
    nstf_status (*sync)(nstf_backend *be);
    void (*mem)(const nstf_backend *be, nstf_backend_mem *out);

    /* planning */
    nstf_status (*plan)(nstf_backend *be, const nstf_backend_plan *p, uint64_t *workspace_bytes);
    nstf_status (*prepare)(nstf_backend *be, const nstf_backend_plan *p);
    /* The views a matmul group's outputs take in buf (room for n rows of the
     * group's summed n_out): the layout its ROPE/SWIGLU/ATTENTION read. */
    void (*place)(nstf_backend *be, const nstf_matrix *const *w, int n_w, int64_t n, void *buf, nstf_view *out);
    bool (*can_fuse)(nstf_backend *be, const nstf_op_args *a);

    /* the forward bracket */
    nstf_status (*begin)(nstf_backend *be, const nstf_batch *b, nstf_batch_io *io, bool *replayed);
    nstf_status (*end)(nstf_backend *be, const nstf_batch *b, nstf_status st, const nstf_fwd_out *out, bool *retry);

    /* the ops, one per row of the op table */
    nstf_backend_op_fn ops[NSTF_OP_N];

    /* options, time marks, kernel count */
    int n_levels;
    nstf_status (*set_opt)(nstf_backend *be, nstf_backend_opt opt, int value);
    int (*get_opt)(const nstf_backend *be, nstf_backend_opt opt);
    /* Record mark i (0 <= i < cap, reserved with marks_reserve) after the
     * work queued so far; mark_ns waits for both and gives j - i. */
    nstf_status (*marks_reserve)(nstf_backend *be, int cap);
    nstf_status (*mark)(nstf_backend *be, int i);
    nstf_status (*mark_ns)(nstf_backend *be, int i, int j, uint64_t *ns);
    /* Kernels launched so far (a graph replay counts 1; the CPU counts ops),
     * and those of the captured decode step. */
    int64_t (*kernels)(const nstf_backend *be);
    int64_t (*graph_kernels)(const nstf_backend *be);
} nstf_backend_vt;

struct nstf_backend {
    const nstf_backend_vt *vt;
    nstf_type act_type;  /* activations between ops (F32 CPU, BF16 GPU) */
    nstf_type kv_type;   /* KV cache */
    bool host_memory;    /* its memory is host memory: weights are used in place */
    bool int8_act;       /* quantized matmuls run on 8-bit activation blocks (one
                            block, or two: the CPU's 16-bit default) */
    char device[320];    /* one line: "cpu", "GPU 0: NVIDIA H100 ..." */
    const nstf_backend_hooks *hooks; /* NULL: none */
};

/* Run one op (with the hooks, when installed). */
static inline nstf_status nstf_backend_op(nstf_backend *be, const nstf_op_args *a) {
    if (be->hooks && be->hooks->op_begin) be->hooks->op_begin(be->hooks->user, be, a);
    nstf_status st = be->vt->ops[a->op](be, a);
    if (be->hooks && be->hooks->op_end) be->hooks->op_end(be->hooks->user, be, a, st);
    return st;
}

static inline void nstf_backend_free(nstf_backend *be) {
    if (be) be->vt->destroy(be);
}

/* ---- the backends ---------------------------------------------------------- */

typedef struct nstf_cpu_params {
    int n_threads;      /* 0: every physical core */
    bool precise;       /* fp32 activations in every matmul (act_bits 32) */
    bool deterministic; /* results independent of the thread count */
    int act_bits;       /* activations of quantized matmuls: 16 (0: the default;
                           8-bit blocks plus their 8-bit residual), 8 (one
                           8-bit block) or 32 (fp32, as precise) */
} nstf_cpu_params;

nstf_status nstf_backend_cpu_create(const nstf_cpu_params *p, nstf_backend **out);
/* The CPU backend's thread pool (for measurements that run on it). */
nstf_pool *nstf_backend_cpu_pool(nstf_backend *be);

/* Whether this build has a GPU backend, its runtime ("CUDA", "HIP"; NULL
 * without), the visible devices, and one line describing device dev. */
bool nstf_backend_gpu_built(void);
const char *nstf_backend_gpu_runtime(void);
int nstf_backend_gpu_count(void);
nstf_status nstf_backend_gpu_line(int dev, char *buf, size_t cap);
/* The GPU backend's table (NULL in a build without one), for test_op_table. */
const nstf_backend_vt *nstf_backend_gpu_table(void);
/* A backend on GPU dev (NSTF_ERR_UNSUPPORTED in a build without one). */
nstf_status nstf_backend_gpu_create(int dev, nstf_backend **out);
/* A GPU backend's device and stream (for the collectives of dist/comm.c). */
nstf_status nstf_backend_gpu_stream(nstf_backend *be, int *dev, void **stream);
/* Level 4 (the persistent decode kernel): a test hook that makes block
 * `block` leave without arriving at the grid barrier after instruction
 * `ins` (-1: none), with the barrier timeout in ms (0: the default); and
 * the program's instruction count (0: none recorded) with the reason the
 * model's step runs at level 3 instead (NULL: it does not). */
nstf_status nstf_backend_gpu_l4_stall(nstf_backend *be, int block, int ins, int timeout_ms);
const char *nstf_backend_gpu_l4_status(nstf_backend *be, int64_t *instructions);
/* Level 4's timeline (nstf_tools.h: nstf_l4_profile): recorded at every
 * step while on; the last step's, summed by kind of instruction. */
nstf_status nstf_backend_gpu_l4_profile(nstf_backend *be, bool on);
nstf_status nstf_backend_gpu_l4_profile_get(nstf_backend *be, nstf_l4_profile *out);
/* The GPU's peak rates measured on the device (copy bandwidth, bf16 matrix
 * rate), for the roofline of `nstf profile`. */
nstf_status nstf_backend_gpu_peaks(nstf_backend *be, double *copy_gbs, double *matrix_gflops);

/* Whether the matrices are adjacent in memory and of one type, so that one
 * matmul over [w0; w1; ...] computes them all; span then receives that
 * matrix (n_out summed). */
bool nstf_matrix_group_span(const nstf_matrix *const *w, int n_w, nstf_matrix *span);

#endif
