/* mmc_data.h — the training data pipeline: datasets in the formats users already have,
 * samples rendered with the chat template shared with inference, and a multi-threaded,
 * deterministic, resumable loader that yields micro-batches ready for the model.
 *
 * Dataset formats (auto-detected per record, JSON array files and JSONL both):
 *  - LLaVA: {"image": "a.jpg" | [...], "conversations": [{"from": "human"|"gpt"|"system",
 *    "value": "<image>\nWhat is this?"}, ...]}  ("video" likewise with <video>)
 *  - LLaMA-Factory / MindSpeed-MM: {"messages": [{"role": "user", "content": "<image>Hi"}],
 *    "images": [...], "videos": [...]}
 *    Audio (Qwen2.5-Omni): "<audio>" tags with "audios": [...], or OpenAI parts
 *    {"type": "audio", "audio": "a.wav"}.
 *  - OpenAI: {"messages": [{"role": "user", "content": [{"type": "text", "text": ".."},
 *    {"type": "image", "image": "a.jpg"} | {"type": "image_url", "image_url": {"url": ..}} |
 *    {"type": "video", "video": "frames_dir"}]}]}
 * An optional "type" string per record is kept (evaluation reports accuracy by type).
 * Relative media paths are resolved against image_root (or the dataset file's directory when
 * image_root is unset); "file://" prefixes are stripped; images may also be inline
 * "data:image/...;base64,..." URLs; http(s) URLs are refused (download them first). A video is a file (MP4, MKV,
 * WebM, AVI, MOV, GIF ...: decoded through FFmpeg and sampled with the video processor's settings, as
 * `mmc generate --video` does) or a directory of frames (JPEG/PNG, sorted by name; every frame).
 *
 * A sample becomes tokens exactly as transformers' Qwen2VLProcessor would make them: the
 * Qwen2-VL chat template (mmc_chat_encode), then every <|image_pad|> / <|video_pad|> expanded
 * to grid_t*grid_h*grid_w / merge_size^2 copies; labels = ids on assistant tokens (the
 * content and its closing <|im_end|>), MMC_IGNORE_INDEX elsewhere.
 *
 * Batch layouts (mmc_batch):
 *  - padded: B rows (B <= micro_batch_size), right-padded to T = the longest row with pad_id;
 *    labels -100 on padding. Causal attention needs no mask for right padding (real tokens
 *    never see later pads). With length bucketing, windows of bucket_window samples are
 *    sorted by length and cut into micro-batches whose order is then shuffled (seeded).
 *  - packed: B == 1, one row of T = seq_len holding several samples back to back (greedy,
 *    in loader order: a sample that does not fit starts the next row); cu_seqlens gives their
 *    boundaries (block-diagonal causal attention); the tail is padding (pad_id, labels -100)
 *    and is NOT part of any segment: cu_seqlens[n_seqs] = number of real tokens <= T.
 *    The first label of every segment is -100, so no token is scored across a boundary.
 * labels[b, t] is the token expected at position t (HF convention: the model shifts, so
 * logits[:, t] are scored against labels[:, t + 1]); -100 is ignored (prompt, system, user
 * turns, vision placeholders, padding).
 * position_ids are left NULL by the loader: M-RoPE positions (t, h, w) depend on the vision
 * grids, so the model computes them per sample (per packed segment, restarting at 0 at each
 * cu_seqlens boundary) from input_ids + image/video_grid_thw, as transformers' get_rope_index
 * does. A producer may fill them; the model then uses them as given.
 */
#ifndef MMC_DATA_H
#define MMC_DATA_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_tokenizer.h"
#include "mmc_vlproc.h"
#include "mmc_video.h"
#include "mmc_audio.h"
#include "mmc_internvl.h"
#include "mmc_llava.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MMC_IGNORE_INDEX (-100)

typedef struct {
    int64_t B, T;
    int32_t *input_ids;        /* [B, T] */
    int32_t *labels;           /* [B, T], MMC_IGNORE_INDEX where not trained */
    int64_t *position_ids;     /* [3, B, T] M-RoPE positions (t, h, w), or NULL (see above) */
    int32_t *cu_seqlens;       /* packed: [n_seqs + 1], else NULL */
    int n_seqs;                /* packed: segments in the row; padded: B */
    int64_t *sample_ids;       /* [n_seqs] dataset index of each row / segment */
    /* vision inputs of all samples, in token order */
    float *pixel_values;       /* [n_patches, patch_dim] images */
    int64_t n_patches, patch_dim;
    int64_t *image_grid_thw;   /* [n_images, 3] */
    int n_images;
    float *video_values;       /* [n_video_patches, patch_dim] */
    int64_t n_video_patches;
    int64_t *video_grid_thw;   /* [n_videos, 3] */
    int n_videos;
    double *video_second_per_grid_ts; /* [n_videos] temporal_patch_size / sampled fps (Qwen2.5-VL
                                  time positions; a frame folder counts as 24 fps, as transformers) */
    /* Qwen2.5-Omni audio inputs of all samples, in token order (WhisperFeatureExtractor's
     * padded features and the feature_attention_mask's sums) */
    float *audio_feats;        /* [n_audios, audio_mels, audio_stride] */
    int64_t *audio_frames;     /* [n_audios] real frames of each */
    int n_audios;
    int64_t audio_mels, audio_stride;  /* stride: the longest clip's real frames (padding not kept) */
    int64_t n_tokens;          /* real (non-pad) tokens in the batch */
    int64_t n_label_tokens;    /* labels != -100 after the shift (what the loss averages over) */
    int64_t sample_index;      /* index of the first sample (for logging/resume) */
} mmc_batch;

void mmc_batch_free(mmc_batch *b);   /* frees every array, zeroes the struct */

/* ------------------------------------------------------------------ options
 * Field names equal the YAML keys of the `data:` section (mmc_data_cfg_fields is its
 * schema for mmc_cfg_read). Integers are int64_t, strings malloc'd (mmc_data_opts_free). */
typedef struct {
    char *train;               /* dataset file (JSON array or JSONL) */
    char *eval;                /* optional */
    char *image_root;          /* base for relative media paths (default: dataset's dir) */
    int64_t max_pixels;        /* 0: processor's value */
    int64_t min_pixels;        /* 0: processor's value */
    int64_t max_image_pixels;  /* refuse decoded images (and video frames) larger than this,
                                  checked on the file's header (0: MMC_IMAGE_MAX_PIXELS_DEFAULT,
                                  Pillow's decompression-bomb limit) */
    int64_t seq_len;           /* packed row length / truncation limit (default 2048) */
    bool packing;              /* default false */
    int64_t batch_size;        /* global batch in samples/rows (the trainer's; 0 = micro) */
    int64_t micro_batch_size;  /* rows per padded micro-batch (default 1) */
    int64_t num_workers;       /* preprocessing threads; 0 = on the caller's thread
                                  (default 2) */
    bool strict;               /* a missing/corrupt image fails the run instead of skipping */
    int64_t seed;              /* shuffling seed (default 42) */
    bool shuffle;              /* reshuffle every epoch (train split; default true) */
    bool truncation;           /* cut samples to seq_len (default true), else error */
    int64_t prefetch;          /* prepared samples queued ahead (default 4*workers+8) */
    int64_t bucket_window;     /* padded: samples sorted per window (0: 16*micro_batch; the
                                  window's prepared samples are held in memory) */
    bool add_vision_id;        /* "Picture k: " before images (chat template option) */
    char *processor;           /* optional preprocessor_config.json (or its directory) */
    int64_t audio_cache_mb;    /* audio features (real frames) kept in memory by the loader,
                                  MiB (default 1024; 0: none): each clip decoded once */
    mmc_qwen2vl_proc proc;     /* image/video processor (defaults, then `processor`, then
                                  min/max_pixels); videos given as frame folders use it */
    mmc_qwen2vl_video_proc vproc; /* video files: the model's video processor settings
                                  (mmc_video.h; defaults + 2 fps sampling when none) */
    /* not YAML keys: a LLaVA model's processing (LlavaProcessor) instead of Qwen2-VL's — images
     * through CLIPImageProcessor (one row of 3*S*S per image, image_grid_thw (1, 1, 1)), the
     * templated text tokenised with the tokenizer's special tokens (Llama's <s>), each <image>
     * (llava_image_id) expanded to llava_image_tokens copies */
    bool llava;
    mmc_clip_proc clip;
    int64_t llava_image_tokens;
    int32_t llava_image_id;
    /* not YAML keys: a Qwen2.5-Omni thinker's processing (Qwen2_5OmniProcessor): audios through
     * the WhisperFeatureExtractor `fe` (not owned), each <|AUDIO|> (omni_audio_id) expanded to
     * the audio encoder's token count, <|IMAGE|> / <|VIDEO|> (omni_image_id / omni_video_id) as
     * Qwen2-VL's pads; without omni, audio in a dataset is an error */
    bool omni;
    const mmc_whisper_fe *fe;
    int32_t omni_audio_id, omni_image_id, omni_video_id;
    /* not YAML keys: an InternVL model's processing (InternVLProcessor) — images through
     * iproc's dynamic tiling (one row of 3*s*s per tile, image_grid_thw (tiles, 1, 1)), the
     * template's <IMG_CONTEXT> (llava_image_id) becoming <img> (internvl_start),
     * llava_image_tokens x tiles <IMG_CONTEXT>, </img> (internvl_end); set with llava */
    bool internvl;
    mmc_internvl_proc iproc;
    int32_t internvl_start, internvl_end;
    /* OpenGVLab's InternVLChatModel (internvl_chat): its tokenizer's template takes string content, so each
     * message's parts are joined first, an image part becoming "<IMG_CONTEXT>\n" (chat()'s "<image>\n"
     * before its <img> ... </img> expansion) */
    bool internvl_chat;
    /* not YAML keys: a LLaVA-NeXT / OneVision model's processing (LlavaNextProcessor /
     * LlavaOnevisionProcessor) — images through nproc's anyres tiling (one row of 3*S*S per tile,
     * image_grid_thw (tiles, height, width)), each <image> expanded to nproc's count for the
     * image's size; set with llava */
    bool llava_next;
    mmc_llava_next_proc nproc;
    struct mmc_audio_cache *audio_cache; /* not a YAML key: the loader's (audio_cache_mb), or NULL */
    bool blank_media;          /* not a YAML key: every image / video frame replaced by a
                                  black one of the same size (mmc eval --blank-images) */
} mmc_data_opts;

void mmc_data_opts_default(mmc_data_opts *o);
void mmc_data_opts_free(mmc_data_opts *o);  /* frees the strings */
/* YAML schema of the `data:` section (terminated by key == NULL). */
extern const mmc_cfg_field mmc_data_cfg_fields[];

/* ------------------------------------------------------------------ datasets */
typedef struct mmc_dataset mmc_dataset;

/* Parse and validate a whole dataset file. Errors (naming file:line): missing file
 * (MMC_ERR_NOT_FOUND), empty dataset, malformed JSON, unknown record layout, a conversation
 * without an assistant turn, <image>/<video> placeholder counts that differ from the media
 * lists (both counts given), MMC_ERR_FORMAT otherwise. Media are not opened here. */
mmc_status mmc_dataset_load(const char *path, const char *image_root, mmc_dataset **out);
void mmc_dataset_free(mmc_dataset *ds);
int64_t mmc_dataset_size(const mmc_dataset *ds);
const char *mmc_dataset_path(const mmc_dataset *ds);

/* One record, normalised (pointers owned by the dataset). */
typedef enum { MMC_DATA_LLAVA = 0, MMC_DATA_SHAREGPT, MMC_DATA_OPENAI } mmc_data_format;
typedef struct {
    const mmc_chat_message *messages;  /* roles "system"/"user"/"assistant"; parts */
    int n_messages;
    const char *const *images;         /* resolved paths, in placeholder order */
    int n_images;
    const char *const *videos;         /* resolved frame directories */
    int n_videos;
    const char *const *audios;         /* resolved audio files (<audio> tags / audio parts) */
    int n_audios;
    const char *type;                  /* "type" field or NULL */
    const char *answer;                /* text of the last assistant message */
    int line;                          /* 1-based line in the file */
    mmc_data_format format;
} mmc_example;
void mmc_dataset_get(const mmc_dataset *ds, int64_t i, mmc_example *ex);

/* ------------------------------------------------------------------ one sample
 * Tokenise and preprocess sample i of ds into a B = 1 batch (padded layout, T = its length).
 * prompt_only: the messages before the last assistant turn, with the generation prompt
 * (for evaluation by generation); labels are then all -100.
 * Errors: media that cannot be read (naming the file), more than seq_len tokens with
 * truncation off ("sample N has 3120 tokens > seq_len 2048"). Thread-safe. */
mmc_status mmc_data_prepare(const mmc_data_opts *o, const mmc_tokenizer *tok,
                            const mmc_dataset *ds, int64_t i, bool prompt_only, mmc_batch *out);

/* ------------------------------------------------------------------ loader */
typedef enum { MMC_SPLIT_TRAIN = 0, MMC_SPLIT_EVAL = 1 } mmc_data_split;
typedef struct mmc_loader mmc_loader;

/* Where the loader is; saved with checkpoints. Restoring it makes the loader return exactly
 * the batches it would have returned next. */
typedef struct {
    int64_t epoch;
    int64_t position;          /* index in the epoch's order of the first sample not yet
                                  consumed (padded: first sample of the current window) */
    int64_t batch_in_window;   /* padded: batches of that window already returned */
    int64_t skipped;           /* skip counter */
} mmc_loader_state;

/* TRAIN: loops over epochs forever, reshuffled each epoch from (seed, epoch) with Philox.
 * EVAL: each sample of opts->eval once, in file order, padded batches of micro_batch_size
 * (no bucketing, no packing); after the last, mmc_loader_next returns a batch with B == 0.
 * The tokenizer must outlive the loader. */
mmc_status mmc_loader_new(const mmc_data_opts *opts, const mmc_tokenizer *tok, mmc_data_split split,
                          mmc_loader **out);
/* Same over an already loaded dataset (not owned; must outlive the loader). */
mmc_status mmc_loader_new_dataset(const mmc_data_opts *opts, const mmc_tokenizer *tok,
                                  const mmc_dataset *ds, mmc_data_split split, mmc_loader **out);
void mmc_loader_free(mmc_loader *l);
/* Next micro-batch into *out (previous contents are not freed: call mmc_batch_free). The
 * output is identical for any num_workers. Errors: a failed sample under strict, an
 * over-long sample with truncation off, every sample of an epoch skipped. */
mmc_status mmc_loader_next(mmc_loader *l, mmc_batch *out);
mmc_loader_state mmc_loader_state_get(const mmc_loader *l);
mmc_status mmc_loader_restore(mmc_loader *l, const mmc_loader_state *s);
int64_t mmc_loader_skipped(const mmc_loader *l);   /* samples skipped so far */
const mmc_dataset *mmc_loader_dataset(const mmc_loader *l);

#ifdef __cplusplus
}
#endif
#endif
