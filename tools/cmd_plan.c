/* cmd_plan.c — `mmc plan RUN.yaml --gpus N [--gpu-mem G] [--device D] [--interconnect I] [--top K]
 * [--write OUT.yaml] [--json]`: every parallel layout of the run's model on N ranks that the
 * trainer accepts (its own config rules, reused by loading RUN.yaml with each layout's --set
 * overrides, and the model's divisibility checks), ranked by the modelled step time of
 * mmc_plan.h among those whose memory per rank fits G GiB; prints a table and why the top choices
 * win, and writes the chosen `parallel:` section into a copy of the YAML.
 * `mmc plan --calibrate-net` (under mpirun -np 2) measures this host's alpha / beta into the
 * CPU calibration cache that --device cpu reads. */
#include "cli.h"
#include "mmc_config.h"
#include "mmc_parallel.h"
#include "mmc_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void help_plan(FILE *f) {
    fprintf(f,
            "usage: mmc plan RUN.yaml --gpus N [--gpu-mem G] [--device h100|h200|a100|cpu]\n"
            "                [--interconnect nvlink|ib|pcie] [--top K] [--write OUT.yaml] [--json]\n"
            "                [--batch B] [--seq S] [--image-patches P] [--audio-seconds A] [--calib FILE]\n"
            "       mpirun -np 2 mmc plan --calibrate-net [--calib FILE]\n\n"
            "Rank the parallel layouts of RUN.yaml's model on N ranks by modelled step time, keeping those\n"
            "whose memory per rank fits G GiB. Layouts: data_parallel x tensor_parallel (with and without\n"
            "sequence_parallel) x pipeline_parallel (1F1B, interleaved 2 / 4 chunks) x context_parallel\n"
            "(Ulysses, ring) = N, ZeRO 0-3, the vision tower split with the language model or data-parallel over\n"
            "all N ranks (a per-modality plan, vision-dpN) or on a pipeline stage of its own (vision-stage:\n"
            "parallel.pipeline_vision_stage, costed from the tower's FLOPs), data.micro_batch_size (divisors of the per-rank batch, up to\n"
            "16), activation recompute off / full / attention-only, and full recompute of the fewest layers of\n"
            "each stage that make the layout fit (rcN); only those the trainer accepts (the run config's rules,\n"
            "the model's heads / layers / vocabulary, the sequence length). The model: per-layer FLOPs at\n"
            "the device's rates, memory-bound work at its bandwidth, an alpha-beta time for each collective\n"
            "(ring all-reduce 2(p-1)a + 2(p-1)/p n b; all-gather, reduce-scatter, all-to-all (p-1)a +\n"
            "(p-1)/p n b; point-to-point a + n b), pipeline bubbles (P-1)/(vM+P-1), the recompute\n"
            "forward, ZeRO's sharding of optimizer state / gradients / parameters (README \"mmc plan\").\n\n"
            "options:\n"
            "  --gpus N              ranks (required)\n"
            "  --gpu-mem G           memory per rank in GiB (default: the device's; cpu: RAM / N)\n"
            "  --device D            h100 | h200 | a100 (bf16 peak x efficiency, HBM bandwidth) | cpu (this\n"
            "                        host: kernel times measured with mmc's own GEMM and attention at the\n"
            "                        layers' shapes, cached in --calib; weights as model.dtype) (default h100)\n"
            "  --interconnect I      nvlink (NVLink in a node of 8, InfiniBand NDR between nodes) | ib\n"
            "                        (InfiniBand everywhere) | pcie (PCIe in a node, InfiniBand between)\n"
            "                        (default nvlink; --device cpu uses the measured --calibrate-net figures)\n"
            "  --top K               rows of the table (default 8)\n"
            "  --write OUT.yaml      copy RUN.yaml with the best layout: its parallel: section replaced, and\n"
            "                        data.micro_batch_size / model.recompute / model.recompute_layers set where\n"
            "                        the file has them\n"
            "  --json                one JSON object per feasible layout (all of them, ranked) instead of the table\n"
            "  --batch B             global batch (samples per step) instead of data.batch_size\n"
            "  --seq S               tokens per sample instead of data.seq_len\n"
            "  --image-patches P     vision patches per sample for a Qwen2-VL model (default: data.max_pixels /\n"
            "                        196, else 1024 = one 448x448 image; 0 = text only)\n"
            "  --audio-seconds A     seconds of audio per sample for a Qwen2.5-Omni thinker (default 10; 0 = none);\n"
            "                        its per-modality plan shares the audio encoder too (vision-dpN+audio)\n"
            "  --calib FILE          the CPU calibration cache (default $XDG_CACHE_HOME/mmc/plan-cpu.txt or\n"
            "                        ~/.cache/mmc/plan-cpu.txt); delete it to measure again\n"
            "  --host-share F        --device cpu: the share of a core each rank will get (0-1; default:\n"
            "                        measured now by N threads spinning for 1 s, the best 0.1 s window: on a\n"
            "                        host shared with other sessions this is far below cores / N)\n"
            "  --calibrate-net       measure point-to-point and all-reduce alpha / beta between 2+ ranks\n"
            "                        started by mpirun, and store them in --calib (rank 0 writes)\n"
            "  -h, --help            this help\n\n"
            "examples:\n"
            "  mmc plan examples/qwen2_vl_7b_plan.yaml --gpus 64 --gpu-mem 80\n"
            "  mmc plan run.yaml --gpus 8 --device a100 --interconnect pcie --write run-8gpu.yaml\n"
            "  mpirun -np 2 mmc plan --calibrate-net && mmc plan run.yaml --gpus 4 --device cpu\n");
}

typedef struct {
    mmc_plan_layout l;
    mmc_plan_estimate e;
    bool fits;
} row;

static int cmp_rows(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->fits != y->fits) return x->fits ? -1 : 1;
    if (x->e.step_s != y->e.step_s) return x->e.step_s < y->e.step_s ? -1 : 1;
    return x->e.mem_total < y->e.mem_total ? -1 : x->e.mem_total > y->e.mem_total;
}

static void mkdir_parent(const char *path) {
    char d[4096];
    snprintf(d, sizeof d, "%s", path);
    for (char *p = d + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(d, 0755); *p = '/'; }
}

static int calibrate_net(const char *calib_path) {
    mmc_comm *world = NULL;
    mmc_status st = mmc_dist_init(&(mmc_dist_opts){.backend = MMC_DIST_AUTO}, &world);
    if (st) return cli_fail(st, "plan --calibrate-net: starting the distributed runtime");
    mmc_plan_net n;
    if ((st = mmc_plan_calibrate_net(world, &n))) { mmc_dist_finalize(); return cli_fail(st, "plan --calibrate-net"); }
    int rc = CLI_OK;
    mmc_plan_calib *c = NULL;
    if (mmc_comm_rank(world) == 0) {
        mkdir_parent(calib_path);
        if ((st = mmc_plan_calib_open(calib_path, &c))) rc = cli_fail(st, "plan --calibrate-net");
    }
    /* every rank joins; rank 0 (with the cache open) records */
    if ((st = mmc_plan_calibrate_coll(world, c, stdout))) { mmc_plan_calib_free(c); mmc_dist_finalize(); return cli_fail(st, "plan --calibrate-net"); }
    if (c) {
        {   /* alpha / beta from the 2-rank run (a 4-rank one adds its collectives' table only) */
            mmc_plan_net had;
            if (mmc_comm_size(world) == 2 || !mmc_plan_calib_net(c, &had)) mmc_plan_calib_set_net(c, &n);
            else n = had;
            if ((st = mmc_plan_calib_save(c))) rc = cli_fail(st, "plan --calibrate-net");
            else
                printf("collectives: alpha %.2f us, beta %.3f ns/byte (%.2f GB/s); point-to-point: alpha %.2f us, "
                       "beta %.3f ns/byte (%.2f GB/s) -> %s\n", n.alpha_intra * 1e6, n.beta_intra * 1e9,
                       1e-9 / n.beta_intra, n.alpha_p2p * 1e6, n.beta_p2p * 1e9, 1e-9 / n.beta_p2p, calib_path);
        }
        mmc_plan_calib_free(c);
    }
    mmc_dist_finalize();
    return rc;
}

static const char *recompute_name(int r) {
    return r == MMC_RECOMPUTE_FULL ? "full" : r == MMC_RECOMPUTE_ATTENTION ? "attention" : "none";
}

/* the trainer's rules of which modes combine, checked by loading the run config with the
 * layout's overrides (memoised: they depend on which modes are on, not on their sizes) */
typedef struct { unsigned key; bool ok; char why[400]; } memo;

static bool config_accepts(const char *path, const mmc_plan_layout *l, memo *mm, int *n_mm, char *why, size_t cap) {
    unsigned key = (l->tp > 1) | (l->pp > 1) << 1 | (l->cp > 1) << 2 | l->sp << 3 | (unsigned)l->zero << 4 |
                   (l->vpp > 1) << 6 | (unsigned)l->cp_ring << 7 | (unsigned)l->recompute << 8 | (unsigned)l->hetero << 10 |
                   (unsigned)(l->recompute_layers > 0) << 11 | (unsigned)l->vstage << 12;
    for (int i = 0; i < *n_mm; i++)
        if (mm[i].key == key) { snprintf(why, cap, "%s", mm[i].why); return mm[i].ok; }
    char s[13][96];
    snprintf(s[0], 96, "parallel.tensor_parallel=%d", l->tp > 1 ? 2 : 1);
    snprintf(s[1], 96, "parallel.pipeline_parallel=%d", l->pp > 1 ? 2 : 1);
    snprintf(s[2], 96, "parallel.context_parallel=%d", l->cp > 1 ? 2 : 1);
    snprintf(s[3], 96, "parallel.sequence_parallel=%s", l->sp ? "true" : "false");
    snprintf(s[4], 96, "parallel.zero=%d", l->zero);
    snprintf(s[5], 96, "parallel.pipeline_virtual=%d", l->vpp > 1 ? 2 : 1);
    snprintf(s[6], 96, "parallel.context_parallel_mode=%s", l->cp_ring ? "ring" : "ulysses");
    snprintf(s[7], 96, "model.recompute=%s", recompute_name(l->recompute));
    snprintf(s[8], 96, "parallel.data_parallel=1");
    snprintf(s[9], 96, "model.recompute_layers=%d", l->recompute_layers > 0);
    snprintf(s[10], 96, "parallel.vision.tensor_parallel=1");   /* hetero: the tower data-parallel */
    snprintf(s[11], 96, "parallel.pipeline_vision_stage=true");   /* the tower on a stage of its own */
    snprintf(s[12], 96, "parallel.audio.tensor_parallel=1");   /* Qwen2.5-Omni: the audio encoder data-parallel */
    const char *sets[13];
    int ns = 0;
    for (int i = 0; i < 13; i++)
        if ((i != 10 || l->hetero) && (i != 11 || l->vstage) && (i != 12 || l->hetero_audio)) sets[ns++] = s[i];
    mmc_run_config c;
    mmc_status st = mmc_run_config_load(path, sets, ns, &c);
    memo *m = &mm[(*n_mm)++];
    m->key = key, m->ok = st == MMC_OK;
    snprintf(m->why, sizeof m->why, "%s", st ? mmc_last_error() : "");
    if (!st) mmc_run_config_free(&c);
    snprintf(why, cap, "%s", m->why);
    return m->ok;
}

static void print_json(const row *r, int rank, const mmc_plan_device *d, int gpus) {
    const mmc_plan_layout *l = &r->l;
    const mmc_plan_estimate *e = &r->e;
    char s[128];
    mmc_plan_layout_str(l, s, sizeof s);
    double mfu = d->calib ? 0 : e->flops_per_step / (e->step_s * gpus * d->gemm_flops / 0.6);
    printf("{\"rank\": %d, \"layout\": \"%s\", \"dp\": %d, \"tp\": %d, \"sp\": %s, \"pp\": %d, \"vpp\": %d, \"cp\": %d, "
           "\"cp_mode\": \"%s\", \"ep\": %d, \"hetero\": %s, \"vision_stage\": %s, \"zero\": %d, \"micro_batch\": %lld, \"recompute\": \"%s\", "
           "\"recompute_layers\": %lld, \"fits\": %s, "
           "\"step_s\": %.6g, \"compute_s\": %.6g, \"recompute_s\": %.6g, \"comm_s\": %.6g, \"comm_total_s\": %.6g, "
           "\"tp_comm_s\": %.6g, \"cp_comm_s\": %.6g, \"pp_comm_s\": %.6g, \"dp_comm_s\": %.6g, \"bubble\": %.6g, "
           "\"bubble_s\": %.6g, \"optim_s\": %.6g, \"mfu\": %.4f, \"mem_bytes\": %.6g, \"mem_params\": %.6g, "
           "\"mem_grads\": %.6g, \"mem_optim\": %.6g, \"mem_act\": %.6g, \"comm_bytes\": %.6g, \"host_share\": %.4g, \"cpu_s\": %.6g}\n",
           rank, s, l->dp, l->tp, l->sp ? "true" : "false", l->pp, l->vpp, l->cp, l->cp_ring ? "ring" : "ulysses", l->ep,
           l->hetero ? "true" : "false", l->vstage ? "true" : "false", l->zero, (long long)l->micro_batch, recompute_name(l->recompute),
           (long long)l->recompute_layers, r->fits ? "true" : "false", e->step_s,
           e->compute_s, e->recompute_s, e->comm_s, e->comm_total_s, e->tp_comm_s, e->cp_comm_s, e->pp_comm_s,
           e->dp_comm_s, e->bubble, e->bubble_s, e->optim_s, mfu, e->mem_total, e->mem_params, e->mem_grads,
           e->mem_optim, e->mem_act, e->comm_bytes, d->cores > 0 ? d->host_share : 1.0, e->cpu_s);
}

static const double GiB = 1073741824.0;

/* the layout's pipeline split as `mmc train` cuts it with pipeline_layers auto (mmc_plan_pp_split):
 * the counts ("3, 1") and each (virtual) stage's modelled ms per micro-batch ("41.2|40.8"); false
 * without a pipeline */
static bool split_str(const mmc_plan_model *m, const mmc_plan_workload *w, const mmc_plan_device *d,
                      const mmc_plan_layout *l, char *counts, size_t cap, char *ms, size_t cap2) {
    if (l->pp < 2 || l->pp * l->vpp > 1024) return false;
    int64_t bd[1025];
    double sc[1024];
    if (mmc_plan_pp_split(m, w, d, l, bd, sc, NULL)) return false;
    size_t a = 0, b = 0;
    counts[0] = ms[0] = 0;
    for (int k = 0; k < l->pp * l->vpp && a + 24 < cap && b + 24 < cap2; k++) {
        if (!(l->vstage && k == 0))
            a += (size_t)snprintf(counts + a, cap - a, "%s%lld", a ? ", " : "", (long long)(bd[k + 1] - bd[k]));
        b += (size_t)snprintf(ms + b, cap2 - b, "%s%.4g", k ? "|" : "", 1e3 * sc[k]);
    }
    return true;
}

static void explain(const row *r, int i, double gmem, const row *best, const mmc_plan_model *m,
                    const mmc_plan_workload *w, const mmc_plan_device *d) {
    const mmc_plan_estimate *e = &r->e;
    char s[128];
    mmc_plan_layout_str(&r->l, s, sizeof s);
    printf("%d. %s: %.3f s per step", i + 1, s, e->step_s);
    if (best != r) printf(" (%.1f%% slower than #1)", 100.0 * (e->step_s / best->e.step_s - 1));
    printf("\n   compute %.0f%% of the step (recompute %.0f%%), exposed communication %.0f%% (tp %.3f s, cp %.3f s, pp "
           "%.3f s, dp %.3f s of which %.3f s hidden), bubble %.0f%%, optimizer %.0f%%\n",
           100 * e->compute_s / e->step_s, 100 * e->recompute_s / e->step_s, 100 * e->comm_s / e->step_s, e->tp_comm_s,
           e->cp_comm_s, e->pp_comm_s, e->dp_comm_s, e->comm_total_s - e->comm_s, 100 * e->bubble_s / e->step_s,
           100 * e->optim_s / e->step_s);
    const double u = gmem < 4 * GiB ? 1048576.0 : GiB;   /* MiB for small runs */
    if (r->l.hetero && r->l.pp > 1)
        printf("   per-modality plan: the vision tower whole and data-parallel over all %d ranks (each rank encodes 1/%d "
               "of its replica's step images before the pipeline, the features sent to the first stage), the language "
               "model at pp%d x tp%d x dp%d\n", r->l.dp * r->l.tp * r->l.pp, r->l.tp * r->l.pp, r->l.pp, r->l.tp, r->l.dp);
    else if (r->l.hetero)
        printf("   per-modality plan: the vision tower whole and data-parallel over all %d ranks (each tensor-parallel "
               "rank encodes 1/%d of its micro-batch's images, the features all-gathered), the language model at tp%d x "
               "dp%d\n", r->l.dp * r->l.tp, r->l.tp, r->l.tp, r->l.dp);
    if (r->l.hetero_audio)
        printf("   the audio encoder likewise (each tensor-parallel rank encodes 1/%d of its micro-batch's clips)\n",
               r->l.tp);
    if (r->l.vstage)
        printf("   vision stage: the tower, merger and embedding on pipeline stage 0 alone, the decoder layers over "
               "stages 1 .. %d\n", r->l.pp - 1);
    char counts[512], ms[1024];
    if (split_str(m, w, d, &r->l, counts, sizeof counts, ms, sizeof ms))
        printf("   pipeline stages (as mmc train's pipeline_layers auto cuts them): [%s] layers%s, %s ms per micro-batch\n",
               counts, r->l.vstage ? " after the tower's stage" : "", ms);
    printf("   memory %.1f %s of %.1f: parameters %.1f, gradients %.1f, optimizer %.1f, activations %.1f\n",
           e->mem_total / u, u == GiB ? "GiB" : "MiB", gmem / u, e->mem_params / u, e->mem_grads / u, e->mem_optim / u,
           e->mem_act / u);
}

/* replace the top-level parallel: block of text (or append one) and the values of
 * micro_batch_size / recompute where each occurs once */
static char *rewrite_yaml(const char *text, const mmc_plan_layout *l, const char *note, const char *layers) {
    size_t n = strlen(text), cap = n + 2048, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    const char *p = text;
    bool skipping = false;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t ll = e ? (size_t)(e - p + 1) : strlen(p);
        bool top = ll > 0 && p[0] != ' ' && p[0] != '\t' && p[0] != '#' && p[0] != '\n';
        if (top) skipping = !strncmp(p, "parallel:", 9);
        if (!skipping) { memcpy(out + len, p, ll); len += ll; }
        p += ll;
    }
    if (len && out[len - 1] != '\n') out[len++] = '\n';
    len += (size_t)snprintf(out + len, cap - len,
                            "parallel:   # %s\n  data_parallel: %d\n  tensor_parallel: %d\n  sequence_parallel: %s\n"
                            "  pipeline_parallel: %d\n  pipeline_virtual: %d\n  context_parallel: %d\n"
                            "  context_parallel_mode: %s\n  zero: %d\n",
                            note, l->dp, l->tp, l->sp ? "true" : "false", l->pp, l->vpp, l->cp,
                            l->cp_ring ? "ring" : "ulysses", l->zero);
    if (l->vstage) len += (size_t)snprintf(out + len, cap - len, "  pipeline_vision_stage: true\n");
    if (layers)   /* the split the model was costed with (mmc train's auto would measure its own) */
        len += (size_t)snprintf(out + len, cap - len, "  pipeline_layers: [%s]\n", layers);
    if (l->hetero)   /* per-modality plan: the vision tower data-parallel over every rank */
        len += (size_t)snprintf(out + len, cap - len, "  vision: {data_parallel: %d}\n", l->dp * l->tp * l->pp);
    if (l->hetero_audio)   /* Qwen2.5-Omni: the audio encoder too */
        len += (size_t)snprintf(out + len, cap - len, "  audio: {data_parallel: %d}\n", l->dp * l->tp);
    out[len] = 0;
    /* micro_batch_size: N, recompute: none|full|attention and recompute_layers: N, in place when
     * the key occurs exactly once */
    const char *keys[3] = {"micro_batch_size:", "recompute:", "recompute_layers:"};
    for (int k = 0; k < 3; k++) {
        char *a = strstr(out, keys[k]);
        if (!a || strstr(a + 1, keys[k])) continue;
        char *v = a + strlen(keys[k]);
        while (*v == ' ') v++;
        char *ve = v;
        while (*ve && *ve != ',' && *ve != '}' && *ve != '\n' && *ve != ' ' && *ve != '#') ve++;
        char val[32];
        if (k == 0) snprintf(val, sizeof val, "%lld", (long long)l->micro_batch);
        else if (k == 1) snprintf(val, sizeof val, "%s", recompute_name(l->recompute));
        else snprintf(val, sizeof val, "%lld", (long long)(l->recompute ? l->recompute_layers : 0));
        size_t vl = strlen(val), tail = strlen(ve);
        char *o2 = malloc((size_t)(v - out) + vl + tail + 1);
        if (!o2) { free(out); return NULL; }
        memcpy(o2, out, (size_t)(v - out));
        memcpy(o2 + (v - out), val, vl);
        memcpy(o2 + (v - out) + vl, ve, tail + 1);
        free(out);
        out = o2;
    }
    return out;
}

int cmd_plan(int argc, char **argv) {
    const char *cmd = "plan", *yaml = NULL, *device = "h100", *inter = NULL, *write = NULL, *calib_arg = NULL;
    long long gpus = 0, top = 8, batch = -1, seq = -1, patches = -1;
    double gmem_gib = 0, host_share = -1, audio_s = -1;
    bool json = false, cal_net = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { help_plan(stdout); return CLI_OK; }
        if (!strcmp(a, "--gpus")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1 << 20, &gpus)) return CLI_USAGE; }
        else if (!strcmp(a, "--gpu-mem")) { if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, 1e-3, 1e6, &gmem_gib)) return CLI_USAGE; }
        else if (!strcmp(a, "--device")) { if (!(device = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--interconnect")) { if (!(inter = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--top")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1 << 20, &top)) return CLI_USAGE; }
        else if (!strcmp(a, "--write")) { if (!(write = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--calib")) { if (!(calib_arg = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (!strcmp(a, "--batch")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1LL << 40, &batch)) return CLI_USAGE; }
        else if (!strcmp(a, "--seq")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1 << 24, &seq)) return CLI_USAGE; }
        else if (!strcmp(a, "--audio-seconds")) { if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, 0, 36000, &audio_s)) return CLI_USAGE; }
        else if (!strcmp(a, "--image-patches")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 0, 1 << 24, &patches)) return CLI_USAGE; }
        else if (!strcmp(a, "--host-share")) { if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, 1e-4, 1, &host_share)) return CLI_USAGE; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--calibrate-net")) cal_net = true;
        else if (a[0] == '-' && a[1]) return cli_usage(cmd, "unknown option '%s'", a);
        else if (!yaml) yaml = a;
        else return cli_usage(cmd, "unexpected argument '%s' (one RUN.yaml)", a);
    }
    char calib_path[4096];
    if (calib_arg) snprintf(calib_path, sizeof calib_path, "%s", calib_arg);
    else mmc_plan_calib_default_path(calib_path, sizeof calib_path);
    if (cal_net) return calibrate_net(calib_path);
    if (!yaml) return cli_usage(cmd, "missing RUN.yaml (the run config to plan)");
    if (gpus < 1) return cli_usage(cmd, "missing --gpus N (how many ranks to plan for)");
    mmc_plan_device dev;
    mmc_plan_net net;
    mmc_plan_calib *calib = NULL;
    const bool cpu = !strcmp(device, "cpu");
    if (!cpu && !mmc_plan_device_named(device, &dev))
        return cli_usage(cmd, "--device '%s': expected h100, h200, a100 or cpu", device);
    if (inter && !mmc_plan_net_named(inter, &net))
        return cli_usage(cmd, "--interconnect '%s': expected nvlink, ib or pcie", inter);
    if (!inter && !cpu) mmc_plan_net_named("nvlink", &net);

    mmc_run_config rc;
    mmc_status st = mmc_run_config_load(yaml, NULL, 0, &rc);
    if (st) return cli_fail(st, "plan");
    int code = CLI_ERROR;
    row *rows = NULL;
    memo *mm = NULL;
    char *text = NULL;
    mmc_json *cj = NULL;
    int nr = 0, cap = 0, n_mm = 0;
    char cfgpath[4200];
    if (rc.model.init) snprintf(cfgpath, sizeof cfgpath, "%s", rc.model.init);
    else snprintf(cfgpath, sizeof cfgpath, "%s/config.json", rc.model.path);
    if ((st = mmc_json_load(cfgpath, &cj))) { code = cli_fail(st, "plan: the model's config (model.%s)", rc.model.init ? "init" : "path"); goto out; }
    mmc_plan_model m;
    if ((st = mmc_plan_model_read(cj, cfgpath, &m))) { code = cli_fail(st, "plan"); goto out; }
    mmc_plan_workload w = {.batch = batch > 0 ? batch : rc.data.batch_size, .micro_batch = rc.data.micro_batch_size,
                           .seq = seq > 0 ? seq : rc.data.seq_len, .weight_bytes = rc.model.dtype == MMC_RUN_BF16 ? 2 : 4,
                           .act_bytes = cpu ? 4 : 2, .lora_r = rc.model.lora.r,
                           .freeze_vision = (rc.model.freeze_mask & 1u) != 0};
    if (m.audio) {   /* Qwen2.5-Omni: 100 mel frames a second; both encoders frozen unless model.freeze is given */
        w.audio_frames = (int64_t)((audio_s >= 0 ? audio_s : 10.0) * 100.0 + 0.5);
        w.freeze_audio = (rc.model.freeze_mask & MMC_FREEZE_AUDIO) != 0 || !rc.model.freeze.items;
        w.freeze_vision = w.freeze_vision || !rc.model.freeze.items;
    }
    if (m.vision) w.vision_patches = patches >= 0 ? patches : rc.data.max_pixels > 0 ? rc.data.max_pixels / 196 : 1024;
    if (w.lora_r > 0) {
        static const char *const names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        for (int i = 0; i < rc.model.lora.targets.n; i++)
            for (int k = 0; k < 7; k++)
                if (strstr(rc.model.lora.targets.items[i], names[k])) w.lora_targets |= 1u << k;
        if (!w.lora_targets) w.lora_targets = 0x7f;
    }
    if (cpu) {
        mkdir_parent(calib_path);
        if ((st = mmc_plan_calib_open(calib_path, &calib))) { code = cli_fail(st, "plan"); goto out; }
        if ((st = mmc_plan_device_cpu(calib, &dev))) { code = cli_fail(st, "plan"); goto out; }
        if (host_share < 0) {
            double mean;
            host_share = mmc_plan_host_share((int)gpus, 1.0, &mean);
            if (!json)
                printf("this host now gives each of %lld ranks %.2f of a core at best (%.2f on average over 1 s)\n", gpus,
                       host_share, mean);
        }
        dev.host_share = host_share;
        if (!inter && !mmc_plan_calib_net(calib, &net)) {
            if (gpus > 1) {
                code = cli_fail(MMC_OK, "plan --device cpu: no measured communication constants in %s; run `mpirun -np 2 "
                                "%s plan --calibrate-net` first (or give --interconnect)", calib_path, argv[0]);
                goto out;
            }
            mmc_plan_net_named("nvlink", &net);
        }
        if (!inter) net.ranks_per_node = 1 << 20;   /* one host */
        if (gmem_gib <= 0) {
            long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGE_SIZE);
            gmem_gib = pages > 0 && ps > 0 ? (double)pages * (double)ps / GiB / (double)gpus : 16;
        }
    }
    if (gmem_gib <= 0) gmem_gib = dev.mem_bytes / GiB;
    const double gmem = gmem_gib * GiB;
    /* one memo per distinct key (13 bits) */
    if (!(mm = calloc(8192, sizeof *mm))) { code = cli_fail(MMC_ERR_OOM, "out of memory"); goto out; }
    char why[600], first_why[700] = "";
    int64_t tried = 0;
    /* enumerate: tp fastest, then cp, dp, pp (Megatron's rank order; the model sizes each) */
    for (int tp = 1; tp <= gpus; tp++) {
        if (gpus % tp) continue;
        for (int cp = 1; cp <= gpus / tp; cp++) {
            if ((gpus / tp) % cp) continue;
            for (int pp = 1; pp <= gpus / tp / cp; pp++) {
                if ((gpus / tp / cp) % pp) continue;
                const int dp = (int)(gpus / tp / cp / pp);
                for (int vpp = 1; vpp <= (pp > 1 ? 4 : 1); vpp *= 2)
                    for (int sp = 0; sp <= (tp > 1); sp++)
                        for (int ring = 0; ring <= (cp > 1); ring++)
                            for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); zero++)
                                for (int rcmp = 0; rcmp <= 2; rcmp++)
                                    for (int het = 0; het <= (m.vision && (((tp > 1 || pp > 1) && w.vision_patches > 0) || (tp > 1 && w.audio_frames > 0))); het++)
                                    for (int vst = 0; vst <= (m.vision && pp > 1 && vpp == 1 && !het && w.vision_patches > 0); vst++)
                                    for (int64_t mb = 1; mb <= 16 && mb * dp <= w.batch; mb++) {
                                        /* ep: expert parallelism (1 here; a MoE model's layouts add ep | dp x cp) */
                                        mmc_plan_layout l = {.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = 1, .vpp = vpp,
                                                             .sp = sp, .cp_ring = ring, .zero = zero, .recompute = rcmp,
                                                             .micro_batch = mb, .hetero = het, .vstage = vst,
                                                             .hetero_audio = het && w.audio_frames > 0};
                                        tried++;
                                        if (!mmc_plan_layout_ok(&m, &w, &l, why, sizeof why)) {
                                            if (!*first_why) snprintf(first_why, sizeof first_why, "%s", why);
                                            continue;
                                        }
                                        if (!config_accepts(yaml, &l, mm, &n_mm, why, sizeof why)) continue;
                                        if (nr == cap) {
                                            cap = cap ? 2 * cap : 256;
                                            row *r2 = realloc(rows, (size_t)cap * sizeof *r2);
                                            if (!r2) { code = cli_fail(MMC_ERR_OOM, "out of memory"); goto out; }
                                            rows = r2;
                                        }
                                        row *r = &rows[nr];
                                        r->l = l;
                                        if (mmc_plan_estimate_layout(&m, &w, &dev, &net, &l, &r->e)) continue;
                                        r->fits = r->e.mem_total <= gmem;
                                        nr++;
                                        /* full recompute fits and none does not: also the fewest
                                         * recomputed layers per stage that fit (rcN) */
                                        const int64_t Ls = m.layers / (vst ? pp - 1 : pp);
                                        mmc_plan_layout ln = l, lk = l;
                                        mmc_plan_estimate en, ek;
                                        ln.recompute = MMC_RECOMPUTE_NONE;
                                        if (rcmp != MMC_RECOMPUTE_FULL || !r->fits || Ls < 2 ||
                                            mmc_plan_estimate_layout(&m, &w, &dev, &net, &ln, &en) || en.mem_total <= gmem)
                                            continue;
                                        for (int64_t k = 1; k < Ls; k++) {
                                            lk.recompute_layers = k;
                                            if (mmc_plan_estimate_layout(&m, &w, &dev, &net, &lk, &ek) || ek.mem_total > gmem) continue;
                                            if (!config_accepts(yaml, &lk, mm, &n_mm, why, sizeof why)) break;
                                            if (nr == cap) {
                                                cap *= 2;
                                                row *r2 = realloc(rows, (size_t)cap * sizeof *r2);
                                                if (!r2) { code = cli_fail(MMC_ERR_OOM, "out of memory"); goto out; }
                                                rows = r2;
                                            }
                                            rows[nr++] = (row){.l = lk, .e = ek, .fits = true};
                                            break;
                                        }
                                    }
            }
        }
    }
    if (calib) mmc_plan_calib_save(calib);   /* best effort: a read-only cache only costs re-measuring */
    if (!nr) {
        code = cli_fail(MMC_OK, "plan: no layout of %s on %lld ranks is accepted (%lld tried); the first reason: %s", yaml,
                        gpus, (long long)tried, *first_why ? first_why : n_mm ? mm[0].why : "?");
        goto out;
    }
    qsort(rows, (size_t)nr, sizeof *rows, cmp_rows);
    if (json) {
        for (int i = 0; i < nr; i++) print_json(&rows[i], i + 1, &dev, (int)gpus);
        code = CLI_OK;
        goto out;
    }
    int nfit = 0;
    for (int i = 0; i < nr; i++) nfit += rows[i].fits;
    const double toks = (double)w.batch * (double)w.seq;
    printf("mmc plan: %s on %lld x %s (%.0f GiB each, %s): %lld parameters, batch %lld x %lld tokens%s\n", yaml, gpus,
           dev.name, gmem_gib, cpu && !inter ? (gpus > 1 ? "measured interconnect" : "one rank") : net.name, (long long)mmc_plan_total_params(&m),
           (long long)w.batch, (long long)w.seq, m.vision ? (w.vision_patches ? (w.audio_frames ? " + images + audio" : " + images") : w.audio_frames ? " + audio" : "") : "");
    printf("%d layouts accepted, %d fit in memory (of %lld enumerated)\n\n", nr, nfit, (long long)tried);
    printf("  #  %-46s %10s %12s %6s %9s %7s %6s\n", "layout", "step s", "tok/s/rank", "MFU", "mem GiB", "bubble", "comm");
    for (int i = 0; i < nr && i < top; i++) {
        const row *r = &rows[i];
        char s[128];
        mmc_plan_layout_str(&r->l, s, sizeof s);
        double mfu = cpu ? NAN : r->e.flops_per_step / (r->e.step_s * (double)gpus * dev.gemm_flops / 0.6);
        char mf[16] = "     -";
        if (!cpu) snprintf(mf, sizeof mf, "%6.3f", mfu);
        printf("%3d  %-46s %10.4g %12.4g %s %9.2f %6.1f%% %5.1f%%%s\n", i + 1, s, r->e.step_s,
               toks / r->e.step_s / (double)gpus, mf, r->e.mem_total / GiB, 100 * r->e.bubble,
               100 * r->e.comm_s / r->e.step_s, r->fits ? "" : "  (does not fit)");
    }
    printf("(layout: dp/tp/pp/cp sizes, +sp sequence parallel, ppPxV interleaved, cp u Ulysses / r ring, zZeRO stage, "
           "mb micro-batch, rc recompute, vision-dpN the vision tower data-parallel over all N ranks (+audio: the audio encoder too), vision-stage the tower on pipeline stage 0 alone; MFU against the "
           "bf16 peak)\n\n");
    if (!nfit) {
        const row *small = &rows[0];
        for (int i = 1; i < nr; i++)
            if (rows[i].e.mem_total < small->e.mem_total) small = &rows[i];
        char s[128];
        mmc_plan_layout_str(&small->l, s, sizeof s);
        fprintf(stderr, "mmc plan: nothing fits in %.1f GiB per rank: the smallest layout (%s) needs %.1f GiB; use more "
                "ranks, a larger --gpu-mem, or LoRA (model.lora)\n", gmem_gib, s, small->e.mem_total / GiB);
        code = CLI_ERROR;
        goto out;
    }
    printf("why:\n");
    for (int i = 0; i < nfit && i < 3; i++) explain(&rows[i], i, gmem, &rows[0], &m, &w, &dev);
    {   /* the fastest layout that does not fit, if faster than the choice */
        const row *fast = NULL;
        for (int i = nfit; i < nr; i++)
            if (!fast || rows[i].e.step_s < fast->e.step_s) fast = &rows[i];
        if (fast && fast->e.step_s < rows[0].e.step_s) {
            char s[128];
            mmc_plan_layout_str(&fast->l, s, sizeof s);
            printf("   faster but too large: %s would take %.3f s (%.0f%% less) but needs %.1f GiB per rank\n", s,
                   fast->e.step_s, 100 * (1 - fast->e.step_s / rows[0].e.step_s), fast->e.mem_total / GiB);
        }
    }
    if (write) {
        char *src = NULL;
        size_t len = 0;
        if ((st = mmc_read_file(yaml, &src, &len))) { code = cli_fail(st, "plan --write: reading %s", yaml); goto out; }
        char note[256], s[128];
        mmc_plan_layout_str(&rows[0].l, s, sizeof s);
        snprintf(note, sizeof note, "mmc plan --gpus %lld --device %s: %s, modelled %.4g s per step, %.1f GiB per rank", gpus,
                 dev.name, s, rows[0].e.step_s, rows[0].e.mem_total / GiB);
        char counts[512], ms[1024];
        const bool sp = split_str(&m, &w, &dev, &rows[0].l, counts, sizeof counts, ms, sizeof ms);
        text = rewrite_yaml(src, &rows[0].l, note, sp ? counts : NULL);
        free(src);
        if (!text) { code = cli_fail(MMC_ERR_OOM, "out of memory"); goto out; }
        if ((st = mmc_write_file_atomic(write, text, strlen(text)))) { code = cli_fail(st, "plan --write %s", write); goto out; }
        mmc_run_config chk;   /* the written file must load, with the chosen values */
        if ((st = mmc_run_config_load(write, NULL, 0, &chk))) { code = cli_fail(st, "plan --write: %s does not load back", write); goto out; }
        char fix[256] = "";
        size_t fl = 0;
        if (chk.data.micro_batch_size != rows[0].l.micro_batch)
            fl += (size_t)snprintf(fix + fl, sizeof fix - fl, " --set data.micro_batch_size=%lld", (long long)rows[0].l.micro_batch);
        if ((int)chk.model.recompute != rows[0].l.recompute)
            fl += (size_t)snprintf(fix + fl, sizeof fix - fl, " --set model.recompute=%s", recompute_name(rows[0].l.recompute));
        if (chk.model.recompute_layers != (rows[0].l.recompute ? rows[0].l.recompute_layers : 0))
            snprintf(fix + fl, sizeof fix - fl, " --set model.recompute_layers=%lld",
                     (long long)(rows[0].l.recompute ? rows[0].l.recompute_layers : 0));
        mmc_run_config_free(&chk);
        printf("\nwrote %s (parallel: %s)%s%s\n", write, s, *fix ? "; also pass" : "", fix);
        printf("run it: mmc launch -n %lld %s%s\n", gpus, write, fix);
    }
    code = CLI_OK;
out:
    free(text);
    free(rows);
    free(mm);
    mmc_json_free(cj);
    mmc_plan_calib_free(calib);
    mmc_run_config_free(&rc);
    return code;
}
