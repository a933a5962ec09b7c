/* mmc_embed.h — dual encoders for cross-modal retrieval: CLIP (transformers' CLIPModel) and
 * SigLIP (SiglipModel: pooled text at the last position through `head`, images through the
 * attention-pooling head, logits_per_image = exp(logit_scale) img @ txt^T + logit_bias, read as
 * sigmoid probabilities; texts padded to max_length 64 as SiglipProcessor(padding="max_length")) as a
 * whole, its image and text towers each with their projection into one embedding space and
 * the learned temperature, behind one interface (`mmc embed`, `mmc eval --task retrieval`).
 *
 *   image_embeds = normalize(visual_projection(post_layernorm(vision(pixels)[:, 0])))   [N, D]
 *   text_embeds  = normalize(text_projection(final_layer_norm(text(ids))[eos]))         [M, D]
 *   logits_per_image = exp(logit_scale) * image_embeds @ text_embeds^T                  [N, M]
 *
 * Images go through the model folder's CLIPImageProcessor, texts through its CLIP tokenizer
 * (truncated to model_max_length, 77), exactly as CLIPProcessor prepares them. */
#ifndef MMC_EMBED_H
#define MMC_EMBED_H

#include "mmc.h"
#include "mmc_image.h"
#include "mmc_vlproc.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_dual_encoder mmc_dual_encoder;

/* A CLIPModel or SiglipModel folder (config.json model_type "clip" / "siglip", safetensors, tokenizer.json, the image
 * processor's config). Errors name the file and key; a folder of another model type is
 * MMC_ERR_UNSUPPORTED saying which types embed. dir may also be a PEFT adapter folder (a LoRA checkpoint of
 * `mmc train`): its base_model_name_or_path with the adapter attached. */
mmc_status mmc_dual_encoder_load(const char *dir, mmc_dual_encoder **out);
void mmc_dual_encoder_free(mmc_dual_encoder *m);
const char *mmc_dual_encoder_family(const mmc_dual_encoder *m);   /* "clip" or "siglip" */
int64_t mmc_dual_encoder_dim(const mmc_dual_encoder *m);           /* D: projection_dim */
double mmc_dual_encoder_logit_scale(const mmc_dual_encoder *m);    /* exp(logit_scale) */
int64_t mmc_dual_encoder_param_count(const mmc_dual_encoder *m);
/* The image processor in use (its resize_mode picks PIL's or torchvision's resize). */
mmc_clip_proc *mmc_dual_encoder_image_proc(mmc_dual_encoder *m);

/* n images -> out [n, D], L2-normalised (through the tower 16 at a time). */
mmc_status mmc_dual_encoder_embed_images(mmc_dual_encoder *m, const mmc_image *imgs, int n, float *out);
/* n texts -> out [n, D], L2-normalised. */
mmc_status mmc_dual_encoder_embed_texts(mmc_dual_encoder *m, const char *const *texts, int n, float *out);
/* pixel_values [n, 3, H, W] as the processor makes them -> out [n, D] (normalised). */
mmc_status mmc_dual_encoder_embed_pixels(mmc_dual_encoder *m, const mmc_tensor *pixel_values, float *out);

/* ids [n, T] i32 (as the model's processor makes them) and mask [n, T] or NULL -> out [n, D], normalised. */
mmc_status mmc_dual_encoder_embed_ids(mmc_dual_encoder *m, const mmc_tensor *ids, const mmc_tensor *mask, float *out);
/* SigLIP's learned bias (logit_bias); 0 for CLIP. */
double mmc_dual_encoder_logit_bias(const mmc_dual_encoder *m);
/* true where the model is trained with the sigmoid loss (SigLIP): its probabilities are
 * sigmoid(logits_per_image) per pair, not a softmax over the texts. */
bool mmc_dual_encoder_sigmoid(const mmc_dual_encoder *m);
/* logits_per_image [n, k] = img [n, D] @ txt[k, D]^T * exp(logit_scale) + logit_bias */
void mmc_dual_encoder_logits(const mmc_dual_encoder *m, const float *img, int64_t n, const float *txt, int64_t k,
                             float *logits);

/* ---------------------------------------------------------------- SigLIP's tokenizer
 * SiglipTokenizer from a folder's spiece.model and tokenizer_config.json (src/tokenizer/siglip_spm.c):
 * canonicalize_text, SentencePiece's normalizer and Unigram, </s>, padding="max_length". A
 * malformed or truncated spiece.model is MMC_ERR_FORMAT naming the file. */
typedef struct mmc_siglip_tokenizer mmc_siglip_tokenizer;
mmc_status mmc_siglip_tokenizer_load(const char *dir, mmc_siglip_tokenizer **out);
void mmc_siglip_tokenizer_free(mmc_siglip_tokenizer *t);
int mmc_siglip_tokenizer_model_max_length(const mmc_siglip_tokenizer *t);   /* 64 by default */
int32_t mmc_siglip_tokenizer_vocab_size(const mmc_siglip_tokenizer *t);
/* tokenizer(text, padding="max_length", max_length=L, truncation=True): ids[L] (at most L - 1
 * pieces, </s>, then pad_token), mask[L] (may be NULL), *n_real (may be NULL) the unpadded length. */
mmc_status mmc_siglip_tokenizer_encode_padded(const mmc_siglip_tokenizer *t, const char *text, int max_length,
                                              int32_t *ids, int32_t *mask, int *n_real);

/* ---------------------------------------------------------------- contrastive losses
 * The objectives of CLIPModel / SiglipModel.forward(return_loss=True) over a batch of n
 * (image i, text i) pairs and their gradients (src/train/contrastive.c); `mmc train` on a CLIPModel
 * folder (src/train/trainer_contrastive.c) trains with them. */
typedef enum { MMC_CONTRASTIVE_CLIP, MMC_CONTRASTIVE_SIGLIP } mmc_contrastive_kind;
typedef struct {
    double loss;
    double d_logit_scale;   /* w.r.t. the logit_scale parameter (the log of the scale) */
    double d_logit_bias;    /* SigLIP; 0 for CLIP */
    float *d_img, *d_txt;   /* caller's [n, D] buffers for the gradients (NULL: not wanted) */
} mmc_contrastive_out;
/* img, txt [n, D]: the pooled projections before the L2 normalisation (the model normalises);
 * logit_scale: the parameter (the scale is its exp); logit_bias ignored for CLIP. */
mmc_status mmc_contrastive_loss(mmc_contrastive_kind kind, const float *img, const float *txt, int64_t n, int64_t D,
                                double logit_scale, double logit_bias, mmc_contrastive_out *o);

/* ---------------------------------------------------------------- contrastive training (CLIP / SigLIP)
 * mmc_dual_encoder_load with f32 weights flagged MMC_PARAM | MMC_REQUIRES_GRAD. */
mmc_status mmc_dual_encoder_load_trainable(const char *dir, mmc_dual_encoder **out);
/* Up to cap weights and their checkpoint names (CLIPModel's); returns the total count. */
int mmc_dual_encoder_params(mmc_dual_encoder *m, mmc_tensor **params, const char **names, int cap);
/* The linears LoRA can adapt, under the PEFT module names of CLIPModel / SiglipModel:
 * "text_model.encoder.layers.N.self_attn.{q,k,v,out}_proj", "...mlp.fc1", "...mlp.fc2", the same under
 * "vision_model.", and CLIP's "visual_projection" / "text_projection", SigLIP's "text_model.head" /
 * "vision_model.head.mlp.fc1" / "...fc2" (ml is appended to; the caller frees it). SigLIP's
 * "vision_model.head.attention.out_proj" (inside nn.MultiheadAttention) is not listed. */
struct mmc_module_list;
mmc_status mmc_dual_encoder_linears(mmc_dual_encoder *m, struct mmc_module_list *ml);
mmc_tensor *mmc_dual_encoder_logit_scale_param(mmc_dual_encoder *m);   /* [] (SigLIP [1]) */
mmc_tensor *mmc_dual_encoder_logit_bias_param(mmc_dual_encoder *m);    /* SigLIP [1]; NULL for CLIP */
/* pooled projections before normalisation, graph kept: img [n, D] from pixel_values, txt [n, D] from ids/mask */
mmc_status mmc_dual_encoder_project(mmc_ctx *ctx, mmc_dual_encoder *m, const mmc_tensor *pixel_values,
                                    const mmc_tensor *ids, const mmc_tensor *mask, mmc_tensor **img, mmc_tensor **txt);
/* CLIPProcessor(text, padding=True, truncation=True): ids / mask [n, longest] i32; SigLIP: padding="max_length"
 * (caller frees) */
mmc_status mmc_dual_encoder_tokenize(mmc_dual_encoder *m, const char *const *texts, int n, mmc_tensor **ids,
                                     mmc_tensor **mask);

/* The training pairs of an image-caption JSONL (the retrieval format below), each image with its
 * first caption; relative image paths joined to dir (NULL: as written). Errors name what:line. */
typedef struct {
    int n;
    char **image, **caption;
} mmc_contrastive_pairs;
mmc_status mmc_contrastive_pairs_parse(const char *text, size_t len, const char *what, const char *dir,
                                       mmc_contrastive_pairs *p);
void mmc_contrastive_pairs_free(mmc_contrastive_pairs *p);

/* ---------------------------------------------------------------- retrieval evaluation
 * An image-caption JSONL: one object per line, {"image": PATH, "caption": TEXT} or {"image":
 * PATH, "captions": [TEXT, ...]} (relative paths from image_root, else the file's folder).
 * Image -> text: an image is a hit at K when any of its own captions ranks in its top K among
 * all captions; text -> image: a caption when its image ranks in its top K among all images
 * (clip_benchmark's zero-shot retrieval protocol). Ties keep the earlier index first. */
typedef struct {
    const char *model_dir, *data_path, *image_root;
    int64_t limit;                 /* first N lines (0: all) */
    int64_t max_image_pixels;      /* 0: mmc's default (PIL's limit) */
    int image_backend;             /* mmc_vlproc_resize_mode */
    FILE *progress;                /* a progress line per batch; NULL: quiet */
} mmc_retrieval_opts;

typedef struct {
    int64_t images, captions;
    double i2t_recall[3], t2i_recall[3];   /* at K = 1, 5, 10 */
    int64_t *i2t_rank, *t2i_rank;          /* 0-based rank of the best own caption / the own image */
} mmc_retrieval_result;

mmc_status mmc_retrieval_eval(const mmc_retrieval_opts *o, mmc_retrieval_result *r);
void mmc_retrieval_result_free(mmc_retrieval_result *r);

#ifdef __cplusplus
}
#endif
#endif /* MMC_EMBED_H */
