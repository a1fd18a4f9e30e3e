/* refresh.c: the kernel's attributes of a file handed back, with the logged atime, after each release.
 *
 * WHY. A runtime's hit is open, fstat (or lseek(SEEK_END)) for the size, read to the end, close. The
 * kernel answers the fstat from the attributes it holds, unless they are invalid; two things make them so
 * after every hit: the daemon dropped them at RELEASE, since FUSE has no message that hands the kernel new
 * attributes, only one that drops them, and dropping is how the logged atime reached stat after close
 * (ops-io.c, ATIME); and the kernel drops atime itself after every read through passthrough
 * (fuse_file_accessed). So each hit of a file read before cost two requests that wait, OPEN and GETATTR.
 * Here the GETATTR moves out of the hit: the release still drops the attributes (so that a stat right
 * after it asks, and an older answer still on its way is discarded), and then a child process of the
 * daemon stats the file through the mount with AT_STATX_FORCE_SYNC: the kernel sends that GETATTR, and
 * its answer (with the logged atime, as every answer has) becomes what the kernel holds. Nobody waits for
 * it; the next opener's fstat finds valid attributes and asks nothing. A writer's release only drops: its
 * file is new, and will be looked up and stat'ed by its readers anyway.
 *
 * WHY A CHILD PROCESS, not a thread: spawn.c (a thread of the daemon waiting on its own GETATTR would
 * hang a SIGKILLed daemon's mount). The child also dies when its socket to the daemon closes.
 *
 * HOW IT REACHES THE FILE (the rules of common/tree.h hold for it too, a root process in directories that
 * users write):
 *   - through a clone of the mount (open_tree(OPEN_TREE_CLONE) of the mount point's name in its directory,
 *     held since mount, no symlink: kfs.h, mount_dir), taken by the daemon when it starts the child and
 *     checked to be the mount's device: a detached mount, so umount of the mount point never
 *     meets EBUSY because of it. Since the clone keeps the connection alive, the child watches
 *     /proc/self/mountinfo and exits once no mount of the device is left: the daemon then sees the
 *     connection end and stops, as at any unmount;
 *   - by the names the kernel last looked the file and its directories up, made or renamed them by
 *     (kfs_inode.kdir, kname: kfs_inode_path_locked), resolved with ktree_open_cached: beneath the
 *     clone, no symlink, no other mount, from the kernel's dentry cache only. A name the kernel does not
 *     hold fails instead of sending a LOOKUP, so the child never makes the kernel look anything up as
 *     root, and never waits on a name (a walk that meets a mount change fails with EAGAIN: tried again
 *     CACHED_TRIES times);
 *   - and only if the inode number it reached is the file's: a stale path (its directory was renamed, a
 *     user swapped the name) is a failure, not another file's refresh.
 * What the child could not refresh stays dropped, as without it. After its GETATTR the child also checks,
 * without asking (AT_STATX_DONT_SYNC), that the atime the kernel kept is the logged one or later.
 *
 * ORDER. The drop at each release keeps the promise by itself (ops-io.c, ATIME): from the release on, a
 * stat asks. The refresh only makes asking unneeded again, and must not bring back an older atime: a
 * file is queued once (refresh_pending); a release that finds it queued leaves the refresh to the queued
 * record, whose GETATTR the child sends only after the thread took the record out and cleared the flag,
 * so after that release's open was logged; the atime the child checks for is read then too.
 *
 * COST. One GETATTR per read-only release, on a worker, when no one waits, and a message to the child and
 * one back per batch of releases. The thread, once woken, naps a millisecond before it takes the queue,
 * so that the releases of that millisecond make one batch and one wake-up each of the thread and the
 * child (and readers of one file at once, one record); only the release that finds the thread asleep
 * signals it. A file still open elsewhere is left to the release of its last opener: 8 processes that
 * read the same files at once (ranks at start-up) would otherwise refresh each file several times, each
 * refresh dropped again by the next release. And a file is refreshed at most once in AGAIN_NS (by
 * CLOCK_MONOTONIC): 8 readers of the same tree on 2 cores, whose opens of a file rarely overlap, made
 * 11,600 refreshes for 17,600 releases (bench/JOURNAL.md, fourth round); a file read again that soon is
 * read by a burst, in which the next release drops the refreshed attributes anyway. Those two leave the
 * file dropped, and count nowhere. Nor is a file refreshed whose attributes nobody took while it was
 * open: a release that finds the kernel holding none of ours (attr_cached clear: dropped before this open,
 * and no stat, lookup or permission check of allow_other's default_permissions asked since) queues
 * nothing, unless the release of an overlapping open, which found them held, left its refresh to this one
 * (refresh_owed, set under itable_lock where the openers are counted, before AGAIN_NS or a queued record
 * is looked at). The daemon cannot see a stat the kernel answers from attributes it holds, so those the
 * child handed over count as taken: a file read again and again without a stat is refreshed at each
 * release, AGAIN_NS apart, until a release finds it dropped (one within AGAIN_NS of the last refresh, the
 * end of an overlap, a full queue); it then stays dropped until an opener asks, that ask waits for a
 * GETATTR, and its release refreshes the file again. Readers that never stat (a tool that only reads)
 * kept refreshing each file for nobody: 8 of them on one tree on 2 cores made 3,600 to 6,500 refreshes a
 * pass, a fifth of its time (bench/JOURNAL.md, ninth round). With -o nopassthrough a read past the size
 * the kernel holds asks for it, and with allow_other every open of a dropped file asks: there every
 * release refreshes, as before. The queue holds QUEUE_MAX files, and QUEUE_BYTES_MAX of their paths, at
 * most; past either, releases only drop.
 * The thread and the child start at the first release that needs them, not at mount: under a tasks
 * limit (systemd's TasksMax) a thread made at mount may be the one libfuse then cannot make. A child that
 * cannot start or dies is tried again after RETRY_NS, doubled at each failure in a row (a log line each
 * time); one that ended because the mount is gone (a lazy unmount with files still open), after
 * RETRY_MAX_NS, quietly. Off with -o norefresh, and wherever the daemon is not root (open_tree needs
 * CAP_SYS_ADMIN) or does not log.
 *
 * DIRECTORIES. The kernel drops a directory's atime itself after every READDIR it sends
 * (fuse_readdir_uncached), so the first walk after a listing was read from the daemon (after a cold
 * start, or once the kernel let the cached listing go) made every opendir's fstat ask: a GETATTR per
 * directory that waits, the whole excess of bench/run's readdir row over raw. The end of a listing (the
 * empty READDIR that tells the kernel its cached listing is complete) queues the directory as a release
 * queues a file, before that reply (so the directory cannot be forgotten meanwhile). The kernel drops
 * the atime once the reply is back, in the lister's own time, so the thread sends a directory no sooner
 * than DIR_DELAY_NS after it was queued (and the files of its batch with it: a directory's refresh is
 * never urgent, and a file's is late by as much at most); should the child's GETATTR still come first,
 * the next fstat asks, as without it. What the child could not refresh is only counted (refresh_dropped),
 * not dropped: the kernel dropped the atime alone, and dropping every attribute would make the next path
 * walk through the directory ask for its mode. The child does not compare a directory's atime (it is the
 * backing directory's, which a user may set back).
 *
 * Locks: refresh.lock is a leaf (kfs.h, LOCK ORDER); itable_lock is taken before it, never under it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kfs.h"

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif

#define BATCH 256          /* records sent before their answers are read */
#define AGAIN_NS 100000000LL /* a file's refreshes at least this far apart (COST) */
#define NAP_NS 1000000     /* the thread, woken by a release, waits this long for more (COST) */
#define RETRY_NS (5LL * 1000000000) /* after the thread or the child could not start, or the child died: */
#define RETRY_MAX_NS (300LL * 1000000000) /* doubled at each failure in a row, up to this */
#define QUEUE_MAX 65536    /* files waiting; past it, releases only drop */
#define QUEUE_BYTES_MAX (16u << 20) /* and their paths' bytes, however deep a user made them */
#define CACHED_TRIES 3     /* a walk of the dentry cache fails with EAGAIN while any mount changes */
#define ANSWER_MS 10000    /* the child's answers to a batch: beyond this it is killed */
#define DIR_DELAY_NS 20000000LL /* a directory's refresh at least this long after its listing ended */

enum { FD_TREE = 3, FD_SOCK = 4 }; /* the child's */

struct kfs_refresh_item {
        fuse_ino_t ino;       /* the kernel's number, for a drop: valid after the reference went too */
        struct kfs_inode *in; /* a lookup reference, until taken by the thread */
        uint64_t bino;
        int64_t atime;
        int64_t not_before;   /* a directory's: CLOCK_MONOTONIC ns (DIRECTORIES); 0 for a file */
        char *path;
        size_t len;           /* strlen(path) */
};

/* One record: the header and the path, without its NUL. */
struct rec {
        uint64_t bino;
        int64_t atime;
};

/* The thread is done with the session and the inode table for now (kfs_refresh_close waits for it). */
static void idle(struct kfs *fs)
{
        pthread_mutex_lock(&fs->refresh.lock);
        if (!--fs->refresh.busy && fs->refresh.closed)
                pthread_cond_broadcast(&fs->refresh.cond);
        pthread_mutex_unlock(&fs->refresh.lock);
}

/* A file the child did not refresh: the release dropped its attributes already, and a stat since may
 * have fetched them again; dropped again, in case an older answer than the child's landed meanwhile.
 * Not once the session is going (kfs_refresh_close waits for one under way). No lock of ours is held
 * while the kernel is notified (kfs.h). */
static void drop(struct kfs *fs, fuse_ino_t ino)
{
        atomic_fetch_add_explicit(&fs->refresh.dropped, 1, memory_order_relaxed);
        pthread_mutex_lock(&fs->refresh.lock);
        bool go = !fs->refresh.closed;
        fs->refresh.busy += go;
        pthread_mutex_unlock(&fs->refresh.lock);
        if (!go)
                return;
        fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0); /* by number: in may be gone, harmless */
        idle(fs);
}

static int clone_mount(struct kfs *fs)
{
        if (fs->mount_dir < 0)
                return -EBADF;
        /* the mount point's name in its directory, held since mount (kfs.h: mount_dir), no symlink */
        int fd = (int)syscall(SYS_open_tree, fs->mount_dir, fs->mount_name,
                              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
        if (fd < 0)
                return -errno;
        struct statx sx;
        /* DONT_SYNC: the device is the superblock's; nothing is asked of the daemon, whose thread this is */
        if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) < 0) {
                int e = -errno;
                close(fd);
                return e;
        }
        if (!fs->mount_dev || makedev(sx.stx_dev_major, sx.stx_dev_minor) != fs->mount_dev) {
                close(fd);
                return -EXDEV; /* something else is mounted there now */
        }
        return fd;
}

void kfs_refresh_setup(struct kfs *fs)
{
        pthread_mutex_init(&fs->refresh.lock, NULL);
        pthread_cond_init(&fs->refresh.cond, NULL);
        if (fs->o.norefresh || fs->o.nolog || geteuid() != 0)
                return;
        int fd = clone_mount(fs); /* can it be cloned at all */
        if (fd < 0) {
                kfs_log(LOG_NOTICE, "attributes are dropped at release, not refreshed: "
                                    "cannot clone the mount: %s", strerror(-fd));
                return;
        }
        close(fd);
        fs->refresh.wanted = true;
}

/* ---- the daemon's thread ---- */

struct child {
        pid_t pid;
        int sock;
};

/* Ends the child (killed, or already gone); its exit status, or -1. */
static int child_end(struct kfs *fs, struct child *c, bool kill_it)
{
        if (!c->pid)
                return -1;
        atomic_store(&fs->refresh.child, 0);
        if (kill_it)
                kill(c->pid, SIGKILL);
        close(c->sock);
        c->sock = -1;
        int st = 0;
        while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) /* a child in a request the daemon holds */
                ;                                             /* ends once it is answered */
        c->pid = 0;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int child_start(struct kfs *fs, struct child *c)
{
        int sv[2], tree = clone_mount(fs);
        if (tree < 0)
                return tree;
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
                int e = -errno;
                close(tree);
                return e;
        }
        char dev[40];
        snprintf(dev, sizeof(dev), "%u:%u", major(fs->mount_dev), minor(fs->mount_dev));
        char *argv[] = { "kcachefs", "--refresh-child", dev, NULL };
        int fds[] = { tree, sv[1] }; /* FD_TREE, FD_SOCK */
        pid_t pid;
        int r = kfs_spawn_self(argv, fds, 2, &pid);
        close(tree);
        close(sv[1]);
        if (r < 0) {
                close(sv[0]);
                return r;
        }
        /* the child answers within ANSWER_MS, or is taken for stuck: the thread never blocks longer */
        struct timeval tv = { .tv_sec = ANSWER_MS / 1000 };
        (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        c->pid = pid;
        c->sock = sv[0];
        atomic_store(&fs->refresh.child, pid);
        return 0;
}

/* Sends the batch (one message a record: its rec and its path) and reads its answers; fills ok[]. False:
 * the child is gone or broken. */
static bool exchange(struct kfs *fs, struct child *c, struct kfs_refresh_item *b, size_t n, bool *ok)
{
        struct rec recs[BATCH];
        struct iovec iov[BATCH][2];
        struct mmsghdr m[BATCH];
        for (size_t i = 0; i < n; i++) {
                recs[i] = (struct rec){ .bino = b[i].bino, .atime = b[i].atime };
                iov[i][0] = (struct iovec){ &recs[i], sizeof(recs[i]) };
                iov[i][1] = (struct iovec){ b[i].path, b[i].len };
                m[i] = (struct mmsghdr){ .msg_hdr = { .msg_iov = iov[i], .msg_iovlen = 2 } };
        }
        for (size_t sent = 0; sent < n;) { /* one system call for the batch, where the socket takes it */
                int k = sendmmsg(c->sock, m + sent, (unsigned)(n - sent), MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return false;
                sent += (size_t)k;
        }
        size_t got = 0;
        while (got < n) {
                struct pollfd p = { .fd = c->sock, .events = POLLIN };
                int pr = poll(&p, 1, ANSWER_MS);
                if (pr < 0 && errno == EINTR)
                        continue;
                if (pr <= 0)
                        return false;
                char ans[BATCH];
                ssize_t k = recv(c->sock, ans, sizeof(ans), 0);
                if (k <= 0 || (size_t)k > n - got)
                        return false;
                for (ssize_t i = 0; i < k; i++)
                        ok[got++] = ans[i] == 0;
        }
        return true;
}

static void *refresher(void *arg)
{
        struct kfs *fs = arg;
        struct child c = { .pid = 0, .sock = -1 };
        struct kfs_refresh_item b[BATCH];
        bool ok[BATCH];
        pthread_mutex_lock(&fs->refresh.lock);
        for (;;) {
                while (!fs->refresh.n && !fs->refresh.stop) {
                        fs->refresh.sleeping = true;
                        pthread_cond_wait(&fs->refresh.cond, &fs->refresh.lock);
                        fs->refresh.sleeping = false;
                }
                if (fs->refresh.n < BATCH && !fs->refresh.stop) { /* (COST) a moment for the batch to fill */
                        pthread_mutex_unlock(&fs->refresh.lock);
                        nanosleep(&(struct timespec){ .tv_nsec = NAP_NS }, NULL);
                        pthread_mutex_lock(&fs->refresh.lock);
                }
                size_t n = fs->refresh.n < BATCH ? fs->refresh.n : BATCH;
                memcpy(b, fs->refresh.q, n * sizeof(b[0]));
                memmove(fs->refresh.q, fs->refresh.q + n, (fs->refresh.n - n) * sizeof(b[0]));
                fs->refresh.n -= n;
                for (size_t i = 0; i < n; i++)
                        fs->refresh.bytes -= b[i].len + 1;
                bool closed = fs->refresh.closed, stop = fs->refresh.stop;
                bool may_start = kfs_mono_ns() >= fs->refresh.retry_at;
                fs->refresh.busy += !closed;
                pthread_mutex_unlock(&fs->refresh.lock);
                if (closed) { /* the session is going: no inode is touched (the table frees them at exit) */
                        for (size_t i = 0; i < n; i++)
                                free(b[i].path);
                        if (stop)
                                break;
                        pthread_mutex_lock(&fs->refresh.lock);
                        continue;
                }
                /* (ORDER) from here, a release of the same file queues it again */
                int64_t not_before = 0;
                for (size_t i = 0; i < n; i++) {
                        atomic_store(&b[i].in->refresh_pending, false);
                        /* a directory's atime is the backing one's, which the child cannot compare */
                        b[i].atime = b[i].not_before ? INT64_MIN : atomic_load(&b[i].in->atime_ns);
                        if (b[i].not_before > not_before)
                                not_before = b[i].not_before;
                        kfs_inode_unref(fs, b[i].in, 1);
                }
                idle(fs);
                int64_t wait = not_before - kfs_mono_ns(); /* (DIRECTORIES) */
                if (wait > 0 && (c.pid || may_start)) {
                        struct timespec ts = { .tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000 };
                        nanosleep(&ts, NULL);
                }
                int r = 0;
                bool failed = false;
                if (!c.pid && may_start && (r = child_start(fs, &c)) < 0) {
                        kfs_log(LOG_WARNING, "attributes are dropped at release for now, not refreshed: "
                                             "cannot start the refresher: %s", strerror(-r));
                        failed = true;
                }
                bool sent = c.pid && exchange(fs, &c, b, n, ok);
                int64_t again = 0;
                if (c.pid && !sent) {
                        if (child_end(fs, &c, true) == 0) { /* the mount is gone (a lazy unmount, files open) */
                                again = RETRY_MAX_NS;
                        } else {
                                kfs_log(LOG_WARNING, "the refresher ended or stopped answering: attributes are "
                                                     "dropped at release for a while");
                                failed = true;
                        }
                }
                for (size_t i = 0; i < n; i++) {
                        if (sent && ok[i])
                                atomic_fetch_add_explicit(&fs->refresh.sent, 1, memory_order_relaxed);
                        else if (b[i].not_before) /* (DIRECTORIES) the kernel dropped its atime only */
                                atomic_fetch_add_explicit(&fs->refresh.dropped, 1, memory_order_relaxed);
                        else
                                drop(fs, b[i].ino);
                        free(b[i].path);
                }
                pthread_mutex_lock(&fs->refresh.lock);
                if (failed) {
                        int64_t w = fs->refresh.backoff ? 2 * fs->refresh.backoff : RETRY_NS;
                        again = fs->refresh.backoff = w < RETRY_MAX_NS ? w : RETRY_MAX_NS;
                } else if (sent) {
                        fs->refresh.backoff = 0;
                }
                if (again)
                        fs->refresh.retry_at = kfs_mono_ns() + again;
        }
        child_end(fs, &c, true);
        return NULL;
}

/* Queues in for the child (1), unless COST or ORDER says not now (0); -1 where it cannot be queued. The
 * checks come in this order, under itable_lock where the openers are counted: a release that leaves the
 * refresh to a later opener's must leave it owed whatever AGAIN_NS or a queued record would have said of
 * its own, since the later release may come past both. */
static int enqueue(struct kfs *fs, struct kfs_inode *in, fuse_ino_t ino, int64_t now, bool dir)
{
        struct kfs_refresh_item it = { .ino = ino, .in = in, .bino = in->bino,
                                       .not_before = dir ? now + DIR_DELAY_NS : 0 };
        char path[KFS_KPATH_MAX];
        int64_t last = atomic_load(&in->refresh_ns);
        pthread_mutex_lock(&fs->itable_lock);
        if (in->readers || in->writers) { /* (COST) open elsewhere: its last close refreshes it */
                if (!dir)
                        atomic_store(&in->refresh_owed, true); /* a listing has no openers to count */
                pthread_mutex_unlock(&fs->itable_lock);
                return 0;
        }
        if ((last && now - last < AGAIN_NS) || atomic_exchange(&in->refresh_pending, true)) {
                pthread_mutex_unlock(&fs->itable_lock); /* (COST); or queued, not yet sent: that record
                                                           refreshes it (ORDER) */
                return 0;
        }
        it.path = kfs_inode_path_locked(fs, in, path, sizeof(path)) == 0 ? strdup(path) : NULL;
        if (it.path && in != &fs->root)
                in->nlookup++; /* the queue's reference: in lives until it is sent (T1); the root always */
        pthread_mutex_unlock(&fs->itable_lock);
        if (!it.path) {
                atomic_store(&in->refresh_pending, false);
                return -1;
        }
        pthread_mutex_lock(&fs->refresh.lock);
        it.len = strlen(it.path);
        bool ok = !fs->refresh.closed && fs->refresh.n < QUEUE_MAX &&
                  fs->refresh.bytes + it.len + 1 <= QUEUE_BYTES_MAX &&
                  (fs->refresh.started || kfs_mono_ns() >= fs->refresh.retry_at);
        if (ok && fs->refresh.n == fs->refresh.cap) {
                size_t cap = fs->refresh.cap ? 2 * fs->refresh.cap : 64;
                struct kfs_refresh_item *q = realloc(fs->refresh.q, cap * sizeof(*q));
                ok = q != NULL;
                if (q) {
                        fs->refresh.q = q;
                        fs->refresh.cap = cap;
                }
        }
        if (ok && !fs->refresh.started) {
                fs->refresh.started = kfs_thread_start(&fs->refresh.thread, 0, refresher, fs) == 0;
                if (!fs->refresh.started) {
                        fs->refresh.retry_at = kfs_mono_ns() + RETRY_NS;
                        ok = false;
                }
        }
        if (ok) {
                atomic_store(&in->refresh_ns, now); /* (COST) */
                fs->refresh.q[fs->refresh.n++] = it;
                fs->refresh.bytes += it.len + 1;
                if (fs->refresh.sleeping)
                        pthread_cond_signal(&fs->refresh.cond);
        }
        pthread_mutex_unlock(&fs->refresh.lock);
        if (!ok) {
                atomic_store(&in->refresh_pending, false);
                free(it.path);
                kfs_inode_unref(fs, in, 1);
        }
        return ok ? 1 : -1;
}

/* Queues in for the child, unless COST or ORDER says not now (enqueue). */
static void queue(struct kfs *fs, struct kfs_inode *in, fuse_ino_t ino, bool dir)
{
        if (!fs->refresh.wanted || kfs_stale(in))
                return;
        if (enqueue(fs, in, ino, kfs_mono_ns(), dir) < 0)
                atomic_fetch_add_explicit(&fs->refresh.dropped, 1, memory_order_relaxed);
}

void kfs_refresh_release(struct kfs *fs, struct kfs_inode *in, fuse_ino_t ino, bool writer)
{
        if (fs->o.nolog || !S_ISREG(in->type))
                return;
        /* Attributes only (offset -1): no inode lock in the kernel, safe from a handler. Not when the
         * kernel holds none of ours since the last drop: it asks anyway. */
        bool held = atomic_exchange(&in->attr_cached, false);
        if (held)
                fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
        /* Read after this release's count of openers went down under itable_lock (ops-io.c): an overlapping
         * release that saw this one still open had set it by then, under the same lock. */
        bool owed = !writer && atomic_exchange(&in->refresh_owed, false); /* a writer's release refreshes
                                                                            nothing: owed to a reader's */
        if (!writer && (held || owed)) /* (COST) nobody took the attributes: nobody is owed new ones */
                queue(fs, in, ino, false);
}

void kfs_refresh_listed(struct kfs *fs, struct kfs_inode *dir, fuse_ino_t ino)
{
        queue(fs, dir, ino, true); /* (DIRECTORIES) the kernel drops the atime itself: no notification */
}

void kfs_refresh_close(struct kfs *fs)
{
        if (!fs->refresh.wanted)
                return;
        pthread_mutex_lock(&fs->refresh.lock);
        fs->refresh.closed = true;
        while (fs->refresh.busy)
                pthread_cond_wait(&fs->refresh.cond, &fs->refresh.lock);
        pthread_mutex_unlock(&fs->refresh.lock);
}

void kfs_refresh_stop(struct kfs *fs)
{
        if (!fs->refresh.wanted)
                return;
        pthread_mutex_lock(&fs->refresh.lock);
        fs->refresh.closed = fs->refresh.stop = true;
        bool started = fs->refresh.started;
        pthread_cond_signal(&fs->refresh.cond);
        pthread_mutex_unlock(&fs->refresh.lock);
        /* A thread waiting for its child's answers has them now: the connection is gone, so the child's
         * request ended; the thread then ends its child itself (never a pid it may have reaped). */
        if (started)
                pthread_join(fs->refresh.thread, NULL);
        for (size_t i = 0; i < fs->refresh.n; i++) /* their inodes go with the table (kfs_inode_table_free) */
                free(fs->refresh.q[i].path);
        free(fs->refresh.q);
        fs->refresh.q = NULL;
        fs->refresh.n = fs->refresh.cap = fs->refresh.bytes = 0;
}

/* ---- the child ---- */

/* Whether a mount of device dev is left (the clone, detached, is not in mountinfo). */
static bool mounted(int mi, dev_t dev)
{
        char buf[1 << 16], want[48];
        snprintf(want, sizeof(want), " %u:%u ", major(dev), minor(dev));
        if (lseek(mi, 0, SEEK_SET) < 0)
                return false;
        /* Read whole; a line split across two reads is kept by carrying its start over. */
        size_t have = 0;
        for (;;) {
                ssize_t k = read(mi, buf + have, sizeof(buf) - 1 - have);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return false;
                have += (size_t)k;
                buf[have] = 0;
                char *last = strrchr(buf, '\n');
                if (!last)
                        return true; /* a line longer than the buffer: say yes, look again at the next change */
                *last = 0;
                for (char *line = buf; line;) {
                        char *nl = strchr(line, '\n');
                        if (nl)
                                *nl = 0;
                        /* "ID PARENT MAJ:MIN ROOT ...": the third field */
                        char *p = strchr(line, ' ');
                        p = p ? strchr(p + 1, ' ') : NULL;
                        if (p && !strncmp(p, want, strlen(want)))
                                return true;
                        line = nl ? nl + 1 : NULL;
                }
                size_t rest = have - (size_t)(last + 1 - buf);
                memmove(buf, last + 1, rest);
                have = rest;
        }
}

/* 0: the file at path is inode bino and the kernel holds an atime of at least atime, fresh from the daemon. */
static int refresh_one(const struct ktree *t, const char *path, uint64_t bino, int64_t atime)
{
        int fd = -EAGAIN;
        for (int i = 0; i < CACHED_TRIES && fd == -EAGAIN; i++)
                fd = ktree_open_cached(t, KTREE_ROOT, path);
        if (fd < 0)
                return fd;
        struct statx sx;
        const int how = AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW;
        int r = statx(fd, "", how | AT_STATX_FORCE_SYNC, STATX_INO | STATX_ATIME, &sx) < 0 ? -errno : 0;
        if (r == 0 && sx.stx_ino != bino)
                r = -ESTALE;
        else if (r == 0 && statx(fd, "", how | AT_STATX_DONT_SYNC, STATX_ATIME, &sx) == 0 &&
                 (int64_t)sx.stx_atime.tv_sec * 1000000000LL + sx.stx_atime.tv_nsec < atime)
                r = -EAGAIN; /* an older answer landed after ours */
        close(fd);
        return r;
}

int kfs_refresh_child(const char *devs)
{
        unsigned ma, mi_;
        char end;
        if (sscanf(devs, "%u:%u%c", &ma, &mi_, &end) != 2)
                return 2;
        dev_t dev = makedev(ma, mi_);
        prctl(PR_SET_NAME, "kcachefs-rfr"); /* exec'd as /proc/self/exe: "exe" otherwise */
        signal(SIGHUP, SIG_IGN); /* the daemon's (its terminal's, with -f): the child ends with the mount */
        signal(SIGINT, SIG_IGN);
        struct statx sx;
        if (statx(FD_TREE, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) < 0 ||
            makedev(sx.stx_dev_major, sx.stx_dev_minor) != dev || fcntl(FD_SOCK, F_GETFD) < 0)
                return 2;
        struct ktree t = { .root = FD_TREE, .dev = dev };
        int mi = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
        if (mi < 0)
                return 2;
        char buf[sizeof(struct rec) + KFS_KPATH_MAX + 1];
        char ans[BATCH];
        if (!mounted(mi, dev))
                return 0;
        for (;;) {
                struct pollfd p[2] = { { .fd = FD_SOCK, .events = POLLIN }, { .fd = mi, .events = POLLPRI } };
                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        return 1;
                }
                if (p[1].revents && !mounted(mi, dev))
                        return 0; /* unmounted: the clone goes with us, and the daemon sees the end */
                if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
                        continue;
                size_t n = 0;
                for (; n < BATCH; n++) {
                        ssize_t k = recv(FD_SOCK, buf, sizeof(buf) - 1, n ? MSG_DONTWAIT : 0);
                        if (k < 0 && n && (errno == EAGAIN || errno == EWOULDBLOCK))
                                break;
                        if (k <= 0)
                                return k == 0 ? 0 : 1; /* the daemon is gone */
                        struct rec r;
                        if ((size_t)k < sizeof(r)) {
                                ans[n] = 1;
                                continue;
                        }
                        memcpy(&r, buf, sizeof(r));
                        buf[k] = 0;
                        ans[n] = refresh_one(&t, buf + sizeof(r), r.bino, r.atime) == 0 ? 0 : 1;
                }
                if (send(FD_SOCK, ans, n, MSG_NOSIGNAL) < 0)
                        return 1;
        }
}
