/* kcache.h: what kcache.c shares with the verbs kept in files of their own (verify.c). Every function
 * that says something says it on stderr as "kcache: ...", and returns KC_EXIT_FAILED (args.h) or -errno
 * as noted; none exits. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "args.h"

#define KC_PREFIX "user.kcachefs."

/* Says "kcache: " and the message on stderr. Returns KC_EXIT_FAILED. */
int kc_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Reads the attribute user.kcachefs.NAME of path into buf (NUL-terminated). The length or -errno. */
ssize_t kc_get(const char *path, const char *name, char *buf, size_t size);
/* Sets user.kcachefs.NAME of path to value. 0 or -errno (the daemon's: EPERM for another user). */
int kc_set(const char *path, const char *name, const char *value);
/* Sets attr to value on the mount: one request, which the daemon answers when the work is done. On a
 * terminal, show is called at the start (tick 0) and every 200 ms meanwhile, and says whether it printed. */
int kc_set_watched(const char *mount, const char *attr, const char *value,
                   bool (*show)(const char *mount, void *state, unsigned tick), void *state);
/* The mount given, or the default ($KCACHEFS_MOUNT, else ~/.cache/kcachefs/mnt), once it is checked to
 * be the root of a kcachefs mount; NULL once the error is said. */
const char *kc_mount_or_default(const char *given);
/* The command line of a verb whose only option is one flag (--NAME, of value id) and whose operand is an
 * optional MOUNT (config, remote, verify): *flag whether it was given, *mount as kc_mount_or_default.
 * -1 to go on, or the exit status (the help, bad usage, or no mount). */
int kc_flag_and_mount(const struct kc_verb *v, int argc, char **argv, const char *name, int id, bool *flag,
                      const char **mount);
/* The hint an -EPERM or -EACCES of the daemon deserves, else "". */
const char *kc_perm_hint(int e);

/* The daemon's figure user.kcachefs.NAME of mount, 0 if unread. */
uint64_t kc_num(const char *mount, const char *name);
/* b bytes in words: "1.5 GiB". */
void kc_human(uint64_t b, char *buf, size_t size);

/* config.c: kcache config [MOUNT] [--json], kcache set MOUNT KEY=VALUE... [--wait DURATION]. */
int kc_cmd_config(const struct kc_verb *v, int argc, char **argv);
int kc_cmd_set(const struct kc_verb *v, int argc, char **argv);

/* verify.c: kcache verify [--repair] [MOUNT]. */
int kc_cmd_verify(const struct kc_verb *v, int argc, char **argv);
