/* cmd_gen_model.c — `nstf gen-model`: write a Llama GGUF with random
 * weights at a real model's shape, for benchmarks at sizes we cannot
 * download. The tokenizer is a valid byte-level BPE vocabulary: the 256
 * GPT-2 byte symbols, a few control tokens, and unused fillers up to the
 * shape's vocabulary size (no merges: every byte is a token). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "core/mem.h"
#include "core/threadpool.h"
#include "gen_model.h"
#include "io/gguf.h"

int cmd_gen_model(int argc, char **argv);

typedef struct {
    const char *name;
    int n_layers, dim, n_heads, n_kv, ffn, vocab, ctx;
    float rope_base;
    bool tied;
} shape;

static const shape k_shapes[] = {
    {"tiny", 2, 64, 4, 2, 192, 384, 2048, 10000.0f, true},
    {"smollm2-135m", 30, 576, 9, 3, 1536, 49152, 8192, 100000.0f, true},
    {"llama32-1b", 16, 2048, 32, 8, 8192, 128256, 131072, 500000.0f, true},
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f, false},
    {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0f, false},
};

/* Every row of every tensor draws from its own xorshift64* stream, seeded
 * from (seed, tensor number, row) by splitmix64, so rows are drawn in
 * parallel and the file depends only on the seed, not on the threads. */
static uint64_t g_seed, g_tensor;
static nstf_pool *g_pool;
static cli_progress g_bar;  /* weights drawn so far, on a terminal */
static uint64_t g_done, g_total;
static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t xorshift(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
/* n values of N(mean, std): Box-Muller, both outputs of each pair */
static void gauss_row(uint64_t *st, float *out, int64_t n, float std, float mean) {
    for (int64_t i = 0; i < n; i += 2) {
        const uint64_t a = xorshift(st), b = xorshift(st);
        const double u1 = ((a >> 11) + 1.0) * (1.0 / 9007199254740993.0), u2 = (b >> 11) * (1.0 / 9007199254740992.0);
        const double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
        out[i] = mean + std * (float)(r * cos(t));
        if (i + 1 < n) out[i + 1] = mean + std * (float)(r * sin(t));
    }
}

typedef struct {
    nstf_type type;
    int64_t n_in, rows;
    uint64_t row_bytes, tensor;
    float std, mean;
    uint8_t *data;
    int oom;
} gen_job;

static void gen_part(void *ctx, int ith, int nth) {
    gen_job *j = ctx;
    int64_t lo, hi;
    nstf_split_range(j->rows, 1, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    float *row = nstf_alloc((size_t)j->n_in * sizeof(float), "random row");
    if (!row) {
        j->oom = 1; /* benign race: every writer stores 1 */
        return;
    }
    for (int64_t r = lo; r < hi; r++) {
        uint64_t st = splitmix64(g_seed ^ splitmix64((j->tensor << 40) ^ (uint64_t)r));
        if (!st) st = 1;
        gauss_row(&st, row, j->n_in, j->std, j->mean);
        nstf_quantize_row(j->type, row, j->data + (uint64_t)r * j->row_bytes, j->n_in);
    }
    nstf_free(row);
}

/* Random N(0, std) matrix [n_out, n_in] (or vector when n_out == 0) of
 * `type`, quantized row by row, added to the writer. */
static nstf_status add_random(nstf_gguf_writer *w, const char *name, nstf_type type, int64_t n_in,
                              int64_t n_out, float std, float mean) {
    int64_t rows = n_out ? n_out : 1;
    uint64_t row_bytes, total;
    if (!nstf_type_row_bytes(type, n_in, &row_bytes) || !nstf_mul_ok(row_bytes, (uint64_t)rows, &total))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: %lld is not a multiple of the %s block", name,
                              (long long)n_in, nstf_type_name(type));
    uint8_t *data = nstf_alloc((size_t)total, name);
    if (!data) return NSTF_ERR_OOM;
    gen_job job = {type, n_in, rows, row_bytes, g_tensor++, std, mean, data, 0};
    nstf_pool_run(g_pool, gen_part, &job);
    if (job.oom) {
        nstf_free(data);
        return nstf_set_error(NSTF_ERR_OOM, "out of memory for a random row of %s", name);
    }
    int64_t ne[2] = {n_in, n_out};
    nstf_status s = nstf_gguf_writer_add_tensor(w, name, type, n_out ? 2 : 1, ne, data);
    nstf_free(data);
    g_done += (uint64_t)n_in * (uint64_t)rows;
    cli_progress_cb(&g_bar, g_done, g_total);
    return s;
}

/* GPT-2's byte -> printable code point map, as UTF-8. */
static void byte_symbol(int b, char out[4]) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0; /* index among the remapped bytes */
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); out[2] = 0; }
}

static nstf_status add_tokenizer(nstf_gguf_writer *w, int vocab) {
    static const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    const int n_special = 3;
    if (vocab < 256 + n_special)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "vocabulary %d is too small for a byte-level tokenizer", vocab);
    char **toks = calloc((size_t)vocab, sizeof *toks);
    int32_t *types = calloc((size_t)vocab, sizeof *types);
    nstf_status s = (toks && types) ? NSTF_OK : nstf_set_error(NSTF_ERR_OOM, "out of memory for the vocabulary");
    for (int i = 0; s == NSTF_OK && i < vocab; i++) {
        toks[i] = malloc(24);
        if (!toks[i]) { s = nstf_set_error(NSTF_ERR_OOM, "out of memory for the vocabulary"); break; }
        if (i < n_special) { snprintf(toks[i], 24, "%s", specials[i]); types[i] = 3; }
        else if (i < n_special + 256) { byte_symbol(i - n_special, toks[i]); types[i] = 1; }
        else { snprintf(toks[i], 24, "<unused_%d>", i); types[i] = 5; }
    }
    if (s == NSTF_OK) s = nstf_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (s == NSTF_OK) s = nstf_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    if (s == NSTF_OK) s = nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)vocab);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", NSTF_GGUF_INT32, types, (uint64_t)vocab);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (s == NSTF_OK)
        s = nstf_gguf_writer_set_str(w, "tokenizer.chat_template",
                                     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                     "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
    for (int i = 0; toks && i < vocab; i++) free(toks[i]);
    free(toks);
    free(types);
    return s;
}

/* Parameters of the shape: the progress bar's total. */
static uint64_t n_params(const shape *sh) {
    const uint64_t d = (uint64_t)sh->dim, kv = (uint64_t)sh->n_kv * (d / (uint64_t)sh->n_heads), f = (uint64_t)sh->ffn,
                   v = (uint64_t)sh->vocab;
    const uint64_t layer = 2 * d + d * d * 2 + 2 * d * kv + 3 * d * f;
    return v * d * (sh->tied ? 1 : 2) + (uint64_t)sh->n_layers * layer + d;
}

/* norm_std: the spread of the norm weights around 1 (0: exactly 1, the
 * initialization of a model trained from scratch) */
static nstf_status gen(const shape *sh, nstf_type type, const char *path, uint64_t seed, float norm_std) {
    g_seed = splitmix64(seed);
    g_tensor = 0;
    NSTF_TRY(nstf_pool_create(cli_default_threads(), &g_pool));
    cli_progress_init(&g_bar, "drawing weights", "M", 1e-6);
    g_done = 0;
    g_total = n_params(sh);
    nstf_gguf_writer *w;
    nstf_status cs = nstf_gguf_writer_create(&w);
    if (cs != NSTF_OK) {
        nstf_pool_free(g_pool);
        return cs;
    }
    const int hd = sh->dim / sh->n_heads, kv = sh->n_kv * hd;
    char desc[96];
    snprintf(desc, sizeof desc, "random %s (%s)", sh->name, nstf_type_name(type));
    nstf_status s = nstf_gguf_writer_set_str(w, "general.architecture", "llama");
    if (s == NSTF_OK) s = nstf_gguf_writer_set_str(w, "general.name", desc);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)sh->n_layers);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)sh->ctx);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)sh->dim);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)sh->ffn);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)sh->n_heads);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)sh->n_kv);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_f32(w, "llama.rope.freq_base", sh->rope_base);
    if (s == NSTF_OK) s = nstf_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (s == NSTF_OK) s = add_tokenizer(w, sh->vocab);
    /* std 0.02 as in Llama's initialization; norms near 1 */
    if (s == NSTF_OK) s = add_random(w, "token_embd.weight", type, sh->dim, sh->vocab, 0.02f, 0.0f);
    for (int l = 0; s == NSTF_OK && l < sh->n_layers; l++) {
        char nm[64];
#define T(x) (snprintf(nm, sizeof nm, "blk.%d." x ".weight", l), nm)
        s = add_random(w, T("attn_norm"), NSTF_TYPE_F32, sh->dim, 0, norm_std, 1.0f);
        if (s == NSTF_OK) s = add_random(w, T("attn_q"), type, sh->dim, sh->dim, 0.02f, 0.0f);
        if (s == NSTF_OK) s = add_random(w, T("attn_k"), type, sh->dim, kv, 0.02f, 0.0f);
        if (s == NSTF_OK) s = add_random(w, T("attn_v"), type, sh->dim, kv, 0.02f, 0.0f);
        if (s == NSTF_OK) s = add_random(w, T("attn_output"), type, sh->dim, sh->dim, 0.02f, 0.0f);
        if (s == NSTF_OK) s = add_random(w, T("ffn_norm"), NSTF_TYPE_F32, sh->dim, 0, norm_std, 1.0f);
        if (s == NSTF_OK) s = add_random(w, T("ffn_gate"), type, sh->dim, sh->ffn, 0.02f, 0.0f);
        if (s == NSTF_OK) s = add_random(w, T("ffn_up"), type, sh->dim, sh->ffn, 0.02f, 0.0f);
        if (s == NSTF_OK) s = add_random(w, T("ffn_down"), type, sh->ffn, sh->dim, 0.02f, 0.0f);
#undef T
    }
    if (s == NSTF_OK) s = add_random(w, "output_norm.weight", NSTF_TYPE_F32, sh->dim, 0, norm_std, 1.0f);
    if (s == NSTF_OK && !sh->tied) s = add_random(w, "output.weight", type, sh->dim, sh->vocab, 0.02f, 0.0f);
    cli_progress_end(&g_bar);
    if (s == NSTF_OK && g_bar.tty) fprintf(stderr, "nstf %s: writing %s\n", cli_cmd, path);
    if (s == NSTF_OK) s = nstf_gguf_writer_write(w, path, 0);
    nstf_gguf_writer_free(w);
    nstf_pool_free(g_pool);
    g_pool = NULL;
    return s;
}

nstf_status gen_model_file(const char *shape_name, nstf_type type, const char *path, uint64_t seed) {
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (!strcmp(k_shapes[i].name, shape_name)) return gen(&k_shapes[i], type, path, seed, 0.0f);
    return nstf_set_error(NSTF_ERR_INVALID_ARG, "unknown shape '%s' (tiny, smollm2-135m, llama32-1b, llama3-8b, llama3-70b)",
                          shape_name);
}

static void gen_usage(FILE *f) {
    fprintf(f, "usage: nstf gen-model --shape SHAPE [--type TYPE] [--seed N] -o FILE\n"
               "  writes a Llama GGUF with random weights (N(0, 0.02)) and a byte-level tokenizer\n"
               "  (a progress bar with rate and ETA on a terminal); rows are drawn on every\n"
               "  physical core, and the file depends only on the seed\n"
               "  SHAPE: tiny | smollm2-135m | llama32-1b | llama3-8b | llama3-70b\n"
               "  TYPE:  f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 (default bf16; norms stay f32)\n"
               "  -o, --output FILE   where to write it\n");
}

int cmd_gen_model(int argc, char **argv) {
    const char *shape_name = NULL, *out = NULL, *type_name = "bf16";
    uint64_t seed = 1;
    cli_expand_args(&argc, &argv, gen_usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            gen_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--shape") && strcmp(a, "--type") && strcmp(a, "-o") && strcmp(a, "--output") && strcmp(a, "--seed"))
            return cli_unknown_option(a, gen_usage);
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--shape")) shape_name = v;
        else if (!strcmp(a, "--type")) type_name = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!cli_parse_u64(a, v, &seed)) return 2;
    }
    if (!shape_name || !out) {
        cli_err("--shape and -o are required (see --help)");
        return 2;
    }
    const shape *sh = NULL;
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (!strcmp(k_shapes[i].name, shape_name)) sh = &k_shapes[i];
    if (!sh) {
        cli_err("unknown shape '%s' (tiny, smollm2-135m, llama32-1b, llama3-8b, llama3-70b)", shape_name);
        return 2;
    }
    nstf_type type;
    if (!nstf_type_from_name(type_name, &type) || !nstf_type_can_quantize(type)) {
        cli_err("unknown type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1)", type_name);
        return 2;
    }
    if (gen(sh, type, out, seed, 0.1f) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    return 0;
}
