/* space.c: when eviction runs and who waits (evict.h: WHEN EVICTION RUNS, COST, ALL OR NOTHING,
 * FAIRNESS, HELPING). Every allocating request reserves first; a reservation that does not fit evicts in
 * line, in batches, granting the writes queued behind it room as it goes; the measurement after the
 * request replaces the estimate with the allocation the backing filesystem made. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* space_lock held. */
static bool try_reserve_locked(struct kfs *fs, uint64_t bytes);

/* space_lock held. Grants queued writes in arrival order while they fit (HELPING). */
static void grant_waiters_locked(struct kfs *fs)
{
        bool any = false;
        while (fs->ev->space_waiters && try_reserve_locked(fs, fs->ev->space_waiters->bytes)) {
                fs->ev->space_waiters->granted = true;
                atomic_fetch_add(&fs->ev->helped_writes, 1);
                fs->ev->space_waiters = fs->ev->space_waiters->next;
                any = true;
        }
        if (any)
                pthread_cond_broadcast(&fs->ev->space_cond);
}

/* evict_lock held. Removes the victims that cover goal bytes (at most max_victims), continuing the LRU
 * walk at *cursor. If they cannot cover must_free, removes nothing and fails with -ENOSPC (ALL OR
 * NOTHING). Returns the bytes freed. help: grant queued writes room as it goes (HELPING). busy: the
 * locks found held by the eviction this batch is part of (kev_busy), or NULL for a batch on its own. */
int64_t kev_evict_batch(struct kfs *fs, uint64_t *cursor, uint64_t goal, uint64_t must_free, size_t max_victims,
                           bool grace, struct notify_list *nl, bool help, bool in_line, struct kev_busy *busy)
{
        struct victims vs = { 0 };
        struct dircache dc = { 0 };
        struct kev_busy own = { 0 };
        struct seen_set seen = { .busy = busy ? busy : &own };
        uint64_t start = *cursor;
        int r = kev_choose(fs, &dc, goal > must_free ? goal : must_free, max_victims, cursor, grace, &seen, &vs);
        if (r == 0 && vs.bytes < must_free && grace) {
                /* GRACE yields to a write that cannot fit otherwise: walk again from the same start, taking
                 * what was passed over for being young, never what this batch took already. */
                *cursor = start;
                r = kev_choose(fs, &dc, must_free, max_victims, cursor, false, &seen, &vs);
        }
        kev_seen_free(&seen);
        kev_busy_free(&own);
        int64_t freed = 0;
        if (r < 0 || vs.bytes < must_free)
                freed = r < 0 ? r : -ENOSPC;
        if (freed >= 0 && vs.n) { /* records first: a crash after a removal must not lose its record */
                struct kidx_intent *in = calloc(vs.n, sizeof(*in));
                for (size_t i = 0; in && i < vs.n; i++)
                        in[i] = (struct kidx_intent){ vs.v[i].ino, vs.v[i].bytes,
                                                      !vs.v[i].nnames ? ""
                                                      : vs.v[i].names[0].path ? vs.v[i].names[0].path
                                                                              : vs.v[i].names[0].name };
                int e = in ? kidx_evict_intents(fs->idx, vs.n, in, kev_now(fs)) : -ENOMEM;
                free(in);
                if (e < 0)
                        freed = e;
        }
        size_t since = 0;
        for (size_t i = 0; freed >= 0 && i < vs.nu; i++) {
                freed += (int64_t)kev_evict_unit(fs, &dc, &vs, &vs.u[i], nl, in_line);
                if (help && (since += vs.u[i].count) >= BATCH_VICTIMS) {
                        since = 0;
                        pthread_mutex_lock(&fs->ev->space_lock);
                        grant_waiters_locked(fs);
                        pthread_mutex_unlock(&fs->ev->space_lock);
                }
        }
        if (freed >= 0)
                kev_repair_all(fs, &vs, nl);
        kev_prune_due(fs, nl);
        kev_free_victims(&vs);
        kev_dircache_free(&dc);
        return freed;
}

/* Evicts until used plus reserved bytes are down to target (the reserved ones are about to be used), in
 * batches of BATCH_VICTIMS, taking evict_lock for one batch at a time so that no writer waits longer
 * than one batch (COST). Continues the LRU walk at *cursor. */
int64_t kev_evict_down_to(struct kfs *fs, uint64_t target, uint64_t *cursor, bool grace, bool in_line)
{
        int64_t total = 0;
        struct kev_busy busy = { 0 }; /* the batches go on at *cursor: one verdict per lock for them all */
        for (;;) {
                struct notify_list nl = { 0 };
                pthread_mutex_lock(&fs->ev->evict_lock);
                pthread_mutex_lock(&fs->ev->space_lock);
                uint64_t used = kidx_used(fs->idx) + fs->ev->reserved;
                pthread_mutex_unlock(&fs->ev->space_lock);
                int64_t freed = used > target && !fs->ev->stop
                                        ? kev_evict_batch(fs, cursor, used - target, 0, BATCH_VICTIMS, grace, &nl, false, in_line,
                                                          &busy)
                                        : 0;
                bool done = freed <= 0;
                if (done)
                        kev_prune_lost(fs, &nl); /* (EMPTIED DIRECTORIES) */
                pthread_mutex_unlock(&fs->ev->evict_lock);
                kev_notify_all(fs, &nl);
                if (freed <= 0) {
                        kev_busy_free(&busy);
                        return freed < 0 && !total ? freed : total; /* the target, or nothing more can go */
                }
                total += freed;
        }
}

static bool try_reserve_locked(struct kfs *fs, uint64_t bytes)
{
        uint64_t used = kidx_used(fs->idx);
        if (used + fs->ev->reserved + bytes > fs->o.max_size)
                return false;
        fs->ev->reserved += bytes;
        kev_descent_kick_locked(fs, used + fs->ev->reserved, false);
        return true;
}

/* Waits for room while another request's eviction runs (HELPING). true: granted; false: that eviction
 * ended first (or none runs), and the caller must see to it itself. */
static bool wait_for_help(struct kfs *fs, uint64_t bytes)
{
        pthread_mutex_lock(&fs->ev->space_lock);
        struct space_wait w = { .bytes = bytes };
        if (fs->ev->evicting) {
                struct space_wait **p = &fs->ev->space_waiters;
                while (*p)
                        p = &(*p)->next;
                *p = &w;
                while (!w.granted && fs->ev->evicting)
                        pthread_cond_wait(&fs->ev->space_cond, &fs->ev->space_lock);
        }
        pthread_mutex_unlock(&fs->ev->space_lock);
        return w.granted;
}

int kev_reserve(struct kfs *fs, uint64_t bytes)
{
        if (bytes > fs->o.max_size) {
                kev_miss_refused(fs, kidx_used(fs->idx) + bytes);
                return -ENOSPC;
        }
        pthread_mutex_lock(&fs->ev->space_lock);
        bool ok = !fs->ev->evicting && try_reserve_locked(fs, bytes);
        pthread_mutex_unlock(&fs->ev->space_lock);
        if (ok)
                return 0;
        atomic_fetch_add(&fs->ev->blocked_writes, 1);

        /* Slow path. An eviction running now may grant this request room as it goes (HELPING); otherwise,
         * under evict_lock and with new reservations held back (FAIRNESS), free what this request needs,
         * all or nothing. */
        if (pthread_mutex_trylock(&fs->ev->evict_lock) != 0) {
                if (wait_for_help(fs, bytes))
                        return 0;
                pthread_mutex_lock(&fs->ev->evict_lock);
        }
        struct notify_list nl = { 0 };
        uint64_t cursor = 0;
        int r = 0;
        pthread_mutex_lock(&fs->ev->space_lock);
        ok = try_reserve_locked(fs, bytes); /* an eviction before ours may have made room */
        uint64_t used = kidx_used(fs->idx), reserved = fs->ev->reserved;
        fs->ev->evicting = !ok;
        pthread_mutex_unlock(&fs->ev->space_lock);
        bool evicted = false;
        if (!ok) {
                r = kidx_flush(fs->idx); /* the order must reflect every access up to now */
                /* A victim opened between its choice and its removal stays, so a batch may free less than
                 * it chose: then choose again (the opened file is now passed over), a few times at most.
                 * Room that queued writes were granted meanwhile (HELPING) is made up for by going on; after
                 * a few such rounds it stops granting, so that a stream of writers cannot keep it going. */
                struct kev_busy busy = { 0 }; /* one verdict per lock while the walk goes on (kev_busy) */
                for (int attempt = 0, helped = 0; r == 0 && !ok && attempt < 4;) {
                        uint64_t must = used + reserved + bytes - fs->o.max_size;
                        int64_t freed = kev_evict_batch(fs, &cursor, must, must, SIZE_MAX, true, &nl, helped < 4, true,
                                                        &busy);
                        if (freed < 0) {
                                r = (int)freed;
                        } else if ((uint64_t)freed < must) {
                                attempt++;
                                cursor = 0; /* the LRU walk again from its start, */
                                kev_busy_free(&busy); /* where the oldest come first again: a fresh verdict */
                        } else if (helped < 4) {
                                helped++; /* queued writes took room: on for ours */
                        } else {
                                attempt++; /* room went without our granting it: bounded like the rest */
                        }
                        pthread_mutex_lock(&fs->ev->space_lock);
                        ok = r == 0 && try_reserve_locked(fs, bytes);
                        used = kidx_used(fs->idx);
                        reserved = fs->ev->reserved;
                        pthread_mutex_unlock(&fs->ev->space_lock);
                }
                kev_busy_free(&busy);
                if (r == 0 && !ok)
                        r = -ENOSPC;
                if (r == -ENOSPC) /* what is left is open, pinned or young (misses.c, REFUSED WRITES) */
                        kev_miss_refused(fs, used + reserved + bytes);
                pthread_mutex_lock(&fs->ev->space_lock);
                grant_waiters_locked(fs); /* what is left after ours */
                fs->ev->evicting = false;
                fs->ev->space_waiters = NULL; /* the others see to themselves (wait_for_help) */
                pthread_cond_broadcast(&fs->ev->space_cond);
                pthread_mutex_unlock(&fs->ev->space_lock);
                evicted = r == 0;
        }
        kev_prune_lost_soon(fs, &nl); /* (EMPTIED DIRECTORIES) */
        pthread_mutex_unlock(&fs->ev->evict_lock);
        kev_notify_all(fs, &nl);

        /* The rest, down to the low watermark, is the descent's (HOW FAR). */
        if (evicted) {
                pthread_mutex_lock(&fs->ev->space_lock);
                kev_descent_kick_locked(fs, kidx_used(fs->idx) + fs->ev->reserved, true);
                pthread_mutex_unlock(&fs->ev->space_lock);
        }
        return r;
}

void kev_settle(struct kfs *fs, struct kfs_inode *in, const struct stat *st, uint64_t reserved)
{
        /* One step under space_lock: between accounting the real allocation and releasing the promise,
         * the bytes would count twice, and a concurrent check could refuse a request for nothing. */
        pthread_mutex_lock(&fs->ev->space_lock);
        if (st)
                kfs_inode_account_locked(fs, in, st);
        fs->ev->reserved = fs->ev->reserved > reserved ? fs->ev->reserved - reserved : 0;
        pthread_mutex_unlock(&fs->ev->space_lock);
}

/* Stats in's file through fd, or through its O_PATH fd if fd is -1. */
static int stat_through(struct kfs *fs, struct kfs_inode *in, int fd, struct stat *st)
{
        return fd >= 0 ? (fstat(fd, st) < 0 ? -errno : 0) : kfs_fstat_inode(fs, in, st);
}

/* in->lock held. What st adds to the count over what the index holds of in (0 where nothing counts). */
static uint64_t growth_locked(struct kfs_inode *in, const struct stat *st)
{
        uint64_t now = (uint64_t)st->st_blocks * 512;
        return S_ISREG(in->type) && !in->unlinked && !kfs_stale(in) && now > in->alloc ? now - in->alloc : 0;
}

bool kev_account_locked(struct kfs *fs, struct kfs_inode *in, const struct stat *st)
{
        if (growth_locked(in, st))
                return false;
        kfs_inode_account_locked(fs, in, st);
        return true;
}

void kev_measure(struct kfs *fs, struct kfs_inode *in, int fd, uint64_t reserved)
{
        uint64_t held = reserved;
        for (int round = 0;; round++) {
                struct stat st;
                pthread_mutex_lock(&in->lock);
                bool ok = stat_through(fs, in, fd, &st) == 0;
                uint64_t grow = ok ? growth_locked(in, &st) : 0;
                /* After two rounds, or if nothing could go: counted all the same, the blocks are on the disk. */
                if (grow <= held || round == 2) {
                        if (held)
                                kev_settle(fs, in, ok ? &st : NULL, held);
                        else if (ok)
                                kfs_inode_account_locked(fs, in, &st);
                        pthread_mutex_unlock(&in->lock);
                        return;
                }
                pthread_mutex_unlock(&in->lock);
                /* It grew by more than was promised (ext4's extent blocks, allocation at writeback, a
                 * shared mapping's writes): room for the rest first, as for a write. */
                if (kev_reserve(fs, grow - held) == 0)
                        held = grow;
                else
                        round = 1;
        }
}

/* in_line: for a write, inside it (see runtime_lock). */
