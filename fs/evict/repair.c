/* repair.c: the runtimes' own records of their cache's size, after eviction removed files they count.
 * NEO keeps a count in config.file and refuses to store once it passes its own limit; SYCL keeps one in
 * cache_size.txt. Eviction removes what they count, so each record is rewritten with the true figure,
 * under the runtime's own lock protocol, as the runtime itself would (../shared/docs/runtimes.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "internal.h"

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
static uint64_t tree_size(const struct ktree *t, enum krt rt, int dfd, int depth)
{
        DIR *d = ktree_opendir(t, dfd, ".");
        uint64_t total = 0;
        struct dirent *de;
        if (!d)
                return 0;
        int max_depth = rt == KRT_NEO ? 2 : 16;
        while ((de = readdir(d))) {
                struct stat st;
                const char *n = de->d_name;
                if (!strcmp(n, ".") || !strcmp(n, "..") || fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue; /* vanished meanwhile (evicted): it counts nothing */
                if (S_ISREG(st.st_mode) && counted(rt, n))
                        total += (uint64_t)st.st_size;
                else if (S_ISDIR(st.st_mode) && depth < max_depth) {
                        int c = ktree_open(t, dirfd(d), n, O_PATH | O_DIRECTORY, 0);
                        if (c >= 0) {
                                total += tree_size(t, rt, c, depth + 1);
                                close(c);
                        }
                }
        }
        closedir(d);
        return total;
}

/* No lock of ours held but evict_lock. fd is dir/name, which the daemon just rewrote behind the kernel's
 * back. The inode is held by a lookup reference, not by itable_lock, while its lock is taken: an inode's
 * lock comes before itable_lock (kfs.h, LOCK ORDER). */
static void note_rewritten(struct kfs *fs, int fd, struct notify_list *nl)
{
        struct stat st;
        if (fstat(fd, &st) < 0)
                return;
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *in = kfs_inode_find_locked(fs, st.st_ino);
        if (in)
                in->nlookup++; /* kept until kfs_inode_unref below */
        kev_note_inode(fs, nl, in);
        pthread_mutex_unlock(&fs->itable_lock);
        if (!in)
                return;
        pthread_mutex_lock(&in->lock);
        kfs_inode_account_locked(fs, in, &st); /* T3: its bytes, as the index must hold them */
        in->cache_ok = false; /* size and mtime are current now: the next open keeps no pages */
        pthread_mutex_unlock(&in->lock);
        kfs_inode_unref(fs, in, 1);
}

/* NEO's config.file, open as fd and locked (flock) by us: its count is rewritten in place with the true
 * one, as NEO would count it. In place, not removed for NEO to recount: a NEO process opens config.file
 * before it waits for the lock, and one whose file was removed meanwhile fails its store ("Cache
 * failure"), as does a recount that meets a file evicted under it (NEO stats each file it lists). Since
 * NEO opens it before locking, its pages may be in the kernel's cache from before our write: bookkeeping
 * files are opened direct_io (kfs_inode.bookkeeping), so NEO's pread after the lock comes here. */
static void neo_rewrite(struct kfs *fs, int dfd, int fd, struct notify_list *nl)
{
        size_t v = (size_t)tree_size(&fs->tree, KRT_NEO, dfd, 0); /* NEO's format: one native size_t */
        if (pwrite(fd, &v, sizeof(v), 0) != (ssize_t)sizeof(v))
                kev_remove_noted(fs, dfd, KFS_NEO_SIZE_FILE, fd, nl); /* not writable: removed, NEO then recounts */
        else
                note_rewritten(fs, fd, nl);
}

/* Repairs a runtime's own size bookkeeping after its files were evicted, under the runtime's own lock
 * protocol. Returns false if the runtime holds the lock now (try again later).
 *   NEO:  rewrite config.file's count with the true one under its flock (neo_rewrite).
 *   SYCL: rewrite cache_size.txt with the true size while holding cache_size.txt.lock (created O_EXCL, as
 *         SYCL does). Rewriting, not removing: a missing file makes SYCL recount by walking a tree that
 *         eviction may be changing under it. */
static bool repair(struct kfs *fs, enum krt rt, const struct kev_dirref *dir, struct notify_list *nl)
{
        int dfd = kev_dirref_open(fs, dir, O_PATH);
        if (dfd < 0)
                return true; /* gone, or not the directory it was (R4): nothing to repair */
        bool done = true;
        if (rt == KRT_NEO) {
                int fd = ktree_open_file(&fs->tree, dfd, KFS_NEO_SIZE_FILE, O_RDWR, 0);
                if (fd >= 0) {
                        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                                neo_rewrite(fs, dfd, fd, nl);
                        else
                                done = false;
                        kfs_flock_let_go(fd);
                }
        } else if (rt == KRT_SYCL) {
                int lk = ktree_open(&fs->tree, dfd, KFS_SYCL_SIZE_LOCK, O_WRONLY | O_CREAT | O_EXCL, 0200);
                if (lk >= 0) {
                        int fd = ktree_open_file(&fs->tree, dfd, KFS_SYCL_SIZE_FILE, O_WRONLY | O_TRUNC, 0);
                        if (fd >= 0) {
                                char v[32];
                                int n = snprintf(v, sizeof(v), "%llu",
                                                 (unsigned long long)tree_size(&fs->tree, KRT_SYCL, dfd, 0));
                                if (write(fd, v, (size_t)n) != n) /* a short write leaves a number SYCL rejects */
                                        kev_remove_noted(fs, dfd, KFS_SYCL_SIZE_FILE, fd, nl);
                                else
                                        note_rewritten(fs, fd, nl);
                                close(fd);
                        }
                        /* Removed only while the name still is ours (not one a runtime made since), and
                         * as eviction removes a file: a process that looked it up while we held it (ls,
                         * stat, SYCL's own O_EXCL) has it in the kernel's cache, which must learn it went. */
                        kev_remove_noted(fs, dfd, KFS_SYCL_SIZE_LOCK, lk, nl);
                        close(lk);
                } else {
                        done = lk != -EEXIST;
                }
        }
        close(dfd);
        return done;
}

/* The repairer. NEO's processes take config.file's flock blocking, so they queue; an attempt with
 * LOCK_NB only wins in the instant between one holder and the next, which under a busy NEO may never
 * come, and NEO's count would then stay inflated (and NEO refuse to store) for as long as it is busy.
 * So a NEO repair that found the lock held is handed to this thread, which queues for the lock like
 * NEO's own processes and, once it holds it, rewrites config.file's count under evict_lock (the lock
 * order is the flock, then evict_lock; eviction itself never waits for a flock). Stopped by
 * kev_stop(), which interrupts a wait with KFS_WAKE_SIGNAL. A wait lasts REPAIR_WAIT_S at most, and the
 * repair then goes to the end of the list: on a shared mount each user's NEO cache has its own
 * config.file, and a user who holds his lock for good must not keep the others' counts inflated. */

static bool same_dir(const struct kev_dirref *a, const struct kev_dirref *b)
{
        return a->ino == b->ino && !strcmp(a->rel, b->rel);
}

#define REPAIR_WAIT_S 5

/* flock(fd, LOCK_EX), interrupted (-EINTR) after seconds by a timer that sends this thread
 * KFS_WAKE_SIGNAL. */
static int flock_within(int fd, unsigned seconds)
{
        timer_t tm;
        struct sigevent sev = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = KFS_WAKE_SIGNAL };
        sev._sigev_un._tid = gettid(); /* sigev_notify_thread_id, which glibc 2.36 does not name */
        bool armed = timer_create(CLOCK_MONOTONIC, &sev, &tm) == 0;
        if (armed) {
                struct itimerspec its = { .it_value = { .tv_sec = seconds } };
                (void)timer_settime(tm, 0, &its, NULL);
        }
        int r = flock(fd, LOCK_EX) == 0 ? 0 : -errno;
        if (armed)
                timer_delete(tm); /* one that fired after the lock was taken woke nothing */
        return r;
}

/* evict_lock held. The repair of dir goes last: others are tried before it again. */
static void repair_last_locked(struct kfs *fs, enum krt rt, const struct kev_dirref *dir)
{
        for (size_t k = 0; k + 1 < fs->ev->nrepairs; k++)
                if (fs->ev->repairs[k].rt == rt && same_dir(&fs->ev->repairs[k].dir, dir)) {
                        struct kev_repair r = fs->ev->repairs[k];
                        memmove(&fs->ev->repairs[k], &fs->ev->repairs[k + 1],
                                (fs->ev->nrepairs - k - 1) * sizeof(r));
                        fs->ev->repairs[fs->ev->nrepairs - 1] = r;
                        return;
                }
}

static void drop_repair_locked(struct kfs *fs, enum krt rt, const struct kev_dirref *dir)
{
        for (size_t k = 0; k < fs->ev->nrepairs; k++)
                if (fs->ev->repairs[k].rt == rt && same_dir(&fs->ev->repairs[k].dir, dir)) {
                        free(fs->ev->repairs[k].dir.rel);
                        fs->ev->repairs[k] = fs->ev->repairs[--fs->ev->nrepairs];
                        return;
                }
}

static void *repairer_main(void *arg)
{
        struct kfs *fs = arg;
        kfs_wake_signal_accept();
        pthread_mutex_lock(&fs->ev->evict_lock);
        while (!fs->ev->stop) {
                struct kev_dirref dir = { NULL, 0 };
                for (size_t k = 0; k < fs->ev->nrepairs && !dir.rel; k++)
                        if (fs->ev->repairs[k].rt == KRT_NEO)
                                dir = (struct kev_dirref){ strdup(fs->ev->repairs[k].dir.rel), fs->ev->repairs[k].dir.ino };
                if (!dir.rel) {
                        pthread_cond_wait(&fs->ev->repair_cond, &fs->ev->evict_lock);
                        continue;
                }
                pthread_mutex_unlock(&fs->ev->evict_lock);
                int dfd = kev_dirref_open(fs, &dir, O_PATH); /* R4: still the directory it was */
                int fd = dfd < 0 ? -1 : ktree_open_file(&fs->tree, dfd, KFS_NEO_SIZE_FILE, O_RDWR, 0);
                int lr = fd >= 0 ? flock_within(fd, REPAIR_WAIT_S) : -EBADF; /* queued behind NEO's processes */
                bool locked = lr == 0;
                struct notify_list nl = { 0 };
                pthread_mutex_lock(&fs->ev->evict_lock);
                if (!fs->ev->stop && (locked || fd < 0)) {
                        if (locked)
                                neo_rewrite(fs, dfd, fd, &nl);
                        drop_repair_locked(fs, KRT_NEO, &dir);
                } else if (!fs->ev->stop && lr == -EINTR) {
                        repair_last_locked(fs, KRT_NEO, &dir); /* held for long: the others first */
                }
                pthread_mutex_unlock(&fs->ev->evict_lock);
                kev_notify_all(fs, &nl);
                if (fd >= 0)
                        kfs_flock_let_go(fd);
                if (dfd >= 0)
                        close(dfd);
                free(dir.rel);
                pthread_mutex_lock(&fs->ev->evict_lock);
        }
        pthread_mutex_unlock(&fs->ev->evict_lock);
        return NULL;
}

/* evict_lock held: a NEO repair waits; wake (or start) the repairer. */
static void repairer_kick_locked(struct kfs *fs)
{
        if (!fs->ev->repairer_started) {
                kfs_wake_signal_init();
                fs->ev->repairer_started = kfs_thread_start(&fs->ev->repairer, 0, repairer_main, fs) == 0;
        }
        pthread_cond_signal(&fs->ev->repair_cond);
}

/* evict_lock held. Runs the repairs of this batch's units and the ones left over from earlier batches. */
void kev_repair_all(struct kfs *fs, struct victims *vs, struct notify_list *nl)
{
        for (size_t i = 0; i < vs->nu; i++) {
                if (!vs->u[i].repair.rel)
                        continue;
                bool dup = false;
                for (size_t k = 0; k < fs->ev->nrepairs && !dup; k++)
                        dup = fs->ev->repairs[k].rt == vs->u[i].rt && same_dir(&fs->ev->repairs[k].dir, &vs->u[i].repair);
                struct kev_repair *nr = dup ? NULL : realloc(fs->ev->repairs, (fs->ev->nrepairs + 1) * sizeof(*nr));
                if (nr) {
                        fs->ev->repairs = nr;
                        nr[fs->ev->nrepairs++] = (struct kev_repair){ vs->u[i].rt, vs->u[i].repair };
                        vs->u[i].repair.rel = NULL; /* now owned by fs->ev->repairs */
                }
        }
        size_t keep = 0;
        bool neo = false;
        for (size_t k = 0; k < fs->ev->nrepairs; k++) {
                if (repair(fs, fs->ev->repairs[k].rt, &fs->ev->repairs[k].dir, nl)) {
                        free(fs->ev->repairs[k].dir.rel);
                } else {
                        neo |= fs->ev->repairs[k].rt == KRT_NEO;
                        fs->ev->repairs[keep++] = fs->ev->repairs[k];
                }
        }
        fs->ev->nrepairs = keep;
        if (neo && !fs->ev->stop)
                repairer_kick_locked(fs);
}

void kev_repairer_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->ev->evict_lock);
        bool started = fs->ev->repairer_started;
        pthread_cond_broadcast(&fs->ev->repair_cond);
        pthread_mutex_unlock(&fs->ev->evict_lock);
        while (started) { /* a signal may come before the flock starts waiting: repeat until it ends */
                pthread_kill(fs->ev->repairer, KFS_WAKE_SIGNAL);
                struct timespec ts = kfs_deadline_ms(10);
                started = pthread_timedjoin_np(fs->ev->repairer, NULL, &ts) != 0;
        }
        fs->ev->repairer_started = false;
}

void kev_repair_free(struct kfs *fs)
{
        for (size_t k = 0; k < fs->ev->nrepairs; k++)
                free(fs->ev->repairs[k].dir.rel);
        free(fs->ev->repairs);
        fs->ev->repairs = NULL;
        fs->ev->nrepairs = 0;
}
