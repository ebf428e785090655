/* conv.c — multi-turn conversations on a session (nstf_conv_*, nstf.h).
 *
 * The KV cache keeps the whole conversation: a turn renders the messages
 * with the chat template and evaluates only what is new. `cached` is the
 * rendered text the history stands for since the last reset: the previous
 * turn's rendering up to its generation prompt, plus the pieces of every
 * generated token that was evaluated. When the new rendering starts with
 * it (ChatML and Llama-3 turns append), the rest is the turn's delta: for
 * ChatML "<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n"
 * (the end-of-turn token the model sampled is evaluated as template text).
 * Otherwise (a template that trims or strips the answer) the delta is what
 * the new rendering adds to the rendering of the messages before it, as
 * llama.cpp does. After a reset (/clear, a new system message, a loaded
 * conversation) the whole rendering is tokenized and the longest prefix
 * the cache already holds (the system message, typically) is kept.
 * A context shift drops tokens from the middle of the cache; turns still
 * append, so `cached` stays the text they continue. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/mem.h"
#include "io/utf8.h"
#include "model/session.h"

struct nstf_conv {
    nstf_session *s;
    nstf_sampler smp;
    char *system;        /* NULL: the template's default */
    nstf_chat_msg *msgs; /* the turns (role a string literal, content owned) */
    int n_msgs, cap;
    nstf_text cached;
    bool fresh;          /* `cached` is void: match tokens instead */
    bool keep_set;       /* the session's n_keep was set by the first turn */
};

static void free_msgs(nstf_conv *c) {
    for (int i = 0; i < c->n_msgs; i++) free((char *)c->msgs[i].content);
    c->n_msgs = 0;
}

static nstf_status push(nstf_conv *c, const char *role, const char *content, size_t len) {
    if (c->n_msgs == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        nstf_chat_msg *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m) return nstf_set_error(NSTF_ERR_OOM, "out of memory for the conversation");
        c->msgs = m;
        c->cap = cap;
    }
    char *p = malloc(len + 1);
    if (!p) return nstf_set_error(NSTF_ERR_OOM, "out of memory for the conversation");
    memcpy(p, content, len);
    p[len] = 0;
    c->msgs[c->n_msgs++] = (nstf_chat_msg){role, p};
    return NSTF_OK;
}

static void pop(nstf_conv *c) {
    if (c->n_msgs) free((char *)c->msgs[--c->n_msgs].content);
}

/* The messages (with the system message first), rendered. */
static nstf_status render(nstf_conv *c, int n_msgs, bool gen, char **out) {
    nstf_chat_msg *all = malloc((size_t)(n_msgs + 1) * sizeof *all);
    if (!all) return nstf_set_error(NSTF_ERR_OOM, "out of memory for the conversation");
    int n = 0;
    if (c->system) all[n++] = (nstf_chat_msg){"system", c->system};
    for (int i = 0; i < n_msgs; i++) all[n++] = c->msgs[i];
    nstf_status r = nstf_session_render(c->s, all, n, gen, out);
    free(all);
    return r;
}

static nstf_status set_system(nstf_conv *c, const char *system) {
    char *p = NULL;
    if (system) {
        NSTF_TRY(nstf_session_check_text("the system message", system));
        if (!(p = strdup(system))) return nstf_set_error(NSTF_ERR_OOM, "out of memory for the system message");
    }
    free(c->system);
    c->system = p;
    return NSTF_OK;
}

nstf_status nstf_conv_open(nstf_session *s, const char *system, const nstf_sampler_params *sp, nstf_conv **out) {
    *out = NULL;
    nstf_conv *c = calloc(1, sizeof *c);
    if (!c) return nstf_set_error(NSTF_ERR_OOM, "out of memory for the conversation");
    c->s = s;
    c->fresh = true;
    const nstf_sampler_params d = nstf_sampler_default_params();
    nstf_status r = nstf_sampler_init(&c->smp, sp ? sp : &d, s->model->cfg.n_vocab);
    if (r != NSTF_OK) {
        free(c);
        return r;
    }
    r = set_system(c, system);
    if (r == NSTF_OK && !s->tmpl_family) r = nstf_session_render(s, NULL, 0, true, NULL);
    if (r != NSTF_OK) {
        nstf_conv_close(c);
        return r;
    }
    *out = c;
    return NSTF_OK;
}

void nstf_conv_close(nstf_conv *c) {
    if (!c) return;
    free_msgs(c);
    free(c->msgs);
    free(c->system);
    free(c->cached.p);
    nstf_sampler_free(&c->smp);
    free(c);
}

static void reset(nstf_conv *c) {
    free_msgs(c);
    c->cached.len = 0;
    c->fresh = true;
}

void nstf_conv_clear(nstf_conv *c) { reset(c); }

nstf_status nstf_conv_set_system(nstf_conv *c, const char *system) {
    NSTF_TRY(set_system(c, system));
    reset(c);
    return NSTF_OK;
}

int nstf_conv_n_messages(const nstf_conv *c) { return c->n_msgs; }
int nstf_conv_n_past(const nstf_conv *c) { return c->s->n_past; }

static bool starts_with(const char *s, const char *prefix, size_t n) { return strncmp(s, prefix, n) == 0; }

/* The tokens this turn evaluates (*ids malloc'd), after rewinding the
 * history to what they continue. */
static nstf_status turn_tokens(nstf_conv *c, const char *fmt_new, int32_t **ids, int64_t *n) {
    nstf_session *s = c->s;
    const char *delta = NULL;
    char *fmt_past = NULL;
    if (!c->fresh && s->n_past > 0) {
        if (starts_with(fmt_new, c->cached.p ? c->cached.p : "", c->cached.len)) {
            delta = fmt_new + c->cached.len;
        } else {
            NSTF_TRY(render(c, c->n_msgs - 1, false, &fmt_past));
            if (starts_with(fmt_new, fmt_past, strlen(fmt_past))) delta = fmt_new + strlen(fmt_past);
        }
    }
    nstf_status r;
    if (delta) {
        r = nstf_session_tokenize_text(s, delta, strlen(delta), false, true, ids, n);
    } else {
        /* from the start: keep the longest prefix the cache holds, but
         * evaluate at least one token (its logits start the answer) */
        r = nstf_session_tokenize_text(s, fmt_new, strlen(fmt_new), true, true, ids, n);
        if (r == NSTF_OK) {
            int64_t p = 0;
            while (p < *n - 1 && p < s->n_past && s->hist[p] == (*ids)[p]) p++;
            nstf_session_rewind(s, (int)p);
            memmove(*ids, *ids + p, (size_t)(*n - p) * sizeof(int32_t));
            *n -= p;
        }
    }
    free(fmt_past);
    return r;
}

nstf_status nstf_conv_turn(nstf_conv *c, const char *user_text, const nstf_gen_params *gpp, nstf_piece_fn cb,
                           void *user, nstf_gen_stats *stats) {
    nstf_session *s = c->s;
    nstf_gen_stats st = {0};
    st.load_ms = s->load_ms;
    if (stats) *stats = st;
    const nstf_gen_params gp = gpp ? *gpp : nstf_gen_default_params();
    if (gp.n_predict < -2) return nstf_set_error(NSTF_ERR_INVALID_ARG, "-n %d: use a count >= 0, -1 or -2", gp.n_predict);
    if (!user_text) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no message given");
    NSTF_TRY(nstf_session_check_text("the message", user_text));
    NSTF_TRY(push(c, "user", user_text, strlen(user_text)));
    char *fmt_new = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    const int past0 = s->n_past;
    nstf_status r = render(c, c->n_msgs, true, &fmt_new);
    if (r == NSTF_OK) r = turn_tokens(c, fmt_new, &ids, &n);
    bool stopped = false;
    const double t0 = nstf_time_ms();
    if (r == NSTF_OK) {
        nstf_session_begin_gen(s, &c->smp.p);
        for (int64_t i = 0; i < n; i++) nstf_sampler_accept(&c->smp, ids[i]);
        r = nstf_session_append(s, ids, n, &gp, &st, &stopped);
    }
    st.prompt_ms = nstf_time_ms() - t0;
    st.n_prompt = n;
    free(ids);
    if (r != NSTF_OK || stopped) {
        /* the turn did not happen: the cache holds a part of it at most */
        pop(c);
        if (s->n_past > past0 || r != NSTF_OK) c->fresh = true;
        free(fmt_new);
        st.stop = NSTF_STOP_INTERRUPTED;
        st.n_past = s->n_past;
        if (stats) *stats = st;
        return r;
    }
    if (!c->keep_set) {
        s->n_keep = gp.n_keep < 0 ? s->n_past : gp.n_keep + (s->n_past && s->hist[0] == nstf_tokenizer_bos(s->tok));
        c->keep_set = true;
    }
    c->cached.len = 0;
    c->fresh = false;
    nstf_text_add(&c->cached, fmt_new, strlen(fmt_new));
    free(fmt_new);
    nstf_text answer = {0};
    r = nstf_session_gen_loop(s, &c->smp, &gp, cb, user, &st, &answer, &c->cached);
    if (c->cached.oom) c->fresh = true;
    /* the answer as text the conversation can take back: tokens of a
     * byte-level vocabulary may stop inside a character, or never form
     * one (a random model, a cut at -n); such bytes become U+FFFD, so the
     * next turn's rendering encodes and /save writes what /load reads */
    char *text = malloc(3 * answer.len + 1);
    nstf_status r2 = text ? NSTF_OK : nstf_set_error(NSTF_ERR_OOM, "out of memory for the conversation");
    if (r2 == NSTF_OK) r2 = push(c, "assistant", text, nstf_utf8_repair((const uint8_t *)(answer.p ? answer.p : ""), answer.len, text));
    free(text);
    free(answer.p);
    if (r == NSTF_OK) r = r2;
    if (stats) *stats = st;
    return r;
}

nstf_status nstf_conv_save(const nstf_conv *c, const char *path) {
    cJSON *root = cJSON_CreateObject(), *msgs = cJSON_CreateArray();
    bool ok = root && msgs;
    if (ok) ok = (c->system ? cJSON_AddStringToObject(root, "system", c->system) : cJSON_AddNullToObject(root, "system")) != NULL;
    if (ok) cJSON_AddItemToObject(root, "messages", msgs), msgs = NULL;
    cJSON *arr = ok ? cJSON_GetObjectItem(root, "messages") : NULL;
    for (int i = 0; ok && i < c->n_msgs; i++) {
        cJSON *m = cJSON_CreateObject();
        ok = m && cJSON_AddStringToObject(m, "role", c->msgs[i].role) && cJSON_AddStringToObject(m, "content", c->msgs[i].content);
        if (m) cJSON_AddItemToArray(arr, m);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(msgs);
    if (!text) return nstf_set_error(NSTF_ERR_OOM, "out of memory writing the conversation");
    FILE *f = fopen(path, "wb");
    nstf_status r = NSTF_OK;
    if (!f) r = nstf_set_error(NSTF_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    else {
        const size_t n = strlen(text);
        bool w = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
        if (fclose(f) != 0 || !w) r = nstf_set_error(NSTF_ERR_IO, "error writing %s: %s", path, strerror(errno));
    }
    cJSON_free(text);
    return r;
}

nstf_status nstf_conv_load(nstf_conv *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    nstf_text t = {0};
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) nstf_text_add(&t, buf, k);
    const bool bad_read = ferror(f);
    fclose(f);
    if (bad_read || t.oom) {
        free(t.p);
        return nstf_set_error(bad_read ? NSTF_ERR_IO : NSTF_ERR_OOM, "cannot read %s", path);
    }
    cJSON *root = cJSON_ParseWithLength(t.p ? t.p : "", t.len);
    free(t.p);
    const cJSON *sys = root ? cJSON_GetObjectItem(root, "system") : NULL,
                *msgs = root ? cJSON_GetObjectItem(root, "messages") : NULL;
    nstf_status r = NSTF_OK;
    if (!root || !cJSON_IsArray(msgs) || (sys && !cJSON_IsString(sys) && !cJSON_IsNull(sys)))
        r = nstf_set_error(NSTF_ERR_FORMAT, "%s is not a saved conversation (want {\"system\": ..., \"messages\": [...]})",
                           path);
    /* check every message before replacing anything */
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        if (r != NSTF_OK) break;
        const cJSON *role = cJSON_GetObjectItem(m, "role"), *content = cJSON_GetObjectItem(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content) ||
            (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
            r = nstf_set_error(NSTF_ERR_FORMAT, "%s: message %d needs a role (user or assistant) and a content string",
                               path, i);
        else if (nstf_utf8_check((const uint8_t *)content->valuestring, strlen(content->valuestring), NULL) >= 0)
            r = nstf_set_error(NSTF_ERR_FORMAT, "%s: message %d is not valid UTF-8", path, i);
        i++;
    }
    if (r == NSTF_OK) r = set_system(c, cJSON_IsString(sys) ? sys->valuestring : NULL);
    if (r == NSTF_OK) {
        reset(c);
        cJSON_ArrayForEach(m, msgs) {
            const char *role = cJSON_GetObjectItem(m, "role")->valuestring, *text = cJSON_GetObjectItem(m, "content")->valuestring;
            if (r == NSTF_OK) r = push(c, !strcmp(role, "user") ? "user" : "assistant", text, strlen(text));
        }
        if (r != NSTF_OK) reset(c);
    }
    cJSON_Delete(root);
    return r;
}
