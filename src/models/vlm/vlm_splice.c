/* vlm_splice.c — see vlm_splice.h. */
#include "vlm_splice.h"

#include <string.h>

mmc_status vlm_check_ids(const mmc_tensor *ids, int64_t vocab, int64_t image_token_id, int64_t *n_img) {
    const int64_t n = mmc_numel(ids);
    *n_img = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = enc_int_at(ids, i);
        if (t < 0 || t >= vocab)
            return mmc_error(MMC_ERR_INVALID, "token %lld at position %lld is outside the vocabulary [0, %lld)",
                             (long long)t, (long long)i, (long long)vocab);
        *n_img += t == image_token_id;
    }
    return MMC_OK;
}

void vlm_splice(mmc_tensor *e, const mmc_tensor *ids, int64_t image_token_id, const mmc_tensor *feats) {
    const int64_t n = mmc_numel(ids), C = e->shape[e->ndim - 1];
    const float *fd = feats->data;
    float *ed = e->data;
    for (int64_t i = 0, k = 0; i < n; i++)
        if (enc_int_at(ids, i) == image_token_id) memcpy(ed + i * C, fd + (k++) * C, (size_t)C * sizeof(float));
}

mmc_status vlm_feed(mmc_ctx *ctx, vlm_forward_fn fwd, void *model, mmc_qwen2 *lm, const int32_t *ids_in, int64_t n,
                    mmc_tensor *pixels, mmc_kv_cache *kv, float **logits) {
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, n)), *h;
    memcpy(ids->data, ids_in, (size_t)n * sizeof(int32_t));
    mmc_status st = fwd(ctx, model, ids, pixels, kv, &h);
    if (st) return st;
    mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, n - 1, 1));   /* [1, 1, C] */
    *logits = mmc_qwen2_logits(ctx, lm, last)->data;                          /* [1, 1, V] */
    return MMC_OK;
}
