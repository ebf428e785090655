/* test_threads.c — the threads the library starts leave signals to the
 * program's own threads (core/threadpool.h, nstf_thread_start), and the
 * pool runs every part of a job exactly once.
 *
 * The first property keeps a program's SIGINT handler on its own thread:
 * `nstf chat` reads lines with libedit, whose handler restores the
 * terminal of the line being read and crashed when a Ctrl-C landed on a
 * pool worker while the main thread was entering readline. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "core/threadpool.h"
#include "test_util.h"

static const int k_async[] = {SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGTSTP, SIGCONT, SIGWINCH, SIGPIPE, SIGUSR1, SIGALRM};
static const int k_sync[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};

/* 1 when the calling thread's mask blocks every asynchronous signal of
 * the list and none of the synchronous ones */
static int mask_is_right(void) {
    sigset_t cur;
    if (pthread_sigmask(SIG_SETMASK, NULL, &cur) != 0) return 0;
    for (size_t i = 0; i < sizeof k_async / sizeof k_async[0]; i++)
        if (sigismember(&cur, k_async[i]) != 1) return 0;
    for (size_t i = 0; i < sizeof k_sync / sizeof k_sync[0]; i++)
        if (sigismember(&cur, k_sync[i]) != 0) return 0;
    return 1;
}

static void *report_mask(void *arg) {
    *(int *)arg = mask_is_right();
    return NULL;
}

static void check_thread_start(void) {
    int right = -1;
    pthread_t t;
    CHECK(nstf_thread_start(&t, report_mask, &right) == 0, "nstf_thread_start failed");
    pthread_join(t, NULL);
    CHECK(right == 1, "a library thread does not block SIGINT, SIGTERM, ... (or blocks SIGSEGV, ...)");
    /* the caller's own mask is left as it was */
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    CHECK(sigismember(&cur, SIGINT) == 0, "nstf_thread_start left SIGINT blocked in the caller");
}

/* A job whose parts wait for each other: with nth parts on a pool of nth
 * threads every part runs on its own thread, the workers included. */
typedef struct {
    atomic_int started, runs[4], wrong_mask;
    pthread_t caller;
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void part(void *ctx, int ith, int nth) {
    job *j = ctx;
    atomic_fetch_add(&j->runs[ith], 1);
    atomic_fetch_add(&j->started, 1);
    const double t0 = now_s();
    while (atomic_load(&j->started) < nth && now_s() - t0 < 10.0) {
    }
    if (!pthread_equal(pthread_self(), j->caller) && !mask_is_right()) atomic_fetch_add(&j->wrong_mask, 1);
}

static void check_pool(void) {
    nstf_pool *pool = NULL;
    CHECK(nstf_pool_create(4, &pool) == NSTF_OK, "nstf_pool_create(4)");
    if (!pool) return;
    for (int round = 0; round < 3; round++) {
        job j = {.caller = pthread_self()};
        nstf_pool_run(pool, part, &j);
        CHECK(atomic_load(&j.started) == 4, "round %d: %d parts started, want 4", round, atomic_load(&j.started));
        for (int i = 0; i < 4; i++) CHECK(atomic_load(&j.runs[i]) == 1, "round %d: part %d ran %d times", round, i,
                                          atomic_load(&j.runs[i]));
        CHECK(atomic_load(&j.wrong_mask) == 0, "round %d: %d pool workers take asynchronous signals", round,
              atomic_load(&j.wrong_mask));
    }
    nstf_pool_free(pool);
}

int main(void) {
    check_thread_start();
    check_pool();
    printf("library threads block asynchronous signals; a pool of 4 ran each part once\n");
    return test_finish("test_threads");
}
