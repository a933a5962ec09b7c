/* data.c — dataset files for supervised multimodal fine-tuning: options of the `data:`
 * section, and parsing of the three record layouts users already have (LLaVA
 * `conversations`, LLaMA-Factory / MindSpeed-MM `messages` + `images`/`videos` with
 * <image>/<video> tags, OpenAI `messages` with content parts) into one normalised form
 * (mmc_example). Mirrors the dataset converters of LLaMA-Factory (mm_plugin / aligner) and
 * MindSpeed-MM's data preprocessing: tags become image/video parts in order, roles map
 * human->user, gpt->assistant. Errors name file:line and the reason.
 */
#include "mmc_data.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ batch */
void mmc_batch_free(mmc_batch *b) {
    if (!b) return;
    free(b->input_ids);
    free(b->labels);
    free(b->position_ids);
    free(b->cu_seqlens);
    free(b->sample_ids);
    free(b->pixel_values);
    free(b->image_grid_thw);
    free(b->video_values);
    free(b->video_grid_thw);
    free(b->video_second_per_grid_ts);
    free(b->audio_feats);
    free(b->audio_frames);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------ options */
void mmc_data_opts_default(mmc_data_opts *o) {
    memset(o, 0, sizeof *o);
    o->seq_len = 2048;
    o->micro_batch_size = 1;
    o->num_workers = 2;
    o->seed = 42;
    o->shuffle = true;
    o->truncation = true;
    o->audio_cache_mb = 1024;
    mmc_qwen2vl_proc_default(&o->proc);
    mmc_qwen2vl_video_proc_default(&o->vproc);
    mmc_qwen2vl_video_sampling_default(&o->vproc);
}

void mmc_data_opts_free(mmc_data_opts *o) {
    if (!o) return;
    free(o->train);
    free(o->eval);
    free(o->image_root);
    free(o->processor);
    o->train = o->eval = o->image_root = o->processor = NULL;
}

#define F(key, type, mn, mx, help) {#key, type, offsetof(mmc_data_opts, key), mn, mx, NULL, NULL, help}
const mmc_cfg_field mmc_data_cfg_fields[] = {
    F(train, MMC_CFG_STR, 1, 0, "training dataset (JSON or JSONL)"),
    F(eval, MMC_CFG_STR, 1, 0, "evaluation dataset"),
    F(image_root, MMC_CFG_STR, 1, 0, "directory relative media paths start from"),
    F(max_pixels, MMC_CFG_INT, 0, 1e10, "largest image area after resizing (0: processor's)"),
    F(min_pixels, MMC_CFG_INT, 0, 1e10, "smallest image area after resizing (0: processor's)"),
    F(max_image_pixels, MMC_CFG_INT, 0, 1e12, "refuse image files larger than this (0: PIL's bomb limit)"),
    F(seq_len, MMC_CFG_INT, 8, 1e7, "tokens per packed row / truncation limit"),
    F(packing, MMC_CFG_BOOL, 1, 0, "pack several samples per row"),
    F(batch_size, MMC_CFG_INT, 0, 1e7, "global batch (rows) per optimizer step"),
    F(micro_batch_size, MMC_CFG_INT, 1, 1e5, "rows per forward/backward"),
    F(num_workers, MMC_CFG_INT, 0, 256, "preprocessing threads"),
    F(strict, MMC_CFG_BOOL, 1, 0, "fail on a missing/corrupt image instead of skipping it"),
    F(seed, MMC_CFG_INT, 0, 9.2e18, "shuffling seed"),
    F(shuffle, MMC_CFG_BOOL, 1, 0, "reshuffle every epoch"),
    F(truncation, MMC_CFG_BOOL, 1, 0, "cut samples longer than seq_len (else error)"),
    F(prefetch, MMC_CFG_INT, 0, 1e6, "samples prepared ahead"),
    F(bucket_window, MMC_CFG_INT, 0, 1e7, "samples sorted by length per window (padded)"),
    F(add_vision_id, MMC_CFG_BOOL, 1, 0, "'Picture k: ' before each image"),
    F(processor, MMC_CFG_STR, 1, 0, "preprocessor_config.json for the image processor"),
    F(audio_cache_mb, MMC_CFG_INT, 0, 1e7, "audio features kept in memory, MiB (each clip decoded once)"),
    {NULL, 0, 0, 0, 0, NULL, NULL, NULL},
};
#undef F

/* ------------------------------------------------------------------ dataset */
typedef struct {
    mmc_chat_message *msgs;
    int n_msgs;
    char **images;
    int n_images;
    char **videos;
    int n_videos;
    char **audios;
    int n_audios;
    char *type;
    const char *answer;
    char *answer_buf;
    int line;
    mmc_data_format format;
} rec;

struct mmc_dataset {
    char *path;
    rec *recs;
    int64_t n, cap;
};

static void rec_free(rec *r) {
    for (int m = 0; m < r->n_msgs; m++) {
        for (int p = 0; p < r->msgs[m].n_parts; p++) free((char *)r->msgs[m].parts[p].text);
        free((mmc_chat_part *)r->msgs[m].parts);
        free((char *)r->msgs[m].role);
    }
    free(r->msgs);
    for (int i = 0; i < r->n_images; i++) free(r->images[i]);
    free(r->images);
    for (int i = 0; i < r->n_videos; i++) free(r->videos[i]);
    free(r->videos);
    for (int i = 0; i < r->n_audios; i++) free(r->audios[i]);
    free(r->audios);
    free(r->type);
    free(r->answer_buf);
    memset(r, 0, sizeof *r);
}

void mmc_dataset_free(mmc_dataset *ds) {
    if (!ds) return;
    for (int64_t i = 0; i < ds->n; i++) rec_free(&ds->recs[i]);
    free(ds->recs);
    free(ds->path);
    free(ds);
}

int64_t mmc_dataset_size(const mmc_dataset *ds) { return ds ? ds->n : 0; }
const char *mmc_dataset_path(const mmc_dataset *ds) { return ds ? ds->path : NULL; }

void mmc_dataset_get(const mmc_dataset *ds, int64_t i, mmc_example *ex) {
    MMC_CHECK(i >= 0 && i < ds->n, "mmc_dataset_get: index %lld out of [0, %lld)", (long long)i,
              (long long)ds->n);
    const rec *r = &ds->recs[i];
    ex->messages = r->msgs;
    ex->n_messages = r->n_msgs;
    ex->images = (const char *const *)r->images;
    ex->n_images = r->n_images;
    ex->videos = (const char *const *)r->videos;
    ex->n_videos = r->n_videos;
    ex->audios = (const char *const *)r->audios;
    ex->n_audios = r->n_audios;
    ex->type = r->type;
    ex->answer = r->answer;
    ex->line = r->line;
    ex->format = r->format;
}

/* --- parsing helpers; every error names "file:line" (ctx) */
typedef struct {
    const char *file;
    int line;
    const char *root; /* media root, with trailing '/' or "" */
} pctx;

#define PERR(c, st, ...) perr_((c), (st), __VA_ARGS__)
static mmc_status __attribute__((format(printf, 3, 4))) perr_(const pctx *c, mmc_status st, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mmc_error(st, "%s:%d: %s", c->file, c->line, msg);
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Media path: strip file://, resolve relative ones against root. Remote URLs and data: URLs
 * are refused (the pipeline reads local files only). */
static mmc_status media_path(const pctx *c, const char *what, const char *p, char **out) {
    *out = NULL;
    if (!p || !*p) return PERR(c, MMC_ERR_FORMAT, "empty %s path", what);
    if (!strncmp(p, "file://", 7)) p += 7;
    else if (!strncmp(p, "data:", 5) && strcmp(what, "video") && strcmp(what, "videos")) {
        /* inline image (OpenAI image_url with a base64 data URL), decoded when prepared */
        if (!strstr(p, ";base64,"))
            return PERR(c, MMC_ERR_UNSUPPORTED, "%s: only base64 data: URLs are supported", what);
        if (!(*out = strdup(p))) return mmc_error(MMC_ERR_OOM, "out of memory");
        return MMC_OK;
    } else if (!strncmp(p, "http://", 7) || !strncmp(p, "https://", 8) || !strncmp(p, "data:", 5))
        return PERR(c, MMC_ERR_UNSUPPORTED, "%s \"%.60s\": only local files are supported "
                    "(download it and give its path)", what, p);
    size_t lr = p[0] == '/' ? 0 : strlen(c->root), lp = strlen(p);
    char *s = malloc(lr + lp + 1);
    if (!s) return mmc_error(MMC_ERR_OOM, "out of memory");
    memcpy(s, c->root, lr);
    memcpy(s + lr, p, lp + 1);
    *out = s;
    return MMC_OK;
}

typedef struct {
    mmc_chat_part *v;
    int n, cap;
} partvec;

static mmc_status parts_push(partvec *pv, mmc_chat_part_type t, const char *text, size_t len) {
    if (t == MMC_CHAT_TEXT && len == 0) return MMC_OK;
    if (pv->n == pv->cap) {
        int nc = pv->cap ? 2 * pv->cap : 4;
        mmc_chat_part *nv = realloc(pv->v, (size_t)nc * sizeof *nv);
        if (!nv) return mmc_error(MMC_ERR_OOM, "out of memory");
        pv->v = nv;
        pv->cap = nc;
    }
    mmc_chat_part *p = &pv->v[pv->n];
    p->type = t;
    p->text = NULL;
    if (t == MMC_CHAT_TEXT && !(p->text = dupn(text, len))) return mmc_error(MMC_ERR_OOM, "out of memory");
    pv->n++;
    return MMC_OK;
}

/* Split text on <image> / <video> tags into parts; counts the tags. */
static mmc_status parts_from_tagged(partvec *pv, const char *s, int *n_img, int *n_vid, int *n_aud) {
    const char *seg = s;
    for (const char *q = s; *q;) {
        if (*q == '<' && (!strncmp(q, "<image>", 7) || !strncmp(q, "<video>", 7) || !strncmp(q, "<audio>", 7))) {
            bool img = q[1] == 'i', aud = q[1] == 'a';
            mmc_status st = parts_push(pv, MMC_CHAT_TEXT, seg, (size_t)(q - seg));
            if (!st) st = parts_push(pv, aud ? MMC_CHAT_AUDIO : img ? MMC_CHAT_IMAGE : MMC_CHAT_VIDEO, NULL, 0);
            if (st) return st;
            (*(aud ? n_aud : img ? n_img : n_vid))++;
            q += 7;
            seg = q;
        } else q++;
    }
    return parts_push(pv, MMC_CHAT_TEXT, seg, strlen(seg));
}

static const char *map_role(const char *r) {
    if (!strcmp(r, "user") || !strcmp(r, "human")) return "user";
    if (!strcmp(r, "assistant") || !strcmp(r, "gpt")) return "assistant";
    if (!strcmp(r, "system")) return "system";
    return NULL;
}

static const char *json_type_name(const cJSON *j) {
    if (!j) return "nothing";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsArray(j)) return "a list";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsBool(j)) return "a boolean";
    return "null";
}

/* A string or a list of strings -> resolved paths appended to (*v, *n). */
static mmc_status media_list(const pctx *c, const cJSON *j, const char *key, char ***v, int *n) {
    if (!j || cJSON_IsNull(j)) return MMC_OK;
    int cnt = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : 1;
    if (!cJSON_IsArray(j) && !cJSON_IsString(j))
        return PERR(c, MMC_ERR_FORMAT, "\"%s\" must be a string or a list of strings, found %s", key,
                    json_type_name(j));
    char **nv = realloc(*v, (size_t)(*n + cnt + 1) * sizeof *nv);
    if (!nv) return mmc_error(MMC_ERR_OOM, "out of memory");
    *v = nv;
    for (int i = 0; i < cnt; i++) {
        const cJSON *e = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, i) : j;
        if (cJSON_IsObject(e)) { /* {"path": ...} / {"url": ...} */
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "path");
            if (!p) p = cJSON_GetObjectItemCaseSensitive(e, "url");
            e = p;
        }
        if (!cJSON_IsString(e))
            return PERR(c, MMC_ERR_FORMAT, "\"%s\"[%d] must be a path string, found %s", key, i,
                        json_type_name(e));
        mmc_status st = media_path(c, key, e->valuestring, &(*v)[*n]);
        if (st) return st;
        (*n)++;
    }
    return MMC_OK;
}

/* Content part of an OpenAI message. *path gets an explicit media path (or NULL). */
static mmc_status openai_part(const pctx *c, const cJSON *p, int m, int k, partvec *pv,
                              const char **path, bool *is_img, bool *is_vid, bool *is_aud) {
    *path = NULL;
    *is_img = *is_vid = *is_aud = false;
    if (cJSON_IsString(p)) return parts_push(pv, MMC_CHAT_TEXT, p->valuestring, strlen(p->valuestring));
    if (!cJSON_IsObject(p))
        return PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d] must be an object, found %s", m, k,
                    json_type_name(p));
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : NULL;
    const cJSON *img = cJSON_GetObjectItemCaseSensitive(p, "image");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(p, "image_url");
    const cJSON *vid = cJSON_GetObjectItemCaseSensitive(p, "video");
    const cJSON *txt = cJSON_GetObjectItemCaseSensitive(p, "text");
    /* same precedence as the Qwen2-VL chat template */
    if ((t && !strcmp(t, "image")) || (t && !strcmp(t, "image_url")) || img || url) {
        *is_img = true;
        const cJSON *src = img ? img : url;
        if (cJSON_IsObject(src)) src = cJSON_GetObjectItemCaseSensitive(src, "url");
        if (src && !cJSON_IsString(src))
            return PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d]: image must be a path string, found %s",
                        m, k, json_type_name(src));
        if (src) *path = src->valuestring;
        return parts_push(pv, MMC_CHAT_IMAGE, NULL, 0);
    }
    if ((t && !strcmp(t, "video")) || vid) {
        *is_vid = true;
        if (vid && !cJSON_IsString(vid))
            return PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d]: video must be a path string, found %s",
                        m, k, json_type_name(vid));
        if (vid) *path = vid->valuestring;
        return parts_push(pv, MMC_CHAT_VIDEO, NULL, 0);
    }
    const cJSON *aud = cJSON_GetObjectItemCaseSensitive(p, "audio");
    if ((t && (!strcmp(t, "audio") || !strcmp(t, "audio_url"))) || aud) {   /* Qwen2.5-Omni's audio parts */
        *is_aud = true;
        const cJSON *src = aud ? aud : cJSON_GetObjectItemCaseSensitive(p, "audio_url");
        if (cJSON_IsObject(src)) src = cJSON_GetObjectItemCaseSensitive(src, "url");
        if (src && !cJSON_IsString(src))
            return PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d]: audio must be a path string, found %s",
                        m, k, json_type_name(src));
        if (src) *path = src->valuestring;
        return parts_push(pv, MMC_CHAT_AUDIO, NULL, 0);
    }
    if (txt) {
        if (!cJSON_IsString(txt))
            return PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d].text must be a string, found %s", m, k,
                        json_type_name(txt));
        return parts_push(pv, MMC_CHAT_TEXT, txt->valuestring, strlen(txt->valuestring));
    }
    return PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d]: unknown part type \"%s\" (expected text, "
                "image, image_url, video or audio)", m, k, t ? t : "?");
}

static mmc_status parse_record(const pctx *c, const cJSON *o, rec *r) {
    memset(r, 0, sizeof *r);
    r->line = c->line;
    mmc_status st = MMC_OK;
    partvec pv = {0};
    char **img_inline = NULL, **vid_inline = NULL, **aud_inline = NULL; /* OpenAI explicit paths, in order */
    int n_img_inline = 0, n_vid_inline = 0, n_img_slot = 0, n_vid_slot = 0, tag_img = 0, tag_vid = 0;
    int n_aud_inline = 0, n_aud_slot = 0, tag_aud = 0;
    bool openai = false;

    if (!cJSON_IsObject(o))
        return PERR(c, MMC_ERR_FORMAT, "expected a JSON object per sample, found %s", json_type_name(o));
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (cJSON_IsString(ty) && !(r->type = strdup(ty->valuestring))) return mmc_error(MMC_ERR_OOM, "out of memory");
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(o, "conversations");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const char *conv_key = conv ? "conversations" : "messages";
    if (!conv) conv = msgs;
    if (!conv) { st = PERR(c, MMC_ERR_FORMAT, "sample has neither \"conversations\" (LLaVA) nor \"messages\""); goto fail; }
    if (!cJSON_IsArray(conv) || cJSON_GetArraySize(conv) == 0) {
        st = PERR(c, MMC_ERR_FORMAT, "\"%s\" must be a non-empty list, found %s", conv_key,
                  cJSON_IsArray(conv) ? "an empty list" : json_type_name(conv));
        goto fail;
    }
    r->format = conv == msgs ? MMC_DATA_SHAREGPT : MMC_DATA_LLAVA;
    if ((st = media_list(c, cJSON_GetObjectItemCaseSensitive(o, r->format == MMC_DATA_LLAVA ? "image" : "images"),
                         r->format == MMC_DATA_LLAVA ? "image" : "images", &r->images, &r->n_images)))
        goto fail;
    if ((st = media_list(c, cJSON_GetObjectItemCaseSensitive(o, r->format == MMC_DATA_LLAVA ? "video" : "videos"),
                         r->format == MMC_DATA_LLAVA ? "video" : "videos", &r->videos, &r->n_videos)))
        goto fail;
    if ((st = media_list(c, cJSON_GetObjectItemCaseSensitive(o, "audios"), "audios", &r->audios, &r->n_audios)))
        goto fail;
    /* LLaVA files sometimes also use "images" */
    if (r->format == MMC_DATA_LLAVA && !r->n_images &&
        (st = media_list(c, cJSON_GetObjectItemCaseSensitive(o, "images"), "images", &r->images, &r->n_images)))
        goto fail;

    int nm = cJSON_GetArraySize(conv);
    if (!(r->msgs = calloc((size_t)nm, sizeof *r->msgs))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    int last_asst = -1;
    for (int m = 0; m < nm; m++) {
        const cJSON *e = cJSON_GetArrayItem(conv, m);
        if (!cJSON_IsObject(e)) {
            st = PERR(c, MMC_ERR_FORMAT, "%s[%d] must be an object, found %s", conv_key, m, json_type_name(e));
            goto fail;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const char *rk = "role";
        if (!role) { role = cJSON_GetObjectItemCaseSensitive(e, "from"); rk = "from"; }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!content) content = cJSON_GetObjectItemCaseSensitive(e, "value");
        if (!cJSON_IsString(role)) {
            st = PERR(c, MMC_ERR_FORMAT, "%s[%d] has no \"role\"/\"from\" string", conv_key, m);
            goto fail;
        }
        const char *rn = map_role(role->valuestring);
        if (!rn) {
            st = PERR(c, MMC_ERR_FORMAT, "%s[%d].%s: unknown role \"%s\" (expected user/human, assistant/gpt "
                      "or system)", conv_key, m, rk, role->valuestring);
            goto fail;
        }
        if (!(r->msgs[m].role = strdup(rn))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        r->n_msgs = m + 1;
        memset(&pv, 0, sizeof pv);
        if (cJSON_IsString(content)) {
            st = parts_from_tagged(&pv, content->valuestring, &tag_img, &tag_vid, &tag_aud);
        } else if (cJSON_IsArray(content)) {
            openai = true;
            for (int k = 0; k < cJSON_GetArraySize(content) && !st; k++) {
                const char *path;
                bool ii, iv, ia;
                st = openai_part(c, cJSON_GetArrayItem(content, k), m, k, &pv, &path, &ii, &iv, &ia);
                if (st) break;
                if (ia) {   /* audio parts: all with paths or none */
                    if (path) {
                        char **nv = realloc(aud_inline, (size_t)(n_aud_inline + 1) * sizeof *nv);
                        if (!nv) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
                        aud_inline = nv;
                        if ((st = media_path(c, "audio", path, &nv[n_aud_inline]))) break;
                        n_aud_inline++;
                    } else n_aud_slot++;
                    if (n_aud_inline && n_aud_slot)
                        st = PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d]: mixes audio parts with and "
                                  "without paths", m, k);
                    continue;
                }
                if (path) {
                    char ***v = ii ? &img_inline : &vid_inline;
                    int *n = ii ? &n_img_inline : &n_vid_inline;
                    char **nv = realloc(*v, (size_t)(*n + 1) * sizeof *nv);
                    if (!nv) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
                    *v = nv;
                    if ((st = media_path(c, ii ? "image" : "video", path, &nv[*n]))) break;
                    (*n)++;
                } else if (ii) n_img_slot++;
                else if (iv) n_vid_slot++;
                /* an inline path after slots (or vice versa) would be ambiguous */
                if ((ii && path && n_img_slot) || (ii && !path && n_img_inline) ||
                    (iv && path && n_vid_slot) || (iv && !path && n_vid_inline))
                    st = PERR(c, MMC_ERR_FORMAT, "messages[%d].content[%d]: mixes image parts with and "
                              "without paths", m, k);
            }
        } else {
            st = PERR(c, MMC_ERR_FORMAT, "%s[%d] has no \"content\"/\"value\" (string or list of parts), "
                      "found %s", conv_key, m, json_type_name(content));
        }
        r->msgs[m].parts = pv.v;
        r->msgs[m].n_parts = pv.n;
        pv.v = NULL;
        if (st) goto fail;
        if (!strcmp(rn, "assistant")) last_asst = m;
    }
    if (openai) r->format = MMC_DATA_OPENAI;
    if (last_asst < 0) {
        st = PERR(c, MMC_ERR_FORMAT, "conversation has no assistant turn (roles \"assistant\" or \"gpt\"): "
                  "nothing to train on");
        goto fail;
    }
    /* media: explicit OpenAI paths, or the lists matched against tags / path-less parts */
    if (n_img_inline) {
        if (r->n_images) { st = PERR(c, MMC_ERR_FORMAT, "image paths given both in content parts and in \"images\""); goto fail; }
        r->images = img_inline; r->n_images = n_img_inline; img_inline = NULL;
    }
    if (n_vid_inline) {
        if (r->n_videos) { st = PERR(c, MMC_ERR_FORMAT, "video paths given both in content parts and in \"videos\""); goto fail; }
        r->videos = vid_inline; r->n_videos = n_vid_inline; vid_inline = NULL;
    }
    if (n_aud_inline) {
        if (r->n_audios) { st = PERR(c, MMC_ERR_FORMAT, "audio paths given both in content parts and in \"audios\""); goto fail; }
        r->audios = aud_inline; r->n_audios = n_aud_inline; aud_inline = NULL;
    }
    int want_aud = tag_aud + n_aud_slot + n_aud_inline;
    if (want_aud != r->n_audios) {
        st = PERR(c, MMC_ERR_FORMAT, "%d audio placeholder%s (<audio> tags / audio parts) but %d audio%s listed "
                  "(\"audios\")", want_aud, want_aud == 1 ? "" : "s", r->n_audios, r->n_audios == 1 ? "" : "s");
        goto fail;
    }
    int want_img = tag_img + n_img_slot + n_img_inline, want_vid = tag_vid + n_vid_slot + n_vid_inline;
    if (want_img != r->n_images) {
        st = PERR(c, MMC_ERR_FORMAT, "%d image placeholder%s (<image> tags / image parts) but %d image%s listed",
                  want_img, want_img == 1 ? "" : "s", r->n_images, r->n_images == 1 ? "" : "s");
        goto fail;
    }
    if (want_vid != r->n_videos) {
        st = PERR(c, MMC_ERR_FORMAT, "%d video placeholder%s (<video> tags / video parts) but %d video%s listed",
                  want_vid, want_vid == 1 ? "" : "s", r->n_videos, r->n_videos == 1 ? "" : "s");
        goto fail;
    }
    /* answer: text of the last assistant message */
    {
        const mmc_chat_message *a = &r->msgs[last_asst];
        size_t len = 0;
        for (int p = 0; p < a->n_parts; p++) if (a->parts[p].type == MMC_CHAT_TEXT) len += strlen(a->parts[p].text);
        if (!(r->answer_buf = malloc(len + 1))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        len = 0;
        for (int p = 0; p < a->n_parts; p++)
            if (a->parts[p].type == MMC_CHAT_TEXT) {
                size_t l = strlen(a->parts[p].text);
                memcpy(r->answer_buf + len, a->parts[p].text, l);
                len += l;
            }
        r->answer_buf[len] = 0;
        r->answer = r->answer_buf;
    }
    return MMC_OK;
fail:
    for (int i = 0; i < n_img_inline && img_inline; i++) free(img_inline[i]);
    for (int i = 0; i < n_vid_inline && vid_inline; i++) free(vid_inline[i]);
    for (int i = 0; i < n_aud_inline && aud_inline; i++) free(aud_inline[i]);
    free(img_inline);
    free(vid_inline);
    free(aud_inline);
    for (int p = 0; p < pv.n && pv.v; p++) free((char *)pv.v[p].text);
    free(pv.v);
    rec_free(r);
    return st;
}

static mmc_status ds_push(mmc_dataset *ds, rec *r) {
    if (ds->n == ds->cap) {
        int64_t nc = ds->cap ? 2 * ds->cap : 64;
        rec *nv = realloc(ds->recs, (size_t)nc * sizeof *nv);
        if (!nv) return mmc_error(MMC_ERR_OOM, "out of memory");
        ds->recs = nv;
        ds->cap = nc;
    }
    ds->recs[ds->n++] = *r;
    return MMC_OK;
}

static int line_of(const char *text, size_t off, int *col) {
    int line = 1;
    size_t ls = 0;
    for (size_t i = 0; i < off && text[i]; i++)
        if (text[i] == '\n') { line++; ls = i + 1; }
    if (col) *col = (int)(off - ls) + 1;
    return line;
}

/* Start offsets of the top-level elements of a JSON array (strings and nesting skipped). */
static mmc_status array_starts(const char *t, size_t n, size_t **starts, int64_t *count) {
    int64_t cap = 64, k = 0;
    size_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return mmc_error(MMC_ERR_OOM, "out of memory");
    int depth = 0;
    bool in_str = false, expect = false;
    for (size_t i = 0; i < n; i++) {
        char ch = t[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = false;
            continue;
        }
        if (isspace((unsigned char)ch)) continue;
        if (depth == 1 && expect && ch != ']') {
            if (k == cap) {
                size_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *nv);
                if (!nv) { free(v); return mmc_error(MMC_ERR_OOM, "out of memory"); }
                v = nv;
            }
            v[k++] = i;
            expect = false;
        }
        if (ch == '"') in_str = true;
        else if (ch == '[' || ch == '{') { if (++depth == 1) expect = true; }
        else if (ch == ']' || ch == '}') depth--;
        else if (ch == ',' && depth == 1) expect = true;
    }
    *starts = v;
    *count = k;
    return MMC_OK;
}

mmc_status mmc_dataset_load(const char *path, const char *image_root, mmc_dataset **out) {
    *out = NULL;
    if (!path || !*path) return mmc_error(MMC_ERR_INVALID, "dataset: no file given");
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return mmc_error_prefix(st, "dataset");
    mmc_dataset *ds = calloc(1, sizeof *ds);
    char root[4096];
    size_t *starts = NULL;
    cJSON *arr = NULL;
    if (!ds || !(ds->path = strdup(path))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if (image_root && *image_root) {
        snprintf(root, sizeof root, "%s%s", image_root, image_root[strlen(image_root) - 1] == '/' ? "" : "/");
    } else { /* the dataset's directory */
        const char *sl = strrchr(path, '/');
        snprintf(root, sizeof root, "%.*s", sl ? (int)(sl - path + 1) : 0, path);
    }
    pctx c = {.file = path, .line = 1, .root = root};
    size_t i0 = 0;
    while (i0 < len && isspace((unsigned char)text[i0])) i0++;
    if (i0 + 3 <= len && (unsigned char)text[i0] == 0xEF && (unsigned char)text[i0 + 1] == 0xBB &&
        (unsigned char)text[i0 + 2] == 0xBF) i0 += 3; /* UTF-8 BOM */
    if (i0 < len && text[i0] == '[') { /* JSON array */
        const char *endp = NULL;
        arr = cJSON_ParseWithLengthOpts(text, len, &endp, false);
        if (!arr) {
            const char *ep = cJSON_GetErrorPtr();
            size_t off = ep && ep >= text && ep <= text + len ? (size_t)(ep - text) : len;
            int col;
            c.line = line_of(text, off, &col);
            st = PERR(&c, MMC_ERR_FORMAT, "malformed JSON at column %d (near \"%.20s\")", col, text + off);
            goto fail;
        }
        /* cJSON stops at the array's closing bracket: anything but whitespace after it is
         * an error (a truncated or concatenated file), not something to ignore */
        size_t end = endp && endp >= text && endp <= text + len ? (size_t)(endp - text) : len;
        size_t rest = end;
        while (rest < len && isspace((unsigned char)text[rest])) rest++;
        if (rest < len) {
            int col;
            c.line = line_of(text, rest, &col);
            st = PERR(&c, MMC_ERR_FORMAT, "unexpected text after the end of the JSON array at column %d "
                      "(near \"%.20s\"); a JSON dataset is one array, JSONL is one object per line", col,
                      text + rest);
            goto fail;
        }
        int64_t ns = 0;
        if ((st = array_starts(text, end, &starts, &ns))) goto fail;
        int64_t n = cJSON_GetArraySize(arr);
        if (ns != n) { /* the scanner only finds line numbers; never trust it over cJSON */
            st = PERR(&c, MMC_ERR_FORMAT, "cannot locate the %lld elements of the JSON array (found %lld)",
                      (long long)n, (long long)ns);
            goto fail;
        }
        int64_t k = 0;
        for (const cJSON *e = arr->child; e; e = e->next, k++) {
            c.line = line_of(text, starts[k], NULL);
            rec r;
            if ((st = parse_record(&c, e, &r))) goto fail;
            if ((st = ds_push(ds, &r))) { rec_free(&r); goto fail; }
        }
    } else { /* JSONL */
        size_t pos = 0;
        int line = 0;
        while (pos < len) {
            size_t e = pos;
            while (e < len && text[e] != '\n') e++;
            line++;
            c.line = line;
            size_t a = pos, b = e;
            while (a < b && isspace((unsigned char)text[a])) a++;
            if (line == 1 && b - a >= 3 && (unsigned char)text[a] == 0xEF && (unsigned char)text[a + 1] == 0xBB &&
                (unsigned char)text[a + 2] == 0xBF) a += 3;
            if (a < b) {
                const char *endp = NULL;
                cJSON *o = cJSON_ParseWithLengthOpts(text + a, b - a, &endp, false);
                if (!o) {
                    const char *ep = cJSON_GetErrorPtr();
                    size_t off = ep && ep >= text + a && ep <= text + b ? (size_t)(ep - text) : b;
                    st = PERR(&c, MMC_ERR_FORMAT, "malformed JSON at column %d (near \"%.*s\")", (int)(off - pos) + 1,
                              (int)(b - off < 20 ? b - off : 20), text + off);
                    goto fail;
                }
                while (endp && endp < text + b && isspace((unsigned char)*endp)) endp++;
                if (endp && endp < text + b) {
                    cJSON_Delete(o);
                    st = PERR(&c, MMC_ERR_FORMAT, "malformed JSON at column %d: text after the object (JSONL "
                              "needs one object per line)", (int)(endp - (text + pos)) + 1);
                    goto fail;
                }
                rec r;
                st = parse_record(&c, o, &r);
                cJSON_Delete(o);
                if (st) goto fail;
                if ((st = ds_push(ds, &r))) { rec_free(&r); goto fail; }
            }
            pos = e + 1;
        }
    }
    if (ds->n == 0) { st = mmc_error(MMC_ERR_FORMAT, "%s: empty dataset (no samples)", path); goto fail; }
    cJSON_Delete(arr);
    free(starts);
    free(text);
    *out = ds;
    return MMC_OK;
fail:
    cJSON_Delete(arr);
    free(starts);
    free(text);
    mmc_dataset_free(ds);
    return st;
}
