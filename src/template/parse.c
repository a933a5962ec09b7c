/* parse.c — lexer and parser of the Jinja chat-template engine.
 *
 * Mirrors jinja2 3.1's lexer.py and parser.py as configured by transformers
 * (trim_blocks=True, lstrip_blocks=True, loopcontrols, keep_trailing_newline=False):
 * "\r\n"/"\r" become "\n" and one trailing newline is dropped; `{%-`/`-%}` strip all
 * whitespace beside the tag; a block or comment tag alone on its line after spaces loses
 * those spaces (lstrip_blocks, not for `{%+`), and the newline after `%}`/`#}` goes
 * (trim_blocks, not for `+%}`). String literals unescape as Python's unicode-escape does.
 * The grammar and precedence are jinja2's: condexpr > or > and > not > compare (in, not in,
 * chained) > + - > ~ > * / // % > ** (left-associative) > unary - + > postfix (. [] ())
 * > filters | and tests `is`. Every node records its line and column for errors. */
#include "tpl_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_EOF, K_TEXT, K_VBEGIN, K_VEND, K_BBEGIN, K_BEND, K_NAME, K_STR, K_INT, K_FLOAT, K_OP };
typedef struct {
    uint8_t k;
    int line, col;
    const char *p;     /* K_NAME/K_OP: the spelling; K_TEXT/K_STR: decoded text */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct {
    mmc_template *t;
    tpl_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    size_t line_start;
    token *tk;
    int ntk, captk;
    int cur;
    int depth;
    int loops;   /* for-bodies around the current statement, within the current macro */
} parser;

#define MAX_PARSE_DEPTH 150

static _Noreturn void perr(parser *P, int line, int col, const char *fmt, ...) {
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(P->t->err, sizeof P->t->err, "template syntax error at line %d, column %d: %s", line, col, msg);
    longjmp(P->t->jb, 1);
}

/* ------------------------------------------------------------------ lexer */
static void advance_to(parser *P, size_t to) {
    for (size_t i = P->pos; i < to && i < P->n; i++)
        if (P->s[i] == '\n') { P->line++; P->line_start = i + 1; }
    P->pos = to;
}
static int col_of(parser *P, size_t pos) { return (int)(pos - P->line_start) + 1; }

static token *push(parser *P, int k, size_t at) {
    if (P->ntk == P->captk) {
        int c = P->captk ? 2 * P->captk : 256;
        token *nt = tpl_alloc(P->a, (size_t)c * sizeof *nt);
        if (P->ntk) memcpy(nt, P->tk, (size_t)P->ntk * sizeof *nt);
        P->tk = nt;
        P->captk = c;
    }
    token *t = &P->tk[P->ntk++];
    memset(t, 0, sizeof *t);
    t->k = (uint8_t)k;
    t->line = P->line;
    t->col = col_of(P, at);
    return t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void put_utf8(char *o, size_t *k, uint32_t c) {
    if (c < 0x80) o[(*k)++] = (char)c;
    else if (c < 0x800) { o[(*k)++] = (char)(0xC0 | c >> 6); o[(*k)++] = (char)(0x80 | (c & 63)); }
    else if (c < 0x10000) {
        o[(*k)++] = (char)(0xE0 | c >> 12); o[(*k)++] = (char)(0x80 | (c >> 6 & 63));
        o[(*k)++] = (char)(0x80 | (c & 63));
    } else {
        o[(*k)++] = (char)(0xF0 | c >> 18); o[(*k)++] = (char)(0x80 | (c >> 12 & 63));
        o[(*k)++] = (char)(0x80 | (c >> 6 & 63)); o[(*k)++] = (char)(0x80 | (c & 63));
    }
}
static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* a quoted string at P->pos; Python unicode-escape semantics */
static void lex_string(parser *P) {
    size_t st = P->pos;
    char q = P->s[st];
    size_t e = st + 1;
    while (e < P->n && P->s[e] != q) e += P->s[e] == '\\' ? 2 : 1;
    if (e >= P->n) perr(P, P->line, col_of(P, st), "unexpected end of string");
    token *t = push(P, K_STR, st);
    char *o = tpl_alloc(P->a, e - st + 1);
    size_t k = 0;
    for (size_t i = st + 1; i < e; i++) {
        char c = P->s[i];
        if (c != '\\') { o[k++] = c; continue; }
        char d = P->s[++i];
        int nh = 0;
        switch (d) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': nh = 2; break;
        case 'u': nh = 4; break;
        case 'U': nh = 8; break;
        default:
            if (d >= '0' && d <= '7') {
                uint32_t v = 0;
                int m = 0;
                while (m < 3 && i < e && P->s[i] >= '0' && P->s[i] <= '7') v = v * 8 + (uint32_t)(P->s[i++] - '0'), m++;
                i--;
                put_utf8(o, &k, v);
            } else { o[k++] = '\\'; o[k++] = d; }
        }
        if (nh) {
            uint32_t v = 0;
            for (int m = 0; m < nh; m++) {
                int h = i + 1 + m < e ? hexv(P->s[i + 1 + m]) : -1;
                if (h < 0) perr(P, P->line, col_of(P, i), "truncated \\%c escape in a string literal", d);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) perr(P, P->line, col_of(P, i), "illegal Unicode character in a string literal");
            i += (size_t)nh;
            put_utf8(o, &k, v);
        }
    }
    t->p = o;
    t->n = k;
    advance_to(P, e + 1);
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                  ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";"};

/* tokens of one tag up to and including its end marker (whitespace control applied after it) */
static void lex_tag(parser *P, bool block) {
    int depth = 0;
    for (;;) {
        while (P->pos < P->n && is_ws(P->s[P->pos])) advance_to(P, P->pos + 1);
        if (P->pos >= P->n) perr(P, P->line, col_of(P, P->pos), "unexpected end of template, expected '%s'", block ? "%}" : "}}");
        const char *c = P->s + P->pos;
        size_t left = P->n - P->pos;
        char e0 = block ? '%' : '}';
        /* end markers: -%} / +%} / %} (or -}} / }}) — only outside brackets for }} */
        int mod = 0;
        size_t elen = 0;
        if ((c[0] == '-' || c[0] == '+') && left >= 3 && c[1] == e0 && c[2] == '}') { mod = c[0]; elen = 3; }
        else if (left >= 2 && c[0] == e0 && c[1] == '}' && (block || depth == 0)) elen = 2;
        if (mod == '+' && !block) elen = 0;
        if (elen) {
            push(P, block ? K_BEND : K_VEND, P->pos);
            advance_to(P, P->pos + elen);
            if (mod == '-') { while (P->pos < P->n && is_ws(P->s[P->pos])) advance_to(P, P->pos + 1); }
            else if (block && mod != '+' && P->pos < P->n && P->s[P->pos] == '\n') advance_to(P, P->pos + 1);
            return;
        }
        size_t st = P->pos;
        if (c[0] == '\'' || c[0] == '"') { lex_string(P); continue; }
        if ((c[0] >= 'a' && c[0] <= 'z') || (c[0] >= 'A' && c[0] <= 'Z') || c[0] == '_') {
            size_t e = st;
            while (e < P->n && ((P->s[e] >= 'a' && P->s[e] <= 'z') || (P->s[e] >= 'A' && P->s[e] <= 'Z') ||
                                (P->s[e] >= '0' && P->s[e] <= '9') || P->s[e] == '_'))
                e++;
            token *t = push(P, K_NAME, st);
            t->p = P->s + st;
            t->n = e - st;
            advance_to(P, e);
            continue;
        }
        if (c[0] >= '0' && c[0] <= '9') {
            size_t e = st;
            bool isf = false;
            char buf[128];
            size_t k = 0;
            while (e < P->n && ((P->s[e] >= '0' && P->s[e] <= '9') || P->s[e] == '_')) { if (P->s[e] != '_' && k < 120) buf[k++] = P->s[e]; e++; }
            if (e + 1 < P->n && P->s[e] == '.' && P->s[e + 1] >= '0' && P->s[e + 1] <= '9') {
                isf = true;
                buf[k++] = P->s[e++];
                while (e < P->n && ((P->s[e] >= '0' && P->s[e] <= '9') || P->s[e] == '_')) { if (P->s[e] != '_' && k < 120) buf[k++] = P->s[e]; e++; }
            }
            if (e < P->n && (P->s[e] == 'e' || P->s[e] == 'E')) {
                size_t f = e + 1;
                if (f < P->n && (P->s[f] == '+' || P->s[f] == '-')) f++;
                if (f < P->n && P->s[f] >= '0' && P->s[f] <= '9') {
                    isf = true;
                    while (e < f && k < 120) buf[k++] = P->s[e++];
                    while (e < P->n && P->s[e] >= '0' && P->s[e] <= '9') { if (k < 120) buf[k++] = P->s[e]; e++; }
                }
            }
            buf[k] = 0;
            token *t = push(P, isf ? K_FLOAT : K_INT, st);
            if (isf) t->f = strtod(buf, NULL);
            else {
                char *end;
                unsigned long long v = strtoull(buf, &end, 10);
                if (k > 18 && (v > INT64_MAX || strlen(buf) > 19)) perr(P, t->line, t->col, "integer literal too large: %s", buf);
                t->i = (int64_t)v;
            }
            advance_to(P, e);
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof *OPS; k++) {
            size_t l = strlen(OPS[k]);
            if (left >= l && !memcmp(c, OPS[k], l)) break;
        }
        if (k == sizeof OPS / sizeof *OPS) perr(P, P->line, col_of(P, st), "unexpected char '%c'", c[0]);
        token *t = push(P, K_OP, st);
        t->p = OPS[k];
        t->n = strlen(OPS[k]);
        if (t->p[0] == '(' || t->p[0] == '[' || t->p[0] == '{') depth++;
        if (t->p[0] == ')' || t->p[0] == ']' || t->p[0] == '}') depth--;
        advance_to(P, st + t->n);
    }
}

static void push_text(parser *P, size_t from, size_t to, int line, int col) {
    if (to <= from) return;
    token *t = push(P, K_TEXT, from);
    t->line = line;
    t->col = col;
    t->p = P->s + from;
    t->n = to - from;
}

/* does the block tag at `at` ("{%" + optional modifier) hold just `word`? -> end of tag */
static size_t tag_is(parser *P, size_t at, const char *word, int *endmod) {
    size_t i = at + 2;
    if (i < P->n && (P->s[i] == '-' || P->s[i] == '+')) i++;
    while (i < P->n && is_ws(P->s[i])) i++;
    size_t l = strlen(word);
    if (i + l > P->n || memcmp(P->s + i, word, l)) return 0;
    i += l;
    if (i < P->n && !is_ws(P->s[i]) && P->s[i] != '-' && P->s[i] != '+' && P->s[i] != '%') return 0;
    while (i < P->n && is_ws(P->s[i])) i++;
    int m = 0;
    if (i < P->n && (P->s[i] == '-' || P->s[i] == '+')) m = P->s[i++];
    if (i + 2 > P->n || P->s[i] != '%' || P->s[i + 1] != '}') return 0;
    if (endmod) *endmod = m;
    return i + 2;
}

/* end of the text [p, q) before a tag opened with modifier `mod`: `-` strips all trailing
 * whitespace; otherwise, for block and comment tags (lstrip_blocks, not `+`), spaces between
 * the line start and the tag go — a line start being a newline in the text, or, for text
 * with none, the previous token ending one (line_starting) */
static size_t text_end(parser *P, size_t p, size_t q, char mod, bool block_like, bool line_starting) {
    size_t te = q;
    if (mod == '-') { while (te > p && is_ws(P->s[te - 1])) te--; }
    else if (block_like && mod != '+') {
        size_t ls = te;
        while (ls > p && (P->s[ls - 1] == ' ' || P->s[ls - 1] == '\t' || P->s[ls - 1] == '\v' || P->s[ls - 1] == '\f' || P->s[ls - 1] == '\r')) ls--;
        if (ls < te && ((ls > p && P->s[ls - 1] == '\n') || (ls == p && line_starting))) te = ls;
    }
    return te;
}

static void lex(parser *P) {
    bool line_starting = true;
    for (;;) {
        size_t p = P->pos, q = p;
        while (q + 1 < P->n && !(P->s[q] == '{' && (P->s[q + 1] == '{' || P->s[q + 1] == '%' || P->s[q + 1] == '#'))) q++;
        if (q + 1 >= P->n) q = P->n;
        int tline = P->line, tcol = col_of(P, p);
        if (q == P->n) {
            push_text(P, p, q, tline, tcol);
            advance_to(P, q);
            push(P, K_EOF, q);
            return;
        }
        char kind = P->s[q + 1];
        char mod = q + 2 < P->n ? P->s[q + 2] : 0;
        int rawmod = 0;
        size_t te = text_end(P, p, q, mod, kind != '{', line_starting);
        push_text(P, p, te, tline, tcol);
        advance_to(P, q);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = q + 2; i + 1 < P->n; i++)
                if (P->s[i] == '#' && P->s[i + 1] == '}') { e = P->s + i; break; }
            if (!e) perr(P, P->line, col_of(P, q), "missing end of comment tag");
            size_t after = (size_t)(e - P->s) + 2;
            bool strip = e - P->s > (ptrdiff_t)q + 2 && e[-1] == '-';
            bool keep = e - P->s > (ptrdiff_t)q + 2 && e[-1] == '+';
            advance_to(P, after);
            if (strip) { while (P->pos < P->n && is_ws(P->s[P->pos])) advance_to(P, P->pos + 1); }
            else if (!keep && P->pos < P->n && P->s[P->pos] == '\n') advance_to(P, P->pos + 1);
        } else if (kind == '%' && tag_is(P, q, "raw", &rawmod) && rawmod != '+') {
            /* {% raw %} / {% raw -%}: no trim_blocks after it; its text is stripped before
             * {% endraw %} as any text before a block tag */
            size_t body = tag_is(P, q, "raw", NULL);
            if (rawmod == '-') while (body < P->n && is_ws(P->s[body])) body++;
            size_t r = body, end = 0;
            int em = 0;
            for (; r + 1 < P->n; r++)
                if (P->s[r] == '{' && P->s[r + 1] == '%' && (end = tag_is(P, r, "endraw", &em))) break;
            if (!end) perr(P, P->line, col_of(P, q), "Missing end of raw directive");
            char emod = r + 2 < P->n ? P->s[r + 2] : 0;
            size_t rt = text_end(P, body, r, emod, true, body > 0 && P->s[body - 1] == '\n');
            advance_to(P, body);
            push_text(P, body, rt, P->line, col_of(P, body));
            advance_to(P, end);
            if (em == '-') { while (P->pos < P->n && is_ws(P->s[P->pos])) advance_to(P, P->pos + 1); }
            else if (em != '+' && P->pos < P->n && P->s[P->pos] == '\n') advance_to(P, P->pos + 1);
        } else {
            push(P, kind == '%' ? K_BBEGIN : K_VBEGIN, q);
            advance_to(P, q + 2 + (mod == '-' || mod == '+'));
            lex_tag(P, kind == '%');
        }
        line_starting = P->pos > 0 && P->s[P->pos - 1] == '\n';
    }
}

/* ------------------------------------------------------------------ parser helpers */
static token *cur(parser *P) { return &P->tk[P->cur]; }
static token *nexttk(parser *P) { token *t = &P->tk[P->cur]; if (t->k != K_EOF) P->cur++; return t; }
static bool is_op(token *t, const char *op) { return t->k == K_OP && !strcmp(t->p, op); }
static bool is_name(token *t, const char *nm) { return t->k == K_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }
static const char *tkdesc(parser *P, token *t) {
    static const char *k[] = {"end of template", "template data", "begin of print statement", "end of print statement",
                              "begin of statement block", "end of statement block", "name", "string", "integer", "float", "operator"};
    if (t->k == K_NAME || t->k == K_OP) {
        char *s = tpl_alloc(P->a, t->n + 3);
        snprintf(s, t->n + 3, "'%.*s'", (int)t->n, t->p);
        return s;
    }
    return k[t->k];
}
static void expect_op(parser *P, const char *op) {
    token *t = cur(P);
    if (!is_op(t, op)) perr(P, t->line, t->col, "expected '%s', got %s", op, tkdesc(P, t));
    nexttk(P);
}
static const char *expect_name(parser *P) {
    token *t = cur(P);
    if (t->k != K_NAME) perr(P, t->line, t->col, "expected a name, got %s", tkdesc(P, t));
    nexttk(P);
    tstr *s = tpl_str(P->a, t->p, t->n);
    return s->p;
}
static void expect_bend(parser *P) {
    token *t = cur(P);
    if (t->k != K_BEND) perr(P, t->line, t->col, "expected end of statement block, got %s", tkdesc(P, t));
    nexttk(P);
}

static node *mk(parser *P, int kind, token *at) {
    node *n = tpl_alloc(P->a, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}
static void nl_push(parser *P, nodelist *l, node *n) {
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 4;
        node **v = tpl_alloc(P->a, (size_t)c * sizeof *v);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        l->cap = c;
    }
    l->v[l->n++] = n;
}
static void kw_push(parser *P, node *n, const char *name, node *value) {
    int k = n->kwargs.n;
    nl_push(P, &n->kwargs, value);
    if (n->kwargs.cap != 0) {
        const char **nv = tpl_alloc(P->a, (size_t)n->kwargs.cap * sizeof *nv);
        if (k) memcpy(nv, n->kwn, (size_t)k * sizeof *nv);
        n->kwn = nv;
    }
    n->kwn[k] = name;
}

/* ------------------------------------------------------------------ expressions */
static node *p_expr(parser *P, bool with_cond);
static node *p_unary(parser *P, bool with_filter);
static node *p_or(parser *P);

static void enter(parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH) { token *t = cur(P); perr(P, t->line, t->col, "expression nested too deeply"); }
}

/* (args) after '(' has been consumed: positional and keyword arguments */
static void p_args(parser *P, node *n) {
    while (!is_op(cur(P), ")")) {
        if (n->args.n || n->kwargs.n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        token *t = cur(P);
        if (is_op(t, "*") || is_op(t, "**")) perr(P, t->line, t->col, "*args and **kwargs are not supported in chat templates");
        if (t->k == K_NAME && is_op(&P->tk[P->cur + 1], "=")) {
            const char *nm = expect_name(P);
            nexttk(P);
            kw_push(P, n, nm, p_expr(P, true));
        } else {
            if (n->kwargs.n) perr(P, t->line, t->col, "positional argument follows keyword argument");
            nl_push(P, &n->args, p_expr(P, true));
        }
    }
    expect_op(P, ")");
}

/* tuple or single expression; for `for` targets (names only) use simplified */
static node *p_tuple(parser *P, bool simplified, bool with_cond, bool explicit_paren) {
    token *st = cur(P);
    node *tup = mk(P, N_TUPLE, st);
    bool is_tuple = false;
    for (;;) {
        if (tup->args.n) expect_op(P, ",");
        token *t = cur(P);
        if (!tup->args.n && explicit_paren && is_op(t, ")")) break;
        if (tup->args.n && (t->k == K_VEND || t->k == K_BEND || is_op(t, ")") || is_name(t, "in") || is_op(t, "=") ||
                            is_name(t, "if") || is_op(t, "|")))
            break;
        node *e;
        if (simplified) {
            if (t->k != K_NAME) perr(P, t->line, t->col, "can't assign to %s", tkdesc(P, t));
            e = mk(P, N_NAME, t);
            e->name = expect_name(P);
        } else e = p_expr(P, with_cond);
        nl_push(P, &tup->args, e);
        if (is_op(cur(P), ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (tup->args.n) return tup->args.v[0];
        if (!explicit_paren) perr(P, st->line, st->col, "expected an expression, got %s", tkdesc(P, st));
    }
    return tup;
}

static node *p_primary(parser *P) {
    enter(P);
    token *t = cur(P);
    node *n;
    if (t->k == K_NAME) {
        nexttk(P);
        n = mk(P, N_CONST, t);
        if (is_name(t, "true") || is_name(t, "True")) n->lit = v_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->lit = v_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->lit = v_none();
        else { n->kind = N_NAME; n->name = tpl_str(P->a, t->p, t->n)->p; }
    } else if (t->k == K_STR) {
        size_t tot = 0;
        int k = P->cur;
        while (P->tk[k].k == K_STR) tot += P->tk[k++].n;
        tstr *s = tpl_alloc(P->a, sizeof *s + tot + 1);
        while (cur(P)->k == K_STR) { token *u = nexttk(P); memcpy(s->p + s->n, u->p, u->n); s->n += u->n; }
        n = mk(P, N_CONST, t);
        n->lit = v_str(s);
    } else if (t->k == K_INT || t->k == K_FLOAT) {
        nexttk(P);
        n = mk(P, N_CONST, t);
        n->lit = t->k == K_INT ? v_int(t->i) : v_float(t->f);
    } else if (is_op(t, "(")) {
        nexttk(P);
        n = p_tuple(P, false, true, true);
        expect_op(P, ")");
    } else if (is_op(t, "[") || is_op(t, "{")) {   /* [a, b, ] and {k: v, } */
        bool dict = is_op(t, "{");
        const char *close = dict ? "}" : "]";
        nexttk(P);
        n = mk(P, dict ? N_DICT : N_LIST, t);
        while (!is_op(cur(P), close)) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(cur(P), close)) break;
            nl_push(P, &n->args, p_expr(P, true));
            if (dict) { expect_op(P, ":"); nl_push(P, &n->kwargs, p_expr(P, true)); }
        }
        expect_op(P, close);
    } else perr(P, t->line, t->col, "unexpected %s", tkdesc(P, t));
    P->depth--;
    return n;
}

static node *p_subscript(parser *P) {
    token *t = cur(P);
    node *parts[3] = {NULL, NULL, NULL};
    bool slice = false;
    if (!is_op(t, ":")) {
        parts[0] = p_expr(P, true);
        if (!is_op(cur(P), ":")) return parts[0];
    }
    slice = true;
    nexttk(P);   /* ':' */
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) parts[1] = p_expr(P, true);
    if (is_op(cur(P), ":")) {
        nexttk(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) parts[2] = p_expr(P, true);
    }
    node *n = mk(P, N_SLICE, t);
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    n->flag = slice;
    return n;
}

static node *p_postfix(parser *P, node *n) {
    for (;;) {
        token *t = cur(P);
        if (is_op(t, ".")) {
            nexttk(P);
            token *u = cur(P);
            node *g = mk(P, N_GETATTR, t);
            g->a = n;
            if (u->k == K_NAME) g->name = expect_name(P);
            else if (u->k == K_INT) {
                nexttk(P);
                g->kind = N_GETITEM;
                g->b = mk(P, N_CONST, u);
                g->b->lit = v_int(u->i);
            } else perr(P, u->line, u->col, "expected name or number after '.'");
            n = g;
        } else if (is_op(t, "[")) {
            nexttk(P);
            node *g = mk(P, N_GETITEM, t);
            g->a = n;
            node *first = p_subscript(P);
            if (is_op(cur(P), ",")) {
                node *tup = mk(P, N_TUPLE, t);
                nl_push(P, &tup->args, first);
                while (is_op(cur(P), ",")) { nexttk(P); if (is_op(cur(P), "]")) break; nl_push(P, &tup->args, p_subscript(P)); }
                first = tup;
            }
            g->b = first;
            expect_op(P, "]");
            n = g;
        } else if (is_op(t, "(")) {
            nexttk(P);
            node *c = mk(P, N_CALL, t);
            c->a = n;
            p_args(P, c);
            n = c;
        } else break;
    }
    return n;
}

static node *p_filter(parser *P, node *n, bool start_inline) {
    while (is_op(cur(P), "|") || start_inline) {
        token *t = cur(P);
        if (!start_inline) nexttk(P);
        start_inline = false;
        node *f = mk(P, N_FILTER, t);
        f->a = n;
        const char *nm = expect_name(P);
        while (is_op(cur(P), ".")) {   /* dotted filter names */
            nexttk(P);
            const char *more = expect_name(P);
            size_t l = strlen(nm) + strlen(more) + 2;
            char *j = tpl_alloc(P->a, l);
            snprintf(j, l, "%s.%s", nm, more);
            nm = j;
        }
        f->name = nm;
        if (is_op(cur(P), "(")) { nexttk(P); p_args(P, f); }
        n = f;
    }
    return n;
}

static node *p_test(parser *P, node *n) {
    token *t = nexttk(P);   /* 'is' */
    node *x = mk(P, N_TEST, t);
    x->a = n;
    if (is_name(cur(P), "not")) { nexttk(P); x->flag = true; }
    const char *nm = expect_name(P);
    while (is_op(cur(P), ".")) { nexttk(P); nm = expect_name(P); }
    x->name = nm;
    token *u = cur(P);
    if (is_op(u, "(")) { nexttk(P); p_args(P, x); }
    else if ((u->k == K_NAME || u->k == K_STR || u->k == K_INT || u->k == K_FLOAT || is_op(u, "(") || is_op(u, "[") ||
              is_op(u, "{")) &&
             !is_name(u, "else") && !is_name(u, "or") && !is_name(u, "and")) {
        if (is_name(u, "is")) perr(P, u->line, u->col, "You cannot chain multiple tests with is");
        node *arg = p_postfix(P, p_primary(P));
        nl_push(P, &x->args, arg);
    }
    return x;
}

static node *p_filter_expr(parser *P, node *n) {
    for (;;) {
        token *t = cur(P);
        if (is_op(t, "|")) n = p_filter(P, n, false);
        else if (is_name(t, "is")) n = p_test(P, n);
        else if (is_op(t, "(")) { nexttk(P); node *c = mk(P, N_CALL, t); c->a = n; p_args(P, c); n = c; }
        else break;
    }
    return n;
}

static node *p_unary(parser *P, bool with_filter) {
    enter(P);
    token *t = cur(P);
    node *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        nexttk(P);
        n = mk(P, is_op(t, "-") ? N_NEG : N_POS, t);
        n->a = p_unary(P, false);
    } else n = p_primary(P);
    n = p_postfix(P, n);
    if (with_filter) n = p_filter_expr(P, n);
    P->depth--;
    return n;
}

static node *binop(parser *P, token *t, int op, node *a, node *b) {
    node *n = mk(P, N_BIN, t);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}
static node *p_pow(parser *P) {
    node *l = p_unary(P, true);
    while (is_op(cur(P), "**")) { token *t = nexttk(P); l = binop(P, t, OP_POW, l, p_unary(P, true)); }
    return l;
}
static node *p_math2(parser *P) {
    node *l = p_pow(P);
    for (;;) {
        token *t = cur(P);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FLOORDIV : is_op(t, "%") ? OP_MOD : -1;
        if (op < 0) return l;
        nexttk(P);
        l = binop(P, t, op, l, p_pow(P));
    }
}
static node *p_concat(parser *P) {
    node *l = p_math2(P);
    if (!is_op(cur(P), "~")) return l;
    node *n = mk(P, N_CONCAT, cur(P));
    nl_push(P, &n->args, l);
    while (is_op(cur(P), "~")) { nexttk(P); nl_push(P, &n->args, p_math2(P)); }
    return n;
}
static node *p_math1(parser *P) {
    node *l = p_concat(P);
    for (;;) {
        token *t = cur(P);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return l;
        nexttk(P);
        l = binop(P, t, op, l, p_concat(P));
    }
}
static node *p_compare(parser *P) {
    token *st = cur(P);
    node *first = p_math1(P);
    node *n = NULL;
    for (;;) {
        token *t = cur(P);
        int op = -1;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(&P->tk[P->cur + 1], "in")) { nexttk(P); op = OP_NOTIN; }
        if (op < 0) break;
        nexttk(P);
        if (!n) { n = mk(P, N_COMPARE, st); nl_push(P, &n->args, first); }
        node *o = mk(P, N_CONST, t);   /* the operator, carried in ->op of an operand holder */
        o->op = (uint8_t)op;
        o->a = p_math1(P);
        nl_push(P, &n->kwargs, o);
    }
    return n ? n : first;
}
static node *p_not(parser *P) {
    token *t = cur(P);
    if (is_name(t, "not")) {
        enter(P);
        nexttk(P);
        node *n = mk(P, N_NOT, t);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}
static node *p_and(parser *P) {
    node *l = p_not(P);
    while (is_name(cur(P), "and")) { token *t = nexttk(P); node *n = mk(P, N_AND, t); n->a = l; n->b = p_not(P); l = n; }
    return l;
}
static node *p_or(parser *P) {
    node *l = p_and(P);
    while (is_name(cur(P), "or")) { token *t = nexttk(P); node *n = mk(P, N_OR, t); n->a = l; n->b = p_and(P); l = n; }
    return l;
}
static node *p_expr(parser *P, bool with_cond) {
    enter(P);
    node *e = p_or(P);
    if (with_cond)
        while (is_name(cur(P), "if")) {
            token *t = nexttk(P);
            node *c = mk(P, N_COND, t);
            c->b = e;
            c->a = p_or(P);
            if (is_name(cur(P), "else")) { nexttk(P); c->c = p_expr(P, true); }
            e = c;
        }
    P->depth--;
    return e;
}

/* ------------------------------------------------------------------ statements */
static node *p_body(parser *P, const char *const *ends, const char **which);

static node *p_for(parser *P, token *t) {
    node *n = mk(P, S_FOR, t);
    n->a = p_tuple(P, true, false, false);
    if (!is_name(cur(P), "in")) perr(P, cur(P)->line, cur(P)->col, "expected 'in', got %s", tkdesc(P, cur(P)));
    nexttk(P);
    n->b = p_tuple(P, false, false, false);
    if (is_name(cur(P), "if")) { nexttk(P); n->c = p_expr(P, true); }
    if (is_name(cur(P), "recursive")) { nexttk(P); n->flag = true; }
    expect_bend(P);
    static const char *const e1[] = {"endfor", "else", NULL};
    const char *w;
    P->loops++;
    n->d = p_body(P, e1, &w);
    P->loops--;
    if (!strcmp(w, "else")) {
        static const char *const e2[] = {"endfor", NULL};
        node *els = p_body(P, e2, &w);
        nl_push(P, &n->args, els);
    }
    return n;
}

static node *p_if(parser *P, token *t) {
    node *n = mk(P, S_IF, t);
    n->a = p_tuple(P, false, true, false);
    expect_bend(P);
    static const char *const e[] = {"elif", "else", "endif", NULL};
    const char *w;
    n->b = p_body(P, e, &w);
    if (!strcmp(w, "elif")) { token *u = &P->tk[P->cur - 1]; n->c = p_if(P, u); }
    else if (!strcmp(w, "else")) {
        static const char *const e2[] = {"endif", NULL};
        n->c = p_body(P, e2, &w);
    }
    return n;
}

static node *p_macro_sig(parser *P, node *n) {
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (n->args.n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        token *t = cur(P);
        node *a = mk(P, N_NAME, t);
        a->name = expect_name(P);
        if (is_op(cur(P), "=")) { nexttk(P); a->a = p_expr(P, true); }
        else if (n->args.n && n->args.v[n->args.n - 1]->a) perr(P, t->line, t->col, "non-default argument follows default argument");
        nl_push(P, &n->args, a);
    }
    expect_op(P, ")");
    return n;
}

/* does the subtree reference `name`? (jinja2's find_undeclared: a macro accepts varargs,
 * kwargs and caller only when its body mentions them) */
static bool uses_name(const node *n, const char *name) {
    if (!n) return false;
    if (n->kind == N_NAME && !strcmp(n->name, name)) return true;
    if (uses_name(n->a, name) || uses_name(n->b, name) || uses_name(n->c, name) || uses_name(n->d, name)) return true;
    for (int i = 0; i < n->args.n; i++) if (uses_name(n->args.v[i], name)) return true;
    for (int i = 0; i < n->kwargs.n; i++) if (uses_name(n->kwargs.v[i], name)) return true;
    return false;
}
static void macro_flags(node *n) {
    n->op = (uint8_t)((uses_name(n->b, "varargs") ? MACRO_VARARGS : 0) | (uses_name(n->b, "kwargs") ? MACRO_KWARGS : 0) |
                      (uses_name(n->b, "caller") ? MACRO_CALLER : 0));
}

/* the rest of a block tag, then its body up to {% END %}: the body goes to n->b */
static node *block_body(parser *P, node *n, const char *end) {
    expect_bend(P);
    const char *const ends[] = {end, NULL};
    const char *w;
    n->b = p_body(P, ends, &w);
    return n;
}

/* the body of a macro or of a {% call %}'s caller(): a function, so loops around it do not
 * count for break/continue, and it accepts varargs/kwargs/caller only if it mentions them */
static node *function_body(parser *P, node *n, const char *end) {
    int loops = P->loops;
    P->loops = 0;
    block_body(P, n, end);
    macro_flags(n);
    P->loops = loops;
    return n;
}

static node *p_stmt(parser *P) {
    token *b = nexttk(P);   /* K_BBEGIN */
    token *t = cur(P);
    if (t->k != K_NAME) perr(P, t->line, t->col, "tag name expected");
    nexttk(P);
    const char *w;
    if (is_name(t, "for")) return p_for(P, t);
    if (is_name(t, "if")) return p_if(P, t);
    if (is_name(t, "set")) {
        node *target;
        token *u = cur(P);
        if (u->k == K_NAME && is_op(&P->tk[P->cur + 1], ".") && P->tk[P->cur + 2].k == K_NAME) {
            target = mk(P, N_GETATTR, u);
            node *base = mk(P, N_NAME, u);
            base->name = expect_name(P);
            nexttk(P);
            target->a = base;
            target->name = expect_name(P);
        } else target = p_tuple(P, true, false, false);
        if (is_op(cur(P), "=")) {
            nexttk(P);
            node *n = mk(P, S_SET, t);
            n->a = target;
            n->b = p_tuple(P, false, true, false);
            expect_bend(P);
            return n;
        }
        node *n = mk(P, S_SETBLOCK, t);
        n->a = target;
        if (is_op(cur(P), "|")) n->c = p_filter(P, NULL, false);
        return block_body(P, n, "endset");
    }
    if (is_name(t, "macro")) {   /* a function: loops outside it do not count */
        node *n = mk(P, S_MACRO, t);
        n->name = expect_name(P);
        p_macro_sig(P, n);
        return function_body(P, n, "endmacro");
    }
    if (is_name(t, "call")) {
        node *n = mk(P, S_CALLBLOCK, t);
        if (is_op(cur(P), "(")) p_macro_sig(P, n);
        n->a = p_expr(P, true);
        if (n->a->kind != N_CALL) perr(P, t->line, t->col, "expected call");
        return function_body(P, n, "endcall");   /* caller() is a macro too */
    }
    if (is_name(t, "filter")) {
        node *n = mk(P, S_FILTERBLOCK, t);
        n->a = p_filter(P, NULL, true);
        return block_body(P, n, "endfilter");
    }
    if (is_name(t, "with")) {
        node *n = mk(P, S_WITH, t);
        while (!(cur(P)->k == K_BEND)) {
            if (n->args.n) expect_op(P, ",");
            token *u = cur(P);
            node *a = mk(P, N_NAME, u);
            a->name = expect_name(P);
            expect_op(P, "=");
            a->a = p_expr(P, true);
            nl_push(P, &n->args, a);
        }
        return block_body(P, n, "endwith");
    }
    if (is_name(t, "generation")) {   /* transformers' AssistantTracker: renders its body */
        expect_bend(P);
        static const char *const e[] = {"endgeneration", NULL};
        return p_body(P, e, &w);
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!P->loops) perr(P, t->line, t->col, "'%s' outside loop", is_name(t, "break") ? "break" : "continue");
        node *n = mk(P, is_name(t, "break") ? S_BREAK : S_CONTINUE, t);
        expect_bend(P);
        return n;
    }
    (void)b;
    perr(P, t->line, t->col, "Encountered unknown tag '%.*s'.", (int)t->n, t->p);
}

/* statements until one of `ends` (consumed with its block end); ends == NULL: until EOF */
static node *p_body(parser *P, const char *const *ends, const char **which) {
    enter(P);
    token *st = cur(P);
    node *body = mk(P, S_BODY, st);
    for (;;) {
        token *t = cur(P);
        if (t->k == K_EOF) {
            if (ends) perr(P, t->line, t->col, "Unexpected end of template. Jinja was looking for the following tags: '%s'.", ends[0]);
            break;
        }
        if (t->k == K_TEXT) {
            nexttk(P);
            node *n = mk(P, S_TEXT, t);
            n->lit = v_str(tpl_str(P->a, t->p, t->n));
            nl_push(P, &body->args, n);
        } else if (t->k == K_VBEGIN) {
            nexttk(P);
            node *n = mk(P, S_OUT, t);
            n->a = p_tuple(P, false, true, false);
            token *u = cur(P);
            if (u->k != K_VEND) perr(P, u->line, u->col, "expected end of print statement, got %s", tkdesc(P, u));
            nexttk(P);
            nl_push(P, &body->args, n);
        } else if (t->k == K_BBEGIN) {
            token *nm = &P->tk[P->cur + 1];
            if (ends && nm->k == K_NAME)
                for (int i = 0; ends[i]; i++)
                    if (is_name(nm, ends[i])) {
                        P->cur += 2;
                        *which = ends[i];
                        if (strcmp(ends[i], "elif")) expect_bend(P);
                        P->depth--;
                        return body;
                    }
            if (nm->k == K_NAME && (is_name(nm, "endfor") || is_name(nm, "endif") || is_name(nm, "else") || is_name(nm, "elif") ||
                                    is_name(nm, "endset") || is_name(nm, "endmacro") || is_name(nm, "endcall") ||
                                    is_name(nm, "endfilter") || is_name(nm, "endwith") || is_name(nm, "endraw") || is_name(nm, "endgeneration")))
                perr(P, nm->line, nm->col, "Encountered unknown tag '%.*s'.%s%s%s", (int)nm->n, nm->p,
                     ends ? " Jinja was looking for the following tags: '" : "", ends ? ends[0] : "", ends ? "'." : "");
            nl_push(P, &body->args, p_stmt(P));
        } else perr(P, t->line, t->col, "unexpected %s", tkdesc(P, t));
    }
    P->depth--;
    return body;
}

mmc_status tpl_parse(mmc_template *t, const char *src, size_t n) {
    parser P = {.t = t, .a = &t->arena, .line = 1};
    /* normalise newlines, drop one trailing newline (keep_trailing_newline=False) */
    char *s = tpl_alloc(&t->arena, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') { s[k++] = '\n'; if (i + 1 < n && src[i + 1] == '\n') i++; }
        else s[k++] = src[i];
    }
    if (k && s[k - 1] == '\n') k--;
    s[k] = 0;
    P.s = s;
    P.n = k;
    lex(&P);
    P.line = 1;
    t->root = p_body(&P, NULL, NULL);
    return MMC_OK;
}
