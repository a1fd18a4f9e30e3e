/* kidx-rebuild.c: reconcile the index with the backing directory, which is the truth.
 *
 * Runs at open when the index is new, corrupt, of another schema or root, or the last daemon did not stop
 * cleanly (kidx.c, I1/I2). One transaction:
 *   1. walk the tree with tree.h's descriptors and fstatat() (no path strings), writing every name to
 *      dents and every regular file to a temporary scan table (hard links once), with whether it carries
 *      the pin attribute KIDX_PIN_XATTR;
 *   2. drop rows of files that no longer exist, refresh sizes and owners of the rest from the scan, and
 *      pin those the attribute says are pinned;
 *   3. add files the index did not know, with their mtime as their last access, pinned if the attribute
 *      says so;
 *   4. renumber seq by (atime, old seq), so known and new files interleave by time and the LRU order is
 *      one total order again.
 * Known files keep their recency and counters. The walk never follows symlinks and stays on the backing
 * root's filesystem (tree.h, R1-R3).
 *
 * DEPTH. The walk holds a descriptor per level, so it holds at most WALK_DEPTH at once: a directory below
 * that is noted (its inode) and walked afterwards from the root again, through the names the walk has
 * written to dents, each component checked (ktree_walk). Any depth is indexed (a user can make a tree as
 * deep as the backing's inodes allow, through the mount, and a rebuild that gave up on it left the
 * daemon unable to start), at a cost of one walk down per WALK_DEPTH levels.
 *
 * PINS. The daemon keeps each pin on the backing file too (fs/control.c), so a pin outlives a corrupt or
 * deleted index. A file is pinned after the rebuild if the index or its attribute says so: the daemon
 * writes the attribute first and flushes the index at once, so they disagree only after a crash between
 * the two, and then pinned is the safe side; and pins an older daemon kept in the index alone survive.
 * Where the backing filesystem has no user attributes (tmpfs before 6.6), the scan says "unknown" (NULL)
 * and the index's flag stands. Reading the attribute costs an O_PATH open per file, through /proc/self/fd
 * (an O_PATH descriptor carries no f*xattr call): a rebuild is rare. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "kidx-internal.h"
#include "../common/tree.h"

struct walk {
        kidx *idx;
        const struct ktree *t;
        sqlite3_stmt *dent, *file;
        bool xattrs; /* the backing filesystem has user attributes: pins can be read from the files */
        dev_t dev;
        uint64_t nfiles, ndirs;
        bool progress;
        const char *skip_name; /* in the root only */
        uint64_t *deep;        /* directories below WALK_DEPTH, walked afterwards (DEPTH) */
        size_t ndeep, deep_cap;
};

#define WALK_DEPTH 128

static enum kidx_type type_of(mode_t m)
{
        return S_ISREG(m) ? KIDX_REG : S_ISDIR(m) ? KIDX_DIR : S_ISLNK(m) ? KIDX_LNK : KIDX_OTHER;
}

/* Whether the attribute of the backing object FD says "pinned"; -1 when it cannot tell. */
static int pinned_xattr(int fd)
{
        char proc[64], v[8];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        ssize_t n = getxattr(proc, KIDX_PIN_XATTR, v, sizeof(v));
        if (n >= 0)
                return n == 1 && v[0] == '1';
        return errno == ENODATA ? 0 : -1;
}

/* The pin attribute of regular file NAME (inode INO) in directory DFD: 1, 0, or -1 unknown (no user
 * attributes here; the name now holds another object). */
static int pinned_of(struct walk *w, int dfd, const char *name, ino_t ino)
{
        if (!w->xattrs)
                return -1;
        int fd = ktree_open(w->t, dfd, name, O_PATH, 0);
        if (fd < 0)
                return -1;
        struct stat st;
        int r = fstat(fd, &st) == 0 && st.st_ino == ino && S_ISREG(st.st_mode) ? pinned_xattr(fd) : -1;
        close(fd);
        return r;
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

static int walk_dir(struct walk *w, int dfd, uint64_t dir_ino, int depth, bool top)
{
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
                if (top && w->skip_name && !strcmp(name, w->skip_name))
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
                        int pinned = pinned_of(w, dirfd(d), name, st.st_ino);
                        if (pinned < 0)
                                sqlite3_bind_null(w->file, 5);
                        else
                                sqlite3_bind_int64(w->file, 5, pinned);
                        rc = sqlite3_step(w->file);
                        sqlite3_reset(w->file);
                        if ((r = kidx__errno(rc)) < 0)
                                break;
                        w->nfiles++;
                        show_progress(w, false);
                } else if (t == KIDX_DIR) {
                        w->ndirs++;
                        show_progress(w, false);
                        if (depth + 1 >= WALK_DEPTH) { /* later, from the root (DEPTH) */
                                if (w->ndeep == w->deep_cap) {
                                        size_t cap = w->deep_cap ? w->deep_cap * 2 : 16;
                                        uint64_t *n = realloc(w->deep, cap * sizeof(*n));
                                        if (!n) {
                                                r = -ENOMEM;
                                                break;
                                        }
                                        w->deep = n;
                                        w->deep_cap = cap;
                                }
                                w->deep[w->ndeep++] = st.st_ino;
                                continue;
                        }
                        int cfd = ktree_open(w->t, dirfd(d), name, O_RDONLY | O_DIRECTORY, 0);
                        if (cfd == -ENOENT || cfd == -ELOOP || cfd == -EXDEV || cfd == -ENOTDIR)
                                continue; /* gone, or swapped for a symlink, a mount point, a file: not ours */
                        if (cfd < 0) {
                                r = cfd;
                                break;
                        }
                        r = walk_dir(w, cfd, st.st_ino, depth + 1, false);
                }
        }
        if (r == 0 && errno != 0 && !de)
                r = -errno;
        closedir(d);
        return r;
}

/* Opens directory ino, which the walk reached below WALK_DEPTH, from the root through the names written to
 * dents, each checked to be the directory written (R4). -ESTALE: gone or changed since (then it is not
 * walked: a change made through the mount while the rebuild runs is indexed as it happens). */
static int open_deep(struct walk *w, uint64_t ino)
{
        struct kidx_chain c;
        int r = kidx__dir_chain_locked(w->idx, ino, &c);
        if (r == -ENOENT)
                return -ESTALE;
        if (r < 0)
                return r;
        r = ktree_walk(w->t, c.n, (const char *const *)c.names, c.inos, O_RDONLY);
        kidx_chain_free(&c);
        return r;
}

static const char *const RECONCILE =
        "DELETE FROM files WHERE ino NOT IN (SELECT ino FROM temp.scan);"
        "UPDATE files SET bytes = s.bytes, uid = s.uid, pinned = max(files.pinned, coalesce(s.pinned, 0))"
        "  FROM temp.scan AS s WHERE s.ino = files.ino;"
        "INSERT INTO files(ino, bytes, seq, atime_ns, opens, bytes_read, pinned, uid)"
        "  SELECT ino, bytes, 0, mtime_ns, 0, 0, coalesce(pinned, 0), uid FROM temp.scan"
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
        struct ktree t;
        int r = ktree_init_fd(&t, backing_fd);
        if (r < 0)
                return r;
        struct walk w = { .idx = idx, .t = &t, .dev = root.st_dev, .progress = progress, .skip_name = skip_name };
        /* One question to the root for the whole tree: a filesystem without user attributes answers
         * ENOTSUP (EOPNOTSUPP), one with them ENODATA (or the value). */
        w.xattrs = pinned_xattr(backing_fd) >= 0;
        sqlite3 *db = idx->db;

        pthread_mutex_lock(&idx->db_lock);
        r = kidx__exec(db, "BEGIN IMMEDIATE; DELETE FROM dents;"
                               "CREATE TEMP TABLE scan(ino INTEGER PRIMARY KEY, bytes INTEGER NOT NULL,"
                               " mtime_ns INTEGER NOT NULL, uid INTEGER NOT NULL, pinned INTEGER);");
        if (r < 0)
                goto out;
        int rc = sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO dents(dir, name, ino, type) VALUES (?1, ?2, ?3, ?4)",
                                    -1, &w.dent, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO temp.scan(ino, bytes, mtime_ns, uid, pinned)"
                                        " VALUES (?1, ?2, ?3, ?4, ?5)", -1, &w.file, NULL);
        if ((r = kidx__errno(rc)) < 0)
                goto rollback;

        int dfd = ktree_open(&t, KTREE_ROOT, ".", O_RDONLY | O_DIRECTORY, 0);
        if (dfd < 0) {
                r = dfd;
                goto rollback;
        }
        r = walk_dir(&w, dfd, root.st_ino, 0, true);
        while (r == 0 && w.ndeep) { /* (DEPTH) */
                uint64_t ino = w.deep[--w.ndeep];
                int fd = open_deep(&w, ino);
                if (fd >= 0)
                        r = walk_dir(&w, fd, ino, 0, false);
                else if (fd != -ESTALE && fd != -ENOENT)
                        r = fd;
        }
        free(w.deep);
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
