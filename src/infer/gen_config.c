/* gen_config.c — generation_config.json, read and resolved as transformers' generate()
 * resolves it (generation/utils.py _prepare_generation_config: the checkpoint's values
 * first, then GenerationConfig._get_default_generation_params() for whatever is unset).
 * Only the fields that change greedy / sampled decoding with a KV cache are read; beams,
 * constraints and watermarking are not supported by mmc and are ignored. */
#include "mmc_infer.h"
#include "mmc_io.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

void mmc_gen_config_defaults(mmc_gen_config *g) {
    memset(g, 0, sizeof *g);
    g->do_sample = false;
    g->temperature = 1.0;
    g->top_k = 50;
    g->top_p = 1.0;
    g->min_p = 0.0;
    g->repetition_penalty = 1.0;
    g->max_new_tokens = -1;
    g->max_length = 20;
    g->bos_id = g->pad_id = -1;
}

/* eos_token_id: an integer or a list of integers */
static mmc_status read_eos(const mmc_json *j, const char *path, mmc_gen_config *g) {
    if (!mmc_json_has(j, "eos_token_id")) return MMC_OK;
    int64_t one, ids[MMC_GEN_MAX_EOS];
    int n = MMC_GEN_MAX_EOS;
    mmc_status st = mmc_json_int(j, "eos_token_id", -1, &one);
    if (st == MMC_OK) {
        if (one < 0 || one > INT32_MAX)
            return mmc_error(MMC_ERR_INVALID, "%s: eos_token_id = %lld is not a token id", path, (long long)one);
        g->eos_ids[0] = (int32_t)one;
        g->n_eos = 1;
        return MMC_OK;
    }
    if ((st = mmc_json_int_array(j, "eos_token_id", ids, &n)))
        return mmc_error(st, "%s: eos_token_id must be an integer or a list of at most %d integers",
                         path, MMC_GEN_MAX_EOS);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] > INT32_MAX)
            return mmc_error(MMC_ERR_INVALID, "%s: eos_token_id[%d] = %lld is not a token id", path, i,
                             (long long)ids[i]);
        g->eos_ids[g->n_eos++] = (int32_t)ids[i];
    }
    return MMC_OK;
}

static mmc_status read_id(const mmc_json *j, const char *path, const char *key, int32_t *out) {
    int64_t v;
    mmc_status st = mmc_json_int(j, key, -1, &v);
    if (st) return st;
    if (v < -1 || v > INT32_MAX)
        return mmc_error(MMC_ERR_INVALID, "%s: %s = %lld is not a token id", path, key, (long long)v);
    *out = (int32_t)v;
    return MMC_OK;
}

mmc_status mmc_gen_config_read(const char *dir, mmc_gen_config *g) {
    mmc_gen_config_defaults(g);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/generation_config.json", dir) >= (int)sizeof path)
        return mmc_error(MMC_ERR_INVALID, "%s: path too long", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return MMC_OK;
        return mmc_error(MMC_ERR_IO, "%s: %s", path, strerror(errno));
    }
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    g->present = true;
    if (!mmc_json_is_object(j)) {
        mmc_json_free(j);
        return mmc_error(MMC_ERR_FORMAT, "%s: expected a JSON object of generation settings", path);
    }
    int64_t max_length = -1;
    if ((st = mmc_json_bool(j, "do_sample", false, &g->do_sample)) ||
        (st = mmc_json_num(j, "temperature", 1.0, &g->temperature)) ||
        (st = mmc_json_int(j, "top_k", 50, &g->top_k)) ||
        (st = mmc_json_num(j, "top_p", 1.0, &g->top_p)) ||
        (st = mmc_json_num(j, "min_p", 0.0, &g->min_p)) ||
        (st = mmc_json_num(j, "repetition_penalty", 1.0, &g->repetition_penalty)) ||
        (st = mmc_json_int(j, "max_new_tokens", -1, &g->max_new_tokens)) ||
        (st = mmc_json_int(j, "max_length", -1, &max_length)) ||
        (st = read_eos(j, path, g)) || (st = read_id(j, path, "bos_token_id", &g->bos_id)) ||
        (st = read_id(j, path, "pad_token_id", &g->pad_id)))
        goto done;
    if (max_length >= 0) g->max_length = max_length;
    g->length_set = max_length >= 0 || g->max_new_tokens >= 0;
    /* the ranges transformers' GenerationConfig.validate() insists on when they matter */
    const char *bad = NULL;
    if (g->temperature < 0) bad = "temperature must be >= 0";
    else if (g->top_k < 0) bad = "top_k must be >= 0";
    else if (g->top_p < 0 || g->top_p > 1) bad = "top_p must be in [0, 1]";
    else if (g->min_p < 0 || g->min_p > 1) bad = "min_p must be in [0, 1]";
    else if (g->repetition_penalty <= 0) bad = "repetition_penalty must be > 0";
    else if (g->max_new_tokens < -1 || g->max_length < 0) bad = "max_new_tokens / max_length must be >= 0";
    if (bad) st = mmc_error(MMC_ERR_INVALID, "%s: %s; fix the file or override it on the command line", path, bad);
done:
    mmc_json_free(j);
    return st;
}

void mmc_gen_config_sampler(const mmc_gen_config *g, mmc_sampler_opts *o) {
    mmc_sampler_defaults(o);
    o->repetition_penalty = (float)g->repetition_penalty;
    /* do_sample with temperature 0 is greedy in effect; transformers refuses it, mmc's
     * sampler takes temperature <= 0 as greedy */
    if (!g->do_sample) return;
    o->temperature = (float)g->temperature;
    o->top_k = (int)g->top_k;
    o->top_p = (float)(g->top_p > 0 ? g->top_p : 1.0);
    o->min_p = (float)g->min_p;
}

int64_t mmc_gen_config_max_new(const mmc_gen_config *g, int64_t n_prompt) {
    if (g->max_new_tokens >= 0) return g->max_new_tokens;
    return g->max_length > n_prompt ? g->max_length - n_prompt : 0;
}
