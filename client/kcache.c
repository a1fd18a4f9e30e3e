/* The handle and the generic blob API: kcache_open/close/get/put, trust, counters, error strings. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kcache-int.h"

static long env_long(const char *name, long def)
{
        const char *v = getenv(name);
        if (!v || !*v)
                return def;
        char *end;
        long n = strtol(v, &end, 10);
        return *end || n < 0 ? def : n;
}

/* mkdir -p of an absolute or relative path. */
static int mkdir_p(const char *path)
{
        char p[PATH_MAX];
        if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p))
                return -ENAMETOOLONG;
        for (char *s = p + 1;; s++) {
                if (*s == '/' || !*s) {
                        char c = *s;
                        *s = '\0';
                        if (mkdir(p, 0777) < 0 && errno != EEXIST)
                                return -errno;
                        *s = c;
                        if (!c)
                                return 0;
                }
        }
}

static char *default_dir(void)
{
        const char *d = getenv("KCACHE_DIR");
        if (d && *d)
                return strdup(d);
        char buf[PATH_MAX];
        const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (x && *x == '/')
                snprintf(buf, sizeof(buf), "%s/kcache", x);
        else if (home && *home)
                snprintf(buf, sizeof(buf), "%s/.cache/kcache", home);
        else
                return NULL;
        return strdup(buf);
}

static void parse_trusted(kcache *kc)
{
        const char *v = getenv("KCACHE_TRUST_UIDS");
        while (v && *v) {
                char *end;
                unsigned long u = strtoul(v, &end, 10);
                if (end == v)
                        break;
                kcache_trust_uid(kc, (uid_t)u);
                v = *end == ',' ? end + 1 : end;
        }
}

static void open_trace(kcache *kc)
{
        const char *t = getenv("KCACHE_TRACE");
        if (!t || !*t || !strcmp(t, "0"))
                return;
        if (!strcmp(t, "1") || !strcmp(t, "stderr")) {
                kc->trace = stderr;
                return;
        }
        kc->trace = fopen(t, "ae");
        kc->trace_owned = kc->trace != NULL;
        if (!kc->trace)
                fprintf(stderr, "kcache: cannot open KCACHE_TRACE=%s: %s\n", t, strerror(errno));
}

KCACHE__EXPORT int kcache_open(const char *dir, kcache **ret)
{
        if (!ret)
                return -EINVAL;
        char *d = dir ? strdup(dir) : default_dir();
        if (!d)
                return dir ? -ENOMEM : -EINVAL;
        int r = mkdir_p(d);
        if (r < 0 && r != -EEXIST)
                goto fail;
        kcache *kc = calloc(1, sizeof(*kc));
        if (!kc) {
                r = -ENOMEM;
                goto fail;
        }
        kc->dirfd = open(d, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (kc->dirfd < 0) {
                r = -errno;
                free(kc);
                goto fail;
        }
        kc->dir = realpath(d, NULL);
        free(d);
        if (!kc->dir) {
                close(kc->dirfd);
                free(kc);
                return -ENOMEM;
        }
        pthread_mutex_init(&kc->lock, NULL);
        pthread_mutex_init(&kc->trace_lock, NULL);
        kc->lock_timeout_ms = env_long("KCACHE_LOCK_TIMEOUT_MS", 120000);
        kc->mem_capacity = (size_t)env_long("KCACHE_MEM_PROGRAMS", 256);
        kc->disabled = env_long("KCACHE_DISABLE", 0) > 0;
        open_trace(kc);
        parse_trusted(kc);
        kcache__trace(kc, "open %s%s", kc->dir, kc->disabled ? " (disabled by KCACHE_DISABLE)" : "");
        *ret = kc;
        return 0;
fail:
        free(d);
        return r;
}

KCACHE__EXPORT void kcache_close(kcache *kc)
{
        if (!kc)
                return;
        if (kc->cl_close)
                kc->cl_close(kc); /* stores grown binaries, then drops the programs */
        kcache__flight_forget(kc, NULL);
        if (kc->ze_close)
                kc->ze_close(kc);
        struct kcache_stats s;
        kcache_get_stats(kc, &s);
        kcache__trace(kc, "close: %llu hits, %llu misses, %llu rejects, %llu compiles, %llu stores",
                      (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.rejects,
                      (unsigned long long)s.compiles, (unsigned long long)s.stores);
        if (kc->trace_owned)
                fclose(kc->trace);
        close(kc->dirfd);
        pthread_mutex_destroy(&kc->lock);
        pthread_mutex_destroy(&kc->trace_lock);
        free(kc->trusted);
        free(kc->dir);
        free(kc);
}

/* The key record of a blob: its API and the caller's bytes. */
static int blob_key(const void *key, size_t keylen, struct kcache__key *k, char *relpath, size_t size)
{
        kcache__key_init(k);
        kcache__key_add_str(k, KCACHE__T_API, "blob");
        kcache__key_add_str(k, KCACHE__T_KIND, "user");
        kcache__key_add(k, KCACHE__T_INPUT, key, keylen);
        int r = kcache__key_finish(k);
        if (r < 0) {
                kcache__key_free(k);
                return r;
        }
        kcache__entry_path("blob", k, relpath, size);
        return 0;
}

KCACHE__EXPORT int kcache_get(kcache *kc, const void *key, size_t keylen, void **ret_data, size_t *ret_len)
{
        if (!kc || !key || !keylen || !ret_data || !ret_len)
                return -EINVAL;
        if (keylen > KCACHE__MAX_PART)
                return -ENOENT;
        struct kcache__key k;
        char rel[128];
        int r = blob_key(key, keylen, &k, rel, sizeof(rel));
        if (r < 0)
                return r;
        if (KCACHE__TRACING(kc))
                kcache__trace_key(kc, rel, &k);
        void *data;
        size_t len;
        r = kcache__entry_load(kc, rel, &k, &data, &len);
        kcache__key_free(&k);
        if (r < 0) {
                atomic_fetch_add(&kc->st.misses, 1);
                return r;
        }
        *ret_data = data;
        *ret_len = len;
        atomic_fetch_add(&kc->st.hits, 1);
        return 0;
}

KCACHE__EXPORT int kcache_put(kcache *kc, const void *key, size_t keylen, const void *data, size_t len)
{
        if (!kc || !key || !keylen || (!data && len))
                return -EINVAL;
        if (keylen > KCACHE__MAX_PART || len > KCACHE__MAX_PART)
                return -EFBIG;
        struct kcache__key k;
        char rel[128];
        int r = blob_key(key, keylen, &k, rel, sizeof(rel));
        if (r < 0)
                return r;
        r = kcache__entry_store(kc, rel, &k, data ? data : "", len);
        kcache__key_free(&k);
        return r;
}

KCACHE__EXPORT void kcache_free(void *data)
{
        free(data);
}

KCACHE__EXPORT int kcache_trust_uid(kcache *kc, uid_t uid)
{
        if (!kc)
                return -EINVAL;
        pthread_mutex_lock(&kc->lock);
        uid_t *t = realloc(kc->trusted, (kc->ntrusted + 1) * sizeof(*t));
        if (t) {
                t[kc->ntrusted++] = uid;
                kc->trusted = t;
        }
        pthread_mutex_unlock(&kc->lock);
        if (t)
                kcache__trace(kc, "trust uid %u", (unsigned)uid);
        return t ? 0 : -ENOMEM;
}

KCACHE__EXPORT const char *kcache_dir(const kcache *kc)
{
        return kc ? kc->dir : NULL;
}

KCACHE__EXPORT void kcache_get_stats(const kcache *kc, struct kcache_stats *ret)
{
        kcache *k = (kcache *)kc; /* atomics are read through a non-const pointer */
        ret->hits = atomic_load(&k->st.hits);
        ret->misses = atomic_load(&k->st.misses);
        ret->rejects = atomic_load(&k->st.rejects);
        ret->stores = atomic_load(&k->st.stores);
        ret->store_errors = atomic_load(&k->st.store_errors);
        ret->compiles = atomic_load(&k->st.compiles);
        ret->memory_hits = atomic_load(&k->st.memory_hits);
        ret->lock_waits = atomic_load(&k->st.lock_waits);
        ret->refreshes = atomic_load(&k->st.refreshes);
}

KCACHE__EXPORT const char *kcache_strerror(int err)
{
        switch (err) {
        case 0: return "success";
        case -ENOENT: return "not in the cache (miss): compute the value and store it";
        case -EINVAL: return "invalid argument, or no cache directory: pass one or set KCACHE_DIR";
        case -ENOMEM: return "out of memory";
        case -EIO: return "the entry could not be read: treat as a miss (KCACHE_TRACE=1 names the cause)";
        case -EFBIG: return "key or payload larger than 1 GiB: not cached";
        case -ENOSPC: return "the cache filesystem is full, or the entry is larger than the cache";
        case -EDQUOT: return "disk quota exceeded on the cache directory";
        case -EACCES: return "permission denied on the cache directory: fix its permissions or use another";
        case -EPERM: return "not permitted: the entry belongs to another user in a shared directory";
        case -EROFS: return "the cache directory is on a read-only filesystem";
        case -ENOTDIR: return "the cache path is not a directory";
        case -ENAMETOOLONG: return "the cache path is too long";
        }
        return err < 0 ? strerror(-err) : "unknown error";
}
