/* trace.c — in-memory spans written as Chrome trace JSON. */
#include "prof/trace.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "prof/report.h"
#include "prof/timer.h"

typedef struct {
    const char *name, *cat;
    uint64_t t0, t1;
    int layer;
    double flops, bytes;
} span;

struct nstf_trace {
    uint64_t origin;
    span *spans;
    int64_t n, cap;
};

nstf_status nstf_trace_create(nstf_trace **out) {
    *out = NULL;
    nstf_trace *t = calloc(1, sizeof *t);
    if (!t) return nstf_set_error(NSTF_ERR_OOM, "out of memory creating a trace");
    t->origin = nstf_now_ns();
    *out = t;
    return NSTF_OK;
}

void nstf_trace_free(nstf_trace *t) {
    if (!t) return;
    free(t->spans);
    free(t);
}

int64_t nstf_trace_n_spans(const nstf_trace *t) { return t->n; }

nstf_status nstf_trace_span(nstf_trace *t, const char *name, const char *cat, uint64_t t0_ns, uint64_t t1_ns,
                            int layer, double flops, double bytes) {
    if (t->n == t->cap) {
        int64_t cap = t->cap ? 2 * t->cap : 4096;
        uint64_t bytes_needed;
        if (!nstf_mul_ok((uint64_t)cap, sizeof(span), &bytes_needed) || bytes_needed > SIZE_MAX)
            return nstf_set_error(NSTF_ERR_OOM, "trace of %lld spans is too large", (long long)t->n);
        span *ns = realloc(t->spans, (size_t)bytes_needed);
        if (!ns) return nstf_set_error(NSTF_ERR_OOM, "out of memory growing the trace to %lld spans", (long long)cap);
        t->spans = ns;
        t->cap = cap;
    }
    if (t1_ns < t0_ns) t1_ns = t0_ns;
    t->spans[t->n++] = (span){name, cat, t0_ns, t1_ns, layer, flops, bytes};
    return NSTF_OK;
}

static double rel_us(const nstf_trace *t, uint64_t ns) {
    return ns >= t->origin ? (double)(ns - t->origin) / 1e3 : -(double)(t->origin - ns) / 1e3;
}

/* Spans are stored in end order (inner spans end first). They are written
 * as properly nested B/E pairs: sorted by start (outer first on ties),
 * with a stack of open spans whose E events are written as soon as the
 * next span starts at or after their end. */
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1;
    return 0;
}

static void write_event(const nstf_trace *t, FILE *f, const span *s, bool begin) {
    fputs(",\n  {\"name\": \"", f);
    nstf_json_write_string(f, s->name);
    fputs("\", \"cat\": \"", f);
    nstf_json_write_string(f, s->cat ? s->cat : "op");
    fprintf(f, "\", \"ph\": \"%s\", \"ts\": %.3f, \"pid\": 1, \"tid\": 1", begin ? "B" : "E",
            rel_us(t, begin ? s->t0 : s->t1));
    if (begin && (s->layer >= 0 || s->flops > 0 || s->bytes > 0)) {
        fputs(", \"args\": {", f);
        const char *sep = "";
        if (s->layer >= 0) { fprintf(f, "\"layer\": %d", s->layer); sep = ", "; }
        if (s->flops > 0) { fprintf(f, "%s\"flops\": %.0f", sep, s->flops); sep = ", "; }
        if (s->bytes > 0) fprintf(f, "%s\"bytes\": %.0f", sep, s->bytes);
        fputc('}', f);
    }
    fputc('}', f);
}

nstf_status nstf_trace_write(const nstf_trace *t, FILE *f) {
    span *sorted = NULL;
    int64_t *stack = NULL, depth = 0;
    if (t->n) {
        sorted = malloc((size_t)t->n * sizeof *sorted);
        stack = malloc((size_t)t->n * sizeof *stack);
        if (!sorted || !stack) {
            free(sorted);
            free(stack);
            return nstf_set_error(NSTF_ERR_OOM, "out of memory writing the trace");
        }
        memcpy(sorted, t->spans, (size_t)t->n * sizeof *sorted);
        qsort(sorted, (size_t)t->n, sizeof *sorted, cmp_span);
    }
    fputs("{\"displayTimeUnit\": \"ns\", \"traceEvents\": [\n", f);
    fputs("  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": \"nstf\"}}", f);
    for (int64_t i = 0; i < t->n; i++) {
        const span *s = &sorted[i];
        while (depth > 0 && sorted[stack[depth - 1]].t1 <= s->t0) write_event(t, f, &sorted[stack[--depth]], false);
        write_event(t, f, s, true);
        stack[depth++] = i;
    }
    while (depth > 0) write_event(t, f, &sorted[stack[--depth]], false);
    fputs("\n]}\n", f);
    free(sorted);
    free(stack);
    return ferror(f) ? nstf_set_error(NSTF_ERR_IO, "error writing the trace") : NSTF_OK;
}

nstf_status nstf_trace_save(const nstf_trace *t, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "cannot write trace '%s': %s", path, strerror(errno));
    nstf_status s = nstf_trace_write(t, f);
    if (fclose(f) != 0 && s == NSTF_OK) s = nstf_set_error(NSTF_ERR_IO, "error closing trace '%s'", path);
    return s;
}
