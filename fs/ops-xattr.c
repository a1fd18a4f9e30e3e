/* ops-xattr.c: extended attributes. user.kcachefs.* is ours (control.c); everything else is passed
 * through to the backing inode.
 *
 * An O_PATH fd cannot carry f*xattr calls, so they go through its /proc/self/fd link, which names the
 * inode itself. Symlinks are refused (ENOTSUP): the link would be followed to its target.
 *
 * ATTRIBUTES TAKE BLOCKS. What the inode cannot hold goes to a block of its own: on ext4 with 256-byte
 * inodes, a value of a hundred bytes or so spills to an attribute block, which st_blocks counts (XFS's
 * attribute fork likewise). So setting or removing an attribute of a regular file is an allocating
 * operation like a write: room is reserved first (the value, rounded up, and a block), and the file is
 * measured after (T3), exactly. Without it, a 0-byte file given a 300-byte attribute stayed "index 0 bytes,
 * tree 1024" (4096 with 4 KiB blocks) after sync and after a clean remount, and the limit was short by as
 * much on the disk; removing the attribute left the index a block over. Directories' blocks are not the
 * cache's bytes (the index counts regular files only), so theirs are not measured. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "kfs.h"

/* Borrows in's fd (returned, for xattr_done) and writes its /proc link into buf; -errno. */
static int xattr_path(struct kfs *fs, struct kfs_inode *in, char *buf, size_t size)
{
        if (kfs_stale(in))
                return -ESTALE;
        if (S_ISLNK(in->type))
                return -ENOTSUP;
        int fd = kfs_inode_fd(fs, in);
        if (fd >= 0)
                kfs_proc_path(buf, size, fd);
        return fd;
}

#define BLK 4096ULL

int kfs_xattr_begin(struct kfs *fs, struct kfs_inode *in, size_t len, uint64_t *held)
{
        *held = 0;
        if (!S_ISREG(in->type) || !len || !fs->settle.blk) /* tmpfs keeps attributes off st_blocks */
                return 0;
        uint64_t est = (len + BLK - 1) / BLK * BLK + BLK; /* the value and its entry; the block they may open */
        int r = kev_reserve(fs, est);
        if (r == 0)
                *held = est;
        return r;
}

void kfs_xattr_end(struct kfs *fs, struct kfs_inode *in, uint64_t held)
{
        if (S_ISREG(in->type))
                kev_measure(fs, in, -1, held); /* the reservation goes, the allocation as it is now counts */
}

/* getxattr/listxattr share the size protocol: size 0 asks for the length; too small is ERANGE. */
static void reply_value(fuse_req_t req, size_t size, const char *val, ssize_t n)
{
        if (n < 0)
                fuse_reply_err(req, (int)-n);
        else if (size == 0)
                fuse_reply_xattr(req, (size_t)n);
        else if ((size_t)n > size)
                fuse_reply_err(req, ERANGE);
        else
                fuse_reply_buf(req, val, (size_t)n);
}

void kfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        if (kfs_ctl_is_ours(name)) {
                char val[4096];
                int r = kfs_stale(in) ? -ESTALE : S_ISLNK(in->type) ? -ENOTSUP : 0;
                reply_value(req, size, val, r < 0 ? r : kfs_ctl_get(req, fs, in, name, val, sizeof(val)));
                return;
        }
        char path[64];
        int fd = xattr_path(fs, in, path, sizeof(path));
        if (fd < 0) {
                fuse_reply_err(req, -fd);
                return;
        }
        char *buf = size ? malloc(size) : NULL;
        ssize_t n = size && !buf ? -ENOMEM : getxattr(path, name, buf, size);
        if (n < 0 && n != -ENOMEM)
                n = -errno;
        kfs_inode_fd_put(fs, in, fd);
        reply_value(req, size, buf, n);
        free(buf);
}

void kfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        char path[64];
        int fd = xattr_path(fs, in, path, sizeof(path));
        if (fd < 0) {
                fuse_reply_err(req, -fd);
                return;
        }
        char *buf = NULL;
        ssize_t n = listxattr(path, NULL, 0);
        size_t cap = n < 0 ? 0 : (size_t)n + kfs_ctl_list(fs, in, NULL, 0) + 1;
        if (n >= 0 && !(buf = malloc(cap)))
                n = -1, errno = ENOMEM;
        if (n >= 0)
                n = listxattr(path, buf, cap);
        int e = errno;
        kfs_inode_fd_put(fs, in, fd);
        if (n < 0) {
                free(buf);
                fuse_reply_err(req, e);
                return;
        }
        /* Backing names first, without any user.kcachefs.* that a copy may have brought along. */
        size_t len = 0;
        for (ssize_t i = 0; i < n;) {
                size_t l = strlen(buf + i) + 1;
                if (!kfs_ctl_is_ours(buf + i)) {
                        memmove(buf + len, buf + i, l);
                        len += l;
                }
                i += (ssize_t)l;
        }
        len += kfs_ctl_list(fs, in, buf + len, cap - len);
        reply_value(req, size, buf, (ssize_t)len);
        free(buf);
}

void kfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        char path[64];
        int r = kfs_stale(in) ? -ESTALE : S_ISLNK(in->type) ? -ENOTSUP : 0;
        if (r == 0 && kfs_ctl_is_ours(name)) {
                r = kfs_ctl_set(req, fs, in, name, value, size);
        } else if (r == 0) {
                uint64_t held;
                r = kfs_xattr_begin(fs, in, strlen(name) + size, &held);
                int fd = r < 0 ? r : xattr_path(fs, in, path, sizeof(path));
                if (fd >= 0) {
                        r = setxattr(path, name, value, size, flags) < 0 ? -errno : 0;
                        kfs_inode_fd_put(fs, in, fd);
                } else {
                        r = fd;
                }
                if (held || r == 0)
                        kfs_xattr_end(fs, in, held);
        }
        fuse_reply_err(req, -r);
}

void kfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        char path[64];
        int r = kfs_stale(in) ? -ESTALE : S_ISLNK(in->type) ? -ENOTSUP : 0;
        if (r == 0 && kfs_ctl_is_ours(name)) {
                r = kfs_ctl_remove(req, fs, in, name);
        } else if (r == 0) {
                int fd = r = xattr_path(fs, in, path, sizeof(path));
                if (fd >= 0) {
                        r = removexattr(path, name) < 0 ? -errno : 0;
                        kfs_inode_fd_put(fs, in, fd);
                }
                if (r == 0)
                        kfs_xattr_end(fs, in, 0); /* its block may be free now */
        }
        fuse_reply_err(req, -r);
}
