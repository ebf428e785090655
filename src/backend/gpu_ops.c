/* gpu_ops.c — the GPU backend's ops: each row of the op table on the
 * kernels of ops/gpu/gpu_api.h, chosen by execution level (gpu.h), plus
 * the layout of a matmul group's outputs (place) and the fused decode
 * GEMVs (can_fuse and the fused matmul).
 *
 * Layouts. One token: a group's outputs are one row (q | k | v, gate |
 * up), the layout of the fused GEMVs. Several tokens: rows of the whole
 * group where one GEMM computes it (adjacent matrices, level 2 and up),
 * else planes of n_batch rows per matrix.
 *
 * A matmul of a few tokens runs on the GEMV with fused dequantization;
 * of more, on the tile GEMM of the matrix units, after dequantizing the
 * matrix to bf16 into the workspace unless it is bf16: for a chunk of T
 * tokens that reads the quantized matrix once and writes/reads 2 bytes per
 * weight, where a batched GEMV would read it T/8 times on the CUDA cores.
 * F16 matrices need no copy: the activations are converted to fp16 into
 * the workspace instead and the GEMM runs on the fp16 matrix instructions
 * (no precision lost to a bf16 copy of the weights).
 *
 * Compiled only with a GPU backend. */
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/gpu.h"
#include "core/mem.h"
#include "core/switches.h"
#include "ops/optim.h"

/* ---- layouts ---------------------------------------------------------------------- */

/* Whether a group of n_w matrices runs as one matmul at this level for n
 * tokens: Q|K|V from level 1 for one token and level 2 for more, gate|up
 * from level 2. */
static bool group_as_one(const gpu_backend *g, int n_w, int64_t n) {
    if (n_w == 3) return n == 1 ? g->level >= 1 : g->level >= 2;
    return g->level >= 2;
}

void nstf_gpu_place(nstf_backend *be, const nstf_matrix *const *w, int n_w, int64_t n, void *buf, nstf_view *out) {
    gpu_backend *g = gpu_of(be);
    nstf_matrix span;
    const bool rows = n == 1 || (n_w > 1 && group_as_one(g, n_w, n) && nstf_matrix_group_span(w, n_w, &span));
    int64_t total = 0;
    for (int i = 0; i < n_w; i++) total += w[i]->n_out;
    uint16_t *p = buf;
    for (int i = 0; i < n_w; i++) {
        if (rows) {
            out[i] = (nstf_view){p, NSTF_TYPE_BF16, total};
            p += w[i]->n_out;
        } else {
            out[i] = (nstf_view){p, NSTF_TYPE_BF16, w[i]->n_out};
            p += (int64_t)g->n_batch * w[i]->n_out;
        }
    }
}

/* ---- matmul ------------------------------------------------------------------------- */

/* Whether mm() runs n tokens of the F16 matrix w on the fp16 GEMM (the
 * activations converted into the workspace). */
static bool mm_f16(const gpu_backend *g, const nstf_matrix *w, int64_t n) {
    return w->type == NSTF_TYPE_F16 && g->wtmp && (uint64_t)n * (uint64_t)w->n_in <= g->wtmp_elems;
}

/* Whether mm() runs n tokens on the GEMV because they are few. Not for a
 * batch that must be row-invariant (gpu.h): the GEMV and the GEMM sum in
 * different orders, so a prompt row computed with 2 others would differ
 * from the same row computed with 20; the GEMM's rows do not depend on M
 * (no split-K: each output sums its K slices in one order in one tile). */
static bool mm_few(const gpu_backend *g, int64_t n) { return n <= GEMV_MAX_TOK && !g->row_invariant; }

/* Whether w (not bf16) fits the workspace's dequantization buffer, so that
 * the GEMM can run on its bf16 copy. */
static bool wtmp_fits(const gpu_backend *g, const nstf_matrix *w) {
    return g->wtmp && (uint64_t)w->n_in * (uint64_t)w->n_out <= g->wtmp_elems;
}

/* Kernels mm() launches for n tokens. */
static int mm_kernels(const gpu_backend *g, const nstf_matrix *w, int64_t n) {
    if (mm_few(g, n) || w->type == NSTF_TYPE_BF16) return 1;
    if (mm_f16(g, w, n)) return 2;
    return wtmp_fits(g, w) ? 2 : 1;
}

/* y[n, n_out] = x[n, n_in] W^T: GEMV for a few tokens, else the GEMM (after
 * dequantizing W to bf16 in the workspace unless it is bf16). */
static nstf_status mm(gpu_backend *g, const nstf_matrix *w, const uint16_t *x, void *y, nstf_type yt, int64_t n) {
    g->n_kernels += mm_kernels(g, w, n);
    if (mm_few(g, n)) return nstf_gpu_gemv(w->type, w->data, x, y, yt, n, w->n_in, w->n_out, g->stream);
    if (mm_f16(g, w, n)) {
        NSTF_TRY(nstf_gpu_bf16_to_f16(x, g->wtmp, n * w->n_in, g->stream));
        return nstf_gpu_gemm_f16(g->wtmp, w->data, y, yt, NULL, NSTF_TYPE_F32, n, w->n_out, w->n_in,
                                 NSTF_GEMM_EPI_NONE, g->stream);
    }
    const uint16_t *wb = w->data;
    if (w->type != NSTF_TYPE_BF16) {
        if (!wtmp_fits(g, w))
            return nstf_gpu_gemv(w->type, w->data, x, y, yt, n, w->n_in, w->n_out, g->stream);
        NSTF_TRY(nstf_gpu_get_rows(w->type, w->data, w->n_out, NULL, g->wtmp, NSTF_TYPE_BF16, w->n_out, w->n_in,
                                   g->stream));
        wb = g->wtmp;
    }
    return nstf_gpu_gemm_bf16(x, wb, y, yt, NULL, NSTF_TYPE_F32, n, w->n_out, w->n_in, NSTF_GEMM_EPI_NONE, g->stream);
}

/* Whether the GEMM takes matmul a with its residual input in the
 * epilogue (NSTF_MM_ADD: out = x W^T + res): one bf16 matrix, enough
 * tokens for the GEMM, fp32 rows of out and res packed. */
static bool mm_add_ok(const gpu_backend *g, const nstf_op_args *a) {
    const nstf_matrix *w = a->matmul.w[0];
    return a->matmul.n_w == 1 && !a->matmul.norm_x && !a->matmul.bias[0] && a->matmul.res &&
           w->type == NSTF_TYPE_BF16 && !mm_few(g, a->matmul.n) && a->matmul.out[0].type == NSTF_TYPE_F32 &&
           a->matmul.out[0].stride == w->n_out && a->matmul.x.stride == w->n_in;
}

/* Whether a Q|K|V group that is not one span (its V has another weight
 * type, as llama.cpp's Q4_K_M / Q5_K_M give some layers' V) runs as two
 * fused GEMVs: Q|K with the RoPE epilogue, then V with the same norm
 * prologue and the epilogue's plain store (rope_rows 0), into the same
 * output row. Not with Qwen's extras (bias, q/k norm). */
static bool qkv_split(const nstf_op_args *a, nstf_matrix *qk) {
    if (a->matmul.epi != NSTF_MM_ROPE || a->matmul.n_w != 3 || !a->matmul.norm_x || a->matmul.q_norm) return false;
    for (int i = 0; i < 3; i++)
        if (a->matmul.bias[i]) return false;
    const nstf_matrix *v = a->matmul.w[2];
    return nstf_matrix_group_span(a->matmul.w, 2, qk) && v->n_in == qk->n_in && v->n_out % 2 == 0 &&
           a->matmul.out[2].data == (const uint16_t *)a->matmul.out[0].data + qk->n_out &&
           nstf_gpu_gemv_fusable(qk->type, qk->data, qk->n_in, 1) && nstf_gpu_gemv_fusable(v->type, v->data, v->n_in, 1);
}

/* The fused decode GEMV of a matmul op (one token; can_fuse said yes). */
static nstf_status mm_fused(gpu_backend *g, const nstf_op_args *a) {
    nstf_matrix w = *a->matmul.w[0];
    bool split = false;
    if (a->matmul.n_w > 1 && !nstf_matrix_group_span(a->matmul.w, a->matmul.n_w, &w)) split = qkv_split(a, &w);
    nstf_gemv_fusion f = {0};
    f.norm_x = a->matmul.norm_x;
    f.norm_w = a->matmul.norm_w;
    f.norm_eps = a->matmul.eps;
    const uint16_t *x = f.norm_x ? NULL : a->matmul.x.data;
    void *y = a->matmul.out[0].data;
    switch (a->matmul.epi) {
    case NSTF_MM_STORE: f.epi = NSTF_GEMV_STORE; break;
    case NSTF_MM_ACCUM:
        f.epi = NSTF_GEMV_ACCUM;
        y = a->matmul.res;
        break;
    case NSTF_MM_ROPE:
        f.epi = NSTF_GEMV_ROPE;
        f.rope_rows = (a->matmul.rope.n_heads + a->matmul.rope.n_kv_heads) * a->matmul.rope.head_dim;
        f.head_dim = a->matmul.rope.head_dim;
        f.rope_mode = a->matmul.rope.mode;
        f.pos = a->matmul.rope.pos;
        f.rope_freqs = g->rope_freqs;
        f.rope_factors = a->matmul.rope.freq_factors;
        /* Qwen: the QKV bias in the epilogue; the per-head q/k norm in a
         * second kernel with the rotation (gemv_fused.cu says why) */
        f.q_rows = a->matmul.rope.n_heads * a->matmul.rope.head_dim;
        f.bias_q = a->matmul.bias[0];
        f.bias_k = a->matmul.bias[1];
        f.bias_v = a->matmul.bias[2];
        f.q_norm = a->matmul.q_norm;
        f.k_norm = a->matmul.k_norm;
        f.qk_eps = a->matmul.eps;
        if (f.q_norm) g->n_kernels++;
        break;
    case NSTF_MM_SWIGLU:
        f.epi = NSTF_GEMV_SWIGLU;
        y = a->matmul.act.data;
        break;
    case NSTF_MM_ADD: return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: the decode GEMV has no residual input");
    }
    g->n_kernels++;
    NSTF_TRY(nstf_gpu_gemv_fused(w.type, w.data, x, y, w.n_in, w.n_out, &f, g->stream));
    if (!split) return NSTF_OK;
    const nstf_matrix *v = a->matmul.w[2];
    f.rope_rows = 0; /* V: every pair stored as computed */
    g->n_kernels++;
    return nstf_gpu_gemv_fused(v->type, v->data, x, a->matmul.out[2].data, v->n_in, v->n_out, &f, g->stream);
}

bool nstf_gpu_can_fuse(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    if (a->op == NSTF_OP_MATMUL && a->matmul.epi == NSTF_MM_ADD) return mm_add_ok(g, a); /* any level */
    if (a->op != NSTF_OP_MATMUL || g->level < 3 || !g->fused_on || !g->decode_step || a->matmul.n != 1) return false;
    /* a bias or per-head norm (Qwen) fuses into the QKV matmul's RoPE epilogue only */
    bool extras = a->matmul.q_norm != NULL;
    for (int i = 0; i < a->matmul.n_w; i++) extras = extras || a->matmul.bias[i] != NULL;
    nstf_matrix w = *a->matmul.w[0];
    const int n_w = a->matmul.n_w, norm = a->matmul.norm_x != NULL;
    bool ok = n_w == 1 || nstf_matrix_group_span(a->matmul.w, n_w, &w) || qkv_split(a, &w);
    switch (a->matmul.epi) {
    case NSTF_MM_STORE: ok = ok && n_w == 1 && norm; break;
    case NSTF_MM_ACCUM: ok = ok && n_w == 1 && !norm; break;
    case NSTF_MM_ROPE: ok = ok && n_w == 3 && norm && (a->matmul.rope.head_dim / 2) % 8 == 0; break;
    case NSTF_MM_SWIGLU: ok = ok && n_w == 2 && norm; break;
    case NSTF_MM_ADD: ok = false; break; /* above */
    }
    ok = ok && (!extras || a->matmul.epi == NSTF_MM_ROPE);
    ok = ok && nstf_gpu_gemv_fusable(w.type, w.data, w.n_in, norm);
    if (!ok) g->unfused++;
    return ok;
}

nstf_status nstf_gpu_op_matmul(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    if (a->matmul.epi == NSTF_MM_ADD) {
        if (!mm_add_ok(g, a))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "GPU backend: %s: a matmul with a residual input that "
                                  "can_fuse declined", a->label ? a->label : "matmul");
        const nstf_matrix *w = a->matmul.w[0];
        g->n_kernels++;
        return nstf_gpu_gemm_bf16(a->matmul.x.data, w->data, a->matmul.out[0].data, NSTF_TYPE_F32, a->matmul.res,
                                  NSTF_TYPE_F32, a->matmul.n, w->n_out, w->n_in, NSTF_GEMM_EPI_RESIDUAL, g->stream);
    }
    if (a->matmul.epi != NSTF_MM_STORE || a->matmul.norm_x) return mm_fused(g, a);
    const int n_w = a->matmul.n_w;
    const int64_t n = a->matmul.n;
    const uint16_t *x = a->matmul.x.data;
    nstf_matrix span;
    if (n_w > 1 && group_as_one(g, n_w, n) && nstf_matrix_group_span(a->matmul.w, n_w, &span) &&
        a->matmul.out[0].stride == span.n_out)
        return mm(g, &span, x, a->matmul.out[0].data, a->matmul.out[0].type, n);
    for (int i = 0; i < n_w; i++) {
        const nstf_matrix *w = a->matmul.w[i];
        if (n > 1 && a->matmul.out[i].stride != w->n_out)
            return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: %s: matrix %d's rows are not dense",
                                  a->label ? a->label : "matmul", i);
        NSTF_TRY(mm(g, w, x, a->matmul.out[i].data, a->matmul.out[i].type, n));
    }
    return NSTF_OK;
}

/* ---- the other ops -------------------------------------------------------------------- */

nstf_status nstf_gpu_op_get_rows(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_matrix *t = a->get_rows.table;
    g->n_kernels++;
    return nstf_gpu_get_rows(t->type, t->data, t->n_out, a->get_rows.ids, a->get_rows.out.data, a->get_rows.out.type,
                             a->get_rows.n, t->n_in, g->stream);
}

/* Residual + norm: L0 a plain add then a plain RMSNorm; L1+ one fused kernel. */
nstf_status nstf_gpu_op_rmsnorm(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const float *res = a->rmsnorm.res;
    const int64_t n = a->rmsnorm.n, dim = a->rmsnorm.dim;
    if (res && g->level == 0) {
        g->n_kernels++;
        NSTF_TRY(nstf_gpu_add(a->rmsnorm.x, res, n * dim, g->stream));
        res = NULL;
    }
    g->n_kernels++;
    return nstf_gpu_rmsnorm(a->rmsnorm.x, res, NSTF_TYPE_F32, a->rmsnorm.w, a->rmsnorm.y.data, n, dim, a->rmsnorm.eps,
                            g->stream);
}

nstf_status nstf_gpu_op_add(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    g->n_kernels++;
    return nstf_gpu_add(a->add.x, a->add.y, a->add.n, g->stream);
}

nstf_status nstf_gpu_op_rope(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_rope_args *r = &a->rope.r;
    g->n_kernels++;
    return nstf_gpu_rope_strided(a->rope.q.data, a->rope.q.stride, a->rope.k.data, a->rope.k.stride, r->pos, a->rope.n,
                                 r->n_heads, r->n_kv_heads, r->head_dim, r->base, r->freq_factors, r->mode, g->stream);
}

/* Materialized attention (L0: QK^T, scale + mask, softmax, PV; L1: the
 * middle two fused), after writing this batch's k, v into the cache. */
static nstf_status naive_attention(gpu_backend *g, const nstf_op_args *a) {
    const int hd = a->attention.head_dim, nh = a->attention.n_heads, nkv = a->attention.n_kv_heads;
    const int64_t kvd = (int64_t)nkv * hd, n = a->attention.n, pos0 = g->pos0, n_kv = pos0 + n;
    const uint16_t *q = a->attention.q.data, *k = a->attention.k.data, *v = a->attention.v.data;
    const int64_t kv_stride = a->attention.k.stride;
    if (n_kv > g->n_ctx || n > g->n_batch || nh > g->n_heads)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "GPU backend: level %d attention over %lld keys, %lld tokens and %d heads does not fit "
                              "the score matrix planned for context %d, batch %d, %d heads",
                              g->level, (long long)n_kv, (long long)n, nh, g->n_ctx, g->n_batch, g->n_heads);
    uint16_t *kc = a->attention.k_cache, *vc = a->attention.v_cache;
    const int32_t *pos = a->attention.pos;
    void *s = g->stream;
    if (kv_stride != kvd) { /* rows of a group (decode): k and v rows are not packed */
        for (int64_t t = 0; t < n; t++) {
            g->n_kernels++;
            NSTF_TRY(nstf_gpu_kv_write(k + t * kv_stride, v + t * kv_stride, kc, vc, pos + t, 1, kvd, a->attention.n_ctx,
                                       s));
        }
    } else {
        g->n_kernels++;
        NSTF_TRY(nstf_gpu_kv_write(k, v, kc, vc, pos, n, kvd, a->attention.n_ctx, s));
    }
    g->n_kernels += g->level == 0 ? 4 : 3;
    NSTF_TRY(nstf_gpu_attn_scores(q, a->attention.q.stride, kc, g->scores, n, n_kv, nh, nkv, hd, s));
    if (g->level == 0) {
        NSTF_TRY(nstf_gpu_scale_mask(g->scores, nh, n, n_kv, pos0, a->attention.scale, a->attention.window, s));
        NSTF_TRY(nstf_gpu_softmax_rows(g->scores, nh, n, n_kv, pos0, 1.0f, 0, 0, s));
    } else {
        NSTF_TRY(nstf_gpu_softmax_rows(g->scores, nh, n, n_kv, pos0, a->attention.scale, 1, a->attention.window, s));
    }
    return nstf_gpu_attn_pv(g->scores, vc, a->attention.out.data, a->attention.out.stride, n, n_kv, nh, nkv, hd, s);
}

/* The Q8_0 cache's row bytes (0: the bf16 cache), or an error where this
 * attention does not read one: a paged cache, the training forward (lse)
 * and the materialized attention of levels 0 and 1 keep bf16. */
static nstf_status kv_row_q8(const gpu_backend *g, const nstf_op_args *a, int64_t *rb) {
    *rb = 0;
    if (!a->attention.kv_q8) return NSTF_OK;
    uint64_t b = 0;
    if (a->attention.blocks || a->attention.lse || g->level < 2 ||
        !nstf_kv_row_bytes(true, 0, (int64_t)a->attention.n_kv_heads * a->attention.head_dim, &b))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "GPU backend: the Q8_0 KV cache is read by the flash-attention kernels (execution level "
                              "2 and above, a contiguous cache, no lse); here level %d%s%s",
                              g->level, a->attention.blocks ? ", a paged cache" : "", a->attention.lse ? ", lse" : "");
    *rb = (int64_t)b;
    return NSTF_OK;
}

nstf_status nstf_gpu_op_attention(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    int64_t kv_rb = 0;
    NSTF_TRY(kv_row_q8(g, a, &kv_rb));
    if (a->attention.blocks) { /* a continuous batch: every token its own sequence and position, at every level */
        g->n_kernels += 2;
        return nstf_gpu_paged_attention(a->attention.q.data, a->attention.q.stride, a->attention.k.data,
                                        a->attention.k.stride, a->attention.v.data, a->attention.v.stride,
                                        a->attention.k_cache, a->attention.v_cache, a->attention.out.data,
                                        a->attention.out.stride, a->attention.pos, a->attention.seq,
                                        a->attention.blocks, a->attention.n, a->attention.n_ctx, g->n_seq,
                                        a->attention.block_size, g->kv_blocks, a->attention.n_heads,
                                        a->attention.n_kv_heads, a->attention.head_dim, a->attention.scale,
                                        a->attention.window, g->stream);
    }
    if (a->attention.lse) { /* the training forward: lse saved */
        const int64_t S = a->attention.n_seq > 1 ? a->attention.n_seq : 1;
        if (a->attention.seq || a->attention.pos0 < 0 || (S > 1 && a->attention.k_cache) ||
            (!a->attention.k_cache && a->attention.pos0 != 0))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "GPU backend: attention with lse runs one sequence at consecutive positions, or "
                                  "a batch of sequences without a cache");
        g->n_kernels++;
        if (!a->attention.k_cache) /* every sequence of the batch on its own rows, one launch */
            return nstf_gpu_flash_attn_lse_batch(a->attention.q.data, a->attention.q.stride, a->attention.k.data,
                                                 a->attention.k.stride, a->attention.v.data, a->attention.v.stride,
                                                 a->attention.out.data, a->attention.out.stride, a->attention.lse,
                                                 a->attention.n, S, a->attention.n_heads, a->attention.n_kv_heads,
                                                 a->attention.head_dim, a->attention.scale, g->stream);
        return nstf_gpu_flash_attn_lse(a->attention.q.data, a->attention.q.stride, a->attention.k.data,
                                       a->attention.k.stride, a->attention.v.data, a->attention.v.stride,
                                       a->attention.k_cache, a->attention.v_cache, a->attention.out.data,
                                       a->attention.out.stride, a->attention.lse, a->attention.n, a->attention.pos0,
                                       a->attention.n_ctx, a->attention.n_heads, a->attention.n_kv_heads,
                                       a->attention.head_dim, a->attention.scale, g->stream);
    }
    if (a->attention.seq || a->attention.pos0 != g->pos0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "GPU backend: attention runs one sequence at consecutive positions per forward");
    if (g->level < 2) return naive_attention(g, a);
    const int64_t qd = (int64_t)a->attention.n_heads * a->attention.head_dim;
    if (g->decode_step) {
        g->n_kernels += 2;
        return nstf_gpu_flash_decode_dpos(a->attention.q.data, a->attention.q.stride, a->attention.k.data,
                                          a->attention.k.stride, a->attention.v.data, a->attention.v.stride,
                                          a->attention.k_cache, a->attention.v_cache, kv_rb, a->attention.out.data,
                                          qd, 1, a->attention.pos, g->bound, a->attention.n_ctx, a->attention.n_heads,
                                          a->attention.n_kv_heads, a->attention.head_dim, a->attention.scale,
                                          a->attention.window, g->fd_scratch, g->fd_bytes, g->stream);
    }
    uint16_t *kc = a->attention.k_cache, *vc = a->attention.v_cache;
    if (kv_rb) { /* a Q8_0 cache: its rows this chunk sees widened once, then the bf16 kernel on them */
        const int64_t kvd = (int64_t)a->attention.n_kv_heads * a->attention.head_dim, w = a->attention.window;
        if (!g->kv_bf || a->attention.n_ctx > g->n_ctx)
            return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: no widening buffer for the Q8_0 cache (planned %s)",
                                  g->kv_q8 ? "for a shorter context" : "without it");
        const int64_t lo = w > 0 && g->pos0 + 1 > w ? g->pos0 + 1 - w : 0;
        g->n_kernels++;
        NSTF_TRY(nstf_gpu_kv_q8_prepare(a->attention.k.data, a->attention.k.stride, a->attention.v.data,
                                        a->attention.v.stride, a->attention.k_cache, a->attention.v_cache, kv_rb,
                                        g->kv_bf, g->kv_bf + a->attention.n_ctx * kvd, a->attention.n, lo, g->pos0,
                                        a->attention.n_ctx, a->attention.n_kv_heads, a->attention.head_dim, g->stream));
        kc = g->kv_bf;
        vc = g->kv_bf + a->attention.n_ctx * kvd;
    }
    g->n_kernels++;
    return nstf_gpu_flash_attn_sw(a->attention.q.data, a->attention.q.stride, a->attention.k.data,
                                  a->attention.k.stride, a->attention.v.data, a->attention.v.stride, kc, vc,
                                  a->attention.out.data, qd, a->attention.n, g->pos0, a->attention.n_ctx,
                                  a->attention.n_heads, a->attention.n_kv_heads, a->attention.head_dim,
                                  a->attention.scale, a->attention.window, g->stream);
}

/* Sparse decode attention (one sequence, contiguous cache): a run of
 * several tokens attends densely (the attention op) and then updates the
 * block statistics; one token runs the sparse kernels (attn_sparse.cu). */
nstf_status nstf_gpu_op_attn_sparse(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    if (a->attn_sparse.kv_q8)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "sparse attention over a Q8_0 KV cache is not supported");
    if (a->attn_sparse.seq || a->attn_sparse.pos0 != g->pos0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "GPU backend: sparse attention runs one sequence at consecutive positions per forward");
    if (a->attn_sparse.n > 1) {
        nstf_op_args at = {.op = NSTF_OP_ATTENTION, .label = a->label, .layer = a->layer, .block = a->block};
        at.attention.q = a->attn_sparse.q;
        at.attention.k = a->attn_sparse.k;
        at.attention.v = a->attn_sparse.v;
        at.attention.k_cache = a->attn_sparse.k_cache;
        at.attention.v_cache = a->attn_sparse.v_cache;
        at.attention.out = a->attn_sparse.out;
        at.attention.pos = a->attn_sparse.pos;
        at.attention.n = a->attn_sparse.n;
        at.attention.n_ctx = a->attn_sparse.n_ctx;
        at.attention.pos0 = a->attn_sparse.pos0;
        at.attention.n_heads = a->attn_sparse.n_heads;
        at.attention.n_kv_heads = a->attn_sparse.n_kv_heads;
        at.attention.head_dim = a->attn_sparse.head_dim;
        at.attention.scale = a->attn_sparse.scale;
        NSTF_TRY(nstf_gpu_op_attention(be, &at));
    }
    g->n_kernels += a->attn_sparse.n > 1 ? 1 : 3;
    return nstf_gpu_attn_sparse(a->attn_sparse.q.data, a->attn_sparse.k.data, a->attn_sparse.v.data,
                                a->attn_sparse.k_cache, a->attn_sparse.v_cache, a->attn_sparse.out.data,
                                a->attn_sparse.pos, a->attn_sparse.n, a->attn_sparse.n_ctx, a->attn_sparse.n_heads,
                                a->attn_sparse.n_kv_heads, a->attn_sparse.head_dim, a->attn_sparse.scale,
                                a->attn_sparse.block, a->attn_sparse.topk, a->attn_sparse.window, a->attn_sparse.kmin,
                                a->attn_sparse.kmax, a->attn_sparse.mass, a->attn_sparse.mass_decay,
                                a->attn_sparse.sel, a->attn_sparse.work, g->stream);
}

/* One token or planes: elementwise; rows of gate | up (one GEMM): by rows. */
nstf_status nstf_gpu_op_swiglu(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const int64_t n = a->swiglu.n, f = a->swiglu.n_ff;
    g->n_kernels++;
    if (n > 1 && a->swiglu.gate.stride == 2 * f)
        return nstf_gpu_swiglu_rows(a->swiglu.gate.data, a->swiglu.y.data, n, f, g->stream);
    return nstf_gpu_swiglu(a->swiglu.gate.data, a->swiglu.up.data, a->swiglu.y.data, n * f, g->stream);
}

nstf_status nstf_gpu_op_argmax(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    g->n_kernels += 2;
    return nstf_gpu_argmax(a->argmax.x.data, a->argmax.x.type, a->argmax.out, a->argmax.n_rows, a->argmax.n,
                           g->am_scratch, g->stream);
}

/* A projection's bias (Qwen2) on the rows of one matrix of a group. */
nstf_status nstf_gpu_op_bias(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    g->n_kernels++;
    return nstf_gpu_bias(a->bias.x.data, a->bias.x.stride, a->bias.b, a->bias.n, a->bias.width, g->stream);
}

/* Per-head RMSNorm of q and k (Qwen3), one kernel for both. */
nstf_status nstf_gpu_op_head_norm(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    g->n_kernels++;
    return nstf_gpu_head_norm(a->head_norm.q.data, a->head_norm.q.stride, a->head_norm.k.data, a->head_norm.k.stride,
                              a->head_norm.wq, a->head_norm.wk, a->head_norm.n, a->head_norm.n_heads,
                              a->head_norm.n_kv_heads, a->head_norm.head_dim, a->head_norm.eps, g->stream);
}

/* ---- training ops -------------------------------------------------------------------------- */

/* The training ops' scratch: at least `bytes`, kept (grown on first need;
 * the stream is drained before an older, smaller buffer is freed). */
static void *tscratch(gpu_backend *g, size_t bytes) {
    return gpu_grow(g, &g->tscratch, &g->tscratch_bytes, bytes) == NSTF_OK ? g->tscratch : NULL;
}

static nstf_status no_scratch(const nstf_op_args *a, size_t bytes) {
    return nstf_set_error(NSTF_ERR_OOM, "GPU backend: %s: no room for %.1f MiB of scratch", nstf_op_name(a->op),
                          (double)bytes / (1 << 20));
}

static nstf_status need_bf16(const nstf_op_args *a, nstf_view v) {
    if (v.type == NSTF_TYPE_BF16) return NSTF_OK;
    return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: %s (%s): operands must be bf16 rows", nstf_op_name(a->op),
                          a->label ? a->label : "?");
}

nstf_status nstf_gpu_op_get_rows_bwd(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    if (a->get_rows_bwd.dout.type != NSTF_TYPE_F32)
        return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: get_rows_bwd: dout must be F32");
    const size_t sb = nstf_gpu_get_rows_bwd_scratch_bytes(a->get_rows_bwd.n);
    void *scr = tscratch(g, sb);
    if (!scr) return no_scratch(a, sb);
    g->n_kernels += 3;
    return nstf_gpu_get_rows_bwd(a->get_rows_bwd.ids, a->get_rows_bwd.dout.data, a->get_rows_bwd.dout.stride,
                                 a->get_rows_bwd.dtable, a->get_rows_bwd.n, a->get_rows_bwd.dim, scr, sb, g->stream);
}

nstf_status nstf_gpu_op_rmsnorm_bwd(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const int64_t n = a->rmsnorm_bwd.n, dim = a->rmsnorm_bwd.dim;
    const nstf_view xa = a->rmsnorm_bwd.dx_act;
    if (xa.data) NSTF_TRY(need_bf16(a, xa));
    const size_t sb = a->rmsnorm_bwd.dw ? nstf_gpu_rmsnorm_bwd_scratch_bytes(n, dim) : 0;
    void *scr = sb ? tscratch(g, sb) : NULL;
    if (sb && !scr) return no_scratch(a, sb);
    g->n_kernels += nstf_gpu_rmsnorm_bwd_launches(dim, a->rmsnorm_bwd.dw != NULL);
    return nstf_gpu_rmsnorm_bwd(a->rmsnorm_bwd.x, a->rmsnorm_bwd.w, a->rmsnorm_bwd.dy, a->rmsnorm_bwd.dx,
                                a->rmsnorm_bwd.dw, xa.data, xa.data ? xa.stride : 0, n, dim, a->rmsnorm_bwd.eps, scr, sb,
                                g->stream);
}

nstf_status nstf_gpu_op_rope_bwd(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_rope_args *r = &a->rope_bwd.r;
    g->n_kernels++;
    return nstf_gpu_rope_bwd(a->rope_bwd.q.data, a->rope_bwd.q.stride, a->rope_bwd.k.data, a->rope_bwd.k.stride, r->pos,
                             a->rope_bwd.n, r->n_heads, r->n_kv_heads, r->head_dim, r->base, r->mode, g->stream);
}

nstf_status nstf_gpu_op_attention_bwd(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_view *v[] = {&a->attention_bwd.q,    &a->attention_bwd.k,  &a->attention_bwd.v,
                            &a->attention_bwd.out,  &a->attention_bwd.dout, &a->attention_bwd.dq,
                            &a->attention_bwd.dk,   &a->attention_bwd.dv};
    for (int i = 0; i < 8; i++) NSTF_TRY(need_bf16(a, *v[i]));
    const int64_t S = a->attention_bwd.n_seq > 1 ? a->attention_bwd.n_seq : 1;
    const size_t sb = nstf_gpu_flash_attn_bwd_scratch_bytes(S * a->attention_bwd.n, a->attention_bwd.n_heads);
    void *scr = tscratch(g, sb);
    if (!scr) return no_scratch(a, sb);
    g->n_kernels += 3;
    return nstf_gpu_flash_attn_bwd_batch(
        a->attention_bwd.q.data, a->attention_bwd.q.stride, a->attention_bwd.k.data, a->attention_bwd.k.stride,
        a->attention_bwd.v.data, a->attention_bwd.v.stride, a->attention_bwd.out.data, a->attention_bwd.out.stride,
        a->attention_bwd.dout.data, a->attention_bwd.dout.stride, a->attention_bwd.lse, a->attention_bwd.dq.data,
        a->attention_bwd.dq.stride, a->attention_bwd.dk.data, a->attention_bwd.dk.stride, a->attention_bwd.dv.data,
        a->attention_bwd.dv.stride, a->attention_bwd.n, S, a->attention_bwd.pos0, a->attention_bwd.n_heads,
        a->attention_bwd.n_kv_heads, a->attention_bwd.head_dim, a->attention_bwd.scale, scr, sb, g->stream);
}

nstf_status nstf_gpu_op_swiglu_bwd(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_view *v[] = {&a->swiglu_bwd.gate, &a->swiglu_bwd.up, &a->swiglu_bwd.dy, &a->swiglu_bwd.dgate,
                            &a->swiglu_bwd.dup};
    for (int i = 0; i < 5; i++) NSTF_TRY(need_bf16(a, *v[i]));
    g->n_kernels++;
    return nstf_gpu_swiglu_bwd(a->swiglu_bwd.gate.data, a->swiglu_bwd.gate.stride, a->swiglu_bwd.up.data,
                               a->swiglu_bwd.up.stride, a->swiglu_bwd.dy.data, a->swiglu_bwd.dy.stride,
                               a->swiglu_bwd.dgate.data, a->swiglu_bwd.dgate.stride, a->swiglu_bwd.dup.data,
                               a->swiglu_bwd.dup.stride, a->swiglu_bwd.n, a->swiglu_bwd.n_ff, g->stream);
}

/* Whether an M x N x K gradient GEMM takes the forward's wgmma GEMM (on
 * Hopper; K % 8 == 0, its TMA rule) after transposing the operand that is
 * not k-major into the training scratch: 2 bytes per element moved twice,
 * for the wgmma rate instead of the portable kernel's (gemm_bwd.cu). dX
 * transposes W (small); dW takes this only where its MN-major form
 * (nstf_gpu_gemm_dw, nothing transposed) does not apply. */
static bool bwd_wgmma(int64_t m, int64_t n, int64_t k) { return nstf_gpu_gemm_kmajor_fast(m, n, k) != 0; }

/* A matrix not stored bf16 (a frozen, quantized base) is dequantized into
 * the workspace first, as the forward's GEMM path does. */
nstf_status nstf_gpu_op_matmul_bwd_x(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_matrix *w = a->matmul_bwd_x.w;
    NSTF_TRY(need_bf16(a, a->matmul_bwd_x.dy));
    const uint16_t *wb = w->data;
    if (w->type != NSTF_TYPE_BF16) {
        if (!wtmp_fits(g, w))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "GPU backend: %s: a %s matrix of %lld x %lld is larger than the planned "
                                  "dequantization buffer",
                                  a->label ? a->label : "matmul_bwd_x", nstf_type_name(w->type), (long long)w->n_out,
                                  (long long)w->n_in);
        g->n_kernels++;
        NSTF_TRY(nstf_gpu_get_rows(w->type, w->data, w->n_out, NULL, g->wtmp, NSTF_TYPE_BF16, w->n_out, w->n_in,
                                   g->stream));
        wb = g->wtmp;
    }
    const int64_t n = a->matmul_bwd_x.n;
    const nstf_view dx = a->matmul_bwd_x.dx;
    if (a->matmul_bwd_x.dy.stride == w->n_out && (uintptr_t)a->matmul_bwd_x.dy.data % 16 == 0 &&
        dx.stride == w->n_in && bwd_wgmma(n, w->n_in, w->n_out)) {
        /* dX [n, in] = dY [n, out] (W^T [in, out])^T: W transposed, then the forward GEMM */
        uint16_t *wt = tscratch(g, (size_t)w->n_in * (size_t)w->n_out * 2);
        if (!wt) return nstf_set_error(NSTF_ERR_OOM, "GPU backend: no room for a transposed %lld x %lld matrix",
                                       (long long)w->n_out, (long long)w->n_in);
        g->n_kernels += 2;
        NSTF_TRY(nstf_gpu_transpose_bf16(wb, w->n_in, wt, w->n_out, w->n_in, g->stream));
        return nstf_gpu_gemm_bf16(a->matmul_bwd_x.dy.data, wt, dx.data, dx.type, a->matmul_bwd_x.acc ? dx.data : NULL,
                                  dx.type, n, w->n_in, w->n_out,
                                  a->matmul_bwd_x.acc ? NSTF_GEMM_EPI_RESIDUAL : NSTF_GEMM_EPI_NONE, g->stream);
    }
    g->n_kernels++;
    return nstf_gpu_matmul_bwd_x(wb, a->matmul_bwd_x.dy.data, a->matmul_bwd_x.dy.stride, a->matmul_bwd_x.dx.data,
                                 a->matmul_bwd_x.dx.type, a->matmul_bwd_x.dx.stride, a->matmul_bwd_x.n, w->n_in,
                                 w->n_out, a->matmul_bwd_x.acc, g->stream);
}

nstf_status nstf_gpu_op_matmul_bwd_w(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    NSTF_TRY(need_bf16(a, a->matmul_bwd_w.x));
    NSTF_TRY(need_bf16(a, a->matmul_bwd_w.dy));
    const int64_t n = a->matmul_bwd_w.n, n_in = a->matmul_bwd_w.n_in, n_out = a->matmul_bwd_w.n_out;
    const nstf_view x = a->matmul_bwd_w.x, dy = a->matmul_bwd_w.dy;
    size_t sb = 0;
    if (nstf_gpu_gemm_dw_fast(dy.data, dy.stride, x.data, x.stride, n_out, n_in, n, &sb)) {
        /* dW [out, in] += dY^T X with dY [n, out] and X [n, in] read as stored */
        void *scr = sb ? tscratch(g, sb) : NULL;
        if (sb && !scr) return no_scratch(a, sb);
        g->n_kernels += sb ? 2 : 1;
        return nstf_gpu_gemm_dw(dy.data, dy.stride, x.data, x.stride, a->matmul_bwd_w.dw, n_out, n_in, n, scr, sb,
                                g->stream);
    }
    if (bwd_wgmma(n_out, n_in, n)) {
        /* dW [out, in] += (dY^T [out, n]) (X^T [in, n])^T: both transposed, then the forward GEMM adding into dW */
        uint16_t *t = tscratch(g, ((size_t)n_out + (size_t)n_in) * (size_t)n * 2);
        if (!t) return nstf_set_error(NSTF_ERR_OOM, "GPU backend: no room for transposed %lld-token activations",
                                      (long long)n);
        uint16_t *dyt = t, *xt = t + n_out * n;
        g->n_kernels += 3;
        NSTF_TRY(nstf_gpu_transpose_bf16(a->matmul_bwd_w.dy.data, a->matmul_bwd_w.dy.stride, dyt, n, n_out, g->stream));
        NSTF_TRY(nstf_gpu_transpose_bf16(a->matmul_bwd_w.x.data, a->matmul_bwd_w.x.stride, xt, n, n_in, g->stream));
        return nstf_gpu_gemm_bf16(dyt, xt, a->matmul_bwd_w.dw, NSTF_TYPE_F32, a->matmul_bwd_w.dw, NSTF_TYPE_F32, n_out,
                                  n_in, n, NSTF_GEMM_EPI_RESIDUAL, g->stream);
    }
    g->n_kernels++;
    return nstf_gpu_matmul_bwd_w(a->matmul_bwd_w.x.data, a->matmul_bwd_w.x.stride, a->matmul_bwd_w.dy.data,
                                 a->matmul_bwd_w.dy.stride, a->matmul_bwd_w.dw, a->matmul_bwd_w.n, a->matmul_bwd_w.n_in,
                                 a->matmul_bwd_w.n_out, g->stream);
}

nstf_status nstf_gpu_op_cross_entropy(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_matrix *w = a->cross_entropy.w;
    const int64_t n = a->cross_entropy.n, dim = w->n_in, vocab = w->n_out;
    if (w->type != NSTF_TYPE_BF16 || a->cross_entropy.h.stride != dim)
        return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: cross-entropy wants a bf16 output matrix and dense rows");
    NSTF_TRY(need_bf16(a, a->cross_entropy.h));
    double n_norm = a->cross_entropy.n_norm;
    if (n_norm <= 0) { /* this call's count of targets */
        int32_t *t = nstf_alloc((size_t)n * sizeof(int32_t), "targets");
        if (!t) return NSTF_ERR_OOM;
        int64_t nv = 0;
        nstf_status st = nstf_gpu_memcpy_d2h(t, a->cross_entropy.targets, (size_t)n * sizeof(int32_t), g->stream);
        for (int64_t i = 0; st == NSTF_OK && i < n; i++) nv += t[i] != a->cross_entropy.ignore_index;
        nstf_free(t);
        NSTF_TRY(st);
        if (nv == 0) { /* no target: loss 0, zero gradients (the CPU's contract) */
            const double zero = 0;
            NSTF_TRY(nstf_gpu_memset(a->cross_entropy.dh, 0, (size_t)n * (size_t)dim * sizeof(float), g->stream));
            if (a->cross_entropy.lse) NSTF_TRY(nstf_gpu_memset(a->cross_entropy.lse, 0, (size_t)n * sizeof(float), g->stream));
            return nstf_gpu_memcpy_h2d(a->cross_entropy.loss, &zero, sizeof zero, g->stream);
        }
        n_norm = (double)nv;
    }
    /* chunks of tokens within the budget (NSTF_CE_ROWS forces a size) */
    const int sw = nstf_switch_int(NSTF_SW_CE_ROWS);
    const int64_t rows = sw >= 8 ? (int64_t)sw / 8 * 8 : nstf_gpu_cross_entropy_rows(n, dim, vocab, NSTF_GPU_CE_BUDGET);
    const size_t sb = nstf_gpu_cross_entropy_scratch_bytes(n, rows, dim, vocab);
    void *scr = tscratch(g, sb);
    if (!scr) return no_scratch(a, sb);
    g->n_kernels += nstf_gpu_cross_entropy_launches(a->cross_entropy.h.data, n, dim, vocab, rows,
                                                    a->cross_entropy.dw != NULL);
    return nstf_gpu_cross_entropy(a->cross_entropy.h.data, w->data, a->cross_entropy.targets,
                                  a->cross_entropy.ignore_index, n_norm, a->cross_entropy.lse, a->cross_entropy.dh,
                                  a->cross_entropy.dw, a->cross_entropy.loss, n, dim, vocab, rows, scr, sb, g->stream);
}

nstf_status nstf_gpu_op_adamw(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    if (a->adamw.w_copy.data) NSTF_TRY(need_bf16(a, a->adamw.w_copy));
    g->n_kernels += 2;
    return nstf_gpu_adamw(a->adamw.p, a->adamw.step, a->adamw.grad_scale, a->adamw.tensors, a->adamw.n_tensors,
                          a->adamw.w, a->adamw.grad, a->adamw.m, a->adamw.v, a->adamw.w_copy.data, g->stream);
}

/* The per-tensor sums on the device; a non-finite one is named as on the
 * CPU (nstf_cpu_grad_norm on a host copy of that tensor finds the element). */
nstf_status nstf_gpu_op_grad_norm(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const struct nstf_param_tensor *t = a->grad_norm.tensors;
    const int nt = a->grad_norm.n_tensors;
    const size_t sb = nstf_gpu_grad_norm_scratch_bytes(t, nt);
    void *scr = tscratch(g, sb);
    if (!scr) return no_scratch(a, sb);
    g->n_kernels += 2;
    NSTF_TRY(nstf_gpu_grad_norm(t, nt, a->grad_norm.grad, a->grad_norm.sq, scr, sb, g->stream));
    double total = 0;
    int bad = -1;
    for (int i = 0; i < nt; i++) {
        if (!isfinite(a->grad_norm.sq[i]) && bad < 0) bad = i;
        total += a->grad_norm.sq[i];
    }
    *a->grad_norm.norm = sqrt(total);
    if (bad < 0) return NSTF_OK;
    float *h = nstf_alloc((size_t)t[bad].n * sizeof(float), "gradient copy");
    if (!h) return NSTF_ERR_OOM;
    nstf_status st = nstf_gpu_memcpy_d2h(h, a->grad_norm.grad + t[bad].offset, (size_t)t[bad].n * sizeof(float), g->stream);
    if (st == NSTF_OK) {
        nstf_param_tensor one = t[bad];
        double norm1 = 0;
        one.offset = 0;
        st = nstf_cpu_grad_norm(NULL, &one, 1, h, NULL, &norm1);
        if (st == NSTF_OK) /* the sum overflowed though every element is finite */
            st = nstf_set_error(NSTF_ERR_RANGE, "gradient of %s is not finite: its sum of squares overflows",
                                t[bad].name ? t[bad].name : "(unnamed tensor)");
    }
    nstf_free(h);
    *a->grad_norm.norm = NAN;
    return st;
}

/* A matrix stored as low-rank factors: two matmuls through a bf16
 * intermediate (ops/gpu/matmul_lr.cu), the GEMM path on the workspace
 * that prefill's dequantization uses. */
nstf_status nstf_gpu_op_matmul_lr(nstf_backend *be, const nstf_op_args *a) {
    gpu_backend *g = gpu_of(be);
    const nstf_matrix *fa = a->matmul_lr.a, *fb = a->matmul_lr.b;
    const int64_t n = a->matmul_lr.n;
    if (a->matmul_lr.tmp.stride != fa->n_out || (n > 1 && a->matmul_lr.out.stride != fb->n_out))
        return nstf_set_error(NSTF_ERR_INTERNAL, "GPU backend: %s: low-rank matmul rows are not dense",
                              a->label ? a->label : "matmul_lr");
    const nstf_gpu_lr_ws ws = {g->wtmp, g->wtmp_elems, GEMV_MAX_TOK};
    g->n_kernels += nstf_gpu_matmul_lr_kernels(fa->type, n, fa->n_in, fa->n_out, &ws) +
                    nstf_gpu_matmul_lr_kernels(fb->type, n, fb->n_in, fb->n_out, &ws);
    return nstf_gpu_matmul_lr(fa->type, fa->data, fb->type, fb->data, a->matmul_lr.x.data, a->matmul_lr.tmp.data,
                              a->matmul_lr.out.data, a->matmul_lr.out.type, n, fa->n_in, fa->n_out, fb->n_out, &ws,
                              g->stream);
}

#endif /* NSTF_HAVE_CUDA || NSTF_HAVE_HIP */
