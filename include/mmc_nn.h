/* mmc_nn.h — shared building blocks of the model files. A linear layer is a weight (f32,
 * bf16, or NF4-quantised for QLoRA), an optional bias, and an optional LoRA adapter:
 *   y = x · Wᵀ + b + (alpha / r) · dropout(x) · Aᵀ · Bᵀ        (PEFT's LoraLayer)
 * Model structs hold mmc_linear_w for every projection, so adapters and quantisation attach
 * without touching the model's forward code. */
#ifndef MMC_NN_H
#define MMC_NN_H

#include "mmc.h"
#include "mmc_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_lora {
    mmc_tensor *A;        /* [r, K] lora_A.weight (trainable) */
    mmc_tensor *B;        /* [N, r] lora_B.weight (trainable, zero-initialised) */
    float scale;          /* lora_alpha / r */
    float dropout;        /* probability, applied to x on the adapter path in training */
    uint64_t stream;      /* dropout stream of this module (its index in the model) */
} mmc_lora;

typedef struct mmc_nf4 mmc_nf4;   /* NF4 weight (bitsandbytes layout), see mmc_quant.h */
typedef struct mmc_q8 mmc_q8;     /* int8 weight, per-output-channel scales, see mmc_quant.h */

typedef struct mmc_linear_w {
    mmc_tensor *w;        /* [N, K] f32/bf16; NULL when quantised */
    mmc_tensor *b;        /* [N] or NULL */
    mmc_lora *lora;       /* NULL unless adapted */
    mmc_nf4 *q;           /* NULL unless quantised to NF4 (QLoRA, --quantize nf4) */
    int64_t out_features, in_features;
    mmc_q8 *q8;           /* NULL unless quantised to int8 (--quantize int8) */
    /* A fused linear whose output rows are n_parts checkpoint linears stacked (Qwen2.5-Omni's vision
     * q / k / v held as one qkv): parts[j] (no weights, out_features rows each) carries the adapter
     * PEFT puts on linear j, added to its slice of the output. NULL / 0 otherwise. */
    const struct mmc_linear_w *parts;
    int n_parts;
    /* NULL unless pre-packed for inference (mmc_prepack_linears): the weight in the GEMM
     * micro-kernel's panel layout, which then replaces w (w = NULL) */
    struct mmc_gemm_packed_b *pk;
} mmc_linear_w;

/* x [..., K] -> [..., N] */
mmc_tensor *mmc_nn_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l);

/* Pre-packed inference weights: each linear's f32 weight (and a bf16 one when --bf16-matmul /
 * mmc_gemm_set_bf16_dot chose a bf16-product kernel: AMX or vdpbf16ps) is packed once into the
 * panels the GEMM micro-kernel reads (gemm.h's mmc_gemm_pack_b), so no forward packs it again;
 * the packed copy replaces the weight (l->pk set, l->w = NULL, the tensor dropped from params /
 * names (*n_params updated) and freed; a weight mapped from a file has its pages released).
 * Results are the bits the unpacked GEMM gives for more than 4 rows of x (decode's <= 4 rows take
 * the packed path too, not the matvec: last-bit differences). Inference only: a packed linear has
 * no backward (mmc_nn_linear fails if x needs a gradient): call it only for a model that will not
 * train. Skipped: quantised linears, bf16 weights on the exact path (f32 panels would double them),
 * non-2-D ones.
 * *n_packed, *bytes_before / *bytes_after (each may be NULL) count what was replaced. */
/* Remove w from a parameter list params[*n_params] (and its names, when given), keeping the
 * order; what pre-packing and quantisation do with a weight they replace. No list: nothing. */
void mmc_params_drop(mmc_tensor **params, char (*names)[96], int *n_params, const mmc_tensor *w);
mmc_status mmc_prepack_linears(mmc_linear_w **mods, int n, mmc_tensor **params, char (*names)[96], int *n_params,
                               int *n_packed, int64_t *bytes_before, int64_t *bytes_after);
/* Free a linear's pre-packed weight, if any. */
void mmc_linear_packed_free(mmc_linear_w *l);
/* MMC_PREPACK=0 turns pre-packing off (the models' prepack calls then do nothing). */
bool mmc_prepack_enabled(void);

/* LoRA dropout needs a per-step stream: set once per micro-batch, e.g.
 * mmc_nn_dropout_seed(run_seed, step, micro). Setting it turns dropout on for this context
 * (training); mmc_nn_set_dropout_off turns it off (evaluation). Masks are drawn only in
 * grad mode or inside a checkpointed block, and depend only on (seed, module stream,
 * element), so a recomputed block draws the same mask. */
void mmc_nn_set_dropout_seed(mmc_ctx *ctx, uint64_t seed);
void mmc_nn_set_dropout_off(mmc_ctx *ctx);
uint64_t mmc_nn_dropout_seed(uint64_t seed, uint64_t step, uint64_t micro);
/* Inverted dropout y = x * keep / (1 - p) with keep ~ Bernoulli(1 - p) from Philox(seed,
 * stream, element); identity when dropout is off or p == 0. */
mmc_tensor *mmc_nn_dropout(mmc_ctx *ctx, mmc_tensor *x, float p, uint64_t stream);

/* diffusers' get_timestep_embedding: t [B] -> [B, dim] sinusoids (src/nn/timestep.c). Flux and
 * SD3 call it with dim 256, flip_sin_to_cos true, downscale_freq_shift 0, scale 1, max_period 10000. */
mmc_tensor *mmc_timestep_embedding(mmc_ctx *ctx, const float *t, int64_t B, int dim, bool flip_sin_to_cos,
                                   double downscale_freq_shift, double scale, double max_period);

/* The routed experts of a MoE block as one op (src/nn/moe_experts.c): x [M, C] grouped by
 * expert (counts[e] rows each, e < n, in order) -> [M, C], block e = down_e(silu(gate_e x) * up_e x),
 * each projection one grouped GEMM over every expert's rows. Only for plain weights (f32 or bf16
 * alike, no bias, LoRA or quantisation): check with mmc_moe_experts_grouped_ok. */
bool mmc_moe_experts_grouped_ok(const mmc_linear_w *gate, const mmc_linear_w *up, const mmc_linear_w *down, int64_t n);
mmc_tensor *mmc_moe_experts_swiglu(mmc_ctx *ctx, mmc_tensor *x, const int64_t *counts, int64_t n,
                                   const mmc_linear_w *gate, const mmc_linear_w *up, const mmc_linear_w *down);

#ifdef __cplusplus
}
#endif
#endif
