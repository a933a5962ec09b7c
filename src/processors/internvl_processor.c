/* internvl_processor.c — InternVL's image processing and prompt expansion, mirroring what
 * transformers 5's InternVLProcessor does with its image processor GotOcr2ImageProcessorPil
 * (models/got_ocr2/image_processing_pil_got_ocr2.py, PilBackend):
 *
 *   grid      get_optimal_tiled_canvas: among (cols, rows) with min_patches <= cols*rows <=
 *             max_patches (enumerated cols-major, stably sorted by cols*rows) the one whose
 *             cols/rows is closest to the image's w/h; on a tie the later one wins while the image
 *             area exceeds half the tiles' area
 *   tiles     the image resized (Pillow, resample as configured) to cols*tw x rows*th and cut
 *             row-major into tw x th tiles; with more than one tile a thumbnail (the image
 *             resized to tw x th) is appended
 *   rescale   u * rescale_factor in double, then float32; normalise (x - mean) / std in float32
 *             (the per-byte table of mmc_qwen2vl_pixel_lut)       -> pixel_values [tiles, 3, th, tw]
 *
 * With resize_mode MMC_VLPROC_RESIZE_TORCH it mirrors transformers 5's default GotOcr2ImageProcessor
 * (TorchvisionBackend): the same tiles from torch's uint8 antialiased resize (each tile's second
 * resize to the tile size is the identity), then the fused rescale_and_normalize.
 *
 * InternVLProcessor calls the image processor with crop_to_patches=True (its images_kwargs
 * default, which outranks the saved image processor's own crop_to_patches), and replaces each
 * <IMG_CONTEXT> of the templated text by <img> <IMG_CONTEXT> x (image_seq_length * tiles) </img>.
 *
 * OpenGVLab's own pipeline (load_image / dynamic_preprocess of the model cards) tiles the same
 * way from config.json's settings, with Pillow's bicubic resize, ToTensor's u / 255 in float32
 * (a last-bit difference to u * (1/255) at most) and ImageNet mean/std; the thumbnail only with
 * use_thumbnail. Its candidate grids come from a Python set sorted by area, whose order within one
 * area can differ from the enumeration above; the pick differs only for an image whose aspect
 * ratio lies exactly midway between two grids of one area (e.g. 5:4 between 2x1 and 1x2), where
 * the tie rule prefers the later one. That case follows transformers' order here.
 *
 * Videos (HF-native layout) as InternVLVideoProcessor (video_processing_internvl.py, torchvision only)
 * and InternVLProcessor.replace_video_token do them: frames sampled by sample_frames (every frame
 * unless do_sample_frames; then num_frames, or int(total / video_fps * fps), at
 * int(arange(shift, total, total / n)) with shift total / n / 2 for initial_shift true), each resized
 * to the video size by torch's uint8 antialiased resize and normalised by the fused float32
 * rescale_and_normalize; the template's "<video>" becomes "Frame1: <img><IMG_CONTEXT>*N</img>\nFrame2: ..."
 * with N = image_seq_length per frame, and the frames join the images' tiles in pixel_values in
 * the order their placeholders appear. */
#include "mmc_internvl.h"
#include "mmc_io.h"
#include "mmc_video.h"
#include "processors/processors_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IVL_MAX_SIDE 65536
#define IVL_MAX_PATCHES 256

void mmc_internvl_proc_default(mmc_internvl_proc *p) {
    memset(p, 0, sizeof *p);
    p->size_h = p->size_w = 448;
    p->crop_to_patches = true;
    p->min_patches = 1;
    p->max_patches = 12;
    p->use_thumbnail = true;
    p->resample = MMC_RESAMPLE_BICUBIC;
    p->do_resize = p->do_rescale = p->do_normalize = true;
    p->rescale_factor = 1.0 / 255.0;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};   /* IMAGENET */
    memcpy(p->image_mean, mean, sizeof mean);
    memcpy(p->image_std, std, sizeof std);
    p->image_seq_length = 256;
    p->resize_mode = MMC_VLPROC_RESIZE_PIL;
    mmc_internvl_video_proc_default(&p->video);
}

void mmc_internvl_video_proc_default(mmc_internvl_video_proc *v) {
    memset(v, 0, sizeof *v);
    v->size_h = v->size_w = 384;
    v->resample = MMC_RESAMPLE_BICUBIC;
    v->do_resize = v->do_rescale = v->do_normalize = true;
    v->rescale_factor = 1.0 / 255.0;
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    memcpy(v->image_mean, mean, sizeof mean);   /* OPENAI_CLIP_MEAN / STD, the class defaults */
    memcpy(v->image_std, std, sizeof std);
    v->shift_half = true;
}

/* a video processor object o (in `path`, under `where`) over *v */
static mmc_status apply_video(const mmc_json *o, const char *path, const char *where, mmc_internvl_video_proc *v) {
    mmc_status st;
    int64_t r = v->resample == MMC_RESAMPLE_BILINEAR ? 2 : 3;
    bool crop = false;
    const mmc_json *size = mmc_json_get(o, "size");
    if (size) {
        int64_t h = 0, w = 0;
        if (!mmc_json_is_object(size) || mmc_json_int(size, "height", 0, &h) || mmc_json_int(size, "width", 0, &w) ||
            h < 1 || w < 1 || h > IVL_MAX_SIDE || w > IVL_MAX_SIDE)
            return mmc_error(MMC_ERR_FORMAT, "%s: %ssize must be {height, width}, each from 1 to %d", path, where,
                             IVL_MAX_SIDE);
        v->size_h = h, v->size_w = w;
    }
    if ((st = mmc_json_num(o, "rescale_factor", v->rescale_factor, &v->rescale_factor)) ||
        (st = mmc_json_bool(o, "do_resize", v->do_resize, &v->do_resize)) ||
        (st = mmc_json_bool(o, "do_rescale", v->do_rescale, &v->do_rescale)) ||
        (st = mmc_json_bool(o, "do_normalize", v->do_normalize, &v->do_normalize)) ||
        (st = mmc_json_bool(o, "do_center_crop", false, &crop)) ||
        (st = mmc_json_bool(o, "do_sample_frames", v->do_sample_frames, &v->do_sample_frames)) ||
        (st = mmc_json_int(o, "num_frames", v->num_frames, &v->num_frames)) ||
        (st = mmc_json_num(o, "fps", v->fps, &v->fps)) ||
        (st = mmc_json_int(o, "resample", r, &r)))
        return mmc_error_prefix(st, "%s: %s", path, where);
    if (crop) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sdo_center_crop is not supported for InternVL videos", path, where);
    if (r == 3) v->resample = MMC_RESAMPLE_BICUBIC;
    else if (r == 2) v->resample = MMC_RESAMPLE_BILINEAR;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sresample=%lld (only 2 bilinear, 3 bicubic)", path, where, (long long)r);
    if (v->num_frames < 0 || v->num_frames > 100000 || v->fps < 0 || v->fps > 1000)
        return mmc_error(MMC_ERR_FORMAT, "%s: %snum_frames %lld / fps %g out of range", path, where,
                         (long long)v->num_frames, v->fps);
    if (mmc_json_has(o, "initial_shift")) {   /* true, false or a number of frames */
        bool b = true;
        double x = 0;
        if (mmc_json_bool(o, "initial_shift", true, &b) == MMC_OK) v->shift_half = b, v->initial_shift = 0;
        else if (mmc_json_num(o, "initial_shift", 0, &x) == MMC_OK && x >= 0 && x < 1e9) v->shift_half = false, v->initial_shift = x;
        else return mmc_error(MMC_ERR_FORMAT, "%s: %sinitial_shift must be true, false or a number >= 0", path, where);
    }
    if ((st = mmc_vlproc_read_mean_std(o, path, where, v->image_mean, v->image_std))) return st;
    return MMC_OK;
}

/* the video settings of an HF-native directory: processor_config.json's "video_processor", else
 * video_preprocessor_config.json, else preprocessor_config.json over the defaults (AutoVideoProcessor) */
static mmc_status load_video_dir(const char *dir, mmc_internvl_video_proc *v) {
    static const char *const names[3] = {"processor_config.json", "video_preprocessor_config.json",
                                         "preprocessor_config.json"};
    for (int k = 0; k < 3; k++) {
        char path[4200];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[k]) >= (int)sizeof path)
            return mmc_error(MMC_ERR_INVALID, "%s: path too long", dir);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        mmc_json *j = NULL;
        mmc_status st = mmc_json_load(path, &j);
        if (st) return mmc_error_prefix(st, "video processor config");
        const mmc_json *o = k == 0 ? mmc_json_get(j, "video_processor") : j;
        if (!o) { mmc_json_free(j); continue; }
        st = apply_video(o, path, k == 0 ? "video_processor." : "", v);
        mmc_json_free(j);
        return st;
    }
    return MMC_OK;
}

static mmc_status apply(const mmc_json *o, const char *path, const char *where, mmc_internvl_proc *p) {
    mmc_status st;
    int64_t v;
    const mmc_json *size = mmc_json_get(o, "size");
    if (size) {
        int64_t h = 0, w = 0;
        if (!mmc_json_is_object(size) || (st = mmc_json_int(size, "height", 0, &h)) ||
            (st = mmc_json_int(size, "width", 0, &w)) || h < 1 || w < 1 || h > IVL_MAX_SIDE || w > IVL_MAX_SIDE)
            return mmc_error(MMC_ERR_FORMAT, "%s: %ssize must be {height, width}, each from 1 to %d", path, where,
                             IVL_MAX_SIDE);
        p->size_h = h, p->size_w = w;
    }
    if ((st = mmc_json_num(o, "rescale_factor", p->rescale_factor, &p->rescale_factor)) ||
        (st = mmc_json_bool(o, "do_resize", p->do_resize, &p->do_resize)) ||
        (st = mmc_json_bool(o, "do_rescale", p->do_rescale, &p->do_rescale)) ||
        (st = mmc_json_bool(o, "do_normalize", p->do_normalize, &p->do_normalize)) ||
        (st = mmc_json_int(o, "min_patches", p->min_patches, &p->min_patches)) ||
        (st = mmc_json_int(o, "max_patches", p->max_patches, &p->max_patches)) ||
        (st = mmc_json_int(o, "resample", 3, &v)))
        return mmc_error_prefix(st, "%s: %s", path, where);
    if (p->min_patches < 1 || p->max_patches < 1 || p->max_patches > IVL_MAX_PATCHES)
        return mmc_error(MMC_ERR_FORMAT, "%s: %smin_patches / max_patches must be from 1 to %d", path, where,
                         IVL_MAX_PATCHES);
    if (v == 3) p->resample = MMC_RESAMPLE_BICUBIC;
    else if (v == 2) p->resample = MMC_RESAMPLE_BILINEAR;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sresample=%lld (only 2 bilinear, 3 bicubic)", path, where, (long long)v);
    if ((st = mmc_vlproc_read_mean_std(o, path, where, p->image_mean, p->image_std))) return st;
    return MMC_OK;
}

/* OpenGVLab's InternVLChatConfig: the tiling settings live in config.json */
static mmc_status load_remote(const mmc_json *cfg, const char *path, mmc_internvl_proc *p) {
    mmc_status st;
    int64_t S = 0, ps = 14, vs = 448;
    double r = 0.5;
    bool dyn = false;
    if ((st = mmc_json_int(cfg, "vision_config.image_size", 448, &vs)) ||
        (st = mmc_json_int(cfg, "vision_config.patch_size", 14, &ps)) ||
        (st = mmc_json_num(cfg, "downsample_ratio", 0.5, &r)) ||
        (st = mmc_json_bool(cfg, "dynamic_image_size", false, &dyn)) ||
        (st = mmc_json_int(cfg, "min_dynamic_patch", 1, &p->min_patches)) ||
        (st = mmc_json_int(cfg, "max_dynamic_patch", 6, &p->max_patches)) ||
        (st = mmc_json_bool(cfg, "use_thumbnail", false, &p->use_thumbnail)))
        return mmc_error_prefix(st, "%s", path);
    const mmc_json *f = mmc_json_get(cfg, "force_image_size");
    if (f && mmc_json_int(cfg, "force_image_size", 0, &S) != MMC_OK) S = 0;   /* null */
    if (S <= 0) S = vs;
    if (S < 1 || S > IVL_MAX_SIDE || ps < 1 || S % ps || !(r > 0 && r <= 1) || p->min_patches < 1 ||
        p->max_patches < 1 || p->max_patches > IVL_MAX_PATCHES)
        return mmc_error(MMC_ERR_FORMAT, "%s: force_image_size / vision_config.image_size %lld, patch_size %lld, "
                         "downsample_ratio %g or min/max_dynamic_patch %lld / %lld out of range", path, (long long)S,
                         (long long)ps, r, (long long)p->min_patches, (long long)p->max_patches);
    p->size_h = p->size_w = S;
    p->crop_to_patches = dyn;
    /* num_image_token = int((image_size // patch_size) ** 2 * (downsample_ratio ** 2)) */
    p->image_seq_length = (int64_t)((double)(S / ps) * (double)(S / ps) * (r * r));
    return MMC_OK;
}

mmc_status mmc_internvl_proc_load_dir(const char *dir, mmc_internvl_proc *p, char *used, size_t cap) {
    static const char *const names[2] = {"processor_config.json", "preprocessor_config.json"};
    if (used && cap) used[0] = 0;
    mmc_internvl_proc q = *p;
    {
        char path[4200];
        if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
            return mmc_error(MMC_ERR_INVALID, "%s: path too long", dir);
        mmc_json *j = NULL;
        const char *mt = "";
        if (access(path, R_OK) == 0 && mmc_json_load(path, &j) == MMC_OK && mmc_json_str(j, "model_type", "", &mt) == MMC_OK &&
            !strcmp(mt, "internvl_chat")) {
            mmc_status st = load_remote(j, path, &q);
            mmc_json_free(j);
            if (st) return st;
            if (used && cap) snprintf(used, cap, "%s", path);
            *p = q;
            return MMC_OK;
        }
        mmc_json_free(j);
    }
    bool found = false;
    for (int k = 0; k < 2; k++) {
        char path[4200];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[k]) >= (int)sizeof path)
            return mmc_error(MMC_ERR_INVALID, "%s: path too long", dir);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        mmc_json *j = NULL;
        mmc_status st = mmc_json_load(path, &j);
        if (st) return mmc_error_prefix(st, "image processor config");
        /* image_seq_length lives in processor_config.json (5.x) beside image_processor */
        if (k == 0 && (st = mmc_json_int(j, "image_seq_length", q.image_seq_length, &q.image_seq_length))) {
            mmc_json_free(j);
            return mmc_error_prefix(st, "%s", path);
        }
        const mmc_json *o = mmc_json_get(j, "image_processor");
        if (k == 0 && !o) { mmc_json_free(j); continue; }
        if (!found) {
            st = apply(o ? o : j, path, o ? "image_processor." : "", &q);
            if (!st && used && cap) snprintf(used, cap, "%s", path);
            found = true;
        }
        mmc_json_free(j);
        if (st) return st;
    }
    mmc_status vst = load_video_dir(dir, &q.video);
    if (vst) return vst;
    if (q.image_seq_length < 1 || q.image_seq_length > IVL_MAX_SIDE)
        return mmc_error(MMC_ERR_FORMAT, "%s: image_seq_length %lld is not from 1 to %d", dir,
                         (long long)q.image_seq_length, IVL_MAX_SIDE);
    *p = q;
    return MMC_OK;
}

void mmc_internvl_tile_grid(const mmc_internvl_proc *p, int64_t h, int64_t w, int *cols, int *rows) {
    /* get_all_supported_aspect_ratios: width-major enumeration, stable-sorted by area */
    int cand[IVL_MAX_PATCHES * 8][2], n = 0;
    const int lo = (int)p->min_patches, hi = (int)p->max_patches;
    for (int area = 1; area <= hi; area++)
        for (int cw = 1; cw <= hi; cw++)
            for (int ch = 1; ch <= hi; ch++)
                if (cw * ch == area && area >= lo && n < (int)(sizeof cand / sizeof cand[0]))
                    cand[n][0] = cw, cand[n][1] = ch, n++;
    const double aspect = (double)w / (double)h, area = (double)w * (double)h;
    double best = 1e300;
    int bc = 1, br = 1;
    for (int i = 0; i < n; i++) {
        double diff = aspect - (double)cand[i][0] / (double)cand[i][1];
        if (diff < 0) diff = -diff;
        if (diff < best) best = diff, bc = cand[i][0], br = cand[i][1];
        else if (diff == best && area > 0.5 * (double)p->size_h * (double)p->size_w * cand[i][0] * cand[i][1])
            bc = cand[i][0], br = cand[i][1];
    }
    *cols = bc, *rows = br;
}

/* the tile at (top, left) of img (th x tw) into dst [3, th, tw] through the per-byte table */
static void put_tile(const mmc_image *img, int64_t top, int64_t left, int64_t th, int64_t tw, float lut[3][256],
                     float *dst) {
    for (int64_t y = 0; y < th; y++)
        for (int64_t x = 0; x < tw; x++) {
            const uint8_t *px = img->data + ((top + y) * img->width + left + x) * 3;
            for (int c = 0; c < 3; c++) dst[(c * th + y) * tw + x] = lut[c][px[c]];
        }
}

static mmc_status resize(bool torch, const mmc_image *img, int h, int w, mmc_resample f, mmc_image *out) {
    return torch ? mmc_image_resize_torch_u8(img, h, w, f, out) : mmc_image_resize(img, h, w, f, out);
}

mmc_status mmc_internvl_preprocess(const mmc_internvl_proc *p, const mmc_image *imgs, int n, mmc_tensor **out,
                                   int64_t *n_tiles) {
    *out = NULL;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "InternVL image processor: no images");
    if (p->resize_mode == MMC_VLPROC_RESIZE_FLOAT)
        return mmc_error(MMC_ERR_UNSUPPORTED, "InternVL image processor: the float resize mode is not supported");
    const bool torch = p->resize_mode == MMC_VLPROC_RESIZE_TORCH;
    const int64_t th = p->size_h, tw = p->size_w;
    float lut[3][256];
    mmc_qwen2vl_proc q;   /* the rescale / normalise settings in the Qwen processor's form */
    mmc_qwen2vl_proc_default(&q);
    memcpy(q.image_mean, p->image_mean, sizeof q.image_mean);
    memcpy(q.image_std, p->image_std, sizeof q.image_std);
    q.rescale_factor = p->rescale_factor;
    q.do_rescale = p->do_rescale;
    q.do_normalize = p->do_normalize;
    mmc_qwen2vl_pixel_lut(&q, p->resize_mode, lut);
    /* the tile counts first, for one allocation */
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        int cols = 1, rows = 1;
        bool tile = p->crop_to_patches && p->max_patches > 1;
        if (tile) mmc_internvl_tile_grid(p, imgs[i].height, imgs[i].width, &cols, &rows);
        n_tiles[i] = tile && cols * rows > 1 ? cols * rows + (p->use_thumbnail ? 1 : 0) : 1;
        total += n_tiles[i];
    }
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(total, 3, th, tw));
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory for pixel_values");
    float *dst = t->data;
    const int64_t per = 3 * th * tw;
    mmc_status st = MMC_OK;
    for (int i = 0; i < n && !st; i++) {
        const mmc_image *img = &imgs[i];
        mmc_image rs = {0};
        if (p->crop_to_patches && p->max_patches > 1) {
            int cols, rows;
            mmc_internvl_tile_grid(p, img->height, img->width, &cols, &rows);
            if ((st = resize(torch, img, (int)(th * rows), (int)(tw * cols), p->resample, &rs))) break;
            for (int b = 0; b < cols * rows; b++, dst += per)
                put_tile(&rs, (b / cols) * th, (b % cols) * tw, th, tw, lut, dst);
            mmc_image_free(&rs);
            if (cols * rows > 1 && p->use_thumbnail) {   /* the thumbnail */
                if ((st = resize(torch, img, (int)th, (int)tw, p->resample, &rs))) break;
                put_tile(&rs, 0, 0, th, tw, lut, dst);
                dst += per;
                mmc_image_free(&rs);
            }
        } else {
            const mmc_image *cur = img;
            if (p->do_resize) {
                if ((st = resize(torch, img, (int)th, (int)tw, p->resample, &rs))) break;
                cur = &rs;
            } else if (img->height != th || img->width != tw) {
                st = mmc_error(MMC_ERR_INVALID, "InternVL image processor: image %d is %d x %d, not %lld x %lld, "
                               "and do_resize is off", i, img->width, img->height, (long long)tw, (long long)th);
                break;
            }
            put_tile(cur, 0, 0, th, tw, lut, dst);
            dst += per;
            mmc_image_free(&rs);
        }
    }
    if (st) { mmc_tensor_free(t); return st; }
    *out = t;
    return MMC_OK;
}

mmc_status mmc_internvl_expand(const int32_t *ids, int64_t n, int32_t image_token, int32_t start, int32_t end,
                               const int64_t *tokens_per_image, int n_images, int32_t **out, int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    int found = 0;
    int64_t len = n;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == image_token) {
            if (found < n_images) len += tokens_per_image[found] + 1;   /* + start + end - the placeholder */
            found++;
        }
    if (found != n_images)
        return mmc_error(MMC_ERR_INVALID, "the prompt has %d image placeholder%s but %d image%s", found,
                         found == 1 ? "" : "s", n_images, n_images == 1 ? "" : "s");
    int32_t *o = malloc((size_t)(len ? len : 1) * sizeof *o);
    if (!o) return mmc_error(MMC_ERR_OOM, "out of memory");
    int64_t k = 0;
    int img = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] != image_token) { o[k++] = ids[i]; continue; }
        o[k++] = start;
        for (int64_t j = 0; j < tokens_per_image[img]; j++) o[k++] = image_token;
        o[k++] = end;
        img++;
    }
    *out = o;
    *n_out = k;
    return MMC_OK;
}

/* ---------------------------------------------------------------- videos */

mmc_status mmc_internvl_video_sample(const mmc_internvl_video_proc *v, int64_t total, double video_fps,
                                     int64_t **idx, int *n) {
    *idx = NULL;
    *n = 0;
    if (total <= 0) return mmc_error(MMC_ERR_INVALID, "the video has no frames");
    if (total > INT32_MAX / 2) return mmc_error(MMC_ERR_INVALID, "the video has too many frames (%lld)", (long long)total);
    int64_t num = total;
    double shift = 0;
    if (v->do_sample_frames) {
        if (v->num_frames > 0) {
            num = v->num_frames;
        } else if (v->fps > 0) {
            if (!(video_fps > 0))
                return mmc_error(MMC_ERR_INVALID, "the video has no frame rate, needed to sample %g frames per second; "
                                 "give a frame count instead (num_frames, --video-frames N)", v->fps);
            double x = (double)total / video_fps * v->fps;   /* int(total / fps * fps) */
            num = x < 1e12 ? (int64_t)x : total + 1;
        } else {
            return mmc_error(MMC_ERR_INVALID, "do_sample_frames is set but neither num_frames nor fps is: set one in "
                             "the video processor config (or --video-frames N / --video-fps F)");
        }
        if (num < 1)
            return mmc_error(MMC_ERR_INVALID, "sampling %g frames per second from %lld frames at %g fps gives no frame; "
                             "raise fps or give num_frames", v->fps, (long long)total, video_fps);
        if (num > total)
            return mmc_error(MMC_ERR_INVALID, "the video can't be sampled: num_frames=%lld exceeds its %lld frames; "
                             "decrease num_frames or fps", (long long)num, (long long)total);
        shift = v->shift_half ? (double)total / (double)num / 2.0 : v->initial_shift;
    }
    /* torch.arange(shift, total, total / num).int(): size ceil((total - shift) / step) in double, values
     * shift + i * step rounded to float32 (torch's default dtype), truncated */
    const double step = (double)total / (double)num;
    int64_t cnt = shift < (double)total ? (int64_t)ceil(((double)total - shift) / step) : 0;
    if (cnt < 1)
        return mmc_error(MMC_ERR_INVALID, "initial_shift %g leaves no frame of the video's %lld to sample", shift,
                         (long long)total);
    int64_t *o = malloc(sizeof *o * (size_t)cnt);
    if (!o) return mmc_error(MMC_ERR_OOM, "video sampling: out of memory");
    for (int64_t i = 0; i < cnt; i++) {
        int64_t k = (int64_t)(float)(shift + (double)i * step);
        o[i] = k < total ? k : total - 1;
    }
    *idx = o;
    *n = (int)cnt;
    return MMC_OK;
}

mmc_status mmc_internvl_video_preprocess(const mmc_internvl_video_proc *v, const mmc_image *frames, int n,
                                         mmc_tensor **out) {
    *out = NULL;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "InternVL video processor: no frames");
    float lut[3][256];
    mmc_qwen2vl_proc q;   /* TorchvisionBackend.rescale_and_normalize's per-byte values */
    mmc_qwen2vl_proc_default(&q);
    memcpy(q.image_mean, v->image_mean, sizeof q.image_mean);
    memcpy(q.image_std, v->image_std, sizeof q.image_std);
    q.rescale_factor = v->rescale_factor;
    q.do_rescale = v->do_rescale;
    q.do_normalize = v->do_normalize;
    mmc_qwen2vl_pixel_lut(&q, MMC_VLPROC_RESIZE_TORCH, lut);
    const int64_t h = v->do_resize ? v->size_h : frames[0].height, w = v->do_resize ? v->size_w : frames[0].width;
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(n, 3, h, w));
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory for the video's pixel_values");
    mmc_status st = MMC_OK;
    for (int i = 0; i < n && !st; i++) {
        mmc_image rs = {0};
        const mmc_image *cur = &frames[i];
        if (v->do_resize) {
            if ((st = mmc_image_resize_torch_u8(&frames[i], (int)h, (int)w, v->resample, &rs))) break;
            cur = &rs;
        }
        if (cur->height != h || cur->width != w)
            st = mmc_error(MMC_ERR_INVALID, "InternVL video processor: frame %d is %d x %d, not %lld x %lld (do_resize "
                           "is false)", i, cur->width, cur->height, (long long)w, (long long)h);
        else
            put_tile(cur, 0, 0, h, w, lut, (float *)t->data + (int64_t)i * 3 * h * w);
        mmc_image_free(&rs);
    }
    if (st) { mmc_tensor_free(t); return st; }
    *out = t;
    return MMC_OK;
}

mmc_status mmc_internvl_video_load(const mmc_internvl_video_proc *v, const char *path, const mmc_image_opts *io,
                                   mmc_tensor **out, int64_t **indices, int *n_frames) {
    *out = NULL;
    if (indices) *indices = NULL;
    *n_frames = 0;
    struct stat sb;
    mmc_image *frames = NULL;
    int64_t *idx = NULL;
    int n = 0;
    mmc_status st;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {   /* a folder of frames: every one */
        if ((st = mmc_load_frames_dir(path, io, &frames, &n))) return mmc_error_prefix(st, "video %s", path);
        if (n < 1) { free(frames); return mmc_error(MMC_ERR_FORMAT, "video %s: the folder has no frames", path); }
        if (!(idx = malloc(sizeof *idx * (size_t)n))) st = mmc_error(MMC_ERR_OOM, "video: out of memory");
        for (int i = 0; idx && i < n; i++) idx[i] = i;
    } else {
        mmc_video *vf = NULL;
        if ((st = mmc_video_open(path, &vf))) return st;   /* names the file */
        const mmc_video_info *info = mmc_video_get_info(vf);
        st = mmc_internvl_video_sample(v, info->total_frames, info->fps, &idx, &n);
        if (st) mmc_error_prefix(st, "video %s", path);
        if (!st && !(frames = calloc((size_t)n, sizeof *frames))) st = mmc_error(MMC_ERR_OOM, "video: out of memory");
        if (!st) st = mmc_video_read(vf, idx, n, frames);
        if (st) { free(frames); frames = NULL; n = 0; }
        mmc_video_close(vf);
    }
    if (!st) st = mmc_internvl_video_preprocess(v, frames, n, out);
    if (st && frames) mmc_error_prefix(st, "video %s", path);
    for (int i = 0; frames && i < n; i++) mmc_image_free(&frames[i]);
    free(frames);
    if (st) { free(idx); return st; }
    if (indices) *indices = idx;
    else free(idx);
    *n_frames = n;
    return MMC_OK;
}

#define IVL_IMG "<IMG_CONTEXT>"
#define IVL_VID "<video>"

mmc_status mmc_internvl_video_text(const char *text, int n_images, const int64_t *frames, int n_videos, char **out,
                                   uint8_t *order, int64_t *at, int64_t *grow) {
    *out = NULL;
    const size_t li = strlen(IVL_IMG), lv = strlen(IVL_VID);
    int ni = 0, nv = 0;
    size_t need = strlen(text) + 1;
    for (const char *s = text; *s;) {   /* the placeholders in order; the room the frames take */
        const char *a = strstr(s, IVL_IMG), *b = strstr(s, IVL_VID);
        if (!a && !b) break;
        if (a && (!b || a < b)) {
            if (order && ni + nv < n_images + n_videos) order[ni + nv] = 0;
            ni++;
            s = a + li;
        } else {
            if (nv < n_videos) {
                if (frames[nv] < 1 || frames[nv] > 1000000)
                    return mmc_error(MMC_ERR_INVALID, "video %d: %lld frames", nv, (long long)frames[nv]);
                if (order && ni + nv < n_images + n_videos) order[ni + nv] = 1;
                need += (size_t)frames[nv] * (24 + li);
            }
            nv++;
            s = b + lv;
        }
    }
    if (ni != n_images || nv != n_videos)
        return mmc_error(MMC_ERR_INVALID, "the prompt has %d image placeholder%s (" IVL_IMG ") and %d video "
                         "placeholder%s (" IVL_VID ") but %d image%s and %d video%s", ni, ni == 1 ? "" : "s", nv,
                         nv == 1 ? "" : "s", n_images, n_images == 1 ? "" : "s", n_videos, n_videos == 1 ? "" : "s");
    char *o = malloc(need);
    if (!o) return mmc_error(MMC_ERR_OOM, "out of memory");
    char *w = o;
    const char *s = text;
    for (int v = 0; v < n_videos; v++) {
        const char *b = strstr(s, IVL_VID);
        memcpy(w, s, (size_t)(b - s));
        w += b - s;
        char *start = w;
        for (int64_t f = 0; f < frames[v]; f++)   /* replace_video_token: "\n".join("Frame{i+1}: <img>...</img>") */
            w += sprintf(w, "%sFrame%lld: " IVL_IMG, f ? "\n" : "", (long long)f + 1);
        if (at) at[v] = b - text;
        if (grow) grow[v] = (int64_t)(w - start) - (int64_t)lv;
        s = b + lv;
    }
    strcpy(w, s);
    *out = o;
    return MMC_OK;
}
