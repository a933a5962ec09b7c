/* config.c — the run configuration (mmc_config.h): the schema of the five sections, the
 * defaults, `--set` overrides, and the cross-field rules that a per-key schema cannot
 * express (path xor init, batch_size divisible by micro_batch_size, which parallel layouts
 * combine, ...). Every error names file:line and the dotted key;
 * unknown keys get the closest valid key (mmc_cfg_read). Defaults follow HF Trainer / LLaMA-Factory where they exist. */
#include "mmc_config.h"
#include "mmc_diffusion.h"
#include "mmc_image.h"
#include "mmc_train.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const k_dtypes[] = {"f32", "bf16", NULL};
static const char *const k_recompute[] = {"none", "full", "attention", NULL};   /* = mmc_recompute */
static const char *const k_quant[] = {"none", "nf4", NULL};
static const char *const k_cp_mode[] = {"ulysses", "ring", NULL};   /* = mmc_cp_mode */
static const char *const k_pp_sched[] = {"1f1b", "dualpipev", NULL};   /* = mmc_pp_schedule_kind */
static const char *const k_opt[] = {"adamw", NULL};
static const char *const k_sched[] = {"constant", "linear", "cosine", NULL};
static const char *const k_backends[] = {"pil", "torchvision", NULL};   /* = mmc_vlproc_resize_mode */
static const char *const k_components[] = {"vision_tower", "merger", "language_model", "embeddings", "audio"};
/* the per-modality plan's names (parallel.vision / projector / language) freeze the same components */
static const struct { const char *alias; int k; } k_component_alias[] = {{"vision", 0}, {"projector", 1}, {"language", 2}};

#define U (-1.0), (-2.0)  /* unchecked range (min > max) */
#define F(st, key, type, ...) {#key, type, offsetof(st, key), __VA_ARGS__}

static const mmc_cfg_field k_lora[] = {
    F(mmc_lora_cfg, r, MMC_CFG_INT, 0, 4096, NULL, NULL, "LoRA rank (0 = off)"),
    F(mmc_lora_cfg, alpha, MMC_CFG_FLOAT, 0, 1e6, NULL, NULL, "LoRA alpha (scale = alpha / r)"),
    F(mmc_lora_cfg, dropout, MMC_CFG_FLOAT, 0, 0.999, NULL, NULL, "dropout on the adapter input"),
    F(mmc_lora_cfg, targets, MMC_CFG_STR_LIST, U, NULL, NULL, "module names or patterns (q_proj, ...)"),
    F(mmc_lora_cfg, init, MMC_CFG_STR, U, NULL, NULL, "PEFT adapter directory to start from (its weights)"),
    {0},
};
static const mmc_cfg_field k_quantization[] = {
    F(mmc_quant_cfg, method, MMC_CFG_ENUM, U, k_quant, NULL, "none | nf4 (QLoRA: frozen base in NF4)"),
    F(mmc_quant_cfg, double_quant, MMC_CFG_BOOL, U, NULL, NULL, "quantise the block scales too"),
    F(mmc_quant_cfg, block_size, MMC_CFG_INT, 16, 4096, NULL, NULL, "NF4 block size (64)"),
    {0},
};
static const mmc_cfg_field k_model[] = {
    F(mmc_model_cfg, path, MMC_CFG_STR, U, NULL, NULL, "Hugging Face model directory to start from"),
    F(mmc_model_cfg, init, MMC_CFG_STR, U, NULL, NULL, "config.json to train from random init"),
    F(mmc_model_cfg, tokenizer, MMC_CFG_STR, U, NULL, NULL, "tokenizer/processor directory (default: path)"),
    F(mmc_model_cfg, dtype, MMC_CFG_ENUM, U, k_dtypes, NULL, "f32 | bf16 weights (fp32 master + state)"),
    F(mmc_model_cfg, freeze, MMC_CFG_STR_LIST, U, NULL, NULL,
      "components kept fixed: vision_tower (or vision), merger (or projector), language_model (or language), "
      "embeddings, audio (Qwen2.5-Omni's audio encoder)"),
    F(mmc_model_cfg, recompute, MMC_CFG_ENUM, U, k_recompute, NULL,
      "activation recompute: none | full (each decoder layer) | attention (only rope + attention core)"),
    F(mmc_model_cfg, recompute_layers, MMC_CFG_INT, 0, 1 << 20, NULL, NULL,
      "recompute only the first N decoder layers (of each pipeline stage); 0: all"),
    F(mmc_model_cfg, offload_layers, MMC_CFG_INT, 0, 1 << 20, NULL, NULL,
      "keep the saved activations of the first N decoder layers (of each stage) in a memory-mapped file"),
    F(mmc_model_cfg, offload_dir, MMC_CFG_STR, U, NULL, NULL, "directory of the offload file (default $TMPDIR or /tmp)"),
    F(mmc_model_cfg, lora, MMC_CFG_SECTION, U, NULL, k_lora, "LoRA adapters"),
    F(mmc_model_cfg, quantization, MMC_CFG_SECTION, U, NULL, k_quantization, "QLoRA base quantisation"),
    {0},
};
static const mmc_cfg_field k_data[] = {
    F(mmc_data_cfg, train, MMC_CFG_STR, U, NULL, NULL, "training set (JSON/JSONL; or a fixed batch .safetensors)"),
    F(mmc_data_cfg, eval, MMC_CFG_STR, U, NULL, NULL, "validation set"),
    F(mmc_data_cfg, image_root, MMC_CFG_STR, U, NULL, NULL, "directory relative image paths start from"),
    F(mmc_data_cfg, max_pixels, MMC_CFG_INT, 784, 1e9, NULL, NULL,
      "resize images above this many pixels (default: the model's image processor)"),
    F(mmc_data_cfg, min_pixels, MMC_CFG_INT, 784, 1e9, NULL, NULL,
      "resize images below this many pixels (default: the model's image processor)"),
    F(mmc_data_cfg, max_image_pixels, MMC_CFG_INT, 1, 1e12, NULL, NULL,
      "refuse image files with more pixels (decompression bombs; default PIL's limit)"),
    F(mmc_data_cfg, seq_len, MMC_CFG_INT, 8, 1 << 20, NULL, NULL, "tokens per row"),
    F(mmc_data_cfg, packing, MMC_CFG_BOOL, U, NULL, NULL, "pack samples into seq_len rows"),
    F(mmc_data_cfg, truncation, MMC_CFG_BOOL, U, NULL, NULL, "truncate samples longer than seq_len"),
    F(mmc_data_cfg, batch_size, MMC_CFG_INT, 1, 1 << 20, NULL, NULL, "global batch (samples per step)"),
    F(mmc_data_cfg, micro_batch_size, MMC_CFG_INT, 1, 1 << 20, NULL, NULL, "samples per forward/backward"),
    F(mmc_data_cfg, num_workers, MMC_CFG_INT, 0, 256, NULL, NULL, "loader threads"),
    F(mmc_data_cfg, prefetch, MMC_CFG_INT, 1, 1024, NULL, NULL, "prefetch queue depth (micro-batches)"),
    F(mmc_data_cfg, shuffle, MMC_CFG_BOOL, U, NULL, NULL, "shuffle every epoch (seeded)"),
    F(mmc_data_cfg, strict, MMC_CFG_BOOL, U, NULL, NULL, "fail on a bad sample instead of skipping it"),
    F(mmc_data_cfg, bucket_window, MMC_CFG_INT, 0, 1e7, NULL, NULL,
      "padded: samples sorted by length per window (0: 16 x micro_batch_size; 1: file order)"),
    F(mmc_data_cfg, add_vision_id, MMC_CFG_BOOL, U, NULL, NULL, "'Picture k: ' before each image (chat template)"),
    F(mmc_data_cfg, image_backend, MMC_CFG_ENUM, U, k_backends, NULL,
      "image resize: pil (Pillow-exact) | torchvision (transformers' default fast processor)"),
    F(mmc_data_cfg, aspect_ratio_buckets, MMC_CFG_STR, U, NULL, NULL,
      "diffusion: \"h,w;h,w;...\": each image resized to the bucket nearest its aspect ratio (diffusers' "
      "--aspect_ratio_buckets); micro-batches hold one bucket"),
    F(mmc_data_cfg, resolution, MMC_CFG_INT, 16, 1 << 16, NULL, NULL,
      "diffusion: training image size (shorter side resized, then centre-cropped square)"),
    F(mmc_data_cfg, num_frames, MMC_CFG_INT, 1, 1 << 14, NULL, NULL,
      "diffusion (Wan): frames sampled uniformly from each video (4k + 1)"),
    {0},
};
static const mmc_cfg_field k_flow_matching[] = {
    F(mmc_flow_matching_cfg, weighting_scheme, MMC_CFG_STR, U, NULL, NULL,
      "timestep density and loss weight: none | logit_normal | mode | sigma_sqrt | cosmap"),
    F(mmc_flow_matching_cfg, logit_mean, MMC_CFG_FLOAT, -100, 100, NULL, NULL, "logit_normal: mean"),
    F(mmc_flow_matching_cfg, logit_std, MMC_CFG_FLOAT, 0, 100, NULL, NULL, "logit_normal: std"),
    F(mmc_flow_matching_cfg, mode_scale, MMC_CFG_FLOAT, -100, 100, NULL, NULL, "mode: scale"),
    F(mmc_flow_matching_cfg, guidance, MMC_CFG_FLOAT, 0, 1000, NULL, NULL, "guidance value of guidance-embedding models"),
    F(mmc_flow_matching_cfg, max_sequence_length, MMC_CFG_INT, 1, 4096, NULL, NULL, "T5 tokens per caption"),
    F(mmc_flow_matching_cfg, validation_prompt, MMC_CFG_STR, U, NULL, NULL,
      "prompt of the validation images (output_dir/validation/step-N.png)"),
    F(mmc_flow_matching_cfg, validation_every, MMC_CFG_INT, 0, 1e12, NULL, NULL,
      "steps between validation images (0: only at the end, when a prompt is set)"),
    F(mmc_flow_matching_cfg, validation_steps, MMC_CFG_INT, 1, 1000, NULL, NULL, "denoising steps of a validation image"),
    F(mmc_flow_matching_cfg, validation_seed, MMC_CFG_INT, 0, 9.2e18, NULL, NULL, "seed of its initial noise"),
    F(mmc_flow_matching_cfg, precondition_outputs, MMC_CFG_BOOL, U, NULL, NULL,
      "SD3: turn the prediction into an x0 estimate, pred * (-sigma) + noisy, against x0 (the scripts' default)"),
    {0},
};
static const mmc_cfg_field k_diffusion[] = {
    F(mmc_diffusion_cfg, snr_gamma, MMC_CFG_FLOAT, 0, 1e6, NULL, NULL,
      "min-SNR weighting gamma (0: off): loss weight min(snr, gamma) / snr (epsilon), / (snr + 1) (v_prediction)"),
    F(mmc_diffusion_cfg, noise_offset, MMC_CFG_FLOAT, 0, 10, NULL, NULL, "offset noise: + noise_offset * randn(B, C, 1, 1)"),
    F(mmc_diffusion_cfg, prediction_type, MMC_CFG_STR, U, NULL, NULL,
      "epsilon | v_prediction | sample (default: the scheduler's)"),
    {0},
};
static const mmc_cfg_field k_module_plan[] = {
    F(mmc_module_plan, data_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL, "this component's data-parallel ranks"),
    F(mmc_module_plan, tensor_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL, "this component's tensor-parallel ranks"),
    F(mmc_module_plan, pipeline_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL, "this component's pipeline stages"),
    F(mmc_module_plan, context_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL, "this component's context-parallel ranks"),
    {0},
};
/* parallel.pipeline_layers as a keyword instead of a list of counts (trainer_pp.c) */
static const char *const k_pp_layers_kw[] = {"auto", "even", NULL};

int mmc_pp_layers_mode(const mmc_parallel_cfg *p) {
    if (p->pipeline_layers.n == 0) return MMC_PP_LAYERS_AUTO;
    if (p->pipeline_layers.n == 1 && !strcmp(p->pipeline_layers.items[0], "auto")) return MMC_PP_LAYERS_AUTO;
    if (p->pipeline_layers.n == 1 && !strcmp(p->pipeline_layers.items[0], "even")) return MMC_PP_LAYERS_EVEN;
    return MMC_PP_LAYERS_LIST;
}

static const mmc_cfg_field k_parallel[] = {
    F(mmc_parallel_cfg, data_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL, "data-parallel ranks"),
    F(mmc_parallel_cfg, tensor_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL, "tensor-parallel ranks"),
    F(mmc_parallel_cfg, sequence_parallel, MMC_CFG_BOOL, U, NULL, NULL,
      "norms and residuals on sequence slices between tensor-parallel blocks"),
    F(mmc_parallel_cfg, pipeline_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL,
      "pipeline stages (Qwen2 / Qwen2-VL decoder layers split, 1F1B schedule)"),
    F(mmc_parallel_cfg, pipeline_layers, MMC_CFG_STR_LIST, U, k_pp_layers_kw, NULL,
      "decoder layers of each pipeline stage, e.g. [3, 5] (with pipeline_virtual v: P x v entries, virtual stage "
      "c P + s on rank s), or auto (the default: from the layers' measured costs) or even"),
    F(mmc_parallel_cfg, pipeline_virtual, MMC_CFG_INT, 1, 16, NULL, NULL,
      "model chunks per pipeline rank: interleaved 1F1B, bubble / v (Megatron's virtual pipeline size)"),
    F(mmc_parallel_cfg, pipeline_schedule, MMC_CFG_ENUM, U, k_pp_sched, NULL,
      "1f1b (interleaved with pipeline_virtual > 1) | dualpipev (two chunks per rank in a V, backward split into "
      "input- and weight-gradient halves; needs 2 x pipeline_parallel micro-batches per step and data-parallel "
      "rank; pipeline_layers then gives 2 x pipeline_parallel counts)"),
    F(mmc_parallel_cfg, context_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL,
      "context-parallel ranks: each sequence split over them (attention as context_parallel_mode says)"),
    F(mmc_parallel_cfg, context_parallel_mode, MMC_CFG_ENUM, U, k_cp_mode, NULL,
      "ulysses (all-to-all over heads; cp must divide the heads) | ring (K/V blocks passed round the ranks, "
      "zigzag causal balance; any cp)"),
    F(mmc_parallel_cfg, expert_parallel, MMC_CFG_INT, 1, 65536, NULL, NULL,
      "ranks splitting each MoE layer's experts (Qwen2-MoE), tokens exchanged with all-to-all; divides "
      "data_parallel (the experts are data-parallel over data_parallel / expert_parallel copies)"),
    F(mmc_parallel_cfg, zero, MMC_CFG_INT, 0, 3, NULL, NULL, "ZeRO stage (0-3)"),
    F(mmc_parallel_cfg, timeout, MMC_CFG_FLOAT, 1, 1e7, NULL, NULL,
      "seconds a rank waits on a collective before aborting the job, naming the rank it waits on (600; "
      "env MMC_DIST_TIMEOUT overrides)"),
    F(mmc_parallel_cfg, vision, MMC_CFG_SECTION, U, NULL, k_module_plan,
      "per-modality plan of the vision tower (with its merger): {data_parallel: N} runs it data-parallel over all "
      "N ranks while the language model is at tensor_parallel x data_parallel"),
    F(mmc_parallel_cfg, audio, MMC_CFG_SECTION, U, NULL, k_module_plan,
      "per-modality plan of the audio encoder (data-parallel over all ranks only)"),
    F(mmc_parallel_cfg, projector, MMC_CFG_SECTION, U, NULL, k_module_plan,
      "per-modality plan of the projector / merger (Qwen2-VL's runs inside the vision tower: the vision's plan)"),
    F(mmc_parallel_cfg, language, MMC_CFG_SECTION, U, NULL, k_module_plan,
      "per-modality plan of the language model (the same as the top-level tensor_parallel, data_parallel, ...)"),
    F(mmc_parallel_cfg, tp_comm_chunks, MMC_CFG_INT, 1, 8, NULL, NULL,
      "with tensor_parallel (no sequence_parallel): the row-parallel o / down outputs all-reduced in this many "
      "row chunks, each overlapped with the next chunk's GEMM (1: one all-reduce after the GEMM)"),
    F(mmc_parallel_cfg, pipeline_early_recv, MMC_CFG_BOOL, U, NULL, NULL,
      "pipeline receives posted two ops before the op that needs them, filled while this stage computes (false: on 2 "
      "shared cores this was ~20 % slower a step; for hosts with a core free for the transfer)"),
    F(mmc_parallel_cfg, pipeline_vision_stage, MMC_CFG_BOOL, U, NULL, NULL,
      "Qwen2-VL / Qwen2.5-VL: stage 0 runs only the vision tower, its merger and the embedding (the spliced "
      "embeddings go to stage 1, their gradient comes back); the decoder layers split over stages 1 .. P-1 "
      "(pipeline_layers then gives P-1 counts); 1F1B only"),
    {0},
};
static const mmc_cfg_field k_optimizer[] = {
    F(mmc_optimizer_cfg, type, MMC_CFG_ENUM, U, k_opt, NULL, "adamw"),
    F(mmc_optimizer_cfg, lr, MMC_CFG_FLOAT, 0, 10, NULL, NULL, "peak learning rate"),
    F(mmc_optimizer_cfg, weight_decay, MMC_CFG_FLOAT, 0, 10, NULL, NULL, "decoupled decay (not on norms/biases)"),
    F(mmc_optimizer_cfg, betas, MMC_CFG_STR_LIST, U, NULL, NULL, "[beta1, beta2]"),
    F(mmc_optimizer_cfg, eps, MMC_CFG_FLOAT, 0, 1, NULL, NULL, "AdamW epsilon"),
    F(mmc_optimizer_cfg, schedule, MMC_CFG_ENUM, U, k_sched, NULL, "constant | linear | cosine"),
    F(mmc_optimizer_cfg, warmup_steps, MMC_CFG_INT, 0, 1e12, NULL, NULL, "linear warmup from 0"),
    F(mmc_optimizer_cfg, min_lr, MMC_CFG_FLOAT, 0, 10, NULL, NULL, "floor of the decay"),
    F(mmc_optimizer_cfg, grad_clip, MMC_CFG_FLOAT, 0, 1e9, NULL, NULL, "max global grad norm (0 = off)"),
    {0},
};
static const mmc_cfg_field k_training[] = {
    F(mmc_training_cfg, steps, MMC_CFG_INT, 1, 1e12, NULL, NULL, "optimizer steps"),
    F(mmc_training_cfg, seed, MMC_CFG_INT, 0, 9.2e18, NULL, NULL, "seed of init, data order, dropout"),
    F(mmc_training_cfg, log_every, MMC_CFG_INT, 1, 1e12, NULL, NULL, "log/metrics interval (steps)"),
    F(mmc_training_cfg, eval_every, MMC_CFG_INT, 0, 1e12, NULL, NULL, "eval interval (0 = off)"),
    F(mmc_training_cfg, save_every, MMC_CFG_INT, 0, 1e12, NULL, NULL, "checkpoint interval (0 = only at the end)"),
    F(mmc_training_cfg, keep_last, MMC_CFG_INT, 0, 1e6, NULL, NULL, "checkpoints kept (0 = all)"),
    F(mmc_training_cfg, output_dir, MMC_CFG_STR, U, NULL, NULL, "run directory"),
    F(mmc_training_cfg, threads, MMC_CFG_INT, 0, 4096, NULL, NULL, "CPU threads (0 = OMP_NUM_THREADS / all)"),
    F(mmc_training_cfg, ema_decay, MMC_CFG_FLOAT, 0, 1, NULL, NULL,
      "EMA of the trained weights, decay min(d, (1+k)/(10+k)) as diffusers' EMAModel (0 = off)"),
    {0},
};
static const mmc_cfg_field k_root[] = {
    F(mmc_run_config, model, MMC_CFG_SECTION, U, NULL, k_model, "what to train"),
    F(mmc_run_config, data, MMC_CFG_SECTION, U, NULL, k_data, "what to train on"),
    F(mmc_run_config, parallel, MMC_CFG_SECTION, U, NULL, k_parallel, "how to split it"),
    F(mmc_run_config, optimizer, MMC_CFG_SECTION, U, NULL, k_optimizer, "how to update"),
    F(mmc_run_config, training, MMC_CFG_SECTION, U, NULL, k_training, "how long, logs, checkpoints"),
    F(mmc_run_config, flow_matching, MMC_CFG_SECTION, U, NULL, k_flow_matching,
      "diffusion training objective (FluxPipeline models)"),
    F(mmc_run_config, diffusion, MMC_CFG_SECTION, U, NULL, k_diffusion,
      "DDPM training objective (StableDiffusionXLPipeline / StableDiffusionPipeline models)"),
    {0},
};
#undef F
#undef U

const mmc_cfg_field *mmc_run_config_schema(void) { return k_root; }

void mmc_run_config_defaults(mmc_run_config *c) {
    memset(c, 0, sizeof *c);
    c->model.dtype = MMC_RUN_F32;
    c->model.recompute = MMC_RECOMPUTE_NONE;
    c->model.lora.alpha = 16;
    c->model.quantization.block_size = 64;
    /* data.max_pixels / min_pixels: 0 = the model's image processor config (the trainer reads
     * it; without one, transformers' Qwen2VLImageProcessor defaults 3136 / 1003520, as generate
     * and eval use) */
    c->data.max_image_pixels = MMC_IMAGE_MAX_PIXELS_DEFAULT;
    c->data.seq_len = 2048;
    c->data.packing = false;
    c->data.truncation = true;
    c->data.shuffle = true;
    c->data.batch_size = 1;
    c->data.micro_batch_size = 1;
    c->data.num_workers = 2;
    c->data.prefetch = 4;
    c->parallel = (mmc_parallel_cfg){.data_parallel = 1, .tensor_parallel = 1, .pipeline_parallel = 1, .pipeline_virtual = 1,
                                     .context_parallel = 1, .expert_parallel = 1, .tp_comm_chunks = 1,
                                     .pipeline_early_recv = false,
                                     .timeout = 600.0};
    c->optimizer.type = MMC_OPT_ADAMW;
    c->optimizer.lr = 1e-5;
    c->optimizer.weight_decay = 0.0;
    c->optimizer.beta1 = 0.9;
    c->optimizer.beta2 = 0.999;
    c->optimizer.eps = 1e-8;
    c->optimizer.schedule = MMC_SCHED_CONSTANT;
    c->optimizer.grad_clip = 1.0;
    c->training.steps = 1000;
    c->training.seed = 42;
    c->training.log_every = 10;
    c->training.save_every = 0;
    c->training.keep_last = 0;
    c->training.threads = 0;
    c->data.resolution = 512;
    c->data.num_frames = 17;
    c->flow_matching.logit_mean = 0.0;     /* diffusers' training scripts' defaults */
    c->flow_matching.logit_std = 1.0;
    c->flow_matching.mode_scale = 1.29;
    c->flow_matching.guidance = 1.0;
    c->flow_matching.max_sequence_length = 512;
    c->flow_matching.validation_steps = 28;
    c->flow_matching.precondition_outputs = true;
}

void mmc_run_config_free(mmc_run_config *c) {
    char *file = c->file;
    mmc_cfg_free(k_root, c);
    free(file);
    memset(c, 0, sizeof *c);
}

/* Line of section.key in the tree, or of the section, or 0. */
static int line_of(const mmc_yaml *root, const char *section, const char *key) {
    const mmc_yaml *s = mmc_yaml_get(root, section);
    if (!s) return 0;
    const mmc_yaml *k = key && mmc_yaml_kind_of(s) == MMC_YAML_MAP ? mmc_yaml_get(s, key) : NULL;
    return k ? mmc_yaml_line(k) : mmc_yaml_line(s);
}

static mmc_status verr(const mmc_run_config *c, const mmc_yaml *root, const char *section,
                       const char *key, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static mmc_status verr(const mmc_run_config *c, const mmc_yaml *root, const char *section,
                       const char *key, const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = line_of(root, section, key);
    if (line > 0)
        return mmc_error(MMC_ERR_INVALID, "%s:%d: %s%s%s: %s", c->file, line, section, key ? "." : "",
                         key ? key : "", msg);
    return mmc_error(MMC_ERR_INVALID, "%s: %s%s%s: %s", c->file, section, key ? "." : "", key ? key : "", msg);
}

/* ------------------------------------------------------------------ per-modality plans
 * parallel.{vision, audio, projector, language} (mmc_hetero.h). The language model's plan is the
 * job's: its keys are copied to the top-level ones (a different top-level value is refused). The
 * vision tower (with Qwen2-VL's merger, the projector) either follows the language model (its
 * tensor_parallel equal to the language model's: split like it, the ordinary plan) or runs
 * data-parallel over every rank (tensor_parallel 1 while the language model's is > 1, or given
 * while its context_parallel or pipeline_parallel is > 1: the heterogeneous plan). The audio encoder (Qwen2.5-Omni) is data-parallel only:
 * shared over the tp group when the language model's tensor_parallel is > 1 (hetero_audio), else the job's data
 * parallelism. What does not add up or is not implemented is refused here by name; the
 * world size is checked again by the trainer when it is known. */
static bool plan_given(const mmc_module_plan *m) {
    return m->data_parallel || m->tensor_parallel || m->pipeline_parallel || m->context_parallel;
}

static mmc_status validate_modules(mmc_run_config *c, const mmc_yaml *root) {
    mmc_parallel_cfg *p = &c->parallel;
    p->hetero = false;
    p->hetero_audio = false;
    const mmc_module_plan *lm = &p->language;
    /* the language model's keys become the job's (default 1 at the top level: only a different
     * explicit value conflicts) */
    static const char *const keys[4] = {"data_parallel", "tensor_parallel", "pipeline_parallel", "context_parallel"};
    const int64_t lv[4] = {lm->data_parallel, lm->tensor_parallel, lm->pipeline_parallel, lm->context_parallel};
    int64_t *top[4] = {&p->data_parallel, &p->tensor_parallel, &p->pipeline_parallel, &p->context_parallel};
    for (int k = 0; k < 4; k++) {
        if (!lv[k]) continue;
        if (*top[k] != 1 && *top[k] != lv[k])
            return verr(c, root, "parallel", "language", "%s %lld but parallel.%s is %lld: give the language "
                        "model's plan once, either under parallel.language or at the top level", keys[k],
                        (long long)lv[k], keys[k], (long long)*top[k]);
        *top[k] = lv[k];
    }
    const int64_t tp = p->tensor_parallel, pp = p->pipeline_parallel, cp = p->context_parallel;
    /* the job's ranks when the config says (data_parallel 1 at tp > 1 or pp > 1 may mean "world / (tp pp)":
     * mmc launch -n W sets it) */
    const int64_t world = p->data_parallel > 1 || (tp == 1 && pp == 1) ? tp * pp * cp * p->data_parallel : 0;
    const mmc_module_plan *v = &p->vision, *pj = &p->projector, *au = &p->audio;
    const struct { const mmc_module_plan *m; const char *name, *what; } mods[3] = {
        {v, "vision", "the vision tower"}, {pj, "projector", "the projector"}, {au, "audio", "the audio encoder"}};
    for (int i = 0; i < 3; i++) {
        const mmc_module_plan *m = mods[i].m;
        if (!plan_given(m)) continue;
        if (m->pipeline_parallel > 1)
            return verr(c, root, "parallel", mods[i].name, "pipeline_parallel %lld: %s as pipeline stages of its "
                        "own is not supported (one stage is); it runs on the first stage of parallel.pipeline_parallel, in one stage of "
                        "its own (parallel.pipeline_vision_stage: true, Qwen2-VL's tower), or data-parallel over all "
                        "ranks ({data_parallel: N})", (long long)m->pipeline_parallel, mods[i].what);
        if (m->context_parallel > 1)
            return verr(c, root, "parallel", mods[i].name, "context_parallel %lld: context parallelism splits the "
                        "language model's sequences; %s encodes whole images or clips (leave it out)",
                        (long long)m->context_parallel, mods[i].what);
        const int64_t mt = m->tensor_parallel ? m->tensor_parallel : 1;
        if (i == 2 && mt > 1)
            return verr(c, root, "parallel", "audio", "tensor_parallel %lld: the audio encoder trains data-parallel "
                        "only (Qwen2.5-Omni's thinker: no tensor parallelism); use {data_parallel: N}", (long long)mt);
        if (mt != 1 && mt != tp)
            return verr(c, root, "parallel", mods[i].name, "tensor_parallel %lld with the language model's "
                        "tensor_parallel %lld: %s runs either data-parallel over all ranks (tensor_parallel 1) or "
                        "split like the language model (%lld); other mixes are not supported yet", (long long)mt,
                        (long long)tp, mods[i].what, (long long)tp);
    }
    /* the vision tower's tp: 1 when its block is given without one (the point of giving it) */
    const int64_t vtp = plan_given(v) ? (v->tensor_parallel ? v->tensor_parallel : 1) : tp;
    if (vtp == 1 && tp > 1) {
        const char *why = cp > 1 ? "context_parallel > 1" : p->expert_parallel > 1 ? "expert_parallel > 1" : NULL;
        if (why)
            return verr(c, root, "parallel", "vision", "data-parallel over all ranks while the language model is at "
                        "tensor_parallel %lld, with %s: not supported yet; the per-modality plan composes with the "
                        "language model's tensor_parallel x data_parallel, and with its pipeline_parallel (ZeRO 0-3, "
                        "sequence_parallel and LoRA allowed)", (long long)tp, why);
        p->hetero = true;
    } else if (plan_given(v) && vtp == 1 && pp > 1) {   /* the tower data-parallel, the LM pipelined (trainer_pp_hetero.c) */
        if (cp > 1 || p->expert_parallel > 1)
            return verr(c, root, "parallel", "vision", "data-parallel over all ranks while the language model is at "
                        "pipeline_parallel %lld, with %s > 1: not supported yet; the per-modality plan composes with "
                        "the language model's pipeline_parallel x tensor_parallel x data_parallel", (long long)pp,
                        cp > 1 ? "context_parallel" : "expert_parallel");
        p->hetero = true;
    } else if (plan_given(v) && vtp == 1 && cp > 1) {   /* the tower shared over the cp group, not replicated */
        const char *why = pp > 1 ? "pipeline_parallel > 1" : p->expert_parallel > 1 ? "expert_parallel > 1" : NULL;
        if (why)
            return verr(c, root, "parallel", "vision", "data-parallel over all ranks while the language model is at "
                        "context_parallel %lld, with %s: not supported yet; the per-modality plan composes with the "
                        "language model's context_parallel x data_parallel", (long long)cp, why);
        p->hetero = true;
    }
    if (p->hetero && pp > 1 && p->pipeline_vision_stage)
        return verr(c, root, "parallel", "pipeline_vision_stage", "true with parallel.vision data-parallel over all "
                    "ranks: the tower is either a pipeline stage of its own or data-parallel over every rank "
                    "(feeding the first stage), not both; drop one of them");
    /* the audio encoder (Qwen2.5-Omni) data-parallel over all ranks: shared over the tp group like
     * the tower (without language tp it is the job's data parallelism already: nothing to share) */
    if (plan_given(au) && tp > 1) {
        const char *why = pp > 1 ? "pipeline_parallel > 1" : cp > 1 ? "context_parallel > 1"
                          : p->expert_parallel > 1 ? "expert_parallel > 1" : NULL;
        if (why)
            return verr(c, root, "parallel", "audio", "data-parallel over all ranks while the language model is at "
                        "tensor_parallel %lld, with %s: not supported yet; the audio plan composes with the "
                        "language model's tensor_parallel x data_parallel", (long long)tp, why);
        p->hetero_audio = true;
    }
    for (int i = 0; i < 3; i++) {
        const mmc_module_plan *m = mods[i].m;
        const int64_t mt = m->tensor_parallel ? m->tensor_parallel : 1;
        if (m->data_parallel && world && mt * m->data_parallel != world)
            return verr(c, root, "parallel", mods[i].name, "tensor_parallel %lld x data_parallel %lld = %lld ranks, but "
                        "the language model's plan spans %lld (tensor_parallel %lld x pipeline_parallel %lld x "
                        "context_parallel %lld x data_parallel %lld): every component runs on all the job's ranks; "
                        "use data_parallel %lld", (long long)mt, (long long)m->data_parallel,
                        (long long)(mt * m->data_parallel), (long long)world, (long long)tp, (long long)pp,
                        (long long)cp, (long long)p->data_parallel, (long long)(world / mt));
    }
    if (plan_given(pj)) {
        const int64_t ptp = pj->tensor_parallel ? pj->tensor_parallel : 1;
        if (ptp != vtp || (pj->data_parallel && v->data_parallel && pj->data_parallel != v->data_parallel))
            return verr(c, root, "parallel", "projector", "a plan other than the vision tower's (tensor_parallel %lld "
                        "vs %lld): the merger runs at the end of the vision tower (Qwen2-VL) and its features are "
                        "what is redistributed to the language model; give it the vision's plan or leave it out",
                        (long long)ptp, (long long)vtp);
    }
    return MMC_OK;
}

static mmc_status validate(mmc_run_config *c, const mmc_yaml *root) {
    mmc_model_cfg *m = &c->model;
    char mi[4200];
    snprintf(mi, sizeof mi, "%s/model_index.json", m->path ? m->path : "");
    const bool pipeline = m->path && access(mi, R_OK) == 0;   /* a diffusers folder: init may come with it */
    if (!m->path == !m->init && !(pipeline && m->init))
        return verr(c, root, "model", m->path ? "init" : NULL,
                    m->path ? "give either model.path (fine-tune) or model.init (random init), not both (both only "
                              "when model.path is a diffusers pipeline folder: its transformer from model.init)"
                            : "missing model.path (a Hugging Face directory) or model.init (a config.json)");
    m->freeze_mask = 0;
    for (int i = 0; i < m->freeze.n; i++) {
        const char *s = m->freeze.items[i];
        int k = 0, nk = (int)(sizeof k_components / sizeof *k_components);
        while (k < nk && strcmp(s, k_components[k]) != 0) k++;
        for (size_t a = 0; k == nk && a < sizeof k_component_alias / sizeof *k_component_alias; a++)
            if (!strcmp(s, k_component_alias[a].alias)) k = k_component_alias[a].k;
        if (k == nk) {
            int best = 99, pick = -1;
            for (int j = 0; j < nk; j++) {
                /* a cheap closeness: common prefix length */
                int p = 0;
                while (s[p] && s[p] == k_components[j][p]) p++;
                int d = (int)strlen(k_components[j]) - p;
                if (p >= 2 && d < best) { best = d; pick = j; }
            }
            char hint[96] = "";
            if (pick >= 0) snprintf(hint, sizeof hint, " (did you mean '%s'?)", k_components[pick]);
            return verr(c, root, "model", "freeze", "unknown component '%s'; expected vision_tower (or vision), "
                        "merger (or projector), language_model (or language), embeddings or audio%s", s, hint);
        }
        m->freeze_mask |= 1u << k;
    }
    if (m->lora.r > 0 && m->lora.targets.n == 0 && !m->lora.init)
        return verr(c, root, "model", "lora", "lora.r = %lld but lora.targets is empty; name the modules "
                    "(e.g. [q_proj, k_proj, v_proj, o_proj])", (long long)m->lora.r);
    if (m->quantization.method == MMC_QUANT_NF4 && m->lora.r == 0)
        return verr(c, root, "model", "quantization", "nf4 quantises the frozen base for QLoRA: set "
                    "model.lora.r > 0 too");
    if (m->quantization.block_size != 64)
        return verr(c, root, "model", "quantization", "block_size %lld: only 64 (bitsandbytes' layout) is "
                    "supported", (long long)m->quantization.block_size);
    mmc_data_cfg *d = &c->data;
    if (!d->train) return verr(c, root, "data", NULL, "missing data.train (the training set)");
    if (d->min_pixels && d->max_pixels && d->min_pixels > d->max_pixels)
        return verr(c, root, "data", "min_pixels", "%lld is larger than max_pixels %lld",
                    (long long)d->min_pixels, (long long)d->max_pixels);
    if (d->batch_size % d->micro_batch_size)
        return verr(c, root, "data", "batch_size", "%lld is not a multiple of micro_batch_size %lld",
                    (long long)d->batch_size, (long long)d->micro_batch_size);
    c->training.gradient_accumulation = d->batch_size / d->micro_batch_size;
    mmc_status pst = validate_modules(c, root);
    if (pst) return pst;
    const mmc_parallel_cfg *p = &c->parallel;
    /* entries of an explicit pipeline_layers list (0: auto or even) */
    const int pl_n = mmc_pp_layers_mode(p) == MMC_PP_LAYERS_LIST ? p->pipeline_layers.n : 0;
    /* pipeline parallelism (trainer_pp.c): Qwen2 / Qwen2-MoE / Qwen2-VL with plain data parallelism and
     * tensor parallelism; the layer counts are checked against the model when its config.json is read */
    if (p->pipeline_virtual > 1 && p->pipeline_parallel < 2)
        return verr(c, root, "parallel", "pipeline_virtual", "%lld needs pipeline_parallel 2 or more (the chunks of "
                    "a rank interleave with the other stages')", (long long)p->pipeline_virtual);
    if (p->pipeline_schedule == MMC_PP_SCHED_DUALPIPEV) {
        if (p->pipeline_parallel < 2)
            return verr(c, root, "parallel", "pipeline_schedule", "dualpipev needs pipeline_parallel 2 or more (got "
                        "%lld): it folds 2 x pipeline_parallel virtual stages into a V over the ranks",
                        (long long)p->pipeline_parallel);
        if (p->pipeline_virtual > 1)
            return verr(c, root, "parallel", "pipeline_virtual", "%lld with pipeline_schedule dualpipev: DualPipeV "
                        "always holds two chunks per rank (stages r and 2P-1-r); leave pipeline_virtual at 1",
                        (long long)p->pipeline_virtual);
        if (pl_n && pl_n != 2 * p->pipeline_parallel)
            return verr(c, root, "parallel", "pipeline_layers", "%d entries but pipeline_schedule dualpipev over "
                        "pipeline_parallel %lld makes %lld virtual stages (rank r holds the r-th and the (2P-1-r)-th): "
                        "give one decoder-layer count per virtual stage", pl_n,
                        (long long)p->pipeline_parallel, (long long)(2 * p->pipeline_parallel));
    }
    /* the vision tower as a stage of its own (trainer_pp.c): stage 0 holds no decoder layer */
    if (p->pipeline_vision_stage) {
        if (p->pipeline_parallel < 2)
            return verr(c, root, "parallel", "pipeline_vision_stage", "true needs pipeline_parallel 2 or more (got "
                        "%lld): stage 0 runs the vision tower, stages 1 .. P-1 the decoder layers",
                        (long long)p->pipeline_parallel);
        if (p->pipeline_virtual > 1 || p->pipeline_schedule == MMC_PP_SCHED_DUALPIPEV)
            return verr(c, root, "parallel", "pipeline_vision_stage", "true with %s: not supported; interleaved and "
                        "DualPipeV schedules give every rank decoder chunks (rank 0 would hold layers as well as the "
                        "tower); use pipeline_schedule 1f1b with pipeline_virtual 1, or put the tower on the first "
                        "stage (pipeline_vision_stage false)",
                        p->pipeline_virtual > 1 ? "pipeline_virtual > 1" : "pipeline_schedule dualpipev");
        if (pl_n && pl_n != p->pipeline_parallel - 1)
            return verr(c, root, "parallel", "pipeline_layers", "%d entries but pipeline_parallel %lld with "
                        "pipeline_vision_stage makes %lld decoder stages (stage 0 holds the vision tower only): give "
                        "one decoder-layer count per stage 1 .. %lld", pl_n,
                        (long long)p->pipeline_parallel, (long long)(p->pipeline_parallel - 1),
                        (long long)(p->pipeline_parallel - 1));
    } else if (p->pipeline_schedule != MMC_PP_SCHED_DUALPIPEV && pl_n &&
        pl_n != p->pipeline_parallel * p->pipeline_virtual) {
        if (p->pipeline_virtual > 1)
            return verr(c, root, "parallel", "pipeline_layers", "%d entries but pipeline_parallel %lld x "
                        "pipeline_virtual %lld makes %lld virtual stages: give one decoder-layer count per virtual "
                        "stage", pl_n, (long long)p->pipeline_parallel, (long long)p->pipeline_virtual,
                        (long long)(p->pipeline_parallel * p->pipeline_virtual));
        return verr(c, root, "parallel", "pipeline_layers", "%d entries but pipeline_parallel is %lld: give one "
                    "decoder-layer count per stage", pl_n, (long long)p->pipeline_parallel);
    }
    for (int i = 0; i < pl_n; i++) {
        char *end;
        long long v = strtoll(p->pipeline_layers.items[i], &end, 10);
        if (!*p->pipeline_layers.items[i] || *end || v < 1)
            return verr(c, root, "parallel", "pipeline_layers", "'%s' (stage %d) must be a whole number of decoder "
                        "layers, at least 1: no stage may be empty", p->pipeline_layers.items[i], i);
    }
    /* tensor parallelism: the text Qwen2 with plain data parallelism (the model's own checks —
     * heads, KV heads, intermediate and vocabulary sizes — run when config.json is read) */
    if (p->sequence_parallel && p->tensor_parallel < 2)
        return verr(c, root, "parallel", "sequence_parallel", "true needs tensor_parallel 2 or more (the sequence is "
                    "split over the tensor-parallel group)");
    /* context parallelism (mmc_cp.h): the text decoders, Qwen2-VL and Qwen2.5-VL with plain data parallelism (heads and KV heads
     * are checked against config.json when the model is read) */
    if (p->context_parallel > 1) {
        const char *why = p->tensor_parallel > 1 ? "tensor_parallel > 1" : p->pipeline_parallel > 1 ? "pipeline_parallel > 1"
                          : p->zero > 0 ? "ZeRO (parallel.zero > 0)" : c->model.quantization.method != MMC_QUANT_NONE
                          ? "model.quantization" : NULL;
        if (why)
            return verr(c, root, "parallel", "context_parallel", "%lld with %s is not supported yet; context "
                        "parallelism composes with plain data parallelism (zero 0) of the text decoders, Qwen2-VL and Qwen2.5-VL",
                        (long long)p->context_parallel, why);
    }
    /* expert parallelism (mmc_ep.h): a MoE model's experts over groups of data-parallel ranks, full
     * fine-tuning with plain data parallelism and tensor parallelism (the model's own check:
     * expert_parallel divides num_experts; at tp > 1 data_parallel may be left out, and the trainer
     * checks the world / tp it gets) */
    if (p->expert_parallel > 1) {
        const char *why = p->context_parallel > 1 ? "context_parallel > 1" : p->zero > 0 ? "ZeRO (parallel.zero > 0)"
                          : p->sequence_parallel ? "sequence_parallel"
                          : c->training.ema_decay > 0 ? "training.ema_decay"
                          : c->model.quantization.method != MMC_QUANT_NONE ? "model.quantization" : NULL;
        if (why)
            return verr(c, root, "parallel", "expert_parallel", "%lld with %s is not supported yet; expert "
                        "parallelism composes with plain data parallelism (zero 0), tensor parallelism and pipeline "
                        "parallelism (each stage's experts over that stage's data-parallel ranks) of full-parameter "
                        "or LoRA training", (long long)p->expert_parallel, why);
        if (p->data_parallel % p->expert_parallel &&
            !((p->tensor_parallel > 1 || p->pipeline_parallel > 1) && p->data_parallel == 1))
            return verr(c, root, "parallel", "expert_parallel", "%lld does not divide data_parallel %lld: the expert-"
                        "parallel groups are carved out of the data-parallel ranks", (long long)p->expert_parallel,
                        (long long)p->data_parallel);
    }
    if (d->batch_size % (d->micro_batch_size * p->data_parallel))
        return verr(c, root, "data", "batch_size", "%lld does not divide into data_parallel %lld ranks x "
                    "micro_batch_size %lld", (long long)d->batch_size, (long long)p->data_parallel,
                    (long long)d->micro_batch_size);
    mmc_optimizer_cfg *o = &c->optimizer;
    if (o->betas.n) {
        if (o->betas.n != 2) return verr(c, root, "optimizer", "betas", "expected two numbers [beta1, beta2], "
                                         "found %d", o->betas.n);
        double b[2];
        for (int i = 0; i < 2; i++) {
            char *end;
            b[i] = strtod(o->betas.items[i], &end);
            if (!*o->betas.items[i] || *end || !(b[i] >= 0 && b[i] < 1))
                return verr(c, root, "optimizer", "betas", "'%s' must be a number in [0, 1)", o->betas.items[i]);
        }
        o->beta1 = b[0];
        o->beta2 = b[1];
    }
    if (o->min_lr > o->lr)
        return verr(c, root, "optimizer", "min_lr", "%g is above lr %g", o->min_lr, o->lr);
    if (o->warmup_steps > c->training.steps)
        return verr(c, root, "optimizer", "warmup_steps", "%lld is more than training.steps %lld",
                    (long long)o->warmup_steps, (long long)c->training.steps);
    if (!c->training.output_dir)
        return verr(c, root, "training", NULL, "missing training.output_dir (where checkpoints and logs go)");
    if (c->training.ema_decay > 0 && c->parallel.zero == 3)
        return verr(c, root, "training", "ema_decay", "an EMA needs the whole trained weights on each rank; "
                    "use parallel.zero 0-2");
    mmc_fm_scheme scheme;
    if (c->flow_matching.weighting_scheme &&
        mmc_fm_scheme_parse(c->flow_matching.weighting_scheme, "flow_matching.weighting_scheme", &scheme))
        return verr(c, root, "flow_matching", "weighting_scheme", "'%s' is not one of none, logit_normal, mode, "
                    "sigma_sqrt, cosmap", c->flow_matching.weighting_scheme);
    const char *pt = c->diffusion.prediction_type;
    if (pt && strcmp(pt, "epsilon") && strcmp(pt, "v_prediction") && strcmp(pt, "sample"))
        return verr(c, root, "diffusion", "prediction_type", "'%s' is not one of epsilon, v_prediction, sample", pt);
    return MMC_OK;
}

mmc_status mmc_run_config_parse(const char *text, size_t len, const char *what,
                                const char *const *sets, int n_sets, mmc_run_config *c) {
    mmc_run_config_defaults(c);
    c->file = strdup(what ? what : "<config>");
    mmc_yaml *root = NULL;
    mmc_status st = mmc_yaml_parse(text, len, c->file, &root);
    if (st) goto fail;
    if (mmc_yaml_kind_of(root) == MMC_YAML_NULL) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the file is empty; expected the sections model, data, "
                       "parallel, optimizer, training", c->file);
        goto fail;
    }
    for (int i = 0; i < n_sets; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq || eq == sets[i]) {
            st = mmc_error(MMC_ERR_INVALID, "--set '%s': expected key.path=value (e.g. optimizer.lr=1e-4)",
                           sets[i]);
            goto fail;
        }
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - sets[i]), sets[i]);
        if ((st = mmc_yaml_set(root, key, eq + 1))) goto fail;
    }
    if ((st = mmc_cfg_read(root, k_root, c, c->file))) goto fail;
    if ((st = validate(c, root))) goto fail;
    mmc_yaml_free(root);
    return MMC_OK;
fail:
    mmc_yaml_free(root);
    mmc_run_config_free(c);
    return st;
}

mmc_status mmc_run_config_load(const char *path, const char *const *sets, int n_sets,
                               mmc_run_config *c) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) { mmc_run_config_defaults(c); return mmc_error_prefix(st, "run config"); }
    st = mmc_run_config_parse(text, len, path, sets, n_sets, c);
    free(text);
    return st;
}

static void print_fields(FILE *f, const mmc_cfg_field *fs, const char *prefix) {
    for (const mmc_cfg_field *x = fs; x->key; x++) {
        char name[128];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", x->key);
        if (x->type == MMC_CFG_SECTION && *prefix == 0) {
            fprintf(f, "  %s:  (%s)\n", name, x->help);
            print_fields(f, x->section, name);
            continue;
        }
        if (x->type == MMC_CFG_SECTION) {
            print_fields(f, x->section, name);
            continue;
        }
        fprintf(f, "    %-32s %s\n", name, x->help);
    }
}

void mmc_run_config_print_keys(void *file) { print_fields(file, k_root, ""); }
