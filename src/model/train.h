/* train.h — a Llama model being trained on a backend (internal): the
 * trainable parameters in four flat fp32 arrays (master weights,
 * gradients, AdamW moments) described by one nstf_param_tensor table, the
 * compute copy the ops read (the GPU's bf16; on the CPU the master weights
 * themselves), a frozen base for LoRA, the activations a step saves (by the
 * recompute mode) and the gradient buffers, all planned by size tables
 * before anything is allocated.
 *
 * The step (train_step.c) is written once against the backend table, as
 * the forward (forward.c) is: forward with saving, the fused cross-entropy,
 * the backward through the layers, gradient accumulation over
 * micro-batches; then the update (train_update.c): over data-parallel
 * ranks the gradients' all-reduce or ZeRO-1's reduce-scatter, the global
 * gradient norm (a NaN/Inf names its tensor), clipping, AdamW on the fp32
 * master weights (ZeRO-1: each rank on its slot, then an all-gather).
 * docs/TRAINING.md describes the saved tensors, the recompute modes and
 * the memory plan. */
#ifndef NSTF_MODEL_TRAIN_H
#define NSTF_MODEL_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "dist/comm.h"
#include "model/llama.h"
#include "ops/optim.h"

typedef enum nstf_recompute {
    NSTF_RECOMPUTE_NONE = 0, /* save every tensor the backward reads */
    NSTF_RECOMPUTE_ATTN,     /* save x, x_mid, xn2, gate|up; re-run the attention sublayer */
    NSTF_RECOMPUTE_FULL,     /* save x; re-run the whole layer */
} nstf_recompute;

/* The matrices LoRA may adapt, in layer order. */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N };
extern const char *const nstf_lora_names[LORA_N]; /* "attn_q", ... (GGUF names) */

/* One rank-r adapter of a frozen W [n_out, n_in]: W' = W + B A with
 * A [r, n_in] and B [n_out, r], kept as A and Bt = B^T [r, n_out] (the
 * layouts the matmul rows take: u = x A^T is a matmul, y += u Bt the
 * input-gradient row with accumulation). */
typedef struct train_lora {
    nstf_matrix a, bt; /* compute views */
    float *ga, *gbt;   /* gradients (flat array) */
} train_lora;

typedef struct train_layer {
    nstf_llama_layer w;                 /* what the ops read: compute copy or frozen base */
    float *g_attn_norm, *g_ffn_norm;    /* NULL: frozen */
    float *g_q, *g_k, *g_v, *g_o, *g_gate, *g_up, *g_down; /* NULL: frozen */
    bool has_lora[LORA_N];
    train_lora lora[LORA_N];
} train_layer;

/* One layer's activations for a micro-batch; by the recompute mode each
 * pointer is the layer's own (saved) or the one live set's (recomputed
 * right before the layer's backward). */
typedef struct train_acts {
    float *x;          /* [n, dim] layer input (residual stream), fp32 */
    float *xmid;       /* [n, dim] after the attention block, fp32 */
    void *xn1, *xn2;   /* [n, dim] the normed inputs of the two blocks */
    void *qkv;         /* [n, q_dim + 2 kv_dim] q | k | v (train_group_views' layout) */
    void *att;         /* [n, q_dim] attention output */
    float *lse;        /* [n, n_heads] */
    void *gu;          /* [n, 2 ffn] gate | up */
    void *hs;          /* [n, ffn] silu(gate) * up */
    void *u[LORA_N];   /* [n, r] x A^T of each adapter (always the layer's own) */
} train_acts;

typedef struct train_shape {
    int n_seq, seq_len;     /* sequences per micro-batch, tokens per sequence */
    int lora_rank;          /* 0: full fine-tune */
    unsigned lora_mask;     /* bit LORA_*: that matrix is adapted */
    nstf_recompute recompute;
    int shards;             /* ZeRO-1 over this many data-parallel ranks: the AdamW moments are one slot
                               of the flat arrays (0 or 1: whole, replicated) */
} train_shape;

/* Slots of the flat arrays over data-parallel ranks are multiples of 64
 * elements (nstf_comm_shard_len): 256-byte fp32 and 128-byte bf16 slots,
 * so a slot's start keeps the tensors' 8-element alignment. */
#define NSTF_TRAIN_SHARD_ALIGN 64

/* Bytes by kind, the memory plan (`nstf train --plan`). */
typedef struct train_mem {
    uint64_t weights, copy, grads, optimizer, frozen, activations, act_grads, workspace, io;
    int64_t n_params;   /* trainable parameters */
    int64_t n_frozen;   /* parameters of the frozen base (LoRA) */
} train_mem;

typedef struct nstf_train {
    const nstf_llama *m;   /* not owned */
    nstf_backend *be;      /* not owned */
    nstf_llama_config c;
    train_shape sh;
    int64_t n;             /* tokens per micro-batch: n_seq * seq_len */
    bool rows;             /* groups' outputs as rows of the whole group (GPU full fine-tune) */
    nstf_llama_run *frozen; /* LoRA: the base placed on the backend */
    /* parameters: flat arrays in backend memory */
    nstf_param_tensor *ptab;
    int n_ptab;
    char *names;           /* the tensors' names, one block */
    int64_t n_flat;        /* elements of the flat layout (tensors and padding): what checkpoints hold */
    int64_t n_pad;         /* elements of w, g and the copy: n_flat, or with shards the shards' slots
                              (shards x shard_len >= n_flat, the tail zero and never read by an op) */
    int64_t shard_len;     /* elements of m and v: n_flat, or one slot with shards */
    void *pblock;          /* the one allocation: w, g, m, v, copy */
    float *w, *g, *mom1, *mom2;
    void *wc;              /* compute copy (act type) or NULL: w itself */
    /* what the ops read */
    train_layer *layers;
    nstf_matrix tok_embd;  /* the table GET_ROWS reads (fp32 master or frozen) */
    nstf_matrix ce_w;      /* the output matrix the cross-entropy reads */
    const float *out_norm;
    float *g_tok_embd, *g_output, *g_out_norm; /* NULL: frozen; g_output == g_tok_embd when tied */
    void *ce_copy;         /* LoRA: the output matrix dequantized once (F32 CPU, BF16 GPU) */
    /* activations and gradient buffers: the second allocation */
    void *ablock;
    train_acts *acts;      /* [n_layers + 1]: acts[n_layers].x is the final residual */
    void *xnf;             /* [n, dim] the final norm's output */
    float *dX, *dxn, *dh;  /* [n, dim] fp32 */
    void *dX_act;          /* [n, dim] act type (GPU); == dX on the CPU */
    void *dhs, *dgu, *datt, *dqkv, *du;
    int32_t *d_ids, *d_tgt, *d_pos;
    double *d_loss;
    int32_t *h_ids, *h_tgt; /* host staging [n] */
    train_mem mem;
    /* data parallel (nstf_train_set_dp): this replica's rank of dp_n; the
     * step divides by every rank's targets and sums the gradients over
     * the ranks before the norm and the update (train_update.c) */
    struct nstf_comm *dp_comm;
    int dp_rank, dp_n;
    /* the gradient norm's segments: the table cut at the slot boundaries of
     * dp_n ranks (with or without ZeRO-1, so both give the same norm);
     * segs[seg_first[r] .. seg_first[r + 1]) lie in rank r's slot, and
     * mine holds this rank's with offsets from its slot's start */
    nstf_param_tensor *segs, *mine;
    int n_segs, n_mine, seg_most; /* seg_most: the most segments of any rank */
    int *seg_tensor;              /* [n_segs] the table row each segment is part of */
    int seg_first[NSTF_COMM_MAX + 1];
    char *seg_names;
    double *seg_sq, *sq_all;      /* [n_segs] sums of squares; [dp_n][seg_most] as exchanged */
} nstf_train;

/* The plan (sizes only) of training m on be with shape sh: fills mem
 * (no allocation). */
nstf_status nstf_train_mem_plan(const nstf_llama *m, const nstf_backend *be, const train_shape *sh, train_mem *mem);
/* Allocate and initialize: the master weights from m (dequantized to
 * fp32) or, with LoRA, A uniform(+-1/sqrt(n_in)) from seed and B zero.
 * Checks the plan against the device's free memory first. */
nstf_status nstf_train_create(const nstf_llama *m, nstf_backend *be, const train_shape *sh, uint64_t seed,
                              nstf_train **out);
void nstf_train_free(nstf_train *t);

/* One optimizer step over n_micro micro-batches: tokens [n_micro][n_seq]
 * [seq_len + 1] (inputs and next-token targets of each sequence), host.
 * step counts from 0; lr is this step's learning rate. On success *loss is
 * the step's mean loss and *norm the gradient norm before clipping. A
 * NaN/Inf loss or gradient stops before the update, naming the first
 * tensor whose gradient is not finite. */
nstf_status nstf_train_step(nstf_train *t, const int32_t *tokens, int n_micro, int64_t step,
                            const nstf_adamw_params *opt, double clip, double *loss, double *norm);
/* The mean loss over n_micro micro-batches without a backward. */
nstf_status nstf_train_eval(nstf_train *t, const int32_t *tokens, int n_micro, double *loss);

/* The trainable parameters' flat arrays to / from the host, n_flat floats
 * each (checkpoints): which 0 = weights, 1 = first moment, 2 = second.
 * Offsets are the flat layout's; with ZeRO-1 the moments' range must lie
 * in this rank's part (nstf_train_shard). */
nstf_status nstf_train_get(nstf_train *t, int which, int64_t off, int64_t n, float *host);
nstf_status nstf_train_put(nstf_train *t, int which, int64_t off, int64_t n, const float *host);
/* After put of the weights: rewrite the compute copy from the master. */
nstf_status nstf_train_sync_copy(nstf_train *t);

/* Make t replica `rank` of n (a communicator over the n replicas'
 * backends; its steps then run inside nstf_comm_run jobs, one per rank).
 * t must have been created with shape.shards 1 or n. */
nstf_status nstf_train_set_dp(nstf_train *t, struct nstf_comm *c, int rank, int n);

/* The part [*lo, *hi) of the flat layout whose optimizer state this rank
 * holds: everything without ZeRO-1, else its slot (clipped to n_flat;
 * empty for a tiny model's last rank). */
void nstf_train_shard(const nstf_train *t, int64_t *lo, int64_t *hi);

/* The update after the backward (train_update.c): the gradients reduced
 * over the ranks, the norm (into *norm), clipping, AdamW, ZeRO-1's
 * all-gather. loss is the step's loss on this rank (a non-finite one
 * stops the step, with what the gradients say). */
nstf_status nstf_train_update(nstf_train *t, int64_t step, const nstf_adamw_params *opt, double clip, double loss,
                              double *norm);
/* The gradient norm's segments for n ranks (train_update.c; n 1 at
 * creation); nstf_train_free frees them. */
nstf_status nstf_train_segments(nstf_train *t, int n, int rank);
void nstf_train_segments_free(nstf_train *t);

/* The FLOPs of one step per token (6 per matmul parameter and the
 * attention's 6 T q_dim per layer, causal), for MFU. */
double nstf_train_flops_per_token(const nstf_train *t);

#endif
