/* settings.c: the settings of a running mount: the settings file (-o config=FILE), what kcache config
 * shows, and the ones that may change while the mount serves (kcache set, SIGHUP).
 *
 * What must stay true:
 *   S1. One checker. A value from the command line, the file, kcache set or SIGHUP is read and range-checked
 *       by kfs_opts_check (options.c), the same code, with the same message.
 *   S2. All or nothing. A change (kcache set's lines, or a re-read file) is checked whole before any of it
 *       is applied; a refusal leaves every setting as it was.
 *   S3. The command line wins. At mount over the file's value; at SIGHUP too (kept in given): a key given
 *       with -o is not the file's to change. A key that neither gives goes back to its default at SIGHUP.
 *   S4. What may change live (LIVE below): max_size, low_watermark, grace_ms, tmp_age, protect, pin,
 *       stale_locks. Each is a field that its readers load with one access (a word, a double, a pointer);
 *       writers store it whole (__atomic). max_size and low_watermark change under space_lock, where
 *       reservations read them (evict/descent.c kev_set_limits), which then wakes the descent: a smaller
 *       limit is reached in the background, writes that hit it evict in line meanwhile. A replaced pin list
 *       is kept until unmount (retired), since eviction may be walking it: a few bytes a change.
 *   S5. Everything else (backing, index, log, layout, remote...) needs a remount: kcache set refuses it,
 *       SIGHUP logs that it differs and keeps it.
 *   S6. Nobody but root and the daemon's user writes what the daemon reads (like sshd's StrictModes). The file
 *       names where a daemon that is often root writes (index, log, backing) and what every user's cache
 *       does (max_size, pin...): a file another user can write, or replace through a directory above it,
 *       is refused at mount and at SIGHUP (logged; the settings stay). Checked on what is read: each
 *       directory from "/" down by lstat (owned by root or the daemon's user, and writable by nobody else
 *       unless sticky, as reach.c's P1 and P2), then the file opened without following a symlink and its
 *       descriptor checked (a regular file of root or the daemon's user, mode without group or other
 *       write) and parsed, so that what was checked is what is read.
 * lock: one change at a time (kcache set against SIGHUP), and the last refusal's words. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <ini.h>

#include "kfs.h"
#include "evict/evict.h"

enum kind { K_STR, K_FLAG }; /* numbers as text, read and checked by kfs_opts_check as the command line's */

static const struct key {
        const char *name;
        enum kind kind;
        size_t off;   /* in struct kfs_opts */
        bool live;    /* S4 */
} KEYS[] = {
        { "max_size", K_STR, offsetof(struct kfs_opts, max_size_str), true },
        { "low_watermark", K_STR, offsetof(struct kfs_opts, low_watermark_str), true },
        { "grace_ms", K_STR, offsetof(struct kfs_opts, grace_ms_str), true },
        { "tmp_age", K_STR, offsetof(struct kfs_opts, tmp_age_str), true },
        { "protect", K_STR, offsetof(struct kfs_opts, protect_str), true },
        { "pin", K_STR, offsetof(struct kfs_opts, pin_str), true },
        { "stale_locks", K_FLAG, offsetof(struct kfs_opts, stale_locks), true },
        { "backing", K_STR, offsetof(struct kfs_opts, backing), false }, /* when only MOUNTPOINT is given */
        { "layout", K_STR, offsetof(struct kfs_opts, layout_str), false },
        { "timeout", K_STR, offsetof(struct kfs_opts, timeout_str), false },
        { "flush_ms", K_STR, offsetof(struct kfs_opts, flush_ms_str), false },
        { "inode_fds", K_STR, offsetof(struct kfs_opts, inode_fds_str), false },
        { "index", K_STR, offsetof(struct kfs_opts, index_path), false },
        { "log", K_STR, offsetof(struct kfs_opts, log_path), false },
        { "remote", K_STR, offsetof(struct kfs_opts, remote_url), false },
        { "remote_auth", K_STR, offsetof(struct kfs_opts, remote_auth), false },
        { "remote_publish", K_STR, offsetof(struct kfs_opts, remote_publish), false },
        { "remote_publisher", K_STR, offsetof(struct kfs_opts, remote_publisher), false },
        { "remote_trusted", K_STR, offsetof(struct kfs_opts, remote_trusted), false },
        { "remote_timeout_ms", K_STR, offsetof(struct kfs_opts, remote_timeout_ms_str), false },
        { "remote_negative_s", K_STR, offsetof(struct kfs_opts, remote_negative_s_str), false },
        { "remote_touch_s", K_STR, offsetof(struct kfs_opts, remote_touch_s_str), false },
        { "herd_wait", K_STR, offsetof(struct kfs_opts, herd_wait_str), false },
        { "nolog", K_FLAG, offsetof(struct kfs_opts, nolog), false },
        { "nopassthrough", K_FLAG, offsetof(struct kfs_opts, nopassthrough), false },
        { "nouring", K_FLAG, offsetof(struct kfs_opts, nouring), false },
        { "norefresh", K_FLAG, offsetof(struct kfs_opts, norefresh), false },
        { "rebuild", K_FLAG, offsetof(struct kfs_opts, rebuild), false },
        { "tighten", K_FLAG, offsetof(struct kfs_opts, tighten), false },
};
#define NKEYS (sizeof(KEYS) / sizeof(KEYS[0]))

/* What kcache config shows besides KEYS: the mount's, for good. */
static const char FIXED[] = " mountpoint config allow_other owner ";

/* The defaults the live settings go back to when neither the command line nor the file gives them (S3),
 * as main.c sets them. */
static const char *const LIVE_DEFAULT[] = { KFS_DEFAULT_MAX_SIZE, "90", "2000", "3600", "open",
                                            KFS_DEFAULT_PINS, NULL };

struct kfs_settings {
        pthread_mutex_t lock;
        struct kfs_opts given;    /* the command line's live settings (S3): the *_str fields and stale_locks */
        char refusal[600];        /* the last refusal of kcache set; lock */
        char ***retired;          /* pin lists replaced (S4), freed at unmount; lock */
        size_t nretired;
        pthread_t thread;         /* SIGHUP's */
        bool started;
        atomic_bool stop;
};

/* SIGHUP's handler reaches no state of the mount (a signal handler gets none), only this: sem_post is
 * async-signal-safe, and the thread that waits on it does the work. One mount per process. */
static sem_t hup_sem;

static char **str_at(struct kfs_opts *o, const struct key *k)
{
        return (char **)((char *)o + k->off);
}

static int *flag_at(struct kfs_opts *o, const struct key *k)
{
        return (int *)((char *)o + k->off);
}

static const struct key *key_by_name(const char *name)
{
        for (size_t i = 0; i < NKEYS; i++)
                if (!strcmp(KEYS[i].name, name))
                        return &KEYS[i];
        return NULL;
}

static int parse_flag(const char *v, int *ret)
{
        if (!strcmp(v, "1") || !strcmp(v, "yes") || !strcmp(v, "true") || !strcmp(v, "on") || !*v)
                *ret = 1;
        else if (!strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "false") || !strcmp(v, "off"))
                *ret = 0;
        else
                return -EINVAL;
        return 0;
}

/* What a file gives: its values in o (zeroed first), and which keys it set. */
struct file_read {
        const char *path;
        struct kfs_opts *o;
        bool set[NKEYS];
        char *why;
        size_t len;
        int err;
};

/* inih as Debian builds it passes no line number (INI_HANDLER_LINENO 0): ini_parse returns the line of the
 * first refusal, which read_file puts before the words said here. */
static int on_line(void *user, const char *section, const char *name, const char *value)
{
        struct file_read *f = user;
        if (f->err)
                return 0;
        const struct key *k = key_by_name(name);
        f->err = -EINVAL;
        if (*section)
                snprintf(f->why, f->len, "sections are not used ([%s]): write key = value lines", section);
        else if (!k)
                snprintf(f->why, f->len, "unknown setting '%s' (the settings are the -o options of kcachefs(8))",
                         name);
        else if (k->kind == K_STR)
                f->err = (free(*str_at(f->o, k)), (*str_at(f->o, k) = strdup(value)) ? 0 : -ENOMEM);
        else
                f->err = parse_flag(value, flag_at(f->o, k));
        if (f->err == -EINVAL && k && !*section && k->kind != K_STR)
                snprintf(f->why, f->len, "invalid %s '%s': expected 1 or 0 (yes, no, on, off)", name, value);
        if (f->err == -ENOMEM)
                snprintf(f->why, f->len, "out of memory");
        if (!f->err)
                f->set[k - KEYS] = true;
        return f->err ? 0 : 1;
}

/* Whether anybody but root and the daemon's user may write st (S6); says who and how in why. */
static bool others_write(const char *path, const char *p, const struct stat *st, bool dir, char *why, size_t len)
{
        unsigned mode = (unsigned)st->st_mode & 07777;
        if (st->st_uid != 0 && st->st_uid != geteuid())
                snprintf(why, len, "the settings file '%s' can be changed by another user: '%s' belongs to uid %u "
                         "(mode %04o); chown root '%s' (only root and the daemon's user may write what it reads)",
                         path, p, (unsigned)st->st_uid, mode, p);
        else if ((mode & 022) && !(dir && (mode & S_ISVTX)))
                snprintf(why, len, "the settings file '%s' can be changed by other users: '%s' (mode %04o) is "
                         "writable by %s%s; chmod go-w '%s'", path, p, mode, (mode & 002) ? "everyone" : "its group",
                         dir ? " and not sticky" : "", p);
        else
                return false;
        return true;
}

/* The settings file, opened once it is checked (S6): a stream, or NULL with -errno in *err and why said. */
static FILE *open_checked(const char *path, int *err, char *why, size_t len)
{
        size_t n = strlen(path);
        char *p = malloc(n + 1);
        struct stat st;
        *err = -ENOMEM;
        if (!p) {
                snprintf(why, len, "out of memory");
                return NULL;
        }
        *err = -EACCES;
        if (path[0] != '/') { /* kfs_settings_file resolved it */
                snprintf(why, len, "the settings file '%s' is not an absolute path", path);
                free(p);
                return NULL;
        }
        /* each directory above the file, from "/" down: "/", "/a", "/a/b" (the path is resolved: realpath) */
        for (size_t e = 0; e < n; e++) {
                if (path[e] != '/')
                        continue;
                size_t l = e ? e : 1;
                memcpy(p, path, l);
                p[l] = '\0';
                if (lstat(p, &st) < 0) {
                        *err = -errno;
                        snprintf(why, len, "cannot examine '%s' on the way to the settings file '%s': %s", p, path,
                                 strerror(errno));
                } else if (!S_ISDIR(st.st_mode)) {
                        snprintf(why, len, "'%s' on the way to the settings file '%s' is no longer a directory", p,
                                 path);
                } else if (!others_write(path, p, &st, true, why, len)) {
                        continue;
                }
                free(p);
                return NULL;
        }
        free(p);
        /* O_NONBLOCK: a FIFO would hold the open; O_NOFOLLOW: the name itself, never where a link points */
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
                *err = -errno;
                snprintf(why, len, "cannot read the settings file '%s': %s", path,
                         errno == ELOOP ? "it is a symbolic link (name the file itself)" : strerror(errno));
                return NULL;
        }
        FILE *f = NULL;
        if (fstat(fd, &st) < 0) {
                *err = -errno;
                snprintf(why, len, "cannot read the settings file '%s': %s", path, strerror(errno));
        } else if (!S_ISREG(st.st_mode)) {
                *err = -EINVAL;
                snprintf(why, len, "the settings file '%s' is not a regular file", path);
        } else if (!others_write(path, path, &st, false, why, len) && !(f = fdopen(fd, "r"))) {
                *err = -errno;
                snprintf(why, len, "cannot read the settings file '%s': %s", path, strerror(errno));
        }
        if (!f)
                close(fd);
        return f;
}

/* inih as Debian builds it reads each line into a buffer of INI_MAX_LINE bytes and takes what does not
 * fit for the next line: a longer line (a long pin list) is refused whole here, never half read. The
 * number of the first such line, or 0; the file is read again from its start afterwards. */
static int too_long_line(FILE *in)
{
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        int no = 0, bad = 0;
        while (!bad && (n = getline(&line, &cap, in)) >= 0) {
                no++;
                size_t l = (size_t)n - (n > 0 && line[n - 1] == '\n');
                if (l > INI_MAX_LINE - 2)
                        bad = no;
        }
        free(line);
        rewind(in);
        return bad;
}

static int read_file(const char *path, struct kfs_opts *o, bool set[NKEYS], char *why, size_t len)
{
        char what[500] = "";
        struct file_read f = { .path = path, .o = o, .why = what, .len = sizeof(what) };
        int err;
        FILE *in = open_checked(path, &err, why, len);
        if (!in)
                return err;
        int long_no = too_long_line(in);
        if (long_no) {
                fclose(in);
                snprintf(why, len, "%s:%d: a line longer than %d bytes (the settings file's parser, libinih, "
                         "reads no more): give a long value with -o", path, long_no, INI_MAX_LINE - 2);
                return -EINVAL;
        }
        errno = 0;
        int r = ini_parse_file(in, on_line, &f);
        int read_errno = ferror(in) ? (errno ? errno : EIO) : 0; /* inih takes a failed read for the end */
        fclose(in);
        if (f.err) {
                snprintf(why, len, "%s:%d: %s", path, r, what);
                return f.err;
        }
        if (read_errno || r < 0) {
                snprintf(why, len, "cannot read the settings file '%s': %s", path,
                         read_errno ? strerror(read_errno) : "out of memory");
                return read_errno ? -read_errno : -ENOMEM;
        }
        if (r > 0) { /* a line that is neither key = value, a comment nor a section */
                snprintf(why, len, "%s:%d: expected key = value", path, r);
                return -EINVAL;
        }
        memcpy(set, f.set, sizeof(f.set));
        return 0;
}

int kfs_settings_file(struct kfs_opts *o, const char *path, char *why, size_t len)
{
        struct kfs_opts f = { 0 };
        bool set[NKEYS];
        char *real = realpath(path, NULL); /* the daemon re-reads it from / (detached) */
        if (!real) {
                snprintf(why, len, "the settings file '%s': %s", path, strerror(errno));
                return -errno;
        }
        free(o->config_path);
        o->config_path = real;
        int r = read_file(real, &f, set, why, len);
        for (size_t i = 0; r == 0 && i < NKEYS; i++) {
                const struct key *k = &KEYS[i];
                if (!set[i])
                        continue;
                if (k->kind == K_STR && !*str_at(o, k)) /* S3: else the command line's stays */
                        *str_at(o, k) = *str_at(&f, k), *str_at(&f, k) = NULL;
                else if (k->kind == K_FLAG)
                        *flag_at(o, k) |= *flag_at(&f, k); /* the command line can only turn one on */
        }
        kfs_free_opts(&f);
        return r;
}

int kfs_settings_init(struct kfs *fs)
{
        struct kfs_settings *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        pthread_mutex_init(&s->lock, NULL);
        for (size_t i = 0; i < NKEYS; i++) {
                const struct key *k = &KEYS[i];
                if (!k->live)
                        continue;
                if (k->kind == K_FLAG)
                        *flag_at(&s->given, k) = *flag_at(&fs->o, k);
                else if (*str_at(&fs->o, k) && !(*str_at(&s->given, k) = strdup(*str_at(&fs->o, k)))) {
                        kfs_free_opts(&s->given);
                        free(s);
                        return -ENOMEM;
                }
        }
        fs->settings = s;
        return 0;
}

/* The pins joined with ':' as -o pin= takes them. */
static void pins_str(char **pins, char *buf, size_t size)
{
        size_t o = 0;
        buf[0] = '\0';
        for (char **p = pins; p && *p && o < size; p++)
                o += (size_t)snprintf(buf + o, size - o, "%s%s", p == pins ? "" : ":", *p);
}

/* A value of kcache config's "key=value" lines, its backslashes and newlines escaped (\\ and \n): a path
 * may hold a newline, which would cut its line and forge the next (cli/config.c undoes it). NULL: ENOMEM. */
static char *line_value(const char *s)
{
        char *r = malloc(2 * strlen(s) + 1), *w = r;
        for (; r && *s; s++) {
                if (*s == '\\' || *s == '\n')
                        *w++ = '\\';
                *w++ = *s == '\n' ? 'n' : *s;
        }
        if (w)
                *w = '\0';
        return r;
}

int kfs_settings_show(struct kfs *fs, char *buf, size_t size)
{
        struct kfs_opts *o = &fs->o;
        char pins[4096];
        pins_str(__atomic_load_n(&o->pins, __ATOMIC_ACQUIRE), pins, sizeof(pins));
        enum { PIN, LAYOUT, INDEX, BACKING, MNT, CONFIG, LOG, REMOTE, AUTH, PUBLISH, PUBLISHER, TRUSTED, NSTR };
        const char *raw[NSTR] = { pins, o->layout_str, o->index_path, o->backing, o->mountpoint, o->config_path,
                                  fs->log_to, o->remote_url, o->remote_auth /* the file's name; never what it holds */,
                                  o->remote_publish, o->remote_publisher, o->remote_trusted };
        char *v[NSTR] = { 0 };
        int n = 0;
        for (int i = 0; i < NSTR; i++)
                if (!(v[i] = line_value(raw[i] ? raw[i] : "")))
                        n = -ENOMEM;
        pthread_mutex_lock(&fs->fdc.lock);
        size_t fds = fs->fdc.cap;
        pthread_mutex_unlock(&fs->fdc.lock);
        double tmp_age;
        __atomic_load(&o->tmp_age, &tmp_age, __ATOMIC_RELAXED);
        if (n == 0)
                n = snprintf(buf, size,
                         "max_size=%" PRIu64 "\nlow_watermark=%u\ngrace_ms=%u\ntmp_age=%.10g\nprotect=%s\npin=%s\n"
                         "stale_locks=%d\nlayout=%s\ntimeout=%.10g\nflush_ms=%u\ninode_fds=%zu\nindex=%s\nbacking=%s\n"
                         "mountpoint=%s\nconfig=%s\nlog=%s\nremote=%s\nremote_auth=%s\nremote_publish=%s\n"
                         "remote_publisher=%s\nremote_trusted=%s\nremote_timeout_ms=%u\nremote_negative_s=%.10g\n"
                         "remote_touch_s=%.10g\nherd_wait=%.10g\nnolog=%d\nnopassthrough=%d\nnouring=%d\nnorefresh=%d\nrebuild=%d\n"
                         "tighten=%d\nallow_other=%d\nowner=%u\n",
                         __atomic_load_n(&o->max_size, __ATOMIC_RELAXED),
                         __atomic_load_n(&o->low_watermark, __ATOMIC_RELAXED),
                         __atomic_load_n(&o->grace_ms, __ATOMIC_RELAXED), tmp_age,
                         __atomic_load_n(&o->protect, __ATOMIC_RELAXED) == KFS_PROTECT_WRITERS ? "writers" : "open",
                         v[PIN], __atomic_load_n(&o->stale_locks, __ATOMIC_RELAXED), v[LAYOUT], o->timeout,
                         o->flush_ms, fds, v[INDEX], v[BACKING], v[MNT], v[CONFIG], v[LOG], v[REMOTE], v[AUTH],
                         v[PUBLISH], v[PUBLISHER], v[TRUSTED], o->remote_timeout_ms, o->remote_negative_s,
                         o->remote_touch_s, o->herd_wait, o->nolog, o->nopassthrough, o->nouring, o->norefresh, o->rebuild,
                         o->tighten, o->allow_other, (unsigned)fs->owner);
        for (int i = 0; i < NSTR; i++)
                free(v[i]);
        return n < 0 ? n : n >= (int)size ? -E2BIG : n;
}

/* Applies c's live settings that were checked (kfs_opts_check) and are marked in set, saying each change;
 * s->lock held. */
static int apply(struct kfs *fs, struct kfs_opts *c, const bool set[NKEYS], const char *by)
{
        struct kfs_settings *s = fs->settings;
        struct kfs_opts *o = &fs->o;
        char **pins = NULL, was[4096], now[4096];
        bool new_pins = false;
        if (set[5]) { /* a list that says the same is not swapped: each swap keeps the old one (S4) */
                pins_str(o->pins, was, sizeof(was));
                if (kfs_parse_pins(c->pin_str, &pins) < 0)
                        return -ENOMEM;
                pins_str(pins, now, sizeof(now));
                char ***nr = (new_pins = strcmp(was, now) != 0) ? realloc(s->retired, (s->nretired + 1) * sizeof(*nr))
                             : s->retired;
                if (!new_pins || !nr) {
                        for (char **p = pins; *p; p++)
                                free(*p);
                        free(pins);
                        if (new_pins)
                                return -ENOMEM;
                }
                s->retired = nr;
        }
        if (set[0] || set[1]) {
                uint64_t max = set[0] ? c->max_size : o->max_size;
                unsigned low = set[1] ? c->low_watermark : o->low_watermark;
                if (max != o->max_size)
                        kfs_log(LOG_NOTICE, "max_size %" PRIu64 " -> %" PRIu64 " bytes (%s)", o->max_size, max, by);
                if (low != o->low_watermark)
                        kfs_log(LOG_NOTICE, "low_watermark %u -> %u%% (%s)", o->low_watermark, low, by);
                kev_set_limits(fs, max, low);
        }
        if (set[2] && c->grace_ms != o->grace_ms) {
                kfs_log(LOG_NOTICE, "grace_ms %u -> %u (%s)", o->grace_ms, c->grace_ms, by);
                __atomic_store_n(&o->grace_ms, c->grace_ms, __ATOMIC_RELAXED);
        }
        if (set[3] && c->tmp_age != o->tmp_age) {
                kfs_log(LOG_NOTICE, "tmp_age %.10g -> %.10g s (%s)", o->tmp_age, c->tmp_age, by);
                __atomic_store(&o->tmp_age, &c->tmp_age, __ATOMIC_RELAXED);
        }
        if (set[4] && c->protect != o->protect) {
                kfs_log(LOG_NOTICE, "protect %s (%s)", c->protect == KFS_PROTECT_WRITERS ? "writers" : "open", by);
                __atomic_store_n(&o->protect, c->protect, __ATOMIC_RELAXED);
        }
        if (new_pins) {
                kfs_log(LOG_NOTICE, "pin '%s' -> '%s' (%s)", was, now, by);
                s->retired[s->nretired++] = __atomic_exchange_n(&o->pins, pins, __ATOMIC_ACQ_REL);
        }
        if (set[6] && c->stale_locks != o->stale_locks) {
                kfs_log(LOG_NOTICE, "stale_locks %d -> %d (%s)", o->stale_locks, c->stale_locks, by);
                __atomic_store_n(&o->stale_locks, c->stale_locks, __ATOMIC_RELAXED);
        }
        return 0;
}

/* Checks c (S1) with max_size defaulting to the mount's own. */
static int check(struct kfs *fs, struct kfs_opts *c, char *why, size_t len)
{
        char max[32];
        snprintf(max, sizeof(max), "%" PRIu64, fs->o.max_size);
        c->protect = fs->o.protect;
        return kfs_opts_check(c, max, why, len);
}

int kfs_settings_set(struct kfs *fs, const char *lines, size_t size)
{
        struct kfs_settings *s = fs->settings;
        struct kfs_opts c = { 0 };
        bool set[NKEYS] = { 0 };
        char why[sizeof(s->refusal)] = "", *copy = strndup(lines, size), *save = NULL;
        int r = copy ? 0 : -ENOMEM;
        for (char *l = copy ? strtok_r(copy, "\n", &save) : NULL; r == 0 && l; l = strtok_r(NULL, "\n", &save)) {
                char *eq = strchr(l, '=');
                if (eq)
                        *eq = '\0';
                const struct key *k = key_by_name(l);
                r = -EINVAL;
                if (!eq)
                        snprintf(why, sizeof(why), "expected KEY=VALUE, not '%s'", l);
                else if (!k && *l && strstr(FIXED, l) && strstr(FIXED, l)[-1] == ' ' && strstr(FIXED, l)[strlen(l)] == ' ')
                        snprintf(why, sizeof(why), "%s cannot change on a running mount", l);
                else if (!k)
                        snprintf(why, sizeof(why), "unknown setting '%s' (kcache config lists them)", l);
                else if (!k->live)
                        snprintf(why, sizeof(why), "%s cannot change on a running mount (it takes a remount)", l);
                else if (k->kind == K_FLAG && parse_flag(eq + 1, flag_at(&c, k)) < 0)
                        snprintf(why, sizeof(why), "invalid %s '%s': expected 1 or 0 (yes, no, on, off)", l, eq + 1);
                else if (k->kind == K_STR && (free(*str_at(&c, k)), !(*str_at(&c, k) = strdup(eq + 1))))
                        r = -ENOMEM;
                else
                        r = 0, set[k - KEYS] = true;
        }
        pthread_mutex_lock(&s->lock);
        if (r == 0 && (r = check(fs, &c, why, sizeof(why))) == 0) {
                char by[64];
                snprintf(by, sizeof(by), "kcache set");
                r = apply(fs, &c, set, by);
        }
        if (r == -EINVAL)
                snprintf(s->refusal, sizeof(s->refusal), "%s", why);
        pthread_mutex_unlock(&s->lock);
        if (r == -EINVAL)
                kfs_log(LOG_NOTICE, "kcache set refused: %s", why);
        free(copy);
        kfs_free_opts(&c);
        return r;
}

int kfs_settings_refusal(struct kfs *fs, char *buf, size_t size)
{
        pthread_mutex_lock(&fs->settings->lock);
        int n = snprintf(buf, size, "%s", fs->settings->refusal);
        pthread_mutex_unlock(&fs->settings->lock);
        return n >= (int)size ? -E2BIG : n;
}

/* SIGHUP: the file again (S2, S3, S5). */
static void reload(struct kfs *fs)
{
        struct kfs_settings *s = fs->settings;
        const char *path = fs->o.config_path;
        if (!path) {
                kfs_log(LOG_NOTICE, "SIGHUP: no settings file to re-read (mounted without -o config=FILE)");
                return;
        }
        struct kfs_opts f = { 0 }, c = { 0 };
        bool set[NKEYS] = { 0 }, live[NKEYS] = { 0 };
        char why[600];
        int r = read_file(path, &f, set, why, sizeof(why));
        for (size_t i = 0; r == 0 && i < NKEYS; i++) {
                const struct key *k = &KEYS[i];
                if (k->live) {
                        live[i] = true;
                        if (set[i] && k->kind == K_STR && *str_at(&s->given, k) &&
                            strcmp(*str_at(&s->given, k), *str_at(&f, k)))
                                kfs_log(LOG_NOTICE, "SIGHUP: %s in %s ignored: the command line's -o %s=%s wins",
                                        k->name, path, k->name, *str_at(&s->given, k));
                        if (k->kind == K_FLAG)
                                *flag_at(&c, k) = *flag_at(&s->given, k) | (set[i] && *flag_at(&f, k));
                        else {
                                const char *v = *str_at(&s->given, k) ? *str_at(&s->given, k)
                                                : set[i] ? *str_at(&f, k) : LIVE_DEFAULT[i];
                                if (!(*str_at(&c, k) = strdup(v)))
                                        r = -ENOMEM, snprintf(why, sizeof(why), "out of memory");
                        }
                } else if (set[i]) { /* S5: said, and kept */
                        char *real = k->off == offsetof(struct kfs_opts, backing) ? realpath(f.backing, NULL) : NULL;
                        bool same = real ? !strcmp(real, fs->o.backing)
                                    : k->kind == K_STR ? *str_at(&fs->o, k) && !strcmp(*str_at(&fs->o, k), *str_at(&f, k))
                                    : *flag_at(&fs->o, k) == *flag_at(&f, k);
                        free(real);
                        if (!same)
                                kfs_log(LOG_WARNING, "SIGHUP: %s in %s cannot change on a running mount: kept as "
                                                     "mounted (remount to apply it)", k->name, path);
                }
        }
        pthread_mutex_lock(&s->lock);
        if (r == 0 && (r = check(fs, &c, why, sizeof(why))) == 0) {
                char by[PATH_MAX + 16];
                snprintf(by, sizeof(by), "SIGHUP: %s", path);
                r = apply(fs, &c, live, by);
        }
        pthread_mutex_unlock(&s->lock);
        if (r < 0)
                kfs_log(LOG_ERR, "SIGHUP: %s refused, the settings are kept as they were: %s", path, why);
        else
                kfs_log(LOG_INFO, "SIGHUP: %s re-read", path);
        kfs_free_opts(&f);
        kfs_free_opts(&c);
}

static void *hup_main(void *arg)
{
        struct kfs *fs = arg;
        for (;;) {
                while (sem_wait(&hup_sem) < 0 && errno == EINTR)
                        ;
                if (atomic_load(&fs->settings->stop))
                        return NULL;
                reload(fs);
        }
}

static void on_hup(int sig)
{
        (void)sig;
        sem_post(&hup_sem);
}

int kfs_settings_start(struct kfs *fs)
{
        (void)fs;
        if (sem_init(&hup_sem, 0, 0) < 0)
                return -errno;
        /* After libfuse's handlers (fuse_set_signal_handlers), whose SIGHUP ends the mount. A SIGHUP before
         * the thread runs waits in the semaphore for it. */
        struct sigaction sa = { .sa_handler = on_hup, .sa_flags = SA_RESTART };
        sigemptyset(&sa.sa_mask);
        return sigaction(SIGHUP, &sa, NULL) < 0 ? -errno : 0;
}

void kfs_settings_thread(struct kfs *fs)
{
        struct kfs_settings *s = fs->settings;
        if (!s || s->started)
                return;
        /* Made at INIT, once libfuse has its first worker: under a tasks limit (systemd's TasksMax, a pids
         * cgroup) the mount must serve first, as it does with fewer ring threads; only SIGHUP then goes
         * unheard (never libfuse's handler: it would unmount). */
        sigset_t all, old; /* signals are the main loop's (SIGTERM ends it), SIGHUP's the semaphore's */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int e = pthread_create(&s->thread, NULL, hup_main, fs);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e) {
                signal(SIGHUP, SIG_IGN);
                kfs_log(LOG_WARNING, "SIGHUP is ignored: no thread to re-read the settings (%s); kcache set "
                        "changes them", strerror(e));
                return;
        }
        s->started = true;
}

void kfs_settings_stop(struct kfs *fs)
{
        struct kfs_settings *s = fs->settings;
        signal(SIGHUP, SIG_IGN); /* the mount is ending: nothing to re-read any more */
        if (!s || !s->started)
                return;
        atomic_store(&s->stop, true);
        sem_post(&hup_sem);
        pthread_join(s->thread, NULL);
        s->started = false;
}

void kfs_settings_free(struct kfs *fs)
{
        struct kfs_settings *s = fs->settings;
        if (!s)
                return;
        kfs_settings_stop(fs);
        for (size_t i = 0; i < s->nretired; i++) {
                for (char **p = s->retired[i]; p && *p; p++)
                        free(*p);
                free(s->retired[i]);
        }
        free(s->retired);
        kfs_free_opts(&s->given);
        pthread_mutex_destroy(&s->lock);
        free(s);
        fs->settings = NULL;
}
