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
 *  T3. alloc equals the index's bytes for this file, so kidx_set_bytes(old = alloc) keeps the used total
 *      exact; only kfs_inode_account_locked() changes it.
 *  T4. An evicted inode is removed from the table at once (its backing inode number may be reused by a
 *      new file) but freed only when the kernel forgets it; unref deletes only its own table entry.
 *      So T1 holds for inodes that are not evicted. */
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kfs.h"

int64_t kfs_now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
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

struct timespec kfs_deadline_ms(unsigned ms)
{
        int64_t t = kfs_now_ns() + (int64_t)ms * 1000000LL;
        return (struct timespec){ .tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL };
}

void kfs_proc_path(char *buf, size_t size, int fd)
{
        snprintf(buf, size, "/proc/self/fd/%d", fd);
}

int kfs_inode_open(struct kfs_inode *in, int flags)
{
        char proc[64];
        kfs_proc_path(proc, sizeof(proc), in->fd);
        int fd = open(proc, flags);
        return fd < 0 ? -errno : fd;
}

struct kfs_inode *kfs_inode_get(struct kfs *fs, fuse_ino_t ino)
{
        return ino == FUSE_ROOT_ID ? &fs->root : (struct kfs_inode *)(uintptr_t)ino;
}

struct kfs_inode *kfs_inode_find_locked(struct kfs *fs, uint64_t bino)
{
        return kmap_get(&fs->itable, bino);
}

int kfs_fstat_inode(struct kfs_inode *in, struct stat *st)
{
        return fstatat(in->fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
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
                }
        } else {
                atime = (int64_t)st->st_atim.tv_sec * 1000000000LL + st->st_atim.tv_nsec;
        }
        atomic_store(&in->atime_ns, atime);
        pthread_mutex_init(&in->lock, NULL);
}

int kfs_inode_ref(struct kfs *fs, int dirfd, const char *name, const struct stat *st, int fd,
                  struct kfs_inode **ret)
{
        struct kfs_inode *in;

        pthread_mutex_lock(&fs->itable_lock);
        in = kfs_inode_find_locked(fs, st->st_ino);
        if (in) {
                in->nlookup++;
                pthread_mutex_unlock(&fs->itable_lock);
                if (fd >= 0)
                        close(fd);
                *ret = in;
                return 0;
        }
        pthread_mutex_unlock(&fs->itable_lock);

        bool by_name = fd < 0;
        struct stat check;
        if (by_name) {
                fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        return -errno;
                if (fstatat(fd, "", &check, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 || check.st_ino != st->st_ino) {
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
        init_from_stat(fs, n, st);
        n->bookkeeping = S_ISREG(st->st_mode) && (!strcmp(name, KFS_NEO_SIZE_FILE) || !strcmp(name, KFS_SYCL_SIZE_FILE));
        n->nlookup = 1;

        pthread_mutex_lock(&fs->itable_lock);
        in = kfs_inode_find_locked(fs, st->st_ino);
        if (in) {
                in->nlookup++; /* lost a race with another lookup of the same inode */
        } else if (kmap_put(&fs->itable, n->bino, n) < 0) {
                pthread_mutex_unlock(&fs->itable_lock);
                pthread_mutex_destroy(&n->lock);
                close(fd);
                free(n);
                return -ENOMEM;
        }
        pthread_mutex_unlock(&fs->itable_lock);
        /* Eviction (or a repair) may have removed the file between our stat and the insert: it then found
         * no inode of ours to mark evicted, and a dentry to this one would open the removed file for as
         * long as the kernel keeps it. A removal after the insert finds it in the table and marks it. */
        bool removed = by_name && S_ISREG(st->st_mode) && (fstat(fd, &check) < 0 || check.st_nlink == 0);
        if (in) {
                pthread_mutex_destroy(&n->lock);
                close(fd);
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
        pthread_mutex_unlock(&fs->itable_lock);
        if (gone) {
                kfs_pt_forget(fs, in);
                close(in->fd);
                pthread_mutex_destroy(&in->lock);
                free(in);
        }
}

void kfs_inode_account_locked(struct kfs *fs, struct kfs_inode *in, const struct stat *st)
{
        uint64_t now = (uint64_t)st->st_blocks * 512;
        if (S_ISREG(in->type) && !in->unlinked)
                kidx_set_bytes(fs->idx, in->bino, in->alloc, now);
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
                        close(in->fd);
                        pthread_mutex_destroy(&in->lock);
                        free(in);
                }
                kmap_free(maps[m]);
        }
}
