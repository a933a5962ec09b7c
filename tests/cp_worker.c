/* cp_worker.c — the program tests/test_cp.sh starts under mpirun for the unit checks of
 * context parallelism (mmc_cp.h), on any number C of ranks (one cp group):
 *
 *   cp_worker
 *
 * 1. Re-sharding: a global [B, T, H, D] tensor whose every element encodes its (b, t, h, d);
 *    rank r's sequence shard through seq->head must be exactly heads [r H/C, (r+1) H/C) of the
 *    whole sequence, and head->seq must give back the shard bit for bit (pure data movement:
 *    tolerance 0).
 * 2. Attention: random q [B, T, 4, D], k, v [B, T, 2, D] (GQA), causal, and a packed row (B = 1,
 *    three cu_seqlens segments), and with C/2 KV heads (each replicated over 2 ranks by
 *    mmc_cp_expand_kv); every rank also computes the unsplit attention. The
 *    Ulysses output (shard -> seq->head -> attention -> head->seq) must equal the rank's slice
 *    of the unsplit output: each head's attention runs on the same whole sequence through the
 *    same kernel, so the tolerance is 1e-6 absolute (float summation order only; measured 0).
 *    Gradients of L = sum(out * w) (w fixed random) with respect to the q/k/v shards — through
 *    the all-to-all backwards of every rank — must equal the slices of the unsplit gradients
 *    within 1e-5 absolute (measured 0 with C KV heads; 4.8e-7 with replicated ones, whose copies'
 *    gradients are summed in another order). Prints "cp unit: ..." with the measured figures. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include "test_util.h"
#include "mmc_parallel.h"
#include "mmc_cp.h"
#include "mmc_models.h"
#include "mmc_trainer.h"

static double g_fwd = 0, g_bwd = 0;

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]); if (d > m || d != d) m = d; }
    return m;
}

static void resharding(mmc_comm *cp) {
    const int C = mmc_comm_size(cp), r = mmc_comm_rank(cp);
    const int64_t B = 2, Tl = 3, T = Tl * C, H = 2 * C, D = 5, Hc = H / C;
    float *x = malloc(sizeof(float) * (size_t)(B * Tl * H * D)), *y = malloc(sizeof(float) * (size_t)(B * T * Hc * D)),
          *x2 = malloc(sizeof(float) * (size_t)(B * Tl * H * D));
#define CODE(b, t, h, d) (float)((((b) * 100 + (t)) * 100 + (h)) * 10 + (d))
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tl; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) x[((b * Tl + t) * H + h) * D + d] = CODE(b, r * Tl + t, h, d);
    CHECK_OK(mmc_cp_seq_to_head_raw(cp, x, y, B, Tl, H, D));
    int64_t bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hc; h++)
                for (int64_t d = 0; d < D; d++) bad += y[((b * T + t) * Hc + h) * D + d] != CODE(b, t, r * Hc + h, d);
    CHECKF(bad == 0, "seq->head: %lld misplaced elements", (long long)bad);
    CHECK_OK(mmc_cp_head_to_seq_raw(cp, y, x2, B, Tl, H, D));
    CHECKF(memcmp(x, x2, sizeof(float) * (size_t)(B * Tl * H * D)) == 0, "head->seq is not the inverse");
    /* the autograd ops give the shapes [B, T, H/C, D] and back */
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *xt = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, Tl, H, D));
    memcpy(xt->data, x, sizeof(float) * (size_t)(B * Tl * H * D));
    mmc_tensor *yt = mmc_cp_seq_to_head(ctx, cp, xt);
    CHECK(yt->shape[0] == B && yt->shape[1] == T && yt->shape[2] == Hc && yt->shape[3] == D);
    mmc_tensor *xb = mmc_cp_head_to_seq(ctx, cp, yt);
    CHECK(xb->shape[0] == B && xb->shape[1] == Tl && xb->shape[2] == H && xb->shape[3] == D);
    CHECK(memcmp(xb->data, x, sizeof(float) * (size_t)(B * Tl * H * D)) == 0);
    mmc_ctx_free(ctx);
    free(x); free(y); free(x2);
}

/* one attention case: B rows of T = Tl * C tokens, optional packing */
static void attention_case(mmc_comm *cp, int64_t B, int64_t Tl, const int32_t *cu, int n_seqs, int64_t Hkv,
                           uint64_t seed) {
    const int C = mmc_comm_size(cp), r = mmc_comm_rank(cp);
    const int64_t T = Tl * C, Hq = 2 * C, D = 8;
    mmc_tensor *q = randn_param(seed, 4, MMC_SHAPE(B, T, Hq, D), 1.0f), *k = randn_param(seed + 1, 4, MMC_SHAPE(B, T, Hkv, D), 1.0f),
               *v = randn_param(seed + 2, 4, MMC_SHAPE(B, T, Hkv, D), 1.0f);
    mmc_tensor *qs = randn_param(seed, 4, MMC_SHAPE(B, T, Hq, D), 1.0f), *ks = randn_param(seed + 1, 4, MMC_SHAPE(B, T, Hkv, D), 1.0f),
               *vs = randn_param(seed + 2, 4, MMC_SHAPE(B, T, Hkv, D), 1.0f);
    mmc_tensor *w = randn_param(seed + 3, 4, MMC_SHAPE(B, T, Hq, D), 1.0f);
    w->flags &= ~(MMC_PARAM | MMC_REQUIRES_GRAD);
    mmc_attn_opts ao = {.causal = true, .cu_seqlens = cu, .n_seqs = n_seqs};
    mmc_ctx *ctx = mmc_ctx_new();
    /* unsplit */
    mmc_tensor *of = mmc_attention(ctx, q, k, v, &ao);                           /* [B, T, Hq, D] */
    mmc_backward(ctx, mmc_sum(ctx, mmc_mul(ctx, of, w)));
    mmc_ctx *ctx1 = ctx;
    ctx = mmc_ctx_new();   /* a tape of its own */
    /* Ulysses: this rank's tokens [r Tl, (r+1) Tl) */
    mmc_tensor *ws = mmc_contiguous(ctx, mmc_narrow(ctx, w, 1, r * Tl, Tl));
    mmc_tensor *oq = mmc_cp_seq_to_head(ctx, cp, mmc_narrow(ctx, qs, 1, r * Tl, Tl));
    mmc_tensor *ok = mmc_cp_seq_to_head(ctx, cp, mmc_cp_expand_kv(ctx, cp, mmc_narrow(ctx, ks, 1, r * Tl, Tl)));
    mmc_tensor *ov = mmc_cp_seq_to_head(ctx, cp, mmc_cp_expand_kv(ctx, cp, mmc_narrow(ctx, vs, 1, r * Tl, Tl)));
    mmc_tensor *os = mmc_cp_head_to_seq(ctx, cp, mmc_attention(ctx, oq, ok, ov, &ao));   /* [B, Tl, Hq, D] */
    mmc_backward(ctx, mmc_sum(ctx, mmc_mul(ctx, os, ws)));
    mmc_tensor *ofs = mmc_contiguous(ctx1, mmc_narrow(ctx1, of, 1, r * Tl, Tl));
    mmc_tensor *osc = mmc_contiguous(ctx, os);
    double df = maxdiff(osc->data, ofs->data, mmc_numel(ofs));
    CHECKF(df <= 1e-6, "attention output: max |diff| %.3g > 1e-6", df);
    if (df > g_fwd) g_fwd = df;
    mmc_tensor *pf[3] = {q, k, v}, *ps[3] = {qs, ks, vs};
    for (int i = 0; i < 3; i++) {
        mmc_tensor *gf = mmc_contiguous(ctx, mmc_narrow(ctx, pf[i]->grad, 1, r * Tl, Tl));
        mmc_tensor *gs = mmc_contiguous(ctx, mmc_narrow(ctx, ps[i]->grad, 1, r * Tl, Tl));
        double db = maxdiff(gs->data, gf->data, mmc_numel(gf));
        CHECKF(db <= 1e-5, "gradient of %c: max |diff| %.3g > 1e-5", "qkv"[i], db);
        if (db > g_bwd) g_bwd = db;
    }
    mmc_ctx_free(ctx);
    mmc_ctx_free(ctx1);
    mmc_tensor *all[7] = {q, k, v, qs, ks, vs, w};
    for (int i = 0; i < 7; i++) mmc_tensor_free(all[i]);
}

/* Ring attention (cp_ring.c): global q [B, T, Hq, D], k, v [B, T, Hkv, D], T = Tl C; rank r takes
 * the zigzag rows mmc_cp_ring_pos(r, C, Tl, t) as its shard, runs ring attention (K/V blocks round
 * the C ranks), and compares its output rows and its shards' q/k/v gradients (L = sum(out * w))
 * with the same rows of the unsplit mmc_attention (another kernel: tiled flash attention).
 * cu (packed, B = 1) may end before T: the ring takes the tail as one more segment, the unsplit
 * reference is given it explicitly. Tolerances: output 2e-6, gradients 1e-5 absolute (values and
 * gradients are O(1); the two kernels sum in different orders). */
static double g_rfwd = 0, g_rbwd = 0;
static void ring_case(mmc_comm *cp, int64_t B, int64_t Tl, const int32_t *cu, int n_seqs, int64_t Hkv, bool causal,
                      uint64_t seed) {
    const int C = mmc_comm_size(cp), r = mmc_comm_rank(cp);
    const int64_t T = Tl * C, Hq = 4, D = 8;
    mmc_tensor *full[3] = {randn_param(seed, 4, MMC_SHAPE(B, T, Hq, D), 1.0f),
                           randn_param(seed + 1, 4, MMC_SHAPE(B, T, Hkv, D), 1.0f),
                           randn_param(seed + 2, 4, MMC_SHAPE(B, T, Hkv, D), 1.0f)};
    mmc_tensor *w = randn_param(seed + 3, 4, MMC_SHAPE(B, T, Hq, D), 1.0f);
    w->flags &= ~(MMC_PARAM | MMC_REQUIRES_GRAD);
    int64_t gi[64];
    CHECK(Tl <= 64);
    for (int64_t t = 0; t < Tl; t++) gi[t] = mmc_cp_ring_pos(r, C, Tl, t);
    /* rows gi of x [B, T, H, D] -> [B, Tl, H, D] */
#define ROWS(dst, src) do { const int64_t rw_ = (src)->shape[2] * (src)->shape[3]; \
        for (int64_t b_ = 0; b_ < B; b_++) for (int64_t t_ = 0; t_ < Tl; t_++) \
            memcpy((float *)(dst) + (b_ * Tl + t_) * rw_, (const float *)(src)->data + (b_ * T + gi[t_]) * rw_, \
                   sizeof(float) * (size_t)rw_); } while (0)
    mmc_tensor *sh[3], *ws = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, Tl, Hq, D));
    for (int i = 0; i < 3; i++) {
        sh[i] = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, Tl, full[i]->shape[2], D));
        ROWS(sh[i]->data, full[i]);
        sh[i]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    }
    ROWS(ws->data, w);
    int32_t cu2[16];
    int n2 = n_seqs;
    if (cu) {   /* the reference needs the padding tail as a segment of its own */
        memcpy(cu2, cu, sizeof(int32_t) * (size_t)(n_seqs + 1));
        if (cu2[n2] < T) cu2[++n2] = (int32_t)T;
    }
    mmc_attn_opts af = {.causal = causal, .cu_seqlens = cu ? cu2 : NULL, .n_seqs = n2};
    mmc_attn_opts ar = {.causal = causal, .cu_seqlens = cu, .n_seqs = n_seqs};
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *of = mmc_attention(ctx, full[0], full[1], full[2], &af);         /* [B, T, Hq, D] */
    mmc_backward(ctx, mmc_sum(ctx, mmc_mul(ctx, of, w)));
    mmc_ctx *cr = mmc_ctx_new();
    mmc_tensor *os = mmc_cp_ring_attention(cr, cp, sh[0], sh[1], sh[2], &ar);    /* [B, Tl, Hq, D] */
    mmc_backward(cr, mmc_sum(cr, mmc_mul(cr, os, ws)));
    float *want = malloc(sizeof(float) * (size_t)(B * Tl * Hq * D));
    ROWS(want, of);
    double df = maxdiff(os->data, want, B * Tl * Hq * D);
    CHECKF(df <= 2e-6, "ring attention output (B %lld, Hkv %lld, %s%s): max |diff| %.3g > 2e-6", (long long)B,
           (long long)Hkv, causal ? "causal" : "full", cu ? ", packed" : "", df);
    if (df > g_rfwd) g_rfwd = df;
    for (int i = 0; i < 3; i++) {
        float *gw = malloc(sizeof(float) * (size_t)mmc_numel(sh[i]));
        ROWS(gw, full[i]->grad);
        double db = maxdiff(sh[i]->grad->data, gw, mmc_numel(sh[i]));
        CHECKF(db <= 1e-5, "ring attention gradient of %c (B %lld, Hkv %lld, %s%s): max |diff| %.3g > 1e-5", "qkv"[i],
               (long long)B, (long long)Hkv, causal ? "causal" : "full", cu ? ", packed" : "", db);
        if (db > g_rbwd) g_rbwd = db;
        free(gw);
    }
#undef ROWS
    free(want);
    mmc_ctx_free(cr);
    mmc_ctx_free(ctx);
    for (int i = 0; i < 3; i++) { mmc_tensor_free(full[i]); mmc_tensor_free(sh[i]); }
    mmc_tensor_free(w);
    mmc_tensor_free(ws);
}

/* Causal load balance of the zigzag layout: the (query, key) pairs a rank's queries attend to in
 * each ring step, counted from the global positions alone (mmc_cp_ring_pos), must be the same on
 * every rank at every step (2 h^2 for a chunk length h, plus h on the step of its own block); with
 * contiguous shards (rank r holding [r T/C, (r+1) T/C)) rank C-1 would do 2C-1 times rank 0's work. */
static void zigzag_balance(mmc_comm *cp) {
    const int C = mmc_comm_size(cp), r = mmc_comm_rank(cp);
    const int64_t Tl = 12;
    int64_t sum[16], own[16], zz = 0, ct = 0;   /* per ring step: summed over ranks / this rank's */
    CHECK(C <= 16);
    for (int s = 0; s < C; s++) {
        const int src = (r + C - s) % C;
        int64_t z = 0, c = 0;
        for (int64_t t = 0; t < Tl; t++)
            for (int64_t j = 0; j < Tl; j++) {
                z += mmc_cp_ring_pos(src, C, Tl, j) <= mmc_cp_ring_pos(r, C, Tl, t);
                c += (int64_t)src * Tl + j <= (int64_t)r * Tl + t;
            }
        sum[s] = own[s] = z;
        zz += z, ct += c;
    }
    CHECK_OK(mmc_all_reduce(cp, sum, sum, C, MMC_I64, MMC_SUM));   /* equal on all ranks iff C x own == sum on each */
    int64_t zmax = zz, zmin = zz, cmax = ct, cmin = ct;
    CHECK_OK(mmc_all_reduce(cp, &zmax, &zmax, 1, MMC_I64, MMC_MAX));
    CHECK_OK(mmc_all_reduce(cp, &cmax, &cmax, 1, MMC_I64, MMC_MAX));
    zmin = -zmin, cmin = -cmin;
    CHECK_OK(mmc_all_reduce(cp, &zmin, &zmin, 1, MMC_I64, MMC_MAX));
    CHECK_OK(mmc_all_reduce(cp, &cmin, &cmin, 1, MMC_I64, MMC_MAX));
    zmin = -zmin, cmin = -cmin;
    for (int s = 0; s < C; s++)
        CHECKF(sum[s] == (int64_t)C * own[s], "zigzag: ring step %d does not have the same causal work on every rank", s);
    CHECKF(zmin == zmax, "zigzag: causal work per rank from %lld to %lld pairs", (long long)zmin, (long long)zmax);
    if (r == 0)
        printf("cp zigzag: %d ranks, shard %lld: every rank %lld causal pairs (each ring step equal); contiguous "
               "shards: %lld to %lld (%.1fx)\n", C, (long long)Tl, (long long)zmax, (long long)cmin, (long long)cmax,
               (double)cmax / (double)cmin);
}

/* `cp_worker mem DIR T [ring]`: one training forward + backward of a T-token row of the model in
 * DIR, its sequence split over the world (1 process: unsplit), Ulysses or ring attention; prints
 * the activation arena's high-water mark of each rank and the bytes it sent (the README's
 * per-rank memory and communication figures). */
static int mem_run(mmc_comm *world, const char *dir, int64_t T, bool ring) {
    const int R = mmc_comm_rank(world), C = mmc_comm_size(world);
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cj = NULL;
    mmc_qwen2 *m = NULL;
    if (mmc_json_load(path, &cj) || mmc_qwen2_load(dir, cj, true, &m)) { fprintf(stderr, "%s: %s\n", dir, mmc_last_error()); return 1; }
    if ((!ring && mmc_cp_check_qwen2(&m->cfg, C, dir)) || T % (ring ? 2 * C : C)) {
        fprintf(stderr, "cp_worker mem: %s (T %lld, cp %d)\n", mmc_last_error(), (long long)T, C);
        mmc_qwen2_free(m); mmc_json_free(cj);
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T), *lab = malloc(sizeof(int32_t) * (size_t)T);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(3 * T));
    for (int64_t t = 0; t < T; t++) ids[t] = lab[t] = (int32_t)((t * 7919) % m->cfg.vocab_size);
    for (int64_t t = 0; t < 3 * T; t++) pos[t] = t % T;
    mmc_batch b = {.B = 1, .T = T, .input_ids = ids, .labels = lab, .position_ids = pos, .n_seqs = 1};
    mmc_cp_set_mode_qwen2(m, ring ? MMC_CP_RING : MMC_CP_ULYSSES);
    mmc_ctx *ctx = mmc_ctx_new();
    if (C > 1 && mmc_barrier(world)) return 1;
    mmc_dist_reset_stats();
    double t0 = mmc_now();
    mmc_tensor *l = C > 1 ? mmc_cp_qwen2_lm_loss(ctx, m, world, &b, 1.0 / (double)(T - 1), NULL)
                          : mmc_qwen2_lm_loss(ctx, m, &b, 1.0 / (double)(T - 1), NULL);
    mmc_backward(ctx, l);
    const double secs = mmc_now() - t0;
    mmc_dist_stats ds;
    mmc_dist_get_stats(&ds);   /* attention's traffic only: nothing else is communicated in between */
    double lv = *(const float *)l->data;
    if (C > 1 && mmc_all_reduce(world, &lv, &lv, 1, MMC_F64, MMC_SUM)) return 1;
    const double peak = (double)mmc_arena_peak(mmc_ctx_arena(ctx)) / 1048576.0;
    printf("cp memory: T %lld, cp %d, rank %d: activation arena peak %.1f MiB, forward+backward %.2f s, loss %.7f, "
           "%s sent %.2f MiB in %lld operations (exposed wait %.3f s of %.3f s in flight)\n", (long long)T, C, R, peak,
           secs, lv, ring ? "ring" : "ulysses", (double)ds.bytes / 1048576.0, (long long)ds.ops, ds.wait_s, ds.busy_s);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
    mmc_json_free(cj);
    free(ids); free(lab); free(pos);
    return 0;
}

/* `cp_worker kernel T`: this thread's CPU time of one causal attention forward + backward over a
 * T-token row (B 1, 4 query heads of 2 KV heads, D 16: the tiny Qwen2's), ring attention's block
 * kernel on one rank (one block of the whole row) against mmc_attention, min of 3 each. */
static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int kernel_run(int64_t T) {
    mmc_tensor *q = randn_param(1, 4, MMC_SHAPE(1, T, 4, 16), 1.0f), *k = randn_param(2, 4, MMC_SHAPE(1, T, 2, 16), 1.0f),
               *v = randn_param(3, 4, MMC_SHAPE(1, T, 2, 16), 1.0f);
    mmc_attn_opts ao = {.causal = true};
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 6; rep++) {   /* alternating */
        mmc_ctx *ctx = mmc_ctx_new();
        const double t0 = thread_cpu();
        mmc_tensor *o = rep & 1 ? mmc_cp_ring_attention(ctx, NULL, q, k, v, &ao) : mmc_attention(ctx, q, k, v, &ao);
        mmc_backward(ctx, mmc_sum(ctx, o));
        const double dt = thread_cpu() - t0;
        if (dt < best[rep & 1]) best[rep & 1] = dt;
        mmc_ctx_free(ctx);
    }
    printf("cp kernel: T %lld causal fwd+bwd, thread CPU time min of 3: mmc_attention %.3f s, ring block kernel %.3f s "
           "(%.2fx)\n", (long long)T, best[0], best[1], best[1] / best[0]);
    mmc_tensor_free(q); mmc_tensor_free(k); mmc_tensor_free(v);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "kernel")) return kernel_run(atoll(argv[2]));
    mmc_comm *world;
    mmc_dist_opts dop = {.backend = MMC_DIST_AUTO, .timeout_s = 120};
    if (mmc_dist_init(&dop, &world)) { fprintf(stderr, "dist init: %s\n", mmc_last_error()); return 1; }
    if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "ring"))) && !strcmp(argv[1], "mem")) {
        int rc = mem_run(world, argv[2], atoll(argv[3]), argc == 5);
        mmc_dist_finalize();
        return rc;
    }
    const int R = mmc_comm_rank(world), C = mmc_comm_size(world);
    resharding(world);
    attention_case(world, 2, 5, NULL, 0, C, 11);              /* padded rows, causal, C KV heads */
    const int32_t cu[4] = {0, 3 * C, 3 * C + 2, 4 * C};       /* one packed row: 3 segments */
    attention_case(world, 1, 4, cu, 3, C, 21);
    attention_case(world, 2, 5, NULL, 0, C / 2 > 0 ? C / 2 : 1, 31);   /* fewer KV heads than ranks: replicated */
    zigzag_balance(world);
    ring_case(world, 2, 6, NULL, 0, 2, true, 41);               /* causal rows, GQA 4:2 */
    ring_case(world, 1, 8, NULL, 0, 1, true, 51);               /* one KV head for any number of ranks */
    ring_case(world, 2, 4, NULL, 0, 2, false, 61);              /* full (non-causal) attention */
    const int32_t pk[5] = {0, 3 * C + 1, 3 * C + 1, 5 * C, 7 * C};   /* packed: an empty segment, a padding tail */
    ring_case(world, 1, 8, pk, 4, 2, true, 71);
    ring_case(world, 1, 8, pk, 4, 2, false, 81);
    if (R == 0) {   /* validation: query heads must divide; KV heads divide or are divided by C */
        mmc_qwen2_config qc = {.num_heads = 12, .num_kv_heads = 4};
        CHECK(mmc_cp_check_qwen2(&qc, 4, "x.yaml") == MMC_OK && mmc_cp_check_qwen2(&qc, 12, "x.yaml") == MMC_OK);
        CHECK(mmc_cp_check_qwen2(&qc, 6, "x.yaml") == MMC_ERR_INVALID && strstr(mmc_last_error(), "num_key_value_heads 4"));
        printf("cp validation: %s\n", mmc_last_error());
        CHECK(mmc_cp_check_qwen2(&qc, 8, "x.yaml") == MMC_ERR_INVALID && strstr(mmc_last_error(), "num_attention_heads 12"));
    }
    if (R == 0) printf("cp unit: %d ranks: re-sharding exact; attention vs unsplit max |diff| %.2e (tol 1e-6), "
                       "q/k/v gradients %.2e (tol 1e-5); ring attention (causal, full, packed) vs unsplit "
                       "output %.2e (tol 2e-6), q/k/v gradients %.2e (tol 1e-5)\n", C, g_fwd, g_bwd, g_rfwd, g_rbwd);
    if (!g_fail) printf("rank %d: all %d cp checks passed\n", R, g_checks);
    mmc_dist_finalize();
    return g_fail ? 1 : 0;
}
