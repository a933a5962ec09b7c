/* test_kv_paged.c — the serving engine's paged KV cache and batched decode against the
 * unpaged single-sequence decode of mmc_generate (mmc_qwen2_decoder): a random GQA Qwen2
 * (4 query heads over 2 KV heads, two layers, q/k/v biases), four sequences with prompts of
 * different lengths prefilled one by one and then decoded together as one batch through
 * block tables of 4-position blocks (so every sequence crosses blocks, and the blocks of
 * different sequences interleave in the pool); every step's logits of every sequence match
 * its own decode within 1e-5; the same after a packed prefill of all four prompts in one
 * pass (block-diagonal attention). Also with M-RoPE on (Qwen2-VL's LM: equal axes after the
 * prompt give the 1-D table), with sequences leaving mid-way and a new one joining,
 * and the pool's accounting (blocks taken, refused when short, returned).
 * Prefix caching and chunked prefill (run_prefix): prompts sharing a 13-token "system prompt"
 * (three full 4-position blocks); the first is prefilled in chunks of 3 tokens and offers its
 * blocks to the cache, the second takes the three cached blocks and prefills only its own
 * tokens; both prompts' last logits and then six batched decode steps match each prompt's
 * unchunked, uncached prefill + decode within 1e-5 (chunked vs whole prefill: different GEMM
 * heights, so equal up to rounding, not bitwise). A prompt differing in its first token gets
 * no hit (chain hash); released blocks stay cached (evictable, counted free) until a
 * reservation needs them, least recently released first; with the cache off nothing matches;
 * prefix keys: a seed (a LoRA adapter) and media hashes (an image's content) keep blocks apart.
 * Per-sequence LoRA adapters in one batched decode: run_lora. */
#include "test_util.h"
#include "mmc_infer.h"
#include "mmc_lora.h"
#include "mmc_models.h"
#include "mmc_quant.h"

#define NSEQ 4
#define STEPS 6

static void run(bool mrope) {
    mmc_qwen2_config c = {.vocab_size = 97, .hidden_size = 64, .intermediate_size = 96, .num_layers = 2,
                          .num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .max_position_embeddings = 512,
                          .rms_norm_eps = 1e-6, .rope_theta = 10000, .qkv_bias = true, .mrope = mrope,
                          .mrope_section = {2, 3, 3}};
    mmc_qwen2 *m = NULL;
    CHECK_OK(mmc_qwen2_new(&c, 7, &m));
    if (!m) return;
    for (int l = 0; l < c.num_layers; l++) {   /* non-zero biases */
        float *b = m->layers[l].q.b->data;
        for (int64_t i = 0; i < m->layers[l].q.b->shape[0]; i++) b[i] = 0.01f * (float)(i % 7);
    }
    mmc_decoder d = mmc_qwen2_decoder(m);
    const int plen[NSEQ] = {5, 9, 1, 14};
    int32_t toks[NSEQ][32];
    for (int s = 0; s < NSEQ; s++)
        for (int t = 0; t < 32; t++) toks[s][t] = (int32_t)((s * 31 + t * 17 + 3) % c.vocab_size);
    /* reference: each sequence alone, prefill then one decode per step (contiguous cache) */
    static float ref[NSEQ][STEPS + 1][97];
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    for (int s = 0; s < NSEQ; s++) {
        mmc_kv_cache kv;
        CHECK_OK(mmc_kv_cache_init(&kv, d.n_layers, 1, d.kv_heads, d.head_dim, 64));
        float *lg;
        mmc_ctx_reset(ctx);
        CHECK_OK(d.prefill(ctx, d.self, toks[s], plen[s], &kv, &lg));
        memcpy(ref[s][0], lg, sizeof ref[s][0]);
        for (int k = 1; k <= STEPS; k++) {
            mmc_ctx_reset(ctx);
            CHECK_OK(d.decode(ctx, d.self, toks[s][plen[s] + k - 1], &kv, &lg));
            memcpy(ref[s][k], lg, sizeof ref[s][k]);
        }
        mmc_kv_cache_free(&kv);
    }
    /* paged: prefill alone (contiguous), import, then decode all together */
    mmc_kv_pool pool;
    CHECK_OK(mmc_kv_pool_init(&pool, d.n_layers, d.kv_heads, d.head_dim, 4, 40));
    mmc_kv_seq seq[NSEQ] = {0};
    double worst = 0;
    for (int s = 0; s < NSEQ; s++) {
        mmc_kv_cache kv;
        CHECK_OK(mmc_kv_cache_init(&kv, d.n_layers, 1, d.kv_heads, d.head_dim, 64));
        float *lg;
        mmc_ctx_reset(ctx);
        CHECK_OK(d.prefill(ctx, d.self, toks[s], plen[s], &kv, &lg));
        CHECK_OK(mmc_kv_seq_import(&pool, &seq[s], &kv));
        CHECK(seq[s].len == plen[s] && seq[s].n_blocks == (plen[s] + 3) / 4);
        mmc_kv_cache_free(&kv);
    }
    for (int k = 1; k <= STEPS; k++) {
        /* sequence 2 leaves after step 3 (its blocks return to the pool) */
        mmc_kv_seq *act[NSEQ];
        int32_t tk[NSEQ];
        int64_t pos[NSEQ];
        int idx[NSEQ], B = 0;
        for (int s = 0; s < NSEQ; s++) {
            if (s == 2 && k > 3) continue;
            CHECK(mmc_kv_seq_reserve(&pool, &seq[s], seq[s].len + 1));
            act[B] = &seq[s];
            tk[B] = toks[s][plen[s] + k - 1];
            pos[B] = seq[s].len;
            idx[B++] = s;
        }
        if (k == 4) {
            int64_t before = pool.n_free, had = seq[2].n_blocks;
            mmc_kv_seq_release(&pool, &seq[2]);
            CHECK(pool.n_free == before + had && seq[2].len == 0);
        }
        float *lg;
        mmc_ctx_reset(ctx);
        CHECK_OK(mmc_qwen2_decode_batch(ctx, m, tk, pos, B, &pool, act, &lg));
        for (int b = 0; b < B; b++)
            for (int v = 0; v < c.vocab_size; v++) {
                double e = fabs((double)lg[b * c.vocab_size + v] - ref[idx[b]][k][v]);
                if (e > worst) worst = e;
            }
    }
    printf("test_kv_paged: %s: max |logit diff| batched paged vs single decode %.3g\n", mrope ? "mrope" : "rope",
           worst);
    CHECKF(worst <= 1e-5, "max |diff| %.3g", worst);
    /* packed prefill of all prompts in one pass, then batched decode: the same logits */
    for (int s = 0; s < NSEQ; s++) mmc_kv_seq_release(&pool, &seq[s]);
    {
        const int32_t *ids[NSEQ];
        int64_t n[NSEQ];
        mmc_kv_seq *act[NSEQ];
        for (int s = 0; s < NSEQ; s++) { ids[s] = toks[s]; n[s] = plen[s]; act[s] = &seq[s]; }
        float *lg;
        double wp = 0;
        mmc_ctx_reset(ctx);
        CHECK_OK(mmc_qwen2_prefill_packed(ctx, m, ids, n, NSEQ, &pool, act, &lg));
        for (int s = 0; s < NSEQ; s++) {
            CHECK(seq[s].len == plen[s]);
            for (int v = 0; v < c.vocab_size; v++) wp = fmax(wp, fabs((double)lg[s * c.vocab_size + v] - ref[s][0][v]));
        }
        for (int k = 1; k <= STEPS; k++) {
            int32_t tk[NSEQ];
            int64_t pos[NSEQ];
            for (int s = 0; s < NSEQ; s++) {
                CHECK(mmc_kv_seq_reserve(&pool, &seq[s], seq[s].len + 1));
                tk[s] = toks[s][plen[s] + k - 1];
                pos[s] = seq[s].len;
            }
            mmc_ctx_reset(ctx);
            CHECK_OK(mmc_qwen2_decode_batch(ctx, m, tk, pos, NSEQ, &pool, act, &lg));
            for (int s = 0; s < NSEQ; s++)
                for (int v = 0; v < c.vocab_size; v++)
                    wp = fmax(wp, fabs((double)lg[s * c.vocab_size + v] - ref[s][k][v]));
        }
        printf("test_kv_paged: %s: max |logit diff| packed prefill + batched decode vs alone %.3g\n",
               mrope ? "mrope" : "rope", wp);
        CHECKF(wp <= 1e-5, "packed: max |diff| %.3g", wp);
    }
    /* accounting: a reservation larger than the free blocks is refused and takes nothing */
    mmc_kv_seq big = {0};
    int64_t before = pool.n_free;
    CHECK(!mmc_kv_seq_reserve(&pool, &big, (pool.n_free + 1) * 4));
    CHECK(pool.n_free == before && big.n_blocks == 0);
    CHECK(mmc_kv_seq_reserve(&pool, &big, pool.n_free * 4));
    CHECK(pool.n_free == 0);
    mmc_kv_seq_free(&pool, &big);
    for (int s = 0; s < NSEQ; s++) mmc_kv_seq_free(&pool, &seq[s]);
    CHECK(pool.n_free == pool.n_blocks);
    mmc_kv_pool_free(&pool);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
}

#define PLEN 17
static void run_prefix(bool mrope) {
    mmc_qwen2_config c = {.vocab_size = 97, .hidden_size = 64, .intermediate_size = 96, .num_layers = 2,
                          .num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .max_position_embeddings = 512,
                          .rms_norm_eps = 1e-6, .rope_theta = 10000, .qkv_bias = true, .mrope = mrope,
                          .mrope_section = {2, 3, 3}};
    mmc_qwen2 *m = NULL;
    CHECK_OK(mmc_qwen2_new(&c, 11, &m));
    if (!m) return;
    mmc_decoder d = mmc_qwen2_decoder(m);
    /* prompts 0 and 1 share tokens 0..12; prompt 2 differs from prompt 0 only in token 0 */
    int32_t toks[3][PLEN + STEPS];
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < PLEN + STEPS; t++)
            toks[s][t] = (int32_t)(t < 13 ? (t * 29 + 5) % c.vocab_size : (s * 37 + t * 13 + 1) % c.vocab_size);
    toks[2][0] = (toks[0][0] + 1) % (int32_t)c.vocab_size;
    static float ref[3][STEPS + 1][97];
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    for (int s = 0; s < 3; s++) {   /* reference: whole prefill alone, then decode */
        mmc_kv_cache kv;
        CHECK_OK(mmc_kv_cache_init(&kv, d.n_layers, 1, d.kv_heads, d.head_dim, 64));
        float *lg;
        mmc_ctx_reset(ctx);
        CHECK_OK(d.prefill(ctx, d.self, toks[s], PLEN, &kv, &lg));
        memcpy(ref[s][0], lg, sizeof ref[s][0]);
        for (int k = 1; k <= STEPS; k++) {
            mmc_ctx_reset(ctx);
            CHECK_OK(d.decode(ctx, d.self, toks[s][PLEN + k - 1], &kv, &lg));
            memcpy(ref[s][k], lg, sizeof ref[s][k]);
        }
        mmc_kv_cache_free(&kv);
    }
    mmc_kv_pool pool;
    CHECK_OK(mmc_kv_pool_init(&pool, d.n_layers, d.kv_heads, d.head_dim, 4, 24));
    mmc_kv_seq seq[2] = {0};
    double worst = 0;
    int64_t matched[2];
    for (int s = 0; s < 2; s++) {
        matched[s] = mmc_kv_seq_match_prefix(&pool, &seq[s], NULL, toks[s], PLEN);
        mmc_kv_cache kv;
        CHECK_OK(mmc_kv_seq_export(&pool, &seq[s], &kv, PLEN));
        CHECK(kv.len == matched[s]);
        float *lg = NULL;
        for (int64_t at = matched[s]; at < PLEN;) {   /* chunks of 3 tokens */
            int64_t n = PLEN - at < 3 ? PLEN - at : 3;
            mmc_ctx_reset(ctx);
            CHECK_OK(mmc_qwen2_prefill_chunk(ctx, m, toks[s] + at, n, &kv, &lg));
            CHECK_OK(mmc_kv_seq_append(&pool, &seq[s], &kv, at, n));
            at += n;
        }
        CHECK(seq[s].len == PLEN && kv.len == PLEN);
        for (int v = 0; v < c.vocab_size && lg; v++) worst = fmax(worst, fabs((double)lg[v] - ref[s][0][v]));
        mmc_kv_cache_free(&kv);
        mmc_kv_seq_cache_prefix(&pool, &seq[s], NULL, toks[s], PLEN);
    }
    CHECKF(matched[0] == 0 && matched[1] == 12, "matched %lld and %lld positions, expected 0 and 12",
           (long long)matched[0], (long long)matched[1]);
    CHECK(seq[0].blocks[0] == seq[1].blocks[0] && seq[0].blocks[2] == seq[1].blocks[2] &&
          seq[0].blocks[3] != seq[1].blocks[3]);
    CHECK(pool.ref[seq[0].blocks[1]] == 2 && pool.prefix_hits == 3);
    mmc_kv_seq *act[2] = {&seq[0], &seq[1]};
    for (int k = 1; k <= STEPS; k++) {
        int32_t tk[2];
        int64_t pos[2];
        for (int s = 0; s < 2; s++) {
            CHECK(mmc_kv_seq_reserve(&pool, &seq[s], seq[s].len + 1));
            tk[s] = toks[s][PLEN + k - 1];
            pos[s] = seq[s].len;
        }
        float *lg;
        mmc_ctx_reset(ctx);
        CHECK_OK(mmc_qwen2_decode_batch(ctx, m, tk, pos, 2, &pool, act, &lg));
        for (int s = 0; s < 2; s++)
            for (int v = 0; v < c.vocab_size; v++)
                worst = fmax(worst, fabs((double)lg[s * c.vocab_size + v] - ref[s][k][v]));
    }
    printf("test_kv_paged: %s: max |logit diff| chunked prefill with a cached prefix + batched decode vs alone %.3g\n",
           mrope ? "mrope" : "rope", worst);
    CHECKF(worst <= 1e-5, "prefix/chunked: max |diff| %.3g", worst);
    /* the chain: a different first token matches nothing */
    CHECK(mmc_kv_prefix_lookup(&pool, NULL, toks[2], PLEN) == 0);
    CHECK(mmc_kv_prefix_lookup(&pool, NULL, toks[1], 13) == 12 && mmc_kv_prefix_lookup(&pool, NULL, toks[1], 12) == 8);
    /* released: every block free again, the cached ones still found */
    mmc_kv_seq_release(&pool, &seq[0]);
    mmc_kv_seq_release(&pool, &seq[1]);
    CHECK(pool.n_free == pool.n_blocks && pool.n_lru == 5);   /* 3 shared + each prompt's 4th block */
    CHECK(mmc_kv_prefix_lookup(&pool, NULL, toks[0], PLEN) == 16 && mmc_kv_prefix_lookup(&pool, NULL, toks[1], PLEN) == 16);
    /* keys: another seed (a LoRA adapter's) finds nothing; media hashes on positions 5..6 (an image's
     * placeholders) keep block 0 and miss block 1 on; all-zero media is text; blocks cached under media
     * hashes are found by the same hashes only */
    mmc_kv_prefix_key kseed = {.seed = 7};
    uint64_t mm[PLEN] = {0}, zero[PLEN] = {0}, other[PLEN] = {0};
    for (int t = 5; t < 7; t++) { mm[t] = 0xABCDEFull + (uint64_t)t; other[t] = 0xABCDEEull + (uint64_t)t; }
    mmc_kv_prefix_key kmm = {.media = mm}, kzero = {.media = zero}, kother = {.media = other};
    CHECK(mmc_kv_prefix_lookup(&pool, &kseed, toks[0], PLEN) == 0);
    CHECK(mmc_kv_prefix_lookup(&pool, &kmm, toks[0], PLEN) == 4 && mmc_kv_prefix_lookup(&pool, &kzero, toks[0], PLEN) == 16);
    CHECK(mmc_kv_seq_reserve(&pool, &seq[0], PLEN));
    seq[0].len = PLEN;
    mmc_kv_seq_cache_prefix(&pool, &seq[0], &kmm, toks[0], PLEN);
    CHECK(mmc_kv_prefix_lookup(&pool, &kmm, toks[0], PLEN) == 16 &&
          mmc_kv_prefix_lookup(&pool, &kother, toks[0], PLEN) == 4);
    mmc_kv_seq_release(&pool, &seq[0]);
    CHECK(pool.n_lru == 8);   /* blocks 1..3 under the media key too (block 0 was cached already) */
    /* a reservation of every block evicts them all */
    mmc_kv_seq big = {0};
    CHECK(mmc_kv_seq_reserve(&pool, &big, pool.n_blocks * 4));
    CHECK(pool.n_free == 0 && pool.prefix_evictions == 8 && mmc_kv_prefix_lookup(&pool, NULL, toks[0], PLEN) == 0);
    mmc_kv_seq_free(&pool, &big);
    CHECK(pool.n_free == pool.n_blocks && pool.n_lru == 0);
    /* cache off: nothing matches and nothing is kept */
    pool.prefix_cache = false;
    CHECK(mmc_kv_seq_match_prefix(&pool, &seq[0], NULL, toks[0], PLEN) == 0);
    CHECK(mmc_kv_seq_reserve(&pool, &seq[0], PLEN));
    seq[0].len = PLEN;
    mmc_kv_seq_cache_prefix(&pool, &seq[0], NULL, toks[0], PLEN);
    mmc_kv_seq_release(&pool, &seq[0]);
    CHECK(pool.n_lru == 0 && pool.n_free == pool.n_blocks);
    for (int s = 0; s < 2; s++) mmc_kv_seq_free(&pool, &seq[s]);
    mmc_kv_pool_free(&pool);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
}

/* Per-sequence LoRA adapters in one batched decode (run_lora): two adapters on different modules
 * and ranks (q/v/gate r 2; k/o/up/down r 3; random non-zero A and B), three sequences decoded
 * together with adapter 1, none and adapter 2; each row's logits match its sequence decoded alone
 * with only its adapter attached (mmc_nn_linear's path) within 1e-5, for STEPS steps. */
/* toks[0, plen) prefilled alone, then STEPS decodes of the following tokens: out[k] the logits of step k;
 * the prefill's K/V also into seq when pool is given */
static void decode_alone(mmc_ctx *ctx, const mmc_decoder *d, const int32_t *toks, int plen, float out[][97],
                         mmc_kv_pool *pool, mmc_kv_seq *seq) {
    mmc_kv_cache kv;
    CHECK_OK(mmc_kv_cache_init(&kv, d->n_layers, 1, d->kv_heads, d->head_dim, 64));
    float *lg;
    mmc_ctx_reset(ctx);
    CHECK_OK(d->prefill(ctx, d->self, toks, plen, &kv, &lg));
    if (pool) CHECK_OK(mmc_kv_seq_import(pool, seq, &kv));
    for (int k = 1; k <= STEPS; k++) {
        mmc_ctx_reset(ctx);
        CHECK_OK(d->decode(ctx, d->self, toks[plen + k - 1], &kv, &lg));
        memcpy(out[k], lg, sizeof out[k]);
    }
    mmc_kv_cache_free(&kv);
}

static void run_lora(void) {
    mmc_qwen2_config c = {.vocab_size = 97, .hidden_size = 64, .intermediate_size = 96, .num_layers = 2,
                          .num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .max_position_embeddings = 512,
                          .rms_norm_eps = 1e-6, .rope_theta = 10000, .qkv_bias = true};
    mmc_qwen2 *m = NULL;
    CHECK_OK(mmc_qwen2_new(&c, 5, &m));
    if (!m) return;
    mmc_module_list ml = {0};
    CHECK_OK(mmc_qwen2_linears(m, "model.", &ml));
    static const char *const t1[] = {"q_proj", "v_proj", "gate_proj"}, *const t2[] = {"k_proj", "o_proj", "up_proj",
                                                                                        "down_proj"};
    mmc_lora_config c1 = {.r = 2, .alpha = 4, .targets = t1, .n_targets = 3, .seed = 1};
    mmc_lora_config c2 = {.r = 3, .alpha = 2, .targets = t2, .n_targets = 4, .seed = 2};
    mmc_lora_set *sets[2] = {NULL, NULL};
    mmc_rng rng;
    mmc_rng_init(&rng, 9);
    for (int a = 0; a < 2; a++) {
        CHECK_OK(mmc_lora_attach(&ml, a ? &c2 : &c1, &sets[a]));
        if (!sets[a]) return;
        for (int i = 0; i < sets[a]->n; i++) {   /* B is zero after attach: make the delta count */
            mmc_tensor *B = sets[a]->adapters[i].B;
            mmc_rng_uniform(&rng, B->data, mmc_numel(B), -0.5f, 0.5f);
            sets[a]->mods[i]->lora = NULL;       /* detached, as the server keeps them */
        }
    }
    const int row[3] = {1, 0, 2}, plen[3] = {6, 3, 9};
    int32_t toks[3][32];
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 32; t++) toks[s][t] = (int32_t)((s * 23 + t * 11 + 2) % c.vocab_size);
    static float ref[3][STEPS + 1][97];
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_decoder d = mmc_qwen2_decoder(m);
    mmc_kv_pool pool;
    CHECK_OK(mmc_kv_pool_init(&pool, d.n_layers, d.kv_heads, d.head_dim, 4, 32));
    mmc_kv_seq seq[3] = {0};
    for (int s = 0; s < 3; s++) {   /* alone, its adapter attached; its prefill also goes into the pool */
        mmc_lora_set *a = row[s] ? sets[row[s] - 1] : NULL;
        for (int i = 0; a && i < a->n; i++) a->mods[i]->lora = &a->adapters[i];
        decode_alone(ctx, &d, toks[s], plen[s], ref[s], &pool, &seq[s]);
        for (int i = 0; a && i < a->n; i++) a->mods[i]->lora = NULL;
    }
    static float base0[STEPS + 1][97];   /* sequence 0 without its adapter: how much the adapter moves it */
    decode_alone(ctx, &d, toks[0], plen[0], base0, NULL, NULL);
    double worst = 0, apart = 0;
    mmc_lora_rows lr = {2, sets, row};
    mmc_kv_seq *act[3] = {&seq[0], &seq[1], &seq[2]};
    for (int k = 1; k <= STEPS; k++) {
        int32_t tk[3];
        int64_t pos[3];
        for (int s = 0; s < 3; s++) {
            CHECK(mmc_kv_seq_reserve(&pool, &seq[s], seq[s].len + 1));
            tk[s] = toks[s][plen[s] + k - 1];
            pos[s] = seq[s].len;
        }
        float *lg;
        mmc_ctx_reset(ctx);
        CHECK_OK(mmc_qwen2_decode_batch_lora(ctx, m, tk, pos, 3, &pool, act, &lr, &lg));
        for (int s = 0; s < 3; s++)
            for (int v = 0; v < c.vocab_size; v++) {
                worst = fmax(worst, fabs((double)lg[s * c.vocab_size + v] - ref[s][k][v]));
                if (s == 0) apart = fmax(apart, fabs((double)ref[0][k][v] - base0[k][v]));
            }
    }
    printf("test_kv_paged: per-sequence LoRA in one batch: max |logit diff| vs each alone with its adapter %.3g "
           "(the adapters move logits by up to %.3g)\n", worst, apart);
    CHECKF(worst <= 1e-5, "batched LoRA rows: max |diff| %.3g", worst);
    CHECKF(apart > 1e-2, "the adapters barely change the logits (%.3g): the check would not see a missing delta", apart);
    for (int s = 0; s < 3; s++) mmc_kv_seq_free(&pool, &seq[s]);
    mmc_kv_pool_free(&pool);
    mmc_ctx_free(ctx);
    for (int a = 0; a < 2; a++) mmc_lora_free(sets[a]);
    mmc_module_list_free(&ml);
    mmc_qwen2_free(m);
}

/* A decode step of many rows on bf16 weights (the serving case: each linear as 4-row matvec
 * GEMMs, kv_paged.c's decode_linear) computes for every row exactly what that row alone does:
 * 12 sequences decoded together vs each decoded by itself, logits bit for bit; f32 weights too,
 * and the decoder linears quantised to int8 and NF4 (--quantize: 4-row groups of the direct
 * quantised matvec; intermediate 128 there so that every K is a whole number of NF4 blocks). */
#define NROW 12
enum { ROWS_F32, ROWS_BF16, ROWS_INT8, ROWS_NF4 };
static void run_rows(int kind) {
    const bool bf16 = kind == ROWS_BF16;
    mmc_qwen2_config c = {.vocab_size = 97, .hidden_size = 64, .intermediate_size = kind >= ROWS_INT8 ? 128 : 96,
                          .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 16,
                          .max_position_embeddings = 512, .rms_norm_eps = 1e-6, .rope_theta = 10000, .qkv_bias = true};
    mmc_qwen2 *m = NULL;
    CHECK_OK(mmc_qwen2_new(&c, 9, &m));
    if (!m) return;
    if (kind >= ROWS_INT8) {
        int nq = 0;
        CHECK_OK(mmc_qwen2_quantize(m, kind == ROWS_INT8 ? MMC_WQ_INT8 : MMC_WQ_NF4, &nq, NULL, NULL));
        CHECK(nq == 14);
    }
    mmc_tensor *owned[2 * 7], *orig[2 * 7];
    mmc_linear_w *slot[2 * 7];
    int n_owned = 0;
    for (int l = 0; bf16 && l < c.num_layers; l++) {   /* the matrices rounded to bf16, as a bf16 checkpoint */
        mmc_qwen2_layer *L = &m->layers[l];
        mmc_linear_w *ws[7] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; i++) {
            mmc_tensor *t = mmc_tensor_new(MMC_BF16, 2, ws[i]->w->shape);
            for (int64_t j = 0; j < mmc_numel(t); j++)
                ((uint16_t *)t->data)[j] = mmc_f32_to_bf16(((const float *)ws[i]->w->data)[j]);
            slot[n_owned] = ws[i], orig[n_owned] = ws[i]->w;
            ws[i]->w = owned[n_owned++] = t;
        }
    }
    mmc_kv_pool pool;
    CHECK_OK(mmc_kv_pool_init(&pool, c.num_layers, c.num_kv_heads, c.head_dim, 4, 200));
    mmc_kv_seq seq[NROW] = {0};
    mmc_kv_seq *act[NROW];
    const int32_t *ids[NROW];
    int64_t n[NROW], pos[NROW];
    int32_t toks[NROW][8], tk[NROW];
    for (int s = 0; s < NROW; s++) {
        for (int t = 0; t < 8; t++) toks[s][t] = (int32_t)((s * 13 + t * 29 + 5) % c.vocab_size);
        ids[s] = toks[s], n[s] = 3 + s % 5, act[s] = &seq[s];
    }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    float *lg;
    CHECK_OK(mmc_qwen2_prefill_packed(ctx, m, ids, n, NROW, &pool, act, &lg));
    for (int s = 0; s < NROW; s++) {
        CHECK(mmc_kv_seq_reserve(&pool, &seq[s], seq[s].len + 1));
        tk[s] = toks[s][n[s]], pos[s] = seq[s].len;
    }
    static float all[NROW][97];
    mmc_ctx_reset(ctx);
    CHECK_OK(mmc_qwen2_decode_batch(ctx, m, tk, pos, NROW, &pool, act, &lg));
    memcpy(all, lg, sizeof all);
    int differ = 0;
    for (int s = 0; s < NROW; s++) {   /* each alone at the same position (its K/V slot rewritten alike) */
        for (int r = 0; r < NROW; r++) seq[r].len = pos[r];
        mmc_ctx_reset(ctx);
        CHECK_OK(mmc_qwen2_decode_batch(ctx, m, &tk[s], &pos[s], 1, &pool, &act[s], &lg));
        differ += memcmp(lg, all[s], sizeof all[s]) != 0;
    }
    static const char *const kname[] = {"f32", "bf16", "int8", "nf4"};
    printf("test_kv_paged: %s weights: %d rows decoded together, %d of them differ from the row alone\n",
           kname[kind], NROW, differ);
    CHECKF(differ == 0, "%d rows of a %d-row decode differ from their decode alone", differ, NROW);
    for (int s = 0; s < NROW; s++) mmc_kv_seq_free(&pool, &seq[s]);
    mmc_kv_pool_free(&pool);
    mmc_ctx_free(ctx);
    for (int i = 0; i < n_owned; i++) {   /* the f32 originals back (the model frees its own) */
        slot[i]->w = orig[i];
        mmc_tensor_free(owned[i]);
    }
    mmc_qwen2_free(m);
}

int main(void) {
    run_rows(ROWS_BF16);
    run_rows(ROWS_F32);
    run_rows(ROWS_INT8);
    run_rows(ROWS_NF4);
    run_lora();
    run(false);
    run(true);
    run_prefix(false);
    run_prefix(true);
    return test_done("test_kv_paged");
}
