/* mmc_vlproc.h — vision preprocessing for VLMs: the Qwen2-VL image/video processor.
 *
 * Mirrors transformers' Qwen2VLImageProcessor (PIL backend, use_fast=False):
 * smart_resize to multiples of patch_size*merge_size within [min_pixels, max_pixels],
 * PIL bicubic resize, rescale by 1/255 (in double, then float32), normalise with the
 * OpenAI CLIP mean/std in float32, and patch flattening into
 *   pixel_values [num_patches, C * temporal_patch_size * patch_size * patch_size]
 * ordered (t, h/merge, w/merge, merge_h, merge_w) by rows and (C, T, ph, pw) by columns,
 * with grid_thw = (t, h/patch, w/patch). A single image is repeated along time.
 * Videos (Qwen2VLVideoProcessor): frames share one resize; frames are grouped by
 * temporal_patch_size and an odd count is padded by repeating the last frame.
 * Image tokens after the merger: t*h*w / merge_size^2.
 */
#ifndef MMC_VLPROC_H
#define MMC_VLPROC_H

#include "mmc_image.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MMC_VLPROC_RESIZE_PIL = 0,   /* uint8 Pillow-exact resize (slow HF processor) */
    MMC_VLPROC_RESIZE_FLOAT = 1, /* float antialiased resize, torchvision-style (approximate) */
    MMC_VLPROC_RESIZE_TORCH = 2, /* transformers 5.x's default (torchvision) image processor, exactly:
                                  * torch's uint8 antialiased resize (mmc_image_resize_torch_u8) and
                                  * TorchvisionBackend.rescale_and_normalize (mean, std scaled by
                                  * 1/rescale_factor), as the video processor does */
} mmc_vlproc_resize_mode;

typedef struct {
    int patch_size;          /* 14 */
    int merge_size;          /* 2 */
    int temporal_patch_size; /* 2 */
    int64_t min_pixels;      /* images: 56*56 */
    int64_t max_pixels;      /* images: 28*28*1280 */
    int64_t video_min_pixels; /* videos: 128*28*28 (Qwen2VLVideoProcessor) */
    int64_t video_max_pixels; /* videos: 28*28*768 */
    float image_mean[3], image_std[3];
    double rescale_factor;   /* 1/255 */
    bool do_resize, do_rescale, do_normalize;
    mmc_resample resample;   /* BICUBIC (PIL resample=3) */
    mmc_vlproc_resize_mode resize_mode;
} mmc_qwen2vl_proc;

void mmc_qwen2vl_proc_default(mmc_qwen2vl_proc *p);
/* The one reader of image-processor configs (generate / chat / forward / eval / train all go
 * through it). Fields read over *p: size as {shortest_edge, longest_edge} or {min_pixels,
 * max_pixels} (given, it replaces the default size whole, as in transformers), then the legacy
 * top-level min_pixels / max_pixels; patch, merge and temporal sizes, image_mean / image_std,
 * rescale_factor, do_resize / do_rescale / do_normalize, resample. A malformed file (bad JSON,
 * a key of the wrong type, a size without both edges, max below min) is an error naming the
 * file and key; *p is left unchanged on error.
 *
 * mmc_qwen2vl_proc_load_dir: the image processor of a model directory, found as transformers'
 * AutoImageProcessor finds it: processor_config.json's "image_processor" object (what
 * transformers 5.x processor.save_pretrained writes), else preprocessor_config.json (the Hub's
 * 4.x layout, mmc's checkpoints). used (may be NULL) receives the file read, or "" when the
 * directory has neither (then *p keeps its values: the caller's defaults). A file that exists
 * but cannot be read is an error, never a silent default.
 * mmc_qwen2vl_proc_load: one file (its "image_processor" object if it has one, else the whole
 * object), or a directory as above that must hold one. */
mmc_status mmc_qwen2vl_proc_load_dir(const char *dir, mmc_qwen2vl_proc *p, char *used, size_t cap);
mmc_status mmc_qwen2vl_proc_load(const char *path, mmc_qwen2vl_proc *p);

/* transformers' smart_resize (Python round() is half-to-even; so is ours). */
mmc_status mmc_qwen2vl_smart_resize(int height, int width, int factor, int64_t min_pixels,
                                    int64_t max_pixels, int *out_h, int *out_w);

typedef struct {
    mmc_tensor *pixel_values; /* [num_patches, C*T*P*P] f32, persistent (mmc_tensor_free) */
    int64_t (*grid_thw)[3];   /* [n_grid][3] */
    int n_grid;
    int64_t num_tokens;       /* sum of t*h*w / merge^2 */
} mmc_vlproc_out;
void mmc_vlproc_out_free(mmc_vlproc_out *o);

/* Images of any sizes -> concatenated patches and one grid row per image. */
mmc_status mmc_qwen2vl_preprocess_images(const mmc_qwen2vl_proc *p, const mmc_image *imgs, int n,
                                         mmc_vlproc_out *out);
/* One video given as frames of equal size. */
mmc_status mmc_qwen2vl_preprocess_video(const mmc_qwen2vl_proc *p, const mmc_image *frames,
                                        int n_frames, mmc_vlproc_out *out);
/* Load every JPEG/PNG in `dir` sorted by file name (byte order). Caller frees each image
 * and the array. */
mmc_status mmc_load_frames_dir(const char *dir, const mmc_image_opts *opts, mmc_image **frames,
                               int *n_frames);

/* ---------------------------------------------------------------- CLIPImageProcessor
 * transformers' CLIPImageProcessor (LLaVA-1.5's image processor). The PIL backend
 * (CLIPImageProcessorPil, backend="pil", 4.x's use_fast=False), mmc's default: resize so that
 * the shortest edge is size.shortest_edge (the long edge int(shortest * long / short)) with
 * Pillow's bicubic on uint8, center crop crop_size (top = (h - ch) // 2), rescale (u * 1/255 in
 * double, then float32), normalise in float32 with the OpenAI CLIP mean / std.
 * resize_mode MMC_VLPROC_RESIZE_TORCH: transformers 5's default (torchvision) CLIPImageProcessor:
 * torch's uint8 antialiased resize and its fused rescale_and_normalize. */
typedef struct {
    int64_t shortest_edge;        /* size.shortest_edge; 0 when size gives height / width */
    int64_t size_h, size_w;       /* size.height / size.width (a fixed resize) */
    int64_t crop_h, crop_w;       /* crop_size */
    float image_mean[3], image_std[3];
    double rescale_factor;        /* 1/255 */
    bool do_resize, do_center_crop, do_rescale, do_normalize, do_convert_rgb;
    mmc_resample resample;        /* BICUBIC (3) */
    mmc_vlproc_resize_mode resize_mode;
} mmc_clip_proc;

/* CLIPImageProcessor's class defaults (shortest_edge 224, crop 224 x 224). */
void mmc_clip_proc_default(mmc_clip_proc *p);
/* The image processor of a model directory (processor_config.json's "image_processor", else
 * preprocessor_config.json) over *p; used (may be NULL) receives the file read or "". Errors
 * name the file and key; *p is unchanged on error. */
mmc_status mmc_clip_proc_load_dir(const char *dir, mmc_clip_proc *p, char *used, size_t cap);
/* Images of any sizes -> pixel_values [n, 3, crop_h, crop_w] f32, persistent (mmc_tensor_free). */
mmc_status mmc_clip_preprocess(const mmc_clip_proc *p, const mmc_image *imgs, int n, mmc_tensor **pixel_values);

#ifdef __cplusplus
}
#endif
#endif /* MMC_VLPROC_H */
