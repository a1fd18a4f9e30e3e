/* test-index-lru: LRU order, accounting, pins and batch flushing of the index, through its API only. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../index/kidx.h"
#include "tutil.h"

static kidx *open_idx(const char *db, int backing_fd, enum kidx_rebuild_reason *why)
{
        struct kidx_open_opts o = { .db_path = db, .backing_fd = backing_fd };
        kidx *idx = NULL;
        int r = kidx_open(&o, &idx, why);
        CHECK_EQ(r, 0);
        return idx;
}

static int lru(kidx *idx, uint64_t *inos, int max)
{
        struct kidx_lru_row rows[64];
        int n = kidx_lru_batch(idx, 0, rows, (size_t)max);
        for (int i = 0; i < n; i++)
                inos[i] = rows[i].ino;
        return n;
}

static void test_order_accounting_pins(const char *tmp, int bfd)
{
        char db[4096];
        snprintf(db, sizeof(db), "%s/lru.db", tmp);
        enum kidx_rebuild_reason why;
        kidx *idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_REBUILD_NEW);

        /* Five files, created 1..5, then accessed 3, 1, 5: LRU order must be 2, 4, 3, 1, 5. */
        for (uint64_t i = 1; i <= 5; i++) {
                kidx_add_file(idx, 1000 + i, 4096 * i, 1000, (int64_t)i);
                char name[16];
                snprintf(name, sizeof(name), "f%llu", (unsigned long long)i);
                kidx_add_dent(idx, 7, name, 1000 + i, KIDX_REG);
        }
        CHECK_EQ(kidx_used(idx), 4096 * 15);
        kidx_touch(idx, 1003, 100, 1, 0);
        kidx_touch(idx, 1001, 101, 1, 10);
        kidx_touch(idx, 1005, 102, 0, 20);

        /* Not flushed yet: the database has nothing, but kidx_get_file sees the batch. */
        uint64_t order[8];
        CHECK_EQ(lru(idx, order, 8), 0);
        struct kidx_file f;
        CHECK_EQ(kidx_get_file(idx, 1001, &f), 0);
        CHECK_EQ(f.atime_ns, 101);

        CHECK_EQ(kidx_flush(idx), 0);
        CHECK_EQ(lru(idx, order, 8), 5);
        uint64_t want[] = { 1002, 1004, 1003, 1001, 1005 };
        for (int i = 0; i < 5; i++)
                CHECK_EQ(order[i], want[i]);

        CHECK_EQ(kidx_get_file(idx, 1001, &f), 0);
        CHECK_EQ(f.opens, 2); /* create + one open */
        CHECK_EQ(f.bytes_read, 10);
        CHECK_EQ(f.atime_ns, 101);

        /* Pinned files leave the LRU; unpinning brings them back in their place. */
        kidx_set_pinned(idx, 1002, true);
        kidx_flush(idx);
        CHECK_EQ(lru(idx, order, 8), 4);
        CHECK_EQ(order[0], 1004);
        kidx_set_pinned(idx, 1002, false);
        kidx_flush(idx);
        CHECK_EQ(lru(idx, order, 8), 5);
        CHECK_EQ(order[0], 1002);

        /* Accounting: size changes, deletion, eviction. */
        kidx_set_bytes(idx, 1001, 8192);
        CHECK_EQ(kidx_used(idx), 4096 * 16);
        kidx_set_bytes(idx, 1001, 0);
        CHECK_EQ(kidx_used(idx), 4096 * 14);
        kidx_del_dent(idx, 7, "f2");
        kidx_del_file(idx, 1002);
        CHECK_EQ(kidx_used(idx), 4096 * 12);
        CHECK_EQ(kidx_evicted(idx, 1004, "f4", 200), 16384);
        CHECK_EQ(kidx_used(idx), 4096 * 8);
        /* I3: only rows count. A file without one (unlinked, evicted, never indexed) changes nothing,
         * however often it is measured or removed; a row replaced by a reused number counts once. */
        kidx_set_bytes(idx, 1004, 999424);
        kidx_set_bytes(idx, 777, 4096);
        kidx_del_file(idx, 1002);
        CHECK_EQ(kidx_evicted(idx, 1004, "f4", 201), 0);
        CHECK_EQ(kidx_used(idx), 4096 * 8);
        struct kidx_stats s;
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 3);
        CHECK_EQ(s.evicted_files, 2);
        CHECK_EQ(s.evicted_bytes, 16384);
        kidx_flush(idx);
        CHECK_EQ(lru(idx, order, 8), 3);
        CHECK_EQ(kidx_get_file(idx, 1004, &f), -ENOENT);

        /* A reused inode number after deletion must not inherit the old file's batched size. */
        kidx_set_bytes(idx, 1003, 40960);
        kidx_del_file(idx, 1003);
        kidx_add_file(idx, 1003, 4096, 0, 300);
        kidx_flush(idx);
        CHECK_EQ(kidx_get_file(idx, 1003, &f), 0);
        CHECK_EQ(f.bytes, 4096);
        CHECK_EQ(kidx_used(idx), 4096 + 0 + 20480);
        kidx_add_file(idx, 1003, 8192, 0, 301); /* its row not dropped first: replaced, counted once */
        CHECK_EQ(kidx_used(idx), 8192 + 0 + 20480);
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 3);
        kidx_set_bytes(idx, 1003, 4096);
        kidx_flush(idx);

        /* Names and directory paths: dir 7 is "a/b" under the root (ino of the backing dir). */
        struct stat rs;
        fstat(bfd, &rs);
        kidx_add_dent(idx, rs.st_ino, "a", 5, KIDX_DIR);
        kidx_add_dent(idx, 5, "b", 7, KIDX_DIR);
        kidx_rename(idx, 7, "f1", 7, "g1", false);
        kidx_flush(idx);
        char path[256];
        CHECK_EQ(kidx_dir_path(idx, 7, path, sizeof(path)), 0);
        CHECK(strcmp(path, "a/b") == 0);
        CHECK_EQ(kidx_dir_path(idx, rs.st_ino, path, sizeof(path)), 0);
        CHECK(strcmp(path, "") == 0);
        CHECK_EQ(kidx_dir_path(idx, 999999, path, sizeof(path)), -ENOENT);

        /* Clean close keeps everything without a rebuild; sequence numbers continue. */
        kidx_get_stats(idx, &s);
        uint64_t seq = s.seq;
        kidx_close(idx, true);
        idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_NO_REBUILD);
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.seq, seq);
        CHECK_EQ(s.files, 3);
        CHECK_EQ(kidx_used(idx), 4096 + 20480);
        CHECK(kidx_touch(idx, 1001, 400, 1, 0) == seq + 1);

        /* An unclean stop makes the next open reconcile with the (empty) tree: fake rows go. */
        kidx_mark_dirty(idx);
        kidx_close(idx, false);
        idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_REBUILD_UNCLEAN);
        kidx_get_stats(idx, &s);
        CHECK_EQ(s.files, 0);
        CHECK_EQ(kidx_used(idx), 0);
        kidx_close(idx, true);
}

static void test_writer_thread(const char *tmp, int bfd)
{
        char db[4096];
        snprintf(db, sizeof(db), "%s/writer.db", tmp);
        kidx *idx = open_idx(db, bfd, NULL);
        CHECK_EQ(kidx_start_writer(idx, 50), 0);
        kidx_add_file(idx, 42, 4096, 0, 1);
        uint64_t order[4];
        int n = 0;
        for (int i = 0; i < 200 && n == 0; i++) { /* poll against a 2 s deadline */
                n = lru(idx, order, 4);
                if (n == 0)
                        usleep(10000);
        }
        CHECK_EQ(n, 1);
        kidx_close(idx, true);
}

static void test_corrupt(const char *tmp, int bfd)
{
        char db[4096], aside[4200];
        snprintf(db, sizeof(db), "%s/corrupt.db", tmp);
        kidx *idx = open_idx(db, bfd, NULL);
        kidx_close(idx, true);
        /* Overwrite the header with garbage. */
        int fd = open(db, O_WRONLY);
        char junk[4096];
        memset(junk, 0x5a, sizeof(junk));
        CHECK(pwrite(fd, junk, sizeof(junk), 0) == sizeof(junk));
        close(fd);
        enum kidx_rebuild_reason why;
        idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_REBUILD_CORRUPT);
        snprintf(aside, sizeof(aside), "%s.corrupt", db);
        CHECK(access(aside, F_OK) == 0);
        kidx_close(idx, true);
        idx = open_idx(db, bfd, &why);
        CHECK_EQ(why, KIDX_NO_REBUILD);
        kidx_close(idx, true);

        /* A file of another program (valid SQLite, foreign schema version). */
        snprintf(db, sizeof(db), "%s/foreign.db", tmp);
        char cmd[4200];
        snprintf(cmd, sizeof(cmd), "sqlite3 '%s' 'PRAGMA user_version=77; CREATE TABLE t(x);'", db);
        if (system(cmd) == 0) {
                idx = open_idx(db, bfd, &why);
                CHECK_EQ(why, KIDX_REBUILD_SCHEMA);
                kidx_close(idx, true);
        }
}

int main(void)
{
        char *tmp = tutil_tmpdir();
        char backing[4096];
        snprintf(backing, sizeof(backing), "%s/backing", tmp);
        mkdir(backing, 0755);
        int bfd = open(backing, O_RDONLY | O_DIRECTORY);
        test_order_accounting_pins(tmp, bfd);
        test_writer_thread(tmp, bfd);
        test_corrupt(tmp, bfd);
        close(bfd);
        tutil_rmrf(tmp);
        free(tmp);
        return tutil_done("test-index-lru");
}
