/* metrics.h — what the server counts, and the Prometheus text format it
 * answers /metrics with: fixed-bucket histograms, a growing text buffer,
 * and writers for counters, gauges and histograms (name, HELP, TYPE,
 * samples; histograms cumulative with a +Inf bucket, _sum and _count). */
#ifndef NSTF_SERVE_METRICS_H
#define NSTF_SERVE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NSTF_HIST_MAX 24

typedef struct nstf_hist {
    const double *bounds; /* [n_bounds] ascending upper bounds (static storage) */
    int n_bounds;
    uint64_t counts[NSTF_HIST_MAX + 1]; /* per bucket, the last one past every bound */
    double sum;
    uint64_t n;
} nstf_hist;

void nstf_hist_init(nstf_hist *h, const double *bounds, int n_bounds);
void nstf_hist_add(nstf_hist *h, double v);

/* Bucket bounds: seconds of latency (1 ms .. 5 min) and counts (1 .. 4096). */
extern const double nstf_hist_seconds[];
extern const int nstf_hist_n_seconds;
extern const double nstf_hist_sizes[];
extern const int nstf_hist_n_sizes;

/* A text buffer that grows; after an allocation failure it stays as it
 * was and says so (oom). */
typedef struct nstf_sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} nstf_sbuf;

void nstf_sbuf_add(nstf_sbuf *b, const char *s, size_t n);
void nstf_sbuf_printf(nstf_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nstf_sbuf_free(nstf_sbuf *b);

/* One metric family: the HELP and TYPE lines, then the sample(s). labels
 * may be NULL or "k=\"v\"" text for the one sample. */
void nstf_prom_counter(nstf_sbuf *b, const char *name, const char *help, double v);
void nstf_prom_gauge(nstf_sbuf *b, const char *name, const char *help, double v);
void nstf_prom_hist(nstf_sbuf *b, const char *name, const char *help, const nstf_hist *h);
/* HELP and TYPE only, for a family written as several labelled samples. */
void nstf_prom_family(nstf_sbuf *b, const char *name, const char *type, const char *help);

#endif
