/* The key record: equal inputs give equal keys, every field changes the key, lengths keep fields
 * apart, spec constants are keyed by id whatever their order, and SPIR-V spec constant sizes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cl-int.h"
#include "tutil.h"

static kcache *kc;

static struct kcache__cl_dev base_dev(void)
{
        struct kcache__cl_dev d = { 0 };
        static char f[6][32] = { "Portable Computing Language", "OpenCL 3.0 PoCL 3.1", "GenuineIntel",
                                 "cpu-haswell", "OpenCL 3.0", "3.1+debian" };
        for (int i = 0; i < 6; i++)
                d.field[i] = f[i];
        strcpy(d.reldir, "opencl/test");
        return d;
}

static struct kcache__hash key_of(const struct kcache__cl_dev *d, const struct kcache__cl_input *in)
{
        struct kcache__key k;
        char rel[200];
        if (kcache__cl_key(kc, d, in, &k, rel, sizeof(rel)) < 0) {
                CHECK(!"kcache__cl_key failed");
                return (struct kcache__hash){ 0, 0 };
        }
        struct kcache__hash h = k.hash;
        kcache__key_free(&k);
        return h;
}

static bool same(struct kcache__hash a, struct kcache__hash b)
{
        return a.hi == b.hi && a.lo == b.lo;
}

int main(void)
{
        char *dir = tutil_tmpdir();
        unsetenv("KCACHE_TRACE");
        CHECK_EQ(kcache_open(dir, &kc), 0);
        CHECK(kcache__cl_state(kc, NULL) != NULL);

        struct kcache__cl_dev d = base_dev();
        cl_uint ids[2] = { 3, 7 };
        size_t sizes[2] = { 4, 4 };
        int v3 = 10, v7 = 20;
        const void *vals[2] = { &v3, &v7 };
        struct kcache__cl_input in = { "il", "\x03\x02\x23\x07 kernel bytes", 18, "-cl-fast-relaxed-math", 2, ids,
                                       sizes, vals };
        struct kcache__hash base = key_of(&d, &in);

        /* Equal inputs: equal keys, also from fresh copies of every buffer. */
        char *copy = strdup("\x03\x02\x23\x07 kernel bytes");
        struct kcache__cl_input in2 = in;
        in2.data = copy;
        in2.options = strdup(in.options);
        CHECK(same(base, key_of(&d, &in2)));

        /* Spec constants in another order: the same key. */
        cl_uint rids[2] = { 7, 3 };
        const void *rvals[2] = { &v7, &v3 };
        in2.spec_ids = rids;
        in2.spec_values = rvals;
        CHECK(same(base, key_of(&d, &in2)));

        /* Every field changes the key. */
        struct kcache__cl_input x = in;
        x.kind = "source";
        CHECK(!same(base, key_of(&d, &x)));
        x = in;
        copy[17] ^= 1;
        x.data = copy;
        CHECK(!same(base, key_of(&d, &x)));
        copy[17] ^= 1;
        x = in;
        x.len = 17;
        CHECK(!same(base, key_of(&d, &x)));
        x = in;
        x.options = "-cl-fast-relaxed-math ";
        CHECK(!same(base, key_of(&d, &x)));
        x = in;
        int v7b = 21;
        const void *vals2[2] = { &v3, &v7b };
        x.spec_values = vals2;
        CHECK(!same(base, key_of(&d, &x)));
        x = in;
        cl_uint ids2[2] = { 3, 8 };
        x.spec_ids = ids2;
        CHECK(!same(base, key_of(&d, &x)));
        x = in;
        x.nspec = 1;
        CHECK(!same(base, key_of(&d, &x)));
        for (int i = 0; i < 6; i++) {
                struct kcache__cl_dev e = d;
                char other[40];
                snprintf(other, sizeof(other), "%s!", d.field[i]);
                e.field[i] = other;
                CHECK(!same(base, key_of(&e, &in)));
        }
        /* Environment the compilers read, and variables the user adds with KCACHE_KEY_ENV. */
        setenv("POCL_EXTRA_BUILD_FLAGS", "-g", 1);
        CHECK(!same(base, key_of(&d, &in)));
        unsetenv("POCL_EXTRA_BUILD_FLAGS");
        setenv("IGC_ShaderDumpEnable", "1", 1);
        CHECK(!same(base, key_of(&d, &in)));
        unsetenv("IGC_ShaderDumpEnable");
        setenv("MY_COMPILER_KNOB", "1", 1);
        CHECK(same(base, key_of(&d, &in))); /* not a compiler variable */
        setenv("KCACHE_KEY_ENV", "OTHER,MY_COMPILER_KNOB", 1);
        CHECK(!same(base, key_of(&d, &in)));
        unsetenv("KCACHE_KEY_ENV");
        unsetenv("MY_COMPILER_KNOB");
        CHECK(same(base, key_of(&d, &in)));

        /* Lengths keep fields apart: options "ab" + platform "c" differs from "a" + "bc". */
        struct kcache__cl_dev e1 = d, e2 = d;
        e1.field[0] = "c";
        e2.field[0] = "bc";
        struct kcache__cl_input o1 = in, o2 = in;
        o1.options = "ab";
        o2.options = "a";
        CHECK(!same(key_of(&e1, &o1), key_of(&e2, &o2)));

        /* The record walks back into the same fields. */
        struct kcache__key k;
        char rel[200];
        CHECK_EQ(kcache__cl_key(kc, &d, &in, &k, rel, sizeof(rel)), 0);
        CHECK(!strncmp(rel, "opencl/test/", 12) && strlen(rel) == 12 + 32 + 4);
        CHECK_EQ(kcache__key_walk(k.buf, k.len, NULL, NULL), 0);
        CHECK(kcache__key_walk(k.buf, k.len - 1, NULL, NULL) < 0);
        kcache__key_free(&k);

        /* SPIR-V: OpDecorate %5 SpecId 7; %2 = OpTypeInt 32; %3 = OpTypeFloat 64; %4 = OpTypeBool;
         * %5 = OpSpecConstant %2 1; %6 = OpSpecConstant %3 0 0 (SpecId 9); %8 = OpSpecConstantTrue %4 (11). */
        uint32_t sp[] = { 0x07230203, 0x00010000, 0, 20, 0,
                          (4u << 16) | 71, 5, 1, 7,
                          (4u << 16) | 71, 6, 1, 9,
                          (4u << 16) | 71, 8, 1, 11,
                          (4u << 16) | 21, 2, 32, 0,
                          (3u << 16) | 22, 3, 64,
                          (2u << 16) | 20, 4,
                          (4u << 16) | 50, 2, 5, 1,
                          (5u << 16) | 50, 3, 6, 0, 0,
                          (3u << 16) | 48, 4, 8 };
        uint32_t q[3] = { 9, 7, 11 };
        size_t got[3];
        CHECK_EQ(kcache__spirv_spec_sizes(sp, sizeof(sp), 3, q, got), 0);
        CHECK_EQ(got[0], 8);
        CHECK_EQ(got[1], 4);
        CHECK_EQ(got[2], 1);
        uint32_t missing = 12;
        CHECK_EQ(kcache__spirv_spec_sizes(sp, sizeof(sp), 1, &missing, got), -ENOENT);
        CHECK_EQ(kcache__spirv_spec_sizes(sp, sizeof(sp) - 2, 1, q, got), -EINVAL);
        uint32_t bad[sizeof(sp) / 4];
        memcpy(bad, sp, sizeof(sp));
        bad[5] = (200u << 16) | 71; /* an instruction running past the end */
        CHECK(kcache__spirv_spec_sizes(bad, sizeof(bad), 1, q, got) < 0);
        uint32_t be[sizeof(sp) / 4]; /* the same module big-endian */
        for (size_t i = 0; i < sizeof(sp) / 4; i++)
                be[i] = __builtin_bswap32(sp[i]);
        CHECK_EQ(kcache__spirv_spec_sizes(be, sizeof(be), 3, q, got), 0);
        CHECK_EQ(got[0], 8);

        free(copy);
        free((void *)in2.options);
        kcache_close(kc);
        tutil_rmrf(dir);
        free(dir);
        return tutil_done("test-client-key");
}
