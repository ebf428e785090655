/* proc.c — the process group of a launch by mpirun (see proc.h): finding
 * and loading libnstf_mpi, and the group's collectives cut into the
 * pieces MPI's int counts take. */
#define _GNU_SOURCE /* dladdr */
#include "dist/proc.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "core/switches.h"
#include "dist/mpi_shim.h"

#define PIECE (1 << 28) /* bytes per rank in one MPI call: 256 MiB */

static struct {
    pthread_mutex_t mu;
    bool joined, left;
    const nstf_mpi_shim *shim;
    int rank, size, local_rank, local_size;
    int64_t seq; /* collectives entered (the heartbeats' numbers) */
    char desc[128];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .size = 1, .local_size = 1};

bool nstf_proc_launched(void) {
    return nstf_switch_int(NSTF_SW_OMPI_WORLD_SIZE) > 1 || nstf_switch_int(NSTF_SW_PMI_SIZE) > 1;
}

/* dir/libnstf_mpi.so where dir is the folder of path (a file). */
static void beside(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        out[0] = 0;
        return;
    }
    snprintf(out, cap, "%.*s/libnstf_mpi.so", (int)(slash - path), path);
}

/* The shim: NSTF_MPI_LIBRARY, beside the program, beside libnstf, the
 * loader's path; the first that loads. */
static nstf_status load_shim(void) {
    char cand[3][1100] = {{0}};
    const char *sw = nstf_switch_str(NSTF_SW_MPI_LIBRARY);
    if (sw && *sw) {
        snprintf(cand[0], sizeof cand[0], "%s", sw);
    } else {
        char exe[1024];
        const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = 0;
            beside(exe, cand[0], sizeof cand[0]);
        }
        Dl_info info;
        if (dladdr((void *)nstf_proc_join, &info) && info.dli_fname) beside(info.dli_fname, cand[1], sizeof cand[1]);
        snprintf(cand[2], sizeof cand[2], "libnstf_mpi.so");
    }
    char why[600] = "";
    for (int i = 0; i < 3; i++) {
        if (!cand[i][0]) continue;
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_GLOBAL); /* global: Open MPI's plugins look for its symbols */
        if (!h) {
            if (!why[0]) snprintf(why, sizeof why, "%s", dlerror());
            continue;
        }
        nstf_mpi_shim_fn fn;
        *(void **)&fn = dlsym(h, NSTF_MPI_SHIM_ENTRY);
        const nstf_mpi_shim *s = fn ? fn() : NULL;
        if (!s || s->version != NSTF_MPI_SHIM_VERSION) {
            snprintf(why, sizeof why, "%.400s is not this build's (version %d, want %d)", cand[i],
                     s ? s->version : -1, NSTF_MPI_SHIM_VERSION);
            continue;
        }
        g.shim = s;
        return NSTF_OK;
    }
    return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                          "launched by mpirun, but libnstf_mpi.so (MPI) could not be loaded: %s. Build with MPI "
                          "installed (Debian: libopenmpi-dev), or name the file in NSTF_MPI_LIBRARY",
                          why[0] ? why : "not found");
}

nstf_status nstf_proc_join(void) {
    pthread_mutex_lock(&g.mu);
    nstf_status st = NSTF_OK;
    if (g.left) st = nstf_set_error(NSTF_ERR_INVALID_ARG, "the launch's process group was left already");
    else if (!g.joined) {
        st = load_shim();
        char err[600] = "";
        if (st == NSTF_OK && g.shim->init(&g.rank, &g.size, &g.local_rank, &g.local_size, g.desc, sizeof g.desc, err,
                                          sizeof err) != 0)
            st = nstf_set_error(NSTF_ERR_UNSUPPORTED, "joining the mpirun launch: %s", err);
        g.joined = st == NSTF_OK;
    }
    pthread_mutex_unlock(&g.mu);
    return st;
}

bool nstf_proc_active(void) { return g.joined && !g.left && g.size > 1; }
int nstf_proc_rank(void) { return g.rank; }
int nstf_proc_size(void) { return g.size; }
int nstf_proc_local_rank(void) { return g.local_rank; }
int nstf_proc_local_size(void) { return g.local_size; }
const char *nstf_proc_transport(void) { return g.desc; }

static nstf_status not_joined(const char *what) {
    return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s outside an mpirun launch's process group", what);
}

static nstf_status shim_result(int rc, const char *err) {
    if (rc == 0) return NSTF_OK;
    return nstf_set_error(rc > 0 ? NSTF_ERR_RANGE : NSTF_ERR_IO, "%s", err);
}

nstf_status nstf_proc_allgather(const void *mine, void *all, size_t bytes, int timeout_ms) {
    if (!nstf_proc_active()) return not_joined("an all-gather");
    const size_t n = (size_t)g.size;
    if (bytes > SIZE_MAX / n) return nstf_set_error(NSTF_ERR_INVALID_ARG, "all-gather of %zu bytes per rank", bytes);
    char *a = all;
    const char *m = mine;
    const bool in_place = m == a + bytes * (size_t)g.rank;
    if (bytes <= PIECE) { /* one call, MPI's in-place form where mine is in all */
        char err[600] = "";
        return shim_result(g.shim->allgather(++g.seq, mine, all, (int)bytes, timeout_ms, err, sizeof err), err);
    }
    /* in pieces through a buffer of size x PIECE */
    char *tmp = nstf_alloc(n * PIECE, "all-gather buffer");
    if (!tmp) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    for (size_t o = 0; o < bytes && st == NSTF_OK; o += PIECE) {
        const size_t k = bytes - o < PIECE ? bytes - o : PIECE;
        char err[600] = "";
        st = shim_result(g.shim->allgather(++g.seq, m + o, tmp, (int)k, timeout_ms, err, sizeof err), err);
        for (size_t r = 0; st == NSTF_OK && r < n; r++)
            if (!(in_place && r == (size_t)g.rank)) memcpy(a + r * bytes + o, tmp + r * k, k);
    }
    nstf_free(tmp);
    return st;
}

nstf_status nstf_proc_bcast0(void *buf, size_t bytes, int timeout_ms) {
    if (!nstf_proc_active()) return not_joined("a broadcast");
    if (bytes == 0) return NSTF_OK;
    const size_t n = (size_t)g.size;
    if (bytes > SIZE_MAX / n) return nstf_set_error(NSTF_ERR_INVALID_ARG, "broadcast of %zu bytes", bytes);
    char *all = nstf_alloc(n * bytes, "broadcast buffer");
    if (!all) return NSTF_ERR_OOM;
    const nstf_status st = nstf_proc_allgather(buf, all, bytes, timeout_ms);
    if (st == NSTF_OK && g.rank != 0) memcpy(buf, all, bytes);
    nstf_free(all);
    return st;
}

nstf_status nstf_proc_alltoall(const void *send, void *recv, size_t bytes, int timeout_ms) {
    if (!nstf_proc_active()) return not_joined("an all-to-all");
    if (bytes > INT_MAX) return nstf_set_error(NSTF_ERR_INVALID_ARG, "all-to-all of %zu bytes per rank", bytes);
    char err[600] = "";
    return shim_result(g.shim->alltoall(++g.seq, send, recv, (int)bytes, timeout_ms, err, sizeof err), err);
}

void nstf_proc_abort(int code) {
    if (g.joined && !g.left) g.shim->abort_all(code);
}

void nstf_proc_leave(int timeout_ms) {
    pthread_mutex_lock(&g.mu);
    if (g.joined && !g.left) g.shim->finalize(timeout_ms);
    g.left = g.joined;
    pthread_mutex_unlock(&g.mu);
}
