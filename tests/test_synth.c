/* test_synth.c — the demo's synthetic dataset (src/train/synth.c): determinism for a seed,
 * exact answer balance within each question type, and images that agree with their
 * questions (the pixel at each object's centre has the object's colour; counts, left/right
 * and the named objects match the scene); the written files (PNG decodes to the rendered
 * pixels; JSONL lines per split and per type). */
#include "test_util.h"
#include "mmc_image.h"
#include "mmc_io.h"
#include "mmc_synth.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int find(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++) if (!strcmp(names[i], s)) return i;
    return -1;
}

static void test_scenes(int size) {
    const int N = 2000;
    int counts[MMC_SYNTH_N_TYPES][8] = {{0}};
    uint8_t *rgb = malloc((size_t)size * size * 3);
    for (int i = 0; i < N; i++) {
        mmc_synth_sample s, s2;
        CHECK_OK(mmc_synth_make(7, MMC_SYNTH_TRAIN, i, size, &s));
        CHECK_OK(mmc_synth_make(7, MMC_SYNTH_TRAIN, i, size, &s2));
        CHECKF(memcmp(&s, &s2, sizeof s) == 0, "sample %d not deterministic", i);
        CHECK(s.type == (mmc_synth_qtype)(i % MMC_SYNTH_N_TYPES));
        CHECK(s.n_obj >= 1 && s.n_obj <= 3);
        mmc_synth_render(&s, size, false, rgb);
        for (int k = 0; k < s.n_obj; k++) {
            const mmc_synth_obj *o = &s.obj[k];
            /* the object lies inside the image */
            CHECK(o->cx - o->r >= 0 && o->cx + o->r <= size && o->cy - o->r >= 0 && o->cy + o->r <= size);
            /* distinct colours and shapes */
            for (int l = 0; l < k; l++) CHECK(s.obj[l].colour != o->colour && s.obj[l].shape != o->shape);
            /* the centre pixel (fully covered: objects are >= 3.6 px in half extent) has the colour */
            const uint8_t *p = rgb + ((size_t)(int)o->cy * size + (int)o->cx) * 3;
            CHECKF(!memcmp(p, mmc_synth_colour_rgb[o->colour], 3), "sample %d obj %d centre colour", i, k);
        }
        const mmc_synth_obj *t = &s.obj[s.target];
        int a = -1;
        switch (s.type) {
        case MMC_SYNTH_Q_COLOUR:
            a = find(mmc_synth_colour_names, MMC_SYNTH_N_COLOURS, s.answer);
            CHECK(a == t->colour);
            CHECK(strstr(s.question, mmc_synth_shape_names[t->shape]) != NULL);
            break;
        case MMC_SYNTH_Q_SHAPE:
            a = find(mmc_synth_shape_names, MMC_SYNTH_N_SHAPES, s.answer);
            CHECK(a == t->shape);
            CHECK(strstr(s.question, mmc_synth_colour_names[t->colour]) != NULL);
            break;
        case MMC_SYNTH_Q_COUNT:
            a = atoi(s.answer) - 1;
            CHECK(a + 1 == s.n_obj);
            /* count the colours present in the picture */
            {
                int present = 0;
                for (int c = 0; c < MMC_SYNTH_N_COLOURS; c++) {
                    bool seen = false;
                    for (int px = 0; px < size * size && !seen; px++)
                        seen = !memcmp(rgb + px * 3, mmc_synth_colour_rgb[c], 3);
                    present += seen;
                }
                CHECKF(present == s.n_obj, "sample %d: %d colours seen, %d objects", i, present, s.n_obj);
            }
            break;
        default: {
            const mmc_synth_obj *u = &s.obj[s.other];
            a = !strcmp(s.answer, "left") ? 0 : !strcmp(s.answer, "right") ? 1 : -1;
            CHECK(a >= 0 && s.other != s.target && s.n_obj >= 2);
            CHECK(a == 0 ? t->cx + 0.2f * size <= u->cx : u->cx + 0.2f * size <= t->cx);
            char q[128];
            snprintf(q, sizeof q, "Is the %s shape left or right of the %s shape?",
                     mmc_synth_colour_names[t->colour], mmc_synth_colour_names[u->colour]);
            CHECK(!strcmp(q, s.question));
        }
        }
        CHECKF(a >= 0 && a < 8, "sample %d answer '%s'", i, s.answer);
        if (a >= 0 && a < 8) counts[s.type][a]++;
    }
    /* exactly balanced: N/4 samples per type, spread evenly over the answers */
    const int na[MMC_SYNTH_N_TYPES] = {4, 3, 3, 2};
    for (int ty = 0; ty < MMC_SYNTH_N_TYPES; ty++)
        for (int a = 0; a < na[ty]; a++) {
            int want = N / 4 / na[ty];
            CHECKF(counts[ty][a] >= want && counts[ty][a] <= want + 1, "type %d answer %d: %d (want %d)", ty, a,
                   counts[ty][a], want);
        }
    /* another seed / split gives other scenes */
    mmc_synth_sample a0, b0, c0;
    CHECK_OK(mmc_synth_make(7, MMC_SYNTH_TRAIN, 5, size, &a0));
    CHECK_OK(mmc_synth_make(8, MMC_SYNTH_TRAIN, 5, size, &b0));
    CHECK_OK(mmc_synth_make(7, MMC_SYNTH_VAL, 5, size, &c0));
    CHECK(a0.obj[0].cx != b0.obj[0].cx && a0.obj[0].cx != c0.obj[0].cx);
    /* blank: background only */
    mmc_synth_render(&a0, size, true, rgb);
    int nz = 0;
    for (int px = 0; px < size * size * 3; px++) nz += rgb[px] != 0;
    CHECK(nz == 0);
    free(rgb);
}

static void test_files(void) {
    char dir[] = "/tmp/mmc_test_synth_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    mmc_synth_opts o = {.out_dir = dir, .n_train = 24, .n_val = 8, .size = 56, .seed = 3};
    CHECK_OK(mmc_synth_write_dataset(&o));
    char path[512], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    CHECK_OK(mmc_read_file(path, &text, &len));
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    CHECK(lines == 24);
    CHECK(strstr(text, "\"images\": [\"images/train_000000.png\"]") != NULL);
    CHECK(strstr(text, "\"type\": \"leftright\"") != NULL);
    /* every line parses and names its type */
    char *save = NULL;
    for (char *ln = strtok_r(text, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        mmc_json *j = NULL;
        CHECK_OK(mmc_json_parse(ln, strlen(ln), "train.jsonl", &j));
        const char *role = NULL, *type = NULL;
        CHECK_OK(mmc_json_str(j, "messages.1.role", NULL, &role));
        CHECK_OK(mmc_json_str(j, "type", NULL, &type));
        CHECK(role && !strcmp(role, "assistant") && type);
        mmc_json_free(j);
    }
    free(text);
    snprintf(path, sizeof path, "%s/train_colour.jsonl", dir);
    CHECK_OK(mmc_read_file(path, &text, &len));
    lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    CHECK(lines == 6 && strstr(text, "shape\"") == NULL);
    free(text);
    /* curriculum: N/4 colour lines, N/4 colour + shape lines, then the N samples once per
     * epoch (2 here: file order, then a permutation) = 6 + 6 + 48 lines */
    o.curriculum_epochs = 2;
    CHECK_OK(mmc_synth_write_dataset(&o));
    snprintf(path, sizeof path, "%s/train_curriculum.jsonl", dir);
    CHECK_OK(mmc_read_file(path, &text, &len));
    char *ln_at[64];
    lines = 0;
    save = NULL;
    for (char *ln = strtok_r(text, "\n", &save); ln && lines < 64; ln = strtok_r(NULL, "\n", &save)) ln_at[lines++] = ln;
    CHECK(lines == 60);
    for (int i = 0; i < 6 && lines == 60; i++) CHECK(strstr(ln_at[i], "\"type\": \"colour\"") != NULL);
    for (int i = 6; i < 12 && lines == 60; i++)
        CHECK(strstr(ln_at[i], "\"type\": \"colour\"") || strstr(ln_at[i], "\"type\": \"shape\""));
    if (lines == 60) {
        CHECK(strstr(ln_at[12], "train_000000.png") != NULL);   /* first pass: file order */
        int same = 0, found = 0;                                /* second: a permutation */
        for (int i = 36; i < 60; i++) {
            char want[64];
            snprintf(want, sizeof want, "train_%06d.png", i - 36);
            same += strstr(ln_at[i], want) != NULL;
            for (int k = 36; k < 60; k++) found += strstr(ln_at[k], want) != NULL;
        }
        CHECK(same < 24 && found == 24);
    }
    free(text);
    o.curriculum_epochs = 0;
    /* the PNG decodes to exactly the rendered pixels */
    mmc_synth_sample s;
    CHECK_OK(mmc_synth_make(3, MMC_SYNTH_VAL, 7, 56, &s));
    uint8_t rgb[56 * 56 * 3];
    mmc_synth_render(&s, 56, false, rgb);
    mmc_image img;
    snprintf(path, sizeof path, "%s/images/val_000007.png", dir);
    CHECK_OK(mmc_image_load(path, NULL, &img));
    CHECK(img.width == 56 && img.height == 56 && !memcmp(img.data, rgb, sizeof rgb));
    mmc_image_free(&img);
    /* errors */
    mmc_synth_opts bad = o;
    bad.size = 10;
    CHECK_ERR(mmc_synth_write_dataset(&bad), MMC_ERR_INVALID);
    bad = o;
    bad.out_dir = "/proc/mmc_cannot_write_here";
    CHECK(mmc_synth_write_dataset(&bad) != MMC_OK);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    test_scenes(56);
    test_scenes(84);
    test_scenes(28);
    test_files();
    return test_done("test_synth");
}
