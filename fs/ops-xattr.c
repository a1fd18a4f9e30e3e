/* ops-xattr.c: extended attributes, passed through to the backing inode.
 *
 * An O_PATH fd cannot carry f*xattr calls, so they go through its /proc/self/fd link, which names the
 * inode itself. Symlinks are refused (ENOTSUP): the link would be followed to its target. */
#include <errno.h>
#include <stdlib.h>
#include <sys/xattr.h>

#include "kfs.h"

static int xattr_path(fuse_req_t req, fuse_ino_t ino, char *buf, size_t size)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        if (kfs_stale(in))
                return -ESTALE;
        if (S_ISLNK(in->type))
                return -ENOTSUP;
        kfs_proc_path(buf, size, in->fd);
        return 0;
}

/* Replies to getxattr/listxattr, which share the size protocol: size 0 asks for the length. */
static void reply_sized(fuse_req_t req, size_t size, ssize_t (*get)(const char *, const char *, void *, size_t),
                        const char *path, const char *name)
{
        if (size == 0) {
                ssize_t n = get(path, name, NULL, 0);
                if (n < 0)
                        fuse_reply_err(req, errno);
                else
                        fuse_reply_xattr(req, (size_t)n);
                return;
        }
        char *buf = malloc(size);
        if (!buf) {
                fuse_reply_err(req, ENOMEM);
                return;
        }
        ssize_t n = get(path, name, buf, size);
        if (n < 0)
                fuse_reply_err(req, errno);
        else
                fuse_reply_buf(req, buf, (size_t)n);
        free(buf);
}

static ssize_t get_one(const char *path, const char *name, void *buf, size_t size)
{
        return getxattr(path, name, buf, size);
}

static ssize_t list_all(const char *path, const char *name, void *buf, size_t size)
{
        (void)name;
        return listxattr(path, buf, size);
}

void kfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
        char path[64];
        int r = xattr_path(req, ino, path, sizeof(path));
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                reply_sized(req, size, get_one, path, name);
}

void kfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
        char path[64];
        int r = xattr_path(req, ino, path, sizeof(path));
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                reply_sized(req, size, list_all, path, NULL);
}

void kfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags)
{
        char path[64];
        int r = xattr_path(req, ino, path, sizeof(path));
        if (r == 0 && setxattr(path, name, value, size, flags) < 0)
                r = -errno;
        fuse_reply_err(req, -r);
}

void kfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
        char path[64];
        int r = xattr_path(req, ino, path, sizeof(path));
        if (r == 0 && removexattr(path, name) < 0)
                r = -errno;
        fuse_reply_err(req, -r);
}
