/* kmap: an open-addressing hash map from uint64_t keys to pointers.
 *
 * Used by the index (pending touches keyed by inode number) and by the daemon (inode table keyed by the
 * backing inode number). Not thread-safe: every caller guards its map with its own lock. Key 0 is
 * reserved (inode 0 never exists). Values are owned by the caller. Capacity doubles at 70% load and
 * deletion uses backward-shift, so no tombstones accumulate. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct kmap {
        uint64_t *keys; /* 0 = empty slot */
        void **vals;
        size_t cap;     /* power of two, or 0 before the first insert */
        size_t count;
} kmap;

void kmap_init(kmap *m);
void kmap_free(kmap *m); /* frees the table, not the values */
void *kmap_get(const kmap *m, uint64_t key);
/* 0 on success, -ENOMEM. Replaces an existing value. */
int kmap_put(kmap *m, uint64_t key, void *val);
/* Returns the removed value, or NULL. */
void *kmap_del(kmap *m, uint64_t key);
/* Iteration: for (size_t i = 0; kmap_next(m, &i, &k, &v); ) ... ; no insert or delete meanwhile. */
int kmap_next(const kmap *m, size_t *pos, uint64_t *ret_key, void **ret_val);
