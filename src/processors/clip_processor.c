/* clip_processor.c — CLIPImageProcessor, the image processor of LLaVA-1.5 (and of CLIP). Mirrors
 * transformers' CLIPImageProcessorPil (models/clip/image_processing_pil_clip.py on PilBackend):
 *
 *   resize     shortest edge -> size.shortest_edge, long edge int(shortest_edge * long / short)
 *              (get_resize_output_image_size, default_to_square=False), Pillow bicubic on uint8
 *              (mmc_image_resize is Pillow-exact); or a fixed size {height, width}
 *   crop       crop_size at top = (h - ch) // 2, left = (w - cw) // 2
 *   rescale    u * rescale_factor in double, then float32
 *   normalise  (x - mean) / std in float32                       -> pixel_values [N, 3, ch, cw]
 *
 * With resize_mode MMC_VLPROC_RESIZE_TORCH it mirrors the torchvision backend (transformers 5's
 * AutoImageProcessor default when torchvision is installed): torch's uint8 antialiased resize,
 * the same crop (int((h - ch) / 2.0)), then TorchvisionBackend's fused rescale_and_normalize.
 * Both tabulate rescale + normalise per byte (mmc_qwen2vl_pixel_lut). */
#include "mmc_vlproc.h"
#include "mmc_io.h"
#include "processors/processors_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mmc_clip_proc_default(mmc_clip_proc *p) {
    memset(p, 0, sizeof *p);
    p->shortest_edge = 224;
    p->crop_h = p->crop_w = 224;
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};     /* OPENAI_CLIP_MEAN */
    const float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};     /* OPENAI_CLIP_STD */
    memcpy(p->image_mean, mean, sizeof mean);
    memcpy(p->image_std, std, sizeof std);
    p->rescale_factor = 1.0 / 255.0;
    p->do_resize = p->do_center_crop = p->do_rescale = p->do_normalize = p->do_convert_rgb = true;
    p->resample = MMC_RESAMPLE_BICUBIC;
    p->resize_mode = MMC_VLPROC_RESIZE_PIL;
}

#define CLIP_MAX_SIDE 65536
/* the image processor object o (from `path`, under `where`) over *p */
static mmc_status apply(const mmc_json *o, const char *path, const char *where, mmc_clip_proc *p) {
    mmc_status st;
    int64_t v;
    const mmc_json *size = mmc_json_get(o, "size");
    if (size && mmc_json_is_object(size)) {
        /* a given size replaces the default whole, as in transformers */
        int64_t se = 0, h = 0, w = 0;
        if ((st = mmc_json_int(size, "shortest_edge", 0, &se)) || (st = mmc_json_int(size, "height", 0, &h)) ||
            (st = mmc_json_int(size, "width", 0, &w)))
            return mmc_error_prefix(st, "%s: %ssize", path, where);
        if (se > 0 && se <= CLIP_MAX_SIDE) p->shortest_edge = se, p->size_h = p->size_w = 0;
        else if (h > 0 && w > 0 && h <= CLIP_MAX_SIDE && w <= CLIP_MAX_SIDE) p->shortest_edge = 0, p->size_h = h, p->size_w = w;
        else
            return mmc_error(MMC_ERR_FORMAT, "%s: %ssize must be {shortest_edge} or {height, width}, each from 1 to %d",
                             path, where, CLIP_MAX_SIDE);
    } else if (size && mmc_json_int(o, "size", 0, &v) == MMC_OK && v > 0 && v <= CLIP_MAX_SIDE) {
        p->shortest_edge = v, p->size_h = p->size_w = 0;   /* legacy int size: the shortest edge */
    } else if (size) {
        return mmc_error(MMC_ERR_FORMAT, "%s: %ssize must be an object {shortest_edge}", path, where);
    }
    const mmc_json *crop = mmc_json_get(o, "crop_size");
    if (crop && mmc_json_is_object(crop)) {
        int64_t h = 0, w = 0;
        if ((st = mmc_json_int(crop, "height", 0, &h)) || (st = mmc_json_int(crop, "width", 0, &w)))
            return mmc_error_prefix(st, "%s: %scrop_size", path, where);
        if (h < 1 || w < 1 || h > CLIP_MAX_SIDE || w > CLIP_MAX_SIDE)
            return mmc_error(MMC_ERR_FORMAT, "%s: %scrop_size needs height and width from 1 to %d", path, where,
                             CLIP_MAX_SIDE);
        p->crop_h = h, p->crop_w = w;
    } else if (crop && mmc_json_int(o, "crop_size", 0, &v) == MMC_OK && v > 0 && v <= CLIP_MAX_SIDE) {
        p->crop_h = p->crop_w = v;
    } else if (crop) {
        return mmc_error(MMC_ERR_FORMAT, "%s: %scrop_size must be an object {height, width}", path, where);
    }
    if ((st = mmc_json_num(o, "rescale_factor", p->rescale_factor, &p->rescale_factor)) ||
        (st = mmc_json_bool(o, "do_resize", p->do_resize, &p->do_resize)) ||
        (st = mmc_json_bool(o, "do_center_crop", p->do_center_crop, &p->do_center_crop)) ||
        (st = mmc_json_bool(o, "do_rescale", p->do_rescale, &p->do_rescale)) ||
        (st = mmc_json_bool(o, "do_normalize", p->do_normalize, &p->do_normalize)) ||
        (st = mmc_json_bool(o, "do_convert_rgb", p->do_convert_rgb, &p->do_convert_rgb)) ||
        (st = mmc_json_int(o, "resample", 3, &v)))
        return mmc_error_prefix(st, "%s: %s", path, where);
    if (v == 3) p->resample = MMC_RESAMPLE_BICUBIC;
    else if (v == 2) p->resample = MMC_RESAMPLE_BILINEAR;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sresample=%lld (only 2 bilinear, 3 bicubic)", path, where, (long long)v);
    if ((st = mmc_vlproc_read_mean_std(o, path, where, p->image_mean, p->image_std))) return st;
    return MMC_OK;
}

mmc_status mmc_clip_proc_load_dir(const char *dir, mmc_clip_proc *p, char *used, size_t cap) {
    static const char *const names[2] = {"processor_config.json", "preprocessor_config.json"};
    if (used && cap) used[0] = 0;
    for (int k = 0; k < 2; k++) {
        char path[4200];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[k]) >= (int)sizeof path)
            return mmc_error(MMC_ERR_INVALID, "%s: path too long", dir);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;   /* no such file (a dangling link is an error below) */
        mmc_json *j = NULL;
        mmc_status st = mmc_json_load(path, &j);
        if (st) return mmc_error_prefix(st, "image processor config");
        const mmc_json *o = mmc_json_get(j, "image_processor");
        if (k == 0 && !o) { mmc_json_free(j); continue; }
        mmc_clip_proc q = *p;
        st = apply(o ? o : j, path, o ? "image_processor." : "", &q);
        mmc_json_free(j);
        if (st) return st;
        *p = q;
        if (used && cap) snprintf(used, cap, "%s", path);
        return MMC_OK;
    }
    return MMC_OK;
}

mmc_status mmc_clip_preprocess(const mmc_clip_proc *p, const mmc_image *imgs, int n, mmc_tensor **out) {
    *out = NULL;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "CLIPImageProcessor: no images");
    bool torch = p->resize_mode == MMC_VLPROC_RESIZE_TORCH;
    if (p->resize_mode == MMC_VLPROC_RESIZE_FLOAT)
        return mmc_error(MMC_ERR_UNSUPPORTED, "CLIPImageProcessor: the float resize mode is not supported");
    float lut[3][256];
    mmc_qwen2vl_proc q;   /* the rescale / normalise settings in the Qwen processor's form */
    mmc_qwen2vl_proc_default(&q);
    memcpy(q.image_mean, p->image_mean, sizeof q.image_mean);
    memcpy(q.image_std, p->image_std, sizeof q.image_std);
    q.rescale_factor = p->rescale_factor;
    q.do_rescale = p->do_rescale;
    q.do_normalize = p->do_normalize;
    mmc_qwen2vl_pixel_lut(&q, p->resize_mode, lut);
    mmc_tensor *t = NULL;
    mmc_status st = MMC_OK;
    for (int i = 0; i < n && !st; i++) {
        const mmc_image *img = &imgs[i];
        mmc_image rs = {0};
        const mmc_image *cur = img;
        if (p->do_resize) {
            int oh, ow;
            if (p->shortest_edge) {
                int64_t h = img->height, w = img->width, s = p->shortest_edge;
                int64_t shrt = w <= h ? w : h, lng = w <= h ? h : w;
                int64_t nl = (int64_t)((double)(s * lng) / (double)shrt);
                oh = (int)(w <= h ? nl : s), ow = (int)(w <= h ? s : nl);
            } else {
                oh = (int)p->size_h, ow = (int)p->size_w;
            }
            if (oh < 1 || ow < 1 || oh > CLIP_MAX_SIDE || ow > CLIP_MAX_SIDE) {
                st = mmc_error(MMC_ERR_INVALID, "CLIPImageProcessor: image %d (%d x %d) resizes to %d x %d", i,
                               img->width, img->height, ow, oh);
                break;
            }
            st = torch ? mmc_image_resize_torch_u8(img, oh, ow, p->resample, &rs)
                       : mmc_image_resize(img, oh, ow, p->resample, &rs);
            if (st) break;
            cur = &rs;
        }
        int64_t top = 0, left = 0, ch = cur->height, cw = cur->width;
        if (p->do_center_crop) {
            if (p->crop_h > cur->height || p->crop_w > cur->width) {
                st = mmc_error(MMC_ERR_UNSUPPORTED, "CLIPImageProcessor: image %d is %d x %d after the resize, smaller "
                               "than crop_size %lld x %lld (padding is not supported)", i, cur->width, cur->height,
                               (long long)p->crop_w, (long long)p->crop_h);
                mmc_image_free(&rs);
                break;
            }
            ch = p->crop_h, cw = p->crop_w;
            top = (cur->height - ch) / 2, left = (cur->width - cw) / 2;
        }
        if (!t) {
            t = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(n, 3, ch, cw));
            if (!t) { mmc_image_free(&rs); st = mmc_error(MMC_ERR_OOM, "out of memory for pixel_values"); break; }
        } else if (t->shape[2] != ch || t->shape[3] != cw) {
            mmc_image_free(&rs);
            st = mmc_error(MMC_ERR_INVALID, "CLIPImageProcessor: images of different sizes cannot be batched");
            break;
        }
        float *dst = (float *)t->data + (int64_t)i * 3 * ch * cw;
        for (int64_t y = 0; y < ch; y++)
            for (int64_t x = 0; x < cw; x++) {
                const uint8_t *px = cur->data + ((top + y) * cur->width + left + x) * 3;
                for (int c = 0; c < 3; c++) dst[(c * ch + y) * cw + x] = lut[c][px[c]];
            }
        mmc_image_free(&rs);
    }
    if (st) { mmc_tensor_free(t); return st; }
    *out = t;
    return MMC_OK;
}

mmc_status mmc_vlproc_read_mean_std(const mmc_json *o, const char *path, const char *where, float mean[3],
                                    float std[3]) {
    static const char *const arr[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2; k++) {
        if (!mmc_json_has(o, arr[k])) continue;
        double d[3];
        char key[32];
        bool ok = true;
        for (int c = 0; c < 3 && ok; c++) {
            snprintf(key, sizeof key, "%s.%d", arr[k], c);
            ok = mmc_json_has(o, key) && mmc_json_num(o, key, 0, &d[c]) == MMC_OK;
        }
        snprintf(key, sizeof key, "%s.3", arr[k]);
        if (!ok || mmc_json_has(o, key))
            return mmc_error(MMC_ERR_FORMAT, "%s: %s%s must be a list of 3 numbers", path, where, arr[k]);
        for (int c = 0; c < 3; c++) (k ? std : mean)[c] = (float)d[c];
    }
    return MMC_OK;
}
