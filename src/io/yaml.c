/* yaml.c — YAML run configs through libyaml's event parser: a small tree of maps, lists
 * and scalars that remembers line numbers, `--set a.b.c=value` overrides, and
 * schema-driven reading into C structs (mmc_cfg_read) with errors in the style of
 * compilers: `run.yaml:7: optimizer.lr: expected a number, found "fast"`, range errors,
 * and unknown keys with a did-you-mean suggestion (edit distance).
 *
 * Supported: block and flow style, plain/quoted/literal/folded scalars, YAML 1.1 booleans
 * (true/false/yes/no/on/off), numbers like 2e-5, 1.0e-4, 0x10, .inf, .nan. Not supported
 * (rejected with the line): anchors and aliases, non-scalar map keys, duplicate keys,
 * multiple documents in one stream. */
#include "mmc_io.h"
#include "io_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define YAML_MAX_DEPTH 64

struct mmc_yaml {
    mmc_yaml_kind kind;
    int line;             /* 1-based; 0 for nodes created by mmc_yaml_set */
    char *text;           /* scalar text (also kept for NULL scalars) */
    int n, cap;
    char **keys;          /* map keys (NULL for lists) */
    int *key_lines;
    mmc_yaml **vals;      /* map values / list items */
};

static mmc_yaml *node_new(mmc_yaml_kind k, int line) {
    mmc_yaml *y = calloc(1, sizeof *y);
    if (y) { y->kind = k; y->line = line; }
    return y;
}

void mmc_yaml_free(mmc_yaml *y) {
    if (!y) return;
    for (int i = 0; i < y->n; i++) {
        if (y->keys) free(y->keys[i]);
        mmc_yaml_free(y->vals[i]);
    }
    free(y->keys);
    free(y->key_lines);
    free(y->vals);
    free(y->text);
    free(y);
}

/* Append (key may be NULL for lists; the key string is taken over). */
static bool node_push(mmc_yaml *y, char *key, int key_line, mmc_yaml *v) {
    if (y->n == y->cap) {
        int cap = y->cap ? 2 * y->cap : 8;
        mmc_yaml **nv = realloc(y->vals, (size_t)cap * sizeof *nv);
        if (!nv) return false;
        y->vals = nv;
        if (y->kind == MMC_YAML_MAP) {
            char **nk = realloc(y->keys, (size_t)cap * sizeof *nk);
            if (!nk) return false;
            y->keys = nk;
            int *nl = realloc(y->key_lines, (size_t)cap * sizeof *nl);
            if (!nl) return false;
            y->key_lines = nl;
        }
        y->cap = cap;
    }
    if (y->kind == MMC_YAML_MAP) {
        y->keys[y->n] = key;
        y->key_lines[y->n] = key_line;
    }
    y->vals[y->n++] = v;
    return true;
}

static bool is_null_text(const char *s) {
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

/* ------------------------------------------------------------------ parsing */
typedef struct {
    yaml_parser_t p;
    const char *what;
} yp;

static mmc_status next_event(yp *y, yaml_event_t *ev) {
    if (yaml_parser_parse(&y->p, ev)) return MMC_OK;
    memset(ev, 0, sizeof *ev);
    const char *prob = y->p.problem ? y->p.problem : "syntax error";
    if (y->p.context)
        return mmc_error(MMC_ERR_FORMAT, "%s:%d:%d: YAML syntax error: %s %s (started at line %d)", y->what,
                         (int)y->p.problem_mark.line + 1, (int)y->p.problem_mark.column + 1,
                         prob, y->p.context, (int)y->p.context_mark.line + 1);
    return mmc_error(MMC_ERR_FORMAT, "%s:%d:%d: YAML syntax error: %s", y->what,
                     (int)y->p.problem_mark.line + 1, (int)y->p.problem_mark.column + 1, prob);
}

static mmc_status anchor_err(yp *y, const yaml_event_t *ev, const unsigned char *anchor) {
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: YAML anchors/aliases are not supported ('%s')",
                     y->what, (int)ev->start_mark.line + 1, (const char *)anchor);
}

/* Build a node from `ev` (consumed) and the events that follow it. */
static mmc_status parse_node(yp *y, yaml_event_t *ev, int depth, mmc_yaml **out) {
    *out = NULL;
    int line = (int)ev->start_mark.line + 1;
    mmc_status rc = MMC_OK;
    mmc_yaml *node = NULL;
    yaml_event_t e;
    if (depth > YAML_MAX_DEPTH) {
        rc = mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: nesting deeper than %d levels", y->what, line,
                       YAML_MAX_DEPTH);
        goto done;
    }
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        rc = anchor_err(y, ev, ev->data.alias.anchor);
        goto done;
    case YAML_SCALAR_EVENT: {
        if (ev->data.scalar.anchor) { rc = anchor_err(y, ev, ev->data.scalar.anchor); goto done; }
        const char *s = (const char *)ev->data.scalar.value;
        size_t n = ev->data.scalar.length;
        bool plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        node = node_new(MMC_YAML_SCALAR, line);
        if (!node || !(node->text = dup_n(s, n))) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        if (plain && is_null_text(node->text)) node->kind = MMC_YAML_NULL;
        break;
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        const yaml_char_t *anchor = map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
        if (anchor) { rc = anchor_err(y, ev, anchor); goto done; }
        node = node_new(map ? MMC_YAML_MAP : MMC_YAML_LIST, line);
        if (!node) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        for (;;) {
            if ((rc = next_event(y, &e))) goto done;
            if (e.type == YAML_SEQUENCE_END_EVENT || e.type == YAML_MAPPING_END_EVENT) {
                yaml_event_delete(&e);
                break;
            }
            char *key = NULL;
            int key_line = (int)e.start_mark.line + 1;
            if (map) {
                if (e.type != YAML_SCALAR_EVENT) {
                    rc = e.type == YAML_ALIAS_EVENT
                             ? anchor_err(y, &e, e.data.alias.anchor)
                             : mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: only scalar map keys are "
                                         "supported", y->what, key_line);
                    yaml_event_delete(&e);
                    goto done;
                }
                if (e.data.scalar.anchor) {
                    rc = anchor_err(y, &e, e.data.scalar.anchor);
                    yaml_event_delete(&e);
                    goto done;
                }
                key = dup_n((const char *)e.data.scalar.value, e.data.scalar.length);
                yaml_event_delete(&e);
                if (!key) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
                for (int i = 0; i < node->n; i++)
                    if (strcmp(node->keys[i], key) == 0) {
                        rc = mmc_error(MMC_ERR_FORMAT, "%s:%d: duplicate key '%s' (first at line %d)",
                                       y->what, key_line, key, node->key_lines[i]);
                        free(key);
                        goto done;
                    }
                if ((rc = next_event(y, &e))) { free(key); goto done; }
            }
            mmc_yaml *child = NULL;
            rc = parse_node(y, &e, depth + 1, &child);
            if (rc) { free(key); goto done; }
            if (!node_push(node, key, key_line, child)) {
                free(key);
                mmc_yaml_free(child);
                rc = mmc_error(MMC_ERR_OOM, "out of memory");
                goto done;
            }
        }
        break;
    }
    default:
        rc = mmc_error(MMC_ERR_FORMAT, "%s:%d: unexpected YAML event %d", y->what, line, (int)ev->type);
        goto done;
    }
done:
    yaml_event_delete(ev);
    if (rc) { mmc_yaml_free(node); return rc; }
    *out = node;
    return MMC_OK;
}

mmc_status mmc_yaml_parse(const char *text, size_t len, const char *what, mmc_yaml **out) {
    *out = NULL;
    yp y = {.what = what ? what : "<yaml>"};
    if (!yaml_parser_initialize(&y.p)) return mmc_error(MMC_ERR_OOM, "out of memory (libyaml)");
    yaml_parser_set_input_string(&y.p, (const unsigned char *)text, len);
    mmc_yaml *root = NULL;
    mmc_status rc = MMC_OK;
    yaml_event_t ev;
    bool done = false;
    int docs = 0;
    while (!done && !rc) {
        if ((rc = next_event(&y, &ev))) break;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = true; yaml_event_delete(&ev); break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1)
                rc = mmc_error(MMC_ERR_UNSUPPORTED, "%s:%d: more than one YAML document", y.what,
                               (int)ev.start_mark.line + 1);
            yaml_event_delete(&ev);
            break;
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT: yaml_event_delete(&ev); break;
        default:
            rc = parse_node(&y, &ev, 0, &root);   /* consumes ev */
            break;
        }
    }
    yaml_parser_delete(&y.p);
    if (rc) { mmc_yaml_free(root); return rc; }
    if (!root) {                      /* empty document: an empty map */
        root = node_new(MMC_YAML_MAP, 1);
        if (!root) return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    *out = root;
    return MMC_OK;
}

mmc_status mmc_yaml_load(const char *path, mmc_yaml **out) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    mmc_status rc = mmc_read_file(path, &text, &len);
    if (rc) return rc;
    rc = mmc_yaml_parse(text, len, path, out);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------ access */
mmc_yaml_kind mmc_yaml_kind_of(const mmc_yaml *y) { return y ? y->kind : MMC_YAML_NULL; }
int mmc_yaml_line(const mmc_yaml *y) { return y ? y->line : 0; }
int mmc_yaml_len(const mmc_yaml *y) {
    return y && (y->kind == MMC_YAML_MAP || y->kind == MMC_YAML_LIST) ? y->n : 0;
}
const mmc_yaml *mmc_yaml_item(const mmc_yaml *y, int i) {
    return y && i >= 0 && i < mmc_yaml_len(y) ? y->vals[i] : NULL;
}
const char *mmc_yaml_key(const mmc_yaml *map, int i) {
    return map && map->kind == MMC_YAML_MAP && i >= 0 && i < map->n ? map->keys[i] : NULL;
}
const char *mmc_yaml_scalar(const mmc_yaml *y) {
    return y && y->kind == MMC_YAML_SCALAR ? y->text : NULL;
}
const mmc_yaml *mmc_yaml_get(const mmc_yaml *map, const char *key) {
    if (!map || map->kind != MMC_YAML_MAP || !key) return NULL;
    for (int i = 0; i < map->n; i++)
        if (strcmp(map->keys[i], key) == 0) return map->vals[i];
    return NULL;
}

/* nodes of a --set value report "--set key" instead of a line */
static void mark_override(mmc_yaml *n) {
    n->line = 0;
    for (int i = 0; i < n->n; i++) {
        if (n->key_lines) n->key_lines[i] = 0;
        mark_override(n->vals[i]);
    }
}

static mmc_status set_err(const char *dotted, const char *why) {
    return mmc_error(MMC_ERR_INVALID, "--set %s: %s", dotted, why);
}

mmc_status mmc_yaml_set(mmc_yaml *root, const char *dotted, const char *value) {
    if (!root || !dotted || !value) return mmc_error(MMC_ERR_INVALID, "mmc_yaml_set: NULL argument");
    if (root->kind != MMC_YAML_MAP) return set_err(dotted, "the document root is not a map");
    size_t dl = strlen(dotted);
    if (!dl || dotted[0] == '.' || dotted[dl - 1] == '.' || strstr(dotted, ".."))
        return set_err(dotted, "empty key in the path");
    /* the value: flow collections and quoted scalars are parsed as YAML, the rest is text */
    mmc_yaml *val = NULL;
    mmc_status rc;
    if (strchr("[{\"'", value[0]) && value[0]) {
        rc = mmc_yaml_parse(value, strlen(value), "--set value", &val);
        if (rc) return mmc_error_prefix(rc, "--set %s", dotted);
    } else {
        val = node_new(MMC_YAML_SCALAR, 0);
        if (!val || !(val->text = strdup(value))) {
            mmc_yaml_free(val);
            return mmc_error(MMC_ERR_OOM, "out of memory");
        }
        if (is_null_text(val->text)) val->kind = MMC_YAML_NULL;
    }
    mark_override(val);
    mmc_yaml *cur = root;
    const char *p = dotted;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t k = dot ? (size_t)(dot - p) : strlen(p);
        if (k == 0) { mmc_yaml_free(val); return set_err(dotted, "empty key in the path"); }
        char *key = dup_n(p, k);
        if (!key) { mmc_yaml_free(val); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        int idx = -1;
        for (int i = 0; i < cur->n; i++)
            if (strcmp(cur->keys[i], key) == 0) { idx = i; break; }
        if (!dot) {                                   /* last segment: replace or add */
            if (idx >= 0) {
                free(key);
                mmc_yaml_free(cur->vals[idx]);
                cur->vals[idx] = val;
            } else if (!node_push(cur, key, 0, val)) {
                free(key);
                mmc_yaml_free(val);
                return mmc_error(MMC_ERR_OOM, "out of memory");
            }
            return MMC_OK;
        }
        if (idx < 0) {
            mmc_yaml *m = node_new(MMC_YAML_MAP, 0);
            if (!m || !node_push(cur, key, 0, m)) {
                free(m);
                free(key);
                mmc_yaml_free(val);
                return mmc_error(MMC_ERR_OOM, "out of memory");
            }
            cur = m;
        } else {
            free(key);
            mmc_yaml *c = cur->vals[idx];
            if (c->kind == MMC_YAML_NULL) {           /* `section:` with no value */
                free(c->text);
                c->text = NULL;
                c->kind = MMC_YAML_MAP;
            }
            if (c->kind != MMC_YAML_MAP) {
                mmc_yaml_free(val);
                char why[320];
                snprintf(why, sizeof why, "'%.*s' is a %s, not a map", (int)(dot - dotted), dotted,
                         c->kind == MMC_YAML_LIST ? "list" : "scalar");
                return set_err(dotted, why);
            }
            cur = c;
        }
        p = dot + 1;
    }
}

/* ------------------------------------------------------------------ schema reading */
typedef struct {
    const char *file;
    char path[512];       /* dotted key path of the current value */
} cfg_ctx;

/* "run.yaml:7: optimizer.lr: " or "run.yaml: --set optimizer.lr: " */
static mmc_status cfg_err(const cfg_ctx *c, mmc_status st, const mmc_yaml *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mmc_status cfg_err(const cfg_ctx *c, mmc_status st, const mmc_yaml *at, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at && at->line > 0) return mmc_error(st, "%s:%d: %s: %s", c->file, at->line, c->path, msg);
    return mmc_error(st, "%s: --set %s: %s", c->file, c->path, msg);
}

static const char *found_desc(const mmc_yaml *v, char *buf, size_t n) {
    switch (v->kind) {
    case MMC_YAML_MAP: return "a map";
    case MMC_YAML_LIST: return "a list";
    case MMC_YAML_NULL: return "an empty value";
    default: snprintf(buf, n, "\"%.60s\"", v->text); return buf;
    }
}

static bool parse_double(const char *s, double *out) {
    static const struct { const char *s; double v; } special[] = {
        {".inf", INFINITY}, {".Inf", INFINITY}, {".INF", INFINITY}, {"+.inf", INFINITY},
        {"+.Inf", INFINITY}, {"+.INF", INFINITY}, {"-.inf", -INFINITY}, {"-.Inf", -INFINITY},
        {"-.INF", -INFINITY}, {".nan", NAN}, {".NaN", NAN}, {".NAN", NAN},
    };
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (strcmp(s, special[i].s) == 0) { *out = special[i].v; return true; }
    if (!*s || !strchr("+-.0123456789", s[0])) return false;   /* no "inf", "nan", spaces */
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || end == s) return false;
    *out = v;
    return true;
}

static bool parse_int(const char *s, int64_t *out, bool *range) {
    *range = false;
    if (!*s || !strchr("+-0123456789", s[0])) return false;
    char *end;
    errno = 0;
    const char *q = s + (s[0] == '+' || s[0] == '-');
    long long v;
    if (q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) {
        v = strtoll(s, &end, 16);
    } else {
        v = strtoll(s, &end, 10);
        if (*end) {                        /* 1e3, 2.0: accept integral values */
            double d;
            if (!parse_double(s, &d) || d != floor(d) || !isfinite(d)) return false;
            if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) { *range = true; return false; }
            *out = (int64_t)d;
            return true;
        }
    }
    if (*end || end == s) return false;
    if (errno == ERANGE) { *range = true; return false; }
    *out = v;
    return true;
}

static bool parse_bool(const char *s, bool *out) {
    static const char *t[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *f[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        if (strcmp(s, t[i]) == 0) { *out = true; return true; }
        if (strcmp(s, f[i]) == 0) { *out = false; return true; }
    }
    return false;
}

static bool ranged(const mmc_cfg_field *f) { return f->min <= f->max; }

/* Closest candidate within a sensible edit distance, or NULL. */
static const char *suggest(const char *key, const char *const *cands, int n) {
    size_t len = strlen(key);
    int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3, best = limit + 1;
    const char *pick = NULL;
    for (int i = 0; i < n; i++) {
        int d = mmc_io_edit_distance(key, cands[i]);
        if (d < best) { best = d; pick = cands[i]; }
    }
    return pick;
}

static void free_str_list(mmc_str_list *l) {
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

static mmc_status read_map(cfg_ctx *c, const mmc_yaml *map, const mmc_cfg_field *fields, char *dst);

static mmc_status read_field(cfg_ctx *c, const mmc_cfg_field *f, const mmc_yaml *v, char *dst) {
    void *slot = dst + f->offset;
    char fb[96];
    const char *s = v->kind == MMC_YAML_SCALAR ? v->text : NULL;
    switch (f->type) {
    case MMC_CFG_INT: {
        int64_t x;
        bool range = false;
        if (!s || !parse_int(s, &x, &range))
            return cfg_err(c, MMC_ERR_FORMAT, v, range ? "%s is out of the 64-bit integer range"
                           : "expected an integer, found %s", found_desc(v, fb, sizeof fb));
        if (ranged(f) && !((double)x >= f->min && (double)x <= f->max))
            return cfg_err(c, MMC_ERR_INVALID, v, "%lld must be in [%.15g, %.15g]", (long long)x,
                           f->min, f->max);
        *(int64_t *)slot = x;
        return MMC_OK;
    }
    case MMC_CFG_FLOAT: {
        double x;
        if (!s || !parse_double(s, &x))
            return cfg_err(c, MMC_ERR_FORMAT, v, "expected a number, found %s",
                           found_desc(v, fb, sizeof fb));
        if (ranged(f) && !(x >= f->min && x <= f->max))
            return cfg_err(c, MMC_ERR_INVALID, v, "%s must be in [%.15g, %.15g]", s, f->min, f->max);
        *(double *)slot = x;
        return MMC_OK;
    }
    case MMC_CFG_BOOL: {
        bool x;
        if (!s || !parse_bool(s, &x))
            return cfg_err(c, MMC_ERR_FORMAT, v, "expected a boolean (true/false), found %s",
                           found_desc(v, fb, sizeof fb));
        *(bool *)slot = x;
        return MMC_OK;
    }
    case MMC_CFG_STR: {
        char **p = slot;
        if (v->kind == MMC_YAML_NULL) { free(*p); *p = NULL; return MMC_OK; }
        if (!s)
            return cfg_err(c, MMC_ERR_FORMAT, v, "expected a string, found %s",
                           found_desc(v, fb, sizeof fb));
        char *d = strdup(s);
        if (!d) return mmc_error(MMC_ERR_OOM, "out of memory");
        free(*p);
        *p = d;
        return MMC_OK;
    }
    case MMC_CFG_ENUM: {
        int n = 0;
        if (f->enum_values) while (f->enum_values[n]) n++;
        if (s)
            for (int i = 0; i < n; i++)
                if (strcmp(s, f->enum_values[i]) == 0) { *(int *)slot = i; return MMC_OK; }
        char allowed[300] = "";
        size_t at = 0;
        for (int i = 0; i < n && at < sizeof allowed; i++)
            at += (size_t)snprintf(allowed + at, sizeof allowed - at, "%s%s", i ? ", " : "",
                                   f->enum_values[i]);
        const char *sug = s ? suggest(s, f->enum_values, n) : NULL;
        char hint[120] = "";
        if (sug) snprintf(hint, sizeof hint, " (did you mean '%s'?)", sug);
        return cfg_err(c, s ? MMC_ERR_INVALID : MMC_ERR_FORMAT, v, "expected one of %s, found %s%s",
                       allowed, found_desc(v, fb, sizeof fb), hint);
    }
    case MMC_CFG_STR_LIST: {
        mmc_str_list *l = slot;
        if (v->kind == MMC_YAML_NULL) { free_str_list(l); return MMC_OK; }
        /* a list field may take keywords in place of the list (its enum_values; e.g.
         * parallel.pipeline_layers: auto): kept as a one-item list */
        bool kw = false;
        for (int i = 0; v->kind == MMC_YAML_SCALAR && f->enum_values && f->enum_values[i]; i++)
            kw |= !strcmp(v->text, f->enum_values[i]);
        if (kw) {
            char **items = calloc(1, sizeof *items);
            if (!items || !(items[0] = strdup(v->text))) { free(items); return mmc_error(MMC_ERR_OOM, "out of memory"); }
            free_str_list(l);
            l->items = items;
            l->n = 1;
            return MMC_OK;
        }
        if (v->kind != MMC_YAML_LIST) {
            char kws[160] = "";
            for (int i = 0, at = 0; f->enum_values && f->enum_values[i] && at < (int)sizeof kws; i++)
                at += snprintf(kws + at, sizeof kws - (size_t)at, "%s%s", i ? ", " : " or one of ", f->enum_values[i]);
            return cfg_err(c, MMC_ERR_FORMAT, v, "expected a list of strings%s, found %s", kws,
                           found_desc(v, fb, sizeof fb));
        }
        for (int i = 0; i < v->n; i++)
            if (v->vals[i]->kind != MMC_YAML_SCALAR) {
                size_t pl = strlen(c->path);
                snprintf(c->path + pl, sizeof c->path - pl, "[%d]", i);
                return cfg_err(c, MMC_ERR_FORMAT, v->vals[i], "expected a string, found %s",
                               found_desc(v->vals[i], fb, sizeof fb));
            }
        char **items = calloc(v->n > 0 ? (size_t)v->n : 1u, sizeof *items);
        if (!items) return mmc_error(MMC_ERR_OOM, "out of memory");
        for (int i = 0; i < v->n; i++)
            if (!(items[i] = strdup(v->vals[i]->text))) {
                for (int k = 0; k < i; k++) free(items[k]);
                free(items);
                return mmc_error(MMC_ERR_OOM, "out of memory");
            }
        free_str_list(l);
        l->items = items;
        l->n = v->n;
        return MMC_OK;
    }
    case MMC_CFG_SECTION:
        if (v->kind == MMC_YAML_NULL) return MMC_OK;
        if (v->kind != MMC_YAML_MAP)
            return cfg_err(c, MMC_ERR_FORMAT, v, "expected a map (section), found %s",
                           found_desc(v, fb, sizeof fb));
        return read_map(c, v, f->section, (char *)slot);
    }
    return cfg_err(c, MMC_ERR_INVALID, v, "bad schema type %d", (int)f->type);
}

static mmc_status read_map(cfg_ctx *c, const mmc_yaml *map, const mmc_cfg_field *fields, char *dst) {
    size_t base = strlen(c->path);
    int nf = 0;
    while (fields && fields[nf].key) nf++;
    for (int i = 0; i < map->n; i++) {
        const char *key = map->keys[i];
        const mmc_cfg_field *f = NULL;
        for (int k = 0; k < nf && !f; k++)
            if (strcmp(fields[k].key, key) == 0) f = &fields[k];
        snprintf(c->path + base, sizeof c->path - base, "%s%s", base ? "." : "", key);
        if (!f) {
            const char *cands[256];
            int nc = nf < 256 ? nf : 256;
            for (int k = 0; k < nc; k++) cands[k] = fields[k].key;
            const char *sug = suggest(key, cands, nc);
            char hint[400] = "";
            if (sug) snprintf(hint, sizeof hint, " (did you mean '%.*s%s%s'?)", (int)base, c->path,
                              base ? "." : "", sug);
            if (map->key_lines[i] > 0)
                return mmc_error(MMC_ERR_FORMAT, "%s:%d: unknown key '%s'%s", c->file,
                                 map->key_lines[i], c->path, hint);
            return mmc_error(MMC_ERR_FORMAT, "%s: --set: unknown key '%s'%s", c->file, c->path, hint);
        }
        mmc_status rc = read_field(c, f, map->vals[i], dst);
        if (rc) return rc;
        c->path[base] = 0;
    }
    c->path[base] = 0;
    return MMC_OK;
}

mmc_status mmc_cfg_read(const mmc_yaml *map, const mmc_cfg_field *fields, void *dst,
                        const char *file) {
    cfg_ctx c = {.file = file ? file : "<config>"};
    if (!map || map->kind == MMC_YAML_NULL) return MMC_OK;
    if (map->kind != MMC_YAML_MAP)
        return mmc_error(MMC_ERR_FORMAT, "%s:%d: expected a map of settings at the top level, found "
                         "a %s", c.file, map->line, map->kind == MMC_YAML_LIST ? "list" : "scalar");
    return read_map(&c, map, fields, dst);
}

void mmc_cfg_free(const mmc_cfg_field *fields, void *dst) {
    for (const mmc_cfg_field *f = fields; f && f->key; f++) {
        char *slot = (char *)dst + f->offset;
        if (f->type == MMC_CFG_STR) {
            free(*(char **)slot);
            *(char **)slot = NULL;
        } else if (f->type == MMC_CFG_STR_LIST) {
            free_str_list((mmc_str_list *)slot);
        } else if (f->type == MMC_CFG_SECTION) {
            mmc_cfg_free(f->section, slot);
        }
    }
}
