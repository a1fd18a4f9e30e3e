/* Entries on disk: loading with every check, publishing atomically, removing what is unusable.
 *
 * What must stay true:
 *  - Nothing is returned that did not pass kcache__entry_parse() against the exact key record, and
 *    nothing is loaded from a file that is not a regular file owned by a trusted uid (kcache__trusted).
 *  - A store is a temporary file in the entry's own directory (".<hash>.<pid>.<n>.temp": kcachefs
 *    treats *.temp as in flight), written whole, made 0644, then renamed over the entry. Readers see
 *    the old entry, the new one or none; a crash leaves at most a temporary file.
 *  - An unusable entry we may remove (ours, or in a directory we own) is removed, so it is reported
 *    once; another user's file is left alone and simply never used. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "kcache-int.h"

void kcache__entry_path(const char *reldir, const struct kcache__key *key, char *out, size_t size)
{
        char hex[33];
        kcache__hash_hex(key->hash, hex);
        snprintf(out, size, "%s/%s.kce", reldir, hex);
}

bool kcache__trusted(kcache *kc, const struct stat *st, const char **why)
{
        if (!S_ISREG(st->st_mode)) {
                *why = "not a regular file";
                return false;
        }
        if (st->st_mode & (S_IWGRP | S_IWOTH)) {
                *why = "writable by other users";
                return false;
        }
        if (st->st_uid == geteuid() || st->st_uid == 0)
                return true;
        bool ok = false;
        pthread_mutex_lock(&kc->lock);
        for (size_t i = 0; i < kc->ntrusted && !ok; i++)
                ok = kc->trusted[i] == st->st_uid;
        pthread_mutex_unlock(&kc->lock);
        if (!ok)
                *why = "owned by an untrusted user";
        return ok;
}

/* Reads up to len bytes at off; fewer only at the end of the file (a file that shrank reads as
 * truncated). Returns the count or -errno. */
static ssize_t read_at(int fd, uint8_t *buf, size_t len, size_t off)
{
        size_t got = 0;
        while (got < len) {
                ssize_t n = pread(fd, buf + got, len - got, (off_t)(off + got));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        break;
                got += (size_t)n;
        }
        return (ssize_t)got;
}

int kcache__entry_load(kcache *kc, const char *relpath, const struct kcache__key *key, void **ret_data,
                       size_t *ret_len)
{
        if (kc->disabled)
                return -ENOENT;
        int fd = openat(kc->dirfd, relpath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
                int e = errno;
                kcache__trace(kc, "miss %s: %s", relpath, e == ENOENT ? "no entry" : strerror(e));
                return e == ENOENT || e == ENOTDIR || e == ELOOP || e == EACCES ? -ENOENT : -EIO;
        }
        struct stat st;
        const char *why = NULL;
        uint8_t head[KCACHE__ENTRY_HEADER + 512], *kbuf = head + KCACHE__ENTRY_HEADER, *payload = NULL;
        struct kcache__entry_view v;
        int r = -ENOENT;
        if (fstat(fd, &st) < 0) {
                r = -EIO;
                goto out;
        }
        if (!kcache__trusted(kc, &st, &why)) {
                kcache__trace(kc, "reject %s: %s (uid %u); not loaded", relpath, why, (unsigned)st.st_uid);
                atomic_fetch_add(&kc->st.rejects, 1);
                goto out;
        }
        /* Header and (small) key in one read, the payload straight into the buffer handed out. */
        size_t want = KCACHE__ENTRY_HEADER + key->len <= sizeof(head) ? KCACHE__ENTRY_HEADER + key->len
                                                                      : KCACHE__ENTRY_HEADER;
        ssize_t n = read_at(fd, head, want, 0);
        if (n < 0) {
                r = -EIO;
                goto out;
        }
        enum kcache__verdict verdict = kcache__entry_parse_header(head, (size_t)n, (uint64_t)st.st_size, &v);
        if (verdict == KCACHE__OK && v.key_len != key->len)
                verdict = KCACHE__KEY_MISMATCH;
        if (verdict == KCACHE__OK && want == KCACHE__ENTRY_HEADER) { /* a long key: read it apart */
                kbuf = malloc(key->len ? key->len : 1);
                if (!kbuf) {
                        r = -ENOMEM;
                        goto out;
                }
                if (read_at(fd, kbuf, key->len, KCACHE__ENTRY_HEADER) != (ssize_t)key->len)
                        verdict = KCACHE__TRUNCATED;
        } else if (verdict == KCACHE__OK && (size_t)n != want) {
                verdict = KCACHE__TRUNCATED;
        }
        if (verdict == KCACHE__OK) {
                v.key = kbuf;
                verdict = kcache__entry_check_key(&v, key->buf, key->len);
        }
        if (verdict == KCACHE__OK) {
                payload = malloc(v.payload_len ? v.payload_len : 1);
                if (!payload) {
                        r = -ENOMEM;
                        goto out;
                }
                if (read_at(fd, payload, v.payload_len, KCACHE__ENTRY_HEADER + v.key_len) != (ssize_t)v.payload_len)
                        verdict = KCACHE__TRUNCATED;
                else if (XXH3_64bits(payload, v.payload_len) != v.checksum)
                        verdict = KCACHE__BAD_CHECKSUM;
        }
        if (verdict == KCACHE__OK) {
                kcache__trace(kc, "hit %s (%zu bytes)", relpath, v.payload_len);
                *ret_data = payload;
                *ret_len = v.payload_len;
                payload = NULL;
                r = 0;
        } else {
                kcache__trace(kc, "reject %s: %s (%lld bytes); removed", relpath, kcache__verdict_str(verdict),
                              (long long)st.st_size);
                atomic_fetch_add(&kc->st.rejects, 1);
                kcache__entry_remove(kc, relpath);
        }
out:
        if (kbuf != head + KCACHE__ENTRY_HEADER)
                free(kbuf);
        free(payload);
        close(fd);
        return r;
}

void kcache__entry_remove(kcache *kc, const char *relpath)
{
        if (unlinkat(kc->dirfd, relpath, 0) < 0 && errno != ENOENT)
                kcache__trace(kc, "remove %s: %s", relpath, strerror(errno));
}

int kcache__make_dirs(kcache *kc, const char *reldir)
{
        char p[4096];
        snprintf(p, sizeof(p), "%s", reldir);
        for (char *s = p;; s++) {
                if (*s == '/' || !*s) {
                        char c = *s;
                        *s = '\0';
                        if (mkdirat(kc->dirfd, p, 0777) < 0 && errno != EEXIST)
                                return -errno;
                        *s = c;
                        if (!c)
                                return 0;
                }
        }
}

static int write_all(int fd, const void *data, size_t len)
{
        const uint8_t *p = data;
        while (len) {
                ssize_t n = write(fd, p, len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

int kcache__entry_store(kcache *kc, const char *relpath, const struct kcache__key *key, const void *data,
                        size_t len)
{
        if (kc->disabled)
                return 0;
        if (len > KCACHE__MAX_PART || key->len > KCACHE__MAX_PART)
                return -EFBIG;
        char tmp[4200], reldir[4096];
        snprintf(reldir, sizeof(reldir), "%s", relpath);
        char *slash = strrchr(reldir, '/');
        const char *base = slash ? slash + 1 : relpath;
        if (slash)
                *slash = '\0';
        snprintf(tmp, sizeof(tmp), "%s%s.%.32s.%d.%u.temp", slash ? reldir : "", slash ? "/." : ".", base,
                 (int)getpid(), (unsigned)atomic_fetch_add(&kc->tmp_seq, 1));
        int fd = openat(kc->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno == ENOENT && slash) {
                int r = kcache__make_dirs(kc, reldir);
                fd = r < 0 ? (errno = -r, -1)
                           : openat(kc->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        }
        if (fd < 0) {
                int e = errno;
                kcache__trace(kc, "store %s: %s", relpath, strerror(e));
                atomic_fetch_add(&kc->st.store_errors, 1);
                return -e;
        }
        uint8_t head[KCACHE__ENTRY_HEADER];
        kcache__entry_header(head, key, data, len);
        int r = write_all(fd, head, sizeof(head));
        if (!r)
                r = write_all(fd, key->buf, key->len);
        if (!r)
                r = write_all(fd, data, len);
        if (!r && fchmod(fd, 0644) < 0) /* umask may have made it group-writable: untrusted */
                r = -errno;
        if (close(fd) < 0 && !r)
                r = -errno;
        if (!r && renameat(kc->dirfd, tmp, kc->dirfd, relpath) < 0)
                r = -errno;
        if (r) {
                unlinkat(kc->dirfd, tmp, 0);
                kcache__trace(kc, "store %s: %s; nothing stored", relpath, strerror(-r));
                atomic_fetch_add(&kc->st.store_errors, 1);
                return r;
        }
        atomic_fetch_add(&kc->st.stores, 1);
        kcache__trace(kc, "store %s (%zu bytes)", relpath, len);
        return 0;
}
