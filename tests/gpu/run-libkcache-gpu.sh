#!/bin/bash
# The GPU machine check of issue 4 (device tool; not in CI): libkcache's OpenCL path against NVIDIA's
# OpenCL driver with CUDA's own cache off (CUDA_CACHE_DISABLE=1), the cache in a kcachefs mount.
#   bash tests/gpu/run-libkcache-gpu.sh [CARRY_DIR]
# CARRY_DIR: bin/{kcachefs,kc-cl-demo} and lib/ (libkcache*.so.0, libxxhash.so.0, libfuse3, libsqlite3,
# libOpenCL.so.1). Prints one JSON line per run: uncached three times, then cold, warm, warm.
set -u
CARRY_DIR=${1:-.devcarry} WORK=/tmp/kclib
. tests/gpu/opencl-setup.sh
for i in 1 2 3; do timed uncached "$C/bin/kc-cl-demo" --source $SRC --no-cache; done
for t in cold warm warm; do timed $t "$C/bin/kc-cl-demo" --source $SRC --dir $M/kcache; done
KCACHE_TRACE=1 "$C/bin/kc-cl-demo" --source $SRC --dir $M/kcache 2>&1 | grep -E 'platform.name|device.name|driver.version|hit|loaded' | head
ls -la $M/kcache/opencl/*/
exit $status
