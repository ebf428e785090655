/* threadpool.c — spin-then-sleep worker pool (see threadpool.h). */
#define _GNU_SOURCE
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/mem.h"

#define SPIN_ITERS 20000 /* ~tens of microseconds before a worker sleeps */
#define YIELD_AFTER 2000 /* spins before the caller yields while waiting */

void nstf_signals_hold(sigset_t *old) {
    sigset_t all;
    sigfillset(&all);
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++) sigdelset(&all, synchronous[i]);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

void nstf_signals_restore(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

int nstf_thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
    /* the new thread inherits the mask in force at pthread_create */
    sigset_t old;
    nstf_signals_hold(&old);
    const int rc = pthread_create(t, NULL, fn, arg);
    nstf_signals_restore(&old);
    return rc;
}

/* A job's parts are claimed, not assigned: part ith of the current job is
 * taken by whichever thread (the caller included) increments `ticket`
 * first, so a thread that is not running (more threads than processors,
 * or a busy machine) holds nobody up unless it has claimed a part. The
 * ticket packs the job's generation (high 32 bits) with the next part (low
 * 32 bits): a claim is a compare-and-swap that fails once the generation
 * moved on, so a late worker never runs a part of a job it did not see
 * start. fn and ctx are read after a successful claim (the job cannot end
 * while one of its parts is unfinished). Oversubscribed pools (more
 * threads than processors) do not spin: their workers sleep at once and
 * the caller yields while it waits. */
struct nstf_pool {
    int n;
    bool oversubscribed;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t ticket; /* generation << 32 | next part */
    atomic_int done;         /* parts of the current job finished */
    atomic_int stop;
    nstf_pool_fn fn;
    void *ctx;
};

typedef struct { nstf_pool *pool; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Run the parts of generation g that are left; false once none is. */
static bool run_parts(nstf_pool *pool, uint32_t g) {
    uint64_t t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
    bool ran = false;
    for (;;) {
        if ((uint32_t)(t >> 32) != g || (int)(uint32_t)t >= pool->n) return ran;
        if (!atomic_compare_exchange_weak_explicit(&pool->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        pool->fn(pool->ctx, (int)(uint32_t)t, pool->n);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
        ran = true;
        t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
    }
}

static void *worker(void *p) {
    worker_arg *wa = p;
    nstf_pool *pool = wa->pool;
    free(wa);
    uint32_t seen = 0;
    const int spin_limit = pool->oversubscribed ? 0 : SPIN_ITERS;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = (uint32_t)(atomic_load_explicit(&pool->ticket, memory_order_acquire) >> 32)) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_relaxed)) {
            if (++spins < spin_limit) {
                cpu_relax();
                if (spins % YIELD_AFTER == 0) sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while ((uint32_t)(atomic_load(&pool->ticket) >> 32) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        run_parts(pool, g);
    }
}

int nstf_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* One topology number of cpu (sysfs), or -1. */
static long cpu_topology(int cpu, const char *what) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

int nstf_cpu_physical_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return nstf_cpu_count();
    /* distinct (package, core) pairs among the processors we may run on:
     * SMT siblings share a core and its execution units */
    long seen[CPU_SETSIZE][2];
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        const long pkg = cpu_topology(c, "physical_package_id"), core = cpu_topology(c, "core_id");
        if (pkg < 0 || core < 0) return nstf_cpu_count(); /* no topology: count processors */
        bool dup = false;
        for (int i = 0; i < n && !dup; i++) dup = seen[i][0] == pkg && seen[i][1] == core;
        if (!dup) {
            seen[n][0] = pkg;
            seen[n][1] = core;
            n++;
        }
    }
    return n > 0 ? n : 1;
}

nstf_status nstf_pool_create(int n_threads, nstf_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "thread count %d is outside 1..1024", n_threads);
    nstf_pool *pool = nstf_calloc(1, sizeof *pool, "thread pool");
    if (!pool) return NSTF_ERR_OOM;
    pool->n = n_threads;
    pool->oversubscribed = n_threads > nstf_cpu_count();
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    if (n_threads > 1) {
        pool->threads = nstf_calloc((size_t)n_threads, sizeof(pthread_t), "thread handles");
        if (!pool->threads) { nstf_pool_free(pool); return NSTF_ERR_OOM; }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) { pool->n = i; nstf_pool_free(pool); return nstf_set_error(NSTF_ERR_OOM, "out of memory starting threads"); }
            wa->pool = pool;
            if (nstf_thread_start(&pool->threads[i], worker, wa) != 0) {
                free(wa);
                pool->n = i;
                nstf_pool_free(pool);
                return nstf_set_error(NSTF_ERR_INTERNAL, "could not start worker thread %d of %d", i, n_threads);
            }
        }
    }
    *out = pool;
    return NSTF_OK;
}

void nstf_pool_free(nstf_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    nstf_free(pool->threads);
    nstf_free(pool);
}

int nstf_pool_size(const nstf_pool *pool) { return pool ? pool->n : 1; }

void nstf_pool_run(nstf_pool *pool, nstf_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) { fn(ctx, 0, 1); return; }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    const uint32_t g = (uint32_t)(atomic_load_explicit(&pool->ticket, memory_order_relaxed) >> 32) + 1;
    pthread_mutex_lock(&pool->mu);
    atomic_store_explicit(&pool->ticket, (uint64_t)g << 32, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    run_parts(pool, g);
    /* Wait for the parts others claimed. A worker that lost its processor
     * would leave us spinning for a whole time slice, so after a short
     * spin (none when oversubscribed) give the processor away. */
    int spins = 0;
    const int spin_limit = pool->oversubscribed ? 0 : YIELD_AFTER;
    while (atomic_load_explicit(&pool->done, memory_order_acquire) < pool->n) {
        if (++spins < spin_limit) cpu_relax();
        else sched_yield();
    }
}
