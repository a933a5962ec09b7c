/* runner.h — what the inference subcommands (generate, chat, forward, eval) share: load
 * any supported model directory with its tokenizer and processor, and turn a chat with
 * images/videos into model inputs with the shared template and placeholder expansion. */
#ifndef MMC_RUNNER_H
#define MMC_RUNNER_H

#include "mmc_infer.h"
#include "mmc_models.h"
#include "mmc_tokenizer.h"
#include "mmc_vl.h"
#include "mmc_llava.h"
#include "mmc_internvl.h"
#include "mmc_vlproc.h"
#include "mmc_video.h"
#include "mmc_omni.h"
#include "mmc_audio.h"

typedef struct {
    char model_type[32];
    bool vl;                  /* vision-language model */
    mmc_qwen2 *lm;            /* text-only Qwen2 */
    mmc_qwen2_vl *vlm;        /* Qwen2-VL / Qwen2.5-VL */
    mmc_llava *llava;         /* LLaVA-1.5 (vl is false: no Qwen2-VL media path) */
    mmc_clip_proc cproc;      /* LLaVA's CLIPImageProcessor settings */
    mmc_llava_next_proc nproc; /* LLaVA-NeXT / OneVision's image processor (llava->variant != MMC_LLAVA_15) */
    mmc_internvl *internvl;   /* InternVL (HF-native; vl is false) */
    mmc_internvl_proc iproc;  /* its image processor / InternVLProcessor settings */
    mmc_omni *omni;           /* Qwen2.5-Omni thinker (vl is false; images and audio in its own path) */
    mmc_whisper_fe fe;        /* its feature extractor */
    bool omni_audio_in_video; /* --audio-in-video: the video's audio track goes with it (use_audio_in_video) */
    mmc_tokenizer *tok;
    mmc_qwen2vl_proc proc;
    int64_t max_image_pixels; /* refuse larger image files (0: MMC_IMAGE_MAX_PIXELS_DEFAULT) */
    double max_audio_seconds; /* refuse longer audio (0: the reader's MMC_AUDIO_MAX_SECONDS; the
                                 feature extractor's window bounds it further) */
    mmc_qwen2vl_video_proc vproc; /* the video processor's own settings (mmc_video.h) */
    int64_t vocab_size;
    char base_dir[4096];      /* where config.json and the weights came from */
    char adapter_dir[4096];   /* the LoRA adapter applied at inference, or "" */
    mmc_gen_config gen;       /* generation_config.json (adapter dir's copy first), resolved */
    const char *chat_tools;   /* the chat template's `tools` for the next prompt built (JSON array text;
                               * `mmc serve` sets it per request), or NULL */
} cli_model;

/* Load config.json, weights (zero-copy), tokenizer and (for VL) the image processor config
 * (mmc_qwen2vl_proc_load_dir: processor_config.json's "image_processor", else
 * preprocessor_config.json).
 * dir may be a PEFT LoRA adapter directory (a LoRA training checkpoint): its base model
 * (adapter_config.json's base_model_name_or_path) is loaded and the adapter applied in the
 * linears, no `mmc merge` needed; adapter (or NULL) names an adapter for the base in dir
 * (mmc_lora_resolve). Tokenizer and processor files are taken from the adapter directory
 * when it has them (a checkpoint's copies), else from the base. */
mmc_status cli_model_load(const char *dir, const char *adapter, cli_model *m);
void cli_model_free(cli_model *m);

typedef struct {
    int32_t *ids;             /* [n] expanded prompt */
    int64_t n;
    mmc_vlproc_out img, vid;  /* processor outputs (persistent tensors) */
    double second_per_grid_ts;/* the video's (Qwen2.5-VL temporal positions) */
    mmc_vl_media media;
    mmc_tensor *llava_pixels; /* LLaVA: [n_images, 3, S, S] (NeXT / OneVision: every tile) (persistent) or NULL */
    int64_t (*llava_sizes)[2];/* NeXT / OneVision: each image's (height, width) (malloc'd) */
    int llava_n_images;
    mmc_tensor *llava_video;  /* LLaVA-OneVision: a video's frames [F, 3, S, S] (persistent) or NULL */
    mmc_tensor *internvl_pixels; /* InternVL: the tiles of all images [n_tiles, 3, s, s] (persistent) or NULL */
    float **audio_feats;      /* Qwen2.5-Omni: per audio [n_mels, stride] (malloc'd) */
    mmc_omni_audio_in *audios;
    int n_audios;
    mmc_omni_media omni;
} cli_prompt;

/* Render msgs with the chat template (or take raw text), load + preprocess the images (in
 * the order their parts appear) and the video (a file, decoded and sampled with m->vproc, or
 * a folder of frames), expand the placeholders. */
mmc_status cli_prompt_build(cli_model *m, const mmc_chat_message *msgs, int n_msgs, bool raw,
                            const char *raw_text, const char *const *images, int n_images,
                            const char *video_dir, cli_prompt *p);
void cli_prompt_free(cli_prompt *p);
/* An audio attachment (Qwen2.5-Omni): a file, or encoded bytes in memory (WAV, MP3, ... as a
 * served request sends them; name is used in messages). */
typedef struct {
    const char *path;
    const void *data;
    size_t n_data;
    const char *name;
} cli_audio;
/* cli_prompt_build (chat template) with audio too: audios[i] goes with the i-th MMC_CHAT_AUDIO
 * part of msgs, decoded (mmc_audio_load*_max with m->max_audio_seconds) and turned into features. */
mmc_status cli_prompt_build_audio(cli_model *m, const mmc_chat_message *msgs, int n_msgs, const char *const *images,
                                  int n_images, const cli_audio *audios, int n_audios, const char *video_dir,
                                  cli_prompt *p);

/* The prompt options generate and forward share: --model, --adapter, --prompt, --system,
 * --image (repeatable), --audio (repeatable; Qwen2.5-Omni), --audio-in-video, --video, --raw, --max-image-pixels, and the video sampling overrides
 * --video-fps, --video-frames, --video-max-frames, --video-pixel-budget, and --image-backend. */
#define CLI_MAX_IMAGES 64
typedef struct {
    const char *model, *adapter, *prompt, *system, *video;
    const char *chat_template, *chat_template_name;   /* --chat-template FILE, --chat-template-name N */
    const char *images[CLI_MAX_IMAGES];
    int n_images;
    const char *audios[CLI_MAX_IMAGES];
    int n_audios;
    bool audio_in_video;      /* --audio-in-video (Qwen2.5-Omni) */
    bool raw;
    int64_t max_image_pixels; /* 0: the default (cli_model.max_image_pixels) */
    double video_fps;         /* > 0: sample this many frames per second */
    int video_frames, video_max_frames;   /* > 0: a fixed frame count / a cap */
    bool video_budget;        /* frames and size as qwen-vl-utils' fetch_video (smart_nframes, its budget) */
    mmc_vlproc_resize_mode resize_mode;   /* --image-backend: pil (the zero default) | torchvision */
} cli_prompt_args;
/* --image-backend V (generate, forward, chat): transformers' backend="pil" -> the Pillow-exact
 * resize, "torchvision" -> MMC_VLPROC_RESIZE_TORCH. 0, or a usage error (exit code 2) naming
 * the option. */
int cli_image_backend(const char *cmd, const char *v, mmc_vlproc_resize_mode *mode);
/* argv[*i] is one of those options: consume it (and its value) and return 1; not one of them:
 * return 0; a bad value: print why and return -1. cmd names the subcommand in messages. */
int cli_prompt_arg(const char *cmd, int argc, char **argv, int *i, cli_prompt_args *a);
/* After parsing: --model (or --adapter) and --prompt given, no --raw with images: 0, else print
 * the usage error and return CLI_USAGE. */
int cli_prompt_args_check(const char *cmd, const cli_prompt_args *a);
/* One user turn (images, then the video, then the text; with the system prompt if given)
 * -> model inputs, through cli_prompt_build. */
mmc_status cli_prompt_from_args(cli_model *m, const cli_prompt_args *a, cli_prompt *p);

/* --quantize MODE (generate, chat, serve): int8 | nf4 | none into *mode (an mmc_quant_mode);
 * 0, or a usage error (CLI_USAGE) naming the option. */
int cli_quantize_arg(const char *cmd, const char *v, int *mode);
/* Quantise the language model's decoder linears of a loaded model (mode from
 * cli_quantize_arg; none: nothing) and say on stderr what was quantised and the bytes saved.
 * Vision / audio towers, embeddings and lm_head stay as loaded. */
mmc_status cli_model_quantize(cli_model *m, int mode);
/* Inference: pre-pack the decoder's (and Qwen2-VL's tower's) linear weights for the GEMM
 * (mmc_qwen2_prepack / mmc_qwen2_vl_prepack; MMC_PREPACK=0 keeps them as loaded); after --quantize
 * and --bf16-matmul, which decide what is packed. MMC_VERBOSE=1 reports the count. */
mmc_status cli_model_prepack(cli_model *m);

#define CLI_QUANTIZE_HELP \
    "  --quantize int8|nf4      weight-only quantisation of the language model's linears at load:\n" \
    "                           int8 with one scale per output channel (8 + 32/K bits/weight) or\n" \
    "                           NF4 (4.5 bits/weight: blocks of 64); embeddings, lm_head and\n" \
    "                           vision towers stay as loaded; LoRA adapters apply on top\n" \
    "  --bf16-matmul            GEMMs on bf16 weights multiply in bf16 (activations rounded to\n" \
    "                           bf16, f32 accumulation, as PyTorch's bf16 matmul): AMX tiles where\n" \
    "                           the CPU has them, else AVX512_BF16; prefill several times faster on\n" \
    "                           AMX CPUs, logits ~1e-3 relative off the exact default (bf16 kept as\n" \
    "                           storage, f32 arithmetic); same as MMC_GEMM_BF16=dot\n" \
    CLI_MATMUL_PRECISION_HELP

/* --chat-template FILE (its text wins over the directory's templates) and/or
 * --chat-template-name NAME (one of several named templates); both may be NULL. */
mmc_status cli_model_set_template(cli_model *m, const char *file, const char *name);

/* Streaming printer for mmc_gen_opts.on_token: decodes the tokens so far and prints the new
 * suffix, holding back an incomplete UTF-8 sequence (the decoder shows it as U+FFFD until
 * the rest arrives). ids must hold max_new_tokens entries. */
typedef struct {
    const mmc_tokenizer *tok;
    int32_t *ids;
    int n;
    size_t printed;            /* bytes of the decoded text written so far */
    int prefix_off, read_off;  /* the incremental decode's window (see cli_stream_token) */
    bool print;
} cli_stream;
bool cli_stream_token(void *user, int32_t token);

/* Sampling and length options generate and chat share (--max-new-tokens, --temperature,
 * --top-k, --top-p, --min-p, --repetition-penalty, --seed, --greedy); < 0 = not given. */
typedef struct {
    double temperature, top_p, min_p, repetition_penalty;
    long long top_k, max_new, seed;
    bool greedy;
} cli_sampling;
#define CLI_SAMPLING_HELP \
    "  --max-new-tokens N       stop after N new tokens (default: generation_config.json's\n" \
    "                           max_new_tokens / max_length, else %d)\n" \
    "  --temperature T          sample with temperature T; 0 = greedy (default: greedy unless\n" \
    "                           generation_config.json sets do_sample, then its settings)\n" \
    "  --greedy                 greedy decoding whatever generation_config.json says\n" \
    "  --top-k K                keep the K most likely tokens (sampling; default: the model's, else 50)\n" \
    "  --top-p P                nucleus sampling mass (default: the model's, else 1 = off)\n" \
    "  --min-p P                drop tokens below P x the top probability (default: the model's, else off)\n" \
    "  --repetition-penalty R   HF repetition penalty, greedy or not (default: the model's, else 1 = off)\n" \
    "  --seed S                 sampling seed (default 0)\n"
void cli_sampling_init(cli_sampling *s);
/* argv[*i] is a sampling option: consume it (and its value), return 1; not one: 0; bad value: -1
 * (the reason printed). */
int cli_sampling_arg(const char *cmd, int argc, char **argv, int *i, cli_sampling *s);
/* Fill go's sampler, eos list (into eos [MMC_GEN_MAX_EOS]: generation_config.json's, else the
 * tokenizer's) and max_new_tokens (command line, else the file's, else def_max_new) the way
 * transformers resolves generate()'s arguments; returns max_new_tokens. */
int cli_sampling_resolve(const cli_model *m, const cli_sampling *s, long long def_max_new, int64_t n_prompt,
                         mmc_gen_opts *go, int32_t *eos);

/* Generation for a built prompt with the right model path. */
mmc_status cli_generate(cli_model *m, const cli_prompt *p, const mmc_gen_opts *opts, int32_t *out,
                        int *n_out);
#endif
