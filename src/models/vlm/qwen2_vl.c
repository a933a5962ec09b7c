/* qwen2_vl.c — Qwen2-VL / Qwen2.5-VL vision-language models, mirroring transformers'
 * Qwen2VLForConditionalGeneration and Qwen2_5_VLForConditionalGeneration (5.x):
 * token embeddings with the vision tower's outputs placed at the <|image_pad|>/<|video_pad|>
 * positions (get_placeholder_mask + masked_scatter), 3-D M-RoPE position ids
 * (get_rope_index), the Qwen2 decoder (qwen2.c) and the LM head. For generation the prompt's
 * rope_deltas (max position + 1 - length) offset the positions of every decoded token, as
 * transformers' _prepare_position_ids_for_generation does. */
#include "mmc_vl.h"
#include "mmc_hetero.h"
#include "mmc_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ loading */
mmc_status mmc_qwen2_vl_prepack(mmc_qwen2_vl *m, int *n_linears, int64_t *bytes_before, int64_t *bytes_after) {
    mmc_status st = m->lm ? mmc_qwen2_prepack(m->lm, n_linears, bytes_before, bytes_after) : MMC_OK;
    if (!st && m->visual) st = mmc_vision_prepack(m->visual, n_linears, bytes_before, bytes_after);
    return st;
}

void mmc_qwen2_vl_free(mmc_qwen2_vl *m) {
    if (!m) return;
    mmc_lora_free(m->adapter);   /* detaches from the layers, so before they go */
    mmc_vision_free(m->visual);
    mmc_qwen2_free(m->lm);
    mmc_st_close(m->st);
    free(m);
}

/* Architecture, text and vision configs and special token ids from a parsed config.json
 * (`path` names it in messages). */
static mmc_status read_config(const mmc_json *cfg, const char *path, mmc_qwen2_vl *m, mmc_qwen2_config *tc,
                              mmc_vision_config *vc) {
    mmc_status st;
    const char *mt = NULL;
    if ((st = mmc_json_str(cfg, "model_type", "", &mt))) return st;
    if (!strcmp(mt, "qwen2_vl")) m->arch = MMC_VL_QWEN2;
    else if (!strcmp(mt, "qwen2_5_vl")) m->arch = MMC_VL_QWEN2_5;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not qwen2_vl or qwen2_5_vl", path, mt);
    if ((st = mmc_qwen2_config_read(cfg, tc))) return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_vision_config_read(cfg, m->arch, vc))) return mmc_error_prefix(st, "%s", path);
    if (!tc->mrope) {   /* transformers' default mrope_section */
        if (tc->head_dim != 128)
            return mmc_error(MMC_ERR_FORMAT, "%s: no mrope_section (rope_scaling / rope_parameters) and head_dim "
                             "%lld is not 128 (the default [16, 24, 24])", path, (long long)tc->head_dim);
        tc->mrope = true;
        tc->mrope_section[0] = 16, tc->mrope_section[1] = 24, tc->mrope_section[2] = 24;
    }
    if (vc->out_hidden_size != tc->hidden_size)
        return mmc_error(MMC_ERR_FORMAT, "%s: the vision merger outputs %lld features but the language model's "
                         "hidden_size is %lld", path, (long long)vc->out_hidden_size, (long long)tc->hidden_size);
    int64_t v;
    if ((st = mmc_json_int(cfg, "image_token_id", 151655, &v))) return st;
    m->image_token_id = v;
    if ((st = mmc_json_int(cfg, "video_token_id", 151656, &v))) return st;
    m->video_token_id = v;
    if ((st = mmc_json_int(cfg, "vision_start_token_id", 151652, &v))) return st;
    m->vision_start_token_id = v;
    return MMC_OK;
}

mmc_status mmc_qwen2_vl_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_qwen2_vl **out) {
    *out = NULL;
    mmc_qwen2_vl *m = calloc(1, sizeof *m);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_qwen2_config tc;
    mmc_vision_config vc;
    mmc_status st = read_config(cfg, what ? what : "config", m, &tc, &vc);
    /* separate streams for the two parts, so that changing one config leaves the other's init */
    if (!st) st = mmc_vision_new(&vc, seed * 0x9E3779B97F4A7C15ull + 1, &m->visual);
    if (!st) st = mmc_qwen2_new(&tc, seed, &m->lm);
    if (st) { mmc_qwen2_vl_free(m); return st; }
    m->hub_layout = false;
    *out = m;
    return MMC_OK;
}

/* the vision tower's shard, when tp divides its heads and MLP (else it stays replicated) */
static mmc_status shard_vision(mmc_qwen2_vl *m, struct mmc_comm *tp) {
    if (!mmc_vision_tp_ok(&m->visual->cfg, mmc_comm_size(tp), NULL, 0)) return MMC_OK;
    mmc_vision *v = NULL;
    mmc_status st = mmc_vision_shard_tp(m->visual, tp, &v);
    if (st) return st;
    mmc_vision_free(m->visual);
    m->visual = v;
    return MMC_OK;
}

mmc_status mmc_qwen2_vl_shard_tp(mmc_qwen2_vl *m, struct mmc_comm *tp) {
    return mmc_qwen2_vl_shard_tp_ex(m, tp, true);
}

mmc_status mmc_qwen2_vl_shard_tp_ex(mmc_qwen2_vl *m, struct mmc_comm *tp, bool split_tower) {
    mmc_qwen2 *s = NULL;
    mmc_status st = mmc_qwen2_shard_tp(m->lm, tp, &s);
    if (st) return st;
    s->recompute = m->lm->recompute;
    mmc_qwen2_free(m->lm);
    m->lm = s;
    return split_tower ? shard_vision(m, tp) : MMC_OK;
}

mmc_status mmc_qwen2_vl_load(const char *dir, bool trainable, mmc_qwen2_vl **out) {
    return mmc_qwen2_vl_load_tp(dir, trainable, NULL, out);
}

mmc_status mmc_qwen2_vl_load_tp(const char *dir, bool trainable, struct mmc_comm *tp, mmc_qwen2_vl **out) {
    return mmc_qwen2_vl_load_tp_ex(dir, trainable, tp, true, out);
}

mmc_status mmc_qwen2_vl_load_tp_ex(const char *dir, bool trainable, struct mmc_comm *tp, bool split_tower,
                                   mmc_qwen2_vl **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return st;
    mmc_qwen2_vl *m = calloc(1, sizeof *m);
    char *verr = NULL;
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    mmc_qwen2_config tc;
    mmc_vision_config vc;
    if ((st = read_config(cfg, path, m, &tc, &vc))) goto fail;
    if ((st = mmc_st_open(dir, &m->st))) goto fail;
    /* weight layout: the Hub's (visual., model., lm_head) or transformers >= 4.52's
     * (model.visual., model.language_model., lm_head) */
    m->hub_layout = !(mmc_st_find(m->st, "model.visual.patch_embed.proj.weight") ||
                      mmc_st_find(m->st, "model.language_model.embed_tokens.weight"));
    const char *vpre = m->hub_layout ? "visual." : "model.visual.";
    const char *lpre = m->hub_layout ? "model." : "model.language_model.";
    /* load both parts even if the first fails, so that every problem is reported at once */
    mmc_status vst = mmc_vision_load_from(m->st, &vc, vpre, trainable, &m->visual);
    if (vst) verr = strdup(mmc_last_error());
    /* with tensor parallelism the language model binds its slices (the tower is sliced below) */
    mmc_status lst = tp ? mmc_qwen2_load_from_tp(m->st, &tc, lpre, "lm_head.weight", tp, trainable, &m->lm)
                        : mmc_qwen2_load_from(m->st, &tc, lpre, "lm_head.weight", trainable, &m->lm);
    if (vst || lst) {
        st = vst ? vst : lst;
        char *lerr = lst ? strdup(mmc_last_error()) : NULL;
        mmc_error(st, "%s: %s%s%s", dir, vst && verr ? verr : "", vst && lst ? "\n" : "", lerr ? lerr : "");
        free(lerr);
        goto fail;
    }
    free(verr);
    mmc_json_free(cfg);
    /* tensor parallelism: the tower (small next to the language model) is loaded whole, then sliced */
    if (tp && trainable && split_tower && (st = shard_vision(m, tp))) { cfg = NULL, verr = NULL; goto fail; }
    if (trainable) {   /* weights were copied: the mapping is not needed */
        mmc_st_close(m->st);
        m->st = NULL;
    }
    *out = m;
    return MMC_OK;
fail:
    free(verr);
    mmc_json_free(cfg);
    mmc_qwen2_vl_free(m);
    return st;
}

/* ------------------------------------------------------------------ rope index */
static int64_t grid_tokens(const int64_t *g, int64_t m) { return g[0] * (g[1] / m) * (g[2] / m); }

mmc_status mmc_qwen2_vl_rope_index(const mmc_qwen2_vl *m, const int32_t *ids, int64_t B, int64_t T,
                                   const mmc_vl_media *media, int64_t *pos, int64_t *deltas) {
    const mmc_vision_config *vc = &m->visual->cfg;
    const int64_t ms = vc->spatial_merge_size;
    const int32_t img = (int32_t)m->image_token_id, vid = (int32_t)m->video_token_id;
    mmc_vl_media none = {0};
    if (!media) media = &none;
    /* placeholder counts against the grids, for the whole batch */
    int64_t n_tok[2] = {0, 0}, n_feat[2] = {0, 0};
    for (int64_t i = 0; i < B * T; i++) n_tok[0] += ids[i] == img, n_tok[1] += ids[i] == vid;
    for (int i = 0; i < media->n_images; i++) n_feat[0] += grid_tokens(media->image_grid_thw + 3 * i, ms);
    for (int i = 0; i < media->n_videos; i++) n_feat[1] += grid_tokens(media->video_grid_thw + 3 * i, ms);
    for (int k = 0; k < 2; k++)
        if (n_tok[k] != n_feat[k])
            return mmc_error(MMC_ERR_INVALID, "%s features and %s tokens do not match: the prompt has %lld %s "
                             "tokens (id %d) but %d %s grid%s give%s %lld features", k ? "video" : "image",
                             k ? "video" : "image", (long long)n_tok[k], k ? "<|video_pad|>" : "<|image_pad|>",
                             k ? vid : img, k ? media->n_videos : media->n_images, k ? "video" : "image",
                             (k ? media->n_videos : media->n_images) == 1 ? "" : "s",
                             (k ? media->n_videos : media->n_images) == 1 ? "s" : "", (long long)n_feat[k]);
    int next[2] = {0, 0};
    for (int64_t b = 0; b < B; b++) {
        const int32_t *row = ids + b * T;
        int64_t *p0 = pos + b * T, *p1 = pos + (B + b) * T, *p2 = pos + (2 * B + b) * T;
        int64_t cur = 0, maxp = -1, t = 0;
        while (t < T) {
            int kind = row[t] == img ? 0 : row[t] == vid ? 1 : -1;
            if (kind < 0) {
                p0[t] = p1[t] = p2[t] = cur++;
                maxp = cur - 1 > maxp ? cur - 1 : maxp;
                t++;
                continue;
            }
            /* one grid's worth of placeholders; several images in one run follow each other */
            int gi = next[kind]++;
            if (gi >= (kind ? media->n_videos : media->n_images))
                return mmc_error(MMC_ERR_INVALID, "more %s placeholder runs than %ss", kind ? "video" : "image",
                                 kind ? "video" : "image");
            const int64_t *g = (kind ? media->video_grid_thw : media->image_grid_thw) + 3 * gi;
            int64_t lt = g[0], lh = g[1] / ms, lw = g[2] / ms, n = lt * lh * lw;
            int64_t run = 0;
            while (t + run < T && run < n && row[t + run] == row[t]) run++;
            if (run != n)
                return mmc_error(MMC_ERR_INVALID, "batch %lld position %lld: %s %d (grid %lld x %lld x %lld) needs %lld "
                                 "consecutive placeholder tokens, found %lld", (long long)b, (long long)t,
                                 kind ? "video" : "image", gi, (long long)g[0], (long long)g[1], (long long)g[2],
                                 (long long)n, (long long)run);
            /* temporal scale: Qwen2.5-VL videos use tokens_per_second * second_per_grid_ts,
             * computed in float32 and truncated like torch's (arange * interval).long() */
            bool scaled = m->arch == MMC_VL_QWEN2_5 && kind == 1;
            float interval = 1.0f;
            if (scaled)
                interval = (float)vc->tokens_per_second *
                           (media->second_per_grid_ts ? (float)media->second_per_grid_ts[gi] : 1.0f);
            for (int64_t a = 0; a < lt; a++)
                for (int64_t r = 0; r < lh; r++)
                    for (int64_t c = 0; c < lw; c++, t++) {
                        int64_t tp = scaled ? (int64_t)((float)a * interval) : a;
                        p0[t] = tp + cur, p1[t] = r + cur, p2[t] = c + cur;
                        int64_t mx = p0[t] > p1[t] ? p0[t] : p1[t];
                        mx = mx > p2[t] ? mx : p2[t];
                        maxp = mx > maxp ? mx : maxp;
                    }
            cur += (g[1] > g[2] ? g[1] : g[2]) / ms;
        }
        if (deltas) deltas[b] = maxp + 1 - T;
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ forward */
/* Per-modality plan (mmc_hetero.h): the n images (or videos) of this batch shared out over g by
 * patch count, each member encoding its contiguous run with the whole tower, the merged features
 * all-gathered in image order: [sum t h w / m^2, Co] on every member, the same rows one process's
 * mmc_vision_forward gives (used by Qwen2-VL and by the Qwen2.5-Omni thinker's tower). */
mmc_status mmc_vision_forward_shared(mmc_ctx *ctx, struct mmc_comm *g, mmc_vision *visual, mmc_tensor *pixels,
                                     const int64_t *grid, int n, mmc_tensor **feats, int64_t *n_images,
                                     int64_t *n_patches) {
    const int P = mmc_comm_size(g), r = mmc_comm_rank(g);
    const int64_t ms2 = visual->cfg.spatial_merge_size * visual->cfg.spatial_merge_size;
    int64_t *cost = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)(n + P));
    int64_t *rows = cost + n, patches = 0;
    const mmc_vision_config *vc = &visual->cfg;
    const int64_t ms = vc->spatial_merge_size, K = vc->in_channels * vc->temporal_patch_size * vc->patch_size * vc->patch_size;
    /* what mmc_vision_forward checks, on the whole batch and on every member alike: no rank may
     * fail alone on its share and leave the others waiting in the all-gather */
    for (int i = 0; i < n; i++) {
        const int64_t t = grid[3 * i], h = grid[3 * i + 1], w = grid[3 * i + 2];
        if (t <= 0 || h <= 0 || w <= 0 || h % ms || w % ms)
            return mmc_error(MMC_ERR_INVALID, "vision tower: grid_thw[%d] = (%lld, %lld, %lld): t, h, w must be "
                             "positive and h, w multiples of spatial_merge_size %lld", i, (long long)t, (long long)h,
                             (long long)w, (long long)ms);
        patches += cost[i] = t * h * w;
    }
    if (!pixels || pixels->ndim != 2 || pixels->shape[0] != patches || pixels->shape[1] != K)
        return mmc_error(MMC_ERR_SHAPE, "vision tower: pixel values do not match the grids: expected [%lld, %lld] "
                         "(sum of t*h*w over %d grids, Cin*kt*p*p)", (long long)patches, (long long)K, n);
    int first = 0, cnt = 0;
    for (int k = 0; k < P; k++) {
        int f, c;
        mmc_hetero_share(cost, n, P, k, &f, &c);
        rows[k] = 0;
        for (int i = f; i < f + c; i++) rows[k] += cost[i] / ms2;
        if (k == r) first = f, cnt = c;
    }
    mmc_tensor *local;
    if (cnt > 0) {
        int64_t p0 = 0, np = 0;
        for (int i = 0; i < first; i++) p0 += cost[i];
        for (int i = first; i < first + cnt; i++) np += cost[i];
        mmc_status st = mmc_vision_forward(ctx, visual, mmc_narrow(ctx, pixels, 0, p0, np), grid + 3 * first, cnt,
                                           &local, NULL);
        MMC_CHECK(st == MMC_OK, "vision tower on images %d..%d of this batch (checked before): %s", first,
                  first + cnt - 1, mmc_last_error());
        *n_images += cnt;
        *n_patches += np;
    } else {   /* fewer images than members: nothing to encode here, the others' rows still arrive */
        local = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(0, visual->cfg.out_hidden_size));
    }
    *feats = mmc_hetero_gather_rows(ctx, g, mmc_contiguous(ctx, local), rows);
    return MMC_OK;
}

mmc_status mmc_qwen2_vl_encode(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *pixels, const int64_t *grid, int n,
                               mmc_tensor **feats) {
    if (m->encode_hook) {
        const mmc_status st = m->encode_hook(m->encode_hook_arg, ctx, grid, n, feats);
        if (st != MMC_ERR_NOT_FOUND) return st;
    }
    return m->vision_share && mmc_comm_size(m->vision_share) > 1
               ? mmc_vision_forward_shared(ctx, m->vision_share, m->visual, pixels, grid, n, feats, &m->share_images,
                                           &m->share_patches)
               : mmc_vision_forward(ctx, m->visual, pixels, grid, n, feats, NULL);
}

/* Replace the rows of embeds [B*T, C] at token `tok` by feats [n, C] in order. */
static mmc_tensor *place(mmc_ctx *ctx, mmc_tensor *embeds, const int32_t *ids, int64_t BT, int32_t tok,
                         mmc_tensor *feats) {
    int64_t n = feats->shape[0], k = 0;
    mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n));
    for (int64_t i = 0; i < BT && k < n; i++)
        if (ids[i] == tok) ((int64_t *)idx->data)[k++] = i;
    MMC_CHECK(k == n, "placeholder count checked before: %lld vs %lld", (long long)k, (long long)n);
    return mmc_scatter_rows(ctx, embeds, idx, feats);
}

/* The same without autograd: rows of embeds [B*T, C] (contiguous) overwritten in place. */
static void place_inplace(mmc_tensor *embeds, const int32_t *ids, int64_t BT, int32_t tok, const mmc_tensor *feats) {
    const int64_t n = feats->shape[0], C = feats->shape[1];
    MMC_CHECK(feats->dtype == MMC_F32 && embeds->dtype == MMC_F32 && embeds->shape[embeds->ndim - 1] == C,
              "vision features [%lld, %lld] do not fit the embeddings", (long long)n, (long long)C);
    int64_t k = 0;
    for (int64_t i = 0; i < BT && k < n; i++)
        if (ids[i] == tok) {
            memcpy((float *)embeds->data + i * C, (const float *)feats->data + k * C, (size_t)C * sizeof(float));
            k++;
        }
    MMC_CHECK(k == n, "placeholder count checked before: %lld vs %lld", (long long)k, (long long)n);
}

/* Packed row (B == 1): M-RoPE positions restart at 0 in every cu_seqlens segment, each
 * segment taking the next grids in token order (as if each sample were its own row); the
 * padding tail after cu_seqlens[n_seqs] counts up from 0 (it is never scored). */
static mmc_status rope_index_packed(const mmc_qwen2_vl *m, const int32_t *ids, int64_t T, const mmc_vl_media *media,
                                    const int32_t *cu, int n_seqs, int64_t *pos) {
    const int64_t ms = m->visual->cfg.spatial_merge_size;
    mmc_vl_media none = {0};
    if (!media) media = &none;
    int64_t *tmp = malloc(sizeof(int64_t) * 3 * (size_t)(T > 0 ? T : 1));
    if (!tmp) return mmc_error(MMC_ERR_OOM, "out of memory");
    int gi[2] = {0, 0};
    mmc_status st = MMC_OK;
    for (int s = 0; s < n_seqs && !st; s++) {
        int64_t a = cu[s], e = cu[s + 1], L = e - a;
        if (a < 0 || e > T || L < 0) {
            st = mmc_error(MMC_ERR_INVALID, "cu_seqlens[%d..%d] = %lld..%lld is outside the row of %lld tokens", s,
                           s + 1, (long long)a, (long long)e, (long long)T);
            break;
        }
        if (L == 0) continue;
        int64_t want[2] = {0, 0};
        for (int64_t t = a; t < e; t++)
            want[0] += ids[t] == (int32_t)m->image_token_id, want[1] += ids[t] == (int32_t)m->video_token_id;
        mmc_vl_media sub = *media;
        int n[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            const int64_t *g = k ? media->video_grid_thw : media->image_grid_thw;
            int avail = k ? media->n_videos : media->n_images;
            int64_t got = 0;
            while (got < want[k] && gi[k] + n[k] < avail) got += grid_tokens(g + 3 * (gi[k] + n[k]), ms), n[k]++;
        }
        sub.pixel_values = sub.pixel_values_videos = NULL;
        sub.image_grid_thw = media->image_grid_thw ? media->image_grid_thw + 3 * gi[0] : NULL;
        sub.n_images = n[0];
        sub.video_grid_thw = media->video_grid_thw ? media->video_grid_thw + 3 * gi[1] : NULL;
        sub.n_videos = n[1];
        sub.second_per_grid_ts = media->second_per_grid_ts ? media->second_per_grid_ts + gi[1] : NULL;
        st = mmc_qwen2_vl_rope_index(m, ids + a, 1, L, &sub, tmp, NULL);
        if (st) { mmc_error_prefix(st, "packed segment %d (tokens %lld..%lld)", s, (long long)a, (long long)e); break; }
        for (int k = 0; k < 3; k++) memcpy(pos + k * T + a, tmp + k * L, sizeof(int64_t) * (size_t)L);
        gi[0] += n[0], gi[1] += n[1];
    }
    if (!st && (gi[0] != media->n_images || gi[1] != media->n_videos))
        st = mmc_error(MMC_ERR_INVALID, "packed row: its segments use %d image and %d video grids but %d and %d "
                       "were given", gi[0], gi[1], media->n_images, media->n_videos);
    int64_t end = n_seqs > 0 ? cu[n_seqs] : 0;
    for (int64_t t = end; t < T && !st; t++)
        for (int k = 0; k < 3; k++) pos[k * T + t] = t - end;
    free(tmp);
    return st;
}

mmc_status mmc_qwen2_vl_forward(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *ids, const mmc_vl_media *media,
                                mmc_kv_cache *kv, int64_t *rope_deltas, mmc_tensor **hidden) {
    return mmc_qwen2_vl_forward_ex(ctx, m, ids, media, NULL, kv, rope_deltas, hidden);
}

mmc_status mmc_qwen2_vl_inputs(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *ids, const mmc_vl_media *media,
                               const mmc_vl_seq *seq, mmc_kv_cache *kv, int64_t *rope_deltas, mmc_tensor **embeds,
                               mmc_tensor **cos_out, mmc_tensor **sin_out, mmc_attn_opts *attn) {
    if (embeds) *embeds = NULL;
    static const mmc_vl_seq no_seq = {0};
    if (!seq) seq = &no_seq;
    const mmc_qwen2_config *c = &m->lm->cfg;
    if (!ids || ids->ndim != 2 || (ids->dtype != MMC_I32 && ids->dtype != MMC_I64))
        return mmc_error(MMC_ERR_SHAPE, "qwen2_vl forward: ids must be [B, T] int32/int64");
    const int64_t B = ids->shape[0], T = ids->shape[1], BT = B * T, C = c->hidden_size;
    if (T <= 0 || B <= 0) return mmc_error(MMC_ERR_INVALID, "qwen2_vl forward: empty input");
    bool prefill = !kv || kv->len == 0;
    bool has_media = media && (media->n_images > 0 || media->n_videos > 0);
    if (!prefill && has_media)
        return mmc_error(MMC_ERR_UNSUPPORTED, "qwen2_vl forward: images or videos after the prompt (KV cache "
                         "holds %lld positions) are not supported", (long long)kv->len);
    if (kv && (kv->batch != B || kv->n_layers != c->num_layers))
        return mmc_error(MMC_ERR_SHAPE, "qwen2_vl forward: KV cache for batch %lld / %d layers, input batch %lld",
                         (long long)kv->batch, kv->n_layers, (long long)B);
    int32_t *id32 = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)BT);
    mmc_tensor *idc = mmc_contiguous(ctx, ids);
    for (int64_t i = 0; i < BT; i++) {
        int64_t t = idc->dtype == MMC_I32 ? ((int32_t *)idc->data)[i] : ((int64_t *)idc->data)[i];
        if (t < 0 || t >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "token %lld at position %lld is outside the vocabulary [0, %lld)",
                             (long long)t, (long long)i, (long long)c->vocab_size);
        id32[i] = (int32_t)t;
    }
    /* positions [3, B, T] */
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, T));
    int64_t *p = pos->data;
    if (seq->cu_seqlens && (B != 1 || !prefill || kv))
        return mmc_error(MMC_ERR_SHAPE, "qwen2_vl forward: packed rows (cu_seqlens) need B == 1 and no KV cache");
    if (seq->position_ids) {
        memcpy(p, seq->position_ids, sizeof(int64_t) * 3 * (size_t)BT);
    } else if (seq->cu_seqlens) {
        mmc_status st = rope_index_packed(m, id32, T, media, seq->cu_seqlens, seq->n_seqs, p);
        if (st) return st;
    } else if (prefill) {
        int64_t *d = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)B);
        mmc_status st = mmc_qwen2_vl_rope_index(m, id32, B, T, media, p, d);
        if (st) return st;
        if (rope_deltas) memcpy(rope_deltas, d, sizeof(int64_t) * (size_t)B);
    } else {
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++) {
                int64_t v = kv->len + t + (rope_deltas ? rope_deltas[b] : 0);
                p[b * T + t] = p[(B + b) * T + t] = p[(2 * B + b) * T + t] = v;
            }
    }
    /* embeddings, with the vision features at the placeholders (not wanted: a later pipeline stage) */
    mmc_tensor *e = embeds ? mmc_reshape(ctx, mmc_qwen2_embed(ctx, m->lm, idc), 2, MMC_SHAPE(BT, C)) : NULL; /* [B*T, C] */
    if (has_media && embeds) {
        for (int k = 0; k < 2; k++) {
            int n = k ? media->n_videos : media->n_images;
            if (!n) continue;
            mmc_tensor *feats;
            /* inference: the tower's activations are released once its features are placed */
            bool infer = !mmc_grad_enabled(ctx);
            if (infer) e = mmc_contiguous(ctx, e);
            mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
            mmc_tensor *px = k ? media->pixel_values_videos : media->pixel_values;
            const int64_t *grid = k ? media->video_grid_thw : media->image_grid_thw;
            mmc_status st = mmc_qwen2_vl_encode(ctx, m, px, grid, n, &feats);
            if (st) return mmc_error_prefix(st, "%s", k ? "videos" : "images");
            int32_t tok = (int32_t)(k ? m->video_token_id : m->image_token_id);
            if (infer) {
                place_inplace(e, id32, BT, tok, mmc_contiguous(ctx, feats));
                mmc_arena_release(mmc_ctx_arena(ctx), mk);
            } else {
                e = place(ctx, e, id32, BT, tok, feats);
            }
        }
    }
    if (embeds) *embeds = mmc_reshape(ctx, e, 3, MMC_SHAPE(B, T, C));
    mmc_rope_table_mrope(ctx, pos, c->mrope_section, (int)c->head_dim, c->rope_theta, cos_out, sin_out); /* [B, T, D] */
    if (kv) {
        mmc_status st = mmc_kv_cache_reserve(kv, kv->len + T);
        if (st) return st;
    }
    mmc_attn_opts ao = {.causal = true};
    if (seq->cu_seqlens) {
        /* block-diagonal causal attention; the padding tail (not a segment) becomes one more
         * block so that the blocks cover the row, as the attention op requires */
        int n = seq->n_seqs;
        int32_t last = n > 0 ? seq->cu_seqlens[n] : 0;
        int32_t *cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(n + 2));
        memcpy(cu, seq->cu_seqlens, sizeof(int32_t) * (size_t)(n + 1));
        if (n == 0) cu[0] = 0;
        if (last < T) cu[++n] = (int32_t)T;
        ao.cu_seqlens = cu;
        ao.n_seqs = n;
    }
    *attn = ao;
    return MMC_OK;
}

mmc_status mmc_qwen2_vl_forward_ex(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *ids, const mmc_vl_media *media,
                                   const mmc_vl_seq *seq, mmc_kv_cache *kv, int64_t *rope_deltas,
                                   mmc_tensor **hidden) {
    *hidden = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    mmc_tensor *e, *cos, *sin;
    mmc_attn_opts ao;
    mmc_status st = mmc_qwen2_vl_inputs(ctx, m, ids, media, seq, kv, rope_deltas, &e, &cos, &sin, &ao);
    if (st) return st;
    const int64_t T = e->shape[1];
    if (mmc_grad_enabled(ctx)) {
        *hidden = mmc_qwen2_forward(ctx, m->lm, e, cos, sin, &ao, kv);
        return MMC_OK;
    }
    /* inference: the layers update one owned copy of the residual stream in place */
    mmc_tensor *x = mmc_contiguous(ctx, e);   /* the embedding's own output: ours to overwrite */
    for (int l = 0; l < c->num_layers; l++)
        mmc_qwen2_layer_forward_infer(ctx, c, &m->lm->layers[l], x, cos, sin, &ao, kv, l);
    if (kv) kv->len += T;
    *hidden = mmc_rmsnorm(ctx, x, m->lm->norm, (float)c->rms_norm_eps);
    return MMC_OK;
}

mmc_tensor *mmc_qwen2_vl_logits(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *hidden) {
    return mmc_qwen2_logits(ctx, m->lm, hidden);
}

/* ------------------------------------------------------------------ decoder interface */
/* ids [n] at the cache's end (the prompt with its media first) -> the last position's logits [V] */
static mmc_status vl_feed(mmc_ctx *ctx, mmc_qwen2_vl_request *r, const int32_t *feed, int64_t n,
                          const mmc_vl_media *media, mmc_kv_cache *kv, float **logits) {
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, n)), *h;
    memcpy(ids->data, feed, (size_t)n * sizeof(int32_t));
    mmc_status st = mmc_qwen2_vl_forward(ctx, r->m, ids, media, kv, &r->rope_delta, &h);
    if (st) return st;
    mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, n - 1, 1));  /* [1, 1, C] */
    *logits = mmc_qwen2_vl_logits(ctx, r->m, last)->data;                   /* [1, 1, V] */
    return MMC_OK;
}

static mmc_status vl_prefill(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                             float **logits) {
    mmc_qwen2_vl_request *r = self;
    return vl_feed(ctx, r, ids, n, r->media, kv, logits);
}

static mmc_status vl_decode(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits) {
    return vl_feed(ctx, self, &token, 1, NULL, kv, logits);
}

mmc_decoder mmc_qwen2_vl_decoder(mmc_qwen2_vl_request *r) {
    mmc_decoder d = mmc_qwen2_decoder(r->m->lm);
    d.self = r;
    d.prefill = vl_prefill;
    d.decode = vl_decode;
    return d;
}

mmc_status mmc_qwen2_vl_attach_adapter(mmc_qwen2_vl *m, const char *adapter_dir) {
    if (m->adapter || m->lm->adapter)
        return mmc_error(MMC_ERR_INVALID, "%s: the model already has an adapter", adapter_dir);
    mmc_module_list ml = {0};
    mmc_status st = mmc_qwen2_vl_linears(m, &ml);
    if (!st) st = mmc_lora_load(adapter_dir, &ml, false, &m->adapter);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_qwen2_vl_linears(mmc_qwen2_vl *m, mmc_module_list *out) {
    mmc_vision *v = m->visual;
    bool q2 = v->cfg.arch == MMC_VL_QWEN2;
    char name[MMC_MODULE_NAME];
    mmc_status st = MMC_OK;
    for (int64_t i = 0; i < v->cfg.depth && !st; i++) {
        mmc_vision_block *b = &v->blocks[i];
        const char *nm[5] = {"attn.qkv", "attn.proj", q2 ? "mlp.fc1" : "mlp.gate_proj",
                             q2 ? "mlp.fc2" : "mlp.up_proj", "mlp.down_proj"};
        mmc_linear_w *ls[5] = {&b->qkv, &b->proj, q2 ? &b->fc1 : &b->gate, q2 ? &b->fc2 : &b->up, &b->down};
        for (int j = 0; j < (q2 ? 4 : 5) && !st; j++) {
            snprintf(name, sizeof name, "model.visual.blocks.%lld.%s", (long long)i, nm[j]);
            st = mmc_module_list_add(out, ls[j], name);
        }
    }
    if (!st) st = mmc_module_list_add(out, &v->mlp0, "model.visual.merger.mlp.0");
    if (!st) st = mmc_module_list_add(out, &v->mlp2, "model.visual.merger.mlp.2");
    if (!st) st = mmc_qwen2_linears(m->lm, "model.language_model.", out);
    return st;
}
