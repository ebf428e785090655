/* test_generate.c — generation as users run it, end to end on the real
 * model, against HF transformers' greedy generations
 * (tests/data/smollm2_greedy_ref.txt, made by scripts/ref/make_logits_ref.py
 * with the versions named in its header).
 *
 * Metric: exact token equality throughout.
 *   1. Prompt: our chat render + encode of the reference's three prompts
 *      (plain text, code, and one chat user turn with the template's default
 *      system message) equal HF's recorded prompt ids.
 *   2. nstf_session_generate with the precise CPU path (fp32 activations,
 *      which agree with the fp32 reference to rounding; the e2e test checks
 *      the logits) and temp 0 gives the reference's 64 greedy tokens, with
 *      ignore_eos. Without it, it stops at the first end-of-generation token
 *      (the plain case's token 29 is <|im_end|>): the tokens before it reach
 *      the callback, the end token does not, and it counts as generated.
 *   3. The CLI (`nstf run --precise --temp 0`) prints exactly the pieces of
 *      those tokens: stopping at <|im_end|>, continuing past it with
 *      --ignore-eos, and for --chat.
 *   4. Sampled generation (temp 0.8, repeat penalty 1.3, seed 7) equals a loop
 *      written here from nstf_session_prefill and the sampler, with the
 *      prompt in the penalty window as llama.cpp does; same seed, same text.
 *   5. The CLI refuses a context whose KV cache cannot fit in host memory,
 *      with the figures.
 * Exits 77 when models/SmolLM2-135M-Instruct.Q4_1.gguf has not been fetched. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/gguf.h"
#include "io/tokenizer.h"
#include "model/session.h"
#include "test_util.h"

#include "cli_run.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define REF_TXT NSTF_SOURCE_DIR "/tests/data/smollm2_greedy_ref.txt"
#define MAX_IDS 128

/* make_logits_ref.py's PROMPTS and CHAT_USER, in its order */
static const struct { const char *name, *text; bool chat; } k_prompts[3] = {
    {"plain", "The capital of France is", false},
    {"code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", false},
    {"chat", "Explain in two sentences why the sky is blue.", true},
};

typedef struct {
    char name[32];
    int32_t prompt[MAX_IDS], greedy[MAX_IDS];
    int n_prompt, n_greedy;
} ref_case;

static int parse_ids(const char *line, const char *tag, int32_t *ids, int cap) {
    size_t lt = strlen(tag);
    if (strncmp(line, tag, lt) != 0) return -1;
    int n = 0;
    const char *p = line + lt;
    char *end;
    for (;;) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (n < cap) ids[n] = (int32_t)v;
        n++;
        p = end;
    }
    return n <= cap ? n : -1;
}

/* "case NAME", "prompt IDS", "greedy IDS" triples */
static int read_cases(ref_case *c, int cap) {
    FILE *f = fopen(REF_TXT, "r");
    if (!f) return 0;
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "case ", 5) && n < cap) {
            memset(&c[n], 0, sizeof c[n]);
            snprintf(c[n].name, sizeof c[n].name, "%.*s", (int)strcspn(line + 5, "\n"), line + 5);
            n++;
        } else if (n > 0) {
            int k = parse_ids(line, "prompt ", c[n - 1].prompt, MAX_IDS);
            if (k >= 0) c[n - 1].n_prompt = k;
            k = parse_ids(line, "greedy ", c[n - 1].greedy, MAX_IDS);
            if (k >= 0) c[n - 1].n_greedy = k;
        }
    }
    fclose(f);
    return n;
}

static int first_diff(const int32_t *a, int na, const int32_t *b, int nb) {
    for (int i = 0; i < na && i < nb; i++)
        if (a[i] != b[i]) return i;
    return na == nb ? -1 : (na < nb ? na : nb);
}

/* ---- 1. prompts ---------------------------------------------------------------- */

static void check_prompts(const nstf_gguf *g, const nstf_tokenizer *t, const ref_case *c) {
    for (int i = 0; i < 3; i++) {
        char *text = NULL;
        if (k_prompts[i].chat) {
            nstf_chat_msg m[1] = {{"user", k_prompts[i].text}};
            CHECK(nstf_chat_render(g, m, 1, true, &text) == NSTF_OK, "chat render: %s", nstf_last_error());
            if (!text) continue;
        }
        const char *in = text ? text : k_prompts[i].text;
        int32_t *ids = NULL;
        int64_t n = 0;
        /* as nstf_session_generate encodes: the model's BOS rule, special
         * tokens parsed in the rendered chat only */
        nstf_status st = nstf_tokenizer_encode(t, in, strlen(in), nstf_tokenizer_wants_bos(t), k_prompts[i].chat, &ids, &n);
        CHECK(st == NSTF_OK, "encode %s: %s", c[i].name, nstf_last_error());
        int d = first_diff(ids, (int)n, c[i].prompt, c[i].n_prompt);
        printf("prompt %-5s: %lld ids, %s\n", c[i].name, (long long)n, d < 0 ? "equal to HF's" : "DIFFERENT");
        CHECK(d < 0, "%s: prompt ids differ from HF's at %d (%lld vs %d ids)", c[i].name, d, (long long)n,
              c[i].n_prompt);
        free(ids);
        free(text);
    }
}

/* ---- 2. nstf_session_generate ----------------------------------------------------- */

typedef struct {
    int32_t tok[MAX_IDS];
    int n;
    size_t text_len;
    char text[1 << 14];
} collect;

static bool on_piece(void *user, int32_t token, const char *piece, size_t len) {
    collect *c = user;
    if (c->n < MAX_IDS) c->tok[c->n] = token;
    c->n++;
    if (c->text_len + len < sizeof c->text) {
        memcpy(c->text + c->text_len, piece, len);
        c->text_len += len;
    }
    return true;
}

static nstf_status generate(nstf_session *s, int i, const nstf_sampler_params *sp, int n_predict, bool ignore_eos,
                            collect *out, nstf_gen_stats *gs) {
    memset(out, 0, sizeof *out);
    return nstf_session_generate(s, k_prompts[i].text, k_prompts[i].chat, NULL, sp, n_predict, ignore_eos, on_piece,
                                 out, gs);
}

/* index of the first end-of-generation token in the reference, or n */
static int first_eog(const nstf_tokenizer *t, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (nstf_tokenizer_is_eog(t, ids[i])) return i;
    return n;
}

static void check_generate(nstf_session *s, const nstf_tokenizer *t, const ref_case *c) {
    nstf_sampler_params greedy = nstf_sampler_default_params();
    greedy.temp = 0;
    collect out;
    nstf_gen_stats gs;
    for (int i = 0; i < 3; i++) {
        nstf_status st = generate(s, i, &greedy, c[i].n_greedy, true, &out, &gs);
        CHECK(st == NSTF_OK, "generate %s: %s", c[i].name, nstf_last_error());
        int d = first_diff(out.tok, out.n, c[i].greedy, c[i].n_greedy);
        printf("generate %-5s (precise, greedy, ignore-eos): %d tokens, %s", c[i].name, out.n,
               d < 0 ? "equal to the reference\n" : "");
        if (d >= 0) printf("first %d equal to the reference\n", d);
        CHECK(d < 0, "%s: greedy tokens differ from the reference at %d (got %d, want %d)", c[i].name, d,
              d >= 0 && d < out.n ? out.tok[d] : -1, d >= 0 && d < c[i].n_greedy ? c[i].greedy[d] : -1);
        CHECK(gs.n_prompt == c[i].n_prompt && gs.n_gen == c[i].n_greedy && gs.n_decode == c[i].n_greedy - 1,
              "%s: stats prompt %lld gen %lld decode %lld", c[i].name, (long long)gs.n_prompt, (long long)gs.n_gen,
              (long long)gs.n_decode);
    }
    /* the stop: the plain case's continuation holds <|im_end|> */
    const int e = first_eog(t, c[0].greedy, c[0].n_greedy);
    CHECK(e < c[0].n_greedy, "the plain reference has no end-of-generation token");
    if (e >= c[0].n_greedy) return;
    nstf_status st = generate(s, 0, &greedy, c[0].n_greedy, false, &out, &gs);
    CHECK(st == NSTF_OK, "generate with the stop: %s", nstf_last_error());
    printf("generate plain (stops at eog): %d tokens to the callback, %lld generated; reference eog at %d\n", out.n,
           (long long)gs.n_gen, e);
    CHECK(out.n == e && first_diff(out.tok, out.n, c[0].greedy, e) < 0,
          "stop: %d tokens reached the callback, want the %d before the end token", out.n, e);
    CHECK(gs.n_gen == e + 1 && gs.n_decode == e, "stop: %lld generated, %lld decode steps (want %d, %d)",
          (long long)gs.n_gen, (long long)gs.n_decode, e + 1, e);
    CHECK(!memmem(out.text, out.text_len, "<|im_end|>", 10), "stop: the end token's piece was passed on");
    /* n_predict stops first */
    st = generate(s, 0, &greedy, 3, false, &out, &gs);
    CHECK(st == NSTF_OK && out.n == 3 && gs.n_gen == 3 && gs.n_decode == 2 && first_diff(out.tok, 3, c[0].greedy, 3) < 0,
          "n_predict 3: %d tokens, %lld decode steps", out.n, (long long)gs.n_decode);
}

/* ---- 4. sampled generation --------------------------------------------------------- */

/* The same chain written out: encode (the reference's ids, checked above),
 * every prompt token into the penalty window, prefill, then sample /
 * accept / stop at an end token / one-token prefill. */
static int manual_sampled(nstf_session *s, const nstf_tokenizer *t, const ref_case *c, const nstf_sampler_params *sp,
                          int n_predict, int32_t *out) {
    nstf_sampler smp;
    if (nstf_sampler_init(&smp, sp, nstf_tokenizer_n_vocab(t)) != NSTF_OK) return -1;
    for (int i = 0; i < c->n_prompt; i++) nstf_sampler_accept(&smp, c->prompt[i]);
    nstf_status st = nstf_session_prefill(s, c->prompt, c->n_prompt, 0);
    int n = 0, pos = c->n_prompt;
    while (st == NSTF_OK && n < n_predict) {
        int32_t tok = nstf_sampler_sample(&smp, s->logits);
        nstf_sampler_accept(&smp, tok);
        if (nstf_tokenizer_is_eog(t, tok)) break;
        out[n++] = tok;
        if (n < n_predict) st = nstf_session_prefill(s, &tok, 1, pos++);
    }
    nstf_sampler_free(&smp);
    return st == NSTF_OK ? n : -1;
}

static void check_sampled(const nstf_tokenizer *t, const ref_case *c) {
    /* the fast path: this compares two runs of the same forward */
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = 256;
    p.n_threads = 2;
    p.device = "cpu";
    nstf_session *s = NULL;
    if (nstf_session_open(MODEL, &p, &s) != NSTF_OK) {
        CHECK(0, "open: %s", nstf_last_error());
        return;
    }
    nstf_sampler_params sp = nstf_sampler_default_params();
    sp.repeat_penalty = 1.3f;
    sp.seed = 7;
    const int n_predict = 16;
    collect a, b;
    nstf_gen_stats gs;
    CHECK(generate(s, 2, &sp, n_predict, false, &a, &gs) == NSTF_OK, "sampled: %s", nstf_last_error());
    CHECK(generate(s, 2, &sp, n_predict, false, &b, &gs) == NSTF_OK, "sampled: %s", nstf_last_error());
    CHECK(a.n == b.n && first_diff(a.tok, a.n, b.tok, b.n) < 0, "seed 7 twice: different tokens");
    int32_t want[MAX_IDS];
    int n = manual_sampled(s, t, &c[2], &sp, n_predict, want);
    int d = first_diff(a.tok, a.n, want, n);
    printf("sampled chat (fast, T 0.8, penalty 1.3, seed 7): %d tokens, %s\n", a.n,
           d < 0 ? "equal to the written-out chain" : "DIFFERENT");
    CHECK(n > 0 && d < 0, "sampled generation differs from the written-out chain at %d (%d vs %d tokens)", d, a.n, n);
    nstf_session_close(s);
}

/* ---- 3. and 5. the CLI --------------------------------------------------------------- */

/* The pieces of ids[0..n) and the newline `nstf run` ends with. */
static void pieces(const nstf_tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap) {
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = nstf_tokenizer_piece(t, ids[i], buf + k, cap - k - 2);
        if (len > 0 && (size_t)len < cap - k - 2) k += (size_t)len;
    }
    buf[k++] = '\n';
    buf[k] = 0;
}

static void check_cli_text(const char *what, const char *const *args, const char *want) {
    int rc = run(args);
    CHECK(rc == 0, "%s: exit %d: %s", what, rc, g_err);
    bool eq = strcmp(g_out, want) == 0;
    printf("cli %-36s: %s\n", what, eq ? "equal to the reference's text" : "DIFFERENT");
    CHECK(eq, "%s: stdout\n[%s]\nwant\n[%s]", what, g_out, want);
}

static void check_cli(const nstf_tokenizer *t, const ref_case *c) {
    static char want[1 << 14];
    const int e = first_eog(t, c[0].greedy, c[0].n_greedy);
    pieces(t, c[0].greedy, e, want, sizeof want);
    check_cli_text("plain, stops at <|im_end|>", (const char *const[]){"run", "-m", MODEL, "-p", k_prompts[0].text,
                   "-n", "64", "--temp", "0", "--precise", "--device", "cpu", "-t", "2", NULL}, want);
    pieces(t, c[0].greedy, e + 3, want, sizeof want);
    CHECK(strstr(want, "<|im_end|>") != NULL, "the end token has no text piece");
    check_cli_text("plain, --ignore-eos", (const char *const[]){"run", "-m", MODEL, "-p", k_prompts[0].text, "-n",
                   "32", "--ignore-eos", "--temp", "0", "--precise", "--device", "cpu", "-t", "2", NULL}, want);
    pieces(t, c[2].greedy, 16, want, sizeof want);
    check_cli_text("--chat", (const char *const[]){"run", "-m", MODEL, "--chat", "-p", k_prompts[2].text, "-n", "16",
                   "--temp", "0", "--precise", "--device", "cpu", "-t", "2", NULL}, want);
    /* a context whose KV cache cannot fit in host memory fails early, with figures */
    expect_error("KV cache larger than memory", "MiB of host memory is available",
                 (const char *const[]){"run", "-m", MODEL, "-p", "x", "-c", "16000000", "--device", "cpu", NULL});
}

int main(void) {
    if (access(MODEL, R_OK) != 0) {
        printf("test_generate: %s not fetched (make model); skipped\n", MODEL);
        return TEST_SKIP;
    }
    ref_case c[4];
    int n = read_cases(c, 4);
    CHECK(n == 3, "%s: %d cases, want 3", REF_TXT, n);
    for (int i = 0; i < n && i < 3; i++)
        CHECK(!strcmp(c[i].name, k_prompts[i].name) && c[i].n_prompt > 0 && c[i].n_greedy == 64,
              "case %d: %s, %d prompt ids, %d greedy ids", i, c[i].name, c[i].n_prompt, c[i].n_greedy);
    if (g_fails) return test_finish("test_generate");

    nstf_gguf *g = NULL;
    nstf_tokenizer *t = NULL;
    nstf_status st = nstf_gguf_open(MODEL, &g);
    if (st == NSTF_OK) st = nstf_tokenizer_from_gguf(g, &t);
    CHECK(st == NSTF_OK, "tokenizer: %s", nstf_last_error());
    nstf_session *s = NULL;
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = 256;
    p.n_threads = 2;
    p.device = "cpu";
    p.precise = true;
    if (st == NSTF_OK) st = nstf_session_open(MODEL, &p, &s);
    CHECK(st == NSTF_OK, "open: %s", nstf_last_error());
    if (st == NSTF_OK) {
        check_prompts(g, t, c);
        check_generate(s, t, c);
        check_sampled(t, c);
        snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_generate_XXXXXX");
        if (mkdtemp(g_dir)) {
            check_cli(t, c);
            char path[300];
            snprintf(path, sizeof path, "%s/stdout", g_dir);
            unlink(path);
            snprintf(path, sizeof path, "%s/stderr", g_dir);
            unlink(path);
            rmdir(g_dir);
        } else {
            CHECK(0, "mkdtemp failed");
        }
    }
    nstf_session_close(s);
    nstf_tokenizer_free(t);
    nstf_gguf_close(g);
    return test_finish("test_generate");
}
