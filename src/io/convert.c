/* convert.c — a model (GGUF file or HF folder view) written as a GGUF file
 * (see convert.h): the type of each output tensor, the Q/K row
 * permutation, the row-by-row conversion that fills each tensor while the
 * writer streams the file, and the temporary-file-and-rename dance. */
#include "io/convert.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "io/hf_model.h"

typedef unsigned long long ull;

typedef struct {
    const nstf_gguf *in;
    nstf_type *type;      /* [n_tensors] output types */
    uint32_t *perm_heads; /* [n_tensors] heads to permute Q/K rows by; 0 = rows as they are */
    float *row;           /* one row in fp32 */
    uint64_t done, total;
    const nstf_convert_params *p;
} conv;

static bool is_float(nstf_type t) { return t == NSTF_TYPE_F32 || t == NSTF_TYPE_F16 || t == NSTF_TYPE_BF16; }

/* HF's head layout [2][d/2] (rotate-half) read as [d/2][2] (pairs). */
uint64_t nstf_convert_src_row(uint64_t r, uint32_t heads, uint64_t rows) {
    if (!heads) return r;
    uint64_t d = rows / heads, h = r / d, j = r % d;
    return h * d + (j % 2) * (d / 2) + j / 2;
}

static nstf_status fill(void *ctx, uint64_t i, void *dst, uint64_t n_bytes) {
    conv *c = ctx;
    const nstf_gguf_tensor *t = &c->in->tensors[i];
    const nstf_type to = c->type[i];
    const int64_t n = t->ne[0];
    const uint64_t rows = t->n_elems / (uint64_t)n;
    uint64_t in_row, out_row;
    if (!nstf_type_row_bytes(t->type, n, &in_row) || !nstf_type_row_bytes(to, n, &out_row) || out_row * rows != n_bytes)
        return nstf_set_error(NSTF_ERR_INTERNAL, "convert: tensor %llu: row sizes disagree", (ull)i);
    for (uint64_t r = 0; r < rows; r++) {
        const uint8_t *s = (const uint8_t *)t->data + nstf_convert_src_row(r, c->perm_heads[i], rows) * in_row;
        uint8_t *d = (uint8_t *)dst + r * out_row;
        if (to == t->type) {
            memcpy(d, s, (size_t)in_row);
            continue;
        }
        nstf_dequantize_row(t->type, s, c->row, n);
        if (to == NSTF_TYPE_F16)
            for (int64_t k = 0; k < n; k++)
                if (isfinite(c->row[k]) && fabsf(c->row[k]) > 65504.0f)
                    return nstf_set_error(NSTF_ERR_RANGE,
                                          "convert: tensor '%.*s' holds %g (row %llu), beyond the range of F16; "
                                          "use --type bf16 or f32",
                                          (int)t->name.len, t->name.ptr, (double)c->row[k], (ull)r);
        nstf_quantize_row(to, c->row, d, n);
        if (c->p->progress && r % 1024 == 1023) c->p->progress(c->p->user, c->done + (r + 1) * out_row, c->total);
    }
    c->done += n_bytes;
    if (c->p->progress) c->p->progress(c->p->user, c->done, c->total);
    return NSTF_OK;
}

/* "blk.N.attn_q.weight" / "blk.N.attn_k.weight" */
static bool name_ends(nstf_gguf_str s, const char *suffix) {
    size_t k = strlen(suffix);
    return s.len > k + 4 && memcmp(s.ptr, "blk.", 4) == 0 && memcmp(s.ptr + s.len - k, suffix, k) == 0;
}

bool nstf_convert_drops_kv(nstf_gguf_str key) {
    return nstf_gguf_str_eq(key, NSTF_GGUF_KEY_ROPE_NEOX) || nstf_gguf_str_eq(key, "general.file_type") ||
           nstf_gguf_str_eq(key, "general.alignment");
}

nstf_status nstf_convert_tensor_plan(const nstf_gguf *g, int out, nstf_type *type, uint32_t *perm_heads) {
    if (out >= 0 && !is_float((nstf_type)out))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "convert: output type %s is not F32, F16 or BF16",
                              nstf_type_name((uint32_t)out));
    const bool neox = nstf_gguf_get_bool_or(g, NSTF_GGUF_KEY_ROPE_NEOX, false);
    uint32_t n_head = 0, n_kv = 0;
    if (neox) {
        NSTF_TRY(nstf_gguf_get_u32(g, "llama.attention.head_count", &n_head));
        n_kv = nstf_gguf_get_u32_or(g, "llama.attention.head_count_kv", n_head);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        nstf_type to = t->n_dims == 1 && is_float(t->type) ? NSTF_TYPE_F32 : out >= 0 ? (nstf_type)out : t->type;
        if (to != t->type && !is_float(t->type))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "convert: tensor '%.*s' is %s: only F32, F16 and BF16 tensors change type here",
                                  (int)t->name.len, t->name.ptr, nstf_type_name(t->type));
        uint32_t heads = !neox ? 0 : name_ends(t->name, ".attn_q.weight") ? n_head
                                   : name_ends(t->name, ".attn_k.weight") ? n_kv : 0;
        uint64_t rows = t->n_elems / (uint64_t)t->ne[0];
        if (heads && (t->n_dims != 2 || rows % heads != 0 || (rows / heads) % 2 != 0))
            return nstf_set_error(NSTF_ERR_FORMAT, "convert: tensor '%.*s' of %llu rows cannot be split into %u heads",
                                  (int)t->name.len, t->name.ptr, (ull)rows, heads);
        type[i] = to;
        perm_heads[i] = heads;
    }
    return NSTF_OK;
}

/* Output types and permutations, the writer's key/values and tensors. */
static nstf_status plan(conv *c, nstf_gguf_writer *w) {
    const nstf_gguf *g = c->in;
    NSTF_TRY(nstf_convert_tensor_plan(g, c->p->out_type, c->type, c->perm_heads));
    nstf_type embd = NSTF_TYPE_F32;
    int64_t widest = 1;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        const nstf_type to = c->type[i];
        if (t->ne[0] > widest) widest = t->ne[0];
        if (nstf_gguf_str_eq(t->name, "token_embd.weight")) embd = to;
        uint64_t bytes, row, rows = t->n_elems / (uint64_t)t->ne[0];
        if (!nstf_type_row_bytes(to, t->ne[0], &row) || !nstf_mul_ok(row, rows, &bytes) ||
            !nstf_add_ok(c->total, bytes, &c->total))
            return nstf_set_error(NSTF_ERR_FORMAT, "convert: tensor sizes overflow");
    }
    c->row = nstf_alloc((size_t)widest * sizeof(float), "convert row");
    if (!c->row) return NSTF_ERR_OOM;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const nstf_gguf_kv *kv = &g->kv[i];
        if (nstf_convert_drops_kv(kv->key)) continue;
        NSTF_TRY(nstf_gguf_writer_copy_kv(w, kv));
    }
    /* llama.cpp's LLAMA_FTYPE: ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32; a
     * quantized input keeps its own */
    const nstf_gguf_kv *ft = nstf_gguf_find_kv(g, "general.file_type");
    uint32_t ftype = embd == NSTF_TYPE_F16 ? 1 : embd == NSTF_TYPE_BF16 ? 32 : 0;
    if (!is_float(embd) && ft) NSTF_TRY(nstf_gguf_writer_copy_kv(w, ft));
    else NSTF_TRY(nstf_gguf_writer_set_u32(w, "general.file_type", ftype));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        char name[256];
        if (t->name.len >= sizeof name || memchr(t->name.ptr, 0, (size_t)t->name.len))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "convert: tensor name of %llu bytes", (ull)t->name.len);
        memcpy(name, t->name.ptr, (size_t)t->name.len);
        name[t->name.len] = 0;
        NSTF_TRY(nstf_gguf_writer_add_tensor_fill(w, name, c->type[i], t->n_dims, t->ne, fill, c, i));
    }
    return NSTF_OK;
}

nstf_status nstf_convert_to_gguf(const nstf_gguf *in, const char *out_path, const nstf_convert_params *p) {
    if (!in || !out_path || !p) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_convert_to_gguf: NULL argument");
    conv c = {.in = in, .p = p};
    uint64_t nt = in->n_tensors ? in->n_tensors : 1;
    c.type = nstf_calloc((size_t)nt, sizeof *c.type, "convert plan");
    c.perm_heads = nstf_calloc((size_t)nt, sizeof *c.perm_heads, "convert plan");
    size_t n = strlen(out_path);
    char *tmp = malloc(n + 32);
    nstf_gguf_writer *w = NULL;
    nstf_status s = c.type && c.perm_heads && tmp ? nstf_gguf_writer_create(&w) : NSTF_ERR_OOM;
    if (s == NSTF_OK) s = plan(&c, w);
    bool wrote = false;
    if (s == NSTF_OK) {
        snprintf(tmp, n + 32, "%s.tmp-%ld", out_path, (long)getpid());
        wrote = true;
        s = nstf_gguf_writer_write(w, tmp, 0);
    }
    if (s == NSTF_OK) { /* what was written reads back */
        nstf_gguf *g = NULL;
        s = nstf_gguf_open(tmp, &g);
        if (s == NSTF_OK && g->n_tensors != in->n_tensors)
            s = nstf_set_error(NSTF_ERR_INTERNAL, "%s: wrote %llu tensors of %llu", tmp, (ull)g->n_tensors,
                               (ull)in->n_tensors);
        nstf_gguf_close(g);
        if (s != NSTF_OK) nstf_wrap_error(s, "convert: the written file does not read back");
    }
    if (s == NSTF_OK && rename(tmp, out_path) != 0)
        s = nstf_set_error(NSTF_ERR_IO, "%s: cannot rename the finished file to %s: %s", tmp, out_path,
                           strerror(errno));
    if (s != NSTF_OK && wrote) unlink(tmp);
    nstf_gguf_writer_free(w);
    free(tmp);
    nstf_free(c.type);
    nstf_free(c.perm_heads);
    nstf_free(c.row);
    return s;
}
