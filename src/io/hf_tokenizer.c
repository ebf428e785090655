/* hf_tokenizer.c — tokenizer.json + tokenizer_config.json as the GGUF
 * tokenizer.ggml.* key/values that io/tokenizer.c reads, as llama.cpp's
 * converter writes them for byte-level BPE models:
 *   tokenizer.ggml.model "gpt2"; .pre from the pre-tokenizer (below);
 *   .tokens / .token_type in id order (added tokens: special -> control,
 *   others -> user-defined, unless they look like <|...|>; ids below the
 *   model's vocab_size that no token uses -> "[PAD<id>]", unused);
 *   .merges as "left right"; bos/eos/unk/padding ids; add_bos_token /
 *   add_eos_token; tokenizer.chat_template.
 *
 * Pre-tokenizers recognised (tokenizer.json "pre_tokenizer"):
 *   ByteLevel(use_regex)                                   -> "gpt-2"
 *   Sequence[Digits(individual), ByteLevel(use_regex)]      -> "smollm"
 *   Sequence[Split(Llama-3 regex, Isolated), ByteLevel(no regex)] -> "llama-bpe"
 *   Sequence[Split(Qwen2 regex, Isolated), ByteLevel(no regex)]   -> "qwen2"
 *   Sequence[Split(Tekken regex, Isolated), ByteLevel(no regex)]  -> "tekken"
 * always with add_prefix_space false, and no normalizer but NFC (Qwen's):
 * as llama.cpp, NSTF tokenizes text as given, so text that is not in NFC
 * may be split differently from HF (text almost always is in NFC). Anything
 * else is NSTF_ERR_UNSUPPORTED quoting what was found. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "io/hf_model.h"
#include "io/json.h"
#include "io/mapfile.h"
#include "io/tokenizer.h"

typedef unsigned long long ull;

#define MAX_TOKENIZER_JSON (512ull << 20)
#define MAX_CONFIG_JSON (64ull << 20)
#define MAX_VOCAB (1 << 24) /* the loader's limit */
#define MAX_TEMPLATE (1 << 20)

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

typedef struct {
    const char *path;        /* tokenizer.json, for messages */
    int64_t n;               /* tokens written */
    const char **text;       /* [n] (into the cJSON tree or pads) */
    int32_t *type;           /* [n] */
    char *pads;              /* "[PAD<id>]" texts, back to back */
    const cJSON *added;      /* added_tokens array (may be NULL) */
    const cJSON *vocab;      /* model.vocab object */
} vocab_build;

/* ---- pre-tokenizer --------------------------------------------------------- */

static bool is_type(const cJSON *o, const char *t) {
    const char *s = nstf_json_str(o, "type");
    return s && strcmp(s, t) == 0;
}

/* bool member `key` equals `want`; an absent key counts as `dflt` */
static bool flag_is(const cJSON *o, const char *key, bool dflt, bool want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return dflt == want;
    return cJSON_IsBool(v) && (cJSON_IsTrue(v) != 0) == want;
}

/* HF's ByteLevel defaults: add_prefix_space true, use_regex true */
static bool byte_level(const cJSON *o, bool use_regex) {
    return is_type(o, "ByteLevel") && flag_is(o, "add_prefix_space", true, false) &&
           flag_is(o, "use_regex", true, use_regex);
}

static const char *recognise_pre(const cJSON *pre) {
    if (byte_level(pre, true)) return "gpt-2"; /* llama.cpp's name; "gpt2" is not one */
    if (!is_type(pre, "Sequence")) return NULL;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (!cJSON_IsArray(seq) || cJSON_GetArraySize(seq) != 2) return NULL;
    const cJSON *a = seq->child, *b = a->next;
    if (is_type(a, "Digits") && flag_is(a, "individual_digits", false, true) && byte_level(b, true)) return "smollm";
    if (is_type(a, "Split") && byte_level(b, false) && flag_is(a, "invert", false, false)) {
        const char *behavior = nstf_json_str(a, "behavior");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(a, "pattern");
        const char *re = nstf_json_str(pat, "Regex");
        if (behavior && strcmp(behavior, "Isolated") == 0 && re) {
            if (strcmp(re, nstf_pre_regex_llama3) == 0) return "llama-bpe";
            if (strcmp(re, nstf_pre_regex_qwen2) == 0) return "qwen2";
            if (strcmp(re, nstf_pre_regex_tekken) == 0) return "tekken";
        }
    }
    return NULL;
}

static nstf_status unsupported_json(const char *path, const char *what, const cJSON *v) {
    char *txt = v ? cJSON_PrintUnformatted(v) : NULL;
    nstf_status s = nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: %s %.240s%s is not recognised (%s)", path, what,
                                   txt ? txt : "(none)", txt && strlen(txt) > 240 ? "..." : "",
                                   strcmp(what, "normalizer") == 0
                                       ? "byte-level BPE tokenizers have none, or NFC"
                                       : "recognised: GPT-2 byte-level, SmolLM2 digits + byte-level, Llama-3, "
                                         "Qwen2 and Tekken split regexes + byte-level");
    cJSON_free(txt);
    return s;
}

/* ---- vocabulary -------------------------------------------------------------- */

/* llama.cpp's does_token_look_special, for added tokens not marked special */
static bool looks_special(const char *s) {
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]")) return true;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return true;
    if (n >= 8 && !strncmp(s, "<\xef\xbd\x9c", 4) && !strcmp(s + n - 4, "\xef\xbd\x9c>")) return true; /* <｜ ｜> */
    return !strncmp(s, "<start_of_", 10) || !strncmp(s, "<end_of_", 8);
}

static nstf_status token_id(const vocab_build *v, const cJSON *e, const char *what, int64_t *id) {
    uint64_t x;
    if (!nstf_json_uint(e, &x))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s has an id that is not a non-negative integer", v->path, what);
    if (x >= (uint64_t)v->n)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: %s has id %llu, beyond the model's vocabulary of %lld (config.json vocab_size)",
                              v->path, what, (ull)x, (long long)v->n);
    *id = (int64_t)x;
    return NSTF_OK;
}

static nstf_status build_vocab(vocab_build *v) {
    char what[160];
    for (const cJSON *e = v->vocab->child; e; e = e->next) {
        int64_t id;
        snprintf(what, sizeof what, "token '%.64s'", e->string);
        NSTF_TRY(token_id(v, e, what, &id));
        if (v->text[id])
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tokens '%.64s' and '%.64s' have the same id %lld", v->path,
                                  v->text[id], e->string, (long long)id);
        v->text[id] = e->string;
        v->type[id] = TT_NORMAL;
    }
    int k = 0;
    for (const cJSON *e = v->added ? v->added->child : NULL; e; e = e->next, k++) {
        const char *content = nstf_json_str(e, "content");
        if (!content || !content[0])
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: added_tokens[%d] has no content", v->path, k);
        int64_t id;
        snprintf(what, sizeof what, "added token '%.64s'", content);
        NSTF_TRY(token_id(v, cJSON_GetObjectItemCaseSensitive(e, "id"), what, &id));
        v->text[id] = content;
        v->type[id] = flag_is(e, "special", false, true) || looks_special(content) ? TT_CONTROL : TT_USER_DEFINED;
    }
    uint64_t pad_bytes = 0;
    for (int64_t i = 0; i < v->n; i++)
        if (!v->text[i]) pad_bytes += 24;
    v->pads = nstf_alloc((size_t)pad_bytes + 1, "tokenizer pad tokens");
    if (!v->pads) return NSTF_ERR_OOM;
    char *p = v->pads;
    for (int64_t i = 0; i < v->n; i++)
        if (!v->text[i]) {
            v->text[i] = p;
            v->type[i] = TT_UNUSED;
            p += snprintf(p, 24, "[PAD%lld]", (long long)i) + 1;
        }
    return NSTF_OK;
}

/* The id of a token's text: added tokens first, then the vocabulary. */
static int64_t find_text(const vocab_build *v, const char *s) {
    for (const cJSON *e = v->added ? v->added->child : NULL; e; e = e->next) {
        const char *c = nstf_json_str(e, "content");
        uint64_t id;
        if (c && !strcmp(c, s) && nstf_json_uint(cJSON_GetObjectItemCaseSensitive(e, "id"), &id)) return (int64_t)id;
    }
    uint64_t id;
    return nstf_json_uint(cJSON_GetObjectItemCaseSensitive(v->vocab, s), &id) ? (int64_t)id : -1;
}

/* "left right" for each merge, whether stored as strings or as pairs */
static nstf_status write_merges(const vocab_build *v, const cJSON *merges, nstf_gguf_writer *w) {
    int n = cJSON_IsArray(merges) ? cJSON_GetArraySize(merges) : 0;
    if (merges && !cJSON_IsArray(merges))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: model.merges is not an array", v->path);
    const char **m = calloc((size_t)n + 1, sizeof *m);
    char **owned = calloc((size_t)n + 1, sizeof *owned);
    nstf_status s = m && owned ? NSTF_OK : nstf_set_error(NSTF_ERR_OOM, "tokenizer: out of memory for merges");
    int i = 0;
    for (const cJSON *e = merges ? merges->child : NULL; s == NSTF_OK && e; e = e->next, i++) {
        if (cJSON_IsString(e)) { m[i] = e->valuestring; continue; }
        const cJSON *a = cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 ? e->child : NULL;
        if (!a || !cJSON_IsString(a) || !cJSON_IsString(a->next)) {
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: merges[%d] is neither \"left right\" nor [left, right]", v->path, i);
            break;
        }
        size_t la = strlen(a->valuestring), lb = strlen(a->next->valuestring);
        owned[i] = malloc(la + lb + 2);
        if (!owned[i]) { s = nstf_set_error(NSTF_ERR_OOM, "tokenizer: out of memory for merges"); break; }
        memcpy(owned[i], a->valuestring, la);
        owned[i][la] = ' ';
        memcpy(owned[i] + la + 1, a->next->valuestring, lb + 1);
        m[i] = owned[i];
    }
    if (s == NSTF_OK) s = nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", m, (uint64_t)n);
    for (int k = 0; owned && k < n; k++) free(owned[k]);
    free(owned);
    free(m);
    return s;
}

/* ---- tokenizer_config.json ----------------------------------------------------------- */

/* A special token setting: "text", {"content": "text", ...} or null. */
static const char *special_text(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return nstf_json_str(v, "content");
}

/* tokenizer_config.json's token (by text), else config.json's id. */
static nstf_status special_id(const vocab_build *v, const char *cfg_path, const cJSON *tcfg, const cJSON *config,
                              const char *which, bool required, nstf_gguf_writer *w) {
    char key[64], gkey[64];
    snprintf(key, sizeof key, "%s_token", which);
    snprintf(gkey, sizeof gkey, "tokenizer.ggml.%s_token_id",
             !strcmp(which, "pad") ? "padding" : !strcmp(which, "unk") ? "unknown" : which);
    const char *text = special_text(tcfg, key);
    int64_t id = -1;
    if (text) {
        id = find_text(v, text);
        if (id < 0 && required)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s \"%.64s\" is not a token of the vocabulary", cfg_path, key,
                                  text);
    } else {
        snprintf(key, sizeof key, "%s_token_id", which);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(config, key);
        if (cJSON_IsArray(c)) c = c->child; /* eos_token_id: [128001, 128009] */
        uint64_t x;
        if (nstf_json_uint(c, &x)) id = (int64_t)x;
    }
    if (id < 0 || id >= v->n) return NSTF_OK;
    return nstf_gguf_writer_set_u32(w, gkey, (uint32_t)id);
}

/* add_bos_token from tokenizer_config.json, else from the post-processor:
 * a TemplateProcessing whose single-sequence template opens with the bos
 * token (Llama-3) adds it. */
static bool wants_bos(const cJSON *tcfg, const cJSON *tok, const char *bos) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(tcfg, "add_bos_token");
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(tok, "post_processor");
    if (is_type(pp, "Sequence")) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        for (pp = cJSON_IsArray(seq) ? seq->child : NULL; pp && !is_type(pp, "TemplateProcessing"); pp = pp->next) {}
    }
    if (!bos || !is_type(pp, "TemplateProcessing")) return false;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const char *id = nstf_json_str(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    return id && strcmp(id, bos) == 0;
}

static nstf_status write_chat_template(const char *dir, const cJSON *tcfg, nstf_gguf_writer *w) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(tcfg, "chat_template");
    if (cJSON_IsArray(t)) { /* [{"name": "default", "template": ...}, ...] */
        const cJSON *pick = NULL;
        for (const cJSON *e = t->child; e; e = e->next) {
            const char *name = nstf_json_str(e, "name");
            if (!pick || (name && !strcmp(name, "default"))) pick = e;
        }
        t = cJSON_GetObjectItemCaseSensitive(pick, "template");
    }
    if (cJSON_IsString(t)) return nstf_gguf_writer_set_str(w, "tokenizer.chat_template", t->valuestring);
    /* newer transformers save the template beside the config */
    char *p = nstf_path_join(dir, "chat_template.jinja");
    if (!p) return NSTF_ERR_OOM;
    FILE *f = fopen(p, "rb");
    nstf_status s = NSTF_OK;
    if (f) {
        fclose(f);
        const uint8_t *m;
        uint64_t n;
        s = nstf_map_file(p, "template", &m, &n);
        char *buf = NULL;
        if (s == NSTF_OK && (n > MAX_TEMPLATE || memchr(m, 0, (size_t)n)))
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: larger than %d bytes or holds a NUL byte", p, MAX_TEMPLATE);
        if (s == NSTF_OK && !(buf = malloc((size_t)n + 1))) s = nstf_set_error(NSTF_ERR_OOM, "out of host memory");
        if (s == NSTF_OK) {
            memcpy(buf, m, (size_t)n);
            buf[n] = 0;
            s = nstf_gguf_writer_set_str(w, "tokenizer.chat_template", buf);
        }
        free(buf);
        if (n) nstf_unmap_file(m, n);
    }
    free(p);
    return s;
}

/* ---- the whole tokenizer ----------------------------------------------------------------- */

static nstf_status tokenizer_kvs(vocab_build *v, const char *dir, const cJSON *tok, const cJSON *tcfg,
                                 const char *tcfg_path, const cJSON *config, nstf_gguf_writer *w) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
    const char *type = nstf_json_str(model, "type");
    if (!cJSON_IsObject(tok) || !type)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: no \"model\" object with a \"type\"", v->path);
    if (strcmp(type, "BPE") != 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: tokenizer model \"%.32s\" is not supported (byte-level BPE is)",
                              v->path, type);
    if (flag_is(model, "byte_fallback", false, true))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: BPE with byte_fallback (SentencePiece-style) is not supported (byte-level BPE is)",
                              v->path);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tok, "normalizer");
    if (norm && !cJSON_IsNull(norm) && !(is_type(norm, "NFC") && cJSON_GetArraySize(norm) == 1))
        return unsupported_json(v->path, "normalizer", norm);
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(tok, "pre_tokenizer");
    const char *pre_name = recognise_pre(pre);
    if (!pre_name) return unsupported_json(v->path, "pre-tokenizer", pre);
    v->vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    v->added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
    if (!cJSON_IsObject(v->vocab) || !v->vocab->child)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: model.vocab is not an object of tokens", v->path);
    if (v->added && !cJSON_IsArray(v->added))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: added_tokens is not an array", v->path);
    if (v->n <= 0) { /* no vocab_size in config.json: the tokenizer's extent */
        for (const cJSON *e = v->vocab->child; e; e = e->next) {
            uint64_t id;
            if (nstf_json_uint(e, &id) && (int64_t)id >= v->n) v->n = (int64_t)id + 1;
        }
        for (const cJSON *e = v->added ? v->added->child : NULL; e; e = e->next) {
            uint64_t id;
            if (nstf_json_uint(cJSON_GetObjectItemCaseSensitive(e, "id"), &id) && (int64_t)id >= v->n)
                v->n = (int64_t)id + 1;
        }
    }
    if (v->n < 1 || v->n > MAX_VOCAB)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: vocabulary of %lld tokens is implausible", v->path,
                              (long long)v->n);
    v->text = calloc((size_t)v->n, sizeof *v->text);
    v->type = calloc((size_t)v->n, sizeof *v->type);
    if (!v->text || !v->type) return nstf_set_error(NSTF_ERR_OOM, "tokenizer: out of memory for the vocabulary");
    NSTF_TRY(build_vocab(v));
    NSTF_TRY(nstf_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    NSTF_TRY(nstf_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre_name));
    NSTF_TRY(nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->text, (uint64_t)v->n));
    NSTF_TRY(nstf_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", NSTF_GGUF_INT32, v->type, (uint64_t)v->n));
    NSTF_TRY(write_merges(v, cJSON_GetObjectItemCaseSensitive(model, "merges"), w));
    NSTF_TRY(special_id(v, tcfg_path, tcfg, config, "bos", true, w));
    NSTF_TRY(special_id(v, tcfg_path, tcfg, config, "eos", true, w));
    const char *unk = nstf_json_str(model, "unk_token");
    int64_t unk_id = unk ? find_text(v, unk) : -1;
    if (unk_id >= 0 && unk_id < v->n) NSTF_TRY(nstf_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk_id));
    else NSTF_TRY(special_id(v, tcfg_path, tcfg, config, "unk", false, w));
    NSTF_TRY(special_id(v, tcfg_path, tcfg, config, "pad", false, w));
    NSTF_TRY(nstf_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", wants_bos(tcfg, tok, special_text(tcfg, "bos_token"))));
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(tcfg, "add_eos_token");
    if (cJSON_IsBool(eos)) NSTF_TRY(nstf_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", cJSON_IsTrue(eos)));
    return write_chat_template(dir, tcfg, w);
}

nstf_status nstf_hf_tokenizer_kvs(const char *dir, const cJSON *config, int64_t n_vocab, nstf_gguf_writer *w) {
    char *tok_path = nstf_path_join(dir, "tokenizer.json");
    char *cfg_path = nstf_path_join(dir, "tokenizer_config.json");
    cJSON *tok = NULL, *tcfg = NULL;
    vocab_build v = {.path = tok_path, .n = n_vocab};
    nstf_status s = tok_path && cfg_path ? NSTF_OK : NSTF_ERR_OOM;
    if (s == NSTF_OK) s = nstf_json_read_file(tok_path, MAX_TOKENIZER_JSON, &tok);
    if (s == NSTF_OK) {
        FILE *f = fopen(cfg_path, "rb"); /* optional */
        if (f) {
            fclose(f);
            s = nstf_json_read_file(cfg_path, MAX_CONFIG_JSON, &tcfg);
            if (s == NSTF_OK && !cJSON_IsObject(tcfg))
                s = nstf_set_error(NSTF_ERR_FORMAT, "%s: not a JSON object", cfg_path);
        }
    }
    if (s == NSTF_OK) s = tokenizer_kvs(&v, dir, tok, tcfg, cfg_path, config, w);
    free(v.text);
    free(v.type);
    nstf_free(v.pads);
    cJSON_Delete(tok);
    cJSON_Delete(tcfg);
    free(tok_path);
    free(cfg_path);
    return s;
}
