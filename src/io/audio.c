/* audio.c — audio files through FFmpeg: libavformat demuxes the first (best) audio stream of
 * any container it knows (WAV, FLAC, MP3, OGG/Opus/Vorbis, M4A/AAC, and the sound track of
 * MP4/MKV/WebM/AVI videos), libavcodec decodes it, libswresample downmixes to mono and
 * resamples to the rate the model takes.
 *
 * What it mirrors: transformers' `load_audio` / `librosa.load(path, sr=16000)` — channels
 * averaged (mono = mean of the channels, librosa's to_mono), then resampled with soxr at
 * "HQ" quality. libswresample here runs the same libsoxr engine ("resampler=soxr",
 * precision 20 bits = SOXR_HQ, its default passband), so the 16 kHz samples agree with
 * librosa's to about 1e-6 (the README's "Audio input" section has the measured figures,
 * tools/ref/gen_audio.py measures them). When the file is already at the target rate no
 * resampling happens and a 16-bit WAV gives exactly (sum of channels / C) / 32768.
 *
 * Limits: the stream is refused (before anything large is allocated where the header tells
 * the duration, else as soon as the decoded length passes it) beyond MMC_AUDIO_MAX_SECONDS, or
 * the caller's lower limit (mmc_audio_load_max / _mem_max: `mmc serve --max-audio-seconds`);
 * a file whose header promises much more audio than it holds is reported as truncated rather
 * than returned short.
 */
#include "mmc_audio.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_CHANNELS 64
#define MIN_RATE 1000
#define MAX_RATE 768000

/* Containers audio comes in (names as FFmpeg's demuxers spell them). A whitelist, not every
 * demuxer FFmpeg has: playlists (HLS, DASH, concat) would open other files or URLs named
 * inside the file; the protocol is "file" only for the same reason. */
#define CONTAINERS "wav,w64,flac,mp3,ogg,mov,mp4,m4a,3gp,matroska,webm,aac,avi,asf,mpegts,mpeg,flv,nut," \
                   "aiff,au,caf,wv,ape,amr,tta,mpc,ac3,eac3,dts,truehd,mlp,loas,latm,opus,s16le,voc"

#define REENCODE "the file is damaged or not an audio file; re-encode it (ffmpeg -i IN -ac 1 -ar 16000 OUT.wav)"

typedef struct {
    const char *name;
    const uint8_t *mem;
    size_t mem_len, mem_pos;
    AVFormatContext *fmt;
    AVIOContext *mem_io;
    AVCodecContext *dec;
    AVPacket *pkt;
    AVFrame *frame;
    SwrContext *swr;
    int stream;
    int target_rate;
    /* what swr was set up for; a change mid-stream rebuilds it */
    int swr_rate, swr_fmt;
    AVChannelLayout swr_layout;
    float *out;           /* [cap] mono samples at target_rate */
    int64_t n, cap, max_n;
    double max_seconds;   /* the limit (MMC_AUDIO_MAX_SECONDS, or a caller's lower one) */
    int64_t src_samples;  /* decoded samples per channel at the source rate */
    int src_rate, src_channels;
    struct pipe_t *pipe;  /* decoder thread's queue (decode_pipelined) */
} reader;

static mmc_status averr(mmc_status st, const reader *r, int err, const char *what, const char *hint) {
    char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
    av_strerror(err, buf, sizeof buf);
    return mmc_error(st, "audio %s: %s (%s)%s%s", r->name, what, buf, hint ? "; " : "", hint ? hint : "");
}

static int mem_read(void *opaque, uint8_t *buf, int size) {
    reader *r = opaque;
    size_t left = r->mem_len - r->mem_pos;
    if (left == 0) return AVERROR_EOF;
    if ((size_t)size > left) size = (int)left;
    memcpy(buf, r->mem + r->mem_pos, (size_t)size);
    r->mem_pos += (size_t)size;
    return size;
}

static int64_t mem_seek(void *opaque, int64_t off, int whence) {
    reader *r = opaque;
    if (whence & AVSEEK_SIZE) return (int64_t)r->mem_len;
    int64_t base = (whence & 3) == SEEK_CUR ? (int64_t)r->mem_pos : (whence & 3) == SEEK_END ? (int64_t)r->mem_len : 0;
    int64_t p = base + off;
    if (p < 0 || p > (int64_t)r->mem_len) return AVERROR(EINVAL);
    r->mem_pos = (size_t)p;
    return p;
}

static void quiet_once(void) {
    static int done;
    if (!done) { av_log_set_level(AV_LOG_QUIET); done = 1; }
}

static void reader_close(reader *r) {
    swr_free(&r->swr);
    av_channel_layout_uninit(&r->swr_layout);
    av_frame_free(&r->frame);
    av_packet_free(&r->pkt);
    avcodec_free_context(&r->dec);
    avformat_close_input(&r->fmt);
    if (r->mem_io) {
        av_freep(&r->mem_io->buffer);
        avio_context_free(&r->mem_io);
    }
    free(r->out);
}

static mmc_status too_long(const reader *r, double seconds) {
    if (r->max_seconds < MMC_AUDIO_MAX_SECONDS)   /* a caller's limit (a server's, say) */
        return mmc_error(MMC_ERR_INVALID, "audio %s: %.1f s of audio is longer than the %g s allowed here; send a "
                         "shorter clip", r->name, seconds, r->max_seconds);
    return mmc_error(MMC_ERR_INVALID, "audio %s: %.0f s of audio is longer than the %d s this reader decodes at once; "
                     "cut it into pieces first (ffmpeg -i IN -f segment -segment_time 3600 -c copy OUT%%03d.EXT)",
                     r->name, seconds, MMC_AUDIO_MAX_SECONDS);
}

/* What the limit lets pass beyond itself: 1 s for the reader's own, 0.1 s (encoder padding) for a
 * caller's. */
static double slack(const reader *r) { return r->max_seconds < MMC_AUDIO_MAX_SECONDS ? 0.1 : 1.0; }

/* Room for k more output samples, refusing past the limit. */
static mmc_status reserve(reader *r, int64_t k) {
    if (r->n + k > r->max_n) return too_long(r, (double)(r->n + k) / r->target_rate);
    if (r->n + k <= r->cap) return MMC_OK;
    int64_t nc = r->cap ? r->cap : 1 << 16;
    while (nc < r->n + k) nc *= 2;
    float *p = realloc(r->out, sizeof(float) * (size_t)nc);
    if (!p) return mmc_error(MMC_ERR_OOM, "audio %s: out of memory for %lld samples", r->name, (long long)nc);
    r->out = p;
    r->cap = nc;
    return MMC_OK;
}

/* Run whatever swr holds (in: NULL flushes) into r->out. */
static mmc_status convert(reader *r, const uint8_t **in, int n_in) {
    int want = swr_get_out_samples(r->swr, n_in);
    if (want < 0) return averr(MMC_ERR_FORMAT, r, want, "resampler failed", REENCODE);
    mmc_status st = reserve(r, want + 16);
    if (st) return st;
    uint8_t *dst = (uint8_t *)(r->out + r->n);
    int got = swr_convert(r->swr, &dst, want + 16, in, n_in);
    if (got < 0) return averr(MMC_ERR_FORMAT, r, got, "resampling failed", REENCODE);
    r->n += got;
    return MMC_OK;
}

/* Downmix to mono as the mean of the channels (librosa.to_mono), then resample. The matrix is
 * set by hand: swresample's own stereo->mono matrix weighs each side by 1/sqrt(2). */
static mmc_status setup_swr(reader *r, const AVFrame *f) {
    if (r->swr) {   /* the stream changed format mid-way: drain the old converter first */
        mmc_status st = convert(r, NULL, 0);
        if (st) return st;
        swr_free(&r->swr);
    }
    AVChannelLayout in = {0};
    int C = f->ch_layout.nb_channels;
    if (C <= 0 || C > MAX_CHANNELS)
        return mmc_error(MMC_ERR_FORMAT, "audio %s: %d channels (1 to %d supported); %s", r->name, C, MAX_CHANNELS, REENCODE);
    if (f->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC) av_channel_layout_default(&in, C);
    else if (av_channel_layout_copy(&in, &f->ch_layout) < 0) return mmc_error(MMC_ERR_OOM, "audio %s: out of memory", r->name);
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    int e = swr_alloc_set_opts2(&r->swr, &mono, AV_SAMPLE_FMT_FLT, r->target_rate, &in, f->format, f->sample_rate, 0, NULL);
    mmc_status st = MMC_OK;
    if (e < 0 || !r->swr) { st = averr(MMC_ERR_UNSUPPORTED, r, e, "cannot set up the resampler", REENCODE); goto done; }
    /* libsoxr at HQ (20-bit precision), librosa's default res_type "soxr_hq"; its passband
     * default (cutoff 0.91 of Nyquist when left 0) is soxr's own */
    if (f->sample_rate != r->target_rate) {
        av_opt_set(r->swr, "resampler", "soxr", 0);
        av_opt_set_int(r->swr, "precision", 20, 0);
    }
    double *matrix = malloc(sizeof(double) * (size_t)C);
    if (!matrix) { st = mmc_error(MMC_ERR_OOM, "audio %s: out of memory", r->name); goto done; }
    for (int c = 0; c < C; c++) matrix[c] = 1.0 / C;
    e = swr_set_matrix(r->swr, matrix, C);
    free(matrix);
    if (e >= 0) e = swr_init(r->swr);
    if (e < 0 && f->sample_rate != r->target_rate) {   /* an FFmpeg built without libsoxr: its own filter */
        av_opt_set(r->swr, "resampler", "swr", 0);
        av_opt_set_int(r->swr, "filter_size", 64, 0);
        e = swr_init(r->swr);
    }
    if (e < 0) { st = averr(MMC_ERR_UNSUPPORTED, r, e, "cannot set up the resampler", REENCODE); goto done; }
    r->swr_rate = f->sample_rate;
    r->swr_fmt = f->format;
    av_channel_layout_uninit(&r->swr_layout);
    if (av_channel_layout_copy(&r->swr_layout, &f->ch_layout) < 0) st = mmc_error(MMC_ERR_OOM, "audio %s: out of memory", r->name);
done:
    av_channel_layout_uninit(&in);
    return st;
}

static mmc_status take_frame(reader *r, AVFrame *f) {
    if (f->nb_samples <= 0) return MMC_OK;
    if (f->sample_rate <= 0 || f->sample_rate > MAX_RATE)
        return mmc_error(MMC_ERR_FORMAT, "audio %s: sample rate %d Hz in the stream; %s", r->name, f->sample_rate, REENCODE);
    if (!r->swr || f->sample_rate != r->swr_rate || f->format != r->swr_fmt ||
        av_channel_layout_compare(&f->ch_layout, &r->swr_layout) != 0) {
        mmc_status st = setup_swr(r, f);
        if (st) return st;
        if (!r->src_rate) { r->src_rate = f->sample_rate; r->src_channels = f->ch_layout.nb_channels; }
    }
    r->src_samples += f->nb_samples;
    if ((double)r->src_samples / f->sample_rate > r->max_seconds + slack(r))
        return too_long(r, (double)r->src_samples / f->sample_rate);
    return convert(r, (const uint8_t **)f->extended_data, f->nb_samples);
}

/* Demux and decode every frame of the stream into r->frame, handing each to sink(). */
static mmc_status decode_loop(reader *r, mmc_status (*sink)(reader *, AVFrame *)) {
    mmc_status st;
    int e;
    for (bool eof = false;;) {
        e = avcodec_receive_frame(r->dec, r->frame);
        if (e == 0) {
            st = sink(r, r->frame);
            av_frame_unref(r->frame);
            if (st) return st;
            continue;
        }
        if (e == AVERROR_EOF) break;
        if (e != AVERROR(EAGAIN)) return averr(MMC_ERR_FORMAT, r, e, "decoding failed", REENCODE);
        if (eof) break;
        e = av_read_frame(r->fmt, r->pkt);
        if (e < 0) {   /* end, or a damaged tail: drain the decoder */
            eof = true;
            avcodec_send_packet(r->dec, NULL);
            continue;
        }
        if (r->pkt->stream_index == r->stream) (void)avcodec_send_packet(r->dec, r->pkt);   /* a bad packet is skipped, as ffmpeg does */
        av_packet_unref(r->pkt);
    }
    return MMC_OK;
}

/* With two threads or more, decoding (libavcodec) and resampling (libsoxr) overlap: a
 * decoder thread hands frames over a small queue to the calling thread, which downmixes and
 * resamples them in order. Same output as one thread (each frame goes through the same
 * converter in the same order). */
#define QCAP 32
typedef struct pipe_t {
    pthread_mutex_t mu;
    pthread_cond_t nonempty, nonfull;
    AVFrame *q[QCAP];
    int head, count;
    bool done, stop;
    mmc_status st;          /* the decoder thread's */
    char err[1024];         /* and its message (messages are per thread) */
} pipe_t;

static mmc_status push_frame(reader *r, AVFrame *f) {
    pipe_t *p = r->pipe;
    AVFrame *c = av_frame_alloc();
    if (!c) return mmc_error(MMC_ERR_OOM, "audio %s: out of memory", r->name);
    av_frame_move_ref(c, f);
    pthread_mutex_lock(&p->mu);
    while (p->count == QCAP && !p->stop) pthread_cond_wait(&p->nonfull, &p->mu);
    bool stop = p->stop;
    if (!stop) {
        p->q[(p->head + p->count) % QCAP] = c;
        p->count++;
        pthread_cond_signal(&p->nonempty);
    }
    pthread_mutex_unlock(&p->mu);
    if (stop) { av_frame_free(&c); return MMC_ERR_INVALID; }   /* the consumer failed; its message stands */
    return MMC_OK;
}

static void *decoder_main(void *arg) {
    reader *r = arg;
    pipe_t *p = r->pipe;
    mmc_status st = decode_loop(r, push_frame);
    pthread_mutex_lock(&p->mu);
    p->st = st;
    if (st) snprintf(p->err, sizeof p->err, "%s", mmc_last_error());
    p->done = true;
    pthread_cond_signal(&p->nonempty);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static mmc_status decode_pipelined(reader *r) {
    pipe_t p = {.st = MMC_OK};
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.nonempty, NULL);
    pthread_cond_init(&p.nonfull, NULL);
    r->pipe = &p;
    pthread_t th;
    mmc_status st = MMC_OK;
    if (pthread_create(&th, NULL, decoder_main, r) != 0) {
        st = decode_loop(r, take_frame);   /* no thread to be had: do it in this one */
        goto out;
    }
    for (;;) {
        pthread_mutex_lock(&p.mu);
        while (p.count == 0 && !p.done) pthread_cond_wait(&p.nonempty, &p.mu);
        AVFrame *f = NULL;
        if (p.count) {
            f = p.q[p.head];
            p.head = (p.head + 1) % QCAP;
            p.count--;
            pthread_cond_signal(&p.nonfull);
        }
        pthread_mutex_unlock(&p.mu);
        if (!f) break;   /* done and drained */
        st = take_frame(r, f);
        av_frame_free(&f);
        if (st) {
            pthread_mutex_lock(&p.mu);
            p.stop = true;
            pthread_cond_signal(&p.nonfull);
            pthread_mutex_unlock(&p.mu);
            break;
        }
    }
    pthread_join(th, NULL);
    for (; p.count; p.count--, p.head = (p.head + 1) % QCAP) av_frame_free(&p.q[p.head]);
    if (!st && p.st) st = mmc_error(p.st, "%s", p.err);
out:
    r->pipe = NULL;
    pthread_cond_destroy(&p.nonempty);
    pthread_cond_destroy(&p.nonfull);
    pthread_mutex_destroy(&p.mu);
    return st;
}

static mmc_status decode_all(reader *r, double dur) {
    mmc_status st = (dur >= 0 && dur < 0.5) || mmc_get_num_threads() < 2 ? decode_loop(r, take_frame) : decode_pipelined(r);
    if (!st && r->swr) st = convert(r, NULL, 0);
    return st;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* What FFmpeg's WAV demuxer mends without a word: a data chunk longer than the file (a cut
 * download: it reads what is there) and, less kindly, a zero sample rate (it refuses with
 * "invalid data"). h: the first bytes of the file, size: the whole file's. */
static mmc_status wav_check(const reader *r, const uint8_t *h, size_t hn, int64_t size) {
    if (hn < 12 || memcmp(h, "RIFF", 4) != 0 || memcmp(h + 8, "WAVE", 4) != 0) return MMC_OK;
    uint32_t rate = 0, block = 0;
    for (size_t off = 12; off + 8 <= hn;) {
        uint32_t len = le32(h + off + 4);
        const uint8_t *body = h + off + 8;
        if (memcmp(h + off, "fmt ", 4) == 0 && len >= 16 && off + 8 + 16 <= hn) {
            rate = le32(body + 4);
            block = (uint32_t)body[12] | (uint32_t)body[13] << 8;
            if (rate == 0)
                return mmc_error(MMC_ERR_FORMAT, "audio %s: the WAV header gives a sample rate of 0 Hz; %s", r->name, REENCODE);
        }
        if (memcmp(h + off, "data", 4) == 0) {
            /* 0 and 0xFFFFFFFF: a streamed WAV that never went back to write the size */
            int64_t want = (int64_t)(off + 8) + len;
            if (len != 0 && len != 0xFFFFFFFFu && want > size + 1) {
                double secs = rate && block ? (double)len / block / rate : 0, have = rate && block ? (double)(size - (int64_t)off - 8) / block / rate : 0;
                return mmc_error(MMC_ERR_FORMAT, "audio %s: truncated: the WAV header promises %lld bytes of samples "
                                 "(%.2f s) but the file holds %lld (%.2f s); %s", r->name, (long long)len, secs,
                                 (long long)(size - (int64_t)off - 8), have, REENCODE);
            }
            break;
        }
        off += 8 + (size_t)len + (len & 1);
    }
    return MMC_OK;
}

static mmc_status open_common(reader *r) {
    int e;
    if ((e = avformat_find_stream_info(r->fmt, NULL)) < 0)
        return averr(MMC_ERR_FORMAT, r, e, "cannot read the stream headers", REENCODE);
    e = av_find_best_stream(r->fmt, AVMEDIA_TYPE_AUDIO, -1, -1, NULL, 0);
    if (e < 0) {
        const char *fn = r->fmt->iformat->name, *comma = strchr(fn, ',');
        return mmc_error(MMC_ERR_FORMAT, "audio %s: no audio stream in this %.*s file (a video without sound, or not a "
                         "media file?)", r->name, comma ? (int)(comma - fn) : (int)strlen(fn), fn);
    }
    r->stream = e;
    AVStream *s = r->fmt->streams[e];
    const AVCodec *codec = avcodec_find_decoder(s->codecpar->codec_id);
    if (!codec)
        return mmc_error(MMC_ERR_UNSUPPORTED, "audio %s: no decoder for codec '%s' in this FFmpeg; re-encode it "
                         "(ffmpeg -i IN -ac 1 -ar 16000 OUT.wav)", r->name, avcodec_get_name(s->codecpar->codec_id));
    if (s->codecpar->sample_rate <= 0 || s->codecpar->sample_rate > MAX_RATE)
        return mmc_error(MMC_ERR_FORMAT, "audio %s: the audio stream's sample rate is %d Hz (%s); %s", r->name,
                         s->codecpar->sample_rate, s->codecpar->sample_rate <= 0 ? "zero or missing" : "beyond 768 kHz",
                         REENCODE);
    /* refuse a long file before decoding it, where the header knows its length */
    double dur = -1;
    if (s->duration > 0 && s->time_base.num > 0 && s->time_base.den > 0) dur = (double)s->duration * av_q2d(s->time_base);
    else if (r->fmt->duration > 0) dur = (double)r->fmt->duration / AV_TIME_BASE;
    if (dur > r->max_seconds + slack(r)) return too_long(r, dur);
    if (!(r->dec = avcodec_alloc_context3(codec)) || !(r->pkt = av_packet_alloc()) || !(r->frame = av_frame_alloc()))
        return mmc_error(MMC_ERR_OOM, "audio %s: out of memory", r->name);
    if ((e = avcodec_parameters_to_context(r->dec, s->codecpar)) < 0)
        return averr(MMC_ERR_FORMAT, r, e, "bad codec parameters", REENCODE);
    r->dec->thread_count = 1;
    if ((e = avcodec_open2(r->dec, codec, NULL)) < 0) return averr(MMC_ERR_FORMAT, r, e, "cannot open the decoder", REENCODE);
    for (unsigned i = 0; i < r->fmt->nb_streams; i++)   /* demux only the stream we decode */
        if ((int)i != r->stream) r->fmt->streams[i]->discard = AVDISCARD_ALL;
    if (dur > 0) {   /* the whole output at once where the header knows the length */
        mmc_status st = reserve(r, (int64_t)fmin(dur * r->target_rate * 1.01 + 4096, (double)(r->max_n - r->n)));
        if (st) return st;
    }
    mmc_status st = decode_all(r, dur);
    if (st) return st;
    if (r->src_samples == 0 || r->n == 0)
        return mmc_error(MMC_ERR_FORMAT, "audio %s: the audio stream holds no decodable samples (empty or damaged); %s",
                         r->name, REENCODE);
    /* a header that says much more than the file holds: truncated (a size-based estimate is
     * not a promise, so only lengths the container states are checked) */
    double got = (double)r->src_samples / r->src_rate;
    if (dur > 0 && r->fmt->duration_estimation_method != AVFMT_DURATION_FROM_BITRATE && got < 0.8 * dur && dur - got > 0.5)
        return mmc_error(MMC_ERR_FORMAT, "audio %s: the header says %.2f s but only %.2f s could be decoded (truncated or "
                         "damaged file); %s", r->name, dur, got, REENCODE);
    return MMC_OK;
}

static mmc_status finish(reader *r, mmc_status st, mmc_audio *out) {
    if (!st) {
        out->samples = r->out;
        out->n = r->n;
        out->sample_rate = r->target_rate;
        out->source_rate = r->src_rate;
        out->source_channels = r->src_channels;
        out->source_seconds = (double)r->src_samples / r->src_rate;
        r->out = NULL;
    }
    reader_close(r);
    return st;
}

static mmc_status check_rate(const char *name, int target_rate) {
    if (target_rate < MIN_RATE || target_rate > MAX_RATE)
        return mmc_error(MMC_ERR_INVALID, "audio %s: target sample rate %d Hz is out of range (%d to %d)", name,
                         target_rate, MIN_RATE, MAX_RATE);
    return MMC_OK;
}

static AVDictionary *open_opts(void) {
    AVDictionary *o = NULL;
    av_dict_set(&o, "format_whitelist", CONTAINERS, 0);
    av_dict_set(&o, "protocol_whitelist", "file", 0);
    return o;
}

/* max_seconds in (0, MMC_AUDIO_MAX_SECONDS]: the limit; anything else: MMC_AUDIO_MAX_SECONDS */
static void set_limit(reader *r, double max_seconds) {
    r->max_seconds = max_seconds > 0 && max_seconds < MMC_AUDIO_MAX_SECONDS ? max_seconds : MMC_AUDIO_MAX_SECONDS;
    r->max_n = (int64_t)ceil(r->max_seconds * r->target_rate) + r->target_rate;
}

mmc_status mmc_audio_load(const char *path, int target_rate, mmc_audio *out) {
    return mmc_audio_load_max(path, target_rate, 0, out);
}

mmc_status mmc_audio_load_max(const char *path, int target_rate, double max_seconds, mmc_audio *out) {
    memset(out, 0, sizeof *out);
    quiet_once();
    reader r = {.name = path, .target_rate = target_rate};
    mmc_status st = check_rate(path, target_rate);
    if (st) return st;
    set_limit(&r, max_seconds);
    struct stat sb;
    bool regular = stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
    if (regular && sb.st_size == 0) return mmc_error(MMC_ERR_FORMAT, "audio %s: the file is empty", path);
    FILE *f = regular ? fopen(path, "rb") : NULL;
    if (f) {
        uint8_t head[4096];
        size_t hn = fread(head, 1, sizeof head, f);
        fclose(f);
        if ((st = wav_check(&r, head, hn, (int64_t)sb.st_size))) return st;
    }
    AVDictionary *opts = open_opts();
    int e = avformat_open_input(&r.fmt, path, NULL, &opts);
    av_dict_free(&opts);
    if (e < 0) st = averr(e == AVERROR(ENOENT) ? MMC_ERR_NOT_FOUND : MMC_ERR_FORMAT, &r, e, "cannot open",
                          e == AVERROR(ENOENT) ? "check the path" : REENCODE);
    else st = open_common(&r);
    return finish(&r, st, out);
}

mmc_status mmc_audio_load_mem(const void *data, size_t size, const char *name, int target_rate, mmc_audio *out) {
    return mmc_audio_load_mem_max(data, size, name, target_rate, 0, out);
}

mmc_status mmc_audio_load_mem_max(const void *data, size_t size, const char *name, int target_rate, double max_seconds,
                                  mmc_audio *out) {
    memset(out, 0, sizeof *out);
    quiet_once();
    reader r = {.name = name ? name : "(memory)", .target_rate = target_rate, .mem = data, .mem_len = size};
    mmc_status st = check_rate(r.name, target_rate);
    if (st) return st;
    if (size == 0) return mmc_error(MMC_ERR_FORMAT, "audio %s: the file is empty", r.name);
    if ((st = wav_check(&r, data, size < 4096 ? size : 4096, (int64_t)size))) return st;
    set_limit(&r, max_seconds);
    uint8_t *buf = av_malloc(4096);
    if (!buf || !(r.mem_io = avio_alloc_context(buf, 4096, 0, &r, mem_read, NULL, mem_seek)) ||
        !(r.fmt = avformat_alloc_context())) {
        if (!r.mem_io) av_free(buf);
        reader_close(&r);
        return mmc_error(MMC_ERR_OOM, "audio %s: out of memory", r.name);
    }
    r.fmt->pb = r.mem_io;
    r.fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    AVDictionary *opts = open_opts();
    int e = avformat_open_input(&r.fmt, NULL, NULL, &opts);   /* frees fmt on failure */
    av_dict_free(&opts);
    if (e < 0) st = averr(MMC_ERR_FORMAT, &r, e, "cannot open", REENCODE);
    else st = open_common(&r);
    return finish(&r, st, out);
}

void mmc_audio_free(mmc_audio *a) {
    if (!a) return;
    free(a->samples);
    memset(a, 0, sizeof *a);
}
