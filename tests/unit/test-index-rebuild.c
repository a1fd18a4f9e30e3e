/* test-index-rebuild: reconciling the index with a real tree: a new index, an unclean stop with files
 * added and removed behind its back, hard links, a truncated index file, a moved backing directory. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../index/kidx.h"
#include "tutil.h"

struct namebuf {
        int n;
        char last[256];
};

static void collect(void *ud, uint64_t dir, const char *name)
{
        (void)dir;
        struct namebuf *b = ud;
        b->n++;
        snprintf(b->last, sizeof(b->last), "%s", name);
}

static kidx *open_idx(const char *db, int bfd, enum kidx_rebuild_reason *why)
{
        struct kidx_open_opts o = { .db_path = db, .backing_fd = bfd, .skip_name = ".kcachefs" };
        kidx *idx = NULL;
        CHECK_EQ(kidx_open(&o, &idx, why), 0);
        return idx;
}

static uint64_t blocks_of(const char *path)
{
        struct stat st;
        stat(path, &st);
        return (uint64_t)st.st_blocks * 512;
}

int main(void)
{
        char *tmp = tutil_tmpdir();
        char b[4096], p[4300], db[4300];
        snprintf(b, sizeof(b), "%s/backing", tmp);
        snprintf(db, sizeof(db), "%s/backing/.kcachefs/index.db", tmp);
        mkdir(b, 0755);
        snprintf(p, sizeof(p), "%s/.kcachefs", b);
        mkdir(p, 0700);
        snprintf(p, sizeof(p), "%s/ab", b);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/ab/cd", b);
        mkdir(p, 0755);
        uint64_t x = tutil_write_file(b, "ab/cd/x.bin", 10000);
        uint64_t y = tutil_write_file(b, "ab/y.bin", 70000);
        tutil_write_file(b, "z.bin", 1);
        tutil_write_file(b, ".kcachefs/not-counted", 50000); /* the metadata dir is skipped */
        snprintf(p, sizeof(p), "%s/ab/y.bin", b);
        char lnk[4300];
        snprintf(lnk, sizeof(lnk), "%s/ab/cd/y-link", b);
        CHECK(link(p, lnk) == 0); /* a hard link: one file, two names */
        snprintf(p, sizeof(p), "%s/ab/cd/x.bin", b);
        uint64_t xb = blocks_of(p);
        snprintf(p, sizeof(p), "%s/ab/y.bin", b);
        uint64_t yb = blocks_of(p);
        snprintf(p, sizeof(p), "%s/z.bin", b);
        uint64_t zb = blocks_of(p);
        snprintf(p, sizeof(p), "%s/sym", b);
        CHECK(symlink("z.bin", p) == 0);

        int bfd = open(b, O_RDONLY | O_DIRECTORY);
        enum kidx_rebuild_reason why;
        kidx *idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_REBUILD_NEW);
        struct kidx_stats s;
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 3);
        CHECK_EQ(s.used_bytes, xb + yb + zb);
        struct namebuf nb = { 0 };
        CHECK_EQ(kidx_names(idx, y, collect, &nb), 2);
        nb.n = 0;
        CHECK_EQ(kidx_names(idx, x, collect, &nb), 1);
        CHECK(strcmp(nb.last, "x.bin") == 0);

        /* Recency from mtime: make x the oldest and y the newest, then an access to x makes it newest. */
        struct kidx_lru_row rows[8];
        kidx_close(idx, true);
        struct timespec old[2] = { { 1000, 0 }, { 1000, 0 } }, mid[2] = { { 2000, 0 }, { 2000, 0 } },
                        new[2] = { { 3000, 0 }, { 3000, 0 } };
        snprintf(p, sizeof(p), "%s/ab/cd/x.bin", b);
        utimensat(AT_FDCWD, p, old, 0);
        snprintf(p, sizeof(p), "%s/z.bin", b);
        utimensat(AT_FDCWD, p, mid, 0);
        snprintf(p, sizeof(p), "%s/ab/y.bin", b);
        utimensat(AT_FDCWD, p, new, 0);
        struct kidx_open_opts fo = { .db_path = db, .backing_fd = bfd, .skip_name = ".kcachefs", .force_rebuild = true };
        CHECK_EQ(kidx_open(&fo, &idx, &why), 0);
        CHECK_EQ(why, KIDX_REBUILD_FORCED);
        /* Known files keep their recency (from the first scan's mtimes, all recent); force a fresh view: */
        kidx_close(idx, true);
        unlink(db);
        idx = open_idx(db, bfd, &why);
        CHECK_EQ(kidx_lru_batch(idx, 0, rows, 8), 3);
        CHECK_EQ(rows[0].ino, x);
        CHECK_EQ(rows[2].ino, y);
        struct kidx_file f;
        CHECK_EQ(kidx_get_file(idx, x, &f), 0);
        CHECK_EQ(f.atime_ns, 1000000000000LL);
        kidx_touch(idx, x, 5000000000000LL, 1, 0);
        kidx_mark_dirty(idx);
        kidx_close(idx, false); /* as after a crash: flushed batch, but not clean */

        /* Behind the index's back: a new old file, and y loses one of its names, z disappears. */
        uint64_t w = tutil_write_file(b, "ab/w.bin", 5000);
        snprintf(p, sizeof(p), "%s/ab/w.bin", b);
        uint64_t wb = blocks_of(p);
        struct timespec older[2] = { { 500, 0 }, { 500, 0 } };
        utimensat(AT_FDCWD, p, older, 0);
        unlink(lnk);
        snprintf(p, sizeof(p), "%s/z.bin", b);
        unlink(p);

        idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_REBUILD_UNCLEAN);
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 3);
        CHECK_EQ(s.used_bytes, xb + yb + wb);
        CHECK_EQ(s.rebuilds, 2);
        /* Order: w (mtime 500) < y (3000) < x (accessed at 5000). */
        CHECK_EQ(kidx_lru_batch(idx, 0, rows, 8), 3);
        CHECK_EQ(rows[0].ino, w);
        CHECK_EQ(rows[1].ino, y);
        CHECK_EQ(rows[2].ino, x);
        CHECK_EQ(kidx_get_file(idx, x, &f), 0);
        CHECK_EQ(f.opens, 1); /* counters of known files survive a rebuild */
        nb.n = 0;
        CHECK_EQ(kidx_names(idx, y, collect, &nb), 1);
        char dir[256];
        struct stat cd;
        snprintf(p, sizeof(p), "%s/ab/cd", b);
        stat(p, &cd);
        CHECK_EQ(kidx_dir_path(idx, cd.st_ino, dir, sizeof(dir)), 0);
        CHECK(strcmp(dir, "ab/cd") == 0);
        kidx_close(idx, true);

        /* A truncated index file is corrupt: it is moved aside and rebuilt, and no file is lost. */
        CHECK(truncate(db, 4096 + 100) == 0);
        idx = open_idx(db, bfd, &why);
        CHECK(why == KIDX_REBUILD_CORRUPT || why == KIDX_REBUILD_NEW);
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 3);
        CHECK_EQ(s.used_bytes, xb + yb + wb);
        kidx_close(idx, true);

        /* The same index opened for another directory is rebuilt for it. */
        char b2[4300];
        snprintf(b2, sizeof(b2), "%s/other", tmp);
        mkdir(b2, 0755);
        tutil_write_file(b2, "only.bin", 100);
        int b2fd = open(b2, O_RDONLY | O_DIRECTORY);
        idx = open_idx(db, b2fd, &why);
        CHECK_EQ(why, KIDX_REBUILD_MOVED);
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 1);
        kidx_close(idx, true);
        close(b2fd);

        close(bfd);
        tutil_rmrf(tmp);
        free(tmp);
        return tutil_done("test-index-rebuild");
}
