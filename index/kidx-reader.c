/* kidx-reader.c: read-only access to an index, for tools such as kcache.
 *
 * Opens the database read-only in WAL mode, so a reader never blocks the daemon's writer (and the
 * daemon never blocks it). Paths are rebuilt from the dents table with a recursive query, so a listing
 * is one statement however deep the tree; a comparison with the tree (kidx_reader_names) uses no path at
 * all, only (directory inode, name), and a path is spelled only for a report (kidx_reader_path), of any
 * length. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kidx-internal.h"

struct kidx_reader {
        sqlite3 *db;
};

int kidx_reader_open(const char *db_path, kidx_reader **ret)
{
        kidx_reader *r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        int rc = sqlite3_open_v2(db_path, &r->db, SQLITE_OPEN_READONLY, NULL);
        if (rc == SQLITE_OK) {
                sqlite3_busy_timeout(r->db, 5000);
                rc = sqlite3_exec(r->db, "SELECT 1 FROM meta LIMIT 1", NULL, NULL, NULL);
        }
        if (rc != SQLITE_OK) {
                int e = kidx__errno(rc);
                kidx_reader_close(r);
                return e;
        }
        *ret = r;
        return 0;
}

void kidx_reader_close(kidx_reader *r)
{
        if (!r)
                return;
        sqlite3_close(r->db);
        free(r);
}

/* Every name of a regular file with its full path. */
#define PATHS_CTE                                                                                   \
        "WITH RECURSIVE root(ino) AS (SELECT v FROM meta WHERE k = 'root_ino'),"                    \
        " dirs(ino, path) AS (SELECT ino, '' FROM root"                                             \
        "  UNION ALL SELECT d.ino, CASE WHEN dirs.path = '' THEN d.name ELSE dirs.path || '/' || d.name END" \
        "  FROM dents d JOIN dirs ON d.dir = dirs.ino WHERE d.type = 2),"                           \
        " paths(ino, path) AS (SELECT d.ino, CASE WHEN dirs.path = '' THEN d.name"                  \
        "  ELSE dirs.path || '/' || d.name END FROM dents d JOIN dirs ON d.dir = dirs.ino WHERE d.type = 1) "

int kidx_reader_list(kidx_reader *r, bool mru, uint64_t limit, const char *prefix,
                     int (*fn)(void *ud, const struct kidx_entry *e), void *ud)
{
        char sql[2048];
        snprintf(sql, sizeof(sql),
                 PATHS_CTE "SELECT p.path, f.ino, f.bytes, f.seq, f.opens, f.bytes_read, f.atime_ns, f.pinned, f.uid"
                           " FROM paths p JOIN files f ON f.ino = p.ino"
                           " WHERE ?1 = '' OR p.path = ?1 OR substr(p.path, 1, length(?1) + 1) = ?1 || '/'"
                           " ORDER BY f.seq %s LIMIT ?2",
                 mru ? "DESC" : "ASC");
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(r->db, sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        sqlite3_bind_text(st, 1, prefix ? prefix : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, limit ? (int64_t)limit : -1);
        int n = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                struct kidx_entry e = {
                        .path = (const char *)sqlite3_column_text(st, 0),
                        .ino = (uint64_t)sqlite3_column_int64(st, 1),
                        .bytes = (uint64_t)sqlite3_column_int64(st, 2),
                        .seq = (uint64_t)sqlite3_column_int64(st, 3),
                        .opens = (uint64_t)sqlite3_column_int64(st, 4),
                        .bytes_read = (uint64_t)sqlite3_column_int64(st, 5),
                        .atime_ns = sqlite3_column_int64(st, 6),
                        .pinned = sqlite3_column_int64(st, 7) != 0,
                        .uid = (uint32_t)sqlite3_column_int64(st, 8),
                };
                n++;
                if (fn(ud, &e))
                        break;
        }
        int res = rc == SQLITE_ROW || rc == SQLITE_DONE ? n : kidx__errno(rc);
        sqlite3_finalize(st);
        return res;
}

int kidx_reader_users(kidx_reader *r, void (*fn)(void *ud, uint32_t uid, uint64_t files, uint64_t bytes), void *ud)
{
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(r->db, "SELECT uid, count(*), total(bytes) FROM files GROUP BY uid ORDER BY uid",
                                    -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW)
                fn(ud, (uint32_t)sqlite3_column_int64(st, 0), (uint64_t)sqlite3_column_int64(st, 1),
                   (uint64_t)sqlite3_column_double(st, 2));
        int res = rc == SQLITE_DONE ? 0 : kidx__errno(rc);
        sqlite3_finalize(st);
        return res;
}

/* The directories reachable from the root (UNION, not UNION ALL: a cycle a corrupt dents table might hold
 * ends). Inode numbers only: no path is ever built, so no depth is too deep. */
#define DIRS_CTE                                                                                    \
        "WITH RECURSIVE dirs(ino) AS (SELECT v FROM meta WHERE k = 'root_ino'"                       \
        "  UNION SELECT d.ino FROM dents d JOIN dirs ON d.dir = dirs.ino WHERE d.type = 2) "

int kidx_reader_names(kidx_reader *r,
                      void (*fn)(void *ud, uint64_t dir, const char *name, uint64_t ino, uint64_t bytes), void *ud)
{
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(r->db, DIRS_CTE "SELECT d.dir, d.name, f.ino, f.bytes FROM dents d"
                                                    " JOIN dirs ON d.dir = dirs.ino JOIN files f ON f.ino = d.ino"
                                                    " WHERE d.type = 1", -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW)
                fn(ud, (uint64_t)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
                   (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3));
        int res = rc == SQLITE_DONE ? 0 : kidx__errno(rc);
        sqlite3_finalize(st);
        return res;
}

int kidx_reader_path(kidx_reader *r, uint64_t dir, const char *name, char **ret)
{
        /* Up from dir to the root, one directory's name at a time; the depth bound ends a cycle. */
        static const char *const sql =
                "WITH RECURSIVE root(ino) AS (SELECT v FROM meta WHERE k = 'root_ino'),"
                " up(ino, path, depth) AS (SELECT ?1, ?2, 0"
                "  UNION ALL SELECT d.dir, d.name || '/' || up.path, up.depth + 1 FROM dents d JOIN up"
                "  ON d.ino = up.ino WHERE d.type = 2 AND up.ino != (SELECT ino FROM root) AND up.depth < 1000000)"
                " SELECT path FROM up WHERE ino = (SELECT ino FROM root) LIMIT 1";
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(r->db, sql, -1, &st, NULL);
        if (rc != SQLITE_OK)
                return kidx__errno(rc);
        sqlite3_bind_int64(st, 1, (int64_t)dir);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        int res;
        if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                const char *p = (const char *)sqlite3_column_text(st, 0);
                res = p && (*ret = strdup(p)) ? 0 : -ENOMEM;
        } else {
                res = rc == SQLITE_DONE ? -ENOENT : kidx__errno(rc);
        }
        sqlite3_finalize(st);
        return res;
}
