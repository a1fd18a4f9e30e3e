/* The key record and the entry file format of libkcache: what is hashed, and what lies on disk.
 * Internal to the project (the library, `kcache show`, the fuzzer and the tests); not installed.
 *
 * Key record: "KCKEY" '\0' u16 version, then fields, each u8 tag, u32 length (little endian), bytes.
 * Fields come in the order the tags are numbered (a builder that adds them out of order is a bug
 * caught by an assert), so equal inputs give equal bytes; the key is XXH3-128 over the whole record.
 *
 * Entry file (all integers little endian):
 *     0  magic "KCACHE\0E"          8 bytes
 *     8  format version (1)         u32
 *    12  header size (64)           u32
 *    16  total file size            u64   detects truncation and appended garbage
 *    24  key record length          u64
 *    32  payload length             u64
 *    40  key hash (XXH3-128)        16 bytes, high half first
 *    56  payload checksum (XXH3-64) u64
 *    64  key record, then payload
 * Invariant: total == 64 + key length + payload length, and the file is exactly that long. */
#ifndef KCACHE_ENTRY_H
#define KCACHE_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KCACHE__KEY_MAGIC "KCKEY"
#define KCACHE__KEY_VERSION 1
#define KCACHE__ENTRY_MAGIC "KCACHE\0E"
#define KCACHE__ENTRY_VERSION 1
#define KCACHE__ENTRY_HEADER 64
#define KCACHE__MAX_PART (1ull << 30) /* largest key record or payload: 1 GiB */

enum kcache__tag {
        KCACHE__T_API = 1,       /* "blob", "opencl", "level-zero" */
        KCACHE__T_KIND,          /* "user", "source", "il" */
        KCACHE__T_INPUT,         /* the caller's key bytes, OpenCL C source or IL */
        KCACHE__T_OPTIONS,       /* build options as given */
        KCACHE__T_ENV,           /* NAME=value of an environment variable the compiler reads (repeated) */
        KCACHE__T_SPEC,          /* specialization constant: u32 id, then its value bytes (repeated) */
        KCACHE__T_PLATFORM_NAME,
        KCACHE__T_PLATFORM_VERSION,
        KCACHE__T_DEVICE_VENDOR,
        KCACHE__T_DEVICE_NAME,
        KCACHE__T_DEVICE_VERSION,
        KCACHE__T_DRIVER_VERSION,
        KCACHE__T_DEVICE_UUID,
        KCACHE__T_DRIVER_UUID,
        KCACHE__T_API_VERSION,
        KCACHE__T_MAX
};

struct kcache__hash {
        uint64_t hi, lo;
};

/* A key record being built; grows as fields are added. */
struct kcache__key {
        uint8_t *buf;
        size_t len, cap;
        int last_tag;
        int err;                 /* first -ENOMEM, reported by kcache__key_finish() */
        struct kcache__hash hash;
};

void kcache__key_init(struct kcache__key *k);
void kcache__key_add(struct kcache__key *k, enum kcache__tag tag, const void *data, size_t len);
void kcache__key_add_str(struct kcache__key *k, enum kcache__tag tag, const char *s);
/* Computes k->hash. Returns 0 or -ENOMEM (a field could not be added). */
int kcache__key_finish(struct kcache__key *k);
void kcache__key_free(struct kcache__key *k);
const char *kcache__tag_name(int tag);
/* Writes the 32 lowercase hex digits of H and a NUL into out[33]. */
void kcache__hash_hex(struct kcache__hash h, char out[33]);

/* Walks a key record: calls FN for each field in order. Returns 0, or -EBADMSG if the record is
 * malformed (bad magic, a field running past the end). */
int kcache__key_walk(const void *rec, size_t len,
                     void (*fn)(void *arg, int tag, const uint8_t *data, size_t len), void *arg);

enum kcache__verdict {
        KCACHE__OK = 0,
        KCACHE__TRUNCATED,       /* shorter than the header says, or shorter than a header */
        KCACHE__OVERSIZED,       /* longer than the header says */
        KCACHE__FOREIGN,         /* not a libkcache entry (magic) */
        KCACHE__VERSION,         /* a format version this library does not read */
        KCACHE__BAD_HEADER,      /* inconsistent lengths */
        KCACHE__KEY_MISMATCH,    /* another key with the same file name: a collision or a forgery */
        KCACHE__BAD_CHECKSUM,    /* payload corrupted */
};
const char *kcache__verdict_str(enum kcache__verdict v);

struct kcache__entry_view {
        const uint8_t *key;      /* the key record stored in the entry */
        size_t key_len;
        const uint8_t *payload;
        size_t payload_len;
        struct kcache__hash key_hash;  /* as stored in the header */
        uint64_t checksum;       /* as stored in the header */
};

/* Checks an entry of LEN bytes at BUF. If KEY is non-NULL the stored key record must equal it.
 * Fills *view (pointing into BUF) whenever the header could be read, even if the verdict is not OK. */
enum kcache__verdict kcache__entry_parse(const void *buf, size_t len, const void *key, size_t key_len,
                                         struct kcache__entry_view *view);

/* The same in steps, for a reader that reads the header, the key and the payload separately: checks
 * the LEN (>= 64 for OK) header bytes at P against a file of FILE_LEN bytes and fills the lengths,
 * hash and checksum of *view; then the key record (view->key set by the caller) against its hash and
 * KEY. The caller checks the payload's XXH3-64 against view->checksum. */
enum kcache__verdict kcache__entry_parse_header(const uint8_t *p, size_t len, uint64_t file_len,
                                                struct kcache__entry_view *view);
enum kcache__verdict kcache__entry_check_key(const struct kcache__entry_view *view, const void *key, size_t key_len);

/* Fills the 64-byte header for KEY and PAYLOAD. */
void kcache__entry_header(uint8_t out[KCACHE__ENTRY_HEADER], const struct kcache__key *key,
                          const void *payload, size_t payload_len);

#endif
