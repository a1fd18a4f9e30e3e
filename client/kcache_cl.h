/* libkcache for OpenCL: build a program from source or IL, from the cache when possible.
 *
 * Key of each device's entry (see kcache-entry.h for the encoding; KCACHE_TRACE=1 prints it):
 *   api "opencl"; kind "source" or "il"; the source or IL bytes; the build options as given; the
 *   environment variables the compilers read (IGC_*, CL_CONFIG_*, AMD_OCL_BUILD_OPTIONS[_APPEND],
 *   AMD_OCL_LINK_OPTIONS[_APPEND], POCL_EXTRA_BUILD_FLAGS, POCL_WORK_GROUP_METHOD, and any listed in
 *   $KCACHE_KEY_ENV, comma-separated); specialization constants (IL, by id); platform name and version,
 *   device vendor, name and version, driver version.
 * Entries live in DIR/opencl/<device slug>-<8 hex of the identity>/<key hash>.kce, one per device.
 *
 * What happens:
 *   1. A program built earlier by this handle for the same context and key is handed out again
 *      (retained) without touching the disk. At most $KCACHE_MEM_PROGRAMS (256) are kept.
 *   2. Threads asking for the same key at once: one builds, the others wait and get the same program,
 *      or the same error.
 *   3. Otherwise the entries are loaded and verified, and the program is created from them and built.
 *      If the driver rejects them (CL_INVALID_BINARY, a failed build), they are removed and the program
 *      is compiled from source; the trace says so.
 *   4. On a miss, one process of the node compiles while the others wait for it (a lock per key, at
 *      most $KCACHE_LOCK_TIMEOUT_MS), then stores one entry per device.
 *   5. PoCL compiles machine code per local size at a kernel's first launch, and serializes a program's
 *      binary only once. So on PoCL (or with KCACHE_CL_RECAPTURE=1) the program handed out is recreated
 *      from the stored binary, and kcache_close() or kcache_cl_refresh() stores its binary again if it
 *      has grown since: the next process then starts with the kernels' machine code.
 *
 * A program created from a binary is what the application gets on both paths (except on a miss on
 * drivers other than PoCL): CL_PROGRAM_SOURCE and CL_PROGRAM_IL may be empty.
 */
#ifndef KCACHE_CL_H
#define KCACHE_CL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>

#include "kcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns a built program for the NDEV devices DEVS of CTX (ndev 0, devs NULL: all devices of the
 * context) from the OpenCL C source SRC of LEN bytes (0: strlen), built with OPTIONS (NULL: none).
 * The caller owns one reference (clReleaseProgram).
 * *err (may be NULL) is set to CL_SUCCESS, or to the error of the driver call that failed. On
 * CL_BUILD_PROGRAM_FAILURE the failed program is still returned, so its build log can be read with
 * clGetProgramBuildInfo; release it. Other errors return NULL. kc NULL: compiles without a cache.
 * Errors besides the driver's: CL_INVALID_VALUE (src NULL, or ndev and devs disagree),
 * CL_OUT_OF_HOST_MEMORY. Cache problems never fail the call: it compiles instead. */
cl_program kcache_cl_build_program(kcache *kc, cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                                   const char *src, size_t len, const char *options, cl_int *err);

/* The same for an intermediate language (SPIR-V) module of LEN bytes, with NSPEC specialization
 * constants (ids, sizes in bytes, pointers to values) set before the build; part of the key.
 * Needs an OpenCL 2.1 platform (clCreateProgramWithIL); CL_INVALID_OPERATION where the device takes
 * no IL. */
cl_program kcache_cl_build_program_il(kcache *kc, cl_context ctx, cl_uint ndev, const cl_device_id *devs,
                                      const void *il, size_t len, cl_uint nspec, const cl_uint *spec_ids,
                                      const size_t *spec_sizes, const void *const *spec_values,
                                      const char *options, cl_int *err);

/* Stores again the entries of programs whose binary has grown (see 5. above); kcache_close() does it
 * too. Returns the number of entries stored, or a negative errno (-EINVAL kc NULL). Call it after a
 * program's first launches in long-running processes that keep the handle open. */
int kcache_cl_refresh(kcache *kc);

/* Drops the programs kept in memory for CTX (after refreshing them), so that releasing the context
 * frees it. Call before releasing a context that built programs through kc. */
void kcache_cl_forget_context(kcache *kc, cl_context ctx);

#ifdef __cplusplus
}
#endif
#endif
