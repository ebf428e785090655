/* fuzz_hf_tokenizer.c — libFuzzer target for the HF tokenizer files
 * (src/io/hf_tokenizer.c over src/io/json.c) and what is built from them.
 *
 * Input: tokenizer.json, optionally followed by a NUL byte and
 * tokenizer_config.json. Both are written into a private folder (the
 * reader takes a folder) and turned into tokenizer.ggml.* key/values with
 * nstf_hf_tokenizer_kvs, for a model vocabulary of 1024. A refusal must leave a message. When accepted,
 * the key/values are written as a GGUF image, read back by the validating
 * reader, and a tokenizer is built from them; if that succeeds it must
 * encode a fixed text (with and without special tokens) into ids below its
 * vocabulary and decode every id, and the chat template (if any) must
 * render or refuse cleanly. A failed invariant traps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"

#include "io/gguf.h"
#include "io/hf_model.h"
#include "io/tokenizer.h"

#define FAIL FUZZ_FAIL

/* The model's vocabulary, as config.json's vocab_size gives it to the
 * reader (ids at or beyond it are refused, unused ids below it padded). */
#define N_VOCAB 1024

static char g_dir[64], g_tok[96], g_cfg[96];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_hf_tokenizer.XXXXXX");
    if (!mkdtemp(g_dir)) FAIL("mkdtemp");
    snprintf(g_tok, sizeof g_tok, "%s/tokenizer.json", g_dir);
    snprintf(g_cfg, sizeof g_cfg, "%s/tokenizer_config.json", g_dir);
    return 0;
}

static void put(const char *path, const uint8_t *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) FAIL("cannot write %s", path);
    if (n && fwrite(d, 1, n, f) != n) FAIL("short write %s", path);
    fclose(f);
}

static void exercise(const nstf_tokenizer *t, const nstf_gguf *g) {
    static const char text[] = "Hello world 123 <|im_start|>user\n caf\xc3\xa9 \xf0\x9f\x99\x82 <|eot_id|>";
    const int32_t nv = nstf_tokenizer_n_vocab(t);
    if (nv < 1) FAIL("vocabulary of %d", nv);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (nstf_tokenizer_encode(t, text, sizeof text - 1, true, special, &ids, &n) == NSTF_OK) {
            for (int64_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= nv) FAIL("id %d outside the vocabulary of %d", ids[i], nv);
            char *out = NULL;
            size_t len = 0;
            if (nstf_tokenizer_decode(t, ids, n, &out, &len) == NSTF_OK && !out) FAIL("decode without text");
            free(out);
        }
        free(ids);
    }
    char piece[16];
    for (int32_t id = 0; id < nv && id < 4096; id++)
        if (nstf_tokenizer_piece(t, id, piece, sizeof piece) < 0) FAIL("piece of id %d", id);
    const nstf_chat_msg msgs[] = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}};
    char *chat = NULL;
    if (nstf_chat_render(g, msgs, 3, true, &chat) == NSTF_OK && !chat) FAIL("chat without text");
    free(chat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n_tok = nul ? (size_t)(nul - data) : size;
    put(g_tok, data, n_tok);
    if (nul) put(g_cfg, nul + 1, size - n_tok - 1);
    else unlink(g_cfg);
    nstf_gguf_writer *w = NULL;
    if (nstf_gguf_writer_create(&w) != NSTF_OK) return 0;
    nstf_status s = nstf_hf_tokenizer_kvs(g_dir, NULL, N_VOCAB, w);
    if (s != NSTF_OK) {
        const char *m = nstf_last_error();
        if (!m || !m[0]) FAIL("refusal without a message");
        nstf_gguf_writer_free(w);
        return 0;
    }
    void *img = NULL;
    uint64_t n = 0;
    nstf_gguf *g = NULL;
    s = nstf_gguf_writer_write_memory(w, 0, &img, &n);
    nstf_gguf_writer_free(w);
    if (s != NSTF_OK) return 0;
    s = nstf_gguf_open_view(img, n, g_dir, NULL, 0, NULL, NULL, &g);
    if (s != NSTF_OK) FAIL("the written key/values do not read back: %s", nstf_last_error());
    nstf_tokenizer *t = NULL;
    if (nstf_tokenizer_from_gguf(g, &t) == NSTF_OK) exercise(t, g);
    nstf_tokenizer_free(t);
    nstf_gguf_close(g);
    return 0;
}
