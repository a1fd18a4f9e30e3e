/* kidx.c: opening, validating and closing the index; the flush and the writer thread.
 *
 * Invariants (numbered so code can refer to them):
 *  I1. meta.clean = 1 only between a clean kidx_close() and the next kidx_mark_dirty(). If it is 0 at
 *      open, the tree may differ from the rows, so kidx_open() reconciles (kidx-rebuild.c).
 *  I2. meta.root_ino is the backing root's inode number; a different root means the rows describe
 *      another tree, so they are discarded and rebuilt.
 *  I3. stats.used_bytes and stats.files are the sum and count of the rows as the next flush will leave
 *      them, always. A mutator changes a row's size only knowing the size it replaces: the size the
 *      pending batch gave the row (sizes), else the one the flush in progress gives it (sizes_flushing),
 *      else the committed row (read from the database, outside batch_lock; flush_gen tells whether a
 *      flush committed meanwhile, and then it asks again). A mutator for an inode without a row changes
 *      nothing (an unlinked or evicted file, which callers may still measure). The totals are counted
 *      at open and after a reconcile (kidx__load_sizes), by the same scan that proves the table
 *      readable. So the total cannot drift from the rows, whatever order the daemon's threads tell it
 *      things in, and memory holds only the rows changed since the last flush (a whole table of sizes
 *      was 32 MiB and 0.2 s at mount for a million files).
 *  I4. A flush applies ops in the order they were made, then the touches (a touch never precedes the
 *      op that created its row, because kidx_del_file drops the touch of a reused inode).
 *  I5. The WAL stays small: see WAL checkpoints, below.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kidx-internal.h"

static const char *const SCHEMA =
        "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID;"
        "CREATE TABLE IF NOT EXISTS files("
        "  ino INTEGER PRIMARY KEY, bytes INTEGER NOT NULL, seq INTEGER NOT NULL,"
        "  atime_ns INTEGER NOT NULL, opens INTEGER NOT NULL DEFAULT 0,"
        "  bytes_read INTEGER NOT NULL DEFAULT 0, pinned INTEGER NOT NULL DEFAULT 0,"
        "  uid INTEGER NOT NULL DEFAULT 0);"
        "CREATE INDEX IF NOT EXISTS files_lru ON files(seq) WHERE pinned = 0;"
        "CREATE TABLE IF NOT EXISTS dents(dir INTEGER NOT NULL, name TEXT NOT NULL,"
        "  ino INTEGER NOT NULL, type INTEGER NOT NULL, PRIMARY KEY(dir, name)) WITHOUT ROWID;"
        "CREATE INDEX IF NOT EXISTS dents_ino ON dents(ino);"
        "CREATE TABLE IF NOT EXISTS evictions(id INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL,"
        "  ino INTEGER NOT NULL, bytes INTEGER NOT NULL, name TEXT NOT NULL);"
        /* Evictions about to happen, committed before any file goes (kidx_evict_intents), so that a crash
         * between a removal and the next flush cannot lose its record: the reconcile after the crash
         * logs the intents whose file is gone and drops the others. */
        "CREATE TABLE IF NOT EXISTS evict_intents(ino INTEGER PRIMARY KEY, bytes INTEGER NOT NULL,"
        "  name TEXT NOT NULL, time_ns INTEGER NOT NULL);";

static const char *const STMT_SQL[ST__COUNT] = {
        [ST_TOUCH] = "UPDATE files SET seq = CASE WHEN ?1 > 0 THEN ?1 ELSE seq END,"
                     " atime_ns = COALESCE(?2, atime_ns), opens = opens + ?3,"
                     " bytes_read = bytes_read + ?4, bytes = COALESCE(?5, bytes),"
                     " pinned = COALESCE(?6, pinned) WHERE ino = ?7",
        [ST_ADD_FILE] = "INSERT OR REPLACE INTO files(ino, bytes, seq, atime_ns, opens, bytes_read,"
                        " pinned, uid) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        [ST_DEL_FILE] = "DELETE FROM files WHERE ino = ?1",
        [ST_ADD_DENT] = "INSERT OR REPLACE INTO dents(dir, name, ino, type) VALUES (?1, ?2, ?3, ?4)",
        [ST_DEL_DENT] = "DELETE FROM dents WHERE dir = ?1 AND name = ?2",
        [ST_DEL_DENT_INO] = "DELETE FROM dents WHERE dir = ?1 AND name = ?2 AND ino = ?3",
        [ST_DEL_DENTS_OF] = "DELETE FROM dents WHERE ino = ?1",
        [ST_RENAME] = "UPDATE dents SET dir = ?3, name = ?4 WHERE dir = ?1 AND name = ?2",
        [ST_LOG_EVICTION] = "INSERT INTO evictions(time_ns, ino, bytes, name) VALUES (?1, ?2, ?3, ?4)",
        [ST_SET_META] = "INSERT OR REPLACE INTO meta(k, v) VALUES (?1, ?2)",
        [ST_LRU] = "SELECT ino, seq, bytes, atime_ns FROM files WHERE pinned = 0 AND seq > ?1 ORDER BY seq LIMIT ?2",
        [ST_NAMES] = "SELECT dir, name FROM dents WHERE ino = ?1",
        [ST_PARENT] = "SELECT dir, name FROM dents WHERE ino = ?1 AND type = 2 LIMIT 1",
        [ST_INTENT_ADD] = "INSERT OR REPLACE INTO evict_intents(ino, bytes, name, time_ns) VALUES (?1, ?2, ?3, ?4)",
        [ST_INTENT_DEL] = "DELETE FROM evict_intents WHERE ino = ?1",
};

/* Evictions remembered for operators (kcache, the crash tests). */
#define EVICTION_LOG_ROWS 100000

int kidx__errno(int rc)
{
        switch (rc & 0xff) {
        case SQLITE_OK:
        case SQLITE_DONE:
        case SQLITE_ROW:
                return 0;
        case SQLITE_NOMEM:
                return -ENOMEM;
        case SQLITE_FULL:
                return -ENOSPC;
        case SQLITE_READONLY:
                return -EROFS;
        case SQLITE_PERM:
        case SQLITE_AUTH:
                return -EACCES;
        case SQLITE_CANTOPEN:
                return -EACCES;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
                return -EBUSY;
        case SQLITE_CORRUPT:
        case SQLITE_NOTADB:
        case SQLITE_FORMAT:
                return -EBADMSG;
        default:
                return -EIO;
        }
}

int kidx__exec(sqlite3 *db, const char *sql)
{
        return kidx__errno(sqlite3_exec(db, sql, NULL, NULL, NULL));
}

int kidx__set_meta(kidx *idx, const char *k, int64_t v)
{
        sqlite3_stmt *st = idx->st[ST_SET_META];
        sqlite3_bind_text(st, 1, k, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, v);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        return kidx__errno(rc);
}

static int get_meta(sqlite3 *db, const char *k, int64_t *ret)
{
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(db, "SELECT v FROM meta WHERE k = ?1", -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        sqlite3_bind_text(st, 1, k, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        int r = rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? -ENOENT : kidx__errno(rc);
        if (rc == SQLITE_ROW)
                *ret = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return r;
}

static int64_t meta_or(sqlite3 *db, const char *k, int64_t dflt)
{
        int64_t v;
        return get_meta(db, k, &v) == 0 ? v : dflt;
}

static int open_conn(const char *path, int flags, sqlite3 **ret)
{
        sqlite3 *db = NULL;
        int rc = sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_NOMUTEX, NULL);
        if (rc != SQLITE_OK) {
                int r = kidx__errno(rc);
                sqlite3_close(db);
                return r;
        }
        sqlite3_busy_timeout(db, 5000);
        *ret = db;
        return 0;
}

/* Moves a damaged index (and its WAL) aside so nothing is lost for a post-mortem. */
static void move_aside(const char *path)
{
        char dst[4096], aux[4096];
        snprintf(dst, sizeof(dst), "%s.corrupt", path);
        (void)rename(path, dst);
        snprintf(aux, sizeof(aux), "%s-wal", path);
        (void)unlink(aux);
        snprintf(aux, sizeof(aux), "%s-shm", path);
        (void)unlink(aux);
}

/* Opens the write connection and checks that the file is an index of our schema.
 * Returns 0, -EBADMSG (corrupt), -EPROTO (other schema), or another -errno. */
static int open_checked(kidx *idx, bool *ret_new)
{
        int r = open_conn(idx->db_path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &idx->db);
        if (r < 0)
                return r;
        int64_t ver = -1;
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(idx->db, "PRAGMA user_version", -1, &st, NULL);
        if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
                ver = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        if (ver < 0)
                return kidx__errno(rc) ?: -EIO;
        /* WAL: readers never block the writer; NORMAL: a committed batch survives a process crash. */
        r = kidx__exec(idx->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                                "PRAGMA journal_size_limit=" KIDX_WAL_KEEP_STR "; PRAGMA cache_size=-16384;");
        if (r < 0)
                return r;
        if (ver == 0) {
                *ret_new = true;
                r = kidx__exec(idx->db, SCHEMA);
                if (r < 0)
                        return r;
                char sql[64];
                snprintf(sql, sizeof(sql), "PRAGMA user_version=%d", KIDX_SCHEMA_VERSION);
                return kidx__exec(idx->db, sql);
        }
        if (ver == 1) { /* version 2 added the write-ahead eviction intents: an index of 1 gains the table */
                r = kidx__exec(idx->db, "BEGIN IMMEDIATE;"
                                        "CREATE TABLE IF NOT EXISTS evict_intents(ino INTEGER PRIMARY KEY,"
                                        "  bytes INTEGER NOT NULL, name TEXT NOT NULL, time_ns INTEGER NOT NULL);"
                                        "PRAGMA user_version=2; COMMIT;");
                if (r < 0)
                        return r;
                ver = 2;
        }
        if (ver != KIDX_SCHEMA_VERSION)
                return -EPROTO;
        *ret_new = false;
        /* One scan of the whole files table proves the b-tree readable and counts the totals (I3). */
        rc = sqlite3_prepare_v2(idx->db, "SELECT max(seq), count(*), coalesce(sum(bytes), 0) FROM files", -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                idx->stats.seq = (uint64_t)sqlite3_column_int64(st, 0);
                idx->stats.files = (uint64_t)sqlite3_column_int64(st, 1);
                idx->stats.used_bytes = (uint64_t)sqlite3_column_int64(st, 2);
        }
        sqlite3_finalize(st);
        return rc == SQLITE_ROW ? 0 : kidx__errno(rc) ?: -EIO;
}

/* The bytes of ino's committed row, read on the write connection (db_lock held): bytes + 1, or
 * KIDX__NO_ROW. */
static uintptr_t db_row_size(sqlite3_stmt *st, uint64_t ino)
{
        sqlite3_bind_int64(st, 1, (int64_t)ino);
        uintptr_t v = (uintptr_t)KIDX__NO_ROW;
        if (sqlite3_step(st) == SQLITE_ROW)
                v = (uintptr_t)sqlite3_column_int64(st, 0) + 1;
        sqlite3_reset(st);
        return v;
}

int kidx__load_sizes(kidx *idx)
{
        sqlite3_stmt *st, *one;
        int rc = sqlite3_prepare_v2(idx->db, "SELECT count(*), coalesce(sum(bytes), 0) FROM files", -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        rc = sqlite3_step(st);
        uint64_t files = 0, used = 0;
        if (rc == SQLITE_ROW) {
                files = (uint64_t)sqlite3_column_int64(st, 0);
                used = (uint64_t)sqlite3_column_int64(st, 1);
        }
        sqlite3_finalize(st);
        if (rc != SQLITE_ROW)
                return kidx__errno(rc) ?: -EIO;
        rc = sqlite3_prepare_v2(idx->db, "SELECT bytes FROM files WHERE ino = ?1", -1, &one, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);

        kmap sizes;
        kmap_init(&sizes);
        int r = 0;
        pthread_mutex_lock(&idx->batch_lock);
        /* What the next flush does to the rows: the ops first (I4), then the touches. */
        for (size_t i = 0; r == 0 && i < idx->nops; i++) {
                const struct kidx__op *op = &idx->ops[i];
                if (op->kind == OP_DEL_FILE || op->kind == OP_EVICTED)
                        r = kmap_put(&sizes, op->a, KIDX__NO_ROW);
        }
        uint64_t k;
        void *tv;
        for (size_t pos = 0; r == 0 && kmap_next(&idx->touches, &pos, &k, &tv);) {
                const struct kidx__touch *t = tv;
                uintptr_t v = (uintptr_t)kmap_get(&sizes, k);
                if (!v)
                        v = db_row_size(one, k);
                if (t->bytes < 0 || (v == (uintptr_t)KIDX__NO_ROW && !t->added))
                        continue;
                r = kmap_put(&sizes, k, (void *)(uintptr_t)(t->bytes + 1));
        }
        /* The totals of the rows as the flush will leave them. */
        for (size_t pos = 0; r == 0 && kmap_next(&sizes, &pos, &k, &tv);) {
                uintptr_t now = (uintptr_t)tv, was = db_row_size(one, k);
                if (was != (uintptr_t)KIDX__NO_ROW) {
                        used -= (uint64_t)was - 1;
                        files--;
                }
                if (now != (uintptr_t)KIDX__NO_ROW) {
                        used += (uint64_t)now - 1;
                        files++;
                }
        }
        if (r == 0) {
                kmap_free(&idx->sizes);
                idx->sizes = sizes;
                idx->stats.used_bytes = used;
                idx->stats.files = files;
                idx->flush_gen++; /* the rows changed (a reconcile) */
        } else {
                kmap_free(&sizes);
        }
        pthread_mutex_unlock(&idx->batch_lock);
        sqlite3_finalize(one);
        return r;
}

static int prepare_all(kidx *idx)
{
        for (int i = 0; i < ST__COUNT; i++) {
                int rc = sqlite3_prepare_v3(idx->db, STMT_SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &idx->st[i], NULL);
                if (rc != SQLITE_OK)
                        return kidx__errno(rc);
        }
        int r = open_conn(idx->db_path, SQLITE_OPEN_READONLY, &idx->rd);
        if (r < 0)
                return r;
        /* The reader looks rows up one by one (every eviction's victims, I3): from a page cache of its own,
         * and from the file's pages mapped, not read. */
        (void)kidx__exec(idx->rd, "PRAGMA cache_size=-16384; PRAGMA mmap_size=268435456;");
        int rc = sqlite3_prepare_v3(idx->rd, "SELECT bytes, seq, atime_ns, opens, bytes_read, pinned, uid"
                                    " FROM files WHERE ino = ?1", -1, SQLITE_PREPARE_PERSISTENT,
                                    &idx->rd_get, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        rc = sqlite3_prepare_v3(idx->rd, "SELECT bytes FROM files WHERE ino = ?1", -1, SQLITE_PREPARE_PERSISTENT,
                                &idx->rd_size, NULL);
        return kidx__errno(rc);
}

static void close_conns(kidx *idx)
{
        for (int i = 0; i < ST__COUNT; i++) {
                sqlite3_finalize(idx->st[i]);
                idx->st[i] = NULL;
        }
        sqlite3_finalize(idx->rd_get);
        idx->rd_get = NULL;
        sqlite3_finalize(idx->rd_size);
        idx->rd_size = NULL;
        sqlite3_close(idx->rd);
        idx->rd = NULL;
        sqlite3_close(idx->db);
        idx->db = NULL;
}

static void load_counters(kidx *idx)
{
        int64_t seq = meta_or(idx->db, "seq", 0);
        if ((uint64_t)seq > idx->stats.seq)
                idx->stats.seq = (uint64_t)seq;
        idx->stats.opens = (uint64_t)meta_or(idx->db, "opens", 0);
        idx->stats.bytes_read = (uint64_t)meta_or(idx->db, "bytes_read", 0);
        idx->stats.evicted_files = (uint64_t)meta_or(idx->db, "evicted_files", 0);
        idx->stats.evicted_bytes = (uint64_t)meta_or(idx->db, "evicted_bytes", 0);
        idx->stats.rebuilds = (uint64_t)meta_or(idx->db, "rebuilds", 0);
}

int kidx_open(const struct kidx_open_opts *opts, kidx **ret, enum kidx_rebuild_reason *ret_reason)
{
        kidx *idx = calloc(1, sizeof(*idx));
        if (!idx)
                return -ENOMEM;
        pthread_mutex_init(&idx->db_lock, NULL);
        pthread_mutex_init(&idx->rd_lock, NULL);
        pthread_mutex_init(&idx->batch_lock, NULL);
        pthread_cond_init(&idx->writer_cond, NULL);
        kmap_init(&idx->touches);
        kmap_init(&idx->sizes);
        kmap_init(&idx->sizes_flushing);
        idx->db_path = strdup(opts->db_path);
        if (!idx->db_path) {
                kidx_close(idx, false);
                return -ENOMEM;
        }

        enum kidx_rebuild_reason reason = KIDX_NO_REBUILD;
        bool fresh = false;
        int r = open_checked(idx, &fresh);
        if (r == -EBADMSG || r == -EPROTO) {
                reason = r == -EBADMSG ? KIDX_REBUILD_CORRUPT : KIDX_REBUILD_SCHEMA;
                close_conns(idx);
                move_aside(idx->db_path);
                memset(&idx->stats, 0, sizeof(idx->stats));
                r = open_checked(idx, &fresh);
        }
        if (r < 0)
                goto fail;
        if (fresh && reason == KIDX_NO_REBUILD)
                reason = KIDX_REBUILD_NEW;
        r = prepare_all(idx);
        if (r < 0)
                goto fail;
        load_counters(idx);

        struct stat root;
        if (fstat(opts->backing_fd, &root) < 0) {
                r = -errno;
                goto fail;
        }
        idx->root_ino = root.st_ino;
        if (reason == KIDX_NO_REBUILD) {
                if (meta_or(idx->db, "root_ino", -1) != (int64_t)root.st_ino) {
                        reason = KIDX_REBUILD_MOVED;
                        r = kidx__exec(idx->db, "DELETE FROM files; DELETE FROM dents;");
                        if (r < 0)
                                goto fail;
                        r = kidx__load_sizes(idx);
                        if (r < 0)
                                goto fail;
                } else if (meta_or(idx->db, "clean", 0) != 1) {
                        reason = KIDX_REBUILD_UNCLEAN;
                } else if (opts->force_rebuild) {
                        reason = KIDX_REBUILD_FORCED;
                }
        }
        if (reason != KIDX_NO_REBUILD) {
                r = kidx__rebuild(idx, opts->backing_fd, opts->skip_name, opts->progress);
                if (r < 0)
                        goto fail;
                r = kidx__set_meta(idx, "root_ino", (int64_t)root.st_ino);
                if (r < 0)
                        goto fail;
        }
        if (ret_reason)
                *ret_reason = reason;
        *ret = idx;
        return 0;
fail:
        kidx_close(idx, false);
        return r;
}

int kidx_mark_dirty(kidx *idx)
{
        pthread_mutex_lock(&idx->db_lock);
        int r = kidx__set_meta(idx, "clean", 0);
        pthread_mutex_unlock(&idx->db_lock);
        return r;
}

static void free_batch(struct kidx__op *ops, size_t n, kmap *touches)
{
        for (size_t i = 0; i < n; i++) {
                free(ops[i].s1);
                free(ops[i].s2);
        }
        free(ops);
        uint64_t k;
        void *v;
        for (size_t pos = 0; kmap_next(touches, &pos, &k, &v);)
                free(v);
        kmap_free(touches);
}

static int step_reset(sqlite3_stmt *st)
{
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        return kidx__errno(rc);
}

static int apply_op(kidx *idx, const struct kidx__op *op)
{
        sqlite3_stmt *st;
        int r;
        switch (op->kind) {
        case OP_ADD_DENT:
                st = idx->st[ST_ADD_DENT];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                sqlite3_bind_text(st, 2, op->s1, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, (int64_t)op->b);
                sqlite3_bind_int64(st, 4, (int64_t)op->c);
                return step_reset(st);
        case OP_DEL_DENT:
                st = idx->st[ST_DEL_DENT];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                sqlite3_bind_text(st, 2, op->s1, -1, SQLITE_STATIC);
                return step_reset(st);
        case OP_DEL_DENT_INO:
                st = idx->st[ST_DEL_DENT_INO];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                sqlite3_bind_text(st, 2, op->s1, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, (int64_t)op->b);
                return step_reset(st);
        case OP_RENAME:
                /* Whatever the target name held is gone (the caller logged its deletion). */
                st = idx->st[ST_DEL_DENT];
                sqlite3_bind_int64(st, 1, (int64_t)op->b);
                sqlite3_bind_text(st, 2, op->s2, -1, SQLITE_STATIC);
                if ((r = step_reset(st)) < 0)
                        return r;
                st = idx->st[ST_RENAME];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                sqlite3_bind_text(st, 2, op->s1, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 3, (int64_t)op->b);
                sqlite3_bind_text(st, 4, op->s2, -1, SQLITE_STATIC);
                return step_reset(st);
        case OP_EXCHANGE: {
                /* Swap through a name no file can have (NUL-free but with a '/'). */
                static const char tmp[] = "/kcachefs-exchange";
                struct kidx__op a = { OP_RENAME, op->a, op->b, 0, 0, op->s1, (char *)tmp };
                struct kidx__op b = { OP_RENAME, op->b, op->a, 0, 0, op->s2, op->s1 };
                struct kidx__op c = { OP_RENAME, op->b, op->b, 0, 0, (char *)tmp, op->s2 };
                if ((r = apply_op(idx, &a)) < 0 || (r = apply_op(idx, &b)) < 0)
                        return r;
                return apply_op(idx, &c);
        }
        case OP_DEL_FILE:
                st = idx->st[ST_DEL_FILE];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                return step_reset(st);
        case OP_EVICTED:
                st = idx->st[ST_DEL_FILE];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                if ((r = step_reset(st)) < 0)
                        return r;
                st = idx->st[ST_DEL_DENTS_OF];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                if ((r = step_reset(st)) < 0)
                        return r;
                st = idx->st[ST_LOG_EVICTION];
                sqlite3_bind_int64(st, 1, op->t);
                sqlite3_bind_int64(st, 2, (int64_t)op->a);
                sqlite3_bind_int64(st, 3, (int64_t)op->b);
                sqlite3_bind_text(st, 4, op->s1 ? op->s1 : "", -1, SQLITE_STATIC);
                if ((r = step_reset(st)) < 0)
                        return r;
                __attribute__((fallthrough)); /* the intent is fulfilled */
        case OP_EVICT_CANCEL:
                st = idx->st[ST_INTENT_DEL];
                sqlite3_bind_int64(st, 1, (int64_t)op->a);
                return step_reset(st);
        }
        return -EINVAL;
}

static int apply_touch(kidx *idx, uint64_t ino, const struct kidx__touch *t)
{
        sqlite3_stmt *st;
        if (t->added) {
                st = idx->st[ST_ADD_FILE];
                sqlite3_bind_int64(st, 1, (int64_t)ino);
                sqlite3_bind_int64(st, 2, t->bytes < 0 ? 0 : t->bytes);
                sqlite3_bind_int64(st, 3, (int64_t)t->seq);
                sqlite3_bind_int64(st, 4, t->atime_ns);
                sqlite3_bind_int64(st, 5, t->opens);
                sqlite3_bind_int64(st, 6, (int64_t)t->bytes_read);
                sqlite3_bind_int64(st, 7, t->pinned > 0);
                sqlite3_bind_int64(st, 8, t->uid);
                return step_reset(st);
        }
        st = idx->st[ST_TOUCH];
        sqlite3_bind_int64(st, 1, (int64_t)t->seq);
        if (t->has_atime)
                sqlite3_bind_int64(st, 2, t->atime_ns);
        sqlite3_bind_int64(st, 3, t->opens);
        sqlite3_bind_int64(st, 4, (int64_t)t->bytes_read);
        if (t->bytes >= 0)
                sqlite3_bind_int64(st, 5, t->bytes);
        if (t->pinned >= 0)
                sqlite3_bind_int64(st, 6, t->pinned);
        sqlite3_bind_int64(st, 7, (int64_t)ino);
        return step_reset(st);
}

int kidx_evict_intents(kidx *idx, size_t n, const struct kidx_intent *v, int64_t now_ns)
{
        if (!n)
                return 0;
        pthread_mutex_lock(&idx->db_lock);
        int r = kidx__exec(idx->db, "BEGIN IMMEDIATE");
        sqlite3_stmt *st = idx->st[ST_INTENT_ADD];
        for (size_t i = 0; i < n && r == 0; i++) {
                sqlite3_bind_int64(st, 1, (int64_t)v[i].ino);
                sqlite3_bind_int64(st, 2, (int64_t)v[i].bytes);
                sqlite3_bind_text(st, 3, v[i].name ? v[i].name : "", -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 4, now_ns);
                r = step_reset(st);
        }
        r = kidx__exec(idx->db, r == 0 ? "COMMIT" : "ROLLBACK") ?: r;
        pthread_mutex_unlock(&idx->db_lock);
        return r;
}

int kidx_flush(kidx *idx)
{
        pthread_mutex_lock(&idx->db_lock);
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__op *ops = idx->ops;
        size_t nops = idx->nops;
        kmap touches = idx->touches;
        struct kidx_stats stats = idx->stats;
        idx->ops = NULL;
        idx->nops = idx->cap_ops = 0;
        kmap_init(&idx->touches);
        /* Until the commit, the sizes this batch gives its rows are read from here (I3). */
        idx->sizes_flushing = idx->sizes;
        kmap_init(&idx->sizes);
        pthread_mutex_unlock(&idx->batch_lock);

        int r = 0;
        if (nops == 0 && touches.count == 0) /* counters only move with ops or touches */
                goto out;
        r = kidx__exec(idx->db, "BEGIN IMMEDIATE");
        if (r < 0)
                goto out;
        for (size_t i = 0; i < nops && r == 0; i++)
                r = apply_op(idx, &ops[i]);
        uint64_t k;
        void *v;
        for (size_t pos = 0; r == 0 && kmap_next(&touches, &pos, &k, &v);)
                r = apply_touch(idx, k, v);
        if (r == 0)
                r = kidx__set_meta(idx, "seq", (int64_t)stats.seq);
        if (r == 0)
                r = kidx__set_meta(idx, "opens", (int64_t)stats.opens);
        if (r == 0)
                r = kidx__set_meta(idx, "bytes_read", (int64_t)stats.bytes_read);
        if (r == 0)
                r = kidx__set_meta(idx, "evicted_files", (int64_t)stats.evicted_files);
        if (r == 0)
                r = kidx__set_meta(idx, "evicted_bytes", (int64_t)stats.evicted_bytes);
        if (r == 0 && stats.evicted_files > 0) {
                char sql[128];
                snprintf(sql, sizeof(sql), "DELETE FROM evictions WHERE id <= (SELECT max(id) FROM evictions) - %d",
                         EVICTION_LOG_ROWS);
                r = kidx__exec(idx->db, sql);
        }
        if (r == 0)
                r = kidx__exec(idx->db, "COMMIT");
        if (r < 0) {
                /* The batch is lost; the index stays marked dirty (I1), so the next mount reconciles. */
                kidx__exec(idx->db, "ROLLBACK");
                fprintf(stderr, "kcachefs: index: flush failed: %s\n", strerror(-r));
        }
out:
        pthread_mutex_lock(&idx->batch_lock);
        if (r == 0) {
                idx->stats.flushes++;
        } else {
                /* The rows stay as they were, but the totals count the lost batch: keep the sizes it gave
                 * (those of a later batch win), so that the totals stay the sum of the sizes known. */
                uint64_t ino;
                void *size;
                for (size_t pos = 0; kmap_next(&idx->sizes_flushing, &pos, &ino, &size);)
                        if (!kmap_get(&idx->sizes, ino))
                                (void)kmap_put(&idx->sizes, ino, size);
        }
        kmap_free(&idx->sizes_flushing);
        kmap_init(&idx->sizes_flushing);
        idx->flush_gen++;
        pthread_mutex_unlock(&idx->batch_lock);
        pthread_mutex_unlock(&idx->db_lock);
        free_batch(ops, nops, &touches);
        return r;
}

/* WAL checkpoints. SQLite's own (every 1000 pages of WAL) run inside whichever commit crosses the mark,
 * and with synchronous=NORMAL a checkpoint syncs the WAL and the database: 5-6 ms here, added to that
 * commit. When the commit is an eviction's flush inside a write, a writer waits for it (the worst 64 KiB
 * publication in bench/big). So once the writer thread runs, checkpoints are its job alone, on a
 * connection of its own and without db_lock; commits on the request path go on meanwhile.
 *
 * What must stay true: the WAL stays small (I5). A churning cache commits many times a second (every
 * eviction commits its intents, then its batch): about 55 KB of WAL per file stored, so a checkpoint once
 * per flush interval is not enough. The write connection's commit hook counts WAL pages and wakes the
 * writer thread as soon as CKPT_PAGES have been appended; the writer checkpoints at once.
 *
 *  I5. The WAL restarts from its start at the first commit after a checkpoint that copied every frame
 *      (SQLite does this by itself when no reader still uses the WAL), and journal_size_limit truncates
 *      the file then. A PASSIVE checkpoint cannot copy frames a reader's snapshot still needs; when the
 *      WAL has passed CKPT_FORCE_PAGES anyway (a reader held a transaction across several checkpoints),
 *      the writer asks for TRUNCATE, which waits for readers up to CKPT_WAIT_MS: commits on the request
 *      path wait for that as long, at most, and then go on. If the reader still holds on, the next forced
 *      try waits for another CKPT_FORCE_PAGES of WAL, so that a stuck reader costs the writers 200 ms per
 *      32 MiB at worst. Only a reader can pin the WAL: kcache holds none longer than one command.
 *
 * Beware: a connection that never read the database is not in WAL mode yet, and checkpointing it is a
 * silent no-op (SQLITE_OK, nothing copied). The checkpointer reads the schema once before its first
 * checkpoint; without that, no checkpoint ever ran and the WAL grew without bound. kidx_close folds the
 * whole WAL in (TRUNCATE). */
#define CKPT_PAGES 1024        /* 4 MiB of 4 KiB pages: wake the checkpointer */
#define CKPT_FORCE_PAGES 8192  /* 32 MiB: a PASSIVE checkpoint was not enough, force a restart */
#define CKPT_WAIT_MS 200

static int wal_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
        (void)db;
        (void)name;
        kidx *idx = arg;
        if (pages >= CKPT_PAGES && !atomic_exchange(&idx->ckpt_wanted, true)) {
                pthread_mutex_lock(&idx->batch_lock);
                pthread_cond_signal(&idx->writer_cond);
                pthread_mutex_unlock(&idx->batch_lock);
        }
        return SQLITE_OK;
}

static void checkpoint(kidx *idx, sqlite3 *ck)
{
        if (!ck)
                return;
        atomic_store(&idx->ckpt_wanted, false);
        int log = 0, done = 0;
        int rc = sqlite3_wal_checkpoint_v2(ck, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        if (rc == SQLITE_OK && (log < CKPT_FORCE_PAGES || done == log))
                return;
        if (log < idx->ckpt_force_at)
                return; /* the last forced one failed: the reader gets another CKPT_FORCE_PAGES first */
        /* A reader pinned the log: wait for it, bounded, then restart the WAL from its start. */
        sqlite3_busy_timeout(ck, CKPT_WAIT_MS);
        rc = sqlite3_wal_checkpoint_v2(ck, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
        sqlite3_busy_timeout(ck, 0);
        if (rc == SQLITE_OK) {
                idx->ckpt_force_at = 0;
        } else {
                idx->ckpt_force_at = log + CKPT_FORCE_PAGES;
                atomic_fetch_add(&idx->ckpt_failures, 1);
        }
}

/* The checkpointer's own connection, in WAL mode (see above), or NULL if it cannot be had: SQLite's own
 * checkpoints then stay on. */
static sqlite3 *checkpointer_open(kidx *idx)
{
        sqlite3 *ck = NULL;
        if (open_conn(idx->db_path, SQLITE_OPEN_READWRITE, &ck) < 0)
                return NULL;
        sqlite3_busy_timeout(ck, 0);
        if (kidx__exec(ck, "PRAGMA journal_size_limit=" KIDX_WAL_KEEP_STR "; SELECT count(*) FROM meta") < 0) {
                sqlite3_close(ck);
                return NULL;
        }
        pthread_mutex_lock(&idx->db_lock);
        bool ok = kidx__exec(idx->db, "PRAGMA wal_autocheckpoint=0") == 0;
        if (ok)
                sqlite3_wal_hook(idx->db, wal_hook, idx);
        pthread_mutex_unlock(&idx->db_lock);
        if (!ok) {
                sqlite3_close(ck);
                return NULL;
        }
        return ck;
}

static void *writer_main(void *arg)
{
        kidx *idx = arg;
        sqlite3 *ck = checkpointer_open(idx);
        pthread_mutex_lock(&idx->batch_lock);
        while (!idx->writer_stop) {
                if (!atomic_load(&idx->ckpt_wanted)) {
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_sec += idx->interval_ms / 1000;
                        ts.tv_nsec += (long)(idx->interval_ms % 1000) * 1000000L;
                        if (ts.tv_nsec >= 1000000000L) {
                                ts.tv_sec++;
                                ts.tv_nsec -= 1000000000L;
                        }
                        pthread_cond_timedwait(&idx->writer_cond, &idx->batch_lock, &ts);
                }
                if (idx->writer_stop)
                        break;
                pthread_mutex_unlock(&idx->batch_lock);
                kidx_flush(idx);
                checkpoint(idx, ck);
                pthread_mutex_lock(&idx->batch_lock);
        }
        pthread_mutex_unlock(&idx->batch_lock);
        if (ck) {
                pthread_mutex_lock(&idx->db_lock);
                sqlite3_wal_hook(idx->db, NULL, NULL);
                pthread_mutex_unlock(&idx->db_lock);
        }
        sqlite3_close(ck);
        return NULL;
}

int kidx_start_writer(kidx *idx, unsigned interval_ms)
{
        idx->interval_ms = interval_ms ? interval_ms : 1000;
        int r = -pthread_create(&idx->writer, NULL, writer_main, idx);
        if (r == 0)
                idx->writer_running = true;
        return r;
}

void kidx_close(kidx *idx, bool clean)
{
        if (!idx)
                return;
        if (idx->writer_running) {
                pthread_mutex_lock(&idx->batch_lock);
                idx->writer_stop = true;
                pthread_cond_signal(&idx->writer_cond);
                pthread_mutex_unlock(&idx->batch_lock);
                pthread_join(idx->writer, NULL);
        }
        if (idx->db) {
                int r = kidx_flush(idx);
                if (clean && r == 0) {
                        pthread_mutex_lock(&idx->db_lock);
                        kidx__set_meta(idx, "clean", 1);
                        /* Fold the WAL into the database so the next open reads one file. */
                        sqlite3_wal_checkpoint_v2(idx->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
                        pthread_mutex_unlock(&idx->db_lock);
                }
        }
        close_conns(idx);
        free_batch(idx->ops, idx->nops, &idx->touches);
        kmap_free(&idx->sizes);
        kmap_free(&idx->sizes_flushing);
        pthread_mutex_destroy(&idx->db_lock);
        pthread_mutex_destroy(&idx->rd_lock);
        pthread_mutex_destroy(&idx->batch_lock);
        pthread_cond_destroy(&idx->writer_cond);
        free(idx->db_path);
        free(idx);
}

const char *kidx_rebuild_reason_str(enum kidx_rebuild_reason r)
{
        switch (r) {
        case KIDX_NO_REBUILD:
                return "index is current";
        case KIDX_REBUILD_NEW:
                return "new index";
        case KIDX_REBUILD_UNCLEAN:
                return "the last daemon did not stop cleanly";
        case KIDX_REBUILD_CORRUPT:
                return "the index was corrupt (moved aside to .corrupt)";
        case KIDX_REBUILD_SCHEMA:
                return "the index has an unknown schema (moved aside to .corrupt)";
        case KIDX_REBUILD_MOVED:
                return "the index described another backing directory";
        case KIDX_REBUILD_FORCED:
                return "rebuild requested";
        }
        return "?";
}
