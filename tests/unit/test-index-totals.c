/* test-index-totals: the index's in-memory totals (used bytes, files) stay the sum and count of its rows
 * (kidx I3) while mutators on several threads race flushes that commit their batches. The rows are read
 * with a connection of the test's own after every round, so the check does not trust the index's code.
 * Then kidx_zero_counters: the statistics counters to 0 and kept so across a reopen, the totals untouched. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../index/kidx.h"
#include "tutil.h"

#define THREADS 4
#define INOS 64 /* few, so that threads meet on the same rows */
/* Rounds of THREADS x OPS operations; TOTALS_ROUNDS overrides (run-tests uses fewer under valgrind). */
#define ROUNDS 40
#define OPS 2000

struct mutator {
        kidx *idx;
        unsigned seed;
        int ops;
};

static void *mutate(void *arg)
{
        struct mutator *m = arg;
        for (int i = 0; i < m->ops; i++) {
                uint64_t ino = 1000 + (uint64_t)(rand_r(&m->seed) % INOS);
                uint64_t bytes = (uint64_t)(rand_r(&m->seed) % 64) * 4096;
                switch (rand_r(&m->seed) % 6) {
                case 0:
                        kidx_add_file(m->idx, ino, bytes, 0, i);
                        break;
                case 1:
                case 2:
                        kidx_set_bytes(m->idx, ino, bytes);
                        break;
                case 3:
                        kidx_del_file(m->idx, ino);
                        break;
                case 4: {
                        /* Half the time as eviction does: a row of the LRU order, read before. */
                        struct kidx_lru_row rows[8];
                        int n = rand_r(&m->seed) % 2 ? kidx_lru_batch(m->idx, 0, rows, 8) : 0;
                        if (n > 0)
                                (void)kidx_evicted_row(m->idx, &rows[rand_r(&m->seed) % n], "f", i);
                        else
                                (void)kidx_evicted(m->idx, ino, "f", i);
                        break;
                }
                default:
                        (void)kidx_touch(m->idx, ino, i, 1, bytes);
                        break;
                }
        }
        return NULL;
}

static atomic_bool flushing_stop;

static void *flush_loop(void *arg)
{
        kidx *idx = arg;
        while (!atomic_load(&flushing_stop)) {
                kidx_flush(idx);
                sched_yield(); /* under valgrind's one-thread-at-a-time, the mutators run too */
        }
        return NULL;
}

/* The rows' count and sum, read by a connection of our own. */
static void rows(const char *db, uint64_t *files, uint64_t *bytes)
{
        sqlite3 *c;
        sqlite3_stmt *st;
        CHECK_EQ(sqlite3_open_v2(db, &c, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        CHECK_EQ(sqlite3_prepare_v2(c, "SELECT count(*), coalesce(sum(bytes), 0) FROM files", -1, &st, NULL),
                 SQLITE_OK);
        CHECK_EQ(sqlite3_step(st), SQLITE_ROW);
        *files = (uint64_t)sqlite3_column_int64(st, 0);
        *bytes = (uint64_t)sqlite3_column_int64(st, 1);
        sqlite3_finalize(st);
        sqlite3_close(c);
}

static void check_totals(kidx *idx, const char *db, int round)
{
        kidx_flush(idx);
        struct kidx_stats s;
        kidx_get_stats(idx, &s);
        uint64_t files, bytes;
        rows(db, &files, &bytes);
        if (s.files != files || s.used_bytes != bytes)
                fprintf(stderr, "round %d: in memory %llu files, %llu bytes; rows %llu, %llu\n", round,
                        (unsigned long long)s.files, (unsigned long long)s.used_bytes,
                        (unsigned long long)files, (unsigned long long)bytes);
        CHECK_EQ(s.files, files);
        CHECK_EQ(s.used_bytes, bytes);
}

int main(void)
{
        char *tmp = tutil_tmpdir();
        char db[4096];
        snprintf(db, sizeof(db), "%s/totals.db", tmp);
        int bfd = open(tmp, O_RDONLY | O_DIRECTORY);
        struct kidx_open_opts o = { .db_path = db, .backing_fd = bfd };
        kidx *idx = NULL;
        CHECK_EQ(kidx_open(&o, &idx, NULL), 0);

        const char *env = getenv("TOTALS_ROUNDS");
        int rounds = env ? atoi(env) : ROUNDS;
        for (int round = 0; round < rounds; round++) {
                pthread_t fl, th[THREADS];
                struct mutator m[THREADS];
                atomic_store(&flushing_stop, false);
                pthread_create(&fl, NULL, flush_loop, idx);
                for (int t = 0; t < THREADS; t++) {
                        m[t] = (struct mutator){ idx, (unsigned)(round * THREADS + t + 1), OPS };
                        pthread_create(&th[t], NULL, mutate, &m[t]);
                }
                for (int t = 0; t < THREADS; t++)
                        pthread_join(th[t], NULL);
                atomic_store(&flushing_stop, true);
                pthread_join(fl, NULL);
                check_totals(idx, db, round);
        }

        /* A clean close and open count the same totals from the rows alone. */
        struct kidx_stats before, after;
        kidx_get_stats(idx, &before);
        kidx_close(idx, true);
        CHECK_EQ(kidx_open(&o, &idx, NULL), 0);
        kidx_get_stats(idx, &after);
        CHECK_EQ(after.files, before.files);
        CHECK_EQ(after.used_bytes, before.used_bytes);

        /* kcache zero: the counters go to 0, in memory and on disk; the totals and seq stay (I3). */
        CHECK(after.opens > 0 && after.evicted_files > 0 && after.bytes_read > 0);
        CHECK_EQ(kidx_zero_counters(idx), 0);
        kidx_get_stats(idx, &after);
        CHECK_EQ(after.opens + after.bytes_read + after.evicted_files + after.evicted_bytes + after.rebuilds, 0);
        CHECK_EQ(after.files, before.files);
        CHECK_EQ(after.used_bytes, before.used_bytes);
        CHECK_EQ(after.seq, before.seq);
        (void)kidx_touch(idx, 1000, 1, 1, 4096); /* counting goes on from 0 */
        CHECK_EQ(kidx_flush(idx), 0);
        kidx_close(idx, true);
        CHECK_EQ(kidx_open(&o, &idx, NULL), 0);
        kidx_get_stats(idx, &after);
        CHECK_EQ(after.opens, 1);
        CHECK_EQ(after.bytes_read, 4096);
        CHECK_EQ(after.evicted_files + after.evicted_bytes + after.rebuilds, 0);
        CHECK_EQ(after.files, before.files);
        CHECK_EQ(after.used_bytes, before.used_bytes);
        kidx_close(idx, true);
        /* Zeroes alone, with no flush after them, are on disk too. */
        CHECK_EQ(kidx_open(&o, &idx, NULL), 0);
        (void)kidx_touch(idx, 1000, 2, 1, 0);
        CHECK_EQ(kidx_flush(idx), 0);
        CHECK_EQ(kidx_zero_counters(idx), 0);
        kidx_close(idx, true);
        CHECK_EQ(kidx_open(&o, &idx, NULL), 0);
        kidx_get_stats(idx, &after);
        CHECK_EQ(after.opens, 0);
        kidx_close(idx, true);

        close(bfd);
        tutil_rmrf(tmp);
        free(tmp);
        return tutil_done("test-index-totals");
}
