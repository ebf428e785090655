/* test_quantize_hf.c — `nstf quantize HF_FOLDER OUT TYPE`: an HF model
 * folder quantized in one step (src/opt/quantize.h).
 *
 * Input: tests/data/hf_tiny (scripts/ref/make_hf_tiny.py: a random 2-layer
 * Llama over three safetensors shards, matrices in BF16, F16 and F32).
 * Checks, exact (byte for byte):
 *  - for each target (Q4_K_M, Q5_K_M, Q8_0, Q4_0, F16, BF16), the folder
 *    quantized directly (library and command line, 1 and 3 threads) is the
 *    file that `nstf convert` then `nstf quantize` writes; the result has
 *    the converter's layout (no NEOX key, Q/K rows permuted: the file
 *    loads and generates in adjacent-pair RoPE mode);
 *  - bad folders, each refused with one line on stderr naming the problem
 *    and no OUT (nor temporary file) left behind: no config.json, a tensor
 *    of an unsupported dtype (I32), a truncated shard, a shard missing. */
#define _GNU_SOURCE /* memmem */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_run.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "io/hf_model.h"
#include "opt/quantize.h"
#include "test_util.h"

#define FOLDER NSTF_SOURCE_DIR "/tests/data/hf_tiny"

/* The whole file (NULL when missing); *n its size. */
static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = k >= 0 ? malloc((size_t)k + 1) : NULL;
    if (b && fread(b, 1, (size_t)k, f) != (size_t)k) {
        free(b);
        b = NULL;
    }
    *n = b ? (size_t)k : 0;
    fclose(f);
    return b;
}

static bool same_bytes(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
    const bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

/* ---- direct against convert-then-quantize ------------------------------------------- */

static nstf_status quantize(const char *in, const char *out, const char *type, int n_threads) {
    nstf_quant_params p = {.n_threads = n_threads};
    CHECK(nstf_quant_target_parse(type, &p.target), "target %s", type);
    return nstf_quantize_file(in, out, &p);
}

static void test_same_bytes(void) {
    char conv[300], two[300], one[300], cli[300];
    path_in(conv, sizeof conv, "converted.gguf");
    path_in(two, sizeof two, "two_steps.gguf");
    path_in(one, sizeof one, "one_step.gguf");
    path_in(cli, sizeof cli, "cli.gguf");
    nstf_gguf *g = NULL;
    nstf_status st = nstf_model_file_open(FOLDER, &g);
    nstf_convert_params cp = {.out_type = -1};
    if (st == NSTF_OK) st = nstf_convert_to_gguf(g, conv, &cp);
    CHECK(st == NSTF_OK, "convert: %s", nstf_last_error());
    nstf_gguf_close(g);
    static const char *const targets[] = {"Q4_K_M", "Q5_K_M", "Q8_0", "Q4_0", "F16", "BF16"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        const char *tg = targets[i];
        st = quantize(conv, two, tg, 2);
        CHECK(st == NSTF_OK, "%s: quantize the converted file: %s", tg, nstf_last_error());
        st = quantize(FOLDER, one, tg, i % 2 ? 1 : 3);
        CHECK(st == NSTF_OK, "%s: quantize the folder: %s", tg, nstf_last_error());
        CHECK(same_bytes(one, two), "%s: the folder quantized directly differs from convert, then quantize", tg);
        int rc = run((const char *const[]){"quantize", FOLDER, cli, tg, "-t", "2", NULL});
        CHECK(rc == 0 && strstr(g_err, "->"), "%s: nstf quantize FOLDER: exit %d: %s", tg, rc, g_err);
        CHECK(same_bytes(cli, two), "%s: nstf quantize FOLDER differs from convert, then quantize", tg);
        printf("  %-6s folder -> GGUF equals convert + quantize, byte for byte\n", tg);
    }
    /* what was written is a converter's file: no NEOX key, the target's file type, and it runs */
    nstf_gguf *q = NULL;
    st = nstf_gguf_open(cli, &q);
    CHECK(st == NSTF_OK, "open %s: %s", cli, nstf_last_error());
    if (q) {
        CHECK(!nstf_gguf_find_kv(q, NSTF_GGUF_KEY_ROPE_NEOX), "the quantized file keeps %s", NSTF_GGUF_KEY_ROPE_NEOX);
        CHECK(nstf_gguf_get_u32_or(q, "general.file_type", 0) == 32, "BF16: general.file_type %u",
              nstf_gguf_get_u32_or(q, "general.file_type", 0));
    }
    nstf_gguf_close(q);
    int rc = run((const char *const[]){"quantize", FOLDER, cli, "Q4_K_M", NULL});
    CHECK(rc == 0, "Q4_K_M: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "-m", cli, "-p", "The history of", "-n", "4", "--temp", "0", "-t", "1", NULL});
    CHECK(rc == 0, "nstf run on the quantized folder: exit %d: %s", rc, g_err);
}

/* ---- bad folders -------------------------------------------------------------------- */

/* A copy of the folder in g_dir/NAME without file `drop` (NULL: none) and
 * with the first `from` in file `file` replaced by `to` (the same length:
 * the offsets of a binary file stay). Returns the folder. */
static const char *bad_copy(const char *name, const char *drop, const char *file, const char *from, const char *to) {
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
    mkdir(dir, 0755);
    DIR *d = opendir(FOLDER);
    CHECK(d != NULL, "opendir %s", FOLDER);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || (drop && !strcmp(drop, e->d_name))) continue;
        char src[1024], dst[1024];
        snprintf(src, sizeof src, "%s/%s", FOLDER, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", dir, e->d_name);
        size_t n;
        unsigned char *p = read_all(src, &n);
        if (!p) continue;
        if (file && !strcmp(file, e->d_name)) {
            const size_t k = strlen(from);
            CHECK(strlen(to) == k, "%s: edits keep the length", name);
            unsigned char *at = memmem(p, n, from, k);
            CHECK(at != NULL, "%s: '%s' not found in %s", name, from, file);
            if (at) memcpy(at, to, k);
        }
        FILE *f = fopen(dst, "wb");
        CHECK(f && fwrite(p, 1, n, f) == n, "write %s", dst);
        if (f) fclose(f);
        free(p);
    }
    if (d) closedir(d);
    return dir;
}

/* nstf quantize DIR refused: one line naming the problem, no output left. */
static void expect_refused(const char *what, const char *dir, const char *want) {
    char out[300];
    path_in(out, sizeof out, "refused.gguf");
    expect_error(what, want, (const char *const[]){"quantize", dir, out, "Q4_K_M", NULL});
    if (getenv("TEST_VERBOSE")) printf("  %s: %s", what, g_err);
    CHECK(!exists(out), "%s: %s was written", what, out);
}

static void test_bad_folders(void) {
    expect_refused("no config.json", bad_copy("noconfig", "config.json", NULL, NULL, NULL),
                   "a directory without config.json");
    expect_refused("an I32 tensor",
                   bad_copy("dtype", NULL, "model-00003-of-00003.safetensors", "\"lm_head.weight\":{\"dtype\":\"F32\"",
                            "\"lm_head.weight\":{\"dtype\":\"I32\""),
                   "'lm_head.weight' has dtype I32, which is not supported (supported: F32, F16, BF16)");
    const char *dir = bad_copy("truncated", NULL, NULL, NULL, NULL);
    char shard[600];
    snprintf(shard, sizeof shard, "%s/model-00003-of-00003.safetensors", dir);
    CHECK(truncate(shard, 100000) == 0, "truncate %s", shard);
    expect_refused("a truncated shard", dir, "extends past end of file");
    expect_refused("a missing shard", bad_copy("noshard", "model-00002-of-00003.safetensors", NULL, NULL, NULL),
                   "model-00002-of-00003.safetensors");
    /* nothing but the finished files is left behind */
    DIR *d = opendir(g_dir);
    for (struct dirent *e; d && (e = readdir(d));) CHECK(!strstr(e->d_name, ".tmp"), "left behind: %s", e->d_name);
    if (d) closedir(d);
}

int main(void) {
    if (!exists(FOLDER "/config.json")) {
        printf("test_quantize_hf: %s missing; skipped\n", FOLDER);
        return TEST_SKIP;
    }
    snprintf(g_dir, sizeof g_dir, "%s/test_quantize_hf.XXXXXX", NSTF_BUILD_DIR);
    CHECK(mkdtemp(g_dir) != NULL, "mkdtemp");
    if (g_fails) return test_finish("test_quantize_hf");
    test_same_bytes();
    test_bad_folders();
    if (!g_fails) { /* keep the evidence of a failure */
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "test_quantize_hf: could not remove %s\n", g_dir);
    }
    return test_finish("test_quantize_hf");
}
