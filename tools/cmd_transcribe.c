/* cmd_transcribe.c — `mmc transcribe`: speech to text with a Whisper checkpoint
 * (WhisperForConditionalGeneration directory: config.json, safetensors, generation_config.json,
 * tokenizer.json). Greedy decoding as transformers' model.generate(...) does it (mmc_whisper.h):
 * language given or detected, transcribe or translate, optional timestamps, inputs longer than
 * 30 s walked in windows. Output: plain text, timestamped segments, JSON or SRT.
 *
 * Input: an audio file (anything FFmpeg decodes, the audio track of a video included), resampled
 * to 16 kHz mono (mmc_audio_load) and turned into log-mel features as WhisperFeatureExtractor does
 * (mmc_whisper_features with the checkpoint's preprocessor config): a clip up to 30 s padded to
 * 30 s (processor(audio)), a longer one over its whole length (processor(audio, truncation=False,
 * padding="longest"), transformers' long-form input); or features written as safetensors
 * (--features FILE: a tensor "input_features" [1, n_mels, frames] or [n_mels, frames]). */
#include "cli.h"

#include "mmc_audio.h"
#include "mmc_io.h"
#include "mmc_tokenizer.h"
#include "mmc_whisper.h"

#include <stdlib.h>
#include <string.h>

void help_transcribe(FILE *f) {
    fprintf(f,
            "usage: mmc transcribe FILE --model DIR [options]\n"
            "       mmc transcribe --features FEATURES.safetensors --model DIR [options]\n\n"
            "Transcribe (or translate to English) speech with the Whisper checkpoint in DIR, greedily, as\n"
            "transformers' WhisperForConditionalGeneration.generate does. Inputs longer than 30 s are\n"
            "decoded window by window, each window starting where the previous one's last complete\n"
            "timestamp pair ended (timestamps are then on).\n\n"
            "FILE is an audio file (WAV, FLAC, MP3, OGG/Opus, M4A/AAC, or a video's audio track),\n"
            "resampled to 16 kHz mono; its log-mel features are WhisperFeatureExtractor's (the\n"
            "checkpoint's preprocessor_config.json): padded to 30 s, or over the whole clip when longer.\n\n"
            "options:\n"
            "  --model DIR              Whisper directory (config.json, model.safetensors,\n"
            "                           generation_config.json, tokenizer.json, preprocessor_config.json\n"
            "                           or processor_config.json)\n"
            "  --features FILE          instead of an audio file, log-mel features as safetensors:\n"
            "                           tensor \"input_features\" [1, n_mels, frames] or [n_mels, frames]\n"
            "                           (WhisperFeatureExtractor's output; 100 frames a second)\n"
            "  --language L             language code (en, de ...), name (english, german ...) or token\n"
            "                           (<|en|>); default: detected from the first 30 s\n"
            "  --task T                 transcribe or translate (to English); default: the generation\n"
            "                           config's (forced_decoder_ids), transcribe when --language is given\n"
            "  --timestamps             predict segment timestamps (always on beyond 30 s)\n"
            "                           output: one \"[start --> end] text\" line per segment\n"
            "  --max-new-tokens N       tokens per window (default: generation_config.json max_length)\n"
            "  --json                   print {text, language, segments: [{start, end, text, tokens}],\n"
            "                           tokens, prompt, windows}\n"
            "  --srt                    print SubRip subtitles, one cue per segment\n"
            "  -h, --help               this help\n\n"
            "example:\n"
            "  mmc transcribe talk.mp3 --model ./whisper-small --language en --timestamps --srt > talk.srt\n");
}

/* The log-mel features of an audio file, as transformers' processor makes them for generate():
 * up to 30 s, processor(audio) (padded to 30 s); longer, processor(audio, truncation=False,
 * padding="longest") (the whole clip, frames = samples / hop), computed by the same extractor with
 * its window widened to the clip (a copy of the settings; the max - 8 floor then spans the whole
 * clip, as there). */
static mmc_status audio_features(const char *path, const char *model, int64_t n_mels, float **out, int64_t *frames,
                                 double *seconds) {
    *out = NULL;
    mmc_whisper_fe fe;
    mmc_status st = mmc_whisper_fe_load(model, &fe);
    if (st) return st;
    if (fe.feature_size != n_mels) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the feature extractor makes %d mel bins, the model takes %lld", model,
                       fe.feature_size, (long long)n_mels);
        mmc_whisper_fe_free(&fe);
        return st;
    }
    mmc_audio a = {0};
    if ((st = mmc_audio_load(path, fe.sampling_rate, &a))) { mmc_whisper_fe_free(&fe); return st; }
    mmc_whisper_fe w = fe;
    if (a.n > fe.n_samples) {
        if (a.n / fe.hop_length > INT32_MAX / 2) {
            st = mmc_error(MMC_ERR_INVALID, "%s: too long", path);
            goto done;
        }
        w.n_samples = (int)a.n;
        w.nb_max_frames = (int)(a.n / fe.hop_length);
    }
    *frames = w.nb_max_frames;
    *seconds = (double)a.n / fe.sampling_rate;
    *out = malloc((size_t)(n_mels * *frames) * sizeof(float));
    if (!*out) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if ((st = mmc_whisper_features(&w, a.samples, a.n, *out, NULL))) { free(*out); *out = NULL; }
done:
    mmc_audio_free(&a);
    mmc_whisper_fe_free(&fe);
    return st;
}

static mmc_status load_features(const char *path, int64_t n_mels, float **out, int64_t *frames) {
    *out = NULL;
    mmc_st *st = NULL;
    mmc_status s = mmc_st_open(path, &st);
    if (s) return s;
    const mmc_st_entry *e = mmc_st_find(st, "input_features");
    if (!e && mmc_st_count(st) == 1) e = mmc_st_at(st, 0);
    if (!e) { mmc_st_close(st); return mmc_error(MMC_ERR_NOT_FOUND, "%s: no tensor 'input_features'", path); }
    bool ok = (e->ndim == 3 && e->shape[0] == 1) || e->ndim == 2;
    int64_t M = e->shape[e->ndim - 2], F = e->shape[e->ndim - 1];
    if (!ok || M != n_mels || F < 1) {
        mmc_st_close(st);
        return mmc_error(MMC_ERR_SHAPE, "%s: '%s' must be [1, %lld, frames] or [%lld, frames]", path, e->name,
                         (long long)n_mels, (long long)n_mels);
    }
    mmc_tensor *t = mmc_tensor_new(MMC_F32, e->ndim, e->shape);
    if (!t) { mmc_st_close(st); return MMC_ERR_OOM; }
    if ((s = mmc_st_read_into(st, e->name, t))) { mmc_tensor_free(t); mmc_st_close(st); return s; }
    mmc_st_close(st);
    *out = malloc((size_t)(M * F) * sizeof(float));
    if (!*out) { mmc_tensor_free(t); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    memcpy(*out, t->data, (size_t)(M * F) * sizeof(float));
    mmc_tensor_free(t);
    *frames = F;
    return MMC_OK;
}

/* WhisperTokenizer.decode(ids, skip_special_tokens=True); "" if the ids do not decode. */
static char *text_of(const mmc_tokenizer *tok, const mmc_whisper_gen_config *g, const int32_t *ids, int64_t n) {
    char *s = NULL;
    if (mmc_whisper_text(tok, g, ids, n, &s) != MMC_OK) s = strdup("");
    return s;
}

static void fmt_time(char *buf, size_t n, double t, char sep) {
    if (t < 0) t = 0;
    long long ms = (long long)(t * 1000.0 + 0.5);
    snprintf(buf, n, "%02lld:%02lld:%02lld%c%03lld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, sep, ms % 1000);
}

int cmd_transcribe(int argc, char **argv) {
    const char *model = NULL, *features = NULL, *file = NULL;
    mmc_whisper_opts o = {0};
    bool json = false, srt = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) { if (!(model = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--features")) { if (!(features = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--language")) { if (!(o.language = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--task")) {
            if (!(o.task = cli_value(argc, argv, &i))) return CLI_USAGE;
            if (strcmp(o.task, "transcribe") && strcmp(o.task, "translate"))
                return cli_usage("transcribe", "--task must be transcribe or translate, not '%s'", o.task);
        } else if (!strcmp(a, "--timestamps")) o.timestamps = true;
        else if (!strcmp(a, "--max-new-tokens")) {
            const char *v = cli_value(argc, argv, &i);
            long long x;
            if (!v || !cli_int("--max-new-tokens", v, 1, 100000, &x)) return CLI_USAGE;
            o.max_new_tokens = (int)x;
        } else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--srt")) srt = true;
        else if (a[0] == '-' && a[1]) return cli_usage("transcribe", "unknown option '%s'", a);
        else if (!file) file = a;
        else return cli_usage("transcribe", "more than one input file ('%s', '%s')", file, a);
    }
    if (!model) return cli_usage("transcribe", "--model DIR is required");
    if (json && srt) return cli_usage("transcribe", "--json and --srt exclude each other");
    if (file && features) return cli_usage("transcribe", "give an audio FILE or --features, not both");
    if (!file && !features) return cli_usage("transcribe", "an audio FILE (or --features FILE.safetensors) is required");

    double t0 = mmc_now();
    mmc_whisper *m = NULL;
    mmc_tokenizer *tok = NULL;
    mmc_whisper_gen_config *g = calloc(1, sizeof *g);
    float *feats = NULL;
    int64_t frames = 0;
    mmc_whisper_result r = {0};
    int rc = CLI_ERROR;
    mmc_status st;
    if (!g) return cli_fail(MMC_ERR_OOM, "transcribe: out of memory");
    if ((st = mmc_whisper_load(model, &m))) { cli_fail(st, "transcribe: cannot load the model"); goto done; }
    if ((st = mmc_whisper_gen_config_load(model, g))) { cli_fail(st, "transcribe: cannot read the generation config"); goto done; }
    if ((st = mmc_tokenizer_load(model, &tok))) { cli_fail(st, "transcribe: cannot load the tokenizer"); goto done; }
    double seconds = 0;
    if (file) st = audio_features(file, model, mmc_whisper_cfg(m)->num_mel_bins, &feats, &frames, &seconds);
    else st = load_features(features, mmc_whisper_cfg(m)->num_mel_bins, &feats, &frames), seconds = frames / 100.0;
    if (st) {
        cli_fail(st, "transcribe: cannot read %s", file ? file : features);
        goto done;
    }
    double t1 = mmc_now();
    if ((st = mmc_whisper_transcribe(m, g, feats, frames, &o, &r))) { cli_fail(st, "transcribe: failed"); goto done; }
    double t2 = mmc_now();
    const char *lang = r.language_id >= 0 ? mmc_tokenizer_id_to_token(tok, r.language_id) : NULL;
    char *text = text_of(tok, g, r.tokens, r.n);
    char a[32], b[32];
    if (json) {
        printf("{\"text\": ");
        mmc_json_write_string(stdout, text);
        printf(", \"language\": ");
        if (lang) mmc_json_write_string(stdout, lang);
        else printf("null");
        printf(", \"segments\": [");
        for (int i = 0; i < r.n_segs; i++) {
            const mmc_whisper_segment *s = &r.segs[i];
            char *t = text_of(tok, g, r.tokens + s->first, s->n);
            printf("%s{\"start\": %.2f, \"end\": %.2f, \"text\": ", i ? ", " : "", s->start, s->end);
            mmc_json_write_string(stdout, t);
            printf(", \"tokens\": [");
            for (int64_t k = 0; k < s->n; k++) printf("%s%d", k ? ", " : "", r.tokens[s->first + k]);
            printf("]}");
            free(t);
        }
        printf("], \"tokens\": [");
        for (int64_t k = 0; k < r.n; k++) printf("%s%d", k ? ", " : "", r.tokens[k]);
        printf("], \"prompt\": [");
        for (int k = 0; k < r.n_prompt; k++) printf("%s%d", k ? ", " : "", r.prompt[k]);
        printf("], \"windows\": %d, \"frames\": %lld, \"seconds\": %.3f}\n", r.n_windows, (long long)frames, t2 - t1);
    } else if (srt) {
        for (int i = 0; i < r.n_segs; i++) {
            const mmc_whisper_segment *s = &r.segs[i];
            char *t = text_of(tok, g, r.tokens + s->first, s->n);
            fmt_time(a, sizeof a, s->start, ','), fmt_time(b, sizeof b, s->end, ',');
            const char *tt = t;
            while (*tt == ' ') tt++;
            printf("%d\n%s --> %s\n%s\n\n", i + 1, a, b, tt);
            free(t);
        }
    } else if (o.timestamps) {
        for (int i = 0; i < r.n_segs; i++) {
            const mmc_whisper_segment *s = &r.segs[i];
            char *t = text_of(tok, g, r.tokens + s->first, s->n);
            fmt_time(a, sizeof a, s->start, '.'), fmt_time(b, sizeof b, s->end, '.');
            printf("[%s --> %s] %s\n", a, b, t);
            free(t);
        }
    } else {
        printf("%s\n", text);
    }
    free(text);
    fprintf(stderr, "mmc transcribe: %lld frames (%.1f s of audio), %d window(s), %lld tokens, language %s; "
            "load %.2f s, decode %.2f s\n", (long long)frames, seconds, r.n_windows, (long long)r.n,
            lang ? lang : "-", t1 - t0, t2 - t1);
    rc = CLI_OK;
done:
    mmc_whisper_result_free(&r);
    free(feats);
    free(g);
    mmc_tokenizer_free(tok);
    mmc_whisper_free(m);
    return rc;
}
