/* cmd_bench_conv.c — `nstf bench conv`: the conv2d ladder (levels 0-4 of
 * nstf_gpu_conv2d) on ResNet-50's 3x3 layers and its 7x7 stem, or a layer
 * given on the command line: GPU-event time per call, TFLOP/s and the
 * speed-up of each level over level 0 and over the level before it; with
 * --peer, the cuDNN figure of the same layer measured through PyTorch by
 * bench/peers/conv_cudnn.py (its JSON) beside level 4. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "io/json.h"
#include "nstf.h"
#include "nstf_tools.h"

int cmd_bench_conv(int argc, char **argv);

typedef struct {
    const char *name;
    int c, h, w, k, r, s, stride, pad;
} conv_layer;

/* ResNet-50 (torchvision, stride on the 3x3) at 224x224: the stem and each
 * stage's 3x3 convolution, plain and strided. */
static const conv_layer k_layers[] = {
    {"stem7x7", 3, 224, 224, 64, 7, 7, 2, 3},        {"res2_3x3", 64, 56, 56, 64, 3, 3, 1, 1},
    {"res3_3x3s2", 128, 56, 56, 128, 3, 3, 2, 1},    {"res3_3x3", 128, 28, 28, 128, 3, 3, 1, 1},
    {"res4_3x3s2", 256, 28, 28, 256, 3, 3, 2, 1},    {"res4_3x3", 256, 14, 14, 256, 3, 3, 1, 1},
    {"res5_3x3s2", 512, 14, 14, 512, 3, 3, 2, 1},    {"res5_3x3", 512, 7, 7, 512, 3, 3, 1, 1},
};
#define N_LAYERS (int)(sizeof k_layers / sizeof k_layers[0])

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf bench conv [options]\n"
            "\n"
            "  --layer NAME        one of ResNet-50's layers (default: all; --list names them)\n"
            "  --shape C,H,W,K,R,S,STRIDE,PAD[,DIL[,GROUPS]]   a layer of your own instead\n"
            "  --batch N           images per call (default 32)\n"
            "  --layout L          nhwc or nchw (default nhwc)\n"
            "  --out T             output type bf16 or f32 (default bf16)\n"
            "  --levels L[,L]      ladder levels to run (default 0,1,2,3,4)\n"
            "  -r, --reps N        timed calls per level (default 20, after one warm-up)\n"
            "  --peer FILE         cuDNN figures from bench/peers/conv_cudnn.py --json FILE\n"
            "  -o, --output FMT    md or json (default md)\n"
            "  --list              print the layers (with -o json: for conv_cudnn.py)\n"
            "\n"
            "Times are GPU events around back-to-back calls on random bf16 data; TFLOP/s counts\n"
            "2 x N x K x P x Q x (C/groups) x R x S per call.\n");
}

typedef struct {
    char name[64];
    nstf_conv2d_desc d;
} bench_layer;

static bool parse_shape(const char *s, int batch, nstf_conv_layout lay, bench_layer *out) {
    long v[10] = {0, 0, 0, 0, 0, 0, 1, 0, 1, 1};
    int n = 0;
    const char *p = s;
    while (*p && n < 10) {
        char *end;
        v[n++] = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) break;
        p = *end ? end + 1 : end;
    }
    if (n < 8 || *p) {
        fprintf(stderr, "nstf bench conv: --shape '%s': want C,H,W,K,R,S,STRIDE,PAD[,DIL[,GROUPS]]\n", s);
        return false;
    }
    snprintf(out->name, sizeof out->name, "custom");
    out->d = (nstf_conv2d_desc){batch, v[0], v[1], v[2], v[3], v[4], v[5], (int)v[6], (int)v[6], (int)v[7],
                                (int)v[7], (int)v[8], (int)v[8], (int)v[9], lay};
    return true;
}

/* The peer's ms for this layer (name, layout, batch, output type), or 0. */
static double peer_ms(const cJSON *peer, const bench_layer *l, const char *layout, const char *out) {
    const cJSON *arr = peer ? cJSON_GetObjectItemCaseSensitive(peer, "layers") : NULL, *e;
    cJSON_ArrayForEach(e, arr) {
        const char *nm = nstf_json_str(e, "name"), *ly = nstf_json_str(e, "layout"), *ot = nstf_json_str(e, "out");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "batch"), *ms = cJSON_GetObjectItemCaseSensitive(e, "ms");
        uint64_t batch;
        if (nm && ly && ot && strcmp(nm, l->name) == 0 && strcmp(ly, layout) == 0 && strcmp(ot, out) == 0 &&
            nstf_json_uint(b, &batch) && (int64_t)batch == l->d.n && cJSON_IsNumber(ms) && ms->valuedouble > 0)
            return ms->valuedouble;
    }
    return 0.0;
}

int cmd_bench_conv(int argc, char **argv) {
    const char *layer = NULL, *shape = NULL, *peer_path = NULL, *fmt = "md", *layout = "nhwc", *out = "bf16";
    int batch = 32, reps = 20;
    bool list = false, want[5] = {true, true, true, true, true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--layer")) { VAL(); layer = v; }
        else if (!strcmp(a, "--shape")) { VAL(); shape = v; }
        else if (!strcmp(a, "--batch")) { VAL(); if (!cli_parse_int(a, v, 1, 1 << 16, &batch)) return 2; }
        else if (!strcmp(a, "--layout")) { VAL(); layout = v; }
        else if (!strcmp(a, "--out")) { VAL(); out = v; }
        else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) { VAL(); if (!cli_parse_int(a, v, 1, 100000, &reps)) return 2; }
        else if (!strcmp(a, "--peer")) { VAL(); peer_path = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { VAL(); fmt = v; }
        else if (!strcmp(a, "--list")) list = true;
        else if (!strcmp(a, "--levels")) {
            VAL();
            memset(want, 0, sizeof want);
            for (const char *p = v; *p; p++) {
                if (*p == ',') continue;
                if (*p < '0' || *p > '4' || (p[1] && p[1] != ',')) {
                    fprintf(stderr, "nstf bench conv: --levels '%s': want a list of 0..4\n", v);
                    return 2;
                }
                want[*p - '0'] = true;
            }
        } else { fprintf(stderr, "nstf bench conv: unknown option '%s' (see --help)\n", a); return 2; }
#undef VAL
    }
    if (strcmp(layout, "nhwc") != 0 && strcmp(layout, "nchw") != 0) {
        fprintf(stderr, "nstf bench conv: --layout '%s': use nhwc or nchw\n", layout);
        return 2;
    }
    if (strcmp(out, "bf16") != 0 && strcmp(out, "f32") != 0) {
        fprintf(stderr, "nstf bench conv: --out '%s': use bf16 or f32\n", out);
        return 2;
    }
    const bool json = !strcmp(fmt, "json");
    if (!json && strcmp(fmt, "md") != 0) {
        fprintf(stderr, "nstf bench conv: -o '%s': use md or json\n", fmt);
        return 2;
    }
    const nstf_conv_layout lay = !strcmp(layout, "nhwc") ? NSTF_CONV_NHWC : NSTF_CONV_NCHW;

    bench_layer ls[N_LAYERS];
    int n_ls = 0;
    if (shape) {
        if (!parse_shape(shape, batch, lay, &ls[0])) return 2;
        n_ls = 1;
    } else {
        for (int i = 0; i < N_LAYERS; i++) {
            const conv_layer *c = &k_layers[i];
            if (layer && strcmp(layer, c->name) != 0) continue;
            snprintf(ls[n_ls].name, sizeof ls[n_ls].name, "%s", c->name);
            ls[n_ls++].d = (nstf_conv2d_desc){batch, c->c, c->h, c->w, c->k, c->r, c->s, c->stride, c->stride,
                                              c->pad, c->pad, 1, 1, 1, lay};
        }
        if (!n_ls) {
            fprintf(stderr, "nstf bench conv: unknown layer '%s' (see --list)\n", layer);
            return 2;
        }
    }
    for (int i = 0; i < n_ls; i++)
        if (nstf_conv2d_out_size(&ls[i].d, NULL, NULL) != NSTF_OK) {
            fprintf(stderr, "nstf bench conv: %s: %s\n", ls[i].name, nstf_last_error());
            return 2;
        }
    if (list) {
        for (int i = 0; i < n_ls; i++) {
            const nstf_conv2d_desc *d = &ls[i].d;
            if (json)
                printf("%s{\"name\": \"%s\", \"n\": %lld, \"c\": %lld, \"h\": %lld, \"w\": %lld, \"k\": %lld, \"r\": %lld, "
                       "\"s\": %lld, \"stride\": %d, \"pad\": %d, \"dil\": %d, \"groups\": %d}%s",
                       i ? "  " : "[", ls[i].name, (long long)d->n, (long long)d->c, (long long)d->h, (long long)d->w,
                       (long long)d->k, (long long)d->r, (long long)d->s, d->stride_h, d->pad_h, d->dil_h, d->groups,
                       i + 1 < n_ls ? ",\n" : "]\n");
            else
                printf("%-12s c %4lld  %3lldx%-3lld  k %4lld  %lldx%lld  stride %d  pad %d\n", ls[i].name, (long long)d->c,
                       (long long)d->h, (long long)d->w, (long long)d->k, (long long)d->r, (long long)d->s, d->stride_h,
                       d->pad_h);
        }
        return 0;
    }
    if (!nstf_gpu_runtime() || nstf_gpu_count() < 1) {
        fprintf(stderr, "nstf bench conv: needs a GPU build (NSTF_CUDA=ON or NSTF_HIP=ON) and a device (%s)\n",
                nstf_gpu_runtime() ? "none found" : "this build has no GPU backend");
        return 1;
    }
    cJSON *peer = NULL;
    if (peer_path && nstf_json_read_file(peer_path, 1 << 24, &peer) != NSTF_OK) {
        fprintf(stderr, "nstf bench conv: --peer: %s\n", nstf_last_error());
        return 1;
    }
    const char *peer_name = peer ? nstf_json_str(peer, "peer") : NULL;
    if (!peer_name) peer_name = "cuDNN (PyTorch)";

    int rc = 0;
    if (json) printf("{\"layout\": \"%s\", \"out\": \"%s\", \"batch\": %d, \"layers\": [", layout, out, batch);
    else
        printf("| layer | level | ms | TFLOP/s | vs L0 | vs previous |\n|---|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < n_ls && rc == 0; i++) {
        const bench_layer *l = &ls[i];
        const double flops = nstf_conv2d_flops(&l->d);
        double ms0 = 0, prev = 0, ms4 = 0;
        if (json) printf("%s\n  {\"name\": \"%s\", \"flops\": %.0f, \"levels\": [", i ? "," : "", l->name, flops);
        int n_printed = 0;
        for (int lv = 0; lv < nstf_conv2d_levels(); lv++) {
            if (!want[lv]) continue;
            double ms = 0;
            nstf_status st = nstf_conv2d_bench(&l->d, lv, !strcmp(out, "bf16"), reps, &ms);
            if (st == NSTF_ERR_UNSUPPORTED && nstf_gpu_count() > 0) { /* this level does not take the shape */
                if (!json) printf("| %s | L%d | - | - | - | - |  (%s)\n", l->name, lv, nstf_last_error());
                continue;
            }
            if (st != NSTF_OK) {
                fprintf(stderr, "nstf bench conv: %s level %d: %s\n", l->name, lv, nstf_last_error());
                rc = 1;
                break;
            }
            if (lv == 0) ms0 = ms;
            if (lv == 4) ms4 = ms;
            const double tf = flops / (ms * 1e-3) / 1e12;
            if (json)
                printf("%s{\"level\": %d, \"ms\": %.6f, \"tflops\": %.4f}", n_printed ? ", " : "", lv, ms, tf);
            else {
                printf("| %s | L%d %s | %.4f | %.2f | ", l->name, lv, nstf_conv2d_level_name(lv), ms, tf);
                if (ms0 > 0) printf("%.2fx | ", ms0 / ms); else printf("- | ");
                if (prev > 0) printf("%.2fx |\n", prev / ms); else printf("- |\n");
            }
            prev = ms;
            n_printed++;
        }
        const double pms = peer_ms(peer, l, layout, out);
        if (json) {
            printf("]");
            if (pms > 0) printf(", \"peer\": {\"name\": \"%s\", \"ms\": %.6f}", peer_name, pms);
            printf("}");
        } else if (pms > 0) {
            printf("| %s | %s | %.4f | %.2f | - | ", l->name, peer_name, pms, flops / (pms * 1e-3) / 1e12);
            if (ms4 > 0) printf("L4 at %.2fx its TFLOP/s |\n", pms / ms4); else printf("- |\n");
        }
    }
    if (json) printf("\n]}\n");
    cJSON_Delete(peer);
    return rc;
}
