/* mmc_audio.h — audio files through FFmpeg (WAV, FLAC, MP3, OGG/Opus, M4A/AAC and the audio
 * track of video files) decoded and resampled to mono float PCM at the rate the model takes
 * (16 kHz for Whisper and Qwen2.5-Omni), and the log-mel features of transformers'
 * WhisperFeatureExtractor.
 *
 * This header is the contract between the audio reader (src/io/audio.c), the feature
 * extractor (src/processors/whisper_features.c) and their users (Whisper, the omni thinker,
 * `mmc transcribe`). Functions return mmc_status and set mmc_last_error() naming the file and
 * what was wrong (corrupt, empty, zero sample rate, longer than the limit ...).
 */
#ifndef MMC_AUDIO_H
#define MMC_AUDIO_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mono PCM in [-1, 1]: samples[n], at sample_rate Hz. */
typedef struct {
    float *samples;     /* [n] */
    int64_t n;
    int sample_rate;
    double source_seconds;  /* duration of the decoded stream before resampling */
    int source_rate, source_channels;
} mmc_audio;

/* Longest audio this module decodes (samples at the target rate); beyond it the reader
 * refuses with a message (callers chunk long files themselves). */
#define MMC_AUDIO_MAX_SECONDS (4 * 3600)

/* Decode the first audio stream of `path` (any container FFmpeg demuxes, video files
 * included), downmix to mono and resample to `target_rate` Hz (1000 to 768000): mono is the
 * mean of the channels and the resampler libsoxr at HQ, as librosa.load(path, sr=...) gives
 * (README "Audio input" has the measured difference). With 2+ OpenMP threads decoding and
 * resampling overlap on two threads; the output does not depend on it. */
mmc_status mmc_audio_load(const char *path, int target_rate, mmc_audio *out);
/* Same from a buffer; `name` is used in messages. */
mmc_status mmc_audio_load_mem(const void *data, size_t size, const char *name, int target_rate,
                              mmc_audio *out);
/* The same refusing audio longer than max_seconds (0 or more than MMC_AUDIO_MAX_SECONDS: that
 * limit) with a message giving both lengths; the header's duration is checked before decoding
 * where the container states it, else decoding stops as soon as the limit is passed. */
mmc_status mmc_audio_load_max(const char *path, int target_rate, double max_seconds, mmc_audio *out);
mmc_status mmc_audio_load_mem_max(const void *data, size_t size, const char *name, int target_rate,
                                  double max_seconds, mmc_audio *out);
void mmc_audio_free(mmc_audio *a);

/* WhisperFeatureExtractor settings (preprocessor_config.json, or the "feature_extractor"
 * entry of processor_config.json) and its mel filter bank. */
typedef struct {
    int feature_size;      /* n_mels: 80 or 128 */
    int sampling_rate;     /* 16000 */
    int hop_length;        /* 160 */
    int chunk_length;      /* seconds: 30 */
    int n_fft;             /* 400 */
    int n_samples;         /* chunk_length * sampling_rate */
    int nb_max_frames;     /* n_samples / hop_length */
    float padding_value;
    bool return_attention_mask;
    float *mel_filters;    /* [n_fft/2+1, feature_size], as transformers builds it (slaney) */
    void *priv;            /* FFT plan, window and filters in double (whisper_features.c) */
} mmc_whisper_fe;

mmc_status mmc_whisper_fe_load(const char *model_dir, mmc_whisper_fe *fe);
/* Defaults of WhisperFeatureExtractor(feature_size=n_mels) without a file. */
mmc_status mmc_whisper_fe_init(mmc_whisper_fe *fe, int n_mels);
void mmc_whisper_fe_free(mmc_whisper_fe *fe);

/* Log-mel features of `pcm` (n samples at fe->sampling_rate) exactly as
 * WhisperFeatureExtractor(raw, sampling_rate, padding="max_length") returns them for one
 * clip: the clip padded (or, if longer than n_samples, refused — see below) to n_samples,
 * out[feature_size, nb_max_frames]; mask[nb_max_frames] (may be NULL) is the attention mask
 * of the real length. A clip longer than fe->n_samples returns MMC_ERR_INVALID saying so
 * (callers chunk; never silently truncated). */
mmc_status mmc_whisper_features(const mmc_whisper_fe *fe, const float *pcm, int64_t n,
                                float *out, int32_t *mask);

#ifdef __cplusplus
}
#endif
#endif
