/* cp_ring.c — ring attention for context parallelism (mmc_cp.h, parallel.context_parallel_mode:
 * ring), after Liu, Zaharia & Abbeel 2023 ("Ring Attention with Blockwise Transformers for
 * Near-Infinite Context") and the zigzag layout and backward of zhuzilin's ring-flash-attention.
 *
 * Each of the C ranks holds a sequence shard of q, k and v with all heads. Forward: C steps; at
 * step s rank r holds the K/V block of rank (r - s) mod C, computes its queries' attention over
 * that block (partial output and logsumexp), merges it into the running result by the
 * log-sum-exp rule, and meanwhile (non-blocking send/recv through the communicator) passes the
 * block to rank r + 1 and receives the next one from rank r - 1. Backward recomputes each
 * block's probabilities from the saved logsumexp (FlashAttention-2's backward) and passes the
 * K/V blocks around the ring again, each travelling with its dK/dV accumulator, which after C
 * steps arrives back at the block's owner. Grouped-query heads need no replication here: every
 * rank has every head, so any C works.
 *
 * Causal load balancing (zigzag): the row is cut into 2C chunks of T / 2C and rank r holds
 * chunks r and 2C-1-r, so that every rank's queries see the same number of causal keys. Masks
 * are computed from global positions (and the packed rows' cu_seqlens segments, also global;
 * tokens past cu_seqlens[n_seqs] form one more segment, as mmc_embeds_causal_lm_loss does), so
 * causal, full and block-diagonal (packed) attention are all the same code.
 *
 * The block kernels are our own, simple and exact (f32, one query row at a time over only its
 * visible keys, the block's K and V transposed so that every inner loop runs along the keys;
 * 2.5x the CPU time of mmc_attention, README): src/backend/cpu/attention.c's tiled kernels take
 * one contiguous mask and return no partial logsumexp for a block at given positions. A
 * communicator failure inside an op is fatal, as in cp.c: half-exchanged blocks cannot be
 * recovered. */
#include "mmc_cp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define TAG_KV 0x5241   /* K/V blocks */
#define TAG_DKV 0x5242  /* dK/dV accumulators (backward) */

static void ring_ok(mmc_status st, const char *what) {
    MMC_CHECK(st == MMC_OK, "ring attention %s: %s", what, mmc_last_error());
}

static int tid_(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

int64_t mmc_cp_ring_pos(int r, int C, int64_t Tl, int64_t t) {
    const int64_t h = Tl / 2;   /* chunk length T / 2C */
    return t < h ? (int64_t)r * h + t : (int64_t)(2 * C - 1 - r) * h + (t - h);
}

/* segment of global position g: the i with cu[i] <= g < cu[i+1] (empty segments skipped), n past
 * the last one (padding), 0 without cu_seqlens */
static int32_t seg_of(const int32_t *cu, int n, int64_t g) {
    if (!cu) return 0;
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

typedef struct {
    int64_t B, Tl, Hq, Hkv, D;
    int C;
    float scale;
    bool causal;
    const int32_t *cu;
    int n_seqs;
} ring_shape;

static void positions(const ring_shape *a, int r, int64_t *g, int32_t *sg) {
    for (int64_t t = 0; t < a->Tl; t++) {
        g[t] = mmc_cp_ring_pos(r, a->C, a->Tl, t);
        sg[t] = seg_of(a->cu, a->n_seqs, g[t]);
    }
}

/* The keys of a block visible to the query at global position qg (segment qs): those of its
 * segment, up to qg when causal. A block (rank src's shard) is two chunks of Tl/2 contiguous
 * global positions, so they are at most two ranges of local key indices, [lo[c], hi[c]). */
static int visible_ranges(const ring_shape *a, int src, int64_t qg, int32_t qs, int64_t *lo, int64_t *hi) {
    const int64_t T = a->Tl * a->C, h = a->Tl / 2;
    int64_t gs = 0, ge = T;
    if (a->cu) {
        gs = a->cu[qs < a->n_seqs ? qs : a->n_seqs];
        ge = qs < a->n_seqs ? a->cu[qs + 1] : T;
    }
    if (a->causal && qg + 1 < ge) ge = qg + 1;
    int nonempty = 0;
    for (int c = 0; c < 2; c++) {
        const int64_t c0 = (int64_t)(c ? 2 * a->C - 1 - src : src) * h;   /* the chunk's first global position */
        const int64_t l = gs > c0 ? gs : c0, e = ge < c0 + h ? ge : c0 + h;
        lo[c] = c * h + (l - c0);
        hi[c] = e > l ? c * h + (e - c0) : lo[c];
        nonempty |= hi[c] > lo[c];
    }
    return nonempty;
}

/* e^x for x <= ~0 in f32 (Cody-Waite reduction and the degree-6 polynomial of Cephes' expf, within
 * 2 ulp), written so that the loops over keys vectorise (libm's expf does not) */
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   /* round to nearest */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } e = {.i = ((int32_t)n + 127) << 23};
    return p * e.f;
}

/* k [B, Tl, H, D] -> kt [B, H, D, Tl], so that a query's scores over keys are a vector loop */
static void transpose_kv(const ring_shape *a, const float *k, float *kt) {
    const int64_t Tl = a->Tl, H = a->Hkv, D = a->D;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t j = 0; j < Tl; j++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) kt[((b * H + h) * D + d) * Tl + j] = k[((b * Tl + j) * H + h) * D + d];
}

/* s[j] = sum_d x[d] mul kt[d][j] over the ranges */
static inline void scores(const float *x, float mul, const float *kt, int64_t Tl, int64_t D, const int64_t *lo,
                          const int64_t *hi, float *s) {
    for (int c = 0; c < 2; c++) {
        for (int64_t j = lo[c]; j < hi[c]; j++) s[j] = 0;
        for (int64_t d = 0; d < D; d++) {
            const float xd = x[d] * mul, *kd = kt + d * Tl;
#pragma omp simd
            for (int64_t j = lo[c]; j < hi[c]; j++) s[j] += xd * kd[j];
        }
    }
}

/* work gate for the OpenMP regions (multiply-adds of one ring step) */
static bool worth_threads(const ring_shape *a) { return a->B * a->Tl * a->Tl * a->Hq * a->D > (1 << 16); }

/* One forward ring step: every local query row (b, t, h) of q [B, Tl, Hq, D] (global positions
 * qg, segments qs) against the key block k, v [B, Tl, Hkv, D] of rank src (kt, vt: transposed):
 * the block's softmax over the row's visible keys gives a partial output o_b and logsumexp l_b,
 * merged into the running (o, lse) by   lse' = log(e^lse + e^l_b),   o' = e^(lse - lse') o +
 * e^(l_b - lse') o_b.  o [B, Tl, Hq, D], lse [B, Hq, Tl] (-inf: nothing seen yet); a row with no
 * visible key in this block is left as is. scratch: nthreads x (Tl + D). */
static void block_fwd(const ring_shape *a, int src, const float *q, const float *kt, const float *vt, const int64_t *qg,
                      const int32_t *qs, float *o, float *lse, float *scratch) {
    const int64_t Tl = a->Tl, Hq = a->Hq, Hkv = a->Hkv, D = a->D, G = Hq / Hkv, rows = a->B * Tl * Hq;
#pragma omp parallel if (worth_threads(a))
    {
        float *s = scratch + (size_t)tid_() * (size_t)(Tl + D), *ob = s + Tl;
#pragma omp for schedule(dynamic, 16)
        for (int64_t row = 0; row < rows; row++) {   /* row = (b Tl + t) Hq + h */
            const int64_t h = row % Hq, t = (row / Hq) % Tl, b = row / (Hq * Tl), kh = h / G;
            int64_t lo[2], hi[2];
            if (!visible_ranges(a, src, qg[t], qs[t], lo, hi)) continue;
            scores(q + row * D, a->scale, kt + (b * Hkv + kh) * D * Tl, Tl, D, lo, hi, s);
            float m = -INFINITY, l = 0;
            for (int c = 0; c < 2; c++) {
#pragma omp simd reduction(max : m)
                for (int64_t j = lo[c]; j < hi[c]; j++) m = s[j] > m ? s[j] : m;
            }
            memset(ob, 0, sizeof(float) * (size_t)D);
            const float *vtb = vt + (b * Hkv + kh) * D * Tl;
            for (int c = 0; c < 2; c++) {
#pragma omp simd reduction(+ : l)
                for (int64_t j = lo[c]; j < hi[c]; j++) {
                    s[j] = exp_f(s[j] - m);
                    l += s[j];
                }
                for (int64_t d = 0; d < D; d++) {   /* P v: reductions along the keys (no store chain on ob) */
                    const float *vd = vtb + d * Tl;
                    float acc = 0;
#pragma omp simd reduction(+ : acc)
                    for (int64_t j = lo[c]; j < hi[c]; j++) acc += s[j] * vd[j];
                    ob[d] += acc;
                }
            }
            const float lb = m + logf(l);
            float *orow = o + row * D, *L = lse + (b * Hq + h) * Tl + t;
            if (*L == -INFINITY) {
                for (int64_t d = 0; d < D; d++) orow[d] = ob[d] / l;
                *L = lb;
            } else {
                const float mx = fmaxf(*L, lb), nl = mx + logf(expf(*L - mx) + expf(lb - mx));
                const float ca = expf(*L - nl), cb = expf(lb - nl) / l;
                for (int64_t d = 0; d < D; d++) orow[d] = ca * orow[d] + cb * ob[d];
                *L = nl;
            }
        }
    }
}

/* One backward ring step for the key block k, v of rank src (kt, vt: transposed): with
 * P = exp(scale q·k - lse) from the final logsumexp and delta = rowsum(dO ∘ O),
 *   dv_j += P_ij dO_i,   dS_ij = P_ij (dO_i·v_j - delta_i),   dq_i += scale dS_ij k_j,   dk_j += scale dS_ij q_i.
 * One unit per (b, KV head): it owns that head's dk/dv rows and its query heads' dq rows, so no
 * two threads write the same element and the sums do not depend on the thread count.
 * scratch: nthreads x 2 Tl (D + 1). */
static void block_bwd(const ring_shape *a, int src, const float *q, const float *kt, const float *vt,
                      const float *dO, const float *lse, const float *delta, const int64_t *qg, const int32_t *qs,
                      float *dq, float *dk, float *dv, float *scratch) {
    const int64_t B = a->B, Tl = a->Tl, Hq = a->Hq, Hkv = a->Hkv, D = a->D, G = Hq / Hkv;
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (worth_threads(a))
    for (int64_t b = 0; b < B; b++)
        for (int64_t kh = 0; kh < Hkv; kh++) {
            float *s = scratch + (size_t)tid_() * (size_t)(2 * Tl * (D + 1)), *dp = s + Tl;
            float *dkt = dp + Tl, *dvt = dkt + D * Tl;   /* this head's dk, dv transposed: [D, Tl] */
            memset(dkt, 0, sizeof(float) * (size_t)(2 * D * Tl));
            const float *ktb = kt + (b * Hkv + kh) * D * Tl, *vtb = vt + (b * Hkv + kh) * D * Tl;
            for (int64_t g = 0; g < G; g++) {
                const int64_t h = kh * G + g;
                for (int64_t t = 0; t < Tl; t++) {
                    const float L = lse[(b * Hq + h) * Tl + t];
                    int64_t lo[2], hi[2];
                    if (L == -INFINITY || !visible_ranges(a, src, qg[t], qs[t], lo, hi)) continue;
                    const int64_t row = (b * Tl + t) * Hq + h;
                    const float *qr = q + row * D, *dor = dO + row * D, di = delta[(b * Hq + h) * Tl + t];
                    float *dqr = dq + row * D;
                    scores(qr, a->scale, ktb, Tl, D, lo, hi, s);
                    scores(dor, 1.0f, vtb, Tl, D, lo, hi, dp);
                    for (int c = 0; c < 2; c++) {
#pragma omp simd
                        for (int64_t j = lo[c]; j < hi[c]; j++) {
                            s[j] = exp_f(s[j] - L);                        /* P */
                            dp[j] = s[j] * (dp[j] - di) * a->scale;        /* scale dS */
                        }
                        for (int64_t d = 0; d < D; d++) {   /* dq: a reduction along the keys */
                            const float *kd = ktb + d * Tl;
                            float acc = 0;
#pragma omp simd reduction(+ : acc)
                            for (int64_t j = lo[c]; j < hi[c]; j++) acc += dp[j] * kd[j];
                            dqr[d] += acc;
                        }
                        for (int64_t d = 0; d < D; d++) {   /* dk, dv: vector loops along the keys too */
                            const float qd = qr[d], od = dor[d];
                            float *kd = dkt + d * Tl, *vd = dvt + d * Tl;
#pragma omp simd
                            for (int64_t j = lo[c]; j < hi[c]; j++) {
                                kd[j] += qd * dp[j];
                                vd[j] += od * s[j];
                            }
                        }
                    }
                }
            }
            for (int64_t j = 0; j < Tl; j++) {
                float *dkr = dk + ((b * Tl + j) * Hkv + kh) * D, *dvr = dv + ((b * Tl + j) * Hkv + kh) * D;
                for (int64_t d = 0; d < D; d++) {
                    dkr[d] += dkt[d * Tl + j];
                    dvr[d] += dvt[d * Tl + j];
                }
            }
        }
}

typedef struct {
    mmc_comm *cp;
    int32_t *cu;   /* copied into the arena: the node outlives the caller's array */
} ring_node;

static void ring_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    const bool gq = mmc_requires_grad(q), gk = mmc_requires_grad(k), gv = mmc_requires_grad(v);
    if (!gq && !gk && !gv) return;   /* (every rank of the group takes the same branch) */
    const ring_node *rn = n->extra;
    mmc_comm *cp = rn->cp;
    const int C = cp ? mmc_comm_size(cp) : 1, r = cp ? mmc_comm_rank(cp) : 0;
    const ring_shape a = {.B = q->shape[0], .Tl = q->shape[1], .Hq = q->shape[2], .Hkv = k->shape[2],
                          .D = q->shape[3], .C = C, .scale = (float)n->f[0], .causal = n->i[0] != 0, .cu = rn->cu,
                          .n_seqs = (int)n->i[1]};
    const int64_t nq = a.B * a.Tl * a.Hq * a.D, nkv = a.B * a.Tl * a.Hkv * a.D, nl = a.B * a.Hq * a.Tl;
    const float *O = n->out->data, *dO = n->out->grad->data, *lse = n->saved[0]->data;
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    float *delta = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)nl);            /* [B, Hq, Tl] */
    for (int64_t b = 0; b < a.B; b++)
        for (int64_t t = 0; t < a.Tl; t++)
            for (int64_t h = 0; h < a.Hq; h++) {
                const int64_t row = (b * a.Tl + t) * a.Hq + h;
                float d = 0;
                for (int64_t i = 0; i < a.D; i++) d += dO[row * a.D + i] * O[row * a.D + i];
                delta[(b * a.Hq + h) * a.Tl + t] = d;
            }
    float *dq = gq ? mmc_grad(ctx, q)->data : mmc_scratch_alloc(ctx, sizeof(float) * (size_t)nq);
    if (!gq) memset(dq, 0, sizeof(float) * (size_t)nq);
    const size_t kvb = sizeof(float) * (size_t)(2 * nkv);   /* one K/V (or dK/dV) block: [2][B, Tl, Hkv, D] */
    float *cur = mmc_scratch_alloc(ctx, kvb), *nxt = mmc_scratch_alloc(ctx, kvb), *din = mmc_scratch_alloc(ctx, kvb),
          *part = mmc_scratch_alloc(ctx, kvb), *acc[2] = {mmc_scratch_alloc(ctx, kvb), mmc_scratch_alloc(ctx, kvb)};
    float *kt = mmc_scratch_alloc(ctx, kvb);   /* the block's k and v transposed: [2][B, Hkv, D, Tl] */
    float *scratch = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)(mmc_get_num_threads() * 2 * a.Tl * (a.D + 1)));
    int64_t *qg = mmc_scratch_alloc(ctx, sizeof(int64_t) * (size_t)a.Tl);
    int32_t *qs = mmc_scratch_alloc(ctx, sizeof(int32_t) * (size_t)a.Tl);
    memcpy(cur, k->data, sizeof(float) * (size_t)nkv);
    memcpy(cur + nkv, v->data, sizeof(float) * (size_t)nkv);
    positions(&a, r, qg, qs);
    const int next = (r + 1) % C, prev = (r + C - 1) % C;
    mmc_dist_req *sreq[2] = {NULL, NULL};
    float *mine = acc[0];
    for (int s = 0; s < C; s++) {
        mmc_dist_req *kvr[2] = {NULL, NULL}, *dr = NULL;
        if (s < C - 1) {   /* the next K/V block travels while this one is worked on */
            ring_ok(mmc_recv_start(cp, nxt, 2 * nkv, MMC_F32, prev, TAG_KV, &kvr[0]), "backward: receive K/V");
            ring_ok(mmc_send_start(cp, cur, 2 * nkv, MMC_F32, next, TAG_KV, &kvr[1]), "backward: send K/V");
        }
        if (s > 0) ring_ok(mmc_recv_start(cp, din, 2 * nkv, MMC_F32, prev, TAG_DKV, &dr), "backward: receive dK/dV");
        memset(part, 0, kvb);
        transpose_kv(&a, cur, kt);
        transpose_kv(&a, cur + nkv, kt + nkv);
        block_bwd(&a, (r + C - s) % C, q->data, kt, kt + nkv, dO, lse, delta, qg, qs, dq, part, part + nkv,
                  scratch);
        float *ac = acc[s & 1];
        if (sreq[s & 1]) ring_ok(mmc_dist_wait(sreq[s & 1]), "backward: send dK/dV"), sreq[s & 1] = NULL;
        if (s == 0) memcpy(ac, part, kvb);
        else {   /* the block's accumulator from the ranks before us, plus our queries' share */
            ring_ok(mmc_dist_wait(dr), "backward: receive dK/dV");
            for (int64_t i = 0; i < 2 * nkv; i++) ac[i] = din[i] + part[i];
        }
        if (C > 1) ring_ok(mmc_send_start(cp, ac, 2 * nkv, MMC_F32, next, TAG_DKV, &sreq[s & 1]), "backward: send dK/dV");
        mine = ac;
        if (s < C - 1) {
            ring_ok(mmc_dist_wait_all(kvr, 2), "backward: K/V exchange");
            float *tmp = cur; cur = nxt; nxt = tmp;
        }
    }
    if (C > 1) {   /* our own block's accumulator, after its trip round the ring */
        ring_ok(mmc_recv(cp, din, 2 * nkv, MMC_F32, prev, TAG_DKV), "backward: receive own dK/dV");
        ring_ok(mmc_dist_wait_all(sreq, 2), "backward: send dK/dV");
        mine = din;
    }
    if (gk) { float *g = mmc_grad(ctx, k)->data; for (int64_t i = 0; i < nkv; i++) g[i] += mine[i]; }
    if (gv) { float *g = mmc_grad(ctx, v)->data; for (int64_t i = 0; i < nkv; i++) g[i] += mine[nkv + i]; }
    mmc_scratch_release(ctx, mk);
}

mmc_tensor *mmc_cp_ring_attention(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v,
                                  const mmc_attn_opts *opts) {
    const int C = cp ? mmc_comm_size(cp) : 1, r = cp ? mmc_comm_rank(cp) : 0;
    MMC_CHECK(q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && q->dtype == MMC_F32 && k->dtype == MMC_F32 &&
                  v->dtype == MMC_F32, "mmc_cp_ring_attention: q, k, v must be f32 [B, T/C, H, D]");
    const int64_t B = q->shape[0], Tl = q->shape[1], Hq = q->shape[2], D = q->shape[3], Hkv = k->shape[2];
    MMC_CHECK(k->shape[0] == B && k->shape[1] == Tl && k->shape[3] == D && v->shape[0] == B && v->shape[1] == Tl &&
                  v->shape[2] == Hkv && v->shape[3] == D && Hkv > 0 && Hq % Hkv == 0,
              "mmc_cp_ring_attention: q [B, T/C, Hq, D], k and v [B, T/C, Hkv, D] with Hq a multiple of Hkv");
    MMC_CHECK(Tl % 2 == 0, "mmc_cp_ring_attention: the shard length %lld must be even (zigzag: two chunks of T / 2C)",
              (long long)Tl);
    mmc_attn_opts def = {0};
    if (!opts) opts = &def;
    int32_t *cu = NULL;
    if (opts->cu_seqlens) {
        MMC_CHECK(B == 1 && opts->n_seqs >= 1 && opts->cu_seqlens[0] == 0 && opts->cu_seqlens[opts->n_seqs] <= Tl * C,
                  "mmc_cp_ring_attention: cu_seqlens needs B == 1 and offsets from 0 to at most T = %lld",
                  (long long)(Tl * C));
        for (int i = 0; i < opts->n_seqs; i++)
            MMC_CHECK(opts->cu_seqlens[i + 1] >= opts->cu_seqlens[i], "mmc_cp_ring_attention: cu_seqlens not "
                      "non-decreasing at %d", i);
        cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(opts->n_seqs + 1));
        memcpy(cu, opts->cu_seqlens, sizeof(int32_t) * (size_t)(opts->n_seqs + 1));
    }
    const ring_shape a = {.B = B, .Tl = Tl, .Hq = Hq, .Hkv = Hkv, .D = D, .C = C,
                          .scale = opts->scale != 0 ? opts->scale : 1.0f / sqrtf((float)D), .causal = opts->causal,
                          .cu = cu, .n_seqs = cu ? opts->n_seqs : 0};
    q = mmc_contiguous(ctx, q);
    k = mmc_contiguous(ctx, k);
    v = mmc_contiguous(ctx, v);
    const int64_t nkv = B * Tl * Hkv * D;
    mmc_tensor *out = mmc_zeros(ctx, MMC_F32, 4, MMC_SHAPE(B, Tl, Hq, D));        /* [B, T/C, Hq, D] */
    mmc_tensor *lse = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, Hq, Tl));             /* [B, Hq, T/C] */
    float *L = lse->data;
    for (int64_t i = 0; i < B * Hq * Tl; i++) L[i] = -INFINITY;
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    const size_t kvb = sizeof(float) * (size_t)(2 * nkv);
    float *cur = mmc_scratch_alloc(ctx, kvb), *nxt = mmc_scratch_alloc(ctx, kvb);
    float *scratch = mmc_scratch_alloc(ctx, sizeof(float) * (size_t)(mmc_get_num_threads() * (Tl + D)));
    float *kt = mmc_scratch_alloc(ctx, kvb);   /* the block's k and v transposed: [2][B, Hkv, D, Tl] */
    int64_t *qg = mmc_scratch_alloc(ctx, sizeof(int64_t) * (size_t)Tl);
    int32_t *qs = mmc_scratch_alloc(ctx, sizeof(int32_t) * (size_t)Tl);
    memcpy(cur, k->data, sizeof(float) * (size_t)nkv);
    memcpy(cur + nkv, v->data, sizeof(float) * (size_t)nkv);
    positions(&a, r, qg, qs);
    for (int s = 0; s < C; s++) {
        mmc_dist_req *req[2] = {NULL, NULL};
        if (s < C - 1) {   /* pass the block on and take the next while computing on this one */
            ring_ok(mmc_recv_start(cp, nxt, 2 * nkv, MMC_F32, (r + C - 1) % C, TAG_KV, &req[0]), "receive K/V");
            ring_ok(mmc_send_start(cp, cur, 2 * nkv, MMC_F32, (r + 1) % C, TAG_KV, &req[1]), "send K/V");
        }
        transpose_kv(&a, cur, kt);
        transpose_kv(&a, cur + nkv, kt + nkv);
        block_fwd(&a, (r + C - s) % C, q->data, kt, kt + nkv, qg, qs, out->data, L, scratch);   /* rank r - s's */
        if (s < C - 1) {
            ring_ok(mmc_dist_wait_all(req, 2), "K/V exchange");
            float *tmp = cur; cur = nxt; nxt = tmp;
        }
    }
    mmc_scratch_release(ctx, mk);
    mmc_tensor *ins[3] = {q, k, v};
    mmc_node *n = mmc_tape_record(ctx, "cp_ring_attention", ring_backward, out, 3, ins);
    if (n) {
        ring_node *rn = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *rn);
        rn->cp = cp;
        rn->cu = cu;
        n->extra = rn;
        n->saved[0] = lse;
        n->f[0] = a.scale;
        n->i[0] = a.causal;
        n->i[1] = a.n_seqs;
    }
    return out;
}
