/* main.c: the kcachefs command: options, checks, start-up and shutdown.
 *
 * Start-up order matters for the promise "bad input gets one clear line and changes nothing":
 *   1. parse and check every option and both directories, touching nothing;
 *   2. detach (unless -f): the parent waits on a pipe and exits with the child's verdict, so errors found
 *      later still reach the terminal and the exit status, and the index is opened once, in the daemon;
 *   3. create the metadata directory, take the index lock (one daemon per index), open or rebuild the
 *      index, mount, send messages where they go from now on (start_log: -o log=, the journal, syslog
 *      or the fallback file), then tell the parent we are up (and systemd: sd_notify READY=1).
 * SIGHUP re-reads the settings file (-o config=FILE; settings.c) and the mount goes on.
 * At unmount (fusermount3 -u, or SIGTERM/SIGINT) the FUSE loop ends, the last batch is flushed and
 * the index is marked clean, so the next mount need not rescan. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <syslog.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "kfs.h"
#include "remote/remote.h"

#define DEFAULT_MAX_SIZE KFS_DEFAULT_MAX_SIZE
#define DEFAULT_LOW_WATERMARK 90
#define DEFAULT_PINS KFS_DEFAULT_PINS
#define DEFAULT_TIMEOUT 3600.0
#define DEFAULT_REMOTE_TIMEOUT_MS 5 /* a round trip in a data centre is well under 1 ms */
#define DEFAULT_REMOTE_NEGATIVE_S 5.0
#define LOCK_WAIT_MS 30000 /* for a daemon that is stopping to let go of the index */

static void usage(const char *prog)
{
        printf("usage: %s [options] BACKING_DIR MOUNTPOINT\n"
               "       %s -o config=FILE [options] MOUNTPOINT   (FILE says backing = BACKING_DIR)\n"
               "\n"
               "A FUSE filesystem for GPU kernel caches: every access is logged exactly, the cache never grows\n"
               "past its limit, and least recently used files are evicted. Unmount with fusermount3 -u.\n"
               "\n"
               "kcachefs options:\n"
               "    -o max_size=SIZE        size limit, bytes or with K/M/G/T/P (powers of 1024; 1.5G is\n"
               "                            1.5 GiB), from 64K to 1024P; default %s\n"
               "    -o low_watermark=PCT    eviction frees down to PCT%% of max_size (1 to 100), in the\n"
               "                            background from halfway between it and max_size on; default %d\n"
               "    -o pin=GLOB[:GLOB...]   never evict matching files (a GLOB with '/' matches the path\n"
               "                            relative to the cache root, one without matches the name);\n"
               "                            default %s\n"
               "    -o protect=open|writers never evict open files (open, default) or only files open for\n"
               "                            writing (writers)\n"
               "    -o layout=RT | DIR=RT[:DIR=RT...]\n"
               "                            the runtime whose cache layout a directory holds, for caches\n"
               "                            whose files do not tell; default: recognised by their layout.\n"
               "                            RT is one of:\n",
               prog, prog, DEFAULT_MAX_SIZE, DEFAULT_LOW_WATERMARK, DEFAULT_PINS);
        for (int i = 0; i < KRT__COUNT; i++)
                printf("                              %-17s %s\n", krt_table[i].name, krt_table[i].what);
        printf("    -o tmp_age=DURATION     a runtime's temporary file older than this is leaked and may go\n"
               "                            (seconds, or with s/m/h/d; 1s to 30d); default 3600\n"
               "    -o stale_locks          remove a lock file (lock, *.lock) made through the mount when it is\n"
               "                            looked up after the process that made it has exited (torch\n"
               "                            extensions wait for one forever); default: never\n"
               "    -o grace_ms=MS          never evict an entry used this recently (a runtime builds and\n"
               "                            reads an entry in several steps), 0 to 3600000; default 2000\n"
               "    -o inode_fds=N          idle inodes' descriptors kept open (others are reopened at their\n"
               "                            next use), at least 1; default, and at most, half of\n"
               "                            RLIMIT_NOFILE\n"
               "    -o index=PATH           SQLite index location; default BACKING_DIR/%s/index.db. Keep it\n"
               "                            on a local disk when BACKING_DIR is on NFS or Lustre\n"
               "    -o timeout=DURATION     kernel cache timeout for names and attributes (seconds, or with\n"
               "                            s/m/h/d; 0 to 1d); default %.0f\n"
               "    -o flush_ms=MS          how often the access log is committed, 10 to 60000; default 1000\n"
               "    -o log=FILE             once mounted, append messages to FILE (one line each, with the\n"
               "                            time and the priority) instead of the journal or syslog\n"
               "                            (detached) or stderr (-f). Without it, with no journal and no\n"
               "                            /dev/log, a detached daemon's go to\n"
               "                            BACKING_DIR/%s/kcachefs.log (INDEX.log with index= elsewhere)\n"
               "    -o rebuild              reconcile the index with BACKING_DIR at mount\n"
               "    -o tighten              where no directory above BACKING_DIR keeps other users out, close\n"
               "                            its parent (chmod go-rwx) when that is safe, instead of refusing\n"
               "                            to mount: owned by the daemon's user, not /, not shared like /tmp\n"
               "    -o nopassthrough        never let the kernel read files directly from BACKING_DIR (kernel\n"
               "                            passthrough, used for read-only opens when the daemon runs as root\n"
               "                            on Linux 6.9+); reads then go through the FUSE page cache\n"
               "    -o nouring              take requests through /dev/fuse even when the kernel offers FUSE\n"
               "                            over io_uring (Linux 6.14+; as root on 6.18+ the fuse module's\n"
               "                            enable_uring is turned on), which serves each request on the CPU\n"
               "                            that made it\n"
               "    -o norefresh            after a file is closed, only drop the kernel's attributes of it;\n"
               "                            by default a root daemon's child process fetches them anew, so\n"
               "                            that the next open's fstat asks nothing\n"
               "    -o nolog                debugging: do not log accesses (LRU order becomes creation order)\n"
               "    -o config=FILE          read settings from FILE, key = value lines with the names of these\n"
               "                            options (max_size = 20G); -o options win over it. SIGHUP re-reads\n"
               "                            it: max_size, low_watermark, grace_ms, tmp_age, protect, pin and\n"
               "                            stale_locks change at once (as with kcache set), others at remount.\n"
               "                            backing = DIR in it is BACKING_DIR when only MOUNTPOINT is given.\n"
               "                            Refused if anybody but root and the daemon's user can change it\n"
               "                            (the file, or a directory above it that is not sticky)\n"
               "\n"
               "The shared tier (docs/remote.md): runtime entries compiled on one node, served to the others\n"
               "    -o remote=URL           a Redis-protocol server, redis://HOST[:PORT][/DB] or unix:/PATH;\n"
               "                            default: none\n"
               "    -o remote_auth=FILE     its password, or ACL user and password, on FILE's first line (the\n"
               "                            daemon user's file, mode 0600)\n"
               "    -o remote_timeout_ms=MS a lookup's deadline for the server, 1 to 60000; default %d\n"
               "    -o remote_negative_s=S  a name the server lacks is not asked again for S seconds (or with\n"
               "                            s/m/h/d; 0 to 1d); default %.0f\n"
               "    -o remote_touch_s=S     the entries used here are told to the server every S seconds (or\n"
               "                            with s/m/h/d; 0.1s to 1d), so that its LRU keeps them; default 60\n"
               "    -o herd_wait=S          a lookup of a compile's output that another node or process is\n"
               "                            compiling waits up to S seconds for it (or with s/m/h/d; 0 to\n"
               "                            1h); default 0: never\n"
               "    -o remote_publish=NAME  store the publishing account's entries in trusted publisher NAME's\n"
               "                            namespace (with its ACL user in remote_auth=); others' entries\n"
               "                            go to their own namespaces as ever\n"
               "    -o remote_publisher=USER  the publishing account (a name or uid); default: who mounts\n"
               "    -o remote_trusted=LIST  on a miss in the user's own namespace, read these publishers'\n"
               "                            namespaces, NAME[:NAME...] (at most 8), in order; read only\n"
               "\n"
               "Every mount is nosuid,nodev; its source (df, findmnt, mount(8)) is BACKING_DIR, its type\n"
               "fuse.kcachefs. allow_other (a mount for every user) adds default_permissions.\n"
               "\n",
               KFS_META_DIR, DEFAULT_TIMEOUT, KFS_META_DIR, DEFAULT_REMOTE_TIMEOUT_MS, DEFAULT_REMOTE_NEGATIVE_S);
        printf("FUSE options:\n");
        fuse_cmdline_help();
        fuse_lowlevel_help();
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
        char msg[PATH_MAX * 3];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        kfs_log(LOG_ERR, "%s", msg);
        return 1;
}

/* a is b or lies below it. Both are resolved absolute paths. */
static bool path_within(const char *a, const char *b)
{
        size_t n = strlen(b);
        if (n == 1)
                return true; /* b is "/" */
        return strncmp(a, b, n) == 0 && (a[n] == '\0' || a[n] == '/');
}

static int check_dir(const char *what, const char *given, char **ret, bool need_write)
{
        char *real = realpath(given, NULL);
        struct stat st;
        if (!real)
                return fail("%s '%s': %s", what, given, errno == ENOENT ? "does not exist" : strerror(errno));
        if (stat(real, &st) < 0 || !S_ISDIR(st.st_mode)) {
                free(real);
                return fail("%s '%s' is not a directory", what, given);
        }
        if (need_write && access(real, W_OK | X_OK) < 0) {
                int e = errno;
                free(real);
                return fail("%s '%s' is not writable: %s", what, given, strerror(e));
        }
        *ret = real;
        return 0;
}

/* Network filesystems break SQLite's locking: say so (the mount still goes ahead). */
static void warn_network_fs(const char *dir)
{
        struct statfs sf;
        if (statfs(dir, &sf) < 0)
                return;
        static const struct { long magic; const char *name; } nfs[] = {
                { 0x6969, "NFS" }, { 0x0BD00BD0, "Lustre" }, { 0xFF534D42, "CIFS" }, { 0xFE534D42, "SMB2" },
                { 0x00C36400, "CephFS" }, { 0x47504653, "GPFS" }, { 0x19830326, "BeeGFS" },
                { 0x65735546, "FUSE" },
        };
        for (size_t i = 0; i < sizeof(nfs) / sizeof(nfs[0]); i++)
                if ((long)sf.f_type == nfs[i].magic)
                        kfs_log(LOG_WARNING, "the index is on %s (%s); SQLite needs a local "
                                             "filesystem: use -o index=/local/path", nfs[i].name, dir);
}

static int check_opts(struct kfs_opts *o, const char *mountpoint_arg)
{
        int r;
        if (!o->backing || !mountpoint_arg)
                return fail("need BACKING_DIR and MOUNTPOINT (see --help)");
        char why[512];
        if (kfs_opts_check(o, DEFAULT_MAX_SIZE, why, sizeof(why)) < 0)
                return fail("%s", why);
        if (o->herd_wait > 0 && !o->remote_url)
                return fail("herd_wait= needs remote=");
        if (o->remote_auth && !o->remote_url)
                return fail("remote_auth= needs remote=");
        if ((o->remote_publish || o->remote_trusted) && !o->remote_url)
                return fail("%s= needs remote=", o->remote_publish ? "remote_publish" : "remote_trusted");
        if (o->remote_publish && kfs_remote_names(o->remote_publish, NULL, 0, 1) != 1)
                return fail("invalid remote_publish '%s': expected a name of 1 to 32 of a-z 0-9 _ -",
                            o->remote_publish);
        if (o->remote_publisher && !o->remote_publish)
                return fail("remote_publisher= needs remote_publish=");
        uid_t pu;
        if (o->remote_publisher && kfs_remote_publisher_uid(o->remote_publisher, &pu) < 0)
                return fail("invalid remote_publisher '%s': no such user", o->remote_publisher);
        if (o->remote_trusted && kfs_remote_names(o->remote_trusted, NULL, 0, 8) < 1)
                return fail("invalid remote_trusted '%s': expected 1 to 8 names of 1 to 32 of a-z 0-9 _ -, "
                            "separated by ':'", o->remote_trusted);
        if (o->layout_str && kfs_parse_layouts(o->layout_str, &o->layouts, &o->nlayouts) < 0) {
                char names[512] = "";
                for (int i = 0; i < KRT__COUNT; i++)
                        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? ", " : "",
                                 krt_table[i].name);
                return fail("invalid layout '%s': expected RT or DIR=RT[:DIR=RT...] with RT one of %s",
                            o->layout_str, names);
        }
        if (kfs_parse_pins(o->pin_str ? o->pin_str : DEFAULT_PINS, &o->pins) < 0)
                return fail("out of memory");

        char *given_backing = o->backing;
        o->backing = NULL;
        r = check_dir("backing directory", given_backing, &o->backing, true);
        free(given_backing);
        if (r)
                return r;
        struct statfs sf;
        if (statfs(o->backing, &sf) == 0 && (unsigned long)sf.f_type == 0x794c7630UL) /* OVERLAYFS_SUPER_MAGIC */
                return fail("the backing directory '%s' is on overlayfs, whose files report other devices and "
                            "inode numbers than its directories; the cache needs one real filesystem: use a "
                            "volume or bind mount from the host, a local disk or tmpfs", o->backing);
        if (!o->mountpoint && (r = check_dir("mount point", mountpoint_arg, &o->mountpoint, false)))
                return r;
        if (path_within(o->mountpoint, o->backing))
                return fail("the mount point '%s' is inside the backing directory '%s'", o->mountpoint, o->backing);
        if (path_within(o->backing, o->mountpoint))
                return fail("the backing directory '%s' is inside the mount point '%s'", o->backing, o->mountpoint);

        if (o->index_path) {
                /* The index's directory must exist and be writable; the file itself may be new. */
                char *copy = strdup(o->index_path), *slash = strrchr(copy, '/');
                const char *dir = slash ? (slash == copy ? "/" : (*slash = '\0', copy)) : ".";
                char *rdir = NULL;
                r = check_dir("index directory", dir, &rdir, true);
                if (r == 0) {
                        const char *base = strrchr(o->index_path, '/');
                        base = base ? base + 1 : o->index_path;
                        char *full;
                        if (!*base || asprintf(&full, "%s/%s", strcmp(rdir, "/") ? rdir : "", base) < 0)
                                r = fail("invalid index path '%s'", o->index_path);
                        else {
                                free(o->index_path);
                                o->index_path = full;
                                if (path_within(rdir, o->mountpoint))
                                        r = fail("the index '%s' is inside the mount point", o->index_path);
                                else if (path_within(rdir, o->backing))
                                        r = fail("the index '%s' is inside the backing directory, where the "
                                                 "cache would see it; leave index= unset to keep it in %s/",
                                                 o->index_path, KFS_META_DIR);
                                else
                                        warn_network_fs(rdir);
                        }
                }
                free(rdir);
                free(copy);
                if (r)
                        return r;
        }
        return 0;
}

/* The mount's source is the backing directory and its type fuse.kcachefs, as bindfs and mergerfs show
 * theirs: df and findmnt tell two caches apart, and mount(8) sees that an fstab line is mounted already
 * (mount -a twice mounts once). Put first, so that an fsname= or subtype= of the operator's wins; libfuse
 * escapes nothing, so a comma or backslash in the path is escaped here (fuse_opt_add_opt_escaped). */
static int add_source(struct fuse_args *args, const char *backing)
{
        char *opts = NULL, *arg = NULL;
        int r = fuse_opt_add_opt(&opts, "subtype=kcachefs");
        if (r == 0)
                r = fuse_opt_add_opt(&opts, "fsname=");
        if (r == 0) { /* "fsname=" then the escaped path, with no comma between */
                char *esc = NULL;
                r = fuse_opt_add_opt_escaped(&esc, backing);
                if (r == 0 && asprintf(&arg, "-o%s%s", opts, esc) < 0)
                        r = -1, arg = NULL;
                free(esc);
        }
        if (r == 0)
                r = fuse_opt_insert_arg(args, 1, arg);
        free(arg);
        free(opts);
        return r < 0 ? fail("out of memory") : 0;
}

/* The index lock file says who holds the index and how far it is (see take_index_lock): "PID\n" while
 * it starts, "PID mounted\nMOUNTPOINT\n" while it serves, "PID stopping\n" from the end of serving until
 * exit. Written over the old text, then cut, so that a reader sees one line or the other whole. */
static void mark_lock(int lock_fd, const char *state, const char *mnt)
{
        char line[PATH_MAX + 64];
        int n = snprintf(line, sizeof(line), "%ld %s\n%s%s", (long)getpid(), state, mnt ? mnt : "", mnt ? "\n" : "");
        if (lock_fd < 0 || n < 0 || (size_t)n >= sizeof(line))
                return;
        if (pwrite(lock_fd, line, (size_t)n, 0) == n && ftruncate(lock_fd, n) == 0)
                return;
        /* not said: a remount then fails at once, as it always did */
}

/* Whether libfuse's allow_root or its debug output is among the options (direct.c: the rings then leave
 * every request to libfuse, for its check or its log). */
static bool libfuse_own(const struct fuse_args *args)
{
        struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
        struct { int on; } seen = { 0 };
        const struct fuse_opt spec[] = { { "allow_root", 0, 1 }, { "debug", 0, 1 }, { "-d", 0, 1 },
                                         { "--debug", 0, 1 }, FUSE_OPT_END };
        bool ok = true;
        for (int i = 0; i < args->argc && ok; i++)
                ok = fuse_opt_add_arg(&copy, args->argv[i]) == 0;
        ok = ok && fuse_opt_parse(&copy, &seen, spec, NULL) == 0;
        fuse_opt_free_args(&copy);
        return !ok || seen.on; /* unsure: as if it were */
}

/* libfuse's own -o options, checked before anything is made: a session is made and thrown away (it
 * mounts nothing). An unknown option used to fail only after the index had been created. */
static int check_fuse_opts(struct fuse_args *args)
{
        struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
        for (int i = 0; i < args->argc; i++)
                if (fuse_opt_add_arg(&copy, args->argv[i]) < 0)
                        return fail("out of memory");
        struct fuse_lowlevel_ops none = { 0 };
        struct fuse_session *se = fuse_session_new(&copy, &none, sizeof(none), NULL);
        fuse_opt_free_args(&copy);
        if (!se)
                return fail("invalid options (see --help): nothing was changed");
        fuse_session_destroy(se);
        return 0;
}

/* Whether the mount table MOUNTINFO (a /proc/.../mountinfo) has a mount on MNT: 1 (its type in TYPE),
 * 0, or -errno when it cannot be read. Mount points are written with octal escapes. */
static int mount_at(const char *mountinfo, const char *mnt, char *type, size_t type_len)
{
        FILE *f = fopen(mountinfo, "r");
        if (!f)
                return -errno;
        char line[8192];
        int found = 0;
        while (!found && fgets(line, sizeof(line), f)) {
                char point[PATH_MAX], t[256] = "?";
                /* id parent major:minor root MOUNTPOINT options ... - TYPE source ... */
                if (sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1)
                        continue;
                char *dash = strstr(line, " - ");
                if (dash)
                        sscanf(dash + 3, "%255s", t);
                char un[PATH_MAX];
                size_t j = 0;
                for (size_t i = 0; point[i] && j + 1 < sizeof(un); i++) {
                        if (point[i] == '\\' && point[i + 1] && point[i + 2] && point[i + 3]) {
                                un[j++] = (char)((point[i + 1] - '0') * 64 + (point[i + 2] - '0') * 8 + (point[i + 3] - '0'));
                                i += 3;
                        } else {
                                un[j++] = point[i];
                        }
                }
                un[j] = '\0';
                if (!strcmp(un, mnt)) {
                        found = 1;
                        snprintf(type, type_len, "%s", t);
                }
        }
        fclose(f);
        return found;
}

/* A mount point that has a mount already would hide it: refused (mountinfo, which names it exactly). */
static int check_not_mounted(const char *mnt)
{
        char type[256];
        if (mount_at("/proc/self/mountinfo", mnt, type, sizeof(type)) == 1)
                return fail("the mount point '%s' has a mount already (%s): unmount it first, or choose another",
                            mnt, type);
        return 0;
}

/* Whether the daemon whose lock text is LOCK has stopped serving: it said so, or it said it was mounted
 * and its mount is gone from its own mount table (fusermount3 -u returns before the daemon notices). */
static bool holder_stopping(const char *lock)
{
        if (strstr(lock, " stopping\n"))
                return true;
        const char *nl = strchr(lock, '\n');
        if (!strstr(lock, " mounted\n") || !nl)
                return false;
        char mnt[PATH_MAX], type[256], path[64];
        snprintf(mnt, sizeof(mnt), "%.*s", (int)strcspn(nl + 1, "\n"), nl + 1);
        snprintf(path, sizeof(path), "/proc/%ld/mountinfo", strtol(lock, NULL, 10));
        return *mnt && mount_at(path, mnt, type, sizeof(type)) == 0;
}

/* Creates the default metadata directory and takes the index lock. Returns the lock fd. */
static int take_index_lock(struct kfs_opts *o, int *ret_fd)
{
        if (!o->index_path) {
                char *meta;
                if (asprintf(&meta, "%s/%s", o->backing, KFS_META_DIR) < 0)
                        return fail("out of memory");
                if (mkdir(meta, 0700) < 0 && errno != EEXIST) {
                        int e = errno;
                        free(meta);
                        return fail("cannot create the index directory in '%s': %s", o->backing, strerror(e));
                }
                warn_network_fs(meta);
                if (asprintf(&o->index_path, "%s/index.db", meta) < 0)
                        o->index_path = NULL;
                free(meta);
                if (!o->index_path)
                        return fail("out of memory");
        }
        char lock[PATH_MAX];
        snprintf(lock, sizeof(lock), "%s.lock", o->index_path);
        int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
                return fail("cannot write the index at '%s': %s", o->index_path, strerror(errno));
        /* A remount right after fusermount3 -u waits, bounded, for the daemon that is stopping (unmounted,
         * flushing its index) instead of failing 1 time in 10: that daemon says so in the lock file, or,
         * before it has noticed, its mount is gone from its mount table (holder_stopping). */
        int waited_ms = 0;
        while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                char pid[PATH_MAX + 64] = "";
                ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
                pid[n > 0 ? n : 0] = '\0';
                bool stopping = holder_stopping(pid);
                pid[strcspn(pid, " \n")] = '\0';
                if (stopping && waited_ms < LOCK_WAIT_MS) {
                        if (waited_ms == 1000)
                                kfs_log(LOG_NOTICE, "waiting for kcachefs (pid %s) to finish stopping", pid);
                        usleep(20000);
                        waited_ms += 20;
                        continue;
                }
                close(fd);
                if (stopping)
                        return fail("the index '%s' is still held by kcachefs (pid %s), which has been stopping for "
                                    "%d s; try again once it has exited", o->index_path, pid, LOCK_WAIT_MS / 1000);
                return fail("the index '%s' is in use by another kcachefs%s%s%s; two daemons must never share "
                            "one index", o->index_path, *pid ? " (pid " : "", pid, *pid ? ")" : "");
        }
        char pid[32];
        int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
        if (pwrite(fd, pid, (size_t)n, 0) < 0 || ftruncate(fd, n) < 0)
                return fail("cannot write the index lock '%s': %s", lock, strerror(errno));
        *ret_fd = fd;
        return 0;
}

/* Only root and the daemon's user may reach the backing directory, and the index when it lies outside it,
 * by their paths (reach.c says why and how). Last of the checks: -o tighten may change a directory, and
 * bad input must change nothing. */
static int check_reach(const struct kfs_opts *o)
{
        char *note = NULL, *why = NULL;
        const char *shared = o->allow_other ? o->mountpoint : NULL;
        int r = kfs_reach_check("backing directory", o->backing, false, geteuid(), o->tighten, shared, &note, &why);
        if (r == 0 && o->index_path) {
                char *dir = strdup(o->index_path), *slash = dir ? strrchr(dir, '/') : NULL;
                if (!slash) {
                        free(dir);
                        return fail("out of memory");
                }
                slash[slash == dir] = '\0'; /* "/x.db": "/" */
                if (note)
                        kfs_log(LOG_NOTICE, "%s", note);
                free(note);
                note = NULL;
                r = kfs_reach_check("index directory", dir, true, geteuid(), o->tighten, shared, &note, &why);
                free(dir);
        }
        if (r < 0)
                fail("%s", why ? why : strerror(-r));
        else if (note)
                kfs_log(LOG_NOTICE, "%s", note);
        free(note);
        free(why);
        return r < 0;
}

/* Forks; the parent waits for the child's verdict on a pipe and exits with it. Returns the write end. */
static int detach(void)
{
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid > 0) {
                close(p[1]);
                char c;
                if (read(p[0], &c, 1) == 1 && c == 0)
                        _exit(0);
                int status;
                if (waitpid(pid, &status, 0) == pid && WIFEXITED(status))
                        _exit(WEXITSTATUS(status) ? WEXITSTATUS(status) : 1);
                _exit(1);
        }
        close(p[0]);
        setsid();
        return p[1];
}

/* Where messages go once the daemon serves (log.c): the -o log= file, opened before detaching (LOG_FD),
 * or the journal (with MOUNT=), or syslog, or, where neither socket answers, a file in the index's
 * directory: BACKING_DIR/.kcachefs/kcachefs.log through the tree door, or with -o index= elsewhere
 * INDEX.log beside it (such a backing directory gets no .kcachefs of ours). The environment's
 * KCACHEFS_SYSLOG_SOCKET and KCACHEFS_JOURNAL_SOCKET (for tests only) are the sockets looked for instead of
 * /dev/log and /run/systemd/journal/socket. The first message names where they go. */
static void start_log(struct kfs *fs, bool own_meta, int log_fd, struct kfs_log **log)
{
        char note[2 * PATH_MAX], path[PATH_MAX + 8];
        const char *sock = getenv("KCACHEFS_SYSLOG_SOCKET");
        sock = sock && *sock ? sock : _PATH_LOG;
        bool journal = log_fd < 0 && kfs_log_journal_answers();
        if (log_fd < 0 && !journal && !kfs_log_syslog_answers(sock)) {
                if (own_meta) {
                        snprintf(path, sizeof(path), "%s/%s/kcachefs.log", fs->o.backing, KFS_META_DIR);
                        int r = ktree_mkdir(&fs->tree, KTREE_ROOT, KFS_META_DIR, 0700);
                        log_fd = r == 0 || r == -EEXIST
                                 ? ktree_open_file(&fs->tree, KTREE_ROOT, KFS_META_DIR "/kcachefs.log",
                                                   O_WRONLY | O_APPEND | O_CREAT, 0600) : r;
                } else { /* outside the backing tree, as the index itself is opened */
                        snprintf(path, sizeof(path), "%s.log", fs->o.index_path);
                        log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
                        log_fd = log_fd < 0 ? -errno : log_fd;
                }
                if (log_fd < 0) { /* said on stderr, whatever that is now */
                        kfs_log(LOG_WARNING, "no syslog at %s, and %s cannot be written (%s): messages are lost",
                                sock, path, strerror(-log_fd));
                        return;
                }
                snprintf(note, sizeof(note), "messages go to %s (no syslog at %s; -o log=FILE chooses another "
                         "file)", path, sock);
        } else {
                snprintf(note, sizeof(note), "messages go to %s", log_fd >= 0 ? fs->o.log_path
                                                                   : journal ? "the journal" : "syslog");
        }
        snprintf(fs->log_to, sizeof(fs->log_to), "%s", log_fd >= 0 && !fs->o.log_path ? path
                 : log_fd >= 0 ? fs->o.log_path : journal ? "the journal" : "syslog");
        int r = kfs_log_start(log_fd, journal ? fs->o.mountpoint : NULL, note, log);
        if (r < 0)
                kfs_log(LOG_WARNING, "cannot start the log: %s", strerror(-r));
}

/* The mount just made, as the helpers reach it later (kfs.h: mount_dir, mount_name, mount_dev): the mount
 * point's directory, held from now on, so that a user who renames a directory above it changes nothing
 * for them, and the device, which the mount point holds now (fuse_session_mount just returned). DONT_SYNC:
 * the device is the superblock's, and nothing is asked of the daemon, which does not serve yet. */
static void hold_mount(struct kfs *fs)
{
        const char *slash = strrchr(fs->o.mountpoint, '/'); /* an absolute path (check_dir's realpath) */
        fs->mount_name = slash && slash[1] ? slash + 1 : fs->o.mountpoint;
        char *dir = slash ? strndup(fs->o.mountpoint, slash == fs->o.mountpoint ? 1 : (size_t)(slash - fs->o.mountpoint))
                          : NULL;
        fs->mount_dir = dir ? open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
        free(dir);
        struct statx sx;
        if (fs->mount_dir >= 0 && statx(fs->mount_dir, fs->mount_name, AT_STATX_DONT_SYNC | AT_SYMLINK_NOFOLLOW,
                                        STATX_TYPE, &sx) == 0)
                fs->mount_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
}

/* The parent learns that the daemon serves, and the daemon lets go of the terminal. */
static void detached_ready(int fd, bool logging)
{
        if (fd < 0)
                return;
        if (chdir("/") < 0) {
                /* the mount works regardless */
        }
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
                if (!logging) /* else stderr is the log's pipe (start_log) */
                        dup2(null, 2);
                if (null > 2)
                        close(null);
        }
        char ok = 0;
        if (write(fd, &ok, 1) != 1) {
                /* the parent is gone: nobody to tell */
        }
        close(fd);
}

/* -o log=FILE: its directory must exist, and it must lie outside the backing directory (where the cache
 * would count it) and the mount point. Opened before anything is made, so that a mistake is said on the
 * terminal. *RET_FD: the file, appended to.
 * The directory may be one others write into (a sticky /tmp), where another user may have made the name
 * first: the daemon, often root, reaches the directory by a walk nobody else can redirect
 * (ktree_chase_dir), opens the name beneath it following no symlink, never blocks on a FIFO
 * (O_NONBLOCK), and appends only to a file of its own user or root with no other name (a file of hers
 * she would read and forge; a hard link, a file of root's elsewhere), whatever fs.protected_* say. */
static int open_log_file(struct kfs_opts *o, int *ret_fd)
{
        char *copy = strdup(o->log_path), *slash = copy ? strrchr(copy, '/') : NULL, *rdir = NULL;
        if (!copy)
                return fail("out of memory");
        const char *dir = slash ? (slash == copy ? "/" : (*slash = '\0', copy)) : ".";
        int r = check_dir("log directory", dir, &rdir, true);
        if (r == 0 && (path_within(rdir, o->mountpoint) || path_within(rdir, o->backing)))
                r = fail("the log '%s' is inside the %s", o->log_path,
                         path_within(rdir, o->mountpoint) ? "mount point" : "backing directory, where the cache would count it");
        char why[PATH_MAX + 200];
        struct ktree lt = { .root = -1 };
        int dfd = r == 0 ? ktree_chase_dir(dir, geteuid(), why, sizeof(why)) : -1; /* a way nobody else redirects */
        if (r == 0 && dfd < 0)
                r = fail("the log '%s': %s", o->log_path, why);
        else if (r == 0 && (r = ktree_init_fd(&lt, dfd)) < 0) {
                close(dfd);
                r = fail("the log '%s': %s", o->log_path, strerror(-r));
        }
        if (r == 0) {
                const char *base = slash ? slash + 1 : copy;
                int fd = ktree_open(&lt, KTREE_ROOT, base, O_WRONLY | O_APPEND | O_CREAT | O_NOCTTY | O_NONBLOCK, 0640);
                struct stat st;
                if (fd >= 0 && fstat(fd, &st) < 0) {
                        close(fd);
                        fd = -errno;
                }
                if (fd < 0 || !S_ISREG(st.st_mode)) {
                        int e = fd < 0 ? -fd : EINVAL;
                        if (fd >= 0)
                                close(fd);
                        r = fail("cannot write the log '%s': %s", o->log_path,
                                 e == EINVAL || e == ENXIO ? "not a regular file"
                                 : e == ELOOP ? "it is a symbolic link (name the file itself)" : strerror(e));
                } else if ((st.st_uid != geteuid() && st.st_uid != 0) || st.st_nlink != 1) {
                        close(fd);
                        r = fail("the log '%s' %s: another user may have made it; remove it, or put the log in a "
                                 "directory that only root writes", o->log_path,
                                 st.st_nlink != 1 ? "has other names (hard links)" : "belongs to another user");
                } else {
                        (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
                        *ret_fd = fd;
                }
        }
        ktree_close(&lt);
        free(rdir);
        free(copy);
        return r;
}

/* The inodes' fds are a bounded set sized from this limit (inode.c, DESCRIPTORS): allow as many as
 * possible. Root may raise the hard limit too, up to fs.nr_open; others get their hard limit. */
static void raise_fd_limit(void)
{
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
                return;
        FILE *f = geteuid() == 0 ? fopen("/proc/sys/fs/nr_open", "r") : NULL;
        unsigned long long nr = 0;
        if (f) {
                if (fscanf(f, "%llu", &nr) != 1)
                        nr = 0;
                fclose(f);
        }
        if (nr > rl.rlim_max) {
                struct rlimit up = { (rlim_t)nr, (rlim_t)nr };
                if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                        return;
        }
        if (rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
}

/* The kernel grows a process's fd table by doubling it, and in a threaded process each doubling waits
 * for an RCU grace period (expand_fdtable's synchronize_rcu: about 10 ms here) while every other thread
 * that opens an fd meanwhile waits too. In bench/big, creates and renames of a writer stalled 10-16 ms
 * when the daemon's fds reached 64, 128, 256 and 512 during the first eviction after a mount. So the
 * table is sized once, before the threads start, for the inodes the kernel may ask about (one O_PATH fd
 * each) with room to grow: 8 bytes of kernel memory per slot, 8 MiB at most (1M slots; later doublings
 * then cost their 10 ms once each). */
static void presize_fd_table(int fd, uint64_t files)
{
        struct rlimit rl;
        uint64_t want = files + files / 8 + 1024, cap = 1u << 20;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < cap)
                cap = rl.rlim_cur;
        if (want > cap)
                want = cap;
        int high = want > 64 ? fcntl(fd, F_DUPFD_CLOEXEC, (int)want - 1) : -1;
        if (high >= 0)
                close(high); /* the table keeps its size */
}

static int init_root(struct kfs *fs)
{
        raise_fd_limit();
        struct stat st;
        int r = ktree_init(&fs->tree, fs->o.backing);
        if (r < 0)
                return fail("cannot open the backing directory '%s': %s", fs->o.backing, strerror(-r));
        kfs_settle_init(fs);
        fs->root.fd = ktree_open(&fs->tree, KTREE_ROOT, ".", O_PATH | O_DIRECTORY, 0);
        fs->dead_fd = memfd_create("kcachefs-evicted", MFD_CLOEXEC);
        if (fs->dead_fd < 0)
                return fail("cannot create a memfd: %s", strerror(errno));
        if (fs->root.fd < 0 || fstat(fs->tree.root, &st) < 0)
                return fail("cannot open the backing directory '%s': %s", fs->o.backing,
                            strerror(fs->root.fd < 0 ? -fs->root.fd : errno));
        fs->root.bino = st.st_ino;
        fs->root.type = S_IFDIR;
        fs->root.nlookup = 1;
        pthread_mutex_init(&fs->root.lock, NULL);
        pthread_mutex_init(&fs->itable_lock, NULL);
        for (size_t i = 0; i < KFS_NAME_LOCKS; i++)
                pthread_mutex_init(&fs->name_locks[i], NULL);
        pthread_mutex_init(&fs->settle.lock, NULL);
        pthread_cond_init(&fs->settle.cond, NULL);
        kmap_init(&fs->settle.queue);
        pthread_mutex_init(&fs->flock.lock, NULL);
        pthread_mutex_init(&fs->kprune.lock, NULL);
        pthread_cond_init(&fs->kprune.cond, NULL);
        pthread_cond_init(&fs->flock.cond, NULL);
        kmap_init(&fs->itable);
        kmap_init(&fs->detached);
        kmap_init(&fs->named_gone);
        if (kmap_put(&fs->itable, fs->root.bino, &fs->root) < 0 || kev_init(fs) < 0)
                return fail("out of memory");
        return 0;
}

int main(int argc, char *argv[])
{
        struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
        struct fuse_cmdline_opts cmd = { 0 };
        struct kfs fs = { .tree.root = -1, .root.fd = -1, .dead_fd = -1, .mount_dir = -1 };
        int lock_fd = -1, ready_fd = -1, log_fd = -1, ret = 1;
        bool served = false;
        struct kfs_log *log = NULL;

        if (argc == 3 && !strcmp(argv[1], "--refresh-child"))
                return kfs_refresh_child(argv[2]); /* exec'd by the daemon (refresh.c) */
        if (argc == 5 && !strcmp(argv[1], "--nudge"))
                return kfs_ring_nudge_child(argv[2], argv[3], argv[4]); /* spawned by a ring's nudge (ring.c) */
        kfs_log_init();
        kfs_thread_init(); /* the CPUs the daemon's later threads run on (thread.c) */
        fs.o.timeout = DEFAULT_TIMEOUT;
        fs.o.tmp_age = 3600;
        fs.o.grace_ms = 2000;
        fs.o.flush_ms = 1000;
        fs.o.remote_timeout_ms = DEFAULT_REMOTE_TIMEOUT_MS;
        fs.o.remote_negative_s = DEFAULT_REMOTE_NEGATIVE_S;
        fs.o.remote_touch_s = 60;
        fs.o.herd_wait = 0;
        fs.o.low_watermark = DEFAULT_LOW_WATERMARK;
        if (kfs_opts_parse(&args, &fs.o) < 0)
                return fail("invalid options (see --help)");
        if (fs.o.show_help) {
                usage(argv[0]);
                ret = 0;
                goto out_args;
        }
        if (fs.o.show_version) {
                printf("kcachefs version %s\nFUSE library version %s\n", KFS_VERSION, fuse_pkgversion());
                fflush(stdout); /* fuse_lowlevel_version() runs fusermount3, which writes on its own */
                fuse_lowlevel_version();
                ret = 0;
                goto out_args;
        }
        char cfg_why[600];
        if (kfs_settings_init(&fs) < 0) {
                fail("out of memory");
                goto out_args;
        }
        /* One operand with a settings file: it is the mount point, and the file says the backing directory
         * (backing = PATH; the systemd unit's way). libfuse gets the mount point as its operand. */
        bool lone = fs.o.config_path && fs.o.backing && !fs.o.mountpoint_arg;
        if (lone) {
                fs.o.mountpoint_arg = fs.o.backing;
                fs.o.backing = NULL;
        }
        if (fs.o.config_path && kfs_settings_file(&fs.o, fs.o.config_path, cfg_why, sizeof(cfg_why)) < 0) {
                fail("%s", cfg_why);
                goto out_args;
        }
        if (lone && fuse_opt_add_arg(&args, fs.o.mountpoint_arg) < 0) {
                fail("out of memory");
                goto out_args;
        }
        snprintf(fs.log_to, sizeof(fs.log_to), "stderr");
        /* The mount point first, in our words: libfuse's parser says it its own way, and then we would
         * add a misleading second line. */
        if (fs.o.mountpoint_arg && check_dir("mount point", fs.o.mountpoint_arg, &fs.o.mountpoint, false))
                goto out_args;
        if (fuse_parse_cmdline(&args, &cmd) != 0) {
                fail("invalid options (see --help)");
                goto out_args;
        }
        /* A shared mount: the daemon checks no permission itself (it serves every request as root), so the
         * kernel must (default_permissions). Every mount, shared or not, is nosuid,nodev: a cache holds no
         * setuid program or device node for anyone (mount(8) passes "suid,dev" for fstab's "defaults"). Added
         * last: libfuse takes the last of suid/nosuid and of dev/nodev. */
        if ((fs.o.allow_other && !fs.o.default_permissions && fuse_opt_add_arg(&args, "-odefault_permissions") < 0) ||
            fuse_opt_add_arg(&args, "-onosuid,nodev") < 0) {
                fail("out of memory");
                goto out_args;
        }
        if (check_opts(&fs.o, cmd.mountpoint) || add_source(&args, fs.o.backing) || check_fuse_opts(&args) ||
            check_not_mounted(fs.o.mountpoint) || check_reach(&fs.o) ||
            (fs.o.log_path && open_log_file(&fs.o, &log_fd)) || kfs_remote_init(&fs) < 0)
                goto out_args;
        if (fs.o.allow_other && !fs.o.default_permissions)
                kfs_log(LOG_NOTICE, "allow_other: default_permissions added: kcachefs checks no permissions "
                                    "itself, so the kernel must");

        if (!cmd.foreground && (ready_fd = detach()) < 0) {
                fail("cannot detach: %s", strerror(-ready_fd));
                goto out_args;
        }
        bool own_meta = !fs.o.index_path; /* the index in BACKING_DIR/.kcachefs (take_index_lock) */
        if (take_index_lock(&fs.o, &lock_fd) || init_root(&fs))
                goto out_fs;
        kev_marks_load(&fs); /* the directories kcache env made for a runtime (evict/marks.c) */

        enum kidx_rebuild_reason why;
        struct kidx_open_opts io = {
                .db_path = fs.o.index_path,
                .backing_fd = fs.tree.root,
                .skip_name = KFS_META_DIR,
                .progress = isatty(STDERR_FILENO),
                .force_rebuild = fs.o.rebuild,
        };
        int r = kidx_open(&io, &fs.idx, &why);
        if (r < 0) {
                fail("cannot open the index '%s': %s", fs.o.index_path, strerror(-r));
                goto out_fs;
        }
        if (why != KIDX_NO_REBUILD && (why != KIDX_REBUILD_NEW || cmd.foreground)) {
                struct kidx_stats s;
                kidx_get_stats(fs.idx, &s);
                kfs_log(LOG_NOTICE, "index rebuilt (%s): %llu files, %llu bytes", kidx_rebuild_reason_str(why),
                        (unsigned long long)s.files, (unsigned long long)s.used_bytes);
        }
        kfs_users_check(&fs); /* before the kernel knows a name: what claims users/ wrongly (users.c, U2) */
        struct kidx_stats ks;
        kidx_get_stats(fs.idx, &ks);
        kfs_inode_fds_init(&fs, ks.files);
        presize_fd_table(fs.tree.root, ks.files < fs.fdc.cap ? ks.files : fs.fdc.cap);
        fs.owner = getuid();
        /* New objects get the caller's mode under the caller's umask (kfs_req_mode), never ours on top.
         * Everything the daemon makes for itself was made above, or is made by SQLite with 0644. */
        umask(0);

        fs.direct = !cmd.debug && !libfuse_own(&args); /* (direct.c); before the session takes its options */
        fs.se = fuse_session_new(&args, &kfs_ops, sizeof(kfs_ops), &fs);
        if (!fs.se)
                goto out_idx;
        if (fuse_set_signal_handlers(fs.se) != 0)
                goto out_session;
        if ((r = kfs_settings_start(&fs)) < 0) { /* SIGHUP: re-read the settings file, not unmount */
                fail("cannot start: %s", strerror(-r));
                goto out_signals;
        }
        fs.singlethread = cmd.singlethread;
        kfs_ring_prepare(&fs);
        if (fuse_session_mount(fs.se, fs.o.mountpoint) != 0)
                goto out_signals;
        mark_lock(lock_fd, "mounted", fs.o.mountpoint);
        hold_mount(&fs);
        kfs_pt_setup(&fs);
        kfs_dev_setup(&fs);
        kfs_refresh_setup(&fs);
        if ((r = kidx_mark_dirty(fs.idx)) < 0 || (r = kidx_start_writer(fs.idx, fs.o.flush_ms)) < 0) {
                fail("cannot start: %s", strerror(-r));
                goto out_unmount;
        }
        /* In the foreground the terminal, or systemd's journal stream, keeps the messages; under systemd
         * they go to the journal itself where it answers, with their mount named (MOUNT=). */
        if (!cmd.foreground || log_fd >= 0 || (kfs_log_journal_stream() && kfs_log_journal_answers()))
                start_log(&fs, own_meta, log_fd, &log);
        log_fd = -1;
        detached_ready(ready_fd, log != NULL);
        ready_fd = -1;
        served = true;
        sd_notify(0, "READY=1"); /* Type=notify: systemd starts what needs the mount now */
        kfs_log(LOG_INFO, "mounted %s on %s (max_size %llu bytes, %llu files, %llu bytes used)",
                fs.o.backing, fs.o.mountpoint, (unsigned long long)fs.o.max_size, (unsigned long long)ks.files,
                (unsigned long long)kidx_used(fs.idx));
        kev_start(&fs);
        kfs_remote_start(&fs);

        if (cmd.singlethread) {
                ret = fuse_session_loop(fs.se);
        } else {
                struct fuse_loop_config *lc = fuse_loop_cfg_create();
                fuse_loop_cfg_set_clone_fd(lc, cmd.clone_fd);
                if (cmd.max_idle_threads != UINT_MAX) /* UINT_MAX: not given */
                        fuse_loop_cfg_set_idle_threads(lc, cmd.max_idle_threads);
                /* As many workers as CPUs, started as needed and kept. More only fight over the FUSE
                 * queue's lock and the CPUs: 8 concurrent readers on 2 CPUs take 0.49 s with 2 workers,
                 * 0.62 s with libfuse's default (workers without limit, never stopped: 9 after a while),
                 * and letting the extra ones go again (max_idle_threads) costs a thread start per burst.
                 * The price: a handler that waits (an fsync, the disk's writeback, another writer's
                 * eviction) holds its worker, so on a small machine a few of them delay everything
                 * else meanwhile; -o max_threads=N sets the number. flock() waits use threads of their
                 * own (flock.c). libfuse's defaults (10, unset) mean not given. */
                long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
                unsigned workers = ncpu < 2 ? 2 : ncpu > 256 ? 256 : (unsigned)ncpu;
                bool given = cmd.max_threads != UINT_MAX && cmd.max_threads != 0 && cmd.max_threads != 10;
                fuse_loop_cfg_set_max_threads(lc, given ? cmd.max_threads : workers);
                if (cmd.max_idle_threads == UINT_MAX)
                        fuse_loop_cfg_set_idle_threads(lc, given ? cmd.max_threads : workers);
                ret = fuse_session_loop_mt(fs.se, lc);
                fuse_loop_cfg_destroy(lc);
        }
        ret = ret < 0 ? 1 : 0;
        mark_lock(lock_fd, "stopping", NULL);
        sd_notify(0, "STOPPING=1");
out_unmount:
        kfs_refresh_close(&fs); /* no more notifications: the session goes below */
        kfs_remote_stop(&fs); /* its publisher reads the tree through the index's names */
        kfs_settle_stop(&fs); /* its last measurements reach the index, which closes below */
        kev_stop(&fs);
        kfs_kprune_stop(&fs);
        kfs_flock_stop(&fs); /* its waiters' replies may go through the rings */
        kfs_ring_stop(&fs);
        kev_reap_stop(&fs); /* after the last request: none can evict any more */
        fuse_session_unmount(fs.se);
out_signals:
        kfs_settings_stop(&fs);
        fuse_remove_signal_handlers(fs.se);
out_session:
        fuse_session_destroy(fs.se);
        kfs_refresh_stop(&fs); /* its child's last request ended with the connection */
        kfs_ring_free(&fs); /* so did its nudges' */
out_idx:
        /* Clean only after serving: a failed start leaves the flag as kidx_open found it. */
        kidx_close(fs.idx, ret == 0);
        if (served)
                kfs_log(LOG_INFO, "unmounted %s; the index is %s", fs.o.mountpoint,
                        ret == 0 ? "flushed and marked clean" : "left to be reconciled at the next mount");
out_fs:
        kev_free(&fs);
        kfs_remote_free(&fs);
        kfs_inode_table_free(&fs);
        if (fs.tree.root >= 0)
                close(fs.tree.root);
        if (fs.root.fd >= 0)
                close(fs.root.fd);
        if (fs.dead_fd >= 0)
                close(fs.dead_fd);
        if (lock_fd >= 0)
                close(lock_fd);
out_args:
        kfs_remote_free(&fs); /* where it was made and the start failed before out_fs */
        kfs_settings_free(&fs);
        if (log_fd >= 0)
                close(log_fd);
        kfs_free_opts(&fs.o);
        free(cmd.mountpoint);
        fuse_opt_free_args(&args);
        kfs_log_finish(log);
        return ret;
}
