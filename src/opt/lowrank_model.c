/* lowrank_model.c — low-rank decomposition of a model in a session:
 * calibration (X^T X of every layer matmul's inputs, gathered through the
 * backend's op hooks while the model runs over a text), one SVD per
 * targeted matrix (the matrices spread over the session's CPU threads),
 * ranks by a rule (lowrank.h), the factors put into the session's model
 * (its forward then runs MATMUL_LR for them), and the factorized GGUF
 * written out. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "model/session.h"
#include "opt/lowrank.h"

/* The seven layer matrices: flag, GGUF name, calibration group (the
 * matmul op whose input they read: 0 qkv_proj, 1 o_proj, 2 gate_up_proj,
 * 3 down_proj). */
static const struct {
    unsigned flag;
    const char *name;
    int group;
} k_kinds[7] = {
    {NSTF_LR_Q, "attn_q", 0},      {NSTF_LR_K, "attn_k", 0},    {NSTF_LR_V, "attn_v", 0},
    {NSTF_LR_O, "attn_output", 1}, {NSTF_LR_GATE, "ffn_gate", 2}, {NSTF_LR_UP, "ffn_up", 2},
    {NSTF_LR_DOWN, "ffn_down", 3},
};
static const char *const k_group_labels[4] = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};

static nstf_matrix *layer_matrix(nstf_llama_layer *L, int kind) {
    nstf_matrix *m[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return m[kind];
}

bool nstf_lowrank_parse_targets(const char *list, unsigned *out) {
    *out = 0;
    if (!list || !*list || !strcmp(list, "all")) {
        *out = NSTF_LR_ALL;
        return true;
    }
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int k = 0; k < 7; k++)
            if (strlen(k_kinds[k].name) == n && !strncmp(p, k_kinds[k].name, n)) found = k;
        if (found < 0) return false;
        *out |= k_kinds[found].flag;
        p += n + (e ? 1 : 0);
    }
    return *out != 0;
}

typedef struct lr_mat {
    int layer, kind;
    char name[64];    /* blk.N.attn_q.weight */
    nstf_matrix orig; /* the model's own */
    nstf_svd svd;
    int64_t rank;     /* at the last apply; 0: dense */
    float *fa, *fb;   /* the factors of that rank (owned) */
} lr_mat;

struct nstf_lowrank {
    nstf_session *s;
    lr_mat *m;
    int n;
    bool whiten;
};

/* ---- calibration ------------------------------------------------------------------- */

typedef struct calib {
    nstf_pool *pool;
    int l0, l1;
    double **gram; /* [(l - l0) * 4 + group] [n_in, n_in] upper triangle, or NULL: not wanted */
    int64_t *n_in;
    /* the current call */
    const float *x;
    int64_t n_tok, dim;
    double *g;
} calib;

/* G += X^T X on the upper triangle; rows i interleaved over the threads
 * (the triangle's rows shrink), four tokens at a time. */
static void gram_worker(void *p, int ith, int nth) {
    const calib *c = p;
    const int64_t n = c->dim;
    for (int64_t i = ith; i < n; i += nth) {
        double *gi = c->g + i * n;
        int64_t t = 0;
        for (; t + 4 <= c->n_tok; t += 4) {
            const float *x0 = c->x + t * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
            const double a0 = x0[i], a1 = x1[i], a2 = x2[i], a3 = x3[i];
            for (int64_t j = i; j < n; j++)
                gi[j] += a0 * x0[j] + a1 * x1[j] + a2 * x2[j] + a3 * x3[j];
        }
        for (; t < c->n_tok; t++) {
            const float *x0 = c->x + t * n;
            const double a0 = x0[i];
            for (int64_t j = i; j < n; j++) gi[j] += a0 * x0[j];
        }
    }
}

static void calib_hook(void *user, nstf_backend *be, const nstf_op_args *a) {
    (void)be;
    calib *c = user;
    if (a->op != NSTF_OP_MATMUL || a->layer < c->l0 || a->layer >= c->l1 || !a->matmul.x.data) return;
    for (int g = 0; g < 4; g++) {
        if (!a->label || strcmp(a->label, k_group_labels[g]) != 0) continue;
        double *gram = c->gram[(a->layer - c->l0) * 4 + g];
        if (!gram || a->matmul.x.type != NSTF_TYPE_F32 || a->matmul.x.stride != a->matmul.w[0]->n_in) return;
        c->x = a->matmul.x.data;
        c->n_tok = a->matmul.n;
        c->dim = a->matmul.w[0]->n_in;
        c->g = gram;
        nstf_pool_run(c->pool, gram_worker, c);
        return;
    }
}

/* ---- decomposition ------------------------------------------------------------------ */

void nstf_lowrank_free(nstf_lowrank *lr) {
    if (!lr) return;
    nstf_lowrank_restore(lr);
    for (int i = 0; i < lr->n; i++) {
        nstf_svd_free(&lr->m[i].svd);
        nstf_free(lr->m[i].fa);
        nstf_free(lr->m[i].fb);
    }
    nstf_free(lr->m);
    nstf_free(lr);
}

/* W as fp32 [n_out, n_in] (dequantized). */
static float *dense_f32(const nstf_matrix *w) {
    uint64_t rb = 0, n = 0;
    if (!nstf_type_row_bytes(w->type, w->n_in, &rb) || !nstf_mul_ok((uint64_t)w->n_in, (uint64_t)w->n_out, &n))
        return NULL;
    float *f = nstf_alloc((size_t)n * 4, "dense matrix");
    for (int64_t o = 0; f && o < w->n_out; o++)
        nstf_dequantize_row(w->type, (const unsigned char *)w->data + (uint64_t)o * rb, f + o * w->n_in, w->n_in);
    return f;
}

/* The SVDs of nstf_lowrank_create: each worker takes the next matrix until
 * none is left or one has failed (each SVD depends on its matrix only, so
 * the results do not depend on the threads); the first error's message
 * and the progress calls under the lock. */
typedef struct svd_job {
    nstf_lowrank *lr;
    const nstf_lowrank_params *p;
    const calib *c;
    int next, done; /* under mu */
    pthread_mutex_t mu;
    nstf_status st;
    char err[512];
} svd_job;

static void svd_worker(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    svd_job *j = ctx;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        const int i = j->st == NSTF_OK && j->next < j->lr->n ? j->next++ : -1;
        pthread_mutex_unlock(&j->mu);
        if (i < 0) return;
        lr_mat *e = &j->lr->m[i];
        nstf_status st = NSTF_OK;
        float *w = dense_f32(&e->orig);
        if (!w) st = nstf_set_error(NSTF_ERR_OOM, "cannot hold it as fp32");
        const double *g = j->p->whiten ? j->c->gram[(e->layer - j->c->l0) * 4 + k_kinds[e->kind].group] : NULL;
        if (st == NSTF_OK) st = nstf_svd_compute(w, e->orig.n_in, e->orig.n_out, g, &e->svd);
        nstf_free(w);
        pthread_mutex_lock(&j->mu);
        if (st != NSTF_OK && j->st == NSTF_OK) {
            j->st = st;
            snprintf(j->err, sizeof j->err, "%s: %s", e->name, nstf_last_error());
        }
        j->done++;
        if (st == NSTF_OK && j->p->progress) j->p->progress(j->p->progress_user, j->done, j->lr->n, e->name);
        pthread_mutex_unlock(&j->mu);
    }
}

nstf_status nstf_lowrank_create(nstf_session *s, const int32_t *tokens, int n, const nstf_lowrank_params *p,
                                nstf_lowrank **out) {
    *out = NULL;
    if (!nstf_lowrank_available()) return nstf_svd_compute(NULL, 0, 0, NULL, &(nstf_svd){0});
    if (!s->be->host_memory || s->run_cpu)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "low-rank decomposition runs on a CPU session (--device cpu)");
    if (p->whiten && (!tokens || n < 1))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "activation-aware SVD needs calibration text");
    nstf_llama *m = s->model;
    const nstf_llama_config *cfg = &m->cfg;
    const unsigned targets = p->targets ? p->targets : NSTF_LR_ALL;
    const int l0 = p->layer0, l1 = p->layer1 > 0 ? p->layer1 : cfg->n_layers;
    if (l0 < 0 || l1 > cfg->n_layers || l0 >= l1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "layers %d..%d of a %d-layer model", l0, l1 - 1, cfg->n_layers);
    nstf_lowrank *lr = nstf_calloc(1, sizeof *lr, "low-rank state");
    if (!lr) return NSTF_ERR_OOM;
    lr->s = s;
    lr->whiten = p->whiten;
    lr->m = nstf_calloc((size_t)(l1 - l0) * 7, sizeof *lr->m, "low-rank matrices");
    nstf_status st = lr->m ? NSTF_OK : NSTF_ERR_OOM;
    for (int l = l0; st == NSTF_OK && l < l1; l++)
        for (int k = 0; k < 7; k++) {
            if (!(targets & k_kinds[k].flag)) continue;
            const nstf_matrix *w = layer_matrix(&m->w.layers[l], k);
            if (w->factors) {
                st = nstf_set_error(NSTF_ERR_INVALID_ARG, "blk.%d.%s is already low-rank", l, k_kinds[k].name);
                break;
            }
            lr_mat *e = &lr->m[lr->n++];
            e->layer = l;
            e->kind = k;
            e->orig = *w;
            snprintf(e->name, sizeof e->name, "blk.%d.%s.weight", l, k_kinds[k].name);
        }
    /* calibration: the Gram matrices of the groups that some target reads */
    calib c = {nstf_backend_cpu_pool(s->be), l0, l1, NULL, NULL, NULL, 0, 0, NULL};
    const int n_gram = (l1 - l0) * 4;
    if (st == NSTF_OK && p->whiten) {
        c.gram = nstf_calloc((size_t)n_gram, sizeof *c.gram, "Gram table");
        c.n_in = nstf_calloc((size_t)n_gram, sizeof *c.n_in, "Gram sizes");
        if (!c.gram || !c.n_in) st = NSTF_ERR_OOM;
        for (int i = 0; st == NSTF_OK && i < lr->n; i++) {
            const int gi = (lr->m[i].layer - l0) * 4 + k_kinds[lr->m[i].kind].group;
            const int64_t d = lr->m[i].orig.n_in;
            if (c.gram[gi]) continue;
            c.n_in[gi] = d;
            c.gram[gi] = nstf_calloc((size_t)(d * d), sizeof(double), "Gram matrix");
            if (!c.gram[gi]) st = NSTF_ERR_OOM;
        }
        if (st == NSTF_OK && !c.pool) st = nstf_set_error(NSTF_ERR_INTERNAL, "calibration: no CPU thread pool");
        if (st == NSTF_OK) {
            const nstf_backend_hooks h = {calib_hook, NULL, &c}, *prev = s->be->hooks;
            s->be->hooks = &h;
            const int len = n < s->n_ctx ? n : s->n_ctx;
            for (int i = 0; st == NSTF_OK && i < len; i += s->n_batch) {
                const int chunk = len - i < s->n_batch ? len - i : s->n_batch;
                st = nstf_session_forward(s, tokens + i, chunk, i, false, NULL, NULL);
            }
            s->be->hooks = prev;
        }
        for (int gi = 0; st == NSTF_OK && gi < n_gram; gi++) { /* the lower triangle from the upper */
            double *g = c.gram[gi];
            const int64_t d = c.n_in[gi];
            for (int64_t i = 0; g && i < d; i++)
                for (int64_t j = 0; j < i; j++) g[i * d + j] = g[j * d + i];
        }
    }
    /* one SVD per matrix, the matrices spread over the CPU pool */
    if (st == NSTF_OK) {
        svd_job job = {lr, p, &c, 0, 0, PTHREAD_MUTEX_INITIALIZER, NSTF_OK, ""};
        if (c.pool) nstf_pool_run(c.pool, svd_worker, &job);
        else svd_worker(&job, 0, 1);
        pthread_mutex_destroy(&job.mu);
        if (job.st != NSTF_OK) st = nstf_set_error(job.st, "%s", job.err);
    }
    for (int gi = 0; c.gram && gi < n_gram; gi++) nstf_free(c.gram[gi]);
    nstf_free(c.gram);
    nstf_free(c.n_in);
    if (st != NSTF_OK) {
        nstf_lowrank_free(lr);
        return st;
    }
    *out = lr;
    return NSTF_OK;
}

/* ---- ranks and factors ------------------------------------------------------------------ */

static uint64_t dense_params(const lr_mat *e) { return (uint64_t)e->orig.n_in * (uint64_t)e->orig.n_out; }

static int64_t rank_rule(const lr_mat *e, const nstf_lowrank_params *p, double keep) {
    const int64_t ni = e->orig.n_in, no = e->orig.n_out;
    switch (p->alloc) {
    case NSTF_LR_UNIFORM: return nstf_lowrank_rank_budget(ni, no, 1.0 - p->reduce);
    case NSTF_LR_ENERGY_AT: return nstf_lowrank_rank_rule(e->svd.s, e->svd.k, ni, no, keep, 0.0);
    case NSTF_LR_ENERGY: break;
    }
    return nstf_lowrank_rank_rule(e->svd.s, e->svd.k, ni, no, keep, p->min_saving > 0 ? p->min_saving : 0.1);
}

/* The rule's rank, rounded down to a multiple of p->rank_multiple (never
 * below one multiple; a matrix whose full rank is below it keeps the
 * rule's rank); 0 stays 0 (dense). */
static int64_t rank_for(const lr_mat *e, const nstf_lowrank_params *p, double keep) {
    const int64_t r = rank_rule(e, p, keep), m = p->rank_multiple;
    if (r < 1 || m <= 1 || e->svd.k < m) return r;
    return r < m ? m : r - r % m;
}

static uint64_t params_at(const nstf_lowrank *lr, const nstf_lowrank_params *p, double keep) {
    uint64_t t = 0;
    for (int i = 0; i < lr->n; i++) {
        const lr_mat *e = &lr->m[i];
        const int64_t r = rank_for(e, p, keep);
        t += r > 0 ? (uint64_t)r * (uint64_t)(e->orig.n_in + e->orig.n_out) : dense_params(e);
    }
    return t;
}

void nstf_lowrank_restore(nstf_lowrank *lr) {
    for (int i = 0; i < lr->n; i++) (void)nstf_lowrank_set(lr, i, 0);
}

nstf_status nstf_lowrank_apply(nstf_lowrank *lr, const nstf_lowrank_params *p, uint64_t *before, uint64_t *after) {
    if ((p->alloc == NSTF_LR_UNIFORM || p->alloc == NSTF_LR_ENERGY_AT) && !(p->reduce > 0 && p->reduce < 1))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "reduction %g must be in (0, 1)", p->reduce);
    if (p->alloc == NSTF_LR_ENERGY && !(p->keep > 0 && p->keep <= 1))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "energy fraction %g must be in (0, 1]", p->keep);
    if (p->rank_multiple < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "rank multiple %d must be >= 0", p->rank_multiple);
    nstf_lowrank_restore(lr);
    uint64_t total = 0;
    for (int i = 0; i < lr->n; i++) total += dense_params(&lr->m[i]);
    double keep = p->keep;
    if (p->alloc == NSTF_LR_ENERGY_AT) { /* the largest keep whose parameters fit the budget */
        const double budget = (1.0 - p->reduce) * (double)total;
        double lo = 0, hi = 1;
        for (int it = 0; it < 50; it++) {
            const double mid = 0.5 * (lo + hi);
            if ((double)params_at(lr, p, mid) <= budget) lo = mid;
            else hi = mid;
        }
        keep = lo;
    }
    for (int i = 0; i < lr->n; i++) {
        nstf_status st = nstf_lowrank_set(lr, i, rank_for(&lr->m[i], p, keep));
        if (st != NSTF_OK) {
            nstf_lowrank_restore(lr);
            return st;
        }
    }
    if (before) *before = total;
    if (after) *after = params_at(lr, p, keep);
    return NSTF_OK;
}

nstf_status nstf_lowrank_set(nstf_lowrank *lr, int i, int64_t r) {
    if (i < 0 || i >= lr->n) return nstf_set_error(NSTF_ERR_INVALID_ARG, "low-rank matrix %d of %d", i, lr->n);
    lr_mat *e = &lr->m[i];
    nstf_llama *m = lr->s->model;
    const int64_t ni = e->orig.n_in, no = e->orig.n_out;
    nstf_matrix *slot = layer_matrix(&m->w.layers[e->layer], e->kind);
    *slot = e->orig;
    e->rank = 0;
    nstf_free(e->fa), nstf_free(e->fb);
    e->fa = e->fb = NULL;
    if (r < 1) return NSTF_OK;
    if (r > e->svd.k) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: rank %lld > %lld", e->name, (long long)r,
                                            (long long)e->svd.k);
    e->fa = nstf_alloc((size_t)(r * ni) * 4, "factor A");
    e->fb = nstf_alloc((size_t)(r * no) * 4, "factor B");
    if (!e->fa || !e->fb) return NSTF_ERR_OOM;
    nstf_svd_factors(&e->svd, r, e->fa, e->fb);
    nstf_matrix *fac = m->w.factors + (size_t)14 * e->layer + 2 * e->kind;
    fac[0] = (nstf_matrix){e->fa, NSTF_TYPE_F32, ni, r, NULL};
    fac[1] = (nstf_matrix){e->fb, NSTF_TYPE_F32, r, no, NULL};
    *slot = (nstf_matrix){NULL, NSTF_TYPE_F32, ni, no, fac};
    e->rank = r;
    return NSTF_OK;
}

int nstf_lowrank_find(const nstf_lowrank *lr, int layer, int kind) {
    for (int i = 0; i < lr->n; i++)
        if (lr->m[i].layer == layer && lr->m[i].kind == kind) return i;
    return -1;
}

void nstf_lowrank_shape(const nstf_lowrank *lr, int i, int64_t *n_in, int64_t *n_out) {
    *n_in = lr->m[i].orig.n_in;
    *n_out = lr->m[i].orig.n_out;
}

int nstf_lowrank_count(const nstf_lowrank *lr) { return lr->n; }

int64_t nstf_lowrank_rank_of(const nstf_lowrank *lr, int i, const char **name) {
    if (i < 0 || i >= lr->n) return -1;
    if (name) *name = lr->m[i].name;
    return lr->m[i].rank;
}

/* ---- the file --------------------------------------------------------------------------- */

/* A factor as a tensor of type t: ne = [n_in, n_out]. */
static nstf_status add_factor(nstf_gguf_writer *w, const char *name, nstf_type t, const float *f, int64_t n_in,
                              int64_t n_out) {
    uint64_t rb = 0;
    if (!nstf_type_row_bytes(t, n_in, &rb))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: rows of %lld values cannot be %s", name, (long long)n_in,
                              nstf_type_name(t));
    unsigned char *buf = nstf_alloc((size_t)(rb * (uint64_t)n_out), "factor tensor");
    if (!buf) return NSTF_ERR_OOM;
    for (int64_t o = 0; o < n_out; o++) (void)nstf_quantize_row(t, f + o * n_in, buf + (uint64_t)o * rb, n_in);
    const int64_t ne[2] = {n_in, n_out};
    nstf_status st = nstf_gguf_writer_add_tensor(w, name, t, 2, ne, buf);
    nstf_free(buf);
    return st;
}

nstf_status nstf_lowrank_write(nstf_lowrank *lr, const char *out_path, nstf_type ftype) {
    if (!nstf_type_can_quantize(ftype))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "factors of type %s cannot be written", nstf_type_name(ftype));
    const nstf_gguf *g = lr->s->model->file;
    nstf_gguf_writer *w = NULL;
    NSTF_TRY(nstf_gguf_writer_create(&w));
    nstf_status st = NSTF_OK;
    int n_fact = 0;
    for (int i = 0; i < lr->n; i++) n_fact += lr->m[i].rank > 0;
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_kv; i++)
        if (g->kv[i].key.len < 13 || strncmp(g->kv[i].key.ptr, "nstf.lowrank.", 13) != 0)
            st = nstf_gguf_writer_copy_kv(w, &g->kv[i]);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "nstf.lowrank.version", 1);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_str(w, "nstf.lowrank.method", lr->whiten ? "svd-whitened" : "svd");
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "nstf.lowrank.count", (uint32_t)n_fact);
    char name[600];
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        if (t->name.len >= 512) {
            st = nstf_set_error(NSTF_ERR_FORMAT, "a tensor name of %llu bytes", (unsigned long long)t->name.len);
            break;
        }
        memcpy(name, t->name.ptr, (size_t)t->name.len);
        name[t->name.len] = 0;
        const lr_mat *e = NULL;
        for (int k = 0; k < lr->n && !e; k++)
            if (lr->m[k].rank > 0 && !strcmp(lr->m[k].name, name)) e = &lr->m[k];
        if (!e) {
            st = nstf_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        const size_t base = strlen(name) - 7; /* without ".weight" */
        char an[600], bn[600];
        snprintf(an, sizeof an, "%.*s.lr_a.weight", (int)base, name);
        snprintf(bn, sizeof bn, "%.*s.lr_b.weight", (int)base, name);
        st = add_factor(w, an, ftype, e->fa, e->orig.n_in, e->rank);
        if (st == NSTF_OK) st = add_factor(w, bn, ftype, e->fb, e->rank, e->orig.n_out);
    }
    if (st == NSTF_OK) st = nstf_gguf_writer_write_replace(w, out_path, (uint32_t)g->alignment);
    nstf_gguf_writer_free(w);
    return st;
}
