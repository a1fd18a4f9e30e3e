/* args.h: how kcache reads its command line, one reading for every verb.
 *
 * Each verb parses its options with getopt_long (GNU order: options may come after the operands, "--" ends
 * them, so a file named "-x" is "-- -x"). What must stay true:
 *   - bad usage (an unknown option, a missing value, a value given to an option that takes none, a count,
 *     size or duration that does not parse, operands missing or too many) is said on stderr, naming what
 *     was wrong, and exits 2 before anything is read or done; nothing goes to stdout;
 *   - -h and --help print the verb's usage on stdout and exit 0;
 *   - the usage printed here, each verb's --help and kcache(1)'s SYNOPSIS say the same
 *     (tests/integration/test_cli_usage.py compares them).
 * Exit status everywhere: 0 ok, 1 the operation failed, 2 bad usage (KC_EXIT_*). */
#pragma once

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

enum { KC_EXIT_OK = 0, KC_EXIT_FAILED = 1, KC_EXIT_USAGE = 2 };

/* What kc_opt returns besides an option's value and -1 (the end). */
enum { KC_OPT_HELP = -2, KC_OPT_BAD = -3 };

/* Values of the options that have no one-letter form: above any char, so that an error about one of them
 * (kc_opt) is told from an unknown one-letter option. */
enum { KC_O_JSON = 256, KC_O_PROMETHEUS, KC_O_LRU, KC_O_MRU, KC_O_TO, KC_O_OLDER_THAN, KC_O_REPAIR, KC_O_WAIT };

/* One form of a verb: its arguments after "kcache VERB", and what it does (one line of the usage). */
struct kc_form {
        const char *args;
        const char *what;
};

struct kc_verb {
        const char *name;
        /* argv[0] is the verb's name; returns the exit status. */
        int (*run)(const struct kc_verb *v, int argc, char **argv);
        struct kc_form forms[3];
        const char *options; /* its options, one a line ("  --json   ..."), -h/--help added; NULL: none */
};

/* kcache --help: every verb's forms (table, n of them), the global options, defaults and exit status. */
void kc_usage(FILE *f, const struct kc_verb *table, size_t n);
/* kcache VERB --help. */
void kc_verb_help(FILE *f, const struct kc_verb *v);

/* The next option of argv (getopt_long with shorts, which must not hold 'h', and longs, which must hold
 * {"help", no_argument, NULL, 'h'}); reset optind to 0 before the first call on a new argv. -1 at the
 * end (the operands are argv[optind..argc-1]); KC_OPT_HELP once the help is printed; KC_OPT_BAD once the
 * error is said (v NULL: the global options, "kcache: ..."). */
int kc_opt(const struct kc_verb *v, int argc, char **argv, const char *shorts, const struct option *longs);

/* Says "kcache: VERB: what", and how to get the verb's help, on stderr. Returns KC_EXIT_USAGE. */
int kc_bad_usage(const struct kc_verb *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checks that the operands (argv[optind..argc-1]) number from min to max (max < 0: any); otherwise says
 * "no WHAT" or "unexpected argument" (kc_bad_usage). Returns 0 or KC_EXIT_USAGE. */
int kc_operands(const struct kc_verb *v, int argc, char **argv, int min, int max, const char *what);

/* A count an operator typed (ls -n): decimal digits only, from 1 to INT64_MAX (the index's LIMIT).
 * 0 or -EINVAL. */
int kc_parse_count(const char *s, uint64_t *ret);
