/* quote.c: names written safely in plain, JSON and Prometheus output (the rules are in quote.h).
 *
 * What must stay true: no function here writes a byte below 0x20, DEL, or a C1 control (raw or encoded
 * as UTF-8) of the name as is; each output is a deterministic function of the name's bytes; the shell and
 * JSON forms can be decoded back to the exact bytes. JSON itself is json-c's: only its strings are ours. */
#include "quote.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (1 to 4; its code point in *cp), or 0 when the byte at s
 * starts none: a stray continuation byte, an overlong form, a surrogate, a value past U+10FFFF, a
 * truncated sequence. The same partition as Python's decoder, so surrogateescape round-trips. */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp)
{
        unsigned char c = s[0];
        if (c < 0x80) {
                *cp = c;
                return 1;
        }
        size_t n;
        uint32_t v, min;
        if (c >= 0xc2 && c <= 0xdf)
                n = 2, v = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef)
                n = 3, v = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
                n = 4, v = c & 0x07, min = 0x10000;
        else
                return 0;
        for (size_t i = 1; i < n; i++) {
                if ((s[i] & 0xc0) != 0x80) /* also stops at the NUL */
                        return 0;
                v = v << 6 | (s[i] & 0x3f);
        }
        if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
                return 0;
        *cp = v;
        return n;
}

/* Controls a terminal may act on: C0, DEL, C1. */
static bool is_control(uint32_t cp)
{
        return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

static bool shell_safe(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("%+,-./:=@_", c);
}

/* Quoting state of kc_put_shell: outside quotes, inside '...', inside $'...'. */
enum { OUT, SQ, DQ };

static void shell_enter(FILE *f, int *st, int want)
{
        if (*st == want)
                return;
        if (*st != OUT)
                fputc('\'', f);
        if (want == SQ)
                fputc('\'', f);
        else if (want == DQ)
                fputs("$'", f);
        *st = want;
}

void kc_put_shell(FILE *f, const char *s)
{
        const unsigned char *p = (const unsigned char *)s;
        bool plain = *p != '\0';
        for (const unsigned char *q = p; *q && plain;) {
                uint32_t cp;
                size_t n = utf8_seq(q, &cp);
                plain = n > 1 ? !is_control(cp) : n == 1 && shell_safe(*q);
                q += n ? n : 1;
        }
        if (plain) {
                fputs(s, f);
                return;
        }
        int st = OUT;
        if (!*p)
                fputs("''", f);
        while (*p) {
                uint32_t cp;
                size_t n = utf8_seq(p, &cp);
                if (n && !is_control(cp)) {
                        if (*p == '\'') {
                                shell_enter(f, &st, OUT);
                                fputs("\\'", f);
                        } else {
                                shell_enter(f, &st, SQ);
                                fwrite(p, 1, n, f);
                        }
                        p += n;
                        continue;
                }
                /* A control character, or bytes that are not UTF-8: each byte by its escape. */
                shell_enter(f, &st, DQ);
                static const char ctl[] = "\a\b\t\n\v\f\r", named[] = "abtnvfr";
                for (size_t i = 0; i < (n ? n : 1); i++, p++) {
                        const char *c = memchr(ctl, *p, sizeof(ctl) - 1);
                        if (c)
                                fprintf(f, "\\%c", named[c - ctl]);
                        else
                                fprintf(f, "\\%03o", *p);
                }
        }
        shell_enter(f, &st, OUT);
}

/* json-c's serializer for a string (json_object_set_serializer): the rules of quote.h. */
static int json_name(struct json_object *o, struct printbuf *pb, int level, int flags)
{
        const unsigned char *p = (const unsigned char *)json_object_get_string(o);
        printbuf_strappend(pb, "\"");
        while (*p) {
                uint32_t cp;
                size_t n = utf8_seq(p, &cp);
                if (!n) {
                        sprintbuf(pb, "\\udc%02x", *p++);
                        continue;
                }
                const char *e = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f"
                              : cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : cp == '\t' ? "\\t" : NULL;
                if (e)
                        printbuf_memappend(pb, e, (int)strlen(e));
                else if (is_control(cp) || cp == 0x2028 || cp == 0x2029)
                        sprintbuf(pb, "\\u%04x", (unsigned)cp);
                else
                        printbuf_memappend(pb, (const char *)p, (int)n);
                p += n;
        }
        printbuf_strappend(pb, "\"");
        return 0;
}

static void json_names(struct json_object *o)
{
        if (json_object_is_type(o, json_type_string)) {
                json_object_set_serializer(o, json_name, NULL, NULL);
        } else if (json_object_is_type(o, json_type_array)) {
                for (size_t i = 0; i < json_object_array_length(o); i++)
                        json_names(json_object_array_get_idx(o, i));
        } else if (json_object_is_type(o, json_type_object)) {
                json_object_object_foreach(o, key, v) {
                        (void)key;
                        json_names(v);
                }
        }
}

int kc_json_write(FILE *f, struct json_object *o)
{
        json_names(o);
        const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!text) {
                errno = ENOMEM;
                return -ENOMEM;
        }
        fputs(text, f);
        return ferror(f) ? -EIO : 0;
}

void kc_put_prom(FILE *f, const char *s)
{
        const unsigned char *p = (const unsigned char *)s;
        fputc('"', f);
        while (*p) {
                uint32_t cp;
                size_t n = utf8_seq(p, &cp);
                if (n && (cp == '\\' || cp == '"'))
                        fprintf(f, "\\%c", (char)cp);
                else if (n && cp == '\n')
                        fputs("\\n", f);
                else if (!n || is_control(cp))
                        fputs("\xef\xbf\xbd", f);
                else
                        fwrite(p, 1, n, f);
                p += n ? n : 1;
        }
        fputc('"', f);
}
