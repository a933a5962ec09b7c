/* whisper_features.c — transformers' WhisperFeatureExtractor: the log-mel spectrogram Whisper
 * and Qwen2.5-Omni's audio encoder take. Mirrors its numpy path (_np_extract_fbank_features
 * with audio_utils.spectrogram): the clip padded with padding_value to n_samples (30 s), a
 * centred STFT (reflect padding of n_fft/2 each side, periodic Hann window, hop 160), the
 * power spectrum, the slaney-normalised slaney-scale mel filter bank of
 * audio_utils.mel_filter_bank (0 to 8000 Hz, computed here, not read from a file), log10 of
 * max(1e-10, mel), the last frame dropped, max(x, max(x) - 8), then (x + 4) / 4.
 *
 * Like numpy, the FFT (src/backend/cpu/fft.c), the power and the filter product run in double;
 * the spectrum is rounded to float between FFT and power as numpy's complex64 buffer does,
 * and the final clamp and scale are done in float as numpy does on its float32 array. The
 * filters are sparse (each mel band covers a few FFT bins), so only their non-zero span is
 * summed. Frames are independent: 8 at a time, one per vector lane (loaded by 8 x 8 transposes
 * straight from the caller's samples, the log10 in double on the lanes: mmc_log10_lanes), the
 * blocks of 8 split across OpenMP threads.
 */
#include "mmc_audio.h"
#include "mmc_io.h"

#include "fft.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_MELS 1024
#define MAX_NFFT 8192

typedef float mmc_fftvf __attribute__((vector_size(4 * MMC_FFT_LANES)));
typedef int64_t lanes_i __attribute__((vector_size(8 * MMC_FFT_LANES)));   /* masks of mmc_fftv compares */
typedef int32_t lanes_f __attribute__((vector_size(4 * MMC_FFT_LANES)));   /* ... and of mmc_fftvf */
_Static_assert(MMC_FFT_LANES == 8, "transpose8 below assumes 8 lanes");

/* c[j][l] = r[l][j] for an 8 x 8 block (three rounds of two-vector shuffles, which GCC maps to
 * vunpck / vshuf / vperm2 on AVX2 and AVX-512): 8 frames' samples j0..j0+7 into lanes. */
static inline void transpose8(const mmc_fftvf r[8], mmc_fftvf c[8]) {
    typedef int32_t ix __attribute__((vector_size(32)));
    const ix lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const ix lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const ix lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    mmc_fftvf t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = __builtin_shuffle(r[2 * k], r[2 * k + 1], lo);
        t[2 * k + 1] = __builtin_shuffle(r[2 * k], r[2 * k + 1], hi);
    }
    for (int k = 0; k < 2; k++) {   /* u[4k + q]: columns q and q + 4 of rows 4k..4k+3 */
        u[4 * k + 0] = __builtin_shuffle(t[4 * k], t[4 * k + 2], lo2);
        u[4 * k + 1] = __builtin_shuffle(t[4 * k], t[4 * k + 2], hi2);
        u[4 * k + 2] = __builtin_shuffle(t[4 * k + 1], t[4 * k + 3], lo2);
        u[4 * k + 3] = __builtin_shuffle(t[4 * k + 1], t[4 * k + 3], hi2);
    }
    for (int q = 0; q < 4; q++) {
        c[q] = __builtin_shuffle(u[q], u[4 + q], lo4);
        c[q + 4] = __builtin_shuffle(u[q], u[4 + q], hi4);
    }
}

typedef struct {
    mmc_rfft *fft;
    double *window;      /* [n_fft] np.hanning(n_fft + 1)[:-1] */
    double *filt;        /* [n_mels, n_freq] transposed filters in double */
    int *lo, *hi;        /* [n_mels] non-zero span of each filter */
} fe_priv;

static void priv_free(fe_priv *p) {
    if (!p) return;
    mmc_rfft_free(p->fft);
    free(p->window);
    free(p->filt);
    free(p->lo);
    free(p->hi);
    free(p);
}

void mmc_whisper_fe_free(mmc_whisper_fe *fe) {
    if (!fe) return;
    free(fe->mel_filters);
    priv_free(fe->priv);
    memset(fe, 0, sizeof *fe);
}

/* audio_utils.hertz_to_mel / mel_to_hertz, mel_scale="slaney" */
static double hz_to_mel(double f) {
    const double logstep = 27.0 / log(6.4);
    return f >= 1000.0 ? 15.0 + log(f / 1000.0) * logstep : 3.0 * f / 200.0;
}
static double mel_to_hz(double m) {
    const double logstep = log(6.4) / 27.0;
    return m >= 15.0 ? 1000.0 * exp(logstep * (m - 15.0)) : 200.0 * m / 3.0;
}

/* np.linspace(a, b, num)[i] */
static double linspace(double a, double b, int num, int i) {
    if (num > 1 && i == num - 1) return b;
    return num > 1 ? i * ((b - a) / (num - 1)) + a : a;
}

/* mel_filter_bank(1 + n_fft // 2, n_mels, 0, 8000, sr, norm="slaney", mel_scale="slaney"):
 * filt[m, f] in double (transposed from transformers' [n_freq, n_mels]). */
static mmc_status build(mmc_whisper_fe *fe) {
    int nf = fe->n_fft / 2 + 1, nm = fe->feature_size;
    fe_priv *p = calloc(1, sizeof *p);
    double *ff = malloc(sizeof(double) * (size_t)(nm + 2));
    mmc_status st = MMC_OK;
    if (!p || !ff) { st = mmc_error(MMC_ERR_OOM, "whisper features: out of memory"); goto fail; }
    if ((st = mmc_rfft_plan(fe->n_fft, &p->fft))) goto fail;
    p->window = malloc(sizeof(double) * (size_t)fe->n_fft);
    p->filt = calloc((size_t)nm * nf, sizeof(double));
    p->lo = malloc(sizeof(int) * (size_t)nm);
    p->hi = malloc(sizeof(int) * (size_t)nm);
    fe->mel_filters = malloc(sizeof(float) * (size_t)nm * nf);
    if (!p->window || !p->filt || !p->lo || !p->hi || !fe->mel_filters) {
        st = mmc_error(MMC_ERR_OOM, "whisper features: out of memory");
        goto fail;
    }
    /* np.hanning(M) = 0.5 + 0.5 cos(pi k / (M - 1)), k = 1-M, 3-M, ..., M-1; periodic: M = n_fft + 1 */
    int M = fe->n_fft + 1;
    for (int j = 0; j < fe->n_fft; j++) p->window[j] = 0.5 + 0.5 * cos(M_PI * (double)(1 - M + 2 * j) / (M - 1));
    double mmin = hz_to_mel(0.0), mmax = hz_to_mel(8000.0);
    for (int i = 0; i < nm + 2; i++) ff[i] = mel_to_hz(linspace(mmin, mmax, nm + 2, i));
    for (int m = 0; m < nm; m++) {
        double enorm = 2.0 / (ff[m + 2] - ff[m]);
        p->lo[m] = nf;
        p->hi[m] = 0;
        for (int f = 0; f < nf; f++) {
            double fft_f = linspace(0.0, (double)(fe->sampling_rate / 2), nf, f);
            double down = -(ff[m] - fft_f) / (ff[m + 1] - ff[m]);
            double up = (ff[m + 2] - fft_f) / (ff[m + 2] - ff[m + 1]);
            double v = fmax(0.0, fmin(down, up)) * enorm;
            p->filt[(size_t)m * nf + f] = v;
            fe->mel_filters[(size_t)f * nm + m] = (float)v;
            if (v != 0.0) {
                if (f < p->lo[m]) p->lo[m] = f;
                p->hi[m] = f + 1;
            }
        }
        if (p->hi[m] == 0) p->lo[m] = 0;   /* an all-zero band (too many mels for n_fft), as transformers allows */
    }
    free(ff);
    fe->priv = p;
    return MMC_OK;
fail:
    free(ff);
    priv_free(p);
    free(fe->mel_filters);
    fe->mel_filters = NULL;
    return st;
}

static mmc_status check(const mmc_whisper_fe *fe, const char *where) {
    if (fe->feature_size < 1 || fe->feature_size > MAX_MELS)
        return mmc_error(MMC_ERR_INVALID, "%s: feature_size %d is out of range (1 to %d; Whisper uses 80 or 128)", where,
                         fe->feature_size, MAX_MELS);
    if (fe->sampling_rate < 1000 || fe->sampling_rate > 192000)
        return mmc_error(MMC_ERR_INVALID, "%s: sampling_rate %d is out of range (Whisper uses 16000)", where, fe->sampling_rate);
    if (fe->n_fft < 2 || fe->n_fft % 2 || fe->n_fft > MAX_NFFT)
        return mmc_error(MMC_ERR_INVALID, "%s: n_fft %d must be even, 2 to %d (Whisper uses 400)", where, fe->n_fft, MAX_NFFT);
    if (fe->hop_length < 1 || fe->hop_length > fe->n_fft * 4)
        return mmc_error(MMC_ERR_INVALID, "%s: hop_length %d is out of range (Whisper uses 160)", where, fe->hop_length);
    if (fe->chunk_length < 1 || (int64_t)fe->chunk_length * fe->sampling_rate > (int64_t)3600 * 192000)
        return mmc_error(MMC_ERR_INVALID, "%s: chunk_length %d s is out of range (Whisper uses 30)", where, fe->chunk_length);
    if (fe->n_samples <= fe->n_fft / 2)
        return mmc_error(MMC_ERR_INVALID, "%s: a chunk of %d samples is shorter than half the FFT (%d)", where,
                         fe->n_samples, fe->n_fft);
    return MMC_OK;
}

static void set_defaults(mmc_whisper_fe *fe, int n_mels) {
    memset(fe, 0, sizeof *fe);
    fe->feature_size = n_mels;
    fe->sampling_rate = 16000;
    fe->hop_length = 160;
    fe->chunk_length = 30;
    fe->n_fft = 400;
    fe->padding_value = 0.0f;
    fe->return_attention_mask = false;
}

static void derive(mmc_whisper_fe *fe) {
    fe->n_samples = fe->chunk_length * fe->sampling_rate;
    fe->nb_max_frames = fe->n_samples / fe->hop_length;
}

mmc_status mmc_whisper_fe_init(mmc_whisper_fe *fe, int n_mels) {
    set_defaults(fe, n_mels);
    derive(fe);
    mmc_status st = check(fe, "WhisperFeatureExtractor");
    if (!st) st = build(fe);
    if (st) memset(fe, 0, sizeof *fe);
    return st;
}

static mmc_status get_int(const mmc_json *j, const char *key, const char *path, int def, int *out) {
    int64_t v;
    mmc_status st = mmc_json_int(j, key, def, &v);
    if (st) return mmc_error_prefix(st, "%s", path);
    if (v < INT32_MIN || v > INT32_MAX) return mmc_error(MMC_ERR_INVALID, "%s: %s %lld is out of range", path, key, (long long)v);
    *out = (int)v;
    return MMC_OK;
}

static mmc_status apply(const mmc_json *j, const char *path, mmc_whisper_fe *fe) {
    mmc_status st;
    const char *type = NULL;
    if ((st = mmc_json_str(j, "feature_extractor_type", NULL, &type))) return mmc_error_prefix(st, "%s", path);
    if (type && strcmp(type, "WhisperFeatureExtractor") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: feature_extractor_type is %s; only WhisperFeatureExtractor is "
                         "supported", path, type);
    if ((st = get_int(j, "feature_size", path, fe->feature_size, &fe->feature_size)) ||
        (st = get_int(j, "sampling_rate", path, fe->sampling_rate, &fe->sampling_rate)) ||
        (st = get_int(j, "hop_length", path, fe->hop_length, &fe->hop_length)) ||
        (st = get_int(j, "chunk_length", path, fe->chunk_length, &fe->chunk_length)) ||
        (st = get_int(j, "n_fft", path, fe->n_fft, &fe->n_fft)))
        return st;
    double pv, dither;
    if ((st = mmc_json_num(j, "padding_value", 0.0, &pv)) || (st = mmc_json_num(j, "dither", 0.0, &dither)) ||
        (st = mmc_json_bool(j, "return_attention_mask", false, &fe->return_attention_mask)))
        return mmc_error_prefix(st, "%s", path);
    if (dither != 0.0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: dither %g adds random noise to the features, which mmc does not "
                         "reproduce; set \"dither\": 0.0 (Whisper's default)", path, dither);
    if (!isfinite(pv)) return mmc_error(MMC_ERR_INVALID, "%s: padding_value is not finite", path);
    fe->padding_value = (float)pv;
    derive(fe);
    /* the saved derived values must agree with what transformers would derive */
    int ns, nb;
    if ((st = get_int(j, "n_samples", path, fe->n_samples, &ns)) || (st = get_int(j, "nb_max_frames", path, fe->nb_max_frames, &nb)))
        return st;
    if ((st = check(fe, path))) return st;
    if (ns != fe->n_samples || nb != fe->nb_max_frames)
        return mmc_error(MMC_ERR_INVALID, "%s: n_samples %d / nb_max_frames %d disagree with chunk_length %d * "
                         "sampling_rate %d / hop_length %d", path, ns, nb, fe->chunk_length, fe->sampling_rate,
                         fe->hop_length);
    return MMC_OK;
}

/* One file: MMC_OK with *found set when it holds a feature extractor (processor_config.json:
 * its "feature_extractor" object; preprocessor_config.json: the whole object). */
static mmc_status load_file(const char *path, bool nested_only, mmc_whisper_fe *fe, bool *found) {
    *found = false;
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    if (!mmc_json_is_object(j)) {
        mmc_json_free(j);
        return mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const mmc_json *sub = mmc_json_get(j, "feature_extractor");
    if (sub && !mmc_json_is_object(sub)) st = mmc_error(MMC_ERR_FORMAT, "%s: feature_extractor must be an object", path);
    else if (sub || (!nested_only && (mmc_json_has(j, "feature_extractor_type") || mmc_json_has(j, "feature_size")))) {
        /* (a preprocessor_config.json with neither is an image processor's: not ours) */
        st = apply(sub ? sub : j, path, fe);
        *found = !st;
    }
    mmc_json_free(j);
    return st;
}

mmc_status mmc_whisper_fe_load(const char *model_dir, mmc_whisper_fe *fe) {
    static const char *const names[2] = {"processor_config.json", "preprocessor_config.json"};
    set_defaults(fe, 80);
    for (int k = 0; k < 2; k++) {
        char path[4200];
        if (snprintf(path, sizeof path, "%s/%s", model_dir, names[k]) >= (int)sizeof path)
            return mmc_error(MMC_ERR_INVALID, "%s: path too long", model_dir);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        bool found;
        mmc_status st = load_file(path, k == 0, fe, &found);
        if (st) { memset(fe, 0, sizeof *fe); return mmc_error_prefix(st, "feature extractor config"); }
        if (found) {
            st = build(fe);
            if (st) memset(fe, 0, sizeof *fe);
            return st;
        }
    }
    memset(fe, 0, sizeof *fe);
    return mmc_error(MMC_ERR_NOT_FOUND, "%s: no feature extractor config (preprocessor_config.json, or "
                     "processor_config.json with \"feature_extractor\")", model_dir);
}

mmc_status mmc_whisper_features(const mmc_whisper_fe *fe, const float *pcm, int64_t n, float *out, int32_t *mask) {
    const fe_priv *p = fe->priv;
    if (!p) return mmc_error(MMC_ERR_INVALID, "whisper features: the extractor is not initialised (mmc_whisper_fe_load/_init)");
    if (n < 0 || (n > 0 && !pcm)) return mmc_error(MMC_ERR_INVALID, "whisper features: bad input (%lld samples)", (long long)n);
    if (n > fe->n_samples)
        return mmc_error(MMC_ERR_INVALID, "whisper features: the clip has %lld samples (%.2f s), more than the %d s "
                         "(%d samples) the model takes at once; split it into chunks of at most %d s",
                         (long long)n, (double)n / fe->sampling_rate, fe->chunk_length, fe->n_samples, fe->chunk_length);
    const int L = fe->n_samples, nfft = fe->n_fft, half = nfft / 2, hop = fe->hop_length;
    const int nf = half + 1, nm = fe->feature_size, T = fe->nb_max_frames;
    /* The padded clip x (the samples, then padding_value up to L), reflect-padded by n_fft/2 each
     * side (np.pad mode="reflect"), is never built whole: a block of frames inside the clip reads
     * pcm directly, one at an edge builds its span in a small per-thread buffer. */
    const float pv = fe->padding_value;
    mmc_status st = MMC_OK;
    /* Frames past the clip: with zero padding (and the clip ending at least n_fft/2 samples before the
     * window's end, so the right reflect-pad is zeros too) frame t reads only zeros from t*hop - n_fft/2 >= n
     * on; its power is 0 and its log-mel the floor log10(1e-10), which is what the FFT would give exactly.
     * Only the Tc frames that touch the clip are transformed (a 2 s clip: 213 of 3000 frames). */
    const float zero_v = (float)log10(1e-10);
    const int Tc = fe->padding_value == 0.0f && n + half <= L - 1
        ? (int)((n + half + hop - 1) / hop < T ? (n + half + hop - 1) / hop : T) : T;
    const int L8 = MMC_FFT_LANES, wl = mmc_rfft_work_lanes(p->fft), nblk = (Tc + L8 - 1) / L8;
    float gmax = Tc < T ? zero_v : -FLT_MAX;
    /* MMC_FFT_LANES frames per step, one per vector lane; blocks of frames split across
     * threads, which pay from a few hundred frames on */
#pragma omp parallel if ((int64_t)Tc * nfft > (1 << 17)) reduction(max : gmax)
    {
        const int span_max = (L8 - 1) * hop + nfft;   /* samples a block of frames reads */
        mmc_fftv *frame = aligned_alloc(sizeof(mmc_fftv), sizeof(mmc_fftv) * (size_t)(nfft + 3 * nf + wl));
        float *stage = malloc(sizeof(float) * (size_t)span_max);
        if (!frame || !stage) {
#pragma omp critical
            st = mmc_error(MMC_ERR_OOM, "whisper features: out of memory");
        } else {
            mmc_fftv *re = frame + nfft, *im = re + nf, *pw = im + nf, *work = pw + nf;
            const mmc_fftv floor_d = (mmc_fftv){0} + 1e-10;
            mmc_fftvf gv = (mmc_fftvf){0} - FLT_MAX;   /* the running max of full blocks, per lane */
#pragma omp for schedule(dynamic, 8)   /* dynamic: a thread the OS preempts does not hold the rest up */
            for (int blk = 0; blk < nblk; blk++) {
                int t0 = blk * L8, nl = Tc - t0 < L8 ? Tc - t0 : L8;
                /* buf[t * hop + j] is sample j of frame t0 + t, i.e. x[(t0 + t) * hop - half + j] */
                const int64_t s0 = (int64_t)t0 * hop - half, span = (int64_t)(nl - 1) * hop + nfft;
                const float *buf;
                if (s0 >= 0 && s0 + span <= n) buf = pcm + s0;
                else {
                    for (int64_t i = 0; i < span; i++) {
                        int64_t q = s0 + i;                      /* index into x, -half <= q < L + half */
                        if (q < 0) q = -q;                       /* x[-i] = x[i] */
                        else if (q > L - 1) q = 2 * (int64_t)(L - 1) - q;   /* x[L-1+i] = x[L-1-i] */
                        stage[i] = q < n ? pcm[q] : pv;
                    }
                    buf = stage;
                }
                int j0 = 0;
                if (nl == L8)   /* 8 samples of 8 frames at a time: load, transpose, widen */
                    for (; j0 + L8 <= nfft; j0 += L8) {
                        mmc_fftvf r[MMC_FFT_LANES], c[MMC_FFT_LANES];
                        for (int l = 0; l < L8; l++) memcpy(&r[l], buf + (size_t)l * hop + j0, sizeof r[l]);
                        transpose8(r, c);
                        for (int q = 0; q < L8; q++) frame[j0 + q] = __builtin_convertvector(c[q], mmc_fftv) * p->window[j0 + q];
                    }
                for (int j = j0; j < nfft; j++) {
                    mmc_fftv v = {0};
                    for (int l = 0; l < nl; l++) v[l] = (double)buf[(size_t)l * hop + j];
                    frame[j] = v * p->window[j];
                }
                mmc_rfft_exec_lanes(p->fft, frame, re, im, work);
                for (int f = 0; f < nf; f++) {   /* |complex64|^2 in float64, as numpy */
                    mmc_fftv a = __builtin_convertvector(__builtin_convertvector(re[f], mmc_fftvf), mmc_fftv);
                    mmc_fftv b = __builtin_convertvector(__builtin_convertvector(im[f], mmc_fftvf), mmc_fftv);
                    pw[f] = a * a + b * b;
                }
                for (int m = 0; m < nm; m++) {
                    const double *w = p->filt + (size_t)m * nf;
                    mmc_fftv acc = {0};
                    for (int f = p->lo[m]; f < p->hi[m]; f++) acc += w[f] * pw[f];
                    float *o = out + (size_t)m * T + t0;
                    mmc_fftv cl = (mmc_fftv)(((lanes_i)acc & (lanes_i)(acc > 1e-10)) | ((lanes_i)floor_d & ~(lanes_i)(acc > 1e-10)));
                    mmc_fftvf v = __builtin_convertvector(mmc_log10_lanes(cl), mmc_fftvf);   /* np.log10(max(x, 1e-10)) */
                    if (nl == L8) {
                        memcpy(o, &v, sizeof v);
                        gv = (mmc_fftvf)(((lanes_f)v & (lanes_f)(v > gv)) | ((lanes_f)gv & ~(lanes_f)(v > gv)));
                    } else
                        for (int l = 0; l < nl; l++) {
                            o[l] = v[l];
                            if (v[l] > gmax) gmax = v[l];
                        }
                }
            }
            for (int l = 0; l < L8; l++)
                if (gv[l] > gmax) gmax = gv[l];
        }
        free(frame);
        free(stage);
    }
    if (st) return st;
    for (int m = 0; m < nm; m++)
        for (int t = Tc; t < T; t++) out[(size_t)m * T + t] = zero_v;
    const float floor_v = gmax - 8.0f;
    const int64_t total = (int64_t)nm * T;
    for (int64_t i = 0; i < total; i++) {   /* ~0.1 ms: not worth a second fork/join */
        float v = out[i] > floor_v ? out[i] : floor_v;
        out[i] = (v + 4.0f) / 4.0f;
    }
    if (mask)   /* the sample mask [::hop]: frame t is real when sample t * hop is */
        for (int t = 0; t < T; t++) mask[t] = (int64_t)t * hop < n;
    return MMC_OK;
}
