/* test_scheduler.c — FlowMatchEulerDiscreteScheduler against diffusers 0.42
 * (tests/fixtures/diffusion/sched_*, tools/ref/gen_diffusion.py): for each scheduler_config.json
 * (SD3's static shift 3, shift 1.15, Flux's dynamic shifting, linear time shift with
 * shift_terminal, invert_sigmas, Karras and exponential sigmas), 1, 2, 4, 28 and 50 steps and
 * five image sizes, mu equals calculate_shift's and sigmas / timesteps equal diffusers' bit for
 * bit, both as FluxPipeline calls set_timesteps (float32 sigmas) and as StableDiffusion3Pipeline
 * does (float64); three Euler steps match; bad configs are errors naming the key. */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

static const char *CASES[] = {"sd3", "shift115", "flux", "linear_terminal", "invert", "karras", "exponential"};
static const int STEPS[] = {1, 2, 4, 28, 50};
static const int SIZES[][2] = {{256, 256}, {512, 512}, {1024, 1024}, {768, 1360}, {2048, 2048}};
static int n_exact = 0, n_values = 0;

/* Bitwise equality (NaN == NaN: diffusers' own 1-step shift_terminal schedule is 0/0). */
static void check_equal(const mmc_st *exp, const char *key, const float *got, int n) {
    const mmc_st_entry *e = mmc_st_find(exp, key);
    int64_t ne = e ? (int64_t)(e->nbytes / sizeof(float)) : -1;
    CHECKF(e && e->dtype == MMC_F32 && ne == n, "%s: missing or %lld values, mmc %d", key, (long long)ne, n);
    if (!e || e->dtype != MMC_F32 || ne != n) return;
    const float *w = e->data;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bool same = (isnan(w[i]) && isnan(got[i])) || memcmp(&w[i], &got[i], sizeof(float)) == 0;
        if (!same && bad++ < 3)
            fprintf(stderr, "  %s[%d]: mmc %.9g, diffusers %.9g (%.3g ulp)\n", key, i, got[i], w[i],
                    fabs(got[i] - w[i]) / (nextafterf(fabsf(w[i]), INFINITY) - fabsf(w[i])));
        n_values++;
        n_exact += same;
    }
    CHECKF(bad == 0, "%s: %d of %d values differ from diffusers", key, bad, n);
}

static void check_case(const mmc_st *exp, const char *name) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/diffusion/sched_%s", name);
    mmc_fm_scheduler s;
    CHECK_OK(mmc_fm_load(dir, &s));
    for (size_t k = 0; k < sizeof STEPS / sizeof *STEPS; k++) {
        int n = STEPS[k];
        if (!s.cfg.use_dynamic_shifting) {
            CHECK_OK(mmc_fm_set_timesteps(&s, n, NULL, NAN));
            snprintf(key, sizeof key, "%s/%d/sigmas", name, n);
            check_equal(exp, key, s.sigmas, n + 1);
            snprintf(key, sizeof key, "%s/%d/timesteps", name, n);
            check_equal(exp, key, s.timesteps, n);
            continue;
        }
        for (size_t z = 0; z < sizeof SIZES / sizeof *SIZES; z++) {
            int64_t seq = (SIZES[z][0] / 16) * (SIZES[z][1] / 16);
            double mu = mmc_fm_calculate_shift(&s.cfg, seq);
            snprintf(key, sizeof key, "%s/%d/%lld/mu", name, n, (long long)seq);
            const mmc_st_entry *e = mmc_st_find(exp, key);
            CHECKF(e && *(const double *)e->data == mu, "%s: mmc %.17g", key, mu);
            double flux[64];
            mmc_fm_flux_sigmas(n, flux);
            CHECK_OK(mmc_fm_set_timesteps(&s, n, flux, mu));
            snprintf(key, sizeof key, "%s/%d/%lld/flux_sigmas", name, n, (long long)seq);
            check_equal(exp, key, s.sigmas, n + 1);
            snprintf(key, sizeof key, "%s/%d/%lld/flux_timesteps", name, n, (long long)seq);
            check_equal(exp, key, s.timesteps, n);
            CHECK_OK(mmc_fm_set_timesteps(&s, n, NULL, mu));
            snprintf(key, sizeof key, "%s/%d/%lld/sigmas", name, n, (long long)seq);
            check_equal(exp, key, s.sigmas, n + 1);
            snprintf(key, sizeof key, "%s/%d/%lld/timesteps", name, n, (long long)seq);
            check_equal(exp, key, s.timesteps, n);
        }
    }
    mmc_fm_free(&s);
}

static void check_steps(const mmc_st *exp) {
    mmc_fm_scheduler s;
    CHECK_OK(mmc_fm_load("tests/fixtures/diffusion/sched_sd3", &s));
    CHECK_OK(mmc_fm_set_timesteps(&s, 28, NULL, NAN));
    mmc_tensor *x = fixture_tensor(exp, "step/sample0", MMC_F32);
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "step/model_output%d", i);
        mmc_tensor *v = fixture_tensor(exp, key, MMC_F32);
        mmc_fm_step(&s, i, v->data, x->data, mmc_numel(x), NULL);
        snprintf(key, sizeof key, "step/sample%d", i + 1);
        check_equal(exp, key, x->data, (int)mmc_numel(x));
        mmc_tensor_free(v);
    }
    mmc_tensor_free(x);
    mmc_fm_free(&s);
}

static mmc_status parse_cfg(const char *text, mmc_fm_config *c) {
    mmc_json *j = NULL;
    mmc_status st = mmc_json_parse(text, strlen(text), "scheduler_config.json", &j);
    if (!st) st = mmc_fm_config_read(j, "scheduler_config.json", c);
    mmc_json_free(j);
    return st;
}

static void check_errors(void) {
    mmc_fm_config c;
    CHECK_ERR(parse_cfg("{\"use_beta_sigmas\": true}", &c), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "use_beta_sigmas"));
    CHECK_ERR(parse_cfg("{\"time_shift_type\": \"cubic\"}", &c), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "cubic"));
    CHECK_ERR(parse_cfg("{\"shift\": \"3\"}", &c), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "shift"));
    CHECK_ERR(parse_cfg("{\"use_karras_sigmas\": true, \"use_exponential_sigmas\": true}", &c), MMC_ERR_INVALID);
    CHECK_ERR(parse_cfg("{\"_class_name\": \"EulerDiscreteScheduler\"}", &c), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "EulerDiscreteScheduler"));
    CHECK_OK(parse_cfg("{\"use_dynamic_shifting\": true}", &c));
    mmc_fm_scheduler s;
    CHECK_OK(mmc_fm_init(&c, &s));
    CHECK_ERR(mmc_fm_set_timesteps(&s, 4, NULL, NAN), MMC_ERR_INVALID);   /* mu required */
    CHECK(strstr(mmc_last_error(), "mu"));
    CHECK_ERR(mmc_fm_set_timesteps(&s, 0, NULL, 1.0), MMC_ERR_INVALID);
    mmc_fm_free(&s);
}

int main(void) {
    if (access("tests/fixtures/diffusion/sched_expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_scheduler: fixtures absent (tools/ref/gen_diffusion.py); skipping\n");
        return 77;
    }
    mmc_st *exp = fixture_open("diffusion/sched_expected.safetensors");
    if (!exp) return test_done("test_scheduler");
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) check_case(exp, CASES[i]);
    check_steps(exp);
    check_errors();
    printf("test_scheduler: %d of %d sigma / timestep / sample values bitwise equal to diffusers\n", n_exact,
           n_values);
    mmc_st_close(exp);
    return test_done("test_scheduler");
}
