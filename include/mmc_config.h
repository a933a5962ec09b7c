/* mmc_config.h — the run configuration: one YAML file with the sections model, data,
 * parallel, optimizer and training drives `mmc train` (and, later, the distributed
 * launcher). Read through mmc_cfg_read's schema, so unknown keys, wrong types and
 * out-of-range values fail with file:line, the dotted key and the closest valid key;
 * `--set section.key=value` overrides are applied to the YAML tree before reading.
 *
 * The shape follows the field's habits (LLaMA-Factory / MindSpeed-MM / HF Trainer names):
 *   model:    {path | init, dtype, freeze, recompute, lora {r, alpha, dropout, targets},
 *              quantization {method, double_quant, block_size}}
 *   data:     {train, eval, image_root, max_pixels, min_pixels, max_image_pixels, seq_len, packing, truncation,
 *              batch_size, micro_batch_size, num_workers, prefetch, shuffle, strict,
 *              bucket_window, add_vision_id, resolution, aspect_ratio_buckets, num_frames}
 *   parallel: {data_parallel, tensor_parallel, sequence_parallel, pipeline_parallel, pipeline_layers,
 *             pipeline_virtual, context_parallel,
 *             context_parallel_mode, expert_parallel, zero, timeout, pipeline_schedule, pipeline_vision_stage,
 *             vision / audio / projector / language: {data_parallel, tensor_parallel,
 *             pipeline_parallel, context_parallel}}
 *   optimizer:{type, lr, weight_decay, betas, eps, schedule, warmup_steps, min_lr, grad_clip}
 *   training: {steps, seed, log_every, eval_every, save_every, keep_last, output_dir, threads}
 */
#ifndef MMC_CONFIG_H
#define MMC_CONFIG_H

#include "mmc.h"
#include "mmc_io.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MMC_RUN_F32 = 0, MMC_RUN_BF16 = 1 } mmc_run_dtype;
typedef enum { MMC_RECOMPUTE_NONE = 0, MMC_RECOMPUTE_FULL = 1, MMC_RECOMPUTE_ATTENTION = 2 } mmc_recompute;
typedef enum { MMC_QUANT_NONE = 0, MMC_QUANT_NF4 = 1 } mmc_quant_method;

/* Components that `model.freeze` may name. */
enum {
    MMC_FREEZE_VISION = 1u << 0,      /* vision_tower: patch embed + vision blocks */
    MMC_FREEZE_MERGER = 1u << 1,      /* merger: the vision -> LM projector */
    MMC_FREEZE_LM = 1u << 2,          /* language_model: decoder layers, final norm, lm_head */
    MMC_FREEZE_EMBED = 1u << 3,       /* embeddings: embed_tokens (and a tied lm_head) */
    MMC_FREEZE_AUDIO = 1u << 4,       /* audio: Qwen2.5-Omni's audio encoder (audio_tower) */
};

typedef struct {
    int64_t r;                        /* 0 = LoRA off */
    double alpha, dropout;
    mmc_str_list targets;             /* module names or patterns (q_proj, ...) */
    char *init;                       /* a PEFT adapter directory to start from (or NULL) */
} mmc_lora_cfg;

typedef struct {
    int method;                       /* mmc_quant_method */
    bool double_quant;
    int64_t block_size;               /* 64 (bitsandbytes) */
} mmc_quant_cfg;

typedef struct {
    char *path;                       /* HF model directory */
    char *init;                       /* config.json for random init (instead of path) */
    char *tokenizer;                  /* tokenizer/processor directory (default: path) */
    int dtype;                        /* mmc_run_dtype */
    mmc_str_list freeze;
    int recompute;                    /* mmc_recompute */
    int64_t recompute_layers;         /* the first N decoder layers (per pipeline stage); 0 = all */
    int64_t offload_layers;           /* the first N layers' saved activations in a mapped file; 0 = none */
    char *offload_dir;                /* its directory (NULL: $TMPDIR or /tmp) */
    mmc_lora_cfg lora;
    mmc_quant_cfg quantization;
    uint32_t freeze_mask;             /* derived from freeze */
} mmc_model_cfg;

/* Field names equal the YAML keys (and the data pipeline's mmc_data_opts). */
typedef struct {
    char *train, *eval, *image_root;
    int64_t max_pixels, min_pixels;
    int64_t max_image_pixels;   /* refuse image files past this many pixels (PIL's bomb limit) */
    int64_t seq_len;
    bool packing, truncation, shuffle, strict;
    int64_t batch_size, micro_batch_size;
    int64_t num_workers, prefetch;
    int64_t bucket_window;     /* padded: length-sorting window (0: 16 x micro; 1 keeps file order
                                  when shuffle is off) */
    bool add_vision_id;
    int64_t resolution;        /* diffusion: images resized (shorter side) and centre-cropped to this */
    int64_t num_frames;        /* diffusion (Wan): frames sampled uniformly from each video, 4k + 1 */
    char *aspect_ratio_buckets; /* diffusion: "h,w;h,w;..." (diffusers' --aspect_ratio_buckets): each image
                                 * resized to its nearest bucket, micro-batches of one bucket */
    int image_backend;         /* 0 pil (Pillow-exact resize) | 1 torchvision (transformers' fast processor) */
} mmc_data_cfg;

/* Diffusion training (model.path a diffusers FluxPipeline or StableDiffusion3Pipeline folder): diffusers' training-script
 * options of the same names. */
typedef struct {
    char *weighting_scheme;           /* none | logit_normal | mode | sigma_sqrt | cosmap */
    double logit_mean, logit_std, mode_scale;
    double guidance;                  /* guidance-embedding models: the scripts' --guidance_scale */
    int64_t max_sequence_length;      /* T5 tokens */
    char *validation_prompt;          /* an image of it every validation_every steps (and at the end) */
    int64_t validation_every, validation_steps;
    int64_t validation_seed;
    bool precondition_outputs;        /* SD3: the scripts' --precondition_outputs (default true): x0 target */
} mmc_flow_matching_cfg;

/* DDPM-objective training (model.path a StableDiffusionXLPipeline or StableDiffusionPipeline folder):
 * the options of diffusers' train_text_to_image(_lora)(_sdxl).py of the same names. Validation images
 * use flow_matching.validation_*. */
typedef struct {
    double snr_gamma;                 /* min-SNR loss weighting (0: off, plain MSE) */
    double noise_offset;              /* noise += noise_offset * randn(B, C, 1, 1) */
    char *prediction_type;            /* epsilon | v_prediction | sample; NULL: the scheduler's */
} mmc_diffusion_cfg;

/* One component's own layout in a per-modality plan (parallel.vision / audio / projector /
 * language; mmc_hetero.h); 0 = not given. */
typedef struct {
    int64_t data_parallel, tensor_parallel, pipeline_parallel, context_parallel;
} mmc_module_plan;

typedef struct {
    int64_t data_parallel, tensor_parallel, pipeline_parallel, zero;
    double timeout;                   /* seconds before a stuck collective aborts the job
                                       * (env MMC_DIST_TIMEOUT overrides) */
    bool sequence_parallel;           /* with tensor_parallel > 1: norms and residuals on sequence slices */
    mmc_str_list pipeline_layers;     /* decoder layers per pipeline stage, or the one keyword auto (also when
                                       * empty: from measured costs) or even (mmc_pp_layers_mode) */
    int64_t pipeline_virtual;         /* model chunks per pipeline rank (interleaved 1F1B; 1: plain) */
    int64_t context_parallel;         /* context-parallel ranks splitting each sequence (mmc_cp.h; 1: off) */
    int context_parallel_mode;        /* mmc_cp_mode: ulysses (0) | ring (1) */
    int64_t expert_parallel;          /* ranks splitting each MoE layer's experts (mmc_ep.h; 1: off); divides
                                       * data_parallel */
    int pipeline_schedule;            /* mmc_pp_schedule_kind: 1f1b (0; interleaved with pipeline_virtual > 1)
                                       * | dualpipev (1) */
    /* per-modality plans (mmc_hetero.h): a component's own tp / dp / pp / cp; language's are copied
     * into the fields above (the language model's plan is the job's) */
    mmc_module_plan vision, audio, projector, language;
    bool hetero;                      /* derived: the vision tower data-parallel over all ranks while the
                                       * language model is split at tensor_parallel > 1 */
    bool hetero_audio;                /* derived: the audio encoder (parallel.audio) data-parallel over all
                                       * ranks while the language model is at tensor_parallel > 1 */
    int64_t tp_comm_chunks;           /* row-parallel all-reduce in chunks overlapped with the GEMM (1: off) */
    bool pipeline_early_recv;         /* pipeline receives posted ahead of their op (mmc_pp_set_early_recv) */
    bool pipeline_vision_stage;       /* Qwen2-VL: stage 0 runs only the vision tower, merger and embedding;
                                       * the decoder layers go to stages 1 .. P-1 (1F1B only) */
} mmc_parallel_cfg;
/* How parallel.pipeline_layers cuts the stages: from the layers' measured costs (auto: the keyword, or
 * the key absent), evenly (even: P must divide the layers), or the list's counts. */
enum { MMC_PP_LAYERS_AUTO = 0, MMC_PP_LAYERS_EVEN = 1, MMC_PP_LAYERS_LIST = 2 };
int mmc_pp_layers_mode(const mmc_parallel_cfg *p);
typedef enum { MMC_PP_SCHED_1F1B = 0, MMC_PP_SCHED_DUALPIPEV = 1 } mmc_pp_schedule_kind;

typedef enum { MMC_OPT_ADAMW = 0 } mmc_opt_type;
typedef struct {
    int type;                         /* mmc_opt_type */
    double lr, weight_decay, eps, min_lr, grad_clip;
    mmc_str_list betas;               /* [beta1, beta2] as read; parsed into beta1/beta2 */
    double beta1, beta2;
    int schedule;                     /* mmc_sched_kind (constant, linear, cosine) */
    int64_t warmup_steps;
} mmc_optimizer_cfg;

typedef struct {
    int64_t steps, seed, log_every, eval_every, save_every, keep_last, threads;
    double ema_decay;                 /* 0: off; else an EMA of the trained weights (diffusers' EMAModel) */
    char *output_dir;
    int64_t gradient_accumulation;    /* derived: data.batch_size / data.micro_batch_size */
} mmc_training_cfg;

typedef struct {
    mmc_model_cfg model;
    mmc_data_cfg data;
    mmc_parallel_cfg parallel;
    mmc_optimizer_cfg optimizer;
    mmc_training_cfg training;
    mmc_flow_matching_cfg flow_matching;
    mmc_diffusion_cfg diffusion;
    char *file;                       /* the YAML path (for messages) */
} mmc_run_config;

/* Defaults for every field (what an empty section means). */
void mmc_run_config_defaults(mmc_run_config *c);
/* Parse YAML text (`what` names it in errors), apply "key.path=value" overrides, read
 * through the schema and validate cross-field rules. On error *c is freed. */
mmc_status mmc_run_config_parse(const char *text, size_t len, const char *what,
                                const char *const *sets, int n_sets, mmc_run_config *c);
mmc_status mmc_run_config_load(const char *path, const char *const *sets, int n_sets,
                               mmc_run_config *c);
void mmc_run_config_free(mmc_run_config *c);
/* The schema (for --help listings and docs): NULL-terminated top-level fields. */
const mmc_cfg_field *mmc_run_config_schema(void);
/* Print every key with its default and help ("model.dtype  f32|bf16  ..."). */
void mmc_run_config_print_keys(void *file);

#ifdef __cplusplus
}
#endif
#endif
