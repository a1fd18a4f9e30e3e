/* kidx-sql.c: what the other files of index/ share of SQLite: errors as -errno, statements run whole, the
 * meta table, opening a connection, and the totals read from the files table (I3). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kidx-internal.h"

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

int kidx__get_meta(sqlite3 *db, const char *k, int64_t *ret)
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

int64_t kidx__meta_or(sqlite3 *db, const char *k, int64_t dflt)
{
        int64_t v;
        return kidx__get_meta(db, k, &v) == 0 ? v : dflt;
}

int kidx__open_conn(const char *path, int flags, sqlite3 **ret)
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
