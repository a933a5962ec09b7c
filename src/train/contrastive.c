/* contrastive.c — the contrastive losses of transformers' dual encoders and their gradients, the
 * objective of contrastive training (`mmc train` over CLIPModel folders: trainer_contrastive.c):
 *
 *   u = img / |img|, v = txt / |txt|             the pooled projections, normalised     [n, D]
 *   CLIP (CLIPModel.forward(return_loss=True), clip_loss; logit_scale not clamped):
 *     z = exp(logit_scale) u v^T                  logits_per_image                      [n, n]
 *     loss = (CE(z^T, diag) + CE(z, diag)) / 2    the mean cross-entropy of each direction
 *     dL/dz_ij = (softmax_j(z_i.)_j - [i=j]) / 2n + (softmax_i(z_.j)_i - [i=j]) / 2n
 *   SigLIP (SiglipModel.forward(return_loss=True)):
 *     z = exp(logit_scale) v u^T + logit_bias     logits_per_text                       [n, n]
 *     loss = -(1/n) sum_t sum_i logsigmoid(m_ti z_ti),  m = 2 eye - 1
 *     dL/dz_ti = -(1/n) m_ti sigmoid(-m_ti z_ti)
 *   then through the dot products (scale e^s), e^s and the bias, and the normalisation:
 *     d img_i = (g_i - u_i (u_i . g_i)) / |img_i|,  g_i = sum_j dL/d(u_i . v_j) v_j.
 * Everything in double; the batch pairs image i with text i. */
#include "mmc_embed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double log1pexp(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

mmc_status mmc_contrastive_loss(mmc_contrastive_kind kind, const float *img, const float *txt, int64_t n, int64_t D,
                                double logit_scale, double logit_bias, mmc_contrastive_out *o) {
    o->loss = o->d_logit_scale = o->d_logit_bias = 0;
    if (n < 1 || D < 1 || (kind != MMC_CONTRASTIVE_CLIP && kind != MMC_CONTRASTIVE_SIGLIP))
        return mmc_error(MMC_ERR_INVALID, "contrastive loss: a batch of n >= 1 pairs of D >= 1 dims and a known kind");
    double *u = malloc(sizeof(double) * (size_t)(2 * n * D + 2 * n + 2 * n * n)), *v = u + n * D;
    if (!u) return mmc_error(MMC_ERR_OOM, "out of memory");
    double *nu = v + n * D, *nv = nu + n, *z = nv + n, *g = z + n * n;
    for (int64_t i = 0; i < n; i++) {
        double a = 0, b = 0;
        for (int64_t k = 0; k < D; k++) a += (double)img[i * D + k] * img[i * D + k], b += (double)txt[i * D + k] * txt[i * D + k];
        nu[i] = sqrt(a), nv[i] = sqrt(b);
        for (int64_t k = 0; k < D; k++) u[i * D + k] = img[i * D + k] / nu[i], v[i * D + k] = txt[i * D + k] / nv[i];
    }
    const double scale = exp(logit_scale), bias = kind == MMC_CONTRASTIVE_SIGLIP ? logit_bias : 0.0;
    /* z[i][j]: image i, text j (the SigLIP formula's z_ti is z[i][t]) */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double d = 0;
            for (int64_t k = 0; k < D; k++) d += u[i * D + k] * v[j * D + k];
            z[i * n + j] = scale * d + bias;
        }
    double loss = 0;
    memset(g, 0, sizeof(double) * (size_t)(n * n));
    if (kind == MMC_CONTRASTIVE_CLIP) {
        for (int dir = 0; dir < 2; dir++)   /* 0: rows (image -> texts), 1: columns (text -> images) */
            for (int64_t a = 0; a < n; a++) {
                double mx = -INFINITY, se = 0;
                for (int64_t b = 0; b < n; b++) mx = fmax(mx, dir ? z[b * n + a] : z[a * n + b]);
                for (int64_t b = 0; b < n; b++) se += exp((dir ? z[b * n + a] : z[a * n + b]) - mx);
                const double lse = mx + log(se);
                loss += (lse - z[a * n + a]) / (2.0 * (double)n);
                for (int64_t b = 0; b < n; b++) {
                    const int64_t idx = dir ? b * n + a : a * n + b;
                    g[idx] += (exp(z[idx] - lse) - (a == b)) / (2.0 * (double)n);
                }
            }
    } else {
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) {
                const double m = i == j ? 1.0 : -1.0, x = m * z[i * n + j];
                loss += log1pexp(-x) / (double)n;                          /* -logsigmoid(x) */
                g[i * n + j] = -m / (1.0 + exp(x)) / (double)n;            /* -(1/n) m sigmoid(-x) */
            }
    }
    o->loss = loss;
    double ds = 0, db = 0;
    for (int64_t i = 0; i < n * n; i++) ds += g[i] * (z[i] - bias), db += g[i];
    o->d_logit_scale = ds;   /* d(e^s * dot)/ds = e^s * dot = z - bias */
    o->d_logit_bias = kind == MMC_CONTRASTIVE_SIGLIP ? db : 0.0;
    /* through the dot products and the normalisation */
    for (int side = 0; side < 2; side++) {
        const double *self = side ? v : u, *other = side ? u : v, *nrm = side ? nv : nu;
        float *out = side ? o->d_txt : o->d_img;
        if (!out) continue;
        for (int64_t a = 0; a < n; a++) {
            double gr[4096], *gv = D <= 4096 ? gr : malloc(sizeof(double) * (size_t)D);
            if (!gv) { free(u); return mmc_error(MMC_ERR_OOM, "out of memory"); }
            for (int64_t k = 0; k < D; k++) gv[k] = 0;
            for (int64_t b = 0; b < n; b++) {
                const double w = scale * (side ? g[b * n + a] : g[a * n + b]);
                for (int64_t k = 0; k < D; k++) gv[k] += w * other[b * D + k];
            }
            double dot = 0;
            for (int64_t k = 0; k < D; k++) dot += self[a * D + k] * gv[k];
            for (int64_t k = 0; k < D; k++) out[a * D + k] = (float)((gv[k] - self[a * D + k] * dot) / nrm[a]);
            if (gv != gr) free(gv);
        }
    }
    free(u);
    return MMC_OK;
}
