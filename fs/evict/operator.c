/* operator.c: what an operator asks for through kcache (control.c): evict down to a size, every file older
 * than a time, one file with its unit; and a pin pattern's check. These evict like any eviction, without
 * the grace period (evict.h: GRACE), and keep what is open or pinned. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

static int64_t evict_to(struct kfs *fs, uint64_t target, bool grace, bool in_line)
{
        int r = kidx_flush(fs->idx);
        if (r < 0)
                return r;
        uint64_t cursor = 0;
        return kev_evict_down_to(fs, target, &cursor, grace, in_line);
}

int64_t kev_evict_to(struct kfs *fs, uint64_t target, bool grace)
{
        return evict_to(fs, target, grace, false);
}

int64_t kev_evict_older(struct kfs *fs, int64_t cutoff_ns)
{
        int r = kidx_flush(fs->idx);
        if (r < 0)
                return r;
        /* The LRU order is the atime order (explicit utimensat aside), so walk it until the first file
         * accessed at or after the cutoff, a batch at a time. */
        uint64_t cursor = 0;
        int64_t total = 0, err = 0;
        struct kev_busy busy = { 0 }; /* one verdict per lock for every batch (kev_busy) */
        for (;;) {
                struct kidx_lru_row rows[BATCH_VICTIMS];
                int n = kidx_lru_batch(fs->idx, cursor, rows, BATCH_VICTIMS);
                if (n <= 0) {
                        err = n;
                        break;
                }
                uint64_t goal = 0;
                int k = 0;
                for (; k < n && rows[k].atime_ns < cutoff_ns; k++)
                        goal += rows[k].bytes;
                if (k == 0)
                        break;
                struct notify_list nl = { 0 };
                uint64_t c = cursor;
                pthread_mutex_lock(&fs->ev->evict_lock);
                int64_t freed = kev_evict_batch(fs, &c, goal, 0, (size_t)k, false, &nl, false, false, &busy); /* an operator's */
                kev_prune_lost(fs, &nl);
                pthread_mutex_unlock(&fs->ev->evict_lock);
                kev_notify_all(fs, &nl);
                if (freed < 0) {
                        err = freed;
                        break;
                }
                total += freed;
                cursor = rows[k - 1].seq;
                if (k < n)
                        break;
        }
        kev_busy_free(&busy);
        return err < 0 && !total ? err : total;
}

int kev_evict_ino(struct kfs *fs, uint64_t ino)
{
        /* The file's whole unit goes (a SYCL entry, a PoCL program...), with every protection. */
        struct victim v = { .ino = ino, .hold = -1 };
        struct kidx_file f;
        int r = kidx_get_file(fs->idx, ino, &f);
        if (r < 0)
                return r;
        if (f.pinned)
                return -EPERM;
        struct dircache dc = { 0 };
        struct notify_list nl = { 0 };
        struct victims vs = { 0 };
        struct kev_unit u = { 0 };
        pthread_mutex_lock(&fs->ev->evict_lock);
        r = kidx_flush(fs->idx);
        v.bytes = f.bytes;
        if (r == 0)
                r = kev_load_candidate(fs, &dc, &v);
        if (r == 1)
                r = -EPERM; /* pinned by pattern */
        const char *path = v.nnames ? v.names[0].path : NULL;
        if (r == 0 && (!path || kev_unit_protected(fs, path, f.atime_ns, kev_now(fs))))
                r = -EPERM;
        if (r == 0)
                r = kev_unit_resolve(fs, path, &u);
        if (r == 0 && u.busy)
                r = -EBUSY;
        if (r == 0 && u.rt == KRT_FILE) {
                r = kev_push_victim(&vs, &v);
                if (r == 0) {
                        v.names = NULL;
                        v.nnames = 0;
                        r = kev_push_unit(fs, &vs, 0, KRT_FILE, NULL);
                }
        } else if (r == 0) {
                struct seen sn = { 0 };
                r = kev_take_unit(fs, &dc, &u, UINT64_MAX, &sn, false, &vs);
                r = r == 1 ? 0 : r == 0 ? -EBUSY : r; /* 0: a member is open or pinned */
        }
        if (r == 0) {
                r = kev_evict_unit(fs, &dc, &vs, &vs.u[0], &nl, false) || vs.bytes == 0 ? 0 : -EBUSY;
                kev_repair_all(fs, &vs, &nl);
                kev_prune_lost(fs, &nl);
        }
        pthread_mutex_unlock(&fs->ev->evict_lock);
        kev_notify_all(fs, &nl);
        kev_free_victims(&vs);
        kev_unit_free(&u);
        kev_free_names(v.names, v.nnames);
        kev_dircache_free(&dc);
        return r;
}

bool kev_pinned_by_pattern(struct kfs *fs, struct kfs_inode *in)
{
        struct victim v = { .ino = in->bino };
        struct dircache dc = { 0 };
        kidx_flush(fs->idx); /* a name made a moment ago must be seen */
        int r = kev_load_candidate(fs, &dc, &v);
        kev_free_names(v.names, v.nnames);
        kev_dircache_free(&dc);
        return r == 1;
}

int kev_for_enospc(struct kfs *fs, uint64_t bytes)
{
        /* The backing filesystem is full before our limit: free this request plus the watermark's margin. */
        uint64_t used = kidx_used(fs->idx), margin = fs->o.max_size - kev_low_watermark(fs);
        uint64_t want = bytes > margin ? bytes : margin;
        int64_t r = evict_to(fs, used > want ? used - want : 0, true, true);
        kev_reap_drain(fs); /* the blocks too: it is the backing filesystem that is full */
        return r < 0 ? (int)r : 0;
}
