/* regress.h — the regression check: compare this run's results with a
 * saved llama-bench style JSON array or JSON-lines file.
 *
 * A result matches a baseline entry when the model file's base name, the
 * test ("pp512", "tg128 @ d512"), the backends string and the thread count
 * are equal. The compared figure is avg_ts (tokens per second, higher is
 * better). A change below -tolerance is a regression. */
#ifndef NSTF_PROF_REGRESS_H
#define NSTF_PROF_REGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct nstf_baseline_entry {
    char *model;   /* base name of model_filename */
    char *test;    /* "tg128", "pp512 @ d512" */
    char *backend;
    int n_threads;
    double avg_ts;
} nstf_baseline_entry;

typedef struct nstf_baseline {
    nstf_baseline_entry *entries;
    int64_t n;
} nstf_baseline;

/* Parse a baseline from text (a JSON array of objects, or one JSON object
 * per line); `name` is used in messages. Entries lacking a field are an
 * error naming the entry and the field. */
nstf_status nstf_baseline_parse(const char *text, size_t len, const char *name, nstf_baseline *out);
nstf_status nstf_baseline_load(const char *path, nstf_baseline *out);
void nstf_baseline_free(nstf_baseline *b);

typedef enum nstf_compare {
    NSTF_COMPARE_OK = 0,    /* within tolerance */
    NSTF_COMPARE_IMPROVED,  /* faster by more than the tolerance */
    NSTF_COMPARE_REGRESSED, /* slower by more than the tolerance */
    NSTF_COMPARE_MISSING,   /* no baseline entry for this test */
} nstf_compare;

/* Compare one result. tolerance is a fraction (0.05 = 5%). msg gets one
 * line such as "tg128 on smollm2.gguf (CPU, 4 threads): 95.1 -> 81.2 t/s
 * (-14.6%, tolerance 5%)". */
nstf_compare nstf_baseline_compare(const nstf_baseline *b, const char *model_filename, const char *test,
                                   const char *backend, int n_threads, double avg_ts, double tolerance,
                                   char *msg, size_t cap);

/* "5%", "5" (both percent) or "0.5%"; false on anything else or outside
 * 0..1000%. */
bool nstf_parse_tolerance(const char *s, double *fraction);

/* The part of a path after its last '/'. */
const char *nstf_path_basename(const char *path);

#endif
