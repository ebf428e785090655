/* gpu_conv.c — nstf_conv2d_bench (nstf_tools.h): one level of the conv2d
 * ladder (ops/gpu/conv*.cu) timed with GPU events on random bf16 data, for
 * `nstf bench conv`. Compiled with a GPU backend; without one the call says
 * so. */
#include "nstf_tools.h"

#include "core/status.h"

#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include "core/dtype.h"
#include "core/mem.h"
#include "ops/conv.h"
#include "ops/gpu/gpu_api.h"

/* Random bf16 values in [-scale, scale) (xorshift64*). */
static void fill_bf16(uint16_t *v, int64_t n, float scale, uint64_t *rng) {
    for (int64_t i = 0; i < n; i++) {
        *rng ^= *rng >> 12, *rng ^= *rng << 25, *rng ^= *rng >> 27;
        const float u = (float)((*rng * 2685821657736338717ull) >> 40) * (1.0f / 8388608.0f) - 1.0f;
        v[i] = nstf_f32_to_bf16(u * scale);
    }
}

/* Host and device buffers of one run, freed together. */
typedef struct bench_bufs {
    uint16_t *hx, *hw;
    void *dx, *dw, *dbias, *dy, *stream, *ev0, *ev1;
} bench_bufs;

static void bufs_free(bench_bufs *b) {
    nstf_free(b->hx);
    nstf_free(b->hw);
    nstf_gpu_free(b->dx);
    nstf_gpu_free(b->dw);
    nstf_gpu_free(b->dbias);
    nstf_gpu_free(b->dy);
    if (b->ev0) nstf_gpu_event_destroy(b->ev0);
    if (b->ev1) nstf_gpu_event_destroy(b->ev1);
    if (b->stream) nstf_gpu_stream_destroy(b->stream);
}

nstf_status nstf_conv2d_bench(const nstf_conv2d_desc *d, int level, int y_bf16, int reps, double *ms) {
    if (!ms || reps < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d bench: reps %d must be >= 1", reps);
    *ms = 0.0;
    int64_t nx, nw, ny;
    NSTF_TRY(nstf_conv2d_out_size(d, NULL, NULL));
    if (nstf_gpu_device_count() < 1) return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d bench: no GPU found");
    NSTF_TRY(nstf_gpu_set_device(0));
    NSTF_TRY(nstf_gpu_conv2d_supported(d, level));
    nstf_conv2d_sizes(d, &nx, &nw, &ny);
    const size_t y_el = y_bf16 ? 2 : 4;
    uint64_t need = 0, part;
    if (!nstf_mul_ok((uint64_t)nx + (uint64_t)nw, 2, &need) || !nstf_mul_ok((uint64_t)ny, y_el, &part) ||
        !nstf_add_ok(need, part + (uint64_t)d->k * 4, &need) || need > SIZE_MAX)
        return nstf_set_error(NSTF_ERR_RANGE, "conv2d bench: tensor bytes overflow");
    nstf_gpu_info info;
    NSTF_TRY(nstf_gpu_query(0, &info));
    if (need > info.free_mem)
        return nstf_set_error(NSTF_ERR_OOM, "conv2d bench: the tensors need %.1f MiB, the device has %.1f MiB free",
                              (double)need / (1 << 20), (double)info.free_mem / (1 << 20));

    bench_bufs b = {0};
    nstf_status st = NSTF_OK;
    b.hx = nstf_alloc((size_t)nx * 2, "conv2d bench input");
    b.hw = nstf_alloc((size_t)nw * 2, "conv2d bench filters");
    float *bias = nstf_alloc((size_t)d->k * 4, "conv2d bench bias");
    if (!b.hx || !b.hw || !bias) st = NSTF_ERR_OOM;
    if (st == NSTF_OK) {
        uint64_t rng = 0x2545f4914f6cdd1dull;
        fill_bf16(b.hx, nx, 1.0f, &rng);
        fill_bf16(b.hw, nw, 0.1f, &rng);
        for (int64_t i = 0; i < d->k; i++) bias[i] = 0.01f * (float)(i % 7);
    }
    if (st == NSTF_OK) st = nstf_gpu_stream_create(&b.stream);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&b.dx, (size_t)nx * 2);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&b.dw, (size_t)nw * 2);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&b.dbias, (size_t)d->k * 4);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&b.dy, (size_t)ny * y_el);
    if (st == NSTF_OK) st = nstf_gpu_memcpy_h2d(b.dx, b.hx, (size_t)nx * 2, b.stream);
    if (st == NSTF_OK) st = nstf_gpu_memcpy_h2d(b.dw, b.hw, (size_t)nw * 2, b.stream);
    if (st == NSTF_OK) st = nstf_gpu_memcpy_h2d(b.dbias, bias, (size_t)d->k * 4, b.stream);
    if (st == NSTF_OK) st = nstf_gpu_event_create(&b.ev0);
    if (st == NSTF_OK) st = nstf_gpu_event_create(&b.ev1);
    const nstf_type yt = y_bf16 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32;
    /* one warm-up call (first-use attributes, caches), then reps back to back */
    if (st == NSTF_OK) st = nstf_gpu_conv2d(d, level, b.dx, b.dw, b.dbias, b.dy, yt, b.stream);
    if (st == NSTF_OK) st = nstf_gpu_event_record(b.ev0, b.stream);
    for (int i = 0; i < reps && st == NSTF_OK; i++) st = nstf_gpu_conv2d(d, level, b.dx, b.dw, b.dbias, b.dy, yt, b.stream);
    if (st == NSTF_OK) st = nstf_gpu_event_record(b.ev1, b.stream);
    float total = 0.0f;
    if (st == NSTF_OK) st = nstf_gpu_event_ms(b.ev0, b.ev1, &total);
    if (st == NSTF_OK) st = nstf_gpu_stream_sync(b.stream);
    if (st == NSTF_OK) *ms = (double)total / reps;
    nstf_free(bias);
    bufs_free(&b);
    return st;
}

#else

nstf_status nstf_conv2d_bench(const nstf_conv2d_desc *d, int level, int y_bf16, int reps, double *ms) {
    (void)d, (void)level, (void)y_bf16, (void)reps;
    if (ms) *ms = 0.0;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                          "conv2d bench: this build has no GPU backend (build with NSTF_CUDA=ON or NSTF_HIP=ON)");
}

#endif
