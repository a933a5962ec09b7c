/* mmc_quant.h — 4-bit NormalFloat (NF4) weights for QLoRA, in bitsandbytes' layout
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
/* Rows [row0, row0 + nrows) of the dequantised weight into out [nrows, K] (absmax given by
 * mmc_nf4_absmax, or NULL to compute it). */
void mmc_nf4_dequantize_rows(const mmc_nf4 *q, const float *absmax, int64_t row0, int64_t nrows,
                             float *out);
/* Bytes held: codes + scales (+ second-level scales). */
size_t mmc_nf4_bytes(const mmc_nf4 *q);

/* x [..., K] -> [..., N] = x · dequant(q)ᵀ + b. Dequantises 256-row tiles into a scratch
 * panel and multiplies tile by tile (never the whole matrix). Backward: dx (and db if b
 * requires grad); the quantised base is frozen. */
mmc_tensor *mmc_nf4_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_nf4 *q, mmc_tensor *b);

/* Quantise the base weights of linears in place (QLoRA at load): l->q = NF4(l->w),
 * l->w = NULL. The replaced weight tensors are removed from params/names (count *n_params
 * updated) and freed; names may be NULL. Weights must be f32 or bf16 (bf16 is widened). */
mmc_status mmc_nf4_quantize_linears(mmc_linear_w **mods, int n, bool double_quant,
                                    mmc_tensor **params, char (*names)[96], int *n_params);

#ifdef __cplusplus
}
#endif
#endif
