/* profiler.c — the op cost model and per-site accumulation. */
#include "prof/profiler.h"

#include <string.h>

static double row_bytes(nstf_type type, int64_t n) {
    uint64_t b;
    return nstf_type_row_bytes(type, n, &b) ? (double)b : 4.0 * (double)n;
}

static bool is_quantized(nstf_type t) {
    return t == NSTF_TYPE_Q8_0 || t == NSTF_TYPE_Q4_0 || t == NSTF_TYPE_Q4_1;
}

nstf_op_cost nstf_cost_get_rows(nstf_type type, int64_t n_tok, int64_t dim) {
    /* one dequantize multiply per element; reads the rows, writes fp32 */
    nstf_op_cost c = {(double)n_tok * dim, (double)n_tok * (row_bytes(type, dim) + 4.0 * dim + 4.0), false};
    return c;
}

nstf_op_cost nstf_cost_rmsnorm(int64_t n_tok, int64_t dim) {
    /* x^2 and sum (2), scale and weight (2) per element */
    nstf_op_cost c = {4.0 * n_tok * dim, 4.0 * (2.0 * n_tok * dim + dim), false};
    return c;
}

nstf_op_cost nstf_cost_add(int64_t n) {
    nstf_op_cost c = {(double)n, 12.0 * n, false};
    return c;
}

nstf_op_cost nstf_cost_swiglu(int64_t n) {
    /* silu(g) * u: exp, add, divide, two multiplies ~ 5 */
    nstf_op_cost c = {5.0 * n, 12.0 * n, false};
    return c;
}

nstf_op_cost nstf_cost_rope(int64_t n_tok, int n_heads, int head_dim) {
    /* per rotated pair: 4 multiplies and 2 adds; in place read + write */
    double elems = (double)n_tok * n_heads * head_dim;
    nstf_op_cost c = {3.0 * elems, 8.0 * elems + 4.0 * n_tok, false};
    return c;
}

nstf_op_cost nstf_cost_matmul(nstf_type wtype, int64_t n_tok, int64_t n_in, int64_t n_out, bool int8_act) {
    nstf_op_cost c;
    c.flops = 2.0 * n_tok * n_in * n_out;
    c.bytes = (double)n_out * row_bytes(wtype, n_in) + 4.0 * n_tok * (n_in + n_out);
    c.int8 = int8_act && is_quantized(wtype);
    return c;
}

nstf_op_cost nstf_cost_attention(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim) {
    /* sum over t of (pos0 + t + 1) visible positions */
    double visible = (double)n_tok * pos0 + (double)n_tok * (n_tok + 1) / 2.0;
    nstf_op_cost c;
    c.flops = 4.0 * visible * n_heads * head_dim + 5.0 * visible * n_heads; /* + softmax */
    /* q and out, plus the K and V rows of every position read once */
    c.bytes = 8.0 * n_tok * n_heads * head_dim + 8.0 * (double)(pos0 + n_tok) * n_kv_heads * head_dim;
    c.int8 = false;
    return c;
}

void nstf_prof_reset(nstf_prof *p) {
    nstf_trace *t = p->trace;
    memset(p, 0, sizeof *p);
    p->trace = t;
}

void nstf_prof_end(nstf_prof *p, const char *label, int layer, nstf_op_cost cost, uint64_t t0) {
    uint64_t t1 = nstf_now_ns();
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
    if (p->trace) (void)nstf_trace_span(p->trace, label, "op", t0, t1, layer, cost.flops, cost.bytes);
}
