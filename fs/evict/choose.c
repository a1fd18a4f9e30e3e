/* choose.c: what goes first (evict.h: WHAT GOES FIRST, GRACE, WHAT IS NEVER EVICTED).
 *
 * The LRU walk reads the index's rows in access order, a batch at a time, and turns each file into its
 * runtime's unit (units.c): a single file is a victim at once; a unit of several files is taken when the
 * walk reaches its newest member, since that is the unit's recency. Open, pinned and young files are
 * passed over; a unit with one such member stays whole.
 *
 * ONE VERDICT PER LOCK. A unit its runtime holds (busy) is passed over too, and the walk goes on to newer
 * entries. Where one lock file guards a whole cache (PyOpenCL's compiler cache), every unit of that cache
 * is held alike, so the verdict is taken once for the cache, the first time the eviction meets one of its
 * units, and kept for the rest of the eviction (its passes and batches: struct kev_busy). Judged unit by
 * unit, a lock released while the walk was in the cache made the older units busy and a newer one free:
 * the background descent, kicked by PyOpenCL's own write of a key under its lock, passed over every older
 * key while the lock stood, and took the key stored just before once PyOpenCL unlinked it a moment later
 * (the ASan pass of test_pyopencl_through_an_evicting_cache missed a key stored by the process before).
 * A lock that appears during the walk still makes what follows busy: someone is inside the cache now. */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

void kev_dircache_free(struct dircache *c)
{
        for (int i = 0; i < c->n; i++) {
                free(c->path[i]);
                if (c->fd[i] >= 0)
                        close(c->fd[i]);
        }
        c->n = c->next = 0;
}

int kev_dirref_open(struct kfs *fs, const struct kev_dirref *d, int flags)
{
        int fd = ktree_open(&fs->tree, KTREE_ROOT, d->rel, flags | O_DIRECTORY, 0);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_dev != fs->tree.dev || st.st_ino != (ino_t)d->ino)) {
                close(fd);
                return -ESTALE;
        }
        return fd;
}

int kev_dirref_make(struct kfs *fs, const char *rel, struct kev_dirref *ret)
{
        struct stat st;
        int r = ktree_stat(&fs->tree, KTREE_ROOT, rel, &st);
        if (r < 0)
                return r;
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        if (!(ret->rel = strdup(rel)))
                return -ENOMEM;
        ret->ino = st.st_ino;
        return 0;
}

/* The slot of directory ino, filled on first use (round-robin replacement). */
int kev_dircache_get(struct kfs *fs, struct dircache *c, uint64_t ino)
{
        for (int i = 0; i < c->n; i++)
                if (c->ino[i] == ino)
                        return i;
        int i;
        if (c->n < DIRCACHE) {
                i = c->n++;
        } else {
                i = c->next;
                c->next = (c->next + 1) % DIRCACHE;
                free(c->path[i]);
                if (c->fd[i] >= 0)
                        close(c->fd[i]);
        }
        /* Reached through the index's names, each component checked to be the directory the index holds
         * (tree.h, R1-R4): a directory renamed or swapped for a symlink since is not this one, and its
         * victims' names are not removed (remove.c). No path string is resolved, so any depth works. */
        struct kidx_chain ch;
        c->ino[i] = ino;
        c->path[i] = NULL;
        c->fd[i] = -1;
        if (kidx_dir_chain(fs->idx, ino, &ch) == 0) {
                c->fd[i] = ktree_walk(&fs->tree, ch.n, (const char *const *)ch.names, ch.inos, O_PATH);
                if (c->fd[i] >= 0 && !(c->path[i] = kidx_chain_path(&ch, ch.n))) {
                        close(c->fd[i]);
                        c->fd[i] = -1;
                }
                kidx_chain_free(&ch);
        }
        return i;
}

struct name_list {
        kidx *idx;
        struct name *names;
        size_t n;
        int err;
};

static void add_name(void *ud, uint64_t dir, const char *name)
{
        struct name_list *l = ud;
        struct name *n = realloc(l->names, (l->n + 1) * sizeof(*n));
        if (!n) {
                l->err = -ENOMEM;
                return;
        }
        l->names = n;
        n[l->n] = (struct name){ .dir = dir, .name = strdup(name) };
        if (!n[l->n].name)
                l->err = -ENOMEM;
        l->n++;
}

void kev_free_names(struct name *names, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                free(names[i].name);
                free(names[i].path);
        }
        free(names);
}

void kev_free_victims(struct victims *vs)
{
        for (size_t i = 0; i < vs->n; i++)
                kev_free_names(vs->v[i].names, vs->v[i].nnames);
        for (size_t i = 0; i < vs->nu; i++)
                free(vs->u[i].repair.rel);
        free(vs->v);
        free(vs->u);
        memset(vs, 0, sizeof(*vs));
}

int kev_push_victim(struct victims *vs, struct victim *v)
{
        if (vs->n == vs->cap) {
                size_t ncap = vs->cap ? vs->cap * 2 : 64;
                struct victim *nv = realloc(vs->v, ncap * sizeof(*nv));
                if (!nv)
                        return -ENOMEM;
                vs->v = nv;
                vs->cap = ncap;
        }
        vs->v[vs->n++] = *v;
        vs->bytes += v->bytes;
        return 0;
}

int kev_push_unit(struct kfs *fs, struct victims *vs, size_t first, enum krt rt, const char *repair)
{
        struct vunit *nu = realloc(vs->u, (vs->nu + 1) * sizeof(*nu));
        if (!nu)
                return -ENOMEM;
        vs->u = nu;
        struct vunit *u = &nu[vs->nu];
        *u = (struct vunit){ first, vs->n - first, rt, { NULL, 0 } };
        if (repair) { /* its identity now, checked when the repair reaches it (R4); gone: nothing to repair */
                int r = kev_dirref_make(fs, repair, &u->repair);
                if (r == -ENOMEM)
                        return r;
        }
        vs->nu++;
        return 0;
}

static struct seen *seen_get(struct seen_set *ss, const char *key)
{
        for (size_t i = 0; i < ss->n; i++)
                if (!strcmp(ss->v[i].key, key))
                        return &ss->v[i];
        struct seen *nv = realloc(ss->v, (ss->n + 1) * sizeof(*nv));
        if (!nv)
                return NULL;
        ss->v = nv;
        nv[ss->n] = (struct seen){ strdup(key), 0, false, false };
        return nv[ss->n].key ? &nv[ss->n++] : NULL;
}

void kev_busy_free(struct kev_busy *b)
{
        for (size_t i = 0; i < b->n; i++)
                free(b->dirs[i]);
        free(b->dirs);
        memset(b, 0, sizeof(*b));
}

/* ONE VERDICT PER LOCK: *busy becomes true if the lock of cache dir was found held earlier in this
 * eviction, and a held one is remembered. -ENOMEM: not remembered (this unit's own verdict stands). */
static int busy_verdict(struct kev_busy *b, const char *dir, bool *busy)
{
        for (size_t i = 0; i < b->n; i++)
                if (!strcmp(b->dirs[i], dir)) {
                        *busy = true;
                        return 0;
                }
        if (!*busy)
                return 0;
        char **n = realloc(b->dirs, (b->n + 1) * sizeof(*n));
        if (!n)
                return -ENOMEM;
        b->dirs = n;
        if (!(n[b->n] = strdup(dir)))
                return -ENOMEM;
        b->n++;
        return 0;
}

/* ONE VERDICT PER LOCK for unit u: held earlier in this eviction, or held now. JAX's lock is asked here
 * (taken without waiting and let go), once per unit until it is found held, and not by the other callers
 * of kev_unit_resolve (the shared tier, kcache evict's listing). A held lock is remembered; without
 * memory to remember it, this unit's own verdict stands. */
static void lock_verdict(struct kfs *fs, struct kev_busy *b, struct kev_unit *u)
{
        bool known = false;
        (void)busy_verdict(b, u->lock_dir, &known); /* only asks, while known is false */
        if (known) {
                u->busy = true;
                return;
        }
        if (!u->busy && u->rt == KRT_JAX) {
                int dfd = ktree_open(&fs->tree, KTREE_ROOT, u->lock_dir, O_PATH | O_DIRECTORY, 0);
                if (dfd >= 0) {
                        u->busy = kev_jax_lock_probe(fs, dfd);
                        close(dfd);
                }
        }
        (void)busy_verdict(b, u->lock_dir, &u->busy);
}

void kev_seen_free(struct seen_set *ss)
{
        for (size_t i = 0; i < ss->n; i++)
                free(ss->v[i].key);
        free(ss->v);
        kmap_free(&ss->files);
}

static bool pinned_path(const struct kfs *fs, const char *path)
{
        /* Loaded once: kcache set or SIGHUP may swap the list meanwhile (fs/settings.c, S4; the old one
         * stays allocated). */
        char **pins = __atomic_load_n(&fs->o.pins, __ATOMIC_ACQUIRE);
        if (!pins)
                return false;
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        for (char **p = pins; *p; p++) {
                /* A pattern with a '/' matches the whole relative path, one without matches the name. */
                const char *subject = strchr(*p, '/') ? path : base;
                if (fnmatch(*p, subject, strchr(*p, '/') ? FNM_PATHNAME : 0) == 0)
                        return true;
        }
        return false;
}

bool kev_is_open_locked(struct kfs *fs, uint64_t ino)
{
        struct kfs_inode *in = kfs_inode_find_locked(fs, ino);
        if (!in)
                return false;
        return in->writers > 0 || in->settling || (fs->o.protect == KFS_PROTECT_OPEN && in->readers > 0);
}

/* Reads a candidate's names and paths. 0: evictable; 1: protected (pinned by pattern); -errno. */
/* The paths of v's names, from their directories' (dc). 0: evictable; 1: pinned by pattern; -errno. */
static int name_paths(struct kfs *fs, struct dircache *dc, struct victim *v)
{
        for (size_t i = 0; i < v->nnames; i++) {
                char *path = NULL;
                const char *dir = dc->path[kev_dircache_get(fs, dc, v->names[i].dir)];
                if (!dir)
                        continue; /* unknown directory: this name cannot be removed (remove.c) */
                if (asprintf(&path, "%s%s%s", dir, dir[0] ? "/" : "", v->names[i].name) < 0)
                        return -ENOMEM;
                v->names[i].path = path;
                if (pinned_path(fs, path))
                        return 1;
        }
        return 0;
}

int kev_load_candidate(struct kfs *fs, struct dircache *dc, struct victim *v)
{
        struct name_list l = { .idx = fs->idx };
        int r = kidx_names(fs->idx, v->ino, add_name, &l);
        if (r >= 0 && l.err)
                r = l.err;
        if (r < 0) {
                kev_free_names(l.names, l.n);
                return r;
        }
        v->names = l.names;
        v->nnames = l.n;
        return name_paths(fs, dc, v);
}

/* The same for a candidate of the LRU batch, whose names came with it (kidx_lru_candidates): they are
 * taken over. */
static int take_candidate(struct kfs *fs, struct dircache *dc, struct victim *v, struct kidx_candidates *c, size_t i)
{
        const struct kidx_candidate *k = &c->v[i];
        v->names = k->n ? calloc(k->n, sizeof(*v->names)) : NULL;
        if (k->n && !v->names)
                return -ENOMEM;
        for (size_t j = 0; j < k->n; j++) {
                v->names[j] = (struct name){ .dir = c->names[k->first + j].dir, .name = c->names[k->first + j].name };
                c->names[k->first + j].name = NULL;
        }
        v->nnames = k->n;
        return name_paths(fs, dc, v);
}

/* Turns a resolved multi-file unit into victims, if it may go now: 1 if taken, 0 if not (yet), -errno.
 * row_seq: the LRU position reached; the unit waits until that is its newest member (its recency). */
int kev_take_unit(struct kfs *fs, struct dircache *dc, struct kev_unit *u, uint64_t row_seq, struct seen *sn,
                     bool grace, struct victims *vs)
{
        size_t first = vs->n;
        int64_t grace_cut = grace ? kev_now(fs) - (int64_t)fs->o.grace_ms * 1000000 : INT64_MAX;
        uint64_t newest = 0;
        int r = 0;
        for (size_t i = 0; i < u->n && r == 0; i++) {
                struct stat st, ds;
                const char *p = u->members[i], *slash = strrchr(p, '/');
                char *dir = slash ? strndup(p, (size_t)(slash - p)) : strdup(".");
                int gone = !dir || ktree_stat(&fs->tree, KTREE_ROOT, p, &st) < 0 || !S_ISREG(st.st_mode) ||
                           ktree_stat(&fs->tree, KTREE_ROOT, dir, &ds) < 0;
                free(dir);
                if (gone)
                        continue; /* gone meanwhile (or reached only through a symlink: not the tree's) */
                struct kidx_file f;
                bool known = kidx_get_file(fs->idx, st.st_ino, &f) == 0;
                pthread_mutex_lock(&fs->itable_lock);
                bool open = kev_is_open_locked(fs, st.st_ino);
                pthread_mutex_unlock(&fs->itable_lock);
                if (open || (known && f.pinned) || pinned_path(fs, p)) {
                        sn->done = true; /* protected as a whole */
                        r = 0;
                        goto undo;
                }
                if (known && f.seq > newest)
                        newest = f.seq;
                if (known && f.atime_ns > grace_cut) {
                        sn->young = true; /* in use right now (GRACE) */
                        kev_note_young(fs, f.atime_ns);
                        goto undo;
                }
                struct name *nm = calloc(1, sizeof(*nm));
                struct victim v = { .ino = st.st_ino, .bytes = known ? f.bytes : (uint64_t)st.st_blocks * 512,
                                    .names = nm, .nnames = 1, .hold = -1 };
                if (!nm || !(nm->name = strdup(slash ? slash + 1 : p)) || !(nm->path = strdup(p))) {
                        kev_free_names(nm, nm ? 1 : 0);
                        r = -ENOMEM;
                        goto undo;
                }
                nm->dir = ds.st_ino == fs->root.bino ? fs->root.bino : ds.st_ino;
                (void)kev_dircache_get(fs, dc, nm->dir);
                if ((r = kev_push_victim(vs, &v)) < 0) {
                        kev_free_names(nm, 1);
                        goto undo;
                }
        }
        sn->newest = newest;
        if (newest > row_seq || vs->n == first) {
                r = 0; /* not its newest member yet: its turn comes later in the walk */
                goto undo;
        }
        if ((r = kev_push_unit(fs, vs, first, u->rt, u->repair)) < 0)
                goto undo;
        sn->done = true;
        return 1;
undo:
        while (vs->n > first) {
                vs->n--;
                vs->bytes -= vs->v[vs->n].bytes;
                kev_free_names(vs->v[vs->n].names, vs->v[vs->n].nnames);
        }
        return r;
}

/* Chooses units in LRU order, from *cursor on, until goal bytes or max_victims files are covered or the
 * LRU runs out; *cursor advances past what was looked at. */
int kev_choose(struct kfs *fs, struct dircache *dc, uint64_t goal, size_t max_victims, uint64_t *cursor,
                  bool grace, struct seen_set *seen, struct victims *vs)
{
        struct kidx_candidates cands = { 0 };
        struct kev_busy own = { 0 };
        struct seen_set ss = { 0 }, *sset = seen ? seen : &ss;
        struct kev_busy *busy = sset->busy ? sset->busy : &own;
        uint64_t after = *cursor;
        int64_t now = kev_now(fs);
        int r = 0;
        while (r == 0 && vs->bytes < goal && vs->n < max_victims) {
                int n = kidx_lru_candidates(fs->idx, after, LRU_BATCH, &cands);
                if (n <= 0) {
                        r = n;
                        break;
                }
                for (int i = 0; r == 0 && i < n && vs->bytes < goal && vs->n < max_victims; i++) {
                        const struct kidx_lru_row *row = &cands.v[i].row;
                        if (grace && row->atime_ns > now - (int64_t)fs->o.grace_ms * 1000000) {
                                /* When the goal can be reached: as the young entry that completes it ages
                                 * (the last of this batch of candidates, if none does: a later look goes on). */
                                uint64_t bytes = vs->bytes;
                                int64_t at = row->atime_ns;
                                for (int j = i; j < n && bytes < goal; j++) {
                                        bytes += cands.v[j].row.bytes;
                                        at = cands.v[j].row.atime_ns;
                                }
                                kev_note_young(fs, at);
                                n = -1; /* LRU order is time order: everything from here on is recent (GRACE) */
                                break;
                        }
                        after = row->seq;
                        pthread_mutex_lock(&fs->itable_lock);
                        bool open = kev_is_open_locked(fs, row->ino);
                        pthread_mutex_unlock(&fs->itable_lock);
                        if (open)
                                continue;
                        struct victim v = { .ino = row->ino, .bytes = row->bytes, .hold = -1, .has_row = true, .row = *row };
                        r = take_candidate(fs, dc, &v, &cands, (size_t)i);
                        const char *path = v.nnames ? v.names[0].path : NULL;
                        struct kev_unit u = { 0 };
                        if (r != 0 || !path || kev_unit_protected(fs, path, row->atime_ns, now) ||
                            ((r = kev_unit_resolve(fs, path, &u)) == -ENOMEM)) {
                                kev_free_names(v.names, v.nnames);
                                kev_unit_free(&u);
                                r = r < 0 ? r : 0;
                                continue;
                        }
                        if (r < 0) {
                                /* A unit that cannot be gathered (a user's tree deeper than add_tree goes):
                                 * its file goes alone. Passing the error up stopped every eviction while
                                 * the file stayed the oldest: a denial of service to every writer. */
                                kev_unit_free(&u);
                                u.rt = KRT_FILE;
                                r = 0;
                        }
                        if (u.rt == KRT_FILE) {
                                if (kmap_get(&sset->files, v.ino)) { /* taken by an earlier pass */
                                        kev_free_names(v.names, v.nnames);
                                        kev_unit_free(&u);
                                        continue;
                                }
                                if ((r = kmap_put(&sset->files, v.ino, vs)) < 0) {
                                        kev_free_names(v.names, v.nnames);
                                        kev_unit_free(&u);
                                        continue;
                                }
                                size_t first = vs->n;
                                r = kev_push_victim(vs, &v);
                                if (r == 0)
                                        r = kev_push_unit(fs, vs, first, KRT_FILE, NULL);
                                else
                                        kev_free_names(v.names, v.nnames);
                                kev_unit_free(&u);
                                continue;
                        }
                        kev_free_names(v.names, v.nnames);
                        if (u.lock_dir)
                                lock_verdict(fs, busy, &u);
                        char key[PATH_MAX + 16];
                        /* A directory unit is its directory; a unit of files in a shared directory (NEO, SYCL,
                         * JAX) is its first member. */
                        bool by_dir = u.dir_unit || u.rt == KRT_TRITON;
                        snprintf(key, sizeof(key), "%d:%s", u.rt, by_dir || !u.n ? u.root : u.members[0]);
                        struct seen *sn = seen_get(sset, key);
                        if (!sn)
                                r = -ENOMEM;
                        else if (!sn->done && !(grace && sn->young) && !u.busy &&
                                 (sn->newest == 0 || row->seq >= sn->newest))
                                r = kev_take_unit(fs, dc, &u, row->seq, sn, grace, vs);
                        r = r < 0 ? r : 0;
                        kev_unit_free(&u);
                }
                if (n < 0)
                        break;
        }
        if (!seen)
                kev_seen_free(&ss);
        kev_busy_free(&own);
        kidx_candidates_free(&cands);
        *cursor = after;
        return r;
}
