/* fetch.c: read-through (remote.h, READ-THROUGH and TRUST). A lookup that found no name asks the server
 * for it; on a directory marker the directory is made, on a unit every member the node lacks is written
 * beneath the root, the file the runtime tests for the entry last, before the lookup is answered.
 *
 * What must stay true:
 *   F1 Only for the uid that owns the directory asked in, from that uid's namespace (or, on a
 *      remote_publish= mount, the publisher's), then from the trusted publishers' (remote_trusted=, in
 *      order), as files that uid owns, into directories that uid owns: a fetch writes nothing its asker
 *      could not have written. A trusted namespace is only read: never written, marked or deleted from
 *      here (the server's ACLs refuse it anyway).
 *   F2 Every path comes from the server, so every one is checked (value.c) and resolved beneath the
 *      root through the tree door; a unit's files all lie beneath the directory of its marker file.
 *   F3 A member is written whole under no name (O_TMPFILE) and linked into place only if the name is
 *      free: the runtime never sees a partial file, and a file it made meanwhile is never replaced.
 *   F4 The room is reserved before anything is written (the limit holds), and each file and directory
 *      made is in the index before the lookup is answered.
 *   F5 Any failure is a miss: the runtime compiles, as it would with no remote. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../evict/evict.h"
#include "internal.h"
#include "value.h"

double kfs_remote_negative_timeout(const struct kfs *fs, double timeout)
{
        return fs->remote && fs->remote->negative_s < timeout ? fs->remote->negative_s : timeout;
}

/* Whether a miss of (uid, path) is remembered; neg_lock taken. */
bool kfs_remote_remembered(struct kfs_remote *r, uint64_t h)
{
        pthread_mutex_lock(&r->neg_lock);
        void *v = kmap_get(&r->neg, h);
        bool yes = v && (int64_t)(uintptr_t)v > kfs_mono_ns();
        if (v && !yes)
                kmap_del(&r->neg, h);
        pthread_mutex_unlock(&r->neg_lock);
        return yes;
}

void kfs_remote_forget_all(struct kfs_remote *r)
{
        pthread_mutex_lock(&r->neg_lock);
        kmap_free(&r->neg);
        kmap_init(&r->neg);
        pthread_mutex_unlock(&r->neg_lock);
}

void kfs_remote_remember(struct kfs_remote *r, uint64_t h)
{
        pthread_mutex_lock(&r->neg_lock);
        if (r->neg.count > 65536) { /* bounded: the oldest are not worth a scan; start again */
                kmap_free(&r->neg);
                kmap_init(&r->neg);
        }
        (void)kmap_put(&r->neg, h, (void *)(uintptr_t)(kfs_mono_ns() + (int64_t)(r->negative_s * 1e9)));
        pthread_mutex_unlock(&r->neg_lock);
}

/* GET key within ms. The reply (a string or nil), or NULL on a failure (counted, connection dropped). */
redisReply *kfs_remote_get(struct kfs_remote *r, const char *key, unsigned ms)
{
        redisContext *c = kfs_remote_conn(r, ms);
        if (!c)
                return NULL;
        redisReply *rep = redisCommand(c, "GET %b", key, strlen(key));
        if (!rep) {
                if (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK || strstr(c->errstr, "temporarily")))
                        atomic_fetch_add(&r->timeouts, 1); /* the deadline passed */
                else
                        atomic_fetch_add(&r->errors, 1);
                kfs_remote_conn_failed(r, c);
                errno = EIO;
                return NULL;
        }
        if (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_NIL) {
                atomic_fetch_add(&r->errors, 1); /* an error reply: NOAUTH, NOPERM (an ACL), ... */
                freeReplyObject(rep);
                errno = EACCES;
                return NULL;
        }
        return rep;
}

static void del(struct kfs_remote *r, const char *key)
{
        redisContext *c = kfs_remote_conn(r, r->timeout_ms);
        redisReply *rep = c ? redisCommand(c, "DEL %b", key, strlen(key)) : NULL;
        if (rep)
                freeReplyObject(rep);
        else if (c)
                kfs_remote_conn_failed(r, c);
}

/* The directory rel (beneath the root), opened O_PATH, made on the way where missing (owned by the asker,
 * indexed). Every directory on the way that the fetch writes into is the asker's (F1). */
static int open_dir(struct kfs *fs, const struct kfs_asker *a, const char *rel, size_t skip)
{
        int fd = ktree_open(&fs->tree, KTREE_ROOT, "", O_PATH | O_DIRECTORY, 0);
        if (fd < 0)
                return fd;
        char *copy = strdup(rel), *save = NULL;
        if (!copy) {
                close(fd);
                return -ENOMEM;
        }
        size_t depth = 0;
        for (char *c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save), depth++) {
                int n = ktree_open(&fs->tree, fd, c, O_PATH | O_DIRECTORY, 0);
                if (n == -ENOENT && depth >= skip) {
                        struct stat ps;
                        if (fstat(fd, &ps) < 0 || ps.st_uid != a->uid) {
                                n = -EACCES;
                        } else if ((n = ktree_mkdir(&fs->tree, fd, c, 0755)) == 0 || n == -EEXIST) {
                                bool made = n == 0;
                                n = ktree_open(&fs->tree, fd, c, O_PATH | O_DIRECTORY, 0);
                                struct stat st;
                                if (n >= 0 && made && fstat(n, &st) == 0) {
                                        if (a->chown)
                                                (void)fchownat(n, "", a->uid, a->gid, AT_EMPTY_PATH);
                                        kidx_add_dent(fs->idx, ps.st_ino, c, st.st_ino, KIDX_DIR);
                                        atomic_fetch_add(&fs->remote->dirs, 1);
                                }
                        }
                }
                close(fd);
                if (n < 0) {
                        free(copy);
                        return n;
                }
                fd = n;
        }
        free(copy);
        return fd;
}

/* One member, whole, under no name, linked into place if the name is free (F3). 1: written; 0: the name
 * was taken; -errno. */
static int write_member(struct kfs *fs, const struct kfs_asker *a, int dfd, const char *name, const struct krv_file *f,
                        uint64_t *made)
{
        struct stat ds;
        if (fstat(dfd, &ds) < 0)
                return -errno;
        if (ds.st_uid != a->uid)
                return -EACCES; /* F1 */
        struct stat st;
        if (ktree_stat(&fs->tree, dfd, name, &st) == 0)
                return 0; /* the node has it: never replaced */
        int fd = ktree_open(&fs->tree, dfd, ".", O_TMPFILE | O_WRONLY, 0600);
        if (fd < 0)
                return fd;
        int r = 0;
        for (uint64_t off = 0; r == 0 && off < f->size;) {
                ssize_t w = pwrite(fd, f->data + off, f->size - off, (off_t)off);
                if (w < 0 && errno != EINTR)
                        r = -errno;
                else if (w > 0)
                        off += (uint64_t)w;
        }
        if (r == 0 && a->chown && fchown(fd, a->uid, a->gid) < 0)
                r = -errno;
        if (r == 0 && fchmod(fd, f->mode & 0777) < 0)
                r = -errno;
        if (r == 0 && fstat(fd, &st) < 0)
                r = -errno;
        if (r == 0) {
                r = ktree_link(&fs->tree, fd, dfd, name);
                if (r == -EEXIST)
                        r = 0; /* the runtime stored it meanwhile: its own file stays (F3) */
                else if (r == 0) {
                        kidx_add_file(fs->idx, st.st_ino, (uint64_t)st.st_blocks * 512, a->uid, kfs_now_ns());
                        kidx_add_dent(fs->idx, ds.st_ino, name, st.st_ino, KIDX_REG);
                        *made = st.st_ino;
                        r = 1;
                }
        }
        close(fd); /* an unlinked O_TMPFILE goes with it */
        return r;
}

/* The directory part of path ("" for none), malloc'ed. */
static char *dir_part(const char *path)
{
        const char *s = strrchr(path, '/');
        return s ? strndup(path, (size_t)(s - path)) : strdup("");
}

/* Writes unit u, fetched for path, beneath the root (F1-F4). 0 if path is there afterwards. */
static int materialize(struct kfs *fs, const struct kfs_asker *a, const struct krv_unit *u, const char *path)
{
        /* F2: the marker is the last file; all of them lie beneath its directory, and path is one of them
         * or a directory on the way to one. */
        char *top = dir_part(u->files[u->n - 1].path);
        if (!top)
                return -ENOMEM;
        size_t tl = strlen(top);
        bool found = false;
        uint64_t need = 0;
        /* a unit lives in a directory of its own runtime's, never at the root, never in the metadata */
        size_t ml = strlen(KFS_META_DIR);
        bool meta = !strncmp(top, KFS_META_DIR, ml) && (top[ml] == '/' || top[ml] == '\0');
        int r = tl && !meta ? 0 : -EBADMSG;
        for (size_t i = 0; i < u->n && r == 0; i++) {
                const char *p = u->files[i].path;
                if (strncmp(p, top, tl) || p[tl] != '/')
                        r = -EBADMSG;
                size_t pl = strlen(path);
                found |= !strcmp(p, path) || (!strncmp(p, path, pl) && p[pl] == '/');
                need += (u->files[i].size + 4095) / 4096 * 4096 + 4096; /* an upper bound of its blocks */
        }
        if (r == 0 && !found)
                r = -EBADMSG;
        if (r == 0)
                r = kev_reserve(fs, need); /* F4: the limit holds, whoever writes */
        if (r < 0) {
                free(top);
                return r;
        }
        /* What this fetch wrote, to take back if a later member fails (F5: a whole entry or none). */
        struct written { int dfd; const char *name; uint64_t ino; } *w = calloc(u->n, sizeof(*w));
        size_t nw = 0;
        if (!w)
                r = -ENOMEM;
        for (size_t i = 0; i < u->n && r >= 0; i++) {
                char *d = dir_part(u->files[i].path);
                const char *base = strrchr(u->files[i].path, '/');
                base = base ? base + 1 : u->files[i].path;
                int dfd = d ? open_dir(fs, a, d, 0) : -ENOMEM;
                free(d);
                if (dfd < 0) {
                        r = dfd;
                        break;
                }
                uint64_t ino = 0;
                r = write_member(fs, a, dfd, base, &u->files[i], &ino);
                if (r == 1)
                        w[nw++] = (struct written){ dfd, base, ino };
                else
                        close(dfd);
        }
        for (size_t i = 0; i < nw; i++) {
                struct stat ds;
                if (r < 0 && fstat(w[i].dfd, &ds) == 0 && ktree_unlink_ino(&fs->tree, w[i].dfd, w[i].name, w[i].ino, 0) == 0) {
                        kidx_del_dent(fs->idx, ds.st_ino, w[i].name);
                        kidx_del_file(fs->idx, w[i].ino);
                }
                close(w[i].dfd);
        }
        free(w);
        kev_settle(fs, NULL, NULL, need);
        free(top);
        return r < 0 ? r : 0;
}

int kfs_remote_asker(struct kfs *fs, fuse_req_t req, int dfd, struct kfs_asker *a)
{
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        *a = (struct kfs_asker){ .uid = ctx->uid, .gid = ctx->gid, .chown = geteuid() == 0 };
        if (!a->chown) {
                a->uid = geteuid(); /* a mount of one user: everything in it is the daemon's */
                a->gid = getegid();
        }
        struct stat ds;
        return fstat(dfd, &ds) < 0 || ds.st_uid != a->uid ? -EACCES : 0; /* F1: the asker's directory only */
}

/* The directory path was just made from the server: the units published directly in it come along,
 * if they are few (LISTINGS, remote.h): a runtime that lists the directory instead of looking a name up
 * finds them. */
static void fetch_listing(struct kfs *fs, const struct kfs_asker *a, const struct kfs_remote_ns *ns, const char *path)
{
        struct kfs_remote *r = fs->remote;
        char *lk = kfs_remote_list_key(ns->s, kfs_remote_ns_path(ns, path));
        redisContext *c = lk ? kfs_remote_conn(r, r->timeout_ms) : NULL;
        redisReply *names = c ? redisCommand(c, "SRANDMEMBER %b %d", lk, strlen(lk), REMOTE_LIST_MAX + 1) : NULL;
        if (c && !names)
                kfs_remote_conn_failed(r, c);
        free(lk);
        if (!names || names->type != REDIS_REPLY_ARRAY || names->elements > REMOTE_LIST_MAX) {
                if (names)
                        freeReplyObject(names);
                return; /* none, or a directory of many entries: each is fetched when it is looked up */
        }
        for (size_t i = 0; i < names->elements; i++) {
                redisReply *n = names->element[i];
                char *child = NULL, *key = NULL;
                struct stat st;
                int dfd = -1;
                if (n->type != REDIS_REPLY_STRING || !ktree_name_ok(n->str) ||
                    asprintf(&child, "%s%s%s", path, *path ? "/" : "", n->str) < 0) {
                        continue;
                }
                dfd = ktree_open(&fs->tree, KTREE_ROOT, path, O_PATH | O_DIRECTORY, 0);
                bool have = dfd >= 0 && ktree_stat(&fs->tree, dfd, n->str, &st) == 0;
                if (dfd >= 0)
                        close(dfd);
                redisReply *v = have || !(key = kfs_remote_key(ns->s, kfs_remote_ns_path(ns, child)))
                                        ? NULL
                                        : kfs_remote_get(r, key, r->transfer_ms);
                if (v && v->type == REDIS_REPLY_STRING && !(v->len == 1 && v->str[0] == 'D'))
                        (void)kfs_remote_take(fs, a, ns, child, key, v); /* a member, or a unit: made whole */
                if (v)
                        freeReplyObject(v);
                free(key);
                free(child);
        }
        freeReplyObject(names);
}

int kfs_remote_take(struct kfs *fs, const struct kfs_asker *a, const struct kfs_remote_ns *ns, const char *path,
                    const char *key, redisReply *rep)
{
        struct kfs_remote *r = fs->remote;
        if (rep->len == 1 && rep->str[0] == 'D') { /* a directory on the way to a unit */
                int fd = open_dir(fs, a, path, 0);
                if (fd < 0)
                        return -ENOENT;
                close(fd);
                fetch_listing(fs, a, ns, path);
                return 0;
        }
        const char *val = rep->str;
        size_t len = rep->len;
        char *ukey = NULL;
        redisReply *unit = NULL;
        int ret = -ENOENT;
        if (rep->len > 1 && rep->str[0] == 'M') { /* a member: the unit is at its marker's key */
                char *m = strndup(rep->str + 1, rep->len - 1);
                ukey = m && krv_path_ok(m, strlen(m)) ? kfs_remote_key(ns->s, m) : NULL;
                free(m);
                unit = ukey ? kfs_remote_get(r, ukey, r->transfer_ms) : NULL;
                if (!unit || unit->type != REDIS_REPLY_STRING) {
                        if (unit && unit->type == REDIS_REPLY_NIL) {
                                atomic_fetch_add(&r->misses, 1); /* the server evicted the unit */
                                kfs_remote_remember(r, kfs_remote_hash(0, key));
                        }
                        goto out;
                }
                val = unit->str;
                len = unit->len;
        }
        struct krv_unit u;
        int d = krv_decode((const unsigned char *)val, len, &u);
        /* F1: in a user's namespace, only that user's units; a publisher's namespace holds whoever's files
         * the publisher's mount stored, and is trusted as a whole (its ACL user alone writes it). */
        if (d == 0 && ((ns->s[0] == 'u' && u.uid != a->uid) || !kfs_remote_shareable(u.rt))) {
                krv_free(&u);
                d = -EBADMSG;
        }
        for (size_t i = 0; d == 0 && ns->home[0] && i < u.n; i++) { /* a publisher's: into the asker's home */
                char *p;
                if (asprintf(&p, "%s%s", ns->home, u.files[i].path) < 0) {
                        krv_free(&u);
                        d = -ENOMEM;
                        break;
                }
                free(u.files[i].path);
                u.files[i].path = p;
        }
        if (d == -ENOMEM)
                goto out;
        if (d < 0) {
                atomic_fetch_add(&r->corrupt, 1);
                if (!ns->trusted)
                        del(r, ukey ? ukey : key); /* a value that does not check is nobody's: gone */
                goto out;
        }
        atomic_fetch_add(&r->bytes_in, len);
        int m = materialize(fs, a, &u, path);
        krv_free(&u);
        if (m == 0) {
                atomic_fetch_add(&r->hits, 1);
                if (ns->trusted)
                        atomic_fetch_add(&r->trusted_hits, 1);
                ret = 0;
        } else {
                atomic_fetch_add(&r->errors, 1);
        }
out:
        if (unit)
                freeReplyObject(unit);
        free(ukey);
        return ret;
}

int kfs_remote_fetch(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, int dfd, const char *name)
{
        struct kfs_remote *r = fs->remote;
        struct kfs_asker a;
        bool asks = r && !krt_is_kept_name(name) && !krt_is_lock_name(name) && kfs_remote_asker(fs, req, dfd, &a) == 0;
        char *path = asks ? kfs_remote_relpath(fs, dfd, name) : NULL;
        /* Given back now, before the request may be parked (herd.c): once parked, it may be answered, and dir
         * forgotten and freed, before this worker returns. */
        kfs_inode_fd_put(fs, dir, dfd);
        if (!path)
                return -ENOENT;
        if (krt_is_temporary(path)) {
                free(path);
                return -ENOENT;
        }
        /* The asker's own namespace, then each trusted publisher's in order (TRUST), each one's misses
         * remembered on their own. Only a miss in the asker's own, asked now, may join the herd there. */
        struct kfs_remote_ns ns;
        kfs_remote_own_ns(r, a.uid, path, &ns);
        char own_ns[sizeof(ns.s)];
        memcpy(own_ns, ns.s, sizeof(own_ns));
        int ret = -ENOENT;
        bool asked = false, found = false;
        char *own_key = NULL; /* the own namespace's key, when it missed now */
        for (unsigned i = 0; i <= r->ntrusted && ret == -ENOENT; i++) {
                if (i > 0) {
                        memcpy(ns.s, r->trusted[i - 1], sizeof(ns.s));
                        ns.trusted = true;
                        kfs_remote_ns_home(&ns, a.uid, path);
                        if (!strcmp(ns.s, own_ns))
                                continue; /* the publisher, trusting its own namespace: asked first */
                }
                char *key = kfs_remote_key(ns.s, kfs_remote_ns_path(&ns, path));
                if (!key)
                        break;
                if (kfs_remote_remembered(r, kfs_remote_hash(0, key))) {
                        free(key);
                        continue;
                }
                asked = true;
                redisReply *rep = kfs_remote_get(r, key, r->timeout_ms);
                if (!rep && errno == EACCES) {
                        /* refused there (an ACL: on a publishing node, a user's own namespace is not the
                         * publisher's credentials' to read): counted, remembered, and the next is asked */
                        kfs_remote_remember(r, kfs_remote_hash(0, key));
                } else if (!rep) { /* down or slow: a miss remembered by neither us nor the kernel (it may be back) */
                        ret = KFS_REMOTE_UNSURE;
                } else if (rep->type == REDIS_REPLY_NIL) {
                        if (i == 0) {
                                own_key = key; /* remembered below, unless the herd takes it */
                                key = NULL;
                        } else {
                                kfs_remote_remember(r, kfs_remote_hash(0, key));
                        }
                } else {
                        found = true; /* a hit, or a value that failed (counted as such, not as a miss) */
                        ret = kfs_remote_take(fs, &a, &ns, path, key, rep);
                        if (ret < 0 && ns.trusted) /* not deleted there (read only): not fetched again soon */
                                kfs_remote_remember(r, kfs_remote_hash(0, key));
                }
                if (rep)
                        freeReplyObject(rep);
                free(key);
        }
        if (!asked)
                atomic_fetch_add(&r->remembered, 1);
        else if (ret == -ENOENT && !found)
                atomic_fetch_add(&r->misses, 1);
        if (own_key && ret == -ENOENT && !found && r->herd_ms && krt_is_output_name(name)) {
                ret = kfs_remote_herd(fs, req, dir, &a, path, own_key); /* (herd.c) */
                if (ret == KFS_REMOTE_PARKED)
                        path = own_key = NULL; /* the herd's now */
                else if (ret != -ENOENT)
                        free(own_key), own_key = NULL; /* compiled here (or fetched): not a miss to remember */
        }
        if (own_key)
                kfs_remote_remember(r, kfs_remote_hash(0, own_key));
        free(own_key);
        free(path);
        return ret;
}
