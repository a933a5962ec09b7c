/* dp.c — data-parallel gradient reduction with overlap, and ZeRO-1/2/3 sharding (mmc_dp.h).
 * Mirrors PyTorch DDP's reducer (buckets in reverse parameter order, started from backward),
 * DeepSpeed ZeRO stage 1/2 (per-bucket flat buffers, each rank owning a contiguous 1/N of
 * every bucket) and, for stage 3, PyTorch FSDP (one flat parameter per unit — a decoder layer
 * or a vision block — all-gathered just before the unit's forward and again before its
 * backward, freed afterwards; the remaining "root" parameters stay gathered from the start of
 * a micro-batch's forward to the reduction of their gradients, like FSDP's root module).
 *
 * Gradient memory with ZeRO >= 2: a bucket's gradients live in a flat buffer created on the
 * first gradient write into the bucket (through the context's grad hook), reduce-scattered
 * when the bucket is final and freed once that completes; what persists is this rank's shard
 * of the reduced sum. ZeRO-2 keeps at most two reductions in flight (the newest and the one
 * before); ZeRO-3 settles finished ones without waiting (see start_bucket).
 *
 * Collective order: every rank must issue the same collectives in the same order whatever
 * its micro-batch holds (a rank may have no image, so it never runs the vision tower). The
 * gradient reductions start in bucket order on the DP communicator; ZeRO-3 parameter
 * all-gathers run on a second communicator (a split of the first) in a fixed schedule — every
 * unit once in forward order during forward, once in backward order during backward — and a
 * unit this rank does not need is gathered and dropped, so the ranks stay in step.
 *
 * ZeRO-3 dtypes: a unit's parameters form one bucket per model dtype, so that a bf16 model's
 * weights are all-gathered in bf16 (half the bytes of f32) from the fp32 master shard AdamW
 * updates (rounded exactly as the one-process trainer rounds its masters), while its f32 norms
 * and biases travel in f32. Untrained parameters (LoRA's base, a frozen tower) are sharded too,
 * in buckets of their own after the trained ones (no gradient, no optimizer state), gathered
 * with their unit; in backward a unit made only of them is gathered only when a trained
 * parameter precedes it in the forward (else no gradient flows through it). */
#include "mmc_dp.h"
#include "ctx_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { G_NONE = 0, G_ISSUED = 1, G_CLAIMED = 2 };   /* ZeRO-3 parameter gather state of a bucket */

typedef struct {
    int first, count;          /* slots [first, first+count) of d->order */
    int64_t len, padded, shard;
    float *flat;               /* ZeRO 0/1: [padded] persistent: gradients in, gathered parameters out */
    float *gflat;              /* ZeRO >= 2: [padded] this micro-batch's gradients (the params' ->grad) */
    float *sflat;              /* ZeRO >= 2: [padded] gradients being reduce-scattered */
    float *gshard;             /* [shard] reduced gradient of this rank's shard (ZeRO >= 1) */
    float *rshard;             /* [shard] ZeRO >= 2: transient receive buffer of a later micro-batch */
    bool acc_zero;             /* ZeRO >= 2: gshard holds nothing yet this step (receive into it) */
    float *pshard;             /* [shard] ZeRO-3: this rank's fp32 parameters (the master shard) */
    void *pflat;               /* [padded] ZeRO-3: gathered parameters (in wdt) while resident */
    mmc_dist_req *req;         /* gradient reduction in flight */
    mmc_dist_req *preq;        /* ZeRO-3 parameter all-gather in flight */
    int gstate;                /* ZeRO-3: G_* */
    bool root;                 /* ZeRO-3: the root unit (gathered for the whole micro-batch) */
    int ready_at;              /* tape index after which every parameter's gradient is final */
    mmc_dtype wdt;             /* ZeRO-3: the dtype its parameters are gathered in (the model's) */
    bool frozen;               /* ZeRO-3: untrained parameters: no gradient, no optimizer state */
    int unit;                  /* ZeRO-3: its unit, -1 = the root */
    void *fshard;              /* [shard] ZeRO-3, frozen: this rank's values, in wdt */
} bucket;

typedef struct { int *list, *pos; int n, next; } schedule;   /* ZeRO-3 gather order (bucket indices) */

struct mmc_dp {
    mmc_comm *comm, *pcomm;    /* pcomm: ZeRO-3 parameter gathers */
    int rank, size, zero, n;
    mmc_tensor **model, **opt;
    mmc_tensor **all;          /* [n + nf] model[], then the sharded untrained parameters (ZeRO-3) */
    int nf;
    int64_t frozen_bytes;      /* untrained parameters held whole (not sharded) */
    int *order;                /* parameter index (into all) per slot (bucket order) */
    int64_t *off;              /* offset of each parameter inside its bucket */
    int *bucket_of;
    bucket *b;
    int nb, nt, next;          /* nb trained buckets, then frozen ones up to nt; next: the next
                                * bucket to start in this backward */
    /* units (hook keys): unit_of[p] in [0, nu) or -1 */
    int nu, *unit_of, *unit_first;
    int *ub_first, *ub_count, *ub_list;   /* ZeRO-3: unit u's buckets (u = nu: the root) */
    const void **keys;
    mmc_tensor **gwrap;        /* ZeRO >= 2: [n] gradient views into a bucket's gflat */
    schedule fs, bs;           /* ZeRO-3: forward / backward gather schedules */
    bool in_backward, pinned;
    mmc_ctx *ctx;
    /* ZeRO >= 1: AdamW over slice tensors (views of this rank's shard) */
    mmc_tensor **slices;
    int *slice_param;
    int64_t *slice_lo;         /* element offset of the slice inside its parameter */
    int n_slices;
    mmc_adamw adamw;
    double t_first, t_last, exposed;
    int64_t live_g, live_p, peak_g, peak_p;   /* transient gradient / parameter bytes now and at most */
    int64_t peak_p_steps;      /* peak_p before a gather for saving / evaluating */
    mmc_comm *tp;              /* tensor parallelism (mmc_dp_set_tp): the norm's split terms are summed over it */
    signed char *tp_split;     /* [n] */
    bool partial_checked;      /* mmc_dp_reduce_partial checked the group's layouts */
    bool masters_out;          /* ZeRO-3: mmc_dp_gather_masters filled full fp32 masters */
    mmc_comm *norm_outer;      /* mmc_dp_set_norm_group: the norm's squares summed over it too (pipeline stages) */
    unsigned char *norm_skip;  /* [n] or NULL: parameters left out of the norm (a stage's tied embedding copy) */
};

static void *falloc(int64_t n) {
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float), cap = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, cap);
    if (p) memset(p, 0, cap);
    return p;
}

/* transient buffers, counted (n elements of 4 bytes; tballoc: bytes) */
static void *tballoc(mmc_dp *d, int64_t bytes, bool grad) {
    void *p = falloc((bytes + 3) / 4);
    MMC_CHECK(p, "dp: out of memory for a %lld-byte transient buffer", (long long)bytes);
    int64_t *live = grad ? &d->live_g : &d->live_p, *peak = grad ? &d->peak_g : &d->peak_p;
    *live += bytes;
    if (*live > *peak) *peak = *live;
    return p;
}

static void tbfree(mmc_dp *d, void **p, int64_t bytes, bool grad) {
    if (!*p) return;
    free(*p);
    *p = NULL;
    *(grad ? &d->live_g : &d->live_p) -= bytes;
}

static float *talloc(mmc_dp *d, int64_t n, bool grad) { return tballoc(d, n * 4, grad); }

static void tfree(mmc_dp *d, float **p, int64_t n, bool grad) {
    void *v = *p;
    tbfree(d, &v, n * 4, grad);
    *p = NULL;
}

static int param_index(const mmc_dp *d, const mmc_tensor *t) {
    for (int p = 0; p < d->n; p++) if (d->model[p] == t) return p;
    return -1;
}

static int any_index(const mmc_dp *d, const mmc_tensor *t) {   /* trained or sharded frozen */
    for (int p = 0; p < d->n + d->nf; p++) if (d->all[p] == t) return p;
    return -1;
}

static int unit_index(const mmc_dp *d, const void *key) {
    for (int u = 0; u < d->nu; u++) if (d->keys[u] == key) return u;
    return -1;
}

/* ---------------------------------------------------------------- ZeRO-3 parameters */
static void gather_start(mmc_dp *d, bucket *bk) {
    if (bk->gstate != G_NONE) return;
    const size_t es = mmc_dtype_size(bk->wdt);
    bk->pflat = tballoc(d, bk->padded * (int64_t)es, false);
    char *mine = (char *)bk->pflat + (size_t)d->rank * (size_t)bk->shard * es;
    if (bk->frozen) memcpy(mine, bk->fshard, (size_t)bk->shard * es);
    else if (bk->wdt == MMC_F32) memcpy(mine, bk->pshard, (size_t)bk->shard * sizeof(float));
    else mmc_convert(mine, bk->wdt, bk->pshard, MMC_F32, bk->shard);   /* as the trainer rounds its masters */
    mmc_status st = mmc_all_gather_start(d->pcomm, mine, bk->pflat, bk->shard, bk->wdt, &bk->preq);
    MMC_CHECK(st == MMC_OK, "dp: starting a parameter all-gather failed: %s", mmc_last_error());
    bk->gstate = G_ISSUED;
}

static void gather_wait(mmc_dp *d, bucket *bk) {
    if (bk->preq) {
        double t0 = mmc_now();
        mmc_status st = mmc_dist_wait(bk->preq);
        d->exposed += mmc_now() - t0;
        bk->preq = NULL;
        MMC_CHECK(st == MMC_OK, "dp: a parameter all-gather failed: %s", mmc_last_error());
    }
    const size_t es = mmc_dtype_size(bk->wdt);
    for (int s = bk->first; s < bk->first + bk->count; s++) {
        int p = d->order[s];
        d->all[p]->data = (char *)bk->pflat + (size_t)d->off[p] * es;
    }
}

static void release(mmc_dp *d, bucket *bk) {
    if (bk->gstate == G_NONE) return;
    if (bk->preq) gather_wait(d, bk);
    for (int s = bk->first; s < bk->first + bk->count; s++) d->all[d->order[s]]->data = NULL;
    tbfree(d, &bk->pflat, bk->padded * (int64_t)mmc_dtype_size(bk->wdt), false);
    bk->gstate = G_NONE;
}

/* Bucket kb of schedule s is needed now: issue the schedule's gathers up to it (dropping units
 * issued earlier and not asked for — this rank does not use them), wait for it, prefetch the
 * next. */
static void need_one(mmc_dp *d, schedule *s, int kb) {
    bucket *bk = &d->b[kb];
    int pos = s->pos[kb];
    if (bk->gstate == G_CLAIMED) return;
    MMC_CHECK(pos >= 0, "dp: ZeRO-3 unit %d (untrained parameters only) is used in backward although no trained "
              "parameter precedes it in the forward", bk->unit);
    MMC_CHECK(bk->gstate == G_ISSUED || pos >= s->next, "dp: ZeRO-3 unit %d is used twice in one %s pass; "
              "each unit's parameters may be used by one block only", bk->unit, d->in_backward ? "backward" : "forward");
    while (s->next <= pos) gather_start(d, &d->b[s->list[s->next++]]);
    for (int q = 0; q < pos; q++) {
        bucket *o = &d->b[s->list[q]];
        if (o->gstate == G_ISSUED) release(d, o);
    }
    gather_wait(d, bk);
    bk->gstate = G_CLAIMED;
    if (s->next < s->n) gather_start(d, &d->b[s->list[s->next++]]);   /* prefetch */
}

/* The unit of bucket kb is needed now: every bucket of it (one per dtype, trained and frozen).
 * In backward, trained buckets already reduced are over, and frozen buckets of the units
 * before it in the schedule (later in the forward) are released: their backward is done. */
static void need(mmc_dp *d, int kb) {
    bucket *bk = &d->b[kb];
    if (bk->root || d->pinned) return;
    schedule *s = d->in_backward ? &d->bs : &d->fs;
    const int u = bk->unit, c = d->ub_count[u], *l = d->ub_list + d->ub_first[u];
    if (d->in_backward) {
        int p0 = INT_MAX;
        for (int k = 0; k < c; k++) if (s->pos[l[k]] >= 0 && s->pos[l[k]] < p0) p0 = s->pos[l[k]];
        for (int q = 0; q < p0 && q < s->n; q++) {
            bucket *o = &d->b[s->list[q]];
            if (o->frozen && o->gstate == G_CLAIMED) release(d, o);
        }
    }
    for (int k = 0; k < c; k++) {
        int i = d->in_backward ? l[k] : l[c - 1 - k];   /* the schedule's order inside the unit */
        if (d->in_backward && !d->b[i].frozen && i < d->next) continue;
        need_one(d, s, i);
    }
}

static void release_unit(mmc_dp *d, int u) {
    for (int k = 0; k < d->ub_count[u]; k++) release(d, &d->b[d->ub_list[d->ub_first[u] + k]]);
}

/* the rest of a schedule: every rank issues every unit's gather once per pass */
static void flush(mmc_dp *d, schedule *s) {
    while (s->next < s->n) gather_start(d, &d->b[s->list[s->next++]]);
    for (int q = 0; q < s->n; q++) {
        bucket *o = &d->b[s->list[q]];
        if (o->gstate == G_ISSUED) release(d, o);
    }
}

/* ---------------------------------------------------------------- hooks */
static void hook_begin(void *user, mmc_ctx *c, const void *key) {
    mmc_dp *d = user;
    int u = unit_index(d, key);
    if (u < 0) return;
    if (!d->in_backward && (c->grad_enabled || c->ckpt_depth > 0) && c->tape_len < d->unit_first[u])
        d->unit_first[u] = c->tape_len;
    if (d->zero == 3 && d->ub_count[u] > 0) need(d, d->ub_list[d->ub_first[u]]);
}

static void hook_end(void *user, mmc_ctx *c, const void *key) {
    mmc_dp *d = user;
    (void)c;
    if (d->zero != 3 || d->in_backward || d->pinned) return;   /* in backward: freed when reduced */
    int u = unit_index(d, key);
    if (u >= 0) release_unit(d, u);
}

static void grads_materialize(mmc_dp *d, bucket *bk) {
    bk->gflat = talloc(d, bk->padded, true);
    for (int s = bk->first; s < bk->first + bk->count; s++) {
        int p = d->order[s];
        d->gwrap[p]->data = bk->gflat + d->off[p];
        d->model[p]->grad = d->gwrap[p];
    }
}

static mmc_tensor *hook_grad(void *user, mmc_ctx *c, mmc_tensor *t) {
    mmc_dp *d = user;
    (void)c;
    if (d->zero < 2) return NULL;
    int p = param_index(d, t);
    if (p < 0) return NULL;
    bucket *bk = &d->b[d->bucket_of[p]];
    MMC_CHECK(!d->in_backward || d->bucket_of[p] >= d->next, "dp: gradient of %s requested after its bucket "
              "was reduced (its first use was not seen on the tape or by a begin hook)", t->name);
    if (!bk->gflat) grads_materialize(d, bk);
    return t->grad;
}

/* ---------------------------------------------------------------- set-up */
/* ZeRO-3: may untrained parameter t be sharded? (dense floating-point values in memory) */
static bool shardable(const mmc_tensor *t) {
    return t && t->data && mmc_is_contiguous(t) && (t->dtype == MMC_F32 || t->dtype == MMC_BF16 || t->dtype == MMC_F16);
}

mmc_status mmc_dp_new(mmc_comm *comm, int zero, mmc_tensor **model, mmc_tensor **opt, int n, size_t bucket_bytes,
                      const mmc_adamw_opts *o, const mmc_dp_units *units, mmc_dp **out) {
    *out = NULL;
    if (zero < 0 || zero > 3)
        return mmc_error(MMC_ERR_INVALID, "parallel.zero %d: the ZeRO stages are 0, 1, 2 and 3", zero);
    if (zero == 3)
        for (int p = 0; p < n; p++)
            if (opt[p] != model[p] && (model[p]->dtype != MMC_BF16 && model[p]->dtype != MMC_F16))
                return mmc_error(MMC_ERR_UNSUPPORTED, "parallel.zero 3: %s is %s with an fp32 master; ZeRO-3 gathers "
                                 "bf16 / f16 working weights only", opt[p]->name, mmc_dtype_name(model[p]->dtype));
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
    const int nfz = units ? units->n_frozen : 0;
    d->nu = units ? units->n_units : 0;
    d->all = calloc((size_t)(n + nfz) + 1, sizeof *d->all);
    int *fz_unit = calloc((size_t)nfz + 1, sizeof *fz_unit);
    if (!d->all || !fz_unit) { free(fz_unit); goto oom; }
    for (int p = 0; p < n; p++) d->all[p] = model[p];
    /* untrained parameters: ZeRO-3 shards the dense ones; the rest (and every one, for the other
     * stages) stay whole and are only counted */
    for (int j = 0; j < nfz; j++) {
        mmc_tensor *t = units->frozen[j];
        if (zero == 3 && shardable(t)) {
            int u = units->frozen_unit ? units->frozen_unit[j] : -1;
            MMC_CHECK(u >= -1 && u < d->nu, "dp: unit %d of %s out of range", u, t->name);
            fz_unit[d->nf] = u;
            d->all[n + d->nf++] = t;
        } else if (t) {
            d->frozen_bytes += (int64_t)mmc_nbytes(t);
        }
    }
    const int N = n + d->nf;
    d->order = calloc((size_t)N + 1, sizeof *d->order);
    d->off = calloc((size_t)N + 1, sizeof *d->off);
    d->bucket_of = calloc((size_t)N + 1, sizeof *d->bucket_of);
    d->b = calloc((size_t)N + 1, sizeof *d->b);
    d->unit_of = calloc((size_t)N + 1, sizeof *d->unit_of);
    d->keys = calloc((size_t)d->nu + 1, sizeof *d->keys);
    d->unit_first = calloc((size_t)d->nu + 1, sizeof *d->unit_first);
    d->ub_first = calloc((size_t)d->nu + 2, sizeof *d->ub_first);
    d->ub_count = calloc((size_t)d->nu + 2, sizeof *d->ub_count);
    d->ub_list = calloc((size_t)N + 1, sizeof *d->ub_list);
    if (!d->order || !d->off || !d->bucket_of || !d->b || !d->unit_of || !d->keys || !d->unit_first || !d->ub_first ||
        !d->ub_count || !d->ub_list) {
        free(fz_unit);
        goto oom;
    }
    for (int u = 0; u < d->nu; u++) d->keys[u] = units->keys[u];
    for (int p = 0; p < N; p++) {
        d->unit_of[p] = p >= n ? fz_unit[p - n] : units ? units->unit_of[p] : -1;
        MMC_CHECK(d->unit_of[p] >= -1 && d->unit_of[p] < d->nu, "dp: unit %d of %s out of range", d->unit_of[p],
                  d->all[p]->name);
    }
    free(fz_unit);
    /* bucket boundaries (per slot: does a new bucket start here?) */
    char *cut = calloc((size_t)N + 1, 1);
    int nu1 = d->nu + 1, *uo = malloc(sizeof(int) * (size_t)nu1), *fpos = malloc(sizeof(int) * (size_t)nu1);
    if (!cut || !uo || !fpos) { free(cut); free(uo); free(fpos); goto oom; }
    if (zero < 3) {
        /* reverse declaration order: lm_head and the last layers complete first */
        for (int s = 0; s < n; s++) d->order[s] = n - 1 - s;
        int64_t len = 0;
        for (int s = 0; s < n; s++) {
            int64_t k = mmc_numel(opt[d->order[s]]);
            if (s == 0 || (size_t)(len + k) * sizeof(float) > bucket_bytes) { cut[s] = 1; len = 0; }
            len += k;
        }
    } else {
        /* units by descending forward position (last layers first: the order backward completes
         * them), the root last; each unit's trained parameters one bucket per model dtype, in
         * reverse order; then, in a second run, the untrained ones the same way */
        for (int u = 0; u < nu1; u++) { fpos[u] = INT_MAX; uo[u] = u; }
        if (units && units->fwd_pos) {
            for (int u = 0; u < d->nu; u++) fpos[u] = units->fwd_pos[u];
        } else {
            for (int p = 0; p < N; p++) {   /* the order of the units' first parameters */
                int u = d->unit_of[p] < 0 ? d->nu : d->unit_of[p];
                int key = p < n ? p : n + p;   /* frozen-only units after the trained ones */
                if (key < fpos[u]) fpos[u] = key;
            }
        }
        for (int i = 1; i < d->nu; i++)   /* insertion sort, descending forward position (root stays last) */
            for (int j = i; j > 0 && fpos[uo[j - 1]] < fpos[uo[j]]; j--) { int x = uo[j]; uo[j] = uo[j - 1]; uo[j - 1] = x; }
        static const mmc_dtype dts[] = {MMC_BF16, MMC_F16, MMC_F32};
        int s = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < nu1; k++)
                for (int di = 0; di < 3; di++) {
                    int u = uo[k], s0 = s;
                    for (int p = (pass ? N : n) - 1; p >= (pass ? n : 0); p--)
                        if ((d->unit_of[p] < 0 ? d->nu : d->unit_of[p]) == u && d->all[p]->dtype == dts[di])
                            d->order[s++] = p;
                    if (s > s0) cut[s0] = 1;
                }
        MMC_CHECK(s == N, "dp: %d of %d parameters placed in ZeRO-3 buckets (a trained parameter that is neither "
                  "f32, bf16 nor f16?)", s, N);
    }
    for (int s = 0; s < (zero == 3 ? N : n);) {
        bucket *bk = &d->b[d->nt];
        bk->first = s;
        int64_t len = 0;
        const bool fz = d->order[s] >= n;   /* (after every trained bucket: the slot order) */
        do {
            int p = d->order[s];
            if (p < n)
                MMC_CHECK(opt[p]->dtype == MMC_F32 && mmc_is_contiguous(opt[p]), "dp: %s must be contiguous f32",
                          opt[p]->name);
            d->off[p] = len;
            d->bucket_of[p] = d->nt;
            len += mmc_numel(d->all[p]);
            s++;
        } while (s < N && !cut[s]);
        bk->count = s - bk->first;
        bk->len = len;
        bk->shard = (len + d->size - 1) / d->size;
        bk->padded = bk->shard * d->size;
        bk->frozen = fz;
        bk->wdt = zero == 3 ? d->all[d->order[bk->first]]->dtype : MMC_F32;
        bk->unit = d->unit_of[d->order[bk->first]];
        bk->root = zero == 3 && bk->unit < 0;
        bk->acc_zero = true;
        d->nt++;
        if (!fz) d->nb = d->nt;
        if (zero <= 1 && !(bk->flat = falloc(bk->padded))) goto oom_cut;
        if (zero >= 1 && !fz && !(bk->gshard = falloc(bk->shard))) goto oom_cut;
        if (zero == 3 && !fz && !(bk->pshard = falloc(bk->shard))) goto oom_cut;
        if (fz) {   /* this rank's part of the untrained values, kept in their dtype */
            const size_t es = mmc_dtype_size(bk->wdt);
            if (!(bk->fshard = falloc((bk->shard * (int64_t)es + 3) / 4))) goto oom_cut;
            int64_t lo = (int64_t)d->rank * bk->shard, hi = lo + bk->shard;
            for (int q = bk->first; q < bk->first + bk->count; q++) {
                int p = d->order[q];
                int64_t a = d->off[p], z = a + mmc_numel(d->all[p]);
                int64_t l = a > lo ? a : lo, h = z < hi ? z : hi;
                if (h > l)
                    memcpy((char *)bk->fshard + (size_t)(l - lo) * es, (const char *)d->all[p]->data + (size_t)(l - a) * es,
                           (size_t)(h - l) * es);
            }
        }
    }
    free(cut);
    cut = NULL;
    if (zero >= 2) {
        d->gwrap = calloc((size_t)n + 1, sizeof *d->gwrap);
        if (!d->gwrap) goto oom_cut;
        for (int p = 0; p < n; p++)
            if (!(d->gwrap[p] = mmc_tensor_wrap(MMC_F32, model[p]->ndim, model[p]->shape, NULL))) goto oom_cut;
    }
    if (zero == 3) {
        /* each unit's buckets (in bucket order), the root as unit nu */
        for (int u = 0, k = 0; u < nu1; u++) {
            d->ub_first[u] = k;
            for (int i = 0; i < d->nt; i++)
                if ((d->b[i].unit < 0 ? d->nu : d->b[i].unit) == u) d->ub_list[k++] = i;
            d->ub_count[u] = k - d->ub_first[u];
        }
        /* gather schedules: backward = the units in backward order, forward = every unit in
         * forward order; the root is apart. A unit of untrained parameters only is needed in
         * backward when a gradient flows through it: a trained parameter precedes it in the
         * forward (the caller knows; else a trained root parameter counts, as it may be the
         * embeddings) */
        d->fs.list = calloc((size_t)d->nt + 1, sizeof(int));
        d->fs.pos = calloc((size_t)d->nt + 1, sizeof(int));
        d->bs.list = calloc((size_t)d->nt + 1, sizeof(int));
        d->bs.pos = calloc((size_t)d->nt + 1, sizeof(int));
        if (!d->fs.list || !d->fs.pos || !d->bs.list || !d->bs.pos) goto oom_cut;
        for (int i = 0; i < d->nt; i++) d->fs.pos[i] = d->bs.pos[i] = -1;
        bool grad_before = false;   /* scanning units in forward order */
        for (int i = 0; i < d->nb; i++) if (d->b[i].root) grad_before = true;
        char *in_bs = calloc((size_t)nu1, 1);
        if (!in_bs) goto oom_cut;
        for (int k = nu1 - 2; k >= 0; k--) {   /* uo[nu1 - 2] runs first */
            int u = uo[k];
            bool trained = false;
            for (int q = 0; q < d->ub_count[u]; q++) if (!d->b[d->ub_list[d->ub_first[u] + q]].frozen) trained = true;
            in_bs[u] = trained || (units->grad_through ? units->grad_through[u] : grad_before);
            grad_before = grad_before || trained;
        }
        for (int k = 0; k < nu1 - 1; k++) {
            int u = uo[k];
            for (int q = 0; q < d->ub_count[u] && in_bs[u]; q++) {
                int i = d->ub_list[d->ub_first[u] + q];
                d->bs.pos[i] = d->bs.n;
                d->bs.list[d->bs.n++] = i;
            }
        }
        for (int k = nu1 - 2; k >= 0; k--) {
            int u = uo[k];
            for (int q = d->ub_count[u] - 1; q >= 0; q--) {
                int i = d->ub_list[d->ub_first[u] + q];
                d->fs.pos[i] = d->fs.n;
                d->fs.list[d->fs.n++] = i;
            }
        }
        free(in_bs);
        mmc_status st = mmc_comm_split(comm, 0, d->rank, "zero3-params", &d->pcomm);
        if (st) { free(uo); free(fpos); mmc_dp_free(d); return st; }
    }
    free(uo);
    free(fpos);
    uo = fpos = NULL;
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
                float *data = (float *)opt[p]->data + (l - a);
                if (zero == 3) {   /* the master shard owns the values from now on */
                    memcpy(bk->pshard + (l - lo), data, (size_t)(h - l) * sizeof(float));
                    data = bk->pshard + (l - lo);
                }
                mmc_tensor *sl = mmc_tensor_wrap(MMC_F32, mat ? 2 : 1, mat ? shape : shape + 1, data);
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
    if (zero == 3)   /* the full parameters (and fp32 masters) go: each rank keeps 1/N of them.
                      * Untrained ones not owned (mmapped from the checkpoint) are only unhooked:
                      * their clean pages cost no memory once untouched. */
        for (int p = 0; p < N; p++) {
            mmc_tensor *ts[2] = {d->all[p], p < n && opt[p] != model[p] ? opt[p] : NULL};
            for (int k = 0; k < 2; k++) {
                if (!ts[k]) continue;
                if (ts[k]->flags & MMC_OWNS_DATA) free(ts[k]->data);
                ts[k]->flags &= ~(uint32_t)MMC_OWNS_DATA;
                ts[k]->data = NULL;
            }
        }
    *out = d;
    return MMC_OK;
oom_cut:
    free(cut);
    free(uo);
    free(fpos);
oom:
    mmc_dp_free(d);
    return mmc_error(MMC_ERR_OOM, "out of memory for data-parallel buckets");
}

void mmc_dp_free(mmc_dp *d) {
    if (!d) return;
    mmc_dp_release_masters(d);
    free(d->tp_split);
    free(d->norm_skip);
    if (d->ctx && d->ctx->hooks.user == d) mmc_ctx_set_param_hooks(d->ctx, NULL);
    for (int i = 0; i < d->nt; i++) {
        bucket *bk = &d->b[i];
        mmc_dist_wait(bk->req);
        mmc_dist_wait(bk->preq);
        for (int s = bk->first; s < bk->first + bk->count; s++) {
            int p = d->order[s];
            if (p < d->n && d->gwrap && d->model[p]->grad == d->gwrap[p]) d->model[p]->grad = NULL;
            if (d->zero == 3) d->all[p]->data = NULL;
        }
        free(bk->flat);
        free(bk->gflat);
        free(bk->sflat);
        free(bk->gshard);
        free(bk->rshard);
        free(bk->pshard);
        free(bk->pflat);
        free(bk->fshard);
    }
    if (d->gwrap) for (int p = 0; p < d->n; p++) mmc_tensor_free(d->gwrap[p]);
    free(d->gwrap);
    mmc_adamw_free(&d->adamw);
    for (int i = 0; i < d->n_slices; i++) {
        mmc_tensor *g = d->slices[i]->grad;
        d->slices[i]->grad = NULL;
        mmc_tensor_free(g);
        mmc_tensor_free(d->slices[i]);
    }
    if (d->pcomm) mmc_comm_free(d->pcomm);
    free(d->fs.list);
    free(d->fs.pos);
    free(d->bs.list);
    free(d->bs.pos);
    free(d->slices);
    free(d->slice_param);
    free(d->slice_lo);
    free(d->b);
    free(d->order);
    free(d->off);
    free(d->bucket_of);
    free(d->unit_of);
    free(d->keys);
    free(d->unit_first);
    free(d->ub_first);
    free(d->ub_count);
    free(d->ub_list);
    free(d->all);
    free(d);
}

/* ---------------------------------------------------------------- forward */
void mmc_dp_forward_begin(mmc_dp *d, mmc_ctx *c) {
    mmc_param_hooks h = {.begin = hook_begin, .end = hook_end, .grad = hook_grad, .user = d};
    mmc_ctx_set_param_hooks(c, &h);
    d->ctx = c;
    d->in_backward = false;
    for (int u = 0; u < d->nu; u++) d->unit_first[u] = INT_MAX;
    if (d->zero != 3 || d->pinned) return;
    d->fs.next = 0;
    for (int i = 0; i < d->nt; i++) {
        if (d->b[i].root && d->b[i].gstate == G_NONE) {
            gather_start(d, &d->b[i]);
            gather_wait(d, &d->b[i]);
            d->b[i].gstate = G_CLAIMED;
        }
    }
}

void mmc_dp_forward_end(mmc_dp *d) {
    if (d->zero != 3 || d->pinned) return;
    flush(d, &d->fs);
    for (int i = 0; i < d->nt; i++) release(d, &d->b[i]);
}

/* ---------------------------------------------------------------- gradient reduction */
/* A finished micro-batch reduction: ZeRO >= 2 folds it into the sharded accumulator and frees
 * the gradients it sent. */
static mmc_status settle(mmc_dp *d, bucket *bk) {
    if (!bk->req) return MMC_OK;
    double t0 = mmc_now();
    mmc_status st = mmc_dist_wait(bk->req);
    d->exposed += mmc_now() - t0;
    bk->req = NULL;
    d->t_last = mmc_now();
    if (d->zero >= 2) {
        if (bk->rshard) for (int64_t i = 0; i < bk->shard; i++) bk->gshard[i] += bk->rshard[i];
        tfree(d, &bk->rshard, bk->shard, true);
        tfree(d, &bk->sflat, bk->padded, true);
    }
    return st;
}

static void start_bucket(mmc_dp *d, bucket *bk) {
    mmc_status st;
    if (!d->t_first) d->t_first = mmc_now();
    if (d->zero >= 2) {
        settle(d, bk);   /* the previous micro-batch's reduction of this bucket */
        if (!bk->gflat) grads_materialize(d, bk);   /* no gradient here on this rank: zeros */
        for (int s = bk->first; s < bk->first + bk->count; s++) d->model[d->order[s]]->grad = NULL;
        bk->sflat = bk->gflat;
        bk->gflat = NULL;
        if (d->zero == 3 && !bk->root) release(d, bk);   /* the unit's backward is over */
        /* the step's first reduction lands in the accumulator itself; later ones are added */
        float *recv = bk->gshard;
        if (!bk->acc_zero) recv = bk->rshard = talloc(d, bk->shard, true);
        bk->acc_zero = false;
        st = mmc_reduce_scatter_start(d->comm, bk->sflat, recv, bk->shard, MMC_F32, MMC_SUM, &bk->req);
        MMC_CHECK(st == MMC_OK, "dp: starting a bucket reduction failed: %s", mmc_last_error());
        /* bound the gradient memory: settle what has finished, and (ZeRO-2) keep one reduction
         * in flight besides this one (it has had this bucket's backward to complete, so waiting
         * for it is rarely exposed). ZeRO-3 never blocks on a reduction here: a peer may first
         * need a parameter all-gather that this rank issues only later in its backward (e.g. of
         * a unit this rank does not use), and blocking would deadlock across the two groups */
        int pending = 0;
        for (int i = 0; i < d->nb; i++) {
            bucket *o = &d->b[i];
            if (o == bk || !o->req) continue;
            if (mmc_dist_test(o->req)) settle(d, o);
            else pending++;
        }
        for (int i = 0; i < d->nb && pending > 0 && d->zero == 2; i++)
            if (&d->b[i] != bk && d->b[i].req) { settle(d, &d->b[i]); pending--; }
        return;
    }
    for (int s = bk->first; s < bk->first + bk->count; s++) {
        int p = d->order[s];
        mmc_tensor *g = d->model[p]->grad;
        float *dst = bk->flat + d->off[p];
        int64_t k = mmc_numel(d->opt[p]);
        if (g) memcpy(dst, g->data, (size_t)k * sizeof(float));
        else memset(dst, 0, (size_t)k * sizeof(float));
    }
    if (d->zero == 0) st = mmc_all_reduce_start(d->comm, bk->flat, bk->flat, bk->padded, MMC_F32, MMC_SUM, &bk->req);
    else st = mmc_reduce_scatter_start(d->comm, bk->flat, bk->gshard, bk->shard, MMC_F32, MMC_SUM, &bk->req);
    MMC_CHECK(st == MMC_OK, "dp: starting a bucket reduction failed: %s", mmc_last_error());
}

/* ZeRO-3: before node nd's backward, the units whose parameters it reads must be resident */
static void need_inputs(mmc_dp *d, const mmc_node *nd) {
    for (int k = 0; k < nd->n_in; k++) {
        mmc_tensor *x = nd->in[k];
        if (!x || x->data) continue;   /* only a sharded parameter has no data */
        int p = any_index(d, x);
        if (p >= 0) need(d, d->bucket_of[p]);
    }
}

void mmc_dp_backward(mmc_dp *d, mmc_ctx *c, mmc_tensor *loss, bool last) {
    MMC_CHECK(mmc_numel(loss) == 1, "mmc_dp_backward: loss must be a scalar");
    MMC_CHECK(d->ctx == c, "mmc_dp_backward: call mmc_dp_forward_begin before the forward");
    if (d->zero == 3) {   /* forward is over: the rest of its gathers, then the backward schedule */
        flush(d, &d->fs);
        for (int i = 0; i < d->nt; i++)
            if (!d->b[i].root && d->b[i].gstate == G_CLAIMED) release(d, &d->b[i]);
        d->bs.next = 0;
    }
    /* the previous micro-batch's reductions had this forward to finish: settle them now, so
     * that their gradient buffers are gone before this backward creates new ones */
    if (d->zero >= 2)
        for (int i = 0; i < d->nb; i++) settle(d, &d->b[i]);
    d->in_backward = true;
    bool reduce = last || d->zero >= 2;
    if (reduce) {
        /* each bucket is final once the tape has unwound past the first use of its parameters
         * (seen as a node input, or — inside a checkpointed block — the tape position when its
         * unit's begin hook ran); parameters never seen wait for the end */
        for (int i = 0; i < d->nb; i++) d->b[i].ready_at = INT_MAX;
        for (int i = 0; i < d->n; i++) d->model[i]->flags |= 1u << 30;   /* "not seen yet" mark */
        for (int j = 0; j < c->tape_len; j++) {
            mmc_node *nd = c->tape[j];
            for (int k = 0; k < nd->n_in; k++) {
                mmc_tensor *x = nd->in[k];
                if (!x || !(x->flags & (1u << 30)) || !(x->flags & MMC_PARAM)) continue;
                int p = param_index(d, x);
                if (p < 0) continue;
                x->flags &= ~(1u << 30);
                bucket *bk = &d->b[d->bucket_of[p]];
                if (j < bk->ready_at) bk->ready_at = j;
            }
        }
        for (int i = 0; i < d->n; i++) {
            int u = d->unit_of[i];
            bucket *bk = &d->b[d->bucket_of[i]];
            if (u >= 0 && d->unit_first[u] != INT_MAX) {
                d->model[i]->flags &= ~(1u << 30);
                if (d->unit_first[u] < bk->ready_at) bk->ready_at = d->unit_first[u];
            }
            if (d->model[i]->flags & (1u << 30)) { d->model[i]->flags &= ~(1u << 30); bk->ready_at = 0; }
        }
        for (int i = 0; i < d->nb; i++) if (d->b[i].ready_at == INT_MAX) d->b[i].ready_at = 0;
        d->next = 0;
    }
    if (mmc_requires_grad(loss)) {
        mmc_tensor *g = mmc_grad(c, loss);
        ((float *)g->data)[0] += 1.0f;
        bool prev = mmc_set_grad_enabled(c, false);
        for (int i = c->tape_len - 1; i >= 0; i--) {
            if (d->zero == 3) need_inputs(d, c->tape[i]);
            mmc_backward_range(c, i, i + 1);
            if (reduce)
                while (d->next < d->nb && i <= d->b[d->next].ready_at) start_bucket(d, &d->b[d->next++]);
        }
        mmc_set_grad_enabled(c, prev);
    }
    if (d->zero == 3) flush(d, &d->bs);
    if (reduce) while (d->next < d->nb) start_bucket(d, &d->b[d->next++]);
    if (d->zero == 3)
        for (int i = 0; i < d->nt; i++) release(d, &d->b[i]);   /* the root, and anything left */
    d->in_backward = false;
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

/* Gradients accumulated outside (the pipeline runtime's 1F1B backward, mmc_pp.h): every bucket
 * reduced at once from model[i]->grad, in bucket order. ZeRO 0/1 go through their persistent
 * flat buffers (start_bucket); ZeRO-2 packs each bucket into a transient buffer, frees the
 * full gradient tensors it packed (they come back zeroed in the next step's backward) and
 * reduce-scatters into the sharded accumulator; settle() frees the buffer. */
mmc_status mmc_dp_reduce_grads(mmc_dp *d) {
    if (!d->t_first) d->t_first = mmc_now();
    for (int i = 0; i < d->nb; i++) {
        bucket *bk = &d->b[i];
        if (d->zero <= 1) { start_bucket(d, bk); continue; }
        mmc_status st = settle(d, bk);
        if (st) return st;
        if (!(bk->sflat = talloc(d, bk->padded, true))) return mmc_error(MMC_ERR_OOM, "dp: out of memory for a bucket");
        memset(bk->sflat + bk->len, 0, (size_t)(bk->padded - bk->len) * sizeof(float));
        for (int s = bk->first; s < bk->first + bk->count; s++) {
            int p = d->order[s];
            mmc_tensor *g = d->model[p]->grad;
            float *dst = bk->sflat + d->off[p];
            const int64_t k = mmc_numel(d->opt[p]);
            if (g) memcpy(dst, g->data, (size_t)k * sizeof(float));
            else memset(dst, 0, (size_t)k * sizeof(float));
            if (g && !(g->flags & MMC_IN_ARENA)) mmc_tensor_free(g);
            d->model[p]->grad = NULL;
            if (d->opt[p] != d->model[p]) d->opt[p]->grad = NULL;   /* (a master shares its tensor's gradient) */
        }
        float *recv = bk->gshard;
        if (!bk->acc_zero && !(recv = bk->rshard = talloc(d, bk->shard, true)))
            return mmc_error(MMC_ERR_OOM, "dp: out of memory for a bucket");
        bk->acc_zero = false;
        st = mmc_reduce_scatter_start(d->comm, bk->sflat, recv, bk->shard, MMC_F32, MMC_SUM, &bk->req);
        if (st) return st;
    }
    return MMC_OK;
}

/* ZeRO-3 under pipeline parallelism: the whole stage is one unit, gathered for the step's
 * micro-batches (torchtitan's FSDP under pp, reshard_after_forward off: a micro-batch's backward
 * interleaves with the next one's forward). Counted as a step's parameters (peak_p). */
mmc_status mmc_dp_gather_stage(mmc_dp *d) {
    if (d->zero != 3 || d->pinned) return MMC_OK;
    for (int i = 0; i < d->nt; i++) gather_start(d, &d->b[i]);
    for (int i = 0; i < d->nt; i++) {
        gather_wait(d, &d->b[i]);
        d->b[i].gstate = G_CLAIMED;
    }
    d->pinned = true;
    return MMC_OK;
}

void mmc_dp_release_stage(mmc_dp *d) {
    if (d->zero != 3 || !d->pinned) return;
    d->pinned = false;
    for (int i = 0; i < d->nt; i++) release(d, &d->b[i]);
}

void mmc_dp_set_norm_group(mmc_dp *d, mmc_comm *outer, const unsigned char *skip) {
    free(d->norm_skip);
    d->norm_skip = NULL;
    d->norm_outer = outer && mmc_comm_size(outer) > 1 ? outer : NULL;
    if (!skip) return;
    MMC_CHECK((d->norm_skip = malloc((size_t)d->n + 1)), "dp: out of memory");
    memcpy(d->norm_skip, skip, (size_t)d->n);
}

void mmc_dp_set_tp(mmc_dp *d, mmc_comm *tp, const signed char *split) {
    free(d->tp_split);
    d->tp_split = NULL;
    d->tp = NULL;
    if (!tp || mmc_comm_size(tp) < 2) return;
    MMC_CHECK((d->tp_split = malloc((size_t)d->n + 1)), "dp: out of memory");
    memcpy(d->tp_split, split, (size_t)d->n);
    d->tp = tp;
}

mmc_status mmc_dp_clip(mmc_dp *d, double max_norm, double *norm) {
    double s = 0;
    mmc_status st;
    if (d->tp || d->norm_skip) {   /* tensor parallelism: split parameters' squares summed over tp, replicated
                                    * ones once; norm_skip: those left out */
        double sr[2] = {0, 0};
        for (int j = 0; j < d->n_slices; j++) {
            if (d->norm_skip && d->norm_skip[d->slice_param[j]]) continue;
            const float *g = d->slices[j]->grad->data;
            double a = 0;
            for (int64_t k = 0, m = mmc_numel(d->slices[j]); k < m; k++) a += (double)g[k] * g[k];
            sr[d->tp && d->tp_split[d->slice_param[j]] >= 0 ? 0 : 1] += a;
        }
        if ((st = mmc_all_reduce(d->comm, sr, sr, 2, MMC_F64, MMC_SUM))) return st;
        if (d->tp && (st = mmc_all_reduce(d->tp, sr, sr, 1, MMC_F64, MMC_SUM))) return st;
        s = sr[0] + sr[1];
    } else {
        for (int i = 0; i < d->nb; i++) {
            const float *g = d->b[i].gshard;
            for (int64_t k = 0; k < d->b[i].shard; k++) s += (double)g[k] * g[k];
        }
        if ((st = mmc_all_reduce(d->comm, &s, &s, 1, MMC_F64, MMC_SUM))) return st;
    }
    if (d->norm_outer && (st = mmc_all_reduce(d->norm_outer, &s, &s, 1, MMC_F64, MMC_SUM))) return st;
    *norm = sqrt(s);
    if (max_norm > 0 && *norm > max_norm && isfinite(*norm)) {
        float coef = (float)(max_norm / (*norm + 1e-6));
        for (int i = 0; i < d->nb; i++)
            for (int64_t k = 0; k < d->b[i].shard; k++) d->b[i].gshard[k] *= coef;
    }
    return MMC_OK;
}

mmc_status mmc_dp_reduce_partial(mmc_dp *d, mmc_comm *g, const bool *sel) {
    if (!g || mmc_comm_size(g) < 2) return MMC_OK;
    /* what this rank holds of the marked parameters: its shard slices (ZeRO >= 1) or whole gradients */
    const int n = d->zero >= 1 ? d->n_slices : d->n;
    int64_t len = 0;
    for (int j = 0; j < n; j++) {
        const int p = d->zero >= 1 ? d->slice_param[j] : j;
        mmc_tensor *t = d->zero >= 1 ? d->slices[j] : d->model[p];
        if (sel[p] && t->grad) len += mmc_numel(t);
    }
    mmc_status st;
    if (!d->partial_checked) {   /* every rank of g must pack the same count (the same layout) */
        double mm[2] = {(double)len, -(double)len};
        if ((st = mmc_all_reduce(g, mm, mm, 2, MMC_F64, MMC_MAX))) return st;
        if (mm[0] != -mm[1])
            return mmc_error(MMC_ERR_INVALID, "dp: the ranks of a tensor-parallel group hold %lld to %lld elements "
                             "of partial gradients in their ZeRO shards (their parameter layouts differ); use zero 0",
                             (long long)-mm[1], (long long)mm[0]);
        d->partial_checked = true;
    }
    if (!len) return MMC_OK;
    float *buf = malloc(sizeof(float) * (size_t)len);
    if (!buf) return mmc_error(MMC_ERR_OOM, "dp: out of memory (%lld partial gradients)", (long long)len);
    int64_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        at = 0;
        for (int j = 0; j < n; j++) {
            const int p = d->zero >= 1 ? d->slice_param[j] : j;
            mmc_tensor *t = d->zero >= 1 ? d->slices[j] : d->model[p];
            if (!sel[p] || !t->grad) continue;
            const int64_t m = mmc_numel(t);
            float *gd = t->grad->data;
            if (pass == 0) memcpy(buf + at, gd, sizeof(float) * (size_t)m);
            else memcpy(gd, buf + at, sizeof(float) * (size_t)m);
            at += m;
        }
        if (pass == 0 && (st = mmc_all_reduce(g, buf, buf, len, MMC_F32, MMC_SUM))) { free(buf); return st; }
    }
    free(buf);
    return MMC_OK;
}

/* ZeRO-2 (and moment gathering): a bucket's full values through a temporary flat buffer —
 * this rank's slices (src[j] for slice j, NULL = the slice's own data) in, all-gathered */
static mmc_status bucket_allgather(mmc_dp *d, int i, float **buf, float *const *src, mmc_dist_req **req) {
    bucket *bk = &d->b[i];
    *buf = bk->flat ? bk->flat : talloc(d, bk->padded, false);
    for (int j = 0; j < d->n_slices; j++) {
        int p = d->slice_param[j];
        if (d->bucket_of[p] != i) continue;
        memcpy(*buf + d->off[p] + d->slice_lo[j], src ? src[j] : (const float *)d->slices[j]->data,
               (size_t)mmc_numel(d->slices[j]) * sizeof(float));
    }
    return mmc_all_gather_start(d->comm, *buf + (int64_t)d->rank * bk->shard, *buf, bk->shard, MMC_F32, req);
}

mmc_status mmc_dp_step(mmc_dp *d, double lr) {
    mmc_adamw_step(&d->adamw, lr);
    for (int i = 0; i < d->nb; i++) {
        memset(d->b[i].gshard, 0, (size_t)d->b[i].shard * sizeof(float));
        d->b[i].acc_zero = true;
    }
    if (d->zero == 3) return MMC_OK;   /* parameters stay sharded until the next forward gathers them */
    /* all-gather the updated parameters bucket by bucket, two in flight */
    mmc_status st = MMC_OK;
    float *buf[2] = {NULL, NULL};
    mmc_dist_req *req[2] = {NULL, NULL};
    for (int i = 0; i <= d->nb; i++) {
        if (i < d->nb) {
            mmc_status s2 = bucket_allgather(d, i, &buf[i & 1], NULL, &req[i & 1]);
            if (s2) return s2;
        }
        if (i == 0) continue;
        int k = (i - 1) & 1;
        bucket *bk = &d->b[i - 1];
        mmc_status s2 = mmc_dist_wait(req[k]);
        req[k] = NULL;
        if (s2 && !st) st = s2;
        for (int s = bk->first; s < bk->first + bk->count; s++) {
            int p = d->order[s];
            memcpy(d->opt[p]->data, buf[k] + d->off[p], (size_t)mmc_numel(d->opt[p]) * sizeof(float));
        }
        if (!bk->flat) tfree(d, &buf[k], bk->padded, false);
    }
    return st;
}

/* moment k (0 = m, 1 = v): shards -> full per-parameter arrays of a */
static mmc_status gather_moment(mmc_dp *d, mmc_adamw *a, int k) {
    for (int i = 0; i < d->nb; i++) {
        bucket *bk = &d->b[i];
        float *buf = NULL;
        mmc_dist_req *req = NULL;
        mmc_status st = bucket_allgather(d, i, &buf, k ? d->adamw.v : d->adamw.m, &req);
        if (!st) st = mmc_dist_wait(req);
        if (!st)
            for (int s = bk->first; s < bk->first + bk->count; s++) {
                int p = d->order[s];
                float *dst = NULL;
                for (int q = 0; q < a->n; q++)
                    if (d->opt[p] == a->params[q]) { dst = k ? a->v[q] : a->m[q]; break; }
                if (dst) memcpy(dst, buf + d->off[p], (size_t)mmc_numel(d->opt[p]) * sizeof(float));
            }
        if (!bk->flat) tfree(d, &buf, bk->padded, false);
        if (st) return st;
    }
    return MMC_OK;
}

mmc_status mmc_dp_gather_masters(mmc_dp *d) {
    if (d->zero != 3 || d->masters_out) return MMC_OK;
    for (int p = 0; p < d->n; p++)   /* the fp32 masters of a lower-precision model: full buffers again */
        if (d->opt[p] != d->model[p] && !d->opt[p]->data) {
            if (!(d->opt[p]->data = malloc(sizeof(float) * (size_t)mmc_numel(d->opt[p]))))
                return mmc_error(MMC_ERR_OOM, "dp: out of memory gathering the fp32 masters");
            d->masters_out = true;
        }
    if (!d->masters_out) return MMC_OK;
    for (int i = 0; i < d->nb; i++) {   /* bucket by bucket: the shards (slices' own data) all-gathered */
        bucket *bk = &d->b[i];
        float *buf = NULL;
        mmc_dist_req *req = NULL;
        mmc_status st = bucket_allgather(d, i, &buf, NULL, &req);
        if (!st) st = mmc_dist_wait(req);
        if (!st)
            for (int s = bk->first; s < bk->first + bk->count; s++) {
                int p = d->order[s];
                if (d->opt[p] != d->model[p])
                    memcpy(d->opt[p]->data, buf + d->off[p], (size_t)mmc_numel(d->opt[p]) * sizeof(float));
            }
        if (!bk->flat) tfree(d, &buf, bk->padded, false);
        if (st) return st;
    }
    return MMC_OK;
}

void mmc_dp_release_masters(mmc_dp *d) {
    if (!d->masters_out) return;
    for (int p = 0; p < d->n; p++)
        if (d->opt[p] != d->model[p]) {
            free(d->opt[p]->data);
            d->opt[p]->data = NULL;
        }
    d->masters_out = false;
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

mmc_status mmc_dp_gather_params(mmc_dp *d) { return mmc_dp_gather_params_sel(d, true, true); }

mmc_status mmc_dp_gather_params_sel(mmc_dp *d, bool trained, bool frozen) {
    if (d->zero != 3 || d->pinned) return MMC_OK;
    d->peak_p_steps = d->peak_p;   /* a save or an evaluation is not a step: its peak is apart */
    for (int i = 0; i < d->nt; i++) {
        release(d, &d->b[i]);
        if (d->b[i].frozen ? frozen : trained) gather_start(d, &d->b[i]);
    }
    for (int i = 0; i < d->nt; i++) {
        if (d->b[i].gstate == G_NONE) continue;
        gather_wait(d, &d->b[i]);
        d->b[i].gstate = G_CLAIMED;
    }
    d->pinned = true;
    return MMC_OK;
}

void mmc_dp_release_params(mmc_dp *d) {
    if (d->zero != 3 || !d->pinned) return;
    d->pinned = false;
    for (int i = 0; i < d->nt; i++) release(d, &d->b[i]);
    d->peak_p = d->peak_p_steps;
}

int64_t mmc_dp_adamw_step(const mmc_dp *d) { return d->adamw.step; }
void mmc_dp_set_adamw_step(mmc_dp *d, int64_t s) { d->adamw.step = s; }

void mmc_dp_get_memory(const mmc_dp *d, mmc_dp_memory *m) {
    memset(m, 0, sizeof *m);
    for (int p = 0; p < d->n; p++) {
        if (d->zero < 3)
            m->params += (int64_t)mmc_nbytes(d->model[p]) + (d->opt[p] != d->model[p] ? (int64_t)mmc_nbytes(d->opt[p]) : 0);
        if (d->model[p]->grad && !(d->gwrap && d->model[p]->grad == d->gwrap[p]))
            m->grads += (int64_t)mmc_nbytes(d->model[p]->grad);
    }
    for (int i = 0; i < d->nt; i++) {
        const bucket *bk = &d->b[i];
        m->buckets += bk->flat ? bk->padded * 4 : 0;
        m->grads += bk->gshard ? bk->shard * 4 : 0;
        m->params += bk->pshard ? bk->shard * 4 : 0;
        m->frozen += bk->fshard ? bk->shard * (int64_t)mmc_dtype_size(bk->wdt) : 0;
    }
    m->frozen += d->frozen_bytes;
    m->grads_peak = m->grads + d->peak_g;
    m->params_peak = m->params + d->peak_p;
    m->grads += d->live_g;
    m->params += d->live_p;
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
    l->param_unit = calloc((size_t)d->n + 1, sizeof *l->param_unit);
    l->slice_param = calloc((size_t)d->n_slices + 1, sizeof *l->slice_param);
    l->slice_numel = calloc((size_t)d->n_slices + 1, sizeof *l->slice_numel);
    l->m = calloc((size_t)d->n_slices + 1, sizeof *l->m);
    l->v = calloc((size_t)d->n_slices + 1, sizeof *l->v);
    l->p = calloc((size_t)d->n_slices + 1, sizeof *l->p);
    MMC_CHECK(l->bucket_len && l->bucket_shard && l->param_bucket && l->param_off && l->param_numel &&
              l->param_unit && l->slice_param && l->slice_numel && l->m && l->v && l->p,
              "dp: out of memory for the layout");
    for (int i = 0; i < d->nb; i++) { l->bucket_len[i] = d->b[i].len; l->bucket_shard[i] = d->b[i].shard; }
    for (int p = 0; p < d->n; p++) {
        l->param_bucket[p] = d->bucket_of[p];
        l->param_off[p] = d->off[p];
        l->param_numel[p] = mmc_numel(d->opt[p]);
        l->param_unit[p] = d->unit_of[p];
    }
    for (int j = 0; j < d->n_slices; j++) {
        l->slice_param[j] = d->slice_param[j];
        l->slice_numel[j] = mmc_numel(d->slices[j]);
        l->m[j] = d->adamw.m[j];
        l->v[j] = d->adamw.v[j];
        l->p[j] = d->zero == 3 ? d->slices[j]->data : NULL;
    }
}

void mmc_dp_layout_free(mmc_dp_layout *l) {
    free(l->bucket_len);
    free(l->bucket_shard);
    free(l->param_bucket);
    free(l->param_off);
    free(l->param_numel);
    free(l->param_unit);
    free(l->slice_param);
    free(l->slice_numel);
    free(l->m);
    free(l->v);
    free(l->p);
    memset(l, 0, sizeof *l);
}
