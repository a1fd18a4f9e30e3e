/* options.c: parsing of kcachefs's own option values (sizes, pin lists). Pure functions: no I/O, so the
 * fuzz target and the unit tests can call them directly. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kfs.h"

/* "123", "64K", "512M", "1G", "2T" (powers of 1024; "KiB", "KB", "k" also accepted). Zero is refused. */
int kfs_parse_size(const char *s, uint64_t *ret)
{
        if (!s || !isdigit((unsigned char)*s))
                return -EINVAL;
        uint64_t v = 0;
        for (; isdigit((unsigned char)*s); s++) {
                if (v > (UINT64_MAX - 9) / 10)
                        return -ERANGE;
                v = v * 10 + (uint64_t)(*s - '0');
        }
        unsigned shift = 0;
        switch (toupper((unsigned char)*s)) {
        case '\0':
                break;
        case 'K': shift = 10; s++; break;
        case 'M': shift = 20; s++; break;
        case 'G': shift = 30; s++; break;
        case 'T': shift = 40; s++; break;
        default:
                return -EINVAL;
        }
        if (shift && (!strcmp(s, "iB") || !strcmp(s, "B") || !strcmp(s, "b")))
                s += strlen(s);
        if (*s != '\0')
                return -EINVAL;
        if (v == 0)
                return -EDOM;
        if (shift && v > (UINT64_MAX >> shift))
                return -ERANGE;
        *ret = v << shift;
        return 0;
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
        free(o->backing);
        free(o->mountpoint);
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
