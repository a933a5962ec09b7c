/* mmc_infer.h — generation: samplers and the prefill/decode loop over a KV cache, driving any
 * model through its mmc_decoder table (mmc_models.h).
 *
 * Sampling follows transformers' logits-processor order: repetition penalty, then
 * temperature, top-k, top-p, min-p, then a draw from the softmax (or argmax when greedy).
 * OpenAI's presence / frequency penalties (off by default) come before all of them.
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
    /* OpenAI's penalties over the tokens generated so far (not the prompt), applied to the raw
     * logits before everything else: logit[t] -= count(t) * frequency_penalty
     * + (count(t) > 0) * presence_penalty. 0: off. */
    float presence_penalty, frequency_penalty;
    /* Called with the raw logits [vocab] of every step before any processing (logprobs). */
    void (*on_logits)(void *user, const float *logits, int64_t vocab);
    void *logits_user;
} mmc_sampler_opts;

void mmc_sampler_defaults(mmc_sampler_opts *o);   /* greedy */

typedef struct {
    mmc_sampler_opts opts;
    mmc_rng rng;
    float *probs;               /* [V] scratch */
    int32_t *idx;               /* [V] scratch */
    uint8_t *seen;              /* [V] scratch for the repetition penalty */
    int64_t vocab;
    int64_t n_first;            /* history length at the first call (the prompt), -1 before */
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

/* ---------------------------------------------------------------- generation_config.json
 * A checkpoint's generation defaults, resolved as transformers' generate() does: the
 * file's values over transformers' global defaults (do_sample false, temperature 1,
 * top_k 50, top_p 1, min_p off, repetition_penalty 1, max_length 20 counting the prompt).
 * The command line overrides either. eos_token_id may be one id or a list. */
#define MMC_GEN_MAX_EOS 16
typedef struct {
    bool present;                 /* the directory had a generation_config.json */
    bool do_sample;
    double temperature, top_p, min_p, repetition_penalty;
    int64_t top_k;
    int64_t max_new_tokens;       /* -1: not set in the file */
    int64_t max_length;           /* prompt + new tokens; 20 (the global default) when unset */
    bool length_set;              /* the file sets max_new_tokens or max_length */
    int32_t eos_ids[MMC_GEN_MAX_EOS];
    int n_eos;                    /* 0: the file names none (fall back to the tokenizer's) */
    int32_t bos_id, pad_id;       /* -1 when unset */
} mmc_gen_config;

void mmc_gen_config_defaults(mmc_gen_config *g);
/* dir/generation_config.json if it exists (else the defaults, present = false). A file that
 * exists but cannot be read, or a key of the wrong type or out of range, is an error naming
 * the file and the key. */
mmc_status mmc_gen_config_read(const char *dir, mmc_gen_config *g);
/* The sampler the config asks for: greedy unless do_sample (the repetition penalty applies
 * either way, as in transformers); sampling uses temperature, top_k, top_p, min_p. */
void mmc_gen_config_sampler(const mmc_gen_config *g, mmc_sampler_opts *o);
/* New tokens for a prompt of n_prompt tokens: max_new_tokens, else max_length - n_prompt
 * (at least 0). */
int64_t mmc_gen_config_max_new(const mmc_gen_config *g, int64_t n_prompt);

/* The decode loop every model shares: prefill the prompt into a fresh KV cache, then one
 * token per step, with sampling, EOS and streaming, through the model's decoder table
 * (mmc_models.h). out receives up to max_new_tokens ids; *n_out their count. */
mmc_status mmc_generate(const mmc_decoder *dec, const int32_t *prompt, int64_t n_prompt,
                        const mmc_gen_opts *opts, int32_t *out, int *n_out);


/* ---------------------------------------------------------------- paged KV cache
 * vLLM-style paging for the serving engine: one pool of fixed-size blocks (block_size
 * positions each; per layer a [n_blocks, block_size, Hkv, D] buffer for K and one for V),
 * and per sequence a block table (the pool blocks holding its positions 0.., in order). A
 * sequence grows a block at a time; freeing it returns its blocks. The pool is not
 * thread-safe: the engine's one thread owns it. */
typedef struct {
    int n_layers;
    int64_t kv_heads, head_dim, block_size, n_blocks;
    float **k, **v;             /* [n_layers] of [n_blocks, block_size, Hkv, D] */
    int32_t *free_ids;          /* stack of empty block ids (n_empty of them) */
    int64_t n_empty;
    int64_t n_free;             /* blocks a reservation may take: the empty ones plus the evictable
                                 * cached ones (held by no sequence) */
    int32_t *ref;               /* [n_blocks] sequences holding each block */
    /* prefix caching (vLLM's automatic prefix caching): a full block of prompt tokens is kept,
     * once its sequence has computed it, under the chain hash of all tokens up to its end
     * (hash[i] = H(hash[i-1], tokens of block i)); a later prompt with the same tokens takes
     * those blocks (reference counted) instead of recomputing them. Blocks no sequence holds
     * stay cached until a reservation needs them (least recently released first). Shared
     * blocks are full and read-only: a sequence writes only past its matched prefix. */
    bool prefix_cache;          /* mmc_kv_pool_init turns it on; callers may switch it off */
    uint64_t *hash, *parent;    /* [n_blocks] a cached block's chain hash and its parent's */
    uint64_t *media;            /* [n_blocks] a cached block's media content digest (0: text only) */
    int32_t *toks;              /* [n_blocks, block_size] a cached block's tokens (checked on a hit) */
    uint8_t *cached;            /* [n_blocks] in the hash table */
    int32_t *bucket, *hnext;    /* hash table: [n_bucket] heads, [n_blocks] chains (-1: end) */
    int64_t n_bucket;
    int32_t *lru_prev, *lru_next, lru_head, lru_tail;   /* cached blocks of ref 0, oldest first */
    int64_t n_lru;
    long long prefix_queries, prefix_hits, prefix_evictions;   /* full blocks looked up / found / evicted */
} mmc_kv_pool;

typedef struct {
    int32_t *blocks;            /* block table */
    int64_t n_blocks, cap;
    int64_t len;                /* positions written */
} mmc_kv_seq;

mmc_status mmc_kv_pool_init(mmc_kv_pool *p, int n_layers, int64_t kv_heads, int64_t head_dim, int64_t block_size,
                            int64_t n_blocks);
void mmc_kv_pool_free(mmc_kv_pool *p);
/* Blocks a sequence needs to hold n positions. */
int64_t mmc_kv_pool_blocks_for(const mmc_kv_pool *p, int64_t n);
/* Make s hold at least n positions: false (nothing taken) when the pool has too few free blocks. */
bool mmc_kv_seq_reserve(mmc_kv_pool *p, mmc_kv_seq *s, int64_t n);
/* What keys a prompt's blocks besides its token ids (NULL: nothing): seed starts the hash chain
 * (0 for the base model; a LoRA adapter's own value, so no two adapters share K/V), and media
 * (NULL, or [n] per prompt position) holds for each image placeholder token the content hash of
 * its image (0 for text), so the same image (same pixels and grid) hits and another one misses. */
typedef struct {
    uint64_t seed;
    const uint64_t *media;
} mmc_kv_prefix_key;
/* Prefix caching. The positions of the longest cached prefix of ids[0 .. n) that is a whole
 * number of blocks and leaves at least one token to compute (a multiple of block_size, < n);
 * nothing is taken (for planning). */
int64_t mmc_kv_prefix_lookup(mmc_kv_pool *p, const mmc_kv_prefix_key *key, const int32_t *ids, int64_t n);
/* The same for an empty s, which takes those blocks (their reference counts grow; evictable
 * ones stop being evictable) and s->len becomes the matched positions; counts queries/hits. */
int64_t mmc_kv_seq_match_prefix(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_prefix_key *key, const int32_t *ids,
                                int64_t n);
/* Offer s's full blocks covering ids[0 .. n) (n <= s->len; the tokens whose K/V s holds at
 * positions 0 .. n-1) to the cache. A block whose prefix is already cached in another block
 * stays private. No-op when prefix_cache is off. */
void mmc_kv_seq_cache_prefix(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_prefix_key *key, const int32_t *ids,
                             int64_t n);
/* Copy s's positions [0, s->len) into an empty contiguous single-sequence cache (batch 1,
 * reserved here for at least extra more positions); kv->len = s->len. */
mmc_status mmc_kv_seq_export(const mmc_kv_pool *p, const mmc_kv_seq *s, mmc_kv_cache *kv, int64_t extra);
/* Append kv's positions [from, from + n) to s at s->len .. (reserving blocks; MMC_ERR_OOM and
 * nothing taken when short); s->len grows by n. */
mmc_status mmc_kv_seq_append(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_cache *kv, int64_t from, int64_t n);
/* Return s's blocks to the pool; s becomes empty (its table's memory kept for reuse). */
void mmc_kv_seq_release(mmc_kv_pool *p, mmc_kv_seq *s);
void mmc_kv_seq_free(mmc_kv_pool *p, mmc_kv_seq *s);
/* The address of K (or V) [Hkv, D] of position pos of s in layer l (pos < reserved capacity). */
float *mmc_kv_seq_at(const mmc_kv_pool *p, const mmc_kv_seq *s, int layer, bool value, int64_t pos);
/* Copy a filled contiguous single-sequence cache (batch 1, kv->len positions: a prefill) into s,
 * reserving its blocks; s->len = kv->len. MMC_ERR_OOM without blocks (nothing taken). */
mmc_status mmc_kv_seq_import(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_cache *kv);
/* The same for positions [from, from + n) of the cache, which become s's 0 .. n-1. */
mmc_status mmc_kv_seq_import_range(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_cache *kv, int64_t from, int64_t n);
/* Decode attention through block tables, one query token per sequence: q [B, Hq, D] ->
 * out [B, Hq, D]; sequence b attends over positions [0, seqs[b]->len) of layer l (the new
 * token's K/V already written). Query head h reads KV head h / (Hq / Hkv) (GQA); softmax of
 * q.k * scale (0: 1/sqrt(D)). Runs over (sequence, head) pairs in parallel. */
void mmc_kv_paged_attention(const mmc_kv_pool *p, int layer, mmc_kv_seq *const *seqs, int64_t B, int64_t Hq,
                            const float *q, float *out, float scale);

/* Batched decode of the text model (mmc_models.h's mmc_qwen2; Llama and the VLMs' LMs too):
 * B sequences, one new token each, as one [B, C] batch through every linear (one GEMM per
 * weight), each attending over its own paged cache. tokens [B]; rope_pos [B] the RoPE
 * position of each token (its cache length, plus Qwen2-VL's rope delta: for M-RoPE the three
 * axes are equal after the prompt); the new K/V are written at seqs[b]->len, which then grows
 * by one (blocks must have been reserved). *logits: [B, V] in ctx's arena. */
mmc_status mmc_qwen2_decode_batch(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *tokens, const int64_t *rope_pos,
                                  int64_t B, mmc_kv_pool *pool, mmc_kv_seq *const *seqs, float **logits);
/* Per-sequence LoRA adapters in one batch (S-LoRA / Punica's idea, vLLM's multi-LoRA): every
 * base linear still runs once over all B rows; then for each adapter the rows of its
 * sequences are gathered and get its own delta, y[rows] += scale · (x[rows] Aᵀ) Bᵀ, so a
 * sequence's result is what the model with that one adapter attached computes. The adapters are
 * loaded (mmc_lora_load) and detached again (their modules' lora NULL) while this runs; a
 * module an adapter does not name gets no delta (nor does one outside the decoder layers: a
 * vision tower's modules act in the prefill only, with the adapter attached). */
struct mmc_lora_set;
typedef struct {
    int n;                             /* adapters */
    struct mmc_lora_set *const *sets;  /* [n] */
    const int *row;                    /* [B] each sequence's adapter: 0 none, k: sets[k - 1] */
} mmc_lora_rows;
mmc_status mmc_qwen2_decode_batch_lora(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *tokens, const int64_t *rope_pos,
                                       int64_t B, mmc_kv_pool *pool, mmc_kv_seq *const *seqs,
                                       const mmc_lora_rows *lr, float **logits);

/* Prefill n text tokens ids at positions kv->len .. of a contiguous single-sequence cache (the
 * decoder's 1-D RoPE, or M-RoPE with equal axes for Qwen2-VL's LM on text), growing kv: one
 * chunk of a chunked prefill, or the rest of a prompt after a cached prefix. Causal attention
 * over the cache and the chunk (bottom-right aligned). *logits: the last position's [V]. */
mmc_status mmc_qwen2_prefill_chunk(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                   float **logits);
/* The same with RoPE positions kv->len + t + rope_delta: text after a Qwen2-VL prompt's media (its rope delta). */
mmc_status mmc_qwen2_prefill_chunk_at(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                      int64_t rope_delta, float **logits);
/* The same from input embeddings [1, n, C] and their RoPE tables cos, sin (as the model's rope
 * table gives them: [1, n, D] or [n, D]): a prompt's media positions (their vision features in
 * place) after a cached prefix. */
mmc_status mmc_qwen2_prefill_embeds(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *embeds, mmc_tensor *cos, mmc_tensor *sin,
                                    mmc_kv_cache *kv, float **logits);

/* Prefill N text prompts (ids[i] of n[i] tokens, no media) in one forward pass: packed into one
 * row with block-diagonal causal attention and positions from 0 in each, so each prompt's
 * result is its prefill alone; seqs[i] (empty) receive their K/V (blocks reserved here; an
 * MMC_ERR_OOM before any work when the pool is short). *logits: [N, V], each prompt's last
 * position, in ctx's arena. Not for dynamic NTK RoPE (its tables depend on the length). */
mmc_status mmc_qwen2_prefill_packed(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *const *ids, const int64_t *n,
                                    int64_t N, mmc_kv_pool *pool, mmc_kv_seq *const *seqs, float **logits);

#ifdef __cplusplus
}
#endif
#endif
