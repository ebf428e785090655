/* test_safetensors.c — the safetensors reader.
 *
 *  1. a valid file built here byte by byte (F32, F16 and BF16 tensors, a
 *     scalar, an empty tensor, __metadata__, a gap between ranges): every
 *     field read back, every pointer where it must be; every proper prefix
 *     of it refused cleanly (each copied into an exactly-sized heap block,
 *     so ASan sees any read past it);
 *  2. hostile files, each refused with its status and a distinctive part of
 *     its message; the same bytes are checked in under
 *     tests/data/hostile/safetensors/ and opened from disk (the checked-in
 *     files must equal what this file generates: regenerate with
 *     `test_safetensors --write-hostile tests/data/hostile/safetensors`);
 *  3. sharded sets in a temporary folder: a valid one, and indexes that
 *     disagree with their shards or point outside their folder.
 * `test_safetensors --write-seeds fuzz/corpus/fuzz_safetensors` writes the
 * fuzzer's seeds (valid files).
 * Metric: exact equality (a file format). */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hostile_corpus.h"
#include "io/safetensors.h"
#include "test_util.h"

typedef unsigned long long ull;

/* ---- files ------------------------------------------------------------------------ */

/* A file: the header (padded with blanks to a multiple of 8, as the
 * reference writer pads it), then `n_data` bytes of a pattern. */
static void st_file(bb *b, const char *json, size_t n_data) {
    size_t n = strlen(json), pad = (8 - n % 8) % 8;
    bb_u64(b, n + pad);
    bb_put(b, json, n);
    bb_put(b, "        ", pad);
    for (size_t i = 0; i < n_data; i++) {
        uint8_t x = (uint8_t)(i * 7 + 1);
        bb_put(b, &x, 1);
    }
}

/* ---- the valid file --------------------------------------------------------------- */

/* w: F32 [2, 3] at 0 (24 bytes); h: F16 [4] at 24; g: BF16 [1, 2] at 40
 * (after an 8-byte gap); s: F32 scalar at 44; e: F16 [0, 5] (no bytes) at 48.
 * The data section is 48 bytes and s ends it. */
static const char k_valid_json[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"g\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[40,44]},"
    "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[44,48]},"
    "\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[48,48]}}";

static void mk_valid(bb *b) { st_file(b, k_valid_json, 48); }

static void test_valid(void) {
    bb b = {0};
    mk_valid(&b);
    nstf_safetensors *st = NULL;
    nstf_status s = nstf_safetensors_open_memory(b.p, b.n, "valid.safetensors", &st);
    CHECK(s == NSTF_OK, "valid file: %s", nstf_last_error());
    if (s == NSTF_OK) {
        CHECK(st->n_tensors == 5 && st->n_shards == 1, "counts %llu", (ull)st->n_tensors);
        const char *sorted[] = {"e", "g", "h", "s", "w"};
        for (int i = 0; i < 5 && i < (int)st->n_tensors; i++)
            CHECK(!strcmp(st->tensors[i].name, sorted[i]), "order: %s at %d", st->tensors[i].name, i);
        const uint8_t *data = b.p + 8 + (b.n - 8 - 48);
        const nstf_st_tensor *w = nstf_safetensors_find(st, "w"), *h = nstf_safetensors_find(st, "h"),
                             *g = nstf_safetensors_find(st, "g"), *sc = nstf_safetensors_find(st, "s"),
                             *e = nstf_safetensors_find(st, "e");
        CHECK(w && w->type == NSTF_TYPE_F32 && w->n_dims == 2 && w->shape[0] == 2 && w->shape[1] == 3 &&
                  w->shape[2] == 1 && w->n_elems == 6 && w->n_bytes == 24 && w->data == data,
              "w");
        CHECK(h && h->type == NSTF_TYPE_F16 && h->n_dims == 1 && h->n_bytes == 8 && h->data == data + 24, "h");
        CHECK(g && g->type == NSTF_TYPE_BF16 && g->n_elems == 2 && g->data == data + 40, "g");
        CHECK(sc && sc->n_dims == 0 && sc->n_elems == 1 && sc->n_bytes == 4 && sc->data == data + 44, "scalar");
        CHECK(e && e->n_elems == 0 && e->n_bytes == 0, "empty tensor");
        CHECK(!nstf_safetensors_find(st, "x") && !nstf_safetensors_find(st, "__metadata__"), "find of absent names");
        const char *note = nstf_safetensors_meta(st, "note");
        CHECK(note && !strcmp(note, "caf\xc3\xa9") && !strcmp(nstf_safetensors_meta(st, "format"), "pt"), "metadata");
        nstf_safetensors_close(st);
    }
    /* a header without tensors is a valid (empty) file */
    bb e = {0};
    st_file(&e, "{}", 0);
    s = nstf_safetensors_open_memory(e.p, e.n, "empty.safetensors", &st);
    CHECK(s == NSTF_OK && st->n_tensors == 0 && !nstf_safetensors_find(st, "a"), "no tensors: %s", nstf_last_error());
    if (s == NSTF_OK) nstf_safetensors_close(st);
    free(e.p);
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, b.p, n);
        st = NULL;
        s = nstf_safetensors_open_memory(p, n, "prefix.safetensors", &st);
        if (s != NSTF_ERR_FORMAT || st || !strstr(nstf_last_error(), "prefix.safetensors")) {
            if (bad++ < 5) fprintf(stderr, "prefix %zu/%zu: status %d: %s\n", n, b.n, (int)s, nstf_last_error());
            nstf_safetensors_close(st);
        }
        free(p);
    }
    CHECK(bad == 0, "%d of %zu truncated prefixes were not rejected cleanly", bad, b.n);
    printf("valid file read back; %zu truncated prefixes rejected\n", b.n);
    free(b.p);
}

/* ---- hostile files -------------------------------------------------------------------- */

#define T1(dtype, shape, offs) "{\"a\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static void h_empty(bb *b) { (void)b; }
static void h_short(bb *b) { bb_put(b, "\x10\0\0\0\0", 5); }
static void h_huge_len(bb *b) { bb_u64(b, 1ull << 63); bb_put(b, "{}      ", 8); }
static void h_len_past_eof(bb *b) { bb_u64(b, 1000); bb_put(b, "{}      ", 8); }
static void h_not_object(bb *b) { st_file(b, "[1, 2]", 0); }
static void h_bad_json(bb *b) { st_file(b, "{\"a\":{\"dtype\":\"F32\",}}", 0); }
static void h_trailing(bb *b) { st_file(b, "{} x", 0); }
static void h_json_array(bb *b) { st_file(b, "{\"a\":5}", 0); }
static void h_non_utf8(bb *b) { st_file(b, "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4); }
static void h_nul_escape(bb *b) { st_file(b, "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4); }
static void h_nul_byte(bb *b) {
    static const char j[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    bb_u64(b, 56);
    bb_put(b, j, 18);
    bb_put(b, "\0", 1);
    bb_put(b, j + 18, sizeof j - 1 - 18);
    bb_put(b, "  ", 56 - (sizeof j - 1) - 1);
    bb_put(b, "abcd", 4);
}
static void h_duplicate(bb *b) {
    st_file(b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
}
static void h_empty_name(bb *b) { st_file(b, "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4); }
static void h_unknown_dtype(bb *b) { st_file(b, T1("Q4", "[1]", "[0,4]"), 4); }
static void h_unsupported_dtype(bb *b) { st_file(b, T1("I64", "[1]", "[0,8]"), 8); }
static void h_size_mismatch(bb *b) { st_file(b, T1("F32", "[2,3]", "[0,12]"), 12); }
static void h_count_overflow(bb *b) { st_file(b, T1("F32", "[4503599627370496,4503599627370496]", "[0,4]"), 4); }
static void h_bytes_overflow(bb *b) { st_file(b, T1("F32", "[4503599627370496,2048]", "[0,4]"), 4); }
static void h_shape_negative(bb *b) { st_file(b, T1("F32", "[-1]", "[0,4]"), 4); }
static void h_shape_fraction(bb *b) { st_file(b, T1("F32", "[1.5]", "[0,4]"), 4); }
static void h_shape_huge(bb *b) { st_file(b, T1("F32", "[1e300]", "[0,4]"), 4); }
static void h_shape_string(bb *b) { st_file(b, T1("F32", "[\"1\"]", "[0,4]"), 4); }
static void h_nine_dims(bb *b) { st_file(b, T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4); }
static void h_offsets_reversed(bb *b) { st_file(b, T1("F32", "[1]", "[8,4]"), 8); }
static void h_offsets_three(bb *b) { st_file(b, T1("F32", "[1]", "[0,4,8]"), 8); }
static void h_offsets_huge(bb *b) { st_file(b, T1("F32", "[1]", "[18446744073709551612,18446744073709551616]"), 4); }
static void h_offset_past_eof(bb *b) { st_file(b, T1("F32", "[2]", "[1000,1008]"), 16); }
static void h_data_truncated(bb *b) { st_file(b, T1("F32", "[4]", "[0,16]"), 15); }
static void h_misaligned(bb *b) { st_file(b, T1("F32", "[1]", "[2,6]"), 8); }
static void h_missing_field(bb *b) { st_file(b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4); }
static void h_overlap(bb *b) {
    st_file(b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
}
static void h_meta_not_string(bb *b) { st_file(b, "{\"__metadata__\":{\"x\":1}}", 0); }
static void h_meta_twice(bb *b) { st_file(b, "{\"__metadata__\":{},\"__metadata__\":{}}", 0); }
static void h_deep(bb *b) {
    char j[4200];
    int n = snprintf(j, sizeof j, "{\"a\":");
    for (int i = 0; i < 2000; i++) j[n++] = '[';
    for (int i = 0; i < 2000; i++) j[n++] = ']';
    j[n++] = '}';
    j[n] = 0;
    st_file(b, j, 0);
}

#define F NSTF_ERR_FORMAT
#define U NSTF_ERR_UNSUPPORTED
static const hostile_case k_cases[] = {
    {"empty_file", h_empty, F, "empty file (0 bytes); not a safetensors file"},
    {"short_file", h_short, F, "file of 5 bytes is too short for the 8-byte header length"},
    {"huge_header_length", h_huge_len, F, "header length 9223372036854775808 exceeds the limit of 100000000 bytes"},
    {"header_length_past_eof", h_len_past_eof, F, "header length 1000 extends past end of file (size 16)"},
    {"header_not_object", h_not_object, F, "header does not start with '{'"},
    {"bad_json", h_bad_json, F, "header: not valid JSON (error at line 1, column 22)"},
    {"trailing_data", h_trailing, F, "header: unexpected data after the JSON value at line 1, column 4"},
    {"entry_not_object", h_json_array, F, "tensor 'a': entry is not an object"},
    {"non_utf8_name", h_non_utf8, F, "header: invalid UTF-8 at offset 3 (line 1, column 4)"},
    {"escaped_nul_name", h_nul_escape, F, "header: string with an escaped NUL (\\u0000) at line 1, column 4"},
    {"nul_byte", h_nul_byte, F, "header: NUL byte at offset 18"},
    {"duplicate_name", h_duplicate, F, "duplicate tensor name 'a'"},
    {"empty_name", h_empty_name, F, "a tensor has an empty name"},
    {"unknown_dtype", h_unknown_dtype, F, "tensor 'a' has unknown dtype \"Q4\""},
    {"unsupported_dtype", h_unsupported_dtype, U, "tensor 'a' has dtype I64, which is not supported (supported: F32, F16, BF16)"},
    {"dtype_size_mismatch", h_size_mismatch, F, "tensor 'a': data_offsets [0, 12] hold 12 bytes, but F32 of 6 elements needs 24"},
    {"element_count_overflow", h_count_overflow, F, "tensor 'a': element count overflows at shape[1]"},
    {"byte_size_overflow", h_bytes_overflow, F, "tensor 'a': byte size overflows"},
    {"shape_negative", h_shape_negative, F, "tensor 'a': shape[0] is not an integer in [0, 2^53)"},
    {"shape_fraction", h_shape_fraction, F, "tensor 'a': shape[0] is not an integer in [0, 2^53)"},
    {"shape_huge", h_shape_huge, F, "tensor 'a': shape[0] is not an integer in [0, 2^53)"},
    {"shape_string", h_shape_string, F, "tensor 'a': shape[0] is not an integer in [0, 2^53)"},
    {"nine_dims", h_nine_dims, F, "tensor 'a' has 9 dims (at most 8)"},
    {"offsets_reversed", h_offsets_reversed, F, "tensor 'a': data_offsets [8, 4] end before they begin"},
    {"offsets_three", h_offsets_three, F, "tensor 'a': data_offsets is not two integers in [0, 2^53)"},
    {"offsets_huge", h_offsets_huge, F, "tensor 'a': data_offsets is not two integers in [0, 2^53)"},
    {"offset_past_eof", h_offset_past_eof, F, "tensor 'a' data [1000, 1008) extends past end of file (data section of 16 bytes"},
    {"data_truncated", h_data_truncated, F, "tensor 'a' data [0, 16) extends past end of file (data section of 15 bytes"},
    {"misaligned_data", h_misaligned, F, "tensor 'a' data at file offset 66 is not aligned to its 4-byte elements"},
    {"missing_field", h_missing_field, F, "tensor 'a': needs \"dtype\" (a string), \"shape\" and \"data_offsets\" (arrays)"},
    {"overlapping_ranges", h_overlap, F, "tensor 'b' data [4, 12) overlaps tensor 'a' [0, 8)"},
    {"metadata_not_string", h_meta_not_string, F, "__metadata__ value 'x' is not a string"},
    {"metadata_twice", h_meta_twice, F, "duplicate key '__metadata__'"},
    {"deep_nesting", h_deep, F, "header: not valid JSON"},
};
#undef F
#undef U
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

static nstf_status open_memory(const void *d, uint64_t n, const char *name, void **out) {
    return nstf_safetensors_open_memory(d, n, name, (nstf_safetensors **)out);
}
static nstf_status open_path(const char *path, void **out) {
    return nstf_safetensors_open(path, (nstf_safetensors **)out);
}
static void close_set(void *t) { nstf_safetensors_close(t); }

static const hostile_corpus k_corpus = {
    .cases = k_cases,
    .n = N_CASES,
    .ext = ".safetensors",
    .dir = NSTF_SOURCE_DIR "/tests/data/hostile/safetensors",
    .title = "Hostile safetensors corpus",
    .intro = "Malformed safetensors files, each opened by `tests/test_safetensors.c`, which\n"
             "checks the status and a distinctive part of the error message. The files are\n"
             "generated by the test itself; the test fails if a checked-in file differs\n"
             "from what it generates. Regenerate after changing a case with",
    .regen = "build/tests/test_safetensors --write-hostile tests/data/hostile/safetensors",
    .test = "test_safetensors.c",
    .verbose_env = "TEST_VERBOSE",
    .open_memory = open_memory,
    .open_path = open_path,
    .close = close_set,
};

/* ---- sharded sets ------------------------------------------------------------------------- */

static char g_tmp[256];

static void put(const char *dir, const char *name, const char *text_or_null, const bb *bytes) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int rc = text_or_null ? hostile_write_file(p, text_or_null, strlen(text_or_null))
                          : hostile_write_file(p, bytes->p, bytes->n);
    CHECK(rc == 0, "write %s", p);
}

/* A folder holding s1 (tensors a, b) and s2 (tensor c) and `index`. */
static const char *shard_set(const char *name, const char *index) {
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    mkdir(dir, 0755);
    bb s1 = {0}, s2 = {0};
    st_file(&s1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}", 16);
    st_file(&s2, "{\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6);
    put(dir, "s1.safetensors", NULL, &s1);
    put(dir, "s2.safetensors", NULL, &s2);
    put(dir, "model.safetensors.index.json", index, NULL);
    free(s1.p);
    free(s2.p);
    return dir;
}

static void expect_index_refused(const char *name, const char *index, const char *msg) {
    const char *dir = shard_set(name, index);
    nstf_safetensors *t = NULL;
    nstf_status st = nstf_safetensors_open_dir(dir, &t);
    const char *e = nstf_last_error();
    if (getenv("TEST_VERBOSE")) printf("  %-18s %s\n", name, e);
    CHECK(st != NSTF_OK && !t && strstr(e, msg), "%s: status %d: \"%s\" lacks \"%s\"", name, (int)st, e, msg);
    nstf_safetensors_close(t);
}

static void test_sharded(void) {
    const char *dir = shard_set("valid", "{\"metadata\":{\"total_size\":30},\"weight_map\":{"
                                         "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    nstf_safetensors *t = NULL;
    nstf_status st = nstf_safetensors_open_dir(dir, &t);
    CHECK(st == NSTF_OK, "valid set: %s", nstf_last_error());
    if (st == NSTF_OK) {
        const nstf_st_tensor *c = nstf_safetensors_find(t, "c"), *b = nstf_safetensors_find(t, "b");
        CHECK(t->n_shards == 2 && t->n_tensors == 3, "shards %u tensors %llu", t->n_shards, (ull)t->n_tensors);
        CHECK(c && c->type == NSTF_TYPE_F16 && strstr(t->shards[c->shard].path, "s2.safetensors") &&
                  c->data == t->shards[c->shard].base + t->shards[c->shard].data_start,
              "c in s2");
        CHECK(b && b->type == NSTF_TYPE_BF16 && strstr(t->shards[b->shard].path, "s1.safetensors") &&
                  b->data == t->shards[b->shard].base + t->shards[b->shard].data_start + 8,
              "b in s1");
        nstf_safetensors_close(t);
    }
    expect_index_refused("not_json", "{\"weight_map\":", "not valid JSON");
    expect_index_refused("no_map", "{\"metadata\":{}}", "no \"weight_map\" object with entries");
    expect_index_refused("traversal", "{\"weight_map\":{\"a\":\"../valid/s1.safetensors\"}}",
                         "weight_map entry 'a' is not the file name of a shard beside the index");
    expect_index_refused("missing_shard",
                         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s3.safetensors\"}}",
                         "names shard s3.safetensors");
    expect_index_refused("absent_tensor",
                         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\","
                         "\"d\":\"s2.safetensors\"}}",
                         "weight_map names tensor 'd' in s2.safetensors, which does not hold it");
    expect_index_refused("wrong_shard",
                         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\"}}",
                         "weight_map puts tensor 'b' in s2.safetensors, but it is in s1.safetensors");
    expect_index_refused("unlisted", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}",
                         "tensor 'b' of s1.safetensors is not in the weight_map");
    expect_index_refused("repeated",
                         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\","
                         "\"a\":\"s1.safetensors\"}}",
                         "weight_map has 4 entries for 3 tensors (a name repeats)");
    /* the same tensor in two shards */
    const char *d2 = shard_set("twice", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                                        "\"c\":\"s2.safetensors\"}}");
    bb s2 = {0};
    st_file(&s2, "{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                 "\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[6,12]}}", 12);
    put(d2, "s2.safetensors", NULL, &s2);
    free(s2.p);
    t = NULL;
    st = nstf_safetensors_open_dir(d2, &t);
    CHECK(st == NSTF_ERR_FORMAT && !t && strstr(nstf_last_error(), "tensor 'a' is in two shards"),
          "twice: %s", nstf_last_error());
    nstf_safetensors_close(t);
    /* a hostile shard is named in the message */
    const char *d3 = shard_set("bad_shard", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                                            "\"c\":\"s2.safetensors\"}}");
    bb bad = {0};
    h_overlap(&bad);
    put(d3, "s2.safetensors", NULL, &bad);
    free(bad.p);
    st = nstf_safetensors_open_dir(d3, &t);
    CHECK(st == NSTF_ERR_FORMAT && strstr(nstf_last_error(), "s2.safetensors: tensor 'b' data [4, 12) overlaps"),
          "bad shard: %s", nstf_last_error());
    st = nstf_safetensors_open_dir(g_tmp, &t);
    CHECK(st == NSTF_ERR_IO && strstr(nstf_last_error(), "no model.safetensors or model.safetensors.index.json"),
          "empty folder: %s", nstf_last_error());
    printf("sharded: valid set read, 11 broken sets refused\n");
}

/* Valid files as the seed corpus of fuzz/fuzz_safetensors. */
static int write_seeds(const char *dir) {
    static const char *const seeds[][2] = {
        {"valid_mixed", k_valid_json},
        {"empty_header", "{}"},
        {"metadata_only", "{\"__metadata__\":{\"format\":\"pt\"}}"},
        {"one_f32", T1("F32", "[2,2]", "[0,16]")},
        {"hf_like", "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
                    "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
                    "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[24,32]},"
                    "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[32,48]}}"},
    };
    static const size_t data[] = {48, 0, 0, 16, 48};
    char path[4096];
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        bb b = {0};
        st_file(&b, seeds[i][1], data[i]);
        nstf_safetensors *t = NULL;
        if (nstf_safetensors_open_memory(b.p, b.n, seeds[i][0], &t) != NSTF_OK) {
            fprintf(stderr, "seed %s does not open: %s\n", seeds[i][0], nstf_last_error());
            return 1;
        }
        nstf_safetensors_close(t);
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, seeds[i][0]);
        if (hostile_write_file(path, b.p, b.n) != 0) { fprintf(stderr, "%s: %s\n", path, strerror(errno)); return 1; }
        free(b.p);
    }
    printf("wrote %zu seeds to %s\n", sizeof seeds / sizeof seeds[0], dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-hostile") == 0) return hostile_write(&k_corpus, argv[2]);
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    snprintf(g_tmp, sizeof g_tmp, "%s/test_safetensors.XXXXXX", NSTF_BUILD_DIR);
    CHECK(mkdtemp(g_tmp) != NULL, "mkdtemp %s", g_tmp);
    test_valid();
    hostile_check_memory(&k_corpus);
    hostile_check_disk(&k_corpus);
    test_sharded();
    if (!g_fails) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0) fprintf(stderr, "test_safetensors: could not remove %s\n", g_tmp);
    }
    return test_finish("test_safetensors");
}
