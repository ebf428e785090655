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
 * Attention: dense for every layer. The plan records the choice in the key
 * the sparse attention executes (`nstf.plan.attn_sparse`, u8 per layer,
 * 1 = sparse) but does not measure the sparse candidate yet, so it keeps
 * every layer dense even with allow_sparse (said in the plan's note).
 *
 * Output GGUF: the input's keys and tensors; each dense layer matrix in its
 * chosen type, each factorized one as NAME.lr_a.weight / NAME.lr_b.weight
 * in F16 (docs/OPTIMIZE.md, low-rank layout); the rest by `rest`'s rule;
 * keys nstf.plan.version (u32 1), nstf.plan.strategy (string per layer:
 * "attn_q=Q5_0 ... ffn_down=rank293 attn=dense"), nstf.plan.attn_sparse
 * (u8 per layer), nstf.plan.budget_ppl (f32, a fraction). */
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
    nstf_quant_target rest;
    void (*progress)(void *user, const char *stage, int done, int total, const char *what);
    void *progress_user;
} nstf_plan_params;

/* One row of the trade-off table. */
typedef struct nstf_plan_row {
    char name[48];        /* "original", "all Q4_0", "all rank (30% fewer)", "plan" */
    uint64_t bytes;       /* tensor data */
    nstf_eval_score score; /* over the text, against the original */
    double tok_s;         /* prefill tokens per second of the evaluation forward */
} nstf_plan_row;

typedef struct nstf_plan {
    nstf_adaptive_plan mix;    /* per matrix: type or rank */
    int n_layers;
    uint8_t *attn_sparse;      /* [n_layers] */
    char **strategy;           /* [n_layers] strings */
    nstf_plan_row rows[24];    /* the trade-off table */
    int n_rows;
    char note[160];
    struct nstf_lowrank *lr;   /* owned: the decomposition the factors come from (NULL without) */
} nstf_plan;

/* Measure, choose and fill the trade-off table. ids [n]: the text. */
nstf_status nstf_plan_make(nstf_session *s, const int32_t *ids, int n, const nstf_plan_params *p, nstf_plan *out);
/* Write the plan (the session's model, the plan's factors) to out_path. */
nstf_status nstf_plan_write(nstf_session *s, nstf_plan *plan, const nstf_plan_params *p, const char *in_path,
                            const char *out_path);
/* The decomposition refers to the session: drop it (the factors of a
 * written plan are in the file) before the session closes. nstf_plan_free
 * does it too, so free the plan first or call this. */
void nstf_plan_detach(nstf_plan *plan);
void nstf_plan_free(nstf_plan *plan);

#endif
