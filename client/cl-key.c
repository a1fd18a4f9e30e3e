/* The OpenCL key: device identity (looked up once per device and handle), the environment variables
 * compilers read, and the canonical key record of a build. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cl-int.h"

extern char **environ;

static const struct kcache__clfns icd_fns = {
        .GetPlatformInfo = clGetPlatformInfo,
        .GetDeviceInfo = clGetDeviceInfo,
        .GetContextInfo = clGetContextInfo,
        .CreateProgramWithSource = clCreateProgramWithSource,
        .CreateProgramWithBinary = clCreateProgramWithBinary,
        .CreateProgramWithIL = clCreateProgramWithIL,
        .SetProgramSpecializationConstant = clSetProgramSpecializationConstant,
        .BuildProgram = clBuildProgram,
        .GetProgramInfo = clGetProgramInfo,
        .GetProgramBuildInfo = clGetProgramBuildInfo,
        .RetainProgram = clRetainProgram,
        .ReleaseProgram = clReleaseProgram,
};

struct kcache__cl *kcache__cl_state(kcache *kc, const struct kcache__clfns *fns)
{
        pthread_mutex_lock(&kc->lock);
        struct kcache__cl *cl = kc->cl;
        if (!cl) {
                cl = calloc(1, sizeof(*cl));
                if (cl) {
                        cl->fns = fns ? fns : &icd_fns;
                        const char *r = getenv("KCACHE_CL_RECAPTURE");
                        cl->recapture = r && *r ? atoi(r) != 0 : -1;
                        kc->cl = cl;
                        kc->cl_close = kcache__cl_close;
                }
        }
        pthread_mutex_unlock(&kc->lock);
        return cl;
}

static char *platform_str(const struct kcache__clfns *f, cl_platform_id p, cl_platform_info what)
{
        size_t n = 0;
        if (f->GetPlatformInfo(p, what, 0, NULL, &n) != CL_SUCCESS)
                return NULL;
        char *s = calloc(1, n + 1);
        if (s && f->GetPlatformInfo(p, what, n, s, NULL) != CL_SUCCESS) {
                free(s);
                return NULL;
        }
        return s;
}

static char *device_str(const struct kcache__clfns *f, cl_device_id d, cl_device_info what)
{
        size_t n = 0;
        if (f->GetDeviceInfo(d, what, 0, NULL, &n) != CL_SUCCESS)
                return NULL;
        char *s = calloc(1, n + 1);
        if (s && f->GetDeviceInfo(d, what, n, s, NULL) != CL_SUCCESS) {
                free(s);
                return NULL;
        }
        return s;
}

static void dev_free(struct kcache__cl_dev *d)
{
        for (int i = 0; i < 6; i++)
                free(d->field[i]);
        free(d);
}

int kcache__cl_device(kcache *kc, cl_device_id id, const struct kcache__cl_dev **ret)
{
        struct kcache__cl *cl = kc->cl;
        pthread_mutex_lock(&kc->lock);
        for (struct kcache__cl_dev *d = cl->devs; d; d = d->next)
                if (d->id == id) {
                        pthread_mutex_unlock(&kc->lock);
                        *ret = d;
                        return 0;
                }
        pthread_mutex_unlock(&kc->lock);

        const struct kcache__clfns *f = cl->fns;
        cl_platform_id plat;
        if (f->GetDeviceInfo(id, CL_DEVICE_PLATFORM, sizeof(plat), &plat, NULL) != CL_SUCCESS)
                return -EIO;
        struct kcache__cl_dev *d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        d->id = id;
        d->field[0] = platform_str(f, plat, CL_PLATFORM_NAME);
        d->field[1] = platform_str(f, plat, CL_PLATFORM_VERSION);
        d->field[2] = device_str(f, id, CL_DEVICE_VENDOR);
        d->field[3] = device_str(f, id, CL_DEVICE_NAME);
        d->field[4] = device_str(f, id, CL_DEVICE_VERSION);
        d->field[5] = device_str(f, id, CL_DRIVER_VERSION);
        for (int i = 0; i < 6; i++)
                if (!d->field[i]) {
                        dev_free(d);
                        return -EIO;
                }
        d->pocl = strstr(d->field[0], "Portable Computing Language") != NULL;
        XXH3_state_t *st = XXH3_createState();
        if (!st) {
                dev_free(d);
                return -ENOMEM;
        }
        XXH3_64bits_reset(st);
        for (int i = 0; i < 6; i++)
                XXH3_64bits_update(st, d->field[i], strlen(d->field[i]) + 1);
        unsigned long long h = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        char slug[48];
        kcache__slug(d->field[3], slug, sizeof(slug));
        snprintf(d->reldir, sizeof(d->reldir), "opencl/%s-%08llx", slug, h >> 32);

        pthread_mutex_lock(&kc->lock);
        for (struct kcache__cl_dev *o = cl->devs; o; o = o->next)
                if (o->id == id) { /* another thread was quicker */
                        pthread_mutex_unlock(&kc->lock);
                        dev_free(d);
                        *ret = o;
                        return 0;
                }
        d->next = cl->devs;
        cl->devs = d;
        pthread_mutex_unlock(&kc->lock);
        *ret = d;
        return 0;
}

void kcache__cl_free_devices(struct kcache__cl *cl)
{
        for (struct kcache__cl_dev *d = cl->devs, *n; d; d = n) {
                n = d->next;
                dev_free(d);
        }
        cl->devs = NULL;
}

/* Environment variables that change what an OpenCL compiler produces. */
static bool env_in_key(const char *kv)
{
        static const char *const exact[] = {
                "AMD_OCL_BUILD_OPTIONS", "AMD_OCL_BUILD_OPTIONS_APPEND", "AMD_OCL_LINK_OPTIONS",
                "AMD_OCL_LINK_OPTIONS_APPEND", "POCL_EXTRA_BUILD_FLAGS", "POCL_WORK_GROUP_METHOD",
        };
        static const char *const prefix[] = { "IGC_", "CL_CONFIG_" };
        size_t n = strcspn(kv, "=");
        for (size_t i = 0; i < sizeof(exact) / sizeof(*exact); i++)
                if (strlen(exact[i]) == n && !strncmp(kv, exact[i], n))
                        return true;
        for (size_t i = 0; i < sizeof(prefix) / sizeof(*prefix); i++)
                if (!strncmp(kv, prefix[i], strlen(prefix[i])))
                        return true;
        const char *extra = getenv("KCACHE_KEY_ENV");
        for (const char *p = extra; p && *p;) {
                size_t l = strcspn(p, ",");
                if (l == n && !strncmp(p, kv, n))
                        return true;
                p += l + (p[l] == ',');
        }
        return false;
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_spec(const void *a, const void *b, void *arg)
{
        const cl_uint *ids = arg;
        cl_uint x = ids[*(const cl_uint *)a], y = ids[*(const cl_uint *)b];
        return x < y ? -1 : x > y;
}

int kcache__cl_key(kcache *kc, const struct kcache__cl_dev *dev, const struct kcache__cl_input *in,
                   struct kcache__key *k, char *relpath, size_t size)
{
        kcache__key_init(k);
        kcache__key_add_str(k, KCACHE__T_API, "opencl");
        kcache__key_add_str(k, KCACHE__T_KIND, in->kind);
        kcache__key_add(k, KCACHE__T_INPUT, in->data, in->len);
        kcache__key_add_str(k, KCACHE__T_OPTIONS, in->options);

        size_t n = 0, cap = 0;
        const char **env = NULL;
        for (char **e = environ; e && *e; e++) {
                if (!env_in_key(*e))
                        continue;
                if (n == cap) {
                        cap = cap ? cap * 2 : 8;
                        const char **ne = realloc(env, cap * sizeof(*ne));
                        if (!ne) {
                                free(env);
                                kcache__key_free(k);
                                return -ENOMEM;
                        }
                        env = ne;
                }
                env[n++] = *e;
        }
        if (n)
                qsort(env, n, sizeof(*env), cmp_str);
        for (size_t i = 0; i < n; i++)
                kcache__key_add_str(k, KCACHE__T_ENV, env[i]);
        free(env);

        if (in->nspec) { /* by id, so the order the caller lists them in does not matter */
                cl_uint *ord = malloc(in->nspec * sizeof(*ord));
                if (!ord) {
                        kcache__key_free(k);
                        return -ENOMEM;
                }
                for (cl_uint i = 0; i < in->nspec; i++)
                        ord[i] = i;
                qsort_r(ord, in->nspec, sizeof(*ord), cmp_spec, (void *)in->spec_ids);
                for (cl_uint j = 0; j < in->nspec; j++) {
                        cl_uint i = ord[j];
                        size_t sz = in->spec_sizes[i];
                        uint8_t *b = malloc(4 + sz);
                        if (!b) {
                                free(ord);
                                kcache__key_free(k);
                                return -ENOMEM;
                        }
                        cl_uint id = in->spec_ids[i];
                        b[0] = (uint8_t)id, b[1] = (uint8_t)(id >> 8), b[2] = (uint8_t)(id >> 16), b[3] = (uint8_t)(id >> 24);
                        memcpy(b + 4, in->spec_values[i], sz);
                        kcache__key_add(k, KCACHE__T_SPEC, b, 4 + sz);
                        free(b);
                }
                free(ord);
        }
        static const enum kcache__tag tags[6] = { KCACHE__T_PLATFORM_NAME, KCACHE__T_PLATFORM_VERSION,
                                                  KCACHE__T_DEVICE_VENDOR, KCACHE__T_DEVICE_NAME,
                                                  KCACHE__T_DEVICE_VERSION, KCACHE__T_DRIVER_VERSION };
        for (int i = 0; i < 6; i++)
                kcache__key_add_str(k, tags[i], dev->field[i]);
        int r = kcache__key_finish(k);
        if (r < 0) {
                kcache__key_free(k);
                return r;
        }
        kcache__entry_path(dev->reldir, k, relpath, size);
        if (KCACHE__TRACING(kc))
                kcache__trace_key(kc, relpath, k);
        return 0;
}

cl_int kcache__cl_binaries(kcache *kc, cl_program prog, cl_uint ndev, const cl_device_id *devs,
                           unsigned char **bins, size_t *sizes)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        cl_uint pn = 0;
        cl_int e = f->GetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof(pn), &pn, NULL);
        if (e != CL_SUCCESS)
                return e;
        cl_device_id *pd = calloc(pn, sizeof(*pd));
        size_t *ps = calloc(pn, sizeof(*ps));
        unsigned char **pb = calloc(pn, sizeof(*pb));
        if (!pd || !ps || !pb) {
                e = CL_OUT_OF_HOST_MEMORY;
                goto out;
        }
        e = f->GetProgramInfo(prog, CL_PROGRAM_DEVICES, pn * sizeof(*pd), pd, NULL);
        if (e == CL_SUCCESS)
                e = f->GetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, pn * sizeof(*ps), ps, NULL);
        if (e != CL_SUCCESS)
                goto out;
        for (cl_uint j = 0; j < pn; j++) {
                bool wanted = false;
                for (cl_uint i = 0; i < ndev; i++)
                        wanted |= pd[j] == devs[i];
                if (wanted && ps[j] && !(pb[j] = malloc(ps[j]))) {
                        e = CL_OUT_OF_HOST_MEMORY;
                        goto out;
                }
        }
        e = f->GetProgramInfo(prog, CL_PROGRAM_BINARIES, pn * sizeof(*pb), pb, NULL);
        if (e != CL_SUCCESS)
                goto out;
        for (cl_uint i = 0; i < ndev; i++) {
                bins[i] = NULL;
                sizes[i] = 0;
                for (cl_uint j = 0; j < pn; j++)
                        if (pd[j] == devs[i] && pb[j]) {
                                bins[i] = pb[j];
                                sizes[i] = ps[j];
                                pb[j] = NULL;
                                break;
                        }
        }
out:
        for (cl_uint j = 0; pb && j < pn; j++)
                free(pb[j]);
        free(pb);
        free(ps);
        free(pd);
        return e;
}

const char *kcache__cl_errstr(cl_int e)
{
        switch (e) {
#define C(x) case x: return #x;
        C(CL_SUCCESS) C(CL_DEVICE_NOT_FOUND) C(CL_DEVICE_NOT_AVAILABLE) C(CL_COMPILER_NOT_AVAILABLE)
        C(CL_MEM_OBJECT_ALLOCATION_FAILURE) C(CL_OUT_OF_RESOURCES) C(CL_OUT_OF_HOST_MEMORY)
        C(CL_BUILD_PROGRAM_FAILURE) C(CL_INVALID_VALUE) C(CL_INVALID_DEVICE) C(CL_INVALID_CONTEXT)
        C(CL_INVALID_BINARY) C(CL_INVALID_BUILD_OPTIONS) C(CL_INVALID_PROGRAM) C(CL_INVALID_OPERATION)
        C(CL_COMPILE_PROGRAM_FAILURE) C(CL_LINKER_NOT_AVAILABLE) C(CL_LINK_PROGRAM_FAILURE)
        C(CL_INVALID_PROGRAM_EXECUTABLE) C(CL_INVALID_KERNEL_NAME) C(CL_INVALID_SPEC_ID)
#undef C
        }
        return "CL error";
}

void kcache__cl_close(kcache *kc)
{
        kcache__flight_forget(kc, NULL);
        struct kcache__cl *cl = kc->cl;
        kcache__cl_free_devices(cl);
        free(cl);
        kc->cl = NULL;
}
