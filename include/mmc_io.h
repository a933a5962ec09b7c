/* mmc_io.h — file formats: safetensors (read via mmap, zero-copy; write atomically),
 * Hugging Face config.json access, and YAML run configs.
 *
 * Every reader validates what it reads and fails with an mmc_status whose message names
 * the file, the key or byte offset, and the reason.
 */
#ifndef MMC_IO_H
#define MMC_IO_H

#include "mmc.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- safetensors
 * A set of tensors opened from one file, or from a sharded checkpoint through its
 * model.safetensors.index.json. Tensor data stay in the mmapped files. */
typedef struct mmc_st mmc_st;

typedef struct {
    const char *name;
    mmc_dtype dtype;
    int ndim;
    int64_t shape[MMC_MAX_DIMS];
    const void *data;     /* into the mapping; little-endian, contiguous; aligned to the
                           * element size only if the writer padded the header (the Python
                           * library and mmc_stw do; mmc_st_tensor refuses unaligned data) */
    size_t nbytes;
} mmc_st_entry;

/* Open a .safetensors file, a *.index.json, or a directory (model.safetensors or
 * model.safetensors.index.json inside it). */
mmc_status mmc_st_open(const char *path, mmc_st **out);
/* Parse a safetensors image held in memory (buf must outlive the handle; `what` names it in
 * errors). Used by the fuzzer and for embedded blobs. */
mmc_status mmc_st_open_memory(const void *buf, size_t n, const char *what, mmc_st **out);
void mmc_st_close(mmc_st *st);
/* A set built in memory, of entries viewing data the caller keeps alive until mmc_st_close: the
 * renamed / re-sliced views of another set that the single-file checkpoint loaders hand to the
 * model loaders. A name added twice is MMC_ERR_FORMAT. */
mmc_status mmc_st_new_view(mmc_st **out);
mmc_status mmc_st_add_view(mmc_st *st, const char *name, mmc_dtype dt, int ndim, const int64_t *shape,
                           const void *data);
int mmc_st_count(const mmc_st *st);
const mmc_st_entry *mmc_st_at(const mmc_st *st, int i);
const mmc_st_entry *mmc_st_find(const mmc_st *st, const char *name); /* NULL if absent */
/* __metadata__ value for key (first file), or NULL. */
const char *mmc_st_metadata(const mmc_st *st, const char *key);
/* A tensor struct viewing the entry's data (persistent struct, data not owned). */
mmc_tensor *mmc_st_tensor(const mmc_st *st, const char *name);
/* Copy entry `name` into dst (contiguous, same numel), converting dtype (e.g. BF16 -> F32).
 * Fails with MMC_ERR_NOT_FOUND / MMC_ERR_SHAPE naming the tensor and both shapes. */
mmc_status mmc_st_read_into(const mmc_st *st, const char *name, mmc_tensor *dst);

/* Writer: collect tensors, then write header + data to path.tmp, fsync, rename to path.
 * Tensor data are copied at mmc_stw_add time only as pointers: keep them alive until
 * mmc_stw_write. */
typedef struct mmc_stw mmc_stw;
mmc_stw *mmc_stw_new(void);
void mmc_stw_free(mmc_stw *w);
mmc_status mmc_stw_add(mmc_stw *w, const char *name, const mmc_tensor *t); /* contiguous */
mmc_status mmc_stw_add_raw(mmc_stw *w, const char *name, mmc_dtype dt, int ndim,
                           const int64_t *shape, const void *data);
mmc_status mmc_stw_set_metadata(mmc_stw *w, const char *key, const char *value);
mmc_status mmc_stw_write(mmc_stw *w, const char *path);

/* Atomic whole-file write: path.tmp.<pid>, fsync, rename, fsync dir. */
mmc_status mmc_write_file_atomic(const char *path, const void *data, size_t n);
/* Read a whole file (NUL-terminated; *len excludes the NUL). Caller frees. */
mmc_status mmc_read_file(const char *path, char **data, size_t *len);
/* Lines of a text read by mmc_read_file (JSONL, lists), split in place: the next line that is not blank,
 * NUL-terminated, leading blanks (' ', '\t', '\r') skipped; *lineno counts every line read (1-based, for
 * "file:line" errors). NULL at the end. Start with *cursor = the text, *lineno = 0. */
char *mmc_next_line(char **cursor, int *lineno);

/* ---------------------------------------------------------------- JSON (cJSON)
 * Thin typed accessors over cJSON for config.json-like files. Paths are dotted
 * ("vision_config.depth", "rope_scaling.mrope_section"). */
typedef struct mmc_json mmc_json;        /* an opaque cJSON node */
mmc_status mmc_json_load(const char *path, mmc_json **out);   /* errors name line:col */
mmc_status mmc_json_parse(const char *text, size_t len, const char *what, mmc_json **out);
void mmc_json_free(mmc_json *j);
const mmc_json *mmc_json_get(const mmc_json *j, const char *dotted);  /* NULL if absent */
bool mmc_json_has(const mmc_json *j, const char *dotted);
bool mmc_json_is_object(const mmc_json *j);   /* a { ... } node (a config file's root must be) */
/* Typed reads: missing key (or JSON null) -> *out = def and MMC_OK; wrong type ->
 * MMC_ERR_FORMAT naming the file (when j is the root from load/parse), the key, the
 * expected and found types. A path segment that is a number indexes an array
 * ("layer_types.3"). Integers accept integral numbers (1e6), not 1.5 or true. */
mmc_status mmc_json_int(const mmc_json *j, const char *dotted, int64_t def, int64_t *out);
mmc_status mmc_json_num(const mmc_json *j, const char *dotted, double def, double *out);
mmc_status mmc_json_bool(const mmc_json *j, const char *dotted, bool def, bool *out);
/* Returns a pointer into the tree (valid until mmc_json_free), or def. */
mmc_status mmc_json_str(const mmc_json *j, const char *dotted, const char *def, const char **out);
/* Write s as a JSON string literal (quotes, escapes) to f. */
void mmc_json_write_string(FILE *f, const char *s);
/* Integer array; *n in = capacity, out = count (MMC_ERR_INVALID if longer than capacity). */
mmc_status mmc_json_int_array(const mmc_json *j, const char *dotted, int64_t *vals, int *n);

/* ---------------------------------------------------------------- YAML (libyaml)
 * A YAML document parsed into a small tree with line numbers, then read into typed
 * structs through a schema: every key is checked, unknown keys are errors that name the
 * key, its line and the closest valid key. */
typedef struct mmc_yaml mmc_yaml;        /* a node: map, list or scalar */
typedef enum { MMC_YAML_MAP, MMC_YAML_LIST, MMC_YAML_SCALAR, MMC_YAML_NULL } mmc_yaml_kind;

mmc_status mmc_yaml_load(const char *path, mmc_yaml **out);
mmc_status mmc_yaml_parse(const char *text, size_t len, const char *what, mmc_yaml **out);
void mmc_yaml_free(mmc_yaml *y);
mmc_yaml_kind mmc_yaml_kind_of(const mmc_yaml *y);
int mmc_yaml_line(const mmc_yaml *y);                    /* 1-based */
const mmc_yaml *mmc_yaml_get(const mmc_yaml *map, const char *key);   /* NULL if absent */
int mmc_yaml_len(const mmc_yaml *y);                     /* map entries / list items */
const mmc_yaml *mmc_yaml_item(const mmc_yaml *y, int i); /* list item / map value */
const char *mmc_yaml_key(const mmc_yaml *map, int i);
const char *mmc_yaml_scalar(const mmc_yaml *y);          /* NULL unless scalar */
/* Set a value at a dotted path, creating maps as needed ("optimizer.lr=1e-4" overrides).
 * A value starting with [ { " or ' is parsed as YAML (flow list/map, quoted scalar); any
 * other text is a plain scalar. Fails (MMC_ERR_INVALID) if a path prefix is a scalar/list. */
mmc_status mmc_yaml_set(mmc_yaml *root, const char *dotted, const char *value);

/* Schema-driven reading into a struct. */
typedef enum {
    MMC_CFG_INT, MMC_CFG_FLOAT, MMC_CFG_BOOL, MMC_CFG_STR, MMC_CFG_ENUM,
    MMC_CFG_STR_LIST, MMC_CFG_SECTION
} mmc_cfg_type;
typedef struct mmc_cfg_field {
    const char *key;
    mmc_cfg_type type;
    size_t offset;            /* offsetof(struct, field) */
    double min, max;          /* range for INT/FLOAT (min > max: unchecked) */
    const char *const *enum_values; /* NULL-terminated, for ENUM (stored as int index) */
    const struct mmc_cfg_field *section; /* fields of a SECTION (terminated by key == NULL) */
    const char *help;
} mmc_cfg_field;
/* STR -> char* (strdup'ed, caller frees with mmc_cfg_free); STR_LIST -> struct
 * { char **items; int n; } (mmc_str_list); INT -> int64_t; FLOAT -> double; BOOL -> bool;
 * ENUM -> int (index into enum_values; a STR_LIST's enum_values are keywords a scalar may give in
 * place of the list, kept as a one-item list); SECTION -> a nested struct at `offset` whose fields
 * (offsets relative to it) are `section`.
 * Keys absent from the YAML keep the value already in dst (fill defaults first). STR and
 * STR_LIST slots must start NULL/empty or heap-allocated: a new value frees the old one.
 * Errors (the first one, in file order): MMC_ERR_FORMAT for a wrong type, an unknown key
 * ("run.yaml:3: unknown key 'optimiser' (did you mean 'optimizer'?)"), MMC_ERR_INVALID for
 * a value out of [min, max] or not among enum_values. Values set by mmc_yaml_set are
 * reported as "run.yaml: --set optimizer.lr: ...". After an error dst may hold some new
 * values: call mmc_cfg_free either way. */
typedef struct { char **items; int n; } mmc_str_list;
mmc_status mmc_cfg_read(const mmc_yaml *map, const mmc_cfg_field *fields, void *dst,
                        const char *file);
void mmc_cfg_free(const mmc_cfg_field *fields, void *dst);

#ifdef __cplusplus
}
#endif
#endif /* MMC_IO_H */
