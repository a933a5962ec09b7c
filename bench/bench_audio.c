/* bench_audio.c — the audio input side: decode + resample of a 30 s 44.1 kHz stereo MP3 to
 * 16 kHz mono (FFmpeg, libswresample with libsoxr HQ), and the Whisper log-mel features of 30 s
 * (80 and 128 bins). Peer: bench/peer_audio.py (PyAV decode with its AudioResampler or with
 * soxr HQ as librosa does; transformers' WhisperFeatureExtractor on its default torch path and
 * on its numpy path). Also, for information, the 400-point real FFT per frame against a
 * precomputed DFT matrix (the choice fft.c's header mentions). The MP3 is written at bench time
 * by the peer script (PyAV + libmp3lame) into build/bench/. Also the log-mel's CPU time per clip
 * (all threads of the process, over 40 calls: audio_logmel*_30s_cpu_ms, the peer's measured the
 * same way), which a loaded host disturbs far less than the wall clock: the figure to compare by
 * there (under OMP_WAIT_POLICY=passive, bench/run.sh's default: spinning threads would count too). */
#include "bench_util.h"
#include "mmc_audio.h"

#include "fft.h"

#include <math.h>
#include <time.h>
#include <unistd.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

typedef struct {
    const char *path;
    mmc_whisper_fe fe;
    float *pcm, *out;
} arg_t;

static void decode(void *a_) {
    arg_t *a = a_;
    mmc_audio au;
    MMC_CHECK(mmc_audio_load(a->path, 16000, &au) == MMC_OK, "%s", mmc_last_error());
    mmc_audio_free(&au);
}

static void feats(void *a_) {
    arg_t *a = a_;
    MMC_CHECK(mmc_whisper_features(&a->fe, a->pcm, 480000, a->out, NULL) == MMC_OK, "%s", mmc_last_error());
}

typedef struct {
    mmc_rfft *p;
    double *x, *re, *im, *cs;   /* cs: [201, 2, 400] DFT matrix */
    mmc_fftv *xv, *rv, *iv, *w;
    int frames;
} fft_arg;

static void fft_run(void *a_) {   /* MMC_FFT_LANES frames per call, as the feature extractor runs it */
    fft_arg *a = a_;
    for (int f = 0; f < a->frames; f += MMC_FFT_LANES) mmc_rfft_exec_lanes(a->p, a->xv, a->rv, a->iv, a->w);
}

static void dft_run(void *a_) {
    fft_arg *a = a_;
    for (int f = 0; f < a->frames; f++)
        for (int k = 0; k <= 200; k++) {
            const double *c = a->cs + (size_t)k * 800;
            double r = 0, i = 0;
            for (int j = 0; j < 400; j++) { r += c[j] * a->x[j]; i += c[400 + j] * a->x[j]; }
            a->re[k] = r;
            a->im[k] = i;
        }
}

int main(void) {
    const char *path = getenv("MMC_BENCH_AUDIO") ? getenv("MMC_BENCH_AUDIO") : "build/bench/audio_30s.mp3";
    arg_t a = {.path = path};
    if (access(path, R_OK) != 0) {
        const char *py = getenv("MMC_REF_PY") ? getenv("MMC_REF_PY") : ".venv-ref/bin/python";
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s bench/peer_audio.py --make-clip %s", py, path);
        fprintf(stderr, "bench_audio: writing %s (%s)\n", path, cmd);
        if (system(cmd) != 0 || access(path, R_OK) != 0) fprintf(stderr, "bench_audio: no MP3 (needs PyAV); decode skipped\n");
    }
    if (access(path, R_OK) == 0) {   /* one figure, two peers (libswresample's default filter; soxr HQ) */
        double t = bench_time(decode, &a, 1, 3);
        bench_report("audio_decode_mp3_30s_16k", 1.0 / t, "clips/s", 1);
        bench_report("audio_decode_mp3_30s_16k_soxr", 1.0 / t, "clips/s", 1);
    }
    /* features of the same 30 s: the decoded clip, or a synthetic one without it */
    a.pcm = malloc(sizeof(float) * 480000);
    for (int i = 0; i < 480000; i++) a.pcm[i] = 0.3f * sinf(0.05f * i + 1e-6f * i * (float)i) + 0.01f * sinf(7.1f * i);
    mmc_audio au;
    if (access(path, R_OK) == 0 && mmc_audio_load(path, 16000, &au) == MMC_OK) {
        for (int64_t i = 0; i < 480000; i++) a.pcm[i] = i < au.n ? au.samples[i] : 0;
        mmc_audio_free(&au);
    }
    int mels[2] = {80, 128};
    for (int k = 0; k < 2; k++) {
        MMC_CHECK(mmc_whisper_fe_init(&a.fe, mels[k]) == MMC_OK, "%s", mmc_last_error());
        a.out = malloc(sizeof(float) * (size_t)mels[k] * 3000);
        char name[64];
        snprintf(name, sizeof name, "audio_logmel%d_30s", mels[k]);
        double t = bench_time(feats, &a, 1, 5);
        bench_report(name, 1.0 / t, "clips/s", 1);
        snprintf(name, sizeof name, "audio_logmel%d_30s_vs_numpy", mels[k]);
        bench_report(name, 1.0 / t, "clips/s", 1);
        double c0 = cpu_now();
        for (int r = 0; r < 40; r++) feats(&a);
        snprintf(name, sizeof name, "audio_logmel%d_30s_cpu_ms", mels[k]);
        bench_report(name, (cpu_now() - c0) / 40 * 1e3, "ms", 0);
        free(a.out);
        mmc_whisper_fe_free(&a.fe);
    }
    /* the FFT: 3000 frames of 400, one thread, against the DFT as a matrix product */
    fft_arg f = {.frames = 3000};
    MMC_CHECK(mmc_rfft_plan(400, &f.p) == MMC_OK, "%s", mmc_last_error());
    f.x = malloc(sizeof(double) * 400);
    f.re = malloc(sizeof(double) * 201);
    f.im = malloc(sizeof(double) * 201);
    f.xv = aligned_alloc(sizeof(mmc_fftv), sizeof(mmc_fftv) * (400 + 2 * 201 + (size_t)mmc_rfft_work_lanes(f.p)));
    f.rv = f.xv + 400;
    f.iv = f.rv + 201;
    f.w = f.iv + 201;
    f.cs = malloc(sizeof(double) * 201 * 800);
    for (int j = 0; j < 400; j++) {
        f.x[j] = sin(0.1 * j * j);
        for (int l = 0; l < MMC_FFT_LANES; l++) f.xv[j][l] = sin(0.1 * j * j + l);
    }
    for (int k = 0; k <= 200; k++)
        for (int j = 0; j < 400; j++) {
            double ang = -2 * M_PI * (double)((k * j) % 400) / 400;
            f.cs[(size_t)k * 800 + j] = cos(ang);
            f.cs[(size_t)k * 800 + 400 + j] = sin(ang);
        }
    double tf = bench_time(fft_run, &f, 0.5, 3), td = bench_time(dft_run, &f, 0.5, 3);
    bench_report_info("audio_rfft400_3000frames_1thread_ms", tf * 1e3, "ms");
    bench_report_info("audio_dft_matrix400_3000frames_1thread_ms", td * 1e3, "ms");
    mmc_rfft_free(f.p);
    free(f.x); free(f.re); free(f.im); free(f.xv); free(f.cs); free(a.pcm);
    return 0;
}
