"""Reliability: a crash storm, an fsx run of a million operations, faults of the backing directory and
the index, a long reader of the index, and 64 processes of load while eviction runs."""
import glob
import hashlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import HERE, ROOT, backing_files, pid_alive, wait_for, private_dir

BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(ROOT, "build")  # run-tests: build-asan in its ASan pass
KCACHE = os.environ.get("KCACHE_BIN") or os.path.join(BUILD, "kcache")
FSX = os.path.join(BUILD, "tests", "fsx")


def evictions(m):
    """{(path, inode)} of every eviction the index has recorded."""
    db = sqlite3.connect(f"file:{m.index_path}?mode=ro", uri=True)
    try:
        return set(db.execute("SELECT name, ino FROM evictions").fetchall())
    finally:
        db.close()


def read_logs(paths):
    """{name: [events]} in order; torn reads."""
    ev, torn = {}, []
    for p in paths:
        if not os.path.exists(p):
            continue
        for line in open(p):
            f = line.split()
            if not f or (f[0] != "T" and len(f) < 3) or (f[0] in "IC" and len(f) < {"I": 4, "C": 5}[f[0]]):
                continue  # a line cut by SIGKILL
            if f[0] == "T":
                torn.append(f[1])
            else:
                ev.setdefault(f[1], []).append(f)
    return ev, torn


def check_storm(m, logs):
    p = subprocess.run([KCACHE, "verify", m.mnt], capture_output=True, text=True)
    assert p.returncode == 0, f"index differs from the backing directory:\n{p.stdout}{p.stderr}"
    present = {}
    for rel in backing_files(m.backing):
        if os.path.basename(rel).startswith(".tmp-"):
            continue
        blob = open(os.path.join(m.backing, rel), "rb").read()
        assert len(blob) >= 32 and hashlib.sha256(blob[:-32]).digest() == blob[-32:], f"torn file {rel}"
        present[rel] = blob[-32:].hex()
    ev, torn = read_logs(logs)
    assert not torn, f"readers saw torn files: {torn[:5]}"
    evicted = evictions(m)

    def was_evicted(name, ino):  # that very file, by its inode: not an older or newer version
        return (name, int(ino)) in evicted

    lost = []
    for name, events in ev.items():
        last = events[-1]
        commits = [e for e in events if e[0] == "C"]
        if last[0] == "C":
            if name in present:
                assert present[name] == last[2], f"{name} holds another version than the one committed last"
            elif not was_evicted(name, last[4]):
                lost.append(name)
        elif last[0] == "I":  # a rename of unknown outcome: the old version, the new one, or evicted
            if name not in present and commits and not any(e[0] == "U" for e in events[events.index(commits[-1]):]):
                if not was_evicted(name, commits[-1][4]) and not was_evicted(name, last[3]):
                    lost.append(name)
        elif last[0] == "U":
            assert name not in present, f"{name} came back after its unlink returned"
    assert not lost, f"committed files missing without an eviction record: {lost[:10]}"
    return len(present), len(evicted)


def test_crash_storm_sigkill_twenty_times(kfs, workdir):
    """16 processes (temp+rename creates and overwrites, verified reads, unlinks, mkdir/rmdir) while
    eviction runs; the daemon is SIGKILLed at random moments 20 times and remounted after each."""
    d, _ = workdir
    m = kfs({"max_size": "6M", "grace_ms": "0"})
    logs = [os.path.join(d, f"storm-{i}.log") for i in range(16)]
    rnd = random.Random(7)
    rounds = int(os.environ.get("KCACHEFS_STORM_ROUNDS", "20"))
    total_files = total_evicted = 0
    # Eviction by construction, not by how fast the workers run: the cache starts at 5.5 MiB, 200 KiB
    # below its high mark (files of the workers' own checked format), so their first 200 KiB evict.
    os.makedirs(m.path("fill"))
    for i in range(88):
        data = rnd.randbytes((64 << 10) - 32)
        with open(m.path("fill", f"f{i}"), "wb") as f:
            f.write(data + hashlib.sha256(data).digest())
    assert m.used() == 88 * (64 << 10) and int(os.getxattr(m.mnt, "user.kcachefs.evicted_files")) == 0
    for r in range(rounds):
        workers = [subprocess.Popen([sys.executable, os.path.join(HERE, "storm_worker.py"), m.mnt, str(i), logs[i],
                                     str(r * 100 + i)]) for i in range(16)]
        time.sleep(rnd.uniform(0.4, 1.6))
        pid = m.pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), what="daemon death")
        for w in workers:  # before the unmount: a worker left running would write into the bare mountpoint
            w.kill()
            w.wait()
        subprocess.run(["fusermount3", "-u", "-z", m.mnt], check=False, capture_output=True)
        wait_for(lambda: not os.path.ismount(m.mnt), what="unmount")
        assert os.listdir(m.mnt) == []
        p = m.start()
        assert "did not stop cleanly" in p.stderr, p.stderr
        total_files, total_evicted = check_storm(m, logs)
        m.assert_within(6 << 20)
    assert total_evicted > 0, "the storm never evicted: the test would not cover eviction"
    print(f"\ncrash storm: {rounds} SIGKILLs, {total_files} files at the end, {total_evicted} evictions logged")


def test_a_process_holding_the_log_pipe_never_keeps_the_daemon_from_exiting(kfs, workdir):
    """A detached daemon's stderr is a pipe its log thread reads; helper processes (spawn.c) inherit its write
    end, and the daemon waited at exit for the pipe's EOF, which a helper still running (a nudge stuck in its
    statfs) never gives: the unmount left a daemon that never exited. Here another process holds a copy of
    the write end, as such a helper does; the daemon must still exit once unmounted, within LOG_DRAIN_S."""
    log = os.path.join(workdir[0], "kcachefs.log")
    m = kfs({"log": log})
    pid = m.pid()
    assert os.readlink(f"/proc/{pid}/fd/2").startswith("pipe:")
    holder = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY)
    try:
        subprocess.run(["fusermount3", "-u", m.mnt], check=True, capture_output=True)
        wait_for(lambda: not pid_alive(pid), timeout=20, what="the daemon's exit while the pipe is held")
    finally:
        os.close(holder)
    with open(log) as f:
        assert "flushed and marked clean" in f.read()


def test_fsx_a_million_operations(kfs):
    m = kfs({"max_size": "64M"})
    ops = os.environ.get("KCACHEFS_FSX_OPS", "1000000")
    p = subprocess.run([FSX, m.mnt, ops, "12345"], capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"fsx: {ops} operations, no mismatch" in p.stdout
    print("\n" + p.stdout.strip())


def test_backing_directory_removed_while_mounted(kfs, workdir):
    """Errors, no crash; the daemon still answers and unmounts cleanly."""
    d = private_dir(workdir[0])
    backing = os.path.join(d, "doomed")
    os.makedirs(os.path.join(backing, "sub"))
    with open(os.path.join(backing, "sub", "f"), "wb") as f:
        f.write(b"x" * 1000)
    m = kfs(start=False)
    m.backing = backing
    m.index = os.path.join(d, "doomed-index.db")
    m.start()
    pid = m.pid()
    shutil.rmtree(backing)
    for op in (lambda: open(m.path("sub", "f")).read(), lambda: open(m.path("new"), "w").write("x"),
               lambda: os.listdir(m.mnt), lambda: os.mkdir(m.path("d"))):
        try:
            op()
        except OSError:
            pass
    os.statvfs(m.mnt)
    assert os.path.exists(f"/proc/{pid}"), "the daemon died"
    m.stop()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_index_damaged_while_unmounted_is_rebuilt(kfs, damage):
    m = kfs({"max_size": "64M"})
    for i in range(50):
        os.makedirs(m.path(f"d{i % 5}"), exist_ok=True)
        with open(m.path(f"d{i % 5}", f"f{i}"), "wb") as f:
            f.write(os.urandom(3000 + i))
    m.stop()
    before = backing_files(m.backing)
    if damage == "truncate":
        os.truncate(m.index_path, os.path.getsize(m.index_path) // 3)
    elif damage == "garbage":
        with open(m.index_path, "r+b") as f:
            f.write(os.urandom(os.path.getsize(m.index_path)))
    else:
        for p in glob.glob(m.index_path + "*"):
            if not p.endswith(".lock"):
                os.unlink(p)
    p = m.start()
    if damage != "delete":  # a missing index is simply a new one: built from the tree, silently
        assert "index" in p.stderr, p.stderr
    assert backing_files(m.backing) == before  # no file lost
    for i in range(50):
        assert os.path.getsize(m.path(f"d{i % 5}", f"f{i}")) == 3000 + i
    assert subprocess.run([KCACHE, "verify", m.mnt], capture_output=True).returncode == 0


def test_a_long_reader_of_the_index_never_blocks_the_filesystem(kfs):
    m = kfs({"max_size": "2M", "flush_ms": "50"})
    db = sqlite3.connect(f"file:{m.index_path}?mode=ro", uri=True, isolation_level=None)
    db.execute("BEGIN")
    db.execute("SELECT count(*) FROM files").fetchone()  # a read transaction held open from here
    t0 = time.monotonic()
    worst = 0.0
    for i in range(300):  # 300 x 64 KiB through a 2 MiB cache: flushes and evictions all along
        s = time.monotonic()
        with open(m.path(f"f{i}"), "wb") as f:
            f.write(b"y" * 65536)
        worst = max(worst, time.monotonic() - s)
    subprocess.run([KCACHE, "evict", m.mnt, "--to", "1M"], check=True, capture_output=True)
    db.execute("COMMIT")
    db.close()
    assert time.monotonic() - t0 < 60
    assert worst < 2.0, f"a write waited {worst:.2f}s behind the reader"


def _status(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def test_load_64_processes_read_hot_entries_while_eviction_runs(kfs):
    seconds = float(os.environ.get("KCACHEFS_LOAD_SECONDS", "60"))
    m = kfs({"max_size": "16M"})
    os.makedirs(m.path("hot"))
    for i in range(32):
        with open(m.path("hot", f"h{i}"), "wb") as f:
            f.write(bytes([i]) * 65536)
    pid = m.pid()
    reader = (
        "import os, sys, time\n"
        "m, end, i = sys.argv[1], time.time() + float(sys.argv[2]), int(sys.argv[3])\n"
        "n = 0\n"
        "while time.time() < end:\n"
        "    k = (n * 7 + i) % 32\n"
        "    with open(os.path.join(m, 'hot', f'h{k}'), 'rb') as f:\n"
        "        b = f.read()\n"
        "    assert b == bytes([k]) * 65536, 'bad data'\n"
        "    n += 1\n"
        "print(n)\n")
    procs = [subprocess.Popen([sys.executable, "-c", reader, m.mnt, str(seconds), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(64)]
    stop = threading.Event()
    peak = {"rss": 0, "threads": 0}

    def churn():  # cold entries written all along: eviction keeps running
        j = 0
        while not stop.is_set():
            try:
                with open(m.path(f"cold{j % 400}"), "wb") as f:
                    f.write(b"c" * 131072)
            except OSError:
                pass
            j += 1

    def sample():
        while not stop.is_set():
            peak["rss"] = max(peak["rss"], _status(pid, "VmRSS"))
            peak["threads"] = max(peak["threads"], _status(pid, "Threads"))
            time.sleep(0.2)

    ts = [threading.Thread(target=churn), threading.Thread(target=sample)]
    for t in ts:
        t.start()
    outs = [p.communicate(timeout=seconds + 120) for p in procs]
    stop.set()
    for t in ts:
        t.join()
    failures = [(p.returncode, e[-300:]) for p, (o, e) in zip(procs, outs) if p.returncode != 0]
    assert not failures, failures[:3]
    reads = sum(int(o.strip()) for o, _ in outs)
    st = subprocess.run([KCACHE, "stats", m.mnt, "--json"], capture_output=True, text=True, check=True).stdout
    import json
    evicted = json.loads(st)["evicted_files"]
    assert evicted > 0
    assert peak["threads"] <= 1100 and peak["rss"] < 512 * 1024, peak
    print(f"\nload: 64 readers x {seconds:.0f}s: {reads} reads, no error; {evicted} files evicted meanwhile; "
          f"daemon peak RSS {peak['rss'] / 1024:.1f} MiB, peak threads {peak['threads']}")


def test_the_fd_table_is_sized_for_the_cache_before_serving(kfs):
    # One O_PATH fd per inode the kernel knows. Growing a threaded process's fd table waits for an RCU
    # grace period (about 10 ms) and stalls every thread opening an fd meanwhile; so the daemon sizes its
    # table for the cache's files at mount, before its threads start, and a workload never grows it.
    m = kfs({"max_size": "64M"}, start=False)
    os.makedirs(os.path.join(m.backing, "d"))
    for i in range(3000):
        open(os.path.join(m.backing, "d", f"f{i}"), "w").close()
    m.start()
    size = _status(m.pid(), "FDSize")
    assert size >= 3000 + 3000 // 8
    names = os.listdir(m.path("d"))
    held = [os.open(m.path("d", n), os.O_RDONLY) for n in names]  # the kernel knows every inode
    try:
        assert _status(m.pid(), "FDSize") == size
    finally:
        for fd in held:
            os.close(fd)
