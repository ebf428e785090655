/* profiler.c — per-site accumulation, and the hooks that record the ops of
 * a session's forwards (or a trainer's steps: any user of one backend)
 * between two of its backend's time marks. */
#include "prof/profiler.h"

#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "model/session.h"
#include "model/trainer.h"

void nstf_prof_reset(nstf_prof *p) {
    memset(p->sites, 0, sizeof p->sites);
    p->n_sites = 0;
    p->dropped = 0;
}

static int site_cmp(const void *a, const void *b) {
    const nstf_prof_site *x = a, *y = b;
    return x->total_ns < y->total_ns ? 1 : x->total_ns > y->total_ns ? -1 : 0;
}

uint64_t nstf_prof_sort_sites(nstf_prof *p) {
    qsort(p->sites, (size_t)p->n_sites, sizeof p->sites[0], site_cmp);
    uint64_t sum = 0;
    for (int i = 0; i < p->n_sites; i++) sum += p->sites[i].total_ns;
    return sum;
}

/* ---- attached to a session ---------------------------------------------------------- */

static void hook_begin(void *user, nstf_backend *be, const nstf_op_args *a) {
    nstf_prof *p = user;
    (void)a;
    if (p->collected) { /* a new forward after a collect: records start afresh */
        p->n_recs = 0;
        p->collected = false;
    }
    p->k0 = be->vt->kernels(be);
    if (p->n_recs < p->cap) (void)be->vt->mark(be, 2 * p->n_recs);
}

static void hook_end(void *user, nstf_backend *be, const nstf_op_args *a, nstf_status st) {
    nstf_prof *p = user;
    if (st != NSTF_OK) return;
    if (p->n_recs >= p->cap) {
        p->dropped++;
        return;
    }
    (void)be->vt->mark(be, 2 * p->n_recs + 1);
    if (p->n_recs == 0) p->host_t0 = nstf_now_ns();
    nstf_prof_rec *r = &p->recs[p->n_recs++];
    r->label = a->label ? a->label : nstf_op_name(a->op);
    r->layer = a->layer;
    r->op = a->op;
    r->block = a->block;
    r->cat = a->op == NSTF_OP_RMSNORM ? NSTF_PROF_CAT_NORM
             : a->op == NSTF_OP_ADD   ? NSTF_PROF_CAT_RESID
             : a->block == NSTF_BLOCK_ATTN ? NSTF_PROF_CAT_ATTN
             : a->block == NSTF_BLOCK_FFN  ? NSTF_PROF_CAT_FFN
                                           : NSTF_PROF_CAT_OTHER;
    r->cost = nstf_op_cost_of(a, be->int8_act);
    r->kernels = be->vt->kernels(be) - p->k0;
    r->t0_ns = r->t1_ns = 0;
}

nstf_status nstf_prof_attach(nstf_prof *p, nstf_session *s, int cap) {
    return nstf_prof_attach_backend(p, s->be, cap);
}

nstf_status nstf_prof_attach_trainer(nstf_prof *p, nstf_trainer *t, int cap) {
    return nstf_prof_attach_backend(p, t->be, cap);
}

nstf_status nstf_prof_attach_backend(nstf_prof *p, nstf_backend *be, int cap) {
    if (cap < 1) cap = 4096;
    nstf_backend_hooks *h = nstf_calloc(1, sizeof *h, "profiler hooks");
    p->recs = nstf_calloc((size_t)cap, sizeof *p->recs, "profile records");
    if (!h || !p->recs) {
        nstf_free(h);
        nstf_free(p->recs);
        p->recs = NULL;
        return NSTF_ERR_OOM;
    }
    NSTF_TRY(be->vt->marks_reserve(be, 2 * cap));
    NSTF_TRY(be->vt->set_opt(be, NSTF_OPT_PROFILE, 1));
    h->op_begin = hook_begin;
    h->op_end = hook_end;
    h->user = p;
    p->hooks = h;
    p->cap = cap;
    p->n_recs = 0;
    p->be = be;
    if (!p->trace_cat) p->trace_cat = be->host_memory ? "op" : "gpu";
    be->hooks = h;
    return NSTF_OK;
}

nstf_status nstf_prof_collect(nstf_prof *p) {
    nstf_backend *be = p->be;
    for (int i = 0; i < p->n_recs; i++) {
        nstf_prof_rec *r = &p->recs[i];
        uint64_t a = 0, b = 0;
        NSTF_TRY(be->vt->mark_ns(be, 0, 2 * i, &a));
        NSTF_TRY(be->vt->mark_ns(be, 0, 2 * i + 1, &b));
        r->t0_ns = p->host_t0 + a;
        r->t1_ns = p->host_t0 + (b > a ? b : a);
        nstf_prof_add(p, r->label, r->layer, r->cost, r->t0_ns, r->t1_ns);
    }
    p->collected = true;
    return NSTF_OK;
}

void nstf_prof_detach(nstf_prof *p) {
    if (p->be) {
        nstf_backend *be = p->be;
        if (be->hooks == p->hooks) be->hooks = NULL;
        (void)be->vt->set_opt(be, NSTF_OPT_PROFILE, 0);
    }
    nstf_free(p->hooks);
    nstf_free(p->recs);
    p->hooks = NULL;
    p->recs = NULL;
    p->be = NULL;
    p->n_recs = p->cap = 0;
}

void nstf_prof_end(nstf_prof *p, const char *label, int layer, nstf_op_cost cost, uint64_t t0) {
    nstf_prof_add(p, label, layer, cost, t0, nstf_now_ns());
}

void nstf_prof_add(nstf_prof *p, const char *label, int layer, nstf_op_cost cost, uint64_t t0, uint64_t t1) {
    nstf_prof_site *s = NULL;
    for (int i = 0; i < p->n_sites; i++)
        if (p->sites[i].label == label || !strcmp(p->sites[i].label, label)) {
            s = &p->sites[i];
            break;
        }
    if (!s) {
        if (p->n_sites == NSTF_PROF_MAX_SITES) {
            p->dropped++;
            return;
        }
        s = &p->sites[p->n_sites++];
        s->label = label;
    }
    s->calls++;
    s->total_ns += t1 > t0 ? t1 - t0 : 0;
    s->flops += cost.flops;
    s->bytes += cost.bytes;
    s->int8 = cost.int8;
    /* a failed append (out of memory) only loses trace detail, never the table */
    if (p->trace)
        (void)nstf_trace_span(p->trace, label, p->trace_cat ? p->trace_cat : "op", t0, t1, layer, cost.flops,
                              cost.bytes);
}
