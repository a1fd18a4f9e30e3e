#!/bin/bash
# The GPU machine check of issue 8 (device tool; not in CI): a plain OpenCL program (cl-plain, not linked
# with libkcache) on NVIDIA's OpenCL with CUDA's own cache off, through the kcache layer, the cache in a
# kcachefs mount. CARRY_DIR: bin/{kcachefs,cl-plain} and lib/ (libkcache-layer.so, libfuse3, libsqlite3,
# libxxhash, libOpenCL.so.1). Prints one line per run: without the layer twice, then cold, warm, warm.
set -u
CARRY_DIR=${1:-.devcarry} WORK=/tmp/kclayer
. tests/gpu/opencl-setup.sh
export KCACHE_DIR=$M/kcache
for i in 1 2; do timed plain "$C/bin/cl-plain" --source $SRC; done
for t in layer-cold layer-warm layer-warm; do
  timed $t env OPENCL_LAYERS=$C/lib/libkcache-layer.so "$C/bin/cl-plain" --source $SRC
done
KCACHE_TRACE=1 OPENCL_LAYERS=$C/lib/libkcache-layer.so "$C/bin/cl-plain" --source $SRC 2>&1 >/dev/null | grep -E 'hit|loaded|close' | head -4
exit $status
