/* plan.c — the cost model of `mmc plan` (mmc_plan.h): step time and memory per rank of a
 * parallel layout of a Qwen2 / Qwen2-VL training run, from FLOPs, bytes and an alpha-beta model
 * of each collective. Nothing here is copied from another planner; the formulas are the
 * textbook ones (Narayanan et al. 2021 for the pipeline bubble and Megatron's collectives,
 * Korthikanti et al. 2022 for which activations a layer keeps, Rajbhandari et al. 2020 for the
 * ZeRO stages' memory), applied to what mmc's trainer actually holds (see the comments).
 *
 * Per micro-batch of b samples of S tokens on a rank with tensor-parallel size t, context size c:
 *   tokens        Tl = b S / c
 *   GEMM FLOPs    fwd 2 Tl (C (Hq + 2Hkv) D + Hq D C + 3 C F) / t; backward 2x forward
 *   attention     fwd causal 2 b S^2 Hq D / (t c) (half of 4 S^2 Hq D); backward 2.5x forward
 *   memory-bound  (10 C + 3 F / t + 2 (Hq + Hkv) D / t) elements per token, x3 for fwd + bwd
 *   recompute     full: one more forward of each recomputed layer (+ its tp / cp forward
 *                 collectives), keeping only its input; attention: RoPE + the attention core's
 *                 forward again (+ the cp exchanges), the rotated q / k not kept
 *   tp            4 all-reduces of [Tl, C] per layer (2 forward, 2 backward; with sequence
 *                 parallelism 4 all-gathers + 4 reduce-scatters), 2 per micro-batch (embedding,
 *                 lm_head input) + the cross-entropy's 2 small ones; per step the gradient
 *                 norm's sum (sp: + each replicated norm weight's gradient)
 *   cp Ulysses    q, k, v and output all-to-all forward and backward (8 per layer); ring: c - 1
 *                 K/V exchanges forward and 2(c - 1) backward; Qwen2-VL: the vision tower whole
 *                 on every rank of the group, the merged features' gradient all-reduced over it
 *   pp            a [b, S, C] transfer ([b, S/t, C] with sp) per stage boundary per micro-batch each way (v per rank
 *                 when interleaved); step = M v + P - 1 slots of a chunk, (M + (P - 1) / v) x the
 *                 slowest stage's time with a device per rank; with more ranks than cores, a slot
 *                 where k stages work is slowed by max(1, k dp tp cp / cores); a vision stage
 *                 (parallel.pipeline_vision_stage): stage 0's time is the tower's (vision_time), the
 *                 layers split over the P - 1 stages after it
 *   dp            gradient all-reduce over dp x cp once per step in 4 MiB buckets (ZeRO-2: a
 *                 reduce-scatter per micro-batch + a parameter all-gather; ZeRO-3: parameter
 *                 all-gathers forward and backward and a gradient reduce-scatter per micro-batch),
 *                 a share `overlap` of it hidden under backward.
 * On this CPU (--device cpu) the costs are measured, not modelled from rates: the stage's layers
 * as a stack with the job's other ranks busy (mmc_plan_calib_stack), the head, the optimizer, and
 * each collective as the trainer meets it (mmc_plan_calibrate_coll: the communication thread's
 * wake-ups and back-off cost more than the wire). */
#include "mmc_plan.h"
#include "mmc_config.h"
#include "mmc_cp.h"
#include "mmc_ops.h"
#include "mmc_parallel.h"
#include "mmc_pp.h"
#include "mmc_train.h"
#include "mmc_omni.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------ model shapes */
mmc_status mmc_plan_model_from(const mmc_qwen2_config *c, const mmc_vision_config *v, mmc_plan_model *out) {
    memset(out, 0, sizeof *out);
    out->lm = *c;
    out->lm.moe = NULL;
    out->vocab = c->vocab_size, out->hidden = c->hidden_size, out->inter = c->intermediate_size;
    out->layers = c->num_layers, out->heads = c->num_heads, out->kv_heads = c->num_kv_heads;
    out->head_dim = c->head_dim, out->tied = c->tie_word_embeddings;
    if (out->vocab < 1 || out->hidden < 1 || out->inter < 1 || out->layers < 1 || out->heads < 1 || out->kv_heads < 1 ||
        out->head_dim < 1)
        return mmc_error(MMC_ERR_FORMAT, "vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
                         "num_attention_heads, num_key_value_heads must all be positive");
    if (c->moe) {   /* Qwen2-MoE: which layers are sparse, and the block's shape */
        mmc_moe_shape(c->moe, &out->moe_experts, &out->moe_top_k, &out->moe_inter, &out->moe_shared);
        for (int64_t l = 0; l < c->num_layers && l < 1024; l++)
            if (mmc_moe_layer_sparse(c->moe, l)) out->moe_sparse[l / 64] |= (uint64_t)1 << (l % 64);
    }
    if (v) {
        out->vcfg = *v;
        out->vision = true;
        out->v_depth = v->depth, out->v_dim = v->embed_dim, out->v_heads = v->num_heads;
        out->v_inter = v->intermediate_size, out->v_merge = v->spatial_merge_size, out->v_out = v->out_hidden_size;
        out->v_patch_in = v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
        if (out->v_depth < 1 || out->v_dim < 1 || out->v_heads < 1 || out->v_merge < 1)
            return mmc_error(MMC_ERR_FORMAT, "vision_config: depth, embed_dim, num_heads, spatial_merge_size "
                             "must be positive");
    }
    return MMC_OK;
}

mmc_status mmc_plan_model_read(const mmc_json *cfg, const char *what, mmc_plan_model *out) {
    memset(out, 0, sizeof *out);
    const char *type = "";
    if (mmc_json_str(cfg, "model_type", "", &type)) type = "";
    const bool omni = !strcmp(type, "qwen2_5_omni_thinker");   /* Qwen2.5-VL's tower + the audio encoder */
    if (!strncmp(type, "llava", 5) || !strncmp(type, "internvl", 8) || (!strncmp(type, "qwen2_5_omni", 12) && !omni))
        /* (their config nests the language model under text_config and another tower: read as Qwen2-VL's, the
         * figures would be another model's) */
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s': mmc plan models the Qwen2 / Llama / Mistral "
                         "decoders and Qwen2-VL's vision tower; this model's tower and nested text_config are not "
                         "modelled yet; choose the layout by hand (LLaVA and InternVL train under tensor, pipeline and "
                         "context parallelism as Qwen2-VL does)", what, type);
    mmc_qwen2_config lm = {0};
    mmc_status st = !strcmp(type, "qwen2_moe") ? mmc_qwen2_moe_config_read(cfg, &lm) : mmc_qwen2_config_read(cfg, &lm);
    if (st) return mmc_error_prefix(st, "%s", what);
    mmc_vision_config vc, *vp = NULL;
    if (mmc_json_get(cfg, "vision_config")) {
        const char *mt = NULL;
        if ((st = mmc_json_str(cfg, "model_type", "", &mt))) goto out;
        mmc_vl_arch arch = !strcmp(mt, "qwen2_5_vl") || omni ? MMC_VL_QWEN2_5 : MMC_VL_QWEN2;
        if ((st = mmc_vision_config_read(cfg, arch, &vc))) goto out;
        vp = &vc;
    }
    if ((st = mmc_plan_model_from(&lm, vp, out))) goto out;
    if (omni) {
        mmc_omni_audio_config ac;
        if ((st = mmc_omni_audio_config_read(cfg, what, &ac))) {
            mmc_moe_free(lm.moe);
            return st;
        }
        out->audio = true;
        out->a_dim = ac.d_model, out->a_layers = ac.encoder_layers, out->a_heads = ac.encoder_attention_heads;
        out->a_inter = ac.encoder_ffn_dim, out->a_window = ac.n_window, out->a_mels = ac.num_mel_bins;
        out->a_out = ac.output_dim;
    }
out:
    mmc_moe_free(lm.moe);
    return st ? mmc_error_prefix(st, "%s", what) : MMC_OK;
}

/* linear weights of a decoder layer: q, k, v, o, gate, up, down (K x N each) */
static void layer_linears(const mmc_plan_model *m, int64_t K[7], int64_t N[7]) {
    const int64_t C = m->hidden, F = m->inter, D = m->head_dim;
    int64_t k[7] = {C, C, C, m->heads * D, C, C, F}, n[7] = {m->heads * D, m->kv_heads * D, m->kv_heads * D, C, F, F, C};
    memcpy(K, k, sizeof k);
    memcpy(N, n, sizeof n);
}

int64_t mmc_plan_layer_params(const mmc_plan_model *m) {
    int64_t K[7], N[7], p = 2 * m->hidden;   /* two RMSNorm weights */
    layer_linears(m, K, N);
    for (int i = 0; i < 7; i++) p += K[i] * N[i];
    return p + (m->heads + 2 * m->kv_heads) * m->head_dim;   /* q, k, v biases (Qwen2) */
}

int64_t mmc_plan_vision_params(const mmc_plan_model *m) {
    if (!m->vision) return 0;
    const int64_t Cv = m->v_dim, Fv = m->v_inter, mm = m->v_merge * m->v_merge * Cv;
    int64_t blk = 3 * Cv * Cv + 3 * Cv + Cv * Cv + Cv + 2 * Cv * Fv + Fv + Cv + 4 * Cv;
    return m->v_depth * blk + m->v_patch_in * Cv + 2 * Cv + mm * mm + mm + mm * m->v_out + m->v_out;
}

/* Whisper-style: conv1 (mels -> C, k 3), conv2 (C -> C, k 3), per layer q / k / v / o (k without
 * bias), fc1 / fc2 and two LayerNorms, ln_post and the projection to the LM's width */
int64_t mmc_plan_audio_params(const mmc_plan_model *m) {
    if (!m->audio) return 0;
    const int64_t C = m->a_dim, F = m->a_inter;
    const int64_t blk = 4 * C * C + 3 * C + 2 * C * F + F + C + 4 * C;
    return m->a_mels * 3 * C + C + 3 * C * C + C + m->a_layers * blk + 2 * C + C * m->a_out + m->a_out;
}

int64_t mmc_plan_total_params(const mmc_plan_model *m) {
    return m->layers * mmc_plan_layer_params(m) + m->vocab * m->hidden * (m->tied ? 1 : 2) + m->hidden +
           mmc_plan_vision_params(m) + mmc_plan_audio_params(m);
}

double mmc_plan_layer_flops(const mmc_plan_model *m, int64_t tokens, int64_t seq) {
    int64_t K[7], N[7];
    layer_linears(m, K, N);
    double f = 0;
    for (int i = 0; i < 7; i++) f += 2.0 * (double)tokens * (double)K[i] * (double)N[i];
    /* causal attention: QK^T and PV, each 2 S^2 Hq D per sequence, half of it under the mask */
    return f + 2.0 * (double)tokens * (double)seq * (double)m->heads * (double)m->head_dim;
}

/* ------------------------------------------------------------------ devices and networks */
/* bf16 dense tensor-core peaks from the vendors' data sheets (SXM parts); efficiency: the share
 * of peak a well-tuned training GEMM sustains (Megatron-LM reports 0.5-0.6 model FLOPs use on
 * H100 at scale; we take 0.6 for the GEMMs and 0.45 for attention kernels). Memory: HBM
 * bandwidth x 0.8. overlap: NCCL on its own streams hides most bucketed gradient traffic. */
bool mmc_plan_device_named(const char *name, mmc_plan_device *out) {
    static const struct { const char *n; double peak, bw, mem; } k[] = {
        {"h100", 989e12, 3.35e12, 80.0}, {"h200", 989e12, 4.8e12, 141.0}, {"a100", 312e12, 2.04e12, 80.0}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        if (strcmp(name, k[i].n)) continue;
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", k[i].n);
        out->gemm_flops = 0.6 * k[i].peak;
        out->attn_flops = 0.45 * k[i].peak;
        out->mem_bw = 0.8 * k[i].bw;
        out->mem_bytes = k[i].mem * 1073741824.0;
        out->overlap = 0.8;
        return true;
    }
    return false;
}

/* alpha: per-message latency; beta: 1 / achievable bus bandwidth per GPU. NVLink 4 (H100 /
 * H200 SXM): 450 GB/s each way, NCCL all-reduce bus bandwidth ~360 GB/s -> beta 1/360e9,
 * alpha 8 us per ring step (small-message all-reduce latency across 8 GPUs ~ 50-60 us).
 * InfiniBand NDR 400 Gb/s per GPU (one NIC per GPU): ~45 GB/s achievable, alpha 12 us.
 * PCIe gen5 x16 through the host: ~25 GB/s, alpha 10 us. */
bool mmc_plan_net_named(const char *name, mmc_plan_net *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    const double ib_a = 12e-6, ib_b = 1.0 / 45e9;
    out->ranks_per_node = 8;
    out->alpha_inter = ib_a, out->beta_inter = ib_b;
    if (!strcmp(name, "nvlink")) out->alpha_intra = 8e-6, out->beta_intra = 1.0 / 360e9;
    else if (!strcmp(name, "ib")) out->alpha_intra = ib_a, out->beta_intra = ib_b;
    else if (!strcmp(name, "pcie")) out->alpha_intra = 10e-6, out->beta_intra = 1.0 / 25e9;
    else return false;
    out->alpha_p2p = out->beta_p2p = 0;   /* pipeline transfers take their group's link */
    return true;
}

double mmc_plan_coll_time(mmc_coll_kind k, int p, double bytes, double alpha, double beta) {
    if (k == MMC_COLL_P2P || (k == MMC_COLL_EXCHANGE && p > 1)) return alpha + bytes * beta;
    if (p <= 1) return 0;
    const double s = (double)(p - 1), f = s / (double)p;
    switch (k) {
    case MMC_COLL_ALL_REDUCE: return 2.0 * s * alpha + 2.0 * f * bytes * beta;
    case MMC_COLL_ALL_GATHER:
    case MMC_COLL_REDUCE_SCATTER:
    case MMC_COLL_ALL_TO_ALL: return s * alpha + f * bytes * beta;
    default: return 0;
    }
}

/* ------------------------------------------------------------------ CPU calibration cache */
typedef struct { int kind; int64_t a[10]; double s; } centry;   /* kind: k_kinds */
/* one measured collective: kind (mmc_coll_kind) over groups of p ranks in a job of n, of `bytes`
 * (as mmc_plan_coll_time counts them), costing s seconds on the critical path */
typedef struct { int kind, p, n; int64_t bytes; double s; } ccoll;
static const char *const coll_names[] = {"allreduce", "allgather", "reducescatter", "alltoall", "p2p", "exchange"};
enum { N_COLL_NAMES = 6 };

static int ccoll_put(mmc_plan_calib *c, int kind, int p, int n, int64_t bytes, double s);
struct mmc_plan_calib {
    char *path;
    centry *e;
    int n, cap;
    bool dirty;
    double mem_bw;          /* 0: not measured */
    bool have_net;
    mmc_plan_net net;
    ccoll *cl;              /* measured collectives (mmc_plan_calibrate_coll) */
    int ncl, capcl;
};

enum { K_LINEAR, K_ATTN, K_ELTWISE, K_LAYER, K_HEAD, K_ADAMW, K_STACK, K_MOE, K_N };
static const char *const k_kinds[K_N] = {"linear", "attn", "eltwise", "layer", "head", "adamw", "stack", "moelayer"};
static const int k_nargs[K_N] = {3, 5, 3, 7, 3, 1, 9, 10};

static int calib_push(mmc_plan_calib *c, int kind, const int64_t *a, double s) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        centry *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        c->e = e, c->cap = cap;
    }
    centry *x = &c->e[c->n++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    memcpy(x->a, a, (size_t)k_nargs[kind] * sizeof *a);
    x->s = s;
    return 0;
}

static int ccoll_put(mmc_plan_calib *c, int kind, int p, int n, int64_t bytes, double s) {
    for (int i = 0; i < c->ncl; i++) {
        ccoll *x = &c->cl[i];
        if (x->kind == kind && x->p == p && x->n == n && x->bytes == bytes) { x->s = s; return 0; }
    }
    if (c->ncl == c->capcl) {
        int cap = c->capcl ? 2 * c->capcl : 64;
        ccoll *e = realloc(c->cl, (size_t)cap * sizeof *e);
        if (!e) return -1;
        c->cl = e, c->capcl = cap;
    }
    c->cl[c->ncl++] = (ccoll){kind, p, n, bytes, s};
    return 0;
}

static double median_of(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mmc_plan_calib_coll(const mmc_plan_calib *c, mmc_coll_kind kind, int p, int n, double bytes) {
    if (!c || p < 2) return -1;
    /* the job size measured nearest to n (the same if there is one; else the larger one below
     * it, else the smallest above) */
    int best_n = 0;
    for (int i = 0; i < c->ncl; i++) {
        const ccoll *x = &c->cl[i];
        if ((int)x->kind != (int)kind || x->p != p) continue;
        int m = x->n;
        if (!best_n || (m <= n && (best_n > n || m > best_n)) || (m > n && best_n > n && m < best_n)) best_n = m;
    }
    if (!best_n) return -1;
    double xs[64], ys[64];
    int k = 0;
    for (int i = 0; i < c->ncl && k < 64; i++) {
        const ccoll *x = &c->cl[i];
        if ((int)x->kind != (int)kind || x->p != p || x->n != best_n) continue;
        int j = k++;
        while (j > 0 && xs[j - 1] > (double)x->bytes) xs[j] = xs[j - 1], ys[j] = ys[j - 1], j--;
        xs[j] = (double)x->bytes, ys[j] = x->s;
    }
    /* a robust alpha-beta fit (single measurements on a shared host can be several times off):
     * alpha the median of the small messages (<= 16 KiB), beta the median of (t - alpha) / bytes
     * over the large ones (>= 512 KiB) */
    double sm[64], bt[64];
    int ns = 0, nbg = 0;
    for (int i = 0; i < k; i++)
        if (xs[i] <= 16384) sm[ns++] = ys[i];
    if (!ns) sm[ns++] = ys[0];
    const double alpha = median_of(sm, ns);
    for (int i = 0; i < k; i++)
        if (xs[i] >= 524288) bt[nbg++] = (ys[i] - alpha) / xs[i];
    if (!nbg && xs[k - 1] > 16384) bt[nbg++] = (ys[k - 1] - alpha) / xs[k - 1];
    double beta = nbg ? median_of(bt, nbg) : 0;
    if (beta < 0) beta = 0;
    return alpha + beta * bytes;
}

/* The cache is a text file, one measurement a line: "linear M K N seconds", "attn B T H Hkv D
 * seconds", "eltwise M C F seconds", "mem_bw bytes_per_s", "net alpha beta alpha_p2p beta_p2p".
 * Anything else is an error naming the line (delete the file to measure afresh). */
/* the lines of text into c; errors name what:line */
static mmc_status calib_parse(mmc_plan_calib *c, const char *text, size_t len, const char *path) {
    char line[512];
    int ln = 0;
    mmc_status st = MMC_OK;
    size_t at = 0;
    while (at < len) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - (text + at)) : len - at;
        ln++;
        if (ll >= sizeof line || memchr(text + at, 0, ll))
            return mmc_error(MMC_ERR_FORMAT, "%s:%d: not a calibration entry (a line of %zu bytes); delete the file to "
                             "measure again", path, ln, ll);
        memcpy(line, text + at, ll);
        line[ll] = 0;
        at += ll + 1;
        char word[16];
        int used = 0;
        if (line[0] == '#' || sscanf(line, "%15s%n", word, &used) != 1) continue;
        const char *p = line + used;
        bool ok = false;
        if (!strcmp(word, "mem_bw")) ok = sscanf(p, "%lf", &c->mem_bw) == 1 && c->mem_bw > 0;
        else if (!strcmp(word, "coll")) {
            char nm[24];
            int pp = 0, nn = 0, k = -1, used2 = 0;
            long long nb = 0;
            double sec = 0;
            if (sscanf(p, "%23s %d %d %lld %lf%n", nm, &pp, &nn, &nb, &sec, &used2) == 5) {
                for (int i = 0; i < N_COLL_NAMES; i++)
                    if (!strcmp(nm, coll_names[i])) k = i;
                const char *end = p + used2;
                while (*end == ' ' || *end == '\t' || *end == '\r') end++;
                ok = k >= 0 && pp >= 2 && nn >= pp && nb > 0 && sec > 0 && !*end;
                if (ok && ccoll_put(c, k, pp, nn, nb, sec)) return mmc_error(MMC_ERR_OOM, "out of memory");
            }
        } else if (!strcmp(word, "net")) {
            mmc_plan_net *n = &c->net;
            ok = sscanf(p, "%lf %lf %lf %lf", &n->alpha_intra, &n->beta_intra, &n->alpha_p2p, &n->beta_p2p) == 4 &&
                 n->alpha_intra >= 0 && n->beta_intra > 0 && n->alpha_p2p >= 0 && n->beta_p2p > 0;
            c->have_net = ok;
        } else {
            for (int k = 0; k < K_N; k++) {
                if (strcmp(word, k_kinds[k])) continue;
                int64_t v[10] = {0};
                double sec = 0;
                ok = true;
                for (int i = 0; i < k_nargs[k] && ok; i++) {
                    char *end;
                    long long x = strtoll(p, &end, 10);
                    ok = end != p && x > 0;
                    v[i] = x, p = end;
                }
                if (ok) {
                    char *end;
                    sec = strtod(p, &end);
                    ok = end != p && sec > 0;
                    while (ok && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
                    ok = ok && !*end;
                }
                if (ok && calib_push(c, k, v, sec)) return mmc_error(MMC_ERR_OOM, "out of memory");
            }
        }
        if (!ok) {
            line[strcspn(line, "\n")] = 0;
            return mmc_error(MMC_ERR_FORMAT, "%s:%d: '%.80s' is not a calibration entry (linear M K N s | attn B T H "
                             "Hkv D s | eltwise M C F s | layer B T C H Hkv D F s | stack B T C H Hkv D F L N s | head N C V s | adamw N s | mem_bw B/s | "
                             "net alpha beta alpha_p2p beta_p2p | coll KIND p n bytes s); delete the file to measure again", path, ln, line);
        }
    }
    return st;
}

mmc_status mmc_plan_calib_parse(const char *text, size_t len, const char *what, mmc_plan_calib **out) {
    *out = NULL;
    mmc_plan_calib *c = calloc(1, sizeof *c);
    if (!c) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = calib_parse(c, text, len, what ? what : "calibration");
    if (st) { mmc_plan_calib_free(c); return st; }
    *out = c;
    return MMC_OK;
}

mmc_status mmc_plan_calib_open(const char *path, mmc_plan_calib **out) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    mmc_status st = MMC_OK;
    if (path && access(path, F_OK) == 0 && (st = mmc_read_file(path, &text, &len))) return st;
    if ((st = mmc_plan_calib_parse(text ? text : "", len, path, out))) { free(text); return st; }
    free(text);   /* no file yet: an empty cache, measured on first use */
    if (path && !((*out)->path = strdup(path))) {
        mmc_plan_calib_free(*out);
        *out = NULL;
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    return MMC_OK;
}

mmc_status mmc_plan_calib_save(mmc_plan_calib *c) {
    if (!c || !c->path || !c->dirty) return MMC_OK;
    size_t cap = 256 + (size_t)c->n * 192 + (size_t)c->ncl * 96, len = 0;
    char *buf = malloc(cap);
    if (!buf) return mmc_error(MMC_ERR_OOM, "out of memory");
    len += (size_t)snprintf(buf + len, cap - len, "# mmc plan: this host's measured kernel times (fwd + bwd seconds); "
                            "delete to re-measure\n");
    if (c->mem_bw > 0) len += (size_t)snprintf(buf + len, cap - len, "mem_bw %.6g\n", c->mem_bw);
    if (c->have_net)
        len += (size_t)snprintf(buf + len, cap - len, "net %.6g %.6g %.6g %.6g\n", c->net.alpha_intra, c->net.beta_intra,
                                c->net.alpha_p2p, c->net.beta_p2p);
    for (int i = 0; i < c->ncl; i++) {
        if (len + 128 > cap) {
            char *b2 = realloc(buf, cap *= 2);
            if (!b2) { free(buf); return mmc_error(MMC_ERR_OOM, "out of memory"); }
            buf = b2;
        }
        const ccoll *x = &c->cl[i];
        len += (size_t)snprintf(buf + len, cap - len, "coll %s %d %d %lld %.6g\n", coll_names[x->kind], x->p, x->n,
                                (long long)x->bytes, x->s);
    }
    for (int i = 0; i < c->n; i++) {
        const centry *e = &c->e[i];
        len += (size_t)snprintf(buf + len, cap - len, "%s", k_kinds[e->kind]);
        for (int k = 0; k < k_nargs[e->kind]; k++) len += (size_t)snprintf(buf + len, cap - len, " %lld", (long long)e->a[k]);
        len += (size_t)snprintf(buf + len, cap - len, " %.6g\n", e->s);
    }
    mmc_status st = mmc_write_file_atomic(c->path, buf, len);
    free(buf);
    if (st) return mmc_error_prefix(st, "calibration cache");
    c->dirty = false;
    return MMC_OK;
}

void mmc_plan_calib_free(mmc_plan_calib *c) {
    if (!c) return;
    free(c->path);
    free(c->e);
    free(c->cl);
    free(c);
}

static const centry *calib_find(const mmc_plan_calib *c, int kind, const int64_t *a) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].kind == kind && !memcmp(c->e[i].a, a, (size_t)k_nargs[kind] * sizeof *a)) return &c->e[i];
    return NULL;
}

static void fill_rand(mmc_tensor *t, uint32_t seed) {
    float *p = t->data;
    for (int64_t i = 0; i < mmc_numel(t); i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((double)(seed >> 8) / 16777216.0 - 0.5) * 0.1f;
    }
}

/* CPU seconds of this process: the calibration runs on one thread and counts the CPU time it
 * gets, not the wall clock, which on a shared host stretches by whatever else runs (the model
 * applies the host's share separately: mmc_plan_device.host_share) */
static double thread_cpu(void);
static double median_of(double *v, int n);
static double proc_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run fn(ctx, args) forward + backward several times (after one warm-up) on one thread, return
 * the fastest in CPU seconds. */
typedef mmc_tensor *(*calib_fn)(mmc_ctx *ctx, mmc_tensor **in, const int64_t *a);
static double time_fwd_bwd(calib_fn fn, mmc_tensor **in, int n_in, const int64_t *a) {
    mmc_ctx *ctx = mmc_ctx_new();
    if (!ctx) return -1;
    const int nt = mmc_get_num_threads();
    mmc_set_num_threads(1);
    double best = DBL_MAX, spent = 0;
    for (int r = 0; r < 8 && (r < 4 || spent < 0.3) && !(r >= 2 && spent > 0.5); r++) {   /* big shapes: 1 + 1 */
        for (int i = 0; i < n_in; i++) in[i]->grad = NULL;
        double t0 = proc_cpu();
        mmc_tensor *y = fn(ctx, in, a);
        mmc_backward(ctx, mmc_sum(ctx, y));
        double dt = proc_cpu() - t0;
        mmc_ctx_reset(ctx);
        spent += dt;
        if (r > 0 && dt < best) best = dt;   /* r = 0 warms caches and the arena */
        if (r == 0 && dt > 2.0) { best = dt; break; }
    }
    mmc_set_num_threads(nt);
    mmc_ctx_free(ctx);
    return best;
}

static mmc_tensor *f_linear(mmc_ctx *ctx, mmc_tensor **in, const int64_t *a) {
    (void)a;
    return mmc_linear(ctx, in[0], in[1], NULL);
}
static mmc_tensor *f_attn(mmc_ctx *ctx, mmc_tensor **in, const int64_t *a) {
    (void)a;
    mmc_attn_opts o = {.causal = true};
    return mmc_attention(ctx, in[0], in[1], in[2], &o);
}
static mmc_tensor *f_eltwise(mmc_ctx *ctx, mmc_tensor **in, const int64_t *a) {
    (void)a;   /* a layer's memory-bound ops: two RMSNorms, SwiGLU, two residual adds */
    mmc_tensor *h = mmc_rmsnorm(ctx, in[0], in[3], 1e-6f);
    h = mmc_add(ctx, h, in[0]);
    mmc_tensor *g = mmc_swiglu(ctx, in[1], in[2]);
    mmc_tensor *h2 = mmc_add(ctx, mmc_rmsnorm(ctx, h, in[3], 1e-6f), h);
    return mmc_add(ctx, mmc_sum(ctx, g), mmc_sum(ctx, h2));
}

/* A whole decoder layer (mmc_qwen2_layer_forward: norms, q/k/v/o with RoPE, attention, SwiGLU
 * MLP or Qwen2-MoE's sparse block, residuals): layer 0 of m over B sequences of T tokens, forward +
 * backward with its parameters' gradients accumulated as in training; CPU seconds on one thread,
 * the fastest of a few runs. */
static double time_model_layer(mmc_qwen2 *m, int64_t B, int64_t T) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *x = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(B, T, m->cfg.hidden_size));
    double best = DBL_MAX;
    const int nt = mmc_get_num_threads();
    mmc_set_num_threads(1);
    if (ctx && x) {
        fill_rand(x, 5);
        x->flags |= MMC_REQUIRES_GRAD;
        double spent = 0;
        for (int r = 0; r < 8 && (r < 4 || spent < 0.3) && !(r >= 2 && spent > 0.5); r++) {   /* big shapes: 1 + 1 */
            x->grad = NULL;
            double t0 = proc_cpu();
            mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
            for (int64_t i = 0; i < T; i++) ((int64_t *)pos->data)[i] = i;
            mmc_tensor *cos, *sin;
            mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);
            mmc_attn_opts o = {.causal = true};
            mmc_tensor *y = mmc_qwen2_layer_forward(ctx, &m->cfg, &m->layers[0], x, cos, sin, &o, NULL, 0);
            mmc_backward(ctx, mmc_sum(ctx, y));
            double dt = proc_cpu() - t0;
            mmc_ctx_reset(ctx);
            spent += dt;
            if (r > 0 && dt < best) best = dt;
            if (r == 0 && dt > 2.0) { best = dt; break; }
        }
        x->grad = NULL;
    }
    mmc_set_num_threads(nt);
    mmc_tensor_free(x);
    mmc_ctx_free(ctx);
    return best < DBL_MAX ? best : -1;
}

/* a dense layer of one rank's shard. a: B, T, C, Hq, Hkv, D, F. */
static double time_layer(const int64_t *a) {
    mmc_qwen2_config cfg = {.vocab_size = 8, .hidden_size = a[2], .intermediate_size = a[6], .num_layers = 1,
                            .num_heads = a[3], .num_kv_heads = a[4], .head_dim = a[5], .max_position_embeddings = a[1],
                            .rms_norm_eps = 1e-6, .rope_theta = 10000, .qkv_bias = true, .dtype = MMC_F32};
    mmc_qwen2 *m = NULL;
    if (mmc_qwen2_new(&cfg, 1, &m)) return -1;
    double s = time_model_layer(m, a[0], a[1]);
    mmc_qwen2_free(m);
    return s;
}

/* a Qwen2-MoE sparse layer (router, top-k of E experts of FFN Fi, the gated shared expert of Fs) of
 * one rank's shard. a: B, T, C, Hq, Hkv, D, E, k, Fi, Fs. Built from a config.json text through the
 * model's own reader, so the block is qwen2_moe.c's. */
static double time_moe_layer(const int64_t *a) {
    char js[640];
    const int len = snprintf(js, sizeof js,
                             "{\"model_type\": \"qwen2_moe\", \"vocab_size\": 8, \"hidden_size\": %lld, "
                             "\"intermediate_size\": %lld, \"num_hidden_layers\": 1, \"num_attention_heads\": %lld, "
                             "\"num_key_value_heads\": %lld, \"head_dim\": %lld, \"max_position_embeddings\": %lld, "
                             "\"num_experts\": %lld, \"num_experts_per_tok\": %lld, \"moe_intermediate_size\": %lld, "
                             "\"shared_expert_intermediate_size\": %lld, \"decoder_sparse_step\": 1, "
                             "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000}",
                             (long long)a[2], (long long)a[8], (long long)a[3], (long long)a[4], (long long)a[5],
                             (long long)a[1], (long long)a[6], (long long)a[7], (long long)a[8], (long long)a[9]);
    mmc_json *j = NULL;
    mmc_qwen2 *m = NULL;
    double s = -1;
    if (len > 0 && (size_t)len < sizeof js && !mmc_json_parse(js, (size_t)len, "calibration", &j) &&
        !mmc_qwen2_moe_new(j, 1, NULL, &m))
        s = time_model_layer(m, a[0], a[1]);
    mmc_qwen2_free(m);
    mmc_json_free(j);
    return s;
}

/* L decoder layers of one rank's shard in sequence, each with its own weights as in the model,
 * forward + backward with the parameters' gradients accumulated as in training: per layer this
 * costs more than one layer timed alone, whose weights and saved activations stay in the core's
 * caches between runs (measured here: a 4-layer stack of the bench's small Qwen2 1.15x, 8 layers
 * 1.25x the lone layer). N copies run at once, one thread each, as the job's ranks do on the
 * other cores (they share the memory bandwidth and the last-level cache). Thread CPU seconds per
 * layer: the median of a few runs (a training step adds up many: their typical time, not the
 * fastest), mean over the copies. a: B, T, C, Hq, Hkv, D, F, L, N. */
typedef struct {
    const int64_t *a;
    pthread_barrier_t *bar;
    double *first;   /* copy 0's warm-up run, which sets how many timed runs all copies make */
    bool lead;       /* copy 0: writes *first */
    double best;
} stack_arg;

static void *stack_run(void *p) {
    stack_arg *sa = p;
    const int64_t *a = sa->a;
    sa->best = -1;
    mmc_qwen2_config cfg = {.vocab_size = 8, .hidden_size = a[2], .intermediate_size = a[6], .num_layers = a[7],
                            .num_heads = a[3], .num_kv_heads = a[4], .head_dim = a[5], .max_position_embeddings = a[1],
                            .rms_norm_eps = 1e-6, .rope_theta = 10000, .qkv_bias = true, .dtype = MMC_F32};
    mmc_set_num_threads(1);
    mmc_qwen2 *m = NULL;
    bool ok = !mmc_qwen2_new(&cfg, 1, &m);
    mmc_ctx *ctx = ok ? mmc_ctx_new() : NULL;
    mmc_tensor *x = ok ? mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(a[0], a[1], a[2])) : NULL;
    ok = ok && ctx && x;
    if (ok) {
        fill_rand(x, 5);
        x->flags |= MMC_REQUIRES_GRAD;
    }
    double best = DBL_MAX, runs[8];
    int reps = 1, nrun = 0;
    for (int r = 0; r <= reps; r++) {
        pthread_barrier_wait(sa->bar);   /* every copy runs at once (a copy that failed still joins) */
        if (r == 1) {
            const double f = *sa->first;
            reps = f < 0 || f > 2.0 ? 0 : f > 0.5 ? 1 : f > 0.1 ? 3 : 6;
        }
        if (!ok || r > reps) continue;
        x->grad = NULL;
        double t0 = thread_cpu();
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(a[1]));
        for (int64_t i = 0; i < a[1]; i++) ((int64_t *)pos->data)[i] = i;
        mmc_tensor *cos, *sin, *h = x;
        mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);
        mmc_attn_opts o = {.causal = true};
        for (int64_t l = 0; l < a[7]; l++) h = mmc_qwen2_layer_forward(ctx, &m->cfg, &m->layers[l], h, cos, sin, &o, NULL, 0);
        mmc_backward(ctx, mmc_sum(ctx, h));
        double dt = thread_cpu() - t0;
        mmc_ctx_reset(ctx);
        if (r == 0) {
            if (sa->lead) *sa->first = dt;
            if (dt > 2.0) best = dt;   /* one run of a big shape is enough */
        } else if (nrun < 8) runs[nrun++] = dt;
    }
    if (nrun) best = median_of(runs, nrun);   /* a step adds up many such runs: their typical time */
    if (x) x->grad = NULL;
    mmc_tensor_free(x);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
    sa->best = ok && best < DBL_MAX ? best / (double)a[7] : -1;
    return NULL;
}

typedef struct {
    stack_arg *sa;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *go;
} gate_arg;

static void *gate_run(void *p) {
    gate_arg *g = p;
    pthread_mutex_lock(g->mu);
    while (!*g->go) pthread_cond_wait(g->cv, g->mu);
    pthread_mutex_unlock(g->mu);
    return stack_run(g->sa);
}

static double time_stack(const int64_t *a) {
    /* the copies wait at a gate until every thread exists, then meet at a barrier of the number
     * that did start */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int n = a[8] < 1 ? 1 : a[8] > 64 ? 64 : (int)a[8];
    pthread_t th[64];
    stack_arg sa[64];
    gate_arg ga[64];
    pthread_barrier_t bar;
    double first = -1;
    int started = 1, go = 0;
    for (int i = 1; i < n; i++) {
        sa[i] = (stack_arg){a, &bar, &first, false, -1};
        ga[i] = (gate_arg){&sa[i], &mu, &cv, &go};
        if (pthread_create(&th[i], NULL, gate_run, &ga[i])) break;
        started++;
    }
    pthread_barrier_init(&bar, NULL, (unsigned)started);
    pthread_mutex_lock(&mu);
    go = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    sa[0] = (stack_arg){a, &bar, &first, true, -1};
    const int nt = mmc_get_num_threads();
    stack_run(&sa[0]);
    mmc_set_num_threads(nt);
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    double sum = 0;
    int k = 0;
    for (int i = 0; i < started; i++)
        if (sa[i].best > 0) sum += sa[i].best, k++;
    return k ? sum / k : -1;
}

/* The optimizer step of the trainer over n parameters: gradient-norm clipping, AdamW, zeroing
 * the gradients (mmc_clip_grad_norm, mmc_adamw_step), CPU seconds on one thread. */
static double time_adamw(int64_t n) {
    mmc_tensor *p = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(n / 1024, 1024));
    double best = DBL_MAX;
    if (p && (p->grad = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(n / 1024, 1024)))) {
        p->flags |= MMC_REQUIRES_GRAD | MMC_PARAM;
        fill_rand(p, 3);
        fill_rand(p->grad, 4);
        mmc_adamw a;
        mmc_adamw_opts o;
        mmc_adamw_defaults(&o);
        if (!mmc_adamw_init(&a, &o, &p, 1)) {
            const int nt = mmc_get_num_threads();
            mmc_set_num_threads(1);
            for (int r = 0; r < 5; r++) {
                double t0 = proc_cpu();
                mmc_clip_grad_norm(&p, 1, 1.0);
                mmc_adamw_step(&a, 1e-4);
                memset(p->grad->data, 0, mmc_nbytes(p->grad));
                double dt = proc_cpu() - t0;
                if (r > 0 && dt < best) best = dt;
                fill_rand(p->grad, 5u + (uint32_t)r);
            }
            mmc_set_num_threads(nt);
            mmc_adamw_free(&a);
        }
    }
    mmc_tensor_free(p);
    return best < DBL_MAX ? best : -1;
}

/* What a micro-batch costs outside the decoder layers, over N tokens (a: N, C, V): the token
 * embedding (lookup and its gradient's scatter), the final RMSNorm, lm_head and cross-entropy,
 * forward + backward. in: x [N, C], lm_head [V, C], embedding [V, C], norm [C]. */
static mmc_tensor *f_head(mmc_ctx *ctx, mmc_tensor **in, const int64_t *a) {
    mmc_tensor *ids = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(a[0]));
    for (int64_t i = 0; i < a[0]; i++) ((int64_t *)ids->data)[i] = (i * 7) % a[2];
    mmc_tensor *h = mmc_add(ctx, in[0], mmc_embedding(ctx, in[2], ids));
    h = mmc_rmsnorm(ctx, h, in[3], 1e-6f);
    return mmc_cross_entropy(ctx, mmc_linear(ctx, h, in[1], NULL), ids, -100);
}

/* largest token count measured directly; longer rows scale linearly from it */
#define CALIB_MAX_FLOPS 1e9

static double measure(mmc_plan_calib *c, int kind, const int64_t *a0) {
    const centry *hit = calib_find(c, kind, a0);
    if (hit) return hit->s;
    int64_t a[10] = {0};
    memcpy(a, a0, (size_t)k_nargs[kind] * sizeof *a);
    double scale = 1;
    mmc_tensor *in[4] = {0};
    int n_in = 0;
    calib_fn fn = NULL;
    if (kind == K_LAYER) {   /* fewer sequences when over the cap (time is about linear in B) */
        int64_t K[7], N[7], B = a[0];
        mmc_plan_model lm = {.hidden = a[2], .heads = a[3], .kv_heads = a[4], .head_dim = a[5], .inter = a[6]};
        layer_linears(&lm, K, N);
        double fl = 0;
        for (int i = 0; i < 7; i++) fl += 6.0 * (double)a[1] * (double)K[i] * (double)N[i];
        while (B > 1 && fl * (double)B > 2 * CALIB_MAX_FLOPS) B /= 2;
        int64_t b[8];
        memcpy(b, a, sizeof b);
        b[0] = B;
        if (fl > 2 * CALIB_MAX_FLOPS)   /* one sequence is still too long: fewer tokens, scaled linearly
                                         * (the attention's quadratic part is then underestimated) */
            b[1] = a[1] * 2 * CALIB_MAX_FLOPS / fl > 64 ? (int64_t)((double)a[1] * 2 * CALIB_MAX_FLOPS / fl) : 64;
        double s = time_layer(b) * (double)a[0] / (double)B * (double)a[1] / (double)b[1];
        if (s > 0 && !calib_push(c, kind, a0, s)) c->dirty = true;
        return s > 0 ? s : 0;
    }
    if (kind == K_STACK) {   /* as K_LAYER: fewer sequences / tokens past the cap, time scaled linearly */
        int64_t K[7], N[7];
        mmc_plan_model lm = {.hidden = a[2], .heads = a[3], .kv_heads = a[4], .head_dim = a[5], .inter = a[6]};
        layer_linears(&lm, K, N);
        double fl = 0, wb = 0;
        for (int i = 0; i < 7; i++) fl += 6.0 * (double)a[1] * (double)K[i] * (double)N[i], wb += 8.0 * (double)K[i] * (double)N[i];
        int64_t b[10];
        memcpy(b, a, sizeof b);
        while (b[0] > 1 && fl * (double)b[0] > 2 * CALIB_MAX_FLOPS) b[0] /= 2;
        if (fl > 2 * CALIB_MAX_FLOPS)
            b[1] = a[1] * 2 * CALIB_MAX_FLOPS / fl > 64 ? (int64_t)((double)a[1] * 2 * CALIB_MAX_FLOPS / fl) : 64;
        /* weights + gradients: at most 256 MiB of layers per copy, 1 GiB over the copies (a big
         * layer's working set is far past the caches anyway) */
        while (b[7] > 1 && wb * (double)b[7] > 268435456.0) b[7]--;
        if (wb * (double)b[7] * (double)b[8] > 1073741824.0) b[8] = 1;
        double s = time_stack(b);
        if (s > 0) s *= (double)a[0] / (double)b[0] * (double)a[1] / (double)b[1];
        if (s > 0 && !calib_push(c, kind, a0, s)) c->dirty = true;
        return s > 0 ? s : 0;
    }
    if (kind == K_MOE) {   /* fewer sequences past the cap, scaled linearly */
        const double fl = 6.0 * (double)a[1] * (double)a[2] *
                          ((double)(a[3] + 2 * a[4]) * (double)a[5] * 2.0 + 3.0 * (double)(a[7] * a[8] + a[9]));
        int64_t b[10];
        memcpy(b, a, sizeof b);
        while (b[0] > 1 && fl * (double)b[0] > 2 * CALIB_MAX_FLOPS) b[0] /= 2;
        double s = time_moe_layer(b);
        if (s > 0) s *= (double)a[0] / (double)b[0];
        if (s > 0 && !calib_push(c, kind, a0, s)) c->dirty = true;
        return s > 0 ? s : 0;
    }
    if (kind == K_ADAMW) {
        double s = time_adamw(a[0]);
        if (s > 0 && !calib_push(c, kind, a0, s)) c->dirty = true;
        return s > 0 ? s : 0;
    }
    if (kind == K_HEAD || kind == K_LINEAR) {   /* cap M so that one measurement stays near CALIB_MAX_FLOPS */
        double fl = 2.0 * (double)a[0] * (double)a[1] * (double)a[2];
        if (fl > CALIB_MAX_FLOPS) {
            int64_t M = (int64_t)((double)a[0] * CALIB_MAX_FLOPS / fl);
            M = M < 16 ? 16 : M;
            scale = (double)a[0] / (double)M, a[0] = M;
        }
        in[0] = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(a[0], a[1]));   /* x [M, K] */
        in[1] = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(a[2], a[1]));   /* w [N, K] */
        n_in = 2, fn = f_linear;
        if (kind == K_HEAD) {
            in[2] = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(a[2], a[1]));   /* embedding [V, C] */
            in[3] = mmc_tensor_new(MMC_F32, 1, MMC_SHAPE(a[1]));         /* final norm [C] */
            n_in = 4, fn = f_head;
        }
    } else if (kind == K_ATTN) {   /* attention: fewer sequences when over the cap (time is linear in B) */
        double fl = 2.0 * (double)a[0] * (double)a[1] * (double)a[1] * (double)a[2] * (double)a[4];
        int64_t B = a[0], T = a[1];
        while (B > 1 && fl * (double)B / (double)a[0] > CALIB_MAX_FLOPS) B /= 2;
        scale = (double)a[0] / (double)B;
        const double f1 = fl / (double)a[0];   /* one sequence */
        if (B == 1 && f1 > CALIB_MAX_FLOPS) {   /* shorter sequences, scaled quadratically */
            T = (int64_t)((double)a[1] * sqrt(CALIB_MAX_FLOPS / f1));
            T = T < 64 ? 64 : T;
            scale *= ((double)a[1] / (double)T) * ((double)a[1] / (double)T);
        }
        in[0] = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, T, a[2], a[4]));
        in[1] = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, T, a[3], a[4]));
        in[2] = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, T, a[3], a[4]));
        n_in = 3, fn = f_attn;
    } else {
        int64_t M = a[0];
        while (M > 1024 && (double)M * (double)(a[1] + a[2]) > 5e7) M /= 2;
        scale = (double)a[0] / (double)M;
        in[0] = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(M, a[1]));
        in[1] = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(M, a[2]));
        in[2] = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(M, a[2]));
        in[3] = mmc_tensor_new(MMC_F32, 1, MMC_SHAPE(a[1]));
        n_in = 4, fn = f_eltwise;
    }
    double s = -1;
    for (int i = 0; i < n_in; i++)
        if (!in[i]) goto done;
    for (int i = 0; i < n_in; i++) {
        fill_rand(in[i], 17u + (uint32_t)i);
        in[i]->flags |= MMC_REQUIRES_GRAD;
    }
    s = time_fwd_bwd(fn, in, n_in, a) * scale;
done:
    for (int i = 0; i < n_in; i++) {
        if (in[i]) in[i]->grad = NULL;   /* an arena tensor of the freed context */
        mmc_tensor_free(in[i]);
    }
    if (s > 0 && !calib_push(c, kind, a0, s)) c->dirty = true;
    return s > 0 ? s : 0;
}

double mmc_plan_calib_linear(mmc_plan_calib *c, int64_t M, int64_t K, int64_t N) {
    return measure(c, 0, (const int64_t[]){M, K, N});
}
double mmc_plan_calib_attn(mmc_plan_calib *c, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
    return measure(c, 1, (const int64_t[]){B, T, H, Hkv, D});
}
double mmc_plan_calib_eltwise(mmc_plan_calib *c, int64_t M, int64_t C, int64_t F) {
    return measure(c, 2, (const int64_t[]){M, C, F});
}
double mmc_plan_calib_layer(mmc_plan_calib *c, int64_t B, int64_t T, int64_t C, int64_t H, int64_t Hkv, int64_t D,
                            int64_t F) {
    return measure(c, K_LAYER, (const int64_t[]){B, T, C, H, Hkv, D, F});
}
double mmc_plan_calib_stack(mmc_plan_calib *c, int64_t B, int64_t T, int64_t C, int64_t H, int64_t Hkv, int64_t D,
                            int64_t F, int64_t L, int n) {
    return measure(c, K_STACK, (const int64_t[]){B, T, C, H, Hkv, D, F, L < 1 ? 1 : L, n < 1 ? 1 : n});
}
double mmc_plan_calib_moe_layer(mmc_plan_calib *c, int64_t B, int64_t T, int64_t C, int64_t H, int64_t Hkv, int64_t D,
                                int64_t E, int64_t k, int64_t Fi, int64_t Fs) {
    return measure(c, K_MOE, (const int64_t[]){B, T, C, H, Hkv, D, E, k, Fi, Fs});
}
double mmc_plan_calib_head(mmc_plan_calib *c, int64_t N, int64_t C, int64_t V) {
    return measure(c, K_HEAD, (const int64_t[]){N, C, V});
}
double mmc_plan_calib_adamw(mmc_plan_calib *c, int64_t n) {
    const int64_t N = (int64_t)1 << 20;   /* measured on 1 Mi parameters, scaled linearly */
    return measure(c, K_ADAMW, (const int64_t[]){N}) * (double)n / (double)N;
}
bool mmc_plan_calib_net(const mmc_plan_calib *c, mmc_plan_net *out) {
    if (!c || !c->have_net) return false;
    *out = c->net;
    return true;
}
void mmc_plan_calib_set_net(mmc_plan_calib *c, const mmc_plan_net *n) {
    c->net = *n;
    c->have_net = true;
    c->dirty = true;
}

mmc_status mmc_plan_device_cpu(mmc_plan_calib *c, mmc_plan_device *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "cpu");
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    out->cores = nc > 0 ? (int)nc : 1;
    out->calib = c;
    if (c->mem_bw <= 0) {   /* a read-modify-write stream over 64 MiB (AdamW's access pattern) */
        const size_t n = (size_t)16 << 20;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        if (!a || !b) { free(a); free(b); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        for (size_t i = 0; i < n; i++) a[i] = 1.0f, b[i] = 0.5f;
        double best = DBL_MAX;
        for (int r = 0; r < 4; r++) {
            double t0 = proc_cpu();
            for (size_t i = 0; i < n; i++) a[i] = a[i] * 0.999f + b[i];
            double dt = proc_cpu() - t0;
            if (dt < best) best = dt;
        }
        volatile float sink = a[n / 2];
        (void)sink;
        free(a), free(b);
        c->mem_bw = 3.0 * (double)n * sizeof(float) / best;
        c->dirty = true;
    }
    out->mem_bw = c->mem_bw;
    /* only the calibrated kernel times are used on this device; these rates stand for anything
     * outside them (e.g. the vision merger) */
    double t = mmc_plan_calib_linear(c, 256, 256, 256);
    out->gemm_flops = t > 0 ? 6.0 * 256 * 256 * 256 / t : 1e10;
    out->attn_flops = 0.5 * out->gemm_flops;
    out->overlap = 0;   /* the ranks' communication threads share the cores with compute */
    return MMC_OK;
}

typedef struct { double seconds; int nw; double *cpu; } spin_arg;   /* cpu[w]: CPU seconds in window w */

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *spin(void *p) {
    spin_arg *a = p;
    const double t0 = mmc_now();
    double c0 = thread_cpu();
    volatile double x = 1;
    for (int w = 0; w < a->nw; w++) {
        const double end = t0 + 0.1 * (w + 1);
        while (mmc_now() < end)
            for (int i = 0; i < 2000; i++) x = x * 1.0000001 + 1e-9;
        double c = thread_cpu();
        a->cpu[w] = c - c0;
        c0 = c;
    }
    return NULL;
}

double mmc_plan_host_share(int n, double seconds, double *mean) {
    const int nw = seconds < 0.1 ? 1 : (int)(seconds / 0.1);
    if (mean) *mean = 1;
    if (n < 1) n = 1;
    pthread_t *th = calloc((size_t)n, sizeof *th);
    spin_arg *a = calloc((size_t)n, sizeof *a);
    double *cpu = calloc((size_t)n * (size_t)nw, sizeof *cpu);
    int started = 0;
    if (th && a && cpu)
        for (; started < n; started++) {
            a[started] = (spin_arg){seconds, nw, cpu + (size_t)started * (size_t)nw};
            if (pthread_create(&th[started], NULL, spin, &a[started])) break;
        }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double best = 0, tot = 0;
    for (int w = 0; w < nw && started; w++) {
        double s = 0;
        for (int i = 0; i < started; i++) s += cpu[(size_t)i * (size_t)nw + (size_t)w];
        s /= 0.1 * started;
        tot += s;
        if (s > best) best = s;
    }
    free(th), free(a), free(cpu);
    if (!started) return 1;
    if (mean) *mean = tot / nw > 1 ? 1 : tot / nw;
    return best > 1 ? 1 : best > 0 ? best : 1;
}

/* Two ranks: ping-pong of 8 B and 4 MiB (p2p alpha / beta), all-reduce of 8 B and 4 MiB over
 * the world (collective alpha / beta of the ring formula). Each the fastest of several. */
mmc_status mmc_plan_calibrate_net(mmc_comm *world, mmc_plan_net *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "measured");
    const int p = mmc_comm_size(world), r = mmc_comm_rank(world);
    out->ranks_per_node = 1 << 20;
    if (p < 2) return mmc_error(MMC_ERR_INVALID, "network calibration needs 2 or more ranks (run it under mpirun -np 2)");
    const int64_t big = (int64_t)1 << 20;   /* floats: 4 MiB */
    float *buf = calloc((size_t)big, sizeof *buf);
    if (!buf) return mmc_error(MMC_ERR_OOM, "out of memory");
    double pp[2] = {DBL_MAX, DBL_MAX}, ar[2] = {DBL_MAX, DBL_MAX};
    mmc_status st = MMC_OK;
    for (int s = 0; s < 2; s++) {
        const int64_t n = s ? big : 2;
        for (int it = 0; it < (s ? 8 : 40); it++) {
            if ((st = mmc_barrier(world))) goto done;
            double t0 = mmc_now();
            if (r == 0) {
                if ((st = mmc_send(world, buf, n, MMC_F32, 1, 7)) || (st = mmc_recv(world, buf, n, MMC_F32, 1, 7))) goto done;
            } else if (r == 1) {
                if ((st = mmc_recv(world, buf, n, MMC_F32, 0, 7)) || (st = mmc_send(world, buf, n, MMC_F32, 0, 7))) goto done;
            }
            double dt = (mmc_now() - t0) / 2;
            if (it && dt < pp[s]) pp[s] = dt;
        }
        for (int it = 0; it < (s ? 8 : 40); it++) {
            if ((st = mmc_barrier(world))) goto done;
            double t0 = mmc_now();
            if ((st = mmc_all_reduce(world, buf, buf, n, MMC_F32, MMC_SUM))) goto done;
            double dt = mmc_now() - t0;
            if (it && dt < ar[s]) ar[s] = dt;
        }
    }
    {
        const double nb = (double)big * 4, ns = 8;
        out->beta_p2p = (pp[1] - pp[0]) / (nb - ns);
        out->alpha_p2p = pp[0] - ns * out->beta_p2p;
        const double f = 2.0 * (p - 1) / p, s2 = 2.0 * (p - 1);
        out->beta_intra = (ar[1] - ar[0]) / (f * (nb - ns));
        out->alpha_intra = (ar[0] - f * ns * out->beta_intra) / s2;
        if (out->beta_p2p <= 0) out->beta_p2p = pp[1] / nb;
        if (out->beta_intra <= 0) out->beta_intra = ar[1] / (f * nb);
        if (out->alpha_p2p < 0) out->alpha_p2p = 0;
        if (out->alpha_intra < 0) out->alpha_intra = 0;
        out->alpha_inter = out->alpha_intra, out->beta_inter = out->beta_intra;
    }
done:
    free(buf);
    return st;
}

/* The compute between two collectives: `iters` GEMMs of a layer's size ([128, 512] x [512, 512],
 * mmc_linear on one thread), the same count on every rank. A GEMM, not a register-only loop:
 * its time varies with the caches and the memory traffic of the other ranks as a layer's does,
 * so the ranks reach each collective a little apart, as in training. */
static mmc_ctx *gap_ctx;
static mmc_tensor *gap_x, *gap_w;
static void gap_work(int64_t iters) {
    for (int64_t i = 0; i < iters && gap_ctx; i++) {
        mmc_linear(gap_ctx, gap_x, gap_w, NULL);
        mmc_ctx_reset(gap_ctx);
    }
}

typedef struct { mmc_comm *g; int kind; int64_t bytes; float *a, *b; int peer_to, peer_from, phase; } coll_job;

static mmc_status coll_once(coll_job *j) {
    const int p = mmc_comm_size(j->g), r = mmc_comm_rank(j->g);
    const int64_t n = j->bytes / 4;
    switch (j->kind) {
    case MMC_COLL_ALL_REDUCE: return mmc_all_reduce(j->g, j->a, j->a, n, MMC_F32, MMC_SUM);
    case MMC_COLL_ALL_GATHER: return mmc_all_gather(j->g, j->a + (size_t)r * (size_t)(n / p), j->a, n / p, MMC_F32);
    case MMC_COLL_REDUCE_SCATTER: return mmc_reduce_scatter(j->g, j->a, j->b, n / p, MMC_F32, MMC_SUM);
    case MMC_COLL_ALL_TO_ALL: return mmc_all_to_all(j->g, j->a, j->b, n / p, MMC_F32);
    case MMC_COLL_P2P: {   /* pairs (0, 1), (2, 3), ...: one way, the direction alternating */
        const bool sender = (r % 2) == (j->phase++ % 2);
        return sender ? mmc_send(j->g, j->a, n, MMC_F32, r ^ 1, 9) : mmc_recv(j->g, j->b, n, MMC_F32, r ^ 1, 9);
    }
    case MMC_COLL_EXCHANGE: {   /* a ring step: send to the next rank, receive from the previous */
        mmc_dist_req *q[2] = {NULL, NULL};
        mmc_status st = mmc_recv_start(j->g, j->b, n, MMC_F32, (r + p - 1) % p, 10, &q[0]);
        if (!st) st = mmc_send_start(j->g, j->a, n, MMC_F32, (r + 1) % p, 10, &q[1]);
        mmc_status st2 = mmc_dist_wait_all(q, 2);
        return st ? st : st2;
    }
    default: return MMC_OK;
    }
}

mmc_status mmc_plan_calibrate_coll(mmc_comm *world, mmc_plan_calib *c, FILE *log) {
    const int n = mmc_comm_size(world), r = mmc_comm_rank(world);
    if (n < 2) return mmc_error(MMC_ERR_INVALID, "collective calibration needs 2 or more ranks (run it under mpirun -np 2)");
    static const int64_t sizes[] = {64, 1024, 16384, 131072, 524288, 2097152, 16777216};
    const int nsz = (int)(sizeof sizes / sizeof *sizes);
    const int64_t maxb = sizes[nsz - 1];
    float *a = calloc((size_t)maxb / 4, sizeof *a), *b = calloc((size_t)maxb / 4, sizeof *b);
    if (!a || !b) { free(a); free(b); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    mmc_status st = MMC_OK;
    const int nt = mmc_get_num_threads();
    mmc_set_num_threads(1);
    gap_ctx = mmc_ctx_new();
    gap_x = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(128, 512));
    gap_w = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(512, 512));
    if (!gap_ctx || !gap_x || !gap_w) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    fill_rand(gap_x, 1), fill_rand(gap_w, 2);
    /* the gap: ~1 ms of GEMMs on rank 0 (about a layer's worth in the bench's small model), the
     * same count on every rank */
    int64_t iters = 1;
    if (r == 0) {
        gap_work(2);
        double t0 = mmc_now();
        gap_work(8);
        double dt = (mmc_now() - t0) / 8;
        iters = dt > 0 ? (int64_t)(1e-3 / dt + 0.5) : 1;
        if (iters < 1) iters = 1;
    }
    if ((st = mmc_broadcast(world, &iters, 1, MMC_I64, 0))) goto done;
    for (int p = 2; p <= n; p *= 2) {
        if (n % p) continue;
        mmc_comm *g = NULL;
        if (p == n) g = world;
        else if ((st = mmc_comm_split(world, r / p, r % p, "plan-calib", &g))) goto done;
        /* five rounds over every kind and size, each one's fastest loop kept (as the kernels'
         * fastest run: what the host's other work leaves alone); the rounds outermost, so that a
         * burst of other work (seconds, on a shared host) spoils one round, not every round of
         * one kind */
        double best[N_COLL_NAMES][16];
        for (int kind = 0; kind < N_COLL_NAMES; kind++)
            for (int si = 0; si < nsz; si++) best[kind][si] = DBL_MAX;
        for (int k = 0; k < 5 && !st; k++)
            for (int kind = 0; kind < N_COLL_NAMES && !st; kind++) {
                if (kind == MMC_COLL_P2P && p != 2) continue;
                for (int si = 0; si < nsz && !st; si++) {
                    const int64_t bytes = sizes[si] / (4 * p) * 4 * p;   /* whole floats per rank */
                    if (bytes < 4 * p) continue;
                    coll_job j = {g, kind, bytes, a, b, 0, 0, 0};
                    const int R = bytes >= 2097152 ? 8 : 24;
                    if ((st = mmc_barrier(world))) break;
                    double t0 = mmc_now();
                    for (int i = 0; i < R && !st; i++) {
                        gap_work(iters);
                        st = coll_once(&j);
                    }
                    double with = mmc_now() - t0;
                    if (st || (st = mmc_barrier(world))) break;
                    t0 = mmc_now();
                    for (int i = 0; i < R; i++) gap_work(iters);
                    double d = (with - (mmc_now() - t0)) / R;
                    if ((st = mmc_all_reduce(world, &d, &d, 1, MMC_F64, MMC_MAX))) break;
                    if (d < best[kind][si]) best[kind][si] = d;
                }
            }
        for (int kind = 0; kind < N_COLL_NAMES && !st; kind++)
            for (int si = 0; si < nsz && !st; si++) {
                const int64_t bytes = sizes[si] / (4 * p) * 4 * p;
                if (bytes < 4 * p || best[kind][si] == DBL_MAX) continue;
                double m = best[kind][si] < 1e-7 ? 1e-7 : best[kind][si];
                if (c && ccoll_put(c, kind, p, n, bytes, m)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
                if (c) c->dirty = true;
                if (log && r == 0)
                    fprintf(log, "  %-13s p %d of %d, %9lld bytes: %8.1f us\n", coll_names[kind], p, n, (long long)bytes,
                            m * 1e6);
            }
        if (g != world) mmc_comm_free(g);
    }
done:
    mmc_set_num_threads(nt);
    mmc_tensor_free(gap_x), mmc_tensor_free(gap_w), mmc_ctx_free(gap_ctx);
    gap_x = gap_w = NULL, gap_ctx = NULL;
    free(a), free(b);
    return st;
}

/* ------------------------------------------------------------------ layouts */
void mmc_plan_layout_str(const mmc_plan_layout *l, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "dp%d tp%d%s pp%d", l->dp, l->tp, l->sp ? "+sp" : "", l->pp);
    if (l->vpp > 1 && n > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "x%d", l->vpp);
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " cp%d%s", l->cp, l->cp > 1 ? (l->cp_ring ? "r" : "u") : "");
    if (l->ep > 1 && n > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " ep%d", l->ep);
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " z%d mb%lld%s", l->zero, (long long)l->micro_batch,
                      l->recompute == MMC_RECOMPUTE_FULL ? " rc" : l->recompute == MMC_RECOMPUTE_ATTENTION ? " rca" : "");
    if (l->recompute && l->recompute_layers > 0 && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "%lld", (long long)l->recompute_layers);
    if (l->hetero && n > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " vision-dp%d", l->dp * l->tp * l->pp);
    if (l->hetero_audio && n > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "+audio");
    if (l->vstage && n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " vision-stage");
}

bool mmc_plan_layout_ok(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_layout *l,
                        char *why, size_t cap) {
    if (why && cap) why[0] = 0;
#define NO(...) do { if (why) snprintf(why, cap, __VA_ARGS__); return false; } while (0)
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1 || l->vpp < 1 || l->micro_batch < 1) NO("sizes must be >= 1");
    if (l->ep > 1) NO("expert parallelism needs a mixture-of-experts model (ep %d)", l->ep);
    if (w->batch % (l->micro_batch * l->dp))
        NO("batch_size %lld does not divide into data_parallel %d x micro_batch_size %lld", (long long)w->batch, l->dp,
           (long long)l->micro_batch);
    /* the model's own checks, as the trainer runs them when it reads config.json */
    if (l->tp > 1 && mmc_qwen2_tp_check(&m->lm, l->tp, NULL)) NO("%s", mmc_last_error());
    if (l->cp > 1) {
        if ((!l->cp_ring || m->lm.rope_kind == MMC_ROPE_DYNAMIC) && mmc_cp_check_qwen2(&m->lm, l->cp, NULL))
            NO("%s", mmc_last_error());
        if (w->seq % l->cp) NO("seq_len %lld is not a multiple of context_parallel %d", (long long)w->seq, l->cp);
    }
    if (l->pp > 1) {
        if (l->pp * l->vpp > 1024) NO("too many pipeline stages");
        /* every (virtual) stage needs a layer; the split itself is automatic (mmc_plan_pp_split), as the
         * trainer's default (the vision tower on a stage of its own: the layers over the other pp - 1) */
        const int nd = l->vstage ? l->pp - 1 : l->pp * l->vpp;
        if (m->layers < nd)
            NO("pipeline_parallel %d%s makes %d %sstages for the model's %lld decoder layers: a stage would be empty",
               l->pp, l->vstage ? " with a vision stage" : l->vpp > 1 ? " x pipeline_virtual" : "", nd,
               l->vpp > 1 ? "virtual " : "decoder ", (long long)m->layers);
        const int64_t M = w->batch / (l->micro_batch * l->dp);
        if (l->vpp > 1 && M % l->pp)
            NO("interleaving needs the micro-batches per step (%lld) to be a multiple of pipeline_parallel %d", (long long)M,
               l->pp);
        if (M < l->pp) NO("%lld micro-batches per step is fewer than the %d stages", (long long)M, l->pp);
    }
    if (l->sp && l->tp < 2) NO("sequence parallelism needs tensor_parallel 2 or more");
    if (l->zero == 3 && w->weight_bytes != 2)
        NO("ZeRO-3 gathers bf16 working weights only (model.dtype bf16); f32 weights: zero 0-2");
    if (l->sp && w->seq * l->micro_batch % l->tp) NO("sequence parallelism needs the tokens to divide by tensor_parallel");
    if (l->vstage) {   /* parallel.pipeline_vision_stage (trainer_pp.c) */
        if (!m->vision || w->vision_patches <= 0) NO("a vision stage needs a vision tower and images");
        if (l->pp < 2 || l->vpp > 1 || l->hetero) NO("a vision stage needs pipeline_parallel 2 or more, plain 1F1B");
    }
    if (m->audio) {   /* the Qwen2.5-Omni thinker trains under tp x dp at ZeRO 0-2 (trainer.c) */
        if (l->pp > 1 || l->cp > 1) NO("the Qwen2.5-Omni thinker trains under tensor and data parallelism only");
        if (l->zero == 3) NO("the Qwen2.5-Omni thinker: ZeRO 0-2");
    }
    if (l->hetero) {   /* the trainer's per-modality plan: vision dp over all ranks, LM (pp x) tp x dp (ZeRO 0-3) */
        if ((!m->vision || w->vision_patches <= 0) && (!m->audio || w->audio_frames <= 0))
            NO("a per-modality plan needs a vision tower and images (or Qwen2.5-Omni's audio encoder and audio)");
        if (l->tp < 2 && l->pp < 2)
            NO("a per-modality plan needs the language model at tensor_parallel or pipeline_parallel 2 or more");
        if (l->cp > 1) NO("a per-modality plan composes with pp x tp x dp (ZeRO 0-3) only");
    }
    return true;
#undef NO
}

/* ------------------------------------------------------------------ the estimate */
typedef struct {
    double alpha, beta;
} link_ab;

/* the link a group of p ranks with stride s (ranks s apart) runs over */
static link_ab group_link(const mmc_plan_net *n, int p, int stride) {
    link_ab l = {n->alpha_intra, n->beta_intra};
    if ((int64_t)p * stride > n->ranks_per_node) l.alpha = n->alpha_inter, l.beta = n->beta_inter;
    return l;
}
static double coll(mmc_coll_kind k, int p, double bytes, link_ab l) { return mmc_plan_coll_time(k, p, bytes, l.alpha, l.beta); }

/* a collective's time: measured on this host (the CPU device's table, for a job of `ranks`) when
 * there is one for the kind and group size, else the alpha-beta model of its link */
static double ccost(const mmc_plan_device *d, int ranks, mmc_coll_kind k, int p, double bytes, link_ab l) {
    if (p < 2 && k != MMC_COLL_P2P) return 0;
    if (d->calib) {
        double t = mmc_plan_calib_coll(d->calib, k, p < 2 ? 2 : p, ranks, bytes);
        if (t >= 0) return t;
    }
    return coll(k, p, bytes, l);
}

/* elements of the dp gradient buckets (mmc_dp: 4 MiB of f32 gradients each) */
#define DP_BUCKET_BYTES 4194304.0

/* a gradient reduction of `bytes` in buckets: whole buckets and the rest */
static double bucketed(const mmc_plan_device *d, int ranks, mmc_coll_kind k, int p, double bytes, link_ab l) {
    if (!d->calib) return coll(k, p, bytes, l);
    const double nb = floor(bytes / DP_BUCKET_BYTES), rest = bytes - nb * DP_BUCKET_BYTES;
    return nb * ccost(d, ranks, k, p, DP_BUCKET_BYTES, l) + (rest > 0 ? ccost(d, ranks, k, p, rest, l) : 0);
}

/* fwd + bwd seconds of one decoder layer on one micro-batch on a rank (compute only), of its
 * forward alone (what full recompute repeats) and of its RoPE + attention-core forward (what
 * attention recompute repeats: the attention's share of the fwd + bwd is 1 : 2.5) */
static void layer_time(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                       const mmc_plan_layout *l, double *fb, double *fwd, double *afwd) {
    const int64_t b = l->micro_batch, S = w->seq, Tl = b * S / l->cp, t = l->tp;
    const int64_t C = m->hidden, F = m->inter, D = m->head_dim;
    const int64_t Hq = m->heads / (t * (l->cp_ring ? 1 : l->cp));
    const int64_t Hkv_t = m->kv_heads / t;
    int64_t Hkv = l->cp_ring || l->cp == 1 ? Hkv_t : (Hkv_t >= l->cp ? Hkv_t / l->cp : 1);
    if (Hkv < 1) Hkv = 1;
    const int64_t Te = l->sp ? Tl / t : Tl;   /* tokens of the norms / residuals */
    /* RoPE: q and k read and written once more */
    const double rope = 2.0 * (double)((m->heads + m->kv_heads) * D / t) * (double)Tl * (double)w->act_bytes / d->mem_bw;
    double tg, ta, te;
    if (d->calib) {   /* the measured layer of this shard, its attention swapped for the context-parallel one */
        const int64_t Sl = S / l->cp;
        /* the stage's layers in sequence (at most 8 measured), with the job's ranks busy on as
         * many of the host's cores as they fill */
        const int ranks = l->dp * l->tp * l->pp * l->cp;
        const int64_t Ls = m->layers / l->pp;
        const int busy = d->cores > 0 && ranks > d->cores ? d->cores : ranks;
        double lay = mmc_plan_calib_stack(d->calib, b, Sl, C, m->heads / t, Hkv_t, D, F / t, Ls < 8 ? Ls : 8, busy);
        double att = mmc_plan_calib_attn(d->calib, b, Sl, m->heads / t, Hkv_t, D);
        if (l->cp > 1) {
            const double local = att;
            /* Ulysses: whole sequences, heads / cp; ring: 1 / cp of the whole sequences' attention
             * (zigzag blocks balance the causal mask) */
            att = l->cp_ring ? mmc_plan_calib_attn(d->calib, b, S, m->heads / t, Hkv_t, D) / (double)l->cp
                             : mmc_plan_calib_attn(d->calib, b, S, Hq, Hkv, D);
            lay += att - local;
        }
        *fb = lay;
        *fwd = lay / 3.0;
        *afwd = att / 3.5 + rope;
        return;
    } else {
        double fg = 0;
        int64_t K[7], N[7];
        layer_linears(m, K, N);
        for (int i = 0; i < 7; i++) fg += 2.0 * (double)Tl * (double)K[i] * (double)N[i] / (double)t;
        tg = 3.0 * fg / d->gemm_flops;
        double fa = 2.0 * (double)b * (double)S * (double)S * (double)(m->heads / t) * (double)D / (double)l->cp;
        ta = 3.5 * fa / d->attn_flops;
        double el = 10.0 * (double)C * (double)Te + (3.0 * (double)F / (double)t + 2.0 * (double)((m->heads + m->kv_heads) * D) / (double)t) * (double)Tl;
        te = 3.0 * el * (double)w->act_bytes / d->mem_bw;
    }
    *fb = tg + ta + te;
    *fwd = tg / 3.0 + ta / 3.5 + te / 3.0;
    *afwd = ta / 3.5 + rope;
}

/* embedding + lm_head + loss of a micro-batch (last stage; the lookup on the first is memory only) */
static double head_time(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                        const mmc_plan_layout *l) {
    const int64_t Tl = l->micro_batch * w->seq / l->cp, Vt = m->vocab / l->tp;
    if (d->calib) return mmc_plan_calib_head(d->calib, Tl, m->hidden, Vt);
    double soft = 6.0 * (double)Tl * (double)Vt * 4.0 / d->mem_bw;   /* logits, softmax, its gradient */
    return 6.0 * (double)Tl * (double)m->hidden * (double)Vt / d->gemm_flops + soft;
}

/* vision tower + merger over a micro-batch's patches (fwd + bwd; fwd only when frozen) */
static double vision_time(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                          const mmc_plan_layout *l, int tv) {
    if (!m->vision || w->vision_patches <= 0) return 0;
    const int64_t Np = l->micro_batch * w->vision_patches, Cv = m->v_dim, Fv = m->v_inter, Dv = Cv / m->v_heads;
    const int64_t mm = m->v_merge * m->v_merge * Cv;
    double t;
    if (d->calib) {
        double blk = mmc_plan_calib_linear(d->calib, Np, Cv, 3 * Cv / tv) + mmc_plan_calib_linear(d->calib, Np, Cv / tv, Cv) +
                     mmc_plan_calib_linear(d->calib, Np, Cv, Fv / tv) + mmc_plan_calib_linear(d->calib, Np, Fv / tv, Cv) +
                     2.0 * mmc_plan_calib_attn(d->calib, l->micro_batch, w->vision_patches, m->v_heads / tv,
                                               m->v_heads / tv, Dv) +
                     mmc_plan_calib_eltwise(d->calib, Np, Cv, Fv / tv);
        t = (double)m->v_depth * blk + mmc_plan_calib_linear(d->calib, Np / (m->v_merge * m->v_merge), mm, mm) +
            mmc_plan_calib_linear(d->calib, Np / (m->v_merge * m->v_merge), mm, m->v_out);
    } else {
        double fl = 2.0 * (double)Np * (4.0 * (double)Cv * (double)Cv + 2.0 * (double)Cv * (double)Fv) / tv;
        double fa = 4.0 * (double)l->micro_batch * (double)w->vision_patches * (double)w->vision_patches * (double)Cv / tv;
        double fm = 2.0 * (double)(Np / (m->v_merge * m->v_merge)) * (double)mm * (double)(mm + m->v_out);
        t = 3.0 * ((double)m->v_depth * fl + fm) / d->gemm_flops + 3.5 * (double)m->v_depth * fa / d->attn_flops +
            3.0 * (double)m->v_depth * 12.0 * (double)Np * (double)Cv * w->act_bytes / d->mem_bw;
    }
    return w->freeze_vision ? t / 3.0 : t;
}

/* Qwen2.5-Omni's audio encoder on one micro-batch's clips (w->audio_frames mel frames a sample), fwd +
 * bwd (fwd only when frozen): conv1 over the frames, conv2 to N = frames / 2 rows, the layers on N rows
 * with attention inside chunks of n_window rows, pooling to N / 2 and the projection */
static double audio_time(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                         const mmc_plan_layout *l) {
    if (!m->audio || w->audio_frames <= 0) return 0;
    const int64_t Fr = l->micro_batch * w->audio_frames, N = Fr / 2 > 0 ? Fr / 2 : 1, Ca = m->a_dim, Fa = m->a_inter;
    const int64_t win = m->a_window > 0 ? m->a_window : 1, Da = Ca / m->a_heads;
    double t;
    if (d->calib) {
        const double blk = 4.0 * mmc_plan_calib_linear(d->calib, N, Ca, Ca) + mmc_plan_calib_linear(d->calib, N, Ca, Fa) +
                           mmc_plan_calib_linear(d->calib, N, Fa, Ca) +
                           mmc_plan_calib_attn(d->calib, (N + win - 1) / win, win, m->a_heads, m->a_heads, Da) +
                           mmc_plan_calib_eltwise(d->calib, N, Ca, Fa);
        t = (double)m->a_layers * blk + mmc_plan_calib_linear(d->calib, Fr, 3 * m->a_mels, Ca) +
            mmc_plan_calib_linear(d->calib, N, 3 * Ca, Ca) + mmc_plan_calib_linear(d->calib, N / 2 + 1, Ca, m->a_out);
    } else {
        const double fl = 2.0 * (double)N * (4.0 * (double)Ca * (double)Ca + 2.0 * (double)Ca * (double)Fa);
        const double fa = 4.0 * (double)N * (double)win * (double)Ca;   /* QK^T and PV inside the chunks */
        const double fc = 2.0 * (double)Fr * 3.0 * (double)(m->a_mels * Ca) + 2.0 * (double)N * 3.0 * (double)(Ca * Ca) +
                          (double)N * (double)(Ca * m->a_out);
        t = 3.0 * ((double)m->a_layers * fl + fc) / d->gemm_flops + 3.0 * (double)m->a_layers * fa / d->attn_flops +
            3.0 * (double)m->a_layers * 12.0 * (double)N * (double)Ca * w->act_bytes / d->mem_bw;
    }
    return w->freeze_audio ? t / 3.0 : t;
}

mmc_status mmc_plan_layer_costs(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                                const mmc_plan_layout *l, double *layer, double *first, double *last, double *vision) {
    const int t = l->tp;
    double fb, fwd, afwd;
    layer_time(m, w, d, l, &fb, &fwd, &afwd);
    double sparse = fb;   /* a Qwen2-MoE sparse layer: the dense layer with its MLP swapped for the block */
    if (m->moe_experts > 0) {
        const int64_t b = l->micro_batch, Sl = w->seq / l->cp, C = m->hidden;
        if (d->calib) {   /* the lone sparse layer against the lone dense one, both measured the same way */
            const double dense1 = mmc_plan_calib_layer(d->calib, b, Sl, C, m->heads / t, m->kv_heads / t, m->head_dim,
                                                       m->inter / t);
            const double moe1 = mmc_plan_calib_moe_layer(d->calib, b, Sl, C, m->heads / t, m->kv_heads / t, m->head_dim,
                                                         m->moe_experts, m->moe_top_k, m->moe_inter / t,
                                                         m->moe_shared / t);
            if (dense1 > 0 && moe1 > 0) sparse = fb * moe1 / dense1;
        } else {   /* GEMM FLOPs: k routed experts and the shared one per token, the router, in place of 3 C F */
            const double Tl = (double)(b * Sl), k3 = 3.0 * 2.0 * Tl * (double)C / t;
            sparse = fb + 3.0 * (k3 * ((double)(m->moe_top_k * m->moe_inter + m->moe_shared) - (double)m->inter) +
                                 2.0 * Tl * (double)C * (double)m->moe_experts) / d->gemm_flops;
            if (sparse < 0) sparse = 0;
        }
    }
    for (int64_t i = 0; i < m->layers; i++)
        layer[i] = m->moe_experts > 0 && i < 1024 && (m->moe_sparse[i / 64] >> (i % 64) & 1) ? sparse : fb;
    const int tv = m->vision && !m->audio && t > 1 && !l->hetero && mmc_vision_tp_ok(&m->vcfg, t, NULL, 0) ? t : 1;
    const double vis = vision_time(m, w, d, l, tv) * (l->hetero ? 1.0 / t : 1.0);
    if (vision) *vision = vis;
    /* (the token lookup itself is memory traffic only; a per-modality plan with the LM pipelined encodes
     * before the pipeline, on every rank: nothing on the first stage) */
    if (first)
        *first = (l->vstage || (l->hetero && l->pp > 1) ? 0 : vis) +
                 audio_time(m, w, d, l) * (l->hetero_audio ? 1.0 / t : 1.0);
    if (last) *last = head_time(m, w, d, l);
    return MMC_OK;
}

mmc_status mmc_plan_pp_split(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                             const mmc_plan_layout *l, int64_t *bounds, double *stage_cost, bool *even) {
    const int nst = l->pp * l->vpp;
    double *cost = malloc((size_t)m->layers * sizeof *cost), *sc = malloc((size_t)nst * sizeof *sc), first, last, vis;
    int64_t *bd = malloc((size_t)(nst + 1) * sizeof *bd);
    mmc_status st = MMC_OK;
    if (!cost || !sc || !bd) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) st = mmc_plan_layer_costs(m, w, d, l, cost, &first, &last, &vis);
    if (!st) st = mmc_pp_auto_split(cost, m->layers, l->pp, l->vpp, l->dualpipev, l->vstage, first, last, vis,
                                    MMC_PP_KEEP_EVEN, bd, sc, even);
    if (!st && bounds) memcpy(bounds, bd, (size_t)(nst + 1) * sizeof *bd);
    if (!st && stage_cost) memcpy(stage_cost, sc, (size_t)nst * sizeof *sc);
    free(cost); free(sc); free(bd);
    return st;
}

void mmc_plan_calib_default_path(char *out, size_t cap) {
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (x && *x) snprintf(out, cap, "%s/mmc/plan-cpu.txt", x);
    else snprintf(out, cap, "%s/.cache/mmc/plan-cpu.txt", h && *h ? h : "/tmp");
}

mmc_status mmc_plan_pp_measure(const mmc_qwen2_config *lm, const mmc_vision_config *vision, const mmc_plan_workload *w,
                               const mmc_plan_layout *l, const char *calib_path, int64_t *bounds, double *stage_cost,
                               bool *even) {
    mmc_plan_model m;
    mmc_status st = mmc_plan_model_from(lm, vision, &m);
    if (st) return mmc_error_prefix(st, "config.json");
    mmc_plan_calib *c = NULL;
    if (calib_path) {   /* its folder made if missing; a cache that cannot be read is left aside (measured anew) */
        char d[4096];
        snprintf(d, sizeof d, "%s", calib_path);
        for (char *p = d + 1; *p; p++)
            if (*p == '/') { *p = 0; mkdir(d, 0755); *p = '/'; }
        if (mmc_plan_calib_open(calib_path, &c)) {
            fprintf(stderr, "mmc: warning: %s; measuring the layers without it\n", mmc_last_error());
            c = NULL;
        }
    }
    if (!c && (st = mmc_plan_calib_open(NULL, &c))) return st;
    /* this host as mmc_plan_device_cpu describes it, without its bandwidth measurement: the costs here are
     * measured kernels (only the attention recompute's RoPE term reads mem_bw) */
    mmc_plan_device d = {.name = "cpu", .calib = c, .mem_bw = c->mem_bw > 0 ? c->mem_bw : 1e10};
    const long nc = sysconf(_SC_NPROCESSORS_ONLN);
    d.cores = nc > 0 ? (int)nc : 1;
    st = mmc_plan_pp_split(&m, w, &d, l, bounds, stage_cost, even);
    if (!st && mmc_plan_calib_save(c))
        fprintf(stderr, "mmc: warning: %s (the measured layer costs are not kept)\n", mmc_last_error());
    mmc_plan_calib_free(c);
    return st;
}

/* elements one decoder layer keeps per token for its backward (no recompute) */
static double layer_act_elems(const mmc_plan_model *m, const mmc_plan_layout *l) {
    const double C = (double)m->hidden, t = l->tp, D = (double)m->head_dim;
    return 6.0 * C / (l->sp ? t : 1.0) + ((2.0 * (double)m->heads + 3.0 * (double)m->kv_heads) * D + (double)m->heads * D +
                                          3.0 * (double)m->inter) / t;
}

static int64_t lora_params(const mmc_plan_model *m, const mmc_plan_workload *w) {
    int64_t K[7], N[7], p = 0;
    layer_linears(m, K, N);
    for (int i = 0; i < 7; i++)
        if (w->lora_targets & (1u << i)) p += w->lora_r * (K[i] + N[i]);
    return p * m->layers;
}

mmc_status mmc_plan_estimate_layout(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                                    const mmc_plan_net *n, const mmc_plan_layout *l, mmc_plan_estimate *e) {
    memset(e, 0, sizeof *e);
    char why[600];
    if (!mmc_plan_layout_ok(m, w, l, why, sizeof why)) return mmc_error(MMC_ERR_INVALID, "layout: %s", why);
    const int P = l->pp, v = l->vpp, t = l->tp, dpe = l->dp * l->cp;   /* gradients reduce over dp x cp */
    const int64_t M = w->batch / (l->micro_batch * l->dp);
    const int64_t Tl = l->micro_batch * w->seq / l->cp;
    const double ab = w->act_bytes, C = (double)m->hidden;
    /* layers per stage (the most a stage of the split holds, at most this: the layer counts per stage are
     * the even split's, rounded up; with a vision stage over the P - 1 stages after it) */
    const int64_t Ls = (m->layers + (l->vstage ? P - 1 : P) - 1) / (l->vstage ? P - 1 : P);
    /* the tower split over tp (tv), or whole: replicated, or data-parallel (hetero: 1/t of the images) */
    /* (Qwen2.5-Omni keeps its tower whole under tp; its audio encoder likewise, or data-parallel) */
    const int tv = m->vision && !m->audio && t > 1 && !l->hetero && mmc_vision_tp_ok(&m->vcfg, t, NULL, 0) ? t : 1;
    const double vshare = l->hetero ? 1.0 / t : 1.0, ashare = l->hetero_audio ? 1.0 / t : 1.0;
    /* ... and with the LM pipelined (trainer_pp_hetero.c): off the first stage; every rank encodes
     * 1 / (P t) of its replica's M micro-batches' images before the pipeline, its backward after */
    const bool hpp = l->hetero && P > 1;
    const int ranks = l->dp * t * P * l->cp;
    /* CPU: the ranks share this host's cores with each other and with whatever else runs: the job
     * has `eff` cores' worth (ranks x host_share when measured, else min(ranks, cores)); with
     * every rank busy each runs at eff / ranks of a core (share = the slowdown), but a rank idle
     * in a pipeline bubble or blocked in a collective leaves its core to the others (below) */
    double share = 1.0, eff = (double)ranks;
    if (d->cores > 0) {
        eff = d->host_share > 0 ? (double)ranks * d->host_share : ranks > d->cores ? (double)d->cores : (double)ranks;
        if (eff > ranks) eff = ranks;
        share = (double)ranks / eff;
    }

    /* ---- compute per micro-batch per stage */
    double lfb, lfwd, lafwd;
    layer_time(m, w, d, l, &lfb, &lfwd, &lafwd);
    /* recompute: the first nrc layers of each stage run their forward (full) or their RoPE +
     * attention core (attention) once more inside backward */
    const bool rc_full = l->recompute == MMC_RECOMPUTE_FULL, rc_attn = l->recompute == MMC_RECOMPUTE_ATTENTION;
    const int64_t nrc = !l->recompute ? 0 : l->recompute_layers > 0 && l->recompute_layers < Ls ? l->recompute_layers : Ls;
    const double rc = (double)nrc * (rc_full ? lfwd : rc_attn ? lafwd : 0);   /* per stage and micro-batch */
    double first = (double)Ls * lfb + rc + (hpp ? 0.0 : vision_time(m, w, d, l, tv) * vshare) + audio_time(m, w, d, l) * ashare, last = (double)Ls * lfb + rc + head_time(m, w, d, l);
    if (P == 1) first = last = first + head_time(m, w, d, l);
    if (l->vstage) first = vision_time(m, w, d, l, tv) * vshare;   /* the tower stage: no decoder layer */
    const double mid = (double)Ls * lfb + rc;   /* stages between the first and the last */
    double stage = first > last ? first : last;   /* on a core of its own */
    if (stage < mid) stage = mid;   /* (a light vision stage) */
    double all_stages = P == 1 ? first : first + last + (double)(P - 2) * mid;
    if (P > 1) {   /* the stages as mmc_plan_pp_split cuts them (what the trainer runs): each rank's chunks */
        int64_t bd[1025];
        double sc[1024];
        mmc_status st = mmc_plan_pp_split(m, w, d, l, bd, sc, NULL);
        if (st) return mmc_error_prefix(st, "layout: the pipeline split");
        stage = all_stages = 0;
        for (int r = 0; r < P; r++) {
            double s = 0;
            for (int c = 0; c < v; c++) {
                const int j = l->dualpipev ? (c == 0 ? r : 2 * P - 1 - r) : c * P + r;
                s += sc[j];
            }
            if (!(l->vstage && r == 0)) s += rc;
            stage = s > stage ? s : stage;
            all_stages += s;
        }
    }
    e->recompute_s = (double)M * rc * share;

    /* ---- communication per micro-batch on the critical path */
    const link_ab ltp = group_link(n, t, 1), lcp = group_link(n, l->cp, t), ldp = group_link(n, l->dp, t * l->cp);
    const link_ab lpp = group_link(n, P, t * l->cp * l->dp);
    double tp_mb = 0, cp_mb = 0, pp_mb = 0;
    double tp_step = 0;   /* once per step */
    if (t > 1) {
        const double act = (double)Tl * C * ab;
        /* per layer: the forward's two, the backward's two (full recompute: the forward's again) */
        const double fw = (double)Ls * 2.0 + (rc_full ? 2.0 * (double)nrc : 0.0);
        if (l->sp)   /* all-gather before attention and the MLP, reduce-scatter after */
            tp_mb = (fw + 2.0 * (double)Ls) * (ccost(d, ranks, MMC_COLL_ALL_GATHER, t, act, ltp) +
                                               ccost(d, ranks, MMC_COLL_REDUCE_SCATTER, t, act, ltp));
        else   /* the row-parallel outputs forward, the column-parallel inputs' gradients backward */
            tp_mb = (fw + 2.0 * (double)Ls) * ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, act, ltp);
        /* vocab-parallel embedding forward, lm_head input gradient (sp: the gather for lm_head
         * and its reduce-scatter), the vocab-parallel cross-entropy's max and sums */
        tp_mb += l->sp ? ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, act, ltp) + ccost(d, ranks, MMC_COLL_ALL_GATHER, t, act, ltp) +
                             ccost(d, ranks, MMC_COLL_REDUCE_SCATTER, t, act, ltp) + ccost(d, ranks, MMC_COLL_ALL_GATHER, t, act, ltp)
                       : 2.0 * ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, act, ltp);
        tp_mb += ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, (double)Tl * 4.0, ltp) +
                 ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, (double)Tl * 16.0, ltp);
        if (tv > 1)
            tp_mb += (double)m->v_depth * 4.0 *
                     ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, (double)(l->micro_batch * w->vision_patches) * (double)m->v_dim * ab, ltp);
        /* per step: the gradient norm's sum; sp: each replicated norm weight's partial gradient */
        tp_step = ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, 8.0, ltp);
        if (l->hetero && !hpp) {   /* the merged features all-gathered (forward only); the tower's gradients over tp */
            const double feats = (double)(l->micro_batch * w->vision_patches / (m->v_merge * m->v_merge)) *
                                 (double)m->v_out * ab;
            tp_mb += ccost(d, ranks, MMC_COLL_ALL_GATHER, t, feats, ltp);
            if (!w->freeze_vision && w->lora_r <= 0)   /* ZeRO >= 1: this rank's shard of them */
                tp_step += ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, (double)mmc_plan_vision_params(m) * 4.0 /
                                 (l->zero >= 1 ? (double)l->dp : 1.0), ltp);
        }
        if (l->hetero_audio && w->audio_frames > 0) {   /* the same for the audio encoder's features and gradients */
            const double feats = (double)(l->micro_batch * (w->audio_frames / 4)) * (double)m->a_out * ab;
            tp_mb += ccost(d, ranks, MMC_COLL_ALL_GATHER, t, feats, ltp);
            if (!w->freeze_audio && w->lora_r <= 0)
                tp_step += ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, (double)mmc_plan_audio_params(m) * 4.0 /
                                 (l->zero >= 1 ? (double)l->dp : 1.0), ltp);
        }
        if (l->sp) tp_step += (double)(2 * Ls + 1) * ccost(d, ranks, MMC_COLL_ALL_REDUCE, t, C * 4.0, ltp);
    }
    if (l->cp > 1) {
        const double hq = (double)m->heads / t, hkv = (double)(m->kv_heads / t >= l->cp ? m->kv_heads / t : l->cp);
        if (!l->cp_ring) {   /* q, k, v (K/V expanded to cp heads when fewer) and the output, each way */
            const double q = (double)Tl * hq * (double)m->head_dim * ab, kv = (double)Tl * hkv * (double)m->head_dim * ab;
            const double fw = 2.0 * ccost(d, ranks, MMC_COLL_ALL_TO_ALL, l->cp, q, lcp) +
                              2.0 * ccost(d, ranks, MMC_COLL_ALL_TO_ALL, l->cp, kv, lcp);
            cp_mb = ((double)Ls * 2.0 + (double)nrc) * fw;   /* recompute (either mode) repeats the forward's */
        } else {
            double kv = (double)Tl * 2.0 * (double)(m->kv_heads / t) * (double)m->head_dim * ab;
            link_ab lh = lcp;
            if (n->beta_p2p > 0 && (int64_t)ranks <= n->ranks_per_node) lh.alpha = n->alpha_p2p, lh.beta = n->beta_p2p;
            double hop = ccost(d, ranks, MMC_COLL_EXCHANGE, l->cp, kv, lh);
            double ring = 3.0 * (double)(l->cp - 1) * hop;   /* fwd K/V, bwd K/V + dK/dV */
            /* counted in full: on shared cores the hops do not hide; recompute repeats the forward's */
            cp_mb = (double)Ls * ring + (double)nrc * (double)(l->cp - 1) * hop;
        }
        /* Qwen2-VL: the tower replicated over the group (vision_time in full on every rank); the
         * merged features' gradient (f32) all-reduced over it once per micro-batch, backward */
        if (m->vision && w->vision_patches > 0 && !w->freeze_vision)
            cp_mb += ccost(d, ranks, MMC_COLL_ALL_REDUCE, l->cp,
                           (double)(l->micro_batch * w->vision_patches / (m->v_merge * m->v_merge)) * (double)m->v_out * 4.0,
                           lcp);
    }
    if (P > 1) {   /* measured point-to-point constants (this host) where the stages share a node;
                    * with sequence parallelism each tp rank passes its slice of the sequence */
        const double act = (double)Tl * C * ab / (l->sp ? t : 1);
        link_ab lp = lpp;
        if (n->beta_p2p > 0 && (int64_t)ranks <= n->ranks_per_node) lp.alpha = n->alpha_p2p, lp.beta = n->beta_p2p;
        pp_mb = 2.0 * (double)v * ccost(d, ranks, MMC_COLL_P2P, 2, act, lp);
    }
    const double comm_mb = tp_mb + cp_mb + pp_mb;   /* tp / cp / pp traffic is not overlapped */
    /* 1F1B: M v + P - 1 slots of a chunk (1 / v of the slowest stage's micro-batch); in the
     * first and last P - 1 slots only k < P stages work (the ramps), in the others all P. A slot
     * with k stages at work (k x dp x tp x cp ranks) on the job's eff cores runs at
     * max(1, k dp tp cp / eff) of its time on a core of its own: with more ranks than cores the
     * ranks idle in the ramps leave their cores to the others. A GPU, or a CPU with a core per
     * rank: (M + (P - 1) / v) x the stage's time, Narayanan et al.'s formula. */
    const double per_stage = (double)(l->dp * l->cp * t);
    double slots = 0;
    {
        const int64_t S = M * v + P - 1;
        for (int k = 1; k < P; k++) {
            const double sl = (double)k * per_stage / eff;
            slots += 2.0 * (sl > 1 ? sl : 1.0);
        }
        const double sl = (double)P * per_stage / eff;
        slots += (double)(S - 2 * (P - 1)) * (sl > 1 ? sl : 1.0);
    }
    const double span = (stage * slots + comm_mb * (double)(M * v + P - 1)) / (double)v;
    if (P > 1) {
        e->bubble = mmc_pp_bubble_fraction_v(P, v, (int)M);
        e->bubble_s = span - (double)M * (stage * share + comm_mb);
        if (e->bubble_s < 0) e->bubble_s = 0;
        e->bubble = e->bubble_s / span;
    }
    e->compute_s = stage * share * (double)M;
    e->tp_comm_s = tp_mb * (double)M + tp_step, e->cp_comm_s = cp_mb * (double)M, e->pp_comm_s = pp_mb * (double)M;

    /* ---- parameters on the busiest stage (the first: embeddings + vision + its layers) */
    const double lp = (double)mmc_plan_layer_params(m) / t, emb = (double)m->vocab * C / t;
    const double vis = (double)mmc_plan_vision_params(m) / tv + (double)mmc_plan_audio_params(m);   /* encoders */
    double p_first = (l->vstage ? 0.0 : (double)Ls * lp) + emb + vis, p_last = (double)Ls * lp + emb + C + (hpp ? vis : 0.0);
    if (P == 1) p_first = p_last = (double)m->layers * lp + emb * (m->tied ? 1 : 2) + C + vis;
    const bool firstbig = p_first >= p_last;
    const double prank = firstbig ? p_first : p_last;
    double train = prank;   /* trainable parameters on the rank */
    if (w->lora_r > 0) train = (double)lora_params(m, w) / (double)(P * t);
    else if (firstbig) train -= (w->freeze_vision ? (double)mmc_plan_vision_params(m) / tv : 0.0) +
                               (w->freeze_audio ? (double)mmc_plan_audio_params(m) : 0.0);
    if (train < 0) train = 0;

    /* ---- data-parallel communication (gradients f32, parameters in the weight dtype) */
    double dp_c = 0;
    if (dpe > 1) {
        const double g = train * 4.0, pw = train * (double)w->weight_bytes;
        if (l->zero <= 1) {
            dp_c = bucketed(d, ranks, MMC_COLL_ALL_REDUCE, dpe, g, ldp);
            /* CPU: the gradients copied into the flat buckets, scaled and copied back (mmc_dp),
             * memory-bound passes on the ranks' cores */
            if (d->calib) dp_c += 6.0 * g / d->mem_bw;
        }
        else if (l->zero == 2)   /* (under pp once a step: 1F1B accumulates a stage's micro-batches first) */
            dp_c = (double)(P > 1 ? 1 : M) * bucketed(d, ranks, MMC_COLL_REDUCE_SCATTER, dpe, g, ldp) +
                   bucketed(d, ranks, MMC_COLL_ALL_GATHER, dpe, pw, ldp);
        else if (P > 1)   /* pp x ZeRO-3: the stage gathered once a step, reduce-scattered once (trainer_pp.c) */
            dp_c = coll(MMC_COLL_ALL_GATHER, dpe, prank * w->weight_bytes, ldp) + coll(MMC_COLL_REDUCE_SCATTER, dpe, g, ldp);
        else
            dp_c = (double)M * (2.0 * coll(MMC_COLL_ALL_GATHER, dpe, prank * w->weight_bytes, ldp) +
                                coll(MMC_COLL_REDUCE_SCATTER, dpe, g, ldp));
    }
    e->dp_comm_s = dp_c;
    double bwd_last = stage * 2.0 / 3.0;   /* the last micro-batch's backward hides part of it */
    double hidden = d->overlap * dp_c;
    if (l->zero < 3 && hidden > bwd_last) hidden = bwd_last;
    const double dp_exposed = dp_c - hidden;

    /* ---- optimizer: AdamW over this rank's shard (~36 bytes / parameter: read p, g, m, v; write
     * p, m, v; the gradient norm and zeroing) */
    double shard = l->zero >= 1 ? train / dpe : train;
    e->optim_s = d->calib ? mmc_plan_calib_adamw(d->calib, (int64_t)shard) * share
                          : shard * (36.0 + (w->weight_bytes == 2 ? 6.0 : 0.0)) / d->mem_bw * share;

    /* the per-modality plan under pp, outside the pipeline's span: each rank's share through the tower
     * (and back), the replica's merged features (f32) to the first stage and their gradient back, the
     * tower's gradients all-reduced over the replica (then in the dp reduction above) */
    double hpp_s = 0, hpp_g = 0;
    if (hpp) {
        const int R = P * t;
        const double feats = (double)M * (double)(l->micro_batch * w->vision_patches / (m->v_merge * m->v_merge)) *
                             (double)m->v_out * 4.0;
        const double enc = (double)M * vision_time(m, w, d, l, 1) / R * share;
        const double fc = (w->freeze_vision ? 1.0 : 2.0) * ccost(d, ranks, MMC_COLL_ALL_GATHER, R, feats, lpp);
        if (!w->freeze_vision && w->lora_r <= 0)
            hpp_g = ccost(d, ranks, MMC_COLL_ALL_REDUCE, R, (double)mmc_plan_vision_params(m) * 4.0, lpp);
        e->compute_s += enc, e->pp_comm_s += fc, e->dp_comm_s += hpp_g, dp_c += hpp_g;
        e->cpu_s += (double)ranks * enc / share;
        hpp_s = enc + fc + hpp_g;
    }
    e->step_s = span + tp_step + dp_exposed + e->optim_s + hpp_s;
    e->comm_total_s = e->tp_comm_s + e->cp_comm_s + e->pp_comm_s + dp_c;
    e->cpu_s = per_stage * (double)M * all_stages + (double)ranks * e->optim_s / share;
    e->cpu_s += (double)ranks * e->comm_total_s * (d->cores > 0 ? 1.0 : 0.0);   /* CPU host: copies through shared memory */
    e->comm_s = e->tp_comm_s + e->cp_comm_s + e->pp_comm_s + dp_exposed + hpp_g;
    const double toks = (double)w->batch * (double)w->seq;
    e->flops_per_step = 3.0 * (double)m->layers * mmc_plan_layer_flops(m, (int64_t)toks, w->seq) +
                        6.0 * toks * C * (double)m->vocab;

    /* ---- memory on the busiest rank */
    double wp = prank * w->weight_bytes;
    if (l->zero == 3) wp = prank * w->weight_bytes / dpe + (P > 1 ? prank : 2.0 * lp) * w->weight_bytes;   /* shard +
                                                                      * gathered units (pp: the whole stage) */
    e->mem_params = wp;
    double grads = train * 4.0;
    if (l->zero >= 2 && P == 1) grads /= dpe;
    if (dpe > 1 && (l->zero < 2 || P > 1)) grads += train * 4.0;   /* the flat bucket copy DDP reduces in (pp x ZeRO-2:
                                                                    * the full gradients, packed, then reduce-scattered) */
    e->mem_grads = grads;
    double opt = train * 8.0 + (w->weight_bytes == 2 ? train * 4.0 : 0.0);   /* AdamW m, v (+ fp32 master) */
    if (l->zero >= 1) opt /= dpe;
    e->mem_optim = opt;
    /* micro-batches whose activations the first stage holds at once: min(M, P) in 1F1B; interleaved
     * adds (P - 1) / v chunk-sized ones */
    double in_flight = P > 1 ? (double)(M < P ? M : P) : 1.0;
    if (P > 1 && v > 1) in_flight += (double)(P - 1) / (double)v;
    const double vis_flight = in_flight;   /* the tower's, on stage 0 */
    if (l->vstage) in_flight = (double)(M < P - 1 ? M : P - 1);   /* the layers' from stage 1 on */
    const double per_layer = layer_act_elems(m, l) * (double)Tl * ab;
    double act;
    /* recompute: the layers' stack at the start of a micro-batch's backward, + what a layer rebuilds
     * in its backward when the last one is recomputed (with the first N < Ls recomputed, the later
     * layers' activations are freed before the first rebuild: the peak is the stack) */
    if (rc_full) {   /* a checkpointed layer keeps its input */
        const double kept = (C / (l->sp ? t : 1)) * (double)Tl * ab;
        act = ((double)nrc * kept + (double)(Ls - nrc) * per_layer) * in_flight + (nrc == Ls ? per_layer : 0);
    } else if (rc_attn) {   /* the rotated q and k are not kept */
        const double rot = (double)((m->heads + m->kv_heads) * m->head_dim) / t * (double)Tl * ab;
        act = ((double)Ls * per_layer - (double)nrc * rot) * in_flight + (nrc == Ls ? rot : 0);
    } else act = (double)Ls * per_layer * in_flight;
    if (!firstbig || P == 1) act += 2.0 * (double)Tl * ((double)m->vocab / t) * 4.0;   /* logits + their gradient */
    double vis_act = 0;
    if (m->vision && w->vision_patches > 0) {
        /* (pp per-modality: the rank's share of the step's images, held from before the pipeline to after) */
        double np = hpp ? (double)(M * l->micro_batch * w->vision_patches) / (double)(P * t)
                        : (double)(l->micro_batch * w->vision_patches) * vshare, cv = (double)m->v_dim;
        double blk = (4.0 * cv + (4.0 * cv + 2.0 * (double)m->v_inter) / tv) * np * ab;
        /* the tower is checkpointed under full recompute only (the trainer's rule) */
        vis_act = w->freeze_vision ? blk : (rc_full ? (double)m->v_depth * cv * np * ab + blk : (double)m->v_depth * blk) *
                                              (hpp ? 1.0 : vis_flight);
    }
    if (m->audio && w->audio_frames > 0) {   /* the audio encoder's layers on N = frames / 2 rows */
        const double na = (double)(l->micro_batch * w->audio_frames / 2) * ashare, ca = (double)m->a_dim;
        const double blk = (8.0 * ca + 2.0 * (double)m->a_inter) * na * ab;
        vis_act += w->freeze_audio ? blk : (double)m->a_layers * blk;
    }
    if (vis_act > 0 && (firstbig || P == 1 || hpp) && !l->vstage) act += vis_act;
    if (hpp && firstbig)   /* the first stage's copy of the step's features (and their gradient) */
        act += (w->freeze_vision ? 1.0 : 2.0) * (double)(M * l->micro_batch * w->vision_patches / (m->v_merge * m->v_merge)) *
               (double)m->v_out * 4.0;
    if (l->vstage && firstbig) act = vis_act;   /* the busiest rank is the tower's: no decoder layer there */
    if (m->vision && l->cp > 1 && (firstbig || P == 1))   /* cp: the whole row's embeddings, before and after the features */
        act += 2.0 * (double)(l->micro_batch * w->seq) * C * ab;
    e->mem_act = act;
    e->mem_total = e->mem_params + e->mem_grads + e->mem_optim + e->mem_act;

    /* ---- bytes a rank sends per step */
    double sent = 0;
    if (t > 1) sent += (double)M * ((double)Ls * 4.0 + 2.0) * 2.0 * (t - 1) / t * (double)Tl * C * ab;
    if (P > 1) sent += (double)M * 2.0 * v * (double)Tl * C * ab / (l->sp ? t : 1);
    if (dpe > 1) sent += 2.0 * (dpe - 1) / dpe * train * 4.0 * (l->zero == 3 ? (P > 1 ? 1.5 : 1.5 * (double)M) : 1.0);
    e->comm_bytes = sent;
    return MMC_OK;
}
