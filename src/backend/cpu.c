/* cpu.c — the CPU backend: host memory, the thread pool and the fast CPU
 * ops (nstf_cpu_*, src/ops/cpu/) behind the backend table.
 *
 * It fuses nothing (can_fuse says no), so the forward runs every op on its
 * own, in the order of the reference forward. Activations are fp32 and
 * the KV cache is fp32 [seq][position][kv_head][head_dim], or paged
 * ([block][row][kv_head][head_dim] through the batch's block table); a matmul
 * group's outputs are planes (matrix i's [n, n_out_i] after the ones
 * before it). Weights stay in the file's mapping (host_memory). */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "core/mem.h"
#include "core/clock.h"
#include "ops/backward.h"
#include "ops/optim.h"

typedef struct cpu_backend {
    nstf_backend base;
    nstf_pool *pool;
    nstf_cpu cpu;
    uint64_t *marks;
    int n_marks;
    int64_t n_ops;
    float *tscratch; /* the training ops' scratch, grown on first need */
    int64_t tscratch_n;
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
    out->workspace = c->cpu.scratch_bytes + c->cpu.a16_bytes;
}

static void cpu_destroy(nstf_backend *be) {
    cpu_backend *c = cpu_of(be);
    nstf_cpu_release(&c->cpu);
    nstf_free(c->tscratch);
    nstf_cpu_release_a16(&c->cpu);
    nstf_pool_free(c->pool);
    nstf_free(c->marks);
    nstf_free(c);
}

/* ---- planning ------------------------------------------------------------------ */

static int widest(const nstf_backend_plan *p) {
    int w = p->ffn_dim > p->dim ? p->ffn_dim : p->dim;
    return p->n_heads * p->head_dim > w ? p->n_heads * p->head_dim : w;
}

/* 16-bit activations: the stacked rows and outputs of a batch of layer
 * matmuls, and at least one row of the logits */
static uint64_t a16_floats(const nstf_backend_plan *p) {
    const uint64_t layers = 4 * (uint64_t)p->n_batch * (uint64_t)widest(p),
                   logits = 2 * ((uint64_t)p->dim + (uint64_t)p->n_vocab);
    return layers > logits ? layers : logits;
}

static nstf_status cpu_plan(nstf_backend *be, const nstf_backend_plan *p, uint64_t *ws) {
    const bool a16 = cpu_of(be)->cpu.a16;
    /* the matmul's quantized activations: one int8 block (34 bytes) per 32,
     * of twice the rows with 16-bit activations, and their fp32 rows */
    uint64_t n = 0;
    if (!nstf_mul_ok((uint64_t)(p->n_batch > 0 ? p->n_batch : 1) * (a16 ? 2 : 1), (uint64_t)widest(p), &n) ||
        n > (UINT64_MAX - 64) / 34 || a16_floats(p) > UINT64_MAX / 8)
        return nstf_set_error(NSTF_ERR_RANGE, "CPU scratch for batch %d overflows", p->n_batch);
    *ws = n / 32 * 34 + 64 + (a16 ? a16_floats(p) * sizeof(float) : 0);
    return NSTF_OK;
}

static nstf_status cpu_prepare(nstf_backend *be, const nstf_backend_plan *p) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    NSTF_TRY(nstf_cpu_reserve(cpu, p->n_batch, widest(p)));
    if (!cpu->a16) return NSTF_OK;
    NSTF_TRY(nstf_cpu_reserve_a16(cpu, p->n_batch, widest(p), widest(p)));
    return nstf_cpu_reserve_a16(cpu, 1, p->dim, p->n_vocab);
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
    io->rows = b->rows;
    io->blocks = b->blocks;
    *replayed = false;
    return NSTF_OK;
}

static nstf_status cpu_end(nstf_backend *be, const nstf_batch *b, nstf_status st, const nstf_fwd_out *o, bool *retry) {
    (void)be, (void)b;
    *retry = false;
    if (st != NSTF_OK) return st;
    if (o->logits_host && o->logits_host != o->logits)
        memcpy(o->logits_host, o->logits, (size_t)o->rows * (size_t)o->n_vocab * sizeof(float));
    if (o->argmax_host && o->argmax && o->argmax_host != o->argmax)
        memcpy(o->argmax_host, o->argmax, (size_t)o->n_argmax * sizeof(int32_t));
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
        else if (cpu->a16)
            nstf_cpu_matmul_a16(cpu, w->type, w->data, a->matmul.x.data, a->matmul.out[i].data, a->matmul.n, w->n_in,
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
    nstf_cpu_rope_ff(cpu, a->rope.q.data, r->pos, a->rope.n, r->n_heads, r->head_dim, r->base, r->freq_factors, r->mode);
    if (r->n_kv_heads > 0)
        nstf_cpu_rope_ff(cpu, a->rope.k.data, r->pos, a->rope.n, r->n_kv_heads, r->head_dim, r->base, r->freq_factors,
                         r->mode);
    return NSTF_OK;
}

/* Rows k[t], v[t] [n, kvd] into the cache at pos[t] of sequence seq[t]
 * (through the block table of bs positions when blocks is given). */
static void kv_write(const float *k, const float *v, float *kc, float *vc, const int32_t *pos, const int32_t *seq,
                     const int32_t *blocks, int bs, int64_t n, int64_t n_ctx, int64_t kvd) {
    const int64_t bps = blocks ? n_ctx / bs : 0; /* blocks per sequence */
    for (int64_t t = 0; t < n; t++) {
        const int64_t s = seq ? seq[t] : 0;
        const int64_t row = (blocks ? (int64_t)blocks[s * bps + pos[t] / bs] * bs + pos[t] % bs : s * n_ctx + pos[t]) * kvd;
        memcpy(kc + row, k + t * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + row, v + t * kvd, (size_t)kvd * sizeof(float));
    }
}

static nstf_status attention_q8(cpu_backend *c, const nstf_op_args *a);

/* The batch's K and V rows go into the cache of their sequence at their
 * positions (through the block table when the cache is paged); then each
 * run of one sequence at consecutive positions attends as one causal
 * block. */
static nstf_status op_attention(nstf_backend *be, const nstf_op_args *a) {
    if (a->attention.kv_q8) return attention_q8(cpu_of(be), a);
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    const int hd = a->attention.head_dim;
    const int64_t n = a->attention.n, n_ctx = a->attention.n_ctx, qd = (int64_t)a->attention.n_heads * hd,
                  kvd = (int64_t)a->attention.n_kv_heads * hd;
    const int32_t *pos = a->attention.pos, *seq = a->attention.seq, *blocks = a->attention.blocks;
    const int bs = a->attention.block_size;
    if (blocks && (bs < 1 || n_ctx % bs != 0))
        return nstf_set_error(NSTF_ERR_INTERNAL, "CPU backend: paged attention with block size %d over %lld positions",
                              bs, (long long)n_ctx);
    const int64_t bps = blocks ? n_ctx / bs : 0; /* blocks per sequence */
    if (!dense(a->attention.q, qd) || !dense(a->attention.k, kvd) || !dense(a->attention.v, kvd) ||
        !dense(a->attention.out, qd))
        return layout_error(a);
    const float *q = a->attention.q.data;
    float *kc = a->attention.k_cache, *vc = a->attention.v_cache, *out = a->attention.out.data;
    const int64_t S = a->attention.n_seq > 1 ? a->attention.n_seq : 1;
    if (!kc || !vc || S > 1) { /* the training forward: each sequence attends to its own k, v rows */
        if (kc || vc || !a->attention.lse || a->attention.pos0 != 0 || seq || blocks)
            return nstf_set_error(NSTF_ERR_INVALID_ARG,
                                  "CPU backend: attention without a cache or over %lld sequences is the training "
                                  "forward's (lse, position 0, no cache, no sequence slots)",
                                  (long long)S);
        const float *k = a->attention.k.data, *v = a->attention.v.data;
        for (int64_t b = 0; b < S; b++)
            nstf_cpu_attention_lse(cpu, q + b * n * qd, k + b * n * kvd, v + b * n * kvd, out + b * n * qd,
                                   a->attention.lse + b * n * a->attention.n_heads, n, 0, a->attention.n_heads,
                                   a->attention.n_kv_heads, hd, a->attention.scale);
        return NSTF_OK;
    }
    kv_write(a->attention.k.data, a->attention.v.data, kc, vc, pos, seq, blocks, bs, n, n_ctx, kvd);
    for (int64_t t0 = 0; t0 < n;) {
        const int32_t s = seq ? seq[t0] : 0;
        int64_t t1 = t0 + 1;
        while (t1 < n && (seq ? seq[t1] : 0) == s && pos[t1] == pos[t1 - 1] + 1) t1++;
        const int64_t base = (int64_t)s * n_ctx * kvd;
        if (blocks)
            nstf_cpu_attention_paged(cpu, q + t0 * qd, kc, vc, blocks + s * bps, bs, out + t0 * qd, t1 - t0, pos[t0],
                                     a->attention.n_heads, a->attention.n_kv_heads, hd, a->attention.scale,
                                     a->attention.window);
        else if (a->attention.lse)
            nstf_cpu_attention_lse(cpu, q + t0 * qd, kc + base, vc + base, out + t0 * qd,
                                   a->attention.lse + t0 * a->attention.n_heads, t1 - t0, pos[t0],
                                   a->attention.n_heads, a->attention.n_kv_heads, hd, a->attention.scale);
        else
            nstf_cpu_attention_sw(cpu, q + t0 * qd, kc + base, vc + base, out + t0 * qd, t1 - t0, pos[t0],
                                  a->attention.n_heads, a->attention.n_kv_heads, hd, a->attention.scale,
                                  a->attention.window);
        t0 = t1;
    }
    return NSTF_OK;
}

/* Arguments the sparse attention needs that it cannot repair (every
 * backend checks them the same way). */
static nstf_status sparse_args_error(const nstf_op_args *a) {
    const int B = a->attn_sparse.block;
    if (B < NSTF_SPARSE_BLOCK_MIN || B > NSTF_SPARSE_BLOCK_MAX || a->attn_sparse.topk < 0 ||
        a->attn_sparse.topk > NSTF_SPARSE_TOPK_MAX || a->attn_sparse.window < 0 || !a->attn_sparse.kmin ||
        !a->attn_sparse.kmax || !a->attn_sparse.sel || !a->attn_sparse.work)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "sparse attention: block %d (%d..%d), top-k %d (0..%d), window %d, or a buffer missing", B,
                              NSTF_SPARSE_BLOCK_MIN, NSTF_SPARSE_BLOCK_MAX, a->attn_sparse.topk, NSTF_SPARSE_TOPK_MAX,
                              a->attn_sparse.window);
    return NSTF_OK;
}

/* As op_attention over a contiguous cache; each run of one sequence at
 * consecutive positions updates its blocks' statistics and attends (one
 * token: sparsely). */
static nstf_status op_attn_sparse(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    NSTF_TRY(sparse_args_error(a));
    if (a->attn_sparse.kv_q8)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "sparse attention over a Q8_0 KV cache is not supported");
    const int hd = a->attn_sparse.head_dim, nkv = a->attn_sparse.n_kv_heads, nh = a->attn_sparse.n_heads,
              B = a->attn_sparse.block;
    const int64_t n = a->attn_sparse.n, n_ctx = a->attn_sparse.n_ctx, qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd,
                  nb = (n_ctx + B - 1) / B, ms = nstf_sparse_max_sel(a->attn_sparse.topk, B, a->attn_sparse.window);
    const int32_t *pos = a->attn_sparse.pos, *seq = a->attn_sparse.seq;
    if (!dense(a->attn_sparse.q, qd) || !dense(a->attn_sparse.k, kvd) || !dense(a->attn_sparse.v, kvd) ||
        !dense(a->attn_sparse.out, qd))
        return layout_error(a);
    const float *q = a->attn_sparse.q.data;
    float *kc = a->attn_sparse.k_cache, *vc = a->attn_sparse.v_cache, *out = a->attn_sparse.out.data;
    kv_write(a->attn_sparse.k.data, a->attn_sparse.v.data, kc, vc, pos, seq, NULL, 1, n, n_ctx, kvd);
    for (int64_t t0 = 0; t0 < n;) {
        const int32_t s = seq ? seq[t0] : 0;
        int64_t t1 = t0 + 1;
        while (t1 < n && (seq ? seq[t1] : 0) == s && pos[t1] == pos[t1 - 1] + 1) t1++;
        const int64_t base = (int64_t)s * n_ctx * kvd, sb = (int64_t)s * nb;
        nstf_cpu_attn_sparse(cpu, q + t0 * qd, kc + base, vc + base, out + t0 * qd, a->attn_sparse.kmin + sb * kvd,
                             a->attn_sparse.kmax + sb * kvd, a->attn_sparse.mass ? a->attn_sparse.mass + sb * nkv : NULL,
                             a->attn_sparse.mass_decay, a->attn_sparse.sel + t0 * nkv * ms, a->attn_sparse.work,
                             t1 - t0, pos[t0], nh, nkv, hd, a->attn_sparse.scale, B, a->attn_sparse.topk,
                             a->attn_sparse.window);
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

static nstf_status op_bias(nstf_backend *be, const nstf_op_args *a) {
    if (!dense(a->bias.x, a->bias.width)) return layout_error(a);
    nstf_cpu_bias(&cpu_of(be)->cpu, a->bias.x.data, a->bias.b, a->bias.n, a->bias.width);
    return NSTF_OK;
}

static nstf_status op_head_norm(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    const int hd = a->head_norm.head_dim, nh = a->head_norm.n_heads, nkv = a->head_norm.n_kv_heads;
    if (!dense(a->head_norm.q, (int64_t)nh * hd) || (nkv > 0 && !dense(a->head_norm.k, (int64_t)nkv * hd)))
        return layout_error(a);
    nstf_cpu_head_norm(cpu, a->head_norm.q.data, a->head_norm.wq, a->head_norm.n * nh, hd, a->head_norm.eps);
    if (nkv > 0)
        nstf_cpu_head_norm(cpu, a->head_norm.k.data, a->head_norm.wk, a->head_norm.n * nkv, hd, a->head_norm.eps);
    return NSTF_OK;
}

/* ---- training ops ------------------------------------------------------------------------- */

/* The training ops' scratch: at least n floats, kept (grown on first need,
 * so a step allocates only while its shapes are new). */
static float *tscratch(cpu_backend *c, int64_t n) {
    if (n <= c->tscratch_n) return c->tscratch;
    float *p = nstf_calloc((size_t)n, sizeof(float), "CPU training scratch");
    if (!p) return NULL;
    nstf_free(c->tscratch);
    c->tscratch = p;
    c->tscratch_n = n;
    return p;
}

/* op_attention over a Q8_0 cache (ops.h): the batch's rows are stored
 * quantized; each run of one sequence at consecutive positions attends to
 * its earlier positions read back from the cache (d * code) and to its own
 * k, v rows as given, through the fp32 attention on a copy of those rows
 * (the training scratch: 2 x (positions + run) x kv_dim floats). */
static nstf_status attention_q8(cpu_backend *c, const nstf_op_args *a) {
    nstf_cpu *cpu = &c->cpu;
    const int hd = a->attention.head_dim;
    const int64_t n = a->attention.n, n_ctx = a->attention.n_ctx, qd = (int64_t)a->attention.n_heads * hd,
                  kvd = (int64_t)a->attention.n_kv_heads * hd;
    const int32_t *pos = a->attention.pos, *seq = a->attention.seq;
    uint64_t rb = 0;
    if (a->attention.blocks || a->attention.lse || !a->attention.k_cache || !a->attention.v_cache ||
        !nstf_kv_row_bytes(true, 0, kvd, &rb))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "CPU backend: the Q8_0 KV cache is contiguous, without lse, with kv_dim a multiple of "
                              "32 (here %lld)",
                              (long long)kvd);
    if (!dense(a->attention.q, qd) || !dense(a->attention.k, kvd) || !dense(a->attention.v, kvd) ||
        !dense(a->attention.out, qd))
        return layout_error(a);
    const float *q = a->attention.q.data, *k = a->attention.k.data, *v = a->attention.v.data;
    uint8_t *kc = a->attention.k_cache, *vc = a->attention.v_cache;
    float *out = a->attention.out.data;
    for (int64_t t = 0; t < n; t++) {
        const uint64_t row = (uint64_t)((seq ? seq[t] : 0) * n_ctx + pos[t]) * rb;
        nstf_kv_q8_store(k + t * kvd, kvd, kc + row);
        nstf_kv_q8_store(v + t * kvd, kvd, vc + row);
    }
    for (int64_t t0 = 0; t0 < n;) {
        const int32_t s = seq ? seq[t0] : 0;
        int64_t t1 = t0 + 1;
        while (t1 < n && (seq ? seq[t1] : 0) == s && pos[t1] == pos[t1 - 1] + 1) t1++;
        const int64_t p0 = pos[t0], keys = p0 + (t1 - t0);
        float *kf = tscratch(c, 2 * keys * kvd), *vf = kf ? kf + keys * kvd : NULL;
        if (!kf) return NSTF_ERR_OOM;
        for (int64_t p = 0; p < p0; p++) {
            const uint64_t row = (uint64_t)(s * n_ctx + p) * rb;
            nstf_kv_q8_load(kc + row, kvd, kf + p * kvd);
            nstf_kv_q8_load(vc + row, kvd, vf + p * kvd);
        }
        memcpy(kf + p0 * kvd, k + t0 * kvd, (size_t)((t1 - t0) * kvd) * sizeof(float));
        memcpy(vf + p0 * kvd, v + t0 * kvd, (size_t)((t1 - t0) * kvd) * sizeof(float));
        nstf_cpu_attention_sw(cpu, q + t0 * qd, kf, vf, out + t0 * qd, t1 - t0, p0, a->attention.n_heads,
                              a->attention.n_kv_heads, hd, a->attention.scale, a->attention.window);
        t0 = t1;
    }
    return NSTF_OK;
}

static nstf_status op_get_rows_bwd(nstf_backend *be, const nstf_op_args *a) {
    if (!dense(a->get_rows_bwd.dout, a->get_rows_bwd.dim)) return layout_error(a);
    nstf_cpu_get_rows_bwd(&cpu_of(be)->cpu, a->get_rows_bwd.ids, a->get_rows_bwd.dout.data, a->get_rows_bwd.dtable,
                          a->get_rows_bwd.n, a->get_rows_bwd.dim);
    return NSTF_OK;
}

static nstf_status op_rmsnorm_bwd(nstf_backend *be, const nstf_op_args *a) {
    cpu_backend *c = cpu_of(be);
    const int64_t n = a->rmsnorm_bwd.n, dim = a->rmsnorm_bwd.dim;
    const nstf_view xa = a->rmsnorm_bwd.dx_act;
    if (xa.data && xa.data != a->rmsnorm_bwd.dx && !dense(xa, dim)) return layout_error(a);
    float *work = tscratch(c, n);
    if (!work) return NSTF_ERR_OOM;
    nstf_cpu_rmsnorm_bwd(&c->cpu, a->rmsnorm_bwd.x, a->rmsnorm_bwd.w, a->rmsnorm_bwd.dy, a->rmsnorm_bwd.dx,
                         a->rmsnorm_bwd.dw, n, dim, a->rmsnorm_bwd.eps, work);
    if (xa.data && xa.data != a->rmsnorm_bwd.dx) memcpy(xa.data, a->rmsnorm_bwd.dx, (size_t)(n * dim) * sizeof(float));
    return NSTF_OK;
}

static nstf_status op_rope_bwd(nstf_backend *be, const nstf_op_args *a) {
    nstf_cpu *cpu = &cpu_of(be)->cpu;
    const nstf_rope_args *r = &a->rope_bwd.r;
    if (!dense(a->rope_bwd.q, (int64_t)r->n_heads * r->head_dim) ||
        (r->n_kv_heads > 0 && !dense(a->rope_bwd.k, (int64_t)r->n_kv_heads * r->head_dim)))
        return layout_error(a);
    nstf_cpu_rope_bwd(cpu, a->rope_bwd.q.data, r->pos, a->rope_bwd.n, r->n_heads, r->head_dim, r->base, r->mode);
    if (r->n_kv_heads > 0)
        nstf_cpu_rope_bwd(cpu, a->rope_bwd.k.data, r->pos, a->rope_bwd.n, r->n_kv_heads, r->head_dim, r->base, r->mode);
    return NSTF_OK;
}

static nstf_status op_attention_bwd(nstf_backend *be, const nstf_op_args *a) {
    const int hd = a->attention_bwd.head_dim;
    const int64_t qd = (int64_t)a->attention_bwd.n_heads * hd, kvd = (int64_t)a->attention_bwd.n_kv_heads * hd;
    if (!dense(a->attention_bwd.q, qd) || !dense(a->attention_bwd.out, qd) || !dense(a->attention_bwd.dout, qd) ||
        !dense(a->attention_bwd.dq, qd) || !dense(a->attention_bwd.k, kvd) || !dense(a->attention_bwd.v, kvd) ||
        !dense(a->attention_bwd.dk, kvd) || !dense(a->attention_bwd.dv, kvd))
        return layout_error(a);
    const int64_t n = a->attention_bwd.n, S = a->attention_bwd.n_seq > 1 ? a->attention_bwd.n_seq : 1;
    const int64_t nk = a->attention_bwd.pos0 + n;
    if (S > 1 && a->attention_bwd.pos0 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "attention_bwd: %lld sequences after a cached prefix of %lld",
                              (long long)S, (long long)a->attention_bwd.pos0);
    for (int64_t b = 0; b < S; b++) /* each sequence on its own rows */
        nstf_cpu_attention_bwd(&cpu_of(be)->cpu, (const float *)a->attention_bwd.q.data + b * n * qd,
                               (const float *)a->attention_bwd.k.data + b * nk * kvd,
                               (const float *)a->attention_bwd.v.data + b * nk * kvd,
                               (const float *)a->attention_bwd.out.data + b * n * qd,
                               (const float *)a->attention_bwd.dout.data + b * n * qd,
                               a->attention_bwd.lse + b * n * a->attention_bwd.n_heads,
                               (float *)a->attention_bwd.dq.data + b * n * qd,
                               (float *)a->attention_bwd.dk.data + b * nk * kvd,
                               (float *)a->attention_bwd.dv.data + b * nk * kvd, n, a->attention_bwd.pos0,
                               a->attention_bwd.n_heads, a->attention_bwd.n_kv_heads, hd, a->attention_bwd.scale);
    return NSTF_OK;
}

static nstf_status op_swiglu_bwd(nstf_backend *be, const nstf_op_args *a) {
    const int64_t f = a->swiglu_bwd.n_ff;
    if (!dense(a->swiglu_bwd.gate, f) || !dense(a->swiglu_bwd.up, f) || !dense(a->swiglu_bwd.dy, f) ||
        !dense(a->swiglu_bwd.dgate, f) || !dense(a->swiglu_bwd.dup, f))
        return layout_error(a);
    nstf_cpu_swiglu_bwd(&cpu_of(be)->cpu, a->swiglu_bwd.gate.data, a->swiglu_bwd.up.data, a->swiglu_bwd.dy.data,
                        a->swiglu_bwd.dgate.data, a->swiglu_bwd.dup.data, a->swiglu_bwd.n * f);
    return NSTF_OK;
}

/* A matrix that is not fp32 (a frozen, possibly quantized base) is
 * dequantized into the scratch first, row by row. */
static nstf_status op_matmul_bwd_x(nstf_backend *be, const nstf_op_args *a) {
    cpu_backend *c = cpu_of(be);
    const nstf_matrix *w = a->matmul_bwd_x.w;
    if (!dense(a->matmul_bwd_x.dy, w->n_out) || !dense(a->matmul_bwd_x.dx, w->n_in)) return layout_error(a);
    const float *wf = w->data;
    if (w->type != NSTF_TYPE_F32) {
        uint64_t rb = 0;
        float *d = nstf_type_row_bytes(w->type, w->n_in, &rb) ? tscratch(c, w->n_in * w->n_out) : NULL;
        if (!d) return nstf_set_error(NSTF_ERR_OOM, "CPU backend: no room to dequantize a %lld x %lld matrix",
                                      (long long)w->n_out, (long long)w->n_in);
        for (int64_t o = 0; o < w->n_out; o++)
            nstf_dequantize_row(w->type, (const unsigned char *)w->data + (uint64_t)o * rb, d + o * w->n_in, w->n_in);
        wf = d;
    }
    nstf_cpu_matmul_bwd_x(&c->cpu, wf, a->matmul_bwd_x.dy.data, a->matmul_bwd_x.dx.data, a->matmul_bwd_x.n, w->n_in,
                          w->n_out, a->matmul_bwd_x.acc);
    return NSTF_OK;
}

static nstf_status op_matmul_bwd_w(nstf_backend *be, const nstf_op_args *a) {
    if (!dense(a->matmul_bwd_w.x, a->matmul_bwd_w.n_in) || !dense(a->matmul_bwd_w.dy, a->matmul_bwd_w.n_out))
        return layout_error(a);
    nstf_cpu_matmul_bwd_w(&cpu_of(be)->cpu, a->matmul_bwd_w.x.data, a->matmul_bwd_w.dy.data, a->matmul_bwd_w.dw,
                          a->matmul_bwd_w.n, a->matmul_bwd_w.n_in, a->matmul_bwd_w.n_out);
    return NSTF_OK;
}

static nstf_status op_cross_entropy(nstf_backend *be, const nstf_op_args *a) {
    cpu_backend *c = cpu_of(be);
    const nstf_matrix *w = a->cross_entropy.w;
    if (w->type != NSTF_TYPE_F32)
        return nstf_set_error(NSTF_ERR_INTERNAL, "CPU backend: cross-entropy over a %s output matrix (wants F32)",
                              nstf_type_name(w->type));
    if (!dense(a->cross_entropy.h, w->n_in)) return layout_error(a);
    int64_t n_valid = 0;
    NSTF_TRY(nstf_ce_count(a->cross_entropy.targets, a->cross_entropy.n, w->n_out, a->cross_entropy.ignore_index,
                           &n_valid));
    float *work = tscratch(c, nstf_cpu_cross_entropy_work(a->cross_entropy.n, w->n_in, w->n_out));
    if (!work) return NSTF_ERR_OOM;
    *a->cross_entropy.loss = nstf_cpu_cross_entropy(&c->cpu, a->cross_entropy.h.data, w->data, a->cross_entropy.targets,
                                                    a->cross_entropy.ignore_index, a->cross_entropy.n_norm,
                                                    a->cross_entropy.lse, a->cross_entropy.dh, a->cross_entropy.dw,
                                                    a->cross_entropy.n, w->n_in, w->n_out, work);
    return NSTF_OK;
}

static nstf_status op_adamw(nstf_backend *be, const nstf_op_args *a) {
    if (a->adamw.w_copy.data && a->adamw.w_copy.data != a->adamw.w)
        return nstf_set_error(NSTF_ERR_INTERNAL, "CPU backend: AdamW keeps no compute copy (the fp32 weights are it)");
    nstf_cpu_adamw(&cpu_of(be)->cpu, a->adamw.p, a->adamw.step, a->adamw.grad_scale, a->adamw.tensors,
                   a->adamw.n_tensors, a->adamw.w, a->adamw.grad, a->adamw.m, a->adamw.v);
    return NSTF_OK;
}

static nstf_status op_grad_norm(nstf_backend *be, const nstf_op_args *a) {
    return nstf_cpu_grad_norm(&cpu_of(be)->cpu, a->grad_norm.tensors, a->grad_norm.n_tensors, a->grad_norm.grad,
                              a->grad_norm.sq, a->grad_norm.norm);
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
COUNTED(bias)
COUNTED(head_norm)
COUNTED(get_rows_bwd)
COUNTED(rmsnorm_bwd)
COUNTED(rope_bwd)
COUNTED(attention_bwd)
COUNTED(swiglu_bwd)
COUNTED(matmul_bwd_x)
COUNTED(matmul_bwd_w)
COUNTED(cross_entropy)
COUNTED(adamw)
COUNTED(grad_norm)
COUNTED(matmul_lr)
COUNTED(attn_sparse)

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
    const int bits = p->precise ? 32 : p->act_bits ? p->act_bits : 16;
    if (bits != 8 && bits != 16 && bits != 32)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "CPU activation precision of %d bits (use 8, 16 or 32)", p->act_bits);
    cpu_backend *c = nstf_calloc(1, sizeof *c, "CPU backend");
    if (!c) return NSTF_ERR_OOM;
    c->base.vt = &k_cpu_vt;
    c->base.act_type = NSTF_TYPE_F32;
    c->base.kv_type = NSTF_TYPE_F32;
    c->base.host_memory = true;
    c->base.int8_act = bits < 32;
    snprintf(c->base.device, sizeof c->base.device, "cpu");
    nstf_status st = nstf_pool_create(p->n_threads ? p->n_threads : nstf_cpu_physical_count(), &c->pool);
    if (st != NSTF_OK) {
        nstf_free(c);
        return st;
    }
    c->cpu.pool = c->pool;
    c->cpu.precise = bits == 32;
    c->cpu.a16 = bits == 16;
    c->cpu.deterministic = p->deterministic;
    *out = &c->base;
    return NSTF_OK;
}

nstf_pool *nstf_backend_cpu_pool(nstf_backend *be) {
    return be && be->vt == &k_cpu_vt ? cpu_of(be)->pool : NULL;
}
