/* kc-ze-demo: a Level Zero application built on libkcache (kcache_ze.h), for tests.
 *
 *   kc-ze-demo [--dir DIR | --no-cache] [--spec VALUE] [--flags FLAGS] [--threads N] [--break]
 *
 * Creates a module from a small SPIR-V module (one 32-bit spec constant, id 1) with N threads at once,
 * and prints one JSON line: the kernel name of the module (the fake driver derives it from what was
 * compiled), the result, the build log of a failure, times and the handle's counters. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kcache_ze.h"

static double now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct job {
        kcache *kc;
        ze_context_handle_t ctx;
        ze_device_handle_t dev;
        ze_module_desc_t *desc;
        ze_module_handle_t mod;
        ze_module_build_log_handle_t log;
        ze_result_t r;
};

static void *create(void *arg)
{
        struct job *j = arg;
        j->r = kcache_ze_module_create(j->kc, j->ctx, j->dev, j->desc, &j->mod, &j->log);
        return NULL;
}

int main(int argc, char **argv)
{
        const char *dir = NULL, *flags = "-ze-opt-level=2";
        int nocache = 0, brk = 0, nthreads = 1;
        uint32_t spec = 5;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--dir") && i + 1 < argc)
                        dir = argv[++i];
                else if (!strcmp(argv[i], "--no-cache"))
                        nocache = 1;
                else if (!strcmp(argv[i], "--spec") && i + 1 < argc)
                        spec = (uint32_t)atoi(argv[++i]);
                else if (!strcmp(argv[i], "--flags") && i + 1 < argc)
                        flags = argv[++i];
                else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
                        nthreads = atoi(argv[++i]);
                else if (!strcmp(argv[i], "--break"))
                        brk = 1;
                else {
                        fprintf(stderr, "usage: kc-ze-demo [--dir DIR | --no-cache] [--spec N] [--flags F] "
                                        "[--threads N] [--break]\n");
                        return 2;
                }
        }
        if (nthreads < 1 || nthreads > 64)
                nthreads = 1;
        /* OpDecorate %5 SpecId 1; %2 = OpTypeInt 32 0; %5 = OpSpecConstant %2 0; then an OpSource-like
         * tail of words that --break fills with "BROKEN". */
        uint32_t il[] = { 0x07230203, 0x00010000, 0, 8, 0,
                          (4u << 16) | 71, 5, 1, 1,
                          (4u << 16) | 21, 2, 32, 0,
                          (4u << 16) | 50, 2, 5, 0,
                          (3u << 16) | 0, 0, 0 };
        if (brk)
                memcpy(&il[18], "BROKEN\0", 8);
        if (zeInit(0) != ZE_RESULT_SUCCESS) {
                fprintf(stderr, "kc-ze-demo: zeInit failed (is ZE_ENABLE_ALT_DRIVERS set?)\n");
                return 2;
        }
        uint32_t n = 1;
        ze_driver_handle_t drv;
        ze_device_handle_t dev;
        if (zeDriverGet(&n, &drv) != ZE_RESULT_SUCCESS || !n || (n = 1, zeDeviceGet(drv, &n, &dev)) != ZE_RESULT_SUCCESS) {
                fprintf(stderr, "kc-ze-demo: no Level Zero device\n");
                return 2;
        }
        ze_context_desc_t cd = { .stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC };
        ze_context_handle_t ctx;
        zeContextCreate(drv, &cd, &ctx);
        uint32_t id = 1;
        const void *val = &spec;
        ze_module_constants_t consts = { 1, &id, &val };
        ze_module_desc_t desc = { .stype = ZE_STRUCTURE_TYPE_MODULE_DESC, .format = ZE_MODULE_FORMAT_IL_SPIRV,
                                  .inputSize = sizeof(il), .pInputModule = (const uint8_t *)il,
                                  .pBuildFlags = flags, .pConstants = &consts };
        kcache *kc = NULL;
        if (!nocache && kcache_open(dir, &kc) < 0) {
                fprintf(stderr, "kc-ze-demo: kcache_open failed\n");
                return 2;
        }
        double t0 = now_ms();
        struct job jobs[64];
        pthread_t th[64];
        for (int i = 0; i < nthreads; i++) {
                jobs[i] = (struct job){ kc, ctx, dev, &desc, NULL, NULL, 0 };
                if (nthreads > 1)
                        pthread_create(&th[i], NULL, create, &jobs[i]);
                else
                        create(&jobs[i]);
        }
        int same = 1;
        char name[64] = "";
        for (int i = 0; i < nthreads; i++) {
                if (nthreads > 1)
                        pthread_join(th[i], NULL);
                same &= jobs[i].r == jobs[0].r;
                if (jobs[i].r == ZE_RESULT_SUCCESS) {
                        uint32_t nk = 1;
                        const char *kn = NULL;
                        zeModuleGetKernelNames(jobs[i].mod, &nk, &kn);
                        if (!*name)
                                snprintf(name, sizeof(name), "%s", kn ? kn : "");
                        same &= kn && !strcmp(name, kn);
                }
        }
        double t1 = now_ms();
        char logtext[256] = "";
        if (jobs[0].log) {
                size_t ls = sizeof(logtext);
                zeModuleBuildLogGetString(jobs[0].log, &ls, logtext);
        }
        for (int i = 0; i < nthreads; i++) {
                if (jobs[i].log)
                        zeModuleBuildLogDestroy(jobs[i].log);
                if (jobs[i].r == ZE_RESULT_SUCCESS)
                        zeModuleDestroy(jobs[i].mod);
        }
        struct kcache_stats st = { 0 };
        if (kc)
                kcache_get_stats(kc, &st);
        kcache_close(kc);
        zeContextDestroy(ctx);
        printf("{\"result\": %u, \"kernel\": \"%s\", \"log\": \"%s\", \"same\": %s, \"create_ms\": %.1f, "
               "\"hits\": %llu, \"misses\": %llu, \"rejects\": %llu, \"compiles\": %llu, \"stores\": %llu, "
               "\"lock_waits\": %llu}\n",
               (unsigned)jobs[0].r, name, logtext, same ? "true" : "false", t1 - t0, (unsigned long long)st.hits,
               (unsigned long long)st.misses, (unsigned long long)st.rejects, (unsigned long long)st.compiles,
               (unsigned long long)st.stores, (unsigned long long)st.lock_waits);
        return jobs[0].r == ZE_RESULT_SUCCESS ? 0 : 1;
}
