/* test_gguf.c — GGUF reader/writer tests.
 *
 *  1. writer -> file -> reader round trip for every tensor type with 1..4
 *     dims and every key/value type (arrays of ints, floats, strings),
 *     compared byte for byte, at the default and non-default alignments;
 *  2. hostile files built byte by byte in this file: every prefix of a small
 *     valid file, and ~40 corruptions, each checked for its status AND a
 *     distinctive message substring; the same bytes are checked in under
 *     tests/data/hostile/ and opened from disk (the checked-in files must
 *     equal what this file generates: regenerate with
 *     `test_gguf --write-hostile tests/data/hostile`);
 *     Inputs found by fuzz/fuzz_gguf are kept as regressions.
 * The real model's file is read by test_gguf_model.c.
 * Metric: exact equality everywhere (this is a file format). */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/mem.h"
#include "io/gguf.h"
#include "hostile_corpus.h"
#include "test_util.h"

typedef unsigned long long ull;

/* ---- byte builder (bb, bb_put, bb_u8/u32/u64 in hostile_corpus.h) -------- */

static void bb_strn(bb *b, uint64_t len, const char *s) { bb_u64(b, len); bb_put(b, s, strlen(s)); }
static void bb_str(bb *b, const char *s) { bb_strn(b, strlen(s), s); }

static void hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void kv_key(bb *b, const char *key, uint32_t type) { bb_str(b, key); bb_u32(b, type); }
static void kv_u32(bb *b, const char *key, uint32_t v) { kv_key(b, key, NSTF_GGUF_UINT32); bb_u32(b, v); }
static void kv_s(bb *b, const char *key, const char *v) { kv_key(b, key, NSTF_GGUF_STRING); bb_str(b, v); }
static void kv_bool(bb *b, const char *key, uint8_t v) { kv_key(b, key, NSTF_GGUF_BOOL); bb_u8(b, v); }
static void kv_arr_hdr(bb *b, const char *key, uint32_t elem, uint64_t n) {
    kv_key(b, key, NSTF_GGUF_ARRAY);
    bb_u32(b, elem);
    bb_u64(b, n);
}
static void ti(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, off);
}
/* Pad to `align`, then `n` bytes of a pattern. */
static void data(bb *b, uint64_t align, size_t n) {
    while (b->n % align) bb_u8(b, 0);
    for (size_t i = 0; i < n; i++) bb_u8(b, (uint8_t)(i * 7 + 1));
}

/* ---- the valid small image and its parts -------------------------------- */

/* 5 key/values and 2 tensors: a F32 [8] (32 bytes) at 0 and a Q8_0 [32, 1]
 * (34 bytes) at 32. The last tensor ends exactly at the end of the file, so
 * every shorter prefix must be rejected. */
#define STD_NKV 5
static void std_kvs(bb *b) {
    kv_s(b, "general.architecture", "llama");
    kv_u32(b, "x.count", 7);
    kv_bool(b, "x.flag", 1);
    kv_arr_hdr(b, "x.list", NSTF_GGUF_INT32, 3);
    bb_u32(b, 1); bb_u32(b, (uint32_t)-2); bb_u32(b, 3);
    kv_arr_hdr(b, "x.names", NSTF_GGUF_STRING, 2);
    bb_str(b, "ab"); bb_str(b, "");
}
static void std_tensors(bb *b) {
    ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
    ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32);
}
static void std_data(bb *b) { data(b, 32, 32 + 34); }
static void mk_valid(bb *b) {
    hdr(b, 3, 2, STD_NKV);
    std_kvs(b);
    std_tensors(b);
    std_data(b);
}
/* One extra kv (before the standard ones) and the standard rest. */
#define WITH_EXTRA_KV(body) \
    hdr(b, 3, 2, STD_NKV + 1); body; std_kvs(b); std_tensors(b); std_data(b)
/* Standard kvs; custom tensor infos. */
#define WITH_TENSORS(nt, body) \
    hdr(b, 3, nt, STD_NKV); std_kvs(b); body; std_data(b)

/* ---- hostile cases ------------------------------------------------------- */

static void h_empty(bb *b) { (void)b; }
static void h_tiny(bb *b) { bb_put(b, "GG", 2); }
static void h_bad_magic(bb *b) { mk_valid(b); b->p[3] = 'X'; }
static void h_version0(bb *b) { mk_valid(b); b->p[4] = 0; }
static void h_version1(bb *b) { mk_valid(b); b->p[4] = 1; }
static void h_version4(bb *b) { mk_valid(b); b->p[4] = 4; }
static void h_big_endian(bb *b) { mk_valid(b); b->p[4] = 0; b->p[7] = 3; }
static void h_trunc_header(bb *b) { mk_valid(b); b->n = 10; }
static void h_huge_n_kv(bb *b) { hdr(b, 3, 2, 1ull << 40); std_kvs(b); std_tensors(b); std_data(b); }
static void h_huge_n_tensors(bb *b) { hdr(b, 3, 1ull << 60, STD_NKV); std_kvs(b); std_tensors(b); std_data(b); }
static void h_key_past_eof(bb *b) { hdr(b, 3, 0, 1); bb_strn(b, 1000, "general.architecture"); bb_u32(b, 8); }
static void h_huge_string(bb *b) {
    WITH_EXTRA_KV(kv_key(b, "x.s", NSTF_GGUF_STRING); bb_strn(b, 1ull << 63, "abc"));
}
static void h_unknown_kv_type(bb *b) { WITH_EXTRA_KV(kv_key(b, "x.t", 13); bb_u32(b, 0)); }
static void h_nested_array(bb *b) {
    WITH_EXTRA_KV(kv_arr_hdr(b, "x.nest", NSTF_GGUF_ARRAY, 1); bb_u32(b, NSTF_GGUF_UINT8); bb_u64(b, 1); bb_u8(b, 0));
}
static void h_unknown_elem_type(bb *b) { WITH_EXTRA_KV(kv_arr_hdr(b, "x.a", 99, 1); bb_u32(b, 0)); }
static void h_array_overflow(bb *b) {
    WITH_EXTRA_KV(kv_arr_hdr(b, "x.a", NSTF_GGUF_UINT64, (1ull << 61) + 1); bb_u64(b, 0));
}
static void h_array_past_eof(bb *b) { WITH_EXTRA_KV(kv_arr_hdr(b, "x.a", NSTF_GGUF_UINT32, 1000); bb_u32(b, 0)); }
static void h_str_array_huge(bb *b) { WITH_EXTRA_KV(kv_arr_hdr(b, "x.a", NSTF_GGUF_STRING, 1ull << 40)); }
static void h_str_array_elem(bb *b) {
    WITH_EXTRA_KV(kv_arr_hdr(b, "x.a", NSTF_GGUF_STRING, 2); bb_str(b, "ok"); bb_strn(b, 500, "no"));
}
static void h_bool2(bb *b) { WITH_EXTRA_KV(kv_bool(b, "x.b", 2)); }
static void h_bool_arr2(bb *b) {
    WITH_EXTRA_KV(kv_arr_hdr(b, "x.b", NSTF_GGUF_BOOL, 3); bb_u8(b, 1); bb_u8(b, 2); bb_u8(b, 0));
}
static void h_empty_key(bb *b) { WITH_EXTRA_KV(kv_u32(b, "", 1)); }
static void h_dup_key(bb *b) { WITH_EXTRA_KV(kv_u32(b, "x.count", 1)); }
static void h_align0(bb *b) { WITH_EXTRA_KV(kv_u32(b, "general.alignment", 0)); }
static void h_align48(bb *b) { WITH_EXTRA_KV(kv_u32(b, "general.alignment", 48)); }
static void h_align_type(bb *b) { WITH_EXTRA_KV(kv_key(b, "general.alignment", NSTF_GGUF_UINT64); bb_u64(b, 64)); }
static void h_empty_tname(bb *b) {
    WITH_TENSORS(2, ti(b, "", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_dup_tensor(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "a", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_ndims0(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 0, NULL, NSTF_TYPE_F32, 0); ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_ndims5(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 5, (uint64_t[]){8, 1, 1, 1, 1}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_zero_dim(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 0}, NSTF_TYPE_Q8_0, 32));
}
static void h_dim_huge(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){1ull << 63}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_dims_overflow(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 3, (uint64_t[]){1ull << 32, 1ull << 16, 1ull << 16}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_bytes_overflow(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 2, (uint64_t[]){1ull << 31, 1ull << 31}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_not_block(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){33, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_iq2xxs(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0); ti(b, "b", 2, (uint64_t[]){256, 1}, 16, 32));
}
static void h_type_huge(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, 0xdeadbeef, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 32));
}
static void h_offset_eof(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 4096));
}
static void h_offset_overflow(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, UINT64_MAX - 31));
}
static void h_misaligned(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 16));
}
static void h_overlap(bb *b) {
    WITH_TENSORS(2, ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0);
                 ti(b, "b", 2, (uint64_t[]){32, 1}, NSTF_TYPE_Q8_0, 0));
}
static void h_trunc_data(bb *b) { mk_valid(b); b->n -= 1; }
static void h_trunc_tinfo(bb *b) { hdr(b, 3, 2, STD_NKV); std_kvs(b); ti(b, "a", 1, (uint64_t[]){8}, NSTF_TYPE_F32, 0); }

#define F NSTF_ERR_FORMAT
#define U NSTF_ERR_UNSUPPORTED
static const hostile_case k_cases[] = {
    {"empty_file", h_empty, F, "empty file"},
    {"tiny_file", h_tiny, F, "bad magic \"\\x47\\x47\""},
    {"bad_magic", h_bad_magic, F, "bad magic \"\\x47\\x47\\x55\\x58\""},
    {"version_0", h_version0, F, "invalid GGUF version 0"},
    {"version_1", h_version1, U, "GGUF version 1 (32-bit counts) is not supported"},
    {"version_4", h_version4, U, "GGUF version 4 is not supported"},
    {"big_endian", h_big_endian, U, "big-endian GGUF file (version reads as 3 byte-swapped)"},
    {"truncated_header", h_trunc_header, F, "n_tensors (8 bytes at offset 8) extends past end of file"},
    {"huge_n_kv", h_huge_n_kv, F, "n_kv = 1099511627776 is implausible"},
    {"huge_n_tensors", h_huge_n_tensors, F, "n_tensors = 1152921504606846976 is implausible"},
    {"key_length_past_eof", h_key_past_eof, F, "key/value #0: key has length 1000 at offset 24"},
    {"huge_string_length", h_huge_string, F, "key 'x.s': string value has length 9223372036854775808"},
    {"unknown_kv_type", h_unknown_kv_type, F, "key 'x.t': unknown value type 13"},
    {"nested_array", h_nested_array, F, "key 'x.nest': nested array"},
    {"unknown_array_elem_type", h_unknown_elem_type, F, "key 'x.a': unknown array element type 99"},
    {"array_count_overflow", h_array_overflow, F, "array of 2305843009213693953 uint64 elements: byte size overflows"},
    {"array_past_eof", h_array_past_eof, F, "key 'x.a': array data (4000 bytes"},
    {"string_array_huge_count", h_str_array_huge, F, "string array of 1099511627776 elements cannot fit"},
    {"string_array_elem_past_eof", h_str_array_elem, F, "key 'x.a': string array element 1"},
    {"bool_value_2", h_bool2, F, "key 'x.b': bool value is 2"},
    {"bool_array_value_2", h_bool_arr2, F, "key 'x.b': bool array element 1 is 2"},
    {"empty_key", h_empty_key, F, "key/value #0 at offset 24 has an empty key"},
    {"duplicate_key", h_dup_key, F, "duplicate key 'x.count' (key/value #0 and #2)"},
    {"alignment_0", h_align0, F, "general.alignment 0 is not a power of two"},
    {"alignment_48", h_align48, F, "general.alignment 48 is not a power of two"},
    {"alignment_u64", h_align_type, F, "general.alignment has type uint64 (must be uint32)"},
    {"empty_tensor_name", h_empty_tname, F, "tensor #0 at offset 202 has an empty name"},
    {"duplicate_tensor", h_dup_tensor, F, "duplicate tensor name 'a' (tensors #0 and #1)"},
    {"n_dims_0", h_ndims0, F, "tensor 'a': n_dims 0 is out of range"},
    {"n_dims_5", h_ndims5, F, "tensor 'a': n_dims 5 is out of range"},
    {"zero_dim", h_zero_dim, F, "tensor 'b': dim 1 is 0"},
    {"dim_too_large", h_dim_huge, F, "tensor 'a': dim 0 = 9223372036854775808 is too large"},
    {"dims_product_overflow", h_dims_overflow, F, "tensor 'a': element count overflows at dim 2"},
    {"byte_size_overflow", h_bytes_overflow, F, "tensor 'a': byte size overflows"},
    {"ne0_not_block_multiple", h_not_block, F, "tensor 'b': ne[0] = 33 is not a multiple of the block size 32"},
    {"unknown_tensor_type_iq2_xxs", h_iq2xxs, U, "tensor 'b' has type id 16 (IQ2_XXS), which is not supported"},
    {"unknown_tensor_type_huge", h_type_huge, U, "tensor 'a' has type id 3735928559 (unknown)"},
    {"offset_past_eof", h_offset_eof, F, "tensor 'b' data [offset 4384, 34 bytes] extends past end of file"},
    {"offset_size_overflow", h_offset_overflow, F, "tensor 'b': data offset 18446744073709551584 + size 34 overflows"},
    {"misaligned_offset", h_misaligned, F, "tensor 'b': data offset 16 is not aligned to 32"},
    {"overlapping_tensors", h_overlap, F, "tensor 'b' data [offset 288, 34 bytes] overlaps tensor 'a' [offset 288, 32 bytes]"},
    {"truncated_tensor_data", h_trunc_data, F, "tensor 'b' data [offset 320, 34 bytes] extends past end of file (size 353)"},
    {"truncated_tensor_info", h_trunc_tinfo, F, "tensor #1: tensor name (8 bytes"},
};
#undef F
#undef U
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

static nstf_status open_memory(const void *d, uint64_t n, const char *name, void **out) {
    return nstf_gguf_open_memory(d, n, name, (nstf_gguf **)out);
}
static nstf_status open_path(const char *path, void **out) { return nstf_gguf_open(path, (nstf_gguf **)out); }
static void close_gguf(void *g) { nstf_gguf_close(g); }

static const hostile_corpus k_corpus = {
    .cases = k_cases,
    .n = N_CASES,
    .ext = ".gguf",
    .dir = NSTF_SOURCE_DIR "/tests/data/hostile",
    .title = "Hostile GGUF corpus",
    .intro = "Malformed GGUF files, each opened by `tests/test_gguf.c`, which checks the\n"
             "status and a distinctive substring of the error message. The files are\n"
             "generated by the test itself (byte-level construction, mostly from a small\n"
             "valid image); the test fails if a checked-in file differs from what it\n"
             "generates. Regenerate after changing a case with",
    .regen = "build/tests/test_gguf --write-hostile tests/data/hostile",
    .test = "test_gguf.c",
    .verbose_env = "TEST_GGUF_VERBOSE",
    .open_memory = open_memory,
    .open_path = open_path,
    .close = close_gguf,
};

static void test_valid_image(void) {
    bb b = {0};
    mk_valid(&b);
    nstf_gguf *g = NULL;
    nstf_status st = nstf_gguf_open_memory(b.p, b.n, "valid.gguf", &g);
    CHECK(st == NSTF_OK, "valid image: %s", nstf_last_error());
    if (st == NSTF_OK) {
        CHECK(g->n_kv == STD_NKV && g->n_tensors == 2 && g->version == 3, "counts");
        const nstf_gguf_kv *kv;
        CHECK(nstf_gguf_get_arr(g, "x.list", NSTF_GGUF_INT32, &kv) == NSTF_OK && kv->arr_n == 3, "x.list");
        int32_t v[3];
        memcpy(v, kv->arr_data, sizeof v);
        CHECK(v[0] == 1 && v[1] == -2 && v[2] == 3, "x.list values");
        CHECK(nstf_gguf_get_arr(g, "x.names", NSTF_GGUF_STRING, &kv) == NSTF_OK && kv->arr_n == 2 &&
                  nstf_gguf_str_eq(kv->arr_strs[0], "ab") && nstf_gguf_str_eq(kv->arr_strs[1], ""),
              "x.names");
        CHECK(nstf_gguf_get_bool_or(g, "x.flag", false) == true, "x.flag");
        const nstf_gguf_tensor *t = nstf_gguf_find_tensor(g, "b");
        CHECK(t && t->type == NSTF_TYPE_Q8_0 && t->n_bytes == 34 && (const uint8_t *)t->data + 34 == b.p + b.n,
              "tensor b ends at EOF");
        nstf_gguf_close(g);
    }
    /* Version 2 has the same layout and is accepted. */
    b.p[4] = 2;
    st = nstf_gguf_open_memory(b.p, b.n, "v2.gguf", &g);
    CHECK(st == NSTF_OK && g->version == 2, "version 2: %s", nstf_last_error());
    nstf_gguf_close(st == NSTF_OK ? g : NULL);
    b.p[4] = 3;
    /* Every proper prefix must fail cleanly (status FORMAT, a message naming
     * the file, no crash; ASan checks no byte past the prefix is read: each
     * prefix is copied into an exactly-sized heap block). */
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, b.p, n);
        g = NULL;
        st = nstf_gguf_open_memory(p, n, "prefix.gguf", &g);
        if (st != NSTF_ERR_FORMAT || g || !strstr(nstf_last_error(), "prefix.gguf")) {
            if (bad++ < 5)
                fprintf(stderr, "prefix %zu/%zu: status %d: %s\n", n, b.n, (int)st, nstf_last_error());
            nstf_gguf_close(g);
        }
        free(p);
    }
    CHECK(bad == 0, "%d of %zu truncated prefixes were not rejected cleanly", bad, b.n);
    printf("truncation: %zu prefixes rejected\n", b.n);
    free(b.p);
}

/* ---- open errors ---------------------------------------------------------- */

/* Inputs found by fuzz/fuzz_gguf (each also in fuzz/corpus/fuzz_gguf/). */
static void test_fuzz_regressions(void) {
    /* regress_alignment_2p30_no_tensors.gguf: no tensors, general.alignment
     * = 2^30, the file ends after the key/values. It is valid; data_offset
     * must stay inside the file (it was 2^30), and writing it back (header
     * padded to 2^30 bytes) took minutes because padding went byte by byte. */
    bb b = {0};
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 1u << 30);
    nstf_gguf *g = NULL;
    nstf_status st = nstf_gguf_open_memory(b.p, b.n, "align2p30.gguf", &g);
    CHECK(st == NSTF_OK, "alignment 2^30 without tensors: %s", nstf_last_error());
    if (st == NSTF_OK) {
        CHECK(g->alignment == 1u << 30 && g->data_offset <= g->size,
              "data_offset %llu must not pass the end of the file (%llu bytes)", (ull)g->data_offset,
              (ull)g->size);
        nstf_gguf_close(g);
    }
    free(b.p);
    /* the writer at a large alignment: one padded header, re-read */
    nstf_gguf_writer *w = NULL;
    CHECK(nstf_gguf_writer_create(&w) == NSTF_OK, "writer");
    CHECK(nstf_gguf_writer_set_str(w, "general.name", "big alignment") == NSTF_OK, "set_str");
    void *img = NULL;
    uint64_t n = 0;
    st = nstf_gguf_writer_write_memory(w, 1u << 24, &img, &n);
    CHECK(st == NSTF_OK && n == 1u << 24, "write at alignment 2^24: size %llu: %s", (ull)n, nstf_last_error());
    if (st == NSTF_OK) {
        st = nstf_gguf_open_memory(img, n, "align2p24.gguf", &g);
        CHECK(st == NSTF_OK && g->n_kv == 2 && g->alignment == 1u << 24 && g->data_offset == n,
              "re-read at alignment 2^24: %s", nstf_last_error());
        if (st == NSTF_OK) nstf_gguf_close(g);
    }
    nstf_free(img);
    nstf_gguf_writer_free(w);
}

static void test_open_errors(void) {
    nstf_gguf *g = (nstf_gguf *)1;
    nstf_status st = nstf_gguf_open(NSTF_BUILD_DIR "/no-such-file.gguf", &g);
    CHECK(st == NSTF_ERR_IO && g == NULL && strstr(nstf_last_error(), "no-such-file.gguf") &&
              strstr(nstf_last_error(), strerror(ENOENT)),
          "missing file: %d %s", (int)st, nstf_last_error());
    st = nstf_gguf_open(NSTF_BUILD_DIR, &g);
    CHECK(st == NSTF_ERR_IO && g == NULL && strstr(nstf_last_error(), NSTF_BUILD_DIR) &&
              strstr(nstf_last_error(), strerror(EISDIR)),
          "directory: %d %s", (int)st, nstf_last_error());
    const char *empty = NSTF_BUILD_DIR "/test_gguf_empty.gguf";
    CHECK(hostile_write_file(empty, "", 0) == 0, "create %s", empty);
    st = nstf_gguf_open(empty, &g);
    CHECK(st == NSTF_ERR_FORMAT && g == NULL && strstr(nstf_last_error(), "test_gguf_empty.gguf: empty file"),
          "empty: %d %s", (int)st, nstf_last_error());
    unlink(empty);
}

/* ---- round trip ----------------------------------------------------------- */

static const nstf_type k_types[] = {NSTF_TYPE_F32, NSTF_TYPE_F16, NSTF_TYPE_BF16,
                                    NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1};
#define N_TYPES 6

typedef struct {
    char name[48];
    nstf_type type;
    uint32_t n_dims;
    int64_t ne[4];
    uint64_t bytes;
    uint8_t *data;
} rt_tensor;

static void test_round_trip(uint32_t alignment) {
    test_rng r = {0x9e3779b97f4a7c15ull ^ alignment};
    nstf_gguf_writer *w;
    CHECK(nstf_gguf_writer_create(&w) == NSTF_OK, "writer_create");
    /* scalars */
    CHECK(nstf_gguf_writer_set_str(w, "general.architecture", "llama") == NSTF_OK, "set_str");
    CHECK(nstf_gguf_writer_set_u32(w, "k.u32", 4000000000u) == NSTF_OK, "set_u32");
    CHECK(nstf_gguf_writer_set_i32(w, "k.i32", -123456) == NSTF_OK, "set_i32");
    CHECK(nstf_gguf_writer_set_u64(w, "k.u64", 0x123456789abcdefull) == NSTF_OK, "set_u64");
    CHECK(nstf_gguf_writer_set_f32(w, "k.f32", 1e-5f) == NSTF_OK, "set_f32");
    CHECK(nstf_gguf_writer_set_bool(w, "k.bool", true) == NSTF_OK, "set_bool");
    CHECK(nstf_gguf_writer_set_str(w, "k.empty_str", "") == NSTF_OK, "set_str empty");
    /* arrays of every fixed-size type */
    static const uint8_t esz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    uint8_t arrbuf[13][64];
    for (uint32_t t = 0; t <= NSTF_GGUF_FLOAT64; t++) {
        if (!esz[t]) continue;
        for (int i = 0; i < 64; i++) arrbuf[t][i] = (uint8_t)rng_next(&r);
        if (t == NSTF_GGUF_BOOL)
            for (int i = 0; i < 64; i++) arrbuf[t][i] &= 1;
        char key[32];
        snprintf(key, sizeof key, "arr.%s", nstf_gguf_vtype_name(t));
        CHECK(nstf_gguf_writer_set_arr(w, key, (nstf_gguf_vtype)t, arrbuf[t], 64 / esz[t]) == NSTF_OK,
              "set_arr %s: %s", key, nstf_last_error());
    }
    CHECK(nstf_gguf_writer_set_arr(w, "arr.empty", NSTF_GGUF_INT32, NULL, 0) == NSTF_OK, "empty arr");
    const char *strs[] = {"hello", "", "Ġt", "a\nb", "\xe4\xb8\xad\xe6\x96\x87"};
    CHECK(nstf_gguf_writer_set_arr_str(w, "arr.str", strs, 5) == NSTF_OK, "set_arr_str");
    int n_set = 7 + 11 + 1 + 1;

    /* writer-side errors */
    CHECK(nstf_gguf_writer_set_u32(w, "k.u32", 1) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "duplicate key 'k.u32'"),
          "dup key: %s", nstf_last_error());
    CHECK(nstf_gguf_writer_set_u32(w, "", 1) == NSTF_ERR_INVALID_ARG, "empty key");
    CHECK(nstf_gguf_writer_set_u64(w, "general.alignment", 64) == NSTF_ERR_INVALID_ARG, "alignment type");
    CHECK(nstf_gguf_writer_set_arr(w, "arr.bad", NSTF_GGUF_STRING, strs, 1) == NSTF_ERR_INVALID_ARG,
          "set_arr of strings");
    uint8_t two = 2;
    CHECK(nstf_gguf_writer_set_arr(w, "arr.badbool", NSTF_GGUF_BOOL, &two, 1) == NSTF_ERR_INVALID_ARG,
          "bool 2");

    /* tensors: every type x 1..4 dims */
    rt_tensor tt[N_TYPES * 4];
    int nt = 0;
    for (int ti_ = 0; ti_ < N_TYPES; ti_++)
        for (uint32_t nd = 1; nd <= 4; nd++) {
            rt_tensor *t = &tt[nt++];
            t->type = k_types[ti_];
            t->n_dims = nd;
            int64_t blk = nstf_type_block_elems(t->type);
            int64_t base[4] = {blk > 1 ? 64 : 7, 3, 2, 5};
            for (int d = 0; d < 4; d++) t->ne[d] = d < (int)nd ? base[d] : 1;
            snprintf(t->name, sizeof t->name, "blk.%d.%s.%ud", ti_, nstf_type_name(t->type), nd);
            uint64_t row;
            nstf_type_row_bytes(t->type, t->ne[0], &row);
            t->bytes = row * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
            t->data = malloc(t->bytes);
            for (uint64_t i = 0; i < t->bytes; i++) t->data[i] = (uint8_t)rng_next(&r);
            CHECK(nstf_gguf_writer_add_tensor(w, t->name, t->type, nd, t->ne, t->data) == NSTF_OK,
                  "add_tensor %s: %s", t->name, nstf_last_error());
            t->data[0] ^= 0xff; /* writer must have copied */
            t->data[0] ^= 0xff;
        }
    int64_t ne_bad[4] = {33, 1, 1, 1};
    CHECK(nstf_gguf_writer_add_tensor(w, "bad", NSTF_TYPE_Q4_0, 1, ne_bad, tt[0].data) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "not a multiple of the block size"),
          "ne0 not block multiple: %s", nstf_last_error());
    CHECK(nstf_gguf_writer_add_tensor(w, tt[0].name, NSTF_TYPE_F32, 1, tt[0].ne, tt[0].data) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "duplicate tensor name"),
          "dup tensor: %s", nstf_last_error());
    CHECK(nstf_gguf_writer_add_tensor(w, "bad", NSTF_TYPE_F32, 0, ne_bad, tt[0].data) == NSTF_ERR_INVALID_ARG,
          "n_dims 0");
    CHECK(nstf_gguf_writer_add_tensor(w, "bad", NSTF_TYPE_F32, 5, ne_bad, tt[0].data) == NSTF_ERR_INVALID_ARG,
          "n_dims 5");
    int64_t ne_zero[2] = {8, 0};
    CHECK(nstf_gguf_writer_add_tensor(w, "bad", NSTF_TYPE_F32, 2, ne_zero, tt[0].data) == NSTF_ERR_INVALID_ARG,
          "zero dim");
    CHECK(nstf_gguf_writer_add_tensor(w, "bad", (nstf_type)12, 1, ne_bad, tt[0].data) == NSTF_ERR_INVALID_ARG,
          "unsupported type");

    char path[512];
    snprintf(path, sizeof path, "%s/test_gguf_rt_%u_%d.gguf", NSTF_BUILD_DIR, alignment, (int)getpid());
    nstf_status st = nstf_gguf_writer_write(w, path, alignment);
    CHECK(st == NSTF_OK, "write: %s", nstf_last_error());
    void *img = NULL;
    uint64_t img_n = 0;
    CHECK(nstf_gguf_writer_write_memory(w, alignment, &img, &img_n) == NSTF_OK, "write_memory");
    if (alignment)
        CHECK(nstf_gguf_writer_write_memory(w, 3, &(void *){0}, &(uint64_t){0}) == NSTF_ERR_INVALID_ARG,
              "alignment 3 rejected");
    CHECK(nstf_gguf_writer_write(w, NSTF_BUILD_DIR "/no-such-dir/x.gguf", alignment) == NSTF_ERR_IO &&
              strstr(nstf_last_error(), "no-such-dir/x.gguf: cannot create"),
          "write to a missing directory: %s", nstf_last_error());
    nstf_gguf_writer_free(w);

    uint64_t align = alignment ? alignment : 32;
    bool extra = align != 32;
    nstf_gguf *g = NULL;
    st = nstf_gguf_open(path, &g);
    CHECK(st == NSTF_OK, "reopen: %s", nstf_last_error());
    if (st != NSTF_OK) goto done;
    CHECK(g->version == 3 && g->alignment == align, "version %u alignment %llu", g->version, (ull)g->alignment);
    CHECK(g->size == img_n && memcmp(g->base, img, img_n) == 0, "file == write_memory image");
    CHECK(g->n_kv == (uint64_t)n_set + extra, "n_kv %llu, expected %d", (ull)g->n_kv, n_set + extra);
    if (extra) {
        uint32_t a = 0;
        CHECK(nstf_gguf_get_u32(g, "general.alignment", &a) == NSTF_OK && a == align, "general.alignment");
        CHECK(nstf_gguf_str_eq(g->kv[g->n_kv - 1].key, "general.alignment"), "alignment kv is last");
    } else {
        CHECK(nstf_gguf_find_kv(g, "general.alignment") == NULL, "no general.alignment at default");
    }
    CHECK(nstf_gguf_str_eq(g->kv[0].key, "general.architecture") && nstf_gguf_str_eq(g->kv[1].key, "k.u32"),
          "kv order");
    nstf_gguf_str s;
    uint32_t u32 = 0;
    float f32 = 0;
    bool bl = false;
    CHECK(nstf_gguf_get_str(g, "general.architecture", &s) == NSTF_OK && nstf_gguf_str_eq(s, "llama"), "arch");
    CHECK(nstf_gguf_get_u32(g, "k.u32", &u32) == NSTF_OK && u32 == 4000000000u, "u32");
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, "k.i32");
    CHECK(kv && kv->type == NSTF_GGUF_INT32 && kv->val.i64 == -123456, "i32");
    CHECK(nstf_gguf_get_u32(g, "k.i32", &u32) == NSTF_ERR_FORMAT && strstr(nstf_last_error(), "does not fit"),
          "negative i32 as u32: %s", nstf_last_error());
    kv = nstf_gguf_find_kv(g, "k.u64");
    CHECK(kv && kv->type == NSTF_GGUF_UINT64 && kv->val.u64 == 0x123456789abcdefull, "u64");
    CHECK(nstf_gguf_get_u32(g, "k.u64", &u32) == NSTF_ERR_FORMAT, "u64 out of u32 range");
    CHECK(nstf_gguf_get_f32(g, "k.f32", &f32) == NSTF_OK && f32 == 1e-5f, "f32");
    CHECK(nstf_gguf_get_bool(g, "k.bool", &bl) == NSTF_OK && bl, "bool");
    CHECK(nstf_gguf_get_str(g, "k.empty_str", &s) == NSTF_OK && s.len == 0, "empty str");
    CHECK(nstf_gguf_get_u32(g, "k.missing", &u32) == NSTF_ERR_FORMAT &&
              strstr(nstf_last_error(), "'k.missing' not found"),
          "missing key message: %s", nstf_last_error());
    CHECK(nstf_gguf_get_str(g, "k.u32", &s) == NSTF_ERR_FORMAT && strstr(nstf_last_error(), "has type uint32"),
          "wrong type message: %s", nstf_last_error());
    CHECK(nstf_gguf_get_u32_or(g, "k.missing", 77) == 77 && nstf_gguf_get_f32_or(g, "k.missing", 2.5f) == 2.5f &&
              nstf_gguf_get_bool_or(g, "k.missing", true) && nstf_gguf_get_u32_or(g, "k.u32", 1) == 4000000000u,
          "_or getters");
    for (uint32_t t = 0; t <= NSTF_GGUF_FLOAT64; t++) {
        if (!esz[t]) continue;
        char key[32];
        snprintf(key, sizeof key, "arr.%s", nstf_gguf_vtype_name(t));
        CHECK(nstf_gguf_get_arr(g, key, (nstf_gguf_vtype)t, &kv) == NSTF_OK && kv->arr_n == 64u / esz[t] &&
                  memcmp(kv->arr_data, arrbuf[t], 64) == 0,
              "array %s", key);
    }
    CHECK(nstf_gguf_get_arr(g, "arr.empty", NSTF_GGUF_INT32, &kv) == NSTF_OK && kv->arr_n == 0, "empty arr");
    CHECK(nstf_gguf_get_arr(g, "arr.str", NSTF_GGUF_INT32, &kv) == NSTF_ERR_FORMAT, "arr elem type mismatch");
    CHECK(nstf_gguf_get_arr(g, "arr.str", NSTF_GGUF_STRING, &kv) == NSTF_OK && kv->arr_n == 5, "arr.str");
    for (int i = 0; i < 5 && kv && kv->arr_n == 5; i++)
        CHECK(nstf_gguf_str_eq(kv->arr_strs[i], strs[i]), "arr.str[%d]", i);

    CHECK(g->n_tensors == (uint64_t)nt, "n_tensors %llu", (ull)g->n_tensors);
    CHECK(g->data_offset % align == 0, "data offset aligned");
    for (int i = 0; i < nt; i++) {
        const nstf_gguf_tensor *t = nstf_gguf_find_tensor(g, tt[i].name);
        CHECK(t != NULL, "tensor %s", tt[i].name);
        if (!t) continue;
        CHECK(t == &g->tensors[i], "tensor order %s", tt[i].name);
        CHECK(t->type == tt[i].type && t->n_dims == tt[i].n_dims && memcmp(t->ne, tt[i].ne, sizeof t->ne) == 0,
              "tensor %s meta", tt[i].name);
        CHECK(t->n_bytes == tt[i].bytes && t->n_elems == (uint64_t)(tt[i].ne[0] * tt[i].ne[1] * tt[i].ne[2] * tt[i].ne[3]),
              "tensor %s size", tt[i].name);
        CHECK(t->offset % align == 0 && ((const uint8_t *)t->data - g->base) % (int64_t)align == 0,
              "tensor %s aligned", tt[i].name);
        CHECK(memcmp(t->data, tt[i].data, tt[i].bytes) == 0, "tensor %s bytes", tt[i].name);
    }
    CHECK(nstf_gguf_find_tensor(g, "nope") == NULL && nstf_gguf_find_kv(g, "nope") == NULL, "find missing");
    FILE *devnull = fopen("/dev/null", "w");
    CHECK(devnull && nstf_gguf_print(g, devnull, true) == NSTF_OK, "print");
    if (devnull) fclose(devnull);
    nstf_gguf_close(g);
done:
    nstf_free(img);
    unlink(path);
    for (int i = 0; i < nt; i++) free(tt[i].data);
    printf("round trip (alignment %u): %d tensors, %d key/values\n", alignment, nt, n_set + extra);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-hostile") == 0) return hostile_write(&k_corpus, argv[2]);
    test_valid_image();
    hostile_check_memory(&k_corpus);
    hostile_check_disk(&k_corpus);
    test_open_errors();
    test_fuzz_regressions();
    test_round_trip(0);
    test_round_trip(64);
    test_round_trip(1);
    test_round_trip(4096);
    return test_finish("test_gguf");
}
