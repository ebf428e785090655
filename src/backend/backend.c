/* backend.c — what is shared by every backend: matrix groups, and the one
 * place that knows whether this build has a GPU backend (the GPU entry
 * points of backend.h answer "none" in a CPU-only build). */
#include "backend/backend.h"

#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "ops/gpu/gpu_api.h"
#include "ops/gpu/p2p_api.h"

bool nstf_matrix_group_span(const nstf_matrix *const *w, int n_w, nstf_matrix *span) {
    if (n_w < 1 || w[0]->factors) return false;
    *span = *w[0];
    for (int i = 1; i < n_w; i++) {
        if (w[i]->factors) return false;
        uint64_t rb = 0, bytes = 0;
        const nstf_matrix *prev = w[i - 1];
        if (w[i]->type != w[0]->type || w[i]->n_in != w[0]->n_in || !nstf_type_row_bytes(prev->type, prev->n_in, &rb) ||
            !nstf_mul_ok(rb, (uint64_t)prev->n_out, &bytes))
            return false;
        /* adjacent, and the joint rows stay 16-byte aligned for vector loads */
        if ((const unsigned char *)prev->data + bytes != (const unsigned char *)w[i]->data || bytes % 16 != 0)
            return false;
        span->n_out += w[i]->n_out;
    }
    return true;
}

#if !defined(NSTF_HAVE_CUDA) && !defined(NSTF_HAVE_HIP)

bool nstf_backend_gpu_built(void) { return false; }
const char *nstf_backend_gpu_runtime(void) { return NULL; }
int nstf_backend_gpu_count(void) { return 0; }
const nstf_backend_vt *nstf_backend_gpu_table(void) { return NULL; }

nstf_status nstf_backend_gpu_line(int dev, char *buf, size_t cap) {
    snprintf(buf, cap, "no GPU backend in this build");
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "GPU %d: this build has no GPU backend", dev);
}

nstf_status nstf_backend_gpu_create(int dev, nstf_backend **out) {
    *out = NULL;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                          "GPU %d: this build has no GPU backend (build with NSTF_CUDA=ON or NSTF_HIP=ON)", dev);
}

/* The collectives of ops/gpu/gpu_api.h: no GPU rank can exist here
 * (nstf_backend_gpu_stream refuses first), so these only answer. */
nstf_status nstf_gpu_ccl_init(const int *devs, int n, void **comms, int timeout_ms, char *desc, size_t cap) {
    (void)devs, (void)n, (void)comms, (void)timeout_ms;
    snprintf(desc, cap, "none");
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_ccl_unique_id(unsigned char *id) {
    (void)id;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_ccl_init_rank(int dev, int rank, int n, const unsigned char *id, void **comm, int timeout_ms,
                                   char *desc, size_t cap) {
    (void)dev, (void)rank, (void)n, (void)id, (void)timeout_ms;
    *comm = NULL;
    snprintf(desc, cap, "none");
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_ccl_allreduce_f32(void *comm, float *buf, int64_t n, void *stream, int timeout_ms) {
    (void)comm, (void)buf, (void)n, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_ccl_reduce_scatter_f32(void *comm, int rank, float *buf, int64_t shard, void *stream,
                                            int timeout_ms) {
    (void)comm, (void)rank, (void)buf, (void)shard, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_ccl_allgather(void *comm, int rank, void *buf, int64_t slot_bytes, void *stream, int timeout_ms) {
    (void)comm, (void)rank, (void)buf, (void)slot_bytes, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
void nstf_gpu_ccl_abort(void *comm) { (void)comm; }
nstf_status nstf_gpu_p2p_create(const int *devs, int n, int64_t cap, nstf_p2p **out) {
    (void)devs, (void)n, (void)cap;
    *out = NULL;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
void nstf_gpu_p2p_free(nstf_p2p *p) { (void)p; }
int64_t nstf_gpu_p2p_cap(const nstf_p2p *p) {
    (void)p;
    return 0;
}
nstf_status nstf_gpu_p2p_allreduce_f32(nstf_p2p *p, int rank, float *buf, float *dst, int64_t n, void *stream,
                                       int timeout_ms) {
    (void)p, (void)rank, (void)buf, (void)dst, (void)n, (void)stream, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_p2p_check(nstf_p2p *p, int rank) {
    (void)p, (void)rank;
    return NSTF_OK;
}
void nstf_gpu_p2p_abort(nstf_p2p *p) { (void)p; }
void nstf_gpu_ccl_destroy(void *comm) { (void)comm; }
nstf_status nstf_gpu_link_query(int a, int b, nstf_gpu_link *out) {
    (void)a, (void)b;
    memset(out, 0, sizeof *out);
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}
nstf_status nstf_gpu_p2p_measure(int a, int b, size_t bytes, double *gbs, double *lat_us) {
    (void)a, (void)b, (void)bytes;
    *gbs = *lat_us = 0;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}

nstf_status nstf_backend_gpu_stream(nstf_backend *be, int *dev, void **stream) {
    (void)be;
    *dev = -1;
    *stream = NULL;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}

nstf_status nstf_backend_gpu_l4_stall(nstf_backend *be, int block, int ins, int timeout_ms) {
    (void)be, (void)block, (void)ins, (void)timeout_ms;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}

nstf_status nstf_backend_gpu_l4_profile(nstf_backend *be, bool on) {
    (void)be, (void)on;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}

nstf_status nstf_backend_gpu_l4_profile_get(nstf_backend *be, nstf_l4_profile *out) {
    (void)be;
    memset(out, 0, sizeof *out);
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}

const char *nstf_backend_gpu_l4_status(nstf_backend *be, int64_t *instructions) {
    (void)be;
    *instructions = 0;
    return "this build has no GPU backend";
}

nstf_status nstf_backend_gpu_peaks(nstf_backend *be, double *copy_gbs, double *matrix_gflops) {
    (void)be;
    *copy_gbs = *matrix_gflops = 0;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "this build has no GPU backend");
}

#endif
