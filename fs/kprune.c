/* kprune.c: the kernel forgets evicted names (FUSE_NOTIFY_PRUNE, Linux 6.18, protocol 7.45).
 *
 * WHY. An evicted file's name may keep its dentry in the kernel, and the dentry its inode, for as long as
 * the kernel likes: without memory pressure, until unmount. Each such inode is a FUSE inode in the kernel
 * (about 900 bytes of slab) and a detached struct kfs_inode here, which the daemon may free only at the
 * kernel's FORGET (inode.c, T4). So memory grew with the number of evictions, not with the cache: 400,986
 * kernel inodes for a 64 MiB cache of 10,000 files.
 *
 * WHY NOT INVAL_ENTRY. FUSE_NOTIFY_INVAL_ENTRY and NOTIFY_DELETE drop a name, but the kernel takes the
 * parent directory's lock to do it, uninterruptibly; a create or rename in that directory holds the lock
 * while it waits for this daemon's reply, and a daemon killed at that moment can never exit (evict.h,
 * TELLING THE KERNEL). FUSE_NOTIFY_PRUNE takes no directory lock: for each node id, the kernel drops the
 * dentries of that inode that nobody uses (d_prune_aliases), and a FUSE inode with none left is evicted
 * at once, which sends FORGET. A dentry in use (an open file, a process's working directory) stays, and
 * is pruned again after the last open of the evicted file closes (ops-io.c, release): a moment after,
 * since the kernel sends RELEASE before the closing process lets go of the dentry (a prune at RELEASE
 * found it still in use, every time). A thread of this file does those, LATER_MS after they are asked.
 *
 * A kernel without it answers EINVAL; the daemon then stops asking and says so once. A node id the kernel
 * no longer knows is skipped by the kernel, and one reused since for another inode loses only unused
 * dentries, which a lookup makes again: a prune never changes what a name holds. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuse-kernel.h"
#include "kfs.h"

#define PRUNE_BATCH 256
#define LATER_MS 20

static void *later_main(void *arg)
{
        struct kfs *fs = arg;
        pthread_mutex_lock(&fs->kprune.lock);
        while (!fs->kprune.stop) {
                if (!fs->kprune.n) {
                        pthread_cond_wait(&fs->kprune.cond, &fs->kprune.lock);
                        continue;
                }
                pthread_mutex_unlock(&fs->kprune.lock);
                usleep(LATER_MS * 1000); /* the closing processes let go of their dentries meanwhile */
                pthread_mutex_lock(&fs->kprune.lock);
                uint64_t *ids = fs->kprune.later;
                size_t n = fs->kprune.n;
                fs->kprune.later = NULL;
                fs->kprune.n = fs->kprune.cap = 0;
                pthread_mutex_unlock(&fs->kprune.lock);
                kfs_kprune(fs, ids, n);
                free(ids);
                pthread_mutex_lock(&fs->kprune.lock);
        }
        pthread_mutex_unlock(&fs->kprune.lock);
        return NULL;
}

void kfs_kprune_later(struct kfs *fs, uint64_t id)
{
        if (!atomic_load(&fs->kprune.on))
                return;
        pthread_mutex_lock(&fs->kprune.lock);
        if (fs->kprune.stop) { /* a RELEASE served after kfs_kprune_stop: the kernel reclaims it itself */
                pthread_mutex_unlock(&fs->kprune.lock);
                return;
        }
        if (!fs->kprune.started)
                fs->kprune.started = kfs_thread_start(&fs->kprune.thread, 0, later_main, fs) == 0;
        if (fs->kprune.n == fs->kprune.cap) {
                size_t cap = fs->kprune.cap ? fs->kprune.cap * 2 : 64;
                uint64_t *n = realloc(fs->kprune.later, cap * sizeof(*n));
                if (n) {
                        fs->kprune.later = n;
                        fs->kprune.cap = cap;
                }
        }
        if (fs->kprune.started && fs->kprune.n < fs->kprune.cap) { /* else it stays until the kernel reclaims it */
                fs->kprune.later[fs->kprune.n++] = id;
                pthread_cond_signal(&fs->kprune.cond);
        }
        pthread_mutex_unlock(&fs->kprune.lock);
}

void kfs_kprune_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->kprune.lock);
        fs->kprune.stop = true;
        bool started = fs->kprune.started;
        pthread_cond_signal(&fs->kprune.cond);
        pthread_mutex_unlock(&fs->kprune.lock);
        if (started)
                pthread_join(fs->kprune.thread, NULL);
        pthread_mutex_lock(&fs->kprune.lock); /* the rings serve RELEASEs until kfs_ring_stop */
        fs->kprune.started = false;
        free(fs->kprune.later);
        fs->kprune.later = NULL;
        fs->kprune.n = fs->kprune.cap = 0;
        pthread_mutex_unlock(&fs->kprune.lock);
}

void kfs_kprune_init(struct kfs *fs, unsigned kernel_minor)
{
        atomic_store(&fs->kprune.on, kernel_minor >= 45);
        if (kernel_minor < 45)
                snprintf(fs->kprune.why, sizeof(fs->kprune.why),
                         "the kernel's FUSE protocol is 7.%u: pruning evicted names needs 7.45 (Linux 6.18)", kernel_minor);
}

void kfs_kprune(struct kfs *fs, const uint64_t *ids, size_t n)
{
        while (n && atomic_load(&fs->kprune.on)) {
                size_t k = n < PRUNE_BATCH ? n : PRUNE_BATCH;
                struct fk_notify_prune_out body = { .count = (uint32_t)k };
                struct fk_out_header h = { .len = (uint32_t)(sizeof(h) + sizeof(body) + k * sizeof(*ids)),
                                           .error = FK_NOTIFY_PRUNE, .unique = 0 };
                struct iovec v[3] = { { &h, sizeof(h) }, { &body, sizeof(body) }, { (void *)ids, k * sizeof(*ids) } };
                ssize_t w = writev(fs->devio.fd, v, 3);
                if (w < 0 && (errno == EINVAL || errno == ENOSYS)) {
                        atomic_store(&fs->kprune.on, false);
                        snprintf(fs->kprune.why, sizeof(fs->kprune.why),
                                 "the kernel refused FUSE_NOTIFY_PRUNE (%s)", strerror(errno));
                        kfs_log(LOG_WARNING, "%s: evicted names stay in the kernel's cache until it "
                                             "reclaims them", fs->kprune.why);
                        return;
                }
                if (w >= 0)
                        atomic_fetch_add(&fs->kprune.sent, k);
                ids += k;
                n -= k;
        }
}
