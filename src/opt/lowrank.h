/* lowrank.h — low-rank decomposition of weight matrices: truncated SVD
 * (LAPACKE), its activation-aware form, the rank rules, and the model-level
 * work over a session (calibration, decomposition, factors put into the
 * running model, the factorized GGUF file).
 *
 * A matrix W [n_out, n_in] (y = x W^T) becomes two factors, W ~ B A with
 * A [r, n_in] and B [n_out, r], so y = (x A^T) B^T: r (n_in + n_out)
 * weights instead of n_in n_out (the MATMUL_LR op of ops/ops.h).
 *
 *  - plain SVD: W = U S V^T; B = U_r S_r^1/2, A = S_r^1/2 V_r^T. This
 *    minimizes ||W - B A||_F.
 *  - activation-aware (SVD-LLM): with calibration activations X [N, n_in]
 *    (the matrix's real inputs), G = X^T X = L L^T (Cholesky, L lower),
 *    W L = U S V^T; B = U_r S_r^1/2, A = S_r^1/2 V_r^T L^-1. This
 *    minimizes ||X W^T - X (B A)^T||_F, the error of the matrix's outputs
 *    on the calibration data, which equals the energy of the dropped
 *    whitened singular values: sum_{i >= r} s_i^2.
 *
 * Rank rules (the "energy" of a spectrum s is sum s_i^2; for the
 * activation-aware form it is the calibration outputs' ||X W^T||_F^2):
 *  - energy rule: the smallest r whose first r singular values hold at
 *    least the fraction `keep` of the energy; capped so that the factors
 *    save parameters: a matrix whose energy rank exceeds
 *    floor((1 - min_saving) n_in n_out / (n_in + n_out)) stays dense;
 *  - uniform reduction rho: every targeted matrix at
 *    r = floor((1 - rho) n_in n_out / (n_in + n_out)) (SVD-LLM's setting);
 *  - energy allocation at a reduction rho: the energy rule with the one
 *    `keep` (found by bisection) at which the targeted matrices' parameters
 *    shrink by rho (dense matrices counted whole).
 *
 * The SVD needs LAPACKE (Debian liblapacke-dev); a build without it
 * returns NSTF_ERR_UNSUPPORTED from the functions that decompose, saying
 * what to install. Running a factorized file needs nothing more. */
#ifndef NSTF_OPT_LOWRANK_H
#define NSTF_OPT_LOWRANK_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "nstf.h"

/* ---- one matrix -------------------------------------------------------------- */

/* The SVD of W (or of W L) with its right vectors mapped back: W ~ U S vt
 * for every rank. */
typedef struct nstf_svd {
    int64_t n_in, n_out, k; /* k = min(n_in, n_out) */
    double *s;              /* [k] singular values, descending (of W L when whitened) */
    float *u;               /* [n_out, k] */
    float *vt;              /* [k, n_in] V^T (whitened: V^T L^-1) */
} nstf_svd;

/* Whether this build can decompose (has LAPACKE). */
bool nstf_lowrank_available(void);

/* SVD of w [n_out, n_in] fp32; gram [n_in, n_in] (X^T X of calibration
 * activations, double) makes it activation-aware, NULL plain. A Gram
 * matrix that is not positive definite gets a damping of 1e-6, then 1e-4
 * ... of its mean diagonal added until its Cholesky factor exists. */
nstf_status nstf_svd_compute(const float *w, int64_t n_in, int64_t n_out, const double *gram, nstf_svd *out);
void nstf_svd_free(nstf_svd *s);

/* Smallest r (>= 1) whose first r values of s [k] hold >= keep of sum s^2. */
int64_t nstf_lowrank_rank_energy(const double *s, int64_t k, double keep);
/* Largest r with r (n_in + n_out) <= keep_frac n_in n_out (0 if none). */
int64_t nstf_lowrank_rank_budget(int64_t n_in, int64_t n_out, double keep_frac);
/* The energy rule with its cap: the energy rank, or 0 (stay dense) when it
 * exceeds nstf_lowrank_rank_budget(n_in, n_out, 1 - min_saving). */
int64_t nstf_lowrank_rank_rule(const double *s, int64_t k, int64_t n_in, int64_t n_out, double keep,
                               double min_saving);

/* The factors of rank r (r <= k): a [r, n_in], b [n_out, r], fp32. */
void nstf_svd_factors(const nstf_svd *s, int64_t r, float *a, float *b);

/* ---- a model in a session ---------------------------------------------------------- */

/* Matrix kinds a decomposition may target (bit flags). */
enum {
    NSTF_LR_Q = 1 << 0, NSTF_LR_K = 1 << 1, NSTF_LR_V = 1 << 2, NSTF_LR_O = 1 << 3,
    NSTF_LR_GATE = 1 << 4, NSTF_LR_UP = 1 << 5, NSTF_LR_DOWN = 1 << 6,
    NSTF_LR_ALL = (1 << 7) - 1,
};
/* "attn_q,ffn_down" (GGUF names without blk.N. and .weight), or "all". */
bool nstf_lowrank_parse_targets(const char *list, unsigned *out);

typedef enum nstf_lr_alloc {
    NSTF_LR_ENERGY = 0,  /* the energy rule at `keep` */
    NSTF_LR_UNIFORM,     /* one reduction for every matrix */
    NSTF_LR_ENERGY_AT,   /* the energy rule at the keep that reaches the reduction */
} nstf_lr_alloc;

typedef struct nstf_lowrank_params {
    unsigned targets;      /* NSTF_LR_* flags (0: all) */
    bool whiten;           /* activation-aware (needs calibration) */
    nstf_lr_alloc alloc;
    double keep;           /* ENERGY: fraction of the energy kept (e.g. 0.95) */
    double min_saving;     /* ENERGY: the cap (default 0.1 when 0) */
    double reduce;         /* UNIFORM / ENERGY_AT: fraction of the targeted parameters removed */
    int layer0, layer1;    /* layers [layer0, layer1) (both 0: every layer) */
    /* every rank rounded down to a multiple of this (at least one multiple,
     * within the matrix's full rank), so that both factors quantize (32:
     * Q8_0, Q4_0, Q5_0; 256: the K-quants); 0 or 1: as the rule gives */
    int rank_multiple;
    /* progress: done / total matrices decomposed, the name of the last */
    void (*progress)(void *user, int done, int total, const char *name);
    void *progress_user;
} nstf_lowrank_params;

typedef struct nstf_lowrank nstf_lowrank;

/* Calibration: run the session's model over tokens (teacher-forced, one
 * forward per n_batch chunk, positions 0..n-1) and keep, for each layer,
 * X^T X of the inputs of its four matmul groups (q|k|v, o, gate|up,
 * down). Then decompose the targeted matrices (SVD once per matrix; the
 * ranks are chosen later). tokens may be NULL (n 0) without whiten. The
 * session must run on the CPU. */
nstf_status nstf_lowrank_create(nstf_session *s, const int32_t *tokens, int n, const nstf_lowrank_params *p,
                                nstf_lowrank **out);
void nstf_lowrank_free(nstf_lowrank *lr);

/* Choose ranks by p's rule (p->targets and layers as at create) and put
 * the factors into the session's model: its forward then runs the
 * MATMUL_LR op for those matrices. Replaces any factors put in before.
 * Reports the parameters of the targeted matrices before and after. */
nstf_status nstf_lowrank_apply(nstf_lowrank *lr, const nstf_lowrank_params *p, uint64_t *params_before,
                               uint64_t *params_after);
/* Matrix i at rank r alone (0: its own matrix again); the others stay as
 * they are. */
nstf_status nstf_lowrank_set(nstf_lowrank *lr, int i, int64_t r);
/* The index of layer l's matrix of kind k (0..6: attn_q, attn_k, attn_v,
 * attn_output, ffn_gate, ffn_up, ffn_down), -1 when not decomposed; its
 * shape. */
int nstf_lowrank_find(const nstf_lowrank *lr, int layer, int kind);
void nstf_lowrank_shape(const nstf_lowrank *lr, int i, int64_t *n_in, int64_t *n_out);
/* The model's own matrices again. */
void nstf_lowrank_restore(nstf_lowrank *lr);
/* Matrices decomposed, and the rank matrix i got at the last apply (0:
 * dense) with its GGUF name. */
int nstf_lowrank_count(const nstf_lowrank *lr);
int64_t nstf_lowrank_rank_of(const nstf_lowrank *lr, int i, const char **name);

/* Write the session's model with the factors of the last apply as a GGUF
 * (docs/OPTIMIZE.md: NAME.lr_a.weight [r, n_in] and NAME.lr_b.weight
 * [n_out, r] instead of NAME.weight), factors of type ftype (F32, F16,
 * BF16), every other tensor and key as in the input, plus nstf.lowrank.*
 * keys saying how it was made. Through a temporary file renamed into
 * place. */
nstf_status nstf_lowrank_write(nstf_lowrank *lr, const char *out_path, nstf_type ftype);

#endif
