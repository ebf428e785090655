/* trainer.h — what a trainer holds (internal): the public face is
 * include/nstf_train.h. Shared by trainer.c (open, the step loop,
 * evaluation), checkpoint.c (save, resume) and train_export.c (GGUF). */
#ifndef NSTF_MODEL_TRAINER_H
#define NSTF_MODEL_TRAINER_H

#include "dist/comm.h"
#include "io/tokenizer.h"
#include "io/tokshard.h"
#include "model/train.h"
#include "nstf_train.h"

struct nstf_trainer {
    nstf_train_params p;    /* strings point into the copies below */
    char *strs;             /* the params' strings, one block */
    nstf_llama *model;
    nstf_tokenizer *tok;
    nstf_backend *be;       /* rank 0's (checkpoints, evaluation and export use rank 0), or this process's */
    nstf_train *tr;
    int dp;                 /* data-parallel ranks (1: none) */
    int self;               /* a launch by mpirun: the rank this process holds (the others are NULL below); -1:
                               every rank here */
    nstf_backend *bes[NSTF_COMM_MAX];
    nstf_train *trs[NSTF_COMM_MAX];
    nstf_comm *comm;        /* over bes (dp > 1) */
    nstf_data *data, *eval;
    int32_t *batch;          /* [dp][grad_accum][batch][seq + 1] host */
    int64_t step, tokens;    /* steps done, tokens trained on */
    double last_loss;
    nstf_lr_schedule sched;
    nstf_adamw_params opt;
    double peak_flops;       /* the device's dense bf16 rate (0: unknown) */
    char desc[512];
};

/* fn(ctx, r) for every data-parallel rank: on the ranks' threads (each
 * GPU rank's device current there) and then rank 0's device made current
 * on this thread again; with one rank, fn(ctx, 0) here; in a launch by
 * mpirun, fn(ctx, self) here. */
nstf_status nstf_trainer_on_ranks(nstf_trainer *t, nstf_comm_job fn, void *ctx);

/* The fingerprint of the model and training shape a checkpoint is for. */
uint64_t nstf_trainer_fingerprint(const nstf_trainer *t);

#endif
