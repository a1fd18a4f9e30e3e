/* value.h: a runtime unit as the shared tier stores it (remote.h, THE SHARED TIER). Pure functions, no
 * I/O: the unit test and the fuzz target call them directly.
 *
 * Layout (little-endian), every length checked on decode:
 *   "KCFS" | u8 version (1) | u8 runtime (enum krt) | u16 files | u32 uid | u64 time_ns |
 *   u16 node length | node |
 *   files x { u16 path length | path (relative to the mount root) | u32 mode | u64 size | u64 xxh64 } |
 *   the files' bytes, in that order | u64 xxh64 of everything before it
 * Files are listed in the order they are written on a fetch: the reverse of eviction's, so that the file
 * a runtime tests for the entry (PoCL's program.bc, Triton's __grp__*.json, JAX's -cache) comes last.
 * A decoded value whose checksums, lengths, paths or runtime are wrong is refused whole: a miss. */
#ifndef KCACHEFS_REMOTE_VALUE_H
#define KCACHEFS_REMOTE_VALUE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KRV_MAGIC "KCFS"
#define KRV_VERSION 1
#define KRV_MAX_FILES 4096
#define KRV_MAX_PATH 4096
#define KRV_MAX_NODE 255

struct krv_file {
        char *path;               /* relative, no "." or ".." component, no empty one */
        uint32_t mode;            /* permission bits only */
        uint64_t size;
        uint64_t sum;             /* xxh64 of its bytes */
        const unsigned char *data; /* decode: into the value's buffer; encode: the caller's */
};

struct krv_unit {
        uint8_t rt;
        uint32_t uid;
        uint64_t time_ns;
        char *node;
        size_t n;
        struct krv_file *files;
};

/* A malloc'ed value of *len bytes, or NULL (ENOMEM, or a path too long). */
unsigned char *krv_encode(const struct krv_unit *u, size_t *len);
/* 0, or -EBADMSG (not a well-formed value), -EPROTO (another version), -ENOMEM. On success u's files
 * point into buf, which must outlive u. */
int krv_decode(const unsigned char *buf, size_t len, struct krv_unit *u);
void krv_free(struct krv_unit *u);
/* Whether path is relative and plain: no leading '/', no empty, "." or ".." component, no NUL. */
int krv_path_ok(const char *path, size_t len);

#endif
