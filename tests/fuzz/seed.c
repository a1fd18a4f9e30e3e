/* Writes valid entries (and a few near misses) as the fuzzer's starting corpus: seed DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcache-entry.h"

static void put(const char *dir, const char *name, const uint8_t *b, size_t n)
{
        char p[4096];
        snprintf(p, sizeof(p), "%s/%s", dir, name);
        FILE *f = fopen(p, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
}

int main(int argc, char **argv)
{
        const size_t sizes[] = { 0, 1, 17, 300 };
        for (int i = 0; i < 4; i++) {
                struct kcache__key k;
                kcache__key_init(&k);
                kcache__key_add_str(&k, KCACHE__T_API, i % 2 ? "opencl" : "blob");
                kcache__key_add_str(&k, KCACHE__T_KIND, "user");
                kcache__key_add_str(&k, KCACHE__T_INPUT, i == 3 ? "seed" : "__kernel void k() {}");
                kcache__key_add_str(&k, KCACHE__T_OPTIONS, "-O2");
                kcache__key_finish(&k);
                uint8_t *payload = calloc(1, sizes[i] + 1);
                for (size_t j = 0; j < sizes[i]; j++)
                        payload[j] = (uint8_t)(j * 7);
                size_t n = KCACHE__ENTRY_HEADER + k.len + sizes[i];
                uint8_t *b = malloc(n);
                kcache__entry_header(b, &k, payload, sizes[i]);
                memcpy(b + KCACHE__ENTRY_HEADER, k.buf, k.len);
                memcpy(b + KCACHE__ENTRY_HEADER + k.len, payload, sizes[i]);
                char name[32];
                snprintf(name, sizeof(name), "valid-%d", i);
                put(argv[1], name, b, n);
                snprintf(name, sizeof(name), "truncated-%d", i);
                put(argv[1], name, b, n / 2);
                free(b);
                free(payload);
                kcache__key_free(&k);
        }
        put(argv[1], "foreign-poclbin", (const uint8_t *)"poclbin\0\x0c{0]\xe9[\xee\x02\x09\0\0\0", 16);
        return 0;
}
