/* gpu_l4.c — level 4 of the GPU backend: the decode step recorded once as
 * a program of the persistent kernel (ops/gpu/decode_l4.cu) and run as one
 * launch per token.
 *
 * Recording: at level 4, the first decode step of a run (and the first
 * after the options change) goes through the forward as at level 3, but
 * every op of the table lands here instead of launching a kernel
 * (gpu_l4_record): the embedding, the fused matmuls, the attention and
 * the greedy token become instructions; the attention makes the QKV
 * GEMV before it also write k and v into the cache row, and the argmax
 * rides on the logits GEMV. The step's buffers are the run state's and do
 * not move, and the token and position are read on the device (dio), so
 * the program is valid for every later step. At the end of the forward
 * the program is uploaded and launched; later steps launch it from begin()
 * and the forward enqueues nothing (as a replayed graph).
 *
 * An op the kernel does not take (a quantized weight, Qwen's QKV bias or
 * per-head norm, a sparse or low-rank layer, an unfused matmul) ends the
 * recording: the step is run again at level 3 (the forward's retry), and
 * the run stays at level 3 (gpu_l4_reason says why).
 *
 * A stalled step (a grid barrier not complete within the timeout) fails
 * with an error naming the instruction and how many blocks arrived; the
 * control words are zeroed before the next step. The status word comes
 * back with the step's results (an asynchronous copy into page-locked
 * memory before end() copies the logits or token, so it costs no extra
 * wait). */
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend/gpu.h"
#include "core/mem.h"

#define L4_TIMEOUT_MS 2000

struct gpu_l4 {
    nstf_l4_ins *ins;
    int n, cap;
    bool failed;   /* this recording met an op the kernel does not take */
    bool off;      /* the model's step cannot run at L4: level 3 */
    bool ready;    /* the program is on the device */
    bool argmax;   /* recorded with the greedy token */
    bool dirty;    /* a step failed: zero the control words first */
    char reason[160];
    void *dprog;   /* device copy of ins */
    size_t dprog_bytes;
    void *scratch; /* control words and partials */
    size_t scratch_bytes;
    int32_t *dstatus, *hstatus; /* device status [4], its page-locked host copy */
    int grid, max_heads, max_hd, max_n_in, max_q;
    size_t smem;
    int stall_block, stall_ins, timeout_ms; /* the test hook */
    bool trace_on;
    void *dtrace;               /* [1 + 2 n] 64-bit words (decode_l4.cu), while trace_on */
    size_t dtrace_bytes;
};

__attribute__((format(printf, 2, 3))) static void l4_fail(gpu_l4 *l, const char *fmt, ...) {
    if (l->failed) return;
    l->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->reason, sizeof l->reason, fmt, ap);
    va_end(ap);
}

#define LBL(a) ((a)->label ? (a)->label : "op")

#define FAIL(...)                \
    do {                         \
        l4_fail(l, __VA_ARGS__); \
        return;                  \
    } while (0)

static nstf_l4_ins *l4_push(gpu_l4 *l) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        nstf_l4_ins *p = nstf_calloc((size_t)cap, sizeof *p, "L4 program");
        if (!p) return NULL;
        if (l->n) memcpy(p, l->ins, (size_t)l->n * sizeof *p);
        nstf_free(l->ins);
        l->ins = p;
        l->cap = cap;
    }
    nstf_l4_ins *in = &l->ins[l->n++];
    memset(in, 0, sizeof *in);
    return in;
}

static nstf_l4_ins *l4_last(gpu_l4 *l) { return l->n ? &l->ins[l->n - 1] : NULL; }

void gpu_l4_free(gpu_backend *g) {
    gpu_l4 *l = g->l4;
    if (!l) return;
    nstf_free(l->ins);
    (void)nstf_gpu_free(l->dprog);
    (void)nstf_gpu_free(l->scratch);
    (void)nstf_gpu_free(l->dstatus);
    (void)nstf_gpu_free(l->dtrace);
    nstf_gpu_host_free(l->hstatus);
    nstf_free(l);
    g->l4 = NULL;
}

void gpu_l4_drop(gpu_backend *g) {
    if (!g->l4) return;
    g->l4->ready = false;
    g->l4->off = false;
    g->l4->reason[0] = 0;
}

const char *gpu_l4_reason(const gpu_backend *g) { return g->l4 && g->l4->off ? g->l4->reason : NULL; }

static nstf_status l4_get(gpu_backend *g, gpu_l4 **out) {
    if (!g->l4) {
        gpu_l4 *l = nstf_calloc(1, sizeof *l, "L4 state");
        if (!l) return NSTF_ERR_OOM;
        l->stall_block = -1;
        l->stall_ins = -1;
        l->timeout_ms = L4_TIMEOUT_MS;
        g->l4 = l;
    }
    *out = g->l4;
    return NSTF_OK;
}

nstf_status gpu_l4_set_stall(gpu_backend *g, int block, int ins, int timeout_ms) {
    gpu_l4 *l;
    NSTF_TRY(l4_get(g, &l));
    l->stall_block = block;
    l->stall_ins = ins;
    l->timeout_ms = timeout_ms > 0 ? timeout_ms : L4_TIMEOUT_MS;
    return NSTF_OK;
}

static nstf_status l4_launch(gpu_backend *g) {
    gpu_l4 *l = g->l4;
    if (l->dirty) {
        NSTF_TRY(nstf_gpu_memset(l->scratch, 0, l->scratch_bytes, g->stream));
        NSTF_TRY(nstf_gpu_memset(l->dstatus, 0, 4 * sizeof(int32_t), g->stream));
        l->dirty = false;
    }
    g->n_kernels++;
    g->l4_used = true;
    unsigned long long *trace = NULL;
    if (l->trace_on) {
        const size_t words = 1 + 2 * (size_t)l->n;
        const size_t bytes = words * sizeof *trace;
        NSTF_TRY(gpu_grow(g, &l->dtrace, &l->dtrace_bytes, bytes));
        NSTF_TRY(nstf_gpu_memset(l->dtrace, 0, bytes, g->stream));
        trace = l->dtrace;
    }
    NSTF_TRY(nstf_gpu_l4_launch(l->dprog, l->n, g->dio, l->scratch, l->grid, l->smem, l->max_heads, l->max_hd,
                                l->max_n_in, l->max_q, l->dstatus, l->stall_block, l->stall_ins, l->timeout_ms, trace,
                                g->stream));
    return nstf_gpu_memcpy_d2h_async(l->hstatus, l->dstatus, 4 * sizeof(int32_t), g->stream);
}

nstf_status gpu_l4_begin(gpu_backend *g, const nstf_batch *b, bool *replayed) {
    gpu_l4 *l;
    NSTF_TRY(l4_get(g, &l));
    if (l->off) return NSTF_OK;
    if (l->ready && l->argmax == b->argmax) {
        NSTF_TRY(l4_launch(g));
        *replayed = true;
        return NSTF_OK;
    }
    l->ready = false;
    l->failed = false;
    l->n = 0;
    l->max_heads = 1;
    l->max_hd = 64;
    l->max_n_in = 8;
    l->max_q = 64;
    g->l4_rec = true;
    return NSTF_OK;
}

/* ---- recording ------------------------------------------------------------------- */

static void rec_embed(gpu_backend *g, gpu_l4 *l, const nstf_op_args *a) {
    const nstf_matrix *t = a->get_rows.table;
    const nstf_type tt = t->type;
    if (a->get_rows.n != 1 || a->get_rows.ids != g->dio || a->get_rows.out.type != NSTF_TYPE_F32 ||
        (tt != NSTF_TYPE_BF16 && tt != NSTF_TYPE_F16 && tt != NSTF_TYPE_F32) || t->n_in > INT32_MAX ||
        t->n_out > INT32_MAX)
        FAIL("the embedding table's type (%s)", nstf_type_name(tt));
    nstf_l4_ins *in = l4_push(l);
    if (!in) FAIL("out of memory");
    in->op = NSTF_L4_EMBED;
    in->wtype = (int32_t)tt;
    in->w = t->data;
    in->n_in = (int32_t)t->n_in;
    in->n_out = (int32_t)t->n_out;
    in->y = a->get_rows.out.data;
}

static void rec_matmul(gpu_backend *g, gpu_l4 *l, const nstf_op_args *a) {
    if (a->matmul.n != 1 || (a->matmul.epi == NSTF_MM_STORE && !a->matmul.norm_x))
        FAIL("an unfused matmul (%s)", LBL(a));
    if (a->matmul.q_norm) FAIL("the per-head q/k norm (%s)", LBL(a));
    for (int i = 0; i < a->matmul.n_w; i++)
        if (a->matmul.bias[i]) FAIL("a matmul bias (%s)", LBL(a));
    nstf_matrix w = *a->matmul.w[0];
    if (a->matmul.n_w > 1 && !nstf_matrix_group_span(a->matmul.w, a->matmul.n_w, &w))
        FAIL("a matmul group not adjacent in memory (%s)", LBL(a));
    if (w.factors || !nstf_gpu_l4_gemv_ok(w.type, w.data, w.n_in, w.n_out))
        FAIL("a weight of type %s", nstf_type_name(w.type));
    nstf_l4_ins *in = l4_push(l);
    if (!in) FAIL("out of memory");
    in->op = NSTF_L4_GEMV;
    in->wtype = (int32_t)w.type;
    in->w = w.data;
    in->n_in = (int32_t)w.n_in;
    in->n_out = (int32_t)w.n_out;
    in->nx = a->matmul.norm_x;
    in->nw = a->matmul.norm_w;
    in->eps = a->matmul.eps;
    in->x = a->matmul.norm_x ? NULL : a->matmul.x.data;
    in->y = a->matmul.out[0].data;
    if (w.n_in > l->max_n_in) l->max_n_in = (int)w.n_in;
    switch (a->matmul.epi) {
    case NSTF_MM_STORE:
        in->epi = NSTF_GEMV_STORE;
        in->y_bf16 = a->matmul.out[0].type == NSTF_TYPE_BF16;
        break;
    case NSTF_MM_ACCUM: {
        in->epi = NSTF_GEMV_ACCUM;
        in->y = a->matmul.res;
        const nstf_l4_ins *at = l->n > 1 ? &l->ins[l->n - 2] : NULL;
        if (at && at->op == NSTF_L4_ATTN && a->matmul.x.data == at->out) { /* it merges the attention's splits */
            if (w.n_in != (int64_t)at->n_heads * at->head_dim) FAIL("an out-projection of another width (%s)", LBL(a));
            in->n_heads = at->n_heads;
            in->n_kv_heads = at->n_kv_heads;
            in->head_dim = at->head_dim;
            in->window = at->window;
            if (at->n_heads * NSTF_L4_SPLITS > l->max_n_in) l->max_n_in = at->n_heads * NSTF_L4_SPLITS; /* its weights */
        }
        break;
    }
    case NSTF_MM_ROPE:
        in->epi = NSTF_GEMV_ROPE;
        in->head_dim = a->matmul.rope.head_dim;
        in->q_rows = a->matmul.rope.n_heads * a->matmul.rope.head_dim;
        in->rope_rows = (a->matmul.rope.n_heads + a->matmul.rope.n_kv_heads) * a->matmul.rope.head_dim;
        in->neox = a->matmul.rope.mode == NSTF_ROPE_NEOX;
        in->freqs = g->rope_freqs;
        in->factors = a->matmul.rope.freq_factors;
        if (a->matmul.rope.pos != g->dio + 1 || in->head_dim % 2 || w.n_out % 2)
            FAIL("a RoPE the kernel does not take (%s)", LBL(a));
        break;
    case NSTF_MM_SWIGLU:
        in->epi = NSTF_GEMV_SWIGLU;
        in->y = a->matmul.act.data;
        if (w.n_out % 2) FAIL("an odd gate|up group (%s)", LBL(a));
        break;
    case NSTF_MM_ADD: FAIL("a matmul with a residual input (%s): training's, not a decode step's", LBL(a));
    }
}

static void rec_attention(gpu_backend *g, gpu_l4 *l, const nstf_op_args *a) {
    const int hd = a->attention.head_dim, nh = a->attention.n_heads, nkv = a->attention.n_kv_heads;
    if (a->attention.kv_q8) FAIL("the Q8_0 KV cache (%s): L4 reads a bf16 cache", LBL(a));
    if (a->attention.blocks || a->attention.lse || a->attention.seq || a->attention.n != 1 || !a->attention.k_cache ||
        a->attention.pos != g->dio + 1 || !nstf_gpu_l4_attn_ok(nh, nkv, hd))
        FAIL("an attention the kernel does not take (%s)", LBL(a));
    /* the QKV GEMV before it writes k and v into the cache */
    nstf_l4_ins *qkv = l4_last(l);
    const uint16_t *y = qkv && qkv->op == NSTF_L4_GEMV && qkv->epi == NSTF_GEMV_ROPE ? qkv->y : NULL;
    if (!y || a->attention.q.data != y || a->attention.k.data != y + qkv->q_rows ||
        a->attention.v.data != y + qkv->rope_rows || qkv->head_dim != hd || qkv->q_rows != nh * hd)
        FAIL("an attention not right after its QKV matmul (%s)", LBL(a));
    qkv->kc = a->attention.k_cache;
    qkv->vc = a->attention.v_cache;
    qkv->kv_dim = nkv * hd;
    nstf_l4_ins *in = l4_push(l);
    if (!in) FAIL("out of memory");
    in->op = NSTF_L4_ATTN;
    in->q = a->attention.q.data;
    in->kc = a->attention.k_cache;
    in->vc = a->attention.v_cache;
    in->out = a->attention.out.data;
    in->kv_dim = nkv * hd;
    in->head_dim = hd;
    in->n_heads = nh;
    in->n_kv_heads = nkv;
    in->scale = a->attention.scale;
    in->window = a->attention.window;
    in->layer = a->layer;
    if (nh > l->max_heads) l->max_heads = nh;
    if (hd > l->max_hd) l->max_hd = hd;
    if (nh / nkv * hd > l->max_q) l->max_q = nh / nkv * hd;
}

static void rec_argmax(gpu_l4 *l, const nstf_op_args *a) {
    nstf_l4_ins *lg = l4_last(l);
    if (a->argmax.n_rows != 1 || a->argmax.x.type != NSTF_TYPE_F32 || !lg || lg->op != NSTF_L4_GEMV ||
        lg->epi != NSTF_GEMV_STORE || lg->y_bf16 || lg->y != a->argmax.x.data || lg->n_out != a->argmax.n)
        FAIL("a greedy token not of the logits (%s)", LBL(a));
    lg->argmax = a->argmax.out;
}

nstf_status gpu_l4_record(gpu_backend *g, const nstf_op_args *a) {
    gpu_l4 *l = g->l4;
    if (l->failed) return NSTF_OK;
    switch (a->op) {
    case NSTF_OP_GET_ROWS: rec_embed(g, l, a); break;
    case NSTF_OP_MATMUL: rec_matmul(g, l, a); break;
    case NSTF_OP_ATTENTION: rec_attention(g, l, a); break;
    case NSTF_OP_ARGMAX: rec_argmax(l, a); break;
    default: l4_fail(l, "the %s op", nstf_op_name(a->op)); break;
    }
    return NSTF_OK;
}

/* The end of a recorded step: upload and launch the program, or give the
 * step back to level 3. */
nstf_status gpu_l4_end(gpu_backend *g, const nstf_batch *b, nstf_status st, bool *retry) {
    gpu_l4 *l = g->l4;
    g->l4_rec = false;
    if (st != NSTF_OK) return st;
    if (!l->failed && l->n < 2) l4_fail(l, "an empty step");
    for (int i = 0; i < l->n && !l->failed; i++) /* an attention's output exists only as partials */
        if (l->ins[i].op == NSTF_L4_ATTN && (i + 1 == l->n || l->ins[i + 1].op != NSTF_L4_GEMV || !l->ins[i + 1].n_heads))
            l4_fail(l, "an attention whose output is not the next matmul's input");
    if (!l->failed) {
        int grid = 0;
        size_t smem = 0;
        nstf_status s2 = nstf_gpu_l4_shape(l->max_n_in, l->max_q, &grid, &smem);
        if (s2 != NSTF_OK) l4_fail(l, "%s", nstf_last_error());
        l->grid = grid;
        l->smem = smem;
    }
    if (l->failed) {
        l->off = true;
        *retry = true;
        return NSTF_OK;
    }
    const size_t pb = (size_t)l->n * sizeof(nstf_l4_ins);
    NSTF_TRY(gpu_grow(g, &l->dprog, &l->dprog_bytes, pb));
    NSTF_TRY(gpu_grow(g, &l->scratch, &l->scratch_bytes,
                      nstf_gpu_l4_scratch_bytes(l->grid, l->max_heads, l->max_hd)));
    if (!l->dstatus) NSTF_TRY(nstf_gpu_malloc((void **)&l->dstatus, 4 * sizeof(int32_t)));
    if (!l->hstatus) NSTF_TRY(nstf_gpu_host_alloc((void **)&l->hstatus, 4 * sizeof(int32_t)));
    NSTF_TRY(nstf_gpu_memcpy_h2d(l->dprog, l->ins, pb, g->stream));
    l->dirty = true;
    l->ready = true;
    l->argmax = b->argmax;
    return l4_launch(g);
}

/* After the step's results are on the host: its status. */
nstf_status gpu_l4_check(gpu_backend *g) {
    gpu_l4 *l = g->l4;
    if (!l || !g->l4_used) return NSTF_OK;
    NSTF_TRY(nstf_gpu_stream_sync(g->stream));
    if (l->hstatus[0] == 0) return NSTF_OK;
    const int ins = l->hstatus[1];
    l->dirty = true;
    l->hstatus[0] = 0;
    const char *what = ins >= 0 && ins < l->n ? (l->ins[ins].op == NSTF_L4_ATTN ? "attention" : l->ins[ins].op == NSTF_L4_EMBED ? "embedding" : "GEMV") : "?";
    return nstf_set_error(NSTF_ERR_GPU,
                          "L4 decode step: the grid barrier after instruction %d of %d (%s) was not complete after "
                          "%d ms: %d of %d blocks arrived",
                          ins, l->n, what, l->timeout_ms, l->hstatus[2], l->hstatus[3]);
}

int64_t gpu_l4_instructions(const gpu_backend *g) { return g->l4 && g->l4->ready ? g->l4->n : 0; }

nstf_status gpu_l4_trace(gpu_backend *g, bool on) {
    gpu_l4 *l;
    NSTF_TRY(l4_get(g, &l));
    l->trace_on = on;
    return NSTF_OK;
}

/* The kind of instruction i (nstf_l4_kind_name's order). */
static int l4_kind(const gpu_l4 *l, int i) {
    const nstf_l4_ins *in = &l->ins[i];
    if (in->op == NSTF_L4_EMBED) return 0;
    if (in->op == NSTF_L4_ATTN) return 2;
    switch (in->epi) {
    case NSTF_GEMV_ROPE: return 1;
    case NSTF_GEMV_SWIGLU: return 4;
    case NSTF_GEMV_ACCUM: return i > 0 && l->ins[i - 1].op == NSTF_L4_ATTN ? 3 : 5;
    default: return 6;
    }
}

nstf_status gpu_l4_trace_get(gpu_backend *g, nstf_l4_profile *out) {
    memset(out, 0, sizeof *out);
    gpu_l4 *l = g->l4;
    if (!l || !l->trace_on || !l->dtrace || !l->ready)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "L4 profile: no traced step (turn it on and run a decode step at level 4)");
    const size_t words = 1 + 2 * (size_t)l->n;
    unsigned long long *t = nstf_calloc(words, sizeof *t, "L4 trace");
    if (!t) return NSTF_ERR_OOM;
    nstf_status st = nstf_gpu_memcpy_d2h(t, l->dtrace, words * sizeof *t, g->stream);
    if (st == NSTF_OK) {
        out->n_ins = l->n;
        for (int i = 0; i < l->n; i++) {
            const unsigned long long s = i == 0 ? t[0] : t[2 + 2 * (i - 1)], w = t[1 + 2 * i];
            const int k = l4_kind(l, i);
            out->count[k]++;
            out->work_us[k] += w > s ? (double)(w - s) / 1e3 : 0.0;
            if (i + 1 < l->n) out->wait_us[k] += t[2 + 2 * i] > w ? (double)(t[2 + 2 * i] - w) / 1e3 : 0.0;
        }
        const unsigned long long end = t[1 + 2 * (l->n - 1)];
        out->total_us = end > t[0] ? (double)(end - t[0]) / 1e3 : 0.0;
    }
    nstf_free(t);
    return st;
}

#endif
