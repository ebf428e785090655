/* cmd_convert.c — `nstf convert MODEL -o FILE.gguf [--type f16|bf16|f32]`:
 * an HF model folder (or a GGUF file) written as a GGUF file that
 * llama.cpp loads (io/convert.h), with a progress bar on a terminal. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "io/convert.h"
#include "io/hf_model.h"

int cmd_convert(int argc, char **argv);

/* A bar on stderr, redrawn at most 10 times a second and at the end. */
static void progress(void *user, uint64_t done, uint64_t total) {
    static double last = -1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = ts.tv_sec + ts.tv_nsec * 1e-9;
    if (done < total && last >= 0 && now - last < 0.1) return;
    last = now;
    FILE *f = user;
    const int width = 30;
    double frac = total ? (double)done / (double)total : 1.0;
    char b[32];
    for (int i = 0; i < width; i++) b[i] = i < (int)(frac * width) ? '#' : '.';
    b[width] = 0;
    fprintf(f, "\rconverting [%s] %5.1f%% %9.1f / %.1f MiB", b, 100.0 * frac, (double)done / (1 << 20),
            (double)total / (1 << 20));
    fflush(f);
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: nstf convert MODEL -o FILE.gguf [--type f16|bf16|f32]\n"
                   "  MODEL: an HF model folder (config.json, model.safetensors or shards,\n"
                   "  tokenizer.json, tokenizer_config.json), or a GGUF file\n"
                   "  writes a GGUF file that llama.cpp loads: Q/K rows permuted as llama.cpp's\n"
                   "  converter does, GGUF tensor names, llama.* and tokenizer.ggml.* metadata;\n"
                   "  --type: the type of the matrices (default: as stored); norms are F32\n");
            return 0;
        }
        if (a[0] != '-') {
            if (in) {
                fprintf(stderr, "nstf convert: one model at a time ('%s' and '%s')\n", in, a);
                return 2;
            }
            in = a;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--type") || !strcmp(a, "--outtype")) type_name = v;
        else {
            fprintf(stderr, "nstf convert: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "nstf convert: a model and -o FILE.gguf are required (see --help)\n");
        return 2;
    }
    nstf_convert_params p = {.out_type = -1};
    nstf_type t;
    if (type_name) {
        if (!nstf_type_from_name(type_name, &t) || (t != NSTF_TYPE_F32 && t != NSTF_TYPE_F16 && t != NSTF_TYPE_BF16)) {
            fprintf(stderr, "nstf convert: --type '%s' is not one of f16, bf16, f32\n", type_name);
            return 2;
        }
        p.out_type = (int)t;
    }
    const bool tty = isatty(fileno(stderr));
    if (tty) {
        p.progress = progress;
        p.user = stderr;
    }
    nstf_gguf *g = NULL;
    nstf_status s = nstf_model_file_open(in, &g);
    if (s == NSTF_OK) s = nstf_convert_to_gguf(g, out, &p);
    if (tty && s == NSTF_OK) fputc('\n', stderr);
    if (s != NSTF_OK) {
        if (tty) fputc('\n', stderr);
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        nstf_gguf_close(g);
        return 1;
    }
    fprintf(stderr, "nstf convert: wrote %s (%llu tensors)\n", out, (unsigned long long)g->n_tensors);
    nstf_gguf_close(g);
    return 0;
}
