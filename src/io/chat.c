/* chat.c — chat prompts from tokenizer.chat_template, without a Jinja engine.
 *
 * The template string is only used to recognise the family, as llama.cpp's
 * llm_chat_apply_template does; each family is then rendered by hand:
 *   ChatML   "<|im_start|>"        <|im_start|>{role}\n{content}<|im_end|>\n
 *            When the template inserts a default system message for chats
 *            that do not open with one (SmolLM2, Qwen), the literal text of
 *            that message is lifted from the template and inserted too.
 *   Llama-3  "<|start_header_id|>" <|start_header_id|>{role}<|end_header_id|>\n\n
 *                                  {trimmed content}<|eot_id|>
 *   Mistral  "[INST]" and "[SYSTEM_PROMPT]" (v7), "' [INST] ' + system_message"
 *            (v1) or "[AVAILABLE_TOOLS]" (v3; v3-tekken when it writes
 *            "[INST]" unspaced), llama.cpp's detection and renderings:
 *            v1  " [INST] {sys}\n\n{user} [/INST] {assistant}</s>"
 *            v3  "[INST] {sys}\n\n{user}[/INST] {trimmed assistant}</s>"
 *            v3-tekken "[INST]{sys}\n\n{user}[/INST]{assistant}</s>"
 *            v7  "[SYSTEM_PROMPT] {sys}[/SYSTEM_PROMPT][INST] {user}[/INST] {assistant}</s>"
 *            (the system prompt opens the first turn, where llama.cpp puts it)
 *   Llama-2  other "[INST]"        [INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{user} [/INST]
 *                                  {assistant}</s><s>[INST] ... (Mistral 7B v0.1/v0.2's
 *                                  template is this family without <<SYS>>)
 * ChatML's default system message: SmolLM2 writes it when messages[0] is
 * not a system message, Qwen2.5 in the else of "== 'system'"; Qwen3 has
 * none. No template at all renders plain ChatML. The rendered text has no
 * BOS.
 * nstf_chat_family names the family a template is recognised as, and
 * nstf_chat_family_template gives a template string that renders as a
 * named family (--chat-template). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* content with leading and trailing whitespace removed (llama.cpp's trim) */
static void sb_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && isspace((unsigned char)s[i])) i++;
    while (n > i && isspace((unsigned char)s[n - 1])) n--;
    sb_add(b, s + i, n - i);
}

/* The literal default system prompt of a ChatML template, unescaped, or
 * NULL (none, or not a plain string literal). Malloc'd. */
static char *chatml_default_system(const char *tmpl) {
    if (!strstr(tmpl, "messages[0]['role'] != 'system'") &&
        !strstr(tmpl, "messages[0][\"role\"] != \"system\"") &&
        !strstr(tmpl, "messages[0].role != 'system'") && !strstr(tmpl, "messages[0]['role'] == 'system'") &&
        !strstr(tmpl, "messages[0].role == 'system'"))
        return NULL;
    /* the first occurrence whose text up to <|im_end|> is a plain literal */
    static const char *const heads[] = {"<|im_start|>system\n", "<|im_start|>system\\n"};
    for (size_t h = 0; h < 2; h++) {
        for (const char *p = strstr(tmpl, heads[h]); p; p = strstr(p, heads[h])) {
            p += strlen(heads[h]);
            const char *end = strstr(p, "<|im_end|>");
            if (!end) break;
            if (memchr(p, '\'', (size_t)(end - p)) || memchr(p, '"', (size_t)(end - p)) ||
                memchr(p, '{', (size_t)(end - p)))
                continue; /* an expression, not a literal */
            char *out = malloc((size_t)(end - p) + 1);
            if (!out) return NULL;
            size_t k = 0;
            for (const char *q = p; q < end; q++) {
                if (*q == '\\' && q + 1 < end) {
                    q++;
                    out[k++] = *q == 'n' ? '\n' : *q == 't' ? '\t' : *q;
                } else out[k++] = *q;
            }
            out[k] = 0;
            return out;
        }
    }
    return NULL;
}

/* Each message as pre + role + mid + content (stripped if trim) + post. */
static void render_turns(sbuf *b, const nstf_chat_msg *msgs, int n, const char *pre, const char *mid,
                         const char *post, bool trim) {
    for (int i = 0; i < n; i++) {
        sb_puts(b, pre);
        sb_puts(b, msgs[i].role);
        sb_puts(b, mid);
        if (trim) sb_trimmed(b, msgs[i].content);
        else sb_puts(b, msgs[i].content);
        sb_puts(b, post);
    }
}

static nstf_status render_chatml(sbuf *b, const char *tmpl, const nstf_chat_msg *msgs, int n, bool gen) {
    if (tmpl && (n == 0 || strcmp(msgs[0].role, "system") != 0)) {
        char *sys = chatml_default_system(tmpl);
        if (sys) {
            sb_puts(b, "<|im_start|>system\n");
            sb_puts(b, sys);
            sb_puts(b, "<|im_end|>\n");
            free(sys);
        }
    }
    render_turns(b, msgs, n, "<|im_start|>", "\n", "<|im_end|>\n", false);
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
    return NSTF_OK;
}

static nstf_status render_llama3(sbuf *b, const nstf_chat_msg *msgs, int n, bool gen) {
    render_turns(b, msgs, n, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true);
    if (gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return NSTF_OK;
}

/* llama.cpp's Llama-2 variants: <<SYS>> only if the template has it, <s>
 * between turns if it writes bos_token + '[INST]', contents stripped if it
 * calls .strip(). The generation prompt is implicit after [/INST]. */
static nstf_status render_llama2(sbuf *b, const char *tmpl, const nstf_chat_msg *msgs, int n) {
    bool sys_block = strstr(tmpl, "<<SYS>>") != NULL;
    bool bos_inside = strstr(tmpl, "bos_token + '[INST]") != NULL;
    bool strip = strstr(tmpl, "content.strip()") != NULL;
    bool inside_turn = true;
    sb_puts(b, "[INST] ");
    for (int i = 0; i < n; i++) {
        if (!inside_turn) {
            inside_turn = true;
            sb_puts(b, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        const char *role = msgs[i].role;
        sbuf c = {0};
        if (strip) sb_trimmed(&c, msgs[i].content);
        else sb_puts(&c, msgs[i].content);
        const char *content = c.p ? c.p : "";
        if (strcmp(role, "system") == 0) {
            if (sys_block) {
                sb_puts(b, "<<SYS>>\n");
                sb_puts(b, content);
                sb_puts(b, "\n<</SYS>>\n\n");
            } else {
                sb_puts(b, content);
                sb_puts(b, "\n");
            }
        } else if (strcmp(role, "user") == 0) {
            sb_puts(b, content);
            sb_puts(b, " [/INST]");
        } else {
            sb_puts(b, content);
            sb_puts(b, "</s>");
            inside_turn = false;
        }
        if (c.oom) b->oom = true;
        free(c.p);
    }
    return NSTF_OK;
}

typedef enum { MISTRAL_V1, MISTRAL_V3, MISTRAL_V3_TEKKEN, MISTRAL_V7 } mistral_kind;

/* llama.cpp's Mistral renderings (llm_chat_apply_template); the
 * generation prompt is implicit after [/INST]. */
static nstf_status render_mistral(sbuf *b, mistral_kind k, const nstf_chat_msg *msgs, int n) {
    if (k == MISTRAL_V7) {
        for (int i = 0; i < n; i++) {
            const char *role = msgs[i].role;
            if (!strcmp(role, "system")) {
                sb_puts(b, "[SYSTEM_PROMPT] ");
                sb_puts(b, msgs[i].content);
                sb_puts(b, "[/SYSTEM_PROMPT]");
            } else if (!strcmp(role, "user")) {
                sb_puts(b, "[INST] ");
                sb_puts(b, msgs[i].content);
                sb_puts(b, "[/INST]");
            } else {
                sb_puts(b, " ");
                sb_puts(b, msgs[i].content);
                sb_puts(b, "</s>");
            }
        }
        return NSTF_OK;
    }
    const char *lead = k == MISTRAL_V1 ? " " : "", *trail = k == MISTRAL_V3_TEKKEN ? "" : " ";
    bool inside = false;
    for (int i = 0; i < n; i++) {
        if (!inside) {
            sb_puts(b, lead);
            sb_puts(b, "[INST]");
            sb_puts(b, trail);
            inside = true;
        }
        const char *role = msgs[i].role;
        if (!strcmp(role, "system")) {
            sb_puts(b, msgs[i].content);
            sb_puts(b, "\n\n");
        } else if (!strcmp(role, "user")) {
            sb_puts(b, msgs[i].content);
            sb_puts(b, lead);
            sb_puts(b, "[/INST]");
        } else {
            sb_puts(b, trail);
            if (k == MISTRAL_V3) sb_trimmed(b, msgs[i].content);
            else sb_puts(b, msgs[i].content);
            sb_puts(b, "</s>");
            inside = false;
        }
    }
    return NSTF_OK;
}

const char *nstf_chat_family(const char *tmpl) {
    if (!tmpl || strstr(tmpl, "<|im_start|>")) return "chatml";
    if (strstr(tmpl, "<|start_header_id|>")) return "llama3";
    if (strstr(tmpl, "[INST]")) {
        /* llama.cpp's Mistral detection */
        if (strstr(tmpl, "[SYSTEM_PROMPT]")) return "mistral-v7";
        if (strstr(tmpl, "' [INST] ' + system_message") || strstr(tmpl, "[AVAILABLE_TOOLS]"))
            return strstr(tmpl, " [INST]")       ? "mistral-v1"
                   : strstr(tmpl, "\"[INST]\"") ? "mistral-v3-tekken"
                                                : "mistral-v3";
        return "llama2";
    }
    return NULL;
}

const char *nstf_chat_family_template(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "chatml")) return "<|im_start|>";
    if (!strcmp(name, "llama3")) return "<|start_header_id|>";
    if (!strcmp(name, "llama2")) return "[INST] <<SYS>> content.strip()";
    if (!strcmp(name, "mistral-v1")) return "' [INST] ' + system_message";
    if (!strcmp(name, "mistral-v3")) return "[INST][AVAILABLE_TOOLS]";
    if (!strcmp(name, "mistral-v3-tekken")) return "\"[INST]\"[AVAILABLE_TOOLS]";
    if (!strcmp(name, "mistral-v7")) return "[INST][SYSTEM_PROMPT]";
    return NULL;
}

char *nstf_chat_template_of(const nstf_gguf *g) {
    const nstf_gguf_kv *kv = g ? nstf_gguf_find_kv(g, "tokenizer.chat_template") : NULL;
    if (!kv || kv->type != NSTF_GGUF_STRING) return NULL;
    char *tmpl = malloc((size_t)kv->val.str.len + 1);
    if (!tmpl) return NULL;
    memcpy(tmpl, kv->val.str.ptr, (size_t)kv->val.str.len);
    tmpl[kv->val.str.len] = 0;
    return tmpl;
}

nstf_status nstf_chat_render_template(const char *tmpl, const nstf_chat_msg *msgs, int n_msgs,
                                      bool add_generation_prompt, char **out) {
    if (!out || n_msgs < 0 || (n_msgs > 0 && !msgs))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_chat_render: bad argument");
    *out = NULL;
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_chat_render: message %d has a NULL %s", i,
                                  msgs[i].role ? "content" : "role");
    sbuf b = {0};
    sb_add(&b, "", 0);
    const char *family = nstf_chat_family(tmpl);
    if (family && !strcmp(family, "chatml"))
        render_chatml(&b, tmpl, msgs, n_msgs, add_generation_prompt);
    else if (family && !strcmp(family, "llama3"))
        render_llama3(&b, msgs, n_msgs, add_generation_prompt);
    else if (family && !strncmp(family, "mistral-", 8))
        render_mistral(&b,
                       !strcmp(family, "mistral-v7")          ? MISTRAL_V7
                       : !strcmp(family, "mistral-v1")        ? MISTRAL_V1
                       : !strcmp(family, "mistral-v3-tekken") ? MISTRAL_V3_TEKKEN
                                                              : MISTRAL_V3,
                       msgs, n_msgs);
    else if (family)
        render_llama2(&b, tmpl, msgs, n_msgs);
    else {
        free(b.p);
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "chat template not recognised (ChatML, Llama-3, Mistral and Llama-2 are supported): "
                              "\"%.60s%s\"", tmpl, strlen(tmpl) > 60 ? "..." : "");
    }
    if (b.oom) {
        free(b.p);
        return nstf_set_error(NSTF_ERR_OOM, "nstf_chat_render: out of memory");
    }
    *out = b.p;
    return NSTF_OK;
}

nstf_status nstf_chat_render(const nstf_gguf *g, const nstf_chat_msg *msgs, int n_msgs,
                             bool add_generation_prompt, char **out) {
    if (!g || !out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_chat_render: NULL argument");
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, "tokenizer.chat_template");
    if (!kv) return nstf_chat_render_template(NULL, msgs, n_msgs, add_generation_prompt, out);
    if (kv->type != NSTF_GGUF_STRING)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tokenizer.chat_template is not a string",
                              g->path ? g->path : "gguf");
    char *tmpl = nstf_chat_template_of(g);
    if (!tmpl) return nstf_set_error(NSTF_ERR_OOM, "nstf_chat_render: out of memory");
    nstf_status s = nstf_chat_render_template(tmpl, msgs, n_msgs, add_generation_prompt, out);
    free(tmpl);
    return s;
}
