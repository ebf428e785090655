/* threadpool.h — a fixed pool of worker threads for data-parallel ops.
 *
 * nstf_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once for every
 * ith in [0, nth), on whichever threads of the pool (the caller's
 * included) claim each part first, and returns when all have finished:
 * fn must not assume which thread runs a part, nor that parts run at the
 * same time. Workers spin briefly on an atomic generation counter
 * before sleeping on a condition variable, because a decode step issues a
 * few hundred short parallel regions and a futex wake per region would
 * cost more than the work. A pool of 1 runs fn inline. */
#ifndef NSTF_CORE_THREADPOOL_H
#define NSTF_CORE_THREADPOOL_H

#include <pthread.h>
#include <signal.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h" /* inside: status.h has no extern "C" of its own */

typedef struct nstf_pool nstf_pool;
typedef void (*nstf_pool_fn)(void *ctx, int ith, int nth);

/* pthread_create for every thread the library starts: the new thread
 * blocks the asynchronous signals (SIGINT, SIGTERM, SIGWINCH, ...), so they
 * reach the threads of the program that called the library. A handler
 * that assumes the thread it interrupts (libedit's, which restores the
 * terminal of the thread reading a line) then never runs on a worker.
 * 0 or an errno value, as pthread_create. */
int nstf_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* The same block for threads that other libraries start on the library's
 * calls (the GPU runtime's and NCCL's, which inherit the mask of the
 * thread that first calls them): nstf_signals_hold blocks the
 * asynchronous signals in the calling thread and saves its mask in *old,
 * nstf_signals_restore puts it back. */
void nstf_signals_hold(sigset_t *old);
void nstf_signals_restore(const sigset_t *old);

/* n_threads >= 1. */
nstf_status nstf_pool_create(int n_threads, nstf_pool **out);
void nstf_pool_free(nstf_pool *pool);
int nstf_pool_size(const nstf_pool *pool);
void nstf_pool_run(nstf_pool *pool, nstf_pool_fn fn, void *ctx);

/* Processors this process may run on (its affinity mask; >= 1). */
int nstf_cpu_count(void);
/* Physical cores among them (SMT siblings counted once; the processor
 * count where sysfs has no topology). The default thread count. */
int nstf_cpu_physical_count(void);

/* Split [0, n) into nth near-equal chunks aligned to `align`; chunk ith is
 * [*lo, *hi). */
static inline void nstf_split_range(int64_t n, int64_t align, int ith, int nth, int64_t *lo,
                                    int64_t *hi) {
    int64_t units = (n + align - 1) / align;
    int64_t per = units / nth, rem = units % nth;
    int64_t u0 = ith * per + (ith < rem ? ith : rem);
    int64_t u1 = u0 + per + (ith < rem ? 1 : 0);
    *lo = u0 * align < n ? u0 * align : n;
    *hi = u1 * align < n ? u1 * align : n;
}

#ifdef __cplusplus
}
/* C++ callers: the block for the lifetime of a scope. */
struct nstf_signals_held {
    sigset_t old;
    nstf_signals_held() { nstf_signals_hold(&old); }
    ~nstf_signals_held() { nstf_signals_restore(&old); }
    nstf_signals_held(const nstf_signals_held &) = delete;
    nstf_signals_held &operator=(const nstf_signals_held &) = delete;
};
#endif

#endif
