/* qwen2_vl_processor.c — Qwen2-VL image and video preprocessing. Mirrors transformers'
 * Qwen2VLImageProcessorPil (the use_fast=False processor): smart_resize, PIL bicubic
 * resize, rescale (uint8 * (1/255) in double, then float32), normalise in float32
 * ((x - mean) / std, both float32), patchify; and Qwen2VLVideoProcessor's temporal
 * grouping (last frame repeated to fill the final temporal patch).
 */
#include "mmc_vlproc.h"
#include "mmc_io.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int json_num(const cJSON *o, const char *key, double *v) {
    const cJSON *x = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    if (!cJSON_IsNumber(x)) return 0;
    *v = x->valuedouble;
    return 1;
}
static void json_bool(const cJSON *o, const char *key, bool *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(x)) *v = cJSON_IsTrue(x);
}

mmc_status mmc_qwen2vl_proc_load(const char *path, mmc_qwen2vl_proc *p) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return mmc_error_prefix(st, "preprocessor config %s", path);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object", path);
    }
    /* transformers 5.x saves processor_config.json with the image processor nested */
    cJSON *nested = cJSON_DetachItemFromObjectCaseSensitive(root, "image_processor");
    if (cJSON_IsObject(nested)) { cJSON_Delete(root); root = nested; }
    else cJSON_Delete(nested);
    double v;
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(root, "size");
    if (cJSON_IsObject(size)) {
        if (json_num(size, "shortest_edge", &v) || json_num(size, "min_pixels", &v)) p->min_pixels = (int64_t)v;
        if (json_num(size, "longest_edge", &v) || json_num(size, "max_pixels", &v)) p->max_pixels = (int64_t)v;
    }
    if (json_num(root, "min_pixels", &v)) p->min_pixels = (int64_t)v;
    if (json_num(root, "max_pixels", &v)) p->max_pixels = (int64_t)v;
    if (json_num(root, "patch_size", &v)) p->patch_size = (int)v;
    if (json_num(root, "merge_size", &v)) p->merge_size = (int)v;
    if (json_num(root, "temporal_patch_size", &v)) p->temporal_patch_size = (int)v;
    if (json_num(root, "rescale_factor", &v)) p->rescale_factor = v;
    if (json_num(root, "resample", &v)) {
        if ((int)v == 3) p->resample = MMC_RESAMPLE_BICUBIC;
        else if ((int)v == 2) p->resample = MMC_RESAMPLE_BILINEAR;
        else { cJSON_Delete(root); return mmc_error(MMC_ERR_UNSUPPORTED, "%s: resample=%d (only 2 bilinear, 3 bicubic)", path, (int)v); }
    }
    json_bool(root, "do_resize", &p->do_resize);
    json_bool(root, "do_rescale", &p->do_rescale);
    json_bool(root, "do_normalize", &p->do_normalize);
    const char *arr[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, arr[k]);
        if (!a) continue;
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3) {
            cJSON_Delete(root);
            return mmc_error(MMC_ERR_FORMAT, "%s: %s must be a list of 3 numbers", path, arr[k]);
        }
        for (int c = 0; c < 3; c++) {
            const cJSON *x = cJSON_GetArrayItem(a, c);
            if (!cJSON_IsNumber(x)) { cJSON_Delete(root); return mmc_error(MMC_ERR_FORMAT, "%s: %s[%d] not a number", path, arr[k], c); }
            (k ? p->image_std : p->image_mean)[c] = (float)x->valuedouble;
        }
    }
    cJSON_Delete(root);
    if (p->patch_size <= 0 || p->merge_size <= 0 || p->temporal_patch_size <= 0 || p->min_pixels <= 0 ||
        p->max_pixels < p->min_pixels)
        return mmc_error(MMC_ERR_INVALID, "%s: invalid sizes (patch %d merge %d temporal %d, pixels [%lld, %lld])", path,
                         p->patch_size, p->merge_size, p->temporal_patch_size, (long long)p->min_pixels,
                         (long long)p->max_pixels);
    return MMC_OK;
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

/* Resize + rescale + normalise one frame into planar float dst [3, oh, ow]. */
static mmc_status frame_to_float(const mmc_qwen2vl_proc *p, const mmc_image *img, int oh, int ow, float *dst) {
    size_t hw = (size_t)oh * ow;
    float mean[3], inv_ok[3];
    (void)inv_ok;
    for (int c = 0; c < 3; c++) mean[c] = p->image_mean[c];
    mmc_status st = MMC_OK;
    if (p->resize_mode == MMC_VLPROC_RESIZE_FLOAT && (oh != img->height || ow != img->width)) {
        size_t ihw = (size_t)img->height * img->width;
        float *src = malloc(sizeof(float) * 3 * ihw);
        if (!src) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM");
        for (size_t i = 0; i < ihw; i++)
            for (int c = 0; c < 3; c++) src[c * ihw + i] = img->data[3 * i + c];
        st = mmc_resize_f32(src, 3, img->height, img->width, dst, oh, ow, p->resample);
        free(src);
        if (st) return st;
        for (int c = 0; c < 3; c++)
            for (size_t i = 0; i < hw; i++) {
                float v = dst[c * hw + i];
                v = v < 0 ? 0 : v > 255 ? 255 : nearbyintf(v); /* torchvision rounds uint8 back */
                if (p->do_rescale) v = (float)((double)v * p->rescale_factor);
                if (p->do_normalize) v = (v - mean[c]) / p->image_std[c];
                dst[c * hw + i] = v;
            }
        return MMC_OK;
    }
    mmc_image r = {0};
    const mmc_image *use = img;
    if (oh != img->height || ow != img->width) {
        if ((st = mmc_image_resize(img, oh, ow, p->resample, &r))) return st;
        use = &r;
    }
    /* The value depends only on (channel, byte): a 3x256 table replaces per-pixel math. */
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        for (int u = 0; u < 256; u++) {
            float v = (float)u;
            if (p->do_rescale) v = (float)((double)u * p->rescale_factor);
            if (p->do_normalize) v = (v - mean[c]) / p->image_std[c];
            lut[c][u] = v;
        }
    const uint8_t *s = use->data;
    for (size_t i = 0; i < hw; i++) {
        dst[i] = lut[0][s[3 * i]];
        dst[hw + i] = lut[1][s[3 * i + 1]];
        dst[2 * hw + i] = lut[2][s[3 * i + 2]];
    }
    mmc_image_free(&r);
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
static mmc_status process_group(const mmc_qwen2vl_proc *p, const mmc_image *frames, int n, int64_t min_px,
                                int64_t max_px, float *dst_rows, int64_t *rows_out, int oh, int ow) {
    int tp = p->temporal_patch_size;
    int T = (n + tp - 1) / tp * tp;
    size_t fsz = (size_t)3 * oh * ow;
    float *buf = malloc(sizeof(float) * fsz * T);
    if (!buf) return mmc_error(MMC_ERR_OOM, "qwen2vl preprocess: OOM for %d frames of %dx%d", T, ow, oh);
    for (int i = 0; i < n; i++) {
        mmc_status st = frame_to_float(p, &frames[i], oh, ow, buf + fsz * i);
        if (st) { free(buf); return st; }
    }
    for (int i = n; i < T; i++) memcpy(buf + fsz * i, buf + fsz * (n - 1), sizeof(float) * fsz);
    patchify(buf, T, oh, ow, p->patch_size, p->merge_size, tp, dst_rows);
    *rows_out = (int64_t)(T / tp) * (oh / p->patch_size) * (ow / p->patch_size);
    free(buf);
    (void)min_px; (void)max_px;
    return MMC_OK;
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
    out->pixel_values = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(total, D));
    if (!out->pixel_values) { st = MMC_ERR_OOM; goto fail; }
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        int64_t rows = 0;
        st = process_group(p, &imgs[i], 1, 0, 0, (float *)out->pixel_values->data + row * D, &rows, sz[2 * i],
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
    out->pixel_values = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(gt * gh * gw, D));
    if (!out->pixel_values) return MMC_ERR_OOM;
    int64_t rows = 0;
    if ((st = process_group(p, frames, n_frames, 0, 0, out->pixel_values->data, &rows, oh, ow)) ||
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
