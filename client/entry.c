/* The entry file format: building the header and checking a file against it. See kcache-entry.h for
 * the layout. kcache__entry_parse() runs on bytes anybody may have written (another user, a torn
 * write, a fuzzer): it reads nothing outside [buf, buf+len), trusts no length before checking it
 * against len, and never allocates. */
#include <string.h>
#include <xxhash.h>

#include "kcache-entry.h"

static uint32_t rd32(const uint8_t *p)
{
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
        return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr32(uint8_t *p, uint32_t v)
{
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
        wr32(p, (uint32_t)v);
        wr32(p + 4, (uint32_t)(v >> 32));
}

const char *kcache__verdict_str(enum kcache__verdict v)
{
        switch (v) {
        case KCACHE__OK: return "ok";
        case KCACHE__TRUNCATED: return "truncated";
        case KCACHE__OVERSIZED: return "longer than its header says";
        case KCACHE__FOREIGN: return "not a libkcache entry";
        case KCACHE__VERSION: return "unknown format version";
        case KCACHE__BAD_HEADER: return "inconsistent header";
        case KCACHE__KEY_MISMATCH: return "key differs (hash collision or forged entry)";
        case KCACHE__BAD_CHECKSUM: return "checksum mismatch (corrupted)";
        }
        return "?";
}

void kcache__entry_header(uint8_t out[KCACHE__ENTRY_HEADER], const struct kcache__key *key,
                          const void *payload, size_t payload_len)
{
        memset(out, 0, KCACHE__ENTRY_HEADER);
        memcpy(out, KCACHE__ENTRY_MAGIC, 8);
        wr32(out + 8, KCACHE__ENTRY_VERSION);
        wr32(out + 12, KCACHE__ENTRY_HEADER);
        wr64(out + 16, KCACHE__ENTRY_HEADER + (uint64_t)key->len + payload_len);
        wr64(out + 24, key->len);
        wr64(out + 32, payload_len);
        wr64(out + 40, key->hash.hi);
        wr64(out + 48, key->hash.lo);
        wr64(out + 56, XXH3_64bits(payload, payload_len));
}

enum kcache__verdict kcache__entry_parse_header(const uint8_t *p, size_t len, uint64_t file_len,
                                                struct kcache__entry_view *view)
{
        memset(view, 0, sizeof(*view));
        if (len == 0 || file_len == 0)
                return KCACHE__TRUNCATED; /* an empty file: a write torn before its first byte */
        if (memcmp(p, KCACHE__ENTRY_MAGIC, len < 8 ? len : 8))
                return KCACHE__FOREIGN;
        if (len < 12)
                return KCACHE__TRUNCATED;
        if (rd32(p + 8) != KCACHE__ENTRY_VERSION)
                return KCACHE__VERSION;
        if (len < KCACHE__ENTRY_HEADER)
                return KCACHE__TRUNCATED;
        uint64_t total = rd64(p + 16), klen = rd64(p + 24), plen = rd64(p + 32);
        if (rd32(p + 12) != KCACHE__ENTRY_HEADER || klen > KCACHE__MAX_PART || plen > KCACHE__MAX_PART ||
            total != KCACHE__ENTRY_HEADER + klen + plen)
                return KCACHE__BAD_HEADER;
        view->key_hash.hi = rd64(p + 40);
        view->key_hash.lo = rd64(p + 48);
        view->checksum = rd64(p + 56);
        view->key_len = klen;
        view->payload_len = plen;
        if (file_len < total)
                return KCACHE__TRUNCATED;
        if (file_len > total)
                return KCACHE__OVERSIZED;
        return KCACHE__OK;
}

enum kcache__verdict kcache__entry_check_key(const struct kcache__entry_view *view, const void *key, size_t key_len)
{
        XXH128_hash_t kh = XXH3_128bits(view->key, view->key_len);
        if (kh.high64 != view->key_hash.hi || kh.low64 != view->key_hash.lo)
                return KCACHE__BAD_CHECKSUM; /* the record does not match its own hash: corrupted */
        if (key && (key_len != view->key_len || memcmp(key, view->key, key_len)))
                return KCACHE__KEY_MISMATCH;
        return KCACHE__OK;
}

enum kcache__verdict kcache__entry_parse(const void *buf, size_t len, const void *key, size_t key_len,
                                         struct kcache__entry_view *view)
{
        const uint8_t *p = buf;
        enum kcache__verdict v = kcache__entry_parse_header(p, len, len, view);
        if (v != KCACHE__OK)
                return v; /* the header's claims stay in *view (for `kcache show`); no pointers */
        view->key = p + KCACHE__ENTRY_HEADER;
        view->payload = view->key + view->key_len;
        if ((v = kcache__entry_check_key(view, key, key_len)) != KCACHE__OK)
                return v;
        if (XXH3_64bits(view->payload, view->payload_len) != view->checksum)
                return KCACHE__BAD_CHECKSUM;
        return KCACHE__OK;
}
