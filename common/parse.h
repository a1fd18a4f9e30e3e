/* parse.h: the values an operator types (sizes, durations), parsed the same way by the daemon's options,
 * its control attributes and kcache. Pure functions, no I/O: the fuzz target calls them directly.
 *
 * Sizes: a number, optionally with a fraction, and a unit: K, M, G, T, P (powers of 1024, as kcachefs has
 * always read them; KiB, Ki, KB and k are the same), or none for bytes. "1.5G", "500M", "2Ti", "64KiB",
 * "4096". The result is rounded down to a whole byte.
 * Durations: a number, optionally with a fraction, and a unit: s (or none), m or min, h, d, w. "30d",
 * "12h", "1.5h", "90". Always finite; NaN, infinities and hexadecimal floats are refused. */
#ifndef KCACHEFS_PARSE_H
#define KCACHEFS_PARSE_H

#include <stdint.h>

/* 0, or -EINVAL (not a size), -ERANGE (above 2^64 - 1), -EDOM (zero, where zero is refused). */
int kparse_size(const char *s, uint64_t *ret, int allow_zero);

/* Seconds. 0, or -EINVAL (not a duration), -ERANGE (over 100 years), -EDOM (zero or less, where refused). */
int kparse_duration(const char *s, double *ret, int allow_zero);

#endif
