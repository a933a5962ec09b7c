/* trainer.c — the single-process training loop (mmc_trainer.h): model set-up (load or
 * random init, freezing by component, bf16 weights with fp32 masters), the built-in batch
 * sources, one optimizer step (gradient accumulation with the loss averaged over the global
 * batch's label tokens, global grad-norm clipping, schedule, AdamW), and the run loop with
 * progress, metrics.jsonl, TensorBoard scalars and checkpoints.
 *
 * It mirrors what HF Trainer does for the same settings (num_items_in_batch loss
 * normalisation, clip_grad_norm_, get_*_schedule_with_warmup, torch.optim.AdamW), so a run
 * matches transformers + torch step for step (tests/test_train_parity.c). */
#include "trainer_internal.h"
#include "mmc_ep.h"
#include "mmc_cp.h"
#include "mmc_tp.h"
#include "mmc_hetero.h"
#include "mmc_quant.h"
#include "mmc_pp.h"
#include "mmc_omni.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ batch sources */
static void batch_release(mmc_batch *b) { mmc_batch_free(b); }

static mmc_status src_open(batch_src *s, const mmc_run_config *cfg, int64_t vocab) {
    memset(s, 0, sizeof *s);
    const char *train = cfg->data.train;
    s->mb = cfg->data.micro_batch_size;
    s->vocab = vocab;
    s->seed = (uint64_t)cfg->training.seed;
    size_t n = strlen(train);
    if (strcmp(train, "synthetic") == 0) {
        s->kind = SRC_SYNTHETIC;
        s->T = cfg->data.seq_len;
        return MMC_OK;
    }
    if (n > 12 && strcmp(train + n - 12, ".safetensors") == 0) {
        s->kind = SRC_FIXED;
        mmc_st *st = NULL;
        mmc_status rc = mmc_st_open(train, &st);
        if (rc) return mmc_error_prefix(rc, "data.train");
        const mmc_st_entry *e = mmc_st_find(st, "input_ids");
        if (!e || e->ndim != 2) {
            mmc_st_close(st);
            return mmc_error(MMC_ERR_FORMAT, "data.train %s: needs a tensor input_ids [N, T]", train);
        }
        s->N = e->shape[0];
        s->T = e->shape[1];
        mmc_tensor *ids = mmc_tensor_new(MMC_I32, 2, e->shape), *lab = mmc_tensor_new(MMC_I32, 2, e->shape);
        if (!ids || !lab) { mmc_tensor_free(ids); mmc_tensor_free(lab); mmc_st_close(st); return MMC_ERR_OOM; }
        rc = mmc_st_read_into(st, "input_ids", ids);
        if (!rc) rc = mmc_st_read_into(st, mmc_st_find(st, "labels") ? "labels" : "input_ids", lab);
        if (rc) {
            mmc_st_close(st);
            mmc_tensor_free(ids);
            mmc_tensor_free(lab);
            return mmc_error_prefix(rc, "data.train %s", train);
        }
        s->ids = malloc((size_t)(s->N * s->T) * sizeof(int32_t));
        s->labels = malloc((size_t)(s->N * s->T) * sizeof(int32_t));
        if (s->ids) memcpy(s->ids, ids->data, (size_t)(s->N * s->T) * sizeof(int32_t));
        if (s->labels) memcpy(s->labels, lab->data, (size_t)(s->N * s->T) * sizeof(int32_t));
        mmc_tensor_free(ids);
        mmc_tensor_free(lab);
        if (!s->ids || !s->labels) { mmc_st_close(st); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        /* optional images, one per row: pixel_values [Np, P] and image_grid_thw [N, 3] */
        const mmc_st_entry *pe = mmc_st_find(st, "pixel_values"), *ge = mmc_st_find(st, "image_grid_thw");
        if (pe || ge) {
            if (!pe || !ge || pe->ndim != 2 || ge->ndim != 2 || ge->shape[0] != s->N || ge->shape[1] != 3) {
                mmc_st_close(st);
                return mmc_error(MMC_ERR_FORMAT, "data.train %s: images need pixel_values [Np, P] and "
                                 "image_grid_thw [N, 3] (one image per row, N = %lld rows)", train, (long long)s->N);
            }
            mmc_tensor *px = mmc_tensor_new(MMC_F32, 2, pe->shape), *gr = mmc_tensor_new(MMC_I64, 2, ge->shape);
            rc = px && gr ? mmc_st_read_into(st, "pixel_values", px) : MMC_ERR_OOM;
            if (!rc) rc = mmc_st_read_into(st, "image_grid_thw", gr);
            s->patch_dim = pe->shape[1];
            s->pixels = malloc((size_t)mmc_nbytes(px ? px : gr) + 1);
            s->grid = malloc((size_t)(3 * s->N) * sizeof(int64_t));
            s->patch_off = malloc((size_t)(s->N + 1) * sizeof(int64_t));
            if (!rc && (!s->pixels || !s->grid || !s->patch_off)) rc = MMC_ERR_OOM;
            if (!rc) {
                memcpy(s->pixels, px->data, mmc_nbytes(px));
                memcpy(s->grid, gr->data, (size_t)(3 * s->N) * sizeof(int64_t));
                s->patch_off[0] = 0;
                for (int64_t r = 0; r < s->N; r++) s->patch_off[r + 1] = s->patch_off[r] + s->grid[3 * r] *
                                                                          s->grid[3 * r + 1] * s->grid[3 * r + 2];
                if (s->patch_off[s->N] != pe->shape[0])
                    rc = mmc_error(MMC_ERR_SHAPE, "data.train %s: image_grid_thw gives %lld patches, pixel_values "
                                   "has %lld", train, (long long)s->patch_off[s->N], (long long)pe->shape[0]);
            }
            mmc_tensor_free(px);
            mmc_tensor_free(gr);
            if (rc) { mmc_st_close(st); return mmc_error_prefix(rc, "data.train %s", train); }
        }
        mmc_st_close(st);
        for (int64_t i = 0; i < s->N * s->T; i++)
            if (s->ids[i] < 0 || s->ids[i] >= vocab || (s->labels[i] != MMC_IGNORE_INDEX &&
                                                         (s->labels[i] < 0 || s->labels[i] >= vocab)))
                return mmc_error(MMC_ERR_INVALID, "data.train %s: token %d at flat index %lld is outside the "
                                 "vocabulary [0, %lld)", train, s->ids[i] < 0 || s->ids[i] >= vocab ? s->ids[i]
                                 : s->labels[i], (long long)i, (long long)vocab);
        return MMC_OK;
    }
    return mmc_error(MMC_ERR_UNSUPPORTED, "data.train %s: JSON/JSONL datasets go through the data pipeline, "
                     "which needs a vision-language model (model_type qwen2_vl / qwen2_5_vl); for a text qwen2 "
                     "use a fixed batch (.safetensors with input_ids [N, T] and labels) or 'synthetic'", train);
}

static bool is_dataset(const char *train) {
    size_t n = strlen(train);
    return strcmp(train, "synthetic") != 0 && !(n > 12 && strcmp(train + n - 12, ".safetensors") == 0);
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* The `data:` section onto the pipeline's options (training.seed seeds the shuffling), and the
 * loader over data.train. The image processor is the tokenizer/model directory's
 * (mmc_qwen2vl_proc_load_dir: processor_config.json's "image_processor", else
 * preprocessor_config.json; Qwen2-VL's defaults when it has neither); data.min_pixels /
 * max_pixels, when set, override it. */
static mmc_status loader_open(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    const mmc_data_cfg *d = &c->data;
    mmc_data_opts *o = &t->dopts;
    mmc_data_opts_default(o);
    o->train = dup_or_null(d->train);
    o->eval = dup_or_null(d->eval);
    o->image_root = dup_or_null(d->image_root);
    o->max_pixels = d->max_pixels;
    o->min_pixels = d->min_pixels;
    o->max_image_pixels = d->max_image_pixels;
    o->seq_len = d->seq_len;
    o->packing = d->packing;
    o->batch_size = d->batch_size;
    o->micro_batch_size = d->micro_batch_size;
    o->num_workers = d->num_workers;
    o->strict = d->strict;
    o->seed = c->training.seed;
    o->shuffle = d->shuffle;
    /* shuffle: false means "keep the file's order" (e.g. a curriculum): length bucketing over
     * windows of 16 micro-batches would regroup samples by length, and with short answers the
     * length often tells the answer (the demo's batches became answer-homogeneous) */
    o->truncation = d->truncation;
    o->prefetch = d->prefetch;
    o->bucket_window = d->bucket_window;
    if (!d->shuffle && d->bucket_window == 0) o->bucket_window = d->micro_batch_size;
    o->add_vision_id = d->add_vision_id;
    if (t->llava && t->llava->variant != MMC_LLAVA_15) {   /* LlavaNext / LlavaOnevisionProcessor: anyres tiles */
        o->llava = o->llava_next = true;
        mmc_llava_next_proc_default(&o->nproc, t->llava);
        if (t->src_dir[0]) {
            mmc_status st = mmc_llava_next_proc_load_dir(t->src_dir, &o->nproc, NULL, 0);
            if (st) return mmc_error_prefix(st, "%s: the model's image processor", c->file);
        }
        o->nproc.base.resize_mode = d->image_backend == 1 ? MMC_VLPROC_RESIZE_TORCH : MMC_VLPROC_RESIZE_PIL;
        o->llava_image_id = (int32_t)t->llava->image_token_id;
    } else if (t->llava) {   /* LlavaProcessor: CLIPImageProcessor, <image> x one token per feature */
        o->llava = true;
        mmc_clip_proc_default(&o->clip);
        if (t->src_dir[0]) {
            mmc_status st = mmc_clip_proc_load_dir(t->src_dir, &o->clip, NULL, 0);
            if (st) return mmc_error_prefix(st, "%s: the model's image processor", c->file);
        }
        o->clip.resize_mode = d->image_backend == 1 ? MMC_VLPROC_RESIZE_TORCH : MMC_VLPROC_RESIZE_PIL;
        o->llava_image_tokens = mmc_llava_image_tokens(t->llava);
        o->llava_image_id = (int32_t)t->llava->image_token_id;
    } else if (t->internvl) {   /* InternVLProcessor: dynamic tiles, <img> <IMG_CONTEXT> x N </img> */
        o->llava = o->internvl = true;
        mmc_internvl_proc_default(&o->iproc);
        if (t->src_dir[0]) {
            mmc_status st = mmc_internvl_proc_load_dir(t->src_dir, &o->iproc, NULL, 0);
            if (st) return mmc_error_prefix(st, "%s: the model's image processor", c->file);
        }
        o->iproc.resize_mode = d->image_backend == 1 ? MMC_VLPROC_RESIZE_TORCH : MMC_VLPROC_RESIZE_PIL;
        o->llava_image_tokens = o->iproc.image_seq_length;
        o->llava_image_id = (int32_t)t->internvl->image_token_id;
        o->internvl_chat = t->internvl->remote_layout;   /* its template takes string content (data_sample.c) */
    } else if (t->src_dir[0]) {
        mmc_status st = mmc_qwen2vl_proc_load_dir(t->src_dir, &o->proc, NULL, 0);
        if (st) return mmc_error_prefix(st, "%s: the model's image processor", c->file);
    }
    if (t->omni) {   /* Qwen2_5OmniProcessor: + the WhisperFeatureExtractor, <|AUDIO|> / <|IMAGE|> by id */
        if (d->packing)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: data.packing is not supported for Qwen2.5-Omni training yet",
                             c->file);
        mmc_status st = t->src_dir[0] ? mmc_whisper_fe_load(t->src_dir, &t->omni_fe)
                                      : mmc_error(MMC_ERR_INVALID, "no model directory");
        if (st) return mmc_error_prefix(st, "%s: the model's audio feature extractor", c->file);
        o->omni = true;
        o->fe = &t->omni_fe;
        o->omni_audio_id = (int32_t)t->omni->audio_token_id;
        o->omni_image_id = (int32_t)t->omni->image_token_id;
        o->omni_video_id = (int32_t)t->omni->video_token_id;
    }
    if (o->min_pixels > 0) o->proc.min_pixels = o->min_pixels;
    if (o->max_pixels > 0) o->proc.max_pixels = o->max_pixels;
    /* data.image_backend: pil (0) | torchvision (1), transformers' default fast processor */
    o->proc.resize_mode = d->image_backend == 1 ? MMC_VLPROC_RESIZE_TORCH : MMC_VLPROC_RESIZE_PIL;
    if (o->proc.min_pixels > o->proc.max_pixels)
        return mmc_error(MMC_ERR_INVALID, "%s: the image area range [%lld, %lld] is empty (data.min_pixels / "
                         "data.max_pixels against the model's image processor in %s); set both", c->file,
                         (long long)o->proc.min_pixels, (long long)o->proc.max_pixels, t->src_dir);
    if (t->src_dir[0]) {   /* the video processor's own settings, for video files */
        mmc_status st = mmc_qwen2vl_video_proc_load_dir(t->src_dir, &o->vproc);
        if (st) return mmc_error_prefix(st, "video processor");
        mmc_qwen2vl_video_sampling_default(&o->vproc);
    }
    if (!t->src_dir[0])
        return mmc_error(MMC_ERR_INVALID, "%s: model.tokenizer: training on %s needs a tokenizer directory "
                         "(tokenizer.json + chat template); give model.tokenizer", c->file, d->train);
    mmc_status st = mmc_tokenizer_load(t->src_dir, &t->tok);
    if (st) return mmc_error_prefix(st, "tokenizer (%s)", t->src_dir);
    if (o->internvl) {
        o->internvl_start = mmc_tokenizer_token_to_id(t->tok, "<img>");
        o->internvl_end = mmc_tokenizer_token_to_id(t->tok, "</img>");
        if (o->internvl_start < 0 || o->internvl_end < 0)
            return mmc_error(MMC_ERR_FORMAT, "%s: the tokenizer has no <img> / </img> tokens (InternVLProcessor's "
                             "start_image_token / end_image_token)", t->src_dir);
    }
    memset(&t->src, 0, sizeof t->src);
    t->src.kind = SRC_LOADER;
    t->src.mb = d->micro_batch_size;
    t->src.seed = (uint64_t)c->training.seed;
    if ((st = mmc_loader_new(o, t->tok, MMC_SPLIT_TRAIN, &t->src.loader))) return mmc_error_prefix(st, "data.train");
    return MMC_OK;
}

static void src_close(batch_src *s) {
    mmc_loader_free(s->loader);
    free(s->ids);
    free(s->labels);
    free(s->pixels);
    free(s->grid);
    free(s->patch_off);
    memset(s, 0, sizeof *s);
}

static mmc_status src_next(batch_src *s, mmc_batch *b) {
    memset(b, 0, sizeof *b);
    if (s->kind == SRC_LOADER) {
        mmc_status st = mmc_loader_next(s->loader, b);
        if (st) return mmc_error_prefix(st, "data.train");
        s->position++;
        return MMC_OK;
    }
    if (s->kind == SRC_FLUX) {   /* the samples by position; trainer_flux.c draws the rest */
        b->B = s->mb;
        b->T = 1;
        b->sample_index = s->position * s->mb;
        b->n_label_tokens = b->n_tokens = s->mb;
        s->position++;
        return MMC_OK;
    }
    int64_t B = s->mb, T = s->T;
    b->B = B;
    b->T = T;
    b->input_ids = malloc((size_t)(B * T) * sizeof(int32_t));
    b->labels = malloc((size_t)(B * T) * sizeof(int32_t));
    b->position_ids = malloc((size_t)(3 * B * T) * sizeof(int64_t));
    if (!b->input_ids || !b->labels || !b->position_ids) {
        batch_release(b);
        return mmc_error(MMC_ERR_OOM, "out of memory for a micro-batch");
    }
    b->sample_index = s->position * B;
    if (s->pixels) {   /* FIXED with images: gather the rows' images; positions from get_rope_index */
        int64_t np = 0;
        for (int64_t r = 0; r < B; r++) {
            int64_t row = (s->position * B + r) % s->N;
            np += s->patch_off[row + 1] - s->patch_off[row];
        }
        free(b->position_ids);
        b->position_ids = NULL;
        b->pixel_values = malloc((size_t)(np * s->patch_dim) * sizeof(float));
        b->image_grid_thw = malloc((size_t)(3 * B) * sizeof(int64_t));
        if (!b->pixel_values || !b->image_grid_thw) {
            batch_release(b);
            return mmc_error(MMC_ERR_OOM, "out of memory for a micro-batch");
        }
        b->n_patches = np;
        b->patch_dim = s->patch_dim;
        b->n_images = (int)B;
        for (int64_t r = 0, at = 0; r < B; r++) {
            int64_t row = (s->position * B + r) % s->N, k = s->patch_off[row + 1] - s->patch_off[row];
            memcpy(b->pixel_values + at * s->patch_dim, s->pixels + s->patch_off[row] * s->patch_dim,
                   (size_t)(k * s->patch_dim) * sizeof(float));
            memcpy(b->image_grid_thw + 3 * r, s->grid + 3 * row, 3 * sizeof(int64_t));
            at += k;
        }
    }
    for (int64_t r = 0; r < B; r++) {
        int64_t sample = s->position * B + r;
        int32_t *ids = b->input_ids + r * T, *lab = b->labels + r * T;
        if (s->kind == SRC_FIXED) {
            int64_t row = sample % s->N;
            memcpy(ids, s->ids + row * T, (size_t)T * sizeof(int32_t));
            memcpy(lab, s->labels + row * T, (size_t)T * sizeof(int32_t));
        } else {
            mmc_rng g;
            mmc_rng_init(&g, s->seed * 0x9E3779B97F4A7C15ull + (uint64_t)sample + 1);
            int64_t start = (int64_t)(mmc_rng_u64(&g) % (uint64_t)s->vocab);
            int64_t stride = 1 + (int64_t)(mmc_rng_u64(&g) % 7);
            for (int64_t t = 0; t < T; t++) ids[t] = lab[t] = (int32_t)((start + t * stride) % s->vocab);
        }
        if (b->position_ids)
            for (int k = 0; k < 3; k++)
                for (int64_t t = 0; t < T; t++) b->position_ids[(k * B + r) * T + t] = t;
    }
    b->n_label_tokens = mmc_count_label_tokens(b->labels, B, T);
    s->position++;
    return MMC_OK;
}

/* ------------------------------------------------------------------ model set-up */
/* Component of an HF parameter name (text Qwen2 names, or Qwen2-VL's). */
static uint32_t component_of(const char *name) {
    if (!strncmp(name, "audio_tower.", 12)) return MMC_FREEZE_AUDIO;   /* Qwen2.5-Omni's */
    if (strstr(name, "visual.merger") || strstr(name, "visual.merger.")) return MMC_FREEZE_MERGER;
    if (strstr(name, "visual.")) return MMC_FREEZE_VISION;
    if (strstr(name, "multi_modal_projector.")) return MMC_FREEZE_MERGER;   /* LLaVA's */
    if (!strcmp(name, "image_newline")) return MMC_FREEZE_MERGER;   /* LLaVA-NeXT / OneVision's, with the projector */
    if (!strncmp(name, "vision_tower.", 13)) return MMC_FREEZE_VISION;
    if (!strncmp(name, "vision_model.", 13)) return MMC_FREEZE_VISION;   /* OpenGVLab's InternVLChatModel: */
    if (!strncmp(name, "mlp1.", 5)) return MMC_FREEZE_MERGER;            /* its tower and projector */
    if (strstr(name, "embed_tokens") || strstr(name, "tok_embeddings")) return MMC_FREEZE_EMBED;   /* (InternLM2's) */
    return MMC_FREEZE_LM;
}

static mmc_status tp_restore(mmc_trainer *t, const char *dir);
static mmc_status hetero_check(mmc_trainer *t);
static mmc_status hetero_setup(mmc_trainer *t);
static mmc_status hetero_reduce(mmc_trainer *t);
static mmc_status partial_setup(mmc_trainer *t);
static mmc_status partial_reduce(mmc_trainer *t);
static int lm_split_of(const mmc_trainer *t, const mmc_tensor *p);
static mmc_status tp_nf4_check(mmc_trainer *t, const mmc_module_list *ql);

/* LoRA under tensor parallelism (mmc_tp.h): the decoder's column-parallel modules (q/k/v,
 * gate/up) keep A whole and split B on rows, the row-parallel ones (o/down) split A on columns
 * and keep B whole; the replicated factor's gradient is partial on each rank. A is
 * re-initialised as one process would (the same kaiming-uniform stream over the full [r, K],
 * then sliced), so a tp run starts from the same adapters. */
static mmc_status tp_lora_setup(mmc_trainer *t) {
    mmc_lora_set *s = t->lora;
    const int P = t->tp_size, r = mmc_comm_rank(t->tpc);
    t->lora_split = calloc((size_t)s->n_params + 1, 1);
    t->lora_partial = calloc((size_t)s->n_params + 1, sizeof *t->lora_partial);
    if (!t->lora_split || !t->lora_partial) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_rng rng;
    mmc_rng_init(&rng, (uint64_t)t->cfg->training.seed);
    for (int i = 0; i < s->n; i++) {
        /* 0 replicated module (a replicated tower's), 1 column-parallel, 2 row-parallel, 3 the
         * tower's fused qkv (column-parallel per third) */
        int kind = 0;
        for (int64_t l = 0; l < t->lm->cfg.num_layers && !kind; l++) {
            mmc_qwen2_layer *L = &t->lm->layers[l];
            if (s->mods[i] == &L->q || s->mods[i] == &L->k || s->mods[i] == &L->v || s->mods[i] == &L->gate ||
                s->mods[i] == &L->up || s->mods[i] == &L->qkv) kind = 1;   /* (InternLM2's wqkv: by KV group) */
            else if (s->mods[i] == &L->o || s->mods[i] == &L->down) kind = 2;
        }
        const mmc_vision *vt = t->vl ? t->vl->visual : NULL;
        for (int64_t l = 0; vt && vt->tp && l < vt->cfg.depth && !kind; l++) {
            mmc_vision_block *b = &vt->blocks[l];
            if (s->mods[i] == &b->qkv) kind = 3;
            else if (s->mods[i] == &b->fc1 || s->mods[i] == &b->gate || s->mods[i] == &b->up) kind = 1;
            else if (s->mods[i] == &b->proj || s->mods[i] == &b->fc2 || s->mods[i] == &b->down) kind = 2;
        }
        mmc_tensor *A = s->adapters[i].A;
        const int64_t R = A->shape[0], K = A->shape[1] * (kind == 2 ? P : 1);
        float *full = malloc((size_t)(R * K) * sizeof(float));
        if (!full) return mmc_error(MMC_ERR_OOM, "out of memory");
        mmc_rng_uniform(&rng, full, R * K, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
        mmc_tp_take_slice(full, 2, MMC_SHAPE(R, K), kind == 2 ? 1 : -1, r, P, A->data);
        free(full);
        t->lora_split[2 * i] = (signed char)(kind == 2 ? 1 : MMC_TP_REPLICATED);
        t->lora_split[2 * i + 1] = (signed char)(kind == 1 ? 0 : kind == 3 ? MMC_TP_FUSED3 : MMC_TP_REPLICATED);
        t->lora_partial[2 * i] = kind == 1 || kind == 3;   /* A whole, fed the full input: our output rows' share */
        t->lora_partial[2 * i + 1] = kind == 2;   /* B whole, fed our partial A x */
    }
    return MMC_OK;
}
/* Text Llama / Mistral: what the shared decoder cannot train yet is refused up front.
 * Mistral's sliding-window attention is not implemented (attention is full causal), which is
 * exact only while no sequence is longer than the window: data.seq_len past it is refused. */
static mmc_status llama_check(const mmc_run_config *c, const mmc_json *j, const char *path) {
    const mmc_json *sw = mmc_json_get(j, "sliding_window");
    if (sw && mmc_json_has(j, "sliding_window")) {
        int64_t w = 0;
        if (!mmc_json_int(j, "sliding_window", 0, &w) && w > 0 && c->data.seq_len > w)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: sliding_window %lld is shorter than data.seq_len %lld; "
                             "sliding-window attention is not implemented: set data.seq_len <= %lld",
                             path, (long long)w, (long long)c->data.seq_len, (long long)w);
    }
    return MMC_OK;
}

/* LLaVA / InternVL (and text InternLM2) under tensor parallelism: the language model (a Llama /
 * Mistral / Qwen2 / InternLM2 decoder) read whole with the model, then replaced by this rank's slices (mmc_qwen2_shard_tp, as a seeded
 * text init is); the vision tower and projector stay whole on every rank (their input and the
 * features' gradient are the same on all: no reduction), as a Qwen2-VL tower kept whole is. */
static mmc_status vlm_lm_shard_tp(mmc_trainer *t, mmc_qwen2 **lm, const char *path) {
    mmc_status st = mmc_qwen2_tp_check(&(*lm)->cfg, t->tp_size, "the language model");
    mmc_qwen2 *part = NULL;
    if (!st) st = mmc_qwen2_shard_tp(*lm, t->tpc, &part);
    if (st) return mmc_error_prefix(st, "%s: model %s", t->cfg->file, path);
    mmc_qwen2_free(*lm);
    *lm = part;
    return MMC_OK;
}

static mmc_status load_model(mmc_trainer *t, const char *dir) {
    const mmc_run_config *c = t->cfg;
    if (mmc_trainer_is_wan_dir(c->model.path)) return mmc_trainer_wan_load(t, dir);     /* Wan T2V / I2V videos */
    if (mmc_trainer_is_flux_dir(c->model.path)) return mmc_trainer_flux_load(t, dir);   /* diffusion */
    mmc_json *j = NULL;
    mmc_status st;
    char path[2100];
    if (dir) snprintf(path, sizeof path, "%s/config.json", dir);
    else snprintf(path, sizeof path, "%s", c->model.init);
    /* tokenizer/processor files come from model.tokenizer, else model.path (not from a
     * checkpoint being resumed: keep_last may prune it while this run goes on) */
    const char *tok = c->model.tokenizer ? c->model.tokenizer : c->model.path;
    snprintf(t->src_dir, sizeof t->src_dir, "%s", tok ? tok : "");
    snprintf(t->config_src, sizeof t->config_src, "%s", path);
    if ((st = mmc_read_file(path, &t->config_text, &t->config_len)))
        return mmc_error_prefix(st, dir ? "model.path" : "model.init");
    if ((st = mmc_json_load(path, &j))) return mmc_error_prefix(st, dir ? "model.path" : "model.init");
    const char *type = "?";
    mmc_json_str(j, "model_type", "?", &type);
    bool vl = strcmp(type, "qwen2_vl") == 0 || strcmp(type, "qwen2_5_vl") == 0;
    bool omni = !strcmp(type, "qwen2_5_omni_thinker");
    bool llama = !strcmp(type, "llama") || !strcmp(type, "mistral");   /* text Llama / Mistral (llama_check) */
    bool moe = !strcmp(type, "qwen2_moe");   /* Qwen2-MoE (qwen2_moe.c), expert parallelism over epc */
    bool llava = !strcmp(type, "llava") || !strcmp(type, "llava_next") || !strcmp(type, "llava_onevision");
    bool internlm2 = !strcmp(type, "internlm2");   /* InternLM2ForCausalLM in its own names (internlm2.c) */
    bool internvl = !strcmp(type, "internvl") || !strcmp(type, "internvl_chat");   /* (internvl_train.c) */
    if (strcmp(type, "qwen2") != 0 && !llava && !internvl && !vl && !omni && !llama && !moe && !internlm2) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported for training "
                       "(supported: qwen2_vl, qwen2_5_vl, qwen2, qwen2_moe, llama, mistral, internlm2, llava, "
                       "llava_next, llava_onevision, internvl, internvl_chat (Qwen2 or InternLM2), qwen2_5_omni_thinker)",
                       path, type);
        mmc_json_free(j);   /* (type points into it) */
        return st;
    }
    if (!moe && t->epc) {
        st = mmc_error(MMC_ERR_INVALID, "%s: parallel.expert_parallel %lld needs a mixture-of-experts model "
                       "(qwen2_moe); model_type is '%s'", c->file, (long long)c->parallel.expert_parallel, type);
        mmc_json_free(j);   /* (type points into it) */
        return st;
    }
    if (moe) {
        if (t->cpc)
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: context parallelism of qwen2_moe is not supported; use "
                           "data_parallel with expert_parallel, tensor_parallel or pipeline_parallel", c->file);
        else if (t->tpc && (c->parallel.sequence_parallel || c->model.lora.r > 0))
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: tensor_parallel with %s is not supported for qwen2_moe yet; use "
                           "tensor_parallel without it (or expert_parallel alone)", c->file,
                           c->parallel.sequence_parallel ? "sequence_parallel" : "LoRA");
        else if (t->tpc && dir) st = mmc_qwen2_moe_load_tp(dir, j, true, t->epc, t->tpc, &t->lm);
        else if (t->tpc) st = mmc_qwen2_moe_new_tp(j, (uint64_t)c->training.seed, t->epc, t->tpc, &t->lm);
        else if (dir) st = mmc_qwen2_moe_load(dir, j, true, t->epc, &t->lm);
        else st = mmc_qwen2_moe_new(j, (uint64_t)c->training.seed, t->epc, &t->lm);
        if (st) mmc_error_prefix(st, "%s", path);
        /* the aux loss of each micro-batch forward enters the step's loss with 1 / (micro-batches of the
         * global batch): their mean, however they are spread over ranks */
        else mmc_moe_aux_set_weight(t->lm->moe, 1.0 / (double)c->training.gradient_accumulation);
    } else if (llama) {   /* LlamaForCausalLM / MistralForCausalLM: qwen2.c's decoder with Llama's config keys */
        /* tensor / pipeline / context parallelism as for Qwen2: the same decoder */
        mmc_qwen2_config qc;
        if (!(st = llama_check(c, j, path)) && !(st = mmc_llama_config_read(j, &qc)) && t->tpc)
            st = mmc_qwen2_tp_check(&qc, t->tp_size, "the language model");
        if (st) {
        } else if (t->tpc && dir) {
            st = mmc_qwen2_load_tp(dir, &qc, t->tpc, true, &t->lm);
        } else if (t->tpc) {
            mmc_qwen2 *full = NULL;
            st = mmc_qwen2_new(&qc, (uint64_t)c->training.seed, &full);
            if (!st) st = mmc_qwen2_shard_tp(full, t->tpc, &t->lm);
            mmc_qwen2_free(full);
        } else if (dir) {
            st = mmc_llama_load(dir, j, true, &t->lm);
        } else {
            st = mmc_qwen2_new(&qc, (uint64_t)c->training.seed, &t->lm);
        }
        if (st) mmc_error_prefix(st, "%s", path);
    } else if (internlm2) {   /* one packed wqkv per layer, saved back under the remote code's names */
        /* tensor parallelism: read whole, then this rank's slices (wqkv split by KV-head group, qwen2.c) */
        if (!dir)
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.init (a random start) is not supported for internlm2; "
                           "give model.path, an InternLM2ForCausalLM folder", c->file);
        else if ((st = mmc_internlm2_load_packed(dir, j, "", true, &t->lm)))
            mmc_error_prefix(st, "%s", path);
        else if (t->tpc)
            st = vlm_lm_shard_tp(t, &t->lm, path);
    } else if (omni) {   /* Qwen2.5-Omni thinker (omni_train.c): encoders frozen unless model.freeze is given */
        if (c->parallel.pipeline_parallel > 1 || c->parallel.zero >= 3)
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: pipeline parallelism and ZeRO-3 are not supported for "
                           "qwen2_5_omni_thinker yet (data parallelism with parallel.zero 0-2 and tensor parallelism "
                           "are)", c->file);
        else if (c->model.dtype == MMC_RUN_BF16)
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.dtype bf16 is not supported for qwen2_5_omni_thinker "
                           "yet; use f32", c->file);
        else if (dir) st = mmc_omni_load_ex(dir, true, &t->omni);
        else st = mmc_omni_new(j, path, (uint64_t)c->training.seed, &t->omni);   /* model.init */
        /* tp: the thinker's LM split, the audio encoder and vision tower whole on every rank: replicated, or
         * under a per-modality plan (parallel.audio / parallel.vision) each tp rank encoding its share */
        if (!st && t->tpc) st = vlm_lm_shard_tp(t, &t->omni->lm, path);
        if (!st) t->lm = t->omni->lm;
        if (!st && t->tpc && (c->parallel.hetero || c->parallel.hetero_audio)) {
            t->omni->share = t->tpc;
            t->omni->share_vision = c->parallel.hetero;
            t->omni->share_audio = c->parallel.hetero_audio;
        }
    } else if (internvl) {   /* InternVL, HF-native or OpenGVLab's internvl_chat (internvl_train.c): the tower frozen */
        if (strcmp(type, "internvl") && !dir)
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.init (a random start) is not supported for internvl_chat; "
                           "give model.path, an InternVLChatModel folder", c->file);
        else if (dir) st = mmc_internvl_load_ex(dir, true, &t->internvl);
        else st = mmc_internvl_new(j, path, (uint64_t)c->training.seed, &t->internvl);
        if (!st && t->tpc) st = vlm_lm_shard_tp(t, &t->internvl->lm, path);   /* the tower replicated */
        if (!st) t->lm = t->internvl->lm;
    } else if (llava) {   /* LLaVA-1.5 / NeXT / OneVision (llava_train.c): the tower frozen by default */
        if (dir) st = mmc_llava_load_ex(dir, true, &t->llava);
        else st = mmc_llava_new(j, path, (uint64_t)c->training.seed, &t->llava);
        if (!st && t->tpc) st = vlm_lm_shard_tp(t, &t->llava->lm, path);   /* the tower replicated */
        if (!st) t->lm = t->llava->lm;
    } else if (t->tpc && vl) {   /* the language model split, the vision tower too when tp divides it */
        /* (a per-modality plan keeps the tower whole: it is data-parallel, mmc_hetero.h) */
        const bool split_tower = !c->parallel.hetero;
        if (dir) {
            st = mmc_qwen2_vl_load_tp_ex(dir, true, t->tpc, split_tower, &t->vl);
        } else {
            st = mmc_qwen2_vl_new(j, path, (uint64_t)c->training.seed, &t->vl);
            if (!st) st = mmc_qwen2_vl_shard_tp_ex(t->vl, t->tpc, split_tower);
        }
        if (st) mmc_error_prefix(st, "%s: model %s", c->file, path);
        if (!st) t->lm = t->vl->lm;
        if (!st && c->parallel.hetero) t->vl->vision_share = t->tpc;   /* each tp rank encodes its share */
    } else if (t->tpc) {   /* each rank binds only its slices (mmc_qwen2_load_tp), or shards a seeded init */
        mmc_qwen2_config qc;
        st = mmc_qwen2_config_read(j, &qc);
        if (!st) st = mmc_qwen2_tp_check(&qc, t->tp_size, "the language model");
        if (st) {
            mmc_error_prefix(st, "%s: model %s", c->file, path);
        } else if (dir) {
            st = mmc_qwen2_load_tp(dir, &qc, t->tpc, true, &t->lm);
        } else {
            mmc_qwen2 *full = NULL;
            st = mmc_qwen2_new(&qc, (uint64_t)c->training.seed, &full);
            if (!st) st = mmc_qwen2_shard_tp(full, t->tpc, &t->lm);
            mmc_qwen2_free(full);
        }
    } else if (vl) {
        if (dir) st = mmc_qwen2_vl_load(dir, true, &t->vl);
        else st = mmc_qwen2_vl_new(j, path, (uint64_t)c->training.seed, &t->vl);
        if (!st) t->lm = t->vl->lm;
    } else if (dir) {
        st = mmc_qwen2_load(dir, j, true, &t->lm);
    } else {
        mmc_qwen2_config qc;
        st = mmc_qwen2_config_read(j, &qc);
        if (!st) st = mmc_qwen2_new(&qc, (uint64_t)c->training.seed, &t->lm);
        if (st) mmc_error_prefix(st, "%s", path);
    }
    mmc_json_free(j);
    if (st) return st;
    t->lm->recompute = c->model.recompute == MMC_RECOMPUTE_FULL;
    if (t->vl) t->vl->visual->recompute = t->lm->recompute;   /* vision blocks too */
    /* selective recompute and offload: the decoder layers (README "Selective recompute, activation offload and communication overlap") */
    t->lm->recompute_attn = c->model.recompute == MMC_RECOMPUTE_ATTENTION;
    t->lm->recompute_layers = (int)c->model.recompute_layers;
    t->lm->offload_layers = (int)c->model.offload_layers;
    t->lm->offload_dir = c->model.offload_dir;
    return MMC_OK;
}

/* LLaVA / InternVL under pipeline parallelism: a later stage drops the tower's and projector's
 * entries (they run on the first stage, mmc_trainer_pp_keep) */
static void vlm_stage_params(mmc_trainer *t) {
    int n = 0;
    for (int i = 0; i < t->n_params; i++) {
        if (!mmc_trainer_pp_keep(t, t->name_store[i])) { free(t->name_store[i]); continue; }
        t->params[n] = t->params[i];
        t->name_store[n++] = t->name_store[i];
    }
    t->n_params = n;
}

/* Every model parameter with its HF name, as transformers >= 4.52 writes them:
 * model.visual.*, model.language_model.*, lm_head.weight (VL); model.*, lm_head.weight (text). */
static mmc_status build_param_list(mmc_trainer *t) {
    if (mmc_trainer_diffusion(t)) return mmc_trainer_flux_params(t);
    if (t->llava) {   /* save_pretrained's names (llava_train.c) */
        mmc_status st = mmc_llava_params(t->llava, &t->params, &t->name_store, &t->n_params);
        if (st) return st;
        vlm_stage_params(t);
        if (!(t->names = calloc((size_t)t->n_params + 1, sizeof *t->names))) return mmc_error(MMC_ERR_OOM, "out of memory");
        for (int i = 0; i < t->n_params; i++) t->names[i] = t->name_store[i];
        return MMC_OK;
    }
    if (t->omni || t->internvl) {   /* the thinker layout (omni_train.c) / save_pretrained's names (internvl_train.c) */
        mmc_status st = t->omni ? mmc_omni_params(t->omni, &t->params, &t->name_store, &t->omni_views, &t->n_params,
                                                  &t->n_omni_views)
                                : mmc_internvl_params(t->internvl, &t->params, &t->name_store, &t->n_params);
        if (st) return st;
        if (t->internvl) vlm_stage_params(t);
        if (!(t->names = calloc((size_t)t->n_params + 1, sizeof *t->names))) return mmc_error(MMC_ERR_OOM, "out of memory");
        for (int i = 0; i < t->n_params; i++) t->names[i] = t->name_store[i];
        return MMC_OK;
    }
    const int nv = t->vl ? t->vl->visual->n_params : 0;
    t->n_params = nv + t->lm->n_params;
    t->params = calloc((size_t)t->n_params, sizeof *t->params);
    t->names = calloc((size_t)t->n_params, sizeof *t->names);
    t->name_store = calloc((size_t)t->n_params, sizeof *t->name_store);
    if (!t->params || !t->names || !t->name_store) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_params; i++) {
        const char *n = i < nv ? t->vl->visual->param_names[i] : t->lm->param_names[i - nv];
        const char *pre = i < nv ? "model.visual." : !strcmp(n, "lm_head.weight") || !strcmp(n, "output.weight") ? ""
                          : t->vl ? "model.language_model." : "model.";
        size_t len = strlen(n) + strlen(pre) + 1;
        if (!(t->name_store[i] = malloc(len))) return mmc_error(MMC_ERR_OOM, "out of memory");
        snprintf(t->name_store[i], len, "%s%s", pre, n);
        t->names[i] = t->name_store[i];
        t->params[i] = i < nv ? t->vl->visual->params[i] : t->lm->params[i - nv];
    }
    return MMC_OK;
}

/* the adapters' tensor names ("<module>.lora_A.weight"), again after a pipeline stage kept its share */
static mmc_status lora_names_build(mmc_trainer *t) {
    for (int i = 0; i < t->n_lora_names; i++) free(t->lora_names[i]);
    free(t->lora_names);
    t->lora_names = calloc((size_t)t->lora->n_params + 1, sizeof *t->lora_names);
    if (!t->lora_names) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->n_lora_names = t->lora->n_params;
    for (int i = 0; i < t->lora->n_params; i++) {
        char buf[MMC_MODULE_NAME + 32];
        snprintf(buf, sizeof buf, "%s.lora_%c.weight", t->lora->names[i / 2], i % 2 ? 'B' : 'A');
        if (!(t->lora_names[i] = strdup(buf))) return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    return MMC_OK;
}

/* QLoRA under tensor parallelism: each rank quantises its own slices, which is the same as
 * slicing one process's quantisation when every slice holds whole NF4 blocks of 64 — a
 * column-parallel [N/tp, K] slice starts at a multiple of 64 in the flat weight, a row-parallel
 * [N, K/tp] slice's rows are whole blocks (K/tp a multiple of 64); double quantisation's
 * second-level statistics (blocks of 256 scales, their mean) are then per rank's slice. Otherwise
 * the blocks would straddle the ranks: refused, naming the module. */
static mmc_status tp_nf4_check(mmc_trainer *t, const mmc_module_list *ql) {
    for (int i = 0; i < ql->n; i++) {
        const mmc_tensor *w = ql->mods[i]->w;
        if (!w || w->ndim != 2) continue;
        const int split = lm_split_of(t, w);
        const int64_t n = w->shape[0], k = w->shape[1];
        const bool ok = split == 1 ? k % MMC_NF4_BLOCK == 0 : split == 0 ? (n * k) % MMC_NF4_BLOCK == 0 : true;
        if (!ok)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.quantization nf4 with tensor_parallel %d: %s's slice [%lld, %lld] "
                             "does not hold whole NF4 blocks of %d (%s), so the ranks' blocks would not be one "
                             "process's; use a tensor_parallel that keeps the slices whole blocks, or tensor_parallel 1",
                             t->cfg->file, t->tp_size, w->name, (long long)n, (long long)k, MMC_NF4_BLOCK,
                             split == 1 ? "in_features / tensor_parallel is not a multiple of 64"
                                        : "rows x in_features is not a multiple of 64");
    }
    return MMC_OK;
}

/* QLoRA: quantise the decoder projections to NF4 (their dense copies leave the param lists);
 * LoRA: attach adapters to the target modules (PEFT semantics; the seed initialises A). */
static mmc_status setup_lora(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    if (c->model.lora.r <= 0) return MMC_OK;
    mmc_status st;
    if (c->model.quantization.method == MMC_QUANT_NF4) {
        /* memory of the quantised weights before (as model.dtype keeps them) and after (NF4 codes
         * + absmax scales, double-quantised or not), for the start-up report */
        mmc_module_list ql = {0};
        const int64_t esz = c->model.dtype == MMC_RUN_BF16 ? 2 : 4;
        if ((st = mmc_qwen2_linears(t->lm, "", &ql))) return st;
        if (t->tpc && (st = tp_nf4_check(t, &ql))) { mmc_module_list_free(&ql); return st; }
        for (int i = 0; i < ql.n; i++)
            if (ql.mods[i]->w) {
                t->quant_numel += mmc_numel(ql.mods[i]->w);
                t->quant_dense_bytes += mmc_numel(ql.mods[i]->w) * esz;
            }
        st = mmc_qwen2_quantize_nf4(t->lm, c->model.quantization.double_quant);
        for (int i = 0; !st && i < ql.n; i++)
            if (ql.mods[i]->q) t->quant_nf4_bytes += (int64_t)mmc_nf4_bytes(ql.mods[i]->q);
        mmc_module_list_free(&ql);
        if (st) return mmc_error_prefix(st, "model.quantization");
    }
    mmc_module_list ml = {0};
    st = t->wan ? mmc_wan_linears(t->wan, &ml) : t->flux ? mmc_flux_linears(t->flux, &ml) : t->sd3 ? mmc_sd3_linears(t->sd3, &ml)
         : t->unet ? mmc_unet_linears(t->unet, &ml) : t->hy ? mmc_hunyuan_dit_linears(t->hy, &ml)
         : t->vl ? mmc_qwen2_vl_linears(t->vl, &ml) : t->llava ? mmc_llava_linears(t->llava, &ml)
         : t->omni ? mmc_omni_linears(t->omni, &ml) : t->internvl ? mmc_internvl_linears(t->internvl, &ml)
         : mmc_qwen2_linears(t->lm, "model.", &ml);
    mmc_lora_config lc = {.r = (int)c->model.lora.r, .alpha = (float)c->model.lora.alpha,
                          .dropout = (float)c->model.lora.dropout,
                          .targets = (const char *const *)c->model.lora.targets.items,
                          .n_targets = c->model.lora.targets.n, .seed = (uint64_t)c->training.seed};
    /* model.lora.init: start from a saved PEFT adapter (its rank, alpha and targets) */
    if (!st && c->model.lora.init) {
        st = mmc_lora_load(c->model.lora.init, &ml, true, &t->lora);
        if (!st && t->lora->r != (int)c->model.lora.r)
            st = mmc_error(MMC_ERR_INVALID, "%s has rank %d but model.lora.r is %lld", c->model.lora.init, t->lora->r,
                           (long long)c->model.lora.r);
    } else if (!st) {
        st = mmc_lora_attach(&ml, &lc, &t->lora);
    }
    mmc_module_list_free(&ml);
    if (st) return mmc_error_prefix(st, "model.lora");
    if (t->tpc && (st = tp_lora_setup(t))) return st;   /* (before the sequence-parallel flag: same splits) */
    return lora_names_build(t);
}

/* Freeze, create bf16 copies + fp32 masters, and the optimizer. */
static mmc_status setup_params(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    const int n_lora = t->lora ? t->lora->n_params : 0;
    t->opt = calloc((size_t)(t->n_params + n_lora), sizeof *t->opt);
    t->opt_model = calloc((size_t)(t->n_params + n_lora), sizeof *t->opt_model);
    t->opt_names = calloc((size_t)(t->n_params + n_lora), sizeof *t->opt_names);
    if (!t->opt || !t->opt_model || !t->opt_names) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_params; i++) {
        mmc_tensor *p = t->params[i];
        /* with LoRA the whole base model is frozen, as PEFT does */
        /* LLaVA's CLIP tower (InternVL's InternViT, the Omni thinker's audio encoder, vision tower and merger) is
         * frozen unless model.freeze is given (then the list decides) */
        const uint32_t fmask = c->model.freeze_mask |
                               ((t->llava || t->internvl) && !c->model.freeze.items ? MMC_FREEZE_VISION : 0u) |
                               (t->omni && !c->model.freeze.items ? MMC_FREEZE_AUDIO | MMC_FREEZE_VISION | MMC_FREEZE_MERGER
                                                                  : 0u);
        bool frozen = t->lora || (component_of(t->names[i]) & fmask) != 0;
        if (frozen) p->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        else p->flags |= MMC_REQUIRES_GRAD | MMC_PARAM;
        bool to_bf16 = c->model.dtype == MMC_RUN_BF16 && p->ndim >= 2 && p->dtype == MMC_F32;
        mmc_tensor *master = p;
        if (to_bf16) {
            /* swap buffers: p keeps its identity (the model's slots point at it) but holds bf16;
             * the fresh tensor takes the fp32 buffer and becomes the master */
            mmc_tensor *h = mmc_tensor_new(MMC_BF16, p->ndim, p->shape);
            if (!h) return MMC_ERR_OOM;
            mmc_convert(h->data, MMC_BF16, p->data, MMC_F32, mmc_numel(p));
            void *f32 = p->data;
            p->data = h->data;
            p->dtype = MMC_BF16;
            h->data = f32;
            h->dtype = MMC_F32;
            snprintf(h->name, sizeof h->name, "%s", p->name);
            master = h;
            if (frozen) { mmc_tensor_free(h); continue; }   /* frozen: no master needed */
            h->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        }
        if (frozen) continue;
        t->opt[t->n_opt] = master;
        t->opt_model[t->n_opt] = p;
        t->opt_names[t->n_opt] = t->names[i];
        t->n_opt++;
    }
    for (int i = 0; i < n_lora; i++) {
        mmc_tensor *p = t->lora->params[i];
        p->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        t->opt[t->n_opt] = t->opt_model[t->n_opt] = p;
        t->opt_names[t->n_opt++] = t->lora_names[i];
    }
    /* (the vision tower's own pipeline stage may train nothing: a frozen tower and embedding, LoRA on
     * the language model only; the decoder stages check the rest) */
    if (t->n_opt == 0 && !(t->pp_size > 1 && t->pp_rank == 0 && c->parallel.pipeline_vision_stage))
        return mmc_error(MMC_ERR_INVALID, "%s: model.freeze leaves nothing to train", c->file);
    mmc_adamw_opts o = {.lr = c->optimizer.lr, .beta1 = c->optimizer.beta1, .beta2 = c->optimizer.beta2,
                        .eps = c->optimizer.eps, .weight_decay = c->optimizer.weight_decay};
    mmc_status st = mmc_adamw_init(&t->adamw, &o, t->opt, t->n_opt);
    if (st) return st;
    t->sched = (mmc_schedule){.kind = (mmc_sched_kind)c->optimizer.schedule, .lr = c->optimizer.lr,
                              .min_lr = c->optimizer.min_lr, .warmup_steps = c->optimizer.warmup_steps,
                              .total_steps = c->training.steps};
    return MMC_OK;
}

/* Where a trained parameter sits in the forward, for "does a gradient flow through unit u":
 * vision blocks come first (the patch embedding before them), then the decoder layers (the
 * merger and the token embeddings before them); anything else (final norm, lm_head) is
 * downstream of every unit. Sets *vis / *lm to the first vision block / decoder layer it
 * precedes or belongs to (INT_MAX: none). */
static void grad_source(const char *name, int *vis, int *lm) {
    const char *v = strstr(name, "visual.blocks."), *l = strstr(name, "layers.");
    *vis = *lm = INT_MAX;
    if (strstr(name, "visual.")) {
        *lm = -1;   /* every decoder layer reads image features */
        if (v) *vis = atoi(v + 14);
        else if (!strstr(name, "visual.merger")) *vis = -1;   /* patch embedding */
    } else if (strstr(name, "embed_tokens") || strstr(name, "tok_embeddings") || strstr(name, "multi_modal_projector.")) {
        *lm = -1;
    } else if (l) {
        *lm = atoi(l + 7);
    }
}

/* The unit of an HF parameter name: decoder layer N -> N, vision block N -> nl + N, else -1
 * (the root: embeddings, final norm, lm_head, patch embedding, merger). LoRA names too. */
static int unit_of_name(const char *name, int nl, int nv) {
    const char *v = strstr(name, "visual.blocks."), *l = strstr(name, "layers.");
    if (v) {
        int b = atoi(v + 14);
        return b >= 0 && b < nv ? nl + b : -1;
    }
    if (l && !strstr(name, "visual.") && strncmp(name, "vision_tower.", 13)) {
        int k = atoi(l + 7);
        return k >= 0 && k < nl ? k : -1;
    }
    return -1;
}

/* The distributed runtime (started here unless already running) and this process's rank; the watchdog
 * timeout is parallel.timeout, unless MMC_DIST_TIMEOUT is set. */
static mmc_status start_world(mmc_trainer *t, const mmc_run_config *cfg) {
    const char *tenv = getenv("MMC_DIST_TIMEOUT");
    const bool env_timeout = tenv && atof(tenv) > 0;
    if (!(t->world = mmc_dist_world())) {
        mmc_dist_opts dop = {.backend = MMC_DIST_AUTO, .timeout_s = env_timeout ? 0 : cfg->parallel.timeout};
        mmc_status st = mmc_dist_init(&dop, &t->world);
        if (st) return st;
        t->owns_dist = true;
    } else if (!env_timeout && cfg->parallel.timeout > 0) {
        mmc_dist_set_timeout(cfg->parallel.timeout);
    }
    t->rank = mmc_comm_rank(t->world);
    return MMC_OK;
}

mmc_status mmc_trainer_new(const mmc_run_config *cfg, bool resume, mmc_trainer **out) {
    *out = NULL;
    mmc_trainer *t = calloc(1, sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->cfg = cfg;
    if (cfg->training.threads > 0) mmc_set_num_threads((int)cfg->training.threads);
    if (mmc_trainer_is_contrastive_dir(cfg->model.path)) {   /* dual encoders: trainer_contrastive.c's own loop */
        t->contrastive = true;
        t->contrastive_resume = resume;
        if (cfg->parallel.data_parallel > 1 || mmc_dist_launched()) {   /* its ranks: data parallelism only */
            mmc_status s0 = start_world(t, cfg);
            if (s0) { free(t); return s0; }
        }
        *out = t;
        return MMC_OK;
    }
    mmc_status st;
    char ckpt[2048] = "";
    /* data parallelism: every rank checks the layout before any work, so a bad config fails
     * with the same message on every rank instead of hanging in the first collective */
    if ((st = start_world(t, cfg))) goto fail;
    t->world_size = mmc_comm_size(t->world);
    t->tp_size = (int)cfg->parallel.tensor_parallel;
    t->pp_size = 1;
    if (cfg->parallel.pipeline_parallel > 1) {   /* pipeline stages (trainer_pp.c): their own layout and groups */
        if ((st = mmc_trainer_pp_layout(t))) goto fail;
        goto layout_done;
    }
    if ((t->cp_size = (int)cfg->parallel.context_parallel) > 1) {   /* Ulysses: cp groups x dp replicas */
        if ((st = mmc_cp_trainer_layout(t))) goto fail;
        goto layout_done;
    }
    if (t->tp_size > t->world_size) {
        st = mmc_error(MMC_ERR_INVALID, "%s: parallel.tensor_parallel %d is larger than the job's %d process%s: a "
                       "tensor-parallel group needs that many ranks; launch with mpirun -np %d (or a multiple)",
                       cfg->file, t->tp_size, t->world_size, t->world_size == 1 ? "" : "es", t->tp_size);
        goto fail;
    }
    if (t->world_size % t->tp_size) {
        st = mmc_error(MMC_ERR_INVALID, "%s: the job's %d processes do not divide into tensor-parallel groups of %d "
                       "(parallel.tensor_parallel); launch a multiple of %d processes", cfg->file, t->world_size,
                       t->tp_size, t->tp_size);
        goto fail;
    }
    t->dp_size = t->world_size / t->tp_size;
    /* at tp > 1 data_parallel may be left out (1): it is world / tensor_parallel */
    if (cfg->parallel.data_parallel != t->dp_size && !(t->tp_size > 1 && cfg->parallel.data_parallel == 1)) {
        if (t->tp_size > 1)
            st = mmc_error(MMC_ERR_INVALID, "%s: parallel.data_parallel %lld x tensor_parallel %d is not the job's %d "
                           "processes; set data_parallel: %d or leave it out", cfg->file,
                           (long long)cfg->parallel.data_parallel, t->tp_size, t->world_size, t->dp_size);
        else
            st = mmc_error(MMC_ERR_INVALID, "%s: parallel.data_parallel is %lld but the job has %d process%s (rank %d); "
                       "launch with mmc launch -n %lld (or mpirun -np %lld), or set parallel.data_parallel: %d",
                       cfg->file, (long long)cfg->parallel.data_parallel, t->world_size,
                       t->world_size == 1 ? "" : "es", t->rank, (long long)cfg->parallel.data_parallel,
                       (long long)cfg->parallel.data_parallel, t->world_size);
        goto fail;
    }
    if (t->tp_size > 1) {
        if (cfg->training.gradient_accumulation % t->dp_size) {
            st = mmc_error(MMC_ERR_INVALID, "%s: data.batch_size %lld does not divide into %d data-parallel replicas "
                           "(world %d / tensor_parallel %d) x micro_batch_size %lld", cfg->file,
                           (long long)cfg->data.batch_size, t->dp_size, t->world_size, t->tp_size,
                           (long long)cfg->data.micro_batch_size);
            goto fail;
        }
        mmc_dist_layout lay = {.tensor = t->tp_size, .data = t->dp_size};
        if ((st = mmc_dist_layout_groups(t->world, &lay, &t->groups))) goto fail;
        t->have_groups = true;
        t->tpc = t->groups.tp;
        t->dpc = t->groups.dp;
        t->dp_rank = t->groups.dp_rank;
    } else {
        t->dpc = t->world;
        t->dp_rank = t->rank;
    }
    /* expert parallelism: groups of expert_parallel data-parallel ranks at the same tp rank */
    if (cfg->parallel.expert_parallel > 1 && (st = mmc_ep_trainer_groups(t))) goto fail;
layout_done:
    if (resume) {
        int64_t step;
        if ((st = mmc_checkpoint_latest(cfg->training.output_dir, &step, ckpt, sizeof ckpt))) {
            st = mmc_error(st, "--resume: no complete checkpoint-<step> directory in %s (%s)",
                           cfg->training.output_dir, mmc_last_error());
            goto fail;
        }
    }
    /* a LoRA checkpoint holds the adapters only: the base comes from model.path / model.init */
    /* ... and so does a ZeRO-3 one, whose trained parameters are read from its shards */
    if ((st = load_model(t, resume && cfg->model.lora.r <= 0 && !mmc_dp_checkpoint_params_sharded(ckpt) ? ckpt
                                                                                                       : cfg->model.path)))
        goto fail;
    if ((st = hetero_check(t))) goto fail;   /* per-modality plans against the model and the world */
    /* LoRA under pipeline parallelism: attached to the whole model first (so each adapter starts
     * as one process's does: the same A and dropout stream), then the stage keeps its own */
    const bool lora_first = t->pp_size > 1;
    if (lora_first && (st = setup_lora(t))) goto fail;
    if (t->pp_size > 1 && (st = mmc_trainer_pp_setup(t))) goto fail;   /* keep this stage's layers */
    if (lora_first && t->lora && (st = lora_names_build(t))) goto fail;
    if (t->cpc && (st = mmc_cp_trainer_check(t))) goto fail;        /* text Qwen2, heads % cp */
    if (!lora_first && (st = setup_lora(t))) goto fail;
    if ((st = build_param_list(t))) goto fail;
    if ((st = setup_params(t))) goto fail;
    if (t->tpc) t->lm->sp = cfg->parallel.sequence_parallel;
    if (t->tpc)   /* chunked all-reduce of the row-parallel outputs, overlapped with the next chunk's GEMM */
        for (int64_t l = 0; l < t->lm->cfg.num_layers; l++) t->lm->layers[l].tp_chunks = (int)cfg->parallel.tp_comm_chunks;
    if (t->tpc) {   /* each trained tensor's split, from the model's (masters follow their bf16 tensor) */
        if (!(t->opt_split = calloc((size_t)t->n_opt + 1, 1))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        for (int i = 0; i < t->n_opt; i++) {
            t->opt_split[i] = (signed char)lm_split_of(t, t->opt_model[i]);
            for (int k = 0; t->lora && k < t->lora->n_params; k++)
                if (t->lora->params[k] == t->opt_model[i]) t->opt_split[i] = t->lora_split[k];
        }
    }
    if ((cfg->parallel.hetero || cfg->parallel.hetero_audio) && t->tpc && !t->pp && (st = hetero_setup(t))) goto fail;   /* (cp: mmc_cp_trainer_reduce sums) */
    if (cfg->parallel.hetero && t->pp && (st = mmc_trainer_pp_hetero_setup(t))) goto fail;   /* (pp: trainer_pp_hetero.c) */
    if (mmc_trainer_diffusion(t) && (cfg->model.recompute == MMC_RECOMPUTE_ATTENTION || cfg->model.recompute_layers ||
                                      cfg->model.offload_layers)) {
        st = mmc_error(MMC_ERR_INVALID, "%s: model.recompute: attention, model.recompute_layers and "
                       "model.offload_layers apply to language-model decoder layers; a diffusion model takes "
                       "model.recompute: full (every block)", cfg->file);
        goto fail;
    }
    if (!(t->ctx = mmc_ctx_new())) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    mmc_rng_init(&t->rng, (uint64_t)cfg->training.seed);
    if (mmc_trainer_diffusion(t)) {
        st = mmc_trainer_flux_data_open(t);
        t->src.kind = SRC_FLUX;
        t->src.mb = cfg->data.micro_batch_size;
    } else if ((t->vl || t->llava || t->omni || t->internvl) && is_dataset(cfg->data.train)) {
        st = loader_open(t);
    } else {
        st = src_open(&t->src, cfg, t->lm->cfg.vocab_size);
    }
    if (!st && t->omni && t->src.kind != SRC_LOADER)
        st = mmc_error(MMC_ERR_INVALID, "data.train %s: qwen2_5_omni_thinker trains on a JSON/JSONL dataset (messages "
                       "+ audios / images)", cfg->data.train);
    if (!st && (t->llava || t->internvl) && t->src.kind != SRC_LOADER)
        st = mmc_error(MMC_ERR_INVALID, "data.train %s: llava / internvl train on a JSON/JSONL dataset (messages + images)",
                       cfg->data.train);
    if (!st && t->src.pixels && !t->vl)
        st = mmc_error(MMC_ERR_INVALID, "data.train %s: has images (pixel_values) but the model is a text qwen2",
                       cfg->data.train);
    if (st) goto fail;
    if (t->src.kind == SRC_FIXED && t->src.N < t->dp_size) {
        st = mmc_error(MMC_ERR_INVALID, "data.train %s has %lld samples, fewer than the %d data-parallel ranks "
                       "(rank %d): use fewer processes or more data", cfg->data.train, (long long)t->src.N,
                       t->dp_size, t->rank);
        goto fail;
    }
    if (cfg->training.ema_decay > 0) {   /* the EMA starts at the initial weights */
        t->ema = calloc((size_t)t->n_opt + 1, sizeof *t->ema);
        if (!t->ema) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        for (int i = 0; i < t->n_opt; i++) {
            if (!(t->ema[i] = malloc((size_t)mmc_numel(t->opt[i]) * sizeof(float)))) {
                st = mmc_error(MMC_ERR_OOM, "out of memory for the EMA weights");
                goto fail;
            }
            memcpy(t->ema[i], t->opt[i]->data, (size_t)mmc_numel(t->opt[i]) * sizeof(float));
        }
    }
    if (resume && (st = t->tpc ? tp_restore(t, ckpt) : mmc_trainer_restore(t, ckpt))) goto fail;
    if (mmc_trainer_diffusion(t) && (t->world_size > 1 || cfg->parallel.zero > 0)) {
        /* diffusion: plain bucketed all-reduce / ZeRO-1/2 over the transformer's parameters (no units) */
        if ((st = mmc_dp_new(t->dpc, (int)cfg->parallel.zero, t->opt_model, t->opt, t->n_opt, 0, &t->adamw.o, NULL,
                             &t->dp)))
            goto fail;
        if (cfg->parallel.zero >= 1) {
            mmc_dp_scatter_state(t->dp, &t->adamw);
            mmc_adamw_free(&t->adamw);
        }
    } else if (t->epc) {   /* expert parallelism: gradients reduced per kind after backward (mmc_ep_trainer_reduce) */
        st = mmc_ep_trainer_setup(t);
        if (st) goto fail;
    } else if (t->pp && cfg->parallel.zero > 0) {   /* ZeRO-1/2/3 within each stage's data-parallel group */
        if ((st = mmc_trainer_pp_zero(t))) goto fail;
        if (t->tpc && (st = partial_setup(t))) goto fail;   /* tp's partial gradients summed on the shards */
    } else if (!t->pp && (t->dp_size > 1 || cfg->parallel.zero > 0)) {   /* (pp: trainer_pp.c sums over dp) */
        /* units for ZeRO-3 gathering (and exact bucket readiness under recompute): each decoder
         * layer and each vision block, keyed by its layer struct as the models name it; the
         * vision blocks run first. The untrained parameters go too (ZeRO-3 shards them). */
        const int nl = (int)t->lm->cfg.num_layers, nv = t->vl ? (int)t->vl->visual->cfg.depth : 0;
        int *unit_of = calloc((size_t)t->n_opt + 1, sizeof *unit_of), *fwd = calloc((size_t)(nl + nv) + 1, sizeof *fwd);
        const void **keys = calloc((size_t)(nl + nv) + 1, sizeof *keys);
        mmc_tensor **fz = calloc((size_t)t->n_params + 1, sizeof *fz);
        int *fz_unit = calloc((size_t)t->n_params + 1, sizeof *fz_unit), nfz = 0;
        if (!unit_of || !keys || !fwd || !fz || !fz_unit) {
            free(unit_of); free(keys); free(fwd); free(fz); free(fz_unit);
            st = mmc_error(MMC_ERR_OOM, "out of memory");
            goto fail;
        }
        for (int l = 0; l < nl; l++) { keys[l] = &t->lm->layers[l]; fwd[l] = nv + l; }
        for (int b = 0; b < nv; b++) { keys[nl + b] = &t->vl->visual->blocks[b]; fwd[nl + b] = b; }
        for (int i = 0; i < t->n_opt; i++) unit_of[i] = unit_of_name(t->opt_names[i], nl, nv);
        for (int i = 0; i < t->n_params; i++) {
            bool dup = false;   /* tied weights appear once */
            for (int j = 0; j < nfz && !dup; j++) dup = fz[j] == t->params[i];
            if (t->params[i]->flags & MMC_REQUIRES_GRAD || dup) continue;
            fz_unit[nfz] = unit_of_name(t->names[i], nl, nv);
            fz[nfz++] = t->params[i];
        }
        t->n_frozen = nfz;
        /* a gradient flows through a unit when a trained parameter is upstream of it */
        bool *through = calloc((size_t)(nl + nv) + 1, sizeof *through);
        if (!through) {
            free(unit_of); free(keys); free(fwd); free(fz); free(fz_unit);
            st = mmc_error(MMC_ERR_OOM, "out of memory");
            goto fail;
        }
        int first_vis = INT_MAX, first_lm = INT_MAX;
        for (int i = 0; i < t->n_opt; i++) {
            int v, l;
            grad_source(t->opt_names[i], &v, &l);
            if (v < first_vis) first_vis = v;
            if (l < first_lm) first_lm = l;
        }
        for (int l = 0; l < nl; l++) through[l] = first_lm < l;
        for (int b = 0; b < nv; b++) through[nl + b] = first_vis < b;
        mmc_dp_units units = {.unit_of = unit_of, .keys = keys, .n_units = nl + nv, .fwd_pos = fwd,
                              .frozen = fz, .frozen_unit = fz_unit, .n_frozen = nfz, .grad_through = through};
        st = mmc_dp_new(t->dpc, (int)cfg->parallel.zero, t->opt_model, t->opt, t->n_opt, 0, &t->adamw.o, &units,
                        &t->dp);
        free(unit_of);
        free(keys);
        free(fwd);
        free(fz);
        free(fz_unit);
        free(through);
        if (st) goto fail;
        if (t->tpc) mmc_dp_set_tp(t->dp, t->tpc, t->opt_split);   /* the norm over the tp slices */
        if (t->tpc && cfg->parallel.zero >= 1 && (st = partial_setup(t))) goto fail;
        if (cfg->parallel.zero >= 1) {   /* this rank keeps only its shard of the AdamW state */
            mmc_dp_scatter_state(t->dp, &t->adamw);
            mmc_adamw_free(&t->adamw);
        }
    }
    *out = t;
    return MMC_OK;
fail:
    mmc_trainer_free(t);
    return st;
}

void mmc_trainer_free(mmc_trainer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_opt; i++)
        if (t->opt[i] != t->opt_model[i]) {
            t->opt[i]->grad = NULL;   /* shared with the model tensor */
            mmc_tensor_free(t->opt[i]);
        }
    mmc_adamw_free(&t->adamw);
    if (t->ema) for (int i = 0; i < t->n_opt; i++) free(t->ema[i]);
    free(t->ema);
    mmc_dp_free(t->dp);
    mmc_trainer_pp_hetero_free(t);
    mmc_pp_free(t->pp);
    free(t->opt);
    free(t->opt_model);
    free(t->opt_names);
    if (t->name_store) for (int i = 0; i < t->n_params; i++) free(t->name_store[i]);
    free(t->name_store);
    free(t->names);
    free(t->params);
    mmc_lora_free(t->lora);
    if (t->lora_names) for (int i = 0; i < t->n_lora_names; i++) free(t->lora_names[i]);
    free(t->lora_names);
    src_close(&t->src);   /* first: the loader's worker threads read the feature extractor, tokenizer, options */
    for (int i = 0; i < t->n_omni_views; i++) mmc_tensor_free(t->omni_views[i]);
    free(t->omni_views);
    if (t->omni_fe.mel_filters || t->omni_fe.priv) mmc_whisper_fe_free(&t->omni_fe);
    if (t->vl) mmc_qwen2_vl_free(t->vl);
    else if (t->llava) mmc_llava_free(t->llava);
    else if (t->omni) mmc_omni_free(t->omni);
    else if (t->internvl) mmc_internvl_free(t->internvl);
    else mmc_qwen2_free(t->lm);
    mmc_flux_free(t->flux);
    mmc_sd3_free(t->sd3);
    mmc_unet_free(t->unet);
    mmc_hunyuan_dit_free(t->hy);
    mmc_fm_data_free(t->fm);
    mmc_wan_free(t->wan);
    mmc_wan_data_free(t->wd);
    mmc_tokenizer_free(t->tok);
    mmc_data_opts_free(&t->dopts);
    free(t->config_text);
    if (t->ctx) mmc_ctx_free(t->ctx);
    free(t->h_step);
    free(t->h_loss);
    free(t->h_lr);
    free(t->opt_split);
    free(t->lora_split);
    free(t->lora_partial);
    free(t->hetero_idx);
    free(t->hetero_buf);
    free(t->partial_sel);
    free(t->ep_split);
    free(t->moe_tokens);
    mmc_comm_free(t->epc);
    mmc_comm_free(t->edpc);
    if (t->have_groups) mmc_dist_groups_free(&t->groups);
    if (t->owns_dist) mmc_dist_finalize();
    free(t);
}

int64_t mmc_trainer_step_count(const mmc_trainer *t) { return t->step; }

int mmc_trainer_params(mmc_trainer *t, mmc_tensor ***params, const char *(**names)) {
    *params = t->params;
    *names = t->names;
    return t->n_params;
}

void mmc_trainer_memory(const mmc_trainer *t, int64_t *trainable, int64_t *state_bytes) {
    int64_t n = 0, bytes = 0;
    for (int i = 0; i < t->n_opt; i++) {
        int64_t k = mmc_numel(t->opt[i]);
        n += k;
        bytes += 2 * k * 4 + (t->opt[i] != t->opt_model[i] ? k * 4 : 0);
    }
    if (t->dp && t->cfg->parallel.zero >= 1) {   /* moments are sharded; masters only with ZeRO-3 */
        mmc_dp_memory m;
        mmc_dp_get_memory(t->dp, &m);
        bytes = m.optim;
        if (t->cfg->parallel.zero < 3)   /* ZeRO-3: the fp32 masters are the parameter shards */
            for (int i = 0; i < t->n_opt; i++) bytes += t->opt[i] != t->opt_model[i] ? mmc_numel(t->opt[i]) * 4 : 0;
    }
    if (trainable) *trainable = n;
    if (state_bytes) *state_bytes = bytes;
}

/* ------------------------------------------------------------------ per-modality plans (mmc_hetero.h)
 * parallel.vision / audio / projector were checked against each other by the config; here against
 * the model that was loaded and the job's ranks. */
static mmc_status hetero_check(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    const mmc_parallel_cfg *p = &c->parallel;
    const bool vision = t->vl || t->llava || t->internvl || t->omni, audio = t->omni != NULL;
    const struct { const mmc_module_plan *m; const char *name; bool have; const char *what; } mods[3] = {
        {&p->vision, "vision", vision, "vision tower"}, {&p->projector, "projector", vision, "projector"},
        {&p->audio, "audio", audio, "audio encoder"}};
    for (int i = 0; i < 3; i++) {
        const mmc_module_plan *m = mods[i].m;
        if (!m->data_parallel && !m->tensor_parallel && !m->pipeline_parallel && !m->context_parallel) continue;
        if (!mods[i].have)
            return mmc_error(MMC_ERR_INVALID, "%s: parallel.%s is set but the model (%s) has no %s; remove it",
                             c->file, mods[i].name, t->lm && t->lm->moe ? "qwen2_moe" : t->vl ? "qwen2_vl" : "a "
                             "text model", mods[i].what);
        const int64_t mt = m->tensor_parallel ? m->tensor_parallel : 1;
        if (m->data_parallel && mt * m->data_parallel != t->world_size)
            return mmc_error(MMC_ERR_INVALID, "%s: parallel.%s: tensor_parallel %lld x data_parallel %lld = %lld ranks, "
                             "but the job has %d: every component runs on all the job's ranks; use data_parallel "
                             "%lld", c->file, mods[i].name, (long long)mt, (long long)m->data_parallel,
                             (long long)(mt * m->data_parallel), t->world_size,
                             (long long)(t->world_size / mt > 0 ? t->world_size / mt : 1));
    }
    if (p->hetero && !t->vl && !(t->omni && t->tp_size > 1))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.vision data-parallel while the language model is at "
                         "tensor_parallel %d x pipeline_parallel %d x context_parallel %d: implemented for Qwen2-VL / "
                         "Qwen2.5-VL (tp, pp or cp) and the Qwen2.5-Omni thinker (tp)", c->file, t->tp_size,
                         t->pp_size > 1 ? t->pp_size : 1, t->cp_size);
    if (p->hetero_audio && !(t->omni && t->tp_size > 1))   /* (no audio encoder: refused above) */
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.audio data-parallel while the language model is at "
                         "tensor_parallel %d: implemented for the Qwen2.5-Omni thinker", c->file, t->tp_size);
    return MMC_OK;
}

/* ZeRO >= 1 under tensor parallelism: which trained tensors' gradients are partial on each tp
 * rank — the replicated parameters under sequence parallelism, a LoRA factor kept whole beside a
 * split one, a data-parallel tower's (hetero plan) — summed over tp on the ZeRO shards
 * (mmc_dp_reduce_partial) instead of on full gradients ZeRO no longer keeps */
static mmc_status partial_setup(mmc_trainer *t) {
    if (!(t->partial_sel = calloc((size_t)t->n_opt + 1, sizeof *t->partial_sel)))
        return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_opt; i++) {
        const mmc_tensor *p = t->opt_model[i];
        for (int k = 0; t->lm->sp && k < t->lm->n_params; k++)
            if (t->lm->params[k] == p && t->lm->param_split[k] < 0) t->partial_sel[i] = true;
        for (int k = 0; t->lora_partial && k < t->lora->n_params; k++)
            if (t->lora->params[k] == p && t->lora_partial[k]) t->partial_sel[i] = true;
    }
    for (int k = 0; k < t->n_hetero; k++) t->partial_sel[t->hetero_idx[k]] = true;
    return MMC_OK;
}

/* the gradients each tp rank holds a part of, summed over tp: with ZeRO >= 1 on the shards */
static mmc_status partial_reduce(mmc_trainer *t) {
    if (t->partial_sel) return mmc_dp_reduce_partial(t->dp, t->tpc, t->partial_sel);
    mmc_status st;
    for (int i = 0; t->tpc && t->lm->sp && i < t->lm->n_params; i++) {   /* sp: the replicated parameters */
        mmc_tensor *g = t->lm->param_split[i] < 0 ? t->lm->params[i]->grad : NULL;
        if (g && (st = mmc_all_reduce(t->tpc, g->data, g->data, mmc_numel(g), MMC_F32, MMC_SUM))) return st;
    }
    if (t->n_hetero && (st = hetero_reduce(t))) return st;   /* per-modality plan: the tower's gradients */
    for (int i = 0; t->lora_partial && i < t->lora->n_params; i++) {   /* a LoRA factor kept whole */
        mmc_tensor *g = t->lora_partial[i] ? t->lora->params[i]->grad : NULL;
        if (g && (st = mmc_all_reduce(t->tpc, g->data, g->data, mmc_numel(g), MMC_F32, MMC_SUM))) return st;
    }
    return MMC_OK;
}

/* the trained tensors of the data-parallel encoders (LoRA factors included): the tower's (names holding
 * "visual.") under parallel.vision, the audio encoder's ("audio_tower.") under parallel.audio.
 * MMC_HETERO_NO_REDUCE=1 leaves them out (a test control: the sum over the group is then missing). */
static mmc_status hetero_setup(mmc_trainer *t) {
    if (!(t->hetero_idx = calloc((size_t)t->n_opt + 1, sizeof *t->hetero_idx))) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->n_hetero = 0;
    t->hetero_numel = 0;
    const bool vis = t->cfg->parallel.hetero, aud = t->cfg->parallel.hetero_audio;
    const char *ctl = getenv("MMC_HETERO_NO_REDUCE");
    if (ctl && *ctl && strcmp(ctl, "0")) return MMC_OK;
    for (int i = 0; i < t->n_opt; i++)
        if ((vis && strstr(t->opt_names[i], "visual.")) || (aud && strstr(t->opt_names[i], "audio_tower."))) {
            t->hetero_idx[t->n_hetero++] = i;
            t->hetero_numel += mmc_numel(t->opt[i]);
        }
    if (t->hetero_numel && !(t->hetero_buf = malloc(sizeof(float) * (size_t)t->hetero_numel)))
        return mmc_error(MMC_ERR_OOM, "out of memory for the vision tower's gradients (%lld floats)",
                         (long long)t->hetero_numel);
    return MMC_OK;
}

/* Sum the tower's gradients over the tp group (after the dp reducer summed them over the replicas:
 * the two groups together are the world, so each is then the whole batch's). A rank whose share
 * of every micro-batch was empty contributes zeros. One all-reduce of the packed gradients. */
static mmc_status hetero_reduce(mmc_trainer *t) {
    return mmc_trainer_sum_grads(t, t->tpc, t->hetero_idx, t->n_hetero, t->hetero_buf, NULL);
}

/* Sum the gradients of the trained tensors opt_model[idx[0 .. n-1]] over group g: packed into buf
 * (their total size), one all-reduce, unpacked (a rank without a gradient adds zeros). skip_env: a
 * test hook's variable that leaves the sum out (the control that must fail parity), or NULL. */
mmc_status mmc_trainer_sum_grads(mmc_trainer *t, mmc_comm *g, const int *idx, int n, float *buf, const char *skip_env) {
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        mmc_tensor *p = t->opt_model[idx[k]];
        memcpy(buf + at, mmc_grad(t->ctx, p)->data, sizeof(float) * (size_t)mmc_numel(p));
        at += mmc_numel(p);
    }
    if (skip_env && getenv(skip_env)) return MMC_OK;
    mmc_status st = mmc_all_reduce(g, buf, buf, at, MMC_F32, MMC_SUM);
    if (st) return st;
    at = 0;
    for (int k = 0; k < n; k++) {
        mmc_tensor *p = t->opt_model[idx[k]];
        memcpy(p->grad->data, buf + at, sizeof(float) * (size_t)mmc_numel(p));
        at += mmc_numel(p);
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ tensor parallelism: checkpoints
 * A checkpoint holds full tensors (HF safetensors, full AdamW moments and masters) whatever tp
 * wrote it, so it loads at any tp (and in transformers). To save, every split tensor — the
 * model's, the fp32 masters, the moments — is gathered over the tp group and swapped in for
 * the local slice while the ordinary writer runs; to restore, full-size buffers are swapped in,
 * the ordinary reader fills them, and each rank keeps its slice. */
typedef struct { mmc_tensor *t; void *local; int64_t shape[MMC_MAX_DIMS]; int split; } tp_swap_ent;

/* the split of a model tensor: the language model's or the vision tower's record (a
 * replicated tower has none) */
static int lm_split_of(const mmc_trainer *t, const mmc_tensor *p) {
    for (int k = 0; k < t->lm->n_params; k++)
        if (t->lm->params[k] == p) return t->lm->param_split[k];
    const mmc_vision *v = t->vl ? t->vl->visual : NULL;
    for (int k = 0; v && v->param_split && k < v->n_params; k++)
        if (v->params[k] == p) return v->param_split[k];
    return MMC_TP_REPLICATED;
}
typedef struct { tp_swap_ent *e; int n; float **m_local, **v_local, **ema_local; } tp_swap;

/* rank r's slice along split of a full contiguous tensor of es-byte elements */
static void slice_bytes(const char *full, int ndim0, const int64_t *shape0, int split0, int r, int P, size_t es, char *local) {
    int ndim, split;
    int64_t shape[MMC_MAX_DIMS + 1];
    mmc_tp_view(ndim0, shape0, split0, &ndim, shape, &split);   /* a fused qkv through its [3, n, ...] view */
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < split; k++) outer *= shape[k];
    for (int k = split + 1; k < ndim; k++) inner *= shape[k];
    const int64_t d = shape[split], dl = d / P;
    for (int64_t o = 0; o < outer; o++)
        memcpy(local + (size_t)(o * dl * inner) * es, full + (size_t)((o * d + (int64_t)r * dl) * inner) * es,
               (size_t)(dl * inner) * es);
}

static void tp_to_local(mmc_trainer *t, tp_swap *sw, bool take) {
    const int P = t->tp_size, r = mmc_comm_rank(t->tpc);
    for (int k = 0; k < sw->n; k++) {
        tp_swap_ent *e = &sw->e[k];
        if (take) slice_bytes(e->t->data, e->t->ndim, e->t->shape, e->split, r, P, mmc_dtype_size(e->t->dtype), e->local);
        free(e->t->data);
        e->t->data = e->local;
        memcpy(e->t->shape, e->shape, sizeof e->shape);
        mmc_set_contiguous_strides(e->t);
    }
    for (int i = 0; sw->m_local && i < t->n_opt; i++) {
        if (!sw->m_local[i]) continue;
        if (take) {
            int64_t full[MMC_MAX_DIMS];
            mmc_tp_local_shape(t->opt[i]->ndim, t->opt[i]->shape, -1, 1, full);
            full[t->opt_split[i] == MMC_TP_FUSED3 ? 0 : t->opt_split[i]] *= P;
            mmc_tp_take_slice(t->adamw.m[i], t->opt[i]->ndim, full, t->opt_split[i], r, P, sw->m_local[i]);
            mmc_tp_take_slice(t->adamw.v[i], t->opt[i]->ndim, full, t->opt_split[i], r, P, sw->v_local[i]);
        }
        free(t->adamw.m[i]);
        free(t->adamw.v[i]);
        t->adamw.m[i] = sw->m_local[i];
        t->adamw.v[i] = sw->v_local[i];
    }
    for (int i = 0; sw->ema_local && i < t->n_opt; i++) {
        if (!sw->ema_local[i]) continue;
        if (take && t->ema[i]) {
            int64_t full[MMC_MAX_DIMS];
            mmc_tp_local_shape(t->opt[i]->ndim, t->opt[i]->shape, -1, 1, full);
            full[t->opt_split[i] == MMC_TP_FUSED3 ? 0 : t->opt_split[i]] *= P;
            mmc_tp_take_slice(t->ema[i], t->opt[i]->ndim, full, t->opt_split[i], r, P, sw->ema_local[i]);
        }
        free(t->ema[i]);
        t->ema[i] = sw->ema_local[i];
    }
    free(sw->e);
    free(sw->m_local);
    free(sw->v_local);
    free(sw->ema_local);
    memset(sw, 0, sizeof *sw);
}

/* Swap full-size tensors in (gather: with their gathered values; collective over tp). */
static mmc_status tp_to_full(mmc_trainer *t, bool gather, tp_swap *sw) {
    memset(sw, 0, sizeof *sw);
    const int P = t->tp_size;
    mmc_status st = MMC_OK;
    sw->e = calloc((size_t)(t->n_params + t->n_opt) + 1, sizeof *sw->e);
    sw->m_local = calloc((size_t)t->n_opt + 1, sizeof *sw->m_local);
    sw->v_local = calloc((size_t)t->n_opt + 1, sizeof *sw->v_local);
    sw->ema_local = calloc((size_t)t->n_opt + 1, sizeof *sw->ema_local);
    if (!sw->e || !sw->m_local || !sw->v_local || !sw->ema_local) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    /* the moments first, while opt[i] still has its local shape */
    for (int i = 0; i < t->n_opt && !st; i++) {
        if (t->opt_split[i] < 0 || !t->adamw.m) continue;
        const mmc_tensor *p = t->opt[i];
        int64_t full[MMC_MAX_DIMS];
        mmc_tp_local_shape(p->ndim, p->shape, -1, 1, full);
        full[t->opt_split[i] == MMC_TP_FUSED3 ? 0 : t->opt_split[i]] *= P;
        mmc_tensor *fm = mmc_tensor_new(MMC_F32, p->ndim, full), *fv = mmc_tensor_new(MMC_F32, p->ndim, full);
        if (!fm || !fv) { mmc_tensor_free(fm); mmc_tensor_free(fv); st = MMC_ERR_OOM; break; }
        if (gather) {
            mmc_tensor *lm = mmc_tensor_wrap(MMC_F32, p->ndim, p->shape, t->adamw.m[i]);
            mmc_tensor *lv = mmc_tensor_wrap(MMC_F32, p->ndim, p->shape, t->adamw.v[i]);
            st = mmc_tp_gather(t->tpc, lm, t->opt_split[i], fm);
            if (!st) st = mmc_tp_gather(t->tpc, lv, t->opt_split[i], fv);
            mmc_tensor_free(lm);
            mmc_tensor_free(lv);
        }
        sw->m_local[i] = t->adamw.m[i];
        sw->v_local[i] = t->adamw.v[i];
        /* the buffers change hands: adamw frees them with free() (they are plain allocations) */
        t->adamw.m[i] = malloc(mmc_nbytes(fm));
        t->adamw.v[i] = malloc(mmc_nbytes(fv));
        if (t->adamw.m[i]) memcpy(t->adamw.m[i], fm->data, mmc_nbytes(fm));
        if (t->adamw.v[i]) memcpy(t->adamw.v[i], fv->data, mmc_nbytes(fv));
        mmc_tensor_free(fm);
        mmc_tensor_free(fv);
        if (!t->adamw.m[i] || !t->adamw.v[i]) st = mmc_error(MMC_ERR_OOM, "out of memory");
    }
    for (int i = 0; t->ema && i < t->n_opt && !st; i++) {   /* the EMA of the split tensors, as the moments */
        if (t->opt_split[i] < 0) continue;
        const mmc_tensor *p = t->opt[i];
        int64_t full[MMC_MAX_DIMS];
        mmc_tp_local_shape(p->ndim, p->shape, -1, 1, full);
        full[t->opt_split[i] == MMC_TP_FUSED3 ? 0 : t->opt_split[i]] *= P;
        mmc_tensor *fe = mmc_tensor_new(MMC_F32, p->ndim, full);
        if (!fe) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
        if (gather) {
            mmc_tensor *le = mmc_tensor_wrap(MMC_F32, p->ndim, p->shape, t->ema[i]);
            st = mmc_tp_gather(t->tpc, le, t->opt_split[i], fe);
            mmc_tensor_free(le);
        }
        sw->ema_local[i] = t->ema[i];
        t->ema[i] = malloc(mmc_nbytes(fe));
        if (t->ema[i]) memcpy(t->ema[i], fe->data, mmc_nbytes(fe));
        else st = mmc_error(MMC_ERR_OOM, "out of memory");
        mmc_tensor_free(fe);
    }
    /* the model's tensors and the fp32 masters (each distinct tensor once) */
    for (int pass = 0; pass < 2 && !st; pass++) {
        const int n = pass ? t->n_opt : t->n_params;
        for (int i = 0; i < n && !st; i++) {
            mmc_tensor *p = pass ? t->opt[i] : t->params[i];
            int split = pass ? t->opt_split[i] : lm_split_of(t, p);
            if (split < 0) continue;
            bool dup = false;
            for (int k = 0; k < sw->n && !dup; k++) dup = sw->e[k].t == p;
            if (dup) continue;
            tp_swap_ent *e = &sw->e[sw->n];
            int64_t full[MMC_MAX_DIMS];
            memcpy(full, p->shape, sizeof full);
            full[split == MMC_TP_FUSED3 ? 0 : split] *= P;   /* a fused qkv grows on its rows */
            mmc_tensor *f = mmc_tensor_new(MMC_F32, p->ndim, full);
            if (!f) { st = MMC_ERR_OOM; break; }
            if (gather) st = mmc_tp_gather(t->tpc, p, split, f);
            void *buf = malloc(mmc_nbytes(f) / sizeof(float) * mmc_dtype_size(p->dtype) + 64);
            if (!buf) st = mmc_error(MMC_ERR_OOM, "out of memory");
            else mmc_convert(buf, p->dtype, f->data, MMC_F32, mmc_numel(f));
            mmc_tensor_free(f);
            if (st) { free(buf); break; }
            e->t = p, e->local = p->data, e->split = split;
            memcpy(e->shape, p->shape, sizeof e->shape);
            p->data = buf;
            memcpy(p->shape, full, sizeof full);
            mmc_set_contiguous_strides(p);
            sw->n++;
        }
    }
    if (!st) return MMC_OK;
fail:
    tp_to_local(t, sw, false);
    return st;
}

/* --resume at tp: the model came sliced from the checkpoint's safetensors; the moments and
 * masters are read at full size and sliced. The full buffers start gathered, so that what the
 * reader does not overwrite (the weights themselves) comes back unchanged. */
static mmc_status tp_restore(mmc_trainer *t, const char *dir) {
    tp_swap sw;
    mmc_status st = tp_to_full(t, true, &sw);
    if (st) return st;
    st = mmc_trainer_restore(t, dir);
    tp_to_local(t, &sw, st == MMC_OK);
    return st;
}

/* Sequence parallelism splits the sequence over the tp ranks: a micro-batch whose length is
 * not a multiple of tp gets pad positions appended to every row (id 0, label ignored,
 * positions continuing; a packed row's padded tail, in no segment, just grows). Attention is causal, so
 * the real tokens' outputs and the loss do not change. */
static mmc_status sp_pad_batch(mmc_batch *b, int64_t mult) {
    const int64_t B = b->B, T = b->T, T2 = (T + mult - 1) / mult * mult;
    int32_t *ids = malloc(sizeof *ids * (size_t)(B * T2)), *lab = malloc(sizeof *lab * (size_t)(B * T2));
    int64_t *pos = b->position_ids ? malloc(sizeof *pos * (size_t)(3 * B * T2)) : NULL;
    if (!ids || !lab || (b->position_ids && !pos)) {
        free(ids); free(lab); free(pos);
        return mmc_error(MMC_ERR_OOM, "out of memory padding a micro-batch for sequence parallelism");
    }
    for (int64_t r = 0; r < B; r++)
        for (int64_t t = 0; t < T2; t++) {
            ids[r * T2 + t] = t < T ? b->input_ids[r * T + t] : 0;
            lab[r * T2 + t] = t < T ? b->labels[r * T + t] : MMC_IGNORE_INDEX;
            for (int k = 0; pos && k < 3; k++) {
                const int64_t *src = b->position_ids + (k * B + r) * T;
                pos[(k * B + r) * T2 + t] = t < T ? src[t] : src[T - 1] + (t - T + 1);
            }
        }
    free(b->input_ids); free(b->labels); free(b->position_ids);
    b->input_ids = ids, b->labels = lab, b->position_ids = pos;
    b->T = T2;
    return MMC_OK;
}

/* LLaVA / InternVL under context parallelism: every rank of the group embeds the whole row (the
 * tower replicated, its features' gradient summed over the group) and scores its shard of rows
 * (mmc_cp_embeds_lm_loss), as mmc_cp_qwen2_vl_loss does for Qwen2-VL. */
static mmc_status vlm_cp_loss(mmc_trainer *t, const mmc_batch *b, double scale, mmc_tensor **l, int64_t *n) {
    mmc_tensor *x = NULL;
    mmc_status st = t->internvl ? mmc_internvl_batch_embeds(t->ctx, t->internvl, b, t->cpc, &x)
                                : mmc_llava_batch_embeds(t->ctx, t->llava, b, t->cpc, &x);   /* [B, T, C] */
    if (!st) *l = mmc_cp_embeds_lm_loss(t->ctx, t->lm, t->cpc, b, x, scale, n);
    return st;
}

/* ------------------------------------------------------------------ one step */
mmc_status mmc_trainer_step(mmc_trainer *t, mmc_step_stats *s) {
    const mmc_run_config *c = t->cfg;
    /* data parallelism: this rank takes micro-batches [rank*ga, (rank+1)*ga) of the global
     * batch's data.batch_size / micro_batch_size; the source position stays global */
    const int64_t ga = c->training.gradient_accumulation / t->dp_size;
    const int64_t pos0 = t->src.position;
    t->src.position = pos0 + (int64_t)t->dp_rank * ga;   /* the ranks of a tp group read the same data */
    double t0 = mmc_now();
    if (t->dp) mmc_dp_reset_timing(t->dp);
    memset(s, 0, sizeof *s);
    mmc_batch *mbs = calloc((size_t)ga, sizeof *mbs);
    if (!mbs) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = MMC_OK;
    int64_t got = 0, labels = 0;
    if (t->src.kind == SRC_LOADER && t->dp_size > 1) {
        /* the loader is sequential: skip the micro-batches of the ranks before this one (they
         * are decoded and dropped; a sharded loader would avoid that) */
        t->src.position = pos0;
        for (int64_t k = 0; k < (int64_t)t->dp_rank * ga; k++) {
            mmc_batch skip;
            if ((st = src_next(&t->src, &skip))) goto done;
            batch_release(&skip);
        }
    }
    for (; got < ga; got++) {
        if ((st = src_next(&t->src, &mbs[got]))) goto done;
        labels += mbs[got].n_label_tokens;
        s->tokens += mbs[got].B * mbs[got].T;
        s->samples += mbs[got].B;
    }
    s->data_s = mmc_now() - t0;
    if (t->src.kind == SRC_LOADER && t->dp_size > 1)   /* and past the ranks after it */
        for (int64_t k = t->src.position; k < pos0 + c->training.gradient_accumulation; k++) {
            mmc_batch skip;
            if ((st = src_next(&t->src, &skip))) goto done;
            batch_release(&skip);
        }
    t->src.position = pos0 + c->training.gradient_accumulation;
    if (t->dp_size > 1) {   /* the loss is normalised by the label tokens of the whole global batch */
        int64_t v[3] = {labels, s->tokens, s->samples};
        if ((st = mmc_all_reduce(t->dpc, v, v, 3, MMC_I64, MMC_SUM))) goto done;
        labels = v[0]; s->tokens = v[1]; s->samples = v[2];
    }
    s->label_tokens = labels;
    const double scale = 1.0 / (double)(labels > 0 ? labels : 1);
    /* LLaVA: every trained tensor has a gradient buffer from the first step, so that one no
     * gradient reaches (the projector on a text-only batch) is stepped with a zero gradient
     * whether or not an earlier step of this process touched it (else a resumed run would skip
     * it where the uninterrupted one steps it). DP's reducer hands out its own buffers. */
    for (int i = 0; (t->llava || t->internvl) && !t->dp && i < t->n_opt; i++)
        if (!t->opt_model[i]->grad) mmc_grad(t->ctx, t->opt_model[i]);
    mmc_zero_grad(t->params, t->n_params);
    if (t->lora) mmc_zero_grad(t->lora->params, t->lora->n_params);
    double loss = 0;
    for (int64_t k = 0; t->pp && t->tpc && t->lm->sp && k < ga; k++)   /* sp under pp: T a multiple of tp */
        if (mbs[k].T % t->tp_size && (st = sp_pad_batch(&mbs[k], t->tp_size))) goto done;
    if (t->pp && (st = mmc_trainer_pp_step(t, mbs, ga, scale, &loss))) goto done;   /* 1F1B over the stages */
    for (int64_t k = 0; !t->pp && k < ga; k++) {
        /* LoRA dropout masks: one stream per (seed, step, micro-batch), so a resume redraws them */
        if (t->lora && c->model.lora.dropout > 0)
            mmc_nn_set_dropout_seed(t->ctx, mmc_nn_dropout_seed((uint64_t)c->training.seed, (uint64_t)t->step,
                                                                (uint64_t)k));
        int64_t n;
        mmc_tensor *l = NULL;
        if (t->tpc && t->lm->sp && mbs[k].T % t->tp_size && (st = sp_pad_batch(&mbs[k], t->tp_size))) goto done;
        if (t->cpc && mbs[k].T % t->cp_size && (st = sp_pad_batch(&mbs[k], t->cp_size))) goto done;   /* cp: pad, masked */
        if (t->dp) mmc_dp_forward_begin(t->dp, t->ctx);   /* ZeRO-3: gathers the root unit */
        if (mmc_trainer_diffusion(t)) {
            n = mbs[k].B;
            if ((st = mmc_trainer_flux_loss(t, &mbs[k], scale, &l))) {
                mmc_ctx_reset(t->ctx);
                mmc_error_prefix(st, "step %lld, micro-batch %lld", (long long)t->step + 1, (long long)k + 1);
                goto done;
            }
        } else if (t->cpc && (t->llava || t->internvl)) {   /* the tower replicated, this rank's shard of rows */
            if ((st = vlm_cp_loss(t, &mbs[k], scale, &l, &n))) {
                mmc_ctx_reset(t->ctx);
                if (t->dp) mmc_dp_forward_end(t->dp);
                mmc_error_prefix(st, "step %lld, micro-batch %lld (first sample %lld)", (long long)t->step + 1,
                                 (long long)k + 1, (long long)mbs[k].sample_index);
                goto done;
            }
        } else if (t->vl || t->llava || t->omni || t->internvl) {
            if ((st = t->internvl ? mmc_internvl_batch_loss(t->ctx, t->internvl, &mbs[k], scale, &l, &n)
                      : t->llava  ? mmc_llava_batch_loss(t->ctx, t->llava, &mbs[k], scale, &l, &n)
                      : t->omni   ? mmc_omni_batch_loss(t->ctx, t->omni, &mbs[k], scale, &l, &n)
                      : t->cpc    ? mmc_cp_qwen2_vl_loss(t->ctx, t->vl, t->cpc, &mbs[k], scale, &l, &n)   /* its shard */
                                  : mmc_qwen2_vl_batch_loss(t->ctx, t->vl, &mbs[k], scale, &l, &n))) {
                mmc_ctx_reset(t->ctx);
                if (t->dp) mmc_dp_forward_end(t->dp);
                mmc_error_prefix(st, "step %lld, micro-batch %lld (first sample %lld)", (long long)t->step + 1,
                                 (long long)k + 1, (long long)mbs[k].sample_index);
                goto done;
            }
        } else if (t->lm->moe) {   /* Qwen2-MoE: + the weighted aux load-balancing loss (its gradient in backward) */
            mmc_moe_aux_begin(t->lm->moe);
            l = mmc_qwen2_lm_loss(t->ctx, t->lm, &mbs[k], scale, &n);
            l = mmc_add(t->ctx, l, mmc_scalar(t->ctx, (float)mmc_moe_aux_end(t->lm->moe)));
        } else {
            l = t->cpc ? mmc_cp_qwen2_lm_loss(t->ctx, t->lm, t->cpc, &mbs[k], scale, &n)   /* this rank's shard */
                       : mmc_qwen2_lm_loss(t->ctx, t->lm, &mbs[k], scale, &n);
        }
        float lv = *(const float *)l->data;
        const char *nan_at = getenv("MMC_TRAIN_TEST_NAN_STEP");   /* test hook: inject a NaN loss */
        if (nan_at && atoll(nan_at) == t->step + 1) lv = NAN;
        if (!isfinite(lv) && t->dp_size == 1 && !t->cpc) {   /* (the tp ranks of a replica share the loss; cp: below) */
            mmc_ctx_reset(t->ctx);
            if (t->dp) mmc_dp_forward_end(t->dp);
            st = mmc_error(MMC_ERR_NUMERIC, "step %lld: the loss is %s (micro-batch %lld of %lld, first sample "
                           "%lld); stopping without updating the weights — the last checkpoint is intact; "
                           "lower optimizer.lr or check the data", (long long)t->step + 1,
                           isnan(lv) ? "NaN" : "infinite", (long long)k + 1, (long long)ga,
                           (long long)mbs[k].sample_index);
            goto done;
        }
        loss += lv;
        if (t->dp) mmc_dp_backward(t->dp, t->ctx, l, k == ga - 1);   /* buckets reduce during backward */
        else mmc_backward(t->ctx, l);
        mmc_ctx_reset(t->ctx);
    }
    double norm;
    if (t->dp && !t->pp) {   /* (pp: trainer_pp.c reduced the gradients and summed the loss) */
        /* every rank joins every collective, whatever its micro-batches held; a non-finite
         * loss on any rank stops every rank at the same step */
        if ((st = mmc_dp_finish(t->dp, t->ctx))) goto done;
        if ((st = mmc_all_reduce(t->dpc, &loss, &loss, 1, MMC_F64, MMC_SUM))) goto done;
        if (!isfinite(loss) && !t->cpc) {   /* (cp: checked once summed over the cp group too) */
            st = mmc_error(MMC_ERR_NUMERIC, "step %lld: the loss is not finite on some rank; stopping without "
                           "updating the weights — the last checkpoint is intact", (long long)t->step + 1);
            goto done;
        }
    }
    if (t->cpc && (st = mmc_cp_trainer_reduce(t, &loss))) goto done;   /* cp: weight gradients and loss summed */
    if (t->epc && !t->pp && (st = mmc_ep_trainer_reduce(t, &loss))) goto done;   /* ep: dense over dp, experts over edp
                                                                                  * (pp: trainer_pp.c) */
    if (t->lm && t->lm->moe && (st = mmc_moe_trainer_stats(t, s))) goto done;
    if ((st = partial_reduce(t))) goto done;   /* tp: partial gradients (sp, LoRA, a hetero tower) */
    for (int i = 0; i < t->n_opt; i++)
        if (t->opt[i] != t->opt_model[i]) t->opt[i]->grad = t->opt_model[i]->grad;
    if (t->dp && c->parallel.zero >= 1) {
        if ((st = mmc_dp_clip(t->dp, c->optimizer.grad_clip, &norm))) goto done;
    } else if (t->pp) {   /* the global norm over the stages */
        if ((st = mmc_trainer_pp_clip(t, &norm))) goto done;
    } else if (t->tpc || t->epc) {   /* the global norm: split gradients' squares summed over the tp / ep group */
        if ((st = t->epc ? mmc_ep_trainer_grad_norm(t, &norm)
                         : mmc_tp_grad_norm(t->tpc, t->opt, t->opt_split, t->n_opt, &norm)))
            goto done;
        if (c->optimizer.grad_clip > 0 && norm > c->optimizer.grad_clip) {   /* as clip_grad_norm_ */
            const float cf = (float)(c->optimizer.grad_clip / (norm + 1e-6));
            for (int i = 0; i < t->n_opt; i++) {
                mmc_tensor *g = t->opt[i]->grad;
                if (g) for (int64_t e = 0, ne = mmc_numel(g); e < ne; e++) ((float *)g->data)[e] *= cf;
            }
        }
    } else {
        norm = mmc_clip_grad_norm(t->opt, t->n_opt, c->optimizer.grad_clip);
    }
    if (!isfinite(norm)) {
        st = mmc_error(MMC_ERR_NUMERIC, "step %lld: the gradient norm is %s (loss %g); stopping without "
                       "updating the weights — the last checkpoint is intact", (long long)t->step + 1,
                       isnan(norm) ? "NaN" : "infinite", loss);
        goto done;
    }
    double lr = mmc_schedule_lr(&t->sched, t->step);
    if (t->dp && c->parallel.zero >= 1) {
        if ((st = mmc_dp_step(t->dp, lr))) goto done;
    } else {
        mmc_adamw_step(&t->adamw, lr);
    }
    for (int i = 0; i < t->n_opt; i++)   /* (ZeRO-3 rounds the master shards when it gathers) */
        if (t->opt[i] != t->opt_model[i] && t->opt[i]->data)
            mmc_convert(t->opt_model[i]->data, MMC_BF16, t->opt[i]->data, MMC_F32, mmc_numel(t->opt[i]));
    if (t->ema) {
        /* diffusers' EMAModel.step: the k-th update (k = step + 1) uses decay 0 for k = 1, then
         * min(ema_decay, k / (k + 9)): ema -= (1 - decay) (ema - param) */
        const int64_t k = t->step + 1;
        const double d = k <= 1 ? 0.0 : fmin(c->training.ema_decay, (double)k / (double)(k + 9));
        const float om = (float)(1.0 - d);
        for (int i = 0; i < t->n_opt; i++) {
            const float *w = t->opt[i]->data;
            float *e = t->ema[i];
            for (int64_t j = 0, n = mmc_numel(t->opt[i]); j < n; j++) e[j] -= om * (e[j] - w[j]);
        }
    }
    t->step++;
    t->rng.offset++;
    s->step = t->step;
    s->loss = loss;
    s->lr = lr;
    s->grad_norm = norm;
done:
    for (int64_t k = 0; k < got; k++) batch_release(&mbs[k]);
    free(mbs);
    s->step_s = mmc_now() - t0;
    return st;
}

/* ------------------------------------------------------------------ evaluation */
/* Teacher-forced loss on data.eval (each sample once, the loader's eval split): the summed
 * token NLL over label tokens / their count, like the training loss; no grad, no dropout. */
static mmc_status trainer_eval(mmc_trainer *t, double *loss, int64_t *tokens) {
    *loss = NAN;
    *tokens = 0;
    if ((!t->vl && !t->llava && !t->omni && !t->internvl) || t->src.kind != SRC_LOADER || !t->dopts.eval)
        return MMC_ERR_NOT_FOUND;
    if (t->pp && t->dp_rank != 0) return MMC_ERR_NOT_FOUND;   /* pipeline: the first replica's stages evaluate */
    if (t->cpc && t->dp_rank != 0) return MMC_ERR_NOT_FOUND;   /* context parallelism: the first replica's group */
    mmc_loader *l = NULL;
    mmc_status st = mmc_loader_new(&t->dopts, t->tok, MMC_SPLIT_EVAL, &l);
    if (st) return mmc_error_prefix(st, "data.eval");
    mmc_set_grad_enabled(t->ctx, false);
    mmc_nn_set_dropout_off(t->ctx);
    double sum = 0;
    int64_t n = 0;
    for (;;) {
        mmc_batch b;
        if ((st = mmc_loader_next(l, &b))) { mmc_error_prefix(st, "data.eval"); break; }
        if (b.B == 0) { mmc_batch_free(&b); break; }
        mmc_tensor *lt = NULL;
        int64_t k = 0;
        if (t->cpc) {   /* each rank scores its shard of the rows (mmc_cp_trainer_eval_batch); summed below */
            double s1 = 0;
            if (b.T % t->cp_size) st = sp_pad_batch(&b, t->cp_size);   /* (as the training micro-batches) */
            if (!st) st = mmc_cp_trainer_eval_batch(t, &b, &s1, &k);
            if (!st) sum += s1, n += k;
            mmc_batch_free(&b);
            if (st) { mmc_error_prefix(st, "data.eval"); break; }
            continue;
        }
        if (t->pp) {   /* the batch through the stages, forward only (mmc_pp_eval) */
            double s1 = 0;
            st = mmc_pp_eval(t->pp, &b, &s1, &k);
            if (!st) sum += s1, n += k;
            mmc_batch_free(&b);
            if (st) { mmc_error_prefix(st, "data.eval"); break; }
            continue;
        }
        st = t->internvl ? mmc_internvl_batch_loss(t->ctx, t->internvl, &b, 1.0, &lt, &k)
             : t->llava  ? mmc_llava_batch_loss(t->ctx, t->llava, &b, 1.0, &lt, &k)
             : t->omni   ? mmc_omni_batch_loss(t->ctx, t->omni, &b, 1.0, &lt, &k)
                         : mmc_qwen2_vl_batch_loss(t->ctx, t->vl, &b, 1.0, &lt, &k);
        if (!st) sum += *(const float *)lt->data, n += k;
        mmc_ctx_reset(t->ctx);
        mmc_batch_free(&b);
        if (st) { mmc_error_prefix(st, "data.eval"); break; }
    }
    mmc_set_grad_enabled(t->ctx, true);
    mmc_loader_free(l);
    if (!st && t->cpc) st = mmc_cp_trainer_eval_sum(t, &sum, &n);   /* the group's shards: the whole rows */
    if (st) return st;
    *loss = n ? sum / (double)n : NAN;
    *tokens = n;
    return MMC_OK;
}

/* ------------------------------------------------------------------ the run loop */
static double rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long v = (long)(s + 0.5);
    if (v >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
    else snprintf(buf, n, "%ld:%02ld", v / 60, v % 60);
}

static void hist_push(mmc_trainer *t, const mmc_step_stats *s) {
    if (t->n_hist == t->cap_hist) {
        int cap = t->cap_hist ? 2 * t->cap_hist : 256;
        int64_t *a = realloc(t->h_step, (size_t)cap * sizeof *a);
        if (a) t->h_step = a;
        double *b = realloc(t->h_loss, (size_t)cap * sizeof *b);
        if (b) t->h_loss = b;
        double *d = realloc(t->h_lr, (size_t)cap * sizeof *d);
        if (d) t->h_lr = d;
        if (!a || !b || !d) return;
        t->cap_hist = cap;
    }
    t->h_step[t->n_hist] = s->step;
    t->h_loss[t->n_hist] = s->loss;
    t->h_lr[t->n_hist] = s->lr;
    t->n_hist++;
}

/* On resume: keep metrics.jsonl lines up to the restored step (a killed run may have
 * logged past its last checkpoint) and reload them into the plot history. */
static void metrics_trim(mmc_trainer *t, const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (mmc_read_file(path, &text, &len) != MMC_OK) return;
    char *keep = malloc(len + 1);
    size_t kl = 0;
    if (!keep) { free(text); return; }
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        mmc_json *j = NULL;
        if (ll && mmc_json_parse(line, ll, "metrics", &j) == MMC_OK) {
            int64_t step = 0;
            double loss = 0, lr = 0;
            mmc_json_int(j, "step", 0, &step);
            mmc_json_num(j, "loss", 0, &loss);
            mmc_json_num(j, "lr", 0, &lr);
            mmc_json_free(j);
            if (step <= t->step) {
                memcpy(keep + kl, line, ll);
                kl += ll;
                keep[kl++] = '\n';
                mmc_step_stats s = {.step = step, .loss = loss, .lr = lr};
                if (memmem(line, ll, "\"loss\":", 7)) hist_push(t, &s);   /* not eval lines */
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    mmc_write_file_atomic(path, keep, kl);
    free(keep);
    free(text);
}

/* every rank learns whether any rank failed (collective); the first failing rank's own
 * message stays in its log */
static mmc_status agree(mmc_trainer *t, mmc_status st, const char *what) {
    if (t->world_size <= 1) return st;
    int64_t bad = st != MMC_OK;
    mmc_status s2 = mmc_all_reduce(t->world, &bad, &bad, 1, MMC_I64, MMC_MAX);
    if (s2) return s2;
    if (bad && !st) st = mmc_error(MMC_ERR_IO, "checkpoint at step %lld: %s failed on another rank (see its "
                                   "message)", (long long)t->step, what);
    return st;
}

/* Checkpoint with data parallelism. ZeRO >= 1: rank 0 makes the temporary directory, every
 * rank writes its own optimizer shard into it in parallel, then rank 0 writes the model, the
 * manifest and the trainer state and renames the directory into place (atomic as a whole).
 * ZeRO-0: rank 0 writes everything. Every rank learns the outcome of each phase. */
static mmc_status save_ranked_inner(mmc_trainer *t);
static mmc_status save_ranked(mmc_trainer *t) {
    if (t->pp && !t->tpc) return mmc_trainer_pp_save(t);   /* the stages gathered into one checkpoint */
    if (t->epc) {   /* every expert gathered (with tp: first each tensor's slices); rank 0 writes the HF layout */
        tp_swap tsw;
        mmc_status st = t->tpc ? tp_to_full(t, true, &tsw) : MMC_OK;
        if (st) return st;
        mmc_ep_swap sw;
        st = mmc_ep_trainer_to_full(t, &sw);
        if (!st) st = save_ranked_inner(t);
        mmc_ep_trainer_to_local(t, &sw);
        if (t->tpc) tp_to_local(t, &tsw, false);
        return st;
    }
    if (t->tpc) {   /* every tp rank gathers; world rank 0 writes full tensors */
        /* ZeRO-1/2: the moments are gathered over dp first (the local tensors' full state) */
        const bool zs = t->dp && t->cfg->parallel.zero >= 1;
        mmc_adamw keep = t->adamw, full = {0};
        mmc_status st = MMC_OK;
        if (zs) {
            st = mmc_adamw_init(&full, &keep.o, t->opt, t->n_opt);
            if (!st) st = mmc_dp_gather_state(t->dp, &full);
            t->adamw = full;
        }
        /* ZeRO-3: this rank's tp slices gathered over dp first (every parameter, for a while) */
        const bool z3 = t->dp && t->cfg->parallel.zero == 3;
        if (!st && z3) st = mmc_dp_gather_params(t->dp);
        if (!st && z3) st = mmc_dp_gather_masters(t->dp);   /* bf16: the fp32 masters too */
        tp_swap sw;
        if (!st) st = tp_to_full(t, true, &sw);
        if (!st) {
            st = t->pp ? mmc_trainer_pp_save(t) : save_ranked_inner(t);   /* pp x tp: the full tensors' stages */
            tp_to_local(t, &sw, false);
        }
        if (z3) {
            mmc_dp_release_masters(t->dp);
            mmc_dp_release_params(t->dp);
        }
        if (zs) {
            mmc_adamw_free(&t->adamw);
            t->adamw = keep;
        }
        return st;
    }
    /* ZeRO-3: parameters are gathered for rank 0's files (collective) and freed after — the
     * LoRA adapters for the PEFT files (the base is model.path), or the untrained parameters
     * for model.frozen.safetensors (a full gather: a spike of the whole model's size); the
     * trained parameters' own values go into every rank's shard */
    const bool gather = t->dp && t->cfg->parallel.zero == 3 && (t->lora || t->n_frozen > 0);
    mmc_status st = gather ? mmc_dp_gather_params_sel(t->dp, t->lora != NULL, !t->lora) : MMC_OK;
    if (!st) st = save_ranked_inner(t);
    if (gather) mmc_dp_release_params(t->dp);
    return st;
}

static mmc_status save_ranked_inner(mmc_trainer *t) {
    mmc_status st = MMC_OK;
    const bool sharded = mmc_trainer_state_sharded(t);
    if (!sharded) {
        if (t->rank == 0) st = mmc_trainer_save(t);
        return agree(t, st, "rank 0's save");
    }
    int64_t token = t->rank == 0 ? (int64_t)getpid() : 0;   /* names the temporary directory */
    if (t->world_size > 1 && (st = mmc_broadcast(t->world, &token, 1, MMC_I64, 0))) return st;
    if (t->rank == 0) st = mmc_checkpoint_begin(t, token);
    if ((st = agree(t, st, "creating the directory"))) return st;
    char tmp[4096];
    mmc_checkpoint_tmp_dir(t, token, tmp, sizeof tmp);
    st = mmc_dp_write_shard(t->dp, t->opt_names, tmp);
    if ((st = agree(t, st, "writing an optimizer shard"))) {
        if (t->rank == 0) mmc_rm_rf(tmp);
        return st;
    }
    if (t->rank == 0) st = mmc_checkpoint_finish(t, token);
    return agree(t, st, "rank 0's save");
}

/* ZeRO-3 with an evaluation at this step: every rank takes part in gathering the parameters */
static bool zero3_eval_due(const mmc_trainer *t) {
    const mmc_training_cfg *tc = &t->cfg->training;
    return t->dp && t->cfg->parallel.zero == 3 && tc->eval_every > 0 && t->cfg->data.eval &&
           (t->step % tc->eval_every == 0 || t->step == tc->steps);
}

/* Per-modality plan: how the images were shared out over the run (collective over the world;
 * world rank 0 prints). */
static mmc_status hetero_report(mmc_trainer *t) {
    const mmc_omni *o = t->omni && t->omni->share ? t->omni : NULL;
    if ((!t->vl || (!t->vl->vision_share && !t->pph)) && !o) return MMC_OK;
    int64_t mine[4] = {t->vl ? t->vl->share_images : o->share_images, t->vl ? t->vl->share_patches : o->share_patches,
                       o ? o->share_clips : 0, o ? o->share_frames : 0};
    int64_t *all = malloc(sizeof(int64_t) * 4 * (size_t)t->world_size);
    if (!all) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = mmc_all_gather(t->world, mine, all, 4, MMC_I64);
    for (int k = 0; k < 2 && !st && t->rank == 0; k++) {
        if (k == 0 ? o && !o->share_vision : !o || !o->share_audio) continue;
        fprintf(stderr, "mmc train: per-modality plan: %s, per rank:", k ? "audio clips (mel frames) the audio "
                "encoder encoded" : "images (patches) the vision tower encoded");
        for (int r = 0; r < t->world_size; r++)
            fprintf(stderr, " %lld (%lld)", (long long)all[4 * r + 2 * k], (long long)all[4 * r + 2 * k + 1]);
        fputc('\n', stderr);
    }
    free(all);
    return st;
}

/* An evaluation due at this step on a model split over ranks (tensor, context or pipeline
 * parallelism): its forward runs collectives, so every rank evaluates beside rank 0 (which logs). */
static bool split_eval_due(const mmc_trainer *t) {
    const mmc_training_cfg *tc = &t->cfg->training;
    return (t->tpc || t->cpc || t->pp) && tc->eval_every > 0 && t->cfg->data.eval &&
           (t->step % tc->eval_every == 0 || t->step == tc->steps);
}

mmc_status mmc_trainer_run(mmc_trainer *t) {
    if (t->contrastive) return mmc_trainer_contrastive_run(t);
    const mmc_run_config *c = t->cfg;
    const mmc_training_cfg *tc = &c->training;
    if (t->rank != 0) {   /* only rank 0 prints progress and writes logs and checkpoints */
        mmc_status st = MMC_OK;
        int64_t last_saved = -1;
        while (!st && t->step < tc->steps) {
            mmc_step_stats s;
            if ((st = mmc_trainer_step(t, &s))) break;
            /* rank 0 evaluates on the gathered parameters (and, with a split model, every rank: pp x ZeRO-3) */
            if (zero3_eval_due(t) && (st = mmc_dp_gather_params(t->dp))) break;
            if (split_eval_due(t)) {
                double el;
                int64_t en;
                const mmc_status est = trainer_eval(t, &el, &en);
                if (est && est != MMC_ERR_NOT_FOUND) { st = est; break; }
            }
            if (zero3_eval_due(t)) mmc_dp_release_params(t->dp);
            if (tc->save_every > 0 && t->step % tc->save_every == 0 && t->step < tc->steps) {
                st = save_ranked(t);
                last_saved = t->step;
            }
        }
        if (!st && last_saved != t->step) st = save_ranked(t);
        if (!st) st = hetero_report(t);
        return st;
    }
    mmc_status st = mmc_mkdir_p(tc->output_dir);
    if (st) return st;
    char path[2100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tc->output_dir);
    if (t->step > 0) metrics_trim(t, path);
    else unlink(path);
    FILE *metrics = fopen(path, "a");
    if (!metrics) return mmc_error(MMC_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/tb", tc->output_dir);
    mmc_tb *tb = NULL;
    if ((st = mmc_tb_open(path, &tb))) { fclose(metrics); return st; }
    const bool tty = isatty(2);
    const double t_start = mmc_now();
    const int64_t first = t->step;
    int64_t last_saved = -1;
    const char *slow = getenv("MMC_TRAIN_TEST_SLEEP_MS");   /* test hook: slow steps down */
    int64_t trainable = 0, state = 0;
    mmc_trainer_memory(t, &trainable, &state);
    fprintf(stderr, "mmc train: %lld trainable parameters, %.1f MiB optimizer state, %lld steps from step "
            "%lld, global batch %lld = %lld x %lld micro-batches%s\n", (long long)trainable,
            (double)state / 1048576.0, (long long)tc->steps, (long long)t->step,
            (long long)c->data.batch_size, (long long)tc->gradient_accumulation,
            (long long)c->data.micro_batch_size, t->dp_size > 1 ? " over data-parallel ranks" : "");
    if (t->tpc) {
        char why[160] = "";
        if (t->vl && !t->vl->visual->tp) mmc_vision_tp_ok(&t->vl->visual->cfg, t->tp_size, why, sizeof why);
        if (c->parallel.hetero && t->pp)
            ;   /* (trainer_pp_hetero.c said it) */
        else if (c->parallel.hetero || c->parallel.hetero_audio)
            fprintf(stderr, "mmc train: per-modality plan: %s data-parallel over %d ranks, language model "
                    "tensor parallelism %d x data parallelism %d (%s)%s; each tp rank encodes its share of its "
                    "replica's %s, the features all-gathered over the tp group%s\n",
                    !c->parallel.hetero_audio ? "vision tower" : c->parallel.hetero ? "audio encoder and vision tower"
                    : "audio encoder", t->world_size, t->tp_size, t->dp_size, mmc_comm_backend_name(t->world),
                    t->lm->sp ? " with sequence parallelism" : "",
                    !c->parallel.hetero_audio ? "images" : c->parallel.hetero ? "audio clips and images" : "audio clips",
                    c->parallel.hetero_audio && !c->parallel.hetero ? " (the vision tower replicated)" : "");
        else
        fprintf(stderr, "mmc train: tensor parallelism %d x data parallelism %d (%s)%s: each rank holds 1/%d of the "
                "language model's matrices%s%s%s\n", t->tp_size, t->dp_size, mmc_comm_backend_name(t->world),
                t->lm->sp ? " with sequence parallelism" : "", t->tp_size,
                t->llava || t->internvl ? "; the vision tower and projector are replicated"
                : !t->vl ? "" : t->vl->visual->tp ? " and of the vision tower's" : "; the vision tower is replicated (",
                why, t->vl && !t->vl->visual->tp ? ")" : "");
    }
    if (t->cpc) {
        const bool ring = c->parallel.context_parallel_mode == MMC_CP_RING;
        fprintf(stderr, "mmc train: context parallelism (%s) %d x data parallelism %d (%s): each rank holds 1/%d "
                "of every sequence, %s\n", ring ? "ring" : "Ulysses", t->cp_size, t->dp_size,
                mmc_comm_backend_name(t->world), t->cp_size,
                ring ? "K/V blocks pass around the ring" : "attention exchanges heads for tokens");
        if (c->parallel.hetero)
            fprintf(stderr, "mmc train: per-modality plan: vision tower data-parallel over %d ranks; each cp rank "
                    "encodes its share of its replica's images, the merged features all-gathered over the cp group\n",
                    t->world_size);
    }
    if (t->omni && !t->tpc && (c->parallel.audio.data_parallel || c->parallel.vision.data_parallel))
        fprintf(stderr, "mmc train: per-modality plan: the encoders data-parallel over %d ranks is the job's data "
                "parallelism (each rank encodes its own samples' clips and images; no tensor-parallel group to "
                "share them over)\n", t->world_size);
    if (t->dp_size > 1)
        fprintf(stderr, "mmc train: %d data-parallel ranks (%s), ZeRO-%lld, %lld micro-batches per rank per step\n",
                t->dp_size, mmc_comm_backend_name(t->world), (long long)c->parallel.zero,
                (long long)(tc->gradient_accumulation / t->dp_size));
    if (t->lora) {
        int64_t base = t->quant_numel;
        for (int i = 0; i < t->n_params; i++) base += mmc_numel(t->params[i]);
        int64_t lora = 0;
        for (int i = 0; i < t->lora->n_params; i++) lora += mmc_numel(t->lora->params[i]);
        fprintf(stderr, "mmc train: LoRA r=%lld alpha=%g on %d modules: %lld trainable parameters (%.3f%% of %lld "
                "total)\n", (long long)c->model.lora.r, c->model.lora.alpha, t->lora->n, (long long)lora,
                100.0 * (double)lora / (double)(base + lora), (long long)(base + lora));
    }
    if (t->quant_dense_bytes > 0) {
        int64_t base = 0;   /* every other base weight, as held in memory */
        for (int i = 0; i < t->n_params; i++) base += (int64_t)mmc_nbytes(t->params[i]);
        int64_t before = base + t->quant_dense_bytes, after = base + t->quant_nf4_bytes;
        fprintf(stderr, "mmc train: QLoRA NF4%s: quantised weights %.2f MiB (%s) -> %.2f MiB (NF4 codes + scales); "
                "base weights %.2f MiB -> %.2f MiB, saving %.2f MiB (%.1f%%)\n",
                c->model.quantization.double_quant ? " (double quant)" : "", (double)t->quant_dense_bytes / 1048576.0,
                c->model.dtype == MMC_RUN_BF16 ? "bf16" : "f32", (double)t->quant_nf4_bytes / 1048576.0,
                (double)before / 1048576.0, (double)after / 1048576.0, (double)(before - after) / 1048576.0,
                100.0 * (double)(before - after) / (double)before);
    }
    while (t->step < tc->steps) {
        mmc_step_stats s;
        if ((st = mmc_trainer_step(t, &s))) break;
        hist_push(t, &s);
        double elapsed = mmc_now() - t_start;
        double eta = elapsed / (double)(t->step - first) * (double)(tc->steps - t->step);
        double tps = s.tokens / s.step_s, sps = s.samples / s.step_s, rss = rss_mib();
        double share = s.step_s > 0 ? s.data_s / s.step_s : 0;
        char etas[32];
        fmt_eta(etas, sizeof etas, eta);
        bool log = t->step % tc->log_every == 0 || t->step == tc->steps;
        if (tty) {
            int w = 20, fill = (int)((double)w * (double)t->step / (double)tc->steps);
            char bar[32];
            for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
            bar[w] = 0;
            fprintf(stderr, "\r[%s] %lld/%lld ETA %s loss %.4f lr %.3e gnorm %.3f tok/s %.0f samples/s %.2f "
                    "rss %.0f MiB\x1b[K", bar, (long long)t->step, (long long)tc->steps, etas, s.loss, s.lr,
                    s.grad_norm, tps, sps, rss);
            if (t->step == tc->steps) fputc('\n', stderr);
        } else if (log) {
            char moe[64] = "";
            if (s.moe_load_max > 0) snprintf(moe, sizeof moe, " moe_load max/mean %.3f min/mean %.3f", s.moe_load_max,
                                             s.moe_load_min);
            fprintf(stderr, "step %lld/%lld loss %.6f lr %.6e grad_norm %.6f tok/s %.0f samples/s %.2f rss %.0f "
                    "MiB eta %s%s\n", (long long)t->step, (long long)tc->steps, s.loss, s.lr, s.grad_norm, tps,
                    sps, rss, etas, moe);
        }
        if (log) {
            char comm[2048] = "";
            if (t->dp) {   /* gradient reduction: first bucket start to last completion, and the part
                            * the caller waited for (the rest overlapped backward) */
                double exposed = 0, busy = 0;
                mmc_dp_get_timing(t->dp, &exposed, &busy);
                snprintf(comm, sizeof comm, ", \"comm_s\": %.6f, \"comm_exposed_s\": %.6f", busy, exposed);
            }
            if (s.moe_load_max > 0) mmc_moe_trainer_metrics(t, &s, comm, sizeof comm);   /* tokens per expert */
            fprintf(metrics, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                    "\"tokens_per_s\": %.3f, \"samples_per_s\": %.4f, \"rss_mib\": %.1f, \"data_share\": %.5f%s}\n",
                    (long long)t->step, s.loss, s.lr, s.grad_norm, tps, sps, rss, share, comm);
            fflush(metrics);
            mmc_tb_scalar(tb, "train/loss", t->step, s.loss);
            mmc_tb_scalar(tb, "train/lr", t->step, s.lr);
            mmc_tb_scalar(tb, "train/grad_norm", t->step, s.grad_norm);
            mmc_tb_scalar(tb, "perf/tokens_per_s", t->step, tps);
            mmc_tb_scalar(tb, "perf/rss_mib", t->step, rss);
            mmc_tb_flush(tb);
        }
        if (tc->eval_every > 0 && (t->step % tc->eval_every == 0 || t->step == tc->steps) && c->data.eval) {
            double el;
            int64_t en;
            mmc_status est = zero3_eval_due(t) ? mmc_dp_gather_params(t->dp) : MMC_OK;
            if (!est) est = trainer_eval(t, &el, &en);
            if (zero3_eval_due(t)) mmc_dp_release_params(t->dp);
            if (est == MMC_OK) {
                if (tty) fputc('\n', stderr);
                fprintf(stderr, "eval step %lld: loss %.6f perplexity %.3f (%lld tokens)\n", (long long)t->step, el,
                        exp(el), (long long)en);
                fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.9g, \"eval_perplexity\": %.9g, "
                        "\"eval_tokens\": %lld}\n", (long long)t->step, el, exp(el), (long long)en);
                fflush(metrics);
                mmc_tb_scalar(tb, "eval/loss", t->step, el);
                mmc_tb_scalar(tb, "eval/perplexity", t->step, exp(el));
                mmc_tb_flush(tb);
            } else if (est != MMC_ERR_NOT_FOUND) {
                st = est;
                break;
            }
        }
        if (mmc_trainer_flux_validation_due(t)) {   /* diffusion: an image of the validation prompt */
            char vpath[2400];
            const double v0 = mmc_now();
            if ((st = mmc_trainer_flux_validate(t, vpath, sizeof vpath))) break;
            const int res = (int)t->cfg->data.resolution;
            if ((st = mmc_tb_image(tb, "validation/image", t->step, vpath, res, res)) || (st = mmc_tb_flush(tb))) break;
            if (tty) fputc('\n', stderr);
            fprintf(stderr, "validation image %s (%.1f s)\n", vpath, mmc_now() - v0);
        }
        if (tc->save_every > 0 && t->step % tc->save_every == 0 && t->step < tc->steps) {
            if (tty) fputc('\n', stderr);
            if ((st = save_ranked(t))) break;
            last_saved = t->step;
        }
        if (slow) usleep((useconds_t)atoi(slow) * 1000u);
    }
    if (!st && last_saved != t->step) st = save_ranked(t);
    if (!st && t->dp) {
        mmc_dp_memory m;
        mmc_dp_get_memory(t->dp, &m);
        mmc_trainer_memory(t, NULL, &m.optim);   /* ZeRO-0 keeps the full AdamW state outside dp */
        fprintf(stderr, "mmc train: rank 0 holds %lld bytes of parameters, %lld of gradients (+%lld in buckets), "
                "%lld of optimizer state; peaks during steps: %lld of parameters, %lld of gradients; "
                "%lld bytes of untrained parameters\n",
                (long long)m.params, (long long)m.grads, (long long)m.buckets, (long long)m.optim,
                (long long)m.params_peak, (long long)m.grads_peak, (long long)m.frozen);
    }
    if (!st) st = hetero_report(t);
    fclose(metrics);
    mmc_tb_close(tb);
    return st;
}

/* history accessors for checkpoint.c's plot are read straight from the struct */

int mmc_trainer_rank(const mmc_trainer *t) { return t->rank; }
