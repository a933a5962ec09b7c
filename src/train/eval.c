/* eval.c — `mmc eval`: teacher-forced loss / perplexity over assistant tokens and greedy
 * short-answer accuracy of a Qwen2-VL model on a chat dataset (see mmc_eval.h).
 *
 * Samples are read in the formats the training pipeline accepts for single-turn VQA:
 * LLaMA-Factory `messages` (role/content strings with <image> tags) + `images`, and
 * LLaVA `conversations` (from human/gpt, value with <image>) + `image`/`images`. Each
 * sample is rendered with the model's chat template exactly as for training (default
 * system turn, one <|vision_start|><|image_pad|><|vision_end|> per image, each pad expanded
 * to the image's merged-token count, as transformers' Qwen2VLProcessor does). The loss
 * scores every token of the assistant turns (content + <|im_end|>), like HF's label mask;
 * the answer is generated greedily from the prompt that ends before the last assistant turn.
 * Answer normalisation follows the SQuAD / VQA evaluation habit (lower case, no
 * punctuation, no articles) plus number words -> digits.
 */
#include "mmc_eval.h"
#include "mmc_prompt.h"
#include "mmc_image.h"
#include "mmc_infer.h"
#include "mmc_io.h"
#include "mmc_tokenizer.h"
#include "mmc_vl.h"
#include "mmc_vlproc.h"

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

/* ---------------------------------------------------------------- samples */
#define MAX_MSGS 64
#define MAX_IMAGES 16

typedef struct {
    int n_msgs;
    const char *role[MAX_MSGS];
    const char *content[MAX_MSGS];
    int n_images;
    const char *image[MAX_IMAGES];
    const char *type;
} sample;

static const char *role_of(const char *r) {
    if (!strcmp(r, "human") || !strcmp(r, "user")) return "user";
    if (!strcmp(r, "gpt") || !strcmp(r, "assistant")) return "assistant";
    if (!strcmp(r, "system")) return "system";
    return NULL;
}

/* Fill `s` with pointers into `j` (valid while j lives). */
static mmc_status parse_sample(const cJSON *j, const char *file, int64_t line, sample *s) {
    memset(s, 0, sizeof *s);
    if (!cJSON_IsObject(j)) return mmc_error(MMC_ERR_FORMAT, "%s:%lld: a sample must be a JSON object", file, (long long)line);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const char *rk = "role", *ck = "content";
    if (!msgs) { msgs = cJSON_GetObjectItemCaseSensitive(j, "conversations"); rk = "from"; ck = "value"; }
    if (!cJSON_IsArray(msgs))
        return mmc_error(MMC_ERR_FORMAT, "%s:%lld: no \"messages\" or \"conversations\" array", file, (long long)line);
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (s->n_msgs == MAX_MSGS) return mmc_error(MMC_ERR_FORMAT, "%s:%lld: more than %d messages", file, (long long)line, MAX_MSGS);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, rk), *c = cJSON_GetObjectItemCaseSensitive(m, ck);
        if (!cJSON_IsString(r) || !cJSON_IsString(c))
            return mmc_error(MMC_ERR_FORMAT, "%s:%lld: message %d needs string \"%s\" and \"%s\" (content parts are not supported by mmc eval)",
                             file, (long long)line, s->n_msgs, rk, ck);
        const char *role = role_of(r->valuestring);
        if (!role) return mmc_error(MMC_ERR_FORMAT, "%s:%lld: message %d has unknown role \"%s\"", file, (long long)line, s->n_msgs, r->valuestring);
        s->role[s->n_msgs] = role;
        s->content[s->n_msgs++] = c->valuestring;
    }
    const cJSON *imgs = cJSON_GetObjectItemCaseSensitive(j, "images");
    if (!imgs) imgs = cJSON_GetObjectItemCaseSensitive(j, "image");
    if (cJSON_IsString(imgs)) s->image[s->n_images++] = imgs->valuestring;
    else if (cJSON_IsArray(imgs)) {
        const cJSON *im;
        cJSON_ArrayForEach(im, imgs) {
            if (!cJSON_IsString(im)) return mmc_error(MMC_ERR_FORMAT, "%s:%lld: \"images\" must hold path strings", file, (long long)line);
            if (s->n_images == MAX_IMAGES) return mmc_error(MMC_ERR_FORMAT, "%s:%lld: more than %d images", file, (long long)line, MAX_IMAGES);
            s->image[s->n_images++] = im->valuestring;
        }
    } else if (imgs && !cJSON_IsNull(imgs))
        return mmc_error(MMC_ERR_FORMAT, "%s:%lld: \"images\" must be a list of paths", file, (long long)line);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (cJSON_IsString(t)) s->type = t->valuestring;
    int last = -1, tags = 0;
    for (int i = 0; i < s->n_msgs; i++) {
        if (!strcmp(s->role[i], "assistant")) last = i;
        for (const char *p = s->content[i]; (p = strstr(p, "<image>")); p += 7) tags++;
    }
    if (last < 0) return mmc_error(MMC_ERR_FORMAT, "%s:%lld: the conversation has no assistant turn", file, (long long)line);
    if (tags != s->n_images)
        return mmc_error(MMC_ERR_FORMAT, "%s:%lld: %d <image> tags but %d images", file, (long long)line, tags, s->n_images);
    return MMC_OK;
}

/* Split messages into chat parts (text / image at each <image>). Parts go into `parts`
 * (capacity cap); text pieces are copied into `pool` (NUL-separated). */
static int build_chat(const sample *s, int n_msgs, mmc_chat_message *cm, mmc_chat_part *parts, int cap,
                      char *pool) {
    int np = 0;
    for (int i = 0; i < n_msgs; i++) {
        cm[i] = (mmc_chat_message){.role = s->role[i]};
        if (!strstr(s->content[i], "<image>")) { cm[i].content = s->content[i]; continue; }
        cm[i].parts = parts + np;
        const char *p = s->content[i];
        for (;;) {
            const char *q = strstr(p, "<image>");
            size_t L = q ? (size_t)(q - p) : strlen(p);
            if (L && np < cap) {
                memcpy(pool, p, L);
                pool[L] = '\0';
                parts[np++] = (mmc_chat_part){.type = MMC_CHAT_TEXT, .text = pool};
                pool += L + 1;
            }
            if (!q) break;
            if (np < cap) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_IMAGE};
            p = q + 7;
        }
        cm[i].n_parts = (int)(parts + np - cm[i].parts);
    }
    return np;
}

/* In-place wrapper over the shared placeholder expansion (mmc_prompt.h). */
static mmc_status expand_pads(int32_t **ids, uint8_t **mask, int64_t *n, int32_t pad, const int64_t *n_tok,
                              int n_images) {
    int32_t *ni = NULL;
    uint8_t *nm = NULL;
    int64_t m = 0;
    mmc_status st = mmc_vl_expand_pads(*ids, mask ? *mask : NULL, *n, pad, n_tok, n_images, -1, NULL, 0,
                                       &ni, mask ? &nm : NULL, &m);
    if (st) return st;
    free(*ids);
    *ids = ni;
    if (mask) { free(*mask); *mask = nm; }
    *n = m;
    return MMC_OK;
}

/* ---------------------------------------------------------------- the run */
typedef struct {
    mmc_qwen2_vl *m;
    mmc_tokenizer *tok;
    mmc_qwen2vl_proc proc;
    int32_t eos[8];
    int n_eos;
    mmc_ctx *ctx;
} evaluator;

/* Teacher-forced NLL of the masked tokens of ids (mask[t] == 1 scores ids[t] from logits[t-1]). */
static mmc_status score(evaluator *E, const int32_t *ids, const uint8_t *mask, int64_t n,
                        const mmc_vl_media *media, double *nll, int64_t *count) {
    mmc_ctx_reset(E->ctx);
    mmc_tensor *t = mmc_new(E->ctx, MMC_I32, 2, MMC_SHAPE(1, n));
    memcpy(t->data, ids, (size_t)n * sizeof *ids);
    mmc_tensor *h;
    mmc_status st = mmc_qwen2_vl_forward(E->ctx, E->m, t, media, NULL, NULL, &h);
    if (st) return st;
    /* only the rows that predict a scored token go through the LM head */
    int64_t first = -1;
    for (int64_t i = 1; i < n; i++) if (mask[i]) { first = i - 1; break; }
    *nll = 0;
    *count = 0;
    if (first < 0) return MMC_OK;
    mmc_tensor *hs = mmc_contiguous(E->ctx, mmc_narrow(E->ctx, h, 1, first, n - 1 - first)); /* [1, T', C] */
    mmc_tensor *lg = mmc_contiguous(E->ctx, mmc_qwen2_vl_logits(E->ctx, E->m, hs));        /* [1, T', V] */
    int64_t V = lg->shape[2];
    const float *L = lg->data;
    for (int64_t i = first + 1; i < n; i++) {
        if (!mask[i]) continue;
        const float *row = L + (i - 1 - first) * V;
        float mx = row[0];
        for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        double se = 0;
        for (int64_t v = 0; v < V; v++) se += exp((double)row[v] - mx);
        *nll += mx + log(se) - row[ids[i]];
        (*count)++;
    }
    return MMC_OK;
}

static char *join_path(const char *root, const char *p) {
    if (p[0] == '/' || !root || !*root) return strdup(p);
    size_t n = strlen(root) + strlen(p) + 2;
    char *o = malloc(n);
    if (o) snprintf(o, n, "%s/%s", root, p);
    return o;
}

/* Evaluate one sample; *skip is set when its image cannot be read. */
static mmc_status eval_sample(evaluator *E, const mmc_eval_opts *o, const sample *s, const char *root,
                              int64_t index, mmc_eval_summary *sum, FILE *pred, bool *skip) {
    mmc_status st = MMC_OK;
    mmc_image imgs[MAX_IMAGES] = {{0}};
    mmc_vlproc_out vp = {0};
    int32_t *ids = NULL, *pids = NULL, *gen = NULL;
    uint8_t *mask = NULL;
    char *pool = NULL, *answer = NULL;
    int n_loaded = 0;
    *skip = false;

    for (int i = 0; i < s->n_images; i++) {
        char *path = join_path(root, s->image[i]);
        if (!path) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        st = mmc_image_load(path, NULL, &imgs[i]);
        free(path);
        if (st) { *skip = true; goto done; }
        n_loaded++;
        if (o->blank_images) memset(imgs[i].data, 0, (size_t)imgs[i].height * imgs[i].width * 3);
    }
    int64_t n_tok[MAX_IMAGES];
    mmc_vl_media media = {0};
    if (s->n_images) {
        if ((st = mmc_qwen2vl_preprocess_images(&E->proc, imgs, s->n_images, &vp))) { *skip = true; goto done; }
        int m2 = E->proc.merge_size * E->proc.merge_size;
        for (int i = 0; i < s->n_images; i++) n_tok[i] = vp.grid_thw[i][0] * vp.grid_thw[i][1] * vp.grid_thw[i][2] / m2;
        media.pixel_values = vp.pixel_values;
        media.image_grid_thw = &vp.grid_thw[0][0];
        media.n_images = s->n_images;
    }

    int last = 0;
    for (int i = 0; i < s->n_msgs; i++) if (!strcmp(s->role[i], "assistant")) last = i;
    size_t pool_n = 0;
    for (int i = 0; i < s->n_msgs; i++) pool_n += strlen(s->content[i]) + 2 * MAX_IMAGES + 2;
    pool = malloc(pool_n);
    mmc_chat_message cm[MAX_MSGS];
    mmc_chat_part parts[MAX_MSGS + 2 * MAX_IMAGES + 2];
    if (!pool) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    build_chat(s, last + 1, cm, parts, (int)(sizeof parts / sizeof *parts), pool);
    int32_t pad = (int32_t)E->m->image_token_id;

    /* teacher-forced loss over the whole conversation up to the last assistant turn */
    int64_t n = 0, pn = 0;
    mmc_chat_options full = {0}, gp = {.add_generation_prompt = true};
    if ((st = mmc_chat_encode(E->tok, cm, last + 1, &full, &ids, &mask, &n))) goto done;
    if ((st = expand_pads(&ids, &mask, &n, pad, n_tok, s->n_images))) goto done;
    double nll = 0;
    int64_t cnt = 0;
    if ((st = score(E, ids, mask, n, s->n_images ? &media : NULL, &nll, &cnt))) goto done;

    /* greedy answer from the prompt before the last assistant turn */
    if ((st = mmc_chat_encode(E->tok, cm, last, &gp, &pids, NULL, &pn))) goto done;
    if ((st = expand_pads(&pids, NULL, &pn, pad, n_tok, s->n_images))) goto done;
    gen = malloc((size_t)(o->max_new_tokens + 1) * sizeof *gen);
    if (!gen) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_gen_opts g = {.max_new_tokens = o->max_new_tokens, .eos_ids = E->eos, .n_eos = E->n_eos};
    mmc_sampler_defaults(&g.sampler);
    int n_gen = 0;
    if ((st = mmc_qwen2_vl_generate(E->m, pids, pn, s->n_images ? &media : NULL, &g, gen, &n_gen))) goto done;
    if ((st = mmc_tokenizer_decode(E->tok, gen, n_gen, true, &answer))) goto done;

    const char *ref = s->content[last];
    bool ex = mmc_eval_exact_match(answer, ref), nm = mmc_eval_normalized_match(answer, ref);
    mmc_eval_summary_add(sum, s->type, nll, cnt, ex, nm);
    if (pred) {
        const char *question = "";
        for (int i = last - 1; i >= 0; i--) if (!strcmp(s->role[i], "user")) { question = s->content[i]; break; }
        fprintf(pred, "{\"index\": %lld, ", (long long)index);
        if (s->type) { fputs("\"type\": ", pred); mmc_json_write_string(pred, s->type); fputs(", ", pred); }
        if (s->n_images) { fputs("\"image\": ", pred); mmc_json_write_string(pred, s->image[0]); fputs(", ", pred); }
        fputs("\"question\": ", pred); mmc_json_write_string(pred, question);
        fputs(", \"reference\": ", pred); mmc_json_write_string(pred, ref);
        fputs(", \"prediction\": ", pred); mmc_json_write_string(pred, answer);
        fprintf(pred, ", \"exact\": %s, \"normalized\": %s, \"loss\": %.6f, \"tokens\": %lld}\n",
                ex ? "true" : "false", nm ? "true" : "false", cnt ? nll / cnt : 0.0, (long long)cnt);
    }
done:
    for (int i = 0; i < n_loaded; i++) mmc_image_free(&imgs[i]);
    mmc_vlproc_out_free(&vp);
    free(ids); free(mask); free(pids); free(gen); free(pool); free(answer);
    return st;
}

mmc_status mmc_eval_run(const mmc_eval_opts *o, mmc_eval_summary *sum) {
    memset(sum, 0, sizeof *sum);
    evaluator E = {0};
    char *text = NULL, *root = NULL, *pp = NULL;
    FILE *pred = NULL;
    char *pred_tmp = NULL;
    size_t len = 0;
    mmc_status st;
    if ((!o->model_dir && !o->adapter_dir) || !o->data_path)
        return mmc_error(MMC_ERR_INVALID, "eval: model and data are required");
    if (o->max_new_tokens < 1) return mmc_error(MMC_ERR_INVALID, "eval: max_new_tokens must be >= 1");

    if ((st = mmc_read_file(o->data_path, &text, &len))) goto done;
    /* a LoRA checkpoint (adapter directory) evaluates as its base model + the adapter */
    char base[4096], adir[4096];
    if ((st = mmc_lora_resolve(o->model_dir, o->adapter_dir, base, sizeof base, adir, sizeof adir))) goto done;
    if ((st = mmc_qwen2_vl_load(base, false, &E.m))) { mmc_error_prefix(st, "loading %s", base); goto done; }
    if (adir[0] && (st = mmc_qwen2_vl_attach_adapter(E.m, adir))) { mmc_error_prefix(st, "adapter %s", adir); goto done; }
    /* tokenizer and processor: the adapter directory's copies (a checkpoint's), else the base's */
    const char *aux = base;
    pp = malloc(sizeof base + 32);
    if (!pp) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    struct stat sb;
    snprintf(pp, sizeof base + 32, "%s/tokenizer.json", adir);
    if (adir[0] && stat(pp, &sb) == 0) aux = adir;
    if ((st = mmc_tokenizer_load(aux, &E.tok))) { mmc_error_prefix(st, "tokenizer of %s", aux); goto done; }
    mmc_qwen2vl_proc_default(&E.proc);
    snprintf(pp, sizeof base + 32, "%s/preprocessor_config.json", adir);
    if (!adir[0] || stat(pp, &sb) != 0) snprintf(pp, sizeof base + 32, "%s/preprocessor_config.json", base);
    if (stat(pp, &sb) == 0 && (st = mmc_qwen2vl_proc_load(pp, &E.proc))) goto done;
    E.n_eos = mmc_tokenizer_eos_ids(E.tok, E.eos, 8);
    E.ctx = mmc_ctx_new();
    if (!E.ctx) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_set_grad_enabled(E.ctx, false);

    if (o->image_root) root = strdup(o->image_root);
    else {
        root = strdup(o->data_path);
        char *sl = root ? strrchr(root, '/') : NULL;
        if (root) { if (sl) *sl = '\0'; else strcpy(root, "."); }
    }
    if (!root) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if (o->out_path) {
        size_t n = strlen(o->out_path) + 32;
        pred_tmp = malloc(n);
        if (!pred_tmp) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        snprintf(pred_tmp, n, "%s.tmp", o->out_path);
        if (!(pred = fopen(pred_tmp, "w"))) { st = mmc_error(MMC_ERR_IO, "cannot write %s", pred_tmp); goto done; }
    }

    /* JSONL, or one JSON array of samples */
    const char *p = text;
    while (*p && isspace((unsigned char)*p)) p++;
    cJSON *arr = NULL;
    if (*p == '[') {
        mmc_json *j = NULL;
        if ((st = mmc_json_parse(text, len, o->data_path, &j))) goto done;
        arr = (cJSON *)j;
    }
    int64_t line = 0, index = 0;
    double t0 = mmc_now();
    const cJSON *item = arr ? arr->child : NULL;
    char *save = NULL, *cur = arr ? NULL : text;
    for (;;) {
        cJSON *owned = NULL;
        const cJSON *j;
        if (arr) {
            if (!item) break;
            j = item;
            item = item->next;
            line++;
        } else {
            if (!cur || !*cur) break;
            char *nl = strchr(cur, '\n');
            if (nl) *nl = '\0';
            char *ln = cur;
            cur = nl ? nl + 1 : NULL;
            line++;
            while (*ln && isspace((unsigned char)*ln)) ln++;
            if (!*ln) continue;
            owned = cJSON_Parse(ln);
            if (!owned) { st = mmc_error(MMC_ERR_FORMAT, "%s:%lld: invalid JSON", o->data_path, (long long)line); goto done; }
            j = owned;
        }
        (void)save;
        sample s;
        st = parse_sample(j, o->data_path, line, &s);
        bool skip = false;
        if (!st) {
            st = eval_sample(&E, o, &s, root, index, sum, pred, &skip);
            if (skip) {
                fprintf(stderr, "mmc eval: skipping %s:%lld: %s\n", o->data_path, (long long)line, mmc_last_error());
                sum->skipped++;
                st = MMC_OK;
            }
        }
        cJSON_Delete(owned);
        if (st) { if (arr) cJSON_Delete(arr); goto done; }
        index++;
        if (o->progress && (index % 50 == 0))
            fprintf(o->progress, "\r  eval %lld samples, %.1f samples/s, accuracy %.3f", (long long)index,
                    index / (mmc_now() - t0), sum->samples ? (double)sum->normalized / sum->samples : 0.0);
        if (o->limit && index >= o->limit) break;
    }
    if (o->progress && index >= 50) fputc('\n', o->progress);
    if (arr) cJSON_Delete(arr);
    if (sum->samples == 0 && sum->skipped == 0) {
        st = mmc_error(MMC_ERR_INVALID, "%s: no samples", o->data_path);
        goto done;
    }
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
    free(text);
    free(root);
    free(pp);
    return st;
}
