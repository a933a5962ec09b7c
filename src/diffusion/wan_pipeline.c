/* wan_pipeline.c — text -> video with a WanPipeline folder (Wan2.1 T2V), mirroring diffusers'
 * pipelines/wan/pipeline_wan.py:
 *
 *   prompt_clean (html.unescape twice, whitespace runs to one space, strip); the tokenizer padded
 *        and truncated to max_sequence_length (512 in diffusers; EOS appended); UMT5EncoderModel
 *        with the attention mask; the states past each prompt's own tokens replaced by zeros
 *                                                                   -> [B, max_sequence_length, d]
 *   latents [B, 16, (frames - 1) / 4 + 1, height / 8, width / 8] (VAE factors from vae/config.json)
 *   UniPCMultistepScheduler.set_timesteps(n) (flow sigmas shifted by flow_shift); at each step the
 *        transformer on the latents with the integer timestep t (not / 1000); classifier-free
 *        guidance (guidance > 1): noise_uncond + guidance * (noise_text - noise_uncond), both passes
 *        batched here as [negative; positive]; then scheduler.step
 *
 *   video = AutoencoderKLWan.decode(latents / (1 / latents_std) + latents_mean), then
 *        VideoProcessor.postprocess_video: x / 2 + 0.5 clamped, frames first      [B, F, 3, H, W]
 *
 * Image to video (WanImageToVideoPipeline, pipelines/wan/pipeline_wan_i2v.py, Wan2.1 I2V):
 *
 *   encode_image: CLIPImageProcessor (transformers 5's default torchvision backend) then
 *        CLIPVisionModel's hidden_states[-2]                         -> image_embeds [1, S_img, image_dim]
 *   prepare_latents: the image resized to height x width (VaeImageProcessor: Pillow's lanczos, x / 255,
 *        2x - 1); video_condition = [image, zeros x (frames - 1)] [3, frames, H, W]; vae.encode(...).mode(),
 *        normalised (z - mean) * (1 / std); the mask: 1 on the first latent frame, 0 after, in
 *        scale_factor_temporal channels (the first frame repeated 4 times, folded into channels)
 *                                        -> condition [1, 4 + z_dim, t, h, w]
 *   each step: the transformer on cat([latents, condition], channels) with the image states (the same
 *        for the negative pass); latents have z_dim channels (the transformer's out_channels).
 *   first-last-frame (Wan2.1 FLF2V, `last_image`, a transformer with pos_embed_seq_len): encode_image of
 *        [first, last] (the transformer takes them as [1, 2 S_img, image_dim]); the clip [first, zeros,
 *        last] and the mask 1 on both given pixel frames (folded as above: the last latent frame's mask
 *        channels are 0, 0, 0, 1).
 *
 * The text encoder loads inside encode_prompt and is freed before it returns (so is the image
 * encoder in encode_image); the transformer is freed before the VAE decodes. */
#include "mmc_wan_t2v.h"
#include "mmc_encoders.h"
#include "mmc_llava.h"
#include "mmc_lora.h"
#include "mmc_tokenizer.h"
#include "mmc_vlproc.h"
#include "pipe_util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mmc_wan_pipeline {
    mmc_diffusers_dir dir;
    mmc_wan_config tr_cfg;
    mmc_nsched sched;
    mmc_wan *transformer;
    bool borrowed;                    /* the transformer is the caller's (training's validation videos) */
    mmc_wan_vae *vae;
    mmc_lora_set *lora;
    int vae_spatial, vae_temporal;
    int64_t z_dim;                    /* the VAE's latent channels */
    bool i2v;                         /* WanImageToVideoPipeline */
    mmc_clip_proc clip_proc;          /* I2V: image_processor/ */
    char path[4][1024];               /* transformer, vae, scheduler, text_encoder */
    char tok_path[1024];
    char enc_path[1024];              /* I2V: image_encoder/ */
};
enum { S_TR, S_VAE, S_SCHED, S_TE };

static mmc_status read_json(const char *dir, const char *file, mmc_json **j) {
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return mmc_json_load(p, j);
}

/* WanImageToVideoPipeline's extra parts: Wan2.1's CLIP image branch (Wan2.2's expand_timesteps form,
 * with no image encoder, is refused), the image processor's settings, the channel arithmetic. */
static mmc_status i2v_open(mmc_wan_pipeline *p, const char *dir) {
    mmc_json *j = NULL;
    bool expand = false;
    mmc_status st = read_json(dir, "model_index.json", &j);
    if (!st) st = mmc_json_bool(j, "expand_timesteps", false, &expand);
    mmc_json_free(j);
    if (st) return mmc_error_prefix(st, "%s/model_index.json: ", dir);
    if (expand)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: expand_timesteps (Wan2.2's image-to-video, the first frame as a "
                         "clean latent) is not supported yet", dir);
    const mmc_diffusers_component *ie = mmc_diffusers_find(&p->dir, "image_encoder"),
                                  *ip = mmc_diffusers_find(&p->dir, "image_processor");
    if (!ie || !ie->present || !ip || !ip->present || p->tr_cfg.image_dim <= 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: this WanImageToVideoPipeline has no CLIP image branch (image_encoder, "
                         "image_processor and the transformer's image_dim): only Wan2.1's image-to-video is supported", dir);
    mmc_diffusers_path(&p->dir, "image_encoder", "", p->enc_path, sizeof p->enc_path);
    char pp[1024];
    mmc_diffusers_path(&p->dir, "image_processor", "", pp, sizeof pp);
    mmc_clip_proc_default(&p->clip_proc);
    if ((st = mmc_clip_proc_load_dir(pp, &p->clip_proc, NULL, 0))) return st;
    p->clip_proc.resize_mode = MMC_VLPROC_RESIZE_TORCH;   /* transformers 5's CLIPImageProcessor */
    if (p->tr_cfg.in_channels != 2 * p->z_dim + p->vae_temporal || p->tr_cfg.out_channels != p->z_dim)
        return mmc_error(MMC_ERR_FORMAT, "%s: the transformer takes %lld channels and gives %lld; image-to-video needs "
                         "%lld in (latents, %d mask channels, the image's latents) and %lld out (the VAE's z_dim)", dir,
                         (long long)p->tr_cfg.in_channels, (long long)p->tr_cfg.out_channels,
                         (long long)(2 * p->z_dim + p->vae_temporal), p->vae_temporal, (long long)p->z_dim);
    return MMC_OK;
}

mmc_status mmc_wan_pipeline_open(const char *dir, mmc_wan_pipeline **out) {
    *out = NULL;
    mmc_wan_pipeline *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_json *j = NULL;
    mmc_status st = mmc_diffusers_open(dir, &p->dir);
    if (st) goto fail;
    p->i2v = !strcmp(p->dir.pipeline, "WanImageToVideoPipeline");
    if (strcmp(p->dir.pipeline, "WanPipeline") != 0 && !p->i2v) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: pipeline %s is not a WanPipeline or WanImageToVideoPipeline", dir,
                       p->dir.pipeline);
        goto fail;
    }
    const mmc_diffusers_component *t2 = mmc_diffusers_find(&p->dir, "transformer_2");
    if (t2 && t2->present) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: a transformer_2 (Wan2.2's two-expert denoising) is not supported yet",
                       dir);
        goto fail;
    }
    static const char *const names[] = {"transformer", "vae", "scheduler", "text_encoder"};
    for (int i = 0; i < 4; i++) mmc_diffusers_path(&p->dir, names[i], "", p->path[i], sizeof p->path[i]);
    mmc_diffusers_path(&p->dir, "tokenizer", "", p->tok_path, sizeof p->tok_path);
    if ((st = read_json(p->path[S_TR], "config.json", &j))) goto fail;
    st = mmc_wan_config_read(j, "transformer/config.json", &p->tr_cfg);
    mmc_json_free(j), j = NULL;
    if (st) goto fail;
    /* the VAE's scale factors as WanPipeline reads them (scale_factor_temporal / _spatial, 4 / 8) */
    if ((st = read_json(p->path[S_VAE], "config.json", &j))) goto fail;
    int64_t ft = 4, fs = 8;
    if ((st = mmc_json_int(j, "scale_factor_temporal", 4, &ft)) || (st = mmc_json_int(j, "scale_factor_spatial", 8, &fs)) ||
        (st = mmc_json_int(j, "z_dim", 16, &p->z_dim))) {
        st = mmc_error_prefix(st, "vae/config.json: ");
        goto fail;
    }
    mmc_json_free(j), j = NULL;
    if (ft < 1 || ft > 64 || fs < 1 || fs > 64) {
        st = mmc_error(MMC_ERR_FORMAT, "%s/vae/config.json: scale_factor_temporal %lld / scale_factor_spatial %lld must "
                       "be in [1, 64]", dir, (long long)ft, (long long)fs);
        goto fail;
    }
    p->vae_temporal = (int)ft, p->vae_spatial = (int)fs;
    if (p->i2v && (st = i2v_open(p, dir))) goto fail;
    if ((st = mmc_nsched_load(p->path[S_SCHED], &p->sched))) goto fail;
    *out = p;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_wan_pipeline_free(p);
    return st;
}

void mmc_wan_pipeline_free(mmc_wan_pipeline *p) {
    if (!p) return;
    mmc_lora_free(p->lora);
    if (!p->borrowed) mmc_wan_free(p->transformer);
    mmc_wan_vae_free(p->vae);
    mmc_nsched_free(&p->sched);
    free(p);
}

void mmc_wan_pipeline_release_transformer(mmc_wan_pipeline *p) {
    mmc_lora_free(p->lora);
    p->lora = NULL;
    if (!p->borrowed) mmc_wan_free(p->transformer);
    p->transformer = NULL;
    p->borrowed = false;
}

void mmc_wan_pipeline_borrow_transformer(mmc_wan_pipeline *p, mmc_wan *m) {
    mmc_wan_pipeline_release_transformer(p);
    p->transformer = m;
    p->borrowed = m != NULL;
}

const mmc_wan_config *mmc_wan_pipeline_transformer_cfg(const mmc_wan_pipeline *p) { return &p->tr_cfg; }
int mmc_wan_pipeline_vae_spatial(const mmc_wan_pipeline *p) { return p->vae_spatial; }
int mmc_wan_pipeline_vae_temporal(const mmc_wan_pipeline *p) { return p->vae_temporal; }
const char *mmc_wan_pipeline_vae_dir(const mmc_wan_pipeline *p) { return p->path[S_VAE]; }

mmc_status mmc_wan_pipeline_load_lora(mmc_wan_pipeline *p, const char *path, float weight) {
    if (p->lora) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: one LoRA adapter at a time is supported", path);
    mmc_status st;
    if (!p->transformer && (st = mmc_wan_load(p->path[S_TR], false, &p->transformer))) return st;
    mmc_module_list ml = {0};
    st = mmc_wan_linears(p->transformer, &ml);
    if (!st) st = mmc_lora_load_diffusers(path, "transformer", &ml, weight, false, &p->lora);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_wan_pipeline_check_frames(const mmc_wan_pipeline *p, int frames) {
    const int k = p->vae_temporal;
    if (frames >= 1 && (frames - 1) % k == 0) return MMC_OK;
    const int lo = frames < 1 ? 1 : (frames - 1) / k * k + 1, hi = lo + k;
    const int near = frames < 1 ? 1 : frames - lo <= hi - frames ? lo : hi;
    return mmc_error(MMC_ERR_INVALID, "%d frames: the count must be %dk + 1 (the VAE compresses time %dx after the "
                     "first frame); the nearest valid count is %d", frames, k, k, near);
}

mmc_status mmc_wan_pipeline_check_size(const mmc_wan_pipeline *p, int height, int width) {
    return mmc_diffusion_check_size(height, width, p->vae_spatial * (int)p->tr_cfg.patch_size[1],
                                    "VAE factor x patch size");
}

bool mmc_wan_pipeline_is_i2v(const mmc_wan_pipeline *p) { return p->i2v; }

void mmc_wan_latent_shape(const mmc_wan_pipeline *p, int frames, int height, int width, int64_t shape[4]) {
    shape[0] = p->i2v ? p->z_dim : p->tr_cfg.in_channels;   /* WanPipeline: in_channels; I2V: vae z_dim */
    shape[1] = (frames - 1) / p->vae_temporal + 1;
    shape[2] = height / p->vae_spatial;
    shape[3] = width / p->vae_spatial;
}

/* ------------------------------------------------------------------ prompts */
static size_t put_utf8(char *o, unsigned long cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* html.unescape of the named entities prompts carry and of numeric references */
static void html_unescape(const char *in, char *out, size_t cap) {
    static const struct { const char *name; unsigned long cp; } ent[] = {
        {"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}, {"#39;", '\''}, {"nbsp;", 0xA0},
        {"ldquo;", 0x201C}, {"rdquo;", 0x201D}, {"lsquo;", 0x2018}, {"rsquo;", 0x2019}, {"hellip;", 0x2026},
        {"ndash;", 0x2013}, {"mdash;", 0x2014}, {"copy;", 0xA9}, {"reg;", 0xAE}, {"trade;", 0x2122}, {"deg;", 0xB0},
        {"times;", 0xD7},
    };
    size_t o = 0;
    while (*in && o + 5 < cap) {
        if (*in == '&') {
            size_t k;
            for (k = 0; k < sizeof ent / sizeof ent[0]; k++)
                if (!strncmp(in + 1, ent[k].name, strlen(ent[k].name))) break;
            if (k < sizeof ent / sizeof ent[0]) {
                o += put_utf8(out + o, ent[k].cp);
                in += 1 + strlen(ent[k].name);
                continue;
            }
            if (in[1] == '#') {
                char *end = NULL;
                const bool hex = in[2] == 'x' || in[2] == 'X';
                unsigned long cp = strtoul(in + (hex ? 3 : 2), &end, hex ? 16 : 10);
                if (end && end != in + (hex ? 3 : 2) && cp > 0 && cp < 0x110000 && !(cp >= 0xD800 && cp < 0xE000)) {
                    o += put_utf8(out + o, cp);
                    in = *end == ';' ? end + 1 : end;
                    continue;
                }
            }
        }
        out[o++] = *in++;
    }
    out[o] = 0;
}

/* Python's str.isspace() at s (what \s matches in a str regex): the UTF-8 length of the whitespace
 * character there, or 0 */
static int py_space(const unsigned char *s) {
    if (*s == ' ' || (*s >= '\t' && *s <= '\r') || (*s >= 0x1C && *s <= 0x1F)) return 1;
    if (s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;                   /* U+0085, U+00A0 */
    if (s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3;                     /* U+1680 */
    if (s[0] == 0xE2 && s[1] == 0x80 && ((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3;                                                                      /* U+2000..200A, 2028, 2029, 202F */
    if (s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3;                     /* U+205F */
    if (s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3;                     /* U+3000 */
    return 0;
}

void mmc_wan_prompt_clean(const char *in, char *out, size_t cap) {
    if (!cap) return;
    char *fixed = mmc_ftfy_fix_text(in);   /* basic_clean: ftfy.fix_text (Wan's requirements install ftfy) */
    char *a = malloc(cap), *b = malloc(cap);
    if (!fixed || !a || !b) { free(fixed), free(a), free(b); out[0] = 0; return; }
    html_unescape(fixed, a, cap);
    html_unescape(a, b, cap);
    /* whitespace runs (Python's \s) -> one space, stripped */
    size_t o = 0;
    bool pending = false;
    for (const unsigned char *s = (const unsigned char *)b; *s && o + 5 < cap;) {
        const int k = py_space(s);
        if (k) {
            pending = o > 0;
            s += k;
            continue;
        }
        if (pending) out[o++] = ' ', pending = false;
        out[o++] = (char)*s++;
    }
    out[o] = 0;
    free(fixed), free(a), free(b);
}

mmc_status mmc_wan_encode_prompt(mmc_ctx *ctx, mmc_wan_pipeline *p, const char *const *prompts, int B,
                                 int max_sequence_length, mmc_tensor **embeds) {
    *embeds = NULL;
    const int L = max_sequence_length;
    if (B < 1 || L < 1) return mmc_error(MMC_ERR_INVALID, "encode_prompt: %d prompts of %d tokens", B, L);
    mmc_t5_tokenizer *tt = NULL;
    mmc_t5_encoder *te = NULL;
    const bool was = mmc_set_grad_enabled(ctx, false);
    char *clean = NULL;
    mmc_status st;
    if ((st = mmc_t5_tokenizer_load_pipeline(p->tok_path, MMC_T5_PIPELINE_TRANSFORMERS5, &tt)) ||
        (st = mmc_t5_encoder_load(p->path[S_TE], &te)))
        goto done;
    const int64_t d = mmc_t5_encoder_cfg(te)->d_model;
    if (d != p->tr_cfg.text_dim) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the text encoder gives %lld channels, the transformer's text_dim is %lld",
                       p->dir.dir, (long long)d, (long long)p->tr_cfg.text_dim);
        goto done;
    }
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L)), *mask = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L)), *h = NULL;
    int *n_real = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * sizeof *n_real);
    for (int b = 0; b < B && !st; b++) {
        const size_t cap = strlen(prompts[b]) * 4 + 16;
        free(clean);
        if (!(clean = malloc(cap))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
        mmc_wan_prompt_clean(prompts[b], clean, cap);
        st = mmc_t5_tokenizer_encode_padded(tt, clean, L, (int32_t *)ids->data + (int64_t)b * L,
                                            (int32_t *)mask->data + (int64_t)b * L, &n_real[b]);
    }
    if (!st) st = mmc_t5_encoder_forward(ctx, te, ids, mask, &h, NULL);
    if (!st) {
        if (!(*embeds = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(B, L, d)))) st = mmc_error(MMC_ERR_OOM, "out of memory");
        else {
            memset((*embeds)->data, 0, mmc_nbytes(*embeds));
            for (int b = 0; b < B; b++)   /* u[:seq_len] then zeros to max_sequence_length */
                memcpy((float *)(*embeds)->data + (int64_t)b * L * d, (float *)h->data + (int64_t)b * L * d,
                       (size_t)n_real[b] * (size_t)d * sizeof(float));
        }
    }
    mmc_arena_release(mmc_ctx_arena(ctx), mk);
done:
    free(clean);
    mmc_t5_encoder_free(te);
    mmc_t5_tokenizer_free(tt);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

/* ------------------------------------------------------------------ image to video */
mmc_status mmc_wan_encode_images(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_image *imgs, int n, mmc_tensor **embeds) {
    *embeds = NULL;
    if (!p->i2v) return mmc_error(MMC_ERR_INVALID, "%s: an image needs a WanImageToVideoPipeline", p->dir.dir);
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "encode_image: %d images", n);
    mmc_clip_vision_model *enc = NULL;
    mmc_tensor *px = NULL;
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_status st = mmc_clip_vision_model_load(p->enc_path, &enc);
    if (st) goto done;
    mmc_clip_vision *v = mmc_clip_vision_model_tower(enc);
    const mmc_clip_vision_config *vc = mmc_clip_vision_cfg(v);
    if (vc->hidden_size != p->tr_cfg.image_dim) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the image encoder's width %lld differs from the transformer's image_dim %lld",
                       p->dir.dir, (long long)vc->hidden_size, (long long)p->tr_cfg.image_dim);
        goto done;
    }
    if (p->clip_proc.crop_h != vc->image_size || p->clip_proc.crop_w != vc->image_size) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: image_processor's crop_size %lldx%lld differs from the image encoder's "
                       "image_size %lld", p->dir.dir, (long long)p->clip_proc.crop_h, (long long)p->clip_proc.crop_w,
                       (long long)vc->image_size);
        goto done;
    }
    /* hidden_states[-2]: the output of the next-to-last layer (the embeddings when there is one layer) */
    const int nl = (int)vc->num_hidden_layers - 1;
    for (int i = 0; i < n && !st; i++) {   /* one image at a time: [1, 3, S, S] -> [1, S_img, image_dim] */
        mmc_arena_mark mi = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor **hs = NULL;
        if ((st = mmc_clip_preprocess(&p->clip_proc, &imgs[i], 1, &px))) break;
        if ((st = mmc_clip_vision_forward(ctx, v, px, nl, &hs))) break;
        mmc_tensor *h = mmc_contiguous(ctx, hs[nl]);
        if (!*embeds && !(*embeds = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(n, h->shape[1], h->shape[2])))) {
            st = mmc_error(MMC_ERR_OOM, "out of memory");
            break;
        }
        memcpy((float *)(*embeds)->data + (int64_t)i * mmc_numel(h), h->data, mmc_nbytes(h));
        mmc_tensor_free(px), px = NULL;
        mmc_arena_release(mmc_ctx_arena(ctx), mi);
    }
done:
    mmc_arena_release(mmc_ctx_arena(ctx), mk);
    mmc_tensor_free(px);
    mmc_clip_vision_model_free(enc);
    mmc_set_grad_enabled(ctx, was);
    if (st) mmc_tensor_free(*embeds), *embeds = NULL;
    return st;
}

mmc_status mmc_wan_encode_image(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_image *img, mmc_tensor **embeds) {
    return mmc_wan_encode_images(ctx, p, img, 1, embeds);
}

bool mmc_wan_pipeline_is_flf2v(const mmc_wan_pipeline *p) { return p->i2v && p->tr_cfg.pos_embed_seq_len > 0; }

mmc_status mmc_wan_pipeline_check_last_image(const mmc_wan_pipeline *p, bool last) {
    if (last && !mmc_wan_pipeline_is_flf2v(p))
        return mmc_error(MMC_ERR_INVALID, "%s: a last frame needs a first-last-frame (FLF2V) transformer "
                         "(pos_embed_seq_len set); this one conditions on the first frame only", p->dir.dir);
    if (!last && mmc_wan_pipeline_is_flf2v(p))
        return mmc_error(MMC_ERR_INVALID, "%s: a first-last-frame (FLF2V) pipeline needs the last frame too",
                         p->dir.dir);
    return MMC_OK;
}

mmc_status mmc_wan_encode_first_last(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_image *first,
                                     const mmc_image *last, mmc_tensor **embeds) {
    mmc_status st = mmc_wan_pipeline_check_last_image(p, last != NULL);
    if (st) return st;
    if (!last) return mmc_wan_encode_images(ctx, p, first, 1, embeds);
    const mmc_image both[2] = {*first, *last};
    if ((st = mmc_wan_encode_images(ctx, p, both, 2, embeds))) return st;
    (*embeds)->shape[1] *= 2, (*embeds)->shape[0] = 1;   /* [2, S, D] -> [1, 2S, D] (contiguous: a view) */
    mmc_set_contiguous_strides(*embeds);
    return MMC_OK;
}

mmc_status mmc_wan_pipeline_vae(mmc_wan_pipeline *p, mmc_wan_vae **vae) {
    mmc_status st;
    if (!p->vae && (st = mmc_wan_vae_load(p->path[S_VAE], &p->vae))) return st;
    *vae = p->vae;
    return MMC_OK;
}

mmc_status mmc_wan_i2v_condition(mmc_wan_pipeline *p, const mmc_image *img, const mmc_image *last, int frames,
                                 int height, int width, mmc_tensor **condition) {
    *condition = NULL;
    if (!p->i2v) return mmc_error(MMC_ERR_INVALID, "%s: an image needs a WanImageToVideoPipeline", p->dir.dir);
    mmc_status st;
    if ((st = mmc_wan_pipeline_check_last_image(p, last != NULL))) return st;
    if (last && frames < 2)
        return mmc_error(MMC_ERR_INVALID, "a first and a last frame need at least 2 frames, got %d", frames);
    if ((st = mmc_wan_pipeline_check_frames(p, frames)) || (st = mmc_wan_pipeline_check_size(p, height, width))) return st;
    if (!p->vae && (st = mmc_wan_vae_load(p->path[S_VAE], &p->vae))) return st;
    const int64_t F = frames, H = height, W = width, HW = H * W, Tm = p->vae_temporal, z = p->z_dim;
    int64_t ls[4];
    mmc_wan_latent_shape(p, frames, height, width, ls);
    const int64_t t = ls[1], per = ls[1] * ls[2] * ls[3];
    mmc_image rs = {0}, rl = {0};
    const mmc_image *im = img, *lm = last;
    if (img->height != height || img->width != width) {   /* VaeImageProcessor.resize: Pillow's lanczos */
        if ((st = mmc_image_resize(img, height, width, MMC_RESAMPLE_LANCZOS, &rs))) return st;
        im = &rs;
    }
    if (last && (last->height != height || last->width != width)) {
        if ((st = mmc_image_resize(last, height, width, MMC_RESAMPLE_LANCZOS, &rl))) { mmc_image_free(&rs); return st; }
        lm = &rl;
    }
    float *x = calloc((size_t)(3 * F * HW), sizeof *x), *mean = malloc((size_t)(z * per) * sizeof *mean);
    mmc_tensor *c = mmc_tensor_new(MMC_F32, 5, MMC_SHAPE(1, Tm + z, t, ls[2], ls[3]));
    if (!x || !mean || !c) { st = mmc_error(MMC_ERR_OOM, "out of memory for a %dx%dx%d condition clip", frames, width,
                                            height); goto done; }
    for (int ch = 0; ch < 3; ch++)   /* frame 0: x / 255, 2x - 1; frames 1..F-1 stay zero (but the last frame) */
        for (int64_t i = 0; i < HW; i++) {
            x[ch * F * HW + i] = (im->data[i * 3 + ch] / 255.0f - 0.5f) / 0.5f;
            if (lm) x[(ch * F + F - 1) * HW + i] = (lm->data[i * 3 + ch] / 255.0f - 0.5f) / 0.5f;
        }
    if ((st = mmc_wan_vae_encode(p->vae, x, F, H, W, mean, NULL, NULL, NULL))) goto done;   /* .mode() */
    mmc_wan_vae_normalize(p->vae, mean, per);
    float *cd = c->data;
    const int64_t hw = ls[2] * ls[3];
    /* the mask: 1 on the given frames (the first; the last too with a last frame), 0 on the generated ones,
     * per pixel frame; the first repeated Tm times, then Tm pixel frames folded into the Tm channels of
     * each latent frame: channel k of latent frame f is pixel frame f == 0 ? 0 : 1 + Tm (f - 1) + k */
    for (int64_t k = 0; k < Tm; k++)
        for (int64_t f = 0; f < t; f++) {
            const int64_t pf = f == 0 ? 0 : 1 + Tm * (f - 1) + k;
            const float mv = pf == 0 || (lm && pf == F - 1) ? 1.0f : 0.0f;
            for (int64_t i = 0; i < hw; i++) cd[(k * t + f) * hw + i] = mv;
        }
    memcpy(cd + Tm * per, mean, (size_t)(z * per) * sizeof(float));
done:
    mmc_image_free(&rs), mmc_image_free(&rl);
    free(x), free(mean);
    if (st) mmc_tensor_free(c);
    else *condition = c;
    return st;
}

/* ------------------------------------------------------------------ sampling */


static bool embeds_ok(const mmc_tensor *e, int64_t B, int64_t D) {
    return e && e->ndim == 3 && e->dtype == MMC_F32 && e->shape[0] == B && e->shape[2] == D && mmc_is_contiguous(e);
}

mmc_status mmc_wan_sample(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_tensor *cond, const mmc_tensor *neg,
                          mmc_tensor *latents, const mmc_wan_sample_opts *o) {
    mmc_status st;
    if ((st = mmc_wan_pipeline_check_frames(p, o->frames)) || (st = mmc_wan_pipeline_check_size(p, o->height, o->width))) return st;
    int64_t ls[4];
    mmc_wan_latent_shape(p, o->frames, o->height, o->width, ls);
    const int64_t B = latents->shape[0];
    if (latents->ndim != 5 || latents->dtype != MMC_F32 || !mmc_is_contiguous(latents) || latents->shape[1] != ls[0] ||
        latents->shape[2] != ls[1] || latents->shape[3] != ls[2] || latents->shape[4] != ls[3])
        return mmc_error(MMC_ERR_INVALID, "latents must be f32 [B, %lld, %lld, %lld, %lld] for %d frames of %dx%d",
                         (long long)ls[0], (long long)ls[1], (long long)ls[2], (long long)ls[3], o->frames, o->width,
                         o->height);
    const bool cfg = o->guidance > 1.0;
    if (cfg && !neg) return mmc_error(MMC_ERR_INVALID, "guidance %g > 1 needs the negative prompt's encoding", o->guidance);
    if (!embeds_ok(cond, B, p->tr_cfg.text_dim) || (cfg && !embeds_ok(neg, B, p->tr_cfg.text_dim)))
        return mmc_error(MMC_ERR_INVALID, "prompt encodings must be f32 [%lld, T, %lld] (text_dim)", (long long)B,
                         (long long)p->tr_cfg.text_dim);
    if (cfg && cond->shape[1] != neg->shape[1])
        return mmc_error(MMC_ERR_INVALID, "the prompt and negative prompt encodings differ in length (%lld, %lld)",
                         (long long)cond->shape[1], (long long)neg->shape[1]);
    if (o->steps < 1) return mmc_error(MMC_ERR_INVALID, "steps must be at least 1, got %d", o->steps);
    const mmc_tensor *cnd = o->condition, *img = o->image_embeds;
    const int64_t per = ls[1] * ls[2] * ls[3], Cc = p->vae_temporal + p->z_dim;
    if (p->i2v) {   /* condition [1, 4 + z, t, h, w] and image states [1 or B, S_img, image_dim] */
        if (!cnd || cnd->ndim != 5 || cnd->dtype != MMC_F32 || !mmc_is_contiguous(cnd) || cnd->shape[0] != 1 ||
            cnd->shape[1] != Cc || mmc_numel(cnd) != Cc * per)
            return mmc_error(MMC_ERR_INVALID, "image-to-video needs the image's condition, f32 [1, %lld, %lld, %lld, %lld] "
                             "(mmc_wan_i2v_condition)", (long long)Cc, (long long)ls[1], (long long)ls[2], (long long)ls[3]);
        if (!img || img->ndim != 3 || img->dtype != MMC_F32 || !mmc_is_contiguous(img) || img->shape[0] != 1 ||
            img->shape[2] != p->tr_cfg.image_dim)
            return mmc_error(MMC_ERR_INVALID, "image-to-video needs the image states, f32 [1, S, %lld] (mmc_wan_encode_image)",
                             (long long)p->tr_cfg.image_dim);
    } else if (cnd || img)
        return mmc_error(MMC_ERR_INVALID, "%s: a text-to-video pipeline takes no image", p->dir.dir);
    if (!p->transformer && (st = mmc_wan_load(p->path[S_TR], false, &p->transformer))) return st;
    if ((st = mmc_nsched_set_timesteps(&p->sched, o->steps))) return st;
    const bool was = mmc_set_grad_enabled(ctx, false);
    float *ts = malloc((size_t)B * 2 * sizeof *ts);
    if (!ts) { mmc_set_grad_enabled(ctx, was); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    const int64_t n = mmc_numel(latents);
    for (int i = 0; i < p->sched.n && !st; i++) {
        const double t0 = mmc_now();
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        for (int64_t b = 0; b < 2 * B; b++) ts[b] = p->sched.timesteps[i];   /* t.expand(B): the integer timestep */
        mmc_wan_inputs in = {.hidden = latents, .timestep = ts, .encoder = (mmc_tensor *)cond};
        if (p->i2v) {   /* cat([latents, condition], channels); the image states for every row */
            const int64_t C = latents->shape[1];
            mmc_tensor *xin = mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(B, C + Cc, ls[1], ls[2], ls[3]));
            mmc_tensor *ie = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, img->shape[1], img->shape[2]));
            for (int64_t b = 0; b < B; b++) {
                memcpy((float *)xin->data + b * (C + Cc) * per, (const float *)latents->data + b * C * per,
                       (size_t)(C * per) * sizeof(float));
                memcpy((float *)xin->data + (b * (C + Cc) + C) * per, cnd->data, (size_t)(Cc * per) * sizeof(float));
                memcpy((float *)ie->data + b * mmc_numel(img), img->data, mmc_nbytes(img));
            }
            in.hidden = xin, in.image = ie;
        }
        if (cfg) {   /* [negative; positive] in one batch: the two passes diffusers runs */
            in.hidden = pipe_stack2(ctx, in.hidden, in.hidden);
            in.encoder = pipe_stack2(ctx, neg, cond);
            if (in.image) in.image = pipe_stack2(ctx, in.image, in.image);
        }
        mmc_tensor *v = NULL;
        st = mmc_wan_forward(ctx, p->transformer, &in, &v);
        if (!st) {
            float *vd = v->data;
            if (cfg) {   /* noise_uncond + guidance_scale * (noise_pred - noise_uncond) */
                const float g = (float)o->guidance;
                for (int64_t k = 0; k < n; k++) vd[k] = vd[k] + g * (vd[n + k] - vd[k]);
            }
            st = mmc_nsched_step(&p->sched, i, vd, latents->data, n, NULL);
        }
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
        if (!st && o->progress) o->progress(o->user, i + 1, p->sched.n, mmc_now() - t0);
    }
    free(ts);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

/* ------------------------------------------------------------------ decoding */
typedef struct {
    mmc_wan_vae_progress fn;
    void *user;
    int base, total;
} decode_progress;

static void on_chunk(void *u, int done, int n) {
    (void)n;
    decode_progress *d = u;
    if (d->fn) d->fn(d->user, d->base + done, d->total);
}

mmc_status mmc_wan_decode(mmc_wan_pipeline *p, const mmc_tensor *latents, mmc_wan_vae_progress progress, void *user,
                          mmc_tensor **video) {
    *video = NULL;
    mmc_status st;
    if (!p->vae && (st = mmc_wan_vae_load(p->path[S_VAE], &p->vae))) return st;
    const mmc_wan_vae_config *vc = mmc_wan_vae_cfg(p->vae);
    if (latents->ndim != 5 || latents->dtype != MMC_F32 || !mmc_is_contiguous(latents) || latents->shape[1] != vc->z_dim)
        return mmc_error(MMC_ERR_INVALID, "latents must be contiguous f32 [B, %lld, t, h, w] (the VAE's z_dim)",
                         (long long)vc->z_dim);
    mmc_wan_pipeline_release_transformer(p);
    const int64_t B = latents->shape[0], C = latents->shape[1], t = latents->shape[2], h = latents->shape[3],
                  w = latents->shape[4];
    const int64_t F = (t - 1) * vc->scale_factor_temporal + 1, H = h * vc->scale_factor_spatial,
                  W = w * vc->scale_factor_spatial, Co = vc->out_channels, per = t * h * w, np = F * H * W;
    float *z = malloc((size_t)(C * per) * sizeof(float)), *x = malloc((size_t)(Co * np) * sizeof(float));
    mmc_tensor *v = mmc_tensor_new(MMC_F32, 5, MMC_SHAPE(B, F, Co, H, W));
    st = MMC_OK;
    if (!z || !x || !v) { st = mmc_error(MMC_ERR_OOM, "out of memory for a %lldx%lldx%lld video", (long long)F,
                                         (long long)W, (long long)H); goto done; }
    decode_progress dp = {progress, user, 0, (int)(B * t)};
    for (int64_t b = 0; b < B && !st; b++) {
        memcpy(z, (const float *)latents->data + b * C * per, (size_t)(C * per) * sizeof(float));
        mmc_wan_vae_denormalize(p->vae, z, per);
        dp.base = (int)(b * t);
        if ((st = mmc_wan_vae_decode(p->vae, z, t, h, w, x, on_chunk, &dp))) break;
        float *o = (float *)v->data + b * F * Co * H * W;   /* [F, C, H, W] of this clip */
        for (int64_t c = 0; c < Co; c++)
            for (int64_t f = 0; f < F; f++) {
                const float *src = x + (c * F + f) * H * W;
                float *dst = o + (f * Co + c) * H * W;
                for (int64_t k = 0; k < H * W; k++) {
                    float y = src[k] / 2.0f + 0.5f;
                    dst[k] = y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y;
                }
            }
    }
done:
    free(z), free(x);
    if (st) mmc_tensor_free(v);
    else *video = v;
    return st;
}
