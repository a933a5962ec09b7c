/* flux_prompt.c — FluxPipeline.encode_prompt: the CLIP text model's pooled output over 77
 * padded tokens and the T5 encoder's states over max_sequence_length padded tokens
 * (prompt_encoders.c makes both calls), checked against the transformer's input sizes. */
#include "flux_pipeline_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ prompts */
mmc_status mmc_flux_encode_prompt(mmc_ctx *ctx, mmc_flux_pipeline *p, const char *const *prompts, int B,
                                  int max_sequence_length, mmc_flux_cond *out) {
    memset(out, 0, sizeof *out);
    mmc_status st = mmc_pipe_clip_encode(ctx, p->comp_dir[C_TOK], p->comp_dir[C_TEXT], prompts, B, NULL, &out->pooled,
                                         NULL);
    if (!st) st = mmc_pipe_t5_encode(ctx, p->comp_dir[C_TOK2], p->comp_dir[C_TEXT2], prompts, B, max_sequence_length,
                                     &out->prompt_embeds);
    if (!st && (out->prompt_embeds->shape[2] != p->tr_cfg.joint_attention_dim ||
                out->pooled->shape[1] != p->tr_cfg.pooled_projection_dim))
        st = mmc_error(MMC_ERR_FORMAT, "%s: the text encoders give %lld-d states and %lld-d pooled vectors, the "
                       "transformer takes %lld and %lld (joint_attention_dim, pooled_projection_dim)", p->dir.dir,
                       (long long)out->prompt_embeds->shape[2], (long long)out->pooled->shape[1],
                       (long long)p->tr_cfg.joint_attention_dim, (long long)p->tr_cfg.pooled_projection_dim);
    if (st) mmc_flux_cond_free(out);
    return st;
}
