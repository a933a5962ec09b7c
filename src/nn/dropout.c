/* dropout.c — inverted dropout for LoRA adapters (torch.nn.Dropout semantics: zero with
 * probability p, scale survivors by 1 / (1 - p)). The mask comes from Philox-4x32-10
 * keyed by the context's per-step seed, with the counter (module stream, element / 4):
 * it is never stored — backward regenerates it — and a checkpointed block recomputed in
 * backward draws exactly the forward's mask. Not bit-compatible with torch's RNG (no
 * reference can be: PyTorch's CPU dropout uses mt19937 state), so PEFT parity is checked
 * with dropout off. */
#include "mmc_nn.h"
#include "../core/ctx_internal.h"

#include <string.h>

void mmc_nn_set_dropout_seed(mmc_ctx *ctx, uint64_t seed) {
    ctx->dropout_seed = seed;
    ctx->dropout_on = true;
}

void mmc_nn_set_dropout_off(mmc_ctx *ctx) { ctx->dropout_on = false; }

static inline uint64_t mix64(uint64_t z) {   /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t mmc_nn_dropout_seed(uint64_t seed, uint64_t step, uint64_t micro) {
    return mix64(mix64(mix64(seed) ^ step) ^ micro);
}

/* y = x * mask * s (mask from (seed, stream)); used by forward (x -> y) and backward (dy -> dx, +=) */
static void apply_mask(const float *src, float *dst, bool accumulate, int64_t n, uint64_t seed,
                       uint64_t stream, float p) {
    uint32_t thr = (uint32_t)((double)p * 4294967296.0 > 4294967295.0 ? 4294967295.0 : (double)p * 4294967296.0);
    float s = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < (n + 3) / 4; b++) {
        uint32_t v[4];
        mmc_philox4x32(seed, (uint64_t)b, stream, v);
        for (int j = 0; j < 4 && 4 * b + j < n; j++) {
            int64_t i = 4 * b + j;
            float val = v[j] >= thr ? src[i] * s : 0.0f;
            if (accumulate) dst[i] += val;
            else dst[i] = val;
        }
    }
}

static void dropout_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    apply_mask(n->out->grad->data, mmc_grad(ctx, x)->data, true, mmc_numel(x), (uint64_t)n->i[0],
               (uint64_t)n->i[1], (float)n->f[0]);
}

mmc_tensor *mmc_nn_dropout(mmc_ctx *ctx, mmc_tensor *x, float p, uint64_t stream) {
    MMC_CHECK(p >= 0.0f && p < 1.0f, "mmc_nn_dropout: p = %g must be in [0, 1)", (double)p);
    if (p == 0.0f || !ctx->dropout_on || !(ctx->grad_enabled || ctx->ckpt_depth > 0)) return x;
    MMC_CHECK(x->dtype == MMC_F32 && mmc_is_contiguous(x), "mmc_nn_dropout: x must be contiguous f32");
    mmc_tensor *y = mmc_new_like(ctx, x);
    apply_mask(x->data, y->data, false, mmc_numel(x), ctx->dropout_seed, stream, p);
    mmc_node *nd = mmc_tape_record(ctx, "dropout", dropout_backward, y, 1, &x);
    if (nd) {
        nd->i[0] = (int64_t)ctx->dropout_seed;
        nd->i[1] = (int64_t)stream;
        nd->f[0] = p;
    }
    return y;
}
