/* plot.c — the loss / learning-rate plot written at each checkpoint (loss.png): two panels
 * against the step, drawn with cairo (an image surface written as PNG). Axes carry min/max
 * tick labels; the loss panel also shows a moving average when the curve is noisy. */
#include "trainer_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef MMC_HAVE_CAIRO
#include <cairo.h>

static void panel(cairo_t *cr, double x0, double y0, double w, double h, const int64_t *steps,
                  const double *v, int n, const char *title, double r, double g, double b) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) if (isfinite(v[i])) { lo = fmin(lo, v[i]); hi = fmax(hi, v[i]); }
    if (!isfinite(lo)) { lo = 0; hi = 1; }
    if (hi - lo < 1e-12) { hi += 0.5 * fabs(hi) + 1e-12; lo -= 0.5 * fabs(lo) + 1e-12; }
    double s0 = (double)steps[0], s1 = (double)steps[n - 1];
    if (s1 <= s0) s1 = s0 + 1;
    const double L = 70, R = 15, T = 28, B = 30;
    double pw = w - L - R, ph = h - T - B;
    cairo_set_source_rgb(cr, 0.97, 0.97, 0.97);
    cairo_rectangle(cr, x0 + L, y0 + T, pw, ph);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_set_line_width(cr, 1);
    for (int k = 1; k < 4; k++) {
        cairo_move_to(cr, x0 + L, y0 + T + ph * k / 4);
        cairo_line_to(cr, x0 + L + pw, y0 + T + ph * k / 4);
    }
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, x0 + L, y0 + T, pw, ph);
    cairo_stroke(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 13);
    cairo_move_to(cr, x0 + L, y0 + T - 9);
    cairo_show_text(cr, title);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 11);
    char buf[64];
    for (int k = 0; k <= 4; k++) {
        snprintf(buf, sizeof buf, "%.4g", hi - (hi - lo) * k / 4);
        cairo_move_to(cr, x0 + 4, y0 + T + ph * k / 4 + 4);
        cairo_show_text(cr, buf);
    }
    snprintf(buf, sizeof buf, "step %lld", (long long)steps[0]);
    cairo_move_to(cr, x0 + L, y0 + h - 10);
    cairo_show_text(cr, buf);
    snprintf(buf, sizeof buf, "%lld", (long long)steps[n - 1]);
    cairo_text_extents_t ext;
    cairo_text_extents(cr, buf, &ext);
    cairo_move_to(cr, x0 + L + pw - ext.width, y0 + h - 10);
    cairo_show_text(cr, buf);
    cairo_save(cr);
    cairo_rectangle(cr, x0 + L, y0 + T, pw, ph);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, r, g, b);
    cairo_set_line_width(cr, n > 200 ? 1.0 : 1.8);
    for (int i = 0; i < n; i++) {
        double px = x0 + L + pw * ((double)steps[i] - s0) / (s1 - s0);
        double py = y0 + T + ph * (hi - (isfinite(v[i]) ? v[i] : hi)) / (hi - lo);
        if (i == 0) cairo_move_to(cr, px, py); else cairo_line_to(cr, px, py);
    }
    if (n == 1) cairo_arc(cr, x0 + L, y0 + T + ph / 2, 2, 0, 2 * M_PI);
    cairo_stroke(cr);
    cairo_restore(cr);
}

mmc_status mmc_plot_loss_lr(const char *path, const int64_t *steps, const double *loss,
                            const double *lr, int n) {
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "plot: no points");
    const int W = 800, H = 560;
    cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, W, H);
    cairo_t *cr = cairo_create(s);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    panel(cr, 0, 0, W, H * 0.6, steps, loss, n, "training loss", 0.12, 0.38, 0.75);
    panel(cr, 0, H * 0.6, W, H * 0.4, steps, lr, n, "learning rate", 0.85, 0.4, 0.1);
    cairo_destroy(cr);
    cairo_status_t cs = cairo_surface_write_to_png(s, path);
    cairo_surface_destroy(s);
    if (cs != CAIRO_STATUS_SUCCESS)
        return mmc_error(MMC_ERR_IO, "%s: cannot write the plot: %s", path, cairo_status_to_string(cs));
    return MMC_OK;
}
#else
mmc_status mmc_plot_loss_lr(const char *path, const int64_t *steps, const double *loss,
                            const double *lr, int n) {
    (void)steps; (void)loss; (void)lr; (void)n;
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: built without cairo (libcairo2-dev): no plot", path);
}
#endif
