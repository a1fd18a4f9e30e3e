/* control.c: the user.kcachefs.* extended attributes, kcachefs's control channel.
 *
 * Reading (anyone who can see the file; answered from memory and the index's read connection, so a
 * reader never stalls the filesystem):
 *   on a regular file  atime (ISO 8601, ns), atime_ns, opens, bytes_read, bytes, seq, pinned, inode (what
 *                      the daemon holds of it, for a diagnosis; not listed)
 *   on the mount root  version, max_bytes, used_bytes, free_bytes, files, opens, bytes_read,
 *                      evicted_files, evicted_bytes, rebuilds, index (path), passthrough ("on" or
 *                      "off: why"), passthrough_opens, transport ("io_uring (N queues)" or
 *                      "/dev/fuse" with why), ring_requests, direct_requests (of those, OPENs and
 *                      RELEASEs answered without libfuse: direct.c), direct_interrupts (INTERRUPTs
 *                      for them, kept from libfuse), requests (what the kernel sent, by
 *                      opcode: "OPEN 3 GETATTR 1 ..."; devio.c; OWN: the daemon's own child's),
 *                      refreshed, refresh_dropped (files whose attributes the kernel got anew after a
 *                      release, or dropped instead: refresh.c), helped_writes (writes granted room by
 *                      another request's eviction, evict/evict.h HELPING), blocked_writes (writes that
 *                      found no room and waited for an eviction), background_evictions (descents to
 *                      the low watermark run ahead of the writes, evict/evict.h HOW FAR), index_bytes
 *                      (the index's database and WAL on disk), wal_bytes (the WAL alone), inode_fds,
 *                      fd_reopens, refetches, refetch_bytes, suggested_max_bytes, refused_writes,
 *                      refused_need_bytes (evict/misses.c), remote (where the shared tier is; absent
 *                      without one), remote_hits, remote_misses, remote_remembered, remote_timeouts,
 *                      remote_errors, remote_corrupt, remote_dirs, remote_publishes,
 *                      remote_published_before, remote_touches, herd_waits, herd_served, herd_gave_up,
 *                      remote_server_used_bytes, remote_server_max_bytes, remote_server_evicted_keys,
 *                      remote_server_keys, remote_server_seen_ns (the server's INFO at the last touches),
 *                      remote_bytes_in, remote_bytes_out, remote_trusted_hits (remote/remote.h),
 *                      remote_namespaces (the caller's, in the order its lookups ask them),
 *                      stats (all of the above but remote_server_seen_ns, one JSON object made by json-c,
 *                      with backing and entries besides; stats_json says how its strings are written)
 * Actions (only the mount's owner or root: EPERM otherwise):
 *   on a regular file  pinned=1|0 (also removexattr), evict=1
 *   on the mount root  evict=to=SIZE | evict=older=SECONDS, flush=1, reconcile=1, zero=1 (the statistics
 *                      counters back to 0: zero_counters; never a gauge, nor what eviction reads)
 *   on a directory in the root, or users/<uid>/NAME  runtime=NAME (also its owner; read back too): that
 *                      runtime's rules apply in it (evict/marks.c; kcache env sets it)
 * Settings (settings.c): on the mount root, config (every setting, "key=value" lines: kcache config) for
 * anyone; set ("key=value" lines: kcache set) for the owner or root, EINVAL with the reason in
 * set_refusal (the last refusal) for a bad value. Neither config nor set_refusal is listed: the settings
 * are not a counter, and getfattr -d of the root says the figures.
 * And on the mount root, for anyone: home, the caller's own directory (users/<uid>, made by the daemon on
 * first use, owned by the caller, 0700; users.c), which kcache env uses on a shared mount. It is not
 * listed, so that dumping every attribute (getfattr -d) makes nothing.
 * These names never reach the backing filesystem from a request; every other name is passed through
 * (ops-xattr.c). The daemon keeps two there itself: runtime on directories (evict/marks.c), pinned on
 * files (PINS, below). */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "../common/parse.h"
#include "kfs.h"
#include "remote/remote.h"

#define PREFIX "user.kcachefs."
#define PREFIX_LEN (sizeof(PREFIX) - 1)

static const char *const ROOT_NAMES[] = { "version", "max_bytes", "used_bytes", "free_bytes", "files", "opens",
                                          "bytes_read", "evicted_files", "evicted_bytes", "rebuilds", "index",
                                          "passthrough", "passthrough_opens", "transport", "ring_requests", "direct_requests", "direct_interrupts", "requests",
                                          "refreshed", "refresh_dropped",
                                          "helped_writes", "blocked_writes", "background_evictions",
                                          "index_bytes", "wal_bytes", "inode_fds", "fd_reopens", "inodes",
                                          "detached_inodes", "pruned_names", "remote_hits", "remote_misses",
                                          "remote_remembered", "remote_timeouts", "remote_errors", "remote_corrupt",
                                          "remote_dirs", "remote_publishes", "remote_published_before", "remote_touches",
                                          "herd_waits", "herd_served", "herd_gave_up", "remote_server_used_bytes",
                                          "remote_server_max_bytes", "remote_server_evicted_keys",
                                          "remote_server_keys", "remote_server_seen_ns",
                                          "remote_bytes_in", "remote_bytes_out", "remote_trusted_hits" };
static const char *const FILE_NAMES[] = { "atime", "atime_ns", "opens", "bytes_read", "bytes", "seq", "pinned" };
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

bool kfs_ctl_is_ours(const char *name)
{
        return strncmp(name, PREFIX, PREFIX_LEN) == 0;
}

/* The inodes the kernel knows (in the table), and of those the ones evicted or removed that it has not
 * forgotten yet (detached: kprune.c says why they should be few). */
static void inode_counts(struct kfs *fs, uint64_t *live, uint64_t *detached)
{
        pthread_mutex_lock(&fs->itable_lock);
        *live = fs->itable.count;
        *detached = fs->detached.count;
        pthread_mutex_unlock(&fs->itable_lock);
}

/* The stats object, built with json-c (kcache parses it with json-c too: cli/kcache.c, cli/verify.c).
 * Its strings are the paths' bytes as they are: json-c escapes what JSON requires (", \\, controls) and
 * passes every other byte through, so a name that is not UTF-8 reaches kcache whole; kcache's own
 * outputs are the strict UTF-8 ones (kcache(1), NAMES). Returns the object's length, as snprintf does
 * (the caller answers E2BIG or ERANGE past size), or -ENOMEM. */
static int stats_json(struct kfs *fs, char *buf, size_t size)
{
        struct kidx_stats s;
        kidx_get_stats(fs->idx, &s);
        struct kev_counts ec;
        kev_counts(fs, &ec);
        uint64_t max = fs->o.max_size, free_b = s.used_bytes < max ? max - s.used_bytes : 0, live, detached;
        inode_counts(fs, &live, &detached);
        char why[200], how[200];
        struct kfs_remote_counts rc;
        kfs_remote_counts(fs, &rc);
        const char *remote = kfs_remote_where(fs);
        const struct { const char *name; const char *str; uint64_t v; } fields[] = {
                { "version", KFS_VERSION, 0 }, { "max_bytes", NULL, max }, { "used_bytes", NULL, s.used_bytes },
                { "free_bytes", NULL, free_b }, { "files", NULL, s.files }, { "entries", NULL, s.files },
                { "opens", NULL, s.opens }, { "bytes_read", NULL, s.bytes_read },
                { "evicted_files", NULL, s.evicted_files }, { "evicted_bytes", NULL, s.evicted_bytes },
                { "rebuilds", NULL, s.rebuilds }, { "low_watermark", NULL, fs->o.low_watermark },
                { "index", fs->o.index_path, 0 }, { "backing", fs->o.backing, 0 },
                { "passthrough", kfs_pt_state(fs, why, sizeof(why)), 0 },
                { "passthrough_opens", NULL, atomic_load(&fs->pt.opens) },
                { "transport", kfs_ring_state(fs, how, sizeof(how)), 0 },
                { "ring_requests", NULL, atomic_load(&fs->ring_requests) },
                { "direct_requests", NULL, atomic_load(&fs->direct_requests) },
                { "direct_interrupts", NULL, atomic_load(&fs->direct_interrupts) },
                { "refreshed", NULL, atomic_load(&fs->refresh.sent) },
                { "refresh_dropped", NULL, atomic_load(&fs->refresh.dropped) },
                { "helped_writes", NULL, ec.helped_writes }, { "blocked_writes", NULL, ec.blocked_writes },
                { "background_evictions", NULL, ec.descents }, { "index_bytes", NULL, s.db_bytes + s.wal_bytes },
                { "wal_bytes", NULL, s.wal_bytes }, { "inode_fds", NULL, kfs_inode_fds_open(fs) },
                { "fd_reopens", NULL, atomic_load(&fs->fdc.reopens) }, { "refetches", NULL, ec.refetches },
                { "refetch_bytes", NULL, ec.refetch_bytes }, { "suggested_max_bytes", NULL, ec.suggested_max_bytes },
                { "refused_writes", NULL, ec.refused_writes }, { "refused_need_bytes", NULL, ec.refused_need_bytes },
                { "inodes", NULL, live }, { "detached_inodes", NULL, detached },
                { "pruned_names", NULL, atomic_load(&fs->kprune.sent) }, { "remote", remote ? remote : "", 0 },
                { "remote_hits", NULL, rc.hits }, { "remote_misses", NULL, rc.misses },
                { "remote_remembered", NULL, rc.remembered }, { "remote_timeouts", NULL, rc.timeouts },
                { "remote_errors", NULL, rc.errors }, { "remote_corrupt", NULL, rc.corrupt },
                { "remote_dirs", NULL, rc.dirs }, { "remote_publishes", NULL, rc.publishes },
                { "remote_published_before", NULL, rc.published_before }, { "remote_touches", NULL, rc.touches },
                { "herd_waits", NULL, rc.herd_waits }, { "herd_served", NULL, rc.herd_served },
                { "herd_gave_up", NULL, rc.herd_gave_up }, { "remote_server_used_bytes", NULL, rc.server_used },
                { "remote_server_max_bytes", NULL, rc.server_max },
                { "remote_server_evicted_keys", NULL, rc.server_evicted },
                { "remote_server_keys", NULL, rc.server_keys }, { "remote_bytes_in", NULL, rc.bytes_in },
                { "remote_bytes_out", NULL, rc.bytes_out }, { "remote_trusted_hits", NULL, rc.trusted_hits },
        };
        json_object *o = json_object_new_object();
        int r = o ? 0 : -ENOMEM;
        for (size_t i = 0; i < COUNT(fields) && r == 0; i++) {
                json_object *v = fields[i].str ? json_object_new_string(fields[i].str)
                                               : json_object_new_uint64(fields[i].v);
                if (!v || json_object_object_add(o, fields[i].name, v) < 0) {
                        json_object_put(v);
                        r = -ENOMEM;
                }
        }
        size_t len = 0;
        const char *text = r == 0 ? json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN |
                                                                      JSON_C_TO_STRING_NOSLASHESCAPE, &len) : NULL;
        if (r == 0 && !text)
                r = -ENOMEM;
        if (r == 0) {
                if (len < size)
                        memcpy(buf, text, len + 1);
                r = len > INT_MAX ? -E2BIG : (int)len;
        }
        json_object_put(o);
        return r;
}

static int root_value(struct kfs *fs, const char *n, char *buf, size_t size)
{
        struct kidx_stats s;
        kidx_get_stats(fs->idx, &s);
        struct kev_counts ec;
        kev_counts(fs, &ec);
        uint64_t max = fs->o.max_size, live, detached;
        inode_counts(fs, &live, &detached);
        if (!strcmp(n, "stats"))
                return stats_json(fs, buf, size);
        if (!strcmp(n, "version"))
                return snprintf(buf, size, "%s", KFS_VERSION);
        if (!strcmp(n, "index"))
                return snprintf(buf, size, "%s", fs->o.index_path);
        char why[200];
        if (!strcmp(n, "passthrough"))
                return snprintf(buf, size, "%s", kfs_pt_state(fs, why, sizeof(why)));
        if (!strcmp(n, "transport"))
                return snprintf(buf, size, "%s", kfs_ring_state(fs, why, sizeof(why)));
        if (!strcmp(n, "requests"))
                return kfs_requests_text(fs, buf, size);
        if (!strcmp(n, "remote"))
                return kfs_remote_where(fs) ? snprintf(buf, size, "%s", kfs_remote_where(fs)) : -ENODATA;
        struct kfs_remote_counts rc;
        kfs_remote_counts(fs, &rc);
        const struct { const char *name; uint64_t v; } nums[] = {
                { "max_bytes", max }, { "used_bytes", s.used_bytes },
                { "free_bytes", s.used_bytes < max ? max - s.used_bytes : 0 }, { "files", s.files },
                { "opens", s.opens }, { "bytes_read", s.bytes_read }, { "evicted_files", s.evicted_files },
                { "evicted_bytes", s.evicted_bytes }, { "rebuilds", s.rebuilds },
                { "passthrough_opens", atomic_load(&fs->pt.opens) },
                { "ring_requests", atomic_load(&fs->ring_requests) },
                { "direct_requests", atomic_load(&fs->direct_requests) },
                { "direct_interrupts", atomic_load(&fs->direct_interrupts) },
                { "refreshed", atomic_load(&fs->refresh.sent) },
                { "refresh_dropped", atomic_load(&fs->refresh.dropped) },
                { "helped_writes", ec.helped_writes },
                { "blocked_writes", ec.blocked_writes },
                { "background_evictions", ec.descents },
                { "index_bytes", s.db_bytes + s.wal_bytes }, { "wal_bytes", s.wal_bytes },
                { "inode_fds", kfs_inode_fds_open(fs) }, { "fd_reopens", atomic_load(&fs->fdc.reopens) },
                { "refetches", ec.refetches }, { "refetch_bytes", ec.refetch_bytes },
                { "suggested_max_bytes", ec.suggested_max_bytes }, { "refused_writes", ec.refused_writes },
                { "refused_need_bytes", ec.refused_need_bytes },
                { "inodes", live }, { "detached_inodes", detached },
                { "pruned_names", atomic_load(&fs->kprune.sent) },
                { "remote_hits", rc.hits }, { "remote_misses", rc.misses }, { "remote_remembered", rc.remembered },
                { "remote_timeouts", rc.timeouts }, { "remote_errors", rc.errors }, { "remote_corrupt", rc.corrupt },
                { "remote_dirs", rc.dirs }, { "remote_publishes", rc.publishes },
                { "remote_published_before", rc.published_before }, { "remote_touches", rc.touches },
                { "herd_waits", rc.herd_waits }, { "herd_served", rc.herd_served }, { "herd_gave_up", rc.herd_gave_up },
                { "remote_server_used_bytes", rc.server_used }, { "remote_server_max_bytes", rc.server_max },
                { "remote_server_evicted_keys", rc.server_evicted }, { "remote_server_keys", rc.server_keys },
                { "remote_server_seen_ns", (uint64_t)rc.server_seen_ns },
                { "remote_bytes_in", rc.bytes_in },
                { "remote_bytes_out", rc.bytes_out },
                { "remote_trusted_hits", rc.trusted_hits },
        };
        for (size_t i = 0; i < COUNT(nums); i++)
                if (!strcmp(n, nums[i].name))
                        return snprintf(buf, size, "%" PRIu64, nums[i].v);
        return -ENODATA;
}

/* What the daemon holds of an inode (for a failed check's diagnosis: tests/integration/test_accounting_stress.py). */
static int inode_state(struct kfs *fs, struct kfs_inode *in, char *buf, size_t size)
{
        pthread_mutex_lock(&in->lock);
        uint64_t alloc = in->alloc, sz = in->size;
        pthread_mutex_unlock(&in->lock);
        pthread_mutex_lock(&fs->itable_lock);
        bool in_table = kfs_inode_find_locked(fs, in->bino) == in;
        int r = snprintf(buf, size, "ino=%" PRIu64 " alloc=%" PRIu64 " size=%" PRIu64 " unlinked=%d evicted=%d "
                         "in_table=%d nlookup=%" PRIu64 " readers=%u writers=%u name=%s name_lost=%d",
                         in->bino, alloc, sz, (int)atomic_load(&in->unlinked), (int)atomic_load(&in->evicted),
                         (int)in_table, in->nlookup, in->readers, in->writers, in->name ? in->name : "-",
                         (int)in->name_lost);
        pthread_mutex_unlock(&fs->itable_lock);
        return r;
}

static int file_value(struct kfs *fs, struct kfs_inode *in, const char *n, char *buf, size_t size)
{
        if (!strcmp(n, "inode"))
                return inode_state(fs, in, buf, size);
        struct kidx_file f;
        int r = kidx_get_file(fs->idx, in->bino, &f);
        if (r < 0)
                return r == -ENOENT ? -ENODATA : r;
        int64_t a = atomic_load(&in->atime_ns); /* the inode's view includes accesses not yet flushed */
        if (!strcmp(n, "atime")) {
                time_t t = (time_t)(a / 1000000000LL);
                struct tm tm;
                char date[64];
                gmtime_r(&t, &tm);
                strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
                return snprintf(buf, size, "%s.%09lldZ", date, (long long)(a % 1000000000LL));
        }
        if (!strcmp(n, "atime_ns"))
                return snprintf(buf, size, "%lld", (long long)a);
        if (!strcmp(n, "opens"))
                return snprintf(buf, size, "%" PRIu64, f.opens);
        if (!strcmp(n, "bytes_read"))
                return snprintf(buf, size, "%" PRIu64, f.bytes_read);
        if (!strcmp(n, "bytes"))
                return snprintf(buf, size, "%" PRIu64, f.bytes);
        if (!strcmp(n, "seq"))
                return snprintf(buf, size, "%" PRIu64, f.seq);
        if (!strcmp(n, "pinned"))
                return snprintf(buf, size, "%d", f.pinned || kev_pinned_by_pattern(fs, in) ? 1 : 0);
        return -ENODATA;
}

int kfs_ctl_get(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, const char *name, char *buf, size_t size)
{
        const char *n = name + PREFIX_LEN;
        int r;
        char rel[4096];
        if (in == &fs->root && !strcmp(n, "home"))
                r = kfs_users_home(req, fs, buf, size); /* the caller's own directory, made on first use */
        else if (in == &fs->root && !strcmp(n, "remote_namespaces")) /* the caller's, in lookup order */
                r = kfs_remote_namespaces(fs, fuse_req_ctx(req)->uid, buf, size);
        else if (in == &fs->root && !strcmp(n, "config"))
                r = kfs_settings_show(fs, buf, size);
        else if (in == &fs->root && !strcmp(n, "set_refusal"))
                r = kfs_settings_refusal(fs, buf, size);
        else if (in == &fs->root)
                r = root_value(fs, n, buf, size);
        else if (S_ISREG(in->type))
                r = file_value(fs, in, n, buf, size);
        else if (S_ISDIR(in->type) && !strcmp(n, "runtime") && kidx_flush(fs->idx) == 0 && /* its path as of now */
                 kidx_dir_path(fs->idx, in->bino, rel, sizeof(rel)) == 0 &&
                 kev_markable(rel) && kev_mark_get(fs, rel) != KRT_AUTO)
                r = snprintf(buf, size, "%s", krt_table[kev_mark_get(fs, rel)].name);
        else
                r = -ENODATA;
        return r >= (int)size ? -E2BIG : r;
}

/* Appends our names for in to buf (size 0: only counts). Returns the bytes needed. */
size_t kfs_ctl_list(struct kfs *fs, struct kfs_inode *in, char *buf, size_t size)
{
        const char *const *names = in == &fs->root ? ROOT_NAMES : S_ISREG(in->type) ? FILE_NAMES : NULL;
        size_t count = in == &fs->root ? COUNT(ROOT_NAMES) : COUNT(FILE_NAMES), len = 0;
        if (!names)
                return 0;
        for (size_t i = 0; i < count; i++) {
                size_t l = PREFIX_LEN + strlen(names[i]) + 1;
                if (buf && len + l <= size) {
                        memcpy(buf + len, PREFIX, PREFIX_LEN);
                        memcpy(buf + len + PREFIX_LEN, names[i], l - PREFIX_LEN);
                }
                len += l;
        }
        return len;
}

static bool may_act(fuse_req_t req, struct kfs *fs)
{
        const struct fuse_ctx *c = fuse_req_ctx(req);
        return c->uid == 0 || c->uid == fs->owner;
}

/* Whether the caller owns the inode's backing object (kcache env marks a directory it made). */
static bool owns(fuse_req_t req, struct kfs *fs, struct kfs_inode *in)
{
        struct stat st;
        return kfs_fstat_inode(fs, in, &st) == 0 && st.st_uid == fuse_req_ctx(req)->uid;
}

/* runtime=NAME on a directory where kcache env puts a runtime's cache (directly in the root, or
 * users/<uid>/NAME on a shared mount): that runtime's rules apply below it (evict/marks.c). */
static int mark_dir(struct kfs *fs, struct kfs_inode *in, const char *value, size_t size)
{
        char v[64], rel[4096];
        if (size >= sizeof(v))
                return -EINVAL;
        memcpy(v, value, size);
        v[size] = '\0';
        int rt = krt_by_name(v);
        if (rt < 0 || kidx_flush(fs->idx) < 0 || kidx_dir_path(fs->idx, in->bino, rel, sizeof(rel)) < 0 ||
            !kev_markable(rel))
                return -EINVAL; /* not a runtime, or not a directory where kcache env puts one */
        int fd = kfs_inode_fd(fs, in);
        if (fd < 0)
                return fd;
        int r = kev_mark(fs, rel, fd, (enum krt)rt);
        kfs_inode_fd_put(fs, in, fd);
        return r;
}

static int parse_bool(const char *v, size_t size, bool *ret)
{
        char b[8] = "";
        if (size >= sizeof(b))
                return -EINVAL;
        memcpy(b, v, size);
        if (!strcmp(b, "1") || !strcmp(b, "true") || !strcmp(b, "yes") || !strcmp(b, ""))
                *ret = true;
        else if (!strcmp(b, "0") || !strcmp(b, "false") || !strcmp(b, "no"))
                *ret = false;
        else
                return -EINVAL;
        return 0;
}

/* kcache zero: every counter of the statistics (opens, bytes_read, evicted_*, rebuilds, helped_writes,
 * blocked_writes, background_evictions, refetch*, suggested_max_bytes, refused_*, passthrough_opens,
 * ring_requests, direct_requests, direct_interrupts, requests, refreshed, refresh_dropped, fd_reopens, pruned_names, remote_*) back to 0. Not
 * the gauges (max, used and free bytes, files, the index's size, descriptors, inodes) nor anything
 * eviction reads (the index's totals and seq, misses.c's window): these only count. Each counter is zeroed on its own, not all in one instant: an
 * operation in flight may be counted on either side of the zero. */
static int zero_counters(struct kfs *fs)
{
        kev_zero_counts(fs);
        atomic_store(&fs->pt.opens, 0);
        atomic_store(&fs->ring_requests, 0);
        atomic_store(&fs->direct_requests, 0);
        atomic_store(&fs->direct_interrupts, 0);
        atomic_store(&fs->refresh.sent, 0);
        atomic_store(&fs->refresh.dropped, 0);
        for (unsigned op = 0; op < KFS_OPCODES; op++)
                atomic_store(&fs->requests[op], 0);
        atomic_store(&fs->fdc.reopens, 0);
        atomic_store(&fs->kprune.sent, 0);
        kfs_remote_zero(fs);
        return kidx_zero_counters(fs->idx);
}

static int root_action(struct kfs *fs, const char *n, const char *value, size_t size)
{
        if (!strcmp(n, "set"))
                return kfs_settings_set(fs, value, size);
        char v[128];
        if (size >= sizeof(v))
                return -EINVAL;
        memcpy(v, value, size);
        v[size] = '\0';
        if (!strcmp(n, "flush")) {
                kfs_settle_all(fs); /* the written files' allocation as the disk has it now */
                return kidx_flush(fs->idx);
        }
        if (!strcmp(n, "zero")) {
                bool yes;
                int r = parse_bool(value, size, &yes);
                return r < 0 ? r : yes ? zero_counters(fs) : -EINVAL;
        }
        if (!strcmp(n, "reconcile"))
                return kidx_reconcile(fs->idx, fs->tree.root, KFS_META_DIR);
        if (!strcmp(n, "evict")) {
                uint64_t x;
                int64_t r;
                if (!strncmp(v, "to=", 3)) {
                        if (kparse_size(v + 3, &x, 1) < 0)
                                return -EINVAL;
                        r = kev_evict_to(fs, x, false); /* explicit: no grace */
                } else if (!strncmp(v, "older=", 6)) {
                        double secs;
                        if (kparse_duration(v + 6, &secs, 1) < 0) /* finite: "nan" evicted nothing, said done */
                                return -EINVAL;
                        r = kev_evict_older(fs, kfs_now_ns() - (int64_t)(secs * 1e9));
                } else {
                        return -EINVAL;
                }
                kev_reap_drain(fs); /* done means the blocks are free too (df of the backing filesystem) */
                return r < 0 ? (int)r : 0;
        }
        return -ENOTSUP;
}

/* PINS. A pin is kept twice: in the index (what eviction reads) and on the backing file itself, as the
 * attribute KIDX_PIN_XATTR, so that a rebuild of a corrupt or lost index restores it (kidx-rebuild.c).
 * The attribute is written before the index is told, and the index is flushed at once, so the two agree
 * when the request returns; a crash between them leaves the file pinned, the safe side. Users never see
 * or set the attribute through the mount: every user.kcachefs.* name is ours (ops-xattr.c), and setting
 * this one is an action only the mount's owner or root may take. A backing filesystem without user
 * attributes (tmpfs before 6.6) keeps pins in the index only, and the log says so once. */
static int pin_backing(struct kfs *fs, struct kfs_inode *in, bool pin)
{
        /* One message per process, whatever the mount: a flag of the process, not of the mount's state. */
        static atomic_bool told;
        /* The attribute may open a block of its own (ops-xattr.c, ATTRIBUTES TAKE BLOCKS): room first. */
        uint64_t held;
        int r = kfs_xattr_begin(fs, in, pin ? strlen(KIDX_PIN_XATTR) + 1 : 0, &held);
        if (r < 0)
                return r;
        int fd = kfs_inode_fd(fs, in);
        if (fd < 0) {
                kfs_xattr_end(fs, in, held);
                return fd;
        }
        if (fd == fs->dead_fd) { /* evicted meanwhile: the placeholder is nobody's file */
                r = -ESTALE;
        } else {
                char proc[64];
                kfs_proc_path(proc, sizeof(proc), fd);
                if ((pin ? setxattr(proc, KIDX_PIN_XATTR, "1", 1, 0) : removexattr(proc, KIDX_PIN_XATTR)) < 0)
                        r = -errno;
        }
        kfs_inode_fd_put(fs, in, fd);
        kfs_xattr_end(fs, in, held);
        if (r == -ENODATA && !pin)
                return 0; /* pinned before pins were kept on the file, or never pinned */
        if (r == -ENOTSUP || r == -EOPNOTSUPP) {
                if (!atomic_exchange(&told, true))
                        kfs_log(LOG_WARNING, "%s has no user extended attributes: pins are kept in the index only, "
                                             "and a rebuild of a lost or corrupt index forgets them", fs->o.backing);
                return 0;
        }
        return r;
}

static int set_pin(struct kfs *fs, struct kfs_inode *in, bool pin)
{
        int r = pin_backing(fs, in, pin);
        if (r < 0)
                return r;
        kidx_set_pinned(fs->idx, in->bino, pin);
        return kidx_flush(fs->idx);
}

int kfs_ctl_set(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, const char *name, const char *value,
                size_t size)
{
        const char *n = name + PREFIX_LEN;
        if (!may_act(req, fs) && !(S_ISDIR(in->type) && owns(req, fs, in)))
                return -EPERM;
        if (in == &fs->root)
                return root_action(fs, n, value, size);
        if (S_ISDIR(in->type) && !strcmp(n, "runtime"))
                return mark_dir(fs, in, value, size);
        if (!S_ISREG(in->type))
                return -ENOTSUP;
        if (!strcmp(n, "pinned")) {
                bool pin;
                int r = parse_bool(value, size, &pin);
                return r < 0 ? r : set_pin(fs, in, pin);
        }
        if (!strcmp(n, "evict")) {
                /* A file its last user has just closed counts as open until the kernel's RELEASE, which
                 * comes after that close() returned (as for flocks, flock.c): a busy file is tried again
                 * for a moment (255 ms at most) before the answer is EBUSY. */
                int r;
                for (unsigned ms = 1; (r = kev_evict_ino(fs, in->bino)) == -EBUSY && ms <= 128; ms *= 2)
                        usleep(ms * 1000);
                kev_reap_drain(fs);
                return r;
        }
        return -ENOTSUP;
}

int kfs_ctl_remove(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, const char *name)
{
        if (strcmp(name + PREFIX_LEN, "pinned") || !S_ISREG(in->type) || in == &fs->root)
                return -ENODATA;
        if (!may_act(req, fs))
                return -EPERM;
        return set_pin(fs, in, false);
}
