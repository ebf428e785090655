/* cmd_quantize.c — `nstf quantize IN OUT TYPE [--allow-requantize] [-t N]`:
 * the CLI over nstf_quantize_file (src/opt/quantize.h), with a progress bar
 * (bytes done, rate, ETA) on stderr when stderr is a terminal. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "opt/quantize.h"

int cmd_quantize(int argc, char **argv);

typedef struct {
    double t0, last;
} bar_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bar(void *user, uint64_t done, uint64_t total) {
    bar_state *b = user;
    double t = now_s();
    if (done < total && t - b->last < 0.1) return; /* at most 10 redraws a second */
    b->last = t;
    double frac = total ? (double)done / (double)total : 1.0, el = t - b->t0;
    double rate = el > 0 ? (double)done / el / 1048576.0 : 0.0;
    double eta = frac > 0 ? el * (1.0 - frac) / frac : 0.0;
    char fill[41];
    int n = (int)(frac * 40);
    for (int i = 0; i < 40; i++) fill[i] = i < n ? '=' : i == n ? '>' : ' ';
    fill[40] = 0;
    fprintf(stderr, "\r[%s] %3.0f%% %7.1f MiB/s ETA %d:%02d ", fill, 100 * frac, rate, (int)eta / 60,
            (int)eta % 60);
    if (done >= total) fprintf(stderr, "\n");
    fflush(stderr);
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0, n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    nstf_quant_params p = {.n_threads = n_threads > 0 ? n_threads : 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: nstf quantize IN.gguf OUT.gguf TYPE [--allow-requantize] [-t N]\n"
                   "  TYPE: %s\n"
                   "  Matrices are converted (llama.cpp's choice of type per tensor: the output\n"
                   "  matrix gets Q6_K, the _M mixes give some attn_v/ffn_down Q6_K); vectors are kept.\n"
                   "  --allow-requantize  accept already-quantized input (dequantized first: the\n"
                   "                      errors compound)\n"
                   "  -t N                threads (default: all cores)\n",
                   nstf_quant_target_list());
            return 0;
        }
        if (!strcmp(a, "--allow-requantize")) {
            p.allow_requantize = true;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(a, v, 1, 1024, &p.n_threads)) return 2;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "nstf quantize: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            fprintf(stderr, "nstf quantize: too many arguments (IN OUT TYPE)\n");
            return 2;
        }
    }
    if (n_pos != 3) {
        fprintf(stderr, "nstf quantize: need IN OUT TYPE (see --help)\n");
        return 2;
    }
    if (!nstf_quant_target_parse(pos[2], &p.target)) {
        fprintf(stderr, "nstf quantize: unknown type '%s' (%s)\n", pos[2], nstf_quant_target_list());
        return 2;
    }
    bar_state b = {now_s(), 0};
    if (isatty(2)) {
        p.progress = bar;
        p.progress_user = &b;
    }
    if (nstf_quantize_file(pos[0], pos[1], &p) != NSTF_OK) {
        if (isatty(2)) fprintf(stderr, "\n");
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        return 1;
    }
    fprintf(stderr, "nstf quantize: %s -> %s (%s) in %.1f s\n", pos[0], pos[1], p.target.name, now_s() - b.t0);
    return 0;
}
