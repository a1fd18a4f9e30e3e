/* inode.c: the inode table.
 *
 * One struct kfs_inode per backing inode the kernel knows, keyed by the backing inode number, holding an
 * O_PATH fd so that every operation is an *at() call relative to it (no path strings). The FUSE inode
 * number is the struct's address; FUSE_ROOT_ID maps to fs->root.
 *
 * Invariants:
 *  T1. An inode is in fs->itable exactly while nlookup > 0 (the root always).
 *  T2. The kernel never forgets an inode with open files, so readers/writers > 0 implies it is in the
 *      table; eviction reads those counts under itable_lock to decide what is open.
 *  T3. alloc is the allocation last measured; kfs_inode_account_locked() tells the index, which keeps
 *      the total exact by itself (kidx I3); only that function changes it. Once alloc_told (alloc read
 *      from the index's row, or told to it), the row holds alloc, so an unchanged allocation is not told
 *      again: a warm OPEN reads nothing from the index (kidx_set_bytes must find the row's old size,
 *      an SQLite read once it was committed). Nothing else changes a live inode's row: a new row is a
 *      new inode's (create, mknod, a fetch), and reconcile writes the tree's size, which differs from
 *      alloc only where the file changed behind the mount, and then the next measure differs too.
 *  T4. An evicted inode is removed from the table at once (its backing inode number may be reused by a
 *      new file) but freed only when the kernel forgets it; unref deletes only its own table entry.
 *      So T1 holds for inodes that are not evicted.
 *  T5. An inode's fd is closed only while nobody borrows it (fd_users == 0), so a borrowed number can
 *      never be reused under its borrower; fs->fdc.open counts the inodes' open fds, and once the
 *      mount is serving, fs->fdc.idle (those neither borrowed nor impossible to reopen) is at most
 *      fs->fdc.cap.
 *
 * DESCRIPTORS. The kernel keeps inodes cached for as long as it likes (a walk of the tree, `du`, leaves
 * one per file), and real caches hold hundreds of thousands of files, while a daemon's RLIMIT_NOFILE may
 * be 4,096 and not raisable. So an inode does not own an fd for its life: it keeps the backing object's
 * file handle (name_to_handle_at; a few dozen bytes, and with the inode generation, so a reused inode
 * number never matches), and its O_PATH fd is one of a bounded set: borrowed for the length of a request
 * (kfs_inode_fd, kfs_inode_fd_put), kept open while idle in LRU order, closed past fs->fdc.cap and
 * reopened by open_by_handle_at at its next use. Reopening needs CAP_DAC_READ_SEARCH (a root daemon has
 * it) and a filesystem that exports handles (ext4, xfs, btrfs, tmpfs). Without them (a daemon that is not
 * root) the inode remembers where it was last seen instead, its directory (up, a reference held) and
 * name, which every lookup and rename through the mount refreshes, and it reopens by name from its
 * directory's fd (borrowed the same way, so a walk up the tree at worst), checking that the name still
 * holds that inode number; where it does not (the name was removed or replaced behind the mount), the
 * request gets ESTALE and the kernel looks the path up again, which refreshes the name. An idle fd whose
 * file has no name left (unlinked while open) is never closed, since no name reopens it. An evicted
 * inode gives its fd up at once (or at its last borrower's put): it lends the placeholder fs->dead_fd,
 * so the kernel's leftover inodes of evicted files hold no descriptor at all.
 *   Where refresh.c is on, every inode also remembers the directory and name the kernel last knew it by
 * (kdir, kname), holding a reference to that directory as up does: refresh.c's child reaches the file by
 * the path they make. */
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kfs.h"

int64_t kfs_now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t kfs_mono_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void wake_handler(int sig)
{
        (void)sig;
}

static void wake_install(void)
{
        struct sigaction sa = { .sa_handler = wake_handler }; /* no SA_RESTART: the wait returns EINTR */
        sigemptyset(&sa.sa_mask);
        sigaction(KFS_WAKE_SIGNAL, &sa, NULL);
}

void kfs_wake_signal_init(void)
{
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, wake_install);
}

void kfs_wake_signal_accept(void)
{
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, KFS_WAKE_SIGNAL);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
}

struct timespec kfs_deadline_ms(unsigned ms)
{
        int64_t t = kfs_now_ns() + (int64_t)ms * 1000000LL;
        return (struct timespec){ .tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL };
}

void kfs_proc_path(char *buf, size_t size, int fd)
{
        snprintf(buf, size, "/proc/self/fd/%d", fd);
}

/* ---- descriptors (DESCRIPTORS) ---- */

static void idle_unlink(struct kfs *fs, struct kfs_inode *in)
{
        if (in->idle_prev)
                in->idle_prev->idle_next = in->idle_next;
        else if (fs->fdc.idle_head == in)
                fs->fdc.idle_head = in->idle_next;
        else
                return; /* not in the list */
        if (in->idle_next)
                in->idle_next->idle_prev = in->idle_prev;
        else
                fs->fdc.idle_tail = in->idle_prev;
        in->idle_prev = in->idle_next = NULL;
        fs->fdc.idle--;
}

static void idle_push(struct kfs *fs, struct kfs_inode *in)
{
        in->idle_next = NULL;
        in->idle_prev = fs->fdc.idle_tail;
        if (fs->fdc.idle_tail)
                fs->fdc.idle_tail->idle_next = in;
        else
                fs->fdc.idle_head = in;
        fs->fdc.idle_tail = in;
        fs->fdc.idle++;
}

/* Closes idle fds, least recently used first, until at most cap are idle. Borrowed fds and those nothing
 * reopens are not counted: when they alone reached the cap, every put closed the fd just put and every
 * borrow reopened it, up the tree by name (1.2 million reopens in 20 s of test_accounting_stress.py with
 * 48 idle fds). fdc.lock held. */
static void trim_locked(struct kfs *fs)
{
        while (fs->fdc.idle > fs->fdc.cap && fs->fdc.idle_head) {
                struct kfs_inode *v = fs->fdc.idle_head;
                idle_unlink(fs, v);
                struct stat st;
                if (!v->fh && fstat(v->fd, &st) == 0 && st.st_nlink == 0 && !S_ISDIR(st.st_mode))
                        continue; /* unlinked while open: no name reopens it, it stays (DESCRIPTORS) */
                close(v->fd);
                v->fd = -1;
                fs->fdc.open--;
        }
}

bool kfs_fds_shed(struct kfs *fs)
{
        pthread_mutex_lock(&fs->fdc.lock);
        size_t before = fs->fdc.open, cap = fs->fdc.idle / 2;
        if (fs->fdc.cap > cap)
                fs->fdc.cap = cap > 16 ? cap : 16;
        trim_locked(fs);
        bool shed = fs->fdc.open < before;
        cap = fs->fdc.cap;
        pthread_mutex_unlock(&fs->fdc.lock);
        if (atomic_fetch_add(&fs->fdc.sheds, 1) == 0 || shed)
                kfs_log(LOG_WARNING, "out of descriptors (RLIMIT_NOFILE): %s; idle inodes keep at most %zu",
                        shed ? "idle ones closed" : "none idle to close", cap);
        return shed;
}

/* Whether the inode's fd may be closed while idle: something reopens it (DESCRIPTORS). */
static bool reopenable(const struct kfs_inode *in)
{
        return in->fh || in->up || in->name_lost;
}

/* A new inode's fd joins the set (fdc.open counts it; it may be closed at once if idle past the cap).
 * itable_lock held, before the inode is in the table. */
static void fd_adopt(struct kfs *fs, struct kfs_inode *in)
{
        pthread_mutex_lock(&fs->fdc.lock);
        fs->fdc.open++;
        if (reopenable(in))
                idle_push(fs, in);
        trim_locked(fs);
        pthread_mutex_unlock(&fs->fdc.lock);
}

/* The inode is freed: its fd goes. No borrower is left (the kernel forgot it; T5). */
static void fd_forget(struct kfs *fs, struct kfs_inode *in)
{
        pthread_mutex_lock(&fs->fdc.lock);
        idle_unlink(fs, in);
        if (in->fd >= 0) {
                close(in->fd);
                in->fd = -1;
                fs->fdc.open--;
        }
        pthread_mutex_unlock(&fs->fdc.lock);
        free(in->fh);
}

struct names {
        uint64_t dir[4];
        char *name[4];
        size_t n;
};

static void collect_name(void *ud, uint64_t dir, const char *name)
{
        struct names *ns = ud;
        if (ns->n < 4 && (ns->name[ns->n] = strdup(name)))
                ns->dir[ns->n++] = dir;
}

static struct kfs_inode *seen_at_locked(struct kfs *fs, struct kfs_inode *in, struct kfs_inode *dir, const char *name);

/* The name in reopens by no longer holds it: something other than a request through the mount removed or
 * replaced it (eviction keeping a file that gained a link meanwhile, a repair, a process writing to the
 * backing directory). Its names as the index knows them, by path from the root, and the first that holds
 * it becomes where it reopens (DESCRIPTORS). Returns the fd, or -ESTALE. */
static int reopen_by_index(struct kfs *fs, struct kfs_inode *in)
{
        struct names ns = { 0 };
        (void)kidx_flush(fs->idx); /* the names as of now */
        (void)kidx_names(fs->idx, in->bino, collect_name, &ns);
        int fd = -ESTALE;
        for (size_t i = 0; i < ns.n; i++) {
                struct kidx_chain ch;
                struct stat st;
                if (fd >= 0 || kidx_dir_chain(fs->idx, ns.dir[i], &ch) < 0)
                        continue;
                /* Its directory through the index's names, each checked (tree.h, R4), at any depth. A name
                 * that is gone or holds another file is no way back to it: -ESTALE, never -1 (a failed
                 * openat's), which the caller would have replied as EPERM. */
                int dfd = ktree_walk(&fs->tree, ch.n, (const char *const *)ch.names, ch.inos, O_PATH);
                kidx_chain_free(&ch);
                int f = dfd < 0 ? dfd : ktree_open(&fs->tree, dfd, ns.name[i], O_PATH, 0);
                if (dfd >= 0)
                        close(dfd);
                if (f >= 0 && (fstat(f, &st) < 0 || st.st_ino != in->bino || st.st_dev != fs->tree.dev ||
                               (st.st_mode & S_IFMT) != in->type)) {
                        close(f);
                        f = -1;
                }
                if (f < 0)
                        continue;
                fd = f;
                pthread_mutex_lock(&fs->itable_lock);
                struct kfs_inode *dir = ns.dir[i] == fs->root.bino ? &fs->root : kfs_inode_find_locked(fs, ns.dir[i]);
                struct kfs_inode *old = dir ? seen_at_locked(fs, in, dir, ns.name[i]) : NULL;
                pthread_mutex_unlock(&fs->itable_lock);
                if (old)
                        kfs_inode_unref(fs, old, 1);
        }
        for (size_t i = 0; i < ns.n; i++)
                free(ns.name[i]);
        return fd;
}

/* Reopens in's O_PATH fd from its directory and name (DESCRIPTORS). Returns it, or -errno. */
static int reopen_by_name(struct kfs *fs, struct kfs_inode *in)
{
        char name[NAME_MAX + 1];
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *up = in->up;
        if (up) {
                up->nlookup++; /* a rename may move in and drop its reference on up meanwhile */
                snprintf(name, sizeof(name), "%s", in->name);
        }
        pthread_mutex_unlock(&fs->itable_lock);
        if (!up)
                return reopen_by_index(fs, in);
        int dfd = kfs_inode_fd(fs, up), fd = -ESTALE;
        if (dfd >= 0) {
                fd = ktree_open(&fs->tree, dfd, name, O_PATH, 0);
                struct stat st;
                if (fd < 0) {
                        fd = fd == -ENOENT ? -ESTALE : fd;
                } else if (fstat(fd, &st) < 0 || st.st_ino != in->bino || st.st_dev != fs->tree.dev ||
                           (st.st_mode & S_IFMT) != in->type) {
                        close(fd); /* the name holds another file now */
                        fd = -ESTALE;
                }
        } else {
                fd = dfd;
        }
        kfs_inode_fd_put(fs, up, dfd);
        kfs_inode_unref(fs, up, 1);
        return fd == -ESTALE ? reopen_by_index(fs, in) : fd;
}

static int reopen(struct kfs *fs, struct kfs_inode *in)
{
        if (!in->fh)
                return reopen_by_name(fs, in);
        int fd = open_by_handle_at(fs->tree.root, in->fh, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        return fd >= 0 ? fd : errno == ENOENT ? -ESTALE : -errno;
}

int kfs_inode_fd(struct kfs *fs, struct kfs_inode *in)
{
        if (in == &fs->root)
                return in->fd;
        pthread_mutex_lock(&fs->fdc.lock);
        if (kfs_stale(in) && in->fd < 0) {
                pthread_mutex_unlock(&fs->fdc.lock);
                return fs->dead_fd;
        }
        if (in->fd >= 0) {
                if (in->fd_users++ == 0)
                        idle_unlink(fs, in);
                int fd = in->fd;
                pthread_mutex_unlock(&fs->fdc.lock);
                return fd;
        }
        pthread_mutex_unlock(&fs->fdc.lock);
        /* Closed while idle (only a reopenable inode is): reopen it, outside the lock. */
        int fd;
        KFS_RETRY_FDS(fs, fd, reopen(fs, in));
        if (fd < 0)
                return fd;
        atomic_fetch_add(&fs->fdc.reopens, 1);
        pthread_mutex_lock(&fs->fdc.lock);
        if (in->fd >= 0 || kfs_stale(in)) { /* another borrower reopened it first, or it was evicted */
                pthread_mutex_unlock(&fs->fdc.lock);
                close(fd);
                return kfs_inode_fd(fs, in);
        }
        in->fd = fd;
        in->fd_users = 1;
        fs->fdc.open++;
        trim_locked(fs);
        pthread_mutex_unlock(&fs->fdc.lock);
        return fd;
}

void kfs_inode_fd_put(struct kfs *fs, struct kfs_inode *in, int fd)
{
        if (in == &fs->root || fd == fs->dead_fd || fd < 0)
                return;
        pthread_mutex_lock(&fs->fdc.lock);
        if (--in->fd_users == 0) {
                if (kfs_stale(in)) { /* retired while borrowed: the last borrower closes it */
                        close(in->fd);
                        in->fd = -1;
                        fs->fdc.open--;
                } else if (reopenable(in)) {
                        idle_push(fs, in);
                        trim_locked(fs);
                }
        }
        pthread_mutex_unlock(&fs->fdc.lock);
}

void kfs_inode_fd_retire(struct kfs *fs, struct kfs_inode *in)
{
        pthread_mutex_lock(&fs->fdc.lock);
        if (in->fd >= 0 && in->fd_users == 0) {
                idle_unlink(fs, in);
                close(in->fd);
                in->fd = -1;
                fs->fdc.open--;
        }
        pthread_mutex_unlock(&fs->fdc.lock);
}

/* The file handle of the object open as fd, or NULL where handles cannot reopen it. */
static struct file_handle *handle_of(struct kfs *fs, int fd)
{
        if (!fs->fdc.handles)
                return NULL;
        struct file_handle *h = malloc(sizeof(*h) + MAX_HANDLE_SZ);
        if (!h)
                return NULL;
        h->handle_bytes = MAX_HANDLE_SZ;
        int mnt;
        if (name_to_handle_at(fd, "", h, &mnt, AT_EMPTY_PATH) < 0) {
                free(h);
                return NULL;
        }
        struct file_handle *t = realloc(h, sizeof(*h) + h->handle_bytes);
        return t ? t : h;
}

void kfs_inode_fds_init(struct kfs *fs, uint64_t files)
{
        pthread_mutex_init(&fs->fdc.lock, NULL);
        struct rlimit rl = { 1024, 1024 };
        (void)getrlimit(RLIMIT_NOFILE, &rl);
        /* Half the descriptors for the inodes; the rest for open files, the index, the rings. */
        uint64_t lim = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : (uint64_t)rl.rlim_cur;
        fs->fdc.cap = lim / 2 > 64 ? lim / 2 : 64;
        if (fs->fdc.cap > (1u << 20))
                fs->fdc.cap = 1u << 20;
        if (fs->o.inode_fds && fs->o.inode_fds < fs->fdc.cap)
                fs->fdc.cap = fs->o.inode_fds; /* -o inode_fds= (never more than the limit allows) */
        /* Reopening works here if the root's own handle opens again. */
        fs->fdc.handles = true;
        struct file_handle *h = handle_of(fs, fs->root.fd);
        fs->fdc.handles = false;
        if (!h) {
                snprintf(fs->fdc.why, sizeof(fs->fdc.why), "the backing filesystem gives no file handles (%s)",
                         strerror(errno));
        } else {
                int fd = open_by_handle_at(fs->tree.root, h, O_PATH | O_CLOEXEC);
                if (fd >= 0) {
                        close(fd);
                        fs->fdc.handles = true;
                } else {
                        snprintf(fs->fdc.why, sizeof(fs->fdc.why), "open_by_handle_at: %s%s", strerror(errno),
                                 errno == EPERM ? " (it needs CAP_DAC_READ_SEARCH)" : "");
                }
                free(h);
        }
        if (files > fs->fdc.cap)
                kfs_log(LOG_NOTICE, "keeping at most %zu of the cache's %llu files' descriptors open "
                        "(RLIMIT_NOFILE %llu); the others are reopened by %s", fs->fdc.cap,
                        (unsigned long long)files, (unsigned long long)lim,
                        fs->fdc.handles ? "file handle" : "name");
}

void kfs_names_lock(struct kfs *fs, uint64_t a, uint64_t b)
{
        size_t i = a % KFS_NAME_LOCKS, j = b % KFS_NAME_LOCKS;
        pthread_mutex_lock(&fs->name_locks[i < j ? i : j]);
        if (i != j)
                pthread_mutex_lock(&fs->name_locks[i < j ? j : i]);
}

void kfs_names_unlock(struct kfs *fs, uint64_t a, uint64_t b)
{
        size_t i = a % KFS_NAME_LOCKS, j = b % KFS_NAME_LOCKS;
        pthread_mutex_unlock(&fs->name_locks[i]);
        if (i != j)
                pthread_mutex_unlock(&fs->name_locks[j]);
}

uint64_t kfs_inode_fds_open(struct kfs *fs)
{
        pthread_mutex_lock(&fs->fdc.lock);
        uint64_t n = fs->fdc.open;
        pthread_mutex_unlock(&fs->fdc.lock);
        return n;
}

int kfs_open_errno(const char *path, int flags)
{
        int fd = open(path, flags);
        return fd < 0 ? -errno : fd;
}

int kfs_inode_open(struct kfs *fs, struct kfs_inode *in, int flags)
{
        int pfd = kfs_inode_fd(fs, in);
        if (pfd < 0)
                return pfd;
        char proc[64];
        kfs_proc_path(proc, sizeof(proc), pfd);
        int r;
        KFS_RETRY_FDS(fs, r, kfs_open_errno(proc, flags));
        kfs_inode_fd_put(fs, in, pfd);
        return r;
}

int kfs_handle_fd(struct kfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
        struct kfs_handle *h = kfs_lazy_handle(fi);
        if (!h)
                return (int)(uint32_t)fi->fh;
        int fd = atomic_load(&h->fd);
        if (fd >= 0)
                return fd;
        int nfd = kfs_inode_open(fs, kfs_inode_get(fs, ino), h->flags);
        if (nfd < 0)
                return nfd;
        if (!atomic_compare_exchange_strong(&h->fd, &fd, nfd)) { /* another request opened it first */
                close(nfd);
                return fd;
        }
        return nfd;
}

struct kfs_inode *kfs_inode_get(struct kfs *fs, fuse_ino_t ino)
{
        return ino == FUSE_ROOT_ID ? &fs->root : (struct kfs_inode *)(uintptr_t)ino;
}

struct kfs_inode *kfs_inode_find_locked(struct kfs *fs, uint64_t bino)
{
        return kmap_get(&fs->itable, bino);
}

int kfs_fstat_inode(struct kfs *fs, struct kfs_inode *in, struct stat *st)
{
        int fd = kfs_inode_fd(fs, in);
        if (fd < 0)
                return fd;
        int r = fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
        kfs_inode_fd_put(fs, in, fd);
        return r;
}

static void init_from_stat(struct kfs *fs, struct kfs_inode *in, const struct stat *st)
{
        in->bino = st->st_ino;
        in->type = st->st_mode & S_IFMT;
        in->alloc = (uint64_t)st->st_blocks * 512;
        in->size = (uint64_t)st->st_size;
        in->mtime = st->st_mtim;
        int64_t atime = (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
        if (S_ISREG(st->st_mode)) {
                struct kidx_file f;
                if (kidx_get_file(fs->idx, st->st_ino, &f) == 0) {
                        atime = f.atime_ns;
                        in->alloc = f.bytes; /* T3: the index's view, even if the tree drifted */
                        in->alloc_told = true;
                }
        } else {
                atime = (int64_t)st->st_atim.tv_sec * 1000000000LL + st->st_atim.tv_nsec;
        }
        atomic_store(&in->atime_ns, atime);
        pthread_mutex_init(&in->lock, NULL);
}

/* itable_lock held. Remembers dir/name as the name the kernel knows in by (kdir, kname: refresh.c builds
 * its path from them), where refresh.c is on. Returns the directory it was known in before, whose
 * reference the caller drops (kfs_inode_unref) once it has let the lock go, or NULL. A name removed or
 * replaced later stays until the next lookup or rename: the path then leads nowhere, or to another inode
 * number, and refresh.c drops instead. */
static struct kfs_inode *kname_set_locked(struct kfs *fs, struct kfs_inode *in, struct kfs_inode *dir,
                                          const char *name)
{
        if (!fs->refresh.wanted || in == &fs->root || !dir)
                return NULL;
        if (in->kdir == dir && in->kname && !strcmp(in->kname, name))
                return NULL; /* known so already: the lookup of a warm name allocates nothing */
        char *n = strdup(name);
        if (!n)
                dir = NULL; /* no memory: no name, which refresh.c takes as a drop */
        struct kfs_inode *old = in->kdir;
        if (dir)
                dir->nlookup++;
        in->kdir = dir;
        free(in->kname);
        in->kname = n;
        return old;
}

/* Builds in's path from the mount's root into BUF (SIZE bytes). itable_lock held. 0, or -ENOENT (a
 * directory on the way has no name), -ENAMETOOLONG. */
int kfs_inode_path_locked(struct kfs *fs, struct kfs_inode *in, char *buf, size_t size)
{
        size_t at = size;
        if (!size)
                return -ENAMETOOLONG;
        buf[--at] = 0;
        for (struct kfs_inode *i = in; i != &fs->root; i = i->kdir) {
                if (!i->kdir || !i->kname)
                        return -ENOENT;
                size_t len = strlen(i->kname) + (i->kdir != &fs->root);
                if (len > at)
                        return -ENAMETOOLONG;
                at -= len; /* "/name", or "name" right under the root */
                if (i->kdir != &fs->root)
                        buf[at] = '/';
                memcpy(buf + at + (i->kdir != &fs->root), i->kname, strlen(i->kname));
        }
        memmove(buf, buf + at, size - at);
        return 0;
}

/* itable_lock held. Remembers dir/name as where in reopens (DESCRIPTORS). Returns the directory it was
 * seen in before, whose reference the caller drops (kfs_inode_unref) once it has let the lock go. */
static struct kfs_inode *seen_at_locked(struct kfs *fs, struct kfs_inode *in, struct kfs_inode *dir, const char *name)
{
        if (fs->fdc.handles || !dir || in == &fs->root || (in->up == dir && !strcmp(in->name, name)))
                return NULL;
        char *n = strdup(name);
        if (!n)
                return NULL; /* the old name serves, or nothing does: ESTALE, and the kernel looks it up again */
        struct kfs_inode *old = in->up;
        dir->nlookup++;
        in->up = dir;
        free(in->name);
        in->name = n;
        in->name_lost = false;
        return old;
}

void kfs_inode_moved(struct kfs *fs, uint64_t bino, struct kfs_inode *dir, const char *name)
{
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *in = kfs_inode_find_locked(fs, bino);
        struct kfs_inode *kold = in ? kname_set_locked(fs, in, dir, name) : NULL;
        struct kfs_inode *old = in ? seen_at_locked(fs, in, dir, name) : NULL;
        pthread_mutex_unlock(&fs->itable_lock);
        if (old)
                kfs_inode_unref(fs, old, 1);
        if (kold)
                kfs_inode_unref(fs, kold, 1);
}

void kfs_inode_unnamed(struct kfs *fs, const struct stat *st, struct kfs_inode *dir, const char *name, int fd)
{
        if (fs->fdc.handles)
                return;
        struct kfs_inode *up = NULL;
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *in = kfs_inode_find_locked(fs, st->st_ino);
        if (in && in->up == dir && in->name && !strcmp(in->name, name)) {
                up = in->up;
                in->up = NULL;
                free(in->name);
                in->name = NULL;
                in->name_lost = st->st_nlink > 1;
        }
        /* Its last name, whichever it remembered: it keeps a descriptor (it is about to go, or is open),
         * so that its number cannot go to a new file while the kernel still knows this inode. Another
         * link: it reopens by the index's names (reopen_by_index), and holds none meanwhile. */
        if (in && st->st_nlink <= 1) {
                pthread_mutex_lock(&fs->fdc.lock);
                idle_unlink(fs, in); /* no longer reopenable: never closed while idle */
                if (in->fd < 0 && (in->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0)
                        fs->fdc.open++;
                pthread_mutex_unlock(&fs->fdc.lock);
        }
        pthread_mutex_unlock(&fs->itable_lock);
        if (up)
                kfs_inode_unref(fs, up, 1);
}

/* itable_lock held. A name that leads to the number of an inode whose last name went is a new object's:
 * the backing filesystem freed the old one and gave its number away (an inode holds no descriptor while
 * idle, DESCRIPTORS). The old struct lives on, detached, for the kernel's references to it (as an
 * evicted one does, T4); the caller makes a new one. Without this, the new file took the old one's
 * struct, marked unlinked, and none of its writes was counted (a row of 0 bytes, under inode_fds). */
/* itable_lock held. Whether in, found under st's number, is a removed object's whose number went to the
 * object st describes: its last name went (a file unlinked, a directory removed), or it is not even of
 * the same type (a removed directory's number given to a new file, whose writes then went uncounted). */
static bool reused_locked(struct kfs_inode *in, const struct stat *st)
{
        return atomic_load(&in->unlinked) || in->type != (st->st_mode & S_IFMT);
}

static struct kfs_inode *detach_reused_locked(struct kfs *fs, struct kfs_inode *in)
{
        kmap_del(&fs->itable, in->bino);
        (void)kmap_put(&fs->detached, (uint64_t)(uintptr_t)in, in); /* freed at forget or exit */
        return NULL;
}

int kfs_inode_ref(struct kfs *fs, struct kfs_inode *dir, int dirfd, const char *name, const struct stat *st, int fd,
                  struct kfs_inode **ret)
{
        struct kfs_inode *in, *old = NULL, *kold = NULL;

        pthread_mutex_lock(&fs->itable_lock);
        in = kfs_inode_find_locked(fs, st->st_ino);
        if (in && reused_locked(in, st))
                in = detach_reused_locked(fs, in);
        if (in) {
                in->nlookup++;
                kfs_dir_named(in); /* under itable_lock: ordered with prune_dir()'s check (evict/prune.c) */
                kold = kname_set_locked(fs, in, dir, name);
                old = seen_at_locked(fs, in, dir, name);
                pthread_mutex_unlock(&fs->itable_lock);
                if (old)
                        kfs_inode_unref(fs, old, 1);
                if (kold)
                        kfs_inode_unref(fs, kold, 1);
                if (fd >= 0)
                        close(fd);
                *ret = in;
                return 0;
        }
        pthread_mutex_unlock(&fs->itable_lock);

        bool by_name = fd < 0;
        struct stat check;
        if (by_name) {
                KFS_RETRY_FDS(fs, fd, ktree_open(&fs->tree, dirfd, name, O_PATH, 0));
                if (fd < 0)
                        return fd;
                if (fstatat(fd, "", &check, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 || !ktree_same(&check, st)) {
                        close(fd);
                        return -ESTALE; /* the name was replaced between stat and open: the caller retries */
                }
        }
        struct kfs_inode *n = calloc(1, sizeof(*n));
        if (!n) {
                close(fd);
                return -ENOMEM;
        }
        n->fd = fd;
        n->fh = handle_of(fs, fd);
        init_from_stat(fs, n, st);
        n->bookkeeping = S_ISREG(st->st_mode) && (!strcmp(name, KFS_NEO_SIZE_FILE) || !strcmp(name, KFS_SYCL_SIZE_FILE));
        n->nlookup = 1;
        kfs_dir_named(n);

        pthread_mutex_lock(&fs->itable_lock);
        in = kfs_inode_find_locked(fs, st->st_ino);
        if (in && reused_locked(in, st))
                in = detach_reused_locked(fs, in);
        if (in) {
                in->nlookup++; /* lost a race with another lookup of the same inode */
                kfs_dir_named(in);
                kold = kname_set_locked(fs, in, dir, name);
                old = seen_at_locked(fs, in, dir, name);
        } else if (kmap_put(&fs->itable, n->bino, n) < 0) {
                pthread_mutex_unlock(&fs->itable_lock);
                pthread_mutex_destroy(&n->lock);
                close(fd);
                free(n->fh);
                free(n);
                return -ENOMEM;
        } else {
                (void)kname_set_locked(fs, n, dir, name); /* a new inode: no old directory */
                if (!n->fh)
                        (void)seen_at_locked(fs, n, dir, name); /* a new inode: no old directory */
                fd_adopt(fs, n); /* before anyone can find it: from here the fd is the set's */
        }
        pthread_mutex_unlock(&fs->itable_lock);
        if (old)
                kfs_inode_unref(fs, old, 1);
        if (kold)
                kfs_inode_unref(fs, kold, 1);
        /* Eviction (or a repair) may have removed the file between our stat and the insert: it then found
         * no inode of ours to mark evicted, and a dentry to this one would open the removed file for as
         * long as the kernel keeps it. A removal after the insert finds it in the table and marks it. */
        bool removed = by_name && (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode)) &&
                       (fstat(fd, &check) < 0 || check.st_nlink == 0);
        if (in) {
                pthread_mutex_destroy(&n->lock);
                close(fd);
                free(n->fh);
                free(n);
                n = in;
        }
        if (removed) {
                kfs_inode_unref(fs, n, 1);
                return -ESTALE; /* the caller looks the name up again */
        }
        *ret = n;
        return 0;
}

/* A directory's stamp outlives its inode for NAMED_KEEP_NS (far longer than any grace of prune.c); the
 * map is swept of older stamps whenever it reaches NAMED_SWEEP entries. itable_lock held. */
#define NAMED_KEEP_NS (60LL * 1000000000)
#define NAMED_SWEEP 4096
static void remember_named_locked(struct kfs *fs, uint64_t ino, int64_t named)
{
        int64_t now = kfs_now_ns();
        if (named < now - NAMED_KEEP_NS)
                return;
        if (fs->named_gone.count >= NAMED_SWEEP) {
                uint64_t old[64], k;
                void *v;
                size_t n;
                do { /* no delete while iterating: collect, delete, again */
                        n = 0;
                        for (size_t pos = 0; n < 64 && kmap_next(&fs->named_gone, &pos, &k, &v);)
                                if ((int64_t)(uintptr_t)v < now - NAMED_KEEP_NS)
                                        old[n++] = k;
                        for (size_t i = 0; i < n; i++)
                                kmap_del(&fs->named_gone, old[i]);
                } while (n == 64);
                if (fs->named_gone.count >= NAMED_SWEEP)
                        return; /* all recent: the oldest names go unremembered, as before */
        }
        (void)kmap_put(&fs->named_gone, ino, (void *)(uintptr_t)named);
}

int64_t kfs_dir_named_at_locked(struct kfs *fs, const struct kfs_inode *in, uint64_t ino)
{
        int64_t at = in ? atomic_load(&in->named_ns) : 0, gone = (int64_t)(uintptr_t)kmap_get(&fs->named_gone, ino);
        return gone > at ? gone : at;
}

void kfs_inode_unref(struct kfs *fs, struct kfs_inode *in, uint64_t n)
{
        if (in == &fs->root)
                return;
        pthread_mutex_lock(&fs->itable_lock);
        in->nlookup = in->nlookup > n ? in->nlookup - n : 0;
        bool gone = in->nlookup == 0;
        if (gone && kmap_get(&fs->itable, in->bino) == in)
                kmap_del(&fs->itable, in->bino);
        else if (gone) /* an evicted inode, already detached (T4) */
                kmap_del(&fs->detached, (uint64_t)(uintptr_t)in);
        if (gone && S_ISDIR(in->type) && !kfs_stale(in) && atomic_load(&in->named_ns))
                remember_named_locked(fs, in->bino, atomic_load(&in->named_ns));
        struct kfs_inode *up = gone ? in->up : NULL, *kdir = gone ? in->kdir : NULL;
        pthread_mutex_unlock(&fs->itable_lock);
        if (gone) {
                if (fs->inode_gone)
                        fs->inode_gone(fs, in); /* its registered backing file (passthrough.c) */
                fd_forget(fs, in);
                pthread_mutex_destroy(&in->lock);
                free(in->name);
                free(in->kname);
                free(in);
        }
        if (up) /* its reference on the directory it was seen in (DESCRIPTORS) */
                kfs_inode_unref(fs, up, 1);
        if (kdir) /* and on the one the kernel knows it in */
                kfs_inode_unref(fs, kdir, 1);
}

void kfs_inode_account_locked(struct kfs *fs, struct kfs_inode *in, const struct stat *st)
{
        uint64_t now = (uint64_t)st->st_blocks * 512;
        /* Not for an evicted inode: its number may be a new file's already, whose row is not ours. */
        if (S_ISREG(in->type) && !in->unlinked && !kfs_stale(in) && (!in->alloc_told || now != in->alloc)) {
                kidx_set_bytes(fs->idx, in->bino, now);
                in->alloc_told = true;
        }
        in->alloc = now;
        in->size = (uint64_t)st->st_size;
        in->mtime = st->st_mtim;
}

void kfs_inode_table_free(struct kfs *fs)
{
        uint64_t k;
        void *v;
        kmap *maps[] = { &fs->itable, &fs->detached };
        for (int m = 0; m < 2; m++) {
                for (size_t pos = 0; kmap_next(maps[m], &pos, &k, &v);) {
                        struct kfs_inode *in = v;
                        if (in == &fs->root)
                                continue;
                        if (in->fd >= 0)
                                close(in->fd);
                        free(in->fh);
                        free(in->name);
                        free(in->kname);
                        pthread_mutex_destroy(&in->lock);
                        free(in);
                }
                kmap_free(maps[m]);
        }
        kmap_free(&fs->named_gone);
}
