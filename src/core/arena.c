/* arena.c — bump allocator over a list of 64-byte-aligned chunks. Chunks are kept after
 * a release or reset and reused, so a training loop reaches a steady state with no
 * malloc at all. Allocations never move: pointers stay valid until released. */
#include "mmc.h"

#include <stdlib.h>
#include <string.h>

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
};

#define ALIGN 64

static chunk *chunk_new(size_t cap) {
    chunk *c = calloc(1, sizeof *c);
    MMC_CHECK(c, "arena: out of memory");
    c->mem = aligned_alloc(ALIGN, (cap + ALIGN - 1) / ALIGN * ALIGN);
    MMC_CHECK(c->mem, "arena: out of memory allocating a %zu-byte chunk", cap);
    c->cap = cap;
    return c;
}

mmc_arena *mmc_arena_new(size_t chunk_bytes) {
    mmc_arena *a = calloc(1, sizeof *a);
    MMC_CHECK(a, "arena: out of memory");
    a->chunk_bytes = chunk_bytes ? chunk_bytes : (64u << 20);
    return a;
}

void mmc_arena_free(mmc_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *n; c; c = n) { n = c->next; free(c->mem); free(c); }
    free(a);
}

static size_t used_before(const mmc_arena *a, const chunk *upto) {
    size_t s = 0;
    for (const chunk *c = a->head; c && c != upto; c = c->next) s += c->used;
    return s;
}

void *mmc_arena_alloc(mmc_arena *a, size_t bytes) {
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (bytes == 0) bytes = ALIGN;
    if (!a->cur) {
        a->head = a->cur = chunk_new(bytes > a->chunk_bytes ? bytes : a->chunk_bytes);
    }
    while (a->cur->used + bytes > a->cur->cap) {
        chunk *n = a->cur->next;
        if (n && n->cap < bytes) {            /* retained chunk too small: replace it */
            a->cur->next = n->next;
            free(n->mem); free(n);
            continue;
        }
        if (!n) {
            n = chunk_new(bytes > a->chunk_bytes ? bytes : a->chunk_bytes);
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
    for (chunk *c = a->head; c; c = c->next) c->used = 0;
    a->cur = a->head;
    a->in_use = 0;
}

size_t mmc_arena_used(const mmc_arena *a) { return a->in_use; }
size_t mmc_arena_peak(const mmc_arena *a) { return a->peak; }
