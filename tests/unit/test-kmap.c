/* test-kmap: the hash map against a plain array, through inserts, replacements and deletions that
 * exercise backward-shift deletion across wrap-around. */
#include <stdlib.h>

#include "../../common/kmap.h"
#include "tutil.h"

#define N 20000

int main(void)
{
        kmap m;
        kmap_init(&m);
        static uintptr_t ref[N];
        srand(42);
        for (int round = 0; round < 200000; round++) {
                uint64_t k = (uint64_t)(rand() % (N - 1)) + 1;
                int op = rand() % 3;
                if (op < 2) {
                        uintptr_t v = (uintptr_t)rand() | 1;
                        CHECK(kmap_put(&m, k, (void *)v) == 0);
                        ref[k] = v;
                } else {
                        void *v = kmap_del(&m, k);
                        CHECK((uintptr_t)v == ref[k]);
                        ref[k] = 0;
                }
        }
        size_t count = 0;
        for (uint64_t k = 1; k < N; k++) {
                CHECK((uintptr_t)kmap_get(&m, k) == ref[k]);
                count += ref[k] != 0;
        }
        CHECK_EQ(m.count, count);
        size_t seen = 0;
        uint64_t k;
        void *v;
        for (size_t pos = 0; kmap_next(&m, &pos, &k, &v);) {
                CHECK((uintptr_t)v == ref[k]);
                seen++;
        }
        CHECK_EQ(seen, count);
        kmap_free(&m);
        return tutil_done("test-kmap");
}
