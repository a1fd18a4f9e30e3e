#!/bin/bash
# The GPU machine check of issue 3 (device tool; not in CI). From the repository root there:
#   bash tests/gpu/run-gpu-checks.sh [CARRY_DIR]
# CARRY_DIR holds bin/{kcachefs,kcache,clkernels} and lib/ with the .so files they need (built here and
# carried, the machine has no package registry). Mounts kcachefs with a limit that forces eviction, puts
# CUDA_CACHE_PATH, TRITON_CACHE_DIR, CuPy's and JAX's caches inside, runs the workload twice, then NVIDIA
# OpenCL builds (clkernels) twice, and prints the cache's statistics.
set -u
C=$(cd "${1:-.devcarry}" && pwd)
export LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-}
B=/tmp/kcgpu/backing M=/tmp/kcgpu/mnt
mkdir -p $B $M
"$C/bin/kcachefs" -o max_size=${KC_MAX:-24M} $B $M || exit 1
trap 'umount $M 2>/dev/null || umount -l $M' EXIT
eval "$("$C/bin/kcache" env $M cuda triton jax)"
export CUPY_CACHE_DIR=$M/cupy CUPY_COMPILE_WITH_PTX=1
status=0
for pass in 1 2; do
  python3 tests/gpu/gpu_workload.py $pass || status=1
done
# NVIDIA's OpenCL, through ocl-icd (carried) and NVIDIA's ICD, with its cache (the CUDA one) in the mount.
lib=$(ldconfig -p | awk '/libnvidia-opencl.so.1/ {print $NF; exit}')
[ -n "$lib" ] || lib=$(find / -name 'libnvidia-opencl.so.1' 2>/dev/null | head -1)
if [ -n "$lib" ]; then
  mkdir -p /tmp/kcgpu/icd && echo "$lib" > /tmp/kcgpu/icd/nvidia.icd
  for pass in 1 2; do
    OCL_ICD_VENDORS=/tmp/kcgpu/icd "$C/bin/clkernels" 0 20 > /tmp/kcgpu/ocl.$pass 2>&1 || status=1
    echo "pass $pass nvidia-opencl: $(tail -1 /tmp/kcgpu/ocl.$pass)"
  done
else
  echo "nvidia-opencl: libnvidia-opencl.so.1 not found"; status=1
fi
"$C/bin/kcache" stats $M
"$C/bin/kcache" verify $M
du -sh $M/* 2>/dev/null
exit $status
