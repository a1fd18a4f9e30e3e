/* Internals of the OpenCL backend (prefix kcache__cl_), shared by cl.c and the OpenCL layer.
 * Every OpenCL call goes through a function table: the library fills it with the ICD loader's entry
 * points; the layer (layer/) with the next layer's dispatch table, so its own calls never loop back. */
#ifndef KCACHE_CL_INT_H
#define KCACHE_CL_INT_H

#include "kcache-int.h"
#include "kcache_cl.h"

#define KCACHE__CL_MAXDEV 64 /* devices in one build; more are built uncached */

struct kcache__clfns {
        cl_int (*GetPlatformInfo)(cl_platform_id, cl_platform_info, size_t, void *, size_t *);
        cl_int (*GetDeviceInfo)(cl_device_id, cl_device_info, size_t, void *, size_t *);
        cl_int (*GetContextInfo)(cl_context, cl_context_info, size_t, void *, size_t *);
        cl_program (*CreateProgramWithSource)(cl_context, cl_uint, const char **, const size_t *, cl_int *);
        cl_program (*CreateProgramWithBinary)(cl_context, cl_uint, const cl_device_id *, const size_t *,
                                              const unsigned char **, cl_int *, cl_int *);
        cl_program (*CreateProgramWithIL)(cl_context, const void *, size_t, cl_int *);
        cl_int (*SetProgramSpecializationConstant)(cl_program, cl_uint, size_t, const void *);
        cl_int (*BuildProgram)(cl_program, cl_uint, const cl_device_id *, const char *,
                               void(CL_CALLBACK *)(cl_program, void *), void *);
        cl_int (*GetProgramInfo)(cl_program, cl_program_info, size_t, void *, size_t *);
        cl_int (*GetProgramBuildInfo)(cl_program, cl_device_id, cl_program_build_info, size_t, void *, size_t *);
        cl_int (*RetainProgram)(cl_program);
        cl_int (*ReleaseProgram)(cl_program);
};

/* A device's identity, looked up once per handle. */
struct kcache__cl_dev {
        struct kcache__cl_dev *next;
        cl_device_id id;
        char *field[6];          /* platform name, platform version, vendor, name, version, driver */
        char reldir[96];         /* "opencl/<slug>-<8 hex>" */
        bool pocl;               /* the Portable Computing Language platform */
};

struct kcache__cl {
        const struct kcache__clfns *fns;
        struct kcache__cl_dev *devs;     /* kc->lock */
        int recapture;                   /* $KCACHE_CL_RECAPTURE: -1 auto (PoCL), 0 never, 1 always */
};

/* The backend's state of KC, created on first use with FNS (NULL: the ICD loader's). NULL: no memory. */
struct kcache__cl *kcache__cl_state(kcache *kc, const struct kcache__clfns *fns);

/* Stores grown binaries, drops the kept programs and the device identities (kc->cl_close). */
void kcache__cl_close(kcache *kc);
void kcache__cl_free_devices(struct kcache__cl *cl);

/* Looks DEV's identity up (cached). Returns 0 or a negative errno / -EIO if the driver fails. */
int kcache__cl_device(kcache *kc, cl_device_id dev, const struct kcache__cl_dev **ret);

/* What a program is built from. */
struct kcache__cl_input {
        const char *kind;        /* "source" or "il" */
        const void *data;
        size_t len;
        const char *options;
        cl_uint nspec;
        const cl_uint *spec_ids;
        const size_t *spec_sizes;
        const void *const *spec_values;
};

/* Builds the key of IN for DEV into *k (kcache__key_free it) and its entry path into relpath.
 * Returns 0 or -ENOMEM. */
int kcache__cl_key(kcache *kc, const struct kcache__cl_dev *dev, const struct kcache__cl_input *in,
                   struct kcache__key *k, char *relpath, size_t size);

/* Binaries of PROG for the devices DEVS, in that order (CL_PROGRAM_DEVICES may be ordered otherwise).
 * On success bins[i] is malloc()ed (NULL with sizes[i] 0 where the device has none). */
cl_int kcache__cl_binaries(kcache *kc, cl_program prog, cl_uint ndev, const cl_device_id *devs,
                           unsigned char **bins, size_t *sizes);

/* The entries of one build: one per device. */
struct kcache__cl_rec {
        bool recapture;              /* refresh grown binaries of this program */
        cl_uint ndev;
        cl_device_id ids[KCACHE__CL_MAXDEV]; /* the devices, in order: as the OpenCL calls take them */
        struct {
                const char *reldir;  /* the device's directory (its identity lives until close) */
                size_t stored;       /* bytes of the binary in the entry */
                struct kcache__key key;
                char relpath[160];
        } dev[];
};

/* cl-build.c. A record for building IN on DEVS; *ret_hash combines the devices' keys. -ENOMEM, -EIO. */
int kcache__cl_rec_new(kcache *kc, cl_uint ndev, const cl_device_id *devs, const struct kcache__cl_input *in,
                       struct kcache__cl_rec **ret, struct kcache__hash *ret_hash);
void kcache__cl_rec_free(struct kcache__cl_rec *rec);
/* Creates and builds a program from binaries; NULL on any failure, *e saying which. */
cl_program kcache__cl_from_binaries(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, unsigned char **bins,
                                    size_t *sizes, const char *options, cl_int *e);
/* Loads every device's entry and builds the program from them; NULL on a miss or a rejection (then the
 * entries are removed). */
cl_program kcache__cl_load(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, const char *options);
/* The entries, or else the per-key lock: returns the program built from the entries (a hit), perhaps
 * after waiting for another process that compiled it; or NULL (a miss) with *ret_lockfd the lock the
 * caller holds while it compiles and stores, released with kcache__unlock() (-1: none). Counts the hit
 * or the miss. */
cl_program kcache__cl_load_or_lock(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec, const char *options,
                                   int *ret_lockfd);
/* Compiles IN into a new program; returns it (also a failed one, *e set), or NULL. COUNTED: a compile
 * of the application's (counted and traced), not the twin build. */
cl_program kcache__cl_compile(kcache *kc, cl_context ctx, struct kcache__cl_rec *rec,
                              const struct kcache__cl_input *in, cl_int *e, bool counted);
/* Stores the binaries of the built program P (through a twin build with recapture); returns P. */
cl_program kcache__cl_store(kcache *kc, cl_context ctx, cl_program p, struct kcache__cl_rec *rec,
                            const struct kcache__cl_input *in);
/* Stores again the binaries of PROG that grew since they were stored; returns how many. */
int kcache__cl_refresh_one(kcache *kc, cl_program prog, struct kcache__cl_rec *rec);

/* The name of an OpenCL error code ("CL_INVALID_BINARY"). */
const char *kcache__cl_errstr(cl_int e);

#endif
