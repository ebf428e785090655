/* roofline.h — measured device ceilings and the roofline model.
 *
 * Ceilings are measured, never quoted: memory bandwidth by a threaded copy
 * of buffers far larger than the last-level cache (bytes read + written per
 * second, as STREAM's copy counts them), fp32 peak by independent FMA
 * chains on every thread, int8 peak by the same unsigned x signed byte
 * dot-product sequence the quantized matmul uses (AVX2 maddubs + madd;
 * 2 ops per multiply-accumulate). Results are cached in a small JSON file
 * keyed by CPU model and thread count. */
#ifndef NSTF_PROF_ROOFLINE_H
#define NSTF_PROF_ROOFLINE_H

#include <stdbool.h>
#include <stddef.h>

#include <stdio.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "nstf.h"

typedef struct nstf_roofline {
    double mem_gbs;     /* GB/s (1e9 bytes) */
    double fp32_gflops; /* GFLOP/s */
    double int8_gops;   /* GOP/s of int8 dot products */
    int n_threads;
    char cpu[128];
} nstf_roofline;

/* Run the three measurements on the pool's threads (about a second). */
nstf_status nstf_roofline_measure(nstf_pool *pool, nstf_roofline *out);

/* The ceilings of the device a session runs on, from the cache when it
 * holds them for this device (and thread count), else measured and cached:
 * a CPU's three measurements on its threads; a GPU's device copy
 * bandwidth and bf16 matrix rate (stored as both compute ceilings). A line
 * on `log` says when it measures. */
nstf_status nstf_roofline_for_session(nstf_session *s, const char *cache, bool remeasure, FILE *log,
                                      nstf_roofline *out);

/* Default cache file: $XDG_CACHE_HOME/nstf/roofline.json or
 * ~/.cache/nstf/roofline.json. */
void nstf_roofline_default_cache(char *buf, size_t cap);
/* Load from the cache; NSTF_ERR_IO if absent, NSTF_ERR_FORMAT if malformed,
 * NSTF_ERR_RANGE if it was measured on another CPU or thread count. */
nstf_status nstf_roofline_load(const char *path, const char *cpu, int n_threads, nstf_roofline *out);
/* Save, creating the directory if needed. */
nstf_status nstf_roofline_save(const char *path, const nstf_roofline *r);

/* Attainable GFLOP/s at an arithmetic intensity (FLOP per byte). */
double nstf_roofline_attainable(const nstf_roofline *r, double intensity, bool int8);
/* Intensity where the memory roof meets the compute ceiling. */
double nstf_roofline_ridge(const nstf_roofline *r, bool int8);

typedef struct nstf_roofline_point {
    const char *label;
    double intensity; /* FLOP / byte */
    double gflops;    /* achieved */
    int series;       /* 0 or 1: drawn in two colours (e.g. prefill, decode) */
} nstf_roofline_point;

/* A log-log roofline chart: the memory roof, both compute ceilings, one
 * labelled dot per point. series_names[0..1] label the legend. */
nstf_status nstf_roofline_svg(const char *path, const nstf_roofline *r, const nstf_roofline_point *pts, int n,
                              const char *const series_names[2]);

#endif
