/* units.c: what one eviction removes, per runtime (../shared/docs/runtimes.md).
 *
 * Eviction (choose.c) walks files in LRU order. For each file this file answers two questions:
 *   1. Is it protected? Lock and bookkeeping files never go; in-flight temporary files go only once
 *      older than tmp_age (a crash leaked them: nobody will finish them).
 *   2. Which unit does it belong to? The unit is the runtime's logical entry: all of it goes, in the
 *      runtime's safe order, or none of it. Its recency is its newest member's (choose.c).
 *
 *   runtime  recognised by                                   unit, in deletion order
 *   NEO      <16 hex>.cl_cache / .l0_cache / .ocloc_cache    the file; then config.file is repaired
 *   SYCL     <n>.bin, <n>.src, <n>_access_time.txt           .bin, .src, _access_time.txt; only while
 *                                                            <n>.lock is absent; then cache_size.txt
 *   JAX      <key>-cache, <key>-atime                        -cache, then -atime
 *   Triton   a 52-char base32 key directory with __grp__*     __grp__*.json, *.json, the rest; only while
 *                                                            no young tmp.pid_* is in it
 *   PoCL     <2 chars>/<37-38 chars>/ holding PoCL's files     program.bc, then every other file below it;
 *                                                            without program.bc: a store in flight, busy
 *                                                            until older than tmp_age
 *   CUDA     the directory holding the driver's `index`      index first, then every file below it
 *            (not Mesa's mesa_shader_cache*, whose <2 hex>/<38 hex> entries go one by one: "other")
 *   Numba    <stem>.nbi, <stem>.<n>.nbc                      .nbi, then the .nbc files
 *   PyOpenCL pyopencl-compiler-cache-.../<32 hex>/           info, then the rest; only while the cache's
 *                                                            lock is absent
 *   pytools  pdict-.../<3 hex>/<3 hex>/<hex>/ {key, contents} contents, key; the emptied directory goes
 *                                                            too (a WriteOncePersistentDict never stores
 *                                                            into an existing one)
 *   other    -                                               the file
 * What each runtime keeps (locks, bookkeeping, settings), its temporary names, the directories kcache env
 * gives them and whether eviction removes the directories it empties are data: common/runtimes.c. How
 * its entries are recognised and ordered is a function here, listed in `recognisers`.
 * A mount option (layout=) forces a runtime for the whole mount or per subdirectory, for layouts the
 * markers cannot recognise (and to turn recognition off: layout=file).
 *
 * Everything here reads the backing tree beneath fs->tree.root, through common/tree.h; nothing here changes it. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

static const char *base_of(const char *path)
{
        const char *s = strrchr(path, '/');
        return s ? s + 1 : path;
}

static bool ends_with(const char *s, const char *suffix)
{
        size_t a = strlen(s), b = strlen(suffix);
        return a >= b && !strcmp(s + a - b, suffix);
}

static bool all_of(const char *s, size_t n, int (*pred)(int))
{
        for (size_t i = 0; i < n; i++)
                if (!pred((unsigned char)s[i]))
                        return false;
        return true;
}

static int is_base32(int c)
{
        return (c >= 'A' && c <= 'Z') || (c >= '2' && c <= '7');
}

/* In-flight temporary files of the runtimes (and anything under a tmp/ or tmp.pid_* directory). */
/* A runtime's temporary file, or one in a runtime's temporary directory (common/runtimes.c). */
static bool is_temporary(const char *path)
{
        return krt_is_temporary(path);
}

bool kev_unit_protected(const struct kfs *fs, const char *path, int64_t atime_ns, int64_t now_ns)
{
        if (krt_is_kept_path(path)) /* locks, bookkeeping, settings (common/runtimes.c) */
                return true;
        if (is_temporary(path))
                return now_ns - atime_ns < (int64_t)(fs->o.tmp_age * 1e9);
        return false;
}

/* The forced runtime for path: from -o layout= (the longest matching prefix wins), else from the mark of
 * the directory kcache env made (marks.c), else KRT_AUTO. */
static enum krt forced(struct kfs *fs, const char *path)
{
        enum krt rt = KRT_AUTO;
        size_t best = 0;
        for (size_t i = 0; i < fs->o.nlayouts; i++) {
                const char *dir = fs->o.layouts[i].dir;
                size_t l = strlen(dir);
                bool match = l == 0 || (!strncmp(path, dir, l) && path[l] == '/');
                if (match && (l >= best || rt == KRT_AUTO)) {
                        best = l;
                        rt = fs->o.layouts[i].rt;
                }
        }
        return rt != KRT_AUTO ? rt : kev_mark_of(fs, path);
}

static int add_member(struct kev_unit *u, const char *dir, const char *name)
{
        char **m = realloc(u->members, (u->n + 1) * sizeof(*m));
        if (!m)
                return -ENOMEM;
        u->members = m;
        if (asprintf(&m[u->n], "%s%s%s", dir, *dir ? "/" : "", name) < 0)
                return -ENOMEM;
        u->n++;
        return 0;
}

/* Paths here are read from the index and resolved beneath the root without following a symlink
 * (tree.h): what a user renamed or swapped meanwhile is found missing, never followed elsewhere. */
static bool exists_at(struct kfs *fs, const char *dir, const char *name)
{
        struct stat st;
        int fd = ktree_open(&fs->tree, KTREE_ROOT, dir, O_PATH | O_DIRECTORY, 0);
        bool r = fd >= 0 && fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
        if (fd >= 0)
                close(fd);
        return r;
}

/* Whether the directory dir (relative) holds a directory. */
static bool has_subdir(struct kfs *fs, const char *dir)
{
        DIR *d = ktree_opendir(&fs->tree, KTREE_ROOT, dir);
        bool found = false;
        struct dirent *de;
        while (d && !found && (de = readdir(d)))
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                        struct stat st;
                        found = de->d_type == DT_DIR ||
                                (de->d_type == DT_UNKNOWN && fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                                 S_ISDIR(st.st_mode));
                }
        if (d)
                closedir(d);
        return found;
}

/* dir (relative) of path; "" for the root. */
static char *dir_of(const char *path)
{
        const char *s = strrchr(path, '/');
        return s ? strndup(path, (size_t)(s - path)) : strdup("");
}

/* The ancestor of dir (itself included, up to levels up) that holds name, or NULL. */
static char *ancestor_with(struct kfs *fs, const char *dir, const char *name, int levels)
{
        char *d = strdup(dir);
        for (int i = 0; d && i <= levels; i++) {
                if (exists_at(fs, d, name))
                        return d;
                if (!*d)
                        break;
                char *s = strrchr(d, '/');
                if (s)
                        *s = '\0';
                else
                        d[0] = '\0';
        }
        free(d);
        return NULL;
}

/* Every regular file below dir (relative), recursively, with name-ordering hints. */
static int add_tree(struct kfs *fs, struct kev_unit *u, const char *dir, int depth)
{
        if (depth > 16)
                return -ELOOP;
        DIR *d = ktree_opendir(&fs->tree, KTREE_ROOT, dir);
        if (!d)
                return -errno;
        int r = 0;
        struct dirent *de;
        while (r == 0 && (de = readdir(d))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                if (de->d_type == DT_DIR) {
                        char *sub = NULL;
                        r = asprintf(&sub, "%s/%s", dir, de->d_name) < 0 ? -ENOMEM : add_tree(fs, u, sub, depth + 1);
                        free(sub);
                } else if (de->d_type == DT_REG) {
                        r = add_member(u, dir, de->d_name);
                }
        }
        closedir(d);
        return r;
}

/* Moves the members whose names satisfy pred to the front, keeping their order. */
static void to_front(struct kev_unit *u, bool (*pred)(const char *name))
{
        size_t k = 0;
        for (size_t i = 0; i < u->n; i++)
                if (pred(base_of(u->members[i]))) {
                        char *m = u->members[i];
                        memmove(&u->members[k + 1], &u->members[k], (i - k) * sizeof(char *));
                        u->members[k++] = m;
                }
}

static bool is_grp_json(const char *n)
{
        return !strncmp(n, "__grp__", 7) && ends_with(n, ".json");
}

static bool is_json(const char *n)
{
        return ends_with(n, ".json") && !is_grp_json(n);
}

static bool is_program_bc(const char *n)
{
        return !strcmp(n, "program.bc");
}

static bool is_cuda_index(const char *n)
{
        return !strcmp(n, "index");
}

/* Mesa's multi-file shader cache: <dir>/mesa_shader_cache (Mesa appends that name to
 * MESA_SHADER_CACHE_DIR too), an index every GL process mmaps, and <2 hex>/<38 hex> entries, each its own
 * unit (Mesa checks each entry's key and CRC: a missing one is a miss). Its index is bookkeeping. */
static bool is_mesa_dir(const char *d)
{
        return !strncmp(base_of(d), "mesa_shader_cache", 17);
}

static bool neo_name(const char *n)
{
        const char *dot = strchr(n, '.');
        return dot && dot - n == 16 && all_of(n, 16, isxdigit) &&
               (!strcmp(dot, ".cl_cache") || !strcmp(dot, ".l0_cache") || !strcmp(dot, ".ocloc_cache"));
}

/* SYCL: "<digits>.bin", "<digits>.src", "<digits>_access_time.txt" -> digits length, else 0. */
static size_t sycl_key(const char *n)
{
        size_t k = strspn(n, "0123456789");
        if (k == 0)
                return 0;
        return !strcmp(n + k, ".bin") || !strcmp(n + k, ".src") || !strcmp(n + k, "_access_time.txt") ? k : 0;
}

/* The nearest directory above path (its own directory first, at most levels up) that is_unit_dir()
 * accepts, or NULL. Returns a malloc'ed relative path. */
static char *ancestor_where(struct kfs *fs, const char *path, int levels,
                            bool (*is_unit_dir)(struct kfs *fs, const char *dir, const char *path))
{
        char *d = dir_of(path);
        for (int i = 0; d && i < levels && *d; i++) {
                if (is_unit_dir(fs, d, path))
                        return d;
                char *s = strrchr(d, '/');
                if (!s)
                        break;
                *s = '\0';
        }
        free(d);
        return NULL;
}

/* Triton: a 52-char base32 key directory holding a __grp__*.json. */
static bool is_triton_dir(struct kfs *fs, const char *d, const char *path)
{
        const char *b = base_of(d);
        if (strlen(b) != 52 || !all_of(b, 52, is_base32))
                return false;
        if (forced(fs, path) == KRT_TRITON)
                return true;
        DIR *dd = ktree_opendir(&fs->tree, KTREE_ROOT, d);
        bool grp = false;
        struct dirent *de;
        while (dd && !grp && (de = readdir(dd)))
                grp = is_grp_json(de->d_name);
        if (dd)
                closedir(dd);
        return grp;
}

/* PoCL: a program directory <2 chars>/<37-38 chars>/ holding any of PoCL's files (program.bc comes
 * last when PoCL stores a program, so a store in flight has the others without it). */
static bool is_pocl_dir(struct kfs *fs, const char *d, const char *path)
{
        size_t bl = strlen(base_of(d));
        const char *slash = strrchr(d, '/');
        if (!slash || (bl != 37 && bl != 38))
                return false;
        const char *p = slash;
        while (p > d && p[-1] != '/')
                p--;
        return slash - p == 2 && (forced(fs, path) == KRT_POCL || exists_at(fs, d, "program.bc") ||
                                  exists_at(fs, d, "build.log") || exists_at(fs, d, "last_accessed"));
}

/* Numba: per function <stem>.nbi (its index of signatures) and <stem>.<n>.nbc (one per signature), where
 * stem is <module>.<qualname>-<line>.py<ver>. The length of the stem, or 0. */
static size_t numba_stem(const char *n)
{
        size_t l = strlen(n);
        if (l > 4 && !strcmp(n + l - 4, ".nbi"))
                return l - 4;
        if (l < 6 || strcmp(n + l - 4, ".nbc"))
                return 0;
        size_t e = l - 4, b = e;
        while (b > 0 && isdigit((unsigned char)n[b - 1]))
                b--;
        return b < e && b > 1 && n[b - 1] == '.' ? b - 1 : 0;
}

static int by_name(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_nbi(const char *n)
{
        return ends_with(n, ".nbi");
}

static bool is_info(const char *n)
{
        return !strcmp(n, "info");
}

static bool is_contents(const char *n)
{
        return !strcmp(n, "contents");
}

static bool all_hex(const char *s, size_t n)
{
        return strlen(s) == n && all_of(s, n, isxdigit);
}

/* The name of d's parent directory (up levels), copied into buf; "" where there is none. */
static const char *up_name(const char *d, int levels, char *buf, size_t size)
{
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof(tmp), "%s", d);
        for (int i = 0; i < levels; i++) {
                char *s = strrchr(tmp, '/');
                if (!s) {
                        buf[0] = '\0';
                        return buf;
                }
                *s = '\0';
        }
        snprintf(buf, size, "%s", base_of(tmp));
        return buf;
}

/* Mesa-DB (MESA_DISK_CACHE_DATABASE): mesa_shader_cache_db/part<N>/mesa_cache.{db,idx}, a part's two files
 * that Mesa keeps consistent with each other and wipes when they are not: the part goes whole. */
static bool is_mesa_db_part(struct kfs *fs, const char *d, const char *path)
{
        char b[PATH_MAX];
        const char *n = base_of(path);
        (void)fs;
        return !strncmp(base_of(d), "part", 4) && !strncmp(up_name(d, 1, b, sizeof(b)), "mesa_shader_cache_db", 20) &&
               (!strcmp(n, "mesa_cache.db") || !strcmp(n, "mesa_cache.idx"));
}

static bool is_db_file(const char *n)
{
        return ends_with(n, ".db");
}

/* Whether dir/name, a lock file a runtime makes with O_EXCL and holds while it reads or writes its cache,
 * exists and is not the lock of the process whose write this eviction makes room for (kev_writer): that
 * process is inside its own store, and no other is inside the cache. Without that exception, a store
 * that needs room could evict none of its runtime's entries (CI's ASan pass: PyOpenCL's write of a binary
 * failed with ENOSPC while its lock made every other entry busy). */
static bool lock_held_by_other(struct kfs *fs, const char *dir, const char *name)
{
        struct stat st;
        int fd = ktree_open(&fs->tree, KTREE_ROOT, dir, O_PATH | O_DIRECTORY, 0);
        int r = fd < 0 ? fd : fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
        if (fd >= 0)
                close(fd);
        if (r < 0)
                return false; /* no lock: nobody is inside */
        if (!kev_writer)
                return true;
        pthread_mutex_lock(&fs->itable_lock);
        struct kfs_inode *in = kfs_inode_find_locked(fs, st.st_ino);
        pid_t creator = in ? in->creator : 0;
        pthread_mutex_unlock(&fs->itable_lock);
        return !creator || creator != kfs_tgid_of(kev_writer);
}

/* PyOpenCL's compiler cache: <cache>/pyopencl-compiler-cache-v2-py<ver>/<32 hex md5>/{info,binary,source.cl},
 * written in place under the cache's one lock file (lock, O_CREAT|O_EXCL). */
static bool is_pyopencl_dir(struct kfs *fs, const char *d, const char *path)
{
        char b[PATH_MAX];
        return all_hex(base_of(d), 32) &&
               (forced(fs, path) == KRT_PYOPENCL ||
                !strncmp(up_name(d, 1, b, sizeof(b)), "pyopencl-compiler-cache-", 24));
}

/* pytools' PersistentDict (PyOpenCL's invoker cache): <container pdict-*>/<3 hex>/<3 hex>/<rest>/{key,
 * contents}. A WriteOncePersistentDict never stores over an existing item directory: the directory goes
 * with its files, or the key is dead for good. */
static bool is_pdict_item(struct kfs *fs, const char *d, const char *path)
{
        char b1[PATH_MAX], b2[PATH_MAX], c[PATH_MAX];
        (void)fs;
        (void)path;
        return strlen(base_of(d)) >= 20 && all_of(base_of(d), strlen(base_of(d)), isxdigit) &&
               all_hex(up_name(d, 1, b1, sizeof(b1)), 3) && all_hex(up_name(d, 2, b2, sizeof(b2)), 3) &&
               !strncmp(up_name(d, 3, c, sizeof(c)), "pdict-", 6);
}

/* A unit that is a whole directory d (taken over), every file below it, first(name) ones first. */
static int whole_dir_unit(struct kfs *fs, struct kev_unit *u, enum krt rt, char *d, bool (*first)(const char *))
{
        u->rt = rt;
        free(u->root);
        u->root = d;
        u->dir_unit = true;
        int r = add_tree(fs, u, d, 0);
        to_front(u, first);
        return r;
}

/* What a recogniser is given: the file's path (relative to the root), its name and its directory, and the
 * runtime forced there (-o layout=, a runtime's mark: forced()), or KRT_AUTO. */
struct file_at {
        const char *path, *name, *dir;
        enum krt forced;
};

/* JAX: <key>-cache and <key>-atime, -cache first. */
static int jax_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        if (!ends_with(f->name, "-cache") && !ends_with(f->name, "-atime"))
                return 0;
        char key[NAME_MAX + 1], c[NAME_MAX + 8], a[NAME_MAX + 8];
        snprintf(key, sizeof(key), "%.*s", (int)(strlen(f->name) - 6), f->name);
        snprintf(c, sizeof(c), "%s-cache", key);
        snprintf(a, sizeof(a), "%s-atime", key);
        int r = 0;
        if (exists_at(fs, f->dir, c))
                r = add_member(u, f->dir, c);
        if (r == 0 && exists_at(fs, f->dir, a))
                r = add_member(u, f->dir, a);
        /* One .lockfile guards the whole directory: the eviction asks it when it chooses (choose.c, ONE
         * VERDICT PER LOCK) and again when it removes (remove.c, runtime_lock). */
        if (r == 0 && !(u->lock_dir = strdup(f->dir)))
                r = -ENOMEM;
        return r < 0 ? r : 1;
}

/* SYCL: <n>.bin, <n>.src, <n>_access_time.txt, in that order, only while <n>.lock is absent; then its
 * cache_size.txt is repaired. */
static int sycl_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        size_t k = sycl_key(f->name);
        if (!k)
                return 0;
        char n[32], p[64];
        snprintf(n, sizeof(n), "%.*s", (int)k, f->name);
        snprintf(p, sizeof(p), "%s.lock", n);
        u->busy = exists_at(fs, f->dir, p); /* SYCL holds the entry: not now */
        static const char *const suffix[] = { ".bin", ".src", "_access_time.txt" };
        int r = 0;
        for (int i = 0; r == 0 && i < 3; i++) {
                snprintf(p, sizeof(p), "%s%s", n, suffix[i]);
                if (exists_at(fs, f->dir, p))
                        r = add_member(u, f->dir, p);
        }
        u->repair = ancestor_with(fs, f->dir, KFS_SYCL_SIZE_FILE, 5);
        return r < 0 ? r : 1;
}

/* Triton: its key directory, __grp__*.json first, then the other .json, then the binaries; busy while a
 * store is in flight (tmp.pid_*). */
static int triton_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        char *d = ancestor_where(fs, f->path, 3, is_triton_dir);
        if (!d)
                return 0;
        free(u->root);
        u->root = d;
        int r = add_tree(fs, u, d, 0);
        for (size_t i = 0; r == 0 && i < u->n; i++)
                if (is_temporary(u->members[i]))
                        u->busy = true; /* a store in flight (or leaked: collected alone, when old) */
        to_front(u, is_json);
        to_front(u, is_grp_json);
        return r < 0 ? r : 1;
}

/* PoCL: the program directory <2>/<37-38>/, program.bc first; without program.bc a store in flight
 * (busy) until older than tmp_age (leaked). */
static int pocl_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        char *d = ancestor_where(fs, f->path, 4, is_pocl_dir);
        if (!d)
                return 0;
        int r = whole_dir_unit(fs, u, KRT_POCL, d, is_program_bc);
        struct stat st;
        if (r == 0 && !exists_at(fs, d, "program.bc") && ktree_stat(&fs->tree, KTREE_ROOT, d, &st) == 0 &&
            kfs_now_ns() - ((int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec) <
                    (int64_t)(fs->o.tmp_age * 1e9))
                u->busy = true;
        return r < 0 ? r : 1;
}

/* Mesa-DB: a part's two files together, the database first. */
static int mesa_db_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        char *d = ancestor_where(fs, f->path, 1, is_mesa_db_part);
        if (!d)
                return 0;
        int r = whole_dir_unit(fs, u, KRT_MESA, d, is_db_file);
        return r < 0 ? r : 1;
}

/* Numba: a function's .nbi index first, then its .nbc data, in name order. */
static int numba_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        size_t k = numba_stem(f->name);
        if (!k)
                return 0;
        int r = 0;
        DIR *dd = ktree_opendir(&fs->tree, KTREE_ROOT, f->dir);
        struct dirent *de;
        while (r == 0 && dd && (de = readdir(dd)))
                if (numba_stem(de->d_name) == k && !strncmp(de->d_name, f->name, k))
                        r = add_member(u, f->dir, de->d_name);
        if (dd)
                closedir(dd);
        qsort(u->members, u->n, sizeof(*u->members), by_name); /* the same order on every run */
        to_front(u, is_nbi); /* the index first: without it, the function is a clean miss */
        return r < 0 ? r : 1;
}

/* PyOpenCL's compiler cache: a key directory, info first, not while the cache's lock is another's. */
static int pyopencl_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        char *d = ancestor_where(fs, f->path, 1, is_pyopencl_dir);
        if (!d)
                return 0;
        int r = whole_dir_unit(fs, u, KRT_PYOPENCL, d, is_info); /* without info: a clean miss */
        char *cache = dir_of(d);
        u->busy = cache && lock_held_by_other(fs, cache, "lock"); /* PyOpenCL reads and writes under it */
        u->lock_dir = cache; /* one lock for the whole cache: one verdict per eviction (choose.c) */
        return r < 0 ? r : 1;
}

/* pytools' item directory: contents, then key, then the directory. */
static int pdict_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        char *d = ancestor_where(fs, f->path, 1, is_pdict_item);
        if (!d)
                return 0;
        int r = whole_dir_unit(fs, u, KRT_PYOPENCL, d, is_contents);
        return r < 0 ? r : 1;
}

/* The CUDA driver's cache: the directory of its index, which sits above hashed subdirectories (a file
 * below one, or the index beside them), index first. A lone "index" elsewhere is not it, and neither is
 * Mesa's, whose entries go one by one. */
static int cuda_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        char *d = ancestor_with(fs, f->dir, "index", 3);
        if (!d)
                return 0;
        if (f->forced != KRT_CUDA && (is_mesa_dir(d) || (!strcmp(d, f->dir) && !has_subdir(fs, d)))) {
                free(d);
                return 0;
        }
        int r = whole_dir_unit(fs, u, KRT_CUDA, d, is_cuda_index);
        return r < 0 ? r : 1;
}

/* NEO: a binary alone; then its config.file is repaired. */
static int neo_unit(struct kfs *fs, const struct file_at *f, struct kev_unit *u)
{
        if (!neo_name(f->name) && f->forced != KRT_NEO)
                return 0;
        u->repair = ancestor_with(fs, f->dir, KFS_NEO_SIZE_FILE, 2);
        int r = add_member(u, f->dir, f->name);
        return r < 0 ? r : 1;
}

/* The runtimes' recognisers, in the order they are tried: the first that knows the file makes its unit.
 * A runtime's data (its name, environment, what it keeps) is common/runtimes.c; adding a runtime whose
 * entries are more than one file is a function above and a line here. */
static const struct recogniser {
        enum krt rt;
        int (*unit)(struct kfs *fs, const struct file_at *f, struct kev_unit *u); /* 1: it is; 0; -errno */
} recognisers[] = {
        { KRT_JAX, jax_unit }, { KRT_SYCL, sycl_unit }, { KRT_TRITON, triton_unit }, { KRT_POCL, pocl_unit },
        { KRT_MESA, mesa_db_unit }, { KRT_NUMBA, numba_unit }, { KRT_PYOPENCL, pyopencl_unit },
        { KRT_PYOPENCL, pdict_unit }, { KRT_CUDA, cuda_unit }, { KRT_NEO, neo_unit },
};

int kev_unit_resolve(struct kfs *fs, const char *path, struct kev_unit *u)
{
        memset(u, 0, sizeof(*u));
        struct file_at f = { .path = path, .name = base_of(path), .forced = forced(fs, path) };
        char *dir = dir_of(path);
        if (!dir)
                return -ENOMEM;
        f.dir = dir;
        u->root = dir; /* the recogniser may put a directory of its own in its place */
        u->forced = f.forced;
        if (f.forced != KRT_FILE && !is_temporary(path))
                for (size_t i = 0; i < sizeof(recognisers) / sizeof(*recognisers); i++) {
                        /* A forced runtime's own rules only; Inductor's directory also holds the Triton
                         * cache it compiles into (TORCHINDUCTOR_CACHE_DIR/triton/<device>/<key>/), whose
                         * key directories go whole as anywhere else. */
                        bool inductor_triton = f.forced == KRT_INDUCTOR && recognisers[i].rt == KRT_TRITON;
                        if (f.forced != KRT_AUTO && f.forced != recognisers[i].rt && !inductor_triton)
                                continue;
                        u->rt = recognisers[i].rt;
                        int r = recognisers[i].unit(fs, &f, u);
                        if (r != 0)
                                return r < 0 ? r : 0;
                        u->rt = KRT_AUTO;
                }
        u->rt = KRT_FILE;
        return add_member(u, dir, f.name);
}

void kev_unit_free(struct kev_unit *u)
{
        for (size_t i = 0; i < u->n; i++)
                free(u->members[i]);
        free(u->members);
        free(u->root);
        free(u->repair);
        free(u->lock_dir);
        memset(u, 0, sizeof(*u));
}


