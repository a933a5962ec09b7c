/* data_loader.c — the multi-threaded data loader: N pthread workers prepare samples
 * (image decode + preprocessing + tokenisation) into a bounded ring of prefetch slots; the
 * caller's thread takes them strictly in order and builds packed rows or length-bucketed
 * padded micro-batches. Mirrors what torch's DataLoader(num_workers=N, prefetch_factor)
 * gives a PyTorch trainer, with two guarantees it does not give by default: the output is
 * identical for any worker count, and a saved (epoch, position) state resumes at the exact
 * sample.
 *
 * Every sample the loader will ever ask for has a "ticket" t: epoch = t / N, position =
 * t % N, dataset index = perm_epoch[position] (Philox Fisher-Yates from (seed, epoch)).
 * Workers claim tickets in increasing order, at most `prefetch` ahead of the consumer, and
 * write the result into slot t % prefetch. Because the consumer only ever reads ticket
 * `consume`, worker scheduling cannot change what it sees.
 */
#include "data_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SLOT_EMPTY = 0, SLOT_BUSY, SLOT_READY };

typedef struct {
    int64_t ticket;
    int state;
    mmc_batch b;
    mmc_status st;
    bool media_err;
    char *err;
} slot_t;

typedef struct {
    mmc_batch b;
    int64_t ticket;
} item_t;

struct mmc_loader {
    mmc_data_opts o;             /* copy; strings cleared */
    const mmc_tokenizer *tok;
    mmc_dataset *own_ds;
    const mmc_dataset *ds;
    int64_t N;
    mmc_data_split split;
    int32_t pad_id;
    /* permutations of recent epochs (looked up under mu) */
    struct { int64_t epoch; int64_t *perm; } pc[4];
    int pc_next;
    /* worker pool */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    pthread_t *threads;
    int n_threads;
    bool stop;
    slot_t *slots;
    int64_t cap;
    int64_t next_claim, consume, end_ticket;
    /* skip accounting (consumer thread only) */
    int64_t skipped, consec_skips;
    uint8_t *reported;
    /* packed: a sample taken but not yet placed */
    bool has_carry;
    item_t carry;
    /* padded: the current window, sorted, cut into batches */
    item_t *win;
    int64_t win_n, win_nb, win_k, win_epoch, win_pos, pending_k;
    int64_t *win_order;
    item_t **win_ptrs;
    int64_t W;
    /* packed: the current row's samples */
    item_t *pbuf, **pits;
};

/* ------------------------------------------------------------------ order */
static const int64_t *perm_of(mmc_loader *L, int64_t epoch) {
    for (int i = 0; i < 4; i++)
        if (L->pc[i].perm && L->pc[i].epoch == epoch) return L->pc[i].perm;
    int s = L->pc_next;
    L->pc_next = (s + 1) % 4;
    int64_t *p = L->pc[s].perm;
    if (!p) p = L->pc[s].perm = malloc((size_t)L->N * sizeof *p);
    MMC_CHECK(p, "data loader: out of memory for a %lld-sample permutation", (long long)L->N);
    L->pc[s].epoch = epoch;
    for (int64_t i = 0; i < L->N; i++) p[i] = i;
    mmc_rng r;
    mmc_rng_init(&r, (uint64_t)L->o.seed);
    r.offset = (uint64_t)epoch << 36;
    for (int64_t i = L->N - 1; i > 0; i--) {
        int64_t j = (int64_t)(mmc_rng_u64(&r) % (uint64_t)(i + 1));
        int64_t x = p[i]; p[i] = p[j]; p[j] = x;
    }
    return p;
}

static int64_t sample_of(mmc_loader *L, int64_t ticket) {
    int64_t e = ticket / L->N, pos = ticket % L->N;
    if (L->split == MMC_SPLIT_EVAL || !L->o.shuffle) return pos;
    return perm_of(L, e)[pos];
}

/* ------------------------------------------------------------------ workers */
static void *worker_main(void *arg) {
    mmc_loader *L = arg;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (!L->stop && !(L->next_claim < L->consume + L->cap && L->next_claim < L->end_ticket))
            pthread_cond_wait(&L->cv_work, &L->mu);
        if (L->stop) break;
        int64_t t = L->next_claim++;
        int64_t idx = sample_of(L, t);
        slot_t *s = &L->slots[t % L->cap];
        s->ticket = t;
        s->state = SLOT_BUSY;
        pthread_mutex_unlock(&L->mu);
        mmc_batch b;
        bool me = false;
        mmc_status st = mmc_data_prepare_ex(&L->o, L->tok, L->ds, idx, false, &b, &me);
        char *err = st ? strdup(mmc_last_error()) : NULL;
        pthread_mutex_lock(&L->mu);
        s->b = b;
        s->st = st;
        s->media_err = me;
        s->err = err;
        s->state = SLOT_READY;
        pthread_cond_broadcast(&L->cv_ready);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

static mmc_status start_workers(mmc_loader *L) {
    L->stop = false;
    L->n_threads = 0;
    for (int i = 0; i < (int)L->o.num_workers; i++) {
        if (pthread_create(&L->threads[i], NULL, worker_main, L) != 0)
            return mmc_error(MMC_ERR_INVALID, "data loader: cannot start worker thread %d", i);
        L->n_threads++;
    }
    return MMC_OK;
}

static void stop_workers(mmc_loader *L) {
    pthread_mutex_lock(&L->mu);
    L->stop = true;
    pthread_cond_broadcast(&L->cv_work);
    pthread_mutex_unlock(&L->mu);
    for (int i = 0; i < L->n_threads; i++) pthread_join(L->threads[i], NULL);
    L->n_threads = 0;
    for (int64_t i = 0; i < L->cap; i++) {
        slot_t *s = &L->slots[i];
        mmc_batch_free(&s->b);
        free(s->err);
        memset(s, 0, sizeof *s);
        s->ticket = -1;
    }
}

/* Result of ticket `consume` (the caller checks consume < end_ticket). */
static void take(mmc_loader *L, mmc_batch *b, mmc_status *st, bool *me, char **err) {
    int64_t t = L->consume;
    if (L->n_threads == 0) {
        int64_t idx = sample_of(L, t);
        *me = false;
        *st = mmc_data_prepare_ex(&L->o, L->tok, L->ds, idx, false, b, me);
        *err = *st ? strdup(mmc_last_error()) : NULL;
        L->consume++;
        L->next_claim = L->consume;
        return;
    }
    pthread_mutex_lock(&L->mu);
    slot_t *s = &L->slots[t % L->cap];
    while (!(s->ticket == t && s->state == SLOT_READY)) pthread_cond_wait(&L->cv_ready, &L->mu);
    *b = s->b;
    *st = s->st;
    *me = s->media_err;
    *err = s->err;
    memset(s, 0, sizeof *s);
    s->ticket = -1;
    L->consume++;
    pthread_cond_broadcast(&L->cv_work);
    pthread_mutex_unlock(&L->mu);
}

/* Next successfully prepared sample with ticket < limit; *end when none is left. Media
 * failures are skipped (counted, reported once per sample) unless strict. */
static mmc_status next_sample(mmc_loader *L, int64_t limit, item_t *it, bool *end) {
    *end = false;
    for (;;) {
        if (L->consume >= limit) { *end = true; return MMC_OK; }
        int64_t t = L->consume;
        mmc_batch b;
        mmc_status st;
        bool me;
        char *err;
        take(L, &b, &st, &me, &err);
        if (!st) {
            L->consec_skips = 0;
            it->b = b;
            it->ticket = t;
            return MMC_OK;
        }
        if (me && !L->o.strict) {
            pthread_mutex_lock(&L->mu);
            int64_t idx = sample_of(L, t);
            pthread_mutex_unlock(&L->mu);
            L->skipped++;
            if (!(L->reported[idx >> 3] & (1u << (idx & 7)))) {
                L->reported[idx >> 3] |= (uint8_t)(1u << (idx & 7));
                fprintf(stderr, "mmc data: skipping sample %lld: %s\n", (long long)idx, err ? err : "?");
            }
            free(err);
            if (++L->consec_skips >= L->N)
                return mmc_error(MMC_ERR_FORMAT, "%s: every sample failed to load (last: sample %lld); check "
                                 "image_root", mmc_dataset_path(L->ds), (long long)idx);
            continue;
        }
        mmc_error(st, "%s%s", err ? err : "data: sample failed",
                  me ? " (data.strict is true; set it to false to skip such samples)" : "");
        free(err);
        return st;
    }
}

/* ------------------------------------------------------------------ batches */
static mmc_status assemble(mmc_loader *L, item_t *const *its, int n, bool packed, mmc_batch *out) {
    memset(out, 0, sizeof *out);
    int64_t T = 0, sum = 0, np = 0, nvp = 0, dim = 0;
    int ni = 0, nv = 0, na = 0;
    int64_t amels = 0, astride = 0;
    for (int i = 0; i < n; i++) {
        const mmc_batch *s = &its[i]->b;
        na += s->n_audios;
        if (s->n_audios) amels = s->audio_mels;
        if (s->n_audios && s->audio_stride > astride) astride = s->audio_stride;   /* the longest clip's frames */
        if (s->T > T) T = s->T;
        sum += s->T;
        np += s->n_patches;
        nvp += s->n_video_patches;
        ni += s->n_images;
        nv += s->n_videos;
        if (s->patch_dim) dim = s->patch_dim;
    }
    out->B = packed ? 1 : n;
    out->T = packed ? L->o.seq_len : T;
    MMC_CHECK(!packed || sum <= out->T, "packed %lld tokens into a row of %lld", (long long)sum, (long long)out->T);
    size_t cells = (size_t)(out->B * out->T);
    out->input_ids = malloc(cells * sizeof(int32_t));
    out->labels = malloc(cells * sizeof(int32_t));
    out->sample_ids = malloc((size_t)n * sizeof(int64_t));
    if (packed) out->cu_seqlens = malloc((size_t)(n + 1) * sizeof(int32_t));
    if (np) { out->pixel_values = malloc((size_t)(np * dim) * sizeof(float)); out->image_grid_thw = malloc((size_t)ni * 3 * sizeof(int64_t)); }
    if (nvp) {
        out->video_values = malloc((size_t)(nvp * dim) * sizeof(float));
        out->video_grid_thw = malloc((size_t)nv * 3 * sizeof(int64_t));
        out->video_second_per_grid_ts = malloc((size_t)nv * sizeof(double));
    }
    const size_t acells = (size_t)(amels * astride);   /* one audio's features */
    bool audio_oom = false;
    if (na) {
        out->audio_feats = calloc((size_t)na * acells, sizeof(float));
        out->audio_frames = malloc((size_t)na * sizeof(int64_t));
        audio_oom = !out->audio_feats || !out->audio_frames;
        out->audio_mels = amels, out->audio_stride = astride;
    }
    if (audio_oom || !out->input_ids || !out->labels || !out->sample_ids || (packed && !out->cu_seqlens) ||
        (np && (!out->pixel_values || !out->image_grid_thw)) || (nvp && (!out->video_values || !out->video_grid_thw || !out->video_second_per_grid_ts))) {
        mmc_batch_free(out);
        return mmc_error(MMC_ERR_OOM, "data loader: out of memory for a [%lld, %lld] batch", (long long)out->B,
                         (long long)out->T);
    }
    for (size_t c = 0; c < cells; c++) { out->input_ids[c] = L->pad_id; out->labels[c] = MMC_IGNORE_INDEX; }
    out->n_seqs = n;
    out->patch_dim = dim;
    int64_t pos = 0;
    if (packed) out->cu_seqlens[0] = 0;
    for (int i = 0; i < n; i++) {
        const mmc_batch *s = &its[i]->b;
        size_t at = packed ? (size_t)pos : (size_t)(i * out->T);
        memcpy(out->input_ids + at, s->input_ids, (size_t)s->T * sizeof(int32_t));
        memcpy(out->labels + at, s->labels, (size_t)s->T * sizeof(int32_t));
        out->labels[at] = MMC_IGNORE_INDEX; /* never scored across a segment boundary */
        pos += s->T;
        if (packed) out->cu_seqlens[i + 1] = (int32_t)pos;
        out->sample_ids[i] = s->sample_ids[0];
        if (s->n_patches) {
            memcpy(out->pixel_values + out->n_patches * dim, s->pixel_values, (size_t)(s->n_patches * dim) * sizeof(float));
            memcpy(out->image_grid_thw + 3 * out->n_images, s->image_grid_thw, (size_t)s->n_images * 3 * sizeof(int64_t));
            out->n_patches += s->n_patches;
            out->n_images += s->n_images;
        }
        if (s->n_video_patches) {
            memcpy(out->video_values + out->n_video_patches * dim, s->video_values, (size_t)(s->n_video_patches * dim) * sizeof(float));
            memcpy(out->video_grid_thw + 3 * out->n_videos, s->video_grid_thw, (size_t)s->n_videos * 3 * sizeof(int64_t));
            for (int k = 0; k < s->n_videos; k++)
                out->video_second_per_grid_ts[out->n_videos + k] = s->video_second_per_grid_ts ? s->video_second_per_grid_ts[k] : 1.0;
            out->n_video_patches += s->n_video_patches;
            out->n_videos += s->n_videos;
        }
        if (s->n_audios) {   /* one feature extractor (same mels); each row re-strided to the batch's */
            for (int64_t a = 0; a < s->n_audios; a++)
                for (int64_t m = 0; m < amels; m++)
                    memcpy(out->audio_feats + (size_t)(out->n_audios + a) * acells + (size_t)(m * astride),
                           s->audio_feats + (size_t)((a * amels + m) * s->audio_stride), (size_t)s->audio_frames[a] * sizeof(float));
            memcpy(out->audio_frames + out->n_audios, s->audio_frames, (size_t)s->n_audios * sizeof(int64_t));
            out->n_audios += s->n_audios;
        }
    }
    out->n_tokens = sum;
    for (int64_t b = 0; b < out->B; b++)
        for (int64_t t = 1; t < out->T; t++) out->n_label_tokens += out->labels[b * out->T + t] != MMC_IGNORE_INDEX;
    out->sample_index = n ? out->sample_ids[0] : -1;
    return MMC_OK;
}

static mmc_status next_packed(mmc_loader *L, mmc_batch *out) {
    if (!L->pbuf) { /* every sample has >= 1 token: at most seq_len segments per row */
        L->pbuf = malloc((size_t)L->o.seq_len * sizeof *L->pbuf);
        L->pits = malloc((size_t)L->o.seq_len * sizeof *L->pits);
        if (!L->pbuf || !L->pits) return mmc_error(MMC_ERR_OOM, "data loader: out of memory");
    }
    item_t **its = L->pits, *buf = L->pbuf;
    int n = 0;
    int64_t used = 0;
    mmc_status st = MMC_OK;
    int64_t cap = L->o.seq_len;
    while (n < cap) {
        item_t it;
        if (L->has_carry) { it = L->carry; L->has_carry = false; }
        else {
            bool end;
            if ((st = next_sample(L, L->end_ticket, &it, &end))) goto done;
            if (end) break;
        }
        if (used + it.b.T > L->o.seq_len) { L->carry = it; L->has_carry = true; break; }
        buf[n] = it;
        its[n] = &buf[n];
        n++;
        used += it.b.T;
        if (used == L->o.seq_len) break;
    }
    if (n == 0) { memset(out, 0, sizeof *out); goto done; } /* eval: the end */
    st = assemble(L, its, n, true, out);
done:
    for (int i = 0; i < n; i++) mmc_batch_free(&buf[i].b);
    return st;
}

static void window_clear(mmc_loader *L) {
    for (int64_t i = 0; i < L->win_n; i++) mmc_batch_free(&L->win[i].b);
    L->win_n = L->win_nb = L->win_k = 0;
}

static int cmp_len(const void *a, const void *b) {
    const item_t *x = a, *y = b;
    if (x->b.T != y->b.T) return x->b.T < y->b.T ? -1 : 1;
    return x->ticket < y->ticket ? -1 : x->ticket > y->ticket;
}

static mmc_status next_padded(mmc_loader *L, mmc_batch *out) {
    mmc_status st;
    const int64_t mb = L->o.micro_batch_size;
    while (L->win_k >= L->win_nb) { /* fill the next window */
        window_clear(L);
        int64_t t0 = L->consume;
        if (t0 >= L->end_ticket) { memset(out, 0, sizeof *out); return MMC_OK; }
        int64_t epoch = t0 / L->N, pos = t0 % L->N;
        int64_t wend = epoch * L->N + (pos + L->W < L->N ? pos + L->W : L->N);
        if (wend > L->end_ticket) wend = L->end_ticket;
        for (;;) {
            bool end;
            item_t it;
            if ((st = next_sample(L, wend, &it, &end))) { window_clear(L); return st; }
            if (end) break;
            L->win[L->win_n++] = it;
        }
        if (L->win_n == 0) continue;
        bool train = L->split == MMC_SPLIT_TRAIN;
        if (train && L->W > mb) qsort(L->win, (size_t)L->win_n, sizeof *L->win, cmp_len);
        L->win_nb = (L->win_n + mb - 1) / mb;
        for (int64_t i = 0; i < L->win_nb; i++) L->win_order[i] = i;
        if (train && L->o.shuffle && L->W > mb) { /* batch order within the window */
            mmc_rng r;
            mmc_rng_init(&r, (uint64_t)L->o.seed ^ 0x9E3779B97F4A7C15ull);
            r.offset = ((uint64_t)epoch << 36) + ((uint64_t)(pos / L->W) << 16);
            for (int64_t i = L->win_nb - 1; i > 0; i--) {
                int64_t j = (int64_t)(mmc_rng_u64(&r) % (uint64_t)(i + 1));
                int64_t x = L->win_order[i]; L->win_order[i] = L->win_order[j]; L->win_order[j] = x;
            }
        }
        L->win_epoch = epoch;
        L->win_pos = pos;
        L->win_k = L->pending_k < L->win_nb ? L->pending_k : L->win_nb;
        L->pending_k = 0;
    }
    int64_t b = L->win_order[L->win_k++];
    int64_t a = b * mb, e = a + mb < L->win_n ? a + mb : L->win_n;
    item_t **its = L->win_ptrs;
    for (int64_t i = a; i < e; i++) its[i - a] = &L->win[i];
    st = assemble(L, its, (int)(e - a), false, out);
    /* each window sample is used by one batch: release it now (peak memory, heap reuse) */
    for (int64_t i = a; i < e; i++) mmc_batch_free(&L->win[i].b);
    return st;
}

mmc_status mmc_loader_next(mmc_loader *L, mmc_batch *out) {
    if (!L || !out) return mmc_error(MMC_ERR_INVALID, "mmc_loader_next: NULL argument");
    bool packed = L->o.packing && L->split == MMC_SPLIT_TRAIN;
    return packed ? next_packed(L, out) : next_padded(L, out);
}

/* ------------------------------------------------------------------ state */
mmc_loader_state mmc_loader_state_get(const mmc_loader *L) {
    mmc_loader_state s = {0};
    s.skipped = L->skipped;
    if (L->win_k < L->win_nb) {
        s.epoch = L->win_epoch;
        s.position = L->win_pos;
        s.batch_in_window = L->win_k;
        return s;
    }
    int64_t t = L->has_carry ? L->carry.ticket : L->consume;
    s.epoch = t / L->N;
    s.position = t % L->N;
    s.batch_in_window = L->pending_k; /* restored, window not refilled yet */
    return s;
}

mmc_status mmc_loader_restore(mmc_loader *L, const mmc_loader_state *s) {
    if (s->epoch < 0 || s->position < 0 || s->position >= L->N || s->batch_in_window < 0)
        return mmc_error(MMC_ERR_INVALID, "data loader state (epoch %lld, position %lld, batch %lld) does not fit "
                         "a dataset of %lld samples (was the dataset changed?)", (long long)s->epoch,
                         (long long)s->position, (long long)s->batch_in_window, (long long)L->N);
    stop_workers(L);
    window_clear(L);
    if (L->has_carry) { mmc_batch_free(&L->carry.b); L->has_carry = false; }
    L->consume = L->next_claim = s->epoch * L->N + s->position;
    L->pending_k = s->batch_in_window;
    L->skipped = s->skipped;
    L->consec_skips = 0;
    return start_workers(L);
}

int64_t mmc_loader_skipped(const mmc_loader *L) { return L ? L->skipped : 0; }
const mmc_dataset *mmc_loader_dataset(const mmc_loader *L) { return L ? L->ds : NULL; }

/* ------------------------------------------------------------------ lifetime */
void mmc_loader_free(mmc_loader *L) {
    if (!L) return;
    if (L->slots) stop_workers(L);
    window_clear(L);
    if (L->has_carry) mmc_batch_free(&L->carry.b);
    for (int i = 0; i < 4; i++) free(L->pc[i].perm);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv_work);
    pthread_cond_destroy(&L->cv_ready);
    free(L->threads);
    free(L->slots);
    free(L->reported);
    free(L->win);
    free(L->win_order);
    free(L->win_ptrs);
    free(L->pbuf);
    free(L->pits);
    mmc_audio_cache_free(L->o.audio_cache);
    mmc_dataset_free(L->own_ds);
    free(L);
}

mmc_status mmc_loader_new_dataset(const mmc_data_opts *opts, const mmc_tokenizer *tok, const mmc_dataset *ds,
                                  mmc_data_split split, mmc_loader **out) {
    *out = NULL;
    if (!opts || !tok || !ds) return mmc_error(MMC_ERR_INVALID, "mmc_loader_new: NULL argument");
    if (opts->seq_len < 8) return mmc_error(MMC_ERR_INVALID, "data.seq_len: %lld is too small", (long long)opts->seq_len);
    if (opts->micro_batch_size < 1)
        return mmc_error(MMC_ERR_INVALID, "data.micro_batch_size: must be >= 1, got %lld", (long long)opts->micro_batch_size);
    if (opts->num_workers < 0 || opts->num_workers > 256)
        return mmc_error(MMC_ERR_INVALID, "data.num_workers: must be in [0, 256], got %lld", (long long)opts->num_workers);
    if (opts->min_pixels && opts->max_pixels && opts->min_pixels > opts->max_pixels)
        return mmc_error(MMC_ERR_INVALID, "data.min_pixels %lld > data.max_pixels %lld", (long long)opts->min_pixels,
                         (long long)opts->max_pixels);
    mmc_loader *L = calloc(1, sizeof *L);
    if (!L) return mmc_error(MMC_ERR_OOM, "out of memory");
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv_work, NULL);
    pthread_cond_init(&L->cv_ready, NULL);
    L->o = *opts;
    L->o.train = L->o.eval = L->o.image_root = L->o.processor = NULL;
    L->o.audio_cache = NULL;
    if (L->o.omni && L->o.audio_cache_mb > 0 &&
        !(L->o.audio_cache = mmc_audio_cache_new((size_t)L->o.audio_cache_mb << 20))) {
        mmc_loader_free(L);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    if (L->o.min_pixels > 0) L->o.proc.min_pixels = L->o.min_pixels;
    if (L->o.max_pixels > 0) L->o.proc.max_pixels = L->o.max_pixels;
    L->tok = tok;
    L->ds = ds;
    L->N = mmc_dataset_size(ds);
    L->split = split;
    L->pad_id = mmc_data_pad_id(tok);
    L->end_ticket = split == MMC_SPLIT_EVAL ? L->N : INT64_MAX;
    L->W = split == MMC_SPLIT_EVAL ? L->o.micro_batch_size
                                   : (L->o.bucket_window > 0 ? L->o.bucket_window : 16 * L->o.micro_batch_size);
    if (L->W < L->o.micro_batch_size) L->W = L->o.micro_batch_size;
    L->cap = L->o.prefetch > 0 ? L->o.prefetch : 4 * L->o.num_workers + 8;
    L->slots = calloc((size_t)L->cap, sizeof *L->slots);
    L->threads = calloc((size_t)(L->o.num_workers + 1), sizeof *L->threads);
    L->reported = calloc((size_t)(L->N / 8 + 1), 1);
    L->win = calloc((size_t)L->W, sizeof *L->win);
    L->win_order = calloc((size_t)L->W, sizeof *L->win_order);
    L->win_ptrs = calloc((size_t)L->W, sizeof *L->win_ptrs);
    if (!L->slots || !L->threads || !L->reported || !L->win || !L->win_order || !L->win_ptrs) {
        mmc_loader_free(L);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    for (int64_t i = 0; i < L->cap; i++) L->slots[i].ticket = -1;
    mmc_status st = start_workers(L);
    if (st) { mmc_loader_free(L); return st; }
    *out = L;
    return MMC_OK;
}

mmc_status mmc_loader_new(const mmc_data_opts *opts, const mmc_tokenizer *tok, mmc_data_split split, mmc_loader **out) {
    *out = NULL;
    if (!opts) return mmc_error(MMC_ERR_INVALID, "mmc_loader_new: NULL options");
    const char *path = split == MMC_SPLIT_EVAL ? opts->eval : opts->train;
    if (!path || !*path)
        return mmc_error(MMC_ERR_INVALID, "data.%s: no dataset file given", split == MMC_SPLIT_EVAL ? "eval" : "train");
    mmc_data_opts o = *opts;
    if (opts->processor && *opts->processor) {
        mmc_status st = mmc_qwen2vl_proc_load(opts->processor, &o.proc);
        if (st) return mmc_error_prefix(st, "data.processor");
    }
    mmc_dataset *ds;
    mmc_status st = mmc_dataset_load(path, opts->image_root, &ds);
    if (st) return mmc_error_prefix(st, "data.%s", split == MMC_SPLIT_EVAL ? "eval" : "train");
    if ((st = mmc_loader_new_dataset(&o, tok, ds, split, out))) { mmc_dataset_free(ds); return st; }
    (*out)->own_ds = ds;
    return MMC_OK;
}
