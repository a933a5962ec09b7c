/* conv.c — convolution ops.
 *
 * mmc_patch_embed: Qwen2-VL's PatchEmbed (a Conv3d / Conv2d whose stride equals its kernel,
 * applied to patches the processor already flattened): it is exactly a linear layer with
 * W viewed as [Cout, Cin*kt*kh*kw], so it runs the linear kernels on w's storage without
 * copying it.
 * mmc_conv2d: torch.nn.functional.conv2d (square stride / zero padding, no dilation or
 * groups) as im2col + GEMM, the columns built in cache-sized blocks (plan_blocks: whole
 * images grouped, or row bands of a large image) rather than one kh*kw-times-the-input
 * buffer. Two ways to run the blocks, picked from the shapes alone:
 *  - unit-parallel (>= 4 (image, band) units, e.g. a batch of small images or one large
 *    VAE-sized image): threads take whole units and run single-threaded im2col + GEMMs on
 *    their own buffers, one parallel region per pass and no barriers (see unit_mode);
 *  - team-parallel (few, large units, e.g. 512 channels at 32x32): im2col / col2im over
 *    (image, channel) items and team GEMMs per block, grouped images sharing one GEMM.
 * Backward recomputes the columns instead of keeping them (memory), dW via dy·colᵀ (as
 * dWᵀ = col·dyᵀ for small Cout), dx via col2im(Wᵀ·dy) reusing the same buffer.
 * 3x3 stride-1 layers with enough channels take Winograd F(4x4, 3x3) instead, pass by pass
 * (use_winograd below; kernels in src/backend/cpu/conv.c; errors ~1e-5 relative, test_conv).
 * bench/bench_conv.c measures it against torch's CPU conv2d. */
#include "mmc_ops.h"
#include "conv.h"
#include "gemm.h"
#include "linear.h"
#include "cpuinfo.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void check_bias(const char *op, const mmc_tensor *b, int64_t Cout) {
    char s[64];
    if (!b) return;
    MMC_CHECK((b->dtype == MMC_F32 || b->dtype == MMC_BF16) && b->ndim == 1 && b->shape[0] == Cout &&
                  mmc_is_contiguous(b),
              "%s: b must be f32/bf16 [%lld], got %s %s", op, (long long)Cout, mmc_dtype_name(b->dtype),
              mmc_shape_str(b, s, sizeof s));
}

/* ------------------------------------------------------------------ patch embed */
static void patch_embed_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    int64_t M = n->i[0], N = n->i[1], K = n->i[2];
    float *dx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *dw = mmc_requires_grad(w) ? mmc_grad(ctx, w)->data : NULL;   /* w's shape, same layout */
    float *db = mmc_requires_grad(b) ? mmc_grad(ctx, b)->data : NULL;
    mmc_cpu_linear_bwd(x->data, w->data, w->dtype == MMC_BF16, n->out->grad->data, dx, dw, db, M,
                       N, K);
}

mmc_tensor *mmc_patch_embed(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b) {
    char sx[64], sw[64];
    MMC_CHECK(x && w, "mmc_patch_embed: x and w are required");
    int64_t K = 1;
    for (int d = 1; d < w->ndim; d++) K *= w->shape[d];
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 2 && mmc_is_contiguous(x) &&
                  (w->dtype == MMC_F32 || w->dtype == MMC_BF16) && (w->ndim == 4 || w->ndim == 5) &&
                  mmc_is_contiguous(w) && x->shape[1] == K,
              "mmc_patch_embed: need x f32 [N, Cin*kt*kh*kw] and w f32/bf16 [Cout, Cin, (kt,) kh, kw] "
              "with matching sizes; got x %s, w %s %s",
              mmc_shape_str(x, sx, sizeof sx), mmc_dtype_name(w->dtype), mmc_shape_str(w, sw, sizeof sw));
    int64_t M = x->shape[0], N = w->shape[0];
    check_bias("mmc_patch_embed", b, N);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, N));   /* [N, Cout] */
    mmc_cpu_linear_fwd(x->data, w->data, w->dtype == MMC_BF16, b ? b->data : NULL,
                       b && b->dtype == MMC_BF16, y->data, M, N, K, !mmc_grad_enabled(ctx));
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "patch_embed", patch_embed_backward, y, b ? 3 : 2, in);
    if (n) {
        n->i[0] = M;
        n->i[1] = N;
        n->i[2] = K;
    }
    return y;
}

/* ------------------------------------------------------------------ conv2d */
/* w as f32: the tensor's own data, or a widened copy in scratch (bf16 weights). */
static const float *weight_f32(mmc_ctx *ctx, const mmc_tensor *w) {
    if (w->dtype == MMC_F32) return w->data;
    float *f = mmc_scratch_alloc(ctx, (size_t)mmc_numel(w) * sizeof(float));
    mmc_convert(f, MMC_F32, w->data, w->dtype, mmc_numel(w));
    return f;
}

typedef struct {
    int64_t B, Cout;
    mmc_conv_geom g;
} conv_dims;

/* Blocking of the column buffer: nb images × `rows` output rows per block, the block's
 * col [K, nb*rows*Wo] kept within a budget (default 4 MiB: it then stays in L2/L3 between
 * im2col writing it and the GEMM packing it, instead of streaming a kh*kw-times-the-input
 * buffer through memory). Small images are grouped, large ones cut into row bands; both
 * balanced so the last block is not a sliver. MMC_CONV_COL_MB overrides the budget. */
static void plan_blocks(const conv_dims *d, int64_t *nb, int64_t *rows) {
    const char *e = getenv("MMC_CONV_COL_MB");
    double budget = (e && atof(e) > 0 ? atof(e) : 4.0) * 1048576.0;
    double row = (double)d->g.Cin * d->g.kh * d->g.kw * d->g.Wo * sizeof(float);
    int64_t r = (int64_t)(budget / row);
    if (r >= d->g.Ho) {
        int64_t n = (int64_t)(budget / (row * d->g.Ho));
        n = n < 1 ? 1 : n > d->B ? d->B : n;
        int64_t groups = (d->B + n - 1) / n;
        *nb = (d->B + groups - 1) / groups, *rows = d->g.Ho;
    } else {
        /* but at least ~1024 columns: each block's GEMMs re-read W and, for dW, the whole
         * [Cout, K] gradient, which a thin block cannot amortise */
        int64_t rmin = (1024 + d->g.Wo - 1) / d->g.Wo;
        if (r < rmin) r = rmin;
        if (r > d->g.Ho) r = d->g.Ho;
        int64_t bands = (d->g.Ho + r - 1) / r;
        *nb = 1, *rows = (d->g.Ho + bands - 1) / bands;
    }
}

/* Unit-parallel mode. With several (image, row band) units the threads take whole units
 * (schedule dynamic) and run im2col + single-threaded GEMMs on their own column buffer:
 * one parallel region per pass and no barrier inside it, instead of a team-wide im2col,
 * GEMM and col2im per block, each ending in barriers. On a shared 2-core machine a
 * descheduled thread then costs its own unit, not a stall of the whole team at every
 * barrier. dW gets one partial per unit (summed in unit order afterwards, so the result does
 * not depend on which thread ran what); dx units of the same image overlap by kh-1 input
 * rows, so even bands run first, then odd bands. The choice depends only on the shapes
 * (never the thread count): results are bitwise the same for any number of threads.
 * The 32 MiB cap on those dW partials applies to the backward pass only: the forward keeps
 * no partials, so a large image with many channels (a VAE decoder's 512 channels at 128²,
 * or 128 at 512²) runs unit-parallel there too (same blocks, same single GEMM per block:
 * bitwise the same output as team mode; 3-4x faster on a busy 2-core host, where the team
 * GEMMs' barriers wait for descheduled threads). */
static int64_t max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
static bool unit_mode(const conv_dims *d, int64_t R, bool backward) {
    const mmc_conv_geom *g = &d->g;
    int64_t bands = (g->Ho + R - 1) / R, U = d->B * bands;
    double partials = (double)U * g->Cin * g->kh * g->kw * d->Cout * sizeof(float);
    return U >= 4 && (bands == 1 || R * g->stride >= g->kh) && (!backward || partials <= 32.0 * 1048576.0);
}

/* Forward only: one or a few images that fit a block whole (512 channels at 32x32, a VAE
 * decoder's mid block) make fewer than 4 units, so they would run team-parallel; cut each
 * into row bands (at least 256 output columns each) so that there are 4 units and the pass
 * runs unit-parallel. Each output column is still one GEMM column over the same K: bitwise
 * the same result. The backward keeps plan_blocks' rows (its dW GEMMs want wide blocks). */
static int64_t forward_rows(const conv_dims *d, int64_t R) {
    const mmc_conv_geom *g = &d->g;
    const int64_t bands = (g->Ho + R - 1) / R;
    if (d->B * bands >= 4 || d->B >= 4) return R;
    const int64_t want = (4 + d->B - 1) / d->B, r = (g->Ho + want - 1) / want;   /* bands per image */
    return r * g->Wo >= 256 && r * g->stride >= g->kh ? r : R;
}

/* Winograd F(4x4, 3x3) (backend conv.c) for 3x3 stride-1 convolutions: MMC_CONV_ALGO=gemm
 * keeps every pass on im2col + GEMM, =winograd takes Winograd wherever it applies, the
 * default (auto) where it is faster (measured: bench_conv; see below; AVX-512 builds only). The
 * backward-data pass is a forward over dy with the flipped kernels and padding 2 - pad, so
 * it needs pad <= 2. Errors vs the direct sum: ~1e-6 relative (tests/test_conv.c). */
enum { PASS_FWD, PASS_DX, PASS_DW };
static bool use_winograd(const conv_dims *d, int pass) {
    const mmc_conv_geom *g = &d->g;
    if (g->kh != 3 || g->kw != 3 || g->stride != 1 || g->Ho < 2 || g->Wo < 2) return false;
    if (pass == PASS_DX && g->pad > 2) return false;
    const char *e = getenv("MMC_CONV_ALGO");
    if (e && !strcmp(e, "gemm")) return false;
    if (e && !strcmp(e, "winograd")) return true;
    /* auto: the transforms cost ~ (Cin + Cout) per tile against the GEMMs' Cin * Cout; too
     * few channels or tiles leave the im2col GEMM ahead; and only where the build has the
     * AVX-512 kernels */
    return mmc_cpu_wino_fast() && g->Cin >= 16 && d->Cout >= 16 && g->Ho * g->Wo >= 64;
}
static mmc_wino_geom wino_geom(const conv_dims *d, bool bwd_data) {
    const mmc_conv_geom *g = &d->g;
    if (bwd_data)
        return (mmc_wino_geom){.C = d->Cout, .K = g->Cin, .H = g->Ho, .W = g->Wo, .Ho = g->H, .Wo = g->W,
                               .pad = 2 - g->pad};
    return (mmc_wino_geom){.C = g->Cin, .K = d->Cout, .H = g->H, .W = g->W, .Ho = g->Ho, .Wo = g->Wo,
                           .pad = g->pad};
}
/* Tiles per block of the forward / backward-data pass: each block streams all of the
 * transformed weights U (36 C K floats) through its GEMMs, so a block's transformed inputs
 * and products (36 (C + K) floats a tile) are made about as large as U (tb = C K / (C + K)),
 * and at least what fills half the L2 of one core (cpuinfo), but no more than 16 MiB a thread
 * (scratch); 32 to 256 tiles, rounded to the micro-kernel's 32 columns. MMC_CONV_WINO_TB
 * overrides. (512 channels: 112 -> 128 tiles; 128: 64; 32 -> 64: 64.) */
#define WINO_BLOCK_BYTES (16 << 20)
static int64_t wino_tb(const mmc_wino_geom *wg, int64_t B) {
    const char *e = getenv("MMC_CONV_WINO_TB");
    int64_t tb;
    if (e && atoi(e) > 0) tb = atoi(e);
    else {
        const mmc_cache_level *l2 = &mmc_cpu_info_get()->cache.l2;
        double per_core = l2->size > 0 ? (double)l2->size / (l2->shared_cpus > 1 ? l2->shared_cpus : 1) : 1048576.0;
        int64_t fit = (int64_t)(per_core / 2 / (36.0 * 4 * (wg->C + wg->K)));
        tb = wg->C * wg->K / (wg->C + wg->K);
        if (tb < fit) tb = fit;
        const int64_t cap = WINO_BLOCK_BYTES / (36 * 4 * (wg->C + wg->K));   /* memory per thread */
        if (tb > cap) tb = cap;
        tb = tb < 32 ? 32 : tb > 256 ? 256 : tb;
    }
    tb = (tb + 31) / 32 * 32;
    const int64_t T = (((wg->row1 > 0 ? wg->row1 - wg->row0 : wg->Ho) + 3) / 4) * ((wg->Wo + 3) / 4);   /* in the window */
    /* at least 4 (image, block) units where 32-tile blocks allow (else the backend's team
     * mode, meant for small images: its shared transformed input grows with the image) */
    while (tb > 32 && B * ((T + tb - 1) / tb) < 4) tb -= 32;
    return T < tb ? (T + 31) / 32 * 32 : tb;
}
/* Tiles per chunk of the weight gradient (its GEMMs' K): 512, or fewer so that the chunk's
 * transformed x and dy stay within 16 MiB, or all there are; MMC_CONV_WINO_TC overrides. */
static int64_t wino_tc(const conv_dims *d) {
    const char *e = getenv("MMC_CONV_WINO_TC");
    int64_t tc = 512;
    const int64_t cap = WINO_BLOCK_BYTES / (36 * 4 * (d->g.Cin + d->Cout));   /* X and DY: 16 MiB */
    if (tc > cap) tc = cap < 64 ? 64 : cap;
    if (e && atoi(e) > 0) tc = atoi(e);
    const int64_t TT = d->B * ((d->g.Ho + 3) / 4) * ((d->g.Wo + 3) / 4);   /* tiles in all */
    if (tc > TT) tc = TT;
    return (tc + 15) / 16 * 16;
}

bool mmc_conv3x3_winograd_applies(int64_t C, int64_t K, int64_t H, int64_t W) {
    const conv_dims d = {.B = 1, .Cout = K, .g = {.Cin = C, .H = H, .W = W, .kh = 3, .kw = 3, .stride = 1, .pad = 1,
                                                  .Ho = H, .Wo = W}};
    return use_winograd(&d, PASS_FWD);
}

mmc_status mmc_conv3x3_winograd(const float *x, int64_t B, int64_t C, int64_t H, int64_t W, const float *w, int64_t K,
                                const float *bias, bool acc, float *y) {
    const mmc_wino_geom wg = {.C = C, .K = K, .H = H, .W = W, .Ho = H, .Wo = W, .pad = 1};
    const int64_t tb = wino_tb(&wg, B);
    float *sc = malloc(mmc_cpu_wino_fwd_floats(&wg, B, tb, (int)max_threads()) * sizeof(float));
    if (!sc) return mmc_error(MMC_ERR_OOM, "out of memory (Winograd scratch for %lld -> %lld channels at %lldx%lld)",
                              (long long)C, (long long)K, (long long)H, (long long)W);
    mmc_cpu_wino_fwd(x, B, w, false, acc ? NULL : bias, acc, y, &wg, tb, sc);
    free(sc);
    return MMC_OK;
}

static void conv2d_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    const conv_dims *d = n->extra;
    const mmc_conv_geom *g = &d->g;
    int64_t K = g->Cin * g->kh * g->kw, P = g->Ho * g->Wo, CHW = g->Cin * g->H * g->W;
    float *dx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *dw = mmc_requires_grad(w) ? mmc_grad(ctx, w)->data : NULL;
    float *db = mmc_requires_grad(b) ? mmc_grad(ctx, b)->data : NULL;
    const float *gy = n->out->grad->data, *xd = x->data;
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    int64_t G, R;
    plan_blocks(d, &G, &R);
    const bool wdx = dx && use_winograd(d, PASS_DX), wdw = dw && use_winograd(d, PASS_DW);
    bool dxw = (dx && !wdx) || (dw && !wdw);   /* a pass left to im2col + GEMM */
    /* Grouped images: dy regathered as [Cout, B*P] so that each block's dW and dcol are one
     * GEMM each (K or N = nb*P) instead of nb narrow ones; db is summed in the same pass. */
    float *gyt = dxw && G > 1 && !unit_mode(d, R, true)
                     ? mmc_scratch_alloc(ctx, (size_t)(d->B * d->Cout * P) * sizeof(float))
                     : NULL;   /* [Cout, B*P] */
    if (db || gyt) {
#pragma omp parallel for schedule(static) if (d->B * d->Cout * P > 32768)
        for (int64_t c = 0; c < d->Cout; c++) {
            float s = 0;
            for (int64_t bi = 0; bi < d->B; bi++) {
                const float *r = gy + (bi * d->Cout + c) * P;
                if (gyt) memcpy(gyt + c * d->B * P + bi * P, r, (size_t)P * sizeof(float));
                float sb = 0;
#pragma omp simd reduction(+ : sb)
                for (int64_t p = 0; p < P; p++) sb += r[p];
                s += sb;
            }
            if (db) db[c] += s;
        }
    }
    if (!dx && !dw) {
        mmc_scratch_release(ctx, m);
        return;
    }
    const float *wf = dx ? weight_f32(ctx, w) : NULL;
    if (wdx) {   /* dx += conv(dy, flipped Wᵀ, pad 2 - pad) */
        const mmc_wino_geom wg = wino_geom(d, true);
        const int64_t tb = wino_tb(&wg, d->B);
        float *sc = mmc_scratch_alloc(ctx, mmc_cpu_wino_fwd_floats(&wg, d->B, tb, (int)max_threads()) * sizeof(float));
        mmc_cpu_wino_fwd(gy, d->B, wf, true, NULL, true, dx, &wg, tb, sc);
        dx = NULL;
    }
    if (wdw) {
        const mmc_wino_geom wg = wino_geom(d, false);
        const int64_t tc = wino_tc(d);
        float *sc = mmc_scratch_alloc(ctx, mmc_cpu_wino_dw_floats(&wg, tc) * sizeof(float));
        mmc_cpu_wino_dw(xd, gy, d->B, dw, &wg, tc, sc);
        dw = NULL;
    }
    if (!dx && !dw) {
        mmc_scratch_release(ctx, m);
        return;
    }
    if (unit_mode(d, R, true)) {
        const int64_t bands = (g->Ho + R - 1) / R, U = d->B * bands, nth = max_threads();
        const bool tr = d->Cout <= 96;   /* partials as dWᵀ [K, Cout], see below */
        float *cols = mmc_scratch_alloc(ctx, (size_t)(nth * K * R * g->Wo) * sizeof(float));
        float *part = dw ? mmc_scratch_alloc(ctx, (size_t)(U * K * d->Cout) * sizeof(float)) : NULL;
        for (int phase = 0; phase < (bands > 1 ? 2 : 1); phase++) {
            const int64_t nu = bands > 1 ? d->B * ((bands - phase + 1) / 2) : U;
#pragma omp parallel for schedule(dynamic, 1)
            for (int64_t j = 0; j < nu; j++) {
                /* unit u = (image bi, band bb); with two phases, band bb = 2*k + phase */
                const int64_t per = bands > 1 ? (bands - phase + 1) / 2 : bands;
                const int64_t bi = j / per, bb = bands > 1 ? 2 * (j % per) + phase : j % per;
                const int64_t u = bi * bands + bb, oh0 = bb * R, oh1 = oh0 + R < g->Ho ? oh0 + R : g->Ho;
                const int64_t Q = (oh1 - oh0) * g->Wo;
                float *col = cols + thread_id() * K * R * g->Wo;   /* [K, Q] */
                const float *gb = gy + bi * d->Cout * P + oh0 * g->Wo;   /* [Cout, Q], ld P */
                if (dw) {
                    mmc_cpu_im2col(xd + bi * CHW, col, 1, oh0, oh1, g);
                    if (tr)   /* dWᵀ_u [K, Cout] = col [K, Q] · dy_uᵀ [Q, Cout] */
                        mmc_gemm_f32(false, true, K, d->Cout, Q, 1.0f, col, Q, gb, P, 0.0f,
                                     part + u * K * d->Cout, d->Cout);
                    else      /* dW_u [Cout, K] = dy_u [Cout, Q] · colᵀ [Q, K] */
                        mmc_gemm_f32(false, true, d->Cout, K, Q, 1.0f, gb, P, col, Q, 0.0f,
                                     part + u * K * d->Cout, K);
                }
                if (dx) {
                    mmc_gemm_f32(true, false, K, Q, d->Cout, 1.0f, wf, K, gb, P, 0.0f, col, Q);
                    mmc_cpu_col2im_acc(col, dx + bi * CHW, 1, oh0, oh1, g);
                }
            }
        }
        if (dw) {   /* dW += Σ_u partial_u, summed in unit order into partial_0 (contiguous) */
            const int64_t KC = K * d->Cout;
#pragma omp parallel for schedule(static) if (U * KC > 65536)
            for (int64_t i0 = 0; i0 < KC; i0 += 1024) {
                const int64_t i1 = i0 + 1024 < KC ? i0 + 1024 : KC;
                for (int64_t u = 1; u < U; u++)
#pragma omp simd
                    for (int64_t i = i0; i < i1; i++) part[i] += part[u * KC + i];
            }
#pragma omp parallel for schedule(static) if (KC > 65536)
            for (int64_t c = 0; c < d->Cout; c++)
                for (int64_t k = 0; k < K; k++) dw[c * K + k] += part[tr ? k * d->Cout + c : c * K + k];
        }
        mmc_scratch_release(ctx, m);
        return;
    }
    float *col = mmc_scratch_alloc(ctx, (size_t)(K * G * R * g->Wo) * sizeof(float));   /* [K, nb*Q] */
    float *dwt = dw && d->Cout <= 96 ? mmc_scratch_alloc(ctx, (size_t)(K * d->Cout) * sizeof(float))
                                     : NULL;   /* [K, Cout] */
    bool first = true;
    for (int64_t b0 = 0; b0 < d->B; b0 += G) {
        const int64_t nb = d->B - b0 < G ? d->B - b0 : G;
        for (int64_t oh0 = 0; oh0 < g->Ho; oh0 += R) {
            const int64_t oh1 = oh0 + R < g->Ho ? oh0 + R : g->Ho, Q = (oh1 - oh0) * g->Wo, ld = nb * Q;
            /* this block of dy: [Cout, nb*Q] (grouped whole images) or [Cout, Q] (a row band) */
            const float *gb = gyt ? gyt + b0 * P : gy + b0 * d->Cout * P + oh0 * g->Wo;
            const int64_t ldg = gyt ? d->B * P : P;
            if (dw) {
                mmc_cpu_im2col(xd + b0 * CHW, col, nb, oh0, oh1, g);
                if (dwt) {
                    /* dWᵀ [K, Cout] (+)= col [K, nb*Q] · dy_blockᵀ [nb*Q, Cout]: for small Cout,
                     * so that the GEMM's M is K and no register tile is left part-empty
                     * (Cout = 64 wastes 9% of the last 14-row tile; measured 9% faster) */
                    mmc_gemm_f32(false, true, K, d->Cout, ld, 1.0f, col, ld, gb, ldg, first ? 0.0f : 1.0f,
                                 dwt, d->Cout);
                    first = false;
                } else {
                    /* dW [Cout, K] += dy_block [Cout, nb*Q] · colᵀ [nb*Q, K] */
                    mmc_gemm_f32(false, true, d->Cout, K, ld, 1.0f, gb, ldg, col, ld, 1.0f, dw, K);
                }
            }
            if (dx) {
                /* dcol [K, nb*Q] = Wᵀ [K, Cout] · dy_block [Cout, nb*Q], then scattered back */
                mmc_gemm_f32(true, false, K, ld, d->Cout, 1.0f, wf, K, gb, ldg, 0.0f, col, ld);
                mmc_cpu_col2im_acc(col, dx + b0 * CHW, nb, oh0, oh1, g);
            }
        }
    }
    if (dwt) {
#pragma omp parallel for schedule(static) if (K * d->Cout > 65536)
        for (int64_t c = 0; c < d->Cout; c++)
            for (int64_t k = 0; k < K; k++) dw[c * K + k] += dwt[k * d->Cout + c];
    }
    mmc_scratch_release(ctx, m);
}

/* The forward of mmc_conv2d into yd [B, Cout, Ho, Wo] (the dims in d, checked by the caller). */
static void conv2d_fwd(mmc_ctx *ctx, const mmc_tensor *x, const mmc_tensor *w, const mmc_tensor *b, const conv_dims *d,
                       float *yd) {
    const mmc_conv_geom *g = &d->g;
    int64_t K = g->Cin * g->kh * g->kw, P = g->Ho * g->Wo, CHW = g->Cin * g->H * g->W;
    const float *bf = b ? b->data : NULL;
    const uint16_t *bh = b ? b->data : NULL;
    const bool b16 = b && b->dtype == MMC_BF16;
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    const float *wf = weight_f32(ctx, w);
    if (use_winograd(d, PASS_FWD)) {
        const mmc_wino_geom wg = wino_geom(d, false);
        const int64_t tb = wino_tb(&wg, d->B);
        float *sc = mmc_scratch_alloc(ctx, mmc_cpu_wino_fwd_floats(&wg, d->B, tb, (int)max_threads()) * sizeof(float));
        float *bias = NULL;
        if (b) {
            bias = mmc_scratch_alloc(ctx, (size_t)d->Cout * sizeof(float));
            mmc_convert(bias, MMC_F32, b->data, b->dtype, d->Cout);
        }
        mmc_cpu_wino_fwd(x->data, d->B, wf, false, bias, false, yd, &wg, tb, sc);
        mmc_scratch_release(ctx, m);
        return;
    }
    int64_t G, R;
    plan_blocks(d, &G, &R);
    if (G == 1) R = forward_rows(d, R);
    if (b && G == 1 && !unit_mode(d, R, false)) {   /* y = bias, then the GEMMs accumulate onto it */
#pragma omp parallel for schedule(static) if (d->B * d->Cout * P > 32768)
        for (int64_t r = 0; r < d->B * d->Cout; r++) {
            float bv = b16 ? mmc_bf16_to_f32(bh[r % d->Cout]) : bf[r % d->Cout];
            float *yr = yd + r * P;
            for (int64_t p = 0; p < P; p++) yr[p] = bv;
        }
    }
    if (unit_mode(d, R, false)) {   /* see unit_mode: threads take whole (image, band) units */
        const int64_t bands = (g->Ho + R - 1) / R, U = d->B * bands, nth = max_threads();
        float *cols = mmc_scratch_alloc(ctx, (size_t)(nth * K * R * g->Wo) * sizeof(float));
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t u = 0; u < U; u++) {
            const int64_t bi = u / bands, oh0 = (u % bands) * R, oh1 = oh0 + R < g->Ho ? oh0 + R : g->Ho;
            const int64_t Q = (oh1 - oh0) * g->Wo;
            float *col = cols + thread_id() * K * R * g->Wo;   /* [K, Q] */
            float *yb = yd + bi * d->Cout * P + oh0 * g->Wo;     /* [Cout, Q], ld P */
            mmc_cpu_im2col((const float *)x->data + bi * CHW, col, 1, oh0, oh1, g);
            for (int64_t c = 0; c < d->Cout && b; c++) {
                const float bv = b16 ? mmc_bf16_to_f32(bh[c]) : bf[c];
                for (int64_t q = 0; q < Q; q++) yb[c * P + q] = bv;
            }
            mmc_gemm_f32(false, false, d->Cout, Q, K, 1.0f, wf, K, col, Q, b ? 1.0f : 0.0f, yb, P);
        }
        mmc_scratch_release(ctx, m);
        return;
    }
    float *col = mmc_scratch_alloc(ctx, (size_t)(K * G * R * g->Wo) * sizeof(float));   /* [K, nb*Q] */
    /* grouped images: one GEMM per group into t [Cout, nb*P], then scattered into y + bias */
    float *t = G > 1 ? mmc_scratch_alloc(ctx, (size_t)(d->Cout * G * P) * sizeof(float)) : NULL;
    for (int64_t b0 = 0; b0 < d->B; b0 += G) {
        const int64_t nb = d->B - b0 < G ? d->B - b0 : G;
        for (int64_t oh0 = 0; oh0 < g->Ho; oh0 += R) {
            const int64_t oh1 = oh0 + R < g->Ho ? oh0 + R : g->Ho, Q = (oh1 - oh0) * g->Wo;
            mmc_cpu_im2col((const float *)x->data + b0 * CHW, col, nb, oh0, oh1, g);
            if (!t) {   /* y_b[:, band] [Cout, Q] (+)= W [Cout, K] · col [K, Q] */
                mmc_gemm_f32(false, false, d->Cout, Q, K, 1.0f, wf, K, col, Q, b ? 1.0f : 0.0f,
                             yd + b0 * d->Cout * P + oh0 * g->Wo, P);
                continue;
            }
            /* t [Cout, nb*P] = W [Cout, K] · col [K, nb*P] */
            mmc_gemm_f32(false, false, d->Cout, nb * P, K, 1.0f, wf, K, col, nb * P, 0.0f, t, nb * P);
#pragma omp parallel for schedule(static) if (nb * d->Cout * P > 32768)
            for (int64_t r = 0; r < nb * d->Cout; r++) {
                const int64_t bi = r / d->Cout, c = r % d->Cout;
                const float bv = !b ? 0.0f : b16 ? mmc_bf16_to_f32(bh[c]) : bf[c];
                const float *src = t + c * nb * P + bi * P;
                float *dst = yd + (b0 + bi) * d->Cout * P + c * P;
#pragma omp simd
                for (int64_t p = 0; p < P; p++) dst[p] = src[p] + bv;
            }
        }
    }
    mmc_scratch_release(ctx, m);
}

/* mmc_conv2d's checks and dims */
static conv_dims conv2d_dims(const mmc_tensor *x, const mmc_tensor *w, const mmc_tensor *b, int stride, int padding) {
    char sx[64], sw[64];
    MMC_CHECK(x && w, "mmc_conv2d: x and w are required");
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 4 && mmc_is_contiguous(x) &&
                  (w->dtype == MMC_F32 || w->dtype == MMC_BF16) && w->ndim == 4 &&
                  mmc_is_contiguous(w) && w->shape[1] == x->shape[1] && stride >= 1 && padding >= 0,
              "mmc_conv2d: need x f32 [B, Cin, H, W], w f32/bf16 [Cout, Cin, kh, kw], stride >= 1, "
              "padding >= 0; got x %s, w %s %s, stride %d, padding %d",
              mmc_shape_str(x, sx, sizeof sx), mmc_shape_str(w, sw, sizeof sw),
              mmc_dtype_name(w->dtype), stride, padding);
    conv_dims d = {.B = x->shape[0], .Cout = w->shape[0],
                   .g = {.Cin = x->shape[1], .H = x->shape[2], .W = x->shape[3], .kh = w->shape[2],
                         .kw = w->shape[3], .stride = stride, .pad = padding}};
    mmc_conv_geom *g = &d.g;
    MMC_CHECK(g->H + 2 * g->pad >= g->kh && g->W + 2 * g->pad >= g->kw,
              "mmc_conv2d: kernel %lldx%lld larger than the padded input %s (padding %d)",
              (long long)g->kh, (long long)g->kw, mmc_shape_str(x, sx, sizeof sx), padding);
    g->Ho = (g->H + 2 * g->pad - g->kh) / g->stride + 1;
    g->Wo = (g->W + 2 * g->pad - g->kw) / g->stride + 1;
    check_bias("mmc_conv2d", b, d.Cout);
    return d;
}

mmc_tensor *mmc_conv2d(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b, int stride,
                       int padding) {
    conv_dims d = conv2d_dims(x, w, b, stride, padding);
    mmc_conv_geom *g = &d.g;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(d.B, d.Cout, g->Ho, g->Wo));   /* [B, Cout, Ho, Wo] */
    conv2d_fwd(ctx, x, w, b, &d, y->data);
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "conv2d", conv2d_backward, y, b ? 3 : 2, in);
    if (n) {
        conv_dims *ex = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *ex);
        *ex = d;
        n->extra = ex;
    }
    return y;
}

void mmc_conv2d_into(mmc_ctx *ctx, const mmc_tensor *x, const mmc_tensor *w, const mmc_tensor *b, int stride, int padding,
                     float *y) {
    const conv_dims d = conv2d_dims(x, w, b, stride, padding);
    conv2d_fwd(ctx, x, w, b, &d, y);
}

bool mmc_conv3x3_fused(mmc_ctx *ctx, const mmc_tensor *x, const mmc_conv_input *in, const mmc_tensor *w,
                       const mmc_tensor *b, float *y) {
    char sx[64], sw[64];
    const int64_t B = x->shape[0], C = x->shape[1], f = in && in->up2 ? 2 : 1, H = f * x->shape[2], W = f * x->shape[3];
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 4 && mmc_is_contiguous(x) && w->ndim == 4 && w->shape[1] == C &&
                  w->shape[2] == 3 && w->shape[3] == 3 && mmc_is_contiguous(w) && (w->dtype == MMC_F32 || w->dtype == MMC_BF16),
              "mmc_conv3x3_fused: need x f32 [B, C, H, W] and w [K, C, 3, 3], got x %s, w %s",
              mmc_shape_str(x, sx, sizeof sx), mmc_shape_str(w, sw, sizeof sw));
    conv_dims d = {.B = B, .Cout = w->shape[0],
                   .g = {.Cin = C, .H = H, .W = W, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .Ho = H, .Wo = W}};
    check_bias("mmc_conv3x3_fused", b, d.Cout);
    if (!use_winograd(&d, PASS_FWD)) return false;
    mmc_wino_geom wg = wino_geom(&d, false);
    if (in) {
        wg.up2 = in->up2;
        wg.in_scale = in->scale, wg.in_shift = in->shift, wg.in_silu = in->silu;
        MMC_CHECK(in->row1 == 0 || (in->row0 >= 0 && in->row0 % 4 == 0 && in->row0 < in->row1 && in->row1 <= H &&
                                    in->yplane >= 0),
                  "mmc_conv3x3_fused: output rows [%lld, %lld) are not a window of the %lld rows starting at a "
                  "multiple of 4", (long long)in->row0, (long long)in->row1, (long long)H);
        wg.row0 = in->row0, wg.row1 = in->row1, wg.yplane = in->yplane;
    }
    const int64_t tb = wino_tb(&wg, B);
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    const float *wf = weight_f32(ctx, w);
    float *sc = mmc_scratch_alloc(ctx, mmc_cpu_wino_fwd_floats(&wg, B, tb, (int)max_threads()) * sizeof(float));
    float *bias = NULL;
    if (b) {
        bias = mmc_scratch_alloc(ctx, (size_t)d.Cout * sizeof(float));
        mmc_convert(bias, MMC_F32, b->data, b->dtype, d.Cout);
    }
    mmc_cpu_wino_fwd(x->data, B, wf, false, bias, false, y, &wg, tb, sc);
    mmc_scratch_release(ctx, m);
    return true;
}
