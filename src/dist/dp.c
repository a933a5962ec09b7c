/* dp.c — data-parallel gradient reduction with overlap, and ZeRO-1/2 optimizer/gradient
 * sharding (mmc_dp.h). Mirrors PyTorch DDP's reducer (buckets in reverse parameter order,
 * started from backward) and DeepSpeed ZeRO stage 1/2 (per-bucket flat buffers, each rank
 * owning a contiguous 1/N of every bucket). */
#include "mmc_dp.h"
#include "ctx_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int first, count;          /* slots [first, first+count) of d->order */
    int64_t len, padded, shard;
    float *flat;               /* [padded] gradients in, gathered parameters out */
    float *gshard;             /* [shard] reduced gradient of this rank's shard (ZeRO >= 1) */
    float *rshard;             /* [shard] ZeRO-2: receive buffer of one micro-batch */
    mmc_dist_req *req;
    bool started;
    int ready_at;              /* tape index after which every parameter's gradient is final */
} bucket;

struct mmc_dp {
    mmc_comm *comm;
    int rank, size, zero, n;
    mmc_tensor **model, **opt;
    int *order;                /* parameter index per slot (bucket order) */
    int64_t *off;              /* offset of each parameter inside its bucket */
    int *bucket_of;
    bucket *b;
    int nb, next;
    /* ZeRO >= 1: AdamW over slice tensors (views of this rank's shard) */
    mmc_tensor **slices;
    int *slice_param;
    int64_t *slice_lo;         /* element offset of the slice inside its parameter */
    int n_slices;
    mmc_adamw adamw;
    double t_first, t_last, exposed;
};

static void *falloc(int64_t n) {
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float), cap = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, cap);
    if (p) memset(p, 0, cap);
    return p;
}

mmc_status mmc_dp_new(mmc_comm *comm, int zero, mmc_tensor **model, mmc_tensor **opt, int n,
                      size_t bucket_bytes, const mmc_adamw_opts *o, mmc_dp **out) {
    *out = NULL;
    if (zero < 0 || zero > 2)
        return mmc_error(MMC_ERR_UNSUPPORTED, "parallel.zero %d: stages 0, 1 and 2 are implemented (ZeRO-3 "
                         "parameter sharding is not yet)", zero);
    mmc_dp *d = calloc(1, sizeof *d);
    if (!d) return mmc_error(MMC_ERR_OOM, "out of memory");
    d->comm = comm;
    d->rank = mmc_comm_rank(comm);
    d->size = mmc_comm_size(comm);
    d->zero = zero;
    d->n = n;
    d->model = model;
    d->opt = opt;
    const char *env = getenv("MMC_DP_BUCKET_BYTES");
    if (env && atoll(env) > 0) bucket_bytes = (size_t)atoll(env);
    if (!bucket_bytes) bucket_bytes = 4u << 20;
    d->order = calloc((size_t)n, sizeof *d->order);
    d->off = calloc((size_t)n, sizeof *d->off);
    d->bucket_of = calloc((size_t)n, sizeof *d->bucket_of);
    d->b = calloc((size_t)n + 1, sizeof *d->b);
    if (!d->order || !d->off || !d->bucket_of || !d->b) goto oom;
    /* reverse declaration order: lm_head and the last layers complete first */
    for (int s = 0; s < n; s++) d->order[s] = n - 1 - s;
    for (int s = 0; s < n;) {
        bucket *bk = &d->b[d->nb];
        bk->first = s;
        int64_t len = 0;
        do {
            int p = d->order[s];
            MMC_CHECK(opt[p]->dtype == MMC_F32 && mmc_is_contiguous(opt[p]), "dp: %s must be contiguous f32",
                      opt[p]->name);
            d->off[p] = len;
            d->bucket_of[p] = d->nb;
            len += mmc_numel(opt[p]);
            s++;
        } while (s < n && (size_t)(len + mmc_numel(opt[d->order[s]])) * sizeof(float) <= bucket_bytes);
        bk->count = s - bk->first;
        bk->len = len;
        bk->shard = (len + d->size - 1) / d->size;
        bk->padded = bk->shard * d->size;
        if (!(bk->flat = falloc(bk->padded))) goto oom;
        if (zero >= 1 && !(bk->gshard = falloc(bk->shard))) goto oom;
        if (zero == 2 && !(bk->rshard = falloc(bk->shard))) goto oom;
        d->nb++;
    }
    if (zero >= 1) {
        /* slices of this rank's shard: [rank*S, (rank+1)*S) of every bucket, cut per parameter */
        d->slices = calloc((size_t)n + (size_t)d->nb, sizeof *d->slices);
        d->slice_param = calloc((size_t)n + (size_t)d->nb, sizeof *d->slice_param);
        d->slice_lo = calloc((size_t)n + (size_t)d->nb, sizeof *d->slice_lo);
        if (!d->slices || !d->slice_param || !d->slice_lo) goto oom;
        for (int bi = 0; bi < d->nb; bi++) {
            bucket *bk = &d->b[bi];
            int64_t lo = (int64_t)d->rank * bk->shard, hi = lo + bk->shard;
            for (int s = bk->first; s < bk->first + bk->count; s++) {
                int p = d->order[s];
                int64_t a = d->off[p], z = a + mmc_numel(opt[p]);
                int64_t l = a > lo ? a : lo, h = z < hi ? z : hi;
                if (h <= l) continue;
                int64_t shape[2] = {1, h - l};
                bool mat = opt[p]->ndim >= 2;   /* keeps AdamW's no-decay rule for vectors */
                mmc_tensor *sl = mmc_tensor_wrap(MMC_F32, mat ? 2 : 1, mat ? shape : shape + 1,
                                                 (float *)opt[p]->data + (l - a));
                mmc_tensor *gr = mmc_tensor_wrap(MMC_F32, mat ? 2 : 1, mat ? shape : shape + 1,
                                                 bk->gshard + (l - lo));
                if (!sl || !gr) { mmc_tensor_free(sl); mmc_tensor_free(gr); goto oom; }
                sl->grad = gr;
                sl->flags |= MMC_REQUIRES_GRAD;
                snprintf(sl->name, sizeof sl->name, "%s", opt[p]->name);
                d->slice_param[d->n_slices] = p;
                d->slice_lo[d->n_slices] = l - a;
                d->slices[d->n_slices++] = sl;
            }
        }
        mmc_status st = mmc_adamw_init(&d->adamw, o, d->slices, d->n_slices);
        if (st) { mmc_dp_free(d); return st; }
    }
    *out = d;
    return MMC_OK;
oom:
    mmc_dp_free(d);
    return mmc_error(MMC_ERR_OOM, "out of memory for data-parallel buckets");
}

void mmc_dp_free(mmc_dp *d) {
    if (!d) return;
    for (int i = 0; i < d->nb; i++) {
        mmc_dist_wait(d->b[i].req);
        free(d->b[i].flat);
        free(d->b[i].gshard);
        free(d->b[i].rshard);
    }
    mmc_adamw_free(&d->adamw);
    for (int i = 0; i < d->n_slices; i++) {
        mmc_tensor *g = d->slices[i]->grad;
        d->slices[i]->grad = NULL;
        mmc_tensor_free(g);
        mmc_tensor_free(d->slices[i]);
    }
    free(d->slices);
    free(d->slice_param);
    free(d->slice_lo);
    free(d->b);
    free(d->order);
    free(d->off);
    free(d->bucket_of);
    free(d);
}

/* ZeRO-2: fold a finished micro-batch reduction into the sharded accumulator. */
static mmc_status settle(mmc_dp *d, bucket *bk) {
    if (!bk->req) return MMC_OK;
    double t0 = mmc_now();
    mmc_status st = mmc_dist_wait(bk->req);
    d->exposed += mmc_now() - t0;
    bk->req = NULL;
    d->t_last = mmc_now();
    if (d->zero == 2)
        for (int64_t i = 0; i < bk->shard; i++) bk->gshard[i] += bk->rshard[i];
    return st;
}

static void start_bucket(mmc_dp *d, bucket *bk) {
    if (d->zero == 2) settle(d, bk);   /* the previous micro-batch's reduction of this bucket */
    for (int s = bk->first; s < bk->first + bk->count; s++) {
        int p = d->order[s];
        mmc_tensor *g = d->model[p]->grad;
        float *dst = bk->flat + d->off[p];
        int64_t k = mmc_numel(d->opt[p]);
        if (g) {
            memcpy(dst, g->data, (size_t)k * sizeof(float));
            if (d->zero == 2) memset(g->data, 0, (size_t)k * sizeof(float));
        } else {
            memset(dst, 0, (size_t)k * sizeof(float));
        }
    }
    if (!d->t_first) d->t_first = mmc_now();
    mmc_status st;
    if (d->zero == 0) st = mmc_all_reduce_start(d->comm, bk->flat, bk->flat, bk->padded, MMC_F32, MMC_SUM, &bk->req);
    else st = mmc_reduce_scatter_start(d->comm, bk->flat, d->zero == 2 ? bk->rshard : bk->gshard, bk->shard,
                                       MMC_F32, MMC_SUM, &bk->req);
    MMC_CHECK(st == MMC_OK, "dp: starting a bucket reduction failed: %s", mmc_last_error());
    bk->started = true;
}

void mmc_dp_backward(mmc_dp *d, mmc_ctx *c, mmc_tensor *loss, bool last) {
    MMC_CHECK(mmc_numel(loss) == 1, "mmc_dp_backward: loss must be a scalar");
    bool reduce = last || d->zero == 2;
    if (reduce) {
        /* each bucket is final once the tape has unwound past the first use of its parameters;
         * parameters not seen as node inputs (e.g. inside a checkpointed block) wait for the end */
        for (int i = 0; i < d->nb; i++) { d->b[i].ready_at = INT_MAX; d->b[i].started = false; }
        for (int i = 0; i < d->n; i++) d->model[i]->flags |= 1u << 30;   /* "not seen yet" mark */
        for (int j = 0; j < c->tape_len; j++) {
            mmc_node *nd = c->tape[j];
            for (int k = 0; k < nd->n_in; k++) {
                mmc_tensor *x = nd->in[k];
                if (!x || !(x->flags & (1u << 30)) || !(x->flags & MMC_PARAM)) continue;
                for (int p = 0; p < d->n; p++)
                    if (d->model[p] == x) {
                        x->flags &= ~(1u << 30);
                        bucket *bk = &d->b[d->bucket_of[p]];
                        if (j < bk->ready_at) bk->ready_at = j;
                        break;
                    }
            }
        }
        for (int i = 0; i < d->n; i++)
            if (d->model[i]->flags & (1u << 30)) { d->model[i]->flags &= ~(1u << 30); d->b[d->bucket_of[i]].ready_at = 0; }
        for (int i = 0; i < d->nb; i++) if (d->b[i].ready_at == INT_MAX) d->b[i].ready_at = 0;
        d->next = 0;
    }
    if (!mmc_requires_grad(loss)) {
        if (reduce) while (d->next < d->nb) start_bucket(d, &d->b[d->next++]);
        return;
    }
    mmc_tensor *g = mmc_grad(c, loss);
    ((float *)g->data)[0] += 1.0f;
    bool prev = mmc_set_grad_enabled(c, false);
    for (int i = c->tape_len - 1; i >= 0; i--) {
        mmc_backward_range(c, i, i + 1);
        if (reduce)
            while (d->next < d->nb && i <= d->b[d->next].ready_at) start_bucket(d, &d->b[d->next++]);
    }
    if (reduce) while (d->next < d->nb) start_bucket(d, &d->b[d->next++]);
    mmc_set_grad_enabled(c, prev);
}

mmc_status mmc_dp_finish(mmc_dp *d, mmc_ctx *c) {
    mmc_status st = MMC_OK;
    for (int i = 0; i < d->nb; i++) {
        mmc_status s2 = settle(d, &d->b[i]);
        if (s2 && !st) st = s2;
    }
    if (d->zero == 0) {
        for (int i = 0; i < d->nb; i++) {
            bucket *bk = &d->b[i];
            for (int s = bk->first; s < bk->first + bk->count; s++) {
                int p = d->order[s];
                mmc_tensor *g = mmc_grad(c, d->model[p]);   /* allocated if this rank had none */
                memcpy(g->data, bk->flat + d->off[p], (size_t)mmc_numel(d->opt[p]) * sizeof(float));
            }
        }
    }
    return st;
}

mmc_status mmc_dp_clip(mmc_dp *d, double max_norm, double *norm) {
    double s = 0;
    for (int i = 0; i < d->nb; i++) {
        const float *g = d->b[i].gshard;
        for (int64_t k = 0; k < d->b[i].shard; k++) s += (double)g[k] * g[k];
    }
    mmc_status st = mmc_all_reduce(d->comm, &s, &s, 1, MMC_F64, MMC_SUM);
    if (st) return st;
    *norm = sqrt(s);
    if (max_norm > 0 && *norm > max_norm && isfinite(*norm)) {
        float coef = (float)(max_norm / (*norm + 1e-6));
        for (int i = 0; i < d->nb; i++)
            for (int64_t k = 0; k < d->b[i].shard; k++) d->b[i].gshard[k] *= coef;
    }
    return MMC_OK;
}

mmc_status mmc_dp_step(mmc_dp *d, double lr) {
    mmc_adamw_step(&d->adamw, lr);
    for (int i = 0; i < d->nb; i++) memset(d->b[i].gshard, 0, (size_t)d->b[i].shard * sizeof(float));
    /* my shard of the updated parameters into place, then all-gather each bucket in place */
    for (int j = 0; j < d->n_slices; j++) {
        int p = d->slice_param[j];
        bucket *bk = &d->b[d->bucket_of[p]];
        memcpy(bk->flat + d->off[p] + d->slice_lo[j], d->slices[j]->data,
               (size_t)mmc_numel(d->slices[j]) * sizeof(float));
    }
    for (int i = 0; i < d->nb; i++) {
        bucket *bk = &d->b[i];
        mmc_status st = mmc_all_gather_start(d->comm, bk->flat + (int64_t)d->rank * bk->shard, bk->flat, bk->shard,
                                             MMC_F32, &bk->req);
        if (st) return st;
    }
    mmc_status st = MMC_OK;
    for (int i = 0; i < d->nb; i++) {
        bucket *bk = &d->b[i];
        mmc_status s2 = mmc_dist_wait(bk->req);
        bk->req = NULL;
        if (s2 && !st) st = s2;
        for (int s = bk->first; s < bk->first + bk->count; s++) {
            int p = d->order[s];
            memcpy(d->opt[p]->data, bk->flat + d->off[p], (size_t)mmc_numel(d->opt[p]) * sizeof(float));
        }
    }
    return st;
}

/* moment k (0 = m, 1 = v): shards -> full per-parameter arrays (or back) through the flats */
static mmc_status gather_moment(mmc_dp *d, mmc_adamw *a, int k) {
    for (int j = 0; j < d->n_slices; j++) {
        int p = d->slice_param[j];
        bucket *bk = &d->b[d->bucket_of[p]];
        memcpy(bk->flat + d->off[p] + d->slice_lo[j], k ? d->adamw.v[j] : d->adamw.m[j],
               (size_t)mmc_numel(d->slices[j]) * sizeof(float));
    }
    for (int i = 0; i < d->nb; i++) {
        bucket *bk = &d->b[i];
        mmc_status st = mmc_all_gather(d->comm, bk->flat + (int64_t)d->rank * bk->shard, bk->flat, bk->shard, MMC_F32);
        if (st) return st;
    }
    for (int q = 0; q < a->n; q++) {
        int p = -1;
        for (int s = 0; s < d->n; s++) if (d->opt[s] == a->params[q]) { p = s; break; }
        if (p < 0) continue;
        memcpy(k ? a->v[q] : a->m[q], d->b[d->bucket_of[p]].flat + d->off[p],
               (size_t)mmc_numel(d->opt[p]) * sizeof(float));
    }
    return MMC_OK;
}

mmc_status mmc_dp_gather_state(mmc_dp *d, mmc_adamw *a) {
    if (d->zero == 0) return MMC_OK;
    mmc_status st = gather_moment(d, a, 0);
    if (!st) st = gather_moment(d, a, 1);
    a->step = d->adamw.step;
    return st;
}

void mmc_dp_scatter_state(mmc_dp *d, const mmc_adamw *a) {
    if (d->zero == 0) return;
    for (int j = 0; j < d->n_slices; j++) {
        int p = d->slice_param[j];
        for (int q = 0; q < a->n; q++)
            if (a->params[q] == d->opt[p]) {
                size_t bytes = (size_t)mmc_numel(d->slices[j]) * sizeof(float);
                memcpy(d->adamw.m[j], a->m[q] + d->slice_lo[j], bytes);
                memcpy(d->adamw.v[j], a->v[q] + d->slice_lo[j], bytes);
                break;
            }
    }
    d->adamw.step = a->step;
}

int64_t mmc_dp_adamw_step(const mmc_dp *d) { return d->adamw.step; }
void mmc_dp_set_adamw_step(mmc_dp *d, int64_t s) { d->adamw.step = s; }

void mmc_dp_get_memory(const mmc_dp *d, mmc_dp_memory *m) {
    memset(m, 0, sizeof *m);
    for (int p = 0; p < d->n; p++) {
        m->params += (int64_t)mmc_nbytes(d->model[p]) + (d->opt[p] != d->model[p] ? (int64_t)mmc_nbytes(d->opt[p]) : 0);
        if (d->model[p]->grad) m->grads += (int64_t)mmc_nbytes(d->model[p]->grad);
    }
    for (int i = 0; i < d->nb; i++) {
        m->buckets += d->b[i].padded * 4;
        m->grads += (d->b[i].gshard ? d->b[i].shard * 4 : 0) + (d->b[i].rshard ? d->b[i].shard * 4 : 0);
    }
    for (int j = 0; j < d->n_slices; j++) m->optim += 2 * mmc_numel(d->slices[j]) * 4;
}

void mmc_dp_get_timing(const mmc_dp *d, double *exposed, double *comm) {
    if (exposed) *exposed = d->exposed;
    if (comm) *comm = d->t_first && d->t_last > d->t_first ? d->t_last - d->t_first : 0;
}

void mmc_dp_reset_timing(mmc_dp *d) { d->t_first = d->t_last = 0; d->exposed = 0; }

void mmc_dp_get_layout(const mmc_dp *d, mmc_dp_layout *l) {
    memset(l, 0, sizeof *l);
    l->rank = d->rank;
    l->world = d->size;
    l->zero = d->zero;
    l->n = d->n;
    l->nb = d->nb;
    l->n_slices = d->n_slices;
    l->bucket_len = calloc((size_t)d->nb + 1, sizeof *l->bucket_len);
    l->bucket_shard = calloc((size_t)d->nb + 1, sizeof *l->bucket_shard);
    l->param_bucket = calloc((size_t)d->n + 1, sizeof *l->param_bucket);
    l->param_off = calloc((size_t)d->n + 1, sizeof *l->param_off);
    l->param_numel = calloc((size_t)d->n + 1, sizeof *l->param_numel);
    l->slice_param = calloc((size_t)d->n_slices + 1, sizeof *l->slice_param);
    l->slice_numel = calloc((size_t)d->n_slices + 1, sizeof *l->slice_numel);
    l->m = calloc((size_t)d->n_slices + 1, sizeof *l->m);
    l->v = calloc((size_t)d->n_slices + 1, sizeof *l->v);
    MMC_CHECK(l->bucket_len && l->bucket_shard && l->param_bucket && l->param_off && l->param_numel &&
              l->slice_param && l->slice_numel && l->m && l->v, "dp: out of memory for the layout");
    for (int i = 0; i < d->nb; i++) { l->bucket_len[i] = d->b[i].len; l->bucket_shard[i] = d->b[i].shard; }
    for (int p = 0; p < d->n; p++) {
        l->param_bucket[p] = d->bucket_of[p];
        l->param_off[p] = d->off[p];
        l->param_numel[p] = mmc_numel(d->opt[p]);
    }
    for (int j = 0; j < d->n_slices; j++) {
        l->slice_param[j] = d->slice_param[j];
        l->slice_numel[j] = mmc_numel(d->slices[j]);
        l->m[j] = d->adamw.m[j];
        l->v[j] = d->adamw.v[j];
    }
}

void mmc_dp_layout_free(mmc_dp_layout *l) {
    free(l->bucket_len);
    free(l->bucket_shard);
    free(l->param_bucket);
    free(l->param_off);
    free(l->param_numel);
    free(l->slice_param);
    free(l->slice_numel);
    free(l->m);
    free(l->v);
    memset(l, 0, sizeof *l);
}
