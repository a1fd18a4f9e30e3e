#!/bin/bash
# The shared tier on the GPU machine (issue 23; device tool, not in CI). From the repository root there:
#   bash tests/gpu/run-remote-gpu.sh [CARRY_DIR]
# CARRY_DIR (scripts/gpu-carry makes it): bin/{kcachefs,kcache} with lib/, and redis/{bin,lib} (Debian's
# redis-server and redis-cli with their libraries: the machine has none). Starts redis-server on a unix
# socket and two mounts, A and B, over two backing directories of their own (in a 0700 directory: kcachefs
# refuses one other users can reach), both -o remote=unix:SOCK. Then, each process a fresh one:
#   Triton: tests/gpu/remote_workload.py triton on A (TRITON_CACHE_DIR from kcache env), A's units published
#     (remote_publishes on A quiet for 2 s), the same on B. B must compile nothing: B's process stores no
#     file in Triton's cache (its FileCacheManager.put counted), B's remote_hits grow, B publishes nothing
#     (remote_publishes and remote_published_before on B quiet and unchanged); results equal.
#   Inductor: torch.compile of an MLP with TORCHINDUCTOR_CACHE_DIR from kcache env (Triton's cache left to
#     Inductor's default under it) on A, then on B, then on B again (its local tier warm): compile wall
#     times, Inductor's FX graph cache and AOT autograd cache hits and misses, B's remote counters; results
#     equal. Then a third mount, C: each file of A's FX graph and AOT autograd caches looked for on C as
#     Inductor looks (its key directory tested, then listed: GuardedCache.iterate_over_candidates), then
#     by its name; then Inductor on C, whose lookups by name have fetched those entries already.
# Prints a table (what, A, B), kcache stats of both mounts; on a failure, the daemons' logs. Everything is
# unmounted and stopped at the end. Exit 0 only if every check held. Logs and the table also go to $OUT
# when it is set (the device tool's folder that comes back).
# KC_SIM=1: a dry run without a GPU or torch (the workload's 'sim' part stands for both, the moves of
# their caches without the compiles), for this script's plumbing on any machine with redis-server.
set -u
C=$(cd "${1:-.devcarry}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
W=/tmp/kcremote SOCK=/tmp/kcremote/redis.sock
MA=$W/mnt-a MB=$W/mnt-b MC=$W/mnt-c BA=$W/private/a BB=$W/private/b BC=$W/private/c
PY=${KC_PYTHON:-python3}
. "$HERE/remote-lib.sh"

for m in $MA $MB $MC; do mountpoint -q $m && { umount $m || umount -l $m; }; done
rm -rf $W
mkdir -m 0700 $W && mkdir -m 0700 $W/private && mkdir $W/out || exit 1
mkdir -p $BA $BB $BC $MA $MB $MC
chmod 0755 $BA $BB $BC
rpid=
cleanup() {
  for m in $MA $MB $MC; do mountpoint -q $m && { umount $m 2>/dev/null || umount -l $m; }; done
  [ -n "$rpid" ] && kill $rpid 2>/dev/null && wait $rpid 2>/dev/null
}
trap cleanup EXIT

LD_LIBRARY_PATH=$C/redis/lib "$C/redis/bin/redis-server" --port 0 --unixsocket $SOCK --unixsocketperm 700 \
  --save '' --appendonly no --dir $W --daemonize no --maxmemory-policy allkeys-lru >$W/redis.log 2>&1 &
rpid=$!
wait_for 20 bash -c "[ \"\$(LD_LIBRARY_PATH=$C/redis/lib $C/redis/bin/redis-cli -s $SOCK PING 2>/dev/null)\" = PONG ]" \
  || { cat $W/redis.log; echo "FAILED: redis-server did not start"; exit 1; }
echo "redis-server: $(rcli INFO server | awk -F: '/^redis_version/ {print $2}' | tr -d '\r') on $SOCK"
for n in A B C; do
  case $n in A) b=$BA m=$MA ;; B) b=$BB m=$MB ;; C) b=$BC m=$MC ;; esac
  LD_LIBRARY_PATH=$C/lib "$C/bin/kcachefs" -o max_size=8G,remote=unix:$SOCK,remote_timeout_ms=200 $b $m \
    || { echo "FAILED: kcachefs $n"; exit 1; }
  wait_for 20 mountpoint -q $m || { echo "FAILED: $n not mounted"; exit 1; }
done

# remote_publishes on M unchanged for 2 s (the publisher waits for 500 ms of quiet in a unit), within 90 s.
settle() {
  local m=$1 last=-1 since=$SECONDS end=$((SECONDS + 90)) now
  while [ $SECONDS -lt $end ]; do
    now=$(xa $m remote_publishes)
    if [ "$now" != "$last" ]; then last=$now since=$SECONDS; elif [ $((SECONDS - since)) -ge 2 ]; then return 0; fi
    sleep 0.2
  done
  return 1
}
declare -A T   # T[part.node.what]: the table's cells
COUNTERS="remote_hits remote_misses remote_publishes remote_published_before remote_errors remote_timeouts remote_corrupt"
snap() { local m=$1 k; for k in $COUNTERS; do echo "$k=$(xa $m $k)"; done; }
# delta KEY BEFORE AFTER: AFTER's value of KEY less BEFORE's
delta() { echo $(( $(echo "$3" | awk -F= -v k=$1 '$1 == k {print $2}') - $(echo "$2" | awk -F= -v k=$1 '$1 == k {print $2}') )); }

# run PART RUNTIME NODE MOUNT TAG: one process of the workload with RUNTIME's cache (kcache env) in MOUNT
run() {
  local part=$1 rt=$2 node=$3 m=$4 tag=$5 before after line
  [ -n "${KC_SIM:-}" ] && part=sim
  settle $m || fail "$tag: $node's publishes never settled before"
  before=$(snap $m)
  line=$(unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR; eval "$(kc env $m $rt)" && \
         TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONUNBUFFERED=1 timeout 300 $PY "$HERE/remote_workload.py" \
         $part $W/out/$tag.pt 2>$W/out/$tag.err | tail -1)
  [ -n "$line" ] || { fail "$tag: the workload failed"; tail -30 $W/out/$tag.err; }
  echo "$tag: $line"
  settle $m || fail "$tag: $node's publishes never settled after"
  after=$(snap $m)
  T[$tag.secs]=$(jget "$line" secs) T[$tag.puts]=$(jget "$line" triton_puts) T[$tag.gpu]=$(jget "$line" gpu)
  for k in fxgraph_cache_hit fxgraph_cache_miss autograd_cache_hit autograd_cache_miss torch triton; do
    T[$tag.$k]=$(jget "$line" $k)
  done
  for k in $COUNTERS; do T[$tag.$k]=$(delta $k "$before" "$after"); done
}

# ---- Triton: compiled on A, served to B ----
run triton triton A $MA triton-A
[ "${T[triton-A.remote_publishes]}" -gt 0 ] || fail "triton: A published nothing"
run triton triton B $MB triton-B
[ "${T[triton-B.remote_hits]}" -gt 0 ] || fail "triton: B was served nothing from the server"
[ "${T[triton-B.puts]}" = 0 ] || fail "triton: B's process stored ${T[triton-B.puts]} files in Triton's cache (it compiled)"
[ "${T[triton-B.remote_publishes]}" = 0 ] && [ "${T[triton-B.remote_published_before]}" = 0 ] \
  || fail "triton: B published units of its own (it wrote new Triton files)"
$PY "$HERE/remote_workload.py" compare $W/out/triton-A.pt $W/out/triton-B.pt && T[triton.equal]=yes \
  || { T[triton.equal]=NO; fail "triton: A's and B's results differ"; }

# ---- Inductor: compiled on A, then B (remote tier), then B again (its local tier) ----
run inductor inductor A $MA inductor-A
run inductor inductor B $MB inductor-B
run inductor inductor B $MB inductor-B2
[ "${T[inductor-A.remote_publishes]}" -gt 0 ] || fail "inductor: A published nothing"
[ "${T[inductor-B.remote_hits]}" -gt 0 ] || fail "inductor: B was served nothing from the server"
[ "${T[inductor-B.puts]}" = 0 ] || fail "inductor: B's process stored ${T[inductor-B.puts]} files in Triton's cache"
[ "${T[inductor-B.fxgraph_cache_hit]}" != 0 ] || fail "inductor: B's FX graph cache missed what A had published"
for t in inductor-B inductor-B2; do
  $PY "$HERE/remote_workload.py" compare $W/out/inductor-A.pt $W/out/$t.pt && T[$t.equal]=yes \
    || { T[$t.equal]=NO; fail "inductor: A's and $t's results differ"; }
done
# Why B missed (if it did): Inductor finds an entry by listing its key directory; a lookup by name is
# what fetches from the server. C sees A's entries both ways, then runs Inductor.
echo "== A's FX graph and AOT autograd entries on C: key directory exists, entries listed; looked up by name; listed again"
(cd $MA && find inductor/fxgraph inductor/aotautograd -type f 2>/dev/null) | while read -r rel; do
  d=$(dirname "$rel")
  isdir=$([ -d "$MC/$d" ] && echo yes || echo no); listed=$(ls -A "$MC/$d" 2>/dev/null | wc -l)
  byname=$([ -f "$MC/$rel" ] && echo found || echo missing); after=$(ls -A "$MC/$d" 2>/dev/null | wc -l)
  echo "$rel: dir $isdir, $listed listed; by name $byname; then $after listed"
done
run inductor inductor C $MC inductor-C
$PY "$HERE/remote_workload.py" compare $W/out/inductor-A.pt $W/out/inductor-C.pt && T[inductor-C.equal]=yes \
  || { T[inductor-C.equal]=NO; fail "inductor: A's and C's results differ"; }
[ "${T[inductor-C.fxgraph_cache_hit]}" != 0 ] || fail "inductor: C's FX graph cache missed, its entries fetched by name"

{
  echo "GPU: ${T[triton-A.gpu]}; torch ${T[triton-A.torch]:--}, triton ${T[triton-A.triton]:--}"
  printf '| %-52s | %12s | %12s |\n' what A B
  printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..54})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..14})"
  row() { printf '| %-52s | %12s | %12s |\n' "$1" "$2" "$3"; }
  row "Triton, 5 kernels: first launch, wall s" "${T[triton-A.secs]}" "${T[triton-B.secs]}"
  row "Triton: files stored in Triton's cache (puts)" "${T[triton-A.puts]}" "${T[triton-B.puts]}"
  for k in remote_hits remote_misses remote_publishes remote_published_before remote_errors remote_timeouts; do
    row "Triton: $k (this process)" "${T[triton-A.$k]}" "${T[triton-B.$k]}"
  done
  row "Triton: results equal" "" "${T[triton.equal]}"
  row "Inductor MLP: torch.compile + first call, wall s" "${T[inductor-A.secs]}" "${T[inductor-B.secs]}"
  for k in fxgraph_cache_hit fxgraph_cache_miss autograd_cache_hit autograd_cache_miss puts remote_hits \
           remote_misses remote_publishes remote_published_before remote_errors remote_timeouts; do
    row "Inductor: $k" "${T[inductor-A.$k]}" "${T[inductor-B.$k]}"
  done
  row "Inductor: results equal" "" "${T[inductor-B.equal]}"
  row "Inductor, B again (local tier warm): wall s" "" "${T[inductor-B2.secs]}"
  row "Inductor, B again: fxgraph hit/miss, puts" "" \
      "${T[inductor-B2.fxgraph_cache_hit]}/${T[inductor-B2.fxgraph_cache_miss]}, ${T[inductor-B2.puts]}"
  row "Inductor on C after lookups by name: wall s" "" "${T[inductor-C.secs]}"
  row "Inductor on C: fxgraph hit/miss, autograd hit/miss" "" \
      "${T[inductor-C.fxgraph_cache_hit]}/${T[inductor-C.fxgraph_cache_miss]}, ${T[inductor-C.autograd_cache_hit]}/${T[inductor-C.autograd_cache_miss]}"
  row "Inductor on C: puts, remote_hits, results equal" "" \
      "${T[inductor-C.puts]}, ${T[inductor-C.remote_hits]}, ${T[inductor-C.equal]}"
} | tee $W/table.md
for n in A B C; do
  case $n in A) m=$MA ;; B) m=$MB ;; C) m=$MC ;; esac
  echo "== kcache stats $n"; kc stats $m
  kc verify $m >/dev/null || fail "$n: kcache verify: the index differs from the tree"
done
echo "== server: $(rcli DBSIZE) keys, $(rcli INFO memory | awk -F: '/^used_memory_human/ {print $2}' | tr -d '\r')"
if [ $status != 0 ]; then
  for b in $BA $BB $BC; do echo "== $b/.kcachefs/kcachefs.log (tail)"; tail -40 $b/.kcachefs/kcachefs.log 2>/dev/null; done
fi
if [ -n "${OUT:-}" ]; then
  cp $W/table.md $OUT/ 2>/dev/null
  cp $BA/.kcachefs/kcachefs.log $OUT/kcachefs-A.log 2>/dev/null
  cp $BB/.kcachefs/kcachefs.log $OUT/kcachefs-B.log 2>/dev/null
  (cd $W/out && tar czf $OUT/workload-stderr.tgz *.err) 2>/dev/null
  (cd $MA && find . -type f | sort > $OUT/tree-A.txt) 2>/dev/null
  (cd $MB && find . -type f | sort > $OUT/tree-B.txt) 2>/dev/null
fi
echo "run-remote-gpu: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
