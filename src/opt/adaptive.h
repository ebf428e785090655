/* adaptive.h — adaptive precision (`nstf quantize IN OUT auto`): a tensor
 * type per layer matrix, chosen from measured sensitivities under a budget.
 *
 *  1. Sensitivity: for every layer matrix and candidate type, the KL
 *     divergence of the model with only that matrix re-quantized against
 *     the unmodified model over a calibration text (nstf_analyze_run). A
 *     matrix's own type is a candidate of cost 0. Types whose block does
 *     not divide a matrix's rows are not candidates for it.
 *  2. Selection: the multiple-choice knapsack of mix.h over the summed KL
 *     (additivity is the model's assumption: the KL of the whole mix is
 *     taken as the sum of the single-matrix KLs).
 *       - size budget (target_bytes, or target_bpw over all tensors):
 *         least summed KL whose tensor data fits;
 *       - KL budget (budget_kl): least bytes whose summed KL is within;
 *       - perplexity budget (budget_ppl, a fraction: 0.01 = +1%): the
 *         KL-budget selection at the largest KL budget whose mix, built in
 *         memory and evaluated over the calibration text, changes the
 *         perplexity by at most budget_ppl (bisection on the KL budget,
 *         log scale, at most 14 measured mixes; additivity need not hold).
 *  3. The tensors outside the layer matrices (embeddings, output, norms)
 *     get the types of `rest` (a quantize target's rule: Q4_K_M's gives the
 *     output / tied embeddings Q6_K, or Q8_0 where 256 does not divide
 *     their rows) and count against the size budget.
 *
 * The session must run on the CPU; its weights are swapped in place while
 * measuring and restored after. */
#ifndef NSTF_OPT_ADAPTIVE_H
#define NSTF_OPT_ADAPTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "nstf.h"
#include "opt/analyze.h"
#include "opt/evaluate.h"
#include "opt/quantize.h"

typedef struct nstf_adaptive_params {
    const nstf_type *types;    /* candidate types (besides each matrix's own) */
    int n_types;
    nstf_quant_target rest;    /* the rule of every other tensor */
    uint64_t target_bytes;     /* one budget of these four: tensor data bytes, */
    double target_bpw;         /* bits per weight over all tensors, */
    double budget_kl;          /* summed KL (nats per token), */
    double budget_ppl;         /* perplexity change (fraction) measured on the text */
    /* low-rank candidates (the planner, plan.h): the sensitivity table's
     * "rank r" rows become candidates of 2 r (n_in + n_out) bytes (F16
     * factors), applied through lr; NULL: types only */
    struct nstf_lowrank *lr;
    const struct nstf_imatrix *imatrix; /* importance weights of the requantized candidates (NULL: none) */
    /* progress: stage ("sensitivity", "perplexity budget"), done / total, what */
    void (*progress)(void *user, const char *stage, int done, int total, const char *what);
    void *progress_user;
} nstf_adaptive_params;

typedef struct nstf_adaptive_entry {
    char name[64];    /* blk.N.attn_q.weight */
    nstf_type type;   /* chosen (rank > 0: the input's, unused) */
    int64_t rank;     /* > 0: factorized at this rank, F16 factors (the planner) */
    nstf_type own;    /* the input's */
    uint64_t bytes;   /* of the chosen type */
    double kl;        /* its measured sensitivity (0 for its own type) */
} nstf_adaptive_entry;

typedef struct nstf_adaptive_plan {
    nstf_adaptive_entry *e; /* [n]: every layer matrix */
    int n;
    uint64_t budget_bytes;  /* the size budget in bytes (0: an accuracy budget) */
    uint64_t total_bytes;   /* tensor data of the output file */
    uint64_t n_weights;     /* elements of all tensors */
    double kl_sum;          /* predicted: the sum of the chosen KLs */
    double budget_kl;       /* the KL budget used (perplexity budget: the one found) */
    int n_measured;         /* mixes measured for a perplexity budget */
    nstf_type embd_type;    /* token_embd.weight by the rest rule (in-memory mixes apply it too) */
    nstf_type output_type;  /* output.weight by the rest rule (an untied output) */
    nstf_eval_score measured; /* perplexity budget: the chosen mix on the text */
    const struct nstf_imatrix *imatrix; /* the in-memory mixes' importance weights (the params'; NULL: none) */
} nstf_adaptive_plan;

/* Measure (unless sens is given: an earlier nstf_analyze_run over every
 * layer matrix with these types), select, and fill *out. ids [n]: the
 * calibration tokens. */
nstf_status nstf_adaptive_plan_make(nstf_session *s, const int32_t *ids, int n, const nstf_adaptive_params *p,
                                    const nstf_analyze_result *sens, nstf_adaptive_plan *out);
void nstf_adaptive_plan_free(nstf_adaptive_plan *plan);

/* The plan's mix put into the session in memory (layer matrices swapped
 * for requantized copies, factorized entries through lr, embeddings and
 * output by the rest rule) until nstf_adaptive_plan_restore; on failure
 * nothing stays applied. */
typedef struct nstf_adaptive_applied {
    const nstf_adaptive_plan *plan;
    struct nstf_lowrank *lr;
    struct nstf_matrix *orig; /* [n + 2]: the layer matrices, then the embeddings and output */
    void **bufs;              /* [n + 2]: the copies put in */
    int swapped;
    bool ranks;
} nstf_adaptive_applied;
nstf_status nstf_adaptive_plan_apply(nstf_session *s, const nstf_adaptive_plan *plan, struct nstf_lowrank *lr,
                                     nstf_adaptive_applied *a);
nstf_status nstf_adaptive_plan_restore(nstf_session *s, nstf_adaptive_applied *a);
/* The plan's mix built in memory (the session's layer matrices swapped,
 * factorized entries through lr; restored before returning) and scored
 * over ids against ref (log-probs [n, n_vocab] of the unmodified model;
 * NULL: no KL / top-1). forward_ms (may be NULL): the time of the
 * evaluation forward alone. */
nstf_status nstf_adaptive_plan_eval(nstf_session *s, const nstf_adaptive_plan *plan, struct nstf_lowrank *lr,
                                    const int32_t *ids, int n, const float *ref, nstf_eval_score *out,
                                    double *forward_ms);

/* The overrides nstf_quantize_file takes for the plan's dense matrices:
 * [plan->n] (factorized entries keep their own type: the planner writes
 * them), pointing into the plan's names (valid while the plan lives). */
nstf_quant_override *nstf_adaptive_overrides(const nstf_adaptive_plan *plan);

#endif
