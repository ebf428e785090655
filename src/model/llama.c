/* llama.c — Llama-family config, weights and the CPU forward pass. */
#include "model/llama.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "prof/profiler.h"

/* ---- config ------------------------------------------------------------- */

static nstf_status read_u32(const nstf_gguf *g, const char *arch, const char *suffix,
                            uint32_t *out, bool required, uint32_t dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!required && !nstf_gguf_find_kv(g, key)) { *out = dflt; return NSTF_OK; }
    return nstf_gguf_get_u32(g, key, out);
}

static nstf_status read_f32(const nstf_gguf *g, const char *arch, const char *suffix, float *out,
                            float dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!nstf_gguf_find_kv(g, key)) { *out = dflt; return NSTF_OK; }
    return nstf_gguf_get_f32(g, key, out);
}

static nstf_status load_config(const nstf_gguf *g, nstf_llama_config *c) {
    nstf_gguf_str arch_s;
    NSTF_TRY(nstf_gguf_get_str(g, "general.architecture", &arch_s));
    char arch[64];
    if (arch_s.len == 0 || arch_s.len >= sizeof arch)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: general.architecture is empty or too long", g->path);
    memcpy(arch, arch_s.ptr, arch_s.len);
    arch[arch_s.len] = 0;
    if (strcmp(arch, "llama") != 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: architecture '%s' is not supported (supported: llama)", g->path, arch);
    uint32_t n_layers, dim, n_heads, n_kv, ffn, ctx, head_dim, rope_dim;
    NSTF_TRY(read_u32(g, arch, "block_count", &n_layers, true, 0));
    NSTF_TRY(read_u32(g, arch, "embedding_length", &dim, true, 0));
    NSTF_TRY(read_u32(g, arch, "attention.head_count", &n_heads, true, 0));
    NSTF_TRY(read_u32(g, arch, "attention.head_count_kv", &n_kv, false, n_heads));
    NSTF_TRY(read_u32(g, arch, "feed_forward_length", &ffn, true, 0));
    NSTF_TRY(read_u32(g, arch, "context_length", &ctx, false, 2048));
    if (n_layers < 1 || n_layers > 1024 || dim < 1 || dim > 65536 || n_heads < 1 || n_heads > 1024 ||
        ffn < 1 || ffn > 1 << 20 || ctx < 1)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: implausible model shape (layers %u, dim %u, heads %u, ffn %u, ctx %u)",
                              g->path, n_layers, dim, n_heads, ffn, ctx);
    if (n_kv < 1 || n_heads % n_kv != 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: %u heads are not a multiple of %u kv heads",
                              g->path, n_heads, n_kv);
    NSTF_TRY(read_u32(g, arch, "attention.key_length", &head_dim, false, dim / n_heads));
    NSTF_TRY(read_u32(g, arch, "rope.dimension_count", &rope_dim, false, head_dim));
    if (head_dim * n_heads != dim || head_dim % 2 != 0 || head_dim > 512)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: head size %u with %u heads and width %u is not supported", g->path,
                              head_dim, n_heads, dim);
    if (rope_dim != head_dim)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: partial rotary embedding (%u of %u dims) is not supported", g->path,
                              rope_dim, head_dim);
    c->n_layers = (int)n_layers;
    c->dim = (int)dim;
    c->n_heads = (int)n_heads;
    c->n_kv_heads = (int)n_kv;
    c->head_dim = (int)head_dim;
    c->ffn_dim = (int)ffn;
    c->n_ctx_train = (int)ctx;
    NSTF_TRY(read_f32(g, arch, "rope.freq_base", &c->rope_base, 10000.0f));
    NSTF_TRY(read_f32(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps, 1e-5f));
    if (!(c->rope_base > 0) || !(c->norm_eps > 0) || !(c->norm_eps < 1))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: bad rope base %g or norm epsilon %g", g->path,
                              (double)c->rope_base, (double)c->norm_eps);
    c->rope_mode = nstf_gguf_get_bool_or(g, "nstf.rope.neox", false) ? NSTF_ROPE_NEOX : NSTF_ROPE_NORM; /* GGUF "llama": Q/K permuted for adjacent pairs; HF folder views: rotate-half (io/hf_model.h) */
    return NSTF_OK;
}

/* ---- weights -------------------------------------------------------------- */

static nstf_status get_tensor(const nstf_gguf *g, const char *name, int64_t n_in, int64_t n_out,
                              bool optional, const nstf_gguf_tensor **out) {
    const nstf_gguf_tensor *t = nstf_gguf_find_tensor(g, name);
    *out = t;
    if (!t) {
        if (optional) return NSTF_OK;
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' is missing", g->path, name);
    }
    bool is_vec = n_out == 0;
    bool ok = is_vec ? (t->n_dims == 1 && t->ne[0] == n_in)
                     : (t->n_dims == 2 && t->ne[0] == n_in && t->ne[1] == n_out);
    if (!ok)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s' has shape [%lld, %lld] (%u dims); expected [%lld, %lld]",
                              g->path, name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
                              (long long)n_in, (long long)(is_vec ? 1 : n_out));
    return NSTF_OK;
}

static nstf_status get_matrix(const nstf_gguf *g, const char *name, int64_t n_in, int64_t n_out,
                              nstf_matrix *m) {
    const nstf_gguf_tensor *t;
    NSTF_TRY(get_tensor(g, name, n_in, n_out, false, &t));
    m->data = t->data;
    m->type = t->type;
    m->n_in = n_in;
    m->n_out = n_out;
    return NSTF_OK;
}

/* Norm vectors may be stored as F32/F16/BF16: convert into the fp32 block. */
static nstf_status get_norm(const nstf_gguf *g, const char *name, int64_t dim, float *dst) {
    const nstf_gguf_tensor *t;
    NSTF_TRY(get_tensor(g, name, dim, 0, false, &t));
    if (t->type != NSTF_TYPE_F32 && t->type != NSTF_TYPE_F16 && t->type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: norm tensor '%s' has type %s (need F32/F16/BF16)",
                              g->path, name, nstf_type_name(t->type));
    nstf_dequantize_row(t->type, t->data, dst, dim);
    return NSTF_OK;
}

nstf_status nstf_llama_load(nstf_gguf *g, nstf_llama **out) {
    *out = NULL;
    nstf_llama *m = nstf_calloc(1, sizeof *m, "model");
    if (!m) return NSTF_ERR_OOM;
    nstf_status s = load_config(g, &m->cfg);
    nstf_llama_config *c = &m->cfg;
    const nstf_gguf_tensor *embd = NULL;
    if (s == NSTF_OK) {
        embd = nstf_gguf_find_tensor(g, "token_embd.weight");
        if (!embd || embd->n_dims != 2 || embd->ne[0] != c->dim)
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing or not [%d, n_vocab]",
                               g->path, c->dim);
    }
    if (s == NSTF_OK) {
        if (embd->ne[1] < 1 || embd->ne[1] > (1 << 24))
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: vocabulary size %lld is implausible", g->path,
                               (long long)embd->ne[1]);
        c->n_vocab = (int)embd->ne[1];
    }
    if (s == NSTF_OK) {
        m->w.layers = nstf_calloc((size_t)c->n_layers, sizeof *m->w.layers, "layer table");
        /* size table of the fp32 norm block: 2 per layer + the output norm */
        m->w.norms = nstf_calloc((size_t)(2 * c->n_layers + 1) * (size_t)c->dim, sizeof(float), "norm weights");
        if (!m->w.layers || !m->w.norms) s = NSTF_ERR_OOM;
    }
    if (s == NSTF_OK) s = get_matrix(g, "token_embd.weight", c->dim, c->n_vocab, &m->w.tok_embd);
    const int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    for (int l = 0; s == NSTF_OK && l < c->n_layers; l++) {
        nstf_llama_layer *L = &m->w.layers[l];
        float *norm = m->w.norms + (size_t)2 * l * c->dim;
        char nm[96];
#define NAME(x) (snprintf(nm, sizeof nm, "blk.%d." x ".weight", l), nm)
        if (s == NSTF_OK) s = get_norm(g, NAME("attn_norm"), c->dim, norm);
        if (s == NSTF_OK) s = get_norm(g, NAME("ffn_norm"), c->dim, norm + c->dim);
        if (s == NSTF_OK) s = get_matrix(g, NAME("attn_q"), c->dim, q_dim, &L->wq);
        if (s == NSTF_OK) s = get_matrix(g, NAME("attn_k"), c->dim, kv_dim, &L->wk);
        if (s == NSTF_OK) s = get_matrix(g, NAME("attn_v"), c->dim, kv_dim, &L->wv);
        if (s == NSTF_OK) s = get_matrix(g, NAME("attn_output"), q_dim, c->dim, &L->wo);
        if (s == NSTF_OK) s = get_matrix(g, NAME("ffn_gate"), c->dim, c->ffn_dim, &L->w_gate);
        if (s == NSTF_OK) s = get_matrix(g, NAME("ffn_up"), c->dim, c->ffn_dim, &L->w_up);
        if (s == NSTF_OK) s = get_matrix(g, NAME("ffn_down"), c->ffn_dim, c->dim, &L->w_down);
#undef NAME
        L->attn_norm = norm;
        L->ffn_norm = norm + c->dim;
    }
    if (s == NSTF_OK) {
        float *on = m->w.norms + (size_t)2 * c->n_layers * c->dim;
        s = get_norm(g, "output_norm.weight", c->dim, on);
        m->w.out_norm = on;
    }
    if (s == NSTF_OK) {
        const nstf_gguf_tensor *t;
        s = get_tensor(g, "output.weight", c->dim, c->n_vocab, true, &t);
        c->tied_output = (s == NSTF_OK && !t);
        if (s == NSTF_OK)
            s = c->tied_output ? (m->w.output = m->w.tok_embd, NSTF_OK)
                               : get_matrix(g, "output.weight", c->dim, c->n_vocab, &m->w.output);
    }
    if (s != NSTF_OK) {
        nstf_llama_free(m);
        return s;
    }
    m->file = g;
    *out = m;
    return NSTF_OK;
}

void nstf_llama_free(nstf_llama *m) {
    if (!m) return;
    nstf_free(m->w.layers);
    nstf_free(m->w.norms);
    nstf_gguf_close(m->file);
    nstf_free(m);
}

/* ---- run state -------------------------------------------------------------- */

nstf_status nstf_llama_state_init(nstf_llama_state *s, const nstf_llama_config *c, int n_ctx,
                                  int n_batch) {
    memset(s, 0, sizeof *s);
    if (n_ctx < 1 || n_batch < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "context (%d) and batch (%d) must be positive", n_ctx, n_batch);
    if (n_batch > n_ctx) n_batch = n_ctx;
    const uint64_t B = (uint64_t)n_batch, q_dim = (uint64_t)c->n_heads * c->head_dim,
                   kv_dim = (uint64_t)c->n_kv_heads * c->head_dim;
    /* size table: element counts of every buffer, carved in this order */
    uint64_t sizes[10] = {0};
    bool ok = nstf_mul_ok(B, (uint64_t)c->dim, &sizes[0]) && nstf_mul_ok(B, q_dim, &sizes[3]) &&
              nstf_mul_ok(B, (uint64_t)c->ffn_dim, &sizes[5]) && nstf_mul_ok(B, (uint64_t)c->n_vocab, &sizes[7]) &&
              nstf_mul_ok((uint64_t)c->n_layers * (uint64_t)n_ctx, kv_dim, &sizes[8]);
    sizes[1] = sizes[2] = sizes[0]; /* x, xb, xb2 */
    sizes[4] = sizes[3];            /* q, att */
    sizes[6] = sizes[5];            /* hb, hb2 */
    sizes[9] = sizes[8];            /* k_cache, v_cache */
    uint64_t total = B; /* pos (int32, same size as float) */
    for (int i = 0; ok && i < 10; i++) {
        uint64_t rounded = (sizes[i] + 15) & ~(uint64_t)15; /* keep every buffer 64-byte aligned */
        ok = nstf_add_ok(total, rounded, &total);
    }
    uint64_t bytes;
    if (!ok || !nstf_mul_ok(total, 4, &bytes) || bytes > SIZE_MAX)
        return nstf_set_error(NSTF_ERR_OOM, "run state for context %d and batch %d overflows", n_ctx, n_batch);
    uint64_t avail = nstf_host_mem_available();
    if (avail && bytes > avail)
        return nstf_set_error(NSTF_ERR_OOM,
                              "activations and KV cache for context %d need %.1f MiB but only %.1f MiB of host "
                              "memory is available; try a smaller -c",
                              n_ctx, (double)bytes / (1 << 20), (double)avail / (1 << 20));
    s->block = nstf_alloc((size_t)bytes, "activations and KV cache");
    if (!s->block) {
        return nstf_set_error(NSTF_ERR_OOM,
                              "out of host memory: activations and KV cache for context %d need %.1f MiB; "
                              "try a smaller -c", n_ctx, (double)bytes / (1 << 20));
    }
    s->block_bytes = bytes;
    float *p = s->block;
    float **dst[10] = {&s->x, &s->xb, &s->xb2, &s->q, &s->att, &s->hb, &s->hb2, &s->logits, &s->k_cache, &s->v_cache};
    for (int i = 0; i < 10; i++) {
        *dst[i] = p;
        p += (sizes[i] + 15) & ~(uint64_t)15;
    }
    s->pos = (int32_t *)p;
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    return NSTF_OK;
}

void nstf_llama_state_free(nstf_llama_state *s) {
    if (!s) return;
    nstf_free(s->block);
    memset(s, 0, sizeof *s);
}

/* ---- forward ------------------------------------------------------------------ */

/* Each op call goes through OP: with no profiler attached (cpu->prof NULL)
 * it is the bare call behind one predictable branch. */
#define OP(label, layer, cost, call) NSTF_PROF_OP(cpu->prof, label, layer, cost, call)

static void matmul_op(nstf_cpu *cpu, const nstf_matrix *w, const float *x, float *y, int n) {
    if (cpu->precise)
        nstf_cpu_matmul_precise(cpu, w->type, w->data, x, y, n, w->n_in, w->n_out);
    else
        nstf_cpu_matmul(cpu, w->type, w->data, x, y, n, w->n_in, w->n_out);
}

#define matmul(cpu, label, layer, w, x, y, n)                                                        \
    OP(label, layer, nstf_cost_matmul((w)->type, n, (w)->n_in, (w)->n_out, !(cpu)->precise), \
       matmul_op(cpu, w, x, y, n))

nstf_status nstf_llama_forward(const nstf_llama *m, nstf_llama_state *s, nstf_cpu *cpu,
                               const int32_t *tokens, int n, int pos0, bool all_logits) {
    const nstf_llama_config *c = &m->cfg;
    const nstf_llama_weights *w = &m->w;
    if (n < 1 || n > s->n_batch)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward of %d tokens (batch holds 1..%d)", n, s->n_batch);
    if (pos0 < 0 || pos0 + n > s->n_ctx)
        return nstf_set_error(NSTF_ERR_RANGE, "positions %d..%d exceed the context of %d tokens", pos0,
                              pos0 + n - 1, s->n_ctx);
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", tokens[t],
                                  c->n_vocab - 1);
        s->pos[t] = pos0 + t;
    }
    const int dim = c->dim, hd = c->head_dim;
    const int64_t kv_dim = (int64_t)c->n_kv_heads * hd, nd = (int64_t)n * dim;
    const float scale = 1.0f / sqrtf((float)hd);

    OP("get_rows", -1, nstf_cost_get_rows(w->tok_embd.type, n, dim),
       nstf_cpu_get_rows(cpu, w->tok_embd.type, w->tok_embd.data, tokens, s->x, n, dim));
    for (int l = 0; l < c->n_layers; l++) {
        const nstf_llama_layer *L = &w->layers[l];
        /* this layer's cache; the chunk's K and V rows are written in place */
        float *kc = s->k_cache + (int64_t)l * s->n_ctx * kv_dim;
        float *vc = s->v_cache + (int64_t)l * s->n_ctx * kv_dim;
        float *k_new = kc + (int64_t)pos0 * kv_dim, *v_new = vc + (int64_t)pos0 * kv_dim;

        /* attention block */
        OP("rmsnorm", l, nstf_cost_rmsnorm(n, dim), nstf_cpu_rmsnorm(cpu, s->x, L->attn_norm, s->xb, n, dim, c->norm_eps));
        matmul(cpu, "matmul.attn_q", l, &L->wq, s->xb, s->q, n);
        matmul(cpu, "matmul.attn_k", l, &L->wk, s->xb, k_new, n);
        matmul(cpu, "matmul.attn_v", l, &L->wv, s->xb, v_new, n);
        OP("rope", l, nstf_cost_rope(n, c->n_heads, hd),
           nstf_cpu_rope(cpu, s->q, s->pos, n, c->n_heads, hd, c->rope_base, c->rope_mode));
        OP("rope", l, nstf_cost_rope(n, c->n_kv_heads, hd),
           nstf_cpu_rope(cpu, k_new, s->pos, n, c->n_kv_heads, hd, c->rope_base, c->rope_mode));
        OP("attention", l, nstf_cost_attention(n, pos0, c->n_heads, c->n_kv_heads, hd),
           nstf_cpu_attention(cpu, s->q, kc, vc, s->att, n, pos0, c->n_heads, c->n_kv_heads, hd, scale));
        matmul(cpu, "matmul.attn_output", l, &L->wo, s->att, s->xb2, n);
        OP("add", l, nstf_cost_add(nd), nstf_cpu_add(cpu, s->x, s->xb2, s->x, nd));

        /* feed-forward block */
        OP("rmsnorm", l, nstf_cost_rmsnorm(n, dim), nstf_cpu_rmsnorm(cpu, s->x, L->ffn_norm, s->xb, n, dim, c->norm_eps));
        matmul(cpu, "matmul.ffn_gate", l, &L->w_gate, s->xb, s->hb, n);
        matmul(cpu, "matmul.ffn_up", l, &L->w_up, s->xb, s->hb2, n);
        OP("swiglu", l, nstf_cost_swiglu((int64_t)n * c->ffn_dim),
           nstf_cpu_swiglu(cpu, s->hb, s->hb2, s->hb, (int64_t)n * c->ffn_dim));
        matmul(cpu, "matmul.ffn_down", l, &L->w_down, s->hb, s->xb2, n);
        OP("add", l, nstf_cost_add(nd), nstf_cpu_add(cpu, s->x, s->xb2, s->x, nd));
    }
    /* final norm and logits: of every token, or of the last one only */
    const float *last = all_logits ? s->x : s->x + (int64_t)(n - 1) * dim;
    int n_out = all_logits ? n : 1;
    OP("rmsnorm", -1, nstf_cost_rmsnorm(n_out, dim), nstf_cpu_rmsnorm(cpu, last, w->out_norm, s->xb, n_out, dim, c->norm_eps));
    matmul(cpu, "matmul.output", -1, &w->output, s->xb, s->logits, n_out);
    return NSTF_OK;
}
