/* test_spoken.c — espeak-ng speech (tests/fixtures/spoken: two questions spoken at 22050 Hz by
 * espeak-ng 1.51, tools/ref/gen_spoken.py) through mmc's audio path, against what transformers 5.23
 * computes on the same files:
 *   - the 16 kHz samples (22050 -> 16000 Hz through libswresample's soxr at 20-bit precision) against
 *     soxr.resample(..., quality="HQ") (librosa.load's resampler): max abs difference < 1e-4 (measured
 *     0: the same libsoxr engine) and the same length;
 *   - WhisperFeatureExtractor's 80-bin log-mel features (the Whisper fixture's preprocessor_config.json)
 *     of the real frames, computed by mmc on mmc's samples: < 1e-4 (measured 2.5e-5: float32 STFT /
 *     log rounding in quiet bins), and the attention mask length;
 *   - Qwen2_5OmniProcessor's 128-bin features (the omni thinker fixture): the real frame count equal and
 *     the features < 1e-4 (measured 2.6e-5).
 * The CLI side (mmc transcribe / generate on the same clips) is tests/test_spoken_cli.sh. */
#include "mmc_audio.h"
#include "mmc_omni.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIR_ "tests/fixtures/spoken"

static double maxdiff_rows(const float *got, int64_t got_stride, const float *want, int64_t rows, int64_t cols) {
    double m = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) m = fmax(m, fabs((double)got[r * got_stride + c] - want[r * cols + c]));
    return m;
}

int main(void) {
    mmc_st *ref = fixture_open("spoken/ref.safetensors");
    if (!ref) return test_done("test_spoken");
    mmc_whisper_fe wfe = {0}, ofe = {0};
    CHECK_OK(mmc_whisper_fe_load("tests/fixtures/whisper/model", &wfe));
    CHECK_OK(mmc_whisper_fe_load("tests/fixtures/omni/thinker", &ofe));
    CHECK(wfe.feature_size == 80 && ofe.feature_size == 128);
    const char *clips[] = {"colour", "count"};
    for (int k = 0; k < 2; k++) {
        char path[256], key[64];
        snprintf(path, sizeof path, DIR_ "/%s.wav", clips[k]);
        mmc_audio a = {0};
        CHECK_OK(mmc_audio_load(path, 16000, &a));
        CHECK(a.source_rate == 22050 && a.source_channels == 1);
        snprintf(key, sizeof key, "%s.samples", clips[k]);
        mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
        CHECKF(a.n == mmc_numel(want), "%s: %lld samples, soxr gives %lld", clips[k], (long long)a.n,
               (long long)mmc_numel(want));
        double d = maxdiff_rows(a.samples, 0, want->data, 1, a.n < mmc_numel(want) ? a.n : mmc_numel(want));
        printf("test_spoken: %s: %lld samples at 16 kHz, max |mmc - soxr HQ| = %.3g\n", clips[k], (long long)a.n, d);
        CHECKF(d < 1e-4, "%s: samples differ from soxr HQ by %.3g", clips[k], d);
        mmc_tensor_free(want);

        /* Whisper (80 bins): the real frames */
        float *wf = malloc(sizeof(float) * (size_t)wfe.feature_size * (size_t)wfe.nb_max_frames);
        int32_t *mask = malloc(sizeof(int32_t) * (size_t)wfe.nb_max_frames);
        CHECK_OK(mmc_whisper_features(&wfe, a.samples, a.n, wf, mask));
        int64_t frames = 0;
        for (int i = 0; i < wfe.nb_max_frames; i++) frames += mask[i];
        snprintf(key, sizeof key, "%s.whisper80", clips[k]);
        want = fixture_tensor(ref, key, MMC_F32);
        CHECKF(want->shape[0] == 80 && want->shape[1] == frames, "%s: %lld real frames, transformers %lld", clips[k],
               (long long)frames, (long long)want->shape[1]);
        if (want->shape[1] == frames) {
            d = maxdiff_rows(wf, wfe.nb_max_frames, want->data, 80, frames);
            printf("test_spoken: %s: Whisper 80-bin features, %lld frames, max diff %.3g\n", clips[k], (long long)frames, d);
            CHECKF(d < 1e-4, "%s: whisper features differ by %.3g", clips[k], d);
        }
        mmc_tensor_free(want);
        free(wf);
        free(mask);

        /* Qwen2.5-Omni (128 bins) */
        float *of = NULL;
        int64_t stride = 0, L = 0;
        CHECK_OK(mmc_omni_audio_features(&ofe, a.samples, a.n, &of, &stride, &L));
        snprintf(key, sizeof key, "%s.omni128", clips[k]);
        want = fixture_tensor(ref, key, MMC_F32);
        CHECKF(want->shape[0] == 128 && want->shape[1] == L, "%s: omni frames %lld, transformers %lld", clips[k],
               (long long)L, (long long)want->shape[1]);
        if (of && want->shape[1] == L) {
            d = maxdiff_rows(of, stride, want->data, 128, L);
            printf("test_spoken: %s: Qwen2.5-Omni 128-bin features, %lld frames, max diff %.3g\n", clips[k], (long long)L, d);
            CHECKF(d < 1e-4, "%s: omni features differ by %.3g", clips[k], d);
        }
        mmc_tensor_free(want);
        free(of);
        mmc_audio_free(&a);
    }
    mmc_whisper_fe_free(&wfe);
    mmc_whisper_fe_free(&ofe);
    mmc_st_close(ref);
    return test_done("test_spoken");
}
