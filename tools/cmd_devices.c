/* cmd_devices.c — `nstf devices`: list the GPUs this build can use (name,
 * architecture, SMs/CUs, memory total/free, wave size, L2), "no GPU", or
 * that the build has no GPU backend. Exit 0 in every one of those cases;
 * non-zero only when a present device fails to answer. With --verbose it
 * also lists the environment switches of core/switches.h (name, current
 * value, default, where the value came from, what is accepted, what it
 * does), in every build, GPU or not. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "core/switches.h"
#include "nstf.h"
#include "nstf_tools.h"

int cmd_devices(int argc, char **argv);

static int list_devices(void) {
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

/* One row per switch, columns as wide as their longest entry. */
static void list_switches(void) {
    enum { N_COL = 6 };
    static const char *const head[N_COL] = {"switch", "value", "default", "from", "accepted", "description"};
    char val[NSTF_SW_COUNT][NSTF_SWITCH_STR_MAX + 1], def[NSTF_SW_COUNT][32], acc[NSTF_SW_COUNT][160];
    const char *cell[NSTF_SW_COUNT][N_COL];
    int width[N_COL];
    for (int c = 0; c < N_COL; c++) width[c] = (int)strlen(head[c]);
    for (int i = 0; i < NSTF_SW_COUNT; i++) {
        const nstf_switch_id id = (nstf_switch_id)i;
        const nstf_switch_def *d = nstf_switch_def_of(id);
        nstf_switch_value_text(id, val[i], sizeof val[i]);
        if (d->kind == NSTF_SWITCH_STR) snprintf(def[i], sizeof def[i], "(unset)");
        else nstf_switch_format(id, d->def, def[i], sizeof def[i]);
        nstf_switch_allowed_text(id, acc[i], sizeof acc[i]);
        cell[i][0] = d->name;
        cell[i][1] = val[i][0] ? val[i] : "(unset)";
        cell[i][2] = def[i];
        cell[i][3] = nstf_switch_source_name(nstf_switch_source_of(id));
        cell[i][4] = acc[i];
        cell[i][5] = d->desc;
        for (int c = 0; c < N_COL - 1; c++) {
            const int w = (int)strlen(cell[i][c]);
            if (w > width[c]) width[c] = w;
        }
    }
    printf("environment switches (read once per process):\n");
    printf("  %-*s  %-*s  %-*s  %-*s  %-*s  %s\n", width[0], head[0], width[1], head[1], width[2], head[2], width[3],
           head[3], width[4], head[4], head[5]);
    for (int i = 0; i < NSTF_SW_COUNT; i++)
        printf("  %-*s  %-*s  %-*s  %-*s  %-*s  %s\n", width[0], cell[i][0], width[1], cell[i][1], width[2],
               cell[i][2], width[3], cell[i][3], width[4], cell[i][4], cell[i][5]);
}

/* Every ordered pair of GPUs: the link, peer access, measured peer-copy
 * bandwidth and latency; then a 16 KB all-reduce over all of them. */
static int list_topology(void) {
    const int n = nstf_gpu_runtime() ? nstf_gpu_count() : 0;
    if (n < 2) {
        printf("topology: %d GPU%s, no links to show\n", n, n == 1 ? "" : "s");
        return 0;
    }
    int rc = 0;
    printf("topology (peer copies: 256 MiB for bandwidth, 4 bytes for latency):\n");
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            if (a == b) continue;
            char kind[32];
            int peer = 0;
            double gbs = 0, lat = 0;
            if (nstf_gpu_link_measure(a, b, kind, sizeof kind, &peer, &gbs, &lat) != NSTF_OK) {
                cli_err("GPU %d -> GPU %d: %s", a, b, nstf_last_error());
                rc = 1;
                continue;
            }
            printf("  GPU %d -> GPU %d: %-12s peer access %-3s  %7.1f GB/s  %6.2f us\n", a, b, kind, peer ? "yes" : "no",
                   gbs, lat);
        }
    char tr[64];
    double us = 0;
    if (nstf_gpu_allreduce_time(n, 16384, 200, &us, tr, sizeof tr) != NSTF_OK) {
        cli_err("all-reduce over %d GPUs: %s", n, nstf_last_error());
        return 1;
    }
    printf("all-reduce of 16 KB over %d GPUs (%s): %.1f us each (200 back to back)\n", n, tr, us);
    return rc;
}

static void devices_usage(FILE *f) {
    fprintf(f, "usage: nstf devices [--verbose] [--topology]\n\nLists the GPUs this build of nstf can run on.\n"
               "  -v, --verbose   also list the environment switches (value, default, source)\n"
               "  --topology      the link between every pair of GPUs (NVLink / xGMI / PCIe, peer access,\n"
               "                  measured peer-copy bandwidth and latency) and a 16 KB all-reduce\n");
}

int cmd_devices(int argc, char **argv) {
    int verbose = 0, topology = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            devices_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
            verbose = 1;
            continue;
        }
        if (!strcmp(argv[i], "--topology")) {
            topology = 1;
            continue;
        }
        if (argv[i][0] == '-') return cli_unknown_option(argv[i], devices_usage);
        cli_err("takes no arguments ('%s')", argv[i]);
        return 2;
    }
    int rc = list_devices();
    if (topology && list_topology() != 0) rc = 1;
    if (verbose) {
        printf("\n");
        list_switches();
    }
    return rc;
}
