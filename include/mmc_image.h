/* mmc_image.h — image decoding (JPEG via libjpeg-turbo, PNG via libpng) into 8-bit RGB,
 * and resampling that is bit-exact with Pillow's Image.resize (BICUBIC, BILINEAR).
 *
 * The loader mirrors what transformers.image_utils.load_image does with a path:
 *   PIL.Image.open -> PIL.ImageOps.exif_transpose -> .convert("RGB").
 * So EXIF orientation IS applied (JPEG APP1 Exif and PNG eXIf) and alpha is dropped the
 * way PIL's convert("RGB") drops it. When a PIL image with alpha is handed straight to an
 * HF image processor instead, transformers composites it onto white first
 * (image_transforms.convert_to_rgb); MMC_ALPHA_WHITE reproduces that, bit-exactly
 * (PIL's alpha_composite integer arithmetic).
 *
 * Pixel-level conversions follow Pillow: CMYK JPEGs are read as Adobe-inverted CMYK and
 * converted with PIL's cmyk2rgb; 16-bit PNG RGB/RGBA/GA keep the high byte; 16-bit grey
 * (PIL mode I;16) is clipped to 255, as PIL's I;16 -> RGB conversion does.
 * Errors (missing file, unknown format, corrupt or truncated data, too many pixels) return
 * an mmc_status with a message naming the file; nothing in here calls exit().
 */
#ifndef MMC_IMAGE_H
#define MMC_IMAGE_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint8_t *data; /* [H, W, 3] interleaved RGB, row-major; owned (mmc_image_free) */
    int height, width;
} mmc_image;

typedef enum {
    MMC_ALPHA_DROP = 0,  /* PIL convert("RGB"): alpha / tRNS ignored (load_image) */
    MMC_ALPHA_WHITE = 1, /* transformers convert_to_rgb: alpha-composite onto white */
} mmc_alpha_mode;

/* Default pixel limit: Pillow's decompression-bomb error threshold, 2 x Image.MAX_IMAGE_PIXELS
 * (89,478,485, where PIL only warns); past it PIL raises DecompressionBombError, so an
 * image HF can open, mmc can too. Checked against the header's size before any image-sized
 * allocation. Raise it per run with data.max_image_pixels (YAML) or --max-image-pixels (CLI). */
#define MMC_IMAGE_MAX_PIXELS_DEFAULT ((int64_t)178956970)

typedef struct {
    int64_t max_pixels;   /* refuse images with more pixels (0: MMC_IMAGE_MAX_PIXELS_DEFAULT) */
    bool exif_transpose;  /* apply the EXIF orientation tag (default true, like load_image) */
    mmc_alpha_mode alpha; /* default MMC_ALPHA_DROP */
} mmc_image_opts;

void mmc_image_opts_default(mmc_image_opts *o);

/* Decode a JPEG or PNG (detected by magic bytes, not by extension). opts may be NULL. */
mmc_status mmc_image_load(const char *path, const mmc_image_opts *opts, mmc_image *out);
/* Same from a buffer; `name` is used in error messages (may be NULL). */
mmc_status mmc_image_load_memory(const void *buf, size_t n, const char *name,
                                 const mmc_image_opts *opts, mmc_image *out);
mmc_status mmc_image_alloc(mmc_image *img, int height, int width); /* uninitialised */
void mmc_image_free(mmc_image *img);
/* Write 8-bit RGB [H, W, 3] as a PNG, atomically, with n_text tEXt chunks (keys 1-79 chars). */
mmc_status mmc_image_write_png(const char *path, const uint8_t *rgb, int height, int width, int n_text,
                               const char *const *keys, const char *const *values);

/* ---------------------------------------------------------------- resampling */
/* Pillow's filters (lanczos: what diffusers' VaeImageProcessor resizes with) */
typedef enum { MMC_RESAMPLE_BILINEAR = 0, MMC_RESAMPLE_BICUBIC = 1, MMC_RESAMPLE_LANCZOS = 2 } mmc_resample;

/* Pillow's Image.resize((out_w, out_h), resample) on an RGB image, bit-exact: separable
 * convolution (horizontal then vertical), support scaled by the downscale factor,
 * 22-bit fixed-point coefficients and uint8 clamping between the passes. */
mmc_status mmc_image_resize(const mmc_image *src, int out_h, int out_w, mmc_resample f,
                            mmc_image *dst);
/* torch's uint8 antialiased interpolate (what torchvision's resize runs on uint8 tensors,
 * e.g. video frames in transformers' video processors): Pillow's algorithm with the
 * fixed-point precision chosen per axis so the largest weight fits in int16 (Pillow-SIMD's
 * rule), bit-exact. */
mmc_status mmc_image_resize_torch_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f,
                                     mmc_image *dst);
/* torchvision-style resize of a float image (F.interpolate(mode, antialias=True,
 * align_corners=False)): same separable kernels computed in float, no intermediate
 * rounding. src [C, H, W] -> dst [C, out_h, out_w]. */
mmc_status mmc_resize_f32(const float *src, int C, int H, int W, float *dst, int out_h,
                          int out_w, mmc_resample f);

#ifdef __cplusplus
}
#endif
#endif /* MMC_IMAGE_H */
