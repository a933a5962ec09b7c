/* mmc_video.h — video files (MP4, MKV, WebM, AVI, MOV, GIF ...) through FFmpeg, and the
 * Qwen2-VL video processor (frame sampling, its own settings, preprocessing).
 *
 * Decoding mirrors what transformers' video backends give: frame i is the i-th frame in
 * presentation order, converted to RGB24 by libswscale with PyAV's defaults (bilinear flags,
 * the frame's colour space and range), so a lossless file decodes to the same bytes as
 * PyAV's frame.to_ndarray(format="rgb24"). Frames are fetched by seeking to the keyframe
 * before each wanted one and decoding forward to its timestamp (with several OpenMP threads,
 * keyframe segments side by side, a reader per thread: the same bytes); containers whose
 * timestamps cannot be trusted are decoded from the start. Sampling mirrors Qwen2VLVideoProcessor's
 * sample_frames; settings are read with transformers' precedence (processor_config.json's
 * "video_processor", then video_preprocessor_config.json, then preprocessor_config.json).
 */
#ifndef MMC_VIDEO_H
#define MMC_VIDEO_H

#include "mmc_image.h"
#include "mmc_vlproc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_video mmc_video;

typedef struct {
    int64_t total_frames;  /* the header's frame count (PyAV stream.frames), else counted by demuxing */
    double fps;            /* average frame rate (PyAV average_rate); 0 when the file has none */
    int width, height;
    char codec[32];        /* FFmpeg decoder name, e.g. "h264" */
    char container[32];    /* FFmpeg demuxer name, e.g. "matroska,webm" (first name) */
    bool seekable;         /* frames are fetched by keyframe seek (else decoded from the start) */
} mmc_video_info;

/* Largest decode this module will do: frames x width x height (RGB24: x3 bytes). Beyond it
 * mmc_video_read refuses with a message saying how to sample fewer frames. */
#define MMC_VIDEO_MAX_TOTAL_PIXELS (1LL << 31)

/* Open a file (or, _mem, a buffer that must outlive the handle; `name` is used in messages)
 * and read its metadata: the demuxer is run over every packet once to learn frame timestamps
 * and keyframes (no decoding). Fails, naming the file, on anything that is not a decodable
 * video stream with at least one frame. */
mmc_status mmc_video_open(const char *path, mmc_video **out);
mmc_status mmc_video_open_mem(const void *data, size_t len, const char *name, mmc_video **out);
const mmc_video_info *mmc_video_get_info(const mmc_video *v);
/* Decode frames idx[0..n) (ascending, each < total_frames) into frames[n] (RGB, owned by the
 * caller: mmc_image_free each). On failure nothing is left allocated. */
mmc_status mmc_video_read(mmc_video *v, const int64_t *idx, int n, mmc_image *frames);
/* The same frames, each handed to fn(ctx, worker, k, rgb) on the thread that decoded it, as soon
 * as it is decoded, instead of being kept: rgb (the file's size) is the reader's own buffer,
 * valid during the call only. Calls for different k may run at once on different threads,
 * worker in [0, mmc_video_read_workers()) telling them apart (one worker runs one call at a
 * time); each k is handed over once, in no set order. A non-zero status from fn stops the
 * read and is returned. */
typedef mmc_status (*mmc_video_frame_fn)(void *ctx, int worker, int k, const mmc_image *rgb);
mmc_status mmc_video_read_each(mmc_video *v, const int64_t *idx, int n, mmc_video_frame_fn fn, void *ctx);
/* The number of workers mmc_video_read_each may call fn from, when called from this thread now
 * (OpenMP's thread count outside a parallel region, 1 inside one). */
int mmc_video_read_workers(void);
/* Skipping (on by default; MMC_VIDEO_SKIP=0 in the environment turns it off at open): frames no
 * other frame refers to are not decoded unless wanted, and decoding stops at the last wanted
 * frame of a keyframe segment. Off, every packet from the keyframe on is decoded; the frames
 * read are the same either way. */
void mmc_video_set_skipping(mmc_video *v, bool on);
/* Frames the decoder has produced since open, over every decoding thread (skipped ones not
 * counted): what skipping saved. */
int64_t mmc_video_frames_decoded(const mmc_video *v);
/* Decode what mmc_video_read(v, idx, n, ...) decodes, the same way (seeks, skipping, threads),
 * and convert or keep nothing: the decoder's own share of a read (bench_video's floor). */
mmc_status mmc_video_decode_only(mmc_video *v, const int64_t *idx, int n);
void mmc_video_close(mmc_video *v);

/* ---------------------------------------------------------------- Qwen2-VL video processor */
typedef struct {
    mmc_qwen2vl_proc proc;    /* patch/merge/temporal sizes, mean/std, rescale, do_* flags; the
                                 pixel bounds are video_min_pixels / video_max_pixels */
    bool do_sample_frames;    /* transformers' default false: every frame */
    double fps;               /* frames per second to sample (0: unset) */
    int num_frames;           /* fixed frame count (0: unset); exclusive with fps */
    int min_frames, max_frames; /* 4, 768 */
    bool cap_pixels_per_frame;  /* qwen-vl-utils' total pixel budget (transformers opt-in) */
    int64_t max_video_tokens;   /* 128000: the budget is 90% of this many tokens' pixels */
    bool qwen_vl_utils;         /* frames and size as qwen-vl-utils' fetch_video (the CLI's
                                   --video-pixel-budget): smart_nframes, round(linspace) indices,
                                   its float total-pixel share; see mmc_qwen_vl_utils_size */
} mmc_qwen2vl_video_proc;

/* Qwen2VLVideoProcessor's defaults: size {shortest_edge 128*28*28, longest_edge 28*28*768},
 * patch 14, merge 2, temporal 2, CLIP mean/std, bicubic, min_frames 4, max_frames 768, no
 * sampling. */
void mmc_qwen2vl_video_proc_default(mmc_qwen2vl_video_proc *p);
/* mmc's sampling when the settings ask for none (transformers then decodes every frame):
 * 2 frames per second, qwen-vl-utils' default, unless a frame count is set. The CLI and the
 * data pipeline apply it after reading the settings. */
void mmc_qwen2vl_video_sampling_default(mmc_qwen2vl_video_proc *p);
/* Settings from a model directory in transformers' precedence: processor_config.json's
 * "video_processor" object, else video_preprocessor_config.json, else preprocessor_config.json
 * (the image processor's file, read as the video processor's over the video defaults, as
 * AutoVideoProcessor does). No file: the defaults. Errors name the file and key. */
mmc_status mmc_qwen2vl_video_proc_load_dir(const char *dir, mmc_qwen2vl_video_proc *p);
/* One settings file (a processor_config.json with "video_processor", or a flat file). */
mmc_status mmc_qwen2vl_video_proc_load(const char *path, mmc_qwen2vl_video_proc *p);

/* Qwen2VLVideoProcessor.sample_frames: with num_frames, that count rounded to a multiple of
 * temporal_patch_size; with fps, total/video_fps*fps clamped to [min_frames, min(max_frames,
 * total)] and floored to a multiple of temporal_patch_size; then indices
 * int32(arange(0, total, total/num)) (float32 steps, as torch); without either every frame.
 * *idx is malloc'd. Fails with the reason transformers gives (and what to change). */
mmc_status mmc_qwen2vl_video_sample(const mmc_qwen2vl_video_proc *p, int64_t total_frames, double video_fps,
                                    int64_t **idx, int *n);
/* With p->qwen_vl_utils set, mmc_qwen2vl_video_sample is qwen-vl-utils' smart_nframes (num_frames
 * as its "nframes", else fps with min_frames ceiled and max_frames floored to FRAME_FACTOR 2)
 * and round(torch.linspace(0, total - 1, nframes)) in float32; this is the size fetch_video
 * resizes n frames of HxW to: smart_resize (its own: float bounds, no floor at `factor`) within
 * [video_min_pixels, min(video_max_pixels, max(min(768 * factor^2, total_pixels / n * 2),
 * int(1.05 * video_min_pixels)))], total_pixels = max_video_tokens * factor^2 * 0.9. */
mmc_status mmc_qwen_vl_utils_size(const mmc_qwen2vl_video_proc *p, int height, int width, int n, int *out_h, int *out_w);

/* Qwen2VLVideoProcessor._preprocess on frames of equal size (the fast, torchvision backend):
 * smart_resize within the video bounds (and the per-frame share of the total budget when
 * cap_pixels_per_frame; with qwen_vl_utils, mmc_qwen_vl_utils_size and fetch_video's float
 * resize rounded to uint8), torch's uint8 antialiased resize (mmc_image_resize_torch_u8), fused
 * rescale+normalise ((x - mean*255) / (std*255) in float32), temporal padding, patchify. */
mmc_status mmc_qwen2vl_video_preprocess(const mmc_qwen2vl_video_proc *p, const mmc_image *frames, int n,
                                        mmc_vlproc_out *out);

/* A decoded, sampled video ready for the model. */
typedef struct {
    mmc_image *frames;        /* [n] */
    int n;
    int64_t *indices;         /* [n] frame indices in the file */
    mmc_video_info info;
    double second_per_grid_ts;/* temporal_patch_size / sampled fps (Qwen2.5-VL time positions) */
    int64_t frames_decoded;   /* frames the decoder produced to get them (mmc_video_frames_decoded) */
} mmc_video_clip;
/* Open, sample with p's settings and decode. */
mmc_status mmc_qwen2vl_video_load(const mmc_qwen2vl_video_proc *p, const char *path, mmc_video_clip *out);
void mmc_video_clip_free(mmc_video_clip *c);
/* mmc_qwen2vl_video_load then mmc_qwen2vl_video_preprocess, the same pixel values bit for bit,
 * without keeping the decoded frames: each is resized and patchified on the thread that
 * decoded it, as it comes, into the output rows. clip gets the indices, info and
 * second_per_grid_ts (frames NULL, n set); free it with mmc_video_clip_free, out with
 * mmc_vlproc_out_free. */
mmc_status mmc_qwen2vl_video_load_preprocess(const mmc_qwen2vl_video_proc *p, const char *path, mmc_video_clip *clip,
                                             mmc_vlproc_out *out);

/* ---------------------------------------------------------------- writing (src/io/video_write.c)
 * frames uint8 RGB [F, H, W, 3] -> an MP4 (H.264 through libx264 when libavcodec has it, yuv420p,
 * else MPEG-4 part 2; the log says which), a lossless FFV1 .mkv, a GIF (FFmpeg's gif encoder on a palette of the
 * clip's own colours), or a folder of PNG frames (frame_00000.png ...; lossless). Files are
 * written to a temporary name beside the target and renamed into place, so a reader never
 * sees half a file. fps, and the comment / encoder settings, go into the container metadata
 * (for a PNG folder: a settings.json beside the frames). */
typedef enum {
    MMC_VIDEO_OUT_AUTO,       /* from the path: .gif -> GIF, .mp4/.mov/.m4v -> MP4 (H.264), .mkv ->
                                 lossless FFV1, a trailing '/' or an existing directory -> PNG folder */
    MMC_VIDEO_OUT_MP4,
    MMC_VIDEO_OUT_GIF,
    MMC_VIDEO_OUT_PNG_DIR,
    MMC_VIDEO_OUT_MKV_FFV1    /* Matroska of FFV1 on RGB words: lossless, pixels come back exactly */
} mmc_video_out_format;

typedef struct {
    mmc_video_out_format format;
    int crf;                  /* H.264 constant rate factor 0..51 (0 -> 18 here; lower = better) */
    bool pad_odd;             /* yuv420p needs even sizes: pad an odd height / width by repeating the
                                 last row / column (else odd sizes are an error saying so) */
    const char *comment;      /* container "comment" tag (e.g. prompt, seed, steps), or NULL */
    const char *title;        /* container "title" tag, or NULL */
    bool quiet;               /* no line on stderr naming the encoder used */
} mmc_video_write_opts;

/* Write frames [n_frames, height, width, 3] (RGB, row-major) at fps frames per second. opts may be
 * NULL (AUTO format, defaults). Errors name the path and the reason (unwritable directory, zero or
 * odd sizes without pad_odd, a format libavcodec cannot encode here). */
mmc_status mmc_video_write(const char *path, const uint8_t *rgb, int n_frames, int height, int width, double fps,
                           const mmc_video_write_opts *opts);
/* Name of the encoder an MP4 would be written with here ("libx264" or "mpeg4"). */
const char *mmc_video_write_mp4_encoder(void);
/* A decoded clip x [3, F, H, W] in [-1, 1] (a video VAE's output, channel-first) -> RGB frames
 * rgb [F, H, W, 3] as diffusers hands them to export_to_video: x / 2 + 0.5 clamped to [0, 1] in f32
 * (VideoProcessor.postprocess_video), then uint8(x * 255), truncated (export_to_video's astype). */
void mmc_video_frames_to_rgb(const float *x, int n_frames, int height, int width, uint8_t *rgb);

#ifdef __cplusplus
}
#endif
#endif /* MMC_VIDEO_H */
