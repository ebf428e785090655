/* memory.c — the memory table and the weight-touch progress bar. */
#include "prof/memory.h"

#include <string.h>
#include <unistd.h>

#include "model/session.h"
#include "prof/timer.h"

static void stage_report(const nstf_backend *be, const nstf_llama_run *r, nstf_mem_report *out) {
    memset(out, 0, sizeof *out);
    nstf_backend_mem mem;
    be->vt->mem(be, &mem);
    out->device = be->host_memory ? "cpu" : "gpu";
    out->total = mem.total;
    out->free = mem.free;
    out->weights = r->wbytes;
    out->kv_cache = r->s.kv_bytes;
    out->compute = (r->s.block_bytes > r->s.kv_bytes ? r->s.block_bytes - r->s.kv_bytes : 0) + mem.workspace;
}

int nstf_mem_report_session(const nstf_session *s, nstf_mem_report out[NSTF_MEM_MAX_DEVICES]) {
    stage_report(s->be, s->run, &out[0]);
    if (!s->run_cpu) return 1;
    stage_report(s->be_cpu, s->run_cpu, &out[1]);
    return 2;
}

void nstf_mem_report_print_session(FILE *f, const nstf_session *s) {
    nstf_mem_report r[NSTF_MEM_MAX_DEVICES];
    const int n = nstf_mem_report_session(s, r);
    for (int i = 0; i < n; i++) nstf_mem_report_print(f, &r[i]);
}

void nstf_mem_report_print(FILE *f, const nstf_mem_report *r) {
    fprintf(f, "memory: device=%s total=%llu free=%llu weights=%llu kv_cache=%llu compute=%llu\n", r->device,
            (unsigned long long)r->total, (unsigned long long)r->free, (unsigned long long)r->weights,
            (unsigned long long)r->kv_cache, (unsigned long long)r->compute);
    fflush(f);
}

static void bar(FILE *f, uint64_t done, uint64_t total, double secs) {
    const int width = 30;
    double frac = total ? (double)done / (double)total : 1.0;
    int fill = (int)(frac * width + 0.5);
    char b[64];
    for (int i = 0; i < width; i++) b[i] = i < fill ? '#' : '.';
    b[width] = 0;
    double mib = (double)done / (1 << 20);
    fprintf(f, "\rloading [%s] %5.1f%% %8.1f / %.1f MiB %8.1f MiB/s", b, 100.0 * frac, mib,
            (double)total / (1 << 20), secs > 0 ? mib / secs : 0.0);
    fflush(f);
}

void nstf_weights_touch(const nstf_session *s, FILE *f, bool plain) {
    const nstf_gguf *g = s->model->file;
    if (!g->base || g->size <= g->data_offset) return;
    const volatile uint8_t *p = g->base + g->data_offset;
    const uint64_t total = g->size - g->data_offset, page = 4096, step = (uint64_t)4 << 20;
    const bool tty = isatty(fileno(f));
    uint64_t t0 = nstf_now_ns(), last = t0;
    unsigned sum = 0;
    for (uint64_t off = 0; off < total; off += step) {
        uint64_t end = off + step < total ? off + step : total;
        for (uint64_t o = off; o < end; o += page) sum += p[o];
        uint64_t now = nstf_now_ns();
        if (tty && end < total && now - last > 50000000ull) { /* redraw at most 20 times a second */
            bar(f, end, total, (double)(now - t0) * 1e-9);
            last = now;
        }
    }
    (void)sum;
    double secs = (double)(nstf_now_ns() - t0) * 1e-9;
    if (tty) {
        bar(f, total, total, secs);
        fputc('\n', f);
    } else if (plain) {
        fprintf(f, "loading: %s: %.1f MiB of weights %s, touched in %.0f ms (%.0f MiB/s)\n", g->path,
                (double)total / (1 << 20), g->mapped ? "mapped" : "in memory", secs * 1e3,
                secs > 0 ? (double)total / (1 << 20) / secs : 0.0);
    }
    fflush(f);
}
