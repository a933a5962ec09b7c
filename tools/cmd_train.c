/* cmd_train.c — `mmc train RUN.yaml [--set key.path=value]... [--resume]`: read the run
 * config (mmc_config.h), build the trainer (mmc_trainer.h) and run it to training.steps,
 * writing checkpoints, metrics.jsonl, TensorBoard events and the loss plot to
 * training.output_dir. Exit codes: 0 done, 1 error (config, data, NaN, I/O), 2 usage (an
 * unknown option, no RUN.yaml, a --set without "="). */
#include "cli.h"
#include "mmc_config.h"
#include "mmc_trainer.h"

#include <stdlib.h>
#include <string.h>

void help_train(FILE *f) {
    fprintf(f,
            "usage: mmc train RUN.yaml [--set key.path=value]... [--resume] [--print-config]\n\n"
            "Train or fine-tune the model described by RUN.yaml (sections model, data, parallel,\n"
            "optimizer, training). Checkpoints go to training.output_dir/checkpoint-<step>/ as Hugging\n"
            "Face directories (+ trainer_state.json, optimizer.safetensors), written atomically.\n\n"
            "model.path (or model.init, a config.json to start from scratch) picks the family:\n"
            "  qwen2, qwen2_moe, llama, mistral (text); qwen2_vl, qwen2_5_vl, llava, internvl (vision-language);\n"
            "  qwen2_5_omni_thinker (text, audio, images); clip, siglip (contrastive, on an image-caption\n"
            "  JSONL); diffusers folders: Flux, SD3, SDXL / SD 1.x, Wan2.1, HunyuanDiT (flow matching or\n"
            "  DDPM, LoRA in diffusers' format; HunyuanDiT: PEFT's adapter on the transformer). See\n"
            "  examples/*.yaml and the README per family.\n\n"
            "options:\n"
            "  --set key.path=value  override a config value (repeatable), e.g. --set optimizer.lr=1e-4\n"
            "  --resume              continue from the latest complete checkpoint in output_dir\n"
            "                        (bit-identical to an uninterrupted run)\n"
            "  --max-image-pixels N  refuse image files with more pixels (sets data.max_image_pixels;\n"
            "                        default 178956970, PIL's decompression-bomb limit)\n"
            "  --print-config        list every config key with its meaning, then exit\n"
            "  -h, --help            this help\n\n"
            "outputs in training.output_dir:\n"
            "  checkpoint-<step>/    model (config.json, model.safetensors, tokenizer files), trainer state\n"
            "  metrics.jsonl         one JSON object per log step: step, loss, lr, grad_norm,\n"
            "                        tokens_per_s, samples_per_s, rss_mib, data_share\n"
            "  tb/                   TensorBoard event files (tensorboard --logdir OUTPUT_DIR/tb)\n"
            "  loss.png              loss and learning-rate plot (refreshed at each checkpoint)\n\n"
            "progress: a progress bar on a terminal, else one line per training.log_every steps.\n"
            "environment: OMP_NUM_THREADS (or training.threads) sets the CPU threads.\n\n"
            "example (examples/qwen2_vl_2b_full.yaml):\n"
            "  model:     {path: /models/Qwen2-VL-2B-Instruct, dtype: bf16, freeze: [vision_tower],\n"
            "              recompute: full}\n"
            "  data:      {train: data/train.jsonl, seq_len: 2048, batch_size: 16, micro_batch_size: 2}\n"
            "  optimizer: {type: adamw, lr: 2.0e-5, weight_decay: 0.01, schedule: cosine,\n"
            "              warmup_steps: 100, grad_clip: 1.0}\n"
            "  training:  {steps: 1000, seed: 42, log_every: 10, save_every: 500, keep_last: 3,\n"
            "              output_dir: runs/sft}\n");
}

int cmd_train(int argc, char **argv) {
    const char *file = NULL;
    bool resume = false;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    if (!sets) return cli_fail(MMC_ERR_OOM, "train: out of memory");
    int rc = CLI_USAGE;
    for (int i = 1; i < argc; i++) {
        int sr = cli_set_arg(argc, argv, &i, &sets[n_sets]);
        if (sr < 0) goto usage;
        if (sr > 0) n_sets++;
        else if (strcmp(argv[i], "--max-image-pixels") == 0) {
            static char set[64];
            const char *v = cli_value(argc, argv, &i);
            long long n;
            if (!v || !cli_int(argv[i - 1], v, 1, 1LL << 40, &n)) goto usage;
            snprintf(set, sizeof set, "data.max_image_pixels=%lld", n);
            sets[n_sets++] = set;
        } else if (strcmp(argv[i], "--resume") == 0) {
            resume = true;
        } else if (strcmp(argv[i], "--print-config") == 0) {
            printf("run config keys (mmc train RUN.yaml):\n");
            mmc_run_config_print_keys(stdout);
            free(sets);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_usage("train", "unknown option '%s'", argv[i]);
            goto usage;
        } else if (file) {
            cli_usage("train", "one run config expected, got '%s' and '%s'", file, argv[i]);
            goto usage;
        } else {
            file = argv[i];
        }
    }
    if (!file) {
        cli_usage("train", "missing RUN.yaml");
        goto usage;
    }
    mmc_run_config cfg;
    mmc_status st = mmc_run_config_load(file, sets, n_sets, &cfg);
    free(sets);
    if (st) return cli_fail(st, "train");
    mmc_trainer *t = NULL;
    if ((st = mmc_trainer_new(&cfg, resume, &t))) {
        rc = cli_fail(st, "train");
        mmc_run_config_free(&cfg);
        return rc;
    }
    bool lead = mmc_trainer_rank(t) == 0;
    /* (a CLIP / SigLIP run restores its step inside mmc_trainer_run and says so there) */
    if (resume && lead && mmc_trainer_step_count(t) > 0)
        fprintf(stderr, "mmc train: resumed at step %lld\n", (long long)mmc_trainer_step_count(t));
    st = mmc_trainer_run(t);
    rc = CLI_OK;
    if (st) rc = cli_fail(st, "train stopped at step %lld", (long long)mmc_trainer_step_count(t));
    else if (lead) fprintf(stderr, "mmc train: done, %lld steps; checkpoints in %s\n",
                 (long long)mmc_trainer_step_count(t), cfg.training.output_dir);
    mmc_trainer_free(t);
    mmc_run_config_free(&cfg);
    return rc;
usage:
    free(sets);
    return rc;
}
