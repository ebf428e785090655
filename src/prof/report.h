/* report.h — llama-bench compatible benchmark records and their writers
 * (markdown table, CSV, JSON array, JSON lines).
 *
 * Field names, order and JSON types follow llama.cpp's llama-bench, so
 * scripts that read its output read ours: build_commit, build_number,
 * cpu_info, gpu_info, backends, model_filename, model_type, model_size,
 * model_n_params, n_batch, n_ubatch, n_threads, type_k, type_v,
 * n_gpu_layers, flash_attn, devices, use_mmap, embeddings, n_prompt, n_gen,
 * n_depth, test_time, avg_ns, stddev_ns, avg_ts, stddev_ts, then our own
 * additions (median_ns, min_ns, max_ns, median_ts, min_ts, max_ts, level),
 * then the arrays samples_ns and samples_ts. t/s of a sample is
 * (n_prompt + n_gen) / seconds, and avg_ts is the mean of the per-sample
 * rates (as llama-bench computes it). */
#ifndef NSTF_PROF_REPORT_H
#define NSTF_PROF_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "prof/stats.h"

typedef enum nstf_bench_format {
    NSTF_BENCH_FORMAT_MD = 0,
    NSTF_BENCH_FORMAT_CSV,
    NSTF_BENCH_FORMAT_JSON,
    NSTF_BENCH_FORMAT_JSONL,
} nstf_bench_format;

/* "md", "csv", "json", "jsonl"; false if unknown. */
bool nstf_bench_format_parse(const char *s, nstf_bench_format *out);

/* One test's result. Strings are borrowed (the caller keeps them alive). */
typedef struct nstf_bench_result {
    const char *build_commit;
    int build_number;
    const char *cpu_info;
    const char *gpu_info;
    const char *backends;       /* "CPU", "CUDA", ... */
    const char *model_filename; /* as given on the command line */
    const char *model_type;     /* "llama 135M Q4_1" */
    uint64_t model_size;        /* bytes of tensor data */
    uint64_t model_n_params;
    int n_batch, n_ubatch, n_threads;
    const char *type_k, *type_v; /* KV cache element types ("f32") */
    int n_gpu_layers;
    bool flash_attn, use_mmap, embeddings;
    const char *devices;        /* "auto", "cpu", ... */
    int n_prompt, n_gen, n_depth;
    int level;                  /* execution level (0 on backends with one level) */
    char test_time[32];         /* RFC 3339, UTC */
    const uint64_t *samples_ns; /* [n_samples] */
    int n_samples;
} nstf_bench_result;

/* Statistics of a result's samples in ns and in tokens per second. */
void nstf_bench_result_stats(const nstf_bench_result *r, nstf_stats *ns, nstf_stats *ts);

/* "pp512", "tg128", "pp512+tg128", with " @ d4096" for a depth. */
void nstf_bench_test_name(int n_prompt, int n_gen, int n_depth, char *buf, size_t cap);

/* Stamp test_time with the current UTC time. */
void nstf_bench_result_stamp(nstf_bench_result *r);

/* Writers: header once, one call per result (first = true for the first),
 * footer once. They write what llama-bench writes for the same format. */
void nstf_bench_write_header(FILE *f, nstf_bench_format fmt);
void nstf_bench_write_result(FILE *f, nstf_bench_format fmt, const nstf_bench_result *r, bool first);
void nstf_bench_write_footer(FILE *f, nstf_bench_format fmt, const char *build_commit, int build_number);

/* String escapes: JSON (quotes, backslash, control bytes as \u00XX; the
 * result is the body without the surrounding quotes) and CSV (always
 * quoted, inner quotes doubled). */
void nstf_json_write_string(FILE *f, const char *s);
void nstf_csv_write_string(FILE *f, const char *s);

/* The CPU's model name from /proc/cpuinfo (or "unknown"). */
void nstf_cpu_info(char *buf, size_t cap);

/* The build's commit (short hash, or "unknown") and number (commit count). */
const char *nstf_build_commit(void);
int nstf_build_number(void);

#endif
