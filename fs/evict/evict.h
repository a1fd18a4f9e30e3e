/* evict.h: keeping the cache under its limit. The only header the rest of the daemon includes from
 * fs/evict/; the essay below is the design, and THE FOLDER says where each part of it lives.
 *
 * THE PROBLEM. Kernel caches of GPU runtimes are written by programs we cannot change, and read back
 * with "does the file exist? then read it". A cache that grows without bound fills the disk; a cache
 * that evicts by st_atime evicts the wrong files on noatime/relatime filesystems; a cache that deletes
 * files a program is using breaks that program. kcachefs sees every open, read and write, so it can keep
 * an exact LRU order and an exact size, and enforce the limit at the moment space is allocated.
 *
 * THE FOLDER. One file per concern, each with the part of this essay it implements:
 *   space.c     when eviction runs and who waits: reservations, the in-line eviction of a write that
 *               would cross the limit, FAIRNESS, HELPING, ALL OR NOTHING, the measurement after a write
 *   descent.c   the background descent to the low watermark (HOW FAR)
 *   choose.c    what goes first: the LRU walk, GRACE, what is never evicted, units taken whole
 *   remove.c    removing a unit: EXACTNESS, INODE REUSE, TELLING THE KERNEL, the runtime's own lock
 *   prune.c     the directories eviction empties (EMPTIED DIRECTORIES, its own essay)
 *   units.c     the runtimes' entries: which files form one, in what order they go, what stays
 *               (the runtimes' data, names and environment, are common/runtimes.c)
 *   repair.c    the runtimes' own size records (NEO's config.file, SYCL's cache_size.txt), rewritten
 *               after their files went, under the runtime's own lock
 *   reap.c      the last close of evicted files, off the request path (its own essay)
 *   operator.c  what an operator asks for: evict to a size, files older than a time, one file
 *   marks.c     the directories kcache env made for a runtime: that runtime's rules apply in them
 *   misses.c    what a limit too small costs: names evicted that came back, writes refused (its essay)
 *   state.c     the state (struct kev, internal.h): made, started, stopped, freed; its counters
 *
 * WHAT IS COUNTED. Used bytes are the allocated bytes (st_blocks * 512) of the regular files in the cache,
 * as the index holds them (kidx I3, inode T3). Directories, symlinks and the index itself are not counted,
 * and the mount reports zero blocks for them, so `du -sB1 MOUNT` equals `df`'s used when the cache is idle.
 *
 * WHEN EVICTION RUNS. Before anything that can allocate (write, fallocate) the operation reserves an upper
 * bound of what it may allocate (ops-io.c). If used + reserved + this request would cross max_size, eviction
 * runs first, then grants the reservation or fails the one operation with ENOSPC. Reservations make
 * concurrent writers safe: their sum is covered before any of them writes, so used bytes never exceed
 * max_size whatever runs at once. After the operation the real st_blocks replaces the estimate. ENOSPC from
 * the backing filesystem itself (a disk smaller than max_size, or shared) also evicts, then retries once.
 *
 * HOW FAR, AND BY WHOM. A write should not wait for an eviction at all. So eviction runs ahead of the
 * writes, on a thread of its own (the descent): once used plus reserved bytes pass the high mark, halfway
 * between the low watermark (default 90% of max_size) and max_size, the write that passed it kicks the
 * descent and goes on; the descent evicts down to the low watermark, batch by batch, and sleeps until the
 * next kick. A cache filled at any rate the descent keeps up with never reaches its limit, and no write
 * waits. Only a write that would cross max_size itself (the descent fell behind, or -o low_watermark=100
 * leaves no room between them) evicts in line, and only what it needs; blocked_writes counts those. A
 * descent that frees nothing and leaves the cache above the high mark (young, open or pinned files) is
 * not kicked again for the grace period (a write that has to evict in line still kicks it), so a cache
 * full of files in use is not flushed and walked on every write. A descent that stopped above the low
 * watermark at files within the grace runs again by itself as soon as enough of them have aged to reach
 * it (kev_note_young): after a burst faster than the grace, the cache is at the low watermark as the
 * burst's files pass the grace, not whenever the next write comes. Starting an eviction is costly (flush
 * the index, query it), which is why each descent goes all the way down. Running at any moment, not only
 * inside a runtime's store, the descent takes the lock a runtime reads its entries under (JAX's
 * .lockfile, runtime_lock) before it removes one of them.
 *
 * COST. Victims are read from the index in LRU order with a cursor, so a long eviction never re-reads
 * what it has passed. Beyond what the crossing request needs, eviction works in batches of BATCH_VICTIMS
 * and releases evict_lock between batches: another writer that needs room waits for one batch at most,
 * and writers that have room do not wait at all.
 *
 * WHAT GOES FIRST. The unit of eviction is a file (runtime-aware units, such as a whole PoCL program
 * directory, are taken whole, units.c). Victims
 * are the least recently used files by the access sequence (kidx), read through the partial index
 * files_lru in batches: picking k victims among n files costs O(k log n), never a scan.
 *
 * GRACE. A runtime uses an entry in several steps with no file open in between (Triton: the group json,
 * then the binary it names; PoCL: program.bc at clBuildProgram, then each kernel's .so, linked by another
 * process, at the first launch, 0.3 s later here and seconds for large kernels). So an entry used within
 * the last grace_ms (default 2 s) is not chosen: the LRU walk stops at the first such file. Only a write
 * that cannot fit otherwise goes on past it, since failing that write breaks the runtime for sure; a cache
 * where that happens is smaller than what its runtimes have in flight. An operator's explicit eviction
 * (kcache evict) does not wait for the grace period either; open and pinned files always stay.
 *
 * WHAT IS NEVER EVICTED. Pinned files (the index's pinned flag, or a name matching a pin pattern), files
 * open for writing (and so the file being written), and, by default, every file open at all: a runtime
 * that has probed a file must be able to read it. With -o protect=writers, files open only for reading
 * may go (their readers keep reading the unlinked inode). Eviction only ever unlinks; it never truncates.
 *
 * ALL OR NOTHING. Victims are chosen first and removed second. If even all evictable files would not make
 * the request fit, nothing is removed and the request fails with ENOSPC: a write that cannot succeed does
 * not empty the cache on its way to failing.
 *
 * EXACTNESS. Before choosing, the index batch is flushed so the order reflects every access up to now.
 * Before unlinking a name, its backing inode number is checked against the victim's: a stale index row
 * can never remove another file. The open check and the unlink happen under itable_lock, the lock that
 * open() takes to count itself, so a file cannot be opened between the check and its removal; an open
 * that races the unlink through an old dentry finds inode->evicted and fails with ENOENT, as if it had
 * come a moment later.
 *
 * RECORDS THAT SURVIVE A CRASH. Every eviction is logged (kcache, the evictions table), and a crash must
 * not make an evicted file look lost. The log itself is batched like the rest of the index, so a batch's
 * victims are first written as intents in a transaction of their own (one commit per batch of at most
 * 64), and only then removed; each intent is fulfilled (logged as an eviction) or cancelled (the file was
 * opened meanwhile) in the ordinary batch. The reconcile after a crash logs the intents whose file is gone
 * and drops the others.
 *
 * TELLING THE KERNEL. The kernel may still hold a dentry, cached attributes and a cached listing for a
 * removed name. We never use fuse_lowlevel_notify_inval_entry() for this: it takes the parent directory's
 * lock in the kernel, and a rename in that directory holds the lock while it waits for our reply. If the
 * daemon is killed at that moment, the notifying thread can never finish, keeps /dev/fuse open, and the
 * mount hangs until someone aborts the connection (we hit exactly this in the SIGKILL test). Instead we
 * send only notifications that take no lock: fuse_lowlevel_notify_inval_inode() with offset -1 on the
 * victim (attributes only) and on its parent (attributes and pages, where the kernel keeps the cached
 * listing). A stale dentry of the victim leads to its inode, which is marked evicted: getattr,
 * setattr and open answer ESTALE, on which the VFS repeats the lookup with LOOKUP_REVAL and finds the name
 * gone (stat: ENOENT; open with O_CREAT: a new file). Open handles are unaffected. Since the kernel may
 * keep such an inode cached for long, its O_PATH fd is re-pointed at an anonymous placeholder so that the
 * backing filesystem frees the blocks now, not when the kernel gets round to forgetting it. Last, the
 * kernel is asked to drop the victims' names where nobody uses them (FUSE_NOTIFY_PRUNE, which takes no
 * directory lock: fs/kprune.c), so that it forgets their inodes and the daemon frees what it kept for
 * them: memory follows the cache, not the number of evictions.
 *
 * INODE REUSE. Files are keyed by inode number, and a filesystem such as ext4 gives a freed number to the
 * next new file at once. So every removal keeps an O_PATH fd on the removed inode until the index has
 * been told: a file created meanwhile cannot get its number and have its own entry dropped with the old.
 * That fd is then the file's last reference, and its close frees the blocks, which on ext4 with -o
 * discard waits for the device; the reaper thread (reap.c) does those closes, not the evicting write.
 *
 * CRASHES. Eviction unlinks first and records second. A crash in between leaves index rows for files that
 * are gone; the next mount sees the unclean flag and reconciles with the tree, so nothing is lost and
 * nothing is counted twice.
 *
 * FAIRNESS. While an eviction runs (fs->ev->evicting), no new reservation is granted on the fast path.
 * Without this, the other writers fill each victim's space as it is freed, and the request that paid for
 * the eviction fails.
 *
 * HELPING. A write that needs room while another request's eviction runs does not wait for that whole
 * eviction (a 1 MiB write evicts 256 files of 4 KiB: 5-15 ms here, up to 29 ms with the disk busy). It
 * queues (fs->ev->space_waiters, in arrival order) and the evictor, after every BATCH_VICTIMS files it removes,
 * grants queued requests from the room made so far, then evicts on for its own request: it goes on until
 * its own reservation fits, however much the queued ones took, so neither side can fail for the other.
 * Requests still queued when it is done evict for themselves, one at a time.
 *
 * LOCKS. evict_lock serializes evictions (one flush, one consistent order); space_lock guards the
 * reservations and the descent's state, and is never held across I/O. Where they stand among the
 * daemon's other locks: kfs.h, LOCK ORDER. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../../common/runtimes.h"

struct kfs;
struct kfs_inode;

/* Eviction's state (internal.h), made at start-up before anything else of it: 0 or -errno. */
int kev_init(struct kfs *fs);
/* After the mount: starts the background descent, and kicks it if the cache is above its high mark
 * already (remounted with a smaller max_size). */
void kev_start(struct kfs *fs);
/* Stops the repairer and the descent threads (before the index and the session go). */
void kev_stop(struct kfs *fs);
/* Frees eviction's state (repairs still pending are forgotten: the next mount's evictions redo them). */
void kev_free(struct kfs *fs);

/* Promises bytes of new allocation; evicts first if the limit would be crossed. -ENOSPC if it cannot. */
int kev_reserve(struct kfs *fs, uint64_t bytes);
/* After an allocating operation (in->lock held): accounts st (if not NULL) and releases the reservation,
 * atomically for anyone checking space. */
void kev_settle(struct kfs *fs, struct kfs_inode *in, const struct stat *st, uint64_t reserved);
/* Measures in's file through fd (or its O_PATH fd if -1) and accounts it (T3), after an allocating
 * operation that reserved `reserved` bytes (released here) or after it grew behind the daemon's back
 * (written back; written through a shared mapping of the backing file): growth beyond the reservation is
 * reserved first, as a write's would be, so that eviction makes room and the count stays within max_size
 * (counted all the same if nothing can go: the blocks are on the disk). No lock of ours held. */
void kev_measure(struct kfs *fs, struct kfs_inode *in, int fd, uint64_t reserved);
/* in->lock held: accounts st (T3) if that adds nothing to the count, and returns true; else returns false
 * and the caller, having let in->lock go, calls kev_measure(). */
bool kev_account_locked(struct kfs *fs, struct kfs_inode *in, const struct stat *st);
/* What a write that hit ENOSPC on the backing filesystem does before its one retry. */
int kev_for_enospc(struct kfs *fs, uint64_t bytes);
/* The process (its requesting thread's id) whose write, truncate or open this thread is serving while it
 * may evict in line, else 0 (remove.c, runtime_lock; units.c): set around those calls only. */
extern _Thread_local pid_t kev_writer;

/* Evicts least recently used files until used <= target (sparing recently used ones if grace). Returns
 * bytes freed or -errno. */
int64_t kev_evict_to(struct kfs *fs, uint64_t target, bool grace);
/* A running mount's new max_size and low_watermark (kcache set, SIGHUP: settings.c), set under space_lock
 * where reservations read them; a cache now past its high mark wakes the descent, which takes it down in
 * the background (a write that reaches the limit evicts in line meanwhile). */
void kev_set_limits(struct kfs *fs, uint64_t max_size, unsigned low_watermark);
/* Evicts, in LRU order, every unprotected file last accessed before cutoff_ns. Returns bytes freed. */
int64_t kev_evict_older(struct kfs *fs, int64_t cutoff_ns);
/* Evicts one file now, with its whole unit. -EBUSY: open; -EPERM: pinned; -ENOENT: not in the cache. */
int kev_evict_ino(struct kfs *fs, uint64_t ino);
/* Whether one of the inode's names matches a pin pattern (-o pin=). */
bool kev_pinned_by_pattern(struct kfs *fs, struct kfs_inode *in);
/* Waits until every evicted file queued for its last close is closed (its blocks freed). */
void kev_reap_drain(struct kfs *fs);
/* Closes what is queued and stops the reapers (after the last request). */
void kev_reap_stop(struct kfs *fs);
/* The most bytes of evicted files whose blocks the backing filesystem may still hold. */
uint64_t kev_reap_bound(const struct kfs *fs);

/* Whether rel (relative to the root) is where kcache env puts a runtime's directory: a directory directly
 * in the root (not users/), or users/<uid>/<name> on a shared mount (../users.c). */
bool kev_markable(const char *rel);
/* Marks the directory name (kev_markable) open at dirfd (-1: the mark is not written to the backing
 * directory), as runtime rt's (KRT_AUTO: unmarked). 0 or -errno; -EINVAL where no mark goes (marks.c). */
int kev_mark(struct kfs *fs, const char *name, int dirfd, enum krt rt);
/* A directory in the root was renamed (to NULL: removed, or moved below): its mark goes along (users/:
 * the marks below it go). */
void kev_mark_moved(struct kfs *fs, const char *from, const char *to);
/* The mark of the directory name (kev_markable), or KRT_AUTO. */
enum krt kev_mark_get(struct kfs *fs, const char *name);
/* At mount: the marks kept on the root's directories, and on those of users/<uid>/ (marks.c). */
void kev_marks_load(struct kfs *fs);

/* A regular file appeared under name in the directory open at dfd (created, made, renamed into place):
 * a refetch if eviction removed that name lately (misses.c). No lock of ours held. */
void kev_miss_made(struct kfs *fs, int dfd, const char *name);

/* units.c: the runtime's entry a file belongs to (also what the shared tier shares, fs/remote/). */
struct kev_unit {
        enum krt rt;
        char *root;               /* the entry's directory, relative */
        char **members;           /* regular files, relative, in deletion order */
        size_t n;
        char *repair;             /* NEO: dir of config.file; SYCL: dir of cache_size.txt; or NULL */
        bool dir_unit;            /* the entry is a whole directory (PoCL program, CUDA cache) */
        enum krt forced;          /* the runtime layout= or kcache env's mark gives its path, or KRT_AUTO */
        bool busy;                /* the runtime holds it now (SYCL <n>.lock, JAX .lockfile, a Triton store) */
        char *lock_dir;           /* PyOpenCL, JAX: the cache whose one lock guards every unit in it (kev_busy) */
};
int kev_unit_resolve(struct kfs *fs, const char *path, struct kev_unit *u);
void kev_unit_free(struct kev_unit *u);

/* What eviction has done since mount, for kcache stats. */
struct kev_counts {
        uint64_t helped_writes;   /* writes granted room by another request's eviction (HELPING) */
        uint64_t blocked_writes;  /* writes that found no room and waited for an eviction */
        uint64_t descents;        /* background descents */
        uint64_t refetches;       /* names evicted lately that came back: misses the limit caused */
        uint64_t refetch_bytes;   /* what those names held when they were evicted */
        uint64_t suggested_max_bytes; /* a limit that would have kept 90% of them, at the
                                     current low watermark; 0: no refetch */
        uint64_t refused_writes;  /* writes refused with nothing left to evict (open, pinned, young) */
        uint64_t refused_need_bytes; /* the largest limit one of them needed */
};
void kev_counts(struct kfs *fs, struct kev_counts *c);
/* Zeroes those counts (kcache zero): they only count, nothing of eviction reads them. What misses.c
 * remembers of evicted names stays, so a name evicted before comes back as a refetch still. */
void kev_zero_counts(struct kfs *fs);
