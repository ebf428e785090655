/* ref.c — the scalar reference of every op (nstf_ref_*): the oracle that
 * each faster path (threaded/SIMD CPU, GPU) is compared against.
 *
 * Plain loops, written for clarity, not speed. Reductions accumulate in
 * double so that the reference itself sits well inside the tests' fp32
 * tolerance. No reference allocates: scratch lives in small fixed-size
 * stack arrays, and longer extents are walked in chunks of that size. */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

/* Elements per chunk for stack scratch; a multiple of every block size. */
#define REF_CHUNK 256

/* out[t, :] = dequant(table[ids[t], :]);  torch: table[ids]
 * ids must be valid row indices (the caller checks them against n_rows);
 * dim must be a multiple of the type's block size. */
void nstf_ref_get_rows(nstf_type type, const void *table /* [n_rows, dim] */,
                       const int32_t *ids /* [n_tok] */, float *out /* [n_tok, dim] */,
                       int64_t n_tok, int64_t dim) {
    uint64_t row_bytes = 0;
    if (!nstf_type_row_bytes(type, dim, &row_bytes)) return;
    for (int64_t t = 0; t < n_tok; t++) {
        const unsigned char *row = (const unsigned char *)table + (uint64_t)ids[t] * row_bytes;
        nstf_dequantize_row(type, row, out + t * dim, dim);
    }
}

/* torch: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w */
void nstf_ref_rmsnorm(const float *x /* [n_tok, dim] */, const float *w /* [dim] */,
                      float *y /* [n_tok, dim] */, int64_t n_tok, int64_t dim, float eps) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xr = x + t * dim;
        float *yr = y + t * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / (double)dim + (double)eps);
        for (int64_t i = 0; i < dim; i++) yr[i] = (float)((double)xr[i] * inv * w[i]);
    }
}

/* y = a + b; y may alias a or b.  torch: a + b */
void nstf_ref_add(const float *a /* [n] */, const float *b /* [n] */, float *y /* [n] */,
                  int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* y = x @ W.T with W dequantized;  torch: F.linear(x, W)
 * W is dequantized REF_CHUNK elements at a time (whole blocks) into a stack
 * buffer; n_in must be a multiple of the type's block size. */
void nstf_ref_matmul(nstf_type wtype, const void *w /* [n_out, n_in] */,
                     const float *x /* [n_tok, n_in] */, float *y /* [n_tok, n_out] */,
                     int64_t n_tok, int64_t n_in, int64_t n_out) {
    uint64_t row_bytes = 0, chunk_bytes = 0;
    if (!nstf_type_row_bytes(wtype, n_in, &row_bytes)) return;
    nstf_type_row_bytes(wtype, REF_CHUNK, &chunk_bytes);
    float wrow[REF_CHUNK]; /* [REF_CHUNK] dequantized slice of one W row */
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xr = x + t * n_in;
        for (int64_t o = 0; o < n_out; o++) {
            const unsigned char *row = (const unsigned char *)w + (uint64_t)o * row_bytes;
            double acc = 0;
            for (int64_t i0 = 0; i0 < n_in; i0 += REF_CHUNK) {
                int64_t n = n_in - i0 < REF_CHUNK ? n_in - i0 : REF_CHUNK;
                nstf_dequantize_row(wtype, row + (uint64_t)(i0 / REF_CHUNK) * chunk_bytes, wrow, n);
                for (int64_t i = 0; i < n; i++) acc += (double)wrow[i] * xr[i0 + i];
            }
            y[t * n_out + o] = (float)acc;
        }
    }
}

/* y = (x A^T) B^T through tmp = x A^T (rounded to float, as a backend
 * holds it);  torch: F.linear(F.linear(x, A), B) */
void nstf_ref_matmul_lr(nstf_type ta, const void *a /* [rank, n_in] */, nstf_type tb,
                        const void *b /* [n_out, rank] */, const float *x /* [n_tok, n_in] */,
                        float *tmp /* [n_tok, rank] */, float *y /* [n_tok, n_out] */, int64_t n_tok,
                        int64_t n_in, int64_t rank, int64_t n_out) {
    nstf_ref_matmul(ta, a, x, tmp, n_tok, n_in, rank);
    nstf_ref_matmul(tb, b, tmp, y, n_tok, rank, n_out);
}

/* In-place rotary embedding; theta_i = pos * base^(-2i/head_dim), i < head_dim/2.
 *   NORM: (x[2i], x[2i+1])          rotated by theta_i  (ggml rope mode 0)
 *   NEOX: (x[i], x[i + head_dim/2]) rotated by theta_i  (ggml rope mode 2;
 *         torch/HF: x * cos + rotate_half(x) * sin)
 * rotation: (a, b) -> (a cos - b sin, a sin + b cos). head_dim is even. */
void nstf_ref_rope_ff(float *x /* [n_tok, n_heads, head_dim] */, const int32_t *pos /* [n_tok] */,
                      int64_t n_tok, int n_heads, int head_dim, float base,
                      const float *factors /* [head_dim/2] or NULL */, nstf_rope_mode mode) {
    int half = head_dim / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double theta = (double)pos[t] * pow((double)base, -2.0 * i / head_dim);
                if (factors) theta /= factors[i];
                double c = cos(theta), s = sin(theta);
                int ia = mode == NSTF_ROPE_NEOX ? i : 2 * i;
                int ib = mode == NSTF_ROPE_NEOX ? i + half : 2 * i + 1;
                double a = xh[ia], b = xh[ib];
                xh[ia] = (float)(a * c - b * s);
                xh[ib] = (float)(a * s + b * c);
            }
        }
    }
}

void nstf_ref_rope(float *x, const int32_t *pos, int64_t n_tok, int n_heads, int head_dim, float base,
                   nstf_rope_mode mode) {
    nstf_ref_rope_ff(x, pos, n_tok, n_heads, head_dim, base, NULL, mode);
}

/* Causal GQA: token t sits at position pos0 + t and attends to cache
 * positions 0..pos0+t; head h uses kv head h / (n_heads / n_kv_heads).
 * torch: F.scaled_dot_product_attention(q, k, v, is_causal, scale) with k, v
 * repeated n_heads / n_kv_heads times along the head axis.
 * Three passes per (t, h): max score, softmax denominator, weighted sum of
 * V (in output chunks of REF_CHUNK dims so the accumulator fits the stack;
 * scores are recomputed per chunk, i.e. once when head_dim <= REF_CHUNK). */
void nstf_ref_attention_sw(const float *q /* [n_tok, n_heads, head_dim] */,
                           const float *k /* [n_ctx, n_kv_heads, head_dim] */,
                           const float *v /* [n_ctx, n_kv_heads, head_dim] */,
                           float *out /* [n_tok, n_heads, head_dim] */, int64_t n_tok, int64_t pos0,
                           int n_heads, int n_kv_heads, int head_dim, float scale, int window) {
    int group = n_heads / n_kv_heads;
    int64_t kv_stride = (int64_t)n_kv_heads * head_dim; /* floats per cache position */
    double acc[REF_CHUNK]; /* [REF_CHUNK] slice of the output accumulator */
    for (int64_t t = 0; t < n_tok; t++) {
        int64_t n_keys = pos0 + t + 1;
        int64_t j0 = window > 0 && n_keys > window ? n_keys - window : 0; /* first key seen */
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (t * n_heads + h) * head_dim;     /* [head_dim] */
            const float *kh = k + (int64_t)(h / group) * head_dim;  /* [n_ctx, ., head_dim] */
            const float *vh = v + (int64_t)(h / group) * head_dim;  /* [n_ctx, ., head_dim] */
            float *oh = out + (t * n_heads + h) * head_dim;         /* [head_dim] */
#define REF_SCORE(j, dst)                                                          \
    do {                                                                           \
        double s_ = 0;                                                             \
        for (int d_ = 0; d_ < head_dim; d_++)                                      \
            s_ += (double)qh[d_] * kh[(j) * kv_stride + d_];                       \
        (dst) = s_ * scale;                                                        \
    } while (0)
            double m = -INFINITY, den = 0, s;
            for (int64_t j = j0; j < n_keys; j++) {
                REF_SCORE(j, s);
                if (s > m) m = s;
            }
            for (int64_t j = j0; j < n_keys; j++) {
                REF_SCORE(j, s);
                den += exp(s - m);
            }
            for (int d0 = 0; d0 < head_dim; d0 += REF_CHUNK) {
                int nd = head_dim - d0 < REF_CHUNK ? head_dim - d0 : REF_CHUNK;
                for (int d = 0; d < nd; d++) acc[d] = 0;
                for (int64_t j = j0; j < n_keys; j++) {
                    REF_SCORE(j, s);
                    double p = exp(s - m) / den;
                    for (int d = 0; d < nd; d++) acc[d] += p * vh[j * kv_stride + d0 + d];
                }
                for (int d = 0; d < nd; d++) oh[d0 + d] = (float)acc[d];
            }
#undef REF_SCORE
        }
    }
}

void nstf_ref_attention(const float *q, const float *k, const float *v, float *out, int64_t n_tok, int64_t pos0,
                        int n_heads, int n_kv_heads, int head_dim, float scale) {
    nstf_ref_attention_sw(q, k, v, out, n_tok, pos0, n_heads, n_kv_heads, head_dim, scale, 0);
}

/* y = gate * sigmoid(gate) * up;  torch: F.silu(gate) * up */
void nstf_ref_swiglu(const float *gate /* [n] */, const float *up /* [n] */, float *y /* [n] */,
                     int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = gate[i];
        y[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
}

/* out[r] = argmax_j x[r, j], first index on ties;  torch: x.argmax(-1)
 * (torch also returns the first maximal index). Rows holding NaN give an
 * unspecified index. */
void nstf_ref_argmax(const float *x /* [n_rows, n] */, int32_t *out /* [n_rows] */,
                     int64_t n_rows, int64_t n) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        int64_t best = 0;
        for (int64_t j = 1; j < n; j++)
            if (xr[j] > xr[best]) best = j;
        out[r] = (int32_t)best;
    }
}

/* x[t, :] += b;  torch: F.linear(x, W, b)'s bias */
void nstf_ref_bias(float *x /* [n_tok, width] */, const float *b /* [width] */, int64_t n_tok,
                   int64_t width) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < width; i++) x[t * width + i] = (float)((double)x[t * width + i] + b[i]);
}

/* Per-head RMSNorm in place;  torch (Qwen3RMSNorm over the head axis):
 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w */
void nstf_ref_head_norm(float *x /* [n_rows, head_dim] */, const float *w /* [head_dim] */,
                        int64_t n_rows, int head_dim, float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = x + r * head_dim;
        double ss = 0;
        for (int i = 0; i < head_dim; i++) ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / head_dim + eps);
        for (int i = 0; i < head_dim; i++) xr[i] = (float)(xr[i] * inv * w[i]);
    }
}
