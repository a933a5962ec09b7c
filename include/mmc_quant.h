/* mmc_quant.h — quantised linear weights: 4-bit NormalFloat (NF4) for QLoRA and 4-bit
 * inference, and weight-only int8 for inference.
 *
 * NF4 follows bitsandbytes' layout
 * (bitsandbytes.functional.quantize_4bit(quant_type="nf4", blocksize=64)):
 *   - the weight is flattened row-major and cut into blocks of 64 values;
 *   - each block keeps absmax = max|w| and codes c = argmin_k |w / absmax - NF4[k]|;
 *   - two codes per byte, the earlier element in the HIGH nibble;
 *   - optional double quantisation (compress_statistics=True): offset = mean(absmax), and
 *     absmax - offset is itself quantised blockwise (blocks of 256) to 8 bits with
 *     bitsandbytes' signed dynamic map; dequant absmax = dyn[q] * absmax2[blk] + offset.
 * Dequantised value = NF4[c] * absmax. The frozen base weight of a QLoRA linear is stored
 * like this and dequantised tile by tile inside mmc_nf4_linear. */
#ifndef MMC_QUANT_H
#define MMC_QUANT_H

#include "mmc.h"
#include "mmc_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MMC_NF4_BLOCK 64
#define MMC_NF4_DQ_BLOCK 256

struct mmc_nf4 {
    int64_t rows, cols;     /* original weight [N, K] */
    int64_t numel, n_blocks;
    uint8_t *codes;         /* [numel / 2] packed 4-bit codes */
    float *absmax;          /* [n_blocks] (NULL when double-quantised) */
    uint8_t *qabsmax;       /* [n_blocks] 8-bit codes of absmax - offset (double quant) */
    float *absmax2;         /* [ceil(n_blocks / 256)] scales of qabsmax (double quant) */
    float offset;           /* mean(absmax) (double quant) */
    bool double_quant;
};

/* The 16 NF4 levels (bitsandbytes' table, ascending, NF4[7] = 0). */
const float *mmc_nf4_levels(void);
/* bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)), 256 ascending. */
const float *mmc_dynamic_map(void);

/* Quantise w [N, K] (f32; numel even). */
mmc_status mmc_nf4_quantize(const float *w, int64_t N, int64_t K, bool double_quant, mmc_nf4 **out);
/* Same from bitsandbytes' tensors (codes [numel/2] u8, absmax f32 or u8+absmax2+offset). */
mmc_status mmc_nf4_from_parts(int64_t N, int64_t K, const uint8_t *codes, const float *absmax,
                              const uint8_t *qabsmax, const float *absmax2, float offset,
                              mmc_nf4 **out);
void mmc_nf4_free(mmc_nf4 *q);
/* Per-block scales (double quant resolved), [n_blocks]. */
void mmc_nf4_absmax(const mmc_nf4 *q, float *out);
/* Blocks [b0, b0 + nb) of the same into out [nb]. */
void mmc_nf4_absmax_range(const mmc_nf4 *q, int64_t b0, int64_t nb, float *out);
/* Rows [row0, row0 + nrows) of the dequantised weight into out [nrows, K] (absmax given by
 * mmc_nf4_absmax, or NULL to compute it). */
void mmc_nf4_dequantize_rows(const mmc_nf4 *q, const float *absmax, int64_t row0, int64_t nrows,
                             float *out);
/* Bytes held: codes + scales (+ second-level scales). */
size_t mmc_nf4_bytes(const mmc_nf4 *q);

/* x [..., K] -> [..., N] = x · dequant(q)ᵀ + b. Up to 4 rows of x (decode) read the codes
 * directly (qmatvec.c: LUT of the 16 levels, nibbles unpacked in registers) when K % 64 == 0;
 * otherwise 256-row tiles are dequantised into a scratch panel and multiplied tile by tile
 * (never the whole matrix). Backward: dx (and db if b requires grad); the quantised base
 * is frozen. */
mmc_tensor *mmc_nf4_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_nf4 *q, mmc_tensor *b);

/* Quantise the base weights of linears in place (QLoRA at load): l->q = NF4(l->w),
 * l->w = NULL. The replaced weight tensors are removed from params/names (count *n_params
 * updated) and freed; names may be NULL. Weights must be f32 or bf16 (bf16 is widened). */
mmc_status mmc_nf4_quantize_linears(mmc_linear_w **mods, int n, bool double_quant,
                                    mmc_tensor **params, char (*names)[96], int *n_params);

/* ------------------------------------------------------------------ int8 (weight-only)
 * Per output channel, symmetric: scale[n] = max_k |W[n, k]| / 127 (f32), q = W / scale
 * rounded half to even and clamped to [-127, 127] (a zero row has scale 0, codes 0).
 * Dequantised value = q · scale[n]. 8 + 32/K bits per weight. */
struct mmc_q8 {
    int64_t rows, cols;     /* [N, K] */
    int8_t *q;              /* [N, K] */
    float *scale;           /* [N] */
};

mmc_status mmc_q8_quantize(const float *w, int64_t N, int64_t K, mmc_q8 **out);
void mmc_q8_free(mmc_q8 *q);
void mmc_q8_dequantize_rows(const mmc_q8 *q, int64_t row0, int64_t nrows, float *out);
size_t mmc_q8_bytes(const mmc_q8 *q);
/* As mmc_nf4_linear: up to 4 rows of x read the int8 weights directly (qmatvec.c), more rows
 * run the GEMM on dequantised 256-row tiles. Backward: dx (and db). */
mmc_tensor *mmc_q8_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_q8 *q, mmc_tensor *b);

/* Weight-only quantisation for inference (`--quantize`). */
typedef enum { MMC_WQ_NONE = 0, MMC_WQ_INT8, MMC_WQ_NF4 } mmc_quant_mode;
/* "int8" / "nf4" (also "none"); MMC_ERR_INVALID naming the accepted values otherwise. */
mmc_status mmc_quant_mode_parse(const char *s, mmc_quant_mode *out);
const char *mmc_quant_mode_name(mmc_quant_mode m);
/* Quantise the f32/bf16 base weights of linears in place (int8 or NF4 without double
 * quantisation), removing the replaced tensors from params/names as mmc_nf4_quantize_linears
 * does. Linears already quantised are left alone; LoRA adapters stay and apply on top.
 * *bytes_before / *bytes_after (may be NULL) get the weight bytes replaced and their
 * quantised size. */
mmc_status mmc_quantize_linears(mmc_linear_w **mods, int n, mmc_quant_mode mode, mmc_tensor **params,
                                char (*names)[96], int *n_params, int64_t *bytes_before, int64_t *bytes_after);
/* Free the quantised weight a linear holds (NF4 or int8), if any. */
void mmc_linear_quant_free(mmc_linear_w *l);

#ifdef __cplusplus
}
#endif
#endif
