/* tokenizer.c — byte-level BPE ("gpt2") and SentencePiece BPE ("llama")
 * tokenizers built from GGUF metadata.
 *
 * Owns: a copy of every token's text (the tokenizer outlives the gguf), the
 * decoded bytes of every token (its "piece"), a text -> id hash map, for
 * gpt2 a (left id, right id) -> (rank, merged id) hash map built from
 * tokenizer.ggml.merges, the compiled PCRE2 pre-tokenizer regexes, and for
 * llama the scores and the <0xNN> byte tokens.
 *
 * Encoding, as llama.cpp does it:
 *   1. validate UTF-8 (offset of the first bad byte in the message);
 *   2. with parse_special, cut the text at occurrences of control and
 *      user-defined tokens, longest token first;
 *   3. gpt2: split each plain fragment with the pre-tokenizer regexes (each
 *      regex applied to the pieces the previous one produced; unmatched gaps
 *      are pieces too), then run BPE on the bytes of each piece: symbols
 *      start as the byte-level tokens of single bytes and the adjacent pair
 *      of lowest merge rank (leftmost on ties) is merged until none is left;
 *      a binary heap with lazy invalidation makes this O(n log n);
 *   4. llama: prefix a space at the start and after each special token
 *      (add_space_prefix), replace ' ' by U+2581, start from UTF-8 chars,
 *      merge the adjacent pair whose concatenation is the highest-scored
 *      token (leftmost on ties), and emit <0xNN> byte tokens for symbols
 *      that are not in the vocabulary.
 * Choices worth knowing: pre-tokenizer "default" is the GPT-2 regex (not
 * llama.cpp's four-regex default); llama3/llama-bpe set ignore_merges (a
 * pre-token that is itself a token is emitted whole, as HF does); a byte
 * with no byte-level token is dropped (HF and llama.cpp do the same;
 * SmolLM2 lacks 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2...);
 * user-defined tokens are matched only with parse_special (llama.cpp
 * matches them always); SentencePiece merges only into normal,
 * user-defined and unused pieces, as sentencepiece does. */
#include "io/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "io/utf8.h"

enum {
    TOKEN_TYPE_NORMAL = 1,
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,
    TOKEN_TYPE_USER_DEFINED = 4,
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
};

typedef enum tok_kind { TOK_KIND_GPT2, TOK_KIND_SPM } tok_kind;

#define MAX_REGEX 4

/* open-addressing map from a byte string (a token's text) to its id */
typedef struct str_map {
    int32_t *slots; /* token id or -1 */
    uint64_t mask;
} str_map;

/* open-addressing map from a (left id, right id) pair to a merge */
typedef struct merge_entry {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t id;   /* the merged token */
} merge_entry;

typedef struct merge_map {
    merge_entry *slots;
    uint64_t mask;
} merge_map;

struct nstf_tokenizer {
    tok_kind kind;
    int32_t n_vocab;
    int32_t bos, eos, unk;
    bool add_bos;
    bool add_space_prefix;
    bool ignore_merges;     /* a whole pre-token found in the vocab is one token (llama3) */

    char *text_blob;        /* token texts, back to back */
    uint64_t *text_off;     /* [n_vocab + 1] */
    char *piece_blob;       /* decoded bytes of each token */
    uint64_t *piece_off;    /* [n_vocab + 1] */
    uint8_t *type;          /* [n_vocab] token types (1..6) */
    bool *eog;              /* [n_vocab] */
    float *scores;          /* [n_vocab], llama only */
    str_map vocab;

    int32_t *special;       /* control + user-defined ids, longest text first */
    int32_t n_special;

    /* gpt2 */
    merge_map merges;
    int32_t byte_tok[256];  /* byte-level token of each single byte (-1 none); llama: <0xNN> */
    int n_regex;
    pcre2_code *regex[MAX_REGEX];
};

/* ---- small helpers ------------------------------------------------------- */

static void tok_note(const char *fmt, const char *arg) {
    fprintf(stderr, "nstf: note: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
}

static uint64_t hash_bytes(const char *s, uint64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static const char *tok_text(const nstf_tokenizer *t, int32_t id, uint64_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text_blob + t->text_off[id];
}

static int32_t vocab_find(const nstf_tokenizer *t, const char *s, uint64_t n) {
    const str_map *m = &t->vocab;
    for (uint64_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        uint64_t len;
        const char *txt = tok_text(t, id, &len);
        if (len == n && memcmp(txt, s, n) == 0) return id;
    }
}

static const merge_entry *merge_find(const merge_map *m, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    for (uint64_t i = hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        const merge_entry *e = &m->slots[i];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
    }
}

/* growable int32 output */
typedef struct id_vec {
    int32_t *v;
    int64_t n, cap;
} id_vec;

static nstf_status id_push(id_vec *o, int32_t id) {
    if (o->n == o->cap) {
        int64_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, (size_t)cap * sizeof *v);
        if (!v) return nstf_set_error(NSTF_ERR_OOM, "tokenizer: out of memory for %lld ids", (long long)cap);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return NSTF_OK;
}

/* UTF-8 length of the sequence starting with lead byte c (input already validated) */
static int utf8_len(uint8_t c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

static int utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's reversible byte <-> code point map: printable Latin-1 bytes map to
 * themselves, the other 68 to U+0100.. in byte order. */
static void gpt2_byte_map(uint32_t b2cp[256]) {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        b2cp[b] = keep ? b : 256 + extra++;
    }
}

/* ---- construction -------------------------------------------------------- */

void nstf_tokenizer_free(nstf_tokenizer *t) {
    if (!t) return;
    free(t->text_blob);
    free(t->text_off);
    free(t->piece_blob);
    free(t->piece_off);
    free(t->type);
    free(t->eog);
    free(t->scores);
    free(t->vocab.slots);
    free(t->special);
    free(t->merges.slots);
    for (int i = 0; i < t->n_regex; i++) pcre2_code_free(t->regex[i]);
    free(t);
}

const char *const nstf_pre_regex_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const char *const nstf_pre_regex_llama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const nstf_pre_regex_qwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const nstf_pre_regex_tekken =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static nstf_status add_regex(nstf_tokenizer *t, const char *pat) {
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return nstf_set_error(NSTF_ERR_INTERNAL, "tokenizer: regex /%s/ does not compile at %zu: %s",
                              pat, (size_t)eoff, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    t->regex[t->n_regex++] = re;
    return NSTF_OK;
}

static nstf_status setup_pre(nstf_tokenizer *t, const nstf_gguf *g) {
    nstf_gguf_str pre = {0, ""};
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, "tokenizer.ggml.pre");
    if (kv && kv->type == NSTF_GGUF_STRING) pre = kv->val.str;
    if (nstf_gguf_str_eq(pre, "smollm") || nstf_gguf_str_eq(pre, "starcoder") ||
        nstf_gguf_str_eq(pre, "refact")) {
        NSTF_TRY(add_regex(t, "\\p{N}"));
        return add_regex(t, nstf_pre_regex_gpt2);
    }
    if (nstf_gguf_str_eq(pre, "llama3") || nstf_gguf_str_eq(pre, "llama-v3") ||
        nstf_gguf_str_eq(pre, "llama-bpe")) {
        t->ignore_merges = true;
        return add_regex(t, nstf_pre_regex_llama3);
    }
    if (nstf_gguf_str_eq(pre, "qwen2") || nstf_gguf_str_eq(pre, "deepseek-r1-qwen"))
        return add_regex(t, nstf_pre_regex_qwen2);
    if (nstf_gguf_str_eq(pre, "tekken")) { /* Mistral Nemo and later */
        t->ignore_merges = true;
        return add_regex(t, nstf_pre_regex_tekken);
    }
    if (!(pre.len == 0 || nstf_gguf_str_eq(pre, "default") || nstf_gguf_str_eq(pre, "gpt-2") ||
          nstf_gguf_str_eq(pre, "gpt2"))) {
        char name[64];
        size_t n = pre.len < sizeof name - 1 ? (size_t)pre.len : sizeof name - 1;
        memcpy(name, pre.ptr, n);
        name[n] = 0;
        tok_note("tokenizer.ggml.pre \"%s\" is not known; using the GPT-2 pre-tokenizer", name);
    }
    return add_regex(t, nstf_pre_regex_gpt2);
}

/* special tokens are sorted as (length, id) pairs: longest first */
typedef struct special_key {
    uint64_t len;
    int32_t id;
} special_key;

static int cmp_special_key(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool is_eog_text(const char *s, uint64_t n) {
    static const char *const names[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>",
                                        "<|endoftext|>", "</s>", "<|end|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return true;
    return false;
}

/* Optional token id key: absent -> -1; present but out of range -> error. */
static nstf_status get_token_id(const nstf_gguf *g, const char *key, int32_t n_vocab, int32_t *out) {
    *out = -1;
    if (!nstf_gguf_find_kv(g, key)) return NSTF_OK;
    uint32_t v;
    NSTF_TRY(nstf_gguf_get_u32(g, key, &v));
    if (v >= (uint32_t)n_vocab)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s = %u is not below the vocabulary size %d",
                              g->path ? g->path : "gguf", key, v, n_vocab);
    *out = (int32_t)v;
    return NSTF_OK;
}

static int hex_val(uint8_t c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
         : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static nstf_status build_pieces(nstf_tokenizer *t) {
    /* a piece is never longer than its text (byte-level decode shrinks,
     * U+2581 -> ' ' shrinks, <0xNN> -> 1 byte) */
    uint64_t total = t->text_off[t->n_vocab];
    t->piece_blob = nstf_alloc(total ? total : 1, "tokenizer pieces");
    t->piece_off = nstf_alloc(((size_t)t->n_vocab + 1) * sizeof(uint64_t), "tokenizer piece offsets");
    if (!t->piece_blob || !t->piece_off) return NSTF_ERR_OOM;
    int32_t cp2b[512];
    if (t->kind == TOK_KIND_GPT2) {
        uint32_t b2cp[256];
        gpt2_byte_map(b2cp);
        for (int i = 0; i < 512; i++) cp2b[i] = -1;
        for (int b = 0; b < 256; b++) cp2b[b2cp[b]] = b;
    }
    uint64_t o = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint64_t n;
        const uint8_t *s = (const uint8_t *)tok_text(t, id, &n);
        char *dst = t->piece_blob + o;
        uint64_t w = 0;
        int ty = t->type[id];
        if (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED || ty == TOKEN_TYPE_UNKNOWN) {
            memcpy(dst, s, n);
            w = n;
        } else if (t->kind == TOK_KIND_SPM && ty == TOKEN_TYPE_BYTE && n == 6 && s[0] == '<' &&
                   s[1] == '0' && s[2] == 'x' && s[5] == '>') {
            int hi = hex_val(s[3]), lo = hex_val(s[4]);
            if (hi >= 0 && lo >= 0) dst[w++] = (char)(hi * 16 + lo);
            else { memcpy(dst, s, n); w = n; }
        } else if (t->kind == TOK_KIND_SPM) {
            for (uint64_t i = 0; i < n;) {
                if (n - i >= 3 && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
                    dst[w++] = ' ';
                    i += 3;
                } else dst[w++] = (char)s[i++];
            }
        } else {
            /* byte-level: each code point of the text is one byte */
            for (uint64_t i = 0; i < n;) {
                int l = utf8_len(s[i]);
                if ((uint64_t)l > n - i) l = (int)(n - i);
                uint32_t cp = s[i];
                if (l == 2) cp = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
                if (l <= 2 && cp < 512 && cp2b[cp] >= 0) dst[w++] = (char)cp2b[cp];
                else { memcpy(dst + w, s + i, (size_t)l); w += (uint64_t)l; }
                i += (uint64_t)l;
            }
        }
        t->piece_off[id] = o;
        o += w;
    }
    t->piece_off[t->n_vocab] = o;
    return NSTF_OK;
}

static nstf_status build_merges(nstf_tokenizer *t, const nstf_gguf *g) {
    const nstf_gguf_kv *mk;
    nstf_status s = nstf_gguf_get_arr(g, "tokenizer.ggml.merges", NSTF_GGUF_STRING, &mk);
    if (s != NSTF_OK) return nstf_wrap_error(s, "gpt2 tokenizer");
    uint64_t cap = pow2_at_least(mk->arr_n * 2 + 1);
    t->merges.slots = nstf_alloc(cap * sizeof(merge_entry), "tokenizer merges");
    if (!t->merges.slots) return NSTF_ERR_OOM;
    t->merges.mask = cap - 1;
    for (uint64_t i = 0; i < cap; i++) t->merges.slots[i].key = UINT64_MAX;
    uint64_t skipped = 0;
    char *buf = NULL;
    uint64_t buf_cap = 0;
    for (uint64_t r = 0; r < mk->arr_n && r < INT32_MAX; r++) {
        nstf_gguf_str m = mk->arr_strs[r];
        /* "left right": split at the first space after the first byte (a
         * left part may itself start with the byte-level space marker) */
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp) { skipped++; continue; }
        uint64_t nl = (uint64_t)(sp - m.ptr), nr = m.len - nl - 1;
        int32_t l = vocab_find(t, m.ptr, nl), rr = vocab_find(t, sp + 1, nr);
        if (m.len > buf_cap) {
            char *nb = realloc(buf, m.len);
            if (!nb) { free(buf); return nstf_set_error(NSTF_ERR_OOM, "tokenizer: out of memory"); }
            buf = nb;
            buf_cap = m.len;
        }
        memcpy(buf, m.ptr, nl);
        memcpy(buf + nl, sp + 1, nr);
        int32_t id = vocab_find(t, buf, nl + nr);
        if (l < 0 || rr < 0 || id < 0) { skipped++; continue; }
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)rr;
        uint64_t j = hash_u64(key) & t->merges.mask;
        while (t->merges.slots[j].key != UINT64_MAX && t->merges.slots[j].key != key)
            j = (j + 1) & t->merges.mask;
        if (t->merges.slots[j].key == key) continue; /* first (lowest) rank wins */
        t->merges.slots[j] = (merge_entry){key, (int32_t)r, id};
    }
    free(buf);
    if (skipped) {
        char msg[32];
        snprintf(msg, sizeof msg, "%llu", (unsigned long long)skipped);
        tok_note("%s tokenizer merges name tokens not in the vocabulary; ignored", msg);
    }
    return NSTF_OK;
}

static nstf_status tokenizer_load(nstf_tokenizer *t, const nstf_gguf *g) {
    const char *path = g->path ? g->path : "gguf";
    nstf_gguf_str model;
    nstf_status s = nstf_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s != NSTF_OK) return nstf_wrap_error(s, "tokenizer");
    if (nstf_gguf_str_eq(model, "gpt2")) t->kind = TOK_KIND_GPT2;
    else if (nstf_gguf_str_eq(model, "llama")) t->kind = TOK_KIND_SPM;
    else
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: tokenizer.ggml.model \"%.*s\" is not supported (gpt2, llama are)",
                              path, (int)(model.len > 64 ? 64 : model.len), model.ptr);

    const nstf_gguf_kv *tk;
    NSTF_TRY(nstf_gguf_get_arr(g, "tokenizer.ggml.tokens", NSTF_GGUF_STRING, &tk));
    if (tk->arr_n == 0 || tk->arr_n > INT32_MAX / 2)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path,
                              (unsigned long long)tk->arr_n);
    t->n_vocab = (int32_t)tk->arr_n;
    size_t nv = (size_t)t->n_vocab;

    uint64_t total = 0;
    for (size_t i = 0; i < nv; i++)
        if (!nstf_add_ok(total, tk->arr_strs[i].len, &total))
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: token texts too large", path);
    t->text_blob = nstf_alloc(total ? total : 1, "tokenizer texts");
    t->text_off = nstf_alloc((nv + 1) * sizeof(uint64_t), "tokenizer text offsets");
    t->type = nstf_alloc(nv, "tokenizer types");
    t->eog = nstf_calloc(nv, sizeof(bool), "tokenizer eog");
    if (!t->text_blob || !t->text_off || !t->type || !t->eog) return NSTF_ERR_OOM;
    uint64_t o = 0;
    for (size_t i = 0; i < nv; i++) {
        memcpy(t->text_blob + o, tk->arr_strs[i].ptr, tk->arr_strs[i].len);
        t->text_off[i] = o;
        o += tk->arr_strs[i].len;
    }
    t->text_off[nv] = o;

    /* token types (default normal) */
    const nstf_gguf_kv *ty = nstf_gguf_find_kv(g, "tokenizer.ggml.token_type");
    memset(t->type, TOKEN_TYPE_NORMAL, nv);
    if (ty) {
        NSTF_TRY(nstf_gguf_get_arr(g, "tokenizer.ggml.token_type", NSTF_GGUF_INT32, &ty));
        if (ty->arr_n != (uint64_t)nv)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries, tokens %d",
                                  path, (unsigned long long)ty->arr_n, t->n_vocab);
        const uint8_t *d = ty->arr_data;
        for (size_t i = 0; i < nv; i++) {
            int32_t v;
            memcpy(&v, d + 4 * i, 4);
            t->type[i] = (v >= 1 && v <= 6) ? (uint8_t)v : TOKEN_TYPE_NORMAL;
        }
    }

    /* text -> id map; the first id of a duplicated text wins */
    uint64_t cap = pow2_at_least((uint64_t)nv * 2);
    t->vocab.slots = nstf_alloc(cap * sizeof(int32_t), "tokenizer vocab map");
    if (!t->vocab.slots) return NSTF_ERR_OOM;
    t->vocab.mask = cap - 1;
    for (uint64_t i = 0; i < cap; i++) t->vocab.slots[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint64_t n;
        const char *txt = tok_text(t, id, &n);
        if (vocab_find(t, txt, n) >= 0) continue;
        uint64_t j = hash_bytes(txt, n) & t->vocab.mask;
        while (t->vocab.slots[j] >= 0) j = (j + 1) & t->vocab.mask;
        t->vocab.slots[j] = id;
    }

    NSTF_TRY(get_token_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos));
    NSTF_TRY(get_token_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos));
    NSTF_TRY(get_token_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk));
    int32_t eot;
    NSTF_TRY(get_token_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &eot));
    bool spm = t->kind == TOK_KIND_SPM;
    t->add_bos = nstf_gguf_get_bool_or(g, "tokenizer.ggml.add_bos_token", spm);
    t->add_space_prefix = nstf_gguf_get_bool_or(g, "tokenizer.ggml.add_space_prefix", spm);
    if (spm && t->unk < 0) {
        for (int32_t id = 0; id < t->n_vocab && t->unk < 0; id++)
            if (t->type[id] == TOKEN_TYPE_UNKNOWN) t->unk = id;
    }

    /* end of generation */
    if (t->eos >= 0) t->eog[t->eos] = true;
    if (eot >= 0) t->eog[eot] = true;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint64_t n;
        const char *txt = tok_text(t, id, &n);
        if (t->type[id] == TOKEN_TYPE_CONTROL && is_eog_text(txt, n)) t->eog[id] = true;
    }

    /* special tokens, longest first */
    int32_t n_sp = 0;
    for (size_t i = 0; i < nv; i++)
        if ((t->type[i] == TOKEN_TYPE_CONTROL || t->type[i] == TOKEN_TYPE_USER_DEFINED) &&
            t->text_off[i + 1] > t->text_off[i])
            n_sp++;
    if (n_sp) {
        special_key *keys = nstf_alloc((size_t)n_sp * sizeof *keys, "tokenizer specials");
        t->special = nstf_alloc((size_t)n_sp * sizeof(int32_t), "tokenizer specials");
        if (!keys || !t->special) { free(keys); return NSTF_ERR_OOM; }
        int32_t k = 0;
        for (size_t i = 0; i < nv; i++)
            if ((t->type[i] == TOKEN_TYPE_CONTROL || t->type[i] == TOKEN_TYPE_USER_DEFINED) &&
                t->text_off[i + 1] > t->text_off[i])
                keys[k++] = (special_key){t->text_off[i + 1] - t->text_off[i], (int32_t)i};
        qsort(keys, (size_t)n_sp, sizeof *keys, cmp_special_key);
        for (int32_t i = 0; i < n_sp; i++) t->special[i] = keys[i].id;
        t->n_special = n_sp;
        free(keys);
    }

    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    if (t->kind == TOK_KIND_GPT2) {
        uint32_t b2cp[256];
        gpt2_byte_map(b2cp);
        for (int b = 0; b < 256; b++) {
            char u[4];
            int n = utf8_put(b2cp[b], u);
            t->byte_tok[b] = vocab_find(t, u, (uint64_t)n);
        }
        NSTF_TRY(build_merges(t, g));
        NSTF_TRY(setup_pre(t, g));
    } else {
        const nstf_gguf_kv *sk = NULL;
        if (nstf_gguf_find_kv(g, "tokenizer.ggml.scores"))
            NSTF_TRY(nstf_gguf_get_arr(g, "tokenizer.ggml.scores", NSTF_GGUF_FLOAT32, &sk));
        else
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: llama tokenizer without tokenizer.ggml.scores", path);
        if (sk->arr_n != (uint64_t)nv)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tokenizer.ggml.scores has %llu entries, tokens %d",
                                  path, (unsigned long long)sk->arr_n, t->n_vocab);
        t->scores = nstf_alloc(nv * sizeof(float), "tokenizer scores");
        if (!t->scores) return NSTF_ERR_OOM;
        memcpy(t->scores, sk->arr_data, nv * sizeof(float));
        for (int b = 0; b < 256; b++) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            t->byte_tok[b] = vocab_find(t, hex, 6);
        }
    }
    return build_pieces(t);
}

nstf_status nstf_tokenizer_from_gguf(const nstf_gguf *g, nstf_tokenizer **out) {
    if (!g || !out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_tokenizer_from_gguf: NULL argument");
    *out = NULL;
    nstf_tokenizer *t = nstf_calloc(1, sizeof *t, "tokenizer");
    if (!t) return NSTF_ERR_OOM;
    nstf_status s = tokenizer_load(t, g);
    if (s != NSTF_OK) {
        nstf_tokenizer_free(t);
        return s;
    }
    *out = t;
    return NSTF_OK;
}

/* ---- accessors ----------------------------------------------------------- */

int32_t nstf_tokenizer_n_vocab(const nstf_tokenizer *t) { return t->n_vocab; }
int32_t nstf_tokenizer_bos(const nstf_tokenizer *t) { return t->bos; }
int32_t nstf_tokenizer_eos(const nstf_tokenizer *t) { return t->eos; }
bool nstf_tokenizer_wants_bos(const nstf_tokenizer *t) { return t->add_bos; }

bool nstf_tokenizer_is_eog(const nstf_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

/* ---- encoding ------------------------------------------------------------ */

/* binary min-heap of candidate merges; `key` orders them (rank for gpt2,
 * -score for llama), then the left position */
typedef struct heap_item {
    float key;
    int32_t left, right;
    int32_t a, b; /* gpt2: the ids of left and right; llama: their byte lengths */
} heap_item;

typedef struct enc_state {
    const nstf_tokenizer *t;
    id_vec *out;
    /* symbols: a doubly linked list over positions 0..n-1 */
    int32_t *sym_id, *sym_prev, *sym_next;
    int32_t *sym_off, *sym_len; /* llama: byte range of the symbol */
    heap_item *heap;
    int64_t n_heap, cap_heap;
    char *buf;                  /* gpt2 ignore_merges: byte-level text of a word; llama: escaped text */
    pcre2_match_data *md[MAX_REGEX];
} enc_state;

static bool heap_less(const heap_item *x, const heap_item *y) {
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

static void heap_push(enc_state *e, heap_item it) {
    /* capacity is sized up front: every merge adds at most two items */
    int64_t i = e->n_heap++;
    e->heap[i] = it;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_less(&e->heap[i], &e->heap[p])) break;
        heap_item tmp = e->heap[i];
        e->heap[i] = e->heap[p];
        e->heap[p] = tmp;
        i = p;
    }
}

static heap_item heap_pop(enc_state *e) {
    heap_item top = e->heap[0];
    e->heap[0] = e->heap[--e->n_heap];
    int64_t i = 0, n = e->n_heap;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(&e->heap[l], &e->heap[m])) m = l;
        if (r < n && heap_less(&e->heap[r], &e->heap[m])) m = r;
        if (m == i) break;
        heap_item tmp = e->heap[i];
        e->heap[i] = e->heap[m];
        e->heap[m] = tmp;
        i = m;
    }
    return top;
}

static void gpt2_try_pair(enc_state *e, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    int32_t a = e->sym_id[l], b = e->sym_id[r];
    if (a < 0 || b < 0) return;
    const merge_entry *m = merge_find(&e->t->merges, a, b);
    if (m) heap_push(e, (heap_item){(float)m->rank, l, r, a, b});
}

/* BPE over the bytes of one pre-token. */
static nstf_status gpt2_word(enc_state *e, const uint8_t *w, int32_t n) {
    const nstf_tokenizer *t = e->t;
    if (n <= 0) return NSTF_OK;
    if (t->ignore_merges) {
        uint32_t b2cp[256];
        gpt2_byte_map(b2cp);
        uint64_t k = 0;
        for (int32_t i = 0; i < n; i++) k += (uint64_t)utf8_put(b2cp[w[i]], e->buf + k);
        int32_t id = vocab_find(t, e->buf, k);
        if (id >= 0) return id_push(e->out, id);
    }
    for (int32_t i = 0; i < n; i++) {
        e->sym_id[i] = t->byte_tok[w[i]];
        e->sym_prev[i] = i - 1;
        e->sym_next[i] = i + 1 < n ? i + 1 : -1;
    }
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < n; i++) gpt2_try_pair(e, i, i + 1);
    while (e->n_heap) {
        heap_item it = heap_pop(e);
        int32_t l = it.left, r = it.right;
        /* stale: one side was merged away or changed since the push */
        if (e->sym_next[l] != r || e->sym_id[l] != it.a || e->sym_id[r] != it.b) continue;
        const merge_entry *m = merge_find(&t->merges, it.a, it.b);
        e->sym_id[l] = m->id;
        e->sym_id[r] = -2; /* dead */
        int32_t rn = e->sym_next[r];
        e->sym_next[l] = rn;
        if (rn >= 0) e->sym_prev[rn] = l;
        e->sym_next[r] = -1;
        gpt2_try_pair(e, e->sym_prev[l], l);
        gpt2_try_pair(e, l, rn);
    }
    for (int32_t i = 0; i >= 0; i = e->sym_next[i]) {
        /* a byte without a byte-level token is dropped, as HF and llama.cpp do */
        if (e->sym_id[i] >= 0) NSTF_TRY(id_push(e->out, e->sym_id[i]));
    }
    return NSTF_OK;
}

/* Apply regex `level` to s[0..n) and recurse on the matches and the gaps
 * between them; past the last regex, run BPE on the piece. */
static nstf_status gpt2_split(enc_state *e, int level, const uint8_t *s, size_t n) {
    if (n == 0) return NSTF_OK;
    if (level == e->t->n_regex) return gpt2_word(e, s, (int32_t)n);
    pcre2_code *re = e->t->regex[level];
    pcre2_match_data *md = e->md[level];
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return nstf_set_error(NSTF_ERR_INTERNAL, "tokenizer: pre-tokenizer regex failed: %s",
                                  (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) { /* empty match: step over one character */
            pos = m0 + (m0 < n ? (size_t)utf8_len(s[m0]) : 1);
            continue;
        }
        if (m0 > gap) NSTF_TRY(gpt2_split(e, level + 1, s + gap, m0 - gap));
        NSTF_TRY(gpt2_split(e, level + 1, s + m0, m1 - m0));
        pos = gap = m1;
    }
    if (gap < n) NSTF_TRY(gpt2_split(e, level + 1, s + gap, n - gap));
    return NSTF_OK;
}

static void spm_try_pair(enc_state *e, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const nstf_tokenizer *t = e->t;
    int32_t id = vocab_find(t, e->buf + e->sym_off[l], (uint64_t)e->sym_len[l] + (uint64_t)e->sym_len[r]);
    if (id < 0) return;
    /* sentencepiece merges into normal, user-defined and unused pieces only */
    int ty = t->type[id];
    if (ty != TOKEN_TYPE_NORMAL && ty != TOKEN_TYPE_USER_DEFINED && ty != TOKEN_TYPE_UNUSED) return;
    heap_push(e, (heap_item){-t->scores[id], l, r, e->sym_len[l], e->sym_len[r]});
}

/* SentencePiece BPE over e->buf[0..n) (already escaped). */
static nstf_status spm_text(enc_state *e, int32_t n) {
    const nstf_tokenizer *t = e->t;
    int32_t ns = 0;
    for (int32_t i = 0; i < n; ns++) {
        int32_t l = utf8_len((uint8_t)e->buf[i]);
        if (l > n - i) l = n - i;
        e->sym_off[ns] = i;
        e->sym_len[ns] = l;
        e->sym_prev[ns] = ns - 1;
        e->sym_next[ns] = -1;
        if (ns > 0) e->sym_next[ns - 1] = ns;
        i += l;
    }
    if (ns == 0) return NSTF_OK;
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < ns; i++) spm_try_pair(e, i, i + 1);
    while (e->n_heap) {
        heap_item it = heap_pop(e);
        int32_t l = it.left, r = it.right;
        if (e->sym_len[l] != it.a || e->sym_len[r] != it.b || e->sym_next[l] != r) continue;
        e->sym_len[l] += e->sym_len[r];
        e->sym_len[r] = 0;
        int32_t rn = e->sym_next[r];
        e->sym_next[l] = rn;
        if (rn >= 0) e->sym_prev[rn] = l;
        e->sym_next[r] = -1;
        spm_try_pair(e, e->sym_prev[l], l);
        spm_try_pair(e, l, rn);
    }
    for (int32_t i = 0; i >= 0; i = e->sym_next[i]) {
        const char *s = e->buf + e->sym_off[i];
        int32_t id = vocab_find(t, s, (uint64_t)e->sym_len[i]);
        if (id >= 0) {
            NSTF_TRY(id_push(e->out, id));
            continue;
        }
        for (int32_t k = 0; k < e->sym_len[i]; k++) { /* byte fallback */
            int32_t b = t->byte_tok[(uint8_t)s[k]];
            if (b < 0) b = t->unk;
            if (b >= 0) NSTF_TRY(id_push(e->out, b));
            if (b == t->unk) break; /* one <unk> per symbol */
        }
    }
    return NSTF_OK;
}

/* A plain-text fragment (no special tokens inside). */
static nstf_status encode_fragment(enc_state *e, const char *s, size_t n, bool space_prefix) {
    if (e->t->kind == TOK_KIND_GPT2) return gpt2_split(e, 0, (const uint8_t *)s, n);
    /* llama: ' ' -> U+2581 (3 bytes); the buffer is sized for that */
    int32_t k = 0;
    if (space_prefix) { memcpy(e->buf, "\xE2\x96\x81", 3); k = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(e->buf + k, "\xE2\x96\x81", 3); k += 3; }
        else e->buf[k++] = s[i];
    }
    return spm_text(e, k);
}

/* a fragment of the input: plain text, or one special token */
typedef struct frag {
    int64_t off, len;
    int32_t id; /* -1: text */
} frag;

/* Cut the text fragments at every occurrence of each special token, longest
 * token first (llama.cpp's tokenizer_st_partition). */
static nstf_status split_special(const nstf_tokenizer *t, const char *text, frag **fr, int64_t *n_fr,
                                 int64_t *cap_fr) {
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint64_t sl;
        const char *st = tok_text(t, id, &sl);
        for (int64_t f = 0; f < *n_fr; f++) {
            if ((*fr)[f].id >= 0 || (uint64_t)(*fr)[f].len < sl) continue;
            const char *base = text + (*fr)[f].off;
            int64_t len = (*fr)[f].len, hit = -1;
            for (int64_t i = 0; i + (int64_t)sl <= len; i++) {
                const char *p = memchr(base + i, st[0], (size_t)(len - (int64_t)sl - i + 1));
                if (!p) break;
                i = p - base;
                if (memcmp(p, st, sl) == 0) { hit = i; break; }
            }
            if (hit < 0) continue;
            /* replace fragment f by [before][token][after] */
            if (*n_fr + 2 > *cap_fr) {
                int64_t cap = *cap_fr * 2 + 8;
                frag *nf = realloc(*fr, (size_t)cap * sizeof *nf);
                if (!nf) return nstf_set_error(NSTF_ERR_OOM, "tokenizer: out of memory");
                *fr = nf;
                *cap_fr = cap;
            }
            frag cur = (*fr)[f];
            frag parts[3];
            int np = 0;
            if (hit > 0) parts[np++] = (frag){cur.off, hit, -1};
            parts[np++] = (frag){cur.off + hit, (int64_t)sl, id};
            int64_t after = hit + (int64_t)sl;
            if (after < cur.len) parts[np++] = (frag){cur.off + after, cur.len - after, -1};
            memmove(*fr + f + np, *fr + f + 1, (size_t)(*n_fr - f - 1) * sizeof(frag));
            memcpy(*fr + f, parts, (size_t)np * sizeof(frag));
            *n_fr += np - 1;
            /* the loop's f++ lands on the text after the token, if any (it
             * may hold more occurrences) */
            f += np - 1 - (after < cur.len ? 1 : 0);
        }
    }
    return NSTF_OK;
}

nstf_status nstf_tokenizer_encode(const nstf_tokenizer *t, const char *text, size_t len,
                                  bool add_bos, bool parse_special, int32_t **ids, int64_t *n_ids) {
    if (!t || (!text && len) || !ids || !n_ids)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)INT32_MAX / 4)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_tokenizer_encode: text of %zu bytes is too long", len);
    const char *why = "";
    int64_t bad = nstf_utf8_check((const uint8_t *)text, len, &why);
    if (bad >= 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_tokenizer_encode: invalid UTF-8 at byte offset %lld (%s, byte 0x%02X)",
                              (long long)bad, why, (unsigned)(uint8_t)text[bad]);

    id_vec out = {0};
    enc_state e = {.t = t, .out = &out};
    frag *fr = NULL;
    int64_t n_fr = 0, cap_fr = 0;
    nstf_status s = NSTF_OK;
    if (add_bos && t->bos >= 0 && (s = id_push(&out, t->bos)) != NSTF_OK) goto done;
    if (len == 0) goto done;

    /* scratch sized for the whole text: symbols (one per byte; llama adds
     * 2 bytes per space and 3 for the prefix), heap (<= 3 items per symbol) */
    size_t n_sym = t->kind == TOK_KIND_SPM ? 3 * len + 3 : len + 1;
    size_t n_buf = t->kind == TOK_KIND_SPM ? 3 * len + 3 : 2 * len + 1;
    e.sym_id = malloc(n_sym * sizeof(int32_t));
    e.sym_prev = malloc(n_sym * sizeof(int32_t));
    e.sym_next = malloc(n_sym * sizeof(int32_t));
    e.sym_off = malloc(n_sym * sizeof(int32_t));
    e.sym_len = malloc(n_sym * sizeof(int32_t));
    e.cap_heap = 3 * (int64_t)n_sym + 8;
    e.heap = malloc((size_t)e.cap_heap * sizeof(heap_item));
    e.buf = malloc(n_buf);
    fr = malloc(8 * sizeof *fr);
    cap_fr = 8;
    bool oom = !e.sym_id || !e.sym_prev || !e.sym_next || !e.sym_off || !e.sym_len || !e.heap || !e.buf || !fr;
    for (int i = 0; i < t->n_regex && !oom; i++) {
        e.md[i] = pcre2_match_data_create_from_pattern(t->regex[i], NULL);
        oom = !e.md[i];
    }
    if (oom) {
        s = nstf_set_error(NSTF_ERR_OOM, "nstf_tokenizer_encode: out of memory for %zu bytes of text", len);
        goto done;
    }
    fr[0] = (frag){0, (int64_t)len, -1};
    n_fr = 1;
    if (parse_special && (s = split_special(t, text, &fr, &n_fr, &cap_fr)) != NSTF_OK) goto done;

    bool prev_special = true;
    for (int64_t f = 0; f < n_fr; f++) {
        if (fr[f].id >= 0) {
            if ((s = id_push(&out, fr[f].id)) != NSTF_OK) goto done;
            prev_special = true;
        } else {
            bool prefix = t->kind == TOK_KIND_SPM && t->add_space_prefix && prev_special;
            if ((s = encode_fragment(&e, text + fr[f].off, (size_t)fr[f].len, prefix)) != NSTF_OK) goto done;
            prev_special = false;
        }
    }

done:
    free(e.sym_id);
    free(e.sym_prev);
    free(e.sym_next);
    free(e.sym_off);
    free(e.sym_len);
    free(e.heap);
    free(e.buf);
    free(fr);
    for (int i = 0; i < MAX_REGEX; i++) pcre2_match_data_free(e.md[i]);
    if (s != NSTF_OK) {
        free(out.v);
        return s;
    }
    if (!out.v) { /* empty result: still hand back a freeable pointer */
        out.v = malloc(sizeof(int32_t));
        if (!out.v) return nstf_set_error(NSTF_ERR_OOM, "nstf_tokenizer_encode: out of memory");
    }
    *ids = out.v;
    *n_ids = out.n;
    return NSTF_OK;
}

/* ---- decoding ------------------------------------------------------------ */

int64_t nstf_tokenizer_piece(const nstf_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    uint64_t n = t->piece_off[id + 1] - t->piece_off[id];
    if (buf && cap) memcpy(buf, t->piece_blob + t->piece_off[id], n < cap ? (size_t)n : cap);
    return (int64_t)n;
}

nstf_status nstf_tokenizer_decode(const nstf_tokenizer *t, const int32_t *ids, int64_t n_ids,
                                  char **out, size_t *out_len) {
    if (!t || (!ids && n_ids) || n_ids < 0 || !out)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_tokenizer_decode: bad argument");
    *out = NULL;
    uint64_t total = 0;
    for (int64_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE, "nstf_tokenizer_decode: token id %d at %lld is outside [0, %d)",
                                  ids[i], (long long)i, t->n_vocab);
        total += t->piece_off[ids[i] + 1] - t->piece_off[ids[i]];
    }
    char *s = malloc((size_t)total + 1);
    if (!s) return nstf_set_error(NSTF_ERR_OOM, "nstf_tokenizer_decode: out of memory for %llu bytes",
                                  (unsigned long long)total);
    uint64_t o = 0;
    /* SentencePiece: drop the space the dummy prefix put before the first
     * text token (control tokens such as BOS do not count) */
    bool strip = t->kind == TOK_KIND_SPM && t->add_space_prefix;
    for (int64_t i = 0; i < n_ids; i++) {
        const char *p = t->piece_blob + t->piece_off[ids[i]];
        uint64_t n = t->piece_off[ids[i] + 1] - t->piece_off[ids[i]];
        if (strip && t->type[ids[i]] != TOKEN_TYPE_CONTROL) {
            if (n && p[0] == ' ') { p++; n--; }
            strip = false;
        }
        memcpy(s + o, p, (size_t)n);
        o += n;
    }
    s[o] = 0;
    *out = s;
    if (out_len) *out_len = (size_t)o;
    return NSTF_OK;
}
