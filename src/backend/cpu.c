/* cpu.c — the CPU backend: host memory, the thread pool and the fast CPU
 * ops (nstf_cpu_*, src/ops/cpu/) behind the backend table.
 *
 * It fuses nothing (can_fuse says no), so the forward runs every op on its
 * own, in the order of the reference forward. Activations are fp32 and
 * the KV cache is fp32 [seq][position][kv_head][head_dim]; a matmul
 * group's outputs are planes (matrix i's [n, n_out_i] after the ones
 * before it). Weights stay in the file's mapping (host_memory). */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "core/mem.h"
#include "core/clock.h"

typedef struct cpu_backend {
    nstf_backend base;
    nstf_pool *pool;
    nstf_cpu cpu;
    uint64_t *marks;
    int n_marks;
    int64_t n_ops;
} cpu_backend;

static cpu_backend *cpu_of(nstf_backend *be) { return (cpu_backend *)be; }

/* ---- memory ------------------------------------------------------------------ */

static nstf_status cpu_alloc(nstf_backend *be, uint64_t bytes, void **out) {
    (void)be;
    *out = NULL;
    if (bytes > SIZE_MAX) return nstf_set_error(NSTF_ERR_OOM, "host allocation of %llu bytes", (unsigned long long)bytes);
    *out = nstf_alloc((size_t)(bytes ? bytes : 1), "CPU backend buffer");
    return *out ? NSTF_OK : NSTF_ERR_OOM;
}

static void cpu_free(nstf_backend *be, void *p) {
    (void)be;
    nstf_free(p);
}

static nstf_status cpu_copy(nstf_backend *be, void *dst, const void *src, uint64_t bytes) {
    (void)be;
    if (dst != src && bytes) memcpy(dst, src, (size_t)bytes);
    return NSTF_OK;
}

static nstf_status cpu_zero(nstf_backend *be, void *p, uint64_t bytes) {
    (void)be;
    memset(p, 0, (size_t)bytes);
    return NSTF_OK;
}

static nstf_status cpu_sync(nstf_backend *be) {
    (void)be;
    return NSTF_OK;
}

static void cpu_mem(const nstf_backend *be, nstf_backend_mem *out) {
    const cpu_backend *c = (const cpu_backend *)be;
    memset(out, 0, sizeof *out);
    nstf_host_mem_info(&out->total, &out->free);
    out->workspace = c->cpu.scratch_bytes;
}

static void cpu_destroy(nstf_backend *be) {
    cpu_backend *c = cpu_of(be);
    nstf_cpu_release(&c->cpu);
    nstf_pool_free(c->pool);
    nstf_free(c->marks);
    nstf_free(c);
}

/* ---- planning ------------------------------------------------------------------ */

static int widest(const nstf_backend_plan *p) {
    int w = p->ffn_dim > p->dim ? p->ffn_dim : p->dim;
    return p->n_heads * p->head_dim > w ? p->n_heads * p->head_dim : w;
}

static nstf_status cpu_plan(nstf_backend *be, const nstf_backend_plan *p, uint64_t *ws) {
    (void)be;
    /* the matmul's quantized activations: one int8 block (34 bytes) per 32 */
    uint64_t n = 0;
    if (!nstf_mul_ok((uint64_t)(p->n_batch > 0 ? p->n_batch : 1), (uint64_t)widest(p), &n))
        return nstf_set_error(NSTF_ERR_RANGE, "CPU scratch for batch %d overflows", p->n_batch);
    *ws = n / 32 * 34 + 64;
    return NSTF_OK;
}

static nstf_status cpu_prepare(nstf_backend *be, const nstf_backend_plan *p) {
    return nstf_cpu_reserve(&cpu_of(be)->cpu, p->n_batch, widest(p));
}

static void cpu_place(nstf_backend *be, const nstf_matrix *const *w, int n_w, int64_t n, void *buf, nstf_view *out) {
    (void)be;
    float *p = buf;
    for (int i = 0; i < n_w; i++) {
        out[i] = (nstf_view){p, NSTF_TYPE_F32, w[i]->n_out};
        p += n * w[i]->n_out;
    }
}

static bool cpu_can_fuse(nstf_backend *be, const nstf_op_args *a) {
    (void)be, (void)a;
    return false;
}

/* ---- forward bracket ---------------------------------------------------------------- */

static nstf_status cpu_begin(nstf_backend *be, const nstf_batch *b, nstf_batch_io *io, bool *replayed) {
    (void)be;
    io->ids = b->tokens;
    io->pos = b->pos;
    io->seq = b->seq;
    *replayed = false;
    return NSTF_OK;
}

static nstf_status cpu_end(nstf_backend *be, const nstf_batch *b, nstf_status st, const nstf_fwd_out *o, bool *retry) {
    (void)be, (void)b;
    *retry = false;
    if (st != NSTF_OK) return st;
    if (o->logits_host && o->logits_host != o->logits)
        memcpy(o->logits_host, o->logits, (size_t)o->rows * (size_t)o->n_vocab * sizeof(float));
    if (o->argmax_host && o->argmax) *o->argmax_host = *o->argmax;
    return NSTF_OK;
}

/* ---- ops ------------------------------------------------------------------------------ */

/* Views the CPU ops take: fp32 rows of exactly `n` elements. */
static bool dense(nstf_view v, int64_t n) { return v.data && v.type == NSTF_TYPE_F32 && v.stride == n; }

static nstf_status layout_error(const nstf_op_args *a) {
    return nstf_set_error(NSTF_ERR_INTERNAL, "CPU backend: %s (%s): views must be dense fp32 rows", nstf_op_name(a->op),
                          a->label ? a->label : "?");
}

static nstf_status op_get_rows(nstf_backend *be, const nstf_op_args *a) {
    const nstf_matrix *t = a->get_rows.table;
    if (!dense(a->get_rows.out, t->n_in)) return layout_error(a);
    nstf_cpu_get_rows(&cpu_of(be)->cpu, t->type, t->data, a->get_rows.ids, a->get_rows.out.data, a->get_rows.n, t->n_in);
    return NSTF_OK;
}

static nstf_status op_rmsnorm(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    const int64_t n = a->rmsnorm.n, dim = a->rmsnorm.dim;
    if (!dense(a->rmsnorm.y, dim)) return layout_error(a);
    if (a->rmsnorm.res) nstf_cpu_add(cpu, a->rmsnorm.x, a->rmsnorm.res, a->rmsnorm.x, n * dim);
    nstf_cpu_rmsnorm(cpu, a->rmsnorm.x, a->rmsnorm.w, a->rmsnorm.y.data, n, dim, a->rmsnorm.eps);
    return NSTF_OK;
}

static nstf_status op_add(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu_add(&cpu_of(be)->cpu, a->add.x, a->add.y, a->add.x, a->add.n);
    return NSTF_OK;
}

static nstf_status op_matmul(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    if (a->matmul.epi != NSTF_MM_STORE || a->matmul.norm_x)
        return nstf_set_error(NSTF_ERR_INTERNAL, "CPU backend: %s: fused matmul asked for", a->label ? a->label : "?");
    for (int i = 0; i < a->matmul.n_w; i++) {
        const nstf_matrix *w = a->matmul.w[i];
        if (!dense(a->matmul.x, w->n_in) || !dense(a->matmul.out[i], w->n_out)) return layout_error(a);
        if (cpu->precise)
            nstf_cpu_matmul_precise(cpu, w->type, w->data, a->matmul.x.data, a->matmul.out[i].data, a->matmul.n, w->n_in,
                                    w->n_out);
        else
            nstf_cpu_matmul(cpu, w->type, w->data, a->matmul.x.data, a->matmul.out[i].data, a->matmul.n, w->n_in,
                            w->n_out);
    }
    return NSTF_OK;
}

static nstf_status op_rope(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    const nstf_rope_args *r = &a->rope.r;
    if (!dense(a->rope.q, (int64_t)r->n_heads * r->head_dim) ||
        (r->n_kv_heads > 0 && !dense(a->rope.k, (int64_t)r->n_kv_heads * r->head_dim)))
        return layout_error(a);
    nstf_cpu_rope(cpu, a->rope.q.data, r->pos, a->rope.n, r->n_heads, r->head_dim, r->base, r->mode);
    if (r->n_kv_heads > 0) nstf_cpu_rope(cpu, a->rope.k.data, r->pos, a->rope.n, r->n_kv_heads, r->head_dim, r->base, r->mode);
    return NSTF_OK;
}

/* The batch's K and V rows go into the cache of their sequence at their
 * positions; then each run of one sequence at consecutive positions
 * attends as one causal block. */
static nstf_status op_attention(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    const int hd = a->attention.head_dim;
    const int64_t n = a->attention.n, n_ctx = a->attention.n_ctx, qd = (int64_t)a->attention.n_heads * hd,
                  kvd = (int64_t)a->attention.n_kv_heads * hd;
    const int32_t *pos = a->attention.pos, *seq = a->attention.seq;
    if (!dense(a->attention.q, qd) || !dense(a->attention.k, kvd) || !dense(a->attention.v, kvd) ||
        !dense(a->attention.out, qd))
        return layout_error(a);
    const float *q = a->attention.q.data, *k = a->attention.k.data, *v = a->attention.v.data;
    float *kc = a->attention.k_cache, *vc = a->attention.v_cache, *out = a->attention.out.data;
    for (int64_t t = 0; t < n; t++) {
        const int64_t row = ((seq ? seq[t] : 0) * n_ctx + pos[t]) * kvd;
        memcpy(kc + row, k + t * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + row, v + t * kvd, (size_t)kvd * sizeof(float));
    }
    for (int64_t t0 = 0; t0 < n;) {
        const int32_t s = seq ? seq[t0] : 0;
        int64_t t1 = t0 + 1;
        while (t1 < n && (seq ? seq[t1] : 0) == s && pos[t1] == pos[t1 - 1] + 1) t1++;
        const int64_t base = (int64_t)s * n_ctx * kvd;
        nstf_cpu_attention(cpu, q + t0 * qd, kc + base, vc + base, out + t0 * qd, t1 - t0, pos[t0],
                           a->attention.n_heads, a->attention.n_kv_heads, hd, a->attention.scale);
        t0 = t1;
    }
    return NSTF_OK;
}

static nstf_status op_swiglu(nstf_backend *be, const nstf_op_args *a) {
    const int64_t f = a->swiglu.n_ff;
    if (!dense(a->swiglu.gate, f) || !dense(a->swiglu.up, f) || !dense(a->swiglu.y, f)) return layout_error(a);
    nstf_cpu_swiglu(&cpu_of(be)->cpu, a->swiglu.gate.data, a->swiglu.up.data, a->swiglu.y.data, a->swiglu.n * f);
    return NSTF_OK;
}

static nstf_status op_argmax(nstf_backend *be, const nstf_op_args *a) {
    if (!dense(a->argmax.x, a->argmax.n)) return layout_error(a);
    nstf_cpu_argmax(&cpu_of(be)->cpu, a->argmax.x.data, a->argmax.out, a->argmax.n_rows, a->argmax.n);
    return NSTF_OK;
}

static nstf_status op_matmul_lr(nstf_backend *be, const nstf_op_args *a) {
    const nstf_matrix *fa = a->matmul_lr.a, *fb = a->matmul_lr.b;
    if (!dense(a->matmul_lr.x, fa->n_in) || !dense(a->matmul_lr.tmp, fa->n_out) || !dense(a->matmul_lr.out, fb->n_out))
        return layout_error(a);
    nstf_cpu_matmul_lr(&cpu_of(be)->cpu, fa->type, fa->data, fb->type, fb->data, a->matmul_lr.x.data,
                       a->matmul_lr.tmp.data, a->matmul_lr.out.data, a->matmul_lr.n, fa->n_in, fa->n_out, fb->n_out);
    return NSTF_OK;
}

/* Counts ops (the CPU's "kernels") and dispatches. */
#define COUNTED(name)                                                          \
    static nstf_status counted_##name(nstf_backend *be, const nstf_op_args *a) { \
        cpu_of(be)->n_ops++;                                                   \
        return op_##name(be, a);                                               \
    }
COUNTED(get_rows)
COUNTED(rmsnorm)
COUNTED(add)
COUNTED(matmul)
COUNTED(rope)
COUNTED(attention)
COUNTED(swiglu)
COUNTED(argmax)
COUNTED(matmul_lr)

/* ---- options, marks ---------------------------------------------------------------------- */

static nstf_status cpu_set_opt(nstf_backend *be, nstf_backend_opt opt, int v) {
    (void)be;
    if (opt == NSTF_OPT_PROFILE) return NSTF_OK;
    if (opt == NSTF_OPT_LEVEL && v == 0) return NSTF_OK;
    if (opt == NSTF_OPT_LEVEL)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "execution level %d: the CPU backend has only one level (L0); levels L1-L3 are GPU "
                              "execution strategies",
                              v);
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "the CPU backend has no option %d", (int)opt);
}

static int cpu_get_opt(const nstf_backend *be, nstf_backend_opt opt) {
    (void)be, (void)opt;
    return 0;
}

static nstf_status cpu_marks_reserve(nstf_backend *be, int cap) {
    cpu_backend *c = cpu_of(be);
    if (cap <= c->n_marks) return NSTF_OK;
    uint64_t *m = nstf_calloc((size_t)cap, sizeof *m, "time marks");
    if (!m) return NSTF_ERR_OOM;
    nstf_free(c->marks);
    c->marks = m;
    c->n_marks = cap;
    return NSTF_OK;
}

static nstf_status cpu_mark(nstf_backend *be, int i) {
    cpu_backend *c = cpu_of(be);
    if (i < 0 || i >= c->n_marks) return nstf_set_error(NSTF_ERR_RANGE, "time mark %d of %d", i, c->n_marks);
    c->marks[i] = nstf_now_ns();
    return NSTF_OK;
}

static nstf_status cpu_mark_ns(nstf_backend *be, int i, int j, uint64_t *ns) {
    cpu_backend *c = cpu_of(be);
    if (i < 0 || j < 0 || i >= c->n_marks || j >= c->n_marks)
        return nstf_set_error(NSTF_ERR_RANGE, "time marks %d, %d of %d", i, j, c->n_marks);
    *ns = c->marks[j] > c->marks[i] ? c->marks[j] - c->marks[i] : 0;
    return NSTF_OK;
}

static int64_t cpu_kernels(const nstf_backend *be) { return ((const cpu_backend *)be)->n_ops; }
static int64_t cpu_graph_kernels(const nstf_backend *be) {
    (void)be;
    return 0;
}

static const nstf_backend_vt k_cpu_vt = {
    .name = "CPU",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .mem = cpu_mem,
    .plan = cpu_plan,
    .prepare = cpu_prepare,
    .place = cpu_place,
    .can_fuse = cpu_can_fuse,
    .begin = cpu_begin,
    .end = cpu_end,
    .ops = {
#define NSTF_X(U, l, ref, cpu, gpu, d) [NSTF_OP_##U] = counted_##l,
        NSTF_OPS(NSTF_X)
#undef NSTF_X
    },
    .n_levels = 1,
    .set_opt = cpu_set_opt,
    .get_opt = cpu_get_opt,
    .marks_reserve = cpu_marks_reserve,
    .mark = cpu_mark,
    .mark_ns = cpu_mark_ns,
    .kernels = cpu_kernels,
    .graph_kernels = cpu_graph_kernels,
};

nstf_status nstf_backend_cpu_create(const nstf_cpu_params *p, nstf_backend **out) {
    *out = NULL;
    nstf_cpu_params d = {0};
    if (!p) p = &d;
    if (p->n_threads < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "thread count %d must be positive", p->n_threads);
    cpu_backend *c = nstf_calloc(1, sizeof *c, "CPU backend");
    if (!c) return NSTF_ERR_OOM;
    c->base.vt = &k_cpu_vt;
    c->base.act_type = NSTF_TYPE_F32;
    c->base.kv_type = NSTF_TYPE_F32;
    c->base.host_memory = true;
    c->base.int8_act = !p->precise;
    snprintf(c->base.device, sizeof c->base.device, "cpu");
    nstf_status st = nstf_pool_create(p->n_threads ? p->n_threads : nstf_cpu_count(), &c->pool);
    if (st != NSTF_OK) {
        nstf_free(c);
        return st;
    }
    c->cpu.pool = c->pool;
    c->cpu.precise = p->precise;
    c->cpu.deterministic = p->deterministic;
    *out = &c->base;
    return NSTF_OK;
}

nstf_pool *nstf_backend_cpu_pool(nstf_backend *be) {
    return be && be->vt == &k_cpu_vt ? cpu_of(be)->pool : NULL;
}
