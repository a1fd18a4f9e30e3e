/* kidx-flush.c: the batch applied to the database (I4), the WAL kept small (I5), and the writer thread that
 * does both in the background. The invariants are numbered in kidx.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kidx-internal.h"

/* Evictions remembered for operators (kcache, the crash tests). */
#define EVICTION_LOG_ROWS 100000

void kidx__free_batch(struct kidx__op *ops, size_t n, kmap *touches)
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
        kidx__free_batch(ops, nops, &touches);
        return r;
}

int kidx_zero_counters(kidx *idx)
{
        /* db_lock: no flush writes the counters between the zeroing and their commit. */
        pthread_mutex_lock(&idx->db_lock);
        pthread_mutex_lock(&idx->batch_lock);
        idx->stats.opens = idx->stats.bytes_read = 0;
        idx->stats.evicted_files = idx->stats.evicted_bytes = idx->stats.rebuilds = 0;
        pthread_mutex_unlock(&idx->batch_lock);
        static const char *const keys[] = { "opens", "bytes_read", "evicted_files", "evicted_bytes", "rebuilds" };
        int r = kidx__exec(idx->db, "BEGIN IMMEDIATE");
        for (size_t i = 0; r == 0 && i < sizeof(keys) / sizeof(keys[0]); i++)
                r = kidx__set_meta(idx, keys[i], 0);
        if (r == 0)
                r = kidx__exec(idx->db, "COMMIT");
        if (r < 0)
                kidx__exec(idx->db, "ROLLBACK");
        pthread_mutex_unlock(&idx->db_lock);
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
        if (kidx__open_conn(idx->db_path, SQLITE_OPEN_READWRITE, &ck) < 0)
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


void kidx__stop_writer(kidx *idx)
{
        if (!idx->writer_running)
                return;
        pthread_mutex_lock(&idx->batch_lock);
        idx->writer_stop = true;
        pthread_cond_signal(&idx->writer_cond);
        pthread_mutex_unlock(&idx->batch_lock);
        pthread_join(idx->writer, NULL);
        idx->writer_running = false;
}
