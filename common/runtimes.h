/* runtimes: what kcachefs knows of each runtime's cache, as data, in one place (runtimes.c).
 *
 * The daemon (fs/evict/units.c: recognition and units; fs/evict/prune.c: emptied directories; fs/options.c:
 * layout=) and kcache (env) read these descriptors; adding a runtime is one entry here, its recognition
 * and unit in fs/evict/units.c if its layout is not one file per entry, and its tests. What each runtime does
 * to its directory: ../shared/docs/runtimes.md and docs/design.md. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* The order is the index into krt_table. KRT_AUTO: recognised by layout; KRT_FILE: each file alone. */
enum krt {
        KRT_AUTO, KRT_FILE, KRT_NEO, KRT_SYCL, KRT_POCL, KRT_TRITON, KRT_JAX, KRT_CUDA,
        KRT_KCACHE, KRT_MESA, KRT_NUMBA, KRT_PYOPENCL, KRT_CCACHE, KRT_INDUCTOR, KRT_CUPY, KRT_TORCH_EXT,
        KRT__COUNT
};

struct krt_desc {
        const char *name;          /* in layout= and kcache env */
        const char *what;          /* for people: the runtime, as its users call it */
        /* kcache env: the subdirectory of the mount it makes (NULL: none), and the shell line it prints,
         * where @DIR@ stands for that directory. The runtime's own size limit is turned off or raised
         * past any cache, so that two evictors never fight. */
        const char *dir;
        const char *env;
        bool env_default;          /* printed by kcache env MOUNT with no runtime named */
        /* Names never evicted, wherever they are: the runtime's locks, size bookkeeping and settings
         * (NULL-terminated). Only names no other program's cache is likely to use. */
        const char *const *keep;
        /* Eviction leaves the directories it empties: the runtime makes a directory long before it stores
         * in it, or never again (fs/evict/prune.c, EMPTIED DIRECTORIES). */
        bool keeps_dirs;
        /* The directories the runtime makes inside the one it is given, by the start of their name
         * (Mesa's mesa_shader_cache*, PyOpenCL's pyopencl-compiler-cache-*, pytools' pdict-*): eviction
         * never removes them, emptied (NULL-terminated, or NULL). */
        const char *const *roots;
        /* Names never evicted directly in one of those roots, and only there: a common name (Mesa's
         * index) is the runtime's only in its own layout (NULL-terminated, or NULL). */
        const char *const *keep_in_root;
        /* Names never evicted by their directory's name and their own, fnmatch patterns on "dir/name"
         * (ccache's [0-9a-f]/stats): a common name that is the runtime's only in such a directory
         * (NULL-terminated, or NULL). */
        const char *const *keep_tail;
        /* The directory holds other programs' caches too (XDG_CACHE_HOME): kcache env does not mark it as
         * this runtime's (fs/evict/marks.c), and recognition goes by layout there. */
        bool dir_shared;
        /* Its temporary names (fnmatch patterns on a file's name), and those of the directories it writes
         * an entry in before it renames it into place: in flight, never evicted until older than tmp_age
         * (a crash leaked them). NULL-terminated, or NULL. */
        const char *const *temp;
        const char *const *temp_dirs;
        /* The names a compile's output is stored under (fnmatch patterns on a file's name): a lookup of one
         * that another node or process is compiling waits for it (fs/remote/herd.c). Never a directory's name, which
         * runtimes make long before they store, or as they probe. NULL-terminated, or NULL: no waiting. */
        const char *const *outputs;
        /* The runtime holds a lock of its own from its lookup through its compile (libkcache's, client/lock.c):
         * another of its processes on the compiling node waits on that lock, and is never told to look
         * again to wait in the daemon (fs/remote/herd.c, H7), where it would hold the lock the compile
         * waits for. */
        bool locks_compile;
};

extern const struct krt_desc krt_table[KRT__COUNT];

/* The runtime of that name (layout= and kcache env), or -1. */
int krt_by_name(const char *name);
/* Whether name (a file's last component) is one of some runtime's keep names, or a lock (*.lock). */
bool krt_is_kept_name(const char *name);
/* Whether the file at path (relative to the cache's root) is never evicted: a kept name, a name kept
 * in the runtime's own root directory, directly in one, or a "dir/name" tail kept (keep_tail). */
bool krt_is_kept_path(const char *path);
/* Whether the file at path (relative) is one of some runtime's temporary files, or in one of their
 * temporary directories. */
bool krt_is_temporary(const char *path);
/* Whether the directory at path is one a runtime makes inside the directory it is given (roots). */
bool krt_is_root_dir(const char *path);
/* Whether name is one a runtime stores a compile's output under (outputs). */
bool krt_is_output_name(const char *name);
/* Whether name is an output of a runtime that locks its compiles itself (locks_compile). */
bool krt_is_self_locked_output(const char *name);
/* Whether name is a lock file's: the bare name lock, or *.lock. */
bool krt_is_lock_name(const char *name);
