/* publish.c: the publisher thread (remote.h, PUBLISH). Files written through the mount name their unit
 * here (kfs_remote_note_*); once nothing of the unit changed for PUBLISH_QUIET_MS it is read beneath the
 * root and stored, first writer wins, off every application's path.
 *
 * What must stay true:
 *   P1 Only a whole unit of a shareable runtime goes: not busy (a lock or temporary of the runtime in
 *      it), every member a regular file, none changed while it was read.
 *   P2 Into the namespace of the uid that owns every member, and only then (TRUST): a unit with files of
 *      two owners is not published at all, nor one that anybody else could have arranged: the key is the
 *      path, so whoever may rename in a directory on the way (from the root down to each member's)
 *      chooses the key that the owner's bytes go under (another kernel's: way_closed). On a
 *      remote_publish=NAME mount, the publisher's units (those of the remote_publisher= account, a CI or
 *      admin account) go into "p:NAME" instead, and into no user's; its ACL user alone may write there,
 *      and a node's credentials are refused (NOPERM), which is a counted error, never the application's.
 *      Other users' units there go to their own.
 *   P3 The unit's key last-but-none: its markers ("M", "D") are stored only once the unit is, so a
 *      lookup that finds a marker finds the unit (unless the server evicted it since: a miss). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../evict/evict.h"
#include "internal.h"
#include "value.h"

struct pub_item {
        char *path;
        int64_t due_ns;
        unsigned tries;           /* times it was found busy, changing or the server away */
};

#define PUBLISH_TRIES 40          /* then it is left: noted again at its next write */

static void note_path(struct kfs *fs, char *path, unsigned tries)
{
        struct kfs_remote *r = fs->remote;
        if (!path)
                return;
        if (krt_is_kept_path(path)) {
                free(path);
                return;
        }
        uint64_t h = kfs_remote_hash(0, path);
        pthread_mutex_lock(&r->pub.lock);
        struct pub_item *it = kmap_get(&r->pub.due, h);
        if (!it && r->pub.due.count < 100000 && (it = calloc(1, sizeof(*it)))) {
                it->path = path;
                path = NULL;
                if (kmap_put(&r->pub.due, h, it) < 0) {
                        free(it->path);
                        free(it);
                        it = NULL;
                }
        }
        if (it) {
                it->due_ns = kfs_mono_ns() + (int64_t)PUBLISH_QUIET_MS * 1000000;
                it->tries = tries;
        }
        pthread_cond_signal(&r->pub.cond);
        pthread_mutex_unlock(&r->pub.lock);
        free(path);
}

void kfs_remote_note_fd(struct kfs *fs, int fd)
{
        if (!fs->remote || fd < 0)
                return;
        char *rel = kfs_remote_relpath(fs, fd, NULL); /* the file's own path, as the backing has it now */
        if (rel && !*rel) {
                free(rel); /* the root itself: no file */
                rel = NULL;
        }
        note_path(fs, rel, 0);
}

void kfs_remote_note_name(struct kfs *fs, int dfd, const char *name)
{
        if (fs->remote)
                note_path(fs, kfs_remote_relpath(fs, dfd, name), 0);
}

/* The members of u, read (P1). */
struct snap {
        struct krv_unit v;
        unsigned char **bufs;
        uid_t owner;
        int64_t newest_ns;
};

static void snap_free(struct snap *s)
{
        for (size_t i = 0; s->bufs && i < s->v.n; i++)
                free(s->bufs[i]);
        free(s->bufs);
        for (size_t i = 0; s->v.files && i < s->v.n; i++)
                free(s->v.files[i].path);
        free(s->v.files);
        memset(s, 0, sizeof(*s));
}

static int read_member(struct kfs *fs, const char *path, struct krv_file *f, unsigned char **buf, struct stat *st)
{
        int fd = ktree_open_file(&fs->tree, KTREE_ROOT, path, O_RDONLY, 0);
        if (fd < 0)
                return fd;
        int r = fstat(fd, st) < 0 ? -errno : (uint64_t)st->st_size > REMOTE_MAX_UNIT ? -EAGAIN : 0; /* grew */
        *buf = r == 0 ? malloc(st->st_size ? (size_t)st->st_size : 1) : NULL;
        if (r == 0 && !*buf)
                r = -ENOMEM;
        size_t got = 0;
        while (r == 0 && got < (size_t)st->st_size) {
                ssize_t n = pread(fd, *buf + got, (size_t)st->st_size - got, (off_t)got);
                if (n < 0 && errno != EINTR)
                        r = -errno;
                else if (n == 0)
                        r = -EAGAIN; /* shrank meanwhile */
                else if (n > 0)
                        got += (size_t)n;
        }
        struct stat after;
        if (r == 0 && (fstat(fd, &after) < 0 || after.st_size != st->st_size ||
                       after.st_mtim.tv_nsec != st->st_mtim.tv_nsec || after.st_mtim.tv_sec != st->st_mtim.tv_sec))
                r = -EAGAIN; /* written while read (P1) */
        close(fd);
        if (r == 0) {
                f->data = *buf;
                f->size = (uint64_t)st->st_size;
                f->mode = st->st_mode & 0777;
        }
        return r;
}

/* Reads unit u: its files in write order (the reverse of eviction's). -EAGAIN: try later. */
static int snapshot(struct kfs *fs, const struct kev_unit *u, struct snap *s)
{
        memset(s, 0, sizeof(*s));
        uint64_t total = 0; /* the whole unit's size first, before anything is read (REMOTE_MAX_UNIT) */
        for (size_t i = 0; i < u->n; i++) {
                struct stat st;
                if (ktree_stat(&fs->tree, KTREE_ROOT, u->members[i], &st) < 0)
                        return -EAGAIN; /* gone meanwhile */
                total += (uint64_t)st.st_size;
                if (total > REMOTE_MAX_UNIT)
                        return -EFBIG;
        }
        s->v.files = calloc(u->n, sizeof(*s->v.files));
        s->bufs = calloc(u->n, sizeof(*s->bufs));
        if (!s->v.files || !s->bufs) {
                snap_free(s);
                return -ENOMEM;
        }
        int r = 0;
        for (size_t i = 0; i < u->n && r == 0; i++) {
                const char *m = u->members[u->n - 1 - i];
                struct stat st;
                struct krv_file *f = &s->v.files[i];
                f->path = strdup(m);
                s->v.n = i + 1;
                if (!f->path) {
                        r = -ENOMEM;
                        break;
                }
                r = read_member(fs, m, f, &s->bufs[i], &st);
                if (r == 0 && i == 0)
                        s->owner = st.st_uid;
                else if (r == 0 && st.st_uid != s->owner)
                        r = -EPERM; /* P2: two owners, no namespace */
                int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
                if (r == 0 && mt > s->newest_ns)
                        s->newest_ns = mt;
        }
        if (r < 0)
                snap_free(s);
        return r;
}

/* Whether nobody but owner and root could have put u's members where they are (P2): every directory from
 * the root down to each member's belongs to owner or root, and none is writable by others unless sticky
 * (as the root of a shared mount, 1777: there nobody renames what is not theirs). Checked on the tree as
 * it is after the members were read; what a directory's owner and mode allow only its owner and root can
 * change. */
static bool way_closed(struct kfs *fs, const struct kev_unit *u, uid_t owner)
{
        struct stat st;
        char rel[PATH_MAX];
        for (size_t i = 0; i < u->n; i++) {
                const char *m = u->members[i];
                size_t n = strlen(m);
                if (n >= sizeof(rel))
                        return false;
                for (size_t e = 0; e < n; e++) {
                        if (e > 0 && m[e] != '/')
                                continue;
                        memcpy(rel, m, e);
                        rel[e] = '\0'; /* "" (the root), then each directory above the member */
                        if (ktree_stat(&fs->tree, KTREE_ROOT, rel, &st) < 0 || !S_ISDIR(st.st_mode) ||
                            (st.st_uid != owner && st.st_uid != 0) ||
                            ((st.st_mode & 022) && !(st.st_mode & S_ISVTX)))
                                return false;
                }
        }
        return true;
}

/* The in-flight mark of key goes (herd.c): its compile is stored. Returns the commands appended. */
static size_t unmark(redisContext *c, const char *key)
{
        char *m = kfs_remote_herd_key(key);
        if (!m)
                return 0;
        redisAppendCommand(c, "DEL %b", m, strlen(m));
        free(m);
        return 1;
}

/* Stores the markers of unit u (P3): "M<marker>" at its other members, "D" at the directories above;
 * u's members are its paths in ns (past the namespace's home). */
static void store_markers(redisContext *c, const char *ns, const struct kev_unit *u, size_t *sent)
{
        char *k0 = kfs_remote_key(ns, u->members[0]);
        size_t n = k0 ? unmark(c, k0) : 0;
        free(k0);
        for (size_t i = 1; i < u->n; i++) {
                char *k = kfs_remote_key(ns, u->members[i]);
                if (!k)
                        continue;
                redisAppendCommand(c, "SET %b M%s NX", k, strlen(k), u->members[0]);
                n += unmark(c, k);
                free(k);
                n++;
        }
        /* each member's name in its directory's listing (LISTINGS, remote.h) */
        for (size_t i = 0; i < u->n; i++) {
                const char *slash = strrchr(u->members[i], '/');
                char *dir = slash ? strndup(u->members[i], (size_t)(slash - u->members[i])) : strdup("");
                char *k = dir ? kfs_remote_list_key(ns, dir) : NULL;
                if (k) {
                        const char *name = slash ? slash + 1 : u->members[i];
                        redisAppendCommand(c, "SADD %b %s", k, strlen(k), name);
                        n++;
                }
                free(k);
                free(dir);
        }
        /* every directory above a member, once; the root itself has no key */
        for (size_t i = 0; i < u->n; i++) {
                char *p = strdup(u->members[i]);
                for (char *s = p ? strrchr(p, '/') : NULL; s; s = strrchr(p, '/')) {
                        *s = '\0';
                        bool seen = false;
                        for (size_t j = 0; j < i && !seen; j++) {
                                size_t l = strlen(p);
                                seen = !strncmp(u->members[j], p, l) && u->members[j][l] == '/';
                        }
                        if (seen)
                                break; /* this one and those above it went with an earlier member */
                        char *k = kfs_remote_key(ns, p);
                        if (k) {
                                redisAppendCommand(c, "SET %b D NX", k, strlen(k));
                                n += unmark(c, k);
                                free(k);
                                n++;
                        }
                }
                free(p);
        }
        *sent = n;
}

/* Whether the unit stored at key is smaller than ours of len bytes: the same user's unit that has grown
 * since it was stored (a runtime adds to its entry: PoCL's kernels, linked at their first launch). Two
 * nodes' copies of one compile are as long as each other, so the first of them stays (first writer wins). */
static bool grew(redisContext *c, const char *key, size_t len)
{
        redisReply *rep = redisCommand(c, "STRLEN %b", key, strlen(key));
        bool yes = rep && rep->type == REDIS_REPLY_INTEGER && (size_t)rep->integer < len;
        if (rep)
                freeReplyObject(rep);
        return yes;
}

int kfs_remote_unit_rt(const struct kev_unit *u)
{
        return u->rt != KRT_FILE ? (int)u->rt : (int)u->forced;
}

/* One noted path: its unit published if it is whole, quiet and not yet on the server. Returns -EAGAIN
 * to be tried again later. */
static int publish_one(struct kfs *fs, const char *path)
{
        struct kfs_remote *r = fs->remote;
        struct kev_unit u;
        int e = kev_unit_resolve(fs, path, &u);
        if (e < 0)
                return 0;
        int rt = kfs_remote_unit_rt(&u);
        if (!kfs_remote_shareable(rt) || u.n == 0) {
                kev_unit_free(&u);
                return 0;
        }
        if (u.busy) {
                kev_unit_free(&u);
                return -EAGAIN; /* P1: the runtime is storing it */
        }
        for (size_t i = 0; i < u.n; i++)
                if (krt_is_temporary(u.members[i]) || krt_is_kept_path(u.members[i])) {
                        kev_unit_free(&u);
                        return 0;
                }
        struct snap s;
        e = snapshot(fs, &u, &s);
        if (e < 0) {
                kev_unit_free(&u);
                return e == -EAGAIN ? -EAGAIN : 0;
        }
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec - s.newest_ns < (int64_t)PUBLISH_QUIET_MS * 1000000) {
                snap_free(&s);
                kev_unit_free(&u);
                return -EAGAIN; /* still being written */
        }
        if (!way_closed(fs, &u, s.owner)) { /* P2: another user could have chosen its key */
                snap_free(&s);
                kev_unit_free(&u);
                return 0;
        }
        struct kfs_remote_ns ns;
        kfs_remote_own_ns(r, s.owner, u.members[0], &ns); /* P2 */
        /* a publisher's namespace has the unit's paths past the owner's home (every member is beneath it:
         * the unit's directory is), so that every user's lookup in their own home finds it */
        size_t hl = strlen(ns.home);
        for (size_t i = 0; hl && i < u.n; i++) {
                if (strncmp(u.members[i], ns.home, hl)) {
                        snap_free(&s);
                        kev_unit_free(&u);
                        return 0;
                }
        }
        char **full = u.members; /* the members as the tree has them: u is freed with them */
        char **in_ns = hl ? malloc(u.n * sizeof(*in_ns)) : NULL;
        if (hl && !in_ns) {
                snap_free(&s);
                kev_unit_free(&u);
                return -EAGAIN;
        }
        for (size_t i = 0; hl && i < u.n; i++) {
                in_ns[i] = u.members[i] + hl;
                memmove(s.v.files[i].path, s.v.files[i].path + hl, strlen(s.v.files[i].path + hl) + 1);
        }
        if (hl)
                u.members = in_ns;
        char *key = kfs_remote_key(ns.s, u.members[0]);
        uint64_t mh = key ? kfs_remote_hash(0, key) : 0;
        pthread_mutex_lock(&r->memo_lock);
        bool done = (int64_t)(uintptr_t)kmap_get(&r->memo, mh) == s.newest_ns;
        pthread_mutex_unlock(&r->memo_lock);
        int ret = 0;
        if (key && !done) {
                s.v.rt = (uint8_t)rt;
                s.v.uid = s.owner;
                s.v.time_ns = (uint64_t)now.tv_sec * 1000000000 + (uint64_t)now.tv_nsec;
                s.v.node = r->node;
                size_t len;
                unsigned char *val = krv_encode(&s.v, &len);
                s.v.node = NULL;
                redisContext *c = val ? kfs_remote_conn(r, r->transfer_ms) : NULL;
                redisReply *rep = c ? redisCommand(c, "SET %b %b NX", key, strlen(key), val, len) : NULL;
                if (c && !rep) {
                        atomic_fetch_add(&r->errors, 1);
                        kfs_remote_conn_failed(r, c);
                        ret = -EAGAIN;
                } else if (rep && rep->type == REDIS_REPLY_ERROR) {
                        atomic_fetch_add(&r->errors, 1); /* NOPERM: an ACL (TRUST), OOM: maxmemory without eviction */
                } else if (rep) {
                        bool first = rep->type == REDIS_REPLY_STATUS;
                        if (!first && grew(c, key, len)) { /* PoCL links its kernels after the program is stored */
                                freeReplyObject(rep);
                                rep = redisCommand(c, "SET %b %b XX", key, strlen(key), val, len);
                                first = rep && rep->type == REDIS_REPLY_STATUS;
                                if (!rep) {
                                        kfs_remote_conn_failed(r, c);
                                        c = NULL;
                                }
                        }
                        size_t n = 0;
                        if (c)
                                store_markers(c, ns.s, &u, &n);
                        bool ok = true;
                        for (size_t i = 0; i < n; i++) {
                                redisReply *m = NULL;
                                if (redisGetReply(c, (void **)&m) != REDIS_OK) {
                                        ok = false;
                                        break;
                                }
                                freeReplyObject(m);
                        }
                        if (!ok || !c) {
                                if (c)
                                        kfs_remote_conn_failed(r, c);
                                atomic_fetch_add(&r->errors, 1);
                                ret = -EAGAIN; /* tried again: then stored before, by this node */
                        } else {
                                /* Counted only now, with the markers and the listing on the server too:
                                 * a node that sees the count, or a reader told of it, finds every key of
                                 * the unit (the directories' "D" above all, which a walk down asks first). */
                                atomic_fetch_add(first ? &r->publishes : &r->published_before, 1);
                                if (first) {
                                        atomic_fetch_add(&r->bytes_out, len);
                                        kfs_remote_forget_all(r);
                                }
                                pthread_mutex_lock(&r->memo_lock);
                                if (r->memo.count > 65536) {
                                        kmap_free(&r->memo);
                                        kmap_init(&r->memo);
                                }
                                (void)kmap_put(&r->memo, mh, (void *)(uintptr_t)s.newest_ns);
                                pthread_mutex_unlock(&r->memo_lock);
                        }
                } else {
                        ret = -EAGAIN; /* no server now */
                }
                if (rep)
                        freeReplyObject(rep);
                free(val);
        }
        free(key);
        snap_free(&s);
        u.members = full;
        free(in_ns);
        kev_unit_free(&u);
        return ret;
}

static void *publisher_main(void *arg)
{
        struct kfs *fs = arg;
        struct kfs_remote *r = fs->remote;
        pthread_mutex_lock(&r->pub.lock);
        while (!r->pub.stop) {
                int64_t now = kfs_mono_ns(), next = now + 1000000000;
                struct pub_item *ready = NULL;
                uint64_t rk = 0;
                size_t pos = 0;
                uint64_t k;
                void *v;
                while (kmap_next(&r->pub.due, &pos, &k, &v)) {
                        struct pub_item *it = v;
                        if (it->due_ns <= now) {
                                ready = it;
                                rk = k;
                                break;
                        }
                        if (it->due_ns < next)
                                next = it->due_ns;
                }
                if (!ready) {
                        pthread_mutex_unlock(&r->pub.lock);
                        int64_t due = kfs_remote_touch_due(fs, now); /* (touch.c) */
                        pthread_mutex_lock(&r->pub.lock);
                        if (due < next)
                                next = due;
                        if (r->pub.stop)
                                break;
                        /* the condition variable's clock is the realtime one (kfs_deadline_ms): a monotonic
                         * deadline there is long past, and this thread spun a CPU whole */
                        int64_t wait_ms = (next - now + 999999) / 1000000;
                        struct timespec ts = kfs_deadline_ms(wait_ms < 1 ? 1 : wait_ms > 1000 ? 1000 : (unsigned)wait_ms);
                        pthread_cond_timedwait(&r->pub.cond, &r->pub.lock, &ts);
                        continue;
                }
                kmap_del(&r->pub.due, rk);
                pthread_mutex_unlock(&r->pub.lock);
                int e = publish_one(fs, ready->path);
                if (e == -EAGAIN && ready->tries + 1 < PUBLISH_TRIES) { /* again after another quiet period */
                        char *p = ready->path;
                        ready->path = NULL;
                        note_path(fs, p, ready->tries + 1);
                }
                free(ready->path);
                free(ready);
                pthread_mutex_lock(&r->pub.lock);
        }
        pthread_mutex_unlock(&r->pub.lock);
        return NULL;
}

void kfs_remote_pub_start(struct kfs *fs)
{
        struct kfs_remote *r = fs->remote;
        pthread_mutex_lock(&r->pub.lock);
        r->pub.started = kfs_thread_start(&r->pub.thread, 0, publisher_main, fs) == 0;
        pthread_mutex_unlock(&r->pub.lock);
}

void kfs_remote_pub_stop(struct kfs *fs)
{
        struct kfs_remote *r = fs->remote;
        pthread_mutex_lock(&r->pub.lock);
        bool started = r->pub.started;
        r->pub.stop = true;
        pthread_cond_broadcast(&r->pub.cond);
        pthread_mutex_unlock(&r->pub.lock);
        if (started)
                pthread_join(r->pub.thread, NULL);
        r->pub.started = false;
        size_t pos = 0;
        uint64_t k;
        void *v;
        while (kmap_next(&r->pub.due, &pos, &k, &v)) {
                struct pub_item *it = v;
                free(it->path);
                free(it);
        }
        kmap_free(&r->pub.due);
}
