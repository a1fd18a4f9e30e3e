/* Internals shared by the files of libkcache (prefix kcache__). Not installed.
 *
 * Locks: kc->lock guards the trust list, the device identity cache and the in-process program table
 * (flight.c); counters are atomics; the trace has its own lock so lines never interleave. */
#ifndef KCACHE_INT_H
#define KCACHE_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>

#include "kcache-entry.h"
#include "kcache.h"

#ifndef KCACHE__EXPORT /* the layer defines it empty: it exports only its two entry points */
#define KCACHE__EXPORT __attribute__((visibility("default")))
#endif

struct kcache__flight;

struct kcache {
        char *dir;                      /* absolute path, as opened */
        int dirfd;                      /* O_PATH|O_DIRECTORY on dir */
        atomic_uint tmp_seq;            /* numbers temporary files */
        bool disabled;                  /* $KCACHE_DISABLE: every lookup misses, nothing is stored */
        uid_t *trusted;                 /* besides getuid() and 0; lock */
        size_t ntrusted;
        FILE *trace;                    /* NULL: no trace */
        bool trace_owned;               /* fclose() at close */
        pthread_mutex_t trace_lock;
        long lock_timeout_ms;
        size_t mem_capacity;            /* programs kept in memory */
        pthread_mutex_t lock;
        struct kcache__flight *flights; /* in-process table, see flight.c; lock */
        size_t nflights;                /* ready records in it; lock */
        uint64_t tick;                  /* LRU clock of the table; lock */
        void *cl;                       /* per-handle state of the OpenCL backend (cl-*.c); lock */
        void (*cl_close)(struct kcache *kc);
        void *ze;                       /* of the Level Zero backend (ze.c); lock */
        void (*ze_close)(struct kcache *kc);
        struct {
                atomic_uint_fast64_t hits, misses, rejects, stores, store_errors, compiles, memory_hits,
                        lock_waits, refreshes;
        } st;
};

/* trace.c */
/* Milliseconds on the monotonic clock, for the trace's timings and the lock's deadline. */
double kcache__now_ms(void);
__attribute__((format(printf, 2, 3))) void kcache__trace(kcache *kc, const char *fmt, ...);
/* Prints every field of a key record, one per line, under a heading naming its path. */
void kcache__trace_key(kcache *kc, const char *relpath, const struct kcache__key *key);
#define KCACHE__TRACING(kc) ((kc)->trace != NULL)

/* store.c: entries on disk. RELDIR is relative to the cache directory ("blob", "opencl/<slug>"). */
/* Path of the entry for KEY under RELDIR into out (PATH_MAX). */
void kcache__entry_path(const char *reldir, const struct kcache__key *key, char *out, size_t size);
/* Reads and verifies the entry; on success *ret_data is its payload (malloc; read straight into it,
 * not copied out of the whole file) and *ret_len its length. Errors: -ENOENT (a miss; unusable entries
 * are reported, counted and removed), -ENOMEM, -EIO. */
int kcache__entry_load(kcache *kc, const char *relpath, const struct kcache__key *key, void **ret_data,
                       size_t *ret_len);
/* Publishes an entry (temp file + rename), creating RELDIR as needed. Errors: see kcache_put(). */
int kcache__entry_store(kcache *kc, const char *relpath, const struct kcache__key *key, const void *data,
                        size_t len);
/* mkdir -p of RELDIR under the cache directory. Returns 0 or -errno. */
int kcache__make_dirs(kcache *kc, const char *reldir);
/* Removes an entry that is unusable or that the driver rejected. */
void kcache__entry_remove(kcache *kc, const char *relpath);

/* lock.c: one compilation per node. A byte-range lock in RELDIR/.kcache.lock at an offset taken from
 * the key; waits at most kc->lock_timeout_ms. Returns an fd to pass to kcache__unlock(), or -1 when
 * no lock could be had (the caller compiles anyway). *ret_waited: whether another process held it. */
int kcache__lock(kcache *kc, const char *reldir, const struct kcache__key *key, bool *ret_waited);
void kcache__unlock(int fd);

/* flight.c: in-process single flight and the bounded table of built objects.
 *
 * kcache__flight_begin() looks (owner, hash) up. If an object is ready it returns KCACHE__FLIGHT_READY
 * with *obj retained by the table's RETAIN callback for the caller. If another thread is building it,
 * waits and returns that thread's outcome (READY with the object, or FAILED with its error in *err and
 * the object it reported, retained, possibly NULL). Otherwise it returns KCACHE__FLIGHT_BUILD and the
 * caller must call kcache__flight_end() exactly once with its outcome. */
struct kcache__obj_ops {
        void (*retain)(kcache *kc, void *obj);
        void (*release)(kcache *kc, void *obj);
        /* Called (under kc->lock) before a kept object leaves the table; may store, never lock. */
        void (*leave)(kcache *kc, void *obj, void *data);
        void (*free_data)(void *data); /* frees the backend's per-object record */
};
enum { KCACHE__FLIGHT_BUILD, KCACHE__FLIGHT_READY, KCACHE__FLIGHT_FAILED };
int kcache__flight_begin(kcache *kc, const void *owner, struct kcache__hash h, const struct kcache__obj_ops *ops,
                         void **obj, int *err);
/* OBJ is retained by the table if kept (err == 0 and capacity > 0). DATA is the backend's per-object
 * record (freed with ops->free_data when the record goes), or NULL; OPS as given to begin. */
void kcache__flight_end(kcache *kc, const void *owner, struct kcache__hash h, const struct kcache__obj_ops *ops,
                        void *obj, int err, void *data);
/* Calls FN on every ready object (under kc->lock: FN must not call back into the table). */
void kcache__flight_each(kcache *kc, void (*fn)(kcache *kc, void *obj, void *data, void *arg), void *arg);
/* Drops every object of OWNER (NULL: all). */
void kcache__flight_forget(kcache *kc, const void *owner);

/* Returns true if the file described by ST may be loaded: a regular file owned by a trusted uid and
 * writable by nobody else. Sets *why to a reason otherwise. */
bool kcache__trusted(kcache *kc, const struct stat *st, const char **why);

/* spirv.c: the byte sizes of the specialization constants IDS[0..n) of a SPIR-V module into sizes.
 * Returns 0, -ENOENT if an id is not declared, -EINVAL if IL is not SPIR-V, -ENOMEM. */
int kcache__spirv_spec_sizes(const void *il, size_t len, uint32_t n, const uint32_t *ids, size_t *sizes);

/* Turns S into a lowercase slug of [a-z0-9-], at most MAX bytes, into out. */
void kcache__slug(const char *s, char *out, size_t max);

#endif
