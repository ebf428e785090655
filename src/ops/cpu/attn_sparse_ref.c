/* attn_sparse_ref.c — the scalar reference of the sparse decode attention
 * (ATTN_SPARSE, ops.h): block statistics from the keys, the Quest bounds,
 * the selection and the softmax over the selected keys, all in double. */
#include <math.h>
#include <stdlib.h>

#include "ops/ops.h"

/* The Quest bound of block b for kv head g: the max over its query heads of
 * sum_c max(q_c min_c, q_c max_c), min and max over the block's keys. */
static double bound(const float *q, const float *k, int64_t n_keys, int64_t kvd, int head_dim, int group, int g,
                    int block, int64_t b) {
    double best = -INFINITY;
    for (int h = g * group; h < (g + 1) * group; h++) {
        double s = 0;
        for (int c = 0; c < head_dim; c++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t j = b * block; j < (b + 1) * block && j < n_keys; j++) {
                const double x = k[j * kvd + (int64_t)g * head_dim + c];
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            const double qc = q[(int64_t)h * head_dim + c];
            s += fmax(qc * lo, qc * hi);
        }
        best = s > best ? s : best;
    }
    return best;
}

void nstf_ref_attn_sparse(const float *q, const float *k, const float *v, float *out, int32_t *sel, float *mass,
                          float mass_decay, int64_t n_keys, int n_heads, int n_kv_heads, int head_dim, float scale,
                          int block, int topk, int window) {
    const int group = n_heads / n_kv_heads;
    const int64_t kvd = (int64_t)n_kv_heads * head_dim, nb = (n_keys + block - 1) / block,
                  w = window > 1 ? window : 1, wb0 = (n_keys > w ? n_keys - w : 0) / block,
                  ms = nstf_sparse_max_sel(topk, block, window);
    for (int g = 0; g < n_kv_heads; g++) {
        int32_t *sg = sel + g * ms;
        int64_t n_sel = 0;
        /* block 0, then the topk of blocks 1..wb0-1 by bound (ties: the lower
         * block), then the window's blocks: ascending */
        if (wb0 > 0) sg[n_sel++] = 0;
        double *ub = wb0 > 1 ? malloc((size_t)wb0 * sizeof(double)) : NULL;
        for (int64_t b = 1; ub && b < wb0; b++) ub[b] = bound(q, k, n_keys, kvd, head_dim, group, g, block, b);
        /* out of memory (no ub): no candidate chosen, the caller's check fails */
        for (int64_t b = 1; ub && b < wb0; b++) {
            int64_t rank = 0; /* blocks ranked before b */
            for (int64_t r = 1; r < wb0; r++) rank += r != b && (ub[r] > ub[b] || (ub[r] == ub[b] && r < b));
            if (rank < topk) sg[n_sel++] = (int32_t)b;
        }
        free(ub);
        for (int64_t b = wb0; b < nb; b++) sg[n_sel++] = (int32_t)b;
        for (int64_t i = n_sel; i < ms; i++) sg[i] = -1;

        if (mass)
            for (int64_t b = 0; b < nb; b++) mass[b * n_kv_heads + g] *= mass_decay;
        for (int h = g * group; h < (g + 1) * group; h++) {
            const float *qh = q + (int64_t)h * head_dim;
#define REF_SCORE(j, dst)                                                        \
    do {                                                                         \
        double s_ = 0;                                                           \
        for (int c_ = 0; c_ < head_dim; c_++)                                    \
            s_ += (double)qh[c_] * k[(j) * kvd + (int64_t)g * head_dim + c_];    \
        (dst) = s_ * scale;                                                      \
    } while (0)
            double m = -INFINITY, den = 0, s;
            for (int64_t i = 0; i < n_sel; i++)
                for (int64_t j = (int64_t)sg[i] * block; j < ((int64_t)sg[i] + 1) * block && j < n_keys; j++) {
                    REF_SCORE(j, s);
                    m = s > m ? s : m;
                }
            for (int64_t i = 0; i < n_sel; i++)
                for (int64_t j = (int64_t)sg[i] * block; j < ((int64_t)sg[i] + 1) * block && j < n_keys; j++) {
                    REF_SCORE(j, s);
                    den += exp(s - m);
                }
            for (int c = 0; c < head_dim; c++) {
                double acc = 0;
                for (int64_t i = 0; i < n_sel; i++)
                    for (int64_t j = (int64_t)sg[i] * block; j < ((int64_t)sg[i] + 1) * block && j < n_keys; j++) {
                        REF_SCORE(j, s);
                        acc += exp(s - m) / den * v[j * kvd + (int64_t)g * head_dim + c];
                    }
                out[(int64_t)h * head_dim + c] = (float)acc;
            }
            if (mass)
                for (int64_t i = 0; i < n_sel; i++) {
                    double pb = 0;
                    for (int64_t j = (int64_t)sg[i] * block; j < ((int64_t)sg[i] + 1) * block && j < n_keys; j++) {
                        REF_SCORE(j, s);
                        pb += exp(s - m) / den;
                    }
                    mass[(int64_t)sg[i] * n_kv_heads + g] += (float)((1.0 - mass_decay) * pb / group);
                }
#undef REF_SCORE
        }
    }
}
