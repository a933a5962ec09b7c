/* tp_worker.c — the program tests/test_tp.sh starts under mpirun: tensor-parallel training of
 * the tiny Qwen2 (tests/fixtures/qwen2/<dir>) against single-process training.
 *
 *   tp_worker DIR TP OUT [STEPS [sp]]
 *
 * The world is cut into tp groups of TP ranks (Megatron order: tensor fastest) and W/TP data-
 * parallel replicas. Every rank binds only its slices of DIR's weights (mmc_qwen2_load_tp) and
 * trains STEPS AdamW steps (with sp: sequence parallelism between the blocks; gradient clipping at 1.0 through the tp-aware global norm); data-
 * parallel replica d takes micro-batch d of each global batch and the gradients are summed
 * over the dp group. World rank 0 then runs the same steps in one process on the full model,
 * accumulating the W/TP micro-batches, and compares: the losses of every step (relative), the
 * gradient norms, and the final weights gathered from the shards (max |diff| relative to the
 * tensor's max |value|). The gathered weights are saved under the HF names as OUT/model.safetensors
 * (with DIR's config.json); the checkpoint is loaded back at tp=1 (its logits must equal the
 * tp model's gathered logits) and at tp=TP (its loss must equal the trained model's).
 * Tolerances: losses 1e-5 relative, gradient norms 1e-4 relative, final weights 2e-4 absolute
 * (they move up to lr * steps = 1.5e-2; the optimised build stays near 1e-5, the unoptimised
 * sanitizer build reached 7.5e-5 on tiny_tied: same as mmc train's test, test_tp.sh). Float reduction order differs: the row-parallel
 * all-reduce adds partial products the single process sums in one GEMM; the weights differ
 * most where the gradient is mathematically zero (k_proj's bias: softmax ignores a constant
 * added to every key), since AdamW's normalisation turns rounding noise there into lr-sized
 * steps. Prints "tp parity: ..." lines with the measured figures (TP_DEBUG=1: per tensor). */
#include "test_util.h"
#include "mmc_parallel.h"
#include "mmc_tp.h"
#include "mmc_models.h"
#include "mmc_train.h"
#include "mmc_trainer.h"
#include "run_dir.h"

#include <dirent.h>
#include <sys/stat.h>

enum { B = 2, T = 12, MAX_STEPS = 16 };

/* micro-batch k of step s: deterministic ids, labels = ids with the first two ignored */
static void make_batch(mmc_batch *b, int64_t V, int s, int k, int32_t *ids, int32_t *labels, int64_t *pos) {
    memset(b, 0, sizeof *b);
    uint32_t x = 2654435761u * (uint32_t)(s * 131 + k * 7 + 1);
    for (int i = 0; i < B * T; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % (uint32_t)V);
        labels[i] = (i % T) < 2 ? MMC_IGNORE_INDEX : ids[i];
    }
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < B * T; i++) pos[r * B * T + i] = i % T;
    b->B = B, b->T = T, b->input_ids = ids, b->labels = labels, b->position_ids = pos, b->n_seqs = B;
}

/* Train: grads of micro-batches micro[0 .. n_micro) summed (loss scaled by the global label
 * count), summed over dp, clipped at 1 by the global norm, AdamW. */
static void train(mmc_qwen2 *m, mmc_comm *tp, mmc_comm *dp, int steps, int n_global_micro, const int *micro,
                  int n_micro, double *loss_out, double *norm_out) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_adamw_opts o;
    mmc_adamw_defaults(&o);
    o.lr = 3e-3;
    mmc_adamw a;
    CHECK_OK(mmc_adamw_init(&a, &o, m->params, m->n_params));
    int32_t ids[B * T], labels[B * T];
    int64_t pos[3 * B * T];
    for (int s = 0; s < steps; s++) {
        mmc_zero_grad(m->params, m->n_params);
        int64_t ntot = 0;
        for (int k = 0; k < n_global_micro; k++) {
            mmc_batch b;
            make_batch(&b, m->cfg.vocab_size, s, k, ids, labels, pos);
            ntot += mmc_count_label_tokens(labels, B, T);
        }
        double loss = 0;
        for (int j = 0; j < n_micro; j++) {
            mmc_batch b;
            make_batch(&b, m->cfg.vocab_size, s, micro[j], ids, labels, pos);
            int64_t n = 0;
            mmc_tensor *l = mmc_qwen2_lm_loss(ctx, m, &b, 1.0 / (double)ntot, &n);
            loss += ((float *)l->data)[0];
            mmc_backward(ctx, l);
            mmc_ctx_reset(ctx);
        }
        if (m->sp)   /* sequence parallelism: the replicated parameters' gradients are partial */
            for (int i = 0; i < m->n_params; i++)
                if (m->param_split[i] < 0 && m->params[i]->grad)
                    CHECK_OK(mmc_all_reduce(tp, m->params[i]->grad->data, m->params[i]->grad->data,
                                            mmc_numel(m->params[i]), MMC_F32, MMC_SUM));
        if (dp && mmc_comm_size(dp) > 1) {
            for (int i = 0; i < m->n_params; i++)
                if (m->params[i]->grad)
                    CHECK_OK(mmc_all_reduce(dp, m->params[i]->grad->data, m->params[i]->grad->data,
                                            mmc_numel(m->params[i]), MMC_F32, MMC_SUM));
            CHECK_OK(mmc_all_reduce(dp, &loss, &loss, 1, MMC_F64, MMC_SUM));
        }
        double norm;
        if (tp) {
            CHECK_OK(mmc_tp_grad_norm(tp, m->params, m->param_split, m->n_params, &norm));
            if (norm > 1.0) {   /* torch.nn.utils.clip_grad_norm_ */
                float c = (float)(1.0 / (norm + 1e-6));
                for (int i = 0; i < m->n_params; i++) {
                    mmc_tensor *g = m->params[i]->grad;
                    if (g) for (int64_t e = 0; e < mmc_numel(g); e++) ((float *)g->data)[e] *= c;
                }
            }
        } else {
            norm = mmc_clip_grad_norm(m->params, m->n_params, 1.0);
        }
        mmc_adamw_step(&a, o.lr);
        loss_out[s] = loss;
        norm_out[s] = norm;
    }
    mmc_adamw_free(&a);
    mmc_ctx_free(ctx);
}

static double loss_of(mmc_qwen2 *m, int s, int k) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    int32_t ids[B * T], labels[B * T];
    int64_t pos[3 * B * T];
    mmc_batch b;
    make_batch(&b, m->cfg.vocab_size, s, k, ids, labels, pos);
    int64_t n;
    mmc_tensor *l = mmc_qwen2_lm_loss(ctx, m, &b, 1.0, &n);
    double v = ((float *)l->data)[0] / (double)n;
    mmc_ctx_free(ctx);
    return v;
}

static mmc_status copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
    if (!f || !g) { if (f) fclose(f); if (g) fclose(g); return mmc_error(MMC_ERR_IO, "copy %s -> %s", from, to); }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, g);
    fclose(f);
    fclose(g);
    return MMC_OK;
}

/* ---- `tp_worker compare A B`: two `mmc train` output directories hold the same run: every
 * loss of metrics.jsonl within 1e-5 relative, and every tensor of the last checkpoint's
 * model.safetensors (LoRA: adapter_model.safetensors) and optimizer.safetensors: weights within 2e-4 absolute (1 % of the
 * lr * steps they may move; isolated entries whose gradient is near zero carry AdamW-amplified
 * rounding noise) and 1e-6 on average, the moments within 1e-2 of each tensor's max (or of 1e-9,
 * 1e-18 for the second moments, when that is smaller: a gradient that is rounding noise). */
static double g_sum_diff, g_n_diff;   /* the weights' mean |diff| */
static double cmp_file(const char *a, const char *b, const char *file, bool moments, int *ntensors) {
    char pa[4096], pb[4096];
    snprintf(pa, sizeof pa, "%s/%s", a, file);
    snprintf(pb, sizeof pb, "%s/%s", b, file);
    mmc_st *sa = NULL, *sb = NULL;
    double worst = 0;
    CHECK_OK(mmc_st_open(pa, &sa));
    CHECK_OK(mmc_st_open(pb, &sb));
    if (!sa || !sb) { mmc_st_close(sa); mmc_st_close(sb); return 1e9; }
    CHECK(mmc_st_count(sa) == mmc_st_count(sb));
    for (int i = 0; i < mmc_st_count(sa); i++) {
        const char *nm = mmc_st_at(sa, i)->name;
        mmc_tensor *ta = mmc_st_tensor(sa, nm), *tb = mmc_st_find(sb, nm) ? mmc_st_tensor(sb, nm) : NULL;
        CHECKF(tb && mmc_same_shape(ta, tb), "%s: tensor %s missing or of another shape in %s", file, nm, b);
        if (tb && mmc_same_shape(ta, tb)) {
            double d = 0, mx = 0;
            for (int64_t e = 0; e < mmc_numel(ta); e++) {
                double de = fabs(mmc_get_flat(ta, e) - mmc_get_flat(tb, e));
                d = fmax(d, de);
                if (!moments) g_sum_diff += de, g_n_diff++;
                mx = fmax(mx, fabs(mmc_get_flat(ta, e)));
            }
            /* (a tensor whose gradient is rounding noise, as a CLIP tower's k_proj bias — softmax ignores
             * it — has moments of noise's scale, 1e-12 / its square: compared against a floor instead) */
            if (moments) d /= fmax(mx, strstr(nm, "exp_avg_sq") ? 1e-18 : 1e-9);
            worst = fmax(worst, d);
            (*ntensors)++;
        }
        mmc_tensor_free(ta);
        mmc_tensor_free(tb);
    }
    mmc_st_close(sa);
    mmc_st_close(sb);
    return worst;
}

static int compare(const char *a, const char *b) {
    double la[64], lb[64];
    int na = read_losses(a, la, 64), nb = read_losses(b, lb, 64);
    CHECKF(na > 0 && na == nb, "losses: %d in %s, %d in %s", na, a, nb, b);
    double lrel = 0;
    for (int i = 0; i < na && i < nb; i++) lrel = fmax(lrel, fabs(la[i] - lb[i]) / fabs(la[i]));
    char ca[2048], cb[2048];
    last_ckpt(a, ca, sizeof ca);
    last_ckpt(b, cb, sizeof cb);
    int nt = 0, no = 0;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/model.safetensors", ca);
    struct stat sb;
    const char *wf = stat(probe, &sb) == 0 ? "model.safetensors" : "adapter_model.safetensors";   /* LoRA: the adapters */
    double wd = cmp_file(ca, cb, wf, false, &nt);
    double od = cmp_file(ca, cb, "optimizer.safetensors", true, &no);
    const double mean = g_sum_diff / (g_n_diff > 0 ? g_n_diff : 1);
    printf("%d steps: loss max rel diff %.2e (tol 1e-5); %d weights max abs diff %.2e (tol 2e-4), mean %.2e (tol 1e-6); "
           "%d optimizer tensors max diff %.2e of scale (tol 1e-2)\n", na, lrel, nt, wd, mean, no, od);
    CHECK(lrel <= 1e-5);
    CHECK(wd <= 2e-4);
    CHECK(mean <= 1e-6);
    /* AdamW's second moments of zero-gradient entries (k_proj's bias) are rounding noise squared */
    CHECK(od <= 1e-2);
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "compare")) return compare(argv[2], argv[3]);
    if (argc < 4) { fprintf(stderr, "usage: tp_worker DIR TP OUT [STEPS] | tp_worker compare RUN_A RUN_B\n"); return 2; }
    const char *dir = argv[1], *out = argv[3];
    const int tpn = atoi(argv[2]), steps = argc > 4 ? atoi(argv[4]) : 5;
    const bool sp = argc > 5 && !strcmp(argv[5], "sp");
    mmc_comm *world;
    mmc_dist_opts dop = {.backend = MMC_DIST_AUTO, .timeout_s = 300};
    if (mmc_dist_init(&dop, &world)) { fprintf(stderr, "dist init: %s\n", mmc_last_error()); return 1; }
    const int R = mmc_comm_rank(world), W = mmc_comm_size(world);
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cj = NULL;
    mmc_qwen2_config cfg;
    if (mmc_json_load(path, &cj) || mmc_qwen2_config_read(cj, &cfg)) {
        fprintf(stderr, "%s: %s\n", path, mmc_last_error());
        return 1;
    }
    if (steps < 1 || steps > MAX_STEPS || tpn < 1 || W % tpn) {
        fprintf(stderr, "tp_worker: bad arguments (steps 1..%d, world %d divisible by tp %d)\n", MAX_STEPS, W, tpn);
        return 2;
    }
    /* the validation messages (before any work): tp 4 splits the 2 KV heads of the tiny model */
    if (R == 0 && cfg.num_kv_heads == 2) {
        mmc_status st = mmc_qwen2_tp_check(&cfg, 4, NULL);
        CHECK(st == MMC_ERR_INVALID && strstr(mmc_last_error(), "num_key_value_heads 2") &&
              strstr(mmc_last_error(), "whole KV heads") && strstr(mmc_last_error(), "use tensor_parallel 1 or 2"));
        printf("tp validation: %s\n", mmc_last_error());
        mmc_qwen2_config c3 = cfg;
        c3.vocab_size = 321;
        CHECK(mmc_qwen2_tp_check(&c3, 2, NULL) == MMC_ERR_INVALID && strstr(mmc_last_error(), "vocab_size 321"));
        CHECK(mmc_qwen2_tp_check(&cfg, 2, NULL) == MMC_OK);
    }
    mmc_dist_layout lay = {.tensor = tpn, .data = W / tpn};
    mmc_dist_groups g;
    if (mmc_dist_layout_groups(world, &lay, &g)) { fprintf(stderr, "layout: %s\n", mmc_last_error()); return 1; }
    const int ndp = W / tpn;

    /* tensor-parallel run: replica g.dp_rank takes micro-batch dp_rank of every step */
    mmc_qwen2 *m = NULL;
    CHECK_OK(mmc_qwen2_load_tp(dir, &cfg, g.tp, true, &m));
    if (!m) mmc_dist_abort(1);
    m->sp = sp;
    int64_t local = 0;
    for (int i = 0; i < m->n_params; i++) local += mmc_numel(m->params[i]);
    double tl[MAX_STEPS], tn[MAX_STEPS];
    int my_micro = g.dp_rank;
    mmc_dist_stats s0, s1;
    mmc_dist_get_stats(&s0);
    train(m, g.tp, g.dp, steps, ndp, &my_micro, 1, tl, tn);
    mmc_dist_get_stats(&s1);
    /* communication volume (bytes handed to collectives: all-reduce and all-gather count this
     * rank's contribution, reduce-scatter its whole input) against the Megatron accounting,
     * with M = one [B, T, C] f32 activation and L layers, per step:
     *   no sp: forward 1 (embedding) + 2L (o, down) all-reduces, backward 2L + 1 (f before
     *          q/k/v, gate/up and lm_head): (4L + 2) M;
     *   sp:    the embedding all-reduce M, 4L + 1 reduce-scatters (o, down forward; the
     *          gathers' backward) M each, 4L + 2 all-gathers M / tp each;
     * plus the vocab-parallel loss (row max f32 + sum-exp and target f64: 20 bytes a row), the
     * gradient norm (the split parameters' sum of squares, 8 bytes) and, with sp, the replicated
     * parameters' partial gradients. Only the tp collectives: checked when dp = 1. */
    if (ndp == 1 && tpn > 1) {
        const int64_t L = cfg.num_layers, M = (int64_t)B * T * cfg.hidden_size * 4, N = (int64_t)B * T;
        const int64_t per = sp ? M + (4 * L + 1) * M + (4 * L + 2) * (M / tpn) : (4 * L + 2) * M;
        int64_t repl = 0;
        for (int i = 0; sp && i < m->n_params; i++) repl += m->param_split[i] < 0 ? mmc_numel(m->params[i]) * 4 : 0;
        const int64_t want = steps * (per + 20 * N + 8 + repl), got = s1.bytes - s0.bytes;
        if (R == 0)
            printf("tp communication: %lld bytes in %lld collectives over %d steps, model %lld bytes (%.1f KiB per "
                   "step)\n", (long long)got, (long long)(s1.ops - s0.ops), steps, (long long)want, got / 1024.0 / steps);
        CHECKF(got == want, "communication %lld bytes, the model says %lld", (long long)got, (long long)want);
    }
    mmc_tensor **full = calloc((size_t)m->n_params, sizeof *full);
    CHECK_OK(mmc_qwen2_gather_weights(m, full));

    /* the gathered checkpoint, written once */
    if (R == 0) {
        mkdir(out, 0755);
        mmc_stw *w = mmc_stw_new();
        for (int i = 0; i < m->n_params; i++) {
            char name[160];
            if (!strcmp(m->param_names[i], "lm_head.weight")) snprintf(name, sizeof name, "lm_head.weight");
            else snprintf(name, sizeof name, "model.%s", m->param_names[i]);
            CHECK_OK(mmc_stw_add(w, name, full[i]));
        }
        CHECK_OK(mmc_stw_set_metadata(w, "format", "pt"));
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        CHECK_OK(mmc_stw_write(w, path));
        mmc_stw_free(w);
        char cfrom[2048], cto[2048];
        snprintf(cfrom, sizeof cfrom, "%s/config.json", dir);
        snprintf(cto, sizeof cto, "%s/config.json", out);
        CHECK_OK(copy_file(cfrom, cto));
    }
    CHECK_OK(mmc_barrier(world));
    /* reload at tp: the same loss as the trained shards (resume of the weights) */
    mmc_qwen2 *m2 = NULL;
    CHECK_OK(mmc_qwen2_load_tp(out, &cfg, g.tp, true, &m2));
    double la = loss_of(m, 99, 0), lb = m2 ? loss_of(m2, 99, 0) : NAN;
    /* logits at tp, gathered, for comparison with the tp=1 load on rank 0 */
    float *tp_logits = NULL;
    {
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        int32_t ids[B * T], labels[B * T];
        int64_t pos[3 * B * T];
        mmc_batch b;
        make_batch(&b, cfg.vocab_size, 98, 0, ids, labels, pos);
        mmc_tensor *it = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));
        memcpy(it->data, ids, sizeof ids);
        mmc_tensor *pt = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
        for (int t = 0; t < T; t++) ((int64_t *)pt->data)[t] = t;
        mmc_tensor *cs, *sn;
        mmc_qwen2_rope_table(ctx, &cfg, pt, &cs, &sn);
        mmc_attn_opts at = {.causal = true};
        mmc_tensor *lg = mmc_qwen2_logits(ctx, m, mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, it), cs, sn, &at, NULL));
        tp_logits = malloc(mmc_nbytes(lg));
        memcpy(tp_logits, lg->data, mmc_nbytes(lg));
        mmc_ctx_free(ctx);
    }

    if (R == 0) {
        /* the single-process reference: the full model, all ndp micro-batches accumulated */
        mmc_qwen2 *ref = NULL;
        CHECK_OK(mmc_qwen2_load(dir, cj, true, &ref));
        int micro[64];
        for (int k = 0; k < ndp; k++) micro[k] = k;
        double rl[MAX_STEPS], rn[MAX_STEPS];
        train(ref, NULL, NULL, steps, ndp, micro, ndp, rl, rn);
        double max_lrel = 0, max_nrel = 0;
        for (int s = 0; s < steps; s++) {
            double e = fabs(tl[s] - rl[s]) / fabs(rl[s]), en = fabs(tn[s] - rn[s]) / fabs(rn[s]);
            max_lrel = e > max_lrel ? e : max_lrel;
            max_nrel = en > max_nrel ? en : max_nrel;
            printf("step %d: loss tp %.9f single %.9f (rel %.2e); grad norm tp %.7f single %.7f\n", s + 1, tl[s], rl[s],
                   e, tn[s], rn[s]);
        }
        CHECK(ref->n_params == m->n_params);
        double max_wrel = 0, max_moved = 0;
        for (int i = 0; i < m->n_params && i < ref->n_params; i++) {
            CHECK(!strcmp(ref->param_names[i], m->param_names[i]) && mmc_numel(ref->params[i]) == mmc_numel(full[i]));
            const float *a = ref->params[i]->data, *b = full[i]->data;
            double mx = 0, d = 0;
            for (int64_t e = 0; e < mmc_numel(full[i]); e++) {
                mx = fmax(mx, fabs(a[e]));
                d = fmax(d, fabs(a[e] - b[e]));
            }
            max_wrel = fmax(max_wrel, d);
            if (getenv("TP_DEBUG")) printf("  %s: max|diff| %.3e scale %.3e\n", m->param_names[i], d, mx);
        }
        /* the weights did move: compare with the untrained checkpoint */
        mmc_qwen2 *init = NULL;
        CHECK_OK(mmc_qwen2_load(dir, cj, true, &init));
        for (int i = 0; init && i < init->n_params; i++) {
            const float *a = init->params[i]->data, *b = full[i]->data;
            for (int64_t e = 0; e < mmc_numel(full[i]); e++) max_moved = fmax(max_moved, fabs(a[e] - b[e]));
        }
        mmc_qwen2_free(init);
        /* the checkpoint at tp=1: logits equal the tp model's gathered logits */
        mmc_qwen2 *m1 = NULL;
        CHECK_OK(mmc_qwen2_load(out, cj, true, &m1));
        double max_ldiff = 0;
        if (m1) {
            mmc_ctx *ctx = mmc_ctx_new();
            mmc_set_grad_enabled(ctx, false);
            int32_t ids[B * T], labels[B * T];
            int64_t pos[3 * B * T];
            mmc_batch b;
            make_batch(&b, cfg.vocab_size, 98, 0, ids, labels, pos);
            mmc_tensor *it = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));
            memcpy(it->data, ids, sizeof ids);
            mmc_tensor *pt = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
            for (int t = 0; t < T; t++) ((int64_t *)pt->data)[t] = t;
            mmc_tensor *cs, *sn;
            mmc_qwen2_rope_table(ctx, &cfg, pt, &cs, &sn);
            mmc_attn_opts at = {.causal = true};
            mmc_tensor *lg = mmc_qwen2_logits(ctx, m1, mmc_qwen2_forward(ctx, m1, mmc_qwen2_embed(ctx, m1, it), cs, sn, &at, NULL));
            for (int64_t e = 0; e < mmc_numel(lg); e++) max_ldiff = fmax(max_ldiff, fabs(((float *)lg->data)[e] - tp_logits[e]));
            mmc_ctx_free(ctx);
            mmc_qwen2_free(m1);
        }
        printf("tp parity: tp=%d%s dp=%d, %d steps: max loss rel diff %.2e (tol 1e-5), max grad-norm rel diff %.2e, "
               "max |weight diff| %.2e (tol 2e-4; weights moved up to %.2e); local params %lld of %lld\n",
               tpn, sp ? " (sequence-parallel)" : "", ndp, steps, max_lrel, max_nrel, max_wrel, max_moved, (long long)local,
               (long long)mmc_qwen2_param_count(ref));
        printf("tp checkpoint: gathered safetensors loads at tp=1: max logit diff %.2e (tol 1e-4); reloaded at tp=%d: "
               "loss %.9f vs %.9f\n", max_ldiff, tpn, lb, la);
        CHECK(max_lrel <= 1e-5);
        CHECK(max_nrel <= 1e-4);
        CHECK(max_wrel <= 2e-4);
        CHECK(max_moved > 1e-3);
        CHECK(max_ldiff <= 1e-4);
        CHECK(local * tpn < mmc_qwen2_param_count(ref) * 2);   /* sharded, not a full copy */
        mmc_qwen2_free(ref);
    }
    CHECK(fabs(la - lb) <= 1e-6 * fabs(la));
    for (int i = 0; i < m->n_params; i++) mmc_tensor_free(full[i]);
    free(full);
    free(tp_logits);
    mmc_qwen2_free(m2);
    mmc_qwen2_free(m);
    mmc_json_free(cj);
    int bad = g_fail;
    mmc_all_reduce(world, &bad, &bad, 1, MMC_I32, MMC_MAX);
    if (!g_fail) printf("rank %d: all %d tp checks passed\n", R, g_checks);
    mmc_dist_groups_free(&g);
    mmc_dist_finalize();
    return bad ? 1 : 0;
}
