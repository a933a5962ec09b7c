/* mmc_models.h — model architectures. One struct per architecture; weights are loaded from
 * a Hugging Face directory (config.json + safetensors) by name through a table, and each
 * forward reads like the HF modeling file it mirrors.
 *
 * Qwen2 (transformers' Qwen2ForCausalLM) is the language model of Qwen2-VL / Qwen2.5-VL.
 * Llama (LlamaForCausalLM, the language model of LLaVA) is the same decoder with other bias
 * flags and RoPE scaling variants: it shares the struct and every function (llama.c only reads
 * its config and checkpoints).
 */
#ifndef MMC_MODELS_H
#define MMC_MODELS_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_ops.h"
#include "mmc_nn.h"
#include "mmc_lora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest size a config.json may give (hidden, vocab, layers, heads ...): 2^24 is far past
 * any real model and keeps every product of two or three sizes inside int64. */
#define MMC_CONFIG_MAX_DIM ((int64_t)1 << 24)

/* ---------------------------------------------------------------- Qwen2 decoder */
/* RoPE frequency variants of transformers' ROPE_INIT_FUNCTIONS that the decoders support. */
typedef enum { MMC_ROPE_DEFAULT = 0, MMC_ROPE_LINEAR, MMC_ROPE_DYNAMIC, MMC_ROPE_LLAMA3 } mmc_rope_kind;

typedef struct {
    int64_t vocab_size;
    int64_t hidden_size;          /* C */
    int64_t intermediate_size;    /* F */
    int64_t num_layers;
    int64_t num_heads;            /* Hq */
    int64_t num_kv_heads;         /* Hkv */
    int64_t head_dim;             /* D = C / Hq unless config says otherwise */
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    bool tie_word_embeddings;
    bool has_pad_token;           /* pad_token_id set: nn.Embedding's padding_idx (that row gets no gradient); */
    int64_t pad_token_id;         /* a zero-initialised config has none */
    bool mrope;                   /* Qwen2-VL multimodal rope */
    int mrope_section[3];         /* e.g. {16, 24, 24}, sums to D/2 */
    bool qkv_bias;                /* q/k/v projections have biases (Qwen2: always; Llama: attention_bias) */
    bool o_bias;                  /* o_proj has a bias (Llama attention_bias) */
    bool mlp_bias;                /* gate/up/down have biases (Llama mlp_bias) */
    mmc_rope_kind rope_kind;      /* rope_scaling / rope_parameters rope_type */
    double rope_factor;           /* linear / dynamic / llama3 factor */
    double rope_low_freq_factor, rope_high_freq_factor;   /* llama3 */
    int64_t rope_original_max_pos;/* llama3 original_max_position_embeddings; dynamic: max_position_embeddings */
    mmc_dtype dtype;              /* weights' dtype as stored (F32 / BF16) */
    struct mmc_moe *moe;          /* Qwen2-MoE (qwen2_moe.c): its sparse layers' blocks replace gate/up/down;
                                   * NULL for a dense decoder. Not owned by the config (see mmc_qwen2.moe). */
    bool internlm2;               /* InternLM2's own layout (internlm2.c, for training): one packed attention.wqkv
                                   * per layer (mmc_qwen2_layer.qkv, rows grouped per key/value head) and the
                                   * remote code's names (tok_embeddings, attention.wo, feed_forward.w1/w3/w2,
                                   * attention_norm, ffn_norm, output) as the parameters' and modules' names */
} mmc_qwen2_config;

typedef struct {
    mmc_tensor *input_norm;       /* [C] */
    mmc_linear_w q;               /* w [Hq*D, C], b [Hq*D] */
    mmc_linear_w k;               /* w [Hkv*D, C], b [Hkv*D] */
    mmc_linear_w v;               /* w [Hkv*D, C], b [Hkv*D] */
    mmc_linear_w qkv;             /* cfg.internlm2 only (q / k / v then hold no weights): InternLM2's wqkv
                                   * w [(Hq + 2 Hkv) D, C], b [(Hq + 2 Hkv) D], rows grouped per kv head */
    mmc_linear_w o;               /* w [C, Hq*D], no bias */
    mmc_tensor *post_norm;        /* [C] */
    mmc_linear_w gate, up;        /* w [F, C] */
    mmc_linear_w down;            /* w [C, F] */
    struct mmc_comm *tp;          /* tensor-parallel group (mmc_tp.h) or NULL: then q/k/v/gate/up
                                   * hold this rank's output rows and o/down its input columns */
    bool sp;                      /* set by mmc_qwen2_forward: x is this rank's sequence slice */
    struct mmc_comm *cp;          /* context-parallel group (mmc_cp.h) or NULL: x holds this rank's
                                   * sequence shard and attention exchanges heads for tokens */
    int cp_mode;                  /* mmc_cp_mode: Ulysses (0) or ring attention (1) */
    struct mmc_moe_block *moe;    /* Qwen2-MoE sparse block in place of gate/up/down (qwen2_moe.c), or NULL */
    bool recompute_attn;          /* set by the training forwards: rope + attention under mmc_checkpoint */
    int tp_chunks;                /* with tp (no sp): o and down all-reduce in this many row pieces, each
                                   * overlapped with the next piece's GEMM (mmc_tp_row_linear_chunked) */
} mmc_qwen2_layer;

/* Key/value cache: per layer a [B, cap, Hkv, D] buffer; capacity grows in blocks of
 * MMC_KV_BLOCK positions. */
#define MMC_KV_BLOCK 256
typedef struct {
    int n_layers;
    int64_t batch, len, cap, kv_heads, head_dim;
    mmc_tensor **k, **v;          /* [B, cap, Hkv, D] each */
} mmc_kv_cache;

/* A decoder as the generation loop (src/infer/) sees it, whatever the architecture: the
 * model fills a KV cache from a prompt (with its images / videos, for a VLM) and then takes
 * one token at a time. The model's files implement the two steps; the loop, the sampler and
 * stopping live in src/infer/, which drives every model through this table (as the batching
 * engine of the server will). Both steps return the last position's logits [V] in ctx's
 * arena (the loop may modify them). */
typedef struct mmc_decoder {
    void *self;                   /* the model, or a per-request state that holds it */
    int64_t vocab_size, max_positions, kv_heads, head_dim;
    int n_layers;
    /* ids [n] into an empty cache */
    mmc_status (*prefill)(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                          float **logits);
    /* one token at position kv->len */
    mmc_status (*decode)(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits);
} mmc_decoder;

typedef struct mmc_qwen2 {
    mmc_qwen2_config cfg;
    mmc_tensor *embed;            /* [V, C] */
    mmc_qwen2_layer *layers;      /* [num_layers] */
    mmc_tensor *norm;             /* [C] */
    mmc_tensor *lm_head;          /* [V, C]; == embed when tied */
    mmc_tensor **params;          /* every distinct parameter, for optimizers/savers */
    char (*param_names)[96];      /* HF names (without prefix), parallel to params */
    int n_params;
    mmc_st *st;                   /* mapping kept alive when weights are zero-copy */
    bool recompute;               /* activation checkpointing per block */
    /* selective recompute and offload (training forwards; in a pipeline stage the counts are of
     * the stage's own layers): recompute_layers > 0 checkpoints only the first N layers;
     * recompute_attn checkpoints only rope + attention (the projections' outputs stay);
     * offload_layers: the first N layers' saved activations live in a memory-mapped file
     * (mmc_ctx_offload_begin) instead of the arena */
    int recompute_layers;
    bool recompute_attn;
    int offload_layers;
    const char *offload_dir;      /* not owned; NULL: $TMPDIR or /tmp */
    mmc_lora_set *adapter;        /* PEFT adapter applied at inference (owned), or NULL */
    struct mmc_comm *tp;          /* tensor-parallel group (not owned), or NULL (mmc_qwen2_load_tp) */
    signed char *param_split;     /* [n_params] with tp: the dimension each parameter is split on
                                   * over the group, or MMC_TP_REPLICATED (-1); NULL without tp */
    bool sp;                      /* with tp: sequence parallelism in training forwards (mmc_tp.h);
                                   * the replicated parameters' gradients are then partial */
    bool sp_active;               /* the last forward ran sequence-parallel (its hidden is gathered) */
    struct mmc_moe *moe;          /* owned MoE state (== cfg.moe) of a Qwen2-MoE model, or NULL */
    void *repack;                 /* owned, freed after the tensors: data they may view that is not in the
                                   * mapping (InternLM2's q / k / v rows gathered from wqkv), or NULL */
} mmc_qwen2;

/* Bind checkpoint tensor `full` (expected ndim/shape) to *slot: zero-copy for inference
 * (f32, and bf16 matrices), an f32 parameter copy when trainable. Problems are appended to
 * errs (one line each) and returned as a status, so loaders can report them all. */
mmc_status mmc_model_bind(const mmc_st *st, const char *full, int ndim, const int64_t *shape,
                          bool trainable, mmc_tensor **slot, char *errs, size_t errcap);

/* Read a Qwen2 text config from a parsed config.json: flat (Qwen2, and the Hub's
 * Qwen2-VL) or nested under text_config (transformers >= 4.52 / 5.x); rope_theta or
 * rope_parameters.rope_theta; rope_scaling / rope_parameters mrope_section. */
mmc_status mmc_qwen2_config_read(const mmc_json *cfg, mmc_qwen2_config *out);
/* The reader behind both: text fields from `section` (the root or text_config; flat
 * rope_theta / tie_word_embeddings / torch_dtype also from root), missing sizes taken from
 * defs (the class's defaults) or, with defs NULL, required. */
mmc_status mmc_decoder_config_read(const mmc_json *root, const mmc_json *section, const mmc_qwen2_config *defs,
                                   mmc_qwen2_config *out);
/* Read a Llama text config (LlamaForCausalLM, or LLaVA's text_config): the Qwen2 fields plus
 * attention_bias (q/k/v/o), mlp_bias, and rope_scaling (4.4x) / rope_parameters (5.x) of
 * rope_type default, linear, dynamic or llama3. */
mmc_status mmc_llama_config_read(const mmc_json *cfg, mmc_qwen2_config *out);
/* The same from a section (LLaVA's text_config), missing sizes taken from LlamaConfig's
 * defaults as transformers does (the Hub's llava-1.5 text_config gives only a few keys). */
mmc_status mmc_llama_config_read_section(const mmc_json *root, const mmc_json *section, mmc_qwen2_config *out);
/* Load a LlamaForCausalLM directory (prefixes as mmc_qwen2_load). */
mmc_status mmc_llama_load(const char *dir, const mmc_json *config, bool trainable, mmc_qwen2 **out);
/* InternLM2 (internlm2.c; InternLM2ForCausalLM, model_type "internlm2"): its config section read as
 * mmc_llama_config_read_section reads Llama's (InternLM2Config's defaults and keys: `bias` on the
 * attention's wqkv / wo, rope_scaling linear / dynamic), for mmc's Llama decoder. */
mmc_status mmc_internlm2_config_read_section(const mmc_json *root, const mmc_json *section, mmc_qwen2_config *out);
/* A view set of src's InternLM2 tensors (named "<pre>model.tok_embeddings.weight", "<pre>model.layers.N.
 * attention.wqkv.weight", ..., "<pre>output.weight") under Llama's names prefixed dst_pre
 * ("<dst_pre>model.embed_tokens.weight", "...self_attn.q_proj.weight", "<dst_pre>lm_head.weight"), for
 * mmc_qwen2_load_from(view, c, "<dst_pre>model.", "<dst_pre>lm_head.weight", ...). The packed wqkv's rows,
 * grouped per key/value head, are gathered into q / k / v in *repack (their stored dtype): free() it after
 * the model, which may view it; close the view set once the model is loaded; src's mapping must outlive
 * the model. MMC_ERR_FORMAT lists every missing or mis-shaped wqkv. */
/* An InternLM2ForCausalLM directory (config.json of model_type internlm2, the remote code's names) for
 * inference: its tensors viewed as Llama's (mmc_internlm2_llama_view), the q / k / v rows kept in the
 * model's repack (training loads mmc_internlm2_load_packed instead, whose names are InternLM2's). */
mmc_status mmc_internlm2_load(const char *dir, const mmc_json *config, mmc_qwen2 **out);
/* The same directory in InternLM2's own layout (cfg.internlm2: one packed wqkv linear per layer, the
 * parameters and LoRA modules under the remote code's names "layers.N.attention.wqkv", "tok_embeddings.
 * weight", "output.weight" ...), f32 parameters when trainable: what `mmc train` trains and saves back as
 * InternLM2ForCausalLM. prefix: where the tensors live ("" for a text folder, "language_model." inside
 * InternVL's internvl_chat layout). */
mmc_status mmc_internlm2_load_packed(const char *dir, const mmc_json *config, const char *prefix, bool trainable,
                                     mmc_qwen2 **out);
/* The packed wqkv's output y [B, T, (Hq + 2 Hkv) D] split as the remote code does (per kv head h:
 * Hq / Hkv query heads, then k_h, then v_h) -> q [B, T, Hq, D], k / v [B, T, Hkv, D]. */
void mmc_internlm2_split_qkv(mmc_ctx *ctx, mmc_tensor *y, int64_t Hq, int64_t Hkv, int64_t D, mmc_tensor **q,
                             mmc_tensor **k, mmc_tensor **v);
mmc_status mmc_internlm2_llama_view(const mmc_st *src, const char *pre, const mmc_qwen2_config *c, const char *dst_pre,
                                    mmc_st **view, void **repack);
/* The decoder's 1-D RoPE table for positions pos [T] or [B, T], with the config's frequency
 * variant (transformers' ROPE_INIT_FUNCTIONS; dynamic NTK from max(pos) + 1 as
 * dynamic_rope_update does) -> cos, sin [T, D] / [B, T, D]. */
void mmc_qwen2_rope_table(mmc_ctx *ctx, const mmc_qwen2_config *cfg, const mmc_tensor *pos, mmc_tensor **cos,
                          mmc_tensor **sin);
/* Fresh model with random init (normal(0, 0.02), norms 1), f32 parameters. */
mmc_status mmc_qwen2_new(const mmc_qwen2_config *cfg, uint64_t seed, mmc_qwen2 **out);
/* Load weights from an HF directory. prefix: "" to auto-detect among "model.",
 * "model.language_model." and "language_model.model.". With trainable = false, f32/bf16
 * weights stay zero-copy in the mmap; otherwise they are copied to f32 parameters.
 * Every missing or mis-shaped tensor is reported (not just the first). */
mmc_status mmc_qwen2_load(const char *dir, const mmc_json *config, bool trainable, mmc_qwen2 **out);
/* The same with a config already read (mmc_qwen2_config_read / mmc_llama_config_read). */
mmc_status mmc_decoder_load_cfg(const char *dir, const mmc_qwen2_config *cfg, bool trainable, mmc_qwen2 **out);
mmc_status mmc_qwen2_load_from(mmc_st *st, const mmc_qwen2_config *cfg, const char *prefix,
                               const char *lm_head_name, bool trainable, mmc_qwen2 **out);
void mmc_qwen2_free(mmc_qwen2 *m);
int64_t mmc_qwen2_param_count(const mmc_qwen2 *m);
/* The decoder's linear modules with HF module names "<prefix>layers.N.self_attn.q_proj" ...
 * (prefix "model." for Qwen2ForCausalLM, "model.language_model." inside Qwen2-VL with
 * transformers >= 4.52; cfg.internlm2: "<prefix>layers.N.attention.wqkv", attention.wo,
 * feed_forward.w1 / w3 / w2), appended to out (mmc_lora.h). */
mmc_status mmc_qwen2_linears(mmc_qwen2 *m, const char *prefix, mmc_module_list *out);
/* QLoRA: quantise every decoder projection to NF4 (bitsandbytes layout, mmc_quant.h) and
 * drop the dense copies from m->params. Norms, embeddings and lm_head stay as they are. */
mmc_status mmc_qwen2_quantize_nf4(mmc_qwen2 *m, bool double_quant);
/* Weight-only inference quantisation (`--quantize`): every decoder projection to int8 or NF4
 * (mode: an mmc_quant_mode of mmc_quant.h), the dense copies dropped from m->params; the
 * embedding, norms and lm_head stay as loaded. *n_linears and the weight bytes before / after
 * are reported (each may be NULL; the byte counts are added to). LoRA adapters stay on top. */
mmc_status mmc_qwen2_quantize(mmc_qwen2 *m, int mode, int *n_linears, int64_t *bytes_before, int64_t *bytes_after);
/* Inference: pre-pack every decoder projection for the GEMM (mmc_prepack_linears, mmc_nn.h): the
 * packed copies replace the weights in m->params; no backward through them afterwards. Does
 * nothing under MMC_PREPACK=0 or tensor parallelism. Counts are added to (each may be NULL). */
mmc_status mmc_qwen2_prepack(mmc_qwen2 *m, int *n_linears, int64_t *bytes_before, int64_t *bytes_after);
/* Apply the PEFT LoRA adapter in adapter_dir at inference, without merging: every adapted
 * linear computes W x + scale * B (A x) (mmc_nn_linear), the base weights stay as loaded
 * (zero-copy). Logits equal those of the `mmc merge`d model up to float rounding. The model
 * owns the adapter (m->adapter); at most one. Errors name adapter modules the model lacks. */
mmc_status mmc_qwen2_attach_adapter(mmc_qwen2 *m, const char *adapter_dir);

/* ids [B, T] -> embeddings [B, T, C] */
mmc_tensor *mmc_qwen2_embed(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *ids);
/* One decoder layer (HF Qwen2DecoderLayer):
 *   h = x + o_proj(attn(rope(q), rope(k), v)),  y = h + down(silu(gate(n)) * up(n)) */
mmc_tensor *mmc_qwen2_layer_forward(mmc_ctx *ctx, const mmc_qwen2_config *cfg,
                                    mmc_qwen2_layer *L, mmc_tensor *x, mmc_tensor *cos,
                                    mmc_tensor *sin, const mmc_attn_opts *attn,
                                    mmc_kv_cache *kv, int layer_idx);
/* Rows per chunk for the inference forms' row-wise work, given the bytes of intermediates a
 * row needs: chunks of about 24 MiB, at least 512 rows (each chunk repacks the weights),
 * all of one size so that no small tail takes the matrix-vector path. The environment
 * variable MMC_INFER_CHUNK_ROWS=n caps it at n (tests use it to cross chunk boundaries). */
int64_t mmc_infer_chunk_rows(int64_t rows, int64_t row_bytes);
/* The inference forms' residual update: x[0 .. numel(y)) += y (any layout; f32). */
void mmc_infer_residual_add(mmc_ctx *ctx, float *x, mmc_tensor *y);
/* The same layer without autograd (mmc_grad_enabled must be false): x [B, T, C], contiguous
 * f32 and owned by the caller, is updated in place; the attention half's temporaries are
 * released at its end and the MLP runs over chunks of rows, so the layer's peak memory is
 * a few [T, C] tensors instead of several [T, intermediate] ones. */
void mmc_qwen2_layer_forward_infer(mmc_ctx *ctx, const mmc_qwen2_config *cfg, mmc_qwen2_layer *L,
                                   mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin,
                                   const mmc_attn_opts *attn, mmc_kv_cache *kv, int layer_idx);
/* Decoder stack + final norm: embeds [B, T, C] -> hidden [B, T, C]. cos/sin [T, D] or
 * [B, T, D] for these positions; kv may be NULL (training / full forward). With
 * m->recompute, blocks are checkpointed: attn->cu_seqlens must stay valid until backward.
 * Without autograd the layers run in their inference form (mmc_qwen2_layer_forward_infer). */
mmc_tensor *mmc_qwen2_forward(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *embeds, mmc_tensor *cos,
                              mmc_tensor *sin, const mmc_attn_opts *attn, mmc_kv_cache *kv);
/* The stack over embeds [B, T, C] at 1-D positions kv->len .. kv->len + T - 1 (0.. without a cache),
 * causal, growing the cache first: what a VLM that splices image features into the text embeddings
 * (LLaVA, InternVL) runs after the splice. *hidden [B, T, C]; an error only if the cache cannot grow. */
mmc_status mmc_qwen2_forward_embeds(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *embeds, mmc_kv_cache *kv,
                                    mmc_tensor **hidden);
/* hidden [..., C] -> logits [..., V] (with tensor parallelism gathered over the group) */
mmc_tensor *mmc_qwen2_logits(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *hidden);
/* The same, with tensor parallelism only this rank's vocabulary slice [..., V/tp] (rows
 * rank*V/tp ..) for the vocab-parallel loss; without, mmc_qwen2_logits. */
mmc_tensor *mmc_qwen2_logits_local(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *hidden);

/* ---- tensor parallelism (mmc_tp.h; Megatron's split) ----
 * Check before any work that tp ranks can split this model: tp must divide the KV heads, the
 * query heads, intermediate_size and vocab_size; the error says which, why and which sizes
 * would do. what names the model in the message (NULL: "the language model"). */
mmc_status mmc_qwen2_tp_check(const mmc_qwen2_config *cfg, int tp, const char *what);
/* Load this rank's slices of an HF directory's weights (f32 copies of the slices only; the
 * mapping is closed afterwards): q/k/v/gate/up and the embedding / lm_head split on rows,
 * o/down on columns, the rest replicated; m->param_split records each parameter's split. */
mmc_status mmc_qwen2_load_tp(const char *dir, const mmc_qwen2_config *cfg, struct mmc_comm *tp, bool trainable,
                             mmc_qwen2 **out);
/* The same from an open checkpoint, names under prefix (as mmc_qwen2_load_from). */
mmc_status mmc_qwen2_load_from_tp(mmc_st *st, const mmc_qwen2_config *cfg, const char *prefix, const char *lm_head_name,
                                  struct mmc_comm *tp, bool trainable, mmc_qwen2 **out);
/* This rank's shard of a full f32 model (e.g. a fresh mmc_qwen2_new), as trainable parameters. */
mmc_status mmc_qwen2_shard_tp(mmc_qwen2 *full, struct mmc_comm *tp, mmc_qwen2 **out);
/* The same with the sliced model's own config (cfg: a Qwen2-MoE config's MoE state laid out for tp). */
mmc_status mmc_qwen2_shard_tp_cfg(const mmc_qwen2_config *cfg, mmc_qwen2 *full, struct mmc_comm *tp, mmc_qwen2 **out);
/* Every parameter at full size (new f32 tensors in full[0 .. n_params), in m->params order;
 * split ones all-gathered: collective over m->tp). Free each with mmc_tensor_free. */
mmc_status mmc_qwen2_gather_weights(mmc_qwen2 *m, mmc_tensor **full);
/* The text model as a decoder (1-D RoPE positions at the cache's end); generate with
 * mmc_generate (mmc_infer.h). */
mmc_decoder mmc_qwen2_decoder(mmc_qwen2 *m);

/* Register t (owned by the model from now on) as a parameter under its HF name without prefix;
 * the arrays were sized by mmc_moe_param_count when the model was allocated. */
void mmc_qwen2_register_param(mmc_qwen2 *m, mmc_tensor *t, const char *name);

/* ---------------------------------------------------------------- Qwen2-MoE (qwen2_moe.c)
 * transformers' Qwen2MoeForCausalLM: the Qwen2 decoder whose MLP, on the sparse layers
 * ((i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers), is Qwen2MoeSparseMoeBlock:
 * a router (mlp.gate.weight [E, C], softmax, top-k, optional renormalisation), E SwiGLU experts
 * (mlp.experts.N.{gate,up,down}_proj, moe_intermediate_size) combined with their routing
 * weights, plus a shared expert (shared_expert_intermediate_size) scaled by
 * sigmoid(shared_expert_gate(x)). Every other piece is qwen2.c's. No token dropping. */
typedef struct mmc_moe mmc_moe;
typedef struct mmc_moe_block mmc_moe_block;
/* Read the Qwen2-MoE config (the Qwen2 keys plus num_experts, num_experts_per_tok,
 * moe_intermediate_size, shared_expert_intermediate_size, decoder_sparse_step, mlp_only_layers,
 * norm_topk_prob, router_aux_loss_coef, output_router_logits): *qc gets the decoder's fields and
 * qc->moe a new MoE state that the caller frees with mmc_moe_free unless a model took it. */
mmc_status mmc_qwen2_moe_config_read(const mmc_json *root, mmc_qwen2_config *qc);
void mmc_moe_free(mmc_moe *moe);
/* Load a save_pretrained Qwen2MoeForCausalLM directory. With ep (expert parallelism, mmc_ep.h;
 * NULL: none) this rank binds only its experts. */
mmc_status mmc_qwen2_moe_load(const char *dir, const mmc_json *config, bool trainable, struct mmc_comm *ep,
                              mmc_qwen2 **out);
/* A seeded random model (what `mmc train` starts from without model.path). */
mmc_status mmc_qwen2_moe_new(const mmc_json *config, uint64_t seed, struct mmc_comm *ep, mmc_qwen2 **out);
/* Tensor parallelism over tp (with ep, or NULL): the decoder split as mmc_qwen2_load_tp and every
 * expert and the shared expert split on their intermediate rows (gate/up) and columns (down),
 * from a checkpoint directory (only this rank's slices are read) or the seeded draw of
 * mmc_qwen2_moe_new sliced. Errors name the size tp does not divide. */
mmc_status mmc_qwen2_moe_load_tp(const char *dir, const mmc_json *config, bool trainable, struct mmc_comm *ep,
                                 struct mmc_comm *tp, mmc_qwen2 **out);
mmc_status mmc_qwen2_moe_new_tp(const mmc_json *config, uint64_t seed, struct mmc_comm *ep, struct mmc_comm *tp,
                                mmc_qwen2 **out);
/* What qwen2.c calls: parameters the MoE adds (for sizing), whether layer l is sparse, binding /
 * initialising the blocks (errors appended to errs, returning the number of problems), the
 * block's forward on normed rows h [..., C] -> [..., C], and its linear modules (PEFT names
 * "<prefix>layers.N.mlp.shared_expert.gate_proj", "...mlp.experts.E.up_proj", ...). */
int mmc_moe_param_count(const mmc_moe *moe);
bool mmc_moe_layer_sparse(const mmc_moe *moe, int64_t layer);
int mmc_moe_bind(mmc_qwen2 *m, const mmc_st *st, const char *prefix, bool trainable, char *errs, size_t errcap);
void mmc_moe_init(mmc_qwen2 *m, mmc_rng *rng);
/* tp_build's part: this rank's tensor-parallel slices of the blocks, from st or from full's blocks */
int mmc_moe_bind_tp(mmc_qwen2 *m, const mmc_st *st, const char *prefix, mmc_qwen2 *full, bool trainable, char *errs,
                    size_t errcap);
mmc_tensor *mmc_moe_block_forward(mmc_ctx *ctx, mmc_moe_block *b, mmc_tensor *h);
mmc_status mmc_moe_linears(mmc_moe_block *b, const char *layer_prefix, mmc_module_list *out);
/* Training: the auxiliary load-balancing loss (transformers' load_balancing_loss_func over the
 * sparse layers of one forward, times router_aux_loss_coef, when output_router_logits) enters
 * through the gradients of the router probabilities. The trainer sets the weight of each
 * forward's aux term in the step's loss (1 / the micro-batches of the global batch: the mean
 * over them); mmc_moe_aux_begin before a training forward, mmc_moe_aux_end after it returns
 * weight * coef * aux (a number to add to the loss; its gradient is applied by backward) and
 * the forward's routing counts join the capacity statistics. */
void mmc_moe_aux_set_weight(mmc_moe *moe, double weight);
void mmc_moe_aux_begin(mmc_moe *moe);
double mmc_moe_aux_end(mmc_moe *moe);
/* The same loss split over pipeline stages (pp.c), each running some of the sparse layers of
 * several forwards in flight: a forward's sums are mmc_moe_aux_len doubles (rows routed, then
 * per expert the routing decisions and the summed probabilities, over the sparse layers run so
 * far). mmc_moe_aux_attach points the sparse layers at a forward's sums and [E] gradient (NULL:
 * the own pair of begin / end): they add to the sums when collect (a forward, not its recompute)
 * and record nodes whose backward reads that gradient. mmc_moe_aux_finish, given the sums over
 * every sparse layer, fills the gradient and returns weight * coef * aux, as mmc_moe_aux_end. */
int64_t mmc_moe_aux_len(const mmc_moe *moe);
void mmc_moe_aux_attach(mmc_moe *moe, double *stats, float *grad, bool collect);
double mmc_moe_aux_finish(const mmc_moe *moe, const double *stats, float *grad);
/* router_aux_loss_coef when output_router_logits, else 0 */
double mmc_moe_aux_coef(const mmc_moe *moe);
int64_t mmc_moe_num_experts(const mmc_moe *moe);
/* The block's shape as config.json gives it (whole, before any tensor / expert parallelism):
 * num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size
 * (what the pipeline's cost model needs, mmc_plan.h). */
void mmc_moe_shape(const mmc_moe *moe, int64_t *n_experts, int64_t *top_k, int64_t *inter, int64_t *shared_inter);
/* Capacity statistics since the last reset: tokens routed to each expert of each sparse layer
 * ([n_sparse, E] int64, this process's tokens) and the number of routing decisions. */
const int64_t *mmc_moe_expert_tokens(const mmc_moe *moe, int64_t *n_sparse, int64_t *n_experts, int64_t *n_routed);
void mmc_moe_stats_reset(mmc_moe *moe);
/* The routed experts run as grouped GEMMs over all experts (on: the default) or as a loop of
 * per-expert linears (off; also MMC_MOE_GROUPED=0): the benchmark's A/B. Process-wide. */
void mmc_moe_set_grouped(int on);

mmc_status mmc_kv_cache_init(mmc_kv_cache *kv, int n_layers, int64_t batch, int64_t kv_heads,
                             int64_t head_dim, int64_t reserve);
mmc_status mmc_kv_cache_reserve(mmc_kv_cache *kv, int64_t n);
void mmc_kv_cache_free(mmc_kv_cache *kv);

#ifdef __cplusplus
}
#endif
#endif
