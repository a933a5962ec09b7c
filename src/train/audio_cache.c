/* audio_cache.c — the data loader's cache of audio features (data.audio_cache_mb): a clip's
 * WhisperFeatureExtractor features, only its real frames ([mels, frames], not the 30 s of padding),
 * kept by (path, silent) so that a dataset whose many records share few clips (the spoken-question
 * demo: 20000 images, 2100 clips) decodes (FFmpeg), resamples and transforms each clip once. The
 * features are a pure function of the file, so a hit returns exactly what a miss computes. Filled
 * until its byte budget is spent, then it only serves what it holds (no eviction). Thread-safe: the
 * loader's workers share one; two workers missing the same clip both compute it and the second
 * insertion is dropped. Owned by the loader (mmc_loader_new_dataset / mmc_loader_free).
 */
#include "data_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    struct entry *next;
    char *path;
    bool silent;
    int64_t mels, frames;
    float *feats;   /* [mels, frames] */
} entry;

struct mmc_audio_cache {
    pthread_mutex_t mu;
    entry **tab;
    size_t n_tab;
    size_t bytes, budget;
};

static size_t hash_key(const char *s, bool silent) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)silent;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)h;
}

mmc_audio_cache *mmc_audio_cache_new(size_t budget_bytes) {
    mmc_audio_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->n_tab = 4096;
    c->tab = calloc(c->n_tab, sizeof *c->tab);
    if (!c->tab) { free(c); return NULL; }
    c->budget = budget_bytes;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void mmc_audio_cache_free(mmc_audio_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_tab; i++)
        for (entry *e = c->tab[i], *nx; e; e = nx) {
            nx = e->next;
            free(e->path);
            free(e->feats);
            free(e);
        }
    free(c->tab);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

bool mmc_audio_cache_get(mmc_audio_cache *c, const char *path, bool silent, int64_t mels, float *dst,
                         int64_t dst_stride, int64_t *frames) {
    if (!c) return false;
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    for (entry *e = c->tab[hash_key(path, silent) % c->n_tab]; e; e = e->next)
        if (e->silent == silent && e->mels == mels && !strcmp(e->path, path)) {
            if (e->frames <= dst_stride) {
                for (int64_t m = 0; m < mels; m++)
                    memcpy(dst + m * dst_stride, e->feats + m * e->frames, sizeof(float) * (size_t)e->frames);
                *frames = e->frames;
                hit = true;
            }
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void mmc_audio_cache_put(mmc_audio_cache *c, const char *path, bool silent, int64_t mels, const float *src,
                         int64_t src_stride, int64_t frames) {
    if (!c) return;
    const size_t need = sizeof(float) * (size_t)(mels * frames) + strlen(path) + sizeof(entry);
    pthread_mutex_lock(&c->mu);
    size_t h = hash_key(path, silent) % c->n_tab;
    bool have = false;
    for (entry *e = c->tab[h]; e && !have; e = e->next)
        have = e->silent == silent && e->mels == mels && !strcmp(e->path, path);
    if (!have && c->bytes + need <= c->budget) {
        entry *e = calloc(1, sizeof *e);
        float *f = malloc(sizeof(float) * (size_t)(mels * frames));
        char *p = strdup(path);
        if (e && f && p) {
            for (int64_t m = 0; m < mels; m++) memcpy(f + m * frames, src + m * src_stride, sizeof(float) * (size_t)frames);
            *e = (entry){.next = c->tab[h], .path = p, .silent = silent, .mels = mels, .frames = frames, .feats = f};
            c->tab[h] = e;
            c->bytes += need;
        } else {   /* out of memory: simply not cached */
            free(e);
            free(f);
            free(p);
        }
    }
    pthread_mutex_unlock(&c->mu);
}
