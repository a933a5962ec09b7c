/* flow_match_euler.c — FlowMatchEulerDiscreteScheduler, mirroring diffusers'
 * schedulers/scheduling_flow_match_euler_discrete.py (0.42): the training schedule of
 * __init__, set_timesteps (static shift, or resolution-dependent "dynamic" shifting by mu in
 * its exponential or linear form, shift_terminal stretching, Karras / exponential sigmas,
 * invert_sigmas), the Euler step and scale_noise; and the pipelines' calculate_shift.
 *
 * Exactness. diffusers computes the schedule partly in torch float32 (__init__, the final
 * sigmas * num_train_timesteps), partly in numpy: float64 when the pipeline passes no sigmas
 * (np.linspace of the timesteps), float32 when it passes them (FluxPipeline's
 * np.linspace(1, 1/n, n) goes through .astype(np.float32), and numpy 2 keeps Python scalars
 * weak, so every later operation stays float32). Each function below does its arithmetic in
 * the same type, one rounding per numpy / torch operation, so sigmas and timesteps come out
 * bitwise equal (tests/test_diffusion.c). For that the compiler must not fuse a*b+c into an
 * FMA (gcc's default -ffp-contract=fast in GNU C mode would): hence the pragma below. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "mmc_diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void mmc_fm_config_default(mmc_fm_config *c) {
    memset(c, 0, sizeof *c);
    c->num_train_timesteps = 1000;
    c->shift = 1.0;
    c->base_shift = 0.5;
    c->max_shift = 1.15;
    c->base_image_seq_len = 256;
    c->max_image_seq_len = 4096;
    c->time_shift_type = MMC_TIME_SHIFT_EXPONENTIAL;
}

mmc_status mmc_fm_config_read(const mmc_json *j, const char *what, mmc_fm_config *c) {
    mmc_fm_config_default(c);
    mmc_status st;
    const char *cls = NULL;
    if ((st = mmc_json_str(j, "_class_name", "FlowMatchEulerDiscreteScheduler", &cls))) return st;
    if (strcmp(cls, "FlowMatchEulerDiscreteScheduler") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: _class_name '%s' is not FlowMatchEulerDiscreteScheduler",
                         what, cls);
    bool beta = false;
    const char *tst = NULL;
    if ((st = mmc_json_int(j, "num_train_timesteps", 1000, &c->num_train_timesteps)) ||
        (st = mmc_json_num(j, "shift", 1.0, &c->shift)) ||
        (st = mmc_json_bool(j, "use_dynamic_shifting", false, &c->use_dynamic_shifting)) ||
        (st = mmc_json_num(j, "base_shift", 0.5, &c->base_shift)) ||
        (st = mmc_json_num(j, "max_shift", 1.15, &c->max_shift)) ||
        (st = mmc_json_int(j, "base_image_seq_len", 256, &c->base_image_seq_len)) ||
        (st = mmc_json_int(j, "max_image_seq_len", 4096, &c->max_image_seq_len)) ||
        (st = mmc_json_bool(j, "invert_sigmas", false, &c->invert_sigmas)) ||
        (st = mmc_json_num(j, "shift_terminal", 0.0, &c->shift_terminal)) ||
        (st = mmc_json_bool(j, "use_karras_sigmas", false, &c->use_karras_sigmas)) ||
        (st = mmc_json_bool(j, "use_exponential_sigmas", false, &c->use_exponential_sigmas)) ||
        (st = mmc_json_bool(j, "use_beta_sigmas", false, &beta)) ||
        (st = mmc_json_bool(j, "stochastic_sampling", false, &c->stochastic_sampling)) ||
        (st = mmc_json_str(j, "time_shift_type", "exponential", &tst)))
        return mmc_error_prefix(st, "%s: ", what);
    if (beta)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: use_beta_sigmas (scipy.stats.beta.ppf) is not supported; "
                         "set it to false", what);
    if (c->use_karras_sigmas + c->use_exponential_sigmas > 1)
        return mmc_error(MMC_ERR_INVALID, "%s: only one of use_karras_sigmas, use_exponential_sigmas, "
                         "use_beta_sigmas can be true", what);
    if (!strcmp(tst, "exponential")) c->time_shift_type = MMC_TIME_SHIFT_EXPONENTIAL;
    else if (!strcmp(tst, "linear")) c->time_shift_type = MMC_TIME_SHIFT_LINEAR;
    else return mmc_error(MMC_ERR_INVALID, "%s: time_shift_type '%s' must be 'exponential' or 'linear'", what, tst);
    if (c->num_train_timesteps < 1 || c->num_train_timesteps > 1000000)
        return mmc_error(MMC_ERR_INVALID, "%s: num_train_timesteps %lld must be in [1, 1e6]", what,
                         (long long)c->num_train_timesteps);
    if (c->use_dynamic_shifting && c->max_image_seq_len == c->base_image_seq_len)
        return mmc_error(MMC_ERR_INVALID, "%s: max_image_seq_len equals base_image_seq_len (%lld): no "
                         "shift can be interpolated", what, (long long)c->base_image_seq_len);
    return MMC_OK;
}

void mmc_fm_free(mmc_fm_scheduler *s) {
    if (!s) return;
    free(s->sigmas);
    free(s->timesteps);
    s->sigmas = s->timesteps = NULL;
    s->n = 0;
}

/* __init__: timesteps = linspace(1, N, N)[::-1] as float32, sigmas = timesteps / N, shifted
 * by `shift` unless the shift is dynamic (all torch float32: the Python scalars become
 * float32). Only the endpoints are kept: set_timesteps starts from them. */
mmc_status mmc_fm_init(const mmc_fm_config *c, mmc_fm_scheduler *s) {
    memset(s, 0, sizeof *s);
    s->cfg = *c;
    const float N = (float)c->num_train_timesteps;
    float ends[2] = {N / N, 1.0f / N};   /* sigmas[0], sigmas[-1] */
    if (!c->use_dynamic_shifting) {
        const float sh = (float)c->shift, sh1 = (float)(c->shift - 1.0);
        for (int i = 0; i < 2; i++) ends[i] = sh * ends[i] / (1.0f + sh1 * ends[i]);
    }
    s->sigma_max = ends[0];
    s->sigma_min = ends[1];
    return MMC_OK;
}

mmc_status mmc_fm_load(const char *dir, mmc_fm_scheduler *out) {
    memset(out, 0, sizeof *out);
    char path[1024];
    snprintf(path, sizeof path, "%s/scheduler_config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_fm_config c;
    st = mmc_fm_config_read(j, path, &c);
    mmc_json_free(j);
    return st ? st : mmc_fm_init(&c, out);
}

double mmc_fm_calculate_shift(const mmc_fm_config *c, int64_t image_seq_len) {
    double m = (c->max_shift - c->base_shift) / (double)(c->max_image_seq_len - c->base_image_seq_len);
    double b = c->base_shift - m * (double)c->base_image_seq_len;
    return (double)image_seq_len * m + b;
}

/* np.linspace(start, stop, n) (endpoint=True): y[i] = i * step + start, y[n-1] = stop */
static void linspace(double start, double stop, int n, double *y) {
    const double step = n > 1 ? (stop - start) / (double)(n - 1) : 0.0;
    for (int i = 0; i < n; i++) y[i] = (double)i * step + start;
    if (n > 1) y[n - 1] = stop;
}

void mmc_fm_flux_sigmas(int n, double *out) { linspace(1.0, 1.0 / n, n, out); }

/* Step 2 and 3 of set_timesteps, once per precision: the shift (time_shift(mu, 1.0, t) with
 * (1/t - 1) ** 1.0 == 1/t - 1, or the static shift) and the stretch to shift_terminal. */
#define SHIFT_AND_STRETCH(T, s, mu, n, x)                                                     \
    do {                                                                                       \
        const mmc_fm_config *c_ = &(s)->cfg;                                                   \
        if (c_->use_dynamic_shifting) {                                                        \
            const T num = c_->time_shift_type == MMC_TIME_SHIFT_EXPONENTIAL ? (T)exp(mu) : (T)(mu); \
            for (int i = 0; i < (n); i++) x[i] = num / (num + ((T)1 / x[i] - (T)1));           \
        } else {                                                                               \
            const T sh = (T)c_->shift, sh1 = (T)(c_->shift - 1.0);                             \
            for (int i = 0; i < (n); i++) x[i] = sh * x[i] / ((T)1 + sh1 * x[i]);              \
        }                                                                                      \
        if (c_->shift_terminal != 0.0) {                                                       \
            const T scale = ((T)1 - x[(n) - 1]) / (T)(1.0 - c_->shift_terminal);              \
            for (int i = 0; i < (n); i++) x[i] = (T)1 - ((T)1 - x[i]) / scale;                 \
        }                                                                                      \
    } while (0)

mmc_status mmc_fm_set_timesteps(mmc_fm_scheduler *s, int n, const double *sigmas_in, double mu) {
    const mmc_fm_config *c = &s->cfg;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "set_timesteps: %d inference steps (need >= 1)", n);
    if (c->use_dynamic_shifting && isnan(mu))
        return mmc_error(MMC_ERR_INVALID, "set_timesteps: `mu` must be given when use_dynamic_shifting is true "
                         "(mmc_fm_calculate_shift gives it from the image's latent sequence length)");
    double *d = malloc((size_t)n * sizeof *d);
    float *f = malloc((size_t)n * sizeof *f), *sig = malloc((size_t)(n + 1) * sizeof *sig),
          *ts = malloc((size_t)n * sizeof *ts);
    if (!d || !f || !sig || !ts) {
        free(d), free(f), free(sig), free(ts);
        return mmc_error(MMC_ERR_OOM, "out of memory (%d steps)", n);
    }
    const double N = (double)c->num_train_timesteps;
    bool f64;
    if (!sigmas_in) {   /* timesteps = linspace(sigma_max * N, sigma_min * N, n); sigmas = timesteps / N */
        linspace((double)s->sigma_max * N, (double)s->sigma_min * N, n, d);
        for (int i = 0; i < n; i++) d[i] = d[i] / N;
        SHIFT_AND_STRETCH(double, s, mu, n, d);
        f64 = true;
    } else {            /* np.array(sigmas).astype(np.float32): float32 from here on */
        for (int i = 0; i < n; i++) f[i] = (float)sigmas_in[i];
        SHIFT_AND_STRETCH(float, s, mu, n, f);
        f64 = false;
    }
    if (c->use_karras_sigmas || c->use_exponential_sigmas) {
        /* endpoints via .item() (exact widening of float32 values), schedule in float64 */
        const double smin = f64 ? d[n - 1] : (double)f[n - 1], smax = f64 ? d[0] : (double)f[0];
        linspace(c->use_karras_sigmas ? 0.0 : log(smax), c->use_karras_sigmas ? 1.0 : log(smin), n, d);
        if (c->use_karras_sigmas) {
            const double rho = 7.0, lo = pow(smin, 1.0 / rho), hi = pow(smax, 1.0 / rho);
            for (int i = 0; i < n; i++) d[i] = pow(hi + d[i] * (lo - hi), rho);
        } else {
            for (int i = 0; i < n; i++) d[i] = exp(d[i]);
        }
        f64 = true;
    }
    /* torch.from_numpy(sigmas).to(float32); timesteps = sigmas * N in float32 */
    const float Nf = (float)c->num_train_timesteps;
    for (int i = 0; i < n; i++) sig[i] = f64 ? (float)d[i] : f[i];
    if (c->invert_sigmas)
        for (int i = 0; i < n; i++) sig[i] = 1.0f - sig[i];
    for (int i = 0; i < n; i++) ts[i] = sig[i] * Nf;
    sig[n] = c->invert_sigmas ? 1.0f : 0.0f;
    free(d), free(f);
    free(s->sigmas), free(s->timesteps);
    s->sigmas = sig;
    s->timesteps = ts;
    s->n = n;
    return MMC_OK;
}

void mmc_fm_step(const mmc_fm_scheduler *s, int i, const float *v, float *x, int64_t n, const float *noise) {
    MMC_CHECK(i >= 0 && i < s->n, "mmc_fm_step: step %d outside the %d-step schedule", i, s->n);
    const float sigma = s->sigmas[i], next = s->sigmas[i + 1];
    if (s->cfg.stochastic_sampling) {
        MMC_CHECK(noise, "mmc_fm_step: stochastic_sampling needs noise");
        for (int64_t k = 0; k < n; k++) {
            const float x0 = x[k] - sigma * v[k];
            x[k] = (1.0f - next) * x0 + next * noise[k];
        }
        return;
    }
    const float dt = next - sigma;
#pragma omp parallel for schedule(static) if (n > 1 << 18)
    for (int64_t k = 0; k < n; k++) x[k] = x[k] + dt * v[k];
}

void mmc_fm_scale_noise(const mmc_fm_scheduler *s, int i, float *x, const float *noise, int64_t n) {
    MMC_CHECK(i >= 0 && i <= s->n, "mmc_fm_scale_noise: index %d outside the %d-step schedule", i, s->n);
    const float sigma = s->sigmas[i];
    for (int64_t k = 0; k < n; k++) x[k] = sigma * noise[k] + (1.0f - sigma) * x[k];
}
