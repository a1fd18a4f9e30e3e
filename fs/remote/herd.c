/* herd.c: one compile per cluster (remote.h, HERD). A lookup that missed on the server either marks the
 * name in flight (this node compiles it) or, where another lookup marked it first, waits for that
 * compile: the request is parked here, holding no worker, and the herd thread answers it.
 *
 * What must stay true:
 *   H1 A parked lookup is answered exactly once: with the name (once it is on this node, or fetched
 *      from the server), or as a miss (the mark gone with nothing stored, herd_wait passed, the mount
 *      stopping, its process interrupted); a walk parked on this node (H7) with the directory it
 *      revalidates. Never left unanswered: its process would hang. Only the herd thread answers (or
 *      park() when the mount stops under it); libfuse's interrupt callback only notes the request,
 *      since the kernel waits for our answer even for a process sent SIGKILL.
 *   H2 Its directory is held (a lookup reference) while it waits, and let go after the answer.
 *   H3 A wait never outlives herd_wait: a compile that died leaves a mark that expires by itself.
 *   H4 A lookup of the output itself waits only for another node's compile. A lookup waiting in the
 *      kernel holds its directory's lock (shared) until it is answered, and the compile stores into that
 *      very directory (a create, a rename into place: the lock exclusive): a lookup of the output parked
 *      on the node that compiles would hold off the compile it waits for, until herd_wait. So the marks
 *      this node set are remembered (mine), with the process that compiles, and its lookups (and those of
 *      the processes it started: a linker) are a miss at once.
 *   H5 A mark won is checked against the unit once more: a compile elsewhere may have been published (its
 *      unit stored, then its mark deleted) between our GET and our SET, and is then fetched, not done
 *      again. The publisher stores the unit before it deletes the marks, so a mark won after the
 *      deletion finds the unit.
 *   H6 Only a mark that ends within herd_wait is waited for: one without a life (not a node's: written
 *      by hand, or by a client the server's ACLs should have kept out) would hold every lookup of the
 *      name for herd_wait, again and again.
 *   H7 Another process of this node that looks the output up while it is compiled here waits where it
 *      holds no directory lock (ONE NODE, below): it is told ESTALE once, the kernel walks its path again
 *      asking for every directory on the way (LOOKUP_REVAL), and that walk's lookup of the output's own
 *      directory is parked, until the output is here, the compiling process is gone, or the mark's life
 *      is over. Its next lookup of an output, found or not, is answered as it is, whatever marks ended
 *      or began meanwhile: never a second ESTALE, which would reach the application. An invite is that
 *      thread's (its id and start time); its next lookup of an output takes it (found, the output's
 *      own name), or it is forgotten 30 s after the mark's end.
 *
 * ONE NODE. The kernel looks a name up holding its directory's i_rwsem shared (lookup_slow), and every
 * create and rename there needs it exclusive before the request reaches us; but a walk through a
 * directory the kernel already knows revalidates it (d_revalidate, a LOOKUP request) holding no lock at
 * all, and an ESTALE from a lookup makes the kernel walk the whole path again in that way
 * (filename_lookup, do_filp_open and the syscalls' retry_estale: open, stat, access, rename alike). So the
 * thread told ESTALE (an invite, keyed by its thread id) is parked at the revalidation of the directory
 * the output lies in (PoCL's program directory, Triton's key directory, JAX's cache directory), the
 * compile's stores into that directory go through, and only that thread's one walk is parked (not a
 * mkdir's revalidation by another, which holds the parent's lock). An output in the mount's root has no
 * directory to wait at. Nobody is told who may hold a lock the compile waits for: a thread of a process
 * holding a flock through the mount (JAX's .lockfile around its lookup), or one of a runtime that locks
 * its compiles itself (libkcache and the OpenCL layer, client/lock.c: runtimes.h, locks_compile), whose
 * other processes wait on that lock instead. Runtimes that find an entry by opening a name relative to a
 * directory they hold open walk nothing again: their second lookup is a miss, and they compile as before.
 * The directories kept with marks, and the invites, are bounded (HERD_MAX): past that, nobody here waits.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define HERD_POLL_MS 20
/* A poll's deadline: off every application's path, so longer than a lookup's probe; a node whose cores
 * are all compiling answers late. Polls that fail for HERD_FAILING_MS give the wait up. */
#define HERD_POLL_TIMEOUT_MS 250
#define HERD_FAILING_MS 1000

/* The directory an output lies in (ONE NODE): its parent's backing inode and its name; NULL name: none. */
struct herd_dir {
        uint64_t parent;
        char *name;
        char *path;               /* the output's path, relative to the root: the wait ends once it is here */
};

struct herd_mine {
        pid_t tgid;               /* the process compiling it */
        uint64_t start;           /* its start (kfs_proc_start): a pid used again is not it; 0: gone */
        int64_t until_ns;         /* the mark's end */
        struct herd_dir dir;      /* none past HERD_MAX entries: then nobody here waits for it */
};

/* A thread of this node told to look the output again (H7), keyed by its thread id. */
struct herd_invite {
        pid_t compiler;
        uint64_t compiler_start;
        uint64_t asker_start;     /* the thread's start: a thread id used again is not it */
        int64_t deadline_ns;      /* the mark's end: a wait ends then */
        int64_t until_ns;         /* forgotten then, if its walk never came back */
        bool parked;              /* its walk was parked once: never again */
        struct herd_dir dir;
};

/* Marks and invites kept at most (each a few hundred bytes): past that, no new wait on this node. */
#define HERD_MAX 65536
/* An invite not taken up is forgotten this long after its mark's end. */
#define HERD_INVITE_SLACK_NS (30 * 1000000000LL)

struct herd_wait {
        fuse_req_t req;
        struct kfs_inode *dir;    /* held: H2 */
        char *name, *path, *key, *mark;
        struct kfs_asker asker;
        int64_t deadline_ns;
        int64_t failing_ns;       /* since when the server has not answered its polls; 0: it answers */
        /* ONE NODE: a walk parked at the output's directory (name) for this node's compile of path */
        bool local;
        pid_t compiler;
        uint64_t compiler_start;
        struct herd_wait *next;
};

static void dir_free(struct herd_dir *u)
{
        free(u->name);
        free(u->path);
        u->name = u->path = NULL;
}

static int dir_copy(struct herd_dir *to, const struct herd_dir *from)
{
        *to = (struct herd_dir){ .parent = from->parent, .name = from->name ? strdup(from->name) : NULL,
                                  .path = from->path ? strdup(from->path) : NULL };
        if ((from->name && !to->name) || (from->path && !to->path)) {
                dir_free(to);
                return -ENOMEM;
        }
        return 0;
}

static void mine_free(struct herd_mine *m)
{
        if (m) {
                dir_free(&m->dir);
                free(m);
        }
}

static void invite_free(struct herd_invite *v)
{
        if (v) {
                dir_free(&v->dir);
                free(v);
        }
}

/* The directory the output at path lies in, for ONE NODE: its parent's inode and its name; none for an
 * output in the root, whose directory has no parent to wait at. */
static void output_dir(struct kfs *fs, const char *path, struct herd_dir *ret)
{
        *ret = (struct herd_dir){ 0 };
        const char *slash = strrchr(path, '/');
        char *dir = slash ? strndup(path, (size_t)(slash - path)) : NULL;
        char *up = dir ? strrchr(dir, '/') : NULL;
        const char *name = up ? up + 1 : dir;
        if (up)
                *up = '\0';
        struct stat st;
        if (dir && *name && ktree_stat(&fs->tree, KTREE_ROOT, up ? dir : ".", &st) == 0 && S_ISDIR(st.st_mode)) {
                ret->parent = st.st_ino;
                ret->name = strdup(name);
                ret->path = strdup(path);
                if (!ret->name || !ret->path)
                        dir_free(ret);
        }
        free(dir);
}

char *kfs_remote_herd_key(const char *key)
{
        char *k;
        return asprintf(&k, "kcfsh%s", key + 4) < 0 ? NULL : k; /* "kcfs:..." -> "kcfsh:..." */
}

/* libfuse's interrupt callback for a parked request (its process got a signal: a SIGKILL'ed one waits in
 * the kernel for our answer, unkillable until then). It only notes req: the herd thread answers (H1). */
static void interrupted(fuse_req_t req, void *data)
{
        struct kfs_remote *r = ((struct kfs *)data)->remote;
        pthread_mutex_lock(&r->herd.lock);
        if (r->herd.interrupted.count > 4096) { /* only stale ones pile up (noted as it was answered) */
                kmap_free(&r->herd.interrupted);
                kmap_init(&r->herd.interrupted);
        }
        kmap_put(&r->herd.interrupted, (uint64_t)(uintptr_t)req, (void *)1);
        pthread_cond_signal(&r->herd.cond);
        pthread_mutex_unlock(&r->herd.lock);
}

/* Whether w's process was interrupted (noted by interrupted()); the note is taken. */
static bool was_interrupted(struct kfs_remote *r, struct herd_wait *w)
{
        pthread_mutex_lock(&r->herd.lock);
        bool i = r->herd.interrupted.count && kmap_del(&r->herd.interrupted, (uint64_t)(uintptr_t)w->req);
        pthread_mutex_unlock(&r->herd.lock);
        return i;
}

/* Frees w and what it owns (path and key are the caller's again where it never was parked). */
static void wait_free(struct herd_wait *w)
{
        free(w->name);
        free(w->path);
        free(w->key);
        free(w->mark);
        free(w);
}

/* Answers w's lookup (H1) and lets it go (H2). */
static void answer(struct kfs *fs, struct herd_wait *w, bool served)
{
        struct kfs_remote *r = fs->remote;
        atomic_fetch_add(served ? &r->herd_served : &r->herd_gave_up, 1);
        (void)was_interrupted(r, w); /* a note of it goes with it */
        kfs_lookup_answer(w->req, w->dir, w->name, 0); /* a miss uncached: this process compiles now */
        kfs_inode_unref(fs, w->dir, 1);
        wait_free(w);
}

/* Whether w can be answered now: the name here, or fetched, or no longer worth waiting for. */
static int settle(struct kfs *fs, struct herd_wait *w, int64_t now)
{
        struct kfs_remote *r = fs->remote;
        struct stat st;
        if (was_interrupted(r, w))
                return -1; /* its process got a signal (a SIGKILL): answered at once */
        if (w->local) { /* ONE NODE: the output here; the compiling process gone; the mark's life over */
                if (ktree_stat(&fs->tree, KTREE_ROOT, w->path, &st) == 0)
                        return 1;
                return !w->compiler_start || kfs_proc_start(w->compiler) != w->compiler_start ||
                                       now >= w->deadline_ns
                               ? -1
                               : 0;
        }
        int dfd = kfs_inode_fd(fs, w->dir);
        bool here = dfd >= 0 && ktree_stat(&fs->tree, dfd, w->name, &st) == 0; /* compiled on this node */
        if (dfd >= 0)
                kfs_inode_fd_put(fs, w->dir, dfd);
        if (here)
                return 1;
        /* The mark first, then the unit: the publisher stores the unit before it deletes the mark, so a mark
         * seen gone means a unit stored then is seen by the GET after (as H5). */
        unsigned ms = r->timeout_ms > HERD_POLL_TIMEOUT_MS ? r->timeout_ms : HERD_POLL_TIMEOUT_MS;
        redisReply *mrep = kfs_remote_get(r, w->mark, ms);
        redisReply *rep = mrep ? kfs_remote_get(r, w->key, ms) : NULL;
        bool marked = mrep && mrep->type == REDIS_REPLY_STRING;
        if (mrep)
                freeReplyObject(mrep);
        if (rep && rep->type == REDIS_REPLY_STRING) {
                struct kfs_remote_ns ns; /* the herd is the asker's own namespace's only */
                kfs_remote_own_ns(r, w->asker.uid, w->path, &ns);
                int t = kfs_remote_take(fs, &w->asker, &ns, w->path, w->key, rep);
                freeReplyObject(rep);
                return t == 0 ? 1 : -1;
        }
        if (!rep) { /* no answer: a stalled server, or a busy node; gone for long, nothing will come */
                if (!w->failing_ns)
                        w->failing_ns = now;
                return now - w->failing_ns > (int64_t)HERD_FAILING_MS * 1000000 || now >= w->deadline_ns ? -1 : 0;
        }
        freeReplyObject(rep);
        w->failing_ns = 0;
        if (!marked || now >= w->deadline_ns)
                return -1; /* the compile ended with nothing stored, or took too long (H3) */
        return 0;
}

static void *herd_main(void *arg)
{
        struct kfs *fs = arg;
        struct kfs_remote *r = fs->remote;
        pthread_mutex_lock(&r->herd.lock);
        while (!r->herd.stop) {
                if (!r->herd.list) {
                        pthread_cond_wait(&r->herd.cond, &r->herd.lock);
                        continue;
                }
                struct herd_wait *all = r->herd.list;
                r->herd.list = NULL;
                pthread_mutex_unlock(&r->herd.lock);
                int64_t now = kfs_mono_ns();
                struct herd_wait *keep = NULL;
                for (int pass = 0; pass < 2; pass++) { /* this node's first: they ask no server, which may be slow */
                        struct herd_wait *rest = NULL;
                        while (all) {
                                struct herd_wait *w = all;
                                all = w->next;
                                if (w->local != (pass == 0)) { /* the other pass's */
                                        w->next = rest;
                                        rest = w;
                                        continue;
                                }
                                int s = settle(fs, w, now);
                                if (s != 0) {
                                        answer(fs, w, s > 0);
                                } else {
                                        w->next = keep;
                                        keep = w;
                                }
                        }
                        all = rest;
                }
                pthread_mutex_lock(&r->herd.lock);
                while (keep) { /* back, with those parked meanwhile */
                        struct herd_wait *w = keep;
                        keep = w->next;
                        w->next = r->herd.list;
                        r->herd.list = w;
                }
                if (r->herd.list && !r->herd.stop) {
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_nsec += HERD_POLL_MS * 1000000L;
                        if (ts.tv_nsec >= 1000000000L) {
                                ts.tv_sec++;
                                ts.tv_nsec -= 1000000000L;
                        }
                        pthread_cond_timedwait(&r->herd.cond, &r->herd.lock, &ts);
                }
        }
        struct herd_wait *all = r->herd.list;
        r->herd.list = NULL;
        pthread_mutex_unlock(&r->herd.lock);
        while (all) { /* H1: stopping, each answered as a miss */
                struct herd_wait *w = all;
                all = w->next;
                answer(fs, w, false);
        }
        return NULL;
}

/* Drops the entries of map (of type, each with an until_ns) whose time is past, once it has grown to
 * *next; then *next is twice what is left, so that the work is a constant per entry added. */
#define PRUNE(map, next, type, free_fn)                                                                    \
        do {                                                                                               \
                if ((map)->count >= *(next)) {                                                             \
                        int64_t now_ = kfs_mono_ns();                                               \
                        kmap keep_;                                                                        \
                        kmap_init(&keep_);                                                                 \
                        size_t pos_ = 0;                                                                   \
                        uint64_t k_;                                                                       \
                        void *v_;                                                                          \
                        while (kmap_next((map), &pos_, &k_, &v_)) {                                        \
                                type *o_ = v_;                                                             \
                                if (o_->until_ns > now_ && kmap_put(&keep_, k_, o_) == 0)                  \
                                        continue;                                                          \
                                free_fn(o_);                                                               \
                        }                                                                                  \
                        kmap_free((map));                                                                  \
                        *(map) = keep_;                                                                    \
                        *(next) = (map)->count * 2 > 1024 ? (map)->count * 2 : 1024;                       \
                }                                                                                          \
        } while (0)

/* This node's process tgid holds the mark hashed h until until_ns (H4), for the output at path. */
static void remember_mine(struct kfs *fs, uint64_t h, pid_t tgid, int64_t until_ns, const char *path)
{
        struct kfs_remote *r = fs->remote;
        struct herd_mine *m = calloc(1, sizeof(*m));
        if (!m)
                return;
        m->tgid = tgid;
        m->start = kfs_proc_start(tgid);
        m->until_ns = until_ns;
        pthread_mutex_lock(&r->herd.lock);
        bool room = r->herd.mine.count < HERD_MAX;
        pthread_mutex_unlock(&r->herd.lock);
        if (room)
                output_dir(fs, path, &m->dir); /* without the lock: it reads the tree */
        pthread_mutex_lock(&r->herd.lock);
        PRUNE(&r->herd.mine, &r->herd.mine_next, struct herd_mine, mine_free);
        mine_free(kmap_del(&r->herd.mine, h));
        if (kmap_put(&r->herd.mine, h, m) < 0)
                mine_free(m);
        pthread_mutex_unlock(&r->herd.lock);
}

/* Whether process p is tgid, or was started by it (a linker the compile runs), a few generations down. */
static bool kin_of(pid_t p, pid_t tgid)
{
        for (int i = 0; i < 8 && p > 1; i++, p = kfs_ppid_of(p))
                if (p == tgid)
                        return true;
        return false;
}

/* H7: thread tid, of another process than the one compiling m, looked m's output up: told to look again
 * (KFS_REMOTE_RETRY) if it holds no invite; a miss if it does (its walk came back: the invite is taken). */
static int invite(struct kfs_remote *r, pid_t tid, const struct herd_mine *m)
{
        uint64_t asker_start = tid > 0 ? kfs_proc_start(tid) : 0;
        if (!asker_start || !m->start)
                return KFS_REMOTE_UNSURE; /* a thread or compiler we cannot tell apart from another: no wait */
        struct herd_invite *v = calloc(1, sizeof(*v));
        if (!v || dir_copy(&v->dir, &m->dir) < 0) {
                free(v);
                return KFS_REMOTE_UNSURE;
        }
        v->compiler = m->tgid;
        v->compiler_start = m->start;
        v->asker_start = asker_start;
        v->deadline_ns = m->until_ns;
        v->until_ns = m->until_ns + HERD_INVITE_SLACK_NS;
        int ret = KFS_REMOTE_RETRY;
        pthread_mutex_lock(&r->herd.lock);
        struct herd_invite *old = kmap_del(&r->herd.invites, (uint64_t)tid);
        if (old && old->asker_start == asker_start && old->until_ns > kfs_mono_ns()) {
                /* Told already (for this mark or another, whatever their lives: the mark may have ended and
                 * another been made while it waited): never a second ESTALE in a row. */
                ret = KFS_REMOTE_UNSURE;
                invite_free(old);
                invite_free(v);
        } else {
                invite_free(old); /* another thread's given the same id, or long forgotten */
                PRUNE(&r->herd.invites, &r->herd.invites_next, struct herd_invite, invite_free);
                if (r->herd.invites.count >= HERD_MAX || kmap_put(&r->herd.invites, (uint64_t)tid, v) < 0) {
                        invite_free(v);
                        ret = KFS_REMOTE_UNSURE;
                }
        }
        atomic_store(&r->herd.ninvites, r->herd.invites.count);
        pthread_mutex_unlock(&r->herd.lock);
        return ret;
}

/* Hands w to the herd thread (starting it on first use): KFS_REMOTE_PARKED, or -ENOENT if there is none
 * (w freed, dir not held). dir is held for w (H2). */
static int park(struct kfs *fs, struct herd_wait *w)
{
        struct kfs_remote *r = fs->remote;
        pthread_mutex_lock(&fs->itable_lock);
        w->dir->nlookup++; /* H2 */
        pthread_mutex_unlock(&fs->itable_lock);
        pthread_mutex_lock(&r->herd.lock);
        if (!r->herd.started && !r->herd.stop)
                r->herd.started = kfs_thread_start(&r->herd.thread, 0, herd_main, fs) == 0;
        bool ok = r->herd.started && !r->herd.stop;
        pthread_mutex_unlock(&r->herd.lock);
        if (ok) {
                atomic_fetch_add(&r->herd_waits, 1);
                /* Before the herd thread can see it (and answer it, freeing req); an interrupt that came
                 * already is noted at once. A stale note of a request freed at this address goes first. */
                pthread_mutex_lock(&r->herd.lock);
                kmap_del(&r->herd.interrupted, (uint64_t)(uintptr_t)w->req);
                pthread_mutex_unlock(&r->herd.lock);
                fuse_req_interrupt_func(w->req, interrupted, fs);
                pthread_mutex_lock(&r->herd.lock);
                ok = !r->herd.stop;
                if (ok) {
                        w->next = r->herd.list;
                        r->herd.list = w;
                        pthread_cond_signal(&r->herd.cond);
                }
                pthread_mutex_unlock(&r->herd.lock);
                if (!ok) /* stopping meanwhile: answered here, as the herd thread would (H1) */
                        answer(fs, w, false);
                return KFS_REMOTE_PARKED;
        }
        kfs_inode_unref(fs, w->dir, 1);
        if (!w->local)
                w->path = w->key = NULL; /* the caller's again (kfs_remote_herd) */
        wait_free(w);
        return -ENOENT;
}

int kfs_remote_herd(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const struct kfs_asker *a, char *path,
                    char *key)
{
        struct kfs_remote *r = fs->remote;
        char *mark = kfs_remote_herd_key(key);
        if (!mark)
                return -ENOENT;
        pid_t tid = fuse_req_ctx(req)->pid;
        pid_t tgid = kfs_tgid_of(tid);
        uint64_t h = kfs_remote_hash(0, mark);
        int64_t now = kfs_mono_ns();
        int ret = -ENOENT;
        struct herd_mine here = { 0 }; /* a compile on this node by another process, with a directory */
        pthread_mutex_lock(&r->herd.lock);
        struct herd_mine *m = kmap_get(&r->herd.mine, h);
        if (m && m->until_ns > now) {
                ret = KFS_REMOTE_UNSURE; /* H4: compiled here, never waited for at the output */
                if (m->dir.name && m->tgid != tgid && dir_copy(&here.dir, &m->dir) == 0) {
                        here.tgid = m->tgid;
                        here.start = m->start;
                        here.until_ns = m->until_ns;
                }
        }
        pthread_mutex_unlock(&r->herd.lock);
        /* H7, unless it is the compile's own (a process it started), or it may hold what the compile waits
         * for: a flock through the mount (JAX's .lockfile around its lookup), or the runtime's own lock
         * (libkcache's: its waiters wait there) */
        if (here.dir.name) {
                if (!kin_of(tgid, here.tgid) && !krt_is_self_locked_output(kfs_remote_base(path)) &&
                    !kfs_flock_holds_any(fs, tid))
                        ret = invite(r, tid, &here);
                dir_free(&here.dir);
        }
        if (ret == -ENOENT) {
                redisContext *c = kfs_remote_conn(r, r->timeout_ms);
                redisReply *rep = c ? redisCommand(c, "SET %b %s NX PX %u", mark, strlen(mark), r->node, r->herd_ms)
                                    : NULL;
                if (c && !rep)
                        kfs_remote_conn_failed(r, c);
                if (rep && rep->type == REDIS_REPLY_STATUS)
                        ret = KFS_REMOTE_UNSURE; /* ours: this process compiles it (unless H5) */
                else if (rep && rep->type == REDIS_REPLY_NIL)
                        ret = KFS_REMOTE_PARKED; /* another node's: wait for its compile (H6) */
                if (rep)
                        freeReplyObject(rep);
                if (ret == KFS_REMOTE_PARKED) { /* H6: only a mark a node made, which expires by itself */
                        redisReply *t = c ? redisCommand(c, "PTTL %b", mark, strlen(mark)) : NULL;
                        bool ours_like = t && t->type == REDIS_REPLY_INTEGER && t->integer > 0 &&
                                         t->integer <= (long long)r->herd_ms;
                        if (c && !t)
                                kfs_remote_conn_failed(r, c);
                        if (t)
                                freeReplyObject(t);
                        if (!ours_like)
                                ret = KFS_REMOTE_UNSURE; /* a mark that never ends (not a node's): compile */
                }
                if (ret == KFS_REMOTE_UNSURE && c) { /* H5: a compile published between our GET and SET */
                        redisReply *again = kfs_remote_get(r, key, r->timeout_ms);
                        if (again && again->type == REDIS_REPLY_STRING) {
                                struct kfs_remote_ns ns;
                                kfs_remote_own_ns(r, a->uid, path, &ns);
                                int t = kfs_remote_take(fs, a, &ns, path, key, again);
                                /* take() may have dropped c (a failure): this thread's connection anew */
                                redisContext *c2 = kfs_remote_conn(r, r->timeout_ms);
                                redisReply *d = c2 ? redisCommand(c2, "DEL %b", mark, strlen(mark)) : NULL;
                                if (c2 && !d)
                                        kfs_remote_conn_failed(r, c2);
                                if (d) /* ours, and nobody waits on it */
                                        freeReplyObject(d);
                                freeReplyObject(again);
                                free(mark);
                                return t == 0 ? 0 : -ENOENT;
                        }
                        if (again)
                                freeReplyObject(again);
                }
                if (ret == KFS_REMOTE_UNSURE)
                        remember_mine(fs, h, tgid, now + (int64_t)r->herd_ms * 1000000, path);
        }
        struct herd_wait *w = ret == KFS_REMOTE_PARKED ? calloc(1, sizeof(*w)) : NULL;
        if (ret == KFS_REMOTE_PARKED && (!w || !(w->name = strdup(kfs_remote_base(path))))) {
                free(w);
                ret = -ENOENT;
        }
        if (ret != KFS_REMOTE_PARKED) {
                free(mark);
                return ret;
        }
        w->req = req;
        w->dir = dir;
        w->path = path;
        w->key = key;
        w->mark = mark;
        w->asker = *a;
        w->deadline_ns = kfs_mono_ns() + (int64_t)r->herd_ms * 1000000;
        return park(fs, w);
}

int kfs_remote_herd_join(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const char *name)
{
        struct kfs_remote *r = fs->remote;
        if (!r || !atomic_load_explicit(&r->herd.ninvites, memory_order_relaxed))
                return 0; /* the common case: nobody invited, one load */
        pid_t tid = fuse_req_ctx(req)->pid;
        int64_t now = kfs_mono_ns();
        struct herd_wait *w = NULL;
        uint64_t asker_start = 0;
        pthread_mutex_lock(&r->herd.lock);
        if (now >= r->herd.invites_swept_ns) { /* those whose walk never came back, at most once a second */
                r->herd.invites_next = 0; /* a prune now, whatever the count; it sets the next bound */
                PRUNE(&r->herd.invites, &r->herd.invites_next, struct herd_invite, invite_free);
                r->herd.invites_swept_ns = now + 1000000000LL;
                atomic_store(&r->herd.ninvites, r->herd.invites.count);
        }
        struct herd_invite *v = tid > 0 ? kmap_get(&r->herd.invites, (uint64_t)tid) : NULL;
        if (v && !v->parked && v->dir.parent == dir->bino && !strcmp(v->dir.name, name)) {
                v->parked = true; /* H7: once; the invite stays, for the lookup of the output that follows */
                w = calloc(1, sizeof(*w));
                if (w) {
                        w->compiler = v->compiler;
                        w->compiler_start = v->compiler_start;
                        w->deadline_ns = v->deadline_ns;
                        w->path = strdup(v->dir.path);
                        asker_start = v->asker_start;
                }
        } else if (v && !strcmp(name, kfs_remote_base(v->dir.path))) {
                /* the output itself found: what the walk came back for (or a later look) takes the invite */
                invite_free(kmap_del(&r->herd.invites, (uint64_t)tid));
                atomic_store(&r->herd.ninvites, r->herd.invites.count);
        }
        pthread_mutex_unlock(&r->herd.lock);
        if (!w)
                return 0;
        /* the thread told, not another given its id since; nor a wait past the mark's life */
        if (!w->path || !(w->name = strdup(name)) || !asker_start || kfs_proc_start(tid) != asker_start ||
            now >= w->deadline_ns) {
                wait_free(w);
                return 0;
        }
        w->req = req;
        w->dir = dir;
        w->local = true;
        return park(fs, w) == KFS_REMOTE_PARKED ? KFS_REMOTE_PARKED : 0;
}

void kfs_remote_herd_stop(struct kfs *fs)
{
        struct kfs_remote *r = fs->remote;
        pthread_mutex_lock(&r->herd.lock);
        bool started = r->herd.started;
        r->herd.stop = true;
        pthread_cond_broadcast(&r->herd.cond);
        pthread_mutex_unlock(&r->herd.lock);
        if (started)
                pthread_join(r->herd.thread, NULL);
        r->herd.started = false;
        size_t pos = 0;
        uint64_t k;
        void *v;
        while (kmap_next(&r->herd.mine, &pos, &k, &v))
                mine_free(v);
        kmap_free(&r->herd.mine);
        pos = 0;
        while (kmap_next(&r->herd.invites, &pos, &k, &v))
                invite_free(v);
        kmap_free(&r->herd.invites);
        kmap_free(&r->herd.interrupted);
        atomic_store(&r->herd.ninvites, 0);
}
