/* misses.c: what a limit that is too small costs, counted so that kcache stats can say so.
 *
 * REFETCHES. LRU gives no reuse at all to a runtime that touches its entries in the same order on every
 * run through a cache smaller than them: each entry is evicted just before its turn (Inductor at 12 MiB
 * against 14.3 MB: every process cold). Nothing fails, the cache just never hits. So the names eviction
 * removes are remembered, the last MISS_WINDOW of them (a hash of the path, the bytes, and how many
 * bytes had been evicted before it), and a regular file that appears again under one of them (created,
 * or renamed into place: most runtimes store by temp and rename) is a refetch, a miss the limit caused.
 * A limit that would have kept it must hold, at the low watermark, everything used between the name's last
 * use and its return, and everything never evicted. Both are in one sum: the bytes evicted between its
 * eviction and its return, its own included (the distance), plus the bytes used when it returns. At its
 * eviction the cache held it and what was used after it (LRU took it as the oldest), plus what is never
 * evicted (kept names, pins, open files); each byte stored since went in by evicting one, or is in the
 * used bytes still. So distance + used at the return = (what was used between, as a working set) + (what
 * never goes), whatever the limit was, measured in bytes the limit counts. An earlier version suggested
 * max_size plus the distance: right for a cache that evicts only at its limit, but the descent evicts to
 * the low watermark (evict.h, HOW FAR), so a working set that fits under max_size and not under the low
 * watermark is evicted on every pass (ccache at the suggested 9.0 MiB: 0 hits of 30; at 9.9 MiB, 30). The
 * sums go into quarter-octave buckets, and the limit suggested is the sum that covers 90% of the
 * refetches (rounded up to its bucket's top: at most 19% more, the room for what is in flight), divided
 * by the low watermark: kept there, the descent does not reach them.
 *
 * REFUSED WRITES. A write that cannot fit even with everything evictable gone fails with ENOSPC (evict.h,
 * ALL OR NOTHING): the rest is open, pinned or young (a runtime's stores in flight). Each such refusal is
 * counted with the limit it would have needed (used and reserved bytes, plus its own), and the largest is
 * kept: the limit the observed concurrency needs.
 *
 * COST. Nothing until the first eviction. After it, each new name costs a readlink of its directory's
 * descriptor and a hash lookup; each eviction a hash insert. The window takes 64 bytes a name (4 MiB). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define MISS_WINDOW 65536

static uint64_t path_hash(const char *dir, const char *name)
{
        uint64_t h = 1469598103934665603ULL; /* FNV-1a of dir "/" name, or of name at the root */
        for (const char *p = dir; p && *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        if (dir && *dir)
                h = (h ^ (unsigned char)'/') * 1099511628211ULL;
        for (const char *p = name; *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        return h ? h : 1;
}

/* Quarter-octave buckets: 4 per power of two, so that a suggestion is at most 19% above the distance. */
static unsigned bucket_of(uint64_t d)
{
        if (d < 4)
                return (unsigned)d;
        unsigned k = 63 - (unsigned)__builtin_clzll(d);
        return 4 * k + (unsigned)((d >> (k - 2)) & 3);
}

/* The largest distance in bucket b. */
static uint64_t bucket_top(unsigned b)
{
        if (b < 4)
                return b;
        unsigned k = b / 4;
        uint64_t top = (uint64_t)(4 + b % 4 + 1) << (k - 2);
        return top - 1;
}

void kev_miss_evicted(struct kfs *fs, const char *path, uint64_t bytes)
{
        struct kev_misses *m = &fs->ev->miss;
        const char *slash = strrchr(path, '/');
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 0, path);
        uint64_t h = path_hash(dir, slash ? slash + 1 : path);
        pthread_mutex_lock(&m->lock);
        if (!m->slot && !(m->slot = calloc(MISS_WINDOW, sizeof(*m->slot)))) {
                pthread_mutex_unlock(&m->lock);
                return; /* not counted: the cache works the same */
        }
        m->evicted_bytes += bytes;
        struct kev_miss_slot *s = &m->slot[m->next];
        if (s->hash && (uintptr_t)kmap_get(&m->at, s->hash) == m->next + 1)
                kmap_del(&m->at, s->hash); /* the oldest name leaves the window */
        *s = (struct kev_miss_slot){ h, m->evicted_bytes - bytes, bytes };
        if (kmap_put(&m->at, h, (void *)(uintptr_t)(m->next + 1)) < 0)
                s->hash = 0;
        m->next = (m->next + 1) % MISS_WINDOW;
        atomic_store(&m->on, true);
        pthread_mutex_unlock(&m->lock);
}

/* The name's directory, relative to the backing root, from its descriptor: "" for the root. */
static int dir_rel(struct kfs *fs, int dfd, char *buf, size_t size)
{
        char proc[64], abs[PATH_MAX];
        kfs_proc_path(proc, sizeof(proc), dfd);
        ssize_t n = readlink(proc, abs, sizeof(abs) - 1);
        if (n < 0)
                return -errno;
        abs[n] = '\0';
        size_t bl = strlen(fs->o.backing);
        if (strncmp(abs, fs->o.backing, bl) || (abs[bl] && abs[bl] != '/'))
                return -ENOENT;
        snprintf(buf, size, "%s", abs[bl] ? abs + bl + 1 : "");
        return 0;
}

void kev_miss_made(struct kfs *fs, int dfd, const char *name)
{
        struct kev_misses *m = &fs->ev->miss;
        char dir[PATH_MAX];
        if (!atomic_load(&m->on) || dir_rel(fs, dfd, dir, sizeof(dir)) < 0)
                return;
        uint64_t h = path_hash(dir, name), distance = 0;
        bool refetch = false;
        pthread_mutex_lock(&m->lock);
        uintptr_t at = (uintptr_t)kmap_get(&m->at, h);
        if (at && m->slot[at - 1].hash == h) {
                struct kev_miss_slot *s = &m->slot[at - 1];
                distance = m->evicted_bytes - s->evicted_before; /* its own bytes and all after it */
                refetch = true;
                m->refetches++;
                m->refetch_bytes += s->bytes;
                kmap_del(&m->at, h);
                s->hash = 0; /* counted once */
        }
        pthread_mutex_unlock(&m->lock);
        if (!refetch)
                return;
        uint64_t used = kidx_used(fs->idx); /* not under m->lock, a leaf (kfs.h, LOCK ORDER) */
        pthread_mutex_lock(&m->lock);
        m->buckets[bucket_of(distance + used)]++;
        pthread_mutex_unlock(&m->lock);
}

void kev_miss_refused(struct kfs *fs, uint64_t needed)
{
        struct kev_misses *m = &fs->ev->miss;
        pthread_mutex_lock(&m->lock);
        m->refused++;
        if (needed > m->refused_need)
                m->refused_need = needed;
        pthread_mutex_unlock(&m->lock);
}

void kev_miss_counts(struct kfs *fs, struct kev_counts *c)
{
        struct kev_misses *m = &fs->ev->miss;
        pthread_mutex_lock(&m->lock);
        c->refetches = m->refetches;
        c->refetch_bytes = m->refetch_bytes;
        c->refused_writes = m->refused;
        c->refused_need_bytes = m->refused_need;
        c->suggested_max_bytes = 0;
        if (m->refetches) {
                uint64_t want = (m->refetches * 9 + 9) / 10, seen = 0; /* 90% of them, rounded up */
                unsigned b = 0;
                for (; b < KEV_MISS_BUCKETS - 1 && (seen += m->buckets[b]) < want; b++)
                        ;
                /* bucket_top(b) < 2^63 (b < KEV_MISS_BUCKETS): * 100 / low fits, low >= 1 */
                unsigned low = fs->o.low_watermark ? fs->o.low_watermark : 100;
                uint64_t top = bucket_top(b);
                c->suggested_max_bytes = top / low * 100 + (top % low * 100 + low - 1) / low;
        }
        pthread_mutex_unlock(&m->lock);
}

/* The counts and the distances of the refetches (and so the limit suggested); the window of evicted names
 * and evicted_bytes, which the distances are measured with, stay. */
void kev_miss_zero(struct kfs *fs)
{
        struct kev_misses *m = &fs->ev->miss;
        pthread_mutex_lock(&m->lock);
        m->refetches = m->refetch_bytes = m->refused = m->refused_need = 0;
        memset(m->buckets, 0, sizeof(m->buckets));
        pthread_mutex_unlock(&m->lock);
}

void kev_miss_free(struct kfs *fs)
{
        struct kev_misses *m = &fs->ev->miss;
        free(m->slot);
        m->slot = NULL;
        kmap_free(&m->at);
        pthread_mutex_destroy(&m->lock);
}
