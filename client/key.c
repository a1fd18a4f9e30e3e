/* The key record: a canonical encoding of everything a cached result depends on, and its XXH3-128.
 * See kcache-entry.h for the layout. What must stay true: equal inputs give byte-equal records (fields
 * in tag order, lengths explicit, no padding), and any change of any field changes the record. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kcache-entry.h"

static const char *const tag_names[KCACHE__T_MAX] = {
        [KCACHE__T_API] = "api",
        [KCACHE__T_KIND] = "kind",
        [KCACHE__T_INPUT] = "input",
        [KCACHE__T_OPTIONS] = "options",
        [KCACHE__T_ENV] = "env",
        [KCACHE__T_SPEC] = "spec",
        [KCACHE__T_PLATFORM_NAME] = "platform.name",
        [KCACHE__T_PLATFORM_VERSION] = "platform.version",
        [KCACHE__T_DEVICE_VENDOR] = "device.vendor",
        [KCACHE__T_DEVICE_NAME] = "device.name",
        [KCACHE__T_DEVICE_VERSION] = "device.version",
        [KCACHE__T_DRIVER_VERSION] = "driver.version",
        [KCACHE__T_DEVICE_UUID] = "device.uuid",
        [KCACHE__T_DRIVER_UUID] = "driver.uuid",
        [KCACHE__T_API_VERSION] = "api.version",
};

const char *kcache__tag_name(int tag)
{
        return tag > 0 && tag < KCACHE__T_MAX && tag_names[tag] ? tag_names[tag] : "unknown";
}

static void put_bytes(struct kcache__key *k, const void *data, size_t len)
{
        if (k->err)
                return;
        if (k->len + len > k->cap) {
                size_t cap = k->cap ? k->cap : 256;
                while (cap < k->len + len)
                        cap *= 2;
                uint8_t *b = realloc(k->buf, cap);
                if (!b) {
                        k->err = -ENOMEM;
                        return;
                }
                k->buf = b;
                k->cap = cap;
        }
        if (len)
                memcpy(k->buf + k->len, data, len);
        k->len += len;
}

void kcache__key_init(struct kcache__key *k)
{
        memset(k, 0, sizeof(*k));
        uint8_t head[8] = KCACHE__KEY_MAGIC;
        head[6] = KCACHE__KEY_VERSION & 0xff;
        head[7] = KCACHE__KEY_VERSION >> 8;
        put_bytes(k, head, sizeof(head));
}

void kcache__key_add(struct kcache__key *k, enum kcache__tag tag, const void *data, size_t len)
{
        /* Repeated tags (env, spec) are allowed; going back is not: the record would not be canonical. */
        assert((int)tag >= k->last_tag && tag > 0 && tag < KCACHE__T_MAX);
        k->last_tag = tag;
        if (len > KCACHE__MAX_PART) {
                k->err = k->err ? k->err : -EFBIG;
                return;
        }
        uint8_t h[5] = { (uint8_t)tag, (uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                         (uint8_t)(len >> 24) };
        put_bytes(k, h, sizeof(h));
        put_bytes(k, data, len);
}

void kcache__key_add_str(struct kcache__key *k, enum kcache__tag tag, const char *s)
{
        kcache__key_add(k, tag, s ? s : "", s ? strlen(s) : 0);
}

int kcache__key_finish(struct kcache__key *k)
{
        if (k->err)
                return k->err;
        XXH128_hash_t h = XXH3_128bits(k->buf, k->len);
        k->hash.hi = h.high64;
        k->hash.lo = h.low64;
        return 0;
}

void kcache__key_free(struct kcache__key *k)
{
        free(k->buf);
        memset(k, 0, sizeof(*k));
}

void kcache__hash_hex(struct kcache__hash h, char out[33])
{
        static const char hex[] = "0123456789abcdef";
        for (int i = 0; i < 16; i++) {
                uint64_t w = i < 8 ? h.hi : h.lo;
                int shift = 56 - 8 * (i % 8);
                out[2 * i] = hex[(w >> (shift + 4)) & 15];
                out[2 * i + 1] = hex[(w >> shift) & 15];
        }
        out[32] = '\0';
}

int kcache__key_walk(const void *rec, size_t len,
                     void (*fn)(void *arg, int tag, const uint8_t *data, size_t len), void *arg)
{
        const uint8_t *p = rec;
        if (len < 8 || memcmp(p, KCACHE__KEY_MAGIC, 6))
                return -EBADMSG;
        size_t off = 8;
        while (off < len) {
                if (len - off < 5)
                        return -EBADMSG;
                size_t flen = (size_t)p[off + 1] | (size_t)p[off + 2] << 8 | (size_t)p[off + 3] << 16 |
                              (size_t)p[off + 4] << 24;
                if (flen > len - off - 5)
                        return -EBADMSG;
                if (fn)
                        fn(arg, p[off], p + off + 5, flen);
                off += 5 + flen;
        }
        return 0;
}
