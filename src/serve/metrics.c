/* metrics.c — histograms, the text buffer and the Prometheus writers
 * (metrics.h). */
#include "serve/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double nstf_hist_seconds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                    1,     2.5,    5,     10,   25,    60,   120, 300};
const int nstf_hist_n_seconds = (int)(sizeof nstf_hist_seconds / sizeof nstf_hist_seconds[0]);
const double nstf_hist_sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
const int nstf_hist_n_sizes = (int)(sizeof nstf_hist_sizes / sizeof nstf_hist_sizes[0]);

void nstf_hist_init(nstf_hist *h, const double *bounds, int n_bounds) {
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n_bounds = n_bounds < NSTF_HIST_MAX ? n_bounds : NSTF_HIST_MAX;
}

void nstf_hist_add(nstf_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

void nstf_sbuf_add(nstf_sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void nstf_sbuf_printf(nstf_sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        nstf_sbuf_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    nstf_sbuf_add(b, big, (size_t)n);
    free(big);
}

void nstf_sbuf_free(nstf_sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void nstf_prom_family(nstf_sbuf *b, const char *name, const char *type, const char *help) {
    nstf_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void nstf_prom_counter(nstf_sbuf *b, const char *name, const char *help, double v) {
    nstf_prom_family(b, name, "counter", help);
    nstf_sbuf_printf(b, "%s %.17g\n", name, v);
}

void nstf_prom_gauge(nstf_sbuf *b, const char *name, const char *help, double v) {
    nstf_prom_family(b, name, "gauge", help);
    nstf_sbuf_printf(b, "%s %.17g\n", name, v);
}

void nstf_prom_hist(nstf_sbuf *b, const char *name, const char *help, const nstf_hist *h) {
    nstf_prom_family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        nstf_sbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    nstf_sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, (unsigned long long)cum,
                     name, h->sum, name, (unsigned long long)h->n);
}
