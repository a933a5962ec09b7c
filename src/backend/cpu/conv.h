/* conv.h — im2col / col2im for 2-D convolution as GEMM, over a block of output rows
 * [oh0, oh1) of a group of nb images at once (Q = (oh1 - oh0) * Wo columns per image).
 * col [Cin * kh * kw, nb * Q]: row (ci, ki, kj), column (b, oh - oh0, ow) holds
 * x[b, ci, oh * stride - pad + ki, ow * stride - pad + kj] (0 outside the image), so nb
 * GEMMs on column slices (ldb = nb * Q) cover the block. Blocks let the caller keep col
 * cache-sized: whole images grouped when they are small, row bands of one image when it
 * is large. Both run in parallel over (image, channel) items; each item reads/writes its
 * own rows/planes in a fixed order, so results do not depend on the thread count. */
#ifndef MMC_CPU_CONV_H
#define MMC_CPU_CONV_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t Cin, H, W, kh, kw, stride, pad, Ho, Wo;
} mmc_conv_geom;

/* x [nb, Cin, H, W] -> col [Cin*kh*kw, nb*Q] for output rows [oh0, oh1) */
void mmc_cpu_im2col(const float *x, float *col, int64_t nb, int64_t oh0, int64_t oh1,
                    const mmc_conv_geom *g);
/* dx [nb, Cin, H, W] += the scatter of col [Cin*kh*kw, nb*Q] (output rows [oh0, oh1)) back
 * into the images */
void mmc_cpu_col2im_acc(const float *col, float *dx, int64_t nb, int64_t oh0, int64_t oh1,
                        const mmc_conv_geom *g);

/* Winograd F(4x4, 3x3) for 3x3 stride-1 convolutions (conv.c). Geometry of one call: x
 * [B, C, H, W] -> y [B, K, Ho, Wo], zero padding pad on each side; the backward-data pass is
 * a forward over dy (C = Cout, K = Cin, pad 2 - pad) with the flipped, transposed weights. */
typedef struct {
    int64_t C, K, H, W, Ho, Wo, pad;
    /* How the forward reads x (all zero: as it is). up2: x is stored [B, C, H/2, W/2] and read as its
     * nearest 2x upsample (H, W even), so the upsampled input never exists. in_scale / in_shift
     * [B * C]: each value read is v * in_scale[b, c] + in_shift[b, c] (a GroupNorm's affine, the
     * same arithmetic as mmc_cpu_groupnorm_fwd), then with in_silu v * sigmoid(v); the zero
     * padding stays zero. Forward (not bwd_data) only. */
    bool up2, in_silu;
    const float *in_scale, *in_shift;
    /* Output window (row1 0: the whole output): only output rows [row0, row1) are computed, row0 a
     * multiple of 4 (the tile grid stays the whole output's, so each value is the one the whole call
     * gives); y then points at row row0 of the first output plane, and yplane (0: (row1 - row0) * Wo)
     * is the distance between y's (image, channel) planes. Forward (not bwd_data) only. */
    int64_t row0, row1, yplane;
} mmc_wino_geom;

/* Whether this build's Winograd kernels are fast: compiled for AVX-512 (the 16-lane vectors
 * and shuffles are single zmm instructions there). Otherwise they are correct but slow, and
 * mmc_conv2d's default keeps im2col + GEMM. */
bool mmc_cpu_wino_fast(void);
/* floats of scratch mmc_cpu_wino_fwd needs for B images, tb tiles per block (tb % 32 == 0)
 * and up to nth threads */
size_t mmc_cpu_wino_fwd_floats(const mmc_wino_geom *g, int64_t B, int64_t tb, int nth);
/* y [B, K, Ho, Wo] = conv(x, w) + bias (bias may be NULL), or with acc y += conv(x, w) (no
 * bias). w [Cout, Cin, 3, 3] f32: the forward's (K = Cout) or, with bwd_data, the layer's
 * whose dx this is (K = Cin, C = Cout: flipped, transposed kernels). Threads take (image, block
 * of tb 4x4 output tiles) units, or for fewer than 4 units panels of output channels (see
 * conv.c); the same result for any thread count. */
void mmc_cpu_wino_fwd(const float *x, int64_t B, const float *w, bool bwd_data, const float *bias, bool acc,
                      float *y, const mmc_wino_geom *g, int64_t tb, float *scratch);
/* floats of scratch mmc_cpu_wino_dw needs for chunks of tc tiles (tc % 16 == 0) */
size_t mmc_cpu_wino_dw_floats(const mmc_wino_geom *g, int64_t tc);
/* dw [K, C, 3, 3] += the weight gradient of y = conv(x) given dy [B, K, Ho, Wo] */
void mmc_cpu_wino_dw(const float *x, const float *dy, int64_t B, float *dw, const mmc_wino_geom *g,
                     int64_t tc, float *scratch);
#endif
