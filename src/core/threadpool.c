/* threadpool.c — spin-then-sleep worker pool (see threadpool.h). */
#define _GNU_SOURCE
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/mem.h"

#define SPIN_ITERS 20000 /* ~tens of microseconds before a worker sleeps */
#define YIELD_AFTER 2000 /* spins before the caller yields while waiting */

struct nstf_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;     /* bumped once per run */
    atomic_int pending;  /* workers still running the current job */
    atomic_int stop;
    nstf_pool_fn fn;
    void *ctx;
};

typedef struct { nstf_pool *pool; int ith; } worker_arg;

static void *worker(void *p) {
    worker_arg *wa = p;
    nstf_pool *pool = wa->pool;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_relaxed)) {
            if (++spins < SPIN_ITERS) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                if (spins % YIELD_AFTER == 0) sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->ctx, ith, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

int nstf_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

nstf_status nstf_pool_create(int n_threads, nstf_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "thread count %d is outside 1..1024", n_threads);
    nstf_pool *pool = nstf_calloc(1, sizeof *pool, "thread pool");
    if (!pool) return NSTF_ERR_OOM;
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    if (n_threads > 1) {
        pool->threads = nstf_calloc((size_t)n_threads, sizeof(pthread_t), "thread handles");
        if (!pool->threads) { nstf_pool_free(pool); return NSTF_ERR_OOM; }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) { pool->n = i; nstf_pool_free(pool); return nstf_set_error(NSTF_ERR_OOM, "out of memory starting threads"); }
            wa->pool = pool;
            wa->ith = i;
            if (pthread_create(&pool->threads[i], NULL, worker, wa) != 0) {
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
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    fn(ctx, 0, pool->n);
    /* Wait for the workers. A worker that lost its core (more threads than
     * free cores) would leave us spinning for a whole time slice, so after
     * a short spin give the core away. */
    int spins = 0;
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) {
        if (++spins < YIELD_AFTER) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}
