/* plan_sparse.c — the planner's sparse-attention candidate (plan.h): the
 * decode evaluation (a prefill, then scored one-token steps, the only
 * forwards the sparse attention changes), the configurations a text can
 * measure, each layer's measured cost, and the choice of sparse layers on
 * top of the mix within the perplexity budget. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/mem.h"
#include "model/session.h"
#include "opt/plan.h"

enum { MIN_STEPS = 8, DEFAULT_BLOCK = 16, DEFAULT_WINDOW = 64 };

nstf_status nstf_plan_decode_eval(nstf_session *s, const int32_t *ids, int n, int first, const float *ref,
                                  float *logp, nstf_eval_score *out, double *tok_s) {
    if (first < 1 || first >= n)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "decode evaluation: prefill of %d of %d tokens", first, n);
    const int64_t nv = s->model->cfg.n_vocab;
    NSTF_TRY(nstf_session_prefill(s, ids, first, 0));
    const double t0 = nstf_time_ms();
    for (int t = first; t < n; t++) {
        float *row = logp + (int64_t)(t - first) * nv;
        NSTF_TRY(nstf_session_forward(s, ids + t, 1, t, false, row, NULL));
    }
    const double ms = nstf_time_ms() - t0;
    if (tok_s) *tok_s = ms > 0 ? 1e3 * (n - first) / ms : 0;
    for (int t = first; t < n; t++) nstf_eval_log_softmax(logp + (int64_t)(t - first) * nv, nv);
    nstf_eval_scores(logp, ref, ids + first, n - first, (int)nv, 0, out);
    return NSTF_OK;
}

/* The first step position at which (topk, block, window) drops a block:
 * the sink, the window's blocks and top-k more are all a step reads. */
static int reach(int topk, int block, int window) { return topk * block + window + 2 * block; }

void nstf_plan_sparse_setup(int n, const nstf_plan_params *p, nstf_plan *plan) {
    static const int topks[] = {8, 16, 32};
    const int block = p->sparse_block > 0 ? p->sparse_block : DEFAULT_BLOCK,
              window = p->sparse_window > 0 ? p->sparse_window : DEFAULT_WINDOW;
    const int n_try = p->sparse_topk > 0 ? 1 : 3;
    plan->n_sparse_cfg = 0;
    plan->decode_first = n > 17 ? n - 16 : 1; /* no sparse measurement: a few steps for the decode rate */
    plan->decode_scored = false;
    if (!p->allow_sparse) return;
    int first = 0, need = 0;
    for (int i = 0; i < n_try; i++) {
        const int k = p->sparse_topk > 0 ? p->sparse_topk : topks[i], r = reach(k, block, window);
        need = need == 0 || r < need ? r : need;
        if (r + MIN_STEPS > n) continue;
        int *c = plan->sparse_cfg[plan->n_sparse_cfg++];
        c[0] = k, c[1] = block, c[2] = window;
        first = r > first ? r : first;
    }
    size_t len = strlen(plan->note);
    if (plan->n_sparse_cfg == 0) {
        snprintf(plan->note + len, sizeof plan->note - len,
                 "sparse attention not measured: %d tokens of text, and a step drops blocks only from position %d "
                 "on (top-k x block + window + 2 blocks; %d steps past it needed): every layer dense; ",
                 n, need, MIN_STEPS);
        return;
    }
    plan->decode_first = first;
    plan->decode_scored = true;
}

/* Share of the keys a step at position pos skips under (topk, block, window). */
static double skipped(int topk, int block, int window, int pos) {
    const int nb = pos / block + 1, win = (window + block - 1) / block + 1;
    int read = 1 + win + topk;
    read = read < nb ? read : nb;
    const int keys = read * block < pos + 1 ? read * block : pos + 1;
    return 1.0 - (double)keys / (pos + 1);
}

typedef struct meas {
    nstf_session *s;
    const int32_t *ids;
    int n, first;
    const float *ref; /* the original's dense steps */
    float *lp;
    uint8_t *layer;
} meas;

/* Decode-evaluate with layer[] sparse at configuration c. */
static nstf_status measure(meas *m, const int *c, nstf_eval_score *sc) {
    NSTF_TRY(nstf_session_sparse_set(m->s, m->layer, c[0], c[1], c[2]));
    return nstf_plan_decode_eval(m->s, m->ids, m->n, m->first, m->ref, m->lp, sc, NULL);
}

nstf_status nstf_plan_sparse_choose(nstf_session *s, const int32_t *ids, int n, const nstf_plan_params *p,
                                    nstf_plan *plan) {
    if (plan->n_sparse_cfg == 0) return NSTF_OK;
    const int L = plan->n_layers, steps = n - plan->decode_first;
    const int64_t nv = s->model->cfg.n_vocab;
    uint64_t bytes = 0;
    if (!nstf_mul_ok((uint64_t)steps * (uint64_t)nv, 4, &bytes))
        return nstf_set_error(NSTF_ERR_OOM, "decode evaluation: size overflows");
    meas m = {s, ids, n, plan->decode_first, NULL, NULL, NULL};
    float *ref = nstf_alloc(bytes, "decode reference");
    m.lp = nstf_alloc(bytes, "decode log-probabilities");
    m.layer = nstf_calloc((size_t)L, 1, "sparse layers");
    plan->sparse_kl = nstf_calloc((size_t)L, sizeof *plan->sparse_kl, "sparse costs");
    int *order = nstf_calloc((size_t)L, sizeof *order, "layer order");
    nstf_status st = ref && m.lp && m.layer && plan->sparse_kl && order ? NSTF_OK : NSTF_ERR_OOM;
    nstf_eval_score base = {0}, sc;
    if (st == NSTF_OK) st = nstf_session_sparse_set(s, NULL, 0, 0, 0);
    if (st == NSTF_OK) st = nstf_plan_decode_eval(s, ids, n, m.first, NULL, ref, &base, NULL);
    m.ref = ref;
    /* each layer alone, at the sparsest configuration (the last: top-k ascending) */
    const int *sparsest = plan->sparse_cfg[plan->n_sparse_cfg - 1];
    for (int c = 0; c < plan->n_sparse_cfg; c++)
        if (plan->sparse_cfg[c][0] < sparsest[0]) sparsest = plan->sparse_cfg[c];
    for (int l = 0; st == NSTF_OK && l < L; l++) {
        memset(m.layer, 0, (size_t)L);
        m.layer[l] = 1;
        st = measure(&m, sparsest, &sc);
        plan->sparse_kl[l] = sc.kl;
        order[l] = l;
        if (st == NSTF_OK && p->progress) {
            char what[64];
            snprintf(what, sizeof what, "layer %d sparse: KL %.5f", l, sc.kl);
            p->progress(p->progress_user, "sparse attention", l + 1, L, what);
        }
    }
    for (int i = 1; st == NSTF_OK && i < L; i++) /* cheapest first (insertion sort; ties: the lower layer) */
        for (int j = i; j > 0 && plan->sparse_kl[order[j]] < plan->sparse_kl[order[j - 1]]; j--) {
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    /* per configuration: the most cheapest-first layers within the budget, on top of the mix */
    nstf_adaptive_applied a = {0};
    if (st == NSTF_OK) st = nstf_adaptive_plan_apply(s, &plan->mix, plan->lr, &a);
    const double limit = base.ppl * (1 + p->budget_ppl);
    double best_gain = 0;
    int best_k = 0, best_c = -1;
    for (int c = 0; st == NSTF_OK && c < plan->n_sparse_cfg; c++) {
        const int *cfg = plan->sparse_cfg[c];
        int lo = 0, hi = L + 1, k = L; /* lo: within; hi: over (L + 1: not tried) */
        while (st == NSTF_OK && hi - lo > 1) {
            memset(m.layer, 0, (size_t)L);
            for (int i = 0; i < k; i++) m.layer[order[i]] = 1;
            st = measure(&m, cfg, &sc);
            if (st != NSTF_OK) break;
            if (sc.ppl <= limit) lo = k;
            else hi = k;
            if (p->progress) {
                char what[96];
                snprintf(what, sizeof what, "top-k %d, %d sparse layers: ppl %+.3f%% %s", cfg[0], k,
                         100 * (sc.ppl / base.ppl - 1), sc.ppl <= limit ? "within" : "over");
                p->progress(p->progress_user, "sparse attention", c + 1, plan->n_sparse_cfg, what);
            }
            k = (lo + hi) / 2;
            if (k == lo) break;
        }
        const double gain = lo * skipped(cfg[0], cfg[1], cfg[2], n - 1);
        if (gain > best_gain) best_gain = gain, best_k = lo, best_c = c;
    }
    const nstf_status st2 = a.orig ? nstf_adaptive_plan_restore(s, &a) : NSTF_OK;
    if (st == NSTF_OK) st = st2;
    if (st == NSTF_OK) st = nstf_session_sparse_set(s, NULL, 0, 0, 0);
    if (st == NSTF_OK && best_c >= 0) {
        for (int i = 0; i < best_k; i++) plan->attn_sparse[order[i]] = 1;
        plan->sparse_topk = plan->sparse_cfg[best_c][0];
        plan->sparse_block = plan->sparse_cfg[best_c][1];
        plan->sparse_window = plan->sparse_cfg[best_c][2];
    }
    if (st == NSTF_OK) {
        size_t len = strlen(plan->note);
        if (best_c >= 0)
            snprintf(plan->note + len, sizeof plan->note - len,
                     "sparse attention: %d of %d layers at top-k %d, blocks of %d, window %d (decode steps at "
                     "positions %d..%d, %.0f%% of the keys skipped at the last); ",
                     best_k, L, plan->sparse_topk, plan->sparse_block, plan->sparse_window, m.first, n - 1,
                     100 * skipped(plan->sparse_topk, plan->sparse_block, plan->sparse_window, n - 1));
        else
            snprintf(plan->note + len, sizeof plan->note - len,
                     "sparse attention: no layer within the budget (decode steps at positions %d..%d); ", m.first,
                     n - 1);
    }
    nstf_free(ref);
    nstf_free(m.lp);
    nstf_free(m.layer);
    nstf_free(order);
    return st;
}
