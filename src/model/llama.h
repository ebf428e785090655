/* llama.h — the Llama-family model: Config (the blueprint), Weights
 * (views into the GGUF mapping plus one small allocation for converted
 * norms), and the model placed on a backend (nstf_llama_run: the weights
 * in the backend's memory and the RunState, activations and the KV cache,
 * carved from one backend allocation by a size table), and the forward.
 *
 * The forward (forward.c) is written once, against the backend table
 * (backend/backend.h), and reads like the paper: embed; for each layer:
 * norm, Q/K/V, rope, attention over the KV cache, out-proj + residual,
 * norm, SwiGLU feed-forward, down-proj + residual; final norm; logits.
 * Quantized weights are used as stored by the matmul, never expanded at
 * load. */
#ifndef NSTF_MODEL_LLAMA_H
#define NSTF_MODEL_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"
#include "io/gguf.h"
#include "model/arch.h"
#include "ops/ops.h"

typedef struct nstf_llama_config {
    const nstf_arch *arch; /* the architecture's row (model/arch.h) */
    int n_layers;
    int dim;          /* embedding width */
    int n_heads;
    int n_kv_heads;   /* grouped-query attention: n_heads % n_kv_heads == 0 */
    int head_dim;     /* dim / n_heads unless the file says (attention.key_length) */
    int ffn_dim;      /* SwiGLU hidden width */
    int n_vocab;
    int n_ctx_train;  /* context length the model was trained for */
    float rope_base;
    float norm_eps;
    nstf_rope_mode rope_mode;
    bool tied_output; /* logits use the token embedding */
    int sliding_window; /* > 0: each token attends to the last sliding_window positions (Mistral) */
    float rope_linear;  /* linear RoPE scaling factor (1: none): positions divided by it */
} nstf_llama_config;

typedef struct nstf_llama_layer {
    const float *attn_norm; /* [dim] */
    nstf_matrix wq;         /* [n_heads * head_dim, dim] */
    nstf_matrix wk;         /* [n_kv_heads * head_dim, dim] */
    nstf_matrix wv;         /* [n_kv_heads * head_dim, dim] */
    nstf_matrix wo;         /* [dim, n_heads * head_dim] */
    const float *ffn_norm;  /* [dim] */
    nstf_matrix w_gate;     /* [ffn_dim, dim] */
    nstf_matrix w_up;       /* [ffn_dim, dim] */
    nstf_matrix w_down;     /* [dim, ffn_dim] */
    const float *bq, *bk, *bv;    /* [q_dim], [kv_dim], [kv_dim] QKV biases, or NULL (Qwen2) */
    const float *q_norm, *k_norm; /* [head_dim] per-head RMSNorm of q and k, or NULL (Qwen3) */
} nstf_llama_layer;

typedef struct nstf_llama_weights {
    nstf_matrix tok_embd;    /* [n_vocab, dim] */
    nstf_llama_layer *layers; /* [n_layers] */
    const float *out_norm;   /* [dim] */
    nstf_matrix output;      /* [n_vocab, dim]; == tok_embd when tied */
    const float *rope_factors; /* [head_dim/2] RoPE frequency divisors, or NULL (Llama 3.x
                                  rope_freqs.weight, times the linear scaling factor) */
    float *norms;            /* owned: every fp32 vector (norms, biases, factors), carved by a size table */
    uint64_t norm_floats;    /* floats in norms */
    nstf_matrix *factors;    /* owned: [n_layers][7][2] the low-rank factor pairs of the layer
                                matrices that have them (nstf_matrix.factors points here) */
} nstf_llama_weights;

typedef struct nstf_llama {
    nstf_llama_config cfg;
    nstf_llama_weights w;
    nstf_gguf *file; /* owns the mapping the weights point into */
} nstf_llama;

/* Load config and weights from an open GGUF (which the model then owns on
 * success). Checks the architecture, every tensor's presence, type and
 * shape; errors name the tensor and what was expected. */
nstf_status nstf_llama_load(nstf_gguf *file, nstf_llama **out);
void nstf_llama_free(nstf_llama *m);

/* The run state: activations and the KV cache, in backend memory, carved
 * from one allocation. Element types: x, y, logits fp32; the activations
 * the backend's act_type; the caches its kv_type. */
typedef struct nstf_llama_state {
    int n_ctx;       /* KV cache positions per sequence */
    int n_batch;     /* most tokens per forward */
    int n_seq;       /* sequence slots of the KV cache */
    int kv_block;    /* paged cache: positions per block (0: contiguous per sequence) */
    int kv_blocks;   /* paged cache: blocks in the pool */
    float *x;        /* [n_batch, dim] the residual stream */
    float *y;        /* [n_batch, dim] a block's output before it is added into x */
    void *xb;        /* [n_batch, dim] normed input of a block */
    void *qkv;       /* [n_batch, q_dim + 2 kv_dim] q, k, v (layout: the backend's place) */
    void *att;       /* [n_batch, q_dim] attention output */
    void *h;         /* [n_batch, 2 ffn_dim] gate, up (layout: the backend's place) */
    void *hs;        /* [n_batch, ffn_dim] silu(gate) * up */
    float *logits;   /* [n_batch, n_vocab] (the last row only unless all-logits) */
    int32_t *argmax; /* [n_batch] the greedy tokens (of the last row, or of each selected row) */
    void *k_cache;   /* [n_layers, n_seq, n_ctx, kv_dim]; paged: [n_layers, kv_blocks, kv_block, kv_dim] */
    void *v_cache;   /* as k_cache */
    void *block;     /* the one backend allocation everything above is carved from */
    uint64_t block_bytes, kv_bytes;
    bool kv_q8;      /* the caches are Q8_0 (ops.h), not the backend's kv_type */
    uint64_t kv_row; /* bytes of one cache row (a position, every kv head; nstf_kv_row_bytes) */
} nstf_llama_state;

/* Sparse decode attention of a run (ops.h, ATTN_SPARSE): which layers use
 * it, its parameters, and its buffers in backend memory (one allocation).
 * The statistics of each sparse layer of the run are [n_seq, nb, kv_dim]
 * (nb = ceil(n_ctx / block)); sel and work are sized for any topk up to
 * NSTF_SPARSE_TOPK_MAX and any window up to n_ctx, so both may change
 * between forwards (nstf_llama_run_sparse_tune); the block may not. */
typedef struct nstf_llama_sparse {
    bool on;                /* some layer of the run is sparse */
    uint8_t *layer;         /* host [n_layers of the model]: 1 = sparse (owned) */
    int *slot;              /* host [n_layers]: the layer's statistics slot, -1 none (owned) */
    int topk, block, window;
    float decay;            /* attention-mass EMA factor */
    float *kmin, *kmax;     /* [n_slots, n_seq, nb, kv_dim] */
    float *mass;            /* [n_slots, n_seq, nb, n_kv_heads] */
    int32_t *sel;           /* [n_batch, n_kv_heads, max_sel at the caps] */
    float *work;
    void *alloc;            /* the backend allocation the above are carved from */
} nstf_llama_sparse;

/* A model placed on a backend for running: all of it, or a stage of a
 * model split over backends (layers [l0, l1), with or without the
 * embedding and the output head). Stages chain through `next`: a forward
 * runs each in turn and hands the residual stream x to the next. */
typedef struct nstf_llama_run {
    const nstf_llama *m;   /* not owned */
    nstf_backend *be;      /* not owned */
    int l0, l1;            /* the layers this run holds */
    bool embed, output;    /* it holds the embedding (first stage) / the output head (last) */
    nstf_llama_weights w;  /* in backend memory; a host backend's are m's own views */
    void *wblock;          /* the weights' one backend allocation (NULL on a host backend) */
    uint64_t wbytes;       /* weight bytes the run holds (a host backend: the file's tensors) */
    nstf_llama_state s;    /* the KV cache holds layers l0..l1-1 */
    struct nstf_llama_run *next; /* the next stage (not owned), or NULL */
    float *xfer;           /* host buffer [n_batch, dim] for x between stages (owned; stages with next) */
    nstf_llama_sparse sparse; /* off unless nstf_llama_run_sparse_set */
    struct nstf_llama_tp *tp; /* the tensor-parallel group this run is rank tp_rank of (model/tp.c),
                                 or NULL; rank 0's run stands for the group */
    int tp_rank;
} nstf_llama_run;

/* Sparse decode attention for the layers with layer[l] != 0 (layer: host
 * [n_layers of the model]; the run uses those in [l0, l1)): allocate and
 * zero their block statistics on the run's backend (a contiguous cache
 * only: a paged run is refused). Call before the first forward: blocks
 * already in the cache have no statistics. layer NULL or all 0 turns it
 * off and frees the buffers. */
nstf_status nstf_llama_run_sparse_set(nstf_llama_run *r, const uint8_t *layer, int topk, int block, int window);
/* Change topk and window between forwards (within the caps). */
nstf_status nstf_llama_run_sparse_tune(nstf_llama_run *r, int topk, int window);

/* Place m on be for a KV cache of n_ctx positions in each of n_seq
 * sequences and forwards of up to n_batch tokens: plan the weights, the
 * run state and the backend's workspace, check them against the device's
 * free memory (NSTF_ERR_OOM names what is needed and what is free), then
 * allocate, upload and prepare. m must outlive the run. */
nstf_status nstf_llama_run_create(const nstf_llama *m, nstf_backend *be, int n_ctx, int n_batch, int n_seq,
                                  nstf_llama_run **out);
/* The same with a paged KV cache: a pool of kv_blocks blocks of kv_block
 * positions that the n_seq sequences share through the block table each
 * forward's batch carries (nstf_batch.blocks, [n_seq, n_ctx / kv_block]);
 * n_ctx (a multiple of kv_block) bounds one sequence's positions. The
 * pool may hold fewer positions than n_seq * n_ctx: that is the point. */
nstf_status nstf_llama_run_create_paged(const nstf_llama *m, nstf_backend *be, int n_ctx, int n_batch, int n_seq,
                                        int kv_block, int kv_blocks, nstf_llama_run **out);
/* A stage: layers [l0, l1), with the embedding if embed, with the final
 * norm and the output matrix if output. */
nstf_status nstf_llama_run_create_stage(const nstf_llama *m, nstf_backend *be, int n_ctx, int n_batch, int n_seq,
                                        int l0, int l1, bool embed, bool output, nstf_llama_run **out);
/* Every knob at once: a stage (layers [l0, l1), embed, output) whose KV
 * cache is paged (kv_block > 0) or contiguous (kv_block = kv_blocks = 0). */
typedef struct nstf_llama_run_shape {
    int n_ctx, n_batch, n_seq;
    int l0, l1;
    bool embed, output;
    int kv_block, kv_blocks;
    bool kv_q8; /* the KV cache in Q8_0 (ops.h; contiguous caches only), else the backend's kv_type */
} nstf_llama_run_shape;
nstf_status nstf_llama_run_create_shaped(const nstf_llama *m, nstf_backend *be, const nstf_llama_run_shape *shape,
                                         nstf_llama_run **out);
void nstf_llama_run_free(nstf_llama_run *r);

/* Tensor parallel (model/tp.c): m split over n backends (all CPU or all
 * GPU, not owned; n in 1..NSTF_COMM_MAX) the Megatron way. Each rank holds
 * a contiguous share of the KV heads (their query heads, the Q/K/V rows and
 * the matching columns of O), of the feed-forward width (gate/up rows,
 * down columns) and of the vocabulary (output rows), and the whole
 * embedding and norms. Per layer the forward adds one all-reduce of the
 * attention block's output and one of the feed-forward block's (fp32
 * [n, dim]); the logits' shares are gathered on the host. Shares are as
 * even as the quantization blocks allow (an uneven head count splits
 * unevenly); a split that cannot be made is NSTF_ERR_UNSUPPORTED saying
 * why. timeout_ms: the communicator's stall timeout (0: its default).
 * The returned run is rank 0's: forward, clear and free act on the group.
 * In a process launched by mpirun (dist/proc.h; n must be the launch's
 * size) only be[rank] is used: the process makes its rank's shard, and
 * the returned run is that rank's, standing for the group here (every
 * process calls forward with the same batches and gets the whole
 * logits).
 * Low-rank matrices, sparse attention and stage chains are refused. */
nstf_status nstf_llama_run_create_tp(const nstf_llama *m, nstf_backend *const *be, int n,
                                     const nstf_llama_run_shape *shape, int timeout_ms, nstf_llama_run **out);
/* The group's communicator transport ("host", "NCCL 2.28.9"), NULL for a
 * run that is not tensor-parallel. */
const char *nstf_llama_run_tp_transport(const nstf_llama_run *r);
/* Internal: free a tensor-parallel group (nstf_llama_run_free of rank 0). */
void nstf_llama_tp_free(nstf_llama_run *r);
/* Internal to the forward: the all-reduce of a tensor-parallel rank, with
 * dst += the sum in the same kernel where the transport can (*added). */
nstf_status nstf_llama_tp_allreduce(nstf_llama_run *r, float *buf, float *dst, int64_t n, bool *added);
/* A launch's server (tensor parallel, one process per rank): rank 0 takes
 * the requests, the others must run the same forwards. nstf_llama_tp_lead
 * on rank 0's run makes each forward send its batch to the others first
 * (nothing for a run that is not a launch's; an error on another rank);
 * nstf_llama_tp_follow, on every other rank, runs the batches it receives
 * until rank 0 calls nstf_llama_tp_lead_end (then it returns NSTF_OK). */
nstf_status nstf_llama_tp_lead(nstf_llama_run *r);
nstf_status nstf_llama_tp_lead_end(nstf_llama_run *r);
nstf_status nstf_llama_tp_follow(nstf_llama_run *r);
/* Internal: a tensor-parallel forward (forward.c checked the batch). */
nstf_status nstf_llama_tp_forward(nstf_llama_run *r, const nstf_batch *b, float *logits, int32_t *argmax);
/* Internal: one run's part of a forward, in its backend's bracket (no checks). */
nstf_status nstf_llama_stage_forward(nstf_llama_run *r, const nstf_batch *b, float *logits, int32_t *argmax);
/* Empty the KV cache (every sequence reads as zeros). */
nstf_status nstf_llama_run_clear(nstf_llama_run *r);

/* One forward of b (b->n <= n_batch; positions below n_ctx; seq < n_seq).
 * logits (host, may be NULL): the last token's [n_vocab], every token's
 * [n, n_vocab] with all_logits, or those of b->rows [n_rows, n_vocab]
 * (with b->argmax_rows only the first b->host_rows of them).
 * argmax (host, may be NULL; needs b->argmax or b->argmax_rows): the
 * greedy token of the last of those rows ([1]), or of every row of b->rows
 * ([n_rows]), computed on the backend. A paged run checks that
 * every block a token writes or reads is one of its pool. */
nstf_status nstf_llama_forward(nstf_llama_run *r, const nstf_batch *b, float *logits, int32_t *argmax);
/* The common case: n tokens of sequence 0 at positions pos0.. */
nstf_status nstf_llama_forward_seq(nstf_llama_run *r, const int32_t *tokens, int n, int pos0, bool all_logits,
                                   float *logits, int32_t *argmax);
/* The same for a chunk of a prompt (the last row's logits): its rows are
 * computed alike whatever their number (nstf_batch.row_invariant), as nstf
 * serve computes prompt rows, so a prompt gives the same numbers in both
 * however it is chunked. */
nstf_status nstf_llama_forward_prompt(nstf_llama_run *r, const int32_t *tokens, int n, int pos0, float *logits,
                                      int32_t *argmax);

/* The matmuls of the layers the forward issues (a group of adjacent
 * matrices as one), for a backend's plan: writes up to cap entries,
 * returns the count. */
int nstf_llama_matmuls(const nstf_llama_weights *w, const nstf_llama_config *c, nstf_matrix *out, int cap);

#endif
