/* tb.c — TensorBoard event files written by hand: output_dir/tb/events.out.tfevents.<time>.
 * <host>.<pid> is a TFRecord stream (uint64 length, masked CRC32C of the length, the record,
 * masked CRC32C of the record) of Event protobufs (tensorflow/core/util/event.proto):
 * the first carries file_version "brain.Event:2", the others a Summary with one scalar
 * Value (tag, simple_value) or one image (a PNG: diffusion training's validation images). Only the few protobuf fields needed are encoded (varints,
 * fixed64/fixed32, length-delimited), so no protobuf library is involved.
 * tools/ref/check_train_tb.py reads the files with tensorboard's EventAccumulator. */
#include "trainer_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

struct mmc_tb { FILE *f; char path[2300]; };

static uint32_t crc32c(const uint8_t *p, size_t n) {
    static uint32_t table[256];
    static int ready = 0;
    if (!ready) {   /* Castagnoli polynomial, reflected */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t mmc_tb_masked_crc32c(const void *data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- minimal protobuf encoding into a fixed buffer */
typedef struct { uint8_t b[512]; size_t n; } pb;
static void pb_byte(pb *p, uint8_t v) { if (p->n < sizeof p->b) p->b[p->n++] = v; }
static void pb_varint(pb *p, uint64_t v) {
    while (v >= 0x80) { pb_byte(p, (uint8_t)(v | 0x80)); v >>= 7; }
    pb_byte(p, (uint8_t)v);
}
static void pb_raw(pb *p, const void *d, size_t n) {
    for (size_t i = 0; i < n; i++) pb_byte(p, ((const uint8_t *)d)[i]);
}
static void pb_bytes(pb *p, int field, const void *d, size_t n) {
    pb_varint(p, (uint64_t)field << 3 | 2);
    pb_varint(p, n);
    pb_raw(p, d, n);
}
static void pb_fixed64(pb *p, int field, double v) {   /* little-endian host (x86-64) */
    pb_varint(p, (uint64_t)field << 3 | 1);
    pb_raw(p, &v, 8);
}
static void pb_fixed32(pb *p, int field, float v) {
    pb_varint(p, (uint64_t)field << 3 | 5);
    pb_raw(p, &v, 4);
}

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

static mmc_status write_record(mmc_tb *tb, const uint8_t *rec, size_t n) {
    uint64_t len = n;
    uint32_t lc = mmc_tb_masked_crc32c(&len, 8), dc = mmc_tb_masked_crc32c(rec, n);
    if (fwrite(&len, 8, 1, tb->f) != 1 || fwrite(&lc, 4, 1, tb->f) != 1 ||
        fwrite(rec, 1, n, tb->f) != n || fwrite(&dc, 4, 1, tb->f) != 1)
        return mmc_error(MMC_ERR_IO, "%s: write failed: %s", tb->path, strerror(errno));
    return MMC_OK;
}

mmc_status mmc_tb_open(const char *dir, mmc_tb **out) {
    *out = NULL;
    mmc_status st = mmc_mkdir_p(dir);
    if (st) return st;
    mmc_tb *tb = calloc(1, sizeof *tb);
    if (!tb) return mmc_error(MMC_ERR_OOM, "out of memory");
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    double now = wall_now();
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)now, host,
             (int)getpid());
    if (!(tb->f = fopen(tb->path, "wb"))) {
        st = mmc_error(MMC_ERR_IO, "%s: cannot create: %s", tb->path, strerror(errno));
        free(tb);
        return st;
    }
    pb ev = {0};
    pb_fixed64(&ev, 1, now);
    pb_bytes(&ev, 3, "brain.Event:2", 13);
    if ((st = write_record(tb, ev.b, ev.n))) { mmc_tb_close(tb); return st; }
    *out = tb;
    return MMC_OK;
}

mmc_status mmc_tb_scalar(mmc_tb *tb, const char *tag, int64_t step, double value) {
    if (!tb) return MMC_OK;
    pb val = {0}, sum = {0}, ev = {0};
    pb_bytes(&val, 1, tag, strlen(tag));
    pb_fixed32(&val, 2, (float)value);
    pb_bytes(&sum, 1, val.b, val.n);
    pb_fixed64(&ev, 1, wall_now());
    pb_varint(&ev, 2 << 3 | 0);
    pb_varint(&ev, (uint64_t)step);
    pb_bytes(&ev, 5, sum.b, sum.n);
    return write_record(tb, ev.b, ev.n);
}

/* A growable buffer for the one message that does not fit pb's 512 bytes: an image summary. */
typedef struct { uint8_t *b; size_t n, cap; bool oom; } pbd;
static void pbd_raw(pbd *p, const void *d, size_t n) {
    if (p->oom) return;
    if (p->n + n > p->cap) {
        size_t c = p->cap ? p->cap : 1024;
        while (c < p->n + n) c *= 2;
        uint8_t *q = realloc(p->b, c);
        if (!q) { p->oom = true; return; }
        p->b = q, p->cap = c;
    }
    memcpy(p->b + p->n, d, n);
    p->n += n;
}
static void pbd_varint(pbd *p, uint64_t v) {
    uint8_t t[10];
    int k = 0;
    while (v >= 0x80) { t[k++] = (uint8_t)(v | 0x80); v >>= 7; }
    t[k++] = (uint8_t)v;
    pbd_raw(p, t, (size_t)k);
}
static void pbd_bytes(pbd *p, int field, const void *d, size_t n) {
    pbd_varint(p, (uint64_t)field << 3 | 2);
    pbd_varint(p, n);
    pbd_raw(p, d, n);
}

/* Summary.Value{tag, image = Summary.Image{height, width, colorspace 3 (RGB), encoded PNG}}: what
 * TensorBoard's Images tab shows (tf.summary.image's v1 layout, which it still reads). */
mmc_status mmc_tb_image(mmc_tb *tb, const char *tag, int64_t step, const char *png_path, int width, int height) {
    if (!tb) return MMC_OK;
    char *png = NULL;
    size_t n = 0;
    mmc_status st = mmc_read_file(png_path, &png, &n);
    if (st) return st;
    pbd img = {0}, val = {0}, sum = {0}, ev = {0};
    pbd_varint(&img, 1 << 3 | 0), pbd_varint(&img, (uint64_t)height);
    pbd_varint(&img, 2 << 3 | 0), pbd_varint(&img, (uint64_t)width);
    pbd_varint(&img, 3 << 3 | 0), pbd_varint(&img, 3);
    pbd_bytes(&img, 4, png, n);
    free(png);
    pbd_bytes(&val, 1, tag, strlen(tag));
    pbd_bytes(&val, 4, img.b, img.n);
    pbd_bytes(&sum, 1, val.b, val.n);
    double now = wall_now();
    pbd_varint(&ev, 1 << 3 | 1), pbd_raw(&ev, &now, 8);
    pbd_varint(&ev, 2 << 3 | 0), pbd_varint(&ev, (uint64_t)step);
    pbd_bytes(&ev, 5, sum.b, sum.n);
    st = img.oom || val.oom || sum.oom || ev.oom ? mmc_error(MMC_ERR_OOM, "out of memory") : write_record(tb, ev.b, ev.n);
    free(img.b), free(val.b), free(sum.b), free(ev.b);
    return st;
}

mmc_status mmc_tb_flush(mmc_tb *tb) {
    if (tb && fflush(tb->f) != 0) return mmc_error(MMC_ERR_IO, "%s: flush failed: %s", tb->path, strerror(errno));
    return MMC_OK;
}

void mmc_tb_close(mmc_tb *tb) {
    if (!tb) return;
    if (tb->f) fclose(tb->f);
    free(tb);
}
