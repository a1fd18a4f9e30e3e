/* kc-entry: reads and rewrites libkcache entries for tests that forge them.
 *   kc-entry payload ENTRY OUT          writes the entry's payload to OUT
 *   kc-entry reseal ENTRY PAYLOAD       replaces the payload, keeping the key, with a valid header:
 *                                       what a driver update or a planted binary looks like */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcache-entry.h"

static uint8_t *slurp(const char *path, size_t *len)
{
        FILE *f = fopen(path, "rb");
        if (!f)
                return NULL;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        rewind(f);
        uint8_t *b = malloc((size_t)n + 1);
        if (fread(b, 1, (size_t)n, f) != (size_t)n)
                n = 0;
        fclose(f);
        *len = (size_t)n;
        return b;
}

int main(int argc, char **argv)
{
        if (argc != 4) {
                fprintf(stderr, "usage: kc-entry payload ENTRY OUT | kc-entry reseal ENTRY PAYLOAD\n");
                return 2;
        }
        size_t len;
        uint8_t *e = slurp(argv[2], &len);
        struct kcache__entry_view v;
        if (!e || kcache__entry_parse(e, len, NULL, 0, &v) != KCACHE__OK) {
                fprintf(stderr, "kc-entry: %s is not a valid entry\n", argv[2]);
                free(e);
                return 1;
        }
        if (!strcmp(argv[1], "payload")) {
                FILE *f = fopen(argv[3], "wb");
                fwrite(v.payload, 1, v.payload_len, f);
                free(e);
                return fclose(f) ? 1 : 0;
        }
        size_t plen;
        uint8_t *p = slurp(argv[3], &plen);
        struct kcache__key k = { .buf = (uint8_t *)v.key, .len = v.key_len, .hash = v.key_hash };
        uint8_t head[KCACHE__ENTRY_HEADER];
        kcache__entry_header(head, &k, p, plen);
        FILE *f = fopen(argv[2], "wb");
        fwrite(head, 1, sizeof(head), f);
        fwrite(v.key, 1, v.key_len, f);
        fwrite(p, 1, plen, f);
        free(p);
        free(e);
        return fclose(f) ? 1 : 0;
}
