/* plan.h — the optimization planner (`nstf optimize`): per layer matrix a
 * strategy among tensor types and a low-rank factorization, chosen under
 * a perplexity budget, plus per layer the attention kind; the trade-off
 * of the plan against the original and each pure strategy.
 *
 * Strategies and how they are chosen: adaptive precision's machinery
 * (adaptive.h) with the low-rank form as one more candidate per matrix:
 * the sensitivity table holds, besides each type, the activation-aware
 * rank-r factorization at the uniform reduction lowrank_reduce (analyze.h;
 * r = floor((1 - reduce) n_in n_out / (n_in + n_out)), F16 factors of
 * 2 r (n_in + n_out) bytes); the knapsack chooses under the summed KL and
 * the bisection on the KL budget keeps the perplexity on the text within
 * budget_ppl (mixes built in memory: requantized copies and fp32 factors).
 * Attention (allow_sparse; plan_sparse.c): the sparse decode attention
 * acts on one-token steps only, so it is measured by a decode evaluation:
 * a dense prefill of the text's first P tokens, then one-token steps at
 * positions P..n-1, each scored (perplexity, KL against the original's
 * dense steps). P = top-k * block + window + 2 blocks, past which a step
 * drops blocks; a text without 8 steps beyond P for a configuration
 * leaves that configuration out (and sparse attention altogether when
 * none fits), said in the note. Configurations: the one given
 * (sparse_topk / _window / _block) or top-k 8, 16 and 32 at blocks of 16
 * and window 64. With a configuration that fits, the mix gets the budget
 * less the share sparse_share (default 0.5) of it; then each layer alone
 * is made sparse (the sparsest configuration, original weights) and its
 * KL measured; for each configuration the cheapest layers by that KL are
 * made sparse, on top of the mix in memory, as many as keep the measured
 * decode perplexity within budget_ppl of the original's (bisection on
 * the count); the configuration that skips the most key reads at the
 * text's last position (layers x share skipped) wins.
 *
 * Output GGUF: the input's keys and tensors; each dense layer matrix in its
 * chosen type, each factorized one as NAME.lr_a.weight / NAME.lr_b.weight
 * in F16 (docs/OPTIMIZE.md, low-rank layout); the rest by `rest`'s rule;
 * keys nstf.plan.version (u32 1), nstf.plan.strategy (string per layer:
 * "attn_q=Q5_0 ... ffn_down=rank293 attn=dense"), nstf.plan.attn_sparse
 * (u8 per layer), nstf.plan.budget_ppl (f32, a fraction), and with a
 * sparse layer nstf.plan.sparse_topk, _block, _window (u32: what the
 * session executes, model/session_sparse.c). */
#ifndef NSTF_OPT_PLAN_H
#define NSTF_OPT_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "opt/adaptive.h"

typedef struct nstf_plan_params {
    const nstf_type *types;  /* candidate types */
    int n_types;
    double lowrank_reduce;   /* > 0: the low-rank candidate (needs LAPACKE) */
    const int32_t *calib;    /* calibration tokens for the activation-aware factorization (NULL: plain SVD) */
    int n_calib;
    double budget_ppl;       /* the perplexity budget (fraction, > 0) */
    bool allow_sparse;
    int sparse_topk, sparse_window, sparse_block; /* > 0: the one configuration to measure */
    double sparse_share;     /* of the budget kept for sparse attention (< 0: default 0.5) */
    nstf_quant_target rest;
    const struct nstf_imatrix *imatrix; /* importance weights of every quantization (NULL: none) */
    void (*progress)(void *user, const char *stage, int done, int total, const char *what);
    void *progress_user;
} nstf_plan_params;

/* One row of the trade-off table. */
typedef struct nstf_plan_row {
    char name[48];        /* "original", "all Q4_0", "all rank (30% fewer)", "plan" */
    uint64_t bytes;       /* tensor data */
    nstf_eval_score score; /* over the text, against the original */
    double tok_s;         /* prefill tokens per second of the evaluation forward */
    nstf_eval_score decode; /* the decode evaluation (plan.decode_scored: scored) */
    double decode_tok_s;  /* one-token steps per second after the prefill (this machine) */
} nstf_plan_row;

typedef struct nstf_plan {
    nstf_adaptive_plan mix;    /* per matrix: type or rank */
    int n_layers;
    uint8_t *attn_sparse;      /* [n_layers] */
    char **strategy;           /* [n_layers] strings */
    int sparse_topk, sparse_block, sparse_window; /* the sparse layers' configuration (0: none sparse) */
    double *sparse_kl;         /* [n_layers] measured KL of each layer alone sparse (NULL: not measured) */
    int sparse_cfg[4][3];      /* the configurations measured: top-k, block, window */
    int n_sparse_cfg;
    int decode_first;          /* the decode evaluation's prefill P (steps P..n-1) */
    bool decode_scored;        /* its scores mean something (P is past a sparse configuration's reach) */
    nstf_plan_row rows[24];    /* the trade-off table */
    int n_rows;
    char note[512];
    struct nstf_lowrank *lr;   /* owned: the decomposition the factors come from (NULL without) */
} nstf_plan;

/* Measure, choose and fill the trade-off table. ids [n]: the text. */
nstf_status nstf_plan_make(nstf_session *s, const int32_t *ids, int n, const nstf_plan_params *p, nstf_plan *out);
/* The decode evaluation: a prefill of ids[0..first) from position 0, then
 * one-token steps at first..n-1 (0 < first < n), their log-probabilities
 * into logp [n - first, n_vocab] and their scores against ref (the same
 * shape, NULL: none) in *out; *tok_s (may be NULL): steps per second. */
nstf_status nstf_plan_decode_eval(nstf_session *s, const int32_t *ids, int n, int first, const float *ref,
                                  float *logp, nstf_eval_score *out, double *tok_s);
/* plan_sparse.c, for plan.c: the configurations that fit the text and P
 * (before the mix), then the measured choice of sparse layers (after it). */
void nstf_plan_sparse_setup(int n, const nstf_plan_params *p, nstf_plan *plan);
nstf_status nstf_plan_sparse_choose(nstf_session *s, const int32_t *ids, int n, const nstf_plan_params *p,
                                    nstf_plan *plan);

/* Write the plan (the session's model, the plan's factors) to out_path. */
nstf_status nstf_plan_write(nstf_session *s, nstf_plan *plan, const nstf_plan_params *p, const char *in_path,
                            const char *out_path);
/* The decomposition refers to the session: drop it (the factors of a
 * written plan are in the file) before the session closes. nstf_plan_free
 * does it too, so free the plan first or call this. */
void nstf_plan_detach(nstf_plan *plan);
void nstf_plan_free(nstf_plan *plan);

#endif
