"""Each runtime's store / load sequence (syscall by syscall, from runtimes.md), replayed by several processes
under a limit small enough that eviction runs the whole time, with that runtime's invariants checked.

Every worker returns (stores, loads, hits, violations); a violation is something the real runtime would
have failed on because of kcachefs."""
import base64
import fcntl
import functools
import hashlib
import multiprocessing as mp
import os
import random
import struct
import subprocess
import sys
import threading
import time

import pytest


from conftest import backing_files, wait_for
from test_cli_kcache import kcache

K = 1024
DURATION = 3.0
# These replays run each runtime's steps back to back (microseconds apart), and four of them turn the
# 1 MiB cache over in about 100 ms: a grace period of 20 ms covers their steps and leaves victims.
GRACE = "20"
# Triton's reader opens the group json, then the binary: alone microseconds apart, but once over 20 ms
# under the ASan daemon in a loaded CI run. Its replay gets a grace that still turns the cache over.
TRITON_GRACE = "100"
# PoCL's store syncs each of its five files before the next: a store re-writing a complete program
# directory in place spans milliseconds, and under the ASan daemon two of its steps were over 20 ms apart
# in 2 runs out of 20 (with either of two worker settings tried): eviction then
# takes the directory between them. Like Triton's, its replay gets a grace that covers a store.
POCL_GRACE = "100"
WORKERS = 4


def payload(key, size):
    h = hashlib.sha256(str(key).encode()).digest()
    return (h * (size // 32 + 1))[:size]


def run_workers(target, mnt, nkeys, raw=None, enough=None):
    """WORKERS processes of target for DURATION; again, as long as enough(stores, loads, hits) says the
    test has not yet seen what it needs (a slow or busy machine takes more rounds, never a failure: one
    round of 3 s fell short once, right after a benchmark), for 60 s at most."""
    stores = loads = hits = 0
    violations = []
    deadline = time.monotonic() + 60
    while True:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        stop_at = time.monotonic() + DURATION
        procs = [ctx.Process(target=target, args=(mnt, w, nkeys, stop_at, q)) for w in range(WORKERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        res = [q.get(timeout=10) for _ in procs]
        if raw is not None:
            raw.extend(res)
        stores += sum(r[0] for r in res)
        loads += sum(r[1] for r in res)
        hits += sum(r[2] for r in res)
        violations += [v for r in res for v in r[3]]
        if enough is None or enough(stores, loads, hits) or time.monotonic() > deadline:
            return stores, loads, hits, violations


def index_matches_tree(m):
    """After the run: every file on disk is in the index with its size, and nothing else is."""
    assert "matches" in kcache("verify", m.mnt).stdout
    m.stop()
    assert m.index_rows() == backing_files(m.backing)


def evicted(m):
    return int(os.getxattr(m.mnt, "user.kcachefs.evicted_files"))


def spin_lock(path, deadline=5.0):
    """SYCL's only mutual exclusion: create <x>.lock with O_CREAT|O_EXCL; spin while it exists."""
    end = time.monotonic() + deadline
    while True:
        try:
            return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o200)
        except FileExistsError:
            if time.monotonic() > end:
                return None
            time.sleep(0.0005)


# ---------------------------------------------------------------- NEO
NEO_LIMIT = 64 << 20  # NEO's own limit, far above the cache's: NEO refuses only if its count is wrong


def neo_count(root):
    """NEO's recount: the sizes of the *_cache files it finds (one evicted meanwhile counts nothing)."""
    total = 0
    for dp, _, fns in os.walk(root):
        for f in fns:
            if f.endswith("_cache"):
                try:
                    total += os.path.getsize(os.path.join(dp, f))
                except FileNotFoundError:
                    pass
    return total


def neo_worker(mnt, wid, nkeys, stop_at, q):
    rnd = random.Random(wid)
    root = os.path.join(mnt, "neo")
    stores = loads = hits = recounts = 0
    bad = []
    while time.monotonic() < stop_at:
        key = rnd.randrange(nkeys)
        h = f"{key * 2654435761 % (1 << 64):016x}"
        target = os.path.join(root, h[0], h[1], h + ".cl_cache")
        data = payload(key, 20 * K + (key % 7) * K)
        if rnd.random() < 0.5:  # load: plain open/read; missing is a miss
            loads += 1
            try:
                with open(target, "rb") as f:
                    got = f.read()
                hits += 1
                if got != data:
                    bad.append(f"torn load {target}")
            except FileNotFoundError:
                pass
            continue
        stores += 1
        cfg = os.path.join(root, "config.file")
        fd = -1
        while fd < 0:  # as NEO: create it, or open the existing one (which a repair may just have removed)
            try:
                fd, created = os.open(cfg, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o664), True
            except FileExistsError:
                try:
                    fd, created = os.open(cfg, os.O_RDWR), False
                except FileNotFoundError:
                    pass
        fcntl.flock(fd, fcntl.LOCK_EX)
        if created:  # NEO recounts only when it creates the file
            recounts += 1
            os.pwrite(fd, struct.pack("=Q", neo_count(root)), 0)
        raw = os.pread(fd, 8, 0)
        size = struct.unpack("=Q", raw)[0] if len(raw) == 8 else 0
        if not os.path.exists(target):
            if size + len(data) > NEO_LIMIT:
                bad.append(f"NEO would refuse: its count says {size}, the directory holds {neo_count(root)}")
            tfd, tmp = -1, None
            while tfd < 0:
                tmp = os.path.join(root, "cl_cache." + "".join(rnd.choice("abcdefXYZ0123") for _ in range(6)))
                try:
                    tfd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                except FileExistsError:
                    pass
            os.pwrite(tfd, data, 0)
            os.close(tfd)
            os.makedirs(os.path.dirname(target), 0o775, exist_ok=True)
            os.rename(tmp, target)
            os.pwrite(fd, struct.pack("=Q", size + len(data)), 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    q.put((stores, loads, hits, bad, recounts))


def test_neo_never_refuses_and_its_size_file_stays_honest(kfs):
    m = kfs({"max_size": "1M", "tmp_age": "3600", "grace_ms": GRACE})
    os.makedirs(m.path("neo"))
    raw = []
    stores, loads, hits, bad = run_workers(neo_worker, m.mnt, 200, raw,
                                            enough=lambda s, l, h: s > 100 and h > 10 and evicted(m) > 20)
    assert not bad, bad[:5]
    assert stores > 100 and hits > 10 and evicted(m) > 20
    # The count is repaired in place: config.file is never removed under NEO, so NEO creates it (and
    # recounts, a walk that fails its store if a file vanishes under it) once, at the start.
    assert sum(r[4] for r in raw) == 1
    # One more eviction batch runs the repairs still pending, then the count must be honest.
    kcache("evict", m.mnt, "--to", str(max(m.used() - 64 * K, 0)))
    cfg = m.path("neo", "config.file")
    if os.path.exists(cfg):
        with open(cfg, "rb") as f:
            assert struct.unpack("=Q", f.read(8))[0] == neo_count(m.path("neo"))
    m.assert_within(1 << 20)
    index_matches_tree(m)


# ---------------------------------------------------------------- SYCL
SYCL_MAX = 64 << 20
KFS_SYCL_LOCK = "cache_size.txt.lock"


def sycl_worker(mnt, wid, nkeys, stop_at, q):
    rnd = random.Random(wid)
    root = os.path.join(mnt, "sycl")
    stores = loads = hits = 0
    bad = []
    while time.monotonic() < stop_at:
        key = rnd.randrange(nkeys)
        d = os.path.join(root, "dev0", f"img{key % 13}", "spec0", f"opt{key % 5}")
        n = str(key % 3)
        src_key = f"source-of-{key}".encode()
        data = payload(key, 16 * K + (key % 5) * K)
        p = lambda s: os.path.join(d, n + s)
        if rnd.random() < 0.5:  # load
            loads += 1
            if os.path.exists(p(".lock")):
                continue
            try:
                with open(p(".src"), "rb") as f:
                    if f.read() != src_key:
                        continue  # another key in this slot: a miss
                with open(p(".bin"), "rb") as f:
                    got = f.read()
            except FileNotFoundError:
                continue  # .bin missing with .src present: a clean miss
            if os.path.exists(p(".lock")):
                continue  # a store started meanwhile: SYCL's own race, not ours
            hits += 1
            if got != data:
                bad.append(f"torn hit {p('.bin')}: {len(got)} bytes")
            continue
        stores += 1
        os.makedirs(d, exist_ok=True)
        lk = spin_lock(p(".lock"))
        if lk is None:
            bad.append(f"stale {p('.lock')}: SYCL would spin forever")
            continue
        for suffix, content in ((".bin", data), (".src", src_key), ("_access_time.txt", str(time.time_ns()).encode())):
            with open(p(suffix), "wb") as f:  # in place, O_TRUNC, no rename
                f.write(content)
        os.close(lk)
        os.unlink(p(".lock"))
        # cache_size.txt under its own lock file
        cs = os.path.join(root, "cache_size.txt")
        lk = spin_lock(cs + ".lock")
        if lk is None:
            bad.append("stale cache_size.txt.lock")
            continue
        try:
            with open(cs) as f:
                text = f.read()
            if not text.strip().isdigit():
                bad.append(f"cache_size.txt is not a number: {text!r}")
                text = "0"
            size = int(text)
        except FileNotFoundError:
            size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fns in os.walk(root)
                       for f in fns if f.endswith(".bin"))
        size += len(data)
        if size > SYCL_MAX:
            bad.append(f"SYCL would wipe its cache: cache_size.txt says {size}")
        with open(cs, "w") as f:
            f.write(str(size))
        os.close(lk)
        os.unlink(cs + ".lock")
    q.put((stores, loads, hits, bad))


def test_sycl_never_wipes_and_never_serves_a_torn_entry(kfs):
    m = kfs({"max_size": "1M", "grace_ms": GRACE})
    os.makedirs(m.path("sycl"))
    stores, loads, hits, bad = run_workers(sycl_worker, m.mnt, 120,
                                            enough=lambda s, l, h: s > 100 and h > 10 and evicted(m) > 10)
    assert not bad, bad[:5]
    assert stores > 100 and hits > 10 and evicted(m) > 10
    # Entries are whole or gone: never a .bin without its .src or access time.
    locks = []
    for dp, _, fns in os.walk(m.path("sycl")):
        for f in fns:
            if f.endswith(".bin"):
                n = f[:-4]
                assert n + ".src" in fns and n + "_access_time.txt" in fns, os.path.join(dp, f)
            if f.endswith(".lock"):
                locks.append(os.path.join(dp, f))
    # No lock left behind. The daemon's own repair of cache_size.txt may hold cache_size.txt.lock at the
    # moment of the walk (the descent goes on after the workers stop), for microseconds: a lock is stale
    # only if it stays.
    end = time.monotonic() + 3
    while any(os.path.exists(p) for p in locks) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in locks if os.path.exists(p)], "stale locks"
    index_matches_tree(m)


def test_the_repairs_own_lock_is_gone_for_whoever_saw_it(kfs):
    """The daemon repairs cache_size.txt under cache_size.txt.lock, made and removed in the backing
    directory. A process that looked the lock up meanwhile (ls, stat, SYCL's O_EXCL spin) has it in the
    kernel's cache, for the mount's timeout (an hour) unless the daemon says it went: stat then showed it
    for good, and a full run saw it stay. Many small files make each repair's count (and so its hold)
    long; each look drops the root's cached listing first (a create and unlink), so the next listing
    asks the daemon and may meet the lock."""
    m = kfs({"max_size": "1M", "grace_ms": GRACE})
    root = m.path("sycl")
    lock = os.path.join(root, "cache_size.txt.lock")
    os.makedirs(os.path.join(root, "pad"))
    with open(os.path.join(root, "cache_size.txt"), "w") as f:
        f.write("0")
    for j in range(2000):
        open(os.path.join(root, "pad", f"p{j}"), "wb").close()
    stop = threading.Event()
    seen = []

    def look():
        while not stop.is_set():
            open(os.path.join(root, "x"), "wb").close()
            os.unlink(os.path.join(root, "x"))
            if KFS_SYCL_LOCK in os.listdir(root) and os.path.exists(lock):
                seen.append(1)

    t = threading.Thread(target=look)
    t.start()
    end = time.monotonic() + 30
    i = 0
    try:
        while time.monotonic() < end and len(seen) < 10:
            d = os.path.join(root, "dev0", f"img{i % 50}", "spec0")
            os.makedirs(d, exist_ok=True)
            for suffix, content in ((".bin", payload(i, 16 * K)), (".src", b"s"), ("_access_time.txt", b"1")):
                with open(os.path.join(d, f"{i}{suffix}"), "wb") as f:
                    f.write(content)
            i += 1
    finally:
        stop.set()
        t.join()
    assert seen, "the lock was never seen held: this test saw nothing"
    wait_for(lambda: not os.path.exists(os.path.join(m.backing, "sycl", KFS_SYCL_LOCK)), what="the repair's end")
    time.sleep(0.2)
    assert not os.path.exists(os.path.join(m.backing, "sycl", KFS_SYCL_LOCK))
    assert not os.path.exists(lock), "the mount still shows the lock the daemon removed"
    index_matches_tree(m)


# ---------------------------------------------------------------- JAX
def jax_worker(mnt, wid, nkeys, stop_at, q):
    rnd = random.Random(wid)
    root = os.path.join(mnt, "jax")
    stores = loads = hits = 0
    bad = []
    lockfd = os.open(os.path.join(root, ".lockfile"), os.O_RDWR | os.O_CREAT, 0o644)
    while time.monotonic() < stop_at:
        key = rnd.randrange(nkeys)
        c = os.path.join(root, f"jit_fn{key}-{hashlib.sha256(str(key).encode()).hexdigest()}-cache")
        a = c[:-6] + "-atime"
        data = payload(key, 24 * K + (key % 3) * K)
        # py-filelock: flock LOCK_EX|LOCK_NB, polled
        while True:
            try:
                fcntl.flock(lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.0005)
        try:
            if rnd.random() < 0.5:
                loads += 1
                if os.path.exists(c):
                    if not os.path.exists(a):
                        bad.append(f"{c} without its -atime: every later put fails")
                    else:
                        try:
                            with open(c, "rb") as f:
                                hits += f.read() == data
                        except FileNotFoundError:
                            bad.append(f"{c} there under the lock, gone at its open: the get fails")
                            continue
                        with open(a, "wb") as f:
                            f.write(struct.pack("<q", time.time_ns()))
            else:
                stores += 1
                with open(c, "wb") as f:
                    f.write(data)
                with open(a, "wb") as f:
                    f.write(struct.pack("<q", time.time_ns()))
        finally:
            fcntl.flock(lockfd, fcntl.LOCK_UN)
    os.close(lockfd)
    q.put((stores, loads, hits, bad))


def test_jax_never_has_a_cache_without_its_atime(kfs):
    m = kfs({"max_size": "1M", "grace_ms": GRACE})
    os.makedirs(m.path("jax"))
    stores, loads, hits, bad = run_workers(jax_worker, m.mnt, 100,
                                            enough=lambda s, l, h: s > 50 and h > 10 and evicted(m) > 10)
    assert not bad, bad[:5]
    assert stores > 50 and hits > 10 and evicted(m) > 10
    names = set(os.listdir(m.path("jax")))
    for n in names:
        if n.endswith("-cache"):
            assert n[:-6] + "-atime" in names
    assert ".lockfile" in names  # bookkeeping is never evicted
    index_matches_tree(m)


def jax_checker(backing, mnt, wid, nkeys, stop_at, q):
    """Worker 0: a JAX process that, each time it has the lock, looks at every key: a -cache the mount
    shows is in the backing directory (nothing can remove it while the lock is held, and JAX's get opens
    what it saw). It waits for the lock (a blocking flock), so it has it the moment eviction lets go; and
    its stats have the kernel hold every -cache's attributes, as JAX's gets and fs/refresh.c do."""
    if wid:
        return jax_worker(mnt, wid, nkeys, stop_at, q)
    loads = 0
    bad = []
    lockfd = os.open(os.path.join(mnt, "jax", ".lockfile"), os.O_RDWR | os.O_CREAT, 0o644)
    names = [f"jax/jit_fn{k}-{hashlib.sha256(str(k).encode()).hexdigest()}-cache" for k in range(nkeys)]
    while time.monotonic() < stop_at:
        fcntl.flock(lockfd, fcntl.LOCK_EX)
        try:
            for n in names:
                if os.path.exists(os.path.join(mnt, n)):
                    loads += 1
                    if not os.path.exists(os.path.join(backing, n)):
                        bad.append(f"{n} stats as there under the lock, and eviction removed it")
        finally:
            fcntl.flock(lockfd, fcntl.LOCK_UN)
    os.close(lockfd)
    q.put((0, loads, 0, bad))


def test_jax_what_a_reader_sees_under_the_lock_is_there(kfs):
    # Eviction takes JAX's lock itself, and lets go of it after removing an entry: the kernel must have
    # forgotten the removed files' attributes by then, or a -cache it holds them for stats as there to
    # the process that takes the lock next (beside its -atime, which may ask and be gone: every later
    # put of the key fails; or with it, and the get's open fails).
    m = kfs({"max_size": "1M", "grace_ms": GRACE})
    os.makedirs(m.path("jax"))
    stores, loads, hits, bad = run_workers(functools.partial(jax_checker, m.backing), m.mnt, 100,
                                            enough=lambda s, l, h: s > 50 and h > 10 and evicted(m) > 10)
    assert not bad, bad[:5]
    assert stores > 50 and hits > 10 and evicted(m) > 10
    index_matches_tree(m)


# ---------------------------------------------------------------- Triton
def triton_key(key):
    return base64.b32encode(hashlib.sha256(str(key).encode()).digest()).decode().rstrip("=")[:52]


def triton_worker(mnt, wid, nkeys, stop_at, q):
    rnd = random.Random(wid)
    root = os.path.join(mnt, "triton")
    stores = loads = hits = 0
    bad = []
    probe_races = []
    import json
    import uuid
    while time.monotonic() < stop_at:
        key = rnd.randrange(nkeys)
        kd = os.path.join(root, triton_key(key))
        os.makedirs(kd, exist_ok=True)  # on every lookup: misses leave empty directories
        grp, meta, cubin = (os.path.join(kd, n) for n in ("__grp__kern.json", "kern.json", "kern.cubin"))
        if os.path.exists(grp) and os.path.exists(meta):  # Triton's hit test: the json files alone
            loads += 1
            try:
                with open(grp) as f:
                    children = json.load(f)["child_paths"]
            except FileNotFoundError:
                # Gone between exists() and open(): Triton's check-then-open race, which any deletion
                # (a user's rm too) can hit. The state stayed consistent (no group, no binary); counted.
                probe_races.append(grp)
                continue
            except (ValueError, KeyError):
                continue  # a json being replaced: Triton's own race
            try:
                with open(children["kern.cubin"], "rb") as f:
                    if f.read() == payload(key, 30 * K):
                        hits += 1
            except FileNotFoundError as e:
                bad.append(f"KeyError: group json read, binary gone: {e.filename}")
            continue
        stores += 1
        tmp = os.path.join(kd, f"tmp.pid_{os.getpid()}_{uuid.uuid4().hex}")
        try:
            os.mkdir(tmp)
            for name, content in (("kern.cubin", payload(key, 30 * K)), ("kern.json", b'{"name": "kern"}'),
                                  ("__grp__kern.json",
                                   json.dumps({"child_paths": {"kern.cubin": cubin, "kern.json": meta}}).encode())):
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(content)
                os.replace(os.path.join(tmp, name), os.path.join(kd, name))
            try:
                os.removedirs(tmp)  # the second rmdir (the key directory) must fail: ENOTEMPTY
            except OSError:
                pass
        except FileNotFoundError as e:
            bad.append(f"store failed: {e.filename} vanished")
    print(f"triton worker {wid}: {len(probe_races)} exists-then-open races on the group file", flush=True)
    q.put((stores, loads, hits, bad))


def test_triton_never_finds_json_without_binaries(kfs):
    m = kfs({"max_size": "1M", "grace_ms": TRITON_GRACE})
    os.makedirs(m.path("triton"))
    stores, loads, hits, bad = run_workers(triton_worker, m.mnt, 80,
                                            enough=lambda s, l, h: s > 30 and h > 10 and evicted(m) > 10)
    assert not bad, bad[:5]
    assert stores > 30 and hits > 10 and evicted(m) > 10
    index_matches_tree(m)


# ---------------------------------------------------------------- PoCL
def pocl_dirs(key):
    h = hashlib.sha1(str(key).encode()).hexdigest() + "abcdefghijklmnop"
    return h[:2], h[2:39]


def pocl_worker(mnt, wid, nkeys, stop_at, q):
    rnd = random.Random(wid)
    root = os.path.join(mnt, "pocl")
    stores = loads = hits = 0
    bad = []
    # program.bc is written last: its presence says the directory is complete (eviction removes it first)
    files = ["build.log", "last_accessed", "kern/0-0-0/kern.so", "kern2/0-0-0/kern2.so", "program.bc"]
    while time.monotonic() < stop_at:
        key = rnd.randrange(nkeys)
        a, b = pocl_dirs(key)
        pd = os.path.join(root, a, b)
        try:
            fd = os.open(os.path.join(pd, "program.bc"), os.O_RDONLY)  # PoCL looks the program up
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            loads += 1
            try:
                for f in files[:-1]:  # with the program open, the rest of its directory must be there
                    with open(os.path.join(pd, f), "rb") as g:
                        g.read()
                hits += 1
            except FileNotFoundError as e:
                bad.append(f"half a program directory: {e.filename}")
            os.close(fd)
            continue
        stores += 1
        for f in files:
            path = os.path.join(pd, f)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            t = os.path.join(root, f"tempfile-{os.getpid()}-{rnd.randrange(1 << 30)}")
            tfd = os.open(t, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.write(tfd, payload((key, f), 6 * K))
            os.fdatasync(tfd)
            os.close(tfd)
            os.rename(t, path)  # across directories, sometimes over an existing file
    q.put((stores, loads, hits, bad))


def test_pocl_never_sees_half_a_program_directory(kfs):
    m = kfs({"max_size": "1M", "grace_ms": POCL_GRACE})
    os.makedirs(m.path("pocl"))
    stores, loads, hits, bad = run_workers(pocl_worker, m.mnt, 60,
                                            enough=lambda s, l, h: s > 20 and h > 10 and evicted(m) > 10)
    assert not bad, bad[:5]
    assert stores > 20 and hits > 10 and evicted(m) > 10
    # Every program directory left is whole or empty.
    for a in os.listdir(m.path("pocl")):
        if a.startswith("tempfile"):
            continue
        for b in os.listdir(m.path("pocl", a)):
            pd = m.path("pocl", a, b)
            present = [f for f in ("program.bc", "build.log", "kern/0-0-0/kern.so") if os.path.exists(os.path.join(pd, f))]
            assert len(present) in (0, 3) or not os.path.exists(os.path.join(pd, "program.bc")), (pd, present)
    index_matches_tree(m)


def test_layout_option_and_leaked_temp_files(kfs, tmp_path):
    # layout=sycl for a directory whose markers would not say so; tmp_age collects leaked temporaries.
    m = kfs({"max_size": "1M", "grace_ms": "0", "tmp_age": "1", "layout": "odd=sycl"})
    os.makedirs(m.path("odd", "e"))
    for suffix in (".bin", ".src", "_access_time.txt"):
        with open(m.path("odd", "e", "7" + suffix), "wb") as f:
            f.write(b"s" * 20 * K)
    with open(m.path("cl_cache.AbC123"), "wb") as f:  # NEO's temporary, as if leaked by a crash
        f.write(b"t" * 100 * K)
    with open(m.path("filler"), "wb") as f:
        f.write(b"f" * 700 * K)
    # Young temporaries are protected: the SYCL entry (whole) and the filler go before it.
    kcache("evict", m.mnt, "--to", "100K")
    assert os.path.exists(m.path("cl_cache.AbC123"))
    assert not any(os.path.exists(m.path("odd", "e", "7" + s)) for s in (".bin", ".src", "_access_time.txt"))
    time.sleep(1.1)  # older than tmp_age: leaked, and collected
    kcache("evict", m.mnt, "--to", "0")
    assert not os.path.exists(m.path("cl_cache.AbC123"))
    # layout=file: the same names, now plain files, go one at a time.
    m2 = kfs({"max_size": "1M", "grace_ms": "0", "layout": "file"})
    for suffix in (".bin", ".src"):
        with open(m2.path("3" + suffix), "wb") as f:
            f.write(b"x" * 20 * K)
    os.close(os.open(m2.path("3.src"), os.O_RDONLY))  # the .src is now the most recent
    kcache("evict", m2.mnt, "--to", "20K")
    assert not os.path.exists(m2.path("3.bin")) and os.path.exists(m2.path("3.src"))


def test_bad_layout_option_is_refused(kfs):
    m = kfs(start=False)
    m.opts["layout"] = "odd=frob"
    p = m.start(check=False)
    assert p.returncode != 0 and "invalid layout" in p.stderr


# ---------------------------------------------------------------- Mesa, and names that are never cache
def test_mesa_entries_go_one_by_one_and_its_index_stays(kfs):
    """Mesa's multi-file cache (mesa_shader_cache/index above <2 hex>/<38 hex> entries) is not the CUDA
    driver's (a directory holding a file named index): eviction takes its least recently used entries one
    by one, as Mesa expects (a missing entry is a miss), and never its index, which every GL process
    mmaps. Taken for CUDA's, the whole cache was one unit: evicted whole, index included. No background
    descent (low_watermark=100): what the write evicted is what the test then looks at."""
    m = kfs({"max_size": "1M", "grace_ms": "0", "low_watermark": "100"})
    root = m.path("mesa", "mesa_shader_cache")
    os.makedirs(root)
    with open(os.path.join(root, "index"), "wb") as f:
        f.write(b"\0" * 8 * K)
    entries = []
    for k in range(24):  # 24 x 32 KiB: 768 KiB
        h = hashlib.sha1(str(k).encode()).hexdigest()
        os.makedirs(os.path.join(root, h[:2]), exist_ok=True)
        entries.append(os.path.join(root, h[:2], h[2:]))
        with open(entries[-1], "wb") as f:
            f.write(payload(k, 32 * K))
    with open(m.path("filler"), "wb") as f:  # needs about 8 of the oldest entries' room
        f.write(payload("filler", 480 * K))
    left = [e for e in entries if os.path.exists(e)]
    assert os.path.exists(os.path.join(root, "index"))
    assert 8 <= len(entries) - len(left) <= 12, f"{len(entries) - len(left)} entries evicted"
    assert all(os.path.exists(e) for e in entries[-8:])  # the newest stay
    for e in left:
        assert open(e, "rb").read() == payload(entries.index(e), 32 * K)


def sycl_like_entry(d):
    """Three files a SYCL entry would have; anywhere but SYCL's cache, they are three files."""
    os.makedirs(d, exist_ok=True)
    for suffix in (".bin", ".src", "_access_time.txt"):
        with open(os.path.join(d, "7" + suffix), "wb") as f:
            f.write(b"x" * 4096)


def test_a_directory_kcache_env_made_is_that_runtimes(kfs):
    """kcache env marks the directory it makes for a runtime (evict/marks.c): inside it that runtime's rules
    apply, whatever the layout looks like. Numba's directory holding files named like a SYCL entry: one
    file evicted takes one file, where an unmarked directory loses the whole 'entry'. The mark is on the
    backing directory, so it outlives a remount, and goes with its directory."""
    m = kfs({"max_size": "64M"})
    kcache("env", m.mnt, "numba")
    assert os.getxattr(m.path("numba"), "user.kcachefs.runtime") == b"numba"
    sycl_like_entry(m.path("numba", "d"))
    sycl_like_entry(m.path("other", "d"))
    kcache("evict", m.path("other", "d", "7.bin"))
    assert os.listdir(m.path("other", "d")) == []  # recognised as SYCL's by layout: the entry went whole
    kcache("evict", m.path("numba", "d", "7.bin"))
    assert sorted(os.listdir(m.path("numba", "d"))) == ["7.src", "7_access_time.txt"]

    m.stop()
    m.start()
    assert os.getxattr(m.path("numba"), "user.kcachefs.runtime") == b"numba"
    kcache("evict", m.path("numba", "d", "7.src"))
    assert os.listdir(m.path("numba", "d")) == ["7_access_time.txt"]

    # Renamed, the mark goes along; a new directory under the old name has none.
    os.rename(m.path("numba"), m.path("numba2"))
    sycl_like_entry(m.path("numba", "d"))
    kcache("evict", m.path("numba", "d", "7.bin"))
    assert os.listdir(m.path("numba", "d")) == []
    assert os.getxattr(m.path("numba2"), "user.kcachefs.runtime") == b"numba"
    with pytest.raises(OSError):
        os.getxattr(m.path("numba"), "user.kcachefs.runtime")
    with pytest.raises(OSError):  # only a runtime's name, and only on a directory in the root
        os.setxattr(m.path("numba2", "d"), "user.kcachefs.runtime", b"numba")
    with pytest.raises(OSError):
        os.setxattr(m.path("numba2"), "user.kcachefs.runtime", b"frob")


LOCKER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)  # torch's FileBaton, PyOpenCL's lock
if sys.argv[2] == "close":
    os.close(fd)  # some keep it open while they work, some do not
print("locked", flush=True)
time.sleep(600)
"""


def make_lock(path, keep_open=True):
    """A process that creates the lock file through the mount as a runtime does, then waits."""
    p = subprocess.Popen([sys.executable, "-c", LOCKER, path, "keep" if keep_open else "close"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def killed(p):
    p.kill()
    p.wait()


def test_a_stale_lock_goes_when_its_creator_has_exited(kfs, tmp_path):
    """-o stale_locks: a lock file whose creator was killed (torch extensions then wait for it forever)
    is removed when a waiter looks it up, and only then: never while its creator lives, while anyone holds
    a flock on it, while it is open, or without the option."""
    m = kfs({"stale_locks": True, "timeout": "0.2"})
    os.makedirs(m.path("ext"))
    dead = m.path("ext", "lock")
    killed(make_lock(dead))
    wait_for(lambda: not os.path.exists(dead), timeout=10, what="the stale lock's removal")
    assert "ext" in os.listdir(m.mnt) and os.listdir(m.path("ext")) == []
    p = make_lock(dead)  # the next builder takes the lock as usual
    try:
        alive = m.path("alive.lock")
        q = make_lock(alive, keep_open=False)  # not open: only its creator's life keeps it
        time.sleep(1)
        assert os.path.exists(alive) and os.path.exists(dead)  # their creators live
    finally:
        killed(p)
    # Held with a flock by another process (on the backing file itself): it stays, creator dead or not.
    with open(os.path.join(m.backing, "ext", "lock"), "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        time.sleep(1)
        assert os.path.exists(dead)
    wait_for(lambda: not os.path.exists(dead), timeout=10, what="the stale lock's removal")
    killed(q)
    wait_for(lambda: not os.path.exists(alive), timeout=10, what="the other stale lock's removal")
    index_matches_tree(m)


def test_stale_locks_stay_without_the_option(kfs):
    m = kfs({"timeout": "0.2"})
    lock = m.path("lock")
    killed(make_lock(lock))
    time.sleep(1.5)
    assert os.path.exists(lock)  # a lock is the runtime's business unless asked


def test_lock_files_and_ccache_settings_are_never_evicted(kfs):
    """The bare name lock (Triton, PyOpenCL, torch extensions: a lock file made with O_EXCL) and
    ccache.conf (ccache's own settings, max_size among them) are never evicted, however old."""
    m = kfs({"max_size": "1M", "grace_ms": "0"})
    for d in ("pyopencl", "torch_extensions/ext", "ccache"):
        os.makedirs(m.path(d))
    keep = [m.path("pyopencl", "lock"), m.path("torch_extensions", "ext", "lock"), m.path("ccache", "ccache.conf")]
    for p in keep:
        with open(p, "wb") as f:
            f.write(b"max_size = 5G\n" if p.endswith(".conf") else b"")
    for k in range(8):
        with open(m.path("ccache", f"entry{k}"), "wb") as f:
            f.write(payload(k, 256 * K))
    kcache("evict", m.mnt, "--to", "0")
    assert all(os.path.exists(p) for p in keep)
    assert open(keep[2], "rb").read() == b"max_size = 5G\n"
    assert not any(os.path.exists(m.path("ccache", f"entry{k}")) for k in range(4))
