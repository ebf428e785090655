/* make_seeds.c — writes the GGUF seed corpus of fuzz_gguf with the
 * project's own writer: one tiny file per tensor type (F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1; 1..4 dims), each carrying key/values of every type the
 * writer can emit (scalars, strings, arrays of scalars and strings), plus
 * a file with alignment 64, a file with no tensors, and a miniature
 * llama-shaped header (tokenizer arrays, hyperparameters).
 *
 *   make_seeds OUT_DIR        (run by `make -C fuzz seeds`) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "io/gguf.h"

#define TRY(x)                                                              \
    do {                                                                    \
        if ((x) != NSTF_OK) {                                               \
            fprintf(stderr, "make_seeds: %s: %s\n", #x, nstf_last_error()); \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static void common_kvs(nstf_gguf_writer *w) {
    static const int32_t i32s[] = {1, -2, 3};
    static const float f32s[] = {0.5f, -1.0f};
    static const uint8_t bools[] = {0, 1};
    static const char *const strs[] = {"a", "", "\xc3\xa9t\xc3\xa9"};
    TRY(nstf_gguf_writer_set_str(w, "general.architecture", "llama"));
    TRY(nstf_gguf_writer_set_u32(w, "x.u32", 7));
    TRY(nstf_gguf_writer_set_i32(w, "x.i32", -7));
    TRY(nstf_gguf_writer_set_u64(w, "x.u64", 1ull << 40));
    TRY(nstf_gguf_writer_set_f32(w, "x.f32", 1e-5f));
    TRY(nstf_gguf_writer_set_bool(w, "x.bool", true));
    TRY(nstf_gguf_writer_set_arr(w, "x.i32s", NSTF_GGUF_INT32, i32s, 3));
    TRY(nstf_gguf_writer_set_arr(w, "x.f32s", NSTF_GGUF_FLOAT32, f32s, 2));
    TRY(nstf_gguf_writer_set_arr(w, "x.bools", NSTF_GGUF_BOOL, bools, 2));
    TRY(nstf_gguf_writer_set_arr_str(w, "x.strs", strs, 3));
}

static void save(nstf_gguf_writer *w, const char *dir, const char *name, uint32_t alignment) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    TRY(nstf_gguf_writer_write(w, path, alignment));
    nstf_gguf_writer_free(w);
    printf("wrote %s\n", path);
}

/* A tensor of `type` with n_dims dims whose row is one block (or 32 elems). */
static void add(nstf_gguf_writer *w, const char *name, nstf_type type, uint32_t n_dims) {
    int64_t ne[4] = {32, 2, 1, 1};
    uint64_t row;
    nstf_type_row_bytes(type, ne[0], &row);
    uint64_t rows = n_dims > 1 ? 2 : 1;
    float src[32];
    unsigned char *data = malloc(row * rows);
    for (uint64_t r = 0; r < rows; r++) {
        for (int i = 0; i < 32; i++) src[i] = (float)((i * 7 + (int)r * 3) % 11) * 0.25f - 1.0f;
        nstf_quantize_row(type, src, data + r * row, 32);
    }
    TRY(nstf_gguf_writer_add_tensor(w, name, type, n_dims, ne, data));
    free(data);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds OUT_DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    static const struct { nstf_type t; const char *name; uint32_t n_dims; } k[] = {
        {NSTF_TYPE_F32, "tiny_f32", 1},   {NSTF_TYPE_F16, "tiny_f16", 2},
        {NSTF_TYPE_BF16, "tiny_bf16", 3}, {NSTF_TYPE_Q8_0, "tiny_q8_0", 4},
        {NSTF_TYPE_Q4_0, "tiny_q4_0", 2}, {NSTF_TYPE_Q4_1, "tiny_q4_1", 2},
    };
    nstf_gguf_writer *w;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        TRY(nstf_gguf_writer_create(&w));
        common_kvs(w);
        add(w, "t", k[i].t, k[i].n_dims);
        save(w, dir, k[i].name, 0);
    }
    /* every type in one file, alignment 64 */
    TRY(nstf_gguf_writer_create(&w));
    TRY(nstf_gguf_writer_set_str(w, "general.name", "mixed"));
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) add(w, k[i].name, k[i].t, k[i].n_dims);
    save(w, dir, "mixed_align64", 64);
    /* metadata only */
    TRY(nstf_gguf_writer_create(&w));
    common_kvs(w);
    save(w, dir, "no_tensors", 0);
    /* a miniature llama header */
    TRY(nstf_gguf_writer_create(&w));
    static const char *const toks[] = {"<|endoftext|>", "a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "a"};
    static const int32_t types[] = {3, 1, 1, 1, 1, 1};
    static const char *const merges[] = {"a b", "\xc4\xa0 a"};
    TRY(nstf_gguf_writer_set_str(w, "general.architecture", "llama"));
    TRY(nstf_gguf_writer_set_u32(w, "llama.block_count", 1));
    TRY(nstf_gguf_writer_set_u32(w, "llama.context_length", 64));
    TRY(nstf_gguf_writer_set_u32(w, "llama.embedding_length", 32));
    TRY(nstf_gguf_writer_set_u32(w, "llama.feed_forward_length", 64));
    TRY(nstf_gguf_writer_set_u32(w, "llama.attention.head_count", 2));
    TRY(nstf_gguf_writer_set_u32(w, "llama.attention.head_count_kv", 1));
    TRY(nstf_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    TRY(nstf_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
    TRY(nstf_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    TRY(nstf_gguf_writer_set_str(w, "tokenizer.ggml.pre", "smollm"));
    TRY(nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 6));
    TRY(nstf_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", NSTF_GGUF_INT32, types, 6));
    TRY(nstf_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2));
    TRY(nstf_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0));
    TRY(nstf_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0));
    add(w, "token_embd.weight", NSTF_TYPE_Q8_0, 2);
    add(w, "output_norm.weight", NSTF_TYPE_F32, 1);
    save(w, dir, "mini_llama", 0);
    return 0;
}
