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
    /* split backward (mmc_set_defer_weight_grads): weight-gradient halves queued by the ops'
     * backward rules, run in queue order by mmc_backward_weights */
    bool defer_w;
    mmc_node **wq;
    mmc_backward_fn *wq_fn;
    int wq_len, wq_cap;
    /* activation offload (mmc_ctx_offload_begin): the mapped arena, and act's own while it stands in */
    mmc_arena *off, *act_saved;
};
#endif
