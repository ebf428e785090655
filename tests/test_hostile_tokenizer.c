/* test_hostile_tokenizer.c — tokenizer metadata an attacker controls:
 * arrays of the wrong element type, counts that disagree, ids out of range,
 * unknown models. Each case is a small GGUF (otherwise valid) whose
 * tokenizer must be refused with a message naming the problem, never read
 * out of bounds. The cases are built here with the GGUF writer and are also
 * checked in under tests/data/hostile/tokenizer/ (regenerate with
 * `test_hostile_tokenizer --write DIR`); the test opens both and requires
 * the checked-in bytes to equal the generated ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "io/gguf.h"
#include "io/tokenizer.h"
#include "test_util.h"

#define DATA NSTF_SOURCE_DIR "/tests/data/hostile/tokenizer"

typedef enum { TOKENS_INT, TYPES_SHORT, TYPES_STRING, BOS_RANGE, MERGES_INT, SCORES_INT, MODEL_BERT, TOKENS_EMPTY, N_CASES } hcase;

static const struct { const char *file, *want; } k_cases[N_CASES] = {
    [TOKENS_INT] = {"tokens_int_array.gguf", "'tokenizer.ggml.tokens' is an array of int32, expected an array of string"},
    [TYPES_SHORT] = {"token_type_count_mismatch.gguf", "token_type has 3 entries, tokens 4"},
    [TYPES_STRING] = {"token_type_string_array.gguf", "'tokenizer.ggml.token_type' is an array of string, expected an array of int32"},
    [BOS_RANGE] = {"bos_id_out_of_range.gguf", "bos_token_id = 4000000000 is not below the vocabulary size 4"},
    [MERGES_INT] = {"merges_int_array.gguf", "'tokenizer.ggml.merges' is an array of int32, expected an array of string"},
    [SCORES_INT] = {"spm_scores_int_array.gguf", "'tokenizer.ggml.scores' is an array of int32, expected an array of float32"},
    [MODEL_BERT] = {"model_unknown.gguf", "\"bert\" is not supported"},
    [TOKENS_EMPTY] = {"tokens_empty.gguf", "tokenizer.ggml.tokens has 0 entries"},
};

static void *build(hcase c, uint64_t *size) {
    static const char *toks[] = {"a", "b", "c", "ab"};
    static const char *merges[] = {"a b"};
    const int32_t types[4] = {1, 1, 1, 1}, ints[4] = {1, 2, 3, 4};
    const float scores[4] = {0, -1, -2, -3};
    nstf_gguf_writer *w;
    if (nstf_gguf_writer_create(&w) != NSTF_OK) return NULL;
    bool spm = c == SCORES_INT;
    nstf_gguf_writer_set_str(w, "tokenizer.ggml.model", c == MODEL_BERT ? "bert" : spm ? "llama" : "gpt2");
    if (c == TOKENS_INT) nstf_gguf_writer_set_arr(w, "tokenizer.ggml.tokens", NSTF_GGUF_INT32, ints, 4);
    else nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, c == TOKENS_EMPTY ? 0 : 4);
    if (c == TYPES_STRING) nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.token_type", toks, 4);
    else nstf_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", NSTF_GGUF_INT32, types, c == TYPES_SHORT ? 3 : 4);
    if (c == MERGES_INT) nstf_gguf_writer_set_arr(w, "tokenizer.ggml.merges", NSTF_GGUF_INT32, ints, 1);
    else if (!spm) nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    if (spm) nstf_gguf_writer_set_arr(w, "tokenizer.ggml.scores", NSTF_GGUF_INT32, ints, 4);
    else nstf_gguf_writer_set_arr(w, "tokenizer.ggml.scores", NSTF_GGUF_FLOAT32, scores, 4);
    nstf_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", c == BOS_RANGE ? 4000000000u : 0);
    nstf_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
    void *img = NULL;
    if (nstf_gguf_writer_write_memory(w, 0, &img, size) != NSTF_OK) img = NULL;
    nstf_gguf_writer_free(w);
    return img;
}

/* The tokenizer must refuse the image with a message containing `want`. */
static void expect_refused(const char *name, const void *img, uint64_t size, const char *want) {
    nstf_gguf *g;
    nstf_status s = nstf_gguf_open_memory(img, size, name, &g);
    CHECK(s == NSTF_OK, "%s: the GGUF itself should open: %s", name, nstf_last_error());
    if (s != NSTF_OK) return;
    nstf_tokenizer *t = NULL;
    s = nstf_tokenizer_from_gguf(g, &t);
    CHECK(s != NSTF_OK, "%s: tokenizer accepted", name);
    CHECK(s == NSTF_OK || strstr(nstf_last_error(), want) != NULL, "%s: message lacks '%s': %s", name, want,
          nstf_last_error());
    if (s != NSTF_OK) printf("%-34s -> %s\n", name, nstf_last_error());
    nstf_tokenizer_free(t);
    nstf_gguf_close(g);
}

int main(int argc, char **argv) {
    const char *write_dir = argc == 3 && !strcmp(argv[1], "--write") ? argv[2] : NULL;
    for (int c = 0; c < N_CASES; c++) {
        uint64_t size = 0;
        void *img = build((hcase)c, &size);
        CHECK(img != NULL, "case %d: build failed: %s", c, nstf_last_error());
        if (!img) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", write_dir ? write_dir : DATA, k_cases[c].file);
        if (write_dir) {
            FILE *f = fopen(path, "wb");
            CHECK(f && fwrite(img, 1, size, f) == size, "cannot write %s", path);
            if (f) fclose(f);
        }
        expect_refused(k_cases[c].file, img, size, k_cases[c].want);
        /* the checked-in copy: same bytes, same refusal */
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL, "missing checked-in case %s (regenerate with --write)", path);
        if (f) {
            unsigned char *disk = malloc(size + 1);
            size_t got = fread(disk, 1, size + 1, f);
            fclose(f);
            CHECK(got == size && !memcmp(disk, img, size), "%s differs from the generated case", path);
            free(disk);
        }
        nstf_free(img);
    }
    return test_finish("test_hostile_tokenizer");
}
