/* test_bench_cli.c — `nstf bench` and `nstf profile` as a user runs them,
 * on a tiny random model from `nstf gen-model --shape tiny`: the JSON
 * output parses (cJSON) and carries llama-bench's fields with their types;
 * JSONL, CSV and markdown come out; a saved run used as --baseline passes
 * and an impossible baseline fails with exit 3 naming the test; levels
 * on the CPU report one level; --decode-batch prints a row per batch;
 * profile writes a valid trace and an SVG.
 * Timing values are not checked beyond being positive (performance lives
 * in benchmarks, never in tests). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "cli_run.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = calloc(1, (size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) b[0] = 0;
    fclose(f);
    return b;
}

static const char *const k_fields[] = {
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_batch", "n_threads", "type_k", "type_v", "n_prompt", "n_gen",
    "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts"};

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/nstf_test_bench_XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char tiny[300], base[300], slow[300], trace[300], svg[300], cache[300];
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", g_dir);
    snprintf(base, sizeof base, "%s/base.json", g_dir);
    snprintf(slow, sizeof slow, "%s/impossible.jsonl", g_dir);
    snprintf(trace, sizeof trace, "%s/trace.json", g_dir);
    snprintf(svg, sizeof svg, "%s/roofline.svg", g_dir);
    snprintf(cache, sizeof cache, "%s/cache/roofline.json", g_dir);

    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "q8_0", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model: exit %d: %s", rc, g_err);

    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "16", "-n", "8", "-r", "2", "-t", "1", "-o", "json", NULL});
    CHECK(rc == 0, "bench json: exit %d: %s", rc, g_err);
    cJSON *root = cJSON_Parse(g_out);
    CHECK(cJSON_IsArray(root) && cJSON_GetArraySize(root) == 2, "bench JSON is an array of 2 tests: %s", g_out);
    int i = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, root) {
        for (size_t k = 0; k < sizeof k_fields / sizeof *k_fields; k++)
            CHECK(cJSON_GetObjectItemCaseSensitive(o, k_fields[k]) != NULL, "test %d lacks '%s'", i, k_fields[k]);
        const cJSON *np = cJSON_GetObjectItemCaseSensitive(o, "n_prompt"), *ng = cJSON_GetObjectItemCaseSensitive(o, "n_gen"),
                    *ts = cJSON_GetObjectItemCaseSensitive(o, "avg_ts"), *sn = cJSON_GetObjectItemCaseSensitive(o, "samples_ns"),
                    *be = cJSON_GetObjectItemCaseSensitive(o, "backends"), *mf = cJSON_GetObjectItemCaseSensitive(o, "model_filename");
        CHECK(cJSON_IsNumber(np) && cJSON_IsNumber(ng) && np->valueint == (i == 0 ? 16 : 0) && ng->valueint == (i == 0 ? 0 : 8),
              "test %d is %s", i, i == 0 ? "pp16" : "tg8");
        CHECK(cJSON_IsNumber(ts) && ts->valuedouble > 0, "test %d avg_ts positive", i);
        CHECK(cJSON_IsArray(sn) && cJSON_GetArraySize(sn) == 2, "test %d has 2 samples", i);
        CHECK(cJSON_IsString(be) && !strcmp(be->valuestring, "CPU"), "backends CPU");
        CHECK(cJSON_IsString(mf) && !strcmp(mf->valuestring, tiny), "model_filename as given");
        i++;
    }
    cJSON_Delete(root);
    CHECK(strstr(g_err, "memory: device=cpu total=") && strstr(g_err, " kv_cache=") && strstr(g_err, " compute="),
          "memory line at exit: %s", g_err);
    write_file(base, g_out);

    /* the run just saved passes against itself with a wide tolerance */
    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "16", "-n", "8", "-r", "2", "-t", "1", "-o", "jsonl",
                                   "--baseline", base, "--tolerance", "1000%", NULL});
    CHECK(rc == 0, "bench vs its own baseline: exit %d: %s", rc, g_err);
    int lines = 0;
    for (char *line = strtok(g_out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *obj = cJSON_Parse(line);
        CHECK(cJSON_IsObject(obj), "JSONL line parses: %s", line);
        cJSON_Delete(obj);
        lines++;
    }
    CHECK(lines == 2, "JSONL: %d lines", lines);
    CHECK(strstr(g_err, "baseline: ok: pp16") != NULL, "comparison lines: %s", g_err);

    /* a baseline no CPU can meet: exit 3, the regression named */
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_filename\": \"tiny.gguf\", \"backends\": \"CPU\", \"n_threads\": 1, \"n_prompt\": 0, "
             "\"n_gen\": 8, \"n_depth\": 0, \"avg_ts\": 1e15}\n");
    write_file(slow, text);
    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "0", "-n", "8", "-r", "2", "-t", "1", "--baseline", slow, NULL});
    CHECK(rc == 3, "regression exits 3 (got %d): %s", rc, g_err);
    CHECK(strstr(g_err, "REGRESSION: tg8 on tiny.gguf") && strstr(g_err, "tolerance 5%"), "regression line: %s", g_err);

    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "8", "-n", "4", "-d", "8", "-r", "1", "-t", "1", "-o", "csv", NULL});
    CHECK(rc == 0 && !strncmp(g_out, "build_commit,build_number,cpu_info,gpu_info,backends,model_filename", 67),
          "csv header: exit %d: %.200s", rc, g_out);
    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--levels", NULL});
    CHECK(rc == 0 && strstr(g_out, "| model") && strstr(g_out, "pp8") && strstr(g_err, "only one execution level"),
          "md + --levels: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "8", "-n", "0", "-r", "1", "--level", "2", NULL});
    CHECK(rc == 1 && strstr(g_err, "only one level"), "--level 2 on the CPU: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "-o", "xml", NULL});
    CHECK(rc == 2, "bad -o: exit %d", rc);
    rc = run((const char *const[]){"bench", "-m", tiny, "--act-bits", "12", NULL});
    CHECK(rc == 2 && strstr(g_err, "nstf bench: --act-bits '12': use 8, 16 or 32"), "bad --act-bits: exit %d: %s", rc,
          g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--act-bits", "8",
                                   "-o", "csv", NULL});
    CHECK(rc == 0 && strstr(g_out, "build_commit"), "--act-bits 8: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "-p", "0", "-n", "4", "-d", "96", "-r", "1", "-t", "1",
                                   "--sparse-attn", "2,16", "--sparse-block", "8", NULL});
    CHECK(rc == 0 && strstr(g_out, "tg4 @ d96") && strstr(g_err, "top-k 2 blocks of 8, window 16"),
          "--sparse-attn 2,16: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "--decode-batch", "1,3", "-d", "20", "-r", "2", "-t", "1",
                                   NULL});
    CHECK(rc == 0 && strstr(g_out, "depth 20, 2 steps each") && strstr(g_out, "\n| 1 | ") &&
              strstr(g_out, "| 1.00x |") && strstr(g_out, "\n| 3 | "),
          "--decode-batch 1,3: exit %d: %s%s", rc, g_out, g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "--decode-batch", "0", NULL});
    CHECK(rc == 2, "--decode-batch 0: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"bench", "-m", tiny, "--sparse-attn", "2,", NULL});
    CHECK(rc == 2, "--sparse-attn '2,': exit %d: %s", rc, g_err);

    rc = run((const char *const[]){"profile", "-m", tiny, "-p", "8", "-n", "2", "-t", "1", "--trace", trace, "--svg", svg,
                                   "--roofline-cache", cache, NULL});
    CHECK(rc == 0 && strstr(g_out, "down_proj") && strstr(g_out, "roof%"), "profile: exit %d: %s %s", rc, g_out, g_err);
    char *tr = read_all(trace);
    cJSON *t = tr ? cJSON_Parse(tr) : NULL;
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(t, "traceEvents");
    int depth = 0, n_b = 0, bad = 0;
    cJSON_ArrayForEach(o, ev) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(o, "ph");
        if (!cJSON_IsString(ph)) { bad++; continue; }
        if (!strcmp(ph->valuestring, "B")) { depth++; n_b++; }
        if (!strcmp(ph->valuestring, "E") && --depth < 0) bad++;
    }
    CHECK(cJSON_IsArray(ev) && n_b > 0 && depth == 0 && bad == 0, "trace parses and balances: %d spans", n_b);
    cJSON_Delete(t);
    free(tr);
    char *sv = read_all(svg);
    CHECK(sv && strstr(sv, "<svg") && strstr(sv, "</svg>"), "roofline SVG written");
    free(sv);
    struct stat st;
    CHECK(stat(cache, &st) == 0, "roofline cache written");

    remove(tiny); remove(base); remove(slow); remove(trace); remove(svg); remove(cache);
    char p[300];
    snprintf(p, sizeof p, "%s/cache", g_dir); rmdir(p);
    snprintf(p, sizeof p, "%s/stdout", g_dir); remove(p);
    snprintf(p, sizeof p, "%s/stderr", g_dir); remove(p);
    rmdir(g_dir);
    return test_finish("test_bench_cli");
}
