/* test_conv.c — the session's token history: context shifts and
 * conversations (nstf_session_complete, nstf_conv_*), on a tiny random
 * model written by `nstf gen-model`.
 *
 *  1. Context shift, exactly: greedy generation past a full context of 32
 *     with --keep 3 gives the same tokens as a brute force written here,
 *     which applies llama.cpp's rule to a token list (keep the first 3, drop
 *     half of the rest) and takes each next token from a fresh evaluation of
 *     the whole list at positions 0... The CPU runs precise and
 *     deterministic, where a row's result does not depend on the batch it
 *     is evaluated in, so the RoPE positions of the kept tokens are right
 *     exactly when the tokens are equal.
 *  2. Stops: -n -2 stops at a full context even with context shift; a stop
 *     string ends generation with the text ending in it; an interrupt flag
 *     set before the call stops before any token.
 *  3. Conversations: a second turn evaluates only the tokens after the
 *     history (the previous answer's end, the new message, the assistant
 *     header) and the history grows by exactly what was evaluated;
 *     clear, set_system, save and load keep the counts consistent; a
 *     malformed saved file is refused with a message naming it; invalid
 *     UTF-8 in a message names the offset in the message. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/session.h"
#include "test_util.h"

#include "cli_run.h"

#define N_CTX 32
#define N_KEEP 3
#define N_GEN 70

typedef struct {
    int32_t ids[4096];
    int n;
} tok_list;

static bool collect(void *user, int32_t token, const char *piece, size_t len) {
    (void)piece, (void)len;
    tok_list *l = user;
    if (l->n < 4096) l->ids[l->n++] = token;
    return true;
}

static nstf_session *open_tiny(const char *path) {
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.device = "cpu";
    p.precise = true;
    p.deterministic = true;
    nstf_session *s = NULL;
    CHECK(nstf_session_open(path, &p, &s) == NSTF_OK, "open: %s", nstf_last_error());
    return s;
}

static void context_shift(const char *path) {
    nstf_session *s = open_tiny(path), *ref = open_tiny(path);
    if (!s || !ref) return;
    nstf_sampler_params sp = nstf_sampler_default_params();
    sp.temp = 0;
    nstf_gen_params gp = nstf_gen_default_params();
    gp.n_predict = N_GEN;
    gp.ignore_eos = true;
    gp.context_shift = true;
    gp.n_keep = N_KEEP;
    tok_list got = {0};
    nstf_gen_stats st;
    CHECK(nstf_session_complete(s, "hello world", false, NULL, false, &sp, &gp, collect, &got, &st) == NSTF_OK, "%s",
          nstf_last_error());
    CHECK(got.n == N_GEN && st.n_shifts >= 2 && st.stop == NSTF_STOP_N_PREDICT, "%d tokens, %lld shifts, stop %d", got.n,
          (long long)st.n_shifts, (int)st.stop);

    /* the brute force */
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    CHECK(nstf_session_prompt_tokens(ref, "hello world", false, NULL, false, &prompt, &n_prompt) == NSTF_OK, "%s",
          nstf_last_error());
    static tok_list l;
    l.n = (int)n_prompt;
    memcpy(l.ids, prompt, (size_t)n_prompt * sizeof(int32_t));
    free(prompt);
    const int nv = nstf_session_n_vocab(ref);
    float *logits = malloc((size_t)N_CTX * (size_t)nv * sizeof(float));
    int same = 0, shifts = 0;
    for (int i = 0; i < N_GEN && logits; i++) {
        CHECK(nstf_session_eval_all(ref, l.ids, l.n, logits) == NSTF_OK, "%s", nstf_last_error());
        const int32_t next = (int32_t)argmax_f(logits + (size_t)(l.n - 1) * nv, nv);
        same += i < got.n && got.ids[i] == next;
        if (l.n == N_CTX) { /* full: keep N_KEEP, drop half of the rest */
            const int n_discard = (l.n - N_KEEP) / 2;
            memmove(l.ids + N_KEEP, l.ids + N_KEEP + n_discard, (size_t)(l.n - N_KEEP - n_discard) * sizeof(int32_t));
            l.n -= n_discard;
            shifts++;
        }
        l.ids[l.n++] = next;
    }
    free(logits);
    printf("context shift: %d of %d greedy tokens equal the brute force's (%d shifts each)\n", same, N_GEN, shifts);
    CHECK(same == N_GEN, "%d of %d tokens equal", same, N_GEN);
    CHECK(shifts == st.n_shifts, "%d shifts in the brute force, %lld in the session", shifts, (long long)st.n_shifts);
    nstf_session_close(s);
    nstf_session_close(ref);
}

static bool count_only(void *user, int32_t token, const char *piece, size_t len) {
    (void)token, (void)piece;
    *(size_t *)user += len;
    return true;
}

static void stops(const char *path) {
    nstf_session *s = open_tiny(path);
    if (!s) return;
    nstf_sampler_params sp = nstf_sampler_default_params();
    sp.temp = 0;
    nstf_gen_params gp = nstf_gen_default_params();
    gp.ignore_eos = true;
    gp.context_shift = true;
    gp.n_predict = -2;
    nstf_gen_stats st;
    size_t bytes = 0;
    CHECK(nstf_session_complete(s, "hello", false, NULL, false, &sp, &gp, count_only, &bytes, &st) == NSTF_OK, "%s",
          nstf_last_error());
    CHECK(st.stop == NSTF_STOP_CONTEXT_FULL && st.n_past == N_CTX && st.n_shifts == 0,
          "-n -2: stop %d at %lld tokens, %lld shifts", (int)st.stop, (long long)st.n_past, (long long)st.n_shifts);
    /* a stop string: the text of a first run's tokens 3..4 */
    tok_list first = {0};
    gp.n_predict = 8;
    gp.context_shift = false;
    CHECK(nstf_session_complete(s, "hello", false, NULL, false, &sp, &gp, collect, &first, &st) == NSTF_OK, "%s",
          nstf_last_error());
    char stop[64] = "";
    size_t k = 0;
    for (int i = 3; i < 5 && i < first.n; i++) {
        int64_t n = nstf_session_token_piece(s, first.ids[i], stop + k, sizeof stop - 1 - k);
        if (n > 0) k += (size_t)n;
    }
    stop[k] = 0;
    const char *stops_[1] = {stop};
    gp.stop = stops_;
    gp.n_stop = 1;
    tok_list second = {0};
    if (k) {
        CHECK(nstf_session_complete(s, "hello", false, NULL, false, &sp, &gp, collect, &second, &st) == NSTF_OK, "%s",
              nstf_last_error());
        CHECK(st.stop == NSTF_STOP_STRING && second.n <= 5, "stop string: stop %d after %d tokens", (int)st.stop,
              second.n);
    }
    /* an interrupt set before the call: nothing generated */
    volatile int flag = 1;
    gp.n_stop = 0;
    gp.interrupt = &flag;
    bytes = 0;
    CHECK(nstf_session_complete(s, "hello", false, NULL, false, &sp, &gp, count_only, &bytes, &st) == NSTF_OK, "%s",
          nstf_last_error());
    CHECK(st.stop == NSTF_STOP_INTERRUPTED && st.n_gen == 0 && bytes == 0, "interrupt: stop %d, %lld tokens",
          (int)st.stop, (long long)st.n_gen);
    nstf_session_close(s);
}

static void conversation(const char *path) {
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = 512;
    p.n_threads = 2;
    p.device = "cpu";
    nstf_session *s = NULL;
    CHECK(nstf_session_open(path, &p, &s) == NSTF_OK, "open: %s", nstf_last_error());
    if (!s) return;
    nstf_sampler_params sp = nstf_sampler_default_params();
    sp.temp = 0;
    nstf_gen_params gp = nstf_gen_default_params();
    gp.n_predict = 6;
    gp.ignore_eos = true;
    nstf_conv *c = NULL;
    CHECK(nstf_conv_open(s, "be brief", &sp, &c) == NSTF_OK, "%s", nstf_last_error());
    if (!c) return;
    size_t bytes = 0;
    nstf_gen_stats a, b;
    CHECK(nstf_conv_turn(c, "hello", &gp, count_only, &bytes, &a) == NSTF_OK, "%s", nstf_last_error());
    const int past1 = nstf_conv_n_past(c);
    CHECK(past1 == a.n_prompt + a.n_decode && a.n_gen == 6, "turn 1: %d in the cache, %lld + %lld evaluated", past1,
          (long long)a.n_prompt, (long long)a.n_decode);
    CHECK(nstf_conv_turn(c, "again", &gp, count_only, &bytes, &b) == NSTF_OK, "%s", nstf_last_error());
    /* the delta: the last answer token (sampled, not evaluated), <|im_end|>,
     * "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n" (byte
     * tokens here, the special tokens one each) */
    CHECK(nstf_conv_n_past(c) == past1 + b.n_prompt + b.n_decode, "turn 2: the cache holds %d, want %d + %lld + %lld",
          nstf_conv_n_past(c), past1, (long long)b.n_prompt, (long long)b.n_decode);
    CHECK(b.n_prompt < a.n_prompt, "turn 2 evaluated %lld tokens, turn 1 %lld: the history was evaluated again",
          (long long)b.n_prompt, (long long)a.n_prompt);
    CHECK(nstf_conv_n_messages(c) == 4, "%d messages", nstf_conv_n_messages(c));
    printf("conversation: turn 1 evaluated %lld prompt tokens, turn 2 %lld\n", (long long)a.n_prompt,
           (long long)b.n_prompt);

    /* save, clear, load: the messages come back; the next turn reuses the
     * cache's common prefix and evaluates the rest */
    char saved[300], bad[300];
    snprintf(saved, sizeof saved, "%s/conv.json", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.json", g_dir);
    CHECK(nstf_conv_save(c, saved) == NSTF_OK, "%s", nstf_last_error());
    nstf_conv_clear(c);
    CHECK(nstf_conv_n_messages(c) == 0, "clear left %d messages", nstf_conv_n_messages(c));
    CHECK(nstf_conv_load(c, saved) == NSTF_OK && nstf_conv_n_messages(c) == 4, "load: %s", nstf_last_error());
    nstf_gen_stats d;
    const int past2 = nstf_conv_n_past(c);
    CHECK(nstf_conv_turn(c, "third", &gp, count_only, &bytes, &d) == NSTF_OK, "%s", nstf_last_error());
    CHECK(d.n_prompt > 0 && nstf_conv_n_past(c) <= past2 + d.n_prompt + d.n_decode + 8,
          "after load: %lld evaluated, %d in the cache (%d before)", (long long)d.n_prompt, nstf_conv_n_past(c), past2);
    CHECK(nstf_conv_set_system(c, NULL) == NSTF_OK && nstf_conv_n_messages(c) == 0, "set_system");
    FILE *f = fopen(bad, "wb");
    if (f) {
        fputs("{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", f);
        fclose(f);
    }
    CHECK(nstf_conv_load(c, bad) == NSTF_ERR_FORMAT && strstr(nstf_last_error(), "bad.json: message 0"),
          "a bad role: %s", nstf_last_error());
    CHECK(nstf_conv_load(c, "/nonexistent/conv.json") == NSTF_ERR_IO, "a missing file");
    CHECK(nstf_conv_turn(c, "ok \xc3 bad", &gp, count_only, &bytes, &d) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "the message is not valid UTF-8: byte 0xC3 at offset 3"),
          "UTF-8: %s", nstf_last_error());
    CHECK(nstf_conv_n_messages(c) == 0, "a refused turn left %d messages", nstf_conv_n_messages(c));
    unlink(saved);
    unlink(bad);
    nstf_conv_close(c);
    nstf_session_close(s);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_conv_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char tiny[300];
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", g_dir);
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "q8_0", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model: %s", g_err);
    if (rc == 0) {
        context_shift(tiny);
        stops(tiny);
        conversation(tiny);
    }
    unlink(tiny);
    char p[300];
    snprintf(p, sizeof p, "%s/stdout", g_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/stderr", g_dir);
    unlink(p);
    rmdir(g_dir);
    return test_finish("test_conv");
}
