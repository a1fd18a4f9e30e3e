#!/bin/bash
# bench/run on the GPU machine's host (16 cores; device tool, not in CI). From the repository root there:
#   bash tests/gpu/run-bench-host.sh [CARRY_DIR] [RUNS] [TARGETS] [bench/run's other arguments...]
# With bin/kcachefs-baseline in CARRY_DIR (KC_CARRY_BASELINE=BINARY scripts/gpu-carry), an argument
# --baseline CARRY_DIR/bin/kcachefs-baseline measures it in the same run.
# CARRY_DIR (scripts/gpu-carry makes it) gives bin/{kcachefs,kbench} with lib/, and fuse/{bin,lib}:
# Debian's fusermount3, mergerfs, bindfs and passthrough_hp with their libraries (that machine has none).
# bench/run wants a real disk, not tmpfs: the data lives on a fresh ext4 loop image, sparse, in /var/tmp
# (16 GiB: mergerfs refuses to create below its minfreespace, 4 GiB by default). bench/run's own build step
# is answered by a no-op ninja, since the carried binaries are the build. The table goes to
# $OUT/RESULTS-host.md (the device tool's folder that comes back) and to stdout, with the CPU, core count and
# kernel that bench/run prints.
set -eu
C=$(cd "${1:-.devcarry}" && pwd)
RUNS=${2:-5}
TARGETS=${3:-raw,kcachefs,kcachefs-nolog,bindfs,mergerfs}
shift $(($# < 3 ? $# : 3))
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=/var/tmp/kcbench-host
OUTDIR=${OUT:-/tmp}
mkdir -p "$ROOT/build" "$W/shim"
cp "$C/bin/kcachefs" "$C/bin/kbench" "$ROOT/build/"
printf '#!/bin/sh\nexit 0\n' >"$W/shim/ninja"
chmod +x "$W/shim/ninja"
export PATH="$W/shim:$C/fuse/bin:$PATH"
export LD_LIBRARY_PATH="$C/lib:$C/fuse/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
chmod u+s "$C/fuse/bin/fusermount3" 2>/dev/null || true
cleanup() {
  for m in "$W"/disk/mnt-*; do fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  umount "$W/disk" 2>/dev/null || umount -l "$W/disk" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
if ! mountpoint -q "$W/disk"; then
  rm -f "$W/img"
  truncate -s 16G "$W/img"
  mkfs.ext4 -q -F "$W/img"
  mkdir -p "$W/disk"
  mount -o loop "$W/img" "$W/disk"
fi
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), Linux $(uname -r)"
python3 "$ROOT/bench/run" --runs "$RUNS" --dir "$W/disk/bench" --targets "$TARGETS" --out "$OUTDIR/RESULTS-host.md" "$@"
