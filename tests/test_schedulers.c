/* test_schedulers.c — EulerDiscrete, EulerAncestralDiscrete, DPMSolverMultistep, DDIM and PNDM (PLMS) schedulers
 * against diffusers 0.42 (tests/fixtures/schedulers, tools/ref/gen_schedulers.py): for each
 * scheduler_config.json as save_config wrote it and 1 to 50 steps, set_timesteps' timesteps equal
 * diffusers' exactly and sigmas within 1e-6 relative (init_noise_sigma too); a whole sampling loop per
 * config (scale_model_input, then step with the fixture's model outputs and noise) stays within 1e-5
 * of diffusers' prev_sample at every step; DDPMScheduler's add_noise / get_velocity and compute_snr on
 * each config's training schedule match; bad configs are errors naming the key. */
#include "test_util.h"
#include "mmc_diffusion.h"

static const char *CASES[] = {
    "euler_sdxl", "euler_trailing_v_zsnr", "euler_karras_cos", "euler_karras_range", "euler_loglinear_sample",
    "ea_sdxl", "ea_trailing_v_zsnr", "ea_linspace",
    "dpm_2m", "dpm_2m_karras", "dpm_sde_karras_v", "dpm_heun_final", "dpm_cos_karras_clip", "dpm_order1_zsnr",
    "ddim_sd15", "ddim_trailing_v_zsnr", "ddim_linspace_clip",
    "pndm_sd15", "pndm_linspace_v", "pndm_trailing",
};
static const int STEPS[] = {1, 2, 3, 7, 10, 13, 20, 25, 30, 50};
static double worst_sigma = 0, worst_sigma_zsnr = 0, worst_step = 0;
static int n_ts = 0, n_ts_exact = 0;

static const float *entry(const mmc_st *exp, const char *key, int64_t *n) {
    const mmc_st_entry *e = mmc_st_find(exp, key);
    CHECKF(e != NULL, "fixture key %s missing", key);
    if (!e) return NULL;
    *n = (int64_t)(e->nbytes / 4);
    return e->data;
}

/* |got - want| <= tol * max(|want|, floor, |in|), reporting the first few misses. in (may be NULL): a
 * step's input sample, whose float32 rounding bounds what any implementation can agree on where the
 * step cancels it (the first step of a zero-terminal-SNR schedule takes sigma 4096 to ~15). */
static double compare_in(const char *key, const float *got, const float *want, const float *in, int64_t n, double tol,
                         double floor) {
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]), scale = fabs(want[i]) > floor ? fabs(want[i]) : floor;
        if (in && fabs(in[i]) > scale) scale = fabs(in[i]);
        if (d / scale > worst) worst = d / scale;
        if (!(d <= tol * scale) && bad++ < 3)
            fprintf(stderr, "  %s[%lld]: mmc %.9g diffusers %.9g\n", key, (long long)i, got[i], want[i]);
    }
    CHECKF(bad == 0, "%s: %d of %lld values beyond %.1g", key, bad, (long long)n, tol);
    return worst;
}
static double compare(const char *key, const float *got, const float *want, int64_t n, double tol, double floor) {
    return compare_in(key, got, want, NULL, n, tol, floor);
}

static void check_schedule(const mmc_st *exp, const char *name) {
    char dir[256], key[256];
    snprintf(dir, sizeof dir, "tests/fixtures/schedulers/%s", name);
    mmc_nsched s;
    mmc_status st = mmc_nsched_load(dir, &s);
    CHECK_OK(st);
    if (st) return;
    for (size_t k = 0; k < sizeof STEPS / sizeof *STEPS; k++) {
        const int n = STEPS[k];
        CHECK_OK(mmc_nsched_set_timesteps(&s, n));
        int64_t m = 0;
        snprintf(key, sizeof key, "%s/%d/timesteps", name, n);
        const float *ts = entry(exp, key, &m);
        if (!ts) continue;
        CHECKF(m == s.n, "%s: %lld timesteps, mmc %d", key, (long long)m, s.n);
        if (m != s.n) continue;
        int bad = 0;
        for (int i = 0; i < s.n; i++) {
            n_ts++;
            if (s.timesteps[i] == ts[i]) { n_ts_exact++; continue; }
            /* Karras timesteps of the Euler kinds are fractional interpolations through float32 log sigmas
             * (numpy's SIMD log vs libm's): allow an ulp of the float32 result there, nothing elsewhere. */
            bool frac = s.cfg.kind == MMC_NSCHED_EULER && s.cfg.use_karras_sigmas &&
                        fabsf(s.timesteps[i] - ts[i]) <= 2e-6f * fmaxf(fabsf(ts[i]), 1.0f);
            if (!frac && bad++ < 3) fprintf(stderr, "  %s[%d]: mmc %.9g diffusers %.9g\n", key, i, s.timesteps[i], ts[i]);
        }
        CHECKF(bad == 0, "%s: %d timesteps differ", key, bad);
        if (s.sigmas) {
            snprintf(key, sizeof key, "%s/%d/sigmas", name, n);
            const float *sg = entry(exp, key, &m);
            if (sg) {
                int64_t ns = m;
                CHECKF(sg && ns >= s.n + 1, "%s: %lld sigmas", key, (long long)ns);
                /* 1e-6 relative, except under rescale_betas_zero_snr: there betas come back as
                 * 1 - alphas_bar[i] / alphas_bar[i-1] of squared, shifted square roots, which turns
                 * torch's sqrt (not correctly rounded: it agrees with IEEE sqrt on ~80% of floats, the
                 * rest an ulp off, measured on torch 2.15) into ~5e-6 of the small sigmas. */
                double tol = s.cfg.rescale_betas_zero_snr ? 2e-5 : 1e-6;
                double w = compare(key, s.sigmas, sg, ns, tol, 1e-30);
                if (s.cfg.rescale_betas_zero_snr) { if (w > worst_sigma_zsnr) worst_sigma_zsnr = w; }
                else if (w > worst_sigma) worst_sigma = w;
            }
        }
        snprintf(key, sizeof key, "%s/%d/init_noise_sigma", name, n);
        const float *ins = entry(exp, key, &m);
        if (ins) CHECKF(fabs(s.init_noise_sigma - ins[0]) <= 1e-6 * fabs(ins[0]), "%s: mmc %.9g diffusers %.9g", key,
                        s.init_noise_sigma, ins[0]);
    }
    mmc_nsched_free(&s);
}

static void check_loop(const mmc_st *exp, const char *name, const char *loop, double eta) {
    char dir[256], key[256];
    snprintf(dir, sizeof dir, "tests/fixtures/schedulers/%s", name);
    mmc_nsched s;
    mmc_status st = mmc_nsched_load(dir, &s);
    CHECK_OK(st);
    if (st) return;
    int64_t m = 0;
    snprintf(key, sizeof key, "%s/%s/n", name, loop);
    const mmc_st_entry *e = mmc_st_find(exp, key);
    CHECKF(e != NULL, "%s missing", key);
    if (!e) { mmc_nsched_free(&s); return; }
    const int n = *(const int32_t *)e->data;
    CHECK_OK(mmc_nsched_set_timesteps(&s, n));
    s.eta = eta;
    snprintf(key, sizeof key, "%s/%s/x", name, loop);
    const float *x0 = entry(exp, key, &m);
    if (!x0) { mmc_nsched_free(&s); return; }
    float *x = malloc((size_t)m * sizeof(float)), *scaled = malloc((size_t)m * sizeof(float));
    memcpy(x, x0, (size_t)m * sizeof(float));
    for (int i = 0; i < s.n; i++) {
        int64_t k;
        snprintf(key, sizeof key, "%s/%s/%d/model_output", name, loop, i);
        const float *mo = entry(exp, key, &k);
        snprintf(key, sizeof key, "%s/%s/%d/noise", name, loop, i);
        const float *noise = entry(exp, key, &k);
        if (!mo || !noise) break;
        mmc_nsched_scale_model_input(&s, i, x, scaled, m);
        snprintf(key, sizeof key, "%s/%s/%d/scaled", name, loop, i);
        const float *want_scaled = entry(exp, key, &k);
        if (want_scaled) compare(key, scaled, want_scaled, m, 1e-5, 1.0);
        memcpy(scaled, x, (size_t)m * sizeof(float));   /* the step's input, for the tolerance */
        CHECK_OK(mmc_nsched_step(&s, i, mo, x, m, noise));
        snprintf(key, sizeof key, "%s/%s/%d/prev_sample", name, loop, i);
        const float *want = entry(exp, key, &k);
        if (!want) break;
        double w = compare_in(key, x, want, scaled, m, 1e-5, 1.0);
        if (w > worst_step) worst_step = w;
        memcpy(x, want, (size_t)m * sizeof(float));   /* each step from diffusers' own sample: no drift */
    }
    free(x);
    free(scaled);
    mmc_nsched_free(&s);
}

/* DDPMScheduler's add_noise / get_velocity and compute_snr on each config's training schedule */
static void check_train(const mmc_st *exp) {
    static const char *const names[] = {"euler_sdxl", "euler_trailing_v_zsnr", "ddim_linspace_clip", "dpm_cos_karras_clip"};
    int64_t n = 0, nt = 0;
    const float *x0 = entry(exp, "train/x0", &n), *noise = entry(exp, "train/noise", &n);
    const mmc_st_entry *te = mmc_st_find(exp, "train/t");
    CHECK(x0 && noise && te);
    if (!x0 || !noise || !te) return;
    nt = (int64_t)(te->nbytes / 4);
    int64_t t[8];
    for (int64_t b = 0; b < nt && b < 8; b++) t[b] = ((const int32_t *)te->data)[b];
    float *out = malloc((size_t)n * sizeof(float)), snr[8];
    for (size_t c = 0; c < sizeof names / sizeof *names; c++) {
        char dir[256], key[256];
        snprintf(dir, sizeof dir, "tests/fixtures/schedulers/%s", names[c]);
        mmc_nsched s;
        CHECK_OK(mmc_nsched_load(dir, &s));
        int64_t k;
        mmc_nsched_add_noise(&s, t, nt, n / nt, x0, noise, out);
        snprintf(key, sizeof key, "train/%s/add_noise", names[c]);
        const float *w = entry(exp, key, &k);
        if (w) compare(key, out, w, n, 1e-6, 1.0);
        mmc_nsched_velocity(&s, t, nt, n / nt, x0, noise, out);
        snprintf(key, sizeof key, "train/%s/velocity", names[c]);
        if ((w = entry(exp, key, &k))) compare(key, out, w, n, 1e-6, 1.0);
        for (int64_t b = 0; b < nt; b++) snr[b] = mmc_nsched_snr(&s, t[b]);
        snprintf(key, sizeof key, "train/%s/snr", names[c]);
        /* relative: the SNR spans 1e4 at t = 0 to 0 (zero-terminal-SNR) at t = 999 */
        if ((w = entry(exp, key, &k))) compare(key, snr, w, nt, 1e-5, 1e-30);
        mmc_nsched_free(&s);
    }
    free(out);
}

static void check_errors(void) {
    const char *bad[][2] = {
        {"{\"_class_name\": \"LMSDiscreteScheduler\"}", "LMSDiscreteScheduler"},
        {"{\"_class_name\": \"EulerDiscreteScheduler\", \"beta_schedule\": \"cubic\"}", "beta_schedule"},
        {"{\"_class_name\": \"EulerDiscreteScheduler\", \"prediction_type\": \"x\"}", "prediction_type"},
        {"{\"_class_name\": \"DDIMScheduler\", \"timestep_spacing\": \"even\"}", "timestep_spacing"},
        {"{\"_class_name\": \"DPMSolverMultistepScheduler\", \"solver_order\": 3}", "solver_order"},
        {"{\"_class_name\": \"DPMSolverMultistepScheduler\", \"algorithm_type\": \"dpmsolver\"}", "algorithm_type"},
        {"{\"_class_name\": \"EulerDiscreteScheduler\", \"use_exponential_sigmas\": true}", "use_exponential_sigmas"},
        {"{\"_class_name\": \"EulerDiscreteScheduler\", \"trained_betas\": [0.1, 0.2]}", "trained_betas"},
        {"{\"_class_name\": \"DDIMScheduler\", \"thresholding\": true}", "thresholding"},
        {"{\"_class_name\": \"PNDMScheduler\"}", "skip_prk_steps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mmc_json *j = NULL;
        CHECK_OK(mmc_json_parse(bad[i][0], strlen(bad[i][0]), "test", &j));
        mmc_nsched_config c;
        mmc_status st = mmc_nsched_config_read(j, "cfg.json", &c);
        CHECKF(st != MMC_OK && strstr(mmc_last_error(), bad[i][1]) && strstr(mmc_last_error(), "cfg.json"),
               "%s: status %d, message '%s'", bad[i][0], st, mmc_last_error());
        mmc_json_free(j);
    }
    /* a step without the noise it needs, a step index out of range */
    mmc_nsched s;
    CHECK_OK(mmc_nsched_load("tests/fixtures/schedulers/ea_sdxl", &s));
    CHECK_OK(mmc_nsched_set_timesteps(&s, 4));
    float x[4] = {0}, mo[4] = {0};
    CHECK_ERR(mmc_nsched_step(&s, 0, mo, x, 4, NULL), MMC_ERR_INVALID);
    CHECK_ERR(mmc_nsched_step(&s, 4, mo, x, 4, x), MMC_ERR_INVALID);
    CHECK_ERR(mmc_nsched_set_timesteps(&s, 0), MMC_ERR_INVALID);
    mmc_nsched_free(&s);
}

int main(int argc, char **argv) {
    mmc_st *exp = fixture_open("schedulers/expected.safetensors");
    if (!exp) return 1;
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        if (!test_part(argc, argv, "schedule") && !test_part(argc, argv, CASES[c])) continue;
        check_schedule(exp, CASES[c]);
    }
    if (test_part(argc, argv, "step"))
        for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
            check_loop(exp, CASES[c], "loop", 0.0);
            if (!strncmp(CASES[c], "ddim", 4)) check_loop(exp, CASES[c], "loop_eta", 0.6);
        }
    if (test_part(argc, argv, "train")) check_train(exp);
    if (test_part(argc, argv, "errors")) check_errors();
    printf("timesteps: %d of %d bitwise equal; sigmas worst relative difference %.3g (zero-SNR rescaled: %.3g); "
           "steps worst %.3g\n", n_ts_exact, n_ts, worst_sigma, worst_sigma_zsnr, worst_step);
    mmc_st_close(exp);
    return test_done("test_schedulers");
}
