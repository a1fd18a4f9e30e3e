/* reap.c: the last close of evicted files, off the request path.
 *
 * WHY. Eviction unlinks a victim while it holds an O_PATH fd on it (evict.h, INODE REUSE), so the fd's
 * close is the file's last reference, and that close frees its blocks: ext4 releases its extents and,
 * mounted with -o discard (as this machine's root is), waits for the device to discard them
 * (blkdev_issue_discard under ext4_free_blocks): in perf of the daemon evicting 1,000 files, those
 * closes were 31% of its samples. A write that needs room evicts in line, under evict_lock (evict.h, HOW
 * FAR), so every concurrent writer waited for those discards too. A thread of its own now does these closes:
 * bench/big's 4000 KiB write that evicts 1,000 files took 89 and 117 ms before, 64 to 80 ms after.
 *
 * WHAT LAGS. The index counts the bytes as freed when the file is unlinked, so the limit (max_size) is
 * exact by the index. The backing filesystem's own free space lags by what is queued here, and that is
 * bounded: past kev_reap_bound() bytes queued (1/64 of max_size, at least 256 KiB), an evicting request
 * closes its victims' fds itself. So the backing filesystem never holds more than max_size plus that
 * bound of the cache's files (4 writers through a 4 MiB cache held 930 KiB more, 22%, when this queue
 * was unbounded). The fds it holds are bounded too, by half the inodes' descriptor budget (inode.c,
 * DESCRIPTORS), a quarter of RLIMIT_NOFILE: the background descent evicting 12,099 files of 4 KiB
 * through a cache of 4 GiB queued one fd per file, within the byte bound, and a daemon limited to 4,096
 * descriptors then failed a write with EMFILE. kev_reap_drain() waits the queue out where it matters:
 * before a write that failed with the backing filesystem's ENOSPC retries, and after an operator's
 * eviction (kcache evict), whose caller may look at df of the backing filesystem next. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* KEV_REAPERS threads close, REAP_STEP files at a time each, giving back each step's bytes and
 * descriptors as they go, so that the queue takes new files as soon as it has room (an evicting request
 * closes its victims itself only while the queue is full). Two, because a close waits for the disk (the
 * discard of the freed blocks) more than it computes, so two closing at once drain the queue faster. */
#define REAP_STEP 32

static void *reaper_main(void *arg)
{
        struct kfs *fs = arg;
        struct kev_reap_item batch[REAP_STEP];
        pthread_mutex_lock(&fs->ev->reap.lock);
        for (;;) {
                while (fs->ev->reap.n == 0 && !fs->ev->reap.stop)
                        pthread_cond_wait(&fs->ev->reap.cond, &fs->ev->reap.lock);
                if (fs->ev->reap.n == 0)
                        break; /* stopping, and nothing is left */
                size_t k = fs->ev->reap.n < REAP_STEP ? fs->ev->reap.n : REAP_STEP;
                fs->ev->reap.n -= k; /* from the end: the order of the closes does not matter */
                memcpy(batch, fs->ev->reap.q + fs->ev->reap.n, k * sizeof(*batch));
                fs->ev->reap.busy++;
                pthread_mutex_unlock(&fs->ev->reap.lock);
                uint64_t bytes = 0;
                for (size_t i = 0; i < k; i++) {
                        close(batch[i].fd);
                        bytes += batch[i].bytes;
                }
                pthread_mutex_lock(&fs->ev->reap.lock);
                fs->ev->reap.bytes -= bytes;
                fs->ev->reap.held -= k;
                fs->ev->reap.busy--;
                pthread_cond_broadcast(&fs->ev->reap.cond);
        }
        pthread_mutex_unlock(&fs->ev->reap.lock);
        return NULL;
}

uint64_t kev_reap_bound(const struct kfs *fs)
{
        uint64_t b = fs->o.max_size / 64;
        return b > 256 * 1024 ? b : 256 * 1024;
}

void kev_reap(struct kfs *fs, int fd, uint64_t bytes)
{
        if (fd < 0)
                return;
        pthread_mutex_lock(&fs->ev->reap.lock);
        size_t max_fds = fs->fdc.cap / 2 > 16 ? fs->fdc.cap / 2 : 16;
        if (fs->ev->reap.bytes + bytes > kev_reap_bound(fs) || fs->ev->reap.held >= max_fds) {
                /* the queue is full enough: close it here */
                pthread_mutex_unlock(&fs->ev->reap.lock);
                close(fd);
                return;
        }
        while (fs->ev->reap.started < KEV_REAPERS && !fs->ev->reap.stop &&
               kfs_thread_start(&fs->ev->reap.threads[fs->ev->reap.started], 0, reaper_main, fs) == 0)
                fs->ev->reap.started++;
        bool queued = false;
        if (fs->ev->reap.started && !fs->ev->reap.stop) {
                if (fs->ev->reap.n == fs->ev->reap.cap) {
                        size_t cap = fs->ev->reap.cap ? fs->ev->reap.cap * 2 : 256;
                        struct kev_reap_item *n = realloc(fs->ev->reap.q, cap * sizeof(*n));
                        if (n) {
                                fs->ev->reap.q = n;
                                fs->ev->reap.cap = cap;
                        }
                }
                if (fs->ev->reap.n < fs->ev->reap.cap) {
                        fs->ev->reap.q[fs->ev->reap.n++] = (struct kev_reap_item){ fd, bytes };
                        fs->ev->reap.bytes += bytes;
                        fs->ev->reap.held++;
                        queued = true;
                        pthread_cond_broadcast(&fs->ev->reap.cond);
                }
        }
        pthread_mutex_unlock(&fs->ev->reap.lock);
        if (!queued)
                close(fd); /* no thread or no memory: here, as before */
}

void kev_reap_drain(struct kfs *fs)
{
        pthread_mutex_lock(&fs->ev->reap.lock);
        while (fs->ev->reap.n > 0 || fs->ev->reap.busy)
                pthread_cond_wait(&fs->ev->reap.cond, &fs->ev->reap.lock);
        pthread_mutex_unlock(&fs->ev->reap.lock);
}

void kev_reap_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->ev->reap.lock);
        fs->ev->reap.stop = true;
        unsigned started = fs->ev->reap.started;
        pthread_cond_broadcast(&fs->ev->reap.cond);
        pthread_mutex_unlock(&fs->ev->reap.lock);
        for (unsigned i = 0; i < started; i++)
                pthread_join(fs->ev->reap.threads[i], NULL); /* after they have closed everything queued */
        fs->ev->reap.started = 0;
        free(fs->ev->reap.q);
        fs->ev->reap.q = NULL;
}
