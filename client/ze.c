/* kcache_ze_module_create(): zeModuleCreate with the native binary cached. Device identity is looked
 * up once per device and handle (kc->lock guards the list); the flight table gives in-process single
 * flight without keeping modules (they cannot be shared). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kcache-int.h"
#include "kcache_ze.h"

struct ze_dev {
        struct ze_dev *next;
        ze_device_handle_t id;
        char name[ZE_MAX_DEVICE_NAME];
        uint8_t uuid[ZE_MAX_DEVICE_UUID_SIZE];
        uint8_t drv_uuid[ZE_MAX_DRIVER_UUID_SIZE];
        char drv_version[16], api_version[16];
        char reldir[96];
};

static void ze_close(kcache *kc)
{
        for (struct ze_dev *d = kc->ze, *n; d; d = n) {
                n = d->next;
                free(d);
        }
        kc->ze = NULL;
}

/* The driver that owns DEV (Level Zero has no query for it). */
static ze_driver_handle_t driver_of(ze_device_handle_t dev)
{
        uint32_t nd = 0;
        if (zeDriverGet(&nd, NULL) != ZE_RESULT_SUCCESS || !nd)
                return NULL;
        ze_driver_handle_t drivers[64];
        if (nd > 64)
                nd = 64;
        if (zeDriverGet(&nd, drivers) != ZE_RESULT_SUCCESS)
                return NULL;
        for (uint32_t i = 0; i < nd; i++) {
                uint32_t n = 0;
                if (zeDeviceGet(drivers[i], &n, NULL) != ZE_RESULT_SUCCESS || !n)
                        continue;
                ze_device_handle_t *devs = calloc(n, sizeof(*devs));
                if (!devs)
                        return NULL;
                bool found = false;
                if (zeDeviceGet(drivers[i], &n, devs) == ZE_RESULT_SUCCESS)
                        for (uint32_t j = 0; j < n; j++)
                                found |= devs[j] == dev;
                free(devs);
                if (found)
                        return drivers[i];
        }
        return NULL;
}

static const struct ze_dev *identity(kcache *kc, ze_device_handle_t id)
{
        pthread_mutex_lock(&kc->lock);
        for (struct ze_dev *d = kc->ze; d; d = d->next)
                if (d->id == id) {
                        pthread_mutex_unlock(&kc->lock);
                        return d;
                }
        pthread_mutex_unlock(&kc->lock);
        ze_device_properties_t dp = { .stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES };
        ze_driver_properties_t rp = { .stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES };
        ze_api_version_t api = 0;
        ze_driver_handle_t drv = driver_of(id);
        if (!drv || zeDeviceGetProperties(id, &dp) != ZE_RESULT_SUCCESS ||
            zeDriverGetProperties(drv, &rp) != ZE_RESULT_SUCCESS ||
            zeDriverGetApiVersion(drv, &api) != ZE_RESULT_SUCCESS) {
                kcache__trace(kc, "level zero: the device's identity is not available; not caching");
                return NULL;
        }
        struct ze_dev *d = calloc(1, sizeof(*d));
        if (!d)
                return NULL;
        d->id = id;
        snprintf(d->name, sizeof(d->name), "%s", dp.name);
        memcpy(d->uuid, dp.uuid.id, sizeof(d->uuid));
        memcpy(d->drv_uuid, rp.uuid.id, sizeof(d->drv_uuid));
        snprintf(d->drv_version, sizeof(d->drv_version), "%" PRIu32, rp.driverVersion);
        snprintf(d->api_version, sizeof(d->api_version), "%u.%u", ZE_MAJOR_VERSION(api), ZE_MINOR_VERSION(api));
        XXH3_state_t *st = XXH3_createState();
        if (!st) {
                free(d);
                return NULL;
        }
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, d->name, strlen(d->name) + 1);
        XXH3_64bits_update(st, d->uuid, sizeof(d->uuid));
        XXH3_64bits_update(st, d->drv_uuid, sizeof(d->drv_uuid));
        XXH3_64bits_update(st, d->drv_version, strlen(d->drv_version) + 1);
        unsigned long long h = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        char slug[48];
        kcache__slug(d->name, slug, sizeof(slug));
        snprintf(d->reldir, sizeof(d->reldir), "level-zero/%s-%08llx", slug, h >> 32);
        pthread_mutex_lock(&kc->lock);
        for (struct ze_dev *o = kc->ze; o; o = o->next)
                if (o->id == id) {
                        pthread_mutex_unlock(&kc->lock);
                        free(d);
                        return o;
                }
        d->next = kc->ze;
        kc->ze = d;
        kc->ze_close = ze_close;
        pthread_mutex_unlock(&kc->lock);
        return d;
}

/* The key of DESC on DEV. Returns 0, -ENOENT (spec constants the module does not declare), -ENOMEM. */
static int make_key(kcache *kc, const struct ze_dev *d, const ze_module_desc_t *desc, struct kcache__key *k)
{
        const ze_module_constants_t *c = desc->pConstants;
        uint32_t n = c ? c->numConstants : 0;
        size_t *sizes = NULL;
        uint32_t *ord = NULL;
        if (n) {
                sizes = calloc(n, sizeof(*sizes));
                ord = calloc(n, sizeof(*ord));
                if (!sizes || !ord) {
                        free(sizes);
                        free(ord);
                        return -ENOMEM;
                }
                int r = kcache__spirv_spec_sizes(desc->pInputModule, desc->inputSize, n, c->pConstantIds, sizes);
                if (r < 0) {
                        free(sizes);
                        free(ord);
                        return r;
                }
                for (uint32_t i = 0; i < n; i++) /* by id: insertion sort, there are few */
                        for (uint32_t j = ord[i] = i; j > 0 && c->pConstantIds[ord[j - 1]] > c->pConstantIds[ord[j]]; j--) {
                                uint32_t t = ord[j];
                                ord[j] = ord[j - 1];
                                ord[j - 1] = t;
                        }
        }
        kcache__key_init(k);
        kcache__key_add_str(k, KCACHE__T_API, "level-zero");
        kcache__key_add_str(k, KCACHE__T_KIND, "il");
        kcache__key_add(k, KCACHE__T_INPUT, desc->pInputModule, desc->inputSize);
        kcache__key_add_str(k, KCACHE__T_OPTIONS, desc->pBuildFlags);
        for (uint32_t j = 0; j < n; j++) {
                uint32_t i = ord[j], id = c->pConstantIds[i];
                uint8_t b[4 + 8] = { (uint8_t)id, (uint8_t)(id >> 8), (uint8_t)(id >> 16), (uint8_t)(id >> 24) };
                size_t sz = sizes[i] > 8 ? 8 : sizes[i];
                memcpy(b + 4, c->pConstantValues[i], sz);
                kcache__key_add(k, KCACHE__T_SPEC, b, 4 + sz);
        }
        free(sizes);
        free(ord);
        kcache__key_add_str(k, KCACHE__T_DEVICE_NAME, d->name);
        kcache__key_add_str(k, KCACHE__T_DRIVER_VERSION, d->drv_version);
        kcache__key_add(k, KCACHE__T_DEVICE_UUID, d->uuid, sizeof(d->uuid));
        kcache__key_add(k, KCACHE__T_DRIVER_UUID, d->drv_uuid, sizeof(d->drv_uuid));
        kcache__key_add_str(k, KCACHE__T_API_VERSION, d->api_version);
        int r = kcache__key_finish(k);
        if (r < 0)
                kcache__key_free(k);
        return r;
}

/* Creates the module from the stored native binary. ZE_RESULT_SUCCESS, or why not (a miss included). */
static ze_result_t load(kcache *kc, ze_context_handle_t ctx, ze_device_handle_t dev, const ze_module_desc_t *desc,
                        const char *rel, const struct kcache__key *k, ze_module_handle_t *ret)
{
        void *bin;
        size_t len;
        if (kcache__entry_load(kc, rel, k, &bin, &len) < 0)
                return ZE_RESULT_ERROR_NOT_AVAILABLE;
        ze_module_desc_t nd = *desc;
        nd.format = ZE_MODULE_FORMAT_NATIVE;
        nd.inputSize = len;
        nd.pInputModule = bin;
        nd.pConstants = NULL;
        double t0 = kcache__now_ms();
        /* No build log here: reading one of a failed native create crashes the loader's intercept. */
        ze_result_t r = zeModuleCreate(ctx, dev, &nd, ret, NULL);
        free(bin);
        if (r == ZE_RESULT_SUCCESS) {
                kcache__trace(kc, "loaded module from %s in %.1f ms", rel, kcache__now_ms() - t0);
        } else {
                kcache__trace(kc, "reject %s: the driver refused the native binary (0x%x); removing it and "
                              "compiling the IL", rel, (unsigned)r);
                atomic_fetch_add(&kc->st.rejects, 1);
                kcache__entry_remove(kc, rel);
        }
        return r;
}

/* Compiles the IL and stores the module's native binary. */
static ze_result_t compile(kcache *kc, ze_context_handle_t ctx, ze_device_handle_t dev, const ze_module_desc_t *desc,
                           const char *rel, const struct kcache__key *k, ze_module_handle_t *ret,
                           ze_module_build_log_handle_t *log)
{
        double t0 = kcache__now_ms();
        ze_result_t r = zeModuleCreate(ctx, dev, desc, ret, log);
        atomic_fetch_add(&kc->st.compiles, 1);
        kcache__trace(kc, "compile: 0x%x in %.1f ms", (unsigned)r, kcache__now_ms() - t0);
        if (r != ZE_RESULT_SUCCESS)
                return r;
        size_t n = 0;
        uint8_t *bin = NULL;
        if (zeModuleGetNativeBinary(*ret, &n, NULL) == ZE_RESULT_SUCCESS && n && (bin = malloc(n)) &&
            zeModuleGetNativeBinary(*ret, &n, bin) == ZE_RESULT_SUCCESS)
                kcache__entry_store(kc, rel, k, bin, n);
        else
                kcache__trace(kc, "store %s: the driver gave no native binary", rel);
        free(bin);
        return r;
}

KCACHE__EXPORT ze_result_t kcache_ze_module_create(kcache *kc, ze_context_handle_t ctx, ze_device_handle_t dev,
                                                   const ze_module_desc_t *desc, ze_module_handle_t *ret,
                                                   ze_module_build_log_handle_t *log)
{
        if (!kc || !desc || !ret || desc->format != ZE_MODULE_FORMAT_IL_SPIRV || !desc->pInputModule ||
            !desc->inputSize)
                return zeModuleCreate(ctx, dev, desc, ret, log);
        const struct ze_dev *d = identity(kc, dev);
        if (!d)
                return zeModuleCreate(ctx, dev, desc, ret, log);
        struct kcache__key k;
        int e = make_key(kc, d, desc, &k);
        if (e == -ENOMEM)
                return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        if (e < 0) {
                kcache__trace(kc, "level zero: specialization constants the module does not declare; not cached");
                return zeModuleCreate(ctx, dev, desc, ret, log);
        }
        char rel[160];
        kcache__entry_path(d->reldir, &k, rel, sizeof(rel));
        if (KCACHE__TRACING(kc))
                kcache__trace_key(kc, rel, &k);
        if (log)
                *log = NULL;

        void *obj;
        int ferr = 0;
        int flight = kcache__flight_begin(kc, ctx, k.hash, NULL, &obj, &ferr);
        if (flight == KCACHE__FLIGHT_FAILED) {
                kcache__trace(kc, "the compile of another thread failed: 0x%x", (unsigned)ferr);
                kcache__key_free(&k);
                return (ze_result_t)ferr;
        }
        /* Builder, or a waiter whose builder succeeded: either way the entry is the first place to look. */
        uint64_t rejects = atomic_load(&kc->st.rejects);
        ze_result_t r = load(kc, ctx, dev, desc, rel, &k, ret);
        if (r == ZE_RESULT_SUCCESS) {
                atomic_fetch_add(&kc->st.hits, 1);
        } else {
                bool waited = false;
                int lockfd = kc->disabled ? -1 : kcache__lock(kc, d->reldir, &k, &waited);
                /* again, as kcache__cl_load_or_lock does (cl-build.c says why) */
                r = !kc->disabled && (waited || atomic_load(&kc->st.rejects) == rejects)
                            ? load(kc, ctx, dev, desc, rel, &k, ret)
                            : ZE_RESULT_ERROR_NOT_AVAILABLE;
                if (r == ZE_RESULT_SUCCESS) {
                        atomic_fetch_add(&kc->st.hits, 1);
                } else {
                        atomic_fetch_add(&kc->st.misses, 1);
                        r = compile(kc, ctx, dev, desc, rel, &k, ret, log);
                }
                kcache__unlock(lockfd);
        }
        if (flight == KCACHE__FLIGHT_BUILD)
                kcache__flight_end(kc, ctx, k.hash, NULL, NULL, (int)r, NULL);
        kcache__key_free(&k);
        return r;
}
