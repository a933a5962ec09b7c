/* value.c — the data model of the Jinja chat-template engine: the bounded arena, strings,
 * lists, ordered dicts, and Python's view of them: str() and repr() as Python prints them
 * (float repr is the shortest round-trip form, 1e+16 / 1e-05 past the fixed range),
 * truthiness, ==, ordering with Python's TypeError, and json.dumps as transformers' tojson
 * calls it (ensure_ascii=False unless asked, separators, indent, sort_keys). */
#include "tpl_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ arena */
struct tpl_chunk { tpl_chunk *next; size_t size, used; _Alignas(16) unsigned char data[]; };

void *tpl_alloc(tpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    tpl_chunk *h = a->head;
    if (!h || h->used + n > h->size) {
        size_t sz = n > 64 * 1024 ? n : 64 * 1024;
        if (a->limit && a->used + sz > a->limit) {
            if (a->err) snprintf(a->err, a->err_cap, "the template needs more than %zu MiB of memory (limit)", a->limit >> 20);
            longjmp(*a->jb, 1);
        }
        h = malloc(sizeof *h + sz);
        if (!h) {
            if (a->err) snprintf(a->err, a->err_cap, "out of memory");
            longjmp(*a->jb, 1);
        }
        h->next = a->head;
        h->size = sz;
        h->used = 0;
        a->head = h;
        a->used += sz;
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    for (tpl_chunk *h = a->head, *nx; h; h = nx) { nx = h->next; free(h); }
    a->head = NULL;
    a->used = 0;
}

tstr *tpl_str(tpl_arena *a, const char *p, size_t n) {
    tstr *s = tpl_alloc(a, sizeof *s + n + 1);
    s->n = n;
    if (n) memcpy(s->p, p, n);
    return s;
}

_Noreturn void tpl_fail(tpl_ctx *c, const char *fmt, ...) {
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, sizeof c->err, "chat template error at line %d, column %d: %s", c->line, c->col, msg);
    longjmp(c->jb, 1);
}

val tpl_undef_msg(tpl_ctx *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (n >= (int)sizeof msg) n = sizeof msg - 1;
    return v_undef(tpl_str(&c->a, msg, (size_t)n));
}
_Noreturn void tpl_undef_fail(tpl_ctx *c, val u) { tpl_fail(c, "%s", u.s ? u.s->p : "value is undefined"); }

/* ------------------------------------------------------------------ builder */
void sb_put(sbuf *b, const char *p, size_t n) {
    if (b->c->max_out && b->n + n > b->c->max_out)   /* every string built, not only the output */
        tpl_fail(b->c, "the rendered text exceeds %zu bytes (limit)", b->c->max_out);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = tpl_alloc(&b->c->a, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}
tstr *sb_take(sbuf *b) { return tpl_str(&b->c->a, b->p ? b->p : "", b->n); }

/* ------------------------------------------------------------------ UTF-8 */
size_t tpl_u8next(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    size_t j = i + 1;
    while (j < n && j < i + l && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
    return j;
}
int64_t tpl_u8len(const char *s, size_t n) {
    int64_t k = 0;
    for (size_t i = 0; i < n; i = tpl_u8next(s, n, i)) k++;
    return k;
}
uint32_t tpl_u8dec(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    size_t e = tpl_u8next(s, n, i);
    if (c < 0x80 || e - i == 1) return c;
    uint32_t v = c & (e - i == 2 ? 0x1F : e - i == 3 ? 0x0F : 0x07);
    for (size_t j = i + 1; j < e; j++) v = v << 6 | ((unsigned char)s[j] & 0x3F);
    return v;
}

/* ------------------------------------------------------------------ printing */
const char *tpl_type_name(val v) {
    switch (v.t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return v.l->gen ? "generator" : "list";
    case V_TUPLE: return "tuple";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_LOOP: return "LoopContext";
    default: return "builtin_function_or_method";
    }
}

void tpl_float_repr(double f, char out[40]) {
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f < 0 ? "-inf" : "inf"); return; }
    char buf[48];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]xx */
    char dig[24];
    int nd = 0, i = 0;
    bool neg = buf[0] == '-';
    if (neg) i++;
    for (; buf[i] && buf[i] != 'e'; i++)
        if (buf[i] != '.') dig[nd++] = buf[i];
    int ex = atoi(buf + i + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    char *o = out;
    if (neg) *o++ = '-';
    if (ex >= -4 && ex < 16) {
        if (ex >= 0) {
            for (int k = 0; k <= ex; k++) *o++ = k < nd ? dig[k] : '0';
            *o++ = '.';
            if (nd > ex + 1) for (int k = ex + 1; k < nd; k++) *o++ = dig[k];
            else *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int k = 0; k < -ex - 1; k++) *o++ = '0';
            for (int k = 0; k < nd; k++) *o++ = dig[k];
        }
        *o = 0;
    } else {
        *o++ = dig[0];
        if (nd > 1) { *o++ = '.'; for (int k = 1; k < nd; k++) *o++ = dig[k]; }
        sprintf(o, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

static void write_scalar(sbuf *b, val v) {
    char t[48];
    switch (v.t) {
    case V_NONE: sb_cstr(b, "None"); break;
    case V_BOOL: sb_cstr(b, v.b ? "True" : "False"); break;
    case V_INT: snprintf(t, sizeof t, "%lld", (long long)v.i); sb_cstr(b, t); break;
    case V_FLOAT: tpl_float_repr(v.f, t); sb_cstr(b, t); break;
    default: break;
    }
}

static void repr_str(sbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        size_t e = tpl_u8next(s, n, i);
        uint32_t c = tpl_u8dec(s, n, i);
        char t[16];
        if (c == (uint32_t)q || c == '\\') { t[0] = '\\'; t[1] = (char)c; sb_put(b, t, 2); }
        else if (c == '\n') sb_cstr(b, "\\n");
        else if (c == '\r') sb_cstr(b, "\\r");
        else if (c == '\t') sb_cstr(b, "\\t");
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) { snprintf(t, sizeof t, "\\x%02x", c); sb_cstr(b, t); }
        else if (c == 0x2028 || c == 0x2029 || (c >= 0x200b && c <= 0x200f) || c == 0xfeff) { snprintf(t, sizeof t, "\\u%04x", c); sb_cstr(b, t); }
        else sb_put(b, s + i, e - i);
        i = e;
    }
    sb_put(b, &q, 1);
}

_Thread_local tpl_ctx *tpl_current;

/* Python's repr: a namespace met again inside itself prints as {...} (Py_ReprEnter) */
typedef struct repr_seen { const tdict *d; const struct repr_seen *up; int depth; } repr_seen;
static void write_repr(sbuf *b, val v, const repr_seen *seen);
void tpl_write_repr(sbuf *b, val v) { write_repr(b, v, NULL); }

static void write_repr(sbuf *b, val v, const repr_seen *seen) {
    int depth = seen ? seen->depth + 1 : 0;
    if (depth > 500) tpl_fail(b->c, "maximum recursion depth exceeded while getting the repr of an object");
    repr_seen here = {NULL, seen, depth};
    switch (v.t) {
    case V_STR: repr_str(b, v.s->p, v.s->n); break;
    case V_UNDEF: sb_cstr(b, "Undefined"); break;   /* repr(Undefined); str() of it is "" */
    case V_LIST: case V_TUPLE:
        if (v.l->gen) { sb_cstr(b, "<generator object>"); break; }
        sb_cstr(b, v.t == V_LIST ? "[" : "(");
        for (int64_t i = 0; i < v.l->n; i++) { if (i) sb_cstr(b, ", "); write_repr(b, v.l->v[i], &here); }
        sb_cstr(b, v.t == V_LIST ? "]" : v.l->n == 1 ? ",)" : ")");
        break;
    case V_DICT: case V_NS:
        if (v.t == V_NS) sb_cstr(b, "<Namespace ");
        for (const repr_seen *r = seen; r; r = r->up)
            if (r->d == v.d) { sb_cstr(b, v.t == V_NS ? "{...}>" : "{...}"); return; }
        here.d = v.d;
        sb_cstr(b, "{");
        for (int64_t i = 0; i < v.d->n; i++) {
            if (i) sb_cstr(b, ", ");
            write_repr(b, v.d->k[i], &here);
            sb_cstr(b, ": ");
            write_repr(b, v.d->v[i], &here);
        }
        sb_cstr(b, "}");
        if (v.t == V_NS) sb_cstr(b, ">");
        break;
    case V_MACRO:
        if (v.m->def->kind == S_CALLBLOCK) sb_cstr(b, "<Macro anonymous>");
        else { sb_cstr(b, "<Macro "); repr_str(b, v.m->def->name, strlen(v.m->def->name)); sb_cstr(b, ">"); }
        break;
    case V_LOOP: sb_cstr(b, "<LoopContext>"); break;
    case V_FUNC: sb_cstr(b, "<built-in function>"); break;
    default: write_scalar(b, v);
    }
}

void tpl_write_str(sbuf *b, val v) {
    if (v.t == V_STR) sb_put(b, v.s->p, v.s->n);
    else if (v.t != V_UNDEF) tpl_write_repr(b, v);
}

tstr *tpl_to_str(tpl_ctx *c, val v) {
    if (v.t == V_STR) return v.s;
    sbuf b = {.c = c};
    tpl_write_str(&b, v);
    return sb_take(&b);
}

/* json.dumps */
static void json_str(sbuf *b, const char *s, size_t n, bool ascii) {
    sb_cstr(b, "\"");
    for (size_t i = 0; i < n;) {
        size_t e = tpl_u8next(s, n, i);
        uint32_t c = tpl_u8dec(s, n, i);
        char t[16];
        switch (c) {
        case '"': sb_cstr(b, "\\\""); break;
        case '\\': sb_cstr(b, "\\\\"); break;
        case '\n': sb_cstr(b, "\\n"); break;
        case '\r': sb_cstr(b, "\\r"); break;
        case '\t': sb_cstr(b, "\\t"); break;
        case '\b': sb_cstr(b, "\\b"); break;
        case '\f': sb_cstr(b, "\\f"); break;
        default:
            if (c < 0x20) { snprintf(t, sizeof t, "\\u%04x", c); sb_cstr(b, t); }
            else if (ascii && c >= 0x7f) {
                if (c >= 0x10000) {
                    uint32_t u = c - 0x10000;
                    snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
                } else snprintf(t, sizeof t, "\\u%04x", c);
                sb_cstr(b, t);
            } else sb_put(b, s + i, e - i);
        }
        i = e;
    }
    sb_cstr(b, "\"");
}

static void json_nl(sbuf *b, const char *indent, int level) {
    sb_cstr(b, "\n");
    for (int i = 0; i < level; i++) sb_cstr(b, indent);
}

static void json_key(sbuf *b, val k, bool ascii) {
    char t[48];
    switch (k.t) {
    case V_STR: json_str(b, k.s->p, k.s->n, ascii); return;
    case V_BOOL: sb_cstr(b, k.b ? "\"true\"" : "\"false\""); return;
    case V_NONE: sb_cstr(b, "\"null\""); return;
    case V_INT: snprintf(t, sizeof t, "\"%lld\"", (long long)k.i); sb_cstr(b, t); return;
    case V_FLOAT: t[0] = '"'; tpl_float_repr(k.f, t + 1); strcat(t, "\""); sb_cstr(b, t); return;
    default: tpl_fail(b->c, "keys must be str, int, float, bool or None, not %s", tpl_type_name(k));
    }
}

/* stable merge sort of index permutation by string keys (sort_keys) */
static int cmp_keys(tpl_ctx *c, val a, val b) { return tpl_cmp(c, a, b, "<"); }
static void sort_idx(tpl_ctx *c, tdict *d, int64_t *ix, int64_t *tmp, int64_t n) {
    if (n < 2) return;
    int64_t h = n / 2;
    sort_idx(c, d, ix, tmp, h);
    sort_idx(c, d, ix + h, tmp, n - h);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_keys(c, d->k[ix[j]], d->k[ix[i]]) < 0 ? ix[j++] : ix[i++];
    while (i < h) tmp[k++] = ix[i++];
    while (j < n) tmp[k++] = ix[j++];
    memcpy(ix, tmp, (size_t)n * sizeof *ix);
}

void tpl_write_json(sbuf *b, val v, const char *indent, const char *item_sep, const char *key_sep,
                    bool sort_keys, bool ascii, int level) {
    char t[48];
    if (level > 500) tpl_fail(b->c, "maximum recursion depth exceeded while encoding a JSON object");
    switch (v.t) {
    case V_NONE: sb_cstr(b, "null"); return;
    case V_BOOL: sb_cstr(b, v.b ? "true" : "false"); return;
    case V_INT: snprintf(t, sizeof t, "%lld", (long long)v.i); sb_cstr(b, t); return;
    case V_FLOAT:
        if (isnan(v.f)) sb_cstr(b, "NaN");
        else if (isinf(v.f)) sb_cstr(b, v.f < 0 ? "-Infinity" : "Infinity");
        else { tpl_float_repr(v.f, t); sb_cstr(b, t); }
        return;
    case V_STR: json_str(b, v.s->p, v.s->n, ascii); return;
    case V_LIST: case V_TUPLE:
        if (v.l->gen) tpl_fail(b->c, "Object of type generator is not JSON serializable");
        if (!v.l->n) { sb_cstr(b, "[]"); return; }
        sb_cstr(b, "[");
        for (int64_t i = 0; i < v.l->n; i++) {
            if (i) sb_cstr(b, item_sep);
            if (indent) json_nl(b, indent, level + 1);
            tpl_write_json(b, v.l->v[i], indent, item_sep, key_sep, sort_keys, ascii, level + 1);
        }
        if (indent) json_nl(b, indent, level);
        sb_cstr(b, "]");
        return;
    case V_DICT: {
        if (!v.d->n) { sb_cstr(b, "{}"); return; }
        int64_t *ix = tpl_alloc(&b->c->a, (size_t)v.d->n * 2 * sizeof *ix);
        for (int64_t i = 0; i < v.d->n; i++) ix[i] = i;
        if (sort_keys) sort_idx(b->c, v.d, ix, ix + v.d->n, v.d->n);
        sb_cstr(b, "{");
        for (int64_t i = 0; i < v.d->n; i++) {
            if (i) sb_cstr(b, item_sep);
            if (indent) json_nl(b, indent, level + 1);
            json_key(b, v.d->k[ix[i]], ascii);
            sb_cstr(b, key_sep);
            tpl_write_json(b, v.d->v[ix[i]], indent, item_sep, key_sep, sort_keys, ascii, level + 1);
        }
        if (indent) json_nl(b, indent, level);
        sb_cstr(b, "}");
        return;
    }
    default:
        tpl_fail(b->c, "Object of type %s is not JSON serializable", tpl_type_name(v));
    }
}

/* ------------------------------------------------------------------ semantics */
bool tpl_truthy(val v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s->n > 0;
    case V_LIST: case V_TUPLE: return v.l->gen || v.l->n > 0;
    case V_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(val v) { return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT; }
static double num_f(val v) { return v.t == V_FLOAT ? v.f : v.t == V_INT ? (double)v.i : v.b; }

static bool eq_depth(val a, val b, int depth);
bool tpl_eq(val a, val b) { return eq_depth(a, b, 0); }
static bool eq_depth(val a, val b, int depth) {
    if (depth > 500 && tpl_current) tpl_fail(tpl_current, "maximum recursion depth exceeded in comparison");
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return (a.t == V_INT ? a.i : a.b) == (b.t == V_INT ? b.i : b.b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    case V_LIST: case V_TUPLE:
        if (a.l->gen || b.l->gen) return a.l == b.l;
        if (a.l->n != b.l->n) return false;
        for (int64_t i = 0; i < a.l->n; i++) if (!eq_depth(a.l->v[i], b.l->v[i], depth + 1)) return false;
        return true;
    case V_DICT:
        if (a.d->n != b.d->n) return false;
        for (int64_t i = 0; i < a.d->n; i++) {
            val *o = tpl_dict_get(b.d, a.d->k[i]);
            if (!o || !eq_depth(a.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case V_NS: return a.d == b.d;
    case V_MACRO: return a.m == b.m;
    case V_FUNC: return a.fn == b.fn;
    default: return a.l == b.l;
    }
}

int tpl_cmp(tpl_ctx *c, val a, val b, const char *op) {
    if (a.t == V_UNDEF) tpl_undef_fail(c, a);
    if (b.t == V_UNDEF) tpl_undef_fail(c, b);
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) {
            int64_t x = a.t == V_INT ? a.i : a.b, y = b.t == V_INT ? b.i : b.b;
            return (x > y) - (x < y);
        }
        double x = num_f(a), y = num_f(b);
        return (x > y) - (x < y);
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.s->n < b.s->n ? a.s->n : b.s->n;
        int r = memcmp(a.s->p, b.s->p, n);
        return r ? r : (a.s->n > b.s->n) - (a.s->n < b.s->n);
    }
    if ((a.t == V_LIST || a.t == V_TUPLE) && a.t == b.t) {
        for (int64_t i = 0; i < a.l->n && i < b.l->n; i++)
            if (!tpl_eq(a.l->v[i], b.l->v[i])) return tpl_cmp(c, a.l->v[i], b.l->v[i], op);
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    tpl_fail(c, "'%s' not supported between instances of '%s' and '%s'", op, tpl_type_name(a), tpl_type_name(b));
}

tlist *tpl_list_new(tpl_ctx *c, int64_t cap) {
    tlist *l = tpl_alloc(&c->a, sizeof *l);
    if (cap > 0) { l->v = tpl_alloc(&c->a, (size_t)cap * sizeof *l->v); l->cap = cap; }
    return l;
}
void tpl_list_push(tpl_ctx *c, tlist *l, val v) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 4;
        val *nv = tpl_alloc(&c->a, (size_t)cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}
tdict *tpl_dict_new(tpl_ctx *c) { return tpl_alloc(&c->a, sizeof(tdict)); }

static bool key_eq(val a, val b) {
    if (a.t == V_STR && b.t == V_STR) return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    if (a.t == V_STR || b.t == V_STR) return false;
    return tpl_eq(a, b);
}
val *tpl_dict_get(tdict *d, val k) {
    for (int64_t i = 0; i < d->n; i++) if (key_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}
val *tpl_dict_gets(tdict *d, const char *k) {
    size_t n = strlen(k);
    for (int64_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && d->k[i].s->n == n && !memcmp(d->k[i].s->p, k, n)) return &d->v[i];
    return NULL;
}
void tpl_dict_set(tpl_ctx *c, tdict *d, val k, val v) {
    val *o = tpl_dict_get(d, k);
    if (o) { *o = v; return; }
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 4;
        val *nk = tpl_alloc(&c->a, (size_t)cap * sizeof *nk), *nv = tpl_alloc(&c->a, (size_t)cap * sizeof *nv);
        if (d->n) { memcpy(nk, d->k, (size_t)d->n * sizeof *nk); memcpy(nv, d->v, (size_t)d->n * sizeof *nv); }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
