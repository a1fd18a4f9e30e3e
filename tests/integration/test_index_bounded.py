"""The index stays small: its write-ahead log restarts while the filesystem runs, whatever the churn,
and the index on disk stays in proportion to the files it describes (kidx.c, I5)."""
import json
import os
import sqlite3
import subprocess
import threading
import time

from conftest import ROOT

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")
KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(BUILD, "kcache")
WAL_CAP = 64 << 20  # the bound; the checkpointer aims at 4 MiB


def _disk(path):
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def test_churning_a_small_cache_keeps_the_wal_bounded(kfs):
    seconds = float(os.environ.get("KCACHEFS_LOAD_SECONDS", "60"))
    m = kfs({"max_size": "4M"}, tmpfs_size="512m")
    wal = m.index_path + "-wal"
    stop = threading.Event()
    worst = [0]
    readers = [0]

    def reader():  # what kcache does: short read transactions on the index, over and over
        while not stop.is_set():
            db = sqlite3.connect(f"file:{m.index_path}?mode=ro", uri=True)
            db.execute("SELECT count(*), total(bytes) FROM files").fetchone()
            db.close()
            readers[0] += 1
            time.sleep(0.05)

    def sampler():
        while not stop.is_set():
            worst[0] = max(worst[0], _disk(wal))
            time.sleep(0.02)

    ts = [threading.Thread(target=reader), threading.Thread(target=sampler)]
    for t in ts:
        t.start()
    n = 0
    payload = os.urandom(8192)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:  # 8 KiB files through a 4 MiB cache: every file evicts one
            with open(m.path(f"f{n}"), "wb") as f:
                f.write(payload)
            n += 1
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert n > 2000, f"only {n} files stored in {seconds}s: the churn never reached the WAL's bound"
    stats = subprocess.run([KCACHE, "stats", "--json", m.mnt], capture_output=True, text=True, check=True).stdout
    st = json.loads(stats)
    assert st["evicted_files"] > 1000
    assert worst[0] <= WAL_CAP, f"the WAL reached {worst[0]} bytes after {n} files"
    # Tighter than the cap: the checkpointer restarts the WAL every 4 MiB of frames.
    assert worst[0] <= 16 << 20, f"the WAL reached {worst[0]} bytes after {n} files"
    # In proportion: the database describes at most a few hundred live files and the eviction log.
    index = _disk(m.index_path) + _disk(wal)
    assert st["index_bytes"] == index or abs(st["index_bytes"] - index) < (1 << 20)
    assert index < 32 << 20, f"index and WAL hold {index} bytes for {st['files']} files"
    print(f"{n} files stored, {st['evicted_files']} evicted, worst WAL {worst[0] >> 10} KiB, index {index >> 10} KiB,"
          f" {readers[0]} reader transactions")


def test_a_reader_holding_a_transaction_delays_the_restart_but_not_for_ever(kfs):
    m = kfs({"max_size": "4M"}, tmpfs_size="512m")
    wal = m.index_path + "-wal"
    db = sqlite3.connect(f"file:{m.index_path}?mode=ro", uri=True, isolation_level=None)
    db.execute("BEGIN")
    db.execute("SELECT count(*) FROM files").fetchone()  # pins the WAL as it is now
    payload = os.urandom(8192)
    for i in range(1500):
        with open(m.path(f"a{i}"), "wb") as f:
            f.write(payload)
    pinned = _disk(wal)
    db.execute("COMMIT")
    db.close()
    for i in range(1500):
        with open(m.path(f"b{i}"), "wb") as f:
            f.write(payload)
    deadline = time.monotonic() + 10
    while _disk(wal) > 16 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pinned > 16 << 20, f"the held reader did not pin the WAL ({pinned} bytes): the scene tests nothing"
    assert _disk(wal) <= 16 << 20, f"the WAL stayed at {_disk(wal)} bytes after the reader let go"
