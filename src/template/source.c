/* source.c — where a model directory keeps its chat template, read as transformers 5 reads
 * it. A processor directory (processor_config.json / preprocessor_config.json /
 * chat_template.json present; ProcessorMixin.get_processor_dict): processor_config.json's
 * "chat_template", else the legacy chat_template.json (4.4x processors), else
 * chat_template.jinja + additional_chat_templates/NAME.jinja (what save_pretrained writes
 * today). A tokenizer: the .jinja files, else tokenizer_config.json's "chat_template" (a
 * string, a list of {name, template}, or a {name: template} dict). Of several templates,
 * `name` (default "default") picks one. Also bos/eos from tokenizer_config.json, as
 * strings or AddedToken dicts ({"content": ...}). */
#include "mmc_template.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = cap ? 2 * cap : 65536 * 2;
            char *q = realloc(buf, cap);
            if (!q) { free(buf); fclose(f); return NULL; }
            buf = q;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    fclose(f);
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

static mmc_status load_json(const char *path, cJSON **out) {
    *out = NULL;
    size_t n;
    char *s = slurp(path, &n);
    if (!s) return MMC_ERR_NOT_FOUND;
    *out = cJSON_ParseWithLength(s, n);
    free(s);
    if (!*out) return mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON (fix or remove the file)", path);
    return MMC_OK;
}

/* the templates of the winning source, by name ("default" for a single one) */
typedef struct { char *name[64], *src[64]; int n; char origin[4200]; } tset;

static void tset_free(tset *t) { for (int i = 0; i < t->n; i++) { free(t->name[i]); free(t->src[i]); } t->n = 0; }
static mmc_status tset_add(tset *t, const char *name, const char *src, size_t n) {
    if (t->n == 64) return MMC_OK;
    t->name[t->n] = strdup(name);
    t->src[t->n] = malloc(n + 1);
    if (!t->name[t->n] || !t->src[t->n]) { free(t->name[t->n]); free(t->src[t->n]); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    memcpy(t->src[t->n], src, n);
    t->src[t->n][n] = 0;
    t->n++;
    return MMC_OK;
}

/* a "chat_template" member: a string, a list of {name, template}, or a {name: template} dict */
static mmc_status from_member(const cJSON *ct, const char *path, tset *t) {
    snprintf(t->origin, sizeof t->origin, "%s", path);
    if (cJSON_IsString(ct)) return tset_add(t, "default", ct->valuestring, strlen(ct->valuestring));
    const cJSON *e;
    if (cJSON_IsArray(ct)) {
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"), *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(nm) || !cJSON_IsString(tp))
                return mmc_error(MMC_ERR_FORMAT, "%s: an entry of the \"chat_template\" list lacks a string name or template", path);
            mmc_status st = tset_add(t, nm->valuestring, tp->valuestring, strlen(tp->valuestring));
            if (st) return st;
        }
        return MMC_OK;
    }
    if (cJSON_IsObject(ct)) {
        cJSON_ArrayForEach(e, ct) {
            if (!cJSON_IsString(e)) return mmc_error(MMC_ERR_FORMAT, "%s: \"chat_template\".%s is not a string", path, e->string);
            mmc_status st = tset_add(t, e->string, e->valuestring, strlen(e->valuestring));
            if (st) return st;
        }
        return MMC_OK;
    }
    return mmc_error(MMC_ERR_FORMAT, "%s: \"chat_template\" is neither a string nor a list of {name, template}", path);
}

/* "chat_template" of a JSON file: MMC_ERR_NOT_FOUND when the file or the member is absent */
static mmc_status from_json_file(const char *dir, const char *file, tset *t) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cJSON *j;
    mmc_status st = load_json(path, &j);
    if (st) return st;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    st = ct && !cJSON_IsNull(ct) ? from_member(ct, path, t) : MMC_ERR_NOT_FOUND;
    cJSON_Delete(j);
    return st;
}

/* chat_template.jinja ("default") and additional_chat_templates/NAME.jinja */
static mmc_status from_jinja_files(const char *dir, tset *t) {
    char path[4096];
    size_t n;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *s = slurp(path, &n);
    if (s) {
        mmc_status st = tset_add(t, "default", s, n);
        free(s);
        if (st) return st;
        snprintf(t->origin, sizeof t->origin, "%s", path);
    }
    snprintf(path, sizeof path, "%s/additional_chat_templates", dir);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l <= 6 || strcmp(e->d_name + l - 6, ".jinja")) continue;
            char fp[4400], name[256];
            snprintf(fp, sizeof fp, "%s/%s", path, e->d_name);
            snprintf(name, sizeof name, "%.*s", (int)(l - 6), e->d_name);
            if (!(s = slurp(fp, &n))) continue;
            mmc_status st = tset_add(t, name, s, n);
            free(s);
            if (st) { closedir(d); return st; }
            if (!t->origin[0]) snprintf(t->origin, sizeof t->origin, "%s", path);
        }
        closedir(d);
    }
    return t->n ? MMC_OK : MMC_ERR_NOT_FOUND;
}

static bool exists(const char *dir, const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return access(path, F_OK) == 0;
}

mmc_status mmc_template_find(const char *dir, const char *name, char **src, char **origin) {
    if (!dir || !src) return mmc_error(MMC_ERR_INVALID, "mmc_template_find: NULL argument");
    *src = NULL;
    if (origin) *origin = NULL;
    tset t = {0};
    mmc_status st = MMC_ERR_NOT_FOUND;
    /* a processor (transformers 5 ProcessorMixin.get_processor_dict): processor_config.json's
     * chat_template, else the legacy chat_template.json, else the .jinja files */
    bool processor = exists(dir, "processor_config.json") || exists(dir, "preprocessor_config.json") ||
                     exists(dir, "chat_template.json");
    if (processor) {
        st = from_json_file(dir, "processor_config.json", &t);
        if (st == MMC_ERR_NOT_FOUND) st = from_json_file(dir, "chat_template.json", &t);
    }
    /* a tokenizer (PreTrainedTokenizerBase.from_pretrained): the .jinja files, else
     * tokenizer_config.json's chat_template. mmc also falls back to the tokenizer's template
     * for a processor that has none (transformers' processor would refuse). */
    if (st == MMC_ERR_NOT_FOUND) st = from_jinja_files(dir, &t);
    if (st == MMC_ERR_NOT_FOUND) st = from_json_file(dir, "tokenizer_config.json", &t);
    if (st == MMC_ERR_NOT_FOUND)
        return mmc_error(MMC_ERR_NOT_FOUND,
                         "%s has no chat template (looked for chat_template.jinja, chat_template.json, and \"chat_template\" in "
                         "processor_config.json and tokenizer_config.json); pass one with --chat-template FILE", dir);
    if (st) { tset_free(&t); return st; }
    const char *want = name ? name : "default";
    int k = -1;
    for (int i = 0; i < t.n; i++) if (!strcmp(t.name[i], want)) k = i;
    if (k < 0 && !name && t.n == 1) k = 0;
    if (k < 0) {
        char names[1024] = "";
        for (int i = 0; i < t.n; i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s'%s'", l ? ", " : "", t.name[i]);
        }
        st = mmc_error(MMC_ERR_NOT_FOUND, "%s has no chat template named '%s' (it has %s; pick one with --chat-template-name)",
                       t.origin, want, names);
        tset_free(&t);
        return st;
    }
    *src = t.src[k];
    t.src[k] = NULL;
    if (origin) *origin = strdup(t.origin);
    tset_free(&t);
    return MMC_OK;
}

static char *token_str(const cJSON *t) {
    if (cJSON_IsString(t)) return strdup(t->valuestring);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(t, "content");
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    return NULL;
}

mmc_status mmc_template_special_tokens(const char *dir, char **bos, char **eos) {
    if (bos) *bos = NULL;
    if (eos) *eos = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *j;
    mmc_status st = load_json(path, &j);
    if (st == MMC_ERR_NOT_FOUND) return MMC_OK;
    if (st) return st;
    if (bos) *bos = token_str(cJSON_GetObjectItemCaseSensitive(j, "bos_token"));
    if (eos) *eos = token_str(cJSON_GetObjectItemCaseSensitive(j, "eos_token"));
    cJSON_Delete(j);
    return MMC_OK;
}
