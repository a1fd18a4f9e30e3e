/* libkcache-layer.so: a persistent binary cache for unmodified OpenCL applications, as an OpenCL layer
 * of the ICD loader (ocl-icd >= 2.3: OPENCL_LAYERS=/path/libkcache-layer.so). Same keys, entries and
 * directory as libkcache ($KCACHE_DIR, else $XDG_CACHE_HOME/kcache, else ~/.cache/kcache).
 *
 * How a program is served. The application creates program P from source (or IL) and builds it.
 * The layer sees the creation (it keeps the input) and the build (it has the options and devices,
 * so the key). On a hit it creates Q from the stored binaries and builds Q, and P itself is never
 * compiled: from then on, every call on P that depends on the build (kernels, binaries, kernel names,
 * build status and log) is answered from Q, and the others (source, context, devices, reference
 * count) from P. clGetKernelInfo(CL_KERNEL_PROGRAM) answers P. On a miss P is built by the driver
 * and its binaries are stored (on PoCL through a twin build, so that P stays unqueried); when the
 * application releases P for the last time, or at exit, P's binary is stored again if it grew
 * (PoCL adds the machine code of each kernel's first launch). A failed build is the driver's own:
 * same error, same log; nothing is stored. clCompileProgram/clLinkProgram are passed through, and a
 * program that goes through clCompileProgram is no longer cached.
 *
 * What must stay true: every call the layer does not change goes to the next layer unchanged; the
 * layer's own OpenCL calls go through the next layer's dispatch (kcache__clfns), never through the
 * loader again; the table of tracked programs is guarded by L.lock, never held across a build.
 * A layer is process-wide by nature: its state is the one struct L. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <CL/cl_layer.h>

#include "cl-int.h"

#define EXPORT __attribute__((visibility("default")))

struct prog {
        struct prog *next;
        cl_program p;                 /* the application's handle */
        cl_program q;                 /* built from the cache, answering for p; NULL: p is built */
        cl_context ctx;
        unsigned refs;                /* the application's references to p */
        bool uncached;                /* went through clCompileProgram: passed through */
        bool il;
        void *data;                   /* source or IL (owned) */
        size_t len;
        cl_uint nspec;                /* specialization constants set on p (owned) */
        cl_uint *spec_ids;
        size_t *spec_sizes;
        void **spec_values;
        struct kcache__cl_rec *rec;   /* entries of the last build, for the refresh of a grown binary */
};

static struct {
        const cl_icd_dispatch *next;
        cl_icd_dispatch mine;
        struct kcache__clfns fns;
        pthread_mutex_t lock;
        kcache *kc;                   /* opened at the first build; NULL: cache off */
        bool opened, exit_hook;
        struct prog *progs;
} L = { .lock = PTHREAD_MUTEX_INITIALIZER };

static struct prog *find(cl_program p)
{
        for (struct prog *t = L.progs; t; t = t->next)
                if (t->p == p)
                        return t;
        return NULL;
}

static struct prog *find_q(cl_program q)
{
        for (struct prog *t = L.progs; t; t = t->next)
                if (t->q == q)
                        return t;
        return NULL;
}

static void prog_free(struct prog *t)
{
        for (cl_uint i = 0; i < t->nspec; i++)
                free(t->spec_values[i]);
        free(t->spec_ids);
        free(t->spec_sizes);
        free(t->spec_values);
        kcache__cl_rec_free(t->rec);
        free(t->data);
        free(t);
}

static void track(cl_program p, cl_context ctx, bool il, void *data, size_t len)
{
        struct prog *t = calloc(1, sizeof(*t));
        if (!t) {
                free(data);
                return; /* untracked: passed through */
        }
        *t = (struct prog){ .p = p, .ctx = ctx, .refs = 1, .il = il, .data = data, .len = len };
        pthread_mutex_lock(&L.lock);
        t->next = L.progs;
        L.progs = t;
        pthread_mutex_unlock(&L.lock);
}

static kcache *handle(void)
{
        pthread_mutex_lock(&L.lock);
        if (!L.opened) {
                L.opened = true;
                int r = kcache_open(NULL, &L.kc);
                if (r < 0)
                        L.kc = NULL; /* no cache directory: the layer passes everything through */
                else if (!kcache__cl_state(L.kc, &L.fns)) {
                        kcache_close(L.kc);
                        L.kc = NULL;
                }
        }
        pthread_mutex_unlock(&L.lock);
        return L.kc;
}

/* At exit: store the grown binaries of programs still alive, then close the handle (its trace prints
 * the counters). Registered after the driver initialized, so it runs before the driver's own hooks. */
static void at_exit(void)
{
        pthread_mutex_lock(&L.lock);
        for (struct prog *t = L.progs; t; t = t->next)
                if (t->rec && !t->q && L.kc)
                        kcache__cl_refresh_one(L.kc, t->p, t->rec);
        kcache *kc = L.kc;
        L.kc = NULL;
        pthread_mutex_unlock(&L.lock);
        kcache_close(kc);
}

static cl_program CL_API_CALL create_with_source(cl_context ctx, cl_uint count, const char **strings,
                                                 const size_t *lengths, cl_int *err)
{
        cl_int e;
        cl_program p = L.next->clCreateProgramWithSource(ctx, count, strings, lengths, &e);
        if (err)
                *err = e;
        if (!p || e != CL_SUCCESS)
                return p;
        size_t total = 0;
        for (cl_uint i = 0; i < count; i++)
                total += lengths && lengths[i] ? lengths[i] : strlen(strings[i]);
        char *src = malloc(total + 1);
        if (src) {
                size_t off = 0;
                for (cl_uint i = 0; i < count; i++) {
                        size_t l = lengths && lengths[i] ? lengths[i] : strlen(strings[i]);
                        memcpy(src + off, strings[i], l);
                        off += l;
                }
                src[total] = '\0';
                track(p, ctx, false, src, total);
        }
        return p;
}

static cl_program CL_API_CALL create_with_il(cl_context ctx, const void *il, size_t len, cl_int *err)
{
        cl_int e;
        cl_program p = L.next->clCreateProgramWithIL(ctx, il, len, &e);
        if (err)
                *err = e;
        void *copy;
        if (p && e == CL_SUCCESS && il && len && (copy = malloc(len))) {
                memcpy(copy, il, len);
                track(p, ctx, true, copy, len);
        }
        return p;
}

static cl_int CL_API_CALL set_spec(cl_program p, cl_uint id, size_t size, const void *value)
{
        cl_int e = L.next->clSetProgramSpecializationConstant(p, id, size, value);
        if (e != CL_SUCCESS)
                return e;
        pthread_mutex_lock(&L.lock);
        struct prog *t = find(p);
        if (t && !t->uncached) {
                cl_uint i = 0;
                while (i < t->nspec && t->spec_ids[i] != id)
                        i++;
                void *v = malloc(size ? size : 1);
                if (i == t->nspec) {
                        cl_uint *ids = realloc(t->spec_ids, (i + 1) * sizeof(*ids));
                        size_t *sz = ids ? realloc(t->spec_sizes, (i + 1) * sizeof(*sz)) : NULL;
                        if (ids)
                                t->spec_ids = ids;
                        if (sz)
                                t->spec_sizes = sz;
                        void **vals = sz ? realloc(t->spec_values, (i + 1) * sizeof(*vals)) : NULL;
                        if (vals)
                                t->spec_values = vals;
                        if (!vals || !v) {
                                t->uncached = true; /* cannot key it: pass it through */
                                free(v);
                                pthread_mutex_unlock(&L.lock);
                                return e;
                        }
                        t->nspec++;
                        t->spec_values[i] = NULL;
                }
                if (!v) {
                        t->uncached = true;
                } else {
                        memcpy(v, value, size);
                        free(t->spec_values[i]);
                        t->spec_ids[i] = id;
                        t->spec_sizes[i] = size;
                        t->spec_values[i] = v;
                }
        }
        pthread_mutex_unlock(&L.lock);
        return e;
}

/* The build of a tracked program. T stays in the table (the application holds p during its build). */
static cl_int cached_build(struct prog *t, kcache *kc, cl_uint ndev, const cl_device_id *devs, const char *options)
{
        cl_device_id own[KCACHE__CL_MAXDEV];
        if (!ndev) { /* every device of the program */
                if (L.next->clGetProgramInfo(t->p, CL_PROGRAM_NUM_DEVICES, sizeof(ndev), &ndev, NULL) != CL_SUCCESS ||
                    ndev > KCACHE__CL_MAXDEV ||
                    L.next->clGetProgramInfo(t->p, CL_PROGRAM_DEVICES, ndev * sizeof(*own), own, NULL) != CL_SUCCESS)
                        return L.next->clBuildProgram(t->p, 0, NULL, options, NULL, NULL);
                devs = own;
        }
        if (ndev > KCACHE__CL_MAXDEV)
                return L.next->clBuildProgram(t->p, ndev, devs, options, NULL, NULL);
        struct kcache__cl_input in = { t->il ? "il" : "source", t->data, t->len, options ? options : "", t->nspec,
                                       t->spec_ids, t->spec_sizes, (const void *const *)t->spec_values };
        struct kcache__cl_rec *rec;
        struct kcache__hash h;
        if (kcache__cl_rec_new(kc, ndev, devs, &in, &rec, &h) < 0)
                return L.next->clBuildProgram(t->p, ndev, devs, options, NULL, NULL);
        int lockfd;
        cl_program q = kcache__cl_load_or_lock(kc, t->ctx, rec, in.options, &lockfd);
        cl_int e = CL_SUCCESS;
        if (!q) {
                e = L.next->clBuildProgram(t->p, ndev, devs, options, NULL, NULL);
                atomic_fetch_add(&kc->st.compiles, 1);
                kcache__trace(kc, "compile: %s", kcache__cl_errstr(e));
                if (e == CL_SUCCESS)
                        kcache__cl_store(kc, t->ctx, t->p, rec, &in);
        }
        kcache__unlock(lockfd);
        pthread_mutex_lock(&L.lock);
        cl_program old = t->q;
        t->q = q;
        kcache__cl_rec_free(t->rec);
        t->rec = e == CL_SUCCESS ? rec : NULL;
        if (e != CL_SUCCESS)
                kcache__cl_rec_free(rec);
        if (e == CL_SUCCESS && !L.exit_hook) {
                L.exit_hook = true;
                atexit(at_exit);
        }
        pthread_mutex_unlock(&L.lock);
        if (old)
                L.next->clReleaseProgram(old);
        return e;
}

static cl_int CL_API_CALL build_program(cl_program p, cl_uint ndev, const cl_device_id *devs, const char *options,
                                        void(CL_CALLBACK *notify)(cl_program, void *), void *user)
{
        pthread_mutex_lock(&L.lock);
        struct prog *t = find(p);
        bool cacheable = t && !t->uncached && (ndev == 0) == (devs == NULL);
        pthread_mutex_unlock(&L.lock);
        kcache *kc = cacheable ? handle() : NULL;
        if (!kc)
                return L.next->clBuildProgram(p, ndev, devs, options, notify, user);
        /* Built here, synchronously (allowed with a callback too), then the callback is told. */
        cl_int e = cached_build(t, kc, ndev, devs, options);
        if (notify)
                notify(p, user);
        return e;
}

static cl_int CL_API_CALL compile_program(cl_program p, cl_uint ndev, const cl_device_id *devs, const char *options,
                                          cl_uint nhdr, const cl_program *hdrs, const char **names,
                                          void(CL_CALLBACK *notify)(cl_program, void *), void *user)
{
        pthread_mutex_lock(&L.lock);
        struct prog *t = find(p);
        if (t)
                t->uncached = true;
        pthread_mutex_unlock(&L.lock);
        return L.next->clCompileProgram(p, ndev, devs, options, nhdr, hdrs, names, notify, user);
}

static cl_int CL_API_CALL retain_program(cl_program p)
{
        cl_int e = L.next->clRetainProgram(p);
        pthread_mutex_lock(&L.lock);
        struct prog *t = e == CL_SUCCESS ? find(p) : NULL;
        if (t)
                t->refs++;
        pthread_mutex_unlock(&L.lock);
        return e;
}

static cl_int CL_API_CALL release_program(cl_program p)
{
        pthread_mutex_lock(&L.lock);
        struct prog *t = find(p), *gone = NULL;
        if (t && --t->refs == 0) {
                for (struct prog **pp = &L.progs; *pp; pp = &(*pp)->next)
                        if (*pp == t) {
                                *pp = t->next;
                                break;
                        }
                gone = t;
        }
        pthread_mutex_unlock(&L.lock);
        if (gone) {
                if (gone->rec && !gone->q && L.kc) /* the last chance to capture what its launches compiled */
                        kcache__cl_refresh_one(L.kc, gone->p, gone->rec);
                if (gone->q)
                        L.next->clReleaseProgram(gone->q);
                prog_free(gone);
        }
        return L.next->clReleaseProgram(p);
}

/* The program that answers for P's build: Q if it was served from the cache. */
static cl_program built(cl_program p)
{
        pthread_mutex_lock(&L.lock);
        struct prog *t = find(p);
        cl_program q = t && t->q ? t->q : p;
        pthread_mutex_unlock(&L.lock);
        return q;
}

static cl_kernel CL_API_CALL create_kernel(cl_program p, const char *name, cl_int *err)
{
        return L.next->clCreateKernel(built(p), name, err);
}

static cl_int CL_API_CALL create_kernels(cl_program p, cl_uint n, cl_kernel *ks, cl_uint *nret)
{
        return L.next->clCreateKernelsInProgram(built(p), n, ks, nret);
}

static cl_int CL_API_CALL program_info(cl_program p, cl_program_info what, size_t size, void *value, size_t *ret)
{
        switch (what) {
        case CL_PROGRAM_BINARY_SIZES:
        case CL_PROGRAM_BINARIES:
        case CL_PROGRAM_NUM_KERNELS:
        case CL_PROGRAM_KERNEL_NAMES:
        case CL_PROGRAM_SCOPE_GLOBAL_CTORS_PRESENT:
        case CL_PROGRAM_SCOPE_GLOBAL_DTORS_PRESENT:
                return L.next->clGetProgramInfo(built(p), what, size, value, ret);
        default:
                return L.next->clGetProgramInfo(p, what, size, value, ret);
        }
}

static cl_int CL_API_CALL build_info(cl_program p, cl_device_id d, cl_program_build_info what, size_t size,
                                     void *value, size_t *ret)
{
        return L.next->clGetProgramBuildInfo(built(p), d, what, size, value, ret);
}

static cl_int CL_API_CALL kernel_info(cl_kernel k, cl_kernel_info what, size_t size, void *value, size_t *ret)
{
        cl_int e = L.next->clGetKernelInfo(k, what, size, value, ret);
        if (e == CL_SUCCESS && what == CL_KERNEL_PROGRAM && value && size >= sizeof(cl_program)) {
                pthread_mutex_lock(&L.lock);
                struct prog *t = find_q(*(cl_program *)value);
                if (t)
                        *(cl_program *)value = t->p;
                pthread_mutex_unlock(&L.lock);
        }
        return e;
}

EXPORT cl_int CL_API_CALL clGetLayerInfo(cl_layer_info what, size_t size, void *value, size_t *ret)
{
        static const char name[] = "kcache: persistent OpenCL program binary cache";
        const void *src;
        size_t n;
        cl_layer_api_version v = CL_LAYER_API_VERSION_100;
        if (what == CL_LAYER_API_VERSION) {
                src = &v;
                n = sizeof(v);
        } else if (what == CL_LAYER_NAME) {
                src = name;
                n = sizeof(name);
        } else {
                return CL_INVALID_VALUE;
        }
        if (value && size < n)
                return CL_INVALID_VALUE;
        if (value)
                memcpy(value, src, n);
        if (ret)
                *ret = n;
        return CL_SUCCESS;
}

EXPORT cl_int CL_API_CALL clInitLayer(cl_uint num_entries, const cl_icd_dispatch *target, cl_uint *num_ret,
                                      const cl_icd_dispatch **ret)
{
        size_t n = sizeof(cl_icd_dispatch) / sizeof(void *);
        if (!target || !ret || !num_ret || num_entries < n)
                return CL_INVALID_VALUE;
        L.next = target;
        L.mine = *target; /* everything passes through unless overridden below */
        L.mine.clCreateProgramWithSource = create_with_source;
        L.mine.clCreateProgramWithIL = create_with_il;
        L.mine.clSetProgramSpecializationConstant = set_spec;
        L.mine.clBuildProgram = build_program;
        L.mine.clCompileProgram = compile_program;
        L.mine.clRetainProgram = retain_program;
        L.mine.clReleaseProgram = release_program;
        L.mine.clCreateKernel = create_kernel;
        L.mine.clCreateKernelsInProgram = create_kernels;
        L.mine.clGetProgramInfo = program_info;
        L.mine.clGetProgramBuildInfo = build_info;
        L.mine.clGetKernelInfo = kernel_info;
        L.fns = (struct kcache__clfns){
                .GetPlatformInfo = target->clGetPlatformInfo,
                .GetDeviceInfo = target->clGetDeviceInfo,
                .GetContextInfo = target->clGetContextInfo,
                .CreateProgramWithSource = target->clCreateProgramWithSource,
                .CreateProgramWithBinary = target->clCreateProgramWithBinary,
                .CreateProgramWithIL = target->clCreateProgramWithIL,
                .SetProgramSpecializationConstant = target->clSetProgramSpecializationConstant,
                .BuildProgram = target->clBuildProgram,
                .GetProgramInfo = target->clGetProgramInfo,
                .GetProgramBuildInfo = target->clGetProgramBuildInfo,
                .RetainProgram = target->clRetainProgram,
                .ReleaseProgram = target->clReleaseProgram,
        };
        *num_ret = (cl_uint)n;
        *ret = &L.mine;
        return CL_SUCCESS;
}
