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

/* get_chunked_index: split increasing values into runs [b[k], b[k+1]) at each crossing of a
 * multiple of tpc (one crossing per element, as transformers' loop); returns the run count. */
int mmc_omni_chunks(const double *vals, int64_t n, double tpc, int64_t *b) {
    int k = 0;
    int64_t cur = 1;
    b[0] = 0;
    for (int64_t i = 0; i < n; i++)
        if (vals[i] >= (double)cur * tpc) b[++k] = i, cur++;
    b[++k] = n;
    return k;
}

/* The processor's <|VIDEO|> replacement with its audio: video chunk j then audio chunk j. */
static mmc_status video_audio_block(const mmc_omni *m, const int64_t *g, double spg, int64_t n_audio, int32_t *o,
                                    int64_t *len) {
    const int64_t ms = m->visual->cfg.spatial_merge_size, hw = (g[1] / ms) * (g[2] / ms), nv = g[0] * hw;
    double *vv = malloc(sizeof(double) * (size_t)(nv + n_audio + 1));
    int64_t *bv = malloc(sizeof(int64_t) * (size_t)(nv + 2)), *ba = malloc(sizeof(int64_t) * (size_t)(n_audio + 2));
    if (!vv || !bv || !ba) { free(vv); free(bv); free(ba); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    double *va = vv + nv;
    for (int64_t i = 0; i < nv; i++) vv[i] = (double)(i / hw) * spg * m->position_id_per_seconds;
    for (int64_t i = 0; i < n_audio; i++) va[i] = (double)i;
    double tpc = (double)(int64_t)(m->position_id_per_seconds * m->seconds_per_chunk);
    int cv = mmc_omni_chunks(vv, nv, tpc, bv), ca = mmc_omni_chunks(va, n_audio, tpc, ba);
    int64_t k = 0;
    if (o) o[k] = (int32_t)m->audio_start_token_id;
    k++;
    for (int j = 0; j < (cv > ca ? cv : ca); j++) {
        if (j < cv)
            for (int64_t i = bv[j]; i < bv[j + 1]; i++, k++)
                if (o) o[k] = (int32_t)m->video_token_id;
        if (j < ca)
            for (int64_t i = ba[j]; i < ba[j + 1]; i++, k++)
                if (o) o[k] = (int32_t)m->audio_token_id;
    }
    if (o) o[k] = (int32_t)m->audio_end_token_id;
    k++;
    *len = k;
    free(vv), free(bv), free(ba);
    return MMC_OK;
}

mmc_status mmc_omni_expand(const mmc_omni *m, const int32_t *ids, int64_t n, const mmc_omni_media *media,
                           int32_t **out, int64_t *n_out) {
    *out = NULL, *n_out = 0;
    static const mmc_omni_media none = {0};
    if (!media) media = &none;
    const int32_t at = (int32_t)m->audio_token_id, it = (int32_t)m->image_token_id, vt = (int32_t)m->video_token_id;
    int32_t *o = NULL;
    mmc_status st = MMC_OK;
    for (int pass = 0; pass < 2; pass++) {
        int64_t k = 0;
        int na = 0, ni = 0, nv = 0;
        for (int64_t i = 0; i < n; i++) {
            if (ids[i] == at || (ids[i] == vt && media->use_audio_in_video)) {
                if (na >= media->n_audios)
                    return free(o), mmc_error(MMC_ERR_INVALID, "the prompt has more audio placeholders (<|AUDIO|>%s) "
                                              "than the %d audio%s given", media->use_audio_in_video ?
                                              ", and <|VIDEO|> with its audio track" : "", media->n_audios,
                                              media->n_audios == 1 ? "" : "s");
            }
            if (ids[i] == it && ni >= media->n_images)
                return free(o), mmc_error(MMC_ERR_INVALID, "the prompt has more <|IMAGE|> placeholders than the %d "
                                          "image%s given", media->n_images, media->n_images == 1 ? "" : "s");
            if (ids[i] == vt && nv >= media->n_videos)
                return free(o), mmc_error(MMC_ERR_INVALID, "the prompt has more <|VIDEO|> placeholders than the %d "
                                          "video%s given", media->n_videos, media->n_videos == 1 ? "" : "s");
            if (ids[i] == at) {
                int64_t r = mmc_omni_audio_tokens(media->audios[na++].frames);
                for (int64_t j = 0; j < r; j++, k++)
                    if (o) o[k] = at;
            } else if (ids[i] == it) {
                int64_t r = image_tokens(m, media->image_grid_thw + 3 * ni++);
                for (int64_t j = 0; j < r; j++, k++)
                    if (o) o[k] = it;
            } else if (ids[i] == vt && media->use_audio_in_video) {
                int64_t len = 0;
                double spg = media->second_per_grid ? media->second_per_grid[nv] : 1.0;
                st = video_audio_block(m, media->video_grid_thw + 3 * nv, spg,
                                       mmc_omni_audio_tokens(media->audios[na].frames), o ? o + k : NULL, &len);
                if (st) return free(o), st;
                nv++, na++, k += len;
            } else if (ids[i] == vt) {
                int64_t r = image_tokens(m, media->video_grid_thw + 3 * nv++);
                for (int64_t j = 0; j < r; j++, k++)
                    if (o) o[k] = vt;
            } else {
                if (o) o[k] = ids[i];
                k++;
            }
        }
        if (na != media->n_audios || ni != media->n_images || nv != media->n_videos)
            return free(o), mmc_error(MMC_ERR_INVALID, "the prompt's placeholders take %d audio%s, %d image%s and %d "
                                      "video%s but %d, %d and %d were given", na, na == 1 ? "" : "s", ni,
                                      ni == 1 ? "" : "s", nv, nv == 1 ? "" : "s", media->n_audios, media->n_images,
                                      media->n_videos);
        if (pass == 0) {
            o = malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
            if (!o) return mmc_error(MMC_ERR_OOM, "out of memory");
        } else {
            *n_out = k;
        }
    }
    *out = o;
    return MMC_OK;
}
