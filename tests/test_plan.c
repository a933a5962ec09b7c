/* test_plan.c — the arithmetic of the planner's cost model (mmc_plan.h) on cases worked by hand:
 * alpha-beta times of each collective, parameter and FLOP counts of the tiny Qwen2 (checked
 * against the parameters mmc_qwen2_new allocates), pipeline bubbles (1F1B and interleaved),
 * ZeRO's memory shares, recompute (full, partial, attention-only), tensor-parallel traffic, the layout rules (the model's own
 * divisibility checks), the calibration cache (round trip, malformed lines) and the device /
 * interconnect tables. Tolerances: exact arithmetic cases 1e-12 relative; nothing here times
 * anything except one small cached measurement. */
#include "mmc_config.h"
#include "mmc_models.h"
#include "mmc_plan.h"
#include "test_util.h"

#include <unistd.h>

#define REL(a, b) (fabs((a) - (b)) <= 1e-12 * fabs(b) + 1e-300)

static mmc_plan_model tiny(void) {
    mmc_json *j = NULL;
    mmc_plan_model m;
    memset(&m, 0, sizeof m);
    CHECK_OK(mmc_json_load("tests/fixtures/qwen2/tiny/config.json", &j));
    if (j) CHECK_OK(mmc_plan_model_read(j, "tiny", &m));
    mmc_json_free(j);
    return m;
}

/* a device and a network whose numbers make the arithmetic easy */
static mmc_plan_device dev1(void) {
    mmc_plan_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "unit");
    d.gemm_flops = 1e12, d.attn_flops = 1e12, d.mem_bw = 1e12, d.overlap = 0;
    return d;
}
static mmc_plan_net net0(double a, double b) {
    mmc_plan_net n;
    memset(&n, 0, sizeof n);
    n.alpha_intra = n.alpha_inter = a, n.beta_intra = n.beta_inter = b;
    n.ranks_per_node = 8;
    return n;
}

int main(void) {
    /* ---- collectives: ring all-reduce 2(p-1)a + 2(p-1)/p n b, the others (p-1)a + (p-1)/p n b */
    CHECK(REL(mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 4, 1e6, 1e-5, 1e-9), 6e-5 + 1.5e-3));
    CHECK(REL(mmc_plan_coll_time(MMC_COLL_ALL_GATHER, 8, 8e6, 2e-6, 1e-9), 7 * 2e-6 + 7e-3));
    CHECK(REL(mmc_plan_coll_time(MMC_COLL_REDUCE_SCATTER, 2, 1e3, 1e-6, 1e-9), 1e-6 + 5e-7));
    CHECK(REL(mmc_plan_coll_time(MMC_COLL_ALL_TO_ALL, 4, 4e3, 0, 1e-9), 3e-6));
    CHECK(REL(mmc_plan_coll_time(MMC_COLL_P2P, 2, 1e6, 1e-5, 1e-9), 1e-5 + 1e-3));
    CHECK(mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 1, 1e9, 1, 1) == 0);

    /* ---- the tiny Qwen2: C 64, F 160, Hq 4, Hkv 2, D 16, L 2, V 320, untied */
    mmc_plan_model m = tiny();
    /* q 64x64 + k, v 64x32 + o 64x64 + gate, up, down 3 x 64x160 + norms 2 x 64 + qkv biases 128 */
    CHECK(mmc_plan_layer_params(&m) == 4096 + 2 * 2048 + 4096 + 3 * 10240 + 128 + 128);
    CHECK(mmc_plan_total_params(&m) == 2 * 43264 + 2 * 320 * 64 + 64);
    {   /* against what the model itself allocates */
        mmc_qwen2 *q = NULL;
        CHECK_OK(mmc_qwen2_new(&m.lm, 1, &q));
        int64_t n = 0;
        for (int i = 0; q && i < q->n_params; i++) n += mmc_numel(q->params[i]);
        CHECKF(n == mmc_plan_total_params(&m), "model %lld, plan %lld", (long long)n, (long long)mmc_plan_total_params(&m));
        mmc_qwen2_free(q);
    }
    /* 16 tokens in one sequence of 16: GEMMs 2 x 16 x 43008, causal attention 2 x 16 x 16 x 4 x 16 */
    CHECK(REL(mmc_plan_layer_flops(&m, 16, 16), 2.0 * 16 * 43008 + 2.0 * 16 * 16 * 4 * 16));

    mmc_plan_device d = dev1();
    mmc_plan_net n0 = net0(0, 0);
    mmc_plan_workload w = {.batch = 8, .micro_batch = 1, .seq = 16, .weight_bytes = 4, .act_bytes = 4};
    mmc_plan_layout base = {.dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1};
    mmc_plan_estimate e1, e2;

    /* ---- pipeline: 4 layers, P = 4, M = 8: step = (M + P - 1) x stage time, bubble 3/11 */
    mmc_plan_model m4 = m;
    m4.layers = m4.lm.num_layers = 4;
    mmc_plan_layout l = base;
    l.pp = 4;
    CHECK_OK(mmc_plan_estimate_layout(&m4, &w, &d, &n0, &l, &e1));
    CHECK(REL(e1.bubble, 3.0 / 11.0));
    CHECK_NEAR((e1.step_s - e1.optim_s) / e1.compute_s, 11.0 / 8.0, 1e-12);
    l.vpp = 2;   /* interleaved, 2 chunks: (P - 1) / (v M + P - 1) = 3 / 19 */
    l.pp = 2;
    CHECK_OK(mmc_plan_estimate_layout(&m4, &w, &d, &n0, &l, &e2));
    CHECK(REL(e2.bubble, 1.0 / 17.0));
    CHECK_NEAR((e2.step_s - e2.optim_s) / e2.compute_s, (8.0 + 0.5) / 8.0, 1e-12);
    /* P = 4 ranks on a host of 2 cores: the 11 slots have 1, 2, 3, 4 x 5, 3, 2, 1 stages at work,
     * each slowed by max(1, k / 2): 1 + 1 + 1.5 + 5 x 2 + 1.5 + 1 + 1 = 17 stage times (the busy
     * stages share the cores; in the ramps the idle ones leave theirs), against 2 x 11 were every
     * rank slowed throughout and 16 were the work spread perfectly */
    {
        mmc_plan_device d2 = dev1();
        d2.cores = 2;
        l = base;
        l.pp = 4;
        CHECK_OK(mmc_plan_estimate_layout(&m4, &w, &d, &n0, &l, &e1));
        CHECK_OK(mmc_plan_estimate_layout(&m4, &w, &d2, &n0, &l, &e2));
        CHECK_NEAR((e2.step_s - e2.optim_s) / ((e1.step_s - e1.optim_s) / 11.0), 17.0, 1e-9);
        l.pp = 1, l.dp = 4;   /* no pipeline: every rank busy throughout, 2x */
        CHECK_OK(mmc_plan_estimate_layout(&m4, &w, &d, &n0, &l, &e1));
        CHECK_OK(mmc_plan_estimate_layout(&m4, &w, &d2, &n0, &l, &e2));
        CHECK_NEAR((e2.step_s - e2.optim_s) / (e1.step_s - e1.optim_s), 2.0, 1e-9);
    }

    /* ---- ZeRO over dp 4, bf16 weights (ZeRO-3 gathers bf16 only): optimizer 8P + the fp32 master
     * 4P -> 12P/4 (stage 1), gradients 8P (DDP's bucket copy) -> 4P/4 (stage 2), parameters 2P ->
     * 2P/4 + two gathered layers (stage 3) */
    const double P = (double)mmc_plan_total_params(&m), L1 = (double)mmc_plan_layer_params(&m);
    mmc_plan_estimate z[4];
    w.weight_bytes = 2;
    for (int s = 0; s < 4; s++) {
        l = base;
        l.dp = 4, l.zero = s;
        CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &n0, &l, &z[s]));
    }
    CHECK(REL(z[0].mem_optim, 12 * P) && REL(z[1].mem_optim, 3 * P));
    CHECK(REL(z[0].mem_grads, 8 * P) && REL(z[1].mem_grads, 8 * P) && REL(z[2].mem_grads, P));
    CHECK(REL(z[2].mem_params, 2 * P) && REL(z[3].mem_params, P / 2 + 4 * L1));
    w.weight_bytes = 4;
    l.zero = 3;   /* f32 weights: ZeRO-3 refused, as mmc_dp_new does */
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, NULL, 0));
    /* data-parallel traffic: one all-reduce of the f32 gradients per step */
    mmc_plan_net nab = net0(1e-5, 1e-9);
    l = base;
    l.dp = 4;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nab, &l, &e1));
    CHECK(REL(e1.dp_comm_s, mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 4, 4 * P, 1e-5, 1e-9)));
    CHECK(REL(e1.comm_s, e1.dp_comm_s));   /* overlap 0: all exposed */

    /* ---- tensor parallelism 2: 4 all-reduces of [16, 64] f32 per layer + 2 per micro-batch (the
     * embedding, lm_head's input gradient) + the vocab-parallel cross-entropy's max (16 floats) and
     * sums (16 x 2 doubles), 8 micro-batches; + the gradient norm's sum (8 bytes) once per step */
    l = base;
    l.tp = 2;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nab, &l, &e1));
    {
        const double ar = mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 64 * 4, 1e-5, 1e-9);
        const double ce = mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 4, 1e-5, 1e-9) +
                          mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 16, 1e-5, 1e-9);
        CHECK(REL(e1.tp_comm_s, 8.0 * ((2 * 4 + 2) * ar + ce) + mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 8, 1e-5, 1e-9)));
    }
    /* sequence parallelism: per layer and direction 2 all-gathers + 2 reduce-scatters of [16, 64] */
    l.sp = true;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nab, &l, &e2));
    {
        const double ag = mmc_plan_coll_time(MMC_COLL_ALL_GATHER, 2, 16 * 64 * 4, 1e-5, 1e-9);
        const double ce = mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 4, 1e-5, 1e-9) +
                          mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 16, 1e-5, 1e-9);
        const double ar = mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 64 * 4, 1e-5, 1e-9);
        /* (reduce-scatter = all-gather here); the embedding all-reduce, lm_head's gather and its
         * reduce-scatter, the split's gather; per step the norm and the 2L + 1 norm weights (64 floats) */
        CHECK(REL(e2.tp_comm_s, 8.0 * (2 * 8 * ag + ar + 3 * ag + ce) + mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 8, 1e-5, 1e-9) +
                                    5 * mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 64 * 4, 1e-5, 1e-9)));
    }
    /* dp 8 over tp 2: the dp group (stride 2) spans two nodes of 8 and takes the inter-node beta
     * (10x here), the tp group stays inside a node */
    mmc_plan_net split = net0(1e-5, 1e-9);
    split.beta_inter = 1e-8;
    l = base;
    l.dp = 8, l.tp = 2;
    w.batch = 16;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nab, &l, &e1));
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &split, &l, &e2));
    CHECK_NEAR((e2.dp_comm_s - 14e-5) / (e1.dp_comm_s - 14e-5), 10.0, 1e-9);
    CHECK(REL(e2.tp_comm_s, e1.tp_comm_s));
    w.batch = 8;

    /* ---- recompute adds one forward per layer and keeps only the layer inputs */
    l = base;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &n0, &l, &e1));
    l.recompute = true;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &n0, &l, &e2));
    CHECK(e2.recompute_s > 0 && REL(e2.compute_s - e1.compute_s, e2.recompute_s));
    CHECK(e2.mem_act < e1.mem_act);
    /* full recompute of the first layer of 2: half the recompute time; the first layer keeps its
     * input (kept: 16 tokens x 64 floats), the second everything (A), and the second's are freed
     * before the first is rebuilt: kept + A, against 2 kept + A for both (the last one rebuilt on
     * top of the kept inputs) and 2 A for none */
    mmc_plan_estimate e3;
    l.recompute_layers = 1;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &n0, &l, &e3));
    CHECK(REL(e3.recompute_s, e2.recompute_s / 2));
    CHECK(REL(e2.mem_act - e3.mem_act, 16.0 * 64 * 4) && e3.mem_act < e1.mem_act);
    /* attention recompute: RoPE + the attention forward again (compute_s grows by recompute_s,
     * less than a full forward); the rotated q and k ((4 + 2) x 16 floats a token) are not kept but
     * for the layer being rebuilt: one layer's (16 tokens x 96 x 4 bytes) less of 2 */
    l.recompute = MMC_RECOMPUTE_ATTENTION, l.recompute_layers = 0;
    CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &n0, &l, &e3));
    CHECK(e3.recompute_s > 0 && e3.recompute_s < e2.recompute_s && REL(e3.compute_s - e1.compute_s, e3.recompute_s));
    CHECK(REL(e1.mem_act - e3.mem_act, 16.0 * 96 * 4));
    /* under tensor parallelism 2 full recompute repeats the layer's two forward all-reduces */
    {
        const double ar = mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, 16 * 64 * 4, 1e-5, 1e-9);
        mmc_plan_net nr = net0(1e-5, 1e-9);
        l = base;
        l.tp = 2;
        CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nr, &l, &e1));
        l.recompute = MMC_RECOMPUTE_FULL;
        CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nr, &l, &e2));
        CHECK(REL(e2.tp_comm_s - e1.tp_comm_s, 8.0 * 2 * 2 * ar));
        l.recompute = MMC_RECOMPUTE_ATTENTION;   /* attention recompute: no tp collective again */
        CHECK_OK(mmc_plan_estimate_layout(&m, &w, &d, &nr, &l, &e3));
        CHECK(REL(e3.tp_comm_s, e1.tp_comm_s));
    }

    /* ---- layout rules: the model's own checks name what does not divide */
    char why[600];
    l = base;
    l.tp = 3;
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why) && strstr(why, "num_key_value_heads"));
    l = base;
    l.pp = 3;
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why) && strstr(why, "pipeline_parallel 3"));
    l = base;
    l.cp = 3;
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why) && strstr(why, "num_attention_heads"));
    l.cp_ring = 1;   /* ring: no head rule, but 16 tokens do not split in 3 */
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why) && strstr(why, "seq_len"));
    l = base;
    l.dp = 3;
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why) && strstr(why, "batch_size"));
    l = base;
    l.ep = 2;
    CHECK(!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why) && strstr(why, "expert"));
    CHECK_ERR(mmc_plan_estimate_layout(&m, &w, &d, &n0, &l, &e1), MMC_ERR_INVALID);
    l = base;
    l.tp = 2, l.sp = true, l.pp = 2, l.dp = 2;
    CHECK(mmc_plan_layout_ok(&m, &w, &l, why, sizeof why));

    /* ---- tables */
    mmc_plan_device h;
    CHECK(mmc_plan_device_named("h200", &h) && h.mem_bytes > 140 * 1073741824.0 && h.gemm_flops > 5e14);
    CHECK(!mmc_plan_device_named("tpu", &h));
    mmc_plan_net nv;
    CHECK(mmc_plan_net_named("nvlink", &nv) && nv.beta_intra < nv.beta_inter && nv.ranks_per_node == 8);
    CHECK(!mmc_plan_net_named("ethernet", &nv));

    /* ---- the calibration cache: a measured entry is reused, a malformed line is an error
     * naming file:line */
    char path[] = "/tmp/mmc_test_plan_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        close(fd);
        mmc_plan_calib *c = NULL;
        FILE *f = fopen(path, "w");
        fprintf(f, "# test\nlinear 1000 2000 3000 0.25\nattn 1 16 4 2 16 0.5\nmem_bw 1e10\nnet 1e-6 1e-9 2e-6 2e-9\n");
        fclose(f);
        CHECK_OK(mmc_plan_calib_open(path, &c));
        if (c) {
            CHECK(mmc_plan_calib_linear(c, 1000, 2000, 3000) == 0.25);   /* not measured: 12 GFLOP would take seconds */
            CHECK(mmc_plan_calib_attn(c, 1, 16, 4, 2, 16) == 0.5);
            double s = mmc_plan_calib_linear(c, 8, 8, 8);               /* measured now, cached */
            CHECK(s > 0 && mmc_plan_calib_linear(c, 8, 8, 8) == s);
            mmc_plan_net cn;
            CHECK(mmc_plan_calib_net(c, &cn) && cn.alpha_p2p == 2e-6 && cn.beta_intra == 1e-9);
            CHECK_OK(mmc_plan_calib_save(c));
            mmc_plan_calib_free(c);
            c = NULL;
            CHECK_OK(mmc_plan_calib_open(path, &c));
            if (c) CHECK(mmc_plan_calib_linear(c, 8, 8, 8) == s || fabs(mmc_plan_calib_linear(c, 8, 8, 8) / s - 1) < 1e-5);
            mmc_plan_calib_free(c);
        }
        /* measured collectives: alpha the median of the small sizes (one outlier ignored), beta
         * the median slope of the large ones; the job size nearest the one asked; a stack entry */
        f = fopen(path, "w");
        fprintf(f, "coll allreduce 2 2 64 1e-4\ncoll allreduce 2 2 1024 9e-4\ncoll allreduce 2 2 16384 1e-4\n"
                   "coll allreduce 2 2 524288 2e-4\ncoll allreduce 2 2 2097152 5e-4\ncoll allreduce 2 2 16777216 9e-3\n"
                   "coll allreduce 2 4 64 3e-4\ncoll p2p 2 2 1024 5e-5\n"
                   "stack 1 16 64 4 2 16 160 2 1 0.001\n");
        fclose(f);
        CHECK_OK(mmc_plan_calib_open(path, &c));
        if (c) {
            /* slopes (2e-4 - 1e-4) / 524288 and (5e-4 - 1e-4) / 2097152 = 1.907e-10 and (9e-3 - 1e-4) /
             * 16777216 = 5.3e-10: the median 1.907e-10 */
            const double b = (5e-4 - 1e-4) / 2097152.0;
            CHECK_NEAR(mmc_plan_calib_coll(c, MMC_COLL_ALL_REDUCE, 2, 2, 131072), 1e-4 + b * 131072, 1e-15);
            CHECK_NEAR(mmc_plan_calib_coll(c, MMC_COLL_ALL_REDUCE, 2, 3, 64), 1e-4 + b * 64, 1e-15);   /* n 2 <= 3 */
            CHECK_NEAR(mmc_plan_calib_coll(c, MMC_COLL_ALL_REDUCE, 2, 8, 64), 3e-4, 1e-15);           /* n 4: one size */
            CHECK_NEAR(mmc_plan_calib_coll(c, MMC_COLL_P2P, 2, 2, 1e6), 5e-5, 1e-15);
            CHECK(mmc_plan_calib_coll(c, MMC_COLL_ALL_TO_ALL, 2, 2, 64) < 0);
            CHECK(mmc_plan_calib_stack(c, 1, 16, 64, 4, 2, 16, 160, 2, 1) == 0.001);
            /* the estimate takes them: tp 2 all-reduces from the table, not the alpha-beta model */
            mmc_plan_device dc = dev1();
            dc.calib = c;
            l = base;
            l.tp = 2;
            if (mmc_plan_estimate_layout(&m, &w, &dc, &nab, &l, &e1) == MMC_OK) {
                const double ar = 1e-4 + b * 16 * 64 * 4;
                CHECK_NEAR(e1.tp_comm_s, 8.0 * ((2 * 4 + 2) * ar + 2 * (1e-4 + b * 16 * 4) + (b * 16 * 12)) + 1e-4 + b * 8, 1e-12);
            } else CHECK(0);
            mmc_plan_calib_free(c);
            c = NULL;
        }
        f = fopen(path, "w");
        fprintf(f, "coll allsum 2 2 64 1e-4\n");
        fclose(f);
        CHECK_ERR(mmc_plan_calib_open(path, &c), MMC_ERR_FORMAT);
        f = fopen(path, "w");
        fprintf(f, "linear 1 2 3 0.5\nlinear 10 20\n");
        fclose(f);
        c = NULL;
        CHECK_ERR(mmc_plan_calib_open(path, &c), MMC_ERR_FORMAT);
        CHECK(strstr(mmc_last_error(), ":2:") && strstr(mmc_last_error(), "delete the file"));
        f = fopen(path, "w");
        fprintf(f, "net 1e-6 -1 0 0\n");
        fclose(f);
        CHECK_ERR(mmc_plan_calib_open(path, &c), MMC_ERR_FORMAT);
        unlink(path);
    }
    /* ---- per-modality plan (mmc_hetero.h) on the tiny Qwen2-VL (tower Cv 32, 2 heads, depth 2, merge 2,
     * out 64): at tp 2 the tower is split (tv 2) unless it is data-parallel (whole, 1/2 of the images
     * per rank). Parameters: the hetero rank holds the tower whole, the split one half of it (its
     * split matrices; counted as half by the model). tp traffic: the split tower's 4 all-reduces of
     * [Np, Cv] per block and micro-batch against one all-gather of the merged features [Np/4, 64] per
     * micro-batch plus one all-reduce of the tower's gradients per step. */
    {
        mmc_json *vj = NULL;
        mmc_plan_model vm;
        memset(&vm, 0, sizeof vm);
        CHECK_OK(mmc_json_load("tests/fixtures/train/vl_tiny.json", &vj));
        if (vj) CHECK_OK(mmc_plan_model_read(vj, "vl_tiny", &vm));
        mmc_json_free(vj);
        mmc_plan_workload vw = {.batch = 8, .micro_batch = 1, .seq = 32, .vision_patches = 64, .weight_bytes = 4,
                                .act_bytes = 4};
        const mmc_plan_net nb = net0(0, 1e-9);
        mmc_plan_layout sl = base, hl = base;
        sl.tp = hl.tp = 2;
        hl.hetero = true;
        mmc_plan_estimate es, eh;
        CHECK_OK(mmc_plan_estimate_layout(&vm, &vw, &d, &nb, &sl, &es));
        CHECK_OK(mmc_plan_estimate_layout(&vm, &vw, &d, &nb, &hl, &eh));
        const double VP = (double)mmc_plan_vision_params(&vm), Mb = 8, Np = 64;
        CHECK(REL(eh.mem_params - es.mem_params, VP / 2 * 4));
        const double want = Mb * (mmc_plan_coll_time(MMC_COLL_ALL_GATHER, 2, Np / 4 * 64 * 4, 0, 1e-9) -
                                  2.0 * 4.0 * mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, Np * 32 * 4, 0, 1e-9)) +
                            mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, VP * 4, 0, 1e-9);
        CHECK_NEAR(eh.tp_comm_s - es.tp_comm_s, want, 1e-12 * fabs(want) + 1e-15);
        hl.zero = 1, hl.dp = 2;   /* ZeRO-1/2 over the LM's replicas: the trainer runs them */
        CHECK(mmc_plan_layout_ok(&vm, &vw, &hl, NULL, 0));
        hl.pp = 2;   /* with the language model pipelined too (trainer_pp_hetero.c) */
        CHECK(mmc_plan_layout_ok(&vm, &vw, &hl, NULL, 0));
        hl.cp = 2;   /* what the trainer refuses, the planner does not offer */
        CHECK(!mmc_plan_layout_ok(&vm, &vw, &hl, NULL, 0));
        hl.cp = 1, hl.pp = 1;
        {   /* vision dp2 | LM pp2: the step's features (8 micro-batches) to the first stage and their gradient
             * back, the tower's gradients all-reduced over the replica; the tower off the first stage's
             * micro-batches but its parameters on the last stage too */
            mmc_plan_layout pl = base, ph = base;
            pl.pp = ph.pp = 2;
            ph.hetero = true;
            CHECK(mmc_plan_layout_ok(&vm, &vw, &ph, NULL, 0));
            mmc_plan_estimate ep, eq;
            CHECK_OK(mmc_plan_estimate_layout(&vm, &vw, &d, &nb, &pl, &ep));
            CHECK_OK(mmc_plan_estimate_layout(&vm, &vw, &d, &nb, &ph, &eq));
            CHECK_NEAR(eq.pp_comm_s - ep.pp_comm_s, 2.0 * mmc_plan_coll_time(MMC_COLL_ALL_GATHER, 2, Mb * Np / 4 * 64 * 4, 0, 1e-9),
                       1e-15);
            CHECK_NEAR(eq.dp_comm_s - ep.dp_comm_s, mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, VP * 4, 0, 1e-9), 1e-15);
            CHECK(eq.step_s > 0 && eq.mem_total > 0);
        }
        hl.zero = 0, hl.dp = 1, hl.tp = 1;
        CHECK(!mmc_plan_layout_ok(&vm, &vw, &hl, NULL, 0));
        hl.tp = 2;
        CHECK(!mmc_plan_layout_ok(&m, &w, &hl, NULL, 0));   /* a text model */
        CHECK(mmc_plan_layout_ok(&vm, &vw, &hl, NULL, 0));
    }
    /* ---- Qwen2.5-Omni thinker (the fixture's config, 2 KV heads and 1398 words so tp 2 divides them): the audio encoder's
     * parameters are the fixture checkpoint's audio_tower.* tensors less the unused audio_bos_eos_token
     * (33072 - 32); its per-modality plan at tp 2 keeps the encoder whole (the same parameters) and adds
     * one all-gather of the clips' features [frames / 4, out] per micro-batch and one all-reduce of the
     * encoder's gradients per step, for half its compute */
    {
        char *txt = NULL;
        size_t len = 0;
        FILE *cf = fopen("tests/fixtures/omni/thinker/config.json", "rb");
        CHECK(cf != NULL);
        if (cf) {
            fseek(cf, 0, SEEK_END);
            len = (size_t)ftell(cf);
            rewind(cf);
            txt = calloc(len + 1, 1);
            CHECK(txt && fread(txt, 1, len, cf) == len);
            fclose(cf);
        }
        char *kv = txt ? strstr(txt, "\"num_key_value_heads\": 1") : NULL, *vs = txt ? strstr(txt, "\"vocab_size\": 1399") : NULL;
        CHECK(kv != NULL && vs != NULL);
        if (kv) kv[strlen("\"num_key_value_heads\": ")] = '2';
        if (vs) vs[strlen("\"vocab_size\": 139")] = '8';   /* 1398: even, for tp 2 */
        mmc_json *oj = NULL;
        mmc_plan_model om;
        memset(&om, 0, sizeof om);
        if (txt) CHECK_OK(mmc_json_parse(txt, len, "omni", &oj));
        if (oj) CHECK_OK(mmc_plan_model_read(oj, "omni", &om));
        mmc_json_free(oj);
        free(txt);
        CHECK(om.audio && om.vision && mmc_plan_audio_params(&om) == 33072 - 32);
        mmc_plan_workload ow = {.batch = 8, .micro_batch = 1, .seq = 64, .audio_frames = 200, .weight_bytes = 4,
                                .act_bytes = 4};
        const mmc_plan_net nb = net0(0, 1e-9);
        mmc_plan_layout sl = base, hl = base;
        sl.tp = hl.tp = 2;
        hl.hetero = hl.hetero_audio = true;
        CHECK(mmc_plan_layout_ok(&om, &ow, &hl, NULL, 0));   /* (no images: the audio makes it worth it) */
        hl.hetero = false;   /* the audio encoder's share alone (the tower's terms are test_plan's case above) */
        mmc_plan_estimate es, eh;
        CHECK_OK(mmc_plan_estimate_layout(&om, &ow, &d, &nb, &sl, &es));
        CHECK_OK(mmc_plan_estimate_layout(&om, &ow, &d, &nb, &hl, &eh));
        const double AP = (double)mmc_plan_audio_params(&om);
        CHECK(REL(eh.mem_params, es.mem_params));
        const double want = 8.0 * mmc_plan_coll_time(MMC_COLL_ALL_GATHER, 2, 200.0 / 4 * 16 * 4, 0, 1e-9) +
                            mmc_plan_coll_time(MMC_COLL_ALL_REDUCE, 2, AP * 4, 0, 1e-9);
        CHECK_NEAR(eh.tp_comm_s - es.tp_comm_s, want, 1e-12 * fabs(want) + 1e-15);
        CHECK(eh.compute_s < es.compute_s);
        mmc_plan_layout bad = sl;
        bad.pp = 2, bad.tp = 1;
        CHECK(!mmc_plan_layout_ok(&om, &ow, &bad, NULL, 0));   /* the thinker: tp x dp only */
    }
    /* ---- the pipeline split (mmc_plan_pp_split, what `mmc train` runs with pipeline_layers auto): equal
     * layers; a Qwen2-MoE model's sparse layers (decoder_sparse_step 2, layer 3 in mlp_only_layers) dearer
     * than its dense ones by the experts' GEMMs; a large vocabulary on the last stage */
    {
        double cost[8], first = -1, last = -1, vis = -1;
        int64_t bd[9];
        double sc[8];
        bool even = false;
        l = base;
        l.pp = 2;
        CHECK_OK(mmc_plan_layer_costs(&m4, &w, &d, &l, cost, &first, &last, &vis));
        CHECK(cost[0] > 0 && cost[0] == cost[3] && first == 0 && vis == 0 && last > 0);
        CHECK_OK(mmc_plan_pp_split(&m4, &w, &d, &l, bd, sc, &even));
        CHECK(bd[0] == 0 && bd[1] == 2 && bd[2] == 4 && even && REL(sc[1], 2 * cost[0] + last));
        mmc_plan_model mv = m4;   /* lm_head over 64 x the vocabulary: 3 | 1 */
        mv.vocab *= 64;
        CHECK_OK(mmc_plan_pp_split(&mv, &w, &d, &l, bd, sc, &even));
        CHECK(bd[1] == 3 && !even);
        l.pp = 3;   /* 3 stages of 4 layers: accepted (no even split needed), the head's stage holds one */
        CHECK(mmc_plan_layout_ok(&mv, &w, &l, NULL, 0));
        CHECK_OK(mmc_plan_pp_split(&mv, &w, &d, &l, bd, sc, &even));
        CHECK(bd[3] - bd[2] == 1 && bd[1] >= 1 && bd[2] > bd[1]);
        CHECK_OK(mmc_plan_estimate_layout(&mv, &w, &d, &n0, &l, &e1));
        l.pp = 5;
        CHECK(!mmc_plan_layout_ok(&mv, &w, &l, why, sizeof why) && strstr(why, "a stage would be empty"));
        const char *mj = "{\"model_type\": \"qwen2_moe\", \"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": "
                         "160, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                         "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 96, "
                         "\"shared_expert_intermediate_size\": 128, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3]}";
        mmc_json *jm = NULL;
        mmc_plan_model mm;
        CHECK_OK(mmc_json_parse(mj, strlen(mj), "moe.json", &jm));
        CHECK(jm && !mmc_plan_model_read(jm, "moe.json", &mm));
        mmc_json_free(jm);
        CHECK(mm.moe_experts == 8 && mm.moe_top_k == 2 && mm.moe_inter == 96 && mm.moe_shared == 128 &&
              mm.moe_sparse[0] == 2u);
        l = base;
        l.pp = 2;
        CHECK_OK(mmc_plan_layer_costs(&mm, &w, &d, &l, cost, NULL, NULL, NULL));
        /* sparse - dense: 3 x 2 x 16 tokens x (3 x 64 x (2 x 96 + 128 - 160) + 64 x 8) FLOPs at 1e12 */
        CHECK(cost[0] == cost[2] && cost[0] == cost[3] &&
              REL(cost[1] - cost[0], 3.0 * 2.0 * 16 * (3.0 * 64 * (2 * 96 + 128 - 160) + 64.0 * 8) / 1e12));
    }
    /* ---- a config without the decoder sizes names the file */
    mmc_json *bad = NULL;
    const char *bj = "{\"model_type\": \"qwen2\", \"hidden_size\": 0}";
    CHECK_OK(mmc_json_parse(bj, strlen(bj), "bad.json", &bad));
    mmc_plan_model mb;
    CHECK(bad && mmc_plan_model_read(bad, "bad.json", &mb) != MMC_OK && strstr(mmc_last_error(), "bad.json"));
    mmc_json_free(bad);
    return test_done("test_plan");
}
