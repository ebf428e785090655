/* cmd_convert.c — `nstf convert MODEL -o FILE.gguf [--type f16|bf16|f32]`:
 * an HF model folder (or a GGUF file) written as a GGUF file that
 * llama.cpp loads (io/convert.h), with a progress bar (rate, ETA) on a
 * terminal. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "io/convert.h"
#include "io/hf_model.h"

int cmd_convert(int argc, char **argv);

static void convert_usage(FILE *f) {
    fprintf(f, "usage: nstf convert MODEL -o FILE.gguf [--type f16|bf16|f32]\n"
               "  MODEL: an HF model folder (config.json, model.safetensors or shards,\n"
               "  tokenizer.json, tokenizer_config.json), or a GGUF file\n"
               "  writes a GGUF file that llama.cpp loads: Q/K rows permuted as llama.cpp's\n"
               "  converter does, GGUF tensor names, llama.* and tokenizer.ggml.* metadata\n"
               "  -o, --output FILE   the GGUF file to write\n"
               "      --type T        the type of the matrices (default: as stored); norms are F32\n"
               "      --outtype T     the same (llama.cpp's name)\n");
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type_name = NULL;
    cli_expand_args(&argc, &argv, convert_usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (in) {
                cli_err("one model at a time ('%s' and '%s')", in, a);
                return 2;
            }
            in = a;
            continue;
        }
        if (strcmp(a, "-o") && strcmp(a, "--output") && strcmp(a, "--type") && strcmp(a, "--outtype"))
            return cli_unknown_option(a, convert_usage);
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else type_name = v;
    }
    if (!in || !out) {
        cli_err("a model and -o FILE.gguf are required (see --help)");
        return 2;
    }
    nstf_convert_params p = {.out_type = -1};
    nstf_type t;
    if (type_name) {
        if (!nstf_type_from_name(type_name, &t) || (t != NSTF_TYPE_F32 && t != NSTF_TYPE_F16 && t != NSTF_TYPE_BF16)) {
            cli_err("--type '%s' is not one of f16, bf16, f32", type_name);
            return 2;
        }
        p.out_type = (int)t;
    }
    cli_progress bar;
    cli_progress_init(&bar, "converting", "MiB", 1.0 / (1 << 20));
    p.progress = cli_progress_cb;
    p.user = &bar;
    nstf_gguf *g = NULL;
    nstf_status s = nstf_model_file_open(in, &g);
    if (s == NSTF_OK) s = nstf_convert_to_gguf(g, out, &p);
    cli_progress_end(&bar);
    if (s != NSTF_OK) {
        cli_lib_err();
        nstf_gguf_close(g);
        return 1;
    }
    fprintf(stderr, "nstf %s: wrote %s (%llu tensors)\n", cli_cmd, out, (unsigned long long)g->n_tensors);
    nstf_gguf_close(g);
    return 0;
}
