/* schedulers.c — the DDPM-family samplers of Stable Diffusion / SDXL pipelines, mirroring
 * diffusers 0.42's schedulers/scheduling_euler_discrete.py, scheduling_euler_ancestral_discrete.py,
 * scheduling_dpmsolver_multistep.py (dpmsolver++ and sde-dpmsolver++, orders 1-2), scheduling_ddim.py and
 * scheduling_pndm.py (the PLMS steps of skip_prk_steps, as SD 1.5 ships it) and scheduling_unipc_multistep.py
 * (UniPC-p with the B(h) variants bh1 / bh2, orders 1-2, data prediction, VP or flow sigmas: the
 * Wan pipelines' scheduler): the training schedule of __init__ (betas, alphas_cumprod, zero-terminal-SNR
 * rescaling), set_timesteps (linspace / leading / trailing spacing, Karras sigmas, final sigma),
 * scale_model_input and step; and DDPMScheduler's training arithmetic (add_noise, get_velocity) with
 * training_utils.compute_snr.
 *
 * Exactness. diffusers builds the training schedule in torch float32 (torch.linspace evaluates
 * start + step * i as one fused multiply-add from whichever end is nearer; torch.cumprod
 * accumulates in double on the CPU), and the inference schedule in numpy, float64 for the
 * interpolation and Karras ramps, float32 where it calls np.log on the float32 sigmas. Each
 * function below does its arithmetic in the same type, one rounding per numpy / torch operation
 * (fmaf only where torch fuses), so timesteps come out equal and sigmas within an ulp or two
 * (tests/test_schedulers.c); the compiler must not contract a*b+c elsewhere, hence the pragma. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "mmc_diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *mmc_nsched_kind_name(mmc_nsched_kind k) {
    switch (k) {
    case MMC_NSCHED_EULER: return "EulerDiscreteScheduler";
    case MMC_NSCHED_EULER_ANCESTRAL: return "EulerAncestralDiscreteScheduler";
    case MMC_NSCHED_DPM_MULTISTEP: return "DPMSolverMultistepScheduler";
    case MMC_NSCHED_DDIM: return "DDIMScheduler";
    case MMC_NSCHED_PNDM: return "PNDMScheduler";
    case MMC_NSCHED_UNIPC: return "UniPCMultistepScheduler";
    }
    return "?";
}

/* ---------------------------------------------------------------- config */

static void config_default(mmc_nsched_kind kind, mmc_nsched_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->num_train_timesteps = 1000;
    c->beta_start = 0.0001;
    c->beta_end = 0.02;
    c->beta_schedule = MMC_BETA_LINEAR;
    c->prediction_type = MMC_PRED_EPSILON;
    c->timestep_spacing = kind == MMC_NSCHED_DDIM || kind == MMC_NSCHED_PNDM ? MMC_SPACING_LEADING : MMC_SPACING_LINSPACE;
    c->sigma_min = c->sigma_max = NAN;
    c->solver_order = 2;
    c->lower_order_final = true;
    c->lambda_min_clipped = -INFINITY;
    c->clip_sample = true;
    c->set_alpha_to_one = kind != MMC_NSCHED_PNDM;
    c->clip_sample_range = 1.0;
    c->flow_shift = 1.0;
}

/* A key that must hold its default for mmc to honour the config. */
static mmc_status need_default_str(const mmc_json *j, const char *what, const char *key, const char *def) {
    const char *v = NULL;
    mmc_status st = mmc_json_str(j, key, def, &v);
    if (st) return mmc_error_prefix(st, "%s: ", what);
    if (strcmp(v, def) != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s '%s' is not supported (only '%s')", what, key, v, def);
    return MMC_OK;
}
static mmc_status need_false(const mmc_json *j, const char *what, const char *key) {
    bool v = false;
    mmc_status st = mmc_json_bool(j, key, false, &v);
    if (st) return mmc_error_prefix(st, "%s: ", what);
    if (v) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s true is not supported; set it to false", what, key);
    return MMC_OK;
}

/* A key that is absent or null (mmc_json_str reads null as its default). */
static bool json_null_or_absent(const mmc_json *j, const char *key) {
    const char *v = NULL;
    if (!mmc_json_has(j, key)) return true;
    return mmc_json_str(j, key, NULL, &v) == MMC_OK && v == NULL;
}

mmc_status mmc_nsched_config_read(const mmc_json *j, const char *what, mmc_nsched_config *c) {
    mmc_status st;
    const char *cls = NULL;
    if ((st = mmc_json_str(j, "_class_name", "", &cls))) return mmc_error_prefix(st, "%s: ", what);
    mmc_nsched_kind kind;
    if (!strcmp(cls, "EulerDiscreteScheduler")) kind = MMC_NSCHED_EULER;
    else if (!strcmp(cls, "EulerAncestralDiscreteScheduler")) kind = MMC_NSCHED_EULER_ANCESTRAL;
    else if (!strcmp(cls, "DPMSolverMultistepScheduler")) kind = MMC_NSCHED_DPM_MULTISTEP;
    else if (!strcmp(cls, "DDIMScheduler")) kind = MMC_NSCHED_DDIM;
    else if (!strcmp(cls, "PNDMScheduler")) kind = MMC_NSCHED_PNDM;
    else if (!strcmp(cls, "UniPCMultistepScheduler")) kind = MMC_NSCHED_UNIPC;
    else
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: _class_name '%s' is not a scheduler mmc runs (EulerDiscreteScheduler, "
                         "EulerAncestralDiscreteScheduler, DPMSolverMultistepScheduler, DDIMScheduler, PNDMScheduler, "
                         "UniPCMultistepScheduler)", what, cls);
    config_default(kind, c);
    const char *beta = NULL, *pred = NULL, *spacing = NULL;
    if ((st = mmc_json_int(j, "num_train_timesteps", 1000, &c->num_train_timesteps)) ||
        (st = mmc_json_num(j, "beta_start", 0.0001, &c->beta_start)) ||
        (st = mmc_json_num(j, "beta_end", 0.02, &c->beta_end)) ||
        (st = mmc_json_str(j, "beta_schedule", "linear", &beta)) ||
        (st = mmc_json_str(j, "prediction_type", "epsilon", &pred)) ||
        (st = mmc_json_str(j, "timestep_spacing", kind == MMC_NSCHED_DDIM || kind == MMC_NSCHED_PNDM ? "leading" : "linspace",
                           &spacing)) ||
        (st = mmc_json_int(j, "steps_offset", 0, &c->steps_offset)) ||
        (st = mmc_json_bool(j, "rescale_betas_zero_snr", false, &c->rescale_betas_zero_snr)))
        return mmc_error_prefix(st, "%s: ", what);
    if (!json_null_or_absent(j, "trained_betas"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: trained_betas is not supported; use beta_schedule", what);
    if (c->num_train_timesteps < 2 || c->num_train_timesteps > 100000)
        return mmc_error(MMC_ERR_INVALID, "%s: num_train_timesteps %lld must be in [2, 100000]", what,
                         (long long)c->num_train_timesteps);
    if (!strcmp(beta, "linear")) c->beta_schedule = MMC_BETA_LINEAR;
    else if (!strcmp(beta, "scaled_linear")) c->beta_schedule = MMC_BETA_SCALED_LINEAR;
    else if (!strcmp(beta, "squaredcos_cap_v2")) c->beta_schedule = MMC_BETA_SQUAREDCOS;
    else return mmc_error(MMC_ERR_INVALID, "%s: beta_schedule '%s' must be linear, scaled_linear or squaredcos_cap_v2",
                          what, beta);
    if (!strcmp(pred, "epsilon")) c->prediction_type = MMC_PRED_EPSILON;
    else if (!strcmp(pred, "v_prediction")) c->prediction_type = MMC_PRED_V;
    else if (!strcmp(pred, "sample") || (kind == MMC_NSCHED_EULER && !strcmp(pred, "original_sample")))
        c->prediction_type = MMC_PRED_SAMPLE;
    else if (kind == MMC_NSCHED_UNIPC && !strcmp(pred, "flow_prediction")) c->prediction_type = MMC_PRED_FLOW;
    else return mmc_error(MMC_ERR_INVALID, "%s: prediction_type '%s' must be epsilon, v_prediction or sample", what, pred);
    if ((kind == MMC_NSCHED_EULER_ANCESTRAL || kind == MMC_NSCHED_PNDM) && c->prediction_type == MMC_PRED_SAMPLE)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: prediction_type 'sample' is not implemented by "
                         "%s (diffusers raises too)", what, mmc_nsched_kind_name(kind));
    if (!strcmp(spacing, "linspace")) c->timestep_spacing = MMC_SPACING_LINSPACE;
    else if (!strcmp(spacing, "leading")) c->timestep_spacing = MMC_SPACING_LEADING;
    else if (!strcmp(spacing, "trailing")) c->timestep_spacing = MMC_SPACING_TRAILING;
    else return mmc_error(MMC_ERR_INVALID, "%s: timestep_spacing '%s' must be linspace, leading or trailing", what, spacing);

    if (kind == MMC_NSCHED_EULER || kind == MMC_NSCHED_DPM_MULTISTEP) {
        const char *fst = NULL;
        if ((st = mmc_json_bool(j, "use_karras_sigmas", false, &c->use_karras_sigmas)) ||
            (st = mmc_json_str(j, "final_sigmas_type", "zero", &fst)) ||
            (st = mmc_json_num(j, "sigma_min", NAN, &c->sigma_min)) ||
            (st = mmc_json_num(j, "sigma_max", NAN, &c->sigma_max)))
            return mmc_error_prefix(st, "%s: ", what);
        if ((st = need_false(j, what, "use_exponential_sigmas")) || (st = need_false(j, what, "use_beta_sigmas")))
            return st;
        if (!strcmp(fst, "sigma_min")) c->final_sigmas_sigma_min = true;
        else if (strcmp(fst, "zero") != 0)
            return mmc_error(MMC_ERR_INVALID, "%s: final_sigmas_type '%s' must be 'zero' or 'sigma_min'", what, fst);
    }
    if (kind == MMC_NSCHED_EULER) {
        const char *interp = NULL;
        if ((st = mmc_json_str(j, "interpolation_type", "linear", &interp))) return mmc_error_prefix(st, "%s: ", what);
        if (!strcmp(interp, "log_linear")) c->interpolation_log_linear = true;
        else if (strcmp(interp, "linear") != 0)
            return mmc_error(MMC_ERR_INVALID, "%s: interpolation_type '%s' must be 'linear' or 'log_linear'", what, interp);
        if ((st = need_default_str(j, what, "timestep_type", "discrete"))) return st;
    }
    if (kind == MMC_NSCHED_DPM_MULTISTEP) {
        int64_t order = 2;
        const char *alg = NULL, *solver = NULL;
        if ((st = mmc_json_int(j, "solver_order", 2, &order)) ||
            (st = mmc_json_str(j, "algorithm_type", "dpmsolver++", &alg)) ||
            (st = mmc_json_str(j, "solver_type", "midpoint", &solver)) ||
            (st = mmc_json_bool(j, "lower_order_final", true, &c->lower_order_final)) ||
            (st = mmc_json_bool(j, "euler_at_final", false, &c->euler_at_final)) ||
            (st = mmc_json_num(j, "lambda_min_clipped", -INFINITY, &c->lambda_min_clipped)))
            return mmc_error_prefix(st, "%s: ", what);
        if (order != 1 && order != 2)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: solver_order %lld is not supported (1 or 2)", what, (long long)order);
        c->solver_order = (int)order;
        if (!strcmp(alg, "sde-dpmsolver++")) c->sde = true;
        else if (strcmp(alg, "dpmsolver++") != 0 && strcmp(alg, "deis") != 0)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: algorithm_type '%s' is not supported (dpmsolver++ or "
                             "sde-dpmsolver++)", what, alg);
        if (!strcmp(solver, "heun")) c->solver_heun = true;
        else if (strcmp(solver, "midpoint") && strcmp(solver, "logrho") && strcmp(solver, "bh1") && strcmp(solver, "bh2"))
            return mmc_error(MMC_ERR_INVALID, "%s: solver_type '%s' must be 'midpoint' or 'heun'", what, solver);
        if ((st = need_false(j, what, "thresholding")) || (st = need_false(j, what, "use_lu_lambdas")) ||
            (st = need_false(j, what, "use_flow_sigmas")) || (st = need_false(j, what, "use_dynamic_shifting")))
            return st;
        if (!json_null_or_absent(j, "variance_type"))
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: variance_type (learned variance) is not supported; set it to null", what);
    }
    if (kind == MMC_NSCHED_UNIPC) {
        int64_t order = 2;
        const char *solver = NULL, *fst = NULL;
        bool predict_x0 = true;
        if ((st = mmc_json_int(j, "solver_order", 2, &order)) ||
            (st = mmc_json_str(j, "solver_type", "bh2", &solver)) ||
            (st = mmc_json_bool(j, "lower_order_final", true, &c->lower_order_final)) ||
            (st = mmc_json_bool(j, "predict_x0", true, &predict_x0)) ||
            (st = mmc_json_bool(j, "use_flow_sigmas", false, &c->use_flow_sigmas)) ||
            (st = mmc_json_num(j, "flow_shift", 1.0, &c->flow_shift)) ||
            (st = mmc_json_str(j, "final_sigmas_type", "zero", &fst)))
            return mmc_error_prefix(st, "%s: ", what);
        if (order != 1 && order != 2)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: solver_order %lld is not supported (1 or 2)", what, (long long)order);
        c->solver_order = (int)order;
        /* diffusers maps midpoint / heun / logrho to bh2 */
        if (!strcmp(solver, "bh1")) c->solver_bh1 = true;
        else if (strcmp(solver, "bh2") && strcmp(solver, "midpoint") && strcmp(solver, "heun") && strcmp(solver, "logrho"))
            return mmc_error(MMC_ERR_INVALID, "%s: solver_type '%s' must be 'bh1' or 'bh2'", what, solver);
        if (!predict_x0)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: predict_x0 false (UniPC on the noise prediction) is not supported; "
                             "set it to true", what);
        if (!strcmp(fst, "sigma_min")) c->final_sigmas_sigma_min = true;
        else if (strcmp(fst, "zero") != 0)
            return mmc_error(MMC_ERR_INVALID, "%s: final_sigmas_type '%s' must be 'zero' or 'sigma_min'", what, fst);
        if (!(c->flow_shift > 0))
            return mmc_error(MMC_ERR_INVALID, "%s: flow_shift %g must be positive", what, c->flow_shift);
        if (c->prediction_type == MMC_PRED_FLOW && !c->use_flow_sigmas)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: prediction_type 'flow_prediction' needs use_flow_sigmas true", what);
        if ((st = need_false(j, what, "thresholding")) || (st = need_false(j, what, "use_karras_sigmas")) ||
            (st = need_false(j, what, "use_exponential_sigmas")) || (st = need_false(j, what, "use_beta_sigmas")) ||
            (st = need_false(j, what, "use_dynamic_shifting")))
            return st;
        if (!json_null_or_absent(j, "solver_p"))
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: solver_p (another scheduler as the predictor) is not supported", what);
        if (!json_null_or_absent(j, "shift_terminal")) {
            double v = 0;
            if ((st = mmc_json_num(j, "shift_terminal", 0, &v))) return mmc_error_prefix(st, "%s: ", what);
            if (v) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: shift_terminal is not supported; set it to null", what);
        }
        const mmc_json *dc = mmc_json_get(j, "disable_corrector");
        int64_t tmp[1];
        int nd = 1;
        if (dc && (mmc_json_int_array(j, "disable_corrector", tmp, &nd) != MMC_OK || nd != 0))
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: disable_corrector must be an empty list (skipping the corrector at "
                             "chosen steps is not supported)", what);
    }
    if (kind == MMC_NSCHED_PNDM) {
        bool skip_prk = false;
        if ((st = mmc_json_bool(j, "skip_prk_steps", false, &skip_prk)) ||
            (st = mmc_json_bool(j, "set_alpha_to_one", false, &c->set_alpha_to_one)))
            return mmc_error_prefix(st, "%s: ", what);
        if (!skip_prk)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: PNDMScheduler's Runge-Kutta warm-up (skip_prk_steps false) is not "
                             "supported; set skip_prk_steps to true (as Stable Diffusion ships it)", what);
    }
    if (kind == MMC_NSCHED_DDIM) {
        if ((st = mmc_json_bool(j, "clip_sample", true, &c->clip_sample)) ||
            (st = mmc_json_bool(j, "set_alpha_to_one", true, &c->set_alpha_to_one)) ||
            (st = mmc_json_num(j, "clip_sample_range", 1.0, &c->clip_sample_range)))
            return mmc_error_prefix(st, "%s: ", what);
        if ((st = need_false(j, what, "thresholding"))) return st;
    }
    return MMC_OK;
}

void mmc_nsched_free(mmc_nsched *s) {
    if (!s) return;
    free(s->alphas_cumprod);
    free(s->timesteps);
    free(s->sigmas);
    free(s->prev_x0);
    free(s->pndm_buf);
    free(s->unipc_buf);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- training schedule */

/* torch.linspace(a, b, n, dtype=float32): a fused multiply-add from the nearer end. */
static void torch_linspace_f32(float a, float b, int64_t n, float *out) {
    if (n == 1) { out[0] = a; return; }
    const float step = (b - a) / (float)(n - 1);
    const int64_t half = n / 2;
    for (int64_t i = 0; i < n; i++)
        out[i] = i < half ? fmaf(step, (float)i, a) : fmaf(-step, (float)(n - i - 1), b);
}

static double alpha_bar_cos(double t) {
    double c = cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
}

/* torch.cumprod on the CPU: accumulated in double, each prefix rounded to float. */
static void cumprod_f32(const float *a, int64_t n, float *out) {
    double acc = 1.0;
    for (int64_t i = 0; i < n; i++) {
        acc *= (double)a[i];
        out[i] = (float)acc;
    }
}

mmc_status mmc_nsched_init(const mmc_nsched_config *c, mmc_nsched *s) {
    memset(s, 0, sizeof *s);
    s->cfg = *c;
    const int64_t T = c->num_train_timesteps;
    float *betas = malloc((size_t)T * sizeof(float)), *alphas = malloc((size_t)T * sizeof(float));
    s->alphas_cumprod = calloc((size_t)T, sizeof(float));
    if (!betas || !alphas || !s->alphas_cumprod) {
        free(betas);
        free(alphas);
        mmc_nsched_free(s);
        return mmc_error(MMC_ERR_OOM, "scheduler: out of memory for %lld timesteps", (long long)T);
    }
    switch (c->beta_schedule) {
    case MMC_BETA_LINEAR: torch_linspace_f32((float)c->beta_start, (float)c->beta_end, T, betas); break;
    case MMC_BETA_SCALED_LINEAR:
        torch_linspace_f32((float)sqrt(c->beta_start), (float)sqrt(c->beta_end), T, betas);
        for (int64_t i = 0; i < T; i++) betas[i] = betas[i] * betas[i];
        break;
    case MMC_BETA_SQUAREDCOS:   /* betas_for_alpha_bar in Python floats, then float32 */
        for (int64_t i = 0; i < T; i++) {
            double t1 = (double)i / (double)T, t2 = (double)(i + 1) / (double)T;
            double b = 1 - alpha_bar_cos(t2) / alpha_bar_cos(t1);
            betas[i] = (float)(b < 0.999 ? b : 0.999);
        }
        break;
    }
    float *ac = s->alphas_cumprod;
    if (c->rescale_betas_zero_snr) {   /* rescale_zero_terminal_snr, torch float32 */
        for (int64_t i = 0; i < T; i++) alphas[i] = 1.0f - betas[i];
        cumprod_f32(alphas, T, ac);
        for (int64_t i = 0; i < T; i++) ac[i] = sqrtf(ac[i]);
        const float a0 = ac[0], aT = ac[T - 1], k = a0 / (a0 - aT);
        for (int64_t i = 0; i < T; i++) {
            ac[i] = (ac[i] - aT) * k;
            ac[i] = ac[i] * ac[i];
        }
        betas[0] = 1.0f - ac[0];
        for (int64_t i = 1; i < T; i++) betas[i] = 1.0f - ac[i] / ac[i - 1];
    }
    for (int64_t i = 0; i < T; i++) alphas[i] = 1.0f - betas[i];
    cumprod_f32(alphas, T, ac);
    s->train_ac_last = ac[T - 1];
    if (c->rescale_betas_zero_snr && c->kind != MMC_NSCHED_DDIM) ac[T - 1] = 0x1p-24f;
    free(betas);
    free(alphas);
    s->init_noise_sigma = 1.0f;
    return MMC_OK;
}

/* Replace diffusers' non-JSON -Infinity / Infinity / NaN (Python's json.dumps writes them) by
 * numbers strtod reads as such (1e999 overflows to inf) or null. */
static char *fix_nonfinite(const char *in, size_t len) {
    char *out = malloc(len * 2 + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool str = false;
    for (size_t i = 0; i < len; i++) {
        if (in[i] == '"' && (i == 0 || in[i - 1] != '\\')) str = !str;
        if (!str && len - i >= 8 && !strncmp(in + i, "Infinity", 8)) {
            memcpy(out + o, "1e999", 5);
            o += 5;
            i += 7;
        } else if (!str && len - i >= 3 && !strncmp(in + i, "NaN", 3)) {
            memcpy(out + o, "null", 4);
            o += 4;
            i += 2;
        } else {
            out[o++] = in[i];
        }
    }
    out[o] = 0;
    return out;
}

mmc_status mmc_nsched_load(const char *dir, mmc_nsched *out) {
    memset(out, 0, sizeof *out);
    char path[1024];
    snprintf(path, sizeof path, "%s/scheduler_config.json", dir);
    char *text = NULL, *fixed = NULL;
    size_t len = 0;
    mmc_json *j = NULL;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return st;
    fixed = fix_nonfinite(text, len);
    free(text);
    if (!fixed) return mmc_error(MMC_ERR_OOM, "%s: out of memory", path);
    st = mmc_json_parse(fixed, strlen(fixed), path, &j);
    free(fixed);
    if (st) return st;
    mmc_nsched_config c;
    st = mmc_nsched_config_read(j, path, &c);
    mmc_json_free(j);
    return st ? st : mmc_nsched_init(&c, out);
}

/* ---------------------------------------------------------------- numpy helpers (float64) */

/* np.linspace(a, b, n): i * ((b - a) / (n - 1)) + a, the last exactly b. */
static double np_linspace_at(double a, double b, int n, int i) {
    if (n == 1) return a;
    if (i == n - 1) return b;
    return (double)i * ((b - a) / (double)(n - 1)) + a;
}

/* np.arange(start, 0, -step) for a float step: ceil((0 - start) / -step) values,
 * start + i * ((start - step) - start). Returns the count (<= cap). */
static int np_arange_down(double start, double step, double *out, int cap) {
    double d = -step;
    double len = ceil((0.0 - start) / d);
    int n = len > 0 ? (int)len : 0;
    if (n > cap) n = cap;
    if (n >= 1) out[0] = start;
    double delta = (start + d) - start;
    for (int i = 1; i < n; i++) out[i] = start + (double)i * delta;
    return n;
}

/* np.interp(x, arange(len), fp) for fp of float32 values. */
static double np_interp_arange(double x, const float *fp, int64_t len) {
    if (x <= 0) return fp[0];
    if (x >= (double)(len - 1)) return fp[len - 1];
    int64_t j = (int64_t)floor(x);
    if ((double)j == x) return fp[j];
    double slope = ((double)fp[j + 1] - (double)fp[j]) / ((double)(j + 1) - (double)j);
    return slope * (x - (double)j) + (double)fp[j];
}

/* _sigma_to_t: sigma (float64) against log_sigmas (float32, ascending) -> fractional index. */
static double sigma_to_t(double sigma, const float *log_sigmas, int64_t T) {
    double ls = log(sigma > 1e-10 ? sigma : 1e-10);
    int64_t low = 0;   /* the last index with log_sigmas[i] <= ls (cumsum(...).argmax()), 0 if none */
    for (int64_t i = 0; i < T; i++)
        if (ls - (double)log_sigmas[i] >= 0) low = i;
    if (low > T - 2) low = T - 2;
    const float lo = log_sigmas[low], hi = log_sigmas[low + 1];
    double w = ((double)lo - ls) / (double)(lo - hi);
    w = w < 0 ? 0 : w > 1 ? 1 : w;
    return (1 - w) * (double)low + w * (double)(low + 1);
}

/* _convert_to_karras (rho 7) into out[n] (float64). */
static void karras(double smin, double smax, int n, double *out) {
    const double rho = 7.0, min_inv = pow(smin, 1 / rho), max_inv = pow(smax, 1 / rho);
    for (int i = 0; i < n; i++) out[i] = pow(max_inv + np_linspace_at(0, 1, n, i) * (min_inv - max_inv), rho);
}

/* ---------------------------------------------------------------- set_timesteps */

mmc_status mmc_nsched_set_timesteps(mmc_nsched *s, int n) {
    const mmc_nsched_config *c = &s->cfg;
    const int64_t T = c->num_train_timesteps;
    if (n < 1 || n > T)
        return mmc_error(MMC_ERR_INVALID, "%s: %d inference steps: must be in [1, num_train_timesteps = %lld]",
                         mmc_nsched_kind_name(c->kind), n, (long long)T);
    free(s->timesteps);
    free(s->sigmas);
    free(s->prev_x0);
    free(s->pndm_buf);
    free(s->unipc_buf);
    s->timesteps = s->sigmas = s->prev_x0 = s->pndm_buf = s->unipc_buf = NULL;
    s->unipc_order = 0;
    s->n_elem = 0;
    s->lower_order_nums = 0;
    s->n_ets = s->counter = 0;
    s->num_inference_steps = n;
    const int cap = n + 2;
    double *ts = calloc((size_t)cap, sizeof(double)), *sg = calloc((size_t)cap + 1, sizeof(double));
    float *sig_full = malloc((size_t)T * sizeof(float)), *log_sig = malloc((size_t)T * sizeof(float));
    mmc_status st = MMC_OK;
    if (!ts || !sg || !sig_full || !log_sig) { st = mmc_error(MMC_ERR_OOM, "scheduler: out of memory"); goto fail; }
    for (int64_t i = 0; i < T; i++) {
        const float a = s->alphas_cumprod[i];
        sig_full[i] = sqrtf((1.0f - a) / a);
        log_sig[i] = logf(sig_full[i]);
    }
    /* DPM-Solver and UniPC space their integer timesteps alike (n + 1 points, the last dropped) */
    const bool dpm = c->kind == MMC_NSCHED_DPM_MULTISTEP || c->kind == MMC_NSCHED_UNIPC;
    int m = n;   /* timesteps produced */
    int ns = m;
    if (c->kind == MMC_NSCHED_UNIPC && c->use_flow_sigmas) {
        /* np.linspace(1, 1/T, n + 1)[:-1], shifted, the first nudged below 1; timesteps = int64(sigma * T) */
        const double fs = c->flow_shift;
        for (int i = 0; i < n; i++) {
            double sgm = np_linspace_at(1.0, 1.0 / (double)T, n + 1, i);
            sg[i] = fs * sgm / (1 + (fs - 1) * sgm);
        }
        if (fabs(sg[0] - 1) < 1e-6) sg[0] -= 1e-6;
        for (int i = 0; i < n; i++) ts[i] = trunc(sg[i] * (double)T);
        sg[n] = c->final_sigmas_sigma_min ? sg[n - 1] : 0.0;
        goto store_sigmas;
    }

    /* the spacing (numpy float64; DPM-Solver's int64 over n + 1 points, DDIM's rounded int64) */
    int64_t last = T;
    if (dpm && c->lambda_min_clipped > -INFINITY) {
        /* searchsorted(flip(lambda_t), lambda_min_clipped): lambda_t in float32 torch */
        int64_t idx = 0;
        for (int64_t i = T - 1; i >= 0; i--) {
            const float a = s->alphas_cumprod[i];
            float lam = logf(sqrtf(a)) - logf(sqrtf(1.0f - a));
            if ((double)lam < c->lambda_min_clipped) idx++;
        }
        last = T - idx;
    }
    if (c->timestep_spacing == MMC_SPACING_LINSPACE) {
        if (dpm) {
            for (int i = 0; i < n; i++) ts[i] = nearbyint(np_linspace_at(0, (double)(last - 1), n + 1, n - i));
        } else if (c->kind == MMC_NSCHED_DDIM || c->kind == MMC_NSCHED_PNDM) {
            for (int i = 0; i < n; i++) ts[i] = nearbyint(np_linspace_at(0, (double)(T - 1), n, n - 1 - i));
        } else {   /* Euler kinds: dtype float32 */
            for (int i = 0; i < n; i++) ts[i] = (float)np_linspace_at(0, (double)(T - 1), n, n - 1 - i);
        }
    } else if (c->timestep_spacing == MMC_SPACING_LEADING) {
        const int64_t ratio = dpm ? last / (n + 1) : T / n;
        for (int i = 0; i < n; i++) ts[i] = (double)((int64_t)(dpm ? n - i : n - 1 - i) * ratio + c->steps_offset);
    } else {
        double r[64 + 1], *buf = n + 2 <= 65 ? r : malloc((size_t)(n + 2) * sizeof(double));
        if (!buf) { st = mmc_error(MMC_ERR_OOM, "scheduler: out of memory"); goto fail; }
        m = np_arange_down(dpm ? (double)last : (double)T, (double)T / (double)n, buf, n + 1);
        for (int i = 0; i < m; i++) ts[i] = nearbyint(buf[i]) - 1;
        if (buf != r) free(buf);
    }
    if (c->kind == MMC_NSCHED_EULER || c->kind == MMC_NSCHED_EULER_ANCESTRAL)
        for (int i = 0; i < m; i++) ts[i] = (float)ts[i];   /* .astype(np.float32) */

    if (c->kind == MMC_NSCHED_PNDM && m >= 2) {
        /* plms_timesteps (skip_prk_steps): the descending spacing with its second-smallest value
         * repeated (the PLMS warm-up step runs twice at it): [t_m-1, ..., t_1, t_1, t_0] */
        for (int i = m; i > 1; i--) ts[i] = ts[i - 1];
        m++;
    }
    if (c->kind == MMC_NSCHED_DDIM || c->kind == MMC_NSCHED_PNDM) goto done;

    /* sigmas (float64 until the final float32 cast): ns of them, then the final one */
    ns = m;
    if (c->kind == MMC_NSCHED_EULER && c->interpolation_log_linear) {
        /* torch.linspace(log(s[-1]), log(s[0]), n + 1).exp() in float32 */
        float *tmp = malloc((size_t)(m + 1) * sizeof(float));
        if (!tmp) { st = mmc_error(MMC_ERR_OOM, "scheduler: out of memory"); goto fail; }
        torch_linspace_f32(log_sig[T - 1], log_sig[0], m + 1, tmp);
        for (int i = 0; i <= m; i++) sg[i] = expf(tmp[i]);
        free(tmp);
        ns = m + 1;   /* diffusers' log_linear schedule: n + 1 sigmas before the final one is appended */
    } else {
        for (int i = 0; i < m; i++) sg[i] = np_interp_arange(ts[i], sig_full, T);
    }
    if (c->use_karras_sigmas) {
        double smin, smax;
        if (dpm) { smin = sig_full[0]; smax = sig_full[T - 1]; }   /* np.flip(sigmas) */
        else { smin = sg[ns - 1]; smax = sg[0]; }
        if (!isnan(c->sigma_min)) smin = c->sigma_min;
        if (!isnan(c->sigma_max)) smax = c->sigma_max;
        karras(smin, smax, n, sg);
        m = ns = n;
        for (int i = 0; i < m; i++) {
            double t = sigma_to_t(sg[i], log_sig, T);
            ts[i] = dpm ? (c->beta_schedule != MMC_BETA_SQUAREDCOS ? nearbyint(t) : trunc(t)) : (double)(float)t;
        }
    }
    sg[ns] = c->final_sigmas_sigma_min ? (double)sqrtf((1.0f - s->alphas_cumprod[0]) / s->alphas_cumprod[0]) : 0.0;
store_sigmas:
    s->sigmas = malloc((size_t)(ns + 1) * sizeof(float));
    if (!s->sigmas) { st = mmc_error(MMC_ERR_OOM, "scheduler: out of memory"); goto fail; }
    float smax = 0;
    for (int i = 0; i <= ns; i++) {
        s->sigmas[i] = (float)sg[i];
        if (s->sigmas[i] > smax) smax = s->sigmas[i];
    }
    if (c->kind == MMC_NSCHED_EULER || c->kind == MMC_NSCHED_EULER_ANCESTRAL)
        s->init_noise_sigma = c->timestep_spacing == MMC_SPACING_LEADING ? sqrtf(smax * smax + 1.0f) : smax;
done:
    s->timesteps = malloc((size_t)m * sizeof(float));
    if (!s->timesteps) { st = mmc_error(MMC_ERR_OOM, "scheduler: out of memory"); goto fail; }
    for (int i = 0; i < m; i++) s->timesteps[i] = (float)ts[i];
    s->n = m;
fail:
    free(ts);
    free(sg);
    free(sig_full);
    free(log_sig);
    return st;
}

/* ---------------------------------------------------------------- scale_model_input, step */

/* PNDMScheduler._get_prev_sample from timestep t to prev (float32 torch) */
static void pndm_prev(const mmc_nsched *s, int64_t t, int64_t prev, const float *x, const float *mo, float *out, int64_t n) {
    const mmc_nsched_config *c = &s->cfg;
    const float at = s->alphas_cumprod[t];
    const float ap = prev >= 0 ? s->alphas_cumprod[prev] : c->set_alpha_to_one ? 1.0f : s->alphas_cumprod[0];
    const float bt = 1.0f - at, bp = 1.0f - ap;
    const float sc = sqrtf(ap / at), denom = at * sqrtf(bp) + sqrtf(at * bt * ap), dif = ap - at;
    const float sat = sqrtf(at), sbt = sqrtf(bt);
    for (int64_t k = 0; k < n; k++) {
        const float e = c->prediction_type == MMC_PRED_V ? sat * mo[k] + sbt * x[k] : mo[k];
        out[k] = sc * x[k] - dif * e / denom;
    }
}

/* PNDMScheduler.step_plms (skip_prk_steps) at step i; x in place. */
static mmc_status pndm_step(mmc_nsched *s, int i, const float *mo, float *x, int64_t n) {
    if (s->pndm_buf && s->n_elem != n)
        return mmc_error(MMC_ERR_INVALID, "PNDMScheduler: step %d on %lld values, the previous on %lld", i,
                         (long long)n, (long long)s->n_elem);
    if (!s->pndm_buf) {
        s->pndm_buf = malloc((size_t)n * 5 * sizeof(float));
        if (!s->pndm_buf) return mmc_error(MMC_ERR_OOM, "PNDMScheduler: out of memory");
        s->n_elem = n;
        for (int k = 0; k < 4; k++) s->ets[k] = s->pndm_buf + (int64_t)k * n;
        s->n_ets = 0;
    }
    float *cur = s->pndm_buf + 4 * n;
    const int64_t ratio = s->cfg.num_train_timesteps / s->num_inference_steps;
    int64_t t = (int64_t)s->timesteps[i], prev = t - ratio;
    if (s->counter != 1) {   /* ets = ets[-3:] + [model_output] */
        if (s->n_ets == 4) {
            float *old = s->ets[0];
            s->ets[0] = s->ets[1], s->ets[1] = s->ets[2], s->ets[2] = s->ets[3], s->ets[3] = old;
            s->n_ets = 3;
        }
        memcpy(s->ets[s->n_ets++], mo, (size_t)n * sizeof(float));
    } else {
        prev = t;
        t = t + ratio;
    }
    float *e = malloc((size_t)n * sizeof(float));
    if (!e) return mmc_error(MMC_ERR_OOM, "PNDMScheduler: out of memory");
    const float *const *E = (const float *const *)s->ets;
    const int L = s->n_ets;
    const float *src = x;
    if (L == 1 && s->counter == 0) {
        memcpy(e, mo, (size_t)n * sizeof(float));
        memcpy(cur, x, (size_t)n * sizeof(float));
    } else if (L == 1 && s->counter == 1) {
        for (int64_t k = 0; k < n; k++) e[k] = (mo[k] + E[0][k]) / 2.0f;
        src = cur;
    } else if (L == 2) {
        for (int64_t k = 0; k < n; k++) e[k] = (3.0f * E[1][k] - E[0][k]) / 2.0f;
    } else if (L == 3) {
        for (int64_t k = 0; k < n; k++) e[k] = (23.0f * E[2][k] - 16.0f * E[1][k] + 5.0f * E[0][k]) / 12.0f;
    } else {
        const float k24 = (float)(1.0 / 24.0);
        for (int64_t k = 0; k < n; k++)
            e[k] = k24 * (55.0f * E[3][k] - 59.0f * E[2][k] + 37.0f * E[1][k] - 9.0f * E[0][k]);
    }
    pndm_prev(s, t, prev, src, e, x, n);
    free(e);
    s->counter++;
    return MMC_OK;
}

float mmc_nsched_input_divisor(const mmc_nsched *s, int i) {
    if (s->cfg.kind != MMC_NSCHED_EULER && s->cfg.kind != MMC_NSCHED_EULER_ANCESTRAL) return 1.0f;
    const float sg = s->sigmas[i];
    return sqrtf(sg * sg + 1.0f);
}

void mmc_nsched_scale_model_input(const mmc_nsched *s, int i, const float *in, float *out, int64_t n) {
    const float d = mmc_nsched_input_divisor(s, i);
    for (int64_t k = 0; k < n; k++) out[k] = in[k] / d;
}

/* _sigma_to_alpha_sigma_t in float32 */
static void alpha_sigma(float sigma, float *alpha_t, float *sigma_t) {
    *alpha_t = 1.0f / sqrtf(sigma * sigma + 1.0f);
    *sigma_t = sigma * *alpha_t;
}

static mmc_status dpm_step(mmc_nsched *s, int i, const float *mo, float *x, int64_t n, const float *noise) {
    const mmc_nsched_config *c = &s->cfg;
    if (s->prev_x0 && s->n_elem != n)
        return mmc_error(MMC_ERR_INVALID, "DPMSolverMultistepScheduler: step %d on %lld values, the previous on %lld",
                         i, (long long)n, (long long)s->n_elem);
    if (!s->prev_x0) {
        s->prev_x0 = malloc((size_t)n * sizeof(float));
        if (!s->prev_x0) return mmc_error(MMC_ERR_OOM, "DPMSolverMultistepScheduler: out of memory");
        s->n_elem = n;
    }
    const int N = s->n;
    const bool lof = i == N - 1 && (c->euler_at_final || (c->lower_order_final && N < 15) || !c->final_sigmas_sigma_min);
    float a_s0, s_s0, a_t, s_t;
    alpha_sigma(s->sigmas[i], &a_s0, &s_s0);
    alpha_sigma(s->sigmas[i + 1], &a_t, &s_t);
    const float lam_t = logf(a_t) - logf(s_t), lam_s0 = logf(a_s0) - logf(s_s0), h = lam_t - lam_s0;
    const bool first = c->solver_order == 1 || s->lower_order_nums < 1 || lof;
    float r0inv = 0;
    if (!first) {
        float a_s1, s_s1;
        alpha_sigma(s->sigmas[i - 1], &a_s1, &s_s1);
        const float lam_s1 = logf(a_s1) - logf(s_s1), h0 = lam_s0 - lam_s1, r0 = h0 / h;
        r0inv = 1.0f / r0;
    }
    const float em = expf(-h), e2 = expf(-2.0f * h);
    const float ratio = s_t / s_s0;
    /* coefficients as diffusers groups its scalar factors */
    const float k_ode = a_t * (em - 1.0f), k_sde = a_t * (1.0f - e2), k_noise = s_t * sqrtf(1.0f - e2);
    const float k_sde_x = ratio * em;
    float k_d1;
    if (!c->sde) k_d1 = c->solver_heun ? a_t * ((em - 1.0f) / h + 1.0f) : 0.5f * k_ode;
    else k_d1 = c->solver_heun ? a_t * ((1.0f - e2) / (-2.0f * h) + 1.0f) : 0.5f * k_sde;
    for (int64_t k = 0; k < n; k++) {
        float x0;   /* convert_model_output (dpmsolver++: the data prediction) */
        if (c->prediction_type == MMC_PRED_EPSILON) x0 = (x[k] - s_s0 * mo[k]) / a_s0;
        else if (c->prediction_type == MMC_PRED_V) x0 = a_s0 * x[k] - s_s0 * mo[k];
        else x0 = mo[k];
        float out;
        if (first) {
            out = !c->sde ? ratio * x[k] - k_ode * x0 : k_sde_x * x[k] + k_sde * x0 + k_noise * noise[k];
        } else {
            const float d1 = r0inv * (x0 - s->prev_x0[k]);
            if (!c->sde) out = c->solver_heun ? ratio * x[k] - k_ode * x0 + k_d1 * d1 : ratio * x[k] - k_ode * x0 - k_d1 * d1;
            else out = k_sde_x * x[k] + k_sde * x0 + k_d1 * d1 + k_noise * noise[k];
        }
        s->prev_x0[k] = x0;
        x[k] = out;
    }
    if (s->lower_order_nums < c->solver_order) s->lower_order_nums++;
    return MMC_OK;
}

/* UniPC's _sigma_to_alpha_sigma_t and lambda = log(alpha) - log(sigma), float32 */
static float unipc_lambda(const mmc_nsched *s, float sigma, float *alpha_t, float *sigma_t) {
    if (s->cfg.use_flow_sigmas) *alpha_t = 1.0f - sigma, *sigma_t = sigma;
    else alpha_sigma(sigma, alpha_t, sigma_t);
    return logf(*alpha_t) - logf(*sigma_t);
}

/* multistep_uni_p_bh_update (p = order; at p = 2 rhos_p = 0.5) and, with model_t,
 * multistep_uni_c_bh_update (p = 1: rhos_c = 0.5; p = 2: torch.linalg.solve of the 2 x 2 system,
 * LU with partial pivoting as LAPACK's sgesv does it), predict_x0, from sigma index s0 to t:
 *   x_t = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0 - alpha_t * B_h * (rhos . D1s [+ rho_c * D1_t])
 * m0 the last data prediction, m1 the one before (order 2), x the sample at s0 (n values). */
static void unipc_update(const mmc_nsched *s, int s0, int t, int order, const float *m0, const float *m1,
                         const float *model_t, const float *x, float *out, int64_t n) {
    float a_t, s_t, a_s0, s_s0, a_s1, s_s1;
    const float lam_t = unipc_lambda(s, s->sigmas[t], &a_t, &s_t);
    const float lam_s0 = unipc_lambda(s, s->sigmas[s0], &a_s0, &s_s0);
    const float h = lam_t - lam_s0;
    float rk = 1.0f;
    if (order == 2) rk = (unipc_lambda(s, s->sigmas[s0 - 1], &a_s1, &s_s1) - lam_s0) / h;
    const float hh = -h, h_phi_1 = expm1f(hh);
    const float B_h = s->cfg.solver_bh1 ? hh : expm1f(hh);
    float rho_p = 0.5f, rho_c0 = 0.0f, rho_c1 = 0.5f;
    if (model_t && order == 2) {
        const float hk1 = h_phi_1 / hh - 1.0f, b1 = hk1 * 1.0f / B_h;
        const float hk2 = hk1 / hh - 0.5f, b2 = hk2 * 2.0f / B_h;
        /* R = [[1, 1], [rk, 1]]: rhos = R^-1 [b1, b2] */
        if (fabsf(rk) > 1.0f) {
            const float l = 1.0f * (1.0f / rk), u = 1.0f - l * 1.0f, y = b1 - l * b2;
            rho_c1 = y / u;
            rho_c0 = (b2 - 1.0f * rho_c1) / rk;
        } else {
            const float l = rk, u = 1.0f - l * 1.0f, y = b2 - l * b1;
            rho_c1 = y / u;
            rho_c0 = (b1 - 1.0f * rho_c1) / 1.0f;
        }
    }
    const float kx = s_t / s_s0, km = a_t * h_phi_1, kb = a_t * B_h;
    for (int64_t k = 0; k < n; k++) {
        const float xt_ = kx * x[k] - km * m0[k];
        float res;
        if (!model_t) res = order == 2 ? rho_p * ((m1[k] - m0[k]) / rk) : 0.0f;
        else {
            const float corr = order == 2 ? rho_c0 * ((m1[k] - m0[k]) / rk) : 0.0f;
            res = corr + rho_c1 * (model_t[k] - m0[k]);
        }
        out[k] = xt_ - kb * res;
    }
}

/* UniPCMultistepScheduler.step at index i: convert to the data prediction, correct the sample with
 * it (UniC, from the second step), predict the next (UniP). */
static mmc_status unipc_step(mmc_nsched *s, int i, const float *mo, float *x, int64_t n) {
    const mmc_nsched_config *c = &s->cfg;
    if (s->unipc_buf && s->n_elem != n)
        return mmc_error(MMC_ERR_INVALID, "UniPCMultistepScheduler: step %d on %lld values, the previous on %lld", i,
                         (long long)n, (long long)s->n_elem);
    if (!s->unipc_buf) {
        if (i != 0)
            return mmc_error(MMC_ERR_INVALID, "UniPCMultistepScheduler: steps must start at 0 after set_timesteps "
                             "(step %d came first)", i);
        s->unipc_buf = malloc((size_t)n * 4 * sizeof(float));
        if (!s->unipc_buf) return mmc_error(MMC_ERR_OOM, "UniPCMultistepScheduler: out of memory");
        s->n_elem = n;
    }
    float *m_prev = s->unipc_buf, *m_last = m_prev + n, *last = m_last + n, *x0 = last + n;
    float a_s, s_s;
    unipc_lambda(s, s->sigmas[i], &a_s, &s_s);
    const float sg = s->sigmas[i];
    for (int64_t k = 0; k < n; k++) {
        if (c->prediction_type == MMC_PRED_FLOW) x0[k] = x[k] - sg * mo[k];
        else if (c->prediction_type == MMC_PRED_EPSILON) x0[k] = (x[k] - s_s * mo[k]) / a_s;
        else if (c->prediction_type == MMC_PRED_V) x0[k] = a_s * x[k] - s_s * mo[k];
        else x0[k] = mo[k];
    }
    if (i > 0 && s->unipc_order > 0)   /* the corrector, with the order of the last predictor */
        unipc_update(s, i - 1, i, s->unipc_order, m_last, m_prev, x0, last, x, n);
    memcpy(m_prev, m_last, (size_t)n * sizeof(float));
    memcpy(m_last, x0, (size_t)n * sizeof(float));
    int order = c->solver_order;
    if (c->lower_order_final && s->n - i < order) order = s->n - i;
    if (order > s->lower_order_nums + 1) order = s->lower_order_nums + 1;
    s->unipc_order = order;
    memcpy(last, x, (size_t)n * sizeof(float));
    unipc_update(s, i, i + 1, order, m_last, m_prev, NULL, last, x, n);
    if (s->lower_order_nums < c->solver_order) s->lower_order_nums++;
    return MMC_OK;
}

mmc_status mmc_nsched_step(mmc_nsched *s, int i, const float *mo, float *x, int64_t n, const float *noise) {
    const mmc_nsched_config *c = &s->cfg;
    if (!s->timesteps || i < 0 || i >= s->n)
        return mmc_error(MMC_ERR_INVALID, "%s: step %d outside the %d timesteps of set_timesteps",
                         mmc_nsched_kind_name(c->kind), i, s->n);
    const bool needs_noise = c->kind == MMC_NSCHED_EULER_ANCESTRAL || (c->kind == MMC_NSCHED_DPM_MULTISTEP && c->sde) ||
                             (c->kind == MMC_NSCHED_DDIM && s->eta > 0);
    if (needs_noise && !noise)
        return mmc_error(MMC_ERR_INVALID, "%s: this step draws noise; pass a noise tensor", mmc_nsched_kind_name(c->kind));
    switch (c->kind) {
    case MMC_NSCHED_EULER: {
        const float sg = s->sigmas[i], dt = s->sigmas[i + 1] - sg;
        const float vc = -sg / sqrtf(sg * sg + 1.0f), vd = sg * sg + 1.0f;
        for (int64_t k = 0; k < n; k++) {
            float x0;
            if (c->prediction_type == MMC_PRED_EPSILON) x0 = x[k] - sg * mo[k];
            else if (c->prediction_type == MMC_PRED_V) x0 = mo[k] * vc + x[k] / vd;
            else x0 = mo[k];
            const float d = (x[k] - x0) / sg;
            x[k] = x[k] + d * dt;
        }
        return MMC_OK;
    }
    case MMC_NSCHED_EULER_ANCESTRAL: {
        const float sf = s->sigmas[i], st = s->sigmas[i + 1];
        const float up = sqrtf(st * st * (sf * sf - st * st) / (sf * sf));
        const float down = sqrtf(st * st - up * up), dt = down - sf;
        const float vc = -sf / sqrtf(sf * sf + 1.0f), vd = sf * sf + 1.0f;
        for (int64_t k = 0; k < n; k++) {
            const float x0 = c->prediction_type == MMC_PRED_EPSILON ? x[k] - sf * mo[k] : mo[k] * vc + x[k] / vd;
            const float d = (x[k] - x0) / sf;
            x[k] = (x[k] + d * dt) + noise[k] * up;
        }
        return MMC_OK;
    }
    case MMC_NSCHED_DPM_MULTISTEP: return dpm_step(s, i, mo, x, n, noise);
    case MMC_NSCHED_PNDM: return pndm_step(s, i, mo, x, n);
    case MMC_NSCHED_UNIPC: return unipc_step(s, i, mo, x, n);
    case MMC_NSCHED_DDIM: {
        const int64_t t = (int64_t)s->timesteps[i], T = c->num_train_timesteps;
        const int64_t tp = t - T / s->num_inference_steps;
        if (t < 0 || t >= T)
            return mmc_error(MMC_ERR_INVALID, "DDIMScheduler: timestep %lld outside [0, %lld)", (long long)t, (long long)T);
        const float at = s->alphas_cumprod[t];
        const float ap = tp >= 0 ? s->alphas_cumprod[tp] : c->set_alpha_to_one ? 1.0f : s->alphas_cumprod[0];
        const float bt = 1.0f - at, bp = 1.0f - ap;
        const float sat = sqrtf(at), sbt = sqrtf(bt), sap = sqrtf(ap);
        const float var = bp / bt * (1.0f - at / ap);
        const float sd = (float)s->eta * sqrtf(var);
        const float kdir = sqrtf(1.0f - ap - sd * sd);
        const float lo = (float)-c->clip_sample_range, hi = (float)c->clip_sample_range;
        for (int64_t k = 0; k < n; k++) {
            float x0, pe;
            if (c->prediction_type == MMC_PRED_EPSILON) { x0 = (x[k] - sbt * mo[k]) / sat; pe = mo[k]; }
            else if (c->prediction_type == MMC_PRED_SAMPLE) { x0 = mo[k]; pe = (x[k] - sat * x0) / sbt; }
            else { x0 = sat * x[k] - sbt * mo[k]; pe = sat * mo[k] + sbt * x[k]; }
            if (c->clip_sample) x0 = x0 < lo ? lo : x0 > hi ? hi : x0;
            float out = sap * x0 + kdir * pe;
            if (s->eta > 0) out = out + sd * noise[k];
            x[k] = out;
        }
        return MMC_OK;
    }
    }
    return MMC_ERR_INVALID;
}

/* ---------------------------------------------------------------- training (DDPMScheduler) */

static float train_ac(const mmc_nsched *s, int64_t t) {
    MMC_CHECK(t >= 0 && t < s->cfg.num_train_timesteps, "scheduler: training timestep %lld outside [0, %lld)",
              (long long)t, (long long)s->cfg.num_train_timesteps);
    return t == s->cfg.num_train_timesteps - 1 ? s->train_ac_last : s->alphas_cumprod[t];
}

void mmc_nsched_add_noise(const mmc_nsched *s, const int64_t *t, int64_t B, int64_t per, const float *x0,
                          const float *noise, float *out) {
    for (int64_t b = 0; b < B; b++) {
        const float ac = train_ac(s, t[b]), sa = sqrtf(ac), so = sqrtf(1.0f - ac);
        for (int64_t k = b * per; k < (b + 1) * per; k++) out[k] = sa * x0[k] + so * noise[k];
    }
}

void mmc_nsched_velocity(const mmc_nsched *s, const int64_t *t, int64_t B, int64_t per, const float *x0,
                         const float *noise, float *out) {
    for (int64_t b = 0; b < B; b++) {
        const float ac = train_ac(s, t[b]), sa = sqrtf(ac), so = sqrtf(1.0f - ac);
        for (int64_t k = b * per; k < (b + 1) * per; k++) out[k] = sa * noise[k] - so * x0[k];
    }
}

float mmc_nsched_snr(const mmc_nsched *s, int64_t t) {
    const float ac = train_ac(s, t), r = sqrtf(ac) / sqrtf(1.0f - ac);
    return r * r;
}
