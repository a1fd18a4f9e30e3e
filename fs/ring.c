/* ring.c: FUSE over io_uring (Linux 6.14+, with the fuse module's enable_uring parameter on).
 *
 * WHY. Through /dev/fuse every request costs the daemon a read(2) and a writev(2), and the worker that
 * takes it is whichever one the kernel wakes, usually on another CPU than the process that asked. On a
 * small virtual machine that cross-CPU wakeup is most of a request's cost: a warm open+read+close took
 * 107 ms for 2,200 files with the reader and the daemon pinned to one CPU, and 200 ms unpinned. With
 * io_uring the kernel keeps one queue of requests per CPU; a request waits in the queue of the CPU its
 * process runs on, and the daemon's threads for that queue are pinned there, so the handoff is a local
 * context switch, and one io_uring_enter(2) both returns a reply and waits for the next request.
 *
 * HOW, WITH LIBFUSE 3.14 (which predates io_uring support, 3.18). The kernel's protocol:
 *   - INIT's reply carries FUSE_OVER_IO_URING when the kernel offered it (devio.c);
 *   - after that, each ring entry (a 288-byte header buffer and a payload buffer as large as the largest
 *     request) is registered with an IORING_OP_URING_CMD (FUSE_IO_UFK_URING_CMD_REGISTER, 128-byte SQEs) on
 *     /dev/fuse, naming its queue. Once every queue (one per possible CPU) has an entry, the kernel sends
 *     requests through the rings; FORGET and INTERRUPT still come through /dev/fuse, where libfuse's
 *     workers go on reading;
 *   - the command completes when a request is in the entry: the fuse_in_header, the operation's own
 *     header (its first argument) in a separate 128-byte slot, and the rest in the payload. The daemon
 *     answers with FUSE_IO_UFK_URING_CMD_COMMIT_AND_FETCH: the fuse_out_header in the header buffer, the
 *     reply's arguments in the payload, which also re-arms the entry.
 * libfuse's request handling is reused for every request but OPEN and RELEASE, which direct.c answers
 * itself (libfuse's session lock): a request is rebuilt in the /dev/fuse layout just before
 * its payload (the payload buffer starts 256 bytes into the entry's allocation, so only the two small
 * headers are copied, never the data) and given to fuse_session_process_buf; its reply comes back
 * through our writev (devio.c), which recognizes a ring request by its unique id and copies the reply
 * into that entry instead of writing /dev/fuse.
 *
 * THREADS. Each queue gets RING_THREADS threads pinned to its CPU, each with its own io_uring (single
 * issuer, task work deferred to its own waits) and one entry. The kernel hands a request only to an
 * entry waiting for one, so a thread busy in a slow handler (an fsync, an eviction) gets no new request;
 * the other takes it. A handler that answers later from another thread (a flock() that must wait) keeps
 * its entry out of the kernel until then, so its thread registers a new one at once where none of its
 * others waits in the kernel (handle): 24 processes queued on one lock must not take every entry, the
 * unlock's included. That reply is handed to the
 * entry's owner through a list and an eventfd that the owner's ring always has a read pending on: all
 * of a ring's submissions come from its owner.
 *
 * A QUEUE NEVER STALLS. The kernel gives a request to an entry that waits for one; with none waiting, it
 * queues the request, and takes queued requests only when an entry commits a reply (COMMIT_AND_FETCH), not
 * when a new entry registers. So after a burst of flock() waits that took every entry at once (64 waiters
 * here, 2 entries per queue), the requests queued in that moment, an OPENDIR or the unlock that ends
 * the waits among them, stayed queued behind the new entries until some unrelated request came and was
 * answered: `ls` of the mount hung. So whenever a thread registered new entries for replies held back, it
 * also starts a nudge: a short thread that has one request made (a statfs of the mount, by a helper
 * process of its own, spawn.c) on that queue's CPU, after the new entries are in. An entry answers it,
 * and that commit takes the next queued request, whose answer takes the next. A nudge is a thread of its
 * own, not a turn of one nudger, since a nudge can itself be queued in such a moment (a request of the
 * burst took the new entry first); it is then answered with the rest, and the deferral that took the
 * entry starts a nudge of its own, so the last event of any burst is a nudge that finds an entry
 * waiting. At most NUDGES_MAX run at once.
 *
 * A LOCK AFTER ITS HOLDER EXITED. With the rings, a holder's RELEASE (queued at its last close) waits in
 * its CPU's queue while a LOCK_NB from another CPU may be served first; flock.c waits for it. Until that
 * was found, this was opt-in (test_fs_posix.py's flock test failed about 1 run in 50).
 *
 * THE KERNEL'S SWITCH. The kernel offers io_uring in INIT only while the fuse module's enable_uring
 * parameter is on, and it is off by default. It only allows daemons that ask for io_uring to use it,
 * so a root daemon turns it on before mounting (and says so), on the kernels it was tested on (6.18+);
 * -o nouring leaves it alone. When the kernel does not offer it, everything goes through /dev/fuse. */
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fuse-kernel.h"
#include "kfs.h"

#define RING_THREADS 2            /* per queue */
#define RING_ROOM 256             /* before the payload: where a request's headers are rebuilt */
#define RING_TAG_EVENT 1          /* user_data of the eventfd read; entries use their address */

struct ring_ent {
        struct ring_thread *t;
        _Atomic uint64_t unique;  /* the request it holds; 0: none */
        bool replied;             /* owner: the reply is in the buffers */
        bool fetched;             /* owner: the kernel has put a request in it (its REGISTER worked) */
        struct fk_uring_req_header hdr;
        char *area;               /* RING_ROOM + payload */
        struct iovec iov[2];
        struct ring_ent *next;    /* handoff list; t->lock */
        struct ring_ent *_Atomic all; /* every entry of the rings, newest first (never shrinks) */
};

struct ring_thread {
        struct kfs *fs;
        unsigned qid;
        int fd, efd;
        uint64_t ebuf;
        /* The mapped rings. */
        unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
        struct io_uring_cqe *cqes;
        char *sqes;
        void *sq_map, *cq_map, *sqe_map;
        size_t sq_len, cq_len, sqe_len;
        unsigned pending;         /* SQEs written, not yet submitted */
        pthread_t th;
        bool started;
        unsigned sq_entries;
        bool ok;                  /* set up, its entry's registration submitted */
        bool nudge;               /* owner: registered entries for replies held back in this batch */
        unsigned nents;           /* owner: its entries in use (registered, not refused) */
        unsigned held;            /* owner: its entries out of the kernel for a reply sent later */
        pthread_mutex_t lock;
        struct ring_ent *handoff; /* replies from other threads; lock */
};

struct kfs_ring {
        unsigned nq, nt;
        size_t payload;
        _Atomic bool stop;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        unsigned reported;        /* threads that set up (or failed to); lock */
        _Atomic int err;          /* the first failure to set up or register, as errno; 0: none */
        _Atomic bool down;        /* the kernel does not use the rings (a queue without an entry) */
        struct ring_thread probe; /* made before INIT's reply, by the thread that sends it */
        struct ring_thread *t;    /* nt */
        struct ring_ent *_Atomic ents; /* list through ->all */
        _Atomic unsigned nents;   /* entries in use, all threads (kfs_ring_state) */
        _Atomic unsigned nudges;  /* nudge threads running (A QUEUE NEVER STALLS) */
        pthread_mutex_t nudge_lock; /* a leaf: the list of nudges started, not yet joined */
        struct nudge *nudge_list;
        _Atomic uint64_t nudged;  /* nudges made since mount */
};

static __thread struct ring_ent *cur_ent; /* the request this thread is handling */

static int ring_setup(struct ring_thread *t)
{
        struct io_uring_params p = { .flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER |
                                              IORING_SETUP_DEFER_TASKRUN };
        t->fd = (int)syscall(__NR_io_uring_setup, 64, &p);
        if (t->fd < 0)
                return -errno;
        t->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
        t->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
        if (p.features & IORING_FEAT_SINGLE_MMAP)
                t->sq_len = t->cq_len = t->sq_len > t->cq_len ? t->sq_len : t->cq_len;
        t->sq_map = mmap(NULL, t->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, t->fd, IORING_OFF_SQ_RING);
        if (t->sq_map == MAP_FAILED)
                return -errno;
        t->cq_map = t->sq_map;
        if (!(p.features & IORING_FEAT_SINGLE_MMAP)) {
                t->cq_map = mmap(NULL, t->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, t->fd,
                                 IORING_OFF_CQ_RING);
                if (t->cq_map == MAP_FAILED)
                        return -errno;
        }
        t->sqe_len = p.sq_entries * 128;
        t->sqe_map = mmap(NULL, t->sqe_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, t->fd, IORING_OFF_SQES);
        if (t->sqe_map == MAP_FAILED)
                return -errno;
        char *sq = t->sq_map, *cq = t->cq_map;
        t->sq_head = (unsigned *)(sq + p.sq_off.head);
        t->sq_tail = (unsigned *)(sq + p.sq_off.tail);
        t->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
        t->sq_array = (unsigned *)(sq + p.sq_off.array);
        t->cq_head = (unsigned *)(cq + p.cq_off.head);
        t->cq_tail = (unsigned *)(cq + p.cq_off.tail);
        t->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
        t->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
        t->sqes = t->sqe_map;
        t->sq_entries = p.sq_entries;
        return 0;
}

static void ring_unmap(struct ring_thread *t)
{
        if (t->sqe_map && t->sqe_map != MAP_FAILED)
                munmap(t->sqe_map, t->sqe_len);
        if (t->cq_map && t->cq_map != MAP_FAILED && t->cq_map != t->sq_map)
                munmap(t->cq_map, t->cq_len);
        if (t->sq_map && t->sq_map != MAP_FAILED)
                munmap(t->sq_map, t->sq_len);
        if (t->fd >= 0)
                close(t->fd);
        t->fd = -1;
}

static void sq_publish(struct ring_thread *t)
{
        __atomic_store_n(t->sq_tail, *t->sq_tail + t->pending, __ATOMIC_RELEASE);
}

/* Submits every SQE not yet consumed; then waits for a completion if wait. */
static int ring_enter(struct ring_thread *t, bool wait)
{
        sq_publish(t);
        t->pending = 0;
        for (;;) {
                unsigned n = *t->sq_tail - __atomic_load_n(t->sq_head, __ATOMIC_ACQUIRE);
                long r = syscall(__NR_io_uring_enter, t->fd, n, wait ? 1 : 0, wait ? IORING_ENTER_GETEVENTS : 0, NULL, 0);
                if (r >= 0)
                        return 0;
                if (errno != EINTR && errno != EAGAIN && errno != EBUSY)
                        return -errno;
                if (!wait)
                        return 0;
        }
}

static struct io_uring_sqe *sqe_get(struct ring_thread *t)
{
        if (*t->sq_tail + t->pending - __atomic_load_n(t->sq_head, __ATOMIC_ACQUIRE) >= t->sq_entries)
                (void)ring_enter(t, false); /* full: hand what is there to the kernel first */
        unsigned tail = *t->sq_tail + t->pending, i = tail & *t->sq_mask;
        struct io_uring_sqe *s = (struct io_uring_sqe *)(t->sqes + (size_t)i * 128);
        memset(s, 0, 128);
        t->sq_array[i] = i;
        t->pending++;
        return s;
}

static void sqe_cmd(struct ring_thread *t, struct ring_ent *e, unsigned op, uint64_t commit_id)
{
        struct io_uring_sqe *s = sqe_get(t);
        s->opcode = IORING_OP_URING_CMD;
        s->fd = t->fs->devio.fd;
        s->cmd_op = op;
        s->addr = (uint64_t)(uintptr_t)e->iov;
        s->len = 2;
        s->user_data = (uint64_t)(uintptr_t)e;
        struct fk_uring_cmd_req *c = (struct fk_uring_cmd_req *)s->cmd;
        c->commit_id = commit_id;
        c->qid = (uint16_t)t->qid;
}

static void sqe_event(struct ring_thread *t)
{
        struct io_uring_sqe *s = sqe_get(t);
        s->opcode = IORING_OP_READ;
        s->fd = t->efd;
        s->addr = (uint64_t)(uintptr_t)&t->ebuf;
        s->len = sizeof(t->ebuf);
        s->off = (uint64_t)-1;
        s->user_data = RING_TAG_EVENT;
}

/* A new entry for t, registered by the caller (in t's thread). */
static struct ring_ent *ent_new(struct ring_thread *t)
{
        struct kfs_ring *r = t->fs->ring;
        struct ring_ent *e = calloc(1, sizeof(*e));
        if (!e)
                return NULL;
        e->area = mmap(NULL, RING_ROOM + r->payload, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (e->area == MAP_FAILED) {
                free(e);
                return NULL;
        }
        e->t = t;
        e->iov[0] = (struct iovec){ &e->hdr, sizeof(e->hdr) };
        e->iov[1] = (struct iovec){ e->area + RING_ROOM, r->payload };
        struct ring_ent *head = atomic_load(&r->ents);
        do
                e->all = head;
        while (!atomic_compare_exchange_weak(&r->ents, &head, e));
        t->nents++;
        atomic_fetch_add(&r->nents, 1);
        return e;
}

static void commit(struct ring_thread *t, struct ring_ent *e)
{
        sqe_cmd(t, e, FK_URING_CMD_COMMIT_AND_FETCH, e->hdr.ent.commit_id);
}

/* A request is in e: OPEN and RELEASE answered here (direct.c); any other rebuilt in /dev/fuse's layout right
 * before the payload, and run by libfuse. */
static void handle(struct ring_thread *t, struct ring_ent *e)
{
        struct fk_in_header in;
        memcpy(&in, e->hdr.in_out, sizeof(in));
        uint32_t psz = e->hdr.ent.payload_sz;
        size_t op = in.len >= sizeof(in) + psz ? in.len - sizeof(in) - psz : SIZE_MAX;
        if (op > sizeof(e->hdr.op_in) || psz > t->fs->ring->payload) {
                /* Not a request the protocol can produce: answer EIO rather than guess. */
                struct fk_out_header o = { .len = sizeof(o), .error = -EIO, .unique = in.unique };
                memcpy(e->hdr.in_out, &o, sizeof(o));
                e->hdr.ent.payload_sz = 0;
                commit(t, e);
                return;
        }
        atomic_fetch_add_explicit(&t->fs->ring_requests, 1, memory_order_relaxed);
        kfs_count_request(t->fs, in.opcode, in.pid);
        if (t->fs->direct && (in.opcode == FK_OPEN || in.opcode == FK_RELEASE)) { /* (direct.c) */
                struct fk_out_header o;
                int n = kfs_direct(t->fs, &in, e->hdr.op_in, op, &o, e->area + RING_ROOM);
                if (n >= 0) {
                        /* its note in direct_seen before the reply's header, which stands where the
                         * request's was (kfs_direct_owns reads them the other way round) */
                        atomic_thread_fence(memory_order_release);
                        memcpy(e->hdr.in_out, &o, sizeof(o));
                        e->hdr.ent.payload_sz = (uint32_t)n;
                        commit(t, e);
                        return;
                }
        }
        char *start = e->area + RING_ROOM - sizeof(in) - op;
        memcpy(start, &in, sizeof(in));
        memcpy(start + sizeof(in), e->hdr.op_in, op);
        struct fuse_buf b = { .size = in.len, .mem = start };
        e->replied = false;
        atomic_store(&e->unique, in.unique);
        cur_ent = e;
        fuse_session_process_buf(t->fs->se, &b);
        cur_ent = NULL;
        if (e->replied) {
                commit(t, e);
                return;
        }
        /* The reply comes later from another thread (a flock() that waits) and e stays out of the kernel
         * until then; the kernel gives requests only to entries waiting for one, so without one this
         * thread would take none meanwhile, and enough waiters would leave no entry at all, the request
         * that ends their wait included. So where none of the thread's other entries waits in the kernel,
         * a new one is registered. Entries are never given back, but one whose reply went (take_handoff)
         * waits in the kernel again, and counts as such here: a thread has one more entry than the most
         * replies it ever held back at once. (A new entry at every reply held back made them grow with
         * every flock() that ever waited: 64 MiB of mappings and the kernel's entries for 64 waits, one
         * after the other.) */
        if (t->nents > ++t->held)
                return;
        struct ring_ent *n = ent_new(t);
        if (n) {
                sqe_cmd(t, n, FK_URING_CMD_REGISTER, 0);
                t->nudge = true;
        }
}

#define NUDGES_MAX 256

/* A nudge's thread is joined, never detached: by the next nudge() once it is done, or by kfs_ring_free,
 * so that none outlives the ring (a detached thread still exiting as the daemon exits is a known cause
 * of LeakSanitizer's tracer faulting), and none reads a ring that was freed. */
struct nudge {
        struct kfs *fs;
        struct kfs_ring *r;       /* kept, not freed, while a nudge runs (kfs_ring_free) */
        unsigned qid;
        pthread_t th;
        _Atomic bool done;
        struct nudge *next;       /* kfs_ring.nudge_list; nudge_lock */
};

/* The nudge's request: a statfs of the mount from CPU qid (the kernel queues a request by its CPU), as
 * root, where the mount point may lie in a user's directory. So it goes to the mount point's name in its
 * directory as the daemon held it since mount (dirfd: kfs.h, mount_dir), following no symlink, and only
 * where that reaches the mount's own device (read without asking anything): a user who renamed a
 * directory above the mount point changes nothing, and one who put a symlink or another mount where it
 * was (their own FUSE mount, which need never answer) gets no statfs. 0, or -1 with errno set. */
static int statfs_from(unsigned long qid, int dirfd, const char *name, dev_t dev)
{
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        CPU_SET(qid, &cpus);
        if (sched_setaffinity(0, sizeof(cpus), &cpus) < 0)
                return -1;
        int fd = ktree_open_mount(dirfd, name);
        if (fd < 0) {
                errno = -fd;
                return -1;
        }
        struct statx sx;
        struct statfs sf;
        int r = -1;
        if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) < 0)
                ;
        else if (makedev(sx.stx_dev_major, sx.stx_dev_minor) != dev)
                errno = EXDEV;
        else
                r = fstatfs(fd, &sf);
        close(fd);
        return r;
}

int kfs_ring_nudge_child(const char *qid, const char *name, const char *dev)
{
        char *end;
        unsigned long q = strtoul(qid, &end, 10);
        unsigned ma, mi;
        char c;
        if (*end || q >= CPU_SETSIZE || sscanf(dev, "%u:%u%c", &ma, &mi, &c) != 2)
                return 2;
        return statfs_from(q, 3, name, makedev(ma, mi)) < 0; /* 3: the mount point's directory */
}

/* The request is made by a helper process, not by this thread (spawn.c, WHY PROCESSES); this thread
 * waits for it in waitpid, which a SIGKILL of the daemon ends. Where no helper can be started, by this
 * thread after all: a queue must not stall. */
static void *nudge_main(void *arg)
{
        struct nudge *n = arg;
        char q[16];
        snprintf(q, sizeof(q), "%u", n->qid);
        char dev[40];
        snprintf(dev, sizeof(dev), "%u:%u", major(n->fs->mount_dev), minor(n->fs->mount_dev));
        char *argv[] = { "kcachefs", "--nudge", q, (char *)n->fs->mount_name, dev, NULL };
        pid_t pid;
        if (kfs_spawn_self(argv, &n->fs->mount_dir, 1, &pid) == 0) {
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        } else { /* no helper (a tasks limit, no /proc): the request from here, as a stalled queue needs it */
                (void)statfs_from(n->qid, n->fs->mount_dir, n->fs->mount_name, n->fs->mount_dev);
        }
        atomic_fetch_add(&n->r->nudged, 1);
        atomic_fetch_sub(&n->r->nudges, 1);
        atomic_store(&n->done, true);
        return NULL;
}

/* nudge_lock held. Joins the nudges that are done (each a moment from its end), or, with all, every one
 * before until; returns those left running. */
static unsigned nudges_join_locked(struct kfs_ring *r, bool all, const struct timespec *until)
{
        unsigned left = 0;
        for (struct nudge **p = &r->nudge_list, *n; (n = *p);) {
                if ((atomic_load(&n->done) && pthread_join(n->th, NULL) == 0) ||
                    (all && pthread_timedjoin_np(n->th, NULL, until) == 0)) {
                        *p = n->next;
                        free(n);
                } else {
                        left++;
                        p = &n->next;
                }
        }
        return left;
}

/* After t submitted the registration of new entries: a request on t's queue, from a thread of its own. */
static void nudge(struct ring_thread *t)
{
        struct kfs_ring *r = t->fs->ring;
        t->nudge = false;
        pthread_mutex_lock(&r->nudge_lock);
        (void)nudges_join_locked(r, false, NULL);
        struct nudge *n = NULL;
        pthread_attr_t a;
        if (atomic_fetch_add(&r->nudges, 1) >= NUDGES_MAX || atomic_load(&r->stop) ||
            !(n = calloc(1, sizeof(*n))) || pthread_attr_init(&a) != 0)
                goto undo;
        n->fs = t->fs;
        n->r = r;
        n->qid = t->qid;
        pthread_attr_setstacksize(&a, 64 * 1024);
        /* Made by a ring thread, which blocks every signal: so does the nudge. */
        int e = pthread_create(&n->th, &a, nudge_main, n);
        pthread_attr_destroy(&a);
        if (e == 0) {
                n->next = r->nudge_list;
                r->nudge_list = n;
                pthread_mutex_unlock(&r->nudge_lock);
                return;
        }
undo:
        free(n);
        atomic_fetch_sub(&r->nudges, 1);
        pthread_mutex_unlock(&r->nudge_lock);
}

static void take_handoff(struct ring_thread *t)
{
        pthread_mutex_lock(&t->lock);
        struct ring_ent *e = t->handoff;
        t->handoff = NULL;
        pthread_mutex_unlock(&t->lock);
        for (; e; e = e->next) {
                commit(t, e);
                t->held--; /* waits in the kernel again (handle) */
        }
}

/* A thread could not start, set up its ring or register its entry (said once): its queue may go
 * unserved, and then the kernel is told to give the rings up (give_up), or gave them up itself. */
static void failed(struct kfs_ring *r, const char *what, int err)
{
        int none = 0;
        if (atomic_compare_exchange_strong(&r->err, &none, err))
                kfs_log(LOG_WARNING, "io_uring %s: %s", what, strerror(err));
}

static void reported(struct kfs_ring *r)
{
        pthread_mutex_lock(&r->lock);
        r->reported++;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
}

static void *ring_main(void *arg)
{
        struct ring_thread *t = arg;
        struct kfs_ring *r = t->fs->ring;
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL); /* libfuse's and our signals go to other threads */
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        CPU_SET(t->qid, &cpus);
        (void)sched_setaffinity(0, sizeof(cpus), &cpus); /* fails for an offline CPU: then anywhere */
        int err = ring_setup(t);
        struct ring_ent *first = err < 0 ? NULL : ent_new(t);
        if (!first) {
                failed(r, "setup", err < 0 ? -err : ENOMEM);
                reported(r);
                return NULL;
        }
        sqe_event(t);
        sqe_cmd(t, first, FK_URING_CMD_REGISTER, 0);
        if ((err = ring_enter(t, false)) < 0)
                failed(r, "submission", -err);
        t->ok = err == 0;
        reported(r);
        while (!atomic_load(&r->stop) && err == 0) {
                if ((err = ring_enter(t, true)) < 0) {
                        kfs_log(LOG_ERR, "io_uring_enter: %s", strerror(-err));
                        break;
                }
                unsigned head = *t->cq_head, tail = __atomic_load_n(t->cq_tail, __ATOMIC_ACQUIRE);
                bool dead = false;
                for (; head != tail; head++) {
                        struct io_uring_cqe *c = &t->cqes[head & *t->cq_mask];
                        if (c->user_data == RING_TAG_EVENT) {
                                take_handoff(t);
                                sqe_event(t);
                                continue;
                        }
                        struct ring_ent *e = (struct ring_ent *)(uintptr_t)c->user_data;
                        if (c->res == -ENOTCONN || c->res == -ECONNABORTED) {
                                dead = true; /* unmounted, or the connection was aborted */
                        } else if (c->res < 0 && e == first && !e->fetched) {
                                /* The kernel turned io_uring off for this connection itself. */
                                failed(r, "registration", -c->res); /* no retry: it would fail the same */
                                atomic_store(&r->down, true);
                        } else if (c->res < 0 && !e->fetched) {
                                /* An extra entry the kernel refused (handle registered it): out of use, and
                                 * not counted as waiting in the kernel, so that the next reply held back
                                 * registers another where the thread has none waiting. Not at once: a
                                 * kernel that refuses every one would take a mapping each time, for good. */
                                kfs_log(LOG_WARNING, "io_uring: an extra entry of queue %u: %s", t->qid,
                                        strerror(-c->res));
                                t->nents--;
                                atomic_fetch_sub(&r->nents, 1);
                        } else if (c->res < 0) {
                                /* The kernel refused a commit: the entry is out of use, and a new one
                                 * takes its place so that the queue keeps being served. */
                                kfs_log(LOG_ERR, "io_uring entry of queue %u: %s", t->qid,
                                        strerror(-c->res));
                                atomic_store(&e->unique, 0);
                                t->nents--;
                                atomic_fetch_sub(&r->nents, 1);
                                struct ring_ent *n = ent_new(t);
                                if (n)
                                        sqe_cmd(t, n, FK_URING_CMD_REGISTER, 0);
                        } else {
                                e->fetched = true;
                                handle(t, e);
                        }
                }
                __atomic_store_n(t->cq_head, head, __ATOMIC_RELEASE);
                if (dead)
                        break;
                if (t->nudge && (err = ring_enter(t, false)) == 0) /* the new entries first, then the nudge */
                        nudge(t);
        }
        return NULL;
}

#define RING_SWITCH "/sys/module/fuse/parameters/enable_uring"

void kfs_ring_prepare(struct kfs *fs)
{
        if (fs->o.nouring || fs->singlethread || geteuid() != 0)
                return;
        FILE *f = fopen(RING_SWITCH, "r");
        int c = f ? fgetc(f) : EOF;
        if (f)
                fclose(f);
        struct utsname u;
        unsigned major = 0, minor = 0;
        if (c != 'N' || uname(&u) != 0 || sscanf(u.release, "%u.%u", &major, &minor) != 2 ||
            major * 1000 + minor < 6018)
                return; /* on already, absent (before 6.14), or a kernel it was not tried on */
        f = fopen(RING_SWITCH, "w");
        bool ok = f && fputs("Y\n", f) >= 0;
        if (f && fclose(f) != 0)
                ok = false;
        if (ok)
                kfs_log(LOG_NOTICE, "turned on FUSE over io_uring in the kernel (%s); -o nouring leaves it "
                                    "off", RING_SWITCH);
}

bool kfs_ring_wanted(struct kfs *fs)
{
        return fs->ring != NULL;
}

void kfs_ring_init(struct kfs *fs)
{
        if (!fs->devio.offers_ring || fs->o.nouring || fs->singlethread)
                return;
        long n = sysconf(_SC_NPROCESSORS_CONF);
        /* The kernel's queues: one per possible CPU (num_possible_cpus(), CPUs numbered from 0). */
        FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
        unsigned lo, hi;
        if (f) {
                if (fscanf(f, "%u-%u", &lo, &hi) == 2 && lo == 0)
                        n = (long)hi + 1;
                else if (lo == 0)
                        n = 1;
                fclose(f);
        }
        struct kfs_ring *r = n >= 1 && n <= 4096 ? calloc(1, sizeof(*r)) : NULL;
        if (!r) {
                atomic_store(&fs->ring_err, ENOMEM);
                return;
        }
        /* Once INIT's reply asks for io_uring, the kernel holds every request until each queue has an
         * entry, or until a registration fails. So io_uring must be known to work before we ask: a
         * sysctl (kernel.io_uring_disabled) or a seccomp filter may refuse it. The probe ring stays, for
         * telling the kernel to give up if a queue ends up without a thread (kfs_ring_start). */
        r->probe.fd = -1;
        int err = ring_setup(&r->probe);
        if (err < 0) {
                ring_unmap(&r->probe);
                free(r);
                atomic_store(&fs->ring_err, -err);
                kfs_log(LOG_NOTICE, "io_uring unavailable (%s); requests go through /dev/fuse", strerror(-err));
                return;
        }
        r->nq = (unsigned)n;
        r->nt = r->nq * RING_THREADS;
        pthread_mutex_init(&r->lock, NULL);
        pthread_mutex_init(&r->nudge_lock, NULL);
        pthread_cond_init(&r->cond, NULL);
        fs->ring = r;
}

/* Makes the kernel stop waiting for the rings: any failed registration does (the connection then goes
 * on through /dev/fuse), and one naming a queue that does not exist fails before anything is kept. */
static void give_up(struct kfs_ring *r)
{
        kfs_log(LOG_WARNING, "a CPU's io_uring queue has no thread; requests go through /dev/fuse");
        atomic_store(&r->down, true);
        struct ring_ent none = { .t = &r->probe }; /* never read: the queue check fails first */
        r->probe.qid = UINT16_MAX;
        sqe_cmd(&r->probe, &none, FK_URING_CMD_REGISTER, 0);
        (void)ring_enter(&r->probe, false);
}

void kfs_ring_start(struct kfs *fs, uint32_t max_write)
{
        struct kfs_ring *r = fs->ring;
        r->probe.fs = fs;
        r->payload = max_write > 1024 * 1024 ? max_write : 1024 * 1024;
        r->t = calloc(r->nt, sizeof(*r->t));
        if (!r->t)
                goto fail;
        for (unsigned i = 0; i < r->nt; i++) {
                struct ring_thread *t = &r->t[i];
                t->fs = fs;
                t->qid = i / RING_THREADS;
                t->fd = -1;
                pthread_mutex_init(&t->lock, NULL);
                t->efd = eventfd(0, EFD_CLOEXEC);
                if (t->efd < 0)
                        goto fail;
        }
        /* On before the first thread runs: from then on a reply may be for a ring request. */
        atomic_store(&fs->ring_on, true);
        unsigned started = 0;
        for (unsigned i = 0; i < r->nt; i++) {
                int e = pthread_create(&r->t[i].th, NULL, ring_main, &r->t[i]);
                if (e != 0) { /* a tasks limit (systemd's TasksMax): the queues without a thread give up */
                        failed(r, "threads", e);
                        break;
                }
                r->t[i].started = true;
                started++;
        }
        /* Until every thread has submitted its registration (a few ms), so that what the mount reports
         * (transport) is what it does from its first request on. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 5;
        pthread_mutex_lock(&r->lock);
        while (r->reported < started && pthread_cond_timedwait(&r->cond, &r->lock, &until) == 0)
                ;
        pthread_mutex_unlock(&r->lock);
        for (unsigned q = 0; q < r->nq; q++) {
                bool served = false;
                for (unsigned k = 0; k < RING_THREADS; k++)
                        served = served || r->t[q * RING_THREADS + k].ok;
                if (!served) {
                        give_up(r);
                        break;
                }
        }
        return;
fail:
        failed(r, "start", ENOMEM);
        give_up(r);
}

uint32_t kfs_ring_opcode_of(struct kfs *fs, uint64_t unique)
{
        struct kfs_ring *r = fs->ring;
        if (!r || !unique)
                return 0;
        for (struct ring_ent *e = atomic_load(&r->ents); e; e = e->all) {
                /* The kernel wrote the request's header there before it completed the command (and before
                 * any INTERRUPT for it can be read); the owner overwrites it with the reply's, whose error
                 * (never above 0) sits where the opcode was, and the kernel with the next request's. Read
                 * field by field while that may happen: the unique again after the opcode, so that an
                 * opcode is another request's only where the one asked about is over already. */
                const struct fk_in_header *h = (const void *)e->hdr.in_out;
                if (__atomic_load_n(&h->unique, __ATOMIC_RELAXED) != unique)
                        continue;
                uint32_t op = __atomic_load_n(&h->opcode, __ATOMIC_RELAXED);
                if (__atomic_load_n(&h->unique, __ATOMIC_RELAXED) == unique)
                        return op;
        }
        return 0;
}

ssize_t kfs_ring_writev(struct kfs *fs, int fd, const struct iovec *iov, int count)
{
        const struct fk_out_header *o = iov[0].iov_base;
        struct ring_ent *e = cur_ent;
        if (!o->unique || !atomic_load(&fs->ring_on))
                return writev(fd, iov, count);
        if (!e || atomic_load(&e->unique) != o->unique) {
                for (e = atomic_load(&fs->ring->ents); e; e = e->all)
                        if (atomic_load(&e->unique) == o->unique)
                                break;
                if (!e)
                        return writev(fd, iov, count); /* a request that came through /dev/fuse */
        }
        size_t total = 0;
        for (int i = 1; i < count; i++)
                total += iov[i].iov_len;
        if (total > fs->ring->payload) {
                errno = EINVAL;
                return -1;
        }
        char *p = e->area + RING_ROOM;
        for (int i = 1; i < count; i++) {
                memcpy(p, iov[i].iov_base, iov[i].iov_len);
                p += iov[i].iov_len;
        }
        memcpy(e->hdr.in_out, o, sizeof(*o));
        e->hdr.ent.payload_sz = (uint32_t)total;
        atomic_store(&e->unique, 0);
        if (e == cur_ent) {
                e->replied = true;
        } else {
                struct ring_thread *t = e->t;
                pthread_mutex_lock(&t->lock);
                e->next = t->handoff;
                t->handoff = e;
                pthread_mutex_unlock(&t->lock);
                uint64_t one = 1;
                (void)!write(t->efd, &one, sizeof(one));
        }
        return (ssize_t)(total + sizeof(*o));
}

void kfs_ring_stop(struct kfs *fs)
{
        struct kfs_ring *r = fs->ring;
        if (!r)
                return;
        atomic_store(&fs->ring_on, false);
        ring_unmap(&r->probe);
        atomic_store(&r->stop, true);
        for (unsigned i = 0; r->t && i < r->nt; i++) {
                struct ring_thread *t = &r->t[i];
                if (t->started) {
                        uint64_t one = 1;
                        (void)!write(t->efd, &one, sizeof(one));
                        pthread_join(t->th, NULL);
                }
        }
        for (unsigned i = 0; r->t && i < r->nt; i++) {
                struct ring_thread *t = &r->t[i];
                ring_unmap(t);
                if (t->efd > 0)
                        close(t->efd);
                pthread_mutex_destroy(&t->lock);
        }
}

static struct kfs_ring *ring_kept; /* a ring whose nudges did not end: reachable, so not a leak */

void kfs_ring_free(struct kfs *fs)
{
        struct kfs_ring *r = fs->ring;
        if (!r)
                return;
        /* The connection is gone (the session's /dev/fuse is closed): a nudge's helper still waiting for
         * its statfs has its answer now, an error, and its thread ends. One that does not within 5 s keeps
         * the ring, allocated and reachable, rather than have it freed under it. */
        pthread_mutex_lock(&r->nudge_lock);
        unsigned left = nudges_join_locked(r, true, &(struct timespec){ time(NULL) + 5, 0 });
        pthread_mutex_unlock(&r->nudge_lock);
        fs->ring = NULL;
        if (left) {
                kfs_log(LOG_WARNING, "%u nudge(s) of the io_uring queues did not end; their memory is kept", left);
                ring_kept = r;
                return;
        }
        for (struct ring_ent *e = atomic_load(&r->ents), *next; e; e = next) {
                next = e->all;
                munmap(e->area, RING_ROOM + r->payload);
                free(e);
        }
        pthread_mutex_destroy(&r->lock);
        pthread_mutex_destroy(&r->nudge_lock);
        pthread_cond_destroy(&r->cond);
        free(r->t);
        free(r);
}

const char *kfs_ring_state(struct kfs *fs, char *buf, size_t size)
{
        if (atomic_load(&fs->ring_on)) {
                if (atomic_load(&fs->ring->down))
                        snprintf(buf, size, "/dev/fuse (io_uring did not start on every queue: %s)",
                                 strerror(atomic_load(&fs->ring->err) ? atomic_load(&fs->ring->err) : EIO));
                else
                        snprintf(buf, size, "io_uring (%u queues, %u entries)", fs->ring->nq,
                                 atomic_load(&fs->ring->nents));
                return buf;
        }
        if (atomic_load(&fs->ring_err)) {
                snprintf(buf, size, "/dev/fuse (io_uring unavailable: %s)", strerror(atomic_load(&fs->ring_err)));
                return buf;
        }
        if (fs->o.nouring)
                return "/dev/fuse (-o nouring)";
        if (fs->singlethread)
                return "/dev/fuse (single-threaded)";
        if (!fs->devio.hooked)
                return "/dev/fuse";
        return fs->devio.offers_ring ? "/dev/fuse (io_uring failed to start)"
                                   : "/dev/fuse (the kernel does not offer io_uring: Linux 6.14+ with "
                                     "/sys/module/fuse/parameters/enable_uring on)";
}
