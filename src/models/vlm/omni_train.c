/* omni_train.c — training side of the Qwen2.5-Omni thinker (omni.c), mirroring what
 * Qwen2_5OmniThinkerForConditionalGeneration.forward(input_ids, input_features,
 * feature_attention_mask, pixel_values, image_grid_thw, labels) computes in training
 * (transformers 5.x, models/qwen2_5_omni/modeling_qwen2_5_omni.py) and how save_pretrained and
 * PEFT name things:
 *
 *   x = embed_tokens(ids)                                                      [B, T, C]
 *   x[<|AUDIO|> rows] = audio_tower(features of each audio's real frames)      [Na_tok, C]
 *   x[<|IMAGE|> rows] = visual(pixel_values, image_grid_thw)                   [Ni_tok, C]
 *   loss = ForCausalLMLoss(lm_head(norm(Qwen2(x, TMRoPE positions))), labels)
 *
 * The positions are get_rope_index's per row (mmc_omni_rope_index on the row's own audios and
 * images). The audio encoder and the vision tower are frozen by default and then run without a tape;
 * model.freeze, when given, decides (as for LLaVA): without `audio` the audio encoder trains
 * (omni_audio.c records its whole forward), without `vision_tower` / `merger` the vision tower / merger
 * do (each block's fused qkv is then rebuilt on the tape from the q / k / v views the trainer holds, so
 * their gradients land on the parameters it updates). LoRA reaches the LM's linears, the audio
 * encoder's and the vision tower's (PEFT module names model.language_model.layers.N.*,
 * model.audio_tower.layers.N.*, model.visual.blocks.N.attn.{q,k,v,proj} / .mlp.* and
 * model.visual.merger.mlp.{0,2}, as on the live thinker; q / k / v adapt slices of the fused qkv). Packed rows and videos are not supported for training yet.
 * Under tensor parallelism the encoders run whole on every rank of the group: each encodes every clip
 * and image, or, under a per-modality plan (m->share: parallel.audio / parallel.vision), its share.
 *
 * Parameter names are save_pretrained's for the thinker: model.*, lm_head.weight,
 * audio_tower.*, visual.* (the vision tower's fused qkv exposed as Omni's separate q / k / v
 * rows through views, and the unused audio_tower.audio_bos_eos_token copied, so a full checkpoint
 * is the thinker layout transformers loads with nothing missing). */
#include "mmc_omni.h"
#include "mmc_hetero.h"
#include "mmc_vl.h"
#include "mmc_lora.h"
#include "mmc_trainer.h"
#include "mmc_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_status add_name(char **names, int i, const char *a, const char *b) {
    size_t len = strlen(a) + strlen(b) + 1;
    if (!(names[i] = malloc(len))) return mmc_error(MMC_ERR_OOM, "out of memory");
    snprintf(names[i], len, "%s%s", a, b);
    return MMC_OK;
}

mmc_status mmc_omni_params(mmc_omni *m, mmc_tensor ***params, char ***names, mmc_tensor ***views, int *n,
                           int *n_views) {
    *params = NULL, *names = NULL, *views = NULL, *n = 0, *n_views = 0;
    if (m->full_checkpoint)
        return mmc_error(MMC_ERR_UNSUPPORTED, "omni training: give the thinker (model_type qwen2_5_omni_thinker), "
                         "not a full qwen2_5_omni checkpoint");
    mmc_tensor **ap;
    char (*an)[256];
    int na;
    mmc_omni_audio_params(m->audio, &ap, &an, &na);
    const mmc_vision *v = m->visual;
    int nq = 0;
    for (int i = 0; i < v->n_params; i++) nq += strstr(v->param_names[i], "attn.qkv.") != NULL;
    /* audio_tower.audio_bos_eos_token (an embedding the thinker's forward does not use): kept as it was */
    const char *bos_eos = "audio_tower.audio_bos_eos_token.weight";
    const mmc_st_entry *be = m->st ? mmc_st_find(m->st, bos_eos) : NULL;
    const bool fresh_be = !m->st;   /* a fresh thinker (mmc_omni_new): the embedding saved as zeros */
    const int total = m->lm->n_params + na + v->n_params + 2 * nq + (be != NULL || fresh_be);
    mmc_tensor **p = calloc((size_t)total + 1, sizeof *p), **vw = calloc((size_t)(3 * nq) + 2, sizeof *vw);
    char **nm = calloc((size_t)total + 1, sizeof *nm);
    mmc_status st = MMC_OK;
    int k = 0, nv = 0;
    if (!p || !nm || !vw) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    for (int i = 0; i < m->lm->n_params && !st; i++, k++) {
        const char *s = m->lm->param_names[i];
        p[k] = m->lm->params[i];
        st = strcmp(s, "lm_head.weight") ? add_name(nm, k, "model.", s) : add_name(nm, k, "", s);
    }
    for (int i = 0; i < na && !st; i++, k++) {
        p[k] = ap[i];
        st = add_name(nm, k, "", an[i]);
    }
    for (int i = 0; i < v->n_params && !st; i++) {
        const char *pn = v->param_names[i];
        mmc_tensor *t = v->params[i];
        const char *q = strstr(pn, "attn.qkv.");
        if (!q) {
            p[k] = t;
            st = add_name(nm, k++, "visual.", pn);
            continue;
        }
        /* rows [q; k; v] of qkv.weight [3C, C] / qkv.bias [3C] as three views */
        int64_t shape[2] = {t->shape[0] / 3, t->ndim > 1 ? t->shape[1] : 1};
        const int64_t part = mmc_numel(t) / 3;
        for (int j = 0; j < 3 && !st; j++, k++) {
            mmc_tensor *w = mmc_tensor_wrap(t->dtype, t->ndim, shape, (char *)t->data + (size_t)(j * part) *
                                            mmc_dtype_size(t->dtype));
            if (!w) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            vw[nv++] = w;
            p[k] = w;
            char buf[160];
            snprintf(buf, sizeof buf, "visual.%.*sattn.%c.%s", (int)(q - pn), pn, "qkv"[j], q + strlen("attn.qkv."));
            st = add_name(nm, k, "", buf);
        }
    }
    if (!st && (be || fresh_be)) {
        mmc_tensor *e = be ? mmc_tensor_new(MMC_F32, be->ndim, be->shape)
                           : mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(2, m->lm->cfg.hidden_size));
        if (!e) st = mmc_error(MMC_ERR_OOM, "out of memory");
        else vw[nv++] = e, p[k] = e;
        if (!st && be) st = mmc_st_read_into(m->st, bos_eos, e);
        if (!st && !be) memset(e->data, 0, mmc_nbytes(e));
        if (!st) st = add_name(nm, k++, "", bos_eos);
    }
    if (st) goto fail;
    *params = p, *names = nm, *views = vw, *n = k, *n_views = nv;
    m->qkv_views = vw, m->n_qkv_views = 3 * nq;   /* the first 3 * nq views, in order (mmc_omni_batch_loss) */
    return MMC_OK;
fail:
    for (int i = 0; nm && i < total; i++) free(nm[i]);
    for (int i = 0; vw && i < nv; i++) mmc_tensor_free(vw[i]);
    free(nm);
    free(vw);
    free(p);
    return st;
}

/* The vision tower's linears under the live thinker's names: model.visual.blocks.N.attn.{q,k,v,proj},
 * .mlp.{gate,up,down}_proj, model.visual.merger.mlp.{0,2}. q / k / v are hosts without weights, the
 * parts of the block's fused qkv (mmc_nn_linear adds their adapters to its q / k / v slices). */
static mmc_status vision_linears(mmc_omni *m, mmc_module_list *out) {
    mmc_vision *v = m->visual;
    const int64_t depth = v->cfg.depth;
    if (!m->vis_parts) {
        if (!(m->vis_parts = calloc((size_t)(3 * depth), sizeof *m->vis_parts)))
            return mmc_error(MMC_ERR_OOM, "out of memory");
        for (int64_t l = 0; l < depth; l++) {
            mmc_linear_w *qkv = &v->blocks[l].qkv;
            for (int j = 0; j < 3; j++)
                m->vis_parts[3 * l + j] = (mmc_linear_w){.out_features = qkv->out_features / 3,
                                                         .in_features = qkv->in_features};
            qkv->parts = m->vis_parts + 3 * l, qkv->n_parts = 3;
        }
    }
    static const char *const nm[7] = {"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.gate_proj", "mlp.up_proj",
                                      "mlp.down_proj"};
    char name[MMC_MODULE_NAME];
    mmc_status st = MMC_OK;
    for (int64_t l = 0; l < depth && !st; l++) {
        mmc_vision_block *b = &v->blocks[l];
        mmc_linear_w *ls[7] = {&m->vis_parts[3 * l], &m->vis_parts[3 * l + 1], &m->vis_parts[3 * l + 2], &b->proj,
                               &b->gate, &b->up, &b->down};
        for (int j = 0; j < 7 && !st; j++) {
            snprintf(name, sizeof name, "model.visual.blocks.%lld.%s", (long long)l, nm[j]);
            st = mmc_module_list_add(out, ls[j], name);
        }
    }
    if (!st) st = mmc_module_list_add(out, &v->mlp0, "model.visual.merger.mlp.0");
    if (!st) st = mmc_module_list_add(out, &v->mlp2, "model.visual.merger.mlp.2");
    return st;
}

mmc_status mmc_omni_linears(mmc_omni *m, mmc_module_list *out) {
    mmc_status st = mmc_qwen2_linears(m->lm, "model.language_model.", out);
    if (!st) st = mmc_omni_audio_linears(m->audio, "model.audio_tower.", out);
    return st ? st : vision_linears(m, out);
}

static bool lora_trainable(const mmc_linear_w *l) {
    return l->lora && (mmc_requires_grad(l->lora->A) || mmc_requires_grad(l->lora->B));
}

/* Does a trainable adapter sit on the vision tower (blocks or merger)? */
static bool vision_lora_trainable(const mmc_omni *m) {
    const mmc_vision *v = m->visual;
    if (lora_trainable(&v->mlp0) || lora_trainable(&v->mlp2)) return true;
    for (int64_t l = 0; l < v->cfg.depth; l++) {
        const mmc_vision_block *b = &v->blocks[l];
        const mmc_linear_w *ls[4] = {&b->proj, &b->gate, &b->up, &b->down};
        for (int j = 0; j < 4; j++)
            if (lora_trainable(ls[j])) return true;
        for (int j = 0; j < b->qkv.n_parts; j++)
            if (lora_trainable(&b->qkv.parts[j])) return true;
    }
    return false;
}

mmc_status mmc_omni_attach_adapter(mmc_omni *m, const char *adapter_dir) {
    if (m->lm->adapter) return mmc_error(MMC_ERR_INVALID, "%s: the model already has an adapter", adapter_dir);
    if (m->full_checkpoint)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: adapters attach to a thinker checkpoint (qwen2_5_omni_thinker), "
                         "not a full qwen2_5_omni one", adapter_dir);
    mmc_module_list ml = {0};
    mmc_status st = mmc_omni_linears(m, &ml);
    if (!st) st = mmc_lora_load(adapter_dir, &ml, false, &m->lm->adapter);
    mmc_module_list_free(&ml);
    return st;
}

/* Rows i of x [B*T, C] at the positions where ids == tok, replaced by f [n, C] in order. */
static mmc_tensor *scatter_tok(mmc_ctx *ctx, mmc_tensor *x, const int32_t *ids, int64_t BT, int32_t tok,
                               mmc_tensor *f) {
    mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(f->shape[0]));
    int64_t k = 0;
    for (int64_t i = 0; i < BT; i++)
        if (ids[i] == tok) ((int64_t *)idx->data)[k++] = i;
    return mmc_scatter_rows(ctx, x, idx, f);
}

/* The batch's n audio clips through the encoder -> *all [n_tok, C] in clip order; on the tape when the
 * encoder trains (a frozen one runs without: no backward). Under a per-modality plan (m->share with
 * share_audio, mmc_hetero.h) the clips are shared out over the group by mel frames — the encoder's
 * cost is linear in them: convolutions over every frame, attention inside n_window chunks — each
 * member encodes its contiguous run and the features are all-gathered (backward: this rank's rows of
 * the gradient, the encoder's weight gradients then partial and summed over the group by the
 * trainer). The clips are checked on every member first, so none fails alone inside the collective. */
static mmc_status audio_encode(mmc_ctx *ctx, mmc_omni *m, const mmc_omni_audio_in *ain, int n, int64_t n_tok,
                               mmc_tensor **all) {
    const int64_t C = m->lm->cfg.hidden_size;
    mmc_comm *g = m->share && m->share_audio && mmc_comm_size(m->share) > 1 ? m->share : NULL;
    const int P = g ? mmc_comm_size(g) : 1;
    int first = 0, cnt = n;
    int64_t *rows = NULL;
    if (g) {
        int64_t *cost = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)(n + P));
        rows = cost + n;
        for (int a = 0; a < n; a++) {
            if (ain[a].frames < 1 || ain[a].frames > ain[a].stride)
                return mmc_error(MMC_ERR_INVALID, "clip %d: %lld real frames of %lld", a, (long long)ain[a].frames,
                                 (long long)ain[a].stride);
            cost[a] = ain[a].frames;
        }
        for (int k = 0; k < P; k++) {
            int f, c;
            mmc_hetero_share(cost, n, P, k, &f, &c);
            rows[k] = 0;
            for (int a = f; a < f + c; a++) rows[k] += mmc_omni_audio_tokens(ain[a].frames);
            if (k == mmc_comm_rank(g)) first = f, cnt = c;
        }
    }
    const bool tape = mmc_grad_enabled(ctx) && mmc_omni_audio_trainable(m->audio);
    int64_t mine = 0;   /* this rank's rows */
    for (int a = first; a < first + cnt; a++) mine += mmc_omni_audio_tokens(ain[a].frames);
    mmc_tensor *local = NULL;                                                           /* [mine, C] */
    mmc_tensor **fs = tape && cnt ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *fs * (size_t)cnt) : NULL;
    if (!tape || !cnt) local = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(mine, C));
    bool was = mmc_set_grad_enabled(ctx, tape);
    mmc_status st = MMC_OK;
    int64_t off = 0;
    for (int a = first; a < first + cnt && !st; a++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *f;
        st = mmc_omni_audio_forward(ctx, m->audio, ain[a].feats, ain[a].stride, ain[a].frames, &f);
        if (st) break;
        if (g) m->share_clips++, m->share_frames += ain[a].frames;
        if (tape) {
            fs[a - first] = f;
        } else {
            memcpy((float *)local->data + off * C, f->data, sizeof(float) * (size_t)(f->shape[0] * C));
            off += f->shape[0];
            mmc_arena_release(mmc_ctx_arena(ctx), mk);
        }
    }
    if (g) MMC_CHECK(!st, "audio encoder on clips %d..%d of this batch (checked before): %s", first, first + cnt - 1,
                     mmc_last_error());
    if (!st && tape && cnt) local = mmc_omni_cat_rows(ctx, fs, cnt);
    if (!st && g) local = mmc_hetero_gather_rows(ctx, g, local, rows);
    mmc_set_grad_enabled(ctx, was);
    if (st) return st;
    MMC_CHECK(local->shape[0] == n_tok, "audio features %lld rows, %lld tokens", (long long)local->shape[0],
              (long long)n_tok);
    *all = local;
    return MMC_OK;
}

mmc_status mmc_omni_batch_loss(mmc_ctx *ctx, mmc_omni *m, const mmc_batch *b, double scale, mmc_tensor **loss,
                               int64_t *n_scored) {
    *loss = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    const int64_t B = b->B, T = b->T, BT = B * T, C = c->hidden_size;
    const int32_t at = (int32_t)m->audio_token_id, it = (int32_t)m->image_token_id;
    if (b->cu_seqlens) return mmc_error(MMC_ERR_UNSUPPORTED, "omni training: packed rows are not supported yet "
                                        "(set data.packing: false)");
    if (b->n_videos) return mmc_error(MMC_ERR_UNSUPPORTED, "omni training: videos are not supported yet");
    int64_t n_at = 0, n_it = 0;
    for (int64_t i = 0; i < BT; i++) {
        int32_t t = b->input_ids[i];
        if (t < 0 || t >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "token %d at position %lld is outside the vocabulary [0, %lld)", t,
                             (long long)i, (long long)c->vocab_size);
        n_at += t == at, n_it += t == it;
    }
    mmc_omni_audio_in *ain = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *ain * (size_t)(b->n_audios + 1));
    int64_t want_at = 0, want_it = 0;
    const int64_t ms = m->visual->cfg.spatial_merge_size;
    for (int a = 0; a < b->n_audios; a++) {
        ain[a] = (mmc_omni_audio_in){.feats = b->audio_feats + (size_t)a * (size_t)(b->audio_mels * b->audio_stride),
                                     .stride = b->audio_stride, .frames = b->audio_frames[a]};
        want_at += mmc_omni_audio_tokens(b->audio_frames[a]);
    }
    for (int i = 0; i < b->n_images; i++)
        want_it += b->image_grid_thw[3 * i] * (b->image_grid_thw[3 * i + 1] / ms) * (b->image_grid_thw[3 * i + 2] / ms);
    if (n_at != want_at || n_it != want_it)
        return mmc_error(MMC_ERR_INVALID, "the batch has %lld <|AUDIO|> and %lld <|IMAGE|> tokens for %d audios (%lld "
                         "features) and %d images (%lld features)", (long long)n_at, (long long)n_it, b->n_audios,
                         (long long)want_at, b->n_images, (long long)want_it);
    if (b->n_audios && b->audio_mels != mmc_omni_audio_mels(m->audio))
        return mmc_error(MMC_ERR_SHAPE, "the audio features have %lld mel bins, the audio encoder takes %lld (the "
                         "feature extractor of the model directory?)", (long long)b->audio_mels,
                         (long long)mmc_omni_audio_mels(m->audio));

    /* TMRoPE positions per row, over the row's own audios and images (they are in token order) */
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, T));                    /* [3, B, T] */
    int64_t *row = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)(3 * T));
    int a0 = 0, i0 = 0;
    for (int64_t r = 0; r < B; r++) {
        const int32_t *ids = b->input_ids + r * T;
        int na = 0, ni = 0;
        for (int64_t t = 0; t < T; t++) {   /* runs: every audio / image is wrapped in its bos / eos */
            bool start = t == 0 || ids[t - 1] != ids[t];
            na += start && ids[t] == at, ni += start && ids[t] == it;
        }
        if (a0 + na > b->n_audios || i0 + ni > b->n_images)
            return mmc_error(MMC_ERR_INVALID, "row %lld: more audio / image runs than the batch's media", (long long)r);
        mmc_omni_media md = {.audios = ain + a0, .n_audios = na, .image_grid_thw = b->image_grid_thw + 3 * i0,
                             .n_images = ni};
        mmc_status st = mmc_omni_rope_index(m, ids, T, &md, row, NULL);
        if (st) return mmc_error_prefix(st, "row %lld", (long long)r);
        for (int k = 0; k < 3; k++) memcpy((int64_t *)pos->data + (k * B + r) * T, row + k * T, sizeof(int64_t) * (size_t)T);
        a0 += na, i0 += ni;
    }

    mmc_tensor *idt = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));                       /* [B, T] */
    memcpy(idt->data, b->input_ids, (size_t)BT * sizeof(int32_t));
    mmc_tensor *x = mmc_reshape(ctx, mmc_contiguous(ctx, mmc_qwen2_embed(ctx, m->lm, idt)), 2, MMC_SHAPE(BT, C));
    mmc_status st = MMC_OK;
    if (b->n_audios) {   /* the audio encoder, one audio at a time; on the tape when it trains */
        mmc_tensor *all = NULL;                                                         /* [Na_tok, C] */
        st = audio_encode(ctx, m, ain, b->n_audios, want_at, &all);
        if (st) return mmc_error_prefix(st, "audio encoder");
        x = scatter_tok(ctx, x, b->input_ids, BT, at, all);                             /* [B*T, C] */
    }
    if (b->n_images) {   /* the vision tower; on the tape when it (or its merger) trains */
        mmc_tensor *px = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(b->n_patches, b->patch_dim));     /* [Np, P] */
        memcpy(px->data, b->pixel_values, mmc_nbytes(px));
        mmc_vision *v = m->visual;
        bool tape = false;
        for (int i = 0; i < v->n_params && !tape; i++)
            tape = !strstr(v->param_names[i], "attn.qkv.") && mmc_requires_grad(v->params[i]);
        for (int i = 0; i < m->n_qkv_views && !tape; i++) tape = mmc_requires_grad(m->qkv_views[i]);
        bool lora = vision_lora_trainable(m);   /* adapters on a frozen tower: its forward on the tape too */
        tape = (tape || lora) && mmc_grad_enabled(ctx);
        if (tape && v->recompute) return mmc_error(MMC_ERR_UNSUPPORTED, "omni training: activation checkpointing of "
                                                   "a trainable vision tower is not supported yet");
        /* trained, the fused qkv of each block is the concatenation of its q / k / v parameters (the
         * views the trainer updates, which share the fused storage), so their gradients reach them */
        const size_t n_slots = (size_t)(2 * v->cfg.depth + 1);
        mmc_tensor ***slots = tape ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *slots * n_slots) : NULL;
        mmc_tensor **orig = tape ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *orig * n_slots) : NULL;
        int n_sw = 0;
        for (int i = 0; tape && i + 2 < m->n_qkv_views; i += 3) {
            mmc_tensor **q = m->qkv_views + i;
            for (int64_t l = 0; l < v->cfg.depth; l++) {
                mmc_linear_w *lw = &v->blocks[l].qkv;
                mmc_tensor **slot = lw->w && lw->w->data == q[0]->data   ? &lw->w
                                    : lw->b && lw->b->data == q[0]->data ? &lw->b
                                                                         : NULL;
                if (!slot) continue;
                slots[n_sw] = slot, orig[n_sw++] = *slot;
                *slot = mmc_reshape(ctx, mmc_concat(ctx, q, 3, 0), (*slot)->ndim, (*slot)->shape);
                break;
            }
        }
        mmc_tensor *fi = NULL;                                                          /* [Ni_tok, C] */
        if (!tape) fi = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(want_it, C));
        bool was = mmc_set_grad_enabled(ctx, tape);
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *f;
        st = m->share && m->share_vision && mmc_comm_size(m->share) > 1
                 ? mmc_vision_forward_shared(ctx, m->share, v, px, b->image_grid_thw, b->n_images, &f, &m->share_images,
                                             &m->share_patches)
                 : mmc_vision_forward(ctx, v, px, b->image_grid_thw, b->n_images, &f, NULL);
        for (int i = 0; i < n_sw; i++) *slots[i] = orig[i];   /* the fused tensors back */
        if (!st && mmc_numel(f) != want_it * C)
            st = mmc_error(MMC_ERR_SHAPE, "the vision tower gave %lld values for %lld image tokens",
                           (long long)mmc_numel(f), (long long)want_it);
        if (!st && tape) fi = mmc_reshape(ctx, mmc_contiguous(ctx, f), 2, MMC_SHAPE(want_it, C));
        if (!st && !tape) memcpy(fi->data, mmc_contiguous(ctx, f)->data, sizeof(float) * (size_t)(want_it * C));
        if (!tape) mmc_arena_release(mmc_ctx_arena(ctx), mk);
        mmc_set_grad_enabled(ctx, was);
        if (st) return mmc_error_prefix(st, "images");
        x = scatter_tok(ctx, x, b->input_ids, BT, it, fi);                              /* [B*T, C] */
    }
    x = mmc_reshape(ctx, x, 3, MMC_SHAPE(B, T, C));                                     /* [B, T, C] */
    mmc_tensor *cos, *sin;
    mmc_rope_table_mrope(ctx, pos, c->mrope_section, (int)c->head_dim, c->rope_theta, &cos, &sin);
    mmc_attn_opts ao = {.causal = true};
    x = mmc_qwen2_forward(ctx, m->lm, x, cos, sin, &ao, NULL);                          /* [B, T, C] */
    *loss = mmc_hidden_causal_lm_loss(ctx, m->lm, x, b, scale, n_scored);                /* (scored rows only) */
    return MMC_OK;
}
