/* test-evict-choose: what eviction takes first (fs/evict/choose.c) and which files form one runtime's
 * entry (fs/evict/units.c), on a real backing tree and a real index, with eviction's clock set by the test:
 * no mount, no root, no wall clock. Each case builds its tree, gives every file an access time and an LRU
 * position of its own (kidx_touch), and reads what kev_choose() takes, in order. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "tutil.h"

#define S 1000000000LL
#define T0 (1000000 * S) /* the test's epoch: far from the wall clock, so nothing depends on it */

static int64_t fake_now;
static int64_t clock_of_test(void)
{
        return fake_now;
}

struct scene {
        char *tmp;
        char backing[PATH_MAX];
        struct kfs fs;
};

/* Makes backing/rel (and the directories above it) with size bytes; returns its inode number. */
static uint64_t mk(struct scene *sc, const char *rel, size_t size)
{
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", sc->backing, rel);
        for (char *p = path + strlen(sc->backing) + 1; (p = strchr(p, '/')); p++) {
                *p = '\0';
                mkdir(path, 0755);
                *p = '/';
        }
        char *slash = strrchr(path, '/');
        *slash = '\0';
        uint64_t ino = tutil_write_file(path, slash + 1, size);
        *slash = '/';
        return ino;
}

static uint64_t ino_of(struct scene *sc, const char *rel)
{
        struct stat st;
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", sc->backing, rel);
        return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void scene_begin(struct scene *sc)
{
        memset(sc, 0, sizeof(*sc));
        sc->tmp = tutil_tmpdir();
        snprintf(sc->backing, sizeof(sc->backing), "%s/backing", sc->tmp);
        mkdir(sc->backing, 0755);
}

/* After the tree is made: the index (rebuilt from the tree) and the daemon's state eviction reads. */
static void scene_open(struct scene *sc)
{
        struct kfs *fs = &sc->fs;
        char db[PATH_MAX];
        snprintf(db, sizeof(db), "%s/index.db", sc->tmp);
        CHECK_EQ(ktree_init(&fs->tree, sc->backing), 0);
        struct stat st;
        CHECK(fstat(fs->tree.root, &st) == 0);
        fs->root.bino = st.st_ino;
        fs->root.type = S_IFDIR;
        struct kidx_open_opts o = { .db_path = db, .backing_fd = fs->tree.root };
        enum kidx_rebuild_reason why;
        CHECK_EQ(kidx_open(&o, &fs->idx, &why), 0);
        fs->o.max_size = 1 << 30;
        fs->o.grace_ms = 2000;
        fs->o.tmp_age = 3600;
        fs->o.low_watermark = 90;
        pthread_mutex_init(&fs->itable_lock, NULL);
        kmap_init(&fs->itable);
        kmap_init(&fs->detached);
        CHECK_EQ(kev_init(fs), 0);
        fs->ev->now = clock_of_test;
}

/* The files' LRU order and access times: rel[i] accessed at T0 + (i + 1) s, in that order. */
static void touch_in_order(struct scene *sc, const char *const *rel, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                uint64_t ino = ino_of(sc, rel[i]);
                CHECK(ino != 0);
                kidx_touch(sc->fs.idx, ino, T0 + (int64_t)(i + 1) * S, 1, 0);
        }
        CHECK_EQ(kidx_flush(sc->fs.idx), 0);
}

static void scene_end(struct scene *sc)
{
        struct kfs *fs = &sc->fs;
        uint64_t key;
        void *val;
        for (size_t pos = 0; kmap_next(&fs->itable, &pos, &key, &val);)
                free(val);
        kmap_free(&fs->itable);
        kmap_free(&fs->detached);
        kev_free(fs);
        kidx_close(fs->idx, true);
        close(fs->tree.root);
        tutil_rmrf(sc->tmp);
        free(sc->tmp);
}

/* What kev_choose takes, as "path,path|path" (units separated by '|'), from *cursor on, as a batch of the
 * eviction whose held locks are busy (NULL: a walk on its own). */
static const char *take_in(struct scene *sc, uint64_t goal, size_t max_victims, uint64_t *cursor, bool grace,
                           struct kev_busy *busy)
{
        static char out[8192];
        struct victims vs = { 0 };
        struct dircache dc = { 0 };
        struct seen_set seen = { .busy = busy };
        uint64_t c0 = 0;
        int r = kev_choose(&sc->fs, &dc, goal, max_victims, cursor ? cursor : &c0, grace, &seen, &vs);
        kev_seen_free(&seen);
        CHECK_EQ(r, 0);
        out[0] = '\0';
        for (size_t u = 0; u < vs.nu; u++) {
                if (u)
                        strcat(out, "|");
                for (size_t k = 0; k < vs.u[u].count; k++) {
                        struct victim *v = &vs.v[vs.u[u].first + k];
                        if (k)
                                strcat(out, ",");
                        strcat(out, v->nnames && v->names[0].path ? v->names[0].path : "?");
                }
        }
        kev_free_victims(&vs);
        kev_dircache_free(&dc);
        return out;
}

static const char *take(struct scene *sc, uint64_t goal, size_t max_victims, uint64_t *cursor, bool grace)
{
        return take_in(sc, goal, max_victims, cursor, grace, NULL);
}

#define CHECK_TAKES(got, want)                                                                            \
        do {                                                                                              \
                const char *_g = (got);                                                                   \
                if (strcmp(_g, want)) {                                                                   \
                        fprintf(stderr, "%s:%d: took \"%s\", want \"%s\"\n", __FILE__, __LINE__, _g, want); \
                        tutil_failures++;                                                                 \
                }                                                                                         \
        } while (0)

/* Least recently used first, as far as the goal or the victim count reaches, and on from the cursor. */
static void test_lru_order_goal_and_cursor(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *f[] = { "gen/c", "gen/a", "gen/d", "gen/b" };
        for (int i = 0; i < 4; i++)
                mk(&sc, f[i], 4096);
        scene_open(&sc);
        touch_in_order(&sc, f, 4);
        fake_now = T0 + 100 * S;
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, true), "gen/c|gen/a|gen/d|gen/b");
        CHECK_TAKES(take(&sc, 1, SIZE_MAX, NULL, true), "gen/c");
        uint64_t cursor = 0;
        CHECK_TAKES(take(&sc, UINT64_MAX, 2, &cursor, true), "gen/c|gen/a");
        CHECK_TAKES(take(&sc, UINT64_MAX, 2, &cursor, true), "gen/d|gen/b");
        CHECK_TAKES(take(&sc, UINT64_MAX, 2, &cursor, true), "");
        scene_end(&sc);
}

/* GRACE: with the clock at T0 + 5 s and a 2 s grace, files used after T0 + 3 s stay; the walk stops at
 * the first of them. Without grace (a write that cannot fit otherwise) they go too; and once the clock
 * has moved on, so do they. */
static void test_grace_by_the_eviction_clock(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *f[] = { "g/1", "g/2", "g/3", "g/4" };
        for (int i = 0; i < 4; i++)
                mk(&sc, f[i], 4096);
        scene_open(&sc);
        touch_in_order(&sc, f, 4); /* at T0 + 1..4 s */
        fake_now = T0 + 5 * S;
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, true), "g/1|g/2|g/3");
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), "g/1|g/2|g/3|g/4");
        fake_now = T0 + 7 * S;
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, true), "g/1|g/2|g/3|g/4");
        scene_end(&sc);
}

static struct kfs_inode *fake_inode(struct scene *sc, const char *rel)
{
        struct kfs_inode *in = calloc(1, sizeof(*in));
        in->bino = ino_of(sc, rel);
        in->type = S_IFREG;
        in->fd = -1;
        CHECK_EQ(kmap_put(&sc->fs.itable, in->bino, in), 0);
        return in;
}

/* WHAT IS NEVER EVICTED: a file open for writing, one open at all (by default), a name matching a pin
 * pattern, a row pinned in the index, and the runtimes' locks, bookkeeping and settings. */
static void test_open_pinned_and_kept_files_stay(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *f[] = { "p/written", "p/read", "p/x.keep", "p/pinned", "p/plain", "p/lock", "p/ccache.conf",
                            "p/config.file" };
        for (int i = 0; i < 8; i++)
                mk(&sc, f[i], 4096);
        scene_open(&sc);
        touch_in_order(&sc, f, 8);
        fake_now = T0 + 100 * S;
        fake_inode(&sc, "p/written")->writers = 1;
        fake_inode(&sc, "p/read")->readers = 1;
        char *pins[] = { "*.keep", NULL };
        sc.fs.o.pins = pins;
        kidx_set_pinned(sc.fs.idx, ino_of(&sc, "p/pinned"), true);
        CHECK_EQ(kidx_flush(sc.fs.idx), 0);
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), "p/plain");
        sc.fs.o.protect = KFS_PROTECT_WRITERS; /* -o protect=writers: readers keep reading the unlinked file */
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), "p/read|p/plain");
        sc.fs.o.pins = NULL;
        scene_end(&sc);
}

/* A PoCL program directory goes whole, program.bc first (PoCL's mark of a complete entry), when the walk
 * reaches its newest file: a loose file used between its files goes before it. Without program.bc it is
 * a store in flight, and stays. */
static void test_a_pocl_program_goes_whole_at_its_newest_file(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *prog = "pocl/ab/cdefghijklmnopqrstuvwxyz0123456789abc"; /* <2>/<37> */
        char bc[PATH_MAX], so[PATH_MAX], log[PATH_MAX], fl[PATH_MAX], fso[PATH_MAX];
        snprintf(bc, sizeof(bc), "%s/program.bc", prog);
        snprintf(so, sizeof(so), "%s/kernel/0-0-0/k.so", prog);
        snprintf(log, sizeof(log), "%s/build.log", prog);
        const char *flight = "pocl/zz/cdefghijklmnopqrstuvwxyz0123456789abc";
        snprintf(fl, sizeof(fl), "%s/build.log", flight);
        snprintf(fso, sizeof(fso), "%s/kernel/0-0-0/k.so", flight);
        mk(&sc, bc, 8192);
        mk(&sc, so, 8192);
        mk(&sc, log, 100);
        mk(&sc, "pocl/loose", 4096);
        mk(&sc, fl, 100);
        mk(&sc, fso, 4096);
        scene_open(&sc);
        const char *order[] = { bc, log, "pocl/loose", so, fl, fso };
        touch_in_order(&sc, order, 6);
        fake_now = T0 + 100 * S;
        char want[PATH_MAX * 4];
        snprintf(want, sizeof(want), "pocl/loose|%s,%s,%s", bc, log, so);
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), want);
        scene_end(&sc);
}

/* Inductor's directory holds the Triton cache it compiles into: under layout=inductor (kcache env's mark
 * does the same) a Triton key directory there still goes whole, json first, not file by file. */
static void test_triton_keys_in_inductors_directory_go_whole(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *key = "inductor/triton/0/ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST"; /* 52 base32 */
        char grp[PATH_MAX], json[PATH_MAX], cubin[PATH_MAX];
        snprintf(grp, sizeof(grp), "%s/__grp__k.json", key);
        snprintf(json, sizeof(json), "%s/k.json", key);
        snprintf(cubin, sizeof(cubin), "%s/k.cubin", key);
        mk(&sc, cubin, 8192);
        mk(&sc, json, 100);
        mk(&sc, grp, 100);
        mk(&sc, "inductor/fxgraph/ab/entry", 4096);
        scene_open(&sc);
        CHECK_EQ(kfs_parse_layouts("inductor", &sc.fs.o.layouts, &sc.fs.o.nlayouts), 0);
        const char *order[] = { cubin, "inductor/fxgraph/ab/entry", json, grp };
        touch_in_order(&sc, order, 4);
        fake_now = T0 + 100 * S;
        char want[PATH_MAX * 4];
        snprintf(want, sizeof(want), "inductor/fxgraph/ab/entry|%s,%s,%s", grp, json, cubin);
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), want);
        for (size_t i = 0; i < sc.fs.o.nlayouts; i++)
                free(sc.fs.o.layouts[i].dir);
        free(sc.fs.o.layouts);
        sc.fs.o.layouts = NULL;
        sc.fs.o.nlayouts = 0;
        scene_end(&sc);
}

/* SYCL's entry is <n>.bin, <n>.src and <n>_access_time.txt, in that order, and stays while SYCL holds
 * <n>.lock; its cache_size.txt is repaired afterwards, never evicted. */
static void test_a_sycl_entry_goes_whole_unless_locked(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *f[] = { "sycl/d/1/11_access_time.txt", "sycl/d/1/11.bin", "sycl/d/1/11.src",
                            "sycl/d/2/22.bin", "sycl/d/2/22.src", "sycl/d/2/22_access_time.txt", "sycl/cache_size.txt" };
        for (int i = 0; i < 7; i++)
                mk(&sc, f[i], 4096);
        mk(&sc, "sycl/d/2/22.lock", 0);
        scene_open(&sc);
        touch_in_order(&sc, f, 7);
        fake_now = T0 + 100 * S;
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), "sycl/d/1/11.bin,sycl/d/1/11.src,sycl/d/1/11_access_time.txt");
        struct victims vs = { 0 };
        struct dircache dc = { 0 };
        uint64_t c = 0;
        CHECK_EQ(kev_choose(&sc.fs, &dc, UINT64_MAX, SIZE_MAX, &c, false, NULL, &vs), 0);
        struct stat sy;
        char sp[PATH_MAX];
        snprintf(sp, sizeof(sp), "%s/sycl", sc.backing);
        CHECK(stat(sp, &sy) == 0);
        CHECK(vs.nu == 1 && vs.u[0].rt == KRT_SYCL && vs.u[0].repair.rel && !strcmp(vs.u[0].repair.rel, "sycl") &&
              vs.u[0].repair.ino == sy.st_ino);
        kev_free_victims(&vs);
        kev_dircache_free(&dc);
        scene_end(&sc);
}

/* Mesa's multi-file shader cache: each <2 hex>/<38 hex> entry is its own unit, and the index every GL
 * process maps is Mesa's bookkeeping, never evicted; a Mesa-DB part's two files go together, the
 * database first. A CUDA driver cache (an index above hashed directories) goes whole, index first: an
 * index elsewhere is no runtime's bookkeeping. Mesa's cache was once taken for CUDA's, and then CUDA's
 * index was kept as Mesa's, which kept its whole cache for good. */
static void test_mesa_entries_go_one_by_one_and_cuda_whole(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *f[] = { "mesa/mesa_shader_cache/index", "mesa/mesa_shader_cache/0a/0123456789abcdef0123456789abcdef012345",
                            "mesa/mesa_shader_cache/ff/fedcba9876543210fedcba9876543210fedcba",
                            "cuda/ComputeCache/7/a3/9f0e1d", "cuda/ComputeCache/index",
                            "mesa/mesa_shader_cache_db/part3/mesa_cache.idx", "mesa/mesa_shader_cache_db/part3/mesa_cache.db",
                            "other/index" };
        for (int i = 0; i < 8; i++)
                mk(&sc, f[i], 4096);
        scene_open(&sc);
        touch_in_order(&sc, f, 8);
        fake_now = T0 + 100 * S;
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false),
                    "mesa/mesa_shader_cache/0a/0123456789abcdef0123456789abcdef012345|"
                    "mesa/mesa_shader_cache/ff/fedcba9876543210fedcba9876543210fedcba|"
                    "cuda/ComputeCache/index,cuda/ComputeCache/7/a3/9f0e1d|"
                    "mesa/mesa_shader_cache_db/part3/mesa_cache.db,mesa/mesa_shader_cache_db/part3/mesa_cache.idx|"
                    "other/index");
        scene_end(&sc);
}

/* Numba: a function's .nbi index goes first, then its .nbc data, at the newest of them. pytools' item
 * directory: contents before key. JAX: -cache before -atime. NEO: a binary alone, config.file repaired. */
static void test_numba_pytools_jax_and_neo_units(void)
{
        struct scene sc;
        scene_begin(&sc);
        const char *f[] = {
                "numba/m.f-3.py311.1.nbc", "numba/m.f-3.py311.nbi", "numba/m.f-3.py311.2.nbc",
                "xdg/pytools/pdict-v4-pyopencl-invoker-cache-v42-py3.11/abc/def/0123456789abcdef0123456789abcdef/key",
                "xdg/pytools/pdict-v4-pyopencl-invoker-cache-v42-py3.11/abc/def/0123456789abcdef0123456789abcdef/contents",
                "jax/jit_f-0123abcd-atime", "jax/jit_f-0123abcd-cache",
                "neo/0123456789abcdef.cl_cache", "neo/config.file",
        };
        for (int i = 0; i < 9; i++)
                mk(&sc, f[i], 4096);
        scene_open(&sc);
        touch_in_order(&sc, f, 9);
        fake_now = T0 + 100 * S;
        CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false),
                    "numba/m.f-3.py311.nbi,numba/m.f-3.py311.1.nbc,numba/m.f-3.py311.2.nbc|"
                    "xdg/pytools/pdict-v4-pyopencl-invoker-cache-v42-py3.11/abc/def/0123456789abcdef0123456789abcdef/contents,"
                    "xdg/pytools/pdict-v4-pyopencl-invoker-cache-v42-py3.11/abc/def/0123456789abcdef0123456789abcdef/key|"
                    "jax/jit_f-0123abcd-cache,jax/jit_f-0123abcd-atime|"
                    "neo/0123456789abcdef.cl_cache");
        scene_end(&sc);
}

/* A clock that unlinks unlock_path at its unlock_at-th reading: the eviction reads its clock as it weighs
 * each unit, so the lock goes in the middle of a walk, at a point the test chooses. */
static char unlock_path[PATH_MAX];
static int clock_reads, unlock_at;
static int64_t clock_that_unlocks(void)
{
        if (++clock_reads == unlock_at)
                CHECK_EQ(unlink(unlock_path), 0);
        return fake_now;
}

#define PYOCL "xdg/pyopencl/pyopencl-compiler-cache-v2-py3.11.2.final.0/"
#define PDICT "xdg/pytools/pdict-v4-pyopencl-invoker-cache-v42-py3.11/abc/def/0123456789abcdef0123456789abcdef/"
#define KEY_A "0123456789abcdef0123456789abcdef/"
#define KEY_B "fedcba9876543210fedcba9876543210/"

/* ONE VERDICT PER LOCK (choose.c): PyOpenCL's one lock guards its whole compiler cache. Key A (oldest), a
 * pytools item, key B (newer), and the cache's lock held by another process. The lock goes while the walk
 * takes the pytools item, between A and B: A was passed over for the lock, so B is too, in that walk and
 * in the eviction's later batches; the next eviction takes A first. Judged unit by unit, B went and A
 * stayed: the key stored just before was evicted ahead of every older one (PyOpenCL's test under ASan). */
static void test_one_verdict_per_pyopencl_lock(void)
{
        const char *f[] = { PYOCL "lock",          PYOCL KEY_A "source.cl", PYOCL KEY_A "binary",
                            PYOCL KEY_A "info",    PDICT "key",             PDICT "contents",
                            PYOCL KEY_B "source.cl", PYOCL KEY_B "binary",  PYOCL KEY_B "info" };
        const char *a = PYOCL KEY_A "info," PYOCL KEY_A "binary," PYOCL KEY_A "source.cl";
        const char *b = PYOCL KEY_B "info," PYOCL KEY_B "binary," PYOCL KEY_B "source.cl";
        const char *item = PDICT "contents," PDICT "key";
        char want[4096];
        for (int batches = 0; batches < 2; batches++) {
                struct scene sc;
                scene_begin(&sc);
                for (int i = 0; i < 9; i++)
                        mk(&sc, f[i], i ? 4096 : 0);
                snprintf(unlock_path, sizeof(unlock_path), "%s/" PYOCL "lock", sc.backing);
                scene_open(&sc);
                touch_in_order(&sc, f, 9);
                fake_now = T0 + 100 * S;
                sc.fs.ev->now = clock_that_unlocks;
                clock_reads = 0;
                unlock_at = 2; /* the walk's first reading is its start; the second, the pytools item */
                struct kev_busy busy = { 0 };
                uint64_t cursor = 0;
                if (!batches) { /* one walk */
                        CHECK_TAKES(take_in(&sc, UINT64_MAX, SIZE_MAX, &cursor, true, &busy), item);
                } else { /* a batch as far as the item, the lock goes, the next batch goes on at the cursor */
                        CHECK_TAKES(take_in(&sc, 1, SIZE_MAX, &cursor, true, &busy), item);
                        CHECK_TAKES(take_in(&sc, UINT64_MAX, SIZE_MAX, &cursor, true, &busy), "");
                }
                kev_busy_free(&busy);
                CHECK(access(unlock_path, F_OK) != 0);
                snprintf(want, sizeof(want), "%s|%s|%s", a, item, b); /* the next eviction: LRU order */
                CHECK_TAKES(take(&sc, UINT64_MAX, SIZE_MAX, NULL, false), want);
                scene_end(&sc);
        }
}

/* The runtimes' data (common/runtimes.c): every runtime can be named, says what it is, and keeps what
 * its descriptor says; the names eviction must never take are kept whatever the layout. */
static void test_runtime_descriptors(void)
{
        for (int rt = 0; rt < KRT__COUNT; rt++) {
                const struct krt_desc *ri = &krt_table[rt];
                CHECK(ri->name && *ri->name && ri->what && *ri->what);
                CHECK_EQ(krt_by_name(ri->name), rt);
                if (ri->dir) /* kcache env makes the directory it names in the line it prints */
                        CHECK(ri->env && strstr(ri->env, "@DIR@") != NULL);
        }
        CHECK_EQ(krt_by_name("no-such-runtime"), -1);
        const char *kept[] = { "lock", ".lockfile", "config.file", "cache_size.txt", "cache_size.txt.lock",
                               "ccache.conf", "11.lock" };
        for (size_t i = 0; i < sizeof(kept) / sizeof(*kept); i++)
                if (!krt_is_kept_name(kept[i])) {
                        fprintf(stderr, "not kept: %s\n", kept[i]);
                        tutil_failures++;
                }
        const char *not_kept[] = { "stats", "program.bc", "index", "0123456789abcdef.cl_cache", "lockfile.bin" };
        for (size_t i = 0; i < sizeof(not_kept) / sizeof(*not_kept); i++)
                if (krt_is_kept_name(not_kept[i])) {
                        fprintf(stderr, "kept, wrongly: %s\n", not_kept[i]);
                        tutil_failures++;
                }
        /* By layout: Mesa's index in its own directory only. */
        CHECK(krt_is_kept_path("m/mesa_shader_cache/index"));
        CHECK(krt_is_kept_path("mesa_shader_cache/index"));
        CHECK(!krt_is_kept_path("index"));
        CHECK(!krt_is_kept_path("cuda/ComputeCache/index"));
        CHECK(!krt_is_kept_path("m/mesa_shader_cache/0a/index"));
        CHECK(krt_is_kept_path("x/neo/config.file"));
        /* ccache's counters, in its directories and their subdirectories; a stats file elsewhere goes. */
        CHECK(krt_is_kept_path("ccache/0/stats") && krt_is_kept_path("ccache/a/b/stats") &&
              krt_is_kept_path("f/stats"));
        CHECK(!krt_is_kept_path("stats") && !krt_is_kept_path("ccache/ab/stats") &&
              !krt_is_kept_path("x/g/stats") && !krt_is_kept_path("ccache/0/stats2"));
        CHECK(krt_is_root_dir("xdg/pytools/pdict-v4-x") && krt_is_root_dir("mesa_shader_cache_db"));
        /* Temporary names, as the descriptors give them. */
        const char *temp[] = { "neo/cl_cache.AbC123", "pocl/tempfile-1234", "pocl/ab/x.temp",
                               "numba/m.f-3.py311.nbi.tmp.0123456789abcdef", "t/tmp.pid_12_34/x.json", "j/tmp/x",
                               "x/tmp/y/z" };
        for (size_t i = 0; i < sizeof(temp) / sizeof(*temp); i++)
                if (!krt_is_temporary(temp[i])) {
                        fprintf(stderr, "not temporary: %s\n", temp[i]);
                        tutil_failures++;
                }
        const char *not_temp[] = { "neo/cl_cache.ab", "pocl/temp", "numba/m.nbi.tmp.zz", "t/tmp", "t/tmpx/y",
                                   "t/x.tmp.pid_1", "numba/m.f-3.py311.nbi" };
        for (size_t i = 0; i < sizeof(not_temp) / sizeof(*not_temp); i++)
                if (krt_is_temporary(not_temp[i])) {
                        fprintf(stderr, "temporary, wrongly: %s\n", not_temp[i]);
                        tutil_failures++;
                }
        CHECK(!krt_is_root_dir("pocl/ab"));
}

int main(void)
{
        test_lru_order_goal_and_cursor();
        test_grace_by_the_eviction_clock();
        test_open_pinned_and_kept_files_stay();
        test_a_pocl_program_goes_whole_at_its_newest_file();
        test_triton_keys_in_inductors_directory_go_whole();
        test_a_sycl_entry_goes_whole_unless_locked();
        test_mesa_entries_go_one_by_one_and_cuda_whole();
        test_numba_pytools_jax_and_neo_units();
        test_one_verdict_per_pyopencl_lock();
        test_runtime_descriptors();
        return tutil_done("test-evict-choose");
}
