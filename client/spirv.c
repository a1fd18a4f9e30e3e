/* Sizes of SPIR-V specialization constants. Level Zero passes spec constant values as bare pointers;
 * to put the values into a key we must know how many bytes each has, which only the module says:
 *   OpDecorate %c SpecId N; %c = OpSpecConstant %t ... | OpSpecConstantTrue/False %t; %t = OpTypeInt W
 *   | OpTypeFloat W | OpTypeBool (1 byte, as the drivers read it).
 * The module is untrusted input: every word read is bounds-checked. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kcache-int.h"

static uint32_t swap32(uint32_t v)
{
        return __builtin_bswap32(v);
}

int kcache__spirv_spec_sizes(const void *il, size_t len, uint32_t n, const uint32_t *ids, size_t *sizes)
{
        if (len < 20 || len % 4)
                return -EINVAL;
        size_t nw = len / 4;
        uint32_t *w = malloc(len);
        if (!w)
                return -ENOMEM;
        memcpy(w, il, len);
        if (w[0] == swap32(0x07230203u))
                for (size_t i = 0; i < nw; i++)
                        w[i] = swap32(w[i]);
        int r = -EINVAL;
        uint32_t bound = w[3];
        if (w[0] != 0x07230203u || bound == 0 || bound > (1u << 22))
                goto out;
        uint32_t *width = calloc(bound, sizeof(*width));  /* type id -> bytes */
        uint32_t *ctype = calloc(bound, sizeof(*ctype));  /* spec constant id -> type id */
        uint32_t *specid = calloc(bound, sizeof(*specid)); /* result id -> SpecId + 1 */
        if (!width || !ctype || !specid) {
                r = -ENOMEM;
                goto out2;
        }
        for (size_t i = 5; i < nw;) {
                uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
                if (wc == 0 || wc > nw - i)
                        goto out2;
                const uint32_t *a = w + i + 1;
                if (op == 71 && wc >= 4 && a[1] == 1 && a[0] < bound) /* OpDecorate %x SpecId N */
                        specid[a[0]] = a[2] + 1;
                else if (op == 20 && wc >= 2 && a[0] < bound) /* OpTypeBool */
                        width[a[0]] = 1;
                else if ((op == 21 || op == 22) && wc >= 3 && a[0] < bound) /* OpTypeInt/OpTypeFloat */
                        width[a[0]] = a[1] / 8;
                else if (op >= 48 && op <= 50 && wc >= 3 && a[1] < bound) /* OpSpecConstant{True,False,} */
                        ctype[a[1]] = a[0];
                i += wc;
        }
        r = 0;
        for (uint32_t k = 0; k < n && !r; k++) {
                sizes[k] = 0;
                for (uint32_t x = 0; x < bound; x++)
                        if (specid[x] == ids[k] + 1 && ctype[x] && ctype[x] < bound && width[ctype[x]]) {
                                sizes[k] = width[ctype[x]];
                                break;
                        }
                if (!sizes[k])
                        r = -ENOENT;
        }
out2:
        free(width);
        free(ctype);
        free(specid);
out:
        free(w);
        return r;
}
