/* llama.c — Llama-family config and weights: read and checked from a GGUF,
 * for every architecture of the table (model/arch.h): its row says which
 * tensors beyond the Llama block a file must or may have. */
#include "model/llama.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"

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

/* Linear RoPE scaling ({arch}.rope.scaling.type "linear" and its factor,
 * or the older {arch}.rope.scale_linear): positions divided by the factor. */
static nstf_status rope_scaling(const nstf_gguf *g, const char *arch, nstf_llama_config *c) {
    char key[128];
    c->rope_linear = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (kv) {
        nstf_gguf_str t;
        NSTF_TRY(nstf_gguf_get_str(g, key, &t));
        if (nstf_gguf_str_eq(t, "none")) return NSTF_OK;
        if (!nstf_gguf_str_eq(t, "linear"))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "%s: RoPE scaling type '%.*s' is not supported (none and linear are; Llama 3.x "
                                  "frequency factors come as rope_freqs.weight)",
                                  g->path, (int)(t.len < 32 ? t.len : 32), t.ptr);
        NSTF_TRY(read_f32(g, arch, "rope.scaling.factor", &c->rope_linear, 1.0f));
    } else {
        NSTF_TRY(read_f32(g, arch, "rope.scale_linear", &c->rope_linear, 1.0f));
    }
    if (!(c->rope_linear > 0) || !(c->rope_linear < 1e6f))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: RoPE scaling factor %g", g->path, (double)c->rope_linear);
    return NSTF_OK;
}

static nstf_status load_config(const nstf_gguf *g, nstf_llama_config *c) {
    nstf_gguf_str arch_s;
    NSTF_TRY(nstf_gguf_get_str(g, "general.architecture", &arch_s));
    char arch[64];
    if (arch_s.len == 0 || arch_s.len >= sizeof arch || memchr(arch_s.ptr, 0, (size_t)arch_s.len))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: general.architecture is empty or too long", g->path);
    memcpy(arch, arch_s.ptr, arch_s.len);
    arch[arch_s.len] = 0;
    c->arch = nstf_arch_by_gguf(arch);
    if (!c->arch) {
        char names[256];
        nstf_arch_names(false, names, sizeof names);
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)", g->path,
                              arch, names);
    }
    uint32_t n_layers, dim, n_heads, n_kv, ffn, ctx, head_dim, v_dim, rope_dim, window;
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
    NSTF_TRY(read_u32(g, arch, "attention.value_length", &v_dim, false, head_dim));
    NSTF_TRY(read_u32(g, arch, "rope.dimension_count", &rope_dim, false, head_dim));
    if (head_dim < 2 || head_dim % 2 != 0 || head_dim > 512 || v_dim != head_dim)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: head size %u (values %u) with %u heads and width %u is not supported", g->path,
                              head_dim, v_dim, n_heads, dim);
    if (rope_dim != head_dim)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: partial rotary embedding (%u of %u dims) is not supported", g->path,
                              rope_dim, head_dim);
    NSTF_TRY(read_u32(g, arch, "attention.sliding_window", &window, false, 0));
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    if (window && nstf_gguf_find_kv(g, key))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: a sliding window on some layers only (%s) is not supported", g->path, key);
    if (window > INT32_MAX) return nstf_set_error(NSTF_ERR_FORMAT, "%s: sliding window %u", g->path, window);
    c->n_layers = (int)n_layers;
    c->dim = (int)dim;
    c->n_heads = (int)n_heads;
    c->n_kv_heads = (int)n_kv;
    c->head_dim = (int)head_dim;
    c->ffn_dim = (int)ffn;
    c->n_ctx_train = (int)ctx;
    c->sliding_window = (int)window;
    NSTF_TRY(read_f32(g, arch, "rope.freq_base", &c->rope_base, 10000.0f));
    NSTF_TRY(read_f32(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps, 1e-5f));
    if (!(c->rope_base > 0) || !(c->norm_eps > 0) || !(c->norm_eps < 1))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: bad rope base %g or norm epsilon %g", g->path,
                              (double)c->rope_base, (double)c->norm_eps);
    NSTF_TRY(rope_scaling(g, arch, c));
    /* the architecture's GGUF layout; HF folder views keep HF's rotate-half rows (io/hf_model.h) */
    c->rope_mode = nstf_gguf_get_bool_or(g, "nstf.rope.neox", false) ? NSTF_ROPE_NEOX : c->arch->gguf_rope;
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
    m->factors = NULL;
    return NSTF_OK;
}

/* A layer matrix NAME.weight, or its low-rank form (docs/OPTIMIZE.md):
 * NAME.lr_a.weight [rank, n_in] and NAME.lr_b.weight [n_out, rank] in
 * place of it, 1 <= rank <= min(n_in, n_out) (the forward's scratch rule),
 * each of a type the matmul takes; fac receives the pair. */
static nstf_status get_layer_matrix(const nstf_gguf *g, const char *name, int64_t n_in, int64_t n_out,
                                    nstf_matrix *m, nstf_matrix *fac) {
    char an[128], bn[128];
    const size_t len = strlen(name), base = len > 7 ? len - 7 : 0; /* without ".weight" */
    snprintf(an, sizeof an, "%.*s.lr_a.weight", (int)base, name);
    snprintf(bn, sizeof bn, "%.*s.lr_b.weight", (int)base, name);
    const nstf_gguf_tensor *ta = nstf_gguf_find_tensor(g, an), *tb = nstf_gguf_find_tensor(g, bn);
    if (!ta && !tb) return get_matrix(g, name, n_in, n_out, m);
    if (nstf_gguf_find_tensor(g, name))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: '%s' is there both whole and as low-rank factors", g->path, name);
    if (!ta || !tb || ta->n_dims != 2 || tb->n_dims != 2)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: low-rank '%s' needs both %s and %s as matrices", g->path, name, an,
                              bn);
    const int64_t rank = ta->ne[1], lim = n_in < n_out ? n_in : n_out;
    if (rank < 1 || rank > lim)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: '%s' has rank %lld (must be 1..%lld)", g->path, an,
                              (long long)rank, (long long)lim);
    NSTF_TRY(get_matrix(g, an, n_in, rank, &fac[0]));
    NSTF_TRY(get_matrix(g, bn, rank, n_out, &fac[1]));
    *m = (nstf_matrix){NULL, fac[0].type, n_in, n_out, fac};
    return NSTF_OK;
}

/* fp32 vectors (norms, biases, factors) may be stored as F32/F16/BF16:
 * converted into the fp32 block. */
static nstf_status get_vec(const nstf_gguf *g, const char *name, int64_t dim, float *dst) {
    const nstf_gguf_tensor *t;
    NSTF_TRY(get_tensor(g, name, dim, 0, false, &t));
    if (t->type != NSTF_TYPE_F32 && t->type != NSTF_TYPE_F16 && t->type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (need F32/F16/BF16)",
                              g->path, name, nstf_type_name(t->type));
    nstf_dequantize_row(t->type, t->data, dst, dim);
    return NSTF_OK;
}

/* What the layers have besides the Llama block, decided on layer 0 from
 * the architecture's row and the file: every layer must then have it. */
typedef struct {
    bool bias, qk_norm;
} layer_extras;

static nstf_status find_extras(const nstf_gguf *g, const nstf_arch *a, layer_extras *x) {
    const bool bias = nstf_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL,
               norm = nstf_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    static const char *const unsupported[] = {"blk.0.attn_output.bias", "blk.0.ffn_gate.bias", "blk.0.ffn_up.bias",
                                              "blk.0.ffn_down.bias", "blk.0.attn_qkv.weight", "blk.0.ffn_gate_inp.weight"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (nstf_gguf_find_tensor(g, unsupported[i]))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: tensor '%s' (%s) is not supported", g->path,
                                  unsupported[i], a->name);
    if ((bias && a->qkv_bias == NSTF_ARCH_NO) || (norm && a->qk_norm == NSTF_ARCH_NO))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: tensor '%s' is not part of a %s model", g->path,
                              bias ? "blk.0.attn_q.bias" : "blk.0.attn_q_norm.weight", a->gguf);
    if (!bias && a->qkv_bias == NSTF_ARCH_REQUIRED)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor 'blk.0.attn_q.bias' is missing (%s has QKV biases)",
                              g->path, a->gguf);
    if (!norm && a->qk_norm == NSTF_ARCH_REQUIRED)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor 'blk.0.attn_q_norm.weight' is missing (%s normalises q and k)",
                              g->path, a->gguf);
    x->bias = bias;
    x->qk_norm = norm;
    return NSTF_OK;
}

nstf_status nstf_llama_load(nstf_gguf *g, nstf_llama **out) {
    *out = NULL;
    nstf_llama *m = nstf_calloc(1, sizeof *m, "model");
    if (!m) return NSTF_ERR_OOM;
    nstf_status s = load_config(g, &m->cfg);
    nstf_llama_config *c = &m->cfg;
    const nstf_gguf_tensor *embd = NULL;
    layer_extras ex = {false, false};
    if (s == NSTF_OK) s = find_extras(g, c->arch, &ex);
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
    const int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim,
                  half = c->head_dim / 2;
    const nstf_gguf_tensor *rf = s == NSTF_OK ? nstf_gguf_find_tensor(g, "rope_freqs.weight") : NULL;
    const bool factors = rf || c->rope_linear != 1.0f;
    /* size table of the fp32 block: per layer the two norms (+ biases, +
     * q/k norms), the output norm, the RoPE factors */
    const uint64_t per_layer = 2 * (uint64_t)c->dim + (ex.bias ? (uint64_t)(q_dim + 2 * kv_dim) : 0) +
                               (ex.qk_norm ? 2 * (uint64_t)c->head_dim : 0);
    if (s == NSTF_OK) {
        m->w.norm_floats = per_layer * (uint64_t)c->n_layers + (uint64_t)c->dim + (factors ? (uint64_t)half : 0);
        m->w.layers = nstf_calloc((size_t)c->n_layers, sizeof *m->w.layers, "layer table");
        m->w.norms = nstf_calloc((size_t)m->w.norm_floats, sizeof(float), "norm weights");
        m->w.factors = nstf_calloc((size_t)c->n_layers * 14, sizeof *m->w.factors, "low-rank factor table");
        if (!m->w.layers || !m->w.norms || !m->w.factors) s = NSTF_ERR_OOM;
    }
    if (s == NSTF_OK) s = get_matrix(g, "token_embd.weight", c->dim, c->n_vocab, &m->w.tok_embd);
    for (int l = 0; s == NSTF_OK && l < c->n_layers; l++) {
        nstf_llama_layer *L = &m->w.layers[l];
        float *v = m->w.norms + (size_t)per_layer * (size_t)l; /* this layer's vectors */
        nstf_matrix *fac = m->w.factors + (size_t)14 * l; /* room for a pair per matrix */
        char nm[96];
#define NAME(x) (snprintf(nm, sizeof nm, "blk.%d." x, l), nm)
#define VEC(field, x, len)                                    \
    do {                                                      \
        if (s == NSTF_OK) s = get_vec(g, NAME(x), (len), v); \
        L->field = v;                                         \
        v += (len);                                           \
    } while (0)
        VEC(attn_norm, "attn_norm.weight", c->dim);
        VEC(ffn_norm, "ffn_norm.weight", c->dim);
        if (ex.bias) {
            VEC(bq, "attn_q.bias", q_dim);
            VEC(bk, "attn_k.bias", kv_dim);
            VEC(bv, "attn_v.bias", kv_dim);
        }
        if (ex.qk_norm) {
            VEC(q_norm, "attn_q_norm.weight", c->head_dim);
            VEC(k_norm, "attn_k_norm.weight", c->head_dim);
        }
#undef VEC
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("attn_q.weight"), c->dim, q_dim, &L->wq, fac + 0);
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("attn_k.weight"), c->dim, kv_dim, &L->wk, fac + 2);
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("attn_v.weight"), c->dim, kv_dim, &L->wv, fac + 4);
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("attn_output.weight"), q_dim, c->dim, &L->wo, fac + 6);
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("ffn_gate.weight"), c->dim, c->ffn_dim, &L->w_gate, fac + 8);
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("ffn_up.weight"), c->dim, c->ffn_dim, &L->w_up, fac + 10);
        if (s == NSTF_OK) s = get_layer_matrix(g, NAME("ffn_down.weight"), c->ffn_dim, c->dim, &L->w_down, fac + 12);
#undef NAME
    }
    float *tail = m->w.norms + (size_t)per_layer * (size_t)c->n_layers;
    if (s == NSTF_OK) {
        s = get_vec(g, "output_norm.weight", c->dim, tail);
        m->w.out_norm = tail;
    }
    if (s == NSTF_OK && factors) {
        /* theta_i = pos * freq_i / rope_freqs[i] (llama.cpp's freq_factors),
         * and positions / the linear factor */
        float *f = tail + c->dim;
        if (rf) s = get_vec(g, "rope_freqs.weight", half, f);
        else
            for (int64_t i = 0; i < half; i++) f[i] = 1.0f;
        for (int64_t i = 0; s == NSTF_OK && i < half; i++) {
            f[i] *= c->rope_linear;
            if (!(f[i] > 0) || !isfinite(f[i]))
                s = nstf_set_error(NSTF_ERR_FORMAT, "%s: RoPE frequency factor %lld is %g", g->path, (long long)i,
                                   (double)f[i]);
        }
        m->w.rope_factors = f;
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
    nstf_free(m->w.factors);
    nstf_gguf_close(m->file);
    nstf_free(m);
}
