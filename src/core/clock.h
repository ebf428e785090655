/* clock.h — the monotonic clock every layer reads (timing, ETAs). */
#ifndef NSTF_CORE_CLOCK_H
#define NSTF_CORE_CLOCK_H

#include <stdint.h>

/* Monotonic clock (CLOCK_MONOTONIC) in nanoseconds, and in milliseconds. */
uint64_t nstf_now_ns(void);
double nstf_time_ms(void);

#endif
