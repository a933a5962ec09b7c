/* norm.c — fused RMSNorm / LayerNorm / GroupNorm kernels (see norm.h).
 *
 * Mirrors transformers' Qwen2RMSNorm (variance in f32, x * rsqrt(var + eps) * w) and
 * torch.nn.LayerNorm / nn.GroupNorm (biased variance). Row statistics use a two-pass
 * mean/variance over a row that is still in cache; reductions inside a row are
 * `omp simd` lane sums (fixed order for a given build). Rows are independent, so the
 * forward and dx are parallel over rows; dw/db go through fixed row blocks (norm.h). */
#include "norm.h"

#include <math.h>
#include <string.h>

#define NORM_MAX_BLOCKS 64
#define PAR_MIN 32768   /* elements below which threading costs more than it saves */

static inline int64_t n_blocks(int64_t R) { return R < NORM_MAX_BLOCKS ? R : NORM_MAX_BLOCKS; }

size_t mmc_cpu_norm_partial_floats(int64_t R, int64_t C) {
    return (size_t)(2 * n_blocks(R) * C);
}

static inline float row_sum(const float *x, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += x[j];
    return s;
}

/* dst[j] += sum over blocks b (in order) of part[b * C + j] */
static void reduce_blocks(float *dst, const float *part, int64_t nb, int64_t C) {
#pragma omp parallel for schedule(static) if (nb * C > PAR_MIN)
    for (int64_t j0 = 0; j0 < C; j0 += 64) {
        int64_t j1 = j0 + 64 < C ? j0 + 64 : C;
        for (int64_t j = j0; j < j1; j++) {
            float s = 0;
            for (int64_t b = 0; b < nb; b++) s += part[b * C + j];
            dst[j] += s;
        }
    }
}

/* ------------------------------------------------------------------ RMSNorm */
void mmc_cpu_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t R,
                         int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < C; j++) ss += xr[j] * xr[j];
        float rs = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[r] = rs;
        if (w) {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) yr[j] = w[j] * (xr[j] * rs);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) yr[j] = xr[j] * rs;
        }
    }
}

void mmc_cpu_rmsnorm_bwd(const float *x, const float *w, const float *rstd, const float *dy,
                         float *dx, float *dw, float *partial, int64_t R, int64_t C) {
    int64_t nb = n_blocks(R);
    if (nb == 0) return;
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * R / nb, r1 = (b + 1) * R / nb;
        float *pw = dw ? partial + b * C : NULL;
        if (pw) memset(pw, 0, (size_t)C * sizeof(float));
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * C, *gr = dy + r * C;
            float rs = rstd[r];
            if (pw) {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) pw[j] += gr[j] * (xr[j] * rs);
            }
            if (!dx) continue;
            float *dxr = dx + r * C;
            float dot = 0;   /* sum_j g_j * xhat_j with g = dy * w */
            if (w) {
#pragma omp simd reduction(+ : dot)
                for (int64_t j = 0; j < C; j++) dot += gr[j] * w[j] * xr[j];
            } else {
#pragma omp simd reduction(+ : dot)
                for (int64_t j = 0; j < C; j++) dot += gr[j] * xr[j];
            }
            float k = dot * rs * rs / (float)C;   /* xhat * mean(g * xhat) == x * k */
            if (w) {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) dxr[j] += rs * (gr[j] * w[j] - xr[j] * k);
            } else {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) dxr[j] += rs * (gr[j] - xr[j] * k);
            }
        }
    }
    if (dw) reduce_blocks(dw, partial, nb, C);
}

/* ------------------------------------------------------------------ LayerNorm */
void mmc_cpu_layernorm_fwd(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t R, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        float mu = row_sum(xr, C) / (float)C, v = 0;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < C; j++) v += (xr[j] - mu) * (xr[j] - mu);
        float rs = 1.0f / sqrtf(v / (float)C + eps);
        mean[r] = mu;
        rstd[r] = rs;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) {
            float h = (xr[j] - mu) * rs;
            yr[j] = (w ? h * w[j] : h) + (b ? b[j] : 0.0f);
        }
    }
}

void mmc_cpu_layernorm_bwd(const float *x, const float *w, const float *mean, const float *rstd,
                           const float *dy, float *dx, float *dw, float *db, float *partial,
                           int64_t R, int64_t C) {
    int64_t nb = n_blocks(R);
    if (nb == 0) return;
    float *pw_all = partial, *pb_all = partial + nb * C;
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
    for (int64_t bk = 0; bk < nb; bk++) {
        int64_t r0 = bk * R / nb, r1 = (bk + 1) * R / nb;
        float *pw = dw ? pw_all + bk * C : NULL, *pb = db ? pb_all + bk * C : NULL;
        if (pw) memset(pw, 0, (size_t)C * sizeof(float));
        if (pb) memset(pb, 0, (size_t)C * sizeof(float));
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * C, *gr = dy + r * C;
            float mu = mean[r], rs = rstd[r];
            if (pw) {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) pw[j] += gr[j] * ((xr[j] - mu) * rs);
            }
            if (pb) {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) pb[j] += gr[j];
            }
            if (!dx) continue;
            float *dxr = dx + r * C;
            float sg = 0, sgx = 0;   /* sum g, sum g * xhat with g = dy * w */
#pragma omp simd reduction(+ : sg, sgx)
            for (int64_t j = 0; j < C; j++) {
                float g = w ? gr[j] * w[j] : gr[j];
                sg += g;
                sgx += g * ((xr[j] - mu) * rs);
            }
            float mg = sg / (float)C, mgx = sgx / (float)C;
#pragma omp simd
            for (int64_t j = 0; j < C; j++) {
                float g = w ? gr[j] * w[j] : gr[j];
                dxr[j] += rs * (g - mg - (xr[j] - mu) * rs * mgx);
            }
        }
    }
    if (dw) reduce_blocks(dw, pw_all, nb, C);
    if (db) reduce_blocks(db, pb_all, nb, C);
}

/* ------------------------------------------------------------------ GroupNorm */
void mmc_cpu_groupnorm_fwd(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t N, int64_t C, int64_t S, int64_t G, float eps) {
    int64_t Cg = C / G, L = Cg * S;
#pragma omp parallel for schedule(static) if (N * C * S > PAR_MIN)
    for (int64_t ng = 0; ng < N * G; ng++) {
        int64_t n = ng / G, g = ng % G;
        const float *xg = x + (n * C + g * Cg) * S;
        float *yg = y + (n * C + g * Cg) * S;
        double s = 0;   /* per-channel f32 sums, accumulated in double across channels */
        for (int64_t c = 0; c < Cg; c++) s += row_sum(xg + c * S, S);
        float mu = (float)(s / (double)L);
        double v = 0;
        for (int64_t c = 0; c < Cg; c++) {
            const float *xc = xg + c * S;
            float vc = 0;
#pragma omp simd reduction(+ : vc)
            for (int64_t j = 0; j < S; j++) vc += (xc[j] - mu) * (xc[j] - mu);
            v += vc;
        }
        float rs = (float)(1.0 / sqrt(v / (double)L + (double)eps));
        mean[ng] = mu;
        rstd[ng] = rs;
        for (int64_t c = 0; c < Cg; c++) {
            int64_t ch = g * Cg + c;
            float a = w ? w[ch] * rs : rs, sh = (b ? b[ch] : 0.0f) - mu * a;
            const float *xc = xg + c * S;
            float *yc = yg + c * S;
#pragma omp simd
            for (int64_t j = 0; j < S; j++) yc[j] = xc[j] * a + sh;
        }
    }
}

void mmc_cpu_groupnorm_affine(const float *x, const float *w, const float *b, float *a, float *shift, int64_t N,
                              int64_t C, int64_t S, int64_t G, float eps) {
    int64_t Cg = C / G, L = Cg * S;
#pragma omp parallel for schedule(static) if (N * C * S > PAR_MIN)
    for (int64_t ng = 0; ng < N * G; ng++) {   /* the statistics exactly as mmc_cpu_groupnorm_fwd */
        int64_t n = ng / G, g = ng % G;
        const float *xg = x + (n * C + g * Cg) * S;
        double s = 0;
        for (int64_t c = 0; c < Cg; c++) s += row_sum(xg + c * S, S);
        float mu = (float)(s / (double)L);
        double v = 0;
        for (int64_t c = 0; c < Cg; c++) {
            const float *xc = xg + c * S;
            float vc = 0;
#pragma omp simd reduction(+ : vc)
            for (int64_t j = 0; j < S; j++) vc += (xc[j] - mu) * (xc[j] - mu);
            v += vc;
        }
        float rs = (float)(1.0 / sqrt(v / (double)L + (double)eps));
        for (int64_t c = 0; c < Cg; c++) {
            int64_t ch = g * Cg + c;
            float ac = w ? w[ch] * rs : rs, sh = (b ? b[ch] : 0.0f) - mu * ac;
            a[n * C + ch] = ac;
            shift[n * C + ch] = sh;
        }
    }
}

void mmc_cpu_groupnorm_bwd(const float *x, const float *w, const float *mean, const float *rstd,
                           const float *dy, float *dx, float *dw, float *db, float *partial,
                           int64_t N, int64_t C, int64_t S, int64_t G) {
    int64_t Cg = C / G, L = Cg * S;
    float *A = partial, *B = partial + N * C;   /* [N, C]: sum dy * xhat, sum dy per channel */
#pragma omp parallel for schedule(static) if (N * C * S > PAR_MIN)
    for (int64_t ng = 0; ng < N * G; ng++) {
        int64_t n = ng / G, g = ng % G;
        float mu = mean[ng], rs = rstd[ng];
        double sgx = 0, sg = 0;
        for (int64_t c = 0; c < Cg; c++) {
            int64_t ch = g * Cg + c, off = (n * C + ch) * S;
            const float *xc = x + off, *gc = dy + off;
            float a = 0, bsum = 0;
#pragma omp simd reduction(+ : a, bsum)
            for (int64_t j = 0; j < S; j++) {
                a += gc[j] * ((xc[j] - mu) * rs);
                bsum += gc[j];
            }
            A[n * C + ch] = a;
            B[n * C + ch] = bsum;
            float wc = w ? w[ch] : 1.0f;
            sgx += (double)(wc * a);
            sg += (double)(wc * bsum);
        }
        if (!dx) continue;
        float mg = (float)(sg / (double)L), mgx = (float)(sgx / (double)L);
        for (int64_t c = 0; c < Cg; c++) {
            int64_t ch = g * Cg + c, off = (n * C + ch) * S;
            const float *xc = x + off, *gc = dy + off;
            float *dxc = dx + off;
            float wc = w ? w[ch] : 1.0f;
#pragma omp simd
            for (int64_t j = 0; j < S; j++)
                dxc[j] += rs * (gc[j] * wc - mg - (xc[j] - mu) * rs * mgx);
        }
    }
    if (!dw && !db) return;
    for (int64_t ch = 0; ch < C; ch++) {
        float sa = 0, sb = 0;
        for (int64_t n = 0; n < N; n++) {
            sa += A[n * C + ch];
            sb += B[n * C + ch];
        }
        if (dw) dw[ch] += sa;
        if (db) db[ch] += sb;
    }
}
