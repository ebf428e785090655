/* analyze.h — per-matrix sensitivity (`nstf analyze`): for every targeted
 * layer matrix and candidate (a tensor type, or a rank-r factorization),
 * the model with only that matrix changed is evaluated over a text and
 * compared with the unmodified model: KL divergence of the final
 * distributions, perplexity and its change, top-1 agreement (evaluate.h).
 *
 * Candidates: the types given (each matrix's rows re-quantized from its
 * fp32 values with the CPU quantizers; a type without a quantizer, or
 * whose block does not divide the rows, is skipped and listed in
 * `skipped`), and with lowrank_reduce > 0 the factorization at the
 * uniform rank r = floor((1 - reduce) n_in n_out / (n_in + n_out)),
 * plain or activation-aware (lowrank.h). Sizes are bits per weight: the
 * type's, or 16 r (n_in + n_out) / (n_in n_out) for fp16 factors. The
 * session must run on the CPU. */
#ifndef NSTF_OPT_ANALYZE_H
#define NSTF_OPT_ANALYZE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "nstf.h"
#include "opt/evaluate.h"

typedef struct nstf_analyze_params {
    const nstf_type *types; /* candidate types */
    int n_types;
    double lowrank_reduce;  /* > 0: the rank-r candidate */
    const int32_t *calib;   /* calibration tokens: activation-aware SVD (NULL: plain) */
    int n_calib;
    unsigned targets;       /* NSTF_LR_* flags of lowrank.h (0: all) */
    int layer0, layer1;     /* layers [layer0, layer1) (both 0: all) */
    const struct nstf_imatrix *imatrix; /* importance weights of the requantized candidates (NULL: none) */
    /* progress after each evaluation: done / total, what was evaluated */
    void (*progress)(void *user, int done, int total, const char *what);
    void *progress_user;
} nstf_analyze_params;

typedef struct nstf_analyze_row {
    char tensor[64];    /* blk.N.attn_q.weight */
    char candidate[32]; /* "Q4_K", "rank 123" */
    int layer;
    double bpw;         /* bits per weight of the candidate */
    nstf_eval_score score;
} nstf_analyze_row;

typedef struct nstf_analyze_result {
    nstf_eval_score base;  /* the unmodified model */
    nstf_analyze_row *rows; /* [n_rows] */
    int n_rows;
    char skipped[256];     /* candidate types not run, and why */
} nstf_analyze_result;

/* The 7 layer matrices, in the order of the NSTF_LR_* flags: their GGUF
 * name part ("attn_q", ..., "ffn_down") and their slot in a layer. */
const char *nstf_analyze_kind_name(int kind);
struct nstf_llama_layer;
struct nstf_matrix *nstf_analyze_slot(struct nstf_llama_layer *L, int kind);
/* w's rows re-encoded as type t (through fp32; qw: importance weights per
 * column, or NULL): a new buffer (nstf_free), NULL on OOM or a type whose
 * block does not divide the rows. */
void *nstf_analyze_requantize(const struct nstf_matrix *w, nstf_type t, const float *qw);

nstf_status nstf_analyze_run(nstf_session *s, const int32_t *ids, int n, const nstf_analyze_params *p,
                             nstf_analyze_result *out);
void nstf_analyze_result_free(nstf_analyze_result *r);
/* The chart of r (analyze_svg.c): KL against bits per weight for every
 * matrix and candidate, and the mean KL per layer and candidate; title
 * (escaped) heads it. */
nstf_status nstf_analyze_svg(const char *path, const char *title, const nstf_analyze_result *r);

#endif
