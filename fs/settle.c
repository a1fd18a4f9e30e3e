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
 * MARGIN. Until its writeback, what a written file will hold is not what st_blocks says: the extent blocks
 * come later, and they come whatever becomes of the daemon, since the kernel writes the data back even
 * after a SIGKILL. So the tree must have room for them from before the write: the write reserves, on top
 * of its data, a margin for the extent blocks its writeback may allocate, which stays reserved (in
 * fs->ev's reserved bytes, so that max_size holds it) until the settler has the data written back and
 * measures the file, when the real allocation replaces it. At every moment the tree then holds no more
 * than the index's count plus what is reserved, which never exceeds max_size: 30 files of 30 strided 4 KiB
 * writes through a 4 MiB cache on ext4, SIGKILLed at once, left the tree 122,880 bytes over max_size after
 * sync (one extent leaf each, and a count a few blocks short), and now leave it under.
 *   How much: two blocks a write (an extent of the range written, and the split of the extent it lands
 * in, each of which may split a tree block), up to a bound for the whole file, the tree's blocks if every
 * block of it were an extent of its own, in tree blocks half full (ext4's records take 12 bytes, XFS's 16,
 * after a header of up to 72) plus two blocks of depth; nothing while the file has at most four blocks
 * (the inode holds four extents itself), nothing on tmpfs (fs->settle.blk 0). A file written in large
 * writes reaches its bound at once: a 1 GiB file holds 8 MiB of margin (0.8%) until its writeback, a file of
 * 16 KiB or less none. Writes within allocated space add margin until the bound too: a write into a
 * preallocated (unwritten) extent splits it at writeback.
 *   One window is left, in the flush action only (settle_all, for kcache verify), which measures files
 * still open for writing: a write whose margin the flush took before its data reached the disk has none
 * until the settler measures the file again (it queued it again). The settler itself measures only files
 * no one writes any more.
 *
 * PINNED. The settler's descriptor is a reference to the file: were the file evicted meanwhile, its blocks
 * would stay on the disk while the index counts them freed and hands them to writers. The backing
 * filesystem then held a whole file more than max_size plus the reaper's bound (test_fs_eviction.py's
 * bound test under ASan; a copy of it that listed the daemon's descriptors of deleted files caught it in
 * 2 runs of 19: a 1 MiB and a 5.2 MiB file, each held by an O_RDONLY fd, the settler's, and eviction's
 * O_PATH). So from before its open until after its close the file counts as open for eviction
 * (in->settling, under itable_lock, as eviction's check is).
 *
 * COST. One fstat and one sync_file_range per written file, on this thread, about a second after its
 * last writer closed it: the writeback the kernel would have started within 30 s anyway, started
 * earlier. A tmpfs backing has no writeback, and only pays the fstat.
 *
 * Locks: settle.lock guards the queue. itable_lock is taken under it (a queued file's writers); no other
 * lock of ours is held where settle.lock is taken (kfs_settle_note is called with none). */
#include <fcntl.h>
#include <stdio.h>
#include <sys/vfs.h>
#include <stdlib.h>
#include <unistd.h>

#include "kfs.h"

#define SETTLE_MS 1000

#define TMPFS_MAGIC 0x01021994
#define RAMFS_MAGIC 0x858458f6

void kfs_settle_init(struct kfs *fs)
{
        struct statfs sf;
        if (fstatfs(fs->tree.root, &sf) < 0)
                sf.f_type = 0, sf.f_bsize = 4096; /* not known: as a disk filesystem's */
        bool none = (unsigned long)sf.f_type == TMPFS_MAGIC || (unsigned long)sf.f_type == RAMFS_MAGIC;
        fs->settle.blk = none ? 0 : sf.f_bsize >= 512 && sf.f_bsize <= (1 << 20) ? (uint32_t)sf.f_bsize : 4096;
}

uint64_t kfs_settle_margin_locked(struct kfs *fs, struct kfs_inode *in, uint64_t est)
{
        uint64_t blk = fs->settle.blk;
        if (!blk || !S_ISREG(in->type) || in->unlinked)
                return 0;
        uint64_t blocks = (in->alloc + est + blk - 1) / blk;
        if (blocks <= 4)
                return 0;
        uint64_t per = (blk - 72) / 16 / 2; /* records in a tree block half full */
        uint64_t bound = (2 + (blocks + per - 1) / per) * blk;
        uint64_t want = in->margin + 2 * blk < bound ? in->margin + 2 * blk : bound;
        return want > in->margin ? want - in->margin : 0;
}

/* Takes in's margin (MARGIN) off it, for the caller to release: returns it. */
static uint64_t take_margin(struct kfs_inode *in)
{
        pthread_mutex_lock(&in->lock);
        uint64_t m = in->margin;
        in->margin = 0;
        pthread_mutex_unlock(&in->lock);
        return m;
}

/* Measures in after its writeback, and gives the queue's reference back. */
static void settle_one(struct kfs *fs, struct kfs_inode *in)
{
        atomic_store(&in->settle_queued, false); /* a write from now on queues it again */
        /* After the flag: a write whose margin is left for the next round has queued it again (MARGIN). */
        uint64_t margin = take_margin(in);
        pthread_mutex_lock(&fs->itable_lock);
        bool stale = kfs_stale(in); /* set under itable_lock: evicted now, or not while settling (PINNED) */
        in->settling = !stale;
        pthread_mutex_unlock(&fs->itable_lock);
        if (stale) {
                if (margin)
                        kev_settle(fs, in, NULL, margin); /* evicted: nothing of it to write back here */
        } else {
                int fd = kfs_inode_open(fs, in, O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                        (void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                                                SYNC_FILE_RANGE_WAIT_AFTER);
                        close(fd);
                }
                pthread_mutex_lock(&fs->itable_lock);
                in->settling = false;
                pthread_mutex_unlock(&fs->itable_lock);
                kev_measure(fs, in, -1, margin); /* writeback's allocation replaces the margin */
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
                uint64_t margin = take_margin(in); /* nothing will measure it: measured now */
                kev_measure(fs, in, -1, margin);
                kfs_inode_unref(fs, in, 1);
                return;
        }
        /* The thread starts with the first written file, not at mount: under a tasks limit (systemd's
         * TasksMax) a thread made at mount may be the one libfuse then cannot make. Not possible: tried
         * again a second later; meanwhile the queue waits for the flush action or the unmount. */
        int64_t now = kfs_now_ns();
        if (!fs->settle.started && now >= fs->settle.retry_at) {
                fs->settle.started = kfs_thread_start(&fs->settle.thread, 0, settler_main, fs) == 0;
                if (!fs->settle.started) {
                        fs->settle.retry_at = now + 1000000000LL;
                        if (!fs->settle.said)
                                kfs_log(LOG_WARNING, "cannot start the settler thread yet: written "
                                                     "files are measured again at kcache verify and at unmount");
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
