/* fuzz_tokenizer.c — libFuzzer target for the tokenizer (src/io/tokenizer.c)
 * and chat rendering, with a real vocabulary.
 *
 * The vocabulary is loaded once from the GGUF named by $NSTF_FUZZ_MODEL
 * (default: models/SmolLM2-135M-Instruct.Q4_1.gguf under the source tree).
 * Input byte 0 holds flags (bit 0 add_bos, bit 1 parse_special, bit 2
 * "decode the raw bytes as ids"); the rest is the text. Checks:
 *   - invalid UTF-8 is rejected with NSTF_ERR_INVALID_ARG, valid UTF-8 is
 *     encoded, and every id is in [0, n_vocab);
 *   - decode(encode(text)) == text for a byte-level ("gpt2") vocabulary
 *     without BOS, less the bytes the vocabulary has no token for (those
 *     are dropped, as HF and llama.cpp do; SmolLM2 lacks 0x04, 0x13, ...:
 *     the set is computed here from the token list with GPT-2's
 *     byte-to-unicode map, independently of the tokenizer);
 *   - the pieces of the ids concatenate to the decoded text, for every
 *     buffer size (pieces are cut, never overrun);
 *   - arbitrary int32 ids (in range or not) decode or fail cleanly;
 *   - the text as a user message renders through the chat template. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#include "io/gguf.h"
#include "io/tokenizer.h"

#ifndef NSTF_SOURCE_DIR
#define NSTF_SOURCE_DIR "."
#endif
#define DEFAULT_MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

#define FAIL FUZZ_FAIL

static nstf_gguf *g_gguf;
static nstf_tokenizer *g_tok;
static int32_t g_n_vocab;
static bool g_byte_level;
static bool g_has_byte[256]; /* byte-level vocabulary: byte b has a token */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * others to U+0100 + their rank among the others. Marks each byte whose
 * one-character token is in tokenizer.ggml.tokens. */
static void find_byte_tokens(void) {
    uint32_t cp_of[256], n_other = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        cp_of[b] = printable ? (uint32_t)b : 0x100 + n_other++;
    }
    const nstf_gguf_kv *toks;
    if (nstf_gguf_get_arr(g_gguf, "tokenizer.ggml.tokens", NSTF_GGUF_STRING, &toks) != NSTF_OK) return;
    for (uint64_t i = 0; i < toks->arr_n; i++) {
        nstf_gguf_str t = toks->arr_strs[i];
        const uint8_t *p = (const uint8_t *)t.ptr;
        uint32_t cp;
        if (t.len == 1 && p[0] < 0x80) cp = p[0];
        else if (t.len == 2 && (p[0] & 0xe0) == 0xc0 && (p[1] & 0xc0) == 0x80) cp = ((p[0] & 0x1fu) << 6) | (p[1] & 0x3fu);
        else continue;
        for (int b = 0; b < 256; b++)
            if (cp_of[b] == cp) g_has_byte[b] = true;
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("NSTF_FUZZ_MODEL");
    if (!path || !*path) path = DEFAULT_MODEL;
    if (nstf_gguf_open(path, &g_gguf) != NSTF_OK ||
        nstf_tokenizer_from_gguf(g_gguf, &g_tok) != NSTF_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot load a vocabulary from %s: %s\n"
                        "(set NSTF_FUZZ_MODEL, or fetch the model with `make model`)\n",
                path, nstf_last_error());
        exit(1);
    }
    g_n_vocab = nstf_tokenizer_n_vocab(g_tok);
    nstf_gguf_str m;
    g_byte_level = nstf_gguf_get_str(g_gguf, "tokenizer.ggml.model", &m) == NSTF_OK &&
                   nstf_gguf_str_eq(m, "gpt2");
    if (g_byte_level) find_byte_tokens();
    return 0;
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static bool utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

/* The pieces of ids, each fetched through a `cap`-byte buffer, must give
 * exactly `want`. */
static void check_pieces(const int32_t *ids, int64_t n, const char *want, size_t want_len, size_t cap) {
    char buf[64];
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        memset(buf, 0x5a, sizeof buf);
        int64_t len = nstf_tokenizer_piece(g_tok, ids[i], buf, cap);
        if (len < 0) FAIL("piece(%d) failed for an id decode accepted", ids[i]);
        for (size_t k = cap; k < sizeof buf; k++)
            if ((unsigned char)buf[k] != 0x5a) FAIL("piece(%d) wrote past cap %zu", ids[i], cap);
        if ((uint64_t)len > want_len - at) FAIL("pieces longer than the decoded text");
        size_t got = (size_t)len < cap ? (size_t)len : cap;
        if (memcmp(buf, want + at, got)) FAIL("piece(%d) differs from the decoded text", ids[i]);
        at += (size_t)len;
    }
    if (at != want_len) FAIL("pieces give %zu bytes, decode %zu", at, want_len);
}

static void decode_ids(const int32_t *ids, int64_t n) {
    bool in_range = true;
    for (int64_t i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < g_n_vocab;
    char *out = NULL;
    size_t out_len = 0;
    nstf_status st = nstf_tokenizer_decode(g_tok, ids, n, &out, &out_len);
    if (st == NSTF_OK) {
        if (!in_range) FAIL("decode accepted an id out of range");
        if (out[out_len] != 0) FAIL("decode result not NUL-terminated");
        check_pieces(ids, n, out, out_len, 64);
        check_pieces(ids, n, out, out_len, 3);
    } else if (in_range && st != NSTF_ERR_OOM) {
        FAIL("decode failed for ids in range: %s", nstf_last_error());
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t flags = data[0];
    size_t len = size - 1;
    char *text = malloc(len + 1); /* exactly sized (+ NUL for the chat path) */
    if (!text) return 0;
    if (len) memcpy(text, data + 1, len);
    text[len] = 0;
    bool add_bos = flags & 1, parse_special = flags & 2;

    if (flags & 4) {
        /* raw ids: in range or not, they must decode or fail cleanly */
        int64_t n = (int64_t)(len / 4);
        int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
        if (ids) {
            if (n) memcpy(ids, text, (size_t)n * 4);
            decode_ids(ids, n);
            for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((uint32_t)ids[i] % (uint32_t)g_n_vocab);
            decode_ids(ids, n);
            free(ids);
        }
        free(text);
        return 0;
    }

    int32_t *ids = NULL;
    int64_t n_ids = -1;
    nstf_status st = nstf_tokenizer_encode(g_tok, text, len, add_bos, parse_special, &ids, &n_ids);
    bool valid = utf8_valid((const uint8_t *)text, len);
    if (st == NSTF_OK) {
        if (!valid) FAIL("encode accepted invalid UTF-8");
        if (n_ids < 0 || (n_ids > 0 && !ids)) FAIL("encode returned %lld ids", (long long)n_ids);
        for (int64_t i = 0; i < n_ids; i++)
            if (ids[i] < 0 || ids[i] >= g_n_vocab) FAIL("encode produced id %d (vocab %d)", ids[i], g_n_vocab);
        char *out = NULL;
        size_t out_len = 0;
        st = nstf_tokenizer_decode(g_tok, ids, n_ids, &out, &out_len);
        if (st != NSTF_OK) FAIL("decode of encode's ids failed: %s", nstf_last_error());
        if (g_byte_level && !add_bos) {
            /* x less the bytes without a token; special-token text (with
             * parse_special) is made of bytes that have tokens */
            char *want = malloc(len + 1);
            size_t n_want = 0;
            if (!want) FAIL("out of memory");
            for (size_t i = 0; i < len; i++)
                if (g_has_byte[(uint8_t)text[i]]) want[n_want++] = text[i];
            if (out_len != n_want || memcmp(out, want, n_want))
                FAIL("decode(encode(x)) != x less its untokenizable bytes (%zu bytes in, %zu expected, %zu out)",
                     len, n_want, out_len);
            free(want);
        }
        check_pieces(ids, n_ids, out, out_len, 64);
        free(out);
    } else if (valid && st != NSTF_ERR_OOM) {
        FAIL("encode rejected valid UTF-8: %s", nstf_last_error());
    } else if (!valid && st != NSTF_ERR_INVALID_ARG) {
        FAIL("invalid UTF-8 gave status %d, not NSTF_ERR_INVALID_ARG", (int)st);
    }
    free(ids);

    if (valid && !memchr(text, 0, len)) {
        nstf_chat_msg msgs[2] = {{"system", "Be brief."}, {"user", text}};
        char *prompt = NULL;
        st = nstf_chat_render(g_gguf, msgs + !(flags & 8), 1 + !!(flags & 8), flags & 16, &prompt);
        if (st == NSTF_OK && (!prompt || !strstr(prompt, text))) FAIL("rendered prompt lacks the message");
        free(prompt);
    }
    free(text);
    return 0;
}
