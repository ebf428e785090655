/* test_serve_api.c — the OpenAI JSON of the server (serve/api.c), without a
 * model: what a request body becomes (defaults, every accepted form of a
 * field), what is refused and with which status and field named, and the
 * shapes written back (answers, stream chunks, the usage chunk, errors,
 * the model list), all parsed back strictly; invalid UTF-8 and NUL bytes
 * of model output become U+FFFD. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "serve/api.h"
#include "test_util.h"

#define NV 1000

static bool parse(nstf_api_kind k, const char *body, nstf_api_req *r, nstf_api_error *e) {
    return nstf_api_parse(k, body, strlen(body), NV, r, e);
}

static void accepted(void) {
    nstf_api_req r;
    nstf_api_error e;
    CHECK(parse(NSTF_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r, &e), "%s", e.message);
    CHECK(r.n_msgs == 1 && !strcmp(r.msgs[0].role, "user") && !strcmp(r.msgs[0].content, "hi") && !r.model,
          "one message");
    CHECK(r.temperature == 1.0f && r.top_p == 1.0f && r.max_tokens == -1 && r.n_stop == 0 && !r.has_seed &&
              !r.stream && r.logprobs == -1 && !r.ignore_eos,
          "defaults: temperature %g top_p %g max_tokens %lld", (double)r.temperature, (double)r.top_p,
          (long long)r.max_tokens);
    nstf_api_req_free(&r);
    const char *full =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}],"
        "\"name\":\"x\"},{\"role\":\"assistant\",\"content\":\"ok\"}],\"temperature\":0,\"top_p\":0.5,"
        "\"max_completion_tokens\":7,\"stop\":[\"\\n\",\"END\"],\"seed\":-2,\"n\":1,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3,\"user\":\"u\","
        "\"presence_penalty\":0,\"frequency_penalty\":0,\"ignore_eos\":true}";
    CHECK(parse(NSTF_API_CHAT, full, &r, &e), "%s", e.message);
    CHECK(r.n_msgs == 3 && !strcmp(r.msgs[0].role, "system") && !strcmp(r.msgs[1].content, "a\nb") &&
              !strcmp(r.msgs[2].role, "assistant"),
          "developer as system, text parts joined by a newline");
    CHECK(r.temperature == 0 && r.top_p == 0.5f && r.max_tokens == 7 && r.n_stop == 2 && !strcmp(r.stop[1], "END") &&
              r.has_seed && r.seed == (uint64_t)-2 && r.stream && r.include_usage && r.logprobs == 3 && r.ignore_eos &&
              !strcmp(r.model, "m"),
          "every field of a full chat request");
    nstf_api_req_free(&r);
    CHECK(parse(NSTF_API_COMPLETION, "{\"prompt\":\"Once\",\"stop\":\".\",\"logprobs\":5,\"echo\":false}", &r, &e),
          "%s", e.message);
    CHECK(!strcmp(r.prompt, "Once") && r.n_stop == 1 && !strcmp(r.stop[0], ".") && r.logprobs == 5, "completion text");
    nstf_api_req_free(&r);
    const char *forms[] = {"{\"prompt\":[\"x\"]}", "{\"prompt\":[3,4,999]}", "{\"prompt\":[[3,4]]}"};
    for (int i = 0; i < 3; i++) {
        CHECK(parse(NSTF_API_COMPLETION, forms[i], &r, &e), "%s: %s", forms[i], e.message);
        CHECK(i == 0 ? r.prompt && !strcmp(r.prompt, "x") : r.n_prompt_ids >= 2 && r.prompt_ids[0] == 3, "%s", forms[i]);
        nstf_api_req_free(&r);
    }
    CHECK(parse(NSTF_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":null,\"seed\":null,"
                               "\"stop\":null,\"temperature\":null}",
                &r, &e),
          "nulls: %s", e.message);
    CHECK(r.max_tokens == -1 && !r.has_seed && r.temperature == 1.0f, "null is 'not given'");
    nstf_api_req_free(&r);
}

static void refused(void) {
    static const struct { int kind; const char *body; int status; const char *param; } cases[] = {
        {0, "", 400, NULL},
        {0, "{", 400, NULL},
        {0, "[]", 400, NULL},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]} x", 400, NULL},
        {0, "{}", 400, "messages"},
        {0, "{\"messages\":{}}", 400, "messages"},
        {0, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":1}]}", 400, "messages"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400, "messages"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt\":\"y\"}", 400, "prompt"},
        {1, "{\"prompt\":\"x\",\"messages\":[]}", 400, "messages"},
        {1, "{}", 400, "prompt"},
        {1, "{\"prompt\":[]}", 400, "prompt"},
        {1, "{\"prompt\":[1000]}", 400, "prompt"},
        {1, "{\"prompt\":[-1]}", 400, "prompt"},
        {1, "{\"prompt\":[1.5]}", 400, "prompt"},
        {1, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt"},
        {1, "{\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs"},
        {1, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo"},
        {1, "{\"prompt\":\"x\",\"top_logprobs\":2}", 400, "top_logprobs"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":2.5}", 400, "temperature"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"1\"}", 400, "temperature"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":-0.1}", 400, "top_p"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", 400, "max_tokens"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,\"max_completion_tokens\":2}", 400,
         "max_tokens"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":\"\"}", 400, "stop"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", 400, "stop"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1e300}", 400, "seed"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":3}", 400, "n"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", 400, "stream"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":true}}", 400,
         "stream_options"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"stream_options\":{\"x\":1}}", 400,
         "stream_options"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400, "top_logprobs"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", 400,
         "top_logprobs"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":0.5}", 400, "presence_penalty"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":3}", 400, "model"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}", 400, "tools"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"stream\":false}", 400, "stream"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nstf_api_req r;
        nstf_api_error e;
        const bool ok = parse((nstf_api_kind)cases[i].kind, cases[i].body, &r, &e);
        CHECK(!ok && e.status == cases[i].status && e.message[0] &&
                  (!cases[i].param || !strcmp(e.param, cases[i].param)),
              "%s: accepted %d, status %d, param '%s' (want '%s'): %s", cases[i].body, ok, e.status, e.param,
              cases[i].param ? cases[i].param : "", e.message);
        if (ok) nstf_api_req_free(&r);
    }
}

static cJSON *strict(char *s, const char *what) {
    cJSON *j = NULL;
    CHECK(s && nstf_json_parse(s, strlen(s), what, &j) == NSTF_OK, "%s: %s", what, s ? s : "(null)");
    free(s);
    return j;
}

static int64_t piece(void *user, int32_t id, char *buf, size_t cap) {
    (void)user;
    static const char *const p[] = {"He", "llo", "\xe2\x82", "\xac", "a\0b"};
    const size_t n = id == 4 ? 3 : strlen(p[id % 4]);
    memcpy(buf, p[id == 4 ? 4 : id % 4], n < cap ? n : cap);
    return (int64_t)n;
}

static void written(void) {
    char *s = nstf_api_utf8("a\xff" "b\0c\xe2\x82\xac\xe2\x82", 10);
    CHECK(s && !strcmp(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xe2\x82\xac\xef\xbf\xbd\xef\xbf\xbd"),
          "sanitised: '%s'", s ? s : "");
    free(s);
    nstf_gen_token toks[2] = {{.id = 0, .text_at = 0, .n_bytes = 2, .logprob = -0.25f, .n_top = 2,
                               .top_id = {0, 4}, .top_logprob = {-0.25f, -2}},
                              {.id = 1, .text_at = 2, .n_bytes = 3, .logprob = -1, .n_top = 0}};
    nstf_api_out o = {.kind = NSTF_API_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m", .text = "Hello",
                      .n_text = 5, .toks = toks, .n_toks = 2, .logprobs = 2, .finish = "stop", .n_prompt = 3,
                      .n_gen = 2, .n_cached = 1, .piece = piece};
    cJSON *j = strict(nstf_api_response_json(&o), "chat answer");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const cJSON *lp = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "content"), 0);
    const cJSON *alt = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 1);
    CHECK(!strcmp(nstf_json_str(j, "object"), "chat.completion") &&
              !strcmp(nstf_json_str(cJSON_GetObjectItem(c, "message"), "content"), "Hello") &&
              !strcmp(nstf_json_str(c, "finish_reason"), "stop") && !strcmp(nstf_json_str(lp, "token"), "He") &&
              cJSON_GetArraySize(cJSON_GetObjectItem(lp, "bytes")) == 2 &&
              !strcmp(nstf_json_str(alt, "token"), "a\xef\xbf\xbd" "b") &&
              cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valuedouble == 5,
          "chat answer shape");
    cJSON_Delete(j);
    o.finish = NULL;
    o.role = true;
    o.n_text = 0;
    o.n_toks = 0;
    j = strict(nstf_api_chunk_json(&o), "first chunk");
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(!strcmp(nstf_json_str(j, "object"), "chat.completion.chunk") &&
              !strcmp(nstf_json_str(cJSON_GetObjectItem(c, "delta"), "role"), "assistant") &&
              cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")) && cJSON_IsNull(cJSON_GetObjectItem(c, "logprobs")),
          "the first stream chunk says the role");
    cJSON_Delete(j);
    o.role = false;
    o.finish = "length";
    j = strict(nstf_api_chunk_json(&o), "last chunk");
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(c, "delta")) == 0 && !strcmp(nstf_json_str(c, "finish_reason"), "length"),
          "the last chunk: an empty delta and the finish reason");
    cJSON_Delete(j);
    j = strict(nstf_api_usage_chunk_json(&o), "usage chunk");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")) == 0 &&
              cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens_details"),
                                  "cached_tokens")->valuedouble == 1,
          "the usage chunk: no choices, usage with cached tokens");
    cJSON_Delete(j);
    o.kind = NSTF_API_COMPLETION;
    o.text = "Hello";
    o.n_text = 5;
    o.n_toks = 2;
    o.finish = "stop";
    j = strict(nstf_api_response_json(&o), "completion answer");
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    lp = cJSON_GetObjectItem(c, "logprobs");
    CHECK(!strcmp(nstf_json_str(j, "object"), "text_completion") && !strcmp(nstf_json_str(c, "text"), "Hello") &&
              cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valuedouble == 2 &&
              cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0)) == 2,
          "completion answer shape");
    cJSON_Delete(j);
    nstf_api_error e;
    nstf_api_error_set(&e, 400, "invalid_request_error", "code_x", "field", "bad \xff %d", 3);
    j = strict(nstf_api_error_json(&e), "error");
    const cJSON *err = cJSON_GetObjectItem(j, "error");
    CHECK(!strcmp(nstf_json_str(err, "message"), "bad \xef\xbf\xbd 3") && !strcmp(nstf_json_str(err, "param"), "field") &&
              !strcmp(nstf_json_str(err, "code"), "code_x") && !strcmp(nstf_json_str(err, "type"), "invalid_request_error"),
          "error shape");
    cJSON_Delete(j);
    j = strict(nstf_api_models_json("model.gguf", 7, 4096), "models");
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    CHECK(!strcmp(nstf_json_str(j, "object"), "list") && !strcmp(nstf_json_str(m, "id"), "model.gguf") &&
              !strcmp(nstf_json_str(m, "object"), "model"),
          "model list");
    cJSON_Delete(j);
}

int main(void) {
    accepted();
    refused();
    written();
    return test_finish("test_serve_api");
}
