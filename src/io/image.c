/* image.c — JPEG (libjpeg-turbo) and PNG (libpng) decoding into 8-bit RGB, mirroring
 * transformers.image_utils.load_image: PIL.Image.open + ImageOps.exif_transpose +
 * convert("RGB"). Decoder settings are libjpeg's defaults, which are what Pillow uses
 * (ISLOW DCT, fancy upsampling, no draft scaling), so decoded bytes equal PIL's.
 * libjpeg/libpng errors longjmp back to us (never exit()); every failure returns an
 * mmc_status naming the file. See include/mmc_image.h for the conversion rules.
 */
#include "mmc_image.h"
#include "mmc_io.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include "io_internal.h"
#include <jerror.h>
#include <omp.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

void mmc_image_opts_default(mmc_image_opts *o) {
    o->max_pixels = MMC_IMAGE_MAX_PIXELS_DEFAULT;
    o->exif_transpose = true;
    o->alpha = MMC_ALPHA_DROP;
}

mmc_status mmc_image_alloc(mmc_image *img, int height, int width) {
    img->height = height;
    img->width = width;
    img->data = mmc_io_big_alloc((size_t)height * (size_t)width * 3 + 1);
    if (!img->data) return mmc_error(MMC_ERR_OOM, "image: cannot allocate %dx%d RGB", width, height);
    return MMC_OK;
}

void mmc_image_free(mmc_image *img) {
    if (!img) return;
    free(img->data);
    img->data = NULL;
    img->height = img->width = 0;
}

/* The size the header claims against the pixel limit, before anything image-sized is
 * allocated: a few hundred bytes of PNG or JPEG can claim 2^31 pixels. */
static mmc_status check_size(const char *name, int64_t w, int64_t h, int64_t limit) {
    if (w <= 0 || h <= 0)
        return mmc_error(MMC_ERR_FORMAT, "%s: invalid image size %lldx%lld", name, (long long)w, (long long)h);
    if (w > limit / h) /* w * h > limit, without overflowing: PNG sides go up to 2^31 */
        return mmc_error(MMC_ERR_INVALID, "%s: image is %lldx%lld = %.0f pixels, over the limit of %lld pixels "
                         "(a decompression bomb?); if the image is genuine, raise data.max_image_pixels in the run "
                         "config or --max-image-pixels on the command line",
                         name, (long long)w, (long long)h, (double)w * (double)h, (long long)limit);
    return MMC_OK;
}

/* PIL alpha_composite of (r, a) over opaque white, PRECISION_BITS = 7 integer path. */
static inline uint8_t over_white(unsigned v, unsigned a) {
    if (a == 0) return 255;
    unsigned coef1 = a * 128u, coef2 = 255u * 128u - coef1; /* outa255 == 255*255 */
    unsigned t = v * coef1 + 255u * coef2 + (0x80u << 7);
    return (uint8_t)((((t >> 8) + t) >> 8) >> 7);
}

/* ---------------------------------------------------------------- EXIF orientation */
static unsigned rd16(const uint8_t *p, int le) { return le ? p[0] | p[1] << 8 : p[0] << 8 | p[1]; }
static uint32_t rd32(const uint8_t *p, int le) {
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
/* Orientation (tag 0x0112) from a TIFF-structured EXIF blob (after "Exif\0\0"); 1 if none. */
static int exif_orientation(const uint8_t *t, size_t n) {
    if (n < 8) return 1;
    int le;
    if (t[0] == 'I' && t[1] == 'I') le = 1;
    else if (t[0] == 'M' && t[1] == 'M') le = 0;
    else return 1;
    uint32_t ifd = rd32(t + 4, le);
    if (ifd > n || n - ifd < 2) return 1;
    unsigned cnt = rd16(t + ifd, le);
    for (unsigned i = 0; i < cnt; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        if (e + 12 > n) break;
        if (rd16(t + e, le) == 0x0112) {
            unsigned type = rd16(t + e + 2, le);
            unsigned v = type == 4 ? rd32(t + e + 8, le) : rd16(t + e + 8, le);
            return v >= 1 && v <= 8 ? (int)v : 1;
        }
    }
    return 1;
}

/* PIL's exif_transpose methods: 2 FLIP_LR, 3 ROT180, 4 FLIP_TB, 5 TRANSPOSE,
 * 6 ROTATE_270 (90 clockwise), 7 TRANSVERSE, 8 ROTATE_90 (90 counter-clockwise). */
static mmc_status apply_orientation(mmc_image *img, int o) {
    if (o <= 1 || o > 8) return MMC_OK;
    int H = img->height, W = img->width;
    int swap = o >= 5;
    mmc_image out;
    mmc_status st = mmc_image_alloc(&out, swap ? W : H, swap ? H : W);
    if (st) return st;
    int OH = out.height, OW = out.width;
    for (int y = 0; y < OH; y++)
        for (int x = 0; x < OW; x++) {
            int sy, sx;
            switch (o) {
            case 2: sy = y; sx = W - 1 - x; break;
            case 3: sy = H - 1 - y; sx = W - 1 - x; break;
            case 4: sy = H - 1 - y; sx = x; break;
            case 5: sy = x; sx = y; break;
            case 6: sy = H - 1 - x; sx = y; break;
            case 7: sy = H - 1 - x; sx = W - 1 - y; break;
            default: sy = x; sx = W - 1 - y; break; /* 8 */
            }
            memcpy(out.data + ((size_t)y * OW + x) * 3, img->data + ((size_t)sy * W + sx) * 3, 3);
        }
    mmc_image_free(img);
    *img = out;
    return MMC_OK;
}

/* ---------------------------------------------------------------- JPEG */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int eof_warning;
} jerr_t;

static void jerr_exit(j_common_ptr c) {
    jerr_t *e = (jerr_t *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}
static void jerr_emit(j_common_ptr c, int level) {
    jerr_t *e = (jerr_t *)c->err;
    if (level < 0) {
        /* Premature end of data: PIL raises "image file is truncated" here. */
        if (c->err->msg_code == JWRN_JPEG_EOF && !e->eof_warning) {
            e->eof_warning = 1;
            c->err->format_message(c, e->msg);
        }
        c->err->num_warnings++;
    }
}
static void jerr_output(j_common_ptr c) { (void)c; }

/* RGB output straight into the image's rows [output_scanline, stop), up to 16 at a time (one
 * copy of the pixels fewer: a 12 MP photo is 36 MB); stops early on a truncation warning, as
 * the loop after it. */
static void read_rgb_rows(struct jpeg_decompress_struct *ci, mmc_image *img, int stop, const int *eof_warning) {
    while ((int)ci->output_scanline < stop && !*eof_warning) {
        JSAMPROW rows[16];
        int n = stop - (int)ci->output_scanline;
        if (n > 16) n = 16;
        for (int i = 0; i < n; i++) rows[i] = img->data + (size_t)(ci->output_scanline + i) * img->width * 3;
        jpeg_read_scanlines(ci, rows, (JDIMENSION)n);
    }
}

/* Two-band decoding of a large baseline RGB JPEG on two threads: each band has its own decoder
 * on the same bytes; the second skips to its first row with jpeg_skip_scanlines (entropy-decodes
 * the rows above without the IDCT, upsampling and colour conversion) and finishes the file. The
 * pixels are libjpeg-turbo's own, the same bytes as one sequential pass (tests/test_image.c
 * checks); any error or warning in either band returns -1 and the caller decodes sequentially,
 * so errors read exactly as before. The split is on an iMCU row. bench_image's 12 MP photo, CPU
 * time per band: 23 ms and 24-25 ms against 33 ms for one pass (1.3x on two idle cores). */
#ifndef MMC_JPEG_BANDS_MIN_PIXELS
#define MMC_JPEG_BANDS_MIN_PIXELS ((int64_t)4 << 20)
#endif
static int decode_band(const uint8_t *buf, size_t n, mmc_image *img, int y0, int y1) {
    struct jpeg_decompress_struct ci;
    jerr_t je;
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    je.pub.emit_message = jerr_emit;
    je.pub.output_message = jerr_output;
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, buf, (unsigned long)n);
    jpeg_read_header(&ci, TRUE);
    ci.out_color_space = JCS_RGB;
    jpeg_start_decompress(&ci);
    int ok = (int)ci.output_width == img->width && (int)ci.output_height == img->height && ci.output_components == 3;
    if (ok && y0 > 0) ok = (int)jpeg_skip_scanlines(&ci, (JDIMENSION)y0) == y0;
    if (ok) read_rgb_rows(&ci, img, y1, &je.eof_warning);
    ok = ok && !je.eof_warning && (int)ci.output_scanline == y1;
    if (ok && y1 == img->height) jpeg_finish_decompress(&ci);   /* the trailing markers, as one pass reads them */
    ok = ok && !je.eof_warning && je.pub.num_warnings == 0;
    jpeg_destroy_decompress(&ci);
    return ok ? 0 : -1;
}

static int decode_bands(const uint8_t *buf, size_t n, const struct jpeg_decompress_struct *ci, mmc_image *img) {
    if (ci->progressive_mode || ci->output_components != 3 || (int64_t)img->width * img->height < MMC_JPEG_BANDS_MIN_PIXELS ||
        omp_in_parallel() || omp_get_max_threads() < 2)
        return -1;
    /* skipping a row costs ~0.55 of decoding it (libjpeg-turbo 2.1, 4:2:0; the entropy decoding
     * it cannot skip): the first band takes 11/16 of the rows so that both take about as long */
    int mcu = ci->max_v_samp_factor * DCTSIZE, y0 = (int)((int64_t)img->height * 11 / 16) / mcu * mcu, bad = 0;
    if (y0 <= 0) return -1;
#pragma omp parallel num_threads(2) reduction(| : bad)
    {
        int t = omp_get_thread_num();
        if (omp_get_num_threads() < 2) bad |= decode_band(buf, n, img, 0, img->height);
        else bad |= decode_band(buf, n, img, t ? y0 : 0, t ? img->height : y0);
    }
    return bad ? -1 : 0;
}

static mmc_status decode_jpeg(const uint8_t *buf, size_t n, const char *name, const mmc_image_opts *o,
                              int64_t limit, mmc_image *out) {
    struct jpeg_decompress_struct cinfo;
    jerr_t jerr;
    memset(&jerr, 0, sizeof jerr);
    /* volatile: modified between setjmp and longjmp */
    uint8_t *volatile row = NULL;
    mmc_image img = {0};
    mmc_image *volatile pimg = &img;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jerr_exit;
    jerr.pub.emit_message = jerr_emit;
    jerr.pub.output_message = jerr_output;
    if (setjmp(jerr.jb)) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        mmc_image_free(pimg);
        return mmc_error(MMC_ERR_FORMAT, "%s: corrupt JPEG: %s", name, jerr.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf, (unsigned long)n);
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);
    mmc_status st = check_size(name, cinfo.image_width, cinfo.image_height, limit);
    if (st) { jpeg_destroy_decompress(&cinfo); return st; }
    int nc = cinfo.num_components;
    if (nc == 1) cinfo.out_color_space = JCS_GRAYSCALE;
    else if (nc == 3) cinfo.out_color_space = JCS_RGB;
    else if (nc == 4) cinfo.out_color_space = JCS_CMYK;
    else {
        jpeg_destroy_decompress(&cinfo);
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: JPEG with %d components", name, nc);
    }
    int orient = 1;
    for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0) {
            orient = exif_orientation(m->data + 6, m->data_length - 6);
            break; /* PIL keeps the first Exif APP1 */
        }
    jpeg_start_decompress(&cinfo);
    int W = cinfo.output_width, H = cinfo.output_height, oc = cinfo.output_components;
    if ((st = mmc_image_alloc(&img, H, W))) { jpeg_destroy_decompress(&cinfo); return st; }
    row = malloc((size_t)W * oc);
    if (!row) { jpeg_destroy_decompress(&cinfo); mmc_image_free(&img); return mmc_error(MMC_ERR_OOM, "%s: OOM", name); }
    if (oc == 3 && decode_bands(buf, n, &cinfo, &img) == 0) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        goto decoded;
    }
    if (oc == 3) read_rgb_rows(&cinfo, &img, H, &jerr.eof_warning);
    while (cinfo.output_scanline < cinfo.output_height && !jerr.eof_warning) {
        int y = cinfo.output_scanline;
        JSAMPROW rp = row;
        jpeg_read_scanlines(&cinfo, &rp, 1);
        uint8_t *d = img.data + (size_t)y * W * 3;
        if (oc == 3) memcpy(d, row, (size_t)W * 3);
        else if (oc == 1) for (int x = 0; x < W; x++) d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = row[x];
        else
            for (int x = 0; x < W; x++) {
                /* PIL reads CMYK JPEGs as "CMYK;I" (Adobe-inverted), then cmyk2rgb:
                 * out = MULDIV255(255 - c, 255 - k) with c, k already un-inverted. */
                unsigned k = 255u - row[4 * x + 3];
                for (int c = 0; c < 3; c++) {
                    unsigned cc = 255u - row[4 * x + c];
                    unsigned t = (255u - cc) * (255u - k) + 128u;
                    d[3 * x + c] = (uint8_t)(((t >> 8) + t) >> 8);
                }
            }
        if (jerr.eof_warning) break;
    }
    if (!jerr.eof_warning) jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    if (jerr.eof_warning) {
        mmc_image_free(&img);
        return mmc_error(MMC_ERR_FORMAT, "%s: truncated JPEG (%s)", name, jerr.msg);
    }
decoded:
    if (o->exif_transpose && (st = apply_orientation(&img, orient))) { mmc_image_free(&img); return st; }
    *out = img;
    return MMC_OK;
}

/* ---------------------------------------------------------------- PNG */
typedef struct { const uint8_t *p; size_t n, off; } png_src;
typedef struct { jmp_buf jb; char msg[256]; } png_err;

static void png_read_cb(png_structp png, png_bytep dst, size_t len) {
    png_src *s = png_get_io_ptr(png);
    if (s->n - s->off < len) png_error(png, "unexpected end of file (truncated PNG)");
    memcpy(dst, s->p + s->off, len);
    s->off += len;
}
static void png_err_cb(png_structp png, png_const_charp msg) {
    png_err *e = png_get_error_ptr(png);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    longjmp(e->jb, 1);
}
static void png_warn_cb(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

static mmc_status decode_png(const uint8_t *buf, size_t n, const char *name, const mmc_image_opts *o,
                             int64_t limit, mmc_image *out) {
    /* IHDR comes first (8-byte signature, length, "IHDR", width, height): check the size it
     * claims before libpng allocates anything; libpng validates the rest of the chunk */
    if (n >= 24 && memcmp(buf + 12, "IHDR", 4) == 0) {
        mmc_status st = check_size(name, rd32(buf + 16, 0), rd32(buf + 20, 0), limit);
        if (st) return st;
    }
    png_err perr;
    png_src src = {buf, n, 0};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &perr, png_err_cb, png_warn_cb);
    if (!png) return mmc_error(MMC_ERR_OOM, "%s: libpng init failed", name);
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile raw = NULL;
    png_bytep *volatile rows = NULL;
    mmc_image img = {0};
    mmc_image *volatile pimg = &img;
    volatile mmc_status vst = MMC_OK;
    if (setjmp(perr.jb)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(raw);
        free(rows);
        mmc_image_free(pimg);
        if (vst) return vst;
        return mmc_error(MMC_ERR_FORMAT, "%s: corrupt PNG: %s", name, perr.msg);
    }
    if (!info) png_error(png, "out of memory");
    png_set_read_fn(png, &src, png_read_cb);
    /* Pillow verifies every chunk CRC; so do we (libpng only warns on ancillary ones). */
    png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    /* libpng's own default limits stay (PNG_USER_WIDTH/HEIGHT_MAX, 1e6 a side; chunk cache
     * and chunk size caps), lowered to the pixel limit when that is smaller: a side cannot
     * exceed the limit. The pixel limit itself was checked on IHDR before we got here. */
    png_uint_32 side = png_get_user_width_max(png);
    if ((int64_t)side > limit) side = (png_uint_32)limit;
    png_set_user_limits(png, side, side);
    png_read_info(png, info);
    png_uint_32 W = png_get_image_width(png, info), H = png_get_image_height(png, info);
    mmc_status st = check_size(name, W, H, limit);
    if (st) { vst = st; png_error(png, "size"); }
    int ct = png_get_color_type(png, info), bd = png_get_bit_depth(png, info);
    int has_trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
    int orient = 1;
#ifdef PNG_eXIf_SUPPORTED
    {
        png_uint_32 en = 0;
        png_bytep ex = NULL;
        if (png_get_eXIf_1(png, info, &en, &ex) && ex) orient = exif_orientation(ex, en);
    }
#endif
    int grey16 = ct == PNG_COLOR_TYPE_GRAY && bd == 16; /* PIL "I;16": clip to 255 */
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (has_trns) {
        if (o->alpha == MMC_ALPHA_WHITE && !grey16) png_set_tRNS_to_alpha(png);
        else png_free_data(png, info, PNG_FREE_TRNS, -1);
    }
    if (bd == 16 && !grey16) png_set_strip_16(png); /* PIL keeps the high byte */
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rb = png_get_rowbytes(png, info);
    int ch = png_get_channels(png, info);
    raw = malloc(rb * H);
    rows = malloc(sizeof(png_bytep) * H);
    if (!raw || !rows) { vst = mmc_error(MMC_ERR_OOM, "%s: OOM", name); png_error(png, "oom"); }
    for (png_uint_32 y = 0; y < H; y++) rows[y] = raw + rb * y;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    if ((st = mmc_image_alloc(&img, (int)H, (int)W))) { vst = st; png_error(png, "oom"); }
    int white = o->alpha == MMC_ALPHA_WHITE;
    for (png_uint_32 y = 0; y < H; y++) {
        const uint8_t *s = rows[y];
        uint8_t *d = img.data + (size_t)y * W * 3;
        for (png_uint_32 x = 0; x < W; x++, d += 3) {
            if (grey16) {
                unsigned v = (unsigned)s[2 * x] << 8 | s[2 * x + 1];
                d[0] = d[1] = d[2] = v > 255 ? 255 : (uint8_t)v;
            } else if (ch == 1) {
                d[0] = d[1] = d[2] = s[x];
            } else if (ch == 2) {
                uint8_t v = white ? over_white(s[2 * x], s[2 * x + 1]) : s[2 * x];
                d[0] = d[1] = d[2] = v;
            } else if (ch == 3) {
                memcpy(d, s + 3 * x, 3);
            } else {
                for (int c = 0; c < 3; c++) d[c] = white ? over_white(s[4 * x + c], s[4 * x + 3]) : s[4 * x + c];
            }
        }
    }
    png_destroy_read_struct(&png, &info, NULL);
    free(raw);
    free(rows);
    if (o->exif_transpose && (st = apply_orientation(&img, orient))) { mmc_image_free(&img); return st; }
    *out = img;
    return MMC_OK;
}

mmc_status mmc_image_load_memory(const void *buf, size_t n, const char *name, const mmc_image_opts *opts,
                                 mmc_image *out) {
    mmc_image_opts o;
    if (opts) o = *opts;
    else mmc_image_opts_default(&o);
    if (!name) name = "<memory>";
    int64_t limit = o.max_pixels > 0 ? o.max_pixels : MMC_IMAGE_MAX_PIXELS_DEFAULT;
    const uint8_t *p = buf;
    out->data = NULL;
    out->height = out->width = 0;
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return decode_jpeg(p, n, name, &o, limit, out);
    if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return decode_png(p, n, name, &o, limit, out);
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: not a JPEG or PNG file (unrecognised magic bytes, %zu bytes)", name, n);
}

mmc_status mmc_image_load(const char *path, const mmc_image_opts *opts, mmc_image *out) {
    char *data = NULL;
    size_t len = 0;
    out->data = NULL;
    mmc_status st = mmc_read_file(path, &data, &len);
    if (st) return mmc_error_prefix(st, "loading image %s", path);
    st = mmc_image_load_memory(data, len, path, opts, out);
    free(data);
    return st;
}

/* ------------------------------------------------------------------ PNG writing
 * 8-bit RGB through libpng's full API (the simplified API has no text chunks), into memory,
 * then one atomic write: a reader never sees half a file. Text goes in uncompressed tEXt chunks
 * as Latin-1 keys (1-79 chars) with the values as given (the PNG spec asks Latin-1 of tEXt;
 * libpng stores the bytes, and readers such as PIL return them), the way diffusers users find
 * the prompt and settings in an image. */
typedef struct { uint8_t *p; size_t n, cap; bool oom; } png_membuf;

static void png_write_cb(png_structp png, png_bytep src, size_t len) {
    png_membuf *m = png_get_io_ptr(png);
    if (m->oom) return;
    if (m->n + len > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1 << 16;
        while (cap < m->n + len) cap *= 2;
        uint8_t *q = realloc(m->p, cap);
        if (!q) { m->oom = true; return; }
        m->p = q, m->cap = cap;
    }
    memcpy(m->p + m->n, src, len);
    m->n += len;
}
static void png_flush_cb(png_structp png) { (void)png; }

mmc_status mmc_image_write_png(const char *path, const uint8_t *rgb, int height, int width, int n_text,
                               const char *const *keys, const char *const *values) {
    if (height < 1 || width < 1) return mmc_error(MMC_ERR_INVALID, "%s: image size %dx%d", path, width, height);
    for (int i = 0; i < n_text; i++) {
        size_t kl = strlen(keys[i]);
        if (kl < 1 || kl > 79) return mmc_error(MMC_ERR_INVALID, "%s: PNG text key '%s' must be 1-79 characters", path, keys[i]);
    }
    png_membuf m = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, png_warn_cb);  /* errors longjmp to png_jmpbuf */
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_textp text = calloc((size_t)(n_text > 0 ? n_text : 1), sizeof *text);
    png_bytep *rows = malloc((size_t)height * sizeof *rows);
    volatile mmc_status st = MMC_OK;
    if (!png || !info || !text || !rows) { st = mmc_error(MMC_ERR_OOM, "%s: out of memory", path); goto done; }
    if (setjmp(png_jmpbuf(png))) { st = mmc_error(MMC_ERR_IO, "%s: libpng could not encode the image", path); goto done; }
    png_set_write_fn(png, &m, png_write_cb, png_flush_cb);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    for (int i = 0; i < n_text; i++) {
        text[i].compression = PNG_TEXT_COMPRESSION_NONE;
        text[i].key = (png_charp)keys[i];
        text[i].text = (png_charp)values[i];
        text[i].text_length = strlen(values[i]);
    }
    if (n_text > 0) png_set_text(png, info, text, n_text);
    for (int y = 0; y < height; y++) rows[y] = (png_bytep)rgb + (size_t)y * (size_t)width * 3;
    png_set_rows(png, info, rows);
    png_write_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
    if (m.oom) { st = mmc_error(MMC_ERR_OOM, "%s: out of memory encoding the PNG", path); goto done; }
    st = mmc_write_file_atomic(path, m.p, m.n);
done:
    png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
    free(text);
    free(rows);
    free(m.p);
    return st;
}
