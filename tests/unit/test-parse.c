/* test-parse.c: sizes and durations as operators type them (common/parse.h), and what is refused. */
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "parse.h"
#include "tutil.h"

static void size_is(const char *s, int allow_zero, int want_r, uint64_t want)
{
        uint64_t v = 12345;
        int r = kparse_size(s, &v, allow_zero);
        CHECK(r == want_r);
        if (r == 0 && want_r == 0)
                CHECK(v == want);
        if (r != want_r || (r == 0 && v != want))
                fprintf(stderr, "  size %s: r=%d v=%llu, want r=%d v=%llu\n", s, r, (unsigned long long)v, want_r,
                        (unsigned long long)want);
}

static void dur_is(const char *s, int allow_zero, int want_r, double want)
{
        double v = -1;
        int r = kparse_duration(s, &v, allow_zero);
        CHECK(r == want_r);
        if (r == 0 && want_r == 0)
                CHECK(fabs(v - want) < 1e-9);
        if (r != want_r || (r == 0 && fabs(v - want) >= 1e-9))
                fprintf(stderr, "  duration %s: r=%d v=%g, want r=%d v=%g\n", s, r, v, want_r, want);
}

int main(void)
{
        size_is("4096", 0, 0, 4096);
        size_is("64K", 0, 0, 65536);
        size_is("64KiB", 0, 0, 65536);
        size_is("64k", 0, 0, 65536);
        size_is("500M", 0, 0, 500ULL << 20);
        size_is("1.5G", 0, 0, 3ULL << 29);
        size_is("2Ti", 0, 0, 2ULL << 40);
        size_is("2TB", 0, 0, 2ULL << 40);
        size_is("0.5K", 0, 0, 512);
        size_is(".5K", 0, 0, 512);
        size_is("1P", 0, 0, 1ULL << 50);
        size_is("16383P", 0, 0, 16383ULL << 50);
        size_is("16384P", 0, -ERANGE, 0);
        size_is("99999999999999999999999", 0, -ERANGE, 0);
        size_is("0", 0, -EDOM, 0);
        size_is("0.1", 0, -EDOM, 0);
        size_is("0", 1, 0, 0);
        size_is("", 0, -EINVAL, 0);
        size_is("G", 0, -EINVAL, 0);
        size_is("-1G", 0, -EINVAL, 0);
        size_is("1.2.3", 0, -EINVAL, 0);
        size_is("1X", 0, -EINVAL, 0);
        size_is("1Gx", 0, -EINVAL, 0);
        size_is("nan", 0, -EINVAL, 0);
        size_is("inf", 0, -EINVAL, 0);
        size_is("0x10", 0, -EINVAL, 0);
        size_is("1e9", 0, -EINVAL, 0);
        size_is(" 1G", 0, -EINVAL, 0);
        size_is("1 G", 0, -EINVAL, 0);

        dur_is("90", 0, 0, 90);
        dur_is("90s", 0, 0, 90);
        dur_is("5m", 0, 0, 300);
        dur_is("5min", 0, 0, 300);
        dur_is("1.5h", 0, 0, 5400);
        dur_is("30d", 0, 0, 30 * 86400);
        dur_is("2w", 0, 0, 14 * 86400);
        dur_is("0.25", 0, 0, 0.25);
        dur_is("0", 0, -EDOM, 0);
        dur_is("0", 1, 0, 0);
        dur_is("nan", 0, -EINVAL, 0);
        dur_is("inf", 0, -EINVAL, 0);
        dur_is("-5", 0, -EINVAL, 0);
        dur_is("1e3", 0, -EINVAL, 0);
        dur_is("5y", 0, -EINVAL, 0);
        dur_is("", 0, -EINVAL, 0);
        dur_is("99999999999999999999d", 0, -ERANGE, 0);
        return tutil_done("test-parse");
}
