/* conn.c: where the server is, and one connection to it per thread that asks (remote.h, THE SERVER
 * DOWN). A connection is made on first use: connected within the probe deadline, authenticated, on its
 * database. Any failure drops it and holds every thread off the server for REMOTE_BACKOFF_MS, so that a
 * dead or stalled server costs one deadline per back-off, not one per lookup. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal.h"

static int fail(const char *what, const char *detail)
{
        fprintf(stderr, "kcachefs: remote: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
        return -EINVAL;
}

/* "PASSWORD" or "USER PASSWORD", on the file's first line; the file must be the daemon user's and
 * readable by nobody else (it is a secret, and a shared node has other users). */
static int read_auth(struct kfs_remote *r, const char *file)
{
        int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return fail("remote_auth: cannot open", strerror(errno));
        struct stat st;
        char buf[1024];
        ssize_t n = fstat(fd, &st) == 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
        close(fd);
        if (n < 0)
                return fail("remote_auth: cannot read", file);
        if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || st.st_uid != geteuid())
                return fail("remote_auth: the file must be a regular file of the daemon's user, mode 0600 or "
                            "stricter", file);
        buf[n] = '\0';
        buf[strcspn(buf, "\r\n")] = '\0';
        char *sp = strchr(buf, ' ');
        if (sp) {
                *sp = '\0';
                r->user = strdup(buf);
                r->password = strdup(sp + 1);
        } else {
                r->password = strdup(buf);
        }
        explicit_bzero(buf, sizeof(buf));
        if (!r->password || !*r->password || (sp && (!r->user || !*r->user)))
                return fail("remote_auth: no password on the file's first line", file);
        return 0;
}

int kfs_remote_parse(struct kfs_remote *r, const char *url, const char *auth_file)
{
        if (!strncmp(url, "unix:", 5)) {
                const char *p = url + 5;
                if (!strncmp(p, "//", 2))
                        p += 2;
                if (*p != '/')
                        return fail("unix: needs an absolute socket path", url);
                r->unix_path = strdup(p);
        } else if (!strncmp(url, "redis://", 8)) {
                const char *h = url + 8, *end;
                r->port = 6379;
                if (*h == '[') { /* [IPv6]:port */
                        end = strchr(h, ']');
                        if (!end)
                                return fail("an unclosed '[' in", url);
                        r->host = strndup(h + 1, (size_t)(end - h - 1));
                        end++;
                } else {
                        end = h + strcspn(h, ":/");
                        r->host = strndup(h, (size_t)(end - h));
                }
                if (!r->host || !*r->host)
                        return fail("no host in", url);
                if (*end == ':') {
                        char *e;
                        long port = strtol(end + 1, &e, 10);
                        if (e == end + 1 || port < 1 || port > 65535)
                                return fail("the port must be 1 to 65535 in", url);
                        r->port = (int)port;
                        end = e;
                }
                if (*end == '/' && end[1]) {
                        char *e;
                        long db = strtol(end + 1, &e, 10);
                        if (e == end + 1 || *e || db < 0 || db > 1000000)
                                return fail("the database must be a number in", url);
                        r->db = (int)db;
                        end = e;
                } else if (*end == '/') {
                        end++;
                }
                if (*end)
                        return fail("trailing characters in", url);
        } else {
                return fail("remote= takes redis://HOST[:PORT][/DB] or unix:/PATH, not", url);
        }
        if (auth_file && read_auth(r, auth_file) < 0)
                return -EINVAL;
        char w[512];
        if (r->unix_path)
                snprintf(w, sizeof(w), "unix:%s", r->unix_path);
        else
                snprintf(w, sizeof(w), strchr(r->host, ':') ? "redis://[%s]:%d/%d" : "redis://%s:%d/%d", r->host,
                         r->port, r->db);
        r->where = strdup(w);
        return r->where ? 0 : -ENOMEM;
}

struct remote_conn {
        redisContext *c;
};

static void conn_gone(void *p)
{
        struct remote_conn *rc = p;
        if (rc->c)
                redisFree(rc->c);
        free(rc);
}

void kfs_remote_conn_init(struct kfs_remote *r)
{
        (void)pthread_key_create(&r->conn_key, conn_gone);
}

void kfs_remote_conn_free(struct kfs_remote *r)
{
        /* this thread's; the others' went with their threads, or go with the process */
        struct remote_conn *rc = pthread_getspecific(r->conn_key);
        if (rc) {
                pthread_setspecific(r->conn_key, NULL);
                conn_gone(rc);
        }
        pthread_key_delete(r->conn_key);
}

static struct timeval tv_of(unsigned ms)
{
        return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
}

static bool ok_reply(redisReply *rep)
{
        bool ok = rep && rep->type != REDIS_REPLY_ERROR;
        if (rep)
                freeReplyObject(rep);
        return ok;
}

/* A failure said to the operator (syslog, the journal or the log file: fs/log.c), at most once a minute
 * while the server stays away, and once when it answers again. */
static void say_down(struct kfs_remote *r, const char *why)
{
        int64_t now = kfs_mono_ns(), last = atomic_load(&r->said_ns);
        bool was = atomic_exchange(&r->said_down, true);
        if (!was || now - last > 60 * (int64_t)1000000000) {
                atomic_store(&r->said_ns, now);
                kfs_log(LOG_WARNING, "kcachefs: remote %s: %s: lookups miss the shared tier until it answers", r->where,
                        why && *why ? why : "no answer");
        }
}

static void say_up(struct kfs_remote *r)
{
        if (atomic_exchange(&r->said_down, false))
                kfs_log(LOG_NOTICE, "kcachefs: remote %s answers again", r->where);
}

void kfs_remote_conn_failed(struct kfs_remote *r, redisContext *c)
{
        say_down(r, c ? c->errstr : NULL);
        struct remote_conn *rc = pthread_getspecific(r->conn_key);
        if (rc && rc->c == c) {
                redisFree(c);
                rc->c = NULL;
        }
        atomic_store(&r->down_until_ns, kfs_mono_ns() + (int64_t)REMOTE_BACKOFF_MS * 1000000);
}

redisContext *kfs_remote_conn(struct kfs_remote *r, unsigned timeout_ms)
{
        struct remote_conn *rc = pthread_getspecific(r->conn_key);
        if (!rc) {
                rc = calloc(1, sizeof(*rc));
                if (!rc || pthread_setspecific(r->conn_key, rc) != 0) {
                        free(rc);
                        return NULL;
                }
        }
        if (rc->c) {
                (void)redisSetTimeout(rc->c, tv_of(timeout_ms));
                return rc->c;
        }
        if (kfs_mono_ns() < atomic_load(&r->down_until_ns))
                return NULL; /* in back-off: a miss at once */
        struct timeval tv = tv_of(r->timeout_ms);
        redisContext *c = r->unix_path ? redisConnectUnixWithTimeout(r->unix_path, tv)
                                       : redisConnectWithTimeout(r->host, r->port, tv);
        if (!c || c->err) {
                say_down(r, c ? c->errstr : "out of memory");
                if (c)
                        redisFree(c);
                atomic_fetch_add(&r->errors, 1);
                atomic_store(&r->down_until_ns, kfs_mono_ns() + (int64_t)REMOTE_BACKOFF_MS * 1000000);
                return NULL;
        }
        (void)redisSetTimeout(c, tv);
        bool ok = true;
        if (r->password)
                ok = ok_reply(r->user ? redisCommand(c, "AUTH %s %s", r->user, r->password)
                                      : redisCommand(c, "AUTH %s", r->password));
        if (ok && r->db)
                ok = ok_reply(redisCommand(c, "SELECT %d", r->db));
        if (!ok) {
                say_down(r, "AUTH or SELECT refused (remote_auth=, the database number, or the server's ACL)");
                redisFree(c);
                atomic_fetch_add(&r->errors, 1);
                atomic_store(&r->down_until_ns, kfs_mono_ns() + (int64_t)REMOTE_BACKOFF_MS * 1000000);
                return NULL;
        }
        (void)redisSetTimeout(c, tv_of(timeout_ms));
        rc->c = c;
        say_up(r);
        return c;
}

uint64_t kfs_remote_hash(uint32_t uid, const char *path)
{
        uint64_t h = XXH64(path, strlen(path), uid);
        return h ? h : 1; /* kmap reserves 0 */
}

void kfs_remote_ns_home(struct kfs_remote_ns *ns, uid_t uid, const char *path)
{
        ns->home[0] = '\0';
        if (ns->s[0] != 'p')
                return;
        char h[sizeof(ns->home)];
        int l = snprintf(h, sizeof(h), KFS_USERS_DIR "/%u/", (unsigned)uid);
        if (l > 0 && (size_t)l < sizeof(h) && !strncmp(path, h, (size_t)l) && path[l])
                memcpy(ns->home, h, (size_t)l + 1);
}

void kfs_remote_own_ns(const struct kfs_remote *r, uid_t uid, const char *path, struct kfs_remote_ns *ns)
{
        if (r->publish[0] && uid == r->publisher) /* TRUST: the publisher's units alone */
                memcpy(ns->s, r->publish, sizeof(ns->s));
        else
                snprintf(ns->s, sizeof(ns->s), "u%u", (unsigned)uid);
        ns->trusted = false;
        kfs_remote_ns_home(ns, uid, path);
}

char *kfs_remote_key(const char *ns, const char *path)
{
        char *k;
        return asprintf(&k, REMOTE_KEY_PREFIX "%s:%s", ns, path) < 0 ? NULL : k;
}

char *kfs_remote_list_key(const char *ns, const char *dir)
{
        char *k;
        return asprintf(&k, "kcfsl:1:%s:%s", ns, dir) < 0 ? NULL : k;
}

char *kfs_remote_relpath(struct kfs *fs, int dfd, const char *name)
{
        char proc[64], buf[PATH_MAX];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dfd);
        ssize_t n = readlink(proc, buf, sizeof(buf) - 1);
        if (n <= 0)
                return NULL;
        buf[n] = '\0';
        size_t bl = strlen(fs->o.backing);
        if (strncmp(buf, fs->o.backing, bl) || (buf[bl] != '/' && buf[bl] != '\0'))
                return NULL; /* removed ("... (deleted)" is still under it, but then the next check fails) */
        const char *rel = buf[bl] == '/' ? buf + bl + 1 : "";
        if (!strcmp(rel, KFS_META_DIR) || !strncmp(rel, KFS_META_DIR "/", strlen(KFS_META_DIR) + 1) ||
            strstr(rel, " (deleted)"))
                return NULL;
        char *p;
        if (name)
                return asprintf(&p, "%s%s%s", rel, *rel ? "/" : "", name) < 0 ? NULL : p;
        return strdup(rel);
}

bool kfs_remote_shareable(int rt)
{
        switch (rt) {
        case KRT_NEO: case KRT_SYCL: case KRT_POCL: case KRT_TRITON: case KRT_JAX: case KRT_KCACHE:
        case KRT_NUMBA: case KRT_PYOPENCL: case KRT_INDUCTOR: case KRT_CUPY:
                return true;
        default: /* CUDA's and Mesa's caches hang off an index they rewrite; ccache has a remote of its own;
                    a torch extension is built for its machine; a file of no known runtime may be anything */
                return false;
        }
}
