/* trace.h — a Chrome / Perfetto trace writer (the "Trace Event Format":
 * {"traceEvents": [{"name", "cat", "ph": "B"|"E", "ts" (microseconds),
 * "pid", "tid", "args"}...], "displayTimeUnit": "ns"}), loadable in
 * chrome://tracing and ui.perfetto.dev.
 *
 * Events are kept in memory while the work runs (no I/O inside timed
 * regions) and written at the end. Every span is recorded whole (its begin
 * and end time together), so the written B/E events are always balanced;
 * spans may nest. Names and categories must outlive the trace (string
 * literals). */
#ifndef NSTF_PROF_TRACE_H
#define NSTF_PROF_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef struct nstf_trace nstf_trace;

/* Timestamps are nanoseconds on nstf_now_ns()'s clock; the trace's zero is
 * its creation time. */
nstf_status nstf_trace_create(nstf_trace **out);
void nstf_trace_free(nstf_trace *t);

/* A span [t0_ns, t1_ns) named `name` in category `cat`; layer < 0 omits the
 * layer argument, flops/bytes <= 0 omit theirs. */
nstf_status nstf_trace_span(nstf_trace *t, const char *name, const char *cat, uint64_t t0_ns, uint64_t t1_ns,
                            int layer, double flops, double bytes);
int64_t nstf_trace_n_spans(const nstf_trace *t);

nstf_status nstf_trace_write(const nstf_trace *t, FILE *f);
nstf_status nstf_trace_save(const nstf_trace *t, const char *path);

#endif
