/* export.c: kcache stats --json and --prometheus, and the atomic replacement of an output file
 * (the rules are in export.h).
 *
 * What must stay true: JSON is json-c's (strings by quote.h's rules); every Prometheus sample follows its
 * family's # HELP and # TYPE, once each, and no HELP text holds a backslash or a newline (the format would
 * need them escaped); an output file is never seen half written, and a write that failed is an error. */
#include "export.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kcache.h"
#include "quote.h"

int kc_stats_read(const char *mount, struct json_object **ret)
{
        char text[65536];
        ssize_t n = kc_get(mount, "stats", text, sizeof(text));
        if (n < 0)
                return (int)n;
        struct json_object *o = json_tokener_parse(text);
        if (!json_object_is_type(o, json_type_object)) {
                json_object_put(o);
                return -EPROTO;
        }
        *ret = o;
        return 0;
}

/* ---- JSON ---- */

struct users {
        FILE *out;
        const char *mount;
        struct json_object *arr; /* JSON */
        int err;                 /* the first failure, -errno */
};

static void json_user(void *ud, uint32_t uid, uint64_t files, uint64_t bytes)
{
        struct users *u = ud;
        struct json_object *row = json_object_new_object();
        if (!row || json_object_object_add(row, "uid", json_object_new_int64(uid)) < 0 ||
            json_object_object_add(row, "files", json_object_new_uint64(files)) < 0 ||
            json_object_object_add(row, "bytes", json_object_new_uint64(bytes)) < 0 ||
            json_object_array_add(u->arr, row) < 0) {
                json_object_put(row);
                u->err = -ENOMEM;
        }
}

int kc_stats_json(FILE *out, const char *mount, struct json_object *stats, kidx_reader *rd)
{
        struct users u = { .arr = json_object_new_array() };
        struct json_object *m = json_object_new_string(mount);
        if (!u.arr || !m) {
                json_object_put(u.arr);
                json_object_put(m);
                return -ENOMEM;
        }
        json_object_object_add(stats, "mount", m);
        json_object_object_add(stats, "users", u.arr);
        if (rd)
                kidx_reader_users(rd, json_user, &u);
        if (u.err)
                return u.err;
        int r = kc_json_write(out, stats);
        if (r == 0 && fputc('\n', out) == EOF)
                r = -EIO;
        return r;
}

/* ---- Prometheus ---- */

/* Every metric of the daemon's stats object that is a number, in its order: the key, counter or gauge,
 * and its help (kcachefs(8) and kcache(1) say more). A counter is written NAME_total. */
static const struct { const char *key, *type, *help; } METRICS[] = {
        { "max_bytes", "gauge", "The mount's size limit (max_size)." },
        { "used_bytes", "gauge", "Bytes the cache's files take (allocated blocks)." },
        { "free_bytes", "gauge", "Bytes left under the limit." },
        { "files", "gauge", "Files in the cache." },
        { "opens", "counter", "Opens of cached files (hits)." },
        { "bytes_read", "counter", "Bytes read from cached files through the daemon." },
        { "evicted_files", "counter", "Files evicted." },
        { "evicted_bytes", "counter", "Bytes evicted." },
        { "rebuilds", "counter", "Rebuilds of the index from the backing directory." },
        { "passthrough_opens", "counter", "Opens served by kernel passthrough." },
        { "ring_requests", "counter", "Requests served through io_uring." },
        { "direct_requests", "counter", "Of the io_uring requests, OPENs and RELEASEs answered without libfuse." },
        { "direct_interrupts", "counter", "INTERRUPTs for requests answered without libfuse, kept from libfuse." },
        { "refreshed", "counter", "Files whose attributes the kernel got anew after a release." },
        { "refresh_dropped", "counter", "Files whose attributes were dropped at release instead of refreshed." },
        { "helped_writes", "counter", "Writes granted room by another request's eviction." },
        { "blocked_writes", "counter", "Writes that found no room and waited for an eviction." },
        { "background_evictions", "counter", "Descents to the low watermark run ahead of the writes." },
        { "index_bytes", "gauge", "Bytes of the index's database and write-ahead log on disk." },
        { "wal_bytes", "gauge", "Bytes of the index's write-ahead log." },
        { "inode_fds", "gauge", "Descriptors the daemon holds for inodes." },
        { "fd_reopens", "counter", "Inode descriptors reopened." },
        { "refetches", "counter", "Files evicted, then stored again under the same name." },
        { "refetch_bytes", "counter", "Bytes of the refetched files." },
        { "suggested_max_bytes", "gauge",
          "A limit that would have kept 9 in 10 refetched files, under the low watermark with the kept bytes." },
        { "refused_writes", "counter", "Writes refused: all that was left was open, pinned or in use." },
        { "refused_need_bytes", "gauge", "The largest limit a refused write needed." },
        { "inodes", "gauge", "Inodes the kernel knows." },
        { "detached_inodes", "gauge", "Evicted or removed inodes the kernel has not forgotten yet." },
        { "pruned_names", "counter", "Evicted names pruned from the kernel's cache." },
        { "remote_hits", "counter", "Units fetched from the shared tier." },
        { "remote_misses", "counter", "Lookups the shared tier did not have." },
        { "remote_remembered", "counter", "Misses answered from memory without asking the shared tier." },
        { "remote_timeouts", "counter", "Requests to the shared tier that timed out." },
        { "remote_errors", "counter", "Requests to the shared tier that failed." },
        { "remote_corrupt", "counter", "Values from the shared tier refused as malformed." },
        { "remote_dirs", "counter", "Directories fetched from the shared tier." },
        { "remote_publishes", "counter", "Units published to the shared tier." },
        { "remote_published_before", "counter", "Units found already on the shared tier when published." },
        { "remote_touches", "counter", "Units told in use to the shared tier." },
        { "herd_waits", "counter", "Lookups that waited for a compile: another node's, or another process's on this one." },
        { "herd_served", "counter", "Herd waits that got the compile's result." },
        { "herd_gave_up", "counter", "Herd waits that compiled after all." },
        { "remote_server_used_bytes", "gauge", "The shared tier server's memory in use, as last read." },
        { "remote_server_max_bytes", "gauge", "The shared tier server's memory limit, as last read (0: none)." },
        { "remote_server_evicted_keys", "gauge", "Keys the shared tier server has evicted, as last read." },
        { "remote_server_keys", "gauge", "Keys on the shared tier server, as last read." },
        { "remote_bytes_in", "counter", "Bytes fetched from the shared tier." },
        { "remote_bytes_out", "counter", "Bytes published to the shared tier." },
        { "remote_trusted_hits", "counter", "Remote hits served from a trusted publisher's namespace." },
        { "kept_files", "gauge", "Files never evicted: pinned, or a runtime's locks, counters and settings." },
        { "kept_bytes", "gauge", "Bytes of the files never evicted." },
};
#define NMETRICS (sizeof(METRICS) / sizeof(METRICS[0]))

static void prom_user(void *ud, uint32_t uid, uint64_t files, uint64_t bytes)
{
        struct users *u = ud;
        (void)files;
        fputs("kcachefs_user_used_bytes{mount=", u->out);
        kc_put_prom(u->out, u->mount);
        fprintf(u->out, ",uid=\"%" PRIu32 "\"} %" PRIu64 "\n", uid, bytes);
}

int kc_stats_prometheus(FILE *out, const char *mount, struct json_object *stats, kidx_reader *rd)
{
        for (size_t i = 0; i < NMETRICS; i++) {
                struct json_object *v;
                if (!json_object_object_get_ex(stats, METRICS[i].key, &v) || !json_object_is_type(v, json_type_int))
                        continue;
                const char *suffix = !strcmp(METRICS[i].type, "counter") ? "_total" : "";
                fprintf(out, "# HELP kcachefs_%s%s %s\n# TYPE kcachefs_%s%s %s\nkcachefs_%s%s{mount=", METRICS[i].key,
                        suffix, METRICS[i].help, METRICS[i].key, suffix, METRICS[i].type, METRICS[i].key, suffix);
                kc_put_prom(out, mount);
                fprintf(out, "} %" PRIu64 "\n", json_object_get_uint64(v));
        }
        if (rd) {
                struct users u = { .out = out, .mount = mount };
                fputs("# HELP kcachefs_user_used_bytes Bytes of the cache's files owned by each user.\n"
                      "# TYPE kcachefs_user_used_bytes gauge\n", out);
                kidx_reader_users(rd, prom_user, &u);
        }
        return ferror(out) ? -EIO : 0;
}

/* ---- where it goes ---- */

int kc_out_open(struct kc_out *o, const char *path)
{
        *o = (struct kc_out){ .f = stdout, .dir.root = -1 };
        if (!path)
                return 0;
        char *d = strdup(path), *b = strdup(path);
        int r = 0, fd = -1;
        if (!d || !b || !(o->path = strdup(path)) || !(o->base = strdup(basename(b))) ||
            asprintf(&o->tmp, ".%s.XXXXXX", o->base) < 0) {
                o->tmp = NULL;
                r = -ENOMEM;
        }
        const char *dir = r == 0 ? dirname(d) : NULL;
        char why[PATH_MAX + 200] = "";
        if (r == 0 && !ktree_name_ok(o->base))
                r = -EISDIR;
        int dfd = r == 0 ? ktree_chase_dir(dir, geteuid(), why, sizeof(why)) : -1; /* OTHER USERS (export.h) */
        if (r == 0 && dfd < 0)
                r = dfd;
        if (r == 0 && (r = ktree_init_fd(&o->dir, dfd)) < 0)
                close(dfd);
        free(d);
        free(b);
        if (r < 0 && *why) {
                kc_fail("%s: cannot write: %s", path, why);
                free(o->tmp);
                free(o->path);
                free(o->base);
                *o = (struct kc_out){ 0 };
                return r;
        }
        /* a new name beside path, never one that exists (O_EXCL), resolved beneath the directory held */
        size_t tl = o->tmp ? strlen(o->tmp) : 0;
        for (unsigned tries = 0; r == 0 && fd < 0 && tries < 100; tries++) {
                static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
                unsigned char rnd[6];
                if (getentropy(rnd, sizeof(rnd)) < 0) {
                        r = -errno;
                        break;
                }
                for (size_t i = 0; i < 6; i++)
                        o->tmp[tl - 6 + i] = abc[rnd[i] % (sizeof(abc) - 1)];
                fd = ktree_open(&o->dir, KTREE_ROOT, o->tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
                if (fd < 0 && fd != -EEXIST)
                        r = fd;
        }
        if (r == 0 && fd < 0)
                r = -EEXIST;
        if (r == 0) {
                mode_t mask = umask(0);
                umask(mask);
                if (fstat(fd, &o->tmp_st) < 0 || fchmod(fd, 0666 & ~mask) < 0 || !(o->f = fdopen(fd, "w")))
                        r = -errno;
        }
        if (r < 0) {
                kc_fail("%s: cannot write: %s", path, strerror(-r));
                if (fd >= 0) {
                        close(fd);
                        (void)ktree_unlink(&o->dir, KTREE_ROOT, o->tmp, &o->tmp_st, 0);
                }
                if (o->dir.root >= 0)
                        ktree_close(&o->dir);
                free(o->tmp);
                free(o->path);
                free(o->base);
                *o = (struct kc_out){ 0 };
        }
        return r;
}

int kc_out_close(struct kc_out *o, bool ok)
{
        errno = 0;
        bool failed = fflush(o->f) != 0 || ferror(o->f);
        int r = failed ? -(errno ? errno : EIO) : 0;
        if (!o->path) {
                if (r < 0)
                        kc_fail("cannot write the output: %s", strerror(-r));
                return r;
        }
        if (r == 0 && fsync(fileno(o->f)) < 0)
                r = -errno;
        if (fclose(o->f) != 0 && r == 0)
                r = -errno;
        if (r == 0 && ok)
                r = ktree_rename(&o->dir, KTREE_ROOT, o->tmp, KTREE_ROOT, o->base, 0);
        if (r < 0 || !ok)
                (void)ktree_unlink(&o->dir, KTREE_ROOT, o->tmp, &o->tmp_st, 0); /* only the file made */
        if (r < 0)
                kc_fail("%s: cannot write: %s", o->path, strerror(-r));
        ktree_close(&o->dir);
        free(o->tmp);
        free(o->path);
        free(o->base);
        *o = (struct kc_out){ 0 };
        return r;
}
