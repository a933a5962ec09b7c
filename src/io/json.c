/* json.c — typed access to config.json-like files over cJSON (Debian libcjson), in the
 * spirit of transformers' PretrainedConfig: dotted paths ("vision_config.depth",
 * "layer_types.3"), defaults for absent keys (JSON null counts as absent, as HF writes
 * "rope_scaling": null), and errors that name the file, the key, the expected and found
 * types. Parse errors name line:column, computed from cJSON's error position. */
#include "mmc_io.h"
#include "io_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mmc_io_line_col(const char *text, size_t off, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') { l++; c = 1; }
        else if (((unsigned char)text[i] & 0xc0) != 0x80) c++;   /* count UTF-8 characters */
    }
    *line = l;
    *col = c;
}

int mmc_io_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return 1000;
    int d[65][65];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

cJSON *mmc_io_json_parse(const char *text, size_t len, const char *what) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    if (off > len) off = len;
    int line, col;
    if (!j) {
        /* cJSON reports the offset just past the offending character (or the last byte
         * when the input ran out): step back over whitespace to the culprit */
        if (off >= len && len) off = len - 1;
        while (off > 0 && off < len && is_ws(text[off])) off--;
        size_t rest = off + 1;
        while (rest < len && is_ws(text[rest])) rest++;
        mmc_io_line_col(text, off, &line, &col);
        if (len == 0 || (rest >= len && text[off] != '}' && text[off] != ']')) {
            mmc_error(MMC_ERR_FORMAT, "%s:%d:%d: invalid JSON: unexpected end of input", what, line, col);
        } else {
            char near[24];
            size_t k = 0;
            for (size_t i = off; i < len && k < 16 && text[i] != '\n'; i++)
                near[k++] = (unsigned char)text[i] < 0x20 ? '?' : text[i];
            near[k] = 0;
            mmc_error(MMC_ERR_FORMAT, "%s:%d:%d: invalid JSON near '%s'", what, line, col, near);
        }
        return NULL;
    }
    while (off < len && is_ws(text[off])) off++;
    if (off < len) {
        mmc_io_line_col(text, off, &line, &col);
        cJSON_Delete(j);
        mmc_error(MMC_ERR_FORMAT, "%s:%d:%d: invalid JSON: trailing characters after the value",
                  what, line, col);
        return NULL;
    }
    return j;
}

/* The root object carries the file name in valuestring (cJSON never sets it on objects or
 * arrays, and cJSON_Delete frees it). */
static const char *file_of(const cJSON *j) {
    if (j && (cJSON_IsObject(j) || cJSON_IsArray(j)) && j->valuestring) return j->valuestring;
    return "JSON";
}

mmc_status mmc_json_parse(const char *text, size_t len, const char *what, mmc_json **out) {
    *out = NULL;
    if (!what) what = "<json>";
    cJSON *j = mmc_io_json_parse(text, len, what);
    if (!j) return MMC_ERR_FORMAT;
    if (cJSON_IsObject(j) || cJSON_IsArray(j)) {
        j->valuestring = strdup(what);
        if (!j->valuestring) { cJSON_Delete(j); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    }
    *out = (mmc_json *)j;
    return MMC_OK;
}

mmc_status mmc_json_load(const char *path, mmc_json **out) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    mmc_status rc = mmc_read_file(path, &text, &len);
    if (rc) return rc;
    rc = mmc_json_parse(text, len, path, out);
    free(text);
    return rc;
}

void mmc_json_free(mmc_json *j) { cJSON_Delete((cJSON *)j); }

bool mmc_json_is_object(const mmc_json *j) { return j && cJSON_IsObject((const cJSON *)j); }

const mmc_json *mmc_json_get(const mmc_json *j, const char *dotted) {
    const cJSON *n = (const cJSON *)j;
    if (!n || !dotted) return NULL;
    const char *p = dotted;
    while (*p && n) {
        const char *dot = strchr(p, '.');
        size_t k = dot ? (size_t)(dot - p) : strlen(p);
        char key[256];
        if (k >= sizeof key) return NULL;
        memcpy(key, p, k);
        key[k] = 0;
        if (cJSON_IsObject(n)) {
            n = cJSON_GetObjectItemCaseSensitive(n, key);
        } else if (cJSON_IsArray(n) && k > 0 && strspn(key, "0123456789") == k && k < 9) {
            n = cJSON_GetArrayItem(n, atoi(key));
        } else {
            return NULL;
        }
        if (!dot) break;
        p = dot + 1;
    }
    return (const mmc_json *)n;
}

bool mmc_json_has(const mmc_json *j, const char *dotted) {
    const cJSON *n = (const cJSON *)mmc_json_get(j, dotted);
    return n && !cJSON_IsNull(n);
}

/* "a string (\"abc\")", "a number (1.5)", "an object" ... */
static const char *found_str(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsString(v)) snprintf(buf, n, "a string (\"%.40s\")", v->valuestring);
    else if (cJSON_IsNumber(v)) {
        char num[32];
        snprintf(num, sizeof num, "%.15g", v->valuedouble);
        if (strtod(num, NULL) != v->valuedouble) snprintf(num, sizeof num, "%.17g", v->valuedouble);
        snprintf(buf, n, "a number (%s)", num);
    }
    else if (cJSON_IsBool(v)) snprintf(buf, n, "a boolean (%s)", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsObject(v)) snprintf(buf, n, "an object");
    else if (cJSON_IsArray(v)) snprintf(buf, n, "an array");
    else snprintf(buf, n, "null");
    return buf;
}

static mmc_status type_err(const mmc_json *root, const char *key, const char *expected,
                           const cJSON *v) {
    char f[96];
    return mmc_error(MMC_ERR_FORMAT, "%s: %s: expected %s, found %s", file_of((const cJSON *)root),
                     key, expected, found_str(v, f, sizeof f));
}

static bool as_int(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

mmc_status mmc_json_int(const mmc_json *j, const char *dotted, int64_t def, int64_t *out) {
    const cJSON *v = (const cJSON *)mmc_json_get(j, dotted);
    if (!v || cJSON_IsNull(v)) { *out = def; return MMC_OK; }
    if (!as_int(v, out)) { *out = def; return type_err(j, dotted, "an integer", v); }
    return MMC_OK;
}

mmc_status mmc_json_num(const mmc_json *j, const char *dotted, double def, double *out) {
    const cJSON *v = (const cJSON *)mmc_json_get(j, dotted);
    *out = def;
    if (!v || cJSON_IsNull(v)) return MMC_OK;
    if (!cJSON_IsNumber(v)) return type_err(j, dotted, "a number", v);
    *out = v->valuedouble;
    return MMC_OK;
}

mmc_status mmc_json_bool(const mmc_json *j, const char *dotted, bool def, bool *out) {
    const cJSON *v = (const cJSON *)mmc_json_get(j, dotted);
    *out = def;
    if (!v || cJSON_IsNull(v)) return MMC_OK;
    if (!cJSON_IsBool(v)) return type_err(j, dotted, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return MMC_OK;
}

mmc_status mmc_json_str(const mmc_json *j, const char *dotted, const char *def, const char **out) {
    const cJSON *v = (const cJSON *)mmc_json_get(j, dotted);
    *out = def;
    if (!v || cJSON_IsNull(v)) return MMC_OK;
    if (!cJSON_IsString(v)) return type_err(j, dotted, "a string", v);
    *out = v->valuestring;
    return MMC_OK;
}

mmc_status mmc_json_int_array(const mmc_json *j, const char *dotted, int64_t *vals, int *n) {
    const cJSON *v = (const cJSON *)mmc_json_get(j, dotted);
    int cap = *n;
    *n = 0;
    if (!v || cJSON_IsNull(v)) return MMC_OK;
    if (!cJSON_IsArray(v)) return type_err(j, dotted, "an array of integers", v);
    int len = cJSON_GetArraySize(v);
    if (len > cap)
        return mmc_error(MMC_ERR_INVALID, "%s: %s: array has %d elements, at most %d expected",
                         file_of((const cJSON *)j), dotted, len, cap);
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!as_int(e, &vals[i])) {
            char key[300];
            snprintf(key, sizeof key, "%s[%d]", dotted, i);
            return type_err(j, key, "an integer", e);
        }
    }
    *n = len;
    return MMC_OK;
}

void mmc_json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}
