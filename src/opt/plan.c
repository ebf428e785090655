/* plan.c — the planner (plan.h): the sensitivity table with the low-rank
 * candidate, the choice under a perplexity budget (adaptive.c), the
 * sparse layers (plan_sparse.c), the trade-off table of pure strategies,
 * and the writer that puts factors and quantized matrices into one GGUF
 * with the plan's metadata. */
#include "opt/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "model/session.h"
#include "opt/lowrank.h"

void nstf_plan_detach(nstf_plan *plan) {
    nstf_lowrank_free(plan->lr);
    plan->lr = NULL;
}

void nstf_plan_free(nstf_plan *plan) {
    if (!plan) return;
    nstf_adaptive_plan_free(&plan->mix);
    for (int l = 0; plan->strategy && l < plan->n_layers; l++) nstf_free(plan->strategy[l]);
    nstf_free(plan->strategy);
    nstf_free(plan->attn_sparse);
    nstf_free(plan->sparse_kl);
    nstf_lowrank_free(plan->lr);
    memset(plan, 0, sizeof *plan);
}

/* Bytes of matrix i (shape from the session) as type t or rank r. */
static uint64_t mat_bytes(nstf_session *s, int i, nstf_type t, int64_t r) {
    const nstf_matrix *w = nstf_analyze_slot(&s->model->w.layers[i / 7], i % 7);
    if (r > 0) return 2 * (uint64_t)r * (uint64_t)(w->n_in + w->n_out);
    uint64_t rb = 0;
    return nstf_type_row_bytes(t, w->n_in, &rb) ? rb * (uint64_t)w->n_out : 0;
}

typedef struct table_ctx {
    const int32_t *ids;
    int n;
    const float *ref, *ref_dec; /* the original's log-probabilities: all positions; the decode steps */
    float *lp_dec;
    uint64_t fixed;
} table_ctx;

/* Evaluate `mix` (entries filled) with sparse layers `layer` (NULL: none;
 * configuration: the plan's) as a row of the table: the evaluation forward,
 * then the decode evaluation. */
static nstf_status add_row(nstf_session *s, nstf_plan *plan, const nstf_adaptive_plan *mix, const uint8_t *layer,
                           const char *name, const table_ctx *t) {
    if (plan->n_rows >= (int)(sizeof plan->rows / sizeof plan->rows[0])) return NSTF_OK;
    nstf_plan_row *r = &plan->rows[plan->n_rows];
    double ms = 0;
    nstf_status st = nstf_session_sparse_set(s, layer, plan->sparse_topk, plan->sparse_block, plan->sparse_window);
    if (st == NSTF_OK) st = nstf_adaptive_plan_eval(s, mix, plan->lr, t->ids, t->n, t->ref, &r->score, &ms);
    nstf_adaptive_applied a = {0};
    if (st == NSTF_OK) st = nstf_adaptive_plan_apply(s, mix, plan->lr, &a);
    if (st == NSTF_OK) {
        st = nstf_plan_decode_eval(s, t->ids, t->n, plan->decode_first, t->ref_dec, t->lp_dec, &r->decode,
                                   &r->decode_tok_s);
        const nstf_status st2 = nstf_adaptive_plan_restore(s, &a);
        if (st == NSTF_OK) st = st2;
    }
    const nstf_status st3 = nstf_session_sparse_set(s, NULL, 0, 0, 0);
    NSTF_TRY(st);
    NSTF_TRY(st3);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->bytes = t->fixed;
    for (int i = 0; i < mix->n; i++) r->bytes += mix->e[i].bytes;
    r->tok_s = ms > 0 ? 1e3 * t->n / ms : 0;
    plan->n_rows++;
    return NSTF_OK;
}

/* The trade-off table: original, each pure type, pure rank, every layer
 * sparse, the plan. */
static nstf_status table(nstf_session *s, nstf_plan *plan, const nstf_plan_params *p, const int32_t *ids, int n) {
    const int64_t nv = s->model->cfg.n_vocab;
    const int n_mats = plan->mix.n, L = plan->n_layers;
    const size_t n_dec = (size_t)(n - plan->decode_first) * (size_t)nv * 4;
    float *ref = nstf_alloc((size_t)n * (size_t)nv * 4, "reference log-probabilities");
    float *ref_dec = nstf_alloc(n_dec, "reference decode log-probabilities");
    float *lp_dec = nstf_alloc(n_dec, "decode log-probabilities");
    uint8_t *all = nstf_alloc((size_t)L, "sparse layers");
    nstf_adaptive_plan pure = plan->mix;
    pure.e = nstf_alloc((size_t)n_mats * sizeof *pure.e, "pure strategy");
    nstf_status st = ref && ref_dec && lp_dec && all && pure.e ? NSTF_OK : NSTF_ERR_OOM;
    if (st == NSTF_OK) st = nstf_eval_logprobs(s, ids, n, ref);
    nstf_eval_score sc;
    if (st == NSTF_OK) st = nstf_plan_decode_eval(s, ids, n, plan->decode_first, NULL, ref_dec, &sc, NULL);
    uint64_t fixed = plan->mix.total_bytes;
    for (int i = 0; i < n_mats; i++) fixed -= plan->mix.e[i].bytes;
    table_ctx t = {ids, n, ref, ref_dec, lp_dec, fixed};
    /* every layer sparse: the plan's configuration, or the sparsest measured when no layer was chosen */
    const bool sparse_row = plan->n_sparse_cfg > 0;
    const int save[3] = {plan->sparse_topk, plan->sparse_block, plan->sparse_window};
    if (all) memset(all, 1, (size_t)L);
    const int n_pure = p->n_types + (plan->lr != NULL) + sparse_row;
    for (int k = -1; st == NSTF_OK && k <= n_pure; k++) { /* -1: original; n_pure: the plan */
        char name[48];
        if (k == n_pure) {
            st = add_row(s, plan, &plan->mix, plan->attn_sparse, "plan (in memory)", &t);
            break;
        }
        if (sparse_row && k == n_pure - 1) {
            if (!plan->sparse_topk) {
                const int *c = plan->sparse_cfg[0];
                for (int j = 1; j < plan->n_sparse_cfg; j++)
                    if (plan->sparse_cfg[j][0] < c[0]) c = plan->sparse_cfg[j];
                plan->sparse_topk = c[0], plan->sparse_block = c[1], plan->sparse_window = c[2];
            }
            for (int i = 0; i < n_mats; i++) {
                pure.e[i] = plan->mix.e[i];
                pure.e[i].type = pure.e[i].own, pure.e[i].rank = 0;
                pure.e[i].bytes = mat_bytes(s, i, pure.e[i].own, 0);
            }
            pure.embd_type = pure.output_type = NSTF_TYPE_F32;
            snprintf(name, sizeof name, "all layers sparse (top-k %d)", plan->sparse_topk);
            st = add_row(s, plan, &pure, all, name, &t);
            plan->sparse_topk = save[0], plan->sparse_block = save[1], plan->sparse_window = save[2];
            if (p->progress) p->progress(p->progress_user, "trade-off table", k + 2, n_pure + 2, name);
            continue;
        }
        int n_applied = 0;
        for (int i = 0; i < n_mats; i++) {
            nstf_adaptive_entry *e = &pure.e[i];
            *e = plan->mix.e[i];
            e->type = e->own, e->rank = 0;
            if (k >= 0 && k < p->n_types && mat_bytes(s, i, p->types[k], 0)) e->type = p->types[k], n_applied++;
            if (k == p->n_types) {
                const nstf_matrix *w = nstf_analyze_slot(&s->model->w.layers[i / 7], i % 7);
                e->rank = nstf_lowrank_rank_budget(w->n_in, w->n_out, 1.0 - p->lowrank_reduce);
            }
            e->bytes = e->type == e->own && !e->rank ? mat_bytes(s, i, e->own, 0) : mat_bytes(s, i, e->type, e->rank);
        }
        if (k >= 0 && k < p->n_types && n_applied == 0) continue; /* the type's block divides no matrix */
        /* the original keeps its embeddings as loaded (F32: no swap); the others take the rest rule's */
        pure.embd_type = k < 0 ? NSTF_TYPE_F32 : plan->mix.embd_type;
        pure.output_type = k < 0 ? NSTF_TYPE_F32 : plan->mix.output_type;
        if (k < 0) snprintf(name, sizeof name, "original");
        else if (k < p->n_types)
            snprintf(name, sizeof name, "all %s%s", nstf_type_name(p->types[k]),
                     n_applied < n_mats ? " (where it divides; else own)" : "");
        else snprintf(name, sizeof name, "all rank (%.0f%% fewer)", 100 * p->lowrank_reduce);
        st = add_row(s, plan, &pure, NULL, name, &t);
        if (p->progress) p->progress(p->progress_user, "trade-off table", k + 2, n_pure + 2, name);
    }
    nstf_free(ref);
    nstf_free(ref_dec);
    nstf_free(lp_dec);
    nstf_free(all);
    nstf_free(pure.e);
    return st;
}

static nstf_status strategies(nstf_plan *plan) {
    const int L = plan->n_layers;
    plan->strategy = nstf_calloc((size_t)L, sizeof *plan->strategy, "strategies");
    if (!plan->strategy) return NSTF_ERR_OOM;
    for (int l = 0; l < L; l++) {
        char buf[512];
        size_t k = 0;
        for (int j = 0; j < 7; j++) {
            const nstf_adaptive_entry *e = &plan->mix.e[l * 7 + j];
            if (e->rank > 0)
                k += (size_t)snprintf(buf + k, sizeof buf - k, "%s=rank%lld ", nstf_analyze_kind_name(j), (long long)e->rank);
            else
                k += (size_t)snprintf(buf + k, sizeof buf - k, "%s=%s ", nstf_analyze_kind_name(j), nstf_type_name(e->type));
        }
        snprintf(buf + k, sizeof buf - k, "attn=%s", plan->attn_sparse[l] ? "sparse" : "dense");
        plan->strategy[l] = nstf_alloc(strlen(buf) + 1, "strategy");
        if (!plan->strategy[l]) return NSTF_ERR_OOM;
        memcpy(plan->strategy[l], buf, strlen(buf) + 1);
    }
    return NSTF_OK;
}

static void sens_progress(void *user, int done, int total, const char *what) {
    const nstf_plan_params *p = user;
    p->progress(p->progress_user, "sensitivity", done, total, what);
}

nstf_status nstf_plan_make(nstf_session *s, const int32_t *ids, int n, const nstf_plan_params *p, nstf_plan *out) {
    memset(out, 0, sizeof *out);
    if (!(p->budget_ppl > 0)) return nstf_set_error(NSTF_ERR_INVALID_ARG, "the planner needs a perplexity budget > 0");
    out->n_layers = s->model->cfg.n_layers;
    out->attn_sparse = nstf_calloc((size_t)out->n_layers, 1, "attention plan");
    if (!out->attn_sparse) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    nstf_plan_sparse_setup(n, p, out);
    /* with a sparse configuration to measure, the mix leaves it a share of the budget */
    const double share = p->sparse_share >= 0 ? p->sparse_share : 0.5;
    const double mix_budget = out->n_sparse_cfg > 0 ? p->budget_ppl * (1 - share) : p->budget_ppl;
    const bool lowrank = p->lowrank_reduce > 0 && nstf_lowrank_available();
    if (p->lowrank_reduce > 0 && !lowrank)
        snprintf(out->note, sizeof out->note, "no LAPACKE in this build: low-rank candidates left out; ");
    if (lowrank) {
        nstf_lowrank_params lp = {0};
        lp.targets = NSTF_LR_ALL;
        lp.whiten = p->calib != NULL;
        st = nstf_lowrank_create(s, p->calib, p->n_calib, &lp, &out->lr);
    }
    nstf_analyze_result sens = {0};
    if (st == NSTF_OK) {
        nstf_analyze_params ap = {0};
        ap.types = p->types;
        ap.n_types = p->n_types;
        ap.lowrank_reduce = lowrank ? p->lowrank_reduce : 0;
        ap.calib = p->calib;
        ap.n_calib = p->n_calib;
        ap.imatrix = p->imatrix;
        if (p->progress) ap.progress = sens_progress, ap.progress_user = (void *)p;
        st = nstf_analyze_run(s, ids, n, &ap, &sens);
    }
    if (st == NSTF_OK) {
        nstf_adaptive_params ad = {0};
        ad.types = p->types;
        ad.n_types = p->n_types;
        ad.rest = p->rest;
        ad.budget_ppl = mix_budget;
        ad.lr = out->lr;
        ad.imatrix = p->imatrix;
        ad.progress = p->progress;
        ad.progress_user = p->progress_user;
        st = nstf_adaptive_plan_make(s, ids, n, &ad, &sens, &out->mix);
    }
    nstf_analyze_result_free(&sens);
    if (st == NSTF_OK) st = nstf_plan_sparse_choose(s, ids, n, p, out);
    if (st == NSTF_OK) st = strategies(out);
    if (st == NSTF_OK) st = table(s, out, p, ids, n);
    if (st != NSTF_OK) nstf_plan_free(out);
    return st;
}

typedef struct write_ctx {
    const nstf_plan *plan;
    const nstf_plan_params *p;
} write_ctx;

static nstf_status plan_keys(void *user, nstf_gguf_writer *w) {
    const write_ctx *c = user;
    NSTF_TRY(nstf_gguf_writer_set_u32(w, "nstf.plan.version", 1));
    NSTF_TRY(nstf_gguf_writer_set_arr_str(w, "nstf.plan.strategy", (const char *const *)c->plan->strategy,
                                          (uint64_t)c->plan->n_layers));
    NSTF_TRY(nstf_gguf_writer_set_arr(w, "nstf.plan.attn_sparse", NSTF_GGUF_UINT8, c->plan->attn_sparse,
                                      (uint64_t)c->plan->n_layers));
    if (c->plan->sparse_topk > 0) {
        NSTF_TRY(nstf_gguf_writer_set_u32(w, "nstf.plan.sparse_topk", (uint32_t)c->plan->sparse_topk));
        NSTF_TRY(nstf_gguf_writer_set_u32(w, "nstf.plan.sparse_block", (uint32_t)c->plan->sparse_block));
        NSTF_TRY(nstf_gguf_writer_set_u32(w, "nstf.plan.sparse_window", (uint32_t)c->plan->sparse_window));
    }
    return nstf_gguf_writer_set_f32(w, "nstf.plan.budget_ppl", (float)c->p->budget_ppl);
}

nstf_status nstf_plan_write(nstf_session *s, nstf_plan *plan, const nstf_plan_params *p, const char *in_path,
                            const char *out_path) {
    const nstf_adaptive_plan *mix = &plan->mix;
    int n_fact = 0;
    for (int i = 0; i < mix->n; i++) n_fact += mix->e[i].rank > 0;
    /* factor names: two per factorized matrix, after the dense overrides */
    nstf_quant_override *ov = nstf_calloc((size_t)(mix->n + 2 * n_fact), sizeof *ov, "overrides");
    char(*names)[80] = nstf_calloc((size_t)(2 * n_fact + 1), sizeof *names, "factor names");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.lowrank.tmp", out_path);
    nstf_status st = ov && names ? NSTF_OK : NSTF_ERR_OOM;
    int k = 0, f = 0;
    for (int i = 0; st == NSTF_OK && i < mix->n; i++) {
        const nstf_adaptive_entry *e = &mix->e[i];
        if (e->rank <= 0) {
            ov[k++] = (nstf_quant_override){e->name, e->type};
            continue;
        }
        const int base = (int)strlen(e->name) - 7; /* without ".weight" */
        snprintf(names[f], sizeof names[f], "%.*s.lr_a.weight", base, e->name);
        ov[k++] = (nstf_quant_override){names[f++], NSTF_TYPE_F16};
        snprintf(names[f], sizeof names[f], "%.*s.lr_b.weight", base, e->name);
        ov[k++] = (nstf_quant_override){names[f++], NSTF_TYPE_F16};
        const int li = nstf_lowrank_find(plan->lr, i / 7, i % 7);
        st = li >= 0 ? nstf_lowrank_set(plan->lr, li, e->rank)
                     : nstf_set_error(NSTF_ERR_INTERNAL, "%s: factorized in the plan, not decomposed", e->name);
    }
    /* the factors first (the session's model with the plan's ranks), then the types */
    if (st == NSTF_OK && n_fact) st = nstf_lowrank_write(plan->lr, tmp, NSTF_TYPE_F16);
    for (int i = 0; plan->lr && i < nstf_lowrank_count(plan->lr); i++) (void)nstf_lowrank_set(plan->lr, i, 0);
    if (st == NSTF_OK) {
        write_ctx c = {plan, p};
        nstf_quant_params qp = {.target = p->rest, .overrides = ov, .n_overrides = k, .n_threads = s->params.n_threads,
                                .add_keys = plan_keys, .add_keys_user = &c, .imatrix = p->imatrix};
        st = nstf_quantize_file(n_fact ? tmp : in_path, out_path, &qp);
    }
    if (n_fact) unlink(tmp);
    nstf_free(ov);
    nstf_free(names);
    return st;
}
