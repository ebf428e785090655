/* adaptive.c — adaptive precision: the sensitivity table (analyze.c), the
 * candidates and budget handed to the knapsack (mix.c), the bisection of
 * a perplexity budget over mixes built in memory, and the overrides that
 * nstf_quantize_file writes (adaptive.h). */
#include "opt/adaptive.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "core/mem.h"
#include "model/session.h"
#include "opt/imatrix.h"
#include "opt/lowrank.h"
#include "opt/mix.h"

void nstf_adaptive_plan_free(nstf_adaptive_plan *plan) {
    if (!plan) return;
    nstf_free(plan->e);
    memset(plan, 0, sizeof *plan);
}

nstf_quant_override *nstf_adaptive_overrides(const nstf_adaptive_plan *plan) {
    nstf_quant_override *o = nstf_calloc((size_t)(plan->n > 0 ? plan->n : 1), sizeof *o, "overrides");
    for (int i = 0; o && i < plan->n; i++)
        o[i] = (nstf_quant_override){plan->e[i].name, plan->e[i].rank > 0 ? plan->e[i].own : plan->e[i].type};
    return o;
}

/* Factorize (r > 0) or restore (r = 0) every plan entry with a rank. */
static nstf_status set_ranks(const nstf_adaptive_plan *plan, nstf_lowrank *lr, bool on) {
    for (int i = 0; i < plan->n; i++) {
        if (plan->e[i].rank <= 0) continue;
        const int k = lr ? nstf_lowrank_find(lr, i / 7, i % 7) : -1;
        if (k < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: factorized in the plan, not decomposed", plan->e[i].name);
        NSTF_TRY(nstf_lowrank_set(lr, k, on ? plan->e[i].rank : 0));
    }
    return NSTF_OK;
}

nstf_status nstf_adaptive_plan_apply(nstf_session *s, const nstf_adaptive_plan *plan, nstf_lowrank *lr,
                                     nstf_adaptive_applied *a) {
    memset(a, 0, sizeof *a);
    if (!s->be->host_memory || s->run_cpu)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "adaptive precision runs on a CPU session (--device cpu)");
    nstf_llama *m = s->model;
    const int n_mats = m->cfg.n_layers * 7;
    if (plan->n != n_mats)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "the plan has %d matrices, the model %d", plan->n, n_mats);
    a->plan = plan;
    a->lr = lr;
    a->orig = nstf_calloc((size_t)n_mats + 2, sizeof *a->orig, "original matrices");
    a->bufs = nstf_calloc((size_t)n_mats + 2, sizeof *a->bufs, "mix buffers");
    if (!a->orig || !a->bufs) {
        nstf_free(a->orig);
        nstf_free(a->bufs);
        memset(a, 0, sizeof *a);
        return NSTF_ERR_OOM;
    }
    nstf_status st = set_ranks(plan, lr, true);
    a->ranks = true;
    /* the embeddings and output as the rest rule writes them (the run's
     * views: a host run reads its own copies of these two structs) */
    nstf_llama_weights *rw = &s->run->w;
    const nstf_matrix embd = rw->tok_embd, output = rw->output;
    a->orig[n_mats] = embd;
    a->orig[n_mats + 1] = output;
    const bool tied = output.data == embd.data;
    if (st == NSTF_OK && plan->embd_type != embd.type && plan->embd_type != NSTF_TYPE_F32) {
        const float *qw = plan->imatrix ? nstf_imatrix_weights(plan->imatrix, "token_embd.weight", embd.n_in, &st) : NULL;
        if (st == NSTF_OK && !(a->bufs[n_mats] = nstf_analyze_requantize(&embd, plan->embd_type, qw))) st = NSTF_ERR_OOM;
        else rw->tok_embd = (nstf_matrix){a->bufs[n_mats], plan->embd_type, embd.n_in, embd.n_out, NULL};
        if (tied) rw->output = rw->tok_embd;
    }
    if (st == NSTF_OK && !tied && plan->output_type != output.type && plan->output_type != NSTF_TYPE_F32) {
        const float *qw = plan->imatrix ? nstf_imatrix_weights(plan->imatrix, "output.weight", output.n_in, &st) : NULL;
        if (st == NSTF_OK && !(a->bufs[n_mats + 1] = nstf_analyze_requantize(&output, plan->output_type, qw)))
            st = NSTF_ERR_OOM;
        else rw->output = (nstf_matrix){a->bufs[n_mats + 1], plan->output_type, output.n_in, output.n_out, NULL};
    }
    for (; st == NSTF_OK && a->swapped < n_mats; a->swapped++) {
        const int i = a->swapped;
        nstf_matrix *slot = nstf_analyze_slot(&m->w.layers[i / 7], i % 7);
        a->orig[i] = *slot;
        const nstf_type t = plan->e[i].type;
        if (t == slot->type || plan->e[i].rank > 0) continue;
        const float *qw = plan->imatrix ? nstf_imatrix_weights(plan->imatrix, plan->e[i].name, slot->n_in, &st) : NULL;
        if (st != NSTF_OK) {
            a->swapped++;
            break;
        }
        a->bufs[i] = nstf_analyze_requantize(slot, t, qw);
        if (!a->bufs[i]) {
            st = nstf_set_error(NSTF_ERR_OOM, "%s as %s: out of memory", plan->e[i].name, nstf_type_name(t));
            a->swapped++;
            break;
        }
        *slot = (nstf_matrix){a->bufs[i], t, slot->n_in, slot->n_out, NULL};
    }
    if (st != NSTF_OK) (void)nstf_adaptive_plan_restore(s, a);
    return st;
}

nstf_status nstf_adaptive_plan_restore(nstf_session *s, nstf_adaptive_applied *a) {
    if (!a->orig) return NSTF_OK;
    nstf_llama *m = s->model;
    const int n_mats = m->cfg.n_layers * 7;
    for (int i = 0; i < a->swapped; i++) *nstf_analyze_slot(&m->w.layers[i / 7], i % 7) = a->orig[i];
    for (int i = 0; i < n_mats + 2; i++) nstf_free(a->bufs[i]);
    s->run->w.tok_embd = a->orig[n_mats];
    s->run->w.output = a->orig[n_mats + 1];
    const nstf_status st = a->ranks && a->lr ? set_ranks(a->plan, a->lr, false) : NSTF_OK;
    nstf_free(a->orig);
    nstf_free(a->bufs);
    memset(a, 0, sizeof *a);
    return st;
}

nstf_status nstf_adaptive_plan_eval(nstf_session *s, const nstf_adaptive_plan *plan, nstf_lowrank *lr,
                                    const int32_t *ids, int n, const float *ref, nstf_eval_score *out,
                                    double *forward_ms) {
    float *lp = nstf_alloc((size_t)n * (size_t)s->model->cfg.n_vocab * 4, "log-probabilities");
    if (!lp) return NSTF_ERR_OOM;
    nstf_adaptive_applied a;
    nstf_status st = nstf_adaptive_plan_apply(s, plan, lr, &a);
    const double t0 = nstf_time_ms();
    if (st == NSTF_OK) st = nstf_eval_logprobs(s, ids, n, lp);
    if (forward_ms) *forward_ms = nstf_time_ms() - t0;
    if (st == NSTF_OK) nstf_eval_scores(lp, ref, ids, n, s->model->cfg.n_vocab, 0, out);
    const nstf_status st2 = nstf_adaptive_plan_restore(s, &a);
    if (st == NSTF_OK) st = st2;
    nstf_free(lp);
    return st;
}

typedef struct ctx {
    const nstf_adaptive_params *p;
    nstf_mix_item *items;
    nstf_mix_cand *cands;     /* [n_mats][n_types + 2] */
    nstf_type *cand_type;     /* the same shape */
    int64_t *cand_rank;       /* the same shape: > 0 for a factorization */
    int n_mats, stride;
} ctx;

/* Whether t is one of the candidate types (a saved table may hold more). */
static bool type_listed(const nstf_adaptive_params *p, nstf_type t) {
    for (int i = 0; i < p->n_types; i++)
        if (p->types[i] == t) return true;
    return false;
}

static void sens_progress(void *user, int done, int total, const char *what) {
    const nstf_adaptive_params *p = user;
    p->progress(p->progress_user, "sensitivity", done, total, what);
}

/* Select under b and write the choice into plan->e. */
static nstf_status select_into(const ctx *c, const nstf_mix_budget *b, nstf_adaptive_plan *plan) {
    int *choice = nstf_alloc((size_t)c->n_mats * sizeof *choice, "choice");
    if (!choice) return NSTF_ERR_OOM;
    nstf_mix_result r;
    nstf_status st = nstf_mix_select(c->items, c->n_mats, b, choice, &r);
    for (int i = 0; st == NSTF_OK && i < c->n_mats; i++) {
        const int k = choice[i];
        plan->e[i].type = c->cand_type[i * c->stride + k];
        plan->e[i].rank = c->cand_rank[i * c->stride + k];
        plan->e[i].bytes = c->items[i].cand[k].bytes;
        plan->e[i].kl = c->items[i].cand[k].cost;
    }
    if (st == NSTF_OK) plan->kl_sum = r.cost;
    nstf_free(choice);
    return st;
}

/* The largest KL budget whose mix keeps the measured perplexity change
 * within p->budget_ppl (bisection in log space). */
static nstf_status ppl_budget(nstf_session *s, const int32_t *ids, int n, const ctx *c, double kl_max,
                              nstf_adaptive_plan *plan) {
    const nstf_adaptive_params *p = c->p;
    const int64_t nv = s->model->cfg.n_vocab;
    float *ref = nstf_alloc((size_t)n * (size_t)nv * 4, "reference log-probabilities");
    nstf_adaptive_entry *best = nstf_alloc((size_t)c->n_mats * sizeof *best, "plan");
    if (!ref || !best) {
        nstf_free(ref);
        nstf_free(best);
        return NSTF_ERR_OOM;
    }
    nstf_eval_score base, sc, best_sc;
    nstf_status st = nstf_eval_logprobs(s, ids, n, ref);
    if (st == NSTF_OK) nstf_eval_scores(ref, NULL, ids, n, (int)nv, 0, &base);
    /* X = 0: every matrix its own type, the unmodified model */
    double lo = 0, hi = kl_max, best_x = 0;
    nstf_mix_budget b0 = {0, 0};
    if (st == NSTF_OK) st = select_into(c, &b0, plan);
    memcpy(best, plan->e, (size_t)c->n_mats * sizeof *best);
    best_sc = (nstf_eval_score){base.nll, base.ppl, 0, 1, base.n_scored};
    const int max_steps = 14;
    for (int step = 0; st == NSTF_OK && step < max_steps; step++) {
        /* the first try is the smallest mix; then the geometric mean */
        const double x = step == 0 ? hi : sqrt((lo > 0 ? lo : hi * 1e-6) * hi);
        nstf_mix_budget b = {0, x};
        st = select_into(c, &b, plan);
        if (st == NSTF_OK) st = nstf_adaptive_plan_eval(s, plan, p->lr, ids, n, ref, &sc, NULL);
        if (st != NSTF_OK) break;
        plan->n_measured++;
        const bool ok = sc.ppl / base.ppl - 1 <= p->budget_ppl;
        if (p->progress) {
            char what[96];
            snprintf(what, sizeof what, "KL budget %.4g: ppl %+.3f%% %s", x, 100 * (sc.ppl / base.ppl - 1),
                     ok ? "within" : "over");
            p->progress(p->progress_user, "perplexity budget", step + 1, max_steps, what);
        }
        if (ok) {
            lo = best_x = x;
            best_sc = sc;
            memcpy(best, plan->e, (size_t)c->n_mats * sizeof *best);
            if (step == 0) break; /* even the smallest mix is within */
        } else {
            hi = x;
        }
        if (lo > 0 && hi / lo < 1.05) break;
    }
    if (st == NSTF_OK) {
        memcpy(plan->e, best, (size_t)c->n_mats * sizeof *best);
        plan->kl_sum = 0;
        for (int i = 0; i < c->n_mats; i++) plan->kl_sum += best[i].kl;
        plan->budget_kl = best_x;
        plan->measured = best_sc;
    }
    if (p->progress && st == NSTF_OK) p->progress(p->progress_user, "perplexity budget", max_steps, max_steps, "done");
    nstf_free(ref);
    nstf_free(best);
    return st;
}

nstf_status nstf_adaptive_plan_make(nstf_session *s, const int32_t *ids, int n, const nstf_adaptive_params *p,
                                    const nstf_analyze_result *sens, nstf_adaptive_plan *out) {
    memset(out, 0, sizeof *out);
    const int n_budgets = (p->target_bytes > 0) + (p->target_bpw > 0) + (p->budget_kl > 0) + (p->budget_ppl > 0);
    if (n_budgets != 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "adaptive precision needs exactly one budget (size, bits per "
                                                    "weight, KL or perplexity), got %d", n_budgets);
    if (!s->be->host_memory || s->run_cpu)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "adaptive precision runs on a CPU session (--device cpu)");
    nstf_llama *m = s->model;
    const int n_mats = m->cfg.n_layers * 7, stride = p->n_types + 2;
    for (int i = 0; i < n_mats; i++)
        if (nstf_analyze_slot(&m->w.layers[i / 7], i % 7)->factors)
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "blk.%d.%s is factorized (low-rank): adaptive precision "
                                                        "takes dense matrices only",
                                  i / 7, nstf_analyze_kind_name(i % 7));
    nstf_analyze_result own_sens = {0};
    nstf_status st = NSTF_OK;
    if (!sens) {
        nstf_analyze_params ap = {0};
        ap.types = p->types;
        ap.n_types = p->n_types;
        ap.imatrix = p->imatrix;
        if (p->progress) ap.progress = sens_progress, ap.progress_user = (void *)p;
        NSTF_TRY(nstf_analyze_run(s, ids, n, &ap, &own_sens));
        sens = &own_sens;
    }
    ctx c = {p, NULL, NULL, NULL, NULL, n_mats, stride};
    c.items = nstf_calloc((size_t)n_mats, sizeof *c.items, "mix items");
    c.cands = nstf_calloc((size_t)n_mats * (size_t)stride, sizeof *c.cands, "mix candidates");
    c.cand_type = nstf_calloc((size_t)n_mats * (size_t)stride, sizeof *c.cand_type, "mix types");
    c.cand_rank = nstf_calloc((size_t)n_mats * (size_t)stride, sizeof *c.cand_rank, "mix ranks");
    out->e = nstf_calloc((size_t)n_mats, sizeof *out->e, "plan");
    out->n = n_mats;
    out->imatrix = p->imatrix;
    nstf_quant_override *own = nstf_calloc((size_t)n_mats, sizeof *own, "overrides");
    if (!c.items || !c.cands || !c.cand_type || !c.cand_rank || !out->e || !own) st = NSTF_ERR_OOM;
    /* candidates: the matrix's own type (cost 0), then each measured type */
    for (int i = 0; st == NSTF_OK && i < n_mats; i++) {
        nstf_adaptive_entry *e = &out->e[i];
        snprintf(e->name, sizeof e->name, "blk.%d.%s.weight", i / 7, nstf_analyze_kind_name(i % 7));
        const nstf_gguf_tensor *t = nstf_gguf_find_tensor(m->file, e->name);
        if (!t) {
            st = nstf_set_error(NSTF_ERR_FORMAT, "%s: no tensor %s", m->file->path, e->name);
            break;
        }
        e->own = e->type = t->type;
        own[i] = (nstf_quant_override){e->name, t->type};
        nstf_mix_cand *cd = c.cands + (size_t)i * stride;
        nstf_type *ct = c.cand_type + (size_t)i * stride;
        int64_t *cr = c.cand_rank + (size_t)i * stride;
        int k = 0;
        cd[k] = (nstf_mix_cand){t->n_bytes, 0.0};
        ct[k++] = t->type;
        for (int r = 0; r < sens->n_rows && k < stride; r++) {
            const nstf_analyze_row *w = &sens->rows[r];
            nstf_type ty = t->type;
            uint64_t rb, bytes;
            long long rk = 0;
            if (strcmp(w->tensor, e->name)) continue;
            if (p->lr && sscanf(w->candidate, "rank %lld", &rk) == 1 && rk > 0 &&
                nstf_lowrank_find(p->lr, i / 7, i % 7) >= 0)
                bytes = 2 * (uint64_t)rk * (uint64_t)(t->ne[0] + t->ne[1]); /* F16 factors */
            else if (nstf_type_from_name(w->candidate, &ty) && ty != t->type && nstf_type_row_bytes(ty, t->ne[0], &rb) &&
                     type_listed(p, ty))
                bytes = rb * (t->n_elems / (uint64_t)t->ne[0]), rk = 0;
            else
                continue;
            if (!isfinite(w->score.kl)) {
                st = nstf_set_error(NSTF_ERR_RANGE, "%s as %s: KL %g (not finite)", e->name, w->candidate, w->score.kl);
                break;
            }
            cd[k] = (nstf_mix_cand){bytes, w->score.kl > 0 ? w->score.kl : 0.0};
            cr[k] = rk;
            ct[k++] = ty;
        }
        c.items[i] = (nstf_mix_item){cd, k};
    }
    /* the embeddings and output by the rest rule; the bytes of everything else */
    out->embd_type = out->output_type = NSTF_TYPE_F32;
    const nstf_gguf_tensor *te = nstf_gguf_find_tensor(m->file, "token_embd.weight"),
                           *to = nstf_gguf_find_tensor(m->file, "output.weight");
    if (te) out->embd_type = nstf_quant_tensor_type(&p->rest, "token_embd.weight", te->n_dims, te->ne[0], te->type,
                                                   to != NULL, m->cfg.n_layers);
    if (to) out->output_type = nstf_quant_tensor_type(&p->rest, "output.weight", to->n_dims, to->ne[0], to->type, true,
                                                     m->cfg.n_layers);
    uint64_t all_own = 0, mats_own = 0;
    if (st == NSTF_OK) {
        nstf_quant_params qp = {.target = p->rest, .overrides = own, .n_overrides = n_mats};
        st = nstf_quantize_plan_bytes(m->file, &qp, &all_own, &out->n_weights);
    }
    for (int i = 0; st == NSTF_OK && i < n_mats; i++) mats_own += c.items[i].cand[0].bytes;
    const uint64_t fixed = all_own - mats_own;
    if (st == NSTF_OK) {
        nstf_mix_budget b = {0, 0};
        double kl_max = 0;
        for (int i = 0; i < n_mats; i++) {
            double mx = 0;
            for (int k = 0; k < c.items[i].n_cand; k++) mx = c.items[i].cand[k].cost > mx ? c.items[i].cand[k].cost : mx;
            kl_max += mx;
        }
        uint64_t target = p->target_bytes;
        if (p->target_bpw > 0) target = (uint64_t)floor(p->target_bpw * (double)out->n_weights / 8.0);
        if (target > 0) {
            if (target <= fixed)
                st = nstf_set_error(NSTF_ERR_INVALID_ARG,
                                    "a budget of %llu bytes does not hold the tensors outside the layer matrices "
                                    "(%llu bytes as %s)",
                                    (unsigned long long)target, (unsigned long long)fixed, p->rest.name);
            b.max_bytes = target - fixed;
            out->budget_bytes = target;
            if (st == NSTF_OK) st = select_into(&c, &b, out);
            out->budget_kl = out->kl_sum;
        } else if (p->budget_kl > 0) {
            b.max_cost = p->budget_kl;
            out->budget_kl = p->budget_kl;
            st = select_into(&c, &b, out);
        } else {
            st = ppl_budget(s, ids, n, &c, kl_max * 1.0001, out);
        }
    }
    if (st == NSTF_OK) {
        out->total_bytes = fixed;
        for (int i = 0; i < n_mats; i++) out->total_bytes += out->e[i].bytes;
    }
    nstf_free(c.items);
    nstf_free(c.cands);
    nstf_free(c.cand_type);
    nstf_free(c.cand_rank);
    nstf_free(own);
    nstf_analyze_result_free(&own_sens);
    if (st != NSTF_OK) nstf_adaptive_plan_free(out);
    return st;
}
