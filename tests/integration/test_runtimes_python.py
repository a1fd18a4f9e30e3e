"""Python runtimes from Debian, run for real in a mount whose limit forces eviction: Numba (its on-disk
cache of compiled functions, NUMBA_CACHE_DIR) and PyOpenCL on PoCL (its compiler cache and pytools'
invoker cache, under XDG_CACHE_HOME). Each must give correct results, print no warning, store again what
was evicted (no key dead for good), keep its own bookkeeping sane, and a warm run must be faster than a
cold one, while the limit holds and the index equals the tree."""
import json
import os
import subprocess
import sys
import time

import pytest

from test_runtimes_conformance import evicted, index_matches_tree

PY = "/usr/bin/python3"  # Debian's, with Debian's numba and pyopencl


def has(module):
    return subprocess.run([PY, "-c", f"import {module}"], capture_output=True).returncode == 0


# ---------------------------------------------------------------- Numba
NFUNCS = 30

# A process's first call of any njit function pays Numba's one-time setup (about 0.2 s here), cached or
# not: the child pays it before the timed calls, on a function of its own that is not cached. Timed with
# the first call, a warm run of 4 functions took 0.205 s against 0.394 s cold through the mount, and
# 0.205 s against 0.400 s in a plain directory, where no cache could do better: the comparison measured
# Numba's setup more than the cache.
CHILD = """
import json, sys, time
import numba
@numba.njit
def _setup(n):
    return n + 1
_setup(1)
import mod
out = {}
for name in sys.argv[1:]:
    f = getattr(mod, name)
    t0 = time.monotonic()
    r = f(1000)
    dt = time.monotonic() - t0
    out[name] = [r, dt, sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values())]
print(json.dumps(out))
"""


def numba_module(src_dir):
    """NFUNCS distinct functions, each cached by Numba: one .nbi and one .nbc of about 20 KiB each."""
    lines = ["import numba", ""]
    for i in range(NFUNCS):
        lines += [f"@numba.njit(cache=True)", f"def f{i}(n):", "    s = 0",
                  "    for k in range(n):", f"        s += (k * {i + 3}) % {i + 7} + k // {i + 2}", "    return s", ""]
    with open(os.path.join(src_dir, "mod.py"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(src_dir, "child.py"), "w") as f:
        f.write(CHILD)


def expected(i, n=1000):
    return sum((k * (i + 3)) % (i + 7) + k // (i + 2) for k in range(n))


def run_numba(src_dir, cache, names):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([PY, "-W", "always", "-W", "ignore::DeprecationWarning", "child.py"] + names, cwd=src_dir, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Warning" not in p.stderr and "Error" not in p.stderr, p.stderr[-3000:]  # Numba said nothing
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for name, (r, _, _, _) in out.items():
        assert r == expected(int(name[1:])), (name, r)
    return out


@pytest.mark.skipif(not has("numba"), reason="needs Debian's python3-numba")
def test_numba_through_an_evicting_cache(kfs, tmp_path):
    limit = 256 << 10  # the 30 functions need about 2.5 times as much
    m = kfs({"max_size": str(limit), "grace_ms": "200"})
    cache = m.path("numba")
    os.makedirs(cache)
    numba_module(str(tmp_path))
    every = [f"f{i}" for i in range(NFUNCS)]

    cold = run_numba(str(tmp_path), cache, every)
    assert all(v[3] == 1 for v in cold.values())  # each compiled once
    # Again, newest first, through a cache that kept only the most recently used: those are served from it,
    # the others compiled and stored again. (In the same order as before, LRU would have evicted each
    # function just before its turn: a cyclic scan longer than the cache never hits.)
    again = run_numba(str(tmp_path), cache, every[::-1])
    assert evicted(m) > 0, "the limit never forced an eviction"
    assert sum(v[2] for v in again.values()) > 0, "nothing was served from the cache"
    m.assert_within(limit)

    # Caching resumes for entries that were evicted: the first functions went first (LRU); a working set
    # that fits is stored again and then served from the cache, every one of them.
    few = every[:4]
    run_numba(str(tmp_path), cache, few)
    warm = run_numba(str(tmp_path), cache, few)
    assert all(v[2] == 1 and v[3] == 0 for v in warm.values()), warm  # hits, no compilation
    assert sum(v[1] for v in warm.values()) < sum(cold[n][1] for n in few) / 2, (warm, cold)

    # Numba's bookkeeping: an index is never left without its data (eviction takes the index first).
    for dp, _, fns in os.walk(cache):
        for f in fns:
            if f.endswith(".nbi"):
                stem = f[:-4]
                assert any(g.startswith(stem + ".") and g.endswith(".nbc") for g in fns), os.path.join(dp, f)
            assert ".tmp." not in f, f"a temporary file was left: {f}"
    m.assert_within(limit)
    index_matches_tree(m)


# ---------------------------------------------------------------- PyOpenCL
PYOPENCL_CHILD = """
import json, logging, sys, time, warnings
import numpy as np
import pyopencl as cl
# PyOpenCL's own verdict on each build, from its debug log (pyopencl/cache.py): "binary cache hit" or
# "binary cache miss", one per device. A hit is decided here, not guessed from a build's time.
verdicts = []
class Verdicts(logging.Handler):
    def emit(self, record):
        m = record.getMessage()
        if m.startswith("build program: binary cache "):
            verdicts.append("hit" if m.startswith("build program: binary cache hit") else "miss")
logging.getLogger("pyopencl.cache").addHandler(Verdicts())
logging.getLogger("pyopencl.cache").setLevel(logging.DEBUG)
first, count = int(sys.argv[1]), int(sys.argv[2])
ctx = cl.Context(cl.get_platforms()[0].get_devices()[:1])
q = cl.CommandQueue(ctx)
a = np.arange(256, dtype=np.int32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
out = {}
for k in range(first, first + count):
    src = "__kernel void k%d(__global int *a) { int i = get_global_id(0); a[i] = a[i] * %d + %d; }" % (k, k + 2, k)
    n = len(verdicts)
    t0 = time.monotonic()
    prg = cl.Program(ctx, src).build()
    dt = time.monotonic() - t0
    res = np.empty_like(a)
    cl.enqueue_copy(q, buf, a)
    getattr(prg, "k%d" % k)(q, a.shape, None, buf)
    cl.enqueue_copy(q, res, buf)
    out[k] = [bool((res == a * (k + 2) + k).all()), dt, verdicts[n:]]
print(json.dumps(out))
"""


def run_pyopencl(home, xdg, first, count, tmp):
    # PoCL's own cache (and the ~1 MiB of temporary files of each build) outside the mount, and off: the
    # cache under test is PyOpenCL's.
    env = dict(os.environ, XDG_CACHE_HOME=xdg, HOME=home, POCL_KERNEL_CACHE="0",
               POCL_CACHE_DIR=os.path.join(tmp, "pocl"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYOPENCL_NO_CACHE", None)
    script = os.path.join(tmp, "clchild.py")
    with open(script, "w") as f:
        f.write(PYOPENCL_CHILD)
    p = subprocess.run([PY, "-W", "always", "-W", "ignore::DeprecationWarning", script, str(first), str(count)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Warning" not in p.stderr and "Error" not in p.stderr, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(ok for ok, _, _ in out.values()), out
    return out


def verdicts(out):
    """PyOpenCL's verdict on each program: "hit", "miss" (or what else it logged)."""
    return {int(k): v[2][0] if len(v[2]) == 1 else v[2] for k, v in out.items()}


@pytest.mark.skipif(not has("pyopencl") or not os.path.exists("/etc/OpenCL/vendors/pocl.icd"),
                    reason="needs Debian's python3-pyopencl and PoCL")
def test_pyopencl_through_an_evicting_cache(kfs, tmp_path):
    limit = 512 << 10
    m = kfs({"max_size": str(limit), "grace_ms": "200"})
    xdg = m.path("xdg")
    os.makedirs(xdg)
    home = str(tmp_path)
    # The first build of a process also starts PoCL's compiler: the times compared are the others'.
    build_time = lambda out: sum(v[1] for k, v in out.items() if int(k) % 4)
    cold = run_pyopencl(home, xdg, 0, 4, home)
    assert set(verdicts(cold).values()) == {"miss"}, cold
    warm = run_pyopencl(home, xdg, 0, 4, home)
    assert set(verdicts(warm).values()) == {"hit"}, warm
    assert build_time(warm) < build_time(cold) / 2, (cold, warm)
    for wave in range(3):  # many more programs than the limit holds
        run_pyopencl(home, xdg, 10 + wave * 12, 12, home)
    assert evicted(m) > 0, "the limit never forced an eviction"
    m.assert_within(limit)
    # The first programs were evicted (LRU): built again and stored again by the next process, and every
    # one served from the cache to the process after it. A key stored by one process and missed by the
    # next was the daemon's: its background eviction, kicked by PyOpenCL's write of a key under the
    # cache's lock, passed over the older keys while the lock stood and took the key stored just before
    # once PyOpenCL unlinked it (fs/evict/choose.c, ONE VERDICT PER LOCK; 1 run in 4 under ASan).
    restored = run_pyopencl(home, xdg, 0, 4, home)
    assert set(verdicts(restored).values()) == {"miss"}, restored
    again = run_pyopencl(home, xdg, 0, 4, home)
    keys = sorted(d for dp, ds, _ in os.walk(xdg) if "compiler-cache" in dp for d in ds if len(d) == 32)
    assert set(verdicts(again).values()) == {"hit"}, (again, keys, evicted(m))
    assert build_time(again) < build_time(cold) / 2, (cold, again)

    # PyOpenCL's compiler cache: a key directory is whole (info, binary, source.cl) or gone; pytools'
    # items are whole ({key, contents}) or gone, directory and all (an empty item directory is a key dead
    # for good); no lock left. Emptied directories go once nothing named them for 2 s.
    time.sleep(3)
    for dp, dirs, fns in os.walk(xdg):
        assert fns or dirs or "pdict-" not in dp, f"an empty pytools item directory, a key dead for good: {dp}"
        base = os.path.basename(dp)
        if os.path.basename(os.path.dirname(dp)).startswith("pyopencl-compiler-cache-") and len(base) == 32:
            assert {"info", "binary"} <= set(fns), (dp, fns)
        if "key" in fns or "contents" in fns:
            assert {"key", "contents"} <= set(fns), (dp, fns)
        assert "lock" not in fns, f"a lock was left in {dp}"
    m.assert_within(limit)
    index_matches_tree(m)
