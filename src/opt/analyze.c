/* analyze.c — per-matrix sensitivity: each targeted matrix swapped alone
 * for each candidate (a re-quantized copy, or its low-rank factors), the
 * model evaluated over the text, and its scores against the unmodified
 * model's (analyze.h). The CPU run reads the model's layer table in
 * place, so a swap is one struct assignment. */
#include "opt/analyze.h"
#include "opt/imatrix.h"

#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "model/session.h"
#include "opt/lowrank.h"

static const char *const k_names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

const char *nstf_analyze_kind_name(int kind) { return kind >= 0 && kind < 7 ? k_names[kind] : "?"; }

nstf_matrix *nstf_analyze_slot(nstf_llama_layer *L, int kind) {
    nstf_matrix *m[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return m[kind];
}

void nstf_analyze_result_free(nstf_analyze_result *r) {
    if (!r) return;
    nstf_free(r->rows);
    memset(r, 0, sizeof *r);
}

void *nstf_analyze_requantize(const nstf_matrix *w, nstf_type t, const float *qw) {
    uint64_t rb_in = 0, rb_out = 0;
    if (!nstf_type_row_bytes(w->type, w->n_in, &rb_in) || !nstf_type_row_bytes(t, w->n_in, &rb_out)) return NULL;
    unsigned char *dst = nstf_alloc((size_t)(rb_out * (uint64_t)w->n_out), "candidate matrix");
    float *row = nstf_alloc((size_t)w->n_in * 4, "row");
    for (int64_t o = 0; dst && row && o < w->n_out; o++) {
        nstf_dequantize_row(w->type, (const unsigned char *)w->data + (uint64_t)o * rb_in, row, w->n_in);
        (void)nstf_quantize_row_w(t, row, dst + (uint64_t)o * rb_out, w->n_in, qw);
    }
    nstf_free(row);
    if (!row) {
        nstf_free(dst);
        return NULL;
    }
    return dst;
}

typedef struct run_ctx {
    nstf_session *s;
    const int32_t *ids;
    int n, nv;
    const float *ref;
    float *lp;
    nstf_analyze_result *out;
    const nstf_analyze_params *p;
    int done, total;
} run_ctx;

static nstf_status evaluate(run_ctx *c, int layer, int kind, const char *cand, double bpw) {
    NSTF_TRY(nstf_eval_logprobs(c->s, c->ids, c->n, c->lp));
    nstf_analyze_row *r = &c->out->rows[c->out->n_rows++];
    snprintf(r->tensor, sizeof r->tensor, "blk.%d.%s.weight", layer, k_names[kind]);
    snprintf(r->candidate, sizeof r->candidate, "%s", cand);
    r->layer = layer;
    r->bpw = bpw;
    nstf_eval_scores(c->lp, c->ref, c->ids, c->n, c->nv, 0, &r->score);
    c->done++;
    if (c->p->progress) {
        char what[112];
        snprintf(what, sizeof what, "%s %s", r->tensor, cand);
        c->p->progress(c->p->progress_user, c->done, c->total, what);
    }
    return NSTF_OK;
}

nstf_status nstf_analyze_run(nstf_session *s, const int32_t *ids, int n, const nstf_analyze_params *p,
                             nstf_analyze_result *out) {
    memset(out, 0, sizeof *out);
    if (!s->be->host_memory || s->run_cpu)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf analyze runs on a CPU session (--device cpu)");
    nstf_llama *m = s->model;
    const int L = m->cfg.n_layers, l0 = p->layer0, l1 = p->layer1 > 0 ? p->layer1 : L;
    const unsigned targets = p->targets ? p->targets : NSTF_LR_ALL;
    if (l0 < 0 || l1 > L || l0 >= l1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "layers %d..%d of a %d-layer model", l0, l1 - 1, L);
    /* which types run */
    nstf_type types[16];
    int n_types = 0;
    for (int i = 0; i < p->n_types && n_types < 16; i++) {
        const nstf_type t = p->types[i];
        if (!nstf_type_can_quantize(t)) {
            size_t k = strlen(out->skipped);
            snprintf(out->skipped + k, sizeof out->skipped - k, "%s%s (no quantizer)", k ? ", " : "", nstf_type_name(t));
            continue;
        }
        types[n_types++] = t;
    }
    /* evaluations: per targeted matrix, the types whose block divides its rows, and the rank */
    int total = 0;
    for (int l = l0; l < l1; l++)
        for (int k = 0; k < 7; k++) {
            if (!((targets >> k) & 1)) continue;
            const nstf_matrix *w = nstf_analyze_slot(&m->w.layers[l], k);
            uint64_t rb;
            for (int ti = 0; ti < n_types; ti++) total += nstf_type_row_bytes(types[ti], w->n_in, &rb);
            total += p->lowrank_reduce > 0;
        }
    run_ctx c = {s, ids, n, m->cfg.n_vocab, NULL, NULL, out, p, 0, total};
    const size_t lp_bytes = (size_t)n * (size_t)c.nv * 4;
    float *ref = nstf_alloc(lp_bytes, "reference log-probabilities");
    c.lp = nstf_alloc(lp_bytes, "log-probabilities");
    out->rows = nstf_calloc((size_t)(c.total > 0 ? c.total : 1), sizeof *out->rows, "analysis rows");
    nstf_status st = ref && c.lp && out->rows ? NSTF_OK : NSTF_ERR_OOM;
    if (st == NSTF_OK) st = nstf_eval_logprobs(s, ids, n, ref);
    c.ref = ref;
    if (st == NSTF_OK) nstf_eval_scores(ref, NULL, ids, n, c.nv, 0, &out->base);
    nstf_lowrank *lr = NULL;
    if (st == NSTF_OK && p->lowrank_reduce > 0) {
        nstf_lowrank_params lp = {0};
        lp.targets = targets;
        lp.whiten = p->calib != NULL;
        lp.layer0 = l0;
        lp.layer1 = l1;
        st = nstf_lowrank_create(s, p->calib, p->n_calib, &lp, &lr);
    }
    for (int l = l0; st == NSTF_OK && l < l1; l++)
        for (int k = 0; st == NSTF_OK && k < 7; k++) {
            if (!((targets >> k) & 1)) continue;
            nstf_matrix *slot = nstf_analyze_slot(&m->w.layers[l], k);
            const nstf_matrix orig = *slot;
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, nstf_analyze_kind_name(k));
            const float *qw = p->imatrix ? nstf_imatrix_weights(p->imatrix, name, orig.n_in, &st) : NULL;
            for (int ti = 0; st == NSTF_OK && ti < n_types; ti++) {
                const nstf_type t = types[ti];
                uint64_t rb = 0;
                if (!nstf_type_row_bytes(t, orig.n_in, &rb)) continue; /* the block does not divide the rows */
                void *q = nstf_analyze_requantize(&orig, t, qw);
                if (!q) {
                    st = NSTF_ERR_OOM;
                    break;
                }
                *slot = (nstf_matrix){q, t, orig.n_in, orig.n_out, NULL};
                st = evaluate(&c, l, k, nstf_type_name(t), 8.0 * (double)rb / (double)orig.n_in);
                *slot = orig;
                nstf_free(q);
            }
            if (st == NSTF_OK && lr) {
                const int i = nstf_lowrank_find(lr, l, k);
                const int64_t r = nstf_lowrank_rank_budget(orig.n_in, orig.n_out, 1.0 - p->lowrank_reduce);
                char cand[32];
                snprintf(cand, sizeof cand, "rank %lld%s", (long long)r, p->calib ? " (whitened)" : "");
                if (r > 0) st = nstf_lowrank_set(lr, i, r);
                if (st == NSTF_OK && r > 0)
                    st = evaluate(&c, l, k, cand,
                                  16.0 * (double)r * (double)(orig.n_in + orig.n_out) / ((double)orig.n_in * orig.n_out));
                if (r > 0) (void)nstf_lowrank_set(lr, i, 0);
            }
        }
    nstf_lowrank_free(lr);
    nstf_free(ref);
    nstf_free(c.lp);
    if (st != NSTF_OK) nstf_analyze_result_free(out);
    return st;
}
