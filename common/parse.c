/* parse.c: sizes and durations as an operator types them (parse.h). One reading for the daemon's -o
 * options, its control attributes and kcache, so that a value accepted by one is accepted by all. */
#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "parse.h"

/* The leading decimal number of s, "12", "1.5" or ".5": digits and one point only (strtod would also take
 * "nan", "inf", "0x1p4" and exponents, none of which an operator means). *end: the first byte after it. */
static int decimal(const char *s, long double *ret, const char **end)
{
        long double v = 0, scale = 1;
        bool digits = false, point = false;
        for (; *s; s++) {
                if (isdigit((unsigned char)*s)) {
                        digits = true;
                        if (point) {
                                scale /= 10;
                                v += scale * (*s - '0');
                        } else {
                                v = v * 10 + (*s - '0');
                        }
                } else if (*s == '.' && !point) {
                        point = true;
                } else {
                        break;
                }
        }
        if (!digits)
                return -EINVAL;
        *ret = v;
        *end = s;
        return 0;
}

int kparse_size(const char *s, uint64_t *ret, int allow_zero)
{
        long double v;
        const char *u;
        if (!s || decimal(s, &v, &u) < 0)
                return -EINVAL;
        static const char units[] = "KMGTP";
        unsigned shift = 0;
        if (*u) {
                const char *p = strchr(units, toupper((unsigned char)*u));
                if (!p)
                        return -EINVAL;
                shift = 10 * (unsigned)(p - units + 1);
                u++;
                if (!strcmp(u, "iB") || !strcmp(u, "i") || !strcmp(u, "B") || !strcmp(u, "b"))
                        u += strlen(u);
                if (*u)
                        return -EINVAL;
        }
        long double bytes = floorl(v * (long double)(1ULL << shift));
        if (bytes >= 18446744073709551616.0L)
                return -ERANGE;
        if (bytes < 1 && !allow_zero)
                return -EDOM;
        *ret = (uint64_t)bytes;
        return 0;
}

int kparse_duration(const char *s, double *ret, int allow_zero)
{
        long double v;
        const char *u;
        if (!s || decimal(s, &v, &u) < 0)
                return -EINVAL;
        static const struct { const char *name; double secs; } units[] = {
                { "", 1 }, { "s", 1 }, { "m", 60 }, { "min", 60 }, { "h", 3600 }, { "d", 86400 }, { "w", 7 * 86400 },
        };
        double mult = 0;
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
                if (!strcmp(u, units[i].name))
                        mult = units[i].secs;
        if (mult == 0)
                return -EINVAL;
        long double secs = v * mult;
        if (secs > 100.0L * 366 * 86400)
                return -ERANGE;
        if (secs <= 0 && !allow_zero)
                return -EDOM;
        *ret = (double)secs;
        return 0;
}
