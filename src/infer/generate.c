/* generate.c — autoregressive generation for the Qwen2 decoder: one prefill pass over the
 * prompt fills the KV cache, then one decode pass per new token; only the last position's
 * logits are computed. Activations live in the context arena, reset after every token,
 * so memory stays flat: weights + KV cache + one token's activations. */
#include "mmc_infer.h"

#include <stdlib.h>
#include <string.h>

static mmc_tensor *positions(mmc_ctx *ctx, int64_t start, int64_t T) {
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = start + t;
    return pos;
}

mmc_status mmc_generate_loop(mmc_step_fn step_fn, void *user, const mmc_qwen2_config *c,
                             const int32_t *prompt, int64_t n_prompt, const mmc_gen_opts *opts,
                             int32_t *out, int *n_out) {
    *n_out = 0;
    if (n_prompt <= 0) return mmc_error(MMC_ERR_INVALID, "empty prompt");
    if (n_prompt + opts->max_new_tokens > c->max_position_embeddings)
        return mmc_error(MMC_ERR_INVALID, "prompt of %lld tokens + %d new tokens exceeds the context "
                         "length %lld", (long long)n_prompt, opts->max_new_tokens,
                         (long long)c->max_position_embeddings);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "prompt token %lld = %d is outside the vocabulary [0, %lld)",
                             (long long)i, prompt[i], (long long)c->vocab_size);
    mmc_sampler smp;
    mmc_status st = mmc_sampler_init(&smp, &opts->sampler, c->vocab_size);
    if (st) return st;
    mmc_kv_cache kv;
    st = mmc_kv_cache_init(&kv, (int)c->num_layers, 1, c->num_kv_heads, c->head_dim,
                           n_prompt + opts->max_new_tokens);
    int32_t *hist = malloc((size_t)(n_prompt + opts->max_new_tokens + 1) * sizeof *hist);
    mmc_ctx *ctx = mmc_ctx_new();
    if (st || !hist) { st = st ? st : mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_set_grad_enabled(ctx, false);
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    int64_t n_hist = n_prompt, n_feed = n_prompt;
    for (int step = 0; step < opts->max_new_tokens; step++) {
        mmc_ctx_reset(ctx);
        float *logits;
        if ((st = step_fn(ctx, user, hist + n_hist - n_feed, n_feed, step == 0, &kv, &logits))) goto done;
        int32_t tok = mmc_sampler_next(&smp, logits, hist, n_hist);
        bool stop = false;
        for (int e = 0; e < opts->n_eos; e++) stop |= tok == opts->eos_ids[e];
        if (stop) break;
        out[(*n_out)++] = tok;
        hist[n_hist++] = tok;
        if (opts->on_token && !opts->on_token(opts->user, tok)) break;
        n_feed = 1;
    }
done:
    mmc_ctx_free(ctx);
    free(hist);
    mmc_kv_cache_free(&kv);
    mmc_sampler_free(&smp);
    return st;
}

static mmc_status qwen2_step(mmc_ctx *ctx, void *user, const int32_t *feed, int64_t n, bool first,
                             mmc_kv_cache *kv, float **logits) {
    mmc_qwen2 *m = user;
    (void)first;
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, n));
    memcpy(ids->data, feed, (size_t)n * sizeof(int32_t));
    mmc_tensor *cos, *sin;
    mmc_rope_table_1d(ctx, positions(ctx, kv->len, n), (int)m->cfg.head_dim, m->cfg.rope_theta, &cos, &sin);
    mmc_attn_opts attn = {.causal = true};
    mmc_tensor *h = mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &attn, kv);
    mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, n - 1, 1));   /* [1, 1, C] */
    *logits = mmc_qwen2_logits(ctx, m, last)->data;                           /* [1, 1, V] */
    return MMC_OK;
}

mmc_status mmc_qwen2_generate(mmc_qwen2 *m, const int32_t *prompt, int64_t n_prompt,
                              const mmc_gen_opts *opts, int32_t *out, int *n_out) {
    return mmc_generate_loop(qwen2_step, m, &m->cfg, prompt, n_prompt, opts, out, n_out);
}
