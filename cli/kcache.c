/* kcache: the operator's command for a kcachefs mount.
 *
 * It talks to the daemon through the mount itself: the user.kcachefs.* attributes (fs/control.c) for
 * totals and actions, which the daemon checks (only the mount's owner or root may act), and the index,
 * opened read-only, for listings (WAL readers never block the daemon). The command line: args.h (exit
 * status 0 ok, 1 the operation failed, 2 bad usage).
 *
 * It never says yes to what it did not do: every verb that names a mount checks that it is the root of a
 * kcachefs mount (it answers user.kcachefs.version), and every verb that names a file checks that the
 * file is a regular file of such a mount (kc_open_in_mount) before it sets anything on it. A path
 * elsewhere (the backing directory, say) would otherwise take the control attributes as ordinary ones
 * and keep them: a stray user.kcachefs.pinned there is even read back as a pin by the index's rebuild. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "export.h"
#include "kcache.h"
#include "quote.h"
#include "show.h"
#include "../index/kidx.h"
#include "../common/parse.h"
#include "../common/runtimes.h"

int kc_fail(const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        fputs("kcache: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        return 1;
}

static const char *kc_default_mount(void)
{
        static char buf[PATH_MAX];
        const char *m = getenv("KCACHEFS_MOUNT");
        if (m && *m)
                return m;
        snprintf(buf, sizeof(buf), "%s/.cache/kcachefs/mnt", getenv("HOME") ? getenv("HOME") : "");
        return buf;
}

ssize_t kc_get(const char *path, const char *name, char *buf, size_t size)
{
        char full[128];
        snprintf(full, sizeof(full), KC_PREFIX "%s", name);
        ssize_t n = getxattr(path, full, buf, size - 1);
        if (n < 0)
                return -errno;
        buf[n] = '\0';
        return n;
}

int kc_set(const char *path, const char *name, const char *value)
{
        char full[128];
        snprintf(full, sizeof(full), KC_PREFIX "%s", name);
        return setxattr(path, full, value, strlen(value), 0) < 0 ? -errno : 0;
}

static int kc_check_mount(const char *mount);
const char *kc_mount_or_default(const char *given)
{
        const char *mount = given ? given : kc_default_mount();
        return kc_check_mount(mount) ? NULL : mount;
}

int kc_flag_and_mount(const struct kc_verb *v, int argc, char **argv, const char *name, int id, bool *flag,
                      const char **mount)
{
        const struct option longs[] = { { name, no_argument, NULL, id }, { "help", no_argument, NULL, 'h' }, { 0 } };
        int c;
        *flag = false;
        while ((c = kc_opt(v, argc, argv, "", longs)) != -1) {
                if (c != id)
                        return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
                *flag = true;
        }
        if (kc_operands(v, argc, argv, 0, 1, "MOUNT"))
                return KC_EXIT_USAGE;
        *mount = kc_mount_or_default(optind < argc ? argv[optind] : NULL);
        return *mount ? -1 : KC_EXIT_FAILED;
}

/* Checks that mount is the root of a kcachefs mount; prints the error itself. */
static int kc_check_mount(const char *mount)
{
        char v[64];
        ssize_t n = kc_get(mount, "version", v, sizeof(v));
        if (n >= 0)
                return 0;
        if (n == -ENOENT)
                return kc_fail("%s: no such directory", mount);
        return kc_fail("%s is not the root of a kcachefs mount", mount);
}

uint64_t kc_num(const char *mount, const char *name)
{
        char v[64];
        return kc_get(mount, name, v, sizeof(v)) > 0 ? strtoull(v, NULL, 10) : 0;
}

void kc_human(uint64_t b, char *buf, size_t size)
{
        const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
        double v = (double)b;
        int u = 0;
        while (v >= 1024 && u < 5) {
                v /= 1024;
                u++;
        }
        snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

const char *kc_perm_hint(int e)
{
        return e == -EPERM || e == -EACCES ? " (only the mount's owner or root may do this)" : "";
}

/* ---- stats ---- */

/* Never evicted: pinned in the index, or a runtime's lock, counters or settings by its name
 * (common/runtimes.c, krt_is_kept_path: what fs/evict/units.c protects). Pins by the mount's -o pin=
 * patterns are the daemon's to know and are not among them. */
static bool kc_never_evicted(const struct kidx_entry *e)
{
        return e->pinned || krt_is_kept_path(e->path);
}

struct kc_kept {
        uint64_t files, bytes;
};

static int kc_kept_row(void *ud, const struct kidx_entry *e)
{
        struct kc_kept *k = ud;
        if (kc_never_evicted(e)) {
                k->files++;
                k->bytes += e->bytes;
        }
        return 0;
}

/* One user's row of the plain output (--json and --prometheus: export.c). */
static void kc_user_row(void *ud, uint32_t uid, uint64_t files, uint64_t bytes)
{
        char h[32];
        (void)ud;
        kc_human(bytes, h, sizeof(h));
        printf("  uid %-8u %10s in %" PRIu64 " files\n", uid, h, files);
}

/* Zeroes the daemon's statistics counters (fs/control.c, zero): hits, bytes served, evictions, waits,
 * refetches... never the limit, the use or what eviction reads. Prints the error itself. */
static int kc_zero(const char *mount)
{
        int r = kc_set(mount, "zero", "1");
        if (r < 0)
                return kc_fail("%s: cannot zero the statistics: %s%s", mount,
                               r == -ENOTSUP ? "the daemon is older than this kcache" : strerror(-r), kc_perm_hint(r));
        return 0;
}

static int kc_cmd_zero(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
        int c;
        if ((c = kc_opt(v, argc, argv, "", longs)) != -1)
                return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
        if (kc_operands(v, argc, argv, 0, 1, "MOUNT"))
                return KC_EXIT_USAGE;
        const char *mount = kc_mount_or_default(optind < argc ? argv[optind] : NULL);
        if (!mount || kc_zero(mount))
                return KC_EXIT_FAILED;
        printf("%s: statistics zeroed\n", mount);
        return KC_EXIT_OK;
}

/* ---- remote ---- */

/* kcache remote [MOUNT] [--json]: the shared tier this mount uses (docs/remote.md): the server, the
 * caller's namespace on it, the server's own figures (as the daemon read them at its last touches) and
 * this node's counters. A mount without one: said, rc 1. */
static int kc_cmd_remote(const struct kc_verb *v, int argc, char **argv)
{
        bool json;
        const char *mount;
        int rc = kc_flag_and_mount(v, argc, argv, "json", KC_O_JSON, &json, &mount);
        if (rc >= 0)
                return rc;
        char where[1024];
        if (kc_get(mount, "remote", where, sizeof(where)) <= 0)
                return kc_fail("%s: no shared tier (mounted without -o remote=)", mount);
        static const char *const names[] = {
                "remote_hits", "remote_misses", "remote_remembered", "remote_timeouts", "remote_errors",
                "remote_corrupt", "remote_dirs", "remote_publishes", "remote_published_before", "remote_touches",
                "remote_bytes_in", "remote_bytes_out", "herd_waits", "herd_served", "herd_gave_up",
                "remote_server_used_bytes", "remote_server_max_bytes", "remote_server_evicted_keys",
                "remote_server_keys", "remote_server_seen_ns", "remote_trusted_hits",
        };
        unsigned uid = (unsigned)getuid();
        /* the caller's namespaces in lookup order: the own one (a publisher's, on a remote_publish= mount),
         * then the trusted publishers' (remote_trusted=); a daemon that does not say: the user's own */
        char ns[1024], *trusted = NULL;
        if (kc_get(mount, "remote_namespaces", ns, sizeof(ns)) <= 0)
                snprintf(ns, sizeof(ns), "kcfs:1:u%u:", uid);
        if ((trusted = strchr(ns, ' ')))
                *trusted++ = '\0';
        bool publisher = !strncmp(ns, "kcfs:1:p:", 9);
        if (json) {
                json_object *o = json_object_new_object();
                if (!o)
                        return kc_fail("out of memory");
                json_object_object_add(o, "mount", json_object_new_string(mount));
                json_object_object_add(o, "server", json_object_new_string(where));
                json_object_object_add(o, "namespace", json_object_new_string(ns));
                json_object *tr = json_object_new_array();
                for (char *save = NULL, *w = trusted ? strtok_r(trusted, " ", &save) : NULL; w;
                     w = strtok_r(NULL, " ", &save))
                        json_object_array_add(tr, json_object_new_string(w));
                json_object_object_add(o, "trusted", tr);
                for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
                        json_object_object_add(o, names[i], json_object_new_uint64(kc_num(mount, names[i])));
                kc_json_write(stdout, o);
                putchar('\n');
                json_object_put(o);
                return KC_EXIT_OK;
        }
        char a[32], b[32];
        printf("server      %s\n", where);
        if (publisher)
                printf("namespace   %s* (a trusted publisher's: every entry this mount stores)\n", ns);
        else
                printf("namespace   %s* (uid %u: the entries of yours that any node stored)\n", ns, uid);
        if (trusted)
                printf("trusted     %s (read only, after yours, in this order)\n", trusted);
        uint64_t seen = kc_num(mount, "remote_server_seen_ns");
        if (seen) {
                kc_human(kc_num(mount, "remote_server_used_bytes"), a, sizeof(a));
                uint64_t max = kc_num(mount, "remote_server_max_bytes");
                kc_human(max, b, sizeof(b));
                printf("on it       %s used of %s, %" PRIu64 " keys, %" PRIu64 " evicted (read %" PRIu64 " s ago)\n", a,
                       max ? b : "no limit (set maxmemory: docs/remote.md)", kc_num(mount, "remote_server_keys"),
                       kc_num(mount, "remote_server_evicted_keys"), (uint64_t)time(NULL) - seen / 1000000000);
        } else {
                printf("on it       not read yet (the daemon reads the server's figures with its touches)\n");
        }
        kc_human(kc_num(mount, "remote_bytes_in"), a, sizeof(a));
        kc_human(kc_num(mount, "remote_bytes_out"), b, sizeof(b));
        printf("this node   %" PRIu64 " entries fetched (%s), %" PRIu64 " misses, %" PRIu64 " timeouts, %" PRIu64
               " errors, %" PRIu64 " bad values; %" PRIu64 " published (%s); %" PRIu64 " herd waits\n",
               kc_num(mount, "remote_hits"), a, kc_num(mount, "remote_misses"), kc_num(mount, "remote_timeouts"),
               kc_num(mount, "remote_errors"), kc_num(mount, "remote_corrupt"), kc_num(mount, "remote_publishes"), b,
               kc_num(mount, "herd_waits"));
        return KC_EXIT_OK;
}

/* kcache stats --json or --prometheus [-o FILE]: one reading of the daemon's stats (export.h), the mount
 * named by its real path. */
static int kc_stats_export(const char *mount, bool json, const char *output, kidx_reader *rd)
{
        char real[PATH_MAX];
        json_object *stats = NULL;
        struct kc_out out;
        int r = realpath(mount, real) ? kc_stats_read(mount, &stats) : -errno;
        if (r < 0) {
                kidx_reader_close(rd);
                return kc_fail("%s: cannot read the statistics: %s", mount, strerror(-r));
        }
        struct kc_kept kept = { 0 }; /* the index's to say, not the daemon's: with read access to it */
        if (rd && kidx_reader_list(rd, false, 0, "", kc_kept_row, &kept) >= 0) {
                json_object_object_add(stats, "kept_files", json_object_new_uint64(kept.files));
                json_object_object_add(stats, "kept_bytes", json_object_new_uint64(kept.bytes));
        }
        if ((r = kc_out_open(&out, output)) == 0) {
                r = json ? kc_stats_json(out.f, real, stats, rd) : kc_stats_prometheus(out.f, real, stats, rd);
                if (r < 0 && r != -EIO) /* a failed write is said by kc_out_close */
                        kc_fail("%s: %s", mount, strerror(-r));
                r = kc_out_close(&out, r == 0) < 0 ? -EIO : r;
        }
        json_object_put(stats);
        kidx_reader_close(rd);
        return r < 0 ? KC_EXIT_FAILED : KC_EXIT_OK;
}

static int kc_cmd_stats(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = {
                { "json", no_argument, NULL, KC_O_JSON }, { "prometheus", no_argument, NULL, KC_O_PROMETHEUS },
                { "zero", no_argument, NULL, 'z' }, { "output", required_argument, NULL, 'o' },
                { "help", no_argument, NULL, 'h' }, { 0 },
        };
        int mode = 0, opt; /* 0 human, 1 json, 2 prometheus */
        bool zero = false;
        const char *output = NULL;
        while ((opt = kc_opt(v, argc, argv, "zo:", longs)) != -1) {
                if (opt == KC_O_JSON || opt == KC_O_PROMETHEUS) {
                        int m = opt == KC_O_JSON ? 1 : 2;
                        if (mode && mode != m)
                                return kc_bad_usage(v, "--json or --prometheus, not both");
                        mode = m;
                } else if (opt == 'z') {
                        zero = true;
                } else if (opt == 'o') {
                        output = optarg;
                } else {
                        return opt == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
                }
        }
        if (kc_operands(v, argc, argv, 0, 1, "MOUNT"))
                return KC_EXIT_USAGE;
        if (output && !mode)
                return kc_bad_usage(v, "--output needs --json or --prometheus");
        const char *mount = kc_mount_or_default(optind < argc ? argv[optind] : NULL);
        if (!mount || (zero && kc_zero(mount)))
                return KC_EXIT_FAILED;
        char index[PATH_MAX];
        if (kc_get(mount, "index", index, sizeof(index)) < 0)
                return kc_fail("%s: cannot read the statistics: %s", mount, strerror(errno));
        (void)kc_set(mount, "flush", "1"); /* current per-user totals, if we may ask */
        kidx_reader *rd = NULL;
        bool users = kidx_reader_open(index, &rd) == 0; /* needs read access to the index */
        if (mode) /* one reading of the daemon, written by export.c */
                return kc_stats_export(mount, mode == 1, output, users ? rd : NULL);
        { /* the plain output */
                char a[32], b[32], c[32], d[32], e[32];
                uint64_t max = kc_num(mount, "max_bytes"), used = kc_num(mount, "used_bytes");
                kc_human(max, a, sizeof(a));
                kc_human(used, b, sizeof(b));
                kc_human(kc_num(mount, "free_bytes"), c, sizeof(c));
                kc_human(kc_num(mount, "bytes_read"), d, sizeof(d));
                kc_human(kc_num(mount, "evicted_bytes"), e, sizeof(e));
                printf("mount       ");
                kc_put_shell(stdout, mount);
                printf("\nlimit       %s\nused        %s (%.1f%%)\nfree        %s\n"
                       "files       %" PRIu64 "\nhits        %" PRIu64 " opens, %s served by the daemon\n"
                       "evictions   %" PRIu64 " files, %s; %" PRIu64 " in the background, %" PRIu64
                       " writes waited for one\nrebuilds    %" PRIu64 "\n",
                       a, b, max ? 100.0 * (double)used / (double)max : 0.0, c, kc_num(mount, "files"),
                       kc_num(mount, "opens"), d, kc_num(mount, "evicted_files"), e,
                       kc_num(mount, "background_evictions"), kc_num(mount, "blocked_writes"),
                       kc_num(mount, "rebuilds"));
                char pt[256];
                if (kc_get(mount, "passthrough", pt, sizeof(pt)) > 0 && !strcmp(pt, "on"))
                        printf("reads       kernel passthrough (%" PRIu64 " opens)\n", kc_num(mount, "passthrough_opens"));
                else if (kc_get(mount, "passthrough", pt, sizeof(pt)) > 0)
                        printf("reads       through the page cache (passthrough %s)\n", pt);
                if (kc_get(mount, "transport", pt, sizeof(pt)) > 0) {
                        uint64_t ring = kc_num(mount, "ring_requests"), direct = kc_num(mount, "direct_requests");
                        printf("requests    %s, %" PRIu64 " through the rings", pt, ring);
                        if (direct) /* 0 where libfuse answers everything: -d, allow_root, /dev/fuse */
                                printf(" (%" PRIu64 " of them without libfuse)", direct);
                        printf("\n");
                }
                kc_human(kc_num(mount, "index_bytes"), a, sizeof(a));
                kc_human(kc_num(mount, "wal_bytes"), b, sizeof(b));
                printf("index       %s on disk (%s of it write-ahead log), ", a, b);
                kc_put_shell(stdout, index);
                putchar('\n');
                printf("descriptors %" PRIu64 " held for inodes, %" PRIu64 " reopened since mount\n",
                       kc_num(mount, "inode_fds"), kc_num(mount, "fd_reopens"));
                printf("inodes      %" PRIu64 " the kernel knows, %" PRIu64 " of them evicted and not yet forgotten; "
                       "%" PRIu64 " evicted names pruned from its cache\n",
                       kc_num(mount, "inodes"), kc_num(mount, "detached_inodes"), kc_num(mount, "pruned_names"));
                if (kc_get(mount, "remote", pt, sizeof(pt)) > 0) { /* the shared tier (kcachefs(8), SHARED TIER) */
                        kc_human(kc_num(mount, "remote_bytes_in"), a, sizeof(a));
                        kc_human(kc_num(mount, "remote_bytes_out"), b, sizeof(b));
                        printf("remote      %s: %" PRIu64 " units fetched (%s), %" PRIu64 " misses (%" PRIu64
                               " more remembered), %" PRIu64 " timeouts, %" PRIu64 " errors, %" PRIu64
                               " bad values; %" PRIu64 " published (%s), %" PRIu64 " already there; %" PRIu64
                               " told in use\n",
                               pt, kc_num(mount, "remote_hits"), a, kc_num(mount, "remote_misses"),
                               kc_num(mount, "remote_remembered"), kc_num(mount, "remote_timeouts"),
                               kc_num(mount, "remote_errors"), kc_num(mount, "remote_corrupt"),
                               kc_num(mount, "remote_publishes"), b, kc_num(mount, "remote_published_before"),
                               kc_num(mount, "remote_touches"));
                        if (kc_num(mount, "remote_trusted_hits"))
                                printf("trusted     %" PRIu64 " of the units fetched came from trusted publishers\n",
                                       kc_num(mount, "remote_trusted_hits"));
                        if (kc_num(mount, "herd_waits"))
                                printf("herd        %" PRIu64 " lookups waited for another's compile: %" PRIu64
                                       " got it, %" PRIu64 " compiled after all\n", kc_num(mount, "herd_waits"),
                                       kc_num(mount, "herd_served"), kc_num(mount, "herd_gave_up"));
                }
                struct kc_kept kept = { 0 };
                if (users && kidx_reader_list(rd, false, 0, "", kc_kept_row, &kept) >= 0) {
                        kc_human(kept.bytes, a, sizeof(a));
                        printf("kept        %" PRIu64 " files (%s) never evicted: pinned, or a runtime's locks, "
                               "counters and settings\n", kept.files, a);
                }
                uint64_t refetches = kc_num(mount, "refetches"), refused = kc_num(mount, "refused_writes");
                if (refetches) { /* the limit is too small for the working set (kcachefs(8), SIZING) */
                        kc_human(kc_num(mount, "refetch_bytes"), a, sizeof(a));
                        kc_human(kc_num(mount, "suggested_max_bytes"), b, sizeof(b));
                        printf("refetches   %" PRIu64 " files (%s) evicted, then stored again; a limit of %s would have "
                               "kept 9 in 10 of them\n", refetches, a, b);
                }
                if (refused) { /* the limit is too small for what runs at once */
                        kc_human(kc_num(mount, "refused_need_bytes"), a, sizeof(a));
                        printf("refused     %" PRIu64 " writes found nothing left to evict (open, pinned or in use); "
                               "they needed a limit of %s\n", refused, a);
                }
                if (users) {
                        printf("per user\n");
                        kidx_reader_users(rd, kc_user_row, NULL);
                } else {
                        printf("per user    (needs read access to the index ");
                        kc_put_shell(stdout, index);
                        printf(")\n");
                }
        }
        kidx_reader_close(rd);
        return 0;
}

/* ---- ls ---- */

struct kc_ls {
        bool json;
        bool lru;      /* the eviction order: what is never evicted is not in it (kc_never_evicted) */
        uint64_t max;  /* rows to print; 0: all */
        uint64_t rows; /* printed so far */
};

/* One file: a row of columns (the name last, quoted: quote.h), or an object of the JSON array. The
 * array streams, one json-c object a line between brackets written here, so that a listing of millions of
 * files never sits whole in memory. */
static int kc_ls_row(void *ud, const struct kidx_entry *e)
{
        struct kc_ls *ls = ud;
        if (ls->lru && kc_never_evicted(e))
                return 0;
        if (ls->max && ls->rows >= ls->max)
                return 1;
        if (ls->json) {
                json_object *o = json_object_new_object();
                if (!o)
                        return -ENOMEM;
                json_object_object_add(o, "path", json_object_new_string(e->path));
                json_object_object_add(o, "bytes", json_object_new_uint64(e->bytes));
                json_object_object_add(o, "atime_ns", json_object_new_int64(e->atime_ns));
                json_object_object_add(o, "opens", json_object_new_uint64(e->opens));
                json_object_object_add(o, "bytes_read", json_object_new_uint64(e->bytes_read));
                json_object_object_add(o, "pinned", json_object_new_boolean(e->pinned));
                json_object_object_add(o, "uid", json_object_new_int64(e->uid));
                json_object_object_add(o, "ino", json_object_new_uint64(e->ino));
                fputs(ls->rows++ ? ",\n  " : "\n  ", stdout);
                int r = kc_json_write(stdout, o);
                json_object_put(o);
                return r;
        }
        char when[64], h[32];
        time_t t = (time_t)(e->atime_ns / 1000000000LL);
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        kc_human(e->bytes, h, sizeof(h));
        printf("%10s  %s.%09lld  %6" PRIu64 "  %s  ", h, when, (long long)(e->atime_ns % 1000000000LL), e->opens,
               e->pinned ? "pin" : "   ");
        kc_put_shell(stdout, e->path);
        putchar('\n');
        ls->rows++;
        return 0;
}

/* Finds the mount root above path: the nearest directory that answers user.kcachefs.version. */
static int kc_find_root(const char *path, char *root, size_t size)
{
        char real[PATH_MAX], v[64];
        if (!realpath(path, real))
                return -errno;
        for (;;) {
                if (kc_get(real, "version", v, sizeof(v)) >= 0) { /* only the root answers "version" */
                        snprintf(root, size, "%s", real);
                        return 0;
                }
                char *slash = strrchr(real, '/');
                if (!slash || slash == real)
                        return -ENOENT;
                *slash = '\0';
        }
}

static int kc_cmd_ls(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = {
                { "lru", no_argument, NULL, KC_O_LRU }, { "mru", no_argument, NULL, KC_O_MRU },
                { "json", no_argument, NULL, KC_O_JSON }, { "help", no_argument, NULL, 'h' }, { 0 },
        };
        bool mru = false;
        struct kc_ls ls = { 0 };
        uint64_t n = 0;
        int c;
        while ((c = kc_opt(v, argc, argv, "n:", longs)) != -1) {
                if (c == KC_O_LRU || c == KC_O_MRU)
                        mru = c == KC_O_MRU;
                else if (c == KC_O_JSON)
                        ls.json = true;
                else if (c == 'n' && kc_parse_count(optarg, &n) < 0)
                        return kc_bad_usage(v, "invalid count '%s' for -n (a whole number, 1 or more)", optarg);
                else if (c != 'n')
                        return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
        }
        if (kc_operands(v, argc, argv, 0, 2, "MOUNT"))
                return KC_EXIT_USAGE;
        const char **args = (const char **)argv + optind;
        int nargs = argc - optind;
        const char *target = nargs == 2 ? args[1] : nargs == 1 ? args[0] : kc_default_mount();
        char root[PATH_MAX], real[PATH_MAX], index[PATH_MAX];
        if (nargs == 2 && kc_check_mount(args[0]))
                return 1;
        if (kc_find_root(nargs == 2 ? args[0] : target, root, sizeof(root)) < 0)
                return kc_fail("%s is not inside a kcachefs mount", target);
        /* PATH: absolute, or relative to the mount root when MOUNT is given, else to the current dir. */
        const char *prefix = "";
        if (nargs == 2 && args[1][0] != '/') {
                prefix = args[1];
        } else if (strcmp(target, root) && realpath(target, real)) {
                prefix = real + strlen(root);
        }
        while (*prefix == '/')
                prefix++;
        char clean[PATH_MAX];
        snprintf(clean, sizeof(clean), "%s", prefix);
        for (size_t l = strlen(clean); l > 0 && clean[l - 1] == '/'; l--)
                clean[l - 1] = '\0';
        prefix = clean;
        if (kc_get(root, "index", index, sizeof(index)) < 0)
                return kc_fail("%s: cannot find the index: %s", root, strerror(errno));
        (void)kc_set(root, "flush", "1"); /* fresh order if we may; otherwise at most a second old */
        kidx_reader *rd;
        int r = kidx_reader_open(index, &rd);
        if (r < 0)
                return kc_fail("cannot read the index %s: %s (kcache ls needs read access to it)", index, strerror(-r));
        if (ls.json)
                putchar('[');
        else
                printf("%10s  %-29s  %6s  %s  %s\n", "SIZE", "LAST ACCESS", "OPENS", "   ",
                       mru ? "PATH (most recent first)" : "PATH (next to be evicted first)");
        ls.lru = !mru;
        ls.max = n; /* counted here: the rows left out are not among them */
        r = kidx_reader_list(rd, mru, 0, prefix, kc_ls_row, &ls);
        kidx_reader_close(rd);
        if (ls.json)
                printf("%s]\n", ls.rows ? "\n" : "");
        return r < 0 ? kc_fail("listing failed: %s", strerror(-r)) : 0;
}

/* ---- evict, pin, unpin ---- */

struct kc_job {
        const char *mount, *attr, *value;
        int result;
        volatile int done;
};

static void *kc_set_thread(void *arg)
{
        struct kc_job *j = arg;
        j->result = kc_set(j->mount, j->attr, j->value);
        j->done = 1;
        return NULL;
}

int kc_set_watched(const char *mount, const char *attr, const char *value,
                   bool (*show)(const char *mount, void *state, unsigned tick), void *state)
{
        struct kc_job j = { mount, attr, value, 0, 0 };
        pthread_t t;
        if (!isatty(STDERR_FILENO) || pthread_create(&t, NULL, kc_set_thread, &j) != 0)
                return kc_set(mount, attr, value);
        bool shown = show(mount, state, 0);
        for (unsigned tick = 1; !j.done; tick++) {
                struct timespec ts = { 0, 200 * 1000 * 1000 };
                nanosleep(&ts, NULL);
                if (!j.done)
                        shown |= show(mount, state, tick);
        }
        pthread_join(t, NULL);
        if (shown)
                fputc('\n', stderr);
        return j.result;
}

/* An eviction's progress, from the daemon's counters. */
static bool kc_show_evicting(const char *mount, void *state, unsigned tick)
{
        uint64_t *base = state; /* evicted files and bytes at the start */
        if (tick == 0) {
                base[0] = kc_num(mount, "evicted_files");
                base[1] = kc_num(mount, "evicted_bytes");
                return false;
        }
        char h[32];
        kc_human(kc_num(mount, "evicted_bytes") - base[1], h, sizeof(h));
        fprintf(stderr, "\rkcache: evicting: %" PRIu64 " files, %s so far", kc_num(mount, "evicted_files") - base[0], h);
        return true;
}

static int kc_evict_with_progress(const char *mount, const char *value)
{
        uint64_t base[2];
        return kc_set_watched(mount, "evict", value, kc_show_evicting, base);
}

/* Opens path (following a symlink, as setxattr would) as an O_PATH descriptor, which opens nothing in the
 * mount (no access is logged), once it is checked to be a regular file of a kcachefs mount: the nearest
 * directory above where it resolved answers user.kcachefs.version (only a mount's root does) and is on
 * the same filesystem as the file. *ret_proc names it for the *xattr calls (/proc/self/fd/N: what is
 * set is set on the file that was checked, whatever happens to the path meanwhile). Returns the
 * descriptor, or -1 after the error is said. */
static int kc_open_in_mount(const char *path, char *ret_proc, size_t size)
{
        char real[PATH_MAX], root[PATH_MAX];
        struct stat st, rst;
        int fd = open(path, O_PATH | O_CLOEXEC);
        if (fd < 0)
                return kc_fail("%s: %s", path, strerror(errno)), -1;
        snprintf(ret_proc, size, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(ret_proc, real, sizeof(real) - 1);
        if (n > 0)
                real[n] = '\0';
        if (fstat(fd, &st) < 0 || n <= 0 || (size_t)n >= sizeof(real) - 1 || kc_find_root(real, root, sizeof(root)) < 0 ||
            stat(root, &rst) < 0 || rst.st_dev != st.st_dev) {
                close(fd);
                return kc_fail("%s is not in a kcachefs mount", path), -1;
        }
        if (!S_ISREG(st.st_mode)) {
                close(fd);
                return kc_fail("%s is not a regular file (only files are pinned or evicted)", path), -1;
        }
        return fd;
}

static int kc_evict_files(char **paths, int n)
{
        int status = KC_EXIT_OK;
        for (int i = 0; i < n; i++) {
                char proc[64];
                int fd = kc_open_in_mount(paths[i], proc, sizeof(proc));
                if (fd < 0) {
                        status = KC_EXIT_FAILED;
                        continue;
                }
                int r = kc_set(proc, "evict", "1");
                close(fd);
                if (r < 0)
                        status = kc_fail("%s: %s%s", paths[i],
                                         r == -EBUSY ? "open, not evicted" : r == -EPERM ? "pinned or not permitted"
                                                                                       : strerror(-r),
                                         kc_perm_hint(r == -EPERM ? 0 : r));
        }
        return status;
}

static int kc_cmd_evict(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = {
                { "to", required_argument, NULL, KC_O_TO }, { "older-than", required_argument, NULL, KC_O_OLDER_THAN },
                { "help", no_argument, NULL, 'h' }, { 0 },
        };
        const char *to = NULL, *older = NULL;
        int c;
        while ((c = kc_opt(v, argc, argv, "", longs)) != -1) {
                if (c == KC_O_TO)
                        to = optarg;
                else if (c == KC_O_OLDER_THAN)
                        older = optarg;
                else
                        return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
        }
        if (to && older)
                return kc_bad_usage(v, "--to or --older-than, not both");
        if (!to && !older) {
                if (kc_operands(v, argc, argv, 1, -1, "PATH"))
                        return KC_EXIT_USAGE;
                return kc_evict_files(argv + optind, argc - optind);
        }
        if (argc - optind != 1) /* files with --to would be taken for the mount, or the mount for a file */
                return kc_bad_usage(v, "%s needs the MOUNT and nothing else", to ? "--to" : "--older-than");
        char value[128];
        if (to) {
                uint64_t bytes;
                if (kparse_size(to, &bytes, 1) < 0)
                        return kc_bad_usage(v, "invalid size '%s' for --to (examples: 1.5G, 500M, 64K, 0)", to);
                snprintf(value, sizeof(value), "to=%" PRIu64, bytes);
        } else {
                double secs;
                if (kparse_duration(older, &secs, 1) < 0) /* finite, 0 to 100 years: "nan" evicted nothing */
                        return kc_bad_usage(v, "invalid duration '%s' for --older-than (examples: 90s, 15m, 12h, 30d)",
                                            older);
                snprintf(value, sizeof(value), "older=%.3f", secs);
        }
        const char *mount = argv[optind];
        if (kc_check_mount(mount))
                return KC_EXIT_FAILED;
        uint64_t before = kc_num(mount, "used_bytes"), files = kc_num(mount, "files");
        int r = kc_evict_with_progress(mount, value);
        if (r < 0)
                return kc_fail("%s: eviction failed: %s%s", mount, strerror(-r), kc_perm_hint(r));
        char a[32], b[32];
        uint64_t after = kc_num(mount, "used_bytes");
        kc_human(before > after ? before - after : 0, a, sizeof(a));
        kc_human(after, b, sizeof(b));
        uint64_t left = kc_num(mount, "files");
        printf("evicted %" PRIu64 " files, %s; %s in use\n", files > left ? files - left : 0, a, b);
        return KC_EXIT_OK;
}

/* pin and unpin: the daemon keeps the pin (fs/control.c, PINS). */
static int kc_pin(const struct kc_verb *v, int argc, char **argv, bool pin)
{
        static const struct option longs[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
        int c;
        if ((c = kc_opt(v, argc, argv, "", longs)) != -1)
                return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
        if (kc_operands(v, argc, argv, 1, -1, "PATH"))
                return KC_EXIT_USAGE;
        int status = KC_EXIT_OK;
        for (int i = optind; i < argc; i++) {
                char proc[64];
                int fd = kc_open_in_mount(argv[i], proc, sizeof(proc));
                if (fd < 0) {
                        status = KC_EXIT_FAILED;
                        continue;
                }
                int r = pin ? kc_set(proc, "pinned", "1") : (removexattr(proc, KC_PREFIX "pinned") < 0 ? -errno : 0);
                close(fd);
                if (r < 0)
                        status = kc_fail("%s: %s%s", argv[i], strerror(-r), kc_perm_hint(r));
        }
        return status;
}

static int kc_cmd_pin(const struct kc_verb *v, int argc, char **argv)
{
        return kc_pin(v, argc, argv, true);
}

static int kc_cmd_unpin(const struct kc_verb *v, int argc, char **argv)
{
        return kc_pin(v, argc, argv, false);
}

/* ---- env ---- */

static void kc_env_line(const char *line, const char *dir)
{
        for (const char *p = line; *p;) {
                const char *at = strstr(p, "@DIR@");
                if (!at) {
                        fputs(p, stdout);
                        break;
                }
                fwrite(p, 1, (size_t)(at - p), stdout);
                fputs(dir, stdout);
                p = at + 5;
        }
        putchar('\n');
}

/* Whether the kernel lets other users into the mount at real (a resolved path): allow_other among its
 * superblock options in /proc/self/mountinfo, the topmost mount there winning. The kernel's word, not the
 * daemon's: it is what lets them in. */
static bool kc_mount_shared(const char *real)
{
        FILE *f = fopen("/proc/self/mountinfo", "re");
        char *line = NULL;
        size_t cap = 0;
        bool shared = false;
        while (f && getline(&line, &cap, f) > 0) {
                char point[PATH_MAX], *sep = strstr(line, " - "), *p = line, *o = point;
                for (int field = 0; field < 4 && p; field++) /* id parent dev root: the mount point is the 5th */
                        p = strchr(p, ' ') ? strchr(p, ' ') + 1 : NULL;
                if (!p || !sep)
                        continue;
                for (; *p && *p != ' ' && o < point + sizeof(point) - 1; p++) /* \040 and the like: octal */
                        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] && p[3]) {
                                *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
                                p += 3;
                        } else {
                                *o++ = *p;
                        }
                *o = '\0';
                if (strcmp(point, real))
                        continue;
                /* after " - ": fstype source superoptions */
                char *opts = strchr(sep + 3, ' ');
                opts = opts ? strchr(opts + 1, ' ') : NULL;
                shared = false;
                for (char *save = NULL, *t = opts ? strtok_r(opts + 1, ",\n", &save) : NULL; t;
                     t = strtok_r(NULL, ",\n", &save))
                        shared = shared || !strcmp(t, "allow_other");
        }
        free(line);
        if (f)
                fclose(f);
        return shared;
}

/* Where kcache env puts the runtimes' directories: the mount itself on a personal mount; on one others
 * use, the caller's own directory, which only the daemon can make and give (fs/users.c): home on the
 * mount's root answers its path. Checked to be a directory of the caller's, 0700, before anything is put
 * in it. Prints the error itself. */
static int kc_env_base(const char *mount, const char *real, char *base, size_t size)
{
        snprintf(base, size, "%s", real);
        if (!kc_mount_shared(real))
                return 0;
        char home[256];
        ssize_t n = kc_get(mount, "home", home, sizeof(home));
        if (n < 0)
                return kc_fail("%s is shared with other users, and the daemon gave no directory of your own: %s "
                               "(runtimes' directories shared by users would let one load another's binaries)",
                               mount, strerror((int)-n));
        if (strstr(home, "..") || home[0] == '/' || (size_t)snprintf(base, size, "%s/%s", real, home) >= size)
                return kc_fail("%s: the daemon answered a strange directory '%s'", mount, home);
        struct stat st;
        if (lstat(base, &st) < 0)
                return kc_fail("%s: %s", base, strerror(errno));
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
                return kc_fail("%s is not a directory of yours that only you can use", base);
        return 0;
}

/* The runtimes' descriptors (common/runtimes.c) say what each one needs. */
static bool kc_is_runtime(const char *name)
{
        int rt = krt_by_name(name);
        return rt >= 0 && krt_table[rt].env;
}

/* env [MOUNT] [RUNTIME...]: the first operand is the mount unless it is a runtime's name (a mount so
 * named is written with a slash: ./pocl), so that MOUNT defaults to $KCACHEFS_MOUNT as everywhere. */
static int kc_cmd_env(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
        int c;
        if ((c = kc_opt(v, argc, argv, "", longs)) != -1)
                return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
        int first = optind;
        const char *mount = first < argc && !kc_is_runtime(argv[first]) ? argv[first++] : NULL;
        int want[KRT__COUNT], n = 0;
        for (int i = first; i < argc; i++) {
                if (!kc_is_runtime(argv[i])) {
                        char known[512] = "";
                        for (int k = 0; k < KRT__COUNT; k++)
                                if (krt_table[k].env)
                                        snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s",
                                                 *known ? " " : "", krt_table[k].name);
                        return kc_bad_usage(v, "unknown runtime '%s' (%s)", argv[i], known);
                }
                if (n < KRT__COUNT)
                        want[n++] = krt_by_name(argv[i]);
        }
        for (int k = 0; first == argc && k < KRT__COUNT; k++)
                if (krt_table[k].env && krt_table[k].env_default)
                        want[n++] = k;
        if (!(mount = kc_mount_or_default(mount)))
                return KC_EXIT_FAILED;
        char real[PATH_MAX];
        if (!realpath(mount, real))
                return kc_fail("%s: %s", mount, strerror(errno));
        char base[PATH_MAX];
        if (kc_env_base(mount, real, base, sizeof(base)))
                return 1;
        for (int i = 0; i < n; i++) {
                const struct krt_desc *d = &krt_table[want[i]];
                char dir[PATH_MAX + 64];
                snprintf(dir, sizeof(dir), "%s/%s", base, d->dir);
                if (mkdir(dir, 0777) < 0 && errno != EEXIST)
                        return kc_fail("cannot create %s: %s", dir, strerror(errno));
                /* The directory is this runtime's: its rules apply there, whatever the layout looks like
                 * (fs/evict/marks.c). Not for one that others share, nor where we may not: then the
                 * daemon recognises the runtime by its layout, as before. */
                if (!d->dir_shared)
                        (void)setxattr(dir, "user.kcachefs.runtime", d->name, strlen(d->name), 0);
                kc_env_line(d->env, dir);
        }
        return 0;
}

static int kc_cmd_show(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
        int c;
        if ((c = kc_opt(v, argc, argv, "", longs)) != -1)
                return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
        if (kc_operands(v, argc, argv, 1, -1, "FILE"))
                return KC_EXIT_USAGE;
        return kc_show(argc - optind, argv + optind);
}

/* The verbs, in the order of the usage. kcache(1)'s SYNOPSIS and DESCRIPTION say the same. */
static const struct kc_verb kc_verbs[] = {
        { "stats", kc_cmd_stats,
          { { "[MOUNT] [--json|--prometheus] [-o FILE] [-z|--zero]", "limit, use, files, hits, evictions, per-user usage" } },
          "  --json         one JSON object, stable keys (max_bytes, used_bytes, files, ...)\n"
          "  --prometheus   the Prometheus text format, for a node exporter's textfile collector\n"
          "  -o, --output FILE\n"
          "                 with --json or --prometheus: replace FILE atomically (a temporary file\n"
          "                 beside it, renamed over it once whole), instead of writing to stdout\n"
          "  -z, --zero     zero the statistics counters first (as kcache zero), then print\n" },
        { "remote", kc_cmd_remote,
          { { "[MOUNT] [--json]", "the shared tier: its server, your namespace, its use, this node's counters" } },
          "  --json         one JSON object\n" },
        { "zero", kc_cmd_zero,
          { { "[MOUNT]", "zero the statistics counters (hits, evictions, refetches...)" } },
          NULL },
        { "config", kc_cmd_config,
          { { "[MOUNT] [--json]", "every setting of the mount (max_size, low_watermark, grace_ms, ...)" } },
          "  --json         one JSON object\n" },
        { "set", kc_cmd_set,
          { { "MOUNT KEY=VALUE... [--wait DURATION]", "change settings of the running mount (max_size=20G,\n"
                                                      "low_watermark, grace_ms, tmp_age, protect, pin, stale_locks)" } },
          "  --wait DURATION  after a smaller max_size, wait this long for eviction to reach it\n"
          "                   (default 5m; 0: do not wait)\n" },
        { "ls", kc_cmd_ls,
          { { "[MOUNT] [PATH] [--lru|--mru] [-n N] [--json]", "files in eviction order with size, last access, opens" } },
          "  --lru          the next to be evicted first (the default); what is never evicted (pinned,\n"
          "                 a runtime's locks, counters, settings) is not listed\n"
          "  --mru          the most recently used first\n"
          "  -n N           at most N files\n"
          "  --json         a JSON array, one object per file\n" },
        { "evict", kc_cmd_evict,
          { { "MOUNT --to SIZE", "evict least recently used files down to SIZE (1.5G, 500M, 0)" },
            { "MOUNT --older-than DURATION", "evict files not accessed for DURATION (90s, 15m, 12h, 30d)" },
            { "PATH...", "evict these files now (unless open or pinned)" } },
          "  --to SIZE                evict down to SIZE bytes (K, M, G, T, P: powers of 1024)\n"
          "  --older-than DURATION    evict what was not accessed for DURATION (s, m, h, d, w)\n" },
        { "pin", kc_cmd_pin, { { "PATH...", "never evict these files" } }, NULL },
        { "unpin", kc_cmd_unpin, { { "PATH...", "allow evicting these files again" } }, NULL },
        { "verify", kc_cmd_verify,
          { { "[--repair] [MOUNT]", "compare the index with the backing directory" } },
          "  --repair       have the daemon reconcile the differences\n" },
        { "env", kc_cmd_env,
          { { "[MOUNT] [RUNTIME...]", "export lines pointing runtimes at the mount (on a shared mount, at a\n"
                                      "directory of your own in it)" } },
          NULL },
        { "show", kc_cmd_show, { { "FILE...", "decode libkcache entries: key fields, sizes, verdict" } }, NULL },
};
#define KC_NVERBS (sizeof(kc_verbs) / sizeof(kc_verbs[0]))

static const struct kc_verb *kc_verb_by_name(const char *name)
{
        for (size_t i = 0; i < KC_NVERBS; i++)
                if (!strcmp(kc_verbs[i].name, name))
                        return &kc_verbs[i];
        return NULL;
}

int main(int argc, char **argv)
{
        static const struct option longs[] = {
                { "help", no_argument, NULL, 'h' }, { "version", no_argument, NULL, 'V' }, { 0 },
        };
        int c;
        while ((c = kc_opt(NULL, argc, argv, "V", longs)) != -1) {
                if (c == KC_OPT_HELP) {
                        kc_usage(stdout, kc_verbs, KC_NVERBS);
                        return KC_EXIT_OK;
                }
                if (c == 'V') {
                        printf("kcache (kcachefs) " KCACHE_VERSION "\n");
                        return KC_EXIT_OK;
                }
                return KC_EXIT_USAGE;
        }
        if (optind >= argc) {
                kc_usage(stderr, kc_verbs, KC_NVERBS);
                return KC_EXIT_USAGE;
        }
        const char *cmd = argv[optind];
        argc -= optind;
        argv += optind;
        optind = 0; /* glibc: start over on the verb's arguments */
        if (!strcmp(cmd, "help")) { /* help [COMMAND] */
                const struct kc_verb *v = argc > 1 ? kc_verb_by_name(argv[1]) : NULL;
                if (argc > 2 || (argc == 2 && !v))
                        return kc_bad_usage(NULL, "help: unknown command '%s'", argv[argc - 1]);
                if (v)
                        kc_verb_help(stdout, v);
                else
                        kc_usage(stdout, kc_verbs, KC_NVERBS);
                return KC_EXIT_OK;
        }
        const struct kc_verb *v = kc_verb_by_name(cmd);
        if (!v)
                return kc_bad_usage(NULL, "unknown command '%s'", cmd);
        int rc = v->run(v, argc, argv);
        /* What stdio still holds is written now: a full disk or a closed pipe must not pass for success
         * (a verb that failed has said why already). */
        errno = 0;
        if (rc == KC_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout)))
                rc = kc_fail("cannot write the output: %s", strerror(errno ? errno : EIO));
        return rc;
}
