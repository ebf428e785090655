/* profiler.h — per-op timing of the forward pass, with each op's FLOPs and
 * bytes from the op table's cost model, for the profile table, the
 * roofline and the trace.
 *
 * The hook: nstf_prof_attach() installs hooks on a session's backend; the
 * forward calls them around every op it dispatches, and they bracket the
 * op with two of the backend's time marks (a clock read on the CPU, events
 * on a GPU stream) and keep its label, layer, block, cost and kernel
 * count. nstf_prof_collect() turns the marks of the forwards run since
 * into per-site totals (and trace spans). Without a profiler attached the
 * forward pays one branch per op. */
#ifndef NSTF_PROF_PROFILER_H
#define NSTF_PROF_PROFILER_H

#include <stdbool.h>
#include <stdint.h>

#include "nstf.h"
#include "ops/ops.h"
#include "prof/timer.h"
#include "prof/trace.h"

typedef struct nstf_backend nstf_backend;

enum { NSTF_PROF_MAX_SITES = 64 };

/* Totals of one call site ("matmul.attn_q", "attention", ...). */
typedef struct nstf_prof_site {
    const char *label; /* borrowed: a string literal */
    int64_t calls;
    uint64_t total_ns;
    double flops, bytes;
    bool int8;
} nstf_prof_site;

/* Where an op's time goes in a profile split by kind of work. */
typedef enum nstf_prof_cat {
    NSTF_PROF_CAT_ATTN = 0, /* Q/K/V/O projections, RoPE, KV write, attention */
    NSTF_PROF_CAT_FFN,      /* gate/up/down projections, SwiGLU */
    NSTF_PROF_CAT_NORM,     /* RMSNorm (with the residual add when fused) */
    NSTF_PROF_CAT_RESID,    /* standalone residual adds */
    NSTF_PROF_CAT_OTHER,    /* embedding, logits, argmax */
    NSTF_PROF_N_CAT
} nstf_prof_cat;

/* One op call of the forwards since the last collect. */
typedef struct nstf_prof_rec {
    const char *label;
    int layer;
    nstf_op op;
    nstf_block block;
    nstf_prof_cat cat;
    nstf_op_cost cost;
    int64_t kernels; /* the backend's kernels (CPU: ops) this call launched */
    uint64_t t0_ns, t1_ns; /* filled by nstf_prof_collect, on the trace's clock */
} nstf_prof_rec;

typedef struct nstf_prof {
    nstf_prof_site sites[NSTF_PROF_MAX_SITES];
    int n_sites;
    int64_t dropped;   /* calls at sites beyond NSTF_PROF_MAX_SITES, or beyond the record capacity */
    nstf_trace *trace; /* optional, not owned: spans of every op call */
    const char *trace_cat; /* the spans' category ("op"; "gpu" on a GPU) */
    /* attached to a backend: the records of the ops since the last collect */
    nstf_backend *be;
    nstf_prof_rec *recs; /* [cap] */
    int n_recs, cap;
    int64_t k0;          /* kernel count at the current op's start */
    uint64_t host_t0;    /* host clock at the first record's mark */
    bool collected;      /* the next op starts a new set of records */
    void *hooks;         /* the installed hooks (owned) */
} nstf_prof;

void nstf_prof_reset(nstf_prof *p);
/* Sort the sites by total time, largest first; returns the sum of their times (ns). */
uint64_t nstf_prof_sort_sites(nstf_prof *p);

static inline uint64_t nstf_prof_begin(nstf_prof *p) {
    (void)p;
    return nstf_now_ns();
}
/* Account one call that began at t0 (from nstf_prof_begin). */
void nstf_prof_end(nstf_prof *p, const char *label, int layer, nstf_op_cost cost, uint64_t t0);
/* Account one call that ran from t0 to t1 (ns). */
void nstf_prof_add(nstf_prof *p, const char *label, int layer, nstf_op_cost cost, uint64_t t0, uint64_t t1);

/* Attach to a session: every op of its following forwards is recorded
 * (up to cap per collect, 0 = 4096; more are counted as dropped), and the
 * backend runs without graphs or overlapped launches, so the marks
 * bracket each op. */
nstf_status nstf_prof_attach(nstf_prof *p, nstf_session *s, int cap);
/* The same on a backend that something else drives, and on a trainer's
 * (include/nstf_train.h): every op of its following steps. */
nstf_status nstf_prof_attach_backend(nstf_prof *p, nstf_backend *be, int cap);
typedef struct nstf_trainer nstf_trainer;
nstf_status nstf_prof_attach_trainer(nstf_prof *p, nstf_trainer *t, int cap);
/* Turn the records since the last collect into site totals and trace
 * spans; waits for the backend. The records stay readable in p->recs
 * (p->n_recs of them) until the next forward, which starts afresh. */
nstf_status nstf_prof_collect(nstf_prof *p);
/* Detach (the backend's normal launches resume) and free the records. */
void nstf_prof_detach(nstf_prof *p);


/* Wrap one op call: `prof` is an nstf_prof pointer (may be NULL), `cost`
 * an nstf_op_cost expression evaluated only when profiling. */
#define NSTF_PROF_OP(prof, label, layer, cost, call)                        \
    do {                                                                    \
        nstf_prof *nstf_prof_p_ = (prof);                                   \
        if (__builtin_expect(nstf_prof_p_ != NULL, 0)) {                    \
            uint64_t nstf_prof_t0_ = nstf_prof_begin(nstf_prof_p_);         \
            call;                                                           \
            nstf_prof_end(nstf_prof_p_, label, layer, cost, nstf_prof_t0_); \
        } else {                                                            \
            call;                                                           \
        }                                                                   \
    } while (0)

#endif
