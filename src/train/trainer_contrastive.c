/* trainer_contrastive.c — `mmc train` over a CLIPModel / SiglipModel folder: contrastive fine-tuning
 * of both towers, the loop transformers users write around forward(return_loss=True):
 *
 *   for step: B (image, caption) pairs of the image-caption JSONL (mmc eval --task retrieval's
 *             format), in file order and wrapping; each image's first caption
 *     pixel_values = the folder's image processor; ids, mask = its tokenizer (CLIP: padding=True,
 *     SigLIP: padding="max_length")
 *     img, txt = the pooled projections (CLIP: visual/text_projection; SigLIP: the heads) [B, D], graph kept
 *     loss, d img, d txt, d logit_scale (, d logit_bias) = mmc_contrastive_loss (contrastive.c)
 *     backward from sum(img * d_img) + sum(txt * d_txt); logit_scale / logit_bias .grad += theirs
 *     optional clip_grad_norm_, AdamW (torch.optim.AdamW), the run's lr schedule
 *
 * Full fine-tuning (every weight trainable, f32) or LoRA (below). Checkpoints (training.save_every and the end) are
 * HF folders output_dir/checkpoint-N: model.safetensors with CLIPModel's names plus the source
 * folder's config and processor files, loadable by CLIPModel.from_pretrained and `mmc embed`, and
 * the optimizer's moments (optimizer.safetensors: exp_avg.<name>, exp_avg_sq.<name>) with
 * trainer_state.json (global_step, adamw_step): each written into a temporary folder renamed into
 * place, so a killed run leaves whole checkpoints only. --resume continues from the latest: the
 * weights and moments from it, the pairs from the step (their order is a function of the step),
 * so the resumed steps equal the uninterrupted run's.
 * Data parallelism (parallel.data_parallel R, under mpirun / mmc launch): each rank encodes its B / R pairs
 * of the step's batch, the embeddings are all-gathered (rank order = batch order) so every rank computes
 * the loss over the whole batch, all B - 1 negatives per pair, as open_clip's gather_with_grad; each rank
 * backpropagates only its rows' gradients, the weight gradients are summed over the ranks, and the
 * logit scale (bias) gradient, the same on every rank, is added once. The result is the single-process
 * step on the same B pairs. Rank 0 logs and saves.
 * LoRA (model.lora): PEFT's LoraModel over the towers' linears (mmc_dual_encoder_linears: PEFT's module names of
 * CLIPModel / SiglipModel), everything else frozen as PEFT freezes it (logit_scale and logit_bias too); a
 * checkpoint is then a PEFT adapter folder (adapter_config.json + adapter_model.safetensors, task_type null)
 * with the same optimizer.safetensors / trainer_state.json, and --resume reattaches it to model.path's
 * weights; `mmc merge` folds it into a CLIPModel / SiglipModel folder.
 * Parity: tests/test_contrastive_train.sh vs tools/ref/gen_contrastive_train.py; LoRA:
 * tests/test_contrastive_lora.c vs tools/ref/gen_contrastive_lora.py (transformers + PEFT). */
#include "trainer_internal.h"

#include "mmc_embed.h"
#include "mmc_lora.h"
#include "mmc_io.h"
#include "mmc_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

bool mmc_trainer_is_contrastive_dir(const char *dir) {
    if (!dir) return false;
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    if (mmc_json_load(path, &j)) { mmc_clear_error(); return false; }
    const char *mt = NULL;
    bool yes = !mmc_json_str(j, "model_type", "", &mt) && (!strcmp(mt, "clip") || !strcmp(mt, "siglip"));
    mmc_json_free(j);
    return yes;
}

typedef mmc_contrastive_pairs pairs;

void mmc_contrastive_pairs_free(mmc_contrastive_pairs *p) {
    for (int i = 0; i < p->n; i++) free(p->image[i]), free(p->caption[i]);
    free(p->image), free(p->caption);
    memset(p, 0, sizeof *p);
}
#define pairs_free mmc_contrastive_pairs_free

/* the retrieval JSONL: {"image": PATH, "caption": TEXT} or {"image": PATH, "captions": [TEXT, ...]} */
mmc_status mmc_contrastive_pairs_parse(const char *text, size_t len, const char *what, const char *dir,
                                       mmc_contrastive_pairs *p) {
    memset(p, 0, sizeof *p);
    int lineno = 0, capn = 0;
    mmc_status st = MMC_OK;
    for (size_t at = 0; at < len && !st;) {
        const char *line = text + at, *nl = memchr(line, '\n', len - at);
        const size_t ll = nl ? (size_t)(nl - line) : len - at;
        at += ll + 1;
        lineno++;
        size_t k = 0;
        while (k < ll && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == ll) continue;   /* blank lines */
        char where[1100];
        snprintf(where, sizeof where, "%s:%d", what, lineno);
        mmc_json *j = NULL;
        if ((st = mmc_json_parse(line, ll, where, &j))) break;
        const char *img = NULL, *cap1 = NULL;
        if (!mmc_json_is_object(j))
            st = mmc_error(MMC_ERR_FORMAT, "%s: each line must be an object {\"image\": PATH, \"caption\": TEXT}", where);
        if (!st && !(st = mmc_json_str(j, "image", NULL, &img)) && !img)
            st = mmc_error(MMC_ERR_FORMAT, "%s: no \"image\" key (each line: {\"image\": PATH, \"caption\": TEXT})", where);
        if (!st && !(st = mmc_json_str(j, "caption", NULL, &cap1)) && !cap1 &&
            !(st = mmc_json_str(j, "captions.0", NULL, &cap1)) && !cap1)
            st = mmc_error(MMC_ERR_FORMAT, "%s: no \"caption\" or non-empty \"captions\" list", where);
        if (!st && p->n == capn) {
            capn = capn ? 2 * capn : 16;
            char **x = realloc(p->image, sizeof(char *) * (size_t)capn);
            if (x) p->image = x;
            char **y = x ? realloc(p->caption, sizeof(char *) * (size_t)capn) : NULL;
            if (y) p->caption = y;
            if (!x || !y) st = mmc_error(MMC_ERR_OOM, "out of memory");
        }
        if (!st) {
            char full[2200];
            if (img[0] == '/' || !dir) snprintf(full, sizeof full, "%s", img);
            else snprintf(full, sizeof full, "%s/%s", dir, img);
            p->image[p->n] = strdup(full), p->caption[p->n] = strdup(cap1);
            if (!p->image[p->n] || !p->caption[p->n]) {
                free(p->image[p->n]), free(p->caption[p->n]);
                st = mmc_error(MMC_ERR_OOM, "out of memory");
            } else {
                p->n++;
            }
        }
        mmc_json_free(j);
    }
    if (!st && p->n == 0) st = mmc_error(MMC_ERR_FORMAT, "%s: no image-caption pairs", what);
    if (st) pairs_free(p);
    return st;
}

static mmc_status pairs_read(const char *path, const char *root, pairs *p) {
    memset(p, 0, sizeof *p);
    char *text = NULL;
    size_t len = 0;
    if (mmc_read_file(path, &text, &len))
        return mmc_error(MMC_ERR_NOT_FOUND, "%s: cannot open data.train (an image-caption JSONL)", path);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", root ? root : path);
    if (!root) { char *s = strrchr(dir, '/'); if (s) *s = 0; else strcpy(dir, "."); }
    mmc_status st = mmc_contrastive_pairs_parse(text, len, path, dir, p);
    free(text);
    return st;
}

/* output_dir/checkpoint-<step>: model.safetensors (CLIPModel's names) + the source's config/processor
 * files + the optimizer state (with LoRA: the PEFT adapter instead of the weights and files), written in
 * output_dir/.tmp-checkpoint-<step>-<pid> and renamed into place */
static mmc_status save_hf(const char *src_dir, const char *out_dir, int64_t step, mmc_tensor **params,
                          const char **names, int n, const mmc_adamw *opt, const mmc_lora_set *lora) {
    char dir[2048], final[2048], p[2300], s[2300];
    snprintf(final, sizeof final, "%s/checkpoint-%lld", out_dir, (long long)step);
    snprintf(dir, sizeof dir, "%s/.tmp-checkpoint-%lld-%d", out_dir, (long long)step, (int)getpid());
    mmc_rm_rf(dir);
    mmc_status st = mmc_mkdir_p(dir);
    if (st) return st;
    mmc_stw *w = mmc_stw_new();
    if (!w) return mmc_error(MMC_ERR_OOM, "out of memory");
    st = mmc_stw_set_metadata(w, "format", "pt");
    for (int i = 0; i < n && !st && !lora; i++) st = mmc_stw_add(w, names[i], params[i]);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    /* LoRA: the PEFT adapter only, task_type null (PeftModel: CLIPModel / SiglipModel have no PEFT task class) */
    if (!st) st = lora ? mmc_lora_save_task(lora, dir, src_dir, NULL) : mmc_stw_write(w, p);
    mmc_stw_free(w);
    if (!st && !(w = mmc_stw_new())) st = mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < n && !st; i++) {   /* the moments, under the parameters' names */
        char nm[300];
        snprintf(nm, sizeof nm, "exp_avg.%s", names[i]);
        st = mmc_stw_add_raw(w, nm, MMC_F32, params[i]->ndim, params[i]->shape, opt->m[i]);
        snprintf(nm, sizeof nm, "exp_avg_sq.%s", names[i]);
        if (!st) st = mmc_stw_add_raw(w, nm, MMC_F32, params[i]->ndim, params[i]->shape, opt->v[i]);
    }
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (!st) st = mmc_stw_write(w, p);
    mmc_stw_free(w);
    if (!st) {
        char js[256];
        const int len = snprintf(js, sizeof js, "{\"global_step\": %lld, \"adamw_step\": %lld}\n", (long long)step,
                                 (long long)opt->step);
        snprintf(p, sizeof p, "%s/trainer_state.json", dir);
        st = mmc_write_file_atomic(p, js, (size_t)len);
    }
    static const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "vocab.json", "merges.txt", "spiece.model", "processor_config.json", "preprocessor_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files && !st && !lora; i++) {
        snprintf(s, sizeof s, "%s/%s", src_dir, files[i]);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (access(s, R_OK) == 0) st = mmc_copy_file(s, p);   /* the optional files the folder has */
    }
    if (!st) {   /* into place: an older folder of the same step (a re-run) is moved aside first */
        char old[2100];
        snprintf(old, sizeof old, "%s/.old-checkpoint-%lld-%d", out_dir, (long long)step, (int)getpid());
        const bool had = access(final, F_OK) == 0;
        if (had && rename(final, old) != 0)
            st = mmc_error(MMC_ERR_IO, "%s: cannot move aside: %s", final, strerror(errno));
        else if (rename(dir, final) != 0) {
            st = mmc_error(MMC_ERR_IO, "%s: cannot rename into place: %s", final, strerror(errno));
            if (had) rename(old, final);
        } else if (had)
            mmc_rm_rf(old);
    }
    if (st) {
        mmc_rm_rf(dir);
        return mmc_error_prefix(st, "saving checkpoint-%lld in %s (earlier checkpoints are intact)", (long long)step,
                                out_dir);
    }
    return MMC_OK;
}

/* --resume: the latest whole checkpoint-N of output_dir: its trainer_state.json and moments (the weights
 * were loaded from it) */
static mmc_status restore_state(const char *ckpt, mmc_tensor **params, const char **names, int n, mmc_adamw *opt,
                                int64_t *step) {
    char p[2300];
    snprintf(p, sizeof p, "%s/trainer_state.json", ckpt);
    mmc_json *j = NULL;
    int64_t gs = 0, as = 0;
    mmc_status st = mmc_json_load(p, &j);
    if (!st && !(st = mmc_json_int(j, "global_step", -1, &gs)) && !(st = mmc_json_int(j, "adamw_step", -1, &as)) &&
        (gs < 0 || as < 0))
        st = mmc_error(MMC_ERR_FORMAT, "%s: global_step / adamw_step missing", p);
    mmc_json_free(j);
    if (st) return mmc_error_prefix(st, "--resume");
    snprintf(p, sizeof p, "%s/optimizer.safetensors", ckpt);
    mmc_st *o = NULL;
    if ((st = mmc_st_open(p, &o))) return mmc_error_prefix(st, "--resume");
    for (int i = 0; i < n && !st; i++) {
        char nm[300];
        mmc_tensor *mv = mmc_tensor_wrap(MMC_F32, params[i]->ndim, params[i]->shape, opt->m[i]);
        snprintf(nm, sizeof nm, "exp_avg.%s", names[i]);
        st = mmc_st_read_into(o, nm, mv);
        mv->data = opt->v[i];
        snprintf(nm, sizeof nm, "exp_avg_sq.%s", names[i]);
        if (!st) st = mmc_st_read_into(o, nm, mv);
        mmc_tensor_free(mv);
    }
    mmc_st_close(o);
    if (st) return mmc_error_prefix(st, "--resume: %s", p);
    opt->step = as;
    *step = gs;
    return MMC_OK;
}

/* model.lora on the towers' encoder linears (PEFT's names: text_model.encoder.layers.N.self_attn.q_proj,
 * vision_model.encoder.layers.N.mlp.fc1, ...): the adapter of `from` (a LoRA checkpoint, --resume), else
 * model.lora.init's, else fresh ones (A kaiming-uniform from training.seed, B zero); names[2i], names[2i+1]
 * the optimizer's names of A and B ("<module>.lora_A.weight"). */
static mmc_status setup_lora(const mmc_run_config *c, mmc_dual_encoder *m, const char *from, mmc_lora_set **out,
                             char ***names_out) {
    mmc_module_list ml = {0};
    mmc_status st = mmc_dual_encoder_linears(m, &ml);
    const char *dir = from ? from : c->model.lora.init;
    if (!st && dir) {
        st = mmc_lora_load(dir, &ml, true, out);
        if (!st && (*out)->r != (int)c->model.lora.r)
            st = mmc_error(MMC_ERR_INVALID, "%s has rank %d but model.lora.r is %lld", dir, (*out)->r,
                           (long long)c->model.lora.r);
    } else if (!st) {
        /* PEFT would wrap SigLIP's nn.MultiheadAttention.out_proj, whose weight the attention reads directly
         * (the adapter changes nothing there): refused rather than silently left out */
        for (int i = 0; i < c->model.lora.targets.n && !st; i++)
            if (mmc_dual_encoder_sigmoid(m) &&
                mmc_lora_target_match(c->model.lora.targets.items[i], "vision_model.head.attention.out_proj"))
                st = mmc_error(MMC_ERR_UNSUPPORTED, "target '%s' selects vision_model.head.attention.out_proj, inside "
                               "nn.MultiheadAttention, which LoRA does not adapt; name the encoder's modules instead "
                               "(e.g. self_attn.out_proj)", c->model.lora.targets.items[i]);
        mmc_lora_config lc = {.r = (int)c->model.lora.r, .alpha = (float)c->model.lora.alpha,
                              .dropout = (float)c->model.lora.dropout,
                              .targets = (const char *const *)c->model.lora.targets.items,
                              .n_targets = c->model.lora.targets.n, .seed = (uint64_t)c->training.seed};
        if (!st) st = mmc_lora_attach(&ml, &lc, out);
    }
    mmc_module_list_free(&ml);
    if (st) return mmc_error_prefix(st, "%s: model.lora", c->file);
    char **names = calloc((size_t)(*out)->n_params, sizeof *names);
    if (!names) return mmc_error(MMC_ERR_OOM, "out of memory");
    *names_out = names;
    for (int i = 0; i < (*out)->n_params; i++) {
        char buf[MMC_MODULE_NAME + 32];
        snprintf(buf, sizeof buf, "%s.lora_%c.weight", (*out)->names[i / 2], i % 2 ? 'B' : 'A');
        if (!(names[i] = strdup(buf))) return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    return MMC_OK;
}

mmc_status mmc_trainer_contrastive_run(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    const int64_t B = c->data.batch_size;
    if (c->parallel.tensor_parallel > 1 || c->parallel.pipeline_parallel > 1 || c->parallel.context_parallel > 1 ||
        c->parallel.zero > 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: contrastive training parallelises over data only (the towers are "
                         "small): set parallel.tensor_parallel, pipeline_parallel and context_parallel to 1 and zero "
                         "to 0", c->file);
    const int R = (int)(c->parallel.data_parallel > 1 ? c->parallel.data_parallel : 1);
    if (B % R)
        return mmc_error(MMC_ERR_INVALID, "%s: data.batch_size %lld does not split over data_parallel %d ranks", c->file,
                         (long long)B, R);
    if (t->world && mmc_comm_size(t->world) != R)   /* (the world was started by mmc_trainer_new) */
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.data_parallel is %d but %d process(es) run: start %d with "
                         "`mmc launch -n %d` (or mpirun -np %d)", c->file, R, mmc_comm_size(t->world), R, R, R);
    if (R > 1 && !t->world)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.data_parallel is %d but 1 process runs: start %d with "
                         "`mmc launch -n %d` (or mpirun -np %d)", c->file, R, R, R, R);
    const int rank = R > 1 ? t->rank : 0;
    const int64_t Bl = B / R;   /* this rank's pairs: rows [rank * Bl, (rank + 1) * Bl) of the batch */
    if (!c->data.train)
        return mmc_error(MMC_ERR_INVALID, "%s: data.train: an image-caption JSONL is needed", c->file);
    if (B < 2)
        return mmc_error(MMC_ERR_INVALID, "%s: data.batch_size %lld: a contrastive batch needs at least 2 pairs "
                         "(the other pairs are the negatives)", c->file, (long long)B);
    mmc_dual_encoder *m = NULL;
    mmc_lora_set *lora = NULL;
    char **lora_names = NULL;
    pairs pr = {0};
    mmc_tensor **params = NULL, *px_all = NULL;
    const char **names = NULL;
    float *dimg = NULL, *dtxt = NULL, *gbuf = NULL;
    mmc_image *imgs = NULL;
    mmc_ctx *ctx = NULL;
    mmc_adamw opt = {0};
    bool opt_ok = false;
    mmc_status st;
    char ckpt[2048] = "";
    int64_t ckpt_step = 0;
    if (t->contrastive_resume) {
        if (!c->training.output_dir)
            return mmc_error(MMC_ERR_INVALID, "%s: --resume needs training.output_dir (where the checkpoints are)", c->file);
        if ((st = mmc_checkpoint_latest(c->training.output_dir, &ckpt_step, ckpt, sizeof ckpt)))
            return mmc_error(st, "--resume: no complete checkpoint-<step> directory in %s (%s)", c->training.output_dir,
                             mmc_last_error());
        fprintf(stderr, "mmc train: resuming from %s\n", ckpt);
    }
    const bool use_lora = c->model.lora.r > 0;
    /* LoRA: the base folder frozen (as PEFT freezes every base weight, logit_scale and logit_bias included),
     * the adapters from the checkpoint (--resume), model.lora.init or fresh */
    if ((st = use_lora ? mmc_dual_encoder_load(c->model.path, &m)
                       : mmc_dual_encoder_load_trainable(ckpt[0] ? ckpt : c->model.path, &m)))
        return st;
    if (use_lora && (st = setup_lora(c, m, ckpt[0] ? ckpt : NULL, &lora, &lora_names))) goto done;
    if ((st = pairs_read(c->data.train, c->data.image_root, &pr))) goto done;
    const int np = use_lora ? lora->n_params : mmc_dual_encoder_params(m, NULL, NULL, 0);
    params = calloc((size_t)np, sizeof *params);
    names = calloc((size_t)np, sizeof *names);
    const int64_t D = mmc_dual_encoder_dim(m);
    dimg = malloc(sizeof(float) * (size_t)(4 * B * D));   /* d_img, d_txt [B, D]; gathered img, txt [B, D] */
    imgs = calloc((size_t)pr.n, sizeof *imgs);
    if (!params || !names || !dimg || !imgs || !(ctx = mmc_ctx_new())) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    dtxt = dimg + B * D;
    float *gimg = dimg + 2 * B * D, *gtxt = dimg + 3 * B * D;
    if (use_lora)
        for (int i = 0; i < np; i++) params[i] = lora->params[i], names[i] = lora_names[i];
    else
        mmc_dual_encoder_params(m, params, names, np);
    int64_t n_grad = 0;   /* the flat gradient buffer the ranks sum */
    for (int i = 0; i < np; i++) n_grad += mmc_numel(params[i]);
    gbuf = R > 1 ? malloc(sizeof(float) * (size_t)n_grad) : NULL;
    if (R > 1 && !gbuf) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    /* every image once through the processor: pixel_values [N, 3, S, S] */
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    if (c->data.max_image_pixels > 0) io.max_pixels = c->data.max_image_pixels;
    for (int i = 0; i < pr.n && !st; i++)
        if ((st = mmc_image_load(pr.image[i], &io, &imgs[i])))
            st = mmc_error_prefix(st, "%s: pair %d", c->data.train, i + 1);
    if (!st) st = mmc_clip_preprocess(mmc_dual_encoder_image_proc(m), imgs, pr.n, &px_all);
    if (st) goto done;
    mmc_adamw_opts ao;
    mmc_adamw_defaults(&ao);
    ao.lr = c->optimizer.lr, ao.weight_decay = c->optimizer.weight_decay, ao.eps = c->optimizer.eps;
    ao.beta1 = c->optimizer.beta1, ao.beta2 = c->optimizer.beta2;
    if ((st = mmc_adamw_init(&opt, &ao, params, np))) goto done;
    opt_ok = true;
    if (ckpt[0]) {
        int64_t s0 = 0;
        if ((st = restore_state(ckpt, params, names, np, &opt, &s0))) goto done;
        if (s0 != ckpt_step) { st = mmc_error(MMC_ERR_FORMAT, "--resume: %s says global_step %lld", ckpt, (long long)s0); goto done; }
        t->step = s0;
    }
    mmc_schedule sch = {.kind = (mmc_sched_kind)c->optimizer.schedule, .lr = c->optimizer.lr, .min_lr = c->optimizer.min_lr,
                        .warmup_steps = c->optimizer.warmup_steps, .total_steps = c->training.steps};
    mmc_tensor *scale = mmc_dual_encoder_logit_scale_param(m), *bias = mmc_dual_encoder_logit_bias_param(m);
    const bool sig = mmc_dual_encoder_sigmoid(m);
    const int64_t S = px_all->shape[2], W = px_all->shape[3];
    mmc_tensor *px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(Bl, 3, S, W));
    const char **caps = calloc((size_t)Bl, sizeof *caps);
    if (!px || !caps) { mmc_tensor_free(px); free(caps); st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    const size_t img_floats = (size_t)(3 * S * W);
    int64_t n_train = 0;
    for (int i = 0; i < np; i++) n_train += mmc_numel(params[i]);
    if (rank == 0)
        fprintf(stderr, "mmc train: %s contrastive %s, %d pairs, batch %lld%s, %d tensors (%lld trainable of %lld "
                "parameters)\n", sig ? "SiglipModel" : "CLIPModel", use_lora ? "LoRA training" : "fine-tuning", pr.n,
                (long long)B, R > 1 ? " over data-parallel ranks (negatives gathered)" : "", np, (long long)n_train,
                (long long)(mmc_dual_encoder_param_count(m) + (use_lora ? n_train : 0)));
    for (; t->step < c->training.steps && !st; ) {
        const int64_t step = t->step;
        for (int64_t b = 0; b < Bl; b++) {
            const int64_t k = (step * B + rank * Bl + b) % pr.n;
            memcpy((float *)px->data + b * (int64_t)img_floats, (const float *)px_all->data + k * (int64_t)img_floats,
                   img_floats * sizeof(float));
            caps[b] = pr.caption[k];
        }
        mmc_tensor *ids = NULL, *mask = NULL, *img = NULL, *txt = NULL;
        if ((st = mmc_dual_encoder_tokenize(m, caps, (int)Bl, &ids, &mask))) break;
        mmc_zero_grad(params, np);
        if (use_lora && c->model.lora.dropout > 0)   /* one dropout stream per (seed, step): a resume redraws it */
            mmc_nn_set_dropout_seed(ctx, mmc_nn_dropout_seed((uint64_t)c->training.seed, (uint64_t)step, 0));
        bool was = mmc_set_grad_enabled(ctx, true);
        st = mmc_dual_encoder_project(ctx, m, px, ids, mask, &img, &txt);
        mmc_contrastive_out lo = {.d_img = dimg, .d_txt = dtxt};
        if (!st) {
            const double ls = (double)((const float *)scale->data)[0];
            const double lb = bias ? (double)((const float *)bias->data)[0] : 0.0;
            const float *ai = img->data, *at = txt->data;
            if (R > 1) {   /* every rank's embeddings, in batch order */
                img = mmc_contiguous(ctx, img), txt = mmc_contiguous(ctx, txt);
                if (!(st = mmc_all_gather(t->world, img->data, gimg, Bl * D, MMC_F32)))
                    st = mmc_all_gather(t->world, txt->data, gtxt, Bl * D, MMC_F32);
                ai = gimg, at = gtxt;
            }
            if (!st)
                st = mmc_contrastive_loss(sig ? MMC_CONTRASTIVE_SIGLIP : MMC_CONTRASTIVE_CLIP, ai, at, B, D, ls, lb, &lo);
        }
        if (!st) {
            /* surrogate: d(sum(img * G_img) + sum(txt * G_txt)) = the loss's gradients w.r.t. this rank's img, txt */
            mmc_tensor *gi = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(Bl, D)), *gt = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(Bl, D));
            memcpy(gi->data, dimg + rank * Bl * D, sizeof(float) * (size_t)(Bl * D));
            memcpy(gt->data, dtxt + rank * Bl * D, sizeof(float) * (size_t)(Bl * D));
            mmc_tensor *sur = mmc_add(ctx, mmc_sum(ctx, mmc_mul(ctx, img, gi)), mmc_sum(ctx, mmc_mul(ctx, txt, gt)));
            mmc_backward(ctx, sur);
            if (R > 1) {   /* the towers' gradients summed over the ranks (one flat all-reduce) */
                int64_t o = 0;
                for (int i = 0; i < np; i++) {
                    const int64_t n = mmc_numel(params[i]);
                    if (params[i]->grad) memcpy(gbuf + o, params[i]->grad->data, sizeof(float) * (size_t)n);
                    else memset(gbuf + o, 0, sizeof(float) * (size_t)n);
                    o += n;
                }
                if ((st = mmc_all_reduce(t->world, gbuf, gbuf, n_grad, MMC_F32, MMC_SUM))) goto step_end;
                o = 0;
                for (int i = 0; i < np; i++) {
                    const int64_t n = mmc_numel(params[i]);
                    if (mmc_requires_grad(params[i])) memcpy(mmc_grad(ctx, params[i])->data, gbuf + o, sizeof(float) * (size_t)n);
                    o += n;
                }
            }
            if (mmc_requires_grad(scale)) ((float *)mmc_grad(ctx, scale)->data)[0] += (float)lo.d_logit_scale;
            if (bias && mmc_requires_grad(bias)) ((float *)mmc_grad(ctx, bias)->data)[0] += (float)lo.d_logit_bias;
            double gn = c->optimizer.grad_clip > 0 ? mmc_clip_grad_norm(params, np, c->optimizer.grad_clip) : 0;
            const double lr = mmc_schedule_lr(&sch, step);
            mmc_adamw_step(&opt, lr);
            t->step++;
            if (rank == 0 && (c->training.log_every <= 0 || t->step % c->training.log_every == 0 || t->step == 1))
                printf("step %lld loss %.9g lr %.6g%s\n", (long long)t->step, lo.loss, lr,
                       c->optimizer.grad_clip > 0 ? "" : ""), (void)gn;
            fflush(stdout);
        }
    step_end:
        mmc_set_grad_enabled(ctx, was);
        mmc_ctx_reset(ctx);
        mmc_tensor_free(ids);
        mmc_tensor_free(mask);
        if (!st && rank == 0 && c->training.output_dir &&
            ((c->training.save_every > 0 && t->step % c->training.save_every == 0) || t->step == c->training.steps))
            st = save_hf(c->model.path, c->training.output_dir, t->step, params, names, np, &opt, lora);
    }
    mmc_tensor_free(px);
    free(caps);
    if (!st && R > 1) st = mmc_barrier(t->world);   /* rank 0's last checkpoint is written before anyone exits */
done:
    free(gbuf);
    if (opt_ok) mmc_adamw_free(&opt);
    if (imgs) for (int i = 0; i < pr.n; i++) mmc_image_free(&imgs[i]);
    free(imgs);
    mmc_tensor_free(px_all);
    mmc_ctx_free(ctx);
    free(dimg);
    free(params);
    free(names);
    pairs_free(&pr);
    if (lora_names) for (int i = 0; i < lora->n_params; i++) free(lora_names[i]);
    free(lora_names);
    mmc_lora_free(lora);   /* (before the model: it detaches the adapters from its linears) */
    mmc_dual_encoder_free(m);
    return st;
}
