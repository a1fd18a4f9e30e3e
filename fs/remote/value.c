/* value.c: encoding and checking of the units the shared tier stores (value.h). Everything read from
 * the server is untrusted: a server, or a user with write access to a namespace, may hand back any bytes,
 * so decode checks every length against what is left before it reads, and every checksum. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "value.h"

struct wbuf {
        unsigned char *p;
        size_t len, cap;
        int err;
};

static void put(struct wbuf *w, const void *src, size_t n)
{
        if (w->err || n == 0)
                return; /* nothing, maybe from NULL (a unit without a node name): memcpy may not see it */
        if (w->len + n > w->cap) {
                size_t cap = w->cap ? w->cap : 256;
                while (cap < w->len + n)
                        cap *= 2;
                unsigned char *p = realloc(w->p, cap);
                if (!p) {
                        w->err = -ENOMEM;
                        return;
                }
                w->p = p;
                w->cap = cap;
        }
        memcpy(w->p + w->len, src, n);
        w->len += n;
}

static void put_u(struct wbuf *w, uint64_t v, int bytes)
{
        unsigned char b[8];
        for (int i = 0; i < bytes; i++)
                b[i] = (unsigned char)(v >> (8 * i));
        put(w, b, (size_t)bytes);
}

int krv_path_ok(const char *path, size_t len)
{
        if (len == 0 || len > KRV_MAX_PATH || path[0] == '/' || memchr(path, '\0', len))
                return 0;
        size_t start = 0;
        for (size_t i = 0; i <= len; i++) {
                if (i < len && path[i] != '/')
                        continue;
                size_t c = i - start;
                if (c == 0 || (c == 1 && path[start] == '.') || (c == 2 && path[start] == '.' && path[start + 1] == '.'))
                        return 0;
                start = i + 1;
        }
        return 1;
}

unsigned char *krv_encode(const struct krv_unit *u, size_t *len)
{
        struct wbuf w = { 0 };
        size_t nl = u->node ? strlen(u->node) : 0;
        if (u->n > KRV_MAX_FILES || nl > KRV_MAX_NODE)
                return NULL;
        put(&w, KRV_MAGIC, 4);
        put_u(&w, KRV_VERSION, 1);
        put_u(&w, u->rt, 1);
        put_u(&w, u->n, 2);
        put_u(&w, u->uid, 4);
        put_u(&w, u->time_ns, 8);
        put_u(&w, nl, 2);
        put(&w, u->node, nl);
        for (size_t i = 0; i < u->n; i++) {
                size_t pl = strlen(u->files[i].path);
                if (!krv_path_ok(u->files[i].path, pl)) {
                        free(w.p);
                        return NULL;
                }
                put_u(&w, pl, 2);
                put(&w, u->files[i].path, pl);
                put_u(&w, u->files[i].mode & 07777, 4);
                put_u(&w, u->files[i].size, 8);
                put_u(&w, XXH64(u->files[i].data, u->files[i].size, 0), 8);
        }
        for (size_t i = 0; i < u->n; i++)
                put(&w, u->files[i].data, u->files[i].size);
        if (w.err) {
                free(w.p);
                return NULL;
        }
        put_u(&w, XXH64(w.p, w.len, 0), 8);
        if (w.err) {
                free(w.p);
                return NULL;
        }
        *len = w.len;
        return w.p;
}

struct rbuf {
        const unsigned char *p;
        size_t len, off;
};

static int get_u(struct rbuf *r, int bytes, uint64_t *v)
{
        if (r->len - r->off < (size_t)bytes)
                return -EBADMSG;
        uint64_t x = 0;
        for (int i = 0; i < bytes; i++)
                x |= (uint64_t)r->p[r->off + (size_t)i] << (8 * i);
        r->off += (size_t)bytes;
        *v = x;
        return 0;
}

static int get_str(struct rbuf *r, size_t n, char **s)
{
        if (r->len - r->off < n)
                return -EBADMSG;
        *s = malloc(n + 1);
        if (!*s)
                return -ENOMEM;
        memcpy(*s, r->p + r->off, n);
        (*s)[n] = '\0';
        r->off += n;
        return 0;
}

void krv_free(struct krv_unit *u)
{
        for (size_t i = 0; i < u->n; i++)
                free(u->files[i].path);
        free(u->files);
        free(u->node);
        memset(u, 0, sizeof(*u));
}

/* Whether path is among the first n files' paths, by its XXH64 in the open-addressed set seen (of cap
 * slots, 0 free) first, by the strings only where two hashes meet: thousands of long paths are checked in
 * linear time, not compared pairwise. path is added to the set. */
static bool dup_path(const struct krv_file *files, size_t n, const char *path, uint64_t *seen, size_t cap)
{
        uint64_t h = XXH64(path, strlen(path), 0) | 1;
        for (size_t s = h % cap;; s = (s + 1) % cap) {
                if (!seen[s]) {
                        seen[s] = h;
                        return false;
                }
                if (seen[s] == h)
                        for (size_t k = 0; k < n; k++)
                                if (!strcmp(files[k].path, path))
                                        return true;
        }
}

int krv_decode(const unsigned char *buf, size_t len, struct krv_unit *u)
{
        memset(u, 0, sizeof(*u));
        if (len < 4 + 1 + 1 + 2 + 4 + 8 + 2 + 8 || memcmp(buf, KRV_MAGIC, 4))
                return -EBADMSG;
        uint64_t want = 0;
        for (int i = 0; i < 8; i++)
                want |= (uint64_t)buf[len - 8 + (size_t)i] << (8 * i);
        if (XXH64(buf, len - 8, 0) != want)
                return -EBADMSG;
        struct rbuf r = { buf, len - 8, 4 };
        uint64_t *seen = NULL; /* the paths' hashes (dup_path) */
        uint64_t ver, rt, n, uid, t, nl;
        int e = 0;
        if ((e = get_u(&r, 1, &ver)) < 0)
                return e;
        if (ver != KRV_VERSION)
                return -EPROTO;
        if ((e = get_u(&r, 1, &rt)) < 0 || (e = get_u(&r, 2, &n)) < 0 || (e = get_u(&r, 4, &uid)) < 0 ||
            (e = get_u(&r, 8, &t)) < 0 || (e = get_u(&r, 2, &nl)) < 0)
                return e;
        if (n == 0 || n > KRV_MAX_FILES || nl > KRV_MAX_NODE)
                return -EBADMSG; /* exactly what krv_encode makes: no more */
        u->rt = (uint8_t)rt;
        u->uid = (uint32_t)uid;
        u->time_ns = t;
        if ((e = get_str(&r, nl, &u->node)) < 0)
                goto fail;
        if (memchr(u->node, '\0', nl)) {
                e = -EBADMSG; /* a name with a NUL in it: not what any node encodes (the fuzzer found it) */
                goto fail;
        }
        u->files = calloc(n, sizeof(*u->files));
        seen = calloc(2 * n, sizeof(*seen));
        if (!u->files || !seen) {
                e = -ENOMEM;
                goto fail;
        }
        for (size_t i = 0; i < n; i++) {
                uint64_t pl, mode, size, sum;
                struct krv_file *f = &u->files[i];
                if ((e = get_u(&r, 2, &pl)) < 0 || (e = get_str(&r, pl, &f->path)) < 0)
                        goto fail;
                u->n = i + 1; /* f->path is ours to free from here */
                if ((e = get_u(&r, 4, &mode)) < 0 || (e = get_u(&r, 8, &size)) < 0 || (e = get_u(&r, 8, &sum)) < 0)
                        goto fail;
                if (!krv_path_ok(f->path, pl) || (mode & ~07777u)) {
                        e = -EBADMSG;
                        goto fail;
                }
                if (dup_path(u->files, i, f->path, seen, 2 * n)) {
                        e = -EBADMSG; /* one path twice */
                        goto fail;
                }
                f->mode = (uint32_t)mode;
                f->size = size;
                f->sum = sum;
        }
        for (size_t i = 0; i < u->n; i++) {
                struct krv_file *f = &u->files[i];
                if (f->size > r.len - r.off) {
                        e = -EBADMSG;
                        goto fail;
                }
                f->data = r.p + r.off;
                r.off += f->size;
                if (XXH64(f->data, f->size, 0) != f->sum) {
                        e = -EBADMSG;
                        goto fail;
                }
        }
        if (r.off != r.len) {
                e = -EBADMSG; /* bytes nobody accounts for */
                goto fail;
        }
        free(seen);
        return 0;
fail:
        free(seen);
        krv_free(u);
        return e;
}
