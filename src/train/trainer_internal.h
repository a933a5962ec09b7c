/* trainer_internal.h — what trainer.c, checkpoint.c, tb.c and plot.c share: the trainer
 * struct, the built-in batch sources, the TensorBoard event writer and the loss/lr plot. */
#ifndef MMC_TRAINER_INTERNAL_H
#define MMC_TRAINER_INTERNAL_H

#include "mmc_trainer.h"
#include "mmc_train.h"
#include "mmc_parallel.h"
#include "mmc_dp.h"
#include "mmc_tokenizer.h"
#include "mmc_diffusion.h"
#include "mmc_llava.h"
#include "mmc_internvl.h"
#include "mmc_wan_t2v.h"

#include <stdio.h>

/* Built-in batch sources until the data pipeline's loader is wired in:
 *  - FIXED: data.train is a .safetensors with input_ids [N, T] (i32/i64) and optionally
 *    labels [N, T]; micro-batch k takes rows (k*mb .. k*mb+mb-1) mod N. For a VL model it may
 *    also hold one image per row: pixel_values [Np, P] and image_grid_thw [N, 3].
 *  - SYNTHETIC: data.train "synthetic": rows of (start + t*stride) mod V, seeded per sample.
 * The state is the number of micro-batches consumed (saved in checkpoints). */
/*  - LOADER: data.train is a JSON/JSONL dataset read by the data pipeline (mmc_data.h); the
 *    state is the loader's (epoch, position, batch in window, skipped). */
/*  - FLUX: a diffusion training set cached by trainer_flux.c; a micro-batch names its samples
 *    (sample_index .. + B - 1), the loss function draws the rest. */
typedef enum { SRC_FIXED, SRC_SYNTHETIC, SRC_LOADER, SRC_FLUX } src_kind;
typedef struct {
    src_kind kind;
    int32_t *ids, *labels;     /* FIXED: [N, T] */
    float *pixels;             /* FIXED with images (VL): pixel_values [Np, patch_dim], or NULL */
    int64_t *grid, *patch_off; /* image_grid_thw [N, 3] (one image per row); patch offsets [N + 1] */
    int64_t patch_dim;
    int64_t N, T, vocab, mb;
    uint64_t seed;
    int64_t position;          /* micro-batches consumed */
    mmc_loader *loader;        /* LOADER */
} batch_src;

typedef struct mmc_tb mmc_tb;
mmc_status mmc_tb_open(const char *dir, mmc_tb **out);
mmc_status mmc_tb_scalar(mmc_tb *tb, const char *tag, int64_t step, double value);
/* The PNG file at png_path as an image summary (TensorBoard's Images tab). */
mmc_status mmc_tb_image(mmc_tb *tb, const char *tag, int64_t step, const char *png_path, int width, int height);
mmc_status mmc_tb_flush(mmc_tb *tb);
void mmc_tb_close(mmc_tb *tb);
/* Masked CRC32C as TFRecord uses it (exposed for tests). */
uint32_t mmc_tb_masked_crc32c(const void *data, size_t n);

/* PNG with two panels (loss, lr) against step. MMC_ERR_UNSUPPORTED if built without cairo. */
mmc_status mmc_plot_loss_lr(const char *path, const int64_t *steps, const double *loss,
                            const double *lr, int n);

struct mmc_trainer {
    const mmc_run_config *cfg;
    mmc_qwen2 *lm;             /* the language model (vl->lm for a VL model) */
    mmc_qwen2_vl *vl;          /* Qwen2-VL / Qwen2.5-VL, or NULL for a text Qwen2 */
    mmc_llava *llava;          /* LLaVA-1.5 (lm = llava->lm), or NULL */
    struct mmc_omni *omni;     /* Qwen2.5-Omni thinker (lm = omni->lm; omni_train.c), or NULL */
    mmc_tensor **omni_views;   /* its vision q / k / v views (mmc_omni_params) */
    int n_omni_views;
    mmc_whisper_fe omni_fe;    /* its WhisperFeatureExtractor (the data pipeline's) */
    mmc_internvl *internvl;    /* InternVL, HF-native layout (lm = internvl->lm), or NULL */
    mmc_tokenizer *tok;        /* for the data pipeline (VL with JSON/JSONL data) */
    mmc_data_opts dopts;
    mmc_lora_set *lora;        /* LoRA adapters (model.lora.r > 0), else NULL */
    char **lora_names;         /* "<module>.lora_A.weight" / ".lora_B.weight" per lora param */
    int n_lora_names;
    int64_t quant_numel;       /* QLoRA: elements of the NF4-quantised base weights */
    int64_t quant_dense_bytes; /* their bytes at model.dtype before quantisation */
    int64_t quant_nf4_bytes;   /* and as NF4 codes + absmax scales */       /* data section mapped onto the pipeline's options */
    char src_dir[2048];        /* where config.json / tokenizer files are copied from ("" if none) */
    char config_src[2200];     /* where config.json came from (for messages) */
    char *config_text;         /* its contents, written into every checkpoint */
    size_t config_len;
    int n_params;
    mmc_tensor **params;       /* model parameters (forward's view) */
    const char **names;        /* HF names (with model. prefix) */
    char **name_store;
    /* optimizer side: fp32 tensors AdamW updates; for bf16 matrices a master copy */
    int n_opt;
    int n_frozen;              /* untrained parameters (ZeRO-3 shards them) */
    mmc_tensor **opt;          /* fp32 (master or the param itself) */
    mmc_tensor **opt_model;    /* the model tensor to refresh after a step (== opt when f32) */
    const char **opt_names;
    mmc_adamw adamw;
    mmc_schedule sched;
    mmc_ctx *ctx;
    mmc_rng rng;
    int64_t step;
    batch_src src;
    /* history for the plot */
    int64_t *h_step;
    double *h_loss, *h_lr;
    int n_hist, cap_hist;
    /* data parallelism (src/parallel): the world, this rank, and the gradient reducer */
    mmc_comm *world;
    int rank, world_size;
    bool owns_dist;            /* this trainer started the runtime (and finalizes it) */
    mmc_dp *dp;
    /* tensor parallelism (mmc_tp.h): the world cut into tp groups (tensor fastest) and dp
     * replicas; data parallelism runs over dpc (== world at tp 1). rank / world_size stay the
     * world's: world rank 0 prints and writes. */
    mmc_dist_groups groups;
    bool have_groups;
    mmc_comm *tpc, *dpc;       /* tpc NULL at tp 1 */
    int tp_size, dp_rank, dp_size;
    /* context parallelism (mmc_cp.h): cp_size ranks share each micro-batch, one sequence shard
     * each; cpc NULL at cp 1 (the dp replicas are world / cp_size, over dpc) */
    mmc_comm *cpc;
    int cp_size;
    /* expert parallelism (mmc_ep.h): epc the group sharing each MoE layer's experts (consecutive
     * dp ranks), edpc the ranks holding the same experts; NULL at expert_parallel 1. ep_split [n_opt]:
     * 0 for a routed expert's tensor (its norm part summed over epc), -1 otherwise. */
    mmc_comm *epc, *edpc;
    signed char *ep_split;
    int64_t *moe_tokens;       /* [n_sparse * E] the last step's tokens per (layer, expert), all ranks */
    signed char *opt_split;    /* [n_opt] with tp: each trained tensor's split dim, or -1 */
    signed char *lora_split;   /* [lora->n_params] with tp: split dim of each LoRA factor, or -1 */
    bool *lora_partial;        /* [lora->n_params] with tp: its gradient is partial (all-reduced over tp) */
    bool *partial_sel;         /* [n_opt] ZeRO >= 1 with tp: the partial gradients (sp, LoRA, hetero tower) */
    /* per-modality plan (mmc_hetero.h, parallel.vision data-parallel while the LM is at tp > 1): the
     * trained tensors of the vision tower (and its LoRA factors), whose gradients are partial per tp
     * rank (each encoded its share of the images): summed over the tp group after the dp reduction */
    int *hetero_idx, n_hetero;  /* indices into opt */
    float *hetero_buf;          /* their gradients, packed for one all-reduce */
    int64_t hetero_numel;
    /* pipeline parallelism (trainer_pp.c): this rank's stage of pp_size, holding pp_v chunks of
     * decoder layers [pp_l0[c], pp_l1[c]) (interleaved: virtual stage c pp_size + pp_rank);
     * NULL / 1 without */
    struct mmc_pp *pp;
    int pp_size, pp_rank, pp_v;
    int64_t pp_l0[16], pp_l1[16];
    bool pp_tied;              /* tied embeddings split over the first and the last stage */
    bool pp_ep_full;           /* saving: the tensors are expert parallelism's gathered view */
    struct mmc_pp_hetero *pph; /* parallel.vision data-parallel under pp (trainer_pp_hetero.c), or NULL */
    float **ema;               /* training.ema_decay > 0: an EMA of each opt[i] (fp32), else NULL */
    bool contrastive;          /* a CLIPModel / SiglipModel folder: trainer_contrastive.c runs the whole loop */
    bool contrastive_resume;   /* ... from the latest checkpoint-N of training.output_dir (--resume) */
    /* diffusion training (trainer_flux.c): the transformer and its cached training set */
    mmc_flux *flux;
    mmc_sd3 *sd3;              /* or an SD3 / SD3.5 transformer (a StableDiffusion3Pipeline folder) */
    mmc_unet *unet;            /* or an SDXL / SD 1.x UNet (StableDiffusion(XL)Pipeline folders, DDPM objective) */
    mmc_hunyuan_dit *hy;       /* or a HunyuanDiT2DModel (a HunyuanDiTPipeline folder, DDPM objective) */
    struct mmc_fm_data *fm;
    mmc_wan *wan;              /* or a Wan2.1 text-to-video transformer (a WanPipeline folder; trainer_wan.c) */
    struct mmc_wan_data *wd;   /* its cached training set */
};

/* a diffusion transformer trains (trainer_flux.c), not a language model */
static inline bool mmc_trainer_diffusion(const mmc_trainer *t) {
    return t->flux || t->sd3 || t->unet || t->wan || t->hy;
}

/* trainer_contrastive.c: CLIP / SigLIP dual encoders (model_type clip / siglip) */
bool mmc_trainer_is_contrastive_dir(const char *dir);
mmc_status mmc_trainer_contrastive_run(mmc_trainer *t);

/* trainer_flux.c */
typedef struct mmc_fm_data mmc_fm_data;
bool mmc_trainer_is_flux_dir(const char *dir);
mmc_status mmc_trainer_flux_load(mmc_trainer *t, const char *ckpt);
mmc_status mmc_trainer_flux_params(mmc_trainer *t);
mmc_status mmc_trainer_flux_data_open(mmc_trainer *t);
void mmc_fm_data_free(mmc_fm_data *f);
mmc_status mmc_trainer_flux_loss(mmc_trainer *t, const mmc_batch *b, double scale, mmc_tensor **loss);
mmc_status mmc_trainer_flux_save(mmc_trainer *t, const char *dir);
bool mmc_trainer_flux_validation_due(const mmc_trainer *t);
mmc_status mmc_trainer_flux_validate(mmc_trainer *t, char *path, size_t cap);

/* trainer_wan.c (called from trainer_flux.c's entry points on a WanPipeline / WanImageToVideoPipeline folder) */
typedef struct mmc_wan_data mmc_wan_data;
bool mmc_trainer_is_wan_dir(const char *dir);   /* a WanPipeline or WanImageToVideoPipeline folder */
mmc_status mmc_trainer_wan_load(mmc_trainer *t, const char *ckpt);
mmc_status mmc_trainer_wan_data_open(mmc_trainer *t);
void mmc_wan_data_free(mmc_wan_data *d);
mmc_status mmc_trainer_wan_loss(mmc_trainer *t, const mmc_batch *b, double scale, mmc_tensor **loss);
mmc_status mmc_trainer_wan_validate(mmc_trainer *t, char *path, size_t cap);
/* (exposed for test_wan) one training clip: F frames sampled uniformly, resized + centre-cropped to
 * res, in [-1, 1] -> x [3, F, res, res] (and, when first / last are not NULL, the first / last sampled
 * frame's crop as an image: image-to-video's first frame, first-last-frame's last one); its normalised
 * latent distribution */
mmc_status mmc_trainer_wan_load_video(const char *path, int F, int res, float *x, mmc_image *first, mmc_image *last);
mmc_status mmc_trainer_wan_encode_clip(mmc_wan_vae *vae, const float *x, int F, int res, float *mean, float *std,
                                       float *lv);

/* trainer_pp.c */
mmc_status mmc_trainer_pp_layout(mmc_trainer *t);
mmc_status mmc_trainer_pp_setup(mmc_trainer *t);
/* LLaVA / InternVL: whether this stage keeps the parameter (the tower and projector: the first stage only) */
bool mmc_trainer_pp_keep(const mmc_trainer *t, const char *name);
mmc_status mmc_trainer_pp_step(mmc_trainer *t, const mmc_batch *mbs, int64_t M, double scale, double *loss);
mmc_status mmc_trainer_pp_clip(mmc_trainer *t, double *norm);
mmc_status mmc_trainer_pp_save(mmc_trainer *t);
mmc_status mmc_trainer_pp_zero(mmc_trainer *t);   /* ZeRO-1/2/3 over each stage's data-parallel group */

/* trainer_pp_hetero.c: the vision tower data-parallel over all ranks, the language model pipelined */
typedef struct mmc_pp_hetero mmc_pp_hetero;
/* the gradients of opt_model[idx[0 .. n-1]] summed over g through buf (trainer.c; skip_env: a test hook or NULL) */
mmc_status mmc_trainer_sum_grads(mmc_trainer *t, mmc_comm *g, const int *idx, int n, float *buf, const char *skip_env);
mmc_status mmc_trainer_pp_hetero_setup(mmc_trainer *t);   /* after the optimizer's tensors are known */
mmc_status mmc_trainer_pp_hetero_forward(mmc_trainer *t, const mmc_batch *mbs, int64_t M);   /* before mmc_pp_run */
mmc_status mmc_trainer_pp_hetero_backward(mmc_trainer *t);   /* after it, before the dp reduction */
void mmc_trainer_pp_hetero_abort(mmc_trainer *t);
void mmc_trainer_pp_hetero_free(mmc_trainer *t);
/* a tensor (by name) that is the tower's copy on a stage after the first: left out of the norm and the
 * checkpoint (the first stage's counts) */
bool mmc_trainer_pp_hetero_copy(const mmc_trainer *t, const char *name);

/* trainer_cp.c: context parallelism (mmc_cp.h) */
mmc_status mmc_cp_trainer_layout(mmc_trainer *t);
mmc_status mmc_cp_trainer_check(mmc_trainer *t);
mmc_status mmc_cp_trainer_reduce(mmc_trainer *t, double *loss);
/* data.eval under cp: this rank's shard of batch b -> its summed NLL and scored tokens (forward only);
 * then the sums over the group */
mmc_status mmc_cp_trainer_eval_batch(mmc_trainer *t, const mmc_batch *b, double *nll, int64_t *tokens);
mmc_status mmc_cp_trainer_eval_sum(mmc_trainer *t, double *nll, int64_t *tokens);

/* trainer_ep.c: expert parallelism (mmc_ep.h) and MoE statistics */
typedef struct {
    mmc_tensor **params; const char **names; int n;                     /* the model's, swapped out */
    mmc_tensor **full; char (*full_names)[96]; const char **full_ptrs; int n_full;
    mmc_tensor **opt, **opt_model; const char **opt_names; int n_opt;   /* the optimizer's, swapped out */
    float **m, **v;
    mmc_tensor **fopt, **fopt_model; char (*fnames)[160]; const char **fptrs; float **fm, **fv; bool *own; int n_fopt;
} mmc_ep_swap;
mmc_status mmc_ep_trainer_groups(mmc_trainer *t);
mmc_status mmc_ep_trainer_setup(mmc_trainer *t);
mmc_status mmc_ep_trainer_reduce(mmc_trainer *t, double *loss);
/* The global gradient norm under expert parallelism (with or without tp): the experts' squares
 * summed over the ep group (and the tp group, which splits them), the tp-split dense tensors'
 * over tp, the replicated ones counted once. Collective over epc and tpc. */
mmc_status mmc_ep_trainer_grad_norm(mmc_trainer *t, double *norm);
mmc_status mmc_ep_trainer_to_full(mmc_trainer *t, mmc_ep_swap *sw);
void mmc_ep_trainer_to_local(mmc_trainer *t, mmc_ep_swap *sw);
mmc_status mmc_moe_trainer_stats(mmc_trainer *t, mmc_step_stats *s);
void mmc_moe_trainer_metrics(const mmc_trainer *t, const mmc_step_stats *s, char *buf, size_t cap);

/* checkpoint.c */
mmc_status mmc_trainer_restore(mmc_trainer *t, const char *ckpt_dir);
/* Checkpoints in phases, for ranks writing in parallel: begin (rank 0) makes the temporary
 * directory named by token; every rank writes its shard there; finish (rank 0) writes the rest
 * and renames it into place (token < 0: one process, begin included = mmc_trainer_save). */
void mmc_checkpoint_tmp_dir(const mmc_trainer *t, int64_t token, char *buf, size_t cap);
mmc_status mmc_checkpoint_begin(mmc_trainer *t, int64_t token);
mmc_status mmc_checkpoint_finish(mmc_trainer *t, int64_t token);
mmc_status mmc_rm_rf(const char *path);
mmc_status mmc_mkdir_p(const char *path);
/* from's bytes written atomically to to (mmc_write_file_atomic); errors name the file */
mmc_status mmc_copy_file(const char *from, const char *to);
/* ZeRO-3 without LoRA: checkpoints keep the trained parameters in the ranks' shards (no
 * model.safetensors; the untrained ones go to model.frozen.safetensors) */
/* ZeRO >= 1 checkpoints keep the moments in per-rank shard files, except under tensor
 * parallelism, whose checkpoints are gathered into full tensors (any layout reads them) */
static inline bool mmc_trainer_state_sharded(const mmc_trainer *t) {
    return t->dp && t->cfg->parallel.zero >= 1 && !t->tpc && !t->pp;   /* (pp: one gathered checkpoint) */
}
static inline bool mmc_trainer_params_in_shards(const mmc_trainer *t) {
    return t->dp && t->cfg->parallel.zero == 3 && !t->lora && !t->tpc && !t->pp;
}

#endif
