/* cmd_quantize.c — `nstf quantize IN OUT TYPE [--allow-requantize] [-t N]`:
 * the CLI over nstf_quantize_file (src/opt/quantize.h; IN a GGUF file or an
 * HF model folder), with a progress bar (bytes done, rate, ETA) on stderr
 * when stderr is a terminal. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli_util.h"
#include "core/clock.h"
#include "opt/imatrix.h"
#include "opt/quantize.h"

int cmd_quantize(int argc, char **argv);
int cmd_quantize_auto(int argc, char **argv);

static void quantize_usage(FILE *f) {
    fprintf(f, "usage: nstf quantize IN OUT.gguf TYPE [--imatrix FILE] [--allow-requantize] [-t N]\n"
               "  IN: a GGUF file, or an HF model folder (config.json, model.safetensors or\n"
               "  shards, tokenizer.json): quantized in one step, the same bytes as\n"
               "  `nstf convert` then `nstf quantize`; tensors are streamed one at a time\n"
               "  TYPE: %s\n"
               "        or auto: a type per matrix under a budget (nstf quantize IN OUT auto --help)\n"
               "  Matrices are converted (llama.cpp's choice of type per tensor: the output\n"
               "  matrix gets Q6_K, the _M mixes give some attn_v/ffn_down Q6_K); vectors are kept.\n"
               "      --imatrix FILE      importance weights (nstf imatrix, or llama-imatrix's GGUF file):\n"
               "                          the quantizers weigh each column's error by its mean squared\n"
               "                          input (llama.cpp's quantize_*_impl; Q8_0 takes none)\n"
               "      --allow-requantize  accept already-quantized input (dequantized first: the\n"
               "                          errors compound)\n"
               "  -t, --threads N         threads (default: the physical cores)\n",
            nstf_quant_target_list());
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0;
    nstf_quant_params p = {.n_threads = cli_default_threads()};
    const char *imatrix = NULL;
    cli_expand_args(&argc, &argv, quantize_usage);
    for (int i = 1; i < argc; i++) /* TYPE auto: adaptive precision (cmd_quantize_auto.c) */
        if (!strcasecmp(argv[i], "auto") && (i == 1 || argv[i - 1][0] != '-')) return cmd_quantize_auto(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            quantize_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--allow-requantize")) {
            p.allow_requantize = true;
        } else if (!strcmp(a, "--imatrix")) {
            if (!(imatrix = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_parse_int(a, v, 1, 1024, &p.n_threads)) return 2;
            cli_check_threads(p.n_threads);
        } else if (a[0] == '-' && a[1]) {
            return cli_unknown_option(a, quantize_usage);
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            cli_err("too many arguments (IN OUT TYPE)");
            return 2;
        }
    }
    if (n_pos != 3) {
        cli_err("need IN OUT TYPE (see --help)");
        return 2;
    }
    if (!nstf_quant_target_parse(pos[2], &p.target)) {
        cli_err("unknown type '%s' (%s)", pos[2], nstf_quant_target_list());
        return 2;
    }
    nstf_imatrix *im = NULL;
    if (imatrix && nstf_imatrix_load(imatrix, &im) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    p.imatrix = im;
    cli_progress bar;
    cli_progress_init(&bar, "quantizing", "MiB", 1.0 / (1 << 20));
    p.progress = cli_progress_cb;
    p.progress_user = &bar;
    const double t0 = nstf_time_ms();
    const nstf_status st = nstf_quantize_file(pos[0], pos[1], &p);
    cli_progress_end(&bar);
    nstf_imatrix_free(im);
    if (st != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    fprintf(stderr, "nstf %s: %s -> %s (%s) in %.1f s\n", cli_cmd, pos[0], pos[1], p.target.name,
            (nstf_time_ms() - t0) / 1e3);
    return 0;
}
