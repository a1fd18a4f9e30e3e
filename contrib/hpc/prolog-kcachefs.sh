#!/bin/sh
# Batch-job prolog (Slurm Prolog=, PBS prologue): make sure this node's kcachefs cache is mounted on
# node-local disk before the job starts, shared by all jobs and users of the node. Idempotent.
#   KCACHEFS_BACKING  node-local directory (default /tmp/kcachefs/backing; never NFS)
#   KCACHEFS_MOUNT    mount point (default /tmp/kcachefs/mnt)
#   KCACHEFS_OPTIONS  -o options (default max_size=20G,allow_other,default_permissions)
set -eu
backing=${KCACHEFS_BACKING:-/tmp/kcachefs/backing}
mnt=${KCACHEFS_MOUNT:-/tmp/kcachefs/mnt}
opts=${KCACHEFS_OPTIONS:-max_size=20G,allow_other,default_permissions}
kcachefs=${KCACHEFS_BIN:-kcachefs}
if mountpoint -q "$mnt"; then exit 0; fi
mkdir -p "$backing" "$mnt"
"$kcachefs" -o "$opts" "$backing" "$mnt"
# No runtime directory shared by users: one user's binary there would be loaded by another's process (PoCL
# dlopens what it finds). Each user's `kcache env` (or the module) gets a directory of their own from the
# daemon, MOUNT/users/<uid> (0700), and makes the runtimes' directories in it.
