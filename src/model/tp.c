/* tp.c — tensor-parallel runs (llama.h, nstf_llama_run_create_tp): the
 * model split into one shard per rank, each shard placed on its backend
 * as an ordinary run, and the group's forward.
 *
 * A shard is an nstf_llama of its own whose config has the rank's share
 * of the heads (n_heads, n_kv_heads) and of the feed-forward width
 * (ffn_dim), and whose weights are views of the model's:
 *   - column-parallel (a share of the output rows: contiguous in the
 *     file, so plain views): Q, K, V (and their biases), gate, up, and the
 *     output matrix (the rank's vocabulary share);
 *   - row-parallel (a share of the input columns: copied on the host into
 *     matrices of their own, whole quantization blocks): O and down;
 *   - replicated: the embedding, every norm, the RoPE factors.
 * The forward (forward.c) is unchanged but for two all-reduces per layer
 * (after O and after down: the block outputs are partial sums) and the
 * logits, which each rank computes for its vocabulary share. This file
 * runs the ranks' forwards at once on the communicator's threads and
 * gathers the logits shares on the host (the greedy token from them).
 *
 * Launched by mpirun (dist/proc.h), a process holds one rank: it makes
 * that rank's shard only, its run stands for the group in this process,
 * and the logits shares are gathered between the processes, so that
 * every process holds the same logits (and, running the same host loop
 * with the same seed, picks the same tokens). */
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "core/switches.h"
#include "dist/comm.h"
#include "dist/proc.h"
#include "model/llama.h"

typedef struct nstf_llama_tp {
    int n;
    int self;                      /* a launch by mpirun: this process's rank (the others' runs are elsewhere); -1 */
    float *gather;                 /* self >= 0: host [n][n_batch x the widest share] the processes' shares */
    nstf_comm *comm;
    nstf_llama shard[NSTF_COMM_MAX];
    nstf_llama_layer *layers[NSTF_COMM_MAX];
    void *copies[NSTF_COMM_MAX]; /* the row-parallel matrices of each shard (host) */
    nstf_llama_run *runs[NSTF_COMM_MAX];
    int64_t v0[NSTF_COMM_MAX + 1]; /* the vocabulary split: rank r has rows [v0[r], v0[r + 1]) */
    float *part[NSTF_COMM_MAX];    /* host [n_batch, share] each rank's logits */
    float *row;                    /* host [n_vocab] the last row, for the greedy token */
    bool lead;                     /* rank 0 of a launch's server: each forward's batch goes to the others first */
    int timeout_ms;                /* the communicator's stall timeout */
    int n_seq, n_ctx, kv_block;    /* the runs' shape (a batch's block table: n_seq x n_ctx / kv_block) */
} nstf_llama_tp;

/* [lo, hi) of part r of n over total, in whole units. */
static void split(int64_t total, int64_t unit, int n, int r, int64_t *lo, int64_t *hi) {
    const int64_t units = total / unit;
    *lo = units * r / n * unit;
    *hi = units * (r + 1) / n * unit;
}

/* Rows [r0, r1) of w: a view. */
static nstf_status rows_view(const nstf_matrix *w, int64_t r0, int64_t r1, nstf_matrix *out) {
    uint64_t rb;
    if (!nstf_type_row_bytes(w->type, w->n_in, &rb)) return nstf_set_error(NSTF_ERR_RANGE, "bad row size");
    *out = *w;
    out->data = (const char *)w->data + (uint64_t)r0 * rb;
    out->n_out = r1 - r0;
    return NSTF_OK;
}

/* Columns [c0, c1) of w copied to dst (whole blocks: the caller checked). */
static nstf_status cols_copy(const nstf_matrix *w, int64_t c0, int64_t c1, char *dst, nstf_matrix *out) {
    uint64_t rb, off, len;
    if (!nstf_type_row_bytes(w->type, w->n_in, &rb) || !nstf_type_row_bytes(w->type, c0, &off) ||
        !nstf_type_row_bytes(w->type, c1 - c0, &len))
        return nstf_set_error(NSTF_ERR_RANGE, "bad row size");
    for (int64_t i = 0; i < w->n_out; i++) memcpy(dst + (uint64_t)i * len, (const char *)w->data + (uint64_t)i * rb + off, len);
    *out = (nstf_matrix){dst, w->type, c1 - c0, w->n_out, NULL};
    return NSTF_OK;
}

static bool block_ok(nstf_type t, int64_t c) { return c % nstf_type_block_elems(t) == 0; }

/* Shard r of m (the rank's config and weight views; copies of O and down). */
static nstf_status shard_make(nstf_llama_tp *g, const nstf_llama *m, int r) {
    const nstf_llama_config *c = &m->cfg;
    const int n = g->n, grp = c->n_heads / c->n_kv_heads;
    const int64_t hd = c->head_dim;
    int64_t k0, k1, f0, f1;
    split(c->n_kv_heads, 1, n, r, &k0, &k1);
    if (k1 <= k0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "tensor parallel: %d KV heads cannot be split over %d ranks",
                              c->n_kv_heads, n);
    /* the feed-forward split in whole blocks of down's columns (at least 64) */
    int64_t fu = nstf_type_block_elems(m->w.layers[0].w_down.type);
    if (fu < 64) fu = 64;
    if (c->ffn_dim % fu != 0 || c->ffn_dim / fu < n)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "tensor parallel: a feed-forward width of %d does not split into %d shares of whole "
                              "%lld-column blocks",
                              c->ffn_dim, n, (long long)fu);
    split(c->ffn_dim, fu, n, r, &f0, &f1);
    const int64_t q0 = k0 * grp * hd, q1 = k1 * grp * hd;
    nstf_llama *s = &g->shard[r];
    *s = *m;
    s->file = NULL;
    s->cfg.n_heads = (int)((k1 - k0) * grp);
    s->cfg.n_kv_heads = (int)(k1 - k0);
    s->cfg.ffn_dim = (int)(f1 - f0);
    s->cfg.tied_output = false;
    s->w.norms = NULL;
    s->w.norm_floats = 0;
    s->w.factors = NULL;
    g->layers[r] = nstf_calloc((size_t)c->n_layers, sizeof *g->layers[r], "shard layers");
    if (!g->layers[r]) return NSTF_ERR_OOM;
    s->w.layers = g->layers[r];
    /* the copies: every layer's O and down column shares, one allocation */
    uint64_t total = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const nstf_llama_layer *L = &m->w.layers[l];
        const nstf_matrix *mats[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (mats[i]->factors)
                return nstf_set_error(NSTF_ERR_UNSUPPORTED, "tensor parallel: layer %d has low-rank matrices", l);
        if (!block_ok(L->wo.type, q0) || !block_ok(L->wo.type, q1) || !block_ok(L->w_down.type, f0) ||
            !block_ok(L->w_down.type, f1))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "tensor parallel: layer %d's O / down shares over %d ranks do not fall on whole "
                                  "quantization blocks (%s, %s); try another rank count",
                                  l, n, nstf_type_name(L->wo.type), nstf_type_name(L->w_down.type));
        uint64_t a, b;
        if (!nstf_type_row_bytes(L->wo.type, q1 - q0, &a) || !nstf_mul_ok(a, (uint64_t)L->wo.n_out, &a) ||
            !nstf_type_row_bytes(L->w_down.type, f1 - f0, &b) || !nstf_mul_ok(b, (uint64_t)L->w_down.n_out, &b) ||
            !nstf_add_ok(total, ((a + 63) & ~(uint64_t)63) + ((b + 63) & ~(uint64_t)63), &total))
            return nstf_set_error(NSTF_ERR_RANGE, "tensor parallel: shard size overflows");
    }
    char *buf = g->copies[r] = nstf_alloc((size_t)total ? (size_t)total : 1, "row-parallel shard");
    if (!buf) return NSTF_ERR_OOM;
    for (int l = 0; l < c->n_layers; l++) {
        const nstf_llama_layer *L = &m->w.layers[l];
        nstf_llama_layer *D = &g->layers[r][l];
        *D = *L;
        NSTF_TRY(rows_view(&L->wq, q0, q1, &D->wq));
        NSTF_TRY(rows_view(&L->wk, k0 * hd, k1 * hd, &D->wk));
        NSTF_TRY(rows_view(&L->wv, k0 * hd, k1 * hd, &D->wv));
        NSTF_TRY(rows_view(&L->w_gate, f0, f1, &D->w_gate));
        NSTF_TRY(rows_view(&L->w_up, f0, f1, &D->w_up));
        if (L->bq) {
            D->bq = L->bq + q0;
            D->bk = L->bk + k0 * hd;
            D->bv = L->bv + k0 * hd;
        }
        uint64_t a, b;
        (void)nstf_type_row_bytes(L->wo.type, q1 - q0, &a);
        (void)nstf_type_row_bytes(L->w_down.type, f1 - f0, &b);
        NSTF_TRY(cols_copy(&L->wo, q0, q1, buf, &D->wo));
        buf += ((a * (uint64_t)L->wo.n_out) + 63) & ~(uint64_t)63;
        NSTF_TRY(cols_copy(&L->w_down, f0, f1, buf, &D->w_down));
        buf += ((b * (uint64_t)L->w_down.n_out) + 63) & ~(uint64_t)63;
    }
    const nstf_matrix *out = c->tied_output ? &m->w.tok_embd : &m->w.output;
    return rows_view(out, g->v0[r], g->v0[r + 1], &s->w.output);
}

static void tp_free(nstf_llama_tp *g) {
    if (!g) return;
    for (int r = g->n - 1; r >= 0; r--) {
        if (g->runs[r]) {
            g->runs[r]->tp = NULL; /* free the run alone */
            nstf_llama_run_free(g->runs[r]);
        }
        nstf_free(g->layers[r]);
        nstf_free(g->copies[r]);
        nstf_free(g->part[r]);
    }
    nstf_comm_free(g->comm);
    nstf_free(g->row);
    nstf_free(g->gather);
    nstf_free(g);
}

void nstf_llama_tp_free(nstf_llama_run *r) { tp_free(r->tp); }

typedef struct create_job {
    nstf_llama_tp *g;
    nstf_backend *const *be;
    const nstf_llama_run_shape *shape;
    int64_t m_dim; /* the model's width: a decode step's all-reduce */
} create_job;

/* Each rank places its shard from its own thread (its device current). */
static nstf_status create_rank(void *ctx, int r) {
    create_job *j = ctx;
    NSTF_TRY(nstf_llama_run_create_shaped(&j->g->shard[r], j->be[r], j->shape, &j->g->runs[r]));
    j->g->runs[r]->tp = j->g;
    j->g->runs[r]->tp_rank = r;
    if (!j->be[r]->host_memory) { /* a device holds its own copy now */
        nstf_free(j->g->copies[r]);
        j->g->copies[r] = NULL;
        /* a decode step's all-reduces (dim floats) on the peer path are
         * kernels a graph captures with the step; NCCL's are not */
        if (!nstf_comm_capturable(j->g->comm, j->m_dim)) NSTF_TRY(j->be[r]->vt->set_opt(j->be[r], NSTF_OPT_GRAPHS, 0));
    }
    return NSTF_OK;
}

/* The widest vocabulary share. */
static int64_t widest(const nstf_llama_tp *g) {
    int64_t w = 0;
    for (int r = 0; r < g->n; r++)
        if (g->v0[r + 1] - g->v0[r] > w) w = g->v0[r + 1] - g->v0[r];
    return w;
}

/* A launch's processes: every rank's share of the first rows rows of
 * the logits into part[], through the processes' all-gather (each share
 * padded to the widest). */
static nstf_status gather_shares(nstf_llama_tp *g, int64_t rows) {
    const int64_t w = widest(g), mine = g->v0[g->self + 1] - g->v0[g->self];
    float *slot = g->gather + (size_t)g->self * (size_t)rows * (size_t)w;
    for (int64_t i = 0; i < rows; i++) memcpy(slot + i * w, g->part[g->self] + i * mine, (size_t)mine * sizeof(float));
    NSTF_TRY(nstf_comm_host_allgather(g->comm, g->self, slot, g->gather, (size_t)rows * (size_t)w * sizeof(float)));
    for (int q = 0; q < g->n; q++) {
        const int64_t share = g->v0[q + 1] - g->v0[q];
        const float *from = g->gather + (size_t)q * (size_t)rows * (size_t)w;
        if (q != g->self)
            for (int64_t i = 0; i < rows; i++)
                memcpy(g->part[q] + i * share, from + i * w, (size_t)share * sizeof(float));
    }
    return NSTF_OK;
}

nstf_status nstf_llama_run_create_tp(const nstf_llama *m, nstf_backend *const *be, int n,
                                     const nstf_llama_run_shape *shape, int timeout_ms, nstf_llama_run **out) {
    *out = NULL;
    const nstf_llama_config *c = &m->cfg;
    if (n < 1 || n > NSTF_COMM_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor parallel over %d ranks (1..%d)", n, NSTF_COMM_MAX);
    if (shape->l0 != 0 || shape->l1 != c->n_layers || !shape->embed || !shape->output)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "tensor parallel: a stage of the model cannot be split");
    const int self = nstf_proc_active() ? nstf_proc_rank() : -1;
    if (self >= 0 && n != nstf_proc_size())
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor parallel over %d ranks in a launch of %d processes", n,
                              nstf_proc_size());
    nstf_llama_tp *g = nstf_calloc(1, sizeof *g, "tensor-parallel group");
    if (!g) return NSTF_ERR_OOM;
    g->n = n;
    g->self = self;
    g->timeout_ms = timeout_ms > 0 ? timeout_ms : NSTF_COMM_TIMEOUT_MS;
    g->n_seq = shape->n_seq, g->n_ctx = shape->n_ctx, g->kv_block = shape->kv_block;
    const int64_t vu = c->n_vocab % (64 * n) == 0 ? 64 : 1;
    for (int r = 0; r <= n; r++) g->v0[r] = c->n_vocab / vu * r / n * vu;
    nstf_status st = NSTF_OK;
    for (int r = 0; r < n && st == NSTF_OK; r++)
        if (self < 0 || r == self) st = shard_make(g, m, r);
    if (st == NSTF_OK && self >= 0) st = nstf_comm_create_proc(be[self], timeout_ms, &g->comm);
    else if (st == NSTF_OK) st = nstf_comm_create(be, n, timeout_ms, &g->comm);
    const int stall = nstf_switch_int(NSTF_SW_TP_STALL_AT); /* a fault test's stalled rank */
    if (st == NSTF_OK && stall > 0) nstf_comm_fault(g->comm, n - 1, stall - 1);
    if (st == NSTF_OK) {
        create_job j = {g, be, shape, c->dim};
        st = nstf_comm_run(g->comm, create_rank, &j);
    }
    for (int r = 0; r < n && st == NSTF_OK; r++) {
        const int64_t rows = shape->n_batch, share = g->v0[r + 1] - g->v0[r];
        g->part[r] = nstf_alloc((size_t)rows * (size_t)share * sizeof(float), "logits share");
        if (!g->part[r]) st = NSTF_ERR_OOM;
    }
    if (st == NSTF_OK && !(g->row = nstf_alloc((size_t)c->n_vocab * sizeof(float), "logits row"))) st = NSTF_ERR_OOM;
    if (st == NSTF_OK && self >= 0) {
        const size_t gb = (size_t)n * (size_t)shape->n_batch * (size_t)widest(g) * sizeof(float);
        if (!(g->gather = nstf_alloc(gb, "logits gather"))) st = NSTF_ERR_OOM;
    }
    if (st != NSTF_OK) {
        tp_free(g);
        return st;
    }
    *out = g->runs[self >= 0 ? self : 0];
    return NSTF_OK;
}

const char *nstf_llama_run_tp_transport(const nstf_llama_run *r) { return r->tp ? nstf_comm_transport(r->tp->comm) : NULL; }

nstf_status nstf_llama_tp_allreduce(nstf_llama_run *r, float *buf, float *dst, int64_t n, bool *added) {
    return nstf_comm_allreduce_add(r->tp->comm, r->tp_rank, buf, dst, n, added);
}

typedef struct fwd_job {
    nstf_llama_tp *g;
    const nstf_batch *b;
} fwd_job;

static nstf_status forward_rank(void *ctx, int r) {
    fwd_job *j = ctx;
    nstf_batch b = *j->b;
    b.argmax = b.argmax_rows = false; /* greedy tokens come from the gathered logits */
    b.host_rows = 0;
    return nstf_llama_stage_forward(j->g->runs[r], &b, j->g->part[r], NULL);
}

/* ---- a launch's server: rank 0 leads, the other processes follow ----
 *
 * A server takes its requests on rank 0 alone; the other processes must
 * still run every forward with the same batch. So rank 0's forward first
 * sends its batch: a header (tp_msg), then the batch's int32 arrays
 * (tokens, positions, slots, rows, block table), each broadcast from rank
 * 0 (nstf_proc_bcast0); the followers' loop receives each and runs the
 * forward on its shard, until the end message. */
enum { TP_MSG_STEP = 1, TP_MSG_END = 2 };
enum { TPF_SEQ = 1, TPF_ALL = 2, TPF_ARGMAX = 4, TPF_ARGMAX_ROWS = 8, TPF_ROW_INV = 16, TPF_ROWS = 32, TPF_BLOCKS = 64 };
typedef struct tp_msg {
    int64_t kind, n, n_rows, host_rows, n_blocks, flags;
} tp_msg;
#define TP_FOLLOW_WAIT_MS (7 * 24 * 3600 * 1000) /* a follower waits for the next step at the clients' pace */

static int64_t msg_ints(const tp_msg *h) {
    return h->n * (2 + ((h->flags & TPF_SEQ) != 0)) + ((h->flags & TPF_ROWS) ? h->n_rows : 0) +
           ((h->flags & TPF_BLOCKS) ? h->n_blocks : 0);
}

/* Rank 0's h and payload to every process (a follower's are replaced:
 * *payload malloc'd there). wait_ms: how long a follower waits for the
 * header. */
static nstf_status msg_exchange(nstf_llama_tp *g, tp_msg *h, int32_t **payload, int wait_ms) {
    NSTF_TRY(nstf_proc_bcast0(h, sizeof *h, g->self == 0 ? g->timeout_ms : wait_ms));
    const int64_t ni = msg_ints(h);
    if (ni <= 0) return NSTF_OK;
    if (ni > INT32_MAX / 4 / g->n) return nstf_set_error(NSTF_ERR_RANGE, "tensor parallel: a step of %lld values", (long long)ni);
    if (g->self != 0 && !(*payload = nstf_calloc((size_t)ni, sizeof(int32_t), "tensor-parallel step"))) return NSTF_ERR_OOM;
    return nstf_proc_bcast0(*payload, (size_t)ni * sizeof(int32_t), g->timeout_ms);
}

/* Rank 0: b to the followers. */
static nstf_status lead_step(nstf_llama_tp *g, const nstf_batch *b) {
    tp_msg h = {TP_MSG_STEP, b->n, b->rows ? b->n_rows : 0, b->host_rows, 0, 0};
    h.flags = (b->seq ? TPF_SEQ : 0) | (b->all_logits ? TPF_ALL : 0) | (b->argmax ? TPF_ARGMAX : 0) |
              (b->argmax_rows ? TPF_ARGMAX_ROWS : 0) | (b->row_invariant ? TPF_ROW_INV : 0) | (b->rows ? TPF_ROWS : 0) |
              (b->blocks ? TPF_BLOCKS : 0);
    if (b->blocks && g->kv_block > 0) h.n_blocks = (int64_t)g->n_seq * (g->n_ctx / g->kv_block);
    else h.flags &= ~TPF_BLOCKS; /* (only a paged run takes a block table) */
    int32_t *p = nstf_alloc((size_t)(msg_ints(&h) > 0 ? msg_ints(&h) : 1) * sizeof(int32_t), "tensor-parallel step");
    if (!p) return NSTF_ERR_OOM;
    int32_t *q = p;
    memcpy(q, b->tokens, (size_t)b->n * 4), q += b->n;
    memcpy(q, b->pos, (size_t)b->n * 4), q += b->n;
    if (b->seq) memcpy(q, b->seq, (size_t)b->n * 4), q += b->n;
    if (b->rows) memcpy(q, b->rows, (size_t)h.n_rows * 4), q += h.n_rows;
    if (h.flags & TPF_BLOCKS) memcpy(q, b->blocks, (size_t)h.n_blocks * 4);
    const nstf_status st = msg_exchange(g, &h, &p, 0);
    nstf_free(p);
    return st;
}

nstf_status nstf_llama_tp_lead(nstf_llama_run *r) {
    nstf_llama_tp *g = r->tp;
    if (!g || g->self < 0) return NSTF_OK; /* one process drives every rank */
    if (g->self != 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor parallel: rank %d cannot lead", g->self);
    g->lead = true;
    return NSTF_OK;
}

nstf_status nstf_llama_tp_lead_end(nstf_llama_run *r) {
    nstf_llama_tp *g = r->tp;
    if (!g || !g->lead) return NSTF_OK;
    g->lead = false;
    tp_msg h = {TP_MSG_END, 0, 0, 0, 0, 0};
    int32_t *none = NULL;
    return msg_exchange(g, &h, &none, 0);
}

nstf_status nstf_llama_tp_follow(nstf_llama_run *r) {
    nstf_llama_tp *g = r->tp;
    if (!g || g->self <= 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor parallel: only a launch's ranks above 0 follow");
    for (;;) {
        tp_msg h = {0};
        int32_t *p = NULL;
        nstf_status st = msg_exchange(g, &h, &p, TP_FOLLOW_WAIT_MS);
        if (st == NSTF_OK && h.kind == TP_MSG_END) return NSTF_OK;
        if (st == NSTF_OK && (h.kind != TP_MSG_STEP || h.n < 1 || h.n > INT32_MAX))
            st = nstf_set_error(NSTF_ERR_FORMAT, "tensor parallel: a step message of kind %lld, %lld tokens",
                                (long long)h.kind, (long long)h.n);
        if (st == NSTF_OK) {
            const int32_t *q = p;
            nstf_batch b = {0};
            b.n = (int)h.n;
            b.tokens = q, q += h.n;
            b.pos = q, q += h.n;
            if (h.flags & TPF_SEQ) b.seq = q, q += h.n;
            if (h.flags & TPF_ROWS) b.rows = q, b.n_rows = (int)h.n_rows, q += h.n_rows;
            if (h.flags & TPF_BLOCKS) b.blocks = q;
            b.all_logits = (h.flags & TPF_ALL) != 0;
            b.argmax = (h.flags & TPF_ARGMAX) != 0;
            b.argmax_rows = (h.flags & TPF_ARGMAX_ROWS) != 0;
            b.row_invariant = (h.flags & TPF_ROW_INV) != 0;
            b.host_rows = (int)h.host_rows;
            st = nstf_llama_forward(r, &b, NULL, NULL);
        }
        nstf_free(p);
        NSTF_TRY(st);
    }
}

nstf_status nstf_llama_tp_forward(nstf_llama_run *r, const nstf_batch *b, float *logits, int32_t *argmax) {
    nstf_llama_tp *g = r->tp;
    if (r->tp_rank != (g->self >= 0 ? g->self : 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor parallel: forward on rank %d", r->tp_rank);
    if (g->lead) NSTF_TRY(lead_step(g, b));
    fwd_job j = {g, b};
    NSTF_TRY(nstf_comm_run(g->comm, forward_rank, &j));
    const int64_t nv = g->v0[g->n], rows = b->rows ? b->n_rows : b->all_logits ? b->n : 1;
    if (g->self >= 0) NSTF_TRY(gather_shares(g, rows));
    const int64_t host = b->argmax_rows ? b->host_rows : rows; /* rows whose logits the caller takes */
    for (int64_t i = 0; i < rows; i++) {
        const bool want = argmax && (b->argmax_rows || i == rows - 1);
        if (i >= host && !want) continue;
        for (int q = 0; q < g->n; q++) { /* row i of the full logits: every rank's share, in rank order */
            const int64_t share = g->v0[q + 1] - g->v0[q];
            memcpy(g->row + g->v0[q], g->part[q] + i * share, (size_t)share * sizeof(float));
        }
        if (logits && i < host) memcpy(logits + i * nv, g->row, (size_t)nv * sizeof(float));
        if (want) { /* the first of the largest, as the argmax op */
            int32_t best = 0;
            for (int64_t v = 1; v < nv; v++)
                if (g->row[v] > g->row[best]) best = (int32_t)v;
            argmax[b->argmax_rows ? i : 0] = best;
        }
    }
    return NSTF_OK;
}
