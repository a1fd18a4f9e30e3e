/* options.c: parsing of kcachefs's options (the -o list through fuse_opt, sizes, pin lists, layouts).
 * Pure functions: no I/O, so the fuzz target (tests/fuzz/fuzz-options.c) calls them directly. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "kfs.h"
#include "../common/parse.h"

/* The limit and other sizes: common/parse.h. Zero is refused. */
int kfs_parse_size(const char *s, uint64_t *ret)
{
        return kparse_size(s, ret, 0);
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
        OPT("tmp_age=%lf", tmp_age),
        OPT("grace_ms=%u", grace_ms),
        OPT("inode_fds=%u", inode_fds),
        OPT("timeout=%lf", timeout),
        OPT("flush_ms=%u", flush_ms),
        OPT("nolog", nolog),
        OPT("stale_locks", stale_locks),
        OPT("nopassthrough", nopassthrough),
        OPT("nouring", nouring),
        FUSE_OPT_KEY("uring", FUSE_OPT_KEY_DISCARD), /* the default, accepted where said explicitly */
        OPT("rebuild", rebuild),
        OPT("tighten", tighten),
        OPT("remote=%s", remote_url),
        OPT("remote_auth=%s", remote_auth),
        OPT("remote_timeout_ms=%u", remote_timeout_ms),
        OPT("remote_negative_s=%lf", remote_negative_s),
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
