/* reap.c: the last close of evicted files, off the request path.
 *
 * WHY. Eviction unlinks a victim while it holds an O_PATH fd on it (evict.c, INODE REUSE), so the fd's
 * close is the file's last reference, and that close frees its blocks: ext4 releases its extents and,
 * mounted with -o discard (as this machine's root is), waits for the device to discard them
 * (blkdev_issue_discard under ext4_free_blocks): in perf of the daemon evicting 1,000 files, those
 * closes were 31% of its samples. A write that needs room evicts in line, under evict_lock (evict.c, HOW
 * FAR), so every concurrent writer waited for those discards too. A thread of its own now does these closes:
 * bench/big's 4000 KiB write that evicts 1,000 files took 89 and 117 ms before, 64 to 80 ms after.
 *
 * WHAT LAGS. The index counts the bytes as freed when the file is unlinked, so the limit (max_size) is
 * exact by the index. The backing filesystem's own free space lags by what is queued here, and that is
 * bounded: past kfs_reap_bound() bytes queued (1/64 of max_size, at least 256 KiB), an evicting request
 * closes its victims' fds itself. So the backing filesystem never holds more than max_size plus that
 * bound of the cache's files (4 writers through a 4 MiB cache held 930 KiB more, 22%, when this queue
 * was unbounded). The fds it holds are bounded too, by half the inodes' descriptor budget (inode.c,
 * DESCRIPTORS), a quarter of RLIMIT_NOFILE: the background descent evicting 12,099 files of 4 KiB
 * through a cache of 4 GiB queued one fd per file, within the byte bound, and a daemon limited to 4,096
 * descriptors then failed a write with EMFILE. kfs_reap_drain() waits the queue out where it matters:
 * before a write that failed with the backing filesystem's ENOSPC retries, and after an operator's
 * eviction (kcache evict), whose caller may look at df of the backing filesystem next. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kfs.h"

/* KFS_REAPERS threads close, REAP_STEP files at a time each, giving back each step's bytes and
 * descriptors as they go, so that the queue takes new files as soon as it has room (an evicting request
 * closes its victims itself only while the queue is full). Two, because a close waits for the disk (the
 * discard of the freed blocks) more than it computes, so two closing at once drain the queue faster. */
#define REAP_STEP 32

static void *reaper_main(void *arg)
{
        struct kfs *fs = arg;
        struct kfs_reap_item batch[REAP_STEP];
        pthread_mutex_lock(&fs->reap.lock);
        for (;;) {
                while (fs->reap.n == 0 && !fs->reap.stop)
                        pthread_cond_wait(&fs->reap.cond, &fs->reap.lock);
                if (fs->reap.n == 0)
                        break; /* stopping, and nothing is left */
                size_t k = fs->reap.n < REAP_STEP ? fs->reap.n : REAP_STEP;
                fs->reap.n -= k; /* from the end: the order of the closes does not matter */
                memcpy(batch, fs->reap.q + fs->reap.n, k * sizeof(*batch));
                fs->reap.busy++;
                pthread_mutex_unlock(&fs->reap.lock);
                uint64_t bytes = 0;
                for (size_t i = 0; i < k; i++) {
                        close(batch[i].fd);
                        bytes += batch[i].bytes;
                }
                pthread_mutex_lock(&fs->reap.lock);
                fs->reap.bytes -= bytes;
                fs->reap.held -= k;
                fs->reap.busy--;
                pthread_cond_broadcast(&fs->reap.cond);
        }
        pthread_mutex_unlock(&fs->reap.lock);
        return NULL;
}

uint64_t kfs_reap_bound(const struct kfs *fs)
{
        uint64_t b = fs->o.max_size / 64;
        return b > 256 * 1024 ? b : 256 * 1024;
}

void kfs_reap(struct kfs *fs, int fd, uint64_t bytes)
{
        if (fd < 0)
                return;
        pthread_mutex_lock(&fs->reap.lock);
        size_t max_fds = fs->fdc.cap / 2 > 16 ? fs->fdc.cap / 2 : 16;
        if (fs->reap.bytes + bytes > kfs_reap_bound(fs) || fs->reap.held >= max_fds) {
                /* the queue is full enough: close it here */
                pthread_mutex_unlock(&fs->reap.lock);
                close(fd);
                return;
        }
        while (fs->reap.started < KFS_REAPERS && !fs->reap.stop &&
               pthread_create(&fs->reap.threads[fs->reap.started], NULL, reaper_main, fs) == 0)
                fs->reap.started++;
        bool queued = false;
        if (fs->reap.started && !fs->reap.stop) {
                if (fs->reap.n == fs->reap.cap) {
                        size_t cap = fs->reap.cap ? fs->reap.cap * 2 : 256;
                        struct kfs_reap_item *n = realloc(fs->reap.q, cap * sizeof(*n));
                        if (n) {
                                fs->reap.q = n;
                                fs->reap.cap = cap;
                        }
                }
                if (fs->reap.n < fs->reap.cap) {
                        fs->reap.q[fs->reap.n++] = (struct kfs_reap_item){ fd, bytes };
                        fs->reap.bytes += bytes;
                        fs->reap.held++;
                        queued = true;
                        pthread_cond_broadcast(&fs->reap.cond);
                }
        }
        pthread_mutex_unlock(&fs->reap.lock);
        if (!queued)
                close(fd); /* no thread or no memory: here, as before */
}

void kfs_reap_drain(struct kfs *fs)
{
        pthread_mutex_lock(&fs->reap.lock);
        while (fs->reap.n > 0 || fs->reap.busy)
                pthread_cond_wait(&fs->reap.cond, &fs->reap.lock);
        pthread_mutex_unlock(&fs->reap.lock);
}

void kfs_reap_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->reap.lock);
        fs->reap.stop = true;
        unsigned started = fs->reap.started;
        pthread_cond_broadcast(&fs->reap.cond);
        pthread_mutex_unlock(&fs->reap.lock);
        for (unsigned i = 0; i < started; i++)
                pthread_join(fs->reap.threads[i], NULL); /* after they have closed everything queued */
        fs->reap.started = 0;
        free(fs->reap.q);
        fs->reap.q = NULL;
}
