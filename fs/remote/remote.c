/* remote.c: the shared tier's state (internal.h): made from the options, started after the mount,
 * stopped before the index closes; its counters, for kcache stats. */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

int kfs_remote_names(const char *list, char *out, size_t each, int max)
{
        int n = 0;
        for (const char *p = list;; p++) {
                size_t l = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_-");
                if (l < 1 || l > REMOTE_NAME_MAX || (p[l] != ':' && p[l] != '\0') || n == max)
                        return -EINVAL;
                if (out)
                        snprintf(out + (size_t)n * each, each, "p:%.*s", (int)l, p);
                n++;
                p += l;
                if (!*p)
                        return n;
        }
}

int kfs_remote_publisher_uid(const char *s, uid_t *uid)
{
        if (kfs_users_uid(s, uid))
                return 0;
        struct passwd pw, *res = NULL;
        char buf[4096];
        if (getpwnam_r(s, &pw, buf, sizeof(buf), &res) != 0 || !res)
                return -EINVAL;
        *uid = res->pw_uid;
        return 0;
}

int kfs_remote_init(struct kfs *fs)
{
        if (!fs->o.remote_url)
                return 0;
        struct kfs_remote *r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->timeout_ms = fs->o.remote_timeout_ms;
        /* a unit is sent whole: up to 256 MiB at a gigabit takes seconds, so its deadline is the probe's
         * times a thousand, at least 2 s */
        r->transfer_ms = r->timeout_ms * 1000 > 2000 ? r->timeout_ms * 1000 : 2000;
        r->negative_s = fs->o.remote_negative_s;
        if (gethostname(r->node, sizeof(r->node) - 1) < 0)
                snprintf(r->node, sizeof(r->node), "unknown");
        /* checked by kfs_opts_check already; a library caller gets -EINVAL here */
        int nt = fs->o.remote_trusted ? kfs_remote_names(fs->o.remote_trusted, r->trusted[0], REMOTE_NS_MAX,
                                                         REMOTE_TRUSTED_MAX) : 0;
        if ((fs->o.remote_publish && kfs_remote_names(fs->o.remote_publish, r->publish, REMOTE_NS_MAX, 1) != 1) ||
            nt < 0) {
                free(r);
                return -EINVAL;
        }
        r->ntrusted = (unsigned)nt;
        r->publisher = getuid(); /* the mounter, as fs->owner will be */
        if (fs->o.remote_publisher && kfs_remote_publisher_uid(fs->o.remote_publisher, &r->publisher) < 0) {
                free(r);
                return -EINVAL;
        }
        int e = kfs_remote_parse(r, fs->o.remote_url, fs->o.remote_auth);
        if (e < 0) {
                fs->remote = r;
                kfs_remote_free(fs);
                return e;
        }
        pthread_mutex_init(&r->neg_lock, NULL);
        pthread_mutex_init(&r->memo_lock, NULL);
        pthread_mutex_init(&r->touch_lock, NULL);
        pthread_mutex_init(&r->herd.lock, NULL);
        pthread_cond_init(&r->herd.cond, NULL);
        kmap_init(&r->herd.mine);
        kmap_init(&r->herd.invites);
        kmap_init(&r->herd.interrupted);
        r->herd.mine_next = r->herd.invites_next = 1024;
        r->herd_ms = (unsigned)(fs->o.herd_wait * 1000);
        kmap_init(&r->touched);
        r->touch_s = fs->o.remote_touch_s;
        pthread_mutex_init(&r->pub.lock, NULL);
        pthread_cond_init(&r->pub.cond, NULL);
        kmap_init(&r->neg);
        kmap_init(&r->memo);
        kmap_init(&r->pub.due);
        kfs_remote_conn_init(r);
        fs->remote = r;
        return 0;
}

void kfs_remote_start(struct kfs *fs)
{
        if (fs->remote)
                kfs_remote_pub_start(fs);
}

void kfs_remote_stop(struct kfs *fs)
{
        if (fs->remote) {
                kfs_remote_herd_stop(fs); /* first: its answers go through the session */
                kfs_remote_pub_stop(fs);
        }
}

void kfs_remote_free(struct kfs *fs)
{
        struct kfs_remote *r = fs->remote;
        if (!r)
                return;
        if (r->where) { /* made whole by init */
                kfs_remote_conn_free(r);
                kmap_free(&r->neg);
                kmap_free(&r->memo);
                kmap_free(&r->touched);
                pthread_mutex_destroy(&r->touch_lock);
                pthread_mutex_destroy(&r->herd.lock);
                pthread_cond_destroy(&r->herd.cond);
                pthread_mutex_destroy(&r->neg_lock);
                pthread_mutex_destroy(&r->memo_lock);
                pthread_mutex_destroy(&r->pub.lock);
                pthread_cond_destroy(&r->pub.cond);
        }
        free(r->where);
        free(r->host);
        free(r->unix_path);
        free(r->user);
        if (r->password)
                explicit_bzero(r->password, strlen(r->password));
        free(r->password);
        free(r);
        fs->remote = NULL;
}

void kfs_remote_counts(struct kfs *fs, struct kfs_remote_counts *c)
{
        memset(c, 0, sizeof(*c));
        struct kfs_remote *r = fs->remote;
        if (!r)
                return;
        c->hits = atomic_load(&r->hits);
        c->misses = atomic_load(&r->misses);
        c->remembered = atomic_load(&r->remembered);
        c->timeouts = atomic_load(&r->timeouts);
        c->errors = atomic_load(&r->errors);
        c->corrupt = atomic_load(&r->corrupt);
        c->dirs = atomic_load(&r->dirs);
        c->publishes = atomic_load(&r->publishes);
        c->published_before = atomic_load(&r->published_before);
        c->touches = atomic_load(&r->touches);
        c->herd_waits = atomic_load(&r->herd_waits);
        c->herd_served = atomic_load(&r->herd_served);
        c->herd_gave_up = atomic_load(&r->herd_gave_up);
        c->trusted_hits = atomic_load(&r->trusted_hits);
        c->server_used = atomic_load(&r->server_used);
        c->server_max = atomic_load(&r->server_max);
        c->server_evicted = atomic_load(&r->server_evicted);
        c->server_keys = atomic_load(&r->server_keys);
        c->server_seen_ns = atomic_load(&r->server_seen_ns);
        c->bytes_in = atomic_load(&r->bytes_in);
        c->bytes_out = atomic_load(&r->bytes_out);
}

void kfs_remote_zero(struct kfs *fs)
{
        struct kfs_remote *r = fs->remote;
        if (!r)
                return;
        _Atomic uint64_t *const all[] = { &r->hits, &r->misses, &r->remembered, &r->timeouts, &r->errors, &r->corrupt,
                                          &r->dirs, &r->publishes, &r->published_before, &r->touches, &r->bytes_in,
                                          &r->bytes_out, &r->herd_waits, &r->herd_served, &r->herd_gave_up,
                                          &r->trusted_hits };
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                atomic_store(all[i], 0);
}

int kfs_remote_namespaces(const struct kfs *fs, uid_t uid, char *buf, size_t size)
{
        const struct kfs_remote *r = fs->remote;
        if (!r)
                return -ENODATA;
        struct kfs_remote_ns ns;
        kfs_remote_own_ns(r, geteuid() == 0 ? uid : geteuid(), "", &ns); /* as kfs_remote_asker */
        int n = snprintf(buf, size, REMOTE_KEY_PREFIX "%s:", ns.s);
        for (unsigned i = 0; n >= 0 && i < r->ntrusted; i++) {
                if (!strcmp(r->trusted[i], ns.s))
                        continue; /* the publisher, trusting its own namespace: asked first */
                size_t at = (size_t)n < size ? (size_t)n : size;
                n += snprintf(buf + at, size - at, " " REMOTE_KEY_PREFIX "%s:", r->trusted[i]);
        }
        return n;
}

const char *kfs_remote_where(const struct kfs *fs)
{
        return fs->remote ? fs->remote->where : NULL;
}
