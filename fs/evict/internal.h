/* internal.h: what the files of fs/evict/ share, and nothing else includes. The map of the folder, the
 * design is in evict.h, the lock order in kfs.h. */
#pragma once

#include "../kfs.h"

#define KEV_REAPERS 2   /* threads closing evicted files (reap.c) */
#define LRU_BATCH 256     /* index rows read per query */
#define BATCH_VICTIMS 64  /* victims removed per hold of evict_lock (COST) */

struct name {
        uint64_t dir;
        char *name;
        bool removed; /* kev_remove_member_locked unlinked it */
        char *path;   /* relative to the backing root, for pins and the eviction log */
};

/* One file of a unit. */
struct victim {
        uint64_t ino;
        uint64_t bytes;
        struct name *names;
        size_t nnames;
        int hold;     /* O_PATH fd kept on the removed inode until the index has been told (INODE REUSE) */
        bool lives;   /* names were removed, but the file has another the index did not know of when it
                       * was chosen (a link made since): it stays, counted, with its other names */
        bool has_row; /* chosen from row, the index's LRU order (kidx_evicted_row) */
        struct kidx_lru_row row;
};

/* A directory kept for later (a repair, a prune): its path below the root, which says what it is to the
 * runtimes' rules, and its identity, which is checked when it is reached again through the path (tree.h,
 * R4): a path renamed or swapped for a symlink meanwhile leads to another directory, or to none. */
struct kev_dirref {
        char *rel;
        uint64_t ino;   /* on fs->tree.dev */
};

/* A unit chosen for eviction: victims [first, first + count) of struct victims, in deletion order. */
struct vunit {
        size_t first, count;
        enum krt rt;
        struct kev_dirref repair; /* bookkeeping to repair afterwards (units.c); rel NULL: none */
};

struct victims {
        struct victim *v;
        size_t n, cap;
        struct vunit *u;
        size_t nu;
        uint64_t bytes;
};

/* A bookkeeping repair still to do (the runtime held its lock last time). */
struct kev_repair {
        enum krt rt;
        struct kev_dirref dir;
};

/* Directories of the victims of one batch: victims cluster in few directories, so each one's path is
 * read from the index and opened once per batch, not once per victim. */
#define DIRCACHE 16
struct dircache {
        uint64_t ino[DIRCACHE];
        char *path[DIRCACHE];  /* relative to the backing root, any length; NULL: unknown to the index, or not
                                  the directory the index holds (tree.h, R4) */
        int fd[DIRCACHE];      /* O_PATH, reached by ktree_walk, or -1 (then path is NULL) */
        int n, next;
};
/* Units met during one choose(): a unit is taken when the LRU walk reaches its newest member. */
struct seen {
        char *key;
        uint64_t newest;   /* the newest member's seq */
        bool done;         /* taken, or found protected */
        bool young;        /* passed over only for GRACE: a pass without it may take it */
};

/* The caches whose one lock file (PyOpenCL's) was found held by another process during one eviction: every
 * unit of such a cache is busy for the rest of that eviction, batches and passes included, even once
 * the lock is gone. Its units are met in LRU order while the lock comes and goes; judged one by one, the
 * older ones were passed over while it was held and a newer one taken the moment it was released: the
 * entry stored just before the one being written went first (choose.c, ONE VERDICT PER LOCK). */
struct kev_busy {
        char **dirs;         /* relative to the root */
        size_t n;
};
void kev_busy_free(struct kev_busy *b);

struct seen_set {
        struct seen *v;      /* units of several files: few per batch */
        size_t n;
        kmap files;          /* single-file units taken, by inode: one per victim, so O(1) each */
        struct kev_busy *busy; /* this eviction's held locks; NULL: this walk's own */
};

/* FUSE inodes whose cached attributes (and, for directories, listings) must be dropped once our locks
 * are released; an evicted file's, under them where a runtime's lock is let go first (kev_notify_gone). */
struct notify_list {
        /* gone: evicted or pruned (kprune.c); told: its attributes already dropped (kev_notify_gone) */
        struct { fuse_ino_t ino; bool dir, gone, told; } *items;
        size_t n;
};

/* A write waiting for room while another request's eviction runs (HELPING). */
struct space_wait {
        uint64_t bytes;
        bool granted;
        struct space_wait *next;
};


/* What a limit too small costs (misses.c). */
#define KEV_MISS_BUCKETS 256
struct kev_miss_slot {
        uint64_t hash;            /* of the evicted name's path; 0: none (or counted) */
        uint64_t evicted_before;  /* bytes evicted since mount before it */
        uint64_t bytes;
};
struct kev_misses {
        pthread_mutex_t lock;     /* a leaf */
        _Atomic bool on;          /* something was evicted: new names are looked up */
        struct kev_miss_slot *slot; /* the last MISS_WINDOW evicted names, a ring; lock */
        size_t next;              /* lock */
        kmap at;                  /* hash -> its slot + 1; lock */
        uint64_t evicted_bytes;   /* since mount; lock */
        uint64_t refetches, refetch_bytes; /* lock */
        uint64_t buckets[KEV_MISS_BUCKETS]; /* refetches by the bytes evicted from their eviction to their
                                     return, their own included, plus the bytes used at their return
                                     (misses.c says why), 4 buckets per power of two; lock */
        uint64_t refused, refused_need; /* writes refused with nothing left to evict, and the largest
                                           limit one of them needed; lock */
};

/* Eviction's state: one per mount, fs->ev (state.c). Its locks' place in the daemon's order: evict.h,
 * LOCKS, and kfs.h, LOCK ORDER. */
struct kev {
        int64_t (*now)(void);         /* the clock of GRACE and of the eviction log: kfs_now_ns; a unit
                                       * test sets its own */
        pthread_mutex_t evict_lock;   /* one eviction at a time */
        bool stop;                    /* unmounting: the repairer and the descent end; evict_lock */

        pthread_mutex_t space_lock;   /* never held across I/O */
        uint64_t reserved;            /* bytes promised to writes in flight; space_lock */
        bool evicting;                /* an eviction runs: reservations wait for it (FAIRNESS); space_lock */
        struct space_wait *space_waiters; /* writes the running eviction grants room to (HELPING); space_lock */
        pthread_cond_t space_cond;    /* a waiter was granted room, or the eviction ended; with space_lock */
        _Atomic uint64_t helped_writes;  /* writes granted room that way since mount */
        _Atomic uint64_t blocked_writes; /* writes that found no room and waited for an eviction */

        struct {                      /* the background descent to the low watermark (descent.c) */
                pthread_t thread;
                pthread_cond_t cond;    /* kicked, or stopping; with space_lock */
                bool started, kicked, running, stop; /* space_lock */
                int64_t quiet_until;    /* no kick before this (ns): the last descent freed nothing, above
                                         * the high mark (young, open or pinned files); space_lock */
                int64_t retry_at;       /* the thread could not be started: not before this (ns); space_lock */
                _Atomic uint64_t runs;  /* descents since mount */
                _Atomic int64_t young_until; /* when entries an eviction passed over for their youth
                                         * will have aged enough for it to reach its goal (ns), 0: none
                                         * since the descent last looked; it wakes then (kev_note_young) */
        } descent;

        struct kev_repair *repairs;   /* bookkeeping repairs that found the runtime's lock held; evict_lock */
        size_t nrepairs;
        pthread_cond_t repair_cond;   /* a NEO repair waits: wakes the repairer; with evict_lock */
        pthread_t repairer;           /* takes NEO's flock blocking, queued like NEO's own processes */
        bool repairer_started;        /* evict_lock */

        struct kev_misses miss;       /* misses.c */

        struct {                      /* the directories kcache env made for a runtime (marks.c) */
                pthread_mutex_t lock;   /* a leaf */
                struct kev_mark { char *name; enum krt rt; } *v; /* lock */
                size_t n;               /* lock */
        } marks;

        struct {                      /* directories emptied by eviction (prune.c) */
                struct kev_dirref *rel; /* named too recently to go yet; evict_lock */
                int64_t *due;           /* not before this (ns); evict_lock */
                size_t n;               /* evict_lock */
                _Atomic int64_t next;   /* the earliest due, 0: none; the descent wakes for it */
                struct kev_dirref *lost; /* directories that lost files in this eviction, each once, looked
                                         * at when it ends; evict_lock */
                size_t nlost;           /* evict_lock */
                kmap lost_at;           /* hash of a path in lost -> its index + 1; evict_lock */
        } prune;

        struct {                      /* closes evicted files' last fds, which frees their blocks (reap.c) */
                pthread_mutex_t lock;   /* a leaf */
                pthread_cond_t cond;    /* fds queued, or the queue drained */
                struct kev_reap_item { int fd; uint64_t bytes; } *q; /* lock */
                size_t n, cap;          /* lock */
                uint64_t bytes;         /* the files queued or being closed hold this much; lock */
                size_t held;            /* fds queued or being closed; lock */
                unsigned busy;          /* threads closing a step now; lock */
                bool stop;              /* lock */
                unsigned started;       /* threads running; lock */
                pthread_t threads[KEV_REAPERS];
        } reap;
};

/* One logical entry of a runtime, evicted whole or not at all: struct kev_unit (evict.h, units.c). */

static inline int64_t kev_now(const struct kfs *fs)
{
        return fs->ev->now();
}

/* choose.c: what goes first */
void kev_dircache_free(struct dircache *c);
/* The directory d, opened with flags through its path beneath the root (tree.h, R1-R3), if it still is d's
 * directory (R4): -ESTALE when the path leads elsewhere, -errno. */
int kev_dirref_open(struct kfs *fs, const struct kev_dirref *d, int flags);
/* d for the directory at rel now (its identity read through the tree), or -errno. */
int kev_dirref_make(struct kfs *fs, const char *rel, struct kev_dirref *ret);
/* The slot of directory ino in c, filled on first use. */
int kev_dircache_get(struct kfs *fs, struct dircache *c, uint64_t ino);
void kev_free_names(struct name *names, size_t n);
void kev_free_victims(struct victims *vs);
int kev_push_victim(struct victims *vs, struct victim *v);
int kev_push_unit(struct kfs *fs, struct victims *vs, size_t first, enum krt rt, const char *repair);
void kev_seen_free(struct seen_set *ss);
/* itable_lock held: whether the file ino is open in a way that protects it. */
bool kev_is_open_locked(struct kfs *fs, uint64_t ino);
/* Reads a candidate's names and paths. 0: evictable; 1: protected (pinned by pattern); -errno. */
int kev_load_candidate(struct kfs *fs, struct dircache *dc, struct victim *v);
/* A resolved multi-file unit into victims, if it may go now: 1 if taken, 0 if not (yet), -errno. */
int kev_take_unit(struct kfs *fs, struct dircache *dc, struct kev_unit *u, uint64_t row_seq, struct seen *sn,
                  bool grace, struct victims *vs);
/* Units in LRU order, from *cursor on, until goal bytes or max_victims files are covered or the LRU runs
 * out; *cursor advances past what was looked at. */
int kev_choose(struct kfs *fs, struct dircache *dc, uint64_t goal, size_t max_victims, uint64_t *cursor,
               bool grace, struct seen_set *seen, struct victims *vs);

/* remove.c: removing */
/* itable_lock held: in's cached attributes (and pages, for a directory or a rewritten file) are dropped
 * by kev_notify_all. */
void kev_note_inode(struct kfs *fs, struct notify_list *nl, struct kfs_inode *in);
/* No lock of ours held: tells the kernel, and empties nl. */
void kev_notify_all(struct kfs *fs, struct notify_list *nl);
/* Any lock held: drops the kernel's attributes of the evicted files noted from nl->items[from] on. */
void kev_notify_gone(struct kfs *fs, struct notify_list *nl, size_t from);
size_t kev_remove_member_locked(struct kfs *fs, struct victim *v, const int *dirfds, struct notify_list *nl,
                                bool *replaced);
/* Removes one unit of vs, all of it or none. Returns the bytes freed. */
uint64_t kev_evict_unit(struct kfs *fs, struct dircache *dc, struct victims *vs, struct vunit *u,
                        struct notify_list *nl, bool in_line);
/* Whether JAX's .lockfile in the directory dfd is held by a process this eviction may not remove under
 * (or cannot be told): taken without waiting and let go at once. */
bool kev_jax_lock_probe(struct kfs *fs, int dfd);
/* Removes dir/name, bookkeeping the daemon repairs, if the name still is fd's file. */
void kev_remove_noted(struct kfs *fs, int dirfd, const char *name, int fd, struct notify_list *nl);

/* prune.c: the directories eviction empties (EMPTIED DIRECTORIES); evict_lock held for all */
bool kev_prunes(enum krt rt);
void kev_prune_dir_at(struct kfs *fs, const char *dir_rel, uint64_t dir_ino, struct notify_list *nl, bool first_now);
void kev_prune_due(struct kfs *fs, struct notify_list *nl);
void kev_prune_lost(struct kfs *fs, struct notify_list *nl);
void kev_prune_lost_soon(struct kfs *fs, struct notify_list *nl);
void kev_note_emptied(struct kfs *fs, const char *path, uint64_t dir_ino, struct notify_list *nl);
void kev_prune_free(struct kfs *fs);

/* repair.c: the runtimes' own size records */
/* evict_lock held. Runs the repairs of vs's units and the ones left over from earlier batches. */
void kev_repair_all(struct kfs *fs, struct victims *vs, struct notify_list *nl);
/* After ev->stop was set under evict_lock: ends the repairer thread. */
void kev_repairer_stop(struct kfs *fs);
void kev_repair_free(struct kfs *fs);

/* space.c: reservations and the evictions they run */
/* evict_lock held. Removes the victims that cover goal bytes (at most max_victims); fails with -ENOSPC,
 * removing nothing, if they cannot cover must_free. Returns the bytes freed. */
int64_t kev_evict_batch(struct kfs *fs, uint64_t *cursor, uint64_t goal, uint64_t must_free, size_t max_victims,
                        bool grace, struct notify_list *nl, bool help, bool in_line, struct kev_busy *busy);
/* Evicts until used plus reserved bytes are down to target, a batch per hold of evict_lock. */
int64_t kev_evict_down_to(struct kfs *fs, uint64_t target, uint64_t *cursor, bool grace, bool in_line);

/* descent.c: the background descent */
uint64_t kev_low_watermark(struct kfs *fs);
uint64_t kev_high_mark(struct kfs *fs);
/* space_lock held. */
void kev_descent_kick_locked(struct kfs *fs, uint64_t used, bool force);
bool kev_descent_started_locked(struct kfs *fs);
/* An eviction stopped at entries young for the grace; with the one last used at atime_ns aged, it would
 * have reached its goal: the descent is to look again then (descent.c). Any thread, any lock. */
void kev_note_young(struct kfs *fs, int64_t atime_ns);
/* Ends the descent thread (after ev->descent.stop was set). */
void kev_descent_join(struct kfs *fs);

/* units.c: the runtimes' entries */
/* Whether the file at path never goes (a runtime's lock or bookkeeping, a young temporary file). */
bool kev_unit_protected(const struct kfs *fs, const char *path, int64_t atime_ns, int64_t now_ns);
/* The unit the file at path belongs to: kev_unit_resolve (evict.h). */

/* misses.c: what a limit too small costs */
/* An eviction removed the name at path (relative to the backing root), of a file of bytes. */
void kev_miss_evicted(struct kfs *fs, const char *path, uint64_t bytes);
/* A write was refused with nothing left to evict; it needed a limit of needed bytes. */
void kev_miss_refused(struct kfs *fs, uint64_t needed);
void kev_miss_counts(struct kfs *fs, struct kev_counts *c);
void kev_miss_zero(struct kfs *fs);
void kev_miss_free(struct kfs *fs);

/* marks.c: the directories kcache env made for a runtime */
/* The runtime whose marked directory path (relative to the root) is in, or KRT_AUTO. */
enum krt kev_mark_of(struct kfs *fs, const char *path);
void kev_marks_free(struct kfs *fs);

/* reap.c: the last close of evicted files */
/* Closes fd (an evicted file's last reference, holding bytes) on a reaper thread, or here if the queue
 * holds kev_reap_bound() bytes already. */
void kev_reap(struct kfs *fs, int fd, uint64_t bytes);
