/* herd.c: one compile per cluster (remote.h, HERD). A lookup that missed on the server either marks the
 * name in flight (this node compiles it) or, where another lookup marked it first, waits for that
 * compile: the request is parked here, holding no worker, and the herd thread answers it.
 *
 * What must stay true:
 *   H1 A parked lookup is answered exactly once: with the name (once it is on this node, or fetched
 *      from the server), or as a miss (the mark gone with nothing stored, herd_wait passed, the mount
 *      stopping). Never left unanswered: its process would hang.
 *   H2 Its directory is held (a lookup reference) while it waits, and let go after the answer.
 *   H3 A wait never outlives herd_wait: a compile that died leaves a mark that expires by itself.
 *   H4 A lookup of the output itself waits only for another node's compile. A lookup waiting in the
 *      kernel holds its directory's lock (shared) until it is answered, and the compile stores into that
 *      very directory (a create, a rename into place: the lock exclusive): a lookup of the output parked
 *      on the node that compiles would hold off the compile it waits for, until herd_wait. So the marks
 *      this node set are remembered (mine), with the process that compiles, and its lookups (and those of
 *      the processes it started: a linker) are a miss at once.
 *   H6 Only a mark that ends within herd_wait is waited for: one without a life (not a node's: written
 *      by hand, or by a client the server's ACLs should have kept out) would hold every lookup of the
 *      name for herd_wait, again and again.
 *   H5 A mark won is checked against the unit once more: a compile elsewhere may have been published (its
 *      unit stored, then its mark deleted) between our GET and our SET, and is then fetched, not done
 *      again. The publisher stores the unit before it deletes the marks, so a mark won after the
 *      deletion finds the unit.
 *   H7 Another process of this node that looks the output up while it is compiled here waits where it
 *      holds no directory lock (ONE NODE, below): it is told ESTALE once, the kernel walks its path again
 *      asking for every directory on the way (LOOKUP_REVAL), and that walk's lookup of the unit's own
 *      directory is parked, until the output is here, the compiling process is gone, or the mark's life
 *      is over. Its next lookup of the output, found or not, is answered as it is: never a second ESTALE,
 *      which would reach the application.
 *
 * ONE NODE. The kernel looks a name up holding its directory's i_rwsem shared (lookup_slow), and every
 * create and rename there needs it exclusive before the request reaches us; but a walk through a
 * directory the kernel already knows revalidates it (d_revalidate, a LOOKUP request) holding no lock at
 * all, and an ESTALE from a lookup makes the kernel walk the whole path again in that way
 * (filename_lookup, do_filp_open and the syscalls' retry_estale: open, stat, access, rename alike). So the
 * process told ESTALE (an invite, keyed by its thread id) is parked at the revalidation of its unit's own
 * directory, the compile's stores into that directory go through, and only that thread's one walk is
 * parked (not a mkdir's revalidation by another, which holds the parent's lock). Only units with a
 * directory of their own are waited for so (PoCL's program directory, Triton's key directory: units.c);
 * JAX's files side by side in one directory have none above their output, and there two processes of one
 * node may both compile. A process that holds a lock of its own across its lookup and its compile
 * (libkcache, the OpenCL layer: client/lock.c) never gets here. Runtimes that find an entry by opening a
 * name relative to a directory they hold open walk nothing again: their second lookup is a miss, and they
 * compile as before. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../evict/evict.h"
#include "internal.h"

#define HERD_POLL_MS 20
/* A poll's deadline: off every application's path, so longer than a lookup's probe; a node whose cores
 * are all compiling answers late. Polls that fail for HERD_FAILING_MS give the wait up. */
#define HERD_POLL_TIMEOUT_MS 250
#define HERD_FAILING_MS 1000

/* The unit's own directory (ONE NODE): its parent's backing inode and its name; NULL name: none. */
struct herd_unit {
        uint64_t parent;
        char *name;
        char *path;               /* the output's path, relative to the root: the wait ends once it is here */
};

struct herd_mine {
        pid_t tgid;               /* the process compiling it */
        uint64_t start;           /* its start (kfs_proc_start): a pid used again is not it */
        int64_t until_ns;         /* the mark's end */
        struct herd_unit unit;
};

/* A process of this node told to look the output again (H7), keyed by its thread id. */
struct herd_invite {
        uint64_t mark;            /* the hash of the mark it waits for */
        pid_t compiler;
        uint64_t compiler_start;
        int64_t until_ns;         /* the mark's end */
        bool parked;              /* its walk was parked once: never again for this mark */
        struct herd_unit unit;
};

struct herd_wait {
        fuse_req_t req;
        struct kfs_inode *dir;    /* held: H2 */
        char *name, *path, *key, *mark;
        struct kfs_asker asker;
        int64_t deadline_ns;
        int64_t failing_ns;       /* since when the server has not answered its polls; 0: it answers */
        /* ONE NODE: a walk parked at the unit's directory (name) for this node's compile of path */
        bool local;
        pid_t compiler;
        uint64_t compiler_start;
        struct herd_wait *next;
};

static void unit_free(struct herd_unit *u)
{
        free(u->name);
        free(u->path);
        u->name = u->path = NULL;
}

static int unit_copy(struct herd_unit *to, const struct herd_unit *from)
{
        *to = (struct herd_unit){ .parent = from->parent, .name = from->name ? strdup(from->name) : NULL,
                                  .path = from->path ? strdup(from->path) : NULL };
        if ((from->name && !to->name) || (from->path && !to->path)) {
                unit_free(to);
                return -ENOMEM;
        }
        return 0;
}

static void mine_free(struct herd_mine *m)
{
        if (m) {
                unit_free(&m->unit);
                free(m);
        }
}

static void invite_free(struct herd_invite *v)
{
        if (v) {
                unit_free(&v->unit);
                free(v);
        }
}

/* The unit's own directory of the output at path, for ONE NODE: a directory that holds this unit alone
 * (PoCL's program directory, Triton's key directory) and the output below it; none otherwise. */
static void unit_dir(struct kfs *fs, const char *path, struct herd_unit *ret)
{
        *ret = (struct herd_unit){ 0 };
        struct kev_unit u;
        int e = kev_unit_resolve(fs, path, &u);
        size_t l = u.root ? strlen(u.root) : 0;
        if (e == 0 && (u.dir_unit || u.rt == KRT_TRITON) && l && !strncmp(path, u.root, l) && path[l] == '/') {
                char *slash = strrchr(u.root, '/');
                const char *name = slash ? slash + 1 : u.root;
                if (slash)
                        *slash = '\0';
                struct stat st;
                if (*name && ktree_stat(&fs->tree, KTREE_ROOT, slash ? u.root : ".", &st) == 0 &&
                    S_ISDIR(st.st_mode)) {
                        ret->parent = st.st_ino;
                        ret->name = strdup(name);
                        ret->path = strdup(path);
                        if (!ret->name || !ret->path)
                                unit_free(ret);
                }
        }
        kev_unit_free(&u);
}

char *kfs_remote_herd_key(const char *key)
{
        char *k;
        return asprintf(&k, "kcfsh%s", key + 4) < 0 ? NULL : k; /* "kcfs:..." -> "kcfsh:..." */
}

/* Answers w's lookup (H1) and lets it go (H2). */
static void answer(struct kfs *fs, struct herd_wait *w, bool served)
{
        struct kfs_remote *r = fs->remote;
        atomic_fetch_add(served ? &r->herd_served : &r->herd_gave_up, 1);
        kfs_lookup_answer(w->req, w->dir, w->name, 0); /* a miss uncached: this process compiles now */
        kfs_inode_unref(fs, w->dir, 1);
        free(w->name);
        free(w->path);
        free(w->key);
        free(w->mark);
        free(w);
}

/* Whether w can be answered now: the name here, or fetched, or no longer worth waiting for. */
static int settle(struct kfs *fs, struct herd_wait *w, int64_t now)
{
        struct kfs_remote *r = fs->remote;
        struct stat st;
        if (w->local) { /* ONE NODE: the output here; the compiling process gone; the mark's life over */
                if (ktree_stat(&fs->tree, KTREE_ROOT, w->path, &st) == 0)
                        return 1;
                return kfs_proc_start(w->compiler) != w->compiler_start || now >= w->deadline_ns ? -1 : 0;
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
                int64_t now = kfs_remote_mono_ns();
                struct herd_wait *keep = NULL;
                while (all) {
                        struct herd_wait *w = all;
                        all = w->next;
                        int s = settle(fs, w, now);
                        if (s != 0) {
                                answer(fs, w, s > 0);
                        } else {
                                w->next = keep;
                                keep = w;
                        }
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

/* Drops the entries of map (of type, each with an until_ns) whose time is past, once it has grown large. */
#define PRUNE(map, type, free_fn)                                                                          \
        do {                                                                                               \
                if ((map)->count > 4096) {                                                                 \
                        int64_t now_ = kfs_remote_mono_ns();                                               \
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
        unit_dir(fs, path, &m->unit); /* before the lock: it reads the tree */
        pthread_mutex_lock(&r->herd.lock);
        PRUNE(&r->herd.mine, struct herd_mine, mine_free);
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

/* H7: thread tid of another process than the one compiling the mark hashed h, for m's unit: told to look
 * again (KFS_REMOTE_RETRY) the first time, a miss after that. */
static int invite(struct kfs_remote *r, pid_t tid, uint64_t h, const struct herd_mine *m)
{
        struct herd_invite *v = calloc(1, sizeof(*v));
        if (!v || unit_copy(&v->unit, &m->unit) < 0) {
                free(v);
                return KFS_REMOTE_UNSURE;
        }
        v->mark = h;
        v->compiler = m->tgid;
        v->compiler_start = m->start;
        v->until_ns = m->until_ns;
        int ret = KFS_REMOTE_RETRY;
        pthread_mutex_lock(&r->herd.lock);
        struct herd_invite *old = kmap_get(&r->herd.invites, (uint64_t)tid);
        if (old && old->mark == h && old->until_ns > kfs_remote_mono_ns()) {
                ret = KFS_REMOTE_UNSURE; /* told once: this lookup is what its walk came back for */
                invite_free(v);
                invite_free(kmap_del(&r->herd.invites, (uint64_t)tid)); /* done with */
        } else {
                PRUNE(&r->herd.invites, struct herd_invite, invite_free);
                invite_free(kmap_del(&r->herd.invites, (uint64_t)tid));
                if (kmap_put(&r->herd.invites, (uint64_t)tid, v) < 0) {
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
        atomic_fetch_add(&r->herd_waits, 1);
        pthread_mutex_lock(&r->herd.lock);
        if (!r->herd.started && !r->herd.stop)
                r->herd.started = pthread_create(&r->herd.thread, NULL, herd_main, fs) == 0;
        bool ok = r->herd.started && !r->herd.stop;
        if (ok) {
                w->next = r->herd.list;
                r->herd.list = w;
                pthread_cond_signal(&r->herd.cond);
        }
        pthread_mutex_unlock(&r->herd.lock);
        if (ok)
                return KFS_REMOTE_PARKED;
        atomic_fetch_sub(&r->herd_waits, 1);
        kfs_inode_unref(fs, w->dir, 1);
        if (w->local)
                free(w->path); /* else path and key are the caller's again (kfs_remote_herd) */
        free(w->name);
        free(w->mark);
        free(w);
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
        int64_t now = kfs_remote_mono_ns();
        int ret = -ENOENT;
        struct herd_mine here = { 0 }; /* a compile on this node by another process, with a unit directory */
        pthread_mutex_lock(&r->herd.lock);
        struct herd_mine *m = kmap_get(&r->herd.mine, h);
        if (m && m->until_ns > now) {
                ret = KFS_REMOTE_UNSURE; /* H4: compiled here, never waited for at the output */
                if (m->unit.name && m->tgid != tgid && unit_copy(&here.unit, &m->unit) == 0) {
                        here.tgid = m->tgid;
                        here.start = m->start;
                        here.until_ns = m->until_ns;
                }
        }
        pthread_mutex_unlock(&r->herd.lock);
        if (here.unit.name) { /* H7, unless it is the compile's own (a process it started) */
                if (!kin_of(tgid, here.tgid))
                        ret = invite(r, tid, h, &here);
                unit_free(&here.unit);
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
        w->deadline_ns = kfs_remote_mono_ns() + (int64_t)r->herd_ms * 1000000;
        return park(fs, w);
}

int kfs_remote_herd_join(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const char *name)
{
        struct kfs_remote *r = fs->remote;
        if (!r || !atomic_load_explicit(&r->herd.ninvites, memory_order_relaxed))
                return 0; /* the common case: nobody invited, one load */
        pid_t tid = fuse_req_ctx(req)->pid;
        struct herd_wait *w = calloc(1, sizeof(*w));
        if (!w)
                return 0;
        int64_t now = kfs_remote_mono_ns();
        bool join = false;
        pthread_mutex_lock(&r->herd.lock);
        struct herd_invite *v = kmap_get(&r->herd.invites, (uint64_t)tid);
        if (v && v->until_ns <= now) { /* its walk never came (or its thread id is another's now) */
                invite_free(kmap_del(&r->herd.invites, (uint64_t)tid));
                atomic_store(&r->herd.ninvites, r->herd.invites.count);
                v = NULL;
        }
        if (v && !v->parked && v->unit.parent == dir->bino && !strcmp(v->unit.name, name)) {
                v->parked = true; /* H7: once */
                w->compiler = v->compiler;
                w->compiler_start = v->compiler_start;
                w->deadline_ns = v->until_ns;
                w->path = strdup(v->unit.path);
                join = true;
        }
        pthread_mutex_unlock(&r->herd.lock);
        if (!join || !w->path || !(w->name = strdup(name))) {
                free(w->path);
                free(w);
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
        atomic_store(&r->herd.ninvites, 0);
}
