/* test_plot.c — the checkpoint's loss/lr plot (src/train/plot.c): written atomically as a
 * PNG that our own decoder reads back at 800x560, with the loss curve's colour present in
 * the top panel and the lr curve's in the bottom one; a log-scale loss (many decades), a
 * single point and an unwritable path. cairo is optional (CMakeLists.txt: the trainer runs
 * without it and only the plot is missing), so a build without it checks that the plot call
 * says so, naming the file, and skips (exit 77). */
#include "test_util.h"
#include "mmc_image.h"
#include "train/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fontconfig (cairo's text) keeps its caches for the process lifetime: not our leak */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libfontconfig\n"; }

#ifdef MMC_HAVE_CAIRO
/* pixels close to rgb (0..255) in rows [y0, y1) */
static int count_colour(const mmc_image *im, int y0, int y1, int r, int g, int b) {
    int n = 0;
    for (int y = y0; y < y1; y++)
        for (int x = 0; x < im->width; x++) {
            const uint8_t *p = im->data + ((size_t)y * im->width + x) * 3;
            if (abs(p[0] - r) < 12 && abs(p[1] - g) < 12 && abs(p[2] - b) < 12) n++;
        }
    return n;
}

static void plot_and_check(int n, double loss_decay, const char *what) {
    int64_t *steps = malloc((size_t)n * sizeof *steps);
    double *loss = malloc((size_t)n * sizeof *loss), *lr = malloc((size_t)n * sizeof *lr);
    for (int i = 0; i < n; i++) {
        steps[i] = 10 * (i + 1);
        loss[i] = 7.0 * exp(-loss_decay * i / n) * (1 + 0.2 * ((i * 7919) % 13) / 13.0);
        lr[i] = 1e-3 * (i < n / 10 ? (double)i / (n / 10 + 1) : 0.5 * (1 + cos(M_PI * i / n)));
    }
    char path[128];
    snprintf(path, sizeof path, "/tmp/mmc_test_plot_%d.png", (int)getpid());
    CHECK_OK(mmc_plot_loss_lr(path, steps, loss, lr, n));
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    CHECKF(access(tmp, F_OK) != 0, "%s: temporary file left behind", what);
    mmc_image im = {0};
    mmc_image_opts o;
    mmc_image_opts_default(&o);
    CHECK_OK(mmc_image_load(path, &o, &im));
    CHECKF(im.width == 800 && im.height == 560, "%s: %dx%d", what, im.width, im.height);
    if (im.data) {
        /* loss curve blue (0.12, 0.38, 0.75) in the top 60 %, lr orange (0.85, 0.4, 0.1) below */
        int blue_top = count_colour(&im, 0, 336, 31, 97, 191), blue_bot = count_colour(&im, 336, 560, 31, 97, 191);
        int orange_top = count_colour(&im, 0, 336, 217, 102, 26), orange_bot = count_colour(&im, 336, 560, 217, 102, 26);
        CHECKF(blue_top > (n > 1 ? 100 : 5) && blue_bot == 0, "%s: loss pixels %d top / %d bottom", what, blue_top, blue_bot);
        CHECKF(orange_bot > (n > 1 ? 100 : 5) && orange_top == 0, "%s: lr pixels %d top / %d bottom", what, orange_top, orange_bot);
    }
    mmc_image_free(&im);
    unlink(path);
    free(steps);
    free(loss);
    free(lr);
}
#endif

int main(void) {
#ifndef MMC_HAVE_CAIRO
    int64_t s0 = 1;
    double v0 = 1;
    CHECK(mmc_plot_loss_lr("/tmp/mmc_test_plot.png", &s0, &v0, &v0, 1) == MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "/tmp/mmc_test_plot.png") && strstr(mmc_last_error(), "cairo"));
    if (g_fail) return test_done("test_plot");
    test_skip("test_plot", "built without cairo (install libcairo2-dev and reconfigure): no loss plot to draw");
    return TEST_SKIP_CODE;
#else
    plot_and_check(300, 12.0, "from-scratch run (log-scale loss, moving average)");
    plot_and_check(40, 0.5, "short fine-tune (linear axis)");
    plot_and_check(1, 0.0, "one point");
    int64_t s = 1;
    double v = 1;
    CHECK(mmc_plot_loss_lr("/proc/mmc_no_such_dir/loss.png", &s, &v, &v, 1) != MMC_OK);
    CHECK(strstr(mmc_last_error(), "loss.png") != NULL);
    CHECK(mmc_plot_loss_lr("/tmp/x.png", &s, &v, &v, 0) != MMC_OK);
    return test_done("test_plot");
#endif
}
