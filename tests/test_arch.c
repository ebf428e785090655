/* test_arch.c — the architectures of the table (model/arch.h) beyond plain
 * Llama, against HF transformers, from their HF folders and from the GGUF
 * files `nstf convert` writes of them.
 *
 * Reference: scripts/ref/make_arch_ref.py (versions in
 * tests/data/arch_ref.txt) built tests/data/arch/{llama31, qwen2, qwen3,
 * mistral}: random 2-layer models (BF16 weights, F32 norms) of
 * LlamaForCausalLM with rope_scaling "llama3" (original context 32, a
 * 351-token prompt), Qwen2ForCausalLM (Q/K/V biases, tied embeddings),
 * Qwen3ForCausalLM (per-head q/k RMSNorm, q_dim 256 on a width of 128) and
 * MistralForCausalLM (sliding window 16, a 142-token prompt), and recorded
 * transformers' fp32 logits at every position of 2-3 prompts.
 *
 * 1. Logits. Metric: NMSE over all logits of a prompt (the worst prompt)
 *    and top-1 agreement at every position. The weights are exactly
 *    transformers' (BF16 widened to fp32), so on the CPU this is fp32
 *    against fp32 with other summation orders and other RoPE angle
 *    roundings (transformers forms angles in fp32, NSTF in double):
 *    measured worst NMSE 1.3e-12 (llama31, 351 positions), others
 *    <= 9.1e-13; bound 1e-9 for all, top-1 100%. Run from the folder and
 *    the converted file, precise and fast CPU modes, and for llama31 and
 *    mistral also one token per forward (the decode path of RoPE factors
 *    and of the window) and 7 tokens per forward (prefill chunks that cut
 *    across the window). GPU builds, when a GPU is present: mean KL(ref ||
 *    GPU) <= 0.01 nats, as test_hf_model bounds the GPU.
 * 2. Each feature is load-bearing: the same run with it taken away (RoPE
 *    factors, window, biases, q/k norms dropped from the loaded model) must
 *    miss the reference by more than 1000x the bound (measured NMSE 0.15
 *    without the q/k norms to 1.55 without the biases, top-1 10-40%), so
 *    the checks of 1. would fail without it.
 * 3. The converted files: general.architecture and the keys of each family
 *    (rope_freqs.weight, llama.attention.sliding_window, Qwen's biases and
 *    norms), Qwen files in NEOX order (no permutation), Llama/Mistral files
 *    permuted (adjacent pairs).
 * 4. Tokenizers and templates: ids of 10 strings for the Qwen2 and Tekken
 *    pre-tokenizers (from the folders and the converted files) equal the
 *    tokenizers library's; the Qwen2.5, Qwen3 and Mistral v1/v3/v3-tekken/v7
 *    chat templates render as apply_chat_template does. Exact.
 * 5. An unknown architecture is refused naming it and the supported ones,
 *    from a GGUF file and from an HF folder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_ref.h"
#include "io/convert.h"
#include "io/hf_model.h"
#include "io/tokenizer.h"
#include "model/session.h"
#include "test_util.h"
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
#include "ops/gpu/gpu_api.h"
#endif

#define DATA NSTF_SOURCE_DIR "/tests/data"
#define ARCH DATA "/arch"

#define MAX_NMSE 1e-9
#define ABLATION_FACTOR 1000.0
#define GPU_MAX_KL 0.01

static char g_tmp[240];

/* ---- the features, taken away ------------------------------------------------------------ */

static void drop_factors(nstf_session *s) {
    s->model->w.rope_factors = NULL;
    s->run->w.rope_factors = NULL; /* the CPU run's copy of the weights table */
}
static void drop_window(nstf_session *s) { s->model->cfg.sliding_window = 0; }
static void drop_bias(nstf_session *s) {
    for (int l = 0; l < s->model->cfg.n_layers; l++) /* the CPU run shares the layer table */
        s->model->w.layers[l].bq = s->model->w.layers[l].bk = s->model->w.layers[l].bv = NULL;
}
static void drop_qk_norm(nstf_session *s) {
    for (int l = 0; l < s->model->cfg.n_layers; l++)
        s->model->w.layers[l].q_norm = s->model->w.layers[l].k_norm = NULL;
}

typedef struct {
    const char *name;
    const char *gguf_arch;      /* general.architecture */
    nstf_rope_mode folder_rope; /* the HF view's mode */
    nstf_rope_mode file_rope;   /* the converted file's */
    void (*ablate)(nstf_session *s);
    const char *feature;
    bool small_batches; /* also one and seven tokens per forward */
} arch_case;

static const arch_case k_cases[] = {
    {"llama31", "llama", NSTF_ROPE_NEOX, NSTF_ROPE_NORM, drop_factors, "RoPE frequency factors", true},
    {"qwen2", "qwen2", NSTF_ROPE_NEOX, NSTF_ROPE_NEOX, drop_bias, "QKV biases", false},
    {"qwen3", "qwen3", NSTF_ROPE_NEOX, NSTF_ROPE_NEOX, drop_qk_norm, "q/k norms", false},
    {"mistral", "llama", NSTF_ROPE_NEOX, NSTF_ROPE_NORM, drop_window, "sliding window", true},
};

/* ---- the converted file ---------------------------------------------------------------------- */

static bool convert(const char *folder, const char *out) {
    nstf_gguf *g = NULL;
    nstf_status st = nstf_model_file_open(folder, &g);
    const nstf_convert_params p = {.out_type = -1};
    if (st == NSTF_OK) st = nstf_convert_to_gguf(g, out, &p);
    CHECK(st == NSTF_OK, "convert %s: %s", folder, nstf_last_error());
    nstf_gguf_close(g);
    return st == NSTF_OK;
}

static void check_file(const arch_case *c, const char *path) {
    nstf_gguf *g = NULL;
    if (nstf_gguf_open(path, &g) != NSTF_OK) {
        CHECK(0, "%s: %s", path, nstf_last_error());
        return;
    }
    nstf_gguf_str a = {0, ""};
    CHECK(nstf_gguf_get_str(g, "general.architecture", &a) == NSTF_OK && nstf_gguf_str_eq(a, c->gguf_arch),
          "%s: general.architecture '%.*s', want %s", c->name, (int)a.len, a.ptr, c->gguf_arch);
    const bool factors = nstf_gguf_find_tensor(g, "rope_freqs.weight") != NULL,
               window = nstf_gguf_get_u32_or(g, "llama.attention.sliding_window", 0) == 16,
               bias = nstf_gguf_find_tensor(g, "blk.1.attn_v.bias") != NULL,
               norm = nstf_gguf_find_tensor(g, "blk.1.attn_k_norm.weight") != NULL;
    CHECK(factors == !strcmp(c->name, "llama31") && window == !strcmp(c->name, "mistral") &&
              bias == !strcmp(c->name, "qwen2") && norm == !strcmp(c->name, "qwen3"),
          "%s: rope_freqs %d, sliding window 16 %d, biases %d, q/k norms %d", c->name, factors, window, bias, norm);
    if (!strcmp(c->name, "qwen2") || !strcmp(c->name, "qwen3")) {
        nstf_gguf_str pre = {0, ""};
        CHECK(nstf_gguf_get_str(g, "tokenizer.ggml.pre", &pre) == NSTF_OK && nstf_gguf_str_eq(pre, "qwen2"),
              "%s: tokenizer.ggml.pre '%.*s'", c->name, (int)pre.len, pre.ptr);
    }
    nstf_gguf_close(g);
}

/* ---- logits ---------------------------------------------------------------------------------- */

static void test_arch(const arch_case *c) {
    char folder[300], logits[300], file[400], label[96];
    snprintf(folder, sizeof folder, "%s/%s", ARCH, c->name);
    snprintf(logits, sizeof logits, "%s/%s_logits.bin", ARCH, c->name);
    snprintf(file, sizeof file, "%s/%s.gguf", g_tmp, c->name);
    ref_logits r;
    if (!read_logits(logits, &r)) {
        CHECK(0, "cannot read %s", logits);
        free_logits(&r);
        return;
    }
    const bool converted = convert(folder, file);
    if (converted) check_file(c, file);
    for (int precise = 1; precise >= 0; precise--) {
        logit_run how = {"cpu", precise != 0, 0, (int)c->folder_rope, NULL};
        snprintf(label, sizeof label, "%s folder", c->name);
        check_logits(&r, folder, label, &how, MAX_NMSE, 0);
        how.rope_mode = (int)c->file_rope;
        snprintf(label, sizeof label, "%s converted", c->name);
        if (converted) check_logits(&r, file, label, &how, MAX_NMSE, 0);
    }
    if (c->small_batches)
        for (int nb = 1; nb <= 7; nb += 6) {
            const logit_run how = {"cpu", true, nb, (int)c->folder_rope, NULL};
            snprintf(label, sizeof label, "%s folder, %d-token forwards", c->name, nb);
            check_logits(&r, folder, label, &how, MAX_NMSE, 0);
        }
    /* the feature taken away: the checks above would fail */
    const logit_run cut = {"cpu", true, c->small_batches ? 7 : 0, -1, c->ablate};
    logit_score sc = score_logits(&r, folder, c->name, &cut);
    printf("logits %-30s cpu precise: without the %s: NMSE worst prompt %.3g, top-1 %d/%d (must exceed %.0e)\n",
           c->name, c->feature, sc.worst_nmse, sc.agree, sc.total, ABLATION_FACTOR * MAX_NMSE);
    CHECK(sc.ran && sc.worst_nmse > ABLATION_FACTOR * MAX_NMSE, "%s: without the %s the NMSE is only %.3g", c->name,
          c->feature, sc.worst_nmse);
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
    if (nstf_gpu_device_count() > 0) {
        logit_run gpu = {"gpu", false, 0, (int)c->folder_rope, NULL};
        snprintf(label, sizeof label, "%s folder", c->name);
        check_logits(&r, folder, label, &gpu, 0, GPU_MAX_KL);
        gpu.rope_mode = (int)c->file_rope;
        snprintf(label, sizeof label, "%s converted", c->name);
        if (converted) check_logits(&r, file, label, &gpu, 0, GPU_MAX_KL);
        if (c->small_batches) { /* the decode step (fused GEMV, split-KV decode) at every position */
            gpu = (logit_run){"gpu", false, 1, (int)c->folder_rope, NULL};
            snprintf(label, sizeof label, "%s folder, 1-token forwards", c->name);
            check_logits(&r, folder, label, &gpu, 0, GPU_MAX_KL);
        }
    }
#endif
    free_logits(&r);
}

/* ---- tokenizers and chat templates --------------------------------------------------------- */

static const nstf_chat_msg k_chat0[] = {{"user", "What is 2 + 2?"}, {"assistant", "4"}, {"user", " Thanks! "}};
static const nstf_chat_msg k_chat1[] = {
    {"system", "You are terse."}, {"user", "Hello"}, {"assistant", "  Hi there  "}, {"user", "Who are you?"}};

/* Every "tok VARIANT" and "chat VARIANT" record against a model's tokenizer. */
static void check_tokenizer(const char *variant, const char *model) {
    nstf_gguf *g = NULL;
    nstf_tokenizer *t = NULL;
    nstf_status st = nstf_model_file_open(model, &g);
    if (st == NSTF_OK) st = nstf_tokenizer_from_gguf(g, &t);
    CHECK(st == NSTF_OK, "%s: %s", model, nstf_last_error());
    int n_tok = 0, n_chat = 0;
    if (t) check_tok_records(DATA "/arch_ref.txt", variant, t, g, model, &n_tok, &n_chat);
    printf("tokenizer %-8s %-60s: %d strings, %d chat renderings identical to HF\n", variant, model, n_tok, n_chat);
    CHECK(n_tok == 10 && n_chat == 1, "%s: %d strings, %d chats in the reference", variant, n_tok, n_chat);
    nstf_tokenizer_free(t);
    nstf_gguf_close(g);
}

/* "tmpl NAME HEX" then "tchat NAME I HEX" records: each template renders
 * chat I as transformers does. */
static void test_templates(void) {
    FILE *f = fopen(DATA "/arch_ref.txt", "r");
    CHECK(f != NULL, "no reference");
    if (!f) return;
    static char line[65536], hex[32768], tmpl[16384], want[16384];
    char name[32] = "";
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char kind[8], nm[32];
        int idx;
        if (sscanf(line, "tmpl %31s %32767s", nm, hex) == 2) {
            snprintf(name, sizeof name, "%s", nm);
            unhex(hex, tmpl);
        } else if (sscanf(line, "%7s %31s %d %32767s", kind, nm, &idx, hex) == 4 && !strcmp(kind, "tchat")) {
            CHECK(!strcmp(nm, name) && (idx == 0 || idx == 1), "record order: %s after template %s", nm, name);
            unhex(hex, want);
            char *out = NULL;
            nstf_status st = idx ? nstf_chat_render_template(tmpl, k_chat1, 4, true, &out)
                                 : nstf_chat_render_template(tmpl, k_chat0, 3, true, &out);
            CHECK(st == NSTF_OK && !strcmp(out, want), "template %s, chat %d renders\n[%s]\nexpected\n[%s]", name, idx,
                  out ? out : nstf_last_error(), want);
            free(out);
            n++;
        }
    }
    fclose(f);
    printf("chat templates: %d renderings (Qwen2.5, Qwen3, Mistral v1, v3, v3-tekken, v7) identical to HF\n", n);
    CHECK(n == 10, "%d renderings in the reference", n);
}

/* ---- unknown architectures -------------------------------------------------------------------- */

static void test_unknown(void) {
    nstf_gguf_writer *w = NULL;
    void *img = NULL;
    uint64_t n = 0;
    nstf_gguf *g = NULL;
    nstf_status st = nstf_gguf_writer_create(&w);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_str(w, "general.architecture", "gemma2");
    if (st == NSTF_OK) st = nstf_gguf_writer_write_memory(w, 0, &img, &n);
    if (st == NSTF_OK) st = nstf_gguf_open_view(img, n, "gemma2.gguf", NULL, 0, NULL, NULL, &g);
    nstf_gguf_writer_free(w);
    CHECK(st == NSTF_OK, "%s", nstf_last_error());
    nstf_llama *m = NULL;
    st = g ? nstf_llama_load(g, &m) : NSTF_ERR_INTERNAL;
    const char *e = nstf_last_error();
    printf("unknown GGUF architecture: %s\n", e);
    CHECK(st == NSTF_ERR_UNSUPPORTED && m == NULL &&
              strstr(e, "architecture 'gemma2' is not supported (supported: llama (Llama 1-3.x, Mistral), qwen2 "
                        "(Qwen2, Qwen2.5), qwen3 (Qwen3))"),
          "status %d: %s", (int)st, e);
    nstf_gguf_close(g); /* not taken by the failed load */

    char dir[300], cfg[340];
    snprintf(dir, sizeof dir, "%s/gemma", g_tmp);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    mkdir(dir, 0755);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL, "write %s", cfg);
    if (f) {
        fputs("{\"model_type\": \"gemma2\", \"architectures\": [\"Gemma2ForCausalLM\"]}\n", f);
        fclose(f);
    }
    g = NULL;
    st = nstf_model_file_open(dir, &g);
    e = nstf_last_error();
    printf("unknown HF model_type: %s\n", e);
    CHECK(st == NSTF_ERR_UNSUPPORTED && g == NULL && strstr(e, "model_type \"gemma2\" (Gemma2ForCausalLM)") &&
              strstr(e, "supported: llama, mistral, qwen2, qwen3"),
          "status %d: %s", (int)st, e);
    nstf_gguf_close(g);
}

int main(void) {
    struct stat sb;
    if (stat(ARCH "/qwen2/config.json", &sb) != 0) {
        printf("test_arch: %s missing; skipped\n", ARCH);
        return TEST_SKIP;
    }
    snprintf(g_tmp, sizeof g_tmp, "%s/test_arch.XXXXXX", NSTF_BUILD_DIR);
    CHECK(mkdtemp(g_tmp) != NULL, "mkdtemp");
    if (g_fails) return test_finish("test_arch");
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
    if (nstf_gpu_device_count() < 1) printf("no GPU: the GPU checks are not run\n");
#endif
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) test_arch(&k_cases[i]);
    char file[400];
    check_tokenizer("qwen2", ARCH "/qwen2");
    snprintf(file, sizeof file, "%s/qwen2.gguf", g_tmp);
    check_tokenizer("qwen2", file);
    check_tokenizer("tekken", ARCH "/mistral");
    snprintf(file, sizeof file, "%s/mistral.gguf", g_tmp);
    check_tokenizer("tekken", file);
    test_templates();
    test_unknown();
    if (!g_fails) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0) fprintf(stderr, "test_arch: could not remove %s\n", g_tmp);
    }
    return test_finish("test_arch");
}
