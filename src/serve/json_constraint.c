/* json_constraint.c — JSON-constrained decoding for response_format (mmc_json_constraint.h):
 * a JSON Schema subset compiled to a tree of nodes, a pushdown automaton over bytes (a stack
 * of frames: a value not yet started, an object, an array, a string, a number, a literal among
 * candidates), the shortest completion of any state, and the per-step mask over the vocabulary
 * (each token's bytes run through a copy of the state). The grammar is RFC 8259's; the approach
 * is that of grammar-guided decoding in vLLM (outlines / xgrammar) and llama.cpp (GBNF), written
 * here from the JSON grammar itself. */
#include "mmc_json_constraint.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JC_MAX_DEPTH 32
#define JC_MAX_WS 16
#define JC_MAX_DIGITS 16
#define JC_MAX_PROPS 64
#define JC_MAX_LITS 64
#define JC_MAX_MINVAL 4096

enum { N_ANY, N_OBJ, N_ARR, N_STR, N_NUM, N_INT, N_LIT };

typedef struct jc_node {
    int kind;
    /* N_OBJ */
    int n_props;
    char **names;
    size_t *name_len;
    struct jc_node **props;
    uint64_t required;
    bool open;                   /* no properties: any keys, any values */
    /* N_ARR */
    struct jc_node *items;       /* NULL: any values */
    int64_t min_items, max_items;   /* max -1: none */
    /* N_STR */
    int64_t min_len, max_len;
    /* N_LIT: the JSON texts of the allowed values (enum, const, boolean, null) */
    int n_lit;
    char **lit;
    size_t *lit_len;
    /* the shortest value */
    char *minval;
    size_t minval_len;
} jc_node;

struct mmc_jc_schema {
    jc_node *root;
    char *prefix, *suffix;       /* literal text around the value (mmc_jc_wrap), or NULL */
    int32_t n_prefix, n_suffix;
    jc_node **all;
    int n_all, cap_all;
};

enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };

typedef struct {
    const jc_node *node;         /* NULL: any JSON value (open objects, json_object) */
    uint8_t kind, phase, key, esc, u8_need, u8_lo, u8_hi, integer;
    int32_t pos;                 /* F_STR key / F_LIT: bytes matched; F_NUM: digits in the part */
    int32_t cur;                 /* F_OBJ: the property whose value comes */
    int64_t count;               /* F_STR: characters; F_ARR: items started */
    uint64_t set;                /* F_OBJ: properties seen; key F_STR / F_LIT: candidates */
} jc_frame;

struct mmc_jc_state {
    const mmc_jc_schema *s;
    int depth, ws;
    int32_t pre, post;           /* bytes of the schema's prefix / suffix matched */
    jc_frame f[JC_MAX_DEPTH];
};

struct mmc_jc_vocab {
    int64_t n;
    uint8_t **bytes;
    int32_t *len;
    uint8_t *special;
    /* ordinary tokens grouped by their first byte: ids by_first[first[b] .. first[b + 1]) (one
     * step of the automaton per group rules out whole groups: most, outside strings) */
    int32_t *by_first;
    int64_t first[257];
    /* the same order, for a sequential walk: each token's bytes in one blob, and whether it is
     * plain string content (printable, no quote or backslash, whole UTF-8 characters: nchar) */
    uint8_t *blob;
    int64_t *off;
    int32_t *nchar;             /* -1: not plain */
};

/* characters of plain string content in b[0 .. n), or -1 */
static int32_t plain_chars(const uint8_t *b, int32_t n) {
    int32_t c = 0;
    for (int32_t i = 0; i < n; c++) {
        uint8_t x = b[i], lo = 0x80, hi = 0xBF;
        int need;
        if (x < 0x20 || x == '"' || x == '\\' || x == 0x7F) return -1;
        if (x < 0x80) need = 0;
        else if (x >= 0xC2 && x <= 0xDF) need = 1;
        else if (x >= 0xE0 && x <= 0xEF) {
            need = 2;
            if (x == 0xE0) lo = 0xA0;
            if (x == 0xED) hi = 0x9F;
        } else if (x >= 0xF0 && x <= 0xF4) {
            need = 3;
            if (x == 0xF0) lo = 0x90;
            if (x == 0xF4) hi = 0x8F;
        } else
            return -1;
        if (i + need > n - 1) return -1;   /* a character cut at the token's end */
        for (int k = 1; k <= need; k++) {
            uint8_t y = b[i + k];
            if (y < (k == 1 ? lo : 0x80) || y > (k == 1 ? hi : 0xBF)) return -1;
        }
        i += need + 1;
    }
    return c;
}

/* the literals of an any-value that are not strings, numbers, objects or arrays */
static char *any_lits[3] = {"true", "false", "null"};
static size_t any_lit_len[3] = {4, 5, 4};
static const jc_node any_lit_node = {.kind = N_LIT, .n_lit = 3, .lit = any_lits, .lit_len = any_lit_len};

/* ------------------------------------------------------------------ compile */
typedef struct {
    mmc_jc_schema *s;
    char *err;
    size_t n_err;
    bool failed;
} compiler;

static jc_node *fail_at(compiler *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static jc_node *fail_at(compiler *c, const char *path, const char *fmt, ...) {
    if (c->failed) return NULL;
    c->failed = true;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->n_err, "%s (at %s)", msg, path[0] ? path : "the schema's top");
    return NULL;
}

static jc_node *node_new(compiler *c, int kind) {
    jc_node *n = calloc(1, sizeof *n);
    if (!n) return fail_at(c, "", "out of memory");
    if (c->s->n_all == c->s->cap_all) {
        int cap = c->s->cap_all ? c->s->cap_all * 2 : 16;
        jc_node **p = realloc(c->s->all, (size_t)cap * sizeof *p);
        if (!p) { free(n); return fail_at(c, "", "out of memory"); }
        c->s->all = p;
        c->s->cap_all = cap;
    }
    c->s->all[c->s->n_all++] = n;
    n->kind = kind;
    n->max_items = n->max_len = -1;
    return n;
}

static void node_free(jc_node *n) {
    for (int i = 0; i < n->n_props; i++) free(n->names[i]);
    free(n->names);
    free(n->name_len);
    free(n->props);
    if (n->lit != any_lits) {
        for (int i = 0; i < n->n_lit; i++) free(n->lit[i]);
        free(n->lit);
        free(n->lit_len);
    }
    free(n->minval);
    free(n);
}

void mmc_jc_schema_free(mmc_jc_schema *s) {
    if (!s) return;
    for (int i = 0; i < s->n_all; i++) node_free(s->all[i]);
    free(s->all);
    free(s->prefix);
    free(s->suffix);
    free(s);
}

static bool add_lit(compiler *c, jc_node *n, const cJSON *v, const char *path) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        fail_at(c, path, "enum / const values must be strings, numbers, booleans or null");
        return false;
    }
    if (n->n_lit >= JC_MAX_LITS) {
        fail_at(c, path, "more than %d enum values", JC_MAX_LITS);
        return false;
    }
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble)) {
        fail_at(c, path, "a non-finite number");
        return false;
    }
    char *t = cJSON_PrintUnformatted(v);
    if (!t) { fail_at(c, path, "out of memory"); return false; }
    char **l = realloc(n->lit, (size_t)(n->n_lit + 1) * sizeof *l);
    size_t *ll = l ? realloc(n->lit_len, (size_t)(n->n_lit + 1) * sizeof *ll) : NULL;
    if (l) n->lit = l;
    if (!l || !ll) { free(t); fail_at(c, path, "out of memory"); return false; }
    n->lit_len = ll;
    n->lit[n->n_lit] = t;
    n->lit_len[n->n_lit++] = strlen(t);
    return true;
}

static bool set_minval(compiler *c, jc_node *n, const char *path) {
    char *buf = malloc(JC_MAX_MINVAL + 1);
    if (!buf) { fail_at(c, path, "out of memory"); return false; }
    size_t k = 0;
#define PUT(s, l) do { size_t l_ = (l); if (k + l_ > JC_MAX_MINVAL) goto big; memcpy(buf + k, (s), l_); k += l_; } while (0)
    switch (n->kind) {
    case N_ANY: case N_NUM: case N_INT: PUT("0", 1); break;
    case N_STR:
        PUT("\"", 1);
        for (int64_t i = 0; i < n->min_len; i++) PUT("a", 1);
        PUT("\"", 1);
        break;
    case N_LIT: {
        int best = 0;
        for (int i = 1; i < n->n_lit; i++)
            if (n->lit_len[i] < n->lit_len[best]) best = i;
        PUT(n->lit[best], n->lit_len[best]);
        break;
    }
    case N_ARR:
        PUT("[", 1);
        for (int64_t i = 0; i < n->min_items; i++) {
            if (i) PUT(",", 1);
            if (n->items) PUT(n->items->minval, n->items->minval_len);
            else PUT("0", 1);
        }
        PUT("]", 1);
        break;
    case N_OBJ: {
        PUT("{", 1);
        bool first = true;
        for (int i = 0; i < n->n_props; i++) {
            if (!(n->required >> i & 1)) continue;
            if (!first) PUT(",", 1);
            first = false;
            PUT("\"", 1);
            PUT(n->names[i], n->name_len[i]);
            PUT("\":", 2);
            PUT(n->props[i]->minval, n->props[i]->minval_len);
        }
        PUT("}", 1);
        break;
    }
    }
#undef PUT
    buf[k] = 0;
    n->minval = buf;
    n->minval_len = k;
    return true;
big:
    free(buf);
    fail_at(c, path, "the smallest value this schema allows is longer than %d bytes", JC_MAX_MINVAL);
    return false;
}

static bool get_count(compiler *c, const cJSON *sch, const char *key, const char *path, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sch, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 || v->valuedouble != floor(v->valuedouble)) {
        fail_at(c, path, "'%s' must be an integer in [0, 1000000]", key);
        return false;
    }
    *out = (int64_t)v->valuedouble;
    return true;
}

static jc_node *compile_node(compiler *c, const cJSON *sch, const char *path, int depth) {
    if (depth > JC_MAX_DEPTH - 2) return fail_at(c, path, "the schema nests deeper than %d levels", JC_MAX_DEPTH - 2);
    if (cJSON_IsTrue(sch)) return node_new(c, N_ANY);
    if (!cJSON_IsObject(sch)) return fail_at(c, path, "a schema must be an object");
    static const char *const ignored[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "additionalProperties", "strict", "$comment"};
    static const char *const known[] = {"type", "properties", "required", "items", "enum", "const", "minLength",
                                        "maxLength", "minItems", "maxItems"};
    const cJSON *kv;
    cJSON_ArrayForEach(kv, sch) {
        bool ok = false;
        for (size_t i = 0; i < sizeof ignored / sizeof *ignored && !ok; i++) ok = !strcmp(kv->string, ignored[i]);
        for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++) ok = !strcmp(kv->string, known[i]);
        if (!ok)
            return fail_at(c, path, "the JSON Schema keyword '%s' is not supported (supported: type, properties, "
                           "required, items, enum, const, minLength, maxLength, minItems, maxItems)", kv->string);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sch, "enum"), *co = cJSON_GetObjectItemCaseSensitive(sch, "const");
    jc_node *n;
    if (en || co) {
        n = node_new(c, N_LIT);
        if (!n) return NULL;
        if (en) {
            if (!cJSON_IsArray(en) || !en->child) return fail_at(c, path, "'enum' must be a non-empty array");
            const cJSON *v;
            cJSON_ArrayForEach(v, en) if (!add_lit(c, n, v, path)) return NULL;
        }
        if (co && !add_lit(c, n, co, path)) return NULL;
        if (en && co) return fail_at(c, path, "'enum' and 'const' together");
        return set_minval(c, n, path) ? n : NULL;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sch, "type");
    if (!ty) {
        if (cJSON_GetObjectItemCaseSensitive(sch, "properties")) ty = NULL;
        else if (cJSON_GetObjectItemCaseSensitive(sch, "required") || cJSON_GetObjectItemCaseSensitive(sch, "items") ||
                 cJSON_GetObjectItemCaseSensitive(sch, "minItems") || cJSON_GetObjectItemCaseSensitive(sch, "maxItems") ||
                 cJSON_GetObjectItemCaseSensitive(sch, "minLength") || cJSON_GetObjectItemCaseSensitive(sch, "maxLength"))
            return fail_at(c, path, "give a 'type' with these keywords");
        else {
            n = node_new(c, N_ANY);
            return n && set_minval(c, n, path) ? n : NULL;
        }
    } else if (!cJSON_IsString(ty))
        return fail_at(c, path, "'type' must be one string (a list of types is not supported)");
    const char *t = ty ? ty->valuestring : "object";
    if (!strcmp(t, "object")) {
        n = node_new(c, N_OBJ);
        if (!n) return NULL;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
        if (props && !cJSON_IsObject(props)) return fail_at(c, path, "'properties' must be an object");
        int np = cJSON_GetArraySize(props);
        if (np > JC_MAX_PROPS) return fail_at(c, path, "more than %d properties", JC_MAX_PROPS);
        n->open = np == 0;
        n->names = calloc((size_t)(np ? np : 1), sizeof *n->names);
        n->name_len = calloc((size_t)(np ? np : 1), sizeof *n->name_len);
        n->props = calloc((size_t)(np ? np : 1), sizeof *n->props);
        if (!n->names || !n->name_len || !n->props) return fail_at(c, path, "out of memory");
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            const char *nm = p->string;
            for (const unsigned char *q = (const unsigned char *)nm; *q; q++)
                if (*q == '"' || *q == '\\' || *q < 0x20)
                    return fail_at(c, path, "property name '%s': quotes, backslashes and control characters in "
                                   "property names are not supported", nm);
            for (int i = 0; i < n->n_props; i++)
                if (!strcmp(n->names[i], nm)) return fail_at(c, path, "property '%s' twice", nm);
            char sub[512];
            snprintf(sub, sizeof sub, "%s.properties.%s", path, nm);
            jc_node *child = compile_node(c, p, sub, depth + 1);
            if (!child) return NULL;
            if (!(n->names[n->n_props] = strdup(nm))) return fail_at(c, path, "out of memory");
            n->name_len[n->n_props] = strlen(nm);
            n->props[n->n_props++] = child;
        }
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
        if (req) {
            if (!cJSON_IsArray(req)) return fail_at(c, path, "'required' must be an array of property names");
            const cJSON *r;
            cJSON_ArrayForEach(r, req) {
                if (!cJSON_IsString(r)) return fail_at(c, path, "'required' must be an array of property names");
                int k = -1;
                for (int i = 0; i < n->n_props; i++)
                    if (!strcmp(n->names[i], r->valuestring)) k = i;
                if (k < 0)
                    return fail_at(c, path, "required property '%s' is not among the properties (open objects with "
                                   "required keys are not supported)", r->valuestring);
                n->required |= (uint64_t)1 << k;
            }
        }
    } else if (!strcmp(t, "array")) {
        n = node_new(c, N_ARR);
        if (!n) return NULL;
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(sch, "items");
        if (it) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.items", path);
            if (!(n->items = compile_node(c, it, sub, depth + 1))) return NULL;
        }
        if (!get_count(c, sch, "minItems", path, &n->min_items) || !get_count(c, sch, "maxItems", path, &n->max_items))
            return NULL;
        if (n->max_items >= 0 && n->max_items < n->min_items) return fail_at(c, path, "maxItems below minItems");
    } else if (!strcmp(t, "string")) {
        n = node_new(c, N_STR);
        if (!n) return NULL;
        if (!get_count(c, sch, "minLength", path, &n->min_len) || !get_count(c, sch, "maxLength", path, &n->max_len))
            return NULL;
        if (n->max_len >= 0 && n->max_len < n->min_len) return fail_at(c, path, "maxLength below minLength");
    } else if (!strcmp(t, "number") || !strcmp(t, "integer")) {
        n = node_new(c, t[0] == 'n' ? N_NUM : N_INT);
    } else if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        n = node_new(c, N_LIT);
        if (!n) return NULL;
        cJSON *a = t[0] == 'b' ? cJSON_CreateTrue() : cJSON_CreateNull(), *b = t[0] == 'b' ? cJSON_CreateFalse() : NULL;
        bool ok = a && add_lit(c, n, a, path) && (!b || add_lit(c, n, b, path));
        cJSON_Delete(a);
        cJSON_Delete(b);
        if (!ok) return NULL;
    } else
        return fail_at(c, path, "type '%s' is not a JSON Schema type (object, array, string, number, integer, "
                       "boolean, null)", t);
    if (!n) return NULL;
    /* keywords of another type are refused: they would be silently ignored otherwise */
    static const struct { const char *key; int kind; } owner[] = {
        {"properties", N_OBJ}, {"required", N_OBJ}, {"items", N_ARR}, {"minItems", N_ARR}, {"maxItems", N_ARR},
        {"minLength", N_STR}, {"maxLength", N_STR}};
    for (size_t i = 0; i < sizeof owner / sizeof *owner; i++)
        if (cJSON_GetObjectItemCaseSensitive(sch, owner[i].key) && n->kind != owner[i].kind)
            return fail_at(c, path, "'%s' does not apply to type '%s'", owner[i].key, t);
    return set_minval(c, n, path) ? n : NULL;
}

bool mmc_jc_compile(const char *schema, size_t len, mmc_jc_schema **out, char *err, size_t n_err) {
    *out = NULL;
    if (n_err) err[0] = 0;
    compiler c = {.err = err, .n_err = n_err};
    if (!(c.s = calloc(1, sizeof *c.s))) { snprintf(err, n_err, "out of memory"); return false; }
    if (!schema) {
        c.s->root = node_new(&c, N_OBJ);
        if (c.s->root) {
            c.s->root->open = true;
            set_minval(&c, c.s->root, "");
        }
    } else {
        cJSON *j = cJSON_ParseWithLength(schema, len);
        if (!j) fail_at(&c, "", "the schema is not valid JSON");
        else {
            c.s->root = compile_node(&c, j, "schema", 0);
            if (c.s->root && c.s->root->kind != N_OBJ)
                fail_at(&c, "schema", "the top of the schema must be of type object");
            cJSON_Delete(j);
        }
    }
    if (c.failed || !c.s->root) {
        if (!c.failed) snprintf(err, n_err, "out of memory");
        mmc_jc_schema_free(c.s);
        return false;
    }
    *out = c.s;
    return true;
}

/* ------------------------------------------------------------------ the automaton */
mmc_jc_state *mmc_jc_start(const mmc_jc_schema *s) {
    mmc_jc_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->s = s;
    st->depth = 1;
    st->f[0] = (jc_frame){.node = s->root, .kind = F_VALUE};
    return st;
}

void mmc_jc_state_free(mmc_jc_state *st) { free(st); }

bool mmc_jc_done(const mmc_jc_state *st) { return st->depth == 0 && st->post == st->s->n_suffix; }

bool mmc_jc_wrap(mmc_jc_schema *s, const char *prefix, const char *suffix) {
    char *p = strdup(prefix ? prefix : ""), *q = strdup(suffix ? suffix : "");
    if (!p || !q || strlen(p) > 256 || strlen(q) > 256) { free(p); free(q); return false; }
    free(s->prefix);
    free(s->suffix);
    s->prefix = p;
    s->suffix = q;
    s->n_prefix = (int32_t)strlen(p);
    s->n_suffix = (int32_t)strlen(q);
    return true;
}

static bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

static bool push(mmc_jc_state *st, jc_frame f) {
    if (st->depth >= JC_MAX_DEPTH) return false;
    st->f[st->depth++] = f;
    return true;
}

static bool obj_more(const jc_node *n, uint64_t seen) {   /* may another property come? */
    if (!n || n->open) return true;
    uint64_t all = n->n_props >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n_props) - 1);
    return (seen & all) != all;
}

static bool obj_may_end(const jc_node *n, uint64_t seen) { return !n || n->open || (n->required & ~seen) == 0; }

static uint64_t key_candidates(const jc_node *n, uint64_t seen) {
    uint64_t all = n->n_props >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n_props) - 1);
    return all & ~seen;
}

/* start a value of node n (NULL: any) with byte b in frame slot f (already on the stack) */
static bool value_start(mmc_jc_state *st, jc_frame *f, uint8_t b);
static bool step(mmc_jc_state *st, uint8_t b);

static bool value_start(mmc_jc_state *st, jc_frame *f, uint8_t b) {
    const jc_node *n = f->node;
    int k = n ? n->kind : N_ANY;
    bool open_any = k == N_ANY;
    if (b == '{' && (open_any || k == N_OBJ)) {
        *f = (jc_frame){.node = open_any ? NULL : n, .kind = F_OBJ, .phase = 0};
        return true;
    }
    if (b == '[' && (open_any || k == N_ARR)) {
        *f = (jc_frame){.node = open_any ? NULL : n, .kind = F_ARR, .phase = 0};
        return true;
    }
    if (b == '"' && (open_any || k == N_STR)) {
        *f = (jc_frame){.node = open_any ? NULL : n, .kind = F_STR};
        return true;
    }
    if ((b == '-' || (b >= '0' && b <= '9')) && (open_any || k == N_NUM || k == N_INT)) {
        *f = (jc_frame){.node = NULL, .kind = F_NUM, .integer = k == N_INT};
        return step(st, b);
    }
    if (open_any && (b == 't' || b == 'f' || b == 'n')) {
        *f = (jc_frame){.node = &any_lit_node, .kind = F_LIT, .set = 7};
        return step(st, b);
    }
    if (k == N_LIT) {
        uint64_t all = n->n_lit >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->n_lit) - 1);
        *f = (jc_frame){.node = n, .kind = F_LIT, .set = all};
        return step(st, b);
    }
    return false;
}

/* the top frame finished: pop it; the parent moves on */
static void pop_done(mmc_jc_state *st) {
    jc_frame *f = &st->f[--st->depth];
    if (st->depth == 0) return;
    jc_frame *p = &st->f[st->depth - 1];
    if (p->kind == F_OBJ && p->phase == 2) {   /* a key ended */
        if (p->node && !p->node->open) {
            int k = -1;
            for (int i = 0; i < p->node->n_props; i++)
                if ((f->set >> i & 1) && p->node->name_len[i] == (size_t)f->pos) k = i;
            p->cur = k;
            p->set |= (uint64_t)1 << k;
        } else
            p->cur = -1;
        p->phase = 3;
    }
    /* objects and arrays were already set to "after a value" when the value was pushed */
}

static bool step(mmc_jc_state *st, uint8_t b) {
    if (st->depth == 0) return false;
    jc_frame *f = &st->f[st->depth - 1];
    const int kind = f->kind;
    bool ws = is_ws(b);
    switch (kind) {
    case F_VALUE:
        if (ws) break;
        return value_start(st, f, b);
    case F_OBJ: {
        const jc_node *n = f->node;
        if (ws) {
            if (f->phase == 2) return false;
            break;
        }
        if (f->phase == 0 || f->phase == 1) {   /* after '{' or ',' */
            if (b == '}' && f->phase == 0 && obj_may_end(n, f->set)) { pop_done(st); break; }
            if (b != '"' || !obj_more(n, f->set)) return false;
            f->phase = 2;
            jc_frame k = {.node = NULL, .kind = F_STR, .key = 1};
            if (n && !n->open) k.set = key_candidates(n, f->set), k.node = n;
            return push(st, k);
        }
        if (f->phase == 3) {   /* after a key */
            if (b != ':') return false;
            f->phase = 5;
            const jc_node *v = n && !n->open ? n->props[f->cur] : NULL;
            return push(st, (jc_frame){.node = v, .kind = F_VALUE});
        }
        if (f->phase == 5) {   /* after a value */
            if (b == ',' && obj_more(n, f->set)) { f->phase = 1; break; }
            if (b == '}' && obj_may_end(n, f->set)) { pop_done(st); break; }
            return false;
        }
        return false;
    }
    case F_ARR: {
        const jc_node *n = f->node;
        int64_t mx = n ? n->max_items : -1, mn = n ? n->min_items : 0;
        if (ws) break;
        if (f->phase == 0 && b == ']' && mn == 0) { pop_done(st); break; }
        if (f->phase == 2) {
            if (b == ',' && (mx < 0 || f->count < mx)) { f->phase = 1; break; }
            if (b == ']' && f->count >= mn) { pop_done(st); break; }
            return false;
        }
        if (mx >= 0 && f->count >= mx) return false;
        f->phase = 2;
        f->count++;
        if (!push(st, (jc_frame){.node = n ? n->items : NULL, .kind = F_VALUE})) return false;
        return step(st, b);
    }
    case F_STR: {
        if (f->key && f->node) {   /* a property name of a closed object: bytes of a candidate */
            const jc_node *n = f->node;
            if (b == '"') {
                bool any = false;
                for (int i = 0; i < n->n_props; i++) any |= (f->set >> i & 1) && n->name_len[i] == (size_t)f->pos;
                if (!any) return false;
                for (int i = 0; i < n->n_props; i++)
                    if (n->name_len[i] != (size_t)f->pos) f->set &= ~((uint64_t)1 << i);
                pop_done(st);
                break;
            }
            uint64_t keep = 0;
            for (int i = 0; i < n->n_props; i++)
                if ((f->set >> i & 1) && n->name_len[i] > (size_t)f->pos && (uint8_t)n->names[i][f->pos] == b)
                    keep |= (uint64_t)1 << i;
            if (!keep) return false;
            f->set = keep;
            f->pos++;
            break;
        }
        int64_t mx = f->node ? f->node->max_len : -1, mn = f->node ? f->node->min_len : 0;
        if (f->u8_need) {
            if (b < f->u8_lo || b > f->u8_hi) return false;
            f->u8_need--;
            f->u8_lo = 0x80;
            f->u8_hi = 0xBF;
            break;
        }
        if (f->esc == 1) {
            if (b == 'u') f->esc = 2;
            else if (strchr("\"\\/bfnrt", b) && b) f->esc = 0;
            else return false;
            break;
        }
        if (f->esc >= 2) {
            if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'))) return false;
            f->esc = f->esc == 5 ? 0 : f->esc + 1;
            break;
        }
        if (b == '"') {
            if (f->count < mn) return false;
            pop_done(st);
            break;
        }
        if (b < 0x20 || b == 0x7F) return false;   /* control characters must be escaped (DEL: kept out) */
        if (mx >= 0 && f->count >= mx) return false;
        if (b == '\\') { f->esc = 1; f->count++; break; }
        if (b < 0x80) { f->count++; break; }
        /* UTF-8: the lead byte sets how many continuation bytes follow and the first one's range */
        if (b >= 0xC2 && b <= 0xDF) f->u8_need = 1, f->u8_lo = 0x80, f->u8_hi = 0xBF;
        else if (b == 0xE0) f->u8_need = 2, f->u8_lo = 0xA0, f->u8_hi = 0xBF;
        else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) f->u8_need = 2, f->u8_lo = 0x80, f->u8_hi = 0xBF;
        else if (b == 0xED) f->u8_need = 2, f->u8_lo = 0x80, f->u8_hi = 0x9F;
        else if (b == 0xF0) f->u8_need = 3, f->u8_lo = 0x90, f->u8_hi = 0xBF;
        else if (b >= 0xF1 && b <= 0xF3) f->u8_need = 3, f->u8_lo = 0x80, f->u8_hi = 0xBF;
        else if (b == 0xF4) f->u8_need = 3, f->u8_lo = 0x80, f->u8_hi = 0x8F;
        else return false;
        f->count++;
        break;
    }
    case F_NUM: {
        /* phases: 0 start, 1 after '-', 2 a leading 0, 3 integer digits, 4 after '.', 5 fraction
         * digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits */
        bool digit = b >= '0' && b <= '9';
        switch (f->phase) {
        case 0:
            if (b == '-') { f->phase = 1; return true; }
            /* fall through */
        case 1:
            if (!digit) return false;
            f->phase = b == '0' ? 2 : 3;
            f->pos = 1;
            return true;
        case 3:
            if (digit) {
                if (f->pos >= JC_MAX_DIGITS) return false;
                f->pos++;
                return true;
            }
            /* fall through */
        case 2:
            if (!f->integer && b == '.') { f->phase = 4; f->pos = 0; return true; }
            if (!f->integer && (b == 'e' || b == 'E')) { f->phase = 6; f->pos = 0; return true; }
            break;   /* the number ended: b belongs to the parent */
        case 4:
        case 5:
            if (digit) {
                if (f->pos >= JC_MAX_DIGITS) return false;
                f->phase = 5;
                f->pos++;
                return true;
            }
            if (f->phase == 4) return false;
            if (b == 'e' || b == 'E') { f->phase = 6; f->pos = 0; return true; }
            break;
        case 6:
            if (b == '+' || b == '-') { f->phase = 7; return true; }
            /* fall through */
        case 7:
        case 8:
            if (digit) {
                if (f->pos >= 3) return false;
                f->phase = 8;
                f->pos++;
                return true;
            }
            if (f->phase != 8) return false;
            break;
        }
        pop_done(st);
        return step(st, b);
    }
    case F_LIT: {
        const jc_node *n = f->node;
        uint64_t keep = 0;
        bool complete = false;
        for (int i = 0; i < n->n_lit; i++) {
            if (!(f->set >> i & 1)) continue;
            if (n->lit_len[i] > (size_t)f->pos && (uint8_t)n->lit[i][f->pos] == b) keep |= (uint64_t)1 << i;
            if (n->lit_len[i] == (size_t)f->pos) complete = true;
        }
        if (keep) {
            f->set = keep;
            f->pos++;
            return true;
        }
        if (!complete) return false;
        pop_done(st);
        return step(st, b);
    }
    }
    /* whitespace between tokens, bounded (inside strings it is content) */
    if (ws && kind != F_STR) {
        if (++st->ws > JC_MAX_WS) return false;
    } else
        st->ws = 0;
    return true;
}

/* step, with the whitespace counter reset on any non-whitespace byte the frames consumed; the
 * prefix before the value and the suffix after it are literal */
static bool feed_byte(mmc_jc_state *st, uint8_t b) {
    if (st->pre < st->s->n_prefix) {
        if ((uint8_t)st->s->prefix[st->pre] != b) return false;
        st->pre++;
        return true;
    }
    if (st->depth == 0) {
        if (st->post >= st->s->n_suffix || (uint8_t)st->s->suffix[st->post] != b) return false;
        st->post++;
        return true;
    }
    if (!is_ws(b) || (st->depth > 0 && st->f[st->depth - 1].kind == F_STR)) st->ws = 0;
    return step(st, b);
}

static size_t state_size(int depth) { return offsetof(mmc_jc_state, f) + (size_t)depth * sizeof(jc_frame); }

bool mmc_jc_feed(mmc_jc_state *st, const uint8_t *b, size_t n) {
    mmc_jc_state tmp;
    memcpy(&tmp, st, state_size(st->depth));
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(&tmp, b[i])) return false;
    memcpy(st, &tmp, state_size(tmp.depth));
    return true;
}

/* ------------------------------------------------------------------ shortest completion */
typedef struct {
    char *buf;
    size_t cap, n;
} sink;

static void put(sink *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++, s->n++)
        if (s->n < s->cap) s->buf[s->n] = p[i];
}

static void put_prop(sink *s, const jc_node *n, int i, bool comma) {
    if (comma) put(s, ",", 1);
    put(s, "\"", 1);
    put(s, n->names[i], n->name_len[i]);
    put(s, "\":", 2);
    put(s, n->props[i]->minval, n->props[i]->minval_len);
}

/* close an object whose properties in seen are done: the missing required ones, then '}' */
static void close_obj_rest(sink *s, const jc_node *n, uint64_t seen, bool comma) {
    if (n && !n->open)
        for (int i = 0; i < n->n_props; i++)
            if ((n->required >> i & 1) && !(seen >> i & 1)) { put_prop(s, n, i, comma); comma = true; }
    put(s, "}", 1);
}

/* the bytes of the missing required properties and '}' after the properties in seen */
static size_t obj_rest_len(const jc_node *n, uint64_t seen) {
    sink z = {NULL, 0, 0};
    close_obj_rest(&z, n, seen, true);
    return z.n;
}

/* the property a closed-object key in progress completes to: the candidate after which the
 * object's completion (name rest, its smallest value, the missing required ones) is shortest */
static int key_choice(const jc_node *n, const jc_frame *k, uint64_t seen) {
    int best = -1;
    size_t bl = 0;
    for (int i = 0; i < n->n_props; i++) {
        if (!(k->set >> i & 1) || n->name_len[i] < (size_t)k->pos) continue;
        size_t l = n->name_len[i] - (size_t)k->pos + n->props[i]->minval_len + obj_rest_len(n, seen | (uint64_t)1 << i);
        if (best < 0 || l < bl) { best = i; bl = l; }
    }
    return best;
}

size_t mmc_jc_close(const mmc_jc_state *st, char *buf, size_t cap) {
    sink s = {buf, cap, 0};
    int chosen = -1;   /* a closed-object key's completion, for its object frame */
    if (st->pre < st->s->n_prefix) put(&s, st->s->prefix + st->pre, (size_t)(st->s->n_prefix - st->pre));
    for (int d = st->depth - 1; d >= 0; d--) {
        const jc_frame *f = &st->f[d];
        const jc_node *n = f->node;
        switch (f->kind) {
        case F_VALUE:
            if (n) put(&s, n->minval, n->minval_len);
            else put(&s, "0", 1);
            break;
        case F_STR:
            if (f->key && n) {
                chosen = key_choice(n, f, d > 0 ? st->f[d - 1].set : 0);
                if (chosen >= 0) put(&s, n->names[chosen] + f->pos, n->name_len[chosen] - (size_t)f->pos);
                put(&s, "\"", 1);
                break;
            }
            if (f->u8_need) {
                char c = (char)f->u8_lo;
                put(&s, &c, 1);
                for (int i = 1; i < f->u8_need; i++) put(&s, "\x80", 1);
            }
            if (f->esc == 1) put(&s, "n", 1);
            else if (f->esc >= 2) put(&s, "0000", (size_t)(6 - f->esc));
            for (int64_t i = f->count; n && i < n->min_len; i++) put(&s, "a", 1);
            put(&s, "\"", 1);
            break;
        case F_NUM:
            if (f->phase == 1 || f->phase == 4 || f->phase == 6 || f->phase == 7) put(&s, "0", 1);
            break;
        case F_LIT: {
            int best = -1;
            for (int i = 0; i < n->n_lit; i++)
                if ((f->set >> i & 1) && n->lit_len[i] >= (size_t)f->pos &&
                    (best < 0 || n->lit_len[i] < n->lit_len[best]))
                    best = i;
            if (best >= 0) put(&s, n->lit[best] + f->pos, n->lit_len[best] - (size_t)f->pos);
            break;
        }
        case F_OBJ:
            if (f->phase == 0) close_obj_rest(&s, n, f->set, false);
            else if (f->phase == 5) close_obj_rest(&s, n, f->set, true);
            else if (f->phase == 1) {   /* after ',': one property must come */
                uint64_t missing = n && !n->open ? n->required & ~f->set : 0;
                if (missing) close_obj_rest(&s, n, f->set, false);
                else if (!n || n->open) put(&s, "\"\":0}", 5);
                else {
                    int best = -1;   /* none missing: the shortest optional one */
                    for (int i = 0; i < n->n_props; i++)
                        if (!(f->set >> i & 1) &&
                            (best < 0 || n->name_len[i] + n->props[i]->minval_len <
                                         n->name_len[best] + n->props[best]->minval_len))
                            best = i;
                    put_prop(&s, n, best, false);
                    put(&s, "}", 1);
                }
            } else if (f->phase == 2) {   /* the key frame above has been closed */
                put(&s, ":", 1);
                if (n && !n->open && chosen >= 0) {
                    put(&s, n->props[chosen]->minval, n->props[chosen]->minval_len);
                    close_obj_rest(&s, n, f->set | (uint64_t)1 << chosen, true);
                } else {
                    put(&s, "0", 1);
                    close_obj_rest(&s, n, f->set, true);
                }
            } else if (f->phase == 3) {
                put(&s, ":", 1);
                if (n && !n->open) put(&s, n->props[f->cur]->minval, n->props[f->cur]->minval_len);
                else put(&s, "0", 1);
                close_obj_rest(&s, n, f->set, true);
            }
            break;
        case F_ARR: {
            int64_t mn = n ? n->min_items : 0, have = f->count;
            bool comma = f->phase == 2;
            if (f->phase == 1) {   /* after ',': one item must come */
                put(&s, n && n->items ? n->items->minval : "0", n && n->items ? n->items->minval_len : 1);
                have++;
                comma = true;
            }
            for (int64_t i = have; i < mn; i++) {
                if (comma || i > have) put(&s, ",", 1);
                put(&s, n && n->items ? n->items->minval : "0", n && n->items ? n->items->minval_len : 1);
                comma = true;
            }
            put(&s, "]", 1);
            break;
        }
        }
    }
    if (st->s->n_suffix > st->post) put(&s, st->s->suffix + st->post, (size_t)(st->s->n_suffix - st->post));
    if (s.n < cap) buf[s.n] = 0;
    else if (cap) buf[cap - 1] = 0;
    return s.n;
}

/* ------------------------------------------------------------------ vocabulary and mask */
mmc_status mmc_jc_vocab_build(const mmc_tokenizer *tok, mmc_jc_vocab **out) {
    *out = NULL;
    mmc_jc_vocab *v = calloc(1, sizeof *v);
    int32_t n = mmc_tokenizer_vocab_size(tok);
    if (!v || n <= 0) { free(v); return mmc_error(MMC_ERR_OOM, "out of memory building the JSON token table"); }
    v->n = n;
    v->bytes = calloc((size_t)n, sizeof *v->bytes);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->special = calloc((size_t)n, 1);
    if (!v->bytes || !v->len || !v->special) goto oom;
    uint8_t tmp[256];
    for (int32_t id = 0; id < n; id++) {
        int64_t k = mmc_tokenizer_token_bytes(tok, id, tmp, sizeof tmp);
        v->special[id] = mmc_tokenizer_is_special(tok, id);
        if (k <= 0 || k > (int64_t)sizeof tmp) continue;   /* no such id, or too long to matter */
        if (!(v->bytes[id] = malloc((size_t)k))) goto oom;
        memcpy(v->bytes[id], tmp, (size_t)k);
        v->len[id] = (int32_t)k;
    }
    if (!(v->by_first = malloc((size_t)n * sizeof *v->by_first))) goto oom;
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0 && !v->special[id]) v->first[v->bytes[id][0] + 1]++;
    for (int b = 0; b < 256; b++) v->first[b + 1] += v->first[b];
    int64_t fill[256];
    memcpy(fill, v->first, sizeof fill);
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0 && !v->special[id]) v->by_first[fill[v->bytes[id][0]]++] = id;
    int64_t m = v->first[256], total = 0;
    for (int64_t k = 0; k < m; k++) total += v->len[v->by_first[k]];
    v->blob = malloc((size_t)(total ? total : 1));
    v->off = malloc((size_t)(m + 1) * sizeof *v->off);
    v->nchar = malloc((size_t)(m ? m : 1) * sizeof *v->nchar);
    if (!v->blob || !v->off || !v->nchar) goto oom;
    v->off[0] = 0;
    for (int64_t k = 0; k < m; k++) {
        int32_t id = v->by_first[k];
        memcpy(v->blob + v->off[k], v->bytes[id], (size_t)v->len[id]);
        v->off[k + 1] = v->off[k] + v->len[id];
        v->nchar[k] = plain_chars(v->bytes[id], v->len[id]);
    }
    *out = v;
    return MMC_OK;
oom:
    mmc_jc_vocab_free(v);
    return mmc_error(MMC_ERR_OOM, "out of memory building the JSON token table");
}

void mmc_jc_vocab_free(mmc_jc_vocab *v) {
    if (!v) return;
    for (int64_t i = 0; i < v->n && v->bytes; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->special);
    free(v->by_first);
    free(v->blob);
    free(v->off);
    free(v->nchar);
    free(v);
}

bool mmc_jc_feed_token(mmc_jc_state *st, const mmc_jc_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n || v->special[id] || v->len[id] <= 0) return false;
    return mmc_jc_feed(st, v->bytes[id], (size_t)v->len[id]);
}

void mmc_jc_mask(const mmc_jc_state *st, const mmc_jc_vocab *v, int64_t budget, const int32_t *eos, int n_eos,
                 float *logits, int64_t V) {
    bool done = mmc_jc_done(st);
    char close[1024];
    size_t need = done ? 0 : mmc_jc_close(st, close, sizeof close);
    /* tight: the completion may not fit the tokens left after this one unless checked per token */
    bool tight = !done && (int64_t)need + 256 >= budget;
    int64_t allowed = 0;
    /* everything off, then the tokens that fit back on (their logits kept aside first) */
    float *keep = malloc((size_t)V * sizeof *keep);
    if (!keep) return;   /* out of memory: unconstrained rather than nothing */
    memcpy(keep, logits, (size_t)V * sizeof *keep);
    for (int64_t id = 0; id < V; id++) logits[id] = -INFINITY;
    mmc_jc_state head, tmp;
    /* inside a string value, plain tokens need no simulation: only the length limit applies */
    const jc_frame *top = !done && st->depth > 0 && st->pre == st->s->n_prefix ? &st->f[st->depth - 1] : NULL;
    const bool in_str = top && top->kind == F_STR && !(top->key && top->node) && !top->esc && !top->u8_need && !tight;
    const int64_t str_room = in_str && top->node && top->node->max_len >= 0 ? top->node->max_len - top->count : INT64_MAX;
    for (int b = 0; b < 256 && !done; b++) {
        if (v->first[b] == v->first[b + 1]) continue;
        memcpy(&head, st, state_size(st->depth));
        if (!feed_byte(&head, (uint8_t)b)) continue;   /* no token starting with b fits */
        for (int64_t k = v->first[b]; k < v->first[b + 1]; k++) {
            int32_t id = v->by_first[k];
            if (id >= V) continue;
            if (in_str && v->nchar[k] >= 0) {
                if (v->nchar[k] <= str_room) {
                    logits[id] = keep[id];
                    allowed++;
                }
                continue;
            }
            memcpy(&tmp, &head, state_size(head.depth));
            bool ok = true;
            const uint8_t *tb = v->blob + v->off[k];
            const int32_t tl = (int32_t)(v->off[k + 1] - v->off[k]);
            for (int32_t i = 1; i < tl && ok; i++) ok = feed_byte(&tmp, tb[i]);
            if (ok && tight && !mmc_jc_done(&tmp)) {
                char c2[1024];
                ok = (int64_t)mmc_jc_close(&tmp, c2, sizeof c2) <= budget - 1;
            }
            if (ok) {
                logits[id] = keep[id];
                allowed++;
            }
        }
    }
    /* eos only once the value is complete (or, should nothing else fit, to end at all) */
    for (int k = 0; k < n_eos; k++)
        if (eos[k] >= 0 && eos[k] < V && (done || allowed == 0)) logits[eos[k]] = keep[eos[k]];
    free(keep);
}
