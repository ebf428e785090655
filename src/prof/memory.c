/* memory.c — the memory table and the weight-touch progress bar. */
#include "prof/memory.h"

#include <string.h>
#include <unistd.h>

#include "prof/timer.h"
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
#include "ops/gpu/gpu_api.h"
#endif

static uint64_t meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t klen = strlen(key);
    unsigned long long v = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            sscanf(line + klen + 1, "%llu", &v);
            break;
        }
    }
    fclose(f);
    return (uint64_t)v * 1024;
}

void nstf_mem_report_session(const nstf_session *s, nstf_mem_report *out) {
    memset(out, 0, sizeof *out);
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
    if (s->gpu) { /* the GPU's own memory: what the model holds there */
        nstf_gpu_info info;
        nstf_gpu_mem gm;
        nstf_llama_gpu_mem(s->gpu, &gm);
        out->device = "gpu";
        if (nstf_gpu_query(0, &info) == NSTF_OK) {
            out->total = info.total_mem;
            out->free = info.free_mem;
        }
        out->weights = gm.weights;
        out->kv_cache = gm.kv_cache;
        out->compute = gm.activations + gm.workspace;
        return;
    }
#endif
    out->device = "cpu";
    out->total = meminfo_kb("MemTotal");
    out->free = meminfo_kb("MemAvailable");
    const nstf_llama *m = s->model;
    const nstf_gguf *g = m->file;
    for (uint64_t i = 0; i < g->n_tensors; i++) out->weights += g->tensors[i].n_bytes;
    out->weights += (uint64_t)(2 * m->cfg.n_layers + 1) * (uint64_t)m->cfg.dim * sizeof(float); /* fp32 norms */
    const nstf_llama_state *st = &s->state;
    uint64_t kv_dim = (uint64_t)m->cfg.n_kv_heads * (uint64_t)m->cfg.head_dim;
    out->kv_cache = 2 * (uint64_t)m->cfg.n_layers * (uint64_t)st->n_ctx * kv_dim * sizeof(float);
    out->compute = (st->block_bytes > out->kv_cache ? st->block_bytes - out->kv_cache : 0) + s->cpu.scratch_bytes;
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
