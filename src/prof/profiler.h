/* profiler.h — per-op timing of the forward pass, with each op's FLOPs and
 * bytes from its shapes (the cost model), for the profile table, the
 * roofline and the trace.
 *
 * The hook: the model code wraps every op call in NSTF_PROF_OP. When no
 * profiler is attached (cpu->prof == NULL) that is one predictable branch
 * and the cost expression is never evaluated, so the default path keeps
 * its speed. A GPU backend records its ops into the same nstf_prof with
 * event times. */
#ifndef NSTF_PROF_PROFILER_H
#define NSTF_PROF_PROFILER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "prof/timer.h"
#include "prof/trace.h"

/* FLOPs and bytes of one op call. Bytes are the op's compulsory traffic:
 * every input read once and every output written once (weights at their
 * stored size), which is what a roofline places an op by. int8 says the
 * op's arithmetic runs as int8 dot products (quantized matmul in the
 * default mode), so its compute ceiling is the int8 one. */
typedef struct nstf_op_cost {
    double flops;
    double bytes;
    bool int8;
} nstf_op_cost;

nstf_op_cost nstf_cost_get_rows(nstf_type type, int64_t n_tok, int64_t dim);
nstf_op_cost nstf_cost_rmsnorm(int64_t n_tok, int64_t dim);
nstf_op_cost nstf_cost_add(int64_t n);
nstf_op_cost nstf_cost_swiglu(int64_t n);
nstf_op_cost nstf_cost_rope(int64_t n_tok, int n_heads, int head_dim);
/* y[n_tok, n_out] = x[n_tok, n_in] W^T; int8_act: activations quantized
 * to 8-bit blocks (the default CPU path for quantized W). */
nstf_op_cost nstf_cost_matmul(nstf_type wtype, int64_t n_tok, int64_t n_in, int64_t n_out, bool int8_act);
/* Causal attention of n_tok queries at pos0.. over the cache (each token
 * sees pos0 + t + 1 positions): QK^T and PV are 2 FLOPs per MAC each. */
nstf_op_cost nstf_cost_attention(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim);

enum { NSTF_PROF_MAX_SITES = 64 };

/* Totals of one call site ("matmul.attn_q", "attention", ...). */
typedef struct nstf_prof_site {
    const char *label; /* borrowed: a string literal */
    int64_t calls;
    uint64_t total_ns;
    double flops, bytes;
    bool int8;
} nstf_prof_site;

typedef struct nstf_prof {
    nstf_prof_site sites[NSTF_PROF_MAX_SITES];
    int n_sites;
    int64_t dropped;   /* calls at sites beyond NSTF_PROF_MAX_SITES */
    nstf_trace *trace; /* optional, not owned: spans of every op call */
} nstf_prof;

void nstf_prof_reset(nstf_prof *p);

static inline uint64_t nstf_prof_begin(nstf_prof *p) {
    (void)p;
    return nstf_now_ns();
}
/* Account one call that began at t0 (from nstf_prof_begin). */
void nstf_prof_end(nstf_prof *p, const char *label, int layer, nstf_op_cost cost, uint64_t t0);

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
