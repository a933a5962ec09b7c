/* cmd_info.c — `mmc info DIR`: what a Hugging Face model directory holds: model type and
 * architecture, parameter counts by component, weight dtypes, context length, and whether
 * mmc can run it. Reads config.json and the safetensors headers only (no weights loaded).
 * `mmc info --system`: the machine as mmc's kernels see it (CPU, the ISA extensions they
 * dispatch on, caches, the GEMM micro-kernel and cache blocking chosen per dtype, threads),
 * the same description bench/run.sh puts at the top of results.json. */
#include "backend/cpu/cpuinfo.h"
#include "backend/cpu/gemm.h"
#include "cli.h"
#include "mmc_diffusion.h"
#include "mmc_infer.h"
#include "mmc_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void help_info(FILE *f) {
    fprintf(f, "usage: mmc info DIR [--json]\n"
               "       mmc info --system [--json]\n\n"
               "Describe the Hugging Face model directory DIR (config.json + safetensors):\n"
               "architecture, parameter counts by component, dtypes, context length and the\n"
               "generation settings (generation_config.json). A diffusers pipeline folder\n"
               "(model_index.json) lists its components, their classes, parameters and dtypes,\n"
               "and which of them mmc implements.\n\n"
               "With --system, describe this machine instead: CPU vendor, model and family, the ISA\n"
               "extensions mmc's kernels use (avx2, fma, avx512f, avx512_bf16, amx), the caches, the\n"
               "GEMM micro-kernel and cache blocking chosen for f32 and bf16 weights (blocking\n"
               "derived from the caches; MMC_GEMM_BLOCKING=mc,kc,nc overrides, MMC_GEMM_BF16=dot\n"
               "picks a bf16-product kernel for inference with bf16 weights: AMX tiles where the\n"
               "CPU has them, else AVX512_BF16; =amx or =avx512_bf16 names one), how threads share a\n"
               "GEMM (MMC_GEMM_SPLIT=slices|shared; results are the same) and the thread count.\n\n"
               "options:\n"
               "  --system   describe this machine, not a model directory\n"
               "  --json     print one JSON object instead of a table\n"
               "  -h, --help this help\n");
}

typedef struct { const char *label; const char *match[4]; int64_t params; } component;

static void json_str(const char *s) { /* the CPUID brand string: printable ASCII */
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        putchar((unsigned char)*s >= 32 ? *s : ' ');
    }
    putchar('"');
}

static void print_size(int64_t b) {
    if (b >= (1 << 20) && b % (1 << 20) == 0) printf("%lld MiB", (long long)(b >> 20));
    else printf("%lld KiB", (long long)(b >> 10));
}

static int info_system(bool json) {
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    mmc_gemm_info g;
    mmc_gemm_describe(&g);
    const struct { const char *name; bool on; } isa[] = {
        {"avx2", ci->avx2}, {"fma", ci->fma}, {"avx512f", ci->avx512f}, {"avx512bw", ci->avx512bw},
        {"avx512vl", ci->avx512vl}, {"avx512dq", ci->avx512dq}, {"avx512_bf16", ci->avx512_bf16},
        {"amx_tile", ci->amx_tile}, {"amx_bf16", ci->amx_bf16},
    };
    const int nisa = (int)(sizeof isa / sizeof isa[0]);
    const struct { const char *name; const mmc_cache_level *l; } caches[] = {
        {"L1d", &ci->cache.l1d}, {"L2", &ci->cache.l2}, {"L3", &ci->cache.l3}};
    const char *bf16_exact = "weights widened to f32 while packing, f32 FMA";
    const char *bf16_arith = !g.bf16_dot ? bf16_exact
                             : !strcmp(g.bf16_infer.kernel, "amx_bf16")
                                 ? "AMX tdpbf16ps: activations rounded to bf16, f32 accumulate"
                                 : "vdpbf16ps: activations rounded to bf16, f32 accumulate";
    if (json) {
        printf("{\"cpu\": {\"vendor\": ");
        json_str(ci->vendor);
        printf(", \"brand\": ");
        json_str(ci->brand);
        printf(", \"family\": %d, \"model\": %d, \"stepping\": %d}, \"isa\": {", ci->family, ci->model,
               ci->stepping);
        for (int i = 0; i < nisa; i++) printf("%s\"%s\": %s", i ? ", " : "", isa[i].name, isa[i].on ? "true" : "false");
        printf("}, \"caches\": {");
        for (int i = 0; i < 3; i++) {
            const mmc_cache_level *l = caches[i].l;
            printf("%s\"%s\": ", i ? ", " : "", caches[i].name);
            if (l->size <= 0) { printf("null"); continue; }
            printf("{\"size\": %lld, \"ways\": %d, \"line\": %d, \"shared_cpus\": %d}", (long long)l->size,
                   l->ways, l->line, l->shared_cpus);
        }
        printf(", \"source\": \"%s\"}, \"threads\": %d, \"omp_wait_policy\": \"%s\", \"gemm\": {", ci->cache_source,
               mmc_get_num_threads(), getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "default");
        const mmc_gemm_path *p[3] = {&g.f32, &g.bf16, &g.bf16_infer};
        const char *names[3] = {"f32", "bf16", "bf16_infer"};
        const char *arith[3] = {"f32 FMA", bf16_exact, bf16_arith};
        for (int i = 0; i < 3; i++)
            printf("\"%s\": {\"kernel\": \"%s\", \"tile\": [%d, %d], \"mc\": %lld, \"kc\": %lld, \"nc\": %lld, "
                   "\"arithmetic\": \"%s\"}, ",
                   names[i], p[i]->kernel, p[i]->mr, p[i]->nr, (long long)p[i]->mc, (long long)p[i]->kc,
                   (long long)p[i]->nc, arith[i]);
        printf("\"matmul_precision\": \"%s\", \"f32_matmul\": {\"kernel\": \"%s\", \"tile\": [%d, %d], \"mc\": %lld, "
               "\"kc\": %lld, \"nc\": %lld}, ", g.matmul_precision, g.f32_matmul.kernel, g.f32_matmul.mr, g.f32_matmul.nr,
               (long long)g.f32_matmul.mc, (long long)g.f32_matmul.kc, (long long)g.f32_matmul.nc);
        printf("\"bf16_dot_available\": %s, \"amx_available\": %s, \"f32_b_prefetch\": %d, \"small_m\": %d, \"small_m_kernel\": \"%s\", \"blocking_source\": \"%s\", "
               "\"split\": \"%s\"}}\n",
               g.bf16_dot_available ? "true" : "false", g.amx_available ? "true" : "false", g.f32_b_prefetch, g.small_m, g.small_m_kernel, g.blocking_source, g.split);
        return 0;
    }
    printf("cpu:        %s %s (family %d, model %d, stepping %d)\n", ci->vendor[0] ? ci->vendor : "?",
           ci->brand[0] ? ci->brand : "", ci->family, ci->model, ci->stepping);
    printf("isa:       ");
    for (int i = 0; i < nisa; i++)
        if (isa[i].on) printf(" %s", isa[i].name);
    printf("   (absent:");
    int absent = 0;
    for (int i = 0; i < nisa; i++)
        if (!isa[i].on) { printf(" %s", isa[i].name); absent++; }
    printf("%s)\n", absent ? "" : " none");
    printf("caches:    ");
    for (int i = 0; i < 3; i++) {
        const mmc_cache_level *l = caches[i].l;
        if (l->size <= 0) continue;
        printf(" %s ", caches[i].name);
        print_size(l->size);
        printf(" %d-way", l->ways);
        if (l->shared_cpus > 1) printf(" shared by %d CPUs", l->shared_cpus);
        if (i < 2) putchar(';');
    }
    printf("  (from %s)\n", ci->cache_source);
    printf("threads:    %d (OpenMP; OMP_NUM_THREADS sets it), wait policy %s\n", mmc_get_num_threads(),
           getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "library default");
    printf("gemm f32:   %s micro-kernel %dx%d, blocking MC=%lld KC=%lld NC=%lld (%s); M <= %d: %s matvec\n",
           g.f32.kernel, g.f32.mr, g.f32.nr, (long long)g.f32.mc, (long long)g.f32.kc, (long long)g.f32.nc,
           strcmp(g.blocking_source, "model") ? g.blocking_source : "from the caches", g.small_m, g.small_m_kernel);
    if (g.f32_b_prefetch)
        printf("            B micro-panel prefetched %d k steps ahead into L1 (Intel; MMC_GEMM_UKR=plain turns it off)\n",
               g.f32_b_prefetch);
    if (strcmp(g.matmul_precision, "highest"))
        printf("matmul:     precision %s: f32 GEMMs on the %s micro-kernel %dx%d, blocking MC=%lld KC=%lld NC=%lld (%s)\n",
               g.matmul_precision, g.f32_matmul.kernel, g.f32_matmul.mr, g.f32_matmul.nr, (long long)g.f32_matmul.mc,
               (long long)g.f32_matmul.kc, (long long)g.f32_matmul.nc,
               !strcmp(g.f32_matmul.kernel, "amx_bf16x3") ? "bf16x3: operands split into bf16 hi + lo, 3 AMX products"
               : !strcmp(g.f32_matmul.kernel, "amx_bf16x1") ? "operands rounded to bf16, 1 AMX product"
                                                             : "no AMX here: f32");
    else
        printf("matmul:     precision highest (f32)%s\n", g.amx_available ? "; MMC_MATMUL_PRECISION=high (or the "
               "matmul-precision option of generate / chat / forward / serve) runs f32 GEMMs as bf16x3 on AMX, "
               "~2x faster, ~1e-6 of sum |a||b|" : "");
    printf("gemm split: %s (threads: independent slices when a GEMM spans several B blocks, else B packed "
           "together; MMC_GEMM_SPLIT=slices|shared forces one)\n", g.split);
    printf("gemm bf16:  %s micro-kernel %dx%d, blocking MC=%lld KC=%lld NC=%lld (%s)\n", g.bf16.kernel, g.bf16.mr,
           g.bf16.nr, (long long)g.bf16.mc, (long long)g.bf16.kc, (long long)g.bf16.nc, bf16_exact);
    if (g.bf16_dot)
        printf("            inference (no grad): %s micro-kernel %dx%d, blocking MC=%lld KC=%lld NC=%lld (%s; "
               "MMC_GEMM_BF16=dot)\n", g.bf16_infer.kernel, g.bf16_infer.mr, g.bf16_infer.nr,
               (long long)g.bf16_infer.mc, (long long)g.bf16_infer.kc, (long long)g.bf16_infer.nc, bf16_arith);
    else if (g.amx_available)
        printf("            inference: MMC_GEMM_BF16=dot picks the amx_bf16 kernel (AMX tiles, 32x32; several times "
               "faster, rounds activations to bf16)\n");
    else if (g.bf16_dot_available)
        printf("            inference: MMC_GEMM_BF16=dot picks the avx512_bf16 kernel (rounds activations to bf16)\n");
    return 0;
}

/* The model family and, for a VLM, its tower, projector and language model in words. */
static void describe_family(const mmc_json *cfg, const char *mt, char *family, size_t nf, char *tower, size_t nt,
                            char *proj, size_t np, char *lm, size_t nl) {
    snprintf(family, nf, "%s", !strcmp(mt, "qwen2") ? "Qwen2" : !strcmp(mt, "llama") ? "Llama"
                               : !strcmp(mt, "internlm2") ? "InternLM2 (packed wqkv, read as Llama's layers)"
                               : !strcmp(mt, "qwen2_moe") ? "Qwen2-MoE (mixture of experts)"
                               : !strcmp(mt, "qwen2_vl") ? "Qwen2-VL" : !strcmp(mt, "qwen2_5_vl") ? "Qwen2.5-VL"
                               : !strcmp(mt, "llava") ? "LLaVA-1.5" : !strcmp(mt, "llava_next") ? "LLaVA-NeXT"
                               : !strcmp(mt, "llava_onevision") ? "LLaVA-OneVision" : !strcmp(mt, "internvl") ? "InternVL"
                               : !strcmp(mt, "internvl_chat") ? "InternVL (OpenGVLab InternVLChatModel layout)"
                               : !strcmp(mt, "whisper") ? "Whisper (speech to text: mmc transcribe)"
                               : !strcmp(mt, "qwen2_5_omni_thinker") ? "Qwen2.5-Omni thinker (text, audio, images -> text)"
                               : !strcmp(mt, "qwen2_5_omni") ? "Qwen2.5-Omni (the thinker: text, audio, images -> text)"
                               : !strcmp(mt, "clip") ? "CLIP (dual encoder: mmc embed)"
                               : !strcmp(mt, "siglip") ? "SigLIP (dual encoder: mmc embed)"
                               : "unknown");
    if (!strcmp(mt, "qwen2_vl") || !strcmp(mt, "qwen2_5_vl")) {
        int64_t depth = 0;
        mmc_json_int(cfg, "vision_config.depth", 32, &depth);
        snprintf(tower, nt, "%s vision transformer, %lld blocks", family, (long long)depth);
        snprintf(proj, np, "patch merger (spatial_merge_size^2 tokens -> one)");
        snprintf(lm, nl, "Qwen2");
    } else if (!strcmp(mt, "siglip")) {
        int64_t L = 12, C = 768, S = 224, p = 16, TL = 12;
        mmc_json_int(cfg, "vision_config.num_hidden_layers", L, &L);
        mmc_json_int(cfg, "vision_config.hidden_size", C, &C);
        mmc_json_int(cfg, "vision_config.image_size", S, &S);
        mmc_json_int(cfg, "vision_config.patch_size", p, &p);
        mmc_json_int(cfg, "text_config.num_hidden_layers", TL, &TL);
        snprintf(tower, nt, "SigLIP ViT: %lld layers, hidden %lld, %lldx%lld px in %lldx%lld patches, attention-pooling "
                 "head", (long long)L, (long long)C, (long long)S, (long long)S, (long long)p, (long long)p);
        snprintf(proj, np, "text head; sigmoid scores exp(logit_scale) * cos + logit_bias");
        snprintf(lm, nl, "SigLIP text transformer, %lld layers (an encoder: no generation)", (long long)TL);
    } else if (!strcmp(mt, "clip")) {
        int64_t L = 12, C = 768, S = 224, p = 32, D = 512, TL = 12;
        mmc_json_int(cfg, "vision_config.num_hidden_layers", L, &L);
        mmc_json_int(cfg, "vision_config.hidden_size", C, &C);
        mmc_json_int(cfg, "vision_config.image_size", S, &S);
        mmc_json_int(cfg, "vision_config.patch_size", p, &p);
        mmc_json_int(cfg, "projection_dim", D, &D);
        mmc_json_int(cfg, "text_config.num_hidden_layers", TL, &TL);
        snprintf(tower, nt, "CLIP ViT: %lld layers, hidden %lld, %lldx%lld px in %lldx%lld patches", (long long)L,
                 (long long)C, (long long)S, (long long)S, (long long)p, (long long)p);
        snprintf(proj, np, "visual_projection / text_projection into %lld dims, learned temperature", (long long)D);
        snprintf(lm, nl, "CLIP text transformer, %lld layers (an encoder: no generation)", (long long)TL);
    } else if (!strcmp(mt, "llava") || !strcmp(mt, "llava_next") || !strcmp(mt, "llava_onevision")) {
        const bool ov = !strcmp(mt, "llava_onevision");
        int64_t L = 12, C = 768, S = 224, p = 32, fl = ov ? -1 : -2;
        const char *vt = ov ? "siglip_vision_model" : "clip_vision_model", *act = "gelu", *strat = ov ? "full" : "default",
                   *tt = ov ? "qwen2" : "llama";
        mmc_json_str(cfg, "vision_config.model_type", vt, &vt);
        mmc_json_int(cfg, "vision_config.num_hidden_layers", L, &L);
        mmc_json_int(cfg, "vision_config.hidden_size", C, &C);
        mmc_json_int(cfg, "vision_config.image_size", S, &S);
        mmc_json_int(cfg, "vision_config.patch_size", p, &p);
        mmc_json_str(cfg, "projector_hidden_act", act, &act);
        mmc_json_str(cfg, "vision_feature_select_strategy", strat, &strat);
        mmc_json_str(cfg, "text_config.model_type", tt, &tt);
        char layer[32] = "a list";
        if (mmc_json_int(cfg, "vision_feature_layer", fl, &fl) == MMC_OK) snprintf(layer, sizeof layer, "%lld", (long long)fl);
        snprintf(tower, nt, "%s (%s): %lld layers, hidden %lld, %lldx%lld px in %lldx%lld patches; features of "
                 "layer %s, strategy %s", !strcmp(vt, "siglip_vision_model") ? "SigLIP ViT" : "CLIP ViT", vt, (long long)L, (long long)C, (long long)S, (long long)S, (long long)p,
                 (long long)p, layer, strat);
        const char *ar = "anyres_max_9";
        mmc_json_str(cfg, "vision_aspect_ratio", ar, &ar);
        snprintf(proj, np, "multi_modal_projector: linear_1 -> %s -> linear_2%s%s%s", act,
                 strcmp(mt, "llava") ? "; anyres tiles (image_grid_pinpoints), un-padding, image_newline" : "",
                 ov ? "; vision_aspect_ratio " : "", ov ? ar : "");
        snprintf(lm, nl, "%s", !strcmp(tt, "llama") ? "Llama" : !strcmp(tt, "mistral") ? "Mistral (sliding window not applied)"
                               : !strcmp(tt, "qwen2") ? "Qwen2" : tt);
    } else if (!strcmp(mt, "internvl") || !strcmp(mt, "internvl_chat")) {
        int64_t L = 24, C = 1024, S = 448, p = 14, fl = -1;
        double r = 0.5;
        const char *norm = "layer_norm", *act = "gelu", *tt = "qwen2", *ps = "";
        bool qk = false, remote = !strcmp(mt, "internvl_chat");
        mmc_json_int(cfg, "vision_config.num_hidden_layers", L, &L);
        mmc_json_int(cfg, "vision_config.hidden_size", C, &C);
        if (mmc_json_int(cfg, "vision_config.image_size", S, &S) != MMC_OK) mmc_json_int(cfg, "vision_config.image_size.0", S, &S);
        if (mmc_json_int(cfg, "vision_config.patch_size", p, &p) != MMC_OK) mmc_json_int(cfg, "vision_config.patch_size.0", p, &p);
        mmc_json_str(cfg, "vision_config.norm_type", norm, &norm);
        mmc_json_bool(cfg, remote ? "vision_config.qk_normalization" : "vision_config.use_qk_norm", qk, &qk);
        mmc_json_int(cfg, remote ? "select_layer" : "vision_feature_layer", fl, &fl);
        mmc_json_num(cfg, "downsample_ratio", r, &r);
        mmc_json_str(cfg, "projector_hidden_act", act, &act);
        mmc_json_str(cfg, remote ? "llm_config.model_type" : "text_config.model_type", tt, &tt);
        if (remote) mmc_json_str(cfg, "ps_version", "v1", &ps);
        snprintf(tower, nt, "InternViT: %lld layers, hidden %lld, %s%s, %lldx%lld px tiles in %lldx%lld patches; "
                 "features of layer %lld", (long long)L, (long long)C, norm, qk ? ", qk-norm" : "", (long long)S,
                 (long long)S, (long long)p, (long long)p, (long long)fl);
        if (remote) snprintf(proj, np, "pixel shuffle x%g (ps_version %s) -> mlp1: LayerNorm -> Linear -> GELU -> Linear", r, ps);
        else snprintf(proj, np, "pixel shuffle x%g -> multi_modal_projector: layer_norm -> linear_1 -> %s -> linear_2", r, act);
        snprintf(lm, nl, "%s", !strcmp(tt, "qwen2") ? "Qwen2"
                               : !strcmp(tt, "internlm2") ? "InternLM2 (packed wqkv, read as Llama's layers)" : tt);
    }
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    bool json = false, system = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (strcmp(argv[i], "--system") == 0) system = true;
        else if (argv[i][0] == '-') return cli_usage("info", "unknown option '%s'", argv[i]);
        else if (!dir) dir = argv[i];
        else return cli_usage("info", "more than one directory given ('%s' and '%s')", dir, argv[i]);
    }
    if (system && dir) return cli_usage("info", "--system describes this machine: give no directory ('%s')", dir);
    if (system) return info_system(json);
    if (!dir) return cli_usage("info", "no model directory given (usage: mmc info DIR, or mmc info --system)");
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", dir);   /* a diffusers pipeline folder */
    if (access(path, F_OK) == 0) {
        if (json) return cli_usage("info", "--json is not available for diffusers pipeline folders yet");
        mmc_diffusers_dir d;
        mmc_status dst = mmc_diffusers_open(dir, &d);
        if (dst) return cli_fail(dst, "info: cannot read the diffusers pipeline");
        mmc_diffusers_print(&d, stdout);
        return 0;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return cli_fail(st, "info: cannot read the model config");
    mmc_st *w = NULL;
    st = mmc_st_open(dir, &w);
    if (st) { mmc_json_free(cfg); return cli_fail(st, "info: cannot open the weights"); }
    mmc_gen_config gen;
    if ((st = mmc_gen_config_read(dir, &gen))) {
        mmc_st_close(w);
        mmc_json_free(cfg);
        return cli_fail(st, "info: cannot read the generation config");
    }
    char eos[160] = "the tokenizer's";
    for (int k = 0, o = 0; k < gen.n_eos && o < (int)sizeof eos - 16; k++)
        o += snprintf(eos + o, sizeof eos - (size_t)o, k ? ", %d" : "%d", gen.eos_ids[k]);

    const char *model_type = "?", *arch = "?";
    mmc_json_str(cfg, "model_type", "?", &model_type);
    mmc_json_str(cfg, "architectures.0", "?", &arch);
    int64_t ctx_len = 0;
    if (mmc_json_int(cfg, "max_position_embeddings", 0, &ctx_len) == MMC_OK && ctx_len == 0)
        mmc_json_int(cfg, "text_config.max_position_embeddings", 0, &ctx_len);
    if (ctx_len == 0) mmc_json_int(cfg, "llm_config.max_position_embeddings", 0, &ctx_len);   /* internvl_chat */
    component comps[] = {
        {"vision tower", {"visual.blocks", "visual.patch_embed", "vision_tower", "vision_model"}, 0},
        {"merger/projector", {"visual.merger", "multi_modal_projector", "mm_projector", "mlp1"}, 0},
        {"embeddings", {"embed_tokens", "tok_embeddings", NULL}, 0},   /* (InternLM2's) */
        {"language model", {"layers.", "norm.weight", NULL}, 0},
        {"lm head", {"lm_head", "language_model.output.", NULL}, 0},   /* (InternLM2's, in internvl_chat) */
        {"other", {NULL}, 0},
    };
    int ncomp = sizeof comps / sizeof comps[0];
    int64_t total = 0, by_dtype[MMC_DTYPE_COUNT] = {0};
    for (int i = 0; i < mmc_st_count(w); i++) {
        const mmc_st_entry *e = mmc_st_at(w, i);
        int64_t n = 1;
        for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
        total += n;
        by_dtype[e->dtype] += n;
        int c = ncomp - 1;
        for (int k = 0; k < ncomp - 1 && c == ncomp - 1; k++)
            for (int j = 0; j < 4 && comps[k].match[j]; j++)
                if (strstr(e->name, comps[k].match[j])) { c = k; break; }
        comps[c].params += n;
    }
    static const char *const supported[] = {"qwen2", "qwen2_moe", "llama", "internlm2", "qwen2_vl", "qwen2_5_vl", "llava", "llava_next",
                                            "llava_onevision", "internvl", "internvl_chat", "whisper",
                                            "qwen2_5_omni_thinker", "qwen2_5_omni", "clip", "siglip"};
    /* a full Qwen2.5-Omni checkpoint: mmc runs its thinker; the talker and token2wav (speech output) are not */
    const char *speech = !strcmp(model_type, "qwen2_5_omni")
                             ? "not supported: the talker and token2wav (speech output) are not run; the thinker "
                               "(text output) is" : NULL;
    char family[64], tower[256] = "", projector[160] = "", lmdesc[160] = "";
    describe_family(cfg, model_type, family, sizeof family, tower, sizeof tower, projector, sizeof projector, lmdesc,
                    sizeof lmdesc);
    bool ok = false;
    for (size_t k = 0; k < sizeof supported / sizeof supported[0]; k++) ok |= !strcmp(model_type, supported[k]);
    if (json) {
        printf("{\"model_type\": \"%s\", \"supported\": %s, \"architecture\": \"%s\", \"parameters\": %lld, "
               "\"context_length\": %lld, \"tensors\": %d, ",
               model_type, ok ? "true" : "false", arch, (long long)total, (long long)ctx_len, mmc_st_count(w));
        printf("\"family\": ");
        mmc_json_write_string(stdout, family);
        if (tower[0]) { printf(", \"vision_tower\": "); mmc_json_write_string(stdout, tower); }
        if (projector[0]) { printf(", \"projector\": "); mmc_json_write_string(stdout, projector); }
        if (lmdesc[0]) { printf(", \"language_model\": "); mmc_json_write_string(stdout, lmdesc); }
        if (speech) { printf(", \"speech_output\": "); mmc_json_write_string(stdout, speech); }
        printf(", ");
        printf("\"components\": {");
        int first = 1;
        for (int k = 0; k < ncomp; k++) {
            if (!comps[k].params) continue;
            printf("%s\"%s\": %lld", first ? "" : ", ", comps[k].label, (long long)comps[k].params);
            first = 0;
        }
        printf("}, \"dtypes\": {");
        first = 1;
        for (int d = 0; d < MMC_DTYPE_COUNT; d++) {
            if (!by_dtype[d]) continue;
            printf("%s\"%s\": %lld", first ? "" : ", ", mmc_dtype_name((mmc_dtype)d), (long long)by_dtype[d]);
            first = 0;
        }
        printf("}, \"generation\": {\"file\": %s, \"do_sample\": %s, \"temperature\": %g, \"top_k\": %lld, "
               "\"top_p\": %g, \"min_p\": %g, \"repetition_penalty\": %g, \"max_new_tokens\": %lld, "
               "\"max_length\": %lld, \"eos_token_id\": [%s]}}\n",
               gen.present ? "true" : "false", gen.do_sample ? "true" : "false", gen.temperature,
               (long long)gen.top_k, gen.top_p, gen.min_p, gen.repetition_penalty, (long long)gen.max_new_tokens,
               (long long)gen.max_length, gen.n_eos ? eos : "");
    } else {
        printf("model:          %s\n", dir);
        printf("model_type:     %s (%s)%s\n", model_type, arch,
               ok ? "" : " -- not supported by mmc (supported: qwen2, qwen2_moe, llama, qwen2_vl, qwen2_5_vl, llava, llava_next, "
               "llava_onevision, internvl, internvl_chat, whisper, qwen2_5_omni_thinker, qwen2_5_omni, clip, siglip)");
        printf("family:         %s\n", family);
        if (speech) printf("speech output:  %s\n", speech);
        if (tower[0]) printf("vision tower:   %s\n", tower);
        if (projector[0]) printf("projector:      %s\n", projector);
        if (lmdesc[0]) printf("language model: %s\n", lmdesc);
        printf("context length: %lld\n", (long long)ctx_len);
        printf("tensors:        %d\n", mmc_st_count(w));
        printf("parameters:     %lld (%.2f M)\n", (long long)total, total / 1e6);
        for (int k = 0; k < ncomp; k++)
            if (comps[k].params)
                printf("  %-16s %12lld (%5.1f %%)\n", comps[k].label, (long long)comps[k].params,
                       100.0 * comps[k].params / (double)(total ? total : 1));
        printf("dtypes:        ");
        for (int d = 0; d < MMC_DTYPE_COUNT; d++)
            if (by_dtype[d]) printf(" %s=%lld", mmc_dtype_name((mmc_dtype)d), (long long)by_dtype[d]);
        printf("\n");
        /* what generate / chat use unless the command line overrides (transformers' resolution) */
        printf("generation:     %s", gen.present ? "generation_config.json" : "no generation_config.json (transformers' defaults)");
        if (gen.do_sample)
            printf(", sampling: temperature %g, top_k %lld, top_p %g, min_p %g", gen.temperature, (long long)gen.top_k,
                   gen.top_p, gen.min_p);
        else
            printf(", greedy");
        if (gen.repetition_penalty != 1) printf(", repetition_penalty %g", gen.repetition_penalty);
        if (gen.max_new_tokens >= 0) printf(", max_new_tokens %lld", (long long)gen.max_new_tokens);
        else if (gen.length_set) printf(", max_length %lld", (long long)gen.max_length);
        printf(", eos %s\n", eos);
    }
    mmc_st_close(w);
    mmc_json_free(cfg);
    return 0;
}
