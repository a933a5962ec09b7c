/* qwen2_vl_processor.c — Qwen2-VL image and video preprocessing. Mirrors transformers'
 * Qwen2VLImageProcessorPil (the use_fast=False processor): smart_resize, PIL bicubic
 * resize, rescale (uint8 * (1/255) in double, then float32), normalise in float32
 * ((x - mean) / std, both float32), patchify; and Qwen2VLVideoProcessor's temporal
 * grouping (last frame repeated to fill the final temporal patch).
 */
#include "mmc_vlproc.h"
#include "mmc_io.h"
#include "io/io_internal.h"
#include "processors/processors_internal.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mmc_qwen2vl_proc_default(mmc_qwen2vl_proc *p) {
    memset(p, 0, sizeof *p);
    p->patch_size = 14;
    p->merge_size = 2;
    p->temporal_patch_size = 2;
    p->min_pixels = 56 * 56;
    p->max_pixels = 28 * 28 * 1280;
    p->video_min_pixels = 128 * 28 * 28;
    p->video_max_pixels = 28 * 28 * 768;
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};     /* OPENAI_CLIP_MEAN */
    const float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};     /* OPENAI_CLIP_STD */
    memcpy(p->image_mean, mean, sizeof mean);
    memcpy(p->image_std, std, sizeof std);
    p->rescale_factor = 1.0 / 255.0;
    p->do_resize = p->do_rescale = p->do_normalize = true;
    p->resample = MMC_RESAMPLE_BICUBIC;
    p->resize_mode = MMC_VLPROC_RESIZE_PIL;
}

/* One field of the image processor object o (read from `path`, under `where`: "" or
 * "image_processor."): absent or null leaves *v; present with the wrong type is an error. */
static mmc_status get_num(const cJSON *o, const char *key, const char *path, const char *where, bool integral,
                          double lo, double hi, double *v, bool *present) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (present) *present = false;
    if (!x || cJSON_IsNull(x)) return MMC_OK;
    double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    if (!(d >= lo && d <= hi) || (integral && d != floor(d)))
        return mmc_error(MMC_ERR_FORMAT, "%s: %s%s must be %s in [%g, %g]", path, where, key,
                         integral ? "an integer" : "a number", lo, hi);
    *v = d;
    if (present) *present = true;
    return MMC_OK;
}
static mmc_status get_bool(const cJSON *o, const char *key, const char *path, const char *where, bool *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return MMC_OK;
    if (!cJSON_IsBool(x)) return mmc_error(MMC_ERR_FORMAT, "%s: %s%s must be true or false", path, where, key);
    *v = cJSON_IsTrue(x);
    return MMC_OK;
}

/* The image processor object o over p, as Qwen2VLImageProcessor.__init__ reads it: `size`
 * ({shortest_edge, longest_edge}, or {min_pixels, max_pixels}) replaces the default size as a
 * whole, then the legacy top-level min_pixels / max_pixels override its two edges. */
static mmc_status apply_image_processor(const cJSON *o, const char *path, const char *where, mmc_qwen2vl_proc *p) {
    mmc_status st;
    double v;
    bool has;
    const double PIX = 1e12;   /* far above any image (PIL's own limit is ~1.8e8) */
#define NUM(key, integral, lo, hi, dst)                                                                  \
    do {                                                                                                   \
        if ((st = get_num(o, key, path, where, integral, lo, hi, &v, &has))) return st;                   \
        if (has) dst = v;                                                                                  \
    } while (0)
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
    if (size && !cJSON_IsNull(size)) {
        if (!cJSON_IsObject(size))
            return mmc_error(MMC_ERR_FORMAT, "%s: %ssize must be an object {shortest_edge, longest_edge}", path, where);
        char w[64];
        snprintf(w, sizeof w, "%ssize.", where);
        bool lo_set = false, hi_set = false, h;
        if ((st = get_num(size, "shortest_edge", path, w, true, 1, PIX, &v, &h))) return st;
        if (h) { p->min_pixels = (int64_t)v; lo_set = true; }
        else if ((st = get_num(size, "min_pixels", path, w, true, 1, PIX, &v, &h))) return st;
        if (h && !lo_set) { p->min_pixels = (int64_t)v; lo_set = true; }
        if ((st = get_num(size, "longest_edge", path, w, true, 1, PIX, &v, &h))) return st;
        if (h) { p->max_pixels = (int64_t)v; hi_set = true; }
        else if ((st = get_num(size, "max_pixels", path, w, true, 1, PIX, &v, &h))) return st;
        if (h && !hi_set) { p->max_pixels = (int64_t)v; hi_set = true; }
        /* transformers keeps the given size whole (no merge with the default): a missing edge
         * is an error there too, unless the top-level key supplies it */
        bool top_lo = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "min_pixels"));
        bool top_hi = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "max_pixels"));
        if ((!lo_set && !top_lo) || (!hi_set && !top_hi))
            return mmc_error(MMC_ERR_FORMAT, "%s: %ssize needs both shortest_edge and longest_edge (pixel counts; "
                             "or min_pixels and max_pixels)", path, where);
    }
    NUM("min_pixels", true, 1, PIX, p->min_pixels);
    NUM("max_pixels", true, 1, PIX, p->max_pixels);
    NUM("patch_size", true, 1, 1024, p->patch_size);
    NUM("merge_size", true, 1, 64, p->merge_size);
    NUM("temporal_patch_size", true, 1, 64, p->temporal_patch_size);
    NUM("rescale_factor", false, -1e6, 1e6, p->rescale_factor);
    double rs = -1;
    NUM("resample", true, 0, 5, rs);
    if (rs == 3) p->resample = MMC_RESAMPLE_BICUBIC;
    else if (rs == 2) p->resample = MMC_RESAMPLE_BILINEAR;
    else if (rs >= 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %sresample=%d (only 2 bilinear, 3 bicubic)", path, where, (int)rs);
#undef NUM
    if ((st = get_bool(o, "do_resize", path, where, &p->do_resize))) return st;
    if ((st = get_bool(o, "do_rescale", path, where, &p->do_rescale))) return st;
    if ((st = get_bool(o, "do_normalize", path, where, &p->do_normalize))) return st;
    const char *arr[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, arr[k]);
        if (!a || cJSON_IsNull(a)) continue;
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3)
            return mmc_error(MMC_ERR_FORMAT, "%s: %s%s must be a list of 3 numbers", path, where, arr[k]);
        for (int c = 0; c < 3; c++) {
            const cJSON *x = cJSON_GetArrayItem(a, c);
            if (!cJSON_IsNumber(x)) return mmc_error(MMC_ERR_FORMAT, "%s: %s%s[%d] is not a number", path, where, arr[k], c);
            (k ? p->image_std : p->image_mean)[c] = (float)x->valuedouble;
        }
    }
    if (p->max_pixels < p->min_pixels)
        return mmc_error(MMC_ERR_INVALID, "%s: %smax_pixels (longest_edge) %lld is below min_pixels (shortest_edge) %lld",
                         path, where, (long long)p->max_pixels, (long long)p->min_pixels);
    return MMC_OK;
}

/* path as a JSON object (*root): MMC_ERR_NOT_FOUND when there is no such file, a malformed one
 * an error with line:col (mmc_json_load) */
static mmc_status read_object(const char *path, cJSON **root) {
    mmc_json *j = NULL;
    *root = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    if (!cJSON_IsObject((cJSON *)j)) {
        mmc_json_free(j);
        return mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object", path);
    }
    *root = (cJSON *)j;
    return MMC_OK;
}

/* One file: its "image_processor" object if it has one (processor_config.json), else the
 * whole object. *found: the file held an image processor (a processor_config.json without
 * "image_processor" does not, when `need_nested`). */
static mmc_status load_file(const char *path, bool need_nested, mmc_qwen2vl_proc *p, bool *found) {
    cJSON *root;
    *found = false;
    mmc_status st = read_object(path, &root);
    if (st) return st;
    const cJSON *nested = cJSON_GetObjectItemCaseSensitive(root, "image_processor");
    if (nested && !cJSON_IsObject(nested)) {
        cJSON_Delete(root);
        return mmc_error(MMC_ERR_FORMAT, "%s: image_processor must be an object", path);
    }
    if (nested || !need_nested) {
        mmc_qwen2vl_proc q = *p;   /* p unchanged on error */
        st = apply_image_processor(nested ? nested : root, path, nested ? "image_processor." : "", &q);
        if (!st) { *p = q; *found = true; }
    }
    cJSON_Delete(root);
    return st;
}

mmc_status mmc_qwen2vl_proc_load_dir(const char *dir, mmc_qwen2vl_proc *p, char *used, size_t cap) {
    static const char *const names[2] = {"processor_config.json", "preprocessor_config.json"};
    if (used && cap) used[0] = 0;
    for (int k = 0; k < 2; k++) {
        char path[4200];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[k]) >= (int)sizeof path)
            return mmc_error(MMC_ERR_INVALID, "%s: path too long", dir);
        bool found;
        mmc_status st = load_file(path, k == 0, p, &found);
        struct stat sb;   /* lstat: a dangling link exists, and cannot be read: an error */
        if (st == MMC_ERR_NOT_FOUND && lstat(path, &sb) != 0) continue;   /* no such file */
        if (st) return mmc_error_prefix(st, "image processor config");
        if (found) {
            if (used && cap) snprintf(used, cap, "%s", path);
            return MMC_OK;
        }
    }
    return MMC_OK;
}

mmc_status mmc_qwen2vl_proc_load(const char *path, mmc_qwen2vl_proc *p) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char used[4300];
        mmc_status st = mmc_qwen2vl_proc_load_dir(path, p, used, sizeof used);
        if (!st && !used[0])
            st = mmc_error(MMC_ERR_NOT_FOUND, "%s: no image processor config (processor_config.json with "
                           "\"image_processor\", or preprocessor_config.json)", path);
        return st;
    }
    bool found;
    mmc_status st = load_file(path, false, p, &found);
    return st ? mmc_error_prefix(st, "image processor config") : MMC_OK;
}

mmc_status mmc_qwen2vl_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels,
                                    int *out_h, int *out_w) {
    if (height <= 0 || width <= 0 || factor <= 0)
        return mmc_error(MMC_ERR_INVALID, "smart_resize: bad size %dx%d (factor %d)", width, height, factor);
    double ar = (double)(height > width ? height : width) / (height > width ? width : height);
    if (ar > 200)
        return mmc_error(MMC_ERR_INVALID, "smart_resize: absolute aspect ratio must be smaller than 200, got %g (%dx%d)",
                         ar, width, height);
    int64_t h_bar = (int64_t)nearbyint((double)height / factor) * factor;
    int64_t w_bar = (int64_t)nearbyint((double)width / factor) * factor;
    if (h_bar * w_bar > max_pixels) {
        double beta = sqrt((double)((int64_t)height * width) / (double)max_pixels);
        h_bar = (int64_t)floor((double)height / beta / factor) * factor;
        w_bar = (int64_t)floor((double)width / beta / factor) * factor;
        if (h_bar < factor) h_bar = factor;
        if (w_bar < factor) w_bar = factor;
    } else if (h_bar * w_bar < min_pixels) {
        double beta = sqrt((double)min_pixels / (double)((int64_t)height * width));
        h_bar = (int64_t)ceil(height * beta / factor) * factor;
        w_bar = (int64_t)ceil(width * beta / factor) * factor;
    }
    *out_h = (int)h_bar;
    *out_w = (int)w_bar;
    return MMC_OK;
}

void mmc_vlproc_out_free(mmc_vlproc_out *o) {
    if (!o) return;
    mmc_tensor_free(o->pixel_values);
    free(o->grid_thw);
    memset(o, 0, sizeof *o);
}

/* float (torchvision-style) resize + rescale + normalise of one frame into planar dst [3, oh, ow] */
static mmc_status frame_to_float(const mmc_qwen2vl_proc *p, const mmc_image *img, int oh, int ow, float *dst) {
    size_t hw = (size_t)oh * ow, ihw = (size_t)img->height * img->width;
    float *src = malloc(sizeof(float) * 3 * ihw);
    if (!src) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM");
    for (size_t i = 0; i < ihw; i++)
        for (int c = 0; c < 3; c++) src[c * ihw + i] = img->data[3 * i + c];
    mmc_status st = mmc_resize_f32(src, 3, img->height, img->width, dst, oh, ow, p->resample);
    free(src);
    if (st) return st;
    for (int c = 0; c < 3; c++)
        for (size_t i = 0; i < hw; i++) {
            float v = dst[c * hw + i];
            v = v < 0 ? 0 : v > 255 ? 255 : nearbyintf(v); /* torchvision rounds uint8 back */
            if (p->do_rescale) v = (float)((double)v * p->rescale_factor);
            if (p->do_normalize) v = (v - p->image_mean[c]) / p->image_std[c];
            dst[c * hw + i] = v;
        }
    return MMC_OK;
}

/* frames [T, 3, H, W] (T a multiple of tp) -> rows [T/tp, H/(P*m), W/(P*m), m, m] x cols [3, tp, P, P]. */
static void patchify(const float *frames, int T, int H, int W, int P, int m, int tp, float *out) {
    int gt = T / tp, gh = H / P, gw = W / P;
    size_t hw = (size_t)H * W, D = (size_t)3 * tp * P * P;
    size_t row = 0;
    for (int t = 0; t < gt; t++)
        for (int bh = 0; bh < gh / m; bh++)
            for (int bw = 0; bw < gw / m; bw++)
                for (int mh = 0; mh < m; mh++)
                    for (int mw = 0; mw < m; mw++, row++) {
                        float *o = out + row * D;
                        int y0 = (bh * m + mh) * P, x0 = (bw * m + mw) * P;
                        for (int c = 0; c < 3; c++)
                            for (int tt = 0; tt < tp; tt++) {
                                const float *f = frames + ((size_t)(t * tp + tt) * 3 + c) * hw;
                                for (int py = 0; py < P; py++, o += P)
                                    memcpy(o, f + (size_t)(y0 + py) * W + x0, sizeof(float) * P);
                            }
                    }
}

/* rescale + normalise as a table per (channel, byte): see processors_internal.h */
void mmc_qwen2vl_pixel_lut(const mmc_qwen2vl_proc *p, mmc_vlproc_resize_mode mode, float lut[3][256]) {
    for (int c = 0; c < 3; c++) {
        float inv = (float)(1.0 / p->rescale_factor);
        float mean = p->image_mean[c] * inv, sd = p->image_std[c] * inv;
        for (int u = 0; u < 256; u++) {
            float v = (float)u;
            if (mode == MMC_VLPROC_RESIZE_TORCH) {
                if (p->do_normalize) v = p->do_rescale ? (v - mean) / sd : (v - p->image_mean[c]) / p->image_std[c];
                else if (p->do_rescale) v = v * (float)p->rescale_factor;
            } else {
                if (p->do_rescale) v = (float)((double)u * p->rescale_factor);
                if (p->do_normalize) v = (v - p->image_mean[c]) / p->image_std[c];
            }
            lut[c][u] = v;
        }
    }
}

/* Fused rescale + normalise + temporal repeat + patchify from 8-bit RGB frames (n of them, the
 * last repeated up to T = gt * tp) into rows [gt, H/(P*m), W/(P*m), m, m] x cols [3, tp, P, P]:
 * one pass that writes each output byte once, threads over rows. */
static void patchify_u8(const mmc_image *fr, int n, int gt, int H, int W, int P, int m, int tp,
                        const float lut[3][256], float *out) {
    int64_t gh = H / P, gw = W / P, rows = (int64_t)gt * gh * gw;
    size_t D = (size_t)3 * tp * P * P;
#pragma omp parallel for schedule(static) if (rows * (int64_t)D > ((int64_t)16 << 20))   /* see mmc_image_resize */
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = r / (gh * gw), q = r % (gh * gw);
        int64_t blk = q / (m * m), in = q % (m * m);
        int64_t bh = blk / (gw / m), bw = blk % (gw / m);
        int y0 = (int)((bh * m + in / m) * P), x0 = (int)((bw * m + in % m) * P);
        float *o = out + (size_t)r * D;
        for (int c = 0; c < 3; c++)
            for (int tt = 0; tt < tp; tt++, o += (size_t)P * P) {
                int f = (int)(t * tp + tt) < n ? (int)(t * tp + tt) : n - 1;
                if (tt > 0 && f == (int)(t * tp + tt - 1 < n ? t * tp + tt - 1 : n - 1)) {
                    memcpy(o, o - (size_t)P * P, sizeof(float) * P * P);   /* the same frame again */
                    continue;
                }
                const uint8_t *src = fr[f].data + ((size_t)y0 * W + x0) * 3 + c;
                for (int py = 0; py < P; py++, src += (size_t)W * 3)
                    for (int px = 0; px < P; px++) o[py * P + px] = lut[c][src[3 * px]];
            }
    }
}

static mmc_status grid_append(mmc_vlproc_out *out, int64_t t, int64_t h, int64_t w, int m) {
    int64_t(*g)[3] = realloc(out->grid_thw, sizeof *g * (size_t)(out->n_grid + 1));
    if (!g) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM");
    out->grid_thw = g;
    g[out->n_grid][0] = t;
    g[out->n_grid][1] = h;
    g[out->n_grid][2] = w;
    out->n_grid++;
    out->num_tokens += t * h * w / ((int64_t)m * m);
    return MMC_OK;
}

/* Shared by images (one frame, repeated) and videos (n frames, last one repeated). */
static mmc_status process_group(const mmc_qwen2vl_proc *p, const mmc_image *frames, int n, float *dst_rows,
                                int64_t *rows_out, int oh, int ow) {
    int tp = p->temporal_patch_size, T = (n + tp - 1) / tp * tp;
    *rows_out = (int64_t)(T / tp) * (oh / p->patch_size) * (ow / p->patch_size);
    bool resize = oh != frames[0].height || ow != frames[0].width;
    if (resize && p->resize_mode == MMC_VLPROC_RESIZE_FLOAT) {
        size_t fsz = (size_t)3 * oh * ow;
        float *buf = malloc(sizeof(float) * fsz * T);
        if (!buf) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM for %d frames of %dx%d", T, ow, oh);
        for (int i = 0; i < n; i++) {
            mmc_status st = frame_to_float(p, &frames[i], oh, ow, buf + fsz * i);
            if (st) { free(buf); return st; }
        }
        for (int i = n; i < T; i++) memcpy(buf + fsz * i, buf + fsz * (n - 1), sizeof(float) * fsz);
        patchify(buf, T, oh, ow, p->patch_size, p->merge_size, tp, dst_rows);
        free(buf);
        return MMC_OK;
    }
    /* PIL path: 8-bit resize (Pillow-exact), then the fused pass; TORCH: torch's uint8 resize */
    mmc_image *rs = NULL;
    if (resize) {
        if (!(rs = calloc((size_t)n, sizeof *rs))) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM");
        for (int i = 0; i < n; i++) {
            mmc_status st = p->resize_mode == MMC_VLPROC_RESIZE_TORCH
                                 ? mmc_image_resize_torch_u8(&frames[i], oh, ow, p->resample, &rs[i])
                                 : mmc_image_resize(&frames[i], oh, ow, p->resample, &rs[i]);
            if (st) {
                for (int j = 0; j < i; j++) mmc_image_free(&rs[j]);
                free(rs);
                return st;
            }
        }
    }
    float lut[3][256];
    mmc_qwen2vl_pixel_lut(p, p->resize_mode, lut);
    patchify_u8(rs ? rs : frames, n, T / tp, oh, ow, p->patch_size, p->merge_size, tp, (const float(*)[256])lut,
                dst_rows);
    if (rs) {
        for (int i = 0; i < n; i++) mmc_image_free(&rs[i]);
        free(rs);
    }
    return MMC_OK;
}

/* The [rows, D] float32 output, left uninitialised: every element is written by process_group. */
static mmc_tensor *pixel_values_new(int64_t rows, int64_t D) {
    size_t nb = (size_t)rows * (size_t)D * sizeof(float);
    void *data = mmc_io_big_alloc(nb + 64);
    mmc_tensor *t = data ? mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(rows, D), data) : NULL;
    if (!t) {
        free(data);
        mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: out of memory for pixel_values [%lld, %lld]", (long long)rows,
                  (long long)D);
        return NULL;
    }
    t->flags |= MMC_OWNS_DATA;
    return t;
}

static mmc_status target_size(const mmc_qwen2vl_proc *p, const mmc_image *img, int64_t min_px, int64_t max_px,
                              int *oh, int *ow) {
    if (!img->data || img->height <= 0 || img->width <= 0)
        return mmc_error(MMC_ERR_INVALID, "qwen2vl preprocess: empty image");
    if (!p->do_resize) {
        *oh = img->height;
        *ow = img->width;
        if (*oh % (p->patch_size * p->merge_size) || *ow % (p->patch_size * p->merge_size))
            return mmc_error(MMC_ERR_SHAPE, "qwen2vl preprocess: do_resize=false but %dx%d is not a multiple of %d",
                             *ow, *oh, p->patch_size * p->merge_size);
        return MMC_OK;
    }
    return mmc_qwen2vl_smart_resize(img->height, img->width, p->patch_size * p->merge_size, min_px, max_px, oh, ow);
}

mmc_status mmc_qwen2vl_preprocess_images(const mmc_qwen2vl_proc *p, const mmc_image *imgs, int n,
                                         mmc_vlproc_out *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "qwen2vl preprocess: no images");
    int *sz = malloc(sizeof(int) * 2 * n);
    if (!sz) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM");
    int64_t total = 0;
    mmc_status st = MMC_OK;
    for (int i = 0; i < n; i++) {
        if ((st = target_size(p, &imgs[i], p->min_pixels, p->max_pixels, &sz[2 * i], &sz[2 * i + 1]))) {
            mmc_error_prefix(st, "image %d", i);
            goto fail;
        }
        total += (int64_t)(sz[2 * i] / p->patch_size) * (sz[2 * i + 1] / p->patch_size);
    }
    int64_t D = 3LL * p->temporal_patch_size * p->patch_size * p->patch_size;
    out->pixel_values = pixel_values_new(total, D);
    if (!out->pixel_values) { st = MMC_ERR_OOM; goto fail; }
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        int64_t rows = 0;
        st = process_group(p, &imgs[i], 1, (float *)out->pixel_values->data + row * D, &rows, sz[2 * i],
                           sz[2 * i + 1]);
        if (st) goto fail;
        row += rows;
        if ((st = grid_append(out, 1, sz[2 * i] / p->patch_size, sz[2 * i + 1] / p->patch_size, p->merge_size)))
            goto fail;
    }
    free(sz);
    return MMC_OK;
fail:
    free(sz);
    mmc_vlproc_out_free(out);
    return st;
}

mmc_status mmc_qwen2vl_preprocess_video(const mmc_qwen2vl_proc *p, const mmc_image *frames, int n_frames,
                                        mmc_vlproc_out *out) {
    memset(out, 0, sizeof *out);
    if (n_frames <= 0) return mmc_error(MMC_ERR_INVALID, "qwen2vl video: no frames");
    for (int i = 1; i < n_frames; i++)
        if (frames[i].height != frames[0].height || frames[i].width != frames[0].width)
            return mmc_error(MMC_ERR_SHAPE, "qwen2vl video: frame %d is %dx%d, frame 0 is %dx%d", i, frames[i].width,
                             frames[i].height, frames[0].width, frames[0].height);
    int oh, ow;
    mmc_status st = target_size(p, &frames[0], p->video_min_pixels, p->video_max_pixels, &oh, &ow);
    if (st) return st;
    int tp = p->temporal_patch_size;
    int64_t gt = (n_frames + tp - 1) / tp, gh = oh / p->patch_size, gw = ow / p->patch_size;
    int64_t D = 3LL * tp * p->patch_size * p->patch_size;
    out->pixel_values = pixel_values_new(gt * gh * gw, D);
    if (!out->pixel_values) return MMC_ERR_OOM;
    int64_t rows = 0;
    if ((st = process_group(p, frames, n_frames, out->pixel_values->data, &rows, oh, ow)) ||
        (st = grid_append(out, gt, gh, gw, p->merge_size))) {
        mmc_vlproc_out_free(out);
        return st;
    }
    return MMC_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

mmc_status mmc_load_frames_dir(const char *dir, const mmc_image_opts *opts, mmc_image **frames, int *n_frames) {
    *frames = NULL;
    *n_frames = 0;
    DIR *d = opendir(dir);
    if (!d) return mmc_error(MMC_ERR_IO, "frames folder %s: cannot open", dir);
    char **names = NULL;
    int n = 0, cap = 0;
    mmc_status st = MMC_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name, *dot = strrchr(nm, '.');
        if (nm[0] == '.' || !dot) continue;
        if (strcasecmp(dot, ".jpg") && strcasecmp(dot, ".jpeg") && strcasecmp(dot, ".png")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, sizeof(char *) * cap);
            if (!nn) { st = mmc_error(MMC_ERR_OOM, "frames folder %s: OOM", dir); goto done; }
            names = nn;
        }
        if (!(names[n] = strdup(nm))) { st = mmc_error(MMC_ERR_OOM, "frames folder %s: OOM", dir); goto done; }
        n++;
    }
    if (n == 0) { st = mmc_error(MMC_ERR_NOT_FOUND, "frames folder %s: no .jpg/.jpeg/.png files", dir); goto done; }
    qsort(names, n, sizeof(char *), cmp_str);
    *frames = calloc(n, sizeof(mmc_image));
    if (!*frames) { st = mmc_error(MMC_ERR_OOM, "frames folder %s: OOM", dir); goto done; }
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if ((st = mmc_image_load(path, opts, &(*frames)[i]))) {
            for (int j = 0; j < i; j++) mmc_image_free(&(*frames)[j]);
            free(*frames);
            *frames = NULL;
            goto done;
        }
    }
    *n_frames = n;
done:
    closedir(d);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}
