/* The building blocks of an OpenCL build through the cache, shared by kcache_cl_build_program() (cl.c)
 * and the OpenCL layer (layer/): a record of the entries of one build (one per device), loading a
 * program from them, compiling, storing (with PoCL's twin build), and refreshing a grown binary. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cl-int.h"

#define CL_REC_SIZE(n) (sizeof(struct kcache__cl_rec) + (n) * sizeof(((struct kcache__cl_rec *)0)->dev[0]))

void kcache__cl_rec_free(struct kcache__cl_rec *rec)
{
        if (!rec)
                return;
        for (cl_uint i = 0; i < rec->ndev; i++)
                kcache__key_free(&rec->dev[i].key);
        free(rec);
}

/* Creates and builds a program from binaries. NULL on any failure, *e saying which. */
cl_program kcache__cl_from_binaries(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, unsigned char **bins,
                                size_t *sizes, const char *options, cl_int *e)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        cl_int status[KCACHE__CL_MAXDEV];
        cl_program p = f->CreateProgramWithBinary(ctx, rec->ndev, rec->ids, sizes, (const unsigned char **)bins,
                                                  status, e);
        for (cl_uint i = 0; p && *e == CL_SUCCESS && i < rec->ndev; i++)
                if (status[i] != CL_SUCCESS)
                        *e = status[i];
        if (p && *e == CL_SUCCESS)
                *e = f->BuildProgram(p, rec->ndev, rec->ids, options, NULL, NULL);
        if (*e != CL_SUCCESS && p) {
                f->ReleaseProgram(p);
                p = NULL;
        }
        return p;
}

/* Loads every device's entry and builds the program from them; NULL on a miss or a rejection. */
cl_program kcache__cl_load(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, const char *options)
{
        cl_uint n = rec->ndev;
        unsigned char *bins[KCACHE__CL_MAXDEV];
        size_t sizes[KCACHE__CL_MAXDEV];
        cl_uint got = 0;
        for (; got < n; got++) {
                void *data;
                if (kcache__entry_load(kc, rec->dev[got].relpath, &rec->dev[got].key, &data, &sizes[got]) < 0)
                        break;
                bins[got] = data;
        }
        cl_program p = NULL;
        if (got == n) {
                double t0 = kcache__now_ms();
                cl_int e;
                p = kcache__cl_from_binaries(kc, ctx, rec, bins, sizes, options, &e);
                if (p) {
                        rec->recapture = false; /* a program made from a binary reports that binary */
                        for (cl_uint i = 0; i < n; i++)
                                rec->dev[i].stored = sizes[i];
                        kcache__trace(kc, "loaded program from %u entr%s in %.1f ms", n, n == 1 ? "y" : "ies",
                                      kcache__now_ms() - t0);
                } else {
                        kcache__trace(kc, "reject: the driver refused the cached binary (%s); removing the "
                                      "entries and compiling from source", kcache__cl_errstr(e));
                        atomic_fetch_add(&kc->st.rejects, 1);
                        for (cl_uint i = 0; i < n; i++)
                                kcache__entry_remove(kc, rec->dev[i].relpath);
                }
        }
        for (cl_uint i = 0; i < got; i++)
                free(bins[i]);
        return p;
}

cl_program kcache__cl_load_or_lock(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, const char *options,
                                   int *ret_lockfd)
{
        *ret_lockfd = -1;
        uint64_t rejects = atomic_load(&kc->st.rejects);
        cl_program p = kcache__cl_load(kc, ctx, rec, options);
        if (!p && !kc->disabled) {
                bool waited = false;
                *ret_lockfd = kcache__lock(kc, rec->dev[0].reldir, &rec->dev[0].key, &waited);
                /* Looked for again if another process compiled it while we waited, and also after a plain
                 * miss (not a refused entry, which would be refused again): on kcachefs with a shared tier
                 * the first look may have stopped at a directory this node did not have yet (the lock made
                 * it), so only this one asks for the entry itself, and waits there for another node's
                 * compile (kcachefs(8), herd_wait). */
                if (waited || atomic_load(&kc->st.rejects) == rejects)
                        p = kcache__cl_load(kc, ctx, rec, options);
        }
        atomic_fetch_add(p ? &kc->st.hits : &kc->st.misses, 1);
        return p;
}

static void trace_build_log(kcache *kc, cl_program p, const struct kcache__cl_rec *rec)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        for (cl_uint i = 0; i < rec->ndev; i++) {
                size_t n = 0;
                if (f->GetProgramBuildInfo(p, rec->ids[i], CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS || !n)
                        continue;
                char *log = calloc(1, n + 1);
                if (log && f->GetProgramBuildInfo(p, rec->ids[i], CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS)
                        kcache__trace(kc, "build log (device %u): %.600s", i, log);
                free(log);
        }
}

/* Compiles from the input; returns the program (also a failed one, with *e set), or NULL. */
cl_program kcache__cl_compile(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, const struct kcache__cl_input *in,
                          cl_int *e, bool counted)
{
        const struct kcache__clfns *f = ((struct kcache__cl *)kc->cl)->fns;
        double t0 = kcache__now_ms();
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
        *e = f->BuildProgram(p, rec->ndev, rec->ids, in->options, NULL, NULL);
        if (!counted)
                return p;
        atomic_fetch_add(&kc->st.compiles, 1);
        kcache__trace(kc, "compile: %s in %.1f ms", kcache__cl_errstr(*e), kcache__now_ms() - t0);
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
 * unqueried until kcache__cl_refresh_one() stores its fuller binary. */
cl_program kcache__cl_store(kcache *kc, cl_context ctx, cl_program p, struct kcache__cl_rec *rec,
                        const struct kcache__cl_input *in)
{
        cl_uint n = rec->ndev;
        unsigned char *bins[KCACHE__CL_MAXDEV];
        size_t sizes[KCACHE__CL_MAXDEV];
        cl_program src = p;
        if (rec->recapture) {
                cl_int e;
                double t0 = kcache__now_ms();
                src = kcache__cl_compile(kc, ctx, rec, in, &e, false);
                if (!src || e != CL_SUCCESS) {
                        kcache__trace(kc, "recapture: the twin build failed (%s); storing the program's own binary",
                                      kcache__cl_errstr(e));
                        if (src)
                                ((struct kcache__cl *)kc->cl)->fns->ReleaseProgram(src);
                        src = p;
                        rec->recapture = false;
                } else {
                        kcache__trace(kc, "recapture: twin built in %.1f ms", kcache__now_ms() - t0);
                }
        }
        cl_int e = kcache__cl_binaries(kc, src, n, rec->ids, bins, sizes);
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
int kcache__cl_refresh_one(kcache *kc, cl_program prog, struct kcache__cl_rec *rec)
{
        if (!rec->recapture || kc->disabled)
                return 0;
        cl_uint n = rec->ndev;
        unsigned char *bins[KCACHE__CL_MAXDEV];
        size_t sizes[KCACHE__CL_MAXDEV];
        if (kcache__cl_binaries(kc, prog, n, rec->ids, bins, sizes) != CL_SUCCESS)
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

int kcache__cl_rec_new(kcache *kc, cl_uint ndev, const cl_device_id *devs, const struct kcache__cl_input *in,
                       struct kcache__cl_rec **ret, struct kcache__hash *ret_hash)
{
        struct kcache__cl *cl = kc->cl;
        struct kcache__cl_rec *rec = calloc(1, CL_REC_SIZE(ndev));
        XXH3_state_t *hs = XXH3_createState();
        if (!rec || !hs) {
                free(rec);
                XXH3_freeState(hs);
                return -ENOMEM;
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
                        kcache__cl_rec_free(rec);
                        return r;
                }
                rec->ndev = i + 1;
                rec->ids[i] = devs[i];
                rec->dev[i].reldir = d->reldir;
                pocl &= d->pocl;
                XXH3_128bits_update(hs, &rec->dev[i].key.hash, sizeof(rec->dev[i].key.hash));
        }
        XXH128_hash_t h128 = XXH3_128bits_digest(hs);
        XXH3_freeState(hs);
        /* Without PoCL's kernel cache the twin build would cost a whole compile: no recapture then. */
        const char *pkc = getenv("POCL_KERNEL_CACHE");
        rec->recapture = cl->recapture < 0 ? pocl && !(pkc && !strcmp(pkc, "0")) : cl->recapture;
        *ret = rec;
        *ret_hash = (struct kcache__hash){ h128.high64, h128.low64 };
        return 0;
}
