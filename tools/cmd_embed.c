/* cmd_embed.c — `mmc embed`: L2-normalised image and text embeddings of a dual encoder (CLIP,
 * SigLIP; include/mmc_embed.h), and their similarity matrix when both kinds are given (for SigLIP
 * also its sigmoid probabilities). */
#include "cli.h"
#include "runner.h"
#include "mmc_embed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void help_embed(FILE *f) {
    fprintf(f,
            "usage: mmc embed --model DIR (--image FILE | --text TEXT)... [options]\n\n"
            "Embed images and texts with the dual encoder in DIR (a CLIPModel or SiglipModel folder as\n"
            "transformers saves it: config.json, safetensors, tokenizer, image processor) into its shared\n"
            "space, as get_image_features / get_text_features followed by the L2 normalisation the\n"
            "model's forward applies. CLIP: images through the folder's CLIPImageProcessor, texts through\n"
            "its tokenizer (truncated to 77 tokens). SigLIP: SiglipImageProcessor, and SiglipTokenizer\n"
            "(spiece.model) with padding=\"max_length\" to 64 tokens, as the model card calls it. With\n"
            "both images and texts, also logits_per_image = exp(logit_scale) * image_embeds @\n"
            "text_embeds^T (+ logit_bias for SigLIP) and, for SigLIP, probs = sigmoid(logits_per_image)\n"
            "(each image-text pair on its own, not a softmax over the texts).\n\n"
            "options:\n"
            "  --model DIR            the CLIPModel / SiglipModel folder, or a LoRA checkpoint of one (required)\n"
            "  --image FILE           a JPEG or PNG to embed (repeatable; kept in order)\n"
            "  --text TEXT            a text to embed (repeatable)\n"
            "  --json                 one JSON object: {model, family, dim, logit_scale, logit_bias, images:\n"
            "                         [{file, embedding}], texts: [{text, embedding}], logits_per_image,\n"
            "                         probs (SigLIP)}\n"
            "                         (default: one line per input, \"image|text<TAB>name<TAB>values\",\n"
            "                         then the similarity table)\n"
            "  --image-backend B      pil (default): Pillow-exact resize; torchvision: the resize of\n"
            "                         transformers' default (fast) CLIPImageProcessor\n"
            "  --max-image-pixels N   refuse image files with more pixels (default 178956970)\n"
            "  -h, --help             this help\n\n"
            "See also: mmc eval --task retrieval (recall@K on an image-caption JSONL).\n");
}

static void print_vec(const float *v, int64_t D, bool json) {
    for (int64_t k = 0; k < D; k++) printf(json ? "%s%.9g" : "%s%.7g", k ? (json ? ", " : " ") : "", v[k]);
}

int cmd_embed(int argc, char **argv) {
    const char *model = NULL;
    const char **imgs = calloc((size_t)argc, sizeof *imgs), **texts = calloc((size_t)argc, sizeof *texts);
    int n_img = 0, n_txt = 0, rc = CLI_OK;
    bool json = false;
    long long maxpx = 0;
    mmc_vlproc_resize_mode mode = MMC_VLPROC_RESIZE_PIL;
    mmc_dual_encoder *m = NULL;
    mmc_image *im = NULL;
    float *ie = NULL, *te = NULL;
    if (!imgs || !texts) { rc = cli_fail(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (strcmp(a, "--model") && strcmp(a, "--image") && strcmp(a, "--text") && strcmp(a, "--image-backend") &&
            strcmp(a, "--max-image-pixels")) { rc = cli_usage("embed", "unknown option '%s'", a); goto done; }
        if (!(val = cli_value(argc, argv, &i))) { rc = CLI_USAGE; goto done; }
        if (!strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "--image")) imgs[n_img++] = val;
        else if (!strcmp(a, "--text")) texts[n_txt++] = val;
        else if (!strcmp(a, "--image-backend")) { if (cli_image_backend("embed", val, &mode)) { rc = CLI_USAGE; goto done; } }
        else if (!cli_int(a, val, 1, 1LL << 40, &maxpx)) { rc = CLI_USAGE; goto done; }
    }
    if (!model || n_img + n_txt == 0) {
        rc = cli_usage("embed", "--model DIR and at least one --image FILE or --text TEXT are required");
        goto done;
    }
    mmc_status st = mmc_dual_encoder_load(model, &m);
    if (st) { rc = cli_fail(st, "cannot load %s", model); goto done; }
    mmc_dual_encoder_image_proc(m)->resize_mode = mode;
    const int64_t D = mmc_dual_encoder_dim(m);
    ie = malloc((size_t)(n_img * D + 1) * sizeof *ie);
    te = malloc((size_t)(n_txt * D + 1) * sizeof *te);
    im = calloc((size_t)n_img + 1, sizeof *im);
    if (!ie || !te || !im) { rc = cli_fail(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (maxpx) io.max_pixels = maxpx;
    for (int i = 0; i < n_img; i++)
        if ((st = mmc_image_load(imgs[i], &io, &im[i]))) { rc = cli_fail(st, "cannot read image"); goto done; }
    if (n_img && (st = mmc_dual_encoder_embed_images(m, im, n_img, ie))) { rc = cli_fail(st, "image embedding failed"); goto done; }
    if (n_txt && (st = mmc_dual_encoder_embed_texts(m, texts, n_txt, te))) { rc = cli_fail(st, "text embedding failed"); goto done; }
    const double scale = mmc_dual_encoder_logit_scale(m), bias = mmc_dual_encoder_logit_bias(m);
    const bool sig = mmc_dual_encoder_sigmoid(m);
    if (json) {
        printf("{\"model\": ");
        mmc_json_write_string(stdout, model);
        printf(", \"family\": \"%s\", \"dim\": %lld, \"logit_scale\": %.9g, \"logit_bias\": %.9g,\n \"images\": [",
               mmc_dual_encoder_family(m), (long long)D, scale, bias);
        for (int i = 0; i < n_img; i++) {
            printf("%s{\"file\": ", i ? ",\n  " : "");
            mmc_json_write_string(stdout, imgs[i]);
            printf(", \"embedding\": [");
            print_vec(ie + i * D, D, true);
            printf("]}");
        }
        printf("],\n \"texts\": [");
        for (int j = 0; j < n_txt; j++) {
            printf("%s{\"text\": ", j ? ",\n  " : "");
            mmc_json_write_string(stdout, texts[j]);
            printf(", \"embedding\": [");
            print_vec(te + j * D, D, true);
            printf("]}");
        }
        printf("]");
    } else {
        for (int i = 0; i < n_img; i++) { printf("image\t%s\t", imgs[i]); print_vec(ie + i * D, D, false); printf("\n"); }
        for (int j = 0; j < n_txt; j++) { printf("text\t%s\t", texts[j]); print_vec(te + j * D, D, false); printf("\n"); }
    }
    if (n_img && n_txt) {
        float *lg = malloc((size_t)n_img * (size_t)n_txt * sizeof *lg);
        if (!lg) { rc = cli_fail(MMC_ERR_OOM, "out of memory"); goto done; }
        mmc_dual_encoder_logits(m, ie, n_img, te, n_txt, lg);
        for (int pass = 0; pass < (sig ? 2 : 1); pass++) {
            if (json) printf(",\n \"%s\": [", pass ? "probs" : "logits_per_image");
            else if (pass) printf("probs = sigmoid(logits_per_image) (rows: images, columns: texts)\n");
            else if (sig) printf("logits_per_image (exp(logit_scale) = %.6g, logit_bias = %.6g; rows: images, columns: "
                                 "texts)\n", scale, bias);
            else printf("logits_per_image (exp(logit_scale) = %.6g; rows: images, columns: texts)\n", scale);
            for (int i = 0; i < n_img; i++) {
                if (json) printf("%s[", i ? ", " : "");
                for (int j = 0; j < n_txt; j++) {
                    const float l = lg[(int64_t)i * n_txt + j], v = pass ? 1.0f / (1.0f + expf(-l)) : l;
                    printf(json ? "%s%.9g" : "%s%10.5f", j ? (json ? ", " : " ") : "", (double)v);
                }
                printf(json ? "]" : "\n");
            }
            if (json) printf("]");
        }
        free(lg);
    }
    if (json) printf("}\n");
done:
    for (int i = 0; im && i < n_img; i++) mmc_image_free(&im[i]);
    free(im);
    free(ie);
    free(te);
    mmc_dual_encoder_free(m);
    free(imgs);
    free(texts);
    return rc;
}
