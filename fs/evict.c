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
 * HOW FAR, AND BY WHOM. A write should not wait for an eviction at all. So eviction runs ahead of the
 * writes, on a thread of its own (the descent): once used plus reserved bytes pass the high mark, halfway
 * between the low watermark (default 90% of max_size) and max_size, the write that passed it kicks the
 * descent and goes on; the descent evicts down to the low watermark, batch by batch, and sleeps until the
 * next kick. A cache filled at any rate the descent keeps up with never reaches its limit, and no write
 * waits. Only a write that would cross max_size itself (the descent fell behind, or -o low_watermark=100
 * leaves no room between them) evicts in line, and only what it needs; blocked_writes counts those. A
 * descent that frees nothing and leaves the cache above the high mark (young, open or pinned files) is
 * not kicked again for the grace period (a write that has to evict in line still kicks it), so a cache
 * full of files in use is not flushed and walked on every write. Starting an eviction is costly (flush
 * the index, query it), which is why each descent goes all the way down. Running at any moment, not only
 * inside a runtime's store, the descent takes the lock a runtime reads its entries under (JAX's
 * .lockfile, runtime_lock) before it removes one of them.
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
 * GRACE. A runtime uses an entry in several steps with no file open in between (Triton: the group json,
 * then the binary it names; PoCL: program.bc at clBuildProgram, then each kernel's .so, linked by another
 * process, at the first launch, 0.3 s later here and seconds for large kernels). So an entry used within
 * the last grace_ms (default 2 s) is not chosen: the LRU walk stops at the first such file. Only a write
 * that cannot fit otherwise goes on past it, since failing that write breaks the runtime for sure; a cache
 * where that happens is smaller than what its runtimes have in flight. An operator's explicit eviction
 * (kcache evict) does not wait for the grace period either; open and pinned files always stay.
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
 * RECORDS THAT SURVIVE A CRASH. Every eviction is logged (kcache, the evictions table), and a crash must
 * not make an evicted file look lost. The log itself is batched like the rest of the index, so a batch's
 * victims are first written as intents in a transaction of their own (one commit per batch of at most
 * 64), and only then removed; each intent is fulfilled (logged as an eviction) or cancelled (the file was
 * opened meanwhile) in the ordinary batch. The reconcile after a crash logs the intents whose file is gone
 * and drops the others.
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
 * INODE REUSE. Files are keyed by inode number, and a filesystem such as ext4 gives a freed number to the
 * next new file at once. So every removal keeps an O_PATH fd on the removed inode until the index has
 * been told: a file created meanwhile cannot get its number and have its own entry dropped with the old.
 * That fd is then the file's last reference, and its close frees the blocks, which on ext4 with -o
 * discard waits for the device; the reaper thread (reap.c) does those closes, not the evicting write.
 *
 * CRASHES. Eviction unlinks first and records second. A crash in between leaves index rows for files that
 * are gone; the next mount sees the unclean flag and reconciles with the tree, so nothing is lost and
 * nothing is counted twice.
 *
 * FAIRNESS. While an eviction runs (fs->evicting), no new reservation is granted on the fast path.
 * Without this, the other writers fill each victim's space as it is freed, and the request that paid for
 * the eviction fails.
 *
 * HELPING. A write that needs room while another request's eviction runs does not wait for that whole
 * eviction (a 1 MiB write evicts 256 files of 4 KiB: 5-15 ms here, up to 29 ms with the disk busy). It
 * queues (fs->space_waiters, in arrival order) and the evictor, after every BATCH_VICTIMS files it removes,
 * grants queued requests from the room made so far, then evicts on for its own request: it goes on until
 * its own reservation fits, however much the queued ones took, so neither side can fail for the other.
 * Requests still queued when it is done evict for themselves, one at a time.
 *
 * Locks: evict_lock serializes evictions (one flush, one consistent order). space_lock guards reserved
 * and evicting, and is never held across I/O. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kfs.h"

#define LRU_BATCH 256     /* index rows read per query */
#define BATCH_VICTIMS 64  /* victims removed per hold of evict_lock (COST) */

struct name {
        uint64_t dir;
        char *name;
        bool removed; /* remove_member_locked unlinked it */
        char *path;   /* relative to the backing root, for pins and the eviction log */
};

/* One file of a unit. */
struct victim {
        uint64_t ino;
        uint64_t bytes;
        struct name *names;
        size_t nnames;
        int hold;     /* O_PATH fd kept on the removed inode until the index has been told (INODE REUSE) */
        bool lives;   /* names were removed, but the file has another the index did not know of when it
                       * was chosen (a link made since): it stays, counted, with its other names */
        bool has_row; /* chosen from row, the index's LRU order (kidx_evicted_row) */
        struct kidx_lru_row row;
};

/* A unit chosen for eviction: victims [first, first + count) of struct victims, in deletion order. */
struct vunit {
        size_t first, count;
        enum krt rt;
        char *repair;  /* bookkeeping to repair afterwards (units.c), or NULL */
};

struct victims {
        struct victim *v;
        size_t n, cap;
        struct vunit *u;
        size_t nu;
        uint64_t bytes;
};

/* A bookkeeping repair still to do (the runtime held its lock last time). */
struct kfs_repair {
        enum krt rt;
        char *dir;
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
        n[l->n] = (struct name){ .dir = dir, .name = strdup(name) };
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
        for (size_t i = 0; i < vs->nu; i++)
                free(vs->u[i].repair);
        free(vs->v);
        free(vs->u);
        memset(vs, 0, sizeof(*vs));
}

static int push_victim(struct victims *vs, struct victim *v)
{
        if (vs->n == vs->cap) {
                size_t ncap = vs->cap ? vs->cap * 2 : 64;
                struct victim *nv = realloc(vs->v, ncap * sizeof(*nv));
                if (!nv)
                        return -ENOMEM;
                vs->v = nv;
                vs->cap = ncap;
        }
        vs->v[vs->n++] = *v;
        vs->bytes += v->bytes;
        return 0;
}

static int push_unit(struct victims *vs, size_t first, enum krt rt, const char *repair)
{
        struct vunit *nu = realloc(vs->u, (vs->nu + 1) * sizeof(*nu));
        if (!nu)
                return -ENOMEM;
        vs->u = nu;
        nu[vs->nu++] = (struct vunit){ first, vs->n - first, rt, repair ? strdup(repair) : NULL };
        return 0;
}

/* Units met during one choose(): a unit is taken when the LRU walk reaches its newest member. */
struct seen {
        char *key;
        uint64_t newest;   /* the newest member's seq */
        bool done;         /* taken, or found protected */
        bool young;        /* passed over only for GRACE: a pass without it may take it */
};

struct seen_set {
        struct seen *v;      /* units of several files: few per batch */
        size_t n;
        kmap files;          /* single-file units taken, by inode: one per victim, so O(1) each */
};

static struct seen *seen_get(struct seen_set *ss, const char *key)
{
        for (size_t i = 0; i < ss->n; i++)
                if (!strcmp(ss->v[i].key, key))
                        return &ss->v[i];
        struct seen *nv = realloc(ss->v, (ss->n + 1) * sizeof(*nv));
        if (!nv)
                return NULL;
        ss->v = nv;
        nv[ss->n] = (struct seen){ strdup(key), 0, false, false };
        return nv[ss->n].key ? &nv[ss->n++] : NULL;
}

static void seen_free(struct seen_set *ss)
{
        for (size_t i = 0; i < ss->n; i++)
                free(ss->v[i].key);
        free(ss->v);
        kmap_free(&ss->files);
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
/* Turns a resolved multi-file unit into victims, if it may go now: 1 if taken, 0 if not (yet), -errno.
 * row_seq: the LRU position reached; the unit waits until that is its newest member (its recency). */
static int take_unit(struct kfs *fs, struct dircache *dc, struct kfs_unit *u, uint64_t row_seq, struct seen *sn,
                     bool grace, struct victims *vs)
{
        size_t first = vs->n;
        int64_t grace_cut = grace ? kfs_now_ns() - (int64_t)fs->o.grace_ms * 1000000 : INT64_MAX;
        uint64_t newest = 0;
        int r = 0;
        for (size_t i = 0; i < u->n && r == 0; i++) {
                struct stat st, ds;
                const char *p = u->members[i], *slash = strrchr(p, '/');
                char dir[PATH_MAX];
                snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - p) : 1, slash ? p : ".");
                if (fstatat(fs->root_fd, p, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
                    fstatat(fs->root_fd, dir, &ds, 0) < 0)
                        continue; /* gone meanwhile */
                struct kidx_file f;
                bool known = kidx_get_file(fs->idx, st.st_ino, &f) == 0;
                pthread_mutex_lock(&fs->itable_lock);
                bool open = is_open(fs, st.st_ino);
                pthread_mutex_unlock(&fs->itable_lock);
                if (open || (known && f.pinned) || kfs_pinned_path(fs, p)) {
                        sn->done = true; /* protected as a whole */
                        r = 0;
                        goto undo;
                }
                if (known && f.seq > newest)
                        newest = f.seq;
                if (known && f.atime_ns > grace_cut) {
                        sn->young = true; /* in use right now (GRACE) */
                        goto undo;
                }
                struct name *nm = calloc(1, sizeof(*nm));
                struct victim v = { .ino = st.st_ino, .bytes = known ? f.bytes : (uint64_t)st.st_blocks * 512,
                                    .names = nm, .nnames = 1, .hold = -1 };
                if (!nm || !(nm->name = strdup(slash ? slash + 1 : p)) || !(nm->path = strdup(p))) {
                        free_names(nm, nm ? 1 : 0);
                        r = -ENOMEM;
                        goto undo;
                }
                nm->dir = ds.st_ino == fs->root.bino ? fs->root.bino : ds.st_ino;
                (void)dircache_get(fs, dc, nm->dir);
                if ((r = push_victim(vs, &v)) < 0) {
                        free_names(nm, 1);
                        goto undo;
                }
        }
        sn->newest = newest;
        if (newest > row_seq || vs->n == first) {
                r = 0; /* not its newest member yet: its turn comes later in the walk */
                goto undo;
        }
        if ((r = push_unit(vs, first, u->rt, u->repair)) < 0)
                goto undo;
        sn->done = true;
        return 1;
undo:
        while (vs->n > first) {
                vs->n--;
                vs->bytes -= vs->v[vs->n].bytes;
                free_names(vs->v[vs->n].names, vs->v[vs->n].nnames);
        }
        return r;
}

/* Chooses units in LRU order, from *cursor on, until goal bytes or max_victims files are covered or the
 * LRU runs out; *cursor advances past what was looked at. */
static int choose(struct kfs *fs, struct dircache *dc, uint64_t goal, size_t max_victims, uint64_t *cursor,
                  bool grace, struct seen_set *seen, struct victims *vs)
{
        struct kidx_lru_row rows[LRU_BATCH];
        struct seen_set ss = { 0 }, *sset = seen ? seen : &ss;
        uint64_t after = *cursor;
        int64_t now = kfs_now_ns();
        int r = 0;
        while (r == 0 && vs->bytes < goal && vs->n < max_victims) {
                int n = kidx_lru_batch(fs->idx, after, rows, LRU_BATCH);
                if (n <= 0) {
                        r = n;
                        break;
                }
                for (int i = 0; r == 0 && i < n && vs->bytes < goal && vs->n < max_victims; i++) {
                        if (grace && rows[i].atime_ns > now - (int64_t)fs->o.grace_ms * 1000000) {
                                n = -1; /* LRU order is time order: everything from here on is recent (GRACE) */
                                break;
                        }
                        after = rows[i].seq;
                        pthread_mutex_lock(&fs->itable_lock);
                        bool open = is_open(fs, rows[i].ino);
                        pthread_mutex_unlock(&fs->itable_lock);
                        if (open)
                                continue;
                        struct victim v = { .ino = rows[i].ino, .bytes = rows[i].bytes, .hold = -1, .has_row = true, .row = rows[i] };
                        r = load_candidate(fs, dc, &v);
                        const char *path = v.nnames ? v.names[0].path : NULL;
                        struct kfs_unit u = { 0 };
                        if (r != 0 || !path || kfs_unit_protected(fs, path, rows[i].atime_ns, now) ||
                            (r = kfs_unit_resolve(fs, path, &u)) < 0) {
                                free_names(v.names, v.nnames);
                                kfs_unit_free(&u);
                                r = r < 0 ? r : 0;
                                continue;
                        }
                        if (u.rt == KRT_FILE) {
                                if (kmap_get(&sset->files, v.ino)) { /* taken by an earlier pass */
                                        free_names(v.names, v.nnames);
                                        kfs_unit_free(&u);
                                        continue;
                                }
                                if ((r = kmap_put(&sset->files, v.ino, vs)) < 0) {
                                        free_names(v.names, v.nnames);
                                        kfs_unit_free(&u);
                                        continue;
                                }
                                size_t first = vs->n;
                                r = push_victim(vs, &v);
                                if (r == 0)
                                        r = push_unit(vs, first, KRT_FILE, NULL);
                                else
                                        free_names(v.names, v.nnames);
                                kfs_unit_free(&u);
                                continue;
                        }
                        free_names(v.names, v.nnames);
                        char key[PATH_MAX + 16];
                        /* A directory unit is its directory; a unit of files in a shared directory (NEO, SYCL,
                         * JAX) is its first member. */
                        bool by_dir = u.dir_unit || u.rt == KRT_TRITON;
                        snprintf(key, sizeof(key), "%d:%s", u.rt, by_dir || !u.n ? u.root : u.members[0]);
                        struct seen *sn = seen_get(sset, key);
                        if (!sn)
                                r = -ENOMEM;
                        else if (!sn->done && !(grace && sn->young) && !u.busy &&
                                 (sn->newest == 0 || rows[i].seq >= sn->newest))
                                r = take_unit(fs, dc, &u, rows[i].seq, sn, grace, vs);
                        r = r < 0 ? r : 0;
                        kfs_unit_free(&u);
                }
                if (n < 0)
                        break;
        }
        if (!seen)
                seen_free(&ss);
        *cursor = after;
        return r;
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
        /* directories (their cached listing) and live files (content rewritten by a repair) drop their
         * pages too; an evicted file only its attributes */
        nl->items[nl->n++].dir = S_ISDIR(in->type) || !atomic_load(&in->evicted);
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

/* itable_lock held. Unlinks every name of v that still is v (dirfds[i] for v->names[i]); marks the inode
 * evicted. Returns the number of names removed; *replaced: a name now holds another file (the runtime
 * stored the entry again since it was chosen). */
static size_t remove_member_locked(struct kfs *fs, struct victim *v, const int *dirfds, struct notify_list *nl,
                                   bool *replaced)
{
        size_t removed = 0;
        for (size_t i = 0; i < v->nnames; i++) {
                struct stat st;
                if (dirfds[i] < 0)
                        continue;
                kfs_names_lock(fs, v->names[i].dir, v->names[i].dir); /* no rename between check and unlink */
                int fd = openat(dirfds[i], v->names[i].name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0 || fstat(fd, &st) < 0 || st.st_ino != v->ino) {
                        kfs_names_unlock(fs, v->names[i].dir, v->names[i].dir);
                        if (fd >= 0) {
                                close(fd); /* the index is stale for this name: never remove another file */
                                *replaced = true;
                        }
                        continue;
                }
                int gone = unlinkat(dirfds[i], v->names[i].name, 0);
                kfs_names_unlock(fs, v->names[i].dir, v->names[i].dir);
                if (gone < 0) {
                        close(fd);
                        continue;
                }
                if (v->hold < 0)
                        v->hold = fd;
                else
                        close(fd);
                v->names[i].removed = true;
                removed++;
                struct stat ds;
                if (fstat(dirfds[i], &ds) == 0)
                        note_inode(fs, nl, kfs_inode_find_locked(fs, ds.st_ino));
        }
        /* A name made since the victim was chosen (link) keeps the file: it is not evicted, only the names
         * removed leave the index. Without this, the row went and the file stayed, never counted again. */
        struct stat hs;
        v->lives = removed && fstat(v->hold, &hs) == 0 && hs.st_nlink > 0;
        struct kfs_inode *in = kfs_inode_find_locked(fs, v->ino);
        if (in && removed && !v->lives) {
                atomic_store(&in->evicted, true);
                /* Our O_PATH fd would keep the unlinked inode, and its blocks, alive until the kernel
                 * forgets it, and a descriptor with them: it is closed now, or by the request that
                 * borrows it now (inode.c, T5); the inode lends the placeholder from here on. */
                kfs_inode_fd_retire(fs, in);
                kfs_pt_forget(fs, in); /* a registered backing file holds it open too */
                /* The backing filesystem may now give this inode number to a new file: lookups must
                 * find that file, not this stale inode, which lives on (detached) until it is forgotten. */
                kmap_del(&fs->itable, in->bino);
                (void)kmap_put(&fs->detached, (uint64_t)(uintptr_t)in, in); /* freed at forget or exit */
                note_inode(fs, nl, in);
        }
        return removed;
}

/* Whether eviction keeps the directory rel (relative to the backing root) even when it is empty: the root
 * of a runtime's cache, where a runtime expects it to stay. Those are the directories directly in the
 * mount's root (where kcache env and operators put each runtime's cache), the layout= directories, and
 * the roots runtimes make inside the directory they are given (kfs_runtime_root). */
static bool dir_kept(const struct kfs *fs, const char *rel)
{
        if (!strchr(rel, '/') || kfs_runtime_root(rel))
                return true;
        for (size_t i = 0; i < fs->o.nlayouts; i++)
                if (!strcmp(fs->o.layouts[i].dir, rel))
                        return true;
        return false;
}

/* Whether eviction removes the directories it empties in a unit of rt (EMPTIED DIRECTORIES): the
 * runtime's descriptor says (common/runtimes.c, keeps_dirs). Not where the runtime makes a directory once
 * and then relies on it: Triton makes the key directory at lookup, and mkdir()s its temporary directory
 * inside it when it stores, seconds later (runtimes.md: never rmdir a key directory that may be in use);
 * NEO mkdirs its two levels before its rename, under its own lock; SYCL creates its directories, then its
 * O_EXCL lock file in them; the CUDA driver manages its own; Numba makes its directory when a function is
 * first compiled and stores into it when the compilation ends. */
static bool prunes(enum krt rt)
{
        return !krt_table[rt].keeps_dirs;
}

/* EMPTIED DIRECTORIES. Directories are not counted (only regular files are), but every key a runtime ever
 * stored made some (PoCL: <hash>/<build>/, Triton: <key>/), and a cache that left them behind grew its
 * backing without bound (2.6 times its limit after two PoCL runs: 1,546 empty directories). So once a
 * victim's names are gone, each directory above it that eviction emptied goes too, up to the runtime's
 * root (dir_kept), unless a request named it in the last DIR_GRACE (prune_dir). rmdir removes nothing
 * that is not empty, so a directory a runtime is filling stays; the grace is for the one it is about to
 * fill. A runtime stores by making the directory (mkdir -p: the kernel looks the existing directory up
 * again for each mkdir, LOOKUP_EXCL, and that lookup reaches the daemon), then creating its file,
 * often elsewhere (PoCL's tempfile-* in the root), then renaming it in: the rename finds the directory
 * only if nothing removed it since the mkdir. A lookup of the directory, or any lookup, create or
 * rename in it, stamps its inode (kfs_dir_named) under itable_lock, and prune_dir checks the stamp and
 * removes the directory under that lock too: either the lookup came first and the directory stays, or
 * the removal did and the mkdir makes the directory anew. A directory that stays for its stamp is looked
 * at again once the grace has passed (prune_later: the descent thread wakes for it, and every eviction
 * looks), so what a cache holds of empty directories is what eviction emptied in the last DIR_GRACE,
 * at most PRUNE_LATER_MAX of them beyond that. The removed directory's inode is marked evicted like a
 * file's: a lookup in it, or a create, answers ESTALE, and the VFS looks its path up again and finds
 * it gone. Left is a runtime that made its directory more than DIR_GRACE before it creates in it
 * without making it again: Triton (makedirs at lookup, its temporary directory seconds later), NEO
 * (under its own lock) and SYCL keep their directories for that reason (prunes()); the generic layout
 * and PoCL make theirs as they store. */
#define DIR_GRACE_MS 2000
#define PRUNE_LATER_MAX 4096

static bool descent_started_locked(struct kfs *fs);

static int64_t dir_grace_ns(const struct kfs *fs)
{
        return (int64_t)(fs->o.grace_ms > DIR_GRACE_MS ? fs->o.grace_ms : DIR_GRACE_MS) * 1000000;
}

/* evict_lock held. rel (a directory) is looked at again from due on. */
static void prune_later(struct kfs *fs, const char *rel, int64_t due)
{
        size_t i = 0;
        while (i < fs->prune.n && strcmp(fs->prune.rel[i], rel))
                i++;
        if (i == fs->prune.n) {
                if (i == PRUNE_LATER_MAX)
                        return; /* it stays, empty, until an eviction empties it again */
                char *d = strdup(rel);
                char **r = realloc(fs->prune.rel, (i + 1) * sizeof(*r));
                if (r)
                        fs->prune.rel = r;
                int64_t *t = realloc(fs->prune.due, (i + 1) * sizeof(*t));
                if (t)
                        fs->prune.due = t;
                if (!d || !r || !t) {
                        free(d);
                        return;
                }
                fs->prune.rel[i] = d;
                fs->prune.n++;
        }
        fs->prune.due[i] = due;
        int64_t next = atomic_load(&fs->prune.next);
        if (!next || due < next)
                atomic_store(&fs->prune.next, due);
        pthread_mutex_lock(&fs->space_lock);
        if (descent_started_locked(fs)) /* the descent wakes at prune.next */
                pthread_cond_signal(&fs->descent.cond);
        pthread_mutex_unlock(&fs->space_lock);
}

/* evict_lock held. Removes the directory rel if it is empty and not named within DIR_GRACE, then each
 * directory above it that this empties, up to the runtime's root (EMPTIED DIRECTORIES). */
/* Whether the directory open for reading at fd holds anything but . and .. (true on an error: a
 * directory that cannot be read is not removed). fd's offset moves; the caller closes it. */
static bool dir_has_entries(int fd)
{
        char buf[512];
        for (;;) {
                long n = syscall(SYS_getdents64, fd, buf, sizeof(buf));
                if (n <= 0)
                        return n < 0;
                for (long off = 0; off < n;) {
                        const struct dirent64 *d = (const struct dirent64 *)(buf + off);
                        if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
                                return true;
                        off += d->d_reclen;
                }
        }
}

/* first_now: the first directory goes even if named within the grace (a unit that is a directory: the
 * runtime never stores into one that exists, it makes it). */
static void prune_dir_at(struct kfs *fs, const char *dir_rel, struct notify_list *nl, bool first_now)
{
        char rel[PATH_MAX];
        if (snprintf(rel, sizeof(rel), "%s", dir_rel) >= (int)sizeof(rel))
                return;
        while (!dir_kept(fs, rel)) {
                /* Most directories that lose a file keep others: a read of their first entries says so
                 * without a lock or a path walk to the parent. */
                int fd = openat(fs->root_fd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd >= 0 && dir_has_entries(fd)) {
                        close(fd);
                        return;
                }
                if (fd < 0)
                        fd = openat(fs->root_fd, rel, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                struct stat st, ps;
                if (fd < 0 || fstat(fd, &st) < 0) {
                        if (fd >= 0)
                                close(fd);
                        return;
                }
                char *base = strrchr(rel, '/') + 1; /* dir_kept: rel has a parent below the root */
                base[-1] = '\0';
                int pfd = openat(fs->root_fd, rel, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                base[-1] = '/';
                bool gone = false;
                int64_t named = 0, now = kfs_now_ns();
                if (pfd >= 0 && fstat(pfd, &ps) == 0) {
                        pthread_mutex_lock(&fs->itable_lock);
                        struct kfs_inode *in = kfs_inode_find_locked(fs, st.st_ino);
                        named = in && !first_now ? atomic_load(&in->named_ns) : 0;
                        first_now = false;
                        if (named > now - dir_grace_ns(fs)) /* a runtime may be about to store in it */
                                in = NULL;
                        else
                                named = 0;
                        struct stat cur;
                        /* still that directory (fd holds it), and empty: rmdir says so; no rename between */
                        kfs_names_lock(fs, ps.st_ino, ps.st_ino);
                        gone = !named && fstatat(pfd, base, &cur, AT_SYMLINK_NOFOLLOW) == 0 &&
                               cur.st_ino == st.st_ino && unlinkat(pfd, base, AT_REMOVEDIR) == 0;
                        kfs_names_unlock(fs, ps.st_ino, ps.st_ino);
                        if (gone && in && in != &fs->root) {
                                atomic_store(&in->evicted, true);
                                kfs_inode_fd_retire(fs, in);
                                kmap_del(&fs->itable, in->bino);
                                (void)kmap_put(&fs->detached, (uint64_t)(uintptr_t)in, in);
                                note_inode(fs, nl, in);
                        }
                        if (gone)
                                note_inode(fs, nl, kfs_inode_find_locked(fs, ps.st_ino));
                        pthread_mutex_unlock(&fs->itable_lock);
                        if (gone) /* a runtime may have made the directory anew already */
                                kidx_del_dent_of(fs->idx, ps.st_ino, base, st.st_ino);
                }
                if (pfd >= 0)
                        close(pfd);
                close(fd);
                if (named) {
                        prune_later(fs, rel, named + dir_grace_ns(fs));
                        return;
                }
                if (!gone)
                        return;
                base[-1] = '\0';
        }
}

static void prune_dir(struct kfs *fs, const char *dir_rel, struct notify_list *nl)
{
        prune_dir_at(fs, dir_rel, nl, false);
}

/* evict_lock held. Looks again at the directories whose grace has passed (EMPTIED DIRECTORIES). */
static void prune_due(struct kfs *fs, struct notify_list *nl)
{
        int64_t now = kfs_now_ns(), next = atomic_load(&fs->prune.next);
        if (!next || next > now)
                return;
        char **due = fs->prune.n ? malloc(fs->prune.n * sizeof(*due)) : NULL;
        if (!fs->prune.n)
                atomic_store(&fs->prune.next, 0);
        if (!due)
                return;
        size_t nd = 0, kept = 0;
        next = 0;
        for (size_t i = 0; i < fs->prune.n; i++) {
                if (fs->prune.due[i] <= now) {
                        due[nd++] = fs->prune.rel[i];
                        continue;
                }
                if (!next || fs->prune.due[i] < next)
                        next = fs->prune.due[i];
                fs->prune.rel[kept] = fs->prune.rel[i];
                fs->prune.due[kept++] = fs->prune.due[i];
        }
        fs->prune.n = kept;
        atomic_store(&fs->prune.next, next);
        for (size_t i = 0; i < nd; i++) { /* named again meanwhile: back in the list */
                prune_dir(fs, due[i], nl);
                free(due[i]);
        }
        free(due);
}

static void prune_lost(struct kfs *fs, struct notify_list *nl);

/* evict_lock held. After an eviction inside a write: the directories it emptied are looked at by the
 * descent thread, not by the write (one read each, a thousand for a large write). */
static void prune_lost_soon(struct kfs *fs, struct notify_list *nl)
{
        if (!fs->prune.nlost)
                return;
        int64_t now = kfs_now_ns(), next = atomic_load(&fs->prune.next);
        pthread_mutex_lock(&fs->space_lock);
        bool thread = descent_started_locked(fs);
        if (thread) {
                if (!next || next > now)
                        atomic_store(&fs->prune.next, now);
                pthread_cond_signal(&fs->descent.cond);
        }
        pthread_mutex_unlock(&fs->space_lock);
        if (!thread)
                prune_lost(fs, nl);
}

static uint64_t path_hash(const char *p)
{
        uint64_t h = 1469598103934665603ULL; /* FNV-1a */
        for (; *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        return h ? h : 1;
}

/* evict_lock held. Looks at the directories that lost files, then forgets them. */
static void prune_lost(struct kfs *fs, struct notify_list *nl)
{
        for (size_t i = 0; i < fs->prune.nlost; i++) {
                prune_dir(fs, fs->prune.lost[i], nl);
                free(fs->prune.lost[i]);
        }
        fs->prune.nlost = 0;
        kmap_free(&fs->prune.lost_at);
        kmap_init(&fs->prune.lost_at);
}

/* evict_lock held. The directory of path (relative to the backing root) lost a file: it joins those of
 * this eviction, each once, looked at when the eviction ends (or every PRUNE_LOST_MAX of them): a descent
 * of 12,000 victims in 1,000 directories looks at 1,000. A directory that still holds a file costs one
 * read of its first entries. */
#define PRUNE_LOST_MAX 1024
static void note_emptied(struct kfs *fs, const char *path, struct notify_list *nl)
{
        const char *slash = strrchr(path, '/');
        char *dir = slash ? strndup(path, (size_t)(slash - path)) : NULL;
        if (!dir)
                return;
        uint64_t h = path_hash(dir);
        uintptr_t at = (uintptr_t)kmap_get(&fs->prune.lost_at, h);
        if (at && !strcmp(fs->prune.lost[at - 1], dir)) {
                free(dir); /* noted already */
                return;
        }
        char **n = realloc(fs->prune.lost, (fs->prune.nlost + 1) * sizeof(*n));
        if (!n) {
                prune_dir(fs, dir, nl); /* now, then */
                free(dir);
                return;
        }
        fs->prune.lost = n;
        n[fs->prune.nlost++] = dir;
        if (!at)
                (void)kmap_put(&fs->prune.lost_at, h, (void *)(uintptr_t)fs->prune.nlost);
        if (fs->prune.nlost >= PRUNE_LOST_MAX)
                prune_lost(fs, nl);
}

/* JAX (with its own size cap) reads an entry under its .lockfile's flock: exists(-cache), then open;
 * a removal in between makes the read fail (FileNotFoundError), and a -cache seen without its -atime
 * makes every later put of the key fail. So eviction takes the lock itself, without waiting, and a unit
 * whose lock is held stays for now; except for an eviction inside a write (or truncate, or open) of the
 * process that holds the lock: it is inside its own store, and no JAX read of another process is in
 * between (kfs_writer). Measurements that make room outside a request (at release, after writeback: a
 * JAX process may be in the middle of a read then) take the lock like the descent. Returns the locked
 * fd, -1 if there is no lock to take, -EWOULDBLOCK if another process holds it. */
_Thread_local pid_t kfs_writer;

static int runtime_lock(struct kfs *fs, struct dircache *dc, struct victims *vs, struct vunit *u, bool in_line)
{
        if (u->rt != KRT_JAX || !u->count || !vs->v[u->first].nnames || !vs->v[u->first].names[0].path)
                return -1;
        int dfd = dc->fd[dircache_get(fs, dc, vs->v[u->first].names[0].dir)];
        int fd = dfd < 0 ? -1 : openat(dfd, KFS_JAX_LOCK, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -1;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                return fd;
        struct stat st;
        bool writer_holds = in_line && kfs_writer && fstat(fd, &st) == 0 && kfs_flock_held_by(fs, st.st_ino, kfs_writer);
        close(fd);
        return writer_holds ? -1 : -EWOULDBLOCK;
}

/* Removes one unit: all its files in order, or none if any of them was opened since it was chosen.
 * A member found replaced (stored again since it was chosen) ends the unit there: the runtime's order
 * puts its completion marker first (PoCL's program.bc), so a re-stored entry loses nothing, and one
 * whose later members are being re-stored loses only what the store is writing again. Returns the
 * bytes freed. */
static uint64_t evict_unit(struct kfs *fs, struct dircache *dc, struct victims *vs, struct vunit *u,
                           struct notify_list *nl, bool in_line)
{
        size_t total = 0;
        for (size_t k = 0; k < u->count; k++)
                total += vs->v[u->first + k].nnames;
        int lock = runtime_lock(fs, dc, vs, u, in_line);
        int small[16], *fds = lock == -EWOULDBLOCK ? NULL : total <= 16 ? small : malloc(total * sizeof(int));
        if (!fds) { /* the runtime holds its lock: the unit stays, for now */
                for (size_t k = 0; k < u->count; k++)
                        kidx_evict_cancel(fs->idx, vs->v[u->first + k].ino);
                if (lock >= 0)
                        close(lock);
                return 0;
        }
        /* Directories resolved outside itable_lock (index queries, path walks); each name holds its own
         * duplicate, since a later cache lookup may replace an earlier slot. */
        for (size_t k = 0, j = 0; k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                for (size_t i = 0; i < v->nnames; i++, j++) {
                        int fd = v->names[i].path ? dc->fd[dircache_get(fs, dc, v->names[i].dir)] : -1;
                        fds[j] = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
                }
        }
        bool *removed = calloc(u->count ? u->count : 1, sizeof(bool));
        if (!removed) {
                for (size_t j = 0; j < total; j++)
                        if (fds[j] >= 0)
                                close(fds[j]);
                if (fds != small)
                        free(fds);
                for (size_t k = 0; k < u->count; k++)
                        kidx_evict_cancel(fs->idx, vs->v[u->first + k].ino);
                if (lock >= 0)
                        close(lock);
                return 0;
        }
        /* Victims are the least recently used files, so their names and inodes are the ones least likely
         * to be in the kernel's caches: the lookup reads them from the disk (5-20 ms on a busy disk in
         * bench/big). That happens here, outside itable_lock, which every open and lookup takes; under
         * it, remove_member_locked() looks the names up again, from the dentry cache. */
        for (size_t k = 0, j = 0; k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                for (size_t i = 0; i < v->nnames; i++, j++) {
                        struct stat st;
                        if (fds[j] >= 0)
                                (void)fstatat(fds[j], v->names[i].name, &st, AT_SYMLINK_NOFOLLOW);
                }
        }
        pthread_mutex_lock(&fs->itable_lock);
        bool open = false;
        for (size_t k = 0; k < u->count && !open; k++)
                open = is_open(fs, vs->v[u->first + k].ino);
        bool replaced = false;
        for (size_t k = 0, j = 0; !open && !replaced && k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                removed[k] = remove_member_locked(fs, v, fds + j, nl, &replaced) > 0;
                j += v->nnames;
        }
        pthread_mutex_unlock(&fs->itable_lock);
        if (lock >= 0)
                close(lock); /* releases the runtime's lock */
        for (size_t j = 0; j < total; j++)
                if (fds[j] >= 0)
                        close(fds[j]);
        if (fds != small)
                free(fds);
        uint64_t freed = 0;
        int64_t now = kfs_now_ns();
        for (size_t k = 0; k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                if (!removed[k] || v->lives) {
                        kidx_evict_cancel(fs->idx, v->ino); /* it stayed (opened meanwhile, or busy) */
                        for (size_t i = 0; i < v->nnames; i++)
                                if (v->names[i].removed)
                                        kidx_del_dent_of(fs->idx, v->names[i].dir, v->names[i].name, v->ino);
                        continue;
                }
                const char *path = v->names[0].path ? v->names[0].path : v->names[0].name;
                freed += v->has_row ? kidx_evicted_row(fs->idx, &v->row, path, now) : kidx_evicted(fs->idx, v->ino, path, now);
                for (size_t i = 0; prunes(u->rt) && i < v->nnames; i++) /* (EMPTIED DIRECTORIES) */
                        if (v->names[i].removed && v->names[i].path)
                                note_emptied(fs, v->names[i].path, nl);
                if (u->rt == KRT_PYOPENCL && k + 1 == u->count && v->nnames && v->names[0].path) {
                        /* The unit is its directory: PyOpenCL and pytools never store into an existing
                         * one (a key directory without its info is a warning and a reset; an item
                         * directory without its files, a key dead for good), so it goes with its last file. */
                        char dir[PATH_MAX];
                        char *slash;
                        if (snprintf(dir, sizeof(dir), "%s", v->names[0].path) < (int)sizeof(dir) &&
                            (slash = strrchr(dir, '/'))) {
                                *slash = '\0';
                                prune_dir_at(fs, dir, nl, true);
                        }
                }
        }
        for (size_t k = 0; k < u->count; k++) { /* the index knows now: the inode number may be reused */
                struct victim *v = &vs->v[u->first + k];
                kfs_reap(fs, v->hold, v->bytes); /* frees the blocks, off this path (reap.c) */
                v->hold = -1;
        }
        free(removed);
        return freed;
}

/* Removes dir/name (bookkeeping the daemon repairs) as eviction removes files: index, stale inode, kernel.
 * Only if the name still is fd's file: fd is the one the repair locked or wrote, and the runtime may have
 * made a new file under the name since (when NEO's repair removed config.file, a removal that raced with
 * another took the new file from under the NEO process creating it, whose create then failed). */
static void remove_noted(struct kfs *fs, int dirfd, const char *name, int fd, struct notify_list *nl)
{
        struct stat st, ds;
        if (fstat(fd, &st) < 0 || st.st_nlink == 0 || fstat(dirfd, &ds) < 0)
                return; /* gone already */
        struct victim v = { .ino = st.st_ino, .hold = -1 };
        struct name nm = { .dir = ds.st_ino, .name = (char *)name };
        v.names = &nm;
        v.nnames = 1;
        bool replaced = false;
        pthread_mutex_lock(&fs->itable_lock);
        size_t n = remove_member_locked(fs, &v, &dirfd, nl, &replaced);
        pthread_mutex_unlock(&fs->itable_lock);
        if (n) {
                kidx_del_dent_of(fs->idx, ds.st_ino, name, st.st_ino); /* the runtime may store it anew at once */
                if (!v.lives)
                        kidx_del_file(fs->idx, st.st_ino);
        }
        kfs_reap(fs, v.hold, (uint64_t)st.st_blocks * 512);
}

/* Whether a regular file counts towards a runtime's own size: NEO counts its cache binaries
 * (<hash>.cl_cache, .l0_cache, .ocloc_cache), SYCL every file but its size file and lock files. */
static bool counted(enum krt rt, const char *n)
{
        size_t l = strlen(n);
        if (rt == KRT_NEO)
                return l > 6 && !strcmp(n + l - 6, "_cache");
        return strcmp(n, KFS_SYCL_SIZE_FILE) && !(l > 5 && !strcmp(n + l - 5, ".lock"));
}

/* The runtime's own count of the cache below dfd: the sizes of its counted files, down as deep as the
 * runtime itself looks (NEO: its two levels of hash directories). */
static uint64_t tree_size(enum krt rt, int dfd, int depth)
{
        int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        uint64_t total = 0;
        struct dirent *de;
        if (!d) {
                if (fd >= 0)
                        close(fd);
                return 0;
        }
        int max_depth = rt == KRT_NEO ? 2 : 16;
        while ((de = readdir(d))) {
                struct stat st;
                const char *n = de->d_name;
                if (!strcmp(n, ".") || !strcmp(n, "..") || fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue; /* vanished meanwhile (evicted): it counts nothing */
                if (S_ISREG(st.st_mode) && counted(rt, n))
                        total += (uint64_t)st.st_size;
                else if (S_ISDIR(st.st_mode) && depth < max_depth) {
                        int c = openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (c >= 0) {
                                total += tree_size(rt, c, depth + 1);
                                close(c);
                        }
                }
        }
        closedir(d);
        return total;
}

/* itable_lock not held. fd is dir/name, which the daemon just rewrote behind the kernel's back. */
static void note_rewritten(struct kfs *fs, int fd, struct notify_list *nl)
{
        struct stat st;
        if (fstat(fd, &st) < 0)
                return;
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *in = kfs_inode_find_locked(fs, st.st_ino);
        if (in) {
                pthread_mutex_lock(&in->lock);
                kfs_inode_account_locked(fs, in, &st); /* T3: its bytes, as the index must hold them */
                in->cache_ok = false; /* size and mtime are current now: the next open keeps no pages */
                pthread_mutex_unlock(&in->lock);
        }
        note_inode(fs, nl, in);
        pthread_mutex_unlock(&fs->itable_lock);
}

/* NEO's config.file, open as fd and locked (flock) by us: its count is rewritten in place with the true
 * one, as NEO would count it. In place, not removed for NEO to recount: a NEO process opens config.file
 * before it waits for the lock, and one whose file was removed meanwhile fails its store ("Cache
 * failure"), as does a recount that meets a file evicted under it (NEO stats each file it lists). Since
 * NEO opens it before locking, its pages may be in the kernel's cache from before our write: bookkeeping
 * files are opened direct_io (kfs_inode.bookkeeping), so NEO's pread after the lock comes here. */
static void neo_rewrite(struct kfs *fs, int dfd, int fd, struct notify_list *nl)
{
        size_t v = (size_t)tree_size(KRT_NEO, dfd, 0); /* NEO's format: one native size_t */
        if (pwrite(fd, &v, sizeof(v), 0) != (ssize_t)sizeof(v))
                remove_noted(fs, dfd, KFS_NEO_SIZE_FILE, fd, nl); /* not writable: removed, NEO then recounts */
        else
                note_rewritten(fs, fd, nl);
}

/* Repairs a runtime's own size bookkeeping after its files were evicted, under the runtime's own lock
 * protocol. Returns false if the runtime holds the lock now (try again later).
 *   NEO:  rewrite config.file's count with the true one under its flock (neo_rewrite).
 *   SYCL: rewrite cache_size.txt with the true size while holding cache_size.txt.lock (created O_EXCL, as
 *         SYCL does). Rewriting, not removing: a missing file makes SYCL recount by walking a tree that
 *         eviction may be changing under it. */
static bool repair(struct kfs *fs, enum krt rt, const char *dir, struct notify_list *nl)
{
        int dfd = openat(fs->root_fd, *dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return true; /* gone: nothing to repair */
        bool done = true;
        if (rt == KRT_NEO) {
                int fd = openat(dfd, KFS_NEO_SIZE_FILE, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
                if (fd >= 0) {
                        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                                neo_rewrite(fs, dfd, fd, nl);
                        else
                                done = false;
                        close(fd); /* releases the lock */
                }
        } else if (rt == KRT_SYCL) {
                int lk = openat(dfd, KFS_SYCL_SIZE_LOCK, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0200);
                if (lk >= 0) {
                        int fd = openat(dfd, KFS_SYCL_SIZE_FILE, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
                        if (fd >= 0) {
                                char v[32];
                                int n = snprintf(v, sizeof(v), "%llu",
                                                 (unsigned long long)tree_size(KRT_SYCL, dfd, 0));
                                if (write(fd, v, (size_t)n) != n) /* a short write leaves a number SYCL rejects */
                                        remove_noted(fs, dfd, KFS_SYCL_SIZE_FILE, fd, nl);
                                else
                                        note_rewritten(fs, fd, nl);
                                close(fd);
                        }
                        close(lk);
                        unlinkat(dfd, KFS_SYCL_SIZE_LOCK, 0);
                } else {
                        done = errno != EEXIST;
                }
        }
        close(dfd);
        return done;
}

/* evict_lock held. Runs the repairs of this batch's units and the ones left over from earlier batches. */
/* The repairer. NEO's processes take config.file's flock blocking, so they queue; an attempt with
 * LOCK_NB only wins in the instant between one holder and the next, which under a busy NEO may never
 * come, and NEO's count would then stay inflated (and NEO refuse to store) for as long as it is busy.
 * So a NEO repair that found the lock held is handed to this thread, which queues for the lock like
 * NEO's own processes and, once it holds it, rewrites config.file's count under evict_lock (the lock
 * order is the flock, then evict_lock; eviction itself never waits for a flock). Stopped by
 * kfs_evict_stop(), which interrupts a wait with KFS_WAKE_SIGNAL. */

static void drop_repair_locked(struct kfs *fs, enum krt rt, const char *dir)
{
        for (size_t k = 0; k < fs->nrepairs; k++)
                if (fs->repairs[k].rt == rt && !strcmp(fs->repairs[k].dir, dir)) {
                        free(fs->repairs[k].dir);
                        fs->repairs[k] = fs->repairs[--fs->nrepairs];
                        return;
                }
}

static void *repairer_main(void *arg)
{
        struct kfs *fs = arg;
        pthread_mutex_lock(&fs->evict_lock);
        while (!fs->evict_stop) {
                char *dir = NULL;
                for (size_t k = 0; k < fs->nrepairs && !dir; k++)
                        if (fs->repairs[k].rt == KRT_NEO)
                                dir = strdup(fs->repairs[k].dir);
                if (!dir) {
                        pthread_cond_wait(&fs->repair_cond, &fs->evict_lock);
                        continue;
                }
                pthread_mutex_unlock(&fs->evict_lock);
                int dfd = openat(fs->root_fd, *dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                int fd = dfd < 0 ? -1 : openat(dfd, KFS_NEO_SIZE_FILE, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
                bool locked = fd >= 0 && flock(fd, LOCK_EX) == 0; /* queued behind NEO's processes */
                struct notify_list nl = { 0 };
                pthread_mutex_lock(&fs->evict_lock);
                if (!fs->evict_stop && (locked || fd < 0)) {
                        if (locked)
                                neo_rewrite(fs, dfd, fd, &nl);
                        drop_repair_locked(fs, KRT_NEO, dir);
                }
                pthread_mutex_unlock(&fs->evict_lock);
                notify_all(fs, &nl);
                if (fd >= 0)
                        close(fd); /* releases the flock */
                if (dfd >= 0)
                        close(dfd);
                free(dir);
                pthread_mutex_lock(&fs->evict_lock);
        }
        pthread_mutex_unlock(&fs->evict_lock);
        return NULL;
}

/* evict_lock held: a NEO repair waits; wake (or start) the repairer. */
static void repairer_kick_locked(struct kfs *fs)
{
        if (!fs->repairer_started) {
                kfs_wake_signal_init();
                fs->repairer_started = pthread_create(&fs->repairer, NULL, repairer_main, fs) == 0;
        }
        pthread_cond_signal(&fs->repair_cond);
}

void kfs_evict_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->evict_lock);
        fs->evict_stop = true;
        bool started = fs->repairer_started;
        pthread_cond_broadcast(&fs->repair_cond);
        pthread_mutex_unlock(&fs->evict_lock);
        pthread_mutex_lock(&fs->space_lock);
        fs->descent.stop = true;
        pthread_cond_broadcast(&fs->descent.cond);
        bool descending = fs->descent.started;
        fs->descent.started = false; /* no more kicks */
        pthread_mutex_unlock(&fs->space_lock);
        if (descending)
                pthread_join(fs->descent.thread, NULL);
        while (started) { /* a signal may come before the flock starts waiting: repeat until it ends */
                pthread_kill(fs->repairer, KFS_WAKE_SIGNAL);
                struct timespec ts = kfs_deadline_ms(10);
                started = pthread_timedjoin_np(fs->repairer, NULL, &ts) != 0;
        }
        fs->repairer_started = false;
}

static void repair_all(struct kfs *fs, struct victims *vs, struct notify_list *nl)
{
        for (size_t i = 0; i < vs->nu; i++) {
                if (!vs->u[i].repair)
                        continue;
                bool dup = false;
                for (size_t k = 0; k < fs->nrepairs && !dup; k++)
                        dup = fs->repairs[k].rt == vs->u[i].rt && !strcmp(fs->repairs[k].dir, vs->u[i].repair);
                struct kfs_repair *nr = dup ? NULL : realloc(fs->repairs, (fs->nrepairs + 1) * sizeof(*nr));
                if (nr) {
                        fs->repairs = nr;
                        nr[fs->nrepairs++] = (struct kfs_repair){ vs->u[i].rt, vs->u[i].repair };
                        vs->u[i].repair = NULL; /* now owned by fs->repairs */
                }
        }
        size_t keep = 0;
        bool neo = false;
        for (size_t k = 0; k < fs->nrepairs; k++) {
                if (repair(fs, fs->repairs[k].rt, fs->repairs[k].dir, nl)) {
                        free(fs->repairs[k].dir);
                } else {
                        neo |= fs->repairs[k].rt == KRT_NEO;
                        fs->repairs[keep++] = fs->repairs[k];
                }
        }
        fs->nrepairs = keep;
        if (neo && !fs->evict_stop)
                repairer_kick_locked(fs);
}

/* space_lock held. */
static bool try_reserve_locked(struct kfs *fs, uint64_t bytes);
static void descent_kick_locked(struct kfs *fs, uint64_t used, bool force);

/* A write waiting for room while another request's eviction runs (HELPING). */
struct space_wait {
        uint64_t bytes;
        bool granted;
        struct space_wait *next;
};

/* space_lock held. Grants queued writes in arrival order while they fit (HELPING). */
static void grant_waiters_locked(struct kfs *fs)
{
        bool any = false;
        while (fs->space_waiters && try_reserve_locked(fs, fs->space_waiters->bytes)) {
                fs->space_waiters->granted = true;
                atomic_fetch_add(&fs->helped_writes, 1);
                fs->space_waiters = fs->space_waiters->next;
                any = true;
        }
        if (any)
                pthread_cond_broadcast(&fs->space_cond);
}

/* evict_lock held. Removes the victims that cover goal bytes (at most max_victims), continuing the LRU
 * walk at *cursor. If they cannot cover must_free, removes nothing and fails with -ENOSPC (ALL OR
 * NOTHING). Returns the bytes freed. help: grant queued writes room as it goes (HELPING). */
static int64_t evict_batch(struct kfs *fs, uint64_t *cursor, uint64_t goal, uint64_t must_free, size_t max_victims,
                           bool grace, struct notify_list *nl, bool help, bool in_line)
{
        struct victims vs = { 0 };
        struct dircache dc = { 0 };
        struct seen_set seen = { 0 };
        uint64_t start = *cursor;
        int r = choose(fs, &dc, goal > must_free ? goal : must_free, max_victims, cursor, grace, &seen, &vs);
        if (r == 0 && vs.bytes < must_free && grace) {
                /* GRACE yields to a write that cannot fit otherwise: walk again from the same start, taking
                 * what was passed over for being young, never what this batch took already. */
                *cursor = start;
                r = choose(fs, &dc, must_free, max_victims, cursor, false, &seen, &vs);
        }
        seen_free(&seen);
        int64_t freed = 0;
        if (r < 0 || vs.bytes < must_free)
                freed = r < 0 ? r : -ENOSPC;
        if (freed >= 0 && vs.n) { /* records first: a crash after a removal must not lose its record */
                struct kidx_intent *in = calloc(vs.n, sizeof(*in));
                for (size_t i = 0; in && i < vs.n; i++)
                        in[i] = (struct kidx_intent){ vs.v[i].ino, vs.v[i].bytes,
                                                      !vs.v[i].nnames ? ""
                                                      : vs.v[i].names[0].path ? vs.v[i].names[0].path
                                                                              : vs.v[i].names[0].name };
                int e = in ? kidx_evict_intents(fs->idx, vs.n, in, kfs_now_ns()) : -ENOMEM;
                free(in);
                if (e < 0)
                        freed = e;
        }
        size_t since = 0;
        for (size_t i = 0; freed >= 0 && i < vs.nu; i++) {
                freed += (int64_t)evict_unit(fs, &dc, &vs, &vs.u[i], nl, in_line);
                if (help && (since += vs.u[i].count) >= BATCH_VICTIMS) {
                        since = 0;
                        pthread_mutex_lock(&fs->space_lock);
                        grant_waiters_locked(fs);
                        pthread_mutex_unlock(&fs->space_lock);
                }
        }
        if (freed >= 0)
                repair_all(fs, &vs, nl);
        prune_due(fs, nl);
        free_victims(&vs);
        dircache_free(&dc);
        return freed;
}

/* Evicts until used plus reserved bytes are down to target (the reserved ones are about to be used), in
 * batches of BATCH_VICTIMS, taking evict_lock for one batch at a time so that no writer waits longer
 * than one batch (COST). Continues the LRU walk at *cursor. */
static int64_t evict_down_to(struct kfs *fs, uint64_t target, uint64_t *cursor, bool grace, bool in_line)
{
        int64_t total = 0;
        for (;;) {
                struct notify_list nl = { 0 };
                pthread_mutex_lock(&fs->evict_lock);
                pthread_mutex_lock(&fs->space_lock);
                uint64_t used = kidx_used(fs->idx) + fs->reserved;
                pthread_mutex_unlock(&fs->space_lock);
                int64_t freed = used > target && !fs->evict_stop
                                        ? evict_batch(fs, cursor, used - target, 0, BATCH_VICTIMS, grace, &nl, false, in_line)
                                        : 0;
                bool done = freed <= 0;
                if (done)
                        prune_lost(fs, &nl); /* (EMPTIED DIRECTORIES) */
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

static uint64_t high_mark_bytes(struct kfs *fs)
{
        uint64_t low = low_watermark_bytes(fs);
        return low + (fs->o.max_size - low) / 2;
}

/* space_lock held. used: used plus reserved bytes. Wakes the descent if they are past the high mark and
 * it is not running already (HOW FAR). force: even within the quiet period after a descent that freed
 * nothing (a write had to evict in line: worth a look). */
static void descent_kick_locked(struct kfs *fs, uint64_t used, bool force)
{
        if (fs->descent.kicked || fs->descent.running || fs->descent.stop || used <= high_mark_bytes(fs) ||
            fs->o.low_watermark == 100 || (!force && kfs_now_ns() < fs->descent.quiet_until))
                return;
        fs->descent.kicked = true;
        if (!descent_started_locked(fs))
                fs->descent.kicked = false; /* writes that reach the limit evict in line meanwhile */
        pthread_cond_signal(&fs->descent.cond);
}

/* space_lock held: does a request of bytes fit now? Reserves it if so, and kicks the descent if that
 * takes the cache past the high mark. */
static bool try_reserve_locked(struct kfs *fs, uint64_t bytes)
{
        uint64_t used = kidx_used(fs->idx);
        if (used + fs->reserved + bytes > fs->o.max_size)
                return false;
        fs->reserved += bytes;
        descent_kick_locked(fs, used + fs->reserved, false);
        return true;
}

/* Waits for room while another request's eviction runs (HELPING). true: granted; false: that eviction
 * ended first (or none runs), and the caller must see to it itself. */
static bool wait_for_help(struct kfs *fs, uint64_t bytes)
{
        pthread_mutex_lock(&fs->space_lock);
        struct space_wait w = { .bytes = bytes };
        if (fs->evicting) {
                struct space_wait **p = &fs->space_waiters;
                while (*p)
                        p = &(*p)->next;
                *p = &w;
                while (!w.granted && fs->evicting)
                        pthread_cond_wait(&fs->space_cond, &fs->space_lock);
        }
        pthread_mutex_unlock(&fs->space_lock);
        return w.granted;
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
        atomic_fetch_add(&fs->blocked_writes, 1);

        /* Slow path. An eviction running now may grant this request room as it goes (HELPING); otherwise,
         * under evict_lock and with new reservations held back (FAIRNESS), free what this request needs,
         * all or nothing. */
        if (pthread_mutex_trylock(&fs->evict_lock) != 0) {
                if (wait_for_help(fs, bytes))
                        return 0;
                pthread_mutex_lock(&fs->evict_lock);
        }
        struct notify_list nl = { 0 };
        uint64_t cursor = 0;
        int r = 0;
        pthread_mutex_lock(&fs->space_lock);
        ok = try_reserve_locked(fs, bytes); /* an eviction before ours may have made room */
        uint64_t used = kidx_used(fs->idx), reserved = fs->reserved;
        fs->evicting = !ok;
        pthread_mutex_unlock(&fs->space_lock);
        bool evicted = false;
        if (!ok) {
                r = kidx_flush(fs->idx); /* the order must reflect every access up to now */
                /* A victim opened between its choice and its removal stays, so a batch may free less than
                 * it chose: then choose again (the opened file is now passed over), a few times at most.
                 * Room that queued writes were granted meanwhile (HELPING) is made up for by going on; after
                 * a few such rounds it stops granting, so that a stream of writers cannot keep it going. */
                for (int attempt = 0, helped = 0; r == 0 && !ok && attempt < 4;) {
                        uint64_t must = used + reserved + bytes - fs->o.max_size;
                        int64_t freed = evict_batch(fs, &cursor, must, must, SIZE_MAX, true, &nl, helped < 4, true);
                        if (freed < 0) {
                                r = (int)freed;
                        } else if ((uint64_t)freed < must) {
                                attempt++;
                                cursor = 0; /* the LRU walk again from its start */
                        } else if (helped < 4) {
                                helped++; /* queued writes took room: on for ours */
                        } else {
                                attempt++; /* room went without our granting it: bounded like the rest */
                        }
                        pthread_mutex_lock(&fs->space_lock);
                        ok = r == 0 && try_reserve_locked(fs, bytes);
                        used = kidx_used(fs->idx);
                        reserved = fs->reserved;
                        pthread_mutex_unlock(&fs->space_lock);
                }
                if (r == 0 && !ok)
                        r = -ENOSPC;
                pthread_mutex_lock(&fs->space_lock);
                grant_waiters_locked(fs); /* what is left after ours */
                fs->evicting = false;
                fs->space_waiters = NULL; /* the others see to themselves (wait_for_help) */
                pthread_cond_broadcast(&fs->space_cond);
                pthread_mutex_unlock(&fs->space_lock);
                evicted = r == 0;
        }
        prune_lost_soon(fs, &nl); /* (EMPTIED DIRECTORIES) */
        pthread_mutex_unlock(&fs->evict_lock);
        notify_all(fs, &nl);

        /* The rest, down to the low watermark, is the descent's (HOW FAR). */
        if (evicted) {
                pthread_mutex_lock(&fs->space_lock);
                descent_kick_locked(fs, kidx_used(fs->idx) + fs->reserved, true);
                pthread_mutex_unlock(&fs->space_lock);
        }
        return r;
}

void kfs_space_settle(struct kfs *fs, struct kfs_inode *in, const struct stat *st, uint64_t reserved)
{
        /* One step under space_lock: between accounting the real allocation and releasing the promise,
         * the bytes would count twice, and a concurrent check could refuse a request for nothing. */
        pthread_mutex_lock(&fs->space_lock);
        if (st)
                kfs_inode_account_locked(fs, in, st);
        fs->reserved = fs->reserved > reserved ? fs->reserved - reserved : 0;
        pthread_mutex_unlock(&fs->space_lock);
}

/* Stats in's file through fd, or through its O_PATH fd if fd is -1. */
static int stat_through(struct kfs *fs, struct kfs_inode *in, int fd, struct stat *st)
{
        return fd >= 0 ? (fstat(fd, st) < 0 ? -errno : 0) : kfs_fstat_inode(fs, in, st);
}

/* in->lock held. What st adds to the count over what the index holds of in (0 where nothing counts). */
static uint64_t growth_locked(struct kfs_inode *in, const struct stat *st)
{
        uint64_t now = (uint64_t)st->st_blocks * 512;
        return S_ISREG(in->type) && !in->unlinked && !kfs_stale(in) && now > in->alloc ? now - in->alloc : 0;
}

bool kfs_space_account_locked(struct kfs *fs, struct kfs_inode *in, const struct stat *st)
{
        if (growth_locked(in, st))
                return false;
        kfs_inode_account_locked(fs, in, st);
        return true;
}

void kfs_space_measure(struct kfs *fs, struct kfs_inode *in, int fd, uint64_t reserved)
{
        uint64_t held = reserved;
        for (int round = 0;; round++) {
                struct stat st;
                pthread_mutex_lock(&in->lock);
                bool ok = stat_through(fs, in, fd, &st) == 0;
                uint64_t grow = ok ? growth_locked(in, &st) : 0;
                /* After two rounds, or if nothing could go: counted all the same, the blocks are on the disk. */
                if (grow <= held || round == 2) {
                        if (held)
                                kfs_space_settle(fs, in, ok ? &st : NULL, held);
                        else if (ok)
                                kfs_inode_account_locked(fs, in, &st);
                        pthread_mutex_unlock(&in->lock);
                        return;
                }
                pthread_mutex_unlock(&in->lock);
                /* It grew by more than was promised (ext4's extent blocks, allocation at writeback, a
                 * shared mapping's writes): room for the rest first, as for a write. */
                if (kfs_space_reserve(fs, grow - held) == 0)
                        held = grow;
                else
                        round = 1;
        }
}

/* in_line: for a write, inside it (see runtime_lock). */
static int64_t evict_to(struct kfs *fs, uint64_t target, bool grace, bool in_line)
{
        int r = kidx_flush(fs->idx);
        if (r < 0)
                return r;
        uint64_t cursor = 0;
        return evict_down_to(fs, target, &cursor, grace, in_line);
}

int64_t kfs_evict_to(struct kfs *fs, uint64_t target, bool grace)
{
        return evict_to(fs, target, grace, false);
}

/* The descent (HOW FAR): kicked past the high mark, it evicts down to the low watermark, batch by batch
 * like any eviction, while writes go on; kfs_evict_stop() ends it between batches. A cache over its
 * limit at mount (remounted with a smaller max_size) goes down the same way. */
static void *descent_main(void *arg)
{
        struct kfs *fs = arg;
        int64_t again = 0; /* the last run left the cache above its high mark: run again then (ns) */
        unsigned fruitless = 0; /* runs in a row that freed nothing: the retry backs off, to a minute */
        pthread_mutex_lock(&fs->space_lock);
        while (!fs->descent.stop) {
                int64_t prune_at = atomic_load(&fs->prune.next); /* (EMPTIED DIRECTORIES) */
                if (!fs->descent.kicked && (again || prune_at)) {
                        int64_t wake = again && (!prune_at || again < prune_at) ? again : prune_at;
                        struct timespec until = { .tv_sec = wake / 1000000000LL, .tv_nsec = wake % 1000000000LL };
                        if (pthread_cond_timedwait(&fs->descent.cond, &fs->space_lock, &until) != ETIMEDOUT)
                                continue;
                        if (prune_at && prune_at <= kfs_now_ns()) {
                                pthread_mutex_unlock(&fs->space_lock);
                                struct notify_list nl = { 0 };
                                pthread_mutex_lock(&fs->evict_lock);
                                if (!fs->evict_stop) {
                                        prune_due(fs, &nl);
                                        prune_lost(fs, &nl);
                                }
                                pthread_mutex_unlock(&fs->evict_lock);
                                notify_all(fs, &nl);
                                pthread_mutex_lock(&fs->space_lock);
                        }
                        if (again && again <= kfs_now_ns()) {
                                again = 0;
                                fs->descent.kicked = true; /* no write needs to come for it to go on */
                        }
                        continue;
                }
                if (!fs->descent.kicked) {
                        pthread_cond_wait(&fs->descent.cond, &fs->space_lock);
                        continue;
                }
                fs->descent.kicked = false;
                fs->descent.running = true;
                pthread_mutex_unlock(&fs->space_lock);
                int64_t freed = kfs_evict_to(fs, low_watermark_bytes(fs), true);
                if (freed < 0)
                        fprintf(stderr, "kcachefs: evicting down to the low watermark failed: %s\n", strerror((int)-freed));
                atomic_fetch_add(&fs->descent.runs, 1);
                pthread_mutex_lock(&fs->space_lock);
                fs->descent.running = false;
                again = 0;
                if (kidx_used(fs->idx) + fs->reserved > high_mark_bytes(fs)) {
                        /* What is left is young (grace), open or pinned. Young files age: once the grace
                         * period has passed, the descent runs again by itself (a cache found over its
                         * limit at mount, with no writes coming, stayed over it for good). */
                        int64_t wait = (int64_t)(fs->o.grace_ms > 100 ? fs->o.grace_ms : 100) * 1000000;
                        if (freed <= 0) /* nothing could go: no write kicks it before then either */
                                fs->descent.quiet_until = kfs_now_ns() + wait;
                        fruitless = freed <= 0 ? fruitless + 1 : 0;
                        for (unsigned i = 1; i < fruitless && wait < 60000000000LL; i++)
                                wait *= 2; /* open or pinned files do not age: do not walk them every grace */
                        again = kfs_now_ns() + (wait < 60000000000LL ? wait : 60000000000LL);
                } else {
                        fruitless = 0;
                }
        }
        pthread_mutex_unlock(&fs->space_lock);
        return NULL;
}

/* space_lock held. The thread starts at its first kick: a mount that never fills its cache has none,
 * and one that cannot start it now (a tasks limit) tries again a second later. */
static bool descent_started_locked(struct kfs *fs)
{
        if (fs->descent.started)
                return true;
        int64_t now = kfs_now_ns();
        if (now < fs->descent.retry_at)
                return false;
        int e = pthread_create(&fs->descent.thread, NULL, descent_main, fs);
        fs->descent.started = e == 0;
        if (e) {
                if (!fs->descent.retry_at) /* said once */
                        fprintf(stderr, "kcachefs: no thread for background eviction yet (%s): writes that reach the "
                                        "limit evict in line\n", strerror(e));
                fs->descent.retry_at = now + 1000000000LL;
        }
        return fs->descent.started;
}

void kfs_evict_start(struct kfs *fs)
{
        pthread_mutex_lock(&fs->space_lock);
        uint64_t used = kidx_used(fs->idx);
        if (used > fs->o.max_size && fs->o.low_watermark == 100 && descent_started_locked(fs)) {
                fs->descent.kicked = true; /* over a smaller limit: down to it, even without a margin */
                pthread_cond_signal(&fs->descent.cond);
        }
        descent_kick_locked(fs, used, false);
        pthread_mutex_unlock(&fs->space_lock);
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
                int64_t freed = evict_batch(fs, &c, goal, 0, (size_t)k, false, &nl, false, false); /* an operator's */
                prune_lost(fs, &nl);
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
        /* The file's whole unit goes (a SYCL entry, a PoCL program...), with every protection. */
        struct victim v = { .ino = ino, .hold = -1 };
        struct kidx_file f;
        int r = kidx_get_file(fs->idx, ino, &f);
        if (r < 0)
                return r;
        if (f.pinned)
                return -EPERM;
        struct dircache dc = { 0 };
        struct notify_list nl = { 0 };
        struct victims vs = { 0 };
        struct kfs_unit u = { 0 };
        pthread_mutex_lock(&fs->evict_lock);
        r = kidx_flush(fs->idx);
        v.bytes = f.bytes;
        if (r == 0)
                r = load_candidate(fs, &dc, &v);
        if (r == 1)
                r = -EPERM; /* pinned by pattern */
        const char *path = v.nnames ? v.names[0].path : NULL;
        if (r == 0 && (!path || kfs_unit_protected(fs, path, f.atime_ns, kfs_now_ns())))
                r = -EPERM;
        if (r == 0)
                r = kfs_unit_resolve(fs, path, &u);
        if (r == 0 && u.busy)
                r = -EBUSY;
        if (r == 0 && u.rt == KRT_FILE) {
                r = push_victim(&vs, &v);
                if (r == 0) {
                        v.names = NULL;
                        v.nnames = 0;
                        r = push_unit(&vs, 0, KRT_FILE, NULL);
                }
        } else if (r == 0) {
                struct seen sn = { 0 };
                r = take_unit(fs, &dc, &u, UINT64_MAX, &sn, false, &vs);
                r = r == 1 ? 0 : r == 0 ? -EBUSY : r; /* 0: a member is open or pinned */
        }
        if (r == 0) {
                r = evict_unit(fs, &dc, &vs, &vs.u[0], &nl, false) || vs.bytes == 0 ? 0 : -EBUSY;
                repair_all(fs, &vs, &nl);
                prune_lost(fs, &nl);
        }
        pthread_mutex_unlock(&fs->evict_lock);
        notify_all(fs, &nl);
        free_victims(&vs);
        kfs_unit_free(&u);
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

void kfs_evict_free(struct kfs *fs)
{
        for (size_t i = 0; i < fs->prune.n; i++)
                free(fs->prune.rel[i]);
        free(fs->prune.rel);
        free(fs->prune.due);
        fs->prune.rel = NULL;
        fs->prune.due = NULL;
        fs->prune.n = 0;
        for (size_t i = 0; i < fs->prune.nlost; i++)
                free(fs->prune.lost[i]);
        free(fs->prune.lost);
        fs->prune.lost = NULL;
        fs->prune.nlost = 0;
        kmap_free(&fs->prune.lost_at);
        for (size_t k = 0; k < fs->nrepairs; k++)
                free(fs->repairs[k].dir);
        free(fs->repairs);
        fs->repairs = NULL;
        fs->nrepairs = 0;
}

int kfs_evict_for_enospc(struct kfs *fs, uint64_t bytes)
{
        /* The backing filesystem is full before our limit: free this request plus the watermark's margin. */
        uint64_t used = kidx_used(fs->idx), margin = fs->o.max_size - low_watermark_bytes(fs);
        uint64_t want = bytes > margin ? bytes : margin;
        int64_t r = evict_to(fs, used > want ? used - want : 0, true, true);
        kfs_reap_drain(fs); /* the blocks too: it is the backing filesystem that is full */
        return r < 0 ? (int)r : 0;
}
