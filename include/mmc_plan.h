/* mmc_plan.h — the parallel-layout planner's cost model (`mmc plan`): from a model's shapes
 * (Qwen2 / Qwen2-VL config.json), the run's batch and sequence, a device and an interconnect,
 * the modelled step time and memory per rank of a layout dp x tp x pp x cp (+ ZeRO stage,
 * sequence parallelism, interleaved stages, micro-batch size, activation recompute).
 *
 * The model (src/parallel/plan.c; the formulas are written out there and in README "mmc plan"):
 *   - compute: per-layer FLOPs of every GEMM (forward 2 M K N, backward twice that) and of
 *     attention (causal: half of 4 T^2 H D per sequence), divided by the device's rates. A GPU's
 *     rates are its bf16 dense peak times an efficiency factor (mmc_plan_device_named); this
 *     CPU's are measured with mmc's own kernels at the layer's shapes (mmc_plan_calibrate_cpu,
 *     cached in a file), so small shapes pay their real overheads;
 *   - memory-bound work (norms, activations, residuals, AdamW) from bytes / bandwidth;
 *   - communication from an alpha-beta model of each collective on the group it runs over
 *     (ring all-reduce 2(p-1)alpha + 2(p-1)/p n beta, all-gather / reduce-scatter / all-to-all
 *     (p-1)alpha + (p-1)/p n beta, point-to-point alpha + n beta); a group whose ranks span
 *     nodes uses the inter-node alpha / beta (Megatron's rank order: tp fastest, then cp, dp, pp);
 *   - pipeline: stage time x (M + (P-1)/v) for 1F1B with v chunks per rank (bubble
 *     (P-1)/(vM+P-1), mmc_pp_bubble_fraction_v);
 *   - recompute: one more forward of every layer; ZeRO stages shard optimizer state (1),
 *     gradients (2) and parameters (3, which adds an all-gather of the parameters in forward and
 *     in backward).
 * Expert parallelism: the layout carries `ep` (1 until a MoE model's cost is added: see
 * mmc_plan_estimate). */
#ifndef MMC_PLAN_H
#define MMC_PLAN_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_models.h"
#include "mmc_vl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shapes the cost needs (read from config.json by mmc_plan_model_read). */
typedef struct {
    int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim;   /* decoder (C, F, L, Hq, Hkv, D) */
    bool tied;
    bool vision;                          /* Qwen2-VL tower present */
    int64_t v_depth, v_dim, v_heads, v_inter, v_merge, v_out;   /* Cv, Hv, Fv, spatial merge m, LM width */
    int64_t v_patch_in;                   /* Cin * kt * p * p (patch embedding input) */
    bool audio;                           /* Qwen2.5-Omni thinker: its audio encoder (and Qwen2.5-VL's tower) */
    int64_t a_dim, a_layers, a_heads, a_inter, a_window, a_mels, a_out;   /* d_model, encoder_layers, heads,
                                           * ffn, n_window, num_mel_bins, output_dim */
    int64_t moe_experts, moe_top_k, moe_inter, moe_shared;   /* Qwen2-MoE (0: dense): E, k, Fi, Fs */
    uint64_t moe_sparse[16];              /* bit l: decoder layer l is sparse (layers past 1024: dense) */
    mmc_qwen2_config lm;                  /* as the trainer reads them (its divisibility checks run on these;
                                           * lm.moe is NULL: the MoE shape is in the fields above) */
    mmc_vision_config vcfg;
} mmc_plan_model;

/* What one step processes. */
typedef struct {
    int64_t batch;              /* global samples per step (data.batch_size) */
    int64_t micro_batch;        /* samples per forward/backward (data.micro_batch_size) */
    int64_t seq;                /* tokens per sample (data.seq_len) */
    int64_t vision_patches;     /* vision patches per sample (0: none); merged tokens = patches / m^2 */
    int weight_bytes;           /* 4 (f32) or 2 (bf16, with an fp32 master) */
    int act_bytes;              /* bytes per activation element (mmc on CPU: 4) */
    int64_t lora_r;             /* > 0: only adapters train (rank r on the targets below) */
    unsigned lora_targets;      /* bit i: q,k,v,o,gate,up,down (MMC_PLAN_LORA_*) */
    bool freeze_vision;         /* vision tower kept fixed (no gradient, no optimizer state) */
    int64_t audio_frames;       /* mel frames per sample (100 a second; 0: none), Qwen2.5-Omni */
    bool freeze_audio;          /* the audio encoder kept fixed */
} mmc_plan_workload;
enum { MMC_PLAN_LORA_Q = 1, MMC_PLAN_LORA_K = 2, MMC_PLAN_LORA_V = 4, MMC_PLAN_LORA_O = 8, MMC_PLAN_LORA_GATE = 16,
       MMC_PLAN_LORA_UP = 32, MMC_PLAN_LORA_DOWN = 64 };

/* A layout (one row of the planner's table). */
typedef struct {
    int dp, tp, pp, cp, ep;     /* ep: expert parallelism (1: dense model; reserved for MoE) */
    int vpp;                    /* model chunks per pipeline rank (interleaved 1F1B), 1 = plain */
    bool sp;                    /* sequence parallelism over the tp group */
    int cp_ring;                /* context parallelism: 0 Ulysses, 1 ring */
    int zero;                   /* ZeRO stage 0-3 over the data-parallel group */
    int recompute;              /* activation recompute (mmc_recompute): 0 none, 1 full (each layer's forward
                                 * again in backward, only its input kept), 2 attention (RoPE + the attention
                                 * core again: the rotated q / k not kept) */
    int64_t recompute_layers;   /* recompute only the first N decoder layers of each stage (0: all) */
    int64_t micro_batch;        /* samples per micro-batch (per data-parallel rank) */
    bool hetero;                /* per-modality plan (mmc_hetero.h): the vision tower whole and data-parallel
                                 * over all ranks (each tp rank encodes 1/tp of its micro-batch's images, the
                                 * merged features all-gathered over tp) while the LM is at tp x dp; for
                                 * Qwen2.5-Omni the audio encoder too (1/tp of the clips): hetero_audio */
    bool hetero_audio;
    bool dualpipev;             /* parallel.pipeline_schedule dualpipev (with vpp 2: virtual stages r and 2P-1-r
                                 * on rank r); the pipeline split's only (mmc_plan_pp_split) */
    bool vstage;                /* parallel.pipeline_vision_stage: the vision tower, merger and embedding on
                                 * pipeline stage 0 alone, the decoder layers over stages 1 .. pp-1 (1F1B) */
} mmc_plan_layout;

/* Seconds of one measured or modelled kernel, fwd + bwd (the CPU cache's entries). */
typedef struct mmc_plan_calib mmc_plan_calib;

typedef struct {
    char name[32];
    double gemm_flops;          /* sustained GEMM FLOP/s (peak x efficiency) */
    double attn_flops;          /* sustained attention FLOP/s */
    double mem_bw;              /* bytes/s for memory-bound work */
    double mem_bytes;           /* memory per device (bytes; 0 = unknown) */
    double overlap;             /* share of data-parallel gradient communication hidden under backward (0-1) */
    int cores;                  /* CPU: cores shared by the ranks on this machine (0: a GPU per rank) */
    double host_share;          /* CPU: the share of a core each of the job's ranks gets on this
                                 * (shared) host, measured by mmc_plan_host_share; 0 = min(1, cores / ranks) */
    mmc_plan_calib *calib;      /* CPU: measured kernel times at the layer's shapes (NULL: the rates above) */
} mmc_plan_device;

typedef struct {
    char name[32];
    double alpha_intra, beta_intra;   /* s, s/byte within a node (collectives) */
    double alpha_inter, beta_inter;   /* across nodes */
    double alpha_p2p, beta_p2p;       /* measured point-to-point within a node (pipeline; 0: the group's link) */
    int ranks_per_node;               /* 8 for a DGX-class node; the whole job for one CPU host */
} mmc_plan_net;

/* EXCHANGE: a ring step (every rank sends to the next and receives from the previous at once;
 * its alpha-beta time is a point-to-point transfer's) */
typedef enum { MMC_COLL_ALL_REDUCE = 0, MMC_COLL_ALL_GATHER, MMC_COLL_REDUCE_SCATTER, MMC_COLL_ALL_TO_ALL,
               MMC_COLL_P2P, MMC_COLL_EXCHANGE } mmc_coll_kind;

typedef struct {
    double step_s;                    /* modelled wall time of one optimizer step */
    double compute_s;                 /* GEMM + attention + memory-bound work per rank (incl. recompute) */
    double recompute_s;               /* of which the recompute forward */
    double comm_s;                    /* exposed communication per step (not hidden) */
    double comm_total_s;              /* all communication per step, hidden or not */
    double tp_comm_s, cp_comm_s, pp_comm_s, dp_comm_s;   /* per group, per step */
    double bubble;                    /* pipeline idle share of the step */
    double bubble_s;
    double optim_s;                   /* AdamW over this rank's state */
    double flops_per_step;            /* model FLOPs of the whole step, all ranks (no recompute) */
    double mem_params, mem_grads, mem_optim, mem_act, mem_total;   /* bytes on the busiest rank */
    double comm_bytes;                /* bytes a rank sends per step (all groups) */
    double cpu_s;                     /* busy seconds of all ranks together per step on unshared cores
                                       * (compute + optimizer, + communication on a CPU host, whose
                                       * transport is the CPU copying; what a CPU run's CPU time should be) */
} mmc_plan_estimate;

/* ---------------------------------------------------------------- model and workload */
/* config.json (Qwen2, Qwen2-VL / Qwen2.5-VL: text fields flat or under text_config, the tower
 * under vision_config; the Qwen2.5-Omni thinker's with its audio_config). `what` names the file in errors. */
mmc_status mmc_plan_model_read(const mmc_json *cfg, const char *what, mmc_plan_model *out);
/* The same from the configs a loaded model holds (the trainer's; vision NULL: a text model). */
mmc_status mmc_plan_model_from(const mmc_qwen2_config *lm, const mmc_vision_config *vision, mmc_plan_model *out);
/* Parameters of one decoder layer / the vision tower / embedding (+ untied lm_head). */
int64_t mmc_plan_layer_params(const mmc_plan_model *m);
int64_t mmc_plan_vision_params(const mmc_plan_model *m);
int64_t mmc_plan_audio_params(const mmc_plan_model *m);   /* Qwen2.5-Omni's audio encoder (0: none) */
int64_t mmc_plan_total_params(const mmc_plan_model *m);
/* Forward FLOPs of one decoder layer over `tokens` tokens in sequences of `seq` (GEMMs + causal
 * attention, unsharded). */
double mmc_plan_layer_flops(const mmc_plan_model *m, int64_t tokens, int64_t seq);

/* ---------------------------------------------------------------- devices and networks */
/* "h100", "h200", "a100" (bf16 dense peak x efficiency; README "mmc plan" gives the figures).
 * false if unknown. */
bool mmc_plan_device_named(const char *name, mmc_plan_device *out);
/* "nvlink" (within a node; InfiniBand between nodes of 8), "ib" (every group over InfiniBand),
 * "pcie" (PCIe within a node of 8, InfiniBand between). false if unknown. */
bool mmc_plan_net_named(const char *name, mmc_plan_net *out);
/* alpha-beta time of one collective of `bytes` (all-reduce / all-to-all: the buffer a rank
 * holds; all-gather: the gathered output; reduce-scatter: the input) over p ranks. */
double mmc_plan_coll_time(mmc_coll_kind k, int p, double bytes, double alpha, double beta);

/* ---------------------------------------------------------------- CPU calibration */
/* Load (or start empty) the cache file of measured kernel times; path NULL = no file. */
mmc_status mmc_plan_calib_open(const char *path, mmc_plan_calib **out);
/* The same from text (`what` names it in errors; no file: nothing is written back). */
mmc_status mmc_plan_calib_parse(const char *text, size_t len, const char *what, mmc_plan_calib **out);
/* Write it back (if anything was measured). */
mmc_status mmc_plan_calib_save(mmc_plan_calib *c);
void mmc_plan_calib_free(mmc_plan_calib *c);
/* Measured fwd+bwd seconds (min of a few runs) of mmc_linear x [M, K] . w [N, K]^T, of
 * causal mmc_attention over B sequences of T with H query / Hkv KV heads of D, and of the
 * memory-bound part of a decoder layer (two RMSNorms, SwiGLU, two residual adds) over M tokens;
 * measured on first use and cached. M is capped (the time scaled linearly past the cap). */
double mmc_plan_calib_linear(mmc_plan_calib *c, int64_t M, int64_t K, int64_t N);
double mmc_plan_calib_attn(mmc_plan_calib *c, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);
double mmc_plan_calib_eltwise(mmc_plan_calib *c, int64_t M, int64_t C, int64_t F);
/* A whole decoder layer of one rank's shard (mmc_qwen2_layer_forward + backward; B sequences of
 * T tokens, width C, H / Hkv heads of D, FFN F), and the rest of a micro-batch over N tokens
 * (token embedding, final norm, lm_head and cross-entropy; V the rank's vocabulary rows): what a
 * layer costs beyond its GEMMs and attention (RoPE, the heads' reshapes, norms, residuals, the
 * autograd tape). */
double mmc_plan_calib_layer(mmc_plan_calib *c, int64_t B, int64_t T, int64_t C, int64_t H, int64_t Hkv, int64_t D,
                            int64_t F);
double mmc_plan_calib_head(mmc_plan_calib *c, int64_t N, int64_t C, int64_t V);
/* Seconds per layer of L such layers in sequence (each its own weights: the stage's working set),
 * forward + backward, with n copies running at once on n threads (the job's other ranks on the
 * other cores); what the model uses on a CPU (the lone layer above fits the caches better). */
double mmc_plan_calib_stack(mmc_plan_calib *c, int64_t B, int64_t T, int64_t C, int64_t H, int64_t Hkv, int64_t D,
                            int64_t F, int64_t L, int n);
/* A Qwen2-MoE sparse decoder layer (as mmc_plan_calib_layer, its MLP Qwen2-MoE's block: E experts
 * of FFN Fi, top-k routing, the gated shared expert of FFN Fs). */
double mmc_plan_calib_moe_layer(mmc_plan_calib *c, int64_t B, int64_t T, int64_t C, int64_t H, int64_t Hkv, int64_t D,
                                int64_t E, int64_t k, int64_t Fi, int64_t Fs);
/* The trainer's optimizer step over n parameters (gradient clipping + AdamW + zeroing). */
double mmc_plan_calib_adamw(mmc_plan_calib *c, int64_t n);
/* Collectives as the trainer meets them (collective over `world`, run under mpirun with 2+ ranks):
 * each kind over groups of 2, 4, ... ranks (all groups of the job at once) and message sizes
 * 64 B - 16 MiB, each operation after ~1 ms of arithmetic on every rank, as between a layer's
 * GEMMs; the cost is the time the loop takes beyond the arithmetic alone (wake-ups of the
 * communication thread and its back-off included), the fastest of five loops, the slowest rank.
 * Rank 0 stores them in c (others pass NULL); log: a line per measurement (rank 0; NULL: none). */
mmc_status mmc_plan_calibrate_coll(struct mmc_comm *world, mmc_plan_calib *c, FILE *log);
/* A measured collective's seconds (kind over groups of p ranks in a job of n, `bytes` as
 * mmc_plan_coll_time counts them): alpha + beta bytes fitted robustly to the measured sizes (alpha
 * the median of those <= 16 KiB, beta the median slope of those >= 512 KiB); -1 if none measured. */
double mmc_plan_calib_coll(const mmc_plan_calib *c, mmc_coll_kind kind, int p, int n, double bytes);
/* Communication constants measured by mmc_plan_calibrate_net (false: none in the cache). */
bool mmc_plan_calib_net(const mmc_plan_calib *c, mmc_plan_net *out);
void mmc_plan_calib_set_net(mmc_plan_calib *c, const mmc_plan_net *n);
/* This host as a device: cores, memory bandwidth (measured, cached) and the cache. */
mmc_status mmc_plan_device_cpu(mmc_plan_calib *c, mmc_plan_device *out);
/* How much of a core each of n busy threads gets here now: n threads spin for `seconds`, each
 * reading its CPU time every 0.1 s; returns the best 0.1 s window's mean share per thread (the
 * counterpart of a fastest-step measurement) and in *mean the whole run's. On a host shared by
 * several sessions (Linux autogroup scheduling) this is what a rank of a job started from this
 * session gets. */
double mmc_plan_host_share(int n, double seconds, double *mean);
/* Ping-pong and all-reduce over `world` (collective; run under mpirun with 2+ ranks): fills
 * *out with alpha / beta fitted to the measurements (rank 0's view). */
mmc_status mmc_plan_calibrate_net(struct mmc_comm *world, mmc_plan_net *out);

/* ---------------------------------------------------------------- the estimate */
/* Why a layout cannot run this model (heads / layers / sequence / batch do not divide, and the
 * trainer's rules of which modes combine): false and *why filled; true if it can. */
bool mmc_plan_layout_ok(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_layout *l,
                        char *why, size_t cap);
mmc_status mmc_plan_estimate_layout(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                                    const mmc_plan_net *n, const mmc_plan_layout *l, mmc_plan_estimate *out);
/* What the pipeline split weighs (mmc_pp_auto_split): each decoder layer's forward + backward
 * seconds per micro-batch on a rank of layout l (layer[m->layers]: a Qwen2-MoE model's sparse
 * layers cost their block, its dense ones a dense MLP), what the first stage adds (the embedding
 * and, unless l->vstage, the vision tower and merger: forward only when frozen), what the last adds
 * (final norm, lm_head over the rank's vocabulary, cross-entropy), and the tower alone (*vision).
 * On the CPU device every figure is measured (cached in d->calib), else modelled from rates. */
mmc_status mmc_plan_layer_costs(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                                const mmc_plan_layout *l, double *layer, double *first, double *last, double *vision);
/* The layout's pipeline split: mmc_pp_auto_split over mmc_plan_layer_costs (bounds[0 .. P v] in
 * virtual-stage order, stage_cost[P v] seconds per micro-batch; NULL: not wanted); what `mmc
 * train` runs for that layout when parallel.pipeline_layers is auto (the default). */
mmc_status mmc_plan_pp_split(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                             const mmc_plan_layout *l, int64_t *bounds, double *stage_cost, bool *even);
/* The trainer's entry (parallel.pipeline_layers: auto): the model's configs, the run's workload and
 * layout, the split measured on this host with the planner's calibration cache at calib_path
 * (mmc_plan_calib_default_path; NULL: nothing kept), which this call reads and extends. */
mmc_status mmc_plan_pp_measure(const mmc_qwen2_config *lm, const mmc_vision_config *vision, const mmc_plan_workload *w,
                               const mmc_plan_layout *l, const char *calib_path, int64_t *bounds, double *stage_cost,
                               bool *even);
/* $XDG_CACHE_HOME/mmc/plan-cpu.txt, else ~/.cache/mmc/plan-cpu.txt: the calibration cache's default. */
void mmc_plan_calib_default_path(char *out, size_t cap);
/* The share by which the automatic split keeps the even one (3 %: measurement noise). */
#define MMC_PP_KEEP_EVEN 0.03
/* "dp2 tp2 pp1 cp1 ..." */
void mmc_plan_layout_str(const mmc_plan_layout *l, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
