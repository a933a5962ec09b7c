/* bench_train.c — training throughput of the trainer (mmc_trainer_step: forward, backward,
 * clipping, AdamW) on the language model of Qwen2-VL-2B at its real shapes (hidden 1536,
 * MLP 8960, 12 heads / 2 KV heads, vocab 151936, tied embeddings) with the layer count
 * reduced to 2 (stated in the case names), one row of 256 tokens, fp32. The vision tower is
 * not in this build yet, so this is the text part of the VL model. Each case runs in a
 * forked child so that peak RSS is per case; recompute off and on.
 * Peer: bench/peer_train.py (transformers Qwen2ForCausalLM + torch.optim.AdamW). */
#include "bench_util.h"
#include "mmc_config.h"
#include "mmc_trainer.h"

#include <sys/wait.h>
#include <unistd.h>

#define LAYERS 2
#define SEQ 256

static const char *k_cfg =
    "{\"model_type\": \"qwen2\", \"hidden_size\": 1536, \"intermediate_size\": 8960,"
    " \"num_attention_heads\": 12, \"num_key_value_heads\": 2, \"num_hidden_layers\": %d,"
    " \"vocab_size\": 151936, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"max_position_embeddings\": 32768, \"tie_word_embeddings\": true}";

static void run_case(const char *cfg_path, bool recompute) {
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
    int steps = atoi(getenv("MMC_BENCH_TRAIN_STEPS") ? getenv("MMC_BENCH_TRAIN_STEPS") : "3");
    mmc_step_stats s;
    mmc_trainer_step(t, &s);   /* warm-up: grads and arenas allocated */
    double best = 1e30, data = 0;
    for (int i = 0; i < steps; i++) {
        mmc_trainer_step(t, &s);
        if (s.step_s < best) { best = s.step_s; data = s.data_s; }
    }
    char name[160];
    const char *tag = recompute ? "_recompute" : "";
    snprintf(name, sizeof name, "train_qwen2vl2b_lm_%dlayers_T%d%s_tokens_per_s", LAYERS, SEQ, tag);
    bench_report(name, SEQ / best, "tokens/s", 1);
    snprintf(name, sizeof name, "train_qwen2vl2b_lm_%dlayers_T%d%s_peak_rss", LAYERS, SEQ, tag);
    bench_report(name, bench_peak_rss_mib(), "MiB", 0);
    if (!recompute) {
        snprintf(name, sizeof name, "train_qwen2vl2b_lm_%dlayers_T%d_data_share", LAYERS, SEQ);
        bench_report(name, 100.0 * data / best, "%", 0);
    }
    mmc_trainer_free(t);
    mmc_run_config_free(&cfg);
}

int main(void) {
    const char *filter = getenv("MMC_BENCH_FILTER");
    if (filter && !strstr("train_qwen2vl2b_lm", filter) && !strstr(filter, "train")) return 0;
    mmc_set_num_threads(atoi(getenv("MMC_BENCH_THREADS") ? getenv("MMC_BENCH_THREADS") : "2"));
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
