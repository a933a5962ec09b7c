/* mmc_synth.h — the built-in synthetic multimodal task of `make run`: small RGB images
 * with one to three coloured shapes, and short questions about them (colour, shape, count,
 * left/right) whose answers need the image.
 *
 * Everything is deterministic: sample i of a split depends only on (seed, split, i, size),
 * drawn from its own Philox stream (mmc_rng), so any sample can be rebuilt on its own
 * (tests do that to check an image against its question). Within each question type the
 * answers are exactly balanced: sample k of a type takes answer k mod (number of answers),
 * and the scene is then drawn to fit that answer.
 *
 * Design notes (why the task is learnable by a tiny model in minutes):
 *  - the image is a g x g grid of cells (g = size/28 clamped to 2..4; at 56 px a cell is
 *    one merged 28-px vision token of 2x2 patches) and each object fills most of its own
 *    cell (half extent 0.28-0.40 of a cell, small jitter), on a black background, with
 *    saturated, well-separated colours; objects in one image have distinct colours and
 *    distinct shapes, so "the red object" and "the circle" are unambiguous;
 *  - left/right questions only use pairs in different grid columns (centres more than half a
 *    cell apart horizontally);
 *  - answers are single words ("red", "circle", "2", "left").
 * The dataset is written as LLaMA-Factory `messages` + `images` JSONL with a `type` field.
 */
#ifndef MMC_SYNTH_H
#define MMC_SYNTH_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MMC_SYNTH_CIRCLE = 0, MMC_SYNTH_SQUARE, MMC_SYNTH_TRIANGLE, MMC_SYNTH_N_SHAPES };
enum { MMC_SYNTH_RED = 0, MMC_SYNTH_GREEN, MMC_SYNTH_BLUE, MMC_SYNTH_YELLOW, MMC_SYNTH_N_COLOURS };
typedef enum {
    MMC_SYNTH_Q_COLOUR = 0, MMC_SYNTH_Q_SHAPE, MMC_SYNTH_Q_COUNT, MMC_SYNTH_Q_LEFTRIGHT,
    MMC_SYNTH_N_TYPES
} mmc_synth_qtype;

#define MMC_SYNTH_MAX_OBJ 3

extern const char *const mmc_synth_shape_names[MMC_SYNTH_N_SHAPES];
extern const char *const mmc_synth_colour_names[MMC_SYNTH_N_COLOURS];
extern const uint8_t mmc_synth_colour_rgb[MMC_SYNTH_N_COLOURS][3];
extern const char *const mmc_synth_type_names[MMC_SYNTH_N_TYPES];   /* "colour", "shape", "count", "leftright" */

typedef struct {
    int shape, colour;
    float cx, cy;     /* centre, pixels (x right, y down) */
    float r;          /* half extent: circle radius, half side, triangle circumradius-ish */
} mmc_synth_obj;

typedef struct {
    int n_obj;
    mmc_synth_obj obj[MMC_SYNTH_MAX_OBJ];
    mmc_synth_qtype type;
    int target, other;  /* object indices the question is about (other: left/right only, else -1) */
    char question[128];
    char answer[16];
} mmc_synth_sample;

typedef enum { MMC_SYNTH_TRAIN = 0, MMC_SYNTH_VAL = 1, MMC_SYNTH_TEST = 2 } mmc_synth_split;

/* Side of the layout grid (g x g cells, one object per cell) for an image of `size` px. */
int mmc_synth_grid(int size);
/* Sample `index` of a split; its type is index mod 4 (colour, shape, count, left/right). */
mmc_status mmc_synth_make(uint64_t seed, mmc_synth_split split, int64_t index, int size,
                          mmc_synth_sample *out);
/* Draw the scene into rgb [size, size, 3] (black background; 4x4 supersampled edges).
 * blank: leave only the background (the control that must stay at chance). */
void mmc_synth_render(const mmc_synth_sample *s, int size, bool blank, uint8_t *rgb);
/* Write an 8-bit RGB PNG atomically (path.tmp + rename). */
mmc_status mmc_synth_write_png(const char *path, const uint8_t *rgb, int height, int width);

typedef struct {
    const char *out_dir;   /* created if missing */
    int64_t n_train, n_val;
    int size;              /* image side in pixels (multiple of 28 recommended) */
    uint64_t seed;
    bool blank;            /* write background-only images (control run) */
    int curriculum_epochs; /* passes over the mixed part in train_curriculum.jsonl (0 or 1:
                              one, in file order; later passes in seeded permutations) */
} mmc_synth_opts;

/* Write out_dir/{train,val}.jsonl, out_dir/train_<type>.jsonl (one per question type),
 * out_dir/train_curriculum.jsonl (colour-first: N/4 colour lines, N/4 colour+shape lines,
 * then all N in mixed order, curriculum_epochs times; meant for a loader that keeps file
 * order) and out_dir/images/{train,val}_NNNNNN.png. Image
 * paths in the JSONL are relative to out_dir. */
mmc_status mmc_synth_write_dataset(const mmc_synth_opts *o);

#ifdef __cplusplus
}
#endif
#endif
