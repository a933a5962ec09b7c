/* plot.c — the loss / learning-rate plot written at each checkpoint (loss.png): two panels
 * against the step, drawn with cairo (an image surface written as PNG, atomically: a
 * temporary file renamed into place). Axes get "nice" ticks (1, 2, 5 x 10^k) with grid
 * lines; the loss axis is logarithmic when the curve spans more than two decades (as a
 * from-scratch run does), and a noisy loss is drawn faint with its moving average on top. */
#include "trainer_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MMC_HAVE_CAIRO
#include <cairo.h>

/* Tick step for about `want` intervals over [lo, hi]: 1, 2 or 5 times a power of ten. */
static double nice_step(double lo, double hi, int want) {
    double raw = (hi - lo) / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

typedef struct {
    double x0, y0, pw, ph;     /* plot area */
    double s0, s1, lo, hi;     /* data ranges (lo/hi in log10 units when logy) */
    bool logy;
} frame;

static double fx(const frame *f, double s) { return f->x0 + f->pw * (s - f->s0) / (f->s1 - f->s0); }
static double fy(const frame *f, double v) {
    double u = f->logy ? log10(v > 0 ? v : pow(10, f->lo)) : v;
    return f->y0 + f->ph * (f->hi - u) / (f->hi - f->lo);
}

static void label(cairo_t *cr, double x, double y, const char *s, double align) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - align * e.width, y);
    cairo_show_text(cr, s);
}

static void curve(cairo_t *cr, const frame *f, const int64_t *steps, const double *v, int n) {
    bool pen = false;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]) || (f->logy && v[i] <= 0)) { pen = false; continue; }
        double px = fx(f, (double)steps[i]), py = fy(f, v[i]);
        if (pen) cairo_line_to(cr, px, py); else cairo_move_to(cr, px, py);
        pen = true;
    }
    if (n == 1 && isfinite(v[0])) cairo_arc(cr, fx(f, (double)steps[0]), fy(f, v[0]), 2.5, 0, 2 * M_PI);
    cairo_stroke(cr);
}

static void panel(cairo_t *cr, double x0, double y0, double w, double h, const int64_t *steps,
                  const double *v, int n, const char *title, bool smooth, double r, double g, double b) {
    double lo = INFINITY, hi = -INFINITY, pos_lo = INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) {
            lo = fmin(lo, v[i]);
            hi = fmax(hi, v[i]);
            if (v[i] > 0) pos_lo = fmin(pos_lo, v[i]);
        }
    if (!isfinite(lo)) { lo = 0; hi = 1; }
    frame f = {.s0 = (double)steps[0], .s1 = (double)steps[n - 1]};
    if (f.s1 <= f.s0) f.s1 = f.s0 + 1;
    f.logy = smooth && lo > 0 && hi / pos_lo > 100;
    if (f.logy) { lo = floor(log10(pos_lo)); hi = ceil(log10(hi)); }
    if (hi - lo < 1e-12) { hi += 0.5 * fabs(hi) + 1e-12; lo -= 0.5 * fabs(lo) + 1e-12; }
    double ystep = f.logy ? fmax(1, ceil((hi - lo) / 6)) : nice_step(lo, hi, 4);
    if (!f.logy) { lo = floor(lo / ystep + 1e-9) * ystep; hi = ceil(hi / ystep - 1e-9) * ystep; }
    f.lo = lo;
    f.hi = hi;
    const double L = 70, R = 20, T = 28, B = 34;
    f.x0 = x0 + L;
    f.y0 = y0 + T;
    f.pw = w - L - R;
    f.ph = h - T - B;

    cairo_set_source_rgb(cr, 0.97, 0.97, 0.97);
    cairo_rectangle(cr, f.x0, f.y0, f.pw, f.ph);
    cairo_fill(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 11);
    cairo_set_line_width(cr, 1);
    char buf[64];
    /* y grid and labels */
    for (double u = lo; u <= hi + 1e-9 * fabs(ystep); u += ystep) {
        double py = f.y0 + f.ph * (hi - u) / (hi - lo);
        cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
        cairo_move_to(cr, f.x0, py);
        cairo_line_to(cr, f.x0 + f.pw, py);
        cairo_stroke(cr);
        if (f.logy) snprintf(buf, sizeof buf, "1e%d", (int)lround(u));
        else snprintf(buf, sizeof buf, "%.3g", fabs(u) < 1e-9 * ystep ? 0.0 : u);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        label(cr, f.x0 - 6, py + 4, buf, 1.0);
    }
    /* x grid and labels */
    double xstep = nice_step(f.s0, f.s1, 6);
    if (xstep < 1) xstep = 1;
    for (double s = ceil(f.s0 / xstep) * xstep; s <= f.s1 + 1e-9; s += xstep) {
        double px = fx(&f, s);
        cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
        cairo_move_to(cr, px, f.y0);
        cairo_line_to(cr, px, f.y0 + f.ph);
        cairo_stroke(cr);
        snprintf(buf, sizeof buf, "%.0f", s);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        label(cr, px, f.y0 + f.ph + 15, buf, 0.5);
    }
    label(cr, f.x0 + f.pw, y0 + h - 4, "step", 1.0);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, f.x0, f.y0, f.pw, f.ph);
    cairo_stroke(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 13);
    snprintf(buf, sizeof buf, "%s%s", title, f.logy ? " (log scale)" : "");
    label(cr, f.x0, f.y0 - 9, buf, 0.0);

    cairo_save(cr);
    cairo_rectangle(cr, f.x0, f.y0, f.pw, f.ph);
    cairo_clip(cr);
    /* moving average over ~1/50 of the run (centred), when there are enough points */
    int win = smooth && n >= 100 ? n / 50 : 0;
    if (win >= 2) {
        cairo_set_source_rgba(cr, r, g, b, 0.3);
        cairo_set_line_width(cr, 1.0);
        curve(cr, &f, steps, v, n);
        double *avg = malloc((size_t)n * sizeof *avg);
        if (avg) {
            for (int i = 0; i < n; i++) {
                double sum = 0;
                int cnt = 0;
                for (int j = i - win / 2; j <= i + win / 2; j++)
                    if (j >= 0 && j < n && isfinite(v[j]) && (!f.logy || v[j] > 0)) {
                        sum += f.logy ? log(v[j]) : v[j];
                        cnt++;
                    }
                avg[i] = cnt ? (f.logy ? exp(sum / cnt) : sum / cnt) : NAN;
            }
            cairo_set_source_rgb(cr, r, g, b);
            cairo_set_line_width(cr, 1.8);
            curve(cr, &f, steps, avg, n);
            free(avg);
        }
    } else {
        cairo_set_source_rgb(cr, r, g, b);
        cairo_set_line_width(cr, 1.8);
        curve(cr, &f, steps, v, n);
    }
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
    panel(cr, 0, 0, W, H * 0.6, steps, loss, n, "training loss", true, 0.12, 0.38, 0.75);
    panel(cr, 0, H * 0.6, W, H * 0.4, steps, lr, n, "learning rate", false, 0.85, 0.4, 0.1);
    cairo_destroy(cr);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        cairo_surface_destroy(s);
        return mmc_error(MMC_ERR_INVALID, "plot: path too long: %s", path);
    }
    cairo_status_t cs = cairo_surface_write_to_png(s, tmp);
    cairo_surface_destroy(s);
    if (cs != CAIRO_STATUS_SUCCESS) {
        unlink(tmp);
        return mmc_error(MMC_ERR_IO, "%s: cannot write the plot: %s", path, cairo_status_to_string(cs));
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return mmc_error(MMC_ERR_IO, "%s: cannot move the plot into place", path);
    }
    return MMC_OK;
}
#else
mmc_status mmc_plot_loss_lr(const char *path, const int64_t *steps, const double *loss,
                            const double *lr, int n) {
    (void)steps; (void)loss; (void)lr; (void)n;
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: built without cairo (libcairo2-dev): no plot", path);
}
#endif
