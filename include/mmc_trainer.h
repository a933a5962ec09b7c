/* mmc_trainer.h — the single-process trainer behind `mmc train`.
 *
 * One optimizer step = gradient accumulation over data.batch_size / data.micro_batch_size
 * micro-batches; the loss is the mean over the label tokens of the whole global batch (each
 * micro-batch's summed token loss is divided by the global label-token count, as HF
 * Trainer does with num_items_in_batch), then global grad-norm clipping, the lr schedule and
 * AdamW (no decay on norms/biases). Frozen components take no gradients and no optimizer
 * state. With model.dtype bf16 the model's matrices are bf16 for forward/backward while
 * fp32 master copies and fp32 AdamW state are updated, then cast back after each step.
 *
 * Checkpoints (output_dir/checkpoint-<step>/) hold the model as a Hugging Face directory
 * plus trainer_state.json and optimizer.safetensors; they are written to a temporary
 * directory and renamed into place, so a crash or a full disk never leaves a half-written
 * checkpoint and the previous ones stay intact. Resuming restores weights, AdamW moments,
 * step, RNG and data position, and continues bit-identically.
 */
#ifndef MMC_TRAINER_H
#define MMC_TRAINER_H

#include "mmc.h"
#include "mmc_config.h"
#include "mmc_data.h"
#include "mmc_models.h"
#include "mmc_vl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_trainer mmc_trainer;

typedef struct {
    int64_t step;            /* optimizer steps done (1-based after the first step) */
    double loss;             /* mean over the global batch's label tokens */
    double lr;               /* the lr this step used */
    double grad_norm;        /* global norm before clipping */
    int64_t tokens;          /* input tokens of the global batch */
    int64_t label_tokens;    /* tokens scored */
    int64_t samples;         /* rows of the global batch */
    double step_s, data_s;   /* wall time of the step and of fetching its batches */
    /* MoE capacity statistics of the global batch: tokens of the busiest / idlest (sparse layer,
     * expert) over the mean (routed tokens / (layers x experts)); 0 for a dense model */
    double moe_load_max, moe_load_min;
} mmc_step_stats;

/* Build the model (load model.path, or random-init from model.init), freeze, set up the
 * optimizer and the data source. With resume, restore the latest complete checkpoint in
 * training.output_dir (an error if there is none). The config must outlive the trainer. */
mmc_status mmc_trainer_new(const mmc_run_config *cfg, bool resume, mmc_trainer **out);
void mmc_trainer_free(mmc_trainer *t);
/* One optimizer step. MMC_ERR_NUMERIC on a NaN/Inf loss or gradient (nothing updated). */
mmc_status mmc_trainer_step(mmc_trainer *t, mmc_step_stats *s);
/* Write output_dir/checkpoint-<step> atomically and prune to keep_last. */
mmc_status mmc_trainer_save(mmc_trainer *t);
/* The whole run: steps, progress bar / log lines, metrics.jsonl, TensorBoard events,
 * checkpoints every save_every and at the end, loss/lr plot at each checkpoint. */
mmc_status mmc_trainer_run(mmc_trainer *t);
int64_t mmc_trainer_step_count(const mmc_trainer *t);
/* This process's data-parallel rank (0 in a single process); only rank 0 reports. */
int mmc_trainer_rank(const mmc_trainer *t);
/* Every model parameter (the weights as the forward sees them) with its HF name. */
int mmc_trainer_params(mmc_trainer *t, mmc_tensor ***params, const char *(**names));
/* Number of trainable parameters and bytes of optimizer state (m, v, masters). */
void mmc_trainer_memory(const mmc_trainer *t, int64_t *trainable, int64_t *state_bytes);

/* Latest complete checkpoint in dir: its step (0 and MMC_ERR_NOT_FOUND if none). */
mmc_status mmc_checkpoint_latest(const char *dir, int64_t *step, char *path, size_t cap);

/* ------------------------------------------------------------------ loss helpers
 * Causal-LM loss as transformers computes it: labels [B, T] are shifted left by one
 * (position t is scored against labels[t + 1]), -100 ignored; returns the SUM of the token
 * losses times `scale` (the trainer passes 1 / label tokens of the global batch) as a scalar,
 * and the number of scored tokens in *n_scored. logits [B, T, V] f32. */
mmc_tensor *mmc_causal_lm_loss(mmc_ctx *ctx, mmc_tensor *logits, const int32_t *labels,
                               double scale, int64_t *n_scored);
/* The same with tensor parallelism: logits [B, T, V/tp] are this rank's vocabulary slice from
 * vocab_start (vocab-parallel cross-entropy, mmc_tp.h); the same scalar on every rank of tp. */
struct mmc_comm;
/* The 1-D positions of a VLM micro-batch's rows [T] (each packed segment from 0) and its attention
 * (causal; packed: block-diagonal, the padding tail one more block), as mmc_embeds_causal_lm_loss uses. */
mmc_tensor *mmc_embeds_positions(mmc_ctx *ctx, const mmc_batch *b);
mmc_attn_opts mmc_embeds_attn(mmc_ctx *ctx, const mmc_batch *b);
/* The language-model half of a VLM's training loss (LLaVA, InternVL): input embeddings x
 * [B, T, C] (image features already in place) through the decoder with 1-D positions that
 * restart at each packed segment (b->cu_seqlens; block-diagonal causal attention, the padding
 * tail one more block), then the causal-LM loss over b->labels as mmc_causal_lm_loss. */
mmc_tensor *mmc_embeds_causal_lm_loss(mmc_ctx *ctx, mmc_qwen2 *lm, mmc_tensor *x, const mmc_batch *b, double scale,
                                      int64_t *n_scored);
/* Its second half: the decoder's output x [B, T, C] through the lm_head (only the rows whose next
 * label is scored; under tensor parallelism the vocab-parallel loss on this rank's slice) into the
 * causal-LM loss over b->labels. */
mmc_tensor *mmc_hidden_causal_lm_loss(mmc_ctx *ctx, mmc_qwen2 *lm, mmc_tensor *x, const mmc_batch *b, double scale,
                                      int64_t *n_scored);
mmc_tensor *mmc_causal_lm_loss_tp(mmc_ctx *ctx, struct mmc_comm *tp, int64_t vocab_start, mmc_tensor *logits,
                                  const int32_t *labels, double scale, int64_t *n_scored);
/* Scored tokens of labels [B, T] after the shift. */
int64_t mmc_count_label_tokens(const int32_t *labels, int64_t B, int64_t T);

/* Text Qwen2 causal-LM loss for one micro-batch (uses position_ids plane 0 and cu_seqlens). */
mmc_tensor *mmc_qwen2_lm_loss(mmc_ctx *ctx, mmc_qwen2 *m, const mmc_batch *b, double scale,
                              int64_t *n_scored);
/* Qwen2-VL causal-LM loss for one micro-batch of the data pipeline (padded rows, or one packed
 * row with cu_seqlens; M-RoPE positions computed per row / segment unless the batch has them). */
mmc_status mmc_qwen2_vl_batch_loss(mmc_ctx *ctx, mmc_qwen2_vl *m, const mmc_batch *b, double scale,
                                   mmc_tensor **loss, int64_t *n_scored);
/* A data-pipeline micro-batch as the Qwen2-VL forward takes it: ids [B, T] (returned) and its
 * images / videos in *media (pixel values copied into ctx's arena). */
mmc_tensor *mmc_qwen2_vl_batch_media(mmc_ctx *ctx, const mmc_batch *b, mmc_vl_media *media);
/* LLaVA causal-LM loss for one micro-batch of the data pipeline (llava_train.c): pixel_values
 * [n_images, 3 * S * S] (CLIPImageProcessor's, one row per image), their features in place of
 * the <image> tokens (gradients through the projector, and the tower unless frozen), plain 1-D positions
 * (restarting at each packed segment). */
struct mmc_llava;
struct mmc_comm;
/* Its input embeddings [B, T, C] alone (the features spliced in), for the pipeline's first stage and
 * context parallelism; cp non-NULL: the features' gradient is summed over that group in backward
 * (mmc_cp_sum_grad: each rank of a context-parallel group scores only its shard's rows). */
mmc_status mmc_llava_batch_embeds(mmc_ctx *ctx, struct mmc_llava *m, const mmc_batch *b, struct mmc_comm *cp,
                                  mmc_tensor **x);
mmc_status mmc_llava_batch_loss(mmc_ctx *ctx, struct mmc_llava *m, const mmc_batch *b, double scale,
                                mmc_tensor **loss, int64_t *n_scored);
/* Qwen2.5-Omni thinker causal-LM loss for one padded micro-batch of the data pipeline
 * (omni_train.c): audio features and images through the frozen encoders into the <|AUDIO|> /
 * <|IMAGE|> rows, TMRoPE positions per row. */
struct mmc_omni;
mmc_status mmc_omni_batch_loss(mmc_ctx *ctx, struct mmc_omni *m, const mmc_batch *b, double scale,
                               mmc_tensor **loss, int64_t *n_scored);
/* InternVL (HF-native) causal-LM loss for one micro-batch (internvl_train.c): pixel_values
 * [n_tiles, 3 * s * s] (the processor's tiles of every image, in order), their projected
 * features in place of the <IMG_CONTEXT> tokens (gradients through the projector and the LM;
 * the InternViT tower frozen), plain 1-D positions restarting at each packed segment. */
struct mmc_internvl;
mmc_status mmc_internvl_batch_embeds(mmc_ctx *ctx, struct mmc_internvl *m, const mmc_batch *b, struct mmc_comm *cp,
                                     mmc_tensor **x);   /* as mmc_llava_batch_embeds */
mmc_status mmc_internvl_batch_loss(mmc_ctx *ctx, struct mmc_internvl *m, const mmc_batch *b, double scale,
                                   mmc_tensor **loss, int64_t *n_scored);
/* Save a text Qwen2 as an HF directory's model.safetensors (model.* + lm_head.weight), in
 * dtype dt (F32 / BF16). */
mmc_status mmc_qwen2_save_weights(const mmc_qwen2 *m, const char *path, mmc_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
