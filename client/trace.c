/* The trace ($KCACHE_TRACE): one line per decision, prefixed "kcache[pid]:", so a user can see which
 * field made a key differ and why an entry was not used. Lines are written whole under trace_lock. */
#include <ctype.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kcache-int.h"

double kcache__now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void kcache__trace(kcache *kc, const char *fmt, ...)
{
        if (!kc->trace)
                return;
        char line[1024];
        int n = snprintf(line, sizeof(line), "kcache[%d]: ", (int)getpid());
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
        va_end(ap);
        pthread_mutex_lock(&kc->trace_lock);
        fprintf(kc->trace, "%s\n", line);
        fflush(kc->trace);
        pthread_mutex_unlock(&kc->trace_lock);
}

struct trace_walk {
        kcache *kc;
};

/* Text fields print quoted (cut at 160 bytes); binary ones and long inputs as size and XXH3-64. */
static void trace_field(void *arg, int tag, const uint8_t *d, size_t len)
{
        kcache *kc = ((struct trace_walk *)arg)->kc;
        const char *name = kcache__tag_name(tag);
        bool text = true;
        for (size_t i = 0; i < len && text; i++)
                text = isprint(d[i]) || d[i] == '\n' || d[i] == '\t' || d[i] == '\r';
        if ((tag == KCACHE__T_DEVICE_UUID || tag == KCACHE__T_DRIVER_UUID) && len <= 32) {
                char hex[65];
                for (size_t i = 0; i < len; i++)
                        snprintf(hex + 2 * i, 3, "%02x", d[i]);
                kcache__trace(kc, "  %-17s %s", name, len ? hex : "");
        } else if (tag == KCACHE__T_SPEC && len >= 4) {
                char hex[2 * 8 + 1] = "";
                for (size_t i = 4; i < len && i < 12; i++)
                        snprintf(hex + 2 * (i - 4), 3, "%02x", d[i]);
                kcache__trace(kc, "  %-17s id %u = 0x%s (%zu bytes)", name,
                              d[0] | d[1] << 8 | d[2] << 16 | (unsigned)d[3] << 24, hex, len - 4);
        } else if (tag == KCACHE__T_INPUT || !text || len > 160) {
                size_t lines = 0;
                for (size_t i = 0; i < len; i++)
                        lines += d[i] == '\n';
                if (text)
                        kcache__trace(kc, "  %-17s %zu bytes, %zu lines, xxh3-64 %016llx", name, len, lines,
                                      (unsigned long long)XXH3_64bits(d, len));
                else
                        kcache__trace(kc, "  %-17s %zu bytes (binary), xxh3-64 %016llx", name, len,
                                      (unsigned long long)XXH3_64bits(d, len));
        } else {
                kcache__trace(kc, "  %-17s \"%.*s\"", name, (int)len, (const char *)d);
        }
}

void kcache__trace_key(kcache *kc, const char *relpath, const struct kcache__key *key)
{
        if (!kc->trace)
                return;
        kcache__trace(kc, "key %s:", relpath);
        struct trace_walk w = { kc };
        kcache__key_walk(key->buf, key->len, trace_field, &w);
}

void kcache__slug(const char *s, char *out, size_t max)
{
        size_t n = 0;
        bool dash = false;
        for (; *s && n + 1 < max; s++) {
                unsigned char c = (unsigned char)*s;
                if (isalnum(c)) {
                        if (dash && n)
                                out[n++] = '-';
                        if (n + 1 < max)
                                out[n++] = (char)tolower(c);
                        dash = false;
                } else {
                        dash = true;
                }
        }
        out[n] = '\0';
        if (!n && max > 7)
                strcpy(out, "device");
}
