/* config.c: kcache config and kcache set, the settings of a running mount (fs/settings.c).
 *
 * The daemon owns the settings and their checking: config reads the root attribute user.kcachefs.config
 * ("key=value" lines), set writes user.kcachefs.set with the operator's KEY=VALUE lines and, on EINVAL,
 * reads the daemon's reason from set_refusal. A value's backslashes and newlines come escaped (\\, \n:
 * a path may hold a newline); config undoes that, and writes the strings as kcache(1), NAMES says.
 * kcache checks only the form (KEY=VALUE): the values are read and range-checked by the daemon's one
 * checker (fs/options.c kfs_opts_check), as at mount, so that kcache set and -o never disagree. A refused set changes nothing (settings.c S2).
 * After a smaller max_size, set waits (--wait, default 5m) while the daemon's background eviction takes
 * the cache down to it, saying its progress from the daemon's own used_bytes. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "args.h"
#include "kcache.h"
#include "quote.h"
#include "../common/parse.h"

#define CONFIG_MAX 65536

/* Undoes the daemon's escapes of a config value in place (fs/settings.c line_value): \\ and \n. */
static void unescape(char *s)
{
        char *w = s;
        for (; *s; s++) {
                if (*s == '\\' && (s[1] == '\\' || s[1] == 'n'))
                        *w++ = *++s == 'n' ? '\n' : '\\';
                else
                        *w++ = *s;
        }
        *w = '\0';
}

/* The value of key in the daemon's config lines, copied into buf; false if absent. */
static bool config_value(const char *config, const char *key, char *buf, size_t size)
{
        size_t kl = strlen(key);
        for (const char *l = config; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
                if (strncmp(l, key, kl) || l[kl] != '=')
                        continue;
                const char *v = l + kl + 1, *end = strchr(v, '\n');
                size_t n = end ? (size_t)(end - v) : strlen(v);
                snprintf(buf, size, "%.*s", (int)n, v);
                return true;
        }
        return false;
}

static bool is_number(const char *s)
{
        char *end;
        if (!*s || strspn(s, "0123456789.-e+") != strlen(s))
                return false;
        strtod(s, &end);
        return !*end;
}

static int read_config(const char *mount, char *buf, size_t size)
{
        ssize_t n = kc_get(mount, "config", buf, size);
        if (n < 0)
                return kc_fail("%s: cannot read the settings: %s", mount,
                               n == -ENODATA || n == -ENOTSUP ? "the daemon is older than this kcache" : strerror((int)-n));
        return 0;
}

int kc_cmd_config(const struct kc_verb *v, int argc, char **argv)
{
        bool json;
        const char *mount;
        int rc = kc_flag_and_mount(v, argc, argv, "json", KC_O_JSON, &json, &mount);
        if (rc >= 0)
                return rc;
        static char config[CONFIG_MAX];
        if (read_config(mount, config, sizeof(config)))
                return KC_EXIT_FAILED;
        json_object *o = json ? json_object_new_object() : NULL;
        if (json && !o)
                return kc_fail("out of memory");
        if (json)
                json_object_object_add(o, "mount", json_object_new_string(mount));
        for (char *save = NULL, *l = strtok_r(config, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                char *eq = strchr(l, '=');
                if (!eq)
                        continue;
                *eq = '\0';
                char *val = eq + 1;
                unescape(val);
                if (json) {
                        json_object *jv = NULL; /* null: a setting that is not set */
                        if (!*val && strcmp(l, "pin") && strcmp(l, "layout"))
                                jv = NULL;
                        else if (is_number(val) && strspn(val, "0123456789") == strlen(val))
                                jv = json_object_new_uint64(strtoull(val, NULL, 10));
                        else if (is_number(val)) /* written as the daemon wrote it */
                                jv = json_object_new_double_s(strtod(val, NULL), val);
                        else
                                jv = json_object_new_string(val);
                        json_object_object_add(o, l, jv);
                } else if (!strcmp(l, "max_size")) {
                        char h[32];
                        kc_human(strtoull(val, NULL, 10), h, sizeof(h));
                        printf("%-18s %s (%s bytes)\n", l, h, val);
                } else if (!*val || is_number(val)) {
                        printf("%-18s %s\n", l, *val ? val : !strcmp(l, "pin") ? "(none)" : "-");
                } else { /* paths and the operator's strings: never a forged line nor a terminal escape */
                        printf("%-18s ", l);
                        kc_put_shell(stdout, val);
                        putchar('\n');
                }
        }
        if (json) {
                int r = kc_json_write(stdout, o);
                putchar('\n');
                json_object_put(o);
                if (r < 0)
                        return KC_EXIT_FAILED;
        }
        return KC_EXIT_OK;
}

/* Waits until the daemon's used_bytes is at or below its limit, or until the deadline; says the progress
 * on stderr. 0 when reached. */
static int wait_below(const char *mount, double wait_s)
{
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        uint64_t last = UINT64_MAX;
        double said = -1;
        for (;;) {
                uint64_t used = kc_num(mount, "used_bytes"), max = kc_num(mount, "max_bytes");
                clock_gettime(CLOCK_MONOTONIC, &now);
                double el = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
                char a[32], b[32];
                kc_human(used, a, sizeof(a));
                kc_human(max, b, sizeof(b));
                if (used <= max) {
                        fprintf(stderr, "kcache: %s used, within the new limit of %s\n", a, b);
                        return 0;
                }
                if (el >= wait_s)
                        return kc_fail("%s: still %s used, above the new limit of %s, after %.0f s: what is left "
                                       "is open, pinned or used within grace_ms; eviction goes on in the background",
                                       mount, a, b, el);
                if (used != last && el - said >= 1) { /* a line a second at most, and only on news */
                        fprintf(stderr, "kcache: evicting down to %s: %s used\n", b, a);
                        said = el;
                        last = used;
                }
                struct timespec ts = { 0, 100 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
}

int kc_cmd_set(const struct kc_verb *v, int argc, char **argv)
{
        static const struct option longs[] = { { "wait", required_argument, NULL, KC_O_WAIT },
                                                { "help", no_argument, NULL, 'h' }, { 0 } };
        double wait_s = 300;
        int c;
        while ((c = kc_opt(v, argc, argv, "", longs)) != -1) {
                if (c != KC_O_WAIT)
                        return c == KC_OPT_HELP ? KC_EXIT_OK : KC_EXIT_USAGE;
                if (kparse_duration(optarg, &wait_s, 1) < 0)
                        return kc_bad_usage(v, "invalid --wait '%s': expected a duration (90s, 5m)", optarg);
        }
        if (kc_operands(v, argc, argv, 2, -1, optind < argc ? "KEY=VALUE" : "MOUNT"))
                return KC_EXIT_USAGE;
        static char lines[CONFIG_MAX];
        size_t o = 0;
        bool shrink = false;
        for (int i = optind + 1; i < argc; i++) {
                const char *eq = strchr(argv[i], '=');
                if (!eq || eq == argv[i])
                        return kc_bad_usage(v, "expected KEY=VALUE, not '%s'", argv[i]);
                if (o + strlen(argv[i]) + 2 > sizeof(lines))
                        return kc_bad_usage(v, "too long");
                if (strchr(argv[i], '\n'))
                        return kc_bad_usage(v, "a value holds no newline");
                o += (size_t)snprintf(lines + o, sizeof(lines) - o, "%s%s", o ? "\n" : "", argv[i]);
                shrink |= !strncmp(argv[i], "max_size=", 9) || !strncmp(argv[i], "low_watermark=", 14);
        }
        const char *mount = kc_mount_or_default(argv[optind]);
        static char before[CONFIG_MAX], after[CONFIG_MAX];
        if (!mount || read_config(mount, before, sizeof(before)))
                return KC_EXIT_FAILED;
        int r = kc_set(mount, "set", lines);
        if (r == -EINVAL) {
                char why[1024];
                if (kc_get(mount, "set_refusal", why, sizeof(why)) <= 0)
                        snprintf(why, sizeof(why), "refused");
                return kc_fail("%s: %s; nothing changed", mount, why);
        }
        if (r < 0)
                return kc_fail("%s: cannot change the settings: %s%s", mount, strerror(-r), kc_perm_hint(r));
        if (read_config(mount, after, sizeof(after)))
                return KC_EXIT_FAILED;
        for (int i = optind + 1; i < argc; i++) {
                char key[128], was[4096], now[4096];
                snprintf(key, sizeof(key), "%.*s", (int)(strchr(argv[i], '=') - argv[i]), argv[i]);
                if (!config_value(before, key, was, sizeof(was)) || !config_value(after, key, now, sizeof(now)))
                        continue;
                if (strcmp(was, now))
                        printf("%s: %s %s (was %s)\n", mount, key, now, was);
                else
                        printf("%s: %s %s (unchanged)\n", mount, key, now);
        }
        fflush(stdout);
        return shrink && wait_s > 0 && wait_below(mount, wait_s) ? KC_EXIT_FAILED : KC_EXIT_OK;
}
