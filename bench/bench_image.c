/* bench_image.c — Qwen2-VL preprocessing throughput, bytes in memory -> decode -> PIL-exact
 * bicubic resize (smart_resize, default pixel bounds) -> rescale, normalise, patchify ->
 * pixel_values, on two JPEGs this program writes (deterministic, photo-like: smooth
 * multi-octave value noise for shading, hard-edged shapes, fine grain; quality 90, 4:2:0):
 *   qwen2vl_preprocess_1024x768_jpeg         (-> 1036x756, grid 1x54x74)
 *   qwen2vl_preprocess_4032x3024_jpeg        a 12 MP phone photo (-> 1148x840, grid 1x60x82)
 * Each case is printed twice: "<case>" against transformers' slow PIL processor and
 * "<case>_vs_fast" against its fast torchvision processor (bench/peer_image.py, same files,
 * same thread count). MMC_BENCH_THREADS threads (OpenMP). */
#include "bench_util.h"
#include "mmc_image.h"
#include "mmc_vlproc.h"
#include "mmc_io.h"

#include <stdio.h>
#include <jpeglib.h>
#include <math.h>
#include <unistd.h>

static uint32_t hash2(uint32_t x, uint32_t y, uint32_t s) {
    uint32_t h = x * 0x8da6b343u ^ y * 0xd8163841u ^ s * 0xcb1ab31fu;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    return h ^ (h >> 15);
}
/* value noise in [0, 1): bilinear-smoothstep interpolation of a hashed lattice of cell size c */
static double vnoise(double x, double y, double c, uint32_t s) {
    double fx = x / c, fy = y / c;
    uint32_t ix = (uint32_t)fx, iy = (uint32_t)fy;
    double tx = fx - ix, ty = fy - iy;
    tx = tx * tx * (3 - 2 * tx);
    ty = ty * ty * (3 - 2 * ty);
    double a = hash2(ix, iy, s) / 4294967296.0, b = hash2(ix + 1, iy, s) / 4294967296.0;
    double d = hash2(ix, iy + 1, s) / 4294967296.0, e = hash2(ix + 1, iy + 1, s) / 4294967296.0;
    return (a + (b - a) * tx) * (1 - ty) + (d + (e - d) * tx) * ty;
}

static void write_jpeg(const char *path, int W, int H) {
    unsigned char *rgb = malloc((size_t)W * H * 3);
    double sc = W / 1024.0;   /* features scale with the picture, as in a photo of the same scene */
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            /* shading: 4 octaves; a few discs and a horizon as hard edges; per-pixel grain */
            double v = 0, amp = 0.5;
            for (int o = 0; o < 4; o++, amp *= 0.5) v += amp * vnoise(x, y, 160.0 * sc / (1 << o), 7 + o);
            v += 0.12 * (vnoise(x, y, 2.5, 31) - 0.5) + 0.08 * (vnoise(x, y, 9.0 * sc, 37) - 0.5);   /* texture */
            int region = y > H * 0.62 ? 1 : 0;
            for (int k = 0; k < 6; k++) {
                double cx = W * (0.1 + 0.15 * k), cy = H * (0.3 + 0.08 * (k % 3)), r = H * (0.05 + 0.02 * k);
                if ((x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r) region = 2 + k % 3;
            }
            static const double base[5][3] = {{0.55, 0.7, 0.95}, {0.35, 0.5, 0.2}, {0.8, 0.3, 0.2}, {0.9, 0.85, 0.6}, {0.2, 0.25, 0.4}};
            for (int c = 0; c < 3; c++) {
                double g = (hash2(x, y, 99 + c) & 255) / 255.0 - 0.5;
                double t = 255 * (base[region][c] * (0.45 + 0.9 * v)) + 16 * g;
                rgb[((size_t)y * W + x) * 3 + c] = (unsigned char)(t < 0 ? 0 : t > 255 ? 255 : t);
            }
        }
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "bench_image: cannot write %s\n", path); exit(1); }
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr je;
    ci.err = jpeg_std_error(&je);
    jpeg_create_compress(&ci);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = W;
    ci.image_height = H;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);   /* 4:2:0 */
    jpeg_set_quality(&ci, 90, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW r = rgb + (size_t)ci.next_scanline * W * 3;
        jpeg_write_scanlines(&ci, &r, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    fclose(f);
    free(rgb);
}

typedef struct { const char *path; char *buf; size_t n; mmc_qwen2vl_proc p; } arg_t;

static void run(void *a_) {
    arg_t *a = a_;
    mmc_image img;
    mmc_vlproc_out out;
    if (mmc_image_load_memory(a->buf, a->n, a->path, NULL, &img) ||
        mmc_qwen2vl_preprocess_images(&a->p, &img, 1, &out)) {
        fprintf(stderr, "bench_image: %s\n", mmc_last_error());
        exit(1);
    }
    mmc_vlproc_out_free(&out);
    mmc_image_free(&img);
}

int main(void) {
    static const struct { int w, h; } sizes[] = {{1024, 768}, {4032, 3024}};
    for (int i = 0; i < 2; i++) {
        char path[128], name[128];
        snprintf(path, sizeof path, "build/bench/bench_image_%dx%d.jpg", sizes[i].w, sizes[i].h);
        if (!getenv("MMC_BENCH_IMAGE_KEEP") || access(path, R_OK)) write_jpeg(path, sizes[i].w, sizes[i].h);
        arg_t a = {.path = path};
        if (mmc_read_file(path, &a.buf, &a.n)) { fprintf(stderr, "%s\n", mmc_last_error()); return 1; }
        mmc_qwen2vl_proc_default(&a.p);
        double t = bench_time(run, &a, 3.0, 10);
        snprintf(name, sizeof name, "qwen2vl_preprocess_%dx%d_jpeg", sizes[i].w, sizes[i].h);
        bench_report(name, 1.0 / t, "images/s", 1);
        strcat(name, "_vs_fast");
        bench_report(name, 1.0 / t, "images/s", 1);
        fprintf(stderr, "bench_image: %s (%zu bytes): %.2f ms/image\n", path, a.n, t * 1e3);
        free(a.buf);
    }
    return 0;
}
