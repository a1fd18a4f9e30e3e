/* remove.c: removing a chosen unit (evict.h: EXACTNESS, INODE REUSE, TELLING THE KERNEL, and JAX's lock
 * below). Names are checked against the victim's inode number under itable_lock and the directory's name
 * lock, and unlinked there; the index is told after, the kernel last, with no lock held; except that a
 * unit removed under its runtime's lock has its files' attributes dropped before that lock goes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "internal.h"

_Thread_local pid_t kev_writer;

/* itable_lock held. */
void kev_note_inode(struct kfs *fs, struct notify_list *nl, struct kfs_inode *in)
{
        if (!in)
                return;
        void *n = realloc(nl->items, (nl->n + 1) * sizeof(*nl->items));
        if (!n)
                return; /* the kernel then trusts its cache until the timeout: stale, never wrong data */
        nl->items = n;
        nl->items[nl->n].ino = in == &fs->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)in;
        /* directories (their cached listing) and live files (content rewritten by a repair) drop their
         * pages too; an evicted file only its attributes */
        nl->items[nl->n].gone = atomic_load(&in->evicted) && in != &fs->root;
        nl->items[nl->n].told = false;
        nl->items[nl->n++].dir = S_ISDIR(in->type) || !atomic_load(&in->evicted);
}

/* No lock of ours held. Lock-free in the kernel (attributes, and a directory's cached listing, which
 * lives in its page cache): see TELLING THE KERNEL. */
void kev_notify_all(struct kfs *fs, struct notify_list *nl)
{
        size_t gone = 0;
        for (size_t i = 0; i < nl->n; i++)
                if (!nl->items[i].told)
                        (void)fuse_lowlevel_notify_inval_inode(fs->se, nl->items[i].ino, nl->items[i].dir ? 0 : -1, 0);
        /* Then their names go from the kernel's cache, where nobody uses them (kprune.c). */
        uint64_t *ids = nl->n ? malloc(nl->n * sizeof(*ids)) : NULL;
        for (size_t i = 0; ids && i < nl->n; i++)
                if (nl->items[i].gone)
                        ids[gone++] = nl->items[i].ino;
        kfs_kprune(fs, ids, gone);
        free(ids);
        free(nl->items);
        nl->items = NULL;
        nl->n = 0;
}

/* An evicted file's attributes only (offset -1), safe under any lock of ours and from a handler: the
 * kernel looks the inode up (which may wait for one being set up or freed), bumps its attribute version
 * and drops its attributes, and a last iput of a closed inode only queues a FORGET. None of that waits
 * for a reply of the daemon's while the mount has no writeback cache (ops.c turns it off); with one,
 * freeing an inode waits for its WRITE replies. */
void kev_notify_gone(struct kfs *fs, struct notify_list *nl, size_t from)
{
        for (size_t i = from; i < nl->n; i++)
                if (nl->items[i].gone && !nl->items[i].dir && !nl->items[i].told) {
                        (void)fuse_lowlevel_notify_inval_inode(fs->se, nl->items[i].ino, -1, 0);
                        nl->items[i].told = true;
                }
}

/* itable_lock held. Unlinks every name of v that still is v (dirfds[i] for v->names[i]); marks the inode
 * evicted. Returns the number of names removed; *replaced: a name now holds another file (the runtime
 * stored the entry again since it was chosen). */
size_t kev_remove_member_locked(struct kfs *fs, struct victim *v, const int *dirfds, struct notify_list *nl,
                                   bool *replaced)
{
        size_t removed = 0;
        for (size_t i = 0; i < v->nnames; i++) {
                struct stat st;
                if (dirfds[i] < 0)
                        continue;
                kfs_names_lock(fs, v->names[i].dir, v->names[i].dir); /* no rename between check and unlink */
                int fd = ktree_open(&fs->tree, dirfds[i], v->names[i].name, O_PATH, 0);
                if (fd < 0 || fstat(fd, &st) < 0 || st.st_ino != v->ino || st.st_dev != fs->tree.dev) {
                        kfs_names_unlock(fs, v->names[i].dir, v->names[i].dir);
                        if (fd >= 0) {
                                close(fd); /* the index is stale for this name: never remove another file */
                                *replaced = true;
                        }
                        continue;
                }
                int gone = ktree_unlink(&fs->tree, dirfds[i], v->names[i].name, &st, 0);
                kfs_names_unlock(fs, v->names[i].dir, v->names[i].dir);
                if (gone < 0) {
                        close(fd);
                        continue;
                }
                if (v->hold < 0)
                        v->hold = fd;
                else
                        close(fd);
                v->names[i].removed = true;
                removed++;
                struct stat ds;
                if (fstat(dirfds[i], &ds) == 0)
                        kev_note_inode(fs, nl, kfs_inode_find_locked(fs, ds.st_ino));
        }
        /* A name made since the victim was chosen (link) keeps the file: it is not evicted, only the names
         * removed leave the index. Without this, the row went and the file stayed, never counted again. */
        struct stat hs;
        v->lives = removed && fstat(v->hold, &hs) == 0 && hs.st_nlink > 0;
        struct kfs_inode *in = kfs_inode_find_locked(fs, v->ino);
        if (in && removed && !v->lives) {
                atomic_store(&in->evicted, true);
                /* Our O_PATH fd would keep the unlinked inode, and its blocks, alive until the kernel
                 * forgets it, and a descriptor with them: it is closed now, or by the request that
                 * borrows it now (inode.c, T5); the inode lends the placeholder from here on. */
                kfs_inode_fd_retire(fs, in);
                kfs_pt_forget(fs, in); /* a registered backing file holds it open too */
                /* The backing filesystem may now give this inode number to a new file: lookups must
                 * find that file, not this stale inode, which lives on (detached) until it is forgotten. */
                kmap_del(&fs->itable, in->bino);
                (void)kmap_put(&fs->detached, (uint64_t)(uintptr_t)in, in); /* freed at forget or exit */
                kev_note_inode(fs, nl, in);
        }
        return removed;
}

/* JAX (with its own size cap) reads an entry under its .lockfile's flock: exists(-cache), then open;
 * a removal in between makes the read fail (FileNotFoundError), and a -cache seen without its -atime
 * makes every later put of the key fail. So eviction takes the lock itself, without waiting, and a unit
 * whose lock is held stays for now; except for an eviction inside a write (or truncate, or open) of the
 * process that holds the lock: it is inside its own store, and no JAX read of another process is in
 * between (kev_writer). Measurements that make room outside a request (at release, after writeback: a
 * JAX process may be in the middle of a read then) take the lock like the descent.
 *   The choice asks first (choose.c, lock_verdict: kev_jax_lock_probe), so that a held lock makes the walk
 * pass over the cache's units to newer ones (choose.c, ONE VERDICT PER LOCK); asked only here, a user
 * who held a lock over old entries had every eviction choose them, free nothing and give up: ENOSPC for
 * every user of the mount (test_security_review.py). Here it is asked again, as the lock may have been
 * taken since.
 *
 * Opens dfd's .lockfile to take it: its fd, -1 if there is none a get could hold (a FIFO, a symlink:
 * test_security_review.py), -EWOULDBLOCK if that cannot be told (the unit stays). */
static int jax_lock_open(struct kfs *fs, int dfd)
{
        int fd = ktree_open_file(&fs->tree, dfd, KFS_JAX_LOCK, O_RDONLY, 0);
        if (fd == -ENOENT || fd == -ENXIO || fd == -ELOOP)
                return -1;
        return fd < 0 ? -EWOULDBLOCK : fd;
}

/* Takes the lock at fd without waiting: 0 (taken), 1 (the writer this eviction is inside holds it, in_line
 * only: no lock needed), or -EWOULDBLOCK (another holds it). */
static int jax_lock_take(struct kfs *fs, int fd, bool in_line)
{
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                return 0;
        struct stat st;
        return in_line && kev_writer && fstat(fd, &st) == 0 && kfs_flock_held_by(fs, st.st_ino, kev_writer) ? 1
                                                                                                   : -EWOULDBLOCK;
}

bool kev_jax_lock_probe(struct kfs *fs, int dfd)
{
        int fd = jax_lock_open(fs, dfd);
        if (fd == -1)
                return false;
        if (fd < 0)
                return true;
        int r = jax_lock_take(fs, fd, kev_writer != 0);
        if (r == 0)
                kfs_flock_let_go(fd);
        else
                close(fd);
        return r < 0;
}

/* The lock of unit u, taken: its fd, -1 if there is no lock to take, -EWOULDBLOCK if another process holds
 * it or it cannot be told. */
static int runtime_lock(struct kfs *fs, struct dircache *dc, struct victims *vs, struct vunit *u, bool in_line)
{
        if (u->rt != KRT_JAX || !u->count || !vs->v[u->first].nnames || !vs->v[u->first].names[0].path)
                return -1;
        int dfd = dc->fd[kev_dircache_get(fs, dc, vs->v[u->first].names[0].dir)];
        if (dfd < 0)
                return -1; /* the unit's directory cannot be opened: nothing of it is removed either */
        int fd = jax_lock_open(fs, dfd);
        if (fd < 0)
                return fd;
        int r = jax_lock_take(fs, fd, in_line);
        if (r == 0)
                return fd;
        close(fd);
        return r > 0 ? -1 : -EWOULDBLOCK;
}

/* Removes one unit: all its files in order, or none if any of them was opened since it was chosen.
 * A member found replaced (stored again since it was chosen) ends the unit there: the runtime's order
 * puts its completion marker first (PoCL's program.bc), so a re-stored entry loses nothing, and one
 * whose later members are being re-stored loses only what the store is writing again. Returns the
 * bytes freed. */
uint64_t kev_evict_unit(struct kfs *fs, struct dircache *dc, struct victims *vs, struct vunit *u,
                           struct notify_list *nl, bool in_line)
{
        size_t total = 0;
        for (size_t k = 0; k < u->count; k++)
                total += vs->v[u->first + k].nnames;
        int lock = runtime_lock(fs, dc, vs, u, in_line);
        size_t nl_from = nl->n;
        int small[16], *fds = lock == -EWOULDBLOCK ? NULL : total <= 16 ? small : malloc(total * sizeof(int));
        if (!fds) { /* the runtime holds its lock: the unit stays, for now */
                for (size_t k = 0; k < u->count; k++)
                        kidx_evict_cancel(fs->idx, vs->v[u->first + k].ino);
                if (lock >= 0)
                        kfs_flock_let_go(lock);
                return 0;
        }
        /* Directories resolved outside itable_lock (index queries, path walks); each name holds its own
         * duplicate, since a later cache lookup may replace an earlier slot. */
        for (size_t k = 0, j = 0; k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                for (size_t i = 0; i < v->nnames; i++, j++) {
                        int fd = v->names[i].path ? dc->fd[kev_dircache_get(fs, dc, v->names[i].dir)] : -1;
                        fds[j] = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
                }
        }
        bool *removed = calloc(u->count ? u->count : 1, sizeof(bool));
        if (!removed) {
                for (size_t j = 0; j < total; j++)
                        if (fds[j] >= 0)
                                close(fds[j]);
                if (fds != small)
                        free(fds);
                for (size_t k = 0; k < u->count; k++)
                        kidx_evict_cancel(fs->idx, vs->v[u->first + k].ino);
                if (lock >= 0)
                        kfs_flock_let_go(lock);
                return 0;
        }
        /* Victims are the least recently used files, so their names and inodes are the ones least likely
         * to be in the kernel's caches: the lookup reads them from the disk (5-20 ms on a busy disk in
         * bench/big). That happens here, outside itable_lock, which every open and lookup takes; under
         * it, kev_remove_member_locked() looks the names up again, from the dentry cache. */
        for (size_t k = 0, j = 0; k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                for (size_t i = 0; i < v->nnames; i++, j++) {
                        struct stat st;
                        if (fds[j] >= 0)
                                (void)fstatat(fds[j], v->names[i].name, &st, AT_SYMLINK_NOFOLLOW);
                }
        }
        pthread_mutex_lock(&fs->itable_lock);
        bool open = false;
        for (size_t k = 0; k < u->count && !open; k++)
                open = kev_is_open_locked(fs, vs->v[u->first + k].ino);
        bool replaced = false;
        for (size_t k = 0, j = 0; !open && !replaced && k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                removed[k] = kev_remove_member_locked(fs, v, fds + j, nl, &replaced) > 0;
                j += v->nnames;
        }
        pthread_mutex_unlock(&fs->itable_lock);
        if (lock >= 0) {
                /* The kernel forgets the removed files' attributes before the runtime may look again: a
                 * -cache whose attributes it held (refresh.c refreshes a read file's) would still stat
                 * as there, from its cache, beside its -atime, which asks and is gone. */
                kev_notify_gone(fs, nl, nl_from);
                kfs_flock_let_go(lock); /* the runtime's lock */
        }
        for (size_t j = 0; j < total; j++)
                if (fds[j] >= 0)
                        close(fds[j]);
        if (fds != small)
                free(fds);
        uint64_t freed = 0;
        int64_t now = kev_now(fs);
        for (size_t k = 0; k < u->count; k++) {
                struct victim *v = &vs->v[u->first + k];
                if (!removed[k] || v->lives) {
                        kidx_evict_cancel(fs->idx, v->ino); /* it stayed (opened meanwhile, or busy) */
                        for (size_t i = 0; i < v->nnames; i++)
                                if (v->names[i].removed)
                                        kidx_del_dent_of(fs->idx, v->names[i].dir, v->names[i].name, v->ino);
                        continue;
                }
                const char *path = v->names[0].path ? v->names[0].path : v->names[0].name;
                freed += v->has_row ? kidx_evicted_row(fs->idx, &v->row, path, now) : kidx_evicted(fs->idx, v->ino, path, now);
                for (size_t i = 0; i < v->nnames; i++) /* remembered: a name that comes back is a refetch */
                        if (v->names[i].removed && v->names[i].path)
                                kev_miss_evicted(fs, v->names[i].path, v->bytes);
                for (size_t i = 0; kev_prunes(u->rt) && i < v->nnames; i++) /* (EMPTIED DIRECTORIES) */
                        if (v->names[i].removed && v->names[i].path)
                                kev_note_emptied(fs, v->names[i].path, v->names[i].dir, nl);
                if (u->rt == KRT_PYOPENCL && k + 1 == u->count && v->nnames && v->names[0].path) {
                        /* The unit is its directory: PyOpenCL and pytools never store into an existing
                         * one (a key directory without its info is a warning and a reset; an item
                         * directory without its files, a key dead for good), so it goes with its last file. */
                        const char *slash = strrchr(v->names[0].path, '/');
                        char *dir = slash ? strndup(v->names[0].path, (size_t)(slash - v->names[0].path)) : NULL;
                        if (dir)
                                kev_prune_dir_at(fs, dir, v->names[0].dir, nl, true);
                        free(dir);
                }
        }
        for (size_t k = 0; k < u->count; k++) { /* the index knows now: the inode number may be reused */
                struct victim *v = &vs->v[u->first + k];
                kev_reap(fs, v->hold, v->bytes); /* frees the blocks, off this path (reap.c) */
                v->hold = -1;
        }
        free(removed);
        return freed;
}

/* Removes dir/name (bookkeeping the daemon repairs) as eviction removes files: index, stale inode, kernel.
 * Only if the name still is fd's file: fd is the one the repair locked or wrote, and the runtime may have
 * made a new file under the name since (when NEO's repair removed config.file, a removal that raced with
 * another took the new file from under the NEO process creating it, whose create then failed). */
void kev_remove_noted(struct kfs *fs, int dirfd, const char *name, int fd, struct notify_list *nl)
{
        struct stat st, ds;
        if (fstat(fd, &st) < 0 || st.st_nlink == 0 || fstat(dirfd, &ds) < 0)
                return; /* gone already */
        struct victim v = { .ino = st.st_ino, .hold = -1 };
        struct name nm = { .dir = ds.st_ino, .name = (char *)name };
        v.names = &nm;
        v.nnames = 1;
        bool replaced = false;
        pthread_mutex_lock(&fs->itable_lock);
        size_t n = kev_remove_member_locked(fs, &v, &dirfd, nl, &replaced);
        pthread_mutex_unlock(&fs->itable_lock);
        if (n) {
                kidx_del_dent_of(fs->idx, ds.st_ino, name, st.st_ino); /* the runtime may store it anew at once */
                if (!v.lives)
                        kidx_del_file(fs->idx, st.st_ino);
        }
        kev_reap(fs, v.hold, (uint64_t)st.st_blocks * 512);
}
