/* test_serve_engine.c — the serving engine (serve/engine.c) on the real
 * SmolLM2 model, without HTTP:
 *  - 6 different prompts submitted at once to 4 sequence slots (so some
 *    wait, prefill in chunks of a 48-token step mixed with the decode of
 *    others): every greedy answer equals the text nstf_session_generate
 *    (what `nstf run --temp 0` prints) gives for that prompt alone;
 *  - the same through a pool too small for all of them (preemptions
 *    happen; answers still equal);
 *  - a prompt sharing a long prefix with a finished one takes its blocks
 *    from the prefix cache, and answers the same;
 *  - stop strings cut the text before the first one and say "stop";
 *    max_tokens says "length"; logprobs of a greedy token are the top
 *    alternative's;
 *  - a cancelled request frees its blocks and slot; a full queue refuses;
 *    a request past its time limit ends with a timeout; a prompt longer
 *    than the context is refused.
 * Skips (77) when the model has not been fetched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nstf.h"
#include "serve/engine.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define N_PROMPTS 6
#define N_GEN 16

static const char *const k_prompts[N_PROMPTS] = {
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a CPU cache is in one sentence, for a child who has never seen a computer before today.",
    "Say hello.",
    "Why is the sky blue?",
};

typedef struct answer {
    char text[4096];
    const char *finish;
    nstf_engine_code error;
    int64_t n_gen, n_cached;
    int n_toks;
    nstf_gen_token first;
} answer;

static bool collect(void *user, int32_t tok, const char *piece, size_t len) {
    (void)tok;
    char *t = user;
    size_t n = strlen(t);
    if (n + len < 4096) memcpy(t + n, piece, len), t[n + len] = 0;
    return true;
}

/* Read a request to its end. */
static void drain(nstf_engine_req *r, answer *a) {
    memset(a, 0, sizeof *a);
    for (;;) {
        nstf_gen_chunk c;
        if (!nstf_engine_req_read(r, 60000, &c)) {
            CHECK(0, "a request gave nothing for 60 s");
            break;
        }
        size_t n = strlen(a->text);
        if (n + (size_t)c.n_text < sizeof a->text) memcpy(a->text + n, c.text, (size_t)c.n_text + 1);
        if (c.n_toks && a->n_toks == 0) a->first = c.toks[0];
        a->n_toks += c.n_toks;
        const bool done = c.done;
        if (done) a->finish = c.finish, a->error = c.error, a->n_gen = c.n_gen, a->n_cached = c.n_cached;
        nstf_gen_chunk_free(&c);
        if (done) break;
    }
    nstf_engine_req_release(r);
}

static nstf_engine_req *submit(nstf_engine *e, const char *prompt, const nstf_serve_gen_params *gp) {
    int32_t *ids = NULL;
    int64_t n = 0;
    const nstf_chat_msg m = {"user", prompt};
    CHECK(nstf_engine_tokenize(e, NULL, true, &m, 1, &ids, &n) == NSTF_OK, "%s", nstf_last_error());
    nstf_engine_req *r = NULL;
    nstf_engine_code c = nstf_engine_submit(e, gp, ids, n, &r);
    CHECK(c == NSTF_ENGINE_OK, "submit: code %d", (int)c);
    free(ids);
    return r;
}

static nstf_serve_gen_params greedy(int max_tokens) {
    return (nstf_serve_gen_params){.temperature = 0, .top_p = 1, .max_tokens = max_tokens, .logprobs = -1};
}

static nstf_engine *open_engine(int n_seq, int n_ctx, int n_batch, int max_queue) {
    nstf_engine_params p = nstf_engine_default_params();
    p.model = MODEL;
    p.n_seq = n_seq;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.max_queue = max_queue;
    p.n_threads = 2;
    p.device = "cpu";
    nstf_engine *e = NULL;
    CHECK(nstf_engine_create(&p, &e) == NSTF_OK, "engine: %s", nstf_last_error());
    return e;
}

/* All prompts at once; every answer against the reference. */
static void batch_equals_alone(nstf_engine *e, char ref[N_PROMPTS][4096], const char *what) {
    nstf_engine_req *r[N_PROMPTS];
    const nstf_serve_gen_params gp = greedy(N_GEN);
    for (int i = 0; i < N_PROMPTS; i++) r[i] = submit(e, k_prompts[i], &gp);
    int same = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        answer a;
        if (!r[i]) continue;
        drain(r[i], &a);
        same += !strcmp(a.text, ref[i]) && a.error == NSTF_ENGINE_OK;
        CHECK(!strcmp(a.text, ref[i]), "%s: prompt %d: '%s' vs alone '%s'", what, i, a.text, ref[i]);
    }
    nstf_engine_stats st;
    nstf_engine_stats_get(e, &st);
    printf("%s: %d of %d answers equal the prompts alone; %lld steps, %lld tokens, %lld preemptions\n", what, same,
           N_PROMPTS, (long long)st.steps, (long long)st.step_tokens, (long long)st.preempted);
    CHECK(st.running == 0 && st.waiting == 0 && st.kv_used == 0, "%s: left running %d, waiting %d, blocks %d", what,
          st.running, st.waiting, st.kv_used);
}

int main(void) {
    FILE *mf = fopen(MODEL, "rb");
    if (!mf) {
        printf("test_serve_engine: model not fetched (make model); skipped\n");
        return 77;
    }
    fclose(mf);
    /* the references: each prompt alone through the session */
    static char ref[N_PROMPTS][4096];
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.n_threads = 2;
    sp.n_ctx = 512;
    nstf_session *s = NULL;
    CHECK(nstf_session_open(MODEL, &sp, &s) == NSTF_OK, "%s", nstf_last_error());
    if (!s) return test_finish("test_serve_engine");
    nstf_sampler_params g = nstf_sampler_default_params();
    g.temp = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        CHECK(nstf_session_generate(s, k_prompts[i], true, NULL, &g, N_GEN, false, collect, ref[i], NULL) == NSTF_OK,
              "%s", nstf_last_error());
    nstf_session_close(s);

    /* 4 slots, a 48-token step, a roomy pool */
    nstf_engine *e = open_engine(4, 1024, 48, 16);
    if (!e) return test_finish("test_serve_engine");
    batch_equals_alone(e, ref, "4 slots");

    /* stop strings, max_tokens, logprobs */
    {
        char want[4096];
        snprintf(want, sizeof want, "%s", ref[0]);
        char stop[8] = {0};
        size_t L = strlen(want);
        CHECK(L >= 8, "the reference answer is too short to cut: '%s'", want);
        const size_t at = L / 2;
        memcpy(stop, want + at, L - at < 3 ? L - at : 3);
        want[strstr(want, stop) - want] = 0;
        nstf_serve_gen_params gp = greedy(N_GEN);
        gp.stop[0] = "no such text anywhere";
        gp.stop[1] = stop;
        gp.n_stop = 2;
        answer a;
        drain(submit(e, k_prompts[0], &gp), &a);
        CHECK(!strcmp(a.text, want) && a.finish && !strcmp(a.finish, "stop"),
              "stop '%s': '%s' (%s), want '%s'", stop, a.text, a.finish ? a.finish : "?", want);
        gp = greedy(3);
        gp.logprobs = 2;
        drain(submit(e, k_prompts[1], &gp), &a);
        CHECK(a.n_gen == 3 && a.finish && !strcmp(a.finish, "length") && a.n_toks == 3, "max_tokens 3: %lld tokens, %s",
              (long long)a.n_gen, a.finish ? a.finish : "?");
        CHECK(a.first.n_top == 2 && a.first.top_id[0] == a.first.id && a.first.top_logprob[0] == a.first.logprob &&
                  a.first.logprob <= 0 && a.first.top_logprob[1] <= a.first.logprob,
              "logprobs of a greedy token: id %d lp %g, top %d (%g), %d (%g)", a.first.id, (double)a.first.logprob,
              a.first.top_id[0], (double)a.first.top_logprob[0], a.first.top_id[1], (double)a.first.top_logprob[1]);
    }

    /* prefix sharing: the chat template's system prompt and more */
    {
        nstf_engine_stats st0, st1;
        nstf_engine_stats_get(e, &st0);
        answer a;
        const nstf_serve_gen_params gp = greedy(N_GEN);
        drain(submit(e, k_prompts[3], &gp), &a);
        nstf_engine_stats_get(e, &st1);
        CHECK(a.n_cached > 0 && st1.prompt_cached - st0.prompt_cached == a.n_cached,
              "no prefix shared by a prompt run before (%lld cached)", (long long)a.n_cached);
        CHECK(!strcmp(a.text, ref[3]), "from the prefix cache: '%s' vs '%s'", a.text, ref[3]);
        printf("prefix cache: %lld prompt positions taken from cached blocks\n", (long long)a.n_cached);
    }

    /* cancel: blocks and slot come back */
    {
        nstf_serve_gen_params gp = greedy(400);
        nstf_engine_req *r = submit(e, k_prompts[3], &gp);
        nstf_gen_chunk c;
        CHECK(r && nstf_engine_req_read(r, 60000, &c), "no output before the cancel");
        nstf_gen_chunk_free(&c);
        nstf_engine_req_cancel(r);
        nstf_engine_req_release(r);
        nstf_engine_stats st;
        for (int i = 0; i < 200; i++) {
            nstf_engine_stats_get(e, &st);
            if (st.running == 0 && st.kv_used == 0) break;
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        CHECK(st.running == 0 && st.kv_used == 0 && st.cancelled == 1, "after a cancel: running %d, blocks %d, cancelled %lld",
              st.running, st.kv_used, (long long)st.cancelled);
    }

    /* limits: too long, timeout */
    {
        int32_t *ids = calloc(2000, sizeof *ids);
        nstf_engine_req *r = NULL;
        nstf_serve_gen_params gp = greedy(1);
        CHECK(nstf_engine_submit(e, &gp, ids, 2000, &r) == NSTF_ENGINE_TOO_LONG && !r, "a 2000-token prompt accepted");
        gp = greedy(1000);
        CHECK(nstf_engine_submit(e, &gp, ids, 100, &r) == NSTF_ENGINE_TOO_LONG && !r,
              "100 + 1000 tokens accepted in a context of %lld", (long long)nstf_engine_n_ctx(e));
        free(ids);
        /* 400 tokens past any end-of-generation token cannot fit in 2 ms on
         * any machine (the limit counts from the submission), while the
         * model's own end could come early: the check must not depend on
         * how fast the machine is */
        gp = greedy(400);
        gp.ignore_eos = true;
        gp.timeout_s = 0.002;
        answer a;
        drain(submit(e, k_prompts[3], &gp), &a);
        CHECK(a.error == NSTF_ENGINE_TIMEOUT, "a 2 ms limit on 400 tokens: error %d, %lld tokens", (int)a.error,
              (long long)a.n_gen);
    }
    nstf_engine_free(e);

    /* a pool of 8 blocks of 16 positions for 4 sequences of ~50 each (3-4
     * blocks each): any 3 of them running together outgrow it, whatever
     * the order the engine admits them in, so preemptions; a queue of 2
     * beyond the slots */
    e = open_engine(4, 8 * 16, 48, 2);
    if (!e) return test_finish("test_serve_engine");
    batch_equals_alone(e, ref, "small pool");
    nstf_engine_stats st;
    nstf_engine_stats_get(e, &st);
    CHECK(st.preempted > 0, "a pool of 8 blocks for 6 requests of 3-4 blocks preempted nothing");
    CHECK(st.rejected_full == 0, "the queue refused");
    {
        const nstf_serve_gen_params gp = greedy(8);
        nstf_engine_req *r[7] = {0};
        int full = 0;
        int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        for (int i = 0; i < 7; i++) full += nstf_engine_submit(e, &gp, ids, 8, &r[i]) == NSTF_ENGINE_FULL;
        CHECK(full == 1, "4 slots and a queue of 2: %d of 7 refused, want 1", full);
        answer a;
        for (int i = 0; i < 7; i++)
            if (r[i]) drain(r[i], &a);
    }
    CHECK(nstf_engine_drain(e, 10), "drain");
    nstf_engine_req *late = NULL;
    const nstf_serve_gen_params gp = greedy(1);
    int32_t one = 1;
    CHECK(nstf_engine_submit(e, &gp, &one, 1, &late) == NSTF_ENGINE_DRAINING && !late, "accepted while draining");
    nstf_engine_free(e);
    return test_finish("test_serve_engine");
}
