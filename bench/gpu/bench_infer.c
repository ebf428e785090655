/* bench_infer.c — GPU inference timing: prefill tokens/s and decode
 * ms/token of the whole model forward, from GPU events (median of
 * repetitions after warm-up).
 *
 *   bench_infer --shape smollm2-135m|llama32-1b|llama3-8b [--type bf16]
 *               [--prompt 512] [--gen 64] [--reps 5] [--unfused]
 *   bench_infer -m MODEL.gguf [...]
 *
 * --shape builds the model in memory instead of reading a file: random
 * weights (uniform, std 0.02) at the real shape, one host copy of a layer
 * reused as the source of every layer's upload (each layer still gets its
 * own device copy, so the GPU reads as much memory as with real weights),
 * and no tokenizer. This keeps the 16 GB of an 8B model off the disk.
 * --type is any tensor type (every matrix that type) or a mix of `nstf
 * quantize` (Q4_K_M, Q5_K_M: each matrix the type llama.cpp's rules give
 * it, output Q6_K). The float types and the 32-element types Q8_0 .. Q5_1
 * are quantized from the random values; the super-block types and IQ4_NL
 * get random codes under fixed small scales (the reference quantizers'
 * search would take minutes at 8B, and the timing does not depend on the
 * values).
 *
 * --unfused times the level-3 decode on the unfused kernels (one graph of
 * ten kernels per layer) instead of the fused GEMVs, for before/after
 * figures; NSTF_PDL=0 in the environment turns programmatic dependent
 * launch off.
 *
 * Decode is timed at context `prompt` (after a prefill of that many
 * tokens), one token per step, three ways: graph replay with the argmax on
 * the device (greedy; 4 bytes come back), graph replay with the fp32
 * logits copied to the host (what the CPU sampler needs), and plain
 * launches with the argmax. Each step's time includes its host round trip
 * (token and position up, result down). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/mem.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "ops/gpu/gpu_api.h"
#include "opt/quantize.h"

typedef struct {
    const char *name;
    int n_layers, dim, n_heads, n_kv, ffn, vocab;
    float rope_base;
    bool tied;
} shape;

/* the shapes of tools/cmd_gen_model.c */
static const shape k_shapes[] = {
    {"smollm2-135m", 30, 576, 9, 3, 1536, 49152, 100000.0f, true},
    {"llama32-1b", 16, 2048, 32, 8, 8192, 128256, 500000.0f, true},
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 500000.0f, false},
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform [-1, 1) */
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    return (float)((g_rng * 2685821657736338717ull) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* Byte offsets of a block's fp16 scale fields (-1: none) for the types
 * that get random codes, and the scale values: codes times scale stay in
 * about the range of the quantized uniform values. */
static void code_scales(nstf_type t, int off[2], float sc[2]) {
    off[0] = off[1] = -1;
    sc[0] = 2e-4f, sc[1] = 1e-4f;
    switch (t) {
    case NSTF_TYPE_Q2_K: off[0] = 80, off[1] = 82, sc[0] = 2e-3f, sc[1] = 1e-3f; break;
    case NSTF_TYPE_Q3_K: off[0] = 108, sc[0] = 5e-4f; break;
    case NSTF_TYPE_Q4_K: case NSTF_TYPE_Q5_K: off[0] = 0, off[1] = 2; break;
    case NSTF_TYPE_Q6_K: off[0] = 208, sc[0] = 2e-5f; break;
    case NSTF_TYPE_IQ4_XS: off[0] = 0, sc[0] = 3e-5f; break;
    case NSTF_TYPE_IQ4_NL: off[0] = 0, sc[0] = 3e-4f; break;
    default: break;
    }
}

static void *random_matrix(nstf_type t, int64_t n_in, int64_t n_out) {
    uint64_t rb;
    if (!nstf_type_row_bytes(t, n_in, &rb)) return NULL;
    uint8_t *d = malloc(rb * (uint64_t)n_out);
    float *row = malloc((size_t)n_in * sizeof(float));
    if (!d || !row) { free(d); free(row); return NULL; }
    int off[2];
    float sc[2];
    code_scales(t, off, sc);
    if (off[0] >= 0) { /* random codes, fixed scales */
        const uint64_t bytes = rb * (uint64_t)n_out, bb = (uint64_t)nstf_type_block_bytes(t);
        for (uint64_t i = 0; i < bytes; i++) {
            g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
            d[i] = (uint8_t)((g_rng * 2685821657736338717ull) >> 56);
        }
        for (uint64_t b = 0; b < bytes; b += bb)
            for (int k = 0; k < 2; k++)
                if (off[k] >= 0) {
                    const uint16_t h = nstf_f32_to_fp16(sc[k]);
                    memcpy(d + b + off[k], &h, 2);
                }
        free(row);
        return d;
    }
    const float a = 0.02f * sqrtf(3.0f); /* uniform with std 0.02 */
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++) row[i] = a * urand();
        nstf_quantize_row(t, row, d + (uint64_t)r * rb, n_in);
    }
    free(row);
    return d;
}

static nstf_matrix mat(const void *d, nstf_type t, int64_t n_in, int64_t n_out) {
    nstf_matrix m = {d, t, n_in, n_out, NULL};
    return m;
}

/* Host copies of the random matrices, one per (role, type): a mix gives
 * some layers' attn_v / ffn_down another type than the rest. */
#define MAX_BLOBS 32
typedef struct {
    void *blob[MAX_BLOBS];
    int role[MAX_BLOBS];
    nstf_type type[MAX_BLOBS];
    int n;
} blob_set;

static void *blob_for(blob_set *bs, int role, nstf_type t, int64_t n_in, int64_t n_out) {
    for (int i = 0; i < bs->n; i++)
        if (bs->role[i] == role && bs->type[i] == t) return bs->blob[i];
    if (bs->n == MAX_BLOBS) return NULL;
    bs->role[bs->n] = role;
    bs->type[bs->n] = t;
    return bs->blob[bs->n++] = random_matrix(t, n_in, n_out);
}

/* A model in memory at shape sh, every matrix of type `base` or, with a
 * mix, the type nstf_quant_tensor_type gives it; bs collects what to free. */
static nstf_llama *synthetic(const shape *sh, nstf_type base, const nstf_quant_target *mix, blob_set *bs) {
    nstf_llama *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    nstf_llama_config *c = &m->cfg;
    c->n_layers = sh->n_layers;
    c->dim = sh->dim;
    c->n_heads = sh->n_heads;
    c->n_kv_heads = sh->n_kv;
    c->head_dim = sh->dim / sh->n_heads;
    c->ffn_dim = sh->ffn;
    c->n_vocab = sh->vocab;
    c->n_ctx_train = 8192;
    c->rope_base = sh->rope_base;
    c->norm_eps = 1e-5f;
    c->rope_mode = NSTF_ROPE_NORM;
    c->tied_output = sh->tied;
    const int64_t dim = c->dim, kvd = (int64_t)c->n_kv_heads * c->head_dim, ffn = c->ffn_dim;
    /* roles: the GGUF names, their shapes */
    static const char *const names[9] = {"token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
                                         "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                         "ffn_down.weight"};
    const int64_t n_in[9] = {dim, dim, dim, dim, dim, dim, dim, dim, ffn};
    const int64_t n_out[9] = {c->n_vocab, c->n_vocab, dim, kvd, kvd, dim, ffn, ffn, dim};
    float *norms = malloc((size_t)dim * sizeof(float));
    m->w.layers = calloc((size_t)c->n_layers, sizeof *m->w.layers);
    bs->blob[bs->n] = norms, bs->role[bs->n] = -1, bs->n++;
    bs->blob[bs->n] = m->w.layers, bs->role[bs->n] = -1, bs->n++;
    if (!norms || !m->w.layers) return NULL;
    for (int64_t i = 0; i < dim; i++) norms[i] = 1.0f;
    nstf_matrix w[9];
    for (int l = -1; l < c->n_layers; l++) {
        for (int r = l < 0 ? 0 : 2; r < (l < 0 ? 2 : 9); r++) {
            char name[64];
            if (l < 0) snprintf(name, sizeof name, "%s", names[r]);
            else snprintf(name, sizeof name, "blk.%d.%s", l, names[r]);
            /* an untied model's embedding is not the output (the output rule skips it) */
            const nstf_type t =
                mix ? nstf_quant_tensor_type(mix, name, 2, n_in[r], NSTF_TYPE_F32, !sh->tied, c->n_layers) : base;
            /* the output reuses the embedding's host copy when they share a type */
            void *d = r == 1 && t == w[0].type ? (void *)w[0].data : blob_for(bs, r, t, n_in[r], n_out[r]);
            if (!d) return NULL;
            w[r] = mat(d, t, n_in[r], n_out[r]);
        }
        if (l < 0) { /* tied: the embedding is the output (a mix gives it the output's type) */
            m->w.tok_embd = w[0];
            m->w.output = sh->tied ? w[0] : w[1]; /* untied: uploaded as a second copy */
            m->w.out_norm = norms;
            continue;
        }
        nstf_llama_layer *L = &m->w.layers[l];
        L->attn_norm = L->ffn_norm = norms;
        L->wq = w[2], L->wk = w[3], L->wv = w[4], L->wo = w[5];
        L->w_gate = w[6], L->w_up = w[7], L->w_down = w[8];
    }
    return m;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_f);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

#define DIE(...) do { fprintf(stderr, "bench_infer: " __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)

int main(int argc, char **argv) {
    const char *shape_name = NULL, *model = NULL, *type_name = "bf16";
    int prompt = 512, gen = 64, reps = 5;
    bool unfused = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--unfused")) {
            unfused = true;
            continue;
        }
        if (!v) DIE("%s needs a value", a);
        i++;
        if (!strcmp(a, "--shape")) shape_name = v;
        else if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--type")) type_name = v;
        else if (!strcmp(a, "--prompt")) prompt = atoi(v);
        else if (!strcmp(a, "--gen")) gen = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else DIE("unknown option %s", a);
    }
    if (prompt < 2 || gen < 4 || reps < 1 || (!shape_name == !model)) DIE("usage: see the header of bench_infer.c");
    if (nstf_backend_gpu_count() < 1) DIE("no GPU");
    char line[320];
    if (nstf_backend_gpu_line(0, line, sizeof line) != NSTF_OK) DIE("%s", nstf_last_error());
    printf("%s\n", line);

    nstf_llama *m = NULL;
    blob_set bs = {0};
    nstf_gguf *gf = NULL;
    const char *label;
    if (model) {
        if (nstf_gguf_open(model, &gf) != NSTF_OK || nstf_llama_load(gf, &m) != NSTF_OK) DIE("%s", nstf_last_error());
        label = model;
    } else {
        const shape *sh = NULL;
        for (size_t i = 0; i < sizeof k_shapes / sizeof *k_shapes; i++)
            if (!strcmp(k_shapes[i].name, shape_name)) sh = &k_shapes[i];
        nstf_type t = NSTF_TYPE_F32;
        nstf_quant_target mix;
        bool mix_on = false;
        if (!sh) DIE("unknown shape %s", shape_name);
        if (!nstf_type_from_name(type_name, &t)) {
            if (!nstf_quant_target_parse(type_name, &mix) || mix.mix == NSTF_QMIX_PLAIN)
                DIE("unknown type %s (a tensor type, or %s)", type_name, nstf_quant_target_list());
            mix_on = true;
        }
        m = synthetic(sh, t, mix_on ? &mix : NULL, &bs);
        if (!m) DIE("out of host memory building %s", shape_name);
        label = shape_name;
    }
    const int n_ctx = prompt + 3 * gen + 8;
    nstf_backend *be = NULL;
    nstf_llama_run *g = NULL;
    double t0 = 0;
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t0 = ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    if (nstf_backend_gpu_create(0, &be) != NSTF_OK || nstf_llama_run_create(m, be, n_ctx, prompt, 1, &g) != NSTF_OK)
        DIE("%s", nstf_last_error());
    double t1;
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t1 = ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    (void)be->vt->set_opt(be, NSTF_OPT_FUSED, !unfused);
    (void)nstf_gpu_set_pdl(1); /* what the library makes of a request for PDL (NSTF_PDL=0 refuses it) */
    const bool pdl = nstf_gpu_set_pdl(0) != 0;
    printf("%s (%s): %d layers, dim %d, %.2f GiB on the device, upload %.1f s; PDL %s\n", label,
           model ? nstf_type_name(m->w.layers[0].wq.type) : type_name, m->cfg.n_layers, m->cfg.dim,
           (double)(g->wbytes + g->s.block_bytes) / (1u << 30), t1 - t0, !unfused && pdl ? "on (sm_90)" : "off");

    if (be->vt->marks_reserve(be, 2) != NSTF_OK) DIE("%s", nstf_last_error());
    int32_t *ids = malloc((size_t)prompt * sizeof(int32_t));
    float *times = malloc((size_t)(reps > gen ? reps : gen) * sizeof(float));
    float *logits = malloc((size_t)m->cfg.n_vocab * sizeof(float));
    if (!ids || !times || !logits) DIE("out of host memory");
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)((urand() + 1.0f) * 0.5f * (m->cfg.n_vocab - 1));

    /* prefill */
    int32_t tok = 0;
    for (int r = -1; r < reps; r++) {
        uint64_t ns = 0;
        if (be->vt->mark(be, 0) != NSTF_OK || nstf_llama_forward_seq(g, ids, prompt, 0, false, NULL, &tok) != NSTF_OK ||
            be->vt->mark(be, 1) != NSTF_OK || be->vt->mark_ns(be, 0, 1, &ns) != NSTF_OK)
            DIE("%s", nstf_last_error());
        if (r >= 0) times[r] = (float)(ns * 1e-6);
    }
    float pf = median(times, reps);
    printf("prefill %d tokens: %.3f ms (median of %d) = %.0f tokens/s\n", prompt, pf, reps, prompt / pf * 1e3);

    /* decode, three ways */
    static const char *modes[] = {"graph, device argmax", "graph, logits to host", "plain launches, device argmax"};
    for (int mode = 0; mode < 3; mode++) {
        (void)be->vt->set_opt(be, NSTF_OPT_GRAPHS, mode != 2);
        int pos = prompt;
        for (int i = -4; i < gen; i++) { /* 4 warm-up steps (the first runs plainly, the second captures) */
            int32_t next = tok;
            uint64_t ns = 0;
            if (be->vt->mark(be, 0) != NSTF_OK ||
                nstf_llama_forward_seq(g, &tok, 1, pos, false, mode == 1 ? logits : NULL, mode == 1 ? NULL : &next) !=
                    NSTF_OK ||
                be->vt->mark(be, 1) != NSTF_OK || be->vt->mark_ns(be, 0, 1, &ns) != NSTF_OK)
                DIE("%s", nstf_last_error());
            if (i >= 0) times[i] = (float)(ns * 1e-6);
            tok = mode == 1 ? tok : next;
            if (i >= -1) pos++; /* warm-up steps rewrite the same position */
        }
        bool graph = be->vt->get_opt(be, NSTF_OPT_GRAPH_USED) != 0;
        float med = median(times, gen);
        if (mode == 0)
            printf("decode kernels %s\n", be->vt->get_opt(be, NSTF_OPT_FUSED) ? "fused" : "unfused");
        printf("decode at context %d (%s%s): %.4f ms/token (median of %d steps; min %.4f, max %.4f) = %.0f tokens/s\n",
               prompt, modes[mode], mode != 2 && !graph ? " [graph capture FAILED, plain]" : "", med, gen, times[0],
               times[gen - 1], 1e3 / med);
    }
    nstf_llama_run_free(g);
    nstf_backend_free(be);
    free(ids);
    free(times);
    free(logits);
    if (model) {
        nstf_llama_free(m);
    } else {
        for (int i = 0; i < bs.n; i++) free(bs.blob[i]);
        free(m);
    }
    return 0;
}
