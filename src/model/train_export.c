/* train_export.c — the trained model as files:
 *  - nstf_trainer_export: a GGUF with the base's metadata and its tensors,
 *    the trained ones replaced (full fine-tune: the master weights; LoRA:
 *    W + B A merged in fp32) and written in the chosen type (norms f32),
 *    the others copied as stored; streamed one tensor at a time into a
 *    temporary file, read back, and renamed over the target;
 *  - nstf_trainer_export_lora: the adapters alone in llama.cpp's LoRA
 *    adapter format (general.type "adapter", adapter.type "lora",
 *    adapter.lora.alpha = rank, so the scale alpha / rank is the 1 the
 *    training used; blk.N.<matrix>.weight.lora_a [n_in, r] and .lora_b
 *    [r, n_out] in GGUF's innermost-first dims).
 * A base opened from an HF folder keeps its rotate-half Q/K rows and the
 * key that says so (nstf.rope.neox): nstf runs it; for llama.cpp, write
 * the base with `nstf convert` first and train on that. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "io/atomic_file.h"
#include "model/trainer.h"

typedef struct ex_ctx {
    nstf_trainer *t;
    nstf_type *type; /* [n_tensors] output type of each base tensor */
    int *src;        /* [n_tensors] trainable tensor (full) / adapted layer*LORA_N+k (LoRA), or -1: copy */
    float *row, *w;  /* scratch: one tensor's fp32 values, and (LoRA) A or Bt */
} ex_ctx;

static int find_param(const nstf_train *tr, const char *name) {
    for (int i = 0; i < tr->n_ptab; i++)
        if (!strcmp(tr->ptab[i].name, name)) return i;
    return -1;
}

/* LoRA: W' [n_out, n_in] += Bt^T A for adapter (l, k), fp32 in dst */
static nstf_status merge_lora(ex_ctx *c, int l, int k, float *dst, int64_t n_out, int64_t n_in) {
    nstf_train *tr = c->t->tr;
    const int64_t r = tr->sh.lora_rank;
    char nm[96];
    snprintf(nm, sizeof nm, "blk.%d.%s.weight.lora_a", l, nstf_lora_names[k]);
    const int ia = find_param(tr, nm);
    snprintf(nm, sizeof nm, "blk.%d.%s.weight.lora_b", l, nstf_lora_names[k]);
    const int ib = find_param(tr, nm);
    if (ia < 0 || ib < 0) return nstf_set_error(NSTF_ERR_INTERNAL, "adapter %s missing", nm);
    float *a = c->w, *bt = c->w + r * n_in; /* [r, n_in], [r, n_out] */
    NSTF_TRY(nstf_train_get(tr, 0, tr->ptab[ia].offset, r * n_in, a));
    NSTF_TRY(nstf_train_get(tr, 0, tr->ptab[ib].offset, r * n_out, bt));
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t j = 0; j < r; j++) {
            const float b = bt[j * n_out + o];
            if (b == 0.0f) continue;
            float *row = dst + o * n_in;
            const float *ar = a + j * n_in;
            for (int64_t i = 0; i < n_in; i++) row[i] += b * ar[i];
        }
    return NSTF_OK;
}

static nstf_status ex_fill(void *ctx, uint64_t index, void *dst, uint64_t n_bytes) {
    ex_ctx *c = ctx;
    const nstf_gguf *g = c->t->model->file;
    const nstf_gguf_tensor *bt = &g->tensors[index];
    if (c->src[index] < 0) { /* as stored */
        memcpy(dst, bt->data, (size_t)n_bytes);
        return NSTF_OK;
    }
    const int64_t cols = bt->ne[0], rows = (int64_t)(bt->n_elems / (uint64_t)cols);
    if (c->t->tr->sh.lora_rank > 0) {
        uint64_t rb = 0;
        (void)nstf_type_row_bytes(bt->type, cols, &rb);
        for (int64_t r = 0; r < rows; r++)
            nstf_dequantize_row(bt->type, (const unsigned char *)bt->data + (uint64_t)r * rb, c->row + r * cols, cols);
        NSTF_TRY(merge_lora(c, c->src[index] / LORA_N, c->src[index] % LORA_N, c->row, rows, cols));
    } else {
        const nstf_param_tensor *p = &c->t->tr->ptab[c->src[index]];
        NSTF_TRY(nstf_train_get(c->t->tr, 0, p->offset, p->n, c->row));
    }
    uint64_t rb = 0;
    (void)nstf_type_row_bytes(c->type[index], cols, &rb);
    for (int64_t r = 0; r < rows; r++)
        nstf_quantize_row(c->type[index], c->row + r * cols, (unsigned char *)dst + (uint64_t)r * rb, cols);
    return NSTF_OK;
}

/* "blk.%d.<matrix>.weight": the layer and LORA_* index, else -1 */
static int layer_matrix(const char *name, int *layer) {
    char kind[64];
    int l = -1, used = 0;
    if (sscanf(name, "blk.%d.%63[a-z_].weight%n", &l, kind, &used) != 2 || name[used] != 0) return -1;
    for (int k = 0; k < LORA_N; k++)
        if (!strcmp(kind, nstf_lora_names[k])) {
            *layer = l;
            return k;
        }
    return -1;
}

nstf_status nstf_trainer_export(nstf_trainer *t, const char *path, const char *type_name) {
    nstf_type type = NSTF_TYPE_BF16;
    if (type_name && !nstf_type_from_name(type_name, &type))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--out-type %s: use f32, f16, bf16, q8_0, q4_0 or q4_1", type_name);
    const nstf_gguf *g = t->model->file;
    nstf_train *tr = t->tr;
    const uint64_t nt = g->n_tensors ? g->n_tensors : 1;
    ex_ctx c = {t, nstf_calloc((size_t)nt, sizeof(nstf_type), "export plan"), nstf_calloc((size_t)nt, sizeof(int), "export plan"),
                NULL, NULL};
    nstf_gguf_writer *w = NULL;
    nstf_status st = c.type && c.src ? nstf_gguf_writer_create(&w) : NSTF_ERR_OOM;
    uint64_t most = 1;
    char name[256];
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_tensors; i++) {
        const nstf_gguf_tensor *bt = &g->tensors[i];
        if (bt->name.len >= sizeof name) {
            st = nstf_set_error(NSTF_ERR_UNSUPPORTED, "export: tensor name of %llu bytes", (unsigned long long)bt->name.len);
            break;
        }
        memcpy(name, bt->name.ptr, (size_t)bt->name.len);
        name[bt->name.len] = 0;
        c.type[i] = bt->type;
        c.src[i] = -1;
        int l = -1;
        const int k = layer_matrix(name, &l);
        if (tr->sh.lora_rank > 0) {
            if (k >= 0 && l >= 0 && l < tr->c.n_layers && tr->layers[l].has_lora[k]) c.src[i] = l * LORA_N + k;
        } else {
            c.src[i] = find_param(tr, name);
        }
        if (c.src[i] >= 0) {
            c.type[i] = bt->n_dims == 1 ? NSTF_TYPE_F32 : type;
            uint64_t rb = 0;
            if (!nstf_type_row_bytes(c.type[i], bt->ne[0], &rb))
                st = nstf_set_error(NSTF_ERR_INVALID_ARG, "export: %s rows of %lld do not split into %s blocks", name,
                                    (long long)bt->ne[0], nstf_type_name(c.type[i]));
            if (bt->n_elems > most) most = bt->n_elems;
        }
        if (st == NSTF_OK) st = nstf_gguf_writer_add_tensor_fill(w, name, c.type[i], bt->n_dims, bt->ne, ex_fill, &c, i);
    }
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_kv; i++) {
        const nstf_gguf_kv *kv = &g->kv[i];
        if (nstf_gguf_str_eq(kv->key, "general.file_type") || nstf_gguf_str_eq(kv->key, "general.alignment")) continue;
        st = nstf_gguf_writer_copy_kv(w, kv);
    }
    /* llama.cpp's LLAMA_FTYPE of the trained tensors' type */
    const uint32_t ftype = type == NSTF_TYPE_F32 ? 0 : type == NSTF_TYPE_F16 ? 1 : type == NSTF_TYPE_Q4_0 ? 2
                           : type == NSTF_TYPE_Q4_1 ? 3 : type == NSTF_TYPE_Q8_0 ? 7 : 32;
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "general.file_type", ftype);
    const int64_t r = tr->sh.lora_rank, wide = tr->c.ffn_dim > tr->c.dim ? tr->c.ffn_dim : tr->c.dim;
    if (st == NSTF_OK) {
        c.row = nstf_alloc((size_t)most * sizeof(float), "export tensor");
        c.w = r ? nstf_alloc((size_t)(2 * r * (wide > tr->c.n_heads * tr->c.head_dim ? wide : tr->c.n_heads * tr->c.head_dim)) *
                                 sizeof(float),
                             "export adapter")
                : NULL;
        if (!c.row || (r && !c.w)) st = NSTF_ERR_OOM;
    }
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (st == NSTF_OK) st = nstf_gguf_writer_write(w, tmp, 0);
    if (st == NSTF_OK) { /* what was written reads back */
        nstf_gguf *back = NULL;
        st = nstf_gguf_open(tmp, &back);
        if (st == NSTF_OK && back->n_tensors != g->n_tensors)
            st = nstf_set_error(NSTF_ERR_INTERNAL, "%s: wrote %llu tensors of %llu", tmp,
                                (unsigned long long)back->n_tensors, (unsigned long long)g->n_tensors);
        nstf_gguf_close(back);
        if (st == NSTF_OK) st = nstf_afile_publish(tmp, path);
        else unlink(tmp);
    } else {
        unlink(tmp);
    }
    nstf_gguf_writer_free(w);
    nstf_free(c.type);
    nstf_free(c.src);
    nstf_free(c.row);
    nstf_free(c.w);
    return st != NSTF_OK ? nstf_wrap_error(st, "export to %s", path) : NSTF_OK;
}

/* ---- the adapters alone ----------------------------------------------------------------------- */

typedef struct ad_ctx {
    nstf_train *tr;
    float *buf;
} ad_ctx;

/* index: parameter i; lora_b is written as B [n_out, r] (the table keeps Bt) */
static nstf_status ad_fill(void *ctx, uint64_t index, void *dst, uint64_t n_bytes) {
    ad_ctx *c = ctx;
    const nstf_param_tensor *p = &c->tr->ptab[index];
    const size_t ln = strlen(p->name);
    (void)n_bytes;
    if (strcmp(p->name + ln - 7, ".lora_b") != 0) return nstf_train_get(c->tr, 0, p->offset, p->n, dst);
    const int64_t r = c->tr->sh.lora_rank, n_out = p->n / r;
    NSTF_TRY(nstf_train_get(c->tr, 0, p->offset, p->n, c->buf));
    float *d = dst;
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t j = 0; j < r; j++) d[o * r + j] = c->buf[j * n_out + o];
    return NSTF_OK;
}

nstf_status nstf_trainer_export_lora(nstf_trainer *t, const char *path) {
    nstf_train *tr = t->tr;
    if (tr->sh.lora_rank <= 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--lora-out: this run has no adapters (--lora R)");
    const int64_t r = tr->sh.lora_rank;
    int64_t most = 1;
    for (int i = 0; i < tr->n_ptab; i++) most = tr->ptab[i].n > most ? tr->ptab[i].n : most;
    ad_ctx c = {tr, nstf_alloc((size_t)most * sizeof(float), "adapter")};
    nstf_gguf_writer *w = NULL;
    nstf_status st = c.buf ? nstf_gguf_writer_create(&w) : NSTF_ERR_OOM;
    if (st == NSTF_OK) st = nstf_gguf_writer_set_str(w, "general.architecture", "llama");
    if (st == NSTF_OK) st = nstf_gguf_writer_set_str(w, "general.type", "adapter");
    if (st == NSTF_OK) st = nstf_gguf_writer_set_str(w, "adapter.type", "lora");
    if (st == NSTF_OK) st = nstf_gguf_writer_set_f32(w, "adapter.lora.alpha", (float)r);
    for (int i = 0; st == NSTF_OK && i < tr->n_ptab; i++) {
        const nstf_param_tensor *p = &tr->ptab[i];
        const bool is_b = strcmp(p->name + strlen(p->name) - 7, ".lora_b") == 0;
        /* lora_a: A [r, n_in] -> ne {n_in, r}; lora_b: B [n_out, r] -> ne {r, n_out} */
        const int64_t ne[2] = {is_b ? r : p->n / r, is_b ? p->n / r : r};
        st = nstf_gguf_writer_add_tensor_fill(w, p->name, NSTF_TYPE_F32, 2, ne, ad_fill, &c, (uint64_t)i);
    }
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (st == NSTF_OK) st = nstf_gguf_writer_write(w, tmp, 0);
    if (st == NSTF_OK) st = nstf_afile_publish(tmp, path);
    else unlink(tmp);
    nstf_gguf_writer_free(w);
    nstf_free(c.buf);
    return st != NSTF_OK ? nstf_wrap_error(st, "adapter export to %s", path) : NSTF_OK;
}
