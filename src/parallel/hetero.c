/* hetero.c — per-modality parallel plans (mmc_hetero.h): the cost-balanced share of a batch's
 * images over a group and the row all-gather that reassembles the encoder's features (uneven
 * counts padded to the largest, one all-gather through the communicator, then compacted). A
 * communicator failure inside the op is fatal, as in tp.c: the watchdog has named the rank. */
#include "mmc_hetero.h"
#include "mmc_ops.h"

#include <string.h>

void mmc_hetero_share(const int64_t *cost, int n, int size, int rank, int *first, int *count) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += cost[i] > 0 ? cost[i] : 0;
    int lo = n, hi = n;   /* [lo, hi): the items whose owner is rank */
    int64_t before = 0;
    for (int i = 0; i < n; i++) {
        const int64_t c = cost[i] > 0 ? cost[i] : 0;
        /* owner = floor((before + c/2) size / total), in integers: (2 before + c) size / (2 total) */
        int64_t own = total > 0 ? (2 * before + c) * (int64_t)size / (2 * total) : (int64_t)i * size / (n > 0 ? n : 1);
        if (own >= size) own = size - 1;
        if (own == rank && lo == n) lo = i;
        if (own > rank && hi == n) hi = i;
        before += c;
    }
    if (lo > hi) lo = hi;
    *first = lo;
    *count = hi - lo;
}

typedef struct { mmc_comm *g; int64_t off; } gather_rows_extra;

static void gather_rows_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    const gather_rows_extra *e = n->extra;
    const int64_t C = x->shape[1], cnt = x->shape[0] * C;
    const float *dy = (const float *)n->out->grad->data + e->off * C;
    float *dx = mmc_grad(ctx, x)->data;
    for (int64_t i = 0; i < cnt; i++) dx[i] += dy[i];
}

mmc_tensor *mmc_hetero_gather_rows(mmc_ctx *ctx, mmc_comm *g, mmc_tensor *x, const int64_t *rows) {
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 2, "mmc_hetero_gather_rows: x must be f32 [rows, C]");
    const int P = g ? mmc_comm_size(g) : 1, r = g ? mmc_comm_rank(g) : 0;
    MMC_CHECK(rows[r] == x->shape[0], "mmc_hetero_gather_rows: rank %d holds %lld rows, the plan says %lld", r,
              (long long)x->shape[0], (long long)rows[r]);
    if (P == 1) return x;
    const int64_t C = x->shape[1];
    int64_t total = 0, mx = 0, off = 0;
    for (int k = 0; k < P; k++) {
        if (k == r) off = total;
        total += rows[k];
        if (rows[k] > mx) mx = rows[k];
    }
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(total, C));   /* [sum rows, C] */
    if (mx > 0) {
        mmc_arena_mark m = mmc_scratch_mark(ctx);
        float *send = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)(mx * C));
        float *recv = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)(P * mx * C));
        mmc_tensor *xc = mmc_contiguous(ctx, x);
        memset(send, 0, sizeof(float) * (size_t)(mx * C));   /* the pad rows travel too: keep them defined */
        if (rows[r]) memcpy(send, xc->data, sizeof(float) * (size_t)(rows[r] * C));
        mmc_status st = mmc_all_gather(g, send, recv, mx * C, MMC_F32);
        MMC_CHECK(st == MMC_OK, "per-modality plan: all-gather of the encoder's features: %s", mmc_last_error());
        int64_t at = 0;
        for (int k = 0; k < P; k++) {
            if (rows[k]) memcpy((float *)y->data + at * C, recv + (int64_t)k * mx * C, sizeof(float) * (size_t)(rows[k] * C));
            at += rows[k];
        }
        mmc_scratch_release(ctx, m);
    }
    mmc_node *n = mmc_tape_record(ctx, "hetero_gather_rows", gather_rows_backward, y, 1, &x);
    if (n) {
        gather_rows_extra *e = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *e);
        e->g = g;
        e->off = off;
        n->extra = e;
    }
    return y;
}
