/* bench_train.c — training throughput of the trainer (mmc_trainer_step: forward, backward,
 * clipping, AdamW) on the language model of Qwen2-VL-2B at its real shapes (hidden 1536,
 * MLP 8960, 12 heads / 2 KV heads, vocab 151936, tied embeddings) with the layer count
 * reduced to 2 (stated in the case names), one row of 256 tokens, fp32. The vision tower is
 * the text-only cases. Each case runs in a forked child so that peak RSS is per case;
 * recompute off and on. Every case times MMC_BENCH_TRAIN{,_VL}_STEPS (default 5) steps after
 * one warm-up step and reports the median; memory is peak RSS minus the RSS when the case's
 * process starts (_peak_mem; the peer: after its imports, before the model) and that baseline
 * (_rss_baseline, for information).
 *
 * Qwen2-VL cases (train_qwen2vl2b_v2l2_448px_T512_*): the whole VL model at Qwen2-VL-2B
 * shapes (vision tower embed 1280, 16 heads, MLP 5120, patch 14, 2x2 merge into 1536; LM as
 * above) with the depth reduced to 2 vision blocks and 2 decoder layers (stated as v2l2 in the
 * names); one row of 512 tokens holding one 448x448 image (1024 patches -> 256 <|image_pad|>)
 * and text, labels on the 249 text tokens after the image; fp32. Cases: full training
 * (tokens/s, peak RSS, data share), the same with recompute (every vision block and decoder
 * layer checkpointed, as transformers' gradient_checkpointing_enable does), with recompute of
 * the decoder layers only (_recompute_lm_only: how much the vision blocks' recompute saves; no
 * peer), LoRA r=16 on the 7 LM projections, and QLoRA (NF4 base, double quant) with the same
 * adapters. MMC_BENCH_TRAIN_VL_MODES=full,recompute,recompute_lm_only,lora,qlora picks a subset.
 * Peer: bench/peer_train.py (transformers Qwen2ForCausalLM / Qwen2VLForConditionalGeneration
 * + torch.optim.AdamW, gradient checkpointing, PEFT LoRA, bitsandbytes NF4). */
#include "bench_util.h"
#include "mmc_config.h"
#include "mmc_trainer.h"
#include "train/trainer_internal.h"

#include <sys/wait.h>
#include <unistd.h>

#define LAYERS 2
#define SEQ 256

static const char *k_cfg =
    "{\"model_type\": \"qwen2\", \"hidden_size\": 1536, \"intermediate_size\": 8960,"
    " \"num_attention_heads\": 12, \"num_key_value_heads\": 2, \"num_hidden_layers\": %d,"
    " \"vocab_size\": 151936, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"max_position_embeddings\": 32768, \"tie_word_embeddings\": true}";

/* <prefix><tag>_peak_mem: peak RSS minus the baseline taken when the case's process started
 * (bench_mem_baseline; the peer's is after its imports), and <prefix><tag>_rss_baseline */
static void report_mem(char *name, size_t cap, const char *prefix, const char *tag, double base) {
    snprintf(name, cap, "%s%s_peak_mem", prefix, tag);
    bench_report(name, bench_peak_rss_mib() - base, "MiB", 0);
    snprintf(name, cap, "%s%s_rss_baseline", prefix, tag);
    bench_report_info(name, base, "MiB");
}

/* steps timed trainer steps after one warm-up step (grads and arenas allocated): the median
 * step time and that step's data-loading time */
static void time_steps(mmc_trainer *t, int steps, double *step_s, double *data_s) {
    mmc_step_stats s;
    if (mmc_trainer_step(t, &s)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    double st[64][2];
    if (steps > 64) steps = 64;
    if (steps < 1) steps = 1;
    for (int i = 0; i < steps; i++) {
        if (mmc_trainer_step(t, &s)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
        st[i][0] = s.step_s;
        st[i][1] = s.data_s;
    }
    qsort(st, (size_t)steps, sizeof st[0], bench_cmp_);   /* by step time (the first double) */
    *step_s = st[steps / 2][0];
    *data_s = st[steps / 2][1];
}

static void run_case(const char *cfg_path, bool recompute) {
    double base = bench_mem_baseline();
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {init: %s, recompute: %s}\n"
             "data: {train: synthetic, seq_len: %d, batch_size: 1, micro_batch_size: 1}\n"
             "optimizer: {lr: 1.0e-5, weight_decay: 0.01, grad_clip: 1.0}\n"
             "training: {steps: 100, output_dir: /tmp/mmc_bench_train}\n",
             cfg_path, recompute ? "full" : "none", SEQ);
    mmc_run_config cfg;
    if (mmc_run_config_parse(yaml, strlen(yaml), "bench", NULL, 0, &cfg)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    mmc_trainer *t;
    if (mmc_trainer_new(&cfg, false, &t)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    double med, data;
    time_steps(t, atoi(getenv("MMC_BENCH_TRAIN_STEPS") ? getenv("MMC_BENCH_TRAIN_STEPS") : "5"), &med, &data);
    char name[160];
    const char *tag = recompute ? "_recompute" : "";
    snprintf(name, sizeof name, "train_qwen2vl2b_lm_%dlayers_T%d%s_tokens_per_s", LAYERS, SEQ, tag);
    bench_report(name, SEQ / med, "tokens/s", 1);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "train_qwen2vl2b_lm_%dlayers_T%d", LAYERS, SEQ);
    report_mem(name, sizeof name, prefix, tag, base);
    if (!recompute) {
        snprintf(name, sizeof name, "train_qwen2vl2b_lm_%dlayers_T%d_data_share", LAYERS, SEQ);
        bench_report(name, 100.0 * data / med, "%", 0);
    }
    mmc_trainer_free(t);
    mmc_run_config_free(&cfg);
}

/* ------------------------------------------------------------------ Qwen2-VL cases */
#define VL_SEQ 512
#define VL_GRID 32                 /* 448 / 14 patches per side */
#define VL_IMG 151655
#define VL_VS 151652
#define VL_VE 151653
static const char *k_vl_cfg =
    "{\"model_type\": \"qwen2_vl\", \"image_token_id\": 151655, \"video_token_id\": 151656,"
    " \"vision_start_token_id\": 151652, \"vision_end_token_id\": 151653, \"tie_word_embeddings\": true,"
    " \"text_config\": {\"model_type\": \"qwen2_vl_text\", \"hidden_size\": 1536, \"intermediate_size\": 8960,"
    " \"num_attention_heads\": 12, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 151936,"
    " \"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 32768, \"tie_word_embeddings\": true,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, \"mrope_section\": [16, 24, 24]}},"
    " \"vision_config\": {\"model_type\": \"qwen2_vl_vision\", \"depth\": 2, \"embed_dim\": 1280, \"hidden_size\": 1536,"
    " \"num_heads\": 16, \"mlp_ratio\": 4, \"hidden_act\": \"quick_gelu\", \"in_channels\": 3, \"patch_size\": 14,"
    " \"spatial_merge_size\": 2, \"temporal_patch_size\": 2}}";

/* The fixed batch (same construction as peer_train.py's vl_batch: ids from a simple LCG). */
static int write_vl_batch(const char *path) {
    static int32_t ids[VL_SEQ], lab[VL_SEQ];
    const int64_t np = VL_GRID * VL_GRID, pd = 3 * 2 * 14 * 14, n_img = np / 4;
    uint64_t x = 12345;
    for (int t = 0; t < VL_SEQ; t++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[t] = (int32_t)((x >> 33) % 150000);
    }
    ids[5] = VL_VS;
    for (int64_t k = 0; k < n_img; k++) ids[6 + k] = VL_IMG;
    ids[6 + n_img] = VL_VE;
    for (int t = 0; t < VL_SEQ; t++) lab[t] = t > 6 + n_img ? ids[t] : -100;
    float *px = malloc((size_t)(np * pd) * sizeof(float));
    if (!px) return 1;
    for (int64_t i = 0; i < np * pd; i++) px[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
    int64_t grid[3] = {1, VL_GRID, VL_GRID};
    mmc_stw *w = mmc_stw_new();
    int rc = !w || mmc_stw_add_raw(w, "input_ids", MMC_I32, 2, MMC_SHAPE(1, VL_SEQ), ids) ||
             mmc_stw_add_raw(w, "labels", MMC_I32, 2, MMC_SHAPE(1, VL_SEQ), lab) ||
             mmc_stw_add_raw(w, "pixel_values", MMC_F32, 2, MMC_SHAPE(np, pd), px) ||
             mmc_stw_add_raw(w, "image_grid_thw", MMC_I64, 2, MMC_SHAPE(1, 3), grid) || mmc_stw_write(w, path);
    mmc_stw_free(w);
    free(px);
    return rc;
}

typedef enum { VL_FULL, VL_RECOMPUTE, VL_RECOMPUTE_LM, VL_LORA, VL_QLORA } vl_mode;
static const char *const k_vl_tags[] = {"", "_recompute", "_recompute_lm_only", "_lora", "_qlora"};

static void run_vl_case(const char *cfg_path, const char *batch, vl_mode mode) {
    double base = bench_mem_baseline();
    const char *const *tags = k_vl_tags;
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "model: {init: %s, recompute: %s%s%s}\n"
             "data: {train: %s, batch_size: 1, micro_batch_size: 1}\n"
             "optimizer: {lr: 1.0e-5, weight_decay: 0.01, grad_clip: 1.0}\n"
             "training: {steps: 100, output_dir: /tmp/mmc_bench_train}\n",
             cfg_path, mode == VL_RECOMPUTE || mode == VL_RECOMPUTE_LM ? "full" : "none",
             mode >= VL_LORA ? ", lora: {r: 16, alpha: 32, dropout: 0.0, targets: [q_proj, k_proj, v_proj, o_proj, "
                               "gate_proj, up_proj, down_proj]}" : "",
             mode == VL_QLORA ? ", quantization: {method: nf4, double_quant: true}" : "", batch);
    mmc_run_config cfg;
    if (mmc_run_config_parse(yaml, strlen(yaml), "bench", NULL, 0, &cfg)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    mmc_trainer *t;
    if (mmc_trainer_new(&cfg, false, &t)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    if (mode == VL_RECOMPUTE_LM) t->vl->visual->recompute = false;
    double med, data;
    time_steps(t, atoi(getenv("MMC_BENCH_TRAIN_VL_STEPS") ? getenv("MMC_BENCH_TRAIN_VL_STEPS") : "5"), &med, &data);
    char name[160];
    snprintf(name, sizeof name, "train_qwen2vl2b_v2l2_448px_T%d%s_tokens_per_s", VL_SEQ, tags[mode]);
    bench_report(name, VL_SEQ / med, "tokens/s", 1);
    report_mem(name, sizeof name, "train_qwen2vl2b_v2l2_448px_T512", tags[mode], base);
    if (mode == VL_FULL) {
        snprintf(name, sizeof name, "train_qwen2vl2b_v2l2_448px_T%d_data_share", VL_SEQ);
        bench_report(name, 100.0 * data / med, "%", 0);
    }
    mmc_trainer_free(t);
    mmc_run_config_free(&cfg);
}

static bool want(const char *filter, const char *name) {
    return !filter || strstr(name, filter) || strstr(filter, "train") || strstr(filter, ".");
}

int main(void) {
    const char *filter = getenv("MMC_BENCH_FILTER");
    mmc_set_num_threads(atoi(getenv("MMC_BENCH_THREADS") ? getenv("MMC_BENCH_THREADS") : "2"));
    /* MMC_BENCH_TRAIN_CASES=lm|vl|all (default all) */
    const char *cases = getenv("MMC_BENCH_TRAIN_CASES") ? getenv("MMC_BENCH_TRAIN_CASES") : "all";
    if (want(filter, "train_qwen2vl2b_v2l2") && strcmp(cases, "lm") != 0) {
        char cpath[] = "/tmp/mmc_bench_train_vlcfg_XXXXXX.json", bpath[] = "/tmp/mmc_bench_train_vlbatch_XXXXXX.safetensors";
        int fd = mkstemps(cpath, 5), fb = mkstemps(bpath, 12);
        if (fd < 0 || fb < 0) return 1;
        dprintf(fd, "%s", k_vl_cfg);
        close(fd);
        close(fb);
        if (write_vl_batch(bpath)) { fprintf(stderr, "bench_train: cannot write %s\n", bpath); return 1; }
        const char *modes = getenv("MMC_BENCH_TRAIN_VL_MODES");
        for (int m = VL_FULL; m <= VL_QLORA; m++) {
            if (modes) {   /* exact names in a comma-separated list */
                const char *tag = m == VL_FULL ? "full" : k_vl_tags[m] + 1;
                bool hit = false;
                for (const char *p = modes; *p && !hit; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ','))
                    hit = strcspn(p, ",") == strlen(tag) && !strncmp(p, tag, strlen(tag));
                if (!hit) continue;
            }
            pid_t pid = fork();
            if (pid == 0) { run_vl_case(cpath, bpath, (vl_mode)m); _exit(0); }
            int status;
            waitpid(pid, &status, 0);
        }
        unlink(cpath);
        unlink(bpath);
    }
    if (strcmp(cases, "vl") == 0) return 0;
    if (filter && !strstr("train_qwen2vl2b_lm", filter) && !strstr(filter, "train")) return 0;
    char path[] = "/tmp/mmc_bench_train_cfg_XXXXXX.json";
    int fd = mkstemps(path, 5);
    if (fd < 0) return 1;
    dprintf(fd, k_cfg, LAYERS);
    close(fd);
    for (int r = 0; r < 2; r++) {
        pid_t pid = fork();
        if (pid == 0) { run_case(path, r == 1); _exit(0); }
        int status;
        waitpid(pid, &status, 0);
    }
    unlink(path);
    return 0;
}
