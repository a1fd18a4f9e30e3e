/* ops-entry.c: names and attributes: lookup, getattr, setattr, readdir, statfs, access, and the
 * namespace operations (mknod, mkdir, symlink, link, unlink, rmdir, rename).
 *
 * Every handler replies exactly once; helpers return -errno and the sign flips at the reply.
 * Namespace changes are told to the index (kidx_*_dent, kidx_del_file) after the backing call succeeded,
 * so the index never records what did not happen. A removed file stops counting with what its row holds
 * (kidx I3). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kfs.h"
#include "remote/remote.h"

void kfs_fix_attr(const struct kfs_inode *in, struct stat *st)
{
        if (S_ISREG(st->st_mode)) {
                int64_t a = atomic_load(&in->atime_ns);
                st->st_atim.tv_sec = a / 1000000000LL;
                st->st_atim.tv_nsec = a % 1000000000LL;
        } else {
                /* Only regular files count towards the cache's size, so du of the mount equals df's used. */
                st->st_blocks = 0;
        }
}

/* e->attr holds in's backing stat; in has the lookup reference e gives the kernel. */
static void fill_entry(struct kfs *fs, struct kfs_inode *in, struct fuse_entry_param *e)
{
        atomic_store(&in->attr_cached, true); /* before the atime is read: a RELEASE in between sees it */
        kfs_fix_attr(in, &e->attr);
        e->ino = (fuse_ino_t)(uintptr_t)in;
        e->attr_timeout = e->entry_timeout = fs->o.timeout;
}

int kfs_do_lookup(struct kfs *fs, struct kfs_inode *dir, const char *name, struct fuse_entry_param *e)
{
        if (kfs_hidden(fs, dir, name))
                return -ENOENT;
        if (kfs_stale(dir))
                return -ESTALE; /* eviction removed the directory (evict/prune.c, EMPTIED DIRECTORIES) */
        kfs_dir_named(dir);
        memset(e, 0, sizeof(*e));
        int dfd = kfs_inode_fd(fs, dir), r;
        if (dfd < 0)
                return dfd;
        for (int tries = 0;; tries++) {
                if (fstatat(dfd, name, &e->attr, AT_SYMLINK_NOFOLLOW) < 0) {
                        r = -errno;
                        break;
                }
                if (e->attr.st_dev != fs->tree.dev) {
                        r = -EXDEV; /* a mount inside the backing directory is not part of the cache */
                        break;
                }
                struct kfs_inode *in;
                r = kfs_inode_ref(fs, dir, dfd, name, &e->attr, -1, &in);
                if (r == -ESTALE && tries < 8)
                        continue;
                if (r == 0)
                        fill_entry(fs, in, e);
                break;
        }
        kfs_inode_fd_put(fs, dir, dfd);
        return r;
}

int kfs_entry_of_fd(struct kfs *fs, struct kfs_inode *dir, const char *name, int fd, const struct stat *st,
                    struct fuse_entry_param *e)
{
        char proc[64];
        kfs_proc_path(proc, sizeof(proc), fd);
        int pfd;
        KFS_RETRY_FDS(fs, pfd, kfs_open_errno(proc, O_PATH | O_CLOEXEC)); /* the same inode, whatever its name holds now */
        if (pfd < 0)
                return pfd;
        memset(e, 0, sizeof(*e));
        e->attr = *st;
        struct kfs_inode *in;
        int r = kfs_inode_ref(fs, dir, -1, name, st, pfd, &in); /* by its fd: the directory is not needed */
        if (r < 0)
                return r;
        fill_entry(fs, in, e);
        struct stat now;
        if (fstat(fd, &now) == 0 && now.st_nlink == 0)
                e->entry_timeout = 0; /* removed already (see kfs_inode_ref): the kernel must not keep the name */
        return 0;
}

static void forget_name_of_file(struct kfs *fs, const struct stat *st);

/* STALE LOCKS (-o stale_locks). Runtimes that lock by creating a file with O_EXCL and removing it when
 * done (torch extensions' `lock`, PyOpenCL's, SYCL's <n>.lock) leave it behind when killed, and every
 * later process waits for it to go: torch extensions forever. Only the filesystem knows who made a lock
 * file: the process that created it through the mount (its pid and start time, so that a later process
 * given the same pid is not taken for it). When a lock file is looked up (the waiters poll for it) and
 * its creator has exited, nobody has it open through the mount, and nobody holds a flock on it, it is
 * removed, said on stderr (syslog when detached), and the lookup misses. A lock made before this daemon
 * started, or by the daemon itself, has no known creator and is never removed. Returns true if it went. */
static bool remove_stale_lock(struct kfs *fs, struct kfs_inode *dir, const char *name, struct kfs_inode *in)
{
        if (!fs->o.stale_locks || !krt_is_lock_name(name) || !S_ISREG(in->type) || !in->creator ||
            !in->creator_start || kfs_proc_start(in->creator) == in->creator_start)
                return false;
        pthread_mutex_lock(&fs->itable_lock);
        bool open = in->readers || in->writers;
        pthread_mutex_unlock(&fs->itable_lock);
        int dfd = open ? -1 : kfs_inode_fd(fs, dir);
        if (dfd < 0)
                return false;
        bool gone = false;
        int fd = ktree_open_file(&fs->tree, dfd, name, O_RDONLY, 0); /* a FIFO swapped in never blocks us */
        struct stat st;
        /* still that file, and no flock on it (through the mount or beside it): ours is dropped at close */
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_ino == in->bino && flock(fd, LOCK_EX | LOCK_NB) == 0) {
                int hold = ktree_open(&fs->tree, dfd, name, O_PATH, 0); /* not fd: it has our flock */
                if (hold >= 0)
                        kfs_inode_unnamed(fs, &st, dir, name, hold); /* (inode.c, DESCRIPTORS) */
                kfs_names_lock(fs, dir->bino, dir->bino);
                gone = ktree_unlink(&fs->tree, dfd, name, &st, 0) == 0;
                kfs_names_unlock(fs, dir->bino, dir->bino);
                if (hold >= 0)
                        close(hold);
        }
        if (gone) {
                kidx_del_dent(fs->idx, dir->bino, name);
                if (fstat(fd, &st) == 0) /* its names now */
                        forget_name_of_file(fs, &st);
                kfs_log(LOG_NOTICE, "removed the stale lock '%s' (its creator, pid %d, has exited)", name,
                        (int)in->creator);
        }
        if (fd >= 0)
                kfs_flock_let_go(fd); /* and our flock, if taken */
        kfs_inode_fd_put(fs, dir, dfd);
        return gone;
}

/* The reply to a lookup of name in dir whose result is r (e filled when 0). A miss is cached by the kernel
 * for neg_timeout, or never where users.c says so. */
static void reply_lookup(fuse_req_t req, struct kfs *fs, struct kfs_inode *dir, const char *name, int r,
                         struct fuse_entry_param *e, double neg_timeout)
{
        if (r == -ENOENT && kfs_users_uncached(fs, dir, name)) {
                fuse_reply_err(req, ENOENT); /* a miss the kernel never caches (users.c, U4) */
        } else if (r == -ENOENT) {
                /* A negative entry: the kernel caches the miss until a create through the mount. */
                memset(e, 0, sizeof(*e));
                e->entry_timeout = neg_timeout;
                fuse_reply_entry(req, e);
        } else if (r < 0) {
                fuse_reply_err(req, -r);
        } else {
                fuse_reply_entry(req, e);
        }
}

void kfs_lookup_answer(fuse_req_t req, struct kfs_inode *dir, const char *name, double neg_timeout)
{
        struct kfs *fs = kfs_of(req);
        struct fuse_entry_param e;
        reply_lookup(req, fs, dir, name, kfs_do_lookup(fs, dir, name, &e), &e, neg_timeout);
}

void kfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
        struct kfs *fs = kfs_of(req);
        struct fuse_entry_param e;
        struct kfs_inode *dir = kfs_inode_get(fs, parent);
        int r = kfs_do_lookup(fs, dir, name, &e);
        if (r == 0 && fs->o.stale_locks && remove_stale_lock(fs, dir, name, kfs_inode_get(fs, e.ino))) {
                kfs_inode_unref(fs, kfs_inode_get(fs, e.ino), 1); /* the lookup's reference: not replied */
                r = -ENOENT;
        }
        if (r == 0 && fs->remote && kfs_remote_herd_join(fs, req, dir, name) == KFS_REMOTE_PARKED) {
                kfs_inode_unref(fs, kfs_inode_get(fs, e.ino), 1); /* this lookup's reference: not replied */
                return; /* a walk told to look again: answered once this node's compile is done (herd.c) */
        }
        double neg = kfs_remote_negative_timeout(fs, fs->o.timeout); /* another node may store it */
        if (r == -ENOENT && fs->remote && !kfs_stale(dir)) { /* the shared tier may have it (remote/fetch.c) */
                int dfd = kfs_inode_fd(fs, dir);
                int f = dfd >= 0 ? kfs_remote_fetch(fs, req, dir, dfd, name) : -ENOENT; /* gives dfd back */
                if (f == KFS_REMOTE_PARKED)
                        return; /* another node compiles it: answered once it is there (remote/herd.c) */
                if (f == KFS_REMOTE_RETRY) {
                        fuse_reply_err(req, ESTALE); /* another process here compiles it (remote/herd.c, H7) */
                        return;
                }
                if (f == 0)
                        r = kfs_do_lookup(fs, dir, name, &e);
                else if (f == KFS_REMOTE_UNSURE)
                        neg = 0; /* compiled here, or no answer: the next lookups must reach us again */
        }
        reply_lookup(req, fs, dir, name, r, &e, neg);
}

void kfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n)
{
        struct kfs *fs = kfs_of(req);
        kfs_inode_unref(fs, kfs_inode_get(fs, ino), n);
        fuse_reply_none(req);
}

void kfs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
        struct kfs *fs = kfs_of(req);
        for (size_t i = 0; i < count; i++)
                kfs_inode_unref(fs, kfs_inode_get(fs, forgets[i].ino), forgets[i].nlookup);
        fuse_reply_none(req);
}

static void reply_attr(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, struct fuse_file_info *fi)
{
        struct stat st;
        if (!fi && kfs_stale(in)) {
                fuse_reply_err(req, ESTALE); /* a stale dentry: the VFS looks the name up again */
                return;
        }
        /* Through the handle's fd when it has one (a lazy passthrough handle may not: its inode's will do) */
        int fd = fi && !S_ISDIR(in->type) && !kfs_lazy_handle(fi) ? (int)(uint32_t)fi->fh : -1;
        int r = fd >= 0 ? (fstat(fd, &st) < 0 ? -errno : 0) : kfs_fstat_inode(fs, in, &st);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        atomic_store(&in->attr_cached, true); /* before the atime is read: a RELEASE in between sees it */
        kfs_fix_attr(in, &st);
        fuse_reply_attr(req, &st, fs->o.timeout);
}

void kfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        reply_attr(req, fs, kfs_inode_get(fs, ino), fi);
}

static struct timespec set_time(int valid, int now_flag, int set_flag, struct timespec t)
{
        if (valid & now_flag)
                return (struct timespec){ .tv_nsec = UTIME_NOW };
        if (valid & set_flag)
                return t;
        return (struct timespec){ .tv_nsec = UTIME_OMIT };
}

void kfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        char proc[64];
        int r = 0;
        if (kfs_stale(in)) {
                fuse_reply_err(req, ESTALE);
                return;
        }
        int fd = fi ? kfs_handle_fd(fs, ino, fi) : -1;
        if (fi && fd < 0) {
                fuse_reply_err(req, -fd);
                return;
        }
        int pfd = kfs_inode_fd(fs, in);
        if (pfd < 0) {
                fuse_reply_err(req, -pfd);
                return;
        }
        kfs_proc_path(proc, sizeof(proc), pfd);

        if (valid & FUSE_SET_ATTR_MODE) {
                r = fi ? fchmod(fd, attr->st_mode) : fchmodat(AT_FDCWD, proc, attr->st_mode, 0);
                if (r < 0)
                        goto err;
        }
        if (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
                uid_t u = valid & FUSE_SET_ATTR_UID ? attr->st_uid : (uid_t)-1;
                gid_t g = valid & FUSE_SET_ATTR_GID ? attr->st_gid : (gid_t)-1;
                if (fchownat(pfd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
                        goto err;
        }
        if (valid & FUSE_SET_ATTR_SIZE) {
                /* Growing by truncate allocates nothing (sparse); the real allocation is re-read after. */
                pthread_mutex_lock(&in->lock);
                r = fi ? ftruncate(fd, attr->st_size) : truncate(proc, attr->st_size);
                struct stat st;
                int e = errno;
                bool grew = r == 0 && fstatat(pfd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 &&
                            !kev_account_locked(fs, in, &st);
                in->cache_ok = false;
                pthread_mutex_unlock(&in->lock);
                if (grew) { /* allocated unseen before (writeback): room first */
                        kev_writer = fuse_req_ctx(req)->pid;
                        kev_measure(fs, in, fi ? fd : -1, 0);
                        kev_writer = 0;
                }
                errno = e;
                if (r < 0)
                        goto err;
                kfs_kill_suid(fuse_req_ctx(req)->uid, fi ? fd : pfd, fi ? NULL : proc); /* (ops-io.c, SETUID) */
                kfs_settle_note(fs, in);
        }
        if (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
                struct timespec tv[2] = {
                        set_time(valid, FUSE_SET_ATTR_ATIME_NOW, FUSE_SET_ATTR_ATIME, attr->st_atim),
                        set_time(valid, FUSE_SET_ATTR_MTIME_NOW, FUSE_SET_ATTR_MTIME, attr->st_mtim),
                };
                if (S_ISLNK(in->type)) /* the link itself, as utimensat(AT_SYMLINK_NOFOLLOW) asked */
                        r = utimensat(pfd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
                else
                        r = fi ? futimens(fd, tv) : utimensat(AT_FDCWD, proc, tv, 0);
                if (r < 0)
                        goto err;
                if (S_ISREG(in->type) && (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW))) {
                        /* An explicit atime is what the mount reports from now on; recency is unchanged. */
                        int64_t a = valid & FUSE_SET_ATTR_ATIME_NOW ? kfs_now_ns()
                                    : (int64_t)attr->st_atim.tv_sec * 1000000000LL + attr->st_atim.tv_nsec;
                        atomic_store(&in->atime_ns, a);
                        kidx_set_atime(fs->idx, in->bino, a);
                }
        }
        kfs_inode_fd_put(fs, in, pfd);
        reply_attr(req, fs, in, fi);
        return;
err:
        r = errno;
        kfs_inode_fd_put(fs, in, pfd);
        fuse_reply_err(req, r);
}

void kfs_op_readlink(fuse_req_t req, fuse_ino_t ino)
{
        struct kfs *fs = kfs_of(req);
        char buf[PATH_MAX + 1];
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        int fd = kfs_inode_fd(fs, in);
        ssize_t n = fd < 0 ? fd : readlinkat(fd, "", buf, sizeof(buf));
        int e = n < 0 && fd >= 0 ? errno : -fd;
        kfs_inode_fd_put(fs, in, fd);
        if (n < 0)
                fuse_reply_err(req, e);
        else if (n >= (ssize_t)sizeof(buf))
                fuse_reply_err(req, ENAMETOOLONG);
        else {
                buf[n] = '\0';
                fuse_reply_readlink(req, buf);
        }
}

int kfs_set_owner(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const char *name, int fd)
{
        if (geteuid() != 0)
                return 0;
        const struct fuse_ctx *c = fuse_req_ctx(req);
        if (c->uid == 0 && c->gid == 0)
                return 0;
        struct stat ds;
        int dfd = kfs_inode_fd(fs, dir);
        if (dfd < 0)
                return dfd;
        int r = fstatat(dfd, "", &ds, AT_EMPTY_PATH) < 0 ? -errno : 0;
        gid_t g = ds.st_mode & S_ISGID ? (gid_t)-1 : c->gid; /* a setgid directory decides the group */
        if (r == 0 && (fd >= 0 ? fchown(fd, c->uid, g) : fchownat(dfd, name, c->uid, g, AT_SYMLINK_NOFOLLOW)) < 0)
                r = -errno;
        kfs_inode_fd_put(fs, dir, dfd);
        return r;
}

static enum kidx_type kidx_type_of(mode_t m)
{
        return S_ISREG(m) ? KIDX_REG : S_ISDIR(m) ? KIDX_DIR : S_ISLNK(m) ? KIDX_LNK : KIDX_OTHER;
}

/* mknod, mkdir and symlink: make the object, give it to the caller, index it, reply its entry. */
static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev,
                      const char *link)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *dir = kfs_inode_get(fs, parent);
        int r;
        if (kfs_hidden(fs, dir, name) || kfs_stale(dir)) {
                fuse_reply_err(req, kfs_stale(dir) ? ESTALE : EPERM);
                return;
        }
        kfs_dir_named(dir);
        int dfd = kfs_inode_fd(fs, dir);
        if (dfd < 0) {
                fuse_reply_err(req, -dfd);
                return;
        }
        mode_t perm = kfs_req_mode(req, mode) & 07777;
        if (link)
                r = ktree_symlink(&fs->tree, link, dfd, name);
        else if (S_ISDIR(mode))
                r = ktree_mkdir(&fs->tree, dfd, name, perm);
        else
                r = ktree_mknod(&fs->tree, dfd, name, (mode & S_IFMT) | perm, rdev);
        if (r < 0) {
                kfs_inode_fd_put(fs, dir, dfd);
                fuse_reply_err(req, -r);
                return;
        }
        r = kfs_set_owner(fs, req, dir, name, -1);
        struct stat st;
        if (r == 0 && fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                r = -errno;
        if (r < 0) {
                (void)ktree_unlink(&fs->tree, dfd, name, NULL, S_ISDIR(mode) && !link ? AT_REMOVEDIR : 0);
                kfs_inode_fd_put(fs, dir, dfd);
                fuse_reply_err(req, -r);
                return;
        }
        if (S_ISREG(st.st_mode))
                kev_miss_made(fs, dfd, name); /* (evict/misses.c) */
        kfs_inode_fd_put(fs, dir, dfd);
        if (S_ISREG(st.st_mode))
                kidx_add_file(fs->idx, st.st_ino, (uint64_t)st.st_blocks * 512, st.st_uid, kfs_now_ns());
        kidx_add_dent(fs->idx, dir->bino, name, st.st_ino, kidx_type_of(st.st_mode));
        struct fuse_entry_param e;
        r = kfs_do_lookup(fs, dir, name, &e);
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                fuse_reply_entry(req, &e);
}

void kfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
        make_node(req, parent, name, mode, rdev, NULL);
}

void kfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
        make_node(req, parent, name, S_IFDIR | mode, 0, NULL);
}

void kfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
        make_node(req, parent, name, S_IFLNK | 0777, 0, link);
}

void kfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino), *dir = kfs_inode_get(fs, newparent);
        if (kfs_hidden(fs, dir, newname) || kfs_stale(in) || kfs_stale(dir)) {
                fuse_reply_err(req, kfs_stale(in) || kfs_stale(dir) ? ESTALE : EPERM);
                return;
        }
        kfs_dir_named(dir);
        int fd = kfs_inode_fd(fs, in), dfd = fd < 0 ? fd : kfs_inode_fd(fs, dir);
        int r = dfd < 0 ? dfd : 0;
        if (r == 0 && fd == fs->dead_fd)
                r = -ESTALE; /* evicted since the check: linking the placeholder gave EXDEV */
        if (r == 0)
                r = ktree_link(&fs->tree, fd, dfd, newname);
        kfs_inode_fd_put(fs, dir, dfd);
        kfs_inode_fd_put(fs, in, fd);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        kidx_add_dent(fs->idx, dir->bino, newname, in->bino, kidx_type_of(in->type));
        struct fuse_entry_param e;
        r = kfs_do_lookup(fs, dir, newname, &e);
        if (r < 0)
                fuse_reply_err(req, -r);
        else
                fuse_reply_entry(req, &e);
}

/* st is the backing stat of a regular file that just lost a name. If that was its last name, the
 * file leaves the index and stops counting (it may live on while open: T3 then no longer applies). */
/* st: the file as it is after the removal of a name (fstat of a descriptor held on it), so that a link
 * made meanwhile by another process keeps it counted: a count taken before the removal said "last name",
 * the file lived on under the new one, and none of its writes was counted again. */
static void forget_name_of_file(struct kfs *fs, const struct stat *st)
{
        if (S_ISDIR(st->st_mode) && st->st_nlink == 0) { /* a directory a rename replaced: see kfs_op_rmdir */
                pthread_mutex_lock(&fs->itable_lock);
                struct kfs_inode *in = kfs_inode_find_locked(fs, st->st_ino);
                if (in && S_ISDIR(in->type))
                        atomic_store(&in->unlinked, true);
                pthread_mutex_unlock(&fs->itable_lock);
                return;
        }
        if (!S_ISREG(st->st_mode) || st->st_nlink > 0)
                return;
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *in = kfs_inode_find_locked(fs, st->st_ino);
        pthread_mutex_unlock(&fs->itable_lock);
        /* The kernel pins the inode of a name it is removing, so in cannot be forgotten meanwhile. */
        if (in) {
                pthread_mutex_lock(&in->lock);
                in->unlinked = true;
                pthread_mutex_unlock(&in->lock);
        }
        kidx_del_file(fs->idx, st->st_ino); /* with the bytes its row holds (kidx I3) */
}

void kfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *dir = kfs_inode_get(fs, parent);
        struct stat st;
        if (kfs_hidden(fs, dir, name)) {
                fuse_reply_err(req, ENOENT);
                return;
        }
        int dfd = kfs_inode_fd(fs, dir);
        if (dfd < 0) {
                fuse_reply_err(req, -dfd);
                return;
        }
        /* Hold the inode until the index is told, so that its number cannot go to a new file meanwhile. */
        int hold = ktree_open(&fs->tree, dfd, name, O_PATH, 0);
        int e = hold < 0 ? -hold : fstat(hold, &st) < 0 ? errno : 0;
        if (!e)
                kfs_inode_unnamed(fs, &st, dir, name, hold); /* (inode.c, DESCRIPTORS) */
        if (!e)
                e = -ktree_unlink(&fs->tree, dfd, name, NULL, 0);
        if (e) {
                if (hold >= 0)
                        close(hold);
                kfs_inode_fd_put(fs, dir, dfd);
                fuse_reply_err(req, e);
                return;
        }
        kfs_inode_fd_put(fs, dir, dfd);
        kidx_del_dent(fs->idx, dir->bino, name);
        if (fstat(hold, &st) == 0) /* its names now */
                forget_name_of_file(fs, &st);
        close(hold);
        fuse_reply_err(req, 0);
}

/* The key of a runtime mark on the directory name in dir (evict/marks.c): the name itself in the root,
 * users/<uid>/name in a user's directory (whose owner is that uid: users.c, U1); false elsewhere, where no
 * mark is kept. dfd is dir's descriptor. */
static bool mark_key(struct kfs *fs, struct kfs_inode *dir, int dfd, const char *name, char *buf, size_t size)
{
        if (dir == &fs->root)
                return snprintf(buf, size, "%s", name) < (int)size;
        uint64_t users = atomic_load(&fs->users_ino);
        struct stat up, self;
        if (!users || dfd < 0 || fstatat(dfd, "..", &up, AT_SYMLINK_NOFOLLOW) < 0 || up.st_ino != users ||
            up.st_dev != fs->tree.dev || fstat(dfd, &self) < 0)
                return false;
        return snprintf(buf, size, "%s/%u/%s", KFS_USERS_DIR, (unsigned)self.st_uid, name) < (int)size;
}

void kfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *dir = kfs_inode_get(fs, parent);
        if (kfs_hidden(fs, dir, name)) {
                fuse_reply_err(req, ENOENT);
                return;
        }
        int dfd = kfs_inode_fd(fs, dir);
        /* Held until its inode is marked: its number must not go to a new object before. */
        int hold = dfd < 0 ? -1 : ktree_open(&fs->tree, dfd, name, O_PATH | O_DIRECTORY, 0);
        int r = dfd < 0 ? dfd : ktree_unlink(&fs->tree, dfd, name, NULL, AT_REMOVEDIR);
        char key[600];
        bool marked = r == 0 && mark_key(fs, dir, dfd, name, key, sizeof(key));
        kfs_inode_fd_put(fs, dir, dfd);
        struct stat st;
        if (r == 0 && hold >= 0 && fstat(hold, &st) == 0) { /* its struct is a removed object's (inode.c) */
                pthread_mutex_lock(&fs->itable_lock);
                struct kfs_inode *in = kfs_inode_find_locked(fs, st.st_ino);
                if (in && S_ISDIR(in->type))
                        atomic_store(&in->unlinked, true);
                pthread_mutex_unlock(&fs->itable_lock);
        }
        if (hold >= 0)
                close(hold);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        kidx_del_dent(fs->idx, dir->bino, name);
        if (marked)
                kev_mark_moved(fs, key, NULL); /* (evict/marks.c) */
        fuse_reply_err(req, 0);
}

void kfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                   const char *newname, unsigned int flags)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *od = kfs_inode_get(fs, parent), *nd = kfs_inode_get(fs, newparent);
        if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
                fuse_reply_err(req, EINVAL);
                return;
        }
        if (kfs_hidden(fs, od, name) || kfs_hidden(fs, nd, newname)) {
                fuse_reply_err(req, kfs_hidden(fs, od, name) ? ENOENT : EPERM);
                return;
        }
        if (kfs_stale(od) || kfs_stale(nd)) {
                fuse_reply_err(req, ESTALE);
                return;
        }
        kfs_dir_named(nd);
        struct stat src, dst;
        bool exchange = flags & RENAME_EXCHANGE;
        int ofd = kfs_inode_fd(fs, od), nfd = ofd < 0 ? ofd : kfs_inode_fd(fs, nd);
        if (nfd < 0 || fstatat(ofd, name, &src, AT_SYMLINK_NOFOLLOW) < 0) {
                int e = nfd < 0 ? -nfd : errno;
                kfs_inode_fd_put(fs, nd, nfd);
                kfs_inode_fd_put(fs, od, ofd);
                fuse_reply_err(req, e);
                return;
        }
        /* A replaced target is held until the index is told (see kfs_op_unlink). */
        int hold = exchange ? -1 : ktree_open(&fs->tree, nfd, newname, O_PATH, 0);
        bool replaced = hold >= 0 && fstat(hold, &dst) == 0;
        bool swapped = exchange && fstatat(nfd, newname, &dst, AT_SYMLINK_NOFOLLOW) == 0;
        if (replaced)
                kfs_inode_unnamed(fs, &dst, nd, newname, hold); /* (inode.c, DESCRIPTORS) */
        kfs_names_lock(fs, od->bino, nd->bino); /* (kfs.h, name_locks) */
        int moved = ktree_rename(&fs->tree, ofd, name, nfd, newname, flags), e = -moved;
        kfs_names_unlock(fs, od->bino, nd->bino);
        if (moved == 0 && !replaced && !exchange && S_ISREG(src.st_mode)) /* stored by temp and rename */
                kev_miss_made(fs, nfd, newname); /* (evict/misses.c) */
        if (moved == 0 && S_ISREG(src.st_mode))
                kfs_remote_note_name(fs, nfd, newname); /* renamed into place: its unit may be whole */
        char okey[600], nkey[600]; /* where a runtime's mark may be kept (evict/marks.c) */
        bool omark = moved == 0 && S_ISDIR(src.st_mode) && mark_key(fs, od, ofd, name, okey, sizeof(okey));
        bool nmark = moved == 0 && mark_key(fs, nd, nfd, newname, nkey, sizeof(nkey));
        kfs_inode_fd_put(fs, nd, nfd);
        kfs_inode_fd_put(fs, od, ofd);
        if (moved < 0) {
                if (hold >= 0)
                        close(hold);
                fuse_reply_err(req, e);
                return;
        }
        /* Renaming a name onto another link of the same file changes nothing (POSIX). */
        if (replaced && dst.st_ino == src.st_ino) {
                close(hold);
                fuse_reply_err(req, 0);
                return;
        }
        /* A runtime's directory takes its mark along; one it replaced loses its own (evict/marks.c). */
        if (nmark && (replaced || swapped) && S_ISDIR(dst.st_mode))
                kev_mark_moved(fs, nkey, NULL);
        if (omark)
                kev_mark_moved(fs, okey, nmark && !exchange ? nkey : NULL);
        kfs_inode_moved(fs, src.st_ino, nd, newname); /* where it reopens (inode.c, DESCRIPTORS) */
        if (swapped)
                kfs_inode_moved(fs, dst.st_ino, od, name);
        if (replaced && fstat(hold, &dst) == 0) /* its names now */
                forget_name_of_file(fs, &dst); /* the rename op drops the target's dent itself */
        kidx_rename(fs->idx, od->bino, name, nd->bino, newname, exchange);
        if (hold >= 0)
                close(hold);
        fuse_reply_err(req, 0);
}

/* ---- directories ---- */

struct kfs_dir {
        DIR *dp;
        off_t offset;
        struct dirent *entry;
};

void kfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        if (fs->no_opendir) {
                /* ENOSYS means success here (see kfs_op_init): the kernel then opens and releases
                 * directories itself, keeps their listings cached (every change goes through the mount or
                 * is invalidated by eviction), and a warm walk costs no request at all. READDIR then comes
                 * without a handle, and do_readdir() opens the directory for it. */
                fuse_reply_err(req, ENOSYS);
                return;
        }
        struct kfs_dir *d = calloc(1, sizeof(*d));
        int fd = d ? kfs_inode_open(fs, kfs_inode_get(fs, ino), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -ENOMEM;
        if (fd < 0)
                errno = -fd;
        if (fd < 0 || !(d->dp = fdopendir(fd))) {
                int e = d ? errno : ENOMEM;
                if (fd >= 0)
                        close(fd);
                free(d);
                fuse_reply_err(req, e);
                return;
        }
        fi->fh = (uint64_t)(uintptr_t)d;
        fi->cache_readdir = 1;
        fi->keep_cache = 1;
        fuse_reply_open(req, fi);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi, bool plus)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *dir = kfs_inode_get(fs, ino);
        struct kfs_dir tmp = { 0 }, *d = (struct kfs_dir *)(uintptr_t)fi->fh;
        if (!d) {
                int fd = kfs_inode_open(fs, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (fd < 0 || !(tmp.dp = fdopendir(fd))) {
                        int e = fd < 0 ? -fd : errno;
                        if (fd >= 0)
                                close(fd);
                        fuse_reply_err(req, e);
                        return;
                }
                tmp.offset = -1; /* forces the seekdir below, unless reading from the start */
                if (off == 0)
                        tmp.offset = 0;
                d = &tmp;
        }
        char *buf = malloc(size);
        if (!buf) {
                if (d == &tmp)
                        closedir(tmp.dp);
                fuse_reply_err(req, ENOMEM);
                return;
        }
        if (off != d->offset) {
                seekdir(d->dp, off);
                d->entry = NULL;
                d->offset = off;
        }
        size_t rem = size;
        char *p = buf;
        int err = 0;
        bool end = false;
        for (;;) {
                if (!d->entry) {
                        errno = 0;
                        d->entry = readdir(d->dp);
                        if (!d->entry) {
                                err = errno;
                                end = !err;
                                break;
                        }
                }
                const char *name = d->entry->d_name;
                off_t next = d->entry->d_off;
                if (kfs_hidden(fs, dir, name)) {
                        d->entry = NULL;
                        d->offset = next;
                        continue;
                }
                size_t entsize;
                if (plus) {
                        struct fuse_entry_param e;
                        bool dot = !strcmp(name, ".") || !strcmp(name, "..");
                        if (dot) {
                                memset(&e, 0, sizeof(e)); /* ino 0: the kernel takes the name, no entry */
                                e.attr.st_ino = d->entry->d_ino;
                                e.attr.st_mode = (mode_t)d->entry->d_type << 12;
                        } else {
                                int r = kfs_do_lookup(fs, dir, name, &e);
                                if (r < 0) {
                                        d->entry = NULL; /* vanished meanwhile: skip it */
                                        d->offset = next;
                                        continue;
                                }
                        }
                        entsize = fuse_add_direntry_plus(req, p, rem, name, &e, next);
                        if (entsize > rem) {
                                if (!dot)
                                        kfs_inode_unref(fs, kfs_inode_get(fs, e.ino), 1);
                                break;
                        }
                } else {
                        struct stat st = { .st_ino = d->entry->d_ino, .st_mode = (mode_t)d->entry->d_type << 12 };
                        entsize = fuse_add_direntry(req, p, rem, name, &st, next);
                        if (entsize > rem)
                                break;
                }
                p += entsize;
                rem -= entsize;
                d->entry = NULL;
                d->offset = next;
        }
        if (end && rem == size) /* the listing's end, after which the kernel drops the atime (refresh.c);
                                   before the reply: nothing may forget the directory meanwhile */
                kfs_refresh_listed(fs, dir, ino);
        if (err && rem == size)
                fuse_reply_err(req, err);
        else
                fuse_reply_buf(req, buf, size - rem);
        free(buf);
        if (d == &tmp)
                closedir(tmp.dp);
}

void kfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
        do_readdir(req, ino, size, off, fi, false);
}

void kfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
        do_readdir(req, ino, size, off, fi, true);
}

void kfs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
        (void)ino;
        struct kfs_dir *d = (struct kfs_dir *)(uintptr_t)fi->fh;
        if (d) {
                closedir(d->dp);
                free(d);
        }
        fuse_reply_err(req, 0);
}

void kfs_op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
        (void)fi;
        struct kfs *fs = kfs_of(req);
        int fd = kfs_inode_open(fs, kfs_inode_get(fs, ino), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int r = fd < 0 ? -fd : (datasync ? fdatasync(fd) : fsync(fd)) < 0 ? errno : 0;
        if (fd >= 0)
                close(fd);
        fuse_reply_err(req, r);
}

void kfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
        (void)ino;
        struct kfs *fs = kfs_of(req);
        struct statvfs sv;
        if (fstatvfs(fs->tree.root, &sv) < 0) {
                fuse_reply_err(req, errno);
                return;
        }
        /* Size is the limit and used is the index's used bytes, in 512-byte units so both are exact. */
        uint64_t used = kidx_used(fs->idx), max = fs->o.max_size;
        uint64_t backing_avail = (uint64_t)sv.f_bavail * sv.f_frsize / 512;
        struct statvfs out = sv;
        out.f_bsize = 4096;
        out.f_frsize = 512;
        out.f_blocks = max / 512;
        out.f_bfree = used >= max ? 0 : (max - used) / 512;
        out.f_bavail = out.f_bfree < backing_avail ? out.f_bfree : backing_avail;
        out.f_namemax = 255;
        fuse_reply_statfs(req, &out);
}

void kfs_op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
        /* Only sent without default_permissions: check the mode bits for the caller. */
        struct kfs *fs = kfs_of(req);
        struct stat st;
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        int r = kfs_stale(in) ? -ESTALE : kfs_fstat_inode(fs, in, &st);
        if (r < 0 || mask == F_OK) {
                fuse_reply_err(req, -r);
                return;
        }
        const struct fuse_ctx *c = fuse_req_ctx(req);
        mode_t bits;
        if (c->uid == 0) {
                bool x_ok = S_ISDIR(st.st_mode) || (st.st_mode & 0111);
                fuse_reply_err(req, (mask & X_OK) && !x_ok ? EACCES : 0);
                return;
        }
        if (c->uid == st.st_uid) {
                bits = (st.st_mode >> 6) & 7;
        } else {
                bool member = c->gid == st.st_gid;
                gid_t groups[64];
                int n = member ? 0 : fuse_req_getgroups(req, 64, groups);
                for (int i = 0; i < n && i < 64 && !member; i++)
                        member = groups[i] == st.st_gid;
                bits = member ? (st.st_mode >> 3) & 7 : st.st_mode & 7;
        }
        fuse_reply_err(req, ((unsigned)mask & ~bits & 7) ? EACCES : 0);
}
