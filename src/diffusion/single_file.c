/* single_file.c — the one-file checkpoints users download for Stable Diffusion 1.x and SDXL (the original
 * LDM / SGM layout in one .safetensors), read as diffusers 0.42's from_single_file converts them
 * (loaders/single_file_utils.py: convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint,
 * convert_ldm_clip_checkpoint, convert_open_clip_checkpoint):
 *
 *   model.diffusion_model.*              UNet: input_blocks / middle_block / output_blocks -> down_blocks /
 *                                        mid_block / up_blocks (the block of input i is (i - 1) / (layers + 1)),
 *                                        in_layers/out_layers/emb_layers/skip_connection -> norm1, conv1, norm2,
 *                                        conv2, time_emb_proj, conv_shortcut; time_embed, label_emb (text_time)
 *   first_stage_model.* (or vae.*)       AutoencoderKL: down.i.block.j, up.i (reversed), mid.block_1/2, and the
 *                                        mid attention's 1x1 convolutions q/k/v/proj_out -> linears to_q ... to_out.0
 *   cond_stage_model.transformer.*       SD 1.x CLIP-L, transformers' layout inside
 *   conditioner.embedders.0.transformer.* SDXL base CLIP-L (text_encoder)
 *   conditioner.embedders.1.model.*      SDXL base OpenCLIP bigG (text_encoder_2; embedders.0 in the refiner):
 *                                        resblocks.N.attn.in_proj_{weight,bias} split into q/k/v (rows of
 *                                        text_projection.shape[0] each), ln_1/ln_2/c_fc/c_proj renamed,
 *                                        text_projection [hidden, proj] transposed
 *
 * Each component comes out as an mmc_st of diffusers names viewing the file's mapping (the q/k/v splits and
 * the reshaped 1x1 convolutions are views too; only the transposed projection is a copy, kept here), handed to
 * the component's loader with its config.json. Keys outside the component prefixes (EMA copies, the
 * denoiser's sigmas, logit_scale, position_ids) are skipped as diffusers skips them; a key under the UNet or
 * VAE prefix that fits no rule is an error naming it. The configs and tokenizers are not in the file:
 * diffusers fetches them from the Hub repo it infers from the keys, mmc takes that folder (--config). */
#include "mmc_diffusion.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mmc_single_file {
    char path[1024];
    mmc_st *st;                      /* the file, mapped */
    mmc_single_file_kind kind;
    const char *te2_prefix;          /* the OpenCLIP prefix (SDXL base embedders.1, refiner embedders.0) */
    void *proj_t;                    /* the transposed OpenCLIP text_projection, built on first use */
    int64_t proj_shape[2];
};

static const char K_XL_BASE[] = "conditioner.embedders.1.model.positional_embedding";
static const char K_XL_REFINER[] = "conditioner.embedders.0.model.text_projection";
static const char K_V1[] = "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight";
static const char K_V2[] = "cond_stage_model.model.token_embedding.weight";
static const char K_UNET[] = "model.diffusion_model.input_blocks.0.0.weight";

const char *mmc_single_file_kind_name(mmc_single_file_kind k) {
    switch (k) {
    case MMC_SF_SDXL_BASE: return "SDXL base (StableDiffusionXLPipeline)";
    case MMC_SF_SDXL_REFINER: return "SDXL refiner (StableDiffusionXLImg2ImgPipeline)";
    case MMC_SF_SD1: return "Stable Diffusion 1.x (StableDiffusionPipeline)";
    }
    return "?";
}

mmc_status mmc_single_file_open(const char *path, mmc_single_file **out) {
    *out = NULL;
    mmc_st *st = NULL;
    mmc_status rc = mmc_st_open(path, &st);
    return rc ? rc : mmc_single_file_open_st(st, path, out);
}

mmc_status mmc_single_file_open_st(mmc_st *tensors, const char *path, mmc_single_file **out) {
    *out = NULL;
    mmc_single_file *sf = calloc(1, sizeof *sf);
    if (!sf) { mmc_st_close(tensors); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    snprintf(sf->path, sizeof sf->path, "%s", path);
    sf->st = tensors;
    mmc_status st = MMC_OK;
    if (!mmc_st_find(sf->st, K_UNET)) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: not a single-file Stable Diffusion checkpoint: no '%s' (the original "
                       "LDM / SGM layout; a diffusers folder is passed as the folder itself)", path, K_UNET);
        goto fail;
    }
    if (mmc_st_find(sf->st, K_XL_BASE)) sf->kind = MMC_SF_SDXL_BASE, sf->te2_prefix = "conditioner.embedders.1.model.";
    else if (mmc_st_find(sf->st, K_XL_REFINER))
        sf->kind = MMC_SF_SDXL_REFINER, sf->te2_prefix = "conditioner.embedders.0.model.";
    else if (mmc_st_find(sf->st, K_V1)) sf->kind = MMC_SF_SD1;
    else {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s", path, mmc_st_find(sf->st, K_V2)
                       ? "a Stable Diffusion 2.x checkpoint (OpenCLIP-H in cond_stage_model.model.*): mmc reads SD 1.x "
                         "and SDXL single files"
                       : "no text encoder mmc knows (expected conditioner.embedders.* for SDXL or "
                         "cond_stage_model.transformer.* for SD 1.x)");
        goto fail;
    }
    *out = sf;
    return MMC_OK;
fail:
    mmc_single_file_free(sf);
    return st;
}

void mmc_single_file_free(mmc_single_file *sf) {
    if (!sf) return;
    mmc_st_close(sf->st);
    free(sf->proj_t);
    free(sf);
}

mmc_single_file_kind mmc_single_file_get_kind(const mmc_single_file *sf) { return sf->kind; }
const char *mmc_single_file_path(const mmc_single_file *sf) { return sf->path; }

/* ------------------------------------------------------------------ helpers */
static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* "<int>." at *s: the number, *s moved past the dot; -1 if none */
static long take_index(const char **s) {
    const char *p = *s;
    if (*p < '0' || *p > '9') return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9' && v < 100000) v = 10 * v + (*p++ - '0');
    if (*p != '.') return -1;
    *s = p + 1;
    return v;
}

static mmc_status add(mmc_st *out, const char *name, const mmc_st_entry *e) {
    return mmc_st_add_view(out, name, e->dtype, e->ndim, e->shape, e->data);
}

/* the ResnetBlock2D parameter names: LDM's on the left */
static bool resnet_name(const char *rest, bool vae, char *buf, size_t n) {
    static const char *const unet[][2] = {{"in_layers.0.", "norm1."},  {"in_layers.2.", "conv1."},
                                          {"out_layers.0.", "norm2."}, {"out_layers.3.", "conv2."},
                                          {"emb_layers.1.", "time_emb_proj."}, {"skip_connection.", "conv_shortcut."}};
    static const char *const vaek[][2] = {{"norm1.", "norm1."}, {"conv1.", "conv1."}, {"norm2.", "norm2."},
                                          {"conv2.", "conv2."}, {"nin_shortcut.", "conv_shortcut."}};
    const int m = vae ? 5 : 6;
    for (int i = 0; i < m; i++) {
        const char *from = vae ? vaek[i][0] : unet[i][0], *to = vae ? vaek[i][1] : unet[i][1];
        if (starts(rest, from)) {
            snprintf(buf, n, "%s%s", to, rest + strlen(from));
            return true;
        }
    }
    return false;
}

/* ------------------------------------------------------------------ UNet */
static bool unet_key(const char *k, int lpb, char *o, size_t n) {
    char r[256];
    static const char *const top[][2] = {
        {"time_embed.0.", "time_embedding.linear_1."}, {"time_embed.2.", "time_embedding.linear_2."},
        {"label_emb.0.0.", "add_embedding.linear_1."}, {"label_emb.0.2.", "add_embedding.linear_2."},
        {"input_blocks.0.0.", "conv_in."}, {"out.0.", "conv_norm_out."}, {"out.2.", "conv_out."}};
    for (size_t i = 0; i < sizeof top / sizeof *top; i++)
        if (starts(k, top[i][0])) {
            snprintf(o, n, "%s%s", top[i][1], k + strlen(top[i][0]));
            return true;
        }
    const char *s = k;
    if (starts(s, "input_blocks.")) {
        s += strlen("input_blocks.");
        long i = take_index(&s), j = take_index(&s);
        if (i < 1 || j < 0) return false;
        const long b = (i - 1) / (lpb + 1), l = (i - 1) % (lpb + 1);
        if (j == 0 && starts(s, "op.")) snprintf(o, n, "down_blocks.%ld.downsamplers.0.conv.%s", b, s + 3);
        else if (j == 0 && resnet_name(s, false, r, sizeof r)) snprintf(o, n, "down_blocks.%ld.resnets.%ld.%s", b, l, r);
        else if (j == 1) snprintf(o, n, "down_blocks.%ld.attentions.%ld.%s", b, l, s);
        else return false;
        return true;
    }
    if (starts(s, "middle_block.")) {
        s += strlen("middle_block.");
        long j = take_index(&s);
        if (j == 1) snprintf(o, n, "mid_block.attentions.0.%s", s);
        else if ((j == 0 || j == 2) && resnet_name(s, false, r, sizeof r))
            snprintf(o, n, "mid_block.resnets.%ld.%s", j / 2, r);
        else return false;
        return true;
    }
    if (starts(s, "output_blocks.")) {
        s += strlen("output_blocks.");
        long i = take_index(&s), j = take_index(&s);
        if (i < 0 || j < 0) return false;
        const long b = i / (lpb + 1), l = i % (lpb + 1);
        if (j == 0 && resnet_name(s, false, r, sizeof r)) snprintf(o, n, "up_blocks.%ld.resnets.%ld.%s", b, l, r);
        else if ((j == 1 || j == 2) && starts(s, "conv.")) snprintf(o, n, "up_blocks.%ld.upsamplers.0.%s", b, s);
        else if (j == 1) snprintf(o, n, "up_blocks.%ld.attentions.%ld.%s", b, l, s);
        else return false;
        return true;
    }
    return false;
}

mmc_status mmc_single_file_unet(mmc_single_file *sf, const mmc_unet_config *cfg, mmc_st **out) {
    static const char P[] = "model.diffusion_model.";
    mmc_st *v = NULL;
    mmc_status st = mmc_st_new_view(&v);
    char name[320];
    for (int l = 1; l < cfg->levels && !st; l++)   /* diffusers' conversion takes one layers_per_block */
        if (cfg->layers_per_block[l] != cfg->layers_per_block[0])
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: the UNet config has layers_per_block differing per block, which "
                           "the LDM layout's numbering of input_blocks cannot be mapped for", sf->path);
    for (int i = 0; i < mmc_st_count(sf->st) && !st; i++) {
        const mmc_st_entry *e = mmc_st_at(sf->st, i);
        if (!starts(e->name, P)) continue;
        if (!unet_key(e->name + strlen(P), (int)cfg->layers_per_block[0], name, sizeof name))
            st = mmc_error(MMC_ERR_FORMAT, "%s: UNet tensor '%s' fits no rule of the LDM -> diffusers mapping (input_"
                           "blocks, middle_block, output_blocks, time_embed, label_emb, out); is this an SD 1.x / SDXL "
                           "checkpoint?", sf->path, e->name);
        else st = add(v, name, e);
    }
    if (st) { mmc_st_close(v); return st; }
    *out = v;
    return MMC_OK;
}

/* ------------------------------------------------------------------ VAE */
static bool vae_key(const char *k, int n_up, char *o, size_t n, bool *squeeze) {
    char r[256];
    *squeeze = false;
    static const char *const same[] = {"encoder.conv_in.", "encoder.conv_out.", "decoder.conv_in.", "decoder.conv_out.",
                                       "quant_conv.", "post_quant_conv."};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++)
        if (starts(k, same[i])) return snprintf(o, n, "%s", k), true;
    const char *side = starts(k, "encoder.") ? "encoder" : starts(k, "decoder.") ? "decoder" : NULL;
    if (!side) return false;
    const char *s = k + 8;
    if (starts(s, "norm_out.")) return snprintf(o, n, "%s.conv_norm_out.%s", side, s + 9), true;
    if (starts(s, "mid.block_1.") || starts(s, "mid.block_2.")) {
        if (!resnet_name(s + 12, true, r, sizeof r)) return false;
        return snprintf(o, n, "%s.mid_block.resnets.%c.%s", side, s[10] == '1' ? '0' : '1', r), true;
    }
    if (starts(s, "mid.attn_1.")) {
        static const char *const at[][2] = {{"norm.", "group_norm."}, {"q.", "to_q."}, {"k.", "to_k."},
                                            {"v.", "to_v."}, {"proj_out.", "to_out.0."}};
        s += strlen("mid.attn_1.");
        for (int i = 0; i < 5; i++)
            if (starts(s, at[i][0])) {
                *squeeze = i > 0;
                return snprintf(o, n, "%s.mid_block.attentions.0.%s%s", side, at[i][1], s + strlen(at[i][0])), true;
            }
        return false;
    }
    const bool enc = side[0] == 'e';
    if (!starts(s, enc ? "down." : "up.")) return false;
    s += enc ? 5 : 3;
    long i = take_index(&s);
    if (i < 0 || (!enc && i >= n_up)) return false;
    const long blk = enc ? i : n_up - 1 - i;     /* the decoder's up.i counts from the bottom */
    const char *bn = enc ? "down_blocks" : "up_blocks";
    if (starts(s, "block.")) {
        s += 6;
        long j = take_index(&s);
        if (j < 0 || !resnet_name(s, true, r, sizeof r)) return false;
        return snprintf(o, n, "%s.%s.%ld.resnets.%ld.%s", side, bn, blk, j, r), true;
    }
    const char *sm = enc ? "downsample.conv." : "upsample.conv.";
    if (starts(s, sm))
        return snprintf(o, n, "%s.%s.%ld.%s.0.conv.%s", side, bn, blk, enc ? "downsamplers" : "upsamplers",
                        s + strlen(sm)), true;
    return false;
}

mmc_status mmc_single_file_vae(mmc_single_file *sf, const mmc_vae_config *cfg, mmc_st **out) {
    const char *P = "first_stage_model.";
    bool any = false;
    for (int i = 0; i < mmc_st_count(sf->st) && !any; i++) any = starts(mmc_st_at(sf->st, i)->name, P);
    if (!any) P = "vae.";
    mmc_st *v = NULL;
    mmc_status st = mmc_st_new_view(&v);
    char name[320];
    int found = 0;
    for (int i = 0; i < mmc_st_count(sf->st) && !st; i++) {
        const mmc_st_entry *e = mmc_st_at(sf->st, i);
        if (!starts(e->name, P)) continue;
        found++;
        bool squeeze;
        if (!vae_key(e->name + strlen(P), (int)cfg->levels, name, sizeof name, &squeeze)) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: VAE tensor '%s' fits no rule of the LDM -> diffusers mapping", sf->path,
                           e->name);
            break;
        }
        mmc_st_entry w = *e;
        /* conv_attn_to_linear: a [C, C, 1, 1] (or [C, C, 1]) 1x1 convolution is the linear [C, C] */
        if (squeeze && !strstr(name, ".bias") && w.ndim > 2) {
            bool ones = true;
            for (int d = 2; d < w.ndim; d++) ones = ones && w.shape[d] == 1;
            if (ones) w.ndim = 2;
        }
        st = add(v, name, &w);
    }
    if (!st && !found)
        st = mmc_error(MMC_ERR_NOT_FOUND, "%s: no VAE in this file (no first_stage_model.* or vae.* tensors): a "
                       "UNet-only checkpoint needs a VAE of its own", sf->path);
    if (st) { mmc_st_close(v); return st; }
    *out = v;
    return MMC_OK;
}

/* ------------------------------------------------------------------ text encoders */
static mmc_status clip_hf(mmc_single_file *sf, const char *P, mmc_st **out) {
    mmc_st *v = NULL;
    mmc_status st = mmc_st_new_view(&v);
    int found = 0;
    for (int i = 0; i < mmc_st_count(sf->st) && !st; i++) {
        const mmc_st_entry *e = mmc_st_at(sf->st, i);
        if (!starts(e->name, P)) continue;
        const char *k = e->name + strlen(P);
        size_t L = strlen(k);
        if (L >= 12 && !strcmp(k + L - 12, "position_ids")) continue;   /* a buffer transformers does not load */
        found++;
        st = add(v, k, e);
    }
    if (!st && !found) st = mmc_error(MMC_ERR_NOT_FOUND, "%s: no tensors under '%s'", sf->path, P);
    if (st) { mmc_st_close(v); return st; }
    *out = v;
    return MMC_OK;
}

static mmc_status open_clip(mmc_single_file *sf, mmc_st **out) {
    const char *P = sf->te2_prefix;
    char key[320], name[320];
    snprintf(key, sizeof key, "%stext_projection", P);
    const mmc_st_entry *proj = mmc_st_find(sf->st, key);
    mmc_st *v = NULL;
    mmc_status st = mmc_st_new_view(&v);
    if (st) return st;
    int64_t C = -1;                                      /* convert_open_clip_checkpoint's text_proj_dim */
    if (proj) {
        if (proj->ndim != 2) {
            st = mmc_error(MMC_ERR_SHAPE, "%s: '%s' must be a matrix [hidden, projection]", sf->path, key);
            goto fail;
        }
        C = proj->shape[0];
        if (!sf->proj_t) {                               /* text_projection.weight = text_projection.T */
            const size_t es = mmc_dtype_size(proj->dtype);
            const int64_t R = proj->shape[0], K = proj->shape[1];
            if (!(sf->proj_t = malloc((size_t)(R * K) * es))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < K; c++)
                    memcpy((char *)sf->proj_t + (size_t)(c * R + r) * es, (const char *)proj->data + (size_t)(r * K + c) * es, es);
            sf->proj_shape[0] = K, sf->proj_shape[1] = R;
        }
        if ((st = mmc_st_add_view(v, "text_projection.weight", proj->dtype, 2, sf->proj_shape, sf->proj_t))) goto fail;
    }
    static const char *const top[][2] = {{"positional_embedding", "text_model.embeddings.position_embedding.weight"},
                                         {"token_embedding.weight", "text_model.embeddings.token_embedding.weight"},
                                         {"ln_final.weight", "text_model.final_layer_norm.weight"},
                                         {"ln_final.bias", "text_model.final_layer_norm.bias"}};
    for (int i = 0; i < 4 && !st; i++) {
        snprintf(key, sizeof key, "%s%s", P, top[i][0]);
        const mmc_st_entry *e = mmc_st_find(sf->st, key);
        if (e) st = add(v, top[i][1], e);
    }
    static const char *const ren[][2] = {{"ln_1.", "layer_norm1."}, {"ln_2.", "layer_norm2."},
                                         {"mlp.c_fc.", "mlp.fc1."}, {"mlp.c_proj.", "mlp.fc2."},
                                         {"attn.out_proj.", "self_attn.out_proj."}};
    char tp[300];
    snprintf(tp, sizeof tp, "%stransformer.resblocks.", P);
    for (int i = 0; i < mmc_st_count(sf->st) && !st; i++) {
        const mmc_st_entry *e = mmc_st_at(sf->st, i);
        if (!starts(e->name, tp)) continue;
        const char *s = e->name + strlen(tp);
        long layer = take_index(&s);
        if (layer < 0) continue;                           /* diffusers maps only what fits */
        const bool w = !strcmp(s, "attn.in_proj_weight"), b = !strcmp(s, "attn.in_proj_bias");
        if (w || b) {                                      /* rows [q; k; v] of text_proj_dim each */
            const int64_t rows = e->shape[0], D = C > 0 ? C : rows / 3;
            if (e->ndim != (w ? 2 : 1) || rows != 3 * D) {
                st = mmc_error(MMC_ERR_SHAPE, "%s: '%s' has %lld rows, expected 3 x %lld (q, k, v)", sf->path, e->name,
                               (long long)rows, (long long)D);
                break;
            }
            const size_t row = (size_t)(w ? e->shape[1] : 1) * mmc_dtype_size(e->dtype);
            const char qkv[3] = {'q', 'k', 'v'};
            for (int p = 0; p < 3 && !st; p++) {
                int64_t shape[2] = {D, w ? e->shape[1] : 0};
                snprintf(name, sizeof name, "text_model.encoder.layers.%ld.self_attn.%c_proj.%s", layer, qkv[p],
                         w ? "weight" : "bias");
                st = mmc_st_add_view(v, name, e->dtype, w ? 2 : 1, shape, (const char *)e->data + (size_t)(p * D) * row);
            }
            continue;
        }
        for (int r = 0; r < 5; r++)
            if (starts(s, ren[r][0])) {
                snprintf(name, sizeof name, "text_model.encoder.layers.%ld.%s%s", layer, ren[r][1], s + strlen(ren[r][0]));
                st = add(v, name, e);
                break;
            }
    }
    if (st) goto fail;
    *out = v;
    return MMC_OK;
fail:
    mmc_st_close(v);
    return st;
}

mmc_status mmc_single_file_text_encoder(mmc_single_file *sf, int which, mmc_st **out) {
    *out = NULL;
    if (which == 0) {
        if (sf->kind == MMC_SF_SDXL_REFINER)
            return mmc_error(MMC_ERR_NOT_FOUND, "%s: the SDXL refiner has no first text encoder", sf->path);
        return clip_hf(sf, sf->kind == MMC_SF_SD1 ? "cond_stage_model.transformer." : "conditioner.embedders.0.transformer.",
                       out);
    }
    if (sf->kind == MMC_SF_SD1)
        return mmc_error(MMC_ERR_NOT_FOUND, "%s: a Stable Diffusion 1.x checkpoint has one text encoder", sf->path);
    return open_clip(sf, out);
}
