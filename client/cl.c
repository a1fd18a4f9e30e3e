/* kcache_cl_build_program(): the OpenCL build flow (memory, single flight, entries, lock, compile,
 * store, recapture) and the refresh of grown binaries. Keys and device identity: cl-key.c.
 *
 * The record kept with each program in the flight table says where its entries are and how large
 * the stored binaries were, so a refresh stores again only what has grown. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "cl-int.h"

#define CL_REC_SIZE(n) (sizeof(struct cl_rec) + (n) * sizeof(((struct cl_rec *)0)->dev[0]))

struct cl_rec {
        bool recapture;              /* refresh grown binaries of this program */
        cl_uint ndev;
        struct {
                cl_device_id id;
                const char *reldir;  /* the device's directory (its identity lives until close) */
                size_t stored;       /* bytes of the binary in the entry */
                struct kcache__key key;
                char relpath[160];
        } dev[];
};

static double now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void prog_retain(kcache *kc, void *p)
{
        ((struct kcache__cl *)kc->cl)->fns->RetainProgram(p);
}

static void prog_release(kcache *kc, void *p)
{
        ((struct kcache__cl *)kc->cl)->fns->ReleaseProgram(p);
}

static int refresh_one(kcache *kc, cl_program prog, struct cl_rec *rec);

static void prog_leave(kcache *kc, void *p, void *data)
{
        if (data)
                refresh_one(kc, p, data);
}

static const struct kcache__obj_ops prog_ops = { prog_retain, prog_release, prog_leave };

static void rec_free(struct cl_rec *rec)
{
        if (!rec)
                return;
        for (cl_uint i = 0; i < rec->ndev; i++)
                kcache__key_free(&rec->dev[i].key);
        free(rec);
}

/* Creates and builds a program from binaries. NULL on any failure, *e saying which. */
static cl_program from_binaries(kcache *kc, cl_context ctx, struct cl_rec *rec, unsigned char **bins,
                                size_t *sizes, const char *options, cl_int *e)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        cl_device_id ids[KCACHE__CL_MAXDEV] = { 0 };
        cl_int status[KCACHE__CL_MAXDEV];
        for (cl_uint i = 0; i < rec->ndev; i++)
                ids[i] = rec->dev[i].id;
        cl_program p = f->CreateProgramWithBinary(ctx, rec->ndev, ids, sizes, (const unsigned char **)bins,
                                                  status, e);
        for (cl_uint i = 0; p && *e == CL_SUCCESS && i < rec->ndev; i++)
                if (status[i] != CL_SUCCESS)
                        *e = status[i];
        if (p && *e == CL_SUCCESS)
                *e = f->BuildProgram(p, rec->ndev, ids, options, NULL, NULL);
        if (*e != CL_SUCCESS && p) {
                f->ReleaseProgram(p);
                p = NULL;
        }
        return p;
}

/* Loads every device's entry and builds the program from them; NULL on a miss or a rejection. */
static cl_program load(kcache *kc, cl_context ctx, struct cl_rec *rec, const char *options)
{
        cl_uint n = rec->ndev;
        uint8_t *files[KCACHE__CL_MAXDEV];
        unsigned char *bins[KCACHE__CL_MAXDEV];
        size_t sizes[KCACHE__CL_MAXDEV];
        struct kcache__entry_view v;
        cl_uint got = 0;
        for (; got < n; got++) {
                if (kcache__entry_load(kc, rec->dev[got].relpath, &rec->dev[got].key, &files[got], &v) < 0)
                        break;
                bins[got] = (unsigned char *)v.payload;
                sizes[got] = v.payload_len;
        }
        cl_program p = NULL;
        if (got == n) {
                double t0 = now_ms();
                cl_int e;
                p = from_binaries(kc, ctx, rec, bins, sizes, options, &e);
                if (p) {
                        rec->recapture = false; /* a program made from a binary reports that binary */
                        for (cl_uint i = 0; i < n; i++)
                                rec->dev[i].stored = sizes[i];
                        kcache__trace(kc, "loaded program from %u entr%s in %.1f ms", n, n == 1 ? "y" : "ies",
                                      now_ms() - t0);
                } else {
                        kcache__trace(kc, "reject: the driver refused the cached binary (%s); removing the "
                                      "entries and compiling from source", kcache__cl_errstr(e));
                        atomic_fetch_add(&kc->st.rejects, 1);
                        for (cl_uint i = 0; i < n; i++)
                                kcache__entry_remove(kc, rec->dev[i].relpath);
                }
        }
        for (cl_uint i = 0; i < got; i++)
                free(files[i]);
        return p;
}

static void trace_build_log(kcache *kc, cl_program p, const struct cl_rec *rec)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        for (cl_uint i = 0; i < rec->ndev; i++) {
                size_t n = 0;
                if (f->GetProgramBuildInfo(p, rec->dev[i].id, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS || !n)
                        continue;
                char *log = calloc(1, n + 1);
                if (log && f->GetProgramBuildInfo(p, rec->dev[i].id, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS)
                        kcache__trace(kc, "build log (device %u): %.600s", i, log);
                free(log);
        }
}

/* Compiles from the input; returns the program (also a failed one, with *e set), or NULL. */
static cl_program compile(kcache *kc, cl_context ctx, struct cl_rec *rec, const struct kcache__cl_input *in,
                          cl_int *e, bool counted)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        double t0 = now_ms();
        cl_program p;
        if (!strcmp(in->kind, "il")) {
                p = f->CreateProgramWithIL(ctx, in->data, in->len, e);
                for (cl_uint i = 0; p && *e == CL_SUCCESS && i < in->nspec; i++)
                        *e = f->SetProgramSpecializationConstant(p, in->spec_ids[i], in->spec_sizes[i],
                                                                 in->spec_values[i]);
        } else {
                const char *src = in->data;
                p = f->CreateProgramWithSource(ctx, 1, &src, &in->len, e);
        }
        if (!p || *e != CL_SUCCESS) {
                if (p)
                        f->ReleaseProgram(p);
                kcache__trace(kc, "compile: creating the program failed: %s", kcache__cl_errstr(*e));
                return NULL;
        }
        cl_device_id ids[KCACHE__CL_MAXDEV] = { 0 };
        for (cl_uint i = 0; i < rec->ndev; i++)
                ids[i] = rec->dev[i].id;
        *e = f->BuildProgram(p, rec->ndev, ids, in->options, NULL, NULL);
        if (!counted)
                return p;
        atomic_fetch_add(&kc->st.compiles, 1);
        kcache__trace(kc, "compile: %s in %.1f ms", kcache__cl_errstr(*e), now_ms() - t0);
        if (*e != CL_SUCCESS && KCACHE__TRACING(kc))
                trace_build_log(kc, p, rec);
        if (*e != CL_SUCCESS && *e != CL_BUILD_PROGRAM_FAILURE) {
                f->ReleaseProgram(p);
                return NULL;
        }
        return p;
}

/* Stores the binaries of P, the program handed to the application.
 *
 * PoCL serializes a program's binary once, at the first query, and a program created from a binary
 * reports that binary forever. Machine code compiled at a kernel's first launch is therefore only
 * captured by querying, after the launches, a program built from source that nobody queried before.
 * With recapture, the binary stored now comes from a twin program D built from the same input (a hit
 * in PoCL's own kernel cache, which the first build just filled: tens of milliseconds), and P stays
 * unqueried until refresh_one() stores its fuller binary. */
static cl_program store(kcache *kc, cl_context ctx, cl_program p, struct cl_rec *rec,
                        const struct kcache__cl_input *in)
{
        cl_uint n = rec->ndev;
        unsigned char *bins[KCACHE__CL_MAXDEV];
        size_t sizes[KCACHE__CL_MAXDEV];
        cl_device_id ids[KCACHE__CL_MAXDEV] = { 0 };
        for (cl_uint i = 0; i < n; i++)
                ids[i] = rec->dev[i].id;
        cl_program src = p;
        if (rec->recapture) {
                cl_int e;
                double t0 = now_ms();
                src = compile(kc, ctx, rec, in, &e, false);
                if (!src || e != CL_SUCCESS) {
                        kcache__trace(kc, "recapture: the twin build failed (%s); storing the program's own binary",
                                      kcache__cl_errstr(e));
                        if (src)
                                ((struct kcache__cl *)kc->cl)->fns->ReleaseProgram(src);
                        src = p;
                        rec->recapture = false;
                } else {
                        kcache__trace(kc, "recapture: twin built in %.1f ms", now_ms() - t0);
                }
        }
        cl_int e = kcache__cl_binaries(kc, src, n, ids, bins, sizes);
        if (src != p)
                ((struct kcache__cl *)kc->cl)->fns->ReleaseProgram(src);
        if (e != CL_SUCCESS) {
                kcache__trace(kc, "store: the driver gave no binary (%s)", kcache__cl_errstr(e));
                rec->recapture = false;
                return p;
        }
        for (cl_uint i = 0; i < n; i++) {
                if (bins[i] &&
                    kcache__entry_store(kc, rec->dev[i].relpath, &rec->dev[i].key, bins[i], sizes[i]) == 0)
                        rec->dev[i].stored = sizes[i];
                free(bins[i]);
        }
        return p;
}

/* Stores again the binaries of PROG that have grown since they were stored. Returns how many. */
static int refresh_one(kcache *kc, cl_program prog, struct cl_rec *rec)
{
        if (!rec->recapture || kc->disabled)
                return 0;
        cl_uint n = rec->ndev;
        unsigned char *bins[KCACHE__CL_MAXDEV];
        size_t sizes[KCACHE__CL_MAXDEV];
        cl_device_id ids[KCACHE__CL_MAXDEV] = { 0 };
        for (cl_uint i = 0; i < n; i++)
                ids[i] = rec->dev[i].id;
        if (kcache__cl_binaries(kc, prog, n, ids, bins, sizes) != CL_SUCCESS)
                return 0;
        int stored = 0;
        for (cl_uint i = 0; i < n; i++) {
                if (bins[i] && sizes[i] > rec->dev[i].stored) {
                        kcache__trace(kc, "refresh %s: the binary grew from %zu to %zu bytes", rec->dev[i].relpath,
                                      rec->dev[i].stored, sizes[i]);
                        if (!kcache__entry_store(kc, rec->dev[i].relpath, &rec->dev[i].key, bins[i], sizes[i])) {
                                rec->dev[i].stored = sizes[i];
                                atomic_fetch_add(&kc->st.refreshes, 1);
                                stored++;
                        }
                }
                free(bins[i]);
        }
        rec->recapture = false; /* the driver serializes once: later queries give the same bytes */
        return stored;
}

static cl_program compile_uncached(cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                                   const struct kcache__cl_input *in, cl_int *err);

static cl_program build(kcache *kc, cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                        const struct kcache__cl_input *in, cl_int *err)
{
        cl_int e = CL_SUCCESS;
        cl_device_id *owned = NULL;
        struct cl_rec *rec = NULL;
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
        rec = calloc(1, CL_REC_SIZE(ndev));
        if (!rec) {
                e = CL_OUT_OF_HOST_MEMORY;
                goto out;
        }
        XXH3_state_t *hs = XXH3_createState();
        if (!hs) {
                e = CL_OUT_OF_HOST_MEMORY;
                goto out;
        }
        XXH3_128bits_reset(hs);
        bool pocl = true;
        for (cl_uint i = 0; i < ndev; i++) {
                const struct kcache__cl_dev *d;
                int r = kcache__cl_device(kc, devs[i], &d);
                if (r == 0)
                        r = kcache__cl_key(kc, d, in, &rec->dev[i].key, rec->dev[i].relpath,
                                           sizeof(rec->dev[i].relpath));
                if (r < 0) {
                        XXH3_freeState(hs);
                        e = r == -ENOMEM ? CL_OUT_OF_HOST_MEMORY : CL_INVALID_DEVICE;
                        goto out;
                }
                rec->ndev = i + 1;
                rec->dev[i].id = devs[i];
                rec->dev[i].reldir = d->reldir;
                pocl &= d->pocl;
                XXH3_128bits_update(hs, &rec->dev[i].key.hash, sizeof(rec->dev[i].key.hash));
        }
        XXH128_hash_t h128 = XXH3_128bits_digest(hs);
        XXH3_freeState(hs);
        struct kcache__hash h = { h128.high64, h128.low64 };
        /* Without PoCL's kernel cache the twin build would cost a whole compile: no recapture then. */
        const char *pkc = getenv("POCL_KERNEL_CACHE");
        rec->recapture = cl->recapture < 0 ? pocl && !(pkc && !strcmp(pkc, "0")) : cl->recapture;

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
        p = load(kc, ctx, rec, in->options);
        if (!p) {
                bool waited = false;
                int lockfd = kc->disabled ? -1 : kcache__lock(kc, rec->dev[0].reldir, &rec->dev[0].key, &waited);
                if (waited) /* another process compiled it while we waited */
                        p = load(kc, ctx, rec, in->options);
                if (!p) {
                        atomic_fetch_add(&kc->st.misses, 1);
                        p = compile(kc, ctx, rec, in, &e, true);
                        if (p && e == CL_SUCCESS)
                                p = store(kc, ctx, p, rec, in);
                } else {
                        atomic_fetch_add(&kc->st.hits, 1);
                }
                kcache__unlock(lockfd);
        } else {
                atomic_fetch_add(&kc->st.hits, 1);
        }
        kcache__flight_end(kc, ctx, h, p, e, rec); /* the table owns rec from here */
        rec = NULL;
out:
        rec_free(rec);
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
        *(int *)arg += refresh_one(kc, obj, data);
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
