/* cmd_imatrix.c — `nstf imatrix -m MODEL -f TEXT -o FILE`: the importance
 * matrix of a model over a calibration text (src/opt/imatrix.h), written
 * in llama.cpp's GGUF imatrix format, for `nstf quantize --imatrix`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "core/clock.h"
#include "core/mem.h"
#include "nstf_tools.h"
#include "opt/imatrix.h"

int cmd_imatrix(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf imatrix -m MODEL -f TEXT -o FILE [options]\n"
            "\n"
            "The importance matrix: per layer matrix (and the output matrix) the sum over the text's tokens of\n"
            "the squared activation feeding each column, and the token count (docs/OPTIMIZE.md). Written in\n"
            "llama.cpp's GGUF imatrix format (NAME.in_sum2, NAME.counts), which `nstf quantize --imatrix` and\n"
            "llama-quantize --imatrix read.\n"
            "\n"
            "  -m, --model FILE      the model (best the F32/F16/BF16 file that will be quantized)\n"
            "  -f, --file FILE       the calibration text\n"
            "  -o, --output FILE     the imatrix GGUF\n"
            "  -c, --chunk N         tokens per chunk, each evaluated from position 0 (default 512)\n"
            "      --chunks N        at most N chunks (default: the whole text)\n"
            "  -t, --threads N       CPU threads (default: the physical cores)\n");
}

static void progress(void *user, int done, int total) { cli_progress_cb(user, (uint64_t)done, (uint64_t)total); }

int cmd_imatrix(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *out = NULL;
    int chunk = 512, max_chunks = 0;
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.n_threads = cli_default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); file = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { VAL(); out = v; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--chunk")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &chunk)) return 2; }
        else if (!strcmp(a, "--chunks")) { VAL(); if (!cli_parse_int(a, v, 1, 1 << 20, &max_chunks)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); if (!cli_parse_threads(a, v, &sp.n_threads)) return 2; }
        else return cli_unknown_option(a, usage);
#undef VAL
    }
    if (!model || !file || !out) { cli_err("need -m MODEL, -f TEXT and -o FILE (see --help)"); return 2; }
    if (sp.n_ctx == 0 || sp.n_ctx < chunk) sp.n_ctx = chunk;
    int rc = 1;
    int32_t *ids = NULL;
    int64_t n = 0;
    nstf_session *s = NULL;
    nstf_imatrix *im = NULL;
    cli_progress bar;
    cli_progress_init(&bar, "chunks", "", 1.0);
    char *text = cli_read_file(file, "text");
    if (!text) goto done;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) goto lib_err;
    if (nstf_session_tokenize_alloc(s, text, strlen(text), false, &ids, &n) != NSTF_OK) goto lib_err;
    if (max_chunks > 0 && n > (int64_t)max_chunks * chunk) n = (int64_t)max_chunks * chunk;
    if (n < 2 || n > (1 << 30)) { cli_err("%s: %lld tokens (2 .. 2^30 needed)", file, (long long)n); goto done; }
    const double t0 = nstf_time_ms();
    if (nstf_imatrix_collect(s, ids, (int)n, chunk, progress, &bar, &im) != NSTF_OK) goto lib_err;
    cli_progress_end(&bar);
    const char *base = strrchr(file, '/');
    snprintf(im->dataset, sizeof im->dataset, "%s", base ? base + 1 : file);
    if (nstf_imatrix_write(im, out) != NSTF_OK) goto lib_err;
    fprintf(stderr, "nstf imatrix: %d matrices, %d chunks of %d tokens (%lld tokens) in %.1f s -> %s\n", im->n,
            im->chunk_count, chunk, (long long)n, (nstf_time_ms() - t0) / 1e3, out);
    rc = 0;
    goto done;
lib_err:
    cli_progress_end(&bar);
    cli_lib_err();
done:
    cli_progress_end(&bar);
    nstf_imatrix_free(im);
    free(text);
    free(ids);
    nstf_session_close(s);
    return rc;
}
