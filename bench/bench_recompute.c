/* bench_recompute.c — memory and time of selective recompute and activation offload
 * (README "Selective recompute, activation offload and communication overlap"): one training step (forward, causal-LM loss,
 * backward) of a random Qwen2 decoder of 8 layers (hidden 512, MLP 1536, 8 query / 2 KV heads
 * of 64, vocab 8192), one row of 512 tokens, fp32, under each mode: none, full, full on the
 * first 4 layers, attention core only, offload of the first 4 / all 8 layers to a memory-mapped
 * file (in $TMPDIR or /tmp), and offload of all layers with attention recompute. Per mode:
 * the activation bytes held from the forward for the backward (_held), the arena's high-water
 * mark over the step (_peak), the bytes in the mapped file (_mapped), and the median step
 * time of MMC_BENCH_RECOMPUTE_STEPS (default 3) after one warm-up, with its ratio to no
 * recompute (_time_ratio: the price of the memory). Every mode's loss and gradients are also
 * checked against no recompute (bit-equal; the bench fails otherwise). No peer: the
 * comparison is mmc without recompute, in the same process. */
#include "bench_util.h"
#include "../tests/recompute_run.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    const int64_t B = 1, T = 512, V = 8192;
    const char *e = getenv("MMC_BENCH_RECOMPUTE_STEPS");
    int steps = e && atoi(e) > 0 ? atoi(e) : 3;
    if (steps > 15) steps = 15;
    mmc_qwen2 *m = rc_model(8, 512, 1536, 8, 2, (int)V);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * T)), *labels = malloc(sizeof(int32_t) * (size_t)(B * T));
    uint64_t s = 11;
    for (int64_t i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        labels[i] = ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    const rc_mode modes[] = {
        {"none", false, false, 0, 0},
        {"full", true, false, 0, 0},
        {"full_first4", true, false, 4, 0},
        {"attention", false, true, 0, 0},
        {"offload4", false, false, 0, 4},
        {"offload8", false, false, 0, 8},
        {"offload8_attention", false, true, 0, 8},
    };
    rc_result ref = {0};
    double t_none = 0;
    int bad = 0;
    char name[128];
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        double ts[16];
        rc_result r = {0};
        for (int k = 0; k <= steps; k++) {
            rc_step(m, &modes[i], ids, labels, B, T, NULL, &r);
            if (k) ts[k - 1] = r.fwd_s + r.bwd_s;
            if (k < steps) free(r.grads);
        }
        qsort(ts, (size_t)steps, sizeof *ts, cmp_d);
        const double t = ts[steps / 2];
        if (i == 0) {
            ref = r, t_none = t;
        } else {
            bad += r.loss != ref.loss || memcmp(r.grads, ref.grads, sizeof(float) * (size_t)r.n) != 0;
            free(r.grads);
        }
        const char *mn = modes[i].name;
        snprintf(name, sizeof name, "recompute_%s_held", mn), bench_report(name, r.act_fwd / 1048576.0, "MiB", 0);
        snprintf(name, sizeof name, "recompute_%s_peak", mn), bench_report(name, r.act_peak / 1048576.0, "MiB", 0);
        snprintf(name, sizeof name, "recompute_%s_mapped", mn), bench_report_info(name, r.off_peak / 1048576.0, "MiB");
        snprintf(name, sizeof name, "recompute_%s_step", mn), bench_report(name, t, "s", 0);
        snprintf(name, sizeof name, "recompute_%s_time_ratio", mn), bench_report_info(name, t / t_none, "x");
        fprintf(stderr, "%-20s held %7.1f MiB  peak %7.1f MiB  mapped %7.1f MiB  step %.3f s (%.2fx)\n", mn,
                r.act_fwd / 1048576.0, r.act_peak / 1048576.0, r.off_peak / 1048576.0, t, t / t_none);
    }
    free(ref.grads);
    free(ids);
    free(labels);
    mmc_qwen2_free(m);
    if (bad) fprintf(stderr, "bench_recompute: %d modes differ from no recompute\n", bad);
    return bad ? 1 : 0;
}
