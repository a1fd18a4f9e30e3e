/* libkcache for Level Zero: zeModuleCreate with the native binary cached.
 *
 * Key (see kcache-entry.h; KCACHE_TRACE=1 prints it): api "level-zero"; kind "il"; the SPIR-V bytes;
 * the build flags; the specialization constants by id (their sizes read from the module's SPIR-V);
 * device name and uuid; driver version and uuid; the driver's API version.
 * Entries live in DIR/level-zero/<device slug>-<8 hex of the identity>/<key hash>.kce.
 *
 * Level Zero modules have no reference count, so each call returns a module of its own: concurrent
 * threads asking for the same key wait for one of them to compile, then each creates its module from
 * the stored native binary (cheap). Across processes, one compiles per node (see kcache_cl.h). */
#ifndef KCACHE_ZE_H
#define KCACHE_ZE_H

#include <level_zero/ze_api.h>

#include "kcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A drop-in for zeModuleCreate(hContext, hDevice, desc, phModule, phBuildLog).
 * desc->format ZE_MODULE_FORMAT_IL_SPIRV: the native binary is looked up and, on a hit, the module is
 * created from it; *phBuildLog (if asked for) is then NULL, as nothing was built. If the driver
 * rejects the binary, the entry is removed and the IL compiled. On a miss the IL is compiled with
 * the caller's arguments (build log included) and the module's native binary stored.
 * ZE_MODULE_FORMAT_NATIVE, kc NULL, or spec constants whose ids the SPIR-V does not declare: passed to
 * zeModuleCreate unchanged. Returns what zeModuleCreate returns; a cache problem never fails the
 * call (ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY aside). */
ze_result_t kcache_ze_module_create(kcache *kc, ze_context_handle_t hContext, ze_device_handle_t hDevice,
                                    const ze_module_desc_t *desc, ze_module_handle_t *phModule,
                                    ze_module_build_log_handle_t *phBuildLog);

#ifdef __cplusplus
}
#endif
#endif
