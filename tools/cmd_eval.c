/* cmd_eval.c — `mmc eval`: loss, perplexity and short-answer accuracy of a model on a chat
 * dataset, with predictions as JSONL (see include/mmc_eval.h). */
#include "cli.h"
#include "runner.h"
#include "mmc_embed.h"
#include "mmc_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void help_eval(FILE *f) {
    fprintf(f,
            "usage: mmc eval --model DIR --data FILE [options]\n"
            "       mmc eval --task retrieval --model DIR --data FILE [--image-root DIR] [--limit N] [--json]\n\n"
            "Evaluate the model in DIR on a chat dataset, read exactly as `mmc train` reads it (JSONL or\n"
            "a JSON array; LLaVA \"conversations\" + \"image\", LLaMA-Factory \"messages\" + \"images\"/\n"
            "\"videos\", or OpenAI content parts; auto-detected): the teacher-forced loss\n"
            "and perplexity over the assistant tokens, and the greedy answer to each sample\n"
            "scored by exact match and normalised match (lower case, no punctuation, no\n"
            "articles, number words -> digits). Samples with a \"type\" get accuracy by type.\n\n"
            "--task retrieval: zero-shot image <-> text retrieval of a dual encoder (a CLIPModel or\n"
            "SiglipModel folder, see mmc embed) on an image-caption JSONL, one {\"image\": PATH, \"caption\": TEXT} or\n"
            "{\"image\": PATH, \"captions\": [TEXT, ...]} per line: recall@1/5/10 image->text (any of\n"
            "the image's captions in its top K) and text->image (the caption's image in its top K), as\n"
            "clip_benchmark scores it. --out FILE writes each sample's ranks as JSONL.\n\n"
            "options:\n"
            "  --task T               chat (default) or retrieval\n"
            "  --model DIR            Hugging Face Qwen2-VL model directory (required; or a Qwen2.5-Omni\n"
            "                         thinker on records with \"audios\" / audio parts), or a LoRA\n"
            "                         adapter directory such as a LoRA training checkpoint (its\n"
            "                         base_model_name_or_path is loaded and the adapter applied)\n"
            "  --adapter DIR          apply this PEFT LoRA adapter to the model (no merge needed)\n"
            "  --data FILE            evaluation samples (required)\n"
            "  --image-root DIR       resolve relative image paths here (default: FILE's folder)\n"
            "  --out FILE             write one prediction per sample as JSONL\n"
            "  --max-new-tokens N     answer length cap (default 16)\n"
            "  --limit N              evaluate only the first N samples\n"
            "  --image-backend B      pil (default): Pillow-exact image resize; torchvision: the resize of\n"
            "                         transformers' default (fast) Qwen2-VL image processor\n"
            "  --max-image-pixels N   refuse image files with more pixels (default 178956970, PIL's\n"
            "                         decompression-bomb limit)\n"
            "  --blank-images         replace every image (and video frame) by a black one, and every\n"
            "                         audio by silence of its length (does the answer need it?)\n"
            "  --json                 print one JSON object {loss, perplexity, exact_match,\n"
            "                         normalized_match, samples, by_type, ...}\n"
            "  -h, --help             this help\n");
}

/* `mmc eval --task retrieval`: recall@K of a dual encoder (include/mmc_embed.h) */
static int eval_retrieval(const mmc_eval_opts *e, bool json) {
    mmc_retrieval_opts o = {.model_dir = e->model_dir, .data_path = e->data_path, .image_root = e->image_root,
                            .limit = e->limit, .max_image_pixels = e->max_image_pixels,
                            .image_backend = e->image_backend, .progress = json ? NULL : stderr};
    if (!o.model_dir) return cli_usage("eval", "--task retrieval needs --model DIR (a CLIPModel or SiglipModel folder)");
    if (e->adapter_dir || e->blank_images)
        return cli_usage("eval", "--adapter and --blank-images do not apply to --task retrieval");
    mmc_retrieval_result r;
    double t0 = mmc_now();
    mmc_status st = mmc_retrieval_eval(&o, &r);
    if (st != MMC_OK) return cli_fail(st, "retrieval eval failed");
    static const int K[3] = {1, 5, 10};
    if (e->out_path) {
        FILE *f = fopen(e->out_path, "w");
        if (!f) { mmc_retrieval_result_free(&r); return cli_fail(MMC_ERR_IO, "cannot write %s", e->out_path); }
        for (int64_t i = 0; i < r.images; i++)
            fprintf(f, "{\"image_index\": %lld, \"i2t_rank\": %lld}\n", (long long)i, (long long)r.i2t_rank[i]);
        for (int64_t j = 0; j < r.captions; j++)
            fprintf(f, "{\"caption_index\": %lld, \"t2i_rank\": %lld}\n", (long long)j, (long long)r.t2i_rank[j]);
        if (fclose(f) != 0) { mmc_retrieval_result_free(&r); return cli_fail(MMC_ERR_IO, "cannot write %s", e->out_path); }
    }
    if (json) {
        printf("{\"task\": \"retrieval\", \"images\": %lld, \"captions\": %lld", (long long)r.images,
               (long long)r.captions);
        for (int k = 0; k < 3; k++) printf(", \"image_to_text_recall@%d\": %.6f", K[k], r.i2t_recall[k]);
        for (int k = 0; k < 3; k++) printf(", \"text_to_image_recall@%d\": %.6f", K[k], r.t2i_recall[k]);
        printf("}\n");
    } else {
        printf("images            %lld, captions %lld, in %.1f s\n", (long long)r.images, (long long)r.captions,
               mmc_now() - t0);
        printf("                  R@1     R@5     R@10\n");
        printf("image -> text     %.4f  %.4f  %.4f\n", r.i2t_recall[0], r.i2t_recall[1], r.i2t_recall[2]);
        printf("text -> image     %.4f  %.4f  %.4f\n", r.t2i_recall[0], r.t2i_recall[1], r.t2i_recall[2]);
        if (e->out_path) printf("ranks             %s\n", e->out_path);
    }
    mmc_retrieval_result_free(&r);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    mmc_eval_opts o = {.max_new_tokens = 16};
    bool json = false, retrieval = false;
    long long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (strcmp(a, "--json") == 0) { json = true; continue; }
        if (strcmp(a, "--blank-images") == 0) { o.blank_images = true; continue; }
        if (!strcmp(a, "--model") || !strcmp(a, "--adapter") || !strcmp(a, "--data") || !strcmp(a, "--image-root") || !strcmp(a, "--out") ||
            !strcmp(a, "--max-new-tokens") || !strcmp(a, "--limit") || !strcmp(a, "--max-image-pixels") ||
            !strcmp(a, "--image-backend") || !strcmp(a, "--task")) {
            if (!(val = cli_value(argc, argv, &i))) return CLI_USAGE;
        } else return cli_usage("eval", "unknown option '%s'", a);
        if (!strcmp(a, "--task")) {
            if (strcmp(val, "retrieval") && strcmp(val, "chat"))
                return cli_usage("eval", "--task must be chat or retrieval, not '%s'", val);
            retrieval = strcmp(val, "retrieval") == 0;
        }
        else if (!strcmp(a, "--model")) o.model_dir = val;
        else if (!strcmp(a, "--adapter")) o.adapter_dir = val;
        else if (!strcmp(a, "--data")) o.data_path = val;
        else if (!strcmp(a, "--image-root")) o.image_root = val;
        else if (!strcmp(a, "--out")) o.out_path = val;
        else if (!strcmp(a, "--image-backend")) {
            mmc_vlproc_resize_mode m;
            if (cli_image_backend("eval", val, &m)) return CLI_USAGE;
            o.image_backend = (int)m;
        }
        else if (!strcmp(a, "--max-image-pixels")) { if (!cli_int(a, val, 1, 1LL << 40, &v)) return CLI_USAGE; o.max_image_pixels = v; }
        else if (!strcmp(a, "--max-new-tokens")) { if (!cli_int(a, val, 1, 4096, &v)) return CLI_USAGE; o.max_new_tokens = (int)v; }
        else { if (!cli_int(a, val, 1, (long long)1 << 40, &v)) return CLI_USAGE; o.limit = v; }
    }
    if ((!o.model_dir && !o.adapter_dir) || !o.data_path)
        return cli_usage("eval", "--model DIR and --data FILE are required");
    if (retrieval) return eval_retrieval(&o, json);
    o.progress = json ? NULL : stderr;
    mmc_eval_summary s;
    double t0 = mmc_now();
    mmc_status st = mmc_eval_run(&o, &s);
    if (st != MMC_OK) return cli_fail(st, "eval failed");
    if (json) {
        char *txt = mmc_eval_summary_json(&s);
        if (!txt) return cli_fail(MMC_ERR_OOM, "out of memory");
        printf("%s\n", txt);
        free(txt);
        return 0;
    }
    double loss = mmc_eval_loss(&s);
    printf("samples           %lld (%lld skipped) in %.1f s\n", (long long)s.samples, (long long)s.skipped, mmc_now() - t0);
    printf("loss              %.4f\nperplexity        %.4f\n", loss, exp(loss));
    if (s.samples) {
        printf("exact match       %.4f\nnormalised match  %.4f\n", (double)s.exact / s.samples,
               (double)s.normalized / s.samples);
        for (int t = 0; t < s.n_types; t++)
            printf("  %-14s  %.4f  (%lld samples)\n", s.type_name[t],
                   (double)s.type_normalized[t] / s.type_samples[t], (long long)s.type_samples[t]);
    }
    if (o.out_path) printf("predictions       %s\n", o.out_path);
    return 0;
}
