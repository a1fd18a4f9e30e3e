/* runtimes.c: the runtime descriptors (runtimes.h). */
#include <string.h>

#include "runtimes.h"

static const char *const neo_keep[] = { "config.file", NULL };          /* its size count, under its flock */
static const char *const sycl_keep[] = { "cache_size.txt", NULL };      /* its size, under cache_size.txt.lock */
static const char *const jax_keep[] = { ".lockfile", NULL };            /* py-filelock, around every get and put */
static const char *const mesa_roots[] = { "mesa_shader_cache", NULL }; /* also mesa_shader_cache_db */
static const char *const mesa_keep_in_root[] = { "index", NULL };      /* every GL process maps it */
static const char *const pyopencl_roots[] = { "pyopencl-compiler-cache-", "pdict-", NULL };
static const char *const lock_keep[] = { "lock", NULL };                /* the bare name: a lock file */
static const char *const ccache_keep[] = { "ccache.conf", NULL };       /* its settings (max_size among them) */

/* ccache's stats files (one per directory, 272 of them) are counters ccache rewrites as it goes: they
 * are evicted like its results, by recency, instead of holding 1 MiB of a small cache for good. */
const struct krt_desc krt_table[KRT__COUNT] = {
        [KRT_AUTO] = { "auto", "recognised by its layout", NULL, NULL, false, NULL, false },
        [KRT_FILE] = { "file", "one file per entry", NULL, NULL, false, NULL, false },
        [KRT_NEO] = { "neo", "Intel NEO (OpenCL, Level Zero)", "neo",
                      "export NEO_CACHE_PERSISTENT=1 NEO_CACHE_DIR='@DIR@' NEO_CACHE_MAX_SIZE=0", true, neo_keep,
                      true },
        [KRT_SYCL] = { "sycl", "SYCL / DPC++", "sycl",
                       "export SYCL_CACHE_PERSISTENT=1 SYCL_CACHE_DIR='@DIR@'; unset SYCL_CACHE_MAX_SIZE", true,
                       sycl_keep, true },
        [KRT_POCL] = { "pocl", "PoCL", "pocl", "export POCL_CACHE_DIR='@DIR@'", true, NULL, false },
        [KRT_TRITON] = { "triton", "Triton", "triton", "export TRITON_CACHE_DIR='@DIR@'", true, lock_keep, true },
        [KRT_JAX] = { "jax", "JAX", "jax",
                      "export JAX_COMPILATION_CACHE_DIR='@DIR@' JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0", true,
                      jax_keep, true },
        [KRT_CUDA] = { "cuda", "CUDA driver (and NVIDIA OpenCL)", "cuda",
                       "export CUDA_CACHE_PATH='@DIR@' CUDA_CACHE_MAXSIZE=4294967296", true, NULL, true },
        [KRT_KCACHE] = { "kcache", "libkcache and the OpenCL layer", "kcache", "export KCACHE_DIR='@DIR@'", true,
                         NULL, false },
        [KRT_MESA] = { "mesa", "Mesa's shader cache", "mesa",
                       "export MESA_SHADER_CACHE_DIR='@DIR@' MESA_SHADER_CACHE_MAX_SIZE=64G", true, NULL,
                       false, mesa_roots, mesa_keep_in_root },
        [KRT_NUMBA] = { "numba", "Numba", "numba", "export NUMBA_CACHE_DIR='@DIR@'", true, NULL, true },
        /* PyOpenCL and pytools have no variable of their own: they follow XDG_CACHE_HOME, which moves every
         * program's XDG cache into the mount, so it is printed only when asked for by name. */
        [KRT_PYOPENCL] = { "pyopencl", "PyOpenCL (its compiler and invoker caches, by XDG_CACHE_HOME)", "xdg",
                           "export XDG_CACHE_HOME='@DIR@'", false, lock_keep, false, pyopencl_roots, NULL, true },
        [KRT_CCACHE] = { "ccache", "ccache", "ccache", "export CCACHE_DIR='@DIR@' CCACHE_MAXSIZE=0", true,
                         ccache_keep, false },
        [KRT_INDUCTOR] = { "inductor", "PyTorch Inductor", "inductor", "export TORCHINDUCTOR_CACHE_DIR='@DIR@'",
                           true, lock_keep, true },
        [KRT_CUPY] = { "cupy", "CuPy", "cupy", "export CUPY_CACHE_DIR='@DIR@'", true, NULL, true },
        [KRT_TORCH_EXT] = { "torch-extensions", "PyTorch C++ extensions", "torch-extensions",
                            "export TORCH_EXTENSIONS_DIR='@DIR@'", true, lock_keep, true },
};

int krt_by_name(const char *name)
{
        for (int i = 0; i < KRT__COUNT; i++)
                if (!strcmp(name, krt_table[i].name))
                        return i;
        return -1;
}

bool krt_is_lock_name(const char *name)
{
        size_t l = strlen(name);
        return !strcmp(name, "lock") || (l >= 5 && !strcmp(name + l - 5, ".lock"));
}

bool krt_is_kept_name(const char *name)
{
        if (krt_is_lock_name(name))
                return true;
        for (int i = 0; i < KRT__COUNT; i++)
                for (const char *const *k = krt_table[i].keep; k && *k; k++)
                        if (!strcmp(name, *k))
                                return true;
        return false;
}

static const char *base_of(const char *path, size_t *len)
{
        const char *s = strrchr(path, '/');
        const char *b = s ? s + 1 : path;
        *len = strlen(b);
        return b;
}

bool krt_is_root_dir(const char *path)
{
        size_t l;
        const char *b = base_of(path, &l);
        for (int i = 0; i < KRT__COUNT; i++)
                for (const char *const *r = krt_table[i].roots; r && *r; r++)
                        if (!strncmp(b, *r, strlen(*r)))
                                return true;
        return false;
}

bool krt_is_kept_path(const char *path)
{
        size_t l;
        const char *b = base_of(path, &l);
        if (krt_is_kept_name(b))
                return true;
        if (b == path)
                return false;
        char dir[4096];
        size_t dl = (size_t)(b - 1 - path);
        if (dl >= sizeof(dir))
                return false;
        memcpy(dir, path, dl);
        dir[dl] = '\0';
        size_t pl;
        const char *parent = base_of(dir, &pl);
        for (int i = 0; i < KRT__COUNT; i++) {
                bool in_root = false;
                for (const char *const *r = krt_table[i].roots; r && *r && !in_root; r++)
                        in_root = !strncmp(parent, *r, strlen(*r));
                for (const char *const *k = krt_table[i].keep_in_root; in_root && k && *k; k++)
                        if (!strcmp(b, *k))
                                return true;
        }
        return false;
}
