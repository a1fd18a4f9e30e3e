/* marks.c: the directories kcache env made for a runtime, which are that runtime's.
 *
 * A runtime's files are recognised by its layout (units.c), which cannot always tell: a file named
 * 7.bin is a SYCL entry's in SYCL's cache and nobody's in another. kcache env makes one directory per
 * runtime directly in the mount's root, and marks it (setxattr user.kcachefs.runtime=NAME, control.c);
 * the daemon keeps the mark on the backing directory, under the same name (never passed through), and
 * reads the marks back at mount. Inside a marked directory, that runtime's rules apply and no other's;
 * -o layout= still overrides (the operator's word), and unmarked directories are recognised by layout.
 * A marked directory that is removed or renamed takes its mark along (ops-entry.c tells us). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

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

int kev_mark(struct kfs *fs, const char *name, int dirfd, enum krt rt)
{
        if (!*name || strchr(name, '/'))
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

void kev_marks_load(struct kfs *fs)
{
        int fd = openat(fs->tree.root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (!d) {
                if (fd >= 0)
                        close(fd);
                return;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, "..") || !strcmp(de->d_name, KFS_META_DIR)))
                        continue;
                int c = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (c < 0)
                        continue;
                char v[64];
                ssize_t n = fgetxattr(c, MARK_XATTR, v, sizeof(v) - 1);
                close(c);
                if (n <= 0)
                        continue;
                v[n] = '\0';
                int rt = krt_by_name(v);
                if (rt > KRT_AUTO)
                        (void)kev_mark(fs, de->d_name, -1, (enum krt)rt);
        }
        closedir(d);
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
