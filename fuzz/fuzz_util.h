/* fuzz_util.h — FUZZ_FAIL(fmt, ...) for the libFuzzer targets: a failed
 * invariant prints one line to the original stderr, then traps, so the
 * input is saved as a crash file with the reason beside it in the log.
 * The run script passes -close_fd_mask=2 (the code under test may print);
 * libFuzzer closes fd 2 after start-up, so a copy of it is taken first, in
 * a constructor. */
#ifndef NSTF_FUZZ_UTIL_H
#define NSTF_FUZZ_UTIL_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int g_fuzz_err_fd = 2;

__attribute__((constructor)) static void fuzz_keep_stderr(void) {
    int fd = dup(2);
    if (fd >= 0) g_fuzz_err_fd = fd;
}

#define FUZZ_FAIL(...)                                                                              \
    do {                                                                                            \
        char fuzz_msg_[1024];                                                                       \
        int fuzz_n_ = snprintf(fuzz_msg_, sizeof fuzz_msg_, "%s: invariant failed: ", __FILE__);     \
        if (fuzz_n_ > 0 && (size_t)fuzz_n_ < sizeof fuzz_msg_ - 1)                                  \
            snprintf(fuzz_msg_ + fuzz_n_, sizeof fuzz_msg_ - 1 - (size_t)fuzz_n_, __VA_ARGS__);     \
        size_t fuzz_len_ = strlen(fuzz_msg_);                                                       \
        fuzz_msg_[fuzz_len_++] = '\n';                                                              \
        if (write(g_fuzz_err_fd, fuzz_msg_, fuzz_len_) < 0) fuzz_len_ = 0;                          \
        __builtin_trap();                                                                           \
    } while (0)

#endif
