/* llava_next_processor.c — the image processors of LLaVA-NeXT and LLaVA-OneVision and their
 * processors' placeholder counts. Mirrors transformers' LlavaNextImageProcessorPil and
 * LlavaOnevisionImageProcessorPil (models/llava_next/image_processing_pil_llava_next.py,
 * models/llava_onevision/image_processing_pil_llava_onevision.py on PilBackend), per image:
 *
 *   best   = select_best_resolution((h, w), image_grid_pinpoints)         (mmc_llava_best_resolution)
 *   resized = Pillow resize to get_patch_output_size: the side that limits the scale fills the best
 *             resolution, the other ceil(side * scale) (capped)
 *   padded  = resized centred on a zero canvas of the best resolution (paste = (target - new) // 2)
 *   tiles   = the canvas cut row-major into tiles of crop_size.height (NeXT) / size.height (OneVision)
 *   base    = Pillow resize of the image to (size, size) (NeXT: shortest_edge; OneVision: height x width)
 *   each of [base] + tiles: resize to `size` (shortest edge or height x width), centre crop (NeXT),
 *   rescale (u * rescale_factor in double, then float32), normalise in float32 -> [P, 3, S, S]
 * OneVision with several images in one prompt (batch_num_images != 1): no tiles; each image padded to
 * a square of int(mean * 255) (pad_to_square), then resized and normalised -> one tile each.
 * The batch padding of the patch axis (do_pad) is not reproduced: the tiles of each image are
 * concatenated, which is what the model reads back (it slices the padding off by image_sizes).
 *
 * Placeholder counts, LlavaNextProcessor / LlavaOnevisionProcessor._get_number_of_features on the
 * processed tile size (h', w'): scale = best // (h', w'); grid = (patches a side) * scale, un-padded
 * to the aspect ratio (round(., 7) then int, as unpad_image); OneVision shrinks it by ratio =
 * sqrt(H W / (N * patches^2)) when ratio > 1.1 (anyres_max_N); + one newline per row + the base
 * tile's tokens (NeXT: + num_additional_image_tokens); one fewer with strategy "default".
 *
 * SiglipImageProcessor (SiglipImageProcessorPil: resize to {height, width}, rescale, normalise with 0.5 / 0.5)
 * is CLIPImageProcessor without the crop: mmc_siglip_proc_default gives its defaults in mmc_clip_proc's form.
 *
 * OneVision's videos (LlavaOnevisionVideoProcessor, which transformers runs on torchvision only): every
 * frame resized to size (384 x 384) with torch's uint8 antialiased resize, then the fused rescale +
 * normalise; settings from processor_config.json's "video_processor" (5.x) or
 * video_preprocessor_config.json (4.4x); <video> count frames * ceil(sqrt(num_image_tokens) / 2)^2 + 1. */
#include "mmc_llava.h"
#include "mmc_io.h"
#include "processors/processors_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mmc_siglip_proc_default(mmc_clip_proc *p) {
    mmc_clip_proc_default(p);
    p->shortest_edge = 0, p->size_h = p->size_w = 224;
    p->do_center_crop = false;
    for (int c = 0; c < 3; c++) p->image_mean[c] = p->image_std[c] = 0.5f;   /* IMAGENET_STANDARD_MEAN / STD */
}

void mmc_llava_next_proc_default(mmc_llava_next_proc *p, const mmc_llava *m) {
    memset(p, 0, sizeof *p);
    mmc_clip_proc_default(&p->base);   /* OpenAI CLIP mean / std, bicubic, rescale 1/255 */
    p->onevision = m && m->variant == MMC_LLAVA_ONEVISION;
    int64_t S = 384, patch = 14;
    bool cls = false;
    if (m && m->siglip) {
        const mmc_siglip_vision_config *v = mmc_siglip_vision_cfg(m->siglip);
        S = v->image_size, patch = v->patch_size;
    } else if (m && m->vision) {
        const mmc_clip_vision_config *v = mmc_clip_vision_cfg(m->vision);
        S = v->image_size, patch = v->patch_size, cls = true;
    }
    if (p->onevision) {   /* LlavaOnevisionImageProcessor: size 384 x 384, no crop */
        p->base.shortest_edge = 0, p->base.size_h = p->base.size_w = 384;
        p->base.do_center_crop = false;
    }
    if (m && m->n_pinpoints) {
        memcpy(p->pinpoints, m->pinpoints, sizeof p->pinpoints);
        p->n_pinpoints = m->n_pinpoints;
    }
    p->patch_size = patch;
    p->num_additional_image_tokens = cls ? 1 : 0;
    p->num_image_tokens = (S / patch) * (S / patch);
    p->max_num_patches = m && m->max_num_patches ? m->max_num_patches : 9;
    p->strategy_default = m ? !m->feature_full : !p->onevision;
    mmc_clip_proc_default(&p->video);   /* LlavaOnevisionVideoProcessor: 384 x 384, no crop, CLIP mean / std */
    p->video.shortest_edge = 0, p->video.size_h = p->video.size_w = 384;
    p->video.do_center_crop = false;
    p->video.resize_mode = MMC_VLPROC_RESIZE_TORCH;
}

/* a video processor object o (in `path`, under `where`) over *c: size {height, width}, mean / std,
 * rescale, resample and the do_* flags */
static mmc_status read_video(const mmc_json *o, const char *path, const char *where, mmc_clip_proc *c) {
    mmc_status st;
    int64_t h = c->size_h, w = c->size_w, r = c->resample == MMC_RESAMPLE_BILINEAR ? 2 : 3;
    if ((st = mmc_json_int(o, "size.height", h, &h)) || (st = mmc_json_int(o, "size.width", w, &w)) ||
        (st = mmc_json_num(o, "rescale_factor", c->rescale_factor, &c->rescale_factor)) ||
        (st = mmc_json_bool(o, "do_resize", c->do_resize, &c->do_resize)) ||
        (st = mmc_json_bool(o, "do_center_crop", c->do_center_crop, &c->do_center_crop)) ||
        (st = mmc_json_bool(o, "do_rescale", c->do_rescale, &c->do_rescale)) ||
        (st = mmc_json_bool(o, "do_normalize", c->do_normalize, &c->do_normalize)) ||
        (st = mmc_json_int(o, "resample", r, &r)))
        return where[0] ? mmc_error_prefix(st, "%s: %s", path, where) : st;   /* a root's messages name the file */
    if (h < 1 || w < 1 || h > 65536 || w > 65536)
        return mmc_error(MMC_ERR_FORMAT, "%s: %ssize must be {height, width}, each from 1 to 65536", path, where);
    if (c->do_center_crop)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sdo_center_crop is not supported for videos", path, where);
    if (r != 2 && r != 3)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sresample=%lld (only 2 bilinear, 3 bicubic)", path, where, (long long)r);
    c->resample = r == 2 ? MMC_RESAMPLE_BILINEAR : MMC_RESAMPLE_BICUBIC;
    c->shortest_edge = 0, c->size_h = h, c->size_w = w;
    if ((st = mmc_vlproc_read_mean_std(o, path, where, c->image_mean, c->image_std))) return st;
    return MMC_OK;
}

/* image_grid_pinpoints of object o (in `path`, under `where`) into p, when present */
static mmc_status read_pins(const mmc_json *o, const char *path, const char *where, mmc_llava_next_proc *p) {
    if (!mmc_json_get(o, "image_grid_pinpoints")) return MMC_OK;
    int n = 0;
    for (;; n++) {
        char key[64];
        snprintf(key, sizeof key, "image_grid_pinpoints.%d", n);
        if (!mmc_json_has(o, key)) break;
        int64_t hw[3];
        int k = 3;
        if (n >= MMC_LLAVA_MAX_PINPOINTS || mmc_json_int_array(o, key, hw, &k) != MMC_OK || k != 2 || hw[0] < 1 ||
            hw[1] < 1 || hw[0] > 65536 || hw[1] > 65536)
            return mmc_error(MMC_ERR_FORMAT, "%s: %simage_grid_pinpoints[%d] is not a [height, width] pair of sizes "
                             "(at most %d pairs)", path, where, n, MMC_LLAVA_MAX_PINPOINTS);
        p->pinpoints[n][0] = hw[0], p->pinpoints[n][1] = hw[1];
    }
    if (!n) return mmc_error(MMC_ERR_FORMAT, "%s: %simage_grid_pinpoints must be a non-empty list of pairs", path, where);
    p->n_pinpoints = n;
    return MMC_OK;
}

/* the processor's own keys (processor_config.json's top level) */
static mmc_status read_processor_keys(const mmc_json *j, const char *path, mmc_llava_next_proc *p) {
    mmc_status st;
    const char *s = NULL;
    if ((st = mmc_json_int(j, "patch_size", p->patch_size, &p->patch_size)) ||
        (st = mmc_json_int(j, "num_additional_image_tokens", p->num_additional_image_tokens,
                           &p->num_additional_image_tokens)) ||
        (st = mmc_json_int(j, "num_image_tokens", p->num_image_tokens, &p->num_image_tokens)) ||
        (st = mmc_json_str(j, "vision_feature_select_strategy", NULL, &s)))
        return st;   /* the message names the file and key */
    if (s && strcmp(s, "default") && strcmp(s, "full"))
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_feature_select_strategy '%s' is not default or full", path, s);
    if (s) p->strategy_default = !strcmp(s, "default");
    if (p->patch_size < 1 || p->patch_size > 65536 || p->num_image_tokens < 1 || p->num_image_tokens > (1 << 24) ||
        p->num_additional_image_tokens < 0 || p->num_additional_image_tokens > 64)
        return mmc_error(MMC_ERR_FORMAT, "%s: patch_size / num_image_tokens / num_additional_image_tokens out of range",
                         path);
    if ((st = mmc_json_str(j, "vision_aspect_ratio", NULL, &s))) return st;
    if (s) {
        char *end = NULL;
        long long k = strncmp(s, "anyres_max_", 11) ? 0 : strtoll(s + 11, &end, 10);
        if (k < 1 || k > 1000000 || !end || *end)
            return mmc_error(MMC_ERR_FORMAT, "%s: vision_aspect_ratio '%s' is not anyres_max_N (N >= 1)", path, s);
        p->max_num_patches = k;
    }
    return MMC_OK;
}

mmc_status mmc_llava_next_proc_load_dir(const char *dir, mmc_llava_next_proc *p, char *used, size_t cap) {
    char file[4300];
    mmc_llava_next_proc q = *p;
    mmc_status st = mmc_clip_proc_load_dir(dir, &q.base, file, sizeof file);
    if (st) return st;
    if (file[0]) {   /* the pinpoints beside the other image processor keys */
        mmc_json *j = NULL;
        if ((st = mmc_json_load(file, &j))) return st;
        const mmc_json *o = mmc_json_get(j, "image_processor");
        st = read_pins(o ? o : j, file, o ? "image_processor." : "", &q);
        mmc_json_free(j);
        if (st) return st;
    }
    char path[4300];
    snprintf(path, sizeof path, "%s/processor_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        mmc_json *j = NULL;
        if ((st = mmc_json_load(path, &j))) return st;
        st = read_processor_keys(j, path, &q);
        const mmc_json *v = mmc_json_get(j, "video_processor");
        if (!st && v) st = read_video(v, path, "video_processor.", &q.video);
        mmc_json_free(j);
        if (st) return st;
    }
    snprintf(path, sizeof path, "%s/video_preprocessor_config.json", dir);
    if (stat(path, &sb) == 0) {   /* 4.4x: the video processor in its own file */
        mmc_json *j = NULL;
        if ((st = mmc_json_load(path, &j))) return st;
        st = read_video(j, path, "", &q.video);
        mmc_json_free(j);
        if (st) return st;
    }
    const int64_t tile = !q.onevision ? q.base.crop_h : q.base.size_h ? q.base.size_h : q.base.shortest_edge;
    for (int i = 0; i < q.n_pinpoints; i++)
        if (q.pinpoints[i][0] % tile || q.pinpoints[i][1] % tile)
            return mmc_error(MMC_ERR_FORMAT, "%s: image_grid_pinpoints[%d] = [%lld, %lld] is not a multiple of the "
                             "tile size %lld", file[0] ? file : dir, i, (long long)q.pinpoints[i][0],
                             (long long)q.pinpoints[i][1], (long long)tile);
    *p = q;
    if (used && cap) snprintf(used, cap, "%s", file);
    return MMC_OK;
}

/* Python's round(x, 7) then int() */
static int64_t round7_int(double x) { return (int64_t)(nearbyint(x * 1e7) / 1e7); }

/* CPython's float floor division */
static double py_floordiv(double a, double b) {
    double mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
    double fl = floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return fl;
}

/* the processed tile's height / width (pixel_values[0][0].shape[-2:]) */
static void tile_hw(const mmc_llava_next_proc *p, int64_t *th, int64_t *tw) {
    const mmc_clip_proc *b = &p->base;
    if (b->do_center_crop) *th = b->crop_h, *tw = b->crop_w;
    else if (b->size_h) *th = b->size_h, *tw = b->size_w;
    else *th = *tw = b->shortest_edge;
}

int64_t mmc_llava_next_image_tokens(const mmc_llava_next_proc *p, int64_t h, int64_t w, bool multi) {
    int64_t n;
    if (p->onevision && multi) {
        n = p->num_image_tokens + 1;
    } else {
        int64_t th, tw, bh, bw;
        tile_hw(p, &th, &tw);
        mmc_llava_best_resolution((const int64_t (*)[2])p->pinpoints, p->n_pinpoints, h, w, &bh, &bw);
        const int64_t sh = bh / th, sw = bw / tw;
        int64_t ph, pw;
        if (p->onevision) ph = pw = (int64_t)sqrt((double)p->num_image_tokens);
        else ph = th / p->patch_size, pw = tw / p->patch_size;
        int64_t ch = ph * sh, cw = pw * sw;
        if ((double)w / (double)h > (double)cw / (double)ch) {
            const int64_t nh = round7_int((double)h * ((double)cw / (double)w));
            ch -= (ch - nh) / 2 * 2;
        } else {
            const int64_t nw = round7_int((double)w * ((double)ch / (double)h));
            cw -= (cw - nw) / 2 * 2;
        }
        int64_t unpadded = ch * cw, newline = ch;
        if (p->onevision) {
            const double ratio = sqrt((double)(ch * cw) / (double)(p->max_num_patches * ph * ph));
            if (ratio > 1.1) {
                const int64_t a = (int64_t)py_floordiv((double)ch, ratio), b = (int64_t)py_floordiv((double)cw, ratio);
                unpadded = a * b, newline = a;
            }
        }
        const int64_t base = p->onevision ? p->num_image_tokens : ph * pw + p->num_additional_image_tokens;
        n = unpadded + newline + base;
    }
    return n - (p->strategy_default ? 1 : 0);
}

/* Pillow's resize (a plain copy at the same size, as Image.resize does) */
static mmc_status resize(const mmc_llava_next_proc *p, const mmc_image *src, int64_t h, int64_t w, mmc_image *out) {
    if (h < 1 || w < 1 || h > 65536 || w > 65536)
        return mmc_error(MMC_ERR_INVALID, "LLaVA-NeXT image processor: a resize to %lld x %lld", (long long)w,
                         (long long)h);
    if (src->height == h && src->width == w) {
        mmc_status st = mmc_image_alloc(out, (int)h, (int)w);
        if (!st) memcpy(out->data, src->data, (size_t)(h * w * 3));
        return st;
    }
    return mmc_image_resize(src, (int)h, (int)w, p->base.resample, out);
}

/* a region of src (zero / colour outside) as a new image: the pads and the tiles */
static mmc_status place(const mmc_image *src, int64_t oh, int64_t ow, int64_t top, int64_t left, const uint8_t bg[3],
                        mmc_image *out) {
    mmc_status st = mmc_image_alloc(out, (int)oh, (int)ow);
    if (st) return st;
    for (int64_t y = 0; y < oh; y++)
        for (int64_t x = 0; x < ow; x++) {
            const int64_t sy = y - top, sx = x - left;
            uint8_t *d = out->data + (y * ow + x) * 3;
            if (sy >= 0 && sx >= 0 && sy < src->height && sx < src->width) memcpy(d, src->data + (sy * src->width + sx) * 3, 3);
            else memcpy(d, bg, 3);
        }
    return MMC_OK;
}

/* One patch through resize (size), centre crop, rescale + normalise into dst [3, th, tw]. */
static mmc_status finish(const mmc_llava_next_proc *p, const mmc_image *patch, const float lut[3][256], int64_t th,
                         int64_t tw, float *dst) {
    const mmc_clip_proc *b = &p->base;
    mmc_image rs = {0};
    const mmc_image *cur = patch;
    mmc_status st = MMC_OK;
    if (b->do_resize) {
        int64_t oh, ow;
        if (b->shortest_edge) {   /* get_resize_output_image_size, default_to_square=False */
            const int64_t hh = patch->height, ww = patch->width, s = b->shortest_edge;
            const int64_t shrt = ww <= hh ? ww : hh, lng = ww <= hh ? hh : ww;
            const int64_t nl = (int64_t)((double)(s * lng) / (double)shrt);
            oh = ww <= hh ? nl : s, ow = ww <= hh ? s : nl;
        } else {
            oh = b->size_h, ow = b->size_w;
        }
        if ((st = resize(p, patch, oh, ow, &rs))) return st;
        cur = &rs;
    }
    int64_t top = 0, left = 0;
    if (b->do_center_crop) {
        if (b->crop_h > cur->height || b->crop_w > cur->width) {
            mmc_image_free(&rs);
            return mmc_error(MMC_ERR_UNSUPPORTED, "LLaVA-NeXT image processor: a %d x %d tile is smaller than crop_size "
                             "%lld x %lld", cur->width, cur->height, (long long)b->crop_w, (long long)b->crop_h);
        }
        top = (cur->height - b->crop_h) / 2, left = (cur->width - b->crop_w) / 2;
    }
    if (cur->height - top < th || cur->width - left < tw) {
        mmc_image_free(&rs);
        return mmc_error(MMC_ERR_INVALID, "LLaVA-NeXT image processor: tiles of different sizes (%d x %d, not %lld x %lld)",
                         cur->width, cur->height, (long long)tw, (long long)th);
    }
    for (int64_t y = 0; y < th; y++)
        for (int64_t x = 0; x < tw; x++) {
            const uint8_t *px = cur->data + ((top + y) * cur->width + left + x) * 3;
            for (int c = 0; c < 3; c++) dst[(c * th + y) * tw + x] = lut[c][px[c]];
        }
    mmc_image_free(&rs);
    return MMC_OK;
}

/* the tiles of an image: the base, then ceil(bh / tile) * ceil(bw / tile); one padded square (multi) */
int64_t mmc_llava_next_image_tiles(const mmc_llava_next_proc *p, int64_t h, int64_t w, bool multi) {
    if (p->onevision && multi) return 1;
    const mmc_clip_proc *b = &p->base;
    const int64_t tile = !p->onevision ? b->crop_h : b->size_h ? b->size_h : b->shortest_edge;
    int64_t bh, bw;
    mmc_llava_best_resolution((const int64_t (*)[2])p->pinpoints, p->n_pinpoints, h, w, &bh, &bw);
    return 1 + ((bh + tile - 1) / tile) * ((bw + tile - 1) / tile);
}

mmc_status mmc_llava_next_preprocess(const mmc_llava_next_proc *p, const mmc_image *imgs, int n, bool multi,
                                     mmc_tensor **out, int64_t (*sizes)[2]) {
    *out = NULL;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "LLaVA-NeXT image processor: no images");
    if (p->base.resize_mode != MMC_VLPROC_RESIZE_PIL)
        return mmc_error(MMC_ERR_UNSUPPORTED, "LLaVA-NeXT / OneVision image processor: only the PIL backend is "
                         "implemented (not --image-backend torchvision)");
    if (p->n_pinpoints < 1) return mmc_error(MMC_ERR_INVALID, "LLaVA-NeXT image processor: no image_grid_pinpoints");
    const bool pad_square = p->onevision && multi;
    const mmc_clip_proc *b = &p->base;
    const int64_t tile = !p->onevision ? b->crop_h : b->size_h ? b->size_h : b->shortest_edge;
    int64_t th, tw;
    tile_hw(p, &th, &tw);
    int64_t P = 0;
    for (int i = 0; i < n; i++) {
        sizes[i][0] = imgs[i].height, sizes[i][1] = imgs[i].width;
        P += mmc_llava_next_image_tiles(p, imgs[i].height, imgs[i].width, multi);
    }
    float lut[3][256];
    mmc_qwen2vl_proc q;   /* the rescale / normalise settings in the Qwen processor's form */
    mmc_qwen2vl_proc_default(&q);
    memcpy(q.image_mean, b->image_mean, sizeof q.image_mean);
    memcpy(q.image_std, b->image_std, sizeof q.image_std);
    q.rescale_factor = b->rescale_factor;
    q.do_rescale = b->do_rescale;
    q.do_normalize = b->do_normalize;
    mmc_qwen2vl_pixel_lut(&q, MMC_VLPROC_RESIZE_PIL, lut);
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(P, 3, th, tw));
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory for pixel_values");
    float *dst = t->data;
    const int64_t per = 3 * th * tw;
    mmc_status st = MMC_OK;
    const uint8_t zero[3] = {0, 0, 0};
    for (int i = 0; i < n && !st; i++) {
        const mmc_image *img = &imgs[i];
        const int64_t h = img->height, w = img->width;
        mmc_image a = {0}, c = {0};
        if (pad_square) {   /* pad_to_square with int(mean * 255) */
            uint8_t bg[3];
            for (int k = 0; k < 3; k++) bg[k] = (uint8_t)(int)(b->image_mean[k] * 255.0);
            const int64_t s = h > w ? h : w;
            if (!(st = place(img, s, s, (s - h) / 2, (s - w) / 2, bg, &a))) st = finish(p, &a, lut, th, tw, dst);
            dst += per;
            mmc_image_free(&a);
            continue;
        }
        int64_t bh, bw;
        mmc_llava_best_resolution((const int64_t (*)[2])p->pinpoints, p->n_pinpoints, h, w, &bh, &bw);
        /* the base: the whole image resized to (size, size) */
        const int64_t sh = b->size_h ? b->size_h : b->shortest_edge, sw = b->size_h ? b->size_w : b->shortest_edge;
        if (!(st = resize(p, img, sh, sw, &a))) st = finish(p, &a, lut, th, tw, dst);
        dst += per;
        mmc_image_free(&a);
        if (st) break;
        /* get_patch_output_size, resize, pad onto the best resolution's canvas */
        const double scw = (double)bw / (double)w, sch = (double)bh / (double)h;
        int64_t nh, nw;
        if (scw < sch) {
            nw = bw;
            nh = (int64_t)ceil((double)h * scw);
            if (nh > bh) nh = bh;
        } else {
            nh = bh;
            nw = (int64_t)ceil((double)w * sch);
            if (nw > bw) nw = bw;
        }
        if ((st = resize(p, img, nh, nw, &a))) break;
        st = place(&a, bh, bw, (bh - nh) / 2, (bw - nw) / 2, zero, &c);
        mmc_image_free(&a);
        for (int64_t y = 0; !st && y < bh; y += tile)
            for (int64_t x = 0; !st && x < bw; x += tile) {
                mmc_image piece = {0};
                const int64_t ph = bh - y < tile ? bh - y : tile, pw = bw - x < tile ? bw - x : tile;
                if (!(st = place(&c, ph, pw, -y, -x, zero, &piece))) st = finish(p, &piece, lut, th, tw, dst);
                dst += per;
                mmc_image_free(&piece);
            }
        mmc_image_free(&c);
    }
    if (st) { mmc_tensor_free(t); return st; }
    *out = t;
    return MMC_OK;
}

int64_t mmc_llava_next_video_tokens(const mmc_llava_next_proc *p, int64_t n_frames) {
    const int64_t side = (int64_t)sqrt((double)p->num_image_tokens), q = (side + 1) / 2;
    return n_frames * q * q + 1;
}

mmc_status mmc_llava_next_preprocess_video(const mmc_llava_next_proc *p, const mmc_image *frames, int n,
                                           mmc_tensor **out) {
    *out = NULL;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "LLaVA-OneVision video processor: no frames");
    const mmc_clip_proc *c = &p->video;
    float lut[3][256];
    mmc_qwen2vl_proc q;
    mmc_qwen2vl_proc_default(&q);
    memcpy(q.image_mean, c->image_mean, sizeof q.image_mean);
    memcpy(q.image_std, c->image_std, sizeof q.image_std);
    q.rescale_factor = c->rescale_factor;
    q.do_rescale = c->do_rescale;
    q.do_normalize = c->do_normalize;
    mmc_qwen2vl_pixel_lut(&q, MMC_VLPROC_RESIZE_TORCH, lut);   /* TorchvisionBackend.rescale_and_normalize */
    const int64_t h = c->do_resize ? c->size_h : frames[0].height, w = c->do_resize ? c->size_w : frames[0].width;
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(n, 3, h, w));
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory for pixel_values_videos");
    mmc_status st = MMC_OK;
    for (int i = 0; i < n && !st; i++) {
        mmc_image rs = {0};
        const mmc_image *cur = &frames[i];
        if (c->do_resize) {
            if ((st = mmc_image_resize_torch_u8(&frames[i], (int)h, (int)w, c->resample, &rs))) break;
            cur = &rs;
        }
        if (cur->height != h || cur->width != w) {
            st = mmc_error(MMC_ERR_INVALID, "LLaVA-OneVision video processor: frames of different sizes (do_resize is "
                           "false)");
        } else {
            float *dst = (float *)t->data + (int64_t)i * 3 * h * w;
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) {
                    const uint8_t *px = cur->data + (y * w + x) * 3;
                    for (int k = 0; k < 3; k++) dst[(k * h + y) * w + x] = lut[k][px[k]];
                }
        }
        mmc_image_free(&rs);
    }
    if (st) { mmc_tensor_free(t); return st; }
    *out = t;
    return MMC_OK;
}
