/* omni.c — the Qwen2.5-Omni thinker, mirroring transformers' Qwen2_5OmniThinkerForConditionalGeneration
 * (5.23) for inference: token embeddings with the audio encoder's outputs at the <|AUDIO|> positions
 * and the vision tower's at the <|IMAGE|> positions (masked_scatter), TMRoPE position ids
 * (Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index), the Qwen2 decoder with
 * M-RoPE and the LM head. Checkpoints: a thinker (model.*, audio_tower.*, visual.*, lm_head.*) or a
 * full Qwen2_5OmniForConditionalGeneration (the same under thinker.*; its talker.* / token2wav.*
 * weights are left unread). The vision tower is mmc_vl.h's Qwen2.5-VL tower: Omni keeps q, k and v
 * as separate linears, which are copied into its fused qkv. */
#include "mmc_omni.h"
#include "mmc_lora.h"
#include "mmc_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mmc_omni_free(mmc_omni *m) {
    if (!m) return;
    if (m->lm) {   /* the adapter first: it detaches from the encoders' linears too, so before they go */
        mmc_lora_free(m->lm->adapter);
        m->lm->adapter = NULL;
    }
    mmc_omni_audio_free(m->audio);
    mmc_vision_free(m->visual);
    free(m->vis_parts);
    mmc_qwen2_free(m->lm);
    mmc_st_close(m->st);
    free(m);
}

bool mmc_omni_is_omni_dir(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    if (mmc_json_load(path, &j)) return false;
    const char *mt = NULL;
    bool ok = !mmc_json_str(j, "model_type", "", &mt) &&
              (!strcmp(mt, "qwen2_5_omni_thinker") || !strcmp(mt, "qwen2_5_omni"));
    mmc_json_free(j);
    return ok;
}

/* Copy the checkpoint's vision weights into a fresh f32 tower (fused qkv from q, k, v). */
static mmc_status load_vision(mmc_st *st, const mmc_vision_config *vc, const char *prefix, mmc_vision **out) {
    mmc_vision *v = NULL;
    mmc_status s = mmc_vision_new(vc, 1, &v);
    if (s) return s;
    char name[256];
    for (int i = 0; i < v->n_params && !s; i++) {
        const char *pn = v->param_names[i];
        mmc_tensor *t = v->params[i];
        const char *q = strstr(pn, "attn.qkv.");
        if (!q) {
            snprintf(name, sizeof name, "%svisual.%s", prefix, pn);
            s = mmc_st_read_into(st, name, t);
            continue;
        }
        /* rows [q; k; v] of qkv.weight [3C, C] / qkv.bias [3C] */
        int64_t part = mmc_numel(t) / 3;
        for (int k = 0; k < 3 && !s; k++) {
            snprintf(name, sizeof name, "%svisual.%.*sattn.%c.%s", prefix, (int)(q - pn), pn, "qkv"[k],
                     q + strlen("attn.qkv."));
            mmc_tensor *dst = mmc_tensor_wrap(MMC_F32, 1, MMC_SHAPE(part), (float *)t->data + k * part);
            s = mmc_st_read_into(st, name, dst);
            mmc_tensor_free(dst);
        }
    }
    if (s) { mmc_vision_free(v); return mmc_error_prefix(s, "Qwen2.5-Omni vision encoder"); }
    *out = v;
    return MMC_OK;
}

mmc_status mmc_omni_load(const char *dir, mmc_omni **out) { return mmc_omni_load_ex(dir, false, out); }

/* dir: load its weights; NULL: a fresh thinker from seed (mmc_omni_new) */
static mmc_status omni_build(const mmc_json *root, const char *path, const char *dir, bool trainable, uint64_t seed,
                             mmc_omni **out);

mmc_status mmc_omni_load_ex(const char *dir, bool trainable, mmc_omni **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *root = NULL;
    mmc_status st = mmc_json_load(path, &root);
    if (st) return st;
    st = omni_build(root, path, dir, trainable, 0, out);
    mmc_json_free(root);
    return st;
}

mmc_status mmc_omni_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_omni **out) {
    return omni_build(cfg, what ? what : "config", NULL, true, seed, out);
}

static mmc_status omni_build(const mmc_json *root, const char *path, const char *dir, bool trainable, uint64_t seed,
                             mmc_omni **out) {
    *out = NULL;
    mmc_status st = MMC_OK;
    mmc_omni *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    const char *mt = NULL;
    if ((st = mmc_json_str(root, "model_type", "", &mt))) goto fail;
    const mmc_json *tc = root;
    if (!strcmp(mt, "qwen2_5_omni")) {
        m->full_checkpoint = true;
        tc = mmc_json_get(root, "thinker_config");
        if (!tc) { st = mmc_error(MMC_ERR_FORMAT, "%s: model_type qwen2_5_omni without thinker_config", path); goto fail; }
    } else if (strcmp(mt, "qwen2_5_omni_thinker")) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not qwen2_5_omni_thinker or qwen2_5_omni", path, mt);
        goto fail;
    }
    mmc_qwen2_config lc;
    mmc_vision_config vc;
    mmc_omni_audio_config ac;
    if ((st = mmc_qwen2_config_read(tc, &lc))) { mmc_error_prefix(st, "%s", path); goto fail; }
    if (!lc.mrope) {
        if (lc.head_dim != 128) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: no mrope_section and head_dim %lld is not 128 (the default [16, 24, 24])",
                           path, (long long)lc.head_dim);
            goto fail;
        }
        lc.mrope = true, lc.mrope_section[0] = 16, lc.mrope_section[1] = 24, lc.mrope_section[2] = 24;
    }
    if ((st = mmc_vision_config_read(tc, MMC_VL_QWEN2_5, &vc))) { mmc_error_prefix(st, "%s", path); goto fail; }
    if ((st = mmc_omni_audio_config_read(tc, path, &ac))) goto fail;
    if (vc.out_hidden_size != lc.hidden_size || ac.output_dim != lc.hidden_size) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: vision out_hidden_size %lld / audio output_dim %lld differ from the text "
                       "hidden_size %lld", path, (long long)vc.out_hidden_size, (long long)ac.output_dim,
                       (long long)lc.hidden_size);
        goto fail;
    }
    int64_t v;
    double d;
    if ((st = mmc_json_int(tc, "audio_token_index", 151646, &v))) goto fail;
    m->audio_token_id = v;
    if ((st = mmc_json_int(tc, "image_token_index", 151655, &v))) goto fail;
    m->image_token_id = v;
    if ((st = mmc_json_int(tc, "video_token_index", 151656, &v))) goto fail;
    m->video_token_id = v;
    if ((st = mmc_json_int(tc, "vision_start_token_id", 151652, &v))) goto fail;
    m->vision_start_token_id = v;
    if ((st = mmc_json_int(tc, "audio_start_token_id", 151647, &v))) goto fail;
    m->audio_start_token_id = v;
    if ((st = mmc_json_int(tc, "audio_end_token_id", 151648, &v))) goto fail;
    m->audio_end_token_id = v;
    if ((st = mmc_json_num(tc, "position_id_per_seconds", 25, &d))) goto fail;
    m->position_id_per_seconds = d;
    if ((st = mmc_json_num(tc, "seconds_per_chunk", 2, &d))) goto fail;
    m->seconds_per_chunk = d;
    if (!dir) {   /* fresh: separate streams per part, as mmc_qwen2_vl_new */
        if (m->full_checkpoint) {
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: a random init takes a thinker config (model_type "
                           "qwen2_5_omni_thinker), not a full qwen2_5_omni one", path);
            goto fail;
        }
        if ((st = mmc_qwen2_new(&lc, seed, &m->lm))) goto fail;
        if ((st = mmc_vision_new(&vc, seed * 0x9E3779B97F4A7C15ull + 1, &m->visual))) goto fail;
        if ((st = mmc_omni_audio_new(&ac, seed * 0x9E3779B97F4A7C15ull + 2, &m->audio))) goto fail;
        *out = m;
        return MMC_OK;
    }
    if ((st = mmc_st_open(dir, &m->st))) goto fail;
    const char *pre = m->full_checkpoint ? "thinker." : "";
    char lpre[64], head[64];
    snprintf(lpre, sizeof lpre, "%smodel.", pre);
    snprintf(head, sizeof head, "%slm_head.weight", pre);
    if ((st = mmc_qwen2_load_from(m->st, &lc, lpre, head, trainable, &m->lm))) goto fail;
    if ((st = mmc_omni_audio_load_from(m->st, &ac, pre, trainable, &m->audio))) goto fail;
    if ((st = load_vision(m->st, &vc, pre, &m->visual))) goto fail;
    if (m->full_checkpoint) m->has_talker = mmc_json_get(root, "talker_config") != NULL;
    *out = m;
    return MMC_OK;
fail:
    mmc_omni_free(m);
    return st;
}

/* ------------------------------------------------------------------ placeholders and positions */
/* Positions of one video grid (t, h, w order) from start st: p[3][n]. */
static void video_positions(const mmc_omni *m, const int64_t *g, double spg, int64_t st, int64_t *p, int64_t n) {
    const int64_t ms = m->visual->cfg.spatial_merge_size, lh = g[1] / ms, lw = g[2] / ms;
    int64_t k = 0;
    for (int64_t a = 0; a < g[0]; a++) {
        /* arange(t) * second_per_grid (float32) * position_id_per_seconds, .long() */
        int64_t tp = (int64_t)((float)((float)a * (float)spg) * (float)m->position_id_per_seconds);
        for (int64_t r = 0; r < lh; r++)
            for (int64_t c = 0; c < lw; c++, k++) p[k] = tp + st, p[n + k] = r + st, p[2 * n + k] = c + st;
    }
}

mmc_status mmc_omni_rope_index(const mmc_omni *m, const int32_t *ids, int64_t T, const mmc_omni_media *media,
                               int64_t *pos, int64_t *delta) {
    static const mmc_omni_media none = {0};
    if (!media) media = &none;
    int64_t *p0 = pos, *p1 = pos + T, *p2 = pos + 2 * T;
    const int32_t at = (int32_t)m->audio_token_id, it = (int32_t)m->image_token_id, vt = (int32_t)m->video_token_id;
    /* transformers computes 3-D positions only when image or video grids are given; otherwise
     * they are the attention mask's cumsum - 1 (all ones here): 0..T-1 */
    if (media->n_images == 0 && media->n_videos == 0) {
        for (int64_t t = 0; t < T; t++) p0[t] = p1[t] = p2[t] = t;
        if (delta) *delta = 0;
        return MMC_OK;
    }
    const int64_t ms = m->visual->cfg.spatial_merge_size;
    /* next: the last segment's max + 1, as transformers' llm_pos_ids_list[-1].max() + 1 */
    int64_t next = 0, t = 0;
    int na = 0, ni = 0, nv = 0;
    mmc_status st = MMC_OK;
    int64_t *buf = NULL;
    while (t < T) {
        bool block = media->use_audio_in_video && ids[t] == (int32_t)m->vision_start_token_id && t + 2 < T &&
                     ids[t + 1] == (int32_t)m->audio_start_token_id && ids[t + 2] == vt;
        if (block) {   /* <|vision_bos|><|audio_bos|> video and audio interleaved <|audio_eos|><|vision_eos|> */
            if (nv >= media->n_videos || na >= media->n_audios)
                return mmc_error(MMC_ERR_INVALID, "more video-with-audio blocks than videos / audios");
            p0[t] = p1[t] = p2[t] = next, p0[t + 1] = p1[t + 1] = p2[t + 1] = next;
            t += 2;
            const int64_t s0 = ++next;
            const int64_t *g = media->video_grid_thw + 3 * nv;
            double spg = media->second_per_grid ? media->second_per_grid[nv] : 1.0;
            int64_t nvt = g[0] * (g[1] / ms) * (g[2] / ms), nat = mmc_omni_audio_tokens(media->audios[na].frames);
            nv++, na++;
            free(buf);
            buf = malloc(sizeof(int64_t) * (size_t)(3 * nvt + nvt + nat + 4) + sizeof(double) * (size_t)(nvt + nat));
            if (!buf) return mmc_error(MMC_ERR_OOM, "out of memory");
            int64_t *vp = buf, *bv = vp + 3 * nvt, *ba = bv + nvt + 2;
            double *vals = (double *)(ba + nat + 2);
            video_positions(m, g, spg, s0, vp, nvt);
            for (int64_t i = 0; i < nvt; i++) vals[i] = (double)(vp[i] - s0);
            for (int64_t i = 0; i < nat; i++) vals[nvt + i] = (double)i;
            double tpc = (double)(int64_t)(m->position_id_per_seconds * m->seconds_per_chunk);
            int cv = mmc_omni_chunks(vals, nvt, tpc, bv), ca = mmc_omni_chunks(vals + nvt, nat, tpc, ba);
            int64_t last_max = s0 - 1;
            for (int j = 0; j < (cv > ca ? cv : ca); j++) {
                if (j < cv) {
                    last_max = -1;
                    for (int64_t i = bv[j]; i < bv[j + 1]; i++, t++) {
                        if (t >= T || ids[t] != vt) goto bad_block;
                        p0[t] = vp[i], p1[t] = vp[nvt + i], p2[t] = vp[2 * nvt + i];
                        int64_t mx = p0[t] > p1[t] ? p0[t] : p1[t];
                        mx = mx > p2[t] ? mx : p2[t];
                        if (mx > last_max) last_max = mx;
                    }
                }
                if (j < ca) {
                    for (int64_t i = ba[j]; i < ba[j + 1]; i++, t++) {
                        if (t >= T || ids[t] != at) goto bad_block;
                        p0[t] = p1[t] = p2[t] = s0 + i;
                    }
                    last_max = s0 + ba[j + 1] - 1;
                }
            }
            next = last_max + 1;
            if (t + 1 >= T) goto bad_block;
            p0[t] = p1[t] = p2[t] = next, p0[t + 1] = p1[t + 1] = p2[t + 1] = next;
            t += 2, next++;
            continue;
        bad_block:
            st = mmc_error(MMC_ERR_INVALID, "position %lld: video %d with its audio track: the tokens do not follow "
                           "the interleaved chunks Qwen2_5OmniProcessor makes (use_audio_in_video)", (long long)t, nv - 1);
            break;
        }
        if (ids[t] == at) {   /* audio: one position per token */
            if (na >= media->n_audios) { st = mmc_error(MMC_ERR_INVALID, "more audio runs than audios"); break; }
            int64_t n = mmc_omni_audio_tokens(media->audios[na++].frames), run = 0;
            while (t + run < T && ids[t + run] == at && run < n) run++;
            if (run != n) {
                st = mmc_error(MMC_ERR_INVALID, "position %lld: audio %d needs %lld <|AUDIO|> tokens, found %lld",
                               (long long)t, na - 1, (long long)n, (long long)run);
                break;
            }
            for (int64_t i = 0; i < n; i++, t++) p0[t] = p1[t] = p2[t] = next + i;
            next += n;
        } else if (ids[t] == it || ids[t] == vt) {   /* (t * scale, h, w) + start */
            bool img = ids[t] == it;
            if (img ? ni >= media->n_images : nv >= media->n_videos) {
                st = mmc_error(MMC_ERR_INVALID, "more %s runs than %ss", img ? "image" : "video", img ? "image" : "video");
                break;
            }
            const int64_t *g = img ? media->image_grid_thw + 3 * ni : media->video_grid_thw + 3 * nv;
            double spg = img ? 1.0 : media->second_per_grid ? media->second_per_grid[nv] : 1.0;
            int k = img ? ni++ : nv++;
            int64_t n = g[0] * (g[1] / ms) * (g[2] / ms), run = 0;
            while (t + run < T && ids[t + run] == ids[t] && run < n) run++;
            if (run != n) {
                st = mmc_error(MMC_ERR_INVALID, "position %lld: %s %d needs %lld placeholder tokens, found %lld",
                               (long long)t, img ? "image" : "video", k, (long long)n, (long long)run);
                break;
            }
            free(buf);
            if (!(buf = malloc(sizeof(int64_t) * (size_t)(3 * n)))) return mmc_error(MMC_ERR_OOM, "out of memory");
            video_positions(m, g, spg, next, buf, n);
            int64_t mx = next - 1;
            for (int64_t i = 0; i < n; i++, t++) {
                p0[t] = buf[i], p1[t] = buf[n + i], p2[t] = buf[2 * n + i];
                if (p0[t] > mx) mx = p0[t];
                if (p1[t] > mx) mx = p1[t];
                if (p2[t] > mx) mx = p2[t];
            }
            next = mx + 1;
        } else {
            p0[t] = p1[t] = p2[t] = next++;
            t++;
        }
    }
    free(buf);
    if (st) return st;
    if (delta) {
        int64_t mx = -1;
        for (int64_t i = 0; i < 3 * T; i++) mx = pos[i] > mx ? pos[i] : mx;
        *delta = mx + 1 - T;
    }
    return MMC_OK;
}

/* rows of e [T, C] at token tok overwritten by feats [n, C] in order */
static mmc_status place(mmc_tensor *e, const int32_t *ids, int64_t T, int32_t tok, const mmc_tensor *feats,
                        const char *what) {
    const int64_t C = e->shape[1];
    int64_t k = 0, n = feats->shape[0];
    for (int64_t i = 0; i < T; i++)
        if (ids[i] == tok) {
            if (k >= n) break;
            memcpy((float *)e->data + i * C, (const float *)feats->data + k * C, sizeof(float) * (size_t)C);
            k++;
        }
    int64_t want = 0;
    for (int64_t i = 0; i < T; i++) want += ids[i] == tok;
    if (k != n || want != n)
        return mmc_error(MMC_ERR_INVALID, "%s features and tokens do not match: tokens %lld, features %lld", what,
                         (long long)want, (long long)n);
    return MMC_OK;
}

mmc_status mmc_omni_forward(mmc_ctx *ctx, mmc_omni *m, const int32_t *ids, int64_t T, const mmc_omni_media *media,
                            mmc_kv_cache *kv, int64_t *rope_delta, mmc_tensor **hidden) {
    *hidden = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    const int64_t C = c->hidden_size;
    if (T <= 0) return mmc_error(MMC_ERR_INVALID, "omni forward: empty input");
    bool prefill = !kv || kv->len == 0;
    bool has_media = media && (media->n_audios > 0 || media->n_images > 0 || media->n_videos > 0);
    if (!prefill && has_media)
        return mmc_error(MMC_ERR_UNSUPPORTED, "omni forward: audio or images after the prompt are not supported");
    for (int64_t i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "token %d at position %lld is outside the vocabulary [0, %lld)", ids[i],
                             (long long)i, (long long)c->vocab_size);
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_status st = MMC_OK;
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, 1, T));
    int64_t *p = pos->data;
    if (prefill) {
        int64_t d = 0;
        if ((st = mmc_omni_rope_index(m, ids, T, media, p, &d))) goto done;
        if (rope_delta) *rope_delta = d;
    } else {
        for (int64_t t = 0; t < T; t++) p[t] = p[T + t] = p[2 * T + t] = kv->len + t + (rope_delta ? *rope_delta : 0);
    }
    mmc_tensor *idt = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, T));
    memcpy(idt->data, ids, sizeof(int32_t) * (size_t)T);
    mmc_tensor *e = mmc_contiguous(ctx, mmc_reshape(ctx, mmc_qwen2_embed(ctx, m->lm, idt), 2, MMC_SHAPE(T, C)));
    if (has_media) {
        for (int i = 0; i < media->n_audios && !st; i++) {
            /* all audios' features, in order, at the <|AUDIO|> tokens */
            int64_t total = 0;
            for (int k = 0; k < media->n_audios; k++) total += mmc_omni_audio_tokens(media->audios[k].frames);
            mmc_tensor *all = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(total, C));
            int64_t off = 0;
            for (int k = 0; k < media->n_audios && !st; k++) {
                mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
                mmc_tensor *f;
                const mmc_omni_audio_in *a = &media->audios[k];
                st = mmc_omni_audio_forward(ctx, m->audio, a->feats, a->stride, a->frames, &f);
                if (st) { mmc_error_prefix(st, "audio %d", k); break; }
                memcpy((float *)all->data + off * C, f->data, sizeof(float) * (size_t)(f->shape[0] * C));
                off += f->shape[0];
                mmc_arena_release(mmc_ctx_arena(ctx), mk);
            }
            if (!st) st = place(e, ids, T, (int32_t)m->audio_token_id, all, "audio");
            break;
        }
        for (int k = 0; k < 2 && !st; k++) {
            int n = k ? media->n_videos : media->n_images;
            if (!n) continue;
            mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
            mmc_tensor *f;
            st = mmc_vision_forward(ctx, m->visual, k ? media->pixel_values_videos : media->pixel_values,
                                    k ? media->video_grid_thw : media->image_grid_thw, n, &f, NULL);
            if (!st) st = place(e, ids, T, (int32_t)(k ? m->video_token_id : m->image_token_id), mmc_contiguous(ctx, f),
                                k ? "video" : "image");
            else mmc_error_prefix(st, "%s", k ? "videos" : "images");
            mmc_arena_release(mmc_ctx_arena(ctx), mk);
        }
        if (st) goto done;
    }
    mmc_tensor *x = mmc_reshape(ctx, e, 3, MMC_SHAPE(1, T, C));
    mmc_tensor *cos, *sin;
    mmc_rope_table_mrope(ctx, pos, c->mrope_section, (int)c->head_dim, c->rope_theta, &cos, &sin);
    if (kv && (st = mmc_kv_cache_reserve(kv, kv->len + T))) goto done;
    mmc_attn_opts ao = {.causal = true};
    for (int l = 0; l < c->num_layers; l++)
        mmc_qwen2_layer_forward_infer(ctx, c, &m->lm->layers[l], x, cos, sin, &ao, kv, l);
    if (kv) kv->len += T;
    *hidden = mmc_rmsnorm(ctx, x, m->lm->norm, (float)c->rms_norm_eps);
done:
    mmc_set_grad_enabled(ctx, was);
    return st;
}

/* ------------------------------------------------------------------ decoder interface */
static mmc_status om_feed(mmc_ctx *ctx, mmc_omni_request *r, const int32_t *ids, int64_t n,
                          const mmc_omni_media *media, mmc_kv_cache *kv, float **logits) {
    mmc_tensor *h;
    mmc_status st = mmc_omni_forward(ctx, r->m, ids, n, media, kv, &r->rope_delta, &h);
    if (st) return st;
    mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, n - 1, 1));
    *logits = mmc_qwen2_logits(ctx, r->m->lm, last)->data;
    return MMC_OK;
}

static mmc_status om_prefill(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                             float **logits) {
    mmc_omni_request *r = self;
    return om_feed(ctx, r, ids, n, r->media, kv, logits);
}

static mmc_status om_decode(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits) {
    return om_feed(ctx, self, &token, 1, NULL, kv, logits);
}

mmc_decoder mmc_omni_decoder(mmc_omni_request *r) {
    mmc_decoder d = mmc_qwen2_decoder(r->m->lm);
    d.self = r;
    d.prefill = om_prefill;
    d.decode = om_decode;
    return d;
}
