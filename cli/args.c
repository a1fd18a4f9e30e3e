/* args.c: kcache's command line (args.h): the usage, each verb's help, and getopt_long's errors said in
 * words that name what was wrong. Nothing here reads or acts on a mount. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

/* Where a verb's usage puts what a form does: after the form, or under it when the form is longer. */
#define KC_WHAT_COLUMN 42

/* what, each of its lines after the first indented by indent. */
static void kc_put_what(FILE *f, const char *what, int indent)
{
        for (const char *p = what; *p; p++) {
                fputc(*p, f);
                if (*p == '\n')
                        fprintf(f, "%*s", indent, "");
        }
        fputc('\n', f);
}

void kc_usage(FILE *f, const struct kc_verb *table, size_t n)
{
        fputs("usage: kcache [-h|--help] [-V|--version] COMMAND [ARGS]\n\n", f);
        for (size_t i = 0; i < n; i++)
                for (const struct kc_form *fm = table[i].forms; fm < table[i].forms + 3 && fm->args; fm++) {
                        int len = fprintf(f, "  %s %s", table[i].name, fm->args);
                        if (len + 2 > KC_WHAT_COLUMN)
                                fprintf(f, "\n%*s", KC_WHAT_COLUMN, "");
                        else
                                fprintf(f, "%*s", KC_WHAT_COLUMN - len, "");
                        kc_put_what(f, fm->what, KC_WHAT_COLUMN);
                }
        fputs("\n"
              "  -h, --help      this help; kcache COMMAND --help (or kcache help COMMAND): a command's own\n"
              "  -V, --version   kcache's version\n"
              "\n"
              "MOUNT defaults to $KCACHEFS_MOUNT, else ~/.cache/kcachefs/mnt. Actions need the rights of the\n"
              "mount's owner (or root). RUNTIME: neo sycl pocl cuda triton jax kcache mesa numba ccache inductor cupy\n"
              "torch-extensions (default: these), pyopencl (XDG_CACHE_HOME: only when named).\n"
              "Exit status: 0 ok, 1 the operation failed, 2 bad usage.\n",
              f);
}

void kc_verb_help(FILE *f, const struct kc_verb *v)
{
        for (const struct kc_form *fm = v->forms; fm < v->forms + 3 && fm->args; fm++)
                fprintf(f, "%s kcache %s %s\n", fm == v->forms ? "usage:" : "      ", v->name, fm->args);
        fputc('\n', f);
        for (const struct kc_form *fm = v->forms; fm < v->forms + 3 && fm->args; fm++)
                kc_put_what(f, fm->what, 0);
        /* -h, --help in the column of the verb's own options' descriptions (after their first double space) */
        int col = 17;
        const char *o = v->options, *gap = o ? strstr(o, "  ") : NULL;
        if (gap && (gap = strstr(gap + 2, "  ")) && gap < o + strcspn(o, "\n"))
                col = (int)(gap + strspn(gap, " ") - o);
        fprintf(f, "\noptions:\n%s%-*sthis help\n", o ? o : "", col, "  -h, --help");
}

int kc_bad_usage(const struct kc_verb *v, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "kcache: %s%s", v ? v->name : "", v ? ": " : "");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\nTry 'kcache %s%s--help'.\n", v ? v->name : "", v ? " " : "");
        va_end(ap);
        return KC_EXIT_USAGE;
}

/* The option an error of getopt_long is about, as the user wrote it: "--name" (without "=value") when
 * the argument it came from is a long option, else "-c". */
static void kc_opt_name(char **argv, int c, char *buf, size_t size)
{
        const char *arg = optind > 0 ? argv[optind - 1] : "";
        if (!strncmp(arg, "--", 2))
                snprintf(buf, size, "%.*s", (int)strcspn(arg, "="), arg);
        else
                snprintf(buf, size, "-%c", c);
}

int kc_opt(const struct kc_verb *v, int argc, char **argv, const char *shorts, const struct option *longs)
{
        char spec[32], name[128];
        /* ':' first: getopt_long says nothing itself and tells a missing value (':') from the rest ('?').
         * The global options stop at the verb ('+'); a verb's own may follow its operands. */
        snprintf(spec, sizeof(spec), "%s:%sh", v ? "" : "+", shorts);
        opterr = 0;
        int c = getopt_long(argc, argv, spec, longs, NULL);
        if (c == 'h') {
                if (v) /* the global help is the caller's: it has the table */
                        kc_verb_help(stdout, v);
                return KC_OPT_HELP;
        }
        if (c == ':') {
                kc_opt_name(argv, optopt, name, sizeof(name));
                kc_bad_usage(v, "option '%s' needs a value", name);
                return KC_OPT_BAD;
        }
        if (c == '?') {
                /* optopt: 0 for an unknown long option; an option's value when a long option was given a
                 * value it does not take; the letter for an unknown one-letter option. */
                const char *letters = spec + (v ? 1 : 2); /* past "+:" or ":" */
                bool known = optopt >= 256 || (optopt > 0 && optopt != ':' && strchr(letters, optopt));
                kc_opt_name(argv, optopt, name, sizeof(name));
                if (optopt && !known)
                        snprintf(name, sizeof(name), "-%c", optopt); /* inside a cluster ("-qz"): the letter */
                kc_bad_usage(v, known ? "option '%s' takes no value" : "unknown option '%s'", name);
                return KC_OPT_BAD;
        }
        return c;
}

int kc_operands(const struct kc_verb *v, int argc, char **argv, int min, int max, const char *what)
{
        int n = argc - optind;
        if (n < min)
                return kc_bad_usage(v, "no %s", what);
        if (max >= 0 && n > max)
                return kc_bad_usage(v, "unexpected argument '%s'", argv[optind + max]);
        return 0;
}

int kc_parse_count(const char *s, uint64_t *ret)
{
        if (!*s || strspn(s, "0123456789") != strlen(s))
                return -EINVAL; /* strtoull would take "-3" (as 2^64 - 3), " 3" and "3abc" */
        errno = 0;
        unsigned long long v = strtoull(s, NULL, 10);
        if (errno || v == 0 || v > INT64_MAX)
                return -EINVAL;
        *ret = v;
        return 0;
}
