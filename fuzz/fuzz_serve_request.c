/* fuzz_serve_request.c — libFuzzer target for the server's request JSON
 * handler (src/serve/api.c): byte 0 picks the endpoint (bit 0: chat or
 * completions), the rest is the body, in an exactly-sized heap copy.
 *
 * Refused: the error is a 4xx (a 500 only for memory), with a message,
 * and its JSON body parses strictly with error.message a string.
 * Accepted: every promise of nstf_api_req holds, checked independently
 * (messages and their roles, contents valid UTF-8, prompt text or ids
 * below the vocabulary, each number in its range, 1..4 non-empty stop
 * strings); chat messages render through a ChatML template; and the
 * answer, a stream chunk and the usage chunk built from the request's
 * own text, with token pieces cut from the raw input (invalid UTF-8, NUL
 * bytes and all), are strict JSON with the fields OpenAI's clients read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "io/json.h"
#include "io/tokenizer.h"
#include "io/utf8.h"
#include "serve/api.h"

#define N_VOCAB 1000

static const uint8_t *g_raw;
static size_t g_raw_n;

/* token pieces: slices of the raw input */
static int64_t piece(void *user, int32_t id, char *buf, size_t cap) {
    (void)user;
    if (id < 0 || id >= N_VOCAB) return -1;
    size_t at = g_raw_n ? (size_t)id % g_raw_n : 0, n = g_raw_n ? (size_t)id % 7 : 0;
    if (at + n > g_raw_n) n = g_raw_n - at;
    memcpy(buf, g_raw + at, n < cap ? n : cap);
    return (int64_t)n;
}

static bool valid_text(const char *s) { return nstf_utf8_check((const uint8_t *)s, strlen(s), NULL) < 0; }

/* The output must be strict JSON; returns it parsed (caller deletes). */
static cJSON *strict(const char *s, const char *what) {
    if (!s) FUZZ_FAIL("%s: not built", what);
    cJSON *j = NULL;
    if (nstf_json_parse(s, strlen(s), what, &j) != NSTF_OK) FUZZ_FAIL("%s: not strict JSON: %s", what, s);
    return j;
}

static void check_answer(const nstf_api_req *r) {
    const char *text = r->kind == NSTF_API_CHAT ? r->msgs[0].content : r->prompt ? r->prompt : "";
    nstf_gen_token toks[3] = {0};
    int n_toks = 0;
    for (int i = 0; i < 3; i++) {
        nstf_gen_token *t = &toks[n_toks++];
        t->id = (int32_t)((i * 397 + (int)strlen(text)) % N_VOCAB);
        t->text_at = i;
        t->n_bytes = 1;
        t->logprob = -0.5f * (float)i;
        t->n_top = r->logprobs > 0 ? r->logprobs : 0;
        for (int j = 0; j < t->n_top; j++) t->top_id[j] = (t->id + j * 31) % N_VOCAB, t->top_logprob[j] = -(float)j;
    }
    nstf_api_out o = {.kind = r->kind, .id = "id-1", .created = 1, .model = r->model ? r->model : "m",
                      .text = text, .n_text = (int64_t)strlen(text), .toks = toks, .n_toks = n_toks,
                      .logprobs = r->logprobs, .finish = "stop", .role = true, .usage = r->include_usage,
                      .n_prompt = 5, .n_gen = 3, .piece = piece};
    char *s = nstf_api_response_json(&o);
    cJSON *j = strict(s, "response");
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, r->kind == NSTF_API_CHAT ? "message" : "text");
    if (!ch || !msg || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "usage")))
        FUZZ_FAIL("response without choices[0].%s or usage: %s", r->kind == NSTF_API_CHAT ? "message" : "text", s);
    if ((r->logprobs >= 0) != cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(ch, "logprobs")))
        FUZZ_FAIL("logprobs %d but the answer's logprobs field is %s", r->logprobs, s);
    cJSON_Delete(j);
    free(s);
    o.finish = NULL;
    s = nstf_api_chunk_json(&o);
    cJSON_Delete(strict(s, "chunk"));
    free(s);
    s = nstf_api_usage_chunk_json(&o);
    cJSON_Delete(strict(s, "usage chunk"));
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const nstf_api_kind kind = (data[0] & 1) ? NSTF_API_COMPLETION : NSTF_API_CHAT;
    char *body = malloc(size - 1 ? size - 1 : 1);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    g_raw = data;
    g_raw_n = size;
    nstf_api_req r;
    nstf_api_error e;
    if (!nstf_api_parse(kind, body, size - 1, N_VOCAB, &r, &e)) {
        if (!((e.status >= 400 && e.status < 500) || e.status == 500) || !e.message[0] || !e.type)
            FUZZ_FAIL("a refusal with status %d, type %s, message '%s'", e.status, e.type ? e.type : "NULL", e.message);
        char *s = nstf_api_error_json(&e);
        cJSON *j = strict(s, "error");
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message")))
            FUZZ_FAIL("error without error.message: %s", s);
        cJSON_Delete(j);
        free(s);
        free(body);
        return 0;
    }
    if (r.kind != kind) FUZZ_FAIL("kind %d for endpoint %d", r.kind, kind);
    if (kind == NSTF_API_CHAT) {
        if (r.n_msgs < 1 || r.n_msgs > NSTF_API_MAX_MSGS || !r.msgs) FUZZ_FAIL("%d messages", r.n_msgs);
        for (int i = 0; i < r.n_msgs; i++) {
            const char *role = r.msgs[i].role;
            if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
                FUZZ_FAIL("message %d: role %s", i, role ? role : "NULL");
            if (!r.msgs[i].content || !valid_text(r.msgs[i].content)) FUZZ_FAIL("message %d: content not UTF-8", i);
        }
        char *out = NULL;
        static const char tmpl[] = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                                   "{% endfor %}";
        if (nstf_chat_render_template(tmpl, r.msgs, r.n_msgs, true, &out) == NSTF_OK) {
            if (!out || !strstr(out, r.msgs[r.n_msgs - 1].content)) FUZZ_FAIL("the rendered chat lacks the last message");
            free(out);
        }
    } else {
        if (!r.prompt == !r.prompt_ids) FUZZ_FAIL("prompt text %p and ids %p", (void *)r.prompt, (void *)r.prompt_ids);
        if (r.prompt && !valid_text(r.prompt)) FUZZ_FAIL("prompt not UTF-8");
        if (r.prompt_ids && r.n_prompt_ids < 1) FUZZ_FAIL("%lld prompt ids", (long long)r.n_prompt_ids);
        for (int64_t i = 0; i < r.n_prompt_ids; i++)
            if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= N_VOCAB) FUZZ_FAIL("prompt id %d", r.prompt_ids[i]);
    }
    if (!(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p >= 0 && r.top_p <= 1))
        FUZZ_FAIL("temperature %g, top_p %g", (double)r.temperature, (double)r.top_p);
    if (r.max_tokens != -1 && r.max_tokens < 1) FUZZ_FAIL("max_tokens %lld", (long long)r.max_tokens);
    if (r.n_stop < 0 || r.n_stop > NSTF_MAX_STOP) FUZZ_FAIL("%d stop strings", r.n_stop);
    for (int i = 0; i < r.n_stop; i++)
        if (!r.stop[i] || !r.stop[i][0] || !valid_text(r.stop[i])) FUZZ_FAIL("stop string %d", i);
    if (r.logprobs < -1 || r.logprobs > (kind == NSTF_API_CHAT ? NSTF_MAX_TOP_LOGPROBS : 5))
        FUZZ_FAIL("logprobs %d", r.logprobs);
    if (r.include_usage && !r.stream) FUZZ_FAIL("include_usage without stream");
    if (r.model && !valid_text(r.model)) FUZZ_FAIL("model name not UTF-8");
    check_answer(&r);
    nstf_api_req_free(&r);
    free(body);
    return 0;
}
