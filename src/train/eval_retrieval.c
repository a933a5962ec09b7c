/* eval_retrieval.c — zero-shot image <-> text retrieval of a dual encoder (mmc_embed.h) on an
 * image-caption JSONL, as clip_benchmark's zero-shot retrieval task scores it:
 *
 *   S = image_embeds @ caption_embeds^T                         [images, captions]
 *   image -> text: rank of the best of the image's own captions in its row of S
 *   text -> image: rank of the caption's image in its column of S
 *   recall@K = share of ranks < K, K = 1, 5, 10
 *
 * Lines: {"image": PATH, "caption": TEXT} or {"image": PATH, "captions": [TEXT, ...]}; blank
 * lines are skipped; anything else is an error naming the file and line. */
#include "mmc_embed.h"
#include "mmc_io.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char **paths;            /* [images] resolved image paths */
    char **caps;             /* [captions] */
    int64_t *owner;          /* [captions] the image each caption describes */
    int64_t n_img, n_cap, cap_img, cap_cap;
} ret_data;

static void ret_data_free(ret_data *d) {
    for (int64_t i = 0; i < d->n_img; i++) free(d->paths[i]);
    for (int64_t i = 0; i < d->n_cap; i++) free(d->caps[i]);
    free(d->paths);
    free(d->caps);
    free(d->owner);
    memset(d, 0, sizeof *d);
}

static mmc_status push_caption(ret_data *d, const char *text, int64_t img) {
    if (d->n_cap == d->cap_cap) {
        int64_t cap = d->cap_cap ? 2 * d->cap_cap : 64;
        char **c = realloc(d->caps, (size_t)cap * sizeof *c);
        if (c) d->caps = c;
        int64_t *o = realloc(d->owner, (size_t)cap * sizeof *o);
        if (o) d->owner = o;
        if (!c || !o) return mmc_error(MMC_ERR_OOM, "out of memory");
        d->cap_cap = cap;
    }
    if (!(d->caps[d->n_cap] = strdup(text))) return mmc_error(MMC_ERR_OOM, "out of memory");
    d->owner[d->n_cap++] = img;
    return MMC_OK;
}

static mmc_status read_data(const mmc_retrieval_opts *o, ret_data *d) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(o->data_path, &text, &len);
    if (st) return st;
    char root[1024];
    if (o->image_root) snprintf(root, sizeof root, "%s", o->image_root);
    else {
        snprintf(root, sizeof root, "%s", o->data_path);
        char *slash = strrchr(root, '/');
        if (slash) *slash = 0;
        else snprintf(root, sizeof root, ".");
    }
    int line = 0;
    char *cur = text;
    for (char *q; !st && (q = mmc_next_line(&cur, &line));) {
        if (o->limit && d->n_img >= o->limit) break;
        char what[1100];
        snprintf(what, sizeof what, "%s:%d", o->data_path, line);
        mmc_json *j = NULL;
        if ((st = mmc_json_parse(q, strlen(q), what, &j))) break;
        const char *img = NULL, *cap = NULL;
        if (!mmc_json_is_object(j) || (st = mmc_json_str(j, "image", NULL, &img)) ||
            (st = mmc_json_str(j, "caption", NULL, &cap)) || !img) {
            if (!st) st = mmc_error(MMC_ERR_FORMAT, "%s: each line must be an object with \"image\" and "
                                    "\"caption\" or \"captions\"", what);
            mmc_json_free(j);
            break;
        }
        if (d->n_img == d->cap_img) {
            int64_t c = d->cap_img ? 2 * d->cap_img : 64;
            char **np = realloc(d->paths, (size_t)c * sizeof *np);
            if (!np) { st = mmc_error(MMC_ERR_OOM, "out of memory"); mmc_json_free(j); break; }
            d->paths = np;
            d->cap_img = c;
        }
        char full[2200];
        if (img[0] == '/') snprintf(full, sizeof full, "%s", img);
        else snprintf(full, sizeof full, "%s/%s", root, img);
        if (!(d->paths[d->n_img] = strdup(full))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); mmc_json_free(j); break; }
        const int64_t id = d->n_img++;
        int64_t before = d->n_cap;
        if (cap) st = push_caption(d, cap, id);
        for (int k = 0; !st; k++) {
            char key[32];
            snprintf(key, sizeof key, "captions.%d", k);
            if (!mmc_json_has(j, key)) break;
            const char *c = NULL;
            if ((st = mmc_json_str(j, key, NULL, &c))) break;
            if (c) st = push_caption(d, c, id);
        }
        if (!st && mmc_json_has(j, "captions") && !mmc_json_has(j, "captions.0") && !cap)
            st = mmc_error(MMC_ERR_FORMAT, "%s: \"captions\" must be a non-empty list of strings", what);
        if (!st && d->n_cap == before)
            st = mmc_error(MMC_ERR_FORMAT, "%s: no caption (give \"caption\" or \"captions\")", what);
        mmc_json_free(j);
    }
    free(text);
    if (!st && d->n_img == 0) st = mmc_error(MMC_ERR_FORMAT, "%s: no samples", o->data_path);
    return st;
}

/* 0-based rank of column `target` in row (n values), ties broken by index (a stable descending sort) */
static int64_t rank_of(const float *row, int64_t n, int64_t stride, int64_t target) {
    const float v = row[target * stride];
    int64_t r = 0;
    for (int64_t j = 0; j < n; j++) {
        const float x = row[j * stride];
        if (x > v || (x == v && j < target)) r++;
    }
    return r;
}

mmc_status mmc_retrieval_eval(const mmc_retrieval_opts *o, mmc_retrieval_result *r) {
    memset(r, 0, sizeof *r);
    ret_data d = {0};
    mmc_dual_encoder *m = NULL;
    float *ie = NULL, *te = NULL, *S = NULL;
    mmc_status st = read_data(o, &d);
    if (st) goto done;
    if ((st = mmc_dual_encoder_load(o->model_dir, &m))) goto done;
    mmc_dual_encoder_image_proc(m)->resize_mode = (mmc_vlproc_resize_mode)o->image_backend;
    const int64_t D = mmc_dual_encoder_dim(m), NI = d.n_img, NC = d.n_cap;
    ie = malloc((size_t)(NI * D) * sizeof *ie);
    te = malloc((size_t)(NC * D) * sizeof *te);
    S = malloc((size_t)(NI * NC) * sizeof *S);
    r->i2t_rank = malloc((size_t)NI * sizeof *r->i2t_rank);
    r->t2i_rank = malloc((size_t)NC * sizeof *r->t2i_rank);
    if (!ie || !te || !S || !r->i2t_rank || !r->t2i_rank) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (o->max_image_pixels) io.max_pixels = o->max_image_pixels;
    for (int64_t i = 0; i < NI && !st; i++) {   /* one image at a time: memory stays flat */
        mmc_image img = {0};
        if ((st = mmc_image_load(d.paths[i], &io, &img))) break;
        st = mmc_dual_encoder_embed_images(m, &img, 1, ie + i * D);
        mmc_image_free(&img);
        if (o->progress && (i + 1 == NI || (i + 1) % 64 == 0))
            fprintf(o->progress, "\rretrieval: images %lld/%lld", (long long)(i + 1), (long long)NI);
    }
    if (st) goto done;
    for (int64_t c0 = 0; c0 < NC && !st; c0 += 64) {
        const int64_t nb = NC - c0 < 64 ? NC - c0 : 64;
        st = mmc_dual_encoder_embed_texts(m, (const char *const *)d.caps + c0, (int)nb, te + c0 * D);
        if (o->progress) fprintf(o->progress, "\rretrieval: images %lld/%lld, captions %lld/%lld", (long long)NI,
                                 (long long)NI, (long long)(c0 + nb), (long long)NC);
    }
    if (o->progress) fputc('\n', o->progress);
    if (st) goto done;
    for (int64_t i = 0; i < NI; i++)
        for (int64_t j = 0; j < NC; j++) {
            double s = 0;
            for (int64_t k = 0; k < D; k++) s += (double)ie[i * D + k] * te[j * D + k];
            S[i * NC + j] = (float)s;
        }
    static const int K[3] = {1, 5, 10};
    for (int64_t i = 0; i < NI; i++) {
        int64_t best = NC;
        for (int64_t j = 0; j < NC; j++)
            if (d.owner[j] == i) {
                int64_t rk = rank_of(S + i * NC, NC, 1, j);
                if (rk < best) best = rk;
            }
        r->i2t_rank[i] = best;
        for (int k = 0; k < 3; k++) r->i2t_recall[k] += best < K[k];
    }
    for (int64_t j = 0; j < NC; j++) {
        r->t2i_rank[j] = rank_of(S + j, NI, NC, d.owner[j]);
        for (int k = 0; k < 3; k++) r->t2i_recall[k] += r->t2i_rank[j] < K[k];
    }
    for (int k = 0; k < 3; k++) {
        r->i2t_recall[k] /= (double)NI;
        r->t2i_recall[k] /= (double)NC;
    }
    r->images = NI;
    r->captions = NC;
done:
    free(ie);
    free(te);
    free(S);
    mmc_dual_encoder_free(m);
    ret_data_free(&d);
    if (st) mmc_retrieval_result_free(r);
    return st;
}

void mmc_retrieval_result_free(mmc_retrieval_result *r) {
    free(r->i2t_rank);
    free(r->t2i_rank);
    memset(r, 0, sizeof *r);
}
