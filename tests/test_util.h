/* test_util.h — small, honest test helpers: checks that count failures, skips that say why,
 * parts, fixture loading (safetensors written by tools/ref/), tensor comparison, and a
 * finite-difference gradient check for ops. Header-only; each test is one executable. */
#ifndef MMC_TEST_UTIL_H
#define MMC_TEST_UTIL_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_ops.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail = 0, g_checks = 0;

#define CHECK(cond) do { g_checks++; if (!(cond)) { g_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { g_checks++; if (!(cond)) { g_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_OK(expr) do { mmc_status st_ = (expr); g_checks++; if (st_ != MMC_OK) { g_fail++; \
    fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, mmc_status_str(st_), \
            mmc_last_error()); } } while (0)
#define CHECK_ERR(expr, code) do { mmc_status st_ = (expr); g_checks++; if (st_ != (code)) { g_fail++; \
    fprintf(stderr, "%s:%d: %s -> %d, expected %d (%s)\n", __FILE__, __LINE__, #expr, st_, code, \
            mmc_last_error()); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); g_checks++; \
    if (!(fabs(a_ - b_) <= (tol))) { g_fail++; fprintf(stderr, "%s:%d: %s = %.8g, %s = %.8g, |diff| %.3g > %.3g\n", \
    __FILE__, __LINE__, #a, a_, #b, b_, fabs(a_ - b_), (double)(tol)); } } while (0)

/* ---- skips and parts
 * A test that cannot run what it is for (a CPU feature, an optional library or file is
 * absent) says why with test_skip(), and exits 77, which ctest (SKIP_RETURN_CODE 77) reports
 * as skipped, never as a pass. `make test` lists every "NAME: skipped: WHY" line after ctest's
 * summary (tests/report_skips.sh), so keep that form. A test with independent parts is
 * registered in CMakeLists.txt as one ctest case per part (`test_x PART`, named test_x_PART),
 * so a part that cannot run shows as skipped on its own; without an argument every part runs. */
#define TEST_SKIP_CODE 77
static int g_skipped = 0;
static const char *g_part_arg = NULL;
static bool g_part_hit = false;

/* Report a part that could not run: "name: skipped: why". test_done exits 77 if nothing ran. */
static inline void test_skip(const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s: skipped: ", name);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
    va_end(ap);
    g_skipped++;
}

/* True if this run includes `part`: no argument (all parts) or argv[1] names it. */
static inline bool test_part(int argc, char **argv, const char *part) {
    if (argc < 2) return true;
    g_part_arg = argv[1];
    if (strcmp(argv[1], part) != 0) return false;
    g_part_hit = true;
    return true;
}

/* Print the summary and return the exit code: 1 on any failure, and when nothing was checked
 * nor skipped (a test that silently checks nothing is broken); 77 when every part was skipped
 * and nothing was checked; else 0. */
static inline int test_done(const char *name) {
    if (g_part_arg && !g_part_hit) {
        fprintf(stderr, "%s: no part named '%s'\n", name, g_part_arg);
        return 1;
    }
    if (g_fail) {
        fprintf(stderr, "%s: %d of %d checks FAILED\n", name, g_fail, g_checks);
        return 1;
    }
    if (g_checks == 0) {
        if (g_skipped) { printf("%s: nothing checked (skipped)\n", name); return TEST_SKIP_CODE; }
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    if (g_skipped) printf("%s: all %d checks passed; %d part(s) skipped (above)\n", name, g_checks, g_skipped);
    else printf("%s: all %d checks passed\n", name, g_checks);
    return 0;
}

/* ---- fixtures: tests/fixtures/<rel> (ctest runs from the source dir) */
static inline mmc_st *fixture_open(const char *rel) {
    char path[1024];
    const char *root = getenv("MMC_FIXTURES");
    snprintf(path, sizeof path, "%s/%s", root ? root : "tests/fixtures", rel);
    mmc_st *st = NULL;
    if (mmc_st_open(path, &st) != MMC_OK) {
        fprintf(stderr, "cannot open fixture %s: %s (run `make fixtures`?)\n", path, mmc_last_error());
        g_fail++;
        return NULL;
    }
    return st;
}

/* Load a fixture tensor as a persistent tensor of dtype dt (converted). Aborts if absent. */
static inline mmc_tensor *fixture_tensor(const mmc_st *st, const char *name, mmc_dtype dt) {
    const mmc_st_entry *e = mmc_st_find(st, name);
    MMC_CHECK(e, "fixture tensor '%s' missing", name);
    mmc_tensor *t = mmc_tensor_new(dt, e->ndim, e->shape);
    MMC_CHECK(t, "OOM");
    MMC_CHECK(mmc_st_read_into(st, name, t) == MMC_OK, "%s", mmc_last_error());
    snprintf(t->name, sizeof t->name, "%.*s", (int)sizeof t->name - 1, name);
    return t;
}

/* Max |a - b| over all elements (any dtypes, any strides). Shapes must match in numel. */
static inline double max_abs_diff(const mmc_tensor *a, const mmc_tensor *b) {
    int64_t n = mmc_numel(a);
    if (n != mmc_numel(b)) return INFINITY;
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(mmc_get_flat(a, i) - mmc_get_flat(b, i));
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}
static inline double max_abs(const mmc_tensor *a) {
    double m = 0;
    for (int64_t i = 0; i < mmc_numel(a); i++) m = fmax(m, fabs(mmc_get_flat(a, i)));
    return m;
}

/* CHECK that got matches want within atol + rtol * max|want|; prints the context. */
#define CHECK_CLOSE(got, want, atol, rtol, what) do { double d_ = max_abs_diff(got, want); \
    double lim_ = (atol) + (rtol) * max_abs(want); g_checks++; if (!(d_ <= lim_)) { g_fail++; \
    fprintf(stderr, "%s:%d: %s: max|diff| %.3g > %.3g\n", __FILE__, __LINE__, what, d_, lim_); } } while (0)

/* Persistent f32 tensor filled with N(0, std) from a seeded stream. */
static inline mmc_tensor *randn_param(uint64_t seed, int ndim, const int64_t *shape, float std) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, ndim, shape);
    mmc_rng r;
    mmc_rng_init(&r, seed);
    mmc_rng_normal(&r, t->data, mmc_numel(t), 0.0f, std);
    t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    return t;
}

/* ---- finite-difference gradient check
 * f maps inputs to an output; the scalar checked is L = sum(out * r) for a fixed random r.
 * Analytic grads come from seeding out->grad = r and running the tape. Numeric grads use
 * central differences of L computed in double, on up to max_elems elements per input.
 * Only inputs flagged MMC_REQUIRES_GRAD are checked (give them MMC_PARAM too). */
typedef mmc_tensor *(*gc_fn)(mmc_ctx *ctx, mmc_tensor **in, void *user);

static inline double gc_loss(mmc_ctx *ctx, gc_fn f, mmc_tensor **in, void *user, const float *r) {
    mmc_arena_mark m = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    bool prev = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *y = f(ctx, in, user);
    double L = 0;
    for (int64_t i = 0; i < mmc_numel(y); i++) L += mmc_get_flat(y, i) * (double)r[i];
    mmc_set_grad_enabled(ctx, prev);
    mmc_arena_release(mmc_ctx_arena(ctx), m);
    return L;
}

static inline int gradcheck(const char *name, gc_fn f, mmc_tensor **in, int n_in, void *user,
                            double eps, double atol, double rtol, int max_elems) {
    mmc_ctx *ctx = mmc_ctx_new();
    for (int i = 0; i < n_in; i++) if (in[i] && in[i]->grad) memset(in[i]->grad->data, 0, mmc_nbytes(in[i]->grad));
    mmc_tensor *y = f(ctx, in, user);
    int64_t ny = mmc_numel(y);
    float *r = malloc((size_t)ny * sizeof(float));
    mmc_rng rng;
    mmc_rng_init(&rng, 1234);
    mmc_rng_uniform(&rng, r, ny, -1.0f, 1.0f);
    int bad = 0;
    if (!mmc_requires_grad(y)) {
        fprintf(stderr, "gradcheck %s: output does not require grad\n", name);
        bad = 1;
    } else {
        mmc_tensor *gy = mmc_grad(ctx, y);
        memcpy(gy->data, r, (size_t)ny * sizeof(float));
        bool prev = mmc_set_grad_enabled(ctx, false);
        mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
        mmc_set_grad_enabled(ctx, prev);
    }
    for (int i = 0; i < n_in && !bad; i++) {
        mmc_tensor *x = in[i];
        if (!x || !(x->flags & MMC_REQUIRES_GRAD)) continue;
        if (!x->grad) { fprintf(stderr, "gradcheck %s: input %d got no gradient\n", name, i); bad++; continue; }
        int64_t n = mmc_numel(x), step = n > max_elems ? n / max_elems : 1;
        float *xd = x->data;
        for (int64_t j = 0; j < n; j += step) {
            float orig = xd[j];
            xd[j] = orig + (float)eps;
            double lp = gc_loss(ctx, f, in, user, r);
            xd[j] = orig - (float)eps;
            double lm = gc_loss(ctx, f, in, user, r);
            xd[j] = orig;
            double num = (lp - lm) / (2 * eps), ana = ((float *)x->grad->data)[j];
            if (!(fabs(num - ana) <= atol + rtol * fabs(num))) {
                if (bad < 5)
                    fprintf(stderr, "gradcheck %s: input %d elem %lld: analytic %.6g numeric %.6g\n",
                            name, i, (long long)j, ana, num);
                bad++;
            }
        }
    }
    free(r);
    mmc_ctx_free(ctx);
    g_checks++;
    if (bad) g_fail++;
    return bad;
}

#endif
