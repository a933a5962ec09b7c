/* conv.c — im2col / col2im (see conv.h), the layout torch's CPU "slow_conv2d" uses to turn
 * nn.functional.conv2d into a GEMM. */
#include "conv.h"

#include <string.h>

void mmc_cpu_im2col(const float *x, float *col, int64_t Cin, int64_t H, int64_t W, int64_t kh,
                    int64_t kw, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo) {
    int64_t rows = Cin * kh * kw;
#pragma omp parallel for schedule(static) if (rows * Ho * Wo > 32768)
    for (int64_t k = 0; k < rows; k++) {
        int64_t ci = k / (kh * kw), ki = (k / kw) % kh, kj = k % kw;
        const float *xc = x + ci * H * W;
        float *cr = col + k * Ho * Wo;
        for (int64_t oh = 0; oh < Ho; oh++) {
            int64_t ih = oh * stride - pad + ki;
            float *dst = cr + oh * Wo;
            if (ih < 0 || ih >= H) {
                memset(dst, 0, (size_t)Wo * sizeof(float));
                continue;
            }
            const float *src = xc + ih * W;
            for (int64_t ow = 0; ow < Wo; ow++) {
                int64_t iw = ow * stride - pad + kj;
                dst[ow] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
            }
        }
    }
}

void mmc_cpu_col2im_acc(const float *col, float *dx, int64_t Cin, int64_t H, int64_t W, int64_t kh,
                        int64_t kw, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo) {
#pragma omp parallel for schedule(static) if (Cin * kh * kw * Ho * Wo > 32768)
    for (int64_t ci = 0; ci < Cin; ci++) {
        float *dc = dx + ci * H * W;
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                const float *cr = col + ((ci * kh + ki) * kw + kj) * Ho * Wo;
                for (int64_t oh = 0; oh < Ho; oh++) {
                    int64_t ih = oh * stride - pad + ki;
                    if (ih < 0 || ih >= H) continue;
                    float *drow = dc + ih * W;
                    const float *src = cr + oh * Wo;
                    for (int64_t ow = 0; ow < Wo; ow++) {
                        int64_t iw = ow * stride - pad + kj;
                        if (iw >= 0 && iw < W) drow[iw] += src[ow];
                    }
                }
            }
    }
}
