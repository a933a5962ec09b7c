/* bench_data.c — data loader throughput: a synthetic dataset of 448x448 JPEGs (LLaMA-Factory
 * layout, one image + a short question/answer per sample) through the full pipeline (JPEG
 * decode, Qwen2-VL smart_resize/normalise/patchify at the default pixel bounds -> 256 image
 * tokens, chat template, tokenisation, pad expansion) with 2 workers, packed rows of 2048
 * tokens and padded micro-batches of 2. Reports samples/s, tokens/s and ms per batch (the
 * trainer divides the latter by its step time for the loader's share). Also the cost of
 * one sample on one thread. No peer: the PyTorch figure for preprocessing alone is
 * bench_image's. Uses the fixture tokenizer (run from the repository root). */
#include "bench_util.h"
#include "mmc_data.h"

#include <jpeglib.h>
#include <math.h>
#include <sys/stat.h>

#define DIR_ "build/bench/data_synth"
#define N_IMAGES 16
#define N_SAMPLES 96

static void write_jpeg(const char *path, int seed) {
    int W = 448, H = 448;
    unsigned char *rgb = malloc((size_t)W * H * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * W + x) * 3 + c] = (unsigned char)(127.5 + 90 * sin(x / (7.0 + 3 * c + seed)) *
                                                                   cos(y / (11.0 + 2 * c + seed)) + ((x * 5 + y * 3 + c + seed) % 23));
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "bench_data: cannot write %s\n", path); exit(1); }
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

static void make_dataset(void) {
    mkdir("build", 0755);
    mkdir("build/bench", 0755);
    mkdir(DIR_, 0755);
    char p[256];
    for (int i = 0; i < N_IMAGES; i++) {
        snprintf(p, sizeof p, DIR_ "/img%02d.jpg", i);
        write_jpeg(p, i);
    }
    FILE *f = fopen(DIR_ "/train.jsonl", "w");
    if (!f) { fprintf(stderr, "bench_data: cannot write the dataset\n"); exit(1); }
    const char *colours[] = {"red", "green", "blue", "yellow"};
    for (int i = 0; i < N_SAMPLES; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>What colour is the shape %d on the "
                   "left side of the picture? Answer in a short sentence.\"}, {\"role\": \"assistant\", \"content\": "
                   "\"The shape on the left is %s, and it is drawn over a striped background.\"}], \"images\": "
                   "[\"img%02d.jpg\"]}\n", i, colours[i % 4], i % N_IMAGES);
    fclose(f);
}

static void run_loader(const mmc_tokenizer *tok, bool packing, const char *name) {
    mmc_data_opts o;
    mmc_data_opts_default(&o);
    o.train = strdup(DIR_ "/train.jsonl");
    o.packing = packing;
    o.seq_len = 2048;
    o.micro_batch_size = 2;
    o.num_workers = 2;
    mmc_loader *l;
    if (mmc_loader_new(&o, tok, MMC_SPLIT_TRAIN, &l)) { fprintf(stderr, "bench_data: %s\n", mmc_last_error()); exit(1); }
    mmc_batch b;
    if (mmc_loader_next(l, &b)) { fprintf(stderr, "bench_data: %s\n", mmc_last_error()); exit(1); } /* warm-up */
    mmc_batch_free(&b);
    int64_t samples = 0, tokens = 0, batches = 0;
    double t0 = mmc_now();
    while (mmc_now() - t0 < 4.0 || batches < 4) {
        if (mmc_loader_next(l, &b)) { fprintf(stderr, "bench_data: %s\n", mmc_last_error()); exit(1); }
        samples += b.n_seqs;
        tokens += b.n_tokens;
        batches++;
        mmc_batch_free(&b);
    }
    double dt = mmc_now() - t0;
    char n[128];
    snprintf(n, sizeof n, "data_loader_%s_2workers_samples_per_s", name);
    bench_report(n, samples / dt, "samples/s", 1);
    snprintf(n, sizeof n, "data_loader_%s_2workers_tokens_per_s", name);
    bench_report(n, tokens / dt, "tokens/s", 1);
    snprintf(n, sizeof n, "data_loader_%s_2workers_ms_per_batch", name);
    bench_report(n, 1e3 * dt / batches, "ms", 0);
    mmc_loader_free(l);
    mmc_data_opts_free(&o);
}

typedef struct { const mmc_tokenizer *tok; mmc_data_opts *o; mmc_dataset *ds; int64_t i; } one_t;
static void one(void *a_) {
    one_t *a = a_;
    mmc_batch b;
    if (mmc_data_prepare(a->o, a->tok, a->ds, a->i++ % N_SAMPLES, false, &b)) {
        fprintf(stderr, "bench_data: %s\n", mmc_last_error());
        exit(1);
    }
    mmc_batch_free(&b);
}

int main(void) {
    make_dataset();
    mmc_tokenizer *tok;
    if (mmc_tokenizer_load("tests/fixtures/tokenizer", &tok)) {
        fprintf(stderr, "bench_data: %s (run from the repository root)\n", mmc_last_error());
        return 1;
    }
    run_loader(tok, true, "packed2048");
    run_loader(tok, false, "padded_mb2");
    mmc_data_opts o;
    mmc_data_opts_default(&o);
    mmc_dataset *ds;
    if (mmc_dataset_load(DIR_ "/train.jsonl", NULL, &ds)) { fprintf(stderr, "%s\n", mmc_last_error()); return 1; }
    one_t a = {tok, &o, ds, 0};
    double t = bench_time(one, &a, 2.0, 5);
    bench_report("data_prepare_448px_1thread_ms_per_sample", 1e3 * t, "ms", 0);
    mmc_dataset_free(ds);
    mmc_tokenizer_free(tok);
    return 0;
}
