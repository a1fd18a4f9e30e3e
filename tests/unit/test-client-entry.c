/* The entry format: every truncation, every flipped byte, appended bytes, another key, another format
 * or version are detected; and through the store, an unusable or untrusted entry is a miss, counted,
 * and (when ours) removed. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kcache-int.h"
#include "tutil.h"

static uint8_t *make_entry(const struct kcache__key *k, const void *payload, size_t plen, size_t *len)
{
        *len = KCACHE__ENTRY_HEADER + k->len + plen;
        uint8_t *b = malloc(*len);
        kcache__entry_header(b, k, payload, plen);
        memcpy(b + KCACHE__ENTRY_HEADER, k->buf, k->len);
        memcpy(b + KCACHE__ENTRY_HEADER + k->len, payload, plen);
        return b;
}

static void make_key(struct kcache__key *k, const char *input)
{
        kcache__key_init(k);
        kcache__key_add_str(k, KCACHE__T_API, "blob");
        kcache__key_add_str(k, KCACHE__T_KIND, "user");
        kcache__key_add_str(k, KCACHE__T_INPUT, input);
        CHECK_EQ(kcache__key_finish(k), 0);
}

static char *entry_file(const char *dir, const char *key)
{
        struct kcache__key k;
        char rel[100], *path = malloc(4200);
        make_key(&k, key);
        kcache__entry_path("blob", &k, rel, sizeof(rel));
        snprintf(path, 4200, "%s/%s", dir, rel);
        kcache__key_free(&k);
        return path;
}

int main(void)
{
        struct kcache__key k, other;
        make_key(&k, "the key");
        make_key(&other, "the kez");
        uint8_t payload[300];
        for (size_t i = 0; i < sizeof(payload); i++)
                payload[i] = (uint8_t)(i * 37 + 1);
        size_t len;
        uint8_t *e = make_entry(&k, payload, sizeof(payload), &len);
        struct kcache__entry_view v;

        CHECK_EQ(kcache__entry_parse(e, len, k.buf, k.len, &v), KCACHE__OK);
        CHECK_EQ(v.payload_len, sizeof(payload));
        CHECK(!memcmp(v.payload, payload, sizeof(payload)));
        CHECK_EQ(kcache__entry_parse(e, len, NULL, 0, &v), KCACHE__OK); /* `kcache show`: no key to compare */

        /* Every truncation. */
        int undetected = 0;
        for (size_t n = 0; n < len; n++)
                undetected += kcache__entry_parse(e, n, k.buf, k.len, &v) == KCACHE__OK;
        CHECK_EQ(undetected, 0);
        CHECK_EQ(kcache__entry_parse(e, 40, k.buf, k.len, &v), KCACHE__TRUNCATED);
        CHECK_EQ(kcache__entry_parse(e, len - 1, k.buf, k.len, &v), KCACHE__TRUNCATED);

        /* Every byte flipped, in two ways. */
        for (size_t i = 0; i < len; i++)
                for (int m = 0; m < 2; m++) {
                        uint8_t save = e[i];
                        e[i] ^= m ? 0xff : 0x01;
                        if (kcache__entry_parse(e, len, k.buf, k.len, &v) == KCACHE__OK) {
                                fprintf(stderr, "flip at %zu not detected\n", i);
                                undetected++;
                        }
                        e[i] = save;
                }
        CHECK_EQ(undetected, 0);

        /* Appended bytes, another key, another format, another version. */
        uint8_t *longer = malloc(len + 1);
        memcpy(longer, e, len);
        longer[len] = 0;
        CHECK_EQ(kcache__entry_parse(longer, len + 1, k.buf, k.len, &v), KCACHE__OVERSIZED);
        free(longer);
        CHECK_EQ(kcache__entry_parse(e, len, other.buf, other.len, &v), KCACHE__KEY_MISMATCH);
        CHECK_EQ(kcache__entry_parse("poclbin\0\x0c{0]", 12, k.buf, k.len, &v), KCACHE__FOREIGN);
        e[8] = 2;
        CHECK_EQ(kcache__entry_parse(e, len, k.buf, k.len, &v), KCACHE__VERSION);
        e[8] = 1;
        CHECK_EQ(kcache__entry_parse(e, len, k.buf, k.len, &v), KCACHE__OK);

        /* Through the store. */
        char *dir = tutil_tmpdir();
        unsetenv("KCACHE_TRACE");
        unsetenv("KCACHE_TRUST_UIDS");
        kcache *kc;
        CHECK_EQ(kcache_open(dir, &kc), 0);
        CHECK_EQ(kcache_put(kc, "the key", 7, payload, sizeof(payload)), 0);
        char *path = entry_file(dir, "the key");
        struct stat st;
        CHECK_EQ(stat(path, &st), 0);
        CHECK_EQ(st.st_size, (long long)len);
        CHECK_EQ(st.st_mode & 0777, 0644);
        void *got;
        size_t glen;
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), 0);
        CHECK(glen == sizeof(payload) && !memcmp(got, payload, glen));
        kcache_free(got);

        /* A corrupted entry: a miss, counted, removed. */
        int fd = open(path, O_WRONLY);
        CHECK(pwrite(fd, "X", 1, (off_t)len - 5) == 1);
        close(fd);
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), -ENOENT);
        CHECK(stat(path, &st) < 0 && errno == ENOENT);
        struct kcache_stats s;
        kcache_get_stats(kc, &s);
        CHECK_EQ(s.rejects, 1);
        CHECK_EQ(s.misses, 1);

        /* A truncated one (a torn write of another tool). */
        CHECK_EQ(kcache_put(kc, "the key", 7, payload, sizeof(payload)), 0);
        CHECK_EQ(truncate(path, (off_t)len / 2), 0);
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), -ENOENT);
        CHECK(stat(path, &st) < 0);

        /* A forged entry: valid in itself, but for another key, under this key's name. */
        size_t flen;
        uint8_t *forged = make_entry(&other, "evil", 4, &flen);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(write(fd, forged, flen) == (ssize_t)flen);
        close(fd);
        free(forged);
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), -ENOENT);

        /* Writable by others: never loaded. */
        CHECK_EQ(kcache_put(kc, "the key", 7, payload, sizeof(payload)), 0);
        CHECK_EQ(chmod(path, 0666), 0);
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), -ENOENT);
        CHECK_EQ(stat(path, &st), 0); /* not ours to judge: left alone */
        CHECK_EQ(chmod(path, 0644), 0);
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), 0);
        kcache_free(got);

        /* Owned by another user: never loaded, unless that uid is trusted. */
        if (geteuid() == 0) {
                CHECK_EQ(chown(path, 4242, 4242), 0);
                CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), -ENOENT);
                CHECK_EQ(stat(path, &st), 0);
                CHECK_EQ(kcache_trust_uid(kc, 4242), 0);
                CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), 0);
                kcache_free(got);
                kcache *kc2;
                setenv("KCACHE_TRUST_UIDS", "17,4242", 1);
                CHECK_EQ(kcache_open(dir, &kc2), 0);
                CHECK_EQ(kcache_get(kc2, "the key", 7, &got, &glen), 0);
                kcache_free(got);
                kcache_close(kc2);
                unsetenv("KCACHE_TRUST_UIDS");
        }
        /* A symlink planted in place of an entry is not followed. */
        CHECK_EQ(unlink(path), 0);
        CHECK_EQ(symlink("/etc/passwd", path), 0);
        CHECK_EQ(kcache_get(kc, "the key", 7, &got, &glen), -ENOENT);

        kcache_close(kc);
        free(path);
        free(e);
        kcache__key_free(&k);
        kcache__key_free(&other);
        tutil_rmrf(dir);
        free(dir);
        return tutil_done("test-client-entry");
}
