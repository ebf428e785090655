/* test_gguf_model.c — the GGUF reader on the real model file
 * (models/SmolLM2-135M-Instruct.Q4_1.gguf): tensor and key counts, types,
 * shapes, offsets, tokenizer arrays, the typed getters and the printer.
 * Metric: exact equality (this is a file format). Exits 77 when the model
 * has not been fetched; the reader's other tests are in test_gguf.c. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/gguf.h"
#include "test_util.h"

typedef unsigned long long ull;

int main(void) {
    const char *path = NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) {
        printf("test_gguf_model: %s absent (make model fetches it); skipped\n", path);
        return TEST_SKIP;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    nstf_gguf *g = NULL;
    nstf_status st = nstf_gguf_open(path, &g);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(st == NSTF_OK, "open real model: %s", nstf_last_error());
    if (st != NSTF_OK) return test_finish("test_gguf_model");
    printf("real model: opened %llu bytes in %.2f ms (informational)\n", (ull)g->size,
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
    CHECK(g->n_tensors == 272, "n_tensors %llu", (ull)g->n_tensors);
    CHECK(g->n_kv == 33, "n_kv %llu", (ull)g->n_kv);
    CHECK(g->alignment == 32 && (g->version == 3 || g->version == 2), "alignment/version");
    nstf_gguf_str s;
    CHECK(nstf_gguf_get_str(g, "general.architecture", &s) == NSTF_OK && nstf_gguf_str_eq(s, "llama"), "arch");
    CHECK(nstf_gguf_get_str(g, "tokenizer.ggml.pre", &s) == NSTF_OK && nstf_gguf_str_eq(s, "smollm"), "pre");
    uint32_t u = 0;
    float f = 0;
    bool b = true;
    CHECK(nstf_gguf_get_u32(g, "llama.block_count", &u) == NSTF_OK && u == 30, "block_count");
    CHECK(nstf_gguf_get_u32(g, "llama.embedding_length", &u) == NSTF_OK && u == 576, "embedding_length");
    CHECK(nstf_gguf_get_f32(g, "llama.rope.freq_base", &f) == NSTF_OK && f == 100000.0f, "rope base");
    CHECK(nstf_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == NSTF_OK && !b, "add_bos_token");
    const nstf_gguf_tensor *t = nstf_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == NSTF_TYPE_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152 &&
              t->n_bytes == 576ull / 32 * 34 * 49152,
          "token_embd.weight");
    t = nstf_gguf_find_tensor(g, "output_norm.weight");
    CHECK(t && t->type == NSTF_TYPE_F32 && (const uint8_t *)t->data + t->n_bytes == g->base + g->size,
          "output_norm.weight ends the file");
    int n_q41 = 0, n_f32 = 0, n_q80 = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        n_q41 += g->tensors[i].type == NSTF_TYPE_Q4_1;
        n_f32 += g->tensors[i].type == NSTF_TYPE_F32;
        n_q80 += g->tensors[i].type == NSTF_TYPE_Q8_0;
    }
    CHECK(n_q41 == 210 && n_f32 == 61 && n_q80 == 1, "types %d/%d/%d", n_q41, n_f32, n_q80);
    const nstf_gguf_kv *kv;
    CHECK(nstf_gguf_get_arr(g, "tokenizer.ggml.tokens", NSTF_GGUF_STRING, &kv) == NSTF_OK && kv->arr_n == 49152 &&
              nstf_gguf_str_eq(kv->arr_strs[0], "<|endoftext|>") && nstf_gguf_str_eq(kv->arr_strs[2], "<|im_end|>"),
          "tokens");
    CHECK(nstf_gguf_get_arr(g, "tokenizer.ggml.merges", NSTF_GGUF_STRING, &kv) == NSTF_OK && kv->arr_n == 48900 &&
              nstf_gguf_str_eq(kv->arr_strs[0], "\xc4\xa0 t"),
          "merges");
    CHECK(nstf_gguf_get_arr(g, "tokenizer.ggml.token_type", NSTF_GGUF_INT32, &kv) == NSTF_OK && kv->arr_n == 49152,
          "token_type");
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    CHECK(mf && nstf_gguf_print(g, mf, false) == NSTF_OK, "print");
    if (mf) fclose(mf);
    CHECK(buf && strstr(buf, "token_embd.weight") && strstr(buf, "string[49152]") && strstr(buf, "Q4_1") &&
              strstr(buf, "272 tensors"),
          "print output");
    free(buf);
    nstf_gguf_close(g);
    return test_finish("test_gguf_model");
}
