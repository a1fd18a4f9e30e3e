#!/bin/bash
# Where the daemon's time goes on the GPU machine's 16-core host (device tool, not in CI): one kcachefs
# mount over an ext4 loop image, bench/kbench's tree in it, and for each operation named, `perf record -g`
# of the daemon while kbench runs it, then `perf report` (children and self, by symbol) into
# $OUT/profile-OP.txt, with the daemon's request counters before and after.
#   bash tests/gpu/run-profile-host.sh CARRY_DIR [OP...]    (OP: cold, lookup, hit, parread8, parread32, publish;
#                                                           default: all)
# CARRY_DIR from `KC_CARRY_PERF=1 scripts/gpu-carry` (Debian's perf and its libraries in CARRY_DIR/perf).
set -eu
C=$(cd "${1:-.devcarry}" && pwd)
shift || true
OPS=${*:-cold hit parread8 parread32 publish}
OUTDIR=${OUT:-/tmp}
W=/var/tmp/kcprof-host
export PATH="$C/fuse/bin:$PATH"
chmod u+s "$C/fuse/bin/fusermount3" 2>/dev/null || true
PERF="$C/perf/bin/perf"
kb() { LD_LIBRARY_PATH="$C/lib" "$C/bin/kbench" "$@"; }
requests() { # the daemon's request counters (that machine has no getfattr)
  python3 -c "import os,sys; print(os.getxattr(sys.argv[1], 'user.kcachefs.requests').decode().replace(chr(10), ' '))" \
    "$W/disk/mnt" 2>/dev/null || true
}
cleanup() {
  fusermount3 -u -z "$W/disk/mnt" 2>/dev/null || umount -l "$W/disk/mnt" 2>/dev/null || true
  umount "$W/disk" 2>/dev/null || umount -l "$W/disk" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
mkdir -p "$W/disk"
rm -f "$W/img"
truncate -s 8G "$W/img"
mkfs.ext4 -q -F "$W/img"
mount -o loop "$W/img" "$W/disk"
chmod 700 "$W/disk"
mkdir -p "$W/disk/data/tree" "$W/disk/mnt"
kb populate "$W/disk/data/tree" >/dev/null
LD_LIBRARY_PATH="$C/lib" "$C/bin/kcachefs" -o "max_size=64G,index=$W/disk/k.db" "$W/disk/data" "$W/disk/mnt"
pid=$(pgrep -f "index=$W/disk/k.db" | head -1)
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), Linux $(uname -r), daemon $pid"
T="$W/disk/mnt/tree"
kb read "$T" >/dev/null
kb read "$T" >/dev/null
# KC_PROF_REPEAT=N: each operation N times while recording (its cache drop before each), for more samples
REPEAT=${KC_PROF_REPEAT:-1}
for op in $OPS; do
  drop=
  case $op in
    cold) drop=3; run=(read "$T") ;;
    lookup) drop=2; run=(stat "$T") ;; # LOOKUPs, the disk's blocks cached
    hit) run=(hit "$T") ;;
    parread8) run=(parread "$T" 8) ;;
    parread32) run=(parread "$T" 32) ;;
    publish) run=(publish "$W/disk/mnt" "prof$RANDOM" 2000) ;;
    *) echo "unknown operation $op" >&2; exit 2 ;;
  esac
  before=$(requests)
  [ -z "$drop" ] || { sync; echo $drop >/proc/sys/vm/drop_caches; }
  LD_LIBRARY_PATH="$C/perf/lib" "$PERF" record -F 4999 -g -p "$pid" -o "$W/perf-$op.data" >/dev/null 2>&1 &
  rec=$!
  sleep 1
  secs=
  for i in $(seq "$REPEAT"); do
    [ "$i" = 1 ] || [ -z "$drop" ] || { sync; echo $drop >/proc/sys/vm/drop_caches; }
    secs="$secs $(kb "${run[@]}")"
  done
  kill -INT $rec
  wait $rec || true
  after=$(requests)
  {
    echo "# $op: kbench ${run[*]}: $secs s"
    echo "requests before: $before"
    echo "requests after:  $after"
    LD_LIBRARY_PATH="$C/perf/lib" "$PERF" report -i "$W/perf-$op.data" --no-children --sort sym --stdio -g none 2>/dev/null | grep -E '^ +[0-9]' | head -60
    echo "## with children"
    LD_LIBRARY_PATH="$C/perf/lib" "$PERF" report -i "$W/perf-$op.data" --children --sort sym --stdio -g none 2>/dev/null | grep -E '^ +[0-9]' | head -80
  } >"$OUTDIR/profile-$op.txt"
  head -3 "$OUTDIR/profile-$op.txt"
done
