/* fuzz_gguf.c — libFuzzer target for the GGUF reader (src/io/gguf.c) and
 * printer (src/io/gguf_print.c).
 *
 * Every input is opened with nstf_gguf_open_memory from an exactly-sized
 * heap copy (so ASan sees any byte read past the end). A rejected input must
 * leave *out NULL and a non-empty message. An accepted one is exercised the
 * way the loader would: every getter on every key (typed and *_or), every
 * array element, every tensor looked up by name with its first and last data
 * byte touched and its first row dequantized, and nstf_gguf_print (short and
 * full) into /dev/null. Then it is rebuilt with the writer from what the
 * reader returned and re-read: the second read must give the same tensors
 * (type, dims, bytes) and the same values, which checks reader and writer
 * against each other (alignments up to 64 KiB). A failed invariant traps (the input becomes a crash
 * file). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#include "core/dtype.h"
#include "core/mem.h"
#include "io/gguf.h"

#define FAIL FUZZ_FAIL

static FILE *g_null;
static volatile uint64_t g_sink; /* keeps the touched bytes alive */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_null = fopen("/dev/null", "w");
    return 0;
}

/* A NUL-terminated copy of a gguf string; NULL if it holds a NUL byte
 * (such a name cannot be looked up by a C string). */
static char *cstr(nstf_gguf_str s) {
    if (s.len && memchr(s.ptr, 0, (size_t)s.len)) return NULL;
    char *c = malloc((size_t)s.len + 1);
    if (!c) return NULL;
    if (s.len) memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = 0;
    return c;
}

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    const volatile uint8_t *b = p;
    g_sink += b[0] + b[n - 1];
}

static uint64_t elem_size(uint32_t t) {
    static const uint8_t k[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof k ? k[t] : 0;
}

static void exercise_getters(const nstf_gguf *g) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const nstf_gguf_kv *kv = &g->kv[i];
        touch(kv->key.ptr, kv->key.len);
        char *key = cstr(kv->key);
        if (!key) continue;
        if (nstf_gguf_find_kv(g, key) != kv) FAIL("key #%llu not found by its own name", (unsigned long long)i);
        uint32_t u;
        float f;
        bool b;
        nstf_gguf_str s;
        const nstf_gguf_kv *a;
        if (nstf_gguf_get_u32(g, key, &u) == NSTF_OK) g_sink += u;
        if (nstf_gguf_get_f32(g, key, &f) == NSTF_OK) g_sink += (uint64_t)(f == f);
        if (nstf_gguf_get_bool(g, key, &b) == NSTF_OK) g_sink += b;
        if (nstf_gguf_get_str(g, key, &s) == NSTF_OK) touch(s.ptr, s.len);
        g_sink += nstf_gguf_get_u32_or(g, key, 7);
        g_sink += (uint64_t)(nstf_gguf_get_f32_or(g, key, 1.0f) > 0);
        g_sink += nstf_gguf_get_bool_or(g, key, true);
        g_sink += nstf_gguf_str_eq(kv->key, key);
        g_sink += (uintptr_t)nstf_gguf_vtype_name(kv->type);
        for (uint32_t t = 0; t <= NSTF_GGUF_FLOAT64 + 1; t++)
            if (nstf_gguf_get_arr(g, key, (nstf_gguf_vtype)t, &a) == NSTF_OK && a != kv)
                FAIL("get_arr returned another kv");
        if (kv->type == NSTF_GGUF_ARRAY) {
            if (kv->arr_type == NSTF_GGUF_STRING) {
                for (uint64_t j = 0; j < kv->arr_n; j++) touch(kv->arr_strs[j].ptr, kv->arr_strs[j].len);
            } else {
                uint64_t es = elem_size(kv->arr_type);
                if (!es) FAIL("array of non-scalar type %u", (unsigned)kv->arr_type);
                touch(kv->arr_data, kv->arr_n * es);
            }
        }
        free(key);
    }
    /* lookups that must miss or hit without reading out of bounds */
    g_sink += (uintptr_t)nstf_gguf_find_kv(g, "");
    g_sink += (uintptr_t)nstf_gguf_find_kv(g, "general.architecture");
    g_sink += (uintptr_t)nstf_gguf_find_tensor(g, "token_embd.weight");
}

static void exercise_tensors(const nstf_gguf *g) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        if (t->n_bytes == 0) FAIL("tensor #%llu has 0 bytes", (unsigned long long)i);
        const uint8_t *d = t->data;
        if (d < g->base + g->data_offset || t->n_bytes > g->size ||
            (uint64_t)(d - g->base) > g->size - t->n_bytes)
            FAIL("tensor #%llu data outside the image", (unsigned long long)i);
        touch(d, t->n_bytes);
        char *name = cstr(t->name);
        if (name) {
            if (nstf_gguf_find_tensor(g, name) != t) FAIL("tensor #%llu not found by name", (unsigned long long)i);
            free(name);
        }
        /* first row, as the model loader's dequantizing paths read it */
        if (t->ne[0] <= 65536) {
            float *row = malloc((size_t)t->ne[0] * sizeof *row);
            if (row) {
                nstf_dequantize_row(t->type, d, row, t->ne[0]);
                g_sink += (uint64_t)(row[t->ne[0] - 1] == row[0]);
                free(row);
            }
        }
    }
}

/* ---- writer round trip --------------------------------------------------- */

static bool kv_writable(const nstf_gguf_kv *kv) {
    if (kv->key.len == 0 || memchr(kv->key.ptr, 0, (size_t)kv->key.len)) return false;
    switch (kv->type) {
    case NSTF_GGUF_UINT32: case NSTF_GGUF_INT32: case NSTF_GGUF_UINT64: case NSTF_GGUF_FLOAT32:
    case NSTF_GGUF_BOOL:
        return true;
    case NSTF_GGUF_STRING:
        return !(kv->val.str.len && memchr(kv->val.str.ptr, 0, (size_t)kv->val.str.len));
    case NSTF_GGUF_ARRAY:
        if (kv->arr_type != NSTF_GGUF_STRING) return true;
        for (uint64_t j = 0; j < kv->arr_n; j++)
            if (kv->arr_strs[j].len && memchr(kv->arr_strs[j].ptr, 0, (size_t)kv->arr_strs[j].len))
                return false;
        return true;
    default:
        return false;
    }
}

static nstf_status write_kv(nstf_gguf_writer *w, const char *key, const nstf_gguf_kv *kv) {
    switch (kv->type) {
    case NSTF_GGUF_UINT32: return nstf_gguf_writer_set_u32(w, key, (uint32_t)kv->val.u64);
    case NSTF_GGUF_INT32: return nstf_gguf_writer_set_i32(w, key, (int32_t)kv->val.i64);
    case NSTF_GGUF_UINT64: return nstf_gguf_writer_set_u64(w, key, kv->val.u64);
    case NSTF_GGUF_FLOAT32: return nstf_gguf_writer_set_f32(w, key, (float)kv->val.f64);
    case NSTF_GGUF_BOOL: return nstf_gguf_writer_set_bool(w, key, kv->val.u64 != 0);
    case NSTF_GGUF_STRING: {
        char *v = cstr(kv->val.str);
        if (!v) return NSTF_ERR_OOM;
        nstf_status st = nstf_gguf_writer_set_str(w, key, v);
        free(v);
        return st;
    }
    case NSTF_GGUF_ARRAY:
        if (kv->arr_type != NSTF_GGUF_STRING)
            return nstf_gguf_writer_set_arr(w, key, kv->arr_type, kv->arr_n ? kv->arr_data : NULL, kv->arr_n);
        else {
            char **v = calloc(kv->arr_n ? (size_t)kv->arr_n : 1, sizeof *v);
            nstf_status st = v ? NSTF_OK : NSTF_ERR_OOM;
            for (uint64_t j = 0; j < kv->arr_n && st == NSTF_OK; j++)
                if (!(v[j] = cstr(kv->arr_strs[j]))) st = NSTF_ERR_OOM;
            if (st == NSTF_OK) st = nstf_gguf_writer_set_arr_str(w, key, (const char *const *)v, kv->arr_n);
            for (uint64_t j = 0; v && j < kv->arr_n; j++) free(v[j]);
            free(v);
            return st;
        }
    default: return NSTF_ERR_INTERNAL;
    }
}

static bool same_value(const nstf_gguf_kv *a, const nstf_gguf_kv *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case NSTF_GGUF_FLOAT32: return memcmp(&a->val.f64, &b->val.f64, 8) == 0 || (a->val.f64 != a->val.f64 && b->val.f64 != b->val.f64);
    case NSTF_GGUF_STRING: return a->val.str.len == b->val.str.len && (a->val.str.len == 0 || memcmp(a->val.str.ptr, b->val.str.ptr, (size_t)a->val.str.len) == 0);
    case NSTF_GGUF_ARRAY:
        if (a->arr_type != b->arr_type || a->arr_n != b->arr_n) return false;
        if (a->arr_type == NSTF_GGUF_STRING) {
            for (uint64_t j = 0; j < a->arr_n; j++)
                if (a->arr_strs[j].len != b->arr_strs[j].len ||
                    (a->arr_strs[j].len && memcmp(a->arr_strs[j].ptr, b->arr_strs[j].ptr, (size_t)a->arr_strs[j].len)))
                    return false;
            return true;
        }
        return a->arr_n == 0 || memcmp(a->arr_data, b->arr_data, (size_t)(a->arr_n * elem_size(a->arr_type))) == 0;
    default: return a->val.u64 == b->val.u64;
    }
}

static void round_trip(const nstf_gguf *g) {
    /* The writer pads the header to the alignment: with 2^31 that is a 2 GiB
     * image, past the fuzzer's memory limit. tests/test_gguf.c covers large
     * alignments; here they stop at 64 KiB. */
    if (g->alignment > (1u << 16)) return;
    nstf_gguf_writer *w = NULL;
    if (nstf_gguf_writer_create(&w) != NSTF_OK) return;
    uint64_t n_kept = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const nstf_gguf_kv *kv = &g->kv[i];
        if (!kv_writable(kv)) continue;
        char *key = cstr(kv->key);
        if (!key) goto out;
        nstf_status st = write_kv(w, key, kv);
        free(key);
        if (st == NSTF_ERR_OOM) goto out;
        if (st != NSTF_OK) FAIL("writer rejected key/value #%llu the reader accepted: %s", (unsigned long long)i, nstf_last_error());
        n_kept++;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        char *name = cstr(t->name);
        if (!name) goto out; /* a NUL in a tensor name: not expressible to the writer */
        nstf_status st = nstf_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
        free(name);
        if (st == NSTF_ERR_OOM) goto out;
        if (st != NSTF_OK) FAIL("writer rejected tensor #%llu the reader accepted: %s", (unsigned long long)i, nstf_last_error());
    }
    void *img = NULL;
    uint64_t img_size = 0;
    nstf_status st = nstf_gguf_writer_write_memory(w, (uint32_t)g->alignment, &img, &img_size);
    if (st == NSTF_ERR_OOM) goto out;
    if (st != NSTF_OK) FAIL("writer failed: %s", nstf_last_error());
    nstf_gguf *h = NULL;
    st = nstf_gguf_open_memory(img, img_size, "rewritten.gguf", &h);
    if (st != NSTF_OK) FAIL("reader rejected the writer's image: %s", nstf_last_error());
    if (h->n_kv != n_kept || h->n_tensors != g->n_tensors || h->alignment != g->alignment)
        FAIL("rewritten image: n_kv %llu (want %llu), n_tensors %llu (want %llu), alignment %llu (want %llu)",
             (unsigned long long)h->n_kv, (unsigned long long)n_kept, (unsigned long long)h->n_tensors,
             (unsigned long long)g->n_tensors, (unsigned long long)h->alignment, (unsigned long long)g->alignment);
    for (uint64_t i = 0, k = 0; i < g->n_kv; i++) {
        if (!kv_writable(&g->kv[i])) continue;
        if (!same_value(&g->kv[i], &h->kv[k])) FAIL("key/value #%llu differs after the round trip", (unsigned long long)i);
        k++;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *a = &g->tensors[i], *b = &h->tensors[i];
        if (a->type != b->type || a->n_dims != b->n_dims || memcmp(a->ne, b->ne, sizeof a->ne) ||
            a->n_bytes != b->n_bytes || memcmp(a->data, b->data, (size_t)a->n_bytes))
            FAIL("tensor #%llu differs after the round trip", (unsigned long long)i);
    }
    nstf_gguf_close(h);
    nstf_free(img);
out:
    nstf_gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    nstf_gguf *g = (nstf_gguf *)(uintptr_t)1;
    nstf_clear_error();
    nstf_status st = nstf_gguf_open_memory(copy, size, "fuzz.gguf", &g);
    if (st != NSTF_OK) {
        if (g != NULL) FAIL("out pointer not NULL after failure");
        const char *msg = nstf_last_error();
        if (st != NSTF_ERR_OOM && (!msg[0] || strcmp(msg, "no error") == 0)) FAIL("failure without a message");
        free(copy);
        return 0;
    }
    exercise_getters(g);
    exercise_tensors(g);
    if (g_null) {
        if (nstf_gguf_print(g, g_null, false) != NSTF_OK) FAIL("print failed: %s", nstf_last_error());
        if (nstf_gguf_print(g, g_null, true) != NSTF_OK) FAIL("print (all) failed: %s", nstf_last_error());
    }
    round_trip(g);
    nstf_gguf_close(g);
    free(copy);
    return 0;
}
