/* kidx-rebuild.c: reconcile the index with the backing directory, which is the truth.
 *
 * Runs at open when the index is new, corrupt, of another schema or root, or the last daemon did not stop
 * cleanly (kidx.c, I1/I2). One transaction:
 *   1. walk the tree with openat()/fstatat() (no path strings), writing every name to dents and every
 *      regular file to a temporary scan table (hard links once);
 *   2. drop rows of files that no longer exist, refresh sizes and owners of the rest from the scan;
 *   3. add files the index did not know, with their mtime as their last access;
 *   4. renumber seq by (atime, old seq), so known and new files interleave by time and the LRU order is
 *      one total order again.
 * Known files keep their recency and counters. The walk never follows symlinks and stays on the backing
 * root's filesystem. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kidx-internal.h"

struct walk {
        kidx *idx;
        sqlite3_stmt *dent, *file;
        dev_t dev;
        uint64_t nfiles, ndirs;
        bool progress;
        const char *skip_name; /* in the root only */
};

static enum kidx_type type_of(mode_t m)
{
        return S_ISREG(m) ? KIDX_REG : S_ISDIR(m) ? KIDX_DIR : S_ISLNK(m) ? KIDX_LNK : KIDX_OTHER;
}

static void show_progress(struct walk *w, bool last)
{
        if (!w->progress)
                return;
        if (!last && (w->nfiles + w->ndirs) % 8192 != 0)
                return;
        fprintf(stderr, "\rkcachefs: rebuilding index: %llu files, %llu directories%s",
                (unsigned long long)w->nfiles, (unsigned long long)w->ndirs, last ? "\n" : "");
}

static int walk_dir(struct walk *w, int dfd, uint64_t dir_ino, int depth)
{
        if (depth > 256)
                return -ELOOP;
        DIR *d = fdopendir(dfd);
        if (!d) {
                int r = -errno;
                close(dfd);
                return r;
        }
        int r = 0;
        struct dirent *de;
        while (r == 0 && (errno = 0, de = readdir(d))) {
                const char *name = de->d_name;
                if (!strcmp(name, ".") || !strcmp(name, ".."))
                        continue;
                if (depth == 0 && w->skip_name && !strcmp(name, w->skip_name))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                        if (errno == ENOENT)
                                continue; /* raced with a removal */
                        r = -errno;
                        break;
                }
                if (st.st_dev != w->dev)
                        continue; /* another filesystem mounted inside: not part of the cache */
                enum kidx_type t = type_of(st.st_mode);
                sqlite3_bind_int64(w->dent, 1, (int64_t)dir_ino);
                sqlite3_bind_text(w->dent, 2, name, -1, SQLITE_STATIC);
                sqlite3_bind_int64(w->dent, 3, (int64_t)st.st_ino);
                sqlite3_bind_int64(w->dent, 4, t);
                int rc = sqlite3_step(w->dent);
                sqlite3_reset(w->dent);
                if ((r = kidx__errno(rc)) < 0)
                        break;
                if (t == KIDX_REG) {
                        sqlite3_bind_int64(w->file, 1, (int64_t)st.st_ino);
                        sqlite3_bind_int64(w->file, 2, (int64_t)st.st_blocks * 512);
                        sqlite3_bind_int64(w->file, 3, (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
                        sqlite3_bind_int64(w->file, 4, st.st_uid);
                        rc = sqlite3_step(w->file);
                        sqlite3_reset(w->file);
                        if ((r = kidx__errno(rc)) < 0)
                                break;
                        w->nfiles++;
                        show_progress(w, false);
                } else if (t == KIDX_DIR) {
                        w->ndirs++;
                        show_progress(w, false);
                        int cfd = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (cfd < 0) {
                                if (errno == ENOENT)
                                        continue;
                                r = -errno;
                                break;
                        }
                        r = walk_dir(w, cfd, st.st_ino, depth + 1);
                }
        }
        if (r == 0 && errno != 0 && !de)
                r = -errno;
        closedir(d);
        return r;
}

static const char *const RECONCILE =
        "DELETE FROM files WHERE ino NOT IN (SELECT ino FROM temp.scan);"
        "UPDATE files SET bytes = s.bytes, uid = s.uid FROM temp.scan AS s WHERE s.ino = files.ino;"
        "INSERT INTO files(ino, bytes, seq, atime_ns, opens, bytes_read, pinned, uid)"
        "  SELECT ino, bytes, 0, mtime_ns, 0, 0, 0, uid FROM temp.scan"
        "  WHERE ino NOT IN (SELECT ino FROM files);"
        "DROP INDEX IF EXISTS files_lru;"
        "CREATE TEMP TABLE ord(ino INTEGER PRIMARY KEY, rn INTEGER NOT NULL);"
        "INSERT INTO temp.ord SELECT ino, row_number() OVER (ORDER BY atime_ns, seq, ino) FROM files;"
        "UPDATE files SET seq = o.rn FROM temp.ord AS o WHERE o.ino = files.ino;"
        "CREATE INDEX files_lru ON files(seq) WHERE pinned = 0;"
        "DROP TABLE temp.ord; DROP TABLE temp.scan;";

int kidx_reconcile(kidx *idx, int backing_fd, const char *skip_name)
{
        int r = kidx_flush(idx);
        return r < 0 ? r : kidx__rebuild(idx, backing_fd, skip_name, false);
}

int kidx__rebuild(kidx *idx, int backing_fd, const char *skip_name, bool progress)
{
        struct stat root;
        if (fstat(backing_fd, &root) < 0)
                return -errno;
        struct walk w = { .idx = idx, .dev = root.st_dev, .progress = progress, .skip_name = skip_name };
        sqlite3 *db = idx->db;

        pthread_mutex_lock(&idx->db_lock);
        int r = kidx__exec(db, "BEGIN IMMEDIATE; DELETE FROM dents;"
                               "CREATE TEMP TABLE scan(ino INTEGER PRIMARY KEY, bytes INTEGER NOT NULL,"
                               " mtime_ns INTEGER NOT NULL, uid INTEGER NOT NULL);");
        if (r < 0)
                goto out;
        int rc = sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO dents(dir, name, ino, type) VALUES (?1, ?2, ?3, ?4)",
                                    -1, &w.dent, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO temp.scan(ino, bytes, mtime_ns, uid)"
                                        " VALUES (?1, ?2, ?3, ?4)", -1, &w.file, NULL);
        if ((r = kidx__errno(rc)) < 0)
                goto rollback;

        int dfd = openat(backing_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                r = -errno;
                goto rollback;
        }
        r = walk_dir(&w, dfd, root.st_ino, 0);
        show_progress(&w, true);
        if (r < 0)
                goto rollback;
        sqlite3_finalize(w.dent);
        sqlite3_finalize(w.file);
        w.dent = w.file = NULL;
        /* Evictions under way when the last daemon died: logged if their file is gone (the write-ahead
         * intents of kidx_evict_intents). */
        sqlite3_stmt *is;
        rc = sqlite3_prepare_v2(db, "SELECT count(*), total(bytes) FROM evict_intents"
                                    " WHERE ino NOT IN (SELECT ino FROM temp.scan)", -1, &is, NULL);
        if (rc == SQLITE_OK && (rc = sqlite3_step(is)) == SQLITE_ROW) {
                idx->stats.evicted_files += (uint64_t)sqlite3_column_int64(is, 0);
                idx->stats.evicted_bytes += (uint64_t)sqlite3_column_double(is, 1);
                rc = SQLITE_OK;
        }
        sqlite3_finalize(is);
        if ((r = kidx__errno(rc)) < 0)
                goto rollback;
        r = kidx__exec(db, "INSERT INTO evictions(time_ns, ino, bytes, name) SELECT time_ns, ino, bytes, name"
                           " FROM evict_intents WHERE ino NOT IN (SELECT ino FROM temp.scan);"
                           "DELETE FROM evict_intents;");
        if (r < 0)
                goto rollback;
        r = kidx__exec(db, RECONCILE);
        if (r < 0)
                goto rollback;

        sqlite3_stmt *st;
        rc = sqlite3_prepare_v2(db, "SELECT max(seq) FROM files", -1, &st, NULL);
        if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                uint64_t seq = (uint64_t)sqlite3_column_int64(st, 0);
                pthread_mutex_lock(&idx->batch_lock);
                if (seq > idx->stats.seq)
                        idx->stats.seq = seq;
                pthread_mutex_unlock(&idx->batch_lock);
                rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
        if ((r = kidx__errno(rc)) < 0 || (r = kidx__load_sizes(idx)) < 0)
                goto rollback;
        idx->stats.rebuilds++;
        if ((r = kidx__set_meta(idx, "seq", (int64_t)idx->stats.seq)) < 0 ||
            (r = kidx__set_meta(idx, "rebuilds", (int64_t)idx->stats.rebuilds)) < 0 ||
            (r = kidx__set_meta(idx, "evicted_files", (int64_t)idx->stats.evicted_files)) < 0 ||
            (r = kidx__set_meta(idx, "evicted_bytes", (int64_t)idx->stats.evicted_bytes)) < 0)
                goto rollback;
        r = kidx__exec(db, "COMMIT");
        if (r == 0)
                goto out;
rollback:
        sqlite3_finalize(w.dent);
        sqlite3_finalize(w.file);
        kidx__exec(db, "ROLLBACK");
out:
        pthread_mutex_unlock(&idx->db_lock);
        return r;
}
