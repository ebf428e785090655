/* nstf.c — the nstf command line: `nstf run`, `nstf inspect`, ...
 * Every failure is one line on stderr and a non-zero exit. */
#include <stdio.h>
#include <string.h>

#include "nstf.h"

int cmd_run(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_isa(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench_conv(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_lowrank(int argc, char **argv);
int cmd_analyze(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "nstf %s — run Llama-family models on CPU (CUDA and HIP backends in progress)\n"
            "\n"
            "usage: nstf <command> [options]\n"
            "\n"
            "commands:\n"
            "  run       generate text from a GGUF model or an HF model folder (nstf run --help)\n"
            "  serve     an OpenAI-compatible HTTP server with continuous batching (nstf serve --help)\n"
            "  inspect   print a GGUF file's metadata and tensor table (nstf inspect --help)\n"
            "  convert   write an HF model folder as a GGUF file (nstf convert --help)\n"
            "  perplexity  perplexity and KL divergence on a text, as llama-perplexity (nstf perplexity --help)\n"
            "  quantize  convert a GGUF's weights to another type or mix (nstf quantize --help)\n"
            "  lowrank   factor a model's matrices into low-rank pairs (SVD, activation-aware) (--help)\n"
            "  analyze   per-matrix sensitivity: KL and perplexity under each candidate type / rank\n"
            "  gen-model write a Llama GGUF with random weights at a real shape (nstf gen-model --help)\n"
            "  train     train or fine-tune (full or LoRA) on the CPU or a GPU (nstf train --help)\n"
            "  tokenize  text files to token shards for nstf train (nstf tokenize --help)\n"
            "  bench     llama-bench compatible throughput (pp512/tg128) and regression check;\n"
            "            nstf bench conv: the conv2d kernel ladder against cuDNN (nstf bench conv --help)\n"
            "  profile   per-op time, FLOPs, bytes and roofline placement; Chrome trace\n"
            "  devices   list the GPUs this build can run on (--verbose: and the environment switches)\n"
            "  isa       GPU machine-code report and gates of the AMD/CUDA build (nstf isa --help)\n"
            "  help      this text\n",
            NSTF_VERSION_STRING);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "gen-model")) return cmd_gen_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench") && argc > 2 && !strcmp(argv[2], "conv")) return cmd_bench_conv(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "profile")) return cmd_profile(argc - 1, argv + 1);
    if (!strcmp(cmd, "devices")) return cmd_devices(argc - 1, argv + 1);
    if (!strcmp(cmd, "isa")) return cmd_isa(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "lowrank")) return cmd_lowrank(argc - 1, argv + 1);
    if (!strcmp(cmd, "analyze")) return cmd_analyze(argc - 1, argv + 1);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("nstf %s\n", NSTF_VERSION_STRING);
        return 0;
    }
    fprintf(stderr, "nstf: unknown command '%s' (try nstf --help)\n", cmd);
    return 2;
}
