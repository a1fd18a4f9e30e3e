#!/bin/bash
# The GPU machine check of issue 4 (device tool; not in CI): libkcache's OpenCL path against NVIDIA's
# OpenCL driver with CUDA's own cache off (CUDA_CACHE_DISABLE=1), the cache in a kcachefs mount.
#   bash tests/gpu/run-libkcache-gpu.sh [CARRY_DIR]
# CARRY_DIR: bin/{kcachefs,kc-cl-demo} and lib/ (libkcache*.so.0, libxxhash.so.0, libfuse3, libsqlite3,
# libOpenCL.so.1). Prints one JSON line per run: uncached twice, then cold, warm, warm.
set -u
C=$(cd "${1:-.devcarry}" && pwd)
export LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-}
B=/tmp/kclib/backing M=/tmp/kclib/mnt
rm -rf /tmp/kclib; mkdir -p $B $M /tmp/kclib/icd
"$C/bin/kcachefs" -o max_size=256M $B $M || exit 1
trap 'umount $M 2>/dev/null || umount -l $M' EXIT
lib=$(ldconfig -p | awk '/libnvidia-opencl.so.1/ {print $NF; exit}')
[ -n "$lib" ] || { echo "libnvidia-opencl.so.1 not found"; exit 1; }
echo "$lib" > /tmp/kclib/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/kclib/icd CUDA_CACHE_DISABLE=1
SRC=tests/helpers/kernels/suite.cl
status=0
run() {
  local t0 t1 out
  t0=$(date +%s.%N)
  out=$("$C/bin/kc-cl-demo" --source $SRC "$@") || status=1
  t1=$(date +%s.%N)
  echo "$1 wall_s=$(awk "BEGIN {print $t1 - $t0}") $out"
}
run --no-cache
run --no-cache
run --no-cache
run --dir $M/kcache
run --dir $M/kcache
run --dir $M/kcache
KCACHE_TRACE=1 "$C/bin/kc-cl-demo" --source $SRC --dir $M/kcache 2>&1 | grep -E 'platform.name|device.name|driver.version|hit|loaded' | head
ls -la $M/kcache/opencl/*/
exit $status
