/* kidx: the SQLite index of a kcachefs cache. The only module that includes <sqlite3.h>.
 *
 * What it stores (schema version KIDX_SCHEMA_VERSION):
 *   files(ino, bytes, seq, atime_ns, opens, bytes_read, pinned, uid)  one row per regular file (inode)
 *   dents(dir, name, ino, type)                                      one row per directory entry
 *   evictions(id, time_ns, ino, bytes, name)                          the last evictions, for operators
 *   meta(k, v)                                                        clean flag, sequence, counters
 * Files are keyed by their backing inode number, names by (parent directory inode, name), as a real
 * directory is: renaming a directory is one row, and hard links are several dents rows of one file.
 *
 * Recency is a global access sequence number (seq), incremented on every logged access, as CVMFS does:
 * two accesses in the same nanosecond still have an order. atime_ns is the wall clock of the last access.
 *
 * Hot path: kidx_touch() and the other mutators only append to an in-memory batch (one mutex, no I/O).
 * kidx_flush() applies the batch in one transaction; the writer thread calls it every flush interval
 * (1 s by default), the daemon calls it before every eviction decision and at unmount.
 *
 * What a crash can lose: the batch not yet flushed, i.e. at most the last flush interval of recency and
 * counters. The index records in meta whether the last daemon stopped cleanly; if it did not, kidx_open()
 * reconciles the index with the backing directory (the truth): unknown files are added with their mtime
 * as recency, rows of missing files dropped, sizes recomputed. So no file is ever lost or miscounted.
 *
 * Locking: idx->batch_lock guards the batch and the in-memory counters; idx->db_lock guards the write
 * connection; idx->rd_lock guards the read connection used by kidx_get_file(). Lock order: db_lock, then
 * batch_lock. All functions are thread-safe. Errors are -errno (SQLite errors map to -EIO, a full disk to
 * -ENOSPC, a corrupt file to -EBADMSG). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KIDX_SCHEMA_VERSION 2 /* 2: evict_intents; an index of version 1 is upgraded in place */

typedef struct kidx kidx;

enum kidx_type { KIDX_REG = 1, KIDX_DIR = 2, KIDX_LNK = 3, KIDX_OTHER = 4 };

struct kidx_open_opts {
        const char *db_path;       /* the SQLite file; its directory must exist */
        int backing_fd;            /* O_DIRECTORY fd of the backing root, for rebuilds */
        const char *skip_name;     /* a name in the backing root the scan must skip (the metadata dir) */
        bool progress;             /* print rebuild progress to stderr (a TTY) */
        bool force_rebuild;        /* rebuild even after a clean stop */
};

/* Why kidx_open() rebuilt, for the daemon's log. */
enum kidx_rebuild_reason {
        KIDX_NO_REBUILD = 0,
        KIDX_REBUILD_NEW,      /* no index yet */
        KIDX_REBUILD_UNCLEAN,  /* the last daemon did not stop cleanly */
        KIDX_REBUILD_CORRUPT,  /* unreadable; moved aside to <db>.corrupt */
        KIDX_REBUILD_SCHEMA,   /* unknown schema version; moved aside */
        KIDX_REBUILD_MOVED,    /* the backing root is not the directory the index describes */
        KIDX_REBUILD_FORCED,
};

struct kidx_stats {
        uint64_t used_bytes;     /* allocated bytes of all indexed regular files */
        uint64_t files;          /* indexed regular files */
        uint64_t seq;            /* last access sequence number handed out */
        uint64_t opens;          /* opens logged since the index was created */
        uint64_t bytes_read;     /* bytes served by the read handler */
        uint64_t evicted_files;
        uint64_t evicted_bytes;
        uint64_t rebuilds;
        uint64_t flushes;        /* batches committed by this process */
        uint64_t db_bytes;       /* the index's database file on disk, allocated (kidx_get_stats) */
        uint64_t wal_bytes;      /* its write-ahead log, allocated (kidx_get_stats) */
        uint64_t ckpt_failures;  /* forced checkpoints that a reader kept from restarting the WAL */
};

struct kidx_file {
        uint64_t ino;
        uint64_t bytes;
        uint64_t seq;
        int64_t atime_ns;
        uint64_t opens;
        uint64_t bytes_read;
        bool pinned;
        uint32_t uid;
};

/* Opens or creates the index and makes it agree with the backing directory (see above). On success
 * *ret is a usable index and *ret_reason (may be NULL) says whether and why it rebuilt.
 * -EROFS / -EACCES: the index's place is not writable. -EIO: SQLite failed. */
int kidx_open(const struct kidx_open_opts *opts, kidx **ret, enum kidx_rebuild_reason *ret_reason);
/* Flushes, marks the index clean if clean is true, closes. Takes NULL. */
void kidx_close(kidx *idx, bool clean);
/* Marks the index in use (not clean) on disk: call once serving starts; a crash after it forces a rebuild. */
int kidx_mark_dirty(kidx *idx);
/* Starts the writer thread, which flushes every interval_ms. Stopped by kidx_close(). */
int kidx_start_writer(kidx *idx, unsigned interval_ms);
/* Applies the pending batch in one transaction. */
int kidx_flush(kidx *idx);
/* Zeroes the statistics counters (opens, bytes_read, evicted_files, evicted_bytes, rebuilds) in memory and
 * in the meta table, at once (kcache zero). Never the totals (used_bytes, files: I3) nor seq, which
 * eviction reads. Counting goes on from zero. -EIO: SQLite failed, and the counters on disk are as they
 * were (those in memory are zero, and the next flush writes them). */
int kidx_zero_counters(kidx *idx);

/* ---- mutators: memory only, applied by the next flush ---- */
/* A logged access (open, read, write, create): new seq, atime = now_ns. Returns the seq. */
uint64_t kidx_touch(kidx *idx, uint64_t ino, int64_t now_ns, uint32_t opens, uint64_t bytes_read);
/* Sets the logged atime without changing recency (utimensat with an explicit atime). */
void kidx_set_atime(kidx *idx, uint64_t ino, int64_t atime_ns);
/* The allocated size of ino is new_bytes now. Ignored for an ino without a row (an unlinked or evicted
 * file, or one never indexed): only rows count (I3). */
void kidx_set_bytes(kidx *idx, uint64_t ino, uint64_t new_bytes);
void kidx_set_pinned(kidx *idx, uint64_t ino, bool pinned);
/* The attribute a pinned backing file carries (value "1"; the daemon sets and removes it with the pin,
 * fs/control.c): a rebuild pins every file that has it (kidx-rebuild.c), so a pin outlives its index. */
#define KIDX_PIN_XATTR "user.kcachefs.pinned"
/* A new regular file ino (bytes allocated, owned by uid), counted as an access. A row of ino still held
 * (a reused inode number) is replaced, and stops counting. */
void kidx_add_file(kidx *idx, uint64_t ino, uint64_t bytes, uint32_t uid, int64_t now_ns);
/* A new name: dir/name -> ino of the given type (replaces an existing row of that name). */
void kidx_add_dent(kidx *idx, uint64_t dir, const char *name, uint64_t ino, enum kidx_type type);
/* dir/name went away. If it was the last link of regular file ino, also drop the file (bytes as held). */
void kidx_del_dent(kidx *idx, uint64_t dir, const char *name);
/* dir/name went away if it still names ino: for removals made outside the kernel's directory locks
 * (eviction), after which the name may already hold a new object whose kidx_add_dent came first. */
void kidx_del_dent_of(kidx *idx, uint64_t dir, const char *name, uint64_t ino);
/* Regular file ino lost its last name: its row goes, with the bytes the row holds. */
void kidx_del_file(kidx *idx, uint64_t ino);
/* odir/oname moved to ndir/nname (which, if it existed, the caller removed with kidx_del_dent first).
 * With exchange, the two names swap. */
void kidx_rename(kidx *idx, uint64_t odir, const char *oname, uint64_t ndir, const char *nname, bool exchange);

/* ---- queries ---- */
uint64_t kidx_used(kidx *idx);
void kidx_get_stats(kidx *idx, struct kidx_stats *ret);
/* A file's row, pending batch included. -ENOENT if the index does not know ino. */
int kidx_get_file(kidx *idx, uint64_t ino, struct kidx_file *ret);

/* Eviction support. Call kidx_flush() first so the order is current. */
struct kidx_lru_row {
        uint64_t ino;
        uint64_t seq;
        uint64_t bytes;
        int64_t atime_ns;
        uint64_t gen;      /* the rows' generation it was read in (for kidx_evicted_row) */
};
/* Up to max unpinned files with seq > after_seq, least recent first. Returns the count or -errno. */
int kidx_lru_batch(kidx *idx, uint64_t after_seq, struct kidx_lru_row *rows, size_t max);
/* Eviction's candidates, a batch at a time: up to max unpinned files with seq > after_seq, least recent
 * first, each with every name the index has for it, read in one query (kidx_lru_batch, then
 * kidx_names for each, cost a query per candidate). The names are malloc'ed; a caller that keeps one
 * sets it to NULL, and kidx_candidates_free frees the rest. */
struct kidx_cand_name {
        uint64_t dir;
        char *name;
};
struct kidx_candidate {
        struct kidx_lru_row row;
        size_t first, n;              /* its names: names[first, first + n) */
};
struct kidx_candidates {
        struct kidx_candidate *v;
        size_t n, cap;
        struct kidx_cand_name *names;
        size_t nnames, names_cap;
};
/* Replaces c's contents with the next batch. Returns the number of candidates or -errno. */
int kidx_lru_candidates(kidx *idx, uint64_t after_seq, size_t max, struct kidx_candidates *c);
void kidx_candidates_free(struct kidx_candidates *c);
/* Calls fn for every name of ino: (dir inode, name). Returns the number of names or -errno. */
int kidx_names(kidx *idx, uint64_t ino, void (*fn)(void *ud, uint64_t dir, const char *name), void *ud);
/* The path of directory dir relative to the backing root ("" for the root), or -ENOENT. */
int kidx_dir_path(kidx *idx, uint64_t dir, char *buf, size_t size);
/* The names from the backing root down to directory dir, each with its directory's inode number: what
 * ktree_walk (common/tree.h) needs to reach dir checking every component, at any depth. n is 0 for the
 * root. Free with kidx_chain_free. -ENOENT: dir unknown to the index; -ELOOP; -ENOMEM. */
struct kidx_chain {
        size_t n;
        char **names;   /* names[0] is in the root */
        uint64_t *inos; /* inos[i]: the directory names[i] holds */
};
int kidx_dir_chain(kidx *idx, uint64_t dir, struct kidx_chain *ret);
/* The chain's path relative to the root ("" for the root), malloc'd; NULL on ENOMEM. */
char *kidx_chain_path(const struct kidx_chain *c, size_t n);
void kidx_chain_free(struct kidx_chain *c);
/* Records the eviction of ino (all its names already unlinked): drops its rows, counts it, logs it.
 * Returns the bytes its row held (0 if it had none). */
uint64_t kidx_evicted(kidx *idx, uint64_t ino, const char *path, int64_t now_ns);
/* The same for a file chosen from kidx_lru_batch's row: if no flush committed since, the row's bytes are
 * the committed ones, and the database need not be read again for them. */
uint64_t kidx_evicted_row(kidx *idx, const struct kidx_lru_row *row, const char *path, int64_t now_ns);
/* Write-ahead records of evictions: committed now, before any of the files is removed. Each must be
 * followed by kidx_evicted() (done) or kidx_evict_cancel() (the file stayed). After a crash, the
 * reconcile logs those whose file is gone as evictions. Returns 0 or -errno (then evict nothing). */
struct kidx_intent {
        uint64_t ino, bytes;
        const char *name;
};
int kidx_evict_intents(kidx *idx, size_t n, const struct kidx_intent *v, int64_t now_ns);
void kidx_evict_cancel(kidx *idx, uint64_t ino);

/* Reconciles the index with the tree while serving (kcache verify --repair): the batch keeps collecting
 * meanwhile and is applied on top. Returns 0 or -errno. */
int kidx_reconcile(kidx *idx, int backing_fd, const char *skip_name);

const char *kidx_rebuild_reason_str(enum kidx_rebuild_reason r);

/* ---- read-only access for tools (kcache): never blocks the daemon (WAL readers do not) ---- */
typedef struct kidx_reader kidx_reader;
struct kidx_entry {
        const char *path;    /* relative to the cache root; valid during the callback */
        uint64_t ino, bytes, seq, opens, bytes_read;
        int64_t atime_ns;
        bool pinned;
        uint32_t uid;
};
int kidx_reader_open(const char *db_path, kidx_reader **ret);
void kidx_reader_close(kidx_reader *r);
/* Regular files in LRU order (mru: most recent first), at most limit (0: all), under prefix (a path
 * relative to the root, "" for all). fn returns non-zero to stop. Returns the count or -errno. */
int kidx_reader_list(kidx_reader *r, bool mru, uint64_t limit, const char *prefix,
                     int (*fn)(void *ud, const struct kidx_entry *e), void *ud);
/* Per-uid totals: fn(uid, files, bytes). */
int kidx_reader_users(kidx_reader *r, void (*fn)(void *ud, uint32_t uid, uint64_t files, uint64_t bytes), void *ud);
/* Every name of a regular file reachable from the root, as (directory inode, name), with the file's inode
 * and indexed bytes: for comparing with the tree by identity, at any depth (kcache verify). */
int kidx_reader_names(kidx_reader *r,
                      void (*fn)(void *ud, uint64_t dir, const char *name, uint64_t ino, uint64_t bytes), void *ud);
/* The path of name in directory dir, relative to the root, in *ret (malloc'ed; any length): for a report.
 * -ENOENT when dir is not reachable from the root. */
int kidx_reader_path(kidx_reader *r, uint64_t dir, const char *name, char **ret);
