/* omni_processor.c — Qwen2_5OmniProcessor's input side (transformers 5.23,
 * models/qwen2_5_omni/processing_qwen2_5_omni.py) without videos:
 *   audio: WhisperFeatureExtractor(audio, padding="max_length") -> input_features [n_mels, 3000] and
 *          feature_attention_mask (its sum is the real frame count L); <|AUDIO|> becomes
 *          _get_feat_extract_output_lengths(L) = ((L - 1) // 2 + 1 - 2) // 2 + 1 tokens;
 *   images: the Qwen2-VL image processor (mmc_vlproc.h); <|IMAGE|> becomes t*h*w / merge^2 tokens.
 * The expansion is done on token ids (the placeholders are single added tokens, so it equals
 * transformers' expansion of the text before tokenising). Audio longer than the feature
 * extractor's 30 s window is refused (transformers would truncate it silently). */
#include "mmc_omni.h"
#include "mmc_audio.h"

#include <stdlib.h>
#include <string.h>

static int64_t image_tokens(const mmc_omni *m, const int64_t *g) {
    int64_t ms = m->visual->cfg.spatial_merge_size;
    return g[0] * g[1] * g[2] / (ms * ms);
}

mmc_status mmc_omni_audio_features(const mmc_whisper_fe *fe, const float *pcm, int64_t n, float **feats,
                                   int64_t *stride, int64_t *frames) {
    *feats = NULL, *stride = *frames = 0;
    const int64_t F = fe->nb_max_frames, M = fe->feature_size;
    float *f = malloc(sizeof(float) * (size_t)(M * F));
    int32_t *mask = malloc(sizeof(int32_t) * (size_t)F);
    if (!f || !mask) { free(f); free(mask); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    mmc_status st = mmc_whisper_features(fe, pcm, n, f, mask);
    if (st) { free(f); free(mask); return mmc_error_prefix(st, "Qwen2.5-Omni audio (%d s window)", fe->chunk_length); }
    int64_t L = 0;
    for (int64_t i = 0; i < F; i++) L += mask[i] != 0;
    free(mask);
    if (L < 1) { free(f); return mmc_error(MMC_ERR_INVALID, "Qwen2.5-Omni audio: the clip is empty"); }
    *feats = f, *stride = F, *frames = L;
    return MMC_OK;
}

mmc_status mmc_omni_expand(const mmc_omni *m, const int32_t *ids, int64_t n, const mmc_omni_media *media,
                           int32_t **out, int64_t *n_out) {
    *out = NULL, *n_out = 0;
    static const mmc_omni_media none = {0};
    if (!media) media = &none;
    const int32_t at = (int32_t)m->audio_token_id, it = (int32_t)m->image_token_id, vt = (int32_t)m->video_token_id;
    int64_t total = 0;
    int na = 0, ni = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == at) {
            if (na >= media->n_audios)
                return mmc_error(MMC_ERR_INVALID, "the prompt has more <|AUDIO|> placeholders than the %d audio%s given",
                                 media->n_audios, media->n_audios == 1 ? "" : "s");
            total += mmc_omni_audio_tokens(media->audios[na++].frames);
        } else if (ids[i] == it) {
            if (ni >= media->n_images)
                return mmc_error(MMC_ERR_INVALID, "the prompt has more <|IMAGE|> placeholders than the %d image%s given",
                                 media->n_images, media->n_images == 1 ? "" : "s");
            total += image_tokens(m, media->image_grid_thw + 3 * ni++);
        } else if (ids[i] == vt) {
            return mmc_error(MMC_ERR_UNSUPPORTED, "Qwen2.5-Omni: videos (<|VIDEO|>) are not supported yet");
        } else {
            total++;
        }
    }
    if (na != media->n_audios || ni != media->n_images)
        return mmc_error(MMC_ERR_INVALID, "the prompt has %d <|AUDIO|> and %d <|IMAGE|> placeholders for %d audio%s and "
                         "%d image%s", na, ni, media->n_audios, media->n_audios == 1 ? "" : "s", media->n_images,
                         media->n_images == 1 ? "" : "s");
    int32_t *o = malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
    if (!o) return mmc_error(MMC_ERR_OOM, "out of memory");
    int64_t k = 0;
    na = ni = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = ids[i] == at ? mmc_omni_audio_tokens(media->audios[na++].frames)
                  : ids[i] == it ? image_tokens(m, media->image_grid_thw + 3 * ni++) : 1;
        for (int64_t j = 0; j < r; j++) o[k++] = ids[i];
    }
    *out = o, *n_out = total;
    return MMC_OK;
}

