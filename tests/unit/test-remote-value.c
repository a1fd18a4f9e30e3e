/* test-remote-value.c: the shared tier's stored units (fs/remote/value.c): what is encoded decodes to the
 * same files; every value that is not exactly one that was encoded is refused (any byte flipped, any
 * length cut, paths that leave their place, another version), since the server's bytes are untrusted. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "tutil.h"
#include "value.h"

static struct krv_file files[] = {
        { .path = "ab/cdef/k/1-1-1/k.so", .mode = 0755, .size = 3000 },
        { .path = "ab/cdef/last_accessed", .mode = 0644, .size = 0 },
        { .path = "ab/cdef/program.bc", .mode = 0600, .size = 20000 },
};

static unsigned char *make(size_t *len)
{
        static unsigned char so[3000], bc[20000];
        for (size_t i = 0; i < sizeof(so); i++)
                so[i] = (unsigned char)(i * 7);
        for (size_t i = 0; i < sizeof(bc); i++)
                bc[i] = (unsigned char)(i * 13 + 1);
        files[0].data = so;
        files[1].data = (const unsigned char *)"";
        files[2].data = bc;
        struct krv_unit u = { .rt = 4, .uid = 1004, .time_ns = 123456789, .node = "node7", .n = 3, .files = files };
        return krv_encode(&u, len);
}

int main(void)
{
        size_t len;
        unsigned char *v = make(&len);
        CHECK(v != NULL);
        struct krv_unit u;
        CHECK_EQ(krv_decode(v, len, &u), 0);
        CHECK_EQ(u.n, 3);
        CHECK_EQ(u.uid, 1004);
        CHECK_EQ(u.rt, 4);
        CHECK(u.node && !strcmp(u.node, "node7"));
        for (size_t i = 0; i < u.n && i < 3; i++) {
                CHECK(!strcmp(u.files[i].path, files[i].path));
                CHECK_EQ(u.files[i].mode, files[i].mode);
                CHECK_EQ(u.files[i].size, files[i].size);
                CHECK(!memcmp(u.files[i].data, files[i].data, files[i].size));
        }
        krv_free(&u);

        /* any one byte flipped, anywhere: refused */
        size_t accepted = 0;
        for (size_t i = 0; i < len; i++) {
                v[i] ^= 0x5a;
                if (krv_decode(v, len, &u) == 0) {
                        accepted++;
                        krv_free(&u);
                }
                v[i] ^= 0x5a;
        }
        CHECK_EQ(accepted, 0);
        /* any length cut, or a byte added: refused */
        accepted = 0;
        for (size_t l = 0; l < len; l++)
                if (krv_decode(v, l, &u) == 0) {
                        accepted++;
                        krv_free(&u);
                }
        unsigned char *longer = malloc(len + 1);
        memcpy(longer, v, len);
        longer[len] = 0;
        if (krv_decode(longer, len + 1, &u) == 0) {
                accepted++;
                krv_free(&u);
        }
        CHECK_EQ(accepted, 0);
        free(longer);
        /* another version: -EPROTO (the checksum made right, so only the version is wrong) */
        v[4] = KRV_VERSION + 1;
        uint64_t sum = XXH64(v, len - 8, 0);
        for (int i = 0; i < 8; i++)
                v[len - 8 + (size_t)i] = (unsigned char)(sum >> (8 * i));
        CHECK_EQ(krv_decode(v, len, &u), -EPROTO);
        free(v);

        /* paths that leave their place are never encoded, and never decoded */
        const char *bad[] = { "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "", "a/" };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                CHECK(!krv_path_ok(bad[i], strlen(bad[i])));
                struct krv_file f = { .path = (char *)bad[i], .mode = 0644, .size = 1,
                                      .data = (const unsigned char *)"x" };
                struct krv_unit b = { .rt = 4, .n = 1, .files = &f };
                size_t bl;
                unsigned char *bv = krv_encode(&b, &bl);
                CHECK(bv == NULL);
                free(bv);
        }
        const char *good[] = { "a", "a/b", "a/.b", "..a", "a/..b/c" };
        for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
                CHECK(krv_path_ok(good[i], strlen(good[i])));
        /* a node name with a NUL in it (the fuzzer's find: it decoded, and did not encode back the same) */
        struct krv_file one = { .path = "a/bc", .mode = 0644, .size = 0, .data = (const unsigned char *)"" };
        struct krv_unit nu = { .rt = 4, .n = 1, .files = &one, .node = "nXXe5" };
        size_t nl;
        unsigned char *nv = krv_encode(&nu, &nl);
        CHECK(nv != NULL);
        if (nv) {
                CHECK_EQ(krv_decode(nv, nl, &u), 0);
                krv_free(&u);
                nv[4 + 1 + 1 + 2 + 4 + 8 + 2 + 2] = 0; /* the node's third byte */
                uint64_t nsum = XXH64(nv, nl - 8, 0);
                for (int i = 0; i < 8; i++)
                        nv[nl - 8 + (size_t)i] = (unsigned char)(nsum >> (8 * i));
                CHECK_EQ(krv_decode(nv, nl, &u), -EBADMSG);
                free(nv);
        }
        /* one path twice: refused on decode */
        struct krv_file two[] = { { .path = "a", .size = 1, .data = (const unsigned char *)"x" },
                                  { .path = "a", .size = 1, .data = (const unsigned char *)"y" } };
        struct krv_unit t = { .rt = 4, .n = 2, .files = two };
        size_t tl;
        unsigned char *tv = krv_encode(&t, &tl);
        CHECK(tv != NULL);
        CHECK_EQ(tv ? krv_decode(tv, tl, &u) : -EBADMSG, -EBADMSG);
        free(tv);
        return tutil_done("test-remote-value");
}
