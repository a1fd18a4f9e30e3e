/* touch.c: the units in use on this node, told to the server (remote.h, TOUCHES), so that its LRU sees
 * what every node's local tier hides. The open path only adds an inode number to a set; the publisher
 * thread, every remote_touch_s, turns the numbers into their units' keys (through the index's names, as
 * the tree has them now) and sends one TOUCH per batch. A unit the server does not have is not sent: TOUCH
 * of a missing key does nothing. A unit's key is touched in the owner's namespace and in each trusted
 * publisher's (remote_trusted=), where it may have come from: never a write there. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../evict/evict.h"
#include "internal.h"

#define TOUCH_BATCH 128

void kfs_remote_touch(struct kfs *fs, uint64_t bino)
{
        struct kfs_remote *r = fs->remote;
        if (!r)
                return;
        pthread_mutex_lock(&r->touch_lock);
        if (r->touched.count < 1000000)
                (void)kmap_put(&r->touched, bino, (void *)1);
        pthread_mutex_unlock(&r->touch_lock);
}

struct first_name {
        uint64_t dir;
        char *name;
};

static void take_first(void *ud, uint64_t dir, const char *name)
{
        struct first_name *f = ud;
        if (!f->name) {
                f->dir = dir;
                f->name = strdup(name);
        }
}

/* The path of the unit that the file bino belongs to (its marker's) and the uid owning it, or NULL. */
static char *unit_of(struct kfs *fs, uint64_t bino, uid_t *uid)
{
        struct first_name f = { 0, NULL };
        if (kidx_names(fs->idx, bino, take_first, &f) <= 0 || !f.name)
                return free(f.name), NULL;
        char dir[PATH_MAX], *path = NULL, *key = NULL;
        if (kidx_dir_path(fs->idx, f.dir, dir, sizeof(dir)) == 0 &&
            asprintf(&path, "%s%s%s", dir, *dir ? "/" : "", f.name) < 0)
                path = NULL;
        free(f.name);
        struct kev_unit u;
        if (path && kev_unit_resolve(fs, path, &u) == 0) {
                struct stat st;
                if (kfs_remote_shareable(kfs_remote_unit_rt(&u)) && u.n && ktree_stat(&fs->tree, KTREE_ROOT, u.members[0], &st) == 0)
                        if ((key = strdup(u.members[0])))
                                *uid = st.st_uid;
                kev_unit_free(&u);
        }
        free(path);
        return key;
}

static void send_batch(struct kfs_remote *r, char **keys, size_t n)
{
        if (!n)
                return;
        redisContext *c = kfs_remote_conn(r, r->timeout_ms * 10);
        if (!c)
                return;
        const char **argv = malloc((n + 1) * sizeof(*argv));
        size_t *lens = malloc((n + 1) * sizeof(*lens));
        if (argv && lens) {
                argv[0] = "TOUCH";
                lens[0] = 5;
                for (size_t i = 0; i < n; i++) {
                        argv[i + 1] = keys[i];
                        lens[i + 1] = strlen(keys[i]);
                }
                redisReply *rep = redisCommandArgv(c, (int)n + 1, argv, lens);
                if (!rep)
                        kfs_remote_conn_failed(r, c);
                else if (rep->type == REDIS_REPLY_INTEGER)
                        atomic_fetch_add(&r->touches, (uint64_t)rep->integer);
                if (rep)
                        freeReplyObject(rep);
        }
        free(argv);
        free(lens);
}

/* The figure NAME in an INFO reply, or 0. */
static uint64_t info_field(const char *info, const char *name)
{
        size_t l = strlen(name);
        for (const char *p = info; (p = strstr(p, name)); p += l)
                if ((p == info || p[-1] == '\n') && p[l] == ':')
                        return strtoull(p + l + 1, NULL, 10);
        return 0;
}

/* The server's memory and evictions, for kcache stats and kcache remote (an ACL user without INFO: left
 * unknown). */
static void read_server(struct kfs_remote *r)
{
        redisContext *c = kfs_remote_conn(r, r->timeout_ms * 10);
        redisReply *rep = c ? redisCommand(c, "INFO") : NULL;
        if (c && !rep)
                kfs_remote_conn_failed(r, c);
        if (rep && rep->type == REDIS_REPLY_STRING) {
                atomic_store(&r->server_used, info_field(rep->str, "used_memory"));
                atomic_store(&r->server_max, info_field(rep->str, "maxmemory"));
                atomic_store(&r->server_evicted, info_field(rep->str, "evicted_keys"));
                const char *db = strstr(rep->str, "\ndb0:keys=");
                atomic_store(&r->server_keys, db ? strtoull(db + 10, NULL, 10) : 0);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                atomic_store(&r->server_seen_ns, (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec);
        }
        if (rep)
                freeReplyObject(rep);
}

int64_t kfs_remote_touch_due(struct kfs *fs, int64_t now)
{
        struct kfs_remote *r = fs->remote;
        int64_t period = (int64_t)(r->touch_s * 1e9);
        if (r->touched_ns == 0)
                r->touched_ns = now;
        if (now - r->touched_ns < period)
                return r->touched_ns + period;
        r->touched_ns = now;
        read_server(r);
        pthread_mutex_lock(&r->touch_lock);
        kmap set = r->touched;
        kmap_init(&r->touched);
        pthread_mutex_unlock(&r->touch_lock);
        if (set.count) {
                (void)kidx_flush(fs->idx); /* the names of files made since the last flush */
                kmap seen;
                kmap_init(&seen);
                char *batch[TOUCH_BATCH];
                size_t n = 0, pos = 0;
                uint64_t ino;
                void *v;
                while (kmap_next(&set, &pos, &ino, &v)) {
                        uid_t uid = 0;
                        char *path = unit_of(fs, ino, &uid);
                        if (!path)
                                continue;
                        struct kfs_remote_ns ns;
                        kfs_remote_own_ns(r, uid, path, &ns);
                        char *key = kfs_remote_key(ns.s, kfs_remote_ns_path(&ns, path));
                        uint64_t h = key ? kfs_remote_hash(0, key) : 0; /* each unit once, whichever members were opened */
                        if (!key || kmap_get(&seen, h) || kmap_put(&seen, h, (void *)1) < 0) {
                                free(key);
                                free(path);
                                continue;
                        }
                        /* The unit may have come from a trusted publisher's namespace (its files here are the
                         * asker's, and say nothing of where they came from): the same path there is touched
                         * too. TOUCH is a read to the server's ACLs (%R~ lets it), and a key that is not
                         * there is no cost. */
                        if (n + 1 + r->ntrusted > TOUCH_BATCH) {
                                send_batch(r, batch, n);
                                while (n)
                                        free(batch[--n]);
                        }
                        batch[n++] = key;
                        for (unsigned i = 0; i < r->ntrusted; i++) {
                                struct kfs_remote_ns t = { .trusted = true };
                                memcpy(t.s, r->trusted[i], sizeof(t.s));
                                kfs_remote_ns_home(&t, uid, path);
                                if (strcmp(t.s, ns.s) && (key = kfs_remote_key(t.s, kfs_remote_ns_path(&t, path))))
                                        batch[n++] = key;
                        }
                        free(path);
                }
                send_batch(r, batch, n);
                while (n)
                        free(batch[--n]);
                kmap_free(&seen);
        }
        kmap_free(&set);
        return now + period;
}
