/* sampling.c — the sampling and length options generate and chat share, resolved as
 * transformers' generate() resolves its arguments: the model's generation_config.json over
 * GenerationConfig's global defaults (mmc_gen_config_read), then the command line. */
#include "cli.h"
#include "runner.h"

#include <string.h>

void cli_sampling_init(cli_sampling *s) {
    *s = (cli_sampling){.temperature = -1, .top_p = -1, .min_p = -1, .repetition_penalty = -1,
                        .top_k = -1, .max_new = -1, .seed = 0};
}

int cli_sampling_arg(const char *cmd, int argc, char **argv, int *i, cli_sampling *s) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--greedy")) { s->greedy = true; return 1; }
    static const char *const opts[] = {"--max-new-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                                       "--repetition-penalty", "--seed"};
    int k = 0, n = (int)(sizeof opts / sizeof *opts);
    while (k < n && strcmp(a, opts[k])) k++;
    if (k == n) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    bool ok;
    switch (k) {
    case 0: ok = cli_int(a, v, 1, 1 << 20, &s->max_new); break;
    case 1: ok = cli_float(a, v, 0, 100, &s->temperature); break;
    case 2: ok = cli_int(a, v, 0, 1 << 30, &s->top_k); break;
    case 3: ok = cli_float(a, v, 1e-6, 1, &s->top_p); break;
    case 4: ok = cli_float(a, v, 0, 1, &s->min_p); break;
    case 5: ok = cli_float(a, v, 1e-3, 100, &s->repetition_penalty); break;
    default: ok = cli_int(a, v, 0, (1LL << 62), &s->seed); break;
    }
    (void)cmd;
    return ok ? 1 : -1;
}

/* transformers' order: the model's generation_config.json over GenerationConfig's global
 * defaults (m->gen), then what the command line gives. A temperature on the command line
 * means sampling (0 means greedy), --greedy means greedy. */
int cli_sampling_resolve(const cli_model *m, const cli_sampling *s, long long def_max_new, int64_t n_prompt,
                         mmc_gen_opts *go, int32_t *eos) {
    mmc_gen_config g = m->gen;
    if (s->temperature >= 0) { g.do_sample = s->temperature > 0; g.temperature = s->temperature; }
    if (s->greedy) g.do_sample = false;
    if (s->top_k >= 0) g.top_k = s->top_k;
    if (s->top_p >= 0) g.top_p = s->top_p;
    if (s->min_p >= 0) g.min_p = s->min_p;
    if (s->repetition_penalty >= 0) g.repetition_penalty = s->repetition_penalty;
    go->n_eos = g.n_eos;
    memcpy(eos, g.eos_ids, sizeof(int32_t) * (size_t)g.n_eos);
    if (!go->n_eos) go->n_eos = mmc_tokenizer_eos_ids(m->tok, eos, MMC_GEN_MAX_EOS);
    go->eos_ids = eos;
    mmc_gen_config_sampler(&g, &go->sampler);
    go->sampler.seed = (uint64_t)s->seed;
    long long max_new = s->max_new > 0 ? s->max_new
                      : g.length_set ? (long long)mmc_gen_config_max_new(&g, n_prompt) : def_max_new;
    go->max_new_tokens = (int)max_new;
    return go->max_new_tokens;
}
