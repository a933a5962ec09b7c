/* arena.c — bump allocator over a list of 64-byte-aligned chunks. Chunks are kept after
 * a release or reset and reused, so a training loop reaches a steady state with no
 * malloc at all. Allocations never move: pointers stay valid until released.
 *
 * A mapped arena (mmc_arena_new_mapped, activation offload) takes its chunks from a temporary
 * file instead of the heap: the file is created with mkstemp and unlinked at once, so it is
 * gone when the process ends however it ends, and each chunk is a MAP_SHARED mapping of a
 * range of it (the file grows by ftruncate, sparse). mmc_arena_evict drops the used pages
 * from the process's resident set (madvise MADV_DONTNEED: a shared file mapping's dirty pages
 * go to the page cache, and from there to the file under memory pressure); the next access
 * faults them back in. A reset also frees the file's blocks (MADV_REMOVE), so dead
 * activations are never written back. */
#include "mmc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct chunk {
    struct chunk *next;
    size_t cap;
    size_t used;
    char *mem;
} chunk;

struct mmc_arena {
    chunk *head;      /* first chunk */
    chunk *cur;       /* chunk allocations come from */
    size_t chunk_bytes;
    size_t in_use;    /* bytes in chunks before cur + cur->used */
    size_t peak;
    int fd;           /* mapped arena: its (unlinked) file, else -1 */
    off_t file_size;  /* bytes of the file mapped so far */
};

#define ALIGN 64

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static chunk *chunk_new(mmc_arena *a, size_t cap) {
    chunk *c = calloc(1, sizeof *c);
    MMC_CHECK(c, "arena: out of memory");
    if (a->fd >= 0) {   /* the next range of the file, mapped shared */
        const size_t pg = page_size();
        cap = (cap + pg - 1) / pg * pg;
        MMC_CHECK(ftruncate(a->fd, a->file_size + (off_t)cap) == 0,
                  "offload file: cannot grow it to %lld bytes (%s); free disk space or set model.offload_dir",
                  (long long)(a->file_size + (off_t)cap), strerror(errno));
        void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, a->file_size);
        MMC_CHECK(m != MAP_FAILED, "offload file: mmap of %zu bytes failed (%s)", cap, strerror(errno));
        a->file_size += (off_t)cap;
        c->mem = m;
    } else {
        c->mem = aligned_alloc(ALIGN, (cap + ALIGN - 1) / ALIGN * ALIGN);
        MMC_CHECK(c->mem, "arena: out of memory allocating a %zu-byte chunk", cap);
    }
    c->cap = cap;
    return c;
}

static void chunk_free(const mmc_arena *a, chunk *c) {
    if (a->fd >= 0) munmap(c->mem, c->cap);
    else free(c->mem);
    free(c);
}

mmc_arena *mmc_arena_new(size_t chunk_bytes) {
    mmc_arena *a = calloc(1, sizeof *a);
    MMC_CHECK(a, "arena: out of memory");
    a->chunk_bytes = chunk_bytes ? chunk_bytes : (64u << 20);
    a->fd = -1;
    return a;
}

mmc_status mmc_arena_new_mapped(const char *dir, size_t chunk_bytes, mmc_arena **out) {
    *out = NULL;
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    char path[4096];
    if (snprintf(path, sizeof path, "%s/mmc-offload-XXXXXX", dir) >= (int)sizeof path)
        return mmc_error(MMC_ERR_INVALID, "offload directory path too long: %s", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return mmc_error(MMC_ERR_IO, "cannot create the offload file in %s (%s); set model.offload_dir to a writable "
                         "directory", dir, strerror(errno));
    unlink(path);   /* nameless from here on: removed when the process ends, however it ends */
    mmc_arena *a = mmc_arena_new(chunk_bytes);
    a->fd = fd;
    *out = a;
    return MMC_OK;
}

void mmc_arena_free(mmc_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *n; c; c = n) { n = c->next; chunk_free(a, c); }
    if (a->fd >= 0) close(a->fd);
    free(a);
}

void mmc_arena_evict(mmc_arena *a) {
    if (a->fd < 0) return;
    const size_t pg = page_size();
    for (chunk *c = a->head; c; c = c->next) {
        if (!c->used) continue;
        madvise(c->mem, (c->used + pg - 1) / pg * pg, MADV_DONTNEED);   /* the pages stay in the file */
        if (c == a->cur) break;
    }
}

size_t mmc_arena_mapped_bytes(const mmc_arena *a) { return a->fd >= 0 ? (size_t)a->file_size : 0; }

static size_t used_before(const mmc_arena *a, const chunk *upto) {
    size_t s = 0;
    for (const chunk *c = a->head; c && c != upto; c = c->next) s += c->used;
    return s;
}

void *mmc_arena_alloc(mmc_arena *a, size_t bytes) {
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (bytes == 0) bytes = ALIGN;
    if (!a->cur) {
        a->head = a->cur = chunk_new(a, bytes > a->chunk_bytes ? bytes : a->chunk_bytes);
    }
    while (a->cur->used + bytes > a->cur->cap) {
        chunk *n = a->cur->next;
        if (n && n->cap < bytes) {            /* retained chunk too small: replace it */
            a->cur->next = n->next;
            chunk_free(a, n);
            continue;
        }
        if (!n) {
            n = chunk_new(a, bytes > a->chunk_bytes ? bytes : a->chunk_bytes);
            a->cur->next = n;
        }
        n->used = 0;
        a->cur = n;
    }
    void *p = a->cur->mem + a->cur->used;
    a->cur->used += bytes;
    a->in_use += bytes;
    if (a->in_use > a->peak) a->peak = a->in_use;
    return p;
}

mmc_arena_mark mmc_arena_get_mark(mmc_arena *a) {
    mmc_arena_mark m = {a->cur, a->cur ? a->cur->used : 0};
    return m;
}

void mmc_arena_release(mmc_arena *a, mmc_arena_mark m) {
    if (!m.chunk) { mmc_arena_reset(a); return; }
    a->cur = m.chunk;
    a->cur->used = m.used;
    a->in_use = used_before(a, a->cur) + a->cur->used;
}

void mmc_arena_reset(mmc_arena *a) {
    for (chunk *c = a->head; c; c = c->next) {
        if (a->fd >= 0 && c->used) madvise(c->mem, c->cap, MADV_REMOVE);   /* dead: free the file's blocks */
        c->used = 0;
    }
    a->cur = a->head;
    a->in_use = 0;
}

size_t mmc_arena_used(const mmc_arena *a) { return a->in_use; }
size_t mmc_arena_peak(const mmc_arena *a) { return a->peak; }
