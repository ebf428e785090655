/* cmd_isa.c — `nstf isa`: the machine-code report of the GPU backend.
 *
 * Reads what the AMD/CUDA ISA build leaves in a folder (default build-amd/,
 * made by scripts/build_hip.sh and scripts/build_cuda_isa.sh):
 *   <target>/<stem>.s            AMD device assembly (gfx90a, gfx942, gfx1100):
 *                                the per-kernel "; Kernel info" comments, the
 *                                .amdhsa_kernel descriptor and the amdgpu_metadata
 *                                YAML, plus the instructions of each kernel body;
 *   sm_NN/<stem>.ptxas.txt        `nvcc -Xptxas -v` output (registers, stack, spills);
 *   sm_NN/<stem>.sass             `cuobjdump --dump-sass` (instruction counts), or
 *   sm_NN/<stem>.ptx              the PTX, counted instead when no SASS was made.
 * Prints one table per target (markdown, or JSON with --json), and with
 * --check GATES.tsv checks the gates of that table (matrix instructions
 * present, scratch bytes, occupancy floor) and exits 1 naming each failure.
 *
 * Input is text written by compilers, but it is still validated: numbers are
 * parsed strictly, names are length-limited, and any malformed line that the
 * report depends on is an error with file:line, never a crash. This file is
 * the command (options, then load, sort, report or check); isa.h lists the
 * other parts of tools/isa/. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli_util.h"
#include "isa.h"

static void isa_usage(FILE *f) {
    fprintf(f, "usage: nstf isa [--dir DIR] [--json] [--match GLOB]... [--target T]... [--check GATES.tsv]\n"
               "  Machine-code report of the GPU kernels built by `make amd` (default DIR: build-amd):\n"
               "  registers, LDS, scratch, occupancy and instruction mix per kernel and target.\n"
               "  --json          JSON instead of markdown\n"
               "  --match GLOB    only kernels whose name matches (e.g. 'gemm*', 'gemv_kernel<0,1,*>')\n"
               "  --target T      only this target (gfx90a, gfx942, gfx1100, sm_90a)\n"
               "  --check FILE    check the gates in FILE (docs/amd_gates.tsv); exit 1 on any failure\n"
               "  -v              with --check: also print each gated kernel's occupancy and scratch\n");
}

int cmd_isa(int argc, char **argv) {
    const char *dir = "build-amd", *gates = NULL;
    bool json = false, verbose = false;
    char *match[32], *tgt[16];
    int n_match = 0, n_tgt = 0;
    cli_expand_args(&argc, &argv, isa_usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            isa_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else if (!strcmp(a, "--dir") || !strcmp(a, "--check") || !strcmp(a, "--match") || !strcmp(a, "--target")) {
            if (i + 1 >= argc) {
                cli_err("%s needs a value", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--dir")) dir = v;
            else if (!strcmp(a, "--check")) gates = v;
            else if (!strcmp(a, "--match")) {
                if (n_match == 32) {
                    cli_err("at most 32 --match");
                    return 2;
                }
                match[n_match++] = argv[i];
            } else {
                if (n_tgt == 16) {
                    cli_err("at most 16 --target");
                    return 2;
                }
                tgt[n_tgt++] = argv[i];
            }
        } else {
            return cli_unknown_option(a, isa_usage);
        }
    }
    isa_set s = {0};
    if (!isa_load(&s, dir)) {
        free(s.k);
        return 1;
    }
    if (s.n == 0) {
        fprintf(stderr,
                "nstf isa: no kernels under %s (want <target>/<file>.s for AMD or sm_*/<file>.ptxas.txt for CUDA; "
                "run `make amd` first)\n",
                dir);
        free(s.k);
        return 1;
    }
    qsort(s.k, s.n, sizeof *s.k, isa_cmp_kernel);
    int rc = 0;
    if (gates) rc = isa_run_gates(&s, gates, verbose);
    else if (json) isa_print_json(stdout, &s, match, n_match, tgt, n_tgt);
    else isa_print_md(stdout, &s, match, n_match, tgt, n_tgt);
    free(s.k);
    return rc;
}
