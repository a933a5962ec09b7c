/* test_audio.c — audio files and Whisper features against the references of
 * tools/ref/gen_audio.py: the 16-bit WAV and FLAC decode to exactly the mean of their
 * channels; WAV resampled 44.1 -> 16 kHz and 48 -> 16 kHz against soxr HQ (librosa.load's
 * resampler); MP3, Opus, AAC (M4A) and a video's AAC track against PyAV's decode of the same
 * file (PyAV ships a newer FFmpeg, so the lossy decoders may round differently: bound stated
 * below); the FFT against a direct DFT; the mel filters and log-mel features of
 * WhisperFeatureExtractor (80 and 128 bins, numpy path) within 1e-5, with the attention mask;
 * preprocessor_config.json / processor_config.json; and errors, not crashes, on a truncated
 * file, an empty file, a text file, a video without sound and a clip longer than 30 s; a caller's
 * length limit (mmc_audio_load_max / _mem_max) refuses longer clips with both lengths. */
#include "mmc_audio.h"
#include "test_util.h"

#include "fft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LLVMFuzzerTestOneInput fuzz_audio_one
#include "../fuzz/fuzz_audio.c"
#undef LLVMFuzzerTestOneInput

#define DIR_ "tests/fixtures/audio"
static mmc_st *ref;

static float *ref_f32(const char *key, int64_t *n) {
    mmc_tensor *t = fixture_tensor(ref, key, MMC_F32);
    *n = mmc_numel(t);
    float *v = malloc(sizeof(float) * (size_t)*n);
    memcpy(v, t->data, sizeof(float) * (size_t)*n);
    mmc_tensor_free(t);
    return v;
}

static int64_t ref_i64(const char *key) {
    mmc_tensor *t = fixture_tensor(ref, key, MMC_I64);
    int64_t v = ((int64_t *)t->data)[0];
    mmc_tensor_free(t);
    return v;
}

static double maxdiff(const float *a, const float *b, int64_t n, int64_t step_a) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i * step_a] - b[i]));
    return m;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* tone.wav (python's wave module: a 44-byte header, then s16le stereo) at its own rate and
 * tone.flac: exactly (L + R) / 2 / 32768, librosa.load(sr=None)'s mono mean */
static void test_lossless(void) {
    size_t nb;
    unsigned char *raw = read_file(DIR_ "/tone.wav", &nb);
    CHECK(raw && nb == 44 + 44100 * 4);
    if (!raw) return;
    const char *files[2] = {DIR_ "/tone.wav", DIR_ "/tone.flac"};
    for (int k = 0; k < 2; k++) {
        mmc_audio a;
        CHECK_OK(mmc_audio_load(files[k], 44100, &a));
        CHECKF(a.n == 44100 && a.source_rate == 44100 && a.source_channels == 2 && a.sample_rate == 44100,
               "%s: n %lld rate %d ch %d", files[k], (long long)a.n, a.source_rate, a.source_channels);
        int64_t bad = 0;
        for (int64_t i = 0; i < a.n && i < 44100; i++) {
            int16_t l = (int16_t)(raw[44 + 4 * i] | raw[45 + 4 * i] << 8), r = (int16_t)(raw[46 + 4 * i] | raw[47 + 4 * i] << 8);
            float want = (float)l / 32768.0f * 0.5f + (float)r / 32768.0f * 0.5f;
            bad += a.samples[i] != want;
        }
        CHECKF(bad == 0, "%s: %lld samples differ from the mean of the channels", files[k], (long long)bad);
        CHECK_NEAR(a.source_seconds, 1.0, 1e-9);
        mmc_audio_free(&a);
    }
    free(raw);
}

/* 44.1 and 48 kHz -> 16 kHz against soxr HQ; the figures go in the README */
static void test_resample(void) {
    struct { const char *file, *key; } cases[2] = {{DIR_ "/tone.wav", "wav_16k_soxr"}, {DIR_ "/tone48.wav", "w48_16k_soxr"}};
    for (int k = 0; k < 2; k++) {
        int64_t n;
        float *want = ref_f32(cases[k].key, &n);
        mmc_audio a;
        CHECK_OK(mmc_audio_load(cases[k].file, 16000, &a));
        CHECKF(a.n == n, "%s: %lld samples at 16 kHz, soxr gives %lld", cases[k].file, (long long)a.n, (long long)n);
        int64_t m = a.n < n ? a.n : n;
        double d = maxdiff(a.samples, want, m, 1), e = 0, rms = 0;
        for (int64_t i = 0; i < m; i++) { e += (a.samples[i] - want[i]) * (double)(a.samples[i] - want[i]); rms += want[i] * (double)want[i]; }
        printf("resample %s -> 16 kHz vs soxr HQ: max |diff| %.2e, rms diff %.2e (signal rms %.2f)\n", cases[k].file, d,
               sqrt(e / m), sqrt(rms / m));
        CHECKF(d < 1e-4, "%s: resampled differs from soxr HQ by %.3g", cases[k].file, d);
        mmc_audio_free(&a);
        free(want);
    }
}

/* lossy formats: PyAV's decode of the same file (FFmpeg 8 in the wheel vs the system's), every
 * 4th sample; MP3 and AAC decoders are float and bit-stable across versions in practice, Opus
 * too — the bound leaves room for a rounding change in a newer FFmpeg */
static void test_lossy(void) {
    struct { const char *file, *key; int rate; } cases[4] = {
        {DIR_ "/speech.mp3", "mp3_mono", 44100}, {DIR_ "/speech.opus", "opus_mono", 48000},
        {DIR_ "/speech.m4a", "m4a_mono", 44100}, {DIR_ "/video.mp4", "mp4_mono", 44100}};
    for (int k = 0; k < 4; k++) {
        int64_t n4;
        float *want = ref_f32(cases[k].key, &n4);
        char nk[64];
        snprintf(nk, sizeof nk, "%s_n", cases[k].key);
        int64_t n = ref_i64(nk);
        mmc_audio a;
        CHECK_OK(mmc_audio_load(cases[k].file, cases[k].rate, &a));
        CHECKF(a.n == n && a.source_rate == cases[k].rate && a.source_channels == 2, "%s: %lld samples (PyAV %lld), %d Hz",
               cases[k].file, (long long)a.n, (long long)n, a.source_rate);
        if (a.n == n) {
            double d = maxdiff(a.samples, want, n4, 4);
            printf("decode %s vs PyAV: max |diff| %.2e\n", cases[k].file, d);
            CHECKF(d < 1e-4, "%s: differs from PyAV's decode by %.3g", cases[k].file, d);
        }
        /* one thread (no decoder thread) gives the same samples */
        int th = mmc_get_num_threads();
        mmc_set_num_threads(1);
        mmc_audio one;
        CHECK_OK(mmc_audio_load(cases[k].file, 16000, &one));
        mmc_set_num_threads(th > 1 ? th : 2);
        mmc_audio c;
        CHECK_OK(mmc_audio_load(cases[k].file, 16000, &c));
        mmc_set_num_threads(th);
        CHECK(one.n == c.n && one.n > 0 && memcmp(one.samples, c.samples, sizeof(float) * (size_t)one.n) == 0);
        mmc_audio_free(&one);
        mmc_audio_free(&c);
        mmc_audio_free(&a);
        /* and from memory, resampled */
        size_t nb = 0;
        unsigned char *b = read_file(cases[k].file, &nb);
        CHECK_OK(mmc_audio_load_mem(b, nb, cases[k].file, 16000, &a));
        CHECK(llabs(a.n - (int64_t)ceil(n * 16000.0 / cases[k].rate)) <= 1);
        mmc_audio_free(&a);
        free(b);
        free(want);
    }
}

static void test_fft(void) {
    int sizes[] = {400, 512, 480, 2, 6, 14, 22, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int n = sizes[s];
        mmc_rfft *p;
        CHECK_OK(mmc_rfft_plan(n, &p));
        double *x = malloc(sizeof(double) * n), *re = malloc(sizeof(double) * (n / 2 + 1)),
               *im = malloc(sizeof(double) * (n / 2 + 1));
        for (int j = 0; j < n; j++) x[j] = sin(0.37 * j * j + 1.0) + 0.25 * cos(3.1 * j);
        CHECK_OK(mmc_rfft_exec(p, x, re, im));
        double err = 0, mag = 0;
        for (int k = 0; k <= n / 2; k++) {
            long double sr = 0, si = 0;
            for (int j = 0; j < n; j++) {
                long double a = -2.0L * 3.14159265358979323846264338327950288L * (long double)((int64_t)j * k % n) / n;
                sr += x[j] * cosl(a);
                si += x[j] * sinl(a);
            }
            err = fmax(err, fmax(fabs(re[k] - (double)sr), fabs(im[k] - (double)si)));
            mag = fmax(mag, hypot((double)sr, (double)si));
        }
        CHECKF(err <= 1e-12 * fmax(mag, 1.0), "rfft %d: max error %.3g (max |X| %.3g)", n, err, mag);
        free(x); free(re); free(im);
        mmc_rfft_free(p);
    }
    mmc_rfft *p;
    CHECK_ERR(mmc_rfft_plan(401, &p), MMC_ERR_INVALID);
}

/* mmc_log10_lanes against libm's log10: within 2 ulp, and the same float after rounding
 * (what the log-mel keeps), over 1e-10 .. 1e10 and every mantissa region. */
static void test_log10_lanes(void) {
    double maxulp = 0;
    int64_t nfdiff = 0, n = 0;
    for (int k = 0; k < 200000; k++) {
        mmc_fftv x;
        for (int l = 0; l < MMC_FFT_LANES; l++) {
            uint64_t h = (uint64_t)(k * MMC_FFT_LANES + l) * 0x9E3779B97F4A7C15ull;
            x[l] = pow(10.0, -10.0 + 20.0 * (double)(h >> 11) / 9007199254740992.0);
        }
        if (k < 4) for (int l = 0; l < MMC_FFT_LANES; l++) x[l] = (double[]){1e-10, 1.0, 0.5, 2.0, 10.0, 1.4142135623730951,
                                                                         0.7071067811865476, 1e10}[l] * (1 + k * 1e-15);
        mmc_fftv y = mmc_log10_lanes(x);
        for (int l = 0; l < MMC_FFT_LANES; l++, n++) {
            double want = log10(x[l]), ulp = nextafter(fabs(want), INFINITY) - fabs(want);
            if (want == 0) { CHECKF(y[l] == 0, "log10(1) = %g", y[l]); continue; }
            maxulp = fmax(maxulp, fabs(y[l] - want) / ulp);
            nfdiff += (float)y[l] != (float)want;
        }
    }
    printf("log10 lanes: max %.2f ulp vs libm over %lld values, %lld float roundings differ\n", maxulp, (long long)n,
           (long long)nfdiff);
    CHECKF(maxulp <= 2.0, "mmc_log10_lanes: %.2f ulp from libm's log10", maxulp);
    CHECKF(nfdiff <= n / 100000, "mmc_log10_lanes: %lld of %lld values round to another float", (long long)nfdiff,
           (long long)n);
}

/* The vectorised feature path (8 frames per step, the clip read in place, edges staged) against
 * a plain one written here from the definition: the padded clip built whole, one frame at a time
 * through mmc_rfft_exec, the dense filter product with the float filters, libm's log10. Both
 * round the spectrum to float; the float filters differ from the double ones by 3e-8 relative,
 * so the bound is 1e-6 (features are O(1)). Lengths cover an empty clip, partial blocks, the
 * right reflect edge and a full window; a nonzero padding_value takes the all-frames path. */
static void test_features_plain(void) {
    const int lens[] = {0, 161, 1000, 123457, 479850, 480000};
    float *pcm = malloc(sizeof(float) * 480000);
    for (int i = 0; i < 480000; i++)
        pcm[i] = 0.3f * sinf(0.05f * i + 1e-6f * i * (float)i) + 0.01f * sinf(7.1f * i) + 1e-4f * (float)((i * 2654435761u) % 1000) / 1000;
    for (int k = 0; k < 3; k++) {
        int mels = k == 1 ? 128 : 80;
        mmc_whisper_fe fe;
        CHECK_OK(mmc_whisper_fe_init(&fe, mels));
        if (k == 2) fe.padding_value = 0.05f;
        const int L = fe.n_samples, nfft = fe.n_fft, half = nfft / 2, hop = fe.hop_length, nf = half + 1, T = fe.nb_max_frames;
        float *out = malloc(sizeof(float) * (size_t)mels * T), *want = malloc(sizeof(float) * (size_t)mels * T);
        double *x = malloc(sizeof(double) * (size_t)(L + nfft)), *fr = malloc(sizeof(double) * nfft);
        double *re = malloc(sizeof(double) * nf), *im = malloc(sizeof(double) * nf), *pw = malloc(sizeof(double) * nf);
        mmc_rfft *plan;
        CHECK_OK(mmc_rfft_plan(nfft, &plan));
        for (size_t c = 0; c < sizeof lens / sizeof *lens; c++) {
            int n = lens[c];
            CHECK_OK(mmc_whisper_features(&fe, pcm, n, out, NULL));
            double *xp = x + half;
            for (int i = 0; i < L; i++) xp[i] = i < n ? pcm[i] : fe.padding_value;
            for (int i = 1; i <= half; i++) xp[-i] = xp[i], xp[L - 1 + i] = xp[L - 1 - i];
            float gmax = -INFINITY;
            for (int t = 0; t < T; t++) {
                for (int j = 0; j < nfft; j++)
                    fr[j] = x[(size_t)t * hop + j] * (0.5 + 0.5 * cos(M_PI * (double)(1 - (nfft + 1) + 2 * j) / nfft));
                CHECK_OK(mmc_rfft_exec(plan, fr, re, im));
                for (int f = 0; f < nf; f++) pw[f] = (double)(float)re[f] * (float)re[f] + (double)(float)im[f] * (float)im[f];
                for (int m = 0; m < mels; m++) {
                    double s = 0;
                    for (int f = 0; f < nf; f++) s += (double)fe.mel_filters[(size_t)f * mels + m] * pw[f];
                    float v = (float)log10(s > 1e-10 ? s : 1e-10);
                    want[(size_t)m * T + t] = v;
                    gmax = v > gmax ? v : gmax;
                }
            }
            double d = 0;
            for (int64_t i = 0; i < (int64_t)mels * T; i++) {
                float v = want[i] > gmax - 8.0f ? want[i] : gmax - 8.0f;
                d = fmax(d, fabs(out[i] - (v + 4.0f) / 4.0f));
            }
            printf("features %d mels, %d samples, padding %g: max |fast - plain| %.2e\n", mels, n, fe.padding_value, d);
            CHECKF(d <= 1e-6, "features (%d mels, %d samples): the fast path differs from the plain one by %.3g", mels, n, d);
        }
        mmc_rfft_free(plan);
        free(out); free(want); free(x); free(fr); free(re); free(im); free(pw);
        mmc_whisper_fe_free(&fe);
    }
    free(pcm);
}

static void test_features(void) {
    int64_t n;
    float *pcm = ref_f32("fe_pcm", &n);
    const char *dirs[3] = {DIR_ "/fe80", DIR_ "/fe128", DIR_ "/fe128_nested"};
    for (int k = 0; k < 3; k++) {
        int mels = k ? 128 : 80;
        mmc_whisper_fe fe, def;
        CHECK_OK(mmc_whisper_fe_load(dirs[k], &fe));
        CHECK_OK(mmc_whisper_fe_init(&def, mels));
        CHECK(fe.feature_size == mels && fe.sampling_rate == 16000 && fe.hop_length == 160 && fe.n_fft == 400 &&
              fe.chunk_length == 30 && fe.n_samples == 480000 && fe.nb_max_frames == 3000 &&
              fe.return_attention_mask == (k > 0) && fe.padding_value == 0.0f);
        char key[32];
        snprintf(key, sizeof key, "mel%d", mels);
        int64_t nm;
        float *mel = ref_f32(key, &nm);
        CHECK(nm == 201 * mels);
        int64_t neq = 0;
        double md = 0;
        for (int64_t i = 0; i < nm; i++) {
            neq += fe.mel_filters[i] != mel[i] || def.mel_filters[i] != mel[i];
            md = fmax(md, fabs(fe.mel_filters[i] - mel[i]));
        }
        CHECKF(neq == 0, "%s: %lld mel filter entries differ from transformers' (max %.3g)", dirs[k], (long long)neq, md);
        float *out = malloc(sizeof(float) * (size_t)mels * 3000);
        int32_t *mask = malloc(sizeof(int32_t) * 3000);
        CHECK_OK(mmc_whisper_features(&fe, pcm, n, out, mask));
        snprintf(key, sizeof key, "fe%d", mels);
        int64_t nf;
        float *want = ref_f32(key, &nf);
        int keep = (int)(nf / mels);
        snprintf(key, sizeof key, "fe%d_pad", mels);
        int64_t one;
        float *pad = ref_f32(key, &one);
        double d = 0;
        for (int m = 0; m < mels; m++)
            for (int t = 0; t < 3000; t++)
                d = fmax(d, fabs(out[(size_t)m * 3000 + t] - (t < keep ? want[(size_t)m * keep + t] : pad[0])));
        printf("features %s: max |diff| vs WhisperFeatureExtractor (numpy) %.2e\n", dirs[k], d);
        CHECKF(d <= 1e-5, "%s: features differ by %.3g", dirs[k], d);
        if (k == 1) {
            int64_t nmk;
            mmc_tensor *mt = fixture_tensor(ref, "mask128", MMC_I32);
            nmk = mmc_numel(mt);
            CHECK(nmk == 3000 && memcmp(mt->data, mask, sizeof(int32_t) * 3000) == 0);
            mmc_tensor_free(mt);
        }
        /* too long: refused, never truncated */
        float *big = calloc(480001, sizeof(float));
        CHECK_ERR(mmc_whisper_features(&fe, big, 480001, out, NULL), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "30 s") != NULL);
        CHECK_OK(mmc_whisper_features(&fe, big, 480000, out, mask));   /* exactly 30 s of silence */
        CHECK(mask[2999] == 1 && out[0] == out[(size_t)mels * 3000 - 1]);
        free(big); free(out); free(mask); free(want); free(pad); free(mel);
        mmc_whisper_fe_free(&fe);
        mmc_whisper_fe_free(&def);
    }
    free(pcm);
    mmc_whisper_fe fe;
    CHECK_ERR(mmc_whisper_fe_load(DIR_, &fe), MMC_ERR_NOT_FOUND);
    /* an image processor's preprocessor_config.json is not a feature extractor's */
    CHECK_ERR(mmc_whisper_fe_load("tests/fixtures/llava/hub", &fe), MMC_ERR_NOT_FOUND);
}

static void expect_fail(const char *what, mmc_status st, const char *needle) {
    CHECKF(st != MMC_OK, "%s: accepted", what);
    if (st != MMC_OK) {
        printf("  %s -> %s\n", what, mmc_last_error());
        CHECKF(strstr(mmc_last_error(), needle) != NULL, "%s: message lacks '%s': %s", what, needle, mmc_last_error());
    }
}

static void test_errors(void) {
    mmc_audio a;
    size_t nb;
    unsigned char *wav = read_file(DIR_ "/tone.wav", &nb);
    /* a WAV cut mid-way: the header promises 1 s */
    expect_fail("truncated WAV", mmc_audio_load_mem(wav, 44 + 4 * 4000, "cut.wav", 16000, &a), "truncated");
    expect_fail("WAV cut inside its header", mmc_audio_load_mem(wav, 30, "cut.wav", 16000, &a), "cut.wav");
    expect_fail("empty buffer", mmc_audio_load_mem(wav, 0, "empty.wav", 16000, &a), "empty");
    /* zero sample rate in the fmt chunk (bytes 24..27) */
    unsigned char *z = malloc(nb);
    memcpy(z, wav, nb);
    memset(z + 24, 0, 4);
    expect_fail("zero-rate WAV", mmc_audio_load_mem(z, nb, "zero.wav", 16000, &a), "0 Hz");
    free(z);
    const char *text = "this is not audio at all, just a sentence or two of text.\n";
    expect_fail("text", mmc_audio_load_mem(text, strlen(text), "notes.txt", 16000, &a), "notes.txt");
    expect_fail("bad target rate", mmc_audio_load(DIR_ "/tone.wav", 0, &a), "target sample rate");
    expect_fail("missing file", mmc_audio_load(DIR_ "/nope.wav", 16000, &a), "nope.wav");
    expect_fail("video without sound", mmc_audio_load(DIR_ "/silent.mp4", 16000, &a), "no audio stream");
    char tmp[] = "/tmp/mmc_audio_emptyXXXXXX";
    int fd = mkstemp(tmp);
    if (fd >= 0) {
        close(fd);
        expect_fail("empty file", mmc_audio_load(tmp, 16000, &a), "empty");
        remove(tmp);
    }
    /* 5 hours of 8-bit mono at 10 Hz (180 kB): refused from its header, before decoding */
    static unsigned char hdr[44 + 180000];
    uint32_t data_len = 180000, riff = data_len + 36;
    memcpy(hdr, "RIFF", 4); memcpy(hdr + 4, &riff, 4); memcpy(hdr + 8, "WAVEfmt ", 8);
    uint32_t v32 = 16; memcpy(hdr + 16, &v32, 4);
    uint16_t v16 = 1; memcpy(hdr + 20, &v16, 2); memcpy(hdr + 22, &v16, 2);
    v32 = 10; memcpy(hdr + 24, &v32, 4); memcpy(hdr + 28, &v32, 4);
    v16 = 1; memcpy(hdr + 32, &v16, 2);
    v16 = 8; memcpy(hdr + 34, &v16, 2);
    memcpy(hdr + 36, "data", 4); memcpy(hdr + 40, &data_len, 4);
    memset(hdr + 44, 128, data_len);
    expect_fail("5-hour file", mmc_audio_load_mem(hdr, sizeof hdr, "long.wav", 16000, &a), "longer than");
    /* a caller's lower limit (mmc serve --max-audio-seconds): refused from the header (WAV) or while
     * decoding (MP3, whose length is an estimate), the message giving both lengths; a clip under it loads
     * as without the limit */
    expect_fail("1 s WAV over a 0.5 s limit", mmc_audio_load_mem_max(wav, nb, "tone.wav", 16000, 0.5, &a),
                "longer than the 0.5 s allowed");
    expect_fail("1 s WAV file over a 0.5 s limit", mmc_audio_load_max(DIR_ "/tone.wav", 16000, 0.5, &a),
                "1.0 s of audio is longer than the 0.5 s allowed");
    expect_fail("MP3 over a 0.2 s limit", mmc_audio_load_max(DIR_ "/speech.mp3", 16000, 0.2, &a), "0.2 s allowed");
    {
        mmc_audio u = {0}, l = {0};
        CHECK_OK(mmc_audio_load(DIR_ "/tone.wav", 16000, &u));
        CHECK_OK(mmc_audio_load_mem_max(wav, nb, "tone.wav", 16000, 2.0, &l));
        CHECK(u.n == l.n && u.n > 0 && !memcmp(u.samples, l.samples, sizeof(float) * (size_t)u.n));
        mmc_audio_free(&u);
        mmc_audio_free(&l);
    }
    /* a FLAC cut in half: its STREAMINFO gives the length */
    unsigned char *fl = read_file(DIR_ "/tone.flac", &nb);
    expect_fail("truncated FLAC", mmc_audio_load_mem(fl, nb / 2, "cut.flac", 16000, &a), "truncated");
    free(fl);
    free(wav);
    /* the fuzz target on every fixture file */
    const char *all[] = {"tone.wav", "tone48.wav", "tone.flac", "speech.mp3", "speech.opus", "speech.m4a", "video.mp4", "silent.mp4"};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        char path[256];
        snprintf(path, sizeof path, DIR_ "/%s", all[i]);
        unsigned char *b = read_file(path, &nb);
        fuzz_audio_one(b, nb);
        fuzz_audio_one(b, nb / 2);
        free(b);
    }
    CHECK(1);
}

int main(int argc, char **argv) {
    if (test_part(argc, argv, "log10")) test_log10_lanes();              /* (no fixtures needed) */
    if (test_part(argc, argv, "features_plain")) test_features_plain();
    ref = fixture_open("audio/ref.safetensors");
    if (!ref) return test_done("test_audio");
    if (test_part(argc, argv, "fft")) test_fft();
    if (test_part(argc, argv, "lossless")) test_lossless();
    if (test_part(argc, argv, "resample")) test_resample();
    if (test_part(argc, argv, "lossy")) test_lossy();
    if (test_part(argc, argv, "features")) test_features();
    if (test_part(argc, argv, "errors")) test_errors();
    mmc_st_close(ref);
    return test_done("test_audio");
}
