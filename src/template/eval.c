/* eval.c — the evaluator of the Jinja chat-template engine: statements, expressions, the
 * builtin filters, tests, globals and the str/dict/list methods templates call.
 *
 * Mirrors jinja2 3.1 (runtime.py, filters.py, tests.py, sandbox.py) under transformers'
 * ImmutableSandboxedEnvironment: scoping (a for-loop iteration, a macro call and a `with`
 * open a scope; `if` does not; a `set` inside a loop is not seen after it, hence
 * namespace()), the Undefined type (prints empty, iterates empty, fails on attribute access,
 * arithmetic or calls with jinja2's "'x' is undefined" messages), the sandbox's refusal of
 * mutating methods (list.append, dict.update ...), MAX_RANGE, and Python's arithmetic
 * (floor division and modulo signs, / always float, int overflow refused rather than
 * promoted to a bignum). Every loop, call and output is bounded by mmc_template_limits. */
#include "tpl_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

struct frame { frame *parent; tdict vars; };
struct tloop {
    tlist *items;
    val last_changed;   /* loop.changed(): the previous call's arguments (V_UNDEF: none yet) */
    int64_t i;
    int depth;
    node *fornode;
    frame *outer;
};

enum { F_RANGE = 1, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT, F_LOOPCALL };

typedef struct {
    val *pos;
    int npos;
    const char **kwn;
    val *kwv;
    int nkw;
} args_t;

static val eval(tpl_ctx *c, frame *f, node *n);
static int exec(tpl_ctx *c, frame *f, node *body, sbuf *out);

static void step(tpl_ctx *c, node *n) {
    c->line = n->line;
    c->col = n->col;
    if (++c->steps > c->max_steps) tpl_fail(c, "the template ran more than %lld steps (limit)", (long long)c->max_steps);
}

static val mkstr(tpl_ctx *c, const char *p, size_t n) { return v_str(tpl_str(&c->a, p, n)); }
static val cstr(tpl_ctx *c, const char *s) { return mkstr(c, s, strlen(s)); }
static bool str_is(val v, const char *s) { return v.t == V_STR && v.s->n == strlen(s) && !memcmp(v.s->p, s, v.s->n); }

/* ------------------------------------------------------------------ scopes */
static val *lookup(frame *f, const char *name) {
    for (; f; f = f->parent) {
        val *v = tpl_dict_gets(&f->vars, name);
        if (v) return v;
    }
    return NULL;
}
static void assign(tpl_ctx *c, frame *f, const char *name, val v) { tpl_dict_set(c, &f->vars, cstr(c, name), v); }
static frame *new_frame(tpl_ctx *c, frame *parent) {
    frame *f = tpl_alloc(&c->a, sizeof *f);
    f->parent = parent;
    return f;
}

/* ------------------------------------------------------------------ arguments */
static val arg(args_t *a, int idx, const char *name, val dflt) {
    for (int i = 0; i < a->nkw; i++) if (!strcmp(a->kwn[i], name)) return a->kwv[i];
    if (idx >= 0 && idx < a->npos) return a->pos[idx];
    return dflt;
}
static void eval_args(tpl_ctx *c, frame *f, node *n, args_t *a, val *first) {
    int extra = first ? 1 : 0;
    a->npos = n->args.n + extra;
    a->pos = tpl_alloc(&c->a, (size_t)(a->npos + 1) * sizeof *a->pos);
    if (first) a->pos[0] = *first;
    for (int i = 0; i < n->args.n; i++) a->pos[i + extra] = eval(c, f, n->args.v[i]);
    a->nkw = n->kwargs.n;
    a->kwn = n->kwn;
    a->kwv = tpl_alloc(&c->a, (size_t)(a->nkw + 1) * sizeof *a->kwv);
    for (int i = 0; i < a->nkw; i++) a->kwv[i] = eval(c, f, n->kwargs.v[i]);
}
static int64_t want_int(tpl_ctx *c, val v, const char *what) {
    if (v.t == V_INT) return v.i;
    if (v.t == V_BOOL) return v.b;
    if (v.t == V_UNDEF) tpl_undef_fail(c, v);
    tpl_fail(c, "%s must be an integer, not %s", what, tpl_type_name(v));
}
static tstr *want_str(tpl_ctx *c, val v, const char *what) {
    if (v.t == V_STR) return v.s;
    if (v.t == V_UNDEF) tpl_undef_fail(c, v);
    tpl_fail(c, "%s must be a string, not %s", what, tpl_type_name(v));
}

/* ------------------------------------------------------------------ sequences */
static val str_chars(tpl_ctx *c, tstr *s) {
    tlist *l = tpl_list_new(c, (int64_t)s->n);
    for (size_t i = 0; i < s->n;) { size_t e = tpl_u8next(s->p, s->n, i); tpl_list_push(c, l, mkstr(c, s->p + i, e - i)); i = e; }
    val v = {.t = V_LIST};
    v.l = l;
    return v;
}
static val mklist(tlist *l, int t) { val v = {.t = (uint8_t)t}; v.l = l; return v; }
static val mkgen(tlist *l) { l->gen = true; return mklist(l, V_LIST); }

/* items of an iterable as a list (dict: keys; str: characters; Undefined: none) */
static tlist *iter_list(tpl_ctx *c, val v) {
    switch (v.t) {
    case V_LIST: case V_TUPLE: return v.l;
    case V_UNDEF: return tpl_list_new(c, 0);
    case V_STR: return str_chars(c, v.s).l;
    case V_DICT: { tlist *l = tpl_list_new(c, v.d->n); for (int64_t i = 0; i < v.d->n; i++) tpl_list_push(c, l, v.d->k[i]); return l; }
    default: tpl_fail(c, "'%s' object is not iterable", tpl_type_name(v));
    }
}
static int64_t length(tpl_ctx *c, val v) {
    switch (v.t) {
    case V_STR: return tpl_u8len(v.s->p, v.s->n);
    case V_LIST: case V_TUPLE: if (v.l->gen) break; return v.l->n;
    case V_DICT: case V_NS: return v.d->n;
    case V_UNDEF: return 0;
    default: break;
    }
    tpl_fail(c, "object of type '%s' has no len()", tpl_type_name(v));
}

static int64_t slice_idx(tpl_ctx *c, val v, int64_t dflt) {
    if (v.t == V_NONE || v.t == V_UNDEF) return dflt;
    return want_int(c, v, "slice indices");
}
/* Python slice semantics on code points / items */
static val do_slice(tpl_ctx *c, val obj, val vs, val ve, val vstep) {
    int64_t step = slice_idx(c, vstep, 1);
    if (!step) tpl_fail(c, "slice step cannot be zero");
    bool isstr = obj.t == V_STR;
    tlist *items = isstr ? str_chars(c, obj.s).l : (obj.t == V_LIST || obj.t == V_TUPLE) && !obj.l->gen ? obj.l : NULL;
    if (!items) {   /* jinja2 compiles a slice to a plain Python subscript: a TypeError */
        if (obj.t == V_UNDEF) tpl_undef_fail(c, obj);
        tpl_fail(c, "'%s' object is not subscriptable", tpl_type_name(obj));
    }
    int64_t n = items->n;
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t s = slice_idx(c, vs, step < 0 ? hi : lo), e = slice_idx(c, ve, step < 0 ? lo : hi);
    if (vs.t != V_NONE && vs.t != V_UNDEF) { if (s < 0) { s += n; if (s < lo) s = lo; } else if (s > hi) s = hi; }
    if (ve.t != V_NONE && ve.t != V_UNDEF) { if (e < 0) { e += n; if (e < lo) e = lo; } else if (e > hi) e = hi; }
    tlist *out = tpl_list_new(c, 0);
    for (int64_t i = s; step > 0 ? i < e : i > e;) {
        tpl_list_push(c, out, items->v[i]);
        if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (!isstr) return mklist(out, obj.t);
    sbuf b = {.c = c};
    for (int64_t i = 0; i < out->n; i++) sb_put(&b, out->v[i].s->p, out->v[i].s->n);
    return v_str(sb_take(&b));
}

static const char *type_obj(val v) {
    static _Thread_local char buf[64];   /* renders may run on several threads at once */
    if (v.t == V_NONE) return "None";
    snprintf(buf, sizeof buf, "%s object", tpl_type_name(v));
    return buf;
}

/* jinja2's getitem: obj[key] */
static val getitem(tpl_ctx *c, val obj, val key) {
    if (obj.t == V_UNDEF) tpl_undef_fail(c, obj);
    if (obj.t == V_DICT || obj.t == V_NS) {
        val *v = tpl_dict_get(obj.d, key);
        if (v) return *v;
    } else if ((obj.t == V_LIST || obj.t == V_TUPLE || obj.t == V_STR) && !(obj.t != V_STR && obj.l->gen)) {
        if (key.t == V_INT || key.t == V_BOOL) {
            int64_t i = key.t == V_INT ? key.i : key.b, n = length(c, obj);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                if (obj.t != V_STR) return obj.l->v[i];
                size_t p = 0;
                for (int64_t k = 0; k < i; k++) p = tpl_u8next(obj.s->p, obj.s->n, p);
                return mkstr(c, obj.s->p + p, tpl_u8next(obj.s->p, obj.s->n, p) - p);
            }
        }
    } else if (obj.t == V_LOOP && key.t == V_STR) {
        /* handled by getattr */
    }
    if (key.t == V_STR) return tpl_undef_msg(c, "'%s' has no attribute '%s'", type_obj(obj), key.s->p);
    sbuf b = {.c = c};
    tpl_write_repr(&b, key);
    return tpl_undef_msg(c, "'%s' has no element %s", type_obj(obj), b.p ? b.p : "");
}

static val loop_attr(tpl_ctx *c, tloop *lp, const char *name) {
    int64_t n = lp->items->n, i = lp->i;
    if (!strcmp(name, "index")) return v_int(i + 1);
    if (!strcmp(name, "index0")) return v_int(i);
    if (!strcmp(name, "revindex")) return v_int(n - i);
    if (!strcmp(name, "revindex0")) return v_int(n - i - 1);
    if (!strcmp(name, "first")) return v_bool(i == 0);
    if (!strcmp(name, "last")) return v_bool(i == n - 1);
    if (!strcmp(name, "length")) return v_int(n);
    if (!strcmp(name, "depth")) return v_int(lp->depth);
    if (!strcmp(name, "depth0")) return v_int(lp->depth - 1);
    if (!strcmp(name, "previtem")) return i > 0 ? lp->items->v[i - 1] : tpl_undef_msg(c, "there is no previous item");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? lp->items->v[i + 1] : tpl_undef_msg(c, "there is no next item");
    return tpl_undef_msg(c, "'LoopContext object' has no attribute '%s'", name);
}

/* jinja2's getattr: obj.name */
static val getattr_(tpl_ctx *c, val obj, const char *name) {
    if (obj.t == V_UNDEF) tpl_undef_fail(c, obj);
    if (obj.t == V_LOOP) return loop_attr(c, obj.lp, name);
    if (obj.t == V_DICT || obj.t == V_NS) {
        val *v = tpl_dict_gets(obj.d, name);
        if (v) return *v;
        if (obj.t == V_NS) return tpl_undef_msg(c, "'Namespace object' has no attribute '%s'", name);
    }
    return getitem(c, obj, cstr(c, name));
}

/* ------------------------------------------------------------------ arithmetic */
static bool is_num(val v) { return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT; }
static bool is_intish(val v) { return v.t == V_BOOL || v.t == V_INT; }
static int64_t as_i(val v) { return v.t == V_INT ? v.i : v.b; }
static double as_f(val v) { return v.t == V_FLOAT ? v.f : (double)as_i(v); }

static _Noreturn void bad_operands(tpl_ctx *c, const char *op, val a, val b) {
    if (a.t == V_UNDEF) tpl_undef_fail(c, a);
    if (b.t == V_UNDEF) tpl_undef_fail(c, b);
    tpl_fail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op, tpl_type_name(a), tpl_type_name(b));
}

static val repeat(tpl_ctx *c, val seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq.t == V_STR) {
        if (k && seq.s->n && (size_t)k > (c->a.limit ? c->a.limit : SIZE_MAX) / seq.s->n) tpl_fail(c, "string repetition too large");
        sbuf b = {.c = c};
        b.c = c;
        for (int64_t i = 0; i < k; i++) sb_put(&b, seq.s->p, seq.s->n);
        return v_str(sb_take(&b));
    }
    tlist *l = tpl_list_new(c, 0);
    if (k && seq.l->n && k > (int64_t)(c->a.limit / 16) / seq.l->n) tpl_fail(c, "list repetition too large");
    for (int64_t i = 0; i < k; i++) for (int64_t j = 0; j < seq.l->n; j++) tpl_list_push(c, l, seq.l->v[j]);
    return mklist(l, seq.t);
}

static val py_mod_format(tpl_ctx *c, tstr *fmt, val args);

static val binop(tpl_ctx *c, int op, val a, val b) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (is_num(a) && is_num(b)) {
        if (is_intish(a) && is_intish(b)) {
            int64_t x = as_i(a), y = as_i(b), r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; return v_int(r);
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; return v_int(r);
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; return v_int(r);
            case OP_DIV: if (!y) tpl_fail(c, "division by zero"); return v_float((double)x / (double)y);
            case OP_FLOORDIV:
                if (!y) tpl_fail(c, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto ovf;
                r = x / y;
                if ((x % y) && ((x < 0) != (y < 0))) r--;
                return v_int(r);
            case OP_MOD:
                if (!y) tpl_fail(c, "integer division or modulo by zero");
                if (y == -1) return v_int(0);
                r = x % y;
                if (r && ((r < 0) != (y < 0))) r += y;
                return v_int(r);
            case OP_POW:
                if (y < 0) return v_float(pow((double)x, (double)y));
                r = 1;
                for (int64_t base = x; y; y >>= 1) {
                    if ((y & 1) && __builtin_mul_overflow(r, base, &r)) goto ovf;
                    if (y > 1 && __builtin_mul_overflow(base, base, &base)) goto ovf;
                }
                return v_int(r);
            }
        }
        double x = as_f(a), y = as_f(b);
        switch (op) {
        case OP_ADD: return v_float(x + y);
        case OP_SUB: return v_float(x - y);
        case OP_MUL: return v_float(x * y);
        case OP_DIV: if (y == 0) tpl_fail(c, "float division by zero"); return v_float(x / y);
        case OP_FLOORDIV: if (y == 0) tpl_fail(c, "float floor division by zero"); return v_float(floor(x / y));
        case OP_MOD: {
            if (y == 0) tpl_fail(c, "float modulo");
            double m = fmod(x, y);
            if (m && ((m < 0) != (y < 0))) m += y;
            return v_float(m);
        }
        case OP_POW: return v_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        sbuf s = {.c = c};
        sb_put(&s, a.s->p, a.s->n);
        sb_put(&s, b.s->p, b.s->n);
        return v_str(sb_take(&s));
    }
    if (op == OP_ADD && (a.t == V_LIST || a.t == V_TUPLE) && a.t == b.t) {
        tlist *l = tpl_list_new(c, a.l->n + b.l->n);
        for (int64_t i = 0; i < a.l->n; i++) tpl_list_push(c, l, a.l->v[i]);
        for (int64_t i = 0; i < b.l->n; i++) tpl_list_push(c, l, b.l->v[i]);
        return mklist(l, a.t);
    }
    if (op == OP_MUL && (a.t == V_STR || a.t == V_LIST || a.t == V_TUPLE) && is_intish(b)) return repeat(c, a, as_i(b));
    if (op == OP_MUL && (b.t == V_STR || b.t == V_LIST || b.t == V_TUPLE) && is_intish(a)) return repeat(c, b, as_i(a));
    if (op == OP_MOD && a.t == V_STR) return py_mod_format(c, a.s, b);
    bad_operands(c, names[op], a, b);
ovf:
    tpl_fail(c, "integer overflow in '%s' (mmc's integers are 64-bit)", names[op]);
}

static bool contains(tpl_ctx *c, val needle, val hay) {
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) tpl_fail(c, "'in <string>' requires string as left operand, not %s", tpl_type_name(needle));
        if (!needle.s->n) return true;
        return memmem(hay.s->p, hay.s->n, needle.s->p, needle.s->n) != NULL;
    case V_LIST: case V_TUPLE:
        for (int64_t i = 0; i < hay.l->n; i++) if (tpl_eq(hay.l->v[i], needle)) return true;
        return false;
    case V_DICT:
        if (needle.t == V_LIST || needle.t == V_DICT || needle.t == V_NS) tpl_fail(c, "unhashable type: '%s'", tpl_type_name(needle));
        return tpl_dict_get(hay.d, needle) != NULL;
    case V_UNDEF: return false;
    default: tpl_fail(c, "argument of type '%s' is not iterable", tpl_type_name(hay));
    }
}

static bool compare(tpl_ctx *c, int op, val a, val b) {
    switch (op) {
    case OP_EQ: return tpl_eq(a, b);
    case OP_NE: return !tpl_eq(a, b);
    case OP_IN: return contains(c, a, b);
    case OP_NOTIN: return !contains(c, a, b);
    case OP_LT: return tpl_cmp(c, a, b, "<") < 0;
    case OP_LE: return tpl_cmp(c, a, b, "<=") <= 0;
    case OP_GT: return tpl_cmp(c, a, b, ">") > 0;
    default: return tpl_cmp(c, a, b, ">=") >= 0;
    }
}

/* ------------------------------------------------------------------ strings */
static bool py_space(uint32_t u) {
    return u == ' ' || (u >= 9 && u <= 13) || (u >= 0x1c && u <= 0x1f) || u == 0x85 || u == 0xa0 || u == 0x1680 ||
           (u >= 0x2000 && u <= 0x200a) || u == 0x2028 || u == 0x2029 || u == 0x202f || u == 0x205f || u == 0x3000;
}
static bool in_chars(uint32_t u, tstr *chars) {
    for (size_t i = 0; i < chars->n; i = tpl_u8next(chars->p, chars->n, i))
        if (tpl_u8dec(chars->p, chars->n, i) == u) return true;
    return false;
}
/* which: 1 left, 2 right, 3 both; chars NULL: whitespace */
static val strip(tpl_ctx *c, tstr *s, tstr *chars, int which) {
    size_t a = 0, e = s->n;
    if (which & 1)
        while (a < e) {
            uint32_t u = tpl_u8dec(s->p, s->n, a);
            if (!(chars ? in_chars(u, chars) : py_space(u))) break;
            a = tpl_u8next(s->p, s->n, a);
        }
    if (which & 2)
        while (e > a) {
            size_t p = e - 1;
            while (p > a && ((unsigned char)s->p[p] & 0xC0) == 0x80) p--;
            uint32_t u = tpl_u8dec(s->p, s->n, p);
            if (!(chars ? in_chars(u, chars) : py_space(u))) break;
            e = p;
        }
    return mkstr(c, s->p + a, e - a);
}

/* mode 0 lower, 1 upper, 2 capitalize, 3 str.title, 4 jinja title filter, 5 swapcase */
static val casemap(tpl_ctx *c, tstr *s, int mode) {
    sbuf b = {.c = c};
    bool first = true, prev_cased = false;
    for (size_t i = 0; i < s->n;) {
        size_t e = tpl_u8next(s->p, s->n, i);
        uint32_t u = tpl_u8dec(s->p, s->n, i);
        int32_t r = (int32_t)u;
        bool cased = utf8proc_islower((int32_t)u) || utf8proc_isupper((int32_t)u) || utf8proc_totitle((int32_t)u) != (int32_t)u;
        switch (mode) {
        case 0: r = utf8proc_tolower((int32_t)u); break;
        case 1: r = utf8proc_toupper((int32_t)u); break;
        case 2: r = first ? utf8proc_toupper((int32_t)u) : utf8proc_tolower((int32_t)u); break;
        case 3: r = prev_cased ? utf8proc_tolower((int32_t)u) : utf8proc_toupper((int32_t)u); break;
        case 4: {
            bool sep = u == '-' || py_space(u) || u == '(' || u == '{' || u == '[' || u == '<';
            r = sep ? (int32_t)u : first ? utf8proc_toupper((int32_t)u) : utf8proc_tolower((int32_t)u);
            first = sep;
            break;
        }
        case 5: r = utf8proc_isupper((int32_t)u) ? utf8proc_tolower((int32_t)u) : utf8proc_toupper((int32_t)u); break;
        }
        if (mode == 3) prev_cased = cased || (utf8proc_category((int32_t)u) == UTF8PROC_CATEGORY_LM);
        if (mode == 3) prev_cased = cased;
        if (mode != 4) first = false;
        if ((uint32_t)r == u) sb_put(&b, s->p + i, e - i);
        else {
            uint8_t t[4];
            ssize_t k = utf8proc_encode_char(r, t);
            sb_put(&b, (const char *)t, (size_t)k);
        }
        i = e;
    }
    return v_str(sb_take(&b));
}

static val replace(tpl_ctx *c, tstr *s, tstr *old, tstr *new_, int64_t count) {
    sbuf b = {.c = c};
    int64_t done = 0;
    if (!old->n) {
        for (size_t i = 0; i <= s->n;) {
            if (count < 0 || done < count) { sb_put(&b, new_->p, new_->n); done++; }
            if (i == s->n) break;
            size_t e = tpl_u8next(s->p, s->n, i);
            sb_put(&b, s->p + i, e - i);
            i = e;
        }
        return v_str(sb_take(&b));
    }
    size_t i = 0;
    while (i < s->n) {
        const char *h = (count < 0 || done < count) ? memmem(s->p + i, s->n - i, old->p, old->n) : NULL;
        if (!h) break;
        sb_put(&b, s->p + i, (size_t)(h - s->p) - i);
        sb_put(&b, new_->p, new_->n);
        i = (size_t)(h - s->p) + old->n;
        done++;
    }
    sb_put(&b, s->p + i, s->n - i);
    return v_str(sb_take(&b));
}

static val split(tpl_ctx *c, tstr *s, val sepv, int64_t maxsplit) {
    tlist *l = tpl_list_new(c, 0);
    if (sepv.t == V_NONE || sepv.t == V_UNDEF) {
        size_t i = 0;
        for (;;) {
            while (i < s->n && py_space(tpl_u8dec(s->p, s->n, i))) i = tpl_u8next(s->p, s->n, i);
            if (i >= s->n) break;
            if (maxsplit >= 0 && l->n == maxsplit) { tpl_list_push(c, l, mkstr(c, s->p + i, s->n - i)); break; }
            size_t st = i;
            while (i < s->n && !py_space(tpl_u8dec(s->p, s->n, i))) i = tpl_u8next(s->p, s->n, i);
            tpl_list_push(c, l, mkstr(c, s->p + st, i - st));
        }
        return mklist(l, V_LIST);
    }
    tstr *sep = want_str(c, sepv, "split's separator");
    if (!sep->n) tpl_fail(c, "empty separator");
    size_t i = 0;
    for (;;) {
        const char *h = (maxsplit < 0 || l->n < maxsplit) ? memmem(s->p + i, s->n - i, sep->p, sep->n) : NULL;
        if (!h) { tpl_list_push(c, l, mkstr(c, s->p + i, s->n - i)); break; }
        tpl_list_push(c, l, mkstr(c, s->p + i, (size_t)(h - s->p) - i));
        i = (size_t)(h - s->p) + sep->n;
    }
    return mklist(l, V_LIST);
}

/* str.splitlines() */
static tlist *splitlines(tpl_ctx *c, tstr *s) {
    tlist *l = tpl_list_new(c, 0);
    size_t st = 0, i = 0;
    while (i < s->n) {
        uint32_t u = tpl_u8dec(s->p, s->n, i);
        size_t e = tpl_u8next(s->p, s->n, i);
        if (u == '\n' || u == '\r' || u == 0x0b || u == 0x0c || u == 0x1c || u == 0x1d || u == 0x1e || u == 0x85 || u == 0x2028 || u == 0x2029) {
            tpl_list_push(c, l, mkstr(c, s->p + st, i - st));
            if (u == '\r' && e < s->n && s->p[e] == '\n') e++;
            st = e;
        }
        i = e;
    }
    if (st < s->n) tpl_list_push(c, l, mkstr(c, s->p + st, s->n - st));
    return l;
}

static bool affix(tpl_ctx *c, tstr *s, val pre, bool end) {
    if (pre.t == V_TUPLE || pre.t == V_LIST) {
        for (int64_t i = 0; i < pre.l->n; i++) if (affix(c, s, pre.l->v[i], end)) return true;
        return false;
    }
    tstr *p = want_str(c, pre, end ? "endswith's argument" : "startswith's argument");
    if (p->n > s->n) return false;
    return !memcmp(end ? s->p + s->n - p->n : s->p, p->p, p->n);
}

/* "%s" % x — the conversions templates use: %s %r %d %i %f %% */
static val py_mod_format(tpl_ctx *c, tstr *fmt, val args) {
    tlist *al = args.t == V_TUPLE ? args.l : NULL;
    int64_t k = 0;
    sbuf b = {.c = c};
    for (size_t i = 0; i < fmt->n; i++) {
        if (fmt->p[i] != '%') { sb_put(&b, fmt->p + i, 1); continue; }
        if (++i >= fmt->n) tpl_fail(c, "incomplete format");
        char spec = fmt->p[i];
        if (spec == '%') { sb_cstr(&b, "%"); continue; }
        val a;
        if (al) { if (k >= al->n) tpl_fail(c, "not enough arguments for format string"); a = al->v[k++]; }
        else { if (k++) tpl_fail(c, "not enough arguments for format string"); a = args; }
        char t[64];
        if (spec == 's') tpl_write_str(&b, a);
        else if (spec == 'r') tpl_write_repr(&b, a);
        else if (spec == 'd' || spec == 'i') {
            if (!is_num(a)) tpl_fail(c, "%%%c format: a real number is required, not %s", spec, tpl_type_name(a));
            if (a.t == V_FLOAT && !(fabs(a.f) < 9.2e18)) tpl_fail(c, "%%%c format: number out of range", spec);
            snprintf(t, sizeof t, "%lld", (long long)(a.t == V_FLOAT ? (int64_t)a.f : as_i(a)));
            sb_cstr(&b, t);
        } else if (spec == 'f') {
            if (!is_num(a)) tpl_fail(c, "must be real number, not %s", tpl_type_name(a));
            snprintf(t, sizeof t, "%f", as_f(a));
            sb_cstr(&b, t);
        } else tpl_fail(c, "unsupported format character '%c'", spec);
    }
    if (al ? k < al->n : k == 0) tpl_fail(c, "not all arguments converted during string formatting");
    return v_str(sb_take(&b));
}

/* str.format with {} {0} {name} fields (no format specs beyond the empty one) */
static val str_format(tpl_ctx *c, tstr *fmt, args_t *a) {
    sbuf b = {.c = c};
    int auto_i = 0;
    for (size_t i = 0; i < fmt->n; i++) {
        char ch = fmt->p[i];
        if (ch == '{' && i + 1 < fmt->n && fmt->p[i + 1] == '{') { sb_cstr(&b, "{"); i++; continue; }
        if (ch == '}' && i + 1 < fmt->n && fmt->p[i + 1] == '}') { sb_cstr(&b, "}"); i++; continue; }
        if (ch != '{') { sb_put(&b, &ch, 1); continue; }
        const char *e = memchr(fmt->p + i, '}', fmt->n - i);
        if (!e) tpl_fail(c, "Single '{' encountered in format string");
        size_t fl = (size_t)(e - fmt->p) - i - 1;
        char field[128];
        if (fl >= sizeof field) tpl_fail(c, "format field too long");
        memcpy(field, fmt->p + i + 1, fl);
        field[fl] = 0;
        if (strchr(field, ':') || strchr(field, '!')) tpl_fail(c, "format specs are not supported in str.format");
        val v;
        if (!fl) { if (auto_i >= a->npos) tpl_fail(c, "Replacement index %d out of range for positional args tuple", auto_i); v = a->pos[auto_i++]; }
        else if (field[0] >= '0' && field[0] <= '9') {
            int ix = atoi(field);
            if (ix >= a->npos) tpl_fail(c, "Replacement index %d out of range for positional args tuple", ix);
            v = a->pos[ix];
        } else {
            v = arg(a, -1, field, v_undef(NULL));
            if (v.t == V_UNDEF) tpl_fail(c, "KeyError: '%s'", field);
        }
        tpl_write_str(&b, v);
        i = (size_t)(e - fmt->p);
    }
    return v_str(sb_take(&b));
}

/* ------------------------------------------------------------------ macros and calls */
static val call_value(tpl_ctx *c, frame *f, val fn, args_t *a);

static val call_macro(tpl_ctx *c, tmacro *m, args_t *a, val caller) {
    if (++c->depth > c->max_depth) tpl_fail(c, "macro calls nested deeper than %d (limit)", c->max_depth);
    frame *mf = new_frame(c, m->closure);
    node *d = m->def;
    int np = d->args.n;
    /* jinja2's Macro._invoke checks */
    if (a->npos > np && !(d->op & MACRO_VARARGS))
        tpl_fail(c, "macro '%s' takes not more than %d argument(s)", m->name, np);
    for (int k = 0; k < a->nkw; k++) {
        bool known = false;
        for (int i = 0; i < np; i++)
            if (!strcmp(d->args.v[i]->name, a->kwn[k])) {
                known = true;
                if (i < a->npos) tpl_fail(c, "macro '%s' got multiple values for argument '%s'", m->name, a->kwn[k]);
            }
        if (!known && !(d->op & MACRO_KWARGS)) tpl_fail(c, "macro '%s' takes no keyword argument '%s'", m->name, a->kwn[k]);
    }
    if (caller.t == V_MACRO && !(d->op & (MACRO_CALLER | MACRO_KWARGS)))
        tpl_fail(c, "macro '%s' takes no keyword argument 'caller'", m->name);
    for (int i = 0; i < np; i++) {
        node *p = d->args.v[i];
        val v = v_undef(NULL);
        bool have = false;
        for (int k = 0; k < a->nkw; k++) if (!strcmp(a->kwn[k], p->name)) { v = a->kwv[k]; have = true; }
        if (!have && i < a->npos) { v = a->pos[i]; have = true; }
        if (!have) v = p->a ? eval(c, mf, p->a) : tpl_undef_msg(c, "parameter '%s' was not provided", p->name);
        assign(c, mf, p->name, v);
    }
    tlist *varargs = tpl_list_new(c, 0);
    for (int i = np; i < a->npos; i++) tpl_list_push(c, varargs, a->pos[i]);
    assign(c, mf, "varargs", mklist(varargs, V_TUPLE));
    val kw = {.t = V_DICT};
    kw.d = tpl_dict_new(c);
    for (int k = 0; k < a->nkw; k++) {
        bool known = false;
        for (int i = 0; i < np; i++) known |= !strcmp(d->args.v[i]->name, a->kwn[k]);
        if (!known) tpl_dict_set(c, kw.d, cstr(c, a->kwn[k]), a->kwv[k]);
    }
    if (caller.t == V_MACRO && !(d->op & MACRO_CALLER)) tpl_dict_set(c, kw.d, cstr(c, "caller"), caller);
    assign(c, mf, "kwargs", kw);
    if (caller.t == V_MACRO && (d->op & MACRO_CALLER)) assign(c, mf, "caller", caller);
    sbuf out = {.c = c};
    exec(c, mf, d->b, &out);
    c->depth--;
    return v_str(sb_take(&out));
}

static val do_range(tpl_ctx *c, args_t *a) {
    int64_t start = 0, stop, stp = 1;
    if (a->npos == 1) stop = want_int(c, a->pos[0], "range()'s argument");
    else if (a->npos == 2 || a->npos == 3) {
        start = want_int(c, a->pos[0], "range()'s argument");
        stop = want_int(c, a->pos[1], "range()'s argument");
        if (a->npos == 3) stp = want_int(c, a->pos[2], "range()'s argument");
    } else tpl_fail(c, "range expected 1 to 3 arguments, got %d", a->npos);
    if (!stp) tpl_fail(c, "range() arg 3 must not be zero");
    double cnt = stp > 0 ? ceil(((double)stop - (double)start) / (double)stp) : ceil(((double)start - (double)stop) / (double)-stp);
    if (cnt > 100000) tpl_fail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    tlist *l = tpl_list_new(c, cnt > 0 ? (int64_t)cnt : 0);
    for (int64_t i = start; stp > 0 ? i < stop : i > stop;) {
        tpl_list_push(c, l, v_int(i));
        if (__builtin_add_overflow(i, stp, &i)) break;
    }
    return mklist(l, V_LIST);
}

static val dict_from(tpl_ctx *c, args_t *a, bool ns) {
    val d = {.t = (uint8_t)(ns ? V_NS : V_DICT)};
    d.d = tpl_dict_new(c);
    if (a->npos > 1) tpl_fail(c, "%s expected at most 1 argument, got %d", ns ? "namespace" : "dict", a->npos);
    if (a->npos == 1) {
        val s = a->pos[0];
        if (s.t == V_DICT || s.t == V_NS) for (int64_t i = 0; i < s.d->n; i++) tpl_dict_set(c, d.d, s.d->k[i], s.d->v[i]);
        else {
            tlist *l = iter_list(c, s);
            for (int64_t i = 0; i < l->n; i++) {
                val p = l->v[i];
                if ((p.t != V_LIST && p.t != V_TUPLE) || p.l->n != 2)
                    tpl_fail(c, "dictionary update sequence element #%lld has the wrong length", (long long)i);
                tpl_dict_set(c, d.d, p.l->v[0], p.l->v[1]);
            }
        }
    }
    for (int k = 0; k < a->nkw; k++) tpl_dict_set(c, d.d, cstr(c, a->kwn[k]), a->kwv[k]);
    if (ns)
        for (int64_t i = 0; i < d.d->n; i++)
            if (d.d->k[i].t == V_STR && d.d->k[i].s->p[0] == '_')
                tpl_fail(c, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. "
                            "Please rename the attribute.", d.d->k[i].s->p);
    return d;
}

static int exec_for(tpl_ctx *c, frame *f, node *n, val iterable, int depth, sbuf *out);

static val call_value(tpl_ctx *c, frame *f, val fn, args_t *a) {
    if (fn.t == V_MACRO) {
        val caller = c->pending_caller;
        c->pending_caller = v_undef(NULL);
        return call_macro(c, fn.m, a, caller);
    }
    if (fn.t == V_LOOP) {
        if (!fn.lp->fornode->flag) tpl_fail(c, "Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
        if (a->npos != 1) tpl_fail(c, "loop() takes one argument");
        if (++c->depth > c->max_depth) tpl_fail(c, "recursive loop nested deeper than %d (limit)", c->max_depth);
        sbuf o = {.c = c};
        exec_for(c, fn.lp->outer, fn.lp->fornode, a->pos[0], fn.lp->depth + 1, &o);
        c->depth--;
        return v_str(sb_take(&o));
    }
    if (fn.t == V_FUNC) {
        switch (fn.fn) {
        case F_RANGE: return do_range(c, a);
        case F_NAMESPACE: return dict_from(c, a, true);
        case F_DICT: return dict_from(c, a, false);
        case F_RAISE: {
            val m = arg(a, 0, "message", v_undef(NULL));
            tstr *s = tpl_to_str(c, m);
            snprintf(c->err, sizeof c->err, "%s", s->p);
            longjmp(c->jb, 1);
        }
        case F_STRFTIME: {
            tstr *fmt = want_str(c, arg(a, 0, "format", v_undef(NULL)), "strftime_now's format");
            time_t t = c->now ? (time_t)c->now : time(NULL);
            struct tm tmv;
            localtime_r(&t, &tmv);
            char buf[512];
            size_t k = fmt->n ? strftime(buf, sizeof buf, fmt->p, &tmv) : 0;
            return mkstr(c, buf, k);
        }
        }
    }
    if (fn.t == V_UNDEF) tpl_undef_fail(c, fn);
    tpl_fail(c, "'%s' object is not callable", tpl_type_name(fn));
}

/* ------------------------------------------------------------------ tests */
static bool is_test_name(const char *nm);
static bool run_test(tpl_ctx *c, frame *f, const char *nm, val v, args_t *a) {
    val x = arg(a, 0, "", v_undef(NULL));
#define T(s) (!strcmp(nm, s))
    if (T("defined")) return v.t != V_UNDEF;
    if (T("undefined")) return v.t == V_UNDEF;
    if (T("none")) return v.t == V_NONE;
    if (T("boolean")) return v.t == V_BOOL;
    if (T("true")) return v.t == V_BOOL && v.b;
    if (T("false")) return v.t == V_BOOL && !v.b;
    if (T("integer")) return v.t == V_INT;
    if (T("float")) return v.t == V_FLOAT;
    if (T("number")) return is_num(v);
    if (T("string")) return v.t == V_STR;
    if (T("mapping")) return v.t == V_DICT;
    if (T("iterable")) return v.t == V_STR || v.t == V_LIST || v.t == V_TUPLE || v.t == V_DICT || v.t == V_UNDEF;
    if (T("sequence")) return v.t == V_STR || ((v.t == V_LIST || v.t == V_TUPLE) && !v.l->gen) || v.t == V_DICT || v.t == V_UNDEF;
    if (T("callable")) return v.t == V_MACRO || v.t == V_FUNC || (v.t == V_LOOP && v.lp->fornode->flag);
    if (T("escaped")) return false;
    if (T("odd") || T("even")) {   /* value % 2: floats too */
        val r = binop(c, OP_MOD, v, v_int(2));
        bool zero = r.t == V_FLOAT ? r.f == 0 : as_i(r) == 0;
        return T("odd") ? !zero : zero;
    }
    if (T("divisibleby")) {
        val r = binop(c, OP_MOD, v, x);
        return r.t == V_FLOAT ? r.f == 0 : as_i(r) == 0;
    }
    if (T("eq") || T("equalto") || T("==")) return tpl_eq(v, x);
    if (T("ne") || T("!=")) return !tpl_eq(v, x);
    if (T("lt") || T("lessthan") || T("<")) return compare(c, OP_LT, v, x);
    if (T("le") || T("<=")) return compare(c, OP_LE, v, x);
    if (T("gt") || T("greaterthan") || T(">")) return compare(c, OP_GT, v, x);
    if (T("ge") || T(">=")) return compare(c, OP_GE, v, x);
    if (T("in")) return contains(c, v, x);
    if (T("sameas")) {
        if (v.t != x.t) return false;
        if (v.t == V_NONE || v.t == V_UNDEF) return true;
        if (v.t == V_BOOL || v.t == V_INT) return tpl_eq(v, x) && (v.t != V_INT || (v.i >= -5 && v.i <= 256));
        return v.t == V_STR ? v.s == x.s : tpl_eq(v, x) && v.l == x.l;
    }
    if (T("lower") || T("upper")) {
        tstr *s = tpl_to_str(c, v);
        bool cased = false;
        for (size_t i = 0; i < s->n; i = tpl_u8next(s->p, s->n, i)) {
            int32_t u = (int32_t)tpl_u8dec(s->p, s->n, i);
            if (T("lower") ? utf8proc_isupper(u) : utf8proc_islower(u)) return false;
            cased |= utf8proc_isupper(u) || utf8proc_islower(u);
        }
        return cased;
    }
    if (T("filter") || T("test")) return x.t == V_STR && (T("test") ? is_test_name(x.s->p) : true);
    (void)f;
#undef T
    tpl_fail(c, "No test named '%s'.", nm);
}
static bool is_test_name(const char *nm) {
    static const char *const names[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
        "number", "string", "mapping", "iterable", "sequence", "callable", "escaped", "odd", "even", "divisibleby", "eq",
        "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in",
        "sameas", "lower", "upper", "filter", "test", NULL};
    for (int i = 0; names[i]; i++) if (!strcmp(names[i], nm)) return true;
    return false;
}

/* ------------------------------------------------------------------ filters */
static val apply_filter(tpl_ctx *c, frame *f, const char *nm, val v, args_t *a);

/* attribute="a.b.0" lookups as jinja's make_attrgetter */
static val attr_path(tpl_ctx *c, val v, tstr *path) {
    size_t i = 0;
    while (i <= path->n) {
        const char *dot = memchr(path->p + i, '.', path->n - i);
        size_t e = dot ? (size_t)(dot - path->p) : path->n;
        char part[256];
        size_t l = e - i < 255 ? e - i : 255;
        memcpy(part, path->p + i, l);
        part[l] = 0;
        bool digits = l > 0;
        for (size_t k = 0; k < l; k++) digits &= part[k] >= '0' && part[k] <= '9';
        if (v.t == V_UNDEF) return v;
        v = digits ? getitem(c, v, v_int(atoll(part))) : getattr_(c, v, part);
        if (!dot) break;
        i = e + 1;
    }
    return v;
}

static val sort_key(tpl_ctx *c, val v, bool case_sensitive) {
    if (!case_sensitive && v.t == V_STR) return casemap(c, v.s, 0);
    return v;
}
static void msort(tpl_ctx *c, val *keys, int64_t *ix, int64_t *tmp, int64_t n, bool rev) {
    if (n < 2) return;
    int64_t h = n / 2;
    msort(c, keys, ix, tmp, h, rev);
    msort(c, keys, ix + h, tmp, n - h, rev);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = tpl_cmp(c, keys[ix[j]], keys[ix[i]], "<");
        tmp[k++] = (rev ? r > 0 : r < 0) ? ix[j++] : ix[i++];
    }
    while (i < h) tmp[k++] = ix[i++];
    while (j < n) tmp[k++] = ix[j++];
    memcpy(ix, tmp, (size_t)n * sizeof *ix);
}
static tlist *sorted(tpl_ctx *c, tlist *items, val *keys, bool rev) {
    int64_t n = items->n;
    int64_t *ix = tpl_alloc(&c->a, (size_t)(2 * n + 1) * sizeof *ix);
    for (int64_t i = 0; i < n; i++) ix[i] = i;
    msort(c, keys, ix, ix + n, n, rev);
    tlist *o = tpl_list_new(c, n);
    for (int64_t i = 0; i < n; i++) tpl_list_push(c, o, items->v[ix[i]]);
    return o;
}

static val select_like(tpl_ctx *c, frame *f, val v, args_t *a, bool attr, bool keep) {
    /* jinja2's select_or_reject starts with `if value:` — a falsy input gives nothing */
    tlist *in = tpl_truthy(v) ? iter_list(c, v) : tpl_list_new(c, 0), *out = tpl_list_new(c, 0);
    int off = attr ? 1 : 0;
    tstr *path = attr ? want_str(c, arg(a, 0, "attribute", v_undef(NULL)), "the attribute name") : NULL;
    val tn = a->npos > off ? a->pos[off] : v_undef(NULL);
    args_t ta = {.pos = a->pos + off + 1, .npos = a->npos > off + 1 ? a->npos - off - 1 : 0};
    for (int64_t i = 0; i < in->n; i++) {
        val x = attr ? attr_path(c, in->v[i], path) : in->v[i];
        bool r = tn.t == V_UNDEF ? tpl_truthy(x) : run_test(c, f, want_str(c, tn, "the test name")->p, x, &ta);
        if (r == keep) tpl_list_push(c, out, in->v[i]);
    }
    return mkgen(out);
}

static val do_indent(tpl_ctx *c, tstr *s, val width, bool first, bool blank) {
    sbuf ind = {.c = c};
    if (width.t == V_STR) sb_put(&ind, width.s->p, width.s->n);
    else for (int64_t i = want_int(c, width, "indent's width"); i > 0; i--) sb_cstr(&ind, " ");
    if (!ind.p) sb_put(&ind, "", 0);
    sbuf t = {.c = c};
    sb_put(&t, s->p, s->n);
    sb_cstr(&t, "\n");
    tlist *lines = splitlines(c, sb_take(&t));
    sbuf o = {.c = c};
    if (first) sb_put(&o, ind.p, ind.n);
    for (int64_t i = 0; i < lines->n; i++) {
        tstr *l = lines->v[i].s;
        if (i) { sb_cstr(&o, "\n"); if (blank || l->n) sb_put(&o, ind.p, ind.n); }
        sb_put(&o, l->p, l->n);
    }
    return v_str(sb_take(&o));
}

static val do_tojson(tpl_ctx *c, val v, args_t *a, int off) {
    val ea = arg(a, off + 0, "ensure_ascii", v_bool(false)), ind = arg(a, off + 1, "indent", v_none());
    val sep = arg(a, off + 2, "separators", v_none()), sk = arg(a, off + 3, "sort_keys", v_bool(false));
    const char *indent = NULL, *isep = ", ", *ksep = ": ";
    char ibuf[256];
    if (ind.t == V_INT) {
        int64_t k = ind.i < 0 ? 0 : ind.i > 200 ? 200 : ind.i;
        memset(ibuf, ' ', (size_t)k);
        ibuf[k] = 0;
        indent = ibuf;
        isep = ",";
    } else if (ind.t == V_STR) { indent = ind.s->p; isep = ","; }
    if (sep.t == V_LIST || sep.t == V_TUPLE) {
        if (sep.l->n != 2) tpl_fail(c, "separators must be an (item_separator, key_separator) pair");
        isep = want_str(c, sep.l->v[0], "item separator")->p;
        ksep = want_str(c, sep.l->v[1], "key separator")->p;
    }
    sbuf b = {.c = c};
    tpl_write_json(&b, v, indent, isep, ksep, tpl_truthy(sk), tpl_truthy(ea), 0);
    return v_str(sb_take(&b));
}

static val do_int(tpl_ctx *c, val v, val dflt, int64_t base) {
    if (v.t == V_INT) return v;
    if (v.t == V_BOOL) return v_int(v.b);
    if (v.t == V_FLOAT) return isfinite(v.f) && fabs(v.f) < 9.2e18 ? v_int((int64_t)v.f) : dflt;
    if (v.t == V_STR) {
        char buf[128];
        tstr *t = strip(c, v.s, NULL, 3).s;
        if (t->n == 0 || t->n >= sizeof buf) return dflt;
        size_t k = 0;
        for (size_t i = 0; i < t->n; i++) if (t->p[i] != '_') buf[k++] = t->p[i];
        buf[k] = 0;
        char *end;
        errno = 0;
        long long x = strtoll(buf, &end, (int)base);
        if (!*end) {
            if (errno == ERANGE) tpl_fail(c, "integer overflow in int('%s') (mmc's integers are 64-bit)", buf);
            return v_int(x);
        }
        if (strpbrk(buf, "xXpP")) return dflt;   /* Python's float() takes no hex */
        double d = strtod(buf, &end);
        if (!*end && isfinite(d) && fabs(d) < 9.2e18) return v_int((int64_t)d);
    }
    return dflt;
}
static val do_float(tpl_ctx *c, val v, val dflt) {
    if (v.t == V_FLOAT) return v;
    if (is_num(v)) return v_float(as_f(v));
    if (v.t == V_STR) {
        tstr *t = strip(c, v.s, NULL, 3).s;
        char *end;
        double d = strtod(t->p, &end);
        if (t->n && !*end && !strpbrk(t->p, "xXpP")) return v_float(d);
    }
    return dflt;
}

static val do_round(tpl_ctx *c, val v, int64_t prec, const char *method) {
    double x = as_f(v);
    if (!strcmp(method, "common")) {
        if (prec < 0 || prec > 300) { double p = pow(10, (double)prec); return v_float(nearbyint(x * p) / p); }
        char buf[720];   /* %.300f of 1.8e308 */
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        return v_float(strtod(buf, NULL));
    }
    double p = pow(10, (double)prec);
    if (!strcmp(method, "ceil")) return v_float(ceil(x * p) / p);
    if (!strcmp(method, "floor")) return v_float(floor(x * p) / p);
    tpl_fail(c, "method must be common, ceil or floor");
}

static val html_escape(tpl_ctx *c, tstr *s) {
    sbuf b = {.c = c};
    for (size_t i = 0; i < s->n; i++) {
        switch (s->p[i]) {
        case '&': sb_cstr(&b, "&amp;"); break;
        case '<': sb_cstr(&b, "&lt;"); break;
        case '>': sb_cstr(&b, "&gt;"); break;
        case '"': sb_cstr(&b, "&#34;"); break;
        case '\'': sb_cstr(&b, "&#39;"); break;
        default: sb_put(&b, s->p + i, 1);
        }
    }
    return v_str(sb_take(&b));
}

static val apply_filter(tpl_ctx *c, frame *f, const char *nm, val v, args_t *a) {
#define F(s) (!strcmp(nm, s))
    if (F("tojson")) return do_tojson(c, v, a, 0);
    if (F("safe")) return v;
    if (F("string")) return v_str(tpl_to_str(c, v));
    if (F("trim")) {
        val ch = arg(a, 0, "chars", v_none());
        return strip(c, tpl_to_str(c, v), ch.t == V_STR ? ch.s : NULL, 3);
    }
    if (F("length") || F("count")) return v_int(length(c, v));
    if (F("lower")) return casemap(c, tpl_to_str(c, v), 0);
    if (F("upper")) return casemap(c, tpl_to_str(c, v), 1);
    if (F("capitalize")) return casemap(c, tpl_to_str(c, v), 2);
    if (F("title")) return casemap(c, tpl_to_str(c, v), 4);
    if (F("e") || F("escape") || F("forceescape")) return html_escape(c, tpl_to_str(c, v));
    if (F("default") || F("d")) {
        val dv = arg(a, 0, "default_value", cstr(c, "")), bl = arg(a, 1, "boolean", v_bool(false));
        if (v.t == V_UNDEF || (tpl_truthy(bl) && !tpl_truthy(v))) return dv;
        return v;
    }
    if (F("first")) {
        if (v.t == V_UNDEF) tpl_undef_fail(c, v);
        tlist *l = iter_list(c, v);
        return l->n ? l->v[0] : tpl_undef_msg(c, "No first item, sequence was empty.");
    }
    if (F("last")) {
        if (v.t == V_DICT) tpl_fail(c, "'dict' object is not reversible");
        if ((v.t == V_LIST || v.t == V_TUPLE) && v.l->gen) tpl_fail(c, "'generator' object is not reversible");
        if (v.t == V_UNDEF) tpl_undef_fail(c, v);
        tlist *l = iter_list(c, v);
        return l->n ? l->v[l->n - 1] : tpl_undef_msg(c, "No last item, sequence was empty.");
    }
    if (F("list")) { tlist *l = iter_list(c, v), *o = tpl_list_new(c, l->n); for (int64_t i = 0; i < l->n; i++) tpl_list_push(c, o, l->v[i]); return mklist(o, V_LIST); }
    if (F("reverse")) {   /* a str reversed; reversed(list) is an iterator; a generator becomes a list */
        if (v.t == V_STR) return do_slice(c, v, v_none(), v_none(), v_int(-1));
        bool was_gen = (v.t == V_LIST || v.t == V_TUPLE) && v.l->gen;
        tlist *l = iter_list(c, v), *o = tpl_list_new(c, l->n);
        for (int64_t i = l->n - 1; i >= 0; i--) tpl_list_push(c, o, l->v[i]);
        return was_gen ? mklist(o, V_LIST) : mkgen(o);
    }
    if (F("join")) {
        val sep = arg(a, 0, "d", cstr(c, "")), at = arg(a, 1, "attribute", v_none());
        tlist *l = iter_list(c, v);
        tstr *s = tpl_to_str(c, sep);
        sbuf b = {.c = c};
        for (int64_t i = 0; i < l->n; i++) {
            if (i) sb_put(&b, s->p, s->n);
            val x = at.t == V_NONE ? l->v[i] : attr_path(c, l->v[i], tpl_to_str(c, at));
            tpl_write_str(&b, x);
        }
        return v_str(sb_take(&b));
    }
    if (F("map")) {
        tlist *l = tpl_truthy(v) ? iter_list(c, v) : tpl_list_new(c, 0), *o = tpl_list_new(c, l->n);
        val at = arg(a, -1, "attribute", v_undef(NULL));
        if (at.t != V_UNDEF) {
            val dflt = arg(a, -1, "default", v_undef(NULL));
            for (int64_t i = 0; i < l->n; i++) {
                val x = attr_path(c, l->v[i], tpl_to_str(c, at));
                tpl_list_push(c, o, x.t == V_UNDEF && dflt.t != V_UNDEF ? dflt : x);
            }
        } else {
            if (!a->npos) tpl_fail(c, "map requires a filter argument");
            const char *fn = want_str(c, a->pos[0], "map's filter name")->p;
            args_t fa = {.pos = a->pos + 1, .npos = a->npos - 1, .kwn = a->kwn, .kwv = a->kwv, .nkw = a->nkw};
            for (int64_t i = 0; i < l->n; i++) tpl_list_push(c, o, apply_filter(c, f, fn, l->v[i], &fa));
        }
        return mkgen(o);
    }
    if (F("select")) return select_like(c, f, v, a, false, true);
    if (F("reject")) return select_like(c, f, v, a, false, false);
    if (F("selectattr")) return select_like(c, f, v, a, true, true);
    if (F("rejectattr")) return select_like(c, f, v, a, true, false);
    if (F("items")) {
        if (v.t == V_UNDEF) return mklist(tpl_list_new(c, 0), V_LIST);
        if (v.t != V_DICT) tpl_fail(c, "Can only get item pairs from a mapping.");
        tlist *o = tpl_list_new(c, v.d->n);
        for (int64_t i = 0; i < v.d->n; i++) {
            tlist *p = tpl_list_new(c, 2);
            tpl_list_push(c, p, v.d->k[i]);
            tpl_list_push(c, p, v.d->v[i]);
            tpl_list_push(c, o, mklist(p, V_TUPLE));
        }
        return mkgen(o);
    }
    if (F("dictsort")) {
        if (v.t != V_DICT) tpl_fail(c, "dictsort expects a mapping, got %s", tpl_type_name(v));
        bool cs = tpl_truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val by = arg(a, 1, "by", cstr(c, "key"));
        bool rev = tpl_truthy(arg(a, 2, "reverse", v_bool(false)));
        int pos = str_is(by, "key") ? 0 : str_is(by, "value") ? 1 : -1;
        if (pos < 0) tpl_fail(c, "You can only sort by either \"key\" or \"value\"");
        val items = apply_filter(c, f, "items", v, a);
        val *keys = tpl_alloc(&c->a, (size_t)(items.l->n + 1) * sizeof *keys);
        for (int64_t i = 0; i < items.l->n; i++) keys[i] = sort_key(c, items.l->v[i].l->v[pos], cs);
        return mklist(sorted(c, items.l, keys, rev), V_LIST);
    }
    if (F("sort")) {
        bool rev = tpl_truthy(arg(a, 0, "reverse", v_bool(false)));
        bool cs = tpl_truthy(arg(a, 1, "case_sensitive", v_bool(false)));
        val at = arg(a, 2, "attribute", v_none());
        tlist *l = iter_list(c, v);
        val *keys = tpl_alloc(&c->a, (size_t)(l->n + 1) * sizeof *keys);
        for (int64_t i = 0; i < l->n; i++) keys[i] = sort_key(c, at.t == V_NONE ? l->v[i] : attr_path(c, l->v[i], tpl_to_str(c, at)), cs);
        return mklist(sorted(c, l, keys, rev), V_LIST);
    }
    if (F("unique")) {
        bool cs = tpl_truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val at = arg(a, 1, "attribute", v_none());
        tlist *l = iter_list(c, v), *o = tpl_list_new(c, 0), *seen = tpl_list_new(c, 0);
        for (int64_t i = 0; i < l->n; i++) {
            val k = sort_key(c, at.t == V_NONE ? l->v[i] : attr_path(c, l->v[i], tpl_to_str(c, at)), cs);
            val sv = mklist(seen, V_LIST);
            if (contains(c, k, sv)) continue;
            tpl_list_push(c, seen, k);
            tpl_list_push(c, o, l->v[i]);
        }
        return mkgen(o);
    }
    if (F("min") || F("max")) {
        bool cs = tpl_truthy(arg(a, 0, "case_sensitive", v_bool(false)));
        val at = arg(a, 1, "attribute", v_none());
        tlist *l = iter_list(c, v);
        if (!l->n) return tpl_undef_msg(c, "No aggregated item, sequence was empty.");
        int64_t best = 0;
        val bk = sort_key(c, at.t == V_NONE ? l->v[0] : attr_path(c, l->v[0], tpl_to_str(c, at)), cs);
        for (int64_t i = 1; i < l->n; i++) {
            val k = sort_key(c, at.t == V_NONE ? l->v[i] : attr_path(c, l->v[i], tpl_to_str(c, at)), cs);
            int r = tpl_cmp(c, k, bk, "<");
            if (F("min") ? r < 0 : r > 0) { best = i; bk = k; }
        }
        return l->v[best];
    }
    if (F("sum")) {
        val at = arg(a, 0, "attribute", v_none());
        val acc = arg(a, 1, "start", v_int(0));
        tlist *l = iter_list(c, v);
        for (int64_t i = 0; i < l->n; i++) acc = binop(c, OP_ADD, acc, at.t == V_NONE ? l->v[i] : attr_path(c, l->v[i], tpl_to_str(c, at)));
        return acc;
    }
    if (F("int")) return do_int(c, v, arg(a, 0, "default", v_int(0)), want_int(c, arg(a, 1, "base", v_int(10)), "int's base"));
    if (F("float")) return do_float(c, v, arg(a, 0, "default", v_float(0)));
    if (F("abs")) {
        if (v.t == V_INT) { if (v.i == INT64_MIN) tpl_fail(c, "integer overflow in abs"); return v_int(v.i < 0 ? -v.i : v.i); }
        if (v.t == V_BOOL) return v_int(v.b);
        if (v.t == V_FLOAT) return v_float(fabs(v.f));
        tpl_fail(c, "bad operand type for abs(): '%s'", tpl_type_name(v));
    }
    if (F("round")) {
        if (!is_num(v)) tpl_fail(c, "type %s doesn't define __round__ method", tpl_type_name(v));
        if (is_intish(v)) return v_int(as_i(v));   /* round(int, n) stays an int */
        return do_round(c, v, want_int(c, arg(a, 0, "precision", v_int(0)), "round's precision"),
                        want_str(c, arg(a, 1, "method", cstr(c, "common")), "round's method")->p);
    }
    if (F("replace")) {
        tstr *s = tpl_to_str(c, v);
        val cnt = arg(a, 2, "count", v_none());
        return replace(c, s, tpl_to_str(c, arg(a, 0, "old", cstr(c, ""))), tpl_to_str(c, arg(a, 1, "new", cstr(c, ""))),
                       cnt.t == V_NONE ? -1 : want_int(c, cnt, "replace's count"));
    }
    if (F("indent")) {
        if (v.t != V_STR) tpl_fail(c, "unsupported operand type(s) for +=: '%s' and 'str'", tpl_type_name(v));
        return do_indent(c, v.s, arg(a, 0, "width", v_int(4)), tpl_truthy(arg(a, 1, "first", v_bool(false))),
                         tpl_truthy(arg(a, 2, "blank", v_bool(false))));
    }
    if (F("wordcount")) {
        tstr *s = tpl_to_str(c, v);
        int64_t n = 0;
        bool in = false;
        for (size_t i = 0; i < s->n; i = tpl_u8next(s->p, s->n, i)) {
            int32_t u = (int32_t)tpl_u8dec(s->p, s->n, i);
            utf8proc_category_t cat = utf8proc_category(u);
            bool w = u == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                     (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
            if (w && !in) n++;
            in = w;
        }
        return v_int(n);
    }
    if (F("attr")) {   /* Python getattr only: a dict's keys are not attributes */
        const char *nm2 = want_str(c, arg(a, 0, "name", v_undef(NULL)), "attr's name")->p;
        if (v.t == V_DICT || v.t == V_LIST || v.t == V_STR || v.t == V_TUPLE)
            return tpl_undef_msg(c, "'%s' has no attribute '%s'", type_obj(v), nm2);
        return getattr_(c, v, nm2);
    }
    if (F("format")) {
        if (a->nkw && a->npos) tpl_fail(c, "can't handle positional and keyword arguments at the same time");
        tlist *t = tpl_list_new(c, a->npos);
        for (int i = 0; i < a->npos; i++) tpl_list_push(c, t, a->pos[i]);
        return py_mod_format(c, tpl_to_str(c, v), mklist(t, V_TUPLE));
    }
    if (F("batch")) {
        int64_t k = want_int(c, arg(a, 0, "linecount", v_undef(NULL)), "batch's size");
        if (k <= 0) tpl_fail(c, "batch size must be positive");
        val fill = arg(a, 1, "fill_with", v_none());
        tlist *l = iter_list(c, v), *o = tpl_list_new(c, 0), *cur = NULL;
        for (int64_t i = 0; i < l->n; i++) {
            if (!cur || cur->n == k) { cur = tpl_list_new(c, k); tpl_list_push(c, o, mklist(cur, V_LIST)); }
            tpl_list_push(c, cur, l->v[i]);
        }
        if (cur && fill.t != V_NONE) while (cur->n < k) tpl_list_push(c, cur, fill);
        return mkgen(o);
    }
    if (F("truncate")) {
        if (v.t != V_STR && v.t != V_LIST && v.t != V_TUPLE && v.t != V_DICT) tpl_fail(c, "object of type '%s' has no len()", tpl_type_name(v));
        tstr *s = tpl_to_str(c, v);
        int64_t len = want_int(c, arg(a, 0, "length", v_int(255)), "truncate's length");
        bool kill = tpl_truthy(arg(a, 1, "killwords", v_bool(false)));
        tstr *end = tpl_to_str(c, arg(a, 2, "end", cstr(c, "...")));
        int64_t leeway = want_int(c, arg(a, 3, "leeway", v_int(5)), "truncate's leeway");
        int64_t n = tpl_u8len(s->p, s->n), el = tpl_u8len(end->p, end->n);
        if (n <= len + leeway) return v_str(s);
        val cut = do_slice(c, v_str(s), v_none(), v_int(len - el > 0 ? len - el : 0), v_none());
        sbuf b = {.c = c};
        if (kill) sb_put(&b, cut.s->p, cut.s->n);
        else {
            const char *sp = NULL;
            for (size_t i = cut.s->n; i > 0; i--) if (cut.s->p[i - 1] == ' ') { sp = cut.s->p + i - 1; break; }
            sb_put(&b, cut.s->p, sp ? (size_t)(sp - cut.s->p) : cut.s->n);
        }
        sb_put(&b, end->p, end->n);
        return v_str(sb_take(&b));
    }
    if (F("center")) {
        tstr *s = tpl_to_str(c, v);
        int64_t w = want_int(c, arg(a, 0, "width", v_int(80)), "center's width"), n = tpl_u8len(s->p, s->n);
        if (w <= n) return v_str(s);
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        sbuf b = {.c = c};
        for (int64_t i = 0; i < left; i++) sb_cstr(&b, " ");
        sb_put(&b, s->p, s->n);
        for (int64_t i = 0; i < pad - left; i++) sb_cstr(&b, " ");
        return v_str(sb_take(&b));
    }
#undef F
    tpl_fail(c, "No filter named '%s'.", nm);
}

/* ------------------------------------------------------------------ methods */
static bool method_call(tpl_ctx *c, val obj, const char *m, args_t *a, val *out) {
#define M(s) (!strcmp(m, s))
    if (obj.t == V_STR) {
        tstr *s = obj.s;
        val a0 = arg(a, 0, "", v_none());
        if (M("strip") || M("lstrip") || M("rstrip")) {
            *out = strip(c, s, a0.t == V_STR ? a0.s : NULL, M("strip") ? 3 : M("lstrip") ? 1 : 2);
            return true;
        }
        if (M("split") || M("rsplit")) {
            val sep = arg(a, 0, "sep", v_none());
            int64_t mx = want_int(c, arg(a, 1, "maxsplit", v_int(-1)), "maxsplit");
            if (M("rsplit") && mx >= 0) tpl_fail(c, "str.rsplit with maxsplit is not supported");
            *out = split(c, s, sep, mx);
            return true;
        }
        if (M("splitlines")) { *out = mklist(splitlines(c, s), V_LIST); return true; }
        if (M("startswith") || M("endswith")) { *out = v_bool(affix(c, s, a0, M("endswith"))); return true; }
        if (M("replace")) {
            val cnt = arg(a, 2, "count", v_int(-1));
            *out = replace(c, s, want_str(c, a0, "replace's old"), want_str(c, arg(a, 1, "", v_undef(NULL)), "replace's new"),
                           want_int(c, cnt, "replace's count"));
            return true;
        }
        if (M("upper")) { *out = casemap(c, s, 1); return true; }
        if (M("lower")) { *out = casemap(c, s, 0); return true; }
        if (M("title")) { *out = casemap(c, s, 3); return true; }
        if (M("capitalize")) { *out = casemap(c, s, 2); return true; }
        if (M("swapcase")) { *out = casemap(c, s, 5); return true; }
        if (M("format")) { *out = str_format(c, s, a); return true; }
        if (M("join")) {
            tlist *l = iter_list(c, a0);
            sbuf b = {.c = c};
            for (int64_t i = 0; i < l->n; i++) {
                if (i) sb_put(&b, s->p, s->n);
                sb_put(&b, want_str(c, l->v[i], "joined item")->p, l->v[i].s->n);
            }
            *out = v_str(sb_take(&b));
            return true;
        }
        if (M("find") || M("rfind") || M("index") || M("rindex") || M("count")) {
            tstr *sub = want_str(c, a0, "the substring");
            int64_t found = -1, cnt = 0;
            for (size_t i = 0; i + sub->n <= s->n;) {
                if (!memcmp(s->p + i, sub->p, sub->n)) {
                    cnt++;
                    if (found < 0 || M("rfind") || M("rindex")) found = tpl_u8len(s->p, i);
                    if (M("find") || M("index")) break;
                    i += sub->n ? sub->n : 1;
                } else i++;
            }
            if (M("count")) { *out = v_int(sub->n ? cnt : tpl_u8len(s->p, s->n) + 1); return true; }
            if (found < 0 && (M("index") || M("rindex"))) tpl_fail(c, "substring not found");
            *out = v_int(found);
            return true;
        }
        if (M("isdigit") || M("isalpha") || M("isspace") || M("isalnum") || M("isupper") || M("islower") || M("isnumeric")) {
            bool r = s->n > 0, cased = false;
            for (size_t i = 0; i < s->n; i = tpl_u8next(s->p, s->n, i)) {
                int32_t u = (int32_t)tpl_u8dec(s->p, s->n, i);
                utf8proc_category_t cat = utf8proc_category(u);
                bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
                bool digit = cat == UTF8PROC_CATEGORY_ND;
                if (M("isdigit") || M("isnumeric")) r &= digit;
                else if (M("isalpha")) r &= alpha;
                else if (M("isspace")) r &= py_space((uint32_t)u);
                else if (M("isalnum")) r &= alpha || digit;
                else if (M("isupper")) { r &= !utf8proc_islower(u); cased |= utf8proc_isupper(u); }
                else { r &= !utf8proc_isupper(u); cased |= utf8proc_islower(u); }
            }
            if (M("isupper") || M("islower")) r &= cased;
            *out = v_bool(r);
            return true;
        }
        if (M("removeprefix") || M("removesuffix")) {
            tstr *p = want_str(c, a0, "the affix");
            bool end = M("removesuffix");
            if (affix(c, s, a0, end)) *out = end ? mkstr(c, s->p, s->n - p->n) : mkstr(c, s->p + p->n, s->n - p->n);
            else *out = obj;
            return true;
        }
        return false;
    }
    if (obj.t == V_DICT) {
        if (M("items") || M("keys") || M("values")) {
            if (M("items")) { *out = apply_filter(c, NULL, "items", obj, a); out->l->gen = false; return true; }
            tlist *o = tpl_list_new(c, obj.d->n);
            for (int64_t i = 0; i < obj.d->n; i++) tpl_list_push(c, o, M("keys") ? obj.d->k[i] : obj.d->v[i]);
            *out = mklist(o, V_LIST);
            return true;
        }
        if (M("get")) {
            val *v = tpl_dict_get(obj.d, arg(a, 0, "", v_none()));
            *out = v ? *v : arg(a, 1, "", v_none());
            return true;
        }
        if (M("copy")) { val d = {.t = V_DICT}; d.d = tpl_dict_new(c); for (int64_t i = 0; i < obj.d->n; i++) tpl_dict_set(c, d.d, obj.d->k[i], obj.d->v[i]); *out = d; return true; }
        if (M("pop") || M("popitem") || M("setdefault") || M("update") || M("clear"))
            tpl_fail(c, "access to attribute '%s' of 'dict' object is unsafe.", m);
        return false;
    }
    if (obj.t == V_LIST || obj.t == V_TUPLE) {
        if (M("index") || M("count")) {
            val x = arg(a, 0, "", v_none());
            int64_t cnt = 0, first = -1;
            for (int64_t i = 0; i < obj.l->n; i++) if (tpl_eq(obj.l->v[i], x)) { cnt++; if (first < 0) first = i; }
            if (M("index") && first < 0) tpl_fail(c, "value is not in list");
            *out = v_int(M("count") ? cnt : first);
            return true;
        }
        if (obj.t == V_LIST && (M("append") || M("extend") || M("insert") || M("pop") || M("remove") || M("reverse") ||
                                M("sort") || M("clear")))
            tpl_fail(c, "access to attribute '%s' of 'list' object is unsafe.", m);
        return false;
    }
    if (obj.t == V_LOOP && M("changed")) {
        tlist *now = tpl_list_new(c, a->npos);
        for (int i = 0; i < a->npos; i++) tpl_list_push(c, now, a->pos[i]);
        val nv = mklist(now, V_TUPLE);
        bool changed = obj.lp->last_changed.t == V_UNDEF || !tpl_eq(obj.lp->last_changed, nv);
        obj.lp->last_changed = nv;
        *out = v_bool(changed);
        return true;
    }
    if (obj.t == V_LOOP && M("cycle")) {
        if (!a->npos) tpl_fail(c, "no items for cycling given");
        *out = a->pos[obj.lp->i % a->npos];
        return true;
    }
#undef M
    return false;
}

/* ------------------------------------------------------------------ expressions */
static val eval_filter_chain(tpl_ctx *c, frame *f, node *n, val *input) {
    val v = n->a ? (n->a->kind == N_FILTER ? eval_filter_chain(c, f, n->a, input) : eval(c, f, n->a)) : *input;
    step(c, n);
    args_t a;
    eval_args(c, f, n, &a, NULL);
    return apply_filter(c, f, n->name, v, &a);
}

static val eval_(tpl_ctx *c, frame *f, node *n);
#define MAX_NEST 1500
static val eval(tpl_ctx *c, frame *f, node *n) {
    if (++c->nest > MAX_NEST) { c->line = n->line; c->col = n->col; tpl_fail(c, "the template nests calls and expressions too deeply (limit)"); }
    val v = eval_(c, f, n);
    c->nest--;
    return v;
}
static val eval_(tpl_ctx *c, frame *f, node *n) {
    step(c, n);
    switch (n->kind) {
    case N_CONST: return n->lit;
    case N_NAME: {
        val *v = lookup(f, n->name);
        return v ? *v : tpl_undef_msg(c, "'%s' is undefined", n->name);
    }
    case N_LIST: case N_TUPLE: {
        tlist *l = tpl_list_new(c, n->args.n);
        for (int i = 0; i < n->args.n; i++) tpl_list_push(c, l, eval(c, f, n->args.v[i]));
        return mklist(l, n->kind == N_LIST ? V_LIST : V_TUPLE);
    }
    case N_DICT: {
        val d = {.t = V_DICT};
        d.d = tpl_dict_new(c);
        for (int i = 0; i < n->args.n; i++) {
            val k = eval(c, f, n->args.v[i]);
            if (k.t == V_LIST || k.t == V_DICT || k.t == V_NS) tpl_fail(c, "unhashable type: '%s'", tpl_type_name(k));
            tpl_dict_set(c, d.d, k, eval(c, f, n->kwargs.v[i]));
        }
        return d;
    }
    case N_GETATTR: { val o = eval(c, f, n->a); step(c, n); return getattr_(c, o, n->name); }
    case N_GETITEM: {
        val o = eval(c, f, n->a);
        if (n->b->kind == N_SLICE) {
            node *s = n->b;
            val a = s->a ? eval(c, f, s->a) : v_none(), b = s->b ? eval(c, f, s->b) : v_none(), st = s->c ? eval(c, f, s->c) : v_none();
            step(c, n);
            if (o.t == V_UNDEF) tpl_undef_fail(c, o);
            return do_slice(c, o, a, b, st);
        }
        val k = eval(c, f, n->b);
        step(c, n);
        return getitem(c, o, k);
    }
    case N_CALL: {
        args_t a;
        if (n->a->kind == N_GETATTR) {
            val o = eval(c, f, n->a->a);
            eval_args(c, f, n, &a, NULL);
            step(c, n);
            if (o.t == V_UNDEF) tpl_undef_fail(c, o);
            val r;
            if (method_call(c, o, n->a->name, &a, &r)) return r;
            val fn = getattr_(c, o, n->a->name);
            if (fn.t == V_UNDEF && (o.t == V_STR || o.t == V_LIST || o.t == V_TUPLE || o.t == V_DICT))
                tpl_fail(c, "'%s' object has no attribute '%s'", tpl_type_name(o), n->a->name);
            return call_value(c, f, fn, &a);
        }
        val fn = eval(c, f, n->a);
        eval_args(c, f, n, &a, NULL);
        step(c, n);
        return call_value(c, f, fn, &a);
    }
    case N_FILTER: return eval_filter_chain(c, f, n, NULL);
    case N_TEST: {
        val v = eval(c, f, n->a);
        args_t a;
        eval_args(c, f, n, &a, NULL);
        step(c, n);
        bool r = run_test(c, f, n->name, v, &a);
        return v_bool(n->flag ? !r : r);
    }
    case N_NOT: return v_bool(!tpl_truthy(eval(c, f, n->a)));
    case N_NEG: case N_POS: {
        val v = eval(c, f, n->a);
        step(c, n);
        if (v.t == V_INT) { if (n->kind == N_NEG && v.i == INT64_MIN) tpl_fail(c, "integer overflow"); return n->kind == N_NEG ? v_int(-v.i) : v; }
        if (v.t == V_BOOL) return v_int(n->kind == N_NEG ? -(int64_t)v.b : v.b);
        if (v.t == V_FLOAT) return n->kind == N_NEG ? v_float(-v.f) : v;
        if (v.t == V_UNDEF) tpl_undef_fail(c, v);
        tpl_fail(c, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", tpl_type_name(v));
    }
    case N_BIN: {
        val a = eval(c, f, n->a), b = eval(c, f, n->b);
        step(c, n);
        return binop(c, n->op, a, b);
    }
    case N_AND: { val a = eval(c, f, n->a); return tpl_truthy(a) ? eval(c, f, n->b) : a; }
    case N_OR: { val a = eval(c, f, n->a); return tpl_truthy(a) ? a : eval(c, f, n->b); }
    case N_COMPARE: {
        val a = eval(c, f, n->args.v[0]);
        for (int i = 0; i < n->kwargs.n; i++) {
            node *o = n->kwargs.v[i];
            val b = eval(c, f, o->a);
            step(c, o);
            if (!compare(c, o->op, a, b)) return v_bool(false);
            a = b;
        }
        return v_bool(true);
    }
    case N_CONCAT: {
        sbuf b = {.c = c};
        for (int i = 0; i < n->args.n; i++) tpl_write_str(&b, eval(c, f, n->args.v[i]));
        return v_str(sb_take(&b));
    }
    case N_COND:
        if (tpl_truthy(eval(c, f, n->a))) return eval(c, f, n->b);
        if (n->c) return eval(c, f, n->c);
        return tpl_undef_msg(c, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
    }
    tpl_fail(c, "internal error: unknown expression node %d", n->kind);
}

/* ------------------------------------------------------------------ statements */
static void bind_target(tpl_ctx *c, frame *f, node *t, val v) {
    if (t->kind == N_NAME) { assign(c, f, t->name, v); return; }
    if (t->kind == N_TUPLE) {
        tlist *l = (v.t == V_LIST || v.t == V_TUPLE) ? v.l : iter_list(c, v);
        if (l->n != t->args.n)
            tpl_fail(c, l->n > t->args.n ? "too many values to unpack (expected %d)" : "not enough values to unpack (expected %d, got %lld)",
                     t->args.n, (long long)l->n);
        for (int i = 0; i < t->args.n; i++) bind_target(c, f, t->args.v[i], l->v[i]);
        return;
    }
    if (t->kind == N_GETATTR) {
        val *ns = lookup(f, t->a->name);
        if (!ns || ns->t != V_NS) tpl_fail(c, "cannot assign attribute on non-namespace object");
        if (t->name[0] == '_')
            tpl_fail(c, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. Please rename the attribute.", t->name);
        tpl_dict_set(c, ns->d, cstr(c, t->name), v);
        return;
    }
    tpl_fail(c, "can't assign to this target");
}

static int exec_for(tpl_ctx *c, frame *f, node *n, val iterable, int depth, sbuf *out) {
    tlist *all = iter_list(c, iterable), *items = all;
    if (n->c) {   /* `for x in xs if cond`: filtered before loop.* is computed, as jinja2 does */
        items = tpl_list_new(c, 0);
        for (int64_t i = 0; i < all->n; i++) {
            step(c, n);
            frame *tf = new_frame(c, f);
            bind_target(c, tf, n->a, all->v[i]);
            if (tpl_truthy(eval(c, tf, n->c))) tpl_list_push(c, items, all->v[i]);
        }
    }
    tloop *lp = tpl_alloc(&c->a, sizeof *lp);
    lp->items = items;
    lp->depth = depth;
    lp->fornode = n;
    lp->outer = f;
    val lv = {.t = V_LOOP};
    lv.lp = lp;
    /* jinja2 clears its "no iteration" flag at the end of the loop body, so the else block
     * also runs when every iteration left early through break/continue */
    bool completed = false;
    for (int64_t i = 0; i < items->n; i++) {
        step(c, n);   /* an empty body still counts: loops are bounded by max_steps */
        lp->i = i;
        frame *itf = new_frame(c, f);
        bind_target(c, itf, n->a, items->v[i]);
        assign(c, itf, "loop", lv);
        int r = exec(c, itf, n->d, out);
        if (!r) completed = true;
        if (r == 1) break;
    }
    if (!completed && n->args.n) exec(c, f, n->args.v[0], out);
    return 0;
}

/* a {% macro %}, or the caller() of a {% call %} block, closing over frame f */
static val new_macro(tpl_ctx *c, node *def, frame *f, const char *name) {
    tmacro *m = tpl_alloc(&c->a, sizeof *m);
    m->def = def;
    m->closure = f;
    m->name = name;
    val v = {.t = V_MACRO};
    v.m = m;
    return v;
}

static int exec_(tpl_ctx *c, frame *f, node *body, sbuf *out);
static int exec(tpl_ctx *c, frame *f, node *body, sbuf *out) {
    if (++c->nest > MAX_NEST) tpl_fail(c, "the template nests calls and blocks too deeply (limit)");
    int r = exec_(c, f, body, out);
    c->nest--;
    return r;
}
static int exec_(tpl_ctx *c, frame *f, node *body, sbuf *out) {
    for (int i = 0; i < body->args.n; i++) {
        node *n = body->args.v[i];
        step(c, n);
        switch (n->kind) {
        case S_TEXT: sb_put(out, n->lit.s->p, n->lit.s->n); break;
        case S_OUT: {
            val v = eval(c, f, n->a);
            tpl_write_str(out, v);
            break;
        }
        case S_BODY: { int r = exec(c, f, n, out); if (r) return r; break; }
        case S_IF: {
            node *x = n;
            while (x && x->kind == S_IF) {
                if (tpl_truthy(eval(c, f, x->a))) { int r = exec(c, f, x->b, out); if (r) return r; x = NULL; break; }
                x = x->c;
            }
            if (x) { int r = exec(c, f, x, out); if (r) return r; }
            break;
        }
        case S_FOR: exec_for(c, f, n, eval(c, f, n->b), 1, out); break;
        case S_SET: bind_target(c, f, n->a, eval(c, f, n->b)); break;
        case S_SETBLOCK: {   /* its own scope; inline in jinja2: a break/continue inside leaves it */
            sbuf b = {.c = c};
            int r = exec(c, new_frame(c, f), n->b, &b);
            if (r) return r;
            val v = v_str(sb_take(&b));
            if (n->c) v = eval_filter_chain(c, f, n->c, &v);
            bind_target(c, f, n->a, v);
            break;
        }
        case S_MACRO: assign(c, f, n->name, new_macro(c, n, f, n->name)); break;
        case S_CALLBLOCK: {
            val cv = new_macro(c, n, f, "caller");
            /* the call expression: the callee receives caller() */
            node *call = n->a;
            val fn = call->a->kind == N_GETATTR ? getattr_(c, eval(c, f, call->a->a), call->a->name) : eval(c, f, call->a);
            args_t a;
            eval_args(c, f, call, &a, NULL);
            c->line = n->line;
            c->col = n->col;
            if (fn.t != V_MACRO) { if (fn.t == V_UNDEF) tpl_undef_fail(c, fn); tpl_fail(c, "{%% call %%} needs a macro"); }
            tpl_write_str(out, call_macro(c, fn.m, &a, cv));
            break;
        }
        case S_FILTERBLOCK: {   /* its own scope, as a set block */
            sbuf b = {.c = c};
            int r = exec(c, new_frame(c, f), n->b, &b);
            if (r) return r;
            val v = v_str(sb_take(&b));
            tpl_write_str(out, eval_filter_chain(c, f, n->a, &v));
            break;
        }
        case S_WITH: {
            frame *wf = new_frame(c, f);
            for (int k = 0; k < n->args.n; k++) assign(c, wf, n->args.v[k]->name, eval(c, f, n->args.v[k]->a));
            int r = exec(c, wf, n->b, out);
            if (r) return r;
            break;
        }
        case S_BREAK: return 1;
        case S_CONTINUE: return 2;
        default: tpl_fail(c, "internal error: unknown statement node %d", n->kind);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ JSON in */
static val from_json(tpl_ctx *c, const cJSON *j, int depth) {
    if (depth > 200) tpl_fail(c, "input JSON nested deeper than 200 levels");
    if (!j || cJSON_IsNull(j)) return v_none();
    if (cJSON_IsBool(j)) return v_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON does not keep the literal: integral values within int64 become ints, as
         * json.loads makes "3" an int (a literal "3.0" becomes 3 here; noted in the README) */
        if (d == floor(d) && fabs(d) < 9.2e18) return v_int((int64_t)d);
        return v_float(d);
    }
    if (cJSON_IsString(j)) return cstr(c, j->valuestring);
    if (cJSON_IsArray(j)) {
        tlist *l = tpl_list_new(c, cJSON_GetArraySize(j));
        for (const cJSON *e = j->child; e; e = e->next) tpl_list_push(c, l, from_json(c, e, depth + 1));
        return mklist(l, V_LIST);
    }
    if (cJSON_IsObject(j)) {
        val d = {.t = V_DICT};
        d.d = tpl_dict_new(c);
        for (const cJSON *e = j->child; e; e = e->next) tpl_dict_set(c, d.d, cstr(c, e->string ? e->string : ""), from_json(c, e, depth + 1));
        return d;
    }
    return v_none();
}

/* transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r} */
static val alias_reasoning(tpl_ctx *c, val m) {
    if (m.t != V_DICT) return m;
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    val *r = NULL;
    for (int i = 0; i < 3 && !r; i++) { val *x = tpl_dict_gets(m.d, fields[i]); if (x && x->t != V_NONE) r = x; }
    if (!r) return m;
    val rv = *r;
    val d = {.t = V_DICT};
    d.d = tpl_dict_new(c);
    tpl_dict_set(c, d.d, cstr(c, "thinking"), rv);
    for (int64_t i = 0; i < m.d->n; i++) tpl_dict_set(c, d.d, m.d->k[i], m.d->v[i]);
    tpl_dict_set(c, d.d, cstr(c, "reasoning_content"), rv);
    return d;
}

/* ------------------------------------------------------------------ entry points */
static mmc_status render(const mmc_template *t, const cJSON *vars, const cJSON *messages, const cJSON *tools,
                         const cJSON *documents, int add_gen, bool chat, const mmc_template_limits *lim, char **out, size_t *len) {
    if (!t || !out) return mmc_error(MMC_ERR_INVALID, "mmc_template_render: NULL argument");
    *out = NULL;
    if (len) *len = 0;
    tpl_ctx *c = calloc(1, sizeof *c);
    if (!c) return mmc_error(MMC_ERR_OOM, "mmc_template_render: out of memory");
    mmc_template_limits L = lim ? *lim : (mmc_template_limits){0};
    c->a.limit = L.max_memory ? L.max_memory : (size_t)512 << 20;
    c->a.jb = &c->jb;
    c->a.err = c->err;
    c->a.err_cap = sizeof c->err;
    c->max_out = L.max_output ? L.max_output : (size_t)64 << 20;
    c->max_steps = L.max_steps ? L.max_steps : 100000000;
    c->max_depth = L.max_depth ? L.max_depth : 200;
    c->now = L.now;
    mmc_status st = MMC_OK;
    tpl_ctx *outer = tpl_current;   /* renders nest only through separate threads, but be safe */
    tpl_current = c;
    if (setjmp(c->jb)) {
        st = mmc_error(MMC_ERR_INVALID, "%s", c->err);   /* raise_exception(): the message alone */
        goto done;
    }
    c->globals = new_frame(c, NULL);
    static const struct { const char *n; int fn; } G[] = {{"range", F_RANGE}, {"namespace", F_NAMESPACE},
        {"raise_exception", F_RAISE}, {"strftime_now", F_STRFTIME}, {"dict", F_DICT}};
    for (size_t i = 0; i < sizeof G / sizeof *G; i++) { val v = {.t = V_FUNC}; v.fn = G[i].fn; assign(c, c->globals, G[i].n, v); }
    frame *top = new_frame(c, c->globals);
    if (chat) {
        val msgs = from_json(c, messages, 0);
        if (msgs.t == V_LIST)
            for (int64_t i = 0; i < msgs.l->n; i++) {
                if (msgs.l->v[i].t != V_DICT) tpl_fail(c, "Chat messages should be dicts, but message %lld is a %s", (long long)i, tpl_type_name(msgs.l->v[i]));
                msgs.l->v[i] = alias_reasoning(c, msgs.l->v[i]);
            }
        assign(c, top, "messages", msgs);
        assign(c, top, "tools", from_json(c, tools, 0));
        assign(c, top, "documents", from_json(c, documents, 0));
        assign(c, top, "add_generation_prompt", v_bool(add_gen));
    }
    if (vars && cJSON_IsObject(vars))
        for (const cJSON *e = vars->child; e; e = e->next) if (e->string) assign(c, top, e->string, from_json(c, e, 0));
    sbuf o = {.c = c};
    exec(c, top, t->root, &o);
    char *r = malloc(o.n + 1);
    if (!r) { st = mmc_error(MMC_ERR_OOM, "mmc_template_render: out of memory"); goto done; }
    if (o.n) memcpy(r, o.p, o.n);
    r[o.n] = 0;
    *out = r;
    if (len) *len = o.n;
done:
    tpl_current = outer;
    tpl_arena_free(&c->a);
    free(c);
    return st;
}

mmc_status mmc_template_render(const mmc_template *t, const cJSON *vars, const mmc_template_limits *lim, char **out, size_t *len) {
    return render(t, vars, NULL, NULL, NULL, 0, false, lim, out, len);
}

mmc_status mmc_template_render_chat(const mmc_template *t, const cJSON *messages, const cJSON *tools, const cJSON *documents,
                                    bool add_generation_prompt, const cJSON *extra, const mmc_template_limits *lim,
                                    char **out, size_t *len) {
    return render(t, extra, messages, tools, documents, add_generation_prompt, true, lim, out, len);
}

mmc_status mmc_template_parse(const char *src, int64_t n, mmc_template **out) {
    if (!src || !out) return mmc_error(MMC_ERR_INVALID, "mmc_template_parse: NULL argument");
    *out = NULL;
    mmc_template *t = calloc(1, sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "mmc_template_parse: out of memory");
    t->arena.limit = (size_t)256 << 20;
    t->arena.jb = &t->jb;
    t->arena.err = t->err;
    t->arena.err_cap = sizeof t->err;
    if (setjmp(t->jb)) {
        mmc_status st = mmc_error(MMC_ERR_FORMAT, "%s", t->err);
        tpl_arena_free(&t->arena);
        free(t);
        return st;
    }
    tpl_parse(t, src, n < 0 ? strlen(src) : (size_t)n);
    *out = t;
    return MMC_OK;
}

void mmc_template_free(mmc_template *t) {
    if (!t) return;
    tpl_arena_free(&t->arena);
    free(t);
}
