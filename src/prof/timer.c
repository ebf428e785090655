/* timer.c — the CPU backend's timer (a monotonic clock). */
#include "prof/timer.h"

static nstf_status cpu_start(nstf_timer *t) {
    t->t0 = nstf_now_ns();
    return NSTF_OK;
}

static nstf_status cpu_stop(nstf_timer *t, uint64_t *elapsed_ns) {
    /* CPU ops are synchronous: when they return, the work is done */
    uint64_t now = nstf_now_ns();
    *elapsed_ns = now > t->t0 ? now - t->t0 : 0;
    return NSTF_OK;
}

nstf_timer nstf_timer_cpu(void) {
    nstf_timer t = {.name = "monotonic clock", .ctx = 0, .start = cpu_start, .stop = cpu_stop, .t0 = 0};
    return t;
}
