/* imatrix.c — importance matrices (imatrix.h): collection through a CPU
 * op hook while the model runs over a text, llama.cpp's GGUF imatrix file
 * written and read, and the per-column weights the quantizers take. */
#include "opt/imatrix.h"

#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "io/gguf.h"
#include "model/session.h"
#include "opt/analyze.h"

void nstf_imatrix_free(nstf_imatrix *im) {
    if (!im) return;
    for (int i = 0; i < im->n; i++) {
        nstf_free(im->e[i].sum2);
        nstf_free(im->e[i].mean);
    }
    nstf_free(im->e);
    nstf_free(im);
}

static nstf_status entry_init(nstf_imatrix_entry *e, const char *name, int64_t n_in) {
    snprintf(e->name, sizeof e->name, "%s", name);
    e->n_in = n_in;
    e->sum2 = nstf_calloc((size_t)n_in, sizeof *e->sum2, "imatrix sums");
    return e->sum2 ? NSTF_OK : NSTF_ERR_OOM;
}

/* mean = sum2 / count for every entry */
static nstf_status finish(nstf_imatrix *im) {
    for (int i = 0; i < im->n; i++) {
        nstf_imatrix_entry *e = &im->e[i];
        nstf_free(e->mean);
        e->mean = nstf_alloc((size_t)e->n_in * sizeof *e->mean, "imatrix weights");
        if (!e->mean) return NSTF_ERR_OOM;
        for (int64_t j = 0; j < e->n_in; j++) e->mean[j] = e->count > 0 ? (float)(e->sum2[j] / e->count) : 1.0f;
    }
    return NSTF_OK;
}

/* ---- collection ---------------------------------------------------------------- */

/* Per layer the matmul groups in forward.c's labels and the first of the
 * seven matrices (analyze.h's kinds) each one feeds; the others of a group
 * get a copy of its sums. */
static const struct {
    const char *label;
    int kind0, n_kinds;
} k_groups[4] = {{"qkv_proj", 0, 3}, {"o_proj", 3, 1}, {"gate_up_proj", 4, 2}, {"down_proj", 6, 1}};

typedef struct hook_ctx {
    nstf_imatrix *im;
    int n_layers;
} hook_ctx;

static void add_rows(nstf_imatrix_entry *e, const float *x, int64_t n_tok) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *r = x + t * e->n_in;
        for (int64_t j = 0; j < e->n_in; j++) e->sum2[j] += (double)r[j] * r[j];
    }
    e->count += (double)n_tok;
}

static void hook(void *user, nstf_backend *be, const nstf_op_args *a) {
    (void)be;
    const hook_ctx *c = user;
    if (a->op != NSTF_OP_MATMUL || !a->label || !a->matmul.x.data || a->matmul.x.type != NSTF_TYPE_F32) return;
    nstf_imatrix_entry *e = NULL;
    if (a->layer < 0 && !strcmp(a->label, "logits")) e = &c->im->e[c->im->n - 1];
    for (int g = 0; g < 4 && !e && a->layer >= 0 && a->layer < c->n_layers; g++)
        if (!strcmp(a->label, k_groups[g].label)) e = &c->im->e[a->layer * 7 + k_groups[g].kind0];
    if (!e || a->matmul.x.stride != e->n_in || a->matmul.w[0]->n_in != e->n_in) return;
    add_rows(e, a->matmul.x.data, a->matmul.n);
}

nstf_status nstf_imatrix_collect(nstf_session *s, const int32_t *ids, int n, int chunk_size,
                                 void (*progress)(void *user, int done, int total), void *user, nstf_imatrix **out) {
    *out = NULL;
    if (!s->be->host_memory || s->run_cpu)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "the importance matrix is collected on a CPU session (--device cpu)");
    if (chunk_size < 2 || chunk_size > s->n_ctx)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "imatrix: chunks of %d tokens (2..%d, the context)", chunk_size,
                              s->n_ctx);
    nstf_llama *m = s->model;
    const int L = m->cfg.n_layers;
    nstf_imatrix *im = nstf_calloc(1, sizeof *im, "imatrix");
    if (!im) return NSTF_ERR_OOM;
    im->e = nstf_calloc((size_t)L * 7 + 1, sizeof *im->e, "imatrix entries");
    nstf_status st = im->e ? NSTF_OK : NSTF_ERR_OOM;
    for (int i = 0; st == NSTF_OK && i < L * 7; i++) {
        const nstf_matrix *w = nstf_analyze_slot(&m->w.layers[i / 7], i % 7);
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s.weight", i / 7, nstf_analyze_kind_name(i % 7));
        if (w->factors) st = nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s is factorized (low-rank): no imatrix", name);
        else st = entry_init(&im->e[im->n++], name, w->n_in);
    }
    if (st == NSTF_OK) /* the output matrix, last */
        st = entry_init(&im->e[im->n++], nstf_gguf_find_tensor(m->file, "output.weight") ? "output.weight"
                                                                                            : "token_embd.weight",
                        m->cfg.dim);
    hook_ctx c = {im, L};
    const nstf_backend_hooks h = {hook, NULL, &c}, *prev = s->be->hooks;
    const int n_chunks = n / chunk_size + (n % chunk_size >= 2);
    s->be->hooks = &h;
    for (int k = 0; st == NSTF_OK && k < n_chunks; k++) {
        const int32_t *t = ids + (int64_t)k * chunk_size;
        const int len = n - k * chunk_size < chunk_size ? n - k * chunk_size : chunk_size;
        for (int i = 0; st == NSTF_OK && i < len; i += s->n_batch) {
            const int b = len - i < s->n_batch ? len - i : s->n_batch;
            st = nstf_session_forward(s, t + i, b, i, true, NULL, NULL);
        }
        im->chunk_count++;
        if (st == NSTF_OK && progress) progress(user, k + 1, n_chunks);
    }
    s->be->hooks = prev;
    im->chunk_size = chunk_size;
    for (int i = 0; st == NSTF_OK && i < L * 7; i++) { /* the group's other matrices: the same inputs */
        const int g = i % 7 <= 2 ? 0 : i % 7 == 3 ? 1 : i % 7 <= 5 ? 2 : 3, first = (i / 7) * 7 + k_groups[g].kind0;
        if (i == first) continue;
        memcpy(im->e[i].sum2, im->e[first].sum2, (size_t)im->e[i].n_in * sizeof *im->e[i].sum2);
        im->e[i].count = im->e[first].count;
    }
    for (int i = 0; st == NSTF_OK && i < im->n; i++)
        if (!(im->e[i].count > 0))
            st = nstf_set_error(NSTF_ERR_INTERNAL, "imatrix: no activations seen for %s", im->e[i].name);
    if (st == NSTF_OK) st = finish(im);
    if (st != NSTF_OK) {
        nstf_imatrix_free(im);
        return st;
    }
    *out = im;
    return NSTF_OK;
}

/* ---- the file --------------------------------------------------------------------- */

nstf_status nstf_imatrix_write(const nstf_imatrix *im, const char *path) {
    nstf_gguf_writer *w;
    NSTF_TRY(nstf_gguf_writer_create(&w));
    const char *ds = im->dataset;
    nstf_status st = nstf_gguf_writer_set_str(w, "general.type", "imatrix");
    if (st == NSTF_OK) st = nstf_gguf_writer_set_arr_str(w, "imatrix.datasets", &ds, 1);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "imatrix.chunk_count", (uint32_t)im->chunk_count);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "imatrix.chunk_size", (uint32_t)im->chunk_size);
    for (int i = 0; st == NSTF_OK && i < im->n; i++) {
        const nstf_imatrix_entry *e = &im->e[i];
        float *f = nstf_alloc((size_t)e->n_in * 4, "imatrix row");
        if (!f) {
            st = NSTF_ERR_OOM;
            break;
        }
        for (int64_t j = 0; j < e->n_in; j++) f[j] = (float)e->sum2[j];
        char name[128];
        const int64_t ne_s[2] = {e->n_in, 1}, ne_c[2] = {1, 1};
        const float count = (float)e->count;
        snprintf(name, sizeof name, "%s.in_sum2", e->name);
        st = nstf_gguf_writer_add_tensor(w, name, NSTF_TYPE_F32, 2, ne_s, f);
        snprintf(name, sizeof name, "%s.counts", e->name);
        if (st == NSTF_OK) st = nstf_gguf_writer_add_tensor(w, name, NSTF_TYPE_F32, 2, ne_c, &count);
        nstf_free(f);
    }
    if (st == NSTF_OK) st = nstf_gguf_writer_write_replace(w, path, 0);
    nstf_gguf_writer_free(w);
    return st;
}

nstf_status nstf_imatrix_load(const char *path, nstf_imatrix **out) {
    *out = NULL;
    nstf_gguf *g;
    NSTF_TRY(nstf_gguf_open(path, &g));
    nstf_imatrix *im = nstf_calloc(1, sizeof *im, "imatrix");
    if (im) im->e = nstf_calloc((size_t)g->n_tensors / 2 + 1, sizeof *im->e, "imatrix entries");
    nstf_status st = im && im->e ? NSTF_OK : NSTF_ERR_OOM;
    nstf_gguf_str gt;
    if (st == NSTF_OK && (nstf_gguf_get_str(g, "general.type", &gt) != NSTF_OK || gt.len != 7 ||
                          memcmp(gt.ptr, "imatrix", 7)))
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: not an importance matrix (general.type is not \"imatrix\"; the "
                                             "legacy .dat format is not read)", path);
    if (st == NSTF_OK) {
        im->chunk_count = (int)nstf_gguf_get_u32_or(g, "imatrix.chunk_count", 0);
        im->chunk_size = (int)nstf_gguf_get_u32_or(g, "imatrix.chunk_size", 0);
    }
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        const size_t suf = strlen(".in_sum2");
        if (t->name.len <= suf || t->name.len - suf >= sizeof im->e[0].name ||
            memcmp(t->name.ptr + t->name.len - suf, ".in_sum2", suf))
            continue;
        char base[96], cname[128];
        snprintf(base, sizeof base, "%.*s", (int)(t->name.len - suf), t->name.ptr);
        snprintf(cname, sizeof cname, "%s.counts", base);
        const nstf_gguf_tensor *c = nstf_gguf_find_tensor(g, cname);
        if (t->type != NSTF_TYPE_F32 || !c || c->type != NSTF_TYPE_F32 || c->n_elems != 1 || t->ne[1] != 1) {
            st = nstf_set_error(NSTF_ERR_FORMAT, "%s: %s: F32 sums of one matrix with an F32 count expected (expert "
                                                 "matrices are not supported)", path, base);
            break;
        }
        nstf_imatrix_entry *e = &im->e[im->n++];
        st = entry_init(e, base, t->ne[0]);
        const float *v = t->data;
        for (int64_t j = 0; st == NSTF_OK && j < e->n_in; j++) e->sum2[j] = v[j];
        e->count = ((const float *)c->data)[0];
    }
    if (st == NSTF_OK && im->n == 0) st = nstf_set_error(NSTF_ERR_FORMAT, "%s: no NAME.in_sum2 tensors", path);
    if (st == NSTF_OK) st = finish(im);
    if (st == NSTF_OK) snprintf(im->dataset, sizeof im->dataset, "%s", path);
    nstf_gguf_close(g);
    if (st != NSTF_OK) {
        nstf_imatrix_free(im);
        return st;
    }
    *out = im;
    return NSTF_OK;
}

const float *nstf_imatrix_weights(const nstf_imatrix *im, const char *name, int64_t n_in, nstf_status *st) {
    *st = NSTF_OK;
    for (int i = 0; im && i < im->n; i++) {
        const nstf_imatrix_entry *e = &im->e[i];
        if (strcmp(e->name, name)) continue;
        if (e->n_in != n_in)
            *st = nstf_set_error(NSTF_ERR_INVALID_ARG, "imatrix: %s has %lld columns, the tensor %lld", name,
                                 (long long)e->n_in, (long long)n_in);
        else if (!(e->count > 0))
            *st = nstf_set_error(NSTF_ERR_INVALID_ARG, "imatrix: %s was never seen (count 0)", name);
        return *st == NSTF_OK ? e->mean : NULL;
    }
    return NULL;
}
