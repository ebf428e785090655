/* report.c — llama-bench compatible output: the field table and the
 * markdown, CSV, JSON and JSON-lines writers. */
#include "prof/report.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The build identity: generated at build time by cmake/build_info.cmake
 * (absent when the sources are compiled outside CMake). */
#if defined(__has_include)
#if __has_include("nstf_build_info.h")
#include "nstf_build_info.h"
#endif
#endif
#ifndef NSTF_BUILD_COMMIT
#define NSTF_BUILD_COMMIT "unknown"
#endif
#ifndef NSTF_BUILD_NUMBER
#define NSTF_BUILD_NUMBER 0
#endif

const char *nstf_build_commit(void) { return NSTF_BUILD_COMMIT; }
int nstf_build_number(void) { return NSTF_BUILD_NUMBER; }

bool nstf_bench_format_parse(const char *s, nstf_bench_format *out) {
    static const char *names[] = {"md", "csv", "json", "jsonl"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = (nstf_bench_format)i;
            return true;
        }
    return false;
}

void nstf_cpu_info(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *v = strchr(line, ':');
        if (!v) continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\r\n");
        if (n >= cap) n = cap - 1;
        memcpy(buf, v, n);
        buf[n] = 0;
        break;
    }
    fclose(f);
}

void nstf_bench_test_name(int n_prompt, int n_gen, int n_depth, char *buf, size_t cap) {
    if (n_prompt > 0 && n_gen == 0) snprintf(buf, cap, "pp%d", n_prompt);
    else if (n_gen > 0 && n_prompt == 0) snprintf(buf, cap, "tg%d", n_gen);
    else snprintf(buf, cap, "pp%d+tg%d", n_prompt, n_gen);
    if (n_depth > 0) {
        size_t len = strlen(buf);
        if (len < cap) snprintf(buf + len, cap - len, " @ d%d", n_depth);
    }
}

void nstf_bench_result_stamp(nstf_bench_result *r) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(r->test_time, sizeof r->test_time, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static double sample_ts(const nstf_bench_result *r, int i) {
    double ns = (double)r->samples_ns[i];
    return ns > 0 ? 1e9 * (double)(r->n_prompt + r->n_gen) / ns : 0.0;
}

void nstf_bench_result_stats(const nstf_bench_result *r, nstf_stats *ns, nstf_stats *ts) {
    int n = r->n_samples;
    double *a = malloc(sizeof(double) * (size_t)(n > 0 ? 2 * n : 1));
    if (!a) { /* report nothing rather than fail: the writers cannot fail */
        if (ns) *ns = nstf_stats_compute(NULL, 0);
        if (ts) *ts = nstf_stats_compute(NULL, 0);
        return;
    }
    for (int i = 0; i < n; i++) {
        a[i] = (double)r->samples_ns[i];
        a[n + i] = sample_ts(r, i);
    }
    if (ns) *ns = nstf_stats_compute(a, n);
    if (ts) *ts = nstf_stats_compute(a + n, n);
    free(a);
}

/* ---- escapes ---------------------------------------------------------------- */

void nstf_json_write_string(FILE *f, const char *s) {
    if (!s) s = "";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"') fputs("\\\"", f);
        else if (*p == '\\') fputs("\\\\", f);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
}

void nstf_csv_write_string(FILE *f, const char *s) {
    if (!s) s = "";
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* ---- the field table ---------------------------------------------------------- */

typedef enum { F_STR, F_INT, F_BOOL, F_FLOAT } field_type;

typedef struct {
    const char *name;
    field_type type;
} field;

static const field k_fields[] = {
    {"build_commit", F_STR},  {"build_number", F_INT},   {"cpu_info", F_STR},     {"gpu_info", F_STR},
    {"backends", F_STR},      {"model_filename", F_STR}, {"model_type", F_STR},   {"model_size", F_INT},
    {"model_n_params", F_INT}, {"n_batch", F_INT},       {"n_ubatch", F_INT},     {"n_threads", F_INT},
    {"type_k", F_STR},        {"type_v", F_STR},         {"n_gpu_layers", F_INT}, {"flash_attn", F_BOOL},
    {"devices", F_STR},       {"use_mmap", F_BOOL},      {"embeddings", F_BOOL},  {"n_prompt", F_INT},
    {"n_gen", F_INT},         {"n_depth", F_INT},        {"test_time", F_STR},    {"avg_ns", F_INT},
    {"stddev_ns", F_INT},     {"avg_ts", F_FLOAT},       {"stddev_ts", F_FLOAT},  {"median_ns", F_INT},
    {"min_ns", F_INT},        {"max_ns", F_INT},         {"median_ts", F_FLOAT},  {"min_ts", F_FLOAT},
    {"max_ts", F_FLOAT},      {"level", F_INT},
};
enum { N_FIELDS = sizeof k_fields / sizeof k_fields[0] };

typedef struct {
    const char *s;
    long long i;
    double d;
} value;

static value field_value(const nstf_bench_result *r, const nstf_stats *ns, const nstf_stats *ts, int k) {
    value v = {0};
    switch (k) {
    case 0: v.s = r->build_commit; break;
    case 1: v.i = r->build_number; break;
    case 2: v.s = r->cpu_info; break;
    case 3: v.s = r->gpu_info; break;
    case 4: v.s = r->backends; break;
    case 5: v.s = r->model_filename; break;
    case 6: v.s = r->model_type; break;
    case 7: v.i = (long long)r->model_size; break;
    case 8: v.i = (long long)r->model_n_params; break;
    case 9: v.i = r->n_batch; break;
    case 10: v.i = r->n_ubatch; break;
    case 11: v.i = r->n_threads; break;
    case 12: v.s = r->type_k; break;
    case 13: v.s = r->type_v; break;
    case 14: v.i = r->n_gpu_layers; break;
    case 15: v.i = r->flash_attn; break;
    case 16: v.s = r->devices; break;
    case 17: v.i = r->use_mmap; break;
    case 18: v.i = r->embeddings; break;
    case 19: v.i = r->n_prompt; break;
    case 20: v.i = r->n_gen; break;
    case 21: v.i = r->n_depth; break;
    case 22: v.s = r->test_time; break;
    case 23: v.i = (long long)ns->mean; break;
    case 24: v.i = (long long)ns->stddev; break;
    case 25: v.d = ts->mean; break;
    case 26: v.d = ts->stddev; break;
    case 27: v.i = (long long)ns->median; break;
    case 28: v.i = (long long)ns->min; break;
    case 29: v.i = (long long)ns->max; break;
    case 30: v.d = ts->median; break;
    case 31: v.d = ts->min; break;
    case 32: v.d = ts->max; break;
    case 33: v.i = r->level; break;
    default: break;
    }
    return v;
}

static void write_value_json(FILE *f, field_type t, value v) {
    switch (t) {
    case F_STR: fputc('"', f); nstf_json_write_string(f, v.s); fputc('"', f); break;
    case F_INT: fprintf(f, "%lld", v.i); break;
    case F_BOOL: fputs(v.i ? "true" : "false", f); break;
    case F_FLOAT: fprintf(f, "%.6f", v.d); break;
    }
}

static void write_value_csv(FILE *f, field_type t, value v) {
    char buf[64];
    switch (t) {
    case F_STR: nstf_csv_write_string(f, v.s); return;
    case F_INT: case F_BOOL: snprintf(buf, sizeof buf, "%lld", v.i); break;
    case F_FLOAT: snprintf(buf, sizeof buf, "%.6f", v.d); break;
    }
    nstf_csv_write_string(f, buf); /* llama-bench quotes every CSV value */
}

static void write_samples(FILE *f, const nstf_bench_result *r, const char *sep) {
    fputs("\"samples_ns\": [ ", f);
    for (int i = 0; i < r->n_samples; i++)
        fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)r->samples_ns[i]);
    fprintf(f, " ],%s\"samples_ts\": [ ", sep);
    for (int i = 0; i < r->n_samples; i++) fprintf(f, "%s%.6f", i ? ", " : "", sample_ts(r, i));
    fputs(" ]", f);
}

/* ---- markdown ------------------------------------------------------------------- */

/* Columns of llama-bench's table for a CPU run, then our median and range. */
static const struct {
    const char *name;
    int width; /* negative: left-aligned */
} k_md_cols[] = {{"model", -30}, {"size", 10}, {"params", 10}, {"backend", -10}, {"threads", 7},
                 {"test", 15},  {"t/s", 20},  {"median t/s", 10}, {"min..max t/s", 20}};
enum { N_MD = sizeof k_md_cols / sizeof k_md_cols[0] };

static void md_cell(FILE *f, int col, const char *s) {
    int w = k_md_cols[col].width;
    fprintf(f, " %*s |", w, s);
}

void nstf_bench_write_header(FILE *f, nstf_bench_format fmt) {
    switch (fmt) {
    case NSTF_BENCH_FORMAT_MD:
        fputc('|', f);
        for (int i = 0; i < N_MD; i++) md_cell(f, i, k_md_cols[i].name);
        fputs("\n|", f);
        for (int i = 0; i < N_MD; i++) {
            int w = abs(k_md_cols[i].width);
            fputc(' ', f);
            for (int j = 0; j < w - 1; j++) fputc('-', f);
            fputs(k_md_cols[i].width > 0 ? ": |" : "- |", f);
        }
        fputc('\n', f);
        break;
    case NSTF_BENCH_FORMAT_CSV:
        for (int i = 0; i < N_FIELDS; i++) fprintf(f, "%s%s", i ? "," : "", k_fields[i].name);
        fputc('\n', f);
        break;
    case NSTF_BENCH_FORMAT_JSON: fputs("[\n", f); break;
    case NSTF_BENCH_FORMAT_JSONL: break;
    }
}

void nstf_bench_write_result(FILE *f, nstf_bench_format fmt, const nstf_bench_result *r, bool first) {
    nstf_stats ns, ts;
    nstf_bench_result_stats(r, &ns, &ts);
    char buf[128];
    switch (fmt) {
    case NSTF_BENCH_FORMAT_MD: {
        fputc('|', f);
        md_cell(f, 0, r->model_type ? r->model_type : "");
        if (r->model_size < 1024ull * 1024 * 1024)
            snprintf(buf, sizeof buf, "%.2f MiB", (double)r->model_size / 1024.0 / 1024.0);
        else
            snprintf(buf, sizeof buf, "%.2f GiB", (double)r->model_size / 1024.0 / 1024.0 / 1024.0);
        md_cell(f, 1, buf);
        if (r->model_n_params < 1000ull * 1000 * 1000)
            snprintf(buf, sizeof buf, "%.2f M", (double)r->model_n_params / 1e6);
        else
            snprintf(buf, sizeof buf, "%.2f B", (double)r->model_n_params / 1e9);
        md_cell(f, 2, buf);
        md_cell(f, 3, r->backends ? r->backends : "");
        snprintf(buf, sizeof buf, "%d", r->n_threads);
        md_cell(f, 4, buf);
        nstf_bench_test_name(r->n_prompt, r->n_gen, r->n_depth, buf, sizeof buf);
        md_cell(f, 5, buf);
        /* "±" is two bytes in UTF-8: widen by one so the columns line up */
        snprintf(buf, sizeof buf, "%.2f ± %.2f", ts.mean, ts.stddev);
        fprintf(f, " %*s |", k_md_cols[6].width + 1, buf);
        snprintf(buf, sizeof buf, "%.2f", ts.median);
        md_cell(f, 7, buf);
        snprintf(buf, sizeof buf, "%.2f .. %.2f", ts.min, ts.max);
        md_cell(f, 8, buf);
        fputc('\n', f);
        break;
    }
    case NSTF_BENCH_FORMAT_CSV:
        for (int i = 0; i < N_FIELDS; i++) {
            if (i) fputc(',', f);
            write_value_csv(f, k_fields[i].type, field_value(r, &ns, &ts, i));
        }
        fputc('\n', f);
        break;
    case NSTF_BENCH_FORMAT_JSON:
        if (!first) fputs(",\n", f);
        fputs("  {\n", f);
        for (int i = 0; i < N_FIELDS; i++) {
            fprintf(f, "    \"%s\": ", k_fields[i].name);
            write_value_json(f, k_fields[i].type, field_value(r, &ns, &ts, i));
            fputs(",\n", f);
        }
        fputs("    ", f);
        write_samples(f, r, "\n    ");
        fputs("\n  }", f);
        break;
    case NSTF_BENCH_FORMAT_JSONL:
        fputc('{', f);
        for (int i = 0; i < N_FIELDS; i++) {
            fprintf(f, "\"%s\": ", k_fields[i].name);
            write_value_json(f, k_fields[i].type, field_value(r, &ns, &ts, i));
            fputs(", ", f);
        }
        write_samples(f, r, " ");
        fputs("}\n", f);
        break;
    }
    fflush(f);
}

void nstf_bench_write_footer(FILE *f, nstf_bench_format fmt, const char *build_commit, int build_number) {
    if (fmt == NSTF_BENCH_FORMAT_JSON) fputs("\n]\n", f);
    else if (fmt == NSTF_BENCH_FORMAT_MD) fprintf(f, "\nbuild: %s (%d)\n", build_commit, build_number);
    fflush(f);
}
