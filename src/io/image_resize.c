/* image_resize.c — Pillow-exact resampling of 8-bit RGB images (mirrors Pillow's
 * libImaging/Resample.c algorithm: per-output-pixel kernel windows computed in double,
 * normalised, converted to 22-bit fixed point; a horizontal pass then a vertical pass,
 * each rounding and clamping to uint8), plus a float variant in the style of
 * torch.nn.functional.interpolate(antialias=True) used by torchvision / HF fast processors.
 */
#include "mmc_image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2)

static double bicubic(double x) {
    const double a = -0.5; /* Pillow's (and torch's antialiased) cubic */
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}
static double bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Kernel windows for one axis: bounds[2*o] = first input index, bounds[2*o+1] = count,
 * kk[o*ksize + j] = normalised weight. Returns ksize, or 0 on OOM. */
static int coeffs(int in_size, int out_size, mmc_resample f, int **bounds_out, double **kk_out) {
    double (*filt)(double) = f == MMC_RESAMPLE_BICUBIC ? bicubic : bilinear;
    double fsupport = f == MMC_RESAMPLE_BICUBIC ? 2.0 : 1.0;
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = fsupport * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *kk = malloc(sizeof(double) * (size_t)out_size * ksize);
    int *bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    if (!kk || !bounds) { free(kk); free(bounds); return 0; }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = kk + (size_t)xx * ksize;
        int x;
        for (x = 0; x < xmax; x++) {
            double w = filt((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++) if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        bounds[2 * xx] = xmin;
        bounds[2 * xx + 1] = xmax;
    }
    *bounds_out = bounds;
    *kk_out = kk;
    return ksize;
}

/* Fixed-point weights with `prec` fraction bits; prec < 0: torch's uint8 kernels' choice (ported
 * from Pillow-SIMD), the most bits for which the axis's largest weight still fits in int16. */
static int *fixed_coeffs(const double *kk, size_t n, int *prec) {
    if (*prec < 0) {
        double m = 0;
        for (size_t i = 0; i < n; i++) m = kk[i] > m ? kk[i] : m;
        for (*prec = 0; *prec < PRECISION_BITS; ++*prec)
            if ((int)(0.5 + m * (1 << (*prec + 1))) >= (1 << 15)) break;
    }
    int *k = malloc(sizeof(int) * n);
    if (!k) return NULL;
    for (size_t i = 0; i < n; i++)
        k[i] = kk[i] < 0 ? (int)(-0.5 + kk[i] * (1 << *prec)) : (int)(0.5 + kk[i] * (1 << *prec));
    return k;
}

static inline uint8_t clip8(int v, int prec) {
    v >>= prec;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

static mmc_status resize_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f, bool torch_prec,
                            mmc_image *dst);

mmc_status mmc_image_resize(const mmc_image *src, int out_h, int out_w, mmc_resample f, mmc_image *dst) {
    return resize_u8(src, out_h, out_w, f, false, dst);
}

mmc_status mmc_image_resize_torch_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f, mmc_image *dst) {
    return resize_u8(src, out_h, out_w, f, true, dst);
}

static mmc_status resize_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f, bool torch_prec,
                            mmc_image *dst) {
    int H = src->height, W = src->width;
    if (out_h <= 0 || out_w <= 0 || H <= 0 || W <= 0)
        return mmc_error(MMC_ERR_INVALID, "image resize: bad sizes %dx%d -> %dx%d", W, H, out_w, out_h);
    mmc_status st = mmc_image_alloc(dst, out_h, out_w);
    if (st) return st;
    if (out_h == H && out_w == W) { /* Pillow returns a copy */
        memcpy(dst->data, src->data, (size_t)H * W * 3);
        return MMC_OK;
    }
    int *bh = NULL, *bv = NULL, *kh = NULL, *kv = NULL;
    double *dh = NULL, *dv = NULL;
    uint8_t *tmp = NULL;
    int ksh = 0, ksv = 0;
    int need_h = out_w != W, need_v = out_h != H;
    if (need_h && !(ksh = coeffs(W, out_w, f, &bh, &dh))) goto oom;
    if (need_v && !(ksv = coeffs(H, out_h, f, &bv, &dv))) goto oom;
    int ph = torch_prec ? -1 : PRECISION_BITS, pv = ph;
    if (need_h && !(kh = fixed_coeffs(dh, (size_t)out_w * ksh, &ph))) goto oom;
    if (need_v && !(kv = fixed_coeffs(dv, (size_t)out_h * ksv, &pv))) goto oom;
    /* Horizontal pass over the rows the vertical pass reads (all of them when upscaling). */
    const uint8_t *hin = src->data;
    int ybox0 = 0, ybox1 = H;
    if (need_v) {
        ybox0 = bv[0];
        ybox1 = bv[2 * (out_h - 1)] + bv[2 * (out_h - 1) + 1];
    }
    if (need_h) {
        uint8_t *hout = need_v ? (tmp = malloc((size_t)(ybox1 - ybox0) * out_w * 3)) : dst->data;
        if (!hout) goto oom;
#pragma omp parallel for schedule(static) if ((ybox1 - ybox0) * out_w > 65536)
        for (int y = ybox0; y < ybox1; y++) {
            const uint8_t *row = src->data + (size_t)y * W * 3;
            uint8_t *o = hout + (size_t)(y - ybox0) * out_w * 3;
            for (int xx = 0; xx < out_w; xx++) {
                int xmin = bh[2 * xx], xn = bh[2 * xx + 1];
                const int *k = kh + (size_t)xx * ksh;
                int s0 = 1 << (ph - 1), s1 = s0, s2 = s0;
                const uint8_t *p = row + (size_t)xmin * 3;
                for (int x = 0; x < xn; x++) {
                    s0 += p[3 * x] * k[x];
                    s1 += p[3 * x + 1] * k[x];
                    s2 += p[3 * x + 2] * k[x];
                }
                o[3 * xx] = clip8(s0, ph);
                o[3 * xx + 1] = clip8(s1, ph);
                o[3 * xx + 2] = clip8(s2, ph);
            }
        }
        hin = hout;
    } else {
        hin = src->data + (size_t)ybox0 * W * 3;
    }
    if (need_v) {
        int w3 = out_w * 3;
        /* rows are accumulated whole (the x loop innermost vectorises); integer sums in the same
         * order as Pillow's per-pixel loop, so the bytes are the same */
#pragma omp parallel if (out_h * out_w > 65536)
        {
            int *acc = malloc(sizeof(int) * (size_t)w3);
#pragma omp for schedule(static)
            for (int yy = 0; yy < out_h; yy++) {
                int ymin = bv[2 * yy] - ybox0, yn = bv[2 * yy + 1];
                const int *k = kv + (size_t)yy * ksv;
                uint8_t *o = dst->data + (size_t)yy * w3;
                if (!acc) {   /* no scratch row: the per-pixel loop */
                    for (int x = 0; x < w3; x++) {
                        int s = 1 << (pv - 1);
                        const uint8_t *p = hin + (size_t)ymin * w3 + x;
                        for (int y = 0; y < yn; y++) s += p[(size_t)y * w3] * k[y];
                        o[x] = clip8(s, pv);
                    }
                    continue;
                }
                for (int x = 0; x < w3; x++) acc[x] = 1 << (pv - 1);
                for (int y = 0; y < yn; y++) {
                    const uint8_t *p = hin + (size_t)(ymin + y) * w3;
                    int ky = k[y];
                    for (int x = 0; x < w3; x++) acc[x] += p[x] * ky;
                }
                for (int x = 0; x < w3; x++) o[x] = clip8(acc[x], pv);
            }
            free(acc);
        }
    }
    free(bh); free(bv); free(kh); free(kv); free(dh); free(dv); free(tmp);
    return MMC_OK;
oom:
    free(bh); free(bv); free(kh); free(kv); free(dh); free(dv); free(tmp);
    mmc_image_free(dst);
    return mmc_error(MMC_ERR_OOM, "image resize: out of memory (%dx%d -> %dx%d)", W, H, out_w, out_h);
}

/* Float, torch-style (interpolate antialias=True, align_corners=False): the same kernel
 * windows (torch ports Pillow's), weights in float, no rounding between the passes. */
mmc_status mmc_resize_f32(const float *src, int C, int H, int W, float *dst, int out_h, int out_w,
                          mmc_resample f) {
    if (out_h <= 0 || out_w <= 0 || H <= 0 || W <= 0 || C <= 0)
        return mmc_error(MMC_ERR_INVALID, "resize_f32: bad sizes %dx%d -> %dx%d", W, H, out_w, out_h);
    int *bh = NULL, *bv = NULL;
    double *dh = NULL, *dv = NULL;
    float *tmp = NULL;
    int ksh = coeffs(W, out_w, f, &bh, &dh), ksv = coeffs(H, out_h, f, &bv, &dv);
    tmp = malloc(sizeof(float) * (size_t)C * H * out_w);
    if (!ksh || !ksv || !tmp) {
        free(bh); free(bv); free(dh); free(dv); free(tmp);
        return mmc_error(MMC_ERR_OOM, "resize_f32: out of memory");
    }
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++) {
            const float *row = src + ((size_t)c * H + y) * W;
            float *o = tmp + ((size_t)c * H + y) * out_w;
            for (int xx = 0; xx < out_w; xx++) {
                const double *k = dh + (size_t)xx * ksh;
                float s = 0;
                for (int x = 0; x < bh[2 * xx + 1]; x++) s += row[bh[2 * xx] + x] * (float)k[x];
                o[xx] = s;
            }
        }
    for (int c = 0; c < C; c++)
        for (int yy = 0; yy < out_h; yy++) {
            const double *k = dv + (size_t)yy * ksv;
            float *o = dst + ((size_t)c * out_h + yy) * out_w;
            for (int x = 0; x < out_w; x++) {
                float s = 0;
                for (int y = 0; y < bv[2 * yy + 1]; y++)
                    s += tmp[((size_t)c * H + bv[2 * yy] + y) * out_w + x] * (float)k[y];
                o[x] = s;
            }
        }
    free(bh); free(bv); free(dh); free(dv); free(tmp);
    return MMC_OK;
}
