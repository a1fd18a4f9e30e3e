/* kfs.h: the daemon's state and the functions its files share.
 *
 * The daemon is one struct kfs, reached from every request through fuse_req_userdata(); there are no
 * mutable globals. Each file of fs/ covers one concern:
 *   main.c      options, checks, start-up and shutdown
 *   options.c   parsing of kcachefs's own -o options and sizes
 *   inode.c     the inode table: one O_PATH fd per backing inode, lookup counts, open counts
 *   ops-entry.c lookup, getattr, setattr, readdir, and the namespace operations
 *   ops-io.c    create, open, read, write, fallocate, lseek, flush, fsync, release
 *   ops-xattr.c extended attributes, passed through
 *   control.c   the user.kcachefs.* attributes: per-file log, totals, pin, evict (kcache uses them)
 *   settings.c  the settings file (-o config=), the settings shown (kcache config) and changed live
 *               (kcache set, SIGHUP)
 *   evict/      space reservation and eviction: its own folder, entered through evict/evict.h only (the
 *               design essay, the folder's map and the daemon's lock order are there)
 *   settle.c    written files measured again after writeback (delayed allocation)
 *   log.c       the daemon's messages, with their priority: stderr, syslog or a file
 *   passthrough.c kernel passthrough for read-only opens: backing files, I/O modes
 *   devio.c     our own /dev/fuse I/O: INIT's negotiation, and where each reply goes
 *   fuse-kernel.h the kernel protocol's parts that Debian 12's headers and libfuse predate
 *   ring.c      FUSE over io_uring: per-CPU queues served by pinned threads
 *   refresh.c   the kernel's attributes fetched anew after a release, by a child process
 *   spawn.c     the daemon's helper processes (refresh.c's child, ring.c's nudges)
 *   thread.c    the threads started while serving, on every CPU the daemon started with
 *   ops.c       the fuse_lowlevel_ops table
 *
 * LOCK ORDER. Every mutex of the daemon's, written here once. A thread that holds one may take only those
 * below it:
 *   ev->evict_lock      one eviction at a time (evict/). The repairer takes it while it holds NEO's
 *                       config.file flock, a file lock that no thread holding a mutex of ours waits for
 *   inode->lock         one inode's size, page-cache state and I/O mode (evict/space.c, passthrough.c)
 *   fs->settle.lock     the files to measure after writeback (settle.c)
 *   fs->itable_lock     the inode table and the open counts. Reopening an inode's fd by name takes it
 *                       (inode.c), and that happens under inode->lock, so nothing that holds it takes an
 *                       inode's lock: it holds a lookup reference instead (evict/repair.c)
 *   fs->name_locks[]    two at most, in a fixed order (kfs_names_lock), around a check and a removal, or
 *                       a rename
 *   ev->space_lock      reservations and the background descent's state (evict/space.c)
 *   the index's locks   db_lock before batch_lock, and rd_lock (index/kidx-internal.h)
 * and these leaves, under which no other lock is ever taken: fs->fdc.lock (inode.c), ev->reap.lock
 * (evict/reap.c), ev->miss.lock (evict/misses.c), fs->flock.lock (flock.c), fs->pt.lock
 * (passthrough.c), fs->refresh.lock (refresh.c), each ring's and its nudge_lock (ring.c).
 * No lock of ours is held while a reply is sent or while the kernel is notified, and the daemon only sends
 * notifications that take no lock in the kernel (evict/evict.h, TELLING THE KERNEL). One exception: an
 * evicted file's attributes are dropped under evict_lock, before the runtime's own lock is let go
 * (evict/remove.c, kev_notify_gone): for a closed inode on a mount without writeback cache, nothing the
 * kernel does for it waits for the daemon. */
#pragma once

#define KFS_NAME_LOCKS 64
#define KFS_KPATH_MAX 3968 /* the longest path refresh.c sends its child (kfs_inode_path_locked) */
#define KFS_OPCODES 64 /* FUSE opcodes counted one by one (kfs_count_request); the last counts any higher
                          one, the one before it the daemon's own child's (KFS_OPCODE_OWN) */

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <syslog.h>

#include "../common/kmap.h"
#include "../common/runtimes.h"
#include "../common/tree.h"
#include "../index/kidx.h"
#include "evict/evict.h"

#define KFS_VERSION "0.1.0"
/* The metadata directory in the backing root: holds the default index, never visible in the mount. */
/* The runtimes' own records of their cache's size, which eviction repairs (evict/repair.c). */
#define KFS_NEO_SIZE_FILE "config.file"     /* NEO: one native size_t, under its flock */
#define KFS_SYCL_SIZE_FILE "cache_size.txt" /* SYCL: decimal bytes, under cache_size.txt.lock */
#define KFS_SYCL_SIZE_LOCK KFS_SYCL_SIZE_FILE ".lock"
#define KFS_JAX_LOCK ".lockfile"                /* JAX (py-filelock): flock, around every get and put */

#define KFS_META_DIR ".kcachefs"
/* The container of the users' own directories on a shared mount, users/<uid> (users.c). */
#define KFS_USERS_DIR "users"

enum kfs_protect { KFS_PROTECT_OPEN = 0, KFS_PROTECT_WRITERS = 1 };

/* A runtime forced for a directory by -o layout= (evict/units.c). */

struct kfs_layout {
        char *dir;                /* relative to the cache root; "" for the whole mount */
        enum krt rt;
};

struct kfs_opts {
        char *backing;            /* absolute, resolved */
        char *mountpoint;         /* absolute, resolved */
        char *mountpoint_arg;     /* the mount point as given */
        char *index_path;         /* -o index=; NULL: <backing>/.kcachefs/index.db */
        char *max_size_str;       /* -o max_size= as given */
        char *low_watermark_str;  /* -o low_watermark= as given */
        char *pin_str;            /* -o pin=GLOB:GLOB... */
        char *protect_str;        /* -o protect=open|writers */
        uint64_t max_size;        /* bytes */
        unsigned low_watermark;   /* percent of max_size that eviction goes down to */
        enum kfs_protect protect;
        double timeout;           /* entry/attr/negative cache timeout, seconds */
        unsigned flush_ms;        /* index batch interval */
        int nolog;                /* debug: no access log (for measuring its cost) */
        int nopassthrough;        /* never use kernel passthrough (passthrough.c) */
        int nouring;              /* never use FUSE over io_uring (ring.c) */
        int norefresh;            /* only drop the kernel's attributes at RELEASE, never refresh them
                                     (refresh.c) */
        int rebuild;              /* reconcile the index at mount even after a clean stop */
        int stale_locks;          /* a lock file whose creator has exited is removed when looked up
                                     (ops-entry.c, STALE LOCKS) */
        char **pins;              /* parsed pin patterns, NULL-terminated */
        char *layout_str;         /* -o layout= */
        struct kfs_layout *layouts;
        size_t nlayouts;
        double tmp_age;           /* seconds after which a runtime's temporary file counts as leaked */
        unsigned grace_ms;        /* files accessed this recently are never evicted */
        unsigned inode_fds;       /* -o inode_fds=: idle inodes' descriptors kept open; 0: half RLIMIT_NOFILE */
        char *timeout_str, *tmp_age_str, *grace_ms_str, *flush_ms_str, *inode_fds_str; /* as given, or NULL:
                                     read into the fields above by kfs_opts_check(), which checks their range */
        char *log_path;           /* -o log=FILE: messages appended there (log.c); NULL: syslog or the fallback */
        char *config_path;        /* -o config=FILE: the settings file (settings.c), re-read at SIGHUP; or NULL */
        int tighten;              /* -o tighten: close the backing's parent to others where safe (reach.c) */
        int allow_other;          /* -o allow_other given: a shared mount (kept for libfuse) */
        int default_permissions;  /* -o default_permissions given (kept for libfuse) */
        char *remote_url;         /* -o remote=: the shared tier (remote/remote.h), or NULL */
        char *remote_auth;        /* -o remote_auth=FILE: its password, or user and password */
        char *remote_publish;     /* -o remote_publish=NAME: units go to publisher NAME's namespace */
        char *remote_publisher;   /* -o remote_publisher=USER|UID: whose units remote_publish= takes (the mounter's) */
        char *remote_trusted;     /* -o remote_trusted=NAME[:NAME...]: publishers' namespaces read, in order */
        unsigned remote_timeout_ms; /* a lookup's deadline for the server */
        double remote_negative_s; /* a miss of the server remembered this long */
        double remote_touch_s;    /* units in use told to the server this often */
        double herd_wait;         /* a lookup waits this long for a compile elsewhere; 0: never */
        char *remote_timeout_ms_str, *remote_negative_s_str, *remote_touch_s_str, *herd_wait_str; /* as given,
                                     or NULL: read into the four above by kfs_opts_check(), range checked */
        int show_help, show_version;
};

struct kfs_inode {
        int fd;                   /* O_PATH|O_NOFOLLOW on the backing inode while open, else -1: borrow it
                                     with kfs_inode_fd() (inode.c, DESCRIPTORS); fs->fdc.lock */
        struct file_handle *fh;   /* reopens fd (open_by_handle_at); NULL: see up; immutable */
        struct kfs_inode *up;     /* without file handles: the directory where the inode was last seen,
                                     which reopens fd with name (NULL for the root, or where neither
                                     reopens it: fd stays open); holds a reference to it; itable_lock */
        char *name;               /* its name in up; itable_lock */
        bool name_lost;           /* up and name went with that link, and it has others: it reopens by the
                                     index's names (inode.c); itable_lock */
        uint32_t fd_users;        /* borrowers of fd, which is not closed while they hold it; fs->fdc.lock */
        struct kfs_inode *idle_prev, *idle_next; /* fs->fdc's idle list: fd open, no borrower; fs->fdc.lock */
        uint64_t bino;            /* backing st_ino: the table key and the index key; immutable */
        mode_t type;              /* S_IFMT bits; immutable */
        uint64_t nlookup;         /* kernel references; fs->itable_lock */
        uint32_t readers;         /* open read-only handles; fs->itable_lock */
        uint32_t writers;         /* open handles that may write; fs->itable_lock */
        _Atomic bool evicted;     /* eviction removed it: path-based requests get ESTALE (evict/);
                                     set under fs->itable_lock */
        pid_t creator;            /* the process that created it through the mount, for a lock file (the name
                                     lock or *.lock), else 0 (evict/units.c: whose store holds a runtime's lock) */
        uint64_t creator_start;   /* when that process started (clock ticks since boot), which tells it from a
                                     later one with its pid (ops-entry.c, STALE LOCKS); 0: unknown */
        _Atomic bool unlinked;    /* no name left: not accounted any more; set under lock, read anywhere
                                     (a name found for its number later is a new file's: inode.c) */
        bool bookkeeping;         /* a runtime's size file that eviction rewrites behind the kernel's back
                                     (NEO's config.file, SYCL's cache_size.txt): opened direct_io, so that
                                     no read is served from pages cached before a rewrite; immutable */
        pthread_mutex_t lock;
        uint64_t alloc;           /* allocated bytes, as the index holds them; lock */
        bool alloc_told;          /* alloc is known to be what the index's row holds (read from it or told to
                                     it): an unchanged allocation needs no word to the index (T3); lock */
        uint64_t size;            /* st_size at the last fstat; lock */
        struct timespec mtime;    /* st_mtim at the last fstat; lock */
        bool cache_ok;            /* size/mtime describe the kernel's page cache; lock */
        _Atomic int64_t atime_ns; /* logged last access, what getattr reports */
        _Atomic bool attr_cached; /* the kernel may hold attributes we sent: an access must invalidate them
                                     or refresh them (at RELEASE: ops-io.c, ATIME) */
        struct kfs_inode *kdir;   /* the directory the kernel last looked it up, made it or renamed it in,
                                     holding a reference to it, or NULL (the root; its last name went) */
        char *kname;              /* its name there: refresh.c's path is the names up to the root. Whoever
                                     renames behind the mount makes it stale: refresh.c checks the inode
                                     number it reaches. itable_lock */
        _Atomic int64_t refresh_ns; /* when refresh.c last queued it (CLOCK_MONOTONIC), or 0 */
        _Atomic bool refresh_pending; /* in refresh.c's queue, not yet sent to its child (refresh.c, ORDER) */
        _Atomic bool refresh_owed; /* a release left its refresh to the last opener's (refresh.c, COST): set
                                      under itable_lock, with the count of openers */
        _Atomic bool settle_queued; /* in fs->settle's queue, to be measured after writeback (settle.c) */
        bool settling;            /* the settler holds a descriptor of it: eviction passes over it meanwhile
                                     (settle.c, PINNED); fs->itable_lock */
        uint64_t margin;          /* bytes of fs->ev's reservation held for what writeback may still allocate
                                     for it (settle.c, MARGIN), released when the settler measures it; lock */
        _Atomic int64_t named_ns; /* a directory: when a request last named it (looked it up, or looked up
                                     or created in it); eviction removes no directory named recently
                                     (evict/prune.c, EMPTIED DIRECTORIES) */
        _Atomic int32_t pt_id;    /* registered backing file (passthrough.c), kept until the inode is
                                     forgotten or evicted; 0: none. Set under lock */
        uint32_t pt_opens;        /* opens in passthrough mode (passthrough.c); lock */
        uint32_t cached_opens;    /* opens in the page-cache mode; lock */
};

/* Kernel passthrough (passthrough.c). */
struct kfs_pt {
        _Atomic bool on;          /* negotiated and working: read-only opens get passthrough */
        bool wanted;              /* a root daemon, not -o nopassthrough */
        _Atomic uint64_t opens;   /* opens given passthrough since mount */
        pthread_mutex_t lock;
        char why[160];            /* why it is off; lock */
};

#define KFS_DIRECT_SEEN 4096       /* direct.c: uniques remembered, for INTERRUPT */

struct kfs {
        struct kfs_opts o;
        struct ktree tree;        /* the backing root (O_RDONLY|O_DIRECTORY) and its st_dev: every operation on
                                     the backing tree goes through common/tree.h */
        int dead_fd;              /* an anonymous memfd that evicted inodes' fds are pointed at */
        uid_t owner;              /* who mounted: may run kcache actions */
        struct kfs_inode root;
        struct fuse_session *se;
        struct kfs_pt pt;
        /* Called as an inode the kernel forgot is freed, with no lock held: what others hold for it goes
         * (passthrough.c sets it: the inode's registered backing file). Set before the mount, or NULL. */
        void (*inode_gone)(struct kfs *fs, struct kfs_inode *in);
        struct {                  /* our own device I/O (devio.c) */
                int fd;           /* the session's /dev/fuse */
                bool hooked;      /* installed */
                bool init_seen, init_done; /* the kernel's INIT request was read; its reply sent */
                uint64_t init_unique;
                bool offers_pt, offers_ring, offers_killpriv2; /* what INIT offered */
        } devio;
        struct {                  /* the kernel forgets evicted names (kprune.c) */
                _Atomic bool on;  /* the kernel takes FUSE_NOTIFY_PRUNE */
                char why[160];    /* why not, if not */
                _Atomic uint64_t sent; /* node ids sent since mount */
                pthread_mutex_t lock; /* a leaf */
                pthread_cond_t cond;
                uint64_t *later;  /* ids to prune a moment from now (kfs_kprune_later); lock */
                size_t n, cap;    /* lock */
                bool started, stop; /* its thread; lock */
                pthread_t thread;
        } kprune;
        struct {                  /* the kernel's attributes refreshed after a release (refresh.c) */
                bool wanted;      /* a root daemon, logging, not -o norefresh; set before the loop */
                _Atomic pid_t child; /* its child process, whose requests are counted as OWN; 0: none */
                pthread_mutex_t lock; /* a leaf */
                pthread_cond_t cond;
                struct kfs_refresh_item *q; /* files released and directories listed, waiting for the
                                     thread; lock */
                size_t n, cap;    /* lock */
                size_t bytes;     /* of the queued paths; lock */
                bool started, sleeping, stop; /* the thread; lock */
                bool closed;      /* the session is going: no more notifications; lock */
                unsigned busy;    /* the thread at work on inodes or notifying; lock */
                int64_t retry_at; /* no thread or child could be started: not before this
                                     (CLOCK_MONOTONIC ns); lock */
                int64_t backoff;  /* the last wait before a retry, doubled at each failure in a row; lock */
                pthread_t thread;
                _Atomic uint64_t sent, dropped; /* files and directories refreshed by the child; not,
                                     though queued or meant to be (no path, a full queue, the child failed) */
        } refresh;
        struct kfs_ring *ring;    /* FUSE over io_uring (ring.c), or NULL */
        _Atomic bool ring_on;
        _Atomic uint64_t ring_requests; /* requests served through the rings since mount */
        bool direct;              /* the rings answer OPEN and RELEASE without libfuse (direct.c) */
        _Atomic uint64_t direct_requests; /* of the ring's requests, those (direct.c) */
        _Atomic uint64_t direct_interrupts; /* INTERRUPTs for them, kept from libfuse (direct.c) */
        _Atomic uint64_t direct_seen[KFS_DIRECT_SEEN]; /* their uniques, by slot (direct.c) */
        _Atomic uint64_t requests[KFS_OPCODES]; /* requests the kernel sent, by opcode (kfs_count_request) */
        _Atomic int ring_err;     /* why io_uring could not be used (errno), 0: it could or was not offered */
        /* The mount as the daemon's helpers reach it after mount (refresh.c's clones, ring.c's nudges), in
         * directories a user may rename: the mount point's directory held from mount on (mount_dir, an
         * O_PATH fd; -1: none), its name there (mount_name), and the mount's device (mount_dev, 0: unknown),
         * which what they reach must be. */
        int mount_dir;
        const char *mount_name;
        dev_t mount_dev;
        bool singlethread;        /* -s */
        struct {                  /* flock() (flock.c) */
                pthread_mutex_t lock;
                pthread_cond_t cond;      /* a waiter ended, or a lock's holder was closed */
                struct kfs_flock_wait *list; /* waits, each on its own thread, until joined; lock */
                struct kfs_flock_holder *holders; /* the locks our backing fds hold; lock */
                _Atomic unsigned nholders;
                uint64_t drops;           /* holders let go since mount; lock */
                _Atomic bool stop;
        } flock;
        kidx *idx;

        struct {                  /* the inodes' O_PATH fds, a bounded set (inode.c, DESCRIPTORS) */
                pthread_mutex_t lock; /* a leaf: no other lock is taken under it */
                bool handles;         /* open_by_handle_at works here, else idle fds reopen by name */
                char why[160];        /* why not, if not */
                size_t open;          /* inodes' fds open now; lock */
                size_t idle;          /* of them, in the idle list (open, reopenable, not borrowed); lock */
                size_t cap;           /* idle fds are closed past this many (-o inode_fds, at most half
                                         RLIMIT_NOFILE; lowered by kfs_fds_shed); lock */
                _Atomic uint64_t sheds; /* times the process ran out of descriptors (kfs_fds_shed) */
                struct kfs_inode *idle_head, *idle_tail; /* least recently used first; lock */
                _Atomic uint64_t reopens; /* fds reopened from their handle or name since mount */
        } fdc;

        /* Held, for the backing directory whose inode number hashes to it, around a removal that first
         * checks what the name holds (eviction, repairs) and around a rename through the mount: without
         * it, a rename that put a new file at the name between the check and the unlink lost that file
         * (the index kept it: "only in the index"). */
        pthread_mutex_t name_locks[KFS_NAME_LOCKS];
        pthread_mutex_t itable_lock;
        kmap itable;              /* bino -> struct kfs_inode*; itable_lock */
        kmap detached;            /* evicted inodes the kernel still knows, by address (T4); itable_lock */
        kmap named_gone;          /* directories the kernel forgot soon after a request named them: backing
                                     inode number -> named_ns (kfs_dir_named_at_locked); itable_lock */

        _Atomic uint64_t users_ino; /* backing inode of users/ once seen sound (users.c, U1); 0: not yet */
        struct kev *ev;           /* eviction's state (evict/state.c) */
        struct kfs_remote *remote; /* the shared tier (remote/), or NULL: none */
        struct kfs_settings *settings; /* what settings.c keeps: the command line's, SIGHUP's thread */
        char log_to[4200];        /* where messages go once mounted, in words (kcache config) */
        bool no_opendir;          /* the kernel handles opendir itself (set in init) */
        struct {                    /* written files, measured again after writeback (settle.c) */
                pthread_mutex_t lock;
                pthread_cond_t cond;    /* stopping */
                kmap queue;             /* inode address -> inode, each holding a lookup reference; lock */
                bool stop;              /* lock */
                bool started, said;     /* lock */
                int64_t retry_at;       /* the thread could not be started: not before this (ns); lock */
                uint32_t blk;           /* the backing filesystem's block, where its writeback allocates
                                           extent blocks; 0 where it allocates nothing (tmpfs): MARGIN */
                pthread_t thread;
        } settle;
};

static inline struct kfs *kfs_of(fuse_req_t req)
{
        return fuse_req_userdata(req);
}

/* The metadata directory is invisible: lookups miss it, readdir skips it, nothing can be made there. */
static inline bool kfs_hidden(const struct kfs *fs, const struct kfs_inode *parent, const char *name)
{
        return parent == &fs->root && name[0] == '.' && __builtin_strcmp(name, KFS_META_DIR) == 0;
}

/* The inode was evicted: requests that reach it through a name must answer ESTALE (evict/remove.c). */
static inline bool kfs_stale(struct kfs_inode *in)
{
        return atomic_load(&in->evicted);
}

int64_t kfs_now_ns(void);  /* CLOCK_REALTIME, as atimes are */
int64_t kfs_mono_ns(void); /* CLOCK_MONOTONIC, for deadlines */

/* A request names the directory in (a lookup of it or in it, a create in it): eviction leaves it be for
 * a while, even if it empties it (evict/prune.c, EMPTIED DIRECTORIES). */
static inline void kfs_dir_named(struct kfs_inode *in)
{
        if (S_ISDIR(in->type))
                atomic_store(&in->named_ns, kfs_now_ns());
}

/* When a request last named directory ino (kfs_dir_named), whether or not the kernel still knows it: a
 * prune of an evicted file's name takes its unused parents with it (fs/kprune.c), and with them the
 * inode's stamp, while the runtime that named the directory may be about to store in it. in: its inode,
 * or NULL. itable_lock held. */
int64_t kfs_dir_named_at_locked(struct kfs *fs, const struct kfs_inode *in, uint64_t ino);

/* A new object's mode as the caller asked for it: the caller's umask applies (FUSE passes it with the
 * request; the daemon's own umask is 0, set at start, so it never applies on top). */
static inline mode_t kfs_req_mode(fuse_req_t req, mode_t mode)
{
        return mode & ~fuse_req_ctx(req)->umask;
}
/* The flags the daemon opens a backing file with for a caller's open: never O_DIRECT (the kernel
 * already bypasses its page cache for the caller; the daemon's buffers are not aligned for O_DIRECT, and
 * writes of 4 KiB and more failed with EINVAL), never a controlling terminal, always close-on-exec. */
static inline int kfs_backing_flags(int flags)
{
        return (flags & ~(O_DIRECT | O_NOCTTY)) | O_CLOEXEC;
}
/* CLOCK_REALTIME ms from now, for pthread's timed waits. */
struct timespec kfs_deadline_ms(unsigned ms);
/* The signal that interrupts a thread's blocking flock() at shutdown (the repairer, flock waiters), and
 * its no-op handler without SA_RESTART, installed once by kfs_wake_signal_init(). */
#define KFS_WAKE_SIGNAL SIGUSR2
void kfs_wake_signal_init(void);
/* Called first by a thread that waits to be woken so: a thread inherits its creator's signal mask, and
 * the io_uring threads (ring.c) block every signal, so a waiter they started could not be woken. */
void kfs_wake_signal_accept(void);
/* Makes a stat of a backing inode what the mount shows: logged atime, no blocks for non-files. */
void kfs_fix_attr(const struct kfs_inode *in, struct stat *st);
/* Looks dir/name up, takes a lookup reference, and fills e. -errno on failure. */
int kfs_do_lookup(struct kfs *fs, struct kfs_inode *dir, const char *name, struct fuse_entry_param *e);
/* The entry of the file open as fd, which this request made as dir/name and fstat()ed into st, without
 * looking the name up again: eviction or a repair may have removed or replaced it since. */
int kfs_entry_of_fd(struct kfs *fs, struct kfs_inode *dir, const char *name, int fd, const struct stat *st,
                    struct fuse_entry_param *e);
/* With allow_other and a root daemon, gives a new object to the caller (uid, and gid unless setgid dir):
 * the file open as fd, or dir/name when fd is -1. */
int kfs_set_owner(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const char *name, int fd);
/* Whether only root and UID can reach PATH (absolute, resolved; WHAT names it in messages) by its path
 * (reach.c: P1-P3). SELF_COUNTS: PATH's own mode may be the one that denies search (an index's directory;
 * never the backing root, whose mode is the mount root's). TIGHTEN: close PATH's parent (SELF_COUNTS: PATH)
 * where that is safe, never one that holds KEEP_OPEN (a shared mount point; NULL: none). 0: nobody else
 * reaches it, and *RET_NOTE (or NULL) says what -o tighten changed; -EACCES: others do, or -errno: it could
 * not be examined, and *RET_WHY says which directory and the fix, in one line. Both are the caller's. */
int kfs_reach_check(const char *what, const char *path, bool self_counts, uid_t uid, bool tighten,
                    const char *keep_open, char **ret_note, char **ret_why);
int kfs_parse_pins(const char *s, char ***ret);
/* Parses ARGS into O (operands: the backing directory; -o options; -h, -V). -EINVAL on a bad option. */
int kfs_opts_parse(struct fuse_args *args, struct kfs_opts *o);
/* Reads O's numeric options as given (max_size, low_watermark, timeout, tmp_age, grace_ms, flush_ms,
 * inode_fds, and protect; NULL: the default already in O, or DEFAULT_MAX_SIZE) into their fields, each checked against
 * its range (options.c, RANGES). 0, or -EINVAL with one line in WHY (LEN bytes) that names the option, the
 * value given and what is allowed; O's fields are then partly written. */
int kfs_opts_check(struct kfs_opts *o, const char *default_max_size, char *why, size_t len);
bool kfs_pinned_path(const struct kfs *fs, const char *relpath);
void kfs_free_opts(struct kfs_opts *o);

/* inode.c */
struct kfs_inode *kfs_inode_get(struct kfs *fs, fuse_ino_t ino);
/* Finds or creates the inode for an fstat()ed backing object under dir/name and takes one lookup
 * reference. fd_or_neg: an O_PATH fd already opened on it (consumed), or -1. */
int kfs_inode_ref(struct kfs *fs, struct kfs_inode *dir, int dirfd, const char *name, const struct stat *st,
                  int fd_or_neg, struct kfs_inode **ret);
/* The name dir/name of the backing inode st goes (an unlink, a rename over it), and fd is open on that
 * inode: if the inode reopens by that name (DESCRIPTORS), it keeps a descriptor instead, for its other
 * links or its open files, until a lookup names it again. */
void kfs_inode_unnamed(struct kfs *fs, const struct stat *st, struct kfs_inode *dir, const char *name, int fd);
/* A rename moved the backing inode bino to dir/name: where it reopens by name (DESCRIPTORS). */
void kfs_inode_moved(struct kfs *fs, uint64_t bino, struct kfs_inode *dir, const char *name);
void kfs_inode_unref(struct kfs *fs, struct kfs_inode *in, uint64_t n);
/* Takes (or lets go) the name locks of the directories with backing inode numbers a and b (one, if
 * they share it), in a fixed order (struct kfs, name_locks). */
void kfs_names_lock(struct kfs *fs, uint64_t a, uint64_t b);
void kfs_names_unlock(struct kfs *fs, uint64_t a, uint64_t b);
/* The inodes' O_PATH descriptors open now (DESCRIPTORS). */
uint64_t kfs_inode_fds_open(struct kfs *fs);
/* Borrows an O_PATH fd on the inode's backing object, reopening it from its file handle if it was closed;
 * the fd stays open until kfs_inode_fd_put(fs, in, fd). An evicted inode lends fs->dead_fd, the
 * placeholder. Returns the fd, or -ESTALE (the object is gone from the backing filesystem), -EMFILE. */
int kfs_inode_fd(struct kfs *fs, struct kfs_inode *in);
void kfs_inode_fd_put(struct kfs *fs, struct kfs_inode *in, int fd);
/* The inode was evicted: its fd is closed now, or by its last borrower, and never reopened. */
void kfs_inode_fd_retire(struct kfs *fs, struct kfs_inode *in);
/* At mount, before any inode: whether fds can be reopened from file handles here, and how many stay
 * open; says on stderr when the descriptor limit constrains the cache's files. */
void kfs_inode_fds_init(struct kfs *fs, uint64_t files);
/* The process ran out of descriptors (EMFILE, ENFILE: its limit was lowered while it runs, or open files
 * took them): closes half of the idle inodes' fds and keeps the cap there. True if any was closed, and
 * the failed call may be tried again. */
bool kfs_fds_shed(struct kfs *fs);
/* open(2) as -errno. */
int kfs_open_errno(const char *path, int flags);
/* Runs CALL (an expression giving a descriptor or -errno) into R, again after each shed of idle fds while
 * it fails for want of descriptors. */
#define KFS_RETRY_FDS(fs, r, call)                                                              \
        do {                                                                                    \
                (r) = (call);                                                                   \
        } while (((r) == -EMFILE || (r) == -ENFILE) && kfs_fds_shed(fs))
/* Table lookup by backing inode number; NULL if the kernel does not know it. itable_lock held. */
struct kfs_inode *kfs_inode_find_locked(struct kfs *fs, uint64_t bino);
/* Re-reads the allocated size of an open regular file and tells the index. lock held. */
void kfs_inode_account_locked(struct kfs *fs, struct kfs_inode *in, const struct stat *st);
int kfs_fstat_inode(struct kfs *fs, struct kfs_inode *in, struct stat *st);
void kfs_proc_path(char *buf, size_t size, int fd);
/* Opens the inode's backing file (through its O_PATH fd) with flags. Returns the fd or -errno. */
int kfs_inode_open(struct kfs *fs, struct kfs_inode *in, int flags);
void kfs_inode_table_free(struct kfs *fs);

/* users.c: each user's directory of their own on a shared mount (users/<uid>) */
/* The caller's directory, made on first use (U1-U3): its path relative to the mount into buf. Its length,
 * -EPERM (the daemon cannot give it to the caller, or what holds the name is not the caller's: refused
 * until the next mount repairs it), -E2BIG, other -errno. */
int kfs_users_home(fuse_req_t req, struct kfs *fs, char *buf, size_t size);
/* At mount, once the index is open and before the kernel knows any name: sets aside what claims users/ or
 * users/<uid> without being the daemon's or that user's (U2). Says on stderr what it did. */
void kfs_users_check(struct kfs *fs);
/* A miss for name in dir must not be cached by the kernel: users/ or a name in it (U4). */
bool kfs_users_uncached(struct kfs *fs, const struct kfs_inode *dir, const char *name);
/* Whether name is a uid as users/ names it (decimal, no leading zero), into *ret. */
bool kfs_users_uid(const char *name, uid_t *ret);
/* rel (relative to the root) is users/<uid>: 1; users/<uid>/<name>: 2 (where kcache env puts a runtime's
 * directory on a shared mount); else 0. */
int kfs_users_level(const char *rel);
/* The object st may be trusted as users/ (U1); as users/<uid> for uid. */
bool kfs_users_container_ok(const struct stat *st);
bool kfs_users_home_ok(const struct stat *st, uid_t uid);

/* log.c */
/* Says MESSAGE (printf FMT) with PRIORITY (LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO): to stderr as
 * "kcachefs: MESSAGE" before kfs_log_start(), to its sink after. Thread-safe. */
void kfs_log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* libfuse's messages go through kfs_log with libfuse's priority. Once, at start. */
void kfs_log_init(void);
/* Whether a syslog socket answers at PATH (/dev/log, _PATH_LOG). */
bool kfs_log_syslog_answers(const char *path);
/* Whether the journal's socket answers (/run/systemd/journal/socket; $KCACHEFS_JOURNAL_SOCKET in tests). */
bool kfs_log_journal_answers(void);
/* Whether stderr is the journal stream systemd gave us ($JOURNAL_STREAM; kfs_log_init reads it). */
bool kfs_log_journal_stream(void);
/* From now on messages go to FILE (appended, one line each with the time and the priority), or with FILE
 * -1 to the journal with MOUNT=JOURNAL_MOUNT, or with that NULL too to syslog; stderr becomes a pipe to a
 * thread that passes its lines on at LOG_WARNING, rate-limited. NOTE (or NULL): the first message, at
 * LOG_NOTICE. FILE is the log's from here on, closed by kfs_log_finish (on failure too). 0 (*ret: for
 * kfs_log_finish) or -errno (stderr unchanged). */
struct kfs_log;
int kfs_log_start(int file, const char *journal_mount, const char *note, struct kfs_log **ret);
/* At exit: everything said so far reaches the sink before the process ends. NULL: nothing to do. */
void kfs_log_finish(struct kfs_log *l);

/* settle.c */
/* An allocating operation touched in: it is measured again after its writeback (settle.c). */
void kfs_settle_note(struct kfs *fs, struct kfs_inode *in);
/* At mount: whether the backing filesystem allocates at writeback, and its block (MARGIN). */
void kfs_settle_init(struct kfs *fs);
/* in->lock held. The bytes a write that may allocate est bytes must reserve on top of est, for the extent
 * blocks its writeback may allocate (MARGIN); 0 once in's margin covers the file. */
uint64_t kfs_settle_margin_locked(struct kfs *fs, struct kfs_inode *in, uint64_t est);
/* Measures every queued file now (the flush action, kcache verify). Returns how many. */
size_t kfs_settle_all(struct kfs *fs);
/* Stops the settler and measures what is left (before the index closes). */
void kfs_settle_stop(struct kfs *fs);

/* in's path from the mount's root, by the names the kernel knows it by (kdir, kname), into BUF (SIZE
 * bytes). itable_lock held. 0, -ENOENT (nameless on the way), -ENAMETOOLONG. */
int kfs_inode_path_locked(struct kfs *fs, struct kfs_inode *in, char *buf, size_t size);

/* thread.c */
/* Notes the CPUs the daemon may run on, before any of its threads pins itself (ring.c). */
void kfs_thread_init(void);
/* pthread_create of fn(arg) on those CPUs (thread.c), with a stack of STACK bytes (0: the default).
 * 0 or -errno. */
int kfs_thread_start(pthread_t *th, size_t stack, void *(*fn)(void *), void *arg);

/* spawn.c */
/* Starts ARGV (ARGV[0] only names it) as a helper: the daemon's binary, exec'd afresh, with FDS[i] as its
 * descriptor 3 + i and no other of the daemon's (spawn.c, WHY PROCESSES). 0 (*pid) or -errno. */
int kfs_spawn_self(char *const argv[], const int *fds, int nfds, pid_t *pid);

/* ring.c's nudge: kcachefs --nudge QID NAME MAJOR:MINOR, with the mount point's directory as descriptor
 * 3: a statfs of the mount from CPU QID, if NAME there holds the mount of that device. Exit status. */
int kfs_ring_nudge_child(const char *qid, const char *name, const char *dev);

/* refresh.c */
/* At mount, before the loop: whether refreshing can be on (REFRESH). */
void kfs_refresh_setup(struct kfs *fs);
/* At RELEASE of a handle of in (kernel inode ino): the kernel's attributes of in are dropped, so that a
 * stat asks and gets the logged atime; after a reader's release, the child then fetches them anew
 * (refresh.c, COST says when not). No lock held. */
void kfs_refresh_release(struct kfs *fs, struct kfs_inode *in, fuse_ino_t ino, bool writer);
/* Before the READDIR reply that ends a listing of dir (kernel inode ino): the child fetches its attributes
 * anew, a moment later (refresh.c, DIRECTORIES). No lock held. */
void kfs_refresh_listed(struct kfs *fs, struct kfs_inode *dir, fuse_ino_t ino);
/* The loop ended: no more notifications (before the session is destroyed). */
void kfs_refresh_close(struct kfs *fs);
/* After the session is destroyed: the child ends, the thread is joined. */
void kfs_refresh_stop(struct kfs *fs);
/* The child: kcachefs --refresh-child MAJ:MIN, exec'd by the daemon with the mount's clone on fd 3 and its
 * socket on fd 4. Returns the exit status. */
int kfs_refresh_child(const char *dev);

/* flock.c */
/* The process a thread belongs to (requests carry thread ids), or 0. */
pid_t kfs_tgid_of(pid_t tid);
/* The parent of process pid, or 0. */
pid_t kfs_ppid_of(pid_t pid);
/* When process pid started (clock ticks since boot, /proc/PID/stat), or 0 if there is no such process. */
uint64_t kfs_proc_start(pid_t pid);
/* Whether a thread of process pid (a thread id, as requests carry) holds a flock on bino through us. */
bool kfs_flock_held_by(struct kfs *fs, uint64_t bino, pid_t pid);
/* Whether a thread of process pid holds a flock on anything through us. */
bool kfs_flock_holds_any(struct kfs *fs, pid_t pid);
/* Lets go of a flock the daemon took on fd (LOCK_UN), then closes it: a close alone leaves the lock with
 * every copy of the descriptor, and a helper being spawned holds a copy of them all (spawn.c). */
void kfs_flock_let_go(int fd);
/* Interrupts and waits out the flock() waiters (before the session goes). */
void kfs_flock_stop(struct kfs *fs);
/* Closes a handle's backing fd at RELEASE, letting go of its lock first where it held one (flocked: the
 * kernel's FUSE_RELEASE_FLOCK_UNLOCK), and forgets it. */
void kfs_flock_close(struct kfs *fs, int fd, bool flocked);

/* kprune.c */
/* At INIT: whether the kernel (its FUSE protocol's minor version) can prune. */
void kfs_kprune_init(struct kfs *fs, unsigned kernel_minor);
/* Asks the kernel to drop the unused dentries of inodes ids (FUSE node ids), so that it forgets those it
 * no longer needs. No lock of ours held; never blocks on a directory. */
void kfs_kprune(struct kfs *fs, const uint64_t *ids, size_t n);
/* The same for one id, a moment from now, from a thread of kprune.c (after a last close). */
void kfs_kprune_later(struct kfs *fs, uint64_t id);
/* At unmount, before the session goes: ends that thread. */
void kfs_kprune_stop(struct kfs *fs);

/* devio.c */
/* After the session is mounted (and kfs_pt_setup): installs our device I/O unless nothing needs it. */
void kfs_dev_setup(struct kfs *fs);
/* Counts a request of opcode as the kernel sent it (through /dev/fuse or a ring), before libfuse sees it. */
/* Counts a request the kernel sent, by opcode; one sent for the daemon's own process (refresh.c's child,
 * pid) as OWN instead. */
void kfs_count_request(struct kfs *fs, uint32_t opcode, uint32_t pid);
#define KFS_OPCODE_OWN (KFS_OPCODES - 2)
/* The counts as `OPEN 3 GETATTR 1 ...` (nonzero ones, by opcode), into buf; as snprintf. */
int kfs_requests_text(struct kfs *fs, char *buf, size_t size);

/* ring.c */
/* Before mounting: a root daemon turns on the kernel's switch for FUSE over io_uring (see ring.c). */
void kfs_ring_prepare(struct kfs *fs);
/* From the init handler: if the kernel offered io_uring (and not -o nouring, -s), checks that io_uring
 * works here and prepares the rings' state; else records why not. */
void kfs_ring_init(struct kfs *fs);
/* Whether INIT's reply asks for io_uring (kfs_ring_init succeeded). */
bool kfs_ring_wanted(struct kfs *fs);
/* After the kernel took INIT's reply: starts the ring threads (on failure, says so; /dev/fuse serves). */
void kfs_ring_start(struct kfs *fs, uint32_t max_write);
/* The opcode of the request a ring entry holds with that unique, as the kernel put it there; 0 where no
 * entry names it (never one of the rings', or answered and its entry reused), and a reply's error (0 or
 * a negative errno, as unsigned) where its reply stands there now. Any thread. */
uint32_t kfs_ring_opcode_of(struct kfs *fs, uint64_t unique);
/* Sends a reply: into its ring entry if the request came through a ring, else to fd. */
ssize_t kfs_ring_writev(struct kfs *fs, int fd, const struct iovec *iov, int count);
/* direct.c: whether unique is a request answered without libfuse, lately (an INTERRUPT for it is not
 * libfuse's to keep). */
bool kfs_direct_owns(struct kfs *fs, uint64_t unique);
/* direct.c: an OPEN or RELEASE that came through a ring (in, its first argument arg of arglen bytes),
 * answered without libfuse: the reply's header in out and its body in body (at least 16 bytes); returns
 * the body's length, or -ENOSYS for any other request, which libfuse then runs. */
struct fk_in_header;
struct fk_out_header;
int kfs_direct(struct kfs *fs, const struct fk_in_header *in, const void *arg, size_t arglen,
               struct fk_out_header *out, void *body);
/* Stops the ring threads (after the session loop). */
void kfs_ring_stop(struct kfs *fs);
/* Joins the nudges and frees the ring (once the session's /dev/fuse is closed: a nudge's request ends
 * with the connection). */
void kfs_ring_free(struct kfs *fs);
/* "io_uring (N queues)", or "/dev/fuse" with why. */
const char *kfs_ring_state(struct kfs *fs, char *buf, size_t size);

/* passthrough.c */
/* Before kfs_dev_setup: whether passthrough is wanted (a root daemon, not -o nopassthrough). */
void kfs_pt_setup(struct kfs *fs);
/* From the init handler: passthrough is on if the kernel offered it. */
void kfs_pt_init(struct kfs *fs);
/* Passthrough is off for good: why (and err, if not 0) is recorded and said on stderr. */
void kfs_pt_off(struct kfs *fs, const char *why, int err);
/* If this thread's handler asked for a backing id (kfs_pt_reply_next), the OPEN or CREATE reply iov
 * amended into v and body; else iov itself. */
const struct iovec *kfs_pt_amend(const struct iovec *iov, int count, struct iovec v[4], char *body, size_t size);
/* Chooses the I/O mode of a new open of in and counts it. *fd: the daemon's open of the backing file, or
 * -1 if it has none yet, in which case one is opened here (with flags, left in *fd) only if a backing
 * file must be registered. Returns the backing id the reply must carry (passthrough mode), or 0
 * (page-cache mode). */
int32_t kfs_pt_open(struct kfs *fs, struct kfs_inode *in, int *fd, int flags, bool writer);
/* An OPEN or CREATE reply's fuse_open_out made a passthrough one, with backing_id (not 0). */
struct fk_open_out;
void kfs_pt_fill(struct fk_open_out *o, int32_t backing_id);
/* The next reply this thread sends to OPEN or CREATE carries backing_id (0: none). */
void kfs_pt_reply_next(int32_t backing_id);
/* An open counted by kfs_pt_open ended (released, or its reply never reached the kernel). */
void kfs_pt_release(struct kfs *fs, struct kfs_inode *in, bool passthrough);
/* The inode is forgotten or its file evicted: unregisters its backing file, which holds the blocks.
 * Takes no lock. */
void kfs_pt_forget(struct kfs *fs, struct kfs_inode *in);
/* "on", or "off: why" (written into buf). */
const char *kfs_pt_state(struct kfs *fs, char *buf, size_t size);
/* An open file's handle (fi->fh) is either the daemon's own backing fd (low 32 bits), with KFS_FH_PT for
 * a writer of a passthrough inode and KFS_FH_DIRECT for a new file's direct writer (ops-io.c, CREATED
 * FILES); or, for a passthrough reader, KFS_FH_LAZY | a struct kfs_handle *, whose fd is opened at its
 * first use: most never are (the kernel reads the backing file itself), and an open costs no open(2) in
 * the daemon. */
#define KFS_FH_PT (1ULL << 32)
#define KFS_FH_DIRECT (1ULL << 33)
#define KFS_FH_LAZY (1ULL << 63)
struct kfs_handle {
        _Atomic int fd;           /* -1 until first needed (flock, fsync, SEEK_DATA, fchmod...) */
        int flags;                /* the open's flags */
};
/* The lazy handle behind fi->fh, or NULL if the handle holds its fd itself. */
static inline struct kfs_handle *kfs_lazy_handle(const struct fuse_file_info *fi)
{
        return fi->fh & KFS_FH_LAZY ? (struct kfs_handle *)(uintptr_t)(fi->fh & ~KFS_FH_LAZY) : NULL;
}
/* The handle's backing fd, opened now if it is a lazy one that was never used; -errno if that fails. */
int kfs_handle_fd(struct kfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);

int kfs_parse_layouts(const char *s, struct kfs_layout **ret, size_t *ret_n);

/* ops-xattr.c: setting or removing an attribute of a regular file may take or free a block (ATTRIBUTES
 * TAKE BLOCKS). begin reserves room for an attribute of len bytes (name and value; 0: a removal reserves
 * nothing) into *held, or fails (-ENOSPC); end measures the file and releases *held. Other types: no-ops.
 * No lock of ours held. */
int kfs_xattr_begin(struct kfs *fs, struct kfs_inode *in, size_t len, uint64_t *held);
void kfs_xattr_end(struct kfs *fs, struct kfs_inode *in, uint64_t held);

/* settings.c (the settings file, kcache config and set, SIGHUP) */
/* The defaults of the settings that a mount may change (kcachefs --help says them). */
#define KFS_DEFAULT_MAX_SIZE "1G"
#define KFS_DEFAULT_PINS KFS_NEO_SIZE_FILE ":" KFS_SYCL_SIZE_FILE ":*.lock:" KFS_JAX_LOCK ":lock:ccache.conf"
/* Reads the settings file PATH into o: a key the command line gave (set in o already) keeps the command
 * line's value. backing = PATH is the backing directory where the command line gives only MOUNTPOINT
 * (main.c moves that operand before). Every value is kept as text, as the command line's, for
 * kfs_opts_check to read. 0, or -errno with why (FILE:LINE: what) filled. */
int kfs_settings_file(struct kfs_opts *o, const char *path, char *why, size_t len);
/* After the options are parsed and before the file is read: the command line's own settings are kept,
 * which win over the file's at SIGHUP too. 0 or -ENOMEM. */
int kfs_settings_init(struct kfs *fs);
/* kcache config: every setting of the mount, one "key=value" line each. Bytes written or -E2BIG. */
int kfs_settings_show(struct kfs *fs, char *buf, size_t size);
/* kcache set: "key=value" lines, all checked (kfs_opts_check) before any is applied. 0, or -EINVAL
 * with the refusal kept for kfs_settings_refusal, or -ENOMEM. */
int kfs_settings_set(struct kfs *fs, const char *lines, size_t size);
/* The last refusal of kfs_settings_set, in words (kcache set prints it). */
int kfs_settings_refusal(struct kfs *fs, char *buf, size_t size);
/* SIGHUP re-reads the settings file (after fuse_set_signal_handlers, whose HUP ends the mount): start
 * takes the signal, kfs_settings_thread (at INIT) starts its reader, or ignores SIGHUP without one. */
int kfs_settings_start(struct kfs *fs);
void kfs_settings_thread(struct kfs *fs);
void kfs_settings_stop(struct kfs *fs);
void kfs_settings_free(struct kfs *fs);

/* control.c: the user.kcachefs.* attributes */
bool kfs_ctl_is_ours(const char *name);
int kfs_ctl_get(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, const char *name, char *buf, size_t size);
size_t kfs_ctl_list(struct kfs *fs, struct kfs_inode *in, char *buf, size_t size);
int kfs_ctl_set(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, const char *name, const char *value,
                size_t size);
int kfs_ctl_remove(fuse_req_t req, struct kfs *fs, struct kfs_inode *in, const char *name);

extern const struct fuse_lowlevel_ops kfs_ops;
/* ops-*.c entry points, wired in ops.c */
void kfs_op_init(void *ud, struct fuse_conn_info *conn);
void kfs_op_destroy(void *ud);
/* Answers a lookup with what the tree holds now (a miss cached for neg_timeout): for one answered late. */
void kfs_lookup_answer(fuse_req_t req, struct kfs_inode *dir, const char *name, double neg_timeout);
void kfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
void kfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n);
void kfs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
void kfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void kfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid, struct fuse_file_info *fi);
void kfs_op_readlink(fuse_req_t req, fuse_ino_t ino);
void kfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void kfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void kfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void kfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void kfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void kfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                   const char *newname, unsigned int flags);
void kfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);
/* Clears setuid and setgid (with group execute) after a write or truncate by a caller other than root,
 * for a root daemon; fd may be an O_PATH one if proc names it (ops-io.c, SETUID). */
void kfs_kill_suid(uid_t caller, int fd, const char *proc);
void kfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void kfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void kfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void kfs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void kfs_op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void kfs_op_statfs(fuse_req_t req, fuse_ino_t ino);
void kfs_op_access(fuse_req_t req, fuse_ino_t ino, int mask);
void kfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi);
void kfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
/* Who sent a request, for the handlers that also run without libfuse (direct.c). */
struct kfs_caller {
        pid_t pid;
        uid_t uid;
};
/* OPEN without its reply (kfs_op_open, direct.c): 0 with fi's handle and flags filled and *backing_id
 * the id the reply carries (0: page-cache mode), or -errno. A reply that never reached the kernel (the
 * opener was interrupted) is taken back with kfs_open_undo. */
int kfs_open_call(struct kfs *fs, const struct kfs_caller *c, fuse_ino_t ino, struct fuse_file_info *fi,
                  int32_t *backing_id);
void kfs_open_undo(struct kfs *fs, fuse_ino_t ino, struct fuse_file_info *fi, int32_t backing_id);
/* RELEASE without its reply (kfs_op_release, direct.c): true if, once replied, the inode must be handed
 * to kfs_kprune_later (evicted, and no longer open). */
bool kfs_release_call(struct kfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
void kfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void kfs_op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
                      struct fuse_file_info *fi);
void kfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void kfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void kfs_op_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op);
void kfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void kfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi);
void kfs_op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, struct fuse_file_info *fi);
void kfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags);
void kfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void kfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void kfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);
