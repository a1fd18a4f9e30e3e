/* kcache_cl_build_program(): the OpenCL build flow of the library: the in-process table (memory hits
 * and single flight), then the entries, the per-key lock, compile and store (cl-build.c), and the
 * refresh of grown binaries at close. Keys and device identity: cl-key.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cl-int.h"

static void prog_retain(kcache *kc, void *p)
{
        ((struct kcache__cl *)kc->cl)->fns->RetainProgram(p);
}

static void prog_release(kcache *kc, void *p)
{
        ((struct kcache__cl *)kc->cl)->fns->ReleaseProgram(p);
}

static void prog_leave(kcache *kc, void *p, void *data)
{
        if (data)
                kcache__cl_refresh_one(kc, p, data);
}

static void rec_free(void *data)
{
        kcache__cl_rec_free(data);
}

static const struct kcache__obj_ops prog_ops = { prog_retain, prog_release, prog_leave, rec_free };

static cl_program compile_uncached(cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                                   const struct kcache__cl_input *in, cl_int *err);

static cl_program build(kcache *kc, cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                        const struct kcache__cl_input *in, cl_int *err)
{
        cl_int e = CL_SUCCESS;
        cl_device_id *owned = NULL;
        struct kcache__cl_rec *rec = NULL;
        cl_program p = NULL;
        struct kcache__cl *cl = kcache__cl_state(kc, NULL);
        if (!cl) {
                e = CL_OUT_OF_HOST_MEMORY;
                goto out;
        }
        if (!ndev) { /* every device of the context */
                e = cl->fns->GetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof(ndev), &ndev, NULL);
                if (e == CL_SUCCESS && !(owned = calloc(ndev ? ndev : 1, sizeof(*owned))))
                        e = CL_OUT_OF_HOST_MEMORY;
                if (e == CL_SUCCESS)
                        e = cl->fns->GetContextInfo(ctx, CL_CONTEXT_DEVICES, ndev * sizeof(*owned), owned, NULL);
                if (e != CL_SUCCESS)
                        goto out;
                devs = owned;
        }
        if (ndev > KCACHE__CL_MAXDEV) { /* not a real configuration: build without the cache */
                kcache__trace(kc, "%u devices: more than %d, not cached", ndev, KCACHE__CL_MAXDEV);
                p = compile_uncached(ctx, ndev, devs, in, &e);
                goto out;
        }
        struct kcache__hash h;
        int r = kcache__cl_rec_new(kc, ndev, devs, in, &rec, &h);
        if (r < 0) {
                e = r == -ENOMEM ? CL_OUT_OF_HOST_MEMORY : CL_INVALID_DEVICE;
                goto out;
        }

        void *obj = NULL;
        int ferr = 0;
        switch (kcache__flight_begin(kc, ctx, h, &prog_ops, &obj, &ferr)) {
        case KCACHE__FLIGHT_READY:
                atomic_fetch_add(&kc->st.memory_hits, 1);
                kcache__trace(kc, "memory hit: program built earlier by this process");
                p = obj;
                goto out;
        case KCACHE__FLIGHT_FAILED:
                kcache__trace(kc, "the build of another thread failed: %s", kcache__cl_errstr((cl_int)ferr));
                p = obj;
                e = (cl_int)ferr;
                goto out;
        }
        int lockfd;
        p = kcache__cl_load_or_lock(kc, ctx, rec, in->options, &lockfd);
        if (!p) {
                p = kcache__cl_compile(kc, ctx, rec, in, &e, true);
                if (p && e == CL_SUCCESS)
                        p = kcache__cl_store(kc, ctx, p, rec, in);
        }
        kcache__unlock(lockfd);
        kcache__flight_end(kc, ctx, h, &prog_ops, p, e, rec); /* the table owns rec from here */
        rec = NULL;
out:
        kcache__cl_rec_free(rec);
        free(owned);
        if (err)
                *err = e;
        return p;
}

static cl_program compile_uncached(cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                                   const struct kcache__cl_input *in, cl_int *err)
{
        cl_int e;
        cl_program p;
        if (!strcmp(in->kind, "il")) {
                p = clCreateProgramWithIL(ctx, in->data, in->len, &e);
                for (cl_uint i = 0; p && e == CL_SUCCESS && i < in->nspec; i++)
                        e = clSetProgramSpecializationConstant(p, in->spec_ids[i], in->spec_sizes[i], in->spec_values[i]);
        } else {
                const char *src = in->data;
                p = clCreateProgramWithSource(ctx, 1, &src, &in->len, &e);
        }
        if (p && e == CL_SUCCESS)
                e = clBuildProgram(p, ndev, devs, in->options, NULL, NULL);
        if (p && e != CL_SUCCESS && e != CL_BUILD_PROGRAM_FAILURE) {
                clReleaseProgram(p);
                p = NULL;
        }
        if (err)
                *err = e;
        return p;
}

KCACHE__EXPORT cl_program kcache_cl_build_program(kcache *kc, cl_context ctx, cl_uint ndev,
                                                  const cl_device_id *devs, const char *src, size_t len,
                                                  const char *options, cl_int *err)
{
        if (!src || (ndev && !devs) || (!ndev && devs)) {
                if (err)
                        *err = CL_INVALID_VALUE;
                return NULL;
        }
        struct kcache__cl_input in = { "source", src, len ? len : strlen(src), options ? options : "", 0,
                                       NULL, NULL, NULL };
        return kc ? build(kc, ctx, ndev, devs, &in, err) : compile_uncached(ctx, ndev, devs, &in, err);
}

KCACHE__EXPORT cl_program kcache_cl_build_program_il(kcache *kc, cl_context ctx, cl_uint ndev,
                                                     const cl_device_id *devs, const void *il, size_t len,
                                                     cl_uint nspec, const cl_uint *spec_ids,
                                                     const size_t *spec_sizes, const void *const *spec_values,
                                                     const char *options, cl_int *err)
{
        if (!il || !len || (ndev && !devs) || (!ndev && devs) ||
            (nspec && (!spec_ids || !spec_sizes || !spec_values))) {
                if (err)
                        *err = CL_INVALID_VALUE;
                return NULL;
        }
        struct kcache__cl_input in = { "il", il, len, options ? options : "", nspec, spec_ids, spec_sizes,
                                       spec_values };
        return kc ? build(kc, ctx, ndev, devs, &in, err) : compile_uncached(ctx, ndev, devs, &in, err);
}

static void refresh_fn(kcache *kc, void *obj, void *data, void *arg)
{
        *(int *)arg += kcache__cl_refresh_one(kc, obj, data);
}

KCACHE__EXPORT int kcache_cl_refresh(kcache *kc)
{
        if (!kc)
                return -EINVAL;
        int n = 0;
        if (kc->cl)
                kcache__flight_each(kc, refresh_fn, &n);
        return n;
}

KCACHE__EXPORT void kcache_cl_forget_context(kcache *kc, cl_context ctx)
{
        if (kc && kc->cl && ctx)
                kcache__flight_forget(kc, ctx); /* each program is refreshed as it leaves */
}
