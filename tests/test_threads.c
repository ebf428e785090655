/* test_threads.c — the threads the library starts leave signals to the
 * program's own threads (core/threadpool.h, nstf_thread_start), and the
 * pool runs every part of a job exactly once.
 *
 * The first property keeps a program's SIGINT handler on its own thread:
 * `nstf chat` reads lines with libedit, whose handler restores the
 * terminal of the line being read and crashed when a Ctrl-C landed on a
 * pool worker while the main thread was entering readline.
 *
 * Built as test_threads_gpu (TEST_THREADS_GPU) it also checks the threads
 * the GPU runtime starts when the library first touches a device: every
 * thread of the process but the main one blocks SIGINT. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "core/threadpool.h"
#include "test_util.h"

#if defined(TEST_THREADS_GPU)
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "ops/gpu/gpu_api.h"
#endif

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

#if defined(TEST_THREADS_GPU)
/* Open device 0 as the backend does (the runtime, a context, a stream, an
 * allocation), then read every thread's blocked set from /proc. */
static void check_gpu_threads(void) {
    if (nstf_gpu_device_count() < 1) {
        printf("test_threads_gpu: no GPU, skipped\n");
        exit(TEST_SKIP);
    }
    void *stream = NULL, *buf = NULL;
    CHECK(nstf_gpu_set_device(0) == NSTF_OK, "nstf_gpu_set_device(0): %s", nstf_last_error());
    CHECK(nstf_gpu_stream_create(&stream) == NSTF_OK, "stream: %s", nstf_last_error());
    CHECK(nstf_gpu_malloc(&buf, 1 << 20) == NSTF_OK, "malloc: %s", nstf_last_error());
    DIR *d = opendir("/proc/self/task");
    CHECK(d != NULL, "cannot list /proc/self/task");
    if (!d) return;
    int others = 0, taking = 0;
    const long self = (long)getpid();
    for (struct dirent *e; (e = readdir(d));) {
        const long tid = strtol(e->d_name, NULL, 10);
        if (tid <= 0 || tid == self) continue;
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%ld/status", tid);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread ended */
        unsigned long long blk = 0;
        int seen = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blk) == 1) seen = 1;
        fclose(f);
        if (!seen) continue;
        others++;
        if (!(blk & (1ull << (SIGINT - 1)))) {
            taking++;
            snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
            f = fopen(path, "r");
            if (f && fgets(line, sizeof line, f)) fprintf(stderr, "  takes SIGINT: thread %ld %s", tid, line);
            if (f) fclose(f);
        }
    }
    closedir(d);
    CHECK(taking == 0, "%d of the %d threads the GPU runtime started take SIGINT", taking, others);
    if (taking == 0) printf("GPU runtime threads: %d, all block SIGINT\n", others);
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    CHECK(sigismember(&cur, SIGINT) == 0, "opening the GPU left SIGINT blocked in the caller");
    (void)nstf_gpu_free(buf);
    (void)nstf_gpu_stream_destroy(stream);
}
#endif

int main(void) {
#if defined(TEST_THREADS_GPU)
    check_gpu_threads(); /* first: before the pool's workers exist */
#endif
    check_thread_start();
    check_pool();
    printf("library threads block asynchronous signals; a pool of 4 ran each part once\n");
    return test_finish("test_threads");
}
