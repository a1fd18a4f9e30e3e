/* The blob API on a directory: round trips of many sizes, overwrite, misses, argument errors, the
 * default directory, temporary files never left behind, and 8 threads at once.
 *   test-client-blob [DIR]   DIR: where to run (a kcachefs mount in the integration tests) */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kcache.h"
#include "tutil.h"

static kcache *kc;

static void fill(uint8_t *b, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i++)
                b[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
}

static int roundtrip(size_t n, unsigned seed)
{
        uint8_t *b = malloc(n ? n : 1);
        fill(b, n, seed);
        char key[64];
        int kl = snprintf(key, sizeof(key), "blob-%zu-%u", n, seed);
        int bad = kcache_put(kc, key, (size_t)kl, b, n) != 0;
        void *got = NULL;
        size_t glen = 0;
        bad |= kcache_get(kc, key, (size_t)kl, &got, &glen) != 0;
        bad |= glen != n || (n && memcmp(got, b, n));
        kcache_free(got);
        free(b);
        return bad;
}

static void *thread_main(void *arg)
{
        unsigned t = (unsigned)(uintptr_t)arg;
        int bad = 0;
        for (unsigned i = 0; i < 50; i++) {
                bad += roundtrip(1000 + 17 * i, t * 1000 + i); /* keys of this thread */
                uint8_t shared[4096]; /* one key for all threads: whatever is read is whole */
                fill(shared, sizeof(shared), 99);
                kcache_put(kc, "shared", 6, shared, sizeof(shared));
                void *got;
                size_t glen;
                if (kcache_get(kc, "shared", 6, &got, &glen) == 0) {
                        bad += glen != sizeof(shared) || memcmp(got, shared, glen);
                        kcache_free(got);
                }
        }
        return (void *)(uintptr_t)bad;
}

static int count_temps(const char *dir)
{
        char p[4200];
        snprintf(p, sizeof(p), "%s/blob", dir);
        DIR *d = opendir(p);
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d));)
                n += strstr(e->d_name, ".temp") != NULL;
        if (d)
                closedir(d);
        return n;
}

int main(int argc, char **argv)
{
        char *tmp = argc > 1 ? NULL : tutil_tmpdir();
        const char *dir = argc > 1 ? argv[1] : tmp;
        unsetenv("KCACHE_DISABLE");
        CHECK_EQ(kcache_open(dir, &kc), 0);
        CHECK(kcache_dir(kc) != NULL && kcache_dir(kc)[0] == '/');

        size_t sizes[] = { 0, 1, 63, 64, 4095, 65536, 1 << 20, (1 << 20) + 3 };
        for (size_t i = 0; i < sizeof(sizes) / sizeof(*sizes); i++)
                CHECK_EQ(roundtrip(sizes[i], 1), 0);
        CHECK_EQ(roundtrip(65536, 2), 0); /* overwrite: the new value wins */

        void *got = (void *)1;
        size_t glen = 7;
        CHECK_EQ(kcache_get(kc, "absent", 6, &got, &glen), -ENOENT);
        CHECK(got == (void *)1 && glen == 7); /* untouched on failure */
        CHECK_EQ(kcache_get(kc, "absent", 0, &got, &glen), -EINVAL);
        CHECK_EQ(kcache_get(NULL, "absent", 6, &got, &glen), -EINVAL);
        CHECK_EQ(kcache_put(kc, NULL, 3, "x", 1), -EINVAL);
        CHECK_EQ(kcache_put(kc, "k", 1, NULL, 1), -EINVAL);
        CHECK_EQ(kcache_put(kc, "k", 1, "x", (size_t)1 << 31), -EFBIG);
        CHECK(strlen(kcache_strerror(-ENOSPC)) > 10);
        CHECK(strlen(kcache_strerror(-12345)) > 0);

        pthread_t th[8];
        for (int i = 0; i < 8; i++)
                pthread_create(&th[i], NULL, thread_main, (void *)(uintptr_t)i);
        for (int i = 0; i < 8; i++) {
                void *bad;
                pthread_join(th[i], &bad);
                CHECK_EQ((uintptr_t)bad, 0);
        }
        CHECK_EQ(count_temps(dir), 0);
        struct kcache_stats s;
        kcache_get_stats(kc, &s);
        CHECK(s.stores >= 8 * 100 && s.hits >= 8 * 50 && s.store_errors == 0);
        kcache_close(kc);

        if (tmp) {
                /* The default directory: $KCACHE_DIR, else $XDG_CACHE_HOME/kcache, else none. */
                char want[4200];
                setenv("KCACHE_DIR", tmp, 1);
                CHECK_EQ(kcache_open(NULL, &kc), 0);
                CHECK(!strcmp(kcache_dir(kc), dir));
                kcache_close(kc);
                unsetenv("KCACHE_DIR");
                setenv("XDG_CACHE_HOME", tmp, 1);
                CHECK_EQ(kcache_open(NULL, &kc), 0);
                snprintf(want, sizeof(want), "%s/kcache", tmp);
                CHECK(!strcmp(kcache_dir(kc), want));
                kcache_close(kc);
                unsetenv("XDG_CACHE_HOME");
                const char *home = getenv("HOME");
                char *saved = home ? strdup(home) : NULL;
                unsetenv("HOME");
                CHECK_EQ(kcache_open(NULL, &kc), -EINVAL);
                if (saved)
                        setenv("HOME", saved, 1);
                free(saved);

                /* A file where the directory should be; a store into a path blocked by a file. */
                snprintf(want, sizeof(want), "%s/afile", tmp);
                FILE *f = fopen(want, "w");
                fclose(f);
                CHECK_EQ(kcache_open(want, &kc), -ENOTDIR);
                snprintf(want, sizeof(want), "%s/blocked", tmp);
                CHECK_EQ(kcache_open(want, &kc), 0);
                snprintf(want, sizeof(want), "%s/blocked/blob", tmp);
                f = fopen(want, "w");
                fclose(f);
                CHECK_EQ(kcache_put(kc, "k", 1, "x", 1), -ENOTDIR);
                CHECK_EQ(kcache_get(kc, "k", 1, &got, &glen), -ENOENT);
                kcache_close(kc);

                /* KCACHE_DISABLE: misses, stores nothing, still works. */
                setenv("KCACHE_DISABLE", "1", 1);
                CHECK_EQ(kcache_open(dir, &kc), 0);
                CHECK_EQ(kcache_put(kc, "d", 1, "x", 1), 0);
                CHECK_EQ(kcache_get(kc, "blob-64-1", 9, &got, &glen), -ENOENT);
                kcache_close(kc);
                unsetenv("KCACHE_DISABLE");
                tutil_rmrf(tmp);
                free(tmp);
        }
        return tutil_done("test-client-blob");
}
