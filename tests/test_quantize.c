/* test_quantize.c — nstf_quantize_file (Q4_K_M and IQ4_NL files) and llama.cpp's per-tensor type
 * rules (src/opt/quantize.h) on a small GGUF written here.
 *
 * Checks: the type chosen for every tensor of a 16-layer model under each
 * target (output / tied embeddings, attn_v and ffn_down of the
 * use_more_bits layers, fallbacks for rows not a multiple of 256); that the
 * written file's tensors are the reference quantization of the input
 * (nstf_quantize_row of each row, bit for bit); that key/values are copied
 * and general.file_type set; that quantized input is refused without
 * allow_requantize (and OUT is left untouched), accepted with it; and that
 * no temporary file is left behind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "io/gguf.h"
#include "opt/quantize.h"
#include "test_util.h"

static void test_rules(void) {
    nstf_quant_target q4km, q5km, q80, q4k, f16;
    CHECK(nstf_quant_target_parse("q4_k_m", &q4km) && nstf_quant_target_parse("Q5_K_M", &q5km) &&
              nstf_quant_target_parse("Q8_0", &q80) && nstf_quant_target_parse("Q4_K", &q4k) &&
              nstf_quant_target_parse("F16", &f16),
          "targets parse");
    nstf_quant_target bad;
    CHECK(!nstf_quant_target_parse("Q7_0", &bad), "unknown target refused");
    const nstf_type F = NSTF_TYPE_F16;
    /* use_more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2 -> 0 1 4 7 10 13 14 15 */
    const int more[16] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};
    for (int l = 0; l < 16; l++) {
        char v[64], d[64], q[64];
        snprintf(v, sizeof v, "blk.%d.attn_v.weight", l);
        snprintf(d, sizeof d, "blk.%d.ffn_down.weight", l);
        snprintf(q, sizeof q, "blk.%d.attn_q.weight", l);
        nstf_type want = more[l] ? NSTF_TYPE_Q6_K : NSTF_TYPE_Q4_K;
        CHECK(nstf_quant_tensor_type(&q4km, v, 2, 512, F, true, 16) == want, "Q4_K_M %s", v);
        CHECK(nstf_quant_tensor_type(&q4km, d, 2, 1024, F, true, 16) == want, "Q4_K_M %s", d);
        CHECK(nstf_quant_tensor_type(&q4km, q, 2, 512, F, true, 16) == NSTF_TYPE_Q4_K, "Q4_K_M %s", q);
        CHECK(nstf_quant_tensor_type(&q5km, d, 2, 1024, F, true, 16) ==
                  (more[l] ? NSTF_TYPE_Q6_K : NSTF_TYPE_Q5_K), "Q5_K_M %s", d);
        CHECK(nstf_quant_tensor_type(&q4k, v, 2, 512, F, true, 16) == NSTF_TYPE_Q4_K, "plain Q4_K %s", v);
        /* rows of 576: Q4_K -> Q5_0, Q6_K -> Q8_0 (llama.cpp's fallbacks) */
        CHECK(nstf_quant_tensor_type(&q4km, q, 2, 576, F, true, 16) == NSTF_TYPE_Q5_0, "fallback Q5_0");
        CHECK(nstf_quant_tensor_type(&q4km, v, 2, 576, F, true, 16) == (more[l] ? NSTF_TYPE_Q8_0 : NSTF_TYPE_Q5_0),
              "fallback of %s", v);
        CHECK(nstf_quant_tensor_type(&q5km, q, 2, 576, F, true, 16) == NSTF_TYPE_Q5_1, "fallback Q5_1");
    }
    nstf_quant_target q2k, q3k;
    CHECK(nstf_quant_target_parse("Q2_K", &q2k) && nstf_quant_target_parse("q3_k", &q3k), "Q2_K / Q3_K parse");
    CHECK(nstf_quant_tensor_type(&q3k, "blk.0.attn_q.weight", 2, 512, F, true, 16) == NSTF_TYPE_Q3_K, "plain Q3_K");
    CHECK(nstf_quant_tensor_type(&q2k, "blk.0.attn_q.weight", 2, 576, F, true, 16) == NSTF_TYPE_Q4_0,
          "Q2_K on rows of 576 falls back to Q4_0");
    nstf_quant_target iq4xs;
    CHECK(nstf_quant_target_parse("IQ4_XS", &iq4xs) && iq4xs.ftype == 30, "IQ4_XS parses (ftype 30)");
    CHECK(nstf_quant_tensor_type(&iq4xs, "blk.0.attn_q.weight", 2, 512, F, true, 16) == NSTF_TYPE_IQ4_XS, "IQ4_XS");
    CHECK(nstf_quant_tensor_type(&iq4xs, "blk.0.attn_q.weight", 2, 576, F, true, 16) == NSTF_TYPE_IQ4_NL,
          "IQ4_XS on rows of 576 falls back to IQ4_NL");
    CHECK(nstf_quant_tensor_type(&q4km, "output.weight", 2, 512, F, true, 16) == NSTF_TYPE_Q6_K, "output Q6_K");
    CHECK(nstf_quant_tensor_type(&q4km, "output.weight", 2, 576, F, true, 16) == NSTF_TYPE_Q8_0, "output Q8_0");
    CHECK(nstf_quant_tensor_type(&q4km, "token_embd.weight", 2, 512, F, true, 16) == NSTF_TYPE_Q4_K, "embd Q4_K");
    CHECK(nstf_quant_tensor_type(&q4km, "token_embd.weight", 2, 512, F, false, 16) == NSTF_TYPE_Q6_K,
          "tied embd is the output: Q6_K");
    CHECK(nstf_quant_tensor_type(&q80, "output.weight", 2, 512, F, true, 16) == NSTF_TYPE_Q8_0, "Q8_0 output");
    CHECK(nstf_quant_tensor_type(&f16, "output.weight", 2, 512, NSTF_TYPE_F32, true, 16) == NSTF_TYPE_F16, "F16 output");
    /* rows no block divides (a rank-201 factor): F16, BF16 kept */
    CHECK(nstf_quant_tensor_type(&q4km, "blk.0.attn_q.lr_b.weight", 2, 201, F, true, 16) == NSTF_TYPE_F16,
          "factor rows of 201: F16");
    CHECK(nstf_quant_tensor_type(&q80, "blk.0.attn_q.lr_b.weight", 2, 201, NSTF_TYPE_F32, true, 16) == NSTF_TYPE_F16,
          "factor rows of 201 from F32: F16");
    CHECK(nstf_quant_tensor_type(&q2k, "blk.0.attn_q.lr_b.weight", 2, 201, NSTF_TYPE_BF16, true, 16) ==
              NSTF_TYPE_BF16, "factor rows of 201 in BF16: kept");
    CHECK(nstf_quant_tensor_type(&q4km, "blk.0.attn_q.lr_b.weight", 2, 224, F, true, 16) == NSTF_TYPE_Q5_0,
          "factor rows of 224: the 32-block fallback");
    CHECK(nstf_quant_tensor_type(&q4km, "blk.0.attn_norm.weight", 1, 512, NSTF_TYPE_F32, true, 16) == NSTF_TYPE_F32,
          "vectors stay");
}

/* A 2-layer model: dim 256 (K types apply), one 288-wide matrix (fallback),
 * and a low-rank factor of rank 40 (rows of 40: no block divides them; F16
 * in every input). */
static const char *k_names[] = {"token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_v.weight",
                                "blk.0.ffn_down.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight",
                                "blk.1.odd.weight", "output.weight", "blk.1.attn_q.lr_b.weight"};
static const int64_t k_ne[][2] = {{256, 40}, {256, 1}, {256, 64}, {512, 256}, {256, 64},
                                  {512, 256}, {288, 8}, {256, 40}, {40, 64}};
#define N_T 9
#define I_LR 8 /* the factor */

static void write_model(const char *path, nstf_type mtype) {
    nstf_gguf_writer *w;
    CHECK(nstf_gguf_writer_create(&w) == NSTF_OK, "writer");
    nstf_gguf_writer_set_str(w, "general.architecture", "llama");
    nstf_gguf_writer_set_u32(w, "llama.block_count", 2);
    nstf_gguf_writer_set_u32(w, "general.file_type", 1);
    int16_t i16 = -7;
    nstf_gguf_writer_set_arr(w, "test.i16", NSTF_GGUF_INT16, &i16, 1);
    test_rng r = {42};
    for (int i = 0; i < N_T; i++) {
        int64_t n = k_ne[i][0] * k_ne[i][1];
        float *x = malloc((size_t)n * 4);
        for (int64_t j = 0; j < n; j++) x[j] = 0.05f * rng_normal(&r);
        nstf_type t = k_ne[i][1] == 1 ? NSTF_TYPE_F32 : i == I_LR ? NSTF_TYPE_F16 : mtype;
        uint64_t bytes;
        nstf_type_row_bytes(t, n, &bytes);
        void *q = malloc(bytes);
        nstf_quantize_row(t, x, q, n);
        int64_t ne[2] = {k_ne[i][0], k_ne[i][1]};
        CHECK(nstf_gguf_writer_add_tensor(w, k_names[i], t, k_ne[i][1] == 1 ? 1 : 2, ne, q) == NSTF_OK, "add");
        free(x);
        free(q);
    }
    CHECK(nstf_gguf_writer_write(w, path, 0) == NSTF_OK, "write %s", path);
    nstf_gguf_writer_free(w);
}

static void test_file(const char *dir) {
    char in[512], out[512], qin[512];
    snprintf(in, sizeof in, "%s/in_f16.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    snprintf(qin, sizeof qin, "%s/in_q8.gguf", dir);
    write_model(in, NSTF_TYPE_F16);
    write_model(qin, NSTF_TYPE_Q8_0);
    nstf_quant_params p = {.n_threads = 3};
    CHECK(nstf_quant_target_parse("Q4_K_M", &p.target), "target");
    CHECK(nstf_quantize_file(in, out, &p) == NSTF_OK, "quantize: %s", nstf_last_error());
    nstf_gguf *gi = NULL, *go = NULL;
    CHECK(nstf_gguf_open(in, &gi) == NSTF_OK && nstf_gguf_open(out, &go) == NSTF_OK, "open");
    if (gi && go) {
        /* layer 1 of 2 is use_more_bits (i >= 7n/8) */
        const nstf_type want[N_T] = {NSTF_TYPE_Q4_K, NSTF_TYPE_F32, NSTF_TYPE_Q4_K, NSTF_TYPE_Q4_K,
                                     NSTF_TYPE_Q6_K, NSTF_TYPE_Q6_K, NSTF_TYPE_Q5_0, NSTF_TYPE_Q6_K,
                                     NSTF_TYPE_F16};
        for (int i = 0; i < N_T; i++) {
            const nstf_gguf_tensor *ti = nstf_gguf_find_tensor(gi, k_names[i]);
            const nstf_gguf_tensor *to = nstf_gguf_find_tensor(go, k_names[i]);
            CHECK(ti && to && to->type == want[i], "%s: type %s, want %s", k_names[i],
                  to ? nstf_type_name(to->type) : "missing", nstf_type_name(want[i]));
            if (!ti || !to || to->type != want[i]) continue;
            /* bit-exact: the reference quantization of the dequantized input */
            float *x = malloc(ti->n_elems * 4);
            uint8_t *q = malloc(to->n_bytes);
            nstf_dequantize_row(ti->type, ti->data, x, (int64_t)ti->n_elems);
            if (to->type == ti->type) memcpy(q, ti->data, to->n_bytes);
            else nstf_quantize_row(to->type, x, q, (int64_t)ti->n_elems);
            CHECK(!memcmp(q, to->data, to->n_bytes), "%s: data is not the reference quantization", k_names[i]);
            free(x);
            free(q);
        }
        uint32_t ft = 0;
        CHECK(nstf_gguf_get_u32(go, "general.file_type", &ft) == NSTF_OK && ft == 15, "file_type 15 (Q4_K_M)");
        CHECK(nstf_gguf_get_u32_or(go, "general.quantization_version", 0) == 2, "quantization_version");
        const nstf_gguf_kv *kv = nstf_gguf_find_kv(go, "test.i16");
        CHECK(kv && kv->type == NSTF_GGUF_ARRAY && kv->arr_type == NSTF_GGUF_INT16 && kv->arr_n == 1 &&
                  ((const int16_t *)kv->arr_data)[0] == -7, "array kv copied");
        CHECK(nstf_gguf_get_u32_or(go, "llama.block_count", 0) == 2, "kv copied");
    }
    nstf_gguf_close(gi);
    nstf_gguf_close(go);

    /* quantized input: refused, OUT untouched; accepted with allow_requantize */
    FILE *f = fopen(out, "rb");
    CHECK(f != NULL, "OUT written");
    long size_before = -1;
    if (f) {
        fseek(f, 0, SEEK_END);
        size_before = ftell(f);
        fclose(f);
    }
    CHECK(nstf_quantize_file(qin, out, &p) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "--allow-requantize"), "requantize refused: %s", nstf_last_error());
    f = fopen(out, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        CHECK(ftell(f) == size_before, "a refused run leaves OUT as it was");
        fclose(f);
    }
    p.allow_requantize = true;
    CHECK(nstf_quantize_file(qin, out, &p) == NSTF_OK, "requantize allowed: %s", nstf_last_error());
    CHECK(nstf_quantize_file("/nonexistent/in.gguf", out, &p) != NSTF_OK, "missing input");

    /* IQ4_NL (llama.cpp's ftype 25): every matrix IQ4_NL (the 288-wide one
     * too: blocks of 32), the output Q6_K, the data the reference
     * quantization (ggml's bit for bit: test_dtype); with 2 layers no
     * ffn_down is in the first eighth */
    nstf_quant_params pn = {.n_threads = 2};
    CHECK(nstf_quant_target_parse("iq4_nl", &pn.target), "IQ4_NL target");
    CHECK(nstf_quantize_file(in, out, &pn) == NSTF_OK, "quantize IQ4_NL: %s", nstf_last_error());
    gi = go = NULL;
    CHECK(nstf_gguf_open(in, &gi) == NSTF_OK && nstf_gguf_open(out, &go) == NSTF_OK, "open IQ4_NL");
    for (int i = 0; gi && go && i < N_T; i++) {
        const nstf_gguf_tensor *ti = nstf_gguf_find_tensor(gi, k_names[i]), *to = nstf_gguf_find_tensor(go, k_names[i]);
        const nstf_type want = k_ne[i][1] == 1 ? NSTF_TYPE_F32
                               : i == I_LR     ? NSTF_TYPE_F16
                               : !strcmp(k_names[i], "output.weight") ? NSTF_TYPE_Q6_K
                                                                      : NSTF_TYPE_IQ4_NL;
        CHECK(ti && to && to->type == want, "IQ4_NL file: %s is %s, want %s", k_names[i],
              to ? nstf_type_name(to->type) : "missing", nstf_type_name(want));
        if (!ti || !to || to->type != want || want != NSTF_TYPE_IQ4_NL) continue;
        float *x = malloc(ti->n_elems * 4);
        uint8_t *q = malloc(to->n_bytes);
        nstf_dequantize_row(ti->type, ti->data, x, (int64_t)ti->n_elems);
        nstf_quantize_row(to->type, x, q, (int64_t)ti->n_elems);
        CHECK(!memcmp(q, to->data, to->n_bytes), "IQ4_NL file: %s is not the reference quantization", k_names[i]);
        free(x);
        free(q);
    }
    uint32_t ftn = 0;
    CHECK(go && nstf_gguf_get_u32(go, "general.file_type", &ftn) == NSTF_OK && ftn == 25, "file_type 25 (IQ4_NL)");
    nstf_gguf_close(gi);
    nstf_gguf_close(go);

    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s/out.gguf.tmp.%ld", dir, (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "no temporary file left behind");
    remove(in);
    remove(out);
    remove(qin);
}

int main(void) {
    test_rules();
    char dir[] = "/tmp/nstf_test_quantize_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    test_file(dir);
    rmdir(dir);
    return test_finish("test_quantize");
}
