/* kidx-batch.c: the in-memory batch (mutators) and the queries that must see it.
 *
 * Every mutator takes batch_lock for a few hundred nanoseconds and does no I/O under it: this is the
 * daemon's hot path. Structural changes become ops (ordered); per-file changes coalesce into one touch per
 * inode, so a file read a thousand times between two flushes costs one UPDATE. A mutator that changes a
 * row's size and finds no size for it in memory reads the committed row first, with batch_lock dropped
 * (kidx.c, I3). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kidx-internal.h"

/* batch_lock held. NULL only on ENOMEM, in which case the change is dropped: the index is a cache of the
 * tree, and the next reconcile repairs it. */
static struct kidx__touch *touch_of(kidx *idx, uint64_t ino)
{
        struct kidx__touch *t = kmap_get(&idx->touches, ino);
        if (t)
                return t;
        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        t->pinned = -1;
        t->bytes = -1;
        if (kmap_put(&idx->touches, ino, t) < 0) {
                free(t);
                return NULL;
        }
        return t;
}

/* batch_lock held. */
static struct kidx__op *push_op(kidx *idx, enum kidx__op_kind kind)
{
        if (idx->nops == idx->cap_ops) {
                size_t ncap = idx->cap_ops ? idx->cap_ops * 2 : 256;
                struct kidx__op *n = realloc(idx->ops, ncap * sizeof(*n));
                if (!n)
                        return NULL;
                idx->ops = n;
                idx->cap_ops = ncap;
        }
        struct kidx__op *op = &idx->ops[idx->nops++];
        memset(op, 0, sizeof(*op));
        op->kind = kind;
        return op;
}

uint64_t kidx_touch(kidx *idx, uint64_t ino, int64_t now_ns, uint32_t opens, uint64_t bytes_read)
{
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t seq = ++idx->stats.seq;
        idx->stats.opens += opens;
        idx->stats.bytes_read += bytes_read;
        struct kidx__touch *t = touch_of(idx, ino);
        if (t) {
                t->seq = seq;
                t->atime_ns = now_ns;
                t->has_atime = true;
                t->opens += opens;
                t->bytes_read += bytes_read;
        }
        pthread_mutex_unlock(&idx->batch_lock);
        return seq;
}

void kidx_set_atime(kidx *idx, uint64_t ino, int64_t atime_ns)
{
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__touch *t = touch_of(idx, ino);
        if (t) {
                t->atime_ns = atime_ns;
                t->has_atime = true;
        }
        pthread_mutex_unlock(&idx->batch_lock);
}

static uintptr_t size_in_memory(kidx *idx, uint64_t ino)
{
        uintptr_t v = (uintptr_t)kmap_get(&idx->sizes, ino);
        return v ? v : (uintptr_t)kmap_get(&idx->sizes_flushing, ino);
}

/* The bytes of ino's row as the next flush leaves it (I3): *ret, and whether it has one. batch_lock
 * held, and dropped meanwhile if the committed row must be read. row: the committed row as read in
 * generation row->gen, or NULL. */
static bool size_of_row(kidx *idx, uint64_t ino, const struct kidx_lru_row *row, uint64_t *ret)
{
        uintptr_t v;
        while (!(v = size_in_memory(idx, ino))) {
                uint64_t gen = idx->flush_gen;
                if (row && row->gen == gen) {
                        v = (uintptr_t)row->bytes + 1; /* nothing committed since it was read */
                        break;
                }
                pthread_mutex_unlock(&idx->batch_lock);
                pthread_mutex_lock(&idx->rd_lock);
                sqlite3_stmt *st = idx->rd_size;
                sqlite3_bind_int64(st, 1, (int64_t)ino);
                int rc = sqlite3_step(st);
                uintptr_t db = rc == SQLITE_ROW ? (uintptr_t)sqlite3_column_int64(st, 0) + 1
                                                : (uintptr_t)KIDX__NO_ROW;
                sqlite3_reset(st);
                pthread_mutex_unlock(&idx->rd_lock);
                if (rc != SQLITE_ROW && rc != SQLITE_DONE)
                        fprintf(stderr, "kcachefs: index: reading the size of inode %llu: %s\n",
                                (unsigned long long)ino, sqlite3_errstr(rc));
                pthread_mutex_lock(&idx->batch_lock);
                if (gen == idx->flush_gen && !(v = size_in_memory(idx, ino))) {
                        v = db; /* no flush committed since the read: the row is as read */
                        break;
                }
        }
        *ret = v != (uintptr_t)KIDX__NO_ROW ? (uint64_t)v - 1 : 0;
        return v != (uintptr_t)KIDX__NO_ROW;
}

static bool size_of(kidx *idx, uint64_t ino, uint64_t *ret)
{
        return size_of_row(idx, ino, NULL, ret);
}

/* batch_lock held, after size_of() gave ino's old size. On ENOMEM the row's size stays as it was (the
 * next reconcile repairs it). */
static void size_set(kidx *idx, uint64_t ino, bool had, uint64_t old, uint64_t bytes)
{
        if (kmap_put(&idx->sizes, ino, (void *)(uintptr_t)(bytes + 1)) < 0)
                return;
        idx->stats.used_bytes += bytes - old; /* modular: exact for decreases too */
        if (!had)
                idx->stats.files++;
}

void kidx_set_bytes(kidx *idx, uint64_t ino, uint64_t new_bytes)
{
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t old;
        if (size_of(idx, ino, &old) && old != new_bytes) {
                struct kidx__touch *t = touch_of(idx, ino);
                if (t) {
                        t->bytes = (int64_t)new_bytes;
                        size_set(idx, ino, true, old, new_bytes);
                }
        }
        pthread_mutex_unlock(&idx->batch_lock);
}

void kidx_set_pinned(kidx *idx, uint64_t ino, bool pinned)
{
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__touch *t = touch_of(idx, ino);
        if (t)
                t->pinned = pinned;
        pthread_mutex_unlock(&idx->batch_lock);
}

void kidx_add_file(kidx *idx, uint64_t ino, uint64_t bytes, uint32_t uid, int64_t now_ns)
{
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t old;
        bool had = size_of(idx, ino, &old);
        struct kidx__touch *t = touch_of(idx, ino);
        if (t) {
                memset(t, 0, sizeof(*t));
                t->added = true;
                t->seq = ++idx->stats.seq;
                t->atime_ns = now_ns;
                t->has_atime = true;
                t->bytes = (int64_t)bytes;
                t->uid = uid;
                t->opens = 1;
                size_set(idx, ino, had, old, bytes); /* INSERT OR REPLACE: a row still held for ino is replaced */
        }
        idx->stats.opens++;
        pthread_mutex_unlock(&idx->batch_lock);
}

static char *dup_name(const char *s)
{
        return s ? strdup(s) : NULL;
}

void kidx_add_dent(kidx *idx, uint64_t dir, const char *name, uint64_t ino, enum kidx_type type)
{
        char *n = dup_name(name);
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__op *op = n ? push_op(idx, OP_ADD_DENT) : NULL;
        if (op) {
                op->a = dir;
                op->b = ino;
                op->c = type;
                op->s1 = n;
                n = NULL;
        }
        pthread_mutex_unlock(&idx->batch_lock);
        free(n);
}

static void del_dent(kidx *idx, enum kidx__op_kind kind, uint64_t dir, const char *name, uint64_t ino)
{
        char *n = dup_name(name);
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__op *op = n ? push_op(idx, kind) : NULL;
        if (op) {
                op->a = dir;
                op->b = ino;
                op->s1 = n;
                n = NULL;
        }
        pthread_mutex_unlock(&idx->batch_lock);
        free(n);
}

void kidx_del_dent(kidx *idx, uint64_t dir, const char *name)
{
        del_dent(idx, OP_DEL_DENT, dir, name, 0);
}

void kidx_del_dent_of(kidx *idx, uint64_t dir, const char *name, uint64_t ino)
{
        del_dent(idx, OP_DEL_DENT_INO, dir, name, ino);
}

/* batch_lock held: the file's row goes away; a touch of it must not reach a reused inode (I4). Returns
 * the bytes the row held. */
static uint64_t drop_file_locked(kidx *idx, uint64_t ino, const struct kidx_lru_row *row)
{
        uint64_t bytes;
        bool had = size_of_row(idx, ino, row, &bytes); /* first: it may drop batch_lock */
        free(kmap_del(&idx->touches, ino));
        if (had && kmap_put(&idx->sizes, ino, KIDX__NO_ROW) == 0) {
                idx->stats.used_bytes -= bytes;
                idx->stats.files--;
        }
        return had ? bytes : 0;
}

void kidx_del_file(kidx *idx, uint64_t ino)
{
        pthread_mutex_lock(&idx->batch_lock);
        drop_file_locked(idx, ino, NULL);
        struct kidx__op *op = push_op(idx, OP_DEL_FILE);
        if (op)
                op->a = ino;
        pthread_mutex_unlock(&idx->batch_lock);
}

void kidx_rename(kidx *idx, uint64_t odir, const char *oname, uint64_t ndir, const char *nname, bool exchange)
{
        char *o = dup_name(oname), *n = dup_name(nname);
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__op *op = o && n ? push_op(idx, exchange ? OP_EXCHANGE : OP_RENAME) : NULL;
        if (op) {
                op->a = odir;
                op->b = ndir;
                op->s1 = o;
                op->s2 = n;
                o = n = NULL;
        }
        pthread_mutex_unlock(&idx->batch_lock);
        free(o);
        free(n);
}

static uint64_t evicted(kidx *idx, uint64_t ino, const struct kidx_lru_row *row, const char *path, int64_t now_ns)
{
        char *p = dup_name(path);
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t bytes = drop_file_locked(idx, ino, row);
        idx->stats.evicted_files++;
        idx->stats.evicted_bytes += bytes;
        struct kidx__op *op = push_op(idx, OP_EVICTED);
        if (op) {
                op->a = ino;
                op->b = bytes;
                op->t = now_ns;
                op->s1 = p;
                p = NULL;
        }
        pthread_mutex_unlock(&idx->batch_lock);
        free(p);
        return bytes;
}

uint64_t kidx_evicted(kidx *idx, uint64_t ino, const char *path, int64_t now_ns)
{
        return evicted(idx, ino, NULL, path, now_ns);
}

uint64_t kidx_evicted_row(kidx *idx, const struct kidx_lru_row *row, const char *path, int64_t now_ns)
{
        return evicted(idx, row->ino, row, path, now_ns);
}

void kidx_evict_cancel(kidx *idx, uint64_t ino)
{
        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__op *op = push_op(idx, OP_EVICT_CANCEL);
        if (op)
                op->a = ino;
        pthread_mutex_unlock(&idx->batch_lock);
}

uint64_t kidx_used(kidx *idx)
{
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t u = idx->stats.used_bytes;
        pthread_mutex_unlock(&idx->batch_lock);
        return u;
}

static uint64_t allocated(const char *path, const char *suffix)
{
        char p[4096];
        struct stat st;
        snprintf(p, sizeof(p), "%s%s", path, suffix);
        return stat(p, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

void kidx_get_stats(kidx *idx, struct kidx_stats *ret)
{
        pthread_mutex_lock(&idx->batch_lock);
        *ret = idx->stats;
        pthread_mutex_unlock(&idx->batch_lock);
        ret->db_bytes = allocated(idx->db_path, "");
        ret->wal_bytes = allocated(idx->db_path, "-wal");
        ret->ckpt_failures = atomic_load(&idx->ckpt_failures);
}

int kidx_get_file(kidx *idx, uint64_t ino, struct kidx_file *ret)
{
        struct kidx_file f = { .ino = ino };
        struct kidx__touch t;
        bool have_touch = false;

        pthread_mutex_lock(&idx->batch_lock);
        struct kidx__touch *p = kmap_get(&idx->touches, ino);
        if (p) {
                t = *p;
                have_touch = true;
        }
        pthread_mutex_unlock(&idx->batch_lock);

        if (have_touch && t.added) {
                f.bytes = (uint64_t)(t.bytes < 0 ? 0 : t.bytes);
                f.seq = t.seq;
                f.atime_ns = t.atime_ns;
                f.opens = t.opens;
                f.bytes_read = t.bytes_read;
                f.pinned = t.pinned > 0;
                f.uid = t.uid;
                *ret = f;
                return 0;
        }

        pthread_mutex_lock(&idx->rd_lock);
        sqlite3_stmt *st = idx->rd_get;
        sqlite3_bind_int64(st, 1, (int64_t)ino);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
                f.bytes = (uint64_t)sqlite3_column_int64(st, 0);
                f.seq = (uint64_t)sqlite3_column_int64(st, 1);
                f.atime_ns = sqlite3_column_int64(st, 2);
                f.opens = (uint64_t)sqlite3_column_int64(st, 3);
                f.bytes_read = (uint64_t)sqlite3_column_int64(st, 4);
                f.pinned = sqlite3_column_int64(st, 5) != 0;
                f.uid = (uint32_t)sqlite3_column_int64(st, 6);
        }
        sqlite3_reset(st);
        pthread_mutex_unlock(&idx->rd_lock);
        if (rc != SQLITE_ROW)
                return rc == SQLITE_DONE ? -ENOENT : kidx__errno(rc);

        if (have_touch) {
                if (t.seq)
                        f.seq = t.seq;
                if (t.has_atime)
                        f.atime_ns = t.atime_ns;
                f.opens += t.opens;
                f.bytes_read += t.bytes_read;
                if (t.bytes >= 0)
                        f.bytes = (uint64_t)t.bytes;
                if (t.pinned >= 0)
                        f.pinned = t.pinned;
        }
        *ret = f;
        return 0;
}

int kidx_lru_batch(kidx *idx, uint64_t after_seq, struct kidx_lru_row *rows, size_t max)
{
        pthread_mutex_lock(&idx->db_lock);
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t gen = idx->flush_gen; /* flushes commit under db_lock: the rows are of this generation */
        pthread_mutex_unlock(&idx->batch_lock);
        sqlite3_stmt *st = idx->st[ST_LRU];
        sqlite3_bind_int64(st, 1, (int64_t)after_seq);
        sqlite3_bind_int64(st, 2, (int64_t)max);
        int n = 0, rc;
        while ((size_t)n < max && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                rows[n].ino = (uint64_t)sqlite3_column_int64(st, 0);
                rows[n].seq = (uint64_t)sqlite3_column_int64(st, 1);
                rows[n].bytes = (uint64_t)sqlite3_column_int64(st, 2);
                rows[n].atime_ns = sqlite3_column_int64(st, 3);
                rows[n].gen = gen;
                n++;
        }
        int r = (size_t)n < max && rc != SQLITE_DONE ? kidx__errno(rc) : 0;
        sqlite3_reset(st);
        pthread_mutex_unlock(&idx->db_lock);
        return r < 0 ? r : n;
}

static void candidates_clear(struct kidx_candidates *c)
{
        for (size_t i = 0; i < c->nnames; i++)
                free(c->names[i].name);
        c->n = c->nnames = 0;
}

void kidx_candidates_free(struct kidx_candidates *c)
{
        candidates_clear(c);
        free(c->v);
        free(c->names);
        memset(c, 0, sizeof(*c));
}

static int grow(void **v, size_t *cap, size_t need, size_t size)
{
        if (need <= *cap)
                return 0;
        size_t ncap = *cap ? *cap * 2 : 256;
        while (ncap < need)
                ncap *= 2;
        void *n = realloc(*v, ncap * size);
        if (!n)
                return -ENOMEM;
        *v = n;
        *cap = ncap;
        return 0;
}

int kidx_lru_candidates(kidx *idx, uint64_t after_seq, size_t max, struct kidx_candidates *c)
{
        candidates_clear(c);
        pthread_mutex_lock(&idx->db_lock);
        pthread_mutex_lock(&idx->batch_lock);
        uint64_t gen = idx->flush_gen; /* as kidx_lru_batch */
        pthread_mutex_unlock(&idx->batch_lock);
        sqlite3_stmt *st = idx->st[ST_LRU_NAMES];
        sqlite3_bind_int64(st, 1, (int64_t)after_seq);
        sqlite3_bind_int64(st, 2, (int64_t)max);
        int rc, r = 0;
        while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                uint64_t ino = (uint64_t)sqlite3_column_int64(st, 0);
                if (!c->n || c->v[c->n - 1].row.ino != ino) {
                        if ((r = grow((void **)&c->v, &c->cap, c->n + 1, sizeof(*c->v))) < 0)
                                break;
                        c->v[c->n++] = (struct kidx_candidate){
                                .row = { .ino = ino, .seq = (uint64_t)sqlite3_column_int64(st, 1),
                                         .bytes = (uint64_t)sqlite3_column_int64(st, 2),
                                         .atime_ns = sqlite3_column_int64(st, 3), .gen = gen },
                                .first = c->nnames };
                }
                if (sqlite3_column_type(st, 5) == SQLITE_NULL)
                        continue; /* a row without a name (LEFT JOIN) */
                if ((r = grow((void **)&c->names, &c->names_cap, c->nnames + 1, sizeof(*c->names))) < 0)
                        break;
                char *n = strdup((const char *)sqlite3_column_text(st, 5));
                if (!n) {
                        r = -ENOMEM;
                        break;
                }
                c->names[c->nnames++] = (struct kidx_cand_name){ (uint64_t)sqlite3_column_int64(st, 4), n };
                c->v[c->n - 1].n++;
        }
        if (r == 0 && rc != SQLITE_DONE)
                r = kidx__errno(rc);
        sqlite3_reset(st);
        pthread_mutex_unlock(&idx->db_lock);
        return r < 0 ? r : (int)c->n;
}

int kidx_names(kidx *idx, uint64_t ino, void (*fn)(void *ud, uint64_t dir, const char *name), void *ud)
{
        pthread_mutex_lock(&idx->db_lock);
        sqlite3_stmt *st = idx->st[ST_NAMES];
        sqlite3_bind_int64(st, 1, (int64_t)ino);
        int n = 0, rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
                fn(ud, (uint64_t)sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1));
                n++;
        }
        int r = rc == SQLITE_DONE ? n : kidx__errno(rc);
        sqlite3_reset(st);
        pthread_mutex_unlock(&idx->db_lock);
        return r;
}

void kidx_chain_free(struct kidx_chain *c)
{
        for (size_t i = 0; i < c->n; i++)
                free(c->names[i]);
        free(c->names);
        free(c->inos);
        memset(c, 0, sizeof(*c));
}

char *kidx_chain_path(const struct kidx_chain *c, size_t n)
{
        size_t len = 1;
        for (size_t i = 0; i < n; i++)
                len += strlen(c->names[i]) + 1;
        char *p = malloc(len), *w = p;
        if (!p)
                return NULL;
        *w = '\0';
        for (size_t i = 0; i < n; i++)
                w += sprintf(w, "%s%s", i ? "/" : "", c->names[i]);
        return p;
}

int kidx__dir_chain_locked(kidx *idx, uint64_t dir, struct kidx_chain *ret)
{
        struct kidx_chain c = { 0 };
        size_t cap = 0;
        int r = 0;
        sqlite3_stmt *st = idx->st[ST_PARENT];
        for (uint64_t cur = dir;;) {
                if (c.n > 65536) {
                        r = -ELOOP;
                        break;
                }
                sqlite3_bind_int64(st, 1, (int64_t)cur);
                int rc = sqlite3_step(st);
                if (rc != SQLITE_ROW) {
                        sqlite3_reset(st);
                        r = rc != SQLITE_DONE ? kidx__errno(rc) : cur == idx->root_ino ? 0 : -ENOENT;
                        break;
                }
                if (c.n == cap) {
                        cap = cap ? cap * 2 : 8;
                        char **nn = realloc(c.names, cap * sizeof(*nn));
                        if (nn)
                                c.names = nn;
                        uint64_t *ni = realloc(c.inos, cap * sizeof(*ni));
                        if (ni)
                                c.inos = ni;
                        if (!nn || !ni) {
                                sqlite3_reset(st);
                                r = -ENOMEM;
                                break;
                        }
                }
                c.inos[c.n] = cur;
                c.names[c.n] = strdup((const char *)sqlite3_column_text(st, 1));
                cur = (uint64_t)sqlite3_column_int64(st, 0);
                sqlite3_reset(st);
                if (!c.names[c.n++]) {
                        r = -ENOMEM;
                        break;
                }
        }
        if (r < 0) {
                kidx_chain_free(&c);
                return r;
        }
        for (size_t i = 0; i < c.n / 2; i++) { /* collected upwards: root first */
                char *n = c.names[i];
                c.names[i] = c.names[c.n - 1 - i];
                c.names[c.n - 1 - i] = n;
                uint64_t v = c.inos[i];
                c.inos[i] = c.inos[c.n - 1 - i];
                c.inos[c.n - 1 - i] = v;
        }
        *ret = c;
        return 0;
}

int kidx_dir_chain(kidx *idx, uint64_t dir, struct kidx_chain *ret)
{
        pthread_mutex_lock(&idx->db_lock);
        int r = kidx__dir_chain_locked(idx, dir, ret);
        pthread_mutex_unlock(&idx->db_lock);
        return r;
}

int kidx_dir_path(kidx *idx, uint64_t dir, char *buf, size_t size)
{
        struct kidx_chain c;
        int r = kidx_dir_chain(idx, dir, &c);
        if (r < 0)
                return r;
        char *p = kidx_chain_path(&c, c.n);
        kidx_chain_free(&c);
        if (!p)
                return -ENOMEM;
        size_t len = strlen(p);
        r = len < size ? 0 : -ENAMETOOLONG;
        if (r == 0)
                memcpy(buf, p, len + 1);
        free(p);
        return r;
}
