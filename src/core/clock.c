/* clock.c — the monotonic clock. */
#include "core/clock.h"

#include <time.h>

uint64_t nstf_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double nstf_time_ms(void) { return (double)nstf_now_ns() * 1e-6; }
