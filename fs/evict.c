/* evict.c: keeping the cache under its limit.
 *
 * THE PROBLEM. Kernel caches of GPU runtimes are written by programs we cannot change, and read back
 * with "does the file exist? then read it". A cache that grows without bound fills the disk; a cache
 * that evicts by st_atime evicts the wrong files on noatime/relatime filesystems; a cache that deletes
 * files a program is using breaks that program. kcachefs sees every open, read and write, so it can keep
 * an exact LRU order and an exact size, and enforce the limit at the moment space is allocated.
 *
 * WHAT IS COUNTED. Used bytes are the allocated bytes (st_blocks * 512) of the regular files in the cache,
 * as the index holds them (kidx I3, inode T3). Directories, symlinks and the index itself are not counted,
 * and the mount reports zero blocks for them, so `du -sB1 MOUNT` equals `df`'s used when the cache is idle.
 *
 * WHEN EVICTION RUNS. Before anything that can allocate (write, fallocate) the operation reserves an upper
 * bound of what it may allocate (ops-io.c). If used + reserved + this request would cross max_size, this
 * file evicts first, then grants the reservation or fails the one operation with ENOSPC. Reservations make
 * concurrent writers safe: their sum is covered before any of them writes, so used bytes never exceed
 * max_size whatever runs at once. After the operation the real st_blocks replaces the estimate. ENOSPC from
 * the backing filesystem itself (a disk smaller than max_size, or shared) also evicts, then retries once.
 *
 * HOW FAR. Starting eviction is costly (flush the index, query it), so once it starts it goes down to the
 * low watermark (default 90% of max_size): a cache that is full stays writable for a while without
 * evicting on every write. The request that crossed the limit first frees what it needs itself, then
 * takes its reservation, then goes on to the watermark (it returns when the watermark is reached). If the
 * watermark cannot be reached, eviction still frees what it can.
 *
 * COST. Victims are read from the index in LRU order with a cursor, so a long eviction never re-reads
 * what it has passed. Beyond what the crossing request needs, eviction works in batches of BATCH_VICTIMS
 * and releases evict_lock between batches: another writer that needs room waits for one batch at most,
 * and writers that have room do not wait at all.
 *
 * WHAT GOES FIRST. The unit of eviction is a file (runtime-aware units, such as a whole PoCL program
 * directory, replace struct victim's single file later; the rest of this file does not change). Victims
 * are the least recently used files by the access sequence (kidx), read through the partial index
 * files_lru in batches: picking k victims among n files costs O(k log n), never a scan.
 *
 * WHAT IS NEVER EVICTED. Pinned files (the index's pinned flag, or a name matching a pin pattern), files
 * open for writing (and so the file being written), and, by default, every file open at all: a runtime
 * that has probed a file must be able to read it. With -o protect=writers, files open only for reading
 * may go (their readers keep reading the unlinked inode). Eviction only ever unlinks; it never truncates.
 *
 * ALL OR NOTHING. Victims are chosen first and removed second. If even all evictable files would not make
 * the request fit, nothing is removed and the request fails with ENOSPC: a write that cannot succeed does
 * not empty the cache on its way to failing.
 *
 * EXACTNESS. Before choosing, the index batch is flushed so the order reflects every access up to now.
 * Before unlinking a name, its backing inode number is checked against the victim's: a stale index row
 * can never remove another file. The open check and the unlink happen under itable_lock, the lock that
 * open() takes to count itself, so a file cannot be opened between the check and its removal; an open
 * that races the unlink through an old dentry finds inode->evicted and fails with ENOENT, as if it had
 * come a moment later.
 *
 * TELLING THE KERNEL. The kernel may still hold a dentry, cached attributes and a cached listing for a
 * removed name. We never use fuse_lowlevel_notify_inval_entry() for this: it takes the parent directory's
 * lock in the kernel, and a rename in that directory holds the lock while it waits for our reply. If the
 * daemon is killed at that moment, the notifying thread can never finish, keeps /dev/fuse open, and the
 * mount hangs until someone aborts the connection (we hit exactly this in the SIGKILL test). Instead we
 * send only notifications that take no lock: fuse_lowlevel_notify_inval_inode() with offset -1 on the
 * victim (attributes only) and on its parent (attributes and pages, where the kernel keeps the cached
 * listing). A stale dentry of the victim leads to its inode, which is marked evicted: getattr,
 * setattr and open answer ESTALE, on which the VFS repeats the lookup with LOOKUP_REVAL and finds the name
 * gone (stat: ENOENT; open with O_CREAT: a new file). Open handles are unaffected. Since the kernel may
 * keep such an inode cached for long, its O_PATH fd is re-pointed at an anonymous placeholder so that the
 * backing filesystem frees the blocks now, not when the kernel gets round to forgetting it.
 *
 * CRASHES. Eviction unlinks first and records second. A crash in between leaves index rows for files that
 * are gone; the next mount sees the unclean flag and reconciles with the tree, so nothing is lost and
 * nothing is counted twice.
 *
 * FAIRNESS. While an eviction runs (fs->evicting), no new reservation is granted on the fast path: every
 * request waits for evict_lock and then re-checks against the room the eviction made. Without this, the
 * other writers fill each victim's space as it is freed, and the request that paid for the eviction fails.
 *
 * Locks: evict_lock serializes evictions (one flush, one consistent order). space_lock guards reserved
 * and evicting, and is never held across I/O. */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kfs.h"

#define LRU_BATCH 256     /* index rows read per query */
#define BATCH_VICTIMS 64  /* victims removed per hold of evict_lock (COST) */

struct name {
        uint64_t dir;
        char *name;
        char *path;   /* relative to the backing root, for pins and the eviction log */
};

struct victim {
        uint64_t ino;
        uint64_t bytes;
        struct name *names;
        size_t nnames;
};

struct victims {
        struct victim *v;
        size_t n, cap;
        uint64_t bytes;
};

/* Directories of the victims of one batch: victims cluster in few directories, so each one's path is
 * read from the index and opened once per batch, not once per victim. */
#define DIRCACHE 16
struct dircache {
        uint64_t ino[DIRCACHE];
        char *path[DIRCACHE];  /* relative to the backing root; NULL: unknown to the index */
        int fd[DIRCACHE];      /* O_PATH, or -1 */
        int n, next;
};

static void dircache_free(struct dircache *c)
{
        for (int i = 0; i < c->n; i++) {
                free(c->path[i]);
                if (c->fd[i] >= 0)
                        close(c->fd[i]);
        }
        c->n = c->next = 0;
}

/* The slot of directory ino, filled on first use (round-robin replacement). */
static int dircache_get(struct kfs *fs, struct dircache *c, uint64_t ino)
{
        for (int i = 0; i < c->n; i++)
                if (c->ino[i] == ino)
                        return i;
        int i;
        if (c->n < DIRCACHE) {
                i = c->n++;
        } else {
                i = c->next;
                c->next = (c->next + 1) % DIRCACHE;
                free(c->path[i]);
                if (c->fd[i] >= 0)
                        close(c->fd[i]);
        }
        char dir[4096];
        c->ino[i] = ino;
        c->path[i] = kidx_dir_path(fs->idx, ino, dir, sizeof(dir)) == 0 ? strdup(dir) : NULL;
        c->fd[i] = c->path[i] ? openat(fs->root_fd, dir[0] ? dir : ".", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                              : -1;
        return i;
}

struct name_list {
        kidx *idx;
        struct name *names;
        size_t n;
        int err;
};

static void add_name(void *ud, uint64_t dir, const char *name)
{
        struct name_list *l = ud;
        struct name *n = realloc(l->names, (l->n + 1) * sizeof(*n));
        if (!n) {
                l->err = -ENOMEM;
                return;
        }
        l->names = n;
        n[l->n].dir = dir;
        n[l->n].name = strdup(name);
        n[l->n].path = NULL;
        if (!n[l->n].name)
                l->err = -ENOMEM;
        l->n++;
}

static void free_names(struct name *names, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                free(names[i].name);
                free(names[i].path);
        }
        free(names);
}

static void free_victims(struct victims *vs)
{
        for (size_t i = 0; i < vs->n; i++)
                free_names(vs->v[i].names, vs->v[i].nnames);
        free(vs->v);
        memset(vs, 0, sizeof(*vs));
}

bool kfs_pinned_path(const struct kfs *fs, const char *path)
{
        if (!fs->o.pins)
                return false;
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        for (char **p = fs->o.pins; *p; p++) {
                /* A pattern with a '/' matches the whole relative path, one without matches the name. */
                const char *subject = strchr(*p, '/') ? path : base;
                if (fnmatch(*p, subject, strchr(*p, '/') ? FNM_PATHNAME : 0) == 0)
                        return true;
        }
        return false;
}

static bool is_open(struct kfs *fs, uint64_t ino)
{
        struct kfs_inode *in = kfs_inode_find_locked(fs, ino);
        if (!in)
                return false;
        return in->writers > 0 || (fs->o.protect == KFS_PROTECT_OPEN && in->readers > 0);
}

/* Reads a candidate's names and paths. 0: evictable; 1: protected (pinned by pattern); -errno. */
static int load_candidate(struct kfs *fs, struct dircache *dc, struct victim *v)
{
        struct name_list l = { .idx = fs->idx };
        int r = kidx_names(fs->idx, v->ino, add_name, &l);
        if (r >= 0 && l.err)
                r = l.err;
        if (r < 0) {
                free_names(l.names, l.n);
                return r;
        }
        v->names = l.names;
        v->nnames = l.n;
        for (size_t i = 0; i < l.n; i++) {
                char *path = NULL;
                const char *dir = dc->path[dircache_get(fs, dc, l.names[i].dir)];
                if (!dir)
                        continue; /* unknown directory: this name cannot be removed (see evict_one) */
                if (asprintf(&path, "%s%s%s", dir, dir[0] ? "/" : "", l.names[i].name) < 0)
                        return -ENOMEM;
                l.names[i].path = path;
                if (kfs_pinned_path(fs, path))
                        return 1;
        }
        return 0;
}

/* Chooses victims in LRU order, from *cursor on, until goal bytes or max_victims are covered or the LRU
 * runs out; *cursor advances past what was looked at. */
static int choose(struct kfs *fs, struct dircache *dc, uint64_t goal, size_t max_victims, uint64_t *cursor,
                  struct victims *vs)
{
        struct kidx_lru_row rows[LRU_BATCH];
        uint64_t after = *cursor;
        while (vs->bytes < goal && vs->n < max_victims) {
                int n = kidx_lru_batch(fs->idx, after, rows, LRU_BATCH);
                if (n <= 0) {
                        *cursor = after;
                        return n;
                }
                for (int i = 0; i < n && vs->bytes < goal && vs->n < max_victims; i++) {
                        after = rows[i].seq;
                        pthread_mutex_lock(&fs->itable_lock);
                        bool open = is_open(fs, rows[i].ino);
                        pthread_mutex_unlock(&fs->itable_lock);
                        if (open)
                                continue;
                        struct victim v = { .ino = rows[i].ino, .bytes = rows[i].bytes };
                        int r = load_candidate(fs, dc, &v);
                        if (r != 0 || v.nnames == 0) {
                                free_names(v.names, v.nnames);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        if (vs->n == vs->cap) {
                                size_t ncap = vs->cap ? vs->cap * 2 : 64;
                                struct victim *nv = realloc(vs->v, ncap * sizeof(*nv));
                                if (!nv) {
                                        free_names(v.names, v.nnames);
                                        return -ENOMEM;
                                }
                                vs->v = nv;
                                vs->cap = ncap;
                        }
                        vs->v[vs->n++] = v;
                        vs->bytes += v.bytes;
                }
        }
        *cursor = after;
        return 0;
}

/* FUSE inodes whose cached attributes (and, for directories, listings) must be dropped once our locks
 * are released. */
struct notify_list {
        struct { fuse_ino_t ino; bool dir; } *items;
        size_t n;
};

/* itable_lock held. */
static void note_inode(struct kfs *fs, struct notify_list *nl, struct kfs_inode *in)
{
        if (!in)
                return;
        void *n = realloc(nl->items, (nl->n + 1) * sizeof(*nl->items));
        if (!n)
                return; /* the kernel then trusts its cache until the timeout: stale, never wrong data */
        nl->items = n;
        nl->items[nl->n].ino = in == &fs->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)in;
        nl->items[nl->n++].dir = S_ISDIR(in->type);
}

/* No lock of ours held. Lock-free in the kernel (attributes, and a directory's cached listing, which
 * lives in its page cache): see TELLING THE KERNEL. */
static void notify_all(struct kfs *fs, struct notify_list *nl)
{
        for (size_t i = 0; i < nl->n; i++)
                (void)fuse_lowlevel_notify_inval_inode(fs->se, nl->items[i].ino, nl->items[i].dir ? 0 : -1, 0);
        free(nl->items);
        nl->items = NULL;
        nl->n = 0;
}

/* Removes every name of one victim, unless it was opened since it was chosen. Returns bytes freed. */
static uint64_t evict_one(struct kfs *fs, struct dircache *dc, struct victim *v, struct notify_list *nl)
{
        int dirfds_small[8], *dirfds = v->nnames <= 8 ? dirfds_small : malloc(v->nnames * sizeof(int));
        if (!dirfds)
                return 0;
        /* Resolved outside itable_lock: the index query and path walk may be slow. With several names, a
         * later lookup could replace an earlier slot, so each name then holds its own duplicate. */
        bool dup = v->nnames > 1;
        for (size_t i = 0; i < v->nnames; i++) {
                int fd = v->names[i].path ? dc->fd[dircache_get(fs, dc, v->names[i].dir)] : -1;
                dirfds[i] = dup && fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : fd;
        }

        size_t removed = 0;
        pthread_mutex_lock(&fs->itable_lock);
        if (!is_open(fs, v->ino)) {
                for (size_t i = 0; i < v->nnames; i++) {
                        struct stat st;
                        if (dirfds[i] < 0 || fstatat(dirfds[i], v->names[i].name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                                continue;
                        if (st.st_ino != v->ino)
                                continue; /* the index is stale for this name: never remove another file */
                        if (unlinkat(dirfds[i], v->names[i].name, 0) < 0)
                                continue;
                        removed++;
                        struct stat ds;
                        if (fstat(dirfds[i], &ds) == 0)
                                note_inode(fs, nl, kfs_inode_find_locked(fs, ds.st_ino));
                }
                struct kfs_inode *in = kfs_inode_find_locked(fs, v->ino);
                if (in && removed) {
                        atomic_store(&in->evicted, true);
                        /* Our O_PATH fd would keep the unlinked inode, and its blocks, alive until the
                         * kernel forgets it. Point the fd number at a placeholder: atomic, so a request
                         * using in->fd concurrently sees one file or the other, never a reused number. */
                        if (dup3(fs->dead_fd, in->fd, O_CLOEXEC) < 0) {
                                /* the blocks then stay allocated until the kernel forgets the inode */
                        }
                        note_inode(fs, nl, in);
                }
        }
        pthread_mutex_unlock(&fs->itable_lock);
        for (size_t i = 0; dup && i < v->nnames; i++)
                if (dirfds[i] >= 0)
                        close(dirfds[i]);
        if (dirfds != dirfds_small)
                free(dirfds);
        if (!removed)
                return 0;
        kidx_evicted(fs->idx, v->ino, v->bytes, v->names[0].path ? v->names[0].path : v->names[0].name, kfs_now_ns());
        return v->bytes;
}

/* evict_lock held. Removes the victims that cover goal bytes (at most max_victims), continuing the LRU
 * walk at *cursor. If they cannot cover must_free, removes nothing and fails with -ENOSPC (ALL OR
 * NOTHING). Returns the bytes freed. */
static int64_t evict_batch(struct kfs *fs, uint64_t *cursor, uint64_t goal, uint64_t must_free, size_t max_victims,
                           struct notify_list *nl)
{
        struct victims vs = { 0 };
        struct dircache dc = { 0 };
        int r = choose(fs, &dc, goal > must_free ? goal : must_free, max_victims, cursor, &vs);
        int64_t freed = 0;
        if (r < 0 || vs.bytes < must_free)
                freed = r < 0 ? r : -ENOSPC;
        for (size_t i = 0; freed >= 0 && i < vs.n; i++)
                freed += (int64_t)evict_one(fs, &dc, &vs.v[i], nl);
        free_victims(&vs);
        dircache_free(&dc);
        return freed;
}

/* Evicts down to target in batches of BATCH_VICTIMS, taking evict_lock for one batch at a time so that
 * no writer waits longer than one batch (COST). Continues the LRU walk at *cursor. */
static int64_t evict_down_to(struct kfs *fs, uint64_t target, uint64_t *cursor)
{
        int64_t total = 0;
        for (;;) {
                struct notify_list nl = { 0 };
                pthread_mutex_lock(&fs->evict_lock);
                uint64_t used = kidx_used(fs->idx);
                int64_t freed = used > target ? evict_batch(fs, cursor, used - target, 0, BATCH_VICTIMS, &nl) : 0;
                pthread_mutex_unlock(&fs->evict_lock);
                notify_all(fs, &nl);
                if (freed < 0)
                        return total ? total : freed;
                total += freed;
                if (freed == 0)
                        return total; /* reached the target, or nothing more can go */
        }
}

static uint64_t low_watermark_bytes(struct kfs *fs)
{
        return fs->o.max_size / 100 * fs->o.low_watermark + fs->o.max_size % 100 * fs->o.low_watermark / 100;
}

/* space_lock held: does a request of bytes fit now? Reserves it if so. */
static bool try_reserve_locked(struct kfs *fs, uint64_t bytes)
{
        uint64_t used = kidx_used(fs->idx);
        if (used + fs->reserved + bytes > fs->o.max_size)
                return false;
        fs->reserved += bytes;
        return true;
}

int kfs_space_reserve(struct kfs *fs, uint64_t bytes)
{
        if (bytes > fs->o.max_size)
                return -ENOSPC;
        pthread_mutex_lock(&fs->space_lock);
        bool ok = !fs->evicting && try_reserve_locked(fs, bytes);
        pthread_mutex_unlock(&fs->space_lock);
        if (ok)
                return 0;

        /* Slow path. First, under evict_lock and with new reservations held back (FAIRNESS), free what this
         * request needs, all or nothing. */
        struct notify_list nl = { 0 };
        uint64_t cursor = 0;
        int r = 0;
        pthread_mutex_lock(&fs->evict_lock);
        pthread_mutex_lock(&fs->space_lock);
        ok = try_reserve_locked(fs, bytes); /* an eviction before ours may have made room */
        uint64_t used = kidx_used(fs->idx), reserved = fs->reserved;
        fs->evicting = !ok;
        pthread_mutex_unlock(&fs->space_lock);
        bool evicted = false;
        if (!ok) {
                r = kidx_flush(fs->idx); /* the order must reflect every access up to now */
                uint64_t must = used + reserved + bytes - fs->o.max_size;
                int64_t freed = r < 0 ? r : evict_batch(fs, &cursor, must, must, SIZE_MAX, &nl);
                if (freed < 0)
                        r = (int)freed;
                pthread_mutex_lock(&fs->space_lock);
                if (r == 0 && !try_reserve_locked(fs, bytes))
                        r = -ENOSPC;
                fs->evicting = false;
                pthread_mutex_unlock(&fs->space_lock);
                evicted = r == 0;
        }
        pthread_mutex_unlock(&fs->evict_lock);
        notify_all(fs, &nl);

        /* Then, with this request served and other writers free to go, on down to the low watermark. */
        if (evicted)
                evict_down_to(fs, low_watermark_bytes(fs), &cursor);
        return r;
}

void kfs_space_release(struct kfs *fs, uint64_t bytes)
{
        pthread_mutex_lock(&fs->space_lock);
        fs->reserved = fs->reserved > bytes ? fs->reserved - bytes : 0;
        pthread_mutex_unlock(&fs->space_lock);
}

int64_t kfs_evict_to(struct kfs *fs, uint64_t target)
{
        int r = kidx_flush(fs->idx);
        if (r < 0)
                return r;
        uint64_t cursor = 0;
        return evict_down_to(fs, target, &cursor);
}

int64_t kfs_evict_older(struct kfs *fs, int64_t cutoff_ns)
{
        int r = kidx_flush(fs->idx);
        if (r < 0)
                return r;
        /* The LRU order is the atime order (explicit utimensat aside), so walk it until the first file
         * accessed at or after the cutoff, a batch at a time. */
        uint64_t cursor = 0;
        int64_t total = 0;
        for (;;) {
                struct kidx_lru_row rows[BATCH_VICTIMS];
                int n = kidx_lru_batch(fs->idx, cursor, rows, BATCH_VICTIMS);
                if (n <= 0)
                        return n < 0 && !total ? n : total;
                uint64_t goal = 0;
                int k = 0;
                for (; k < n && rows[k].atime_ns < cutoff_ns; k++)
                        goal += rows[k].bytes;
                if (k == 0)
                        return total;
                struct notify_list nl = { 0 };
                uint64_t c = cursor;
                pthread_mutex_lock(&fs->evict_lock);
                int64_t freed = evict_batch(fs, &c, goal, 0, (size_t)k, &nl);
                pthread_mutex_unlock(&fs->evict_lock);
                notify_all(fs, &nl);
                if (freed < 0)
                        return total ? total : freed;
                total += freed;
                cursor = rows[k - 1].seq;
                if (k < n)
                        return total;
        }
}

int kfs_evict_ino(struct kfs *fs, uint64_t ino)
{
        struct victim v = { .ino = ino };
        struct kidx_file f;
        int r = kidx_get_file(fs->idx, ino, &f);
        if (r < 0)
                return r;
        if (f.pinned)
                return -EPERM;
        struct dircache dc = { 0 };
        struct notify_list nl = { 0 };
        pthread_mutex_lock(&fs->evict_lock);
        r = kidx_flush(fs->idx);
        v.bytes = f.bytes;
        if (r == 0)
                r = load_candidate(fs, &dc, &v);
        if (r == 1)
                r = -EPERM; /* pinned by pattern */
        if (r == 0) {
                pthread_mutex_lock(&fs->itable_lock);
                bool open = is_open(fs, ino);
                pthread_mutex_unlock(&fs->itable_lock);
                r = open ? -EBUSY : evict_one(fs, &dc, &v, &nl) ? 0 : -ENOENT;
        }
        pthread_mutex_unlock(&fs->evict_lock);
        notify_all(fs, &nl);
        free_names(v.names, v.nnames);
        dircache_free(&dc);
        return r;
}

bool kfs_inode_pinned_by_pattern(struct kfs *fs, struct kfs_inode *in)
{
        struct victim v = { .ino = in->bino };
        struct dircache dc = { 0 };
        kidx_flush(fs->idx); /* a name made a moment ago must be seen */
        int r = load_candidate(fs, &dc, &v);
        free_names(v.names, v.nnames);
        dircache_free(&dc);
        return r == 1;
}

int kfs_evict_for_enospc(struct kfs *fs, uint64_t bytes)
{
        /* The backing filesystem is full before our limit: free this request plus the watermark's margin. */
        uint64_t used = kidx_used(fs->idx), margin = fs->o.max_size - low_watermark_bytes(fs);
        uint64_t want = bytes > margin ? bytes : margin;
        int64_t r = kfs_evict_to(fs, used > want ? used - want : 0);
        return r < 0 ? (int)r : 0;
}
