/* image_demo.c — the captioned-shapes task of the image-generation demo (mmc_image_demo.h): the
 * dataset (one `mmc synth` object per image, "a red circle on the left"), the held-out
 * combinations, and the pixel judge of generated images with its grid PNG (prompts drawn with a
 * built-in 5x7 bitmap font, so the grid needs no font library). */
#include "mmc_image_demo.h"
#include "mmc_image.h"
#include "mmc_io.h"
#include "mmc_synth.h"
#include "trainer_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const side_names[2] = {"left", "right"};

void mmc_imgdemo_combo(int k, mmc_imgdemo_caption *c) {
    c->colour = k / 6, c->shape = (k / 2) % 3, c->side = k % 2;
    snprintf(c->caption, sizeof c->caption, "a %s %s on the %s", mmc_synth_colour_names[c->colour],
             mmc_synth_shape_names[c->shape], side_names[c->side]);
}

bool mmc_imgdemo_held_out(const mmc_imgdemo_caption *c) { return (c->colour + c->shape + c->side) % 4 == 0; }

/* ------------------------------------------------------------------ scenes */
static float rand_f(mmc_rng *r, float lo, float hi) {
    float v;
    mmc_rng_uniform(r, &v, 1, lo, hi);
    return v;
}

/* One object of caption c in a cell of the 2 x 2 grid (synth's place(): half extent 0.28-0.40 of a
 * cell, jitter keeping a 1-px margin), in the caption's column, the row drawn. */
static void make_scene(uint64_t seed, int split, int64_t index, int size, const mmc_imgdemo_caption *c,
                       mmc_synth_sample *s) {
    memset(s, 0, sizeof *s);
    mmc_rng r;
    mmc_rng_init(&r, seed * 0x9E3779B97F4A7C15ull + (uint64_t)split * 0xD1B54A32D192ED03ull + 0x1D);
    r.offset = (uint64_t)index << 20;
    const float cell = size / 2.0f;
    const int row = (int)(mmc_rng_u64(&r) % 2);
    mmc_synth_obj *o = &s->obj[0];
    o->shape = c->shape, o->colour = c->colour;
    o->r = rand_f(&r, 0.28f, 0.40f) * cell;
    float j = 0.5f * cell - o->r - 1.0f;
    if (j < 0) j = 0;
    o->cx = (c->side + 0.5f) * cell + rand_f(&r, -j, j);
    o->cy = (row + 0.5f) * cell + rand_f(&r, -j, j);
    s->n_obj = 1;
    s->other = -1;
}

static mmc_status mkdir_one(const char *d) {
    if (mkdir(d, 0755) != 0 && errno != EEXIST) return mmc_error(MMC_ERR_IO, "image-demo: cannot create %s: %s", d, strerror(errno));
    return MMC_OK;
}

static mmc_status write_text(const char *path, const char *text) {
    return mmc_write_file_atomic(path, text ? text : "", text ? strlen(text) : 0);
}

/* a growable string */
typedef struct { char *p; size_t n, cap; } sbuf;
static bool sb_add(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap < b->n + k + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
    return true;
}

mmc_status mmc_imgdemo_write_data(const mmc_imgdemo_data_opts *o) {
    if (!o->out_dir || !*o->out_dir) return mmc_error(MMC_ERR_INVALID, "image-demo data: no output directory");
    if (o->size < 16 || o->size > 1024) return mmc_error(MMC_ERR_INVALID, "image-demo data: size %d not in [16, 1024]", o->size);
    if (o->n_train < 1 || o->n_val < 0) return mmc_error(MMC_ERR_INVALID, "image-demo data: need --train >= 1 and --val >= 0");
    int train_c[MMC_IMGDEMO_N_COMBOS], val_c[MMC_IMGDEMO_N_COMBOS], nt = 0, nv = 0;
    for (int k = 0; k < MMC_IMGDEMO_N_COMBOS; k++) {
        mmc_imgdemo_caption c;
        mmc_imgdemo_combo(k, &c);
        bool h = mmc_imgdemo_held_out(&c);
        if (!o->hold_out || !h) train_c[nt++] = k;
        if (!o->hold_out || h) val_c[nv++] = k;
    }
    char path[4200], line[512];
    mmc_status st;
    snprintf(path, sizeof path, "%s", o->out_dir);
    if ((st = mmc_mkdir_p(path))) return st;
    const char *sub[] = {"train", "train/images", "train_shuffled", "val_ref"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", o->out_dir, sub[i]);
        if ((st = mkdir_one(path))) return st;
    }
    const int S = o->size;
    uint8_t *rgb = malloc((size_t)S * S * 3);
    int64_t *perm = malloc((size_t)o->n_train * sizeof *perm);
    sbuf meta = {0}, shuf = {0}, val = {0};
    if (!rgb || !perm) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int64_t i = 0; i < o->n_train; i++) perm[i] = i;
    mmc_rng r;
    mmc_rng_init(&r, o->seed * 0x9E3779B97F4A7C15ull + 0x5E);
    for (int64_t i = o->n_train - 1; i > 0; i--) {
        int64_t j = (int64_t)(mmc_rng_u64(&r) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int64_t i = 0; i < o->n_train; i++) {
        mmc_imgdemo_caption c, cs;
        mmc_imgdemo_combo(train_c[i % nt], &c);
        mmc_imgdemo_combo(train_c[perm[i] % nt], &cs);   /* the caption of another image */
        mmc_synth_sample s;
        make_scene(o->seed, 0, i, S, &c, &s);
        mmc_synth_render(&s, S, false, rgb);
        snprintf(path, sizeof path, "%s/train/images/%06lld.png", o->out_dir, (long long)i);
        if ((st = mmc_synth_write_png(path, rgb, S, S))) goto done;
        snprintf(line, sizeof line, "{\"file_name\": \"images/%06lld.png\", \"text\": \"%s\"}\n", (long long)i, c.caption);
        bool ok = sb_add(&meta, line);
        snprintf(line, sizeof line, "{\"file_name\": \"../train/images/%06lld.png\", \"text\": \"%s\"}\n", (long long)i,
                 cs.caption);
        if (!ok || !sb_add(&shuf, line)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    }
    for (int64_t i = 0; i < o->n_val; i++) {
        mmc_imgdemo_caption c;
        mmc_imgdemo_combo(val_c[i % nv], &c);
        mmc_synth_sample s;
        make_scene(o->seed, 1, i, S, &c, &s);   /* a reference rendering of the prompt (judge's check) */
        mmc_synth_render(&s, S, false, rgb);
        snprintf(path, sizeof path, "%s/val_ref/val_%06lld.png", o->out_dir, (long long)i);
        if ((st = mmc_synth_write_png(path, rgb, S, S))) goto done;
        snprintf(line, sizeof line, "{\"caption\": \"%s\", \"colour\": \"%s\", \"shape\": \"%s\", \"side\": \"%s\", "
                 "\"seed\": %lld}\n", c.caption, mmc_synth_colour_names[c.colour], mmc_synth_shape_names[c.shape],
                 side_names[c.side], (long long)(1000 + i));
        if (!sb_add(&val, line)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    }
    snprintf(path, sizeof path, "%s/train/metadata.jsonl", o->out_dir);
    if ((st = write_text(path, meta.p))) goto done;
    snprintf(path, sizeof path, "%s/train_shuffled/metadata.jsonl", o->out_dir);
    if ((st = write_text(path, shuf.p))) goto done;
    snprintf(path, sizeof path, "%s/val.jsonl", o->out_dir);
    st = write_text(path, val.p);
done:
    free(rgb);
    free(perm);
    free(meta.p), free(shuf.p), free(val.p);
    return st;
}

/* ------------------------------------------------------------------ the pixel judge */
typedef struct { int colour, side, shape; bool empty; } pix_verdict;

static void judge_pixels(const mmc_image *im, pix_verdict *v) {
    const int H = im->height, W = im->width;
    int maxb = 0;
    for (int64_t i = 0; i < (int64_t)H * W; i++) {
        const uint8_t *p = im->data + i * 3;
        int b = p[0] > p[1] ? p[0] : p[1];
        b = b > p[2] ? b : p[2];
        if (b > maxb) maxb = b;
    }
    const int thr = maxb / 2 > 40 ? maxb / 2 : 40;
    int64_t cnt[MMC_SYNTH_N_COLOURS] = {0}, n = 0;
    double sx = 0;
    int x0 = W, x1 = -1, y0 = H, y1 = -1;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            const uint8_t *p = im->data + ((int64_t)y * W + x) * 3;
            int b = p[0] > p[1] ? p[0] : p[1];
            b = b > p[2] ? b : p[2];
            if (b < thr) continue;
            int best = 0;
            long bd = -1;
            for (int c = 0; c < MMC_SYNTH_N_COLOURS; c++) {
                long d = 0;
                for (int ch = 0; ch < 3; ch++) {
                    long e = (long)p[ch] - mmc_synth_colour_rgb[c][ch];
                    d += e * e;
                }
                if (bd < 0 || d < bd) bd = d, best = c;
            }
            cnt[best]++, n++, sx += x + 0.5;
            if (x < x0) x0 = x;
            if (x > x1) x1 = x;
            if (y < y0) y0 = y;
            if (y > y1) y1 = y;
        }
    v->empty = n == 0;
    v->colour = v->side = v->shape = -1;
    if (!n) return;
    for (int c = 0; c < MMC_SYNTH_N_COLOURS; c++)
        if (v->colour < 0 || cnt[c] > cnt[v->colour]) v->colour = c;
    v->side = sx / (double)n < W / 2.0 ? 0 : 1;
    /* shape: the template fitted to the foreground's bounding box (the square is the box, the
     * circle the inscribed ellipse, the triangle apex-up as synth draws it) that overlaps the
     * foreground best (intersection over union) */
    const double bw = x1 - x0 + 1, bh = y1 - y0 + 1, mx = x0 + bw / 2, my = y0 + bh / 2;
    int64_t inter[MMC_SYNTH_N_SHAPES] = {0}, area[MMC_SYNTH_N_SHAPES] = {0};
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++) {
            const uint8_t *p = im->data + ((int64_t)y * W + x) * 3;
            int b = p[0] > p[1] ? p[0] : p[1];
            b = b > p[2] ? b : p[2];
            const bool fg = b >= thr;
            const double dx = (x + 0.5 - mx) / (bw / 2), dy = (y + 0.5 - my) / (bh / 2);   /* in [-1, 1] */
            const bool in[MMC_SYNTH_N_SHAPES] = {[MMC_SYNTH_CIRCLE] = dx * dx + dy * dy <= 1.0,
                                                 [MMC_SYNTH_SQUARE] = true,
                                                 [MMC_SYNTH_TRIANGLE] = fabs(dx) <= 0.5 * (dy + 1.0)};
            for (int k = 0; k < MMC_SYNTH_N_SHAPES; k++) inter[k] += fg && in[k], area[k] += in[k];
        }
    double best = -1;
    for (int k = 0; k < MMC_SYNTH_N_SHAPES; k++) {
        const double iou = (double)inter[k] / (double)(area[k] + n - inter[k]);
        if (iou > best) best = iou, v->shape = k;
    }
}

/* 5x7 glyphs of a-z, rows top to bottom, bit 4 the leftmost column */
static const uint8_t font5x7[26][7] = {
    {0, 0, 14, 1, 15, 17, 15},      {16, 16, 30, 17, 17, 17, 30}, {0, 0, 14, 16, 16, 17, 14},
    {1, 1, 15, 17, 17, 17, 15},     {0, 0, 14, 17, 31, 16, 14},   {6, 9, 8, 28, 8, 8, 8},
    {0, 15, 17, 17, 15, 1, 14},     {16, 16, 22, 25, 17, 17, 17}, {4, 0, 12, 4, 4, 4, 14},
    {2, 0, 6, 2, 2, 18, 12},        {16, 16, 18, 20, 24, 20, 18}, {12, 4, 4, 4, 4, 4, 14},
    {0, 0, 26, 21, 21, 17, 17},     {0, 0, 22, 25, 17, 17, 17},   {0, 0, 14, 17, 17, 17, 14},
    {0, 30, 17, 17, 30, 16, 16},    {0, 15, 17, 17, 15, 1, 1},    {0, 0, 22, 25, 16, 16, 16},
    {0, 0, 15, 16, 14, 1, 30},      {8, 8, 28, 8, 8, 9, 6},       {0, 0, 17, 17, 17, 19, 13},
    {0, 0, 17, 17, 17, 10, 4},      {0, 0, 17, 17, 21, 21, 10},   {0, 0, 17, 10, 4, 10, 17},
    {0, 17, 17, 15, 1, 17, 14},     {0, 0, 31, 2, 4, 8, 31},
};

static void draw_text(uint8_t *rgb, int stride, int x, int y, const char *s, int n) {
    for (int i = 0; i < n; i++, x += 6) {
        const char ch = s[i];
        if (ch < 'a' || ch > 'z') continue;
        for (int r = 0; r < 7; r++)
            for (int c = 0; c < 5; c++)
                if (font5x7[ch - 'a'][r] >> (4 - c) & 1) memset(rgb + ((size_t)(y + r) * stride + x + c) * 3, 230, 3);
    }
}

static void fill_rect(uint8_t *rgb, int stride, int x, int y, int w, int h, const uint8_t c[3]) {
    for (int yy = y; yy < y + h; yy++)
        for (int xx = x; xx < x + w; xx++) memcpy(rgb + ((size_t)yy * stride + xx) * 3, c, 3);
}

#define GRID_COLS 8
#define CELL_IMG 96
#define CELL_W 104
#define CELL_TEXT_LINES 3
#define CELL_H (4 + CELL_TEXT_LINES * 9 + 2 + CELL_IMG + 3 + 6 + 6)

/* a cell: the caption word-wrapped to 16 characters a line, the image scaled by nearest
 * neighbour, then three marks (colour, side, shape by pixels): green agrees, red does not */
static void draw_cell(uint8_t *g, int stride, int cx, int cy, const char *caption, const mmc_image *im, const int ok[3]) {
    const int per_line = (CELL_W - 4) / 6;
    const char *p = caption;
    for (int line = 0; line < CELL_TEXT_LINES && *p; line++) {
        int take = (int)strlen(p);
        if (take > per_line) {
            take = per_line;
            while (take > 0 && p[take] != ' ') take--;
            if (take == 0) take = per_line;
        }
        draw_text(g, stride, cx + 2, cy + 4 + line * 9, p, take);
        p += take;
        while (*p == ' ') p++;
    }
    const int iy = cy + 4 + CELL_TEXT_LINES * 9 + 2, ix = cx + (CELL_W - CELL_IMG) / 2;
    for (int y = 0; y < CELL_IMG; y++)
        for (int x = 0; x < CELL_IMG; x++) {
            const int sy = y * im->height / CELL_IMG, sx = x * im->width / CELL_IMG;
            memcpy(g + ((size_t)(iy + y) * stride + ix + x) * 3, im->data + ((size_t)sy * im->width + sx) * 3, 3);
        }
    static const uint8_t good[3] = {40, 200, 60}, bad[3] = {230, 40, 40};
    for (int k = 0; k < 3; k++) fill_rect(g, stride, ix + k * 10, iy + CELL_IMG + 3, 8, 6, ok[k] ? good : bad);
}

static int name_index(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

mmc_status mmc_imgdemo_judge(const char *val, const char *images_dir, const char *out_dir, const char *grid_png,
                             mmc_imgdemo_judgement *out) {
    char *text = NULL, path[4200], line[1024];
    size_t len = 0;
    memset(out, 0, sizeof *out);
    mmc_status st = mmc_read_file(val, &text, &len);
    if (st) return mmc_error_prefix(st, "image-demo judge --val");
    if ((st = mmc_mkdir_p(out_dir))) { free(text); return st; }
    snprintf(path, sizeof path, "%s/vlm", out_dir);
    if ((st = mkdir_one(path))) { free(text); return st; }
    int64_t n = 0, ok_c = 0, ok_s = 0, ok_p = 0, n_lines = 0;
    for (const char *q = text; *q; q++) n_lines += *q == '\n';
    const int rows = (int)((n_lines + 1 + GRID_COLS - 1) / GRID_COLS), gw = GRID_COLS * CELL_W, gh = rows * CELL_H;
    uint8_t *grid = calloc((size_t)gw * gh * 3, 1);
    sbuf per = {0}, vq = {0};
    if (!grid) { free(text); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    int lineno = 0;
    char *cur = text;
    for (char *s; (s = mmc_next_line(&cur, &lineno));) {
        cJSON *j = cJSON_Parse(s);
        const cJSON *cap = cJSON_GetObjectItemCaseSensitive(j, "caption"), *col = cJSON_GetObjectItemCaseSensitive(j, "colour"),
                    *shp = cJSON_GetObjectItemCaseSensitive(j, "shape"), *sd = cJSON_GetObjectItemCaseSensitive(j, "side");
        int wc = -1, ws = -1, wp = -1;
        if (cJSON_IsString(col)) wc = name_index(col->valuestring, mmc_synth_colour_names, MMC_SYNTH_N_COLOURS);
        if (cJSON_IsString(shp)) ws = name_index(shp->valuestring, mmc_synth_shape_names, MMC_SYNTH_N_SHAPES);
        if (cJSON_IsString(sd)) wp = name_index(sd->valuestring, side_names, 2);
        if (!cJSON_IsString(cap) || wc < 0 || ws < 0 || wp < 0) {
            cJSON_Delete(j);
            st = mmc_error(MMC_ERR_FORMAT, "%s:%d: expected {\"caption\", \"colour\", \"shape\", \"side\"} with synth's "
                           "names (mmc image-demo data writes them)", val, lineno);
            break;
        }
        char caption[128];
        snprintf(caption, sizeof caption, "%s", cap->valuestring);
        cJSON_Delete(j);
        snprintf(path, sizeof path, "%s/val_%06lld.png", images_dir, (long long)n);
        mmc_image_opts io;
        mmc_image_opts_default(&io);
        mmc_image im = {0}, big = {0};
        if ((st = mmc_image_load(path, &io, &im))) break;
        pix_verdict v;
        judge_pixels(&im, &v);
        const int ok[3] = {v.colour == wc, v.side == wp, v.shape == ws};
        ok_c += ok[0], ok_p += ok[1], ok_s += ok[2];
        draw_cell(grid, gw, (int)(n % GRID_COLS) * CELL_W, (int)(n / GRID_COLS) * CELL_H, caption, &im, ok);
        /* the VLM's copy at the size it was trained on, and its two questions */
        if ((st = mmc_image_resize(&im, 56, 56, MMC_RESAMPLE_BILINEAR, &big))) { mmc_image_free(&im); break; }
        snprintf(path, sizeof path, "%s/vlm/val_%06lld.png", out_dir, (long long)n);
        st = mmc_image_write_png(path, big.data, 56, 56, 0, NULL, NULL);
        mmc_image_free(&im);
        mmc_image_free(&big);
        if (st) break;
        snprintf(line, sizeof line,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>What colour is the %s?\"}, {\"role\": "
                 "\"assistant\", \"content\": \"%s\"}], \"images\": [\"vlm/val_%06lld.png\"], \"type\": \"colour\"}\n"
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>What shape is the %s object?\"}, {\"role\": "
                 "\"assistant\", \"content\": \"%s\"}], \"images\": [\"vlm/val_%06lld.png\"], \"type\": \"shape\"}\n",
                 mmc_synth_shape_names[ws], mmc_synth_colour_names[wc], (long long)n, mmc_synth_colour_names[wc],
                 mmc_synth_shape_names[ws], (long long)n);
        bool okb = sb_add(&vq, line);
        snprintf(line, sizeof line, "{\"image\": \"val_%06lld.png\", \"caption\": \"%s\", \"colour\": \"%s\", \"side\": \"%s\", "
                 "\"shape\": \"%s\", \"agree\": {\"colour\": %s, \"side\": %s, \"shape\": %s}}\n", (long long)n, caption,
                 v.colour >= 0 ? mmc_synth_colour_names[v.colour] : "none", v.side >= 0 ? side_names[v.side] : "none",
                 v.shape >= 0 ? mmc_synth_shape_names[v.shape] : "none", ok[0] ? "true" : "false",
                 ok[1] ? "true" : "false", ok[2] ? "true" : "false");
        if (!okb || !sb_add(&per, line)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
        n++;
    }
    free(text);
    if (!st && n == 0) st = mmc_error(MMC_ERR_FORMAT, "%s: no captions", val);
    if (!st) {
        out->n = n;
        out->colour = (double)ok_c / n, out->side = (double)ok_p / n, out->shape = (double)ok_s / n;
        snprintf(path, sizeof path, "%s/judge.jsonl", out_dir);
        st = write_text(path, per.p);
        snprintf(path, sizeof path, "%s/vlm_questions.jsonl", out_dir);
        if (!st) st = write_text(path, vq.p);
        snprintf(line, sizeof line, "{\"samples\":%lld,\"colour\":%.4f,\"side\":%.4f,\"shape_pixels\":%.4f}\n",
                 (long long)n, out->colour, out->side, out->shape);
        snprintf(path, sizeof path, "%s/judge.json", out_dir);
        if (!st) st = write_text(path, line);
        const int used_rows = (int)((n + GRID_COLS - 1) / GRID_COLS);
        const char *keys[] = {"software"}, *vals[] = {"mmc image-demo judge: prompts and generated images; marks: colour, "
                                                       "side, shape by pixel statistics (green agrees)"};
        if (!st && grid_png) st = mmc_image_write_png(grid_png, grid, used_rows * CELL_H, gw, 1, keys, vals);
    }
    free(grid);
    free(per.p), free(vq.p);
    return st;
}
