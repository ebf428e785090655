/* lowrank.c — the SVD of one weight matrix (plain or activation-aware,
 * LAPACKE's dgesdd / dpotrf / dtrtrs in double) and the rank rules
 * (lowrank.h says what they are). The model-level work is in
 * lowrank_model.c. */
#include "opt/lowrank.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/mem.h"

#ifdef NSTF_HAVE_LAPACKE
#include <lapacke.h>
#endif

bool nstf_lowrank_available(void) {
#ifdef NSTF_HAVE_LAPACKE
    return true;
#else
    return false;
#endif
}

void nstf_svd_free(nstf_svd *s) {
    if (!s) return;
    nstf_free(s->s);
    nstf_free(s->u);
    nstf_free(s->vt);
    memset(s, 0, sizeof *s);
}

int64_t nstf_lowrank_rank_energy(const double *s, int64_t k, double keep) {
    double total = 0, acc = 0;
    for (int64_t i = 0; i < k; i++) total += s[i] * s[i];
    if (!(total > 0)) return 1;
    for (int64_t r = 1; r <= k; r++) {
        acc += s[r - 1] * s[r - 1];
        if (acc >= keep * total) return r;
    }
    return k;
}

int64_t nstf_lowrank_rank_budget(int64_t n_in, int64_t n_out, double keep_frac) {
    const int64_t k = n_in < n_out ? n_in : n_out;
    if (n_in < 1 || n_out < 1 || !(keep_frac > 0)) return 0;
    double r = floor(keep_frac * (double)n_in * (double)n_out / (double)(n_in + n_out));
    return r < 0 ? 0 : r > (double)k ? k : (int64_t)r;
}

int64_t nstf_lowrank_rank_rule(const double *s, int64_t k, int64_t n_in, int64_t n_out, double keep,
                               double min_saving) {
    const int64_t r = nstf_lowrank_rank_energy(s, k, keep);
    return r <= nstf_lowrank_rank_budget(n_in, n_out, 1.0 - min_saving) ? r : 0;
}

void nstf_svd_factors(const nstf_svd *s, int64_t r, float *a /* [r, n_in] */, float *b /* [n_out, r] */) {
    for (int64_t i = 0; i < r; i++) {
        const float sq = (float)sqrt(s->s[i]);
        for (int64_t j = 0; j < s->n_in; j++) a[i * s->n_in + j] = sq * s->vt[i * s->n_in + j];
    }
    for (int64_t o = 0; o < s->n_out; o++)
        for (int64_t i = 0; i < r; i++) b[o * r + i] = s->u[o * s->k + i] * (float)sqrt(s->s[i]);
}

#ifdef NSTF_HAVE_LAPACKE

/* l [n, n] <- the lower Cholesky factor of gram + lambda I, with lambda
 * 0, then 1e-6, 1e-4, ... of the mean diagonal until it exists. */
static nstf_status cholesky(const double *gram, int64_t n, double *l) {
    double mean = 0;
    for (int64_t i = 0; i < n; i++) mean += gram[i * n + i];
    mean = mean > 0 ? mean / (double)n : 1.0;
    double lambda = 0;
    for (int attempt = 0; attempt < 8; attempt++) {
        memcpy(l, gram, (size_t)(n * n) * sizeof *l);
        for (int64_t i = 0; i < n; i++) l[i * n + i] += lambda;
        if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', (lapack_int)n, l, (lapack_int)n) == 0) {
            for (int64_t i = 0; i < n; i++) /* the upper triangle holds the input: clear it */
                for (int64_t j = i + 1; j < n; j++) l[i * n + j] = 0;
            return NSTF_OK;
        }
        lambda = lambda == 0 ? 1e-6 * mean : lambda * 100;
    }
    return nstf_set_error(NSTF_ERR_INVALID_ARG, "SVD: the calibration Gram matrix [%lld] has no Cholesky factor even "
                                                "with damping (activations of zero?)",
                          (long long)n);
}

nstf_status nstf_svd_compute(const float *w, int64_t n_in, int64_t n_out, const double *gram, nstf_svd *out) {
    memset(out, 0, sizeof *out);
    if (n_in < 1 || n_out < 1 || n_in > (1 << 20) || n_out > (1 << 20))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "SVD of a [%lld, %lld] matrix", (long long)n_out, (long long)n_in);
    const int64_t k = n_in < n_out ? n_in : n_out;
    uint64_t mn, nn, kn, ok;
    if (!nstf_mul_ok((uint64_t)n_in, (uint64_t)n_out, &mn) || !nstf_mul_ok((uint64_t)n_in, (uint64_t)n_in, &nn) ||
        !nstf_mul_ok((uint64_t)k, (uint64_t)n_in, &kn) || !nstf_mul_ok((uint64_t)k, (uint64_t)n_out, &ok) ||
        mn > SIZE_MAX / 8 || nn > SIZE_MAX / 8)
        return nstf_set_error(NSTF_ERR_RANGE, "SVD of a [%lld, %lld] matrix: sizes overflow", (long long)n_out,
                              (long long)n_in);
    double *m = nstf_alloc((size_t)mn * 8, "SVD input"), *l = gram ? nstf_alloc((size_t)nn * 8, "Cholesky factor") : NULL;
    double *u = nstf_alloc((size_t)ok * 8, "SVD U"), *vt = nstf_alloc((size_t)kn * 8, "SVD V^T");
    out->s = nstf_alloc((size_t)k * 8, "singular values");
    out->u = nstf_alloc((size_t)ok * 4, "SVD U");
    out->vt = nstf_alloc((size_t)kn * 4, "SVD V^T");
    nstf_status st = m && u && vt && out->s && out->u && out->vt && (l || !gram) ? NSTF_OK : NSTF_ERR_OOM;
    if (st == NSTF_OK && gram) st = cholesky(gram, n_in, l);
    if (st == NSTF_OK && gram) { /* m = W L: row o, column j sums i >= j */
        memset(m, 0, (size_t)mn * 8);
        for (int64_t o = 0; o < n_out; o++) {
            double *mo = m + o * n_in;
            for (int64_t i = 0; i < n_in; i++) {
                const double wi = w[o * n_in + i];
                const double *li = l + i * n_in;
                for (int64_t j = 0; j <= i; j++) mo[j] += wi * li[j];
            }
        }
    } else if (st == NSTF_OK) {
        for (uint64_t i = 0; i < mn; i++) m[i] = w[i];
    }
    if (st == NSTF_OK) {
        lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', (lapack_int)n_out, (lapack_int)n_in, m,
                                         (lapack_int)n_in, out->s, u, (lapack_int)k, vt, (lapack_int)n_in);
        if (info != 0)
            st = nstf_set_error(NSTF_ERR_INTERNAL, "SVD of a [%lld, %lld] matrix: LAPACKE_dgesdd returned %d",
                                (long long)n_out, (long long)n_in, (int)info);
    }
    if (st == NSTF_OK && gram) { /* V^T L^-1: solve L^T X^T = V for X^T [n_in, k] */
        double *bt = m; /* m is free now and holds n_in * k >= kn values */
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = 0; j < n_in; j++) bt[j * k + i] = vt[i * n_in + j];
        lapack_int info = LAPACKE_dtrtrs(LAPACK_ROW_MAJOR, 'L', 'T', 'N', (lapack_int)n_in, (lapack_int)k, l,
                                         (lapack_int)n_in, bt, (lapack_int)k);
        if (info != 0)
            st = nstf_set_error(NSTF_ERR_INTERNAL, "SVD: LAPACKE_dtrtrs returned %d", (int)info);
        for (int64_t i = 0; st == NSTF_OK && i < k; i++)
            for (int64_t j = 0; j < n_in; j++) vt[i * n_in + j] = bt[j * k + i];
    }
    if (st == NSTF_OK) {
        for (uint64_t i = 0; i < ok; i++) out->u[i] = (float)u[i];
        for (uint64_t i = 0; i < kn; i++) out->vt[i] = (float)vt[i];
        out->n_in = n_in;
        out->n_out = n_out;
        out->k = k;
    }
    nstf_free(m), nstf_free(l), nstf_free(u), nstf_free(vt);
    if (st != NSTF_OK) nstf_svd_free(out);
    return st;
}

#else

nstf_status nstf_svd_compute(const float *w, int64_t n_in, int64_t n_out, const double *gram, nstf_svd *out) {
    (void)w, (void)n_in, (void)n_out, (void)gram;
    memset(out, 0, sizeof *out);
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "low-rank decomposition needs LAPACKE: this build has none; install "
                                                "liblapacke-dev (make deps) and configure again");
}

#endif
