/* kmap: open addressing with linear probing; see kmap.h for the contract. */
#include "kmap.h"

#include <errno.h>
#include <stdlib.h>

static inline size_t slot_of(uint64_t key, size_t cap)
{
        key ^= key >> 33;
        key *= 0xff51afd7ed558ccdULL;
        key ^= key >> 33;
        return (size_t)key & (cap - 1);
}

void kmap_init(kmap *m)
{
        m->keys = NULL;
        m->vals = NULL;
        m->cap = 0;
        m->count = 0;
}

void kmap_free(kmap *m)
{
        free(m->keys);
        free(m->vals);
        kmap_init(m);
}

void *kmap_get(const kmap *m, uint64_t key)
{
        if (m->cap == 0)
                return NULL;
        for (size_t i = slot_of(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
                if (m->keys[i] == key)
                        return m->vals[i];
                if (m->keys[i] == 0)
                        return NULL;
        }
}

static void raw_put(uint64_t *keys, void **vals, size_t cap, uint64_t key, void *val)
{
        size_t i = slot_of(key, cap);
        while (keys[i] != 0 && keys[i] != key)
                i = (i + 1) & (cap - 1);
        keys[i] = key;
        vals[i] = val;
}

static int resize(kmap *m, size_t ncap)
{
        uint64_t *nk = calloc(ncap, sizeof(*nk));
        void **nv = calloc(ncap, sizeof(*nv));
        if (!nk || !nv) {
                free(nk);
                free(nv);
                return -ENOMEM;
        }
        for (size_t i = 0; i < m->cap; i++)
                if (m->keys[i])
                        raw_put(nk, nv, ncap, m->keys[i], m->vals[i]);
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->cap = ncap;
        return 0;
}

static int grow(kmap *m)
{
        return resize(m, m->cap ? m->cap * 2 : 64);
}

int kmap_put(kmap *m, uint64_t key, void *val)
{
        if ((m->count + 1) * 10 > m->cap * 7) {
                int r = grow(m);
                if (r < 0)
                        return r;
        }
        size_t i = slot_of(key, m->cap);
        while (m->keys[i] != 0 && m->keys[i] != key)
                i = (i + 1) & (m->cap - 1);
        if (m->keys[i] == 0)
                m->count++;
        m->keys[i] = key;
        m->vals[i] = val;
        return 0;
}

void *kmap_del(kmap *m, uint64_t key)
{
        if (m->cap == 0)
                return NULL;
        size_t mask = m->cap - 1, i = slot_of(key, m->cap);
        while (m->keys[i] != key) {
                if (m->keys[i] == 0)
                        return NULL;
                i = (i + 1) & mask;
        }
        void *val = m->vals[i];
        /* Backward-shift deletion: move later members of the probe run into the hole. */
        size_t hole = i;
        for (size_t j = (i + 1) & mask; m->keys[j] != 0; j = (j + 1) & mask) {
                size_t home = slot_of(m->keys[j], m->cap);
                /* j may move into hole unless its home lies cyclically in (hole, j]. */
                int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
                if (!stays) {
                        m->keys[hole] = m->keys[j];
                        m->vals[hole] = m->vals[j];
                        hole = j;
                }
        }
        m->keys[hole] = 0;
        m->vals[hole] = NULL;
        m->count--;
        return val;
}

int kmap_next(const kmap *m, size_t *pos, uint64_t *ret_key, void **ret_val)
{
        for (; *pos < m->cap; (*pos)++) {
                if (m->keys[*pos]) {
                        *ret_key = m->keys[*pos];
                        *ret_val = m->vals[*pos];
                        (*pos)++;
                        return 1;
                }
        }
        return 0;
}
