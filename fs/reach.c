/* reach.c: whether anybody but root and the daemon's user can reach the backing directory (and an index
 * kept outside it) by its path. Checked once at mount, before the daemon opens them.
 *
 * WHY. A shared mount's daemon runs as root and enforces the limit, keeps the index and follows no link in
 * the backing tree only because every change to the tree comes through the mount. A user who can reach the
 * backing directory itself writes past the limit and outside the index, and plants symlinks and renames
 * for the root daemon to meet. The backing root cannot be closed itself: its mode is the mount root's,
 * which a shared mount makes 1777. So the path to it must be closed:
 *   P1  every directory from "/" down to the checked one (itself included) is owned by root or by the
 *       daemon's user, so nobody else can rename it, replace it or change its mode;
 *   P2  every directory strictly above the checked one is, unless sticky (like /tmp, where others cannot
 *       rename or remove what they do not own), writable by its owner only, so nobody else can swap a
 *       component;
 *   P3  some directory above the checked one (for an index's directory: it too) denies search to group
 *       and other (mode & 011 == 0), so nobody else can look a name up beneath it.
 * The checked directory's own write bits are not looked at: nobody else reaches it (P3), and for the
 * backing they are the mount root's, which the kernel checks (default_permissions) for every user.
 * With ACLs, the group bits of the mode are the mask, which bounds every named user and group: mode bits
 * alone are the whole answer. The walk goes by the resolved path, from "/" down, each component by lstat:
 * P1 and P2 for every directory above make the path one that only root and the daemon's user can change,
 * so what was checked is what open() meets afterwards.
 *
 * WHAT IT CANNOT SEE. A process that entered the directory (its working directory, an open descriptor)
 * before the path was closed keeps its way in. Make the private directory 0700 when it is created (mkdir -m
 * 700), as the unit, the prolog and quickstart do.
 *
 * -o tighten fixes the one case that is safe to fix in place: P3 alone fails, and the directory to close
 * (the backing's parent; the index's own directory) is not "/", is owned by the daemon's user, and is not
 * shared (not sticky, not writable by group or other: closing /tmp would lock everybody else out of it).
 * It drops that directory's group and other bits (chmod go-rwx) and says so. Nothing else is changed for
 * the operator: a directory another user owns, a chain that others can write, "/" are theirs to decide. */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kfs.h"

/* "uid 1001 (bob)" or "root" */
static void owner_name(uid_t uid, char *buf, size_t len)
{
        struct passwd *pw = uid == 0 ? NULL : getpwuid(uid);
        if (uid == 0)
                snprintf(buf, len, "root");
        else if (pw)
                snprintf(buf, len, "uid %u (%s)", (unsigned)uid, pw->pw_name);
        else
                snprintf(buf, len, "uid %u", (unsigned)uid);
}

static char *say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *say(const char *fmt, ...)
{
        va_list ap;
        char *s = NULL;
        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        return s;
}

/* Drops DIR's group and other bits, on the directory that was checked (ST) and no other. */
static int close_dir(const char *dir, const struct stat *st)
{
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        struct stat now;
        int r = fstat(fd, &now) < 0 ? -errno : (now.st_dev != st->st_dev || now.st_ino != st->st_ino) ? -ESTALE : 0;
        if (r == 0 && fchmod(fd, now.st_mode & 07700) < 0)
                r = -errno;
        close(fd);
        return r;
}

int kfs_reach_check(const char *what, const char *path, bool self_counts, uid_t uid, bool tighten,
                    const char *keep_open, char **ret_note, char **ret_why)
{
        size_t n = strlen(path);
        char *p = malloc(n + 2);
        char own[64];
        int r = 0;
        bool closed = false; /* P3 holds */
        struct stat st, last = { 0 };
        const char *advice = uid == 0 ? "a directory of its own that only root can enter (mkdir -m 700 DIR)"
                                      : "a directory of its own that only you can enter (mkdir -m 700 DIR)";
        *ret_note = *ret_why = NULL;
        if (!p)
                return -ENOMEM;
        if (path[0] != '/') {
                free(p);
                return -EINVAL;
        }
        /* Each prefix of PATH, from "/" down: "/", "/a", "/a/b", ... (PATH is resolved: no "//", no "."). */
        for (size_t e = 1;;) {
                memcpy(p, path, e);
                p[e] = '\0';
                bool self = e >= n;
                if (lstat(p, &st) < 0) {
                        r = -errno;
                        *ret_why = say("cannot examine '%s' on the way to the %s '%s': %s", p, what, path,
                                       strerror(errno));
                        goto out;
                }
                if (!S_ISDIR(st.st_mode)) {
                        r = -ENOTDIR;
                        *ret_why = say("'%s' on the way to the %s '%s' is no longer a directory (it changed while "
                                       "checked)", p, what, path);
                        goto out;
                }
                unsigned mode = (unsigned)st.st_mode & 07777;
                owner_name(st.st_uid, own, sizeof(own));
                if (st.st_uid != 0 && st.st_uid != uid) { /* P1 */
                        r = -EACCES;
                        *ret_why = say("the %s '%s' can be reached by other users: '%s' belongs to %s (mode %04o), "
                                       "who can rename it or change its mode; chown root '%s' or put the %s in %s",
                                       what, path, p, own, mode, p, what, advice);
                        goto out;
                }
                if (!self && (mode & 022) && !(mode & S_ISVTX)) { /* P2 */
                        r = -EACCES;
                        *ret_why = say("the %s '%s' can be reached by other users: '%s' (owner %s, mode %04o) is "
                                       "writable by %s and not sticky; chmod go-w '%s' or put the %s in %s",
                                       what, path, p, own, mode, (mode & 002) ? "everyone" : "its group", p, what,
                                       advice);
                        goto out;
                }
                if (!self || self_counts || n == 1) {
                        last = st; /* the directory that closing would close */
                        if (!(mode & 011) && (!self || self_counts))
                                closed = true; /* P3 */
                }
                if (self)
                        break;
                for (e++; e < n && path[e] != '/'; e++)
                        ;
        }
        if (closed)
                goto out;

        /* P3 fails: the directory to close is the last one that counts (the backing's parent, or the index's
         * own directory). */
        char *dir = p;
        if (!self_counts) {
                char *slash = strrchr(dir, '/');
                if (slash == dir)
                        dir[1] = '\0';
                else if (slash)
                        *slash = '\0';
        }
        unsigned mode = (unsigned)last.st_mode & 07777;
        owner_name(last.st_uid, own, sizeof(own));
        bool shared = (mode & S_ISVTX) || (mode & 022);
        size_t dl = strlen(dir);
        bool holds_mount = keep_open && !strncmp(keep_open, dir, dl) && (keep_open[dl] == '/' || !keep_open[dl]);
        if (tighten && holds_mount) {
                r = -EACCES;
                *ret_why = say("-o tighten: will not close '%s': the shared mount point '%s' is inside it and other "
                               "users must reach it; put the %s in %s", dir, keep_open, what, advice);
                goto out;
        }
        if (tighten && strcmp(dir, "/") && last.st_uid == uid && !shared) {
                r = close_dir(dir, &last);
                if (r == 0) {
                        *ret_note = say("-o tighten: closed '%s' to other users (mode %04o, was %04o), so that only "
                                        "%s reaches the %s '%s'", dir, mode & 07700, mode,
                                        uid == 0 ? "root" : "its owner", what, path);
                        goto out;
                }
                *ret_why = say("-o tighten: cannot close '%s': %s", dir, strerror(-r));
                goto out;
        }
        r = -EACCES;
        if (!strcmp(dir, "/") || shared)
                *ret_why = say("the %s '%s' can be reached by other users: no directory above it denies them search, "
                               "and '%s' (owner %s, mode %04o) is %s; put the %s in %s",
                               what, path, dir, own, mode, !strcmp(dir, "/") ? "the root" : "shared", what, advice);
        else if (last.st_uid != uid)
                *ret_why = say("the %s '%s' can be reached by other users: no directory above it denies them search; "
                               "chmod 700 '%s' (owner %s, mode %04o), or put the %s in %s",
                               what, path, dir, own, mode, what, advice);
        else
                *ret_why = say("the %s '%s' can be reached by other users: no directory above it denies them search; "
                               "chmod 700 '%s' (owner %s, mode %04o), or mount with -o tighten, which does that",
                               what, path, dir, own, mode);
out:
        free(p);
        if (r < 0 && !*ret_why)
                r = -ENOMEM;
        return r;
}
