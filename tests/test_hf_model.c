/* test_hf_model.c — HF model folders and `nstf convert` against HF
 * transformers and tokenizers.
 *
 * Reference: scripts/ref/make_hf_tiny.py (versions in
 * tests/data/hf_tiny_ref.txt) built tests/data/hf_tiny, a random 2-layer
 * Llama stored in BF16 / F16 / F32 over three safetensors shards, and
 * recorded transformers' fp32 logits (hf_tiny_logits.bin), tokenizer ids
 * of test strings for three tokenizers and chat renderings.
 *
 * 1. Logits at every position of 4 prompts, from the folder (mapped
 *    weights, RoPE in NEOX mode) and from GGUF files written by `nstf
 *    convert` (Q/K permuted, RoPE in adjacent-pair mode): as stored, --type
 *    f32 and --type f16. Metric: NMSE over all logits of a prompt and top-1
 *    agreement at every position, precise and fast CPU modes.
 *    As stored and f32: the weights are exactly transformers' (each value
 *    widened to fp32), so the computation is fp32 against fp32 with other
 *    summation orders: measured NMSE at most 8.5e-13 over the prompts;
 *    bound 1e-9, top-1 100%. f16: BF16 values in F16's normal range convert
 *    exactly, those below it (|x| < 6.1e-5) lose low bits: measured the
 *    same 8.5e-13 on these weights; bound 1e-8, top-1 100%.
 *    GPU builds, when a GPU is present: the folder (NEOX RoPE in the fused
 *    GPU kernels) and the converted file on the device, by the mean
 *    KL(reference || GPU) of the softmax, 0.01 nats as test_e2e_gpu bounds
 *    GPU against CPU (the GPU forward has 16-bit activations in its
 *    matrix products); NMSE and top-1 are reported.
 * 2. The converted Q/K rows equal the folder's permuted as llama.cpp's
 *    converter permutes them (written here as its reshape/swapaxes), byte
 *    for byte; every other tensor equal, or widened exactly.
 * 3. Tokenizers: ids of 10 strings for the SmolLM2-style (from the model
 *    folder and from the converted file), Llama-3-style and GPT-2-style
 *    tokenizer.json folders equal the tokenizers library's; chat templates
 *    render as transformers' apply_chat_template does. Exact.
 * 4. `nstf run -m FOLDER` and `nstf convert` from the command line; hostile
 *    folders (each refused with its message): an unknown architecture, an
 *    unknown pre-tokenizer, a tensor that is no part of a Llama, a missing
 *    one, a tokenizer id beyond the vocabulary. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_run.h"
#include "hf_ref.h"
#include "io/convert.h"
#include "io/hf_model.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/session.h"
#include "test_util.h"
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
#include "ops/gpu/gpu_api.h"
#endif

#define DATA NSTF_SOURCE_DIR "/tests/data"
#define FOLDER DATA "/hf_tiny"

#define MAX_NMSE_EXACT 1e-9
#define MAX_NMSE_F16 1e-8
#define GPU_MAX_KL 0.01

/* The folder runs RoPE in NEOX mode, a converted file in adjacent pairs. */
static void check_model(const ref_logits *r, const char *model, const char *label, const char *device, bool precise,
                        double max_nmse, double max_kl) {
    const logit_run how = {device, precise, 0, strstr(label, "folder") ? NSTF_ROPE_NEOX : NSTF_ROPE_NORM, NULL};
    check_logits(r, model, label, &how, max_nmse, max_kl);
}

/* ---- convert --------------------------------------------------------------------- */

static char g_tmp[240];

static void convert(const char *type, const char *out) {
    nstf_gguf *g = NULL;
    nstf_status st = nstf_model_file_open(FOLDER, &g);
    CHECK(st == NSTF_OK, "open folder: %s", nstf_last_error());
    nstf_convert_params p = {.out_type = -1};
    nstf_type t;
    if (type) {
        CHECK(nstf_type_from_name(type, &t), "type %s", type);
        p.out_type = (int)t;
    }
    if (st == NSTF_OK) st = nstf_convert_to_gguf(g, out, &p);
    CHECK(st == NSTF_OK, "convert %s: %s", type ? type : "as stored", nstf_last_error());
    nstf_gguf_close(g);
}

/* The converted file against the folder, tensor by tensor. Q and K as
 * llama.cpp's permute: w.reshape(n_head, 2, d/2, n_in).swapaxes(1, 2). */
static void check_converted_tensors(const char *path) {
    nstf_gguf *hf = NULL, *gg = NULL;
    if (nstf_hf_open(FOLDER, &hf) != NSTF_OK || nstf_gguf_open(path, &gg) != NSTF_OK) {
        CHECK(0, "open: %s", nstf_last_error());
        nstf_gguf_close(hf);
        return;
    }
    CHECK(gg->n_tensors == hf->n_tensors, "tensor counts %llu, %llu", (unsigned long long)gg->n_tensors,
          (unsigned long long)hf->n_tensors);
    CHECK(!nstf_gguf_find_kv(gg, NSTF_GGUF_KEY_ROPE_NEOX), "converted file keeps %s", NSTF_GGUF_KEY_ROPE_NEOX);
    const uint32_t heads = nstf_gguf_get_u32_or(hf, "llama.attention.head_count", 0),
                   kv_heads = nstf_gguf_get_u32_or(hf, "llama.attention.head_count_kv", 0);
    int n_perm = 0, n_same = 0;
    for (uint64_t i = 0; i < hf->n_tensors; i++) {
        const nstf_gguf_tensor *a = &hf->tensors[i];
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)a->name.len, a->name.ptr);
        const nstf_gguf_tensor *b = nstf_gguf_find_tensor(gg, name);
        CHECK(b && b->n_dims == a->n_dims && !memcmp(b->ne, a->ne, sizeof a->ne), "%s: missing or reshaped", name);
        if (!b) continue;
        const int64_t n_in = a->ne[0], rows = (int64_t)(a->n_elems / (uint64_t)n_in);
        uint32_t h = strstr(name, "attn_q.weight") ? heads : strstr(name, "attn_k.weight") ? kv_heads : 0;
        float *x = malloc((size_t)n_in * 4), *y = malloc((size_t)n_in * 4);
        uint64_t ra, rb;
        nstf_type_row_bytes(a->type, n_in, &ra);
        nstf_type_row_bytes(b->type, n_in, &rb);
        int bad = 0;
        const int64_t d = h ? rows / h : rows;
        for (int64_t hh = 0; hh < (h ? h : 1); hh++)
            for (int64_t two = 0; two < 2; two++)
                for (int64_t k = 0; k < d / 2; k++) {
                    /* source row [hh][two][k] -> destination [hh][k][two] */
                    int64_t src = hh * d + two * (d / 2) + k, dst = h ? hh * d + k * 2 + two : src;
                    nstf_dequantize_row(a->type, (const uint8_t *)a->data + (uint64_t)src * ra, x, n_in);
                    nstf_dequantize_row(b->type, (const uint8_t *)b->data + (uint64_t)dst * rb, y, n_in);
                    bad += memcmp(x, y, (size_t)n_in * 4) != 0;
                }
        if (rows % 2) { /* vectors: the one row the loop above skips when d is odd */
            nstf_dequantize_row(a->type, (const uint8_t *)a->data + (uint64_t)(rows - 1) * ra, x, n_in);
            nstf_dequantize_row(b->type, (const uint8_t *)b->data + (uint64_t)(rows - 1) * rb, y, n_in);
            bad += memcmp(x, y, (size_t)n_in * 4) != 0;
        }
        CHECK(bad == 0, "%s: %d rows differ", name, bad);
        if (h) n_perm++;
        else n_same++;
        free(x);
        free(y);
    }
    printf("convert: %d Q/K tensors permuted as llama.cpp does, %d others equal\n", n_perm, n_same);
    CHECK(n_perm == 4, "%d permuted tensors", n_perm);
    nstf_gguf_close(hf);
    nstf_gguf_close(gg);
}

/* ---- tokenizers ---------------------------------------------------------------------- */

/* Every "tok VARIANT ..." and "chat VARIANT ..." line of the reference. */
static void check_tokenizer(const char *variant, const nstf_tokenizer *t, const nstf_gguf *g, const char *label) {
    int n_tok = 0, n_chat = 0;
    check_tok_records(DATA "/hf_tiny_ref.txt", variant, t, g, label, &n_tok, &n_chat);
    printf("tokenizer %-24s: %d strings, %d chat renderings identical to HF\n", label, n_tok, n_chat);
    CHECK(n_tok == 10, "%s: %d strings in the reference", label, n_tok);
}

static void test_tokenizers(const char *converted) {
    static const char *const dirs[][2] = {{"llama3", DATA "/hf_tokenizers/llama3"}, {"gpt2", DATA "/hf_tokenizers/gpt2"}};
    for (int i = 0; i < 2; i++) {
        nstf_gguf *g;
        nstf_tokenizer *t = tokenizer_of_dir(dirs[i][1], &g);
        if (t) check_tokenizer(dirs[i][0], t, g, dirs[i][0]);
        if (t && i == 0) CHECK(nstf_tokenizer_wants_bos(t), "llama3: BOS from the post-processor");
        nstf_tokenizer_free(t);
        nstf_gguf_close(g);
    }
    const char *models[][2] = {{FOLDER, "smollm (model folder)"}, {converted, "smollm (converted GGUF)"}};
    for (int i = 0; i < 2; i++) {
        nstf_gguf *g = NULL;
        nstf_tokenizer *t = NULL;
        nstf_status st = nstf_model_file_open(models[i][0], &g);
        if (st == NSTF_OK) st = nstf_tokenizer_from_gguf(g, &t);
        CHECK(st == NSTF_OK, "%s: %s", models[i][1], nstf_last_error());
        if (t) {
            check_tokenizer("smollm", t, g, models[i][1]);
            CHECK(nstf_tokenizer_n_vocab(t) == 416 && nstf_tokenizer_bos(t) == 1 && nstf_tokenizer_eos(t) == 2 &&
                      nstf_tokenizer_is_eog(t, 2),
                  "%s: vocab %d bos %d eos %d", models[i][1], nstf_tokenizer_n_vocab(t), nstf_tokenizer_bos(t),
                  nstf_tokenizer_eos(t));
            char piece[32];
            int64_t n = nstf_tokenizer_piece(t, 405, piece, sizeof piece);
            CHECK(n == 8 && !memcmp(piece, "[PAD405]", 8), "%s: unused id 405 is \"%.*s\"", models[i][1], (int)n, piece);
        }
        nstf_tokenizer_free(t);
        nstf_gguf_close(g);
    }
}

/* ---- hostile folders ----------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)k + 1);
    *n = fread(p, 1, (size_t)k, f);
    p[*n] = 0;
    fclose(f);
    return p;
}

static void spit(const char *path, const char *d, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(d, 1, n, f) == n, "write %s", path);
    if (f) fclose(f);
}

/* A copy of the model folder in g_tmp/NAME with `from` replaced by `to`
 * in file `file` (NULL: no change). Returns the folder. */
static const char *variant(const char *name, const char *file, const char *from, const char *to) {
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    mkdir(dir, 0755);
    DIR *d = opendir(FOLDER);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char src[1024], dst[1024];
        snprintf(src, sizeof src, "%s/%s", FOLDER, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", dir, e->d_name);
        size_t n;
        char *p = slurp(src, &n);
        if (!p) continue;
        if (file && !strcmp(file, e->d_name)) {
            char *at = strstr(p, from);
            CHECK(at != NULL, "%s: '%s' not found in %s", name, from, file);
            if (at) {
                size_t lf = strlen(from), lt = strlen(to);
                char *q = malloc(n - lf + lt + 1);
                memcpy(q, p, (size_t)(at - p));
                memcpy(q + (at - p), to, lt);
                memcpy(q + (at - p) + lt, at + lf, n - (size_t)(at - p) - lf);
                n = n - lf + lt;
                free(p);
                p = q;
            }
        }
        spit(dst, p, n);
        free(p);
    }
    if (d) closedir(d);
    return dir;
}

static void expect_refused(const char *dir, nstf_status want, const char *msg) {
    nstf_gguf *g = NULL;
    nstf_status st = nstf_model_file_open(dir, &g);
    const char *e = nstf_last_error();
    if (getenv("TEST_VERBOSE")) printf("  %s\n", e);
    CHECK(st == want && g == NULL && strstr(e, msg), "%s: status %d (want %d): \"%s\" lacks \"%s\"", dir, (int)st,
          (int)want, e, msg);
    nstf_gguf_close(g);
}

static void test_hostile_folders(void) {
    expect_refused(variant("arch", "config.json", "\"model_type\": \"llama\"", "\"model_type\": \"qwen2\""),
                   NSTF_ERR_UNSUPPORTED, "model_type \"qwen2\" (LlamaForCausalLM) is not supported");
    expect_refused(variant("pre", "tokenizer.json", "\"type\": \"Digits\"", "\"type\": \"Punctuation\""),
                   NSTF_ERR_UNSUPPORTED, "pre-tokenizer {\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Punctuation\"");
    expect_refused(variant("norm", "tokenizer.json", "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}"),
                   NSTF_ERR_UNSUPPORTED, "normalizer {\"type\":\"NFKC\"} is not recognised");
    expect_refused(variant("extra", "model.safetensors.index.json", "\"model.norm.weight\"", "\"model.layers.0.self_attn.q_norm.weight\""),
                   NSTF_ERR_FORMAT, "weight_map names tensor 'model.layers.0.self_attn.q_norm.weight' in");
    expect_refused(variant("layers", "config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1"),
                   NSTF_ERR_UNSUPPORTED, "tensor 'model.layers.1.input_layernorm.weight'");
    expect_refused(variant("missing", "config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
                   NSTF_ERR_FORMAT, "tensor 'model.layers.2.input_layernorm.weight' is missing");
    expect_refused(variant("vocab", "config.json", "\"vocab_size\": 416", "\"vocab_size\": 300"),
                   NSTF_ERR_FORMAT, "has id 3");
    expect_refused(variant("shard", "model.safetensors.index.json", "model-00003-of-00003.safetensors",
                           "../hf_tiny/model-00003-of-00003.safetensors"),
                   NSTF_ERR_FORMAT, "is not the file name of a shard beside the index");
    expect_refused(variant("noconfig", "config.json", "{", "["), NSTF_ERR_FORMAT, "config.json: not valid JSON (error at line");
    expect_refused(variant("bos", "tokenizer_config.json", "\"bos_token\": \"<|im_start|>\"", "\"bos_token\": \"<s>\""),
                   NSTF_ERR_FORMAT, "bos_token \"<s>\" is not a token of the vocabulary");
    expect_refused(DATA "/hf_tokenizers", NSTF_ERR_IO, "a directory without config.json");
    /* the untouched copy opens: the refusals above come from the edits */
    nstf_gguf *g = NULL;
    CHECK(nstf_model_file_open(variant("copy", NULL, NULL, NULL), &g) == NSTF_OK, "copy: %s", nstf_last_error());
    nstf_gguf_close(g);
}

/* ---- the command line ----------------------------------------------------------------------- */

static void test_cli(void) {
    memcpy(g_dir, g_tmp, sizeof g_tmp);
    int rc = run((const char *[]){"run", "-m", FOLDER, "-p", "The history of", "-n", "6", "--temp", "0", "-t", "1", NULL});
    CHECK(rc == 0, "nstf run -m folder: exit %d: %s", rc, g_err);
    char out[400];
    snprintf(out, sizeof out, "%s/cli.gguf", g_tmp);
    rc = run((const char *[]){"convert", FOLDER, "-o", out, "--type", "bf16", NULL});
    CHECK(rc == 0 && strstr(g_err, "wrote"), "nstf convert: exit %d: %s", rc, g_err);
    rc = run((const char *[]){"run", "-m", out, "-p", "The history of", "-n", "6", "--temp", "0", "-t", "1", NULL});
    CHECK(rc == 0, "nstf run -m converted: exit %d: %s", rc, g_err);
    rc = run((const char *[]){"convert", FOLDER, "-o", out, "--type", "q4_0", NULL});
    CHECK(rc == 2 && strstr(g_err, "not one of f16, bf16, f32"), "convert --type q4_0: exit %d: %s", rc, g_err);
    snprintf(out, sizeof out, "%s/no/such/dir/x.gguf", g_tmp);
    rc = run((const char *[]){"convert", FOLDER, "-o", out, NULL});
    CHECK(rc == 1 && strstr(g_err, "cannot create"), "convert into a missing folder: exit %d: %s", rc, g_err);
    /* nothing but the finished files is left behind */
    DIR *d = opendir(g_tmp);
    for (struct dirent *e; d && (e = readdir(d));) CHECK(!strstr(e->d_name, ".tmp-"), "left behind: %s", e->d_name);
    if (d) closedir(d);
}

int main(void) {
    struct stat sb;
    if (stat(FOLDER "/config.json", &sb) != 0) {
        printf("test_hf_model: %s missing; skipped\n", FOLDER);
        return TEST_SKIP;
    }
    snprintf(g_tmp, sizeof g_tmp, "%s/test_hf_model.XXXXXX", NSTF_BUILD_DIR);
    CHECK(mkdtemp(g_tmp) != NULL, "mkdtemp");
    ref_logits r = {0};
    CHECK(read_logits(DATA "/hf_tiny_logits.bin", &r), "cannot read hf_tiny_logits.bin");
    if (g_fails) return test_finish("test_hf_model");

    char conv_auto[400], conv_f32[400], conv_f16[400];
    snprintf(conv_auto, sizeof conv_auto, "%s/auto.gguf", g_tmp);
    snprintf(conv_f32, sizeof conv_f32, "%s/f32.gguf", g_tmp);
    snprintf(conv_f16, sizeof conv_f16, "%s/f16.gguf", g_tmp);
    convert(NULL, conv_auto);
    convert("f32", conv_f32);
    convert("f16", conv_f16);

    for (int precise = 1; precise >= 0; precise--) {
        check_model(&r, FOLDER, "folder", "cpu", precise, MAX_NMSE_EXACT, 0);
        check_model(&r, conv_auto, "converted (as stored)", "cpu", precise, MAX_NMSE_EXACT, 0);
        check_model(&r, conv_f32, "converted (f32)", "cpu", precise, MAX_NMSE_EXACT, 0);
        check_model(&r, conv_f16, "converted (f16)", "cpu", precise, MAX_NMSE_F16, 0);
    }
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
    if (nstf_gpu_device_count() > 0) {
        check_model(&r, FOLDER, "folder", "gpu", false, 0, GPU_MAX_KL);
        check_model(&r, conv_auto, "converted (as stored)", "gpu", false, 0, GPU_MAX_KL);
    } else {
        printf("no GPU: the GPU checks are not run\n");
    }
#endif
    check_converted_tensors(conv_auto);
    check_converted_tensors(conv_f32);
    test_tokenizers(conv_auto);
    test_hostile_folders();
    test_cli();
    free_logits(&r);
    if (!g_fails) { /* keep the evidence of a failure */
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0) fprintf(stderr, "test_hf_model: could not remove %s\n", g_tmp);
    }
    return test_finish("test_hf_model");
}
