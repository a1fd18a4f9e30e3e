"""Exact accounting under any sequence of operations, eviction racing them: several processes do random
operations of every kind the daemon accounts (ops_worker.py) on ext4 (delayed allocation, O_DIRECT, hole
punching) through a small cache, while eviction and the background descent run. Throughout, the daemon's
own unclamped count stays within the limit; at the end, after `sync`, the index equals the tree
(kcache verify), the daemon's total equals the sum of the index's rows and of the tree, and removing
everything leaves nothing counted.

KCACHEFS_STRESS_SECONDS (default 20) and KCACHEFS_STRESS_SEEDS (default: three fixed seeds and one from
the clock, printed) make the longer form: tests/fuzz/run-stress runs it for minutes per fresh seed."""
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import HERE, ROOT, backing_bytes
from test_fd_bounded import start_limited

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")
KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(BUILD, "kcache")
LIMIT = 16 << 20
WORKERS = 4


def seeds():
    env = os.environ.get("KCACHEFS_STRESS_SEEDS")
    if env:
        return [int(s) for s in env.split(",")]
    return [1, 2, 3, int(time.time()) % 100000]


def index_total(m):
    db = sqlite3.connect(f"file:{m.index_path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT total(bytes), count(*) FROM files").fetchone()
    finally:
        db.close()


def explain(m, out):
    """For a failed verify: what the index knows of each file it lists wrongly (its row, every name it has
    for it, the evictions logged for it) and where that inode is in the tree, if anywhere."""
    tree = {}
    for dp, _, fns in os.walk(m.backing):
        for f in fns:
            try:
                tree.setdefault(os.lstat(os.path.join(dp, f)).st_ino, []).append(
                    os.path.relpath(os.path.join(dp, f), m.backing))
            except FileNotFoundError:
                pass
    db = sqlite3.connect(f"file:{m.index_path}?mode=ro", uri=True)
    lines = []
    try:
        for line in out.splitlines():
            if ":" not in line or not line.startswith(("only in", "not in", "differs")):
                continue
            path = line.split(":", 1)[1].strip().split(" (")[0]
            d, n = os.path.split(path)
            dino = os.lstat(os.path.join(m.backing, d)).st_ino if os.path.isdir(os.path.join(m.backing, d)) else None
            for (ino,) in db.execute("SELECT ino FROM dents WHERE name = ?1 AND (?2 IS NULL OR dir = ?2)", (n, dino)):
                row = db.execute("SELECT bytes, seq, atime_ns FROM files WHERE ino = ?1", (ino,)).fetchone()
                names = db.execute("SELECT dir, name FROM dents WHERE ino = ?1", (ino,)).fetchall()
                ev = db.execute("SELECT time_ns, bytes, name FROM evictions WHERE ino = ?1", (ino,)).fetchall()
                try:  # what the daemon holds of the inode the name leads to now
                    held = os.getxattr(m.path(path), "user.kcachefs.inode").decode()
                except OSError as e:
                    held = f"({e.strerror})"
                lines.append(f"{line}: ino {ino} row {row} names {names} evictions {ev} in the tree as {tree.get(ino)}; "
                             f"the daemon holds {held}")
    finally:
        db.close()
    return "\n".join(lines)


def quiet(m, still=1.5, deadline=60):
    """Waits until the daemon's counts have not moved for still seconds: no eviction, no measurement."""
    names = ("evicted_files", "used_bytes", "files", "background_evictions")
    end = time.monotonic() + deadline
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        now = tuple(xattr(m, n) for n in names)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            return
        time.sleep(0.1)
    raise AssertionError(f"the daemon never went still: {dict(zip(names, last))}")


def xattr(m, name):
    return int(os.getxattr(m.mnt, f"user.kcachefs.{name}"))


def cases():
    """Every seed with a root daemon (descriptors reopened by file handle), and one with a daemon that
    reopens by name (as one that is not root does), holding 48 idle descriptors; KCACHEFS_STRESS_BY_NAME=0
    leaves that one out. It found three bugs that the handle case hides: a new file took a removed file's
    inode (inode.c, detach_reused_locked), an inode that no name held any more answered EPERM instead of
    ESTALE (reopen_by_index), and a new file took a removed directory's inode, whose writes then went
    uncounted (reused_locked). After those, 40 runs of 40 passed under strace, where it had failed in 3."""
    by_name = [] if os.environ.get("KCACHEFS_STRESS_BY_NAME") == "0" else [(5, "name")]
    return [(s, "handle") for s in seeds()] + by_name


@pytest.mark.parametrize("seed,reopen", cases())
def test_random_operations_leave_the_index_equal_to_the_tree(kfs, seed, reopen):
    seconds = float(os.environ.get("KCACHEFS_STRESS_SECONDS", "20"))
    print(f"seed {seed}, descriptors reopened by {reopen}")
    opts = {"max_size": "16M", "grace_ms": "200"}
    if reopen == "name":
        opts["inode_fds"] = "48"
    m = kfs(opts, fs="ext4", tmpfs_size="256m", start=reopen == "handle")
    if reopen == "name":  # as a daemon that is not root runs: no file handles, idle descriptors reopen by
        start_limited(m, "name", 1024)  # name (inode.c, DESCRIPTORS); 48 kept idle, so that they do
    stop = threading.Event()
    worst = [0, 0]

    def sample():  # the daemon's own unclamped count, and the backing tree, as the operations go on
        while not stop.is_set():
            worst[0] = max(worst[0], m.used())
            time.sleep(0.01)

    t = threading.Thread(target=sample)
    t.start()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ops_worker.py"), m.mnt, str(i),
                               str(seed * 100 + i), str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(WORKERS)]
    outs = [p.communicate(timeout=seconds + 120) for p in procs]
    stop.set()
    t.join()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"seed {seed}: a worker failed:\n{err[-3000:]}"
    done = {}
    for out, _ in outs:
        for k, v in json.loads(out.strip().splitlines()[-1]).items():
            done[k] = done.get(k, 0) + v
    print(f"seed {seed}: operations {done}, evicted {xattr(m, 'evicted_files')}")
    # Every kind of operation really ran, and eviction with it.
    for kind in ("create", "pwrite", "strided", "truncate", "fallocate", "copy_range", "mmap", "direct", "link",
                 "rename", "rename_over_open", "unlink", "dirs"):
        assert done.get(kind, 0) > 0, f"seed {seed}: no {kind} succeeded: {done}"
    assert xattr(m, "evicted_files") > 0, f"seed {seed}: nothing was evicted: the limit was never reached"
    if reopen == "name":  # the scene really made the daemon close and reopen descriptors by name; it holds
        # at most 48 idle ones, plus those borrowed and those of unlinked files the kernel has yet to forget
        assert xattr(m, "fd_reopens") >= 10 and xattr(m, "inode_fds") < 256, (xattr(m, "fd_reopens"), xattr(m, "inode_fds"))
    assert worst[0] <= LIMIT, f"seed {seed}: the daemon counted {worst[0]} bytes, over {LIMIT}"

    subprocess.run(["sync"], check=True)
    # The background descent may still be evicting (young files age past the grace and go): kcache verify
    # compares a flushed index with a walk of the tree, and an eviction between the two is a file "only
    # in the index" that is not one (CI's ASan pass saw four). Wait until the daemon is still.
    quiet(m)
    v = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
    assert v.returncode == 0, f"seed {seed}: the index differs from the tree:\n{v.stdout[-4000:]}{v.stderr}\n{explain(m, v.stdout)}"
    used, files = xattr(m, "used_bytes"), xattr(m, "files")
    rows_bytes, rows = index_total(m)  # verify flushed the batch
    tree = backing_bytes(m.backing)
    assert (used, files) == (int(rows_bytes), rows), f"seed {seed}: in memory {used}/{files}, rows {rows_bytes}/{rows}"
    assert used == tree, f"seed {seed}: counted {used}, the tree holds {tree}"
    m.assert_within(LIMIT)

    # Removing everything leaves nothing counted: no leak survives its files.
    subprocess.run(["rm", "-rf"] + [m.path(n) for n in os.listdir(m.mnt)], check=True)
    assert (xattr(m, "used_bytes"), xattr(m, "files")) == (0, 0)
    subprocess.run([KCACHE, "verify", m.mnt], check=True, capture_output=True)
    assert index_total(m)[1] == 0
