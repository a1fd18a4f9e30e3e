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
 *   H4 Only another node's compile is waited for. A lookup waiting in the kernel holds its directory's
 *      lock (shared) until it is answered, and the compile stores into that very directory (a create,
 *      a rename into place: the lock exclusive): a lookup parked on the node that compiles would hold
 *      off the compile it waits for, until herd_wait. So the marks this node set are remembered (mine),
 *      and a lookup of a name marked here is a miss at once: the process that holds the mark goes on
 *      (its second probe, the lookup of its rename's target), and another process here compiles too.
 *      One compile per cluster is one per node that misses first at once, at most.
 *   H6 Only a mark that ends within herd_wait is waited for: one without a life (not a node's: written
 *      by hand, or by a client the server's ACLs should have kept out) would hold every lookup of the
 *      name for herd_wait, again and again.
 *   H5 A mark won is checked against the unit once more: a compile elsewhere may have been published (its
 *      unit stored, then its mark deleted) between our GET and our SET, and is then fetched, not done
 *      again. The publisher stores the unit before it deletes the marks, so a mark won after the
 *      deletion finds the unit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define HERD_POLL_MS 20
/* A poll's deadline: off every application's path, so longer than a lookup's probe; a node whose cores
 * are all compiling answers late. Polls that fail for HERD_FAILING_MS give the wait up. */
#define HERD_POLL_TIMEOUT_MS 250
#define HERD_FAILING_MS 1000

struct herd_mine {
        pid_t tgid;               /* the process compiling it */
        int64_t until_ns;         /* the mark's end */
};

struct herd_wait {
        fuse_req_t req;
        struct kfs_inode *dir;    /* held: H2 */
        char *name, *path, *key, *mark;
        struct kfs_asker asker;
        int64_t deadline_ns;
        int64_t failing_ns;       /* since when the server has not answered its polls; 0: it answers */
        struct herd_wait *next;
};

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
        int dfd = kfs_inode_fd(fs, w->dir);
        struct stat st;
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

/* This node's process tgid holds the mark hashed h until until_ns (H4). */
static void remember_mine(struct kfs_remote *r, uint64_t h, pid_t tgid, int64_t until_ns)
{
        struct herd_mine *m = malloc(sizeof(*m));
        if (!m)
                return;
        m->tgid = tgid;
        m->until_ns = until_ns;
        pthread_mutex_lock(&r->herd.lock);
        if (r->herd.mine.count > 4096) { /* the ended ones go */
                int64_t now = kfs_remote_mono_ns();
                kmap keep;
                kmap_init(&keep);
                size_t pos = 0;
                uint64_t k;
                void *v;
                while (kmap_next(&r->herd.mine, &pos, &k, &v)) {
                        struct herd_mine *o = v;
                        if (o->until_ns > now && kmap_put(&keep, k, o) == 0)
                                continue;
                        free(o);
                }
                kmap_free(&r->herd.mine);
                r->herd.mine = keep;
        }
        free(kmap_del(&r->herd.mine, h));
        if (kmap_put(&r->herd.mine, h, m) < 0)
                free(m);
        pthread_mutex_unlock(&r->herd.lock);
}

int kfs_remote_herd(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const struct kfs_asker *a, char *path,
                    char *key)
{
        struct kfs_remote *r = fs->remote;
        char *mark = kfs_remote_herd_key(key);
        if (!mark)
                return -ENOENT;
        pid_t tgid = kfs_tgid_of(fuse_req_ctx(req)->pid);
        uint64_t h = kfs_remote_hash(0, mark);
        int64_t now = kfs_remote_mono_ns();
        int ret = -ENOENT;
        pthread_mutex_lock(&r->herd.lock);
        struct herd_mine *m = kmap_get(&r->herd.mine, h);
        if (m && m->until_ns > now)
                ret = KFS_REMOTE_UNSURE; /* H4: compiled here, never waited for here */
        pthread_mutex_unlock(&r->herd.lock);
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
                        remember_mine(r, h, tgid, now + (int64_t)r->herd_ms * 1000000);
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
        pthread_mutex_lock(&fs->itable_lock);
        dir->nlookup++; /* H2 */
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
        if (!ok) { /* no thread to answer it: answered now, as a miss (H1) */
                w->path = w->key = NULL; /* the caller's again */
                kfs_inode_unref(fs, dir, 1);
                free(w->name);
                free(w->mark);
                free(w);
                return -ENOENT;
        }
        return KFS_REMOTE_PARKED;
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
                free(v);
        kmap_free(&r->herd.mine);
}
