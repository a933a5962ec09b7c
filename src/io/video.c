/* video.c — video files through FFmpeg (libavformat demuxing, libavcodec decoding, libswscale
 * to RGB24). Mirrors the frames transformers' video backends give (PyAV's read_video_pyav,
 * torchcodec): frame i is the i-th frame in presentation order; RGB24 comes from swscale with
 * PyAV's defaults (SWS_BILINEAR, source colour space and range taken from the frame).
 *
 * Opening runs the demuxer over every packet once (no decoding): that gives the frame count
 * when the header has none (Matroska, WebM, GIF), each frame's timestamp (the sorted packet
 * timestamps) and the keyframes. Reading then seeks to the last keyframe at or before each
 * wanted frame unless that frame can be reached by decoding forward, and decodes up to the
 * frame's exact timestamp. Files whose packets lack timestamps or repeat one are decoded
 * from the start and counted, as PyAV does.
 *
 * With more than one OpenMP thread and wanted frames behind two or more keyframes, each thread
 * opens its own reader of the file (demuxer and single-threaded decoder, the frame index
 * borrowed) and decodes whole keyframe segments: decoding from a keyframe gives the same
 * frames whichever thread does it, so the output is that of the one-reader path. Frames no
 * other frame refers to are only decoded when wanted. Once the packet of a segment's last
 * wanted frame is in, the decoder is drained rather than fed the packets its reorder delay
 * would read first. Segments decoded while other threads would wait (the last round, or fewer
 * segments than threads) use FFmpeg's frame threading, whose frames are those of one thread.
 * skip_frame is set before each packet is sent; frame threading copies it into the thread that
 * takes that packet (FFmpeg's submit_packet), so it applies to that packet alone there too.
 * mmc_video_set_skipping(v, false) or MMC_VIDEO_SKIP=0 decodes every packet instead (same
 * frames: test_video checks it); mmc_video_frames_decoded counts what was decoded.
 * mmc_video_read_each hands each frame to a callback on the thread that decoded it instead of
 * keeping it (converted into the reader's own reused RGB buffer).
 */
#include "mmc_video.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>

#include <limits.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Beyond these a file is refused before anything large is allocated. */
#define MAX_PACKETS (1LL << 24)     /* 16.7M frames: 6 days at 30 fps */
#define MAX_SIDE 16384

struct mmc_video {
    char name[512];
    char *path;                  /* the file (NULL for _mem): thread readers reopen it */
    AVFormatContext *fmt;
    AVIOContext *mem_io;         /* custom I/O for _mem (owned) */
    const uint8_t *mem;          /* the caller's buffer */
    size_t mem_len, mem_pos;
    int stream;
    AVCodecContext *dec;
    AVCodecContext *dec_alt;     /* a thread reader on frame threads: its single-threaded decoder */
    struct SwsContext *sws;
    AVPacket *pkt;
    AVFrame *frame;
    int64_t *pts;                /* [n_pts] presentation timestamps, sorted (frame i = pts[i]) */
    int64_t n_pts;
    int64_t *key_pts;            /* [n_key] keyframe timestamps, sorted */
    int64_t n_key;
    mmc_video_info info;
    int64_t cur_pts;             /* the last frame decoded since the last seek; INT64_MIN: none */
    const int64_t *want;         /* seek mode: the pts of every frame asked for, ascending; else NULL */
    int n_want;
    int64_t seq_index;           /* sequential mode: index of the next decoded frame */
    int64_t drain_pts;           /* seek mode: once this frame's packet is sent, drain; INT64_MIN: never */
    bool at_start, eof;
    bool drained;                /* the decoder was sent its end (drain_pts): seek before decoding on */
    bool borrowed;               /* a thread reader: pts / key_pts belong to the parent */
    bool decode_all;             /* no skipping: every packet decoded, no early drain (mmc_video_set_skipping) */
    int64_t n_decoded;           /* frames the decoder returned since open (thread readers' included) */
    int worker;                  /* mmc_video_read_each: this reader's worker number (0: the parent) */
    mmc_image rgb;               /* mmc_video_read_each: the RGB frame handed to the callback, reused */
};

/* Where decoded frames go: into frames[k] (mmc_video_read), or, converted into the reader's
 * own reused buffer, to fn on the decoding thread (mmc_video_read_each); neither: nowhere
 * (mmc_video_decode_only). */
typedef struct {
    mmc_image *frames;
    mmc_video_frame_fn fn;
    void *ctx;
} sink_t;

static mmc_status averr(mmc_status st, const mmc_video *v, int err, const char *what, const char *hint) {
    char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
    av_strerror(err, buf, sizeof buf);
    return mmc_error(st, "video %s: %s (%s)%s%s", v->name, what, buf, hint ? ": " : "", hint ? hint : "");
}

#define REENCODE "the file is damaged or not a video; re-encode it (ffmpeg -i IN -c:v libx264 OUT.mp4) or " \
                 "give a folder of its frames"

static int mem_read(void *opaque, uint8_t *buf, int size) {
    mmc_video *v = opaque;
    size_t left = v->mem_len - v->mem_pos;
    if (left == 0) return AVERROR_EOF;
    if ((size_t)size > left) size = (int)left;
    memcpy(buf, v->mem + v->mem_pos, (size_t)size);
    v->mem_pos += (size_t)size;
    return size;
}

static int64_t mem_seek(void *opaque, int64_t off, int whence) {
    mmc_video *v = opaque;
    if (whence & AVSEEK_SIZE) return (int64_t)v->mem_len;
    int64_t base = (whence & 3) == SEEK_CUR ? (int64_t)v->mem_pos : (whence & 3) == SEEK_END ? (int64_t)v->mem_len : 0;
    int64_t p = base + off;
    if (p < 0 || p > (int64_t)v->mem_len) return AVERROR(EINVAL);
    v->mem_pos = (size_t)p;
    return p;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static mmc_status push(int64_t **a, int64_t *n, int64_t *cap, int64_t x) {
    if (*n == *cap) {
        int64_t nc = *cap ? *cap * 2 : 256;
        int64_t *na = realloc(*a, sizeof(int64_t) * (size_t)nc);
        if (!na) return mmc_error(MMC_ERR_OOM, "video: out of memory for the frame index");
        *a = na;
        *cap = nc;
    }
    (*a)[(*n)++] = x;
    return MMC_OK;
}

/* Demux every packet of the stream: timestamps, keyframes, and whether they can be trusted. */
static mmc_status scan(mmc_video *v) {
    int64_t cap = 0, kcap = 0;
    bool ok_ts = true;
    mmc_status st;
    for (;;) {
        int r = av_read_frame(v->fmt, v->pkt);
        if (r == AVERROR_EOF) break;
        if (r < 0) {  /* a truncated tail ends the scan; what was read stays usable */
            if (v->n_pts == 0) return averr(MMC_ERR_FORMAT, v, r, "cannot read packets", REENCODE);
            break;
        }
        if (v->pkt->stream_index == v->stream && v->pkt->size > 0 && !(v->pkt->flags & AV_PKT_FLAG_DISCARD)) {
            if (v->n_pts >= MAX_PACKETS) {
                av_packet_unref(v->pkt);
                return mmc_error(MMC_ERR_INVALID, "video %s: more than %lld frames; cut the clip (ffmpeg -ss/-t) first",
                                 v->name, (long long)MAX_PACKETS);
            }
            int64_t t = v->pkt->pts != AV_NOPTS_VALUE ? v->pkt->pts : v->pkt->dts;
            if (v->pkt->pts == AV_NOPTS_VALUE) ok_ts = false;   /* frames are matched by pts */
            if ((st = push(&v->pts, &v->n_pts, &cap, t))) { av_packet_unref(v->pkt); return st; }
            if ((v->pkt->flags & AV_PKT_FLAG_KEY) && t != AV_NOPTS_VALUE &&
                (st = push(&v->key_pts, &v->n_key, &kcap, t))) { av_packet_unref(v->pkt); return st; }
        }
        av_packet_unref(v->pkt);
    }
    if (ok_ts && v->n_pts > 0) {
        qsort(v->pts, (size_t)v->n_pts, sizeof(int64_t), cmp_i64);
        if (v->n_key) qsort(v->key_pts, (size_t)v->n_key, sizeof(int64_t), cmp_i64);   /* NULL when none */
        for (int64_t i = 1; i < v->n_pts; i++)
            if (v->pts[i] == v->pts[i - 1]) ok_ts = false;
    }
    /* GIF frames may draw over the previous ones whatever the demuxer flags: decode in order */
    v->info.seekable = ok_ts && v->n_key > 0 && v->fmt->pb && v->fmt->pb->seekable &&
                       strcmp(v->fmt->iformat->name, "gif") != 0;
    return MMC_OK;
}

/* MP4 / MOV with one video stream whose header gives the codec, the frame size and the
 * average rate (the demuxer computes it from the sample table, and avformat_find_stream_info
 * keeps a rate it finds set): probing would add nothing this reader uses, only decode the
 * stream's first frames (seven for H.264, to guess its reorder delay, which the decoder learns
 * anyway; the frames it gives do not depend on it). Other containers are probed as PyAV does. */
static bool header_complete(const AVFormatContext *fmt) {
    if (strcmp(fmt->iformat->name, "mov,mp4,m4a,3gp,3g2,mj2") != 0) return false;
    int nv = 0;
    const AVStream *s = NULL;
    for (unsigned i = 0; i < fmt->nb_streams; i++)
        if (fmt->streams[i]->codecpar->codec_type == AVMEDIA_TYPE_VIDEO) { nv++; s = fmt->streams[i]; }
    return nv == 1 && s->codecpar->codec_id != AV_CODEC_ID_NONE && s->codecpar->width > 0 && s->codecpar->height > 0 &&
           s->avg_frame_rate.num > 0 && s->avg_frame_rate.den > 0 && s->nb_frames > 0 &&
           !(s->disposition & AV_DISPOSITION_ATTACHED_PIC);
}

static mmc_status open_common(mmc_video *v) {
    mmc_status st;
    int r;
    if (!header_complete(v->fmt) && (r = avformat_find_stream_info(v->fmt, NULL)) < 0)
        return averr(MMC_ERR_FORMAT, v, r, "cannot read the stream headers", REENCODE);
    r = av_find_best_stream(v->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (r < 0) return mmc_error(MMC_ERR_FORMAT, "video %s: no video stream (an audio-only or non-media file?)", v->name);
    v->stream = r;
    AVStream *s = v->fmt->streams[r];
    const AVCodec *codec = avcodec_find_decoder(s->codecpar->codec_id);
    if (!codec)
        return mmc_error(MMC_ERR_UNSUPPORTED, "video %s: no decoder for codec '%s' in this FFmpeg; re-encode it "
                         "(ffmpeg -i IN -c:v libx264 OUT.mp4)", v->name, avcodec_get_name(s->codecpar->codec_id));
    int w = s->codecpar->width, h = s->codecpar->height;
    if (w <= 0 || h <= 0 || w > MAX_SIDE || h > MAX_SIDE)
        return mmc_error(MMC_ERR_FORMAT, "video %s: frame size %dx%d is %s (at most %d per side); %s", v->name, w, h,
                         w <= 0 || h <= 0 ? "missing" : "too large", MAX_SIDE,
                         w <= 0 || h <= 0 ? REENCODE : "scale it down first (ffmpeg -vf scale=-2:1080)");
    if (!(v->dec = avcodec_alloc_context3(codec)) || !(v->pkt = av_packet_alloc()) || !(v->frame = av_frame_alloc()))
        return mmc_error(MMC_ERR_OOM, "video %s: out of memory", v->name);
    if ((r = avcodec_parameters_to_context(v->dec, s->codecpar)) < 0)
        return averr(MMC_ERR_FORMAT, v, r, "bad codec parameters", REENCODE);
    v->dec->thread_count = 0;   /* FFmpeg picks (as PyAV); the output does not depend on it */
    if ((r = avcodec_open2(v->dec, codec, NULL)) < 0) return averr(MMC_ERR_FORMAT, v, r, "cannot open the decoder", REENCODE);
    v->info.width = w;
    v->info.height = h;
    snprintf(v->info.codec, sizeof v->info.codec, "%s", codec->name);
    snprintf(v->info.container, sizeof v->info.container, "%s", v->fmt->iformat->name);
    char *comma = strchr(v->info.container, ',');
    if (comma) *comma = 0;
    AVRational fr = s->avg_frame_rate;
    v->info.fps = fr.num > 0 && fr.den > 0 ? av_q2d(fr) : 0;
    if ((st = scan(v))) return st;
    if (v->n_pts == 0)
        return mmc_error(MMC_ERR_FORMAT, "video %s: the video stream has no frames; %s", v->name, REENCODE);
    /* PyAV's stream.frames: the header's count when there is one */
    v->info.total_frames = s->nb_frames > 0 && s->nb_frames <= MAX_PACKETS ? s->nb_frames : v->n_pts;
    if (v->info.fps == 0 && v->fmt->duration > 0 && v->info.total_frames > 1)   /* GIF without a rate */
        v->info.fps = (double)v->info.total_frames / ((double)v->fmt->duration / AV_TIME_BASE);
    if ((r = av_seek_frame(v->fmt, v->stream, v->n_pts ? v->pts[0] : 0, AVSEEK_FLAG_BACKWARD)) < 0 &&
        (r = avformat_seek_file(v->fmt, -1, INT64_MIN, 0, 0, 0)) < 0) {
        v->info.seekable = false;
        return averr(MMC_ERR_IO, v, r, "cannot rewind after reading the index", REENCODE);
    }
    v->cur_pts = v->drain_pts = INT64_MIN;
    v->at_start = true;
    const char *skip = getenv("MMC_VIDEO_SKIP");   /* "0": decode every packet (a check, or a timing) */
    v->decode_all = skip && strcmp(skip, "0") == 0;
    return MMC_OK;
}

/* Containers a video can come in. A whitelist, not FFmpeg's every demuxer: playlists (HLS, DASH,
 * concat) would open other files or URLs named inside the file, and image/audio demuxers have
 * no business here. The protocol is "file" only, for the same reason. */
#define CONTAINERS "mov,mp4,matroska,webm,avi,gif,mpegts,mpeg,flv,ogg,asf,nut,h264,hevc,m4v,ivf,mjpeg"

static AVDictionary *open_opts(void) {
    AVDictionary *o = NULL;
    av_dict_set(&o, "format_whitelist", CONTAINERS, 0);
    av_dict_set(&o, "protocol_whitelist", "file", 0);
    return o;
}

static void set_name(mmc_video *v, const char *name) { snprintf(v->name, sizeof v->name, "%s", name ? name : "(memory)"); }

static void quiet_once(void) {
    static int done;
    if (!done) { av_log_set_level(AV_LOG_QUIET); done = 1; }
}

mmc_status mmc_video_open(const char *path, mmc_video **out) {
    *out = NULL;
    quiet_once();
    mmc_video *v = calloc(1, sizeof *v);
    if (!v) return mmc_error(MMC_ERR_OOM, "video %s: out of memory", path);
    set_name(v, path);
    if (!(v->path = strdup(path))) { free(v); return mmc_error(MMC_ERR_OOM, "video %s: out of memory", path); }
    AVDictionary *opts = open_opts();
    int r = avformat_open_input(&v->fmt, path, NULL, &opts);
    av_dict_free(&opts);
    mmc_status st;
    if (r < 0) st = averr(r == AVERROR(ENOENT) ? MMC_ERR_NOT_FOUND : MMC_ERR_FORMAT, v, r, "cannot open",
                          r == AVERROR(ENOENT) ? "check the path" : REENCODE);
    else st = open_common(v);
    if (st) { mmc_video_close(v); return st; }
    *out = v;
    return MMC_OK;
}

mmc_status mmc_video_open_mem(const void *data, size_t len, const char *name, mmc_video **out) {
    *out = NULL;
    quiet_once();
    mmc_video *v = calloc(1, sizeof *v);
    if (!v) return mmc_error(MMC_ERR_OOM, "video: out of memory");
    set_name(v, name);
    v->mem = data;
    v->mem_len = len;
    mmc_status st;
    uint8_t *buf = av_malloc(4096);
    if (!buf || !(v->mem_io = avio_alloc_context(buf, 4096, 0, v, mem_read, NULL, mem_seek)) ||
        !(v->fmt = avformat_alloc_context())) {
        if (!v->mem_io) av_free(buf);
        mmc_video_close(v);
        return mmc_error(MMC_ERR_OOM, "video %s: out of memory", v->name);
    }
    v->fmt->pb = v->mem_io;
    v->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    AVDictionary *opts = open_opts();
    int r = avformat_open_input(&v->fmt, NULL, NULL, &opts);   /* frees fmt on failure */
    av_dict_free(&opts);
    if (r < 0) st = averr(MMC_ERR_FORMAT, v, r, "cannot open", REENCODE);
    else st = open_common(v);
    if (st) { mmc_video_close(v); return st; }
    *out = v;
    return MMC_OK;
}

const mmc_video_info *mmc_video_get_info(const mmc_video *v) { return &v->info; }

void mmc_video_set_skipping(mmc_video *v, bool on) { v->decode_all = !on; }

int64_t mmc_video_frames_decoded(const mmc_video *v) { return v->n_decoded; }

void mmc_video_close(mmc_video *v) {
    if (!v) return;
    sws_freeContext(v->sws);
    mmc_image_free(&v->rgb);
    av_frame_free(&v->frame);
    av_packet_free(&v->pkt);
    avcodec_free_context(&v->dec);
    avcodec_free_context(&v->dec_alt);
    avformat_close_input(&v->fmt);
    if (v->mem_io) {
        av_freep(&v->mem_io->buffer);
        avio_context_free(&v->mem_io);
    }
    if (!v->borrowed) {
        free(v->pts);
        free(v->key_pts);
    }
    free(v->path);
    free(v);
}

/* Next decoded frame into v->frame. 1: a frame, 0: end of stream, <0: error status. */
static int next_frame(mmc_video *v, mmc_status *st) {
    for (;;) {
        int r = avcodec_receive_frame(v->dec, v->frame);
        if (r == 0) { v->n_decoded++; return 1; }
        if (r == AVERROR_EOF) return 0;
        if (r != AVERROR(EAGAIN)) { *st = averr(MMC_ERR_FORMAT, v, r, "decoding failed", REENCODE); return -1; }
        if (v->eof) return 0;
        r = av_read_frame(v->fmt, v->pkt);
        if (r < 0) {   /* end (or a truncated tail): drain the decoder */
            v->eof = true;
            avcodec_send_packet(v->dec, NULL);
            continue;
        }
        if (v->pkt->stream_index == v->stream) {
            /* frames no other frame refers to are only decoded when wanted (same output, less work:
             * most B-frames of a typical H.264/HEVC stream) */
            v->dec->skip_frame = !v->want || v->decode_all || bsearch(&v->pkt->pts, v->want, (size_t)v->n_want, sizeof(int64_t), cmp_i64)
                                     ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
            r = avcodec_send_packet(v->dec, v->pkt);
            /* a damaged packet is skipped as FFmpeg's tools do; the frame count check catches loss */
            (void)r;
            if (v->pkt->pts == v->drain_pts && v->drain_pts != INT64_MIN) {
                /* every packet this frame depends on precedes it: drain instead of decoding the
                 * packets the decoder's reorder delay would otherwise take in first */
                v->eof = v->drained = true;
                avcodec_send_packet(v->dec, NULL);
            }
        }
        av_packet_unref(v->pkt);
    }
}

static mmc_status to_rgb(mmc_video *v, mmc_image *img) {
    AVFrame *f = v->frame;
    if (f->width <= 0 || f->height <= 0 || f->width > MAX_SIDE || f->height > MAX_SIDE || f->format < 0)
        return mmc_error(MMC_ERR_FORMAT, "video %s: decoded a frame of size %dx%d; %s", v->name, f->width, f->height,
                         REENCODE);
    if (f->width != v->info.width || f->height != v->info.height)
        return mmc_error(MMC_ERR_UNSUPPORTED, "video %s: the frame size changes mid-stream (%dx%d, then %dx%d); "
                         "re-encode it at one size (ffmpeg -i IN -vf scale=%d:%d OUT.mp4)", v->name, v->info.width,
                         v->info.height, f->width, f->height, v->info.width, v->info.height);
    v->sws = sws_getCachedContext(v->sws, f->width, f->height, f->format, f->width, f->height, AV_PIX_FMT_RGB24,
                                  SWS_BILINEAR, NULL, NULL, NULL);
    if (!v->sws)
        return mmc_error(MMC_ERR_UNSUPPORTED, "video %s: cannot convert pixel format %s to RGB", v->name,
                         av_get_pix_fmt_name(f->format) ? av_get_pix_fmt_name(f->format) : "?");
    /* the frame's colour space and range, as sws_scale_frame (PyAV) reads them */
    int cs = SWS_CS_DEFAULT;
    switch (f->colorspace) {
    case AVCOL_SPC_BT709: cs = SWS_CS_ITU709; break;
    case AVCOL_SPC_FCC: cs = SWS_CS_FCC; break;
    case AVCOL_SPC_SMPTE240M: cs = SWS_CS_SMPTE240M; break;
    case AVCOL_SPC_BT2020_NCL: case AVCOL_SPC_BT2020_CL: cs = SWS_CS_BT2020; break;
    default: break;
    }
    int *inv, *tab, src_range, dst_range, bri, con, sat;
    if (sws_getColorspaceDetails(v->sws, &inv, &src_range, &tab, &dst_range, &bri, &con, &sat) >= 0) {
        int full = f->color_range == AVCOL_RANGE_JPEG ? 1 : src_range;
        sws_setColorspaceDetails(v->sws, sws_getCoefficients(cs), full, tab, dst_range, bri, con, sat);
    }
    mmc_status st = img->data ? MMC_OK : mmc_image_alloc(img, f->height, f->width);   /* reused: the same size */
    if (st) return st;
    uint8_t *dst[4] = {img->data, NULL, NULL, NULL};
    int stride[4] = {3 * f->width, 0, 0, 0};
    int h = sws_scale(v->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, dst, stride);
    if (h != f->height) {
        if (img != &v->rgb) mmc_image_free(img);
        return mmc_error(MMC_ERR_FORMAT, "video %s: colour conversion failed", v->name);
    }
    return MMC_OK;
}

/* Frame k of the request, decoded into v->frame: to its sink. */
static mmc_status emit(mmc_video *v, const sink_t *sk, int k) {
    if (sk->frames) return to_rgb(v, &sk->frames[k]);
    if (!sk->fn) return MMC_OK;   /* mmc_video_decode_only: the decoder's share alone */
    mmc_status st = to_rgb(v, &v->rgb);
    return st ? st : sk->fn(sk->ctx, v->worker, k, &v->rgb);
}

static int64_t frame_ts(const AVFrame *f) { return f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp; }

/* A drained decoder still holds decoded frames past the last one received (the reference
 * frames its reorder delay kept back): count them as decoded, as they were (no decoding is
 * left to do once the packet drained at was output). Nothing happens on an undrained one. */
static void count_held(mmc_video *v) {
    if (!v->dec || !v->drained) return;
    while (avcodec_receive_frame(v->dec, v->frame) == 0) {
        v->n_decoded++;
        av_frame_unref(v->frame);
    }
}

static mmc_status rewind_to(mmc_video *v, int64_t ts) {
    count_held(v);
    int r = av_seek_frame(v->fmt, v->stream, ts, AVSEEK_FLAG_BACKWARD);
    if (r < 0) return averr(MMC_ERR_IO, v, r, "seek failed", REENCODE);
    avcodec_flush_buffers(v->dec);
    v->eof = v->drained = false;
    v->cur_pts = INT64_MIN;
    v->seq_index = 0;
    return MMC_OK;
}

/* Sequential mode: decode from the start, counting frames, as PyAV's read_video_pyav. */
static mmc_status read_sequential(mmc_video *v, const int64_t *idx, int n, const sink_t *sk) {
    mmc_status st = MMC_OK;
    if (!v->at_start && (st = rewind_to(v, v->n_pts ? v->pts[0] : 0))) return st;
    v->at_start = false;
    v->seq_index = 0;
    for (int k = 0; k < n; k++) {
        for (;;) {
            int r = next_frame(v, &st);
            if (r < 0) return st;
            if (r == 0)
                return mmc_error(MMC_ERR_FORMAT, "video %s: frame %lld of %lld could not be decoded (the file is "
                                 "truncated or damaged after frame %lld); %s", v->name, (long long)idx[k],
                                 (long long)v->info.total_frames, (long long)v->seq_index, REENCODE);
            int64_t i = v->seq_index++;
            if (i == idx[k]) { st = emit(v, sk, k); av_frame_unref(v->frame); break; }
            av_frame_unref(v->frame);
        }
        if (st) return st;
    }
    return MMC_OK;
}

/* The last keyframe at or before ts (binary search); INT64_MIN if none. */
static int64_t key_before(const mmc_video *v, int64_t ts) {
    int64_t lo = 0, hi = v->n_key;   /* first key > ts */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (v->key_pts[mid] <= ts) lo = mid + 1;
        else hi = mid;
    }
    return lo ? v->key_pts[lo - 1] : INT64_MIN;
}

/* Decode the frame with timestamp `want` (frame idx) into *out: seek to the keyframe before
 * it unless decoding forward from the last frame gets there without passing one. `last`: no
 * frame after this one is reached by decoding forward (the next wanted frame, if any, lies
 * behind a later keyframe), so the decoder is drained once this frame's packet is in: the
 * frames decoded are the same, less the packets behind it that the reorder delay reads. */
static mmc_status seek_one(mmc_video *v, int64_t idx, int64_t want, bool last, const sink_t *sk, int k) {
    mmc_status st = MMC_OK;
    int64_t key = key_before(v, want);
    if (key == INT64_MIN) key = v->pts[0];
    /* decode forward when no keyframe lies between the last decoded frame and the target */
    bool forward = v->cur_pts != INT64_MIN && v->cur_pts < want && key <= v->cur_pts && !v->drained;
    if (!forward && !(v->at_start && key <= v->pts[0])) {
        if ((st = rewind_to(v, key))) return st;
    }
    v->at_start = false;
    v->drain_pts = last && !v->decode_all ? want : INT64_MIN;
    for (;;) {
        int r = next_frame(v, &st);
        if (r < 0) return st;
        if (r == 0)
            return mmc_error(MMC_ERR_FORMAT, "video %s: frame %lld (timestamp %lld) could not be decoded (the "
                             "file is truncated or damaged); %s", v->name, (long long)idx, (long long)want, REENCODE);
        int64_t t = frame_ts(v->frame);
        if (t != AV_NOPTS_VALUE) v->cur_pts = t;
        if (t == want) { st = emit(v, sk, k); av_frame_unref(v->frame); return st; }
        av_frame_unref(v->frame);
        if (t != AV_NOPTS_VALUE && t > want)
            return mmc_error(MMC_ERR_FORMAT, "video %s: frame %lld (timestamp %lld) is missing from the decoded "
                             "stream; %s", v->name, (long long)idx, (long long)want, REENCODE);
    }
}

/* Frames k0 .. k0+n of the request (idx, want: theirs). */
static mmc_status read_seek(mmc_video *v, const int64_t *idx, const int64_t *want, int n, const sink_t *sk, int k0) {
    mmc_status st = MMC_OK;
    for (int k = 0; k < n && !st; k++)
        st = seek_one(v, idx[k], want[k], k == n - 1 || key_before(v, want[k + 1]) > want[k], sk, k0 + k);
    return st;
}

/* A reader of the same file for one decoding thread: its own demuxer (a second open of the
 * file, or its own I/O over the caller's buffer), a single-threaded decoder set up from the
 * parent's codec parameters, the parent's frame index borrowed. */
static mmc_status reader_open(const mmc_video *v, mmc_video **out) {
    *out = NULL;
    mmc_video *w = calloc(1, sizeof *w);
    if (!w) return mmc_error(MMC_ERR_OOM, "video %s: out of memory", v->name);
    memcpy(w->name, v->name, sizeof w->name);
    w->borrowed = true;
    w->pts = v->pts;
    w->n_pts = v->n_pts;
    w->key_pts = v->key_pts;
    w->n_key = v->n_key;
    w->info = v->info;
    w->stream = v->stream;
    w->mem = v->mem;
    w->mem_len = v->mem_len;
    mmc_status st;
    int r;
    AVDictionary *opts = open_opts();
    if (v->mem) {
        uint8_t *buf = av_malloc(4096);
        if (!buf || !(w->mem_io = avio_alloc_context(buf, 4096, 0, w, mem_read, NULL, mem_seek)) ||
            !(w->fmt = avformat_alloc_context())) {
            if (!w->mem_io) av_free(buf);
            av_dict_free(&opts);
            st = mmc_error(MMC_ERR_OOM, "video %s: out of memory", v->name);
            goto fail;
        }
        w->fmt->pb = w->mem_io;
        w->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
        r = avformat_open_input(&w->fmt, NULL, v->fmt->iformat, &opts);
    } else {
        r = avformat_open_input(&w->fmt, v->path, v->fmt->iformat, &opts);
    }
    av_dict_free(&opts);
    if (r < 0) { st = averr(MMC_ERR_IO, v, r, "cannot reopen for a decoding thread", REENCODE); goto fail; }
    const AVCodecParameters *par = v->fmt->streams[v->stream]->codecpar;
    /* the same demuxer on the same bytes numbers the streams alike; where streams only appear
     * once packets are read (MPEG-TS), probe as the parent did */
    if ((unsigned)w->stream >= w->fmt->nb_streams && (r = avformat_find_stream_info(w->fmt, NULL)) < 0) {
        st = averr(MMC_ERR_FORMAT, v, r, "cannot read the stream headers again", REENCODE);
        goto fail;
    }
    if ((unsigned)w->stream >= w->fmt->nb_streams || w->fmt->streams[w->stream]->codecpar->codec_id != par->codec_id) {
        st = mmc_error(MMC_ERR_FORMAT, "video %s: a second reader of the file sees other streams", v->name);
        goto fail;
    }
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    if (!codec || !(w->dec = avcodec_alloc_context3(codec)) || !(w->pkt = av_packet_alloc()) ||
        !(w->frame = av_frame_alloc())) {
        st = mmc_error(MMC_ERR_OOM, "video %s: out of memory", v->name);
        goto fail;
    }
    if ((r = avcodec_parameters_to_context(w->dec, par)) < 0) { st = averr(MMC_ERR_FORMAT, v, r, "bad codec parameters", REENCODE); goto fail; }
    w->dec->thread_count = 1;   /* the threads decode segments side by side */
    if ((r = avcodec_open2(w->dec, codec, NULL)) < 0) { st = averr(MMC_ERR_FORMAT, v, r, "cannot open the decoder", REENCODE); goto fail; }
    w->cur_pts = w->drain_pts = INT64_MIN;
    w->at_start = true;
    w->decode_all = v->decode_all;
    *out = w;
    return MMC_OK;
fail:
    mmc_video_close(w);
    return st;
}

/* Switch thread reader r to a frame-threaded decoder of `threads` threads (opened on first
 * use; FFmpeg's frame threading gives the frames single-threaded decoding gives). The next
 * frame is reached by a seek, which flushes it. Stays on the single-threaded one if it cannot
 * be opened. */
static void use_frame_threads(mmc_video *r, const mmc_video *v, int threads) {
    if (r->dec_alt) return;   /* already on it */
    const AVCodecParameters *par = v->fmt->streams[v->stream]->codecpar;
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    AVCodecContext *d = codec ? avcodec_alloc_context3(codec) : NULL;
    if (!d) return;
    if (avcodec_parameters_to_context(d, par) < 0) { avcodec_free_context(&d); return; }
    d->thread_count = threads;
    d->thread_type = FF_THREAD_FRAME;
    if (avcodec_open2(d, codec, NULL) < 0) { avcodec_free_context(&d); return; }
    count_held(r);
    r->dec_alt = r->dec;
    r->dec = d;
    /* nothing is decoded forward on the new decoder: the next frame is reached by a seek
     * (or, for a reader that has read nothing yet, from the start) */
    r->cur_pts = INT64_MIN;
    r->drained = false;
}

/* Keyframe segments over threads: seg[s] is the first wanted frame behind segment s's
 * keyframe. Returns 1 when done (st says how), 0 when this path does not apply (one segment,
 * one thread, or a thread reader could not be opened) and nothing was decoded. */
static int read_parallel(mmc_video *v, const int64_t *idx, const int64_t *want, int n, const sink_t *sk,
                         mmc_status *st_out) {
#ifdef _OPENMP
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    int threads = 1;
#endif
    if (threads < 2 || n < 2) return 0;
    int *seg = malloc(sizeof(int) * (size_t)(n + 1));
    if (!seg) return 0;
    int nseg = 0;
    int64_t prev = INT64_MIN;
    for (int k = 0; k < n; k++) {
        int64_t key = key_before(v, want[k]);
        if (k == 0 || key != prev) seg[nseg++] = k;
        prev = key;
    }
    seg[nseg] = n;
    int nw = threads < nseg ? threads : nseg;
    /* threads that would wait for want of a segment (fewer segments than threads, or the last
     * round of segments) lend themselves to frame threading: those segments get threads / k
     * decoding threads each, k the segments decoded at that time */
    int left = nseg % nw, mt_all = threads / nw, mt_last = left ? threads / left : mt_all;
    if (nw < 2) { free(seg); return 0; }
    mmc_video **w = calloc((size_t)nw, sizeof *w);
    int opened = 0;
    for (; w && opened < nw; opened++)
        if (reader_open(v, &w[opened])) break;
        else w[opened]->worker = opened;
    if (!w || opened < nw) {   /* the one-reader path still works */
        for (int i = 0; w && i < opened; i++) mmc_video_close(w[i]);
        free(w);
        free(seg);
        return 0;
    }
    int err = 0;   /* the first failure's status; its message (set in its thread) in msg */
    char msg[1024] = {0};
#ifdef _OPENMP
#pragma omp parallel for num_threads(nw) schedule(dynamic, 1)
#endif
    for (int s = 0; s < nseg; s++) {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        mmc_video *r = w[t];
        int mt = s >= nseg - left ? mt_last : mt_all;
        if (mt >= 2) use_frame_threads(r, v, mt);
        r->want = want;
        r->n_want = n;
        int failed;
#ifdef _OPENMP
#pragma omp atomic read
#endif
        failed = err;
        mmc_status e = failed ? MMC_OK : read_seek(r, idx + seg[s], want + seg[s], seg[s + 1] - seg[s], sk, seg[s]);
        r->want = NULL;
        if (e) {
#ifdef _OPENMP
#pragma omp critical(mmc_video_err)
#endif
            {
                if (!err) {
                    snprintf(msg, sizeof msg, "%s", mmc_last_error());
#ifdef _OPENMP
#pragma omp atomic write
#endif
                    err = (int)e;
                }
            }
        }
    }
    for (int i = 0; i < nw; i++) {
        count_held(w[i]);
        v->n_decoded += w[i]->n_decoded;
        mmc_video_close(w[i]);
    }
    free(w);
    free(seg);
    *st_out = err ? mmc_error((mmc_status)err, "%s", msg) : MMC_OK;   /* the message into this thread's error */
    return 1;
}

int mmc_video_read_workers(void) {
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

static mmc_status read_frames(mmc_video *v, const int64_t *idx, int n, const sink_t *sk) {
    mmc_image *frames = sk->frames;
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "video %s: no frames asked for", v->name);
    for (int k = 0; k < n; k++) {
        if (idx[k] < 0 || idx[k] >= v->info.total_frames || (k && idx[k] <= idx[k - 1]))
            return mmc_error(MMC_ERR_INVALID, "video %s: frame index %lld is out of range or out of order "
                             "(%lld frames)", v->name, (long long)idx[k], (long long)v->info.total_frames);
        if (idx[k] >= v->n_pts)
            return mmc_error(MMC_ERR_FORMAT, "video %s: the header counts %lld frames but the file holds %lld "
                             "(truncated?); %s", v->name, (long long)v->info.total_frames, (long long)v->n_pts, REENCODE);
    }
    if ((double)n * v->info.width * v->info.height > (double)MMC_VIDEO_MAX_TOTAL_PIXELS)
        return mmc_error(MMC_ERR_INVALID, "video %s: %d frames of %dx%d is beyond the decode bound of %lld pixels; "
                         "sample fewer frames (--video-fps, --video-max-frames) or scale the video down",
                         v->name, n, v->info.width, v->info.height, (long long)MMC_VIDEO_MAX_TOTAL_PIXELS);
    if (frames) memset(frames, 0, sizeof *frames * (size_t)n);
    mmc_status st = MMC_OK;
    if (v->info.seekable) {
        int64_t *want = malloc(sizeof(int64_t) * (size_t)n);   /* the pts of each wanted frame, ascending */
        if (!want) return mmc_error(MMC_ERR_OOM, "video %s: out of memory", v->name);
        for (int k = 0; k < n; k++) want[k] = v->pts[idx[k]];
        if (!read_parallel(v, idx, want, n, sk, &st)) {
            v->want = want;
            v->n_want = n;
            st = read_seek(v, idx, want, n, sk, 0);
            v->want = NULL;
            if (!st) count_held(v);
        }
        free(want);
    } else {
        st = read_sequential(v, idx, n, sk);
    }
    if (st) {
        for (int k = 0; frames && k < n; k++) mmc_image_free(&frames[k]);
        v->cur_pts = INT64_MIN;
    }
    return st;
}

mmc_status mmc_video_read(mmc_video *v, const int64_t *idx, int n, mmc_image *frames) {
    sink_t sk = {.frames = frames};
    return read_frames(v, idx, n, &sk);
}

mmc_status mmc_video_read_each(mmc_video *v, const int64_t *idx, int n, mmc_video_frame_fn fn, void *ctx) {
    if (!fn) return mmc_error(MMC_ERR_INVALID, "video %s: no frame callback", v->name);
    sink_t sk = {.fn = fn, .ctx = ctx};
    v->worker = 0;
    return read_frames(v, idx, n, &sk);
}

mmc_status mmc_video_decode_only(mmc_video *v, const int64_t *idx, int n) {
    sink_t sk = {0};
    v->worker = 0;
    return read_frames(v, idx, n, &sk);
}
