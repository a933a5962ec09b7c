/* runner.c — model loading and prompt building for the inference subcommands. */
#include "runner.h"
#include "cli.h"
#include "mmc_image.h"
#include "mmc_prompt.h"
#include "mmc_quant.h"
#include "backend/cpu/gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mmc_status cli_model_load(const char *model, const char *adapter, cli_model *m) {
    memset(m, 0, sizeof *m);
    char path[8300];
    mmc_status st = mmc_lora_resolve(model, adapter, m->base_dir, sizeof m->base_dir, m->adapter_dir,
                                     sizeof m->adapter_dir);
    if (st) return st;
    const char *dir = m->base_dir;
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    if ((st = mmc_json_load(path, &cfg))) return st;
    const char *mt = "?";
    mmc_json_str(cfg, "model_type", "?", &mt);
    snprintf(m->model_type, sizeof m->model_type, "%s", mt);
    if (!strcmp(mt, "qwen2") || !strcmp(mt, "llama") || !strcmp(mt, "qwen2_moe") || !strcmp(mt, "internlm2")) {
        st = !strcmp(mt, "llama") ? mmc_llama_load(dir, cfg, false, &m->lm) : !strcmp(mt, "qwen2_moe")
             ? mmc_qwen2_moe_load(dir, cfg, false, NULL, &m->lm) : !strcmp(mt, "internlm2") && m->adapter_dir[0]
             ? mmc_internlm2_load_packed(dir, cfg, "", false, &m->lm)   /* PEFT's adapters sit on the packed wqkv */
             : !strcmp(mt, "internlm2") ? mmc_internlm2_load(dir, cfg, &m->lm) : mmc_qwen2_load(dir, cfg, false, &m->lm);
        if (!st) m->vocab_size = m->lm->cfg.vocab_size;
        if (!st && m->adapter_dir[0]) st = mmc_qwen2_attach_adapter(m->lm, m->adapter_dir);
    } else if (!strcmp(mt, "qwen2_vl") || !strcmp(mt, "qwen2_5_vl")) {
        m->vl = true;
        st = mmc_qwen2_vl_load(dir, false, &m->vlm);
        if (!st) m->vocab_size = m->vlm->lm->cfg.vocab_size;
        if (!st && m->adapter_dir[0]) st = mmc_qwen2_vl_attach_adapter(m->vlm, m->adapter_dir);
        mmc_qwen2vl_proc_default(&m->proc);
        /* the adapter directory's processor config (a checkpoint's copy), else the base's */
        path[0] = 0;
        if (!st && m->adapter_dir[0]) st = mmc_qwen2vl_proc_load_dir(m->adapter_dir, &m->proc, path, sizeof path);
        if (!st && !path[0]) st = mmc_qwen2vl_proc_load_dir(dir, &m->proc, NULL, 0);
        /* the video processor's own settings, from the folder the image processor came from */
        mmc_qwen2vl_video_proc_default(&m->vproc);
        if (!st) {
            const char *vdir = dir;
            char *slash = path[0] ? strrchr(path, '/') : NULL;
            if (slash) { *slash = 0; vdir = path; }
            st = mmc_qwen2vl_video_proc_load_dir(vdir, &m->vproc);
        }
        mmc_qwen2vl_video_sampling_default(&m->vproc);
    } else if (!strcmp(mt, "llava") || !strcmp(mt, "llava_next") || !strcmp(mt, "llava_onevision")) {
        st = mmc_llava_load(dir, &m->llava);
        if (!st) m->vocab_size = m->llava->lm->cfg.vocab_size;
        if (!st && m->adapter_dir[0]) st = mmc_llava_attach_adapter(m->llava, m->adapter_dir);
        mmc_clip_proc_default(&m->cproc);
        if (!st && m->llava->variant != MMC_LLAVA_15) {
            mmc_llava_next_proc_default(&m->nproc, m->llava);
            st = mmc_llava_next_proc_load_dir(dir, &m->nproc, NULL, 0);
            mmc_qwen2vl_video_proc_default(&m->vproc);   /* a video file: every frame unless --video-fps / -frames */
        } else if (!st) {
            st = mmc_clip_proc_load_dir(dir, &m->cproc, NULL, 0);
        }
    } else if (!strcmp(mt, "internvl") || !strcmp(mt, "internvl_chat")) {
        /* an adapter: an InternLM2 language model in its packed layout, where PEFT's wqkv adapters sit */
        st = mmc_internvl_load_opts(dir, false, m->adapter_dir[0] != 0, &m->internvl);
        if (!st && m->adapter_dir[0]) st = mmc_internvl_attach_adapter(m->internvl, m->adapter_dir);
        if (!st) m->vocab_size = m->internvl->lm->cfg.vocab_size;
        mmc_internvl_proc_default(&m->iproc);
        if (!st) st = mmc_internvl_proc_load_dir(dir, &m->iproc, NULL, 0);
    } else if (!strcmp(mt, "qwen2_5_omni_thinker") || !strcmp(mt, "qwen2_5_omni")) {
        /* the thinker only (text output); a full checkpoint's talker / token2wav are not run */
        st = mmc_omni_load(dir, &m->omni);
        if (!st && m->adapter_dir[0]) st = mmc_omni_attach_adapter(m->omni, m->adapter_dir);   /* the thinker's LM */
        if (!st) m->vocab_size = m->omni->lm->cfg.vocab_size;
        mmc_qwen2vl_proc_default(&m->proc);
        if (!st) st = mmc_qwen2vl_proc_load_dir(dir, &m->proc, NULL, 0);
        if (!st) st = mmc_whisper_fe_load(dir, &m->fe);
        /* videos: every frame unless --video-fps / --video-frames (transformers' do_sample_frames false),
         * and Qwen2_5OmniProcessor's videos_kwargs size (128*28*28 .. 768*28*28), which transformers
         * applies over the video processor's own */
        mmc_qwen2vl_video_proc_default(&m->vproc);
        if (!st) st = mmc_qwen2vl_video_proc_load_dir(dir, &m->vproc);
        m->vproc.proc.video_min_pixels = 128 * 28 * 28, m->vproc.proc.video_max_pixels = 768 * 28 * 28;
    } else {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported (supported: qwen2, llama, "
                       "qwen2_vl, qwen2_5_vl, llava, llava_next, llava_onevision, internvl, internvl_chat, qwen2_5_omni_thinker, qwen2_5_omni)",
                       dir, mt);
    }
    mmc_json_free(cfg);
    if (!st) {
        snprintf(path, sizeof path, "%s/tokenizer.json", m->adapter_dir);
        bool own = m->adapter_dir[0] && access(path, R_OK) == 0;
        st = mmc_tokenizer_load(own ? m->adapter_dir : dir, &m->tok);
    }
    if (!st) {   /* generation defaults: a checkpoint's own copy first, as for the tokenizer */
        snprintf(path, sizeof path, "%s/generation_config.json", m->adapter_dir);
        bool own = m->adapter_dir[0] && access(path, R_OK) == 0;
        st = mmc_gen_config_read(own ? m->adapter_dir : dir, &m->gen);
    }
    if (st && m->adapter_dir[0]) mmc_error_prefix(st, "adapter %s on base %s", m->adapter_dir, m->base_dir);
    if (st) cli_model_free(m);
    return st;
}

void cli_model_free(cli_model *m) {
    mmc_qwen2_free(m->lm);
    mmc_qwen2_vl_free(m->vlm);
    mmc_llava_free(m->llava);
    mmc_internvl_free(m->internvl);
    mmc_omni_free(m->omni);
    if (m->fe.mel_filters || m->fe.priv) mmc_whisper_fe_free(&m->fe);
    mmc_tokenizer_free(m->tok);
    memset(m, 0, sizeof *m);
}

void cli_prompt_free(cli_prompt *p) {
    free(p->ids);
    mmc_vlproc_out_free(&p->img);
    mmc_vlproc_out_free(&p->vid);
    mmc_tensor_free(p->llava_pixels);
    free(p->llava_sizes);
    mmc_tensor_free(p->llava_video);
    mmc_tensor_free(p->internvl_pixels);
    for (int i = 0; i < p->n_audios; i++) free(p->audio_feats[i]);
    free(p->audio_feats);
    free(p->audios);
    memset(p, 0, sizeof *p);
}

/* LLaVA: CLIPImageProcessor on each image, and each <image> of the templated prompt expanded
 * into one token per image feature, as LlavaProcessor does (takes ids). */
static mmc_status llava_prompt(cli_model *m, int32_t *ids, int64_t n, const char *const *images, int n_images,
                               const char *video_dir, cli_prompt *p) {
    mmc_status st = MMC_OK;
    if (video_dir && m->llava->variant != MMC_LLAVA_ONEVISION) {
        free(ids);
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava takes images, not videos (LLaVA-OneVision takes both)");
    }
    int64_t vid_tok = 0;
    mmc_image *imgs = calloc((size_t)(n_images ? n_images : 1), sizeof *imgs);
    int64_t *img_tok = calloc((size_t)(n_images ? n_images : 1), sizeof *img_tok);
    int loaded = 0;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (m->max_image_pixels > 0) io.max_pixels = m->max_image_pixels;
    if (!imgs || !img_tok) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (; loaded < n_images; loaded++)
        if ((st = mmc_image_load(images[loaded], &io, &imgs[loaded]))) goto done;
    if (m->llava->variant != MMC_LLAVA_15 && n_images) {   /* NeXT / OneVision: tiles, sizes, their counts */
        p->llava_sizes = calloc((size_t)n_images, sizeof *p->llava_sizes);
        if (!p->llava_sizes) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        p->llava_n_images = n_images;
        if ((st = mmc_llava_next_preprocess(&m->nproc, imgs, n_images, n_images > 1, &p->llava_pixels,
                                            p->llava_sizes)))
            goto done;
        for (int i = 0; i < n_images; i++)
            img_tok[i] = mmc_llava_next_image_tokens(&m->nproc, p->llava_sizes[i][0], p->llava_sizes[i][1], n_images > 1);
    } else {
        if (n_images && (st = mmc_clip_preprocess(&m->cproc, imgs, n_images, &p->llava_pixels))) goto done;
        for (int i = 0; i < n_images; i++) img_tok[i] = mmc_llava_image_tokens(m->llava);
    }
    if (video_dir) {   /* OneVision: every frame of a folder, or of a file (--video-fps / --video-frames sample) */
        struct stat sb;
        const bool frames_dir = stat(video_dir, &sb) == 0 && S_ISDIR(sb.st_mode);
        mmc_video_clip clip = {0};
        mmc_image *frames = NULL;
        int nf = 0;
        if (frames_dir) st = mmc_load_frames_dir(video_dir, &io, &frames, &nf);
        else if (!(st = mmc_qwen2vl_video_load(&m->vproc, video_dir, &clip))) frames = clip.frames, nf = clip.n;
        if (!st) st = mmc_llava_next_preprocess_video(&m->nproc, frames, nf, &p->llava_video);
        vid_tok = mmc_llava_next_video_tokens(&m->nproc, nf);
        if (frames_dir) {
            for (int i = 0; i < nf; i++) mmc_image_free(&frames[i]);
            free(frames);
        } else {
            mmc_video_clip_free(&clip);
        }
        if (st) goto done;
    }
    st = mmc_vl_expand_pads(ids, NULL, n, (int32_t)m->llava->image_token_id, img_tok, n_images,
                            video_dir ? (int32_t)m->llava->video_token_id : -1, &vid_tok, video_dir ? 1 : 0,
                            &p->ids, NULL, &p->n);
done:
    for (int i = 0; i < loaded; i++) mmc_image_free(&imgs[i]);
    free(imgs);
    free(img_tok);
    free(ids);
    if (st) cli_prompt_free(p);
    return st;
}

/* InternVL's images: the processor's tiles of each (p->internvl_pixels) and the <IMG_CONTEXT>
 * count each takes (tokens[i] = image_seq_length * tiles). */
static mmc_status internvl_images(cli_model *m, const char *const *images, int n_images, cli_prompt *p,
                                  int64_t *tokens) {
    mmc_status st = MMC_OK;
    mmc_image *imgs = calloc((size_t)(n_images ? n_images : 1), sizeof *imgs);
    int loaded = 0;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (m->max_image_pixels > 0) io.max_pixels = m->max_image_pixels;
    if (!imgs) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (; loaded < n_images; loaded++)
        if ((st = mmc_image_load(images[loaded], &io, &imgs[loaded]))) goto done;
    if (n_images && (st = mmc_internvl_preprocess(&m->iproc, imgs, n_images, &p->internvl_pixels, tokens))) goto done;
    for (int i = 0; i < n_images; i++) tokens[i] *= m->iproc.image_seq_length;
done:
    for (int i = 0; i < loaded; i++) mmc_image_free(&imgs[i]);
    free(imgs);
    return st;
}

/* InternVL (HF-native): each <IMG_CONTEXT> of the templated prompt expanded into
 * <img> <IMG_CONTEXT> x (image_seq_length * tiles) </img>, as InternVLProcessor does (takes ids). */
static mmc_status internvl_prompt(cli_model *m, int32_t *ids, int64_t n, const char *const *images, int n_images,
                                  const char *video_dir, cli_prompt *p) {
    mmc_status st = MMC_OK;
    int64_t *tokens = calloc((size_t)(n_images ? n_images : 1), sizeof *tokens);
    if (video_dir) st = mmc_error(MMC_ERR_UNSUPPORTED, "internvl: a video needs the chat template (drop --raw)");
    else if (!tokens) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) st = internvl_images(m, images, n_images, p, tokens);
    int32_t start = mmc_tokenizer_token_to_id(m->tok, "<img>"), end = mmc_tokenizer_token_to_id(m->tok, "</img>");
    if (!st && n_images && (start < 0 || end < 0))
        st = mmc_error(MMC_ERR_FORMAT, "%s: the tokenizer has no <img> / </img> tokens (InternVLProcessor's "
                       "start_image_token / end_image_token)", m->base_dir);
    if (!st)
        st = mmc_internvl_expand(ids, n, (int32_t)m->internvl->image_token_id, start, end, tokens, n_images, &p->ids,
                                 &p->n);
    free(tokens);
    free(ids);
    if (st) cli_prompt_free(p);
    return st;
}

/* InternVL (HF-native) with a video: the templated text's <video> expanded to one "FrameN: <IMG_CONTEXT>" per
 * sampled frame (mmc_internvl_video_text) and tokenised, then every <IMG_CONTEXT> expanded as for images, the
 * frames joining the images' tiles in pixel_values in the order their placeholders come, as InternVLProcessor
 * does (frames sampled and processed as InternVLVideoProcessor: mmc_internvl_video_load). */
static mmc_status internvl_video_prompt(cli_model *m, const mmc_chat_message *msgs, int n_msgs,
                                        const char *const *images, int n_images, const char *video_dir,
                                        cli_prompt *p) {
    mmc_status st = MMC_OK;
    const mmc_internvl_video_proc *vp = &m->iproc.video;
    int64_t *tokens = calloc((size_t)n_images + 1, sizeof *tokens), *ph = NULL, nf64 = 0;
    uint8_t order[CLI_MAX_IMAGES + 1];
    char *rendered = NULL, *text = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    int nf = 0;
    mmc_tensor *vpix = NULL, *ipix = NULL;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (m->max_image_pixels > 0) io.max_pixels = m->max_image_pixels;
    if (!tokens) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if (n_images > CLI_MAX_IMAGES) { st = mmc_error(MMC_ERR_INVALID, "too many images"); goto done; }
    const int64_t per = mmc_internvl_tile_tokens(m->internvl, vp->size_h);
    if (vp->size_h != vp->size_w || per != m->iproc.image_seq_length) {
        st = mmc_error(MMC_ERR_INVALID, "%s: video frames of %lld x %lld give %lld image tokens each, but the processor's "
                       "image_seq_length is %lld: set the video processor's size to the tower's tile size", m->base_dir,
                       (long long)vp->size_w, (long long)vp->size_h, (long long)per,
                       (long long)m->iproc.image_seq_length);
        goto done;
    }
    if ((st = internvl_images(m, images, n_images, p, tokens))) goto done;
    ipix = p->internvl_pixels;
    p->internvl_pixels = NULL;
    if (ipix && (ipix->shape[2] != vp->size_h || ipix->shape[3] != vp->size_w)) {
        st = mmc_error(MMC_ERR_INVALID, "%s: image tiles of %lld x %lld and video frames of %lld x %lld cannot go in one "
                       "prompt (transformers concatenates them into one pixel_values)", m->base_dir,
                       (long long)ipix->shape[3], (long long)ipix->shape[2], (long long)vp->size_w, (long long)vp->size_h);
        goto done;
    }
    if ((st = mmc_internvl_video_load(vp, video_dir, &io, &vpix, NULL, &nf))) goto done;
    nf64 = nf;
    mmc_chat_options co = {.add_generation_prompt = true, .add_special_tokens = true, .tools = m->chat_tools};
    if ((st = mmc_chat_render(m->tok, msgs, n_msgs, &co, &rendered, NULL, NULL))) goto done;
    if ((st = mmc_internvl_video_text(rendered, n_images, &nf64, 1, &text, order, NULL, NULL))) goto done;
    if ((st = mmc_tokenizer_encode(m->tok, text, -1, true, &ids, &n))) goto done;
    int32_t start = mmc_tokenizer_token_to_id(m->tok, "<img>"), end = mmc_tokenizer_token_to_id(m->tok, "</img>");
    if (start < 0 || end < 0) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the tokenizer has no <img> / </img> tokens (InternVLProcessor's "
                       "start_image_token / end_image_token)", m->base_dir);
        goto done;
    }
    /* the placeholders' token counts and pixel rows, in text order */
    const int n_ph = n_images + nf;
    const int64_t S = vp->size_h, row = 3 * S * S;
    int64_t rows = (ipix ? ipix->shape[0] : 0) + nf;
    if (!(ph = malloc(sizeof *ph * (size_t)n_ph)) || !(p->internvl_pixels = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(rows, 3, S, S)))) {
        st = mmc_error(MMC_ERR_OOM, "out of memory");
        goto done;
    }
    float *dst = p->internvl_pixels->data;
    const float *isrc = ipix ? ipix->data : NULL;
    for (int k = 0, i = 0, q = 0; k < n_images + 1; k++) {
        if (order[k] == 0) {
            const int64_t tiles = tokens[i] / m->iproc.image_seq_length;
            memcpy(dst, isrc, sizeof(float) * (size_t)(tiles * row));
            dst += tiles * row, isrc += tiles * row;
            ph[q++] = tokens[i++];
        } else {
            memcpy(dst, vpix->data, sizeof(float) * (size_t)(nf * row));
            dst += nf * row;
            for (int f = 0; f < nf; f++) ph[q++] = m->iproc.image_seq_length;
        }
    }
    st = mmc_internvl_expand(ids, n, (int32_t)m->internvl->image_token_id, start, end, ph, n_ph, &p->ids, &p->n);
done:
    free(tokens);
    free(ph);
    free(rendered);
    free(text);
    free(ids);
    mmc_tensor_free(vpix);
    mmc_tensor_free(ipix);
    if (st) cli_prompt_free(p);
    return st;
}

/* InternVL in OpenGVLab's layout, as InternVLChatModel.chat() builds a prompt: each image part
 * becomes "<image>\n" in the message text (its tokenizer's chat template takes string content),
 * the rendered text's i-th "<image>" becomes "<img>" + "<IMG_CONTEXT>" x tokens[i] + "</img>", then
 * the text is tokenized. The system prompt is the tokenizer template's (chat() takes
 * conversation.py's; give it with --system). */
static mmc_status internvl_remote_prompt(cli_model *m, const mmc_chat_message *msgs, int n_msgs,
                                         const char *const *images, int n_images, const char *video_dir,
                                         cli_prompt *p) {
    if (video_dir)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: videos are not supported for OpenGVLab's internvl_chat layout yet "
                         "(transformers' InternVL layout, model_type internvl, takes them; OpenGVLab's load_video of the "
                         "model cards is not implemented)",
                         m->base_dir);
    mmc_status st = MMC_OK;
    int64_t *tokens = calloc((size_t)(n_images ? n_images : 1), sizeof *tokens);
    mmc_chat_message *flat = calloc((size_t)(n_msgs ? n_msgs : 1), sizeof *flat);
    char **texts = calloc((size_t)(n_msgs ? n_msgs : 1), sizeof *texts);
    char *rendered = NULL, *expanded = NULL;
    if (!tokens || !flat || !texts) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if ((st = internvl_images(m, images, n_images, p, tokens))) goto done;
    for (int i = 0; i < n_msgs; i++) {
        flat[i] = msgs[i];
        if (msgs[i].content || !msgs[i].parts) continue;
        size_t len = 1;
        for (int k = 0; k < msgs[i].n_parts; k++)
            len += msgs[i].parts[k].type == MMC_CHAT_TEXT && msgs[i].parts[k].text ? strlen(msgs[i].parts[k].text) : 8;
        if (!(texts[i] = malloc(len))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        texts[i][0] = 0;
        for (int k = 0; k < msgs[i].n_parts; k++) {
            const mmc_chat_part *q = &msgs[i].parts[k];
            if (q->type == MMC_CHAT_IMAGE) strcat(texts[i], "<image>\n");
            else if (q->type == MMC_CHAT_TEXT && q->text) strcat(texts[i], q->text);
        }
        flat[i].content = texts[i], flat[i].parts = NULL, flat[i].n_parts = 0;
    }
    mmc_chat_options co = {.add_generation_prompt = true, .add_special_tokens = true};
    if ((st = mmc_chat_render(m->tok, flat, n_msgs, &co, &rendered, NULL, NULL))) goto done;
    size_t need = strlen(rendered) + 1;
    int found = 0;
    for (const char *s = strstr(rendered, "<image>"); s; s = strstr(s + 7, "<image>"), found++)
        if (found < n_images) need += 11 + (size_t)tokens[found] * 13;
    if (found != n_images) {
        st = mmc_error(MMC_ERR_INVALID, "the prompt has %d image placeholder%s but %d image%s", found,
                       found == 1 ? "" : "s", n_images, n_images == 1 ? "" : "s");
        goto done;
    }
    if (!(expanded = malloc(need))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    char *o = expanded;
    const char *s = rendered;
    for (int i = 0; i < n_images; i++) {
        const char *at = strstr(s, "<image>");
        memcpy(o, s, (size_t)(at - s));
        o += at - s;
        o += sprintf(o, "<img>");
        for (int64_t k = 0; k < tokens[i]; k++) o += sprintf(o, "<IMG_CONTEXT>");
        o += sprintf(o, "</img>");
        s = at + 7;
    }
    strcpy(o, s);
    st = mmc_tokenizer_encode(m->tok, expanded, -1, true, &p->ids, &p->n);
done:
    for (int i = 0; texts && i < n_msgs; i++) free(texts[i]);
    free(texts);
    free(flat);
    free(tokens);
    free(rendered);
    free(expanded);
    if (st) cli_prompt_free(p);
    return st;
}

/* Qwen2.5-Omni: images through the Qwen2-VL image processor, audio files decoded at the feature
 * extractor's rate and turned into log-mel features, <|IMAGE|> / <|AUDIO|> expanded as
 * Qwen2_5OmniProcessor does (takes ids). */
static mmc_status omni_prompt(cli_model *m, int32_t *ids, int64_t n, const char *const *images, int n_images,
                              const cli_audio *audios, int n_audios, const char *video_dir, cli_prompt *p) {
    mmc_status st = MMC_OK;
    mmc_image *imgs = calloc((size_t)(n_images ? n_images : 1), sizeof *imgs);
    int loaded = 0;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (m->max_image_pixels > 0) io.max_pixels = m->max_image_pixels;
    bool track = m->omni_audio_in_video && video_dir;
    int n_aud = n_audios + (track ? 1 : 0);
    struct stat sb;
    bool frames_dir = video_dir && stat(video_dir, &sb) == 0 && S_ISDIR(sb.st_mode);
    p->audio_feats = calloc((size_t)n_aud + 1, sizeof *p->audio_feats);
    p->audios = calloc((size_t)n_aud + 1, sizeof *p->audios);
    if (m->omni_audio_in_video && (!video_dir || frames_dir))
        st = mmc_error(MMC_ERR_INVALID, "--audio-in-video needs a video file with an audio track (--video FILE)");
    else if (!imgs || !p->audio_feats || !p->audios) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st && video_dir) {   /* every frame (or the --video-* sampling); second_per_grid = tps / fps (2.0 unset) */
        mmc_video_clip clip = {0};
        mmc_image *frames = NULL;
        int n_frames = 0;
        if (frames_dir) st = mmc_load_frames_dir(video_dir, &io, &frames, &n_frames);
        else if (!(st = mmc_qwen2vl_video_load(&m->vproc, video_dir, &clip))) frames = clip.frames, n_frames = clip.n;
        if (!st) st = mmc_qwen2vl_video_preprocess(&m->vproc, frames, n_frames, &p->vid);
        p->second_per_grid_ts = m->vproc.proc.temporal_patch_size / (m->vproc.fps > 0 ? m->vproc.fps : 2.0);
        if (frames_dir) {
            for (int i = 0; i < n_frames; i++) mmc_image_free(&frames[i]);
            free(frames);
        } else {
            mmc_video_clip_free(&clip);
        }
    }
    for (; !st && loaded < n_images; loaded++)
        if ((st = mmc_image_load(images[loaded], &io, &imgs[loaded]))) break;
    if (!st && n_images) st = mmc_qwen2vl_preprocess_images(&m->proc, imgs, n_images, &p->img);
    for (int i = 0; !st && i < n_aud; i++) {   /* the video's track first: its placeholder comes first */
        const cli_audio *ca = track ? (i == 0 ? NULL : &audios[i - 1]) : &audios[i];
        const char *src = !ca ? video_dir : ca->path ? ca->path : ca->name ? ca->name : "(audio bytes)";
        mmc_audio au = {0};
        st = ca && !ca->path ? mmc_audio_load_mem_max(ca->data, ca->n_data, src, m->fe.sampling_rate, m->max_audio_seconds, &au)
                             : mmc_audio_load_max(src, m->fe.sampling_rate, m->max_audio_seconds, &au);
        if (!st) {
            mmc_omni_audio_in *a = &p->audios[i];
            st = mmc_omni_audio_features(&m->fe, au.samples, au.n, &p->audio_feats[i], &a->stride, &a->frames);
            a->feats = p->audio_feats[i];
            if (st) mmc_error_prefix(st, "%s", src);
            else p->n_audios++;
        }
        mmc_audio_free(&au);
    }
    if (!st) {
        p->omni = (mmc_omni_media){.audios = p->audios, .n_audios = n_aud, .pixel_values = p->img.pixel_values,
                                   .image_grid_thw = n_images ? &p->img.grid_thw[0][0] : NULL, .n_images = n_images,
                                   .pixel_values_videos = p->vid.pixel_values,
                                   .video_grid_thw = video_dir ? &p->vid.grid_thw[0][0] : NULL,
                                   .n_videos = video_dir ? 1 : 0, .second_per_grid = &p->second_per_grid_ts,
                                   .use_audio_in_video = track};
        st = mmc_omni_expand(m->omni, ids, n, &p->omni, &p->ids, &p->n);
    }
    for (int i = 0; i < loaded; i++) mmc_image_free(&imgs[i]);
    free(imgs);
    free(ids);
    if (st) cli_prompt_free(p);
    return st;
}

static mmc_status prompt_build(cli_model *m, const mmc_chat_message *msgs, int n_msgs, bool raw,
                               const char *raw_text, const char *const *images, int n_images,
                               const cli_audio *audios, int n_audios, const char *video_dir, cli_prompt *p);

mmc_status cli_prompt_build(cli_model *m, const mmc_chat_message *msgs, int n_msgs, bool raw,
                            const char *raw_text, const char *const *images, int n_images,
                            const char *video_dir, cli_prompt *p) {
    return prompt_build(m, msgs, n_msgs, raw, raw_text, images, n_images, NULL, 0, video_dir, p);
}

mmc_status cli_prompt_build_audio(cli_model *m, const mmc_chat_message *msgs, int n_msgs, const char *const *images,
                                  int n_images, const cli_audio *audios, int n_audios, const char *video_dir,
                                  cli_prompt *p) {
    return prompt_build(m, msgs, n_msgs, false, NULL, images, n_images, audios, n_audios, video_dir, p);
}

static mmc_status prompt_build(cli_model *m, const mmc_chat_message *msgs, int n_msgs, bool raw,
                               const char *raw_text, const char *const *images, int n_images,
                               const cli_audio *audios, int n_audios, const char *video_dir, cli_prompt *p) {
    memset(p, 0, sizeof *p);
    if (n_audios && !m->omni)
        return mmc_error(MMC_ERR_INVALID, "audio input needs a Qwen2.5-Omni model (qwen2_5_omni_thinker or "
                         "qwen2_5_omni); this one is model_type %s", m->model_type);
    int32_t *ids = NULL;
    int64_t n = 0;
    mmc_status st;
    if (!raw && m->internvl && m->internvl->remote_layout)
        return internvl_remote_prompt(m, msgs, n_msgs, images, n_images, video_dir, p);
    if (!raw && m->internvl && video_dir) return internvl_video_prompt(m, msgs, n_msgs, images, n_images, video_dir, p);
    if (raw) st = mmc_tokenizer_encode(m->tok, raw_text, -1, false, &ids, &n);
    else {
        /* LLaVA's reference is its processor: the templated text tokenized with the post-processor */
        mmc_chat_options co = {.add_generation_prompt = true, .add_special_tokens = m->llava || m->internvl,
                               .tools = m->chat_tools};
        st = mmc_chat_encode(m->tok, msgs, n_msgs, &co, &ids, NULL, &n);
    }
    if (st) return st;
    if (m->llava) return llava_prompt(m, ids, n, images, n_images, video_dir, p);
    if (m->internvl) return internvl_prompt(m, ids, n, images, n_images, video_dir, p);
    if (m->omni) return omni_prompt(m, ids, n, images, n_images, audios, n_audios, video_dir, p);
    if (!m->vl) {
        if (n_images || video_dir) {
            free(ids);
            return mmc_error(MMC_ERR_INVALID, "images/videos need a vision-language model; this one is "
                             "text-only (model_type %s)", m->model_type);
        }
        p->ids = ids;
        p->n = n;
        return MMC_OK;
    }
    mmc_image *imgs = calloc((size_t)(n_images ? n_images : 1), sizeof *imgs);
    mmc_image *frames = NULL;
    int n_frames = 0, loaded = 0;
    int64_t *img_tok = calloc((size_t)(n_images ? n_images : 1), sizeof *img_tok), vid_tok = 0;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (m->max_image_pixels > 0) io.max_pixels = m->max_image_pixels;
    if (!imgs || !img_tok) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (; loaded < n_images; loaded++)
        if ((st = mmc_image_load(images[loaded], &io, &imgs[loaded]))) goto done;
    if (n_images && (st = mmc_qwen2vl_preprocess_images(&m->proc, imgs, n_images, &p->img))) goto done;
    int64_t m2 = (int64_t)m->proc.merge_size * m->proc.merge_size;
    for (int i = 0; i < n_images; i++)
        img_tok[i] = p->img.grid_thw[i][0] * p->img.grid_thw[i][1] * p->img.grid_thw[i][2] / m2;
    mmc_video_clip clip = {0};
    if (video_dir) {
        struct stat sb;
        if (stat(video_dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {   /* a folder of frames: every frame */
            if ((st = mmc_load_frames_dir(video_dir, &io, &frames, &n_frames))) goto done;
            p->second_per_grid_ts = m->vproc.proc.temporal_patch_size / 24.0;   /* VideoMetadata: 24 fps when unknown */
            st = mmc_qwen2vl_video_preprocess(&m->vproc, frames, n_frames, &p->vid);
        } else if (!(st = mmc_qwen2vl_video_load_preprocess(&m->vproc, video_dir, &clip, &p->vid))) {
            /* a file: each frame resized and patchified as it is decoded (no frames kept) */
            p->second_per_grid_ts = clip.second_per_grid_ts;
            mmc_video_clip_free(&clip);
        }
        if (st) goto done;
        vid_tok = p->vid.grid_thw[0][0] * p->vid.grid_thw[0][1] * p->vid.grid_thw[0][2] /
                  ((int64_t)m->vproc.proc.merge_size * m->vproc.proc.merge_size);
    }
    st = mmc_vl_expand_pads(ids, NULL, n, (int32_t)m->vlm->image_token_id, img_tok, n_images,
                            (int32_t)m->vlm->video_token_id, &vid_tok, video_dir ? 1 : 0, &p->ids, NULL, &p->n);
    if (st) goto done;
    p->media = (mmc_vl_media){.pixel_values = p->img.pixel_values,
                              .image_grid_thw = n_images ? &p->img.grid_thw[0][0] : NULL,
                              .n_images = n_images,
                              .pixel_values_videos = p->vid.pixel_values,
                              .video_grid_thw = video_dir ? &p->vid.grid_thw[0][0] : NULL,
                              .n_videos = video_dir ? 1 : 0,
                              .second_per_grid_ts = video_dir ? &p->second_per_grid_ts : NULL};
done:
    for (int i = 0; i < loaded; i++) mmc_image_free(&imgs[i]);
    for (int i = 0; i < n_frames; i++) mmc_image_free(&frames[i]);
    free(frames);
    free(imgs);
    free(img_tok);
    free(ids);
    if (st) cli_prompt_free(p);
    return st;
}

mmc_status cli_generate(cli_model *m, const cli_prompt *p, const mmc_gen_opts *opts, int32_t *out,
                        int *n_out) {
    mmc_qwen2_vl_request req = {m->vlm, &p->media, 0};
    mmc_llava_request lreq = {m->llava, p->llava_pixels, (const int64_t (*)[2])p->llava_sizes, p->llava_n_images,
                              p->llava_video};
    mmc_internvl_request ireq = {m->internvl, p->internvl_pixels};
    mmc_omni_request oreq = {m->omni, &p->omni, 0};
    mmc_decoder d = m->llava ? mmc_llava_decoder(&lreq) : m->internvl ? mmc_internvl_decoder(&ireq)
                  : m->omni ? mmc_omni_decoder(&oreq)
                  : m->vl ? mmc_qwen2_vl_decoder(&req) : mmc_qwen2_decoder(m->lm);
    return mmc_generate(&d, p->ids, p->n, opts, out, n_out);
}

bool cli_stream_token(void *user, int32_t token) {
    cli_stream *s = user;
    s->ids[s->n++] = token;
    if (!s->print) return true;
    /* incremental: the decode of the recent tokens [prefix_off, n) minus that of [prefix_off, read_off)
     * (vLLM's and TextStreamer's window: both start at the same token, so a decoder that strips the
     * text's first space, as SentencePiece ones do, strips both alike); O(window) per token, not O(n) */
    char *pre = NULL, *cur = NULL;
    if (mmc_tokenizer_decode(s->tok, s->ids + s->prefix_off, s->read_off - s->prefix_off, true, &pre) == MMC_OK &&
        mmc_tokenizer_decode(s->tok, s->ids + s->prefix_off, s->n - s->prefix_off, true, &cur) == MMC_OK) {
        size_t pl = strlen(pre), cl = strlen(cur);
        bool incomplete = cl >= 3 && memcmp(cur + cl - 3, "\xEF\xBF\xBD", 3) == 0;   /* wait for the rest */
        if (cl > pl && !incomplete) {
            fwrite(cur + pl, 1, cl - pl, stdout);
            fflush(stdout);
            s->printed += cl - pl;
            s->prefix_off = s->read_off;
            s->read_off = s->n;
        }
    }
    free(pre);
    free(cur);
    return true;
}

int cli_prompt_arg(const char *cmd, int argc, char **argv, int *i, cli_prompt_args *a) {
    const char *o = argv[*i];
    const char **slot = !strcmp(o, "--model") ? &a->model : !strcmp(o, "--adapter") ? &a->adapter
                      : !strcmp(o, "--prompt") ? &a->prompt
                      : !strcmp(o, "--system") ? &a->system : !strcmp(o, "--video") ? &a->video
                      : !strcmp(o, "--chat-template") ? &a->chat_template
                      : !strcmp(o, "--chat-template-name") ? &a->chat_template_name : NULL;
    if (!strcmp(o, "--raw")) { a->raw = true; return 1; }
    if (!strcmp(o, "--audio-in-video")) { a->audio_in_video = true; return 1; }
    if (!strcmp(o, "--max-image-pixels")) {
        const char *v = cli_value(argc, argv, i);
        long long n;
        if (!v || !cli_int(o, v, 1, (long long)1 << 40, &n)) return -1;
        a->max_image_pixels = n;
        return 1;
    }
    if (!strcmp(o, "--video-pixel-budget")) { a->video_budget = true; return 1; }
    if (!strcmp(o, "--image-backend")) {
        const char *v = cli_value(argc, argv, i);
        return v && cli_image_backend(cmd, v, &a->resize_mode) == 0 ? 1 : -1;
    }
    if (!strcmp(o, "--video-fps") || !strcmp(o, "--video-frames") || !strcmp(o, "--video-max-frames")) {
        char *end = NULL;
        double x = *i + 1 < argc ? strtod(argv[*i + 1], &end) : 0;
        bool is_fps = o[8] == 'f' && o[9] == 'p';
        if (*i + 1 >= argc || end == argv[*i + 1] || *end || !(x > 0) || x > 1e6 || (!is_fps && x != (int)x)) {
            fprintf(stderr, "mmc %s: option %s needs a positive %s\n", cmd, o, is_fps ? "number" : "integer");
            return -1;
        }
        ++*i;
        if (is_fps) a->video_fps = x;
        else if (o[8] == 'f') a->video_frames = (int)x;
        else a->video_max_frames = (int)x;
        return 1;
    }
    if (!slot && strcmp(o, "--image") != 0 && strcmp(o, "--audio") != 0) return 0;
    if (*i + 1 >= argc) {
        cli_usage(cmd, "option %s needs a value", o);
        return -1;
    }
    const char *v = argv[++*i];
    if (slot) { *slot = v; return 1; }
    if (!strcmp(o, "--audio")) {
        if (a->n_audios == CLI_MAX_IMAGES) {
            cli_usage(cmd, "at most %d audio files", CLI_MAX_IMAGES);
            return -1;
        }
        a->audios[a->n_audios++] = v;
        return 1;
    }
    if (a->n_images == CLI_MAX_IMAGES) {
        cli_usage(cmd, "at most %d images", CLI_MAX_IMAGES);
        return -1;
    }
    a->images[a->n_images++] = v;
    return 1;
}

int cli_image_backend(const char *cmd, const char *v, mmc_vlproc_resize_mode *mode) {
    if (!strcmp(v, "pil")) *mode = MMC_VLPROC_RESIZE_PIL;
    else if (!strcmp(v, "torchvision")) *mode = MMC_VLPROC_RESIZE_TORCH;
    else return cli_usage(cmd, "--image-backend must be pil or torchvision, not '%s'", v);
    return 0;
}

int cli_quantize_arg(const char *cmd, const char *v, int *mode) {
    mmc_quant_mode q;
    if (mmc_quant_mode_parse(v, &q)) return cli_usage(cmd, "--quantize must be int8, nf4 or none, not '%s'", v);
    *mode = (int)q;
    return 0;
}

void cli_bf16_matmul(const char *cmd) {
    if (mmc_gemm_set_bf16_dot(true) != 0) {
        fprintf(stderr, "mmc %s: --bf16-matmul ignored: this CPU has neither AMX nor AVX512_BF16 (bf16 weights "
                        "keep the exact f32 arithmetic)\n", cmd);
        return;
    }
    mmc_gemm_info g;
    mmc_gemm_describe(&g);
    fprintf(stderr, "mmc %s: bf16 weight GEMMs multiply in bf16 on the %s kernel\n", cmd, g.bf16_infer.kernel);
}

int cli_matmul_precision(const char *cmd, const char *v) {
    const int r = mmc_gemm_set_matmul_precision(v);
    if (r < 0) return cli_usage(cmd, "--matmul-precision must be highest, high or medium, not '%s'", v);
    if (r > 0) {
        fprintf(stderr, "mmc %s: --matmul-precision %s: this CPU (or the OS) offers no AMX; f32 GEMMs stay f32\n", cmd, v);
        return 0;
    }
    mmc_gemm_info g;
    mmc_gemm_describe(&g);
    if (strcmp(v, "highest"))
        fprintf(stderr, "mmc %s: f32 GEMMs at matmul precision %s on the %s kernel%s\n", cmd, v, g.f32_matmul.kernel,
                !strcmp(v, "high") ? " (bf16x3: ~1e-6 of sum |a||b| measured, f32 ~2e-7)" : " (operands rounded to bf16)");
    return 0;
}

mmc_status cli_model_quantize(cli_model *m, int mode) {
    if (mode == MMC_WQ_NONE) return MMC_OK;
    mmc_qwen2 *lm = m->lm ? m->lm : m->vlm ? m->vlm->lm : m->llava ? m->llava->lm : m->internvl ? m->internvl->lm
                    : m->omni ? m->omni->lm : NULL;
    if (!lm) return mmc_error(MMC_ERR_UNSUPPORTED, "--quantize: model_type %s has no language model to quantise", m->model_type);
    int n = 0;
    int64_t before = 0, after = 0;
    double t0 = mmc_now();
    mmc_status st = mmc_qwen2_quantize(lm, mode, &n, &before, &after);
    if (st) return mmc_error_prefix(st, "--quantize %s", mmc_quant_mode_name((mmc_quant_mode)mode));
    fprintf(stderr, "mmc: quantised %d decoder linears to %s in %.1f s: %.1f MiB -> %.1f MiB (%.1f MiB saved; "
                    "embeddings, lm_head and other towers as loaded)\n",
            n, mmc_quant_mode_name((mmc_quant_mode)mode), mmc_now() - t0, before / 1048576.0, after / 1048576.0,
            (before - after) / 1048576.0);
    return MMC_OK;
}

mmc_status cli_model_prepack(cli_model *m) {
    mmc_qwen2 *lm = m->lm ? m->lm : m->llava ? m->llava->lm : m->internvl ? m->internvl->lm : m->omni ? m->omni->lm : NULL;
    int n = 0;
    int64_t before = 0, after = 0;
    double t0 = mmc_now();
    mmc_status st = m->vlm ? mmc_qwen2_vl_prepack(m->vlm, &n, &before, &after)
                    : lm   ? mmc_qwen2_prepack(lm, &n, &before, &after) : MMC_OK;
    if (st) return mmc_error_prefix(st, "pre-packing the weights");
    if (n && getenv("MMC_VERBOSE"))
        fprintf(stderr, "mmc: pre-packed %d linears for the GEMM in %.2f s: %.1f MiB -> %.1f MiB\n", n, mmc_now() - t0,
                before / 1048576.0, after / 1048576.0);
    return MMC_OK;
}

int cli_prompt_args_check(const char *cmd, const cli_prompt_args *a) {
    if (!a->model && !a->adapter) return cli_usage(cmd, "--model DIR is required");
    if (!a->prompt) return cli_usage(cmd, "--prompt TEXT is required");
    if (a->raw && (a->n_images || a->video || a->n_audios))
        return cli_usage(cmd, "--raw cannot place images; drop --raw to use the chat template");
    return 0;
}

mmc_status cli_prompt_from_args(cli_model *m, const cli_prompt_args *a, cli_prompt *p) {
    mmc_chat_part parts[2 * CLI_MAX_IMAGES + 2];
    int np = 0;
    for (int i = 0; i < a->n_images; i++) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_IMAGE};
    if (a->video) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_VIDEO};
    for (int i = 0; i < a->n_audios; i++) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_AUDIO};
    parts[np++] = (mmc_chat_part){.type = MMC_CHAT_TEXT, .text = a->prompt};
    mmc_chat_message msgs[2];
    int nm = 0;
    if (a->system) msgs[nm++] = (mmc_chat_message){.role = "system", .content = a->system};
    msgs[nm++] = (mmc_chat_message){.role = "user", .parts = parts, .n_parts = np};
    if (a->max_image_pixels > 0) m->max_image_pixels = a->max_image_pixels;
    mmc_status st = cli_model_set_template(m, a->chat_template, a->chat_template_name);
    if (st) return st;
    if (a->video_fps > 0) { m->vproc.fps = a->video_fps; m->vproc.num_frames = 0; }
    if (a->video_frames > 0) { m->vproc.num_frames = a->video_frames; m->vproc.fps = 0; }
    if (a->video_max_frames > 0) m->vproc.max_frames = a->video_max_frames;
    if (a->video_budget) m->vproc.qwen_vl_utils = true;   /* frames and size as qwen-vl-utils' fetch_video */
    if (m->vl || m->omni) m->proc.resize_mode = a->resize_mode;
    if (a->audio_in_video && !m->omni)
        return mmc_error(MMC_ERR_INVALID, "--audio-in-video needs a Qwen2.5-Omni model; this one is model_type %s",
                         m->model_type);
    m->omni_audio_in_video = a->audio_in_video;
    if (m->llava) m->cproc.resize_mode = m->nproc.base.resize_mode = a->resize_mode;
    if (m->internvl) m->iproc.resize_mode = a->resize_mode;
    if (m->internvl && a->video_fps > 0)   /* InternVLVideoProcessor: fps is read only without num_frames */
        m->iproc.video.do_sample_frames = true, m->iproc.video.fps = a->video_fps, m->iproc.video.num_frames = 0;
    if (m->internvl && a->video_frames > 0)
        m->iproc.video.do_sample_frames = true, m->iproc.video.num_frames = a->video_frames, m->iproc.video.fps = 0;
    if (m->vproc.min_frames > m->vproc.max_frames) m->vproc.min_frames = m->vproc.max_frames;
    cli_audio auds[CLI_MAX_IMAGES];
    for (int i = 0; i < a->n_audios; i++) auds[i] = (cli_audio){.path = a->audios[i]};
    return prompt_build(m, msgs, nm, a->raw, a->prompt, a->images, a->n_images, auds, a->n_audios, a->video, p);
}

mmc_status cli_model_set_template(cli_model *m, const char *file, const char *name) {
    if (!file && !name) return MMC_OK;
    char *src = NULL;
    size_t n = 0;
    mmc_status st = file ? mmc_read_file(file, &src, &n) : MMC_OK;
    if (st) return mmc_error_prefix(st, "--chat-template");
    st = mmc_tokenizer_set_chat_template(m->tok, src, name);
    free(src);
    return st;
}
