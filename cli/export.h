/* export.h: kcache stats's machine-readable outputs (--json, --prometheus) and where they go.
 *
 * Both are written from one reading of the daemon's stats object (fs/control.c), parsed by json-c, so
 * that every number of one output is of the same instant. The mount is named by its real path
 * (realpath(3)): the same mount gives the same label however it was typed. Names follow quote.h. */
#pragma once

#include <stdbool.h>
#include <stdio.h>

#include "../common/tree.h"
#include "../index/kidx.h"

struct json_object;

/* The daemon's stats object of mount (its user.kcachefs.stats), parsed: *ret (json_object_put it) or
 * -errno (-EPROTO: not a JSON object). */
int kc_stats_read(const char *mount, struct json_object **ret);

/* kcache stats --json: the daemon's object, with "mount" and "users" (an array of {uid, files, bytes};
 * empty when rd is NULL, that is without read access to the index) added; one line. 0 or -errno. */
int kc_stats_json(FILE *out, const char *mount, struct json_object *stats, kidx_reader *rd);

/* kcache stats --prometheus: the text exposition format 0.0.4. Every metric family has its # HELP and
 * # TYPE lines before its samples; counters end in _total; the label values are escaped as the format
 * says (quote.h). A key the daemon does not give (an older daemon) is left out, never written as 0.
 * 0 or -errno. */
int kc_stats_prometheus(FILE *out, const char *mount, struct json_object *stats, kidx_reader *rd);

/* Where an output goes: stdout, or a file replaced atomically. kc_out_open(path NULL: stdout) makes a
 * temporary file beside path (".NAME.XXXXXX": same directory, so the rename cannot cross filesystems,
 * and a name a textfile collector's *.prom never matches), mode 0666 less the umask; kc_out_close(ok)
 * flushes it, and when ok and every write succeeded, fsyncs it and renames it over path, else removes
 * it: a reader of path sees the old file or the new one whole, never a part. For stdout, kc_out_close
 * flushes and reports a failed write (a full disk, /dev/full, a closed pipe). Both say what failed on
 * stderr and return -errno.
 * OTHER USERS (kcache stats -o run by root from cron). Path's directory is reached by a walk that nobody
 * else can redirect (common/tree.h ktree_chase_dir: a symbolic link only of root or the caller, a
 * directory of another user or open to others only as the last step; otherwise -EACCES, saying which)
 * and held open; every name in it (the temporary, the rename, a removal) is resolved beneath that
 * descriptor, so a swap of the path meanwhile changes nothing. Path's own directory may be anybody's (a
 * collector's account's, a sticky /tmp): what is made there is only ever a new name, and the rename
 * replaces a name, never a file a symlink leads to. */
struct kc_out {
        FILE *f;
        char *path, *tmp; /* NULL for stdout; tmp: the temporary's name in dir */
        char *base;       /* path's last component */
        struct ktree dir; /* path's directory, held open */
        struct stat tmp_st;
};
int kc_out_open(struct kc_out *o, const char *path);
int kc_out_close(struct kc_out *o, bool ok);
