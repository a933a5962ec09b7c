/* request.c — the request parser of `mmc serve`: a JSON body of POST /v1/chat/completions or
 * /v1/completions -> mmc_serve_request, with the field names, types and ranges of OpenAI's API
 * reference (Chat Completions: messages with string or part-list content, text, image_url and
 * input_audio parts, and vLLM's audio_url; Completions: prompt). Images and audio are base64
 * (input_audio.data, or data: URIs; decoded here) or, only when the server has a media root,
 * local paths resolved inside it; URLs are refused (no network fetch). The audio's bytes are
 * decoded later, by the backend (mmc_audio_load_mem_max). Every error is a 400 in OpenAI's shape
 * naming the parameter. */
#include "mmc_serve.h"
#include "mmc_json_constraint.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mmc_serve_limits_default(mmc_serve_limits *l) {
    *l = (mmc_serve_limits){.max_body_bytes = 32u << 20,
                            .max_json_depth = 32,
                            .max_images = 8,
                            .max_image_pixels = 16 << 20,
                            .max_audios = 8,
                            .max_audio_seconds = 300,
                            .max_prompt_tokens = 0,
                            .max_output_tokens = 2048,
                            .max_request_seconds = 600,
                            .max_connections = 64,
                            .client_timeout_seconds = 30,
                            .max_queue = 32,
                            .max_n = 8};
}

bool mmc_serve_fail(mmc_serve_error *e, int status, const char *type, const char *param, const char *code,
                    const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

char *mmc_serve_error_json(const mmc_serve_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type[0] ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

#define BAD(param, ...) mmc_serve_fail(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define BADTYPE(param, want, got)                                                                          \
    mmc_serve_fail(err, 400, "invalid_request_error", param, "invalid_type",                               \
                   "Invalid type for '%s': expected %s, but got %s instead.", param, want, got)

static const char *type_name(const cJSON *j) {
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an unknown type";
}

static int b64v(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

bool mmc_serve_base64_decode(const char *s, size_t n, unsigned char **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return false;
    unsigned char *b = malloc(n / 4 * 3 + 3);
    if (!b) return false;
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64v((unsigned char)s[i]);
        if (v < 0) { free(b); return false; }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; b[k++] = (unsigned char)(acc >> bits); }
    }
    *out = b;
    *n_out = k;
    return true;
}

/* Maximum nesting of objects/arrays, strings skipped (checked before cJSON recurses); -1 for what
 * cJSON would accept but JSON (RFC 8259) does not: a NUL byte anywhere, a raw control character
 * in a string (cJSON reads up to a NUL, and copies control characters into strings). */
static int json_depth(const char *s, size_t n) {
    int d = 0, mx = 0;
    bool str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!c) return -1;
        if (str) {
            if ((unsigned char)c < 0x20) return -1;
            if (c == '\\') { if (i + 1 < n && !s[i + 1]) return -1; i++; }
            else if (c == '"') str = false;
        } else if (c == '"') str = true;
        else if (c == '{' || c == '[') { if (++d > mx) mx = d; }
        else if (c == '}' || c == ']') d--;
    }
    return mx;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* number fields: absent/null -> keep the default; wrong type or out of range -> 400 */
static bool get_num(const cJSON *root, const char *key, double lo, double hi, double *out, mmc_serve_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) return true;
    if (!cJSON_IsNumber(j)) return BADTYPE(key, "a decimal", type_name(j));
    if (!(j->valuedouble >= lo && j->valuedouble <= hi))
        return BAD(key, "%g is not a valid value for '%s': it must be in [%g, %g].", j->valuedouble, key, lo, hi);
    *out = j->valuedouble;
    return true;
}

static bool get_int(const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *out, bool *given,
                    mmc_serve_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) return true;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble))
        return BADTYPE(key, "an integer", cJSON_IsNumber(j) ? "a decimal" : type_name(j));
    if (!(j->valuedouble >= (double)lo && j->valuedouble <= (double)hi))
        return BAD(key, "%.0f is not a valid value for '%s': it must be in [%lld, %lld].", j->valuedouble, key,
                   (long long)lo, (long long)hi);
    *out = (int64_t)j->valuedouble;
    if (given) *given = true;
    return true;
}

static bool get_bool(const cJSON *root, const char *key, bool *out, mmc_serve_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) return true;
    if (!cJSON_IsBool(j)) return BADTYPE(key, "a boolean", type_name(j));
    *out = cJSON_IsTrue(j);
    return true;
}

/* An image_url / audio_url part's url -> bytes (data: URI) or a resolved path under media_root;
 * what: "image" or "audio" (in the messages and codes). */
static bool media_source(const char *url, const char *what, const char *param, const char *media_root,
                         mmc_serve_part *p, mmc_serve_error *err) {
    char code_fmt[32], code_url[32];
    snprintf(code_fmt, sizeof code_fmt, "invalid_%s_format", what);
    snprintf(code_url, sizeof code_url, "invalid_%s_url", what);
    if (!strncmp(url, "data:", 5)) {
        const char *b = strstr(url, ";base64,");
        const char *comma = strchr(url, ',');
        if (!b || b > comma)
            return BAD(param, "Invalid %s data URI: only base64 data URIs (data:%s/...;base64,...) are supported.", what,
                       what);
        b += 8;
        if (!mmc_serve_base64_decode(b, strlen(b), &p->data, &p->n_data) || p->n_data == 0)
            return mmc_serve_fail(err, 400, "invalid_request_error", param, code_fmt,
                                  "Invalid base64 in the %s data URI.", what);
        return true;
    }
    if (strstr(url, "://") && strncmp(url, "file://", 7) != 0)
        return mmc_serve_fail(err, 400, "invalid_request_error", param, code_url,
                              "This server does not fetch %s URLs; send the %s as a base64 data URI.", what, what);
    if (!media_root)
        return mmc_serve_fail(err, 400, "invalid_request_error", param, code_url,
                              "Local %s paths are disabled (the server has no --media-root); send a data URI.", what);
    const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
    char joined[PATH_MAX * 2], real[PATH_MAX];
    if (path[0] == '/') snprintf(joined, sizeof joined, "%s", path);
    else snprintf(joined, sizeof joined, "%s/%s", media_root, path);
    size_t rl = strlen(media_root);
    if (!realpath(joined, real) || strncmp(real, media_root, rl) != 0 || (real[rl] != '/' && real[rl] != 0))
        return mmc_serve_fail(err, 400, "invalid_request_error", param, code_url,
                              "%s path '%.200s' is not a readable file under the server's media root.",
                              what[0] == 'i' ? "Image" : "Audio", path);
    p->path = dup_str(real);
    return p->path != NULL;
}

/* Formats input_audio.format may name: OpenAI's wav and mp3, and what else the decoder reads
 * (the bytes are probed; the format must only be one of these). */
static const char *const audio_formats[] = {"wav", "mp3", "flac", "ogg", "opus", "m4a", "aac", "webm"};

/* An input_audio part ({"data": base64, "format": ...}) or an audio_url part ({"url": data: URI
 * or a path under the media root}, or the url string itself) -> p's bytes or path. */
static bool audio_part(const cJSON *it, const char *type, const char *param, const char *media_root, mmc_serve_part *p,
                       mmc_serve_error *err) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(it, type);
    if (!strcmp(type, "audio_url")) {
        if (cJSON_IsObject(o)) o = cJSON_GetObjectItemCaseSensitive(o, "url");
        if (!cJSON_IsString(o)) return BAD(param, "Invalid content part %s: audio_url.url must be a string.", param);
        return media_source(o->valuestring, "audio", param, media_root, p, err);
    }
    if (!cJSON_IsObject(o))
        return BAD(param, "Invalid content part %s: input_audio must be an object with 'data' and 'format'.", param);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "data"), *f = cJSON_GetObjectItemCaseSensitive(o, "format");
    if (!cJSON_IsString(d)) return BAD(param, "Invalid content part %s: input_audio.data must be a base64 string.", param);
    if (!cJSON_IsString(f)) return BAD(param, "Invalid content part %s: input_audio.format must be a string.", param);
    bool known = false;
    for (size_t i = 0; i < sizeof audio_formats / sizeof audio_formats[0]; i++) known |= !strcmp(f->valuestring, audio_formats[i]);
    if (!known)
        return mmc_serve_fail(err, 400, "invalid_request_error", param, "unsupported_audio_format",
                              "Unsupported input_audio.format '%.20s': this server takes wav, mp3, flac, ogg, opus, "
                              "m4a, aac or webm.", f->valuestring);
    if (!mmc_serve_base64_decode(d->valuestring, strlen(d->valuestring), &p->data, &p->n_data) || p->n_data == 0)
        return mmc_serve_fail(err, 400, "invalid_request_error", param, "invalid_audio_format",
                              "Invalid base64 in input_audio.data (standard base64, no line breaks).");
    snprintf(p->format, sizeof p->format, "%s", f->valuestring);
    return true;
}

static bool parse_content(const cJSON *c, int mi, const mmc_serve_limits *lim, const char *media_root,
                          mmc_serve_request *r, mmc_serve_message *m, mmc_serve_error *err) {
    char param[96];
    snprintf(param, sizeof param, "messages.[%d].content", mi);
    if (!c || cJSON_IsNull(c)) {
        if (strcmp(m->role, "assistant") != 0) return BAD(param, "Missing required parameter: '%s'.", param);
        m->content = dup_str("");
        return m->content != NULL;
    }
    if (cJSON_IsString(c)) { m->content = dup_str(c->valuestring); return m->content != NULL; }
    if (!cJSON_IsArray(c)) return BADTYPE(param, "a string or an array of content parts", type_name(c));
    int n = cJSON_GetArraySize(c);
    m->parts = calloc((size_t)(n ? n : 1), sizeof *m->parts);
    if (!m->parts) return BAD(param, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, c) {
        snprintf(param, sizeof param, "messages.[%d].content.[%d]", mi, m->n_parts);
        mmc_serve_part *p = &m->parts[m->n_parts++];
        if (!cJSON_IsObject(it)) return BADTYPE(param, "an object", type_name(it));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (!cJSON_IsString(t)) return BAD(param, "Missing or invalid 'type' in content part %s.", param);
        if (!strcmp(t->valuestring, "text")) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(it, "text");
            if (!cJSON_IsString(x)) return BADTYPE("text", "a string", x ? type_name(x) : "nothing");
            p->type = MMC_CHAT_TEXT;
            if (!(p->text = dup_str(x->valuestring))) return BAD(param, "out of memory");
        } else if (!strcmp(t->valuestring, "image_url")) {
            const cJSON *u = cJSON_GetObjectItemCaseSensitive(it, "image_url");
            if (cJSON_IsObject(u)) u = cJSON_GetObjectItemCaseSensitive(u, "url");
            if (!cJSON_IsString(u)) return BAD(param, "Invalid content part %s: image_url.url must be a string.", param);
            p->type = MMC_CHAT_IMAGE;
            if (++r->n_images > lim->max_images)
                return mmc_serve_fail(err, 400, "invalid_request_error", "messages", "too_many_images",
                                      "Too many images: at most %d per request.", lim->max_images);
            if (!media_source(u->valuestring, "image", param, media_root, p, err)) return false;
        } else if (!strcmp(t->valuestring, "input_audio") || !strcmp(t->valuestring, "audio_url")) {
            p->type = MMC_CHAT_AUDIO;
            if (++r->n_audios > lim->max_audios)
                return mmc_serve_fail(err, 400, "invalid_request_error", "messages", "too_many_audios",
                                      "Too many audio parts: at most %d per request.", lim->max_audios);
            if (!audio_part(it, t->valuestring, param, media_root, p, err)) return false;
        } else
            return BAD(param, "Unsupported content part type '%.40s' (this server takes 'text', 'image_url', "
                       "'input_audio' and 'audio_url').", t->valuestring);
    }
    return true;
}

/* a message's tool use: an assistant's tool_calls (kept as JSON text for the chat template), a
 * tool result's name and tool_call_id */
static bool parse_tool_fields(const cJSON *it, int i, mmc_serve_message *m, mmc_serve_error *err) {
    char param[64];
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(it, "tool_calls");
    if (tc && !cJSON_IsNull(tc)) {
        snprintf(param, sizeof param, "messages.[%d].tool_calls", i);
        if (!cJSON_IsArray(tc)) return BADTYPE(param, "an array", type_name(tc));
        if (strcmp(m->role, "assistant")) return BAD(param, "Only assistant messages can have tool_calls.");
        const cJSON *c;
        cJSON_ArrayForEach(c, tc) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")))
                return BAD(param, "Invalid '%s': each tool call needs a 'function' object with a 'name'.", param);
        }
        if (!(m->tool_calls = cJSON_PrintUnformatted(tc))) return BAD(param, "out of memory");
    }
    static const char *const keys[2] = {"name", "tool_call_id"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, keys[k]);
        if (!v || cJSON_IsNull(v)) continue;
        snprintf(param, sizeof param, "messages.[%d].%s", i, keys[k]);
        if (!cJSON_IsString(v)) return BADTYPE(param, "a string", type_name(v));
        if (!(*(k ? &m->tool_call_id : &m->name) = dup_str(v->valuestring))) return BAD(param, "out of memory");
    }
    return true;
}

static bool parse_messages(const cJSON *root, const mmc_serve_limits *lim, const char *media_root,
                           mmc_serve_request *r, mmc_serve_error *err) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!ms) return BAD("messages", "Missing required parameter: 'messages'.");
    if (!cJSON_IsArray(ms)) return BADTYPE("messages", "an array", type_name(ms));
    int n = cJSON_GetArraySize(ms);
    if (n == 0) return mmc_serve_fail(err, 400, "invalid_request_error", "messages", "empty_array",
                                      "Invalid 'messages': empty array. Expected an array with minimum length 1.");
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) return BAD("messages", "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, ms) {
        int i = r->n_msgs;
        mmc_serve_message *m = &r->msgs[r->n_msgs++];
        char param[64];
        snprintf(param, sizeof param, "messages.[%d]", i);
        if (!cJSON_IsObject(it)) return BADTYPE(param, "an object", type_name(it));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        snprintf(param, sizeof param, "messages.[%d].role", i);
        if (!cJSON_IsString(role)) return BAD(param, "Missing or invalid '%s': expected a string.", param);
        const char *rs = role->valuestring;
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool") &&
            strcmp(rs, "developer"))
            return BAD(param, "Invalid value: '%.40s'. Supported values are: 'system', 'developer', 'user', "
                       "'assistant', and 'tool'.", rs);
        if (!(m->role = dup_str(!strcmp(rs, "developer") ? "system" : rs))) return BAD(param, "out of memory");
        if (!parse_content(cJSON_GetObjectItemCaseSensitive(it, "content"), i, lim, media_root, r, m, err))
            return false;
        if (!parse_tool_fields(it, i, m, err)) return false;
    }
    return true;
}

/* Fields whose request this server cannot honour yet: refused (400 unsupported_parameter) rather
 * than ignored, so a client asking for JSON output or tool calls is not handed free text. A
 * value that asks for nothing (tools [], tool_choice "none", echo false,
 * best_of 1, empty logit_bias) passes. */
static bool unsupported(const cJSON *root, mmc_serve_error *err) {
    static const char *const keys[] = {"functions", "function_call", "logit_bias", "echo", "suffix", "best_of", "audio", "prediction"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!j || cJSON_IsNull(j) || cJSON_IsFalse(j)) continue;
        if ((cJSON_IsArray(j) || cJSON_IsObject(j)) && !j->child) continue;   /* [] or {} */
        if (cJSON_IsNumber(j) && !strcmp(keys[i], "best_of") && j->valuedouble == 1) continue;
        if (cJSON_IsString(j) && !strcmp(keys[i], "suffix") && !j->valuestring[0]) continue;
        return mmc_serve_fail(err, 400, "invalid_request_error", keys[i], "unsupported_parameter",
                              "Unsupported parameter: '%s' is not supported by this server yet.", keys[i]);
    }
    return true;
}

/* response_format: text (nothing to do), json_object (any JSON object) or json_schema (its
 * "schema", compiled: a schema outside the supported subset is a 400 naming what is missing)
 * -> r->json_schema for the engine's constrained decoding. */
static bool parse_response_format(const cJSON *root, mmc_serve_request *r, mmc_serve_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!j || cJSON_IsNull(j)) return true;
    if (!cJSON_IsObject(j)) { BADTYPE("response_format", "an object", type_name(j)); return false; }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!t) { BAD("response_format.type", "Missing required parameter: 'response_format.type'."); return false; }
    if (!cJSON_IsString(t)) { BADTYPE("response_format.type", "a string", type_name(t)); return false; }
    char msg[400];
    if (!strcmp(t->valuestring, "text")) return true;
    if (!strcmp(t->valuestring, "json_object")) {
        if (!mmc_jc_compile(NULL, 0, &r->json_schema, msg, sizeof msg))
            return mmc_serve_fail(err, 500, "server_error", NULL, NULL, "%s", msg);
        return true;
    }
    if (strcmp(t->valuestring, "json_schema"))
        return mmc_serve_fail(err, 400, "invalid_request_error", "response_format.type", "invalid_value",
                              "Invalid value: '%.64s'. Supported values are: 'text', 'json_object', and "
                              "'json_schema'.", t->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "json_schema");
    if (!js) { BAD("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'."); return false; }
    if (!cJSON_IsObject(js)) { BADTYPE("response_format.json_schema", "an object", type_name(js)); return false; }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!name) {
        BAD("response_format.json_schema.name", "Missing required parameter: 'response_format.json_schema.name'.");
        return false;
    }
    if (!cJSON_IsString(name)) { BADTYPE("response_format.json_schema.name", "a string", type_name(name)); return false; }
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(js, "schema");
    char *text = NULL;
    if (sch && !cJSON_IsObject(sch)) {
        BADTYPE("response_format.json_schema.schema", "an object", type_name(sch));
        return false;
    }
    if (sch && !(text = cJSON_PrintUnformatted(sch))) return mmc_serve_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    /* no schema: any JSON object */
    bool ok = mmc_jc_compile(text, text ? strlen(text) : 0, &r->json_schema, msg, sizeof msg);
    free(text);
    if (!ok)
        return mmc_serve_fail(err, 400, "invalid_request_error", "response_format", "invalid_json_schema",
                              "Invalid schema for response_format '%.64s': %s. This server's constrained decoding "
                              "supports a subset of JSON Schema.", name->valuestring, msg);
    return true;
}

/* tools (function schemas) and tool_choice. "required" and a named function constrain the answer
 * to one tool call, Qwen / Hermes style: "<tool_call>\n" {"name": ..., "arguments": {...}}
 * "\n</tool_call>", its arguments by the function's parameters schema when the function is known
 * (one tool, or named); otherwise calls are parsed from the answer after the fact. */
static bool parse_tools(const cJSON *root, mmc_serve_request *r, mmc_serve_error *err) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    bool have = tools && !cJSON_IsNull(tools);
    if (have && !cJSON_IsArray(tools)) return BADTYPE("tools", "an array", type_name(tools));
    if (have && !tools->child) have = false;   /* [] asks for nothing */
    const char *named = NULL;
    r->tool_choice = have ? MMC_SERVE_TOOLS_AUTO : MMC_SERVE_TOOLS_NONE;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice)) {
            const char *c = choice->valuestring;
            if (!strcmp(c, "none")) r->tool_choice = MMC_SERVE_TOOLS_NONE;
            else if (!strcmp(c, "auto") || !strcmp(c, "required")) {
                if (!have)
                    return BAD("tool_choice", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when "
                               "'tools' are specified.");
                r->tool_choice = c[0] == 'a' ? MMC_SERVE_TOOLS_AUTO : MMC_SERVE_TOOLS_REQUIRED;
            } else
                return mmc_serve_fail(err, 400, "invalid_request_error", "tool_choice", "invalid_value",
                                      "Invalid value: '%.40s'. Supported values are: 'none', 'auto', and 'required'.", c);
        } else if (cJSON_IsObject(choice)) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
            const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
            if (!cJSON_IsString(nm))
                return BAD("tool_choice.function.name", "Missing required parameter: 'tool_choice.function.name'.");
            if (!have)
                return BAD("tool_choice", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' "
                           "are specified.");
            named = nm->valuestring;
            r->tool_choice = MMC_SERVE_TOOLS_REQUIRED;
        } else
            return BADTYPE("tool_choice", "a string or an object", type_name(choice));
    }
    if (!have) return true;
    /* every tool: {"type": "function", "function": {"name", "description"?, "parameters"?}} */
    cJSON *names = cJSON_CreateArray();
    const cJSON *t, *params = NULL;
    int i = 0, n_match = 0;
    char param[64];
    cJSON_ArrayForEach(t, tools) {
        snprintf(param, sizeof param, "tools[%d]", i++);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm)) {
            cJSON_Delete(names);
            return BAD(param, "Invalid '%s': a tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}.", param);
        }
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!named || !strcmp(named, nm->valuestring)) {
            n_match++;
            params = p;
            cJSON_AddItemToArray(names, cJSON_CreateString(nm->valuestring));
        }
    }
    if (named && !n_match) {
        cJSON_Delete(names);
        return mmc_serve_fail(err, 400, "invalid_request_error", "tool_choice", "invalid_value",
                              "Invalid 'tool_choice': no function named '%.64s' in 'tools'.", named);
    }
    if (r->tool_choice != MMC_SERVE_TOOLS_NONE && !(r->tools = cJSON_PrintUnformatted(tools))) {
        cJSON_Delete(names);
        return BAD("tools", "out of memory");
    }
    if (r->tool_choice != MMC_SERVE_TOOLS_REQUIRED) { cJSON_Delete(names); return true; }
    if (r->json_schema) {
        cJSON_Delete(names);
        return BAD("tool_choice", "'tool_choice' %s cannot be combined with a JSON 'response_format'.",
                   named ? "naming a function" : "'required'");
    }
    /* the call's schema: the name among the allowed ones, the arguments by their parameters (when
     * only one function can be called) */
    cJSON *sch = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(sch, "properties");
    cJSON_AddStringToObject(sch, "type", "object");
    cJSON_AddItemToObject(cJSON_AddObjectToObject(props, "name"), "enum", names);
    cJSON *args = n_match == 1 && cJSON_IsObject(params) ? cJSON_Duplicate(params, true) : NULL;
    if (!args) { args = cJSON_CreateObject(); cJSON_AddStringToObject(args, "type", "object"); }
    cJSON_AddItemToObject(props, "arguments", args);
    cJSON *req = cJSON_AddArrayToObject(sch, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString("arguments"));
    char *text = cJSON_PrintUnformatted(sch), msg[400];
    cJSON_Delete(sch);
    bool ok = text && mmc_jc_compile(text, strlen(text), &r->json_schema, msg, sizeof msg);
    if (!text) snprintf(msg, sizeof msg, "out of memory");
    free(text);
    if (!ok)
        return mmc_serve_fail(err, 400, "invalid_request_error", "tools", "invalid_function_parameters",
                              "Invalid parameters schema for the function called with tool_choice: %s. Constrained "
                              "tool calls support a subset of JSON Schema.", msg);
    if (!mmc_jc_wrap(r->json_schema, "<tool_call>\n", "\n</tool_call>")) return BAD("tools", "out of memory");
    return true;
}

bool mmc_serve_parse_request(const char *body, size_t len, mmc_serve_kind kind, const mmc_serve_limits *lim,
                             const char *media_root, mmc_serve_request *r, mmc_serve_error *err) {
    memset(r, 0, sizeof *r);
    memset(err, 0, sizeof *err);
    r->kind = kind;
    r->temperature = r->top_p = r->min_p = NAN;
    r->presence_penalty = r->frequency_penalty = 0;
    r->top_k = r->max_tokens = -1;
    r->n = 1;
    int depth = json_depth(body, len);
    if (depth > lim->max_json_depth)
        return mmc_serve_fail(err, 400, "invalid_request_error", NULL, "json_too_deep",
                              "The request body nests objects/arrays deeper than %d levels.", lim->max_json_depth);
    const char *end = NULL;
    cJSON *root = depth < 0 ? NULL : cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (root) {   /* one value, then only whitespace */
        while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
        if (end < body + len) { cJSON_Delete(root); root = NULL; }
    }
    if (!root)
        return mmc_serve_fail(err, 400, "invalid_request_error", NULL, NULL,
                              "We could not parse the JSON body of your request. (HINT: This likely means you "
                              "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)");
    bool ok = false;
    const cJSON *j;
    if (!cJSON_IsObject(root)) {
        BAD(NULL, "The request body must be a JSON object, not %s.", type_name(root));
        goto done;
    }
    if ((j = cJSON_GetObjectItemCaseSensitive(root, "model")) && !cJSON_IsNull(j)) {
        if (!cJSON_IsString(j)) { BADTYPE("model", "a string", type_name(j)); goto done; }
        if (!(r->model = dup_str(j->valuestring))) goto done;
    }
    if (!unsupported(root, err)) goto done;
    if (!parse_response_format(root, r, err)) goto done;
    if (kind == MMC_SERVE_CHAT && !parse_tools(root, r, err)) goto done;
    if (kind == MMC_SERVE_COMPLETION)
        for (int k = 0; k < 2; k++) {
            const char *key = k ? "tool_choice" : "tools";
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
            if (v && !cJSON_IsNull(v)) {
                mmc_serve_fail(err, 400, "invalid_request_error", key, "unsupported_parameter",
                               "Unrecognized request argument supplied: %s (tools are for /v1/chat/completions).", key);
                goto done;
            }
        }
    if (kind == MMC_SERVE_CHAT) {
        if (!parse_messages(root, lim, media_root, r, err)) goto done;
    } else {
        j = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (!j) { BAD("prompt", "Missing required parameter: 'prompt'."); goto done; }
        if (cJSON_IsArray(j) && cJSON_GetArraySize(j) == 1 && cJSON_IsString(cJSON_GetArrayItem(j, 0)))
            j = cJSON_GetArrayItem(j, 0);
        else if (cJSON_IsArray(j)) {
            mmc_serve_fail(err, 400, "invalid_request_error", "prompt", "unsupported_value",
                           "This server takes one prompt string per request, not a list of prompts or token ids.");
            goto done;
        }
        if (!cJSON_IsString(j)) { BADTYPE("prompt", "a string", type_name(j)); goto done; }
        if (!(r->prompt = dup_str(j->valuestring))) goto done;
    }
    int64_t v;
    bool given = false;
    if (!get_num(root, "temperature", 0, 2, &r->temperature, err) || !get_num(root, "top_p", 0, 1, &r->top_p, err) ||
        !get_num(root, "min_p", 0, 1, &r->min_p, err) ||
        !get_num(root, "presence_penalty", -2, 2, &r->presence_penalty, err) ||
        !get_num(root, "frequency_penalty", -2, 2, &r->frequency_penalty, err))
        goto done;
    if (r->top_p == 0) { BAD("top_p", "0 is not a valid value for 'top_p': it must be in (0, 1]."); goto done; }
    if (!get_int(root, "top_k", -1, INT32_MAX, &r->top_k, NULL, err)) goto done;
    if (cJSON_GetObjectItemCaseSensitive(root, "top_k") && r->top_k == -1) r->top_k = 0;   /* -1: off */
    if (!get_int(root, "max_tokens", 1, INT32_MAX, &r->max_tokens, NULL, err) ||
        !get_int(root, "max_completion_tokens", 1, INT32_MAX, &r->max_tokens, NULL, err))
        goto done;
    if (!get_int(root, "seed", INT64_MIN, INT64_MAX, &r->seed, &r->has_seed, err)) goto done;
    v = 1;
    if (!get_int(root, "n", 1, lim->max_n, &v, NULL, err)) goto done;
    r->n = (int)v;
    if (!get_bool(root, "stream", &r->stream, err)) goto done;
    if ((j = cJSON_GetObjectItemCaseSensitive(root, "stream_options")) && !cJSON_IsNull(j)) {
        if (!cJSON_IsObject(j)) { BADTYPE("stream_options", "an object", type_name(j)); goto done; }
        if (!r->stream) {
            BAD("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
            goto done;
        }
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "include_usage");
        if (u && !cJSON_IsNull(u)) {
            if (!cJSON_IsBool(u)) { BADTYPE("stream_options.include_usage", "a boolean", type_name(u)); goto done; }
            r->include_usage = cJSON_IsTrue(u);
        }
    }
    if ((j = cJSON_GetObjectItemCaseSensitive(root, "stop")) && !cJSON_IsNull(j)) {
        if (cJSON_IsString(j)) {
            if (j->valuestring[0] && !(r->stop[r->n_stop++] = dup_str(j->valuestring))) goto done;
        } else if (cJSON_IsArray(j)) {
            if (cJSON_GetArraySize(j) > MMC_SERVE_MAX_STOP) {
                BAD("stop", "Invalid 'stop': array too long. Expected an array with maximum length %d.", MMC_SERVE_MAX_STOP);
                goto done;
            }
            const cJSON *s;
            cJSON_ArrayForEach(s, j) {
                if (!cJSON_IsString(s)) { BADTYPE("stop", "a string or an array of strings", "an array with a non-string"); goto done; }
                if (s->valuestring[0] && !(r->stop[r->n_stop++] = dup_str(s->valuestring))) goto done;
            }
        } else {
            BADTYPE("stop", "a string or an array of strings", type_name(j));
            goto done;
        }
    }
    if (kind == MMC_SERVE_CHAT) {
        if (!get_bool(root, "logprobs", &r->logprobs, err)) goto done;
        v = 0;
        given = false;
        if (!get_int(root, "top_logprobs", 0, 20, &v, &given, err)) goto done;
        if (given && !r->logprobs) {
            BAD("top_logprobs", "Using 'top_logprobs' requires 'logprobs' to be true.");
            goto done;
        }
        r->top_logprobs = (int)v;
    } else {
        v = 0;
        given = false;
        if (!get_int(root, "logprobs", 0, 5, &v, &given, err)) goto done;
        r->logprobs = given;
        r->top_logprobs = (int)v;
    }
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) {
        if (!err->status) BAD(NULL, "out of memory");
        mmc_serve_request_free(r);
    }
    return ok;
}

void mmc_serve_request_free(mmc_serve_request *r) {
    for (int i = 0; i < r->n_msgs; i++) {
        mmc_serve_message *m = &r->msgs[i];
        for (int k = 0; k < m->n_parts; k++) {
            free(m->parts[k].text);
            free(m->parts[k].data);
            free(m->parts[k].path);
        }
        free(m->parts);
        free(m->role);
        free(m->content);
        free(m->tool_calls);
        free(m->name);
        free(m->tool_call_id);
    }
    free(r->msgs);
    free(r->prompt);
    free(r->model);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    mmc_jc_schema_free(r->json_schema);
    free(r->tools);
    memset(r, 0, sizeof *r);
}
