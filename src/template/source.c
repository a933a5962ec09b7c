/* source.c — where a model directory keeps its chat template, in transformers 5's order:
 * chat_template.jinja (written by transformers >= 4.5x save_pretrained), chat_template.json
 * ({"chat_template": ...}, processors of 4.4x), processor_config.json's "chat_template",
 * then tokenizer_config.json's "chat_template" (a string, or a list of {name, template}
 * from which `name` — default "default" — is picked). Also bos/eos from
 * tokenizer_config.json, as strings or AddedToken dicts ({"content": ...}). */
#include "mmc_template.h"

#include <cjson/cJSON.h>
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

/* a "chat_template" member: string, or list of {name, template} */
static mmc_status pick(const cJSON *ct, const char *name, const char *path, char **src) {
    if (cJSON_IsString(ct)) {
        if (name && strcmp(name, "default"))
            return mmc_error(MMC_ERR_NOT_FOUND, "%s has a single chat template, not one named '%s'", path, name);
        *src = strdup(ct->valuestring);
        return *src ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
    }
    if (cJSON_IsArray(ct)) {
        char names[512] = "";
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"), *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(nm) || !cJSON_IsString(tp)) continue;
            if (!strcmp(nm->valuestring, name ? name : "default")) {
                *src = strdup(tp->valuestring);
                return *src ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
            }
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s'%s'", l ? ", " : "", nm->valuestring);
        }
        return mmc_error(MMC_ERR_NOT_FOUND, "%s has no chat template named '%s' (it has %s; pick one with --chat-template-name)",
                         path, name ? name : "default", names[0] ? names : "none");
    }
    return mmc_error(MMC_ERR_FORMAT, "%s: \"chat_template\" is neither a string nor a list of {name, template}", path);
}

mmc_status mmc_template_find(const char *dir, const char *name, char **src, char **origin) {
    if (!dir || !src) return mmc_error(MMC_ERR_INVALID, "mmc_template_find: NULL argument");
    *src = NULL;
    if (origin) *origin = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    size_t n;
    char *s = slurp(path, &n);
    if (s && name && strcmp(name, "default")) { free(s); s = NULL; }
    if (!s) {   /* additional named templates: additional_chat_templates/NAME.jinja */
        if (name) {
            snprintf(path, sizeof path, "%s/additional_chat_templates/%s.jinja", dir, name);
            s = slurp(path, &n);
        }
    }
    if (s) {
        *src = s;
        if (origin) *origin = strdup(path);
        return MMC_OK;
    }
    static const char *const files[] = {"chat_template.json", "processor_config.json", "tokenizer_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cJSON *j;
        mmc_status st = load_json(path, &j);
        if (st == MMC_ERR_NOT_FOUND) continue;
        if (st) return st;
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
        if (ct && !cJSON_IsNull(ct)) {
            st = pick(ct, name, path, src);
            cJSON_Delete(j);
            if (!st && origin) *origin = strdup(path);
            return st;
        }
        cJSON_Delete(j);
    }
    return mmc_error(MMC_ERR_NOT_FOUND,
                     "%s has no chat template (looked for chat_template.jinja, chat_template.json, and \"chat_template\" in "
                     "processor_config.json and tokenizer_config.json); pass one with --chat-template FILE", dir);
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
