/* backward_ref.c — the scalar reference of every backward op
 * (nstf_ref_*_bwd, backward.h) and of the forward helpers the backward needs
 * (attention with its log-sum-exp, the fused cross-entropy): the oracle the
 * fast CPU and GPU backward paths are compared against.
 *
 * Plain loops, written for clarity, not speed. Reductions accumulate in
 * double, so each output is the fp64 result rounded once to fp32. No
 * reference allocates: accumulators longer than a few values live in stack
 * arrays of REF_CHUNK doubles, and longer extents are walked in chunks of
 * that size (recomputing what the chunk needs, e.g. the scores). */
#include <math.h>
#include <string.h>

#include "ops/backward.h"

#define REF_CHUNK 256

/* dtable[ids[t], :] += dout[t, :];  torch: table.grad.index_add_(0, ids, dout)
 * ids must be valid rows of dtable (the forward checked them). */
void nstf_ref_get_rows_bwd(const int32_t *ids /* [n_tok] */, const float *dout /* [n_tok, dim] */,
                           float *dtable /* [n_rows, dim] += */, int64_t n_tok, int64_t dim) {
    for (int64_t t = 0; t < n_tok; t++) {
        float *row = dtable + (int64_t)ids[t] * dim;
        for (int64_t i = 0; i < dim; i++) row[i] += dout[t * dim + i];
    }
}

/* y = x * r * w, r = rsqrt(mean(x^2) + eps);  torch: autograd of
 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
 *   dx += r * dy * w - x * r^3 * c / dim,  c = sum_i dy_i w_i x_i
 *   dw += sum over rows of dy * x * r  (rows summed in double per chunk) */
void nstf_ref_rmsnorm_bwd(const float *x /* [n_tok, dim] */, const float *w /* [dim] */,
                          const float *dy /* [n_tok, dim] */, float *dx /* [n_tok, dim] += */,
                          float *dw /* [dim] += */, int64_t n_tok, int64_t dim, float eps) {
#define RMS_R(xr, r_)                                                       \
    do {                                                                    \
        double ss_ = 0;                                                     \
        for (int64_t i_ = 0; i_ < dim; i_++) ss_ += (double)(xr)[i_] * (xr)[i_]; \
        (r_) = 1.0 / sqrt(ss_ / (double)dim + (double)eps);                 \
    } while (0)
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xr = x + t * dim, *dyr = dy + t * dim;
        double r, c = 0;
        RMS_R(xr, r);
        for (int64_t i = 0; i < dim; i++) c += (double)dyr[i] * w[i] * xr[i];
        for (int64_t i = 0; i < dim; i++)
            dx[t * dim + i] += (float)(r * dyr[i] * w[i] - (double)xr[i] * r * r * r * c / (double)dim);
    }
    double acc[REF_CHUNK]; /* [REF_CHUNK] slice of dw */
    for (int64_t i0 = 0; dw && i0 < dim; i0 += REF_CHUNK) { /* dw NULL: a frozen norm */
        int64_t n = dim - i0 < REF_CHUNK ? dim - i0 : REF_CHUNK;
        for (int64_t i = 0; i < n; i++) acc[i] = 0;
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xr = x + t * dim, *dyr = dy + t * dim;
            double r;
            RMS_R(xr, r);
            for (int64_t i = 0; i < n; i++) acc[i] += (double)dyr[i0 + i] * xr[i0 + i] * r;
        }
        for (int64_t i = 0; i < n; i++) dw[i0 + i] += (float)acc[i];
    }
#undef RMS_R
}

/* The forward rotates (a, b) -> (a c - b s, a s + b c); its transpose maps
 * the gradient (da, db) -> (da c + db s, -da s + db c). Same pair layout and
 * angles theta_i = pos * base^(-2i/head_dim) as nstf_ref_rope.
 * torch: autograd of x * cos + rotate_half(x) * sin (NEOX) */
void nstf_ref_rope_bwd(float *dx /* [n_tok, n_heads, head_dim]: dy in, dx out */,
                       const int32_t *pos /* [n_tok] */, int64_t n_tok, int n_heads, int head_dim,
                       float base, nstf_rope_mode mode) {
    int half = head_dim / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int i = 0; i < half; i++) {
            double theta = (double)pos[t] * pow((double)base, -2.0 * i / head_dim);
            double c = cos(theta), s = sin(theta);
            int ia = mode == NSTF_ROPE_NEOX ? i : 2 * i;
            int ib = mode == NSTF_ROPE_NEOX ? i + half : 2 * i + 1;
            for (int h = 0; h < n_heads; h++) {
                float *g = dx + (t * n_heads + h) * head_dim; /* [head_dim] */
                double ga = g[ia], gb = g[ib];
                g[ia] = (float)(ga * c + gb * s);
                g[ib] = (float)(gb * c - ga * s);
            }
        }
    }
}

/* ---- attention ----------------------------------------------------------- */

/* Shared shape of the attention references. */
typedef struct {
    int64_t n_tok, pos0, kv_stride; /* kv_stride: floats per key position */
    int n_heads, group, head_dim;
    double scale;
} attn_shape;

static attn_shape attn_shape_of(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads,
                                int head_dim, float scale) {
    attn_shape a = {n_tok, pos0, (int64_t)n_kv_heads * head_dim, n_heads, n_heads / n_kv_heads,
                    head_dim, (double)scale};
    return a;
}

/* double-precision dot of n floats */
static double dot_d(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* lse of row (t, h) in double: log sum_j exp(scale * q.k_j) over its keys */
static double attn_row_lse(const attn_shape *a, const float *qh /* [head_dim] */,
                           const float *kh /* [n_keys, ., head_dim] from its kv head */,
                           int64_t n_keys) {
    double m = -INFINITY, den = 0;
    for (int64_t j = 0; j < n_keys; j++) {
        double s = a->scale * dot_d(qh, kh + j * a->kv_stride, a->head_dim);
        if (s > m) m = s;
    }
    for (int64_t j = 0; j < n_keys; j++)
        den += exp(a->scale * dot_d(qh, kh + j * a->kv_stride, a->head_dim) - m);
    return m + log(den);
}

/* torch: F.scaled_dot_product_attention(q, k, v, is_causal, scale) (out) and
 * torch.logsumexp(scale * q @ k.T + causal_mask, -1) (lse), k and v repeated
 * n_heads / n_kv_heads times along the head axis. */
void nstf_ref_attention_lse(const float *q /* [n_tok, n_heads, head_dim] */,
                            const float *k /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            const float *v /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            float *out /* [n_tok, n_heads, head_dim] */,
                            float *lse /* [n_tok, n_heads] */, int64_t n_tok, int64_t pos0,
                            int n_heads, int n_kv_heads, int head_dim, float scale) {
    attn_shape a = attn_shape_of(n_tok, pos0, n_heads, n_kv_heads, head_dim, scale);
    double acc[REF_CHUNK]; /* [REF_CHUNK] slice of one output row */
    for (int64_t t = 0; t < n_tok; t++) {
        int64_t n_keys = pos0 + t + 1;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (t * n_heads + h) * head_dim;       /* [head_dim] */
            const float *kh = k + (int64_t)(h / a.group) * head_dim;  /* [n_keys, ., head_dim] */
            const float *vh = v + (int64_t)(h / a.group) * head_dim;  /* [n_keys, ., head_dim] */
            double l = attn_row_lse(&a, qh, kh, n_keys);
            lse[t * n_heads + h] = (float)l;
            for (int d0 = 0; d0 < head_dim; d0 += REF_CHUNK) {
                int nd = head_dim - d0 < REF_CHUNK ? head_dim - d0 : REF_CHUNK;
                for (int d = 0; d < nd; d++) acc[d] = 0;
                for (int64_t j = 0; j < n_keys; j++) {
                    double p = exp(a.scale * dot_d(qh, kh + j * a.kv_stride, head_dim) - l);
                    for (int d = 0; d < nd; d++) acc[d] += p * vh[j * a.kv_stride + d0 + d];
                }
                for (int d = 0; d < nd; d++) out[(t * n_heads + h) * head_dim + d0 + d] = (float)acc[d];
            }
        }
    }
}

/* One (query row, key) pair from the saved lse: p = exp(scale q.k - lse)
 * and dS = p * (dout.v - D); returns dS, sets *p. */
static double attn_ds(const attn_shape *a, const float *qh, const float *kj, const float *vj,
                      const float *doh, double lse, double dd, double *p) {
    *p = exp(a->scale * dot_d(qh, kj, a->head_dim) - lse);
    return *p * (dot_d(doh, vj, a->head_dim) - dd);
}

/* torch: autograd of F.scaled_dot_product_attention (see backward.h).
 * dq per query row (keys walked once per REF_CHUNK dims); dk, dv per key
 * row and kv head, summing over every query row and query head that sees
 * the key (D_t recomputed there: the reference keeps no per-row scratch). */
void nstf_ref_attention_bwd(const float *q /* [n_tok, n_heads, head_dim] */,
                            const float *k /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            const float *v /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            const float *out /* [n_tok, n_heads, head_dim] */,
                            const float *dout /* [n_tok, n_heads, head_dim] */,
                            const float *lse /* [n_tok, n_heads] */,
                            float *dq /* [n_tok, n_heads, head_dim] */,
                            float *dk /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            float *dv /* [pos0 + n_tok, n_kv_heads, head_dim] */, int64_t n_tok,
                            int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale) {
    attn_shape a = attn_shape_of(n_tok, pos0, n_heads, n_kv_heads, head_dim, scale);
    double acc[REF_CHUNK], acc2[REF_CHUNK]; /* [REF_CHUNK] slices of gradient rows */
    /* dq */
    for (int64_t t = 0; t < n_tok; t++) {
        for (int h = 0; h < n_heads; h++) {
            int64_t row = (t * n_heads + h) * head_dim;
            const float *kh = k + (int64_t)(h / a.group) * head_dim;
            const float *vh = v + (int64_t)(h / a.group) * head_dim;
            double dd = dot_d(dout + row, out + row, head_dim), p;
            for (int d0 = 0; d0 < head_dim; d0 += REF_CHUNK) {
                int nd = head_dim - d0 < REF_CHUNK ? head_dim - d0 : REF_CHUNK;
                for (int d = 0; d < nd; d++) acc[d] = 0;
                for (int64_t j = 0; j <= pos0 + t; j++) {
                    const float *kj = kh + j * a.kv_stride;
                    double ds = attn_ds(&a, q + row, kj, vh + j * a.kv_stride, dout + row,
                                        lse[t * n_heads + h], dd, &p);
                    for (int d = 0; d < nd; d++) acc[d] += ds * kj[d0 + d];
                }
                for (int d = 0; d < nd; d++) dq[row + d0 + d] = (float)(a.scale * acc[d]);
            }
        }
    }
    /* dk, dv */
    for (int64_t j = 0; j < pos0 + n_tok; j++) {
        for (int kvh = 0; kvh < n_kv_heads; kvh++) {
            const float *kj = k + j * a.kv_stride + (int64_t)kvh * head_dim; /* [head_dim] */
            const float *vj = v + j * a.kv_stride + (int64_t)kvh * head_dim; /* [head_dim] */
            for (int d0 = 0; d0 < head_dim; d0 += REF_CHUNK) {
                int nd = head_dim - d0 < REF_CHUNK ? head_dim - d0 : REF_CHUNK;
                for (int d = 0; d < nd; d++) acc[d] = acc2[d] = 0;
                /* the query rows that see key j: positions pos0 + t >= j */
                for (int64_t t = j > pos0 ? j - pos0 : 0; t < n_tok; t++) {
                    for (int h = kvh * a.group; h < (kvh + 1) * a.group; h++) {
                        int64_t row = (t * n_heads + h) * head_dim;
                        double dd = dot_d(dout + row, out + row, head_dim), p;
                        double ds = attn_ds(&a, q + row, kj, vj, dout + row, lse[t * n_heads + h], dd, &p);
                        for (int d = 0; d < nd; d++) {
                            acc[d] += ds * q[row + d0 + d];      /* dk */
                            acc2[d] += p * dout[row + d0 + d];   /* dv */
                        }
                    }
                }
                int64_t at = j * a.kv_stride + (int64_t)kvh * head_dim + d0;
                for (int d = 0; d < nd; d++) {
                    dk[at + d] = (float)(a.scale * acc[d]);
                    dv[at + d] = (float)acc2[d];
                }
            }
        }
    }
}

/* ---- swiglu, matmul ------------------------------------------------------ */

/* torch: autograd of F.silu(gate) * up */
void nstf_ref_swiglu_bwd(const float *gate /* [n] */, const float *up /* [n] */,
                         const float *dy /* [n] */, float *dgate /* [n] */, float *dup /* [n] */,
                         int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = gate[i], u = up[i], d = dy[i];
        double sg = 1.0 / (1.0 + exp(-g));
        dgate[i] = (float)(d * u * sg * (1.0 + g * (1.0 - sg)));
        dup[i] = (float)(d * g * sg);
    }
}

/* dx = dy @ W (+= when acc);  torch: dy @ W */
void nstf_ref_matmul_bwd_x(const float *w /* [n_out, n_in] */, const float *dy /* [n_tok, n_out] */,
                           float *dx /* [n_tok, n_in] */, int64_t n_tok, int64_t n_in,
                           int64_t n_out, bool acc) {
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t i = 0; i < n_in; i++) {
            double s = 0;
            for (int64_t o = 0; o < n_out; o++) s += (double)dy[t * n_out + o] * w[o * n_in + i];
            dx[t * n_in + i] = (float)(acc ? dx[t * n_in + i] + s : s);
        }
    }
}

/* dW += dy.T @ x;  torch: W.grad += dy.T @ x */
void nstf_ref_matmul_bwd_w(const float *x /* [n_tok, n_in] */, const float *dy /* [n_tok, n_out] */,
                           float *dw /* [n_out, n_in] += */, int64_t n_tok, int64_t n_in,
                           int64_t n_out) {
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++) {
            double s = 0;
            for (int64_t t = 0; t < n_tok; t++) s += (double)dy[t * n_out + o] * x[t * n_in + i];
            dw[o * n_in + i] = (float)(dw[o * n_in + i] + s);
        }
    }
}

/* ---- cross-entropy ------------------------------------------------------- */

nstf_status nstf_ce_count(const int32_t *targets /* [n_tok] */, int64_t n_tok, int64_t n_vocab,
                          int32_t ignore_index, int64_t *n_valid) {
    int64_t n = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        if (targets[t] == ignore_index) continue;
        if (targets[t] < 0 || targets[t] >= n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE,
                                  "target %d at position %lld is outside the vocabulary (0..%lld) "
                                  "and is not the ignore index %d",
                                  targets[t], (long long)t, (long long)n_vocab - 1, ignore_index);
        n++;
    }
    *n_valid = n;
    return NSTF_OK;
}

int64_t nstf_ce_prepare(const int32_t *targets /* [n_tok] */, int64_t n_tok, int64_t dim,
                        int32_t ignore_index, double *n_norm, float *lse /* [n_tok] or NULL */,
                        float *dh /* [n_tok, dim] */) {
    int64_t n_valid = 0;
    for (int64_t t = 0; t < n_tok; t++) n_valid += targets[t] != ignore_index;
    if (*n_norm <= 0) *n_norm = (double)n_valid;
    memset(dh, 0, (size_t)(n_tok * dim) * sizeof *dh);
    if (lse)
        for (int64_t t = 0; t < n_tok; t++) lse[t] = 0;
    return n_valid;
}

/* Tokens in chunks of REF_CHUNK; per chunk, three passes that recompute the
 * logits they need in double: lse per token (kept in a stack array); dh per
 * token (sum over the vocabulary); dW per vocabulary row (sum over the
 * chunk's tokens, added to dw once per chunk).
 * g_tv = (exp(z_tv - lse_t) - [v == y_t]) / n_norm.
 * torch: F.cross_entropy(h @ W.T, targets, ignore_index=ignore_index,
 *        reduction="sum") / n_norm, with autograd. */
double nstf_ref_cross_entropy(const float *h /* [n_tok, dim] */, const float *w /* [n_vocab, dim] */,
                              const int32_t *targets /* [n_tok] */, int32_t ignore_index,
                              double n_norm, float *lse /* [n_tok] or NULL */,
                              float *dh /* [n_tok, dim] */, float *dw /* [n_vocab, dim] += */,
                              int64_t n_tok, int64_t dim, int64_t n_vocab) {
    if (nstf_ce_prepare(targets, n_tok, dim, ignore_index, &n_norm, lse, dh) == 0) return 0.0;
    const double inv = 1.0 / n_norm;
#define CE_Z(t, v) dot_d(h + (t) * dim, w + (v) * dim, (int)dim)
    /* d loss / d z of (t, v), given lse_t = l */
#define CE_G(t, v, l) ((exp(CE_Z(t, v) - (l)) - ((v) == targets[t] ? 1.0 : 0.0)) * inv)
    double loss = 0;
    double l[REF_CHUNK];   /* [REF_CHUNK] lse of the chunk's tokens */
    double acc[REF_CHUNK]; /* [REF_CHUNK] slice of a gradient row */
    for (int64_t t0 = 0; t0 < n_tok; t0 += REF_CHUNK) {
        int64_t nt = n_tok - t0 < REF_CHUNK ? n_tok - t0 : REF_CHUNK;
        for (int64_t r = 0; r < nt; r++) {
            int64_t t = t0 + r;
            if (targets[t] == ignore_index) continue;
            double m = -INFINITY, s = 0;
            for (int64_t v = 0; v < n_vocab; v++) m = fmax(m, CE_Z(t, v));
            for (int64_t v = 0; v < n_vocab; v++) s += exp(CE_Z(t, v) - m);
            l[r] = m + log(s);
            if (lse) lse[t] = (float)l[r];
            loss += (l[r] - CE_Z(t, targets[t])) * inv;
            for (int64_t i0 = 0; i0 < dim; i0 += REF_CHUNK) {
                int64_t n = dim - i0 < REF_CHUNK ? dim - i0 : REF_CHUNK;
                for (int64_t i = 0; i < n; i++) acc[i] = 0;
                for (int64_t v = 0; v < n_vocab; v++) {
                    double g = CE_G(t, v, l[r]);
                    for (int64_t i = 0; i < n; i++) acc[i] += g * w[v * dim + i0 + i];
                }
                for (int64_t i = 0; i < n; i++) dh[t * dim + i0 + i] = (float)acc[i];
            }
        }
        for (int64_t v = 0; dw && v < n_vocab; v++) {
            for (int64_t i0 = 0; i0 < dim; i0 += REF_CHUNK) {
                int64_t n = dim - i0 < REF_CHUNK ? dim - i0 : REF_CHUNK;
                for (int64_t i = 0; i < n; i++) acc[i] = 0;
                for (int64_t r = 0; r < nt; r++) {
                    int64_t t = t0 + r;
                    if (targets[t] == ignore_index) continue;
                    double g = CE_G(t, v, l[r]);
                    for (int64_t i = 0; i < n; i++) acc[i] += g * h[t * dim + i0 + i];
                }
                for (int64_t i = 0; i < n; i++) dw[v * dim + i0 + i] += (float)acc[i];
            }
        }
    }
#undef CE_G
#undef CE_Z
    return loss;
}
