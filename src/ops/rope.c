/* rope.c — rotary position embeddings: the apply op (HF rotate_half convention, as in
 * transformers' apply_rotary_pos_emb / apply_rotary_pos_emb_vision) and the cos/sin tables
 * of Qwen2RotaryEmbedding (1-D default rope), Qwen2VLRotaryEmbedding (M-RoPE: bands split
 * by mrope_section, section i taking its positions from row i of [3, B, T]) and
 * Qwen2VLVisionRotaryEmbedding + get_vision_position_ids (2-D axial rope over
 * spatial-merge windows). Tables are computed in float32 the way torch computes them
 * (inv_freq = 1 / theta^(arange(0, dim, 2) / dim), angle = float(pos) * inv_freq) so they
 * match transformers to the last bit or two. The interleaved variant and the multi-axis
 * table of diffusers' FluxPosEmbed (get_1d_rotary_pos_embed per axis, in float64, cast to
 * float32, each angle repeated twice, axes concatenated) serve the diffusion transformers.
 */
#include "mmc.h"
#include "mmc_ops.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ apply */
/* y = x*cos + rotate_half(x)*sin over one row of D (h = D/2):
 *   y[i] = x[i] c[i] - x[i+h] s[i]   (i < h);   y[i] = x[i] c[i] + x[i-h] s[i]   (i >= h)
 * Its transpose (backward):
 *   dx[i] = dy[i] c[i] + dy[i+h] s[i+h]  (i < h); dx[i] = dy[i] c[i] - dy[i-h] s[i-h] (i >= h) */
static inline void rope_row(float *restrict y, const float *restrict x, const float *restrict c,
                            const float *restrict s, int D) {
    int h = D / 2;
    for (int i = 0; i < h; i++) {
        y[i] = x[i] * c[i] - x[i + h] * s[i];
        y[i + h] = x[i + h] * c[i + h] + x[i] * s[i + h];
    }
}
static inline void rope_row_bw(float *restrict dx, const float *restrict dy, const float *restrict c,
                               const float *restrict s, int D) {
    int h = D / 2;
    for (int i = 0; i < h; i++) {
        dx[i] += dy[i] * c[i] + dy[i + h] * s[i + h];
        dx[i + h] += dy[i + h] * c[i + h] - dy[i] * s[i];
    }
}

/* The interleaved convention (diffusers' apply_rotary_emb with use_real_unbind_dim=-1: Flux,
 * HunyuanDiT, CogVideoX): pairs (x[2i], x[2i+1]) rotate as complex numbers, the tables
 * repeat each angle twice (c[2i] == c[2i+1]):
 *   y[2i] = x[2i] c[2i] - x[2i+1] s[2i];   y[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]
 * and its transpose dx[2i] = dy[2i] c[2i] + dy[2i+1] s[2i+1], dx[2i+1] = dy[2i+1] c[2i+1] - dy[2i] s[2i]. */
static inline void rope_row_pairs(float *restrict y, const float *restrict x, const float *restrict c,
                                  const float *restrict s, int D) {
    for (int i = 0; i < D; i += 2) {
        y[i] = x[i] * c[i] - x[i + 1] * s[i];
        y[i + 1] = x[i + 1] * c[i + 1] + x[i] * s[i + 1];
    }
}
static inline void rope_row_pairs_bw(float *restrict dx, const float *restrict dy, const float *restrict c,
                                     const float *restrict s, int D) {
    for (int i = 0; i < D; i += 2) {
        dx[i] += dy[i] * c[i] + dy[i + 1] * s[i + 1];
        dx[i + 1] += dy[i + 1] * c[i + 1] - dy[i] * s[i];
    }
}

static void rope_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    const mmc_tensor *cs = n->saved[0], *sn = n->saved[1];
    const int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3];
    const bool batched = cs->ndim == 3;
    float *gx = mmc_grad(ctx, x)->data;
    const float *gy = n->out->grad->data;
#pragma omp parallel for schedule(static) if (B * T * H * D > 32768)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t row = batched ? bt : bt % T;
        const float *c = (const float *)cs->data + row * D, *s = (const float *)sn->data + row * D;
        for (int64_t h = 0; h < H; h++) {
            if (n->i[0]) rope_row_pairs_bw(gx + (bt * H + h) * D, gy + (bt * H + h) * D, c, s, (int)D);
            else rope_row_bw(gx + (bt * H + h) * D, gy + (bt * H + h) * D, c, s, (int)D);
        }
    }
}

static mmc_tensor *rope_apply(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin, bool pairs) {
    char sx[64], sc[64], ss[64];
    mmc_shape_str(x, sx, sizeof sx);
    mmc_shape_str(cos, sc, sizeof sc);
    mmc_shape_str(sin, ss, sizeof ss);
    MMC_CHECK(x->ndim == 4 && x->dtype == MMC_F32 && x->shape[3] % 2 == 0,
              "mmc_rope: x %s must be f32 [B, T, H, D] with even D", sx);
    MMC_CHECK(x->stride[3] == 1, "mmc_rope: the last dim of x %s must be contiguous", sx);
    const int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3];
    MMC_CHECK(mmc_same_shape(cos, sin) && cos->dtype == MMC_F32 && sin->dtype == MMC_F32 &&
                  mmc_is_contiguous(cos) && mmc_is_contiguous(sin),
              "mmc_rope: cos %s and sin %s must be contiguous f32 of one shape", sc, ss);
    MMC_CHECK((cos->ndim == 2 && cos->shape[0] == T && cos->shape[1] == D) ||
                  (cos->ndim == 3 && cos->shape[0] == B && cos->shape[1] == T && cos->shape[2] == D),
              "mmc_rope: cos %s must be [T, D] or [B, T, D] for x %s", sc, sx);
    const bool batched = cos->ndim == 3;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, x->shape);
    float *yd = y->data;
    const float *xd = x->data;
#pragma omp parallel for schedule(static) if (B * T * H * D > 32768)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T, row = batched ? bt : t;
        const float *c = (const float *)cos->data + row * D, *s = (const float *)sin->data + row * D;
        for (int64_t h = 0; h < H; h++) {
            const float *xr = xd + b * x->stride[0] + t * x->stride[1] + h * x->stride[2];
            if (pairs) rope_row_pairs(yd + (bt * H + h) * D, xr, c, s, (int)D);
            else rope_row(yd + (bt * H + h) * D, xr, c, s, (int)D);
        }
    }
    mmc_node *n = mmc_tape_record(ctx, "rope", rope_backward, y, 1, &x);
    if (n) {
        n->saved[0] = cos;
        n->saved[1] = sin;
        n->i[0] = pairs;
    }
    return y;
}

mmc_tensor *mmc_rope(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin) {
    return rope_apply(ctx, x, cos, sin, false);
}

mmc_tensor *mmc_rope_interleaved(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin) {
    return rope_apply(ctx, x, cos, sin, true);
}

void mmc_rope_table_axes(mmc_ctx *ctx, const float *ids, int64_t S, int n_axes, const int *axes_dim,
                         double theta, mmc_tensor **cos_out, mmc_tensor **sin_out) {
    int D = 0;
    for (int a = 0; a < n_axes; a++) {
        MMC_CHECK(axes_dim[a] > 0 && axes_dim[a] % 2 == 0, "rope axes: axes_dims_rope[%d] = %d must be even", a,
                  axes_dim[a]);
        D += axes_dim[a];
    }
    *cos_out = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(S, D));
    *sin_out = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(S, D));
    float *cd = (*cos_out)->data, *sd = (*sin_out)->data;
    for (int64_t r = 0; r < S; r++) {
        int off = 0;
        for (int a = 0; a < n_axes; a++) {
            const int d = axes_dim[a];
            const double pos = (double)ids[r * n_axes + a];     /* ids.float(), then outer() in float64 */
            for (int j = 0; j < d / 2; j++) {
                /* 1 / theta ** (arange(0, d, 2, float64) / d): the float64 pow, as torch does it */
                const double freq = 1.0 / pow(theta, (double)(2 * j) / (double)d);
                const double ang = pos * freq;
                const float c = (float)cos(ang), s = (float)sin(ang);
                cd[r * D + off + 2 * j] = cd[r * D + off + 2 * j + 1] = c;
                sd[r * D + off + 2 * j] = sd[r * D + off + 2 * j + 1] = s;
            }
            off += d;
        }
    }
}

/* ------------------------------------------------------------------ tables */
static int64_t pos_at(const mmc_tensor *p, int64_t i) {
    MMC_CHECK(mmc_is_contiguous(p), "rope table: positions must be contiguous");
    if (p->dtype == MMC_I32) return ((const int32_t *)p->data)[i];
    MMC_CHECK(p->dtype == MMC_I64, "rope table: positions must be i32 or i64 (got %s)", mmc_dtype_name(p->dtype));
    return ((const int64_t *)p->data)[i];
}

/* inv_freq[j] = 1 / theta^((2j) / dim), in float32 as torch evaluates it. */
static void inv_freq(float *out, int dim, double theta) {
    for (int j = 0; j < dim / 2; j++) out[j] = 1.0f / powf((float)theta, (float)(2 * j) / (float)dim);
}

void mmc_rope_inv_freq(float *inv, int D, double theta) { inv_freq(inv, D, theta); }

void mmc_rope_table_1d(mmc_ctx *ctx, const mmc_tensor *pos, int D, double theta,
                       mmc_tensor **cos, mmc_tensor **sin) {
    MMC_CHECK(D > 0 && D % 2 == 0, "mmc_rope_table_1d: D = %d must be even", D);
    float inv[D / 2];
    inv_freq(inv, D, theta);
    mmc_rope_table_1d_freqs(ctx, pos, D, inv, cos, sin);
}

void mmc_rope_table_1d_freqs(mmc_ctx *ctx, const mmc_tensor *pos, int D, const float *inv,
                             mmc_tensor **cos, mmc_tensor **sin) {
    MMC_CHECK(pos->ndim == 1 || pos->ndim == 2, "mmc_rope_table_1d: pos must be [T] or [B, T]");
    MMC_CHECK(D > 0 && D % 2 == 0, "mmc_rope_table_1d: D = %d must be even", D);
    int64_t shape[3] = {pos->shape[0], pos->ndim == 2 ? pos->shape[1] : D, D};
    *cos = mmc_new(ctx, MMC_F32, pos->ndim + 1, shape);
    *sin = mmc_new(ctx, MMC_F32, pos->ndim + 1, shape);
    int64_t n = mmc_numel(pos);
    float *c = (*cos)->data, *s = (*sin)->data;
    for (int64_t i = 0; i < n; i++) {
        float p = (float)pos_at(pos, i);
        for (int j = 0; j < D / 2; j++) {
            float a = p * inv[j];
            c[i * D + j] = c[i * D + j + D / 2] = cosf(a);
            s[i * D + j] = s[i * D + j + D / 2] = sinf(a);
        }
    }
}

void mmc_rope_table_mrope(mmc_ctx *ctx, const mmc_tensor *pos, const int section[3], int D,
                          double theta, mmc_tensor **cos, mmc_tensor **sin) {
    MMC_CHECK(pos->ndim == 3 && pos->shape[0] == 3, "mmc_rope_table_mrope: pos must be [3, B, T]");
    MMC_CHECK(D > 0 && D % 2 == 0 && section[0] >= 0 && section[1] >= 0 && section[2] >= 0 &&
                  section[0] + section[1] + section[2] == D / 2,
              "mmc_rope_table_mrope: mrope_section [%d, %d, %d] must sum to D/2 = %d", section[0],
              section[1], section[2], D / 2);
    const int64_t B = pos->shape[1], T = pos->shape[2];
    *cos = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, T, D));
    *sin = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, T, D));
    float inv[D / 2];
    inv_freq(inv, D, theta);
    float *c = (*cos)->data, *s = (*sin)->data;
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int j = 0; j < D / 2; j++) {
            /* band j belongs to chunk k of freq.split(mrope_section); chunk k reads row k % 3 */
            int k = j < section[0] ? 0 : j < section[0] + section[1] ? 1 : 2;
            float a = (float)pos_at(pos, k * B * T + bt) * inv[j];
            c[bt * D + j] = c[bt * D + j + D / 2] = cosf(a);
            s[bt * D + j] = s[bt * D + j + D / 2] = sinf(a);
        }
}

void mmc_rope_table_vision2d(mmc_ctx *ctx, const int64_t *grid_thw, int n_images,
                             int spatial_merge, int D, double theta,
                             mmc_tensor **cos, mmc_tensor **sin) {
    MMC_CHECK(D > 0 && D % 4 == 0, "mmc_rope_table_vision2d: head dim %d must be a multiple of 4", D);
    MMC_CHECK(spatial_merge >= 1, "mmc_rope_table_vision2d: spatial_merge %d < 1", spatial_merge);
    int64_t L = 0;
    for (int i = 0; i < n_images; i++) {
        const int64_t t = grid_thw[3 * i], h = grid_thw[3 * i + 1], w = grid_thw[3 * i + 2];
        MMC_CHECK(t > 0 && h > 0 && w > 0 && h % spatial_merge == 0 && w % spatial_merge == 0,
                  "mmc_rope_table_vision2d: image %d grid (%lld, %lld, %lld) not divisible by "
                  "spatial_merge %d", i, (long long)t, (long long)h, (long long)w, spatial_merge);
        L += t * h * w;
    }
    *cos = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(L, D));
    *sin = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(L, D));
    const int Q = D / 4;          /* bands per axis; the axial rope has dim D/2 */
    float inv[Q];
    inv_freq(inv, D / 2, theta);
    float *c = (*cos)->data, *s = (*sin)->data;
    int64_t l = 0;
    const int m = spatial_merge;
    for (int i = 0; i < n_images; i++) {
        const int64_t t = grid_thw[3 * i], h = grid_thw[3 * i + 1], w = grid_thw[3 * i + 2];
        /* token order: frames, then merge windows row-major, then m x m inside a window */
        for (int64_t f = 0; f < t; f++)
            for (int64_t bh = 0; bh < h / m; bh++)
                for (int64_t bw = 0; bw < w / m; bw++)
                    for (int ih = 0; ih < m; ih++)
                        for (int iw = 0; iw < m; iw++, l++) {
                            float ph = (float)(bh * m + ih), pw = (float)(bw * m + iw);
                            float *cr = c + l * D, *sr = s + l * D;
                            for (int j = 0; j < Q; j++) {
                                float ah = ph * inv[j], aw = pw * inv[j];
                                cr[j] = cr[j + 2 * Q] = cosf(ah);
                                sr[j] = sr[j + 2 * Q] = sinf(ah);
                                cr[j + Q] = cr[j + 3 * Q] = cosf(aw);
                                sr[j + Q] = sr[j + 3 * Q] = sinf(aw);
                            }
                        }
    }
}
