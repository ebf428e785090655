/* comm.c — the tensor- and data-parallel communicator (see comm.h): the
 * rank threads, the watchdog, the host-memory collectives (all-reduce,
 * reduce-scatter, all-gather), and the GPU ones through
 * ops/gpu/gpu_api.h's collectives (NCCL / RCCL) or, for the small
 * all-reduces of a decode step where every pair of GPUs has peer access,
 * the one-shot peer all-reduce of ops/gpu/p2p_api.h. */
#include "dist/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/mem.h"
#include "core/threadpool.h"
#include "dist/proc.h"
#include "ops/gpu/gpu_api.h"
#include "ops/gpu/p2p_api.h"


#define WATCH_MS 50 /* how often the watchdog looks at the group's progress */
#define P2P_CAP (64 * 1024) /* floats: the peer all-reduce takes up to 256 KiB (a decode step's residual) */

typedef struct thread_arg {
    struct nstf_comm *c;
    int rank;
} thread_arg;

struct nstf_comm {
    int n, timeout_ms;
    bool gpu;
    int self; /* process mode (a launch by mpirun): this process's rank; -1: every rank here */
    nstf_backend *be[NSTF_COMM_MAX];
    void *ccl[NSTF_COMM_MAX]; /* GPU: one communicator per rank */
    nstf_p2p *p2p;            /* GPU with peer access everywhere: all-reduces up to P2P_CAP floats */
    char transport[96];
    /* rank threads and the job */
    pthread_t th[NSTF_COMM_MAX];
    thread_arg targ[NSTF_COMM_MAX];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t job_cv, done_cv, bar_cv;
    uint64_t job_gen;
    int n_done;
    bool stop, wedged;
    nstf_comm_job fn;
    void *ctx;
    nstf_status st[NSTF_COMM_MAX];
    char msg[NSTF_COMM_MAX][512];
    /* progress and abort (under mu) */
    int64_t calls[NSTF_COMM_MAX]; /* collectives each rank has entered */
    atomic_bool aborted;
    char why[640];
    int fault_rank;
    int64_t fault_at;
    /* the host collectives: every rank's posted buffer, a shared sum, a barrier */
    const void *post[NSTF_COMM_MAX];
    float *sum;
    int64_t sum_cap;
    int bar_in;
    uint64_t bar_gen;
};

int nstf_comm_size(const nstf_comm *c) { return c->n; }
const char *nstf_comm_transport(const nstf_comm *c) { return c->transport; }

void nstf_comm_fault(nstf_comm *c, int rank, int64_t at) {
    pthread_mutex_lock(&c->mu);
    c->fault_rank = rank;
    c->fault_at = at;
    pthread_mutex_unlock(&c->mu);
}

void nstf_comm_abort(nstf_comm *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    const bool first = !atomic_load(&c->aborted);
    if (first) {
        snprintf(c->why, sizeof c->why, "%s", why);
        atomic_store(&c->aborted, true);
    }
    pthread_cond_broadcast(&c->bar_cv);
    pthread_cond_broadcast(&c->done_cv);
    pthread_mutex_unlock(&c->mu);
    /* ncclCommAbort from this thread makes the ranks' queued collectives
     * (and the stream waits behind them) return */
    if (first && c->gpu) {
        nstf_gpu_p2p_abort(c->p2p);
        for (int r = 0; r < c->n; r++)
            if (c->ccl[r]) nstf_gpu_ccl_abort(c->ccl[r]);
    }
}

static nstf_status aborted_error(nstf_comm *c, int rank) {
    return nstf_set_error(c->gpu ? NSTF_ERR_GPU : NSTF_ERR_RANGE, "rank %d: the communicator was aborted (%s)", rank,
                          c->why);
}

/* ---- rank threads ------------------------------------------------------------------ */

static void *rank_main(void *p) {
    const thread_arg *a = p;
    nstf_comm *c = a->c;
    const int rank = a->rank;
    uint64_t seen = 0;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->job_gen == seen) pthread_cond_wait(&c->job_cv, &c->mu);
        if (c->stop) break;
        seen = c->job_gen;
        const nstf_comm_job fn = c->fn;
        void *ctx = c->ctx;
        pthread_mutex_unlock(&c->mu);
        nstf_clear_error();
        nstf_status st = fn(ctx, rank);
        if (st == NSTF_OK && c->p2p) st = nstf_gpu_p2p_check(c->p2p, rank); /* what its stream met so far */
        if (st == NSTF_OK && atomic_load(&c->aborted)) st = aborted_error(c, rank);
        char why[600] = "";
        pthread_mutex_lock(&c->mu);
        c->st[rank] = st;
        if (st != NSTF_OK) {
            snprintf(c->msg[rank], sizeof c->msg[rank], "%s", nstf_last_error());
            snprintf(why, sizeof why, "rank %d (%.120s) failed: %.400s", rank, c->be[rank]->device, c->msg[rank]);
        }
        c->n_done++;
        pthread_cond_broadcast(&c->done_cv);
        if (st != NSTF_OK && !atomic_load(&c->aborted)) { /* the others must not wait for this rank */
            pthread_mutex_unlock(&c->mu);
            nstf_comm_abort(c, why);
            pthread_mutex_lock(&c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static struct timespec deadline_in(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* The ranks that are behind: those with the fewest collectives entered
 * (mu held). */
static void describe_stall(nstf_comm *c, char *out, size_t cap) {
    int64_t lo = c->calls[0], hi = c->calls[0];
    for (int r = 1; r < c->n; r++) {
        if (c->calls[r] < lo) lo = c->calls[r];
        if (c->calls[r] > hi) hi = c->calls[r];
    }
    size_t k = (size_t)snprintf(out, cap, "no progress for %d ms: ", c->timeout_ms);
    for (int r = 0; r < c->n && k < cap; r++) {
        if (lo < hi && c->calls[r] == lo)
            k += (size_t)snprintf(out + k, cap - k, "rank %d (%s) stalled before collective %lld; ", r,
                                  c->be[r]->device, (long long)lo + 1);
        else if (lo == hi && c->st[r] == NSTF_ERR_INTERNAL) /* (not finished) */
            k += (size_t)snprintf(out + k, cap - k, "rank %d (%s) did not finish; ", r, c->be[r]->device);
    }
    if (k < cap)
        snprintf(out + k, cap - k, lo < hi ? "the others reached collective %lld" : "every rank had entered %lld collectives",
                 (long long)hi);
}

/* Process mode: this process's rank runs here; its collectives time out
 * on their own (the launch's, NCCL's) and name the ranks behind. */
static nstf_status run_self(nstf_comm *c, nstf_comm_job fn, void *ctx) {
    nstf_clear_error();
    const nstf_status st = fn(ctx, c->self);
    if (st == NSTF_OK) return NSTF_OK;
    char msg[600];
    snprintf(msg, sizeof msg, "%s", nstf_last_error());
    if (!atomic_load(&c->aborted)) nstf_comm_abort(c, msg);
    return nstf_set_error(st, "rank %d (%s) of the parallel group: %s", c->self, c->be[c->self]->device, msg);
}

nstf_status nstf_comm_run(nstf_comm *c, nstf_comm_job fn, void *ctx) {
    if (c->wedged || atomic_load(&c->aborted))
        return nstf_set_error(NSTF_ERR_GPU, "tensor-parallel group: the communicator was aborted earlier (%s)", c->why);
    if (c->self >= 0) return run_self(c, fn, ctx);
    pthread_mutex_lock(&c->mu);
    c->fn = fn;
    c->ctx = ctx;
    c->n_done = 0;
    for (int r = 0; r < c->n; r++) c->st[r] = NSTF_ERR_INTERNAL; /* not finished */
    c->job_gen++;
    pthread_cond_broadcast(&c->job_cv);
    /* the watchdog */
    int64_t last = -1;
    double since = nstf_time_ms();
    while (c->n_done < c->n) {
        const struct timespec ts = deadline_in(WATCH_MS);
        pthread_cond_timedwait(&c->done_cv, &c->mu, &ts);
        if (atomic_load(&c->aborted)) {
            /* give the ranks the timeout to come back from their aborted work */
            const double t0 = nstf_time_ms();
            while (c->n_done < c->n && nstf_time_ms() - t0 < c->timeout_ms) {
                const struct timespec t2 = deadline_in(WATCH_MS);
                pthread_cond_timedwait(&c->done_cv, &c->mu, &t2);
            }
            if (c->n_done < c->n) c->wedged = true;
            break;
        }
        int64_t total = c->n_done;
        for (int r = 0; r < c->n; r++) total += c->calls[r];
        const double now = nstf_time_ms();
        if (total != last) {
            last = total;
            since = now;
        } else if (now - since > c->timeout_ms) {
            char why[600];
            describe_stall(c, why, sizeof why);
            pthread_mutex_unlock(&c->mu);
            nstf_comm_abort(c, why);
            pthread_mutex_lock(&c->mu);
        }
    }
    nstf_status st = NSTF_OK;
    int bad = -1;
    /* the first failure that is not a consequence of the abort, else the abort */
    for (int r = 0; r < c->n && bad < 0; r++)
        if (c->st[r] != NSTF_OK && !strstr(c->msg[r], "was aborted")) bad = r;
    if (bad >= 0) {
        st = nstf_set_error(c->st[bad], "rank %d (%s) of the parallel group: %s", bad, c->be[bad]->device, c->msg[bad]);
    } else if (atomic_load(&c->aborted)) {
        st = nstf_set_error(NSTF_ERR_GPU, "the parallel group (tensor or data) aborted: %s%s", c->why,
                            c->wedged ? " (a rank did not return after the abort)" : "");
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- the host collectives, the all-reduce ---------------------------------------------------- */

/* The host barrier; false when the communicator was aborted (mu held).
 * The last rank in grows the shared sum to `grow` values: every rank has
 * then finished reading it. */
static bool barrier(nstf_comm *c, int64_t grow) {
    const uint64_t gen = c->bar_gen;
    if (++c->bar_in == c->n) {
        c->bar_in = 0;
        if (grow > c->sum_cap) {
            nstf_free(c->sum);
            c->sum = nstf_alloc((size_t)grow * sizeof(float), "all-reduce buffer");
            c->sum_cap = c->sum ? grow : 0;
        }
        c->bar_gen++;
        pthread_cond_broadcast(&c->bar_cv);
        return !atomic_load(&c->aborted);
    }
    while (c->bar_gen == gen && !atomic_load(&c->aborted)) pthread_cond_wait(&c->bar_cv, &c->mu);
    return !atomic_load(&c->aborted);
}

/* Post this rank's buffer and wait for every rank's (grow: as barrier). */
static nstf_status host_post(nstf_comm *c, int rank, const void *p, int64_t grow) {
    pthread_mutex_lock(&c->mu);
    c->post[rank] = p;
    const bool ok = barrier(c, grow);
    pthread_mutex_unlock(&c->mu);
    return ok ? NSTF_OK : aborted_error(c, rank);
}

/* The closing barrier: no rank changes its buffer while another reads it. */
static nstf_status host_wait(nstf_comm *c, int rank) {
    pthread_mutex_lock(&c->mu);
    const bool ok = barrier(c, 0);
    pthread_mutex_unlock(&c->mu);
    return ok ? NSTF_OK : aborted_error(c, rank);
}

/* Element i of slot sums: rank 0's value plus the others in rank order,
 * one expression for the all-reduce and the reduce-scatter (their bits
 * must agree). */
static float rank_sum(nstf_comm *c, int64_t i) {
    float s = ((const float *)c->post[0])[i];
    for (int r = 1; r < c->n; r++) s += ((const float *)c->post[r])[i];
    return s;
}

/* Every rank's buffer is posted; rank r sums its slice over the ranks in
 * rank order into the shared sum; then every rank copies the whole sum. */
static nstf_status host_allreduce(nstf_comm *c, int rank, float *buf, int64_t n) {
    NSTF_TRY(host_post(c, rank, buf, n));
    if (c->sum_cap < n) return nstf_set_error(NSTF_ERR_OOM, "rank %d: out of memory for the all-reduce", rank);
    const int64_t lo = n * rank / c->n, hi = n * (rank + 1) / c->n;
    for (int64_t i = lo; i < hi; i++) c->sum[i] = rank_sum(c, i);
    NSTF_TRY(host_wait(c, rank));
    memcpy(buf, c->sum, (size_t)n * sizeof(float));
    return NSTF_OK;
}

/* Rank r sums its own slot over the ranks straight into its buffer: the
 * other ranks read only their own slots of it. */
static nstf_status host_reduce_scatter(nstf_comm *c, int rank, float *buf, int64_t shard) {
    NSTF_TRY(host_post(c, rank, buf, 0));
    for (int64_t i = shard * rank; i < shard * (rank + 1); i++) buf[i] = rank_sum(c, i);
    return host_wait(c, rank);
}

/* Rank r copies every other rank's own slot into its buffer. */
static nstf_status host_allgather(nstf_comm *c, int rank, void *buf, size_t slot) {
    NSTF_TRY(host_post(c, rank, buf, 0));
    for (int r = 0; r < c->n; r++)
        if (r != rank) memcpy((char *)buf + slot * (size_t)r, (const char *)c->post[r] + slot * (size_t)r, slot);
    return host_wait(c, rank);
}

/* ---- the host collectives of process mode (dist/proc.h) ----
 * The sums are the threads' (rank 0's value, then the others added in
 * rank order), so a launch by mpirun gives the bits of one process
 * driving the same ranks. They move PART elements per rank a call. */

#define PART (1 << 20)

/* out[i] = rank 0's rcv value, then the other ranks' added in rank order
 * (rcv: R blocks of k, as the all-to-all delivers them): rank_sum's
 * order, one expression for the all-reduce and the reduce-scatter. */
static void sum_received(const float *rcv, int64_t R, int64_t k, float *out) {
    for (int64_t i = 0; i < k; i++) {
        float v = rcv[i];
        for (int64_t r = 1; r < R; r++) v += rcv[r * k + i];
        out[i] = v;
    }
}

/* buf [n] summed over the ranks in rank order: piece by piece of up to
 * n_ranks x PART elements, each piece cut into n_ranks parts of k (the
 * last part padded with zeros), rank q sums part q over the ranks
 * (all-to-all), then the parts are gathered. */
static nstf_status proc_allreduce(nstf_comm *c, float *buf, int64_t n) {
    const int64_t R = c->n, piece = n < R * PART ? n : R * PART, kmax = (piece + R - 1) / R;
    float *snd = nstf_alloc(2 * (size_t)(R * kmax) * sizeof(float), "all-reduce buffers"), *rcv = snd + R * kmax;
    if (!snd) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    for (int64_t o = 0; o < n && st == NSTF_OK; o += piece) {
        const int64_t len = n - o < piece ? n - o : piece, k = (len + R - 1) / R;
        memcpy(snd, buf + o, (size_t)len * sizeof(float));
        memset(snd + len, 0, (size_t)(R * k - len) * sizeof(float));
        st = nstf_proc_alltoall(snd, rcv, (size_t)k * sizeof(float), c->timeout_ms);
        float *mine = snd + c->self * k; /* (its send was taken) */
        if (st == NSTF_OK) sum_received(rcv, R, k, mine);
        if (st == NSTF_OK) st = nstf_proc_allgather(mine, snd, (size_t)k * sizeof(float), c->timeout_ms);
        if (st == NSTF_OK) memcpy(buf + o, snd, (size_t)len * sizeof(float));
    }
    nstf_free(snd);
    return st;
}

/* This rank's slot of buf [n x shard] summed over the ranks, PART
 * elements of the slot at a time. */
static nstf_status proc_reduce_scatter(nstf_comm *c, float *buf, int64_t shard) {
    const size_t R = (size_t)c->n, kmax = (size_t)(shard < PART ? shard : PART);
    float *snd = nstf_alloc(2 * R * (kmax ? kmax : 1) * sizeof(float), "reduce-scatter buffers"), *rcv = snd + R * kmax;
    if (!snd) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    for (int64_t o = 0; o < shard && st == NSTF_OK; o += PART) {
        const size_t k = (size_t)(shard - o < PART ? shard - o : PART);
        for (size_t q = 0; q < R; q++) memcpy(snd + q * k, buf + (int64_t)q * shard + o, k * sizeof(float));
        st = nstf_proc_alltoall(snd, rcv, k * sizeof(float), c->timeout_ms);
        if (st == NSTF_OK) sum_received(rcv, (int64_t)R, (int64_t)k, buf + (int64_t)c->self * shard + o);
    }
    nstf_free(snd);
    return st;
}

/* A collective's entry: the watchdog's count, a test's stalled rank, an
 * earlier abort. */
static nstf_status enter(nstf_comm *c, int rank, const char *what, int64_t n) {
    if (rank < 0 || rank >= c->n || n < 0 || (c->self >= 0 && rank != c->self))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s of %lld values on rank %d of %d%s", what, (long long)n, rank,
                              c->n, c->self >= 0 && rank != c->self ? " (another process's)" : "");
    pthread_mutex_lock(&c->mu);
    const bool fault = rank == c->fault_rank && c->calls[rank] == c->fault_at;
    if (!fault) c->calls[rank]++;
    pthread_mutex_unlock(&c->mu);
    if (fault) { /* a test's stalled rank: it never enters, until the abort */
        while (!atomic_load(&c->aborted)) {
            const struct timespec ts = {0, 5000000L};
            nanosleep(&ts, NULL);
        }
        return aborted_error(c, rank);
    }
    if (atomic_load(&c->aborted)) return aborted_error(c, rank);
    return NSTF_OK;
}

/* The stream a GPU rank's collectives are queued on. */
static nstf_status rank_stream(nstf_comm *c, int rank, void **stream) {
    int dev = 0;
    return nstf_backend_gpu_stream(c->be[rank], &dev, stream);
}

/* A GPU collective's status: an abort's error when the abort caused it. */
static nstf_status gpu_done(nstf_comm *c, int rank, nstf_status st) {
    if (st != NSTF_OK && atomic_load(&c->aborted)) return aborted_error(c, rank);
    return st;
}

bool nstf_comm_capturable(const nstf_comm *c, int64_t n) {
    /* a planted fault (nstf_comm_fault) counts the host's calls: not in a graph */
    return c->gpu && c->p2p && c->fault_rank < 0 && n >= 0 && n <= nstf_gpu_p2p_cap(c->p2p);
}

nstf_status nstf_comm_allreduce_add(nstf_comm *c, int rank, float *buf, float *dst, int64_t n, bool *added) {
    *added = false;
    NSTF_TRY(enter(c, rank, "all-reduce", n));
    if (c->n == 1) return NSTF_OK;
    if (!c->gpu) return c->self >= 0 ? proc_allreduce(c, buf, n) : host_allreduce(c, rank, buf, n);
    void *stream = NULL;
    NSTF_TRY(rank_stream(c, rank, &stream));
    nstf_status st;
    if (c->p2p && n <= nstf_gpu_p2p_cap(c->p2p)) {
        st = nstf_gpu_p2p_allreduce_f32(c->p2p, rank, buf, dst, n, stream, c->timeout_ms);
        *added = dst != NULL && st == NSTF_OK;
    } else {
        st = nstf_gpu_ccl_allreduce_f32(c->ccl[rank], buf, n, stream, c->timeout_ms);
    }
    return gpu_done(c, rank, st);
}

nstf_status nstf_comm_allreduce(nstf_comm *c, int rank, float *buf, int64_t n) {
    bool added;
    return nstf_comm_allreduce_add(c, rank, buf, NULL, n, &added);
}

/* ---- the sharded collectives ------------------------------------------------------------------ */

nstf_status nstf_comm_shard_len(int64_t n, int n_ranks, int64_t align, int64_t *shard) {
    *shard = 0;
    if (n < 0 || n_ranks < 1 || align < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "shards of %lld elements over %d ranks, aligned to %lld",
                              (long long)n, n_ranks, (long long)align);
    const uint64_t per = (uint64_t)(n / n_ranks) + (n % n_ranks != 0);
    uint64_t up = 0, total = 0;
    if (!nstf_add_ok(per, (uint64_t)align - 1, &up) || !nstf_mul_ok(up / (uint64_t)align * (uint64_t)align,
                                                                     (uint64_t)n_ranks, &total) ||
        total > (uint64_t)INT64_MAX)
        return nstf_set_error(NSTF_ERR_RANGE, "%lld elements over %d ranks overflow the padded size", (long long)n,
                              n_ranks);
    *shard = (int64_t)(up / (uint64_t)align * (uint64_t)align);
    return NSTF_OK;
}

/* The whole buffer of a sharded collective, size x shard elements, in
 * int64 (a caller's shard may come from anywhere). */
static nstf_status check_slots(nstf_comm *c, const char *what, int64_t shard, int elem_bytes) {
    const bool size_ok = elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8;
    if (shard < 0 || !size_ok || shard > INT64_MAX / c->n / elem_bytes)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s of %d slots of %lld elements of %d bytes", what, c->n,
                              (long long)shard, elem_bytes);
    return NSTF_OK;
}

nstf_status nstf_comm_reduce_scatter(nstf_comm *c, int rank, float *buf, int64_t shard) {
    NSTF_TRY(check_slots(c, "reduce-scatter", shard, 4));
    NSTF_TRY(enter(c, rank, "reduce-scatter", shard));
    if (c->n == 1) return NSTF_OK;
    if (!c->gpu) return c->self >= 0 ? proc_reduce_scatter(c, buf, shard) : host_reduce_scatter(c, rank, buf, shard);
    void *stream = NULL;
    NSTF_TRY(rank_stream(c, rank, &stream));
    return gpu_done(c, rank, nstf_gpu_ccl_reduce_scatter_f32(c->ccl[rank], rank, buf, shard, stream, c->timeout_ms));
}

nstf_status nstf_comm_allgather(nstf_comm *c, int rank, void *buf, int64_t shard, int elem_bytes) {
    NSTF_TRY(check_slots(c, "all-gather", shard, elem_bytes));
    NSTF_TRY(enter(c, rank, "all-gather", shard));
    const int64_t slot = shard * elem_bytes;
    if (c->n == 1) return NSTF_OK;
    if (!c->gpu && c->self >= 0)
        return nstf_proc_allgather((char *)buf + (size_t)slot * (size_t)rank, buf, (size_t)slot, c->timeout_ms);
    if (!c->gpu) return host_allgather(c, rank, buf, (size_t)slot);
    void *stream = NULL;
    NSTF_TRY(rank_stream(c, rank, &stream));
    return gpu_done(c, rank, nstf_gpu_ccl_allgather(c->ccl[rank], rank, buf, slot, stream, c->timeout_ms));
}

nstf_status nstf_comm_host_allgather(nstf_comm *c, int rank, const void *mine, void *all, size_t bytes) {
    if (bytes > (size_t)INT64_MAX / (size_t)c->n)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "host all-gather of %zu bytes per rank", bytes);
    NSTF_TRY(enter(c, rank, "host all-gather", (int64_t)bytes));
    if (c->self >= 0) return nstf_proc_allgather(mine, all, bytes, c->timeout_ms);
    NSTF_TRY(host_post(c, rank, mine, 0));
    for (int r = 0; r < c->n; r++) { /* mine may be this rank's own place in all */
        char *to = (char *)all + bytes * (size_t)r;
        if (to != c->post[r]) memcpy(to, c->post[r], bytes);
    }
    return host_wait(c, rank);
}

/* ---- create / free --------------------------------------------------------------------------- */

void nstf_comm_free(nstf_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->job_cv);
    pthread_mutex_unlock(&c->mu);
    for (int r = 0; r < c->n_threads; r++) {
        if (c->wedged) pthread_detach(c->th[r]); /* a rank that never came back: leave it */
        else pthread_join(c->th[r], NULL);
    }
    if (c->wedged) return; /* its threads may still touch the communicator */
    for (int r = 0; r < c->n; r++) /* (ncclCommAbort freed an aborted one) */
        if (c->ccl[r] && !atomic_load(&c->aborted)) nstf_gpu_ccl_destroy(c->ccl[r]);
    nstf_gpu_p2p_free(c->p2p);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->job_cv);
    pthread_cond_destroy(&c->done_cv);
    pthread_cond_destroy(&c->bar_cv);
    nstf_free(c->sum);
    nstf_free(c);
}

/* A communicator of n ranks, self its process's (-1: all of them). */
static nstf_comm *comm_new(int n, int self, bool gpu, int timeout_ms) {
    nstf_comm *c = nstf_calloc(1, sizeof *c, "communicator");
    if (!c) return NULL;
    c->n = n;
    c->self = self;
    c->gpu = gpu;
    c->timeout_ms = timeout_ms ? timeout_ms : NSTF_COMM_TIMEOUT_MS;
    c->fault_rank = -1;
    c->fault_at = -1;
    atomic_init(&c->aborted, false);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->job_cv, NULL);
    pthread_cond_init(&c->done_cv, NULL);
    pthread_cond_init(&c->bar_cv, NULL);
    return c;
}

nstf_status nstf_comm_create(nstf_backend *const *be, int n, int timeout_ms, nstf_comm **out) {
    *out = NULL;
    if (n < 1 || n > NSTF_COMM_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor-parallel group of %d ranks (1..%d)", n, NSTF_COMM_MAX);
    if (timeout_ms < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "communicator timeout %d ms", timeout_ms);
    const bool host = be[0]->host_memory;
    for (int r = 1; r < n; r++)
        if (be[r]->host_memory != host)
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "tensor-parallel ranks must all be CPU or all GPU backends");
    nstf_comm *c = comm_new(n, -1, !host, timeout_ms);
    if (!c) return NSTF_ERR_OOM;
    for (int r = 0; r < n; r++) c->be[r] = be[r];
    nstf_status st = NSTF_OK;
    snprintf(c->transport, sizeof c->transport, "host");
    if (c->gpu && n > 1) {
        int devs[NSTF_COMM_MAX];
        for (int r = 0; r < n && st == NSTF_OK; r++) {
            void *stream;
            st = nstf_backend_gpu_stream(be[r], &devs[r], &stream);
        }
        if (st == NSTF_OK) st = nstf_gpu_ccl_init(devs, n, c->ccl, c->timeout_ms, c->transport, sizeof c->transport);
        /* the peer all-reduce where every pair has peer access (else NCCL alone) */
        if (st == NSTF_OK && nstf_gpu_p2p_create(devs, n, P2P_CAP, &c->p2p) == NSTF_OK) {
            const size_t l = strlen(c->transport);
            snprintf(c->transport + l, sizeof c->transport - l, ", peer one-shot up to %d KiB",
                     (int)(P2P_CAP * sizeof(float) / 1024));
        }
        nstf_clear_error();
    } else if (c->gpu) {
        snprintf(c->transport, sizeof c->transport, "none (one rank)");
    }
    for (int r = 0; r < n && st == NSTF_OK; r++) {
        c->targ[r] = (thread_arg){c, r};
        if (nstf_thread_start(&c->th[r], rank_main, &c->targ[r]) != 0)
            st = nstf_set_error(NSTF_ERR_OOM, "cannot start the thread of tensor-parallel rank %d", r);
        else c->n_threads++;
    }
    if (st != NSTF_OK) {
        nstf_comm_free(c);
        return st;
    }
    *out = c;
    return NSTF_OK;
}

nstf_status nstf_comm_create_proc(nstf_backend *be, int timeout_ms, nstf_comm **out) {
    *out = NULL;
    if (!nstf_proc_active())
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "a communicator of processes outside an mpirun launch");
    const int n = nstf_proc_size(), self = nstf_proc_rank();
    if (n > NSTF_COMM_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "mpirun launched %d processes; a parallel group takes 1..%d", n,
                              NSTF_COMM_MAX);
    if (timeout_ms < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "communicator timeout %d ms", timeout_ms);
    nstf_comm *c = comm_new(n, self, !be->host_memory, timeout_ms);
    if (!c) return NSTF_ERR_OOM;
    c->be[self] = be;
    snprintf(c->transport, sizeof c->transport, "%s, one process per rank", nstf_proc_transport());
    nstf_status st = NSTF_OK;
    if (c->gpu) { /* NCCL: rank 0's id to every rank through the launch */
        /* byte 0: whether the rank got that far (every rank takes part in
         * the exchange, so that a failure is everyone's error, not a wait) */
        unsigned char id[1 + NSTF_CCL_ID_BYTES] = {0}, *all = nstf_alloc((size_t)n * sizeof id, "NCCL ids");
        int dev = 0;
        void *stream;
        st = all ? nstf_backend_gpu_stream(be, &dev, &stream) : NSTF_ERR_OOM;
        if (st == NSTF_OK && self == 0) st = nstf_gpu_ccl_unique_id(id + 1);
        id[0] = st == NSTF_OK;
        char why[600] = "";
        if (st != NSTF_OK) snprintf(why, sizeof why, "%s", nstf_last_error());
        if (all && nstf_proc_allgather(id, all, sizeof id, c->timeout_ms) != NSTF_OK && st == NSTF_OK)
            st = NSTF_ERR_RANGE; /* (its error is set) */
        for (int r = 0; r < n && st == NSTF_OK; r++)
            if (!all[(size_t)r * sizeof id])
                st = nstf_set_error(NSTF_ERR_GPU, "rank %d of the launch could not take part in making the NCCL "
                                    "communicators (its error is on its own output)", r);
        if (why[0]) st = nstf_set_error(st, "%s", why);
        char desc[64] = "";
        if (st == NSTF_OK)
            st = nstf_gpu_ccl_init_rank(dev, self, n, all + 1, &c->ccl[self], c->timeout_ms, desc, sizeof desc);
        if (st == NSTF_OK)
            snprintf(c->transport, sizeof c->transport, "%s, one process per rank (%s)", desc, nstf_proc_transport());
        nstf_free(all);
    }
    if (st != NSTF_OK) {
        nstf_comm_free(c);
        return st;
    }
    *out = c;
    return NSTF_OK;
}
