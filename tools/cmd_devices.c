/* cmd_devices.c — `nstf devices`: list the GPUs this build can use (name,
 * architecture, SMs/CUs, memory total/free, wave size, L2), "no GPU", or
 * that the build has no GPU backend. Exit 0 in every one of those cases;
 * non-zero only when a present device fails to answer. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "nstf.h"
#include "nstf_tools.h"

int cmd_devices(int argc, char **argv);

static void devices_usage(FILE *f) { fprintf(f, "usage: nstf devices\n\nLists the GPUs this build of nstf can run on.\n"); }

int cmd_devices(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            devices_usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-') return cli_unknown_option(argv[i], devices_usage);
        cli_err("takes no arguments ('%s')", argv[i]);
        return 2;
    }
    const char *runtime = nstf_gpu_runtime();
    if (!runtime) {
        printf("no GPU backend in this build (CPU only; rebuild with -DNSTF_CUDA=ON or -DNSTF_HIP=ON)\n");
        return 0;
    }
    int n = nstf_gpu_count();
    if (n == 0) {
        printf("no GPU (no device visible to the %s runtime, or no driver)\n", runtime);
        return 0;
    }
    int rc = 0;
    for (int d = 0; d < n; d++) {
        char line[320];
        if (nstf_gpu_describe(d, line, sizeof line) != NSTF_OK) {
            cli_err("GPU %d: %s", d, nstf_last_error());
            rc = 1;
            continue;
        }
        printf("%s\n", line);
    }
    return rc;
}
