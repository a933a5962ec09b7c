/* tpl_internal.h — private types of the Jinja chat-template engine (src/template/):
 * the arena every render and parse allocates from, the value model (Python-like: None,
 * bool, int, float, str, list, tuple, ordered dict, namespace, macro, jinja2's Undefined),
 * the AST, and the error path (errors longjmp back to the entry point; everything lives in
 * an arena, so unwinding leaks nothing).
 *
 * Values are small structs passed by value; strings, lists and dicts are arena objects and
 * are never mutated once built (ImmutableSandboxedEnvironment forbids list.append & co.),
 * except namespaces, which `{% set ns.x = ... %}` assigns. */
#ifndef MMC_TPL_INTERNAL_H
#define MMC_TPL_INTERNAL_H

#include "mmc_template.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ arena */
typedef struct tpl_chunk tpl_chunk;
typedef struct {
    tpl_chunk *head;
    size_t used, limit;   /* bytes handed out (all chunks), and the cap */
    jmp_buf *jb;          /* where an over-limit allocation jumps */
    char *err;            /* message buffer of the owner (set on over-limit) */
    size_t err_cap;
} tpl_arena;
void *tpl_alloc(tpl_arena *a, size_t n);   /* zeroed; longjmps past the limit */
void tpl_arena_free(tpl_arena *a);

/* ------------------------------------------------------------------ values */
typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_TUPLE, V_DICT, V_NS,
               V_MACRO, V_FUNC, V_LOOP } vtype;
typedef struct tstr { size_t n; char p[]; } tstr;   /* UTF-8, NUL-terminated */
typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tmacro { struct node *def; struct frame *closure; const char *name; } tmacro;
typedef struct tloop tloop;
typedef struct val {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        tstr *s;      /* V_STR; V_UNDEF: the hint ("'x' is undefined"), may be NULL */
        tlist *l;     /* V_LIST, V_TUPLE */
        tdict *d;     /* V_DICT, V_NS */
        tmacro *m;
        tloop *lp;
        int fn;       /* V_FUNC: builtin id */
    };
} val;
/* gen: what jinja2 hands back as a generator or iterator (map, select*, reject*, unique,
 * batch, the items filter, reverse of a list): iterable once, always truthy, no len(),
 * no indexing, printed as "<generator object>" — mirrored so templates behave the same */
struct tlist { int64_t n, cap; val *v; bool gen; };
struct tdict { int64_t n, cap; val *k, *v; };

/* ------------------------------------------------------------------ AST */
typedef struct node node;
typedef struct { int n, cap; node **v; } nodelist;
enum {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER,
    N_TEST, N_NOT, N_NEG, N_POS, N_BIN, N_AND, N_OR, N_COMPARE, N_CONCAT, N_COND,
    /* statements */
    S_BODY, S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK,
    S_BREAK, S_CONTINUE, S_WITH,
};
enum { MACRO_VARARGS = 1, MACRO_KWARGS = 2, MACRO_CALLER = 4 };   /* S_MACRO / S_CALLBLOCK ->op */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };
struct node {
    uint8_t kind, op;
    int line, col;
    node *a, *b, *c, *d;   /* operands, sub-bodies (see parse.c for each kind) */
    nodelist args;         /* positional args, items, dict keys, statements, targets */
    nodelist kwargs;       /* keyword-argument values, dict values, defaults */
    const char **kwn;      /* keyword-argument names / macro parameter names */
    const char *name;
    val lit;               /* N_CONST, S_TEXT */
    bool flag;             /* N_TEST: negated; S_FOR: recursive; N_SLICE parts present */
};

struct mmc_template {
    tpl_arena arena;
    node *root;
    char err[1024];
    jmp_buf jb;
};

/* ------------------------------------------------------------------ shared helpers */
tstr *tpl_str(tpl_arena *a, const char *p, size_t n);
static inline val v_str(tstr *s) { val v = {.t = V_STR}; v.s = s; return v; }
static inline val v_int(int64_t i) { val v = {.t = V_INT}; v.i = i; return v; }
static inline val v_float(double f) { val v = {.t = V_FLOAT}; v.f = f; return v; }
static inline val v_bool(bool b) { val v = {.t = V_BOOL}; v.b = b; return v; }
static inline val v_none(void) { val v = {.t = V_NONE}; return v; }
static inline val v_undef(tstr *hint) { val v = {.t = V_UNDEF}; v.s = hint; return v; }

mmc_status tpl_parse(mmc_template *t, const char *src, size_t n);   /* parse.c */

/* ------------------------------------------------------------------ render context (value.c, eval.c) */
typedef struct frame frame;
typedef struct tpl_ctx {
    tpl_arena a;
    jmp_buf jb;
    char err[2048];
    int line, col;          /* the node being evaluated */
    int64_t steps, max_steps;
    size_t max_out, out_total;
    int depth, max_depth;
    int nest;               /* C recursion of eval/exec: bounded so no template overflows the stack */
    int64_t now;
    frame *globals;
    val pending_caller;     /* {% call %}: the caller() a macro call receives */
} tpl_ctx;
_Noreturn void tpl_fail(tpl_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct { char *p; size_t n, cap; tpl_ctx *c; } sbuf;
void sb_put(sbuf *b, const char *p, size_t n);
static inline void sb_cstr(sbuf *b, const char *s) { sb_put(b, s, __builtin_strlen(s)); }
tstr *sb_take(sbuf *b);

const char *tpl_type_name(val v);
void tpl_float_repr(double f, char out[40]);
void tpl_write_str(sbuf *b, val v);                 /* Python str() */
void tpl_write_repr(sbuf *b, val v);                /* Python repr() */
tstr *tpl_to_str(tpl_ctx *c, val v);
void tpl_write_json(sbuf *b, val v, const char *indent, const char *item_sep, const char *key_sep,
                    bool sort_keys, bool ascii, int level);
bool tpl_truthy(val v);
bool tpl_eq(val a, val b);          /* Python ==; fails the current render past 500 nested levels */
extern _Thread_local tpl_ctx *tpl_current;
int tpl_cmp(tpl_ctx *c, val a, val b, const char *op);   /* <0, 0, >0 or a TypeError */
val *tpl_dict_get(tdict *d, val k);
val *tpl_dict_gets(tdict *d, const char *k);
void tpl_dict_set(tpl_ctx *c, tdict *d, val k, val v);
void tpl_list_push(tpl_ctx *c, tlist *l, val v);
tlist *tpl_list_new(tpl_ctx *c, int64_t cap);
tdict *tpl_dict_new(tpl_ctx *c);
val tpl_undef_msg(tpl_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void tpl_undef_fail(tpl_ctx *c, val u);
/* UTF-8 */
int64_t tpl_u8len(const char *s, size_t n);
size_t tpl_u8next(const char *s, size_t n, size_t i);   /* byte index after the code point at i */
uint32_t tpl_u8dec(const char *s, size_t n, size_t i);

#endif
