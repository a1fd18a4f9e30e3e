/* kidx.c: opening, validating and closing the index (the flush and the writer thread: kidx-flush.c;
 * SQLite helpers and the totals: kidx-sql.c; the reconcile with the tree: kidx-rebuild.c).
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
        /* the LRU batch with its names: the ORDER BY sorts a batch's rows in memory */
        [ST_LRU_NAMES] = "SELECT f.ino, f.seq, f.bytes, f.atime_ns, d.dir, d.name FROM (SELECT ino, seq, bytes, atime_ns"
                         " FROM files WHERE pinned = 0 AND seq > ?1 ORDER BY seq LIMIT ?2) AS f"
                         " LEFT JOIN dents AS d ON d.ino = f.ino ORDER BY f.seq",
        [ST_NAMES] = "SELECT dir, name FROM dents WHERE ino = ?1",
        [ST_PARENT] = "SELECT dir, name FROM dents WHERE ino = ?1 AND type = 2 LIMIT 1",
        [ST_INTENT_ADD] = "INSERT OR REPLACE INTO evict_intents(ino, bytes, name, time_ns) VALUES (?1, ?2, ?3, ?4)",
        [ST_INTENT_DEL] = "DELETE FROM evict_intents WHERE ino = ?1",
};


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
        int r = kidx__open_conn(idx->db_path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &idx->db);
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


static int prepare_all(kidx *idx)
{
        for (int i = 0; i < ST__COUNT; i++) {
                int rc = sqlite3_prepare_v3(idx->db, STMT_SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &idx->st[i], NULL);
                if (rc != SQLITE_OK)
                        return kidx__errno(rc);
        }
        int r = kidx__open_conn(idx->db_path, SQLITE_OPEN_READONLY, &idx->rd);
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
        int64_t seq = kidx__meta_or(idx->db, "seq", 0);
        if ((uint64_t)seq > idx->stats.seq)
                idx->stats.seq = (uint64_t)seq;
        idx->stats.opens = (uint64_t)kidx__meta_or(idx->db, "opens", 0);
        idx->stats.bytes_read = (uint64_t)kidx__meta_or(idx->db, "bytes_read", 0);
        idx->stats.evicted_files = (uint64_t)kidx__meta_or(idx->db, "evicted_files", 0);
        idx->stats.evicted_bytes = (uint64_t)kidx__meta_or(idx->db, "evicted_bytes", 0);
        idx->stats.rebuilds = (uint64_t)kidx__meta_or(idx->db, "rebuilds", 0);
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
                if (kidx__meta_or(idx->db, "root_ino", -1) != (int64_t)root.st_ino) {
                        reason = KIDX_REBUILD_MOVED;
                        r = kidx__exec(idx->db, "DELETE FROM files; DELETE FROM dents;");
                        if (r < 0)
                                goto fail;
                        r = kidx__load_sizes(idx);
                        if (r < 0)
                                goto fail;
                } else if (kidx__meta_or(idx->db, "clean", 0) != 1) {
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

void kidx_close(kidx *idx, bool clean)
{
        if (!idx)
                return;
        kidx__stop_writer(idx);
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
        kidx__free_batch(idx->ops, idx->nops, &idx->touches);
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

