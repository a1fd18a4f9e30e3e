/* ops-io.c: create, open, read, write, fallocate, lseek, flush, fsync, release.
 *
 * The access log is written here: every open, read, write and create is one kidx_touch() (memory only).
 *
 * ATIME. The kernel's view of atime follows the log at the latest once the opener has closed the file:
 * at RELEASE (which the kernel sends as the last descriptor of an open closes, in the background) the
 * daemon invalidates the kernel's attributes of the inode (attributes only, never its pages), so that the
 * next stat asks and gets the logged atime. Not at OPEN: the runtime's fstat right after its open would
 * then wait for a GETATTR round trip. After a read through passthrough the kernel invalidates atime
 * itself (fs/fuse/passthrough.c: fuse_file_accessed -> fuse_invalidate_atime, Linux 6.9+). Then, after a
 * reader's release, refresh.c's child asks for the attributes anew (one GETATTR nobody waits for), so
 * that the next hit's fstat finds them valid and asks nothing (refresh.c, WHY and COST say when not).
 *
 * Space: an operation that may allocate first reserves an upper bound of what it can allocate
 * (estimate()), which may evict (evict/space.c); afterwards it re-reads st_blocks and the index's used total
 * moves by the exact difference. Writes inside already-allocated space reserve nothing and cost no fstat.
 *
 * Open counts (readers/writers, under itable_lock) are what eviction reads to leave open files alone.
 *
 * SETUID. The kernel leaves clearing the setuid and setgid bits on write and truncate to the daemon
 * since devio.c asks for FUSE_HANDLE_KILLPRIV_V2 in INIT (so that a file written in many write(2) calls
 * costs one security.capability probe, a GETXATTR, instead of one per write; before, the kernel cleared
 * them itself with a SETATTR, and nobody did on an O_TRUNC open). The backing filesystem clears
 * security.capability on every write and truncate by the daemon, and the two bits only for a daemon
 * without CAP_FSETID; so a root daemon clears them itself (kfs_kill_suid) when a caller other than root
 * writes, truncates or opens with O_TRUNC, as the VFS would: setgid only with group execute. Every
 * mount is nosuid: this keeps the bits honest for stat and for the backing tree.
 *
 * CREATED FILES. A runtime publishes an entry by creating a temporary, writing it and renaming it. The
 * handle CREATE makes of a new file opened write-only is direct (FOPEN_DIRECT_IO): its write(2) goes to
 * the daemon from the caller's pages, where the kernel's page-cache path first copied the data into
 * the FUSE inode's pages (a copy, and memory, the backing file's page cache holds again) and, since
 * the inode is new, asked for security.capability (a GETXATTR round trip; SETUID). Each write is still
 * one WRITE that reserves (the hard limit), and nothing of the file is cached that a reader could need:
 * the readers that follow open it anew, through passthrough or a page cache the daemon's OPEN decides.
 * A write-only descriptor cannot be mapped, so no shared mapping bypasses the reservation either. A
 * reader of the file meanwhile gets the page-cache mode (passthrough.c), and what it cached of a range
 * is stale once a direct write rewrote it: Linux 6.18 drops the range's pages after each such write
 * (fs/fuse/file.c, since "fuse: Invalidate the page cache after FOPEN_DIRECT_IO write"); older kernels
 * drop them only before the write, or not at all. So each direct write also clears the inode's
 * cache_ok: the next OPEN does not keep the cache (refresh), and every open after the write reads what
 * was written, on any kernel.
 * A descriptor opened while the file is being written may keep stale pages on a kernel without that
 * drop, as with a passthrough inode's writer. The kernel splits a direct write at 256 pages of an
 * unaligned buffer (two WRITEs per MiB of a malloc'd one), where the page cache sends one per
 * max_write: the same reservations, a round trip more per MiB. Not for O_RDWR (mkstemp's): such a
 * writer may read back, and each read would then be a round trip. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kfs.h"
#include "remote/remote.h"

#define BLK 4096ULL

static uint64_t round_up(uint64_t v)
{
        return (v + BLK - 1) / BLK * BLK;
}

/* An upper bound of the bytes a write or fallocate of [off, off+len) can newly allocate: no more than
 * the range itself (plus a block of metadata), and no more than the file could hold if fully allocated. */
static uint64_t estimate(struct kfs_inode *in, uint64_t off, uint64_t len)
{
        pthread_mutex_lock(&in->lock);
        uint64_t alloc = in->alloc, size = in->size;
        bool counted = !in->unlinked;
        pthread_mutex_unlock(&in->lock);
        if (!counted)
                return 0;
        uint64_t end = off + len, full = round_up(end > size ? end : size);
        uint64_t need = full > alloc ? full - alloc : 0, cap = round_up(len) + BLK;
        return need < cap ? need : cap;
}

void kfs_kill_suid(uid_t caller, int fd, const char *proc)
{
        struct stat st;
        if (caller == 0 || geteuid() != 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return;
        bool sgid = (st.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP);
        mode_t kill = (st.st_mode & S_ISUID) | (sgid ? S_ISGID : 0);
        if (kill)
                (void)(proc ? fchmodat(AT_FDCWD, proc, st.st_mode & 07777 & ~kill, 0)
                            : fchmod(fd, st.st_mode & 07777 & ~kill));
}

/* By access mode alone: the kernel strips O_TRUNC from the flags it sends with release. */
static bool is_writer(int flags)
{
        return (flags & O_ACCMODE) != O_RDONLY;
}

/* Returns true when this closed the last open of an evicted file (its name may now be pruned). */
static bool count_open(struct kfs *fs, struct kfs_inode *in, bool writer, int delta)
{
        pthread_mutex_lock(&fs->itable_lock);
        if (writer)
                in->writers += delta;
        else
                in->readers += delta;
        bool last = delta < 0 && !in->readers && !in->writers && atomic_load(&in->evicted);
        pthread_mutex_unlock(&fs->itable_lock);
        return last;
}

/* Re-reads the file through fd (or its O_PATH fd if -1), accounts it (T3), and says whether the kernel
 * may keep its cached pages: only if neither size nor mtime moved since we last looked. */
static bool refresh(struct kfs *fs, struct kfs_inode *in, int fd)
{
        struct stat st;
        bool keep = false;
        pthread_mutex_lock(&in->lock);
        if ((fd >= 0 ? fstat(fd, &st) : kfs_fstat_inode(fs, in, &st)) == 0) {
                keep = in->cache_ok && (uint64_t)st.st_size == in->size && st.st_mtim.tv_sec == in->mtime.tv_sec &&
                       st.st_mtim.tv_nsec == in->mtime.tv_nsec;
                if (!kev_account_locked(fs, in, &st)) { /* it grew unseen (writeback): room first */
                        pthread_mutex_unlock(&in->lock);
                        kev_measure(fs, in, fd, 0);
                        pthread_mutex_lock(&in->lock);
                }
                in->cache_ok = true;
        }
        pthread_mutex_unlock(&in->lock);
        return keep;
}

/* The kernel hears of the new atime at RELEASE (ATIME). */
static void log_open(struct kfs *fs, struct kfs_inode *in)
{
        if (fs->o.nolog)
                return;
        int64_t now = kfs_now_ns();
        kidx_touch(fs->idx, in->bino, now, 1, 0);
        atomic_store(&in->atime_ns, now);
        kfs_remote_touch(fs, in->bino); /* the shared tier hears of it too (remote/touch.c) */
}

int kfs_open_call(struct kfs *fs, const struct kfs_caller *c, fuse_ino_t ino, struct fuse_file_info *fi,
                  int32_t *backing_id)
{
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        int flags = kfs_backing_flags(fi->flags & ~(O_CREAT | O_EXCL | O_NOFOLLOW));
        bool writer = is_writer(flags);

        *backing_id = 0;
        pthread_mutex_lock(&fs->itable_lock);
        if (in->evicted) {
                /* Evicted after the kernel looked it up: ESTALE makes the VFS look the name up again,
                 * which finds it gone (ENOENT, or a new file for O_CREAT). */
                pthread_mutex_unlock(&fs->itable_lock);
                return -ESTALE;
        }
        if (writer)
                in->writers++;
        else
                in->readers++;
        pthread_mutex_unlock(&fs->itable_lock);

        /* A read-only open may become a passthrough one that needs no fd of ours (a lazy handle). */
        bool maybe_lazy = !writer && !(flags & O_TRUNC) && atomic_load(&fs->pt.on);
        int fd = maybe_lazy ? -1 : kfs_inode_open(fs, in, flags);
        if (fd < 0 && !maybe_lazy)
                goto fail;
        kev_writer = c->pid;
        bool keep = refresh(fs, in, fd) && !(flags & O_TRUNC);
        kev_writer = 0;
        if ((flags & O_TRUNC) && fd >= 0)
                kfs_kill_suid(c->uid, fd, NULL); /* (SETUID) */
        int32_t pt = kfs_pt_open(fs, in, &fd, flags, writer);
        struct kfs_handle *h = NULL;
        if (pt && !writer && (h = malloc(sizeof(*h)))) {
                atomic_init(&h->fd, fd);
                h->flags = flags;
        }
        if (!h && fd < 0 && (fd = kfs_inode_open(fs, in, flags)) < 0) {
                /* page-cache mode after all, or no memory for a lazy handle, and the open failed */
                kfs_pt_release(fs, in, pt != 0);
                goto fail;
        }
        fi->keep_cache = keep && !pt;
        /* a writer of a passthrough inode: writes still come to us; a size file we rewrite: reads too */
        fi->direct_io = pt ? writer : in->bookkeeping;
        fi->noflush = 1; /* writes reach the backing file at once: close() has nothing to flush */
        fi->fh = h ? (uint64_t)(uintptr_t)h | KFS_FH_LAZY : (uint64_t)fd | (pt ? KFS_FH_PT : 0);
        log_open(fs, in);
        *backing_id = pt;
        return 0;
fail:
        count_open(fs, in, writer, -1);
        return fd;
}

void kfs_open_undo(struct kfs *fs, fuse_ino_t ino, struct fuse_file_info *fi, int32_t backing_id)
{
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        struct kfs_handle *h = kfs_lazy_handle(fi);
        int fd = h ? atomic_load(&h->fd) : (int)(uint32_t)fi->fh;
        if (fd >= 0)
                close(fd);
        free(h);
        count_open(fs, in, is_writer(fi->flags), -1);
        kfs_pt_release(fs, in, backing_id != 0);
}

void kfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        struct kfs_caller c = { .pid = ctx->pid, .uid = ctx->uid };
        int32_t pt;
        int r = kfs_open_call(fs, &c, ino, fi, &pt);
        if (r < 0) {
                fuse_reply_err(req, -r);
                return;
        }
        kfs_pt_reply_next(pt);
        r = fuse_reply_open(req, fi);
        kfs_pt_reply_next(0);
        if (r == -ENOENT) /* The opener was interrupted: the kernel will never release this handle. */
                kfs_open_undo(fs, ino, fi, pt);
}

void kfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *dir = kfs_inode_get(fs, parent);
        if (kfs_hidden(fs, dir, name) || kfs_stale(dir)) {
                fuse_reply_err(req, kfs_stale(dir) ? ESTALE : EPERM); /* ESTALE: evicted (EMPTIED DIRECTORIES) */
                return;
        }
        kfs_dir_named(dir);
        int flags = kfs_backing_flags(fi->flags) | O_NOFOLLOW;
        bool created = true, indexed = false;
        int dfd = kfs_inode_fd(fs, dir);
        if (dfd < 0) {
                fuse_reply_err(req, -dfd);
                return;
        }
        int fd;
        KFS_RETRY_FDS(fs, fd, ktree_open(&fs->tree, dfd, name, flags | O_CREAT | O_EXCL, kfs_req_mode(req, mode)));
        if (fd == -EEXIST && !(fi->flags & O_EXCL)) {
                created = false; /* it appeared since the kernel's lookup: open it as it is */
                KFS_RETRY_FDS(fs, fd, ktree_open(&fs->tree, dfd, name, flags & ~(O_CREAT | O_EXCL), 0));
        }
        if (fd < 0) {
                kfs_inode_fd_put(fs, dir, dfd);
                fuse_reply_err(req, -fd);
                return;
        }
        struct stat st;
        ino_t made = 0; /* the inode this request created, for the undo */
        int r = fstat(fd, &st) < 0 ? -errno : 0;
        if (r == 0 && created) {
                made = st.st_ino;
                if ((r = kfs_set_owner(fs, req, dir, name, fd)) == 0 && fstat(fd, &st) < 0)
                        r = -errno; /* st: with its new owner */
        }
        if (r < 0)
                goto fail;
        if (created) {
                kidx_add_file(fs->idx, st.st_ino, (uint64_t)st.st_blocks * 512, st.st_uid, kfs_now_ns());
                kidx_add_dent(fs->idx, dir->bino, name, st.st_ino, KIDX_REG);
                indexed = true;
                kev_miss_made(fs, dfd, name); /* a name eviction took, back? (evict/misses.c) */
        }
        /* The entry of the file opened here, not of what the name holds by now: eviction, or a runtime
         * repair (NEO's config.file), may already have removed it, and the caller still gets its file. */
        struct fuse_entry_param e;
        r = kfs_entry_of_fd(fs, dir, name, fd, &st, &e);
        if (r < 0)
                goto fail;
        struct kfs_inode *in = kfs_inode_get(fs, e.ino);
        if (created && krt_is_lock_name(name)) { /* whose it is (evict/units.c; ops-entry.c, STALE LOCKS) */
                in->creator = kfs_tgid_of(fuse_req_ctx(req)->pid);
                in->creator_start = kfs_proc_start(in->creator);
        }
        count_open(fs, in, is_writer(flags), 1);
        kev_writer = fuse_req_ctx(req)->pid;
        refresh(fs, in, fd);
        kev_writer = 0;
        /* A new file is in no mode yet; one that existed may be open in passthrough mode already. */
        int32_t pt = kfs_pt_open(fs, in, &fd, flags, true);
        if (!created)
                log_open(fs, in);
        if (!created && (flags & O_TRUNC))
                kfs_kill_suid(fuse_req_ctx(req)->uid, fd, NULL); /* (SETUID) */
        bool direct = created && (flags & O_ACCMODE) == O_WRONLY && !pt; /* (CREATED FILES) */
        fi->fh = (uint64_t)fd | (pt ? KFS_FH_PT : 0) | (direct ? KFS_FH_DIRECT : 0);
        fi->direct_io = pt != 0 || in->bookkeeping || direct;
        fi->noflush = 1;
        kfs_pt_reply_next(pt);
        kfs_inode_fd_put(fs, dir, dfd);
        r = fuse_reply_create(req, &e, fi);
        kfs_pt_reply_next(0);
        if (r == -ENOENT) {
                close(fd);
                count_open(fs, in, is_writer(flags), -1);
                kfs_pt_release(fs, in, pt != 0);
        }
        return;
fail:
        if (made) { /* undo the create, if the name still is ours (see kfs_entry_of_fd) */
                if (ktree_unlink_ino(&fs->tree, dfd, name, made, 0) == 0) {
                        if (indexed) {
                                kidx_del_dent(fs->idx, dir->bino, name);
                                kidx_del_file(fs->idx, made);
                        }
                }
        }
        close(fd);
        kfs_inode_fd_put(fs, dir, dfd);
        fuse_reply_err(req, -r);
}

void kfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
        buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        int fd = kfs_handle_fd(fs, ino, fi);
        if (fd < 0) {
                fuse_reply_err(req, -fd);
                return;
        }
        buf.buf[0].fd = fd;
        buf.buf[0].pos = off;
        if (!fs->o.nolog) {
                pthread_mutex_lock(&in->lock);
                uint64_t fsize = in->size;
                pthread_mutex_unlock(&in->lock);
                uint64_t served = (uint64_t)off >= fsize ? 0 : fsize - (uint64_t)off;
                int64_t now = kfs_now_ns();
                kidx_touch(fs->idx, in->bino, now, 0, served < size ? served : size);
                atomic_store(&in->atime_ns, now);
        }
        fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

/* Runs op (a write or fallocate) under a reservation of est bytes; on ENOSPC from the backing
 * filesystem evicts and retries once if retry_ok. Accounts the result exactly. */
struct io_op {
        int fd;
        int mode;          /* fallocate */
        off_t off, len;
        struct fuse_bufvec *src; /* write */
};

static ssize_t run_op(const struct io_op *op)
{
        if (!op->src)
                return fallocate(op->fd, op->mode, op->off, op->len) < 0 ? -errno : 0;
        struct fuse_bufvec dst = FUSE_BUFVEC_INIT(fuse_buf_size(op->src));
        dst.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        dst.buf[0].fd = op->fd;
        dst.buf[0].pos = op->off;
        size_t saved_idx = op->src->idx, saved_off = op->src->off;
        ssize_t r = fuse_buf_copy(&dst, op->src, 0);
        if (r < 0) {
                op->src->idx = saved_idx;
                op->src->off = saved_off;
        }
        return r;
}

static ssize_t allocating_op(struct kfs *fs, struct kfs_inode *in, const struct io_op *op, uint64_t est,
                             bool retry_ok)
{
        /* A write's writeback may allocate extent blocks, even after a SIGKILL: their margin is reserved
         * with the data, and held until the settler measures the file (settle.c, MARGIN). */
        uint64_t margin = 0;
        if (op->src) {
                pthread_mutex_lock(&in->lock);
                margin = kfs_settle_margin_locked(fs, in, est);
                pthread_mutex_unlock(&in->lock);
        }
        if (est + margin) {
                int r = kev_reserve(fs, est + margin);
                if (r < 0)
                        return r;
        }
        if (margin) {
                pthread_mutex_lock(&in->lock);
                in->margin += margin; /* before the data: the settler that takes it comes after (settle.c) */
                pthread_mutex_unlock(&in->lock);
        }
        ssize_t res = run_op(op);
        if (res == -ENOSPC && retry_ok) {
                kev_for_enospc(fs, est ? est : (uint64_t)op->len);
                res = run_op(op);
        }
        /* A fallocate is measured even without a reservation: a punch frees blocks. */
        if (est || res < 0 || !op->src)
                kev_measure(fs, in, op->fd, est);
        return res;
}

void kfs_op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        size_t len = fuse_buf_size(bufv);
        struct io_op op = { .fd = kfs_handle_fd(fs, ino, fi), .off = off, .len = (off_t)len, .src = bufv };
        if (op.fd < 0) {
                fuse_reply_err(req, -op.fd);
                return;
        }
        bool retry_ok = !(bufv->buf[0].flags & FUSE_BUF_IS_FD); /* a spliced pipe can be read only once */
        kev_writer = fuse_req_ctx(req)->pid; /* (evict/remove.c, runtime_lock) */
        ssize_t res = allocating_op(fs, in, &op, estimate(in, (uint64_t)off, len), retry_ok);
        kev_writer = 0;
        kfs_settle_note(fs, in); /* measured again after writeback, its margin released (settle.c) */
        if (res < 0) {
                fuse_reply_err(req, (int)-res);
                return;
        }
        if (res > 0)
                kfs_kill_suid(fuse_req_ctx(req)->uid, op.fd, NULL); /* (SETUID) */
        if (res > 0 && (fi->fh & KFS_FH_DIRECT) && !kfs_lazy_handle(fi)) {
                pthread_mutex_lock(&in->lock);
                in->cache_ok = false; /* what readers cached of this range is stale (CREATED FILES) */
                pthread_mutex_unlock(&in->lock);
        }
        if (!fs->o.nolog) {
                int64_t now = kfs_now_ns();
                kidx_touch(fs->idx, in->bino, now, 0, 0);
                atomic_store(&in->atime_ns, now);
        }
        fuse_reply_write(req, (size_t)res);
}

/* SEEK_DATA and SEEK_HOLE (the kernel answers the other whences itself): the backing file knows its
 * holes. Without this op the kernel would call the whole file data. */
void kfs_op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, struct fuse_file_info *fi)
{
        int fd = kfs_handle_fd(kfs_of(req), ino, fi);
        off_t r = fd < 0 ? (errno = -fd, -1) : lseek(fd, off, whence);
        if (r < 0)
                fuse_reply_err(req, errno);
        else
                fuse_reply_lseek(req, r);
}

void kfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        struct io_op op = { .fd = kfs_handle_fd(fs, ino, fi), .mode = mode, .off = off, .len = len };
        if (op.fd < 0) {
                fuse_reply_err(req, -op.fd);
                return;
        }
        uint64_t est = mode & FALLOC_FL_PUNCH_HOLE ? 0 : estimate(in, (uint64_t)off, (uint64_t)len);
        kev_writer = fuse_req_ctx(req)->pid;
        ssize_t res = allocating_op(fs, in, &op, est, true);
        kev_writer = 0;
        if (res >= 0)
                kfs_settle_note(fs, in);
        fuse_reply_err(req, res < 0 ? (int)-res : 0);
}

void kfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
        /* Writes go straight to the backing file, so close() has nothing left to push. */
        (void)ino;
        (void)fi;
        fuse_reply_err(req, 0);
}

void kfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
        int fd = kfs_handle_fd(kfs_of(req), ino, fi);
        fuse_reply_err(req, fd < 0 ? -fd : (datasync ? fdatasync(fd) : fsync(fd)) < 0 ? errno : 0);
}

bool kfs_release_call(struct kfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
        struct kfs_inode *in = kfs_inode_get(fs, ino);
        struct kfs_handle *h = kfs_lazy_handle(fi);
        bool pt = h || (fi->fh & KFS_FH_PT);
        if (h) {
                int fd = atomic_load(&h->fd);
                if (fd >= 0 && is_writer(fi->flags))
                        kfs_remote_note_fd(fs, fd);
                if (fd >= 0)
                        kfs_flock_close(fs, fd, fi->flock_release);
                free(h);
        } else {
                if (pt && is_writer(fi->flags)) {
                        /* Its shared mappings wrote to the backing file directly: account them, with
                         * room made for them first, and again once they are written back. */
                        kev_measure(fs, in, (int)(uint32_t)fi->fh, 0);
                        kfs_settle_note(fs, in);
                }
                if (is_writer(fi->flags))
                        kfs_remote_note_fd(fs, (int)(uint32_t)fi->fh); /* its unit may be whole now */
                kfs_flock_close(fs, (int)(uint32_t)fi->fh, fi->flock_release);
        }
        kfs_pt_release(fs, in, pt);
        bool evicted = count_open(fs, in, is_writer(fi->flags), -1);
        kfs_refresh_release(fs, in, ino, is_writer(fi->flags)); /* (ATIME) before the reply: nothing may
                                                                   forget the inode meanwhile */
        return evicted;
}

void kfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
        struct kfs *fs = kfs_of(req);
        bool evicted = kfs_release_call(fs, ino, fi);
        fuse_reply_err(req, 0);
        if (evicted) /* the kernel may forget it now (kprune.c); the inode may be freed once replied */
                kfs_kprune_later(fs, ino);
}
