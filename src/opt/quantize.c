/* quantize.c — `nstf quantize`: choose each tensor's type by llama.cpp's
 * rules (quantize.h), convert it row by row on a thread pool while the
 * writer streams the GGUF (one tensor in memory at a time) through a
 * temporary file renamed into place; a GGUF file or an HF model folder in. */
#include "opt/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/mem.h"
#include "core/threadpool.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "io/hf_model.h"
#include "opt/imatrix.h"

static const nstf_quant_target k_targets[] = {
    {"F16", NSTF_TYPE_F16, NSTF_QMIX_PLAIN, 1},    {"BF16", NSTF_TYPE_BF16, NSTF_QMIX_PLAIN, 32},
    {"Q8_0", NSTF_TYPE_Q8_0, NSTF_QMIX_PLAIN, 7},  {"Q4_0", NSTF_TYPE_Q4_0, NSTF_QMIX_PLAIN, 2},
    {"Q4_1", NSTF_TYPE_Q4_1, NSTF_QMIX_PLAIN, 3},  {"Q5_0", NSTF_TYPE_Q5_0, NSTF_QMIX_PLAIN, 8},
    {"Q5_1", NSTF_TYPE_Q5_1, NSTF_QMIX_PLAIN, 9},  {"Q4_K", NSTF_TYPE_Q4_K, NSTF_QMIX_PLAIN, 14},
    {"Q5_K", NSTF_TYPE_Q5_K, NSTF_QMIX_PLAIN, 16}, {"Q6_K", NSTF_TYPE_Q6_K, NSTF_QMIX_PLAIN, 18},
    {"Q2_K", NSTF_TYPE_Q2_K, NSTF_QMIX_PLAIN, 10},  {"Q3_K", NSTF_TYPE_Q3_K, NSTF_QMIX_PLAIN, 11},
    {"IQ4_NL", NSTF_TYPE_IQ4_NL, NSTF_QMIX_PLAIN, 25}, {"IQ4_XS", NSTF_TYPE_IQ4_XS, NSTF_QMIX_PLAIN, 30},
    {"Q4_K_M", NSTF_TYPE_Q4_K, NSTF_QMIX_Q4_K_M, 15},
    {"Q5_K_M", NSTF_TYPE_Q5_K, NSTF_QMIX_Q5_K_M, 17},
};
#define N_TARGETS (sizeof k_targets / sizeof k_targets[0])

bool nstf_quant_target_parse(const char *name, nstf_quant_target *out) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (!strcasecmp(name, k_targets[i].name)) {
            *out = k_targets[i];
            return true;
        }
    return false;
}

const char *nstf_quant_target_list(void) {
    return "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, Q4_K_M, Q5_K_M";
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third layer in between. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* Layer index of "blk.N.*", -1 otherwise. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && v >= 0 && v < 1000000 ? (int)v : -1;
}

nstf_type nstf_quant_tensor_type(const nstf_quant_target *tg, const char *name, uint32_t n_dims,
                                 int64_t ne0, nstf_type cur, bool has_output, int n_layers) {
    if (n_dims < 2 || !ends_with(name, "weight")) return cur;
    nstf_type t = tg->base;
    const bool quant = nstf_type_is_quantized(t);
    const bool is_output =
        !strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"));
    const int layer = layer_of(name);
    if (is_output && quant) {
        if (ne0 % NSTF_QK_K != 0) t = NSTF_TYPE_Q8_0;
        else if (t != NSTF_TYPE_Q8_0) t = NSTF_TYPE_Q6_K;
    } else if (tg->mix != NSTF_QMIX_PLAIN && layer >= 0 &&
               (strstr(name, "attn_v.weight") || strstr(name, "ffn_down")) &&
               use_more_bits(layer, n_layers)) {
        t = NSTF_TYPE_Q6_K;
    }
    if (nstf_type_block_elems(t) == NSTF_QK_K && ne0 % NSTF_QK_K != 0) /* llama.cpp's fallbacks */
        t = t == NSTF_TYPE_Q4_K                          ? NSTF_TYPE_Q5_0
            : t == NSTF_TYPE_Q5_K                        ? NSTF_TYPE_Q5_1
            : t == NSTF_TYPE_Q2_K || t == NSTF_TYPE_Q3_K ? NSTF_TYPE_Q4_0
            : t == NSTF_TYPE_IQ4_XS                      ? NSTF_TYPE_IQ4_NL
                                                         : NSTF_TYPE_Q8_0;
    /* rows no block of the type divides (a low-rank factor of rank r: rows
     * of r): a float type, as llama.cpp's last fallback (F16); BF16 and
     * F16 tensors keep theirs */
    const int64_t be = nstf_type_block_elems(t);
    if (be > 1 && ne0 % be != 0) t = cur == NSTF_TYPE_BF16 ? NSTF_TYPE_BF16 : NSTF_TYPE_F16;
    return t;
}

/* ---- conversion -------------------------------------------------------------- */

/* One quantization: the input, each tensor's output type and (HF folders)
 * the Q/K row permutation of `nstf convert`, the thread pool and its fp32
 * rows. Tensors are filled one at a time while the writer streams the file
 * (nstf_gguf_writer_add_tensor_fill): memory is the largest output tensor
 * and a row per thread, never the model. */
typedef struct {
    const nstf_gguf *g;
    const nstf_quant_params *p;
    nstf_pool *pool;
    nstf_type *to;     /* [n_tensors] output types */
    uint32_t *perm;    /* [n_tensors] heads to permute Q/K rows by; 0 = rows as they are */
    const float **qw;  /* [n_tensors] importance weights per column (p->imatrix), or NULL */
    float *scratch;    /* [n_threads][widest ne0] */
    uint64_t done, total; /* input bytes, for the progress */
} quant_job;

/* Rows [row0, row0 + n_rows) of one tensor, split over the pool. */
typedef struct {
    const uint8_t *src;
    nstf_type src_type, dst_type;
    uint8_t *dst;
    int64_t ne0, row0, n_rows, rows;
    uint32_t perm;
    uint64_t src_rb, dst_rb;
    const float *qw; /* [ne0] importance weights, or NULL */
    float *scratch; /* [n_threads][ne0] */
} conv_ctx;

static void conv_worker(void *p, int ith, int nth) {
    const conv_ctx *c = p;
    int64_t lo, hi;
    nstf_split_range(c->n_rows, 1, ith, nth, &lo, &hi);
    float *f = c->scratch + (int64_t)ith * c->ne0;
    for (int64_t r = c->row0 + lo; r < c->row0 + hi; r++) {
        const uint8_t *s = c->src + nstf_convert_src_row((uint64_t)r, c->perm, (uint64_t)c->rows) * c->src_rb;
        uint8_t *d = c->dst + (uint64_t)r * c->dst_rb;
        if (c->src_type == c->dst_type) {
            memcpy(d, s, (size_t)c->src_rb);
            continue;
        }
        nstf_dequantize_row(c->src_type, s, f, c->ne0);
        nstf_quantize_row_w(c->dst_type, f, d, c->ne0, c->qw);
    }
}

static nstf_status fill(void *ctx, uint64_t i, void *dst, uint64_t n_bytes) {
    quant_job *j = ctx;
    const nstf_gguf_tensor *t = &j->g->tensors[i];
    const int64_t rows = (int64_t)(t->n_elems / (uint64_t)t->ne[0]);
    conv_ctx c = {.src = t->data, .src_type = t->type, .dst_type = j->to[i], .dst = dst, .ne0 = t->ne[0],
                  .rows = rows, .perm = j->perm[i], .qw = j->qw[i], .scratch = j->scratch};
    if (!nstf_type_row_bytes(t->type, t->ne[0], &c.src_rb) || !nstf_type_row_bytes(c.dst_type, t->ne[0], &c.dst_rb) ||
        c.dst_rb * (uint64_t)rows != n_bytes)
        return nstf_set_error(NSTF_ERR_INTERNAL, "quantize: tensor %llu: row sizes disagree", (unsigned long long)i);
    /* pieces of ~4M values, so the progress moves within large tensors */
    const int64_t step = (int64_t)(4194304 / t->ne[0]) + 1;
    for (c.row0 = 0; c.row0 < rows; c.row0 += step) {
        c.n_rows = rows - c.row0 < step ? rows - c.row0 : step;
        nstf_pool_run(j->pool, conv_worker, &c);
        if (j->p->progress)
            j->p->progress(j->p->progress_user, j->done + (uint64_t)(c.row0 + c.n_rows) * c.src_rb, j->total);
    }
    j->done += t->n_bytes;
    return NSTF_OK;
}

static nstf_status name_of(const nstf_gguf_tensor *t, char *buf, size_t cap) {
    if (t->name.len >= cap || memchr(t->name.ptr, 0, (size_t)t->name.len))
        return nstf_set_error(NSTF_ERR_FORMAT, "tensor name of %llu bytes is too long or holds a NUL",
                              (unsigned long long)t->name.len);
    memcpy(buf, t->name.ptr, (size_t)t->name.len);
    buf[t->name.len] = 0;
    return NSTF_OK;
}

/* The type tensor t (named name, of type cur as read) gets: its override,
 * else the rule; for IQ4_NL and IQ4_XS without importance weights also
 * llama.cpp's ffn_down of the first eighth of the layers in Q5_K (its Q5_1
 * fallback on rows that are not a multiple of 256). llama.cpp's other
 * rule for them, attn_v in Q5_K for 4 or more query heads per kv head, is
 * not applied. */
static nstf_type type_for(const nstf_quant_params *p, const nstf_gguf_tensor *t, const char *name, nstf_type cur,
                          bool has_output, int n_layers) {
    for (int i = 0; i < p->n_overrides; i++)
        if (!strcmp(p->overrides[i].name, name)) return p->overrides[i].type;
    const nstf_type to = nstf_quant_tensor_type(&p->target, name, t->n_dims, t->ne[0], cur, has_output, n_layers);
    const int layer = layer_of(name);
    const bool iq4 = p->target.base == NSTF_TYPE_IQ4_NL || p->target.base == NSTF_TYPE_IQ4_XS;
    if (iq4 && (to == NSTF_TYPE_IQ4_NL || to == NSTF_TYPE_IQ4_XS) && !p->imatrix && layer >= 0 &&
        layer < n_layers / 8 && strstr(name, "ffn_down"))
        return t->ne[0] % NSTF_QK_K ? NSTF_TYPE_Q5_1 : NSTF_TYPE_Q5_K;
    return to;
}

/* Layers (1 + the largest blk.N), whether output.weight exists, bytes. */
static nstf_status model_shape(const nstf_gguf *g, int *n_layers, bool *has_output, uint64_t *total) {
    char name[512];
    *n_layers = 0;
    *total = 0;
    *has_output = nstf_gguf_find_tensor(g, "output.weight") != NULL;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        NSTF_TRY(name_of(t, name, sizeof name));
        if (layer_of(name) + 1 > *n_layers) *n_layers = layer_of(name) + 1;
        *total += t->n_bytes;
    }
    return NSTF_OK;
}

nstf_status nstf_quantize_plan_bytes(const nstf_gguf *g, const nstf_quant_params *p, uint64_t *bytes,
                                     uint64_t *n_elems) {
    int n_layers;
    bool has_output;
    uint64_t total;
    char name[512];
    NSTF_TRY(model_shape(g, &n_layers, &has_output, &total));
    *bytes = *n_elems = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        NSTF_TRY(name_of(t, name, sizeof name));
        const nstf_type to = type_for(p, t, name, t->type, has_output, n_layers);
        uint64_t rb, b;
        if (!nstf_type_row_bytes(to, t->ne[0], &rb) || !nstf_mul_ok(rb, t->n_elems / (uint64_t)t->ne[0], &b))
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor '%s': %s does not divide its rows of %lld", name,
                                  nstf_type_name(to), (long long)t->ne[0]);
        *bytes += b;
        *n_elems += t->n_elems;
    }
    return NSTF_OK;
}

/* Plan every tensor's type, refuse requantization before any work, and
 * queue the key/values and tensors on the writer. An HF folder's view is
 * first taken as `nstf convert` writes it (convert.h: vectors F32, Q/K
 * rows permuted, its key/values), so that the result is the bytes of
 * convert-then-quantize. */
static nstf_status plan(quant_job *j, bool folder, nstf_gguf_writer *w) {
    const nstf_gguf *g = j->g;
    const nstf_quant_target *tg = &j->p->target;
    if (folder) NSTF_TRY(nstf_convert_tensor_plan(g, -1, j->to, j->perm));
    else
        for (uint64_t i = 0; i < g->n_tensors; i++) j->to[i] = g->tensors[i].type;
    int n_layers;
    bool has_output;
    char name[512];
    int64_t widest = 1;
    NSTF_TRY(model_shape(g, &n_layers, &has_output, &j->total));
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].ne[0] > widest) widest = g->tensors[i].ne[0];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        NSTF_TRY(name_of(t, name, sizeof name));
        const nstf_type cur = j->to[i];
        const nstf_type to = type_for(j->p, t, name, cur, has_output, n_layers);
        if (to != cur && nstf_type_is_quantized(cur) && !j->p->allow_requantize)
            return nstf_set_error(NSTF_ERR_INVALID_ARG,
                                  "%s: tensor '%s' is already quantized (%s); requantizing compounds the "
                                  "error: pass --allow-requantize to do it anyway, or start from an "
                                  "F32/F16/BF16 file",
                                  g->path, name, nstf_type_name(cur));
        if (to != t->type && !nstf_type_can_quantize(to))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "tensor '%s': no quantizer for %s", name, nstf_type_name(to));
        j->to[i] = to;
        nstf_status st = NSTF_OK;
        if (j->p->imatrix && to != cur && nstf_type_is_quantized(to))
            j->qw[i] = nstf_imatrix_weights(j->p->imatrix, name, t->ne[0], &st);
        NSTF_TRY(st);
    }
    uint64_t scratch_bytes;
    if (!nstf_mul_ok((uint64_t)widest * sizeof(float), (uint64_t)nstf_pool_size(j->pool), &scratch_bytes))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: rows of %lld values overflow the scratch size", g->path,
                              (long long)widest);
    if (!(j->scratch = nstf_alloc((size_t)scratch_bytes, "quantize scratch"))) return NSTF_ERR_OOM;

    for (uint64_t i = 0; i < g->n_kv; i++) {
        const nstf_gguf_kv *kv = &g->kv[i];
        if (nstf_gguf_str_eq(kv->key, "general.file_type") ||
            nstf_gguf_str_eq(kv->key, "general.quantization_version") || (folder && nstf_convert_drops_kv(kv->key)))
            continue;
        NSTF_TRY(nstf_gguf_writer_copy_kv(w, kv));
    }
    NSTF_TRY(nstf_gguf_writer_set_u32(w, "general.file_type", tg->ftype));
    NSTF_TRY(nstf_gguf_writer_set_u32(w, "general.quantization_version", 2));
    if (j->p->add_keys) NSTF_TRY(j->p->add_keys(j->p->add_keys_user, w));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        NSTF_TRY(name_of(t, name, sizeof name));
        NSTF_TRY(nstf_gguf_writer_add_tensor_fill(w, name, j->to[i], t->n_dims, t->ne, fill, j, i));
    }
    return NSTF_OK;
}

nstf_status nstf_quantize_file(const char *in_path, const char *out_path, const nstf_quant_params *p) {
    if (!in_path || !out_path || !p)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_quantize_file: NULL argument");
    const bool folder = nstf_model_path_is_folder(in_path);
    nstf_gguf *g;
    NSTF_TRY(nstf_model_file_open(in_path, &g));
    quant_job j = {.g = g, .p = p};
    const size_t nt = g->n_tensors ? (size_t)g->n_tensors : 1;
    j.to = nstf_calloc(nt, sizeof *j.to, "quantize plan");
    j.perm = nstf_calloc(nt, sizeof *j.perm, "quantize plan");
    j.qw = nstf_calloc(nt, sizeof *j.qw, "quantize weights");
    nstf_gguf_writer *w = NULL;
    nstf_status st = j.to && j.perm && j.qw ? nstf_pool_create(p->n_threads > 0 ? p->n_threads : 1, &j.pool) : NSTF_ERR_OOM;
    if (st == NSTF_OK) st = nstf_gguf_writer_create(&w);
    if (st == NSTF_OK) st = plan(&j, folder, w);
    /* a temporary file in OUT's folder, renamed over OUT once complete */
    if (st == NSTF_OK) st = nstf_gguf_writer_write_replace(w, out_path, (uint32_t)g->alignment);
    nstf_gguf_writer_free(w);
    nstf_pool_free(j.pool);
    nstf_free(j.scratch);
    nstf_free(j.to);
    nstf_free(j.perm);
    nstf_free((void *)j.qw);
    nstf_gguf_close(g);
    return st;
}
