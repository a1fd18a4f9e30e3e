/* internal.h: the shared tier's state and the parts of fs/remote/ that share it (remote.h has the essay).
 *   conn.c     the server's address, per-thread connections, the back-off after a failure
 *   value.c    a unit as stored (value.h)
 *   fetch.c    read-through on a lookup that found nothing
 *   publish.c  the publisher thread
 *   touch.c    the units in use here, told to the server (TOUCHES)
 *   remote.c   made, started, stopped, freed; counters */
#ifndef KCACHEFS_REMOTE_INTERNAL_H
#define KCACHEFS_REMOTE_INTERNAL_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../kfs.h"
#include "../../common/kmap.h"
#include "remote.h"

#define REMOTE_BACKOFF_MS 1000   /* after a failed connection, none is tried for this long */
#define PUBLISH_QUIET_MS 500     /* a unit is published once nothing in it changed for this long */
/* A unit larger than this, all its files together, is not shared: publishing one holds it about three
 * times over (the files, the value, hiredis's copy), and a root daemon must not be made to run out of
 * memory by what one user stores. */
#define REMOTE_MAX_UNIT (64u << 20)
#define REMOTE_KEY_PREFIX "kcfs:1:"
/* A namespace (TRUST, remote.h): "u<uid>", a user's own, or "p:<name>", a trusted publisher's. */
#define REMOTE_NAME_MAX 32        /* a publisher's name: [a-z0-9_-]{1,32} */
#define REMOTE_NS_MAX (REMOTE_NAME_MAX + 3)
#define REMOTE_TRUSTED_MAX 8      /* -o remote_trusted=: this many publishers at most */

struct kfs_remote_ns {
        char s[REMOTE_NS_MAX];
        bool trusted;             /* another's, read only here: a trusted publisher's (remote_trusted=) */
        /* What a path here has before its path in the namespace: a publisher's units are shared by every
         * user, so on a shared mount their paths are relative to the owner's own directory (users/<uid>/,
         * users.c), and land in the asker's; "" for a user's namespace, whose paths are the mount's. */
        char home[sizeof(KFS_USERS_DIR) + 16];
};
/* path in ns: past ns->home (which path begins with, kfs_remote_own_ns) */
static inline const char *kfs_remote_ns_path(const struct kfs_remote_ns *ns, const char *path)
{
        return path + __builtin_strlen(ns->home);
}

struct kfs_remote {
        /* where (conn.c); immutable after init */
        char *where;              /* as shown: redis://host:port/db or unix:/path */
        char *host;               /* NULL for a unix socket */
        char *unix_path;
        int port, db;
        char *user, *password;    /* from remote_auth=FILE: "PASSWORD" or "USER PASSWORD" */
        unsigned timeout_ms;      /* a probe's deadline */
        unsigned transfer_ms;     /* a unit's transfer deadline */
        double negative_s;        /* misses remembered this long */
        char node[64];            /* this node's name, in published units */
        char publish[REMOTE_NS_MAX]; /* -o remote_publish=NAME: "p:NAME", where the publisher's units go;
                                     "": none, each user's own */
        uid_t publisher;          /* -o remote_publisher=: the one account whose units go there */
        char trusted[REMOTE_TRUSTED_MAX][REMOTE_NS_MAX]; /* -o remote_trusted=: "p:NAME", in order */
        unsigned ntrusted;
        pthread_key_t conn_key;   /* this thread's struct remote_conn */
        _Atomic int64_t down_until_ns; /* no connection is tried before this */
        _Atomic bool said_down;   /* the operator was told it is away (conn.c) */
        _Atomic int64_t said_ns;  /* when */

        pthread_mutex_t neg_lock; /* a leaf */
        kmap neg;                 /* hash of namespace and path -> expiry (ns, as a pointer); neg_lock */

        unsigned herd_ms;         /* -o herd_wait=: how long a lookup waits for a compile elsewhere; 0: never */
        struct {                  /* lookups waiting for a compile elsewhere (herd.c) */
                pthread_mutex_t lock; /* a leaf */
                pthread_cond_t cond;
                struct herd_wait *list; /* lock */
                kmap mine;        /* marks this node set: hash of the mark -> struct herd_mine*; lock */
                size_t mine_next; /* mine is pruned when it holds this many; lock */
                kmap invites;     /* threads told to look again (H7): thread id -> struct herd_invite*; lock */
                size_t invites_next; /* likewise; lock */
                int64_t invites_swept_ns; /* when those no walk came back for go next (herd_join); lock */
                kmap interrupted; /* parked requests whose process got a signal: req -> 1; lock */
                _Atomic size_t ninvites; /* invites.count, read without the lock by every found lookup */
                bool started, stop; /* lock */
                pthread_t thread;
        } herd;
        struct {
                pthread_mutex_t lock; /* a leaf */
                pthread_cond_t cond;
                kmap due;         /* hash of path -> struct pub_item*; lock */
                bool started, stop;
                pthread_t thread;
        } pub;
        pthread_mutex_t touch_lock; /* a leaf */
        kmap touched;             /* backing inode numbers opened since the last touches; touch_lock */
        double touch_s;           /* how often */
        int64_t touched_ns;       /* when the last touches went (the publisher thread's own) */
        pthread_mutex_t memo_lock; /* a leaf */
        kmap memo;                /* hash of a published unit's key -> its files' newest mtime; memo_lock */

        _Atomic uint64_t hits, misses, remembered, timeouts, errors, corrupt, dirs, publishes, published_before,
                touches, bytes_in, bytes_out, herd_waits, herd_served, herd_gave_up, trusted_hits;
        /* the server's own figures, read with INFO at each touch interval (touch.c); 0: not known */
        _Atomic uint64_t server_used, server_max, server_evicted, server_keys;
        _Atomic int64_t server_seen_ns; /* when they were read (CLOCK_REALTIME); 0: never */
};

/* Who asked (fetch.c, F1): what is made for them is theirs. */
struct kfs_asker {
        uid_t uid;
        gid_t gid;
        bool chown;               /* the daemon is root: what it makes is given to the asker */
};

/* conn.c */
int kfs_remote_parse(struct kfs_remote *r, const char *url, const char *auth_file);
/* This thread's connection, connected (and authenticated, and on its database), or NULL: down, or in
 * back-off. timeout_ms: the deadline of the commands to come. */
redisContext *kfs_remote_conn(struct kfs_remote *r, unsigned timeout_ms);
/* The connection failed (a timeout, a reset, a protocol error): dropped, and counted. */
void kfs_remote_conn_failed(struct kfs_remote *r, redisContext *c);
void kfs_remote_conn_init(struct kfs_remote *r);
void kfs_remote_conn_free(struct kfs_remote *r);

uint64_t kfs_remote_hash(uint32_t uid, const char *path);
/* The namespace that a mount stores uid's units in and looks them up in first: "u<uid>", or the
 * publisher's on a remote_publish= mount; its home as path (of uid's) has it. */
void kfs_remote_own_ns(const struct kfs_remote *r, uid_t uid, const char *path, struct kfs_remote_ns *ns);
/* ns->home for a path of uid's: "users/<uid>/" where path lies in it and ns is a publisher's; "" if not. */
void kfs_remote_ns_home(struct kfs_remote_ns *ns, uid_t uid, const char *path);
/* "kcfs:1:<ns>:<path>", malloc'ed. */
char *kfs_remote_key(const char *ns, const char *path);
/* "kcfsl:1:<ns>:<dir>": the names of unit members published directly in dir (LISTINGS), malloc'ed. */
char *kfs_remote_list_key(const char *ns, const char *dir);
#define REMOTE_LIST_MAX 16        /* a directory made from the server gets its members if it has this few */
/* The path of name in the directory open as dfd (name NULL: of what dfd is open on), relative to the
 * backing root; malloc'ed, or NULL (outside it: removed, or in the metadata directory). */
char *kfs_remote_relpath(struct kfs *fs, int dfd, const char *name);
/* Whether units of rt are shared (SHAREABLE). */
bool kfs_remote_shareable(int rt);
/* The runtime a unit is shared as: its recogniser's, or, for a file no recogniser knew, the runtime its
 * directory is marked or laid out as (a libkcache entry, Inductor's FX graph, CuPy's kernels). */
struct kev_unit;
int kfs_remote_unit_rt(const struct kev_unit *u);

/* fetch.c */
/* The asker of req, in directory dfd: -EACCES where it is not theirs (F1). */
int kfs_remote_asker(struct kfs *fs, fuse_req_t req, int dfd, struct kfs_asker *a);
/* GET within ms: a string or nil reply, or NULL (counted; the connection dropped). */
redisReply *kfs_remote_get(struct kfs_remote *r, const char *key, unsigned ms);
/* What the server holds at key (rep, a string), in namespace ns, made beneath the root for path: 0, or
 * -ENOENT. */
int kfs_remote_take(struct kfs *fs, const struct kfs_asker *a, const struct kfs_remote_ns *ns, const char *path,
                    const char *key, redisReply *rep);
bool kfs_remote_remembered(struct kfs_remote *r, uint64_t h);
void kfs_remote_remember(struct kfs_remote *r, uint64_t h);
/* Forgets every remembered miss: a unit published here may be one of them (for another user of this
 * node, who reads the namespace it went to: a publisher's). Publications are rare; the GETs it costs, few. */
void kfs_remote_forget_all(struct kfs_remote *r);

/* herd.c: key missed. -ENOENT (a miss), 0 (published meanwhile, and made here), KFS_REMOTE_UNSURE (this
 * node compiles it), or KFS_REMOTE_PARKED (another node does: req is answered later; path and key are the
 * herd's). */
int kfs_remote_herd(struct kfs *fs, fuse_req_t req, struct kfs_inode *dir, const struct kfs_asker *a, char *path,
                    char *key);
void kfs_remote_herd_stop(struct kfs *fs);
/* "kcfsh:1:<ns>:<path>": key's in-flight mark (in the asker's own namespace only: TRUST), malloc'ed */
char *kfs_remote_herd_key(const char *key);
/* The last component of path. */
static inline const char *kfs_remote_base(const char *path)
{
        const char *s = __builtin_strrchr(path, '/');
        return s ? s + 1 : path;
}

/* publish.c */
void kfs_remote_pub_start(struct kfs *fs);
void kfs_remote_pub_stop(struct kfs *fs);

/* touch.c: on the publisher thread; the next deadline (monotonic ns) it must wake for */
int64_t kfs_remote_touch_due(struct kfs *fs, int64_t now);

#endif
