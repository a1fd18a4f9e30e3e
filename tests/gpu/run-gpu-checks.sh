#!/bin/bash
# The GPU machine's check (device tool; not in CI). From the repository root there:
#   bash tests/gpu/run-gpu-checks.sh [CARRY_DIR]
# CARRY_DIR (scripts/gpu-carry makes it) holds bin/{kcachefs,kcache,clkernels} and lib/ with the .so files
# they need (the machine has no package registry). Mounts kcachefs with a limit that forces eviction
# (KC_MAX, default 8M: the caches below need several times that), puts CUDA_CACHE_PATH, TRITON_CACHE_DIR,
# JAX's, Inductor's and CuPy's caches inside (kcache env), runs the workload twice, then NVIDIA OpenCL
# builds (clkernels) twice; then checks that eviction ran, that the daemon's own count and the backing
# tree are within the limit and that the index equals the tree, and prints the cache's statistics.
set -u
C=$(cd "${1:-.devcarry}" && pwd)
export LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-}
B=/tmp/kcgpu/backing M=/tmp/kcgpu/mnt
mkdir -p $B $M
"$C/bin/kcachefs" -o max_size=${KC_MAX:-8M},stale_locks $B $M || exit 1
trap 'umount $M 2>/dev/null || umount -l $M' EXIT
eval "$("$C/bin/kcache" env $M cuda triton jax inductor cupy)"
export CUPY_COMPILE_WITH_PTX=1
status=0
# Each runtime cold, then warm (each pass its own process), one after the other: each one's entries fit
# the limit, all of them together do not, so every later runtime's stores evict the earlier ones'.
declare -A secs
for part in triton cuda-ptx-jit jax inductor; do
  for pass in cold warm; do
    line=$(python3 tests/gpu/gpu_workload.py $pass $part) || status=1
    echo "$line"
    secs[$part.$pass]=$(echo "$line" | awk '{print $4}')
  done
  python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else 1)" \
    "${secs[$part.cold]:-0}" "${secs[$part.warm]:-0}" || { echo "FAILED: $part: warm not faster than cold"; status=1; }
done
# Triton's entries were evicted by the runtimes after it: stored again, then served (no key dead for good).
for pass in again again-warm; do
  line=$(python3 tests/gpu/gpu_workload.py $pass triton) || status=1
  echo "$line"
  secs[triton.$pass]=$(echo "$line" | awk '{print $4}')
done
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else 1)" \
  "${secs[triton.again]:-0}" "${secs[triton.again-warm]:-0}" || { echo "FAILED: triton: not served again"; status=1; }
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
xa() { python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.kcachefs." + sys.argv[2]).decode())' $M "$1"; }
max=$(xa max_bytes) used=$(xa used_bytes) evicted=$(xa evicted_files)
tree=$(find $B -path $B/.kcachefs -prune -o -type f -printf '%b\n' | awk '{s += $1 * 512} END {print s + 0}')
echo "limit $max: the daemon counts $used, the backing tree's files hold $tree; $evicted files evicted"
[ "${evicted:-0}" -gt 0 ] || { echo "FAILED: the limit never forced an eviction"; status=1; }
[ "${used:-0}" -le "${max:-0}" ] || { echo "FAILED: the daemon counts more than the limit"; status=1; }
[ "$tree" -le "${max:-0}" ] || { echo "FAILED: the backing tree holds more than the limit"; status=1; }
"$C/bin/kcache" verify $M || status=1
du -sh $M/* 2>/dev/null
exit $status
