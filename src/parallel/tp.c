/* tp.c — tensor parallelism (mmc_tp.h), after Megatron-LM's tensor_parallel/mappings.py,
 * layers.py (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding) and
 * cross_entropy.py (vocab_parallel_cross_entropy): the conjugate pair f / g, the row-parallel
 * linear, the vocab-parallel embedding and cross-entropy as autograd ops over the
 * communicator, and the sharded-parameter helpers (slice binding from safetensors, gathering,
 * the global gradient norm). A communicator failure inside an op is fatal: the watchdog has
 * already named the rank it waits on, and a half-reduced activation cannot be recovered. */
#include "mmc_tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tp_ok(mmc_status st, const char *what) {
    MMC_CHECK(st == MMC_OK, "tensor parallel %s: %s", what, mmc_last_error());
}

static void acc_into(mmc_ctx *ctx, mmc_tensor *x, const float *dy) {
    float *dx = mmc_grad(ctx, x)->data;
    const int64_t n = mmc_numel(x);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) dx[i] += dy[i];
}

/* ------------------------------------------------------------------ f and g */
static void copy_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    mmc_comm *tp = n->extra;
    float *dy = n->out->grad->data;   /* ours alone: every consumer of out has added into it */
    tp_ok(mmc_all_reduce(tp, dy, dy, mmc_numel(n->out), MMC_F32, MMC_SUM), "copy backward (all-reduce)");
    acc_into(ctx, x, dy);
}

mmc_tensor *mmc_tp_copy(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x) {
    if (!tp || mmc_comm_size(tp) == 1) return x;
    MMC_CHECK(x->dtype == MMC_F32, "mmc_tp_copy: x must be f32");
    mmc_tensor *y = mmc_alias(ctx, x);   /* identity: shares x's data */
    mmc_node *n = mmc_tape_record(ctx, "tp_copy", copy_backward, y, 1, &x);
    if (n) n->extra = tp;
    return y;
}

static void reduce_backward(mmc_ctx *ctx, mmc_node *n) {
    if (mmc_requires_grad(n->in[0])) acc_into(ctx, n->in[0], n->out->grad->data);
}

mmc_tensor *mmc_tp_reduce(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x) {
    if (!tp || mmc_comm_size(tp) == 1) return x;
    MMC_CHECK(x->dtype == MMC_F32, "mmc_tp_reduce: x must be f32");
    mmc_tensor *xc = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, x->ndim, x->shape);
    tp_ok(mmc_all_reduce(tp, xc->data, y->data, mmc_numel(y), MMC_F32, MMC_SUM), "reduce (all-reduce)");
    mmc_node *n = mmc_tape_record(ctx, "tp_reduce", reduce_backward, y, 1, &x);
    (void)n;
    return y;
}

mmc_tensor *mmc_tp_row_linear(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x, const mmc_linear_w *l) {
    /* LoRA (A split on its input columns like W, B replicated): B (A_r x_r) summed over ranks by
     * the same reduction is B (A x); B's gradient is then partial per rank (see mmc_tp.h) */
    mmc_linear_w nb = *l;
    nb.b = NULL;   /* the bias is replicated: added once, after the reduction */
    mmc_tensor *y = mmc_tp_reduce(ctx, tp, mmc_nn_linear(ctx, x, &nb));
    return l->b ? mmc_add(ctx, y, l->b) : y;
}

/* Chunked overlap (parallel.tp_comm_chunks): the rows of x in `chunks` pieces; piece i's GEMM
 * result is all-reduced by the communicator's thread (mmc_all_reduce_start) while piece i + 1's
 * GEMM runs, so all but the last piece's reduction hide behind compute (Megatron's
 * tp_comm_overlap splits the GEMM the same way). One node joins the pieces: its backward hands
 * each piece its rows of dy. Each piece is the same GEMM row for row and the reduction the same
 * sum (a + b for tp=2), so the forward equals mmc_tp_row_linear's; the weight gradient is then
 * summed over the pieces in turn (rounding-level differences). */
static void chunks_backward(mmc_ctx *ctx, mmc_node *n) {
    const float *dy = n->out->grad->data;
    int64_t off = 0;
    for (int i = 0; i < n->n_in; i++) {
        if (mmc_requires_grad(n->in[i])) acc_into(ctx, n->in[i], dy + off);
        off += mmc_numel(n->in[i]);
    }
}

mmc_tensor *mmc_tp_row_linear_chunked(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x, const mmc_linear_w *l, int chunks) {
    const int64_t K = x->shape[x->ndim - 1], R = mmc_numel(x) / (K ? K : 1);
    if (chunks > R) chunks = (int)R;
    if (chunks > MMC_NODE_MAX_IN) chunks = MMC_NODE_MAX_IN;
    if (!tp || mmc_comm_size(tp) == 1 || chunks <= 1) return mmc_tp_row_linear(ctx, tp, x, l);
    mmc_linear_w nb = *l;
    nb.b = NULL;   /* replicated: added once, after the reduction */
    mmc_tensor *x2 = mmc_reshape(ctx, x, 2, MMC_SHAPE(R, K));                     /* [R, K/tp] */
    mmc_tensor *parts[MMC_NODE_MAX_IN], *y = NULL;
    mmc_dist_req *req[MMC_NODE_MAX_IN] = {NULL};
    int64_t N = 0;
    for (int i = 0; i < chunks; i++) {
        const int64_t r0 = R * i / chunks, n = R * (i + 1) / chunks - r0;
        parts[i] = mmc_contiguous(ctx, mmc_nn_linear(ctx, mmc_narrow(ctx, x2, 0, r0, n), &nb));   /* [n, N] partial */
        if (!y) N = parts[i]->shape[1], y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(R, N));          /* [R, N] */
        tp_ok(mmc_all_reduce_start(tp, parts[i]->data, (float *)y->data + r0 * N, n * N, MMC_F32, MMC_SUM, &req[i]),
              "row-parallel chunk (all-reduce)");
    }
    tp_ok(mmc_dist_wait_all(req, chunks), "row-parallel chunks (all-reduce)");
    mmc_tape_record(ctx, "tp_reduce_chunks", chunks_backward, y, chunks, parts);
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = N;
    y = mmc_reshape(ctx, y, x->ndim, shape);                                      /* [..., N] */
    return l->b ? mmc_add(ctx, y, l->b) : y;
}

/* ------------------------------------------------------------------ vocab-parallel embedding */
static inline int64_t id_at(const mmc_tensor *ids, int64_t i) {
    return ids->dtype == MMC_I64 ? ((const int64_t *)ids->data)[i] : (int64_t)((const int32_t *)ids->data)[i];
}

static void vembed_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *table = n->in[0], *ids = n->in[1];
    if (!mmc_requires_grad(table)) return;
    const int64_t T = mmc_numel(ids), C = table->shape[1], Vl = table->shape[0], v0 = n->i[0], pad = n->i[1];
    float *gt = mmc_grad(ctx, table)->data;
    const float *gy = n->out->grad->data;
    /* column blocks over threads; tokens in order inside a block (deterministic, as mmc_embedding) */
#pragma omp parallel for schedule(static) if (T * C > 32768)
    for (int64_t c0 = 0; c0 < C; c0 += 128) {
        int64_t c1 = c0 + 128 < C ? c0 + 128 : C;
        for (int64_t t = 0; t < T; t++) {
            if (id_at(ids, t) == pad) continue;   /* padding_idx: no gradient */
            int64_t id = id_at(ids, t) - v0;
            if (id < 0 || id >= Vl) continue;
            float *dst = gt + id * C;
            const float *src = gy + t * C;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

mmc_tensor *mmc_tp_embedding(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *table, mmc_tensor *ids, int64_t vocab_start,
                             int64_t padding_idx) {
    if (!tp || mmc_comm_size(tp) == 1) return mmc_embedding_padded(ctx, table, ids, padding_idx);
    MMC_CHECK((table->dtype == MMC_F32 || table->dtype == MMC_BF16) && table->ndim == 2 && mmc_is_contiguous(table),
              "mmc_tp_embedding: table must be contiguous f32/bf16 [V/tp, C]");
    MMC_CHECK((ids->dtype == MMC_I32 || ids->dtype == MMC_I64) && mmc_is_contiguous(ids) && ids->ndim < MMC_MAX_DIMS,
              "mmc_tp_embedding: ids must be contiguous i32/i64");
    const int64_t Vl = table->shape[0], C = table->shape[1], T = mmc_numel(ids), V = Vl * mmc_comm_size(tp);
    for (int64_t t = 0; t < T; t++) {
        int64_t id = id_at(ids, t);
        MMC_CHECK(id >= 0 && id < V, "mmc_tp_embedding: id %lld at position %lld is out of range [0, %lld)",
                  (long long)id, (long long)t, (long long)V);
    }
    int64_t shape[MMC_MAX_DIMS];
    for (int d = 0; d < ids->ndim; d++) shape[d] = ids->shape[d];
    shape[ids->ndim] = C;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, ids->ndim + 1, shape);   /* [..., C] partial: our rows only */
    float *yd = y->data;
#pragma omp parallel for schedule(static) if (T * C > 32768)
    for (int64_t t = 0; t < T; t++) {
        int64_t id = id_at(ids, t) - vocab_start;
        if (id < 0 || id >= Vl) memset(yd + t * C, 0, (size_t)C * sizeof(float));
        else if (table->dtype == MMC_F32) memcpy(yd + t * C, (const float *)table->data + id * C, (size_t)C * sizeof(float));
        else mmc_convert(yd + t * C, MMC_F32, (const uint16_t *)table->data + id * C, MMC_BF16, C);
    }
    mmc_tensor *in[2] = {table, ids};
    mmc_node *n = mmc_tape_record(ctx, "tp_embedding", vembed_backward, y, 2, in);
    if (n) n->i[0] = vocab_start, n->i[1] = padding_idx;
    return mmc_tp_reduce(ctx, tp, y);   /* every id is owned by exactly one rank */
}

/* ------------------------------------------------------------------ vocab-parallel cross-entropy */
static void vxent_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *logits = n->in[0], *targets = n->in[1];
    if (!mmc_requires_grad(logits)) return;
    float *gl = mmc_grad(ctx, logits)->data;
    const int64_t N = n->i[0], Vl = n->i[1], count = n->i[2], ignore = n->i[3], v0 = n->i[4];
    if (count == 0) return;
    const float g = ((const float *)n->out->grad->data)[0] / (float)count;
    const float *x = logits->data, *lse = n->saved[0]->data;
#pragma omp parallel for schedule(static) if (N * Vl > 65536)
    for (int64_t i = 0; i < N; i++) {
        int64_t t = id_at(targets, i);
        if (t == ignore) continue;
        const float *xr = x + i * Vl;
        float *d = gl + i * Vl;
        for (int64_t j = 0; j < Vl; j++) d[j] += g * expf(xr[j] - lse[i]);
        if (t >= v0 && t < v0 + Vl) d[t - v0] -= g;
    }
}

mmc_tensor *mmc_tp_cross_entropy(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *logits, mmc_tensor *targets,
                                 int64_t vocab_start, int64_t ignore_index) {
    if (!tp || mmc_comm_size(tp) == 1) return mmc_cross_entropy(ctx, logits, targets, ignore_index);
    MMC_CHECK(logits->dtype == MMC_F32 && logits->ndim == 2 && mmc_is_contiguous(logits) &&
                  (targets->dtype == MMC_I32 || targets->dtype == MMC_I64) && targets->ndim == 1 &&
                  mmc_is_contiguous(targets) && targets->shape[0] == logits->shape[0],
              "mmc_tp_cross_entropy: need logits contiguous f32 [N, V/tp] and targets i32/i64 [N]");
    const int64_t N = logits->shape[0], Vl = logits->shape[1], V = Vl * mmc_comm_size(tp);
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = id_at(targets, i);
        if (t == ignore_index) continue;
        MMC_CHECK(t >= 0 && t < V, "mmc_tp_cross_entropy: target %lld at row %lld is out of range [0, %lld)",
                  (long long)t, (long long)i, (long long)V);
        count++;
    }
    mmc_tensor *lse = mmc_new(ctx, MMC_F32, 1, MMC_SHAPE(N));   /* [N] */
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *mx = mmc_scratch_alloc(ctx, (size_t)(N > 0 ? N : 1) * sizeof(float));        /* [N] */
    double *st = mmc_scratch_alloc(ctx, (size_t)(N > 0 ? 2 * N : 2) * sizeof(double));  /* [N] sum-exp, [N] target */
    const float *x = logits->data;
    for (int64_t i = 0; i < N; i++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < Vl; j++) m = x[i * Vl + j] > m ? x[i * Vl + j] : m;
        mx[i] = m;
    }
    tp_ok(mmc_all_reduce(tp, mx, mx, N, MMC_F32, MMC_MAX), "cross-entropy (max)");
#pragma omp parallel for schedule(static) if (N * Vl > 65536)
    for (int64_t i = 0; i < N; i++) {
        double s = 0;
        for (int64_t j = 0; j < Vl; j++) s += expf(x[i * Vl + j] - mx[i]);
        st[i] = s;
        int64_t t = id_at(targets, i) - vocab_start;
        st[N + i] = t >= 0 && t < Vl ? (double)x[i * Vl + t] : 0.0;
    }
    tp_ok(mmc_all_reduce(tp, st, st, 2 * N, MMC_F64, MMC_SUM), "cross-entropy (sum-exp, target logit)");
    double sum = 0;
    for (int64_t i = 0; i < N; i++) {
        float l = mx[i] + (float)log(st[i]);
        ((float *)lse->data)[i] = l;
        if (id_at(targets, i) != ignore_index) sum += (double)(l - (float)st[N + i]);
    }
    mmc_scratch_release(ctx, mk);
    mmc_tensor *loss = mmc_scalar(ctx, count ? (float)(sum / (double)count) : 0.0f);   /* [] */
    mmc_tensor *in[2] = {logits, targets};
    mmc_node *n = mmc_tape_record(ctx, "tp_cross_entropy", vxent_backward, loss, 2, in);
    if (n) {
        n->saved[0] = lse;
        n->i[0] = N, n->i[1] = Vl, n->i[2] = count, n->i[3] = ignore_index, n->i[4] = vocab_start;
    }
    return loss;
}

/* ------------------------------------------------------------------ gather along the last dim */
static void gather_last_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    const int64_t R = n->i[0], nl = n->i[1], tp = n->i[2], r = n->i[3];
    float *dx = mmc_grad(ctx, x)->data;
    const float *dy = n->out->grad->data;
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < nl; j++) dx[i * nl + j] += dy[i * nl * tp + r * nl + j];
}

mmc_tensor *mmc_tp_gather_last(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x) {
    if (!tp || mmc_comm_size(tp) == 1) return x;
    MMC_CHECK(x->dtype == MMC_F32, "mmc_tp_gather_last: x must be f32");
    const int64_t P = mmc_comm_size(tp), nl = x->shape[x->ndim - 1], R = mmc_numel(x) / (nl ? nl : 1);
    mmc_tensor *xc = mmc_contiguous(ctx, x);
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *buf = mmc_scratch_alloc(ctx, (size_t)(P * R * nl) * sizeof(float));   /* [tp, R, nl] */
    tp_ok(mmc_all_gather(tp, xc->data, buf, R * nl, MMC_F32), "gather (all-gather)");
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = nl * P;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, x->ndim, shape);   /* [..., n] */
    float *yd = y->data;
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < R; i++) memcpy(yd + i * nl * P + p * nl, buf + (p * R + i) * nl, (size_t)nl * sizeof(float));
    mmc_scratch_release(ctx, mk);
    mmc_node *n = mmc_tape_record(ctx, "tp_gather_last", gather_last_backward, y, 1, &x);
    if (n) n->i[0] = R, n->i[1] = nl, n->i[2] = P, n->i[3] = mmc_comm_rank(tp);
    return y;
}

/* ------------------------------------------------------------------ sequence parallelism
 * The collectives move rank-major blocks [tp][B][T/tp][C]; pack / unpack convert between
 * that and [B][T][C] (rank p's block holds positions [p T/tp, (p+1) T/tp) of every row). */
static void sp_pack(const float *x, float *blocks, int64_t B, int64_t T, int64_t C, int64_t P) {
    const int64_t Tl = T / P;
    for (int64_t p = 0; p < P; p++)
        for (int64_t b = 0; b < B; b++)
            memcpy(blocks + ((p * B + b) * Tl) * C, x + (b * T + p * Tl) * C, (size_t)(Tl * C) * sizeof(float));
}
static void sp_unpack(const float *blocks, float *x, int64_t B, int64_t T, int64_t C, int64_t P) {
    const int64_t Tl = T / P;
    for (int64_t p = 0; p < P; p++)
        for (int64_t b = 0; b < B; b++)
            memcpy(x + (b * T + p * Tl) * C, blocks + ((p * B + b) * Tl) * C, (size_t)(Tl * C) * sizeof(float));
}

/* [B, T, C] full (contiguous) -> reduce-scattered slice [B, T/tp, C] into out */
static void sp_rs(mmc_ctx *ctx, mmc_comm *tp, const float *full, float *out, int64_t B, int64_t T, int64_t C) {
    const int64_t P = mmc_comm_size(tp);
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *blocks = mmc_scratch_alloc(ctx, (size_t)(B * T * C) * sizeof(float));
    sp_pack(full, blocks, B, T, C, P);
    tp_ok(mmc_reduce_scatter(tp, blocks, out, B * (T / P) * C, MMC_F32, MMC_SUM), "sequence reduce-scatter");
    mmc_scratch_release(ctx, mk);
}
/* slice [B, T/tp, C] -> all-gathered [B, T, C] into full */
static void sp_ag(mmc_ctx *ctx, mmc_comm *tp, const float *slice, float *full, int64_t B, int64_t T, int64_t C) {
    const int64_t P = mmc_comm_size(tp);
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *blocks = mmc_scratch_alloc(ctx, (size_t)(B * T * C) * sizeof(float));
    tp_ok(mmc_all_gather(tp, slice, blocks, B * (T / P) * C, MMC_F32), "sequence all-gather");
    sp_unpack(blocks, full, B, T, C, P);
    mmc_scratch_release(ctx, mk);
}

static void sp_check(mmc_comm *tp, const mmc_tensor *x, const char *what) {
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 3, "%s: x must be f32 [B, T, C]", what);
    (void)tp;
}

/* The backward of both the split and the reduce-scatter: the sequence shards of dy gathered back
 * into the full [B, T, C] and added to x's gradient. n->i: B, T (full), C */
static void sp_shard_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    mmc_comm *tp = n->extra;
    const int64_t B = n->i[0], T = n->i[1], C = n->i[2];
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *full = mmc_scratch_alloc(ctx, (size_t)(B * T * C) * sizeof(float));
    sp_ag(ctx, tp, n->out->grad->data, full, B, T, C);
    acc_into(ctx, x, full);
    mmc_scratch_release(ctx, mk);
}

mmc_tensor *mmc_tp_sp_split(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x) {
    sp_check(tp, x, "mmc_tp_sp_split");
    const int64_t P = mmc_comm_size(tp), r = mmc_comm_rank(tp), B = x->shape[0], T = x->shape[1], C = x->shape[2];
    MMC_CHECK(T % P == 0, "mmc_tp_sp_split: T %lld not divisible by tp %lld", (long long)T, (long long)P);
    const int64_t Tl = T / P;
    mmc_tensor *xc = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, Tl, C));   /* [B, T/tp, C] */
    for (int64_t b = 0; b < B; b++)
        memcpy((float *)y->data + b * Tl * C, (const float *)xc->data + (b * T + r * Tl) * C, (size_t)(Tl * C) * sizeof(float));
    mmc_node *n = mmc_tape_record(ctx, "tp_sp_split", sp_shard_backward, y, 1, &x);
    if (n) n->extra = tp, n->i[0] = B, n->i[1] = T, n->i[2] = C;
    return y;
}

static void sp_gather_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    mmc_comm *tp = n->extra;
    const int64_t B = n->i[0], T = n->i[1], C = n->i[2], Tl = T / mmc_comm_size(tp);
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *part = mmc_scratch_alloc(ctx, (size_t)(B * Tl * C) * sizeof(float));
    sp_rs(ctx, tp, n->out->grad->data, part, B, T, C);
    acc_into(ctx, x, part);
    mmc_scratch_release(ctx, mk);
}

mmc_tensor *mmc_tp_sp_gather(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x) {
    sp_check(tp, x, "mmc_tp_sp_gather");
    const int64_t P = mmc_comm_size(tp), B = x->shape[0], Tl = x->shape[1], C = x->shape[2], T = Tl * P;
    mmc_tensor *xc = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, T, C));   /* [B, T, C] */
    sp_ag(ctx, tp, xc->data, y->data, B, T, C);
    mmc_node *n = mmc_tape_record(ctx, "tp_sp_gather", sp_gather_backward, y, 1, &x);
    if (n) n->extra = tp, n->i[0] = B, n->i[1] = T, n->i[2] = C;
    return y;
}

mmc_tensor *mmc_tp_sp_reduce_scatter(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x) {
    sp_check(tp, x, "mmc_tp_sp_reduce_scatter");
    const int64_t P = mmc_comm_size(tp), B = x->shape[0], T = x->shape[1], C = x->shape[2];
    MMC_CHECK(T % P == 0, "mmc_tp_sp_reduce_scatter: T %lld not divisible by tp %lld", (long long)T, (long long)P);
    mmc_tensor *xc = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, T / P, C));   /* [B, T/tp, C] */
    sp_rs(ctx, tp, xc->data, y->data, B, T, C);
    mmc_node *n = mmc_tape_record(ctx, "tp_sp_reduce_scatter", sp_shard_backward, y, 1, &x);
    if (n) n->extra = tp, n->i[0] = B, n->i[1] = T, n->i[2] = C;
    return y;
}

mmc_tensor *mmc_tp_row_linear_sp(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x, const mmc_linear_w *l) {
    mmc_linear_w nb = *l;
    nb.b = NULL;
    mmc_tensor *y = mmc_tp_sp_reduce_scatter(ctx, tp, mmc_nn_linear(ctx, x, &nb));
    return l->b ? mmc_add(ctx, y, l->b) : y;
}

/* ------------------------------------------------------------------ sharded parameters */
void mmc_tp_view(int ndim, const int64_t *shape, int split, int *vndim, int64_t *vshape, int *vsplit) {
    if (split != MMC_TP_FUSED3) {
        *vndim = ndim, *vsplit = split;
        for (int k = 0; k < ndim; k++) vshape[k] = shape[k];
        return;
    }
    MMC_CHECK(ndim < MMC_MAX_DIMS && shape[0] % 3 == 0, "mmc_tp_view: a fused split needs [3 n, ...]");
    *vndim = ndim + 1, *vsplit = 1;
    vshape[0] = 3, vshape[1] = shape[0] / 3;
    for (int k = 1; k < ndim; k++) vshape[k + 1] = shape[k];
}

/* a shape seen as [outer, d, inner] around the split dimension (fused splits through their view) */
static void split_geom(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *d, int64_t *inner) {
    if (dim == MMC_TP_FUSED3) {
        int vn, vd;
        int64_t vs[MMC_MAX_DIMS + 1];
        mmc_tp_view(ndim, shape, dim, &vn, vs, &vd);
        *outer = 3, *d = vs[1], *inner = 1;
        for (int k = 2; k < vn; k++) *inner *= vs[k];
        return;
    }
    *outer = 1, *inner = 1, *d = 1;
    if (dim < 0) { for (int k = 0; k < ndim; k++) *inner *= shape[k]; return; }
    for (int k = 0; k < dim; k++) *outer *= shape[k];
    *d = shape[dim];
    for (int k = dim + 1; k < ndim; k++) *inner *= shape[k];
}

void mmc_tp_local_shape(int ndim, const int64_t *full, int split_dim, int tp_size, int64_t *local) {
    for (int k = 0; k < ndim; k++) local[k] = full[k];
    if (split_dim == MMC_TP_FUSED3) local[0] = full[0] / tp_size;
    else if (split_dim >= 0) local[split_dim] = full[split_dim] / tp_size;
}

void mmc_tp_take_slice(const float *full, int ndim, const int64_t *full_shape, int split_dim, int rank,
                       int tp_size, float *local) {
    int64_t outer, d, inner;
    split_geom(ndim, full_shape, split_dim, &outer, &d, &inner);
    if (split_dim < 0) { memcpy(local, full, (size_t)inner * sizeof(float)); return; }
    const int64_t dl = d / tp_size;
    for (int64_t o = 0; o < outer; o++)
        memcpy(local + o * dl * inner, full + (o * d + (int64_t)rank * dl) * inner, (size_t)(dl * inner) * sizeof(float));
}

mmc_status mmc_tp_bind(const mmc_st *st, const char *name, int ndim, const int64_t *shape, int split_dim,
                       mmc_comm *tp, bool trainable, mmc_tensor **slot, char *errs, size_t errcap) {
    const mmc_st_entry *e = mmc_st_find(st, name);
    size_t used = strlen(errs);
    if (!e) {
        snprintf(errs + used, errcap - used, "\n  missing tensor '%s'", name);
        return MMC_ERR_NOT_FOUND;
    }
    bool ok = e->ndim == ndim;
    for (int k = 0; ok && k < ndim; k++) ok = e->shape[k] == shape[k];
    if (!ok) {
        mmc_tensor want = {.ndim = ndim}, found = {.ndim = e->ndim};
        memcpy(want.shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(found.shape, e->shape, sizeof found.shape);
        char a[96], b[96];
        snprintf(errs + used, errcap - used, "\n  tensor '%s': expected shape %s, found %s", name,
                 mmc_shape_str(&want, a, sizeof a), mmc_shape_str(&found, b, sizeof b));
        return MMC_ERR_SHAPE;
    }
    if (e->dtype != MMC_F32 && e->dtype != MMC_BF16 && e->dtype != MMC_F16) {
        snprintf(errs + used, errcap - used, "\n  tensor '%s': dtype %s is not a float type", name,
                 mmc_dtype_name(e->dtype));
        return MMC_ERR_UNSUPPORTED;
    }
    const int P = tp ? mmc_comm_size(tp) : 1, r = tp ? mmc_comm_rank(tp) : 0;
    int64_t local[MMC_MAX_DIMS];
    mmc_tp_local_shape(ndim, shape, split_dim, P, local);
    mmc_tensor *t = mmc_tensor_new(MMC_F32, ndim, local);
    if (!t) return MMC_ERR_OOM;
    int64_t outer, d, inner;
    split_geom(ndim, shape, split_dim, &outer, &d, &inner);
    const int64_t dl = split_dim < 0 ? d : d / P, off = split_dim < 0 ? 0 : (int64_t)r * dl;
    const size_t es = mmc_dtype_size(e->dtype);
    for (int64_t o = 0; o < outer; o++)   /* only our slice of the mapping is touched */
        mmc_convert((float *)t->data + o * dl * inner, MMC_F32, (const char *)e->data + (size_t)((o * d + off) * inner) * es,
                    e->dtype, dl * inner);
    if (trainable) t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    snprintf(t->name, sizeof t->name, "%.*s", (int)sizeof t->name - 1, name);
    *slot = t;
    return MMC_OK;
}

mmc_status mmc_tp_gather(mmc_comm *tp, const mmc_tensor *local, int split_dim, mmc_tensor *full) {
    MMC_CHECK(full->dtype == MMC_F32 && mmc_is_contiguous(full) && mmc_is_contiguous(local),
              "mmc_tp_gather: contiguous tensors, full f32");
    const int64_t nl = mmc_numel(local);
    const int P = tp ? mmc_comm_size(tp) : 1;
    if (split_dim < 0 || P == 1) {
        mmc_convert(full->data, MMC_F32, local->data, local->dtype, nl);
        return MMC_OK;
    }
    float *mine = malloc((size_t)nl * sizeof(float)), *all = malloc((size_t)(nl * P) * sizeof(float));
    mmc_status st = MMC_OK;
    if (!mine || !all) { st = mmc_error(MMC_ERR_OOM, "out of memory gathering '%s'", local->name); goto done; }
    mmc_convert(mine, MMC_F32, local->data, local->dtype, nl);
    if ((st = mmc_all_gather(tp, mine, all, nl, MMC_F32))) goto done;
    int64_t outer, d, inner;
    split_geom(full->ndim, full->shape, split_dim, &outer, &d, &inner);
    const int64_t dl = d / P;
    float *fd = full->data;
    for (int p = 0; p < P; p++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(fd + (o * d + (int64_t)p * dl) * inner, all + (int64_t)p * nl + o * dl * inner,
                   (size_t)(dl * inner) * sizeof(float));
done:
    free(mine);
    free(all);
    return st;
}

mmc_status mmc_tp_grad_norm(mmc_comm *tp, mmc_tensor *const *params, const signed char *split, int n,
                            double *norm) {
    double sq[2] = {0, 0};   /* split, replicated */
    for (int i = 0; i < n; i++) {
        const mmc_tensor *g = params[i]->grad;
        if (!g) continue;
        const float *gd = g->data;
        double s = 0;
        for (int64_t k = 0, m = mmc_numel(g); k < m; k++) s += (double)gd[k] * gd[k];
        sq[split && split[i] >= 0 ? 0 : 1] += s;
    }
    if (tp && mmc_comm_size(tp) > 1) {
        mmc_status st = mmc_all_reduce(tp, sq, sq, 1, MMC_F64, MMC_SUM);
        if (st) return st;
    }
    *norm = sqrt(sq[0] + sq[1]);
    return MMC_OK;
}
