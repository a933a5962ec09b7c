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
 * reservation needs them, least recently released first; with the cache off nothing matches. */
#include "test_util.h"
#include "mmc_infer.h"

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
    /* a reservation of every block evicts them all */
    mmc_kv_seq big = {0};
    CHECK(mmc_kv_seq_reserve(&pool, &big, pool.n_blocks * 4));
    CHECK(pool.n_free == 0 && pool.prefix_evictions == 5 && mmc_kv_prefix_lookup(&pool, NULL, toks[0], PLEN) == 0);
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

int main(void) {
    run(false);
    run(true);
    run_prefix(false);
    run_prefix(true);
    return test_done("test_kv_paged");
}
