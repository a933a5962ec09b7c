/* generate.c — the autoregressive loop every decoder shares: one prefill pass over the
 * prompt fills the KV cache, then one decode pass per new token; the model computes only
 * the last position's logits. The model is reached through its mmc_decoder table, so this
 * file knows no architecture. Activations live in the context arena, reset after every
 * token, so memory stays flat: weights + KV cache + one token's activations. */
#include "mmc_infer.h"

#include <stdlib.h>
#include <string.h>

mmc_status mmc_generate(const mmc_decoder *d, const int32_t *prompt, int64_t n_prompt,
                        const mmc_gen_opts *opts, int32_t *out, int *n_out) {
    *n_out = 0;
    if (n_prompt <= 0) return mmc_error(MMC_ERR_INVALID, "empty prompt");
    if (opts->max_new_tokens < 0)
        return mmc_error(MMC_ERR_INVALID, "max_new_tokens is %d; give 0 or more", opts->max_new_tokens);
    if (n_prompt + opts->max_new_tokens > d->max_positions)
        return mmc_error(MMC_ERR_INVALID, "prompt of %lld tokens + %d new tokens exceeds the context "
                         "length %lld", (long long)n_prompt, opts->max_new_tokens,
                         (long long)d->max_positions);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= d->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "prompt token %lld = %d is outside the vocabulary [0, %lld)",
                             (long long)i, prompt[i], (long long)d->vocab_size);
    mmc_sampler smp;
    mmc_status st = mmc_sampler_init(&smp, &opts->sampler, d->vocab_size);
    if (st) return st;
    mmc_kv_cache kv;
    st = mmc_kv_cache_init(&kv, d->n_layers, 1, d->kv_heads, d->head_dim, n_prompt + opts->max_new_tokens);
    int32_t *hist = malloc((size_t)(n_prompt + opts->max_new_tokens + 1) * sizeof *hist);
    mmc_ctx *ctx = mmc_ctx_new();
    if (st || !hist || !ctx) { st = st ? st : mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_set_grad_enabled(ctx, false);
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    int64_t n_hist = n_prompt;
    for (int step = 0; step < opts->max_new_tokens; step++) {
        mmc_ctx_reset(ctx);
        float *logits;
        st = step == 0 ? d->prefill(ctx, d->self, hist, n_prompt, &kv, &logits)
                       : d->decode(ctx, d->self, hist[n_hist - 1], &kv, &logits);
        if (st) goto done;
        int32_t tok = mmc_sampler_next(&smp, logits, hist, n_hist);
        bool stop = false;
        for (int e = 0; e < opts->n_eos; e++) stop |= tok == opts->eos_ids[e];
        if (stop) break;
        out[(*n_out)++] = tok;
        hist[n_hist++] = tok;
        if (opts->on_token && !opts->on_token(opts->user, tok)) break;
    }
done:
    mmc_ctx_free(ctx);
    free(hist);
    mmc_kv_cache_free(&kv);
    mmc_sampler_free(&smp);
    return st;
}
