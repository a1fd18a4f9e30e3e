/* devio.c: the daemon's own /dev/fuse I/O.
 *
 * libfuse 3.14 lets a daemon bring its own device I/O (fuse_session_custom_io), and kcachefs does, for
 * two kernel features that Debian 12's libfuse predates: passthrough (passthrough.c, libfuse 3.16) and
 * FUSE over io_uring (ring.c, libfuse 3.18). Our read sees the kernel's INIT request, which says what the
 * kernel offers. Our writev sees every reply before the kernel does:
 *   - INIT's reply asks for what is wanted (FUSE_PASSTHROUGH with max_stack_depth 1,
 *     FUSE_OVER_IO_URING, and FUSE_HANDLE_KILLPRIV_V2, which 3.14 cannot ask for: the daemon clears setuid and
 *     setgid itself, ops-io.c SETUID, so the kernel stops asking for security.capability before every
 *     write(2) of a file once it found none), and once the kernel has taken it the rings start;
 *   - OPEN's and CREATE's replies get their backing file from passthrough.c;
 *   - a reply to a request that came through a ring goes into that ring's entry (ring.c), every other
 *     one (and every notification) to /dev/fuse.
 * Our read also counts the requests by opcode (user.kcachefs.requests; ring.c counts those of the rings),
 * which is why the hooks are installed even with both features switched off, and keeps from libfuse an
 * INTERRUPT for a request the daemon answered itself (direct.c, INTERRUPT). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuse-kernel.h"
#include "kfs.h"

/* The kernel's names of its opcodes (include/uapi/linux/fuse.h), for user.kcachefs.requests. */
static const char *const OPNAMES[KFS_OPCODES] = {
        [1] = "LOOKUP", [2] = "FORGET", [3] = "GETATTR", [4] = "SETATTR", [5] = "READLINK", [6] = "SYMLINK",
        [8] = "MKNOD", [9] = "MKDIR", [10] = "UNLINK", [11] = "RMDIR", [12] = "RENAME", [13] = "LINK",
        [14] = "OPEN", [15] = "READ", [16] = "WRITE", [17] = "STATFS", [18] = "RELEASE", [20] = "FSYNC",
        [21] = "SETXATTR", [22] = "GETXATTR", [23] = "LISTXATTR", [24] = "REMOVEXATTR", [25] = "FLUSH",
        [26] = "INIT", [27] = "OPENDIR", [28] = "READDIR", [29] = "RELEASEDIR", [30] = "FSYNCDIR",
        [31] = "GETLK", [32] = "SETLK", [33] = "SETLKW", [34] = "ACCESS", [35] = "CREATE", [36] = "INTERRUPT",
        [37] = "BMAP", [38] = "DESTROY", [39] = "IOCTL", [40] = "POLL", [41] = "NOTIFY_REPLY",
        [42] = "BATCH_FORGET", [43] = "FALLOCATE", [44] = "READDIRPLUS", [45] = "RENAME2", [46] = "LSEEK",
        [47] = "COPY_FILE_RANGE", [48] = "SETUPMAPPING", [49] = "REMOVEMAPPING", [50] = "SYNCFS",
        [51] = "TMPFILE", [52] = "STATX",
};

void kfs_count_request(struct kfs *fs, uint32_t opcode, uint32_t pid)
{
        pid_t own = atomic_load_explicit(&fs->refresh.child, memory_order_relaxed);
        unsigned slot = own && pid == (uint32_t)own ? KFS_OPCODE_OWN
                        : opcode < KFS_OPCODE_OWN   ? opcode
                                                    : KFS_OPCODES - 1;
        atomic_fetch_add_explicit(&fs->requests[slot], 1, memory_order_relaxed);
}

int kfs_requests_text(struct kfs *fs, char *buf, size_t size)
{
        size_t len = 0;
        for (unsigned op = 0; op < KFS_OPCODES; op++) {
                uint64_t n = atomic_load_explicit(&fs->requests[op], memory_order_relaxed);
                if (!n)
                        continue;
                char other[16];
                if (!OPNAMES[op])
                        snprintf(other, sizeof(other),
                                 op == KFS_OPCODES - 1 ? "OTHER" : op == KFS_OPCODE_OWN ? "OWN" : "OP%u", op);
                int w = snprintf(buf + (len < size ? len : size), len < size ? size - len : 0, "%s%s %" PRIu64,
                                 len ? " " : "", OPNAMES[op] ? OPNAMES[op] : other, n);
                if (w < 0)
                        return w;
                len += (size_t)w;
        }
        return (int)len;
}

/* Whether the request in buf (n bytes) is an INTERRUPT for a request answered without libfuse: kept from
 * libfuse (direct.c, INTERRUPT). */
static bool direct_interrupt(struct kfs *fs, const void *buf, ssize_t n)
{
        const struct fk_in_header *h = buf;
        uint64_t unique;
        if (n < (ssize_t)(sizeof(*h) + sizeof(unique)) || h->opcode != FK_INTERRUPT)
                return false;
        memcpy(&unique, h + 1, sizeof(unique));
        return kfs_direct_owns(fs, unique);
}

static ssize_t dev_read(int fd, void *buf, size_t len, void *ud)
{
        struct kfs *fs = ud;
        ssize_t n;
        for (;;) {
                n = read(fd, buf, len);
                if (n >= (ssize_t)sizeof(struct fk_in_header))
                        kfs_count_request(fs, ((const struct fk_in_header *)buf)->opcode,
                                          ((const struct fk_in_header *)buf)->pid);
                if (!direct_interrupt(fs, buf, n))
                        break;
                atomic_fetch_add_explicit(&fs->direct_interrupts, 1, memory_order_relaxed);
        }
        if (n >= (ssize_t)(sizeof(struct fk_in_header) + sizeof(struct fk_init_in)) && !fs->devio.init_seen) {
                const struct fk_in_header *h = buf;
                if (h->opcode == FK_INIT) {
                        const struct fk_init_in *in = (const void *)(h + 1);
                        bool ext = in->flags & FK_INIT_EXT;
                        fs->devio.offers_pt = ext && (in->flags2 & FK_PASSTHROUGH_FLAGS2);
                        fs->devio.offers_ring = ext && (in->flags2 & FK_OVER_IO_URING_FLAGS2);
                        fs->devio.offers_killpriv2 = in->flags & FK_HANDLE_KILLPRIV_V2;
                        fs->devio.init_unique = h->unique;
                        fs->devio.init_seen = true; /* INIT is the first request, read before any other thread runs */
                }
        }
        return n;
}

/* INIT's reply: a header and fuse_init_out. */
static ssize_t init_reply(struct kfs *fs, int fd, struct iovec *iov, int count)
{
        fs->devio.init_done = true;
        struct fk_init_out o;
        const struct fk_out_header *h = iov[0].iov_base;
        if (count != 2 || h->error != 0 || iov[1].iov_len < sizeof(o))
                return writev(fd, iov, count);
        memcpy(&o, iov[1].iov_base, sizeof(o));
        bool ring = kfs_ring_wanted(fs);
        if (atomic_load(&fs->pt.on)) {
                o.flags |= FK_INIT_EXT;
                o.flags2 |= FK_PASSTHROUGH_FLAGS2;
                o.max_stack_depth = 1;
        }
        if (fs->devio.offers_killpriv2)
                o.flags |= FK_HANDLE_KILLPRIV_V2;
        if (ring) {
                o.flags |= FK_INIT_EXT;
                o.flags2 |= FK_OVER_IO_URING_FLAGS2;
        }
        char body[256];
        size_t n = iov[1].iov_len < sizeof(body) ? iov[1].iov_len : sizeof(body);
        memcpy(body, iov[1].iov_base, n);
        memcpy(body, &o, sizeof(o));
        struct iovec v[2] = { iov[0], { body, n } };
        ssize_t r = writev(fd, v, 2);
        if (r >= 0 && ring) /* the kernel took INIT: registering ring entries is allowed from now on */
                kfs_ring_start(fs, o.max_write);
        return r;
}

static ssize_t dev_writev(int fd, struct iovec *iov, int count, void *ud)
{
        struct kfs *fs = ud;
        const struct fk_out_header *h = iov[0].iov_base;
        if (!fs->devio.init_done && fs->devio.init_seen && h->unique == fs->devio.init_unique)
                return init_reply(fs, fd, iov, count);
        struct iovec v[4];
        char body[256];
        const struct iovec *use = kfs_pt_amend(iov, count, v, body, sizeof(body));
        return kfs_ring_writev(fs, fd, use, count);
}

void kfs_dev_setup(struct kfs *fs)
{
        fs->devio.fd = fuse_session_fd(fs->se);
        /* No splice hooks: libfuse then splices to the fd itself, and splicing is negotiated only
         * without the rings (kfs_op_init), whose replies must go through dev_writev. */
        static const struct fuse_custom_io io = { .read = dev_read, .writev = dev_writev };
        int r = fuse_session_custom_io(fs->se, &io, fs->devio.fd);
        if (r < 0) { /* then neither passthrough nor io_uring: passthrough says so, and the transport is /dev/fuse */
                kfs_pt_off(fs, "libfuse refused the custom device I/O", -r);
                return;
        }
        fs->devio.hooked = true;
}
