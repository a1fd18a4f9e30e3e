#!/bin/bash
# Where bench/run's cold row goes over raw, on the GPU machine's 16-core host (device tool, not in CI): one
# ext4 loop image holding kbench's tree; for each mount option set named (default: "" and nolog), a
# kcachefs mount, then three rounds of: a cold read of the raw tree and of the mount (caches dropped before
# each), a cold stat of each (LOOKUPs alone), and the mount's cold stat and read again with its index file
# read back into the page cache after the drop (is the index's disk read the cost?), and a stat of each
# after dropping dentries and inodes only (LOOKUPs without the disk's reads). The daemon's request
# counters are printed around the first cold read.
#   bash tests/gpu/run-cold-probe-host.sh [CARRY_DIR] [OPTS...]     (OPTS: e.g. "" nolog nopassthrough)
set -u
C=$(cd "${1:-.devcarry}" && pwd)
shift || true
[ $# -gt 0 ] || set -- "" nolog
W=/var/tmp/kccold
export PATH="$C/fuse/bin:$PATH"
kb() { LD_LIBRARY_PATH="$C/lib" "$C/bin/kbench" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
drop2() { sync; echo 2 >/proc/sys/vm/drop_caches; } # dentries and inodes only: the disk's blocks stay cached
req() { python3 -c "import os,sys; print(os.getxattr(sys.argv[1], 'user.kcachefs.requests').decode().replace(chr(10), ' '))" "$W/disk/mnt"; }
mkdir -p "$W/disk"
umount -l "$W/disk/mnt" 2>/dev/null; umount -l "$W/disk" 2>/dev/null
rm -f "$W/img"; truncate -s 8G "$W/img"; mkfs.ext4 -q -F "$W/img"; mount -o loop "$W/img" "$W/disk"
chmod 700 "$W/disk"; mkdir -p "$W/disk/data" "$W/disk/mnt"
kb populate "$W/disk/data" >/dev/null
echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), Linux $(uname -r)"
for opts in "$@"; do
  idx="$W/disk/idx-${opts:-default}.db"
  LD_LIBRARY_PATH="$C/lib" "$C/bin/kcachefs" -o "max_size=64G,uring,${opts:+$opts,}index=$idx" "$W/disk/data" "$W/disk/mnt" 2>/dev/null || exit 1
  kb read "$W/disk/mnt" >/dev/null; kb walkstat "$W/disk/mnt" >/dev/null
  for i in 1 2 3; do
    drop; r=$(kb read "$W/disk/data"); drop; a=$(req); m=$(kb read "$W/disk/mnt"); b=$(req)
    drop; rs=$(kb stat "$W/disk/data"); drop; ms=$(kb stat "$W/disk/mnt")
    drop; cat "$idx"* >/dev/null; mi=$(kb stat "$W/disk/mnt")
    drop; cat "$idx"* >/dev/null; mr=$(kb read "$W/disk/mnt")
    drop2; rs2=$(kb stat "$W/disk/data"); drop2; ms2=$(kb stat "$W/disk/mnt")
    echo "[${opts:-default}] stat after dropping dentries and inodes only: raw $rs2, kcachefs $ms2"
    echo "[${opts:-default}] cold read: raw $r, kcachefs $m (index cached: $mr); cold stat: raw $rs, kcachefs $ms (index cached: $mi)"
    [ "$i" = 1 ] && echo "  requests before: $a" && echo "  requests after:  $b"
  done
  fusermount3 -u "$W/disk/mnt"; sleep 1
done
umount -l "$W/disk"
