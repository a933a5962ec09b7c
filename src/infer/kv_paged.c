/* kv_paged.c — the paged KV cache of the serving engine (vLLM's PagedAttention layout, on the
 * CPU): a pool of fixed-size blocks shared by every running sequence, a block table per
 * sequence, and the decode attention kernel reading K/V through the tables. Positions of a
 * sequence need not be contiguous in memory, so sequences grow and finish independently and
 * memory is committed a block at a time instead of a context length per request. The kernel
 * computes what mmc_attention does for one query row over a contiguous cache (softmax of
 * scaled dot products, max subtracted, GQA by head groups).
 * Prefix caching follows vLLM's automatic prefix caching: full blocks of prompt tokens are
 * found again by a hash chained over all tokens up to each block's end, shared by reference
 * count, and kept after their last sequence leaves until a reservation needs the block (LRU).
 * A key (mmc_kv_prefix_key) seeds the chain (a LoRA adapter's own value) and gives image
 * placeholder positions their image's content hash (vLLM's mm_hash), folded into the block's
 * hash and stored beside its tokens. The batched decode adds per-sequence LoRA deltas. 
 * A prefill that starts after a cached prefix (or continues a chunked prefill) runs over a
 * contiguous copy of the sequence's positions (mmc_kv_seq_export) and appends its new K/V. */
#include "mmc_infer.h"
#include "mmc_lora.h"
#include "mmc_quant.h"
#include "../backend/cpu/gemm.h"
#include "../backend/cpu/matvec.h"
#include "../backend/cpu/qmatvec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_kv_pool_init(mmc_kv_pool *p, int n_layers, int64_t kv_heads, int64_t head_dim, int64_t block_size,
                            int64_t n_blocks) {
    memset(p, 0, sizeof *p);
    if (n_layers <= 0 || kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || n_blocks <= 0 || n_blocks > INT32_MAX)
        return mmc_error(MMC_ERR_INVALID, "KV pool: layers %d, kv heads %lld, head dim %lld, block size %lld and "
                         "blocks %lld must all be positive (blocks below 2^31)", n_layers, (long long)kv_heads,
                         (long long)head_dim, (long long)block_size, (long long)n_blocks);
    p->n_layers = n_layers;
    p->kv_heads = kv_heads;
    p->head_dim = head_dim;
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->prefix_cache = true;
    p->n_bucket = 1;
    while (p->n_bucket < 2 * n_blocks) p->n_bucket *= 2;
    p->k = calloc((size_t)n_layers, sizeof *p->k);
    p->v = calloc((size_t)n_layers, sizeof *p->v);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    p->hash = calloc((size_t)n_blocks, sizeof *p->hash);
    p->parent = calloc((size_t)n_blocks, sizeof *p->parent);
    p->media = calloc((size_t)n_blocks, sizeof *p->media);
    p->toks = malloc((size_t)(n_blocks * block_size) * sizeof *p->toks);
    p->cached = calloc((size_t)n_blocks, 1);
    p->hnext = malloc((size_t)n_blocks * sizeof *p->hnext);
    p->lru_prev = malloc((size_t)n_blocks * sizeof *p->lru_prev);
    p->lru_next = malloc((size_t)n_blocks * sizeof *p->lru_next);
    p->bucket = malloc((size_t)p->n_bucket * sizeof *p->bucket);
    if (!p->k || !p->v || !p->free_ids || !p->ref || !p->hash || !p->parent || !p->media || !p->toks || !p->cached || !p->hnext ||
        !p->lru_prev || !p->lru_next || !p->bucket)
        goto oom;
    size_t per = (size_t)(n_blocks * block_size * kv_heads * head_dim);
    for (int l = 0; l < n_layers; l++) {
        p->k[l] = malloc(per * sizeof(float));
        p->v[l] = malloc(per * sizeof(float));
        if (!p->k[l] || !p->v[l]) goto oom;
    }
    for (int64_t i = 0; i < n_blocks; i++) p->free_ids[i] = (int32_t)(n_blocks - 1 - i);   /* block 0 first */
    for (int64_t i = 0; i < p->n_bucket; i++) p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    p->n_empty = p->n_free = n_blocks;
    return MMC_OK;
oom:
    mmc_kv_pool_free(p);
    return mmc_error(MMC_ERR_OOM, "out of memory allocating a KV pool of %lld blocks x %lld positions (%d layers, "
                     "%lld KV heads x %lld); give fewer blocks (--kv-blocks / --kv-memory)", (long long)n_blocks,
                     (long long)block_size, n_layers, (long long)kv_heads, (long long)head_dim);
}

void mmc_kv_pool_free(mmc_kv_pool *p) {
    for (int l = 0; l < p->n_layers; l++) {
        if (p->k) free(p->k[l]);
        if (p->v) free(p->v[l]);
    }
    free(p->k);
    free(p->v);
    free(p->free_ids);
    free(p->ref);
    free(p->hash);
    free(p->parent);
    free(p->media);
    free(p->toks);
    free(p->cached);
    free(p->hnext);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->bucket);
    memset(p, 0, sizeof *p);
}

int64_t mmc_kv_pool_blocks_for(const mmc_kv_pool *p, int64_t n) { return (n + p->block_size - 1) / p->block_size; }

/* ------------------------------------------------------------------ prefix cache bookkeeping */
/* The chain hash of a block: splitmix64 steps over the parent's hash and each token id (a
 * 64-bit hash; a hit is confirmed against the stored tokens and parent hash, so a collision
 * can only cost a miss, never wrong K/V). */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t block_hash(uint64_t parent, const int32_t *t, int64_t n) {
    uint64_t h = mix64(parent ^ 0x6D6D632D6B762D31ull);
    for (int64_t i = 0; i < n; i++) h = mix64(h ^ (uint32_t)t[i]);
    return h;
}

/* What a block's tokens do not say: the content hashes of the media its placeholder tokens
 * stand for (vLLM's mm_hash; 0 for text positions), folded into one value. It enters the
 * chain hash and is stored and compared on a hit like the tokens, so two images behind the
 * same placeholder ids never share K/V. */
static uint64_t block_media(const uint64_t *mm, int64_t n) {
    if (!mm) return 0;
    uint64_t h = 0;
    for (int64_t i = 0; i < n; i++)
        if (mm[i]) h = mix64(h ^ mix64(mm[i] + (uint64_t)i));
    return h;
}

static uint64_t block_key(uint64_t parent, const int32_t *t, uint64_t media, int64_t n) {
    uint64_t h = block_hash(parent, t, n);
    return media ? mix64(h ^ media) : h;
}

static void lru_unlink(mmc_kv_pool *p, int32_t b) {
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->n_lru--;
}

static void lru_push(mmc_kv_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

static void table_remove(mmc_kv_pool *p, int32_t b) {
    int32_t *at = &p->bucket[p->hash[b] & (uint64_t)(p->n_bucket - 1)];
    while (*at >= 0 && *at != b) at = &p->hnext[*at];
    if (*at == b) *at = p->hnext[b];
    p->cached[b] = 0;
}

static int32_t table_find(const mmc_kv_pool *p, uint64_t h, uint64_t parent, uint64_t media, const int32_t *t) {
    for (int32_t b = p->bucket[h & (uint64_t)(p->n_bucket - 1)]; b >= 0; b = p->hnext[b])
        if (p->hash[b] == h && p->parent[b] == parent && p->media[b] == media &&
            !memcmp(p->toks + (int64_t)b * p->block_size, t, (size_t)p->block_size * sizeof *t))
            return b;
    return -1;
}

/* take a block for a sequence: an empty one, else the least recently released cached one */
static int32_t block_take(mmc_kv_pool *p) {
    int32_t b;
    if (p->n_empty > 0) b = p->free_ids[--p->n_empty];
    else {
        b = p->lru_head;
        lru_unlink(p, b);
        table_remove(p, b);
        p->prefix_evictions++;
    }
    p->n_free--;
    p->ref[b] = 1;
    return b;
}

static void block_drop(mmc_kv_pool *p, int32_t b) {
    if (--p->ref[b] > 0) return;
    if (p->cached[b] && p->prefix_cache) lru_push(p, b);
    else {
        if (p->cached[b]) table_remove(p, b);
        p->free_ids[p->n_empty++] = b;
    }
    p->n_free++;
}

static bool table_grow(mmc_kv_seq *s, int64_t need) {
    if (s->n_blocks + need <= s->cap) return true;
    int64_t cap = (s->n_blocks + need) * 2;
    int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
    if (!b) return false;
    s->blocks = b;
    s->cap = cap;
    return true;
}

bool mmc_kv_seq_reserve(mmc_kv_pool *p, mmc_kv_seq *s, int64_t n) {
    int64_t need = mmc_kv_pool_blocks_for(p, n) - s->n_blocks;
    if (need <= 0) return true;
    if (need > p->n_free) return false;
    if (!table_grow(s, need)) return false;
    while (need-- > 0) s->blocks[s->n_blocks++] = block_take(p);
    return true;
}

void mmc_kv_seq_release(mmc_kv_pool *p, mmc_kv_seq *s) {
    /* the last blocks first: a prefix's tail is evicted before its head (which more prompts share) */
    while (s->n_blocks > 0) block_drop(p, s->blocks[--s->n_blocks]);
    s->len = 0;
}

void mmc_kv_seq_free(mmc_kv_pool *p, mmc_kv_seq *s) {
    mmc_kv_seq_release(p, s);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

static int64_t prefix_walk(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_prefix_key *key, const int32_t *ids,
                           int64_t n) {
    if (!p->prefix_cache || n <= 1) return 0;
    const int64_t bs = p->block_size, full = (n - 1) / bs;   /* at least one token left to compute */
    if (s && !table_grow(s, full)) return 0;
    uint64_t h = key ? key->seed : 0;
    const uint64_t *mm = key ? key->media : NULL;
    int64_t i = 0;
    for (; i < full; i++) {
        uint64_t md = block_media(mm ? mm + i * bs : NULL, bs), hi = block_key(h, ids + i * bs, md, bs);
        int32_t b = table_find(p, hi, h, md, ids + i * bs);
        if (b < 0) break;
        if (s) {
            if (p->ref[b]++ == 0) { lru_unlink(p, b); p->n_free--; }
            s->blocks[s->n_blocks++] = b;
        }
        h = hi;
    }
    if (s) {
        p->prefix_queries += full;
        p->prefix_hits += i;
        s->len = i * bs;
    }
    return i * bs;
}

int64_t mmc_kv_prefix_lookup(mmc_kv_pool *p, const mmc_kv_prefix_key *key, const int32_t *ids, int64_t n) {
    return prefix_walk(p, NULL, key, ids, n);
}

int64_t mmc_kv_seq_match_prefix(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_prefix_key *key, const int32_t *ids,
                                int64_t n) {
    if (s->n_blocks || s->len) return 0;
    return prefix_walk(p, s, key, ids, n);
}

void mmc_kv_seq_cache_prefix(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_prefix_key *key, const int32_t *ids,
                             int64_t n) {
    if (!p->prefix_cache) return;
    const int64_t bs = p->block_size;
    if (n > s->len) n = s->len;
    uint64_t h = key ? key->seed : 0;
    const uint64_t *mm = key ? key->media : NULL;
    for (int64_t i = 0; i < n / bs; i++) {
        const int32_t *t = ids + i * bs;
        uint64_t md = block_media(mm ? mm + i * bs : NULL, bs), hi = block_key(h, t, md, bs);
        int32_t b = s->blocks[i];
        if (!p->cached[b] && table_find(p, hi, h, md, t) < 0) {
            p->hash[b] = hi;
            p->parent[b] = h;
            p->media[b] = md;
            memcpy(p->toks + (int64_t)b * bs, t, (size_t)bs * sizeof *t);
            int32_t *head = &p->bucket[hi & (uint64_t)(p->n_bucket - 1)];
            p->hnext[b] = *head;
            *head = b;
            p->cached[b] = 1;
        }
        h = hi;
    }
}

float *mmc_kv_seq_at(const mmc_kv_pool *p, const mmc_kv_seq *s, int layer, bool value, int64_t pos) {
    const int64_t row = p->kv_heads * p->head_dim;
    int64_t blk = s->blocks[pos / p->block_size], off = pos % p->block_size;
    return (value ? p->v : p->k)[layer] + (blk * p->block_size + off) * row;
}

mmc_status mmc_kv_seq_import(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_cache *kv) {
    return mmc_kv_seq_import_range(p, s, kv, 0, kv->len);
}

static mmc_status check_fit(const mmc_kv_pool *p, const mmc_kv_cache *kv) {
    if (kv->batch != 1 || kv->kv_heads != p->kv_heads || kv->head_dim != p->head_dim || kv->n_layers != p->n_layers)
        return mmc_error(MMC_ERR_SHAPE, "KV import: a cache of batch %lld, %d layers, %lld x %lld heads does not fit "
                         "the pool's %d layers, %lld x %lld", (long long)kv->batch, kv->n_layers,
                         (long long)kv->kv_heads, (long long)kv->head_dim, p->n_layers, (long long)p->kv_heads,
                         (long long)p->head_dim);
    return MMC_OK;
}

mmc_status mmc_kv_seq_append(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_cache *kv, int64_t from, int64_t n) {
    mmc_status st = check_fit(p, kv);
    if (st) return st;
    if (from < 0 || n < 0 || from + n > kv->len)
        return mmc_error(MMC_ERR_INVALID, "KV import: positions [%lld, %lld) outside the cache's %lld",
                         (long long)from, (long long)(from + n), (long long)kv->len);
    if (!mmc_kv_seq_reserve(p, s, s->len + n))
        return mmc_error(MMC_ERR_OOM, "KV pool: %lld positions need %lld blocks, %lld free", (long long)(s->len + n),
                         (long long)(mmc_kv_pool_blocks_for(p, s->len + n) - s->n_blocks), (long long)p->n_free);
    const int64_t row = p->kv_heads * p->head_dim, bs = p->block_size;
    for (int l = 0; l < p->n_layers; l++)
        for (int w = 0; w < 2; w++) {
            const float *src = (const float *)(w ? kv->v : kv->k)[l]->data + from * row;   /* [1, cap, Hkv, D] */
            for (int64_t t0 = 0; t0 < n;) {   /* runs within one destination block */
                int64_t pos = s->len + t0, c = bs - pos % bs;
                if (c > n - t0) c = n - t0;
                memcpy(mmc_kv_seq_at(p, s, l, w, pos), src + t0 * row, (size_t)(c * row) * sizeof(float));
                t0 += c;
            }
        }
    s->len += n;
    return MMC_OK;
}

mmc_status mmc_kv_seq_import_range(mmc_kv_pool *p, mmc_kv_seq *s, const mmc_kv_cache *kv, int64_t from, int64_t n) {
    s->len = 0;
    return mmc_kv_seq_append(p, s, kv, from, n);
}

mmc_status mmc_kv_seq_export(const mmc_kv_pool *p, const mmc_kv_seq *s, mmc_kv_cache *kv, int64_t extra) {
    mmc_status st = mmc_kv_cache_init(kv, p->n_layers, 1, p->kv_heads, p->head_dim, s->len + extra);
    if (st) return st;
    const int64_t row = p->kv_heads * p->head_dim, bs = p->block_size;
    for (int l = 0; l < p->n_layers; l++)
        for (int w = 0; w < 2; w++) {
            float *dst = (float *)(w ? kv->v : kv->k)[l]->data;   /* [1, cap, Hkv, D] */
            for (int64_t t0 = 0; t0 < s->len; t0 += bs) {
                int64_t c = s->len - t0 < bs ? s->len - t0 : bs;
                memcpy(dst + t0 * row, mmc_kv_seq_at(p, s, l, w, t0), (size_t)(c * row) * sizeof(float));
            }
        }
    kv->len = s->len;
    return MMC_OK;
}

void mmc_kv_paged_attention(const mmc_kv_pool *p, int layer, mmc_kv_seq *const *seqs, int64_t B, int64_t Hq,
                            const float *q, float *out, float scale) {
    const int64_t D = p->head_dim, Hkv = p->kv_heads, G = Hq / Hkv, bs = p->block_size, row = Hkv * D;
    if (scale == 0) scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const mmc_kv_seq *s = seqs[b];
            const int64_t S = s->len, kh = h / G;
            const float *qv = q + (b * Hq + h) * D;
            float *o = out + (b * Hq + h) * D;
            float *sc = malloc((size_t)(S > 0 ? S : 1) * sizeof *sc);
            if (!sc) continue;
            float mx = -INFINITY;
            for (int64_t t = 0; t < S; t++) {
                const float *kv = p->k[layer] + (s->blocks[t / bs] * bs + t % bs) * row + kh * D;
                float d = 0;
                for (int64_t i = 0; i < D; i++) d += qv[i] * kv[i];
                sc[t] = d * scale;
                if (sc[t] > mx) mx = sc[t];
            }
            float sum = 0;
            for (int64_t t = 0; t < S; t++) { sc[t] = expf(sc[t] - mx); sum += sc[t]; }
            for (int64_t i = 0; i < D; i++) o[i] = 0;
            for (int64_t t = 0; t < S; t++) {
                const float *vv = p->v[layer] + (s->blocks[t / bs] * bs + t % bs) * row + kh * D;
                const float w = sc[t] / sum;
                for (int64_t i = 0; i < D; i++) o[i] += w * vv[i];
            }
            free(sc);
        }
}

/* ------------------------------------------------------------------ batched decode
 * The text model's decode step (qwen2.c's layer: rmsnorm, q/k/v, RoPE, attention, o_proj,
 * residual, rmsnorm, SwiGLU MLP, residual; final norm and lm_head) for B sequences at once:
 * every linear sees the [B, C] rows of all sequences (one GEMM per weight instead of B
 * matrix-vector products), only attention runs per sequence, through its block table. Built
 * from the same public ops as qwen2.c, so adapters (mmc_nn_linear) apply as in generate. */
/* ------------------------------------------------------------------ batched decode linears
 * A decode step's linears have few rows (one per running sequence). One GEMM over all of them
 * takes the GEMM's packed path past its matvec limit (gemm.h: M > 4), which widens (bf16) and
 * transposes every weight into panels on every call: for B = 16 rows on bf16 weights that
 * packing was 44 % of the serving step (perf, 16 clients, bench_serve's model), and the packed
 * GEMM cost 2-3x the CPU time of the matvec path for the same rows (gate_proj 8960 x 1536,
 * 1 thread: 18.3 ms packed, 5.3 ms as four 4-row matvec calls). So up to decode_mv_rows rows,
 * the linear runs as one matvec-path GEMM per group of 4 rows, each reading the weight as
 * stored (bf16 widened in registers), never packed. Each output is then the matvec path's sum
 * for its row alone (the same k order whatever B), so a batched decode computes exactly what a
 * single stream does. (Slicing the weight's rows per thread and running every group on a
 * slice, to read it once a step, measured slower: the matvec kernel wants long streams.)
 * Quantised weights (--quantize int8 / nf4) the same way: up to the row limit (64) each group of
 * 4 rows runs the direct quantised matvec (qmatvec.c) that a single stream runs, instead of
 * mmc_nn_linear's path for more than 4 rows, which dequantises 256 weight rows at a time into an
 * f32 panel and runs the packed GEMM on it (int8, 16 rows, bench_serve_step: 13.5 ms of CPU per
 * token vs 16.4 for a single stream — batching gained 1.2x; the matvec groups: see README).
 * MMC_DECODE_MV_ROWS=N sets the row limit (0: one GEMM per linear, as before). */
#define DECODE_MV_GROUP 4
static int64_t decode_mv_rows(const mmc_tensor *w) {
    static int env = -2;
    if (env == -2) {
        const char *v = getenv("MMC_DECODE_MV_ROWS");
        env = v && *v ? atoi(v) : -1;
    }
    if (env >= 0) return env;
    /* measured (one decode step of bench_serve's bf16 / f32 model, Qwen2-VL-2B's LM shapes x 2
     * layers, 1 thread, CPU time): bf16 weights 2.9x less at 16 rows and 1.8x at 32; f32 ones
     * (packing only transposes) 2x at 8 rows, even at 16, 1.4x more at 32. Under --bf16-matmul
     * the packed GEMM multiplies bf16 on AMX / vdpbf16ps and costs about the same from 8 to 32
     * rows (58.7 ms at 16, 60.8 at 32 vs 41.2 and 74.3 ms here): the matvec path up to 16. */
    if (!w) return 64;   /* quantised: the direct matvec, nothing packed either way */
    if (w->dtype != MMC_BF16) return 16;
    mmc_gemm_info g;
    mmc_gemm_describe(&g);
    return g.bf16_dot ? 16 : 64;
}

/* A quantised linear (l->q8 int8, l->q NF4) over B rows as groups of up to 4 rows through the
 * direct matvec, then the bias added, as mmc_q8_linear / mmc_nf4_linear compute one group (each row's
 * dot product does not depend on the others in its group): every row is what it gets alone. NULL
 * when the weight is not one the matvec reads (the caller falls back to mmc_nn_linear). */
static mmc_tensor *decode_linear_quant(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l, int64_t B) {
    const int64_t K = l->in_features, N = l->out_features;
    const mmc_q8 *q8 = l->q8;
    const mmc_nf4 *q4 = q8 ? NULL : l->q;
    if ((q8 && (q8->rows != N || q8->cols != K)) || (q4 && (q4->rows != N || q4->cols != K || !mmc_qmv_nf4_ok(q4))) ||
        (l->b && (!mmc_is_contiguous(l->b) || l->b->dtype != MMC_F32)) || x->dtype != MMC_F32)
        return NULL;
    const float *xd = mmc_contiguous(ctx, x)->data;                                      /* [B, K] */
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, N));
    float *yd = y->data;
    for (int64_t g = 0; g < B; g += MMC_QMV_MAX_M) {
        const int64_t m = B - g < MMC_QMV_MAX_M ? B - g : MMC_QMV_MAX_M;
        if (q8) mmc_qmv_int8(m, N, K, xd + g * K, q8->q, q8->scale, yd + g * N);
        else mmc_qmv_nf4(m, xd + g * K, q4, yd + g * N);
    }
    if (l->b) {
        const float *bd = l->b->data;
        for (int64_t r = 0; r < B; r++)
            for (int64_t j = 0; j < N; j++) yd[r * N + j] += bd[j];
    }
    return y;
}

/* MMC_DECODE_MV_ONCE=0: the groups of 4 rows each through the GEMM's matvec path (W read once
 * per group), as before matvec.c; the results are the same bits either way. */
static bool mv_rows_once(void) {
    static int env = -1;
    if (env < 0) {
        const char *v = getenv("MMC_DECODE_MV_ONCE");
        env = v && *v ? atoi(v) != 0 : 1;
    }
    return env;
}

static mmc_tensor *decode_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l, int64_t B) {
    const mmc_tensor *w = l->w;
    const int64_t K = l->in_features, N = l->out_features;
    if ((l->q8 || l->q) && !l->lora && !mmc_grad_enabled(ctx) && B > MMC_QMV_MAX_M && B <= decode_mv_rows(NULL)) {
        mmc_tensor *y = decode_linear_quant(ctx, x, l, B);
        if (y) return y;
    }
    if (!w || l->q || l->q8 || l->lora || B <= DECODE_MV_GROUP || B > decode_mv_rows(w) ||
        (w->dtype != MMC_BF16 && w->dtype != MMC_F32) || !mmc_is_contiguous(w) ||
        (l->b && (!mmc_is_contiguous(l->b) || (l->b->dtype != MMC_BF16 && l->b->dtype != MMC_F32))) ||
        mmc_grad_enabled(ctx) || w->shape[0] != N || w->shape[1] != K)
        return mmc_nn_linear(ctx, x, l);
    const float *xd = mmc_contiguous(ctx, x)->data;                                      /* [B, K] */
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, N));
    float *yd = y->data;
    if (l->b) {   /* the bias first, then the GEMM adds to it (beta 1), as mmc_linear does */
        for (int64_t j = 0; j < N; j++)
            yd[j] = l->b->dtype == MMC_BF16 ? mmc_bf16_to_f32(((const uint16_t *)l->b->data)[j]) : ((const float *)l->b->data)[j];
        for (int64_t r = 1; r < B; r++) memcpy(yd + r * N, yd, (size_t)N * sizeof *yd);
    }
    const float beta = l->b ? 1.0f : 0.0f;
    if (mv_rows_once() && mmc_matvec_rows_ok() && B <= MMC_MV_ROWS_MAX) {   /* W read once for all B rows */
        mmc_matvec_rows(B, N, K, xd, w->data, w->dtype == MMC_BF16, beta, yd);
        return y;
    }
    for (int64_t g = 0; g < B; g += DECODE_MV_GROUP) {   /* each call: the matvec path, threads over N */
        const int64_t m = B - g < DECODE_MV_GROUP ? B - g : DECODE_MV_GROUP;
        if (w->dtype == MMC_BF16)
            mmc_gemm_bf16_infer(false, true, m, N, K, 1.0f, xd + g * K, K, w->data, K, beta, yd + g * N, N);
        else
            mmc_gemm_f32(false, true, m, N, K, 1.0f, xd + g * K, K, w->data, K, beta, yd + g * N, N);
    }
    return y;
}

/* x [B, 1, K] through l, then each adapter's delta on its own rows (mmc_lora_rows); the same
 * arithmetic as mmc_nn_linear with that adapter attached: y + scale · (x Aᵀ) Bᵀ */
static mmc_tensor *linear_rows(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l, const mmc_lora_rows *lr,
                               int64_t B) {
    mmc_tensor *y = decode_linear(ctx, x, l, B);
    if (!lr) return y;
    y = mmc_contiguous(ctx, y);
    const int64_t K = l->in_features, N = l->out_features;
    mmc_tensor *x2 = NULL;
    int64_t *rows = NULL;
    for (int g = 0; g < lr->n; g++) {
        const mmc_lora_set *s = lr->sets[g];
        const mmc_lora *a = NULL;
        for (int i = 0; i < s->n && !a; i++)
            if (s->mods[i] == l) a = &s->adapters[i];
        if (!a) continue;
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++) n += lr->row[b] == g + 1;
        if (n == 0) continue;
        if (!x2) {
            x2 = mmc_reshape(ctx, mmc_contiguous(ctx, x), 2, MMC_SHAPE(B, K));
            rows = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *rows * (size_t)B);
        }
        mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n));
        for (int64_t b = 0, k = 0; b < B; b++)
            if (lr->row[b] == g + 1) { ((int64_t *)idx->data)[k] = b; rows[k++] = b; }
        mmc_tensor *h = mmc_linear(ctx, mmc_gather_rows(ctx, x2, idx), a->A, NULL);   /* [n, r] */
        const float *d = mmc_contiguous(ctx, mmc_linear(ctx, h, a->B, NULL))->data;    /* [n, N] */
        float *yd = y->data;
        for (int64_t k = 0; k < n; k++)
            for (int64_t j = 0; j < N; j++) yd[rows[k] * N + j] += a->scale * d[k * N + j];
    }
    return y;
}

mmc_status mmc_qwen2_decode_batch(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *tokens, const int64_t *rope_pos,
                                  int64_t B, mmc_kv_pool *pool, mmc_kv_seq *const *seqs, float **logits) {
    return mmc_qwen2_decode_batch_lora(ctx, m, tokens, rope_pos, B, pool, seqs, NULL, logits);
}

mmc_status mmc_qwen2_decode_batch_lora(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *tokens, const int64_t *rope_pos,
                                       int64_t B, mmc_kv_pool *pool, mmc_kv_seq *const *seqs,
                                       const mmc_lora_rows *lr, float **logits) {
    const mmc_qwen2_config *c = &m->cfg;
    if (m->tp) return mmc_error(MMC_ERR_INVALID, "batched decode does not run tensor-parallel models");
    if (B <= 0) return mmc_error(MMC_ERR_INVALID, "batched decode of %lld sequences", (long long)B);
    const int64_t D = c->head_dim, C = c->hidden_size, Hq = m->layers[0].q.out_features / D,
                  Hkv = m->layers[0].k.out_features / D;
    if (Hkv != pool->kv_heads || D != pool->head_dim || c->num_layers != pool->n_layers)
        return mmc_error(MMC_ERR_SHAPE, "batched decode: the KV pool (%d layers, %lld x %lld) does not match the "
                         "model (%lld layers, %lld KV heads x %lld)", pool->n_layers, (long long)pool->kv_heads,
                         (long long)pool->head_dim, (long long)c->num_layers, (long long)Hkv, (long long)D);
    for (int64_t b = 0; b < B; b++) {
        if (tokens[b] < 0 || tokens[b] >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "batched decode: token %d outside the vocabulary [0, %lld)", tokens[b],
                             (long long)c->vocab_size);
        if (mmc_kv_pool_blocks_for(pool, seqs[b]->len + 1) > seqs[b]->n_blocks)
            return mmc_error(MMC_ERR_INVALID, "batched decode: sequence %lld has no block reserved for position %lld",
                             (long long)b, (long long)seqs[b]->len);
    }
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, 1));
    memcpy(ids->data, tokens, (size_t)B * sizeof(int32_t));
    /* RoPE tables [B, 1, D], each row at its own position */
    mmc_tensor *cos, *sin;
    if (c->mrope) {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, 1));
        for (int a = 0; a < 3; a++)
            for (int64_t b = 0; b < B; b++) ((int64_t *)pos->data)[a * B + b] = rope_pos[b];
        mmc_rope_table_mrope(ctx, pos, c->mrope_section, (int)D, c->rope_theta, &cos, &sin);
    } else if (c->rope_kind == MMC_ROPE_DYNAMIC && B > 1) {
        /* the NTK base depends on each sequence's own length: one table per row */
        cos = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, D));
        sin = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, D));
        for (int64_t b = 0; b < B; b++) {
            mmc_tensor *pos = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(1, 1)), *cb, *sb;
            ((int64_t *)pos->data)[0] = rope_pos[b];
            mmc_qwen2_rope_table(ctx, c, pos, &cb, &sb);
            memcpy((float *)cos->data + b * D, mmc_contiguous(ctx, cb)->data, (size_t)D * sizeof(float));
            memcpy((float *)sin->data + b * D, mmc_contiguous(ctx, sb)->data, (size_t)D * sizeof(float));
        }
    } else {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(B, 1));
        memcpy(pos->data, rope_pos, (size_t)B * sizeof(int64_t));
        mmc_qwen2_rope_table(ctx, c, pos, &cos, &sin);
    }
    mmc_arena *ar = mmc_ctx_arena(ctx);
    /* the residual stream [B, 1, C], ours to update in place */
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, C));
    memcpy(x->data, mmc_contiguous(ctx, mmc_qwen2_embed(ctx, m, ids))->data, mmc_nbytes(x));
    mmc_tensor *att = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, Hq * D));
    const float eps = (float)c->rms_norm_eps;
    for (int l = 0; l < c->num_layers; l++) {
        mmc_qwen2_layer *L = &m->layers[l];
        mmc_arena_mark mk = mmc_arena_get_mark(ar);
        mmc_tensor *h = mmc_rmsnorm(ctx, x, L->input_norm, eps);                              /* [B, 1, C] */
        mmc_tensor *q = mmc_reshape(ctx, linear_rows(ctx, h, &L->q, lr, B), 4, MMC_SHAPE(B, 1, Hq, D));
        mmc_tensor *k = mmc_reshape(ctx, linear_rows(ctx, h, &L->k, lr, B), 4, MMC_SHAPE(B, 1, Hkv, D));
        mmc_tensor *v = mmc_contiguous(ctx, linear_rows(ctx, h, &L->v, lr, B));                    /* [B, 1, Hkv*D] */
        q = mmc_contiguous(ctx, mmc_rope(ctx, q, cos, sin));                                  /* [B, 1, Hq, D] */
        k = mmc_contiguous(ctx, mmc_rope(ctx, k, cos, sin));                                  /* [B, 1, Hkv, D] */
        for (int64_t b = 0; b < B; b++) {   /* this token's K/V at the end of each sequence */
            memcpy(mmc_kv_seq_at(pool, seqs[b], l, false, seqs[b]->len), (float *)k->data + b * Hkv * D,
                   (size_t)(Hkv * D) * sizeof(float));
            memcpy(mmc_kv_seq_at(pool, seqs[b], l, true, seqs[b]->len), (float *)v->data + b * Hkv * D,
                   (size_t)(Hkv * D) * sizeof(float));
            seqs[b]->len++;
        }
        mmc_kv_paged_attention(pool, l, seqs, B, Hq, q->data, att->data, 0);
        for (int64_t b = 0; b < B; b++) seqs[b]->len--;   /* grows once, after the last layer */
        mmc_infer_residual_add(ctx, x->data, linear_rows(ctx, att, &L->o, lr, B));
        mmc_arena_release(ar, mk);
        h = mmc_rmsnorm(ctx, x, L->post_norm, eps);
        mmc_infer_residual_add(ctx, x->data, linear_rows(ctx, mmc_swiglu(ctx, linear_rows(ctx, h, &L->gate, lr, B),
                                                                         linear_rows(ctx, h, &L->up, lr, B)),
                                                           &L->down, lr, B));
        mmc_arena_release(ar, mk);
    }
    for (int64_t b = 0; b < B; b++) seqs[b]->len++;
    mmc_tensor *hn = mmc_rmsnorm(ctx, x, m->norm, eps);                                       /* [B, 1, C] */
    const mmc_linear_w head = {.w = m->lm_head, .out_features = c->vocab_size, .in_features = C};
    *logits = mmc_contiguous(ctx, m->tp ? mmc_qwen2_logits(ctx, m, hn) : decode_linear(ctx, hn, &head, B))->data;
    return MMC_OK;                                                                            /* [B, 1, V] */
}

/* ------------------------------------------------------------------ chunked prefill
 * A chunk of text tokens at the end of a contiguous cache (qwen2.c's decoder feed, with the
 * M-RoPE table of equal axes for Qwen2-VL's LM, as its text-only prefill builds it). */
mmc_status mmc_qwen2_prefill_chunk(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                   float **logits) {
    return mmc_qwen2_prefill_chunk_at(ctx, m, ids, n, kv, 0, logits);
}

mmc_status mmc_qwen2_prefill_chunk_at(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                      int64_t rope_delta, float **logits) {
    const mmc_qwen2_config *c = &m->cfg;
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "chunked prefill: an empty chunk");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "chunked prefill: token %d outside the vocabulary [0, %lld)", ids[i],
                             (long long)c->vocab_size);
    mmc_tensor *idt = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, n));
    memcpy(idt->data, ids, (size_t)n * sizeof(int32_t));
    mmc_tensor *cos, *sin;
    if (c->mrope) {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, 1, n));
        for (int a = 0; a < 3; a++)
            for (int64_t t = 0; t < n; t++) ((int64_t *)pos->data)[a * n + t] = kv->len + t + rope_delta;
        mmc_rope_table_mrope(ctx, pos, c->mrope_section, (int)c->head_dim, c->rope_theta, &cos, &sin);
    } else {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n));
        for (int64_t t = 0; t < n; t++) ((int64_t *)pos->data)[t] = kv->len + t + rope_delta;
        mmc_qwen2_rope_table(ctx, c, pos, &cos, &sin);
    }
    return mmc_qwen2_prefill_embeds(ctx, m, mmc_qwen2_embed(ctx, m, idt), cos, sin, kv, logits);
}

mmc_status mmc_qwen2_prefill_embeds(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *embeds, mmc_tensor *cos, mmc_tensor *sin,
                                    mmc_kv_cache *kv, float **logits) {
    const int64_t n = embeds->shape[1];
    if (embeds->ndim != 3 || embeds->shape[0] != 1 || n <= 0 || embeds->shape[2] != m->cfg.hidden_size)
        return mmc_error(MMC_ERR_SHAPE, "chunked prefill: embeddings must be [1, n, %lld]", (long long)m->cfg.hidden_size);
    mmc_status st = mmc_kv_cache_reserve(kv, kv->len + n);
    if (st) return st;
    mmc_attn_opts attn = {.causal = true};
    mmc_tensor *h = mmc_qwen2_forward(ctx, m, embeds, cos, sin, &attn, kv);                      /* [1, n, C] */
    mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, n - 1, 1));                     /* [1, 1, C] */
    *logits = mmc_contiguous(ctx, mmc_qwen2_logits(ctx, m, last))->data;                          /* [1, 1, V] */
    return MMC_OK;
}

/* ------------------------------------------------------------------ packed prefill
 * Several text prompts in one forward: packed into one row [1, sum n, C] with block-diagonal
 * causal attention (cu_seqlens) and positions restarting at 0 per prompt, so each prompt sees
 * only itself, as alone; one pass over the weights for all of them. The K/V of each prompt's
 * span go to its own blocks. */
mmc_status mmc_qwen2_prefill_packed(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *const *ids, const int64_t *n,
                                    int64_t N, mmc_kv_pool *pool, mmc_kv_seq *const *seqs, float **logits) {
    const mmc_qwen2_config *c = &m->cfg;
    if (m->tp) return mmc_error(MMC_ERR_INVALID, "packed prefill does not run tensor-parallel models");
    if (c->rope_kind == MMC_ROPE_DYNAMIC)
        return mmc_error(MMC_ERR_UNSUPPORTED, "packed prefill: dynamic NTK RoPE depends on each prompt's length");
    int64_t T = 0, need = 0;
    for (int64_t i = 0; i < N; i++) {
        if (n[i] <= 0) return mmc_error(MMC_ERR_INVALID, "packed prefill: an empty prompt");
        T += n[i];
        need += mmc_kv_pool_blocks_for(pool, n[i]) - seqs[i]->n_blocks;
    }
    if (need > pool->n_free)
        return mmc_error(MMC_ERR_OOM, "KV pool: %lld blocks needed, %lld free", (long long)need, (long long)pool->n_free);
    mmc_tensor *idt = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, T));
    mmc_tensor *pos = c->mrope ? mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, 1, T)) : mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    int32_t *cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(N + 1));
    cu[0] = 0;
    for (int64_t i = 0, t = 0; i < N; i++) {
        memcpy((int32_t *)idt->data + t, ids[i], (size_t)n[i] * sizeof(int32_t));
        for (int64_t k = 0; k < n[i]; k++)
            for (int a = 0; a < (c->mrope ? 3 : 1); a++) ((int64_t *)pos->data)[a * T + t + k] = k;
        t += n[i];
        cu[i + 1] = (int32_t)t;
    }
    mmc_tensor *cos, *sin;
    if (c->mrope) mmc_rope_table_mrope(ctx, pos, c->mrope_section, (int)c->head_dim, c->rope_theta, &cos, &sin);
    else mmc_qwen2_rope_table(ctx, c, pos, &cos, &sin);
    mmc_kv_cache kv;
    mmc_status st = mmc_kv_cache_init(&kv, (int)c->num_layers, 1, pool->kv_heads, pool->head_dim, T);
    if (st) return st;
    mmc_attn_opts attn = {.causal = true, .cu_seqlens = cu, .n_seqs = (int)N};
    mmc_tensor *h = mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, idt), cos, sin, &attn, &kv);   /* [1, T, C] */
    mmc_tensor *last = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(N));
    for (int64_t i = 0; i < N; i++) ((int64_t *)last->data)[i] = cu[i + 1] - 1;
    mmc_tensor *hl = mmc_gather_rows(ctx, mmc_reshape(ctx, h, 2, MMC_SHAPE(T, c->hidden_size)), last); /* [N, C] */
    *logits = mmc_contiguous(ctx, mmc_qwen2_logits(ctx, m, hl))->data;                                 /* [N, V] */
    for (int64_t i = 0; i < N && !st; i++) st = mmc_kv_seq_import_range(pool, seqs[i], &kv, cu[i], n[i]);
    mmc_kv_cache_free(&kv);
    return st;
}
