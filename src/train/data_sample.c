/* data_sample.c — one dataset record -> model inputs, as transformers' Qwen2VLProcessor
 * makes them: the Qwen2-VL chat template (shared with inference, mmc_chat_encode), images
 * through the Qwen2-VL image processor (smart_resize within min/max_pixels, normalise,
 * patchify), then each <|image_pad|> / <|video_pad|> expanded to t*h*w / merge^2 copies.
 * Labels are the ids of assistant tokens (content + closing <|im_end|>), -100 elsewhere.
 * Truncation to seq_len never cuts a vision block: an image whose tokens would not fit is
 * dropped with everything after it (its pixel rows too), so pads and pixels stay consistent.
 * For a LLaVA model (o->llava) the sample is made as LlavaProcessor makes it instead
 * (prepare_llava): the model's chat template tokenised with the special tokens, images through
 * CLIPImageProcessor, each <image> expanded to one token per image feature. For InternVL
 * (o->internvl, same function) as InternVLProcessor makes it: the images' dynamic tiles, each
 * <IMG_CONTEXT> of the template becoming <img> <IMG_CONTEXT> x (image_seq_length * tiles) </img>.
 * For LLaVA-NeXT / OneVision (o->llava_next, same function) as LlavaNextProcessor /
 * LlavaOnevisionProcessor make it: each image's anyres tiles (base first; OneVision: one padded
 * square each when the record has several images), each <image> expanded to the processor's
 * count for that image's size; image_grid_thw holds (tiles, height, width) per image.
 */
#include "data_internal.h"
#include "mmc_omni.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int32_t mmc_data_pad_id(const mmc_tokenizer *tok) {
    int32_t p = mmc_tokenizer_special_id(tok, MMC_TOK_PAD);
    if (p < 0) p = mmc_tokenizer_token_to_id(tok, "<|endoftext|>");
    return p < 0 ? 0 : p;
}

static mmc_status oom(void) { return mmc_error(MMC_ERR_OOM, "data: out of memory"); }

/* An image from a path or a "data:image/...;base64,..." URL. */
static mmc_status load_one(const char *src, int k, const mmc_image_opts *io, mmc_image *img) {
    if (strncmp(src, "data:", 5)) return mmc_image_load(src, io, img);
    const char *b = strstr(src, ";base64,");
    if (!b) return mmc_error(MMC_ERR_FORMAT, "image %d: data: URL is not base64", k);
    b += 8;
    size_t n = strlen(b);
    uint8_t *buf = malloc(n / 4 * 3 + 3);
    if (!buf) return oom();
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)b[i];
        int v = ch >= 'A' && ch <= 'Z' ? ch - 'A' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
              : ch >= '0' && ch <= '9' ? ch - '0' + 52 : ch == '+' || ch == '-' ? 62 : ch == '/' || ch == '_' ? 63 : -1;
        if (ch == '=') break;
        if (v < 0) {
            if (ch == '\n' || ch == '\r' || ch == ' ') continue;
            free(buf);
            return mmc_error(MMC_ERR_FORMAT, "image %d: invalid base64 character at offset %zu of its data: URL", k, i);
        }
        acc = (acc << 6) | (uint32_t)v;
        if ((bits += 6) >= 8) { bits -= 8; buf[o++] = (uint8_t)(acc >> bits); }
    }
    char name[48];
    snprintf(name, sizeof name, "image %d (data: URL)", k);
    mmc_status st = mmc_image_load_memory(buf, o, name, io, img);
    free(buf);
    return st;
}

/* Load and preprocess images [0, n) of the record into pixel rows + grids. */
static mmc_status load_images(const mmc_qwen2vl_proc *p, const mmc_image_opts *io, const mmc_example *ex, int n,
                              bool blank, mmc_vlproc_out *out, bool *media_err) {
    memset(out, 0, sizeof *out);
    if (n == 0) return MMC_OK;
    mmc_image *imgs = calloc((size_t)n, sizeof *imgs);
    if (!imgs) return oom();
    mmc_status st = MMC_OK;
    int loaded = 0;
    for (; loaded < n; loaded++)
        if ((st = load_one(ex->images[loaded], loaded, io, &imgs[loaded]))) { *media_err = true; break; }
        else if (blank) memset(imgs[loaded].data, 0, (size_t)imgs[loaded].height * imgs[loaded].width * 3);
    if (!st && (st = mmc_qwen2vl_preprocess_images(p, imgs, n, out))) *media_err = true;
    for (int i = 0; i < loaded; i++) mmc_image_free(&imgs[i]);
    free(imgs);
    return st;
}

static mmc_status load_videos(const mmc_qwen2vl_proc *p, const mmc_qwen2vl_video_proc *vp, const mmc_image_opts *io,
                              const mmc_example *ex, int n, bool blank, mmc_vlproc_out *out, double *spg,
                              bool *media_err) {
    memset(out, 0, sizeof *out);
    if (n == 0) return MMC_OK;
    mmc_status st = MMC_OK;
    int64_t rows = 0, dim = 0;
    mmc_vlproc_out *vs = calloc((size_t)n, sizeof *vs);
    if (!vs) return oom();
    for (int v = 0; v < n && !st; v++) {
        mmc_image *frames = NULL;
        int nf = 0;
        struct stat sb;
        mmc_video_clip clip = {0};
        bool file = stat(ex->videos[v], &sb) == 0 && S_ISREG(sb.st_mode);
        /* a video file: decoded and sampled as `mmc generate --video` does (mmc_video.h), each
         * frame resized and patchified as it is decoded; blanked frames go the two-step way */
        if (file && !blank) {
            st = mmc_qwen2vl_video_load_preprocess(vp, ex->videos[v], &clip, &vs[v]);
            if (st) { *media_err = true; break; }
            spg[v] = clip.second_per_grid_ts;
            mmc_video_clip_free(&clip);
            rows += vs[v].pixel_values->shape[0];
            dim = vs[v].pixel_values->shape[1];
            continue;
        }
        if (file) st = mmc_qwen2vl_video_load(vp, ex->videos[v], &clip);
        else st = mmc_load_frames_dir(ex->videos[v], io, &frames, &nf);
        if (st) { *media_err = true; break; }
        if (file) { frames = clip.frames; nf = clip.n; }
        /* VideoMetadata.sampled_fps: a frame list has no rate, counted as 24 fps */
        spg[v] = file ? clip.second_per_grid_ts : vp->proc.temporal_patch_size / 24.0;
        for (int f = 0; blank && f < nf; f++) memset(frames[f].data, 0, (size_t)frames[f].height * frames[f].width * 3);
        if (nf == 0) st = mmc_error(MMC_ERR_FORMAT, "%s: video directory has no frames", ex->videos[v]);
        else if (file) st = mmc_qwen2vl_video_preprocess(vp, frames, nf, &vs[v]);
        else st = mmc_qwen2vl_preprocess_video(p, frames, nf, &vs[v]);
        if (st) *media_err = true;
        if (file) mmc_video_clip_free(&clip);
        else {
            for (int f = 0; f < nf; f++) mmc_image_free(&frames[f]);
            free(frames);
        }
        if (!st) { rows += vs[v].pixel_values->shape[0]; dim = vs[v].pixel_values->shape[1]; }
    }
    if (!st) { /* concatenate */
        out->pixel_values = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(rows, dim));
        out->grid_thw = malloc((size_t)n * sizeof *out->grid_thw);
        if (!out->pixel_values || !out->grid_thw) st = oom();
        else {
            int64_t r = 0;
            for (int v = 0; v < n; v++) {
                int64_t k = vs[v].pixel_values->shape[0];
                memcpy((float *)out->pixel_values->data + r * dim, vs[v].pixel_values->data, (size_t)(k * dim) * 4);
                r += k;
                memcpy(out->grid_thw[v], vs[v].grid_thw[0], sizeof out->grid_thw[v]);
                out->num_tokens += vs[v].num_tokens;
            }
            out->n_grid = n;
        }
    }
    for (int v = 0; v < n; v++) mmc_vlproc_out_free(&vs[v]);
    free(vs);
    if (st) mmc_vlproc_out_free(out);
    return st;
}

/* The first n floats of a persistent tensor as a free()-able array: its own buffer when it
 * holds exactly n (mmc_tensor_new allocates with aligned_alloc; the tensor gives up
 * ownership), else a copy (truncation dropped trailing images). */
static float *steal_or_copy(mmc_tensor *t, int64_t n) {
    if (mmc_numel(t) == n && (t->flags & MMC_OWNS_DATA)) {
        t->flags &= ~(uint32_t)MMC_OWNS_DATA;
        return t->data;
    }
    float *d = malloc((size_t)n * sizeof(float));
    if (d) memcpy(d, t->data, (size_t)n * sizeof(float));
    return d;
}

static int count_parts(const mmc_chat_message *m, int n, mmc_chat_part_type t) {
    int c = 0;
    for (int i = 0; i < n; i++)
        for (int p = 0; p < m[i].n_parts; p++) c += m[i].parts[p].type == t;
    return c;
}

/* OpenGVLab's InternVLChatModel: its tokenizer's chat template reads message['content'] as a string, so
 * each message's parts are joined, an image part becoming "<IMG_CONTEXT>\n" — chat()'s "<image>\n" + text,
 * whose "<image>" becomes <img> <IMG_CONTEXT> x N </img> (the single <IMG_CONTEXT> is expanded below as
 * InternVLProcessor's is). *flat and *texts are malloc'd (free_flat). */
static void free_flat(mmc_chat_message *flat, char **texts, int n) {
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(flat);
}

static mmc_status flatten_parts(const mmc_chat_message *msgs, int n, mmc_chat_message **flat, char ***texts) {
    *flat = calloc((size_t)(n ? n : 1), sizeof **flat);
    *texts = calloc((size_t)(n ? n : 1), sizeof **texts);
    if (!*flat || !*texts) { free_flat(*flat, *texts, n); *flat = NULL, *texts = NULL; return oom(); }
    for (int i = 0; i < n; i++) {
        (*flat)[i] = msgs[i];
        if (msgs[i].content || !msgs[i].parts) continue;
        size_t len = 1;
        for (int k = 0; k < msgs[i].n_parts; k++)
            len += msgs[i].parts[k].type == MMC_CHAT_TEXT && msgs[i].parts[k].text ? strlen(msgs[i].parts[k].text) : 16;
        char *t = (*texts)[i] = malloc(len);
        if (!t) { free_flat(*flat, *texts, n); *flat = NULL, *texts = NULL; return oom(); }
        t[0] = 0;
        for (int k = 0; k < msgs[i].n_parts; k++) {
            const mmc_chat_part *q = &msgs[i].parts[k];
            if (q->type == MMC_CHAT_IMAGE) strcat(t, "<IMG_CONTEXT>\n");
            else if (q->type == MMC_CHAT_TEXT && q->text) strcat(t, q->text);
        }
        (*flat)[i].content = t, (*flat)[i].parts = NULL, (*flat)[i].n_parts = 0;
    }
    return MMC_OK;
}

/* InternVL (HF-native) with videos, as InternVLProcessor makes the sample: each video through
 * InternVLVideoProcessor (mmc_internvl_video_load with the model's video settings), the rendered
 * template's "<video>" becoming "Frame1: <IMG_CONTEXT>\nFrame2: ..." (mmc_internvl_video_text) before
 * tokenising, the assistant spans moved with the text. On return the images and frames are units in the
 * order of their placeholders: *tiles (zero-terminated) 1 per frame, *pv their rows in that order,
 * *ntok / *sizes re-allocated to match; *ids / *mask / *n the tokenised text (one <IMG_CONTEXT> a unit). */
static mmc_status internvl_videos(const mmc_data_opts *o, const mmc_tokenizer *tok, const mmc_example *ex, int n_msgs,
                                  const mmc_chat_options *co, int n_img, int n_vid, mmc_tensor **pv, int64_t **tiles,
                                  int64_t **ntok, int64_t (**sizes)[2], int32_t **ids, uint8_t **mask, int64_t *n,
                                  bool *media_err) {
    const mmc_internvl_video_proc *vp = &o->iproc.video;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (o->max_image_pixels > 0) io.max_pixels = o->max_image_pixels;
    mmc_tensor **vpx = calloc((size_t)n_vid, sizeof *vpx), *all = NULL;
    int64_t *nf = calloc((size_t)n_vid, sizeof *nf), *at = calloc((size_t)n_vid, sizeof *at);
    int64_t *grow = calloc((size_t)n_vid, sizeof *grow), *offs = NULL, *t2 = NULL;
    uint8_t *order = calloc((size_t)(n_img + n_vid), 1);
    char *s = NULL, *s2 = NULL;
    mmc_chat_span *sp = NULL;
    int nsp = 0;
    mmc_status st = MMC_OK;
    if (!vpx || !nf || !at || !grow || !order) { st = oom(); goto done; }
    if (vp->size_h != o->iproc.size_h || vp->size_w != o->iproc.size_w) {
        st = mmc_error(MMC_ERR_INVALID, "the video processor's frames are %lld x %lld but the image tiles %lld x %lld: "
                       "set the video processor's size to the tile size (the tower reads both as tiles)",
                       (long long)vp->size_w, (long long)vp->size_h, (long long)o->iproc.size_w, (long long)o->iproc.size_h);
        goto done;
    }
    for (int v = 0; v < n_vid; v++) {
        int k = 0;
        if ((st = mmc_internvl_video_load(vp, ex->videos[v], &io, &vpx[v], NULL, &k))) { *media_err = true; goto done; }
        nf[v] = k;
        if (o->blank_media) {   /* the control: black frames, as images are blanked before processing */
            float *d = vpx[v]->data;
            const int64_t hw = vpx[v]->shape[2] * vpx[v]->shape[3];
            for (int64_t f = 0; f < k; f++)
                for (int c = 0; c < 3; c++)
                    for (int64_t i = 0; i < hw; i++)
                        d[(f * 3 + c) * hw + i] = vp->do_normalize ? (0.0f - vp->image_mean[c]) / vp->image_std[c] : 0.0f;
        }
    }
    if ((st = mmc_chat_render(tok, ex->messages, n_msgs, co, &s, &sp, &nsp))) goto done;
    if ((st = mmc_internvl_video_text(s, n_img, nf, n_vid, &s2, order, at, grow))) goto done;
    for (int k = 0; k < nsp; k++) {   /* the spans move with the text before them */
        int64_t ds = 0, de = 0;
        for (int v = 0; v < n_vid; v++) {
            if (at[v] < sp[k].start) ds += grow[v];
            if (at[v] < sp[k].end) de += grow[v];
        }
        sp[k].start += ds, sp[k].end += de;
    }
    if ((st = mmc_tokenizer_encode_offsets(tok, s2, -1, co->add_special_tokens, ids, &offs, n))) goto done;
    if (!(*mask = calloc((size_t)*n + 1, 1))) { st = oom(); goto done; }
    for (int64_t i = 0, k = 0; i < *n; i++) {   /* as mmc_chat_encode: tokens starting inside an assistant span */
        int64_t a = offs[2 * i];
        while (k < nsp && a >= sp[k].end) k++;
        (*mask)[i] = k < nsp && a >= sp[k].start;
    }
    /* the units in placeholder order: an image's tiles, or one frame */
    int64_t units = n_img, rows = 0;
    for (int v = 0; v < n_vid; v++) units += nf[v], rows += nf[v];
    for (int i = 0; i < n_img; i++) rows += (*tiles)[i];
    const int64_t S = vp->size_h, per = 3 * S * vp->size_w;
    if (!(t2 = calloc((size_t)units + 1, sizeof *t2)) || !(all = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(rows, 3, S, vp->size_w)))) {
        st = oom();
        goto done;
    }
    if (*pv && ((*pv)->shape[2] != S || (*pv)->shape[3] != vp->size_w)) {
        st = mmc_error(MMC_ERR_INVALID, "image tiles and video frames differ in size");
        goto done;
    }
    float *dst = all->data;
    const float *isrc = *pv ? (*pv)->data : NULL;
    int64_t u = 0;
    for (int k = 0, i = 0, v = 0; k < n_img + n_vid; k++) {
        if (order[k] == 0) {
            memcpy(dst, isrc, sizeof(float) * (size_t)((*tiles)[i] * per));
            dst += (*tiles)[i] * per, isrc += (*tiles)[i] * per;
            t2[u++] = (*tiles)[i++];
        } else {
            memcpy(dst, vpx[v]->data, sizeof(float) * (size_t)(nf[v] * per));
            dst += nf[v] * per;
            for (int64_t f = 0; f < nf[v]; f++) t2[u++] = 1;
            v++;
        }
    }
    int64_t *nt = calloc((size_t)units + 1, sizeof *nt);
    int64_t (*sz)[2] = calloc((size_t)units + 1, sizeof *sz);
    if (!nt || !sz) { free(nt); free(sz); st = oom(); goto done; }
    free(*ntok), free(*sizes), free(*tiles);
    *ntok = nt, *sizes = sz, *tiles = t2;
    t2 = NULL;
    mmc_tensor_free(*pv);
    *pv = all;
    all = NULL;
done:
    for (int v = 0; vpx && v < n_vid; v++) mmc_tensor_free(vpx[v]);
    free(vpx), free(nf), free(at), free(grow), free(order), free(offs), free(t2);
    free(s), free(s2), free(sp);
    mmc_tensor_free(all);
    if (st) { free(*ids), free(*mask); *ids = NULL, *mask = NULL, *n = 0; }
    return st;
}

/* LLaVA: labels from the assistant spans as for Qwen2-VL; truncation drops an image block that
 * would not fit with everything after it. */
static mmc_status prepare_llava(const mmc_data_opts *o, const mmc_tokenizer *tok, const mmc_dataset *ds,
                                int64_t idx, bool prompt_only, mmc_batch *out, bool *media_err) {
    mmc_example ex;
    mmc_dataset_get(ds, idx, &ex);
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (o->max_image_pixels > 0) io.max_pixels = o->max_image_pixels;
    int n_msgs = ex.n_messages;
    if (prompt_only) {
        while (n_msgs > 0 && strcmp(ex.messages[n_msgs - 1].role, "assistant")) n_msgs--;
        n_msgs--;
    }
    int n_img = count_parts(ex.messages, n_msgs, MMC_CHAT_IMAGE);
    const int n_vid = count_parts(ex.messages, n_msgs, MMC_CHAT_VIDEO);
    const int64_t K = o->llava_image_tokens;
    int64_t *tiles = NULL;   /* InternVL / NeXT: tiles per image (else 1 each) */
    int64_t *ntok = NULL;    /* the tokens each image's <image> becomes (InternVL: with <img> </img>) */
    int64_t (*sizes)[2] = NULL;   /* NeXT / OneVision: each image's (height, width) */
    const char *family = o->llava_next ? "LLaVA-NeXT / OneVision" : o->internvl ? "InternVL" : "LLaVA-1.5";
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    int64_t n = 0;
    mmc_tensor *pv = NULL;
    mmc_status st;
    if (n_vid && o->internvl_chat) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: videos are not supported for OpenGVLab's internvl_chat layout yet "
                       "(transformers' InternVL layout, model_type internvl, trains on them; OpenGVLab's video "
                       "pipeline is not implemented)",
                       mmc_dataset_path(ds), ex.line);
        goto fail;
    }
    if (n_vid && !o->internvl) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: %s takes images, not videos", mmc_dataset_path(ds),
                       ex.line, family);
        goto fail;
    }
    tiles = calloc((size_t)n_img + 1, sizeof *tiles);
    ntok = calloc((size_t)n_img + 1, sizeof *ntok);
    sizes = calloc((size_t)n_img + 1, sizeof *sizes);
    if (!tiles || !ntok || !sizes) { st = oom(); goto fail; }
    for (int i = 0; i < n_img; i++) tiles[i] = 1;
    if (n_img) {
        mmc_image *imgs = calloc((size_t)n_img, sizeof *imgs);
        if (!imgs) { st = oom(); goto fail; }
        int loaded = 0;
        st = MMC_OK;
        for (; loaded < n_img; loaded++)
            if ((st = load_one(ex.images[loaded], loaded, &io, &imgs[loaded]))) break;
            else if (o->blank_media) memset(imgs[loaded].data, 0, (size_t)imgs[loaded].height * imgs[loaded].width * 3);
        const bool multi = n_img > 1;   /* OneVision: several images, one padded square each */
        if (!st && o->internvl) st = mmc_internvl_preprocess(&o->iproc, imgs, n_img, &pv, tiles);   /* [tiles, 3, s, s] */
        else if (!st && o->llava_next) st = mmc_llava_next_preprocess(&o->nproc, imgs, n_img, multi, &pv, sizes);
        else if (!st) st = mmc_clip_preprocess(&o->clip, imgs, n_img, &pv);   /* [n_img, 3, S, S] */
        for (int i = 0; !st && o->llava_next && i < n_img; i++) {   /* [tiles, 3, S, S] */
            tiles[i] = mmc_llava_next_image_tiles(&o->nproc, sizes[i][0], sizes[i][1], multi);
            ntok[i] = mmc_llava_next_image_tokens(&o->nproc, sizes[i][0], sizes[i][1], multi);
        }
        for (int i = 0; i < loaded; i++) mmc_image_free(&imgs[i]);
        free(imgs);
        if (st) {
            *media_err = true;
            st = mmc_error_prefix(st, "%s:%d: sample %lld", mmc_dataset_path(ds), ex.line, (long long)idx);
            goto fail;
        }
    }
    mmc_chat_options co = {.add_generation_prompt = prompt_only, .add_vision_id = o->add_vision_id,
                           .add_special_tokens = true};
    if (n_vid) {   /* InternVL's videos: frames as one-tile images, placed as InternVLProcessor places them */
        if ((st = internvl_videos(o, tok, &ex, n_msgs, &co, n_img, n_vid, &pv, &tiles, &ntok, &sizes, &ids, &mask, &n,
                                  media_err))) {
            if (*media_err) st = mmc_error_prefix(st, "%s:%d: sample %lld", mmc_dataset_path(ds), ex.line, (long long)idx);
            else st = mmc_error_prefix(st, "%s:%d", mmc_dataset_path(ds), ex.line);
            goto fail;
        }
        n_img = 0;   /* each image and each frame is one unit now */
        while (tiles[n_img] > 0) n_img++;
    } else if (o->internvl_chat) {
        mmc_chat_message *flat = NULL;
        char **texts = NULL;
        if ((st = flatten_parts(ex.messages, n_msgs, &flat, &texts))) goto fail;
        st = mmc_chat_encode(tok, flat, n_msgs, &co, &ids, &mask, &n);
        free_flat(flat, texts, n_msgs);
        if (st) goto fail;
    } else if ((st = mmc_chat_encode(tok, ex.messages, n_msgs, &co, &ids, &mask, &n))) {
        goto fail;
    }
    for (int i = 0; !o->llava_next && i < n_img; i++) ntok[i] = o->internvl ? K * tiles[i] + 2 : K;
    int64_t seen = 0;
    for (int64_t i = 0; i < n; i++) seen += ids[i] == o->llava_image_id;
    if (seen != n_img) {
        st = mmc_error(MMC_ERR_FORMAT, "%s:%d: the text holds %lld <image> tokens for %d images (literal <image> in "
                       "the text?)", mmc_dataset_path(ds), ex.line, (long long)seen, n_img);
        goto fail;
    }
    /* the expanded length, and where it must be cut: before the first image that would not fit */
    int64_t total = 0, cut = -1;
    int keep = 0, img = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t w = ids[i] != o->llava_image_id ? 1 : ntok[img++];
        if (cut < 0 && total + w > o->seq_len) cut = w > 1 ? total : o->seq_len;
        if (cut < 0 && w > 1) keep++;
        total += w;
    }
    if (cut >= 0 && !o->truncation) {
        st = mmc_error(MMC_ERR_INVALID, "%s:%d: sample %lld has %lld tokens > seq_len %lld (set data.truncation: "
                       "true or raise seq_len)", mmc_dataset_path(ds), ex.line, (long long)idx, (long long)total,
                       (long long)o->seq_len);
        goto fail;
    }
    const int64_t T = cut >= 0 ? cut : total;
    out->input_ids = malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    out->labels = malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    out->sample_ids = malloc(sizeof *out->sample_ids);
    if (!out->input_ids || !out->labels || !out->sample_ids) { st = oom(); goto fail; }
    int64_t j = 0;
    img = 0;
    for (int64_t i = 0; i < n && j < T; i++) {
        if (ids[i] == o->llava_image_id) {
            const int64_t kk = o->internvl ? ntok[img++] - 2 : ntok[img++];
            if (o->internvl) { out->input_ids[j] = o->internvl_start; out->labels[j++] = MMC_IGNORE_INDEX; }
            for (int64_t q = 0; q < kk; q++, j++) { out->input_ids[j] = ids[i]; out->labels[j] = MMC_IGNORE_INDEX; }
            if (o->internvl) { out->input_ids[j] = o->internvl_end; out->labels[j++] = MMC_IGNORE_INDEX; }
        } else {
            out->input_ids[j] = ids[i];
            out->labels[j] = (mask[i] && !prompt_only) ? ids[i] : MMC_IGNORE_INDEX;
            j++;
        }
    }
    out->B = 1;
    out->T = T;
    out->n_seqs = 1;
    out->sample_ids[0] = idx;
    out->sample_index = idx;
    out->n_tokens = T;
    for (int64_t t = 1; t < T; t++) out->n_label_tokens += out->labels[t] != MMC_IGNORE_INDEX;
    if (keep) {
        const int64_t dim = mmc_numel(pv) / pv->shape[0];
        int64_t rows = 0;   /* the kept images' tiles */
        for (int k = 0; k < keep; k++) rows += tiles[k];
        out->pixel_values = steal_or_copy(pv, rows * dim);
        out->image_grid_thw = malloc((size_t)keep * 3 * sizeof(int64_t));
        if (!out->pixel_values || !out->image_grid_thw) { st = oom(); goto fail; }
        for (int k = 0; k < 3 * keep; k++)   /* (tiles, 1, 1); NeXT / OneVision: (tiles, height, width) */
            out->image_grid_thw[k] = k % 3 == 0 ? tiles[k / 3] : o->llava_next ? sizes[k / 3][k % 3 - 1] : 1;
        out->patch_dim = dim;
        out->n_patches = rows;
        out->n_images = keep;
    }
    free(tiles);
    free(ntok);
    free(sizes);
    free(ids);
    free(mask);
    mmc_tensor_free(pv);
    return MMC_OK;
fail:
    free(tiles);
    free(ntok);
    free(sizes);
    free(ids);
    free(mask);
    mmc_tensor_free(pv);
    mmc_batch_free(out);
    return st;
}


/* Qwen2.5-Omni: the record's audios through the WhisperFeatureExtractor into out->audio_feats
 * [n_aud, mels, stride] — only the real frames, stride = the longest clip's frame count (the encoder
 * reads frames [0, audio_frames[a]) of each row, so the 30 s padding is never copied) — served by the
 * loader's cache (o->audio_cache, audio_cache.c) when it holds the clip; and every <|AUDIO|> of ids
 * (one per audio part, as the chat template renders it) expanded to the encoder's token count for that
 * audio (not trained: mask 0). */
static mmc_status omni_audios(const mmc_data_opts *o, const mmc_example *ex, int n_aud, int32_t **ids,
                              uint8_t **mask, int64_t *n, mmc_batch *out, bool *media_err) {
    const mmc_whisper_fe *fe = o->fe;
    const int64_t mels = fe->feature_size, F = fe->nb_max_frames;
    float *all = malloc(sizeof(float) * (size_t)(n_aud * mels * F));   /* [n_aud, mels, F] until compacted */
    out->audio_frames = malloc(sizeof(int64_t) * (size_t)n_aud);
    if (!all || !out->audio_frames) { free(all); return oom(); }
    int64_t total = *n, seen = 0, stride = 1;
    for (int a = 0; a < n_aud; a++) {
        float *dst = all + (size_t)a * (size_t)(mels * F);
        int64_t frames = 0;
        if (!mmc_audio_cache_get(o->audio_cache, ex->audios[a], o->blank_media, mels, dst, F, &frames)) {
            mmc_audio au = {0};
            mmc_status st = mmc_audio_load_max(ex->audios[a], fe->sampling_rate, MMC_AUDIO_MAX_SECONDS, &au);
            float *f = NULL;
            int64_t fs = 0;
            if (!st) st = mmc_omni_audio_features(fe, au.samples, au.n, &f, &fs, &frames);
            if (!st && o->blank_media) {   /* the silent-audio control: the features of zeros of the same length */
                float *z = calloc((size_t)(au.n ? au.n : 1), sizeof *z);
                free(f);
                f = NULL;
                st = z ? mmc_omni_audio_features(fe, z, au.n, &f, &fs, &frames) : oom();
                free(z);
            }
            mmc_audio_free(&au);
            if (!st && fs != F) st = mmc_error(MMC_ERR_FORMAT, "audio features of %lld frames, expected %lld",
                                               (long long)fs, (long long)F);
            if (st) { free(f); free(all); *media_err = true; return mmc_error_prefix(st, "audio %d (%s)", a, ex->audios[a]); }
            memcpy(dst, f, sizeof(float) * (size_t)(mels * F));
            free(f);
            mmc_audio_cache_put(o->audio_cache, ex->audios[a], o->blank_media, mels, dst, F, frames);
        }
        out->audio_frames[a] = frames;
        if (frames > stride) stride = frames;
        total += mmc_omni_audio_tokens(frames) - 1;
    }
    /* compact [n_aud, mels, F] to [n_aud, mels, stride]; columns past a clip's frames are zero */
    out->audio_feats = calloc((size_t)(n_aud * mels * stride), sizeof(float));
    if (!out->audio_feats) { free(all); return oom(); }
    for (int a = 0; a < n_aud; a++)
        for (int64_t m = 0; m < mels; m++)
            memcpy(out->audio_feats + ((size_t)a * (size_t)mels + (size_t)m) * (size_t)stride,
                   all + ((size_t)a * (size_t)mels + (size_t)m) * (size_t)F, sizeof(float) * (size_t)out->audio_frames[a]);
    free(all);
    out->audio_mels = mels, out->audio_stride = stride;
    out->n_audios = n_aud;
    for (int64_t i = 0; i < *n; i++) seen += (*ids)[i] == o->omni_audio_id;
    if (seen != n_aud)
        return mmc_error(MMC_ERR_FORMAT, "the text holds %lld <|AUDIO|> tokens for %d audios (literal special tokens "
                         "in the text?)", (long long)seen, n_aud);
    int32_t *ni = malloc(sizeof(int32_t) * (size_t)total);
    uint8_t *nm = malloc((size_t)total);
    if (!ni || !nm) { free(ni); free(nm); return oom(); }
    int64_t j = 0;
    int a = 0;
    for (int64_t i = 0; i < *n; i++) {
        int64_t k = (*ids)[i] == o->omni_audio_id ? mmc_omni_audio_tokens(out->audio_frames[a++]) : 1;
        for (int64_t q = 0; q < k; q++, j++) ni[j] = (*ids)[i], nm[j] = k == 1 && (*ids)[i] != o->omni_audio_id ? (*mask)[i] : 0;
    }
    free(*ids);
    free(*mask);
    *ids = ni, *mask = nm, *n = total;
    return MMC_OK;
}

mmc_status mmc_data_prepare_ex(const mmc_data_opts *o, const mmc_tokenizer *tok, const mmc_dataset *ds,
                               int64_t idx, bool prompt_only, mmc_batch *out, bool *media_err) {
    memset(out, 0, sizeof *out);
    *media_err = false;
    if (o->llava) return prepare_llava(o, tok, ds, idx, prompt_only, out, media_err);
    *media_err = false;
    mmc_example ex;
    mmc_dataset_get(ds, idx, &ex);
    mmc_qwen2vl_proc proc = o->proc;
    if (o->min_pixels > 0) proc.min_pixels = o->min_pixels;
    if (o->max_pixels > 0) proc.max_pixels = o->max_pixels;
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (o->max_image_pixels > 0) io.max_pixels = o->max_image_pixels;
    int n_msgs = ex.n_messages;
    if (prompt_only) { /* up to (not including) the last assistant turn */
        while (n_msgs > 0 && strcmp(ex.messages[n_msgs - 1].role, "assistant")) n_msgs--;
        n_msgs--;
    }
    int n_img = count_parts(ex.messages, n_msgs, MMC_CHAT_IMAGE);
    int n_vid = count_parts(ex.messages, n_msgs, MMC_CHAT_VIDEO);
    int n_aud = count_parts(ex.messages, n_msgs, MMC_CHAT_AUDIO);
    const int32_t img_pad = o->omni ? o->omni_image_id : mmc_tokenizer_token_to_id(tok, "<|image_pad|>");
    const int32_t vid_pad = o->omni ? o->omni_video_id : mmc_tokenizer_token_to_id(tok, "<|video_pad|>");
    const int32_t vis_start = mmc_tokenizer_token_to_id(tok, o->omni ? "<|vision_bos|>" : "<|vision_start|>");
    const int64_t merge2 = (int64_t)o->proc.merge_size * o->proc.merge_size;
    mmc_vlproc_out iv = {0}, vv = {0};
    int32_t *ids = NULL, *eids = NULL, *elab = NULL;
    uint8_t *mask = NULL;
    int64_t n = 0;
    mmc_status st;
    if (n_aud && !o->omni) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: the sample has audio; audio input needs a Qwen2.5-Omni model "
                       "(model_type qwen2_5_omni_thinker)", mmc_dataset_path(ds), ex.line);
        goto fail;
    }
    if ((n_img && img_pad < 0) || (n_vid && vid_pad < 0)) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: the tokenizer has no <|image_pad|>/<|video_pad|> token",
                       mmc_dataset_path(ds), ex.line);
        goto fail;
    }
    if ((st = load_images(&proc, &io, &ex, n_img, o->blank_media, &iv, media_err))) goto media;
    double *spg = malloc(sizeof(double) * (size_t)(n_vid ? n_vid : 1));
    if (!spg) { st = oom(); goto fail; }
    st = load_videos(&proc, &o->vproc, &io, &ex, n_vid, o->blank_media, &vv, spg, media_err);
    if (st) { free(spg); goto media; }
    out->video_second_per_grid_ts = spg;   /* freed with the batch */
    mmc_chat_options co = {.add_generation_prompt = prompt_only, .add_vision_id = o->add_vision_id};
    if ((st = mmc_chat_encode(tok, ex.messages, n_msgs, &co, &ids, &mask, &n))) goto fail;
    if (n_aud && (st = omni_audios(o, &ex, n_aud, &ids, &mask, &n, out, media_err))) goto media;

    /* expand pads; the counts must match the media (text could contain literal pad tokens) */
    int64_t total = n, seen_img = 0, seen_vid = 0;
    for (int64_t i = 0; i < n; i++) {
        if (n_img && ids[i] == img_pad) {
            if (seen_img < iv.n_grid) total += iv.grid_thw[seen_img][0] * iv.grid_thw[seen_img][1] * iv.grid_thw[seen_img][2] / merge2 - 1;
            seen_img++;
        } else if (n_vid && ids[i] == vid_pad) {
            if (seen_vid < vv.n_grid) total += vv.grid_thw[seen_vid][0] * vv.grid_thw[seen_vid][1] * vv.grid_thw[seen_vid][2] / merge2 - 1;
            seen_vid++;
        }
    }
    if (seen_img != n_img || seen_vid != n_vid) {
        st = mmc_error(MMC_ERR_FORMAT, "%s:%d: the text holds %lld <|image_pad|> and %lld <|video_pad|> tokens "
                       "for %d images and %d videos (literal special tokens in the text?)",
                       mmc_dataset_path(ds), ex.line, (long long)seen_img, (long long)seen_vid, n_img, n_vid);
        goto fail;
    }
    eids = malloc((size_t)total * sizeof *eids);
    elab = malloc((size_t)total * sizeof *elab);
    int64_t *vstart = malloc((size_t)(n_img + n_vid + 1) * sizeof *vstart); /* vision_start pos */
    int64_t *vend = malloc((size_t)(n_img + n_vid + 1) * sizeof *vend);     /* after last pad */
    if (!eids || !elab || !vstart || !vend) { free(vstart); free(vend); st = oom(); goto fail; }
    int64_t j = 0;
    seen_img = seen_vid = 0;
    for (int64_t i = 0; i < n; i++) {
        bool ii = n_img && ids[i] == img_pad, vi = n_vid && ids[i] == vid_pad;
        if (ii || vi) {
            const int64_t *g = ii ? iv.grid_thw[seen_img] : vv.grid_thw[seen_vid];
            int64_t k = g[0] * g[1] * g[2] / merge2, slot = ii ? seen_img : n_img + seen_vid;
            vstart[slot] = (i > 0 && ids[i - 1] == vis_start) ? j - 1 : j;
            for (int64_t q = 0; q < k; q++) { eids[j] = ids[i]; elab[j] = MMC_IGNORE_INDEX; j++; }
            vend[slot] = j;
            if (ii) seen_img++; else seen_vid++;
        } else {
            eids[j] = ids[i];
            elab[j] = (mask[i] && !prompt_only) ? ids[i] : MMC_IGNORE_INDEX;
            j++;
        }
    }
    /* truncation */
    int keep_img = n_img, keep_vid = n_vid;
    if (total > o->seq_len) {
        if (!o->truncation || n_aud) {   /* (audio runs are not cut: the features would disagree) */
            free(vstart); free(vend);
            st = mmc_error(MMC_ERR_INVALID, "%s:%d: sample %lld has %lld tokens > seq_len %lld (%s)",
                           mmc_dataset_path(ds), ex.line, (long long)idx, (long long)total, (long long)o->seq_len,
                           n_aud ? "samples with audio are never cut: raise seq_len or shorten the audio"
                                 : "set data.truncation: true, raise seq_len or lower max_pixels");
            goto fail;
        }
        int64_t cut = o->seq_len;
        for (int s = 0; s < n_img + n_vid; s++)
            if (vend[s] > o->seq_len && vstart[s] < cut) cut = vstart[s];
        keep_img = keep_vid = 0;
        for (int s = 0; s < n_img; s++) keep_img += vend[s] <= cut;
        for (int s = 0; s < n_vid; s++) keep_vid += vend[n_img + s] <= cut;
        total = cut;
    }
    free(vstart);
    free(vend);

    out->B = 1;
    out->T = total;
    out->input_ids = eids;
    out->labels = elab;
    eids = elab = NULL;
    out->n_seqs = 1;
    out->sample_ids = malloc(sizeof *out->sample_ids);
    if (!out->sample_ids) { st = oom(); goto fail; }
    out->sample_ids[0] = idx;
    out->sample_index = idx;
    out->n_tokens = total;
    for (int64_t t = 1; t < total; t++) out->n_label_tokens += out->labels[t] != MMC_IGNORE_INDEX;
    out->patch_dim = iv.pixel_values ? iv.pixel_values->shape[1] : vv.pixel_values ? vv.pixel_values->shape[1] : 0;
    if (keep_img) {
        int64_t rows = 0;
        for (int s = 0; s < keep_img; s++) rows += iv.grid_thw[s][0] * iv.grid_thw[s][1] * iv.grid_thw[s][2];
        out->pixel_values = steal_or_copy(iv.pixel_values, rows * out->patch_dim);
        out->image_grid_thw = malloc((size_t)keep_img * 3 * sizeof(int64_t));
        if (!out->pixel_values || !out->image_grid_thw) { st = oom(); goto fail; }
        memcpy(out->image_grid_thw, iv.grid_thw, (size_t)keep_img * 3 * sizeof(int64_t));
        out->n_patches = rows;
        out->n_images = keep_img;
    }
    if (keep_vid) {
        int64_t rows = 0;
        for (int s = 0; s < keep_vid; s++) rows += vv.grid_thw[s][0] * vv.grid_thw[s][1] * vv.grid_thw[s][2];
        out->video_values = steal_or_copy(vv.pixel_values, rows * out->patch_dim);
        out->video_grid_thw = malloc((size_t)keep_vid * 3 * sizeof(int64_t));
        if (!out->video_values || !out->video_grid_thw) { st = oom(); goto fail; }
        memcpy(out->video_grid_thw, vv.grid_thw, (size_t)keep_vid * 3 * sizeof(int64_t));
        out->n_video_patches = rows;
        out->n_videos = keep_vid;
    }
    free(ids);
    free(mask);
    mmc_vlproc_out_free(&iv);
    mmc_vlproc_out_free(&vv);
    return MMC_OK;
media:
    st = mmc_error_prefix(st, "%s:%d: sample %lld", mmc_dataset_path(ds), ex.line, (long long)idx);
fail:
    free(ids);
    free(mask);
    free(eids);
    free(elab);
    mmc_vlproc_out_free(&iv);
    mmc_vlproc_out_free(&vv);
    mmc_batch_free(out);
    return st;
}

mmc_status mmc_data_prepare(const mmc_data_opts *o, const mmc_tokenizer *tok, const mmc_dataset *ds, int64_t i,
                            bool prompt_only, mmc_batch *out) {
    if (i < 0 || i >= mmc_dataset_size(ds))
        return mmc_error(MMC_ERR_INVALID, "%s: sample %lld out of range [0, %lld)", mmc_dataset_path(ds),
                         (long long)i, (long long)mmc_dataset_size(ds));
    bool media_err;
    return mmc_data_prepare_ex(o, tok, ds, i, prompt_only, out, &media_err);
}
