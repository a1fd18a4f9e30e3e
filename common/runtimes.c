/* runtimes.c: the runtime descriptors (runtimes.h). */
#include <fnmatch.h>
#include <string.h>

#include "runtimes.h"

static const char *const neo_keep[] = { "config.file", NULL };          /* its size count, under its flock */
static const char *const sycl_keep[] = { "cache_size.txt", NULL };      /* its size, under cache_size.txt.lock */
static const char *const jax_keep[] = { ".lockfile", NULL };            /* py-filelock, around every get and put */
static const char *const mesa_roots[] = { "mesa_shader_cache", NULL }; /* also mesa_shader_cache_db */
static const char *const mesa_keep_in_root[] = { "index", NULL };      /* every GL process maps it */
#define HEX16 "[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]" \
              "[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]"
static const char *const neo_temp[] = { "cl_cache.??????", NULL };       /* mkstemp("cl_cache.XXXXXX") */
static const char *const pocl_temp[] = { "tempfile-*", "tempfile_*", "*.temp", NULL };
static const char *const numba_temp[] = { "*.nbi.tmp." HEX16, "*.nbc.tmp." HEX16, NULL }; /* then os.replace */
static const char *const triton_temp_dirs[] = { "tmp.pid_*", NULL };    /* a store's directory, renamed in */
static const char *const jax_temp_dirs[] = { "tmp", NULL };             /* XLA's autotune writes */
static const char *const pyopencl_roots[] = { "pyopencl-compiler-cache-", "pdict-", NULL };
static const char *const lock_keep[] = { "lock", NULL };                /* the bare name: a lock file */
/* What compiles leave (outputs): the names a lookup may wait for while another node compiles them. */
static const char *const neo_out[] = { "*.cl_cache", "*.l0_cache", "*.ocloc_cache", NULL };
static const char *const sycl_out[] = { "*.bin", "*.src", NULL };
static const char *const pocl_out[] = { "program.bc", "parallel.bc", "*.so", "*.o", NULL }; /* parallel.bc: a kernel's WG function */
static const char *const triton_out[] = { "*.json", "*.cubin", "*.ptx", "*.hsaco", "*.so", "*.ttir", "*.ttgir",
                                          "*.llir", "*.amdgcn", NULL };
static const char *const jax_out[] = { "*-cache", NULL };
static const char *const numba_out[] = { "*.nbi", "*.nbc", NULL };
static const char *const pyopencl_out[] = { "info", "binary", NULL };
static const char *const kcache_out[] = { "*.kce", NULL };
static const char *const cupy_out[] = { "*.cubin", NULL };
static const char *const ccache_keep[] = { "ccache.conf", NULL };       /* its settings (max_size among them) */
/* ccache's statistics: a stats file in each of its 16 directories and their 256 subdirectories (0/stats,
 * a/b/stats), counters it rewrites (temp and rename) after every compile. They are kept like NEO's
 * config.file, about 1 MiB in all once every directory has one: evicted by recency, as they were, a
 * rarely used directory's counters went and ccache -s undercounted (25 hits of 30). */
static const char *const ccache_keep_tail[] = { "[0-9a-f]/stats", NULL };

const struct krt_desc krt_table[KRT__COUNT] = {
        [KRT_AUTO] = { .name = "auto", .what = "recognised by its layout" },
        [KRT_FILE] = { .name = "file", .what = "one file per entry" },
        [KRT_NEO] = {
                .name = "neo", .what = "Intel NEO (OpenCL, Level Zero)", .dir = "neo",
                .env = "export NEO_CACHE_PERSISTENT=1 NEO_CACHE_DIR='@DIR@' NEO_CACHE_MAX_SIZE=0", .env_default = true,
                .keep = neo_keep, .keeps_dirs = true, .temp = neo_temp,
                .outputs = neo_out,
        },
        [KRT_SYCL] = {
                .name = "sycl", .what = "SYCL / DPC++", .dir = "sycl",
                .env = "export SYCL_CACHE_PERSISTENT=1 SYCL_CACHE_DIR='@DIR@'; unset SYCL_CACHE_MAX_SIZE",
                .env_default = true, .keep = sycl_keep, .keeps_dirs = true,
                .outputs = sycl_out,
        },
        [KRT_POCL] = {
                .name = "pocl", .what = "PoCL", .dir = "pocl", .env = "export POCL_CACHE_DIR='@DIR@'",
                .env_default = true, .temp = pocl_temp,
                .outputs = pocl_out,
        },
        [KRT_TRITON] = {
                .name = "triton", .what = "Triton", .dir = "triton", .env = "export TRITON_CACHE_DIR='@DIR@'",
                .env_default = true, .keep = lock_keep, .keeps_dirs = true, .temp_dirs = triton_temp_dirs,
                .outputs = triton_out,
        },
        [KRT_JAX] = {
                .name = "jax", .what = "JAX", .dir = "jax",
                .env = "export JAX_COMPILATION_CACHE_DIR='@DIR@' JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0",
                .env_default = true, .keep = jax_keep, .keeps_dirs = true, .temp_dirs = jax_temp_dirs,
                .outputs = jax_out,
        },
        [KRT_CUDA] = {
                .name = "cuda", .what = "CUDA driver (and NVIDIA OpenCL)", .dir = "cuda",
                .env = "export CUDA_CACHE_PATH='@DIR@' CUDA_CACHE_MAXSIZE=4294967296", .env_default = true,
                .keeps_dirs = true,
        },
        [KRT_KCACHE] = {
                .name = "kcache", .what = "libkcache and the OpenCL layer", .dir = "kcache",
                .env = "export KCACHE_DIR='@DIR@'", .env_default = true,
                .outputs = kcache_out, .locks_compile = true,
        },
        [KRT_MESA] = {
                .name = "mesa", .what = "Mesa's shader cache", .dir = "mesa",
                .env = "export MESA_SHADER_CACHE_DIR='@DIR@' MESA_SHADER_CACHE_MAX_SIZE=64G", .env_default = true,
                .roots = mesa_roots, .keep_in_root = mesa_keep_in_root,
        },
        [KRT_NUMBA] = {
                .name = "numba", .what = "Numba", .dir = "numba", .env = "export NUMBA_CACHE_DIR='@DIR@'",
                .env_default = true, .keeps_dirs = true, .temp = numba_temp,
                .outputs = numba_out,
        },
        /* PyOpenCL and pytools have no variable of their own: they follow XDG_CACHE_HOME, which moves every
         * program's XDG cache into the mount, so it is printed only when asked for by name. */
        [KRT_PYOPENCL] = {
                .name = "pyopencl", .what = "PyOpenCL (its compiler and invoker caches, by XDG_CACHE_HOME)",
                .dir = "xdg", .env = "export XDG_CACHE_HOME='@DIR@'", .keep = lock_keep, .roots = pyopencl_roots,
                .dir_shared = true,
                .outputs = pyopencl_out,
        },
        [KRT_CCACHE] = {
                .name = "ccache", .what = "ccache", .dir = "ccache", .env = "export CCACHE_DIR='@DIR@' CCACHE_MAXSIZE=0",
                .env_default = true, .keep = ccache_keep, .keep_tail = ccache_keep_tail,
        },
        [KRT_INDUCTOR] = {
                .name = "inductor", .what = "PyTorch Inductor", .dir = "inductor",
                .env = "export TORCHINDUCTOR_CACHE_DIR='@DIR@'", .env_default = true, .keep = lock_keep,
                .keeps_dirs = true,
        },
        [KRT_CUPY] = {
                .name = "cupy", .what = "CuPy", .dir = "cupy", .env = "export CUPY_CACHE_DIR='@DIR@'",
                .env_default = true, .keeps_dirs = true,
                .outputs = cupy_out,
        },
        [KRT_TORCH_EXT] = {
                .name = "torch-extensions", .what = "PyTorch C++ extensions", .dir = "torch-extensions",
                .env = "export TORCH_EXTENSIONS_DIR='@DIR@'", .env_default = true, .keep = lock_keep,
                .keeps_dirs = true,
        },
};

int krt_by_name(const char *name)
{
        for (int i = 0; i < KRT__COUNT; i++)
                if (!strcmp(name, krt_table[i].name))
                        return i;
        return -1;
}

/* Whether name is an output of some runtime (of one that locks its compiles itself, with locked_only). */
static bool output_of(const char *name, bool locked_only)
{
        for (int i = 0; i < KRT__COUNT; i++)
                for (const char *const *o = krt_table[i].outputs; o && *o; o++)
                        if ((!locked_only || krt_table[i].locks_compile) && fnmatch(*o, name, 0) == 0)
                                return true;
        return false;
}

bool krt_is_self_locked_output(const char *name)
{
        return output_of(name, true);
}

bool krt_is_output_name(const char *name)
{
        return output_of(name, false);
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
        const char *tail = path + (parent - dir); /* "parent/name" */
        for (int i = 0; i < KRT__COUNT; i++) {
                bool in_root = false;
                for (const char *const *r = krt_table[i].roots; r && *r && !in_root; r++)
                        in_root = !strncmp(parent, *r, strlen(*r));
                for (const char *const *k = krt_table[i].keep_in_root; in_root && k && *k; k++)
                        if (!strcmp(b, *k))
                                return true;
                for (const char *const *k = krt_table[i].keep_tail; k && *k; k++)
                        if (fnmatch(*k, tail, FNM_PATHNAME) == 0)
                                return true;
        }
        return false;
}

bool krt_is_temporary(const char *path)
{
        size_t l;
        const char *b = base_of(path, &l);
        for (int i = 0; i < KRT__COUNT; i++)
                for (const char *const *t = krt_table[i].temp; t && *t; t++)
                        if (fnmatch(*t, b, 0) == 0)
                                return true;
        char comp[256];
        for (const char *p = path; *p;) { /* each directory component */
                size_t n = strcspn(p, "/");
                if (!p[n])
                        break; /* the file's own name */
                if (n < sizeof(comp)) {
                        memcpy(comp, p, n);
                        comp[n] = '\0';
                        for (int i = 0; i < KRT__COUNT; i++)
                                for (const char *const *t = krt_table[i].temp_dirs; t && *t; t++)
                                        if (fnmatch(*t, comp, 0) == 0)
                                                return true;
                }
                p += n + 1;
        }
        return false;
}
