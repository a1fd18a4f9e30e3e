/* libFuzzer target: the shared tier's unit decoder (fs/remote/value.c) on arbitrary bytes, what a server
 * or whoever writes to it can hand back. The whole-value checksum is made right first, so that the fuzzer
 * reaches the lengths, paths and per-file checks behind it instead of stopping at the checksum; a value
 * that decodes must re-encode to the same bytes. Built and run by tests/fuzz/run. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "value.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        unsigned char *v = malloc(size + 8);
        if (!v)
                return 0;
        memcpy(v, data, size);
        uint64_t sum = XXH64(v, size, 0);
        for (int i = 0; i < 8; i++)
                v[size + (size_t)i] = (unsigned char)(sum >> (8 * i));
        struct krv_unit u;
        if (krv_decode(v, size + 8, &u) == 0) {
                size_t len;
                unsigned char *again = krv_encode(&u, &len);
                if (!again || len != size + 8 || memcmp(again, v, len))
                        __builtin_trap(); /* a decoded unit is exactly what encoding it gives */
                free(again);
                krv_free(&u);
        }
        free(v);
        return 0;
}
