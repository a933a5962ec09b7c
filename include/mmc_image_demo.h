/* mmc_image_demo.h — the captioned-shapes task of the image-generation demo (`make run-image`,
 * scripts/demo_image.sh): `mmc synth`'s scenes with one object ("a red circle on the left"), the
 * held-out captions, and the judges of generated images (pixel statistics here; the understanding
 * demo's VLM through `mmc eval` on the questions written by mmc_imgdemo_judge).
 *
 * A scene is one object of `mmc synth`'s palette and shapes (mmc_synth.h) in one cell of a 2 x 2
 * grid, in the left or the right column (top or bottom at random), with synth's size and jitter
 * rules, rendered by mmc_synth_render: at 56 px exactly the one-object images the VLM of `make run`
 * was trained on. Captions are "a <colour> <shape> on the <left|right>": 4 x 3 x 2 = 24 of them.
 * Held out: the 6 combinations with (colour + shape + side) % 4 == 0 never appear in training
 * (each colour-shape pair is still seen, at the other side), and the validation split is made of
 * them only: a generator must compose what it learned. Everything is deterministic in the seed. */
#ifndef MMC_IMAGE_DEMO_H
#define MMC_IMAGE_DEMO_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MMC_IMGDEMO_N_COMBOS 24   /* colours x shapes x sides */

typedef struct {
    int colour, shape, side;      /* mmc_synth indices; side 0 left, 1 right */
    char caption[64];
} mmc_imgdemo_caption;

/* Combination k in [0, 24): colour k / 6, shape (k / 2) % 3, side k % 2. */
void mmc_imgdemo_combo(int k, mmc_imgdemo_caption *c);
bool mmc_imgdemo_held_out(const mmc_imgdemo_caption *c);

typedef struct {
    const char *out_dir;
    int64_t n_train, n_val;
    int size;                 /* pixels, >= 16 */
    uint64_t seed;
    bool hold_out;            /* keep the 6 held-out combinations out of training (default true) */
} mmc_imgdemo_data_opts;

/* Write out_dir/train/{metadata.jsonl, images/NNNNNN.png} (file_name, text: what `mmc train` and
 * `mmc train-vae` read), out_dir/train_shuffled/metadata.jsonl (the same images, the captions in
 * a seeded permutation: the control) and out_dir/val.jsonl ({"caption", "colour", "shape",
 * "side", "seed"} per line: the prompts to generate, each with its own sampling seed). */
mmc_status mmc_imgdemo_write_data(const mmc_imgdemo_data_opts *o);

/* Judge generated images: val (val.jsonl), images_dir/val_NNNNNN.png (one per line). Pixel
 * statistics: the foreground (pixels brighter than half the brightest), its dominant palette
 * colour (nearest of synth's four, by count), its centroid's side, and a shape estimate: the
 * template fitted to its bounding box (square, inscribed circle, apex-up triangle) that overlaps
 * it best. Writes out_dir/judge.json
 * (the accuracies), out_dir/judge.jsonl (per image), out_dir/vlm_questions.jsonl (a colour and
 * a shape question per image in `mmc synth`'s words, images resized to 56 px under
 * out_dir/vlm/: `mmc eval --data` it with the understanding model) and grid_png (prompts above
 * images, a tick or cross per judged attribute). */
typedef struct {
    int64_t n;
    double colour, side, shape;   /* fractions of n that agree with the caption */
} mmc_imgdemo_judgement;
mmc_status mmc_imgdemo_judge(const char *val, const char *images_dir, const char *out_dir, const char *grid_png,
                             mmc_imgdemo_judgement *out);

#ifdef __cplusplus
}
#endif
#endif
