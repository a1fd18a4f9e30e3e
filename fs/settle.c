/* settle.c: measuring written files again once the backing filesystem has allocated for them.
 *
 * WHY. A write is accounted from st_blocks right after it (ops-io.c), but a filesystem with delayed
 * allocation decides part of a file's allocation only at writeback, seconds later: ext4 counts delayed
 * data blocks in st_blocks at once, but allocates the blocks of a file's extent tree only when it writes
 * the data out (200 writes of 4 KiB at 8 KiB strides: one more 4 KiB block, after the daemon measured).
 * Nothing tells the daemon about writeback, so without this the index stays a block short for such files
 * until the next reconcile, and the limit is short by as much on the disk.
 *
 * HOW. Every regular file an allocating operation touched (write, fallocate, truncate) is queued here
 * once, holding a lookup reference so that its inode lives until it is measured. Once a second, the
 * settler takes the files that no one has open for writing any more, starts their writeback and waits
 * for it (sync_file_range: the data is written and its blocks allocated, without the device flush of an
 * fsync), and accounts their st_blocks, growth reserved first like a write's (so eviction makes room for
 * it, and the count stays within max_size). A file still open for writing stays queued. The flush action on
 * the mount root (kcache verify, kcache stats) settles everything queued first, writers or not, so that
 * a verify after `sync` compares settled figures.
 *
 * COST. One fstat and one sync_file_range per written file, on this thread, about a second after its
 * last writer closed it: the writeback the kernel would have started within 30 s anyway, started
 * earlier. A tmpfs backing has no writeback, and only pays the fstat.
 *
 * Locks: settle.lock guards the queue. itable_lock is taken under it (a queued file's writers); no other
 * lock of ours is held where settle.lock is taken (kfs_settle_note is called with none). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kfs.h"

#define SETTLE_MS 1000

/* Measures in after its writeback, and gives the queue's reference back. */
static void settle_one(struct kfs *fs, struct kfs_inode *in)
{
        atomic_store(&in->settle_queued, false); /* a write from now on queues it again */
        if (!kfs_stale(in)) {
                int fd = kfs_inode_open(fs, in, O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                        (void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                                                SYNC_FILE_RANGE_WAIT_AFTER);
                        close(fd);
                }
                kev_measure(fs, in, -1, 0); /* writeback's allocation, room made first */
        }
        kfs_inode_unref(fs, in, 1);
}

/* Settles the queued files (all: every one; else those without a writer). Returns how many. */
static size_t settle_some(struct kfs *fs, bool all)
{
        pthread_mutex_lock(&fs->settle.lock);
        size_t n = fs->settle.queue.count, k = 0;
        struct kfs_inode **v = n ? malloc(n * sizeof(*v)) : NULL;
        if (v) {
                uint64_t key;
                void *val;
                for (size_t pos = 0; kmap_next(&fs->settle.queue, &pos, &key, &val);) {
                        struct kfs_inode *in = val;
                        pthread_mutex_lock(&fs->itable_lock);
                        bool writing = in->writers > 0;
                        pthread_mutex_unlock(&fs->itable_lock);
                        if (all || !writing)
                                v[k++] = in;
                }
                for (size_t i = 0; i < k; i++)
                        kmap_del(&fs->settle.queue, (uint64_t)(uintptr_t)v[i]);
        }
        pthread_mutex_unlock(&fs->settle.lock);
        for (size_t i = 0; i < k; i++)
                settle_one(fs, v[i]);
        free(v);
        return k;
}

size_t kfs_settle_all(struct kfs *fs)
{
        return settle_some(fs, true);
}

static void *settler_main(void *arg)
{
        struct kfs *fs = arg;
        pthread_mutex_lock(&fs->settle.lock);
        while (!fs->settle.stop) {
                struct timespec until = kfs_deadline_ms(SETTLE_MS);
                pthread_cond_timedwait(&fs->settle.cond, &fs->settle.lock, &until);
                if (fs->settle.stop || !fs->settle.queue.count)
                        continue;
                pthread_mutex_unlock(&fs->settle.lock);
                settle_some(fs, false);
                pthread_mutex_lock(&fs->settle.lock);
        }
        pthread_mutex_unlock(&fs->settle.lock);
        return NULL;
}

void kfs_settle_note(struct kfs *fs, struct kfs_inode *in)
{
        if (!S_ISREG(in->type) || in == &fs->root || atomic_exchange(&in->settle_queued, true))
                return;
        pthread_mutex_lock(&fs->itable_lock);
        in->nlookup++; /* the queue's reference: the inode stays until it is measured (T1) */
        pthread_mutex_unlock(&fs->itable_lock);
        pthread_mutex_lock(&fs->settle.lock);
        if (fs->settle.stop || kmap_put(&fs->settle.queue, (uint64_t)(uintptr_t)in, in) < 0) {
                pthread_mutex_unlock(&fs->settle.lock);
                atomic_store(&in->settle_queued, false);
                kfs_inode_unref(fs, in, 1);
                return;
        }
        /* The thread starts with the first written file, not at mount: under a tasks limit (systemd's
         * TasksMax) a thread made at mount may be the one libfuse then cannot make. Not possible: tried
         * again a second later; meanwhile the queue waits for the flush action or the unmount. */
        int64_t now = kfs_now_ns();
        if (!fs->settle.started && now >= fs->settle.retry_at) {
                fs->settle.started = pthread_create(&fs->settle.thread, NULL, settler_main, fs) == 0;
                if (!fs->settle.started) {
                        fs->settle.retry_at = now + 1000000000LL;
                        if (!fs->settle.said)
                                fprintf(stderr, "kcachefs: warning: cannot start the settler thread yet: written "
                                                "files are measured again at kcache verify and at unmount\n");
                        fs->settle.said = true;
                }
        }
        pthread_mutex_unlock(&fs->settle.lock);
}

void kfs_settle_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->settle.lock);
        fs->settle.stop = true;
        pthread_cond_signal(&fs->settle.cond);
        bool started = fs->settle.started;
        pthread_mutex_unlock(&fs->settle.lock);
        if (started)
                pthread_join(fs->settle.thread, NULL);
        kfs_settle_all(fs); /* the last measurements go into the index before it closes */
        kmap_free(&fs->settle.queue);
}
