/* direct.c: OPEN and RELEASE answered on the rings without libfuse.
 *
 * WHY. libfuse 3.14 keeps every request it runs on a list of the session (so that an INTERRUPT can find
 * it), under the session's one mutex: taken once to list the request, once more to unlist it at the
 * reply. On a mount whose requests come through one ring per CPU (ring.c), that mutex is the one place
 * where every CPU's requests meet. With 32 processes reading the same tree on 16 cores, a third of the
 * daemon's CPU samples were futex calls, and nine in ten of those came from libfuse (bench/JOURNAL.md,
 * sixth round); 8 readers on 2 cores showed the same in strace (third round). A runtime's hit is an
 * OPEN and a RELEASE, so those two are what every reader sends.
 *
 * WHAT. ring.c hands an OPEN or RELEASE that came through a ring entry to kfs_direct, which decodes it
 * as libfuse's own handlers do (a fuse_file_info from fuse_open_in or fuse_release_in), runs the same
 * code as the libfuse handlers (ops-io.c, kfs_open_call and kfs_release_call) and writes the reply into
 * the entry as libfuse would have written it (fuse_open_out's flags from the file info, the backing id
 * of a passthrough open: passthrough.c). Every other request, and every request that comes through
 * /dev/fuse, goes through libfuse as before.
 *
 * WHAT LIBFUSE DID THAT STAYS TRUE.
 *   - INTERRUPT: libfuse finds the request an INTERRUPT names in its list; one it cannot find it keeps
 *     (the request may come later), and answers one kept INTERRUPT EAGAIN at each request it runs after,
 *     oldest first, walking the whole list under its lock for each. A direct request is never on that
 *     list, so every INTERRUPT for one would be kept, and a workload of hits, which sends libfuse nothing,
 *     would never drain them: any program that gets signals while it opens (Go's preemption, a
 *     profiler's SIGPROF) would grow the list that every other request then walks under that lock. So
 *     the daemon's read of /dev/fuse (devio.c) drops an INTERRUPT whose request was answered here:
 *     kfs_direct notes each unique in a slot of direct_seen before it runs the request, and an
 *     INTERRUPT that finds its unique there, or finds an OPEN or RELEASE of that unique still waiting
 *     in its ring entry for the ring thread (the signal woke the opener, on the ring thread's CPU, first:
 *     a third of them on 2 cores), is counted (direct_interrupts) and never reaches libfuse.
 *     Nothing is lost: neither handler ends early on a signal (an OPEN may wait for room, as a write
 *     does, and ends as it would have), and the kernel expects no answer to an INTERRUPT. One whose
 *     slot a later request took (4096 requests later) goes to libfuse as before, to be drained by the next
 *     request libfuse runs (a LOOKUP, a GETATTR: the refresher's, after nearly every release).
 *   - The caller: pid and uid come from the request's header (kfs_caller), as fuse_req_ctx gives them.
 *   - An OPEN reply that cannot reach the kernel: a ring's reply is committed after the handler, where
 *     no error comes back to it, with libfuse too (ring.c's writev); kfs_open_undo is for /dev/fuse.
 * WHAT IT DOES NOT DO: libfuse's debug output (-d) and its allow_root check (which refuses an OPEN by a
 * user other than the mount's owner and root). With either option (-d, debug or --debug; allow_root) the
 * rings send everything to libfuse (main.c sets fs->direct). */
#include <errno.h>
#include <string.h>

#include "fuse-kernel.h"
#include "kfs.h"

static void fill_open(struct fk_open_out *o, const struct fuse_file_info *fi, int32_t backing_id)
{
        memset(o, 0, sizeof(*o));
        o->fh = fi->fh;
        o->open_flags = (fi->direct_io ? FK_FOPEN_DIRECT_IO : 0) | (fi->keep_cache ? FK_FOPEN_KEEP_CACHE : 0) |
                        (fi->cache_readdir ? FK_FOPEN_CACHE_DIR : 0) |
                        (fi->nonseekable ? FK_FOPEN_NONSEEKABLE : 0) | (fi->noflush ? FK_FOPEN_NOFLUSH : 0);
        if (backing_id)
                kfs_pt_fill(o, backing_id);
}

static _Atomic uint64_t *seen_slot(struct kfs *fs, uint64_t unique)
{
        return &fs->direct_seen[(unique >> 1) % KFS_DIRECT_SEEN]; /* the kernel's uniques go up by 2 */
}

bool kfs_direct_owns(struct kfs *fs, uint64_t unique)
{
        if (!fs->direct || !unique)
                return false;
        _Atomic uint64_t *slot = seen_slot(fs, unique);
        if (atomic_load_explicit(slot, memory_order_relaxed) == unique)
                return true; /* noted by kfs_direct: running, or answered */
        uint32_t op = kfs_ring_opcode_of(fs, unique); /* in its entry, its ring thread not yet at it */
        if (op == FK_OPEN || op == FK_RELEASE)
                return true;
        /* Or noted and answered while we looked (its reply then stands in its entry's header): the note
         * comes before the reply's header (ring.c's release fence), so seeing the one means seeing the
         * other. */
        atomic_thread_fence(memory_order_acquire);
        return atomic_load_explicit(slot, memory_order_relaxed) == unique;
}

int kfs_direct(struct kfs *fs, const struct fk_in_header *in, const void *arg, size_t arglen,
               struct fk_out_header *out, void *body)
{
        struct fuse_file_info fi;
        memset(&fi, 0, sizeof(fi));
        *out = (struct fk_out_header){ .len = sizeof(*out), .unique = in->unique };
        if (in->opcode == FK_OPEN && arglen >= sizeof(struct fk_open_in)) {
                atomic_store_explicit(seen_slot(fs, in->unique), in->unique, memory_order_relaxed);
                struct fk_open_in a;
                memcpy(&a, arg, sizeof(a));
                fi.flags = (int)a.flags;
                struct kfs_caller c = { .pid = (pid_t)in->pid, .uid = in->uid };
                int32_t pt;
                int r = kfs_open_call(fs, &c, in->nodeid, &fi, &pt);
                atomic_fetch_add_explicit(&fs->direct_requests, 1, memory_order_relaxed);
                if (r < 0) {
                        out->error = r;
                        return 0;
                }
                struct fk_open_out o;
                fill_open(&o, &fi, pt);
                memcpy(body, &o, sizeof(o));
                out->len += sizeof(o);
                return (int)sizeof(o);
        }
        if (in->opcode == FK_RELEASE && arglen >= sizeof(struct fk_release_in)) {
                atomic_store_explicit(seen_slot(fs, in->unique), in->unique, memory_order_relaxed);
                struct fk_release_in a;
                memcpy(&a, arg, sizeof(a));
                fi.flags = (int)a.flags;
                fi.fh = a.fh;
                fi.flush = !!(a.release_flags & FK_RELEASE_FLUSH);
                fi.flock_release = !!(a.release_flags & FK_RELEASE_FLOCK_UNLOCK);
                fi.lock_owner = a.lock_owner;
                bool evicted = kfs_release_call(fs, in->nodeid, &fi);
                atomic_fetch_add_explicit(&fs->direct_requests, 1, memory_order_relaxed);
                if (evicted) /* as kfs_op_release: the reply is in the entry, committed right after */
                        kfs_kprune_later(fs, in->nodeid);
                return 0;
        }
        return -ENOSYS;
}
