/* libze_fake.so: a Level Zero driver for tests, loaded by the real loader (libze1) through
 * ZE_ENABLE_ALT_DRIVERS=/path/libze_fake.so. One driver, one GPU device, and a module "compiler":
 *   - IL (must start with the SPIR-V magic) costs ZE_FAKE_COMPILE_MS (default 300) and appends a line
 *     to $ZE_FAKE_COMPILE_LOG, so tests can count compilations across processes. IL containing the
 *     bytes "BROKEN" fails with ZE_RESULT_ERROR_MODULE_BUILD_FAILURE and a build log.
 *   - The native binary: "ZEFAKE01", the device name's hash, then a hash of the IL, build flags and
 *     spec constant values (4 bytes each). A native binary for another device (or not one of ours) is
 *     refused with ZE_RESULT_ERROR_INVALID_NATIVE_BINARY.
 *   - zeModuleGetKernelNames returns one name made from the content hash, so a program can check that
 *     a module loaded from the cache is the one it compiled.
 * $ZE_FAKE_DEVICE names the device (default "Fake GPU 9000"), $ZE_FAKE_DRIVER_VERSION the driver's
 * version (default 1): changing either must change the cache key. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>

struct fake_module {
        uint8_t native[32];
        char name[32];
};
struct fake_log {
        char text[128];
};

static int driver_obj, device_obj;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
        const uint8_t *b = p;
        for (size_t i = 0; i < n; i++)
                h = (h ^ b[i]) * 1099511628211ull;
        return h;
}

static const char *device_name(void)
{
        const char *n = getenv("ZE_FAKE_DEVICE");
        return n && *n ? n : "Fake GPU 9000";
}

static ze_result_t ZE_APICALL fake_init(ze_init_flags_t flags)
{
        (void)flags;
        return ZE_RESULT_SUCCESS; /* the loader calls it twice */
}

static ze_result_t ZE_APICALL driver_get(uint32_t *count, ze_driver_handle_t *drivers)
{
        if (drivers && *count >= 1)
                drivers[0] = (ze_driver_handle_t)&driver_obj;
        *count = 1;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_api_version(ze_driver_handle_t d, ze_api_version_t *v)
{
        (void)d;
        *v = ZE_API_VERSION_1_3;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_props(ze_driver_handle_t d, ze_driver_properties_t *p)
{
        (void)d;
        const char *v = getenv("ZE_FAKE_DRIVER_VERSION");
        memset(p->uuid.id, 0x5a, sizeof(p->uuid.id));
        p->driverVersion = v ? (uint32_t)atoi(v) : 1;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_ipc(ze_driver_handle_t d, ze_driver_ipc_properties_t *p)
{
        (void)d;
        p->flags = 0;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_ext(ze_driver_handle_t d, uint32_t *count, ze_driver_extension_properties_t *p)
{
        (void)d;
        (void)p;
        *count = 0;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_ext_fn(ze_driver_handle_t d, const char *name, void **fn)
{
        (void)d;
        (void)name;
        *fn = NULL;
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
}

static ze_result_t ZE_APICALL device_get(ze_driver_handle_t d, uint32_t *count, ze_device_handle_t *devs)
{
        (void)d;
        if (devs && *count >= 1)
                devs[0] = (ze_device_handle_t)&device_obj;
        *count = 1;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_props(ze_device_handle_t d, ze_device_properties_t *p)
{
        (void)d;
        p->type = ZE_DEVICE_TYPE_GPU;
        p->vendorId = 0xfa4e;
        p->deviceId = 0x9000;
        uint64_t h = fnv(1469598103934665603ull, device_name(), strlen(device_name()));
        memcpy(p->uuid.id, &h, 8);
        memcpy(p->uuid.id + 8, &h, 8);
        snprintf(p->name, sizeof(p->name), "%s", device_name());
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL context_create(ze_driver_handle_t d, const ze_context_desc_t *desc, ze_context_handle_t *ctx)
{
        (void)d;
        (void)desc;
        *ctx = (ze_context_handle_t)malloc(16);
        return *ctx ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
}

static ze_result_t ZE_APICALL context_destroy(ze_context_handle_t ctx)
{
        free(ctx);
        return ZE_RESULT_SUCCESS;
}

static void log_compile(void)
{
        const char *path = getenv("ZE_FAKE_COMPILE_LOG");
        if (!path)
                return;
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
                char line[32];
                int n = snprintf(line, sizeof(line), "%d\n", (int)getpid());
                if (write(fd, line, (size_t)n) < 0)
                        perror("ze-fake: compile log");
                close(fd);
        }
}

static ze_result_t ZE_APICALL module_create(ze_context_handle_t ctx, ze_device_handle_t dev, const ze_module_desc_t *desc,
                                            ze_module_handle_t *ret, ze_module_build_log_handle_t *ret_log)
{
        (void)ctx;
        (void)dev;
        if (!desc || !ret || !desc->pInputModule)
                return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
        struct fake_module *m = calloc(1, sizeof(*m));
        if (!m)
                return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        uint64_t devh = fnv(1469598103934665603ull, device_name(), strlen(device_name()));
        const uint8_t *in = desc->pInputModule;
        if (ret_log)
                *ret_log = NULL;
        if (desc->format == ZE_MODULE_FORMAT_NATIVE) {
                if (desc->inputSize != 32 || memcmp(in, "ZEFAKE01", 8) || memcmp(in + 8, &devh, 8)) {
                        free(m);
                        return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
                }
                memcpy(m->native, in, 32);
        } else {
                uint32_t magic;
                if (desc->inputSize < 20 || (memcpy(&magic, in, 4), magic != 0x07230203u)) {
                        free(m);
                        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
                }
                const char *ms = getenv("ZE_FAKE_COMPILE_MS");
                int ms_n = ms ? atoi(ms) : 300;
                struct timespec ts = { ms_n / 1000, (ms_n % 1000) * 1000000L };
                nanosleep(&ts, NULL);
                log_compile();
                if (memmem(in, desc->inputSize, "BROKEN", 6)) {
                        free(m);
                        if (ret_log) {
                                struct fake_log *l = calloc(1, sizeof(*l));
                                if (l)
                                        snprintf(l->text, sizeof(l->text), "fake: error: BROKEN at byte %zu",
                                                 (size_t)((const uint8_t *)memmem(in, desc->inputSize, "BROKEN", 6) - in));
                                *ret_log = (ze_module_build_log_handle_t)l;
                        }
                        return ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
                }
                uint64_t h = fnv(1469598103934665603ull, in, desc->inputSize);
                if (desc->pBuildFlags)
                        h = fnv(h, desc->pBuildFlags, strlen(desc->pBuildFlags));
                for (uint32_t i = 0; desc->pConstants && i < desc->pConstants->numConstants; i++) {
                        h = fnv(h, &desc->pConstants->pConstantIds[i], 4);
                        h = fnv(h, desc->pConstants->pConstantValues[i], 4);
                }
                memcpy(m->native, "ZEFAKE01", 8);
                memcpy(m->native + 8, &devh, 8);
                memcpy(m->native + 16, &h, 8);
                memcpy(m->native + 24, &h, 8);
                if (ret_log)
                        *ret_log = (ze_module_build_log_handle_t)calloc(1, sizeof(struct fake_log));
        }
        uint64_t h;
        memcpy(&h, m->native + 16, 8);
        snprintf(m->name, sizeof(m->name), "k_%016llx", (unsigned long long)h);
        *ret = (ze_module_handle_t)m;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL module_destroy(ze_module_handle_t m)
{
        free(m);
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL module_native(ze_module_handle_t mh, size_t *size, uint8_t *bin)
{
        struct fake_module *m = (struct fake_module *)mh;
        if (bin)
                memcpy(bin, m->native, *size < 32 ? *size : 32);
        *size = 32;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL module_kernel_names(ze_module_handle_t mh, uint32_t *count, const char **names)
{
        struct fake_module *m = (struct fake_module *)mh;
        if (names && *count >= 1)
                names[0] = m->name;
        *count = 1;
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL log_destroy(ze_module_build_log_handle_t l)
{
        free(l);
        return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL log_string(ze_module_build_log_handle_t lh, size_t *size, char *out)
{
        struct fake_log *l = (struct fake_log *)lh;
        size_t n = strlen(l->text) + 1;
        if (out)
                memcpy(out, l->text, *size < n ? *size : n);
        *size = n;
        return ZE_RESULT_SUCCESS;
}

static void fill_global(ze_global_dditable_t *t)
{
        t->pfnInit = fake_init;
}

static void fill_driver(ze_driver_dditable_t *t)
{
        t->pfnGet = driver_get;
        t->pfnGetApiVersion = driver_api_version;
        t->pfnGetProperties = driver_props;
        t->pfnGetIpcProperties = driver_ipc;
        t->pfnGetExtensionProperties = driver_ext;
        t->pfnGetExtensionFunctionAddress = driver_ext_fn;
}

static void fill_device(ze_device_dditable_t *t)
{
        t->pfnGet = device_get;
        t->pfnGetProperties = device_props;
}

static void fill_context(ze_context_dditable_t *t)
{
        t->pfnCreate = context_create;
        t->pfnDestroy = context_destroy;
}

static void fill_module(ze_module_dditable_t *t)
{
        t->pfnCreate = module_create;
        t->pfnDestroy = module_destroy;
        t->pfnGetNativeBinary = module_native;
        t->pfnGetKernelNames = module_kernel_names;
}

static void fill_buildlog(ze_module_build_log_dditable_t *t)
{
        t->pfnDestroy = log_destroy;
        t->pfnGetString = log_string;
}

#include "ze-fake-getters.inc"
