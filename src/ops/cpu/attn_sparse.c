/* attn_sparse.c — the fast CPU path of the sparse decode attention
 * (ATTN_SPARSE, ops.h): block statistics recomputed where rows were
 * written, the per-kv-head selection (a running top-k over the Quest
 * bounds), then the ordinary attention over the selected blocks through a
 * block table (nstf_cpu_attention_tbl: with every block selected, the
 * dense attention's sums in the dense order), and the attention-mass EMA. */
#include <math.h>
#include <string.h>

#include "ops/cpu/cpu_internal.h"

/* min / max per channel of the rows [b B, end) of every kv head */
static void block_stats(const float *k, float *kmin, float *kmax, int64_t b, int64_t end, int block, int64_t kvd) {
    float *mn = kmin + b * kvd, *mx = kmax + b * kvd;
    const float *r0 = k + b * block * kvd;
    memcpy(mn, r0, (size_t)kvd * sizeof(float));
    memcpy(mx, r0, (size_t)kvd * sizeof(float));
    for (int64_t j = b * block + 1; j < end; j++) {
        const float *r = k + j * kvd;
        for (int64_t c = 0; c < kvd; c++) {
            mn[c] = r[c] < mn[c] ? r[c] : mn[c];
            mx[c] = r[c] > mx[c] ? r[c] : mx[c];
        }
    }
}

typedef struct {
    const float *q, *k, *kmin, *kmax;
    float *mass, *work;
    int32_t *sel;
    int64_t n_keys, ms;
    int n_heads, n_kv_heads, head_dim, block, topk, window;
    float scale, decay;
} sel_ctx;

/* The bound of block b for kv head g: max over its query heads of
 * sum_c max(q_c mn_c, q_c mx_c). */
static float bound(const sel_ctx *c, int g, int64_t b) {
    const int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    const int64_t kvd = (int64_t)c->n_kv_heads * hd;
    const float *mn = c->kmin + b * kvd + (int64_t)g * hd, *mx = c->kmax + b * kvd + (int64_t)g * hd;
    float best = -INFINITY;
    for (int h = g * group; h < (g + 1) * group; h++) {
        const float *qh = c->q + (int64_t)h * hd;
        float s = 0;
        for (int i = 0; i < hd; i++) {
            const float lo = qh[i] * mn[i], hi = qh[i] * mx[i];
            s += lo > hi ? lo : hi;
        }
        best = s > best ? s : best;
    }
    return best;
}

/* kv heads [ith, nth): the selection into sel, ascending */
static void select_fn(void *p, int ith, int nth) {
    const sel_ctx *c = p;
    const int64_t B = c->block, nb = (c->n_keys + B - 1) / B, w = c->window > 1 ? c->window : 1,
                  wb0 = (c->n_keys > w ? c->n_keys - w : 0) / B;
    float tu[NSTF_SPARSE_TOPK_MAX];
    int32_t ti[NSTF_SPARSE_TOPK_MAX];
    for (int g = ith; g < c->n_kv_heads; g += nth) {
        /* the running top-k of blocks 1..wb0-1, best first; a later block
         * enters only with a strictly larger bound (ties: the lower block) */
        int n = 0;
        for (int64_t b = 1; c->topk > 0 && b < wb0; b++) {
            const float u = bound(c, g, b);
            if (n == c->topk && !(u > tu[n - 1])) continue;
            int i = n < c->topk ? n++ : n - 1;
            for (; i > 0 && u > tu[i - 1]; i--) tu[i] = tu[i - 1], ti[i] = ti[i - 1];
            tu[i] = u, ti[i] = (int32_t)b;
        }
        for (int i = 1; i < n; i++) /* ascending block order */
            for (int j = i; j > 0 && ti[j] < ti[j - 1]; j--) {
                const int32_t t = ti[j];
                ti[j] = ti[j - 1], ti[j - 1] = t;
            }
        int32_t *sg = c->sel + g * c->ms;
        int64_t m = 0;
        if (wb0 > 0) sg[m++] = 0;
        for (int i = 0; i < n; i++) sg[m++] = ti[i];
        for (int64_t b = wb0; b < nb; b++) sg[m++] = (int32_t)b;
        for (int64_t i = m; i < c->ms; i++) sg[i] = -1;
    }
}

/* kv heads [ith, nth): mass = d mass + (1 - d) p, p from the selected keys'
 * softmax (scores recomputed block by block: one more pass over their K rows) */
static void mass_fn(void *p, int ith, int nth) {
    const sel_ctx *c = p;
    const int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, B = c->block;
    const int64_t kvd = (int64_t)c->n_kv_heads * hd, nb = (c->n_keys + B - 1) / B;
    float sc[NSTF_SPARSE_BLOCK_MAX];
    for (int g = ith; g < c->n_kv_heads; g += nth) {
        const int32_t *sg = c->sel + g * c->ms;
        float *bm = c->work + 2 * g * c->ms, *bl = bm + c->ms; /* per selected block: max, sum of e^(s - max) */
        for (int64_t b = 0; b < nb; b++) c->mass[b * c->n_kv_heads + g] *= c->decay;
        for (int h = g * group; h < (g + 1) * group; h++) {
            const float *qh = c->q + (int64_t)h * hd;
            float m = -INFINITY, l = 0;
            for (int64_t i = 0; i < c->ms && sg[i] >= 0; i++) {
                const int64_t j0 = (int64_t)sg[i] * B, j1 = j0 + B < c->n_keys ? j0 + B : c->n_keys;
                float mb = -INFINITY, lb = 0;
                for (int64_t j = j0; j < j1; j++) {
                    sc[j - j0] = c->scale * simd_dot(qh, c->k + j * kvd + (int64_t)g * hd, hd);
                    mb = sc[j - j0] > mb ? sc[j - j0] : mb;
                }
                for (int64_t j = j0; j < j1; j++) lb += expf(sc[j - j0] - mb);
                bm[i] = mb, bl[i] = lb;
                m = mb > m ? mb : m;
            }
            for (int64_t i = 0; i < c->ms && sg[i] >= 0; i++) l += bl[i] * expf(bm[i] - m);
            const float f = (1.0f - c->decay) / ((float)group * l);
            for (int64_t i = 0; i < c->ms && sg[i] >= 0; i++)
                c->mass[(int64_t)sg[i] * c->n_kv_heads + g] += f * bl[i] * expf(bm[i] - m);
        }
    }
}

void nstf_cpu_attn_sparse(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out, float *kmin,
                          float *kmax, float *mass, float mass_decay, int32_t *sel, float *work, int64_t n_tok,
                          int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale, int block, int topk,
                          int window) {
    const int64_t kvd = (int64_t)n_kv_heads * head_dim, end = pos0 + n_tok;
    for (int64_t b = pos0 / block; b * block < end; b++) {
        block_stats(k, kmin, kmax, b, end < (b + 1) * block ? end : (b + 1) * block, block, kvd);
        if (mass && b * block >= pos0)
            for (int g = 0; g < n_kv_heads; g++) mass[b * n_kv_heads + g] = 0;
    }
    if (n_tok > 1) {
        nstf_cpu_attention_sw(cpu, q, k, v, out, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, 0);
        return;
    }
    sel_ctx c = {q,     k,     kmin,       kmax,       mass,     work,  sel,  pos0 + 1,
                 nstf_sparse_max_sel(topk, block, window), n_heads, n_kv_heads, head_dim, block, topk, window,
                 scale, mass_decay};
    const int64_t nb = (pos0 + block) / block;
    cpu_run(cpu, select_fn, &c, 4 * nb * n_heads * head_dim, n_kv_heads);
    nstf_cpu_attention_tbl(cpu, q, k, v, sel, c.ms, block, out, nstf_sparse_keys(pos0, topk, block, window), n_heads,
                           n_kv_heads, head_dim, scale);
    if (mass)
        cpu_run(cpu, mass_fn, &c, 2 * nstf_sparse_keys(pos0, topk, block, window) * n_heads * head_dim, n_kv_heads);
}
