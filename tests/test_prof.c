/* test_prof.c — the measurement library: statistics on known numbers,
 * the llama-bench JSON / JSONL / CSV writers (field names and types, parsed
 * back with cJSON, strings that need escaping), the baseline regression
 * check (regression, improvement, within tolerance, missing test, bad
 * files), the Chrome trace (valid JSON, balanced and nested B/E events),
 * the op cost model, the profiler hook, and the roofline arithmetic.
 * Metrics: exact equality for counts and strings; |error| <= 1e-9
 * relative for statistics (double arithmetic on a handful of values). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "prof/profiler.h"
#include "prof/regress.h"
#include "prof/report.h"
#include "prof/roofline.h"
#include "prof/stats.h"
#include "prof/trace.h"
#include "test_util.h"

static bool close_rel(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

static void test_stats(void) {
    const double x[] = {2, 4, 4, 4, 5, 5, 7, 9};
    nstf_stats s = nstf_stats_compute(x, 8);
    CHECK(s.n == 8 && close_rel(s.mean, 5.0), "mean %g", s.mean);
    CHECK(close_rel(s.stddev, sqrt(32.0 / 7.0)), "sample stddev %g (want %g)", s.stddev, sqrt(32.0 / 7.0));
    CHECK(close_rel(s.median, 4.5) && s.min == 2 && s.max == 9, "median %g min %g max %g", s.median, s.min, s.max);
    const double y[] = {3, 1, 2};
    s = nstf_stats_compute(y, 3);
    CHECK(s.median == 2 && y[0] == 3, "odd median %g, input untouched", s.median);
    s = nstf_stats_compute(y, 1);
    CHECK(s.stddev == 0 && s.mean == 3 && s.median == 3, "one sample: stddev %g", s.stddev);
    s = nstf_stats_compute(NULL, 0);
    CHECK(s.n == 0 && s.mean == 0, "no samples");
    /* beyond the stack buffer: the rank-selection path */
    double big[301];
    for (int i = 0; i < 301; i++) big[i] = (double)((i * 37) % 301);
    s = nstf_stats_compute(big, 301);
    CHECK(s.median == 150 && s.min == 0 && s.max == 300, "large median %g", s.median);
    /* large mean, small spread: no cancellation */
    const double z[] = {1e12 + 1, 1e12 + 2, 1e12 + 3};
    s = nstf_stats_compute(z, 3);
    CHECK(fabs(s.stddev - 1.0) < 1e-6, "stddev at 1e12 offset %g", s.stddev);
}

static const uint64_t k_samples[2] = {1000000000ull, 2000000000ull}; /* 1 s and 2 s */

static nstf_bench_result sample_result(const char *model, int n_prompt, int n_gen) {
    nstf_bench_result r = {.build_commit = "abc123", .build_number = 42, .cpu_info = "CPU \"quoted\" \\ x",
                           .gpu_info = "", .backends = "CPU", .model_filename = model, .model_type = "llama 135M Q4_1",
                           .model_size = 96000000, .model_n_params = 134515008, .n_batch = 512, .n_ubatch = 512,
                           .n_threads = 4, .type_k = "f32", .type_v = "f32", .devices = "auto", .use_mmap = true,
                           .n_prompt = n_prompt, .n_gen = n_gen, .n_depth = 0, .samples_ns = k_samples,
                           .n_samples = 2};
    nstf_bench_result_stamp(&r);
    return r;
}

static const char *const k_str_fields[] = {"build_commit", "cpu_info", "gpu_info", "backends", "model_filename",
                                           "model_type", "type_k", "type_v", "test_time", "devices"};
static const char *const k_int_fields[] = {"build_number", "model_size", "model_n_params", "n_batch", "n_ubatch",
                                           "n_threads", "n_gpu_layers", "n_prompt", "n_gen", "n_depth",
                                           "avg_ns", "stddev_ns", "median_ns", "min_ns", "max_ns"};
static const char *const k_float_fields[] = {"avg_ts", "stddev_ts", "median_ts", "min_ts", "max_ts"};
static const char *const k_bool_fields[] = {"flash_attn", "use_mmap", "embeddings"};

static void check_record(const cJSON *o, const char *model) {
    for (size_t i = 0; i < sizeof k_str_fields / sizeof *k_str_fields; i++)
        CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, k_str_fields[i])), "string field %s", k_str_fields[i]);
    for (size_t i = 0; i < sizeof k_int_fields / sizeof *k_int_fields; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k_int_fields[i]);
        CHECK(cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble), "integer field %s", k_int_fields[i]);
    }
    for (size_t i = 0; i < sizeof k_float_fields / sizeof *k_float_fields; i++)
        CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, k_float_fields[i])), "number field %s", k_float_fields[i]);
    for (size_t i = 0; i < sizeof k_bool_fields / sizeof *k_bool_fields; i++)
        CHECK(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(o, k_bool_fields[i])), "bool field %s", k_bool_fields[i]);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model_filename");
    CHECK(cJSON_IsString(m) && !strcmp(m->valuestring, model), "model_filename round trip: %s",
          cJSON_IsString(m) ? m->valuestring : "?");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "cpu_info");
    CHECK(cJSON_IsString(c) && !strcmp(c->valuestring, "CPU \"quoted\" \\ x"), "cpu_info escape round trip");
    const cJSON *sn = cJSON_GetObjectItemCaseSensitive(o, "samples_ns"), *st = cJSON_GetObjectItemCaseSensitive(o, "samples_ts");
    CHECK(cJSON_IsArray(sn) && cJSON_GetArraySize(sn) == 2, "samples_ns array of 2");
    CHECK(cJSON_IsArray(st) && cJSON_GetArraySize(st) == 2, "samples_ts array of 2");
    /* 1 s and 2 s for 16 tokens: 16 and 8 t/s; avg_ts is the mean rate (12),
     * avg_ns the mean time (1.5 s), as llama-bench computes them */
    const cJSON *avg_ts = cJSON_GetObjectItemCaseSensitive(o, "avg_ts"), *avg_ns = cJSON_GetObjectItemCaseSensitive(o, "avg_ns");
    CHECK(cJSON_IsNumber(avg_ts) && fabs(avg_ts->valuedouble - 12.0) < 1e-6, "avg_ts %g (want 12)", avg_ts ? avg_ts->valuedouble : -1);
    CHECK(cJSON_IsNumber(avg_ns) && avg_ns->valuedouble == 1.5e9, "avg_ns %g", avg_ns ? avg_ns->valuedouble : -1);
}

static char *slurp(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) buf[0] = 0;
    return buf;
}

/* Split one CSV line (RFC 4180 quoting) into fields; returns the count. */
static int csv_split(const char *line, char fields[][256], int max) {
    int n = 0;
    const char *p = line;
    while (*p && *p != '\n' && n < max) {
        char *o = fields[n];
        int k = 0;
        if (*p == '"') {
            p++;
            for (;;) {
                if (*p == '"' && p[1] == '"') { if (k < 255) o[k++] = '"'; p += 2; }
                else if (*p == '"') { p++; break; }
                else if (!*p) break;
                else { if (k < 255) o[k++] = *p; p++; }
            }
        } else {
            while (*p && *p != ',' && *p != '\n') { if (k < 255) o[k++] = *p; p++; }
        }
        o[k] = 0;
        n++;
        if (*p == ',') p++;
    }
    return n;
}

static void test_writers(void) {
    const char *model = "models/a \"b\",c\n\t\x01.gguf";
    nstf_bench_result r1 = sample_result(model, 16, 0), r2 = sample_result(model, 0, 16);
    /* JSON array */
    FILE *f = tmpfile();
    nstf_bench_write_header(f, NSTF_BENCH_FORMAT_JSON);
    nstf_bench_write_result(f, NSTF_BENCH_FORMAT_JSON, &r1, true);
    nstf_bench_write_result(f, NSTF_BENCH_FORMAT_JSON, &r2, false);
    nstf_bench_write_footer(f, NSTF_BENCH_FORMAT_JSON, "abc123", 42);
    char *text = slurp(f);
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    CHECK(cJSON_IsArray(root) && cJSON_GetArraySize(root) == 2, "JSON output is an array of 2: %s", text);
    const cJSON *o;
    cJSON_ArrayForEach(o, root) check_record(o, model);
    cJSON_Delete(root);
    free(text);
    /* JSON lines */
    f = tmpfile();
    nstf_bench_write_header(f, NSTF_BENCH_FORMAT_JSONL);
    nstf_bench_write_result(f, NSTF_BENCH_FORMAT_JSONL, &r1, true);
    nstf_bench_write_result(f, NSTF_BENCH_FORMAT_JSONL, &r2, false);
    nstf_bench_write_footer(f, NSTF_BENCH_FORMAT_JSONL, "abc123", 42);
    text = slurp(f);
    fclose(f);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *obj = cJSON_Parse(line);
        CHECK(cJSON_IsObject(obj), "JSONL line %d parses", lines);
        if (obj) check_record(obj, model);
        cJSON_Delete(obj);
        lines++;
    }
    CHECK(lines == 2, "JSONL has %d lines (want 2)", lines);
    free(text);
    /* CSV: a header and one row per result, equal field counts, quoting
     * round trip (the model name holds a quote, a comma and a newline) */
    f = tmpfile();
    nstf_bench_write_header(f, NSTF_BENCH_FORMAT_CSV);
    nstf_bench_write_result(f, NSTF_BENCH_FORMAT_CSV, &r1, true);
    nstf_bench_write_footer(f, NSTF_BENCH_FORMAT_CSV, "abc123", 42);
    text = slurp(f);
    fclose(f);
    static char hdr[64][256], row[64][256];
    int nh = csv_split(text, hdr, 64);
    const char *second = strchr(text, '\n');
    int nr = second ? csv_split(second + 1, row, 64) : 0;
    CHECK(nh == nr && nh >= 30, "CSV header has %d fields, row %d", nh, nr);
    CHECK(!strcmp(hdr[0], "build_commit") && !strcmp(hdr[5], "model_filename"), "CSV header starts like llama-bench's");
    CHECK(nr > 5 && !strcmp(row[5], model), "CSV model_filename round trip: '%s'", nr > 5 ? row[5] : "");
    free(text);
    /* markdown: llama-bench's columns and the test name */
    f = tmpfile();
    nstf_bench_write_header(f, NSTF_BENCH_FORMAT_MD);
    nstf_bench_write_result(f, NSTF_BENCH_FORMAT_MD, &r2, true);
    nstf_bench_write_footer(f, NSTF_BENCH_FORMAT_MD, "abc123", 42);
    text = slurp(f);
    fclose(f);
    CHECK(strstr(text, "| model ") && strstr(text, " size |") && strstr(text, " params |") && strstr(text, "| backend ") &&
              strstr(text, " threads |") && strstr(text, "test |") && strstr(text, "t/s |") && strstr(text, "tg16 |") &&
              strstr(text, "12.00 ± 5.66") && strstr(text, "build: abc123 (42)"),
          "markdown table: %s", text);
    free(text);
    char name[64];
    nstf_bench_test_name(512, 0, 4096, name, sizeof name);
    CHECK(!strcmp(name, "pp512 @ d4096"), "test name %s", name);
    nstf_bench_test_name(0, 128, 0, name, sizeof name);
    CHECK(!strcmp(name, "tg128"), "test name %s", name);
}

static void test_regress(void) {
    const char *jsonl =
        "{\"model_filename\": \"/somewhere/smollm2.gguf\", \"backends\": \"CPU\", \"n_threads\": 4, \"n_prompt\": 0, "
        "\"n_gen\": 128, \"n_depth\": 0, \"avg_ts\": 95.1}\n"
        "\n"
        "{\"model_filename\": \"smollm2.gguf\", \"backends\": \"CPU\", \"n_threads\": 4, \"n_prompt\": 512, "
        "\"n_gen\": 0, \"avg_ts\": 1000.0}\n";
    nstf_baseline b;
    CHECK(nstf_baseline_parse(jsonl, strlen(jsonl), "base.jsonl", &b) == NSTF_OK && b.n == 2, "JSONL baseline: %s",
          nstf_last_error());
    char msg[512];
    nstf_compare c = nstf_baseline_compare(&b, "models/smollm2.gguf", "tg128", "CPU", 4, 81.2, 0.05, msg, sizeof msg);
    CHECK(c == NSTF_COMPARE_REGRESSED, "95.1 -> 81.2 is a regression");
    CHECK(strstr(msg, "tg128") && strstr(msg, "smollm2.gguf") && strstr(msg, "95.1 -> 81.2 t/s") &&
              strstr(msg, "-14.6%") && strstr(msg, "tolerance 5%"),
          "message: %s", msg);
    c = nstf_baseline_compare(&b, "smollm2.gguf", "pp512", "CPU", 4, 1100.0, 0.05, msg, sizeof msg);
    CHECK(c == NSTF_COMPARE_IMPROVED && strstr(msg, "+10.0%"), "improvement: %s", msg);
    c = nstf_baseline_compare(&b, "smollm2.gguf", "pp512", "CPU", 4, 960.0, 0.05, msg, sizeof msg);
    CHECK(c == NSTF_COMPARE_OK, "-4%% is within 5%%: %s", msg);
    c = nstf_baseline_compare(&b, "smollm2.gguf", "pp256", "CPU", 4, 960.0, 0.05, msg, sizeof msg);
    CHECK(c == NSTF_COMPARE_MISSING && strstr(msg, "not in the baseline"), "missing test: %s", msg);
    c = nstf_baseline_compare(&b, "smollm2.gguf", "pp512", "CPU", 8, 960.0, 0.05, msg, sizeof msg);
    CHECK(c == NSTF_COMPARE_MISSING, "other thread count does not match");
    nstf_baseline_free(&b);

    const char *arr = "[ {\"model_filename\": \"m.gguf\", \"backends\": \"CUDA\", \"n_threads\": 1, \"n_prompt\": 512, "
                      "\"n_gen\": 0, \"n_depth\": 512, \"avg_ts\": 5000} ]";
    CHECK(nstf_baseline_parse(arr, strlen(arr), "base.json", &b) == NSTF_OK && b.n == 1 &&
              !strcmp(b.entries[0].test, "pp512 @ d512"),
          "JSON array baseline with depth");
    nstf_baseline_free(&b);
    const char *bad = "[ {\"model_filename\": \"m.gguf\", \"backends\": \"CPU\", \"n_threads\": 1, \"n_gen\": 1, \"avg_ts\": 5} ]";
    CHECK(nstf_baseline_parse(bad, strlen(bad), "bad.json", &b) == NSTF_ERR_FORMAT && strstr(nstf_last_error(), "n_prompt"),
          "missing field named: %s", nstf_last_error());
    CHECK(nstf_baseline_parse("[ {", 3, "trunc.json", &b) == NSTF_ERR_FORMAT, "truncated JSON");
    CHECK(nstf_baseline_parse("{} \n garbage", 12, "g.jsonl", &b) == NSTF_ERR_FORMAT, "garbage line");
    CHECK(nstf_baseline_parse("[]", 2, "empty.json", &b) == NSTF_ERR_FORMAT, "empty baseline");
    double t;
    CHECK(nstf_parse_tolerance("5%", &t) && fabs(t - 0.05) < 1e-12, "5%%");
    CHECK(nstf_parse_tolerance("2.5", &t) && fabs(t - 0.025) < 1e-12, "2.5");
    CHECK(!nstf_parse_tolerance("5%x", &t) && !nstf_parse_tolerance("-1%", &t) && !nstf_parse_tolerance("", &t),
          "bad tolerances rejected");
}

static void test_trace(void) {
    nstf_trace *t;
    CHECK(nstf_trace_create(&t) == NSTF_OK, "trace create");
    uint64_t o = nstf_now_ns();
    /* recorded as the profiler does: inner spans first, the outer one
     * last; one inner span starts exactly at the outer start and one ends
     * exactly at its end */
    nstf_trace_span(t, "rmsnorm", "op", o + 1000, o + 2000, 0, 10, 20);
    nstf_trace_span(t, "matmul.\"q\"", "op", o + 2000, o + 5000, 0, 1e6, 2e5);
    nstf_trace_span(t, "add", "op", o + 5000, o + 6000, -1, 0, 0);
    nstf_trace_span(t, "forward", "phase", o + 1000, o + 6000, -1, 0, 0);
    nstf_trace_span(t, "forward", "phase", o + 7000, o + 8000, -1, 0, 0);
    FILE *f = tmpfile();
    CHECK(nstf_trace_write(t, f) == NSTF_OK, "trace write");
    char *text = slurp(f);
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    CHECK(cJSON_IsArray(ev), "traceEvents array: %s", text);
    const char *stack[16];
    int depth = 0, n_b = 0, n_e = 0, bad = 0;
    double last_ts = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"), *nm = cJSON_GetObjectItemCaseSensitive(e, "name"),
                    *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
        if (!cJSON_IsString(ph) || !cJSON_IsString(nm)) { bad++; continue; }
        if (!strcmp(ph->valuestring, "M")) continue;
        if (!cJSON_IsNumber(ts) || ts->valuedouble < last_ts) bad++;
        if (cJSON_IsNumber(ts)) last_ts = ts->valuedouble;
        if (!strcmp(ph->valuestring, "B")) {
            n_b++;
            if (depth < 16) stack[depth++] = nm->valuestring;
        } else if (!strcmp(ph->valuestring, "E")) {
            n_e++;
            if (depth == 0 || strcmp(stack[depth - 1], nm->valuestring) != 0) bad++;
            else depth--;
        }
    }
    CHECK(n_b == 5 && n_e == 5 && depth == 0 && bad == 0, "balanced nested B/E in time order: B %d E %d depth %d bad %d",
          n_b, n_e, depth, bad);
    CHECK(strstr(text, "matmul.\\\"q\\\"") != NULL, "names escaped");
    cJSON_Delete(root);
    free(text);
    nstf_trace_free(t);
}

static int g_calls;
static void op_called(void) { g_calls++; }

static void test_profiler_and_costs(void) {
    nstf_op_cost c = nstf_cost_matmul(NSTF_TYPE_F32, 1, 4, 3, true);
    CHECK(c.flops == 24 && c.bytes == 4.0 * 12 + 4.0 * 7 && !c.int8, "F32 matmul cost %g FLOP %g B", c.flops, c.bytes);
    c = nstf_cost_matmul(NSTF_TYPE_Q8_0, 2, 64, 10, true);
    CHECK(c.flops == 2.0 * 2 * 64 * 10 && c.bytes == 10.0 * 2 * 34 + 4.0 * 2 * 74 && c.int8, "Q8_0 matmul cost %g B", c.bytes);
    CHECK(!nstf_cost_matmul(NSTF_TYPE_Q8_0, 2, 64, 10, false).int8, "precise matmul is not int8");
    /* 2 tokens at pos0 = 3 see 4 and 5 positions: 9 visible */
    c = nstf_cost_attention(2, 3, 4, 2, 8);
    CHECK(c.flops == 4.0 * 9 * 4 * 8 + 5.0 * 9 * 4 && c.bytes == 8.0 * 2 * 4 * 8 + 8.0 * 5 * 2 * 8,
          "attention cost %g FLOP %g B", c.flops, c.bytes);
    nstf_prof *none = NULL;
    NSTF_PROF_OP(none, "x", 0, nstf_cost_add(10), op_called());
    CHECK(g_calls == 1, "unprofiled op runs once");
    nstf_prof p = {0};
    for (int i = 0; i < 3; i++) NSTF_PROF_OP(&p, "add", i, nstf_cost_add(10), op_called());
    NSTF_PROF_OP(&p, "swiglu", 0, nstf_cost_swiglu(10), op_called());
    CHECK(g_calls == 5 && p.n_sites == 2 && p.sites[0].calls == 3 && p.sites[0].flops == 30 && p.sites[0].bytes == 360,
          "profiled sites: %d, calls %lld", p.n_sites, (long long)p.sites[0].calls);
}

static void test_roofline(void) {
    nstf_roofline r = {.mem_gbs = 10, .fp32_gflops = 100, .int8_gops = 400, .n_threads = 4, .cpu = "test cpu"};
    CHECK(nstf_roofline_attainable(&r, 1.0, false) == 10, "memory bound at 1 FLOP/B");
    CHECK(nstf_roofline_attainable(&r, 100.0, false) == 100, "fp32 ceiling");
    CHECK(nstf_roofline_attainable(&r, 20.0, true) == 200 && nstf_roofline_attainable(&r, 80.0, true) == 400, "int8 roof");
    CHECK(nstf_roofline_ridge(&r, false) == 10 && nstf_roofline_ridge(&r, true) == 40, "ridge points");
    char path[300];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/nstf_test_prof_XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(nstf_roofline_save(path, &r) == NSTF_OK, "save roofline cache");
    nstf_roofline back;
    CHECK(nstf_roofline_load(path, "test cpu", 4, &back) == NSTF_OK && back.mem_gbs == 10 && back.int8_gops == 400,
          "load roofline cache");
    CHECK(nstf_roofline_load(path, "test cpu", 8, &back) == NSTF_ERR_RANGE, "other thread count is a miss");
    nstf_roofline_point pts[2] = {{"matmul <q>", 3.0, 25.0, 0}, {"add", 0.08, 0.5, 1}};
    const char *names[2] = {"prefill", "decode"};
    CHECK(nstf_roofline_svg(path, &r, pts, 2, names) == NSTF_OK, "svg written");
    FILE *f = fopen(path, "rb");
    char buf[16384] = {0};
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    CHECK(n > 0 && strstr(buf, "<svg") && strstr(buf, "</svg>") && strstr(buf, "matmul &lt;q&gt;") &&
              strstr(buf, "int8 dot"),
          "svg content");
    remove(path);
}

int main(void) {
    test_stats();
    test_writers();
    test_regress();
    test_trace();
    test_profiler_and_costs();
    test_roofline();
    return test_finish("test_prof");
}
