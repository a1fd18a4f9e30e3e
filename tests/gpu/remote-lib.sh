# Helpers of the shared tier's GPU checks (run-remote-gpu.sh, run-herd-gpu.sh), sourced after they set
# C (the carry directory), SOCK (redis-server's socket) and PY.
status=0
fail() { echo "FAILED: $*"; status=1; }
# Only the carried programs get the carried libraries: Python keeps the machine's own.
kc() { LD_LIBRARY_PATH=$C/lib "$C/bin/kcache" "$@"; }
rcli() { LD_LIBRARY_PATH=$C/redis/lib "$C/redis/bin/redis-cli" -s $SOCK "$@"; }
# xa MOUNT NAME: the mount's root xattr user.kcachefs.NAME (0 if it cannot be read)
xa() { $PY -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.kcachefs." + sys.argv[2]).decode())' "$1" "$2" 2>/dev/null || echo 0; }
# until CMD succeeds, polling every 0.2 s, for at most SECONDS
wait_for() { local t=$1; shift; local end=$((SECONDS + t)); until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done; }
# jget JSON KEY: KEY's value in the JSON line, or -
jget() { $PY -c 'import json, sys; print(json.loads(sys.argv[1]).get(sys.argv[2], "-"))' "$1" "$2" 2>/dev/null || echo -; }
