/* remote.h: the shared tier (-o remote=): runtime units that one node compiled, served to the others
 * through a Redis-protocol server (Redis, Valkey), so that a cluster compiles each kernel once.
 *
 * THE SHARED TIER. Each node keeps its exact local tier; the server is a second tier that bounds and
 * evicts itself (maxmemory, allkeys-lru). What is shared is a runtime's unit as eviction knows it
 * (evict/units.c: a PoCL program directory, a Triton key directory, JAX's -cache and -atime, SYCL's
 * triple, a NEO binary, a libkcache entry...), never a file the runtime rewrites in place (NEO's
 * config.file, SYCL's cache_size.txt, Mesa's and CUDA's index, ccache's stats: kept files and whole
 * runtimes that are not shareable, SHAREABLE below).
 *
 * KEYS. "kcfs:1:<ns>:<path>": ns is "u<uid>", the namespace of the user who owns the files, path
 * relative to the mount root; or "p:<name>", a trusted publisher's, path relative to the owner's own
 * directory (users/<uid>/) where the file lies in one (TRUST). For a unit whose members are M0..Mk in eviction order (M0 is the file the runtime
 * tests for the entry: PoCL's program.bc, Triton's __grp__*.json, JAX's -cache, NEO's binary):
 *   <M0>          the unit (value.h), written first-writer-wins (SET NX)
 *   <Mi>, i > 0   "M" followed by M0's path: a lookup of any member fetches the whole unit
 *   <each directory above a member, up to the mount root>   "D": a lookup of it makes the directory, so
 *                 that the runtime's walk down to M0 goes on (PoCL tests <2>/<rest>/program.bc, and its
 *                 lookup of <2> is all the kernel asks before it).
 *
 * READ-THROUGH (fetch.c). A lookup that finds no name asks the server for it, once per namespace (the
 * asker's own, then each trusted one's: TRUST), within remote_timeout_ms; a miss (or no answer) is
 * remembered, per namespace, for remote_negative_s so that a runtime's
 * repeated probes cost no round trip, and the kernel is told to remember the miss no longer than that.
 * On a unit, every member the node lacks is written into the backing directory in the reverse of
 * eviction's order (M0 last), each under a temporary name renamed into place, owned by the user who
 * asked, with the room reserved first (the limit holds) and the index told as for any create; only then
 * is the lookup answered. So the runtime sees a whole entry or none. Anything wrong (a timeout, a
 * refused connection, a value that does not check) is an ordinary miss, counted; a value that does not
 * check is deleted from the server.
 *
 * PUBLISH (publish.c). A file written through the mount (closed after writing, or renamed into place)
 * names its unit for the publisher thread, which, once nothing in the unit changed for PUBLISH_QUIET_MS
 * and the unit is not busy (no lock or temporary of the runtime in it), reads it beneath the root and
 * stores it, off every application's path. A unit published once (by this node or another: SET NX) is
 * not sent again.
 *
 * TRUST. A binary cannot be checked against its key without compiling it again, so whoever can write a
 * key can poison its readers. A node publishes a unit only into the namespace of the uid that owns all
 * its files, and only when nobody else may rename on its way (the key is the path: publish.c P2), and
 * fetches into a directory only for the uid that owns that directory, from that uid's namespace, as
 * files that uid owns: what one user stores is only ever loaded by that user, and a node's daemon never
 * publishes one user's files into another's namespace. Wider sharing is through
 * trusted publishers' namespaces only, which the server's ACLs enforce, not the nodes' honesty
 * (contrib/redis, docs/remote.md): a mount with -o remote_publish=NAME (with the publisher's ACL user
 * in remote_auth) stores the units of one account, the publisher (-o remote_publisher=, by default who
 * mounts: a CI or admin account), into "p:NAME" and no user's, and looks that namespace up as that
 * account's own; the units of every other user of that mount go to their own namespaces as on any node
 * (which the publisher's ACL user may not write: a counted error), so no other user of a shared
 * publishing node can write the publisher's namespace; a mount with -o remote_trusted=NAME[:NAME...]
 * asks, after the asker's own namespace misses, each of those in order, and writes a hit into the
 * asker's directory as the asker's files, as from the asker's own. The nodes' ACL user may only read (GET,
 * SRANDMEMBER, TOUCH: %R~) a publisher's keys, so a reader never writes, deletes or herd-marks them
 * (a bad value there is counted, not deleted), and a node's credentials on a publishing mount are
 * refused (NOPERM: a counted error). A publisher's unit may name any owner: the namespace is trusted
 * as a whole, a user's only for that user's units.
 *
 * HERD (herd.c, -o herd_wait=SECONDS, off by default). At a job's start every node misses the same
 * kernels at once. Only names a compile's output is stored under count (common/runtimes.c, outputs:
 * PoCL's program.bc and kernels, Triton's json and binaries, JAX's -cache...), never a directory, which
 * runtimes make as they probe. The first lookup to miss such a name on the server (in the asker's own
 * namespace, and in every trusted one) marks it in flight in the asker's own (SET NX with
 * herd_wait as its life) and compiles; a lookup of the same name on any node that finds the mark waits,
 * off the daemon's workers (the request is answered later, by the herd thread), until the name is on
 * the server (the compile published it), or on this node (a process here compiled it), or the mark is
 * gone, or herd_wait has passed: then it is answered as a miss, and that process compiles after all.
 * On the node that compiles, another process's lookup of the output is told ESTALE once, and the walk
 * the kernel makes again (LOOKUP_REVAL) is parked at the output's own directory, where it holds no
 * directory lock, until the output is here (herd.c, H4 and H7, and ONE NODE there: why not at the output
 * itself). A parked lookup whose process gets a signal is answered at once (H1).
 *
 * LISTINGS. Some runtimes find an entry by listing its directory rather than by looking a name up
 * (Inductor's FX graph and AOT autograd caches list their key directory), and a listing never reaches the
 * server. So each published member's name is added to its directory's set ("kcfsl:1:<ns>:<dir>"), and a
 * directory made from its "D" key brings the units published directly in it along, when they are few
 * (REMOTE_LIST_MAX; a flat directory of many entries, JAX's, is looked up by name anyway).
 *
 * TOUCHES (touch.c). The local tier absorbs a node's repeated hits, so the server would see a kernel that
 * every node uses as cold and evict it first. Each open of a file through the mount notes its inode; every
 * remote_touch_s the publisher thread sends TOUCH for the units those files belong to, each unit once
 * per interval, batched, off the open path (the open only adds a number to a set); in the owner's
 * namespace and in each trusted one (a fetched file does not say where it came from; TOUCH is a read).
 *
 * THE SERVER DOWN. One connection per thread that asks (hiredis contexts are not thread-safe), made on
 * first use; after a failure none is tried again for REMOTE_BACKOFF_MS, so a dead server costs one
 * timeout, not one per lookup. With no remote= nothing here runs.
 *
 * Lock order: the remote's own locks (neg_lock, pub.lock, memo_lock, herd.lock) are leaves; nothing else
 * is taken under them, and they are taken under none of the daemon's. herd.lock is also taken inside
 * libfuse's own request lock (its interrupt callback, herd.c), which libfuse takes under none of ours. */
#ifndef KCACHEFS_REMOTE_H
#define KCACHEFS_REMOTE_H

#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>

struct kfs;
struct kfs_inode;

#define KFS_REMOTE_PARKED 1 /* kfs_remote_fetch: the lookup is answered later (herd.c) */
#define KFS_REMOTE_UNSURE 2 /* kfs_remote_fetch: a miss the kernel must not remember: this node compiles it
                               first (herd.c), or the server did not answer (it may have it a moment later) */
#define KFS_REMOTE_RETRY 3  /* kfs_remote_fetch: answer ESTALE, so that the kernel walks the path again and
                               the walk waits at the output's directory for this node's compile (herd.c, H7) */

struct kfs_remote_counts {
        uint64_t hits;          /* lookups served a unit from the server */
        uint64_t misses;        /* lookups the server did not know */
        uint64_t remembered;    /* misses answered from the remembered ones, no round trip */
        uint64_t timeouts;      /* no answer within remote_timeout_ms */
        uint64_t errors;        /* refused connections, server errors, units that could not be written */
        uint64_t corrupt;       /* values that did not check (deleted) */
        uint64_t dirs;          /* directories made on the way to a unit */
        uint64_t publishes;     /* units stored */
        uint64_t published_before; /* units another node (or this one) had stored first */
        uint64_t touches;       /* units the server was told are in use here */
        uint64_t herd_waits;    /* lookups that waited for a compile: another node's, or another process's here */
        uint64_t herd_served;   /* of them, answered with what that compile stored */
        uint64_t herd_gave_up;  /* of them, that compiled after all (herd_wait passed, or nothing came) */
        uint64_t trusted_hits;  /* of the hits, those served from a trusted publisher's namespace */
        uint64_t server_used, server_max, server_evicted, server_keys; /* the server's INFO, when last read */
        int64_t server_seen_ns; /* when (CLOCK_REALTIME ns); 0: never */
        uint64_t bytes_in, bytes_out;
};

/* Parses fs->o.remote (redis://HOST[:PORT][/DB] or unix:PATH) and remote_auth; -EINVAL with a message
 * on stderr. Starts nothing. */
int kfs_remote_init(struct kfs *fs);
/* Publishers' names, ':'-separated (remote_publish=, remote_trusted=): how many, or -EINVAL where one is
 * not [a-z0-9_-]{1,32} or there are more than max. With out, each is written there as its namespace,
 * "p:NAME", in slots of each bytes. */
int kfs_remote_names(const char *list, char *out, size_t each, int max);
/* -o remote_publisher=USER|UID: the account (a user name or a decimal uid); -EINVAL if there is none. */
int kfs_remote_publisher_uid(const char *s, uid_t *uid);
void kfs_remote_start(struct kfs *fs);
void kfs_remote_stop(struct kfs *fs);
void kfs_remote_free(struct kfs *fs);

/* A lookup of name in dir found nothing: asks the server. 0 if the name is there now (made from the
 * server's unit or directory), -ENOENT if not, KFS_REMOTE_UNSURE, KFS_REMOTE_RETRY (the caller answers
 * ESTALE) or KFS_REMOTE_PARKED (HERD; then req is answered by another thread, maybe before this returns:
 * neither req nor dir may be used after).
 * dfd, dir's descriptor borrowed with kfs_inode_fd(), is given back before it returns. No lock held. */
int kfs_remote_fetch(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, int dfd, const char *name);
/* A lookup of name in dir that found it: KFS_REMOTE_PARKED where it is the walk of a thread told to look
 * again (KFS_REMOTE_RETRY) reaching the directory of the output compiled on this node, answered once that
 * compile is done (herd.c, H7); 0 otherwise: answer it now. One atomic load when nobody was told lately. */
int kfs_remote_herd_join(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const char *name);
/* How long the kernel may remember a miss: shorter than the mount's timeout when a remote is on, since
 * another node may publish the name. */
double kfs_remote_negative_timeout(const struct kfs *fs, double timeout);
/* A file was written (fd, closed next) or renamed into place (name in dfd): its unit may be complete. */
void kfs_remote_note_fd(struct kfs *fs, int fd);
void kfs_remote_note_name(struct kfs *fs, int dfd, const char *name);
/* A file was opened: its unit is in use here (TOUCHES). */
void kfs_remote_touch(struct kfs *fs, uint64_t bino);

void kfs_remote_counts(struct kfs *fs, struct kfs_remote_counts *c);
/* kcache zero: the counters back to 0. */
void kfs_remote_zero(struct kfs *fs);
/* The namespaces a lookup of uid's asks, in order, as key prefixes separated by spaces ("kcfs:1:u1000:
 * kcfs:1:p:ci:"): the first is where uid's entries are published from this mount. snprintf's return;
 * -ENODATA when off. */
int kfs_remote_namespaces(const struct kfs *fs, uid_t uid, char *buf, size_t size);
/* "redis://host:port/db" or "unix:/path", as in use; NULL when off. */
const char *kfs_remote_where(const struct kfs *fs);

#endif
