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
#endif
