/* libFuzzer target: the entry parser and the key record walker on arbitrary bytes (what another
 * user, a torn write or a bad disk can leave under an entry's name). Built and run by tests/fuzz/run. */
#include <stdint.h>
#include <string.h>

#include "kcache-entry.h"

static void field(void *arg, int tag, const uint8_t *data, size_t len)
{
        volatile uint8_t sink = len ? data[0] ^ data[len - 1] : 0;
        (void)sink;
        (void)arg;
        (void)kcache__tag_name(tag);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static struct kcache__key key;
        if (!key.buf) {
                kcache__key_init(&key);
                kcache__key_add_str(&key, KCACHE__T_API, "blob");
                kcache__key_add_str(&key, KCACHE__T_KIND, "user");
                kcache__key_add_str(&key, KCACHE__T_INPUT, "seed");
                kcache__key_finish(&key);
        }
        struct kcache__entry_view v;
        enum kcache__verdict r = kcache__entry_parse(data, size, NULL, 0, &v);
        if (v.key)
                kcache__key_walk(v.key, v.key_len, field, NULL);
        if (r == KCACHE__OK && v.payload_len)
                field(NULL, 0, v.payload, v.payload_len);
        (void)kcache__verdict_str(r);
        kcache__entry_parse(data, size, key.buf, key.len, &v);
        kcache__key_walk(data, size, field, NULL);
        return 0;
}
