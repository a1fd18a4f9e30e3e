#!/bin/bash
# The GPU machine check of issue 8 (device tool; not in CI): a plain OpenCL program (cl-plain, not linked
# with libkcache) on NVIDIA's OpenCL with CUDA's own cache off, through the kcache layer, the cache in a
# kcachefs mount. CARRY_DIR: bin/{kcachefs,cl-plain} and lib/ (libkcache-layer.so, libfuse3, libsqlite3,
# libxxhash, libOpenCL.so.1). Prints one line per run: without the layer twice, then cold, warm, warm.
set -u
C=$(cd "${1:-.devcarry}" && pwd)
export LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-}
B=/tmp/kclayer/backing M=/tmp/kclayer/mnt
rm -rf /tmp/kclayer; mkdir -p $B $M /tmp/kclayer/icd
"$C/bin/kcachefs" -o max_size=256M $B $M || exit 1
trap 'umount $M 2>/dev/null || umount -l $M' EXIT
lib=$(ldconfig -p | awk '/libnvidia-opencl.so.1/ {print $NF; exit}')
[ -n "$lib" ] || { echo "libnvidia-opencl.so.1 not found"; exit 1; }
echo "$lib" > /tmp/kclayer/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/kclayer/icd CUDA_CACHE_DISABLE=1 KCACHE_DIR=$M/kcache
SRC=tests/helpers/kernels/suite.cl
status=0
run() {
  local tag=$1 t0 t1 out; shift
  t0=$(date +%s.%N)
  out=$(env "$@" "$C/bin/cl-plain" --source $SRC) || status=1
  t1=$(date +%s.%N)
  echo "$tag wall_s=$(awk "BEGIN {print $t1 - $t0}") $(echo "$out" | sed 's/"kernel_names": "[^"]*", //')"
}
run plain X=1
run plain X=1
run layer-cold OPENCL_LAYERS=$C/lib/libkcache-layer.so
run layer-warm OPENCL_LAYERS=$C/lib/libkcache-layer.so
run layer-warm OPENCL_LAYERS=$C/lib/libkcache-layer.so
KCACHE_TRACE=1 OPENCL_LAYERS=$C/lib/libkcache-layer.so "$C/bin/cl-plain" --source $SRC 2>&1 >/dev/null | grep -E 'hit|loaded|close' | head -4
exit $status
