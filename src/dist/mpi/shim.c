/* shim.c — libnstf_mpi: the MPI calls of a launch by mpirun, behind the
 * table of dist/mpi_shim.h (loaded at first use by dist/proc.c).
 *
 * Collectives are the non-blocking ones (MPI_Iallgather, MPI_Ialltoall),
 * tested in a loop until done or the timeout: a peer that stalls or dies
 * is an error here, never a hang. Before each, the rank sends its peers a
 * heartbeat with the collective's number (8 bytes, tag HB_TAG, eager), and
 * drains the ones that came in; on a timeout the ranks whose last
 * heartbeat is below the number are the ones named. The loop spins for
 * 50 us, then yields the core between tests until 2 ms (a CPU rank on
 * the same core as its peer lets it compute), then sleeps 20 us between
 * tests. */
#include <mpi.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/mpi_shim.h"

#define HB_TAG 7301

const nstf_mpi_shim *nstf_mpi_shim_table(void);

static int g_rank, g_size;
static MPI_Comm g_comm = MPI_COMM_NULL;
static int64_t *g_seen;       /* [size] the last heartbeat from each rank */
static int64_t *g_out;        /* [size] the value each pending heartbeat carries */
static MPI_Request *g_hb_req; /* [size] the pending heartbeat to each rank */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void mpi_msg(int rc, const char *what, char *err, size_t cap) {
    char s[MPI_MAX_ERROR_STRING] = "";
    int n = 0;
    MPI_Error_string(rc, s, &n);
    snprintf(err, cap, "%s: %s", what, s);
}

static int shim_init(int *rank, int *size, int *local_rank, int *local_size, char *desc, size_t desc_cap, char *err,
                     size_t err_cap) {
    int inited = 0, prov = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        const int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov);
        if (rc != MPI_SUCCESS) {
            mpi_msg(rc, "MPI_Init_thread", err, err_cap);
            return -1;
        }
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
    if (rc != MPI_SUCCESS) {
        mpi_msg(rc, "MPI_Comm_dup", err, err_cap);
        return -1;
    }
    MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g_comm, &g_rank);
    MPI_Comm_size(g_comm, &g_size);
    MPI_Comm node;
    int lr = 0, ls = 1;
    if (MPI_Comm_split_type(g_comm, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &lr);
        MPI_Comm_size(node, &ls);
        MPI_Comm_free(&node);
    }
    g_seen = calloc((size_t)g_size, sizeof *g_seen);
    g_out = calloc((size_t)g_size, sizeof *g_out);
    g_hb_req = malloc((size_t)g_size * sizeof *g_hb_req);
    if (!g_seen || !g_out || !g_hb_req) {
        snprintf(err, err_cap, "out of memory for %d ranks", g_size);
        return -1;
    }
    for (int r = 0; r < g_size; r++) g_hb_req[r] = MPI_REQUEST_NULL;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int n = 0;
    MPI_Get_library_version(lib, &n);
    lib[strcspn(lib, ",\n")] = 0; /* "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4" */
    snprintf(desc, desc_cap, "%s", lib);
    *rank = g_rank, *size = g_size, *local_rank = lr, *local_size = ls;
    return 0;
}

/* The heartbeats that came in. */
static void drain(void) {
    for (;;) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Iprobe(MPI_ANY_SOURCE, HB_TAG, g_comm, &flag, &s) != MPI_SUCCESS || !flag) return;
        int64_t v = 0;
        if (MPI_Recv(&v, 1, MPI_INT64_T, s.MPI_SOURCE, HB_TAG, g_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        if (v > g_seen[s.MPI_SOURCE]) g_seen[s.MPI_SOURCE] = v;
    }
}

/* Tell every peer this rank has reached collective seq (a peer whose
 * previous heartbeat is still on its way gets none: it learns the newer
 * number with the next one). */
static void beat(int64_t seq) {
    drain();
    g_seen[g_rank] = seq;
    for (int r = 0; r < g_size; r++) {
        if (r == g_rank) continue;
        int done = 1;
        if (g_hb_req[r] != MPI_REQUEST_NULL) MPI_Test(&g_hb_req[r], &done, MPI_STATUS_IGNORE);
        if (!done) continue;
        g_out[r] = seq;
        if (MPI_Isend(&g_out[r], 1, MPI_INT64_T, r, HB_TAG, g_comm, &g_hb_req[r]) != MPI_SUCCESS)
            g_hb_req[r] = MPI_REQUEST_NULL;
    }
}

/* "rank 1 stalled before collective 17 (its last: 16)" for the ranks
 * behind seq, from the heartbeats. */
static void describe_behind(int64_t seq, const char *what, int timeout_ms, char *err, size_t cap) {
    drain();
    size_t k = (size_t)snprintf(err, cap, "%s %lld made no progress for %d ms: ", what, (long long)seq, timeout_ms);
    int behind = 0;
    for (int r = 0; r < g_size && k < cap; r++)
        if (g_seen[r] < seq) {
            k += (size_t)snprintf(err + k, cap - k, "%srank %d stalled before collective %lld (its last: %lld)",
                                  behind ? "; " : "", r, (long long)seq, (long long)g_seen[r]);
            behind++;
        }
    if (!behind && k < cap) snprintf(err + k, cap - k, "every rank had reached it (a rank failed or died inside it)");
}

/* Test req until done or the timeout (then it is left: the caller aborts
 * the launch). */
static int wait_req(MPI_Request *req, int64_t seq, const char *what, int timeout_ms, char *err, size_t cap) {
    const double t0 = now_ms(), deadline = t0 + timeout_ms;
    for (;;) {
        int done = 0;
        const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            mpi_msg(rc, what, err, cap);
            return -1;
        }
        if (done) return 0;
        const double t = now_ms();
        if (t >= deadline) {
            describe_behind(seq, what, timeout_ms, err, cap);
            return 1;
        }
        if (t - t0 >= 1000.0) { /* a long wait (a rank waiting for a chat's next line): 1 ms naps */
            const struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        } else if (t - t0 >= 2.0) {
            const struct timespec ts = {0, 20000L};
            nanosleep(&ts, NULL);
        } else if (t - t0 >= 0.05) {
            sched_yield();
        }
    }
}

static int shim_allgather(int64_t seq, const void *mine, void *all, int bytes, int timeout_ms, char *err,
                          size_t cap) {
    beat(seq);
    const bool in_place = mine == (const char *)all + (size_t)g_rank * (size_t)bytes;
    MPI_Request req;
    const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : mine, bytes, MPI_BYTE, all, bytes, MPI_BYTE, g_comm, &req);
    if (rc != MPI_SUCCESS) {
        mpi_msg(rc, "MPI_Iallgather", err, cap);
        return -1;
    }
    return wait_req(&req, seq, "all-gather", timeout_ms, err, cap);
}

static int shim_alltoall(int64_t seq, const void *send, void *recv, int bytes, int timeout_ms, char *err, size_t cap) {
    beat(seq);
    MPI_Request req;
    const int rc = MPI_Ialltoall(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, g_comm, &req);
    if (rc != MPI_SUCCESS) {
        mpi_msg(rc, "MPI_Ialltoall", err, cap);
        return -1;
    }
    return wait_req(&req, seq, "all-to-all", timeout_ms, err, cap);
}

static void shim_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static void shim_finalize(int timeout_ms) {
    if (g_comm == MPI_COMM_NULL) return;
    MPI_Request req;
    char err[256];
    if (MPI_Ibarrier(g_comm, &req) == MPI_SUCCESS && wait_req(&req, INT64_MAX, "the closing barrier", timeout_ms, err,
                                                              sizeof err) != 0)
        return; /* a peer that never comes: MPI_Finalize would wait for it */
    for (int r = 0; r < g_size; r++)
        if (g_hb_req[r] != MPI_REQUEST_NULL) {
            MPI_Cancel(&g_hb_req[r]);
            MPI_Request_free(&g_hb_req[r]);
        }
    drain();
    MPI_Comm_free(&g_comm);
    MPI_Finalize();
    free(g_seen), free(g_out), free(g_hb_req);
}

const nstf_mpi_shim *nstf_mpi_shim_table(void) {
    static const nstf_mpi_shim t = {NSTF_MPI_SHIM_VERSION, shim_init, shim_allgather, shim_alltoall, shim_abort,
                                    shim_finalize};
    return &t;
}
