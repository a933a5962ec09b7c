/* quant.c — NF4 weights (QLoRA), following bitsandbytes 0.50's published layout and
 * rounding (bitsandbytes.functional.quantize_4bit / dequantize_4bit, quant_type "nf4",
 * blocksize 64, compress_statistics for double quantisation):
 *   - scaled = clamp(w * (1 / absmax), -1, 1) in f32, code = number of NF4 midpoints
 *     strictly below scaled (torch.bucketize, right=False), earlier element in the high
 *     nibble;
 *   - double quantisation: offset = mean(absmax); absmax - offset in blocks of 256 with
 *     its own absmax2 and the nearest entry of the signed dynamic map (create_dynamic_map).
 * mmc_nf4_linear dequantises 256-row tiles of W into a scratch panel and runs the GEMM on
 * the panel, so the f32 matrix never exists as a whole. */
#include "mmc_quant.h"
#include "mmc_ops.h"
#include "../backend/cpu/gemm.h"
#include "../backend/cpu/linear.h"
#include "../backend/cpu/qmatvec.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* NF4 levels: quantiles of N(0, 1) normalised to [-1, 1] (Dettmers et al., QLoRA, app. E),
 * as bitsandbytes tabulates them in f32. */
static const float g_nf4[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236084f, 1.0f};

const float *mmc_nf4_levels(void) { return g_nf4; }

/* Signed dynamic map (8 bits, 7 exponent bits): for exponent e = 0..6 the midpoints of
 * linspace(0.1, 1, 2^e + 1), times ±10^(e-6); plus 0 and 1; sorted. Computed in f32 the way
 * torch.linspace (two-sided: start + i*step below the middle, end - (n-1-i)*step above)
 * and a float32 tensor times a Python scalar evaluate it. */
static float g_dyn[256];
static float g_nf4_mid[15];   /* midpoints between NF4 levels (torch.bucketize boundaries) */
/* Both tables are built once, under pthread_once: a plain "ready" flag read outside a lock
 * is a data race (C11 5.1.2.4), and nothing orders the table writes before the flag for a
 * thread that sees it set. Quantising threads get the tables through the OpenMP fork after
 * the caller's pthread_once. */
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void build_dyn(void) {
    int n = 0;
    for (int e = 0; e < 7; e++) {
        int items = (1 << e) + 1;
        float bnd[65];
        float step = (1.0f - 0.1f) / (float)(items - 1);
        int half = items / 2;
        for (int i = 0; i < items; i++)
            bnd[i] = i < half ? fmaf(step, (float)i, 0.1f) : fmaf(-step, (float)(items - i - 1), 1.0f);   /* fused, as torch */
        float scale = (float)pow(10.0, (double)(e - 6));
        for (int i = 0; i + 1 < items; i++) {
            float mean = (bnd[i] + bnd[i + 1]) / 2.0f;
            g_dyn[n++] = scale * mean;
        }
        for (int i = 0; i + 1 < items; i++) {
            float mean = (bnd[i] + bnd[i + 1]) / 2.0f;
            g_dyn[n++] = -scale * mean;
        }
    }
    g_dyn[n++] = 0.0f;
    g_dyn[n++] = 1.0f;
    MMC_ASSERT(n == 256);
    qsort(g_dyn, 256, sizeof(float), cmp_float);
}

static void build_tables(void) {
    build_dyn();
    for (int i = 0; i < 15; i++) g_nf4_mid[i] = (g_nf4[i] + g_nf4[i + 1]) / 2.0f;
}

const float *mmc_dynamic_map(void) {
    pthread_once(&g_tables_once, build_tables);
    return g_dyn;
}

/* mid: g_nf4_mid, after pthread_once (mmc_dynamic_map) */
static inline uint8_t nf4_code(const float *mid, float s) {
    uint8_t c = 0;
    while (c < 15 && mid[c] < s) c++;
    return c;
}

/* nearest dynamic-map entry (ties to the lower index) */
static uint8_t dyn_code(float v) {
    const float *m = mmc_dynamic_map();
    int lo = 0, hi = 255;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (m[mid] <= v) lo = mid; else hi = mid;
    }
    return (uint8_t)(fabsf(v - m[lo]) <= fabsf(m[hi] - v) ? lo : hi);
}

static mmc_nf4 *nf4_alloc(int64_t N, int64_t K, bool dq) {
    mmc_nf4 *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->rows = N;
    q->cols = K;
    q->numel = N * K;
    q->n_blocks = (q->numel + MMC_NF4_BLOCK - 1) / MMC_NF4_BLOCK;
    q->double_quant = dq;
    q->codes = malloc((size_t)(q->numel / 2));
    if (dq) {
        q->qabsmax = malloc((size_t)q->n_blocks);
        q->absmax2 = malloc(sizeof(float) * (size_t)((q->n_blocks + MMC_NF4_DQ_BLOCK - 1) / MMC_NF4_DQ_BLOCK));
    } else {
        q->absmax = malloc(sizeof(float) * (size_t)q->n_blocks);
    }
    if (!q->codes || (dq ? !q->qabsmax || !q->absmax2 : !q->absmax)) { mmc_nf4_free(q); return NULL; }
    return q;
}

static void double_quantize(mmc_nf4 *q, const float *absmax) {
    double s = 0;
    for (int64_t i = 0; i < q->n_blocks; i++) s += absmax[i];
    q->offset = (float)(s / (double)q->n_blocks);
    for (int64_t b0 = 0; b0 < q->n_blocks; b0 += MMC_NF4_DQ_BLOCK) {
        int64_t b1 = b0 + MMC_NF4_DQ_BLOCK < q->n_blocks ? b0 + MMC_NF4_DQ_BLOCK : q->n_blocks;
        float am = 0;
        for (int64_t i = b0; i < b1; i++) am = fmaxf(am, fabsf(absmax[i] - q->offset));
        q->absmax2[b0 / MMC_NF4_DQ_BLOCK] = am;
        float inv = am > 0 ? 1.0f / am : 0.0f;
        for (int64_t i = b0; i < b1; i++) {
            float v = (absmax[i] - q->offset) * inv;
            v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
            q->qabsmax[i] = dyn_code(v);
        }
    }
}

mmc_status mmc_nf4_quantize(const float *w, int64_t N, int64_t K, bool double_quant, mmc_nf4 **out) {
    *out = NULL;
    if (N <= 0 || K <= 0 || (N * K) % 2)
        return mmc_error(MMC_ERR_SHAPE, "NF4: weight [%lld, %lld] must have an even, positive number of "
                         "elements", (long long)N, (long long)K);
    mmc_nf4 *q = nf4_alloc(N, K, double_quant);
    float *absmax = double_quant ? malloc(sizeof(float) * (size_t)q->n_blocks) : q ? q->absmax : NULL;
    if (!q || !absmax) {
        if (double_quant) free(absmax);
        mmc_nf4_free(q);
        return mmc_error(MMC_ERR_OOM, "NF4: out of memory quantising [%lld, %lld]", (long long)N, (long long)K);
    }
    const int64_t n = q->numel;
    (void)mmc_dynamic_map();   /* builds g_nf4_mid before the threads read it */
    const float *mid = g_nf4_mid;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < q->n_blocks; b++) {
        int64_t i0 = b * MMC_NF4_BLOCK, i1 = i0 + MMC_NF4_BLOCK < n ? i0 + MMC_NF4_BLOCK : n;
        float am = 0;
        for (int64_t i = i0; i < i1; i++) { float v = fabsf(w[i]); am = v > am ? v : am; }   /* fmaxf is a libm call here */
        absmax[b] = am;
        float inv = 1.0f / (am < 1e-38f ? 1e-38f : am);
        for (int64_t i = i0; i < i1; i += 2) {
            float s0 = w[i] * inv, s1 = w[i + 1] * inv;
            s0 = s0 < -1.0f ? -1.0f : s0 > 1.0f ? 1.0f : s0;
            s1 = s1 < -1.0f ? -1.0f : s1 > 1.0f ? 1.0f : s1;
            q->codes[i / 2] = (uint8_t)(nf4_code(mid, s0) << 4 | nf4_code(mid, s1));
        }
    }
    if (double_quant) {
        double_quantize(q, absmax);
        free(absmax);
    }
    *out = q;
    return MMC_OK;
}

mmc_status mmc_nf4_from_parts(int64_t N, int64_t K, const uint8_t *codes, const float *absmax,
                              const uint8_t *qabsmax, const float *absmax2, float offset,
                              mmc_nf4 **out) {
    *out = NULL;
    bool dq = qabsmax != NULL;
    if (N <= 0 || K <= 0 || (N * K) % 2 || (!dq && !absmax) || (dq && !absmax2))
        return mmc_error(MMC_ERR_INVALID, "NF4: inconsistent parts for a [%lld, %lld] weight",
                         (long long)N, (long long)K);
    mmc_nf4 *q = nf4_alloc(N, K, dq);
    if (!q) return mmc_error(MMC_ERR_OOM, "NF4: out of memory");
    memcpy(q->codes, codes, (size_t)(q->numel / 2));
    if (dq) {
        memcpy(q->qabsmax, qabsmax, (size_t)q->n_blocks);
        memcpy(q->absmax2, absmax2, sizeof(float) * (size_t)((q->n_blocks + MMC_NF4_DQ_BLOCK - 1) / MMC_NF4_DQ_BLOCK));
        q->offset = offset;
    } else {
        memcpy(q->absmax, absmax, sizeof(float) * (size_t)q->n_blocks);
    }
    *out = q;
    return MMC_OK;
}

void mmc_nf4_free(mmc_nf4 *q) {
    if (!q) return;
    free(q->codes);
    free(q->absmax);
    free(q->qabsmax);
    free(q->absmax2);
    free(q);
}

size_t mmc_nf4_bytes(const mmc_nf4 *q) {
    size_t b = (size_t)(q->numel / 2);
    if (q->double_quant)
        b += (size_t)q->n_blocks + sizeof(float) * (size_t)((q->n_blocks + MMC_NF4_DQ_BLOCK - 1) / MMC_NF4_DQ_BLOCK) +
             sizeof(float);
    else
        b += sizeof(float) * (size_t)q->n_blocks;
    return b;
}

/* not fused: bitsandbytes rounds the product before adding the offset */
__attribute__((optimize("fp-contract=off")))
void mmc_nf4_absmax_range(const mmc_nf4 *q, int64_t b0, int64_t nb, float *out) {
    if (!q->double_quant) {
        memcpy(out, q->absmax + b0, sizeof(float) * (size_t)nb);
        return;
    }
    const float *m = mmc_dynamic_map();
    for (int64_t i = b0; i < b0 + nb; i++)
        out[i - b0] = m[q->qabsmax[i]] * q->absmax2[i / MMC_NF4_DQ_BLOCK] + q->offset;
}

void mmc_nf4_absmax(const mmc_nf4 *q, float *out) { mmc_nf4_absmax_range(q, 0, q->n_blocks, out); }

void mmc_nf4_dequantize_rows(const mmc_nf4 *q, const float *absmax, int64_t row0, int64_t nrows,
                             float *out) {
    float *own = NULL;
    if (!absmax) {
        own = malloc(sizeof(float) * (size_t)q->n_blocks);
        MMC_CHECK(own, "NF4: out of memory");
        mmc_nf4_absmax(q, own);
        absmax = own;
    }
    int64_t i0 = row0 * q->cols, n = nrows * q->cols;
    MMC_CHECK(row0 >= 0 && row0 + nrows <= q->rows, "NF4: rows [%lld, %lld) out of [0, %lld)",
              (long long)row0, (long long)(row0 + nrows), (long long)q->rows);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; j++) {
        int64_t i = i0 + j;
        uint8_t byte = q->codes[i >> 1];
        uint8_t c = (i & 1) ? (byte & 15) : (byte >> 4);
        out[j] = g_nf4[c] * absmax[i / MMC_NF4_BLOCK];
    }
    free(own);
}

/* ------------------------------------------------------------------ linear
 * One path for both formats: up to MMC_QMV_MAX_M rows of x run the direct matvec
 * (qmatvec.c); more rows (prefill, batches) dequantise QTILE rows of W at a time into a
 * scratch panel and run the f32 GEMM on it, so the f32 matrix never exists as a whole. */
#define QTILE 256  /* rows of W dequantised per panel (256 x K f32 in scratch) */

typedef enum { QK_NF4 = 0, QK_INT8 = 1 } qkind;

static int64_t rows_of(const mmc_tensor *x) {
    int64_t r = 1;
    for (int d = 0; d < x->ndim - 1; d++) r *= x->shape[d];
    return r;
}

/* W [N, K] of either format and its per-call dequantisation state (NF4: resolved absmax) */
typedef struct {
    qkind kind;
    const void *q;
    int64_t N, K;
    float *absmax;
} qweight;

static void qweight_open(mmc_ctx *ctx, qweight *w, qkind kind, const void *q) {
    w->kind = kind;
    w->q = q;
    w->absmax = NULL;
    if (kind == QK_NF4) {
        const mmc_nf4 *n = q;
        w->N = n->rows;
        w->K = n->cols;
    } else {
        const mmc_q8 *n = q;
        w->N = n->rows;
        w->K = n->cols;
    }
}

/* the NF4 block scales resolved once per call, for the tile path (the matvec reads them itself) */
static void qweight_scales(mmc_ctx *ctx, qweight *w) {
    if (w->kind != QK_NF4 || w->absmax) return;
    w->absmax = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)((const mmc_nf4 *)w->q)->n_blocks);
    mmc_nf4_absmax(w->q, w->absmax);
}

static void qweight_rows(const qweight *w, int64_t row0, int64_t nrows, float *out) {
    if (w->kind == QK_NF4) mmc_nf4_dequantize_rows(w->q, w->absmax, row0, nrows, out);
    else mmc_q8_dequantize_rows(w->q, row0, nrows, out);
}

static void qlinear_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *b = n->n_in > 1 ? n->in[1] : NULL;
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    qweight w;
    qweight_open(ctx, &w, (qkind)n->i[1], n->extra);
    int64_t M = n->i[0], N = w.N, K = w.K;
    const float *dy = n->out->grad->data;
    if (mmc_requires_grad(b)) mmc_cpu_colsum_acc(dy, mmc_grad(ctx, b)->data, M, N);
    if (mmc_requires_grad(x)) {
        float *dx = mmc_grad(ctx, x)->data;
        qweight_scales(ctx, &w);
        float *panel = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)(QTILE * K));
        /* dx [M, K] += dy[:, n0:n1] [M, nt] · W[n0:n1, :] [nt, K], tiles in order */
        for (int64_t n0 = 0; n0 < N; n0 += QTILE) {
            int64_t nt = n0 + QTILE < N ? QTILE : N - n0;
            qweight_rows(&w, n0, nt, panel);
            mmc_gemm_f32(false, false, M, K, nt, 1.0f, dy + n0, N, panel, K, 1.0f, dx, K);
        }
    }
    mmc_scratch_release(ctx, mk);
}

static mmc_tensor *qlinear(mmc_ctx *ctx, const char *op, mmc_tensor *x, qkind kind, const void *q, mmc_tensor *b) {
    char sx[64];
    MMC_CHECK(x && q, "%s: x and q are required", op);
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    qweight w;
    qweight_open(ctx, &w, kind, q);
    const int64_t N = w.N, K = w.K;
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim >= 1 && mmc_is_contiguous(x) && x->shape[x->ndim - 1] == K,
              "%s: x must be contiguous f32 [..., %lld], got %s %s", op, (long long)K,
              mmc_dtype_name(x->dtype), mmc_shape_str(x, sx, sizeof sx));
    int64_t M = rows_of(x);
    if (b)
        MMC_CHECK(b->dtype == MMC_F32 && b->ndim == 1 && b->shape[0] == N, "%s: b must be f32 [%lld]", op,
                  (long long)N);
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = N;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, x->ndim, shape);   /* [..., N] */
    float *yd = y->data;
    if (M >= 1 && M <= MMC_QMV_MAX_M && kind == QK_INT8) {
        const mmc_q8 *q8 = q;
        mmc_qmv_int8(M, N, K, x->data, q8->q, q8->scale, yd);
    } else if (M >= 1 && M <= MMC_QMV_MAX_M && mmc_qmv_nf4_ok(q)) {
        mmc_qmv_nf4(M, x->data, q, yd);
    } else {
        qweight_scales(ctx, &w);
        float *panel = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)(QTILE * K));
        for (int64_t n0 = 0; n0 < N; n0 += QTILE) {
            int64_t nt = n0 + QTILE < N ? QTILE : N - n0;
            qweight_rows(&w, n0, nt, panel);                                  /* [nt, K] */
            mmc_gemm_f32(false, true, M, nt, K, 1.0f, x->data, K, panel, K, 0.0f, yd + n0, N);
        }
    }
    mmc_scratch_release(ctx, mk);
    if (b) {
        const float *bd = b->data;
#pragma omp parallel for schedule(static) if (M * N > 65536)
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < N; j++) yd[m * N + j] += bd[j];
    }
    mmc_tensor *in[2] = {x, b};
    mmc_node *nd = mmc_tape_record(ctx, op, qlinear_backward, y, b ? 2 : 1, in);
    if (nd) {
        nd->i[0] = M;
        nd->i[1] = kind;
        nd->extra = (void *)q;
    }
    return y;
}

mmc_tensor *mmc_nf4_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_nf4 *q, mmc_tensor *b) {
    return qlinear(ctx, "nf4_linear", x, QK_NF4, q, b);
}

mmc_tensor *mmc_q8_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_q8 *q, mmc_tensor *b) {
    return qlinear(ctx, "q8_linear", x, QK_INT8, q, b);
}

/* ------------------------------------------------------------------ at load (QLoRA, --quantize) */
static mmc_status quantize_linears(mmc_linear_w **mods, int n, mmc_quant_mode mode, bool double_quant,
                                   mmc_tensor **params, char (*names)[96], int *n_params, int64_t *bytes_before,
                                   int64_t *bytes_after) {
    for (int i = 0; i < n; i++) {
        mmc_linear_w *l = mods[i];
        if (l->q || l->q8 || !l->w) continue;
        mmc_tensor *w = l->w;
        if ((w->dtype != MMC_F32 && w->dtype != MMC_BF16) || w->ndim != 2)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: cannot quantise %s weight '%s' (f32 or bf16 [N, K] only)",
                             mmc_quant_mode_name(mode), mmc_dtype_name(w->dtype), w->name);
        float *tmp = NULL;
        const float *src = w->data;
        if (w->dtype == MMC_BF16) {
            tmp = malloc(sizeof(float) * (size_t)mmc_numel(w));
            if (!tmp) return mmc_error(MMC_ERR_OOM, "%s: out of memory", mmc_quant_mode_name(mode));
            mmc_convert(tmp, MMC_F32, w->data, MMC_BF16, mmc_numel(w));
            src = tmp;
        }
        mmc_status st = mode == MMC_WQ_INT8 ? mmc_q8_quantize(src, w->shape[0], w->shape[1], &l->q8)
                                               : mmc_nf4_quantize(src, w->shape[0], w->shape[1], double_quant, &l->q);
        free(tmp);
        if (st) return mmc_error_prefix(st, "quantising '%s'", w->name);
        if (bytes_before) *bytes_before += (int64_t)mmc_numel(w) * (w->dtype == MMC_BF16 ? 2 : 4);
        if (bytes_after) *bytes_after += (int64_t)(l->q8 ? mmc_q8_bytes(l->q8) : mmc_nf4_bytes(l->q));
        if (l->b) l->b->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        l->w = NULL;
        mmc_params_drop(params, names, n_params, w);
        mmc_tensor_free(w);
    }
    return MMC_OK;
}

mmc_status mmc_nf4_quantize_linears(mmc_linear_w **mods, int n, bool double_quant,
                                    mmc_tensor **params, char (*names)[96], int *n_params) {
    return quantize_linears(mods, n, MMC_WQ_NF4, double_quant, params, names, n_params, NULL, NULL);
}

mmc_status mmc_quantize_linears(mmc_linear_w **mods, int n, mmc_quant_mode mode, mmc_tensor **params,
                                char (*names)[96], int *n_params, int64_t *bytes_before, int64_t *bytes_after) {
    if (mode == MMC_WQ_NONE) return MMC_OK;
    return quantize_linears(mods, n, mode, false, params, names, n_params, bytes_before, bytes_after);
}

void mmc_linear_quant_free(mmc_linear_w *l) {
    mmc_nf4_free(l->q);
    mmc_q8_free(l->q8);
    l->q = NULL;
    l->q8 = NULL;
}

mmc_status mmc_quant_mode_parse(const char *s, mmc_quant_mode *out) {
    if (!strcmp(s, "int8")) *out = MMC_WQ_INT8;
    else if (!strcmp(s, "nf4")) *out = MMC_WQ_NF4;
    else if (!strcmp(s, "none")) *out = MMC_WQ_NONE;
    else return mmc_error(MMC_ERR_INVALID, "--quantize '%s': expected int8, nf4 or none", s);
    return MMC_OK;
}

const char *mmc_quant_mode_name(mmc_quant_mode m) {
    return m == MMC_WQ_INT8 ? "int8" : m == MMC_WQ_NF4 ? "nf4" : "none";
}
