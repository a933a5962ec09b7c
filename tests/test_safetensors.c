/* test_safetensors.c — the safetensors reader and writer against files made by the Python
 * `safetensors` package (tools/ref/gen_io.py): every dtype, byte-identical writing,
 * sharded checkpoints, and ~30 malformed files whose verdicts must agree with Python's
 * loader (bad/cases.json), plus atomic-write failure handling. */
#include "test_util.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIX "tests/fixtures/io/"
#define TMP "/tmp/mmc_io_test"

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
#define CHECK_MSG(sub) CHECKF(contains(mmc_last_error(), sub), "message '%s' lacks '%s'", mmc_last_error(), sub)

static char *slurp(const char *path, size_t *n) {
    char *d = NULL;
    if (mmc_read_file(path, &d, n) != MMC_OK) return NULL;
    return d;
}

/* i * 0.1 - 0.3 without FMA contraction (numpy/torch round the product first) */
static double lin(int i) {
    volatile double p = i * 0.1;
    return p - 0.3;
}

/* ---- the tensors of all_dtypes.safetensors (same formulas as gen_io.py:all_dtypes) */
typedef struct {
    float f32[6], scalar, ones[2];
    double f64[6];
    uint16_t bf16[6], f16[6];
    int32_t i32[6];
    int64_t i64[6];
    uint8_t u8[6], b[6];
    int8_t i8[6];
} all_data;

static void make_all(all_data *d, mmc_stw *w) {
    for (int i = 0; i < 6; i++) {
        d->f32[i] = (float)(i * 0.5 - 1.25);
        d->f64[i] = lin(i);
        d->bf16[i] = mmc_f32_to_bf16((float)lin(i));
        d->f16[i] = mmc_f32_to_f16((float)lin(i));
        d->i32[i] = i * 1000 - 2500;
        d->i64[i] = (int64_t)(i - 3) * ((int64_t)1 << 40);
        d->u8[i] = (uint8_t)(i * 50);
        d->i8[i] = (int8_t)(i * 40 - 100);
        d->b[i] = (uint8_t)(i % 2);
    }
    d->scalar = 3.5f;
    d->ones[0] = d->ones[1] = 1.0f;
    CHECK_OK(mmc_stw_add_raw(w, "f32", MMC_F32, 2, MMC_SHAPE(2, 3), d->f32));
    CHECK_OK(mmc_stw_add_raw(w, "f64", MMC_F64, 2, MMC_SHAPE(2, 3), d->f64));
    CHECK_OK(mmc_stw_add_raw(w, "bf16", MMC_BF16, 2, MMC_SHAPE(3, 2), d->bf16));
    CHECK_OK(mmc_stw_add_raw(w, "f16", MMC_F16, 1, MMC_SHAPE(6), d->f16));
    CHECK_OK(mmc_stw_add_raw(w, "i32", MMC_I32, 3, MMC_SHAPE(1, 2, 3), d->i32));
    CHECK_OK(mmc_stw_add_raw(w, "i64", MMC_I64, 2, MMC_SHAPE(2, 3), d->i64));
    CHECK_OK(mmc_stw_add_raw(w, "u8", MMC_U8, 2, MMC_SHAPE(2, 3), d->u8));
    CHECK_OK(mmc_stw_add_raw(w, "i8", MMC_I8, 2, MMC_SHAPE(2, 3), d->i8));
    CHECK_OK(mmc_stw_add_raw(w, "bool", MMC_BOOL, 2, MMC_SHAPE(2, 3), d->b));
    CHECK_OK(mmc_stw_add_raw(w, "scalar", MMC_F32, 0, NULL, &d->scalar));
    CHECK_OK(mmc_stw_add_raw(w, "empty", MMC_F32, 1, MMC_SHAPE(0), NULL));
    CHECK_OK(mmc_stw_add_raw(w, "model.layers.0.\xc3\xbcn\xc3\xaf" "code", MMC_F32, 1, MMC_SHAPE(2), d->ones));
    CHECK_OK(mmc_stw_set_metadata(w, "format", "placeholder"));
    CHECK_OK(mmc_stw_set_metadata(w, "format", "pt"));   /* replacing keeps one key */
}

static void check_all(const mmc_st *st, const char *what) {
    CHECKF(mmc_st_count(st) == 12, "%s: %d tensors", what, mmc_st_count(st));
    const mmc_st_entry *e = mmc_st_find(st, "i32");
    CHECK(e && e->dtype == MMC_I32 && e->ndim == 3 && e->shape[0] == 1 && e->shape[2] == 3 && e->nbytes == 24);
    e = mmc_st_find(st, "scalar");
    CHECK(e && e->ndim == 0 && e->nbytes == 4 && *(const float *)e->data == 3.5f);
    e = mmc_st_find(st, "empty");
    CHECK(e && e->ndim == 1 && e->shape[0] == 0 && e->nbytes == 0);
    CHECK(mmc_st_find(st, "model.layers.0.\xc3\xbcn\xc3\xaf" "code") != NULL);
    CHECK(mmc_st_find(st, "F32") == NULL);
    CHECK(mmc_st_metadata(st, "format") && strcmp(mmc_st_metadata(st, "format"), "pt") == 0);
    CHECK(mmc_st_metadata(st, "missing") == NULL);
    /* every dtype, read through a wrapping tensor (exact values) */
    static const char *names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "i8", "bool"};
    for (int k = 0; k < 9; k++) {
        mmc_tensor *t = mmc_st_tensor(st, names[k]);
        CHECK(t && mmc_numel(t) == 6);
        if (!t) continue;
        for (int i = 0; i < 6; i++) {
            double want;
            switch (k) {
            case 0: want = i * 0.5 - 1.25; break;
            case 1: want = lin(i); break;
            case 2: want = mmc_bf16_to_f32(mmc_f32_to_bf16((float)lin(i))); break;
            case 3: want = mmc_f16_to_f32(mmc_f32_to_f16((float)lin(i))); break;
            case 4: want = i * 1000 - 2500; break;
            case 5: want = (double)((int64_t)(i - 3) * ((int64_t)1 << 40)); break;
            case 6: want = i * 50; break;
            case 7: want = i * 40 - 100; break;
            default: want = i % 2; break;
            }
            /* exact: the fixture holds these very values */
            CHECKF(mmc_get_flat(t, i) == want, "%s: %s[%d] = %.17g, want %.17g", what, names[k], i,
                   mmc_get_flat(t, i), want);
        }
        mmc_tensor_free(t);
    }
    /* conversion on read: bf16 -> f32 exact, f32 -> bf16 rounded like torch */
    mmc_tensor *f = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(3, 2));
    CHECK_OK(mmc_st_read_into(st, "bf16", f));
    CHECK(mmc_get_flat(f, 4) == mmc_bf16_to_f32(mmc_f32_to_bf16((float)(4 * 0.1 - 0.3))));
    mmc_tensor *wrong = mmc_tensor_new(MMC_F32, 1, MMC_SHAPE(5));
    CHECK_ERR(mmc_st_read_into(st, "bf16", wrong), MMC_ERR_SHAPE);
    CHECK_MSG("bf16");
    CHECK_MSG("[3, 2]");
    CHECK_ERR(mmc_st_read_into(st, "nope", f), MMC_ERR_NOT_FOUND);
    CHECK_MSG("nope");
    CHECK(mmc_st_tensor(st, "nope") == NULL);
    mmc_tensor_free(f);
    mmc_tensor_free(wrong);
}

static void test_all_dtypes(void) {
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open(FIX "all_dtypes.safetensors", &st));
    if (st) { check_all(st, "python-written"); mmc_st_close(st); }

    /* mmc writes the same bytes as safetensors.torch.save_file */
    mkdir(TMP, 0755);
    all_data d;
    mmc_stw *w = mmc_stw_new();
    make_all(&d, w);
    CHECK_OK(mmc_stw_write(w, TMP "/all_dtypes_mmc.safetensors"));
    mmc_stw_free(w);
    size_t na = 0, nb = 0;
    char *a = slurp(FIX "all_dtypes.safetensors", &na), *b = slurp(TMP "/all_dtypes_mmc.safetensors", &nb);
    CHECK(a && b);
    CHECKF(a && b && na == nb && memcmp(a, b, na) == 0, "mmc output differs from save_file (%zu vs %zu "
           "bytes); header mmc: %.200s", nb, na, b ? b + 8 : "");
    st = NULL;
    CHECK_OK(mmc_st_open(TMP "/all_dtypes_mmc.safetensors", &st));
    if (st) { check_all(st, "mmc-written"); mmc_st_close(st); }
    /* the same image from memory */
    if (b) {
        st = NULL;
        CHECK_OK(mmc_st_open_memory(b, nb, "mem", &st));
        if (st) { check_all(st, "memory"); mmc_st_close(st); }
    }
    free(a);
    free(b);

    /* JSON escapes in names and metadata, as serde_json writes them */
    const char *note = "quote \" backslash \\ newline \n tab \t \x01 \xc3\xbcn\xc3\xaf";
    float one = 1;
    w = mmc_stw_new();
    CHECK_OK(mmc_stw_add_raw(w, "we\"ird\\name\t", MMC_F32, 1, MMC_SHAPE(1), &one));
    CHECK_OK(mmc_stw_set_metadata(w, "note", note));
    CHECK_OK(mmc_stw_write(w, TMP "/escapes_mmc.safetensors"));
    mmc_stw_free(w);
    a = slurp(FIX "escapes.safetensors", &na);
    b = slurp(TMP "/escapes_mmc.safetensors", &nb);
    CHECKF(a && b && na == nb && memcmp(a, b, na) == 0, "escapes: mmc header %.200s", b ? b + 8 : "");
    free(a);
    free(b);
    st = NULL;
    CHECK_OK(mmc_st_open(FIX "escapes.safetensors", &st));
    if (st) {
        CHECK(mmc_st_find(st, "we\"ird\\name\t") != NULL);
        CHECK(mmc_st_metadata(st, "note") && strcmp(mmc_st_metadata(st, "note"), note) == 0);
        mmc_st_close(st);
    }
}

static void test_sharded(void) {
    mmc_st *dir = NULL, *idx = NULL, *s2 = NULL;
    CHECK_OK(mmc_st_open(FIX "sharded", &dir));
    CHECK_OK(mmc_st_open(FIX "sharded/model.safetensors.index.json", &idx));
    CHECK_OK(mmc_st_open(FIX "sharded/model-00002-of-00002.safetensors", &s2));
    if (dir && idx && s2) {
        CHECK(mmc_st_count(dir) == 5 && mmc_st_count(idx) == 5 && mmc_st_count(s2) == 3);
        const mmc_st_entry *a = mmc_st_find(dir, "embed"), *b = mmc_st_find(s2, "embed");
        CHECK(a && b && a->dtype == MMC_BF16 && a->nbytes == 24 && memcmp(a->data, b->data, 24) == 0);
        CHECK(mmc_st_find(dir, "layers.0.w") && mmc_st_find(dir, "layers.1.b"));
        CHECK(mmc_st_metadata(dir, "format") && strcmp(mmc_st_metadata(dir, "format"), "pt") == 0);
    }
    mmc_st_close(dir);
    mmc_st_close(idx);
    mmc_st_close(s2);

    mmc_st *st = (mmc_st *)1;
    CHECK_ERR(mmc_st_open(FIX "sharded_missing", &st), MMC_ERR_NOT_FOUND);
    CHECK(st == NULL);
    CHECK_MSG("model-00002-of-00002.safetensors");
    CHECK_MSG("missing");
    CHECK_ERR(mmc_st_open(FIX "nomodel", &st), MMC_ERR_NOT_FOUND);
    CHECK_MSG("nomodel");
    CHECK_MSG("no model.safetensors");
    CHECK_ERR(mmc_st_open(FIX "does_not_exist.safetensors", &st), MMC_ERR_NOT_FOUND);
    CHECK_MSG("does_not_exist.safetensors");

    /* index files that lie */
    mkdir(TMP "/idx", 0755);
    const char *bad_json = "{\n  \"weight_map\": {\n    \"a\": \"x.safetensors\",,\n  }\n}\n";
    CHECK_OK(mmc_write_file_atomic(TMP "/idx/bad.index.json", bad_json, strlen(bad_json)));
    CHECK_ERR(mmc_st_open(TMP "/idx/bad.index.json", &st), MMC_ERR_FORMAT);
    CHECK_MSG("bad.index.json:3:");
    const char *escape = "{\"weight_map\": {\"a\": \"../all_dtypes.safetensors\"}}";
    CHECK_OK(mmc_write_file_atomic(TMP "/idx/esc.index.json", escape, strlen(escape)));
    CHECK_ERR(mmc_st_open(TMP "/idx/esc.index.json", &st), MMC_ERR_FORMAT);
    CHECK_MSG("plain file name");
    const char *nomap = "{\"metadata\": {}}";
    CHECK_OK(mmc_write_file_atomic(TMP "/idx/nomap.index.json", nomap, strlen(nomap)));
    CHECK_ERR(mmc_st_open(TMP "/idx/nomap.index.json", &st), MMC_ERR_FORMAT);
    CHECK_MSG("weight_map");
    /* a tensor listed in the index but absent from its shard */
    mmc_stw *w = mmc_stw_new();
    float one = 1;
    CHECK_OK(mmc_stw_add_raw(w, "present", MMC_F32, 1, MMC_SHAPE(1), &one));
    CHECK_OK(mmc_stw_write(w, TMP "/idx/s.safetensors"));
    mmc_stw_free(w);
    const char *lies = "{\"weight_map\": {\"present\": \"s.safetensors\", \"ghost\": \"s.safetensors\"}}";
    CHECK_OK(mmc_write_file_atomic(TMP "/idx/lies.index.json", lies, strlen(lies)));
    CHECK_ERR(mmc_st_open(TMP "/idx/lies.index.json", &st), MMC_ERR_NOT_FOUND);
    CHECK_MSG("ghost");
    /* the same tensor in two shards */
    const char *twice = "{\"weight_map\": {\"present\": \"s.safetensors\", \"x\": \"t.safetensors\"}}";
    w = mmc_stw_new();
    CHECK_OK(mmc_stw_add_raw(w, "present", MMC_F32, 1, MMC_SHAPE(1), &one));
    CHECK_OK(mmc_stw_write(w, TMP "/idx/t.safetensors"));
    mmc_stw_free(w);
    CHECK_OK(mmc_write_file_atomic(TMP "/idx/twice.index.json", twice, strlen(twice)));
    CHECK_ERR(mmc_st_open(TMP "/idx/twice.index.json", &st), MMC_ERR_FORMAT);
    CHECK_MSG("appears twice");
}

/* Each malformed file: expected status and a piece of the message. Python's verdict comes
 * from bad/cases.json; mmc must reject everything Python rejects. */
static const struct { const char *name; mmc_status st; const char *msg; } g_bad[] = {
    {"empty", MMC_ERR_FORMAT, "empty file"},
    {"short", MMC_ERR_FORMAT, "too short"},
    {"hlen_lies", MMC_ERR_FORMAT, "header length 1000 exceeds"},
    {"hlen_huge", MMC_ERR_FORMAT, "100 MB"},
    {"bad_json", MMC_ERR_FORMAT, "header:2:"},
    {"not_object", MMC_ERR_FORMAT, "expected a JSON object"},
    {"unknown_dtype", MMC_ERR_FORMAT, "unknown dtype 'Q7'"},
    {"lowercase_dtype", MMC_ERR_FORMAT, "unknown dtype 'f32'"},
    {"shape_mismatch", MMC_ERR_FORMAT, "needs 12 bytes"},
    {"offsets_outside", MMC_ERR_FORMAT, "outside the 8-byte data buffer"},
    {"offsets_reversed", MMC_ERR_FORMAT, "[8, 4]"},
    {"gap", MMC_ERR_FORMAT, "gap"},
    {"overlap", MMC_ERR_FORMAT, "overlap"},
    {"trailing_bytes", MMC_ERR_FORMAT, "cover 8 bytes of the 12-byte"},
    {"truncated", MMC_ERR_FORMAT, "outside the 12-byte data buffer"},
    {"negative_dim", MMC_ERR_FORMAT, "shape[0]"},
    {"fractional_dim", MMC_ERR_FORMAT, "shape[0]"},
    {"meta_not_string", MMC_ERR_FORMAT, "__metadata__['k']"},
    {"bad_utf8", MMC_ERR_FORMAT, "UTF-8"},
    {"missing_offsets", MMC_ERR_FORMAT, "'data_offsets' is missing"},
    {"three_offsets", MMC_ERR_FORMAT, "3 elements"},
    {"shape_overflow", MMC_ERR_FORMAT, "overflow"},
    {"trailing_junk", MMC_ERR_FORMAT, "trailing characters"},
    {"entry_not_object", MMC_ERR_FORMAT, "expected an object"},
    {"ok_out_of_order", MMC_OK, ""},
    {"ok_whitespace", MMC_OK, ""},
    {"ok_zero_size", MMC_OK, ""},
    {"ok_meta_null", MMC_OK, ""},
    {"dup_name", MMC_ERR_FORMAT, "appears twice"},      /* Python keeps the last one */
    {"dtype_f8", MMC_ERR_UNSUPPORTED, "F8_E4M3"},        /* valid, not supported by mmc */
    {"six_dims", MMC_ERR_UNSUPPORTED, "6 dims"},
};

static void test_bad_files(void) {
    mmc_json *cases = NULL;
    CHECK_OK(mmc_json_load(FIX "bad/cases.json", &cases));
    int n = (int)(sizeof g_bad / sizeof *g_bad), covered = 0;
    for (int i = 0; i < n; i++) {
        char path[256], key[128];
        snprintf(path, sizeof path, FIX "bad/%s.safetensors", g_bad[i].name);
        mmc_st *st = (mmc_st *)1;
        mmc_clear_error();
        mmc_status rc = mmc_st_open(path, &st);
        CHECKF(rc == g_bad[i].st, "%s: got %d (%s), expected %d", g_bad[i].name, rc, mmc_last_error(),
               g_bad[i].st);
        if (rc) {
            CHECK(st == NULL);
            CHECKF(contains(mmc_last_error(), g_bad[i].msg) && contains(mmc_last_error(), g_bad[i].name),
                   "%s: message '%s' lacks '%s' or the file name", g_bad[i].name, mmc_last_error(),
                   g_bad[i].msg);
        } else {
            mmc_st_close(st);
        }
        /* parity with the Python loader */
        snprintf(key, sizeof key, "%s.python_ok", g_bad[i].name);
        bool py_ok = false;
        if (cases && mmc_json_has(cases, key)) {
            covered++;
            CHECK_OK(mmc_json_bool(cases, key, false, &py_ok));
            if (!py_ok) CHECKF(rc != MMC_OK, "%s: Python rejects it but mmc accepted", g_bad[i].name);
            bool stricter = strcmp(g_bad[i].name, "dup_name") == 0 || rc == MMC_ERR_UNSUPPORTED;
            if (py_ok && !stricter) CHECKF(rc == MMC_OK, "%s: Python accepts it, mmc: %s", g_bad[i].name,
                                           mmc_last_error());
        }
        /* the same bytes through the memory entry point agree */
        size_t len = 0;
        char *buf = slurp(path, &len);
        if (buf) {
            mmc_st *ms = NULL;
            mmc_status mrc = mmc_st_open_memory(buf, len, path, &ms);
            CHECKF(mrc == rc, "%s: memory %d vs file %d", g_bad[i].name, mrc, rc);
            mmc_st_close(ms);
            free(buf);
        }
    }
    CHECKF(cases == NULL || covered == n, "cases.json covers %d of %d", covered, n);
    mmc_json_free(cases);
}

/* A header that is not padded leaves the data unaligned (found by fuzz_safetensors):
 * reading converts through an aligned buffer, zero-copy views are refused. */
static void test_unaligned(void) {
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[12,13]}}";
    size_t hl = strlen(hdr);
    unsigned char img[256];
    memset(img, 0, sizeof img);
    for (int i = 0; i < 8; i++) img[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, hdr, hl);
    float v[3] = {1.5f, -2.0f, 3.25f};
    memcpy(img + 8 + hl, v, sizeof v);
    img[8 + hl + 12] = 7;
    CHECK(((8 + hl) % 4) != 0);
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open_memory(img, 8 + hl + 13, "unaligned", &st));
    if (!st) return;
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 1, MMC_SHAPE(3));
    CHECK_OK(mmc_st_read_into(st, "a", t));
    CHECK(((float *)t->data)[0] == 1.5f && ((float *)t->data)[2] == 3.25f);
    CHECK(mmc_st_tensor(st, "a") == NULL);
    CHECK_MSG("aligned");
    mmc_tensor *b = mmc_st_tensor(st, "b");            /* bytes are always aligned */
    CHECK(b && mmc_get_flat(b, 0) == 7);
    mmc_tensor_free(b);
    mmc_tensor_free(t);
    mmc_st_close(st);
}

static bool tmp_left(const char *dir) {
    DIR *d = opendir(dir);
    bool found = false;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) found = true;
    if (d) closedir(d);
    return found;
}

static void test_writer(void) {
    mkdir(TMP "/w", 0755);
    const char *path = TMP "/w/model.safetensors";
    /* many tensors: hash lookup + write order */
    enum { N = 2000 };
    static float vals[N];
    mmc_stw *w = mmc_stw_new();
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.weight", i);
        vals[i] = (float)i;
        CHECK_OK(mmc_stw_add_raw(w, name, MMC_F32, 1, MMC_SHAPE(1), &vals[i]));
    }
    CHECK_ERR(mmc_stw_add_raw(w, "model.layers.7.mlp.weight", MMC_F32, 1, MMC_SHAPE(1), vals), MMC_ERR_INVALID);
    CHECK_MSG("added twice");
    CHECK_ERR(mmc_stw_add_raw(w, "__metadata__", MMC_F32, 1, MMC_SHAPE(1), vals), MMC_ERR_INVALID);
    CHECK_ERR(mmc_stw_add_raw(w, "q", MMC_NF4, 1, MMC_SHAPE(64), vals), MMC_ERR_UNSUPPORTED);
    CHECK_ERR(mmc_stw_add_raw(w, "neg", MMC_F32, 1, MMC_SHAPE(-1), vals), MMC_ERR_INVALID);
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(4, 4));
    mmc_tensor view = *t;
    view.stride[0] = 1; view.stride[1] = 4;    /* transposed view: not contiguous */
    CHECK_ERR(mmc_stw_add(w, "view", &view), MMC_ERR_INVALID);
    CHECK_OK(mmc_stw_add(w, "t", t));
    CHECK_OK(mmc_stw_write(w, path));
    mmc_stw_free(w);
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open(path, &st));
    if (st) {
        CHECK(mmc_st_count(st) == N + 1);
        int ok = 0;
        double t0 = mmc_now();
        for (int rep = 0; rep < 10; rep++)
            for (int i = 0; i < N; i++) {
                char name[64];
                snprintf(name, sizeof name, "model.layers.%d.mlp.weight", i);
                const mmc_st_entry *e = mmc_st_find(st, name);
                ok += e && *(const float *)e->data == (float)i;
            }
        double dt = mmc_now() - t0;
        CHECK(ok == 10 * N);
        CHECKF(dt < 0.5, "20000 lookups took %.3f s", dt);   /* a linear scan takes ~100x longer */
        CHECK(mmc_st_find(st, "t") && mmc_st_find(st, "t")->nbytes == 64);
        mmc_st_close(st);
    }
    mmc_tensor_free(t);
    CHECK(!tmp_left(TMP "/w"));

    /* a failed write leaves the old file intact and no temp file: the file-size limit
     * makes write() fail half-way */
    size_t n0 = 0;
    char *before = slurp(path, &n0);
    static float big[1 << 16];
    w = mmc_stw_new();
    CHECK_OK(mmc_stw_add_raw(w, "big", MMC_F32, 1, MMC_SHAPE(1 << 16), big));
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 16384;
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        CHECK_ERR(mmc_stw_write(w, path), MMC_ERR_IO);
        CHECK_MSG("write failed");
        setrlimit(RLIMIT_FSIZE, &old);
        size_t n1 = 0;
        char *after = slurp(path, &n1);
        CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
        free(after);
        CHECK(!tmp_left(TMP "/w"));
    }
    /* rename onto a directory fails: temp file removed */
    mkdir(TMP "/w/isdir", 0755);
    CHECK_ERR(mmc_stw_write(w, TMP "/w/isdir"), MMC_ERR_IO);
    CHECK_MSG("isdir");
    CHECK(!tmp_left(TMP "/w"));
    /* a directory that does not exist */
    CHECK_ERR(mmc_stw_write(w, TMP "/no/such/dir/x.safetensors"), MMC_ERR_IO);
    CHECK_MSG("x.safetensors");
    mmc_stw_free(w);
    free(before);
    /* an empty writer makes a valid empty file */
    w = mmc_stw_new();
    CHECK_OK(mmc_stw_write(w, TMP "/w/empty.safetensors"));
    mmc_stw_free(w);
    st = NULL;
    CHECK_OK(mmc_st_open(TMP "/w/empty.safetensors", &st));
    CHECK(st && mmc_st_count(st) == 0);
    mmc_st_close(st);
}

int main(void) {
    test_all_dtypes();
    test_sharded();
    test_bad_files();
    test_writer();
    test_unaligned();
    return test_done("test_safetensors");
}
