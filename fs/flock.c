/* flock.c: flock(2) on the mount.
 *
 * HOW. Each open has its own backing fd, hence its own open file description, so flock() on the
 * backing fds conflicts between two opens exactly as on a local filesystem, and the daemon's own repairs
 * (evict/) queue on the same locks as the runtimes. The kernel sends RELEASE only after every request
 * of a handle is answered, so a backing fd is never closed under a waiter.
 *
 * WAITS. The workers are few (as many as the CPUs), so a lock that must be waited for is waited for on a
 * thread of its own: NEO's processes queue on config.file, and waiters holding the workers would starve
 * everyone else, the request that unlocks included. A user has WAITS_PER_USER such threads at most, and a
 * wait that gets no thread is answered ENOLCK (no room for the lock), never waited for on the worker: a
 * user who blocked on locks of their own until threads ran out would otherwise have stopped a CPU's
 * queue, every user's requests in it, for as long as they liked.
 *
 * A HOLDER THAT WENT AWAY. On a local filesystem a lock is free once its holder has closed the file or
 * exited. Through FUSE the last close only queues a RELEASE, in the background, and the unlock happens
 * when the daemon handles it; a process that saw the holder exit (waitpid) and then tries LOCK_NB can get
 * there first, more often with FUSE over io_uring, where the two requests wait in different CPUs'
 * queues. (Our opens set noflush, so no request at all comes at close.) So the daemon remembers which
 * thread took each lock it holds; a LOCK_NB that conflicts with a lock whose taker is gone (no such
 * thread, or a zombie: its files are closed, the RELEASE is on its way) waits for that RELEASE, at most
 * HOLDER_GONE_MS, then tries once more. If the lock was inherited by a child that still runs, no RELEASE
 * comes, and the answer is EWOULDBLOCK after that wait, as it should be. A holder that closes the file
 * while it goes on running is not covered: nothing tells the daemon of that close before the RELEASE.
 *
 * LET GO AT RELEASE. A lock held through a backing fd belongs to its open file description, which close()
 * frees only with its last reference, and the daemon's close need not be the last: a helper being spawned
 * (spawn.c) holds a copy of the daemon's descriptor table, every backing fd in it, until the spawn closes
 * them; and the kernel holds one of its own while the fd is passthrough's registered backing file
 * (passthrough.c), until the inode is forgotten. So at RELEASE a lock the handle holds is let go (LOCK_UN)
 * before its fd is closed, where the daemon recorded one or the kernel says flock() was used on the
 * handle (FUSE_RELEASE_FLOCK_UNLOCK): test_fs_posix.py's flock test failed 2 runs in 40 while nudges
 * spawned a helper each and RELEASE only closed.
 *
 * PROC OUTSIDE THE LOCK. flock.lock is one for the mount, and every RELEASE takes it while any lock is
 * held through us; whether a holder's thread is gone, or which process it is in, takes a read of /proc.
 * Those reads are made after the lock is let go, from the threads copied out of the records, each thread
 * once (and for a gone taker, GONE_MAX threads at most): reading under the lock for every holder of the
 * file, a user who held 2,000 shared locks on one file of theirs and kept trying LOCK_NB on it held the
 * lock for most of the time, and another user's lock and unlock took 66 ms instead of 0.04
 * (test_fs_posix.py). A holder let go between a failed try and the reads is seen by the count of those let
 * go (drops): then the try is made again at once, rather than answered from records it is no longer in. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "kfs.h"

#define HOLDER_GONE_MS 250
#define WAITS_PER_USER 512 /* flock() waits of one user at once (WAITS) */

/* A lock held through one of our backing fds. */
struct kfs_flock_holder {
        int fd;
        uint64_t bino;
        pid_t tid;            /* the thread that took it (the request's), 0: unknown (another pid namespace) */
        struct kfs_flock_holder *next;
};

/* A request answered on a thread of its own. */
struct kfs_flock_wait {
        struct kfs *fs;
        fuse_req_t req;
        int fd, op;
        uint64_t bino;
        pid_t tid;
        uid_t uid;            /* the caller's (WAITS) */
        bool after_gone;      /* LOCK_NB: wait for gone holders' RELEASE, then try once more */
        bool done;            /* answered: its thread ends, to be joined (flock.lock) */
        pthread_t thread;
        struct kfs_flock_wait *next;
};

/* Reads /proc/PID/FILE into buf (NUL-terminated). Returns the bytes read, 0 if none (the process exited
 * between the open and the read), or -errno if it could not be opened. */
static ssize_t read_proc(pid_t pid, const char *file, char *buf, size_t size)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n = read(fd, buf, size - 1);
        close(fd);
        buf[n > 0 ? n : 0] = 0;
        return n > 0 ? n : 0;
}

/* Is the thread that took a lock gone, its files closed? */
static bool taker_gone(pid_t tid)
{
        if (tid <= 0)
                return false;
        char buf[512];
        ssize_t n = read_proc(tid, "stat", buf, sizeof(buf));
        if (n < 0)
                return n == -ENOENT || n == -ESRCH;
        if (n == 0)
                return true; /* exited between the open and the read */
        const char *p = strrchr(buf, ')'); /* the name may hold anything, even ") Z" */
        return p && (p[2] == 'Z' || p[2] == 'X');
}

pid_t kfs_tgid_of(pid_t tid)
{
        if (tid <= 0)
                return 0;
        char buf[1024];
        if (read_proc(tid, "status", buf, sizeof(buf)) <= 0)
                return 0;
        const char *t = strstr(buf, "\nTgid:");
        return t ? (pid_t)atoi(t + 6) : 0;
}

pid_t kfs_ppid_of(pid_t pid)
{
        char buf[1024];
        if (pid <= 0 || read_proc(pid, "stat", buf, sizeof(buf)) <= 0)
                return 0;
        const char *p = strrchr(buf, ')'); /* the name may hold anything */
        int ppid = 0;
        return p && sscanf(p + 1, " %*c %d", &ppid) == 1 ? (pid_t)ppid : 0; /* after the name: state, ppid */
}

uint64_t kfs_proc_start(pid_t pid)
{
        if (pid <= 0)
                return 0;
        char buf[1024];
        if (read_proc(pid, "stat", buf, sizeof(buf)) <= 0)
                return 0;
        const char *p = strrchr(buf, ')'); /* the name may hold anything */
        if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
                return 0; /* a zombie has exited: it holds nothing any more */
        /* after the name: state (field 3) ... starttime (field 22) */
        p += 2;
        for (int field = 3; field < 22 && p; field++) {
                p = strchr(p, ' ');
                if (p)
                        p++;
        }
        return p ? strtoull(p, NULL, 10) : 0;
}

static int by_tid(const void *a, const void *b)
{
        pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
        return (x > y) - (x < y);
}

/* Whether a thread of process pid holds a flock through us: on bino, or on anything (any). Which process
 * each holder's thread is in takes a read of /proc: those are made after flock.lock is let go (see
 * PROC OUTSIDE THE LOCK), one per thread. */
static bool holder_of(struct kfs *fs, bool any, uint64_t bino, pid_t pid)
{
        pid_t want = pid > 0 ? kfs_tgid_of(pid) : 0;
        if (!want)
                return false;
        bool found = false;
        size_t n = 0;
        pthread_mutex_lock(&fs->flock.lock);
        unsigned cap = atomic_load(&fs->flock.nholders);
        pid_t *tids = cap ? malloc(cap * sizeof(*tids)) : NULL;
        for (struct kfs_flock_holder *h = fs->flock.holders; h && !found; h = h->next)
                if ((any || h->bino == bino) && h->tid > 0) {
                        found = h->tid == pid || h->tid == want; /* the same thread, or the main one */
                        if (tids && n < cap)
                                tids[n++] = h->tid;
                }
        pthread_mutex_unlock(&fs->flock.lock);
        if (!found && n) {
                qsort(tids, n, sizeof(*tids), by_tid);
                for (size_t i = 0; i < n && !found; i++)
                        found = (i == 0 || tids[i] != tids[i - 1]) && kfs_tgid_of(tids[i]) == want;
        }
        free(tids);
        return found;
}

bool kfs_flock_held_by(struct kfs *fs, uint64_t bino, pid_t pid)
{
        return holder_of(fs, false, bino, pid);
}

bool kfs_flock_holds_any(struct kfs *fs, pid_t pid)
{
        return holder_of(fs, true, 0, pid);
}

/* Is a lock on bino held by a taker that is gone? The threads are read from flock.lock's records, at
 * most GONE_MAX of them (one is enough where its process exited: a conflicting lock of more threads than
 * that is answered at once, as without this), and /proc after the lock is let go. *gen becomes the count
 * of holders let go as of the records read: where it moved since, a record the answer did not see went. */
#define GONE_MAX 64
static bool gone_holder(struct kfs *fs, uint64_t bino, uint64_t *gen)
{
        pid_t tids[GONE_MAX];
        size_t n = 0;
        pthread_mutex_lock(&fs->flock.lock);
        *gen = fs->flock.drops;
        for (struct kfs_flock_holder *h = fs->flock.holders; h && n < GONE_MAX; h = h->next) {
                bool seen = h->bino != bino || h->tid <= 0;
                for (size_t i = 0; i < n && !seen; i++)
                        seen = tids[i] == h->tid;
                if (!seen)
                        tids[n++] = h->tid;
        }
        pthread_mutex_unlock(&fs->flock.lock);
        bool gone = false;
        for (size_t i = 0; i < n && !gone; i++)
                gone = taker_gone(tids[i]);
        return gone;
}

/* flock.lock held. Records (or re-records) fd as holding a lock; dropped on LOCK_UN and RELEASE. */
static void holder_set_locked(struct kfs *fs, int fd, uint64_t bino, pid_t tid)
{
        if (atomic_load(&fs->flock.stop))
                return; /* kfs_flock_stop freed the records; RELEASE lets the lock go all the same */
        struct kfs_flock_holder *h = fs->flock.holders;
        while (h && h->fd != fd)
                h = h->next;
        if (!h) {
                h = malloc(sizeof(*h));
                if (!h)
                        return; /* then a LOCK_NB against it answers at once, as without this */
                h->next = fs->flock.holders;
                fs->flock.holders = h;
                atomic_fetch_add(&fs->flock.nholders, 1);
        }
        h->fd = fd;
        h->bino = bino;
        h->tid = tid;
}

/* flock.lock held. */
static bool holder_drop_locked(struct kfs *fs, int fd)
{
        for (struct kfs_flock_holder **p = &fs->flock.holders; *p; p = &(*p)->next)
                if ((*p)->fd == fd) {
                        struct kfs_flock_holder *h = *p;
                        *p = h->next;
                        free(h);
                        atomic_fetch_sub(&fs->flock.nholders, 1);
                        fs->flock.drops++;
                        return true;
                }
        return false;
}

void kfs_flock_let_go(int fd)
{
        (void)flock(fd, LOCK_UN);
        close(fd);
}

void kfs_flock_close(struct kfs *fs, int fd, bool flocked)
{
        if (atomic_load(&fs->flock.nholders) == 0) {
                if (flocked)
                        (void)flock(fd, LOCK_UN); /* (LET GO AT RELEASE) */
                close(fd);
                return;
        }
        /* Closed under the lock: a LOCK_NB that failed against this fd's lock and then finds it
         * unlisted would otherwise answer EWOULDBLOCK for a lock that is already free. */
        pthread_mutex_lock(&fs->flock.lock);
        bool held = holder_drop_locked(fs, fd);
        if (held || flocked)
                (void)flock(fd, LOCK_UN); /* (LET GO AT RELEASE) */
        close(fd);
        if (held)
                pthread_cond_broadcast(&fs->flock.cond);
        pthread_mutex_unlock(&fs->flock.lock);
}

/* flock.lock held. One attempt, and the bookkeeping of its outcome. */
static int try_locked(struct kfs *fs, int fd, int op, uint64_t bino, pid_t tid)
{
        int e = flock(fd, op) < 0 ? errno : 0;
        if (e == 0 && (op & LOCK_UN))
                holder_drop_locked(fs, fd);
        else if (e == 0)
                holder_set_locked(fs, fd, bino, tid);
        return e;
}

/* Takes the lock, waiting for as long as that takes (a shutdown interrupts it), and records it. */
static int take_waiting(struct kfs *fs, const struct kfs_flock_wait *w)
{
        int e;
        while ((e = flock(w->fd, w->op) < 0 ? errno : 0) == EINTR && !atomic_load(&fs->flock.stop))
                ;
        if (e == 0) {
                pthread_mutex_lock(&fs->flock.lock);
                holder_set_locked(fs, w->fd, w->bino, w->tid);
                pthread_mutex_unlock(&fs->flock.lock);
        }
        /* Ended by the stop: not EINTR, which the kernel turns into a restart of the flock() (fuse_setlk),
         * and with no signal pending the caller would see errno 512 */
        return e == EINTR ? ENOLCK : e;
}

static void *flock_waiter(void *arg)
{
        struct kfs_flock_wait *w = arg;
        kfs_wake_signal_accept();
        struct kfs *fs = w->fs;
        int e;
        if (w->after_gone) { /* until the gone taker's RELEASE let its lock go, or the deadline */
                int64_t end = kfs_now_ns() + HOLDER_GONE_MS * 1000000LL;
                struct timespec until = kfs_deadline_ms(HOLDER_GONE_MS);
                for (;;) {
                        uint64_t gen = 0;
                        bool gone = !atomic_load(&fs->flock.stop) && kfs_now_ns() < end &&
                                    gone_holder(fs, w->bino, &gen);
                        pthread_mutex_lock(&fs->flock.lock);
                        /* Nothing let go since the records were read: wait for a RELEASE (or the deadline);
                         * something was: read them again at once. */
                        bool again = gone && (fs->flock.drops != gen ||
                                              pthread_cond_timedwait(&fs->flock.cond, &fs->flock.lock, &until) == 0);
                        if (!again)
                                e = try_locked(fs, w->fd, w->op, w->bino, w->tid);
                        pthread_mutex_unlock(&fs->flock.lock);
                        if (!again)
                                break;
                }
        } else {
                e = take_waiting(fs, w);
        }
        fuse_reply_err(w->req, e);
        pthread_mutex_lock(&fs->flock.lock);
        w->done = true; /* joined and freed by the next defer() or by kfs_flock_stop() */
        pthread_cond_broadcast(&fs->flock.cond);
        pthread_mutex_unlock(&fs->flock.lock);
        return NULL;
}

/* flock.lock held. Joins the waits that are done (each a moment from its end), or every one. A thread
 * is never detached: none may still be exiting as the daemon exits (such a thread is a known cause of
 * LeakSanitizer's tracer faulting). */
static void waits_join_locked(struct kfs *fs, bool all)
{
        for (struct kfs_flock_wait **p = &fs->flock.list, *w; (w = *p);) {
                if (w->done || all) {
                        pthread_join(w->thread, NULL);
                        *p = w->next;
                        free(w);
                } else {
                        p = &w->next;
                }
        }
}

/* Answers on a thread of its own; false if none could be started. */
static bool defer(struct kfs *fs, const struct kfs_flock_wait *tmpl)
{
        kfs_wake_signal_init();
        struct kfs_flock_wait *w = malloc(sizeof(*w));
        pthread_mutex_lock(&fs->flock.lock);
        waits_join_locked(fs, false);
        bool started = false;
        unsigned mine = 0;
        for (struct kfs_flock_wait *o = fs->flock.list; o; o = o->next)
                mine += !o->done && o->uid == tmpl->uid;
        if (w && !atomic_load(&fs->flock.stop) && mine < WAITS_PER_USER) {
                *w = *tmpl;
                w->done = false;
                w->next = fs->flock.list;
                started = kfs_thread_start(&w->thread, 256 * 1024, flock_waiter, w) == 0;
                if (started)
                        fs->flock.list = w;
        }
        pthread_mutex_unlock(&fs->flock.lock);
        if (!started)
                free(w);
        return started;
}

void kfs_op_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op)
{
        struct kfs *fs = kfs_of(req);
        int fd = kfs_handle_fd(fs, ino, fi);
        if (fd < 0) {
                fuse_reply_err(req, -fd);
                return;
        }
        struct kfs_flock_wait w = { .fs = fs, .req = req, .fd = fd, .op = op,
                                    .bino = kfs_inode_get(fs, ino)->bino, .tid = fuse_req_ctx(req)->pid,
                                    .uid = fuse_req_ctx(req)->uid };
        pthread_mutex_lock(&fs->flock.lock);
        int e = try_locked(fs, fd, op | ((op & LOCK_UN) ? 0 : LOCK_NB), w.bino, w.tid);
        uint64_t tried = fs->flock.drops;
        pthread_mutex_unlock(&fs->flock.lock);
        bool gone = false;
        if (e == EWOULDBLOCK && (op & LOCK_NB)) {
                uint64_t read;
                gone = gone_holder(fs, w.bino, &read);
                if (!gone && read != tried) { /* a holder (of any file) let go since the try: once more */
                        pthread_mutex_lock(&fs->flock.lock);
                        e = try_locked(fs, fd, op, w.bino, w.tid);
                        pthread_mutex_unlock(&fs->flock.lock);
                }
        }
        if (e != EWOULDBLOCK || ((op & LOCK_NB) && !gone)) {
                fuse_reply_err(req, e);
                return;
        }
        w.after_gone = gone;
        if (defer(fs, &w))
                return;
        if (!gone) { /* no thread for the wait (WAITS), or stopping: a wait begun now would never be woken */
                fuse_reply_err(req, ENOLCK);
                return;
        }
        /* A LOCK_NB only tries once more. */
        pthread_mutex_lock(&fs->flock.lock);
        e = try_locked(fs, fd, op, w.bino, w.tid);
        pthread_mutex_unlock(&fs->flock.lock);
        fuse_reply_err(req, e);
}

void kfs_flock_stop(struct kfs *fs)
{
        pthread_mutex_lock(&fs->flock.lock);
        atomic_store(&fs->flock.stop, true);
        for (;;) { /* a signal may come before a flock starts waiting: repeat until all end */
                bool running = false;
                for (struct kfs_flock_wait *w = fs->flock.list; w; w = w->next)
                        if (!w->done) {
                                running = true;
                                pthread_kill(w->thread, KFS_WAKE_SIGNAL);
                        }
                if (!running)
                        break;
                pthread_cond_broadcast(&fs->flock.cond);
                struct timespec ts = kfs_deadline_ms(10);
                pthread_cond_timedwait(&fs->flock.cond, &fs->flock.lock, &ts);
        }
        waits_join_locked(fs, true);
        while (fs->flock.holders)
                holder_drop_locked(fs, fs->flock.holders->fd);
        pthread_mutex_unlock(&fs->flock.lock);
}
