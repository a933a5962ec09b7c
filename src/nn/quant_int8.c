/* quant_int8.c — weight-only int8 (mmc_quant.h): per output channel, symmetric, as
 * torch.ao's per-channel symmetric weight observer with the narrow range [-127, 127]
 * (scale = absmax / 127; q = round_half_even(w / scale), torch.round's rounding). The
 * product with x runs in mmc_q8_linear (quant.c) on qmatvec.c's kernels. */
#include "mmc_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_q8_quantize(const float *w, int64_t N, int64_t K, mmc_q8 **out) {
    *out = NULL;
    if (N <= 0 || K <= 0)
        return mmc_error(MMC_ERR_SHAPE, "int8: weight [%lld, %lld] must be non-empty", (long long)N, (long long)K);
    mmc_q8 *q = calloc(1, sizeof *q);
    if (q) {
        q->rows = N;
        q->cols = K;
        q->q = malloc((size_t)(N * K));
        q->scale = malloc(sizeof(float) * (size_t)N);
    }
    if (!q || !q->q || !q->scale) {
        mmc_q8_free(q);
        return mmc_error(MMC_ERR_OOM, "int8: out of memory quantising [%lld, %lld]", (long long)N, (long long)K);
    }
#pragma omp parallel for schedule(static) if (N * K > 65536)
    for (int64_t n = 0; n < N; n++) {
        const float *r = w + n * K;
        float am = 0;
        for (int64_t k = 0; k < K; k++) { float v = fabsf(r[k]); am = v > am ? v : am; }   /* fmaxf is a libm call here */
        float s = am / 127.0f;
        q->scale[n] = s;
        int8_t *d = q->q + n * K;
        for (int64_t k = 0; k < K; k++) {
            float v = s > 0 ? nearbyintf(r[k] / s) : 0.0f;   /* current rounding mode: to nearest, ties to even */
            d[k] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
    *out = q;
    return MMC_OK;
}

void mmc_q8_free(mmc_q8 *q) {
    if (!q) return;
    free(q->q);
    free(q->scale);
    free(q);
}

void mmc_q8_dequantize_rows(const mmc_q8 *q, int64_t row0, int64_t nrows, float *out) {
    MMC_CHECK(row0 >= 0 && row0 + nrows <= q->rows, "int8: rows [%lld, %lld) out of [0, %lld)", (long long)row0,
              (long long)(row0 + nrows), (long long)q->rows);
    const int64_t K = q->cols;
#pragma omp parallel for schedule(static) if (nrows * K > 65536)
    for (int64_t r = 0; r < nrows; r++) {
        const int8_t *s = q->q + (row0 + r) * K;
        const float sc = q->scale[row0 + r];
        float *d = out + r * K;
        for (int64_t k = 0; k < K; k++) d[k] = (float)s[k] * sc;
    }
}

size_t mmc_q8_bytes(const mmc_q8 *q) { return (size_t)(q->rows * q->cols) + sizeof(float) * (size_t)q->rows; }
