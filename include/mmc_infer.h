/* mmc_infer.h — generation: samplers and the prefill/decode loop over a KV cache.
 *
 * Sampling follows transformers' logits-processor order: repetition penalty, then
 * temperature, top-k, top-p, min-p, then a draw from the softmax (or argmax when greedy).
 */
#ifndef MMC_INFER_H
#define MMC_INFER_H

#include "mmc.h"
#include "mmc_models.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature;         /* <= 0: greedy */
    int top_k;                 /* 0: off */
    float top_p;               /* 1: off */
    float min_p;               /* 0: off */
    float repetition_penalty;  /* 1: off (HF semantics: divide positive logits, multiply negative) */
    uint64_t seed;
} mmc_sampler_opts;

void mmc_sampler_defaults(mmc_sampler_opts *o);   /* greedy */

typedef struct {
    mmc_sampler_opts opts;
    mmc_rng rng;
    float *probs;               /* [V] scratch */
    int32_t *idx;               /* [V] scratch */
    uint8_t *seen;              /* [V] scratch for the repetition penalty */
    int64_t vocab;
} mmc_sampler;

mmc_status mmc_sampler_init(mmc_sampler *s, const mmc_sampler_opts *o, int64_t vocab);
void mmc_sampler_free(mmc_sampler *s);
/* Pick the next token from logits [V] (modified in place). history: tokens seen so far
 * (prompt + generated), for the repetition penalty. */
int32_t mmc_sampler_next(mmc_sampler *s, float *logits, const int32_t *history, int64_t n_history);

/* Streaming callback: called with each new token id; return false to stop. */
typedef bool (*mmc_token_cb)(void *user, int32_t token);

typedef struct {
    int max_new_tokens;
    const int32_t *eos_ids;     /* stop when one of these is produced (it is not emitted) */
    int n_eos;
    mmc_sampler_opts sampler;
    mmc_token_cb on_token;      /* may be NULL */
    void *user;
} mmc_gen_opts;

/* The decode loop every model shares: prefill the prompt, then one token per step with the
 * KV cache, sampling, EOS and streaming. step() feeds ids [n] at the cache's end (first: the
 * prompt) and returns the last position's logits [V] (in ctx's arena, may be modified). */
typedef mmc_status (*mmc_step_fn)(mmc_ctx *ctx, void *user, const int32_t *ids, int64_t n, bool first,
                                  mmc_kv_cache *kv, float **logits);
mmc_status mmc_generate_loop(mmc_step_fn step, void *user, const mmc_qwen2_config *lm,
                             const int32_t *prompt, int64_t n_prompt, const mmc_gen_opts *opts,
                             int32_t *out, int *n_out);

/* Text-only generation with a Qwen2 decoder: prefill the prompt, then decode token by token
 * with the KV cache. out receives up to max_new_tokens ids; *n_out their count. */
mmc_status mmc_qwen2_generate(mmc_qwen2 *m, const int32_t *prompt, int64_t n_prompt,
                              const mmc_gen_opts *opts, int32_t *out, int *n_out);

#ifdef __cplusplus
}
#endif
#endif
