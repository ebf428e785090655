/* gpu.c — the GPU backend (CUDA or HIP through ops/gpu/gpu_api.h): the
 * device, its memory, the workspace a model needs beyond its run state
 * (batch ids and positions, the dequantization buffer, attention and
 * argmax scratch, RoPE frequencies, the L0/L1 score matrix), options and
 * time marks (events), and the forward bracket.
 *
 * The decode step (one token, level 2 and up) reads its token and
 * position from device memory (dio), so at level 3 it is captured once
 * into a graph and replayed for every token: begin() launches the graph
 * when one matches (the split plan's power-of-two bound of the position,
 * and whether the greedy token is wanted) and the forward enqueues
 * nothing; otherwise begin() starts a capture and end() instantiates and
 * launches it. The first step runs plainly (kernels set their attributes
 * on first use, which is not something to do inside a capture); a capture
 * that fails turns graphs off and the step is run again plainly.
 *
 * Compiled only with a GPU backend. */
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include <stdio.h>
#include <string.h>

#include "backend/gpu.h"
#include "core/mem.h"

#define ALIGN 256u

bool nstf_backend_gpu_built(void) { return true; }

const char *nstf_backend_gpu_runtime(void) {
#if defined(NSTF_HAVE_HIP)
    return "HIP";
#else
    return "CUDA";
#endif
}

int nstf_backend_gpu_count(void) { return nstf_gpu_device_count(); }

nstf_status nstf_backend_gpu_line(int dev, char *buf, size_t cap) {
    nstf_gpu_info in;
    NSTF_TRY(nstf_gpu_query(dev, &in));
    snprintf(buf, cap, "GPU %d: %s, %s, %d %s, %.1f GiB (%.1f free), wave %d, L2 %.0f MiB", dev, in.name, in.arch,
             in.n_sm,
#if defined(NSTF_HAVE_HIP)
             "CUs",
#else
             "SMs",
#endif
             (double)in.total_mem / (1u << 30), (double)in.free_mem / (1u << 30), in.wave_size,
             (double)in.l2_bytes / (1u << 20));
    return NSTF_OK;
}

/* ---- memory --------------------------------------------------------------------- */

static nstf_status gpu_alloc(nstf_backend *be, uint64_t bytes, void **out) {
    NSTF_TRY(nstf_gpu_set_device(gpu_of(be)->dev));
    if (bytes > SIZE_MAX) return nstf_set_error(NSTF_ERR_OOM, "device allocation of %llu bytes", (unsigned long long)bytes);
    return nstf_gpu_malloc(out, (size_t)(bytes ? bytes : 1));
}

nstf_status gpu_grow(gpu_backend *g, void **p, size_t *have, size_t want) {
    if (want <= *have) return NSTF_OK;
    if (*p) {
        NSTF_TRY(nstf_gpu_stream_sync(g->stream));
        NSTF_TRY(nstf_gpu_free(*p));
    }
    *p = NULL;
    *have = 0;
    NSTF_TRY(nstf_gpu_malloc(p, want));
    *have = want;
    return NSTF_OK;
}

static void gpu_free(nstf_backend *be, void *p) {
    (void)be;
    (void)nstf_gpu_free(p);
}

static nstf_status gpu_upload(nstf_backend *be, void *dst, const void *src, uint64_t bytes) {
    return nstf_gpu_memcpy_h2d(dst, src, (size_t)bytes, gpu_of(be)->stream);
}

static nstf_status gpu_relayout(nstf_backend *be, const nstf_matrix *m) {
    /* the placer's own copy of the matrix (its views are const to the ops) */
    return nstf_gpu_weights_relayout(m->type, (void *)(uintptr_t)m->data, m->n_in, m->n_out, gpu_of(be)->stream);
}

static nstf_status gpu_download(nstf_backend *be, void *dst, const void *src, uint64_t bytes) {
    return nstf_gpu_memcpy_d2h(dst, src, (size_t)bytes, gpu_of(be)->stream);
}

static nstf_status gpu_zero(nstf_backend *be, void *p, uint64_t bytes) {
    return nstf_gpu_memset(p, 0, (size_t)bytes, gpu_of(be)->stream);
}

static nstf_status gpu_sync(nstf_backend *be) { return nstf_gpu_stream_sync(gpu_of(be)->stream); }

static void gpu_mem(const nstf_backend *be, nstf_backend_mem *out) {
    const gpu_backend *g = (const gpu_backend *)be;
    nstf_gpu_info info;
    memset(out, 0, sizeof *out);
    if (nstf_gpu_query(g->dev, &info) == NSTF_OK) {
        out->total = info.total_mem;
        out->free = info.free_mem;
    }
    /* the score matrix counts at the levels that use it (it stays allocated) */
    out->workspace = g->ws_bytes + (g->level < 2 ? g->scores_bytes : 0);
    out->reserve = (uint64_t)256 << 20; /* runtime, graphs, kernels' own buffers */
}

static void gpu_destroy(nstf_backend *be) {
    gpu_backend *g = gpu_of(be);
    if (g->stream) (void)nstf_gpu_stream_sync(g->stream);
    nstf_gpu_graph_destroy(g->graph);
    gpu_l4_free(g);
    for (int i = 0; i < g->n_evs; i++) nstf_gpu_event_destroy(g->evs[i]);
    nstf_free(g->evs);
    (void)nstf_gpu_free(g->scores);
    (void)nstf_gpu_free(g->tscratch);
    (void)nstf_gpu_free(g->ws);
    if (g->stream) (void)nstf_gpu_stream_destroy(g->stream);
    nstf_free(g);
}

/* ---- planning -------------------------------------------------------------------- */

static bool round_up(uint64_t v, uint64_t *out) {
    return nstf_add_ok(v, ALIGN - 1, out) && ((*out &= ~(uint64_t)(ALIGN - 1)), true);
}

/* The workspace's size table; with base also carve the pointers. */
static nstf_status ws_plan(gpu_backend *g, char *base, uint64_t *total) {
    const uint64_t B = (uint64_t)g->n_batch;
    uint64_t s[11], off[11], at = 0;
    bool ok = nstf_mul_ok(g->wtmp_elems, 2, &s[3]) &&
              nstf_mul_ok((uint64_t)g->n_seq * 4, g->kv_block ? (uint64_t)(g->n_ctx / g->kv_block) : 0, &s[9]) &&
              nstf_mul_ok(g->kv_q8 ? (uint64_t)g->n_ctx * 4 : 0, (uint64_t)g->n_kv_heads * g->head_dim, &s[10]);
    s[0] = B * 4;                            /* ids */
    s[1] = B * 4;                            /* pos */
    s[2] = 16;                               /* dio */
    s[4] = g->am_bytes;
    s[5] = g->fd_bytes;
    s[6] = (uint64_t)g->head_dim * 4;        /* rope_freqs */
    s[7] = B * 4;                            /* seq */
    s[8] = B * 4;                            /* rows */
    for (int i = 0; ok && i < 11; i++) {
        uint64_t r;
        off[i] = at;
        ok = round_up(s[i], &r) && nstf_add_ok(at, r, &at);
    }
    if (!ok) return nstf_set_error(NSTF_ERR_RANGE, "GPU workspace for batch %d overflows", g->n_batch);
    *total = at;
    if (!base) return NSTF_OK;
    g->ids = (int32_t *)(base + off[0]);
    g->pos = (int32_t *)(base + off[1]);
    g->dio = (int32_t *)(base + off[2]);
    g->wtmp = g->wtmp_elems ? (uint16_t *)(base + off[3]) : NULL;
    g->am_scratch = base + off[4];
    g->fd_scratch = base + off[5];
    g->rope_freqs = (float *)(base + off[6]);
    g->seq = (int32_t *)(base + off[7]);
    g->rows = (int32_t *)(base + off[8]);
    g->blocks = g->kv_block ? (int32_t *)(base + off[9]) : NULL;
    g->kv_bf = g->kv_q8 ? (uint16_t *)(base + off[10]) : NULL;
    return NSTF_OK;
}

/* The weight types the GEMV, the GEMM's dequantization and the embedding
 * gather take: every type of core/dtype.h. */
static bool weight_type_ok(nstf_type t) {
    switch (t) {
    case NSTF_TYPE_F32: case NSTF_TYPE_F16: case NSTF_TYPE_BF16:
    case NSTF_TYPE_Q8_0: case NSTF_TYPE_Q4_0: case NSTF_TYPE_Q4_1: case NSTF_TYPE_Q5_0: case NSTF_TYPE_Q5_1:
    case NSTF_TYPE_IQ4_NL:
    case NSTF_TYPE_Q2_K: case NSTF_TYPE_Q3_K: case NSTF_TYPE_Q4_K: case NSTF_TYPE_Q5_K: case NSTF_TYPE_Q6_K:
    case NSTF_TYPE_IQ4_XS:
        return true;
    }
    return false;
}

static nstf_status gpu_plan(nstf_backend *be, const nstf_backend_plan *p, uint64_t *ws) {
    gpu_backend *g = gpu_of(be);
    for (int i = -2; i < p->n_mats; i++) {
        const nstf_type t = i == -2 ? p->embed_type : i == -1 ? p->output_type : p->mats[i].type;
        if (!weight_type_ok(t))
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "the GPU backend has no kernels for %s weights; run on the CPU (--device cpu)",
                                  nstf_type_name(t));
    }
    if (p->head_dim != 64 && p->head_dim != 128)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "GPU attention supports head sizes 64 and 128, not %d", p->head_dim);
    if (p->n_heads / p->n_kv_heads > 16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "GPU decode supports up to 16 query heads per kv head, not %d",
                              p->n_heads / p->n_kv_heads);
    if (p->n_seq != 1 && p->kv_block == 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "the GPU backend runs several sequences over a paged KV cache only (asked for %d "
                              "contiguous ones)",
                              p->n_seq);
    g->n_seq = p->n_seq;
    g->kv_q8 = p->kv_q8;
    g->kv_block = p->kv_block;
    g->kv_blocks = p->kv_blocks;
    g->dim = p->dim;
    g->n_heads = p->n_heads;
    g->n_kv_heads = p->n_kv_heads;
    g->head_dim = p->head_dim;
    g->n_vocab = p->n_vocab;
    g->n_ctx = p->n_ctx;
    g->n_batch = p->n_batch;
    g->rope_base = p->rope_base;
    /* the largest layer matmul that prefill must dequantize (none when all
     * are bf16), or a low-rank factor's dequantized and padded copies (a
     * rank not a multiple of 8: matmul_lr.cu); the plan does not list the
     * output matrix: a quantized one runs every-token logits on the GEMV
     * rather than keep a vocabulary-sized bf16 copy */
    g->wtmp_elems = 0;
    for (int i = 0; i < p->n_mats; i++) {
        const nstf_matrix *m = &p->mats[i];
        const uint64_t e = nstf_gpu_matmul_lr_ws_elems(m->type, p->n_batch, m->n_in, m->n_out);
        if (e > g->wtmp_elems) g->wtmp_elems = e;
    }
    g->am_bytes = nstf_gpu_argmax_scratch_bytes(p->n_batch, p->n_vocab); /* every selected row of a batch */
    /* the split plan is not monotonic in the context: take the largest
     * scratch over every bound the decode step can use */
    g->fd_bytes = 0;
    for (int64_t b = 256;; b *= 2) {
        int64_t bound = (b > p->n_ctx ? p->n_ctx : b) - 1;
        size_t fb = nstf_gpu_flash_decode_scratch_bytes(1, bound, p->n_heads, p->n_kv_heads, p->head_dim);
        if (fb == 0) {
            g->fd_bytes = 0;
            break;
        }
        if (fb > g->fd_bytes) g->fd_bytes = fb;
        if (b >= p->n_ctx) break;
    }
    if (g->fd_bytes == 0) return nstf_set_error(NSTF_ERR_GPU, "GPU %d: cannot plan the decode attention scratch", g->dev);
    return ws_plan(g, NULL, ws);
}

static nstf_status gpu_prepare(nstf_backend *be, const nstf_backend_plan *p) {
    gpu_backend *g = gpu_of(be);
    uint64_t bytes = 0;
    NSTF_TRY(gpu_plan(be, p, &bytes));
    NSTF_TRY(nstf_gpu_set_device(g->dev));
    NSTF_TRY(nstf_gpu_malloc(&g->ws, (size_t)bytes));
    g->ws_bytes = bytes;
    NSTF_TRY(ws_plan(g, g->ws, &bytes));
    NSTF_TRY(nstf_gpu_memset(g->ws, 0, (size_t)bytes, g->stream));
    float fr[256];
    nstf_gpu_rope_freqs(p->rope_base, p->head_dim, fr);
    NSTF_TRY(nstf_gpu_memcpy_h2d(g->rope_freqs, fr, (size_t)p->head_dim * sizeof(float), g->stream));
    return nstf_gpu_stream_sync(g->stream);
}

/* ---- the forward bracket ---------------------------------------------------------------- */

/* The split-plan bound of the decode attention for position pos: the next
 * power of two of the context (at least 256), capped by the cache. */
static int64_t decode_bound(const gpu_backend *g, int64_t pos) {
    int64_t b = 256;
    while (b < pos + 1) b *= 2;
    return (b > g->n_ctx ? g->n_ctx : b) - 1;
}

static nstf_status gpu_begin(nstf_backend *be, const nstf_batch *b, nstf_batch_io *io, bool *replayed) {
    gpu_backend *g = gpu_of(be);
    const int n = b->n;
    *replayed = false;
    if (b->blocks && !g->kv_block) /* (the forward checks that a paged run gets a table) */
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "GPU backend: a block table for a contiguous KV cache");
    if (!b->blocks)
        for (int t = 0; t < n; t++)
            if ((b->seq && b->seq[t] != 0) || b->pos[t] != b->pos[0] + t)
                return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                      "the GPU backend runs one sequence at consecutive positions per forward without "
                                      "a paged KV cache");
    NSTF_TRY(nstf_gpu_set_device(g->dev));
    g->pos0 = b->pos[0];
    /* a continuous batch (paged), or one that picks its logits rows, runs
     * plainly: no device-position decode step, no graph, no fused GEMVs;
     * so does a row-invariant one (a prompt), whose matmuls take the GEMM */
    g->decode_step = n == 1 && g->level >= 2 && !b->blocks && !b->rows && !b->row_invariant;
    g->row_invariant = b->row_invariant;
    g->graph_used = false;
    g->l4_used = false;
    g->l4_rec = false;
    g->unfused = 0;
    io->seq = NULL;
    io->rows = NULL;
    io->blocks = NULL;
    if (b->blocks) {
        const size_t tbl = (size_t)g->n_seq * (size_t)(g->n_ctx / g->kv_block) * sizeof(int32_t);
        NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->blocks, b->blocks, tbl, g->stream));
        io->blocks = g->blocks;
        if (b->seq) {
            NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->seq, b->seq, (size_t)n * sizeof(int32_t), g->stream));
            io->seq = g->seq;
        }
    }
    if (b->rows) {
        NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->rows, b->rows, (size_t)b->n_rows * sizeof(int32_t), g->stream));
        io->rows = g->rows;
    }
    if (n == 1 && !b->blocks) {
        int32_t d[2] = {b->tokens[0], b->pos[0]};
        NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->dio, d, sizeof d, g->stream));
        io->ids = g->dio;
        io->pos = g->dio + 1;
    } else {
        NSTF_TRY(nstf_gpu_memcpy_h2d_async(g->ids, b->tokens, (size_t)n * sizeof(int32_t), g->stream));
        NSTF_TRY(nstf_gpu_memcpy_h2d(g->pos, b->pos, (size_t)n * sizeof(int32_t), g->stream));
        io->ids = g->ids;
        io->pos = g->pos;
    }
    if (!g->decode_step) return NSTF_OK;
    g->bound = decode_bound(g, g->pos0);
    /* one persistent kernel, or its recording: a replay as a graph is, so
     * not with graphs off (the ops must then run, as test_backend_ops and
     * tensor parallel need) nor while profiling */
    if (g->level >= 4 && g->fused_on && g->graphs_on && !g->prof_on) {
        NSTF_TRY(gpu_l4_begin(g, b, replayed));
        if (*replayed || g->l4_rec) return NSTF_OK;
    }
    if (g->graphs_on && g->level >= 3 && !g->prof_on && g->decoded_once) {
        if (g->graph && g->graph_bound == g->bound && g->graph_argmax == b->argmax) {
            NSTF_TRY(nstf_gpu_graph_launch(g->graph, g->stream));
            g->n_kernels++; /* one graph launch */
            g->graph_used = true;
            *replayed = true;
            return NSTF_OK;
        }
        nstf_gpu_graph_destroy(g->graph);
        g->graph = NULL;
        g->graph_bound = -1;
        if (nstf_gpu_capture_begin(g->stream) == NSTF_OK) {
            g->capturing = true;
            g->k0 = g->n_kernels;
        } else {
            g->graphs_on = false; /* plain launches from now on */
        }
    }
    /* L3 runs its fused step with programmatic dependent launch (off while
     * profiling, whose events sit between the kernels) */
    g->pdl_set = g->level >= 3 && g->fused_on && g->model_fusable && !g->prof_on;
    if (g->pdl_set) g->pdl_prev = nstf_gpu_set_pdl(1);
    return NSTF_OK;
}

static nstf_status gpu_end(nstf_backend *be, const nstf_batch *b, nstf_status st, const nstf_fwd_out *o, bool *retry) {
    gpu_backend *g = gpu_of(be);
    *retry = false;
    if (g->l4_rec) {
        NSTF_TRY(gpu_l4_end(g, b, st, retry));
        if (*retry) return NSTF_OK; /* the kernel does not take this model's step: again at L3 */
    }
    if (g->pdl_set) {
        (void)nstf_gpu_set_pdl(g->pdl_prev);
        g->pdl_set = false;
    }
    if (g->decode_step && !g->graph_used && g->level >= 3 && g->fused_on)
        g->model_fusable = g->unfused == 0; /* every matmul of the step took a fused GEMV */
    if (g->capturing) {
        g->capturing = false;
        void *exec = NULL;
        nstf_status ce = nstf_gpu_capture_end(g->stream, &exec);
        if (st == NSTF_OK) st = ce;
        if (st != NSTF_OK) { /* run the step again, plainly */
            nstf_gpu_graph_destroy(exec);
            g->graphs_on = false;
            g->n_kernels = g->k0;
            *retry = true;
            return NSTF_OK;
        }
        g->graph = exec;
        g->graph_bound = g->bound;
        g->graph_argmax = b->argmax;
        g->graph_nodes = g->n_kernels - g->k0;
        g->n_kernels = g->k0 + 1;
        NSTF_TRY(nstf_gpu_graph_launch(g->graph, g->stream));
        g->graph_used = true;
    }
    if (st != NSTF_OK) return st;
    if (g->decode_step) g->decoded_once = true;
    if (o->logits_host)
        NSTF_TRY(nstf_gpu_memcpy_d2h(o->logits_host, o->logits, (size_t)o->rows * (size_t)o->n_vocab * sizeof(float),
                                     g->stream));
    if (o->argmax_host && o->argmax)
        NSTF_TRY(nstf_gpu_memcpy_d2h(o->argmax_host, o->argmax, (size_t)o->n_argmax * sizeof(int32_t), g->stream));
    if (!o->logits_host && !o->argmax_host) NSTF_TRY(nstf_gpu_stream_sync(g->stream));
    return gpu_l4_check(g);
}

/* ---- options, marks ------------------------------------------------------------------------- */

static void drop_graph(gpu_backend *g) {
    gpu_l4_drop(g); /* recorded with the other settings */
    nstf_gpu_graph_destroy(g->graph); /* captured with the other settings */
    g->graph = NULL;
    g->graph_bound = -1;
}

static nstf_status set_level(gpu_backend *g, int level) {
    if (level < 0 || level >= GPU_N_LEVELS)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "execution level %d: the GPU backend has levels 0..%d", level,
                              GPU_N_LEVELS - 1);
    if (level < 2 && !g->scores) {
        uint64_t b;
        if (!nstf_mul_ok((uint64_t)g->n_heads * (uint64_t)g->n_batch, (uint64_t)g->n_ctx * 4, &b))
            return nstf_set_error(NSTF_ERR_RANGE, "score matrix for level %d overflows", level);
        nstf_gpu_info info;
        NSTF_TRY(nstf_gpu_query(g->dev, &info));
        if (b + ((uint64_t)128 << 20) > info.free_mem)
            return nstf_set_error(NSTF_ERR_OOM,
                                  "level %d materializes the attention scores: %.2f GiB for %d heads x batch %d x "
                                  "context %d, but %.2f GiB are free; use a smaller -c or -b",
                                  level, (double)b / (1u << 30), g->n_heads, g->n_batch, g->n_ctx,
                                  (double)info.free_mem / (1u << 30));
        NSTF_TRY(nstf_gpu_set_device(g->dev));
        void *p = NULL;
        NSTF_TRY(nstf_gpu_malloc(&p, (size_t)b));
        g->scores = p;
        g->scores_bytes = b;
    }
    if (level != g->level) gpu_l4_drop(g);
    g->level = level;
    return NSTF_OK;
}

static nstf_status gpu_set_opt(nstf_backend *be, nstf_backend_opt opt, int v) {
    gpu_backend *g = gpu_of(be);
    switch (opt) {
    case NSTF_OPT_LEVEL: return set_level(g, v);
    case NSTF_OPT_GRAPHS:
        g->graphs_on = v != 0;
        if (!g->graphs_on) drop_graph(g);
        return NSTF_OK;
    case NSTF_OPT_FUSED:
        if ((v != 0) != g->fused_on) drop_graph(g);
        g->fused_on = v != 0;
        return NSTF_OK;
    case NSTF_OPT_PROFILE: g->prof_on = v != 0; return NSTF_OK;
    case NSTF_OPT_GRAPH_USED:
    case NSTF_OPT_N: break;
    }
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "the GPU backend has no option %d", (int)opt);
}

static int gpu_get_opt(const nstf_backend *be, nstf_backend_opt opt) {
    const gpu_backend *g = (const gpu_backend *)be;
    switch (opt) {
    case NSTF_OPT_LEVEL: return g->level;
    case NSTF_OPT_GRAPHS: return g->graphs_on;
    case NSTF_OPT_FUSED: return g->fused_on && g->model_fusable;
    case NSTF_OPT_PROFILE: return g->prof_on;
    case NSTF_OPT_GRAPH_USED: return g->graph_used;
    case NSTF_OPT_N: break;
    }
    return 0;
}

static nstf_status gpu_marks_reserve(nstf_backend *be, int cap) {
    gpu_backend *g = gpu_of(be);
    if (cap <= g->n_evs) return NSTF_OK;
    void **evs = nstf_calloc((size_t)cap, sizeof *evs, "time marks");
    if (!evs) return NSTF_ERR_OOM;
    for (int i = 0; i < g->n_evs; i++) evs[i] = g->evs[i];
    nstf_free(g->evs);
    g->evs = evs;
    NSTF_TRY(nstf_gpu_set_device(g->dev)); /* events belong to the current device: the stream's */
    for (; g->n_evs < cap; g->n_evs++) NSTF_TRY(nstf_gpu_event_create(&g->evs[g->n_evs]));
    return NSTF_OK;
}

static nstf_status gpu_mark(nstf_backend *be, int i) {
    gpu_backend *g = gpu_of(be);
    if (i < 0 || i >= g->n_evs) return nstf_set_error(NSTF_ERR_RANGE, "time mark %d of %d", i, g->n_evs);
    NSTF_TRY(nstf_gpu_set_device(g->dev)); /* (a caller's thread may have another device current) */
    return nstf_gpu_event_record(g->evs[i], g->stream);
}

static nstf_status gpu_mark_ns(nstf_backend *be, int i, int j, uint64_t *ns) {
    gpu_backend *g = gpu_of(be);
    if (i < 0 || j < 0 || i >= g->n_evs || j >= g->n_evs)
        return nstf_set_error(NSTF_ERR_RANGE, "time marks %d, %d of %d", i, j, g->n_evs);
    float ms = 0;
    NSTF_TRY(nstf_gpu_event_ms(g->evs[i], g->evs[j], &ms));
    *ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
    return NSTF_OK;
}

static int64_t gpu_kernels(const nstf_backend *be) { return ((const gpu_backend *)be)->n_kernels; }
static int64_t gpu_graph_kernels(const nstf_backend *be) {
    const gpu_backend *g = (const gpu_backend *)be;
    return g->graph ? g->graph_nodes : 0;
}

/* Each op inside a named range for Nsight Systems (NVTX; no-ops elsewhere). */
#define RANGED(name)                                                           \
    static nstf_status ranged_##name(nstf_backend *be, const nstf_op_args *a) { \
        if (gpu_of(be)->l4_rec) return gpu_l4_record(gpu_of(be), a);          \
        nstf_gpu_range_push(a->label ? a->label : #name);                      \
        nstf_status st = nstf_gpu_op_##name(be, a);                            \
        nstf_gpu_range_pop();                                                  \
        return st;                                                             \
    }
#define NSTF_X(U, l, ref, cpu, gpu, d) RANGED(l)
NSTF_OPS(NSTF_X)
#undef NSTF_X

static const nstf_backend_vt k_gpu_vt = {
    .name =
#if defined(NSTF_HAVE_HIP)
        "HIP",
#else
        "CUDA",
#endif
    .destroy = gpu_destroy,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .upload = gpu_upload,
    .download = gpu_download,
    .relayout = gpu_relayout,
    .zero = gpu_zero,
    .sync = gpu_sync,
    .mem = gpu_mem,
    .plan = gpu_plan,
    .prepare = gpu_prepare,
    .place = nstf_gpu_place,
    .can_fuse = nstf_gpu_can_fuse,
    .begin = gpu_begin,
    .end = gpu_end,
    .ops = {
#define NSTF_X(U, l, ref, cpu, gpu, d) [NSTF_OP_##U] = ranged_##l,
        NSTF_OPS(NSTF_X)
#undef NSTF_X
    },
    .n_levels = GPU_N_LEVELS,
    .set_opt = gpu_set_opt,
    .get_opt = gpu_get_opt,
    .marks_reserve = gpu_marks_reserve,
    .mark = gpu_mark,
    .mark_ns = gpu_mark_ns,
    .kernels = gpu_kernels,
    .graph_kernels = gpu_graph_kernels,
};

const nstf_backend_vt *nstf_backend_gpu_table(void) { return &k_gpu_vt; }

nstf_status nstf_backend_gpu_create(int dev, nstf_backend **out) {
    *out = NULL;
    int n_dev = nstf_gpu_device_count();
    if (dev < 0 || dev >= n_dev) return nstf_set_error(NSTF_ERR_UNSUPPORTED, "no GPU %d (this machine has %d)", dev, n_dev);
    NSTF_TRY(nstf_gpu_set_device(dev));
    gpu_backend *g = nstf_calloc(1, sizeof *g, "GPU backend");
    if (!g) return NSTF_ERR_OOM;
    g->base.vt = &k_gpu_vt;
    g->base.act_type = NSTF_TYPE_BF16;
    g->base.kv_type = NSTF_TYPE_BF16;
    g->base.host_memory = false;
    g->base.int8_act = false;
    g->dev = dev;
    g->level = GPU_DEFAULT_LEVEL;
    g->graphs_on = true;
    g->fused_on = true;
    g->model_fusable = true;
    g->graph_bound = -1;
    nstf_status st = nstf_gpu_query(dev, &g->info);
    if (st == NSTF_OK) st = nstf_backend_gpu_line(dev, g->base.device, sizeof g->base.device);
    if (st == NSTF_OK) st = nstf_gpu_stream_create(&g->stream);
    if (st != NSTF_OK) {
        gpu_destroy(&g->base);
        return st;
    }
    *out = &g->base;
    return NSTF_OK;
}

nstf_status nstf_backend_gpu_l4_stall(nstf_backend *be, int block, int ins, int timeout_ms) {
    if (be->vt != &k_gpu_vt) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s is not a GPU backend", be->device);
    return gpu_l4_set_stall(gpu_of(be), block, ins, timeout_ms);
}

nstf_status nstf_backend_gpu_l4_profile(nstf_backend *be, bool on) {
    if (be->vt != &k_gpu_vt) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s is not a GPU backend", be->device);
    return gpu_l4_trace(gpu_of(be), on);
}

nstf_status nstf_backend_gpu_l4_profile_get(nstf_backend *be, nstf_l4_profile *out) {
    if (be->vt != &k_gpu_vt) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s is not a GPU backend", be->device);
    return gpu_l4_trace_get(gpu_of(be), out);
}

const char *nstf_backend_gpu_l4_status(nstf_backend *be, int64_t *instructions) {
    *instructions = 0;
    if (be->vt != &k_gpu_vt) return "not a GPU backend";
    *instructions = gpu_l4_instructions(gpu_of(be));
    return gpu_l4_reason(gpu_of(be));
}

nstf_status nstf_backend_gpu_stream(nstf_backend *be, int *dev, void **stream) {
    if (be->vt != &k_gpu_vt) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s is not a GPU backend", be->device);
    *dev = gpu_of(be)->dev;
    *stream = gpu_of(be)->stream;
    return NSTF_OK;
}

/* ---- peaks ------------------------------------------------------------------------------------ */

nstf_status nstf_backend_gpu_peaks(nstf_backend *be, double *copy_gbs, double *matrix_gflops) {
    gpu_backend *g = gpu_of(be);
    *copy_gbs = *matrix_gflops = 0;
    NSTF_TRY(nstf_gpu_set_device(g->dev));
    const size_t bytes = (size_t)1 << 30;
    const int64_t n = 8192;
    void *a = NULL, *b = NULL, *c = NULL, *ev0 = NULL, *ev1 = NULL;
    nstf_status st = nstf_gpu_malloc(&a, bytes);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&b, bytes);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&c, (size_t)(n * n * 4));
    if (st == NSTF_OK) st = nstf_gpu_event_create(&ev0);
    if (st == NSTF_OK) st = nstf_gpu_event_create(&ev1);
    if (st == NSTF_OK) st = nstf_gpu_memset(a, 0, bytes, NULL);
    if (st == NSTF_OK) st = nstf_gpu_memset(b, 0, bytes, NULL);
    double best_cp = 1e30, best_mm = 1e30;
    for (int r = 0; st == NSTF_OK && r < 6; r++) {
        float ms = 0;
        st = nstf_gpu_event_record(ev0, NULL);
        if (st == NSTF_OK) st = nstf_gpu_memcpy_d2d(b, a, bytes, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_record(ev1, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_ms(ev0, ev1, &ms);
        if (r > 0 && ms < best_cp) best_cp = ms;
        /* GEMM n x n x n on the bf16 matrix units (operands: the zeroed buffers) */
        if (st == NSTF_OK) st = nstf_gpu_event_record(ev0, NULL);
        if (st == NSTF_OK)
            st = nstf_gpu_gemm_bf16(a, b, c, NSTF_TYPE_F32, NULL, NSTF_TYPE_F32, n, n, n, NSTF_GEMM_EPI_NONE, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_record(ev1, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_ms(ev0, ev1, &ms);
        if (r > 0 && ms < best_mm) best_mm = ms;
    }
    nstf_gpu_event_destroy(ev0);
    nstf_gpu_event_destroy(ev1);
    (void)nstf_gpu_free(a);
    (void)nstf_gpu_free(b);
    (void)nstf_gpu_free(c);
    if (st != NSTF_OK) return st;
    *copy_gbs = 2.0 * (double)bytes / (best_cp * 1e-3) / 1e9; /* read + write */
    *matrix_gflops = 2.0 * (double)n * n * n / (best_mm * 1e-3) / 1e9;
    return NSTF_OK;
}

#endif /* NSTF_HAVE_CUDA || NSTF_HAVE_HIP */
