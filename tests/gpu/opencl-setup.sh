# Sourced by the OpenCL checks on the GPU machine (run-libkcache-gpu.sh, run-layer-gpu.sh) with
# CARRY_DIR (default .devcarry) and WORK (a scratch directory) set: puts the carried libraries first,
# mounts kcachefs at $M (backing $B, 256 MiB, unmounted at exit), points ocl-icd at NVIDIA's OpenCL
# alone and turns CUDA's own kernel cache off. Defines timed TAG CMD...: runs CMD and prints TAG, its
# wall time and its output (kernel names left out); a failure sets status=1.
C=$(cd "${CARRY_DIR:-.devcarry}" && pwd)
export LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-}
B=$WORK/backing M=$WORK/mnt
rm -rf "$WORK"; mkdir -p "$B" "$M" "$WORK/icd"
"$C/bin/kcachefs" -o max_size=256M "$B" "$M" || exit 1
trap 'umount $M 2>/dev/null || umount -l $M' EXIT
lib=$(ldconfig -p | awk '/libnvidia-opencl.so.1/ {print $NF; exit}')
[ -n "$lib" ] || { echo "libnvidia-opencl.so.1 not found"; exit 1; }
echo "$lib" > "$WORK/icd/nvidia.icd"
export OCL_ICD_VENDORS=$WORK/icd CUDA_CACHE_DISABLE=1
SRC=tests/helpers/kernels/suite.cl
status=0
timed() {
  local tag=$1 t0 t1 out; shift
  t0=$(date +%s.%N)
  out=$("$@") || status=1
  t1=$(date +%s.%N)
  echo "$tag wall_s=$(awk "BEGIN {print $t1 - $t0}") $(echo "$out" | sed 's/"kernel_names": "[^"]*", //')"
}
