/* cp.c — context parallelism, DeepSpeed-Ulysses style (mmc_cp.h; ring attention is cp_ring.c), after DeepSpeed's
 * sequence/layer.py (_SeqAllToAll, DistributedAttention): the two all-to-all re-shardings
 * between sequence shards [B, T/C, H, D] and head shards [B, T, H/C, D] as autograd ops (each
 * the other's backward), the Qwen2 validation and hook, and the causal-LM loss of one rank's
 * share of a micro-batch (labels shifted on the whole row, then sliced: a contiguous shard for
 * Ulysses, the zigzag one for ring attention). A communicator failure
 * inside an op is fatal, as in tp.c: half-exchanged activations cannot be recovered. */
#include "mmc_cp.h"
#include "mmc_trainer.h"
#include "mmc_vl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cp_ok(mmc_status st, const char *what) {
    MMC_CHECK(st == MMC_OK, "context parallel %s: %s", what, mmc_last_error());
}

/* ------------------------------------------------------------------ raw re-sharding
 * Send/receive blocks are [B, Tl, Hc, D] (Tl = T/C, Hc = H/C), block j of the send buffer for
 * rank j. seq -> head: block j = our tokens, heads [j Hc, (j+1) Hc); the block received from
 * rank i is tokens [i Tl, (i+1) Tl) of our heads. head -> seq is the exact inverse. */
static mmc_status s2h(mmc_comm *cp, const float *x, float *y, int64_t B, int64_t Tl, int64_t H, int64_t D,
                      float *buf) {
    const int C = mmc_comm_size(cp);
    const int64_t Hc = H / C, blk = B * Tl * Hc * D, T = Tl * C;
    float *send = buf, *recv = buf + blk * C;
    for (int j = 0; j < C; j++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < Tl; t++)
                memcpy(send + j * blk + (b * Tl + t) * Hc * D, x + ((b * Tl + t) * H + j * Hc) * D,
                       (size_t)(Hc * D) * sizeof(float));
    mmc_status st = mmc_all_to_all(cp, send, recv, blk, MMC_F32);
    if (st) return st;
    for (int i = 0; i < C; i++)
        for (int64_t b = 0; b < B; b++)
            memcpy(y + (b * T + i * Tl) * Hc * D, recv + i * blk + b * Tl * Hc * D, (size_t)(Tl * Hc * D) * sizeof(float));
    return MMC_OK;
}

static mmc_status h2s(mmc_comm *cp, const float *y, float *x, int64_t B, int64_t Tl, int64_t H, int64_t D,
                      float *buf) {
    const int C = mmc_comm_size(cp);
    const int64_t Hc = H / C, blk = B * Tl * Hc * D, T = Tl * C;
    float *send = buf, *recv = buf + blk * C;
    for (int i = 0; i < C; i++)
        for (int64_t b = 0; b < B; b++)
            memcpy(send + i * blk + b * Tl * Hc * D, y + (b * T + i * Tl) * Hc * D, (size_t)(Tl * Hc * D) * sizeof(float));
    mmc_status st = mmc_all_to_all(cp, send, recv, blk, MMC_F32);
    if (st) return st;
    for (int j = 0; j < C; j++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < Tl; t++)
                memcpy(x + ((b * Tl + t) * H + j * Hc) * D, recv + j * blk + (b * Tl + t) * Hc * D,
                       (size_t)(Hc * D) * sizeof(float));
    return MMC_OK;
}

static mmc_status with_buf(mmc_comm *cp, const float *in, float *out, int64_t B, int64_t Tl, int64_t H, int64_t D,
                           bool to_head) {
    const int C = mmc_comm_size(cp);
    if (H % C) return mmc_error(MMC_ERR_INVALID, "context parallel: %lld heads do not divide over %d ranks",
                                (long long)H, C);
    float *buf = malloc(sizeof(float) * (size_t)(2 * B * Tl * H * D));
    if (!buf) return mmc_error(MMC_ERR_OOM, "out of memory for the context-parallel all-to-all buffers");
    mmc_status st = to_head ? s2h(cp, in, out, B, Tl, H, D, buf) : h2s(cp, in, out, B, Tl, H, D, buf);
    free(buf);
    return st;
}

mmc_status mmc_cp_seq_to_head_raw(mmc_comm *cp, const float *x, float *y, int64_t B, int64_t Tl, int64_t H, int64_t D) {
    return with_buf(cp, x, y, B, Tl, H, D, true);
}

mmc_status mmc_cp_head_to_seq_raw(mmc_comm *cp, const float *y, float *x, int64_t B, int64_t Tl, int64_t H, int64_t D) {
    return with_buf(cp, y, x, B, Tl, H, D, false);
}

/* ------------------------------------------------------------------ autograd ops */
static void acc_into(mmc_ctx *ctx, mmc_tensor *x, const float *dy) {
    float *dx = mmc_grad(ctx, x)->data;
    const int64_t n = mmc_numel(x);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) dx[i] += dy[i];
}

/* n->i: B, Tl, H, D (the sequence-sharded shape) */
static void s2h_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    float *dx = malloc(sizeof(float) * (size_t)mmc_numel(x));
    MMC_CHECK(dx, "context parallel: out of memory in backward");
    cp_ok(mmc_cp_head_to_seq_raw(n->extra, n->out->grad->data, dx, n->i[0], n->i[1], n->i[2], n->i[3]),
          "seq->head backward (all-to-all)");
    acc_into(ctx, x, dx);
    free(dx);
}

static void h2s_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *y = n->in[0];
    if (!mmc_requires_grad(y)) return;
    float *dy = malloc(sizeof(float) * (size_t)mmc_numel(y));
    MMC_CHECK(dy, "context parallel: out of memory in backward");
    cp_ok(mmc_cp_seq_to_head_raw(n->extra, n->out->grad->data, dy, n->i[0], n->i[1], n->i[2], n->i[3]),
          "head->seq backward (all-to-all)");
    acc_into(ctx, y, dy);
    free(dy);
}

mmc_tensor *mmc_cp_seq_to_head(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *x) {
    if (!cp || mmc_comm_size(cp) == 1) return x;
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 4, "mmc_cp_seq_to_head: x must be f32 [B, T/C, H, D]");
    const int C = mmc_comm_size(cp);
    const int64_t B = x->shape[0], Tl = x->shape[1], H = x->shape[2], D = x->shape[3];
    MMC_CHECK(H % C == 0, "mmc_cp_seq_to_head: %lld heads do not divide over %d ranks", (long long)H, C);
    mmc_tensor *xc = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, Tl * C, H / C, D));   /* [B, T, H/C, D] */
    cp_ok(mmc_cp_seq_to_head_raw(cp, xc->data, y->data, B, Tl, H, D), "seq->head (all-to-all)");
    mmc_node *n = mmc_tape_record(ctx, "cp_seq_to_head", s2h_backward, y, 1, &x);
    if (n) { n->extra = cp; n->i[0] = B; n->i[1] = Tl; n->i[2] = H; n->i[3] = D; }
    return y;
}

mmc_tensor *mmc_cp_head_to_seq(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *y) {
    if (!cp || mmc_comm_size(cp) == 1) return y;
    MMC_CHECK(y->dtype == MMC_F32 && y->ndim == 4, "mmc_cp_head_to_seq: y must be f32 [B, T, H/C, D]");
    const int C = mmc_comm_size(cp);
    const int64_t B = y->shape[0], T = y->shape[1], Hc = y->shape[2], D = y->shape[3];
    MMC_CHECK(T % C == 0, "mmc_cp_head_to_seq: T %lld does not divide over %d ranks", (long long)T, C);
    mmc_tensor *yc = mmc_contiguous(ctx, y);
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, T / C, Hc * C, D));   /* [B, T/C, H, D] */
    cp_ok(mmc_cp_head_to_seq_raw(cp, yc->data, x->data, B, T / C, Hc * C, D), "head->seq (all-to-all)");
    mmc_node *n = mmc_tape_record(ctx, "cp_head_to_seq", h2s_backward, x, 1, &y);
    if (n) { n->extra = cp; n->i[0] = B; n->i[1] = T / C; n->i[2] = Hc * C; n->i[3] = D; }
    return x;
}

/* KV heads fewer than the group (GQA, Hkv < C, C % Hkv == 0): each repeated C / Hkv times, so that
 * rank r gets KV head r Hkv / C — the one its query heads [r Hq/C, (r+1) Hq/C) attend with. The
 * repeat is a broadcast multiply by ones, whose backward sums the copies' gradients. */
mmc_tensor *mmc_cp_expand_kv(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *k) {
    const int C = cp ? mmc_comm_size(cp) : 1;
    const int64_t B = k->shape[0], T = k->shape[1], H = k->shape[2], D = k->shape[3];
    if (C <= 1 || H % C == 0) return k;
    MMC_CHECK(C % H == 0, "mmc_cp_expand_kv: %lld KV heads neither divide nor are divided by %d ranks", (long long)H, C);
    const int64_t rep = C / H;
    mmc_tensor *ones = mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(1, 1, 1, rep, 1));
    for (int64_t i = 0; i < rep; i++) ((float *)ones->data)[i] = 1.0f;
    mmc_tensor *e = mmc_mul(ctx, mmc_reshape(ctx, k, 5, MMC_SHAPE(B, T, H, 1, D)), ones);   /* [B, T, H, rep, D] */
    return mmc_reshape(ctx, mmc_contiguous(ctx, e), 4, MMC_SHAPE(B, T, H * rep, D));       /* [B, T, C, D] */
}

/* ------------------------------------------------------------------ Qwen2 */
mmc_status mmc_cp_check_qwen2(const mmc_qwen2_config *c, int C, const char *file) {
    if (C <= 1) return MMC_OK;
    if (c->rope_kind == MMC_ROPE_DYNAMIC)   /* its base follows the batch's largest position, which no rank holds */
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.context_parallel %d with rope_type 'dynamic': dynamic NTK "
                         "scaling sets RoPE's base from the largest position in the batch, which a context-parallel "
                         "rank does not see whole; use context_parallel 1 or a static rope scaling (linear, llama3)",
                         file ? file : "config", C);
    const char *key = NULL;
    int64_t v = 0;
    if (c->num_heads % C) key = "num_attention_heads", v = c->num_heads;
    else if (c->num_kv_heads % C && C % c->num_kv_heads) key = "num_key_value_heads", v = c->num_kv_heads;
    if (!key) return MMC_OK;
    if (key[4] == 'k')
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.context_parallel %d neither divides nor is a multiple of "
                         "num_key_value_heads %lld of the language model: Ulysses attention gives each rank whole KV "
                         "heads (divided among the ranks, or each replicated over C / num_key_value_heads ranks); use "
                         "a context_parallel that divides %d and is a multiple or a divisor of %d, or set "
                         "parallel.context_parallel_mode: ring (no head constraint)",
                         file ? file : "config", C, (long long)v, (int)c->num_heads, (int)c->num_kv_heads);
    return mmc_error(MMC_ERR_INVALID, "%s: parallel.context_parallel %d does not divide num_attention_heads %lld of "
                     "the language model: Ulysses attention gives each rank whole query heads; use a context_parallel "
                     "that divides %d, or set parallel.context_parallel_mode: ring (no head constraint)", file ? file : "config", C, (long long)v, (int)c->num_heads);
}

void mmc_cp_attach_qwen2(mmc_qwen2 *m, mmc_comm *cp) {
    for (int l = 0; l < m->cfg.num_layers; l++) m->layers[l].cp = cp && mmc_comm_size(cp) > 1 ? cp : NULL;
}

void mmc_cp_set_mode_qwen2(mmc_qwen2 *m, mmc_cp_mode mode) {
    for (int l = 0; l < m->cfg.num_layers; l++) m->layers[l].cp_mode = (int)mode;
}

/* This rank's share of a micro-batch's rows: the global index of each of its Tl tokens (ring:
 * the row padded, ignored labels after every real token, to a multiple of 2C, each rank holding
 * the zigzag chunks r and 2C-1-r; Ulysses: the contiguous shard r), and the labels shifted on the
 * whole row first, so that a shard's last token is scored against the next shard's first. */
typedef struct {
    int64_t Tl, *gi;   /* [Tl] global index of each local token (>= T: padding) */
    mmc_tensor *tg;    /* [B*Tl] shifted labels */
    int64_t n;         /* scored tokens of this rank */
} cp_shard;

static cp_shard shard_rows(mmc_ctx *ctx, mmc_qwen2 *m, mmc_comm *cp, const mmc_batch *b) {
    const int C = mmc_comm_size(cp), r = mmc_comm_rank(cp);
    const bool ring = m->cfg.num_layers > 0 && m->layers[0].cp_mode == MMC_CP_RING;
    const int64_t B = b->B, T = b->T;
    const int64_t Tp = ring ? (T + 2 * C - 1) / (2 * C) * (2 * C) : T, Tl = Tp / C;
    MMC_CHECK(Tp % C == 0, "context parallel loss: T %lld is not a multiple of context_parallel %d (pad the batch)",
              (long long)T, C);
    cp_shard s = {.Tl = Tl};
    s.gi = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)Tl);
    for (int64_t t = 0; t < Tl; t++) s.gi[t] = ring ? mmc_cp_ring_pos(r, C, Tl, t) : (int64_t)r * Tl + t;
    s.tg = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(B * Tl));
    int32_t *tgd = s.tg->data;
    for (int64_t i = 0; i < B; i++)
        for (int64_t t = 0; t < Tl; t++) {
            const int64_t g = s.gi[t];
            const int32_t y = g + 1 < T ? b->labels[i * T + g + 1] : MMC_IGNORE_INDEX;
            tgd[i * Tl + t] = y;
            s.n += y != MMC_IGNORE_INDEX;
        }
    return s;
}

/* The decoder on this rank's embeddings x [B, Tl, C] with its rows' RoPE tables -> the summed
 * NLL of its scored tokens times scale. Attention sees the whole sequence (Ulysses: after the
 * exchange; ring: block by block, masked at global positions): the row's (or packed segments')
 * mask as is. */
static mmc_tensor *shard_loss(mmc_ctx *ctx, mmc_qwen2 *m, mmc_comm *cp, const mmc_batch *b, const cp_shard *s,
                              mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin, double scale) {
    const int64_t B = b->B, Tl = s->Tl;
    mmc_attn_opts attn = {.causal = true, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
    if (b->cu_seqlens && (b->n_seqs <= 0 || b->cu_seqlens[b->n_seqs] < b->T)) {
        /* a packed row's padding tail (not a segment) one more block, so that the blocks cover
         * the row as Ulysses' whole-row attention requires (ring: past T, one more again) */
        int n = b->n_seqs > 0 ? b->n_seqs : 0;
        int32_t *cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(n + 2));
        if (n > 0) memcpy(cu, b->cu_seqlens, sizeof(int32_t) * (size_t)(n + 1));
        else cu[0] = 0;
        cu[++n] = (int32_t)b->T;
        attn.cu_seqlens = cu;
        attn.n_seqs = n;
    }
    mmc_cp_attach_qwen2(m, cp);
    x = mmc_qwen2_forward(ctx, m, x, cos, sin, &attn, NULL);                     /* [B, T/C, C] */
    mmc_tensor *logits = mmc_qwen2_logits(ctx, m, x);                            /* [B, T/C, V] */
    const int64_t V = logits->shape[2];
    mmc_tensor *mean = mmc_cross_entropy(ctx, mmc_reshape(ctx, logits, 2, MMC_SHAPE(B * Tl, V)), s->tg,
                                         MMC_IGNORE_INDEX);                       /* [] */
    return mmc_scale(ctx, mean, (float)((double)s->n * scale));
}

mmc_tensor *mmc_cp_qwen2_lm_loss(mmc_ctx *ctx, mmc_qwen2 *m, mmc_comm *cp, const mmc_batch *b, double scale,
                                 int64_t *n_scored) {
    const int64_t B = b->B, T = b->T;
    const cp_shard s = shard_rows(ctx, m, cp, b);
    const int64_t Tl = s.Tl, *gi = s.gi;
    if (n_scored) *n_scored = s.n;
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, Tl));                /* [B, T/C] */
    int32_t *id = ids->data;
    for (int64_t i = 0; i < B; i++)
        for (int64_t t = 0; t < Tl; t++) id[i * Tl + t] = gi[t] < T ? b->input_ids[i * T + gi[t]] : 0;
    mmc_tensor *cos, *sin;
    const int D = (int)m->cfg.head_dim;
    const int np = m->cfg.mrope ? 3 : 1;
    mmc_tensor *pos = np == 3 ? mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, Tl)) : mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(B, Tl));
    int64_t *pd = pos->data;
    for (int k = 0; k < np; k++)   /* each token keeps its global position (packing restarts included) */
        for (int64_t i = 0; i < B; i++)
            for (int64_t t = 0; t < Tl; t++) {
                const int64_t g = gi[t], *src = b->position_ids ? b->position_ids + (k * B + i) * T : NULL;
                pd[(k * B + i) * Tl + t] = g < T ? (src ? src[g] : g) : (src ? src[T - 1] : T - 1) + (g - T + 1);
            }
    if (np == 3) mmc_rope_table_mrope(ctx, pos, m->cfg.mrope_section, D, m->cfg.rope_theta, &cos, &sin);
    else mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);   /* default, or Llama's rope scaling */
    mmc_tensor *x = mmc_qwen2_embed(ctx, m, ids);                                /* [B, T/C, C] */
    return shard_loss(ctx, m, cp, b, &s, x, cos, sin, scale);
}

/* ------------------------------------------------------------------ Qwen2-VL / Qwen2.5-VL
 * The vision tower is replicated over the group: every rank encodes all of the micro-batch's
 * images and videos, scatters the merged features into the whole row's embeddings [B*T, C] and
 * builds the M-RoPE tables from the whole row's 3-D positions (mmc_qwen2_vl_inputs: a
 * placeholder run's (t, h, w) grid may cross a shard boundary, and the text after it continues
 * from its largest position), then keeps its shard's rows of both (gather_rows; a padding token
 * past T takes row T-1's, never scored nor attended to by a real token, so its gradient is 0).
 * Backward: each rank's feature gradient holds its own tokens' rows and zeros elsewhere; the
 * features' op below all-reduces it over the group before the tower's backward, which then sees
 * the whole gradient — each row nonzero on exactly one rank, so the sum is exact — and gives
 * every rank the single process's tower gradients. They are therefore left out of the group's
 * weight-gradient sum (mmc_cp_trainer_reduce). The traffic is the features' [n, C] per
 * micro-batch instead of the tower's weights per step.
 * A per-modality plan (vision_share = the cp group, mmc_hetero.h) shares the images out instead:
 * each rank encodes its share, the features are all-gathered, and the same all-reduced feature
 * gradient gives each rank its share's tower gradients, which the weight-gradient sum then adds. */
static void sum_grad_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    const int64_t cnt = mmc_numel(x);
    float *g = malloc(sizeof(float) * (size_t)(cnt > 0 ? cnt : 1));
    MMC_CHECK(g, "context parallel: out of memory in backward");
    cp_ok(mmc_all_reduce(n->extra, n->out->grad->data, g, cnt, MMC_F32, MMC_SUM), "vision features' gradient (all-reduce)");
    acc_into(ctx, x, g);
    free(g);
}

/* Identity forward; backward sums the gradient over the group (every rank records it: the
 * tower's trainability is the same on all). */
mmc_tensor *mmc_cp_sum_grad(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *x) {
    MMC_CHECK(x->dtype == MMC_F32, "context parallel: the vision features must be f32");
    mmc_tensor *y = mmc_new(ctx, MMC_F32, x->ndim, x->shape);   /* an output of its own for the node */
    memcpy(y->data, mmc_contiguous(ctx, x)->data, mmc_nbytes(y));
    mmc_node *n = mmc_tape_record(ctx, "cp_sum_grad", sum_grad_backward, y, 1, &x);
    if (n) n->extra = cp;
    return y;
}

mmc_status mmc_cp_qwen2_vl_loss(mmc_ctx *ctx, mmc_qwen2_vl *vl, mmc_comm *cp, const mmc_batch *b, double scale,
                                mmc_tensor **loss, int64_t *n_scored) {
    *loss = NULL;
    mmc_qwen2 *m = vl->lm;
    const int64_t B = b->B, T = b->T, BT = B * T, C = m->cfg.hidden_size;
    mmc_vl_media media;
    mmc_tensor *ids = mmc_qwen2_vl_batch_media(ctx, b, &media);                  /* [B, T] i32 */
    const mmc_vl_seq seq = {.position_ids = b->position_ids, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
    mmc_tensor *cos, *sin;
    mmc_attn_opts unused;
    /* the ids and the media checked, the whole row's positions -> cos, sin [B, T, D] */
    mmc_status st = mmc_qwen2_vl_inputs(ctx, vl, ids, &media, &seq, NULL, NULL, NULL, &cos, &sin, &unused);
    if (st) return st;
    mmc_tensor *e = mmc_reshape(ctx, mmc_qwen2_embed(ctx, m, ids), 2, MMC_SHAPE(BT, C));   /* [B*T, C] */
    const int32_t *id = ids->data;
    for (int k = 0; k < 2; k++) {   /* images, then videos, through the same tower */
        const int n = k ? media.n_videos : media.n_images;
        if (n <= 0) continue;
        mmc_tensor *feats;
        st = mmc_qwen2_vl_encode(ctx, vl, k ? media.pixel_values_videos : media.pixel_values,
                                 k ? media.video_grid_thw : media.image_grid_thw, n, &feats);   /* [Nk, C] */
        if (st) return mmc_error_prefix(st, "%s", k ? "videos" : "images");
        const int32_t tok = (int32_t)(k ? vl->video_token_id : vl->image_token_id);
        const int64_t nf = feats->shape[0];
        mmc_tensor *at = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(nf));                /* [Nk] their rows */
        int64_t got = 0;
        for (int64_t i = 0; i < BT && got < nf; i++)
            if (id[i] == tok) ((int64_t *)at->data)[got++] = i;
        if (got != nf)
            return mmc_error(MMC_ERR_INVALID, "the micro-batch has fewer %s placeholders (%lld) than the tower's %lld "
                             "merged features", k ? "video" : "image", (long long)got, (long long)nf);
        e = mmc_scatter_rows(ctx, e, at, mmc_cp_sum_grad(ctx, cp, feats));
    }
    const cp_shard s = shard_rows(ctx, m, cp, b);
    const int64_t Tl = s.Tl, D = cos->shape[cos->ndim - 1];
    if (n_scored) *n_scored = s.n;
    mmc_tensor *rows = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(B * Tl));             /* [B*T/C] rows of the whole row */
    int64_t *rd = rows->data;
    for (int64_t i = 0; i < B; i++)
        for (int64_t t = 0; t < Tl; t++) rd[i * Tl + t] = i * T + (s.gi[t] < T ? s.gi[t] : T - 1);
    mmc_tensor *x = mmc_reshape(ctx, mmc_gather_rows(ctx, e, rows), 3, MMC_SHAPE(B, Tl, C));   /* [B, T/C, C] */
    cos = mmc_reshape(ctx, mmc_gather_rows(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, cos), 2, MMC_SHAPE(BT, D)), rows),
                      3, MMC_SHAPE(B, Tl, D));                                    /* [B, T/C, D] */
    sin = mmc_reshape(ctx, mmc_gather_rows(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, sin), 2, MMC_SHAPE(BT, D)), rows),
                      3, MMC_SHAPE(B, Tl, D));
    *loss = shard_loss(ctx, m, cp, b, &s, x, cos, sin, scale);
    return MMC_OK;
}

/* ------------------------------------------------------------------ LLaVA / InternVL
 * The caller built the whole row's input embeddings e [B, T, C] (the tower replicated over the
 * group, its features through mmc_cp_sum_grad, as for Qwen2-VL above); each rank keeps its
 * shard's rows and their 1-D positions (mmc_embeds_positions: each packed segment from 0; a
 * padding token past T continues from row T-1's), then the decoder and the loss as above. */
mmc_tensor *mmc_cp_embeds_lm_loss(mmc_ctx *ctx, mmc_qwen2 *m, mmc_comm *cp, const mmc_batch *b, mmc_tensor *e,
                                  double scale, int64_t *n_scored) {
    const int64_t B = b->B, T = b->T, C = m->cfg.hidden_size;
    const cp_shard s = shard_rows(ctx, m, cp, b);
    const int64_t Tl = s.Tl;
    if (n_scored) *n_scored = s.n;
    const int64_t *whole = mmc_embeds_positions(ctx, b)->data;                   /* [T] */
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(B, Tl));                /* [B, T/C] */
    mmc_tensor *rows = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(B * Tl));             /* [B*T/C] rows of the whole row */
    int64_t *pd = pos->data, *rd = rows->data;
    for (int64_t i = 0; i < B; i++)
        for (int64_t t = 0; t < Tl; t++) {
            const int64_t g = s.gi[t];
            pd[i * Tl + t] = g < T ? whole[g] : whole[T - 1] + (g - T + 1);
            rd[i * Tl + t] = i * T + (g < T ? g : T - 1);
        }
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);                         /* [B, T/C, D] */
    mmc_tensor *x = mmc_reshape(ctx, mmc_contiguous(ctx, e), 2, MMC_SHAPE(B * T, C));
    x = mmc_reshape(ctx, mmc_gather_rows(ctx, x, rows), 3, MMC_SHAPE(B, Tl, C));  /* [B, T/C, C] */
    return shard_loss(ctx, m, cp, b, &s, x, cos, sin, scale);
}
