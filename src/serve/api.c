/* api.c — OpenAI request bodies in, responses, stream chunks and errors
 * out (api.h). Parsing is strict: the body is one JSON object (UTF-8, no
 * NUL, nothing after it: io/json.c), every member is a known field seen
 * once with its type and range; the first fault is the answer, naming the
 * field. Output is built with cJSON from sanitised strings. */
#include "serve/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "nstf.h"
#include "io/utf8.h"

/* ---- errors ------------------------------------------------------------------------ */

void nstf_api_error_set(nstf_api_error *e, int status, const char *type, const char *code, const char *param,
                        const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *nstf_api_utf8(const char *s, int64_t n) {
    char *out = malloc((size_t)n * 3 + 1); /* each byte at worst one U+FFFD */
    if (!out) return NULL;
    int64_t o = 0;
    for (int64_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        const int len = c < 0x80 ? 1 : c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xf0 && c < 0xf5 ? 4 : 0;
        if (c != 0 && len > 0 && i + len <= n && nstf_utf8_check((const uint8_t *)s + i, (size_t)len, NULL) < 0) {
            memcpy(out + o, s + i, (size_t)len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = 0;
    return out;
}

/* cJSON prints in one piece; NULL when a part could not be made */
static char *print(cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return s;
}

static void add_str(cJSON *o, const char *key, const char *s) {
    if (s) cJSON_AddStringToObject(o, key, s);
    else cJSON_AddNullToObject(o, key);
}

char *nstf_api_error_json(const nstf_api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_CreateObject();
    if (!root || !err) {
        cJSON_Delete(root);
        cJSON_Delete(err);
        return NULL;
    }
    char *msg = nstf_api_utf8(e->message, (int64_t)strlen(e->message));
    char *param = nstf_api_utf8(e->param, (int64_t)strlen(e->param));
    add_str(err, "message", msg ? msg : "error");
    add_str(err, "type", e->type ? e->type : "server_error");
    add_str(err, "param", param && *param ? param : NULL);
    add_str(err, "code", e->code);
    free(msg);
    free(param);
    cJSON_AddItemToObject(root, "error", err);
    return print(root);
}

/* ---- parsing ------------------------------------------------------------------------ */

static bool bad(nstf_api_error *e, const char *param, const char *fmt, const char *what) {
    nstf_api_error_set(e, 400, "invalid_request_error", NULL, param, fmt, param, what);
    return false;
}

/* A number in [lo, hi]; JSON null leaves *out as it was. */
static bool num_field(const cJSON *v, const char *name, double lo, double hi, double *out, nstf_api_error *e) {
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad(e, name, "'%s' must be a number%s", "");
    if (v->valuedouble < lo || v->valuedouble > hi) {
        nstf_api_error_set(e, 400, "invalid_request_error", NULL, name, "'%s' is %g; it must be between %g and %g",
                           name, v->valuedouble, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* An integer in [lo, hi] (exact in a double: |x| < 2^53). */
static bool int_field(const cJSON *v, const char *name, int64_t lo, int64_t hi, int64_t *out, nstf_api_error *e) {
    if (!v || cJSON_IsNull(v)) return true;
    const double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(fabs(d) < 9007199254740992.0) || d != floor(d)) return bad(e, name, "'%s' must be an integer%s", "");
    if (d < (double)lo || d > (double)hi) {
        nstf_api_error_set(e, 400, "invalid_request_error", NULL, name,
                           "'%s' is %.0f; it must be an integer from %lld to %lld", name, d, (long long)lo,
                           (long long)hi);
        return false;
    }
    *out = (int64_t)d;
    return true;
}

static bool bool_field(const cJSON *v, const char *name, bool *out, nstf_api_error *e) {
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) return bad(e, name, "'%s' must be true or false%s", "");
    *out = cJSON_IsTrue(v);
    return true;
}

static bool oom(nstf_api_error *e) {
    nstf_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory reading the request");
    return false;
}

static bool str_dup(const char *s, char **out, nstf_api_error *e) {
    return (*out = strdup(s)) != NULL || oom(e);
}

/* The fields of each endpoint; a member outside its list is refused, as
 * is one given twice. */
enum {
    F_MODEL, F_MESSAGES, F_PROMPT, F_TEMPERATURE, F_TOP_P, F_MAX_TOKENS, F_MAX_COMPLETION_TOKENS, F_STOP, F_SEED, F_N,
    F_STREAM, F_STREAM_OPTIONS, F_LOGPROBS, F_TOP_LOGPROBS, F_USER, F_PRESENCE, F_FREQUENCY, F_ECHO, F_IGNORE_EOS,
    F_COUNT
};
static const char *const k_fields[F_COUNT] = {
    "model", "messages", "prompt", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n",
    "stream", "stream_options", "logprobs", "top_logprobs", "user", "presence_penalty", "frequency_penalty", "echo",
    "ignore_eos"};
/* which endpoint takes a field: bit 0 chat, bit 1 completions */
static const unsigned char k_where[F_COUNT] = {3, 1, 2, 3, 3, 3, 1, 3, 3, 3, 3, 3, 3, 1, 3, 3, 3, 2, 3};

/* "text" parts of a content array, joined by newlines */
static bool content_parts(const cJSON *c, char **out, nstf_api_error *e) {
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const char *type = cJSON_IsObject(part) ? nstf_json_str(part, "type") : NULL;
        const cJSON *text = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (!type || strcmp(type, "text") != 0 || !cJSON_IsString(text) || cJSON_GetArraySize(part) != 2)
            return bad(e, "messages", "'%s': a content part must be {\"type\": \"text\", \"text\": string}%s", "");
        len += strlen(text->valuestring) + 1;
    }
    char *s = malloc(len + 1);
    if (!s) return oom(e);
    s[0] = 0;
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        if (at) s[at++] = '\n';
        memcpy(s + at, t, strlen(t) + 1);
        at += strlen(t);
    }
    *out = s;
    return true;
}

static bool messages(const cJSON *v, nstf_api_req *r, nstf_api_error *e) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1)
        return bad(e, "messages", "'%s' must be a non-empty array of messages%s", "");
    const int n = cJSON_GetArraySize(v);
    if (n > NSTF_API_MAX_MSGS) {
        nstf_api_error_set(e, 400, "invalid_request_error", NULL, "messages", "%d messages; at most %d are taken", n,
                           NSTF_API_MAX_MSGS);
        return false;
    }
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) return oom(e);
    const cJSON *m;
    cJSON_ArrayForEach(m, v) {
        if (!cJSON_IsObject(m)) return bad(e, "messages", "'%s': each message must be an object%s", "");
        const cJSON *role = NULL, *content = NULL, *f;
        cJSON_ArrayForEach(f, m) {
            const cJSON **slot = !strcmp(f->string, "role") ? &role : !strcmp(f->string, "content") ? &content : NULL;
            if (!slot && strcmp(f->string, "name") != 0) {
                nstf_api_error_set(e, 400, "invalid_request_error", NULL, "messages",
                                   "a message has the field '%.100s'; messages take role, content and name", f->string);
                return false;
            }
            if (slot && *slot) return bad(e, "messages", "'%s': a message gives a field twice%s", "");
            if (slot) *slot = f;
            else if (!cJSON_IsString(f)) return bad(e, "messages", "'%s': a message's name must be a string%s", "");
        }
        static const char *const roles[] = {"system", "developer", "user", "assistant"};
        int ri = -1;
        for (int i = 0; i < 4 && cJSON_IsString(role); i++)
            if (!strcmp(role->valuestring, roles[i])) ri = i;
        if (ri < 0) return bad(e, "messages", "'%s': a message's role must be system, developer, user or assistant%s", "");
        char *text = NULL;
        if (cJSON_IsString(content)) {
            if (!str_dup(content->valuestring, &text, e)) return false;
        } else if (cJSON_IsArray(content)) {
            if (!content_parts(content, &text, e)) return false;
        } else {
            return bad(e, "messages", "'%s': a message's content must be a string or an array of text parts%s", "");
        }
        nstf_chat_msg *dst = &r->msgs[r->n_msgs++];
        dst->role = roles[ri == 1 ? 0 : ri]; /* developer messages are system messages */
        dst->content = text;
    }
    return true;
}

/* prompt: a string, [string], [ids] or [[ids]] */
static bool prompt(const cJSON *v, int32_t n_vocab, nstf_api_req *r, nstf_api_error *e) {
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && !cJSON_IsNumber(v->child)) v = v->child;
    if (cJSON_IsString(v)) return str_dup(v->valuestring, &r->prompt, e);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1)
        return bad(e, "prompt", "'%s' must be a string or a non-empty array of token ids (one prompt: n = 1)%s", "");
    const int n = cJSON_GetArraySize(v);
    r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return oom(e);
    const cJSON *t;
    cJSON_ArrayForEach(t, v) {
        const double d = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!(d >= 0 && d < n_vocab && d == floor(d))) {
            nstf_api_error_set(e, 400, "invalid_request_error", NULL, "prompt",
                               "'prompt' token ids must be integers from 0 to %d", n_vocab - 1);
            return false;
        }
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)d;
    }
    return true;
}

static bool stop(const cJSON *v, nstf_api_req *r, nstf_api_error *e) {
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return bad(e, "stop", "'%s' must not be empty%s", "");
        r->n_stop = 1;
        return str_dup(v->valuestring, &r->stop[0], e);
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > NSTF_MAX_STOP)
        return bad(e, "stop", "'%s' must be a string or an array of at most 4 strings%s", "");
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s) || !*s->valuestring) return bad(e, "stop", "'%s' must hold non-empty strings%s", "");
        if (!str_dup(s->valuestring, &r->stop[r->n_stop++], e)) return false;
    }
    return true;
}

bool nstf_api_parse(nstf_api_kind kind, const char *body, size_t n, int32_t n_vocab, nstf_api_req *r,
                    nstf_api_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->max_tokens = -1;
    r->logprobs = -1;
    cJSON *root = NULL;
    if (nstf_json_parse(body, n, "request body", &root) != NSTF_OK) {
        nstf_api_error_set(e, 400, "invalid_request_error", NULL, NULL, "%s", nstf_last_error());
        return false;
    }
    const cJSON *f[F_COUNT] = {0}, *v;
    bool ok = cJSON_IsObject(root);
    if (!ok) nstf_api_error_set(e, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
    const cJSON *members = ok ? root : NULL;
    cJSON_ArrayForEach(v, members) {
        int i = 0;
        while (i < F_COUNT && strcmp(v->string, k_fields[i]) != 0) i++;
        if (i == F_COUNT || !(k_where[i] & (1u << kind))) {
            char *name = nstf_api_utf8(v->string, (int64_t)strlen(v->string));
            nstf_api_error_set(e, 400, "invalid_request_error", NULL, name ? name : "",
                               "Unrecognized request argument supplied: %.100s", name ? name : "?");
            free(name);
            ok = false;
            break;
        }
        if (f[i]) {
            ok = bad(e, k_fields[i], "'%s' is given twice%s", "");
            break;
        }
        f[i] = v;
    }
    double d;
    int64_t k;
    bool b;
    if (ok && f[F_MODEL] && !cJSON_IsNull(f[F_MODEL])) {
        if (!cJSON_IsString(f[F_MODEL])) ok = bad(e, "model", "'%s' must be a string%s", "");
        else ok = str_dup(f[F_MODEL]->valuestring, &r->model, e);
    }
    if (ok && kind == NSTF_API_CHAT) {
        if (!f[F_MESSAGES]) ok = bad(e, "messages", "'%s' is required%s", "");
        else ok = messages(f[F_MESSAGES], r, e);
    }
    if (ok && kind == NSTF_API_COMPLETION) {
        if (!f[F_PROMPT] || cJSON_IsNull(f[F_PROMPT])) ok = bad(e, "prompt", "'%s' is required%s", "");
        else ok = prompt(f[F_PROMPT], n_vocab, r, e);
    }
    if (ok && (d = r->temperature, ok = num_field(f[F_TEMPERATURE], "temperature", 0, 2, &d, e))) r->temperature = (float)d;
    if (ok && (d = r->top_p, ok = num_field(f[F_TOP_P], "top_p", 0, 1, &d, e))) r->top_p = (float)d;
    if (ok && f[F_MAX_TOKENS] && f[F_MAX_COMPLETION_TOKENS] && !cJSON_IsNull(f[F_MAX_TOKENS]) &&
        !cJSON_IsNull(f[F_MAX_COMPLETION_TOKENS]))
        ok = bad(e, "max_tokens", "give '%s' or max_completion_tokens, not both%s", "");
    if (ok) ok = int_field(f[F_MAX_TOKENS], "max_tokens", 1, INT32_MAX, &r->max_tokens, e);
    if (ok) ok = int_field(f[F_MAX_COMPLETION_TOKENS], "max_completion_tokens", 1, INT32_MAX, &r->max_tokens, e);
    if (ok && f[F_STOP]) ok = stop(f[F_STOP], r, e);
    if (ok && f[F_SEED] && !cJSON_IsNull(f[F_SEED])) {
        k = 0;
        ok = int_field(f[F_SEED], "seed", -9007199254740991ll, 9007199254740991ll, &k, e);
        r->has_seed = ok;
        r->seed = (uint64_t)k;
    }
    if (ok && (k = 1, ok = int_field(f[F_N], "n", 1, 128, &k, e)) && k != 1) {
        nstf_api_error_set(e, 400, "invalid_request_error", NULL, "n", "'n' is %lld; this server returns one choice (n = 1)",
                           (long long)k);
        ok = false;
    }
    if (ok) ok = bool_field(f[F_STREAM], "stream", &r->stream, e);
    if (ok) ok = bool_field(f[F_IGNORE_EOS], "ignore_eos", &r->ignore_eos, e);
    if (ok && f[F_STREAM_OPTIONS] && !cJSON_IsNull(f[F_STREAM_OPTIONS])) {
        const cJSON *so = f[F_STREAM_OPTIONS], *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (!cJSON_IsObject(so) || cJSON_GetArraySize(so) != (iu ? 1 : 0))
            ok = bad(e, "stream_options", "'%s' must be an object with at most include_usage%s", "");
        else if (!r->stream) ok = bad(e, "stream_options", "'%s' is only allowed with stream: true%s", "");
        else ok = bool_field(iu, "stream_options", &r->include_usage, e);
    }
    if (ok && kind == NSTF_API_CHAT) {
        b = false;
        k = 0;
        ok = bool_field(f[F_LOGPROBS], "logprobs", &b, e) &&
             int_field(f[F_TOP_LOGPROBS], "top_logprobs", 0, NSTF_MAX_TOP_LOGPROBS, &k, e);
        if (ok && !b && f[F_TOP_LOGPROBS] && !cJSON_IsNull(f[F_TOP_LOGPROBS]))
            ok = bad(e, "top_logprobs", "'%s' needs logprobs: true%s", "");
        if (ok && b) r->logprobs = (int)k;
    }
    if (ok && kind == NSTF_API_COMPLETION && f[F_LOGPROBS] && !cJSON_IsNull(f[F_LOGPROBS])) {
        k = 0;
        ok = int_field(f[F_LOGPROBS], "logprobs", 0, 5, &k, e);
        if (ok) r->logprobs = (int)k;
    }
    if (ok && f[F_USER] && !cJSON_IsNull(f[F_USER]) && !cJSON_IsString(f[F_USER]))
        ok = bad(e, "user", "'%s' must be a string%s", "");
    for (int i = F_PRESENCE; ok && i <= F_FREQUENCY; i++) {
        d = 0;
        ok = num_field(f[i], k_fields[i], -2, 2, &d, e);
        if (ok && d != 0) {
            nstf_api_error_set(e, 400, "invalid_request_error", NULL, k_fields[i], "'%s' is not supported (only 0)",
                               k_fields[i]);
            ok = false;
        }
    }
    if (ok && f[F_ECHO]) {
        b = false;
        ok = bool_field(f[F_ECHO], "echo", &b, e);
        if (ok && b) ok = bad(e, "echo", "'%s': true is not supported%s", "");
    }
    cJSON_Delete(root);
    if (!ok) nstf_api_req_free(r);
    return ok;
}

void nstf_api_req_free(nstf_api_req *r) {
    free(r->model);
    for (int i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    const nstf_api_kind kind = r->kind;
    memset(r, 0, sizeof *r);
    r->kind = kind;
}

/* ---- responses ------------------------------------------------------------------------ */

/* A token's text (sanitised) and its raw bytes. */
static char *token_text(const nstf_api_out *o, int32_t id, cJSON **bytes) {
    char small[256];
    int64_t n = o->piece ? o->piece(o->piece_user, id, small, sizeof small) : 0;
    if (n < 0) n = 0;
    if (n > (int64_t)sizeof small) n = sizeof small; /* the rare longer piece is shown cut */
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (int64_t i = 0; *bytes && i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)small[i]));
    }
    return nstf_api_utf8(small, n);
}

static cJSON *chat_logprobs(const nstf_api_out *o) {
    cJSON *lp = cJSON_CreateObject(), *content = cJSON_CreateArray();
    for (int i = 0; content && i < o->n_toks; i++) {
        const nstf_gen_token *t = &o->toks[i];
        cJSON *item = cJSON_CreateObject(), *bytes = NULL, *top = cJSON_CreateArray();
        char *s = token_text(o, t->id, &bytes);
        add_str(item, "token", s ? s : "");
        free(s);
        cJSON_AddNumberToObject(item, "logprob", t->logprob);
        cJSON_AddItemToObject(item, "bytes", bytes);
        for (int j = 0; top && j < t->n_top; j++) {
            cJSON *alt = cJSON_CreateObject(), *ab = NULL;
            char *as = token_text(o, t->top_id[j], &ab);
            add_str(alt, "token", as ? as : "");
            free(as);
            cJSON_AddNumberToObject(alt, "logprob", t->top_logprob[j]);
            cJSON_AddItemToObject(alt, "bytes", ab);
            cJSON_AddItemToArray(top, alt);
        }
        cJSON_AddItemToObject(item, "top_logprobs", top);
        cJSON_AddItemToArray(content, item);
    }
    cJSON_AddItemToObject(lp, "content", content);
    return lp;
}

/* text_offset: where each token's text starts in the whole completion */
static cJSON *completion_logprobs(const nstf_api_out *o) {
    cJSON *lp = cJSON_CreateObject(), *tokens = cJSON_CreateArray(), *lps = cJSON_CreateArray(),
          *tops = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    for (int i = 0; i < o->n_toks; i++) {
        const nstf_gen_token *t = &o->toks[i];
        char *s = token_text(o, t->id, NULL);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s ? s : ""));
        free(s);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int j = 0; top && j < t->n_top; j++) {
            char *as = token_text(o, t->top_id[j], NULL);
            if (as && !cJSON_GetObjectItemCaseSensitive(top, as)) cJSON_AddNumberToObject(top, as, t->top_logprob[j]);
            free(as);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->text_at));
    }
    cJSON_AddItemToObject(lp, "tokens", tokens);
    cJSON_AddItemToObject(lp, "token_logprobs", lps);
    cJSON_AddItemToObject(lp, "top_logprobs", tops);
    cJSON_AddItemToObject(lp, "text_offset", offs);
    return lp;
}

static cJSON *head(const nstf_api_out *o, const char *object) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    add_str(root, "id", o->id);
    add_str(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)o->created);
    add_str(root, "model", o->model);
    add_str(root, "system_fingerprint", "nstf-" NSTF_VERSION_STRING);
    return root;
}

static void add_usage(cJSON *root, const nstf_api_out *o) {
    cJSON *u = cJSON_CreateObject(), *det = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)o->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)o->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(o->n_prompt + o->n_gen));
    cJSON_AddNumberToObject(det, "cached_tokens", (double)o->n_cached);
    cJSON_AddItemToObject(u, "prompt_tokens_details", det);
    cJSON_AddItemToObject(root, "usage", u);
}

/* One choice: message (whole chat answer), delta (chat chunk) or text. */
static cJSON *choice(const nstf_api_out *o, bool stream) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddNumberToObject(c, "index", 0);
    char *text = nstf_api_utf8(o->text ? o->text : "", o->text ? o->n_text : 0);
    if (o->kind == NSTF_API_CHAT) {
        cJSON *m = cJSON_CreateObject();
        if (!stream || o->role) add_str(m, "role", "assistant");
        if (!stream || o->n_text > 0 || o->role) add_str(m, "content", text ? text : "");
        cJSON_AddItemToObject(c, stream ? "delta" : "message", m);
        if (o->logprobs >= 0 && (!stream || o->n_toks > 0)) cJSON_AddItemToObject(c, "logprobs", chat_logprobs(o));
        else cJSON_AddNullToObject(c, "logprobs");
    } else {
        add_str(c, "text", text ? text : "");
        if (o->logprobs >= 0 && (!stream || o->n_toks > 0)) cJSON_AddItemToObject(c, "logprobs", completion_logprobs(o));
        else cJSON_AddNullToObject(c, "logprobs");
    }
    free(text);
    add_str(c, "finish_reason", o->finish);
    return c;
}

static cJSON *with_choice(const nstf_api_out *o, bool stream) {
    const char *object = o->kind == NSTF_API_CHAT ? (stream ? "chat.completion.chunk" : "chat.completion")
                                                  : "text_completion";
    cJSON *root = head(o, object), *choices = cJSON_CreateArray();
    cJSON_AddItemToArray(choices, choice(o, stream));
    cJSON_AddItemToObject(root, "choices", choices);
    return root;
}

char *nstf_api_response_json(const nstf_api_out *o) {
    cJSON *root = with_choice(o, false);
    if (root) add_usage(root, o);
    return print(root);
}

char *nstf_api_chunk_json(const nstf_api_out *o) {
    cJSON *root = with_choice(o, true);
    if (root && o->usage) cJSON_AddNullToObject(root, "usage");
    return print(root);
}

char *nstf_api_usage_chunk_json(const nstf_api_out *o) {
    cJSON *root = head(o, o->kind == NSTF_API_CHAT ? "chat.completion.chunk" : "text_completion");
    if (root) {
        cJSON_AddItemToObject(root, "choices", cJSON_CreateArray());
        add_usage(root, o);
    }
    return print(root);
}

char *nstf_api_models_json(const char *model, int64_t created, int64_t n_ctx) {
    cJSON *root = cJSON_CreateObject(), *data = cJSON_CreateArray(), *m = cJSON_CreateObject();
    char *name = nstf_api_utf8(model, (int64_t)strlen(model));
    add_str(root, "object", "list");
    add_str(m, "id", name ? name : "model");
    add_str(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    add_str(m, "owned_by", "nstf");
    cJSON_AddNumberToObject(m, "context_length", (double)n_ctx);
    free(name);
    cJSON_AddItemToArray(data, m);
    cJSON_AddItemToObject(root, "data", data);
    return print(root);
}
