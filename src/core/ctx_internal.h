/* ctx_internal.h — the execution context's fields, shared by src/core only. */
#ifndef MMC_CTX_INTERNAL_H
#define MMC_CTX_INTERNAL_H
#include "mmc.h"

struct mmc_ctx {
    mmc_arena *act;       /* activations, activation grads, tape nodes */
    mmc_arena *scratch;   /* per-op temporaries */
    bool grad_enabled;
    mmc_node **tape;      /* nodes in recording order (heap array, grows) */
    int tape_len, tape_cap;
    /* LoRA dropout (src/nn/dropout.c): on after mmc_nn_set_dropout_seed; masks are also drawn
     * while a checkpointed block's forward runs with grad off (ckpt_depth > 0) */
    uint64_t dropout_seed;
    bool dropout_on;
    int ckpt_depth;
    mmc_param_hooks hooks;   /* all NULL unless data parallelism installed them */
};
#endif
