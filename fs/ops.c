/* ops.c: the operations table and the session's capabilities. Nothing else lives here. */
#include "kfs.h"

void kfs_op_init(void *ud, struct fuse_conn_info *conn)
{
        struct kfs *fs = ud;
        fs->no_opendir = conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT;
        kfs_ring_init(fs); /* before the splice choice below, which the rings exclude */
        kfs_kprune_init(fs, conn->proto_minor);
        kfs_settings_thread(fs); /* SIGHUP's reader, now that a worker runs (settings.c) */
        /* Splice file data straight from the backing file to /dev/fuse on reads; not with io_uring, whose
         * replies go into a ring entry's buffer (ring.c). */
        if ((conn->capable & FUSE_CAP_SPLICE_WRITE) && !kfs_ring_wanted(fs))
                conn->want |= FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE;
        if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
                conn->want |= FUSE_CAP_PARALLEL_DIROPS;
        if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
                conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
        if (conn->capable & FUSE_CAP_READDIRPLUS)
                conn->want |= FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO;
        /* flock() is taken on the backing file (kfs_op_flock), so the runtimes' locks (NEO's config.file,
         * JAX's .lockfile) and the daemon's own, taken before it repairs their bookkeeping, are one lock
         * domain. fcntl() record locks stay in the kernel: they work between all processes of the node,
         * which is the scope of the cache, and cost no round trip. */
        if (conn->capable & FUSE_CAP_FLOCK_LOCKS)
                conn->want |= FUSE_CAP_FLOCK_LOCKS;
        conn->want &= ~(unsigned)FUSE_CAP_POSIX_LOCKS;
        /* Every change goes through this mount, so cached pages and attributes stay right without the
         * kernel re-checking attributes on every read (a GETATTR per hit, since releases invalidate atime).
         * Opens decide keep_cache themselves; eviction invalidates directory listings explicitly. */
        conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
        /* Write-through: a write fails with ENOSPC in the syscall that crosses the limit, not at close. */
        conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
        /* 1 MiB: one request per write(2) of up to 1 MiB, so that such a write that cannot fit fails
         * whole with ENOSPC before anything is evicted, instead of evicting through its first chunks. */
        conn->max_write = 1024 * 1024;
        /* Cold reads of 1 MiB kernels in one request instead of eight. */
        conn->max_readahead = 1024 * 1024;
        /* RELEASE is a background request, and the kernel keeps at most max_background of those queued
         * (12 by default): under many readers, OPENs then outpace RELEASEs and each unreleased handle holds
         * one of our fds (64 readers under the ASan daemon ran it out of descriptors). */
        conn->max_background = 1024;
        conn->congestion_threshold = 768;
        kfs_pt_init(fs);
}

void kfs_op_destroy(void *ud)
{
        (void)ud;
}

const struct fuse_lowlevel_ops kfs_ops = {
        .init = kfs_op_init,
        .destroy = kfs_op_destroy,
        .lookup = kfs_op_lookup,
        .forget = kfs_op_forget,
        .forget_multi = kfs_op_forget_multi,
        .getattr = kfs_op_getattr,
        .setattr = kfs_op_setattr,
        .readlink = kfs_op_readlink,
        .mknod = kfs_op_mknod,
        .mkdir = kfs_op_mkdir,
        .unlink = kfs_op_unlink,
        .rmdir = kfs_op_rmdir,
        .symlink = kfs_op_symlink,
        .rename = kfs_op_rename,
        .link = kfs_op_link,
        .open = kfs_op_open,
        .read = kfs_op_read,
        .write_buf = kfs_op_write_buf,
        .flush = kfs_op_flush,
        .release = kfs_op_release,
        .fsync = kfs_op_fsync,
        .opendir = kfs_op_opendir,
        .readdir = kfs_op_readdir,
        .readdirplus = kfs_op_readdirplus,
        .releasedir = kfs_op_releasedir,
        .fsyncdir = kfs_op_fsyncdir,
        .statfs = kfs_op_statfs,
        .setxattr = kfs_op_setxattr,
        .getxattr = kfs_op_getxattr,
        .listxattr = kfs_op_listxattr,
        .removexattr = kfs_op_removexattr,
        .access = kfs_op_access,
        .create = kfs_op_create,
        .fallocate = kfs_op_fallocate,
        .lseek = kfs_op_lseek,
        .flock = kfs_op_flock,
};
