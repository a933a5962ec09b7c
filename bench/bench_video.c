/* bench_video.c — a video prompt's input side: a 30 s 720p H.264 clip (900 frames at 30 fps)
 * sampled at 2 fps (60 frames) through FFmpeg (keyframe seek, decode to the frame, RGB24), and
 * the Qwen2-VL video processor's defaults (smart_resize to <= 768*28*28 pixels, normalise,
 * patchify). Peer: bench/peer_video.py (transformers' video processor with its default decoder:
 * torchcodec when it loads, else transformers' load_video with PyAV).
 * The clip is written at bench time by the peer script (PyAV + libx264) into build/bench/.
 * CPU-seconds per clip go to stderr (getrusage: steadier than wall time on a shared host);
 * Cases: decode (decode + sample into frames), two_step (then mmc_qwen2vl_video_preprocess on
 * the kept frames), full (mmc_qwen2vl_video_load_preprocess: each frame resized and patchified
 * on its decoding thread, as mmc's CLI and data pipeline do; the row the peer's "full" is
 * compared with), floor (libavcodec alone on the frames the others decode: mmc_video_decode_only,
 * nothing converted or preprocessed; what no change on mmc's side can go below).
 * MMC_BENCH_VIDEO_CASE=decode|two_step|full|floor runs one case (e.g. under perf record). Each
 * case also prints how many frames the decoder produced for the sampled ones (MMC_VIDEO_SKIP=0:
 * every packet from each keyframe decoded, for comparison). */
#include "bench_util.h"
#include "mmc_video.h"

#include <sys/resource.h>
#include <unistd.h>

typedef struct {
    const char *path;
    mmc_qwen2vl_video_proc p;
    int mode;   /* 0 decode + sample, 1 then preprocess, 2 both fused (mmc_qwen2vl_video_load_preprocess),
                   3 the decoder alone (mmc_video_decode_only: the same frames decoded, nothing converted) */
} arg_t;

static int calls;
static int64_t decoded;   /* frames the decoder produced in the last call */

static void run(void *a_) {
    arg_t *a = a_;
    calls++;
    mmc_video_clip clip;
    if (a->mode == 3) {   /* the floor: libavcodec on exactly the frames a read decodes */
        mmc_video *v = NULL;
        int64_t *idx = NULL;
        int n = 0;
        MMC_CHECK(mmc_video_open(a->path, &v) == MMC_OK, "%s", mmc_last_error());
        const mmc_video_info *in = mmc_video_get_info(v);
        MMC_CHECK(mmc_qwen2vl_video_sample(&a->p, in->total_frames, in->fps, &idx, &n) == MMC_OK, "%s", mmc_last_error());
        MMC_CHECK(mmc_video_decode_only(v, idx, n) == MMC_OK, "%s", mmc_last_error());
        decoded = mmc_video_frames_decoded(v);
        free(idx);
        mmc_video_close(v);
        return;
    }
    if (a->mode == 2) {   /* the path mmc generate / forward / training take for a video file */
        mmc_vlproc_out o;
        MMC_CHECK(mmc_qwen2vl_video_load_preprocess(&a->p, a->path, &clip, &o) == MMC_OK, "%s", mmc_last_error());
        mmc_vlproc_out_free(&o);
        decoded = clip.frames_decoded;
        mmc_video_clip_free(&clip);
        return;
    }
    MMC_CHECK(mmc_qwen2vl_video_load(&a->p, a->path, &clip) == MMC_OK, "%s", mmc_last_error());
    decoded = clip.frames_decoded;
    if (a->mode == 1) {
        mmc_vlproc_out o;
        MMC_CHECK(mmc_qwen2vl_video_preprocess(&a->p, clip.frames, clip.n, &o) == MMC_OK, "%s", mmc_last_error());
        mmc_vlproc_out_free(&o);
    }
    mmc_video_clip_free(&clip);
}

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

int main(void) {
    const char *path = getenv("MMC_BENCH_VIDEO") ? getenv("MMC_BENCH_VIDEO") : "build/bench/video_30s_720p.mp4";
    if (access(path, R_OK) != 0) {
        const char *py = getenv("MMC_REF_PY") ? getenv("MMC_REF_PY") : ".venv-ref/bin/python";
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s bench/peer_video.py --make-clip %s", py, path);
        fprintf(stderr, "bench_video: writing %s (%s)\n", path, cmd);
        if (system(cmd) != 0 || access(path, R_OK) != 0) {
            fprintf(stderr, "bench_video: no clip (needs the reference venv with PyAV); skipped\n");
            return 0;
        }
    }
    arg_t a = {.path = path};
    mmc_qwen2vl_video_proc_default(&a.p);
    a.p.do_sample_frames = true;
    a.p.fps = 2;
    /* MMC_BENCH_VIDEO_CASE=decode|two_step|full|floor runs one case (for a profiler); the CPU-seconds per
     * clip (getrusage: user + system, every thread, warm-up call included) go to stderr */
    int wanted = 0;   /* the frames sampled */
    {
        mmc_video *v = NULL;
        int64_t *idx = NULL;
        MMC_CHECK(mmc_video_open(path, &v) == MMC_OK, "%s", mmc_last_error());
        const mmc_video_info *in = mmc_video_get_info(v);
        MMC_CHECK(mmc_qwen2vl_video_sample(&a.p, in->total_frames, in->fps, &idx, &wanted) == MMC_OK, "%s", mmc_last_error());
        free(idx);
        mmc_video_close(v);
    }
    const char *only = getenv("MMC_BENCH_VIDEO_CASE") ? getenv("MMC_BENCH_VIDEO_CASE") : "";
    const char *names[4] = {"video_decode_sample_30s_720p_h264_2fps", "video_qwen2vl_30s_720p_h264_2fps_two_step",
                            "video_qwen2vl_30s_720p_h264_2fps", "video_decoder_floor_30s_720p_h264_2fps"};
    const char *cases[4] = {"decode", "two_step", "full", "floor"};
    for (int c = 0; c < 4; c++) {
        if (*only && strcmp(only, cases[c]) != 0) continue;
        a.mode = c;
        calls = 0;
        double c0 = cpu_seconds();
        double t = bench_time(run, &a, 0, 3);
        fprintf(stderr, "bench_video: %s %.3f CPU-s per clip, %.3f s wall (median of %d), %lld frames decoded for %d\n",
                names[c], (cpu_seconds() - c0) / calls, t, calls - 1, (long long)decoded, wanted);
        if (c == 3) bench_report_info(names[c], 1.0 / t, "clips/s");   /* no peer: the bound on mmc's side */
        else bench_report(names[c], 1.0 / t, "clips/s", 1);
    }
    return 0;
}
