/* conv.h — im2col / col2im for 2-D convolution as GEMM (one image at a time).
 * col [Cin * kh * kw, Ho * Wo]: row (ci, ki, kj), column (oh, ow) holds
 * x[ci, oh * stride - pad + ki, ow * stride - pad + kj] (0 outside the image). */
#ifndef MMC_CPU_CONV_H
#define MMC_CPU_CONV_H
#include <stdint.h>

void mmc_cpu_im2col(const float *x, float *col, int64_t Cin, int64_t H, int64_t W, int64_t kh,
                    int64_t kw, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo);
/* dx [Cin, H, W] += the scatter of col back into the image (parallel over channels, each
 * channel summed in a fixed order: deterministic). */
void mmc_cpu_col2im_acc(const float *col, float *dx, int64_t Cin, int64_t H, int64_t W, int64_t kh,
                        int64_t kw, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo);
#endif
