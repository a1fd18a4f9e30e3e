/* prune.c: the directories eviction empties.
 *
 * EMPTIED DIRECTORIES. Directories are not counted (only regular files are), but every key a runtime ever
 * stored made some (PoCL: <hash>/<build>/, Triton: <key>/), and a cache that left them behind grew its
 * backing without bound (2.6 times its limit after two PoCL runs: 1,546 empty directories). So once a
 * victim's names are gone, each directory above it that eviction emptied goes too, up to the runtime's
 * root (dir_kept), unless a request named it in the last DIR_GRACE (prune_dir). rmdir removes nothing
 * that is not empty, so a directory a runtime is filling stays; the grace is for the one it is about to
 * fill. A runtime stores by making the directory (mkdir -p: the kernel looks the existing directory up
 * again for each mkdir, LOOKUP_EXCL, and that lookup reaches the daemon), then creating its file,
 * often elsewhere (PoCL's tempfile-* in the root), then renaming it in: the rename finds the directory
 * only if nothing removed it since the mkdir. A lookup of the directory, or any lookup, create or
 * rename in it, stamps its inode (kfs_dir_named) under itable_lock, and prune_dir checks the stamp and
 * removes the directory under that lock too: either the lookup came first and the directory stays, or
 * the removal did and the mkdir makes the directory anew. A directory that stays for its stamp is looked
 * at again once the grace has passed (prune_later: the descent thread wakes for it, and every eviction
 * looks), so what a cache holds of empty directories is what eviction emptied in the last DIR_GRACE,
 * at most PRUNE_LATER_MAX of them beyond that. The removed directory's inode is marked evicted like a
 * file's: a lookup in it, or a create, answers ESTALE, and the VFS looks its path up again and finds
 * it gone. Left is a runtime that made its directory more than DIR_GRACE before it creates in it
 * without making it again: Triton (makedirs at lookup, its temporary directory seconds later), NEO
 * (under its own lock) and SYCL keep their directories for that reason (kev_prunes()); the generic layout
 * and PoCL make theirs as they store. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define DIR_GRACE_MS 2000
#define PRUNE_LATER_MAX 4096

/* Whether eviction keeps the directory rel (relative to the backing root) even when it is empty: the root
 * of a runtime's cache, where a runtime expects it to stay. Those are the directories directly in the
 * mount's root (where kcache env and operators put each runtime's cache), users/<uid> and the runtimes'
 * directories in it (kcache env on a shared mount, ../users.c), the layout= directories, and
 * the roots runtimes make inside the directory they are given (common/runtimes.c, roots). */
static bool dir_kept(const struct kfs *fs, const char *rel)
{
        if (!strchr(rel, '/') || kfs_users_level(rel) > 0 || krt_is_root_dir(rel))
                return true;
        for (size_t i = 0; i < fs->o.nlayouts; i++)
                if (!strcmp(fs->o.layouts[i].dir, rel))
                        return true;
        return false;
}

/* Whether eviction removes the directories it empties in a unit of rt (EMPTIED DIRECTORIES): the
 * runtime's descriptor says (common/runtimes.c, keeps_dirs). Not where the runtime makes a directory once
 * and then relies on it: Triton makes the key directory at lookup, and mkdir()s its temporary directory
 * inside it when it stores, seconds later (runtimes.md: never rmdir a key directory that may be in use);
 * NEO mkdirs its two levels before its rename, under its own lock; SYCL creates its directories, then its
 * O_EXCL lock file in them; the CUDA driver manages its own; Numba makes its directory when a function is
 * first compiled and stores into it when the compilation ends. */
bool kev_prunes(enum krt rt)
{
        return !krt_table[rt].keeps_dirs;
}

static int64_t dir_grace_ns(const struct kfs *fs)
{
        return (int64_t)(fs->o.grace_ms > DIR_GRACE_MS ? fs->o.grace_ms : DIR_GRACE_MS) * 1000000;
}

/* evict_lock held. rel (the directory ino) is looked at again from due on. */
static void prune_later(struct kfs *fs, const char *rel, uint64_t ino, int64_t due)
{
        size_t i = 0;
        while (i < fs->ev->prune.n && (fs->ev->prune.rel[i].ino != ino || strcmp(fs->ev->prune.rel[i].rel, rel)))
                i++;
        if (i == fs->ev->prune.n) {
                if (i == PRUNE_LATER_MAX)
                        return; /* it stays, empty, until an eviction empties it again */
                char *d = strdup(rel);
                struct kev_dirref *r = realloc(fs->ev->prune.rel, (i + 1) * sizeof(*r));
                if (r)
                        fs->ev->prune.rel = r;
                int64_t *t = realloc(fs->ev->prune.due, (i + 1) * sizeof(*t));
                if (t)
                        fs->ev->prune.due = t;
                if (!d || !r || !t) {
                        free(d);
                        return;
                }
                fs->ev->prune.rel[i] = (struct kev_dirref){ d, ino };
                fs->ev->prune.n++;
        }
        fs->ev->prune.due[i] = due;
        int64_t next = atomic_load(&fs->ev->prune.next);
        if (!next || due < next)
                atomic_store(&fs->ev->prune.next, due);
        pthread_mutex_lock(&fs->ev->space_lock);
        if (kev_descent_started_locked(fs)) /* the descent wakes at prune.next */
                pthread_cond_signal(&fs->ev->descent.cond);
        pthread_mutex_unlock(&fs->ev->space_lock);
}

/* Whether the directory open for reading at fd holds anything but . and .. (true on an error: a
 * directory that cannot be read is not removed). fd's offset moves; the caller closes it. */
static bool dir_has_entries(int fd)
{
        char buf[512];
        for (;;) {
                long n = syscall(SYS_getdents64, fd, buf, sizeof(buf));
                if (n <= 0)
                        return n < 0;
                for (long off = 0; off < n;) {
                        const struct dirent64 *d = (const struct dirent64 *)(buf + off);
                        if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
                                return true;
                        off += d->d_reclen;
                }
        }
}

/* first_now: the first directory goes even if named within the grace (a unit that is a directory: the
 * runtime never stores into one that exists, it makes it). */
/* evict_lock held. Removes the directory rel, inode ino, if it is empty and not named within DIR_GRACE,
 * then each directory above it that this empties, up to the runtime's root (EMPTIED DIRECTORIES). Each is
 * reached through its path beneath the root without symlinks (tree.h) and removed only if it still is the
 * directory meant: ino for the first, the parent whose name held it for the next (R4). A path that leads
 * elsewhere, or is too long to resolve, ends the pruning: an empty directory left costs nothing counted. */
void kev_prune_dir_at(struct kfs *fs, const char *dir_rel, uint64_t ino, struct notify_list *nl, bool first_now)
{
        char *rel = strdup(dir_rel);
        if (!rel)
                return;
        while (!dir_kept(fs, rel)) {
                /* Most directories that lose a file keep others: a read of their first entries says so
                 * without a lock or a path walk to the parent. */
                struct kev_dirref ref = { rel, ino };
                int fd = kev_dirref_open(fs, &ref, O_RDONLY);
                if (fd >= 0 && dir_has_entries(fd)) {
                        close(fd);
                        break;
                }
                if (fd == -EACCES || fd == -EPERM) /* not readable (a daemon not run as root): rmdir decides */
                        fd = kev_dirref_open(fs, &ref, O_PATH);
                struct stat st, ps;
                if (fd < 0 || fstat(fd, &st) < 0) {
                        if (fd >= 0)
                                close(fd);
                        break;
                }
                char *base = strrchr(rel, '/') + 1; /* dir_kept: rel has a parent below the root */
                base[-1] = '\0';
                int pfd = ktree_open(&fs->tree, KTREE_ROOT, rel, O_PATH | O_DIRECTORY, 0);
                base[-1] = '/';
                bool gone = false;
                int64_t named = 0, now = kfs_now_ns();
                if (pfd >= 0 && fstat(pfd, &ps) == 0) {
                        pthread_mutex_lock(&fs->itable_lock);
                        struct kfs_inode *in = kfs_inode_find_locked(fs, st.st_ino);
                        named = !first_now ? kfs_dir_named_at_locked(fs, in, st.st_ino) : 0;
                        first_now = false;
                        if (named > now - dir_grace_ns(fs)) /* a runtime may be about to store in it */
                                in = NULL;
                        else
                                named = 0;
                        /* still that directory (fd holds it), and empty: rmdir says so; no rename between */
                        kfs_names_lock(fs, ps.st_ino, ps.st_ino);
                        gone = !named && ktree_unlink(&fs->tree, pfd, base, &st, AT_REMOVEDIR) == 0;
                        kfs_names_unlock(fs, ps.st_ino, ps.st_ino);
                        if (gone && in && in != &fs->root) {
                                atomic_store(&in->evicted, true);
                                kfs_inode_fd_retire(fs, in);
                                kmap_del(&fs->itable, in->bino);
                                (void)kmap_put(&fs->detached, (uint64_t)(uintptr_t)in, in);
                                kev_note_inode(fs, nl, in);
                        }
                        if (gone)
                                kev_note_inode(fs, nl, kfs_inode_find_locked(fs, ps.st_ino));
                        pthread_mutex_unlock(&fs->itable_lock);
                        if (gone) /* a runtime may have made the directory anew already */
                                kidx_del_dent_of(fs->idx, ps.st_ino, base, st.st_ino);
                }
                if (pfd >= 0)
                        close(pfd);
                close(fd);
                if (named) {
                        prune_later(fs, rel, ino, named + dir_grace_ns(fs));
                        break;
                }
                if (!gone)
                        break;
                base[-1] = '\0';
                ino = ps.st_ino; /* the parent whose name held it: the next one to look at */
        }
        free(rel);
}

static void prune_dir(struct kfs *fs, const struct kev_dirref *d, struct notify_list *nl)
{
        kev_prune_dir_at(fs, d->rel, d->ino, nl, false);
}

/* evict_lock held. Looks again at the directories whose grace has passed (EMPTIED DIRECTORIES). */
void kev_prune_due(struct kfs *fs, struct notify_list *nl)
{
        int64_t now = kfs_now_ns(), next = atomic_load(&fs->ev->prune.next);
        if (!next || next > now)
                return;
        struct kev_dirref *due = fs->ev->prune.n ? malloc(fs->ev->prune.n * sizeof(*due)) : NULL;
        if (!fs->ev->prune.n)
                atomic_store(&fs->ev->prune.next, 0);
        if (!due)
                return;
        size_t nd = 0, kept = 0;
        next = 0;
        for (size_t i = 0; i < fs->ev->prune.n; i++) {
                if (fs->ev->prune.due[i] <= now) {
                        due[nd++] = fs->ev->prune.rel[i];
                        continue;
                }
                if (!next || fs->ev->prune.due[i] < next)
                        next = fs->ev->prune.due[i];
                fs->ev->prune.rel[kept] = fs->ev->prune.rel[i];
                fs->ev->prune.due[kept++] = fs->ev->prune.due[i];
        }
        fs->ev->prune.n = kept;
        atomic_store(&fs->ev->prune.next, next);
        for (size_t i = 0; i < nd; i++) { /* named again meanwhile: back in the list */
                prune_dir(fs, &due[i], nl);
                free(due[i].rel);
        }
        free(due);
}

/* evict_lock held. After an eviction inside a write: the directories it emptied are looked at by the
 * descent thread, not by the write (one read each, a thousand for a large write). */
void kev_prune_lost_soon(struct kfs *fs, struct notify_list *nl)
{
        if (!fs->ev->prune.nlost)
                return;
        int64_t now = kfs_now_ns(), next = atomic_load(&fs->ev->prune.next);
        pthread_mutex_lock(&fs->ev->space_lock);
        bool thread = kev_descent_started_locked(fs);
        if (thread) {
                if (!next || next > now)
                        atomic_store(&fs->ev->prune.next, now);
                pthread_cond_signal(&fs->ev->descent.cond);
        }
        pthread_mutex_unlock(&fs->ev->space_lock);
        if (!thread)
                kev_prune_lost(fs, nl);
}

static uint64_t path_hash(const char *p)
{
        uint64_t h = 1469598103934665603ULL; /* FNV-1a */
        for (; *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        return h ? h : 1;
}

/* evict_lock held. Looks at the directories that lost files, then forgets them. */
void kev_prune_lost(struct kfs *fs, struct notify_list *nl)
{
        for (size_t i = 0; i < fs->ev->prune.nlost; i++) {
                prune_dir(fs, &fs->ev->prune.lost[i], nl);
                free(fs->ev->prune.lost[i].rel);
        }
        fs->ev->prune.nlost = 0;
        kmap_free(&fs->ev->prune.lost_at);
        kmap_init(&fs->ev->prune.lost_at);
}

/* evict_lock held. The directory of path (relative to the backing root) lost a file: it joins those of
 * this eviction, each once, looked at when the eviction ends (or every PRUNE_LOST_MAX of them): a descent
 * of 12,000 victims in 1,000 directories looks at 1,000. A directory that still holds a file costs one
 * read of its first entries. */
#define PRUNE_LOST_MAX 1024
void kev_note_emptied(struct kfs *fs, const char *path, uint64_t dir_ino, struct notify_list *nl)
{
        const char *slash = strrchr(path, '/');
        char *dir = slash ? strndup(path, (size_t)(slash - path)) : NULL;
        if (!dir)
                return;
        uint64_t h = path_hash(dir);
        uintptr_t at = (uintptr_t)kmap_get(&fs->ev->prune.lost_at, h);
        if (at && fs->ev->prune.lost[at - 1].ino == dir_ino && !strcmp(fs->ev->prune.lost[at - 1].rel, dir)) {
                free(dir); /* noted already */
                return;
        }
        struct kev_dirref *n = realloc(fs->ev->prune.lost, (fs->ev->prune.nlost + 1) * sizeof(*n));
        if (!n) {
                kev_prune_dir_at(fs, dir, dir_ino, nl, false); /* now, then */
                free(dir);
                return;
        }
        fs->ev->prune.lost = n;
        n[fs->ev->prune.nlost++] = (struct kev_dirref){ dir, dir_ino };
        if (!at)
                (void)kmap_put(&fs->ev->prune.lost_at, h, (void *)(uintptr_t)fs->ev->prune.nlost);
        if (fs->ev->prune.nlost >= PRUNE_LOST_MAX)
                kev_prune_lost(fs, nl);
}

void kev_prune_free(struct kfs *fs)
{
        for (size_t i = 0; i < fs->ev->prune.n; i++)
                free(fs->ev->prune.rel[i].rel);
        free(fs->ev->prune.rel);
        free(fs->ev->prune.due);
        fs->ev->prune.rel = NULL;
        fs->ev->prune.due = NULL;
        fs->ev->prune.n = 0;
        for (size_t i = 0; i < fs->ev->prune.nlost; i++)
                free(fs->ev->prune.lost[i].rel);
        free(fs->ev->prune.lost);
        fs->ev->prune.lost = NULL;
        fs->ev->prune.nlost = 0;
        kmap_free(&fs->ev->prune.lost_at);
}
