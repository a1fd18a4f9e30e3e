#!/bin/sh
# Batch-job prolog (Slurm Prolog=, PBS prologue): make sure this node's kcachefs cache is mounted on
# node-local disk before the job starts, shared by all jobs and users of the node. Idempotent. Run as root.
#   KCACHEFS_BACKING  node-local directory (default /var/cache/kcachefs/private/backing; never NFS). The
#                     directory above it is made 0700 root if it is missing: nobody but root may reach the
#                     backing directory itself, or they would write past the limit and outside the index
#                     (kcachefs refuses to mount otherwise, naming the directory to fix). On a node whose
#                     local disk is /tmp, use a directory of its own, e.g. /tmp/kcachefs-private/backing:
#                     never the mount point's own directory, never one that users can create first.
#   KCACHEFS_MOUNT    mount point (default /var/cache/kcachefs/mnt, where the module files look)
#   KCACHEFS_OPTIONS  -o options (default max_size=20G,allow_other,default_permissions,nosuid,nodev;
#                     kcachefs adds default_permissions,nosuid,nodev to any allow_other mount itself)
#   KCACHEFS_REMOTE   the cluster's shared tier, redis://HOST[:PORT][/DB] (docs/remote.md); none if unset
#   KCACHEFS_REMOTE_AUTH  the file with its password (root, 0600)
#   KCACHEFS_HERD_WAIT    seconds a node waits for another's compile at a job's start (herd_wait)
#   KCACHEFS_REMOTE_TRUSTED  trusted publishers read after each user's own entries, NAME[:NAME...]
#                     (remote_trusted; docs/remote.md, Trust)
set -eu
backing=${KCACHEFS_BACKING:-/var/cache/kcachefs/private/backing}
mnt=${KCACHEFS_MOUNT:-/var/cache/kcachefs/mnt}
opts=${KCACHEFS_OPTIONS:-max_size=20G,allow_other,default_permissions,nosuid,nodev}
kcachefs=${KCACHEFS_BIN:-kcachefs}
if [ -n "${KCACHEFS_REMOTE:-}" ]; then opts="$opts,remote=$KCACHEFS_REMOTE"; fi
if [ -n "${KCACHEFS_REMOTE_AUTH:-}" ]; then opts="$opts,remote_auth=$KCACHEFS_REMOTE_AUTH"; fi
if [ -n "${KCACHEFS_HERD_WAIT:-}" ]; then opts="$opts,herd_wait=$KCACHEFS_HERD_WAIT"; fi
if [ -n "${KCACHEFS_REMOTE_TRUSTED:-}" ]; then opts="$opts,remote_trusted=$KCACHEFS_REMOTE_TRUSTED"; fi
if mountpoint -q "$mnt"; then exit 0; fi
mkdir -p "$mnt"
# Closed from its creation (mkdir -m 700 applies the mode as it makes the directory): a process that
# entered it while it was open would keep its way in. An existing one is left as it is: kcachefs checks it.
private=$(dirname "$backing")
if [ ! -d "$private" ]; then mkdir -p "$(dirname "$private")" && mkdir -m 700 "$private"; fi
mkdir -p "$backing"
"$kcachefs" -o "$opts" "$backing" "$mnt"
# No runtime directory shared by users: one user's binary there would be loaded by another's process (PoCL
# dlopens what it finds). Each user's `kcache env` (or the module) gets a directory of their own from the
# daemon, MOUNT/users/<uid> (0700), and makes the runtimes' directories in it.
