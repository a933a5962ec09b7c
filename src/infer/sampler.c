/* sampler.c — next-token selection, mirroring transformers' logits processors and warpers
 * (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
 * TopPLogitsWarper, MinPLogitsWarper) followed by multinomial sampling, or argmax when
 * greedy. Draws come from the seeded Philox stream, so a seed reproduces a completion.
 * OpenAI's presence and frequency penalties (the API's definition) precede them when set. */
#include "mmc_infer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void mmc_sampler_defaults(mmc_sampler_opts *o) {
    memset(o, 0, sizeof *o);
    o->temperature = 0.0f;
    o->top_p = 1.0f;
    o->repetition_penalty = 1.0f;
}

mmc_status mmc_sampler_init(mmc_sampler *s, const mmc_sampler_opts *o, int64_t vocab) {
    memset(s, 0, sizeof *s);
    s->opts = *o;
    s->vocab = vocab;
    s->n_first = -1;
    if (o->top_p <= 0 || o->top_p > 1) return mmc_error(MMC_ERR_INVALID, "top_p must be in (0, 1], got %g", o->top_p);
    if (o->min_p < 0 || o->min_p > 1) return mmc_error(MMC_ERR_INVALID, "min_p must be in [0, 1], got %g", o->min_p);
    if (o->top_k < 0) return mmc_error(MMC_ERR_INVALID, "top_k must be >= 0, got %d", o->top_k);
    if (o->repetition_penalty <= 0)
        return mmc_error(MMC_ERR_INVALID, "repetition_penalty must be > 0, got %g", o->repetition_penalty);
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->seen = calloc((size_t)vocab, 1);
    if (!s->probs || !s->idx || !s->seen) { mmc_sampler_free(s); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    mmc_rng_init(&s->rng, o->seed);
    return MMC_OK;
}

void mmc_sampler_free(mmc_sampler *s) {
    free(s->probs);
    free(s->idx);
    free(s->seen);
    s->seen = NULL;
    s->probs = NULL;
    s->idx = NULL;
}

static const float *g_sort_key;
static int by_prob_desc(const void *a, const void *b) {
    float x = g_sort_key[*(const int32_t *)a], y = g_sort_key[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;   /* stable: lower id first */
}

int32_t mmc_sampler_next(mmc_sampler *s, float *logits, const int32_t *hist, int64_t n_hist) {
    const mmc_sampler_opts *o = &s->opts;
    int64_t V = s->vocab;
    if (s->n_first < 0) s->n_first = n_hist;
    if (o->on_logits) o->on_logits(o->logits_user, logits, V);
    if ((o->presence_penalty != 0.0f || o->frequency_penalty != 0.0f) && n_hist > s->n_first) {
        /* OpenAI: over the completion so far; frequency once per occurrence, presence once */
        for (int64_t i = s->n_first; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t < 0 || t >= V) continue;
            logits[t] -= o->frequency_penalty;
            if (!s->seen[t]) { s->seen[t] = 1; logits[t] -= o->presence_penalty; }
        }
        for (int64_t i = s->n_first; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->seen[hist[i]] = 0;
    }
    if (o->repetition_penalty != 1.0f) {
        for (int64_t i = 0; i < n_hist; i++) {   /* each distinct token once */
            int32_t t = hist[i];
            if (t < 0 || t >= V || s->seen[t]) continue;
            s->seen[t] = 1;
            logits[t] = logits[t] < 0 ? logits[t] * o->repetition_penalty : logits[t] / o->repetition_penalty;
        }
        for (int64_t i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->seen[hist[i]] = 0;
    }
    if (o->temperature <= 0.0f) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) { logits[i] /= o->temperature; mx = fmaxf(mx, logits[i]); }
    double sum = 0;
    for (int64_t i = 0; i < V; i++) { s->probs[i] = expf(logits[i] - mx); sum += s->probs[i]; }
    for (int64_t i = 0; i < V; i++) s->probs[i] = (float)(s->probs[i] / sum);
    /* candidates sorted by probability (only when a filter needs the order) */
    int64_t n = V;
    for (int64_t i = 0; i < V; i++) s->idx[i] = (int32_t)i;
    if (o->top_k > 0 || o->top_p < 1.0f || o->min_p > 0.0f) {
        g_sort_key = s->probs;
        qsort(s->idx, (size_t)V, sizeof *s->idx, by_prob_desc);
        if (o->top_k > 0 && o->top_k < n) n = o->top_k;
        if (o->top_p < 1.0f) {
            /* HF keeps the smallest prefix whose mass reaches top_p (at least one token) */
            double cum = 0;
            int64_t keep = 0;
            while (keep < n) {
                cum += s->probs[s->idx[keep]];
                keep++;
                if (cum >= o->top_p) break;
            }
            n = keep;
        }
        if (o->min_p > 0.0f) {
            float thr = o->min_p * s->probs[s->idx[0]];
            int64_t keep = 1;
            while (keep < n && s->probs[s->idx[keep]] >= thr) keep++;
            n = keep;
        }
    }
    double mass = 0;
    for (int64_t i = 0; i < n; i++) mass += s->probs[s->idx[i]];
    float u;
    mmc_rng_uniform(&s->rng, &u, 1, 0.0f, 1.0f);
    double target = u * mass, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += s->probs[s->idx[i]];
        if (acc > target) return s->idx[i];
    }
    return s->idx[n - 1];
}
