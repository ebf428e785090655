/* llama_gpu.c — the Llama forward on a GPU: owns the device copy of the
 * weights (one allocation carved by a size table; matrices in their file
 * type, norms fp32), the activation arena and bf16 KV cache (a second
 * allocation planned once), the stream, and the captured decode graph.
 *
 * Decode (one token): embed, then per layer RMSNorm (+ the previous
 * block's residual, fused), one GEMV over the adjacent Q/K/V matrices,
 * RoPE, split-KV flash decoding (which also writes the KV cache), GEMV out-
 * proj, RMSNorm + residual, one GEMV over the adjacent gate/up matrices,
 * SwiGLU, GEMV down; final norm, logits (fp32), argmax. The token and the
 * position are read from device memory, so the step is captured once into a
 * graph and replayed (re-captured only when the context passes a power-of-
 * two bound of the attention split plan). Level 3 (the default) runs that
 * step on fused kernels where the weights allow (nstf_gpu_gemv_fused: the
 * norms, RoPE, SwiGLU and residual adds inside the GEMVs; 6 kernels per
 * layer instead of 10) with programmatic dependent launch on sm_90.
 *
 * Prefill (several tokens): the same sequence with GEMMs on the matrix
 * units and causal flash attention. Quantized (or F16/F32) matrices are
 * dequantized to bf16 into one workspace, one matrix at a time, and fed to
 * the same GEMM: for a chunk of T tokens that reads the quantized matrix
 * once and writes/reads 2 bytes per weight, where batched GEMV would read
 * it T/8 times and run on the CUDA cores instead of the tensor cores. At
 * most 8 tokens use the GEMV (as weights are stored).
 *
 * Compiled only with a GPU backend. */
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include "backend/gpu_old.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "ops/gpu/gpu_api.h"

#define ALIGN 256u
#define GEMV_MAX_TOK 8

typedef struct dmat {
    const void *data; /* device */
    nstf_type type;
    int64_t n_in, n_out;
} dmat;

typedef struct dlayer {
    const float *attn_norm, *ffn_norm;
    dmat wq, wk, wv, wo, w_gate, w_up, w_down;
    bool qkv_fused; /* wq, wk, wv adjacent and of one type: one GEMV for decode */
    bool gu_fused;  /* w_gate, w_up adjacent and of one type */
} dlayer;

struct nstf_llama_gpu {
    nstf_llama_config cfg;
    int dev, n_ctx, n_batch;
    void *stream;
    void *wblock, *ablock; /* weights; activations + KV cache */
    uint64_t wbytes, abytes;
    dmat tok_embd, output;
    const float *out_norm;
    dlayer *layers;
    /* activations */
    float *x, *y;          /* [B, dim] fp32 residual stream / block output */
    uint16_t *xb;          /* [B, dim] normed */
    uint16_t *qkv;         /* [B, qd + 2 kvd]: prefill q | k | v, decode one fused row */
    uint16_t *att;         /* [B, qd] */
    uint16_t *h;           /* [2, B, ffn]: gate | up */
    float *logits;         /* [B, n_vocab] */
    int32_t *ids, *pos;    /* [B] */
    int32_t *dio;          /* decode: {token, position} */
    int32_t *tok_out;      /* argmax of the last row */
    int32_t *rowids;       /* 0..n_rows-1 for dequantization through get_rows */
    uint16_t *wtmp;        /* bf16 workspace for one dequantized matrix (NULL: all bf16) */
    uint64_t wtmp_elems;
    int64_t n_rowids;
    void *am_scratch, *fd_scratch;
    size_t am_bytes, fd_bytes;
    uint16_t *kc, *vc;     /* [L, n_ctx, kvd] */
    uint16_t *h3;          /* [B, ffn]: SwiGLU out of the fused gate|up GEMM (L2+ prefill) */
    float *rope_freqs;     /* [head_dim]: RoPE frequencies for the fused QKV GEMV */
    bool fused;            /* every matrix takes the fused decode GEMVs (L3 decode) */
    /* graph */
    void *graph;
    int64_t graph_bound;
    bool graphs_on, graph_used, decoded_once;
    /* execution level (0..3) and the L0/L1 score matrix (allocated on first use) */
    int level;
    float *scores;
    uint64_t scores_bytes;
    /* kernel count of the last forward, graph nodes of the captured step */
    int64_t n_kernels, graph_nodes;
    bool capturing;
    /* profiling: an event pair around every op of a forward */
    bool prof_on;
    void **evs;
    int ev_cap, n_recs;
    int64_t dropped;
    nstf_gpu_op *recs;
};

/* ---- devices ---------------------------------------------------------------- */

nstf_status nstf_gpu_device_line(int dev, char *buf, size_t cap) {
    nstf_gpu_info in;
    NSTF_TRY(nstf_gpu_query(dev, &in));
    snprintf(buf, cap, "GPU %d: %s, %s, %d %s, %.1f GiB (%.1f free), wave %d, L2 %.0f MiB", dev, in.name,
             in.arch, in.n_sm,
#if defined(NSTF_HAVE_HIP)
             "CUs",
#else
             "SMs",
#endif
             (double)in.total_mem / (1u << 30), (double)in.free_mem / (1u << 30), in.wave_size,
             (double)in.l2_bytes / (1u << 20));
    return NSTF_OK;
}

/* ---- plan and upload ----------------------------------------------------------- */

static bool round_up(uint64_t v, uint64_t *out) {
    return nstf_add_ok(v, ALIGN - 1, out) && ((*out &= ~(uint64_t)(ALIGN - 1)), true);
}

static bool mat_bytes(const nstf_matrix *m, uint64_t *out) {
    uint64_t rb;
    return nstf_type_row_bytes(m->type, m->n_in, &rb) && nstf_mul_ok(rb, (uint64_t)m->n_out, out);
}

/* A carve: entries placed one after another, each ALIGN-aligned. */
typedef struct carve {
    uint64_t off;
    bool ok;
} carve;

static uint64_t carve_take(carve *c, uint64_t bytes) {
    uint64_t at = c->off, r;
    if (!c->ok || !round_up(bytes, &r) || !nstf_add_ok(c->off, r, &c->off)) c->ok = false;
    return at;
}

static bool same_type3(const nstf_matrix *a, const nstf_matrix *b, const nstf_matrix *c) {
    return a->type == b->type && (!c || a->type == c->type);
}

/* The weights' size table; with base != NULL also upload and fill g's views. */
static nstf_status weights_plan(nstf_llama_gpu *g, const nstf_llama *m, char *base, uint64_t *total) {
    const nstf_llama_config *c = &m->cfg;
    carve cv = {0, true};
    uint64_t b1, b2, b3;
    const uint64_t norm_bytes = (uint64_t)c->dim * sizeof(float);
#define UPLOAD(off, src, bytes) \
    do { if (base) NSTF_TRY(nstf_gpu_memcpy_h2d(base + (off), (src), (size_t)(bytes), g->stream)); } while (0)
#define VIEW(dst, src, off) \
    do { (dst).data = base + (off); (dst).type = (src).type; (dst).n_in = (src).n_in; (dst).n_out = (src).n_out; } while (0)
    if (!mat_bytes(&m->w.tok_embd, &b1)) cv.ok = false;
    uint64_t o = carve_take(&cv, b1);
    if (cv.ok && base) { UPLOAD(o, m->w.tok_embd.data, b1); VIEW(g->tok_embd, m->w.tok_embd, o); }
    for (int l = 0; cv.ok && l < c->n_layers; l++) {
        const nstf_llama_layer *L = &m->w.layers[l];
        dlayer *D = base ? &g->layers[l] : NULL;
        uint64_t on = carve_take(&cv, norm_bytes);
        uint64_t fn = carve_take(&cv, norm_bytes);
        if (cv.ok && base) {
            UPLOAD(on, L->attn_norm, norm_bytes);
            UPLOAD(fn, L->ffn_norm, norm_bytes);
            D->attn_norm = (const float *)(base + on);
            D->ffn_norm = (const float *)(base + fn);
        }
        /* Q, K, V back to back (one region) when they share a type */
        if (!mat_bytes(&L->wq, &b1) || !mat_bytes(&L->wk, &b2) || !mat_bytes(&L->wv, &b3)) { cv.ok = false; break; }
        bool fuse = same_type3(&L->wq, &L->wk, &L->wv) && (b1 % 16) == 0 && (b2 % 16) == 0;
        uint64_t oq, ok_, ov;
        if (fuse) {
            oq = carve_take(&cv, b1 + b2 + b3);
            ok_ = oq + b1;
            ov = ok_ + b2;
        } else {
            oq = carve_take(&cv, b1);
            ok_ = carve_take(&cv, b2);
            ov = carve_take(&cv, b3);
        }
        if (cv.ok && base) {
            UPLOAD(oq, L->wq.data, b1); UPLOAD(ok_, L->wk.data, b2); UPLOAD(ov, L->wv.data, b3);
            VIEW(D->wq, L->wq, oq); VIEW(D->wk, L->wk, ok_); VIEW(D->wv, L->wv, ov);
            D->qkv_fused = fuse;
        }
        if (!mat_bytes(&L->wo, &b1)) { cv.ok = false; break; }
        uint64_t oo = carve_take(&cv, b1);
        if (cv.ok && base) { UPLOAD(oo, L->wo.data, b1); VIEW(D->wo, L->wo, oo); }
        /* gate and up back to back */
        if (!mat_bytes(&L->w_gate, &b1) || !mat_bytes(&L->w_up, &b2)) { cv.ok = false; break; }
        fuse = same_type3(&L->w_gate, &L->w_up, NULL) && (b1 % 16) == 0;
        uint64_t og, ou;
        if (fuse) {
            og = carve_take(&cv, b1 + b2);
            ou = og + b1;
        } else {
            og = carve_take(&cv, b1);
            ou = carve_take(&cv, b2);
        }
        if (cv.ok && base) {
            UPLOAD(og, L->w_gate.data, b1); UPLOAD(ou, L->w_up.data, b2);
            VIEW(D->w_gate, L->w_gate, og); VIEW(D->w_up, L->w_up, ou);
            D->gu_fused = fuse;
        }
        if (!mat_bytes(&L->w_down, &b1)) { cv.ok = false; break; }
        uint64_t od = carve_take(&cv, b1);
        if (cv.ok && base) { UPLOAD(od, L->w_down.data, b1); VIEW(D->w_down, L->w_down, od); }
    }
    uint64_t onorm = carve_take(&cv, norm_bytes);
    if (cv.ok && base) {
        UPLOAD(onorm, m->w.out_norm, norm_bytes);
        g->out_norm = (const float *)(base + onorm);
    }
    if (c->tied_output) {
        if (base) g->output = g->tok_embd;
    } else {
        if (!mat_bytes(&m->w.output, &b1)) cv.ok = false;
        uint64_t oo = carve_take(&cv, b1);
        if (cv.ok && base) { UPLOAD(oo, m->w.output.data, b1); VIEW(g->output, m->w.output, oo); }
    }
#undef UPLOAD
#undef VIEW
    if (!cv.ok) return nstf_set_error(NSTF_ERR_RANGE, "GPU weight table overflows or has a bad row size");
    *total = cv.off;
    return NSTF_OK;
}

/* Largest layer matrix that prefill must dequantize (0 when all are bf16). */
static void dequant_need(const nstf_llama *m, uint64_t *elems, int64_t *rows) {
    *elems = 0;
    *rows = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const nstf_llama_layer *L = &m->w.layers[l];
        const nstf_matrix *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            if (ms[i]->type == NSTF_TYPE_BF16) continue;
            uint64_t e = (uint64_t)ms[i]->n_in * (uint64_t)ms[i]->n_out;
            if (e > *elems) *elems = e;
            if (ms[i]->n_out > *rows) *rows = ms[i]->n_out;
        }
        if (L->wq.type != NSTF_TYPE_BF16 && L->wq.type == L->wk.type && L->wq.type == L->wv.type) { /* QKV GEMM */
            const int64_t r = L->wq.n_out + L->wk.n_out + L->wv.n_out;
            uint64_t e = (uint64_t)L->wq.n_in * (uint64_t)r;
            if (e > *elems) *elems = e;
            if (r > *rows) *rows = r;
        }
        if (L->w_gate.type != NSTF_TYPE_BF16 && L->w_gate.type == L->w_up.type) { /* the fused gate|up GEMM (L2+) */
            uint64_t e = (uint64_t)L->w_gate.n_in * (uint64_t)(L->w_gate.n_out + L->w_up.n_out);
            if (e > *elems) *elems = e;
            if (L->w_gate.n_out + L->w_up.n_out > *rows) *rows = L->w_gate.n_out + L->w_up.n_out;
        }
    }
}

/* The activation arena's size table (base == NULL: sizes only). */
static nstf_status arena_plan(nstf_llama_gpu *g, char *base, uint64_t *total) {
    const nstf_llama_config *c = &g->cfg;
    const uint64_t B = (uint64_t)g->n_batch, dim = (uint64_t)c->dim, qd = (uint64_t)c->n_heads * c->head_dim,
                   kvd = (uint64_t)c->n_kv_heads * c->head_dim, ffn = (uint64_t)c->ffn_dim, V = (uint64_t)c->n_vocab;
    uint64_t s[17];
    bool ok = nstf_mul_ok(B * 4, dim, &s[0]);                  /* x */
    s[1] = s[0];                                                /* y */
    ok = ok && nstf_mul_ok(B * 2, dim, &s[2]);                  /* xb */
    ok = ok && nstf_mul_ok(B * 2, qd + 2 * kvd, &s[3]);         /* qkv */
    ok = ok && nstf_mul_ok(B * 2, qd, &s[4]);                   /* att */
    ok = ok && nstf_mul_ok(B * 6, ffn, &s[5]);                  /* h: 3 x B x ffn bf16 */
    ok = ok && nstf_mul_ok(B * 4, V, &s[6]);                    /* logits */
    s[7] = B * 4;                                               /* ids */
    s[8] = B * 4;                                               /* pos */
    s[9] = 16;                                                  /* dio + tok_out */
    s[10] = (uint64_t)g->n_rowids * 4;                          /* rowids */
    ok = ok && nstf_mul_ok(g->wtmp_elems, 2, &s[11]);           /* wtmp */
    s[12] = g->am_bytes;
    s[13] = g->fd_bytes;
    uint64_t kv = 0;
    ok = ok && nstf_mul_ok((uint64_t)c->n_layers * (uint64_t)g->n_ctx, kvd * 2, &kv);
    s[14] = s[15] = kv;
    s[16] = (uint64_t)c->head_dim * 4;                          /* rope_freqs */
    carve cv = {0, ok};
    uint64_t off[17];
    for (int i = 0; i < 17; i++) off[i] = carve_take(&cv, s[i]);
    if (!cv.ok)
        return nstf_set_error(NSTF_ERR_RANGE, "GPU activations for context %d and batch %d overflow", g->n_ctx,
                              g->n_batch);
    *total = cv.off;
    if (!base) return NSTF_OK;
    g->x = (float *)(base + off[0]);
    g->y = (float *)(base + off[1]);
    g->xb = (uint16_t *)(base + off[2]);
    g->qkv = (uint16_t *)(base + off[3]);
    g->att = (uint16_t *)(base + off[4]);
    g->h = (uint16_t *)(base + off[5]);
    g->h3 = g->h + 2 * B * ffn;
    g->logits = (float *)(base + off[6]);
    g->ids = (int32_t *)(base + off[7]);
    g->pos = (int32_t *)(base + off[8]);
    g->dio = (int32_t *)(base + off[9]);
    g->tok_out = g->dio + 2;
    g->rowids = g->n_rowids ? (int32_t *)(base + off[10]) : NULL;
    g->wtmp = g->wtmp_elems ? (uint16_t *)(base + off[11]) : NULL;
    g->am_scratch = base + off[12];
    g->fd_scratch = base + off[13];
    g->kc = (uint16_t *)(base + off[14]);
    g->vc = (uint16_t *)(base + off[15]);
    g->rope_freqs = (float *)(base + off[16]);
    return NSTF_OK;
}

/* Whether the L3 decode can run on the fused GEMVs: Q/K/V and gate/up
 * adjacent, every matrix of a type (and alignment) they take, x of one
 * staging chunk for the norm prologues, head_dim/2 a multiple of 8. */
static bool fused_decode_ok(const nstf_llama_gpu *g) {
    const nstf_llama_config *c = &g->cfg;
    if ((c->head_dim / 2) % 8 != 0 || !nstf_gpu_gemv_fusable(g->output.type, g->output.data, c->dim, 1)) return false;
    for (int l = 0; l < c->n_layers; l++) {
        const dlayer *L = &g->layers[l];
        if (!L->qkv_fused || !L->gu_fused || !nstf_gpu_gemv_fusable(L->wq.type, L->wq.data, c->dim, 1) ||
            !nstf_gpu_gemv_fusable(L->wo.type, L->wo.data, L->wo.n_in, 0) ||
            !nstf_gpu_gemv_fusable(L->w_gate.type, L->w_gate.data, c->dim, 1) ||
            !nstf_gpu_gemv_fusable(L->w_down.type, L->w_down.data, L->w_down.n_in, 0))
            return false;
    }
    return true;
}

void nstf_llama_gpu_free(nstf_llama_gpu *g) {
    if (!g) return;
    if (g->stream) (void)nstf_gpu_stream_sync(g->stream);
    nstf_gpu_graph_destroy(g->graph);
    for (int i = 0; g->evs && i < 2 * g->ev_cap; i++) nstf_gpu_event_destroy(g->evs[i]);
    nstf_free(g->evs);
    nstf_free(g->recs);
    (void)nstf_gpu_free(g->scores);
    (void)nstf_gpu_free(g->wblock);
    (void)nstf_gpu_free(g->ablock);
    if (g->stream) (void)nstf_gpu_stream_destroy(g->stream);
    nstf_free(g->layers);
    nstf_free(g);
}

nstf_status nstf_llama_gpu_create(const nstf_llama *m, int dev, int n_ctx, int n_batch, nstf_llama_gpu **out) {
    *out = NULL;
    const nstf_llama_config *c = &m->cfg;
    if (n_ctx < 1 || n_batch < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "context (%d) and batch (%d) must be positive", n_ctx, n_batch);
    if (c->head_dim != 64 && c->head_dim != 128)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "GPU attention supports head sizes 64 and 128, not %d",
                              c->head_dim);
    if (c->n_heads / c->n_kv_heads > 16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "GPU decode supports up to 16 query heads per kv head, not %d",
                              c->n_heads / c->n_kv_heads);
    if (n_batch > n_ctx) n_batch = n_ctx;
    int n_dev = nstf_gpu_device_count();
    if (dev < 0 || dev >= n_dev)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "no GPU %d (this machine has %d)", dev, n_dev);
    NSTF_TRY(nstf_gpu_set_device(dev));
    nstf_gpu_info info;
    NSTF_TRY(nstf_gpu_query(dev, &info));

    nstf_llama_gpu *g = nstf_calloc(1, sizeof *g, "GPU model");
    if (!g) return NSTF_ERR_OOM;
    g->cfg = *c;
    g->dev = dev;
    g->n_ctx = n_ctx;
    g->n_batch = n_batch;
    g->graphs_on = true;
    g->graph_bound = -1;
    g->level = 3;
    nstf_status st = NSTF_OK;
    g->layers = nstf_calloc((size_t)c->n_layers, sizeof *g->layers, "GPU layer table");
    if (!g->layers) st = NSTF_ERR_OOM;

    /* plan everything, then check the free memory, then allocate */
    int64_t rows = 0;
    dequant_need(m, &g->wtmp_elems, &rows);
    g->n_rowids = rows;
    g->am_bytes = nstf_gpu_argmax_scratch_bytes(1, c->n_vocab);
    /* the split plan is not monotonic in the context: take the largest
     * scratch over every bound decode_bound() can return */
    for (int64_t b = 256;; b *= 2) {
        int64_t bound = (b > n_ctx ? n_ctx : b) - 1;
        size_t fb = nstf_gpu_flash_decode_scratch_bytes(1, bound, c->n_heads, c->n_kv_heads, c->head_dim);
        if (fb == 0) { g->fd_bytes = 0; break; }
        if (fb > g->fd_bytes) g->fd_bytes = fb;
        if (b >= n_ctx) break;
    }
    if (st == NSTF_OK && g->fd_bytes == 0)
        st = nstf_set_error(NSTF_ERR_GPU, "GPU %d: cannot plan the decode attention scratch", dev);
    if (st == NSTF_OK) st = weights_plan(g, m, NULL, &g->wbytes);
    if (st == NSTF_OK) st = arena_plan(g, NULL, &g->abytes);
    if (st == NSTF_OK) {
        const uint64_t reserve = (uint64_t)256 << 20; /* runtime, graphs, kernels' own buffers */
        uint64_t need = g->wbytes + g->abytes + reserve;
        if (need > info.free_mem)
            st = nstf_set_error(NSTF_ERR_OOM,
                                "out of GPU memory: the model needs %.2f GiB on %s (weights %.2f, activations and "
                                "KV cache for context %d %.2f, reserve %.2f) but %.2f GiB of %.2f are free; try a "
                                "smaller -c or a quantized model",
                                (double)need / (1u << 30), info.name, (double)g->wbytes / (1u << 30), n_ctx,
                                (double)g->abytes / (1u << 30), (double)reserve / (1u << 30),
                                (double)info.free_mem / (1u << 30), (double)info.total_mem / (1u << 30));
    }
    if (st == NSTF_OK) st = nstf_gpu_stream_create(&g->stream);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&g->wblock, (size_t)g->wbytes);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&g->ablock, (size_t)g->abytes);
    if (st == NSTF_OK) st = weights_plan(g, m, g->wblock, &g->wbytes);
    if (st == NSTF_OK) st = arena_plan(g, g->ablock, &g->abytes);
    /* an empty cache reads as zeros, never as NaN from stale memory (before
     * anything below fills part of the arena) */
    if (st == NSTF_OK) st = nstf_gpu_memset(g->ablock, 0, (size_t)g->abytes, g->stream);
    if (st == NSTF_OK && g->n_rowids) {
        int32_t *ids = nstf_alloc((size_t)g->n_rowids * sizeof(int32_t), "row ids");
        if (!ids) st = NSTF_ERR_OOM;
        for (int64_t i = 0; ids && i < g->n_rowids; i++) ids[i] = (int32_t)i;
        if (st == NSTF_OK) st = nstf_gpu_memcpy_h2d(g->rowids, ids, (size_t)g->n_rowids * sizeof(int32_t), g->stream);
        nstf_free(ids);
    }
    if (st == NSTF_OK && c->head_dim <= 256) {
        float fr[256];
        nstf_gpu_rope_freqs(c->rope_base, c->head_dim, fr);
        st = nstf_gpu_memcpy_h2d(g->rope_freqs, fr, (size_t)c->head_dim * sizeof(float), g->stream);
    }
    if (st == NSTF_OK) g->fused = fused_decode_ok(g);
    if (st == NSTF_OK) st = nstf_gpu_stream_sync(g->stream);
    if (st != NSTF_OK) {
        nstf_llama_gpu_free(g);
        return st;
    }
    *out = g;
    return NSTF_OK;
}

/* ---- op bracketing: kernel count, profiling events, NVTX ------------------- */

static void op_begin(nstf_llama_gpu *g, const char *label) {
    nstf_gpu_range_push(label);
    if (g->prof_on && !g->capturing && g->n_recs < g->ev_cap)
        (void)nstf_gpu_event_record(g->evs[2 * g->n_recs], g->stream);
}

static void op_end(nstf_llama_gpu *g, int cat, const char *label, int layer, int n_kern, double flops, double bytes) {
    g->n_kernels += n_kern;
    nstf_gpu_range_pop();
    if (!g->prof_on || g->capturing) return;
    if (g->n_recs >= g->ev_cap) {
        g->dropped++;
        return;
    }
    (void)nstf_gpu_event_record(g->evs[2 * g->n_recs + 1], g->stream);
    nstf_gpu_op *r = &g->recs[g->n_recs++];
    r->label = label;
    r->cat = cat;
    r->layer = layer;
    r->n_kernels = n_kern;
    r->flops = flops;
    r->bytes = bytes;
    r->t0_ms = r->t1_ms = 0.0;
}

/* Run `call` (an nstf_status expression) as one op of category cat. */
#define OP(cat, label, layer, nk, fl, by, call)                         \
    do {                                                                \
        op_begin(g, label);                                             \
        nstf_status op_st_ = (call);                                    \
        op_end(g, cat, label, layer, nk, fl, by);                       \
        if (op_st_ != NSTF_OK) return op_st_;                           \
    } while (0)

static double wbytes_of(const dmat *w) {
    uint64_t rb = 0;
    (void)nstf_type_row_bytes(w->type, w->n_in, &rb);
    return (double)rb * (double)w->n_out;
}

/* ---- forward ------------------------------------------------------------------ */

/* Kernels mm() launches for n tokens. */
static int mm_kernels(const nstf_llama_gpu *g, const dmat *w, int64_t n) {
    if (n <= GEMV_MAX_TOK || w->type == NSTF_TYPE_BF16) return 1;
    return (!g->wtmp || (uint64_t)w->n_in * (uint64_t)w->n_out > g->wtmp_elems || w->n_out > g->n_rowids) ? 1 : 2;
}

/* y[n, n_out] = x[n, n_in] W^T: GEMV for a few tokens, else the GEMM (after
 * dequantizing W to bf16 in the workspace unless it is bf16). */
static nstf_status mm(nstf_llama_gpu *g, const dmat *w, const uint16_t *x, void *y, nstf_type yt, int64_t n) {
    if (n <= GEMV_MAX_TOK)
        return nstf_gpu_gemv(w->type, w->data, x, y, yt, n, w->n_in, w->n_out, g->stream);
    const uint16_t *wb = w->data;
    if (w->type != NSTF_TYPE_BF16) {
        if (!g->wtmp || (uint64_t)w->n_in * (uint64_t)w->n_out > g->wtmp_elems || w->n_out > g->n_rowids)
            return nstf_gpu_gemv(w->type, w->data, x, y, yt, n, w->n_in, w->n_out, g->stream);
        NSTF_TRY(nstf_gpu_get_rows(w->type, w->data, w->n_out, g->rowids, g->wtmp, NSTF_TYPE_BF16, w->n_out, w->n_in,
                                   g->stream));
        wb = g->wtmp;
    }
    return nstf_gpu_gemm_bf16(x, wb, y, yt, NULL, NSTF_TYPE_F32, n, w->n_out, w->n_in, NSTF_GEMM_EPI_NONE, g->stream);
}

/* A matmul op: FLOPs 2 n n_in n_out, bytes weights + activations. */
#define MM(cat, label, l, w, x, y, yt, n)                                                                       \
    OP(cat, label, l, mm_kernels(g, (w), (n)), 2.0 * (double)(n) * (double)(w)->n_in * (double)(w)->n_out,   \
       wbytes_of(w) + 2.0 * (double)(n) * (double)((w)->n_in + (w)->n_out), mm(g, (w), (x), (y), (yt), (n)))

/* The split-plan bound of the decode attention for position pos: the next
 * power of two of the context (at least 256), capped by the cache. */
static int64_t decode_bound(const nstf_llama_gpu *g, int64_t pos) {
    int64_t b = 256;
    while (b < pos + 1) b *= 2;
    return (b > g->n_ctx ? g->n_ctx : b) - 1;
}

static double attn_flops(const nstf_llama_config *c, int64_t n, int64_t n_kv) {
    return 4.0 * (double)n * (double)n_kv * (double)c->n_heads * (double)c->head_dim;
}
static double attn_bytes(const nstf_llama_config *c, int64_t n, int64_t n_kv) {
    const double kvd = (double)c->n_kv_heads * c->head_dim, qd = (double)c->n_heads * c->head_dim;
    return 2.0 * (2.0 * (double)n_kv * kvd + 2.0 * (double)n * qd);
}

/* The decode step; reads the token from dio[0] and the position from dio[1].
 * Unfused (L2, and L3 where the weights do not allow more): per layer
 * RMSNorm (+ the previous residual), one QKV GEMV, RoPE, flash decode and
 * its merge, out GEMV, RMSNorm + residual, one gate/up GEMV, SwiGLU, down
 * GEMV. Fused (L3): six kernels per layer: QKV with the norm before and
 * RoPE after it; flash decode and its merge; out-proj adding into the
 * residual; gate/up with the norm and SwiGLU; down adding
 * into the residual; then the final norm inside the logits GEMV. Both give
 * the same bits (nstf_gpu_gemv_fused; test_levels_gpu checks it). */
static nstf_status enqueue_decode(nstf_llama_gpu *g, int64_t bound, int64_t pos_hint, bool fused) {
    const nstf_llama_config *c = &g->cfg;
    const int64_t dim = c->dim, hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd,
                  ffn = c->ffn_dim, row = qd + 2 * kvd;
    const float scale = 1.0f / sqrtf((float)hd);
    void *s = g->stream;
    uint16_t *q = g->qkv, *k = q + qd, *v = k + kvd;
    const double nb = (double)dim * 4;
    OP(NSTF_GPU_CAT_OTHER, "embed", -1, 1, 0, nb,
       nstf_gpu_get_rows(g->tok_embd.type, g->tok_embd.data, c->n_vocab, g->dio, g->x, NSTF_TYPE_F32, 1, dim, s));
    nstf_gemv_fusion qkv = {0}, acc = {0}, gu = {0}, out = {0};
    qkv.norm_x = gu.norm_x = out.norm_x = g->x;
    qkv.norm_eps = gu.norm_eps = out.norm_eps = c->norm_eps;
    qkv.epi = NSTF_GEMV_ROPE;
    qkv.rope_rows = (int)(qd + kvd);
    qkv.head_dim = (int)hd;
    qkv.rope_mode = c->rope_mode;
    qkv.pos = g->dio + 1;
    qkv.rope_freqs = g->rope_freqs;
    acc.epi = NSTF_GEMV_ACCUM;
    gu.epi = NSTF_GEMV_SWIGLU;
    out.epi = NSTF_GEMV_STORE;
    out.norm_w = g->out_norm;
    for (int l = 0; l < c->n_layers; l++) {
        const dlayer *L = &g->layers[l];
        uint16_t *kc = g->kc + (int64_t)l * g->n_ctx * kvd, *vc = g->vc + (int64_t)l * g->n_ctx * kvd;
        dmat w = L->wq;
        w.n_out = row;
        if (fused) {
            qkv.norm_w = L->attn_norm;
            gu.norm_w = L->ffn_norm;
            OP(NSTF_GPU_CAT_ATTN, "norm_qkv_rope", l, 1, 2.0 * dim * row, wbytes_of(&w) + 2 * nb,
               nstf_gpu_gemv_fused(w.type, w.data, NULL, q, dim, row, &qkv, s));
        } else {
            OP(NSTF_GPU_CAT_NORM, l ? "add_rmsnorm" : "rmsnorm", l, 1, 4.0 * dim, 3 * nb,
               nstf_gpu_rmsnorm(g->x, l ? g->y : NULL, NSTF_TYPE_F32, L->attn_norm, g->xb, 1, dim, c->norm_eps, s));
            if (L->qkv_fused) {
                MM(NSTF_GPU_CAT_ATTN, "qkv_proj", l, &w, g->xb, q, NSTF_TYPE_BF16, 1);
            } else {
                MM(NSTF_GPU_CAT_ATTN, "q_proj", l, &L->wq, g->xb, q, NSTF_TYPE_BF16, 1);
                MM(NSTF_GPU_CAT_ATTN, "k_proj", l, &L->wk, g->xb, k, NSTF_TYPE_BF16, 1);
                MM(NSTF_GPU_CAT_ATTN, "v_proj", l, &L->wv, g->xb, v, NSTF_TYPE_BF16, 1);
            }
            OP(NSTF_GPU_CAT_ATTN, "rope", l, 1, 6.0 * (qd + kvd), 4.0 * (qd + kvd),
               nstf_gpu_rope(q, k, g->dio + 1, 1, c->n_heads, c->n_kv_heads, (int)hd, c->rope_base, c->rope_mode, s));
        }
        OP(NSTF_GPU_CAT_ATTN, "flash_decode", l, 2, attn_flops(c, 1, pos_hint + 1),
           attn_bytes(c, 1, pos_hint + 1),
           nstf_gpu_flash_decode_dpos(q, row, k, row, v, row, kc, vc, g->att, qd, 1, g->dio + 1, bound, g->n_ctx,
                                      c->n_heads, c->n_kv_heads, (int)hd, scale, g->fd_scratch, g->fd_bytes, s));
        w = L->w_gate;
        w.n_out = 2 * ffn;
        if (fused) {
            OP(NSTF_GPU_CAT_ATTN, "o_proj_residual", l, 1, 2.0 * qd * dim, wbytes_of(&L->wo) + 2 * nb,
               nstf_gpu_gemv_fused(L->wo.type, L->wo.data, g->att, g->x, qd, dim, &acc, s));
            OP(NSTF_GPU_CAT_FFN, "norm_gate_up_swiglu", l, 1, 4.0 * dim * ffn, wbytes_of(&w) + 2 * nb,
               nstf_gpu_gemv_fused(w.type, w.data, NULL, g->h, dim, 2 * ffn, &gu, s));
            OP(NSTF_GPU_CAT_FFN, "down_proj_residual", l, 1, 2.0 * ffn * dim, wbytes_of(&L->w_down) + 2 * nb,
               nstf_gpu_gemv_fused(L->w_down.type, L->w_down.data, g->h, g->x, ffn, dim, &acc, s));
            continue;
        }
        MM(NSTF_GPU_CAT_ATTN, "o_proj", l, &L->wo, g->att, g->y, NSTF_TYPE_F32, 1);
        OP(NSTF_GPU_CAT_NORM, "add_rmsnorm", l, 1, 4.0 * dim, 3 * nb,
           nstf_gpu_rmsnorm(g->x, g->y, NSTF_TYPE_F32, L->ffn_norm, g->xb, 1, dim, c->norm_eps, s));
        if (L->gu_fused) {
            MM(NSTF_GPU_CAT_FFN, "gate_up_proj", l, &w, g->xb, g->h, NSTF_TYPE_BF16, 1);
        } else {
            MM(NSTF_GPU_CAT_FFN, "gate_proj", l, &L->w_gate, g->xb, g->h, NSTF_TYPE_BF16, 1);
            MM(NSTF_GPU_CAT_FFN, "up_proj", l, &L->w_up, g->xb, g->h + ffn, NSTF_TYPE_BF16, 1);
        }
        OP(NSTF_GPU_CAT_FFN, "swiglu", l, 1, 4.0 * ffn, 6.0 * ffn, nstf_gpu_swiglu(g->h, g->h + ffn, g->h, ffn, s));
        MM(NSTF_GPU_CAT_FFN, "down_proj", l, &L->w_down, g->h, g->y, NSTF_TYPE_F32, 1);
    }
    if (fused) {
        OP(NSTF_GPU_CAT_OTHER, "norm_logits", -1, 1, 2.0 * dim * c->n_vocab, wbytes_of(&g->output) + 4.0 * c->n_vocab,
           nstf_gpu_gemv_fused(g->output.type, g->output.data, NULL, g->logits, dim, c->n_vocab, &out, s));
    } else {
        OP(NSTF_GPU_CAT_NORM, "add_rmsnorm", -1, 1, 4.0 * dim, 3 * nb,
           nstf_gpu_rmsnorm(g->x, g->y, NSTF_TYPE_F32, g->out_norm, g->xb, 1, dim, c->norm_eps, s));
        MM(NSTF_GPU_CAT_OTHER, "logits", -1, &g->output, g->xb, g->logits, NSTF_TYPE_F32, 1);
    }
    OP(NSTF_GPU_CAT_OTHER, "argmax", -1, 2, (double)c->n_vocab, 4.0 * c->n_vocab,
       nstf_gpu_argmax(g->logits, NSTF_TYPE_F32, g->tok_out, 1, c->n_vocab, g->am_scratch, s));
    return NSTF_OK;
}

/* L3 runs the fused step with programmatic dependent launch (off while
 * profiling, whose events sit between the kernels). */
static nstf_status enqueue_step(nstf_llama_gpu *g, int64_t bound, int64_t pos) {
    if (g->level < 3 || !g->fused) return enqueue_decode(g, bound, pos, false);
    const int prev = nstf_gpu_set_pdl(!g->prof_on);
    nstf_status st = enqueue_decode(g, bound, pos, true);
    (void)nstf_gpu_set_pdl(prev);
    return st;
}

static nstf_status run_decode(nstf_llama_gpu *g, int64_t pos) {
    const int64_t bound = decode_bound(g, pos);
    g->graph_used = false;
    /* The first step runs plainly: kernels set their attributes on first use,
     * which is not something to do inside a capture. Profiling runs plainly
     * too (its events are per-forward). */
    if (g->graphs_on && g->level >= 3 && !g->prof_on && g->decoded_once) {
        if (!g->graph || g->graph_bound != bound) {
            nstf_gpu_graph_destroy(g->graph);
            g->graph = NULL;
            g->graph_bound = -1;
            nstf_status st = nstf_gpu_capture_begin(g->stream);
            if (st == NSTF_OK) {
                g->capturing = true;
                const int64_t k0 = g->n_kernels;
                nstf_status se = enqueue_step(g, bound, pos);
                g->graph_nodes = g->n_kernels - k0;
                g->capturing = false;
                void *exec = NULL;
                st = nstf_gpu_capture_end(g->stream, &exec);
                if (se != NSTF_OK) st = se;
                if (st == NSTF_OK) {
                    g->graph = exec;
                    g->graph_bound = bound;
                } else {
                    nstf_gpu_graph_destroy(exec);
                }
            }
            if (st != NSTF_OK) g->graphs_on = false; /* fall back to plain launches from now on */
        }
        if (g->graph) {
            g->n_kernels = 1; /* one graph launch */
            NSTF_TRY(nstf_gpu_graph_launch(g->graph, g->stream));
            g->graph_used = true;
            return NSTF_OK;
        }
    }
    g->n_kernels = 0;
    NSTF_TRY(enqueue_step(g, bound, pos));
    g->decoded_once = true;
    return NSTF_OK;
}

/* Materialized attention (L0: QK^T, scale + mask, softmax, PV; L1: the
 * middle two fused), after writing this chunk's k, v into the cache. */
static nstf_status naive_attention(nstf_llama_gpu *g, int l, const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                   const uint16_t *v, int64_t kv_stride, const int32_t *pos, int64_t n, int64_t pos0,
                                   uint16_t *kc, uint16_t *vc) {
    const nstf_llama_config *c = &g->cfg;
    const int64_t hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd, n_kv = pos0 + n;
    const float scale = 1.0f / sqrtf((float)hd);
    const double sb = 4.0 * (double)c->n_heads * (double)n * (double)n_kv;
    void *s = g->stream;
    if (kv_stride != kvd) { /* one fused row per token (decode): k and v rows are not packed */
        for (int64_t t = 0; t < n; t++)
            OP(NSTF_GPU_CAT_ATTN, "kv_write", l, 1, 0, 8.0 * kvd,
               nstf_gpu_kv_write(k + t * kv_stride, v + t * kv_stride, kc, vc, pos + t, 1, kvd, g->n_ctx, s));
    } else {
        OP(NSTF_GPU_CAT_ATTN, "kv_write", l, 1, 0, 8.0 * (double)n * kvd,
           nstf_gpu_kv_write(k, v, kc, vc, pos, n, kvd, g->n_ctx, s));
    }
    OP(NSTF_GPU_CAT_ATTN, "attn_scores", l, 1, attn_flops(c, n, n_kv) / 2, 2.0 * (n_kv * kvd + n * qd) + sb,
       nstf_gpu_attn_scores(q, q_stride, kc, g->scores, n, n_kv, c->n_heads, c->n_kv_heads, (int)hd, s));
    if (g->level == 0) {
        OP(NSTF_GPU_CAT_ATTN, "scale_mask", l, 1, sb / 4, 2 * sb,
           nstf_gpu_scale_mask(g->scores, c->n_heads, n, n_kv, pos0, scale, s));
        OP(NSTF_GPU_CAT_ATTN, "softmax", l, 1, 5 * sb / 4, 3 * sb,
           nstf_gpu_softmax_rows(g->scores, c->n_heads, n, n_kv, pos0, 1.0f, 0, s));
    } else {
        OP(NSTF_GPU_CAT_ATTN, "softmax_fused", l, 1, 6 * sb / 4, 3 * sb,
           nstf_gpu_softmax_rows(g->scores, c->n_heads, n, n_kv, pos0, scale, 1, s));
    }
    OP(NSTF_GPU_CAT_ATTN, "attn_pv", l, 1, attn_flops(c, n, n_kv) / 2, 2.0 * (n_kv * kvd + n * qd) + sb,
       nstf_gpu_attn_pv(g->scores, vc, g->att, qd, n, n_kv, c->n_heads, c->n_kv_heads, (int)hd, s));
    return NSTF_OK;
}

/* Residual + norm: L0 a plain add then a plain RMSNorm; L1+ one fused kernel. */
static nstf_status add_norm(nstf_llama_gpu *g, int l, float *x, const float *y, const float *w, int64_t n) {
    const nstf_llama_config *c = &g->cfg;
    const double nb = 4.0 * (double)n * c->dim;
    if (y && g->level == 0) {
        OP(NSTF_GPU_CAT_RESID, "add", l, 1, (double)n * c->dim, 3 * nb, nstf_gpu_add(x, y, n * c->dim, g->stream));
        y = NULL;
    }
    OP(NSTF_GPU_CAT_NORM, y ? "add_rmsnorm" : "rmsnorm", l, 1, 4.0 * (double)n * c->dim, (y ? 3 : 2) * nb,
       nstf_gpu_rmsnorm(x, y, NSTF_TYPE_F32, w, g->xb, n, c->dim, c->norm_eps, g->stream));
    return NSTF_OK;
}

/* Any number of tokens at every level except the L2/L3 decode step. ids,
 * pos: device token ids and positions; pos0 the first position. */
static nstf_status run_tokens(nstf_llama_gpu *g, int n, int pos0, bool all_logits) {
    const nstf_llama_config *c = &g->cfg;
    const int64_t dim = c->dim, hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd,
                  ffn = c->ffn_dim, B = g->n_batch, row = qd + 2 * kvd;
    const float scale = 1.0f / sqrtf((float)hd);
    void *s = g->stream;
    const bool one = n == 1, naive = g->level < 2;
    const int32_t *ids = one ? g->dio : g->ids, *pos = one ? g->dio + 1 : g->pos;
    /* decode keeps q | k | v in one row (the fused GEMV's layout) */
    uint16_t *q = g->qkv, *k = one ? q + qd : q + B * qd, *v = one ? k + kvd : k + B * kvd;
    const int64_t q_stride = one ? row : qd, kv_stride = one ? row : kvd;
    uint16_t *hg = g->h, *hu = g->h + B * ffn;
    g->n_kernels = 0;
    OP(NSTF_GPU_CAT_OTHER, "embed", -1, 1, 0, 4.0 * n * dim,
       nstf_gpu_get_rows(g->tok_embd.type, g->tok_embd.data, c->n_vocab, ids, g->x, NSTF_TYPE_F32, n, dim, s));
    char lname[32];
    for (int l = 0; l < c->n_layers; l++) {
        const dlayer *L = &g->layers[l];
        uint16_t *kc = g->kc + (int64_t)l * g->n_ctx * kvd, *vc = g->vc + (int64_t)l * g->n_ctx * kvd;
        snprintf(lname, sizeof lname, "layer %d", l);
        nstf_gpu_range_push(lname);
        NSTF_TRY(add_norm(g, l, g->x, l ? g->y : NULL, L->attn_norm, n));
        /* one QKV GEMV (L1+) or GEMM (L2+) over the adjacent matrices: rows
         * of q | k | v per token */
        const bool fq = L->qkv_fused && (one ? g->level >= 1 : !naive);
        uint16_t *lk = fq && !one ? q + qd : k, *lv = fq && !one ? q + qd + kvd : v;
        const int64_t lqs = fq ? row : q_stride, lkvs = fq ? row : kv_stride;
        if (fq) {
            dmat w = L->wq;
            w.n_out = row;
            MM(NSTF_GPU_CAT_ATTN, "qkv_proj", l, &w, g->xb, q, NSTF_TYPE_BF16, n);
        } else {
            MM(NSTF_GPU_CAT_ATTN, "q_proj", l, &L->wq, g->xb, q, NSTF_TYPE_BF16, n);
            MM(NSTF_GPU_CAT_ATTN, "k_proj", l, &L->wk, g->xb, k, NSTF_TYPE_BF16, n);
            MM(NSTF_GPU_CAT_ATTN, "v_proj", l, &L->wv, g->xb, v, NSTF_TYPE_BF16, n);
        }
        OP(NSTF_GPU_CAT_ATTN, "rope", l, 1, 6.0 * n * (qd + kvd), 4.0 * n * (qd + kvd),
           nstf_gpu_rope_strided(q, lqs, lk, lkvs, pos, n, c->n_heads, c->n_kv_heads, (int)hd, c->rope_base,
                                 c->rope_mode, s));
        if (naive) {
            NSTF_TRY(naive_attention(g, l, q, lqs, lk, lv, lkvs, pos, n, pos0, kc, vc));
        } else {
            OP(NSTF_GPU_CAT_ATTN, "flash_attn", l, 1, attn_flops(c, n, pos0 + n) / 2, attn_bytes(c, n, pos0 + n),
               nstf_gpu_flash_attn(q, lqs, lk, lkvs, lv, lkvs, kc, vc, g->att, qd, n, pos0, g->n_ctx, c->n_heads,
                                   c->n_kv_heads, (int)hd, scale, s));
        }
        MM(NSTF_GPU_CAT_ATTN, "o_proj", l, &L->wo, g->att, g->y, NSTF_TYPE_F32, n);
        NSTF_TRY(add_norm(g, l, g->x, g->y, L->ffn_norm, n));
        if (!naive && L->gu_fused) { /* L2+: one GEMM over gate|up, SwiGLU over its rows */
            dmat w = L->w_gate;
            w.n_out = 2 * ffn;
            MM(NSTF_GPU_CAT_FFN, "gate_up_proj", l, &w, g->xb, g->h, NSTF_TYPE_BF16, n);
            OP(NSTF_GPU_CAT_FFN, "swiglu", l, 1, 4.0 * n * ffn, 6.0 * n * ffn,
               nstf_gpu_swiglu_rows(g->h, g->h3, n, ffn, s));
            MM(NSTF_GPU_CAT_FFN, "down_proj", l, &L->w_down, g->h3, g->y, NSTF_TYPE_F32, n);
        } else {
            MM(NSTF_GPU_CAT_FFN, "gate_proj", l, &L->w_gate, g->xb, hg, NSTF_TYPE_BF16, n);
            MM(NSTF_GPU_CAT_FFN, "up_proj", l, &L->w_up, g->xb, hu, NSTF_TYPE_BF16, n);
            OP(NSTF_GPU_CAT_FFN, "swiglu", l, 1, 4.0 * n * ffn, 6.0 * n * ffn,
               nstf_gpu_swiglu(hg, hu, hg, (int64_t)n * ffn, s));
            MM(NSTF_GPU_CAT_FFN, "down_proj", l, &L->w_down, hg, g->y, NSTF_TYPE_F32, n);
        }
        nstf_gpu_range_pop();
    }
    const int64_t first = all_logits ? 0 : n - 1, rows = all_logits ? n : 1;
    NSTF_TRY(add_norm(g, -1, g->x + first * dim, g->y + first * dim, g->out_norm, rows));
    MM(NSTF_GPU_CAT_OTHER, "logits", -1, &g->output, g->xb, g->logits, NSTF_TYPE_F32, rows);
    OP(NSTF_GPU_CAT_OTHER, "argmax", -1, 2, (double)c->n_vocab, 4.0 * c->n_vocab,
       nstf_gpu_argmax(g->logits + (rows - 1) * (int64_t)c->n_vocab, NSTF_TYPE_F32, g->tok_out, 1, c->n_vocab,
                       g->am_scratch, s));
    return NSTF_OK;
}

/* Fill the times of the last forward's op records (waits for the device). */
static nstf_status prof_resolve(nstf_llama_gpu *g) {
    for (int i = 0; i < g->n_recs; i++) {
        float a = 0, b = 0;
        NSTF_TRY(nstf_gpu_event_ms(g->evs[0], g->evs[2 * i], &a));
        NSTF_TRY(nstf_gpu_event_ms(g->evs[0], g->evs[2 * i + 1], &b));
        g->recs[i].t0_ms = a;
        g->recs[i].t1_ms = b;
    }
    return NSTF_OK;
}

nstf_status nstf_llama_gpu_forward(nstf_llama_gpu *g, const int32_t *tokens, int n, int pos0, bool all_logits,
                                   float *logits, int32_t *argmax) {
    const nstf_llama_config *c = &g->cfg;
    if (n < 1 || n > g->n_batch)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward of %d tokens (batch holds 1..%d)", n, g->n_batch);
    if (pos0 < 0 || pos0 + n > g->n_ctx)
        return nstf_set_error(NSTF_ERR_RANGE, "positions %d..%d exceed the context of %d tokens", pos0, pos0 + n - 1,
                              g->n_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", tokens[t],
                                  c->n_vocab - 1);
    NSTF_TRY(nstf_gpu_set_device(g->dev));
    g->n_recs = 0;
    g->dropped = 0;
    if (n == 1) {
        int32_t io[2] = {tokens[0], pos0};
        NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->dio, io, sizeof io, g->stream));
        if (g->level >= 2) NSTF_TRY(run_decode(g, pos0));
        else {
            g->graph_used = false;
            NSTF_TRY(run_tokens(g, 1, pos0, false));
        }
    } else {
        g->graph_used = false;
        int32_t pbuf[256];
        NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->ids, tokens, (size_t)n * sizeof(int32_t), g->stream));
        for (int t0 = 0; t0 < n; t0 += 256) { /* positions, in pieces of a small host buffer */
            int m = n - t0 < 256 ? n - t0 : 256;
            for (int i = 0; i < m; i++) pbuf[i] = pos0 + t0 + i;
            NSTF_TRY(nstf_gpu_memcpy_h2d(g->pos + t0, pbuf, (size_t)m * sizeof(int32_t), g->stream));
        }
        NSTF_TRY(run_tokens(g, n, pos0, all_logits));
    }
    if (g->prof_on) NSTF_TRY(prof_resolve(g));
    const int64_t rows = (all_logits && n > 1) ? n : 1;
    if (logits) {
        NSTF_TRY(nstf_gpu_memcpy_d2h(logits, g->logits, (size_t)rows * (size_t)c->n_vocab * sizeof(float), g->stream));
    }
    if (argmax) NSTF_TRY(nstf_gpu_memcpy_d2h(argmax, g->tok_out, sizeof(int32_t), g->stream));
    if (!logits && !argmax) NSTF_TRY(nstf_gpu_stream_sync(g->stream));
    return NSTF_OK;
}

/* ---- levels, profiling, memory ------------------------------------------------ */

nstf_status nstf_llama_gpu_set_level(nstf_llama_gpu *g, int level) {
    if (level < 0 || level >= NSTF_GPU_N_LEVELS)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "execution level %d: the GPU backend has levels 0..%d", level,
                              NSTF_GPU_N_LEVELS - 1);
    if (level < 2 && !g->scores) {
        const nstf_llama_config *c = &g->cfg;
        uint64_t b;
        if (!nstf_mul_ok((uint64_t)c->n_heads * (uint64_t)g->n_batch, (uint64_t)g->n_ctx * 4, &b))
            return nstf_set_error(NSTF_ERR_RANGE, "score matrix for level %d overflows", level);
        nstf_gpu_info info;
        NSTF_TRY(nstf_gpu_query(g->dev, &info));
        if (b + ((uint64_t)128 << 20) > info.free_mem)
            return nstf_set_error(NSTF_ERR_OOM,
                                  "level %d materializes the attention scores: %.2f GiB for %d heads x batch %d x "
                                  "context %d, but %.2f GiB are free; use a smaller -c or -b",
                                  level, (double)b / (1u << 30), c->n_heads, g->n_batch, g->n_ctx,
                                  (double)info.free_mem / (1u << 30));
        NSTF_TRY(nstf_gpu_set_device(g->dev));
        void *p = NULL;
        NSTF_TRY(nstf_gpu_malloc(&p, (size_t)b));
        g->scores = p;
        g->scores_bytes = b;
    }
    g->level = level;
    return NSTF_OK;
}

int nstf_llama_gpu_level(const nstf_llama_gpu *g) { return g->level; }
int64_t nstf_llama_gpu_kernels(const nstf_llama_gpu *g) { return g->n_kernels; }
int64_t nstf_llama_gpu_graph_nodes(const nstf_llama_gpu *g) { return g->graph_nodes; }

nstf_status nstf_llama_gpu_set_prof(nstf_llama_gpu *g, bool on, int max_ops) {
    if (on && !g->evs) {
        if (max_ops < 1) max_ops = 4096;
        g->evs = nstf_calloc((size_t)max_ops * 2, sizeof *g->evs, "profiling events");
        g->recs = nstf_calloc((size_t)max_ops, sizeof *g->recs, "profiling records");
        if (!g->evs || !g->recs) return NSTF_ERR_OOM;
        g->ev_cap = max_ops;
        for (int i = 0; i < 2 * max_ops; i++) NSTF_TRY(nstf_gpu_event_create(&g->evs[i]));
    }
    g->prof_on = on;
    g->n_recs = 0;
    return NSTF_OK;
}

const nstf_gpu_op *nstf_llama_gpu_prof_ops(const nstf_llama_gpu *g, int *n, int64_t *dropped) {
    *n = g->n_recs;
    if (dropped) *dropped = g->dropped;
    return g->recs;
}

void nstf_llama_gpu_mem(const nstf_llama_gpu *g, nstf_gpu_mem *out) {
    const nstf_llama_config *c = &g->cfg;
    out->weights = g->wbytes;
    out->kv_cache = 2ull * (uint64_t)c->n_layers * (uint64_t)g->n_ctx * (uint64_t)c->n_kv_heads * c->head_dim * 2;
    /* the score matrix counts at the levels that use it (it stays allocated) */
    out->workspace = g->wtmp_elems * 2 + g->am_bytes + g->fd_bytes + (g->level < 2 ? g->scores_bytes : 0);
    uint64_t used = out->kv_cache + g->wtmp_elems * 2 + g->am_bytes + g->fd_bytes;
    out->activations = g->abytes > used ? g->abytes - used : 0;
}

void nstf_llama_gpu_set_graphs(nstf_llama_gpu *g, bool on) {
    g->graphs_on = on;
    if (!on) {
        nstf_gpu_graph_destroy(g->graph);
        g->graph = NULL;
        g->graph_bound = -1;
    }
}

bool nstf_llama_gpu_graph_used(const nstf_llama_gpu *g) { return g->graph_used; }

bool nstf_llama_gpu_set_fused(nstf_llama_gpu *g, bool on) {
    const bool want = on && fused_decode_ok(g);
    if (want != g->fused) {
        nstf_gpu_graph_destroy(g->graph); /* captured with the other kernels */
        g->graph = NULL;
        g->graph_bound = -1;
    }
    g->fused = want;
    return want;
}
uint64_t nstf_llama_gpu_bytes(const nstf_llama_gpu *g) { return g->wbytes + g->abytes; }
void *nstf_llama_gpu_stream(const nstf_llama_gpu *g) { return g->stream; }

#endif /* NSTF_HAVE_CUDA || NSTF_HAVE_HIP */
