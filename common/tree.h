/* tree.h: the only door to the backing tree.
 *
 * THE THREAT. On a shared node the daemon runs as root inside directories that other users write,
 * through the mount (their runtimes create, rename and symlink there). Any name the daemon resolves may
 * be swapped for a symlink, or for a directory on another filesystem, between two of its system calls.
 * A root process that resolves "a/b/c" by a path string from the root can so be steered to rewrite or
 * delete any file on the machine: the class of bug cleanup daemons running as root have had for decades
 * (tmpwatch, systemd-tmpfiles before chase(), logrotate).
 *
 * THE RULE. Every operation on the tree goes through this file, and every one of them:
 *   R1  resolves beneath a descriptor the caller holds on a directory of the tree (the root's, or one
 *       reached from it through this file), never from "/" or the working directory;
 *   R2  follows no symlink, of any component: a symlink is only ever the object itself (O_PATH|O_NOFOLLOW);
 *   R3  never leaves the backing filesystem (no mount point is crossed: every object reached has the
 *       root's st_dev) and never climbs ("..", absolute paths: -EXDEV);
 *   R4  before it removes a name, checks that the name still holds the object the caller meant (device and
 *       inode), and answers -ESTALE when it does not (ktree_unlink says what that check can and cannot
 *       exclude).
 * The kernel's openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) does
 * R1-R3 in one call; where the kernel lacks it (before 5.6) a walk of single components with O_NOFOLLOW and
 * an st_dev check at each does the same. Deferred work (repairs, prunes) keeps identities, never paths, and
 * comes back here to resolve them (ktree_walk: each component checked against the inode the index holds).
 *
 * THE DOOR. No file of the daemon, the index or the CLI calls openat, openat2, unlinkat, renameat, mkdirat,
 * symlinkat, mknodat or linkat itself: tests/check-tree-door greps for them in CI. What is not checked here
 * is which directory a caller holds; that it came from this file is what the grep keeps true.
 *
 * Every function returns a descriptor or 0 on success and -errno on failure; none keeps state; all are
 * thread-safe. Descriptors are O_CLOEXEC. */
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

struct ktree {
        int root;  /* O_RDONLY|O_DIRECTORY on the backing root, held for the tree's life */
        dev_t dev; /* the root's st_dev: every object of the tree has it (R3) */
};

/* Opens the backing root PATH as given by the operator (symlinks in it are the operator's choice) and
 * fills t. -errno as open(2); -ENOTDIR. */
int ktree_init(struct ktree *t, const char *path);
/* Fills t from a root descriptor the caller keeps open. */
int ktree_init_fd(struct ktree *t, int root);
void ktree_close(struct ktree *t);

/* Opens REL beneath directory DFD (KTREE_ROOT: the root; REL "" or ".": DFD itself) with FLAGS (O_NOFOLLOW
 * and O_CLOEXEC added) and MODE. -ELOOP: a component is a symlink (the last one too, unless O_PATH);
 * -EXDEV: REL climbs out or crosses a mount; other -errno as openat(2). */
#define KTREE_ROOT (-100)
int ktree_open(const struct ktree *t, int dfd, const char *rel, int flags, mode_t mode);
/* ktree_open for the daemon's own use of a file that a user named (a runtime's lock or size file, a lock
 * file it may reap): a regular file only. Opened with O_NONBLOCK, so that a FIFO a user put there never
 * blocks the daemon (open(2) of a FIFO waits for its other end, under whatever lock the caller holds);
 * O_NONBLOCK is cleared again on the regular file returned. -ENXIO: not a regular file (a FIFO, a socket,
 * a device); other -errno as ktree_open. */
int ktree_open_file(const struct ktree *t, int dfd, const char *rel, int flags, mode_t mode);
/* ktree_open(O_PATH) of REL beneath DFD from what the kernel has cached only (openat2's RESOLVE_CACHED,
 * Linux 5.12+): a name it would have to look up, or revalidate, fails with -EAGAIN instead. On a FUSE mount
 * this is a resolution that sends no request (fs/refresh.c, whose child resolves names in the daemon's own
 * mount). No fallback walk: -ENOSYS or -EINVAL where the kernel lacks it; other -errno as ktree_open. */
int ktree_open_cached(const struct ktree *t, int dfd, const char *rel);
/* The mount on NAME, one component in directory DFD (a mount point's directory, outside any tree), as
 * O_PATH: no symlink, nothing beneath climbing out, but onto whatever is mounted there (fs/ring.c's nudges
 * reach the daemon's own mount so, then check its device). -ELOOP: a symlink; other -errno as openat2(2). */
int ktree_open_mount(int dfd, const char *name);
/* ktree_open(O_PATH) and fstat: the object itself, never a symlink's target. */
int ktree_stat(const struct ktree *t, int dfd, const char *rel, struct stat *st);
/* A directory stream on REL beneath DFD (ktree_open with O_RDONLY|O_DIRECTORY). NULL with errno set. */
DIR *ktree_opendir(const struct ktree *t, int dfd, const char *rel);

/* The directory reached from the root through NAMES[0..N) (one component each, from the root down), each
 * of which must be the directory of inode INOS[i] on the tree's device: R4 for a whole path. -ESTALE when a
 * component holds another object, -ENOENT when it is gone. FLAGS as for ktree_open (O_DIRECTORY added). */
int ktree_walk(const struct ktree *t, size_t n, const char *const *names, const uint64_t *inos, int flags);

/* True when A and B are the same object (device and inode). */
static inline bool ktree_same(const struct stat *a, const struct stat *b)
{
        return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The functions below take one name NAME in directory DFD (no '/', not "." or ".."; -EINVAL otherwise). */

/* Removes NAME (AT_REMOVEDIR in FLAGS for a directory). When EXPECT is given, only if NAME holds that object
 * (R4): -ESTALE otherwise. The check and the removal are two calls: a rename into DFD between them is not
 * seen, so callers that must exclude it hold the directory's name lock (fs/kfs.h, name_locks) around both,
 * as every rename through the mount takes it; what the check excludes for good is removing an object the
 * caller never meant through a path that changed before it (R1-R3 keep both calls inside the tree). */
int ktree_unlink(const struct ktree *t, int dfd, const char *name, const struct stat *expect, int flags);
/* Removes NAME only if it is still inode INO of the tree (R4, for callers that hold the index's number). */
int ktree_unlink_ino(const struct ktree *t, int dfd, const char *name, uint64_t ino, int flags);
int ktree_rename(const struct ktree *t, int ofd, const char *oname, int nfd, const char *nname, unsigned flags);
int ktree_mkdir(const struct ktree *t, int dfd, const char *name, mode_t mode);
int ktree_symlink(const struct ktree *t, const char *target, int dfd, const char *name);
int ktree_mknod(const struct ktree *t, int dfd, const char *name, mode_t mode, dev_t rdev);
/* A new name NNAME in NFD for the object FD (an O_PATH descriptor of a regular file or symlink of the
 * tree): linkat through /proc/self/fd, which never follows a symlink the object may be. */
int ktree_link(const struct ktree *t, int fd, int nfd, const char *nname);
/* Outside any tree: the directory PATH that an operator typed (kcache stats -o FILE's), opened by a walk
 * from "/" (or the working directory) one component at a time, for a caller acting as UID (often root) in
 * directories that other users may write. Like systemd's chase(CHASE_SAFE): a symbolic link is followed
 * only when it belongs to root or UID, and the walk enters a directory that another user owns, or that
 * others may write (unless sticky), only as the last step, where nothing more is resolved: nobody else
 * can redirect the walk, and what it reaches is held open (O_RDONLY|O_DIRECTORY), so a later swap of the
 * path changes nothing. Returns the descriptor, or -errno (-EACCES: refused) with WHY (LEN bytes) saying
 * which component and why, in words. */
int ktree_chase_dir(const char *path, uid_t uid, char *why, size_t len);
/* True when NAME is one component: not empty, no '/', not "." or "..". */
bool ktree_name_ok(const char *name);
/* Tests only: resolve by the per-component walk, as on a kernel without openat2 (on), or as usual. */
void ktree__force_walk(bool on);
