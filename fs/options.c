/* options.c: parsing of kcachefs's options (the -o list through fuse_opt, sizes, pin lists, layouts).
 * Pure functions: no I/O, so the fuzz target (tests/fuzz/fuzz-options.c) calls them directly.
 *
 * RANGES. Every numeric option is taken as the string given (fuse_opt's %u would read "-5" as 2^32 - 5)
 * and checked here against a range; a value outside it is refused in one line that names the option, the
 * value and the range, before anything is made. Sizes and durations go through common/parse.h, so "1.5G"
 * and "1h" read as kcache reads them. The bounds, and why:
 *   max_size       64K to 1024P. Eviction must be able to keep the pinned bookkeeping (a runtime's size
 *                  file and locks, one block each) and a few entries under the limit: 64K is 16 blocks of
 *                  4K, below which the pins alone fill it (the runtime tests run at 256K). 1024P (2^60)
 *                  is beyond any disk and keeps a limit plus a file's size far from 64-bit overflow.
 *   low_watermark  1 to 100 (percent of max_size).
 *   timeout        0 to 1d: how long the kernel trusts a name or attribute; 0 asks it every time. Longer
 *                  than a day is a unit mistaken, not a choice.
 *   tmp_age        1s to 30d: 0 would make a temporary file that a runtime is still writing count as
 *                  leaked at once, and eviction would take it from under the writer.
 *   grace_ms       0 to 3600000 (an hour): a runtime builds an entry in seconds; a longer grace keeps
 *                  every file used within it from eviction, and a busy cache would refuse writes.
 *   flush_ms       10 to 60000: each flush is a commit of the index; below 10 ms the writer commits without
 *                  pause, and above a minute a crash loses a minute of the access order.
 *   protect        open or writers (not a number, but checked here too: kcache set and the settings
 *                  file go through this one checker, as the command line does).
 *   inode_fds      1 to 2^30 (the kernel's largest fs.nr_open); never more than RLIMIT_NOFILE allows
 *                  (inode.c). 0 would keep no idle descriptor: not given means half RLIMIT_NOFILE. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "kfs.h"
#include "../common/parse.h"

#define MIN_MAX_SIZE (64ULL << 10)
#define MAX_MAX_SIZE (1ULL << 60)

/* A whole number, digits only (no sign, no space): strtoull alone would take "-5" and " 5". */
static int whole(const char *s, uint64_t *ret)
{
        if (!s || !isdigit((unsigned char)*s))
                return -EINVAL;
        for (const char *p = s; *p; p++)
                if (!isdigit((unsigned char)*p))
                        return -EINVAL;
        errno = 0;
        unsigned long long v = strtoull(s, NULL, 10);
        if (errno == ERANGE)
                return -ERANGE;
        *ret = v;
        return 0;
}

/* A whole number of NAME from MIN to MAX (UNIT says what it counts). */
static int check_whole(const char *name, const char *given, const char *unit, uint64_t min, uint64_t max,
                       unsigned *ret, char *why, size_t len)
{
        uint64_t v = 0;
        if (!given)
                return 0;
        if (whole(given, &v) < 0 || v < min || v > max) {
                snprintf(why, len, "invalid %s '%s': expected whole %s from %" PRIu64 " to %" PRIu64, name, given,
                         unit, min, max);
                return -EINVAL;
        }
        *ret = (unsigned)v;
        return 0;
}

/* A duration of NAME from MIN to MAX seconds (MIN_S, MAX_S: the same as typed in the message). */
static int check_duration(const char *name, const char *given, double min, double max, const char *min_s,
                          const char *max_s, double *ret, char *why, size_t len)
{
        double v = 0;
        if (!given)
                return 0;
        if (kparse_duration(given, &v, 1) < 0 || v < min || v > max) {
                snprintf(why, len, "invalid %s '%s': expected a duration from %s to %s (seconds, or with s, m, h, "
                         "d)", name, given, min_s, max_s);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

int kfs_opts_check(struct kfs_opts *o, const char *default_max_size, char *why, size_t len)
{
        const char *ms = o->max_size_str ? o->max_size_str : default_max_size;
        int r = kparse_size(ms, &o->max_size, 1);
        if (r < 0 || o->max_size < MIN_MAX_SIZE || o->max_size > MAX_MAX_SIZE) {
                snprintf(why, len, "invalid max_size '%s': %s; allowed from 64K to 1024P", ms,
                         r == -EINVAL ? "expected a number with an optional K, M, G, T or P"
                         : r == -ERANGE || o->max_size > MAX_MAX_SIZE ? "too large"
                         : o->max_size == 0 ? "must be more than zero" : "too small for eviction to work with");
                return -EINVAL;
        }
        if (o->low_watermark_str) {
                char *end;
                long v = strtol(o->low_watermark_str, &end, 10);
                if (!isdigit((unsigned char)*o->low_watermark_str) || (*end && strcmp(end, "%")) || v < 1 || v > 100) {
                        snprintf(why, len, "invalid low_watermark '%s': expected a percentage from 1 to 100",
                                 o->low_watermark_str);
                        return -EINVAL;
                }
                o->low_watermark = (unsigned)v;
        }
        if (check_duration("timeout", o->timeout_str, 0, 86400, "0", "1d", &o->timeout, why, len) < 0 ||
            check_duration("tmp_age", o->tmp_age_str, 1, 30 * 86400, "1s", "30d", &o->tmp_age, why, len) < 0 ||
            check_whole("grace_ms", o->grace_ms_str, "milliseconds", 0, 3600000, &o->grace_ms, why, len) < 0 ||
            check_whole("flush_ms", o->flush_ms_str, "milliseconds", 10, 60000, &o->flush_ms, why, len) < 0 ||
            check_whole("inode_fds", o->inode_fds_str, "descriptors", 1, 1u << 30, &o->inode_fds, why, len) < 0 ||
            check_whole("remote_timeout_ms", o->remote_timeout_ms_str, "milliseconds", 1, 60000, &o->remote_timeout_ms,
                        why, len) < 0 ||
            check_duration("remote_negative_s", o->remote_negative_s_str, 0, 86400, "0", "1d", &o->remote_negative_s,
                           why, len) < 0 ||
            check_duration("remote_touch_s", o->remote_touch_s_str, 0.1, 86400, "0.1s", "1d", &o->remote_touch_s, why,
                           len) < 0 ||
            check_duration("herd_wait", o->herd_wait_str, 0, 3600, "0", "1h", &o->herd_wait, why, len) < 0)
                return -EINVAL;
        if (o->protect_str) {
                if (strcmp(o->protect_str, "open") && strcmp(o->protect_str, "writers")) {
                        snprintf(why, len, "invalid protect '%s': expected 'open' or 'writers'", o->protect_str);
                        return -EINVAL;
                }
                o->protect = strcmp(o->protect_str, "open") ? KFS_PROTECT_WRITERS : KFS_PROTECT_OPEN;
        }
        return 0;
}

/* "GLOB:GLOB:..." into a NULL-terminated array; empty items are skipped. "" gives an empty list. */
int kfs_parse_pins(const char *s, char ***ret)
{
        size_t n = 1;
        for (const char *p = s; *p; p++)
                n += *p == ':';
        char **v = calloc(n + 1, sizeof(*v));
        char *copy = strdup(s);
        if (!v || !copy) {
                free(v);
                free(copy);
                return -ENOMEM;
        }
        size_t k = 0;
        for (char *save = NULL, *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
                if (!(v[k] = strdup(tok))) {
                        for (size_t i = 0; i < k; i++)
                                free(v[i]);
                        free(v);
                        free(copy);
                        return -ENOMEM;
                }
                k++;
        }
        free(copy);
        *ret = v;
        return 0;
}

void kfs_free_opts(struct kfs_opts *o)
{
        free(o->remote_url);
        free(o->remote_auth);
        free(o->remote_publish);
        free(o->remote_publisher);
        free(o->remote_trusted);
        free(o->backing);
        free(o->mountpoint);
        free(o->mountpoint_arg);
        free(o->index_path);
        free(o->max_size_str);
        free(o->low_watermark_str);
        free(o->pin_str);
        free(o->protect_str);
        if (o->pins)
                for (char **p = o->pins; *p; p++)
                        free(*p);
        free(o->pins);
        free(o->layout_str);
        for (size_t i = 0; i < o->nlayouts; i++)
                free(o->layouts[i].dir);
        free(o->layouts);
        free(o->timeout_str);
        free(o->tmp_age_str);
        free(o->grace_ms_str);
        free(o->flush_ms_str);
        free(o->inode_fds_str);
        free(o->remote_timeout_ms_str);
        free(o->remote_negative_s_str);
        free(o->remote_touch_s_str);
        free(o->herd_wait_str);
        free(o->log_path);
        free(o->config_path);
}

enum { KEY_HELP, KEY_VERSION, KEY_ALLOW_OTHER, KEY_DEFAULT_PERMISSIONS };

#define OPT(t, f) { t, offsetof(struct kfs_opts, f), 1 }
static const struct fuse_opt kfs_optspec[] = {
        OPT("max_size=%s", max_size_str),
        OPT("index=%s", index_path),
        OPT("low_watermark=%s", low_watermark_str),
        OPT("pin=%s", pin_str),
        OPT("protect=%s", protect_str),
        OPT("layout=%s", layout_str),
        OPT("tmp_age=%s", tmp_age_str), /* numbers as given: kfs_opts_check reads and checks them */
        OPT("grace_ms=%s", grace_ms_str),
        OPT("inode_fds=%s", inode_fds_str),
        OPT("timeout=%s", timeout_str),
        OPT("flush_ms=%s", flush_ms_str),
        OPT("log=%s", log_path),
        OPT("config=%s", config_path),
        OPT("nolog", nolog),
        OPT("stale_locks", stale_locks),
        OPT("nopassthrough", nopassthrough),
        OPT("nouring", nouring),
        OPT("norefresh", norefresh),
        FUSE_OPT_KEY("refresh", FUSE_OPT_KEY_DISCARD), /* the default */
        FUSE_OPT_KEY("uring", FUSE_OPT_KEY_DISCARD), /* the default, accepted where said explicitly */
        OPT("rebuild", rebuild),
        OPT("tighten", tighten),
        OPT("remote=%s", remote_url),
        OPT("remote_auth=%s", remote_auth),
        OPT("remote_publish=%s", remote_publish),
        OPT("remote_publisher=%s", remote_publisher),
        OPT("remote_trusted=%s", remote_trusted),
        OPT("remote_timeout_ms=%s", remote_timeout_ms_str), /* not %u, %lf: sscanf took "-1" for "not given", */
        OPT("remote_negative_s=%s", remote_negative_s_str), /* "5m" for 5 s and "nan" for the default */
        OPT("remote_touch_s=%s", remote_touch_s_str),
        OPT("herd_wait=%s", herd_wait_str),
        /* libfuse's, noted and passed on: a shared mount gets default_permissions,nosuid,nodev (main.c) */
        FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
        FUSE_OPT_KEY("default_permissions", KEY_DEFAULT_PERMISSIONS),
        FUSE_OPT_KEY("-h", KEY_HELP),
        FUSE_OPT_KEY("--help", KEY_HELP),
        FUSE_OPT_KEY("-V", KEY_VERSION),
        FUSE_OPT_KEY("--version", KEY_VERSION),
        FUSE_OPT_END
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
        (void)outargs;
        struct kfs_opts *o = data; /* the option offsets are relative to it */
        switch (key) {
        case FUSE_OPT_KEY_NONOPT:
                if (!o->backing) {
                        o->backing = strdup(arg);
                        return 0; /* the first operand is ours; the second is libfuse's mountpoint */
                }
                if (!o->mountpoint_arg)
                        o->mountpoint_arg = strdup(arg); /* checked before libfuse sees it (main.c) */
                return 1;
        case KEY_HELP:
                o->show_help = 1;
                return 0;
        case KEY_VERSION:
                o->show_version = 1;
                return 0;
        case KEY_ALLOW_OTHER:
                o->allow_other = 1;
                return 1;
        case KEY_DEFAULT_PERMISSIONS:
                o->default_permissions = 1;
                return 1;
        default:
                return 1;
        }
}

int kfs_opts_parse(struct fuse_args *args, struct kfs_opts *o)
{
        return fuse_opt_parse(args, o, kfs_optspec, opt_proc) < 0 ? -EINVAL : 0;
}

int kfs_parse_layouts(const char *s, struct kfs_layout **ret, size_t *ret_n)
{
        /* "RT" for the whole mount, or "DIR=RT:DIR=RT..." per subdirectory (relative to the mount). */
        struct kfs_layout *v = NULL;
        size_t n = 0;
        char *copy = strdup(s), *save = NULL;
        if (!copy)
                return -ENOMEM;
        for (char *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
                char *eq = strrchr(tok, '=');
                const char *rtname = eq ? eq + 1 : tok;
                int found = krt_by_name(rtname);
                enum krt rt = found < 0 ? KRT_AUTO : (enum krt)found;
                struct kfs_layout *nv = NULL;
                int r = found < 0 ? -EINVAL
                        : (nv = realloc(v, (n + 1) * sizeof(*nv))) ? 0 : -ENOMEM;
                if (r < 0) { /* the directories taken so far go too (the options fuzzer found the leak) */
                        for (size_t i = 0; i < n; i++)
                                free(v[i].dir);
                        free(copy);
                        free(v);
                        return r;
                }
                v = nv;
                char *dir = eq ? strndup(tok, (size_t)(eq - tok)) : strdup("");
                while (dir && *dir == '/')
                        memmove(dir, dir + 1, strlen(dir));
                for (size_t l = dir ? strlen(dir) : 0; l > 0 && dir[l - 1] == '/'; l--)
                        dir[l - 1] = '\0';
                v[n].dir = dir;
                v[n].rt = rt;
                n++;
        }
        free(copy);
        *ret = v;
        *ret_n = n;
        return 0;
}
