/* verify.c: kcache verify [--repair] [MOUNT]: the index compared with the backing directory, name by name.
 *
 * The walk of the backing tree goes through common/tree.h (never a symlink followed, never another
 * filesystem entered, nothing resolved by path), one descriptor per level; the index is read with a
 * read-only connection (kidx_reader), after the daemon was asked to flush. A difference found is looked
 * for again before it is reported: a change in flight is not one. --repair has the daemon reconcile
 * (fs/control.c, reconcile), then compares once more. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export.h"
#include "kcache.h"
#include "quote.h"
#include "../index/kidx.h"
#include "../common/tree.h"

/* A name of a regular file, as the index or the tree has it. The two are compared by (directory inode,
 * name), never by path: a path is bounded (PATH_MAX), a tree is not, and a name deeper than PATH_MAX must
 * verify as any other. A path is spelled only for a difference, to report it. */
struct kc_name {
        uint64_t dir; /* the directory's backing inode */
        char *name;
        uint64_t ino, bytes;
};

struct kc_names {
        struct kc_name *v;
        size_t n, cap;
};

/* A directory the walk went through: enough to spell the path of a name in it. */
struct kc_dir {
        uint64_t ino, parent;
        char *name;
};

struct kc_scan {
        struct ktree t;       /* the backing tree: every open goes through tree.h */
        uint64_t root;        /* the backing root's inode */
        struct kc_names files;
        struct kc_dir *dirs;  /* sorted by ino once the walk is done */
        size_t ndirs, dcap;
        bool tty;
};

static void *kc_grow(void *v, size_t *cap, size_t n, size_t elem)
{
        if (n < *cap)
                return v;
        *cap = *cap ? *cap * 2 : 1024;
        v = realloc(v, *cap * elem);
        if (!v) {
                kc_fail("out of memory");
                exit(1);
        }
        return v;
}

static char *kc_strdup(const char *s)
{
        char *d = strdup(s);
        if (!d) {
                kc_fail("out of memory");
                exit(1);
        }
        return d;
}

static void kc_add(void *ud, uint64_t dir, const char *name, uint64_t ino, uint64_t bytes)
{
        struct kc_names *s = ud;
        s->v = kc_grow(s->v, &s->cap, s->n, sizeof(*s->v));
        s->v[s->n++] = (struct kc_name){ dir, kc_strdup(name), ino, bytes };
}

/* Walks directory D (inode DIR) and below. Each level holds one descriptor, reached from its parent's
 * through ktree_opendir (no symlink followed, no other filesystem entered); nothing is resolved by path.
 * Names that vanish meanwhile are skipped, as the daemon's rebuild skips them. */
static void kc_walk(struct kc_scan *w, DIR *d, uint64_t dir)
{
        struct dirent *de;
        while ((de = readdir(d))) {
                const char *name = de->d_name;
                if (!ktree_name_ok(name) || (dir == w->root && !strcmp(name, ".kcachefs")))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != w->t.dev)
                        continue; /* gone, or another filesystem mounted there: not the cache's (kidx-rebuild.c) */
                if (S_ISREG(st.st_mode)) {
                        kc_add(&w->files, dir, name, st.st_ino, (uint64_t)st.st_blocks * 512);
                        if (w->tty && w->files.n % 10000 == 0)
                                fprintf(stderr, "\rkcache: scanning: %zu files", w->files.n);
                } else if (S_ISDIR(st.st_mode)) {
                        DIR *c = ktree_opendir(&w->t, dirfd(d), name);
                        struct stat cst;
                        if (!c)
                                continue;
                        if (fstat(dirfd(c), &cst) == 0) { /* the directory opened, whatever the name held before */
                                w->dirs = kc_grow(w->dirs, &w->dcap, w->ndirs, sizeof(*w->dirs));
                                w->dirs[w->ndirs++] = (struct kc_dir){ cst.st_ino, dir, kc_strdup(name) };
                                kc_walk(w, c, cst.st_ino);
                        }
                        closedir(c);
                }
        }
}

static int kc_cmp_name(const void *a, const void *b)
{
        const struct kc_name *x = a, *y = b;
        return x->dir != y->dir ? (x->dir < y->dir ? -1 : 1) : strcmp(x->name, y->name);
}

static int kc_cmp_dir(const void *a, const void *b)
{
        const struct kc_dir *x = a, *y = b;
        return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* The path of NAME in directory DIR as the walk saw it, malloc'ed, any length; NULL if out of memory. */
static char *kc_tree_path(const struct kc_scan *w, uint64_t dir, const char *name)
{
        size_t len = strlen(name), depth = 0;
        for (uint64_t d = dir; d != w->root && depth <= w->ndirs; depth++) {
                struct kc_dir key = { .ino = d }, *e = bsearch(&key, w->dirs, w->ndirs, sizeof(*w->dirs), kc_cmp_dir);
                if (!e)
                        break;
                len += strlen(e->name) + 1;
                d = e->parent;
        }
        char *p = malloc(len + 1);
        if (!p)
                return NULL;
        size_t at = len - strlen(name);
        memcpy(p + at, name, strlen(name) + 1);
        for (uint64_t d = dir; d != w->root && at > 0;) {
                struct kc_dir key = { .ino = d }, *e = bsearch(&key, w->dirs, w->ndirs, sizeof(*w->dirs), kc_cmp_dir);
                if (!e)
                        break;
                size_t l = strlen(e->name);
                p[--at] = '/';
                at -= l;
                memcpy(p + at, e->name, l);
                d = e->parent;
        }
        return p;
}

static void kc_free_names(struct kc_names *s)
{
        for (size_t i = 0; i < s->n; i++)
                free(s->v[i].name);
        free(s->v);
}

/* Reports one difference: LABEL, the name's path quoted (quote.h), and the rest. */
static void kc_report(const char *label, char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void kc_report(const char *label, char *path, const char *fmt, ...)
{
        fputs(label, stdout);
        kc_put_shell(stdout, path ? path : "?");
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        free(path);
}

/* Returns the number of differences, or -errno. */
static long kc_compare(const char *mount, bool quiet)
{
        char index[PATH_MAX];
        json_object *stats;
        int sr = kc_stats_read(mount, &stats);
        if (sr < 0)
                return sr;
        if (kc_get(mount, "index", index, sizeof(index)) < 0) {
                json_object_put(stats);
                return -errno;
        }
        /* json-c keeps a string's bytes as the daemon wrote them (fs/control.c, stats_json) */
        json_object *b = json_object_object_get(stats, "backing");
        bool given = json_object_is_type(b, json_type_string);
        char *backing = given ? strdup(json_object_get_string(b)) : NULL;
        json_object_put(stats);
        if (!backing)
                return given ? -ENOMEM : -EPROTO;
        (void)kc_set(mount, "flush", "1");
        struct kc_scan w = { .t.root = -1, .tty = isatty(STDERR_FILENO) };
        struct kc_names idx = { 0 };
        kidx_reader *rd = NULL;
        int r = ktree_init(&w.t, backing);
        free(backing);
        struct stat root;
        if (r == 0 && (r = fstat(w.t.root, &root) < 0 ? -errno : 0) == 0)
                w.root = root.st_ino;
        if (r == 0 && (r = kidx_reader_open(index, &rd)) == 0)
                r = kidx_reader_names(rd, kc_add, &idx);
        DIR *d = r == 0 ? ktree_opendir(&w.t, KTREE_ROOT, "") : NULL;
        if (r == 0 && !d)
                r = -errno;
        if (r < 0) {
                kidx_reader_close(rd);
                kc_free_names(&idx);
                ktree_close(&w.t);
                return r;
        }
        kc_walk(&w, d, w.root);
        closedir(d);
        if (w.tty)
                fprintf(stderr, "\rkcache: scanned %zu files\n", w.files.n);
        if (idx.n) /* an empty set has no array: qsort's pointer must not be NULL */
                qsort(idx.v, idx.n, sizeof(*idx.v), kc_cmp_name);
        if (w.files.n)
                qsort(w.files.v, w.files.n, sizeof(*w.files.v), kc_cmp_name);
        if (w.ndirs)
                qsort(w.dirs, w.ndirs, sizeof(*w.dirs), kc_cmp_dir);
        long diff = 0;
        size_t i = 0, j = 0;
        struct kc_name *tv = w.files.v;
        while (i < idx.n || j < w.files.n) {
                int c = i == idx.n ? 1 : j == w.files.n ? -1 : kc_cmp_name(&idx.v[i], &tv[j]);
                if (c < 0) {
                        char *p = NULL;
                        if (!quiet && kidx_reader_path(rd, idx.v[i].dir, idx.v[i].name, &p) < 0)
                                p = strdup(idx.v[i].name);
                        if (!quiet)
                                kc_report("only in the index:  ", p, "%s", "");
                        diff++, i++;
                } else if (c > 0) {
                        if (!quiet)
                                kc_report("not in the index:   ", kc_tree_path(&w, tv[j].dir, tv[j].name),
                                          " (%" PRIu64 " bytes)", tv[j].bytes);
                        diff++, j++;
                } else {
                        if (idx.v[i].bytes != tv[j].bytes || idx.v[i].ino != tv[j].ino) {
                                if (!quiet)
                                        kc_report("differs:            ", kc_tree_path(&w, tv[j].dir, tv[j].name),
                                                  " (index %" PRIu64 " bytes, tree %" PRIu64 ")", idx.v[i].bytes,
                                                  tv[j].bytes);
                                diff++;
                        }
                        i++, j++;
                }
        }
        kidx_reader_close(rd);
        kc_free_names(&idx);
        kc_free_names(&w.files);
        for (size_t k = 0; k < w.ndirs; k++)
                free(w.dirs[k].name);
        free(w.dirs);
        ktree_close(&w.t);
        return diff;
}

/* The daemon's reconcile (a rescan of the backing tree): the time it has taken so far. */
static bool kc_show_repairing(const char *mount, void *state, unsigned tick)
{
        (void)mount;
        (void)state;
        fprintf(stderr, "\rkcache: repairing: rescanning the backing directory");
        if (tick)
                fprintf(stderr, ", %u s", tick / 5);
        return true;
}

static int kc_repair_with_progress(const char *mount)
{
        return kc_set_watched(mount, "reconcile", "1", kc_show_repairing, NULL);
}

int kc_cmd_verify(const struct kc_verb *v, int argc, char **argv)
{
        bool repair;
        const char *mount;
        int rc = kc_flag_and_mount(v, argc, argv, "repair", KC_O_REPAIR, &repair, &mount);
        if (rc >= 0)
                return rc;
        /* The walk holds a descriptor per level of the tree: as deep as the hard limit allows. */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
        /* A change in flight (a write, an eviction by the daemon) between the index's flush and the walk
         * of the tree is a difference that is not one: a comparison that finds any is made again, and
         * the second one is what is reported. */
        long d = kc_compare(mount, true);
        if (d > 0)
                d = kc_compare(mount, false);
        if (d < 0)
                return kc_fail("%s: cannot verify: %s", mount, strerror((int)-d));
        if (d == 0) {
                printf("%s: the index matches the backing directory\n", mount);
                return 0;
        }
        printf("%s: %ld difference%s\n", mount, d, d == 1 ? "" : "s");
        if (!repair)
                return 1;
        int r = kc_repair_with_progress(mount);
        if (r < 0)
                return kc_fail("%s: repair failed: %s%s", mount, strerror(-r), kc_perm_hint(r));
        d = kc_compare(mount, true);
        if (d != 0)
                return kc_fail("%s: %ld differences remain after the repair", mount, d);
        printf("%s: repaired; the index matches the backing directory\n", mount);
        return 0;
}
