/* mmc_ops.h — differentiable ops. Each op checks shapes (aborting with a message on a
 * programmer error), computes its output in the activation arena with a fused CPU kernel,
 * and records one tape node whose backward calls fused backward kernels.
 *
 * Compute is f32. Weight arguments (linear w, embedding table) may be BF16: the kernels
 * widen them in registers. Activations are f32 and contiguous unless stated.
 * Shapes are outermost-first; "..." means any leading dims (flattened).
 */
#ifndef MMC_OPS_H
#define MMC_OPS_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- views & layout
 * Views share storage with their input; their backward maps the gradient back. */
mmc_tensor *mmc_reshape(mmc_ctx *ctx, mmc_tensor *x, int ndim, const int64_t *shape); /* one dim may be -1 */
mmc_tensor *mmc_transpose(mmc_ctx *ctx, mmc_tensor *x, int d0, int d1);
mmc_tensor *mmc_permute(mmc_ctx *ctx, mmc_tensor *x, const int *perm);
mmc_tensor *mmc_narrow(mmc_ctx *ctx, mmc_tensor *x, int dim, int64_t start, int64_t len); /* slice */
mmc_tensor *mmc_contiguous(mmc_ctx *ctx, mmc_tensor *x);  /* x itself if already contiguous */
/* Copy with dtype conversion (no grad through non-float dtypes). */
mmc_tensor *mmc_cast(mmc_ctx *ctx, mmc_tensor *x, mmc_dtype dt);

/* ---------------------------------------------------------------- elementwise */
mmc_tensor *mmc_add(mmc_ctx *ctx, mmc_tensor *a, mmc_tensor *b);   /* numpy broadcasting */
mmc_tensor *mmc_mul(mmc_ctx *ctx, mmc_tensor *a, mmc_tensor *b);   /* numpy broadcasting */
mmc_tensor *mmc_scale(mmc_ctx *ctx, mmc_tensor *x, float s);
/* Activations named as transformers' ACT2FN keys (model configs pick one by name). */
typedef enum { MMC_ACT_QUICK_GELU, MMC_ACT_GELU, MMC_ACT_GELU_TANH, MMC_ACT_RELU, MMC_ACT_SILU } mmc_act;
mmc_tensor *mmc_gelu(mmc_ctx *ctx, mmc_tensor *x);        /* erf form (nn.GELU()) */
mmc_tensor *mmc_gelu_tanh(mmc_ctx *ctx, mmc_tensor *x);   /* tanh approximation */
mmc_tensor *mmc_quick_gelu(mmc_ctx *ctx, mmc_tensor *x);  /* x * sigmoid(1.702 x) */
mmc_tensor *mmc_silu(mmc_ctx *ctx, mmc_tensor *x);
/* x = silu(x) in place, for inference: x contiguous f32, not on a tape (its memory is reused, so only for
 * a temporary nothing else reads, e.g. a GroupNorm output about to be convolved). Returns x. */
mmc_tensor *mmc_silu_inplace(mmc_ctx *ctx, mmc_tensor *x);
/* silu(gate) * up, both [..., F] */
mmc_tensor *mmc_swiglu(mmc_ctx *ctx, mmc_tensor *gate, mmc_tensor *up);
mmc_tensor *mmc_softmax(mmc_ctx *ctx, mmc_tensor *x);     /* over the last dim */

/* ---------------------------------------------------------------- reductions */
mmc_tensor *mmc_sum(mmc_ctx *ctx, mmc_tensor *x);   /* -> [] scalar (ndim 0) */
mmc_tensor *mmc_mean(mmc_ctx *ctx, mmc_tensor *x);  /* -> [] scalar */

/* ---------------------------------------------------------------- dense layers */
/* x [..., K] · w[N, K]ᵀ + b[N] -> [..., N]; w f32 or bf16; b may be NULL. */
mmc_tensor *mmc_linear(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b);
/* table [V, C] (f32/bf16), ids [...] (i32/i64) -> [..., C] */
mmc_tensor *mmc_embedding(mmc_ctx *ctx, mmc_tensor *table, mmc_tensor *ids);
/* torch's nn.Embedding(padding_idx): the same lookup, but the row padding_idx gets no gradient
 * (the positions holding it contribute nothing to the table's grad); -1 = none. */
mmc_tensor *mmc_embedding_padded(mmc_ctx *ctx, mmc_tensor *table, mmc_tensor *ids, int64_t padding_idx);

/* ---------------------------------------------------------------- norms */
/* x [..., C]; w [C] or NULL. y = x * rsqrt(mean(x^2) + eps) * w (HF Qwen2RMSNorm). */
mmc_tensor *mmc_rmsnorm(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, float eps);
/* x [..., C]; w, b [C] or NULL (nn.LayerNorm, biased variance). */
mmc_tensor *mmc_layernorm(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b, float eps);
/* x [N, C, *spatial]; w, b [C] or NULL (nn.GroupNorm). */
mmc_tensor *mmc_groupnorm(mmc_ctx *ctx, mmc_tensor *x, int groups, mmc_tensor *w, mmc_tensor *b,
                          float eps);

/* adaLN arithmetic of diffusion transformers (src/ops/modulate.c): x, y [B, T, C] contiguous;
 * shift, scale, gate [B, C] with unit column stride (chunks of a conditioning projection). */
mmc_tensor *mmc_modulate(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *shift, mmc_tensor *scale); /* x*(1+scale)+shift */
mmc_tensor *mmc_gate_residual(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *gate, mmc_tensor *y); /* x + gate*y */

/* ---------------------------------------------------------------- rotary embeddings
 * One apply op for every variant (HF rotate_half convention):
 *   y = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[D/2:], x[:D/2])
 * x [B, T, H, D]; cos, sin [T, D] (shared across the batch) or [B, T, D].
 * The tables below build cos/sin for each variant (no grad). */
mmc_tensor *mmc_rope(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin);
/* The interleaved (complex-pair) convention of diffusers' apply_rotary_emb
 * (use_real_unbind_dim=-1: Flux): pairs (x[2i], x[2i+1]) rotate; same shapes as mmc_rope. */
mmc_tensor *mmc_rope_interleaved(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin);
/* diffusers' FluxPosEmbed: ids [S, n_axes] (float, as the pipelines build them), axis a
 * taking axes_dim[a] dims (even) of D = sum; angles in float64, each repeated twice
 * (repeat_interleave_real) -> cos, sin [S, D] for mmc_rope_interleaved. */
void mmc_rope_table_axes(mmc_ctx *ctx, const float *ids, int64_t S, int n_axes, const int *axes_dim,
                         double theta, mmc_tensor **cos, mmc_tensor **sin);
/* 1-D: pos [B, T] or [T] (i32/i64) -> cos, sin [B, T, D] or [T, D];
 * inv_freq[j] = theta^(-2j/D), emb = cat(freqs, freqs) as in HF. */
void mmc_rope_table_1d(mmc_ctx *ctx, const mmc_tensor *pos, int D, double theta,
                       mmc_tensor **cos, mmc_tensor **sin);
/* The default inverse frequencies inv[D/2] (f32 as transformers computes them), and the 1-D
 * table from given ones (rope scaling variants remap inv first). */
void mmc_rope_inv_freq(float *inv, int D, double theta);
void mmc_rope_table_1d_freqs(mmc_ctx *ctx, const mmc_tensor *pos, int D, const float *inv,
                             mmc_tensor **cos, mmc_tensor **sin);
/* Multimodal (Qwen2-VL M-RoPE): pos [3, B, T] (temporal, height, width); section[3] sums to
 * D/2; frequency band j takes its angle from pos[k] where k is the section containing j. */
void mmc_rope_table_mrope(mmc_ctx *ctx, const mmc_tensor *pos, const int section[3], int D,
                          double theta, mmc_tensor **cos, mmc_tensor **sin);
/* 2-D vision rotary (Qwen2-VL / Qwen2.5-VL vision tower): for n_images images of grid
 * (t, h, w) = grid_thw[3*i..], patch tokens ordered in spatial_merge x spatial_merge
 * windows as transformers orders them; head dim D; half the bands index rows, half columns.
 * -> cos, sin [L, D], L = sum t*h*w. */
void mmc_rope_table_vision2d(mmc_ctx *ctx, const int64_t *grid_thw, int n_images,
                             int spatial_merge, int D, double theta,
                             mmc_tensor **cos, mmc_tensor **sin);

/* ---------------------------------------------------------------- attention
 * Scaled dot-product attention, tiled with an online softmax (never materialises T x S),
 * with grouped-query heads (Hq % Hkv == 0).
 *   q [B, T, Hq, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv] -> [B, T, Hq, Dv]
 * Masks: causal (query t sees keys s <= t + S - T), full, or block-diagonal variable-length
 * sequences given by cu_seqlens (B must be 1, T == S; cu_seqlens[0] = 0,
 * cu_seqlens[n_seqs] = T), optionally causal inside each block. */
typedef struct {
    bool causal;
    float scale;              /* 0 -> 1/sqrt(D) */
    const int32_t *cu_seqlens;/* NULL, or n_seqs + 1 offsets */
    int n_seqs;
} mmc_attn_opts;
mmc_tensor *mmc_attention(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v,
                          const mmc_attn_opts *opts);

/* ---------------------------------------------------------------- shape surgery */
mmc_tensor *mmc_concat(mmc_ctx *ctx, mmc_tensor *const *xs, int n, int dim);
/* Split along dim into n parts of the given sizes (views; each has its own node). */
void mmc_split(mmc_ctx *ctx, mmc_tensor *x, int dim, int n, const int64_t *sizes, mmc_tensor **out);
/* x [N, C], idx [M] (i32/i64) -> [M, C] (rows may repeat; backward scatter-adds). */
mmc_tensor *mmc_gather_rows(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *idx);
/* Out-of-place: dst [N, C] with rows idx[M] replaced by src [M, C] (image embeddings into
 * a token sequence). Rows of idx must be distinct. */
mmc_tensor *mmc_scatter_rows(mmc_ctx *ctx, mmc_tensor *dst, mmc_tensor *idx, mmc_tensor *src);

/* ---------------------------------------------------------------- convolutions */
/* Non-overlapping patch embedding (Conv2d/Conv3d with stride == kernel):
 * x [N, Cin * kt * kh * kw] (already flattened patches, as Qwen2-VL's processor emits),
 * w [Cout, Cin, kt, kh, kw] or [Cout, Cin, kh, kw] (f32/bf16), b [Cout] or NULL -> [N, Cout] */
mmc_tensor *mmc_patch_embed(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b);
/* x [B, Cin, H, W], w [Cout, Cin, kh, kw], b [Cout] or NULL -> [B, Cout, Ho, Wo] (im2col+GEMM) */
mmc_tensor *mmc_conv2d(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b, int stride,
                       int padding);
/* Raw 3x3 stride-1 padding-1 convolution on the Winograd kernels, for models that run their own
 * convolutions (the Wan VAE's causal conv3d, one temporal tap at a time): y [B, K, H, W] = conv(x [B, C,
 * H, W], w [K, C, 3, 3] f32) + bias (bias may be NULL), or with acc y += conv(x, w) (bias ignored).
 * mmc_conv3x3_winograd_applies says whether mmc_conv2d's default would take Winograd for that layer
 * (AVX-512 build, >= 16 channels each side, >= 64 pixels; MMC_CONV_ALGO=gemm / winograd decide
 * instead when set); mmc_conv3x3_winograd runs it regardless (errors ~1e-6 relative). No tape. */
bool mmc_conv3x3_winograd_applies(int64_t C, int64_t K, int64_t H, int64_t W);
mmc_status mmc_conv3x3_winograd(const float *x, int64_t B, int64_t C, int64_t H, int64_t W, const float *w, int64_t K,
                                const float *bias, bool acc, float *y);
/* No tape, output into the caller's memory (for inference paths that keep their large activations off
 * the arena, the VAE decoder's): mmc_conv2d_into writes mmc_conv2d(x, w, b, stride, padding)'s values to
 * y [B, Cout, Ho, Wo]. mmc_conv3x3_fused is a 3x3 stride-1 padding-1 convolution whose input x is read
 * through `in` (NULL: as it is): up2, x [B, C, H, W] read as its nearest 2x upsample [B, C, 2H, 2W];
 * scale / shift [B * C], each value v read as v * scale + shift (mmc_groupnorm's arithmetic, from
 * mmc_groupnorm_affine), then with silu v * sigmoid(v) (mmc_silu's), the zero padding outside. So
 * Upsample2D's or a ResnetBlock2D's input never exists at full size. The values equal those of the
 * ops run one after the other. Returns false (nothing written) where mmc_conv2d would not take
 * Winograd (see mmc_conv3x3_winograd_applies): the caller runs the ops instead. */
typedef struct {
    bool up2, silu;
    const float *scale, *shift;
    /* row1 > 0: only output rows [row0, row1) are computed (row0 a multiple of 4, row1 <= the output's
     * height), each value the one the whole convolution gives; y then points at row row0 of the first
     * output plane and yplane (0: (row1 - row0) * W, a band of its own) is the distance between y's
     * (image, channel) planes: the output's H * W to write into the whole output. So a caller can run a
     * layer in row bands (the VAE decoder: src/models/diffusion/autoencoder_kl.c). */
    int64_t row0, row1, yplane;
} mmc_conv_input;
void mmc_conv2d_into(mmc_ctx *ctx, const mmc_tensor *x, const mmc_tensor *w, const mmc_tensor *b, int stride, int padding,
                     float *y);
bool mmc_conv3x3_fused(mmc_ctx *ctx, const mmc_tensor *x, const mmc_conv_input *in, const mmc_tensor *w,
                       const mmc_tensor *b, float *y);
/* mmc_groupnorm's statistics as the per-channel affine it applies: y[n, c, :] = x[n, c, :] * a[n, c] +
 * sh[n, c] (x [N, C, *spatial] contiguous f32, w / b [C] f32 or NULL; a, sh [N * C] floats). No tape. */
void mmc_groupnorm_affine(const mmc_tensor *x, int groups, const mmc_tensor *w, const mmc_tensor *b, float eps,
                          float *a, float *sh);

/* ---------------------------------------------------------------- losses */
/* logits [N, V], targets [N] (i32/i64); mean over targets != ignore_index (-100 in HF).
 * Fused log-softmax; returns a scalar. All-ignored -> 0 (and zero gradient). */
mmc_tensor *mmc_cross_entropy(mmc_ctx *ctx, mmc_tensor *logits, mmc_tensor *targets,
                              int64_t ignore_index);

#ifdef __cplusplus
}
#endif
#endif /* MMC_OPS_H */
