/* fuzz_audio.c — libFuzzer target for the audio entry point: mmc_audio_load_mem (FFmpeg
 * demuxing from memory through a custom AVIOContext, decoding, the libswresample downmix and
 * resampling to 16 kHz, the length and truncation checks), then the Whisper log-mel features
 * of what was decoded (clipped to 30 s as a caller chunks it). */
#include "mmc_audio.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mmc_whisper_fe fe;
    static int ready;
    if (!ready) ready = mmc_whisper_fe_init(&fe, 80) == MMC_OK ? 1 : -1;
    mmc_audio a;
    if (mmc_audio_load_mem(data, size, "fuzz", 16000, &a) != MMC_OK) return 0;
    if (ready == 1 && a.n > 0) {
        static float *feats;
        if (!feats) feats = malloc(sizeof(float) * 80 * 3000);
        int64_t n = a.n < fe.n_samples ? a.n : fe.n_samples;
        if (feats) (void)mmc_whisper_features(&fe, a.samples, n, feats, NULL);
    }
    mmc_audio_free(&a);
    return 0;
}
