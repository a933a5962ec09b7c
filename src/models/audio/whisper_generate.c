/* whisper_generate.c — greedy transcription with Whisper, mirroring transformers'
 * WhisperGenerationMixin.generate (models/whisper/generation_whisper.py) for one clip with the
 * generation config's defaults (temperature 0, no compression / logprob / no-speech thresholds,
 * condition_on_prev_tokens off, no prompt_ids):
 *
 *   init tokens (_retrieve_init_tokens): [decoder_start]; without language and task, the
 *     generation config's forced_decoder_ids (config.json's as fallback) follow; the language
 *     (given, or detected: argmax of the first window's logits after [decoder_start] over the
 *     lang_to_id tokens) goes in slot 1; the task is appended (replacing a forced one), or
 *     "transcribe" when only a language was given; <|notimestamps|> is appended without
 *     timestamps and dropped with them.
 *   the seek loop (used by transformers for short clips too): window = features[:, seek : seek +
 *     3000] zero-padded to 3000 frames; greedy decoding from the init tokens with, in this order,
 *     SuppressTokensAtBegin (at the first generated position), SuppressTokens, and with timestamps
 *     WhisperTimeStampLogitsProcessor; the window's tokens (EOS dropped) split into segments at
 *     consecutive timestamp pairs (_retrieve_segment); seek moves to the last pair's timestamp,
 *     or by the whole window when the tokens end in a single timestamp or hold no pair.
 *   max length: max_new_tokens when given (capped at max_target_positions), else the generation
 *     config's max_length raised by the prompt length (capped), carried from window to window as
 *     transformers mutates it.
 *
 * Differences: temperature fallback, no-speech skipping and conditioning on previous windows are
 * not implemented (transformers runs none of them unless asked); a window whose segments would
 * not advance seek (a pair of <|0.00|> at its start, where transformers loops forever) advances
 * by the whole window. */
#include "mmc_whisper.h"

#include "mmc_io.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int json_int_or(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : def;
}

static mmc_status read_ids(const cJSON *o, const char *key, int32_t *ids, int *n, int cap, const char *path) {
    *n = 0;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!a || cJSON_IsNull(a)) return MMC_OK;
    if (!cJSON_IsArray(a)) return mmc_error(MMC_ERR_FORMAT, "%s: '%s' must be a list of token ids", path, key);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e)) return mmc_error(MMC_ERR_FORMAT, "%s: '%s' holds a non-number", path, key);
        if (*n == cap) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: '%s' has more than %d ids", path, key, cap);
        ids[(*n)++] = (int32_t)e->valuedouble;
    }
    return MMC_OK;
}

static mmc_status read_forced(const cJSON *a, mmc_whisper_gen_config *g, const char *path) {
    g->n_forced = 0;
    if (!a || cJSON_IsNull(a)) return MMC_OK;
    if (!cJSON_IsArray(a)) return mmc_error(MMC_ERR_FORMAT, "%s: forced_decoder_ids must be a list of pairs", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        const cJSON *i = cJSON_GetArrayItem(e, 0), *id = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || !cJSON_IsNumber(i) || (!cJSON_IsNumber(id) && !cJSON_IsNull(id)))
            return mmc_error(MMC_ERR_FORMAT, "%s: forced_decoder_ids entries must be [index, id or null]", path);
        /* transformers takes the run of indices 1, 2, ... and refuses anything else */
        if ((int)i->valuedouble != g->n_forced + 1 || g->n_forced == 8)
            return mmc_error(MMC_ERR_FORMAT, "%s: forced_decoder_ids must index positions 1, 2, ... in order", path);
        g->forced[g->n_forced++] = cJSON_IsNull(id) ? -1 : (int32_t)id->valuedouble;
    }
    return MMC_OK;
}

mmc_status mmc_whisper_gen_config_load(const char *dir, mmc_whisper_gen_config *g) {
    memset(g, 0, sizeof *g);
    char path[1024], cpath[1024];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    mmc_json *jg = NULL, *jc = NULL;
    mmc_status st = mmc_json_load(cpath, &jc);
    if (st) return st;
    /* without generation_config.json transformers derives one from config.json's generation
     * fields (GenerationConfig.from_model_config): no lang_to_id / no_timestamps_token_id there */
    FILE *probe = fopen(path, "r");
    if (probe) {
        fclose(probe);
        if ((st = mmc_json_load(path, &jg))) { mmc_json_free(jc); return st; }
    } else {
        snprintf(path, sizeof path, "%s", cpath);
    }
    const cJSON *c = (const cJSON *)jc, *o = jg ? (const cJSON *)jg : c;
    g->decoder_start_token_id = json_int_or(o, "decoder_start_token_id", json_int_or(c, "decoder_start_token_id", -1));
    g->eos_token_id = json_int_or(o, "eos_token_id", json_int_or(c, "eos_token_id", -1));
    if (g->eos_token_id < 0) g->eos_token_id = json_int_or(o, "bos_token_id", -1);
    g->no_timestamps_token_id = json_int_or(o, "no_timestamps_token_id", -1);
    g->prev_sot_token_id = json_int_or(o, "prev_sot_token_id", -1);
    g->max_length = json_int_or(o, "max_length", 20);
    g->max_initial_timestamp_index = json_int_or(o, "max_initial_timestamp_index", -1);
    /* absent: no check (transformers refuses language / task only when it is present and false) */
    g->is_multilingual = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "is_multilingual"));
    g->return_timestamps = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "return_timestamps"));
    g->transcribe_id = g->translate_id = -1;
    if (g->decoder_start_token_id < 0 || g->eos_token_id < 0) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: decoder_start_token_id and eos_token_id are needed", path);
        goto done;
    }
    const cJSON *fd = cJSON_GetObjectItemCaseSensitive(o, "forced_decoder_ids");
    if (!fd || cJSON_IsNull(fd)) fd = cJSON_GetObjectItemCaseSensitive(c, "forced_decoder_ids");
    if ((st = read_forced(fd, g, path))) goto done;
    if ((st = read_ids(o, "suppress_tokens", g->suppress, &g->n_suppress, MMC_WHISPER_MAX_SUPPRESS, path)) ||
        (st = read_ids(o, "begin_suppress_tokens", g->begin_suppress, &g->n_begin_suppress, 16, path)))
        goto done;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "lang_to_id"), *e;
    g->n_langs = -1;   /* absent: no language detection (English-only checkpoints) */
    if (cJSON_IsObject(l)) {
        g->n_langs = 0;
        cJSON_ArrayForEach(e, l) {
            if (!cJSON_IsNumber(e) || strlen(e->string) >= sizeof g->lang_tok[0] || g->n_langs == MMC_WHISPER_MAX_LANGS) {
                st = mmc_error(MMC_ERR_FORMAT, "%s: lang_to_id entry '%s' is not a short token with an id", path, e->string);
                goto done;
            }
            snprintf(g->lang_tok[g->n_langs], sizeof g->lang_tok[0], "%s", e->string);
            g->lang_id[g->n_langs++] = (int32_t)e->valuedouble;
        }
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "task_to_id");
    if (cJSON_IsObject(t)) {
        g->transcribe_id = json_int_or(t, "transcribe", -1);
        g->translate_id = json_int_or(t, "translate", -1);
    }
done:
    mmc_json_free(jg);
    mmc_json_free(jc);
    return st;
}

int32_t mmc_whisper_timestamp_begin(const mmc_whisper_gen_config *g) {
    return g->no_timestamps_token_id >= 0 ? g->no_timestamps_token_id + 1 : INT32_MAX;
}

mmc_status mmc_whisper_text(const mmc_tokenizer *tok, const mmc_whisper_gen_config *g, const int32_t *ids, int64_t n,
                            char **out) {
    *out = NULL;
    const int32_t tb = mmc_whisper_timestamp_begin(g);
    int32_t *keep = malloc((size_t)(n + 1) * sizeof *keep);
    if (!keep) return mmc_error(MMC_ERR_OOM, "out of memory");
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) if (ids[i] < tb) keep[k++] = ids[i];
    mmc_status st = mmc_tokenizer_decode(tok, keep, k, true, out);
    free(keep);
    return st;
}

void mmc_whisper_result_free(mmc_whisper_result *r) {
    free(r->tokens);
    free(r->segs);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------ prompt */

/* English language names as `generate(language=...)` accepts them besides codes (the languages
 * Whisper was trained on, and common aliases), each mapped to its token's code. */
static const char *const LANG_NAMES[][2] = {
    {"english", "en"}, {"chinese", "zh"}, {"german", "de"}, {"spanish", "es"}, {"russian", "ru"},
    {"korean", "ko"}, {"french", "fr"}, {"japanese", "ja"}, {"portuguese", "pt"}, {"turkish", "tr"},
    {"polish", "pl"}, {"catalan", "ca"}, {"dutch", "nl"}, {"arabic", "ar"}, {"swedish", "sv"},
    {"italian", "it"}, {"indonesian", "id"}, {"hindi", "hi"}, {"finnish", "fi"}, {"vietnamese", "vi"},
    {"hebrew", "he"}, {"ukrainian", "uk"}, {"greek", "el"}, {"malay", "ms"}, {"czech", "cs"},
    {"romanian", "ro"}, {"danish", "da"}, {"hungarian", "hu"}, {"tamil", "ta"}, {"norwegian", "no"},
    {"thai", "th"}, {"urdu", "ur"}, {"croatian", "hr"}, {"bulgarian", "bg"}, {"lithuanian", "lt"},
    {"latin", "la"}, {"maori", "mi"}, {"malayalam", "ml"}, {"welsh", "cy"}, {"slovak", "sk"},
    {"telugu", "te"}, {"persian", "fa"}, {"latvian", "lv"}, {"bengali", "bn"}, {"serbian", "sr"},
    {"azerbaijani", "az"}, {"slovenian", "sl"}, {"kannada", "kn"}, {"estonian", "et"}, {"macedonian", "mk"},
    {"breton", "br"}, {"basque", "eu"}, {"icelandic", "is"}, {"armenian", "hy"}, {"nepali", "ne"},
    {"mongolian", "mn"}, {"bosnian", "bs"}, {"kazakh", "kk"}, {"albanian", "sq"}, {"swahili", "sw"},
    {"galician", "gl"}, {"marathi", "mr"}, {"punjabi", "pa"}, {"sinhala", "si"}, {"khmer", "km"},
    {"shona", "sn"}, {"yoruba", "yo"}, {"somali", "so"}, {"afrikaans", "af"}, {"occitan", "oc"},
    {"georgian", "ka"}, {"belarusian", "be"}, {"tajik", "tg"}, {"sindhi", "sd"}, {"gujarati", "gu"},
    {"amharic", "am"}, {"yiddish", "yi"}, {"lao", "lo"}, {"uzbek", "uz"}, {"faroese", "fo"},
    {"haitian creole", "ht"}, {"pashto", "ps"}, {"turkmen", "tk"}, {"nynorsk", "nn"}, {"maltese", "mt"},
    {"sanskrit", "sa"}, {"luxembourgish", "lb"}, {"myanmar", "my"}, {"tibetan", "bo"}, {"tagalog", "tl"},
    {"malagasy", "mg"}, {"assamese", "as"}, {"tatar", "tt"}, {"hawaiian", "haw"}, {"lingala", "ln"},
    {"hausa", "ha"}, {"bashkir", "ba"}, {"javanese", "jw"}, {"sundanese", "su"}, {"cantonese", "yue"},
    {"burmese", "my"}, {"valencian", "ca"}, {"flemish", "nl"}, {"haitian", "ht"}, {"letzeburgesch", "lb"},
    {"pushto", "ps"}, {"panjabi", "pa"}, {"moldavian", "ro"}, {"moldovan", "ro"}, {"sinhalese", "si"},
    {"castilian", "es"}, {"mandarin", "zh"},
};

static mmc_status language_id(const mmc_whisper_gen_config *g, const char *lang, int32_t *id) {
    char tok[32];
    if (lang[0] == '<') snprintf(tok, sizeof tok, "%s", lang);
    else {
        size_t n = strlen(lang);
        if (n > 20) n = 20;
        char low[24];
        for (size_t i = 0; i < n; i++) low[i] = (char)tolower((unsigned char)lang[i]);
        low[n] = 0;
        const char *code = low;
        for (size_t i = 0; i < sizeof LANG_NAMES / sizeof LANG_NAMES[0]; i++)
            if (!strcmp(low, LANG_NAMES[i][0])) code = LANG_NAMES[i][1];
        snprintf(tok, sizeof tok, "<|%s|>", code);
    }
    for (int i = 0; i < g->n_langs; i++)
        if (!strcmp(g->lang_tok[i], tok)) { *id = g->lang_id[i]; return MMC_OK; }
    char list[1024] = "";
    size_t u = 0;
    for (int i = 0; i < g->n_langs && u + 32 < sizeof list; i++)
        u += (size_t)snprintf(list + u, sizeof list - u, "%s%.*s", i ? " " : "", (int)strlen(g->lang_tok[i]) - 4,
                              g->lang_tok[i] + 2);
    if (g->n_langs <= 0) return mmc_error(MMC_ERR_INVALID, "language '%s': this model is English-only (no lang_to_id in "
                                           "generation_config.json)", lang);
    return mmc_error(MMC_ERR_INVALID, "language '%s' is not in the model's generation_config.json lang_to_id (give a "
                     "name or one of the codes: %s)", lang, list);
}

/* Argmax of the logits over the language tokens (transformers' detect_language). */
static int32_t detect(const mmc_whisper_gen_config *g, const float *logits) {
    int32_t best = g->lang_id[0];
    float bv = -INFINITY;
    /* torch.argmax over the masked vocabulary: the first maximum in id order */
    for (int i = 0; i < g->n_langs; i++) {
        int32_t id = g->lang_id[i];
        float v = logits[id];
        if (v > bv || (v == bv && id < best)) bv = v, best = id;
    }
    return best;
}

/* ------------------------------------------------------------------ logits rules */

typedef struct {
    const mmc_whisper_gen_config *g;
    bool timestamps;
    int32_t ts_begin, V;
    int begin_index;       /* length of the prompt: the first generated position */
} rules;

static void apply_rules(const rules *R, const int32_t *seq, int len, float *s) {
    const mmc_whisper_gen_config *g = R->g;
    const int32_t V = R->V;
    if (len == R->begin_index)
        for (int i = 0; i < g->n_begin_suppress; i++)
            if (g->begin_suppress[i] >= 0 && g->begin_suppress[i] < V) s[g->begin_suppress[i]] = -INFINITY;
    for (int i = 0; i < g->n_suppress; i++)
        if (g->suppress[i] >= 0 && g->suppress[i] < V) s[g->suppress[i]] = -INFINITY;
    if (!R->timestamps) return;
    /* WhisperTimeStampLogitsProcessor */
    const int32_t tb = R->ts_begin, eos = g->eos_token_id;
    if (g->no_timestamps_token_id >= 0 && g->no_timestamps_token_id < V) s[g->no_timestamps_token_id] = -INFINITY;
    const int32_t *gen = seq + R->begin_index;
    int n = len - R->begin_index;
    bool last_ts = n >= 1 && gen[n - 1] >= tb;
    bool penult_ts = n < 2 || gen[n - 2] >= tb;
    if (last_ts) {
        if (penult_ts) for (int32_t i = tb; i < V; i++) s[i] = -INFINITY;    /* a pair closed: text next */
        else for (int32_t i = 0; i < eos && i < V; i++) s[i] = -INFINITY;     /* an open one: no text */
    }
    int32_t ts_last = tb, last_seen = -1;
    for (int i = 0; i < n; i++) if (gen[i] >= tb) last_seen = gen[i];
    if (last_seen >= 0) ts_last = (last_ts && !penult_ts) ? last_seen : last_seen + 1;
    for (int32_t i = tb; i < ts_last && i < V; i++) s[i] = -INFINITY;      /* timestamps never decrease */
    if (len == R->begin_index) {
        for (int32_t i = 0; i < tb && i < V; i++) s[i] = -INFINITY;
        if (g->max_initial_timestamp_index >= 0)
            for (int32_t i = tb + g->max_initial_timestamp_index + 1; i < V; i++) s[i] = -INFINITY;
    }
    /* a timestamp when their total probability beats every text token's */
    double mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) if (s[i] > mx) mx = s[i];
    if (mx == -INFINITY) return;
    double z = 0, zt = 0, mtext = -INFINITY;
    for (int32_t i = 0; i < V; i++) {
        double e = exp((double)s[i] - mx);
        z += e;
        if (i >= tb) zt += e;
        else if (s[i] > mtext) mtext = s[i];
    }
    double ts_lp = log(zt) - log(z), text_lp = mtext - mx - log(z);
    if (zt > 0 && ts_lp > text_lp)
        for (int32_t i = 0; i < tb && i < V; i++) s[i] = -INFINITY;
}

static int32_t argmax(const float *s, int32_t V) {
    int32_t b = 0;
    for (int32_t i = 1; i < V; i++) if (s[i] > s[b]) b = i;
    return b;
}

/* ------------------------------------------------------------------ transcription */

typedef struct { int32_t *v; int64_t n, cap; } ivec;
static bool ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *p = realloc(a->v, (size_t)cap * sizeof *p);
        if (!p) return false;
        a->v = p, a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

static bool add_seg(mmc_whisper_result *r, int *cap, double start, double end, int64_t first, int64_t n) {
    if (r->n_segs == *cap) {
        int c = *cap ? 2 * *cap : 16;
        mmc_whisper_segment *p = realloc(r->segs, (size_t)c * sizeof *p);
        if (!p) return false;
        r->segs = p, *cap = c;
    }
    r->segs[r->n_segs++] = (mmc_whisper_segment){start, end, first, n};
    return true;
}

mmc_status mmc_whisper_transcribe(const mmc_whisper *m, const mmc_whisper_gen_config *g, const float *feats,
                                  int64_t frames, const mmc_whisper_opts *o, mmc_whisper_result *r) {
    memset(r, 0, sizeof *r);
    r->language_id = -1;
    const mmc_whisper_config *c = mmc_whisper_cfg(m);
    const int64_t M = c->num_mel_bins, W = 2 * c->max_source_positions, V = c->vocab_size;
    const int input_stride = 2;
    const double time_precision = 0.02, time_precision_features = 0.01;
    if (frames < 1) return mmc_error(MMC_ERR_INVALID, "Whisper: no feature frames");
    /* return_timestamps: the option, else the generation config's; long-form needs them
     * (transformers turns them on) */
    bool timestamps = o->timestamps || g->return_timestamps || frames > W;
    if (timestamps && g->no_timestamps_token_id < 0)
        return mmc_error(MMC_ERR_INVALID, "Whisper: timestamps need no_timestamps_token_id in generation_config.json");
    if (o->task && strcmp(o->task, "transcribe") && strcmp(o->task, "translate"))
        return mmc_error(MMC_ERR_INVALID, "Whisper: task '%s' is neither transcribe nor translate", o->task);
    if ((o->task || o->language) && !g->is_multilingual)
        return mmc_error(MMC_ERR_INVALID, "Whisper: this model is English-only (is_multilingual false in "
                         "generation_config.json): it takes no language or task");
    /* ids the decoder is fed or the rules index must lie in the vocabulary */
    bool bad = g->decoder_start_token_id >= V || g->eos_token_id >= V || g->transcribe_id >= V || g->translate_id >= V;
    for (int i = 0; i < g->n_langs; i++) bad |= g->lang_id[i] < 0 || g->lang_id[i] >= V;
    for (int i = 0; i < g->n_forced; i++) bad |= g->forced[i] >= V;
    if (bad)
        return mmc_error(MMC_ERR_FORMAT, "Whisper: generation_config.json names token ids outside the model's vocabulary "
                         "(%lld tokens): is it from another checkpoint?", (long long)V);
    int32_t task_id = -1;
    if (o->task) {
        task_id = !strcmp(o->task, "translate") ? g->translate_id : g->transcribe_id;
        if (task_id < 0) return mmc_error(MMC_ERR_INVALID, "Whisper: generation_config.json has no task_to_id for '%s'", o->task);
    }
    int32_t lang = -1;
    mmc_status st;
    if (o->language && (st = language_id(g, o->language, &lang))) return st;

    mmc_ctx *ctx = mmc_ctx_new();
    float *win = malloc((size_t)(M * W) * sizeof(float));
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *seq = malloc((size_t)(c->max_target_positions + 8) * sizeof(int32_t));
    ivec out = {0};
    int seg_cap = 0;
    mmc_whisper_dec *dec = NULL;
    if (!ctx || !win || !logits || !seq) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }

    /* init tokens, with -1 for an undecided language */
    int32_t init[16];
    int ni = 0;
    init[ni++] = g->decoder_start_token_id;
    if (!o->task && !o->language)
        for (int i = 0; i < g->n_forced; i++) init[ni++] = g->forced[i];
    bool lang_undefined = ni <= 1 || init[1] < 0;
    bool need_detect = !o->language && g->n_langs > 0 && lang_undefined;
    int64_t max_length = g->max_length;
    int64_t seek = 0;
    while (seek < frames) {
        const int64_t seek_num = frames - seek < W ? frames - seek : W;
        const double time_offset = (double)seek * time_precision / input_stride;
        for (int64_t k = 0; k < M; k++) {
            memcpy(win + k * W, feats + k * frames + seek, (size_t)seek_num * sizeof(float));
            memset(win + k * W + seek_num, 0, (size_t)(W - seek_num) * sizeof(float));
        }
        mmc_ctx_reset(ctx);
        mmc_tensor *enc;
        if ((st = mmc_whisper_encode(ctx, m, win, W, &enc))) goto fail;
        if ((st = mmc_whisper_dec_new(ctx, m, enc, &dec))) goto fail;
        r->n_windows++;
        if (need_detect) {
            /* detect_language: the logits after [decoder_start] on the first window */
            int32_t sot = g->decoder_start_token_id;
            if ((st = mmc_whisper_dec_step(ctx, dec, &sot, 1, false, logits))) goto fail;
            lang = detect(g, logits);
            mmc_whisper_dec_reset(dec);
            need_detect = false;
        }
        if (r->n_windows == 1) {
            if (lang >= 0) {
                if (ni > 1) init[1] = lang;
                else init[ni++] = lang;
            }
            if (task_id >= 0) {
                bool found = false;
                for (int i = 0; i < ni; i++)
                    if (init[i] == g->transcribe_id || init[i] == g->translate_id) init[i] = task_id, found = true;
                if (!found) init[ni++] = task_id;
            } else if (o->language && (g->transcribe_id >= 0 || g->translate_id >= 0)) {
                bool any = false;
                for (int i = 0; i < ni; i++) any |= init[i] >= 0 && (init[i] == g->transcribe_id || init[i] == g->translate_id);
                if (!any) init[ni++] = g->transcribe_id;
            }
            if (!timestamps && g->no_timestamps_token_id >= 0 && init[ni - 1] != g->no_timestamps_token_id)
                init[ni++] = g->no_timestamps_token_id;
            else if (timestamps && init[ni - 1] == g->no_timestamps_token_id)
                ni--;
            int k = 0;
            for (int i = 0; i < ni; i++) if (init[i] >= 0) init[k++] = init[i];
            ni = k;
            memcpy(r->prompt, init, (size_t)ni * sizeof(int32_t));
            r->n_prompt = ni;
            r->language_id = lang;
        }
        /* _set_max_new_tokens_and_length */
        int64_t limit;
        if (o->max_new_tokens > 0) {
            limit = ni + o->max_new_tokens;
            if (limit > c->max_target_positions) limit = c->max_target_positions;
        } else {
            int64_t init_n = c->max_target_positions / 2 - 1 < ni ? c->max_target_positions / 2 - 1 : ni;
            max_length = max_length + init_n < c->max_target_positions ? max_length + init_n : c->max_target_positions;
            limit = max_length;
        }
        /* greedy decoding */
        rules R = {g, timestamps, mmc_whisper_timestamp_begin(g), (int32_t)V, ni};
        memcpy(seq, init, (size_t)ni * sizeof(int32_t));
        int len = ni;
        if ((st = mmc_whisper_dec_step(ctx, dec, seq, len, false, logits))) goto fail;
        bool eos = false;
        while (len < limit) {
            apply_rules(&R, seq, len, logits);
            int32_t next = argmax(logits, (int32_t)V);
            seq[len++] = next;
            if (next == g->eos_token_id) { eos = true; break; }
            if (len >= limit) break;
            if ((st = mmc_whisper_dec_step(ctx, dec, &next, 1, false, logits))) goto fail;
        }
        mmc_whisper_dec_free(dec);
        dec = NULL;
        /* the window's tokens, EOS dropped */
        const int32_t *s = seq + ni;
        int n = len - ni - (eos ? 1 : 0);
        /* _retrieve_segment */
        const int32_t tb = R.ts_begin;
        int64_t base = out.n;
        for (int i = 0; i < n; i++)
            if (!ivec_push(&out, s[i])) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        bool single_end = n >= 2 ? (s[n - 2] < tb && s[n - 1] >= tb) : (n == 1 && s[0] >= tb && false);
        int slices[512], ns = 0;
        for (int i = 0; i + 1 < n; i++)
            if (s[i] >= tb && s[i + 1] >= tb && ns < 511) slices[ns++] = i + 1;
        int64_t offset;
        if (ns > 0) {
            if (single_end) slices[ns++] = n;
            else slices[ns - 1] += 1;
            int last = 0;
            for (int i = 0; i < ns; i++) {
                bool is_last = i == ns - 1;
                int cur = slices[i];
                int idx = (!is_last || single_end) ? cur - 1 : cur - 2;
                double st_t = time_offset + (s[last] - tb) * time_precision;
                double en_t = time_offset + (s[idx] - tb) * time_precision;
                if (!add_seg(r, &seg_cap, st_t, en_t, base + last, cur - last)) {
                    st = mmc_error(MMC_ERR_OOM, "out of memory");
                    goto fail;
                }
                last = cur;
            }
            /* transformers keeps only the sliced tokens: anything after the last pair is dropped */
            out.n = base + last;
            if (single_end) offset = seek_num;
            else offset = (int64_t)(s[last - 2] - tb) * input_stride;
        } else {
            double last_pos = (double)(int64_t)(seek_num * time_precision_features / time_precision);
            int li = -1;
            for (int i = 0; i < n; i++) if (s[i] >= tb) li = i;
            if (li >= 0 && s[li] != tb) last_pos = (double)(s[li] - tb);
            if (!add_seg(r, &seg_cap, time_offset, time_offset + last_pos * time_precision, base, n)) {
                st = mmc_error(MMC_ERR_OOM, "out of memory");
                goto fail;
            }
            offset = seek_num;
        }
        if (offset <= 0) offset = seek_num;   /* transformers would decode this window again, forever */
        seek += offset;
    }
    r->tokens = out.v;
    r->n = out.n;
    out.v = NULL;
    st = MMC_OK;
fail:
    if (st) mmc_whisper_result_free(r);
    mmc_whisper_dec_free(dec);
    free(out.v);
    free(seq);
    free(logits);
    free(win);
    mmc_ctx_free(ctx);
    return st;
}
