/* llama.h — the Llama-family model: Config (the blueprint), Weights
 * (views into the GGUF mapping plus one small allocation for converted
 * norms), RunState (activations and the KV cache), and the forward pass.
 *
 * The forward reads like the paper: embed; for each layer: norm, Q/K/V,
 * rope, attention over the KV cache, out-proj + residual, norm, SwiGLU
 * feed-forward, down-proj + residual; final norm; logits. Quantized
 * weights are used in place by the matmul, never expanded at load. */
#ifndef NSTF_MODEL_LLAMA_H
#define NSTF_MODEL_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "io/gguf.h"
#include "ops/ops.h"

typedef struct nstf_llama_config {
    int n_layers;
    int dim;          /* embedding width */
    int n_heads;
    int n_kv_heads;   /* grouped-query attention: n_heads % n_kv_heads == 0 */
    int head_dim;     /* dim / n_heads */
    int ffn_dim;      /* SwiGLU hidden width */
    int n_vocab;
    int n_ctx_train;  /* context length the model was trained for */
    float rope_base;
    float norm_eps;
    nstf_rope_mode rope_mode;
    bool tied_output; /* logits use the token embedding */
} nstf_llama_config;

/* A weight matrix [n_out, n_in] as stored in the file. */
typedef struct nstf_matrix {
    const void *data;
    nstf_type type;
    int64_t n_in, n_out;
} nstf_matrix;

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
} nstf_llama_layer;

typedef struct nstf_llama_weights {
    nstf_matrix tok_embd;    /* [n_vocab, dim] */
    nstf_llama_layer *layers; /* [n_layers] */
    const float *out_norm;   /* [dim] */
    nstf_matrix output;      /* [n_vocab, dim]; == tok_embd when tied */
    float *norms;            /* owned: all norm vectors as fp32, carved by a size table */
} nstf_llama_weights;

typedef struct nstf_llama_state {
    int n_ctx;      /* KV cache capacity in positions */
    int n_batch;    /* most tokens per forward call */
    float *x;       /* [n_batch, dim] residual stream */
    float *xb;      /* [n_batch, dim] normed input to a block */
    float *xb2;     /* [n_batch, dim] block output before the residual add */
    float *q;       /* [n_batch, n_heads * head_dim] */
    float *att;     /* [n_batch, n_heads * head_dim] attention output */
    float *hb;      /* [n_batch, ffn_dim] gate, then silu(gate) * up */
    float *hb2;     /* [n_batch, ffn_dim] up */
    float *logits;  /* [n_batch, n_vocab] (only row 0 used unless all-logits) */
    int32_t *pos;   /* [n_batch] positions of the current chunk */
    float *k_cache; /* [n_layers, n_ctx, n_kv_heads * head_dim] */
    float *v_cache; /* [n_layers, n_ctx, n_kv_heads * head_dim] */
    void *block;    /* the one allocation everything above is carved from */
    uint64_t block_bytes;
} nstf_llama_state;

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

nstf_status nstf_llama_state_init(nstf_llama_state *s, const nstf_llama_config *cfg, int n_ctx,
                                  int n_batch);
void nstf_llama_state_free(nstf_llama_state *s);

/* Run `n` tokens at positions pos0..pos0+n-1 (n <= n_batch, pos0 + n <=
 * n_ctx). Writes logits of the last token to s->logits[0..n_vocab), or of
 * every token to s->logits[t * n_vocab ...] when all_logits is set. */
nstf_status nstf_llama_forward(const nstf_llama *m, nstf_llama_state *s, nstf_cpu *cpu,
                               const int32_t *tokens, int n, int pos0, bool all_logits);

#endif
