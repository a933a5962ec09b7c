/* mmc.h — public core API of mmc: status codes, dtypes, tensors, the execution
 * context (arenas + autograd tape) and reverse-mode autograd.
 *
 * Shapes are outermost-first, like PyTorch and safetensors: a [B, T, C] tensor has
 * shape = {B, T, C} and (when contiguous) stride = {T*C, C, 1}, in elements.
 *
 * Memory has three lifetimes (see DESIGN.md):
 *   - persistent: parameters and optimizer state (mmc_tensor_new / mmc_tensor_free),
 *     or read-only views into an mmapped checkpoint;
 *   - activations: everything an op returns, bump-allocated in the context's activation
 *     arena and released all at once by mmc_ctx_reset() after each optimizer step;
 *   - scratch: per-op temporaries (mmc_scratch_mark / mmc_scratch_release).
 *
 * Errors: fallible functions return mmc_status (MMC_OK = 0, negative on error) and set a
 * message for mmc_last_error(). Programmer errors (shape mismatches inside ops, violated
 * invariants) abort through MMC_ASSERT / MMC_CHECK with file:line.
 */
#ifndef MMC_H
#define MMC_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ status */
typedef enum {
    MMC_OK = 0,
    MMC_ERR_IO = -1,          /* open/read/write/mmap failed */
    MMC_ERR_FORMAT = -2,      /* malformed file content (header, JSON, YAML ...) */
    MMC_ERR_INVALID = -3,     /* invalid argument or value */
    MMC_ERR_OOM = -4,         /* allocation failed */
    MMC_ERR_UNSUPPORTED = -5, /* valid but not implemented (dtype, model type ...) */
    MMC_ERR_SHAPE = -6,       /* wrong shape */
    MMC_ERR_NOT_FOUND = -7,   /* missing key, tensor or file */
    MMC_ERR_NUMERIC = -8,     /* NaN/Inf where not allowed */
} mmc_status;

/* Message of the last error set on this thread ("" if none). */
const char *mmc_last_error(void);
/* Set the thread's error message (printf-style) and return `st` (for `return mmc_error(...)`). */
mmc_status mmc_error(mmc_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current error message with more context ("loading x.safetensors: ..."). */
mmc_status mmc_error_prefix(mmc_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mmc_clear_error(void);
const char *mmc_status_str(mmc_status st);

void mmc_abort_(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
#define MMC_ASSERT(cond) \
    do { if (!(cond)) mmc_abort_(__FILE__, __LINE__, "assertion failed: %s", #cond); } while (0)
/* MMC_CHECK(cond, "fmt", ...) — invariant with a formatted explanation. */
#define MMC_CHECK(cond, ...) \
    do { if (!(cond)) mmc_abort_(__FILE__, __LINE__, __VA_ARGS__); } while (0)

/* ------------------------------------------------------------------ dtypes */
typedef enum {
    MMC_F32 = 0,
    MMC_BF16,
    MMC_F16,
    MMC_F64,
    MMC_I32,
    MMC_I64,
    MMC_U8,
    MMC_I8,
    MMC_BOOL,
    MMC_NF4,   /* bitsandbytes NF4: 2 codes per byte, blocks of 64 with a scale (see quant) */
    MMC_DTYPE_COUNT
} mmc_dtype;

size_t mmc_dtype_size(mmc_dtype dt);           /* bytes per element (NF4: 0, use nbytes) */
const char *mmc_dtype_name(mmc_dtype dt);      /* "F32", "BF16" ... (safetensors spelling) */
/* Parse a safetensors / config dtype string ("F32", "BF16", "float32", "bfloat16" ...). */
mmc_status mmc_dtype_parse(const char *s, mmc_dtype *out);

static inline float mmc_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
/* Round-to-nearest-even, NaN preserved (matches torch's .to(torch.bfloat16)). */
static inline uint16_t mmc_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
float mmc_f16_to_f32(uint16_t h);
uint16_t mmc_f32_to_f16(float f);
/* Bulk conversions (vectorised where the CPU allows). */
void mmc_convert(void *dst, mmc_dtype dst_dt, const void *src, mmc_dtype src_dt, int64_t n);

/* ------------------------------------------------------------------ tensors */
#define MMC_MAX_DIMS 5

typedef enum { MMC_CPU = 0, MMC_CUDA = 1 } mmc_device;

enum {
    MMC_REQUIRES_GRAD = 1u << 0, /* gradient wanted for this tensor */
    MMC_PARAM = 1u << 1,         /* persistent parameter: its grad is persistent too */
    MMC_OWNS_DATA = 1u << 2,     /* data was allocated by mmc_tensor_new and is freed with it */
    MMC_IN_ARENA = 1u << 3,      /* struct (and data) live in an arena */
};

typedef struct mmc_tensor {
    mmc_dtype dtype;
    int ndim;
    int64_t shape[MMC_MAX_DIMS];  /* outermost first */
    int64_t stride[MMC_MAX_DIMS]; /* in elements; views share storage */
    void *data;                   /* address of element [0, ..., 0] */
    mmc_device device;
    struct mmc_tensor *grad;      /* same shape, contiguous f32; NULL until needed */
    uint32_t flags;
    char name[48];                /* parameter name (HF weight name, truncated) or "" */
} mmc_tensor;

int64_t mmc_numel(const mmc_tensor *t);
size_t mmc_nbytes(const mmc_tensor *t);         /* numel * dtype size (contiguous size) */
bool mmc_is_contiguous(const mmc_tensor *t);
bool mmc_same_shape(const mmc_tensor *a, const mmc_tensor *b);
/* Write "[2, 3, 4]" into buf; returns buf. */
char *mmc_shape_str(const mmc_tensor *t, char *buf, size_t n);
void mmc_set_contiguous_strides(mmc_tensor *t);

/* Persistent tensor: 64-byte aligned, zero-filled, freed with mmc_tensor_free. NULL on OOM
 * (with mmc_last_error set). */
mmc_tensor *mmc_tensor_new(mmc_dtype dt, int ndim, const int64_t *shape);
/* Persistent tensor struct wrapping external memory (e.g. an mmapped safetensors blob). */
mmc_tensor *mmc_tensor_wrap(mmc_dtype dt, int ndim, const int64_t *shape, void *data);
void mmc_tensor_free(mmc_tensor *t); /* frees data if owned, and a persistent grad */

/* Read element i (flat index over the logical shape, row-major) as double: for tests/debug. */
double mmc_get_flat(const mmc_tensor *t, int64_t i);
void mmc_set_flat(mmc_tensor *t, int64_t i, double v);

/* ------------------------------------------------------------------ arenas */
typedef struct mmc_arena mmc_arena;
mmc_arena *mmc_arena_new(size_t chunk_bytes);
void mmc_arena_free(mmc_arena *a);
void *mmc_arena_alloc(mmc_arena *a, size_t bytes);      /* 64-byte aligned, never NULL (aborts) */
typedef struct { void *chunk; size_t used; } mmc_arena_mark;
mmc_arena_mark mmc_arena_get_mark(mmc_arena *a);
void mmc_arena_release(mmc_arena *a, mmc_arena_mark m); /* free everything allocated after m */
void mmc_arena_reset(mmc_arena *a);
size_t mmc_arena_used(const mmc_arena *a);              /* bytes in use now */
size_t mmc_arena_peak(const mmc_arena *a);              /* high-water mark */
/* An arena whose chunks are shared mappings of a nameless temporary file in dir (NULL:
 * $TMPDIR or /tmp), for activation offload. mmc_arena_evict drops its used pages from the
 * resident set (they stay in the file and fault back in on access); mapped bytes: the file's
 * size (0 for a heap arena). */
mmc_status mmc_arena_new_mapped(const char *dir, size_t chunk_bytes, mmc_arena **out);
void mmc_arena_evict(mmc_arena *a);
size_t mmc_arena_mapped_bytes(const mmc_arena *a);

/* ------------------------------------------------------------------ context */
typedef struct mmc_ctx mmc_ctx;
typedef struct mmc_node mmc_node;

mmc_ctx *mmc_ctx_new(void);
void mmc_ctx_free(mmc_ctx *ctx);
/* End of a step: drop the tape and every activation (and activation gradient). */
void mmc_ctx_reset(mmc_ctx *ctx);
mmc_arena *mmc_ctx_arena(mmc_ctx *ctx);    /* activation arena */
mmc_arena *mmc_ctx_scratch(mmc_ctx *ctx);  /* scratch arena */
/* Grad mode: when off, ops record nothing (inference). Returns the previous mode. */
bool mmc_set_grad_enabled(mmc_ctx *ctx, bool on);
bool mmc_grad_enabled(const mmc_ctx *ctx);

/* Activation tensors (in the activation arena; uninitialised / zeroed). */
mmc_tensor *mmc_new(mmc_ctx *ctx, mmc_dtype dt, int ndim, const int64_t *shape);
mmc_tensor *mmc_zeros(mmc_ctx *ctx, mmc_dtype dt, int ndim, const int64_t *shape);
mmc_tensor *mmc_new_like(mmc_ctx *ctx, const mmc_tensor *t);  /* same shape, f32 -> same dtype */
mmc_tensor *mmc_scalar(mmc_ctx *ctx, float v);
/* Shallow copy of the struct (shares data), in the arena; grad and flags cleared. */
mmc_tensor *mmc_alias(mmc_ctx *ctx, const mmc_tensor *t);
/* Scratch memory for kernels: allocate, then release to the mark when done. */
void *mmc_scratch_alloc(mmc_ctx *ctx, size_t bytes);
mmc_arena_mark mmc_scratch_mark(mmc_ctx *ctx);
void mmc_scratch_release(mmc_ctx *ctx, mmc_arena_mark m);

/* Convenience: shape literals. mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, T, C)) */
#define MMC_SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* ------------------------------------------------------------------ autograd
 * Each differentiable op calls mmc_tape_record() after computing its output. If grad mode
 * is on and any input requires grad, a node is appended to the tape and the output is
 * marked MMC_REQUIRES_GRAD; otherwise NULL is returned and nothing is recorded.
 * Backward rules read node->out->grad and accumulate (+=) into mmc_grad(ctx, node->in[i])
 * for inputs that require grad. */
#define MMC_NODE_MAX_IN 8
typedef void (*mmc_backward_fn)(mmc_ctx *ctx, mmc_node *n);
struct mmc_node {
    const char *op;                     /* op name, for debugging and profiles */
    mmc_backward_fn backward;
    mmc_tensor *out;
    mmc_tensor *in[MMC_NODE_MAX_IN];
    int n_in;
    mmc_tensor *saved[4];               /* tensors the backward needs (e.g. rstd, lse) */
    int64_t i[8];                       /* integer arguments */
    double f[4];                        /* float arguments */
    void *extra;                        /* op-specific data, allocated in the arena */
};

mmc_node *mmc_tape_record(mmc_ctx *ctx, const char *op, mmc_backward_fn fn, mmc_tensor *out,
                          int n_in, mmc_tensor *const *in);
static inline bool mmc_requires_grad(const mmc_tensor *t) {
    return t && (t->flags & MMC_REQUIRES_GRAD);
}
/* The gradient buffer of t (contiguous f32, same shape), allocated zeroed on first use:
 * persistent for parameters, in the activation arena otherwise. */
mmc_tensor *mmc_grad(mmc_ctx *ctx, mmc_tensor *t);
/* Backpropagate from a scalar loss (seed gradient 1) through the whole tape. */
void mmc_backward(mmc_ctx *ctx, mmc_tensor *loss);
/* Backpropagate from `out` with its existing out->grad through tape nodes [from, to). */
void mmc_backward_range(mmc_ctx *ctx, int from, int to);
int mmc_tape_len(const mmc_ctx *ctx);
/* Zero the persistent gradients of the given parameters. */
void mmc_zero_grad(mmc_tensor **params, int n);

/* Activation checkpointing: run `fn` without recording inner nodes; in backward, re-run it
 * on a sub-tape and backpropagate through the recomputation. The block maps n_in inputs to
 * one output; parameters it uses are reached directly (their grads accumulate). */
typedef mmc_tensor *(*mmc_block_fn)(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in);
mmc_tensor *mmc_checkpoint(mmc_ctx *ctx, mmc_block_fn fn, void *user, mmc_tensor **in, int n_in);

/* Activation offload: between begin and end, everything the ops allocate in the context's
 * activation arena (outputs, saved tensors, tape nodes) goes to the context's mapped arena
 * (mmc_arena_new_mapped in dir, created on first use); end evicts its pages from memory, and
 * backward reads them back from the file. Reset with the context (mmc_ctx_reset). Begin
 * inside a region already open is refused. */
mmc_status mmc_ctx_offload_begin(mmc_ctx *ctx, const char *dir);
void mmc_ctx_offload_end(mmc_ctx *ctx);
/* the mapped arena's high-water mark in bytes (0 if never used) */
size_t mmc_ctx_offload_peak(const mmc_ctx *ctx);

/* Parameter hooks (data parallelism: ZeRO-3 / FSDP parameter gathering, and gradient storage
 * owned by the reducer). Models bracket each block's use of its parameters with
 * mmc_params_begin / mmc_params_end, keyed by the block (e.g. its layer struct) — in forward,
 * and again when a checkpointed block is recomputed in backward; with no hooks installed they
 * do nothing. `grad`, when set, provides a parameter's gradient buffer on its first use by
 * mmc_grad (returning NULL falls back to a persistent buffer). Layers never learn who listens. */
typedef struct {
    void (*begin)(void *user, mmc_ctx *ctx, const void *key);
    void (*end)(void *user, mmc_ctx *ctx, const void *key);
    mmc_tensor *(*grad)(void *user, mmc_ctx *ctx, mmc_tensor *param);
    void *user;
} mmc_param_hooks;
void mmc_ctx_set_param_hooks(mmc_ctx *ctx, const mmc_param_hooks *h);   /* NULL removes them */
void mmc_params_begin(mmc_ctx *ctx, const void *key);
void mmc_params_end(mmc_ctx *ctx, const void *key);

/* ------------------------------------------------------------------ random numbers
 * Counter-based (Philox-4x32-10): value k of stream (seed, offset) depends only on those,
 * so fills are reproducible across runs and thread counts. */
typedef struct { uint64_t seed; uint64_t offset; } mmc_rng;
void mmc_rng_init(mmc_rng *r, uint64_t seed);
void mmc_rng_uniform(mmc_rng *r, float *out, int64_t n, float lo, float hi);
void mmc_rng_normal(mmc_rng *r, float *out, int64_t n, float mean, float std);
uint64_t mmc_rng_u64(mmc_rng *r);
/* The raw generator: four 32-bit words for (key, 128-bit counter). */
void mmc_philox4x32(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi, uint32_t out[4]);

/* ------------------------------------------------------------------ threads */
void mmc_set_num_threads(int n);   /* 0 = all cores */
int mmc_get_num_threads(void);

/* Monotonic wall clock in seconds. */
double mmc_now(void);

#ifdef __cplusplus
}
#endif
#endif /* MMC_H */
