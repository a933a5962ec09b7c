/* test_selective_recompute.c — selective recompute and activation offload (README "Selective recompute,
 * activation offload and communication overlap"): one training step of a random 4-layer Qwen2 (GQA 4:2, two rows of 24 tokens)
 * under each mode — full recompute of every layer or of the first N, recompute of the attention
 * core only (all layers or the first N), offload of the first N layers' saved activations to a
 * memory-mapped file, and offload with recompute — must give the loss and every parameter
 * gradient of the step without recompute bit for bit (the same ops on the same operands; a
 * recomputation re-runs them, an offload moves only where the bytes live). Also checks that
 * the modes keep what they say: the activation bytes held from the forward for the backward
 * fall under recompute (attention's less than full's, the first N's between), and offload
 * moves them to the mapped arena, whose file is nameless (no mmc-offload-* left behind). */
#include "recompute_run.h"

#include <dirent.h>
#include <unistd.h>

static int fails = 0;

static int count_offload_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, "mmc-offload-", 12);
    if (d) closedir(d);
    return n;
}

int main(void) {
    const int64_t B = 2, T = 24, V = 97;
    mmc_qwen2 *m = rc_model(4, 64, 112, 4, 2, (int)V);
    int32_t ids[2 * 24], labels[2 * 24];
    uint64_t s = 7;
    for (int i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
        labels[i] = i % 11 == 5 ? -100 : ids[i];
    }
    char dir[] = "/tmp/mmc-test-recompute-XXXXXX";
    MMC_CHECK(mkdtemp(dir), "mkdtemp failed");
    const rc_mode modes[] = {
        {"none", false, false, 0, 0},
        {"full", true, false, 0, 0},
        {"full, first 2 layers", true, false, 2, 0},
        {"attention", false, true, 0, 0},
        {"attention, first 1 layer", false, true, 1, 0},
        {"offload 2 layers", false, false, 0, 2},
        {"offload all 4 layers", false, false, 0, 4},
        {"offload 4 + attention", false, true, 0, 4},
        {"offload 2 + full first 1", true, false, 1, 2},
    };
    const int nm = (int)(sizeof modes / sizeof modes[0]);
    rc_result ref = {0};
    size_t held[16] = {0}, mapped[16] = {0};
    for (int i = 0; i < nm; i++) {
        rc_result r;
        rc_step(m, &modes[i], ids, labels, B, T, dir, &r);
        held[i] = r.act_fwd;
        mapped[i] = r.off_peak;
        int64_t ndiff = 0;
        if (i == 0) {
            ref = r;
        } else {
            for (int64_t k = 0; k < r.n; k++) ndiff += memcmp(&r.grads[k], &ref.grads[k], sizeof(float)) != 0;
            free(r.grads);
        }
        const bool ok = i == 0 || (r.loss == ref.loss && ndiff == 0);
        printf("%-26s loss %.9g  grads differing %lld/%lld  held after forward %.1f KiB (peak %.1f)  mapped %.1f KiB"
               "  %s\n", modes[i].name, r.loss, (long long)ndiff, (long long)r.n, r.act_fwd / 1024.0,
               r.act_peak / 1024.0, r.off_peak / 1024.0, ok ? "ok" : "FAIL");
        fails += !ok;
        if (modes[i].offload && r.off_peak == 0) printf("FAIL: %s put nothing in the mapped arena\n", modes[i].name), fails++;
        if (!modes[i].offload && r.off_peak != 0) printf("FAIL: %s used the mapped arena\n", modes[i].name), fails++;
    }
    /* what each mode keeps for backward: full < first 2 < none, full < attention < first 1 < none,
     * offload all < offload 2 < none (in memory), offload + attention < offload (in the file) */
    const size_t *h = held;
    const bool order = h[1] < h[2] && h[2] < h[0] && h[1] < h[3] && h[3] < h[4] && h[4] < h[0] && h[6] < h[5] &&
                       h[5] < h[0] && mapped[7] < mapped[6];
    printf("activation bytes held after the forward in the expected order: %s\n", order ? "ok" : "FAIL");
    fails += !order;
    const int left = count_offload_files(dir);
    printf("offload files left in %s: %d %s\n", dir, left, left ? "FAIL" : "ok");
    fails += left != 0;
    rmdir(dir);
    free(ref.grads);
    mmc_qwen2_free(m);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
