/* bench_image.c — Qwen2-VL preprocessing throughput: a 1024x768 JPEG (bytes in memory)
 * -> decode -> PIL-exact bicubic resize (smart_resize, default pixel bounds) -> rescale,
 * normalise, patchify -> pixel_values. Peer: bench/peer_image.py (transformers' slow PIL
 * processor and its fast torchvision processor on the same file). */
#include "bench_util.h"
#include "mmc_image.h"
#include "mmc_vlproc.h"
#include "mmc_io.h"

#include <stdio.h>
#include <jpeglib.h>
#include <math.h>

#define PATH "build/bench/bench_image_1024x768.jpg"

static void write_jpeg(void) {
    int W = 1024, H = 768;
    unsigned char *rgb = malloc((size_t)W * H * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * W + x) * 3 + c] =
                    (unsigned char)(127.5 + 100 * sin(x / (9.0 + 4 * c)) * cos(y / (13.0 + 3 * c)) + ((x * 7 + y * 13 + c) % 17));
    FILE *f = fopen(PATH, "wb");
    if (!f) { fprintf(stderr, "bench_image: cannot write %s\n", PATH); exit(1); }
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr je;
    ci.err = jpeg_std_error(&je);
    jpeg_create_compress(&ci);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = W;
    ci.image_height = H;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 85, TRUE);
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

typedef struct { char *buf; size_t n; mmc_qwen2vl_proc p; } arg_t;

static void run(void *a_) {
    arg_t *a = a_;
    mmc_image img;
    mmc_vlproc_out out;
    if (mmc_image_load_memory(a->buf, a->n, PATH, NULL, &img) ||
        mmc_qwen2vl_preprocess_images(&a->p, &img, 1, &out)) {
        fprintf(stderr, "bench_image: %s\n", mmc_last_error());
        exit(1);
    }
    mmc_vlproc_out_free(&out);
    mmc_image_free(&img);
}

int main(void) {
    write_jpeg();
    arg_t a;
    if (mmc_read_file(PATH, &a.buf, &a.n)) { fprintf(stderr, "%s\n", mmc_last_error()); return 1; }
    mmc_qwen2vl_proc_default(&a.p);
    double t = bench_time(run, &a, 3.0, 10);
    bench_report("qwen2vl_preprocess_1024x768_jpeg", 1.0 / t, "images/s", 1);
    bench_report("qwen2vl_preprocess_1024x768_jpeg_vs_fast", 1.0 / t, "images/s", 1);
    free(a.buf);
    return 0;
}
