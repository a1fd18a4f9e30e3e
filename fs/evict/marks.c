/* marks.c: the directories kcache env made for a runtime, which are that runtime's.
 *
 * A runtime's files are recognised by its layout (units.c), which cannot always tell: a file named
 * 7.bin is a SYCL entry's in SYCL's cache and nobody's in another. kcache env makes one directory per
 * runtime, directly in the mount's root, or on a shared mount in the user's own directory
 * (users/<uid>/<runtime>, ../users.c), and marks it (setxattr user.kcachefs.runtime=NAME, control.c);
 * the daemon keeps the mark on the backing directory, under the same name (never passed through), and
 * reads the marks back at mount. Inside a marked directory, that runtime's rules apply and no other's;
 * -o layout= still overrides (the operator's word), and unmarked directories are recognised by layout.
 * A mark is keyed by its directory's path: one name, or users/<uid>/<name> (kev_markable). A marked
 * directory in the root that is removed or renamed takes its mark along (ops-entry.c tells us); so does
 * users/ (all of its marks go). At mount a mark below users/ is read only from directories the users.c
 * rules trust (U1): a mark planted in another user's tree is never believed.
 * Everything here reads the backing tree through common/tree.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../../common/tree.h"
#include "internal.h"

#define MARK_XATTR "user.kcachefs.runtime"

/* marks.lock held. */
static size_t find_locked(struct kev *ev, const char *name, size_t len)
{
        for (size_t i = 0; i < ev->marks.n; i++)
                if (strlen(ev->marks.v[i].name) == len && !strncmp(ev->marks.v[i].name, name, len))
                        return i;
        return SIZE_MAX;
}

/* marks.lock held. rt KRT_AUTO: unmarked. */
static int set_locked(struct kev *ev, const char *name, enum krt rt)
{
        size_t i = find_locked(ev, name, strlen(name));
        if (i != SIZE_MAX) {
                if (rt != KRT_AUTO) {
                        ev->marks.v[i].rt = rt;
                        return 0;
                }
                free(ev->marks.v[i].name);
                ev->marks.v[i] = ev->marks.v[--ev->marks.n];
                return 0;
        }
        if (rt == KRT_AUTO)
                return 0;
        void *nv = realloc(ev->marks.v, (ev->marks.n + 1) * sizeof(*ev->marks.v));
        char *d = strdup(name);
        if (!nv || !d) {
                free(d);
                if (nv)
                        ev->marks.v = nv;
                return -ENOMEM;
        }
        ev->marks.v = nv;
        ev->marks.v[ev->marks.n++] = (struct kev_mark){ d, rt };
        return 0;
}

bool kev_markable(const char *rel)
{
        if (*rel && !strchr(rel, '/'))
                return strcmp(rel, KFS_USERS_DIR) != 0; /* the container is nobody's runtime */
        return kfs_users_level(rel) == 2;
}

int kev_mark(struct kfs *fs, const char *name, int dirfd, enum krt rt)
{
        if (!kev_markable(name))
                return -EINVAL;
        if (dirfd >= 0) { /* kept on the backing directory, for the next mount */
                char proc[64];
                kfs_proc_path(proc, sizeof(proc), dirfd);
                const char *v = krt_table[rt].name;
                int r = rt == KRT_AUTO ? removexattr(proc, MARK_XATTR) : setxattr(proc, MARK_XATTR, v, strlen(v), 0);
                if (r < 0 && errno != ENODATA && errno != ENOTSUP && errno != EOPNOTSUPP)
                        return -errno; /* where the backing filesystem has no user xattrs, until unmounted */
        }
        pthread_mutex_lock(&fs->ev->marks.lock);
        int r = set_locked(fs->ev, name, rt);
        pthread_mutex_unlock(&fs->ev->marks.lock);
        return r;
}

void kev_mark_moved(struct kfs *fs, const char *from, const char *to)
{
        pthread_mutex_lock(&fs->ev->marks.lock);
        size_t ul = strlen(KFS_USERS_DIR);
        for (size_t i = 0; !strcmp(from, KFS_USERS_DIR) && i < fs->ev->marks.n;) /* users/ went: its marks too */
                if (!strncmp(fs->ev->marks.v[i].name, KFS_USERS_DIR, ul) && fs->ev->marks.v[i].name[ul] == '/')
                        (void)set_locked(fs->ev, fs->ev->marks.v[i].name, KRT_AUTO); /* moves the last to i */
                else
                        i++;
        size_t i = find_locked(fs->ev, from, strlen(from));
        if (i != SIZE_MAX) {
                enum krt rt = fs->ev->marks.v[i].rt;
                (void)set_locked(fs->ev, from, KRT_AUTO);
                if (to)
                        (void)set_locked(fs->ev, to, rt);
        }
        pthread_mutex_unlock(&fs->ev->marks.lock);
}

enum krt kev_mark_of(struct kfs *fs, const char *path)
{
        size_t len = strcspn(path, "/");
        if (!path[len]) /* a file in the root: no directory of a runtime's */
                return KRT_AUTO;
        if (len == strlen(KFS_USERS_DIR) && !strncmp(path, KFS_USERS_DIR, len)) {
                /* users/<uid>/<name>/...: the mark is the third component's */
                const char *u = path + len + 1, *rtd = u + strcspn(u, "/");
                if (!*rtd)
                        return KRT_AUTO;
                rtd++;
                len = (size_t)(rtd - path) + strcspn(rtd, "/");
                if (!path[len]) /* a file directly in a user's directory */
                        return KRT_AUTO;
        }
        enum krt rt = KRT_AUTO;
        pthread_mutex_lock(&fs->ev->marks.lock);
        size_t i = fs->ev->marks.n ? find_locked(fs->ev, path, len) : SIZE_MAX;
        if (i != SIZE_MAX)
                rt = fs->ev->marks.v[i].rt;
        pthread_mutex_unlock(&fs->ev->marks.lock);
        return rt;
}

enum krt kev_mark_get(struct kfs *fs, const char *name)
{
        enum krt rt = KRT_AUTO;
        pthread_mutex_lock(&fs->ev->marks.lock);
        size_t i = find_locked(fs->ev, name, strlen(name));
        if (i != SIZE_MAX)
                rt = fs->ev->marks.v[i].rt;
        pthread_mutex_unlock(&fs->ev->marks.lock);
        return rt;
}

/* The mark kept on the directory name in dfd, or KRT_AUTO. */
static enum krt read_mark(const struct ktree *t, int dfd, const char *name)
{
        int c = ktree_open(t, dfd, name, O_RDONLY | O_DIRECTORY, 0);
        if (c < 0)
                return KRT_AUTO;
        char v[64];
        ssize_t n = fgetxattr(c, MARK_XATTR, v, sizeof(v) - 1);
        close(c);
        if (n <= 0)
                return KRT_AUTO;
        v[n] = '\0';
        int rt = krt_by_name(v);
        return rt > KRT_AUTO ? (enum krt)rt : KRT_AUTO;
}

/* Each directory in dfd that holds a mark, under prefix (a path ending in '/', or ""). */
static void load_dir(struct kfs *fs, const struct ktree *t, int dfd, const char *prefix)
{
        DIR *d = ktree_opendir(t, dfd, "");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                char key[PATH_MAX];
                if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, "..") ||
                                             (!*prefix && !strcmp(de->d_name, KFS_META_DIR))))
                        continue;
                if (snprintf(key, sizeof(key), "%s%s", prefix, de->d_name) >= (int)sizeof(key) || !kev_markable(key))
                        continue;
                enum krt rt = read_mark(t, dirfd(d), de->d_name);
                if (rt != KRT_AUTO)
                        (void)kev_mark(fs, key, -1, rt);
        }
        if (d)
                closedir(d);
}

void kev_marks_load(struct kfs *fs)
{
        const struct ktree *t = &fs->tree;
        struct stat st;
        load_dir(fs, t, KTREE_ROOT, "");
        /* users/<uid>/<name>, only where users.c trusts users/ and users/<uid> (U1) */
        int ufd = ktree_open(t, KTREE_ROOT, KFS_USERS_DIR, O_RDONLY | O_DIRECTORY, 0);
        DIR *d = ufd >= 0 && fstat(ufd, &st) == 0 && kfs_users_container_ok(&st) ? ktree_opendir(t, ufd, "") : NULL;
        struct dirent *de;
        while (d && (de = readdir(d))) {
                uid_t uid;
                char prefix[300];
                int hfd = kfs_users_uid(de->d_name, &uid) ? ktree_open(t, dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY, 0)
                                                          : -1;
                if (hfd >= 0 && fstat(hfd, &st) == 0 && kfs_users_home_ok(&st, uid)) {
                        snprintf(prefix, sizeof(prefix), "%s/%s/", KFS_USERS_DIR, de->d_name);
                        load_dir(fs, t, hfd, prefix);
                }
                if (hfd >= 0)
                        close(hfd);
        }
        if (d)
                closedir(d);
        if (ufd >= 0)
                close(ufd);
}

void kev_marks_free(struct kfs *fs)
{
        for (size_t i = 0; i < fs->ev->marks.n; i++)
                free(fs->ev->marks.v[i].name);
        free(fs->ev->marks.v);
        fs->ev->marks.v = NULL;
        fs->ev->marks.n = 0;
        pthread_mutex_destroy(&fs->ev->marks.lock);
}
