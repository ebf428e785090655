/* hf_model.c — an HF model folder of an architecture of the table
 * (model/arch.h: Llama, Mistral, Qwen2, Qwen3) as a GGUF view (see
 * hf_model.h), and nstf_model_file_open, which opens a GGUF file or such a
 * folder.
 *
 * Owns: config.json -> general.* / <arch>.* key/values (the keys and
 * defaults of llama.cpp's converter and of transformers' configs), the HF
 * -> GGUF tensor name map, the view's tensor table over the safetensors
 * mappings, and the rope_freqs.weight factors of rope_scaling "llama3". */
#include "io/hf_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mem.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/arch.h"

typedef unsigned long long ull;

#define MAX_CONFIG_JSON (16ull << 20)
#define GGUF_NAME_MAX 64

char *nstf_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir), m = strlen(name);
    bool slash = n && dir[n - 1] == '/';
    char *p = malloc(n + m + 2);
    if (!p) {
        nstf_set_error(NSTF_ERR_OOM, "out of host memory");
        return NULL;
    }
    memcpy(p, dir, n);
    if (!slash) p[n++] = '/';
    memcpy(p + n, name, m + 1);
    return p;
}

/* ---- config.json ------------------------------------------------------------- */

typedef struct {
    const char *path; /* config.json */
    const nstf_arch *arch;
    int64_t n_layers, dim, n_heads, n_kv_heads, ffn, n_ctx, n_vocab, head_dim;
    int64_t window;    /* sliding window (Mistral), 0: none */
    bool head_dim_given, tied;
    bool bias, qk_norm; /* QKV biases (Qwen2), per-head q/k norms (Qwen3) */
    double rope_theta, norm_eps;
    const cJSON *rope_scaling; /* NULL when absent or null */
} hf_config;

/* "<arch>.<suffix>": the key of the view's architecture */
static const char *akey(const hf_config *c, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", c->arch->gguf, suffix);
    return buf;
}

/* An integer member: absent -> dflt (or an error if dflt < 0). */
static nstf_status cfg_int(const cJSON *cfg, const char *path, const char *key, int64_t dflt, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    uint64_t x;
    if ((!v || cJSON_IsNull(v)) && dflt >= 0) {
        *out = dflt;
        return NSTF_OK;
    }
    if (!nstf_json_uint(v, &x) || x == 0 || x > INT32_MAX)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: \"%s\" is %s", path, key,
                              v ? "not a positive 32-bit integer" : "missing");
    *out = (int64_t)x;
    return NSTF_OK;
}

static nstf_status cfg_num(const cJSON *cfg, const char *path, const char *key, double dflt, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return NSTF_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: \"%s\" is not a positive number", path, key);
    *out = v->valuedouble;
    return NSTF_OK;
}

static nstf_status read_config(const cJSON *cfg, hf_config *c) {
    const char *p = c->path;
    if (!cJSON_IsObject(cfg)) return nstf_set_error(NSTF_ERR_FORMAT, "%s: not a JSON object", p);
    const char *mt = nstf_json_str(cfg, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const char *arch = cJSON_IsArray(archs) && cJSON_IsString(archs->child) ? archs->child->valuestring : NULL;
    c->arch = nstf_arch_by_hf(mt);
    if (!c->arch || (arch && strcmp(arch, c->arch->hf_class) != 0)) {
        char names[128];
        nstf_arch_names(true, names, sizeof names);
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: model_type \"%.40s\" (%.60s) is not supported (supported: %s, each as its "
                              "...ForCausalLM)",
                              p, mt ? mt : "missing", arch ? arch : "no architectures", names);
    }
    NSTF_TRY(cfg_int(cfg, p, "num_hidden_layers", -1, &c->n_layers));
    NSTF_TRY(cfg_int(cfg, p, "hidden_size", -1, &c->dim));
    NSTF_TRY(cfg_int(cfg, p, "num_attention_heads", -1, &c->n_heads));
    NSTF_TRY(cfg_int(cfg, p, "num_key_value_heads", c->n_heads, &c->n_kv_heads));
    NSTF_TRY(cfg_int(cfg, p, "intermediate_size", -1, &c->ffn));
    NSTF_TRY(cfg_int(cfg, p, "max_position_embeddings", 2048, &c->n_ctx));
    NSTF_TRY(cfg_int(cfg, p, "vocab_size", 32000, &c->n_vocab));
    c->head_dim_given = cJSON_GetObjectItemCaseSensitive(cfg, "head_dim") &&
                        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, "head_dim"));
    NSTF_TRY(cfg_int(cfg, p, "head_dim", c->dim / c->n_heads, &c->head_dim));
    if (c->head_dim < 2) return nstf_set_error(NSTF_ERR_FORMAT, "%s: head size %lld is too small", p, (long long)c->head_dim);
    /* transformers 5 writes rope_parameters {rope_theta, rope_type, ...};
     * earlier versions rope_theta and rope_scaling */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: \"rope_parameters\" is not an object", p);
    NSTF_TRY(cfg_num(cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") ? rp : cfg, p,
                     "rope_theta", 10000.0, &c->rope_theta));
    NSTF_TRY(cfg_num(cfg, p, "rms_norm_eps", 1e-6, &c->norm_eps));
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings");
    c->tied = cJSON_IsTrue(tie);
    /* Qwen2 always has Q/K/V biases (and none on O); attention_bias of the
     * others puts one on O as well, which no architecture here has */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "attention_bias")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "mlp_bias")))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: attention_bias / mlp_bias is not supported", p);
    c->bias = c->arch->qkv_bias == NSTF_ARCH_REQUIRED;
    c->qk_norm = c->arch->qk_norm == NSTF_ARCH_REQUIRED;
    c->window = 0;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "use_sliding_window")))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: use_sliding_window (a window on the layers past max_window_layers) is not supported",
                              p);
    if (c->arch->window) NSTF_TRY(cfg_int(cfg, p, "sliding_window", 0, &c->window));
    const char *act = nstf_json_str(cfg, "hidden_act");
    if (act && strcmp(act, "silu") != 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: hidden_act \"%.32s\" is not supported (silu is)", p, act);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    c->rope_scaling = rs && !cJSON_IsNull(rs) ? rs : cJSON_IsObject(rp) ? rp : NULL;
    return NSTF_OK;
}

/* rope_scaling: "linear" -> <arch>.rope.scaling.*; "llama3" -> the
 * frequency factors llama.cpp's converter stores as rope_freqs.weight
 * (*freqs, head_dim / 2 floats, malloc'd); anything else unsupported. */
static nstf_status rope_scaling(const hf_config *c, nstf_gguf_writer *w, float **freqs) {
    char key[96];
    *freqs = NULL;
    const cJSON *rs = c->rope_scaling;
    if (!rs) return NSTF_OK;
    const char *type = nstf_json_str(rs, "rope_type");
    if (!type) type = nstf_json_str(rs, "type");
    double factor;
    if (!cJSON_IsObject(rs) || !type) return nstf_set_error(NSTF_ERR_FORMAT, "%s: rope_scaling has no type", c->path);
    if (strcmp(type, "default") == 0) return NSTF_OK;
    if (strcmp(type, "linear") == 0) {
        NSTF_TRY(cfg_num(rs, c->path, "factor", 1.0, &factor));
        NSTF_TRY(nstf_gguf_writer_set_str(w, akey(c, "rope.scaling.type", key, sizeof key), "linear"));
        return nstf_gguf_writer_set_f32(w, akey(c, "rope.scaling.factor", key, sizeof key), (float)factor);
    }
    if (strcmp(type, "llama3") != 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: rope_scaling type \"%.32s\" is not supported (linear and llama3 are)", c->path, type);
    double lo, hi, old_ctx;
    NSTF_TRY(cfg_num(rs, c->path, "factor", 8.0, &factor));
    NSTF_TRY(cfg_num(rs, c->path, "low_freq_factor", 1.0, &lo));
    NSTF_TRY(cfg_num(rs, c->path, "high_freq_factor", 4.0, &hi));
    NSTF_TRY(cfg_num(rs, c->path, "original_max_position_embeddings", 8192.0, &old_ctx));
    if (!(hi > lo)) return nstf_set_error(NSTF_ERR_FORMAT, "%s: rope_scaling high_freq_factor <= low_freq_factor", c->path);
    int64_t half = c->head_dim / 2;
    float *f = nstf_alloc((size_t)half * sizeof *f, "rope frequency factors");
    if (!f) return NSTF_ERR_OOM;
    /* llama.cpp's LlamaModel.generate_extra_tensors, with its torch float32
     * roundings (a Python number over a tensor is a reciprocal, then a
     * product; scalars are rounded to float32 first), so that the factors
     * are its bytes */
    const float lo_wavelen = (float)(old_ctx / lo), hi_wavelen = (float)(old_ctx / hi);
    for (int64_t i = 0; i < half; i++) {
        const float freq = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        const float wavelen = (1.0f / freq) * (float)(2 * 3.14159265358979323846);
        if (wavelen < hi_wavelen) f[i] = 1.0f;
        else if (wavelen > lo_wavelen) f[i] = (float)factor;
        else {
            const float smooth = ((1.0f / wavelen) * (float)old_ctx - (float)lo) / (float)(hi - lo);
            f[i] = 1.0f / ((1.0f - smooth) / (float)factor + smooth);
        }
    }
    *freqs = f;
    return NSTF_OK;
}

static nstf_status config_kvs(const char *dir, const hf_config *c, nstf_gguf_writer *w) {
    /* the folder's name, as general.name */
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(n - b), dir + b);
    char k[96];
    NSTF_TRY(nstf_gguf_writer_set_str(w, "general.architecture", c->arch->gguf));
    NSTF_TRY(nstf_gguf_writer_set_str(w, "general.type", "model"));
    NSTF_TRY(nstf_gguf_writer_set_str(w, "general.name", name));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, "general.quantization_version", 2)); /* llama.cpp writes it always */
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "block_count", k, sizeof k), (uint32_t)c->n_layers));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "context_length", k, sizeof k), (uint32_t)c->n_ctx));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "embedding_length", k, sizeof k), (uint32_t)c->dim));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "feed_forward_length", k, sizeof k), (uint32_t)c->ffn));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "attention.head_count", k, sizeof k), (uint32_t)c->n_heads));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "attention.head_count_kv", k, sizeof k), (uint32_t)c->n_kv_heads));
    NSTF_TRY(nstf_gguf_writer_set_f32(w, akey(c, "rope.freq_base", k, sizeof k), (float)c->rope_theta));
    NSTF_TRY(nstf_gguf_writer_set_f32(w, akey(c, "attention.layer_norm_rms_epsilon", k, sizeof k), (float)c->norm_eps));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "vocab_size", k, sizeof k), (uint32_t)c->n_vocab));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "rope.dimension_count", k, sizeof k), (uint32_t)c->head_dim));
    if (c->head_dim_given) {
        NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "attention.key_length", k, sizeof k), (uint32_t)c->head_dim));
        NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "attention.value_length", k, sizeof k), (uint32_t)c->head_dim));
    }
    if (c->window)
        NSTF_TRY(nstf_gguf_writer_set_u32(w, akey(c, "attention.sliding_window", k, sizeof k), (uint32_t)c->window));
    return NSTF_OK;
}

/* ---- tensors ----------------------------------------------------------------------- */

enum { LN_ALL, LN_BIAS, LN_QK_NORM };
static const struct {
    const char *hf, *gguf;
    int when; /* LN_ALL, or only with biases / q-k norms */
} k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", LN_ALL},
    {"self_attn.q_proj.weight", "attn_q.weight", LN_ALL},
    {"self_attn.k_proj.weight", "attn_k.weight", LN_ALL},
    {"self_attn.v_proj.weight", "attn_v.weight", LN_ALL},
    {"self_attn.q_proj.bias", "attn_q.bias", LN_BIAS},
    {"self_attn.k_proj.bias", "attn_k.bias", LN_BIAS},
    {"self_attn.v_proj.bias", "attn_v.bias", LN_BIAS},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", LN_QK_NORM},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", LN_QK_NORM},
    {"self_attn.o_proj.weight", "attn_output.weight", LN_ALL},
    {"post_attention_layernorm.weight", "ffn_norm.weight", LN_ALL},
    {"mlp.gate_proj.weight", "ffn_gate.weight", LN_ALL},
    {"mlp.up_proj.weight", "ffn_up.weight", LN_ALL},
    {"mlp.down_proj.weight", "ffn_down.weight", LN_ALL},
};
#define N_LAYER_NAMES (sizeof k_layer_names / sizeof k_layer_names[0])

/* Whether layer name i belongs to a model of config c. */
static bool has_layer_name(const hf_config *c, size_t i) {
    const int w = k_layer_names[i].when;
    return w == LN_ALL || (w == LN_BIAS && c->bias) || (w == LN_QK_NORM && c->qk_norm);
}

static uint64_t layer_names_of(const hf_config *c) {
    uint64_t n = 0;
    for (size_t i = 0; i < N_LAYER_NAMES; i++) n += has_layer_name(c, i);
    return n;
}

static const struct { const char *hf, *gguf; } k_global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

/* Whether `hf` names a tensor of the model of config c; *skip: one HF
 * keeps that GGUF does not (rotary_emb.inv_freq, recomputed from the
 * config). */
static bool known_name(const char *hf, const hf_config *c, bool *skip) {
    const int64_t n_layers = c->n_layers;
    *skip = false;
    for (size_t i = 0; i < sizeof k_global_names / sizeof k_global_names[0]; i++)
        if (strcmp(hf, k_global_names[i].hf) == 0) return true;
    static const char prefix[] = "model.layers.";
    if (strncmp(hf, prefix, sizeof prefix - 1) != 0) return false;
    const char *p = hf + sizeof prefix - 1, *q = p;
    int64_t l = 0;
    while (*q >= '0' && *q <= '9' && q - p < 7) l = l * 10 + (*q++ - '0');
    if (q == p || *q != '.' || (q - p > 1 && *p == '0') || l >= n_layers) return false;
    q++;
    if (strcmp(q, "self_attn.rotary_emb.inv_freq") == 0) return *skip = true;
    for (size_t i = 0; i < N_LAYER_NAMES; i++)
        if (has_layer_name(c, i) && strcmp(q, k_layer_names[i].hf) == 0) return true;
    return false;
}

/* What the view owns besides its key/value image. */
typedef struct {
    nstf_safetensors *st;
    char *names;      /* GGUF names, GGUF_NAME_MAX bytes each */
    float *rope_freqs;
} hf_owner;

static void hf_release(void *p) {
    hf_owner *o = p;
    if (!o) return;
    nstf_safetensors_close(o->st);
    nstf_free(o->names);
    nstf_free(o->rope_freqs);
    nstf_free(o);
}

/* One view tensor from the safetensors tensor `hf` (NULL: absent). */
static nstf_status map_one(const char *dir, const nstf_safetensors *st, const char *hf, char *name,
                           nstf_gguf_tensor *g) {
    const nstf_st_tensor *x = nstf_safetensors_find(st, hf);
    if (!x) return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' is missing", dir, hf);
    if (x->n_dims < 1 || x->n_dims > NSTF_GGUF_MAX_DIMS)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' has %u dims (1 to %d expected)", dir, hf, x->n_dims,
                              NSTF_GGUF_MAX_DIMS);
    g->name = (nstf_gguf_str){strlen(name), name};
    g->n_dims = x->n_dims;
    for (uint32_t d = 0; d < NSTF_GGUF_MAX_DIMS; d++) g->ne[d] = d < x->n_dims ? x->shape[x->n_dims - 1 - d] : 1;
    g->type = x->type;
    g->offset = x->begin;
    g->n_elems = x->n_elems;
    g->n_bytes = x->n_bytes;
    g->data = x->data;
    return NSTF_OK;
}

/* The view's tensors in llama.cpp's order (token_embd, blk.0 .. blk.N-1,
 * output_norm, output, rope_freqs), every one a Llama needs present, and
 * no tensor of the folder left unexplained. */
static nstf_status map_tensors(const char *dir, const hf_config *c, hf_owner *o, nstf_gguf_tensor **out,
                               uint64_t *n_out) {
    const nstf_safetensors *st = o->st;
    const bool has_output = nstf_safetensors_find(st, "lm_head.weight") != NULL;
    if (!has_output && !c->tied)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor 'lm_head.weight' is missing (and tie_word_embeddings is not set)",
                              dir);
    uint64_t n = 2 + (uint64_t)c->n_layers * layer_names_of(c) + has_output + (o->rope_freqs ? 1 : 0);
    nstf_gguf_tensor *t = nstf_calloc((size_t)n, sizeof *t, "view tensors");
    o->names = nstf_calloc((size_t)n, GGUF_NAME_MAX, "view tensor names");
    if (!t || !o->names) {
        nstf_free(t);
        return NSTF_ERR_OOM;
    }
    nstf_status s = NSTF_OK;
    uint64_t k = 0;
    char hf[160];
#define NEXT_NAME (o->names + k * GGUF_NAME_MAX)
    snprintf(NEXT_NAME, GGUF_NAME_MAX, "token_embd.weight");
    s = map_one(dir, st, "model.embed_tokens.weight", NEXT_NAME, &t[k]), k++;
    for (int64_t l = 0; l < c->n_layers; l++)
        for (size_t i = 0; i < N_LAYER_NAMES && s == NSTF_OK; i++) {
            if (!has_layer_name(c, i)) continue;
            snprintf(hf, sizeof hf, "model.layers.%lld.%s", (long long)l, k_layer_names[i].hf);
            snprintf(NEXT_NAME, GGUF_NAME_MAX, "blk.%lld.%s", (long long)l, k_layer_names[i].gguf);
            s = map_one(dir, st, hf, NEXT_NAME, &t[k]), k++;
        }
    snprintf(NEXT_NAME, GGUF_NAME_MAX, "output_norm.weight");
    if (s == NSTF_OK) s = map_one(dir, st, "model.norm.weight", NEXT_NAME, &t[k]), k++;
    if (s == NSTF_OK && has_output) { /* a tied model has no name to write here: k may be n */
        snprintf(NEXT_NAME, GGUF_NAME_MAX, "output.weight");
        s = map_one(dir, st, "lm_head.weight", NEXT_NAME, &t[k]), k++;
    }
    if (s == NSTF_OK && o->rope_freqs) {
        char *name = NEXT_NAME;
        snprintf(name, GGUF_NAME_MAX, "rope_freqs.weight");
        uint64_t half = (uint64_t)c->head_dim / 2;
        t[k++] = (nstf_gguf_tensor){.name = {strlen(name), name}, .n_dims = 1, .ne = {(int64_t)half, 1, 1, 1},
                                    .type = NSTF_TYPE_F32, .n_elems = half, .n_bytes = half * 4, .data = o->rope_freqs};
    }
#undef NEXT_NAME
    /* what the folder holds beyond that */
    for (uint64_t i = 0; s == NSTF_OK && i < st->n_tensors; i++) {
        bool skip;
        if (!known_name(st->tensors[i].name, c, &skip))
            s = nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: tensor '%.80s' (%s) is not part of a %lld-layer %s model",
                               dir, st->tensors[i].name, st->shards[st->tensors[i].shard].path, (long long)c->n_layers,
                               c->arch->family);
    }
    if (s != NSTF_OK) {
        nstf_free(t);
        return s;
    }
    *out = t;
    *n_out = k;
    return NSTF_OK;
}

/* llama.cpp's general.file_type of the embedding's type (ALL_F32,
 * MOSTLY_F16, MOSTLY_BF16) */
static uint32_t file_type(nstf_type t) { return t == NSTF_TYPE_F16 ? 1 : t == NSTF_TYPE_BF16 ? 32 : 0; }

nstf_status nstf_hf_open(const char *dir, nstf_gguf **out) {
    if (!dir || !out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_hf_open: NULL argument");
    *out = NULL;
    char *cfg_path = nstf_path_join(dir, "config.json");
    if (!cfg_path) return NSTF_ERR_OOM;
    struct stat sb;
    if (stat(cfg_path, &sb) != 0) {
        free(cfg_path);
        return nstf_set_error(NSTF_ERR_IO,
                              "%s: a directory without config.json; a model is a GGUF file or an HF model folder "
                              "(config.json, model.safetensors or its shards, tokenizer.json)",
                              dir);
    }
    hf_config c = {.path = cfg_path};
    cJSON *cfg = NULL;
    nstf_gguf_writer *w = NULL;
    hf_owner *o = nstf_calloc(1, sizeof *o, "model folder");
    nstf_gguf_tensor *tensors = NULL;
    uint64_t n_tensors = 0;
    void *img = NULL;
    uint64_t img_size = 0;
    nstf_status s = o ? nstf_json_read_file(cfg_path, MAX_CONFIG_JSON, &cfg) : NSTF_ERR_OOM;
    if (s == NSTF_OK) s = read_config(cfg, &c);
    if (s == NSTF_OK) s = nstf_gguf_writer_create(&w);
    if (s == NSTF_OK) s = config_kvs(dir, &c, w);
    if (s == NSTF_OK) s = rope_scaling(&c, w, &o->rope_freqs);
    /* the families whose GGUF files permute Q/K rows: the view keeps HF's rows */
    if (s == NSTF_OK && c.arch->gguf_rope == NSTF_ROPE_NORM) s = nstf_gguf_writer_set_bool(w, NSTF_GGUF_KEY_ROPE_NEOX, true);
    if (s == NSTF_OK) s = nstf_hf_tokenizer_kvs(dir, cfg, c.n_vocab, w);
    if (s == NSTF_OK) s = nstf_safetensors_open_dir(dir, &o->st);
    if (s == NSTF_OK) s = map_tensors(dir, &c, o, &tensors, &n_tensors);
    if (s == NSTF_OK) {
        const nstf_st_tensor *e = nstf_safetensors_find(o->st, "model.embed_tokens.weight");
        s = nstf_gguf_writer_set_u32(w, "general.file_type", file_type(e ? e->type : NSTF_TYPE_F32));
    }
    if (s == NSTF_OK) s = nstf_gguf_writer_write_memory(w, 0, &img, &img_size);
    nstf_gguf_writer_free(w);
    cJSON_Delete(cfg);
    free(cfg_path);
    if (s != NSTF_OK) {
        nstf_free(tensors);
        hf_release(o);
        return s;
    }
    /* the view owns img and (through hf_release) o from here, also on failure */
    s = nstf_gguf_open_view(img, img_size, dir, tensors, n_tensors, hf_release, o, out);
    nstf_free(tensors);
    return s;
}

bool nstf_model_path_is_folder(const char *path) {
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

nstf_status nstf_model_file_open(const char *path, nstf_gguf **out) {
    if (!path || !out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_model_file_open: NULL argument");
    if (nstf_model_path_is_folder(path)) return nstf_hf_open(path, out);
    return nstf_gguf_open(path, out);
}
