/* cmd_inspect.c — `nstf inspect MODEL`: metadata and tensor table of a GGUF
 * file, or of an HF model folder as the loader sees it (its GGUF view). */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "io/hf_model.h"

int cmd_inspect(int argc, char **argv);

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: nstf inspect [--all] MODEL.gguf|HF_FOLDER\n"
               "  prints the GGUF version, metadata and tensor table (of an HF folder:\n"
               "  the GGUF view the loader reads);\n"
               "  --all also prints long arrays (the vocabulary) in full\n");
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--all")) {
            all = true;
        } else if (argv[i][0] == '-') {
            return cli_unknown_option(argv[i], inspect_usage);
        } else if (path) {
            cli_err("one file at a time");
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        cli_err("no file given (nstf inspect MODEL.gguf|HF_FOLDER)");
        return 2;
    }
    nstf_gguf *g;
    if (nstf_model_file_open(path, &g) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    nstf_status st = nstf_gguf_print(g, stdout, all);
    nstf_gguf_close(g);
    if (st != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    return 0;
}
