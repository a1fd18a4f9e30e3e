#!/bin/bash
# One compile per cluster with real Triton on the GPU machine (issue 23; device tool, not in CI). From the
# repository root there:
#   bash tests/gpu/run-herd-gpu.sh [CARRY_DIR]
# CARRY_DIR as for run-remote-gpu.sh (scripts/gpu-carry: bin/, lib/, redis/). Four Triton processes
# (tests/gpu/remote_workload.py triton: 5 kernels, with the launcher and cuda_utils modules Triton builds)
# start at once, two on each of two mounts ("nodes") sharing one redis-server:
#   solo:     one process alone on a mount without a remote: what one compile stores (Triton's
#             FileCacheManager.put, counted in the process);
#   no herd:  four processes on two mounts with -o remote= and no herd_wait (then the server is emptied);
#   herd:     four processes on two fresh mounts with herd_wait=120: together they must store what one
#             compile stores, no more (each unit compiled by one process of the cluster: the other process
#             of its node waits at the output's directory, fs/remote/herd.c H7, and the other node for the
#             publication), and every result must equal the solo run's.
# Prints a table, kcache stats, and "run-herd-gpu: ok" or FAILED; exit 0 only if every check held.
# KC_SIM=1: a dry run without a GPU or torch (the workload's 'sim' part: Triton's cache moves, no compile).
set -u
C=$(cd "${1:-.devcarry}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
W=/tmp/kcherd SOCK=/tmp/kcherd/redis.sock
PY=${KC_PYTHON:-python3}
PART=triton
[ -n "${KC_SIM:-}" ] && PART=sim
. "$HERE/remote-lib.sh"

MOUNTS=()
umount_all() { for m in "${MOUNTS[@]}"; do mountpoint -q $m && { umount $m 2>/dev/null || umount -l $m; }; done; }
rpid=
cleanup() { umount_all; [ -n "$rpid" ] && kill $rpid 2>/dev/null && wait $rpid 2>/dev/null; }
trap cleanup EXIT
for m in $W/mnt-*; do [ -d "$m" ] && mountpoint -q $m && { umount $m || umount -l $m; }; done
rm -rf $W
mkdir -m 0700 $W && mkdir -m 0700 $W/private && mkdir $W/out || exit 1

LD_LIBRARY_PATH=$C/redis/lib "$C/redis/bin/redis-server" --port 0 --unixsocket $SOCK --unixsocketperm 700 \
  --save '' --appendonly no --dir $W --daemonize no --maxmemory-policy allkeys-lru >$W/redis.log 2>&1 &
rpid=$!
wait_for 20 bash -c "[ \"\$(LD_LIBRARY_PATH=$C/redis/lib $C/redis/bin/redis-cli -s $SOCK PING 2>/dev/null)\" = PONG ]" \
  || { cat $W/redis.log; echo "FAILED: redis-server did not start"; exit 1; }

# mount NAME OPTIONS: a fresh backing directory and mount point; prints the mount point
mount_node() {
  local b=$W/private/$1 m=$W/mnt-$1
  mkdir -p $b $m && chmod 0755 $b
  LD_LIBRARY_PATH=$C/lib "$C/bin/kcachefs" -o "max_size=8G${2:+,$2}" $b $m || { echo "FAILED: kcachefs $1" >&2; return 1; }
  wait_for 20 mountpoint -q $m || { echo "FAILED: $1 not mounted" >&2; return 1; }
  MOUNTS+=($m)
}
# start MOUNT TAG: one workload process with Triton's cache in MOUNT (kcache env), in the background
PIDS=()
start() {
  (unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR; eval "$(kc env $1 triton)" && \
   PYTHONUNBUFFERED=1 timeout 300 $PY "$HERE/remote_workload.py" $PART $W/out/$2.pt >$W/out/$2.json 2>$W/out/$2.err) &
  PIDS+=($!)
}
# the workloads started (not redis-server)
wait_started() { wait "${PIDS[@]}"; PIDS=(); }
puts_of() { jget "$(tail -1 $W/out/$1.json 2>/dev/null)" triton_puts; }
declare -A T

# ---- solo: one compile, no remote ----
mount_node solo "" || exit 1
start $W/mnt-solo solo; wait_started
T[solo.puts]=$(puts_of solo) T[solo.secs]=$(jget "$(tail -1 $W/out/solo.json)" secs)
[ "${T[solo.puts]}" != - ] && [ "${T[solo.puts]}" -gt 0 ] || { fail "solo: the workload failed"; tail -20 $W/out/solo.err; }

# run MODE OPTS: four processes, two on each of two fresh mounts
run() {
  local mode=$1 opts=$2 total=0 i m
  mount_node $mode-1 "$opts" && mount_node $mode-2 "$opts" || exit 1
  local t0=$SECONDS
  for i in 1 2 3 4; do start $W/mnt-$mode-$(( (i + 1) / 2 )) $mode-p$i; done
  wait_started
  T[$mode.secs]=$((SECONDS - t0))
  for i in 1 2 3 4; do
    local p; p=$(puts_of $mode-p$i)
    [ "$p" != - ] || { fail "$mode: process $i failed"; tail -20 $W/out/$mode-p$i.err; p=0; }
    T[$mode.p$i]=$p; total=$((total + p))
    # the same results as the solo run's (a dry run's "compile" is random bytes: there, the herd run's
    # processes all hold the one compile's)
    if [ -z "${KC_SIM:-}" ]; then
      $PY "$HERE/remote_workload.py" compare $W/out/solo.pt $W/out/$mode-p$i.pt || fail "$mode: process $i's results differ"
    elif [ $mode = herd ]; then
      $PY "$HERE/remote_workload.py" compare $W/out/$mode-p1.pt $W/out/$mode-p$i.pt || fail "$mode: process $i's results differ"
    fi
  done
  T[$mode.puts]=$total
  for i in 1 2; do
    m=$W/mnt-$mode-$i
    for k in herd_waits herd_served herd_gave_up remote_hits remote_publishes; do T[$mode.$i.$k]=$(xa $m $k); done
    kc verify $m >/dev/null || fail "$mode: node $i: kcache verify: the index differs from the tree"
  done
}
run noherd "remote=unix:$SOCK,remote_timeout_ms=200"
for m in $W/mnt-noherd-1 $W/mnt-noherd-2; do umount $m || umount -l $m; done  # no late publish of theirs
rcli FLUSHALL >/dev/null
run herd "remote=unix:$SOCK,remote_timeout_ms=200,herd_wait=120"
[ "${T[herd.puts]}" = "${T[solo.puts]}" ] \
  || fail "herd: four processes stored ${T[herd.puts]} files, one compile stores ${T[solo.puts]}"

{
  echo "GPU: $(jget "$(tail -1 $W/out/solo.json)" gpu); torch $(jget "$(tail -1 $W/out/solo.json)" torch), triton $(jget "$(tail -1 $W/out/solo.json)" triton)"
  echo "| run | files stored (p1 p2 on node 1, p3 p4 on node 2) | total | one compile | wall s |"
  echo "|---|---|---|---|---|"
  echo "| one process, no remote | ${T[solo.puts]} | ${T[solo.puts]} | ${T[solo.puts]} | ${T[solo.secs]} |"
  for mode in noherd herd; do
    echo "| $mode: 4 processes on 2 nodes | ${T[$mode.p1]} ${T[$mode.p2]} ${T[$mode.p3]} ${T[$mode.p4]} | ${T[$mode.puts]} | ${T[solo.puts]} | ${T[$mode.secs]} |"
  done
  echo
  echo "| node | herd_waits | herd_served | herd_gave_up | remote_hits | remote_publishes |"
  echo "|---|---|---|---|---|---|"
  for mode in noherd herd; do for i in 1 2; do
    echo "| $mode-$i | ${T[$mode.$i.herd_waits]} | ${T[$mode.$i.herd_served]} | ${T[$mode.$i.herd_gave_up]} | ${T[$mode.$i.remote_hits]} | ${T[$mode.$i.remote_publishes]} |"
  done; done
} | tee $W/table.md
if [ -n "${OUT:-}" ]; then
  cp $W/table.md $OUT/herd-table.md 2>/dev/null
  (cd $W/out && tar czf $OUT/herd-stderr.tgz *.err *.json) 2>/dev/null
fi
echo "run-herd-gpu: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
