/* trainer_cp.c — mmc train with parallel.context_parallel (mmc_cp.h: DeepSpeed-Ulysses, or ring
 * attention with parallel.context_parallel_mode: ring): the layout (the world cut into context-parallel groups of C ranks, Megatron's order: context
 * fastest, then data), the model check before any work, and the reductions after backward.
 * The C ranks of a group read the same micro-batches (they share dp_rank) and each computes
 * the loss of its sequence shard, scaled by 1 / the global batch's label count; the weight
 * gradients, partial per rank, are summed over the group exactly as gradient accumulation
 * sums micro-batches, and the reported loss is the group's sum. Qwen2-VL / Qwen2.5-VL: the vision
 * tower runs whole on every rank of the group (mmc_cp_qwen2_vl_loss) and its backward already
 * sees the features' whole gradient (summed over the group), so its weight gradients (and its
 * LoRA adapters') are the same on every rank and are not summed again. LLaVA / InternVL the same
 * way (mmc_cp_embeds_lm_loss after the model's own embeddings with the features' gradient summed). */
#include "trainer_internal.h"
#include "mmc_cp.h"

#include <math.h>
#include <string.h>

mmc_status mmc_cp_trainer_layout(mmc_trainer *t) {
    const mmc_run_config *cfg = t->cfg;
    const int C = t->cp_size;
    if (C > t->world_size)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.context_parallel %d is larger than the job's %d process%s: a "
                         "context-parallel group needs that many ranks; launch with mpirun -np %d (or a multiple)",
                         cfg->file, C, t->world_size, t->world_size == 1 ? "" : "es", C);
    if (t->world_size % C)
        return mmc_error(MMC_ERR_INVALID, "%s: the job's %d processes do not divide into context-parallel groups of %d "
                         "(parallel.context_parallel); launch a multiple of %d processes", cfg->file, t->world_size,
                         C, C);
    t->dp_size = t->world_size / C;
    if (cfg->parallel.data_parallel != t->dp_size && cfg->parallel.data_parallel != 1)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.data_parallel %lld x context_parallel %d is not the job's %d "
                         "processes; set data_parallel: %d or leave it out", cfg->file,
                         (long long)cfg->parallel.data_parallel, C, t->world_size, t->dp_size);
    if (cfg->training.gradient_accumulation % t->dp_size)
        return mmc_error(MMC_ERR_INVALID, "%s: data.batch_size %lld does not divide into %d data-parallel replicas "
                         "(world %d / context_parallel %d) x micro_batch_size %lld", cfg->file,
                         (long long)cfg->data.batch_size, t->dp_size, t->world_size, C,
                         (long long)cfg->data.micro_batch_size);
    mmc_dist_layout lay = {.context = C, .data = t->dp_size};
    mmc_status st = mmc_dist_layout_groups(t->world, &lay, &t->groups);
    if (st) return st;
    t->have_groups = true;
    t->cpc = t->groups.cp;
    t->dpc = t->groups.dp;
    t->dp_rank = t->groups.dp_rank;
    return MMC_OK;
}

mmc_status mmc_cp_trainer_check(mmc_trainer *t) {
    if (t->omni || mmc_trainer_diffusion(t) || !t->lm)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.context_parallel is implemented for the text decoders "
                         "(Qwen2, Llama, Mistral), Qwen2-VL, Qwen2.5-VL, LLaVA and InternVL only so far (this model is "
                         "a%s); use context_parallel 1", t->cfg->file, t->omni ? " Qwen2.5-Omni" : " diffusion model");
    if (t->vl && t->cfg->parallel.hetero) t->vl->vision_share = t->cpc;   /* each cp rank encodes its share */
    const bool ring = t->cfg->parallel.context_parallel_mode == MMC_CP_RING;
    mmc_cp_set_mode_qwen2(t->lm, ring ? MMC_CP_RING : MMC_CP_ULYSSES);
    /* ring: any head count; dynamic NTK refused under both (mmc_cp_check_qwen2 checks it first) */
    return ring && t->lm->cfg.rope_kind != MMC_ROPE_DYNAMIC ? MMC_OK : mmc_cp_check_qwen2(&t->lm->cfg, t->cp_size, t->cfg->file);
}

/* LLaVA / InternVL: the tower and projector (and image_newline), whose gradients are whole on every
 * rank of the group: all but the language model's tensors (full: language_model.*; LoRA:
 * model.language_model.*) */
static bool vlm_replicated(const char *name) {
    return strncmp(name, "language_model.", 15) && strncmp(name, "model.language_model.", 21);
}

mmc_status mmc_cp_trainer_reduce(mmc_trainer *t, double *loss) {
    mmc_status st;
    for (int i = 0; i < t->n_opt; i++) {   /* weight gradients: this rank's tokens only -> summed */
        /* (but the vision tower's, and its adapters': whole on every rank, mmc_cp_qwen2_vl_loss —
         * unless a per-modality plan shares the images out over the group) */
        if (t->vl && !t->vl->vision_share && !strncmp(t->opt_names[i], "model.visual.", 13)) continue;
        if ((t->llava || t->internvl) && vlm_replicated(t->opt_names[i])) continue;   /* (the same for LLaVA / InternVL) */
        mmc_tensor *g = t->opt_model[i]->grad;
        if (g && (st = mmc_all_reduce(t->cpc, g->data, g->data, mmc_numel(g), MMC_F32, MMC_SUM))) return st;
    }
    if ((st = mmc_all_reduce(t->cpc, loss, loss, 1, MMC_F64, MMC_SUM))) return st;
    if (!isfinite(*loss))   /* every rank of the group sees the sum: all stop at the same step */
        return mmc_error(MMC_ERR_NUMERIC, "step %lld: the loss is not finite on some context-parallel rank; stopping "
                         "without updating the weights — the last checkpoint is intact; lower optimizer.lr or check "
                         "the data", (long long)t->step + 1);
    return MMC_OK;
}

/* data.eval: the batch scored as a training micro-batch is (the tower whole on every rank, each rank
 * its shard of the rows: Ulysses contiguous, ring zigzag) with no tape and no dropout; the shards'
 * summed NLLs and token counts add up over the group to the one process's (mmc_cp_trainer_eval_sum).
 * Only the Qwen2-VL family evaluates (trainer_eval), the one that reaches here. */
mmc_status mmc_cp_trainer_eval_batch(mmc_trainer *t, const mmc_batch *b, double *nll, int64_t *tokens) {
    *nll = 0, *tokens = 0;
    if (!t->vl) return mmc_error(MMC_ERR_UNSUPPORTED, "data.eval under context parallelism: Qwen2-VL / Qwen2.5-VL only");
    mmc_tensor *l = NULL;
    mmc_status st = mmc_cp_qwen2_vl_loss(t->ctx, t->vl, t->cpc, b, 1.0, &l, tokens);
    if (!st) *nll = *(const float *)l->data;
    mmc_ctx_reset(t->ctx);
    return st;
}

mmc_status mmc_cp_trainer_eval_sum(mmc_trainer *t, double *nll, int64_t *tokens) {
    double v[2] = {*nll, (double)*tokens};
    mmc_status st = mmc_all_reduce(t->cpc, v, v, 2, MMC_F64, MMC_SUM);
    if (st) return mmc_error_prefix(st, "data.eval: summing the context-parallel shards' losses");
    *nll = v[0], *tokens = (int64_t)v[1];
    return MMC_OK;
}
