/* libkcache: a persistent, verified cache of compiled kernels and other blobs, kept in a kcachefs
 * mount or in any plain directory.
 *
 * A cache handle names one directory. Entries are files under it, laid out for people:
 *
 *     DIR/blob/<32 hex digits>.kce                       kcache_put()/kcache_get()
 *     DIR/opencl/<device slug>-<8 hex>/<32 hex>.kce      kcache_cl.h
 *     DIR/level-zero/<device slug>-<8 hex>/<32 hex>.kce  kcache_ze.h
 *
 * The 32 hex digits are the XXH3-128 hash of the key record: a canonical, versioned encoding of
 * everything the result depends on (see kcache_cl.h and kcache_ze.h for the fields). Every entry
 * carries its own size, the whole key record and a checksum of its payload, so a truncated, corrupted,
 * foreign or colliding file is never returned: it is a miss, reported by the trace and removed.
 * Entries are published by writing a temporary file and renaming it, so a reader sees an old entry,
 * a new one, or none.
 *
 * Trust. A cache can be shared by the users of a node. An entry written by another user is code that
 * would run as you, so by default an entry is used only if the file is owned by the calling user or
 * by root and is writable by nobody else. kcache_trust_uid() and $KCACHE_TRUST_UIDS widen that.
 *
 * Environment (read by kcache_open()):
 *   KCACHE_DIR              the cache directory when kcache_open() is given NULL
 *   KCACHE_TRACE            1 or stderr: trace to stderr; any other value: append to that file. The
 *                           trace prints every field that went into a key and each hit, miss, reject,
 *                           compile and store, so a user can see why a kernel missed.
 *   KCACHE_TRUST_UIDS       comma-separated uids whose entries are used besides yours and root's
 *   KCACHE_LOCK_TIMEOUT_MS  how long a process waits for another that compiles the same kernel before
 *                           compiling it itself (default 120000)
 *   KCACHE_MEM_PROGRAMS     built programs kept per handle in memory (default 256; 0 disables)
 *   KCACHE_DISABLE          1: every lookup misses and nothing is stored (compiling still works)
 *
 * Threads: a handle may be used by any number of threads at once.
 *
 * Errors are negative errno values; kcache_strerror() describes them. Each function lists its own. */
#ifndef KCACHE_H
#define KCACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KCACHE_VERSION_MAJOR 0
#define KCACHE_VERSION_MINOR 1

typedef struct kcache kcache;

/* Opens the cache in DIR, creating the directory (and its parents) if needed.
 * DIR NULL: $KCACHE_DIR, else $XDG_CACHE_HOME/kcache, else $HOME/.cache/kcache.
 * On success *ret is a new handle, to be closed with kcache_close().
 * Errors:
 *   -EINVAL   ret is NULL, or no directory could be chosen (no DIR, $KCACHE_DIR, $XDG_CACHE_HOME or
 *             $HOME): pass a directory or set KCACHE_DIR.
 *   -ENOTDIR  DIR exists and is not a directory: point it elsewhere.
 *   -EACCES   DIR cannot be created or searched: fix its permissions or choose another.
 *   -ENOMEM   out of memory.
 *   other     as mkdir(2) and open(2) return them. */
int kcache_open(const char *dir, kcache **ret);

/* Releases everything the handle holds. Before that, programs built through kcache_cl.h whose driver
 * produced a fuller binary since they were stored (PoCL compiles per local size at the first launch)
 * are stored again, so the next process starts warm. NULL is allowed. */
void kcache_close(kcache *kc);

/* Looks up the entry stored under the KEYLEN bytes at KEY (any bytes the caller chooses).
 * On a hit returns 0 and sets *ret_data to a malloc()ed copy of the payload (free it with
 * kcache_free() or free()) and *ret_len to its length. Nothing is written on failure.
 * Errors:
 *   -ENOENT   miss: no entry, or the entry was unusable (truncated, corrupted, another format, a hash
 *             collision, not trusted); the trace says which. Compute the value and kcache_put() it.
 *   -EINVAL   kc, key, ret_data or ret_len is NULL, or keylen is 0.
 *   -ENOMEM   out of memory.
 *   -EIO      the entry could not be read (the trace names the errno). Treat as a miss. */
int kcache_get(kcache *kc, const void *key, size_t keylen, void **ret_data, size_t *ret_len);

/* Stores LEN bytes at DATA under KEY, replacing any entry with the same key. Atomic: a reader sees the
 * old entry, the new one, or none.
 * Errors:
 *   -EINVAL   kc or key is NULL, keylen is 0, or data is NULL with len > 0.
 *   -EFBIG    key or payload larger than 1 GiB.
 *   -ENOSPC, -EDQUOT  the cache filesystem is full (kcachefs evicts to make room, so on a kcachefs
 *             mount this means the entry is larger than the cache).
 *   -EACCES, -EPERM   the directory is not writable by you, or the entry there belongs to another user
 *             in a sticky directory: nothing was stored; the application keeps working uncached.
 *   -EROFS    the cache is on a read-only filesystem.
 *   -ENOMEM   out of memory.
 *   other     as write(2) and rename(2) return them. */
int kcache_put(kcache *kc, const void *key, size_t keylen, const void *data, size_t len);

/* Frees a payload returned by kcache_get(). NULL is allowed. */
void kcache_free(void *data);

/* Also uses entries owned by UID (besides the caller's and root's).
 * Errors: -EINVAL kc is NULL; -ENOMEM out of memory. */
int kcache_trust_uid(kcache *kc, uid_t uid);

/* The directory the handle uses (absolute), valid until kcache_close(). */
const char *kcache_dir(const kcache *kc);

/* Counters since kcache_open(), for applications and tests. */
struct kcache_stats {
        uint64_t hits;          /* lookups answered from an entry */
        uint64_t misses;        /* lookups without a usable entry (rejects included) */
        uint64_t rejects;       /* entries refused: corrupt, untrusted, or rejected by the driver */
        uint64_t stores;        /* entries written (refreshes included) */
        uint64_t store_errors;  /* entries that could not be written */
        uint64_t compiles;      /* programs compiled by this handle (kcache_cl.h, kcache_ze.h) */
        uint64_t memory_hits;   /* programs handed out from memory, without touching the directory */
        uint64_t lock_waits;    /* times this handle waited for another process compiling a kernel */
        uint64_t refreshes;     /* entries stored again with a fuller binary */
};
void kcache_get_stats(const kcache *kc, struct kcache_stats *ret);

/* A sentence for a negative errno returned by this library, naming a likely remedy. Never NULL. */
const char *kcache_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
