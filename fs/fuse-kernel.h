/* fuse-kernel.h: the parts of the kernel's FUSE protocol (linux/fuse.h 7.45) that the daemon speaks
 * itself, because Debian 12's headers and libfuse 3.14 predate them: INIT's newer fields, passthrough
 * (7.40), io_uring (7.42) and the prune notification (7.45). Prefix fk_ / FK_. */
#pragma once

#include <stdint.h>
#include <sys/ioctl.h>

#define FK_INIT 26                                /* opcode */
#define FK_INIT_EXT (1u << 30)                    /* flags: flags2 is valid */
#define FK_PASSTHROUGH_FLAGS2 (1u << (37 - 32))   /* FUSE_PASSTHROUGH */
#define FK_OVER_IO_URING_FLAGS2 (1u << (41 - 32)) /* FUSE_OVER_IO_URING */
#define FK_HANDLE_KILLPRIV_V2 (1u << 28)           /* flags: we kill suid/sgid/caps on write/truncate (7.33) */
#define FK_OPEN 14                                /* opcodes answered without libfuse (direct.c) */
#define FK_RELEASE 18
#define FK_INTERRUPT 36                           /* its argument: the unique of the request (uint64_t) */
#define FK_FOPEN_DIRECT_IO (1u << 0)
#define FK_FOPEN_KEEP_CACHE (1u << 1)
#define FK_FOPEN_NONSEEKABLE (1u << 2)
#define FK_FOPEN_CACHE_DIR (1u << 3)
#define FK_FOPEN_NOFLUSH (1u << 5)
#define FK_FOPEN_PASSTHROUGH (1u << 7)
#define FK_RELEASE_FLUSH (1u << 0)                /* fk_release_in.release_flags */
#define FK_RELEASE_FLOCK_UNLOCK (1u << 1)

#define FK_NOTIFY_PRUNE 9                         /* notify code (7.45) */

struct fk_notify_prune_out { /* followed by count node ids (uint64_t) */
        uint32_t count, padding;
        uint64_t spare;
};

struct fk_in_header {
        uint32_t len, opcode;
        uint64_t unique, nodeid;
        uint32_t uid, gid, pid;
        uint16_t total_extlen, padding;
};

struct fk_out_header {
        uint32_t len;
        int32_t error;
        uint64_t unique;
};

struct fk_init_in {
        uint32_t major, minor, max_readahead, flags, flags2;
};

struct fk_init_out { /* up to max_stack_depth; the rest is left as libfuse wrote it */
        uint32_t major, minor, max_readahead, flags;
        uint16_t max_background, congestion_threshold;
        uint32_t max_write, time_gran;
        uint16_t max_pages, map_alignment;
        uint32_t flags2, max_stack_depth;
};

struct fk_open_in {
        uint32_t flags, open_flags;
};

struct fk_release_in {
        uint64_t fh;
        uint32_t flags, release_flags;
        uint64_t lock_owner;
};

struct fk_open_out {
        uint64_t fh;
        uint32_t open_flags;
        int32_t backing_id;
};

struct fk_backing_map {
        int32_t fd;
        uint32_t flags;
        uint64_t padding;
};

#define FK_IOC_BACKING_OPEN _IOW(229, 1, struct fk_backing_map)
#define FK_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

/* io_uring: an entry's header buffer, and the 80-byte command area of a 128-byte SQE. */
struct fk_uring_ent_in_out {
        uint64_t flags, commit_id;
        uint32_t payload_sz, padding;
        uint64_t reserved;
};

struct fk_uring_req_header {
        char in_out[128];         /* fuse_in_header; fuse_out_header in the reply */
        char op_in[128];          /* the operation's header (its first argument) */
        struct fk_uring_ent_in_out ent;
};

struct fk_uring_cmd_req {
        uint64_t flags, commit_id;
        uint16_t qid;
        uint8_t padding[6];
};

#define FK_URING_CMD_REGISTER 1
#define FK_URING_CMD_COMMIT_AND_FETCH 2

_Static_assert(sizeof(struct fk_in_header) == 40, "fuse_in_header");
_Static_assert(sizeof(struct fk_init_out) == 40, "fuse_init_out up to max_stack_depth");
_Static_assert(sizeof(struct fk_open_out) == 16, "fuse_open_out");
_Static_assert(sizeof(struct fk_open_in) == 8, "fuse_open_in");
_Static_assert(sizeof(struct fk_release_in) == 24, "fuse_release_in");
_Static_assert(sizeof(struct fk_uring_req_header) == 288, "fuse_uring_req_header");
_Static_assert(sizeof(struct fk_uring_cmd_req) == 24, "fuse_uring_cmd_req");
