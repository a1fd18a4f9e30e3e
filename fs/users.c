/* users.c: each user's directory of their own on a mount that others use (users/<uid>).
 *
 * WHY. A runtime's cache directory shared by several users lets one of them plant a binary that another's
 * process loads: PoCL dlopens what it finds in its program directory, so a user who pre-creates PoCL's
 * directories in a shared pocl/ runs code as whoever builds that program next. The only safe cache
 * directory is one that nobody else can write. So on a shared mount kcache env points each runtime at
 * MOUNT/users/<uid>/<runtime>, in a directory the daemon made for that user:
 *   users/        the container, made by the daemon (owned by the daemon's user: root on a shared mount),
 *                 0711: anyone may pass through it to their own directory, nobody lists or writes it
 *   users/<uid>   one per user, made by the daemon the first time that user asks for it, given to the
 *                 user, 0700: only its owner (and root) reaches anything below it
 * A user asks by reading user.kcachefs.home on the mount's root (control.c; kcache env does, and so can
 * getfattr): the answer is the directory's path relative to the mount. The name is always the caller's
 * own uid as the kernel tells it (fuse_req_ctx), never a name the caller chooses, so no request can make
 * the daemon create or chown anything elsewhere. Eviction and the limit stay node-wide: these are only
 * directories of the one cache.
 *
 * WHAT STAYS TRUE.
 *   U1  The daemon trusts users/ only while it is a directory of the tree owned by the daemon's user and
 *       writable by nobody else; users/<uid> only while it is a directory owned by uid. Anything else at
 *       those names (a symlink, a file, another user's directory, planted in the backing directory or,
 *       before the daemon made users/, through the mount) is never followed or used: home answers EPERM.
 *   U2  What U1 refuses is repaired at the next mount, before the kernel can know it (kfs_users_check):
 *       it is renamed aside (<name>.untrusted-<inode>, which is no uid), with its contents and its owner,
 *       and the index is told. Not while mounted: the kernel may hold a dentry of the planted object, and
 *       would go on leading the user into it after a rename behind its back.
 *   U3  users/<uid> appears whole: made under a temporary name, given to its user, then renamed into
 *       place (RENAME_NOREPLACE), so that nobody ever finds it still root's, or half made.
 *   U4  The kernel never caches a miss for these names (kfs_users_uncached): the daemon makes them behind
 *       its back, and a miss cached for an hour (-o timeout) would hide a user's directory from them,
 *       after anyone (another user too: users/ is 0711) looked the name up before it existed.
 * Everything here goes through common/tree.h (R1-R4). No lock of ours is needed: U3 makes concurrent
 * requests for the same directory safe, and the index's calls take their own. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../common/tree.h"
#include "kfs.h"

bool kfs_users_uid(const char *name, uid_t *ret)
{
        if (name[0] < '0' || name[0] > '9' || (name[0] == '0' && name[1]) || strlen(name) > 10)
                return false; /* decimal, no leading zero: one name per uid */
        char *end;
        unsigned long long v = strtoull(name, &end, 10);
        if (*end || v >= (uid_t)-1)
                return false;
        *ret = (uid_t)v;
        return true;
}

int kfs_users_level(const char *rel)
{
        size_t l = strlen(KFS_USERS_DIR);
        if (strncmp(rel, KFS_USERS_DIR, l) || rel[l] != '/')
                return 0;
        const char *u = rel + l + 1, *s = strchr(u, '/');
        char name[16];
        uid_t uid;
        size_t ul = s ? (size_t)(s - u) : strlen(u);
        if (ul == 0 || ul >= sizeof(name))
                return 0;
        memcpy(name, u, ul);
        name[ul] = '\0';
        if (!kfs_users_uid(name, &uid))
                return 0;
        if (!s)
                return 1;
        return s[1] && !strchr(s + 1, '/') ? 2 : 0;
}

bool kfs_users_container_ok(const struct stat *st)
{
        return S_ISDIR(st->st_mode) && st->st_uid == geteuid() && !(st->st_mode & 022);
}

bool kfs_users_home_ok(const struct stat *st, uid_t uid)
{
        return S_ISDIR(st->st_mode) && st->st_uid == uid;
}

bool kfs_users_uncached(struct kfs *fs, const struct kfs_inode *dir, const char *name)
{
        uint64_t u = atomic_load(&fs->users_ino);
        return (dir == &fs->root && !strcmp(name, KFS_USERS_DIR)) || (u && dir->bino == u);
}

/* users/, open O_RDONLY|O_DIRECTORY and checked (U1), made when absent if make. -EPERM: it is not ours. */
static int open_container(struct kfs *fs, const struct ktree *t, bool make, struct stat *ret_st)
{
        int fd = ktree_open(t, KTREE_ROOT, KFS_USERS_DIR, O_RDONLY | O_DIRECTORY, 0);
        bool made = false;
        if (fd == -ENOENT && make) {
                int r = ktree_mkdir(t, KTREE_ROOT, KFS_USERS_DIR, 0711); /* the daemon's umask is 0 */
                if (r < 0 && r != -EEXIST)
                        return r;
                made = r == 0;
                fd = ktree_open(t, KTREE_ROOT, KFS_USERS_DIR, O_RDONLY | O_DIRECTORY, 0);
        }
        if (fd < 0)
                return fd == -ENOENT ? fd : -EPERM; /* a symlink, a file, another filesystem */
        if (fstat(fd, ret_st) < 0 || !kfs_users_container_ok(ret_st)) {
                close(fd);
                kfs_log(LOG_WARNING, "%s/ is not the daemon's own directory: no user directory is given "
                        "until the next mount sets it aside", KFS_USERS_DIR);
                return -EPERM;
        }
        if (made)
                kidx_add_dent(fs->idx, fs->root.bino, KFS_USERS_DIR, ret_st->st_ino, KIDX_DIR);
        atomic_store(&fs->users_ino, (uint64_t)ret_st->st_ino);
        return fd;
}

/* Makes users/<name> for uid (U3) in the container open at ufd. 0, -EEXIST (someone else made it first),
 * or -errno. */
static int make_home(struct kfs *fs, const struct ktree *t, int ufd, const struct stat *ust, const char *name,
                     uid_t uid, gid_t gid)
{
        char tmp[64];
        snprintf(tmp, sizeof(tmp), ".new-%s-%ld", name, (long)syscall(SYS_gettid));
        int r = ktree_mkdir(t, ufd, tmp, 0700);
        if (r < 0)
                return r;
        struct stat st;
        bool have = false;
        int fd = ktree_open(t, ufd, tmp, O_RDONLY | O_DIRECTORY, 0);
        if (fd < 0)
                r = fd;
        else if (!(have = fstat(fd, &st) == 0) ||
                 ((uid != geteuid() || gid != getegid()) && fchown(fd, uid, gid) < 0))
                r = -errno;
        if (fd >= 0)
                close(fd);
        if (r == 0)
                r = ktree_rename(t, ufd, tmp, ufd, name, RENAME_NOREPLACE);
        if (r < 0) {
                if (have) /* ours, made just now and still empty */
                        (void)ktree_unlink(t, ufd, tmp, &st, AT_REMOVEDIR);
                return r;
        }
        kidx_add_dent(fs->idx, ust->st_ino, name, st.st_ino, KIDX_DIR);
        return 0;
}

int kfs_users_home(fuse_req_t req, struct kfs *fs, char *buf, size_t size)
{
        const struct fuse_ctx *c = fuse_req_ctx(req);
        uid_t uid = c->uid;
        if (uid != geteuid() && geteuid() != 0)
                return -EPERM; /* only root can give a directory to another user */
        struct ktree t;
        int r = ktree_init_fd(&t, fs->tree.root);
        if (r < 0)
                return r;
        struct stat ust, st;
        int ufd = open_container(fs, &t, true, &ust);
        if (ufd < 0)
                return ufd;
        char name[16];
        snprintf(name, sizeof(name), "%u", (unsigned)uid);
        int hfd = ktree_open(&t, ufd, name, O_RDONLY | O_DIRECTORY, 0);
        if (hfd == -ENOENT) {
                r = make_home(fs, &t, ufd, &ust, name, uid, c->gid);
                if (r < 0 && r != -EEXIST) { /* a full disk, a quota: said as it is, nothing was planted */
                        close(ufd);
                        kfs_log(LOG_ERR, "cannot make %s/%s for user %s: %s", KFS_USERS_DIR, name, name,
                                strerror(-r));
                        return r;
                }
                hfd = ktree_open(&t, ufd, name, O_RDONLY | O_DIRECTORY, 0);
        }
        close(ufd);
        if (hfd == -ELOOP || hfd == -ENOTDIR || hfd == -EXDEV)
                hfd = -EPERM; /* a symlink, a file, another filesystem: planted (U1) */
        if (hfd >= 0 && (fstat(hfd, &st) < 0 || !kfs_users_home_ok(&st, uid))) {
                close(hfd);
                hfd = -EPERM;
        }
        if (hfd == -EPERM)
                kfs_log(LOG_WARNING, "%s/%s is not user %s's directory: refused until the next mount sets "
                        "it aside", KFS_USERS_DIR, name, name);
        if (hfd < 0)
                return hfd;
        /* Its owner may have opened it up; the runtimes' binaries below it must be theirs alone. */
        r = (st.st_mode & 07777) != 0700 && fchmod(hfd, 0700) < 0 ? -errno : 0;
        close(hfd);
        if (r < 0)
                return r;
        r = snprintf(buf, size, "%s/%s", KFS_USERS_DIR, name);
        return r >= (int)size ? -E2BIG : r;
}

/* Renames dfd/name (the object st, in the directory of inode dir_ino) aside (U2). */
static void set_aside(struct kfs *fs, const struct ktree *t, int dfd, uint64_t dir_ino, const char *name,
                      const struct stat *st, const char *shown)
{
        char aside[64];
        struct stat now;
        snprintf(aside, sizeof(aside), "%s.untrusted-%" PRIu64, name, (uint64_t)st->st_ino);
        int r = ktree_stat(t, dfd, name, &now);
        if (r == 0 && !ktree_same(&now, st))
                r = -ESTALE; /* R4: nothing else runs at mount, but the check is cheap */
        if (r == 0)
                r = ktree_rename(t, dfd, name, dfd, aside, RENAME_NOREPLACE);
        if (r == 0)
                kidx_rename(fs->idx, dir_ino, name, dir_ino, aside, false);
        kfs_log(r == 0 ? LOG_WARNING : LOG_ERR, "%s (owner %u, mode %04o) was not made by kcachefs for its user: %s%s%s",
                shown, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
                r == 0 ? "set aside as " : "could not set it aside: ", r == 0 ? aside : strerror(-r),
                r == 0 ? "" : " (refused while it stays)");
}

/* On a shared mount, users/ is made at mount, before any user can make a directory of that name in a
 * root they may write (a 1777 root): one made by a user is refused (U1) and would deny everyone their
 * directory until the next mount. A personal mount makes it only when asked, and its listing stays as
 * it was. */
static void make_container_now(struct kfs *fs, const struct ktree *t)
{
        struct stat st;
        int fd = fs->o.allow_other ? open_container(fs, t, true, &st) : -1;
        if (fd >= 0)
                close(fd);
}

void kfs_users_check(struct kfs *fs)
{
        struct ktree t;
        struct stat ust, st;
        if (ktree_init_fd(&t, fs->tree.root) < 0)
                return;
        if (ktree_stat(&t, KTREE_ROOT, KFS_USERS_DIR, &ust) < 0) {
                make_container_now(fs, &t); /* else made at the first request */
                return;
        }
        if (!kfs_users_container_ok(&ust)) {
                set_aside(fs, &t, KTREE_ROOT, fs->root.bino, KFS_USERS_DIR, &ust, KFS_USERS_DIR "/");
                make_container_now(fs, &t);
                return;
        }
        int ufd = open_container(fs, &t, false, &ust);
        DIR *d = ufd >= 0 ? ktree_opendir(&t, ufd, "") : NULL;
        if (!d) {
                if (ufd >= 0)
                        close(ufd);
                return;
        }
        kidx_add_dent(fs->idx, fs->root.bino, KFS_USERS_DIR, ust.st_ino, KIDX_DIR); /* an index older than it */
        struct dirent *de;
        while ((de = readdir(d))) {
                uid_t uid;
                char shown[300];
                if (!kfs_users_uid(de->d_name, &uid)) {
                        /* a temporary name of make_home that a crash left (U3): empty, root's */
                        if (!strncmp(de->d_name, ".new-", 5) && ktree_stat(&t, ufd, de->d_name, &st) == 0 &&
                            S_ISDIR(st.st_mode) && st.st_uid == geteuid())
                                (void)ktree_unlink(&t, ufd, de->d_name, &st, AT_REMOVEDIR);
                        continue;
                }
                if (ktree_stat(&t, ufd, de->d_name, &st) < 0 || kfs_users_home_ok(&st, uid))
                        continue;
                snprintf(shown, sizeof(shown), "%s/%s", KFS_USERS_DIR, de->d_name);
                set_aside(fs, &t, ufd, ust.st_ino, de->d_name, &st, shown);
        }
        closedir(d);
        close(ufd);
}
