/* qwen2_vl_video.c — the Qwen2-VL video processor. Mirrors transformers'
 * Qwen2VLVideoProcessor (video_processing_qwen2_vl.py, the torchvision backend): its own
 * settings read with AutoVideoProcessor's precedence, sample_frames (fps / num_frames /
 * min_frames / max_frames, counts rounded to temporal_patch_size, torch.arange indices),
 * smart_resize (optionally capped by qwen-vl-utils' total pixel budget), torch's uint8
 * antialiased resize (mmc_image_resize_torch_u8), the fused rescale+normalise of
 * TorchvisionBackend.rescale_and_normalize, temporal padding and patchify. Decoding is
 * src/io/video.c. mmc_qwen2vl_video_load_preprocess does both at once: each frame resized on the
 * thread that decoded it and its temporal group's rows written as soon as the group is in
 * (no decoded frames kept; the same bytes as load then preprocess).
 */
#include "mmc_video.h"
#include "mmc_io.h"
#include "io/io_internal.h"
#include "processors/processors_internal.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void mmc_qwen2vl_video_proc_default(mmc_qwen2vl_video_proc *p) {
    memset(p, 0, sizeof *p);
    mmc_qwen2vl_proc_default(&p->proc);
    p->proc.video_min_pixels = 128 * 28 * 28;
    p->proc.video_max_pixels = 28 * 28 * 768;
    p->proc.resize_mode = MMC_VLPROC_RESIZE_FLOAT;
    p->min_frames = 4;
    p->max_frames = 768;
    p->max_video_tokens = 128000;
}

void mmc_qwen2vl_video_sampling_default(mmc_qwen2vl_video_proc *p) {
    if (p->do_sample_frames && (p->fps > 0 || p->num_frames > 0)) return;
    p->do_sample_frames = true;
    if (p->num_frames <= 0) p->fps = 2;
}

/* A number, or absent / null (0). Anything else is an error naming the key. */
static mmc_status num(const cJSON *o, const char *key, const char *path, double *v, int *found) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *found = 0;
    if (!x || cJSON_IsNull(x)) return MMC_OK;
    if (!cJSON_IsNumber(x)) return mmc_error(MMC_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    *v = x->valuedouble;
    *found = 1;
    return MMC_OK;
}

static mmc_status boolean(const cJSON *o, const char *key, const char *path, bool *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return MMC_OK;
    if (!cJSON_IsBool(x)) return mmc_error(MMC_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
    *v = cJSON_IsTrue(x);
    return MMC_OK;
}

static mmc_status read_obj(const cJSON *o, const char *path, mmc_qwen2vl_video_proc *p) {
    mmc_qwen2vl_proc *q = &p->proc;
    double v;
    int f;
    mmc_status st;
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(o, "size");
    if (size && !cJSON_IsNull(size)) {
        if (!cJSON_IsObject(size)) return mmc_error(MMC_ERR_FORMAT, "%s: \"size\" must be an object", path);
        if ((st = num(size, "shortest_edge", path, &v, &f))) return st;
        if (!f && (st = num(size, "min_pixels", path, &v, &f))) return st;
        if (f) q->video_min_pixels = (int64_t)v;
        if ((st = num(size, "longest_edge", path, &v, &f))) return st;
        if (!f && (st = num(size, "max_pixels", path, &v, &f))) return st;
        if (f) q->video_max_pixels = (int64_t)v;
    }
    /* the constructor moves top-level min_pixels / max_pixels into size */
    if ((st = num(o, "min_pixels", path, &v, &f))) return st;
    if (f) q->video_min_pixels = (int64_t)v;
    if ((st = num(o, "max_pixels", path, &v, &f))) return st;
    if (f) q->video_max_pixels = (int64_t)v;
    struct { const char *key; int *dst; } ints[] = {
        {"patch_size", &q->patch_size}, {"merge_size", &q->merge_size},
        {"temporal_patch_size", &q->temporal_patch_size}, {"min_frames", &p->min_frames},
        {"max_frames", &p->max_frames}, {"num_frames", &p->num_frames}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if ((st = num(o, ints[i].key, path, &v, &f))) return st;
        if (!f) continue;
        if (v != floor(v) || v < 0 || v > 1e6)
            return mmc_error(MMC_ERR_FORMAT, "%s: \"%s\" must be a non-negative integer, found %g", path, ints[i].key, v);
        *ints[i].dst = (int)v;
    }
    if ((st = num(o, "fps", path, &v, &f))) return st;
    if (f) {
        if (!(v > 0) || v > 1e4) return mmc_error(MMC_ERR_FORMAT, "%s: \"fps\" must be a positive number, found %g", path, v);
        p->fps = v;
    }
    if ((st = num(o, "max_video_tokens", path, &v, &f))) return st;
    if (f) p->max_video_tokens = (int64_t)v;
    if ((st = num(o, "rescale_factor", path, &v, &f))) return st;
    if (f) q->rescale_factor = v;
    if ((st = num(o, "resample", path, &v, &f))) return st;
    if (f) {
        if ((int)v == 3) q->resample = MMC_RESAMPLE_BICUBIC;
        else if ((int)v == 2) q->resample = MMC_RESAMPLE_BILINEAR;
        else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: resample=%d (only 2 bilinear, 3 bicubic)", path, (int)v);
    }
    if ((st = boolean(o, "do_resize", path, &q->do_resize)) || (st = boolean(o, "do_rescale", path, &q->do_rescale)) ||
        (st = boolean(o, "do_normalize", path, &q->do_normalize)) ||
        (st = boolean(o, "do_sample_frames", path, &p->do_sample_frames)) ||
        (st = boolean(o, "cap_pixels_per_frame", path, &p->cap_pixels_per_frame)))
        return st;
    const char *arr[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, arr[k]);
        if (!a || cJSON_IsNull(a)) continue;
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3)
            return mmc_error(MMC_ERR_FORMAT, "%s: \"%s\" must be a list of 3 numbers", path, arr[k]);
        for (int c = 0; c < 3; c++) {
            const cJSON *x = cJSON_GetArrayItem(a, c);
            if (!cJSON_IsNumber(x)) return mmc_error(MMC_ERR_FORMAT, "%s: \"%s\"[%d] is not a number", path, arr[k], c);
            (k ? q->image_std : q->image_mean)[c] = (float)x->valuedouble;
        }
    }
    if (q->patch_size <= 0 || q->merge_size <= 0 || q->temporal_patch_size <= 0 || q->video_min_pixels <= 0 ||
        q->video_max_pixels < q->video_min_pixels || p->max_frames <= 0 || p->min_frames > p->max_frames)
        return mmc_error(MMC_ERR_INVALID, "%s: invalid video settings (patch %d merge %d temporal %d, pixels [%lld, %lld], "
                         "frames [%d, %d])", path, q->patch_size, q->merge_size, q->temporal_patch_size,
                         (long long)q->video_min_pixels, (long long)q->video_max_pixels, p->min_frames, p->max_frames);
    return MMC_OK;
}

static mmc_status parse(const char *path, cJSON **root) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return mmc_error_prefix(st, "video processor config %s", path);
    *root = mmc_io_json_parse(text, len, path);
    free(text);
    if (!*root) return MMC_ERR_FORMAT;
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return MMC_OK;
}

mmc_status mmc_qwen2vl_video_proc_load(const char *path, mmc_qwen2vl_video_proc *p) {
    cJSON *root = NULL;
    mmc_status st = parse(path, &root);
    if (st) return st;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "video_processor");
    if (o && !cJSON_IsObject(o)) st = mmc_error(MMC_ERR_FORMAT, "%s: \"video_processor\" must be an object", path);
    else st = read_obj(o ? o : root, path, p);
    cJSON_Delete(root);
    return st;
}

mmc_status mmc_qwen2vl_video_proc_load_dir(const char *dir, mmc_qwen2vl_video_proc *p) {
    char path[4200];
    /* 1. processor_config.json, if it nests "video_processor" (transformers >= 5 saves all there) */
    snprintf(path, sizeof path, "%s/processor_config.json", dir);
    if (access(path, R_OK) == 0) {
        cJSON *root = NULL;
        mmc_status st = parse(path, &root);
        if (st) return st;
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "video_processor");
        if (o) {
            st = cJSON_IsObject(o) ? read_obj(o, path, p)
                                   : mmc_error(MMC_ERR_FORMAT, "%s: \"video_processor\" must be an object", path);
            cJSON_Delete(root);
            return st;
        }
        cJSON_Delete(root);
    }
    /* 2. video_preprocessor_config.json, 3. the image processor's preprocessor_config.json */
    const char *files[2] = {"video_preprocessor_config.json", "preprocessor_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (access(path, R_OK) == 0) return mmc_qwen2vl_video_proc_load(path, p);
    }
    return MMC_OK;
}

/* qwen-vl-utils' FRAME_FACTOR and VIDEO_MAX_TOKEN_NUM (the per-frame cap, in tokens) */
#define QVU_FRAME_FACTOR 2
#define QVU_VIDEO_MAX_TOKENS 768

/* qwen-vl-utils' smart_nframes and the index choice of its readers:
 * torch.linspace(0, total - 1, nframes) (float32: step = (end - start) / (steps - 1), the first
 * half counted from the start, the second from the end, as ATen's linspace) .round() (half to
 * even). */
static mmc_status qvu_sample(const mmc_qwen2vl_video_proc *p, int64_t total, double video_fps, int64_t **idx, int *n) {
    const int ff = QVU_FRAME_FACTOR;
    double nf;
    if (p->num_frames > 0) {
        nf = nearbyint((double)p->num_frames / ff) * ff;   /* round_by_factor: Python round */
    } else {
        if (!(video_fps > 0))
            return mmc_error(MMC_ERR_INVALID, "the video has no frame rate (0 fps), needed to sample %g frames per "
                             "second; give a frame count instead (--video-frames N)", p->fps > 0 ? p->fps : 2.0);
        double fps = p->fps > 0 ? p->fps : 2.0;   /* FPS */
        double minf = ceil((double)p->min_frames / ff) * ff;
        double maxf = floor((double)p->max_frames / ff) * ff;
        double x = (double)total / video_fps * fps;
        if (x < minf) x = minf;
        if (x > maxf) x = maxf;
        if (x > (double)total) x = (double)total;
        nf = floor(x / ff) * ff;
    }
    if (!(nf >= ff && nf <= (double)total))
        return mmc_error(MMC_ERR_INVALID, "the video can't be sampled as qwen-vl-utils does: nframes should be in [%d, "
                         "%lld], got %g; %s", ff, (long long)total, nf,
                         nf > (double)total ? "decrease the frame count or fps" : "give it as an image, or a longer clip");
    if (nf > INT32_MAX / 2) return mmc_error(MMC_ERR_INVALID, "video: %g frames to sample is too many", nf);
    int64_t steps = (int64_t)nf;
    int64_t *out = malloc(sizeof(int64_t) * (size_t)steps);
    if (!out) return mmc_error(MMC_ERR_OOM, "video sampling: out of memory");
    float start = 0.0f, end = (float)(total - 1);
    float step = (end - start) / (float)(steps - 1);
    int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; i++) {
        /* as ATen's vectorised linspace computes it: one fused multiply-add per value */
        float x = i < half ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - i - 1), end);
        out[i] = (int64_t)nearbyintf(x);
    }
    *idx = out;
    *n = (int)steps;
    return MMC_OK;
}

/* qwen-vl-utils' smart_resize: its float bounds, max(factor, round) before the bounds, none after. */
static mmc_status qvu_smart_resize(int height, int width, int factor, double min_px, double max_px, int *oh, int *ow) {
    if (height <= 0 || width <= 0)
        return mmc_error(MMC_ERR_INVALID, "smart_resize: bad size %dx%d", width, height);
    double ar = (double)(height > width ? height : width) / (height > width ? width : height);
    if (ar > 200)
        return mmc_error(MMC_ERR_INVALID, "smart_resize: absolute aspect ratio must be smaller than 200, got %g (%dx%d)",
                         ar, width, height);
    double h = fmax(factor, nearbyint((double)height / factor) * factor);
    double w = fmax(factor, nearbyint((double)width / factor) * factor);
    if (h * w > max_px) {
        double beta = sqrt((double)height * width / max_px);
        h = floor((double)height / beta / factor) * factor;
        w = floor((double)width / beta / factor) * factor;
    } else if (h * w < min_px) {
        double beta = sqrt(min_px / ((double)height * width));
        h = ceil(height * beta / factor) * factor;
        w = ceil(width * beta / factor) * factor;
    }
    if (h < factor || w < factor || h > 1e6 || w > 1e6)
        return mmc_error(MMC_ERR_INVALID, "smart_resize: %dx%d within [%g, %g] pixels gives %gx%g", width, height, min_px,
                         max_px, w, h);
    *oh = (int)h;
    *ow = (int)w;
    return MMC_OK;
}

mmc_status mmc_qwen_vl_utils_size(const mmc_qwen2vl_video_proc *p, int height, int width, int n, int *out_h, int *out_w) {
    const mmc_qwen2vl_proc *q = &p->proc;
    int factor = q->patch_size * q->merge_size;
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "qwen-vl-utils size: no frames");
    double min_px = (double)q->video_min_pixels;
    double total_px = (double)((int64_t)p->max_video_tokens * factor * factor) * 0.9;   /* MODEL_SEQ_LEN * f * f * 0.9 */
    double max_px = fmin((double)QVU_VIDEO_MAX_TOKENS * factor * factor, total_px / n * QVU_FRAME_FACTOR);
    max_px = fmax(max_px, (double)(int64_t)(min_px * 1.05));
    max_px = fmin((double)q->video_max_pixels, max_px);   /* the given max_pixels only lowers it */
    return qvu_smart_resize(height, width, factor, min_px, max_px, out_h, out_w);
}

/* torch's antialiased interpolate weights for float32 tensors (UpSampleKernel.cpp,
 * _compute_weights_aa with scalar_t = float): the centre, support and the filter in float, the
 * filter's argument formed in double as the C++ expression promotes it, normalised in float.
 * w: [out][ks]; lo/sz: [out] the window. */
static float aa_filter(float x, mmc_resample f) {
    x = fabsf(x);
    if (f == MMC_RESAMPLE_BILINEAR) return x < 1.0f ? 1.0f - x : 0.0f;
    const float a = -0.5f;   /* bicubic, antialias: Keys' a = -0.5 (as PIL) */
    /* the fused multiply-adds torch's build forms here (its CPU kernels are compiled with FMA), written
     * out so that the result does not depend on this compiler's contraction (-O0 forms none) */
    if (x < 1.0f) return fmaf(fmaf(a + 2, x, -(a + 3)) * x, x, 1.0f);
    if (x < 2.0f) return fmaf(fmaf(fmaf(a, x, -5 * a), x, 8 * a), x, -4 * a);
    return 0.0f;
}

static int aa_weights(int in, int out, mmc_resample f, float **w_out, int **lo_out, int **sz_out) {
    float scale = (float)in / (float)out;
    float support = (float)((f == MMC_RESAMPLE_BILINEAR ? 1.0 : 2.0) * (scale >= 1.0f ? scale : 1.0f));
    int ks = (int)ceil(support) * 2 + 1;
    float *w = calloc((size_t)out * ks, sizeof *w);
    int *lo = malloc(sizeof(int) * (size_t)out), *sz = malloc(sizeof(int) * (size_t)out);
    if (!w || !lo || !sz) { free(w); free(lo); free(sz); return 0; }
    float invscale = (float)(scale >= 1.0f ? 1.0 / scale : 1.0);
    for (int i = 0; i < out; i++) {
        float center = (float)(scale * (i + 0.5));
        int64_t xmin = (int64_t)((double)(center - support) + 0.5), xmax = (int64_t)((double)(center + support) + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        int n = (int)(xmax - xmin);
        if (n > ks) n = ks;
        float total = 0, *wi = w + (size_t)i * ks;
        for (int j = 0; j < n; j++) {
            wi[j] = aa_filter((float)(((double)((float)(j + xmin) - center) + 0.5) * (double)invscale), f);
            total += wi[j];
        }
        if (total != 0)
            for (int j = 0; j < n; j++) wi[j] /= total;
        lo[i] = (int)xmin;
        sz[i] = n;
    }
    *w_out = w;
    *lo_out = lo;
    *sz_out = sz;
    return ks;
}

/* out[i] = x[lo]*w[0] + x[lo+s]*w[1] + ... in float, in torch's order (no fused multiply-add:
 * the sums are formed as separate products and additions). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))   /* gnu11 fuses a*b + c otherwise */
#else
#define NO_FP_CONTRACT   /* clang fuses only within one expression */
#endif
NO_FP_CONTRACT static void aa_pass(const float *src, float *dst, int lines, int in, int out, int64_t line_stride,
                                   int64_t step, int64_t out_line_stride, int64_t out_step, const float *w,
                                   const int *lo, const int *sz, int ks) {
    for (int l = 0; l < lines; l++)
        for (int i = 0; i < out; i++) {
            const float *x = src + l * line_stride + (int64_t)lo[i] * step, *wi = w + (size_t)i * ks;
            float acc = x[0] * wi[0];
            for (int j = 1; j < sz[i]; j++) {
                float t = x[j * step] * wi[j];
                acc = acc + t;
            }
            dst[l * out_line_stride + i * out_step] = acc;
        }
    (void)in;
}

/* fetch_video's resize: torchvision.transforms.functional.resize (the v1 API) on a uint8 tensor
 * resizes in float32 (torch's antialiased interpolate: the width first, then the height, a
 * dimension whose size does not change is left alone) and rounds back (clamp to [0, 255], round
 * half to even); the processor then sees those values as floats. transformers' own path (the v2
 * API) runs torch's uint8 kernel instead, which differs by a few levels. */
static mmc_status qvu_resize(const mmc_image *src, int oh, int ow, mmc_resample f, mmc_image *dst) {
    int H = src->height, W = src->width;
    float *a = malloc(sizeof(float) * 3 * (size_t)H * W), *b = malloc(sizeof(float) * 3 * (size_t)H * ow);
    float *c = malloc(sizeof(float) * 3 * (size_t)oh * ow);
    float *wh = NULL, *wv = NULL;
    int *loh = NULL, *szh = NULL, *lov = NULL, *szv = NULL;
    int ksh = W != ow ? aa_weights(W, ow, f, &wh, &loh, &szh) : 1;
    int ksv = H != oh ? aa_weights(H, oh, f, &wv, &lov, &szv) : 1;
    mmc_status st = a && b && c && ksh && ksv ? MMC_OK : mmc_error(MMC_ERR_OOM, "qwen-vl-utils resize: out of memory");
    if (!st) {
        for (size_t i = 0; i < (size_t)H * W; i++)   /* HWC uint8 -> CHW float */
            for (int ch = 0; ch < 3; ch++) a[(size_t)ch * H * W + i] = src->data[i * 3 + ch];
        const float *cur = a;
        if (W != ow) {   /* rows of every channel: [3 * H] lines of W -> ow */
            aa_pass(a, b, 3 * H, W, ow, W, 1, ow, 1, wh, loh, szh, ksh);
            cur = b;
        }
        if (H != oh)   /* per channel, per column: H -> oh */
            for (int ch = 0; ch < 3; ch++)
                aa_pass(cur + (size_t)ch * H * ow, c + (size_t)ch * oh * ow, ow, H, oh, 1, ow, 1, ow, wv, lov, szv, ksv);
        else
            memcpy(c, cur, sizeof(float) * 3 * (size_t)oh * ow);
        st = mmc_image_alloc(dst, oh, ow);
        for (size_t i = 0; !st && i < (size_t)oh * ow; i++)
            for (int ch = 0; ch < 3; ch++) {
                float x = c[(size_t)ch * oh * ow + i];
                x = x < 0 ? 0 : x > 255 ? 255 : x;
                dst->data[i * 3 + ch] = (uint8_t)nearbyintf(x);
            }
    }
    free(a); free(b); free(c); free(wh); free(wv); free(loh); free(szh); free(lov); free(szv);
    return st;
}

mmc_status mmc_qwen2vl_video_sample(const mmc_qwen2vl_video_proc *p, int64_t total, double video_fps, int64_t **idx,
                                    int *n) {
    *idx = NULL;
    *n = 0;
    if (total <= 0) return mmc_error(MMC_ERR_INVALID, "video has no frames");
    if (p->qwen_vl_utils) return qvu_sample(p, total, video_fps, idx, n);
    int tp = p->proc.temporal_patch_size;
    int64_t num = 0;
    bool sample = p->do_sample_frames && (p->num_frames > 0 || p->fps > 0);
    if (sample && p->num_frames > 0) {
        num = (int64_t)nearbyint((double)p->num_frames / tp) * tp;   /* Python round: half to even */
    } else if (sample) {
        if (!(video_fps > 0))
            return mmc_error(MMC_ERR_INVALID, "the video has no frame rate (0 fps), needed to sample %g frames per "
                             "second; give a frame count instead (--video-frames N)", p->fps);
        double maxf = floor((double)(p->max_frames < total ? p->max_frames : total) / tp) * tp;
        double x = (double)total / video_fps * p->fps;
        if (x < p->min_frames) x = p->min_frames;
        if (x > maxf) x = maxf;
        if (x > (double)total) x = (double)total;
        num = (int64_t)(floor(x / tp) * tp);
    } else {
        num = total;
    }
    if (num > total)
        return mmc_error(MMC_ERR_INVALID, "the video can't be sampled: num_frames=%lld exceeds its %lld frames; "
                         "decrease num_frames or fps", (long long)num, (long long)total);
    if (num <= 0)
        return mmc_error(MMC_ERR_INVALID, "the video's %lld frame%s give no group of temporal_patch_size=%d frames "
                         "to sample; give it as an image, or a longer clip", (long long)total, total == 1 ? "" : "s", tp);
    if (num > INT32_MAX / 2) return mmc_error(MMC_ERR_INVALID, "video: %lld frames to sample is too many", (long long)num);
    /* torch.arange(0, total, total / num).int(): float32 values, size ceil(total / step) */
    double step = (double)total / (double)num;
    int64_t cnt = (int64_t)ceil((double)total / step);
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(cnt > 0 ? cnt : 1));
    if (!out) return mmc_error(MMC_ERR_OOM, "video sampling: out of memory");
    for (int64_t i = 0; i < cnt; i++) out[i] = (int64_t)(float)((double)i * step);
    *idx = out;
    *n = (int)cnt;
    return MMC_OK;
}

/* One row of a patch: the P pixels of RGB bytes at r (3P bytes) into o[c][0..P), each value
 * lut[c][byte]. With AVX-512 VBMI (P <= 16): one masked load, a byte permute per channel, the
 * table read by a gather: the same table entries, so the same floats as the scalar loop. */
#if defined(__AVX512BW__) && defined(__AVX512VBMI__)
#include <immintrin.h>
#define PATCH_SIMD 1
#endif
static inline void patch_row(const uint8_t *r, int P, float *o0, float *o1, float *o2, const float (*lut)[256]) {
#ifdef PATCH_SIMD
    /* byte i of permute c: channel c of pixel i (3i + c), for i < 16 */
    static const uint8_t perm_tab[3][64] __attribute__((aligned(64))) = {
        {0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 42, 45},
        {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 37, 40, 43, 46},
        {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 44, 47}};
    if (P <= 16) {
        const __m512i bytes = _mm512_maskz_loadu_epi8((__mmask64)((1ULL << (3 * P)) - 1), r);
        const __mmask16 m = (__mmask16)((1u << P) - 1);
        float *o[3] = {o0, o1, o2};
        for (int c = 0; c < 3; c++) {
            const __m512i perm = _mm512_load_si512((const void *)perm_tab[c]);
            __m128i b = _mm512_castsi512_si128(_mm512_permutexvar_epi8(perm, bytes));
            __m512i idx = _mm512_cvtepu8_epi32(b);
            __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, lut[c], 4);
            _mm512_mask_storeu_ps(o[c], m, v);
        }
        return;
    }
#endif
    for (int px = 0; px < P; px++) {
        o0[px] = lut[0][r[3 * px]];
        o1[px] = lut[1][r[3 * px + 1]];
        o2[px] = lut[2][r[3 * px + 2]];
    }
}

/* Patchify temporal group t straight from its uint8 frames f[tp] (after resize): rows
 * (t, h/(P*m), w/(P*m), m, m) for block rows [bh0, bh1), columns (C, tp, P, P), each value
 * lut[c][byte]. */
static void patchify_group(const uint8_t *const *f, int64_t t, int64_t bh0, int64_t bh1, int oh, int ow, int P, int m,
                           int tp, const float (*lut)[256], float *dst) {
    const int64_t bh_n = oh / P / m, bw_n = ow / P / m, D = 3LL * tp * P * P, PP = (int64_t)P * P;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        int64_t row = (t * bh_n + bh) * bw_n * m * m;
        for (int64_t bw = 0; bw < bw_n; bw++)
            for (int mh = 0; mh < m; mh++)
                for (int mw = 0; mw < m; mw++, row++) {
                    float *o = dst + row * D;
                    int64_t y0 = (bh * m + mh) * P, x0 = (bw * m + mw) * P;
                    for (int tt = 0; tt < tp; tt++) {
                        const uint8_t *q = f[tt] + (y0 * ow + x0) * 3;
                        float *o0 = o + tt * PP, *o1 = o + (tp + tt) * PP, *o2 = o + (2 * tp + tt) * PP;
                        for (int py = 0; py < P; py++, q += (size_t)ow * 3)
                            patch_row(q, P, o0 + py * P, o1 + py * P, o2 + py * P, lut);
                    }
                }
    }
}

/* The size n frames of HxW are resized to (smart_resize within the video bounds, the share of
 * the total budget, or qwen-vl-utils' size), and the output's bound. */
static mmc_status video_geometry(const mmc_qwen2vl_video_proc *vp, int H, int W, int n, int *out_h, int *out_w) {
    const mmc_qwen2vl_proc *p = &vp->proc;
    int P = p->patch_size, m = p->merge_size, tp = p->temporal_patch_size, factor = P * m;
    int oh = H, ow = W;
    mmc_status st;
    if (vp->qwen_vl_utils) {   /* fetch_video resizes whatever the processor's do_resize says */
        if ((st = mmc_qwen_vl_utils_size(vp, H, W, n, &oh, &ow))) return st;
    } else if (p->do_resize) {
        int64_t max_px = p->video_max_pixels;
        if (vp->cap_pixels_per_frame) {   /* an even share of qwen-vl-utils' total budget */
            int64_t total_px = (int64_t)((double)vp->max_video_tokens * factor * factor * 0.9);
            int64_t share = total_px * tp / n, floor_px = (int64_t)((double)p->video_min_pixels * 1.05);
            max_px = max_px < share ? max_px : share;
            if (max_px < floor_px) max_px = floor_px;
        }
        if ((st = mmc_qwen2vl_smart_resize(H, W, factor, p->video_min_pixels, max_px, &oh, &ow))) return st;
    } else if (H % factor || W % factor) {
        return mmc_error(MMC_ERR_SHAPE, "qwen2vl video: do_resize=false but %dx%d is not a multiple of %d", W, H, factor);
    }
    int T = (n + tp - 1) / tp * tp;
    if ((double)3 * oh * ow * T * sizeof(float) > 16.0 * (1LL << 30))
        return mmc_error(MMC_ERR_INVALID, "qwen2vl video: %d frames at %dx%d need more than 16 GiB; sample fewer frames "
                         "(--video-fps, --video-max-frames) or lower max_pixels", n, ow, oh);
    *out_h = oh;
    *out_w = ow;
    return MMC_OK;
}

/* pixel_values [rows, dim] uninitialised: every element is written by the patchify that
 * follows (no zeroing pass: mmc_tensor_new's memset is one thread over hundreds of MB); its
 * pages are first touched by the patchify threads. NULL when out of memory. */
static mmc_tensor *rows_alloc(int64_t rows, int64_t dim) {
    mmc_tensor *t = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(rows, dim), NULL);
    if (!t) return NULL;
    if (!(t->data = aligned_alloc(64, (mmc_nbytes(t) + 63) / 64 * 64))) { mmc_tensor_free(t); return NULL; }
    t->flags |= MMC_OWNS_DATA;
    return t;
}

/* Map the pages of group t's rows of pixel_values in one call (MADV_POPULATE_WRITE, Linux
 * 5.14+; elsewhere a no-op) before the patchify writes them: a fresh buffer of hundreds of MB
 * otherwise takes one page fault per 4 KiB (85k per 720p clip at 2 fps), each dearer than the
 * mapping done in a batch. The values written are the same either way. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static void populate_group(float *dst, int64_t t, int oh, int ow, const mmc_qwen2vl_proc *p) {
    int64_t rows = (int64_t)(oh / p->patch_size) * (ow / p->patch_size);
    int64_t D = 3LL * p->temporal_patch_size * p->patch_size * p->patch_size;
    uintptr_t a = (uintptr_t)(dst + t * rows * D), b = (uintptr_t)(dst + (t + 1) * rows * D);
    a = (a + 4095) & ~(uintptr_t)4095;   /* whole pages inside the group's rows only */
    b &= ~(uintptr_t)4095;
    if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
}

/* The columns of temporal slot tt (of tp) of group t from one uint8 frame f (after resize):
 * the same values patchify_group writes there. */
static void patchify_slot(const uint8_t *f, int64_t t, int tt, int oh, int ow, int P, int m, int tp,
                          const float (*lut)[256], float *dst) {
    const int64_t bh_n = oh / P / m, bw_n = ow / P / m, D = 3LL * tp * P * P, PP = (int64_t)P * P;
    int64_t row = t * bh_n * bw_n * m * m;
    for (int64_t bh = 0; bh < bh_n; bh++)
        for (int64_t bw = 0; bw < bw_n; bw++)
            for (int mh = 0; mh < m; mh++)
                for (int mw = 0; mw < m; mw++, row++) {
                    int64_t y0 = (bh * m + mh) * P, x0 = (bw * m + mw) * P;
                    float *o = dst + row * D;
                    float *o0 = o + tt * PP, *o1 = o + (tp + tt) * PP, *o2 = o + (2 * tp + tt) * PP;
                    const uint8_t *q = f + (y0 * ow + x0) * 3;
                    for (int py = 0; py < P; py++, q += (size_t)ow * 3)
                        patch_row(q, P, o0 + py * P, o1 + py * P, o2 + py * P, lut);
                }
}

mmc_status mmc_qwen2vl_video_preprocess(const mmc_qwen2vl_video_proc *vp, const mmc_image *frames, int n,
                                        mmc_vlproc_out *out) {
    const mmc_qwen2vl_proc *p = &vp->proc;
    memset(out, 0, sizeof *out);
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "qwen2vl video: no frames");
    int H = frames[0].height, W = frames[0].width;
    for (int i = 0; i < n; i++)
        if (!frames[i].data || frames[i].height != H || frames[i].width != W)
            return mmc_error(MMC_ERR_SHAPE, "qwen2vl video: frame %d is %dx%d, frame 0 is %dx%d", i, frames[i].width,
                             frames[i].height, W, H);
    int P = p->patch_size, m = p->merge_size, tp = p->temporal_patch_size;
    int oh = H, ow = W;
    mmc_status st;
    if ((st = video_geometry(vp, H, W, n, &oh, &ow))) return st;
    int T = (n + tp - 1) / tp * tp;
    int64_t gt = T / tp, gh = oh / P, gw = ow / P;
    float lut[3][256];   /* the torchvision backend's rescale + normalise: videos have no PIL path */
    mmc_qwen2vl_pixel_lut(p, MMC_VLPROC_RESIZE_TORCH, lut);
    bool resize = oh != H || ow != W;
#ifdef _OPENMP
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    int threads = 1;
#endif
    /* enough temporal groups to go round the threads: each resizes a group's frames into buffers
     * of its own and patchifies them at once (no frame-sized intermediates for the whole clip) */
    bool fused = resize && tp <= 16 && gt >= 2 * threads;
    mmc_image *rs = resize && !fused ? calloc((size_t)n, sizeof *rs) : NULL;
    const uint8_t **fp = malloc(sizeof *fp * (size_t)T);   /* [T] frames after resize; padding repeats the last */
    out->pixel_values = rows_alloc(gt * gh * gw, 3LL * tp * P * P);
    if ((resize && !fused && !rs) || !fp || !out->pixel_values) {
        st = mmc_error(MMC_ERR_OOM, "qwen2vl video: out of memory");
        goto fail;
    }
    st = MMC_OK;
    if (fused) {
        mmc_status fst = MMC_OK;
#pragma omp parallel for schedule(dynamic)
        for (int64_t t = 0; t < gt; t++) {
            mmc_image loc[16] = {{0}};
            const uint8_t *f[16];
            mmc_status e = MMC_OK;
            for (int tt = 0; tt < tp && !e; tt++) {
                int i = (int)(t * tp + tt) < n ? (int)(t * tp + tt) : n - 1;   /* padding repeats the last */
                e = vp->qwen_vl_utils ? qvu_resize(&frames[i], oh, ow, p->resample, &loc[tt])
                                      : mmc_image_resize_torch_u8(&frames[i], oh, ow, p->resample, &loc[tt]);
                f[tt] = loc[tt].data;
            }
            if (!e) {
                populate_group(out->pixel_values->data, t, oh, ow, p);
                patchify_group(f, t, 0, gh / m, oh, ow, P, m, tp, (const float(*)[256])lut, out->pixel_values->data);
            }
            for (int tt = 0; tt < tp; tt++) mmc_image_free(&loc[tt]);
            if (e) {
#pragma omp critical
                fst = e;
            }
        }
        if ((st = fst)) goto fail;
        goto grid;
    }
    if (resize) {   /* torchvision resizes uint8 frames with torch's uint8 kernels; one frame per thread */
        mmc_status fst = MMC_OK;
#pragma omp parallel for schedule(dynamic) if (n > 1 && (int64_t)oh * ow > 16384)
        for (int i = 0; i < n; i++) {
            mmc_status e = vp->qwen_vl_utils ? qvu_resize(&frames[i], oh, ow, p->resample, &rs[i])
                                             : mmc_image_resize_torch_u8(&frames[i], oh, ow, p->resample, &rs[i]);
            if (e) {
#pragma omp critical
                fst = e;
            }
        }
        if ((st = fst)) goto fail;
    }
    for (int i = 0; i < T; i++) fp[i] = resize ? rs[i < n ? i : n - 1].data : frames[i < n ? i : n - 1].data;
    const int64_t bh_n = gh / m;
#pragma omp parallel for collapse(2) schedule(static) if (gt * gh * gw * 3LL * tp * P * P > (1 << 18))
    for (int64_t t = 0; t < gt; t++)
        for (int64_t bh = 0; bh < bh_n; bh++)
            patchify_group(fp + t * tp, t, bh, bh + 1, oh, ow, P, m, tp, (const float(*)[256])lut, out->pixel_values->data);
grid:
    if (!(out->grid_thw = malloc(sizeof *out->grid_thw))) { st = mmc_error(MMC_ERR_OOM, "qwen2vl video: out of memory"); goto fail; }
    out->grid_thw[0][0] = gt;
    out->grid_thw[0][1] = gh;
    out->grid_thw[0][2] = gw;
    out->n_grid = 1;
    out->num_tokens = gt * gh * gw / ((int64_t)m * m);
fail:
    for (int i = 0; rs && i < n; i++) mmc_image_free(&rs[i]);
    free(rs);
    free(fp);
    if (st) mmc_vlproc_out_free(out);
    return st;
}

void mmc_video_clip_free(mmc_video_clip *c) {
    if (!c) return;
    for (int i = 0; c->frames && i < c->n; i++) mmc_image_free(&c->frames[i]);
    free(c->frames);
    free(c->indices);
    memset(c, 0, sizeof *c);
}

mmc_status mmc_qwen2vl_video_load(const mmc_qwen2vl_video_proc *p, const char *path, mmc_video_clip *out) {
    memset(out, 0, sizeof *out);
    mmc_video *v = NULL;
    mmc_status st = mmc_video_open(path, &v);
    if (st) return st;
    out->info = *mmc_video_get_info(v);
    if ((st = mmc_qwen2vl_video_sample(p, out->info.total_frames, out->info.fps, &out->indices, &out->n))) {
        mmc_error_prefix(st, "video %s", path);
        goto fail;
    }
    if (!(out->frames = calloc((size_t)out->n, sizeof *out->frames))) { st = mmc_error(MMC_ERR_OOM, "video: out of memory"); goto fail; }
    if ((st = mmc_video_read(v, out->indices, out->n, out->frames))) goto fail;
    /* VideoMetadata.sampled_fps: len(indices) / total * fps (24 when the rate is unknown) */
    double fps = out->info.fps > 0 ? (double)out->n / (double)out->info.total_frames * out->info.fps : 24.0;
    out->second_per_grid_ts = p->proc.temporal_patch_size / fps;
    out->frames_decoded = mmc_video_frames_decoded(v);
    mmc_video_close(v);
    return MMC_OK;
fail:
    mmc_video_close(v);
    free(out->frames);
    out->frames = NULL;
    out->n = 0;
    mmc_video_clip_free(out);
    return st;
}

/* mmc_qwen2vl_video_load_preprocess: each frame, on the thread that decoded it, resized and
 * kept until the other frames of its temporal group have come to the same worker (frames of a
 * keyframe segment come to one worker, in order), then the group's rows are written whole, as
 * mmc_qwen2vl_video_preprocess writes them. A group split between workers is written slot by
 * slot (its columns of each row) when a worker moves on, or at the end. */
#define FUSE_MAX_TP 16
typedef struct {
    int64_t group;                /* the group whose frames are held; -1: none */
    mmc_image img[FUSE_MAX_TP];   /* [tp] its frames after resize (buffers kept from group to group) */
    bool full[FUSE_MAX_TP];       /* img[tt] holds slot tt's frame */
    mmc_resize_scratch scratch;   /* the resize's intermediate rows, kept */
} fuse_worker;

typedef struct {
    const mmc_qwen2vl_video_proc *vp;
    int n, oh, ow;
    bool resize;
    float lut[3][256];
    float *dst;
    fuse_worker *w;               /* [mmc_video_read_workers()] */
} fuse_ctx;

/* Write what worker w holds slot by slot (the last frame into the padding slots too), drop it. */
static void fuse_flush(fuse_ctx *c, fuse_worker *w) {
    const mmc_qwen2vl_proc *p = &c->vp->proc;
    int tp = p->temporal_patch_size;
    if (w->group >= 0) populate_group(c->dst, w->group, c->oh, c->ow, p);   /* cheap where the other worker did */
    for (int tt = 0; w->group >= 0 && tt < tp; tt++) {
        int64_t k = w->group * tp + tt;
        if (!w->full[tt]) continue;
        int last_tt = k == c->n - 1 ? tp - 1 : tt;
        for (int t2 = tt; t2 <= last_tt; t2++)
            patchify_slot(w->img[tt].data, w->group, t2, c->oh, c->ow, p->patch_size, p->merge_size, tp,
                          (const float(*)[256])c->lut, c->dst);
        w->full[tt] = false;
    }
    w->group = -1;
}

static mmc_status fuse_frame(void *ctx_, int worker, int k, const mmc_image *rgb) {
    fuse_ctx *c = ctx_;
    fuse_worker *w = &c->w[worker];
    const mmc_qwen2vl_proc *p = &c->vp->proc;
    int tp = p->temporal_patch_size;
    int64_t g = k / tp;
    if (w->group >= 0 && w->group != g) fuse_flush(c, w);
    mmc_image *r = &w->img[k % tp];
    mmc_status st = MMC_OK;
    if (c->resize && c->vp->qwen_vl_utils) {
        mmc_image_free(r);
        st = qvu_resize(rgb, c->oh, c->ow, p->resample, r);
    } else if (c->resize) {
        st = mmc_image_resize_torch_u8_reuse(rgb, c->oh, c->ow, p->resample, r, &w->scratch);
    } else {   /* rgb is the reader's buffer, reused for its next frame */
        if (!r->data) st = mmc_image_alloc(r, rgb->height, rgb->width);
        if (!st) memcpy(r->data, rgb->data, (size_t)rgb->height * rgb->width * 3);
    }
    if (st) return st;
    w->full[k % tp] = true;
    w->group = g;
    /* complete: every frame of the group that exists (the padding repeats the last) */
    int have = (int)((int64_t)c->n - g * tp < tp ? (int64_t)c->n - g * tp : tp);
    for (int tt = 0; tt < have; tt++)
        if (!w->full[tt]) return MMC_OK;
    const uint8_t *f[FUSE_MAX_TP] = {0};
    for (int tt = 0; tt < tp; tt++) f[tt] = w->img[tt < have ? tt : have - 1].data;
    populate_group(c->dst, g, c->oh, c->ow, p);
    patchify_group(f, g, 0, c->oh / p->patch_size / p->merge_size, c->oh, c->ow, p->patch_size, p->merge_size, tp,
                   (const float(*)[256])c->lut, c->dst);
    for (int tt = 0; tt < tp; tt++) w->full[tt] = false;
    w->group = -1;
    return MMC_OK;
}

mmc_status mmc_qwen2vl_video_load_preprocess(const mmc_qwen2vl_video_proc *vp, const char *path, mmc_video_clip *clip,
                                             mmc_vlproc_out *out) {
    memset(clip, 0, sizeof *clip);
    memset(out, 0, sizeof *out);
    const mmc_qwen2vl_proc *p = &vp->proc;
    mmc_video *v = NULL;
    mmc_status st = mmc_video_open(path, &v);
    if (st) return st;
    clip->info = *mmc_video_get_info(v);
    if ((st = mmc_qwen2vl_video_sample(vp, clip->info.total_frames, clip->info.fps, &clip->indices, &clip->n))) {
        mmc_error_prefix(st, "video %s", path);
        goto fail;
    }
    int n = clip->n, H = clip->info.height, W = clip->info.width, P = p->patch_size, tp = p->temporal_patch_size;
    fuse_ctx c = {.vp = vp, .n = n};
    int nw = mmc_video_read_workers();
    if (tp > FUSE_MAX_TP) {   /* never in a published config: the frames kept, then preprocessed */
        mmc_video_close(v);
        mmc_video_clip_free(clip);
        if ((st = mmc_qwen2vl_video_load(vp, path, clip))) return st;
        st = mmc_qwen2vl_video_preprocess(vp, clip->frames, clip->n, out);
        for (int i = 0; i < clip->n; i++) mmc_image_free(&clip->frames[i]);
        free(clip->frames);
        clip->frames = NULL;
        if (st) mmc_video_clip_free(clip);
        return st;
    }
    if ((st = video_geometry(vp, H, W, n, &c.oh, &c.ow))) goto fail;
    c.resize = c.oh != H || c.ow != W;
    mmc_qwen2vl_pixel_lut(p, MMC_VLPROC_RESIZE_TORCH, c.lut);
    int64_t gt = (n + tp - 1) / tp, gh = c.oh / P, gw = c.ow / P;
    if (!(out->pixel_values = rows_alloc(gt * gh * gw, 3LL * tp * P * P)) || !(out->grid_thw = malloc(sizeof *out->grid_thw))) {
        st = mmc_error(MMC_ERR_OOM, "qwen2vl video: out of memory");
        goto fail;
    }
    c.dst = out->pixel_values->data;
    if (!(c.w = calloc((size_t)nw, sizeof *c.w))) { st = mmc_error(MMC_ERR_OOM, "qwen2vl video: out of memory"); goto fail; }
    for (int i = 0; i < nw; i++) c.w[i].group = -1;
    st = mmc_video_read_each(v, clip->indices, n, fuse_frame, &c);
    for (int i = 0; i < nw; i++) {   /* groups split between workers: their slots written now */
        if (!st) fuse_flush(&c, &c.w[i]);
        for (int tt = 0; tt < FUSE_MAX_TP; tt++) mmc_image_free(&c.w[i].img[tt]);
        mmc_resize_scratch_free(&c.w[i].scratch);
    }
    free(c.w);
    if (st) goto fail;
    out->grid_thw[0][0] = gt;
    out->grid_thw[0][1] = gh;
    out->grid_thw[0][2] = gw;
    out->n_grid = 1;
    out->num_tokens = gt * gh * gw / ((int64_t)p->merge_size * p->merge_size);
    double fps = clip->info.fps > 0 ? (double)n / (double)clip->info.total_frames * clip->info.fps : 24.0;
    clip->second_per_grid_ts = tp / fps;
    clip->frames_decoded = mmc_video_frames_decoded(v);
    mmc_video_close(v);
    return MMC_OK;
fail:
    mmc_video_close(v);
    mmc_vlproc_out_free(out);
    mmc_video_clip_free(clip);
    return st;
}
