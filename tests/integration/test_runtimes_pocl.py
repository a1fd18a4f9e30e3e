"""Real PoCL (Debian's pocl-opencl-icd) with POCL_CACHE_DIR in the mount and a limit below what its
programs need: every run returns correct results, no clBuildProgram fails, evictions happen, and
repeats hit the cache (measurably faster than the first build)."""
import os
import subprocess

import pytest

from conftest import ROOT
from test_runtimes_conformance import index_matches_tree

CLK = os.path.join(ROOT, "build", "tests", "clkernels")
pytestmark = pytest.mark.skipif(not os.path.exists(CLK) or not os.path.exists("/etc/OpenCL/vendors/pocl.icd"),
                                reason="needs PoCL and build/tests/clkernels")


def clk(cache, first, count, rounds=1):
    env = dict(os.environ, POCL_CACHE_DIR=cache)
    return subprocess.Popen([CLK, str(first), str(count), str(rounds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def times(out):
    return {int(l.split()[1]): float(l.split()[2]) for l in out.splitlines() if l.startswith("build ")}


def test_pocl_programs_through_an_evicting_cache(kfs):
    # PoCL writes a ~1 MiB preprocessed source into the cache directory for every build, kept open while
    # it builds, and builds a program in steps a fraction of a second apart: three processes building at
    # once keep a few MiB in flight. 10 MiB holds that; 216 programs of ~70 KiB need half as much again.
    m = kfs({"max_size": "10M"})
    cache = m.path("pocl")
    os.makedirs(cache)

    # Cold, then warm: the second build of the same programs comes from the cache.
    p = clk(cache, 0, 4)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    cold = sum(times(out).values())
    p = clk(cache, 0, 4)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    warm = sum(times(out).values())
    assert warm < cold / 3, (cold, warm)

    # PoCL dlopen()s each kernel and keeps it mapped while the process lives: an open file, so a program a
    # live process has loaded is never evicted. What can be evicted is what finished runs left behind:
    # waves of three processes at once, 12 programs each, 216 distinct programs in all.
    for wave in range(6):
        procs = [clk(cache, wave * 36 + i * 12, 12) for i in range(3)]
        for p in procs:
            out, err = p.communicate(timeout=1200)
            assert p.returncode == 0, err  # no failed build, no wrong result
            assert "0 failures" in out
    evicted = int(os.getxattr(m.mnt, "user.kcachefs.evicted_files"))
    assert evicted > 0
    m.assert_within(10 << 20)
    # PoCL's program directories are whole or empty: never a kernel without its program.
    for a in os.listdir(cache):
        sub = os.path.join(cache, a)
        if not os.path.isdir(sub):
            continue
        for b in os.listdir(sub):
            pd = os.path.join(sub, b)
            files = [os.path.join(dp, f) for dp, _, fns in os.walk(pd) for f in fns]
            if files:
                assert os.path.exists(os.path.join(pd, "program.bc")), files
    index_matches_tree(m)
