/* video_write.c — writing generated clips: uint8 RGB frames [F, H, W, 3] to an MP4 (H.264 through
 * FFmpeg's libx264 wrapper when this libavcodec has it, else MPEG-4 part 2), a Matroska file of FFV1
 * (lossless, RGB words: every pixel comes back exactly), a GIF (FFmpeg's gif encoder on one palette of
 * the clip's own colours) or a folder of PNG frames. The same libraries src/io/video.c reads with.
 *
 * H.264 and MPEG-4 take yuv420p, converted by libswscale with its defaults (BT.601, limited range:
 * what the reader assumes for an untagged stream), which halves the chroma resolution and so needs
 * even sizes: odd ones are an error unless pad_odd repeats the last row / column. The frame rate
 * is the stream's (time base 1/fps as a rational), the settings go into the container's metadata
 * ("comment", "title"). Every file is written under a temporary name in the target's directory and
 * renamed into place (a PNG folder: the whole folder), as mmc's other writers do, so an
 * interrupted run leaves no half file under the real name. */
#include "mmc_video.h"
#include "mmc_io.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

#include <dirent.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SIDE 16384

static mmc_status averr(const char *path, int err, const char *what) {
    char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
    av_strerror(err, buf, sizeof buf);
    return mmc_error(err == AVERROR(ENOMEM) ? MMC_ERR_OOM : MMC_ERR_IO, "video %s: %s (%s)", path, what, buf);
}

const char *mmc_video_write_mp4_encoder(void) {
    return avcodec_find_encoder_by_name("libx264") ? "libx264" : "mpeg4";
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcasecmp(s + n - m, suf) == 0;
}

static mmc_status pick_format(const char *path, mmc_video_out_format f, mmc_video_out_format *out) {
    if (f != MMC_VIDEO_OUT_AUTO) { *out = f; return MMC_OK; }
    struct stat sb;
    size_t n = strlen(path);
    if (ends_with(path, ".gif")) *out = MMC_VIDEO_OUT_GIF;
    else if (ends_with(path, ".mp4") || ends_with(path, ".m4v") || ends_with(path, ".mov")) *out = MMC_VIDEO_OUT_MP4;
    else if (ends_with(path, ".mkv")) *out = MMC_VIDEO_OUT_MKV_FFV1;
    else if ((n && path[n - 1] == '/') || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))) *out = MMC_VIDEO_OUT_PNG_DIR;
    else
        return mmc_error(MMC_ERR_INVALID, "video %s: cannot tell the format from the name: end it in .mp4 (H.264), "
                         ".gif, .mkv (lossless FFV1) or '/' (a folder of PNG frames)", path);
    return MMC_OK;
}

/* ------------------------------------------------------------------ GIF palette
 * Median cut over the clip's 5-5-5-bit colour histogram: the box with the widest channel range (times
 * its pixel count) is split at the weighted median of that channel until there are 256 boxes; each entry
 * is the mean colour of its box's pixels. Pixels then take the nearest entry (memoised per 5-5-5 colour). */
typedef struct {
    uint32_t pal[256];            /* 0xAARRGGBB as AVFrame's palette plane holds it */
    int n;
    int16_t *map;                 /* [32768] 5-5-5 colour -> entry, -1 until looked up */
} palette;

typedef struct {
    int64_t count, sum[3];
    uint8_t c[3];                 /* the 5-bit cell */
} cell;

static int g_axis;                /* qsort has no user pointer; only the writer thread sorts */
static int cmp_axis(const void *a, const void *b) {
    const cell *x = a, *y = b;
    return (int)x->c[g_axis] - (int)y->c[g_axis];
}

static mmc_status build_palette(const uint8_t *rgb, int64_t n_px, palette *p) {
    cell *cells = calloc(32768, sizeof *cells);
    int *box = malloc(257 * 2 * sizeof *box);   /* [lo, hi) into the compacted cells */
    p->map = malloc(32768 * sizeof *p->map);
    if (!cells || !box || !p->map) { free(cells), free(box); return mmc_error(MMC_ERR_OOM, "out of memory (GIF palette)"); }
    for (int64_t i = 0; i < n_px; i++) {
        const uint8_t *c = rgb + 3 * i;
        cell *e = &cells[(c[0] >> 3) << 10 | (c[1] >> 3) << 5 | c[2] >> 3];
        e->count++, e->sum[0] += c[0], e->sum[1] += c[1], e->sum[2] += c[2];
    }
    int n = 0;
    for (int k = 0; k < 32768; k++)
        if (cells[k].count) {
            cells[n] = cells[k];
            cells[n].c[0] = (uint8_t)(k >> 10), cells[n].c[1] = (uint8_t)(k >> 5 & 31), cells[n].c[2] = (uint8_t)(k & 31);
            n++;
        }
    int nb = 1;
    box[0] = 0, box[1] = n;
    while (nb < 256) {
        int best = -1, axis = 0;
        double score = 0;
        for (int b = 0; b < nb; b++) {
            int lo = box[2 * b], hi = box[2 * b + 1];
            if (hi - lo < 2) continue;
            int mn[3] = {31, 31, 31}, mx[3] = {0, 0, 0};
            int64_t cnt = 0;
            for (int i = lo; i < hi; i++) {
                cnt += cells[i].count;
                for (int a = 0; a < 3; a++) {
                    if (cells[i].c[a] < mn[a]) mn[a] = cells[i].c[a];
                    if (cells[i].c[a] > mx[a]) mx[a] = cells[i].c[a];
                }
            }
            for (int a = 0; a < 3; a++) {
                double sc = (double)(mx[a] - mn[a]) * sqrt((double)cnt);
                if (sc > score) score = sc, best = b, axis = a;
            }
        }
        if (best < 0) break;
        int lo = box[2 * best], hi = box[2 * best + 1];
        g_axis = axis;
        qsort(cells + lo, (size_t)(hi - lo), sizeof *cells, cmp_axis);
        int64_t total = 0, acc = 0;
        for (int i = lo; i < hi; i++) total += cells[i].count;
        int mid = lo + 1;
        for (int i = lo; i < hi - 1; i++) {
            acc += cells[i].count;
            mid = i + 1;
            if (2 * acc >= total) break;
        }
        box[2 * best + 1] = mid;
        box[2 * nb] = mid, box[2 * nb + 1] = hi;
        nb++;
    }
    p->n = nb;
    for (int b = 0; b < nb; b++) {
        int64_t k = 0, s[3] = {0, 0, 0};
        for (int i = box[2 * b]; i < box[2 * b + 1]; i++)
            k += cells[i].count, s[0] += cells[i].sum[0], s[1] += cells[i].sum[1], s[2] += cells[i].sum[2];
        if (!k) k = 1;
        p->pal[b] = 0xFF000000u | (uint32_t)((s[0] + k / 2) / k) << 16 | (uint32_t)((s[1] + k / 2) / k) << 8 |
                    (uint32_t)((s[2] + k / 2) / k);
    }
    for (int i = nb; i < 256; i++) p->pal[i] = 0xFF000000u;
    memset(p->map, 0xFF, 32768 * sizeof *p->map);
    free(cells), free(box);
    return MMC_OK;
}

static uint8_t palette_index(palette *p, const uint8_t *c) {
    int key = (c[0] >> 3) << 10 | (c[1] >> 3) << 5 | c[2] >> 3;
    if (p->map[key] >= 0) return (uint8_t)p->map[key];
    /* nearest entry to the centre of the 5-5-5 cell */
    int r = (c[0] & ~7) + 4, g = (c[1] & ~7) + 4, b = (c[2] & ~7) + 4, best = 0;
    long bd = -1;
    for (int i = 0; i < p->n; i++) {
        int dr = (int)(p->pal[i] >> 16 & 255) - r, dg = (int)(p->pal[i] >> 8 & 255) - g, db = (int)(p->pal[i] & 255) - b;
        long d = 2L * dr * dr + 4L * dg * dg + 3L * db * db;
        if (bd < 0 || d < bd) bd = d, best = i;
    }
    p->map[key] = (int16_t)best;
    return (uint8_t)best;
}

/* ------------------------------------------------------------------ FFmpeg path */
typedef struct {
    AVFormatContext *oc;
    AVCodecContext *enc;
    AVStream *st;
    AVFrame *frame;
    AVPacket *pkt;
    struct SwsContext *sws;
    uint8_t *padded;              /* an odd-sized frame padded to even (pad_odd) */
    palette pal;
    bool opened, header;
} writer;

static void writer_free(writer *w) {
    if (w->oc) {
        if (w->opened) avio_closep(&w->oc->pb);
        avformat_free_context(w->oc);
    }
    avcodec_free_context(&w->enc);
    av_frame_free(&w->frame);
    av_packet_free(&w->pkt);
    sws_freeContext(w->sws);
    free(w->padded);
    free(w->pal.map);
}

static mmc_status drain(writer *w, const char *path, bool flush) {
    int r = avcodec_send_frame(w->enc, flush ? NULL : w->frame);
    if (r < 0) return averr(path, r, "the encoder refused a frame");
    for (;;) {
        r = avcodec_receive_packet(w->enc, w->pkt);
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return MMC_OK;
        if (r < 0) return averr(path, r, "encoding failed");
        av_packet_rescale_ts(w->pkt, w->enc->time_base, w->st->time_base);
        w->pkt->stream_index = w->st->index;
        r = av_interleaved_write_frame(w->oc, w->pkt);
        if (r < 0) return averr(path, r, "writing a packet failed");
    }
}

static mmc_status write_av(const char *path, const char *tmp, mmc_video_out_format fmt, const uint8_t *rgb, int F,
                           int H, int W, double fps, const mmc_video_write_opts *o, const char **enc_name) {
    writer w = {0};
    mmc_status st = MMC_OK;
    int r;
    const char *muxer = fmt == MMC_VIDEO_OUT_GIF ? "gif" : fmt == MMC_VIDEO_OUT_MKV_FFV1 ? "matroska" : "mp4";
    const AVCodec *codec = NULL;
    enum AVPixelFormat pix;
    if (fmt == MMC_VIDEO_OUT_MP4) {
        codec = avcodec_find_encoder_by_name("libx264");
        if (!codec) codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
        pix = AV_PIX_FMT_YUV420P;
    } else if (fmt == MMC_VIDEO_OUT_GIF) {
        codec = avcodec_find_encoder(AV_CODEC_ID_GIF);
        pix = AV_PIX_FMT_PAL8;
    } else {
        codec = avcodec_find_encoder(AV_CODEC_ID_FFV1);
        pix = AV_PIX_FMT_0RGB32;   /* packed 0xXXRRGGBB words: a lossless repacking of RGB24 */
    }
    if (!codec)
        return mmc_error(MMC_ERR_UNSUPPORTED, "video %s: this libavcodec has no encoder for %s", path,
                         fmt == MMC_VIDEO_OUT_MP4 ? "H.264 or MPEG-4" : fmt == MMC_VIDEO_OUT_GIF ? "GIF" : "FFV1");
    *enc_name = codec->name;
    const int EH = pix == AV_PIX_FMT_YUV420P ? (H + 1) & ~1 : H, EW = pix == AV_PIX_FMT_YUV420P ? (W + 1) & ~1 : W;
    r = avformat_alloc_output_context2(&w.oc, NULL, muxer, tmp);
    if (r < 0 || !w.oc) { st = averr(path, r, "cannot set up the container"); goto done; }
    w.st = avformat_new_stream(w.oc, NULL);
    w.enc = avcodec_alloc_context3(codec);
    w.frame = av_frame_alloc();
    w.pkt = av_packet_alloc();
    if (!w.st || !w.enc || !w.frame || !w.pkt) { st = mmc_error(MMC_ERR_OOM, "video %s: out of memory", path); goto done; }
    AVRational rate = av_d2q(fps, 1001000);
    w.enc->width = EW, w.enc->height = EH, w.enc->pix_fmt = pix;
    w.enc->time_base = av_inv_q(rate);
    w.enc->framerate = rate;
    if (fmt == MMC_VIDEO_OUT_MP4) {
        w.enc->gop_size = 12 * 4;
        if (strcmp(codec->name, "libx264") == 0) {
            char crf[16];
            snprintf(crf, sizeof crf, "%d", o->crf > 0 ? o->crf : 18);
            av_opt_set(w.enc->priv_data, "crf", crf, 0);
            av_opt_set(w.enc->priv_data, "preset", "medium", 0);
        } else {
            w.enc->bit_rate = (int64_t)(0.25 * EW * EH * fps);   /* mpeg4 has no CRF: ~0.25 bits per pixel */
            w.enc->qmax = 8;
        }
    }
    if (fmt == MMC_VIDEO_OUT_MKV_FFV1) w.enc->level = 3;   /* FFV1 version 3: slices, CRCs */
    if (w.oc->oformat->flags & AVFMT_GLOBALHEADER) w.enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    r = avcodec_open2(w.enc, codec, NULL);
    if (r < 0) { st = averr(path, r, "cannot open the encoder"); goto done; }
    r = avcodec_parameters_from_context(w.st->codecpar, w.enc);
    if (r < 0) { st = averr(path, r, "cannot set the stream parameters"); goto done; }
    w.st->time_base = w.enc->time_base;
    w.st->avg_frame_rate = rate;
    w.st->r_frame_rate = rate;
    if (o->comment && o->comment[0]) av_dict_set(&w.oc->metadata, "comment", o->comment, 0);
    if (o->title && o->title[0]) av_dict_set(&w.oc->metadata, "title", o->title, 0);
    r = avio_open(&w.oc->pb, tmp, AVIO_FLAG_WRITE);
    if (r < 0) { st = averr(path, r, "cannot create the file (is the directory there and writable?)"); goto done; }
    w.opened = true;
    r = avformat_write_header(w.oc, NULL);
    if (r < 0) { st = averr(path, r, "cannot write the container header"); goto done; }
    w.header = true;
    w.frame->format = pix, w.frame->width = EW, w.frame->height = EH;
    r = av_frame_get_buffer(w.frame, 0);
    if (r < 0) { st = averr(path, r, "cannot allocate a frame"); goto done; }
    if (pix == AV_PIX_FMT_YUV420P) {
        w.sws = sws_getContext(EW, EH, AV_PIX_FMT_RGB24, EW, EH, pix, SWS_BICUBIC, NULL, NULL, NULL);
        if (!w.sws) { st = mmc_error(MMC_ERR_UNSUPPORTED, "video %s: libswscale cannot convert RGB to yuv420p", path); goto done; }
        if (EH != H || EW != W) {
            w.padded = malloc((size_t)EH * EW * 3);
            if (!w.padded) { st = mmc_error(MMC_ERR_OOM, "video %s: out of memory", path); goto done; }
        }
    }
    if (pix == AV_PIX_FMT_PAL8 && (st = build_palette(rgb, (int64_t)F * H * W, &w.pal))) goto done;
    for (int f = 0; f < F; f++) {
        const uint8_t *src = rgb + (size_t)f * H * W * 3;
        if ((r = av_frame_make_writable(w.frame)) < 0) { st = averr(path, r, "frame buffer"); goto done; }
        if (pix == AV_PIX_FMT_YUV420P) {
            int stride = EW * 3;
            if (w.padded) {
                for (int y = 0; y < EH; y++) {
                    const uint8_t *row = src + (size_t)(y < H ? y : H - 1) * W * 3;
                    uint8_t *dst = w.padded + (size_t)y * EW * 3;
                    memcpy(dst, row, (size_t)W * 3);
                    if (EW > W) memcpy(dst + (size_t)W * 3, row + (size_t)(W - 1) * 3, 3);
                }
                src = w.padded;
            }
            const uint8_t *planes[1] = {src};
            sws_scale(w.sws, planes, &stride, 0, EH, w.frame->data, w.frame->linesize);
        } else if (pix == AV_PIX_FMT_PAL8) {
            for (int y = 0; y < H; y++) {
                uint8_t *dst = w.frame->data[0] + (size_t)y * w.frame->linesize[0];
                for (int x = 0; x < W; x++) dst[x] = palette_index(&w.pal, src + ((size_t)y * W + x) * 3);
            }
            memcpy(w.frame->data[1], w.pal.pal, sizeof w.pal.pal);
        } else {   /* 0RGB32: native-endian 32-bit words */
            for (int y = 0; y < H; y++) {
                uint32_t *dst = (uint32_t *)(w.frame->data[0] + (size_t)y * w.frame->linesize[0]);
                const uint8_t *row = src + (size_t)y * W * 3;
                for (int x = 0; x < W; x++)
                    dst[x] = (uint32_t)row[3 * x] << 16 | (uint32_t)row[3 * x + 1] << 8 | row[3 * x + 2];
            }
        }
        w.frame->pts = f;
        if ((st = drain(&w, path, false))) goto done;
    }
    if ((st = drain(&w, path, true))) goto done;
    r = av_write_trailer(w.oc);
    if (r < 0) { st = averr(path, r, "cannot finish the file"); goto done; }
    r = avio_closep(&w.oc->pb);
    w.opened = false;
    if (r < 0) { st = averr(path, r, "cannot close the file"); goto done; }
done:
    writer_free(&w);
    return st;
}

/* ------------------------------------------------------------------ PNG folder */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4600];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", dir, e->d_name), unlink(p);
        closedir(d);
    }
    rmdir(dir);
}

static mmc_status write_png_dir(const char *path, const uint8_t *rgb, int F, int H, int W, double fps,
                                const mmc_video_write_opts *o) {
    char dir[4096], tmp[4200], p[4300];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    if (n >= sizeof dir) return mmc_error(MMC_ERR_INVALID, "video %s: path too long", path);
    memcpy(dir, path, n), dir[n] = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
    remove_dir(tmp);
    if (mkdir(tmp, 0755) != 0)
        return mmc_error(MMC_ERR_IO, "video %s: cannot create the frame folder (%s): is its parent there and "
                         "writable?", path, strerror(errno));
    mmc_status st = MMC_OK;
    const char *keys[2] = {"Comment", "Title"}, *vals[2];
    int nt = 0;
    if (o->comment && o->comment[0]) vals[nt] = o->comment, keys[nt] = "Comment", nt++;
    if (o->title && o->title[0]) vals[nt] = o->title, keys[nt] = "Title", nt++;
    for (int f = 0; f < F && !st; f++) {
        snprintf(p, sizeof p, "%s/frame_%05d.png", tmp, f);
        st = mmc_image_write_png(p, rgb + (size_t)f * H * W * 3, H, W, nt, keys, vals);
    }
    if (!st) {   /* the settings beside the frames */
        char *json = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&json, &len);
        if (!m) st = mmc_error(MMC_ERR_OOM, "out of memory");
        else {
            fprintf(m, "{\"frames\": %d, \"height\": %d, \"width\": %d, \"fps\": %.17g", F, H, W, fps);
            if (o->comment) fputs(", \"comment\": ", m), mmc_json_write_string(m, o->comment);
            if (o->title) fputs(", \"title\": ", m), mmc_json_write_string(m, o->title);
            fputs("}\n", m);
            fclose(m);
            snprintf(p, sizeof p, "%s/settings.json", tmp);
            st = mmc_write_file_atomic(p, json, len);
            free(json);
        }
    }
    if (!st && rename(tmp, dir) != 0) {
        /* dir exists: move it aside, put the new one in place, drop the old one */
        char old[4300];
        snprintf(old, sizeof old, "%s.old.%d", dir, (int)getpid());
        if (rename(dir, old) != 0 || rename(tmp, dir) != 0)
            st = mmc_error(MMC_ERR_IO, "video %s: cannot move the frames into place (%s)", path, strerror(errno));
        else remove_dir(old);
    }
    if (st) remove_dir(tmp);
    return st;
}

void mmc_video_frames_to_rgb(const float *x, int n_frames, int height, int width, uint8_t *rgb) {
    const int64_t HW = (int64_t)height * width, N = (int64_t)n_frames * HW;
    for (int c = 0; c < 3; c++)
        for (int64_t i = 0; i < N; i++) {
            float v = x[c * N + i] / 2.0f + 0.5f;
            v = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
            rgb[i * 3 + c] = (uint8_t)(v * 255.0f);
        }
}

/* ------------------------------------------------------------------ entry */
mmc_status mmc_video_write(const char *path, const uint8_t *rgb, int n_frames, int height, int width, double fps,
                           const mmc_video_write_opts *opts) {
    static const mmc_video_write_opts defaults = {0};
    const mmc_video_write_opts *o = opts ? opts : &defaults;
    if (!path || !path[0]) return mmc_error(MMC_ERR_INVALID, "video output: empty path");
    if (n_frames < 1 || height < 1 || width < 1 || height > MAX_SIDE || width > MAX_SIDE)
        return mmc_error(MMC_ERR_INVALID, "video %s: %d frames of %dx%d: need at least one frame, sides 1..%d", path,
                         n_frames, width, height, MAX_SIDE);
    if (!(fps > 0 && fps <= 1000))
        return mmc_error(MMC_ERR_INVALID, "video %s: fps %g must be in (0, 1000]", path, fps);
    if (o->crf < 0 || o->crf > 51)
        return mmc_error(MMC_ERR_INVALID, "video %s: crf %d must be in 0..51", path, o->crf);
    mmc_video_out_format fmt;
    mmc_status st = pick_format(path, o->format, &fmt);
    if (st) return st;
    if (fmt == MMC_VIDEO_OUT_PNG_DIR) return write_png_dir(path, rgb, n_frames, height, width, fps, o);
    if (fmt == MMC_VIDEO_OUT_MP4 && ((height | width) & 1) && !o->pad_odd)
        return mmc_error(MMC_ERR_INVALID, "video %s: %dx%d: H.264 in yuv420p needs even width and height; generate "
                         "an even size, or pad the last row / column (pad_odd)", path, width, height);
    if (fmt == MMC_VIDEO_OUT_GIF && (height > 65535 || width > 65535))
        return mmc_error(MMC_ERR_INVALID, "video %s: too large for GIF", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    const char *enc = "";
    st = write_av(path, tmp, fmt, rgb, n_frames, height, width, fps, o, &enc);
    if (!st && rename(tmp, path) != 0)
        st = mmc_error(MMC_ERR_IO, "video %s: cannot move the written file into place: %s", path, strerror(errno));
    if (st) { unlink(tmp); return st; }
    if (!o->quiet)
        fprintf(stderr, "video %s: %d frames %dx%d at %g fps, %s%s\n", path, n_frames, width, height, fps, enc,
                fmt == MMC_VIDEO_OUT_MP4 && strcmp(enc, "libx264") != 0
                    ? " (no libx264 in this libavcodec: MPEG-4 part 2, which most players read)" : "");
    return MMC_OK;
}
