/* tree.c: the only door to the backing tree; the rules R1-R4 and why they exist are in tree.h. Also
 * ktree_chase_dir, the walk of an operator's path outside any tree: every openat of the project is here
 * (tests/check-tree-door), so that each one is read with these rules in mind. */
#include "tree.h"

#include <errno.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#ifndef RESOLVE_CACHED
#define RESOLVE_CACHED 0x20 /* Linux 5.12 */
#endif
#define RESOLVE_SAFE (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)

#define OPEN_FLAGS (O_ACCMODE | O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC | O_APPEND | O_NONBLOCK | O_DSYNC | \
                    FASYNC | O_DIRECT | O_LARGEFILE | O_DIRECTORY | O_NOFOLLOW | O_NOATIME | O_CLOEXEC | O_SYNC | \
                    __O_TMPFILE)

/* 1 once openat2 was seen to work, -1 once the kernel said ENOSYS; a benign race. */
static int have_openat2;

void ktree__force_walk(bool on)
{
        have_openat2 = on ? -1 : 0;
}

bool ktree_name_ok(const char *name)
{
        return name && *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

int ktree_init_fd(struct ktree *t, int root)
{
        struct stat st;
        if (fstat(root, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        t->root = root;
        t->dev = st.st_dev;
        return 0;
}

int ktree_init(struct ktree *t, const char *path)
{
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        int r = ktree_init_fd(t, fd);
        if (r < 0)
                close(fd);
        return r;
}

void ktree_close(struct ktree *t)
{
        if (t->root >= 0)
                close(t->root);
        t->root = -1;
}

static int base_of(const struct ktree *t, int dfd)
{
        return dfd == KTREE_ROOT ? t->root : dfd;
}

/* The object FD must lie on the tree's device (R3): a name that is a mount point of another filesystem
 * leads out of the tree. */
static int on_tree(const struct ktree *t, int fd)
{
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        return st.st_dev == t->dev ? 0 : -EXDEV;
}

/* R1-R3 without openat2: one component at a time, each opened O_NOFOLLOW (a symlink component fails with
 * ELOOP or ENOTDIR) and checked to be on the tree's device. */
static int walk_components(const struct ktree *t, int dfd, const char *rel, int flags, mode_t mode)
{
        if (*rel == '/')
                return -EXDEV;
        char *copy = strdup(rel), *save = NULL;
        if (!copy)
                return -ENOMEM;
        int cur = -1, r = 0;
        char *part = strtok_r(copy, "/", &save);
        if (!part) { /* "" or "/"-only: the directory itself */
                free(copy);
                int fd = openat(dfd, ".", flags | O_CLOEXEC, mode);
                return fd < 0 ? -errno : fd;
        }
        while (part) {
                char *next = strtok_r(NULL, "/", &save);
                if (!strcmp(part, "..")) {
                        r = -EXDEV;
                        break;
                }
                int from = cur >= 0 ? cur : dfd;
                int fd = next ? openat(from, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                              : openat(from, part, flags | O_NOFOLLOW | O_CLOEXEC, mode);
                if (fd < 0) {
                        r = -errno;
                        if (r == -ENOTDIR && next) /* a symlink where a directory was expected */
                                r = -ELOOP;
                        break;
                }
                if (cur >= 0)
                        close(cur);
                cur = fd;
                if ((r = on_tree(t, cur)) < 0)
                        break;
                part = next;
        }
        free(copy);
        if (r < 0) {
                if (cur >= 0)
                        close(cur);
                return r;
        }
        return cur;
}

/* Whether rel has a ".." component. */
static bool climbs(const char *rel)
{
        for (const char *p = rel; (p = strstr(p, "..")) != NULL; p += 2)
                if ((p == rel || p[-1] == '/') && (p[2] == '\0' || p[2] == '/'))
                        return true;
        return false;
}

int ktree_open(const struct ktree *t, int dfd, const char *rel, int flags, mode_t mode)
{
        dfd = base_of(t, dfd);
        if (!rel || !*rel)
                rel = ".";
        /* R3, before any system call: openat2's RESOLVE_BENEATH lets "a/../b" through (it stays beneath),
         * which the walk refuses, and answers a ".." that would leave with EAGAIN instead of EXDEV
         * whenever a rename anywhere on the system raced with it (its rename_lock check). */
        if (climbs(rel))
                return -EXDEV;
        /* openat2 refuses bits openat ignores (a request's __FMODE_EXEC, flags beside O_PATH) */
        flags &= flags & O_PATH ? (O_PATH | O_DIRECTORY) : OPEN_FLAGS;
        flags |= O_NOFOLLOW | O_CLOEXEC;
        if (have_openat2 >= 0) {
                struct open_how how = { .flags = (uint64_t)flags, .resolve = RESOLVE_SAFE };
                if (flags & (O_CREAT | __O_TMPFILE))
                        how.mode = mode & 07777; /* openat2 refuses the type bits a request carries */
                long fd = syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
                if (fd >= 0) {
                        have_openat2 = 1;
                        return (int)fd;
                }
                if (errno != ENOSYS)
                        return -errno;
                have_openat2 = -1;
        }
        return walk_components(t, dfd, rel, flags, mode);
}

int ktree_open_cached(const struct ktree *t, int dfd, const char *rel)
{
        dfd = base_of(t, dfd);
        if (!rel || !*rel)
                rel = ".";
        if (climbs(rel))
                return -EXDEV;
        struct open_how how = { .flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
                                .resolve = RESOLVE_SAFE | RESOLVE_CACHED };
        long fd = syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
        return fd >= 0 ? (int)fd : -errno;
}

int ktree_open_mount(int dfd, const char *name)
{
        if (!ktree_name_ok(name))
                return -EINVAL;
        struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
        long fd = syscall(SYS_openat2, dfd, name, &how, sizeof(how));
        return fd >= 0 ? (int)fd : -errno;
}

int ktree_open_file(const struct ktree *t, int dfd, const char *rel, int flags, mode_t mode)
{
        int fd = ktree_open(t, dfd, rel, flags | O_NONBLOCK, mode);
        if (fd < 0)
                return fd; /* a FIFO opened O_WRONLY with no reader: -ENXIO already */
        struct stat st;
        int r = fstat(fd, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -ENXIO;
        if (r == 0 && !(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
                r = -errno;
        if (r < 0) {
                close(fd);
                return r;
        }
        return fd;
}

int ktree_stat(const struct ktree *t, int dfd, const char *rel, struct stat *st)
{
        int fd = ktree_open(t, dfd, rel, O_PATH, 0);
        if (fd < 0)
                return fd;
        int r = fstat(fd, st) < 0 ? -errno : 0;
        close(fd);
        return r;
}

DIR *ktree_opendir(const struct ktree *t, int dfd, const char *rel)
{
        int fd = ktree_open(t, dfd, rel, O_RDONLY | O_DIRECTORY, 0);
        if (fd < 0) {
                errno = -fd;
                return NULL;
        }
        DIR *d = fdopendir(fd);
        if (!d) {
                int e = errno;
                close(fd);
                errno = e;
        }
        return d;
}

int ktree_walk(const struct ktree *t, size_t n, const char *const *names, const uint64_t *inos, int flags)
{
        int cur = -1;
        for (size_t i = 0; i < n; i++) {
                if (!ktree_name_ok(names[i])) {
                        if (cur >= 0)
                                close(cur);
                        return -EINVAL;
                }
                int last = i + 1 == n;
                int fd = openat(cur >= 0 ? cur : t->root, names[i],
                                (last ? flags : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                int r = fd < 0 ? (errno == ELOOP || errno == ENOTDIR ? -ESTALE : -errno) : 0; /* not that directory */
                struct stat st;
                if (r == 0 && fstat(fd, &st) < 0)
                        r = -errno;
                if (r == 0 && (st.st_dev != t->dev || st.st_ino != (ino_t)inos[i]))
                        r = -ESTALE;
                if (cur >= 0)
                        close(cur);
                cur = fd;
                if (r < 0) {
                        if (cur >= 0)
                                close(cur);
                        return r;
                }
        }
        if (cur < 0) { /* n == 0: the root itself */
                cur = openat(t->root, ".", flags | O_DIRECTORY | O_CLOEXEC);
                if (cur < 0)
                        return -errno;
        }
        return cur;
}

int ktree_unlink(const struct ktree *t, int dfd, const char *name, const struct stat *expect, int flags)
{
        if (!ktree_name_ok(name))
                return -EINVAL;
        dfd = base_of(t, dfd);
        if (expect) {
                struct stat cur;
                if (fstatat(dfd, name, &cur, AT_SYMLINK_NOFOLLOW) < 0)
                        return -errno;
                if (!ktree_same(&cur, expect))
                        return -ESTALE;
        }
        return unlinkat(dfd, name, flags) < 0 ? -errno : 0;
}

int ktree_unlink_ino(const struct ktree *t, int dfd, const char *name, uint64_t ino, int flags)
{
        struct stat want = { .st_dev = t->dev, .st_ino = (ino_t)ino };
        return ktree_unlink(t, dfd, name, &want, flags);
}

int ktree_rename(const struct ktree *t, int ofd, const char *oname, int nfd, const char *nname, unsigned flags)
{
        if (!ktree_name_ok(oname) || !ktree_name_ok(nname))
                return -EINVAL;
        return syscall(SYS_renameat2, base_of(t, ofd), oname, base_of(t, nfd), nname, flags) < 0 ? -errno : 0;
}

int ktree_mkdir(const struct ktree *t, int dfd, const char *name, mode_t mode)
{
        if (!ktree_name_ok(name))
                return -EINVAL;
        return mkdirat(base_of(t, dfd), name, mode) < 0 ? -errno : 0;
}

int ktree_symlink(const struct ktree *t, const char *target, int dfd, const char *name)
{
        if (!ktree_name_ok(name))
                return -EINVAL;
        return symlinkat(target, base_of(t, dfd), name) < 0 ? -errno : 0;
}

int ktree_mknod(const struct ktree *t, int dfd, const char *name, mode_t mode, dev_t rdev)
{
        if (!ktree_name_ok(name))
                return -EINVAL;
        return mknodat(base_of(t, dfd), name, mode, rdev) < 0 ? -errno : 0;
}

int ktree_link(const struct ktree *t, int fd, int nfd, const char *nname)
{
        if (!ktree_name_ok(nname))
                return -EINVAL;
        char proc[64];
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        return linkat(AT_FDCWD, proc, base_of(t, nfd), nname, AT_SYMLINK_FOLLOW) < 0 ? -errno : 0;
}

int ktree_chase_dir(const char *path, uid_t uid, char *why, size_t len)
{
        char todo[2 * PATH_MAX], next[2 * PATH_MAX], target[PATH_MAX], name[NAME_MAX + 1];
        int e;
        if (path[0] == '/') {
                e = snprintf(todo, sizeof(todo), "%s", path) >= (int)sizeof(todo) ? ENAMETOOLONG : 0;
        } else if (!getcwd(todo, PATH_MAX)) {
                e = errno;
                snprintf(why, len, "cannot tell the working directory: %s", strerror(e));
                return -e;
        } else {
                size_t l = strlen(todo);
                e = snprintf(todo + l, sizeof(todo) - l, "/%s", path) >= (int)(sizeof(todo) - l) ? ENAMETOOLONG : 0;
        }
        if (e) { /* never a walk to a prefix of what was asked */
                snprintf(why, len, "'%s': %s", path, strerror(e));
                return -e;
        }
        int cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC), r = 0;
        if (cur < 0) {
                e = errno;
                snprintf(why, len, "cannot open /: %s", strerror(e));
                return -e;
        }
        unsigned links = 0;
        const char *rest = todo;
        for (;;) {
                while (*rest == '/')
                        rest++;
                if (!*rest)
                        break;
                size_t l = strcspn(rest, "/");
                if (l > NAME_MAX) {
                        r = -ENAMETOOLONG;
                        snprintf(why, len, "'%s': %s", path, strerror(-r));
                        break;
                }
                memcpy(name, rest, l);
                name[l] = '\0';
                rest += l;
                while (*rest == '/')
                        rest++;
                bool last = !*rest;
                if (!strcmp(name, "."))
                        continue;
                int fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
                struct stat st;
                if (fd < 0 || fstat(fd, &st) < 0) {
                        r = -errno;
                        snprintf(why, len, "'%s' on the way to '%s': %s", name, path, strerror(-r));
                        if (fd >= 0)
                                close(fd);
                        break;
                }
                if (S_ISLNK(st.st_mode)) {
                        if (st.st_uid != 0 && st.st_uid != uid) {
                                close(fd);
                                r = -EACCES;
                                snprintf(why, len, "'%s' on the way to '%s' is a symbolic link of uid %u, who chooses "
                                         "where it leads: name the directory itself", name, path, (unsigned)st.st_uid);
                                break;
                        }
                        ssize_t n = readlinkat(fd, "", target, sizeof(target) - 1);
                        e = errno;
                        close(fd);
                        if (n < 0 || ++links > 40) {
                                r = n < 0 ? -e : -ELOOP;
                                snprintf(why, len, "'%s' on the way to '%s': %s", name, path, strerror(-r));
                                break;
                        }
                        target[n] = '\0';
                        /* the link's target, then the rest; never a prefix of it */
                        if (snprintf(next, sizeof(next), "%s/%s", target, rest) >= (int)sizeof(next)) {
                                r = -ENAMETOOLONG;
                                snprintf(why, len, "'%s' on the way to '%s': %s", name, path, strerror(-r));
                                break;
                        }
                        memcpy(todo, next, sizeof(todo));
                        rest = todo;
                        if (target[0] == '/') { /* from "/" again */
                                int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
                                if (root < 0) {
                                        r = -errno;
                                        snprintf(why, len, "cannot open /: %s", strerror(-r));
                                        break;
                                }
                                close(cur);
                                cur = root;
                        }
                        continue;
                }
                if (!S_ISDIR(st.st_mode)) {
                        close(fd);
                        r = -ENOTDIR;
                        snprintf(why, len, "'%s' on the way to '%s' is not a directory", name, path);
                        break;
                }
                unsigned mode = (unsigned)st.st_mode & 07777;
                bool others = st.st_uid != 0 && st.st_uid != uid, open_to_all = (mode & 022) && !(mode & S_ISVTX);
                if (!last && (others || open_to_all)) { /* whoever may write it may swap what lies below */
                        close(fd);
                        r = -EACCES;
                        if (others)
                                snprintf(why, len, "'%s' on the way to '%s' belongs to uid %u (mode %04o), who could "
                                         "swap what lies below it", name, path, (unsigned)st.st_uid, mode);
                        else
                                snprintf(why, len, "'%s' on the way to '%s' is writable by others (mode %04o), who "
                                         "could swap what lies below it", name, path, mode);
                        break;
                }
                close(cur);
                cur = fd;
        }
        int d = r == 0 ? openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (r == 0 && d < 0) {
                r = -errno;
                snprintf(why, len, "'%s': %s", path, strerror(errno));
        }
        close(cur);
        return r < 0 ? r : d;
}
