/* synth.c — the synthetic shapes dataset of the built-in demo (see mmc_synth.h): scene
 * sampling conditioned on a balanced answer, a 4x4-supersampled rasteriser, PNG output
 * through libpng's simplified API, and the LLaMA-Factory-style JSONL writer
 * ({"messages": [...], "images": [...], "type": ...}, as LLaMA-Factory's mllm_demo.json).
 */
#include "mmc_synth.h"
#include "mmc_io.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const mmc_synth_shape_names[MMC_SYNTH_N_SHAPES] = {"circle", "square", "triangle"};
const char *const mmc_synth_colour_names[MMC_SYNTH_N_COLOURS] = {"red", "green", "blue", "yellow"};
const uint8_t mmc_synth_colour_rgb[MMC_SYNTH_N_COLOURS][3] = {
    {230, 40, 40}, {40, 200, 60}, {40, 80, 235}, {235, 215, 40}};
const char *const mmc_synth_type_names[MMC_SYNTH_N_TYPES] = {"colour", "shape", "count", "leftright"};

static const int n_answers[MMC_SYNTH_N_TYPES] = {MMC_SYNTH_N_COLOURS, MMC_SYNTH_N_SHAPES, 3, 2};

/* ---------------------------------------------------------------- sampling */
static int rand_int(mmc_rng *r, int n) { return (int)(mmc_rng_u64(r) % (uint64_t)n); }
static float rand_f(mmc_rng *r, float lo, float hi) {
    float v;
    mmc_rng_uniform(r, &v, 1, lo, hi);
    return v;
}
/* Fisher-Yates over 0..n-1 */
static void rand_perm(mmc_rng *r, int *p, int n) {
    for (int i = 0; i < n; i++) p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = rand_int(r, i + 1), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}
/* A permutation of 0..n-1 that starts with `first`. */
static void perm_with_first(mmc_rng *r, int *p, int n, int first) {
    rand_perm(r, p, n);
    for (int i = 0; i < n; i++)
        if (p[i] == first) { p[i] = p[0]; p[0] = first; break; }
}

/* Grid layout: the image is cut into g x g cells (g = size / 28, at least 2 and at most 4:
 * at 56 px one cell is exactly one merged 28-px vision token), and each object takes its own
 * cell, centred with a small jitter. Objects never overlap, and every object is seen whole
 * by the token(s) of its cell. lr >= 0: object `a` must be in a column left (lr == 0) or
 * right (lr == 1) of object `b`'s column, so the answer is visible in the token grid. */
int mmc_synth_grid(int size) {
    int g = size / 28;
    return g < 2 ? 2 : g > 4 ? 4 : g;
}

static bool place(mmc_rng *r, mmc_synth_obj *o, int n, int size, int a, int b, int lr) {
    const int g = mmc_synth_grid(size);
    const float cell = (float)size / g;
    int cells[16], col[MMC_SYNTH_MAX_OBJ];
    for (int attempt = 0; attempt < 1000; attempt++) {
        rand_perm(r, cells, g * g);
        for (int i = 0; i < n; i++) col[i] = cells[i] % g;
        if (lr >= 0 && !(lr == 0 ? col[a] < col[b] : col[a] > col[b])) continue;
        for (int i = 0; i < n; i++) {
            int cx = cells[i] % g, cy = cells[i] / g;
            o[i].r = rand_f(r, 0.28f, 0.40f) * cell;
            float j = 0.5f * cell - o[i].r - 1.0f;   /* jitter keeping a 1-px margin in the cell */
            if (j < 0) j = 0;
            o[i].cx = (cx + 0.5f) * cell + rand_f(r, -j, j);
            o[i].cy = (cy + 0.5f) * cell + rand_f(r, -j, j);
        }
        return true;
    }
    return false;
}

mmc_status mmc_synth_make(uint64_t seed, mmc_synth_split split, int64_t index, int size,
                          mmc_synth_sample *s) {
    if (size < 28 || size > 1024) return mmc_error(MMC_ERR_INVALID, "synth: image size %d not in [28, 1024]", size);
    if (index < 0) return mmc_error(MMC_ERR_INVALID, "synth: negative sample index");
    memset(s, 0, sizeof *s);
    mmc_rng r;
    mmc_rng_init(&r, seed * 0x9E3779B97F4A7C15ull + (uint64_t)split * 0xD1B54A32D192ED03ull + 1);
    r.offset = (uint64_t)index << 20;   /* a private counter range per sample */

    s->type = (mmc_synth_qtype)(index % MMC_SYNTH_N_TYPES);
    int64_t k = index / MMC_SYNTH_N_TYPES;              /* k-th sample of this type */
    int ans = (int)(k % n_answers[s->type]);
    s->other = -1;

    int shapes[MMC_SYNTH_N_SHAPES], colours[MMC_SYNTH_N_COLOURS];
    int n;
    switch (s->type) {
    case MMC_SYNTH_Q_COUNT: n = ans + 1; break;
    case MMC_SYNTH_Q_LEFTRIGHT: n = 2 + rand_int(&r, 2); break;
    default: n = 1 + rand_int(&r, 3); break;
    }
    s->n_obj = n;
    s->target = rand_int(&r, n);
    if (s->type == MMC_SYNTH_Q_LEFTRIGHT) s->other = (s->target + 1 + rand_int(&r, n - 1)) % n;

    /* distinct shapes and colours; the target gets the answer's value when it is one */
    if (s->type == MMC_SYNTH_Q_SHAPE) perm_with_first(&r, shapes, MMC_SYNTH_N_SHAPES, ans);
    else rand_perm(&r, shapes, MMC_SYNTH_N_SHAPES);
    if (s->type == MMC_SYNTH_Q_COLOUR) perm_with_first(&r, colours, MMC_SYNTH_N_COLOURS, ans);
    else rand_perm(&r, colours, MMC_SYNTH_N_COLOURS);
    for (int i = 0, j = 1; i < n; i++) {
        int slot = i == s->target ? 0 : j++;
        s->obj[i].shape = shapes[slot];
        s->obj[i].colour = colours[slot];
    }
    if (!place(&r, s->obj, n, size, s->target, s->other,
               s->type == MMC_SYNTH_Q_LEFTRIGHT ? ans : -1))
        return mmc_error(MMC_ERR_INVALID, "synth: cannot place %d objects in a %d-px image", n, size);

    const mmc_synth_obj *t = &s->obj[s->target];
    switch (s->type) {
    case MMC_SYNTH_Q_COLOUR:
        snprintf(s->question, sizeof s->question, "What colour is the %s?", mmc_synth_shape_names[t->shape]);
        snprintf(s->answer, sizeof s->answer, "%s", mmc_synth_colour_names[t->colour]);
        break;
    case MMC_SYNTH_Q_SHAPE:
        snprintf(s->question, sizeof s->question, "What shape is the %s object?", mmc_synth_colour_names[t->colour]);
        snprintf(s->answer, sizeof s->answer, "%s", mmc_synth_shape_names[t->shape]);
        break;
    case MMC_SYNTH_Q_COUNT:
        snprintf(s->question, sizeof s->question, "How many shapes are there?");
        snprintf(s->answer, sizeof s->answer, "%d", n);
        break;
    default:
        snprintf(s->question, sizeof s->question, "Is the %s shape left or right of the %s shape?",
                 mmc_synth_colour_names[t->colour], mmc_synth_colour_names[s->obj[s->other].colour]);
        snprintf(s->answer, sizeof s->answer, "%s", ans == 0 ? "left" : "right");
        break;
    }
    return MMC_OK;
}

/* ---------------------------------------------------------------- rendering */
static bool inside(const mmc_synth_obj *o, float x, float y) {
    float dx = x - o->cx, dy = y - o->cy;
    switch (o->shape) {
    case MMC_SYNTH_CIRCLE: return dx * dx + dy * dy <= o->r * o->r;
    case MMC_SYNTH_SQUARE: return fabsf(dx) <= o->r && fabsf(dy) <= o->r;
    default: {
        /* apex (cx, cy - r), base from (cx - r, cy + r) to (cx + r, cy + r) */
        if (dy < -o->r || dy > o->r) return false;
        float half = 0.5f * (dy + o->r);   /* half width at this height: 0 at apex, r at base */
        return fabsf(dx) <= half;
    }
    }
}

void mmc_synth_render(const mmc_synth_sample *s, int size, bool blank, uint8_t *rgb) {
    memset(rgb, 0, (size_t)size * size * 3);
    if (blank) return;
    for (int i = 0; i < s->n_obj; i++) {
        const mmc_synth_obj *o = &s->obj[i];
        int x0 = (int)floorf(o->cx - o->r) - 1, x1 = (int)ceilf(o->cx + o->r) + 1;
        int y0 = (int)floorf(o->cy - o->r) - 1, y1 = (int)ceilf(o->cy + o->r) + 1;
        if (x0 < 0) x0 = 0;
        if (y0 < 0) y0 = 0;
        if (x1 > size - 1) x1 = size - 1;
        if (y1 > size - 1) y1 = size - 1;
        const uint8_t *c = mmc_synth_colour_rgb[o->colour];
        for (int y = y0; y <= y1; y++)
            for (int x = x0; x <= x1; x++) {
                int cover = 0;   /* of 16 subsamples at pixel-centre-relative offsets */
                for (int sy = 0; sy < 4; sy++)
                    for (int sx = 0; sx < 4; sx++)
                        cover += inside(o, x + (sx + 0.5f) / 4.0f, y + (sy + 0.5f) / 4.0f);
                if (!cover) continue;
                uint8_t *p = rgb + ((size_t)y * size + x) * 3;
                for (int ch = 0; ch < 3; ch++) {
                    int v = p[ch] + (cover * c[ch] + 8) / 16;   /* boxes never overlap */
                    p[ch] = (uint8_t)(v > 255 ? 255 : v);
                }
            }
    }
}

/* ---------------------------------------------------------------- files */
/* tmp + rename (no fsync: a dataset is cheap to regenerate, and thousands of fsyncs are not) */
static mmc_status write_atomic_nosync(const char *path, const void *data, size_t n) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return mmc_error(MMC_ERR_INVALID, "synth: path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return mmc_error(MMC_ERR_IO, "synth: cannot create %s: %s", tmp, strerror(errno));
    size_t w = fwrite(data, 1, n, f);
    int err = ferror(f);
    if (fclose(f) != 0 || w != n || err) {
        unlink(tmp);
        return mmc_error(MMC_ERR_IO, "synth: cannot write %s (disk full?)", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return mmc_error(MMC_ERR_IO, "synth: cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return MMC_OK;
}

mmc_status mmc_synth_write_png(const char *path, const uint8_t *rgb, int height, int width) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)width;
    img.height = (png_uint_32)height;
    img.format = PNG_FORMAT_RGB;
    png_alloc_size_t n = 0;
    if (!png_image_write_to_memory(&img, NULL, &n, 0, rgb, width * 3, NULL))
        return mmc_error(MMC_ERR_IO, "synth: libpng: %s", img.message);
    void *buf = malloc(n);
    if (!buf) return mmc_error(MMC_ERR_OOM, "synth: out of memory");
    if (!png_image_write_to_memory(&img, buf, &n, 0, rgb, width * 3, NULL)) {
        free(buf);
        return mmc_error(MMC_ERR_IO, "synth: libpng: %s", img.message);
    }
    mmc_status st = write_atomic_nosync(path, buf, n);
    free(buf);
    return st;
}

static mmc_status mkdir_p(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return mmc_error(MMC_ERR_INVALID, "synth: path too long: %s", dir);
    for (char *p = buf + 1;; p++) {
        bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return mmc_error(MMC_ERR_IO, "synth: cannot create directory %s: %s", buf, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    return MMC_OK;
}

/* A growable text buffer for one JSONL file. */
typedef struct { char *p; size_t n, cap; } sbuf;
static bool sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static bool sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return false;
        if (b->p && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return true; }
        size_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
}

static mmc_status write_split(const mmc_synth_opts *o, mmc_synth_split split, int64_t count,
                              uint8_t *rgb) {
    const char *name = split == MMC_SYNTH_TRAIN ? "train" : split == MMC_SYNTH_VAL ? "val" : "test";
    sbuf all = {0}, per[MMC_SYNTH_N_TYPES] = {{0}}, cur = {0};
    mmc_status st = MMC_OK;
    char path[4096];
    size_t *off = malloc((size_t)(count + 1) * sizeof *off);   /* line starts in `all` */
    if (!off) return mmc_error(MMC_ERR_OOM, "synth: out of memory");
    for (int64_t i = 0; i < count; i++) {
        off[i] = all.n;
        mmc_synth_sample s;
        if ((st = mmc_synth_make(o->seed, split, i, o->size, &s)) != MMC_OK) goto done;
        mmc_synth_render(&s, o->size, o->blank, rgb);
        char rel[64];
        snprintf(rel, sizeof rel, "images/%s_%06lld.png", name, (long long)i);
        if (snprintf(path, sizeof path, "%s/%s", o->out_dir, rel) >= (int)sizeof path) {
            st = mmc_error(MMC_ERR_INVALID, "synth: output path too long");
            goto done;
        }
        if ((st = mmc_synth_write_png(path, rgb, o->size, o->size)) != MMC_OK) goto done;
        /* questions/answers are plain ASCII without quotes: no JSON escaping needed */
        const char *fmt = "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>%s\"}, "
                          "{\"role\": \"assistant\", \"content\": \"%s\"}], \"images\": [\"%s\"], "
                          "\"type\": \"%s\"}\n";
        const char *tn = mmc_synth_type_names[s.type];
        if (!sb_printf(&all, fmt, s.question, s.answer, rel, tn) ||
            (split == MMC_SYNTH_TRAIN && !sb_printf(&per[s.type], fmt, s.question, s.answer, rel, tn))) {
            st = mmc_error(MMC_ERR_OOM, "synth: out of memory");
            goto done;
        }
    }
    off[count] = all.n;
    snprintf(path, sizeof path, "%s/%s.jsonl", o->out_dir, name);
    if ((st = write_atomic_nosync(path, all.p ? all.p : "", all.n)) != MMC_OK) goto done;
    if (split == MMC_SYNTH_TRAIN) {
        /* colour-first curriculum, for a loader that keeps file order (data.shuffle: false):
         * stage 1 colour only (N/4 lines: every colour sample once), stage 2 colour and shape
         * alternating (N/4), then every sample in its mixed order (N). */
        int64_t n1 = count / 4, n2 = count / 4;
        for (int64_t k = 0; k < n1 + n2; k++) {
            int64_t i = k < n1 ? 4 * k : 4 * ((k - n1) / 2) + ((k - n1) % 2);
            i %= count > 0 ? count : 1;
            if (count && !sb_printf(&cur, "%.*s", (int)(off[i + 1] - off[i]), all.p + off[i])) {
                st = mmc_error(MMC_ERR_OOM, "synth: out of memory");
                goto done;
            }
        }
        /* the mixed part, once per curriculum epoch: first in file order, then each pass in
         * its own seeded permutation (the loader keeps file order, so this is its shuffle) */
        int epochs = o->curriculum_epochs > 1 ? o->curriculum_epochs : 1;
        int64_t *perm = count ? malloc((size_t)count * sizeof *perm) : NULL;
        if (count && !perm) { st = mmc_error(MMC_ERR_OOM, "synth: out of memory"); goto done; }
        for (int e = 0; e < epochs && count; e++) {
            for (int64_t i = 0; i < count; i++) perm[i] = i;
            if (e > 0) {
                mmc_rng r;
                mmc_rng_init(&r, o->seed * 0x9E3779B97F4A7C15ull + 0x5851F42D4C957F2Dull * (uint64_t)e + 7);
                for (int64_t i = count - 1; i > 0; i--) {
                    int64_t j = (int64_t)(mmc_rng_u64(&r) % (uint64_t)(i + 1)), t = perm[i];
                    perm[i] = perm[j];
                    perm[j] = t;
                }
            }
            for (int64_t k = 0; k < count; k++) {
                int64_t i = perm[k];
                if (!sb_printf(&cur, "%.*s", (int)(off[i + 1] - off[i]), all.p + off[i])) {
                    free(perm);
                    st = mmc_error(MMC_ERR_OOM, "synth: out of memory");
                    goto done;
                }
            }
        }
        free(perm);
        snprintf(path, sizeof path, "%s/%s_curriculum.jsonl", o->out_dir, name);
        if ((st = write_atomic_nosync(path, cur.p ? cur.p : "", cur.n)) != MMC_OK) goto done;
    }
    if (split == MMC_SYNTH_TRAIN)
        for (int t = 0; t < MMC_SYNTH_N_TYPES; t++) {
            snprintf(path, sizeof path, "%s/%s_%s.jsonl", o->out_dir, name, mmc_synth_type_names[t]);
            if ((st = write_atomic_nosync(path, per[t].p ? per[t].p : "", per[t].n)) != MMC_OK) goto done;
        }
done:
    free(off);
    free(all.p);
    free(cur.p);
    for (int t = 0; t < MMC_SYNTH_N_TYPES; t++) free(per[t].p);
    return st;
}

mmc_status mmc_synth_write_dataset(const mmc_synth_opts *o) {
    if (!o->out_dir || !*o->out_dir) return mmc_error(MMC_ERR_INVALID, "synth: no output directory");
    if (o->n_train < 0 || o->n_val < 0) return mmc_error(MMC_ERR_INVALID, "synth: negative sample count");
    if (o->size < 28 || o->size > 1024)
        return mmc_error(MMC_ERR_INVALID, "synth: image size %d not in [28, 1024]", o->size);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/images", o->out_dir);
    mmc_status st = mkdir_p(dir);
    if (st != MMC_OK) return st;
    uint8_t *rgb = malloc((size_t)o->size * o->size * 3);
    if (!rgb) return mmc_error(MMC_ERR_OOM, "synth: out of memory");
    st = write_split(o, MMC_SYNTH_TRAIN, o->n_train, rgb);
    if (st == MMC_OK) st = write_split(o, MMC_SYNTH_VAL, o->n_val, rgb);
    free(rgb);
    return st;
}
