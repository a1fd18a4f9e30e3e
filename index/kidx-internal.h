/* Internals shared by the files of index/. Nothing outside index/ includes this. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <sqlite3.h>

#include "../common/kmap.h"
#include "kidx.h"

/* What the batch knows about one file since the last flush. */
struct kidx__touch {
        uint64_t seq;        /* 0: no access logged */
        int64_t atime_ns;    /* valid if has_atime */
        bool has_atime;
        bool added;          /* the file was created in this batch: all fields are absolute */
        int8_t pinned;       /* -1: unchanged */
        uint32_t opens;      /* delta (absolute if added) */
        uint32_t uid;        /* if added */
        uint64_t bytes_read; /* delta (absolute if added) */
        int64_t bytes;       /* -1: unchanged */
};

enum kidx__op_kind { OP_ADD_DENT, OP_DEL_DENT, OP_DEL_DENT_INO, OP_RENAME, OP_EXCHANGE, OP_DEL_FILE, OP_EVICTED, OP_EVICT_CANCEL };

/* A structural change, applied in order before the touches. */
struct kidx__op {
        enum kidx__op_kind kind;
        uint64_t a, b, c;  /* ADD_DENT: dir, ino, type; DEL_DENT: dir; DEL_DENT_INO: dir, ino; RENAME: odir, ndir;
                              DEL_FILE/EVICTED: ino, bytes */
        int64_t t;         /* EVICTED: time */
        char *s1, *s2;     /* names (owned) */
};

enum kidx__stmt {
        ST_TOUCH, ST_ADD_FILE, ST_DEL_FILE, ST_ADD_DENT, ST_DEL_DENT, ST_DEL_DENT_INO, ST_DEL_DENTS_OF, ST_RENAME,
        ST_LOG_EVICTION, ST_SET_META, ST_LRU, ST_LRU_NAMES, ST_NAMES, ST_PARENT, ST_INTENT_ADD, ST_INTENT_DEL,
        ST__COUNT
};

struct kidx {
        sqlite3 *db;                    /* write connection; db_lock */
        sqlite3 *rd;                    /* read connection; rd_lock */
        sqlite3_stmt *st[ST__COUNT];    /* on db; db_lock */
        sqlite3_stmt *rd_get;           /* on rd; rd_lock */
        pthread_mutex_t db_lock;
        pthread_mutex_t rd_lock;

        pthread_mutex_t batch_lock;
        kmap touches;                   /* ino -> struct kidx__touch*; batch_lock */
        struct kidx__op *ops;           /* batch_lock */
        size_t nops, cap_ops;           /* batch_lock */
        struct kidx_stats stats;        /* counters; batch_lock (flushes: db_lock) */
        kmap sizes;                     /* ino -> row size of every row the pending batch changes (I3):
                                           bytes + 1, or KIDX__NO_ROW; batch_lock */
        kmap sizes_flushing;            /* the same for the batch a flush is committing; batch_lock */
        uint64_t flush_gen;             /* bumped when a flush's rows are committed; batch_lock */
        sqlite3_stmt *rd_size;          /* on rd; rd_lock */

        pthread_t writer;
        bool writer_running;
        bool writer_stop;               /* batch_lock */
        pthread_cond_t writer_cond;     /* signalled on stop; batch_lock */
        unsigned interval_ms;
        _Atomic bool ckpt_wanted;       /* the WAL passed CKPT_PAGES: checkpoint now (kidx-flush.c) */
        _Atomic uint64_t ckpt_failures; /* forced checkpoints that could not restart the WAL */
        int ckpt_force_at;              /* WAL pages before the next forced checkpoint; writer thread */

        char *db_path;
        uint64_t root_ino;              /* backing root's inode (I2); set at open */
};

/* The WAL file is cut back to this size when it restarts (PRAGMA journal_size_limit). */
#define KIDX_WAL_KEEP_STR "4194304"

int kidx__errno(int sqlite_rc);
int kidx__exec(sqlite3 *db, const char *sql);
int kidx__set_meta(kidx *idx, const char *k, int64_t v);
int kidx__get_meta(sqlite3 *db, const char *k, int64_t *ret);
int64_t kidx__meta_or(sqlite3 *db, const char *k, int64_t dflt);
int kidx__open_conn(const char *path, int flags, sqlite3 **ret);
/* kidx-flush.c */
void kidx__free_batch(struct kidx__op *ops, size_t n, kmap *touches);
/* Stops the writer thread, if it runs (kidx_close). */
void kidx__stop_writer(kidx *idx);
/* Reconcile the index with the backing tree (see kidx.h). Runs inside its own transaction. */
int kidx__rebuild(kidx *idx, int backing_fd, const char *skip_name, bool progress);
/* A row size in sizes or sizes_flushing: the row goes (deleted or evicted). */
#define KIDX__NO_ROW ((void *)UINTPTR_MAX)

/* Counts used_bytes and files from the files table (db_lock held: nothing flushes meanwhile), and
 * rebuilds sizes from the pending batch, as the next flush will apply it. */
int kidx__load_sizes(kidx *idx);
/* kidx_dir_chain with db_lock already held (the rebuild, inside its transaction, sees the dents it wrote). */
int kidx__dir_chain_locked(kidx *idx, uint64_t dir, struct kidx_chain *ret);
