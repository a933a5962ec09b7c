/* conv.c — im2col / col2im (see conv.h), the layout torch's CPU "slow_conv2d" uses to turn
 * nn.functional.conv2d into a GEMM, here over a group of images so the GEMMs are wide.
 * Per output row the valid output columns [ow0, ow1) (those whose input column lies inside
 * the image) are computed once, so the inner loops have no bounds tests: stride 1 is a
 * memcpy / a contiguous vector add, other strides a strided gather / scatter-add. */
#include "conv.h"

#include <string.h>

/* valid output columns for kernel column kj: 0 <= ow*stride - pad + kj < W */
static void ow_range(const mmc_conv_geom *g, int64_t kj, int64_t *ow0, int64_t *ow1) {
    int64_t lo = g->pad - kj;   /* need ow*stride >= lo */
    int64_t a = lo <= 0 ? 0 : (lo + g->stride - 1) / g->stride;
    int64_t hi = g->W - 1 + g->pad - kj;   /* need ow*stride <= hi */
    int64_t b = hi < 0 ? 0 : hi / g->stride + 1;
    if (b > g->Wo) b = g->Wo;
    if (a > b) a = b;
    *ow0 = a, *ow1 = b;
}

void mmc_cpu_im2col(const float *x, float *col, int64_t nb, int64_t oh0,
                    int64_t oh1, const mmc_conv_geom *g) {
    const int64_t Q = (oh1 - oh0) * g->Wo, kk = g->kh * g->kw, ldc = nb * Q, s = g->stride;
    const int64_t items = nb * g->Cin;
#pragma omp parallel for schedule(static) if (items * kk * Q > 32768)
    for (int64_t it = 0; it < items; it++) {
        const int64_t b = it % nb, ci = it / nb;   /* neighbouring items write neighbouring columns */
        const float *xc = x + (b * g->Cin + ci) * g->H * g->W;
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                float *cr = col + (ci * kk + ki * g->kw + kj) * ldc + b * Q;
                int64_t ow0, ow1;
                ow_range(g, kj, &ow0, &ow1);
                const int64_t off = kj - g->pad;
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    const int64_t ih = oh * s - g->pad + ki;
                    float *restrict dst = cr + (oh - oh0) * g->Wo;
                    if (ih < 0 || ih >= g->H) {
                        memset(dst, 0, (size_t)g->Wo * sizeof(float));
                        continue;
                    }
                    const float *restrict src = xc + ih * g->W;
                    for (int64_t ow = 0; ow < ow0; ow++) dst[ow] = 0.0f;
                    if (s == 1) {
                        if (ow1 > ow0) memcpy(dst + ow0, src + ow0 + off, (size_t)(ow1 - ow0) * sizeof(float));
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = src[ow * s + off];
                    }
                    for (int64_t ow = ow1; ow < g->Wo; ow++) dst[ow] = 0.0f;
                }
            }
    }
}

void mmc_cpu_col2im_acc(const float *col, float *dx, int64_t nb, int64_t oh0,
                    int64_t oh1, const mmc_conv_geom *g) {
    const int64_t Q = (oh1 - oh0) * g->Wo, kk = g->kh * g->kw, ldc = nb * Q, s = g->stride;
    const int64_t items = nb * g->Cin;
#pragma omp parallel for schedule(static) if (items * kk * Q > 32768)
    for (int64_t it = 0; it < items; it++) {
        const int64_t b = it % nb, ci = it / nb;
        float *dc = dx + (b * g->Cin + ci) * g->H * g->W;
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                const float *cr = col + (ci * kk + ki * g->kw + kj) * ldc + b * Q;
                int64_t ow0, ow1;
                ow_range(g, kj, &ow0, &ow1);
                const int64_t off = kj - g->pad;
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    const int64_t ih = oh * s - g->pad + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    float *restrict drow = dc + ih * g->W;
                    const float *restrict src = cr + (oh - oh0) * g->Wo;
                    if (s == 1) {
#pragma omp simd
                        for (int64_t ow = ow0; ow < ow1; ow++) drow[ow + off] += src[ow];
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) drow[ow * s + off] += src[ow];
                    }
                }
            }
    }
}
