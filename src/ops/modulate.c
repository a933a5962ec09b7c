/* modulate.c — the adaptive-LayerNorm arithmetic of diffusion transformers (DiT, Flux, SD3's
 * MMDiT), fused so a block records two small nodes instead of four broadcast ones:
 *
 *   mmc_modulate:      y = x * (1 + scale[b]) + shift[b]          (AdaLayerNormZero / Continuous)
 *   mmc_gate_residual: z = x + gate[b] * y                         (the gated residual add)
 *
 * x, y [B, T, C] contiguous; shift, scale, gate [B, C] with unit column stride, so the chunks
 * of a [B, k*C] conditioning projection (mmc_split views) go in without a copy. The
 * per-(b, c) gradients sum over T in double, in order, so they do not depend on threads. */
#include "mmc_ops.h"

static void check_bc(const char *op, const char *what, const mmc_tensor *v, int64_t B, int64_t C) {
    char s[64];
    MMC_CHECK(v && v->dtype == MMC_F32 && v->ndim == 2 && v->shape[0] == B && v->shape[1] == C && v->stride[1] == 1,
              "%s: %s must be f32 [%lld, %lld] with unit column stride, got %s", op, what, (long long)B,
              (long long)C, v ? mmc_shape_str(v, s, sizeof s) : "NULL");
}
static void check_btc(const char *op, const char *what, const mmc_tensor *x) {
    char s[64];
    MMC_CHECK(x && x->dtype == MMC_F32 && x->ndim == 3 && mmc_is_contiguous(x),
              "%s: %s must be contiguous f32 [B, T, C], got %s", op, what, x ? mmc_shape_str(x, s, sizeof s) : "NULL");
}
#define AT(v, b, c) (((const float *)(v)->data)[(b) * (v)->stride[0] + (c)])

/* ------------------------------------------------------------------ modulate */
static void modulate_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *shift = n->in[1], *scale = n->in[2];
    const int64_t B = x->shape[0], T = x->shape[1], C = x->shape[2];
    const float *gy = n->out->grad->data, *xd = x->data;
    float *gx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *gsh = mmc_requires_grad(shift) ? mmc_grad(ctx, shift)->data : NULL;
    float *gsc = mmc_requires_grad(scale) ? mmc_grad(ctx, scale)->data : NULL;
    for (int64_t b = 0; b < B; b++) {
        if (gx) {
#pragma omp parallel for schedule(static) if (T * C > 32768)
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = 0; c < C; c++)
                    gx[(b * T + t) * C + c] += gy[(b * T + t) * C + c] * (1.0f + AT(scale, b, c));
        }
        if (gsh || gsc) {
#pragma omp parallel for schedule(static) if (T * C > 32768)
            for (int64_t c = 0; c < C; c++) {
                double ssh = 0, ssc = 0;
                for (int64_t t = 0; t < T; t++) {
                    const float g = gy[(b * T + t) * C + c];
                    ssh += g;
                    ssc += (double)g * xd[(b * T + t) * C + c];
                }
                if (gsh) gsh[b * C + c] += (float)ssh;
                if (gsc) gsc[b * C + c] += (float)ssc;
            }
        }
    }
}

mmc_tensor *mmc_modulate(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *shift, mmc_tensor *scale) {
    check_btc("mmc_modulate", "x", x);
    const int64_t B = x->shape[0], T = x->shape[1], C = x->shape[2];
    check_bc("mmc_modulate", "shift", shift, B, C);
    check_bc("mmc_modulate", "scale", scale, B, C);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, x->shape);
    const float *xd = x->data;
    float *yd = y->data;
    for (int64_t b = 0; b < B; b++) {
#pragma omp parallel for schedule(static) if (T * C > 32768)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++)
                yd[(b * T + t) * C + c] = xd[(b * T + t) * C + c] * (1.0f + AT(scale, b, c)) + AT(shift, b, c);
    }
    mmc_tensor *in[3] = {x, shift, scale};
    mmc_tape_record(ctx, "modulate", modulate_backward, y, 3, in);
    return y;
}

/* ------------------------------------------------------------------ gated residual */
static void gate_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *gate = n->in[1], *y = n->in[2];
    const int64_t B = y->shape[0], T = y->shape[1], C = y->shape[2];
    const float *gz = n->out->grad->data, *yd = y->data;
    float *gx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *gg = mmc_requires_grad(gate) ? mmc_grad(ctx, gate)->data : NULL;
    float *gyd = mmc_requires_grad(y) ? mmc_grad(ctx, y)->data : NULL;
    const int64_t N = B * T * C;
    if (gx) {
#pragma omp parallel for schedule(static) if (N > 32768)
        for (int64_t i = 0; i < N; i++) gx[i] += gz[i];
    }
    for (int64_t b = 0; b < B; b++) {
        if (gyd) {
#pragma omp parallel for schedule(static) if (T * C > 32768)
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = 0; c < C; c++) gyd[(b * T + t) * C + c] += gz[(b * T + t) * C + c] * AT(gate, b, c);
        }
        if (gg) {
#pragma omp parallel for schedule(static) if (T * C > 32768)
            for (int64_t c = 0; c < C; c++) {
                double s = 0;
                for (int64_t t = 0; t < T; t++) s += (double)gz[(b * T + t) * C + c] * yd[(b * T + t) * C + c];
                gg[b * C + c] += (float)s;
            }
        }
    }
}

mmc_tensor *mmc_gate_residual(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *gate, mmc_tensor *y) {
    check_btc("mmc_gate_residual", "x", x);
    check_btc("mmc_gate_residual", "y", y);
    MMC_CHECK(mmc_same_shape(x, y), "mmc_gate_residual: x and y differ in shape");
    const int64_t B = y->shape[0], T = y->shape[1], C = y->shape[2];
    check_bc("mmc_gate_residual", "gate", gate, B, C);
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 3, y->shape);
    const float *xd = x->data, *yd = y->data;
    float *zd = z->data;
    for (int64_t b = 0; b < B; b++) {
#pragma omp parallel for schedule(static) if (T * C > 32768)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++)
                zd[(b * T + t) * C + c] = xd[(b * T + t) * C + c] + AT(gate, b, c) * yd[(b * T + t) * C + c];
    }
    mmc_tensor *in[3] = {x, gate, y};
    mmc_tape_record(ctx, "gate_residual", gate_backward, z, 3, in);
    return z;
}
