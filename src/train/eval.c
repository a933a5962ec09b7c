/* eval.c — `mmc eval`: teacher-forced loss / perplexity over assistant tokens and greedy
 * short-answer accuracy of a Qwen2-VL model on a chat dataset (see mmc_eval.h).
 *
 * Samples are read and tokenised by the training data pipeline itself (mmc_data.h:
 * mmc_dataset_load + mmc_data_prepare), so evaluation and training cannot drift apart: the
 * same three formats auto-detected (LLaVA `conversations`, LLaMA-Factory `messages` with
 * <image>/<video> tags + `images`/`videos`, OpenAI content parts), the same validation
 * (errors name file:line), the same chat template and placeholder expansion (each pad
 * expanded to the image's merged-token count, as transformers' Qwen2VLProcessor does), images
 * and videos alike. The loss scores the tokens the trainer would train on (assistant content
 * + <|im_end|>, labels != -100), like HF's label mask; the answer is generated greedily from
 * the prompt that ends before the last assistant turn (mmc_data_prepare's prompt_only).
 * Samples are not truncated (seq_len unbounded).
 * A Qwen2.5-Omni thinker (qwen2_5_omni_thinker) is evaluated the same way on records with audio
 * ("audios" / audio parts): the pipeline's Qwen2_5OmniProcessor samples, mmc_omni_forward and its
 * decoder (--blank-images also silences the audio: the features of zeros of the same length).
 * Answer normalisation follows the SQuAD / VQA evaluation habit (lower case, no
 * punctuation, no articles) plus number words -> digits.
 */
#include "mmc_eval.h"
#include "data_internal.h"
#include "mmc_infer.h"
#include "mmc_io.h"
#include "mmc_tokenizer.h"
#include "mmc_vl.h"
#include "mmc_vlproc.h"
#include "mmc_omni.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- metrics */
static const char *const number_words[] = {
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty"};

char *mmc_eval_normalize(const char *s) {
    size_t n = strlen(s);
    char *tmp = malloc(n + 1), *out = malloc(n + 1);
    if (!tmp || !out) { free(tmp); free(out); return NULL; }
    /* lower-case ASCII, punctuation -> space (non-ASCII bytes are kept as they are) */
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)s[i];
        tmp[i] = c < 128 && ispunct(c) ? ' ' : (char)(c < 128 ? tolower(c) : c);
    }
    size_t o = 0;
    char *save = NULL;
    for (char *w = strtok_r(tmp, " \t\r\n\f\v", &save); w; w = strtok_r(NULL, " \t\r\n\f\v", &save)) {
        if (!strcmp(w, "a") || !strcmp(w, "an") || !strcmp(w, "the")) continue;
        char num[8];
        for (int k = 0; k < (int)(sizeof number_words / sizeof *number_words); k++)
            if (!strcmp(w, number_words[k])) { snprintf(num, sizeof num, "%d", k); w = num; break; }
        if (o) out[o++] = ' ';
        size_t L = strlen(w);
        memcpy(out + o, w, L);
        o += L;
    }
    out[o] = '\0';
    free(tmp);
    return out;
}

static void trim_span(const char *s, const char **b, size_t *len) {
    while (*s && isspace((unsigned char)*s)) s++;
    size_t L = strlen(s);
    while (L && isspace((unsigned char)s[L - 1])) L--;
    *b = s;
    *len = L;
}

bool mmc_eval_exact_match(const char *pred, const char *ref) {
    const char *a, *b;
    size_t la, lb;
    trim_span(pred, &a, &la);
    trim_span(ref, &b, &lb);
    return la == lb && memcmp(a, b, la) == 0;
}

bool mmc_eval_normalized_match(const char *pred, const char *ref) {
    char *a = mmc_eval_normalize(pred), *b = mmc_eval_normalize(ref);
    bool eq = a && b && strcmp(a, b) == 0;
    free(a);
    free(b);
    return eq;
}

void mmc_eval_summary_add(mmc_eval_summary *s, const char *type, double nll_sum, int64_t n_tokens,
                          bool exact, bool normalized) {
    s->nll_sum += nll_sum;
    s->n_tokens += n_tokens;
    s->samples++;
    s->exact += exact;
    s->normalized += normalized;
    if (!type || !*type) return;
    int t = 0;
    while (t < s->n_types && strcmp(s->type_name[t], type) != 0) t++;
    if (t == s->n_types) {
        if (s->n_types == MMC_EVAL_MAX_TYPES) return;   /* beyond the table: overall only */
        snprintf(s->type_name[t], sizeof s->type_name[t], "%s", type);
        s->n_types++;
    }
    s->type_samples[t]++;
    s->type_exact[t] += exact;
    s->type_normalized[t] += normalized;
}

double mmc_eval_loss(const mmc_eval_summary *s) {
    return s->n_tokens ? s->nll_sum / (double)s->n_tokens : NAN;
}

static void add_num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

char *mmc_eval_summary_json(const mmc_eval_summary *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    double loss = mmc_eval_loss(s);
    add_num(o, "loss", loss);
    add_num(o, "perplexity", exp(loss));
    add_num(o, "exact_match", s->samples ? (double)s->exact / s->samples : NAN);
    add_num(o, "normalized_match", s->samples ? (double)s->normalized / s->samples : NAN);
    cJSON_AddNumberToObject(o, "samples", (double)s->samples);
    cJSON_AddNumberToObject(o, "tokens", (double)s->n_tokens);
    cJSON_AddNumberToObject(o, "skipped", (double)s->skipped);
    if (s->n_types) {
        cJSON *bt = cJSON_AddObjectToObject(o, "by_type");
        cJSON *be = cJSON_AddObjectToObject(o, "by_type_exact");
        cJSON *bn = cJSON_AddObjectToObject(o, "by_type_samples");
        for (int t = 0; t < s->n_types; t++) {
            double n = (double)s->type_samples[t];
            add_num(bt, s->type_name[t], n ? s->type_normalized[t] / n : NAN);
            add_num(be, s->type_name[t], n ? s->type_exact[t] / n : NAN);
            cJSON_AddNumberToObject(bn, s->type_name[t], n);
        }
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return txt;
}

/* ---------------------------------------------------------------- the run */
typedef struct {
    mmc_qwen2_vl *m;
    mmc_omni *om;              /* instead of m: a Qwen2.5-Omni thinker */
    mmc_whisper_fe fe;         /* its feature extractor */
    mmc_tokenizer *tok;
    mmc_qwen2vl_proc proc;
    int32_t eos[8];
    int n_eos;
    mmc_ctx *ctx;
} evaluator;

/* Teacher-forced NLL of the labelled tokens of b (labels[t] != -100 scores ids[t] from
 * logits[t-1], the trainer's shift). */
static mmc_status score(evaluator *E, const mmc_batch *b, const mmc_vl_media *media, const mmc_omni_media *omedia,
                        double *nll, int64_t *count) {
    mmc_ctx_reset(E->ctx);
    const int64_t n = b->T;
    const int32_t *ids = b->input_ids, *lab = b->labels;
    mmc_tensor *t = mmc_new(E->ctx, MMC_I32, 2, MMC_SHAPE(1, n));
    memcpy(t->data, ids, (size_t)n * sizeof *ids);
    mmc_tensor *h;
    mmc_status st = E->om ? mmc_omni_forward(E->ctx, E->om, ids, n, omedia, NULL, NULL, &h)
                          : mmc_qwen2_vl_forward(E->ctx, E->m, t, media, NULL, NULL, &h);
    if (st) return st;
    /* only the rows that predict a scored token go through the LM head */
    int64_t first = -1;
    for (int64_t i = 1; i < n; i++) if (lab[i] != MMC_IGNORE_INDEX) { first = i - 1; break; }
    *nll = 0;
    *count = 0;
    if (first < 0) return MMC_OK;
    mmc_tensor *hs = mmc_contiguous(E->ctx, mmc_narrow(E->ctx, h, 1, first, n - 1 - first)); /* [1, T', C] */
    mmc_tensor *lg = mmc_contiguous(E->ctx, E->om ? mmc_qwen2_logits(E->ctx, E->om->lm, hs)
                                                  : mmc_qwen2_vl_logits(E->ctx, E->m, hs));  /* [1, T', V] */
    int64_t V = lg->shape[2];
    const float *L = lg->data;
    for (int64_t i = first + 1; i < n; i++) {
        if (lab[i] == MMC_IGNORE_INDEX) continue;
        const float *row = L + (i - 1 - first) * V;
        float mx = row[0];
        for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        double se = 0;
        for (int64_t v = 0; v < V; v++) se += exp((double)row[v] - mx);
        *nll += mx + log(se) - row[lab[i]];
        (*count)++;
    }
    return MMC_OK;
}

/* The model's media view of a prepared batch (tensors wrap the batch's arrays; free with
 * media_free). */
static mmc_vl_media media_of(const mmc_batch *b) {
    mmc_vl_media m = {0};
    if (b->n_images) {
        m.pixel_values = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(b->n_patches, b->patch_dim), b->pixel_values);
        m.image_grid_thw = b->image_grid_thw;
        m.n_images = b->n_images;
    }
    if (b->n_videos) {
        m.pixel_values_videos = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(b->n_video_patches, b->patch_dim), b->video_values);
        m.video_grid_thw = b->video_grid_thw;
        m.n_videos = b->n_videos;
        m.second_per_grid_ts = b->video_second_per_grid_ts;
    }
    return m;
}

static void media_free(mmc_vl_media *m) {
    mmc_tensor_free(m->pixel_values);
    mmc_tensor_free(m->pixel_values_videos);
    memset(m, 0, sizeof *m);
}

/* The thinker's media view of a prepared batch (audios point into the batch; *ain malloc'd). */
static mmc_omni_media omni_media_of(const mmc_batch *b, const mmc_vl_media *vm, mmc_omni_audio_in **ain) {
    mmc_omni_media m = {.pixel_values = vm->pixel_values, .image_grid_thw = vm->image_grid_thw,
                        .n_images = vm->n_images};
    *ain = b->n_audios ? calloc((size_t)b->n_audios, sizeof **ain) : NULL;
    for (int a = 0; *ain && a < b->n_audios; a++)
        (*ain)[a] = (mmc_omni_audio_in){.feats = b->audio_feats + (size_t)a * (size_t)(b->audio_mels * b->audio_stride),
                                        .stride = b->audio_stride, .frames = b->audio_frames[a]};
    m.audios = *ain;
    m.n_audios = *ain ? b->n_audios : 0;
    return m;
}

static bool media_ok(const mmc_batch *b, const mmc_vl_media *m) {
    return (!b->n_images || m->pixel_values) && (!b->n_videos || m->pixel_values_videos);
}

/* The user message the answer replies to, as tagged text ("<image>What colour ...?"): text
 * parts as they are, image/video parts as <image>/<video> (malloc'd). */
static char *question_of(const mmc_example *ex) {
    int last = ex->n_messages - 1;
    while (last >= 0 && strcmp(ex->messages[last].role, "assistant")) last--;
    int u = last - 1;
    while (u >= 0 && strcmp(ex->messages[u].role, "user")) u--;
    if (u < 0) return strdup("");
    const mmc_chat_message *m = &ex->messages[u];
    if (!m->n_parts) return strdup(m->content ? m->content : "");
    size_t n = 1;
    for (int p = 0; p < m->n_parts; p++) n += m->parts[p].type == MMC_CHAT_TEXT ? strlen(m->parts[p].text) : 7;
    char *q = malloc(n);
    if (!q) return NULL;
    q[0] = '\0';
    for (int p = 0; p < m->n_parts; p++)
        strcat(q, m->parts[p].type == MMC_CHAT_TEXT ? m->parts[p].text
                  : m->parts[p].type == MMC_CHAT_IMAGE ? "<image>"
                  : m->parts[p].type == MMC_CHAT_AUDIO ? "<audio>" : "<video>");
    return q;
}

/* Evaluate sample i; *skip is set when its media cannot be read. root: the media root the
 * dataset resolved paths against (stripped again in the predictions' "image"). */
static mmc_status eval_sample(evaluator *E, const mmc_eval_opts *o, const mmc_data_opts *d, const mmc_dataset *ds,
                              int64_t i, const char *root, mmc_eval_summary *sum, FILE *pred, bool *skip) {
    mmc_batch full = {0}, prompt = {0};
    mmc_vl_media mf = {0}, mp = {0};
    mmc_omni_audio_in *af = NULL, *ap = NULL;
    int32_t *gen = NULL;
    char *answer = NULL, *question = NULL;
    bool media_err = false;
    *skip = false;
    mmc_example ex;
    mmc_dataset_get(ds, i, &ex);
    /* teacher-forced loss over the conversation, as the trainer sees it */
    mmc_status st = mmc_data_prepare_ex(d, E->tok, ds, i, false, &full, &media_err);
    if (st) { *skip = media_err; goto done; }
    mf = media_of(&full);
    if (!media_ok(&full, &mf)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    double nll = 0;
    int64_t cnt = 0;
    mmc_omni_media of = omni_media_of(&full, &mf, &af);
    if (full.n_audios && !af) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if ((st = score(E, &full, (full.n_images || full.n_videos) ? &mf : NULL, &of, &nll, &cnt))) goto done;

    /* greedy answer from the prompt before the last assistant turn */
    if ((st = mmc_data_prepare_ex(d, E->tok, ds, i, true, &prompt, &media_err))) { *skip = media_err; goto done; }
    mp = media_of(&prompt);
    if (!media_ok(&prompt, &mp)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    gen = malloc((size_t)(o->max_new_tokens + 1) * sizeof *gen);
    if (!gen) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_gen_opts g = {.max_new_tokens = o->max_new_tokens, .eos_ids = E->eos, .n_eos = E->n_eos};
    mmc_sampler_defaults(&g.sampler);
    int n_gen = 0;
    mmc_qwen2_vl_request req = {E->m, (prompt.n_images || prompt.n_videos) ? &mp : NULL, 0};
    mmc_omni_media om = omni_media_of(&prompt, &mp, &ap);
    if (prompt.n_audios && !ap) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_omni_request oreq = {E->om, &om, 0};
    mmc_decoder dec = E->om ? mmc_omni_decoder(&oreq) : mmc_qwen2_vl_decoder(&req);
    if ((st = mmc_generate(&dec, prompt.input_ids, prompt.T, &g, gen, &n_gen))) goto done;
    if ((st = mmc_tokenizer_decode(E->tok, gen, n_gen, true, &answer))) goto done;

    const char *ref = ex.answer;
    bool exm = mmc_eval_exact_match(answer, ref), nm = mmc_eval_normalized_match(answer, ref);
    mmc_eval_summary_add(sum, ex.type, nll, cnt, exm, nm);
    if (pred) {
        if (!(question = question_of(&ex))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        fprintf(pred, "{\"index\": %lld, ", (long long)i);
        if (ex.type) { fputs("\"type\": ", pred); mmc_json_write_string(pred, ex.type); fputs(", ", pred); }
        if (ex.n_images) {   /* the path as the dataset wrote it */
            const char *im = ex.images[0];
            size_t lr = strlen(root);
            if (lr && strncmp(im, root, lr) == 0) im += lr;
            fputs("\"image\": ", pred);
            mmc_json_write_string(pred, im);
            fputs(", ", pred);
        }
        fputs("\"question\": ", pred); mmc_json_write_string(pred, question);
        fputs(", \"reference\": ", pred); mmc_json_write_string(pred, ref);
        fputs(", \"prediction\": ", pred); mmc_json_write_string(pred, answer);
        fprintf(pred, ", \"exact\": %s, \"normalized\": %s, \"loss\": %.6f, \"tokens\": %lld}\n",
                exm ? "true" : "false", nm ? "true" : "false", cnt ? nll / cnt : 0.0, (long long)cnt);
    }
done:
    media_free(&mf);
    media_free(&mp);
    free(af);
    free(ap);
    mmc_batch_free(&full);
    mmc_batch_free(&prompt);
    free(gen);
    free(answer);
    free(question);
    return st;
}

mmc_status mmc_eval_run(const mmc_eval_opts *o, mmc_eval_summary *sum) {
    memset(sum, 0, sizeof *sum);
    evaluator E = {0};
    mmc_dataset *ds = NULL;
    char *pp = NULL, *pred_tmp = NULL;
    FILE *pred = NULL;
    mmc_status st;
    if ((!o->model_dir && !o->adapter_dir) || !o->data_path)
        return mmc_error(MMC_ERR_INVALID, "eval: model and data are required");
    if (o->max_new_tokens < 1) return mmc_error(MMC_ERR_INVALID, "eval: max_new_tokens must be >= 1");

    /* the whole file is parsed and validated first, as for training */
    if ((st = mmc_dataset_load(o->data_path, o->image_root, &ds))) goto done;
    /* a LoRA checkpoint (adapter directory) evaluates as its base model + the adapter */
    char base[4096], adir[4096];
    if ((st = mmc_lora_resolve(o->model_dir, o->adapter_dir, base, sizeof base, adir, sizeof adir))) goto done;
    if (mmc_omni_is_omni_dir(base)) {   /* Qwen2.5-Omni thinker */
        if ((st = mmc_omni_load(base, &E.om))) { mmc_error_prefix(st, "loading %s", base); goto done; }
        if (adir[0] && (st = mmc_omni_attach_adapter(E.om, adir))) { mmc_error_prefix(st, "adapter %s", adir); goto done; }
        if ((st = mmc_whisper_fe_load(base, &E.fe))) { mmc_error_prefix(st, "audio feature extractor of %s", base); goto done; }
    } else {
        if ((st = mmc_qwen2_vl_load(base, false, &E.m))) { mmc_error_prefix(st, "loading %s", base); goto done; }
        if (adir[0] && (st = mmc_qwen2_vl_attach_adapter(E.m, adir))) { mmc_error_prefix(st, "adapter %s", adir); goto done; }
    }
    /* tokenizer and processor: the adapter directory's copies (a checkpoint's), else the base's */
    const char *aux = base;
    pp = malloc(sizeof base + 32);
    if (!pp) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    struct stat sb;
    snprintf(pp, sizeof base + 32, "%s/tokenizer.json", adir);
    if (adir[0] && stat(pp, &sb) == 0) aux = adir;
    if ((st = mmc_tokenizer_load(aux, &E.tok))) { mmc_error_prefix(st, "tokenizer of %s", aux); goto done; }
    mmc_qwen2vl_proc_default(&E.proc);
    pp[0] = 0;
    if (adir[0] && (st = mmc_qwen2vl_proc_load_dir(adir, &E.proc, pp, sizeof base + 32))) goto done;
    if (!pp[0] && (st = mmc_qwen2vl_proc_load_dir(base, &E.proc, NULL, 0))) goto done;
    if (o->image_backend) E.proc.resize_mode = (mmc_vlproc_resize_mode)o->image_backend;   /* --image-backend */
    E.n_eos = mmc_tokenizer_eos_ids(E.tok, E.eos, 8);
    E.ctx = mmc_ctx_new();
    if (!E.ctx) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_set_grad_enabled(E.ctx, false);

    /* the data pipeline's options: the model's processor, no truncation, no shuffling */
    mmc_data_opts d;
    mmc_data_opts_default(&d);
    d.proc = E.proc;
    if ((st = mmc_qwen2vl_video_proc_load_dir(aux, &d.vproc))) goto done;
    mmc_qwen2vl_video_sampling_default(&d.vproc);
    d.seq_len = INT64_MAX;
    d.num_workers = 0;
    d.blank_media = o->blank_images;
    d.max_image_pixels = o->max_image_pixels;
    if (E.om) {
        d.omni = true;
        d.fe = &E.fe;
        d.omni_audio_id = (int32_t)E.om->audio_token_id;
        d.omni_image_id = (int32_t)E.om->image_token_id;
        d.omni_video_id = (int32_t)E.om->video_token_id;
    }
    /* the root the dataset resolved relative media paths against (mmc_dataset_load's rule) */
    char root[4096];
    if (o->image_root && *o->image_root)
        snprintf(root, sizeof root, "%s%s", o->image_root, o->image_root[strlen(o->image_root) - 1] == '/' ? "" : "/");
    else {
        const char *sl = strrchr(o->data_path, '/');
        snprintf(root, sizeof root, "%.*s", sl ? (int)(sl - o->data_path + 1) : 0, o->data_path);
    }
    if (o->out_path) {
        size_t n = strlen(o->out_path) + 32;
        pred_tmp = malloc(n);
        if (!pred_tmp) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        snprintf(pred_tmp, n, "%s.tmp", o->out_path);
        if (!(pred = fopen(pred_tmp, "w"))) { st = mmc_error(MMC_ERR_IO, "cannot write %s", pred_tmp); goto done; }
    }

    int64_t n = mmc_dataset_size(ds);
    if (o->limit && o->limit < n) n = o->limit;
    double t0 = mmc_now();
    for (int64_t i = 0; i < n; i++) {
        bool skip = false;
        st = eval_sample(&E, o, &d, ds, i, root, sum, pred, &skip);
        if (st && skip) {
            fprintf(stderr, "mmc eval: skipping %s\n", mmc_last_error());
            sum->skipped++;
            st = MMC_OK;
        }
        if (st) goto done;
        if (o->progress && ((i + 1) % 50 == 0))
            fprintf(o->progress, "\r  eval %lld samples, %.1f samples/s, accuracy %.3f", (long long)(i + 1),
                    (i + 1) / (mmc_now() - t0), sum->samples ? (double)sum->normalized / sum->samples : 0.0);
    }
    if (o->progress && n >= 50) fputc('\n', o->progress);
    if (pred) {
        int bad = ferror(pred);
        bad |= fclose(pred) != 0;
        pred = NULL;
        if (bad || rename(pred_tmp, o->out_path) != 0) {
            st = mmc_error(MMC_ERR_IO, "cannot write %s (disk full?)", o->out_path);
            goto done;
        }
    }
done:
    if (pred) { fclose(pred); remove(pred_tmp); }
    free(pred_tmp);
    mmc_ctx_free(E.ctx);
    mmc_tokenizer_free(E.tok);
    mmc_qwen2_vl_free(E.m);
    mmc_omni_free(E.om);
    if (E.fe.mel_filters || E.fe.priv) mmc_whisper_fe_free(&E.fe);
    mmc_dataset_free(ds);
    free(pp);
    return st;
}
