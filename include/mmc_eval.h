/* mmc_eval.h — evaluation of a (vision-)language model on a chat dataset: teacher-forced
 * loss and perplexity over the assistant tokens, greedy answers, and short-answer accuracy.
 *
 * Accuracy is reported two ways, as in VQA / SQuAD-style evaluations:
 *  - exact match: the prediction equals the reference after trimming surrounding whitespace;
 *  - normalised match: both sides lower-cased, punctuation removed, the articles a/an/the
 *    dropped, number words zero..twenty turned into digits, whitespace collapsed.
 * When samples carry a "type" field, accuracy (normalised) is also given per type.
 */
#ifndef MMC_EVAL_H
#define MMC_EVAL_H

#include "mmc.h"
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Normalised form of an answer (malloc'd; NULL on OOM). */
char *mmc_eval_normalize(const char *s);
bool mmc_eval_exact_match(const char *pred, const char *ref);
bool mmc_eval_normalized_match(const char *pred, const char *ref);

#define MMC_EVAL_MAX_TYPES 32
typedef struct {
    double nll_sum;        /* summed token NLL over assistant tokens */
    int64_t n_tokens;      /* scored tokens */
    int64_t samples, exact, normalized;
    int64_t skipped;       /* samples whose image could not be read */
    int n_types;
    char type_name[MMC_EVAL_MAX_TYPES][32];
    int64_t type_samples[MMC_EVAL_MAX_TYPES], type_exact[MMC_EVAL_MAX_TYPES],
        type_normalized[MMC_EVAL_MAX_TYPES];
} mmc_eval_summary;

/* Add one scored sample (type may be NULL). */
void mmc_eval_summary_add(mmc_eval_summary *s, const char *type, double nll_sum, int64_t n_tokens,
                          bool exact, bool normalized);
/* loss = nll_sum / n_tokens (token-weighted, like the training loss); NaN if no tokens. */
double mmc_eval_loss(const mmc_eval_summary *s);
/* One JSON object: {"loss", "perplexity", "exact_match", "normalized_match", "samples",
 * "tokens", "skipped", ["by_type": {type: normalised accuracy}, "by_type_exact": {...},
 * "by_type_samples": {...}]}. Non-finite numbers are written as null. malloc'd. */
char *mmc_eval_summary_json(const mmc_eval_summary *s);

typedef struct {
    const char *model_dir;    /* HF directory: config.json, safetensors, tokenizer; or a PEFT
                                 LoRA adapter directory (its base model + the adapter) */
    const char *adapter_dir;  /* LoRA adapter applied to model_dir's model, or NULL
                                 (mmc_lora_resolve: model_dir NULL -> the adapter's base) */
    const char *data_path;    /* JSONL (or a JSON array) of chat samples */
    const char *image_root;   /* relative image paths are resolved here (default: data dir) */
    const char *out_path;     /* predictions JSONL, or NULL */
    int max_new_tokens;       /* greedy answer length cap */
    bool blank_images;        /* replace every image by a black one of the same size */
    int64_t max_image_pixels; /* refuse larger image files (0: MMC_IMAGE_MAX_PIXELS_DEFAULT) */
    int image_backend;        /* an mmc_vlproc_resize_mode; 0 = MMC_VLPROC_RESIZE_PIL (default) */
    int64_t limit;            /* evaluate at most this many samples (0: all) */
    FILE *progress;           /* a progress line per sample batch, or NULL */
} mmc_eval_opts;

/* Evaluate; the summary is filled on success. Samples whose image is missing or corrupt
 * are skipped and counted; a malformed line is an error naming the file and line. */
mmc_status mmc_eval_run(const mmc_eval_opts *o, mmc_eval_summary *out);

#ifdef __cplusplus
}
#endif
#endif
