/* passthrough.c: kernel FUSE passthrough for read-only opens (Linux 6.9+, a root daemon).
 *
 * WHY. In passthrough mode the kernel reads the backing file itself: no READ requests for what the FUSE
 * page cache does not hold, no FUSE page cache (one copy of each file in memory instead of two), and no
 * size check at the end of the file. A warm hit costs OPEN and RELEASE in either mode when the kernel
 * holds the inode's attributes (the access log's invalidation comes at RELEASE: ops-io.c, ATIME). The
 * kernel invalidates atime alone after each passthrough read, and the next stat asks for it, so st_atime
 * stays the logged last access.
 *
 * HOW, WITH LIBFUSE 3.14. Debian 12's libfuse predates passthrough (3.16), but the kernel protocol is
 * simple: INIT's reply asks for FUSE_PASSTHROUGH (devio.c, our own device I/O), and OPEN's and CREATE's
 * replies carry FOPEN_PASSTHROUGH and a backing id, which the handler leaves in a thread-local right
 * before it replies (a handler replies from its own thread, synchronously) and kfs_pt_amend puts in;
 * an OPEN answered on a ring without libfuse (direct.c) gets them from kfs_pt_fill, as the amend does.
 * Backing files are registered with the FUSE_DEV_IOC_BACKING_OPEN ioctl, which needs CAP_SYS_ADMIN: an
 * unprivileged daemon, or a kernel without passthrough, runs in the page-cache mode, as before.
 *
 * THE KERNEL'S RULE, AND WRITERS. An inode is in one I/O mode at a time: while any file of it is open in
 * passthrough mode every new open must be a passthrough one with the same backing file, and while one is
 * open in the page-cache mode no passthrough open may start (either mistake fails the application's
 * open with EIO). Writes must keep going through the daemon, which reserves space and evicts before each
 * one (evict/); so:
 *   - a read-only open of an inode with no page-cache open gets passthrough (registering its backing);
 *   - a writer gets the page-cache mode, unless the inode is in passthrough mode already: then it gets
 *     FOPEN_PASSTHROUGH | FOPEN_DIRECT_IO, for which the kernel sends reads and writes to the daemon and
 *     maps the backing file for mmap. A new file's write-only handle from CREATE is direct
 *     (FOPEN_DIRECT_IO alone, ops-io.c CREATED FILES), which the kernel counts in neither mode; it is
 *     counted here as a page-cache open all the same, so readers meanwhile get the page-cache mode;
 *   - a reader of an inode open for writing in the page-cache mode gets that mode too.
 * Our counts (per inode, under in->lock) drop when RELEASE arrives, after the kernel dropped its own, so
 * they never undercount what the kernel holds: each rule above is kept whatever the interleaving.
 *
 * A backing file stays registered while the kernel knows the inode, so that the next open of a file
 * read again costs no ioctl; the registration holds the file open, so it goes when the kernel forgets
 * the inode and when eviction removes the file (whose blocks it would keep allocated).
 *
 * What passthrough costs: reads of passthrough files no longer reach the daemon, so the per-file
 * bytes_read counts only what the daemon served (as page-cache hits already did). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuse-kernel.h"
#include "kfs.h"

/* Set by a handler right before it replies, consumed by our writev in the same thread. */
static __thread int32_t reply_backing_id;

/* Records why passthrough is off (the first reason wins) and says so on stderr if say. */
static void turn_off(struct kfs *fs, bool say, const char *why, int err)
{
        atomic_store(&fs->pt.on, false);
        pthread_mutex_lock(&fs->pt.lock);
        if (!fs->pt.why[0])
                snprintf(fs->pt.why, sizeof(fs->pt.why), "%s%s%s", why, err ? ": " : "", err ? strerror(err) : "");
        else
                say = false;
        pthread_mutex_unlock(&fs->pt.lock);
        if (say)
                kfs_log(LOG_NOTICE, "kernel passthrough off (%s); reads go through the page cache", fs->pt.why);
}

void kfs_pt_off(struct kfs *fs, const char *why, int err)
{
        turn_off(fs, true, why, err);
}

const struct iovec *kfs_pt_amend(const struct iovec *iov, int count, struct iovec v[4], char *body, size_t size)
{
        /* OPEN's reply is fuse_open_out; CREATE's ends with it. */
        size_t last = count >= 2 ? iov[count - 1].iov_len : 0;
        int32_t id = reply_backing_id;
        if (!id)
                return iov;
        reply_backing_id = 0;
        if (count < 2 || count > 4 || last > size || last < sizeof(struct fk_open_out) ||
            ((const struct fk_out_header *)iov[0].iov_base)->error != 0)
                return iov;
        memcpy(v, iov, sizeof(*v) * (size_t)count);
        memcpy(body, iov[count - 1].iov_base, last);
        v[count - 1].iov_base = body;
        kfs_pt_fill((void *)(body + last - sizeof(struct fk_open_out)), id);
        return v;
}

void kfs_pt_fill(struct fk_open_out *o, int32_t backing_id)
{
        o->open_flags = (o->open_flags & ~FK_FOPEN_KEEP_CACHE) | FK_FOPEN_PASSTHROUGH;
        o->backing_id = backing_id;
}

void kfs_pt_setup(struct kfs *fs)
{
        pthread_mutex_init(&fs->pt.lock, NULL);
        fs->inode_gone = kfs_pt_forget; /* inode.c calls it: the registration goes with the inode */
        if (fs->o.nopassthrough)
                turn_off(fs, false, "-o nopassthrough", 0);
        else if (geteuid() != 0)
                turn_off(fs, true, "the daemon is not root (the kernel's backing-file ioctl needs CAP_SYS_ADMIN)", 0);
        else
                fs->pt.wanted = true;
}

void kfs_pt_init(struct kfs *fs)
{
        if (!fs->pt.wanted || !fs->devio.hooked)
                return; /* off, and why was said */
        if (!fs->devio.offers_pt) {
                turn_off(fs, true, "the kernel does not offer it (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)", 0);
                return;
        }
        atomic_store(&fs->pt.on, true);
}

static int backing_open(struct kfs *fs, int fd)
{
        struct fk_backing_map m = { .fd = fd };
        int id = ioctl(fs->devio.fd, FK_IOC_BACKING_OPEN, &m);
        if (id > 0)
                return id;
        int e = id < 0 ? errno : EINVAL;
        /* The connection cannot do it at all, or no file of this backing directory can (ELOOP: it is on
         * a stacking filesystem such as overlayfs; the backing directory is one filesystem). Anything
         * else is this file's: it stays in the page-cache mode. */
        if (e == EPERM || e == ENOTTY || e == EINVAL || e == EOPNOTSUPP || e == ENOSYS || e == ELOOP)
                turn_off(fs, true, "registering a backing file failed", e);
        return -e;
}

int32_t kfs_pt_open(struct kfs *fs, struct kfs_inode *in, int *fd, int flags, bool writer)
{
        int32_t id = 0;
        pthread_mutex_lock(&in->lock);
        int32_t have = atomic_load(&in->pt_id);
        if (in->pt_opens > 0) {
                /* Every open of an inode in passthrough mode must be one, with the same backing file. (No
                 * id left: eviction removed the file under these opens; this open, racing with it, gets
                 * the page-cache mode and the kernel fails it, as it would have failed with ESTALE.) */
                id = have;
        } else if (!writer && in->cached_opens == 0 && atomic_load(&fs->pt.on)) {
                if (have <= 0 && *fd < 0) {
                        int r = kfs_inode_open(fs, in, flags);
                        *fd = r < 0 ? -1 : r;
                }
                int r = have > 0 ? have : *fd >= 0 ? backing_open(fs, *fd) : 0; /* kept, or registered now */
                if (r > 0)
                        id = r;
        }
        if (id > 0 && id != have)
                atomic_store(&in->pt_id, id);
        if (id) {
                in->pt_opens++;
                if (writer)
                        in->cache_ok = false; /* its writes bypass the FUSE page cache of earlier opens */
        } else {
                in->cached_opens++;
        }
        pthread_mutex_unlock(&in->lock);
        if (id)
                atomic_fetch_add(&fs->pt.opens, 1);
        return id;
}

void kfs_pt_reply_next(int32_t backing_id)
{
        reply_backing_id = backing_id;
}

void kfs_pt_release(struct kfs *fs, struct kfs_inode *in, bool passthrough)
{
        (void)fs;
        pthread_mutex_lock(&in->lock);
        if (passthrough)
                in->pt_opens--;
        else
                in->cached_opens--;
        pthread_mutex_unlock(&in->lock);
}

void kfs_pt_forget(struct kfs *fs, struct kfs_inode *in)
{
        uint32_t id = (uint32_t)atomic_exchange(&in->pt_id, 0);
        if (id > 0)
                (void)ioctl(fs->devio.fd, FK_IOC_BACKING_CLOSE, &id);
}

const char *kfs_pt_state(struct kfs *fs, char *buf, size_t size)
{
        if (atomic_load(&fs->pt.on))
                return "on";
        pthread_mutex_lock(&fs->pt.lock);
        snprintf(buf, size, "off: %s", fs->pt.why[0] ? fs->pt.why : "not negotiated yet");
        pthread_mutex_unlock(&fs->pt.lock);
        return buf;
}
